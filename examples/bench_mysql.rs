//! The MariaDB/MySQL benchmark of the claim outbox (feature `mysql`): relay throughput with
//! 1 and 4 relays and a no-op publisher next to a bare claim-and-ack loop in SQL measured in
//! the same run, and commit-to-publish latency with the binlog wake and with polling.
//! Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features mysql --example bench_mysql            # private MariaDB
//! cargo run --release --features mysql --example bench_mysql -- 20000   # messages per run
//! ```
//!
//! It starts a private `mariadbd` (tests/common_mysql/server.rs; mariadb-server must be
//! installed), or uses `CHANGEFEED_TEST_MYSQL`, and works in its own database
//! `cf_bench_<pid>`.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
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

use std::sync::Arc;
use std::time::Duration;

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore};
use changefeed::outbox::NewMessage;
use changefeed::relay::{Relay, RelayConfig};
use mysql_bench::BenchDb;
use relay_bench::{AGGREGATES, BATCH, Clock, LATENCY_SAMPLES, fail};
use stats::Summary;

/// The polling relay's interval in the latency comparison.
const POLL: Duration = Duration::from_millis(100);

/// Messages per second through `relays` relays with a no-op publisher.
async fn relay_throughput(db: &BenchDb, messages: usize, relays: usize) -> f64 {
    db.reset().await;
    db.fill(messages).await;
    relay_bench::relay_throughput(messages, relays, || {
        MysqlOutboxStore::new(db.table.clone(), db.opts.clone())
    })
    .await
}

/// Commit-to-publish latencies (ms) of single-message commits, woken by the binlog or by
/// polling every [`POLL`].
async fn latency(db: &BenchDb, binlog: bool) -> Option<Summary> {
    let (pool, opts, table) = (&db.pool, &db.opts, &db.table);
    db.reset().await;
    let clock = Arc::new(Clock::default());
    let config = RelayConfig::default().poll_interval(if binlog {
        Duration::from_secs(60)
    } else {
        POLL
    });
    let relay = Relay::new(
        MysqlOutboxStore::new(table.clone(), opts.clone()),
        Arc::clone(&clock),
        config,
    )
    .unwrap_or_else(|e| fail("relay", e));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut waker_task = None;
    if binlog {
        let waker = BinlogWaker::new(
            opts.clone(),
            table.clone(),
            relay.handle(),
            BinlogWakerConfig::default(),
        );
        let mut state = waker.state();
        let mut stopped = stopped.clone();
        waker_task = Some(tokio::spawn(waker.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
        let _ = state
            .wait_for(|s| matches!(s, changefeed::mysql::WakerState::Following { .. }))
            .await;
    }
    let mut relay_stopped = stopped.clone();
    let relay_task = tokio::spawn(relay.run(async move {
        let _ = relay_stopped.wait_for(|s| *s).await;
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Every commit on one connection, as before; the mutex only lends it to each commit.
    let conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    let commits = relay_bench::spaced_commits(LATENCY_SAMPLES, |n| {
        let conn = Arc::clone(&conn);
        async move {
            let mut conn = conn.lock().await;
            let message = NewMessage::new("latency", serde_json::json!({ "n": n }));
            db.commit_one(&mut conn, &message).await
        }
    })
    .await;
    tokio::time::sleep(POLL * 3).await;
    let _ = stop.send(true);
    let _ = relay_task.await;
    if let Some(task) = waker_task {
        let _ = task.await;
    }
    let published = clock.0.lock().await.clone();
    relay_bench::commit_to_publish(&commits, |id| {
        published.iter().find(|(p, _)| *p == id).map(|(_, at)| *at)
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let messages = relay_bench::message_count_arg();
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    let version = &db.version;

    println!(
        "claim outbox on {version}, {messages} messages over {AGGREGATES} aggregates, batch {BATCH}"
    );
    println!("| figure | value |");
    println!("|---|---|");
    for relays in [1, 4] {
        let relay = relay_throughput(&db, messages, relays).await;
        let bare = db.bare_throughput(messages, relays).await;
        let ratio = stats::ratio(relay, bare).unwrap_or(0.0);
        println!("| {relays} relay(s), no-op publisher | {relay:.0} msg/s |");
        println!("| {relays} bare SQL loop(s) | {bare:.0} msg/s |");
        println!("| ratio relay / bare, {relays} | {ratio:.2} |");
    }
    for (name, binlog) in [("binlog wake", true), ("polling every 100 ms", false)] {
        let cell = relay_bench::latency_cell(latency(&db, binlog).await, "nothing published");
        println!("| commit to publish, {name} | {cell} |");
    }
    db.drop_database().await;
}
