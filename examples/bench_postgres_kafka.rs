//! End to end on a real database (features `postgres` and `kafka`): PostgreSQL outbox →
//! relay (`PostgresOutboxStore`, `KafkaPublisher`, woken by `PostgresWaker`'s NOTIFY) →
//! librdkafka's mock cluster, with 1 and 4 relays, next to the bare claim-and-ack loop in
//! SQL, the bare producer and the relays with a no-op publisher, measured in the same run
//! (support/e2e_bench.rs says what each is). Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features postgres,kafka --example bench_postgres_kafka            # 20000
//! cargo run --release --features postgres,kafka --example bench_postgres_kafka -- 50000
//! cargo run --release --features postgres,kafka --example bench_postgres_kafka -- --rounds 5  # medians of 5 (default 3)
//! cargo run --release --features postgres,kafka --example bench_postgres_kafka -- --quick  # ~15 s
//! ```
//!
//! It starts a private PostgreSQL (tests/common_postgres/server.rs; postgresql must be
//! installed), or uses `CHANGEFEED_TEST_POSTGRES`, and works in its own database.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/e2e_bench.rs"]
mod e2e_bench;
#[path = "support/figures.rs"]
mod figures;
#[path = "support/kafka_bench.rs"]
mod kafka_bench;
#[path = "support/postgres_bench.rs"]
#[allow(dead_code)]
mod postgres_bench;
#[path = "support/relay_bench.rs"]
#[allow(dead_code)]
mod relay_bench;
#[path = "../tests/common_postgres/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;
#[path = "support/store_bench.rs"]
#[allow(dead_code)]
mod store_bench;

use std::cell::RefCell;

use changefeed::outbox::NewMessage;
use changefeed::postgres::{PostgresOutboxStore, PostgresWaker, PostgresWakerConfig, WakerState};
use changefeed::relay::RelayHandle;
use postgres_bench::BenchDb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

impl e2e_bench::Outbox for BenchDb {
    type Store = PostgresOutboxStore;
    type Writer = tokio_postgres::Client;

    fn store(&self) -> PostgresOutboxStore {
        PostgresOutboxStore::new(self.table.clone(), self.config.clone())
    }

    async fn wake(&self, handle: RelayHandle, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let settings = PostgresWakerConfig::default();
        let waker = PostgresWaker::new(self.config.clone(), self.table.clone(), handle, settings);
        let listening = |s: &WakerState| matches!(s, WakerState::Listening { .. });
        let state = waker.state();
        store_bench::spawn_waker(state, listening, waker.run(store_bench::stopped(stop))).await
    }

    async fn reset(&self) {
        BenchDb::reset(self).await;
    }

    async fn fill(&self, messages: usize) {
        BenchDb::fill(self, messages).await;
    }

    async fn until_drained(&self) {
        BenchDb::until_drained(self).await;
    }

    async fn bare_throughput(
        &self,
        messages: usize,
        loops: usize,
        split: &RefCell<cpu::Split>,
    ) -> Option<f64> {
        BenchDb::bare_throughput(self, messages, loops, Some(split)).await
    }

    async fn writer(&self) -> tokio_postgres::Client {
        postgres_bench::client(&self.config).await
    }

    async fn commit_one(&self, writer: &mut tokio_postgres::Client, message: &NewMessage) -> i64 {
        BenchDb::commit_one(self, writer, message).await
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes = relay_bench::sizes_arg();
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    println!("server: PostgreSQL {}", db.version);
    e2e_bench::run(&db, "PostgreSQL", "NOTIFY wake", sizes).await;
    db.drop_database().await;
    relay_bench::finish();
}
