//! The live-suite runner (`cargo run --example live_suite`) without a server: the report
//! lines the harness writes and the runner reads, the summary table, which rows and exit
//! status the runner makes of its steps, and, as a process, its one line and exit status 2
//! when there is neither `CHANGEFEED_TEST_MSSQL` nor a Docker engine. The example's modules
//! are included by path, as `tests/bench_stats.rs` does for the benchmark.

#[allow(dead_code)]
#[path = "../examples/live_suite/report.rs"]
mod report;

#[allow(dead_code)]
#[path = "../examples/live_suite/plan.rs"]
mod plan;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use plan::{BENCH_ROW, Step, TESTS_ROW};
use report::{Record, parse_report, table};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn step(code: Option<i32>, seconds: u64) -> Step {
    Step {
        code,
        error: None,
        duration: Duration::from_secs(seconds),
    }
}

// ------------------------------------------------------------------------------------------
// Report lines
// ------------------------------------------------------------------------------------------

#[test]
fn records_round_trip_through_their_line() {
    let records = [
        Record::passed("live_reader::a_reader_never_skips", Some(false), ms(1234)),
        Record::passed("live_reader::a_reader_never_skips", Some(true), ms(0)),
        Record::failed(
            "live_upgrade::an_older_release_upgrades",
            Some(true),
            ms(98_765),
            "assertion `left == right` failed: shard 0",
        ),
        Record::passed("bench --quick", None, ms(5)),
    ];
    for record in &records {
        let line = record.to_line();
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line:?}"
        );
        let parsed = Record::parse(line.trim_end_matches('\n')).expect("a line the harness wrote");
        assert_eq!(&parsed, record, "{line:?}");
    }
}

#[test]
fn a_multi_line_panic_message_stays_on_one_line_and_is_shortened() {
    let message = format!("first line\n\tsecond\tline\r\n{}", "x".repeat(1000));
    let record = Record::failed("t::s", Some(false), ms(7), &message);
    let line = record.to_line();
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    assert_eq!(line.matches('\t').count(), 4, "five fields: {line:?}");
    let failure = record.failure.as_deref().unwrap();
    assert!(failure.starts_with("first line  second line"), "{failure}");
    assert!(
        failure.ends_with("...") && failure.chars().count() == 303,
        "{failure}"
    );
    assert_eq!(Record::parse(line.trim_end()).unwrap(), record);
}

#[test]
fn a_whole_report_parses_in_order_and_skips_blank_lines() {
    let text = "a::x\toff\tpassed\t10\t\n\nb::y\ton\tfailed\t20\tboom\n";
    let records = parse_report(text).unwrap();
    assert_eq!(
        records,
        [
            Record::passed("a::x", Some(false), ms(10)),
            Record::failed("b::y", Some(true), ms(20), "boom"),
        ]
    );
}

#[test]
fn a_damaged_report_names_the_line_and_the_problem() {
    let cases = [
        (
            "a\toff\tpassed\t10\t\nb\toff\tpassed\n",
            "line 2",
            "5 tab-separated fields",
        ),
        ("a\tmaybe\tpassed\t10\t\n", "line 1", "rcsi is \"maybe\""),
        ("a\toff\tskipped\t10\t\n", "line 1", "result is \"skipped\""),
        (
            "a\toff\tpassed\tten\t\n",
            "line 1",
            "not a number of milliseconds",
        ),
        (
            "a\toff\tpassed\t10\tbut why\n",
            "line 1",
            "passed record carries a failure",
        ),
        ("\toff\tpassed\t10\t\n", "line 1", "scenario is empty"),
    ];
    for (text, line, problem) in cases {
        let error = parse_report(text).expect_err(text);
        assert!(
            error.contains(line) && error.contains(problem),
            "{text:?}: {error}"
        );
    }
}

