//! The MariaDB/MySQL benchmark of the claim outbox (feature `mysql`): relay throughput with
//! 1 and 4 relays and a no-op publisher next to a bare claim-and-ack loop in SQL measured in
//! the same run, claims behind a deep backlog on 10 aggregates (10 × the message count)
//! with and without the index `open_heads`, and commit-to-publish latency with the binlog
//! wake and with polling.
//! Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features mysql --example bench_mysql            # private MariaDB
//! cargo run --release --features mysql --example bench_mysql -- 20000   # messages per run
//! cargo run --release --features mysql --example bench_mysql -- --rounds 5  # medians of 5 (default 3)
//! ```
//!
//! It starts a private `mariadbd` (tests/common_mysql/server.rs; mariadb-server must be
//! installed), or uses `CHANGEFEED_TEST_MYSQL`, and works in its own database
//! `cf_bench_<pid>`.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
#[path = "support/cpu.rs"]
#[allow(dead_code)]
mod cpu;
#[path = "support/figures.rs"]
mod figures;
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
mod store_bench;

use std::time::Duration;

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, WakerState};
use mysql_bench::BenchDb;
use relay_bench::{AGGREGATES, BATCH, Stage, fail};
use stats::Summary;
use store_bench::DEEP_AGGREGATES;

/// The polling relay's interval in the latency comparison.
const POLL: Duration = Duration::from_millis(100);

/// Messages per second through `relays` relays with a no-op publisher; `None` when the
/// stage failed or stalled.
async fn relay_throughput(db: &BenchDb, messages: usize, relays: usize) -> Option<f64> {
    db.reset().await;
    db.fill(messages).await;
    let stage = format!("{relays} relay(s), no-op publisher");
    let store = || MysqlOutboxStore::new(db.table.clone(), db.opts.clone());
    let run = relay_bench::relay_throughput(messages, relays, store, None);
    relay_bench::bounded((Stage::Relay, &stage), async { Ok(run.await) }, async || {}).await
}

/// Claims behind a backlog of `backlog` messages on [`DEEP_AGGREGATES`] aggregates (see
/// [`store_bench::deep_claims`]) through the store, and through a store on the same table
/// without the index `open_heads` (an outbox of the bundle's V4, whose every claim scans
/// every open message), each on a fresh backlog.
async fn deep_backlog(db: &BenchDb, backlog: usize) -> Result<[(f64, usize); 2], String> {
    let store = || MysqlOutboxStore::new(db.table.clone(), db.opts.clone());
    db.reset().await;
    db.fill_on_server(backlog, DEEP_AGGREGATES).await;
    let through_store = store_bench::deep_claims(&mut store()).await?;
    db.reset().await;
    db.fill_on_server(backlog, DEEP_AGGREGATES).await;
    let t = db.table.quoted();
    db.run(&format!("alter table {t} drop index open_heads"))
        .await;
    let whole = store_bench::deep_claims(&mut store()).await;
    db.run(&format!(
        "alter table {t} add index open_heads (is_open, aggregate_id, id)"
    ))
    .await;
    Ok([through_store, whole?])
}

/// Commit-to-publish latencies (ms) of single-message commits, woken by the binlog or by
/// polling every [`POLL`].
async fn latency(db: &BenchDb, binlog: bool) -> Option<Summary> {
    let (pool, opts, table) = (&db.pool, &db.opts, &db.table);
    db.reset().await;
    let waker = binlog.then_some(|handle, stop| {
        let config = BinlogWakerConfig::default();
        let waker = BinlogWaker::new(opts.clone(), table.clone(), handle, config);
        let state = waker.state();
        let following = |s: &WakerState| matches!(s, WakerState::Following { .. });
        store_bench::spawn_waker(state, following, waker.run(store_bench::stopped(stop)))
    });
    // Every commit on one connection, apart from the relay's.
    let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    let commit = async |message| db.commit_one(&mut conn, &message).await;
    let store = MysqlOutboxStore::new(table.clone(), opts.clone());
    store_bench::latency(store, POLL, waker, commit).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes = relay_bench::sizes_arg();
    let messages = sizes.messages;
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    let version = &db.version;

    println!(
        "claim outbox on {version}, {messages} messages over {AGGREGATES} aggregates, batch {BATCH}"
    );
    println!("| figure | value |");
    println!("|---|---|");
    for relays in [1, 4] {
        let rounds = relay_bench::alternate(sizes.rounds, async |stage| match stage {
            0 => relay_throughput(&db, messages, relays).await,
            _ => db.bare_throughput(messages, relays, None).await,
        })
        .await;
        store_bench::print_relay_and_bare("MariaDB", relays, &rounds);
    }
    let backlog = messages * 10;
    let stage = format!("claims over {backlog} messages on {DEEP_AGGREGATES} aggregates");
    let run = deep_backlog(&db, backlog);
    let rates = relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await;
    let baseline = "every open message scanned (no open_heads)";
    store_bench::print_deep_backlog("MariaDB", &stage, baseline, rates);
    for (name, binlog) in [("binlog wake", true), ("polling every 100 ms", false)] {
        let stage = format!("commit to publish, {name}");
        let summary = relay_bench::bounded(
            (Stage::Relay, &stage),
            async { Ok(latency(&db, binlog).await) },
            async || {},
        );
        store_bench::print_latency("MariaDB", &stage, summary.await);
    }
    db.drop_database().await;
    relay_bench::finish();
}
