//! The relay on MariaDB under real server faults (feature `mysql`; `#[ignore]`d, `.ci/run`'s
//! MariaDB step runs them): every test has a server of its own (common_mysql/owned.rs) that
//! it freezes with `SIGSTOP` for 20 s, kills with `kill -9` and restarts on the same data
//! directory, or switches to compressed binlog events.
//!
//! What must hold: no call hangs on a frozen server (the relay reports errors while it is
//! frozen and resumes after it), nothing is lost, nothing is published twice after its
//! acknowledgement succeeded, shutdown (a library `run`'s, the CLI's SIGINT) ends within its
//! bound while the server does not answer, and the binlog wake comes back after a restart.
//! Every wait is bounded.

mod common_mysql;
mod common_process;
#[macro_use]
mod common_relay;
mod common_server;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, WakerState};
use changefeed::outbox::NewMessage;
use changefeed::relay::RelayConfig;
use common_mysql::TestDb;
use common_mysql::owned::{OwnedServer, send_signal};
use common_process::{signal, stderr_lines, wait_for_exit};
use common_relay::faults::{self, CLAIM_TIMEOUT, FROZEN, FaultTarget};
use common_relay::{Running, StartWaker, start_relay, stopped, wait_until};
use serde_json::json;
use tokio::sync::watch;

/// The connect timeout of the library relays here.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `count` messages of `aggregates` aggregates, each with a payload of `size` bytes. A
/// claim takes one message per aggregate.
fn messages(count: usize, size: usize, aggregates: usize) -> Vec<NewMessage> {
    (0..count)
        .map(|n| {
            NewMessage::new("orders", json!({ "n": n, "pad": "x".repeat(size) }))
                .aggregate("order", (n % aggregates).to_string())
        })
        .collect()
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
        let enqueued = self
            .db
            .enqueue_committed(outbox, &messages(count, 10, 5))
            .await;
        enqueued.iter().map(|e| e.id).collect()
    }

    async fn done(&self, outbox: &str) -> i64 {
        self.db.count(outbox, "status = 2").await
    }
}

/// The relay's settings here: batches of 10, a claim timeout of `CLAIM_TIMEOUT`.
fn relay_config(poll: Duration, max_in_flight: u32) -> RelayConfig {
    RelayConfig::default()
        .batch_size(10)
        .max_in_flight(max_in_flight)
        .poll_interval(poll)
        .claim_timeout(CLAIM_TIMEOUT)
}

/// The waker's settings here: the default, connects bounded by `CONNECT_TIMEOUT`.
fn waker_config() -> BinlogWakerConfig {
    BinlogWakerConfig {
        connect_timeout: CONNECT_TIMEOUT,
        ..BinlogWakerConfig::default()
    }
}

/// A library relay (and binlog waker, when asked for) over `outbox`.
fn start(
    db: &TestDb,
    outbox: &str,
    poll: Duration,
    waker: Option<BinlogWakerConfig>,
    max_in_flight: u32,
) -> Running<WakerState> {
    let store = db.store(outbox).connect_timeout(CONNECT_TIMEOUT);
    let waker = waker.map(|config| {
        let (opts, table) = (db.opts.clone(), outbox.parse().unwrap());
        Box::new(move |handle, stop| {
            let waker = BinlogWaker::new(opts, table, handle, config);
            let state = waker.state();
            tokio::spawn(waker.run(stopped(stop)));
            state
        }) as StartWaker<WakerState>
    });
    start_relay(store, relay_config(poll, max_in_flight), waker)
}

/// The waker's state, once it follows the binlog (30 s at most).
async fn following_state(running: &Running<WakerState>) -> watch::Receiver<WakerState> {
    let mut state = running.waker.clone().expect("a waker");
    tokio::time::timeout(secs(30), state.wait_for(following))
        .await
        .expect("the waker follows the binlog")
        .unwrap();
    state
}

fn following(state: &WakerState) -> bool {
    matches!(state, WakerState::Following { .. })
}

/// Kills the waker's binlog dump connection (a failover, a network cut) and waits until
/// the waker notices.
async fn cut_the_binlog_stream(db: &TestDb, state: &mut watch::Receiver<WakerState>) {
    assert_eq!(db.kill_binlog_dumps().await, 1);
    tokio::time::timeout(secs(10), state.wait_for(|s| !following(s)))
        .await
        .expect("the waker notices the cut")
        .unwrap();
}