#[test]
fn records_append_to_the_report_file_one_line_each() {
    let path = std::env::temp_dir().join(format!(
        "changefeed-suite-report-{}.tsv",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let first = Record::passed("a::x", Some(false), ms(1));
    let second = Record::failed("a::x", Some(true), ms(2), "no\nway");
    report::append(&path, &first).unwrap();
    report::append(&path, &second).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(parse_report(&text).unwrap(), [first, second]);
}

#[test]
fn a_panic_payload_becomes_its_message() {
    let owned = std::panic::catch_unwind(|| panic!("owned {}", 42)).unwrap_err();
    assert_eq!(report::panic_message(owned.as_ref()), "owned 42");
    let literal = std::panic::catch_unwind(|| panic!("literal")).unwrap_err();
    assert_eq!(report::panic_message(literal.as_ref()), "literal");
    let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
    assert_eq!(
        report::panic_message(other.as_ref()),
        "panicked with a non-text payload"
    );
}

// ------------------------------------------------------------------------------------------
// The table
// ------------------------------------------------------------------------------------------

#[test]
fn the_table_aligns_its_columns_and_counts_and_lists_failures() {
    let records = [
        Record::passed("live_reader::short", Some(false), ms(1500)),
        Record::failed(
            "live_reader::a_much_longer_name",
            Some(true),
            ms(61_000),
            "boom",
        ),
        Record::passed("bench --quick", None, ms(100)),
    ];
    let text = table(&records);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "scenario                         RCSI  result    time",
            "-------------------------------  ----  ------  ------",
            "live_reader::short               off   passed   1.5 s",
            "live_reader::a_much_longer_name  on    FAILED  61.0 s",
            "bench --quick                    -     passed   0.1 s",
            "3 runs: 2 passed, 1 failed (62.6 s in all)",
            "FAILED live_reader::a_much_longer_name (RCSI on): boom",
        ]
    );
}

#[test]
fn an_empty_table_still_has_its_header_and_count() {
    let text = table(&[]);
    assert!(text.starts_with("scenario  RCSI  result  time\n"), "{text}");
    assert!(text.contains("0 runs: 0 passed, 0 failed"), "{text}");
}

// ------------------------------------------------------------------------------------------
// Rows and exit status
// ------------------------------------------------------------------------------------------

#[test]
fn scenarios_are_sorted_with_rcsi_off_first_and_the_bench_last() {
    let records = vec![
        Record::passed("b::two", Some(true), ms(1)),
        Record::passed("a::one", Some(true), ms(1)),
        Record::passed("b::two", Some(false), ms(1)),
        Record::passed("a::one", Some(false), ms(1)),
    ];
    let rows = plan::rows(records, &step(Some(0), 10), &step(Some(0), 3));
    let order: Vec<(&str, Option<bool>)> =
        rows.iter().map(|r| (r.scenario.as_str(), r.rcsi)).collect();
    assert_eq!(
        order,
        [
            ("a::one", Some(false)),
            ("a::one", Some(true)),
            ("b::two", Some(false)),
            ("b::two", Some(true)),
            (BENCH_ROW, Some(false)),
        ]
    );
    assert_eq!(plan::exit_code(&rows), 0);
}

#[test]
fn a_failed_scenario_fails_the_run_without_an_extra_row() {
    let records = vec![
        Record::passed("a::one", Some(false), ms(1)),
        Record::failed("a::one", Some(true), ms(1), "boom"),
    ];
    let rows = plan::rows(records, &step(Some(101), 10), &step(Some(0), 3));
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows.iter().all(|r| r.scenario != TESTS_ROW), "{rows:?}");
    assert_eq!(plan::exit_code(&rows), 1);
}

