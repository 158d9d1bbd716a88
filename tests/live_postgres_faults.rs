//! The relay and the feed reader on PostgreSQL under real server faults (feature
//! `postgres`; `#[ignore]`d, `.ci/run`'s PostgreSQL step runs them): every test has a server
//! of its own (common_postgres/owned.rs) that it freezes with `SIGSTOP` (the postmaster and
//! every backend) for 20 s, or kills with `kill -9` and restarts on the same data directory.
//!
//! What must hold: no call hangs on a frozen server (the relay reports errors while it is
//! frozen, within its claim timeout, and resumes after it; a feed read fails within the
//! reader's margin), nothing is lost, nothing is published twice after its acknowledgement
//! succeeded, shutdown ends within the claim timeout while the server does not answer, the
//! NOTIFY wake comes back after a restart, and a feed stream goes on from its cursor with
//! every event once, in order. Every wait is bounded.

mod common_postgres;
#[macro_use]
mod common_relay;
mod common_server;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::outbox::NewMessage;
use changefeed::postgres::{PostgresOutboxStore, PostgresWaker, PostgresWakerConfig, WakerState};
use changefeed::reader::{FeedReader, FeedReaderOptions, ReadRetryPolicy, Wait};
use changefeed::relay::RelayConfig;
use changefeed::{Cursor, Feed};
use common_postgres::TestDb;
use common_postgres::owned::OwnedServer;
use common_relay::faults::{self, CLAIM_TIMEOUT, FROZEN, FaultTarget};
use common_relay::{Running, StartWaker, start_relay, stopped, wait_until};
use futures::StreamExt;
use serde_json::json;

/// The connect timeout of the relays and readers here.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `count` messages over `aggregates` aggregates; a claim takes one message per aggregate.
fn messages(count: usize, aggregates: usize) -> Vec<NewMessage> {
    (0..count)
        .map(|n| {
            NewMessage::new("orders", json!({ "n": n }))
                .aggregate("order", (n % aggregates).to_string())
        })
        .collect()
}

/// `db`'s connection settings with the connect timeout of the tests here.
fn config(db: &TestDb) -> tokio_postgres::Config {
    let mut config = db.config.clone();
    config.connect_timeout(CONNECT_TIMEOUT);
    config
}

/// What the shared fault scenarios need of the server and the database here.
struct Target<'a> {
    server: &'a OwnedServer,
    db: &'a TestDb,
}

impl FaultTarget for Target<'_> {
    fn freeze(&self) {
        self.server.freeze();
    }

    fn thaw(&self) {
        self.server.thaw();
    }

    async fn enqueue(&self, outbox: &str, count: usize) -> Vec<i64> {
        let enqueued = self.db.enqueue_committed(outbox, &messages(count, 5)).await;
        enqueued.iter().map(|e| e.id).collect()
    }

    async fn done(&self, outbox: &str) -> i64 {
        self.db.count(outbox, "status = 2").await
    }
}

/// A library relay (and NOTIFY waker, when asked for) over `outbox`: batches of 10, a
/// claim timeout of `CLAIM_TIMEOUT`.
fn start(
    db: &TestDb,
    outbox: &str,
    poll: Duration,
    waker: Option<PostgresWakerConfig>,
    max_in_flight: u32,
) -> Running<WakerState> {
    let store = PostgresOutboxStore::new(outbox.parse().unwrap(), config(db));
    let relay_config = RelayConfig::default()
        .batch_size(10)
        .max_in_flight(max_in_flight)
        .poll_interval(poll)
        .claim_timeout(CLAIM_TIMEOUT);
    let waker = waker.map(|settings| {
        let (config, table) = (config(db), outbox.parse().unwrap());
        Box::new(move |handle, stop| {
            let waker = PostgresWaker::new(config, table, handle, settings);
            let state = waker.state();
            tokio::spawn(waker.run(stopped(stop)));
            state
        }) as StartWaker<WakerState>
    });
    start_relay(store, relay_config, waker)
}

