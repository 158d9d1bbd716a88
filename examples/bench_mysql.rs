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
#[path = "../tests/common_mysql/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use changefeed::mysql::{
    BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, OutboxTable, enqueue, migrate, setup_outbox,
};
use changefeed::outbox::{ClaimedMessage, NewMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, Pool};
use stats::Summary;
use tokio::sync::Mutex;

/// Aggregates the messages are spread over (each message waits for its aggregate's
/// previous one, as in production).
const AGGREGATES: usize = 1000;
const BATCH: u32 = 100;
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

fn fail(what: &str, error: impl std::fmt::Display) -> ! {
    eprintln!("bench_mysql: {what}: {error}");
    std::process::exit(1)
}

async fn fill(pool: &Pool, table: &OutboxTable, messages: usize) {
    let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
        let mut tx = conn
            .start_transaction(Default::default())
            .await
            .unwrap_or_else(|e| fail("begin", e));
        for n in chunk {
            let message = NewMessage::new("bench", serde_json::json!({ "n": n }))
                .aggregate("bench", format!("a{}", n % AGGREGATES));
            enqueue(&mut tx, table, &message)
                .await
                .unwrap_or_else(|e| fail("enqueue", e));
        }
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
    }
}

async fn reset(pool: &Pool, table: &OutboxTable) {
    let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    conn.query_drop(format!("truncate table {}", table.quoted()))
        .await
        .unwrap_or_else(|e| fail("truncate", e));
}

/// Messages per second through `relays` relays with a no-op publisher.
async fn relay_throughput(
    pool: &Pool,
    opts: &Opts,
    table: &OutboxTable,
    messages: usize,
    relays: usize,
) -> f64 {
    reset(pool, table).await;
    fill(pool, table, messages).await;
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

/// The same claim and acknowledgement, in a stored procedure: no client, no relay, no round
/// trips. Its rate is the ceiling the relay is compared with.
const BARE_LOOP: &str = "create procedure bench_bare_loop() modifies sql data
begin
    declare claimed int default 1;
    declare token binary(16);
    create temporary table if not exists bench_claimed (id bigint primary key);
    while claimed > 0 do
        set token = unhex(replace(uuid(), '-', ''));
        start transaction;
        delete from bench_claimed;
        insert into bench_claimed (id)
        select t.id from bench_outbox as t force index (open_messages)
        where t.is_open = 1 and t.status = 0
            and not exists (select 1 from bench_outbox as e force index (head_of_aggregate)
                where e.aggregate_id = t.aggregate_id and e.is_open = 1 and e.id < t.id)
        order by t.id limit 100 for update skip locked;
        set claimed = row_count();
        -- straight_join: the claimed ids first, then the outbox by primary key, so the
        -- update locks only the claimed rows.
        update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
        set t.attempts = t.attempts + (t.status = 1), t.status = 1,
            t.claimed_at = utc_timestamp(3), t.claim_token = token;
        commit;
        update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
        set t.status = 2, t.processed_at = utc_timestamp(3), t.last_error = null
        where t.status = 1 and t.claim_token = token;
        if claimed = 0 then
            -- Another loop may hold the last heads; stop only when nothing is open.
            if exists (select 1 from bench_outbox force index (open_messages) where is_open = 1) then
                set claimed = 1;
            end if;
        end if;
    end while;
end";

/// Messages per second through `loops` concurrent bare loops.
async fn bare_throughput(pool: &Pool, table: &OutboxTable, messages: usize, loops: usize) -> f64 {
    reset(pool, table).await;
    fill(pool, table, messages).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..loops {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
            conn.query_drop("set session transaction isolation level read committed")
                .await
                .unwrap_or_else(|e| fail("bare loop", e));
            // A deadlock victim claimed nothing; call the loop again, as a relay would.
            loop {
                match conn.query_drop("call bench_bare_loop()").await {
                    Ok(()) => break,
                    Err(mysql_async::Error::Server(e)) if e.code == 1213 => continue,
                    Err(e) => fail("bare loop", e),
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0)
}

/// Commit-to-publish latencies (ms) of single-message commits, woken by the binlog or by
/// polling every [`POLL`].
async fn latency(pool: &Pool, opts: &Opts, table: &OutboxTable, binlog: bool) -> Option<Summary> {
    reset(pool, table).await;
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
    let database = format!("cf_bench_{}", std::process::id());
    let mut admin = mysql_async::Conn::new(
        Opts::from_url(&server.url_for("mysql")).unwrap_or_else(|e| fail("url", e)),
    )
    .await
    .unwrap_or_else(|e| fail("connect", e));
    admin
        .query_drop(format!(
            "create database `{database}` character set utf8mb4"
        ))
        .await
        .unwrap_or_else(|e| fail("create database", e));
    let opts =
        changefeed::mysql::opts(&server.url_for(&database)).unwrap_or_else(|e| fail("url", e));
    let pool = Pool::new(opts.clone());
    migrate(&pool).await.unwrap_or_else(|e| fail("migrate", e));
    let table: OutboxTable = "bench_outbox".parse().unwrap_or_else(|e| fail("name", e));
    let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
    setup_outbox(&mut conn, &table)
        .await
        .unwrap_or_else(|e| fail("setup_outbox", e));
    conn.query_drop(BARE_LOOP)
        .await
        .unwrap_or_else(|e| fail("bare loop procedure", e));
    let version = changefeed::mysql::server_version(&mut conn)
        .await
        .unwrap_or_default();
    drop(conn);

    println!(
        "claim outbox on {version}, {messages} messages over {AGGREGATES} aggregates, batch {BATCH}"
    );
    println!("| figure | value |");
    println!("|---|---|");
    for relays in [1, 4] {
        let relay = relay_throughput(&pool, &opts, &table, messages, relays).await;
        let bare = bare_throughput(&pool, &table, messages, relays).await;
        let ratio = stats::ratio(relay, bare).unwrap_or(0.0);
        println!("| {relays} relay(s), no-op publisher | {relay:.0} msg/s |");
        println!("| {relays} bare SQL loop(s) | {bare:.0} msg/s |");
        println!("| ratio relay / bare, {relays} | {ratio:.2} |");
    }
    for (name, binlog) in [("binlog wake", true), ("polling every 100 ms", false)] {
        match latency(&pool, &opts, &table, binlog).await {
            Some(s) => println!(
                "| commit to publish, {name} | p50 {:.2} ms, p99 {:.2} ms (n = {}) |",
                s.p50, s.p99, s.count
            ),
            None => println!("| commit to publish, {name} | nothing published |"),
        }
    }
    let _ = admin
        .query_drop(format!("drop database `{database}`"))
        .await;
}
