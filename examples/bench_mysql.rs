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
#[path = "../tests/common_mysql/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, enqueue};
use changefeed::outbox::{ClaimedMessage, NewMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
use mysql_bench::{AGGREGATES, BATCH, BenchDb, fail};
use stats::Summary;
use tokio::sync::Mutex;

/// Commits per latency run, spaced `LATENCY_GAP` apart.
const LATENCY_SAMPLES: usize = 200;
const LATENCY_GAP: Duration = Duration::from_millis(15);
/// The polling relay's interval in the latency comparison.
const POLL: Duration = Duration::from_millis(100);

/// Counts messages and does nothing else.
#[derive(Default)]
struct NoOp(AtomicU64);

impl Publisher for NoOp {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        vec![Ok(()); batch.len()]
    }
}

/// Records when each message id was published.
#[derive(Default)]
struct Clock(Mutex<Vec<(i64, Instant)>>);

impl Publisher for Clock {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let now = Instant::now();
        self.0
            .lock()
            .await
            .extend(batch.iter().map(|m| (m.id, now)));
        vec![Ok(()); batch.len()]
    }
}

/// Messages per second through `relays` relays with a no-op publisher.
async fn relay_throughput(db: &BenchDb, messages: usize, relays: usize) -> f64 {
    let (opts, table) = (&db.opts, &db.table);
    db.reset().await;
    db.fill(messages).await;
    let published = Arc::new(NoOp::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..relays {
        let config = RelayConfig::default()
            .batch_size(BATCH)
            .poll_interval(Duration::from_millis(5));
        let store = MysqlOutboxStore::new(table.clone(), opts.clone());
        let relay =
            Relay::new(store, Arc::clone(&published), config).unwrap_or_else(|e| fail("relay", e));
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(relay.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }
    while published.0.load(Ordering::Relaxed) < messages as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }
    stats::throughput(messages as u64, elapsed).unwrap_or(0.0)
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
    let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    let mut commits = Vec::new();
    for n in 0..LATENCY_SAMPLES {
        let mut tx = conn
            .start_transaction(Default::default())
            .await
            .unwrap_or_else(|e| fail("begin", e));
        let message = NewMessage::new("latency", serde_json::json!({ "n": n }));
        let e = enqueue(&mut tx, table, &message)
            .await
            .unwrap_or_else(|e| fail("enqueue", e));
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        commits.push((e.id, Instant::now()));
        // A jittered gap, so commits do not fall into step with the poll.
        let jitter = Duration::from_micros(rand::random_range(0..10_000));
        tokio::time::sleep(LATENCY_GAP + jitter).await;
    }
    tokio::time::sleep(POLL * 3).await;
    let _ = stop.send(true);
    let _ = relay_task.await;
    if let Some(task) = waker_task {
        let _ = task.await;
    }
    let published = clock.0.lock().await.clone();
    let latencies: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, committed)| {
            published
                .iter()
                .find(|(p, _)| p == id)
                .map(|(_, at)| at.saturating_duration_since(*committed))
        })
        .collect();
    Summary::of_durations(&latencies)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let messages: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().unwrap_or_else(|e| fail("the message count", e)))
        .unwrap_or(20_000);
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
        match latency(&db, binlog).await {
            Some(s) => println!(
                "| commit to publish, {name} | p50 {:.2} ms, p99 {:.2} ms (n = {}) |",
                s.p50, s.p99, s.count
            ),
            None => println!("| commit to publish, {name} | nothing published |"),
        }
    }
    db.drop_database().await;
}
