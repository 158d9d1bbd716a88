//! End to end on a real database (features `mysql` and `kafka`): MariaDB outbox → relay
//! (`MysqlOutboxStore`, `KafkaPublisher`, woken by `BinlogWaker`) → librdkafka's mock
//! cluster, with 1 and 4 relays, next to the bare claim-and-ack loop in SQL, the bare
//! producer and the relays with a no-op publisher, measured in the same run
//! (support/e2e_bench.rs says what each is). Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka            # 20000
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka -- 50000
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka -- --rounds 5  # medians of 5 (default 3)
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka -- --quick  # ~15 s
//! ```
//!
//! It starts a private `mariadbd` (tests/common_mysql/server.rs; mariadb-server must be
//! installed), or uses `CHANGEFEED_TEST_MYSQL`, and works in its own database.

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
#[path = "support/mysql_bench.rs"]
#[allow(dead_code)]
mod mysql_bench;
#[path = "support/relay_bench.rs"]
#[allow(dead_code)]
mod relay_bench;
#[path = "../tests/common_mysql/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;
#[path = "support/store_bench.rs"]
#[allow(dead_code)]
mod store_bench;

use std::cell::RefCell;

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, WakerState};
use changefeed::outbox::NewMessage;
use changefeed::relay::RelayHandle;
use mysql_bench::BenchDb;
use relay_bench::fail;
use tokio::sync::watch;
use tokio::task::JoinHandle;

impl e2e_bench::Outbox for BenchDb {
    type Store = MysqlOutboxStore;
    type Writer = mysql_async::Conn;

    fn store(&self) -> MysqlOutboxStore {
        MysqlOutboxStore::new(self.table.clone(), self.opts.clone())
    }

    async fn wake(&self, handle: RelayHandle, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let config = BinlogWakerConfig::default();
        let waker = BinlogWaker::new(self.opts.clone(), self.table.clone(), handle, config);
        let following = |s: &WakerState| matches!(s, WakerState::Following { .. });
        let state = waker.state();
        store_bench::spawn_waker(state, following, waker.run(store_bench::stopped(stop))).await
    }

    async fn reset(&self) {
        BenchDb::reset(self).await;
    }

    async fn fill(&self, messages: usize) {
        BenchDb::fill(self, messages).await;
    }

    async fn until_drained(&self) {
        mysql_bench::until_drained(self).await;
    }

    async fn bare_throughput(
        &self,
        messages: usize,
        loops: usize,
        split: &RefCell<cpu::Split>,
    ) -> Option<f64> {
        BenchDb::bare_throughput(self, messages, loops, Some(split)).await
    }

    async fn writer(&self) -> mysql_async::Conn {
        self.pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e))
    }

    async fn commit_one(&self, writer: &mut mysql_async::Conn, message: &NewMessage) -> i64 {
        BenchDb::commit_one(self, writer, message).await
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes = relay_bench::sizes_arg();
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    println!("server: {}", db.version);
    e2e_bench::run(&db, "MariaDB", "binlog wake", sizes).await;
    db.drop_database().await;
    relay_bench::finish();
}