/// Whether the waker follows the binlog file `file` within `limit`; a failure shows the state.
async fn follows_file(state: &mut watch::Receiver<WakerState>, file: &str, limit: Duration) {
    let follows = tokio::time::timeout(
        limit,
        state.wait_for(|s| matches!(s, WakerState::Following { file: f, .. } if f == file)),
    )
    .await
    .is_ok();
    assert!(
        follows,
        "the waker does not follow {file}: {:?}",
        *state.borrow()
    );
}

/// A fresh pool over the database of `db`, for after a server restart (the old pool's
/// connections are dead).
fn reopened(db: &TestDb) -> TestDb {
    TestDb {
        name: db.name.clone(),
        url: db.url.clone(),
        opts: db.opts.clone(),
        pool: mysql_async::Pool::new(db.opts.clone()),
    }
}

/// A private server (`name`) with `outbox` holding `count` messages, and a relay on it
/// (100 ms poll, no waker) whose publisher freezes the server (SIGSTOP) after its first
/// batch; returns once that batch was published, so its acknowledgement meets the frozen
/// server.
async fn frozen_after_the_first_batch(
    name: &str,
    outbox: &str,
    count: usize,
    max_in_flight: u32,
) -> (OwnedServer, TestDb, Running<WakerState>) {
    let (server, db) = OwnedServer::with_database(name).await;
    db.outbox(outbox).await;
    db.enqueue_committed(outbox, &messages(count, 10, 5)).await;
    let running = start(&db, outbox, Duration::from_millis(100), None, max_in_flight);
    let pid = server.pid();
    running
        .publisher
        .after_the_first_batch(move || send_signal(pid, libc::SIGSTOP));
    wait_until("the first batch", secs(30), async || {
        !running.publisher.batches().is_empty()
    })
    .await;
    (server, db, running)
}

in_flight_variants!(
    #[ignore = "needs MariaDB: .ci/run installs it"]
    a_frozen_server_neither_hangs_the_relay_nor_loses_a_message
);
/// The scenario (common_relay/faults.rs) on MariaDB.
async fn a_frozen_server_neither_hangs_the_relay_nor_loses_a_message(max_in_flight: u32) {
    let (server, db, running) =
        frozen_after_the_first_batch("frozen", "outbox_frozen", 20, max_in_flight).await;
    let target = Target {
        server: &server,
        db: &db,
    };
    faults::a_frozen_server_neither_hangs_the_relay_nor_loses_a_message(
        &target,
        "outbox_frozen",
        20,
        running,
    )
    .await;
}

in_flight_variants!(
    #[ignore = "needs MariaDB: .ci/run installs it"]
    shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded
);
/// The scenario (common_relay/faults.rs) on MariaDB.
async fn shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded(max_in_flight: u32) {
    let (server, db, running) =
        frozen_after_the_first_batch("frozen_shutdown", "outbox_shutdown", 3, max_in_flight).await;
    let target = Target {
        server: &server,
        db: &db,
    };
    faults::shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded(&target, running)
        .await;
}

in_flight_variants!(
    #[ignore = "needs MariaDB: .ci/run installs it"]
    a_killed_and_restarted_server_loses_nothing_and_the_binlog_wake_comes_back
);
/// `kill -9` of the server and a restart on the same data directory: nothing is lost, the
/// binlog waker follows the new binlog file, and when its stream is cut again it follows
/// again (from the file the server moved to, not the one before the restart).
async fn a_killed_and_restarted_server_loses_nothing_and_the_binlog_wake_comes_back(
    max_in_flight: u32,
) {
    let (mut server, db) = OwnedServer::with_database("restart").await;
    db.outbox("outbox_restart").await;
    // The relay's own poll is a minute: only the waker moves it quickly.
    let running = start(
        &db,
        "outbox_restart",
        secs(60),
        Some(waker_config()),
        max_in_flight,
    );
    let mut state = following_state(&running).await;
    db.enqueue_committed("outbox_restart", &messages(10, 10, 5))
        .await;
    wait_until("the first ten", secs(10), async || {
        db.count("outbox_restart", "status = 2").await == 10
    })
    .await;

    server.kill();
    tokio::time::sleep(secs(2)).await;
    server.restart();
    let db = reopened(&db);
    db.enqueue_committed("outbox_restart", &messages(10, 10, 5))
        .await;
    wait_until("the ten enqueued after the restart", secs(30), async || {
        db.count("outbox_restart", "status = 2").await == 20
    })
    .await;

    // Following the server's current file again.
    follows_file(&mut state, &db.binlog_file().await, secs(30)).await;

    // Its stream is cut (a failover, a killed dump thread): it resumes, from the new file.
    cut_the_binlog_stream(&db, &mut state).await;
    let follows_again = tokio::time::timeout(secs(15), state.wait_for(following))
        .await
        .is_ok();
    assert!(
        follows_again,
        "the waker never follows again: {:?}",
        *state.borrow()
    );
    let last = db
        .enqueue_committed("outbox_restart", &messages(1, 10, 5))
        .await;
    wait_until("the last message", secs(10), async || {
        db.count("outbox_restart", "status = 2").await == 21
    })
    .await;

    let publisher = Arc::clone(&running.publisher);
    running.stop(secs(30)).await;
    let counts = publisher.counts();
    assert_eq!(counts.len(), 21, "{counts:?}");
    assert!(counts.contains_key(&last[0].id));
    // The kill came while everything was acknowledged: nothing to publish twice.
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
}

