//! The `changefeed` command-line tool, run as a process without a server: help, the
//! one-line errors, and arguments refused before any connection.
//!
//! The binary needs the `cli` feature (`cargo test --all-features`).
#![cfg(feature = "cli")]

mod common_process;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common_process::{assert_one_error_line, changefeed};

/// An address where nothing listens: connecting is refused at once.
const UNREACHABLE: &str = "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true";

/// The subcommands whose help these tests check (`export`'s is checked with Kafka's
/// options in `tests/cli_kafka.rs`).
const SUBCOMMANDS: [&str; 7] = [
    "migrate",
    "setup-feed",
    "tail",
    "status",
    "purge",
    "purge-outbox",
    "relay",
];

/// The `--help` text of `changefeed <args> --help`, which must succeed.
fn help(args: &[&str]) -> String {
    let mut args = args.to_vec();
    args.push("--help");
    let output = changefeed(&args);
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn help_lists_every_subcommand() {
    let help = help(&[]);
    for command in SUBCOMMANDS {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "{command} missing from:\n{help}"
        );
    }
    assert!(
        help.contains("--url") && help.contains("CHANGEFEED_URL"),
        "{help}"
    );
}

#[test]
fn every_subcommand_has_help() {
    for command in SUBCOMMANDS {
        assert!(help(&[command]).contains("Usage: changefeed"), "{command}");
    }
}

#[test]
fn the_help_never_shows_the_connection_string() {
    let output = Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["status", "--help"])
        .env(
            "CHANGEFEED_URL",
            "server=tcp:db,1433;user=sa;password=hunter2",
        )
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(!String::from_utf8_lossy(&output.stdout).contains("hunter2"));
}

