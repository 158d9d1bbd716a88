//! The one command for a reviewer with Docker and Rust and nothing else:
//!
//! ```sh
//! cargo run --example live_suite
//! ```
//!
//! starts SQL Server 2022 with testcontainers (or uses `CHANGEFEED_TEST_MSSQL`), runs every
//! live test — each scenario with READ_COMMITTED_SNAPSHOT off and on, the upgrade test
//! included — then the quick benchmark, and prints one table: scenario, RCSI, result, time.
//! It exits 0 when everything passed, 1 when something failed, and 2 with one line saying
//! what is needed when there is no server.
//!
//! The live tests run as `cargo test --features cli -- --ignored` with
//! `CHANGEFEED_TEST_MSSQL` pointing at the server and `CHANGEFEED_LIVE_REPORT` at a file
//! where the harness (`tests/common/mod.rs`) appends one line per scenario run, failures and
//! panics included; the runner reads it back for the table. What needs no server (the
//! command line, the report format, the table, the exit status) is unit-tested by
//! `tests/suite_report.rs`, which includes the modules below by path.

#[path = "support/container.rs"]
mod container;
#[path = "live_suite/plan.rs"]
mod plan;
// Shared with the harness, which writes the records this runner reads.
#[allow(dead_code)]
#[path = "live_suite/report.rs"]
mod report;

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use plan::{Command, SERVER_VARIABLE, Step};
use report::REPORT_VARIABLE;

/// How long a container we started may take to accept a login.
const LOGIN_LIMIT: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    match plan::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{}", plan::HELP);
            ExitCode::SUCCESS
        }
        Ok(Command::Run) => match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(run()),
            Err(error) => {
                eprintln!("live_suite: cannot start the tokio runtime: {error}");
                ExitCode::from(1)
            }
        },
        // Here the file was named: its absence is an error, not "no scenario ran".
        Ok(Command::Report(file)) => match std::fs::metadata(&file)
            .map_err(|error| format!("cannot read the live report {file}: {error}"))
            .and_then(|_| read_report(Path::new(&file)))
        {
            Ok(records) => {
                print!("{}", report::table(&records));
                ExitCode::from(plan::exit_code(&records))
            }
            Err(error) => {
                eprintln!("live_suite: {error}");
                ExitCode::from(1)
            }
        },
        Err(message) => {
            eprintln!("live_suite: {message}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> ExitCode {
    let (ado, container) = match std::env::var(SERVER_VARIABLE) {
        Ok(ado) if !ado.trim().is_empty() => (ado, None),
        _ => {
            let notice = format!(
                "live_suite: {SERVER_VARIABLE} is not set: starting SQL Server 2022 with \
                 testcontainers (the first run pulls the image)..."
            );
            match container::start_sql_server(&notice).await {
                Ok(started) => (started.ado, Some(started.container)),
                Err(reason) => {
                    eprintln!("{}", plan::no_server_line(&reason));
                    return ExitCode::from(2);
                }
            }
        }
    };
    // A fresh container accepts logins a little after it reports ready; a server of the
    // caller's should accept one at once.
    let patience = if container.is_some() {
        LOGIN_LIMIT
    } else {
        Duration::ZERO
    };
    let code = run_on(&ado, patience).await;
    if let Some(container) = container {
        eprintln!("live_suite: removing the SQL Server container");
        let _ = tokio::time::timeout(Duration::from_secs(60), container.rm()).await;
    }
    code
}

async fn run_on(ado: &str, patience: Duration) -> ExitCode {
    if let Err(error) = wait_for_login(ado, patience).await {
        eprintln!("live_suite: cannot log in to the SQL Server ({error}); check {SERVER_VARIABLE}");
        return ExitCode::from(2);
    }
    let pid = std::process::id();
    let report_path = std::env::temp_dir().join(format!("changefeed-live-{pid}.tsv"));
    let bench_json = std::env::temp_dir().join(format!("changefeed-bench-{pid}.json"));
    let _ = std::fs::remove_file(&report_path);

    eprintln!(
        "live_suite: 1/2 every live test (report: {})",
        report_path.display()
    );
    let Some(tests) = run_cargo(
        &plan::test_arguments(),
        &[
            (SERVER_VARIABLE, ado),
            (REPORT_VARIABLE, &path_text(&report_path)),
        ],
    )
    .await
    else {
        return ExitCode::from(130);
    };
    eprintln!("live_suite: 2/2 the quick benchmark");
    let Some(bench) = run_cargo(&plan::bench_arguments(ado, &path_text(&bench_json)), &[]).await
    else {
        return ExitCode::from(130);
    };

    let records = match read_report(&report_path) {
        Ok(records) => records,
        Err(error) => {
            eprintln!("live_suite: {error}");
            return ExitCode::from(1);
        }
    };
    let rows = plan::rows(records, &tests, &bench);
    println!();
    print!("{}", report::table(&rows));
    if bench.passed() {
        println!("benchmark results: {}", bench_json.display());
    }
    ExitCode::from(plan::exit_code(&rows))
}

/// Logs in once, trying again for up to `patience` while it fails.
async fn wait_for_login(ado: &str, patience: Duration) -> Result<(), String> {
    let until = Instant::now() + patience;
    loop {
        match changefeed::connect(ado).await {
            Ok(client) => {
                let _ = client.close().await;
                return Ok(());
            }
            Err(error) if Instant::now() >= until => return Err(error.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Runs `cargo <arguments>` in the project with `variables` added to the environment, its
/// output going straight to ours. `None`: interrupted (Ctrl-C reaches the child too; it is
/// given a moment to stop, then killed).
async fn run_cargo(arguments: &[String], variables: &[(&str, &str)]) -> Option<Step> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let mut command = tokio::process::Command::new(cargo);
    command
        .args(arguments)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .kill_on_drop(true);
    for (name, value) in variables {
        command.env(name, value);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            return Some(Step {
                code: None,
                error: Some(error.to_string()),
                duration: started.elapsed(),
            });
        }
    };
    tokio::select! {
        status = child.wait() => Some(match status {
            Ok(status) => Step { code: status.code(), error: None, duration: started.elapsed() },
            Err(error) => Step {
                code: None,
                error: Some(error.to_string()),
                duration: started.elapsed(),
            },
        }),
        _ = tokio::signal::ctrl_c() => {
            eprintln!("live_suite: interrupted");
            if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            None
        }
    }
}

/// The harness' records; no file means no scenario ran (the table then says so).
fn read_report(path: &Path) -> Result<Vec<report::Record>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => report::parse_report(&text)
            .map_err(|error| format!("the live report {} is damaged: {error}", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(format!(
            "cannot read the live report {}: {error}",
            path.display()
        )),
    }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
