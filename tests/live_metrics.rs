//! Operating the relay (issue 22), live: `changefeed relay --metrics-addr` against a private
//! MariaDB and rdkafka's mock cluster, scraped over plain HTTP while messages are enqueued
//! and published; `/readyz` while the database is frozen (`SIGSTOP`) and after (`SIGCONT`);
//! `changefeed status` showing the outbox's counts; the backlog query's plan (EXPLAIN) and
//! counts; the same gauges from a relay on a private PostgreSQL. MariaDB and PostgreSQL
//! tests are `#[ignore]`d and run by .ci/run; the SQL Server ones need
//! `CHANGEFEED_TEST_MSSQL`.

mod common;
mod common_kafka;
mod common_mysql;
mod common_postgres;
mod common_process;
mod common_server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::DefaultProducerContext;
use changefeed::outbox::NewMessage;
use common_mysql::owned::OwnedServer;
use common_process::{signal, stderr_lines, wait_for_exit};
use mysql_async::prelude::Queryable;
use serde_json::json;

/// `GET path` from `address`: the status code and the body (the server closes the
/// connection after one answer).
fn http_get(address: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("the metrics endpoint accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the series `name{labels}` (labels written as Prometheus does, in order),
/// or `None` when it is not there.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().expect("a number"))
}

/// Waits up to `limit` for `condition` on the scraped metrics; the last scrape either way.
async fn scrape_until(
    address: &str,
    limit: Duration,
    what: &str,
    condition: impl Fn(&str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let (status, text) = http_get(address, "/metrics");
        assert_eq!(status, 200, "{text}");
        if condition(&text) {
            return text;
        }
        assert!(
            started.elapsed() < limit,
            "not within {limit:?}: {what}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits up to `limit` for `/readyz` to answer `status`.
async fn readyz_until(address: &str, status: u16, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        let address = address.to_owned();
        let (now, body) = tokio::task::spawn_blocking(move || http_get(&address, "/readyz"))
            .await
            .unwrap();
        if now == status {
            return body;
        }
        assert!(
            started.elapsed() < limit,
            "/readyz did not turn {status} within {limit:?}: {now} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The address the child names on its `serving metrics on http://…/metrics` line.
fn metrics_address(lines: &Receiver<String>) -> String {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if let Ok(line) = lines.recv_timeout(Duration::from_secs(1))
            && let Some(rest) = line.strip_prefix("serving metrics on http://")
        {
            return rest.split('/').next().unwrap().to_owned();
        }
    }
    panic!("the relay named no metrics address within 60 s");
}

fn changefeed(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(args)
        .env_remove("CHANGEFEED_URL")
        .stdin(Stdio::null())
        .output()
        .expect("the changefeed binary runs")
}

fn relay_child(url: &str, outbox: &str, brokers: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args([
            "relay",
            "--outbox",
            outbox,
            "--url",
            url,
            "--brokers",
            brokers,
        ])
        .args(["--metrics-addr", "127.0.0.1:0", "--ready-within", "3s"])
        .args(["--backlog-interval", "300ms", "--progress-interval", "1s"])
        .env_remove("CHANGEFEED_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the changefeed binary runs")
}

/// A relay of `outbox` to standard output with the metrics endpoint, its backlog read every
/// 300 ms: the process, the endpoint's address and the rest of its standard error (keep it:
/// dropped, it would close the pipe the relay writes its progress lines to).
fn stdout_relay(url: &str, outbox: &str) -> (Child, String, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["relay", "--outbox", outbox, "--url", url])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--backlog-interval",
            "300ms",
        ])
        .env_remove("CHANGEFEED_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the changefeed binary runs");
    let lines = stderr_lines(&mut child);
    let address = metrics_address(&lines);
    (child, address, lines)
}

/// A message held back as failed, due in an hour, enqueued 10 s ago: a backlog that stays
/// put until the test makes it due.
const HELD_ROW: &str = "insert into outbox_metrics (message_id, topic, payload, status, attempts, \
    next_retry_at, created_at) values ('held', 'orders', '{\"n\": 0}', 3, 1, \
    utc_timestamp(3) + interval 1 hour, utc_timestamp(3) - interval 10 second)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_scraped_relay_counts_publishes_shows_its_backlog_and_readiness_follows_the_database() {
    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).expect("rdkafka's mock cluster starts");
    cluster.create_topic("orders", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let server = OwnedServer::start("metrics");
    let db = common_mysql::database_on("live_metrics", |name| server.url_for(name)).await;
    db.outbox("outbox_metrics").await;
    db.sql(HELD_ROW).await;

    let mut child = relay_child(&db.url, "outbox_metrics", &brokers);
    let lines = stderr_lines(&mut child);
    let address = metrics_address(&lines);
    let gauge = |status: &str| {
        format!("changefeed_outbox_messages{{outbox=\"outbox_metrics\",status=\"{status}\"}}")
    };
    let published =
        "changefeed_relay_messages_published_total{outbox=\"outbox_metrics\",topic=\"orders\"}";

    // The held message shows as failed, and old; nothing is published yet.
    let text = scrape_until(
        &address,
        Duration::from_secs(30),
        "the backlog gauges",
        |t| sample(t, &gauge("failed")) == Some(1.0),
    )
    .await;
    assert_eq!(sample(&text, &gauge("pending")), Some(0.0), "{text}");
    assert_eq!(sample(&text, &gauge("dead")), Some(0.0), "{text}");
    let age = sample(
        &text,
        "changefeed_outbox_oldest_open_age_seconds{outbox=\"outbox_metrics\"}",
    )
    .unwrap();
    assert!((9.0..120.0).contains(&age), "oldest open age {age}");
    assert_eq!(sample(&text, published), None, "{text}");
    assert!(
        sample(
            &text,
            "changefeed_wake_following{outbox=\"outbox_metrics\",wake=\"binlog\"}"
        ) == Some(1.0),
        "{text}"
    );
    for line in [
        "# TYPE changefeed_relay_claim_duration_seconds histogram",
        "# TYPE changefeed_relay_messages_claimed_total counter",
        "# HELP changefeed_outbox_messages Messages in the outbox by status",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }

    // Five messages enqueued and the held one made due: the counters move, the backlog
    // empties.
    let messages: Vec<NewMessage> = (1..=5)
        .map(|n| NewMessage::new("orders", json!({ "n": n })).aggregate("order", n.to_string()))
        .collect();
    db.enqueue_committed("outbox_metrics", &messages).await;
    db.sql("update outbox_metrics set next_retry_at = utc_timestamp(3) where message_id = 'held'")
        .await;
    let text = scrape_until(
        &address,
        Duration::from_secs(60),
        "6 published, backlog 0",
        |t| {
            sample(t, published) == Some(6.0)
                && sample(t, &gauge("failed")) == Some(0.0)
                && sample(t, &gauge("pending")) == Some(0.0)
                && sample(
                    t,
                    "changefeed_outbox_oldest_open_age_seconds{outbox=\"outbox_metrics\"}",
                ) == Some(0.0)
        },
    )
    .await;
    let claimed = sample(
        &text,
        "changefeed_relay_messages_claimed_total{outbox=\"outbox_metrics\"}",
    )
    .unwrap();
    assert!(claimed >= 6.0, "{text}");
    assert!(
        sample(
            &text,
            "changefeed_relay_batch_messages_count{outbox=\"outbox_metrics\"}"
        )
        .unwrap()
            >= 1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "changefeed_ready"), Some(1.0), "{text}");

    // `changefeed status` shows the outbox, as a table and as JSON.
    let status = changefeed(&["status", "--url", &db.url]);
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(out.starts_with("outbox "), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("outbox_metrics ")),
        "{out}"
    );
    db.sql(HELD_ROW.replace("'held'", "'held2'").as_str()).await;
    let status = changefeed(&["status", "--json", "--url", &db.url]);
    assert!(status.status.success(), "{status:?}");
    let document: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let outbox = &document["outboxes"][0];
    assert_eq!(outbox["outbox"], "outbox_metrics", "{document}");
    assert_eq!(outbox["failed"], 1, "{document}");
    assert_eq!(outbox["pending"], 0, "{document}");
    assert!(
        outbox["oldest_open_age_seconds"].as_f64().unwrap() >= 9.0,
        "{document}"
    );

    // Ready; frozen: not ready within --ready-within and a claim's wait; thawed: ready again.
    readyz_until(&address, 200, Duration::from_secs(10)).await;
    server.freeze();
    let body = readyz_until(&address, 503, Duration::from_secs(30)).await;
    assert!(body.contains("--ready-within"), "{body}");
    let (health, _) = tokio::task::spawn_blocking({
        let address = address.clone();
        move || http_get(&address, "/healthz")
    })
    .await
    .unwrap();
    assert_eq!(health, 200, "the process runs while its database is frozen");
    server.thaw();
    readyz_until(&address, 200, Duration::from_secs(90)).await;

    stop_cleanly(child, libc::SIGINT).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_backlog_counts_by_status_from_index_entries_only() {
    let db = common_mysql::database("live_metrics_backlog").await;
    let mut store = db.outbox("outbox_backlog").await;
    // 4 pending, 2 processing, 3 failed, 1 dead, 5 done; the oldest open one a minute old.
    let mut values = Vec::new();
    for (status, count) in [(0, 4), (1, 2), (3, 3), (4, 1), (2, 5)] {
        for n in 0..count {
            values.push(format!(
                "('m-{status}-{n}', 't', '{{}}', {status}, utc_timestamp(3) - interval {} second)",
                if status == 0 && n == 0 { 60 } else { 1 }
            ));
        }
    }
    db.sql(&format!(
        "insert into outbox_backlog (message_id, topic, payload, status, created_at) values {}",
        values.join(", ")
    ))
    .await;
    let backlog = store.backlog().await.unwrap();
    assert_eq!(
        (
            backlog.pending,
            backlog.processing,
            backlog.failed,
            backlog.dead
        ),
        (4, 2, 3, 1)
    );
    let age = backlog.oldest_open_age.unwrap();
    assert!(
        (Duration::from_secs(59)..Duration::from_secs(120)).contains(&age),
        "{age:?}"
    );

    // The plan: every count an index-only range of done_by_processed_at, the oldest open
    // id straight from open_messages, the table itself read once by primary key.
    let table: changefeed::mysql::OutboxTable = "outbox_backlog".parse().unwrap();
    let query = changefeed::mysql::backlog_query(&table);
    let mut conn = db.conn().await;
    let plan: Vec<mysql_async::Row> = conn.query(format!("explain {query}")).await.unwrap();
    let column = |row: &mysql_async::Row, name: &str| -> String {
        let index = row
            .columns_ref()
            .iter()
            .position(|c| c.name_str() == name)
            .unwrap();
        row.get::<Option<String>, _>(index)
            .flatten()
            .unwrap_or_default()
    };
    let mut lines = Vec::new();
    for row in &plan {
        lines.push(format!(
            "{} {} key={} type={} extra={}",
            column(row, "select_type"),
            column(row, "table"),
            column(row, "key"),
            column(row, "type"),
            column(row, "Extra")
        ));
    }
    let text = lines.join("\n");
    println!("EXPLAIN of the backlog query:\n{text}");
    let counted = lines
        .iter()
        .filter(|l| l.contains("key=done_by_processed_at"))
        .count();
    assert_eq!(counted, 4, "one range per status:\n{text}");
    for line in lines
        .iter()
        .filter(|l| l.contains("key=done_by_processed_at"))
    {
        assert!(line.contains("Using index"), "index-only: {line}\n{text}");
        assert!(
            line.contains("type=ref") || line.contains("type=range"),
            "{line}"
        );
    }
    assert!(
        text.contains("Select tables optimized away"),
        "MIN(id) from the index's first entry:\n{text}"
    );
    for line in lines.iter().filter(|l| l.contains(" o ")) {
        assert!(
            line.contains("key=PRIMARY") && line.contains("type=const"),
            "{line}"
        );
    }
    // The only full scans are of the derived tables, each at most BACKLOG_COUNT_LIMIT rows
    // of one column: never of the outbox.
    for line in lines.iter().filter(|l| l.contains("type=ALL")) {
        assert!(
            line.contains("<derived"),
            "a full scan of the outbox: {line}\n{text}"
        );
    }
}

