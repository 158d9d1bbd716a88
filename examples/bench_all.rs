//! One command for the figures: runs the quick form of every benchmark in turn (MariaDB's
//! claim outbox, PostgreSQL's feeds and claim outbox, the relay and the exporter into Kafka,
//! each store end to end into Kafka; SQL Server's only when `CHANGEFEED_URL` is set) and
//! prints one table of their headline figures: figure, value, baseline, ratio, machine.
//!
//! ```sh
//! cargo run --release --all-features --example bench_all
//! cargo run --release --all-features --example bench_all -- --full   # the full sizes: long
//! ```
//!
//! Each benchmark runs through cargo with this binary's profile and features (so the first
//! run builds them) and prints its own table as it goes; its headline figures reach this
//! one through a file (support/figures.rs). The machine cell of a figure is the cores, the
//! load average when its benchmark started and when it ended, and the build profile:
//! the figures of a loaded machine move a lot, and only the ratios of one run compare.
//! Nothing is asserted; the exit status is 1 when a benchmark failed (its figures are
//! missing or say error).

#[path = "support/figures.rs"]
mod figures;
#[path = "support/machine.rs"]
mod machine;

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The SQL Server connection string variable; SQL Server's benchmark runs only with it.
const URL_VARIABLE: &str = "CHANGEFEED_URL";

/// The longest one benchmark may take, its build included; past it, it is killed and the
/// run goes on. Each benchmark also bounds its own stages.
const BENCHMARK_LIMIT: Duration = Duration::from_secs(15 * 60);

/// One benchmark: its example and its quick form's arguments (bench_all itself requires
/// every feature a benchmark needs).
struct Benchmark {
    example: &'static str,
    quick: &'static [&'static str],
}

const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        example: "bench_mysql",
        quick: &["--quick"],
    },
    Benchmark {
        example: "bench_postgres",
        quick: &["--quick"],
    },
    Benchmark {
        example: "bench_postgres_feed",
        quick: &["--quick"],
    },
    Benchmark {
        example: "bench_kafka",
        quick: &["--quick"],
    },
    Benchmark {
        example: "bench_mysql_kafka",
        quick: &["--quick"],
    },
    Benchmark {
        example: "bench_postgres_kafka",
        quick: &["--quick"],
    },
];

/// SQL Server's, run only when [`URL_VARIABLE`] is set (it reads it itself).
const SQL_SERVER: Benchmark = Benchmark {
    example: "bench",
    quick: &["--quick"],
};

/// The crate's features this binary was built with: the benchmarks are built with the same,
/// so that cargo reuses this build instead of building the crate again.
fn features() -> Vec<&'static str> {
    [
        ("cli", cfg!(feature = "cli")),
        ("mysql", cfg!(feature = "mysql")),
        ("postgres", cfg!(feature = "postgres")),
        ("kafka", cfg!(feature = "kafka")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// Runs `benchmark` through cargo, its figures appended to `figures_file`; `Err` says why it
/// failed.
fn run(benchmark: &Benchmark, full: bool, figures_file: &PathBuf) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["run", "--quiet", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    if machine::profile() == "release" {
        command.arg("--release");
    }
    command.args(["--features", &features().join(",")]);
    command.args(["--example", benchmark.example, "--"]);
    if !full {
        command.args(benchmark.quick);
    }
    let mut child = command
        .env(figures::VARIABLE, figures_file)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cargo did not start: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it exited with {status}")),
            Ok(None) if started.elapsed() > BENCHMARK_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it did not finish within {} s (BENCHMARK_LIMIT), and was killed",
                    BENCHMARK_LIMIT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    }
}

/// A table cell: `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "/")
}

fn main() -> ExitCode {
    let mut full = false;
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--full" => full = true,
            "-h" | "--help" => {
                println!(
                    "bench_all: every benchmark's quick form, one table of their figures\n\
                     usage: cargo run --release --all-features --example bench_all [-- --full]\n  \
                     --full   each benchmark at its full sizes instead (tens of minutes)\n\
                     SQL Server's benchmark runs only when {URL_VARIABLE} is set."
                );
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("error: unknown argument {other} (see --help)");
                return ExitCode::from(2);
            }
        }
    }
    let figures_file = std::env::temp_dir().join(format!(
        "changefeed-bench-figures-{}.tsv",
        std::process::id()
    ));
    let mut benchmarks: Vec<&Benchmark> = BENCHMARKS.iter().collect();
    if std::env::var_os(URL_VARIABLE).is_some() {
        benchmarks.push(&SQL_SERVER);
    } else {
        println!("(SQL Server's benchmark skipped: {URL_VARIABLE} is not set)");
    }
    let started = Instant::now();
    let mut rows: Vec<(figures::Figure, String)> = Vec::new();
    let mut failed = Vec::new();
    for benchmark in benchmarks {
        println!("\n== {} {}", benchmark.example, benchmark.quick.join(" "));
        let load_before = machine::load();
        let _ = std::fs::remove_file(&figures_file);
        let benchmark_started = Instant::now();
        let outcome = run(benchmark, full, &figures_file);
        println!(
            "== {}: {:.0} s, its build and server start included",
            benchmark.example,
            benchmark_started.elapsed().as_secs_f64()
        );
        let machine = format!(
            "{} cores, load {load_before} -> {}, {}",
            machine::cores(),
            machine::load(),
            machine::profile()
        );
        let text = std::fs::read_to_string(&figures_file).unwrap_or_default();
        rows.extend(
            figures::parse(&text)
                .into_iter()
                .map(|f| (f, machine.clone())),
        );
        if let Err(why) = outcome {
            failed.push(format!("{}: {why}", benchmark.example));
        }
    }
    let _ = std::fs::remove_file(&figures_file);

    println!(
        "\nAll figures ({}, {} build, {:.0} s; load averages over 1, 5 and 15 minutes):",
        if full { "full sizes" } else { "quick forms" },
        machine::profile(),
        started.elapsed().as_secs_f64()
    );
    println!("| figure | value | baseline | ratio | machine |");
    println!("|---|---|---|---|---|");
    for (figure, machine) in &rows {
        println!(
            "| {} | {} | {} | {} | {machine} |",
            cell(&figure.figure),
            cell(&figure.value),
            cell(&figure.baseline),
            figure
                .ratio
                .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}")),
        );
    }
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    for failure in &failed {
        eprintln!("bench_all: {failure}");
    }
    ExitCode::FAILURE
}