/// A private server (`name`) with `outbox` holding `count` messages, and a relay on it
/// (100 ms poll, no waker) whose publisher freezes the server after its first batch;
/// returns once that batch was published, so its acknowledgement meets the frozen server.
async fn frozen_after_the_first_batch(
    name: &str,
    outbox: &str,
    count: usize,
    max_in_flight: u32,
) -> (OwnedServer, TestDb, Running<WakerState>) {
    let (server, db) = OwnedServer::with_database(name).await;
    db.outbox(outbox).await;
    db.enqueue_committed(outbox, &messages(count, 5)).await;
    let running = start(&db, outbox, Duration::from_millis(100), None, max_in_flight);
    running.publisher.after_the_first_batch(server.freezer());
    wait_until("the first batch", secs(30), async || {
        !running.publisher.batches().is_empty()
    })
    .await;
    (server, db, running)
}

in_flight_variants!(
    #[ignore = "needs PostgreSQL: .ci/run installs it"]
    a_frozen_server_neither_hangs_the_relay_nor_loses_a_message
);
/// The scenario (common_relay/faults.rs) on PostgreSQL. On the 35 s bound every store
/// call had before it was bounded by the claim timeout, no error came while the server was
/// frozen.
async fn a_frozen_server_neither_hangs_the_relay_nor_loses_a_message(max_in_flight: u32) {
    let outbox = "public.outbox_frozen";
    let (server, db, running) =
        frozen_after_the_first_batch("frozen", outbox, 20, max_in_flight).await;
    let target = Target {
        server: &server,
        db: &db,
    };
    faults::a_frozen_server_neither_hangs_the_relay_nor_loses_a_message(
        &target, outbox, 20, running,
    )
    .await;
}

in_flight_variants!(
    #[ignore = "needs PostgreSQL: .ci/run installs it"]
    shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded
);
/// The scenario (common_relay/faults.rs) on PostgreSQL. On the 35 s bound every store
/// call had before it was bounded by the claim timeout, shutdown took that long.
async fn shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded(max_in_flight: u32) {
    let outbox = "public.outbox_shutdown";
    let (server, db, running) =
        frozen_after_the_first_batch("frozen_shutdown", outbox, 3, max_in_flight).await;
    let target = Target {
        server: &server,
        db: &db,
    };
    faults::shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded(&target, running)
        .await;
}

in_flight_variants!(
    #[ignore = "needs PostgreSQL: .ci/run installs it"]
    a_killed_and_restarted_server_loses_nothing_and_the_notify_wake_comes_back
);
/// `kill -9` of the server and a restart on the same data directory (crash recovery):
/// nothing is lost, and the waker listens again, so messages enqueued after the restart
/// reach a relay whose own poll is a minute.
async fn a_killed_and_restarted_server_loses_nothing_and_the_notify_wake_comes_back(
    max_in_flight: u32,
) {
    let (server, db) = OwnedServer::with_database("restart").await;
    db.outbox("public.outbox_restart").await;
    let settings = PostgresWakerConfig {
        fallback_poll: Duration::from_secs(60),
        reconnect_delay: Duration::from_millis(300),
        heartbeat: Duration::from_secs(1),
    };
    // The relay's own poll is a minute, and so is the waker's fallback: only NOTIFY moves
    // it quickly.
    let running = start(
        &db,
        "public.outbox_restart",
        secs(60),
        Some(settings),
        max_in_flight,
    );
    let mut state = running.waker.clone().expect("a waker");
    tokio::time::timeout(secs(30), state.wait_for(listening))
        .await
        .expect("the waker listens")
        .unwrap();
    db.enqueue_committed("public.outbox_restart", &messages(10, 5))
        .await;
    wait_until("the first ten", secs(10), async || {
        db.count("public.outbox_restart", "status = 2").await == 10
    })
    .await;

    server.kill();
    tokio::time::timeout(secs(10), state.wait_for(|s| !listening(s)))
        .await
        .expect("the waker notices the server is gone")
        .unwrap();
    server.restart();
    let (later, counts) =
        listening_again_it_delivers(&db, "public.outbox_restart", 10, 10, running).await;
    assert_eq!(counts.len(), 20, "{counts:?}");
    assert!(later.iter().all(|id| counts.contains_key(id)));
    // The kill came while everything was acknowledged: nothing to publish twice.
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
}

