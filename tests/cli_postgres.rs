//! The `changefeed` binary on PostgreSQL, run as a process against a private server
//! (tests/common_postgres, or `CHANGEFEED_TEST_POSTGRES`): `migrate` applies the bundle to
//! an empty database, `setup-feed` in both modes, `status` (tables and JSON, consumers),
//! `purge` in batches, held back by a consumer, forced, `tail` from the start, a cursor and
//! a time, following the head until Ctrl-C, and (feature `kafka`) `export` to librdkafka's
//! mock cluster, stopped and resumed; and the refusals that name what is wrong.
//!
//! `#[ignore]`d like every live test; `.ci/run` runs them with `--ignored`.

#[cfg(feature = "kafka")]
mod common_kafka;
mod common_postgres;
mod common_process;
mod common_server;

use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common_postgres::{TestDb, database};
use common_process::{assert_one_error_line, changefeed, signal, wait_for_exit};
use serde_json::Value;

const IGNORE: &str = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)";

/// Runs the tool against `url` with `args`.
fn run(url: &str, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend(["--url", url]);
    changefeed(&all)
}

/// Runs the tool, which must succeed, and returns its standard output.
fn ok(url: &str, args: &[&str]) -> String {
    let output = run(url, args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The tool's one error line for `args`, and its exit status.
fn refused(url: &str, args: &[&str]) -> (String, i32) {
    let output = run(url, args);
    let line = assert_one_error_line(&output);
    (line, output.status.code().unwrap_or(-1))
}

/// `status --json [--consumers]` as JSON.
fn status_json(url: &str, consumers: bool) -> Value {
    let mut args = vec!["status", "--json"];
    if consumers {
        args.push("--consumers");
    }
    serde_json::from_str(ok(url, &args).trim()).expect("status --json prints one JSON object")
}

/// Moves the committed outbox rows of `feed`'s shard 0 into the feed by reading at the
/// head (autocommit, as the function needs), and returns how many rows it read.
async fn read_head(db: &TestDb, feed: &str) -> usize {
    let client = db.client().await;
    let function: String = client
        .query_one(
            "select read_function from changefeed.feed_info($1)",
            &[&feed],
        )
        .await
        .unwrap()
        .get(0);
    let start = vec![0u8; 16];
    client
        .query(
            &format!("select r.ulid from {function}(0, $1, 1000) as r"),
            &[&start],
        )
        .await
        .unwrap_or_else(|e| panic!("{function}: {e}"))
        .len()
}

/// A database with nothing in it: `migrate` must bring the bundle.
async fn empty_database(name: &str) -> String {
    let server = common_postgres::server::server();
    let name = format!("cf_{name}");
    let admin = changefeed::postgres::connect(
        &changefeed::postgres::config(&server.url_for("postgres")).unwrap(),
    )
    .await
    .unwrap();
    admin
        .batch_execute(&format!("drop database if exists {name} with (force)"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("create database {name}"))
        .await
        .unwrap();
    server.url_for(&name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn migrate_applies_the_bundle_once() {
    let _ = IGNORE;
    let url = empty_database("cli_migrate").await;
    let bundle = changefeed::postgres::bundle().len();
    let first = ok(&url, &["migrate"]);
    assert!(
        first.starts_with(&format!(
            "applied {bundle} PostgreSQL changefeed migrations ({bundle} in the bundle)"
        )),
        "{first}"
    );
    assert!(first.contains("create_function_setup_feed"), "{first}");
    let again = ok(&url, &["migrate"]);
    assert!(
        again.starts_with("applied 0 PostgreSQL changefeed migrations")
            && again.contains("the database is up to date"),
        "{again}"
    );
    // The feed commands work on what migrate applied.
    let status = status_json(&url, true);
    assert_eq!(status["feeds"], Value::Array(vec![]), "{status}");
    assert_eq!(status["consumers"], Value::Array(vec![]), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn setup_feed_status_and_purge_an_outbox_feed() {
    let db = database("cli_outbox").await;
    let url = db.url.as_str();
    db.sql(r#"create schema app; create table app."Order" (id bigint primary key, body text)"#)
        .await;
    let setup = ok(url, &["setup-feed", "app.Order", "--outbox"]);
    assert!(
        setup.starts_with("app.Order is a feed on PostgreSQL (outbox mode, 1 shard)"),
        "{setup}"
    );
    assert!(setup.contains(r#"insert into "app"."Order""#), "{setup}");
    assert!(setup.contains("changefeed.read_feed_"), "{setup}");
    // Idempotent, as the function is.
    assert_eq!(ok(url, &["setup-feed", "app.Order", "--outbox"]), setup);

    db.sql(r#"insert into app."Order" select n, 'e' || n from generate_series(1, 5) as n"#)
        .await;
    let status = status_json(url, false);
    let shard = &status["feeds"][0];
    assert_eq!(shard["feed"], "app.Order", "{status}");
    assert_eq!(shard["mode"], "outbox", "{status}");
    assert_eq!(shard["outbox_depth"], 5, "{status}");
    assert_eq!(shard["head_ulid"], Value::Null, "{status}");

    assert_eq!(read_head(&db, "app.Order").await, 5);
    let status = status_json(url, false);
    let shard = &status["feeds"][0];
    assert_eq!(shard["outbox_depth"], 0, "{status}");
    let head: ulid::Ulid = shard["head_ulid"].as_str().unwrap().parse().unwrap();
    let head_at = shard["head_at"].as_str().unwrap();
    assert!(head_at.ends_with('Z') && head_at.len() == 24, "{status}");
    let table = ok(url, &["status"]);
    assert!(
        table.starts_with("feed       mode    shard  outbox_depth  head_ulid"),
        "{table}"
    );
    assert!(table.contains(&head.to_string()), "{table}");
    assert!(table.contains("(no outboxes)"), "{table}");

    // A registered consumer at the start holds the purge back; status shows it. An
    // unregistered one holds nothing back.
    db.sql("select changefeed.save_cursor('billing', 'app.Order', 0, '\\x00000000000000000000000000000000'::bytea); \
            select changefeed.register_consumer('billing', 'app.Order'); \
            select changefeed.save_cursor('idle', 'app.Order', 0, '\\x00000000000000000000000000000000'::bytea)")
        .await;
    let status = status_json(url, true);
    let billing = &status["consumers"][0];
    assert_eq!(billing["consumer"], "billing", "{status}");
    assert_eq!(billing["feed"], "app.Order", "{status}");
    assert_eq!(billing["expired"], false, "{status}");
    assert!(billing["lag_ms"].as_i64().unwrap() > 0, "{status}");
    let consumers = ok(url, &["status", "--consumers"]);
    assert!(consumers.contains("billing"), "{consumers}");

    std::thread::sleep(std::time::Duration::from_millis(20));
    let held = ok(url, &["purge", "app.Order", "--older-than", "0s"]);
    assert!(held.contains("held back by consumer billing"), "{held}");
    assert!(!held.contains("not yet read by"), "{held}");
    assert!(
        held.ends_with("deleted 0 rows older than 0s from app.Order in 1 shard\n"),
        "{held}"
    );

    let dry = ok(
        url,
        &[
            "purge",
            "app.Order",
            "--older-than",
            "0s",
            "--force",
            "--dry-run",
        ],
    );
    assert!(dry.contains("would delete 5 rows"), "{dry}");
    assert!(
        dry.contains("shard 0: would delete rows not yet read by billing, idle\n"),
        "{dry}"
    );
    assert_eq!(db.count(r#"app."Order""#, "true").await, 5);

    // --max-rows 3 in batches of 2: two calls, three rows, and the reason says why.
    let some = ok(
        url,
        &[
            "purge",
            "app.Order",
            "--older-than",
            "0s",
            "--force",
            "--batch-size",
            "2",
            "--max-rows",
            "3",
        ],
    );
    assert!(some.contains("max rows reached"), "{some}");
    assert!(
        some.contains("shard 0: deleted rows not yet read by billing, idle\n"),
        "{some}"
    );
    assert!(
        some.ends_with("deleted 3 rows older than 0s from app.Order in 1 shard\n"),
        "{some}"
    );
    let rest = ok(
        url,
        &[
            "purge",
            "app.Order",
            "--older-than",
            "0s",
            "--force",
            "--batch-size",
            "1",
        ],
    );
    assert!(rest.contains("cutoff reached"), "{rest}");
    assert!(
        rest.ends_with("deleted 2 rows older than 0s from app.Order in 1 shard\n"),
        "{rest}"
    );
    // Everything is purged through the head: billing's cursor has expired.
    let status = status_json(url, true);
    assert_eq!(
        status["feeds"][0]["purged_through"],
        head.to_string(),
        "{status}"
    );
    assert_eq!(status["consumers"][0]["expired"], true, "{status}");

    let (line, code) = refused(
        url,
        &["purge", "app.Order", "--older-than", "1d", "--shard", "1"],
    );
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains("--shard 1: app.Order has 1 shard(s), 0 to 0"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn serialized_and_sharded_feeds_and_the_refusals() {
    let db = database("cli_serialized").await;
    let url = db.url.as_str();
    db.sql(
        "create schema app; \
         create table app.orders (id bigint primary key, shard int not null, ulid bytea not null); \
         create unique index on app.orders (shard, ulid); \
         create table app.events (id bigint primary key, shard int not null)",
    )
    .await;
    let setup = ok(
        url,
        &[
            "setup-feed",
            "app.orders",
            "--serialize-writers",
            "--shard-column",
            "shard",
            "--ulid-column",
            "ulid",
            "--shards",
            "2",
        ],
    );
    assert!(
        setup.starts_with(
            "app.orders is a feed on PostgreSQL (serialized-writer mode, 2 shards: shard \
             column shard, ULID column ulid)"
        ),
        "{setup}"
    );
    assert!(setup.contains("changefeed.lock_feed_"), "{setup}");
    let sharded = ok(
        url,
        &[
            "setup-feed",
            "app.events",
            "--outbox",
            "--shard-column",
            "shard",
            "--shards",
            "3",
        ],
    );
    assert!(
        sharded.contains("(outbox mode, 3 shards, shard column shard)"),
        "{sharded}"
    );
    let status = status_json(url, false);
    let modes: Vec<(String, i64)> = status["feeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["mode"].as_str().unwrap().to_owned(),
                s["shard_id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        modes,
        [
            ("outbox".to_owned(), 0),
            ("outbox".to_owned(), 1),
            ("outbox".to_owned(), 2),
            ("serialize_writers".to_owned(), 0),
            ("serialize_writers".to_owned(), 1),
        ],
        "{status}"
    );

    // Refusals, one line each, naming what is wrong.
    let (line, code) = refused(url, &["purge", "app.orders", "--older-than", "1d"]);
    assert_eq!(code, 1, "{line}");
    assert!(line.contains("app.orders has serialized writers"), "{line}");
    let (line, code) = refused(url, &["purge", "app.nope", "--older-than", "1d"]);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.contains("app.nope is not a feed in this PostgreSQL database"),
        "{line}"
    );
    let (line, code) = refused(
        url,
        &["setup-feed", "app.events", "--outbox", "--shards", "2"],
    );
    assert_eq!(code, 2, "{line}");
    assert!(line.contains("--shards 2 needs --shard-column"), "{line}");
    // Another mode for an existing feed: the bundle's own error (CF005), in one line.
    let (line, code) = refused(url, &["setup-feed", "app.events", "--outbox"]);
    assert_eq!(code, 1, "{line}");
    assert!(line.contains("CF005"), "{line}");
    let (line, _) = refused(url, &["setup-feed", "app.missing", "--outbox"]);
    assert!(line.contains("CF001") && line.contains("app"), "{line}");
}

/// `changefeed <args> --url <url>` as a child: stdin closed, stdout and stderr piped.
fn spawn(url: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(args)
        .args(["--url", url])
        .env_remove("CHANGEFEED_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the changefeed binary runs")
}

/// The lines `child` writes on standard output, as they come.
fn stdout_lines(child: &mut Child) -> Receiver<String> {
    use std::io::{BufRead, BufReader};
    let pipe = child.stdout.take().expect("stdout is piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The next `count` lines of `lines` as JSON, each within 30 s.
fn next_json(lines: &Receiver<String>, count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("line {i} of {count}: {e}"));
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
        })
        .collect()
}

/// Stops `child` with SIGINT and returns its exit status code and standard error.
fn interrupt(child: Child) -> (Option<i32>, String) {
    signal(&child, libc::SIGINT);
    let (status, stderr) = wait_for_exit(child, Duration::from_secs(30));
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn tail_prints_json_lines_follows_the_head_and_resumes_from_a_cursor_or_a_time() {
    let db = database("cli_tail").await;
    let url = db.url.as_str();
    db.sql(
        "create schema app; \
         create table app.events (id bigint primary key, shard int not null, body text)",
    )
    .await;
    ok(
        url,
        &[
            "setup-feed",
            "app.events",
            "--outbox",
            "--shard-column",
            "shard",
            "--shards",
            "2",
        ],
    );
    db.sql("insert into app.events select n, n % 2, 'body ' || n from generate_series(1, 6) as n")
        .await;

    // Shard 1 from the start: the odd ids, in order, with --page-size 2 over pages.
    let mut child = spawn(
        url,
        &["tail", "app.events", "--shard", "1", "--page-size", "2"],
    );
    let lines = stdout_lines(&mut child);
    let first = next_json(&lines, 3);
    let ids: Vec<i64> = first
        .iter()
        .map(|l| l["key"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 3, 5], "{first:?}");
    for line in &first {
        assert_eq!(line["shard"], 1, "{line}");
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
        assert_eq!(
            line.as_object().unwrap().len(),
            4,
            "ulid, time, shard, key: {line}"
        );
    }
    let ulids: Vec<String> = first
        .iter()
        .map(|l| l["ulid"].as_str().unwrap().to_owned())
        .collect();
    assert!(ulids.windows(2).all(|w| w[0] < w[1]), "{ulids:?}");
    // It follows the head: a later commit shows up.
    db.sql("insert into app.events values (7, 1, 'late'), (8, 0, 'other shard')")
        .await;
    let late = next_json(&lines, 1);
    assert_eq!(late[0]["key"]["id"], 7, "{late:?}");
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(lines.try_recv().is_err(), "nothing after id 7");

    // After a printed cursor, with every column of the event.
    let mut child = spawn(
        url,
        &[
            "tail",
            "app.events",
            "--shard",
            "1",
            "--from",
            &ulids[0],
            "--with-event",
        ],
    );
    let lines = stdout_lines(&mut child);
    let after = next_json(&lines, 3);
    let events: Vec<(i64, String)> = after
        .iter()
        .map(|l| {
            (
                l["event"]["id"].as_i64().unwrap(),
                l["event"]["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            (3, "body 3".to_owned()),
            (5, "body 5".to_owned()),
            (7, "late".to_owned())
        ],
        "{after:?}"
    );
    assert_eq!(interrupt(child).0, Some(130));

    // From a time after every event so far: only what comes later.
    std::thread::sleep(Duration::from_millis(20));
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut child = spawn(url, &["tail", "app.events", "--from", &now]);
    let lines = stdout_lines(&mut child);
    db.sql("insert into app.events values (10, 0, 'new')").await;
    let new = next_json(&lines, 1);
    assert_eq!(
        new[0]["key"]["id"], 10,
        "{new:?} (id 8 of shard 0 is older than {now})"
    );
    assert_eq!(interrupt(child).0, Some(130));

    let (line, code) = refused(url, &["tail", "app.events", "--shard", "2"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains("--shard 2: app.events has 2 shard(s), 0 to 1"),
        "{line}"
    );
    let (line, code) = refused(url, &["tail", "app.nope"]);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.contains("app.nope is not a feed in this PostgreSQL database"),
        "{line}"
    );
}

/// `export` from a PostgreSQL feed to librdkafka's mock cluster: every shard by default,
/// keys as the primary key's JSON, values every column (numeric as exact text, bytea as
/// hex), cursors saved in the feed's database under --consumer; stopped by SIGINT with 0
/// and resumed after the saved cursors with nothing sent twice.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn export_sends_a_feed_stops_on_sigint_and_resumes_after_its_saved_cursors() {
    use changefeed::kafka::rdkafka::mocking::MockCluster;
    use changefeed::kafka::rdkafka::producer::DefaultProducerContext;

    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).expect("rdkafka's mock cluster starts");
    cluster.create_topic("order-events", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let db = database("cli_export").await;
    let url = db.url.clone();
    db.sql(
        "create schema app; \
         create table app.orders (id bigint primary key, shard int not null, \
             amount numeric(10, 2) not null, raw bytea)",
    )
    .await;
    ok(
        &url,
        &[
            "setup-feed",
            "app.orders",
            "--outbox",
            "--shard-column",
            "shard",
            "--shards",
            "2",
        ],
    );
    db.sql("insert into app.orders select n, n % 2, n + 0.5, '\\x0a0b' from generate_series(1, 4) as n")
        .await;
    let export = || {
        spawn(
            &url,
            &[
                "export",
                "app.orders",
                "--brokers",
                &brokers,
                "--topic",
                "order-events",
                "--consumer",
                "cli-export",
                "--progress-interval",
                "1s",
            ],
        )
    };
    let consume = |count: usize, limit: Duration| {
        let brokers = brokers.clone();
        tokio::task::spawn_blocking(move || {
            let mut records: Vec<(i64, Value, String)> =
                common_kafka::consume(&brokers, "order-events", count, limit, Duration::ZERO)
                    .into_iter()
                    .map(|record| {
                        let value = record.json();
                        (
                            value["id"].as_i64().expect("the event's id"),
                            value,
                            record.key.expect("a key"),
                        )
                    })
                    .collect();
            records.sort_by_key(|(id, _, _)| *id);
            records
        })
    };
    let saved = "select count(*) from changefeed.consumer_cursor where consumer = 'cli-export'";

    let child = export();
    let first = consume(4, Duration::from_secs(60)).await.unwrap();
    let ids: Vec<i64> = first.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3, 4], "{first:?}");
    let (_, value, key) = &first[0];
    assert_eq!(key, r#"{"id":1}"#);
    assert_eq!(value["amount"], "1.50", "{value}");
    assert_eq!(value["raw"], "0x0A0B", "{value}");
    assert_eq!(value["shard"], 1, "{value}");
    // Both shards' cursors are saved once their pages are acknowledged.
    let started = std::time::Instant::now();
    while db.scalar(saved).await < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no cursors saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("exporting app.orders (shards 0, 1)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopped: exported 4; cursors saved: shard 0 at "),
        "{stderr}"
    );

    // New events while it is down; the restart resumes after the saved cursors.
    db.sql("insert into app.orders values (5, 1, 5.5, null), (6, 0, 6.5, null)")
        .await;
    let child = export();
    let all = consume(6, Duration::from_secs(60)).await.unwrap();
    let ids: Vec<i64> = all.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "{all:?}");
    let (code, stderr) = interrupt(child);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("stopped: exported 2;"), "{stderr}");
    // Nothing more than the six came: a seventh would be a duplicate.
    assert_eq!(consume(7, Duration::from_secs(3)).await.unwrap().len(), 6);

    let (line, code) = refused(
        &url,
        &[
            "export",
            "app.orders",
            "--brokers",
            &brokers,
            "--topic",
            "t",
            "--consumer",
            "c",
            "--shards",
            "0,5",
        ],
    );
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains("--shards 5: app.orders has 2 shard(s), 0 to 1"),
        "{line}"
    );
}