#[test]
fn a_test_step_that_failed_outside_the_scenarios_gets_a_row_of_its_own() {
    let records = vec![Record::passed("a::one", Some(false), ms(1))];
    let rows = plan::rows(records, &step(Some(101), 10), &step(Some(0), 3));
    let row = rows
        .iter()
        .find(|r| r.scenario == TESTS_ROW)
        .expect("a row for cargo test");
    assert!(
        row.failure.as_deref().unwrap().contains("exit status 101"),
        "{row:?}"
    );
    assert_eq!(plan::exit_code(&rows), 1);

    let killed = plan::rows(Vec::new(), &step(None, 1), &step(Some(0), 3));
    assert!(
        killed[0]
            .failure
            .as_deref()
            .unwrap()
            .contains("killed by a signal"),
        "{killed:?}"
    );
    let unstartable = Step {
        code: None,
        error: Some("cargo: not found".to_owned()),
        duration: ms(0),
    };
    let rows = plan::rows(Vec::new(), &unstartable, &step(Some(0), 3));
    assert!(
        rows[0]
            .failure
            .as_deref()
            .unwrap()
            .contains("could not run: cargo: not found"),
        "{rows:?}"
    );
}

#[test]
fn a_test_step_that_reported_no_scenario_is_a_failure() {
    let rows = plan::rows(Vec::new(), &step(Some(0), 10), &step(Some(0), 3));
    assert_eq!(rows[0].scenario, TESTS_ROW);
    assert!(
        rows[0]
            .failure
            .as_deref()
            .unwrap()
            .contains("no live scenario"),
        "{rows:?}"
    );
    assert_eq!(plan::exit_code(&rows), 1);
}

#[test]
fn a_failed_benchmark_fails_the_run() {
    let records = vec![Record::passed("a::one", Some(false), ms(1))];
    let rows = plan::rows(records, &step(Some(0), 10), &step(Some(2), 3));
    let bench = rows.last().unwrap();
    assert_eq!(bench.scenario, BENCH_ROW);
    assert_eq!(bench.failure.as_deref(), Some("exit status 2"));
    assert_eq!(plan::exit_code(&rows), 1);
}

// ------------------------------------------------------------------------------------------
// The command line and the commands it runs
// ------------------------------------------------------------------------------------------

#[test]
fn the_command_line_takes_help_and_nothing_else() {
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(plan::parse(args(&[])), Ok(plan::Command::Run));
    assert_eq!(plan::parse(args(&["--help"])), Ok(plan::Command::Help));
    assert_eq!(plan::parse(args(&["-h"])), Ok(plan::Command::Help));
    assert_eq!(
        plan::parse(args(&["--report", "r.tsv"])),
        Ok(plan::Command::Report("r.tsv".to_owned()))
    );
    let error = plan::parse(args(&["--report"])).unwrap_err();
    assert!(error.contains("--report needs a file name"), "{error}");
    let error = plan::parse(args(&["--quick"])).unwrap_err();
    assert!(
        error.contains("\"--quick\"") && error.contains("--help"),
        "{error}"
    );
}

#[test]
fn the_steps_are_readmes_live_command_and_the_quick_bench() {
    assert_eq!(
        plan::test_arguments().join(" "),
        "test --features cli -- --ignored"
    );
    assert_eq!(
        plan::bench_arguments("server=tcp:h,1;user=sa", "/tmp/b.json").join(" "),
        "run --release --example bench -- --quick --url server=tcp:h,1;user=sa --json /tmp/b.json"
    );
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    assert!(
        readme.contains("cargo run --example live_suite"),
        "README's live-test section gives the one command"
    );
}

#[test]
fn the_no_server_line_says_what_to_set_and_what_to_start() {
    let line = plan::no_server_line("Socket not found:\n /var/run/docker.sock");
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains("CHANGEFEED_TEST_MSSQL") && line.contains("Docker"),
        "{line}"
    );
    assert!(
        line.ends_with("(Socket not found: /var/run/docker.sock)"),
        "{line}"
    );
}

// ------------------------------------------------------------------------------------------
// The runner as a process, without a server
// ------------------------------------------------------------------------------------------

