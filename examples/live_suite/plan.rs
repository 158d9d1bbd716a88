//! What the live-suite runner does, apart from running it: its command line, the two
//! commands it runs, and how their outcomes and the harness' report become the table's
//! rows and the exit status. No server and no process here, so `tests/suite_report.rs`
//! tests all of it.

use std::time::Duration;

use crate::report::Record;

/// The variable naming the server: the live tests' own (tests/common/mod.rs).
pub const SERVER_VARIABLE: &str = "CHANGEFEED_TEST_MSSQL";

/// `--help`.
pub const HELP: &str = "\
changefeed live suite: the one command for a reviewer with Docker (or a SQL Server).

USAGE:
    cargo run --example live_suite
    cargo run --example live_suite -- --report <FILE>

It uses the SQL Server named by $CHANGEFEED_TEST_MSSQL (an ADO.NET connection string whose
login may create databases and logins), or starts SQL Server 2022 with testcontainers (a
Docker engine is needed; the first run pulls the image) and removes it at the end. Then it
runs
    1. every live test, each scenario with READ_COMMITTED_SNAPSHOT off and on, the upgrade
       test included:  cargo test --features cli -- --ignored
    2. the quick benchmark:  cargo run --release --example bench -- --quick --url <server>
       --json <file>
and prints one table: scenario, RCSI, result, time. Both commands print their own output
as they go.

With --report FILE it runs nothing and prints the table of a report the live tests wrote
(cargo test -- --ignored with $CHANGEFEED_LIVE_REPORT=FILE), as CI does.

EXIT STATUS:
    0 everything passed; 1 something failed (the table says what) or the report cannot be
    read; 2 no SQL Server (neither $CHANGEFEED_TEST_MSSQL nor a Docker engine) or a bad
    argument; 130 interrupted.
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Print [`HELP`].
    Help,
    /// Run the suite.
    Run,
    /// Print the table of this report file and exit.
    Report(String),
}

/// Parses the arguments after the program name: none, `--report FILE`, or `-h`/`--help`.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut command = Command::Run;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--report" => match args.next() {
                Some(file) if !file.is_empty() => command = Command::Report(file),
                _ => return Err("--report needs a file name (see --help)".to_owned()),
            },
            other => {
                return Err(format!(
                    "unknown argument {other:?}: live_suite takes --report FILE or nothing \
                     (see --help)"
                ));
            }
        }
    }
    Ok(command)
}

/// The one line printed (then exit 2) when there is no server: what to set or start.
pub fn no_server_line(reason: &str) -> String {
    format!(
        "live_suite: needs a SQL Server: set {SERVER_VARIABLE} to an ADO.NET connection string \
         (server=tcp:host,1433;user=sa;password=...;TrustServerCertificate=true) or start a \
         Docker engine so that testcontainers can start SQL Server 2022 ({})",
        reason.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

/// `cargo` arguments of step 1: every SQL Server live test (README's live-test command;
/// without the `mysql` feature, so the MariaDB tests, which need a MariaDB, are not built).
pub fn test_arguments() -> Vec<String> {
    ["test", "--features", "cli", "--", "--ignored"]
        .map(str::to_owned)
        .to_vec()
}

/// `cargo` arguments of step 2: the quick benchmark against `ado`, writing `json`.
pub fn bench_arguments(ado: &str, json: &str) -> Vec<String> {
    [
        "run",
        "--release",
        "--example",
        "bench",
        "--",
        "--quick",
        "--url",
        ado,
        "--json",
        json,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// How a step (a child process) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Its exit code; `None` when it was killed by a signal or could not start.
    pub code: Option<i32>,
    /// Why it could not start, if it could not.
    pub error: Option<String>,
    /// How long it ran.
    pub duration: Duration,
}

impl Step {
    /// Whether it exited 0.
    pub fn passed(&self) -> bool {
        self.code == Some(0)
    }

    fn failure(&self) -> String {
        match (&self.error, self.code) {
            (Some(error), _) => format!("could not run: {error}"),
            (None, Some(code)) => format!("exit status {code}"),
            (None, None) => "killed by a signal".to_owned(),
        }
    }
}

/// The scenario shown for the test step itself when it failed outside any scenario.
pub const TESTS_ROW: &str = "cargo test --features cli -- --ignored";
/// The benchmark's row.
pub const BENCH_ROW: &str = "bench --quick";

/// The table's rows: the harness' records sorted by scenario (RCSI off before on), then a
/// row for the test step when it failed but no scenario did (the build, or a test outside
/// the harness) or when no scenario reported at all, then the benchmark's row (it runs
/// with READ_COMMITTED_SNAPSHOT off, the bench's default).
pub fn rows(mut records: Vec<Record>, tests: &Step, bench: &Step) -> Vec<Record> {
    records.sort_by(|a, b| (&a.scenario, a.rcsi).cmp(&(&b.scenario, b.rcsi)));
    let any_failed = records.iter().any(|r| !r.is_passed());
    if !tests.passed() && !any_failed {
        records.push(Record::failed(
            TESTS_ROW,
            None,
            tests.duration,
            &format!(
                "{}: the build or a test outside the scenario harness failed (see its output \
                 above)",
                tests.failure()
            ),
        ));
    } else if tests.passed() && records.is_empty() {
        records.push(Record::failed(
            TESTS_ROW,
            None,
            tests.duration,
            "passed, but no live scenario reported a result: were the live tests filtered out?",
        ));
    }
    records.push(if bench.passed() {
        Record::passed(BENCH_ROW, Some(false), bench.duration)
    } else {
        Record::failed(BENCH_ROW, Some(false), bench.duration, &bench.failure())
    });
    records
}

/// The exit status of the runner for these rows: 0 when every row passed, else 1.
pub fn exit_code(rows: &[Record]) -> u8 {
    if rows.iter().all(Record::is_passed) {
        0
    } else {
        1
    }
}