/// The file the waker would resume from is purged while its stream is down: the server
/// refuses the position (1236), and the waker follows from the current position instead of
/// polling for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it"]
async fn a_purged_resume_file_falls_back_to_the_current_position() {
    let (_server, db) = OwnedServer::with_database("purged").await;
    db.outbox("outbox_purged").await;
    // Reconnects 5 s after a cut: time to purge what it was reading.
    let config = BinlogWakerConfig {
        reconnect_delay: secs(5),
        ..waker_config()
    };
    let running = start(&db, "outbox_purged", secs(60), Some(config), 1);
    let mut state = following_state(&running).await;
    // Cut the stream, and before the waker reconnects move to a new file and purge the one
    // it was reading.
    cut_the_binlog_stream(&db, &mut state).await;
    db.sql("flush binary logs").await;
    let file = db.binlog_file().await;
    db.sql(&format!("purge binary logs to '{file}'")).await;
    follows_file(&mut state, &file, secs(15)).await;
    db.enqueue_committed("outbox_purged", &messages(1, 10, 1))
        .await;
    wait_until("a wake after the fallback", secs(5), async || {
        db.count("outbox_purged", "status = 2").await == 1
    })
    .await;
    running.stop(secs(30)).await;
}

/// MariaDB's compressed binlog (`log_bin_compress`): the waker cannot read the compressed
/// insert, but it still wakes the relay for it and keeps following.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it"]
async fn compressed_binlog_events_still_wake_the_relay() {
    let (_server, db) = OwnedServer::with_database("compressed").await;
    db.outbox("outbox_compressed").await;
    db.sql("set global log_bin_compress = on, global log_bin_compress_min_len = 10")
        .await;
    let running = start(&db, "outbox_compressed", secs(60), Some(waker_config()), 1);
    let state = following_state(&running).await;
    // The relay's first claim (at start) is over once it sleeps; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 1..=3 {
        db.enqueue_committed("outbox_compressed", &messages(1, 2000, 1))
            .await;
        // Well under the relay's 60 s poll, over the waker's 500 ms fallback poll.
        wait_until("a wake for a compressed insert", secs(5), async || {
            db.count("outbox_compressed", "status = 2").await == round
        })
        .await;
    }
    assert!(following(&state.borrow()), "{:?}", *state.borrow());
    running.stop(secs(30)).await;
}

// ------------------------------------------------------------------------------------------
// The CLI: signals while standard output is blocked or the server is frozen
// ------------------------------------------------------------------------------------------