#[test]
fn status_without_a_url_says_what_to_set() {
    let output = changefeed(&["status"]);
    let line = assert_one_error_line(&output);
    assert!(line.contains("CHANGEFEED_URL"), "{line}");
    assert!(
        line.starts_with("error: CHANGEFEED_URL is not set"),
        "{line}"
    );
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn an_unreachable_server_is_one_line_naming_the_address_fast() {
    let started = Instant::now();
    let output = changefeed(&["status", "--url", UNREACHABLE]);
    let elapsed = started.elapsed();
    let line = assert_one_error_line(&output);
    assert!(line.contains("127.0.0.1:1"), "{line}");
    assert!(
        line.contains("--url") && line.contains("CHANGEFEED_URL"),
        "{line}"
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

/// With `--log-format json` the final error is one JSON object on one line (what a log
/// shipper parses), carrying the same message and fix as the human line.
#[test]
fn with_json_logs_a_failure_is_one_json_object() {
    let kafka = [
        "export",
        "app.Event",
        "--brokers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--consumer",
        "c",
        "--broker-timeout",
        "1s",
        "--url",
        UNREACHABLE,
    ];
    let mysql = [
        "relay",
        "--outbox",
        "outbox",
        "--url",
        "mysql://u@127.0.0.1:1/db",
    ];
    // The other stores and Kafka are features of their own; without them the tool says so
    // in a line that names no address.
    let lines = [&["relay", "--outbox", "dbo.outbox", "--url", UNREACHABLE][..]]
        .into_iter()
        .chain(cfg!(feature = "mysql").then_some(&mysql[..]))
        .chain(cfg!(feature = "kafka").then_some(&kafka[..]));
    for args in lines {
        let mut json = args.to_vec();
        json.extend(["--log-format", "json"]);
        let output = changefeed(&json);
        assert!(!output.status.success(), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, got {lines:#?}");
        let line: serde_json::Value = serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", lines[0]));
        assert_eq!(line["level"], "ERROR", "{line}");
        assert_eq!(line["target"], "changefeed", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
        let message = line["message"].as_str().expect("a message");
        // The same words the human format prints after `error: `.
        let human = assert_one_error_line(&changefeed(args));
        assert_eq!(Some(message), human.strip_prefix("error: "), "{args:?}");
        assert!(message.contains("127.0.0.1:1"), "{message}");
    }
}

#[test]
fn every_command_fails_the_same_way_without_a_server() {
    for args in [
        &["setup-feed", "app.Event", "--outbox"][..],
        &["tail", "app.Event"],
        &["status", "--consumers"],
        &["purge", "app.Event", "--older-than", "30d"],
        &["purge-outbox", "dbo.outbox", "--older-than", "7d"],
    ] {
        let mut with_url = args.to_vec();
        with_url.extend(["--url", UNREACHABLE]);
        let line = assert_one_error_line(&changefeed(&with_url));
        assert!(line.contains("127.0.0.1:1"), "{args:?}: {line}");
        let line = assert_one_error_line(&changefeed(args));
        assert!(
            line.contains("CHANGEFEED_URL is not set"),
            "{args:?}: {line}"
        );
    }
}

/// Refused with one line, exit status 2, before connecting: the URL points nowhere
/// reachable, so a connection attempt would show in the message.
fn assert_refused(args: &[&str], expect: &str) {
    let mut with_url = args.to_vec();
    with_url.extend(["--url", UNREACHABLE]);
    let output = changefeed(&with_url);
    let line = assert_one_error_line(&output);
    assert!(line.contains(expect), "{args:?}: {line}");
    assert!(!line.contains("127.0.0.1"), "{args:?} connected: {line}");
    assert_eq!(output.status.code(), Some(2), "{args:?}");
}

#[test]
fn postgres_only_setup_feed_options_are_refused_on_sql_server_by_name() {
    assert_refused(
        &[
            "setup-feed",
            "app.Event",
            "--outbox",
            "--shard-column",
            "S",
            "--shards",
            "4",
        ],
        "--shards is for PostgreSQL",
    );
    assert_refused(
        &["setup-feed", "app.Event", "--outbox", "--shard-column", "S"],
        "--shard-column with --outbox is for PostgreSQL",
    );
}

/// With a postgres:// URL that points nowhere, the feed commands try PostgreSQL and say so
/// in one line naming the address (exit 2); without the feature they say how to build it.
#[test]
fn feed_commands_take_a_postgres_url() {
    const NOWHERE: &str = "postgres://app@127.0.0.1:1/app";
    for args in [
        &["migrate"][..],
        &["setup-feed", "app.Event", "--outbox"],
        &["status", "--consumers"],
        &["purge", "app.Event", "--older-than", "30d"],
    ] {
        let mut with_url = args.to_vec();
        with_url.extend(["--url", NOWHERE]);
        let output = changefeed(&with_url);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
        if cfg!(feature = "postgres") {
            assert!(
                line.contains("cannot connect to PostgreSQL at 127.0.0.1"),
                "{args:?}: {line}"
            );
        } else {
            assert!(line.contains("--features cli,postgres"), "{args:?}: {line}");
        }
    }
}

#[test]
fn bad_feed_names_are_refused_before_connecting() {
    assert_refused(&["tail", "dbo.x]; drop table y"], "']'");
    assert_refused(&["setup-feed", "dbo.x'; --", "--outbox"], "invalid value");
    assert_refused(&["purge", "x", "--older-than", "30d"], "schema.table");
    assert_refused(
        &["purge-outbox", "a.b.c", "--older-than", "7d"],
        "schema.table",
    );
}

#[test]
fn a_blank_url_counts_as_none() {
    let output = changefeed(&["status", "--url", " "]);
    let line = assert_one_error_line(&output);
    assert!(line.contains("CHANGEFEED_URL is not set"), "{line}");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn bad_from_values_are_refused_before_connecting() {
    for from in [
        "yesterday",
        "01HX5Z8N3C",
        "2024-05-01",
        "2024-05-01 12:00:00",
        "81HX5Z8N3C0000000000000000",
    ] {
        assert_refused(&["tail", "app.Event", "--from", from], "RFC 3339");
    }
}

#[test]
fn bad_durations_are_refused_before_connecting() {
    for duration in [
        "30",
        "30x",
        "-5d",
        "1.5h",
        "",
        "99999999999999999999d",
        "36526d",
    ] {
        assert_refused(
            &["purge", "app.Event", "--older-than", duration],
            "--older-than",
        );
        assert_refused(
            &["purge-outbox", "dbo.outbox", "--older-than", duration],
            "--older-than",
        );
    }
}

/// A listener on a free localhost port whose connections the kernel accepts and nobody
/// answers (unless the test does): the listener, its port and a URL for it.
fn silent_server() -> (std::net::TcpListener, u16, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("server=tcp:127.0.0.1,{port};user=sa;password=x;TrustServerCertificate=true");
    (listener, port, url)
}

/// What `changefeed status --connect-timeout <timeout>` did against a [`silent_server`].
struct SilentRun {
    /// The silent server's port.
    port: u16,
    output: Output,
    /// Its one error line.
    line: String,
    /// How long the tool took to give up.
    elapsed: Duration,
}

/// Runs `changefeed status --connect-timeout <connect_timeout>` against a silent server
/// (listening until the tool has ended): it must end with one error line.
fn status_against_a_silent_server(connect_timeout: &str) -> SilentRun {
    let (listener, port, url) = silent_server();
    let started = Instant::now();
    let output = changefeed(&[
        "status",
        "--url",
        &url,
        "--connect-timeout",
        connect_timeout,
    ]);
    let elapsed = started.elapsed();
    drop(listener);
    let line = assert_one_error_line(&output);
    SilentRun {
        port,
        output,
        line,
        elapsed,
    }
}

/// A listener that accepts TCP connections and never answers: the tool must give up after
/// `--connect-timeout` with one line, not hang.
#[test]
fn a_server_that_never_answers_times_out_with_one_line() {
    let SilentRun {
        port,
        output,
        line,
        elapsed,
    } = status_against_a_silent_server("500ms");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("500ms") && line.contains("--url"), "{line}");
    assert_eq!(output.status.code(), Some(2));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

/// A peer that hangs up at once (not SQL Server, or a server dropping the session).
#[test]
fn a_peer_that_hangs_up_is_one_line_naming_the_address() {
    let (listener, port, url) = silent_server();
    let closer = std::thread::spawn(move || {
        if let Ok((stream, _)) = listener.accept() {
            drop(stream);
        }
    });
    let output = changefeed(&["status", "--url", &url]);
    let line = assert_one_error_line(&output);
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(
        line.contains("--url") && line.contains("CHANGEFEED_URL"),
        "{line}"
    );
    assert_eq!(output.status.code(), Some(2));
    closer.join().unwrap();
}

/// A usage error is one line (clap's explanation without its usage block) naming what to
/// read, and a negative count says so.
#[test]
fn usage_errors_and_bad_counts_are_one_line() {
    assert_refused(
        &["tail", "app.Event", "--bogus"],
        "unexpected argument '--bogus' found; see changefeed tail --help",
    );
    assert_refused(&["purge", "app.Event"], "--older-than");
    assert_refused(&["frobnicate"], "unrecognized subcommand 'frobnicate'");
    for args in [
        &[
            "purge",
            "app.Event",
            "--older-than",
            "30d",
            "--max-rows",
            "-5",
        ][..],
        &[
            "purge-outbox",
            "dbo.outbox",
            "--older-than",
            "7d",
            "--max-rows",
            "-5",
        ],
        &["tail", "app.Event", "--page-size", "-5"],
    ] {
        assert_refused(args, "invalid value \"-5\"");
        assert_refused(args, "cannot be negative; give a whole number from 1 to");
    }
}

/// `--connect-timeout` above tiberius' own 15 s handshake bound is honoured: a server that
/// accepts the connection and never answers is waited for the whole 16 s, then named in
/// one line that says which setting to raise. (Takes 16 s.)
#[test]
fn a_connect_timeout_above_fifteen_seconds_is_honoured() {
    let SilentRun {
        port,
        output,
        line,
        elapsed,
    } = status_against_a_silent_server("16s");
    assert!(
        elapsed >= Duration::from_secs(16),
        "gave up after {elapsed:?}: {line}"
    );
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("within 16s"), "{line}");
    assert!(line.contains("--connect-timeout"), "{line}");
    assert!(!line.contains("Config::"), "{line}");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn relay_refuses_an_outbox_name_before_connecting() {
    // Without the feature, a mysql:// URL is refused for that first.
    let mysql = ("mysql://relay@127.0.0.1:1/app", "outbox`; drop table y");
    let cases = [(UNREACHABLE, "dbo.x]; drop table y")]
        .into_iter()
        .chain(cfg!(feature = "mysql").then_some(mysql));
    for (url, outbox) in cases {
        let started = Instant::now();
        let output = changefeed(&["relay", "--outbox", outbox, "--url", url]);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{line}");
        assert!(line.contains("invalid table name"), "{line}");
        assert!(started.elapsed() < Duration::from_secs(10), "{line}");
    }
}

/// A command given the URL of a store it does not work on is refused before anything
/// connects (the URLs point nowhere), with exit status 2 and a line naming the store and
/// the commands that store takes.
#[test]
fn a_feed_command_given_a_mariadb_url_names_the_commands_that_take_one() {
    for args in [
        &["setup-feed", "app.Event", "--outbox"][..],
        &["tail", "app.Event"],
        &["purge", "app.Event", "--older-than", "30d"],
    ] {
        let mut with_url = args.to_vec();
        with_url.extend(["--url", "mysql://app@127.0.0.1:1/app"]);
        let output = changefeed(&with_url);
        let line = assert_one_error_line(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
        assert!(
            line.starts_with(&format!(
                "error: {} does not work on MariaDB/MySQL (a mysql:// --url)",
                args[0]
            )),
            "{line}"
        );
        assert!(
            line.ends_with(
                "the commands for MariaDB/MySQL are migrate, status, purge-outbox, setup-outbox, \
                 relay"
            ),
            "{line}"
        );
    }
}

/// setup-outbox and purge-outbox take every store's URL: on SQL Server they check the name
/// before connecting, and with a postgres:// or mysql:// URL pointing nowhere they try that
/// store and say so (or, without its feature, how to build it).
#[test]
fn the_outbox_commands_take_every_stores_url() {
    assert_refused(&["setup-outbox", "dbo.x]; drop table y"], "']'");
    assert_refused(&["purge-outbox", "dbo.x]", "--older-than", "7d"], "']'");
    let output = changefeed(&[
        "setup-outbox",
        "public.outbox",
        "--native-json",
        "--url",
        "postgres://app@127.0.0.1:1/app",
    ]);
    let line = assert_one_error_line(&output);
    assert_eq!(output.status.code(), Some(2), "{line}");
    assert!(
        line.contains("--native-json is for SQL Server; on PostgreSQL"),
        "{line}"
    );
    for (url, outbox, store, feature) in [
        (
            "postgres://app@127.0.0.1:1/app",
            "public.outbox",
            "PostgreSQL",
            cfg!(feature = "postgres"),
        ),
        (
            "mysql://app@127.0.0.1:1/app",
            "outbox",
            "MariaDB/MySQL",
            cfg!(feature = "mysql"),
        ),
    ] {
        for args in [
            &["setup-outbox", outbox][..],
            &["purge-outbox", outbox, "--older-than", "7d"],
        ] {
            let mut with_url = args.to_vec();
            with_url.extend(["--url", url]);
            let output = changefeed(&with_url);
            let line = assert_one_error_line(&output);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {line}");
            if feature {
                assert!(
                    line.contains(&format!("cannot connect to {store} at 127.0.0.1")),
                    "{args:?}: {line}"
                );
            } else {
                assert!(line.contains("built without"), "{args:?}: {line}");
            }
        }
    }
}