/// A frozen server: the waker's heartbeat gets no answer, so it says it polls (its
/// `LISTEN` connection is silent, not closed), and once the server thaws it listens again
/// and NOTIFY wakes the relay, whose own poll is a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it"]
async fn a_frozen_server_sends_the_waker_to_polling_and_it_listens_again_after_the_thaw() {
    let (server, db) = OwnedServer::with_database("waker_frozen").await;
    db.outbox("public.outbox_waker").await;
    let heartbeat = Duration::from_secs(1);
    let settings = PostgresWakerConfig {
        fallback_poll: Duration::from_secs(60),
        reconnect_delay: Duration::from_millis(300),
        heartbeat,
    };
    let running = start(&db, "public.outbox_waker", secs(60), Some(settings), 1);
    let mut state = running.waker.clone().expect("a waker");
    tokio::time::timeout(secs(30), state.wait_for(listening))
        .await
        .expect("the waker listens")
        .unwrap();

    server.freeze();
    let frozen_at = Instant::now();
    // The next beat comes within a heartbeat and gets no answer within another.
    tokio::time::timeout(
        heartbeat * 2 + secs(3),
        state.wait_for(|s| matches!(s, WakerState::Polling { .. })),
    )
    .await
    .expect("the waker notices the silent server")
    .unwrap();
    tokio::time::sleep(FROZEN.saturating_sub(frozen_at.elapsed())).await;
    server.thaw();
    let (later, counts) =
        listening_again_it_delivers(&db, "public.outbox_waker", 0, 5, running).await;
    assert!(
        later.iter().all(|id| counts.get(id) == Some(&1)),
        "{counts:?}"
    );
}

/// After a fault: waits (30 s at most) until `running`'s waker listens again, enqueues
/// `count` messages into `outbox` (where `done` are done already), waits until they are
/// done too (20 s at most; the relay's own poll is a minute, so NOTIFY brings them), stops
/// the relay, and returns their ids and how often each message was published.
async fn listening_again_it_delivers(
    db: &TestDb,
    outbox: &str,
    done: i64,
    count: usize,
    running: Running<WakerState>,
) -> (Vec<i64>, BTreeMap<i64, usize>) {
    let mut state = running.waker.clone().expect("a waker");
    tokio::time::timeout(secs(30), state.wait_for(listening))
        .await
        .expect("the waker listens again")
        .unwrap();
    let later = db.enqueue_committed(outbox, &messages(count, 5)).await;
    let all = done + i64::try_from(count).unwrap();
    wait_until(
        "the messages enqueued after the fault",
        secs(20),
        async || db.count(outbox, "status = 2").await == all,
    )
    .await;
    let publisher = Arc::clone(&running.publisher);
    running.stop(secs(30)).await;
    (later.iter().map(|m| m.id).collect(), publisher.counts())
}

fn listening(state: &WakerState) -> bool {
    matches!(state, WakerState::Listening { .. })
}

/// `app.orders` (an order number as its key), as an outbox-mode feed.
async fn orders_feed(db: &TestDb) -> Feed {
    db.sql(
        "create schema app; \
         create table app.orders (order_no bigint primary key, note text not null); \
         select changefeed.setup_feed('app.orders');",
    )
    .await;
    "app.orders".parse().unwrap()
}

/// Writes orders `numbers` in one transaction.
async fn write_orders(db: &TestDb, numbers: std::ops::Range<i64>) {
    let values: Vec<String> = numbers.map(|n| format!("({n}, 'order {n}')")).collect();
    db.sql(&format!(
        "insert into app.orders (order_no, note) values {}",
        values.join(", ")
    ))
    .await;
}