/// `changefeed relay` (JSON lines) over `outbox`, stdout and stderr piped.
fn relay_child(url: &str, outbox: &str, max_in_flight: u32, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["relay", "--outbox", outbox, "--url", url])
        .args(["--max-in-flight", &max_in_flight.to_string()])
        .args(["--progress-interval", "1h"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the changefeed binary runs")
}

/// Waits until a row of `outbox` is claimed (status 1).
async fn wait_for_a_claim(db: &TestDb, outbox: &str) {
    wait_until("a claimed row", secs(30), async || {
        db.count(outbox, "status = 1").await > 0
    })
    .await;
}

in_flight_variants!(
    #[ignore = "needs MariaDB: .ci/run installs it"]
    the_cli_relay_stops_while_its_standard_output_is_blocked
);
/// A reader nobody drains: the relay's batch (100 messages, 200 KB of JSON lines) fills the pipe and its
/// write blocks. The first SIGINT still ends it within --shutdown-grace; and a second
/// SIGINT ends it at once whatever the grace.
async fn the_cli_relay_stops_while_its_standard_output_is_blocked(max_in_flight: u32) {
    let (_server, db) = OwnedServer::with_database("pipe").await;
    for (outbox, grace, signals) in [("outbox_grace", "2s", 1), ("outbox_twice", "1h", 2)] {
        db.outbox(outbox).await;
        db.enqueue_committed(outbox, &messages(100, 2000, 100))
            .await;
        let mut child = relay_child(&db.url, outbox, max_in_flight, &["--shutdown-grace", grace]);
        let stderr = stderr_lines(&mut child);
        wait_for_a_claim(&db, outbox).await;
        // Past the first 64 KiB the write blocks.
        tokio::time::sleep(secs(1)).await;
        let started = Instant::now();
        signal(&child, libc::SIGINT);
        if signals == 2 {
            tokio::time::sleep(secs(1)).await;
            assert!(child.try_wait().unwrap().is_none(), "the grace is an hour");
            signal(&child, libc::SIGINT);
        }
        let stdout = child.stdout.take();
        let (status, _) = tokio::task::spawn_blocking(move || wait_for_exit(child, secs(15)))
            .await
            .unwrap();
        drop(stdout);
        assert!(
            started.elapsed() < secs(8),
            "{grace}: {:?}",
            started.elapsed()
        );
        assert_eq!(status.code(), Some(130), "{grace}");
        let lines: Vec<String> = stderr.try_iter().collect();
        let expected = if signals == 2 {
            "stopped at once by a second signal: the batch in flight was not finished"
        } else {
            "stopped at once: the batch in flight was not finished within the shutdown grace (2s)"
        };
        assert!(lines.iter().any(|line| line == expected), "{lines:?}");
    }
}

in_flight_variants!(
    #[ignore = "needs MariaDB: .ci/run installs it"]
    the_cli_relay_stops_within_its_grace_while_mark_done_hangs
);
/// The server freezes while the CLI relay writes a batch, so its `mark_done` meets a frozen
/// server: the first SIGINT ends the process within --shutdown-grace.
async fn the_cli_relay_stops_within_its_grace_while_mark_done_hangs(max_in_flight: u32) {
    use std::io::{BufRead, BufReader, Read};

    let (server, db) = OwnedServer::with_database("cli_frozen").await;
    db.outbox("outbox_cli_frozen").await;
    db.enqueue_committed("outbox_cli_frozen", &messages(100, 2000, 100))
        .await;
    let mut child = relay_child(
        &db.url,
        "outbox_cli_frozen",
        max_in_flight,
        &["--shutdown-grace", "3s"],
    );
    let _stderr = stderr_lines(&mut child);
    // The batch (200 KB) cannot be written before the reader drains it: read one line,
    // freeze the server, then drain, so the acknowledgement comes after the freeze.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        (line, stdout)
    });
    let (line, mut stdout) = tokio::time::timeout(secs(30), first)
        .await
        .expect("a first JSON line")
        .unwrap();
    assert!(line.contains("\"orders\""), "{line}");
    server.freeze();
    let drained = std::thread::spawn(move || {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).ok();
        rest.lines().count() + 1
    });
    tokio::time::sleep(secs(2)).await;
    assert!(child.try_wait().unwrap().is_none());
    let started = Instant::now();
    signal(&child, libc::SIGINT);
    let (status, _) = tokio::task::spawn_blocking(move || wait_for_exit(child, FROZEN))
        .await
        .unwrap();
    let took = started.elapsed();
    server.thaw();
    assert!(took < secs(10), "stopped after {took:?}");
    assert_eq!(status.code(), Some(130));
    assert_eq!(drained.join().unwrap(), 100, "the whole batch was written");
}

/// An enqueue larger than the server's `max_allowed_packet` (which the client reads when it
/// connects) is refused before it is sent: a permanent error that names the limit and the
/// fix, not a transient connection error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it"]
async fn an_enqueue_over_max_allowed_packet_is_permanent_and_names_the_limit() {
    let (_server, db) = OwnedServer::with_database("packet").await;
    db.outbox("outbox_packet").await;
    db.sql("set global max_allowed_packet = 1048576").await;
    // Connections opened from now on get the smaller limit.
    let db = reopened(&db);
    let table: changefeed::mysql::OutboxTable = "outbox_packet".parse().unwrap();
    let mut tx = db.transaction().await;
    let error = changefeed::mysql::enqueue(&mut tx, &table, &messages(1, 2 << 20, 1)[0])
        .await
        .expect_err("a 2 MiB message over a 1 MiB max_allowed_packet");
    assert!(!error.is_transient(), "{error}");
    assert_eq!(error.server_number(), Some(1153), "{error}");
    let text = error.to_string();
    assert!(text.contains("larger than max_allowed_packet"), "{text}");
    assert!(text.contains("SET GLOBAL max_allowed_packet"), "{text}");
}