/// The example's binary, next to this test's directory (`target/<profile>/examples/`).
/// `cargo test` builds every example along with the tests, so it is normally there and up
/// to date; when this test was built alone (`cargo test --test suite_report`) and the binary
/// is missing or older than its sources, it is built here. (Not always: `cargo build
/// --example` resolves the dev-dependencies' features apart from `cargo test`, so each
/// would rebuild what the other built.)
fn live_suite_binary() -> PathBuf {
    // Found or built once per test process, however many tests ask.
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINARY.get_or_init(find_or_build_live_suite).clone()
}

fn find_or_build_live_suite() -> PathBuf {
    let deps = std::env::current_exe().expect("the test binary's path");
    let profile_dir = deps
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("live_suite{}", std::env::consts::EXE_SUFFIX));
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = [
        "examples/live_suite.rs",
        "examples/live_suite",
        "examples/support",
        "src",
    ]
    .iter()
    .map(|path| newest_change(&root.join(path)))
    .max()
    .flatten();
    if built.is_none() || built < sources {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet", "--example", "live_suite"])
            .current_dir(root);
        if cfg!(feature = "cli") {
            build.args(["--features", "cli"]);
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build --example live_suite failed");
    }
    binary
}

/// The latest modification time of `path` or of any file below it.
fn newest_change(path: &std::path::Path) -> Option<std::time::SystemTime> {
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_dir() {
        return metadata.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| newest_change(&entry.path()))
        .max()
}

#[test]
fn without_a_server_or_docker_it_says_what_is_needed_in_one_line_and_exits_2() {
    // DOCKER_HOST pointing at a socket that cannot exist makes "no Docker engine" certain on
    // any machine, one with Docker included.
    let output = Command::new(live_suite_binary())
        .env_remove("CHANGEFEED_TEST_MSSQL")
        .env_remove("RUST_BACKTRACE")
        .env(
            "DOCKER_HOST",
            "unix:///nonexistent/changefeed-live-suite/docker.sock",
        )
        .output()
        .expect("the live_suite example runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(lines.len(), 1, "one line on stderr, got {lines:#?}");
    assert!(
        lines[0].starts_with("live_suite: needs a SQL Server: set CHANGEFEED_TEST_MSSQL"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("Docker engine"), "{}", lines[0]);
    assert!(output.stdout.is_empty(), "nothing on stdout: {output:?}");
}

#[test]
fn report_prints_the_table_of_a_report_file_and_exits_by_its_results() {
    let path =
        std::env::temp_dir().join(format!("changefeed-suite-table-{}.tsv", std::process::id()));
    let run = |records: &[Record]| {
        let _ = std::fs::remove_file(&path);
        for record in records {
            report::append(&path, record).unwrap();
        }
        Command::new(live_suite_binary())
            .arg("--report")
            .arg(&path)
            .output()
            .expect("the live_suite example runs")
    };
    let passed = Record::passed("a::x", Some(false), ms(1500));
    let output = run(std::slice::from_ref(&passed));
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        table(std::slice::from_ref(&passed))
    );

    let failed = Record::failed("a::x", Some(true), ms(10), "boom");
    let output = run(&[passed.clone(), failed.clone()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        table(&[passed, failed])
    );

    std::fs::remove_file(&path).unwrap();
    let output = Command::new(live_suite_binary())
        .arg("--report")
        .arg(&path)
        .output()
        .expect("the live_suite example runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "a missing report: {output:?}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot read the live report"),
        "{output:?}"
    );

    std::fs::write(&path, "not a report\n").unwrap();
    let output = Command::new(live_suite_binary())
        .arg("--report")
        .arg(&path)
        .output()
        .expect("the live_suite example runs");
    std::fs::remove_file(&path).unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("report line 1"),
        "{output:?}"
    );
}

#[test]
fn help_exits_0_and_names_both_steps() {
    let output = Command::new(live_suite_binary())
        .arg("--help")
        .output()
        .expect("the live_suite example runs");
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("cargo test --features cli -- --ignored") && help.contains("--quick"),
        "{help}"
    );
}