/// The reader's options here: pages of 10, the least margin (a read's bound), long-polls
/// of `wait`, and retries after 50 to 200 ms, at most `retries` in a row.
fn reader_options(wait: Duration, retries: Option<u32>) -> FeedReaderOptions {
    FeedReaderOptions::default()
        .page_size(10)
        .timeout_margin(changefeed::reader::MIN_TIMEOUT_MARGIN)
        .wait(Wait::LongPoll(wait))
        .retry(
            ReadRetryPolicy::default()
                .initial(Duration::from_millis(50))
                .max(Duration::from_millis(200))
                .max_retries(retries),
        )
}

/// A feed read on a frozen server fails within the reader's margin (one read, no retry
/// allowed), instead of waiting for the server; after the thaw a stream from the last
/// cursor reads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it"]
async fn a_feed_read_on_a_frozen_server_fails_within_the_margin() {
    let (server, db) = OwnedServer::with_database("feed_frozen").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..3).await;
    let options = reader_options(Duration::from_secs(1), Some(0));
    let reader = FeedReader::postgres(config(&db), feed.clone(), options).unwrap();
    let mut stream = Box::pin(reader.stream::<i64>(0, Cursor::START));
    let page = stream.next().await.unwrap().unwrap();
    assert_eq!(
        page.rows.iter().map(|r| r.key).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let cursor = page.next_cursor;

    server.freeze();
    let frozen_at = Instant::now();
    let next = tokio::time::timeout(FROZEN, stream.next())
        .await
        .expect("the read on the frozen server came back")
        .expect("the stream yields the failure");
    let took = frozen_at.elapsed();
    assert!(next.is_err(), "no page from a frozen server: {next:?}");
    // One long-poll (1 s), then one read bounded by the margin.
    let bound = Duration::from_secs(1) + options.timeout_margin + secs(3);
    assert!(
        took < bound,
        "the read came back after {took:?} (bound {bound:?})"
    );
    tokio::time::sleep(FROZEN.saturating_sub(frozen_at.elapsed())).await;
    server.thaw();

    write_orders(&db, 3..5).await;
    let reader = FeedReader::postgres(config(&db), feed, options).unwrap();
    let mut stream = Box::pin(reader.stream::<i64>(0, cursor));
    let page = tokio::time::timeout(secs(30), stream.next())
        .await
        .expect("a page after the thaw")
        .unwrap()
        .unwrap();
    assert_eq!(page.rows.iter().map(|r| r.key).collect::<Vec<_>>(), [3, 4]);
}

/// A feed stream that retries rides out a frozen server and a killed and restarted one:
/// it goes on from its cursor, and every order written before, between and after the
/// faults comes once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it"]
async fn a_feed_stream_rides_out_a_frozen_and_a_restarted_server_with_every_event_once() {
    let (server, db) = OwnedServer::with_database("feed_restart").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..3).await;
    let reader = FeedReader::postgres(
        config(&db),
        feed,
        reader_options(Duration::from_secs(2), None),
    )
    .unwrap();
    let mut stream = Box::pin(reader.stream::<i64>(0, Cursor::START));
    // The stream runs on its own, sending what it reads.
    let (keys, mut read) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        while let Some(page) = stream.next().await {
            for row in page.expect("the stream retries every failure here").rows {
                if keys.send(row.key).is_err() {
                    return;
                }
            }
        }
    });
    let mut seen = Vec::new();
    let mut read_until = async |last: i64| {
        let got = tokio::time::timeout(secs(60), async {
            while seen.last() != Some(&last) {
                seen.push(read.recv().await.expect("the stream goes on"));
            }
        })
        .await;
        assert!(got.is_ok(), "order {last} not read; read {seen:?}");
    };
    read_until(2).await;

    server.freeze();
    tokio::time::sleep(FROZEN).await;
    server.thaw();
    write_orders(&db, 3..6).await;
    read_until(5).await;

    server.kill();
    server.restart();
    write_orders(&db, 6..9).await;
    read_until(8).await;
    reading.abort();
    assert_eq!(
        seen,
        (0..9).collect::<Vec<_>>(),
        "every order once, in order"
    );
}
