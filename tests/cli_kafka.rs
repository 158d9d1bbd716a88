//! `changefeed relay --brokers` and `changefeed export` run as processes against rdkafka's
//! in-process mock cluster (`MockCluster`: real localhost listeners the child reaches).
//!
//! Without a database: the help of both commands, an unreachable broker (one line, exit 2,
//! the database never tried), a reachable broker in front of an unreachable SQL Server
//! (one line, exit 2), refused producer settings. With MariaDB (`#[ignore]`d; .ci/run's
//! MariaDB step runs them): the relay delivers an outbox to the mock cluster and stops
//! with exit 0 on SIGINT, exits 130 at once on a second signal while its batch is stuck,
//! says on its progress line when a dead letter fails, and stops the same way without
//! --brokers (JSON lines). With SQL Server (`#[ignore]`d; `CHANGEFEED_TEST_MSSQL`): the
//! export end to end, stopped by SIGINT and resumed after a restart.

mod common;
mod common_kafka;
#[cfg(feature = "mysql")]
mod common_mysql;
mod common_process;
#[cfg(feature = "mysql")]
#[macro_use]
mod common_relay;
#[cfg(feature = "mysql")]
mod common_server;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::DefaultProducerContext;
#[cfg(feature = "mysql")]
use changefeed::outbox::NewMessage;
#[cfg(feature = "mysql")]
use common_process::stderr_lines;
use common_process::{assert_one_error_line, changefeed, signal, wait_for_exit};
#[cfg(feature = "mysql")]
use serde_json::json;

/// An address where nothing listens: connecting is refused at once.
const UNREACHABLE_SQL: &str =
    "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true";

/// A localhost port where nothing listens (bound, then let go).
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

/// A one-broker mock cluster.
fn mock_cluster() -> MockCluster<'static, DefaultProducerContext> {
    MockCluster::new(1).expect("rdkafka's mock cluster starts")
}

/// A mock cluster with `topic` (one partition), and its bootstrap servers.
fn cluster_with_topic(topic: &str) -> (MockCluster<'static, DefaultProducerContext>, String) {
    let cluster = mock_cluster();
    cluster.create_topic(topic, 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    (cluster, brokers)
}

/// The `relay` arguments for `brokers`, and `extra`.
fn relay_args<'a>(brokers: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["relay", "--outbox", "dbo.outbox", "--brokers", brokers];
    args.extend(extra);
    args
}

/// `export <table> --brokers <brokers> --topic <topic> --consumer <consumer>`.
fn export_of<'a>(
    table: &'a str,
    brokers: &'a str,
    topic: &'a str,
    consumer: &'a str,
) -> Vec<&'a str> {
    vec![
        "export",
        table,
        "--brokers",
        brokers,
        "--topic",
        topic,
        "--consumer",
        consumer,
    ]
}

/// The `export` arguments for `brokers`, and `extra`.
fn export_args<'a>(brokers: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = export_of("app.OrderPlaced", brokers, "orders", "export");
    args.extend(extra);
    args
}

#[test]
fn the_help_of_both_commands_documents_every_option_and_the_exit_status() {
    let common = [
        "--brokers <HOST:PORT,...>",
        "-X, --producer-setting <KEY=VALUE>",
        "--broker-timeout <DURATION>",
        "--progress-interval <DURATION>",
        "-q, --quiet",
        "--url <URL>",
        "--connect-timeout <DURATION>",
        "SIGINT or SIGTERM",
        "Exit status: 0 stopped by a signal, 1 failed while running",
        "2 bad arguments or no usable connection (brokers or database)",
        "130 stopped at once by a second signal",
    ];
    for (command, own) in [
        (
            "relay",
            &[
                "--outbox <TABLE>",
                "--batch-size <N>",
                "--topic-prefix <PREFIX>",
                "--dlq-suffix <SUFFIX>",
                "[default: .dlq]",
            ][..],
        ),
        (
            "export",
            &[
                "<SCHEMA.TABLE>",
                "--topic <TOPIC>",
                "--consumer <NAME>",
                "--shards <N,N,...>",
                "--from <WHERE>",
                "the saved cursor wins",
                "--page-size <N>",
            ],
        ),
    ] {
        let output = changefeed(&[command, "--help"]);
        assert!(output.status.success(), "{command}: {output:?}");
        let help = String::from_utf8_lossy(&output.stdout);
        // Help text wraps at the terminal's width: compare with the line breaks undone.
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for needle in common.iter().chain(own) {
            assert!(
                flat.contains(needle),
                "{command} --help lacks {needle:?}:\n{help}"
            );
        }
        // Every option has a sentence of its own, not just its name.
        for line in help.lines().map(str::trim_start) {
            if line.starts_with('-') && !line.starts_with("-h,") && !line.starts_with("-V,") {
                let described = line
                    .split_once("  ")
                    .is_some_and(|(_, text)| !text.trim().is_empty());
                assert!(described, "{command}: {line:?} has no description:\n{help}");
            }
        }
    }
    let output = changefeed(&["--help"]);
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.lines()
            .any(|line| line.trim_start().starts_with("export ")),
        "{help}"
    );
}