/// The same on SQL Server: `backlog` (V79) counts by status, `status --json` lists the
/// outbox with its held aggregates, and `relay --metrics-addr` exports the gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL"]
async fn sql_server_backlog_status_and_scraped_gauges() {
    use changefeed::outbox_store::OutboxStore;
    use common::{Isolation, TestDb, exec};

    let db = TestDb::create("metrics", Isolation::ReadCommittedSnapshot).await;
    let mut client = db.client().await;
    exec(
        &mut client,
        "create table dbo.anchor (id int primary key); \
         exec changefeed.setup_outbox @table_name = N'dbo.metrics_outbox';",
    )
    .await
    .unwrap();
    exec(
        &mut client,
        "insert into dbo.metrics_outbox (topic, payload, status, next_retry_at, created_at) \
         values (N'orders', N'{}', 0, null, dateadd(second, -60, sysutcdatetime())), \
                (N'orders', N'{}', 0, null, sysutcdatetime()), \
                (N'orders', N'{}', 3, dateadd(hour, 1, sysutcdatetime()), sysutcdatetime()), \
                (N'orders', N'{}', 4, null, sysutcdatetime()), \
                (N'orders', N'{}', 2, null, sysutcdatetime());",
    )
    .await
    .unwrap();
    let store = OutboxStore::new("dbo.metrics_outbox".parse().unwrap());
    let backlog = store.backlog(&mut client).await.unwrap();
    assert_eq!(
        (
            backlog.pending,
            backlog.processing,
            backlog.failed,
            backlog.dead
        ),
        (2, 0, 1, 1)
    );
    assert!(backlog.oldest_open_age.unwrap() >= Duration::from_secs(59));

    let status = changefeed(&["status", "--json", "--url", &db.ado()]);
    assert!(status.status.success(), "{status:?}");
    let document: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let outbox = document["outboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["outbox"] == "dbo.metrics_outbox")
        .unwrap_or_else(|| panic!("{document}"));
    assert_eq!(outbox["pending"], 2, "{document}");
    assert_eq!(outbox["dead"], 1, "{document}");
    assert!(outbox["held_aggregates"].is_array(), "{document}");

    // The relay to standard output, scraped: it publishes the two pending messages.
    let (child, address, _stderr) = stdout_relay(&db.ado(), "dbo.metrics_outbox");
    scrape_until(&address, Duration::from_secs(60), "2 published, none pending", |t| {
        sample(
            t,
            "changefeed_relay_messages_published_total{outbox=\"dbo.metrics_outbox\",topic=\"orders\"}",
        ) == Some(2.0)
            && sample(
                t,
                "changefeed_outbox_messages{outbox=\"dbo.metrics_outbox\",status=\"pending\"}",
            ) == Some(0.0)
    })
    .await;
    readyz_until(&address, 200, Duration::from_secs(10)).await;
    stop_cleanly(child, libc::SIGTERM).await;
    db.drop_database().await;
}

/// A relay on PostgreSQL reads the backlog into its gauges, as on the other stores: two
/// pending messages published, one failed due in an hour, one dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn postgres_backlog_gauges_of_a_scraped_relay() {
    let db = common_postgres::database("metrics_backlog").await;
    db.outbox("public.metrics_outbox").await;
    db.sql(
        "insert into public.metrics_outbox (message_id, topic, payload, status, next_retry_at, \
             created_at) values \
         ('p1', 'orders', '{}', 0, null, now() - interval '1 minute'), \
         ('p2', 'orders', '{}', 0, null, now()), \
         ('f1', 'orders', '{}', 3, now() + interval '1 hour', now()), \
         ('d1', 'orders', '{}', 4, null, now())",
    )
    .await;
    let (child, address, _stderr) = stdout_relay(&db.url, "public.metrics_outbox");
    let gauge = |text: &str, status: &str| {
        sample(
            text,
            &format!(
                "changefeed_outbox_messages{{outbox=\"public.metrics_outbox\",status=\"{status}\"}}"
            ),
        )
    };
    scrape_until(
        &address,
        Duration::from_secs(60),
        "2 published; the gauges: none pending, 1 failed, 1 dead",
        |t| {
            sample(
                t,
                "changefeed_relay_messages_published_total{outbox=\"public.metrics_outbox\",topic=\"orders\"}",
            ) == Some(2.0)
                && gauge(t, "pending") == Some(0.0)
                && gauge(t, "processing") == Some(0.0)
                && gauge(t, "failed") == Some(1.0)
                && gauge(t, "dead") == Some(1.0)
        },
    )
    .await;
    stop_cleanly(child, libc::SIGTERM).await;
}