#[test]
fn an_unreachable_broker_is_one_line_and_exit_2_before_the_database() {
    let brokers = closed_port();
    for args in [
        relay_args(
            &brokers,
            &["--broker-timeout", "2s", "--url", UNREACHABLE_SQL],
        ),
        export_args(
            &brokers,
            &["--broker-timeout", "2s", "--url", UNREACHABLE_SQL],
        ),
        vec![
            "relay",
            "--outbox",
            "outbox",
            "--brokers",
            &brokers,
            "--broker-timeout",
            "2s",
            "--url",
            "mysql://relay@127.0.0.1:1/app",
        ],
    ] {
        let started = Instant::now();
        let output = changefeed(&args);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
        assert!(line.contains(&brokers), "{args:?}: {line}");
        assert!(line.contains("--brokers"), "{args:?}: {line}");
        // The database comes after the brokers: it was never tried.
        assert!(
            !line.contains("127.0.0.1:1;") && !line.contains("127.0.0.1:1 "),
            "{line}"
        );
        assert!(
            !line.contains("SQL Server") && !line.contains("MariaDB"),
            "{line}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_reachable_broker_then_an_unreachable_sql_server_is_one_line() {
    let cluster = mock_cluster();
    let brokers = cluster.bootstrap_servers();
    for args in [
        relay_args(&brokers, &["--url", UNREACHABLE_SQL]),
        export_args(&brokers, &["--url", UNREACHABLE_SQL]),
    ] {
        let output = changefeed(&args);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
        assert!(line.contains("127.0.0.1:1"), "{args:?}: {line}");
        assert!(line.contains("--url"), "{args:?}: {line}");
    }
}

#[test]
fn producer_settings_are_checked_before_anything_connects() {
    let cluster = mock_cluster();
    let brokers = cluster.bootstrap_servers();
    // Malformed: refused by the parser, naming the argument and the value.
    for bad in ["compression.type", "=zstd", "bad key=1"] {
        for args in [
            relay_args(&brokers, &["-X", bad, "--url", UNREACHABLE_SQL]),
            export_args(&brokers, &["-X", bad, "--url", UNREACHABLE_SQL]),
        ] {
            let output = changefeed(&args);
            let line = assert_one_error_line(&output);
            assert_eq!(output.status.code(), Some(2), "{line}");
            assert!(
                line.contains(&format!("invalid value {bad:?} for --producer-setting")),
                "{line}"
            );
            assert!(line.contains("key=value"), "{line}");
        }
    }
    // Well formed, refused by librdkafka or by the idempotence rule: a usage error naming
    // the setting, before the database is tried.
    for (setting, name) in [
        ("no.such.setting=1", "no.such.setting"),
        ("enable.idempotence=false", "enable.idempotence"),
        // A partitioner that ignores the key breaks per-aggregate order.
        ("partitioner=random", "partitioner=random"),
        // A publish that could outlive the relay's 30 s claim: too long, or no limit.
        ("message.timeout.ms=25000", "message.timeout.ms"),
        ("delivery.timeout.ms=0", "claim_timeout"),
    ] {
        let output = changefeed(&relay_args(
            &brokers,
            &["-X", setting, "--url", UNREACHABLE_SQL],
        ));
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{line}");
        assert!(line.contains(name), "{line}");
        assert!(!line.contains("127.0.0.1:1"), "{line}");
    }
}

#[test]
fn kafka_options_and_values_are_refused_before_connecting() {
    for (args, expect) in [
        (
            vec!["relay", "--outbox", "dbo.outbox", "--topic-prefix", "prod."],
            "--brokers",
        ),
        (
            vec!["relay", "--outbox", "dbo.outbox", "--dlq-suffix", ".dead"],
            "--brokers",
        ),
        (
            export_args("127.0.0.1:9092", &["--progress-interval", "0s"]),
            "--progress-interval",
        ),
        (
            export_args("127.0.0.1:9092", &["--broker-timeout", "0s"]),
            "--broker-timeout",
        ),
        (
            export_args("127.0.0.1:9092", &["--shards", "0,x"]),
            "--shards",
        ),
        (
            export_of("app.Order", "k:9092", "a b", "c"),
            "Kafka topic name",
        ),
        (
            export_of("app.Order", "k:9092", "t", " padded"),
            "whitespace",
        ),
        (
            vec!["export", "app.Order", "--topic", "t", "--consumer", "c"],
            "--brokers",
        ),
        (export_of("app.x]", "k:9092", "t", "c"), "']'"),
    ] {
        let mut with_url = args.clone();
        with_url.extend(["--url", UNREACHABLE_SQL]);
        let output = changefeed(&with_url);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
        assert!(line.contains(expect), "{args:?}: {line}");
        assert!(!line.contains("127.0.0.1"), "{args:?} connected: {line}");
    }
}

/// Sends `signal` to `child` and waits up to 30 s for it to exit: its status and stderr.
async fn stop(child: Child, signal: libc::c_int) -> (std::process::ExitStatus, String) {
    self::signal(&child, signal);
    tokio::task::spawn_blocking(move || wait_for_exit(child, Duration::from_secs(30)))
        .await
        .unwrap()
}

/// The messages of `topic`, from the beginning, until `count` have come or `limit` has
/// passed: (key, value) each, partition by partition in offset order.
fn consume(
    brokers: &str,
    topic: &str,
    count: usize,
    limit: Duration,
) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    common_kafka::consume(brokers, topic, count, limit, Duration::ZERO)
        .into_iter()
        .map(|record| {
            (
                record.key.map(String::into_bytes),
                record.value.unwrap_or_default(),
            )
        })
        .collect()
}

/// `changefeed relay --outbox <outbox> --url <url> --max-in-flight <n> <extra…>` with stdin
/// closed, stderr piped.
#[cfg(feature = "mysql")]
fn relay_child(
    url: &str,
    outbox: &str,
    max_in_flight: u32,
    extra: &[&str],
    stdout: Stdio,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["relay", "--outbox", outbox, "--url", url])
        .args(["--max-in-flight", &max_in_flight.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the changefeed binary runs")
}

/// A MariaDB database with `outbox`, named `name_<max_in_flight>` so that the in-flight
/// variants of a test do not share one.
#[cfg(feature = "mysql")]
async fn mariadb_outbox(name: &str, outbox: &str, max_in_flight: u32) -> common_mysql::TestDb {
    let db = common_mysql::database(&format!("{name}_{max_in_flight}")).await;
    db.outbox(outbox).await;
    db
}

/// Declares the tests of the MariaDB relay test `$name` (an `async fn $name(max_in_flight:
/// u32)` next to it, under the `mysql` feature): one and four batches in flight, ignored
/// unless MariaDB is asked for.
macro_rules! mariadb_variants {
    ($name:ident) => {
        #[cfg(feature = "mysql")]
        in_flight_variants!(
            #[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
            $name
        );
    };
}

mariadb_variants!(relay_delivers_a_mariadb_outbox_to_kafka_and_stops_on_sigint_with_0);
#[cfg(feature = "mysql")]
async fn relay_delivers_a_mariadb_outbox_to_kafka_and_stops_on_sigint_with_0(max_in_flight: u32) {
    let (cluster, brokers) = cluster_with_topic("prod.orders");
    let db = mariadb_outbox("cli_kafka_relay", "outbox_kafka", max_in_flight).await;
    let messages: Vec<NewMessage> = (0..5)
        .map(|n| {
            NewMessage::new("orders", json!({ "n": n }))
                .aggregate("order", format!("order-{}", n % 2))
        })
        .collect();
    db.enqueue_committed("outbox_kafka", &messages).await;

    let child = relay_child(
        &db.url,
        "outbox_kafka",
        max_in_flight,
        &[
            "--brokers",
            &brokers,
            "--topic-prefix",
            "prod.",
            "--progress-interval",
            "1s",
        ],
        Stdio::piped(),
    );
    if !db
        .count_reaches("outbox_kafka", "status = 2", 5, Duration::from_secs(60))
        .await
    {
        let (status, stderr) = wait_for_exit(child, Duration::ZERO);
        panic!("not all 5 messages were marked done within 60 s ({status}): {stderr}");
    }
    // Past one progress interval: the line counts what was published.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, stderr) = stop(child, libc::SIGINT).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("published 5 ("), "{stderr}");
    assert!(stderr.contains("stopped: published 5"), "{stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");

    let messages = tokio::task::spawn_blocking(move || {
        consume(&brokers, "prod.orders", 5, Duration::from_secs(30))
    })
    .await
    .unwrap();
    let mut values: Vec<serde_json::Value> = messages
        .iter()
        .map(|(_, value)| serde_json::from_slice(value).expect("a JSON payload"))
        .collect();
    values.sort_by_key(|value| value["n"].as_i64());
    assert_eq!(
        values,
        (0..5).map(|n| json!({ "n": n })).collect::<Vec<_>>(),
        "every payload once, on the prefixed topic"
    );
    // Messages of one aggregate share a key (so they share a partition and keep order).
    for (key, value) in &messages {
        let n = serde_json::from_slice::<serde_json::Value>(value).unwrap()["n"]
            .as_i64()
            .unwrap();
        let key = key.as_deref().map(String::from_utf8_lossy);
        assert!(
            key.as_deref()
                .is_some_and(|k| k.contains(&format!("order-{}", n % 2))),
            "message {n} has key {key:?}"
        );
    }
    drop(cluster);
}

mariadb_variants!(relay_from_mariadb_exits_130_at_once_on_a_second_signal);
/// The first signal waits for the batch in flight; when that batch cannot finish (the
/// broker went down under it), a second signal ends the process at once with 130.
#[cfg(feature = "mysql")]
async fn relay_from_mariadb_exits_130_at_once_on_a_second_signal(max_in_flight: u32) {
    let (cluster, brokers) = cluster_with_topic("orders");
    let db = mariadb_outbox("cli_kafka_twice", "outbox_twice", max_in_flight).await;
    let mut child = relay_child(
        &db.url,
        "outbox_twice",
        max_in_flight,
        &["--brokers", &brokers, "--progress-interval", "1h"],
        Stdio::null(),
    );
    let stderr = stderr_lines(&mut child);
    let next_line = |what: &str| {
        stderr
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no {what} on stderr within 30 s"))
    };
    // Past its checks (which need the broker) before the broker goes away.
    let banner = next_line("start line");
    assert!(
        banner.starts_with("relaying outbox_twice to Kafka at "),
        "{banner}"
    );
    cluster.broker_down(1).unwrap();
    db.enqueue_committed(
        "outbox_twice",
        &[NewMessage::new("orders", serde_json::json!({}))],
    )
    .await;
    // Claimed (status 1, processing): its publish waits for the broker.
    assert!(
        db.count_reaches("outbox_twice", "status = 1", 1, Duration::from_secs(30))
            .await,
        "never claimed"
    );
    signal(&child, libc::SIGINT);
    assert_eq!(
        next_line("note of the first signal"),
        "stopping: finishing the batch in flight (signal again to stop at once)"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal waits for the batch in flight"
    );
    signal(&child, libc::SIGINT);
    let started = Instant::now();
    let (status, _) =
        tokio::task::spawn_blocking(move || wait_for_exit(child, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{status}");
    assert_eq!(status.code(), Some(130));
    let rest: Vec<String> = stderr.iter().collect();
    assert_eq!(
        rest,
        ["stopped at once by a second signal: the batch in flight was not finished"]
    );
    drop(cluster);
}

mariadb_variants!(relay_from_mariadb_says_in_its_progress_line_when_a_dead_letter_fails);
/// A poison message whose dead-letter topic refuses the producer: the default (human)
/// output says so, naming both topics and both errors, on the progress line and on the
/// last line; the row is dead, its `last_error` saying the same; the next message of its
/// aggregate goes out after it.
#[cfg(feature = "mysql")]
async fn relay_from_mariadb_says_in_its_progress_line_when_a_dead_letter_fails(max_in_flight: u32) {
    use changefeed::kafka::rdkafka::types::RDKafkaRespErr;
    use mysql_async::prelude::Queryable;

    let (cluster, brokers) = cluster_with_topic("orders");
    cluster.create_topic("orders.dlq", 1, 1).unwrap();
    cluster
        .topic_error(
            "orders.dlq",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let db = mariadb_outbox("cli_kafka_dlq", "outbox_dlq", max_in_flight).await;
    let messages = [
        NewMessage::new("orders", json!({ "blob": "x".repeat(20_000) }))
            .aggregate("order", "order-1"),
        NewMessage::new("orders", json!({ "n": 1 })).aggregate("order", "order-1"),
    ];
    db.enqueue_committed("outbox_dlq", &messages).await;

    let child = relay_child(
        &db.url,
        "outbox_dlq",
        max_in_flight,
        &[
            "--brokers",
            &brokers,
            // The first message is over it: poison, and so is its dead letter's value.
            "-X",
            "message.max.bytes=10000",
            "--progress-interval",
            "500ms",
        ],
        Stdio::null(),
    );
    if !db
        .count_reaches("outbox_dlq", "status = 2", 1, Duration::from_secs(60))
        .await
    {
        let (status, stderr) = wait_for_exit(child, Duration::ZERO);
        panic!("the second message was not published within 60 s ({status}): {stderr}");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, stderr) = stop(child, libc::SIGINT).await;
    assert_eq!(status.code(), Some(0), "{stderr}");

    let both = [
        "producing to orders: ",
        "MessageSizeTooLarge",
        "its dead letter from topic orders to orders.dlq was not written either: ",
        "producing to orders.dlq: ",
        "TopicAuthorizationFailed",
    ];
    let line = stderr
        .lines()
        .find(|line| line.contains(", dead 1, dead letters failed 1 (last: "))
        .unwrap_or_else(|| panic!("no progress line says the dead letter failed: {stderr}"));
    for part in both {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    assert_eq!(
        stderr.lines().last(),
        Some("stopped: published 1, failed 0, dead 1, dead letters failed 1"),
        "{stderr}"
    );
    let last_error: Option<String> = db
        .conn()
        .await
        .query_first("select last_error from outbox_dlq where status = 4")
        .await
        .unwrap();
    let last_error = last_error.expect("one dead row");
    assert!(last_error.starts_with("poison: "), "{last_error}");
    for part in both {
        assert!(last_error.contains(part), "{part:?} in {last_error}");
    }
    drop(cluster);
}

mariadb_variants!(relay_to_stdout_from_mariadb_stops_on_sigterm_with_0_and_its_counts);
/// Without --brokers the relay prints JSON lines, and stops the same way: SIGTERM, then
/// exit 0 with its counts; a second signal during the wait is not needed.
#[cfg(feature = "mysql")]
async fn relay_to_stdout_from_mariadb_stops_on_sigterm_with_0_and_its_counts(max_in_flight: u32) {
    use std::io::{BufRead, BufReader};

    let db = mariadb_outbox("cli_kafka_stdout", "outbox_stdout", max_in_flight).await;
    let messages: Vec<NewMessage> = (0..3)
        .map(|n| NewMessage::new("orders", serde_json::json!({ "n": n })))
        .collect();
    db.enqueue_committed("outbox_stdout", &messages).await;

    let mut child = relay_child(
        &db.url,
        "outbox_stdout",
        max_in_flight,
        &["--progress-interval", "500ms"],
        Stdio::piped(),
    );
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(3)
            .map(|line| line.unwrap())
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(30), lines)
        .await
        .expect("three lines within 30 s")
        .unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        db.count_reaches("outbox_stdout", "status = 2", 3, Duration::from_secs(30))
            .await,
        "never marked done"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, stderr) = stop(child, libc::SIGTERM).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    let stderr_lines: Vec<&str> = stderr.lines().collect();
    assert!(
        stderr_lines[0]
            .starts_with("relaying outbox_stdout to standard output (woken by the binlog"),
        "{stderr}"
    );
    assert!(
        stderr_lines.contains(&"published 3 (0/s), failed 0, dead 0")
            || stderr_lines
                .iter()
                .any(|line| line.starts_with("published 3 (") && line.ends_with("failed 0, dead 0")),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopping: finishing the batch in flight"),
        "{stderr}"
    );
    assert_eq!(
        stderr_lines.last(),
        Some(&"stopped: published 3, failed 0, dead 0"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server (CHANGEFEED_TEST_MSSQL or Docker)"]
async fn export_sends_a_feed_stops_on_sigint_with_0_and_resumes_after_a_restart() {
    use common::events::{create_feed, write_ok};
    use common::{Isolation, TestDb, scalar_i64};

    let (cluster, brokers) = cluster_with_topic("order-events");
    let db = TestDb::create("cli_export", Isolation::ReadCommittedSnapshot).await;
    let mut client = db.client().await;
    let feed = create_feed(&mut client, "ExportedOrder").await;
    for id in 1..=4 {
        write_ok(&mut client, &feed, 0, id, None).await;
    }
    let ado = db.ado();
    let export = |from: &str| {
        Command::new(env!("CARGO_BIN_EXE_changefeed"))
            .args([
                "export",
                "dbo.ExportedOrder",
                "--brokers",
                &brokers,
                "--topic",
                "order-events",
                "--consumer",
                "cli-export",
                "--from",
                from,
                "--progress-interval",
                "1s",
                "--url",
                &ado,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the changefeed binary runs")
    };
    let brokers_for = brokers.clone();
    let consume_ids = move |count: usize, limit: Duration| {
        let brokers = brokers_for.clone();
        tokio::task::spawn_blocking(move || {
            let mut ids: Vec<i64> = consume(&brokers, "order-events", count, limit)
                .into_iter()
                .map(|(_, value)| {
                    serde_json::from_slice::<serde_json::Value>(&value).expect("a JSON value")["id"]
                        .as_i64()
                        .expect("the event's id column")
                })
                .collect();
            // They come partition by partition: put them back in id (= write) order.
            ids.sort_unstable();
            ids
        })
    };

    let child = export("start");
    assert_eq!(
        consume_ids(4, Duration::from_secs(60)).await.unwrap(),
        [1, 2, 3, 4]
    );
    // The cursor is saved once the page is acknowledged; wait for it before stopping.
    let saved = "select count(*) from changefeed.consumer_cursor where consumer = N'cli-export'";
    let started = Instant::now();
    while scalar_i64(&mut client, saved).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no cursor saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, stderr) = stop(child, libc::SIGINT).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("exported 4 ("), "{stderr}");
    assert!(
        stderr.contains("stopped: exported 4; cursors saved: shard 0 at "),
        "{stderr}"
    );

    // New events while it is down; the restart resumes after the saved cursor (its --from
    // start only applies to shards with no saved cursor), so nothing is sent twice.
    for id in 5..=6 {
        write_ok(&mut client, &feed, 0, id, None).await;
    }
    let child = export("start");
    assert_eq!(
        consume_ids(6, Duration::from_secs(60)).await.unwrap(),
        [1, 2, 3, 4, 5, 6]
    );
    let (status, stderr) = stop(child, libc::SIGTERM).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("stopped: exported 2;"), "{stderr}");
    // Nothing more than the six came: a seventh would be a duplicate.
    assert_eq!(
        consume_ids(7, Duration::from_secs(3)).await.unwrap().len(),
        6
    );
    drop(client);
    db.drop_database().await;
    drop(cluster);
}