/// The relay's open file descriptors.
fn open_fds(child: &Child) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", child.id())).map_or(0, Iterator::count)
}

/// A flood of idle connections and a client that trickles a request that never ends, on
/// the metrics endpoint of a running relay: the endpoint holds at most its 64 connections
/// (the rest wait in the listener's backlog), so the relay keeps the descriptors its own
/// connections need and publishes what is enqueued meanwhile; once the flood goes, a
/// scrape is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_flood_on_the_metrics_endpoint_leaves_the_relay_running() {
    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).expect("rdkafka's mock cluster starts");
    cluster.create_topic("orders", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let server = OwnedServer::start("metrics_flood");
    let db = common_mysql::database_on("metrics_flood", |name| server.url_for(name)).await;
    db.outbox("outbox_flood").await;
    let mut child = relay_child(&db.url, "outbox_flood", &brokers);
    let lines = stderr_lines(&mut child);
    let address = metrics_address(&lines);
    readyz_until(&address, 200, Duration::from_secs(30)).await;
    let before = open_fds(&child);

    let flood = 64 + 100;
    let mut idle = Vec::new();
    for _ in 0..flood {
        idle.push(TcpStream::connect(&address).expect("the backlog takes it"));
    }
    let mut slow = TcpStream::connect(&address).unwrap();
    let trickle = std::thread::spawn(move || {
        for byte in b"GET /metrics HTTP/1.1\r\nX: ".iter().cycle().take(100) {
            if slow.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = open_fds(&child).saturating_sub(before);
    assert!(
        held <= 64 + 16,
        "the relay holds {held} more descriptors under the flood"
    );

    let messages: Vec<NewMessage> = (1..=5)
        .map(|n| NewMessage::new("orders", json!({ "n": n })).aggregate("order", n.to_string()))
        .collect();
    db.enqueue_committed("outbox_flood", &messages).await;
    let published = db
        .count_reaches("outbox_flood", "status = 2", 5, Duration::from_secs(30))
        .await;
    assert!(published, "the relay publishes under the flood");

    drop(idle);
    let _ = tokio::task::spawn_blocking(move || trickle.join()).await;
    let (status, text) = tokio::task::spawn_blocking({
        let address = address.clone();
        move || http_get(&address, "/metrics")
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{text}");
    stop_cleanly(child, libc::SIGTERM).await;
    drop(cluster);
}

/// Sends `signal_number` to the CLI process and expects it to exit with status 0 within a
/// minute (its stderr in the failure message).
async fn stop_cleanly(child: std::process::Child, signal_number: i32) {
    signal(&child, signal_number);
    let (status, stderr) =
        tokio::task::spawn_blocking(move || wait_for_exit(child, Duration::from_secs(60)))
            .await
            .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
}
