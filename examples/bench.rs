//! The benchmark harness: measures every hot path of changefeed next to a
//! baseline measured in the same run, and prints one table (and, with `--json`, a JSON
//! file). Nothing is asserted; timing never decides a test.
//!
//! ```sh
//! cargo run --release --example bench -- --url "server=tcp:localhost,1433;user=sa;password=...;TrustServerCertificate=true" --quick
//! cargo run --release --example bench -- --help
//! ```
//!
//! Without `--url` or `CHANGEFEED_URL` it starts SQL Server 2022 with testcontainers. It
//! creates its own database (`changefeed_bench_<pid>`), applies the migrations, creates its
//! tables in schema `bench`, and drops the database at the end unless `--keep`.
//!
//! What needs no server is unit-tested by `tests/bench_stats.rs`, which includes the
//! modules below by path: the statistics (nearest-rank percentiles, ratios), the table and
//! JSON, the command line, the shape of every SQL batch, and figure 6's relay
//! orchestration against an in-memory claim store.

#[path = "bench/args.rs"]
mod args;
#[path = "support/container.rs"]
mod container;
#[path = "support/figures.rs"]
mod figures;
#[path = "bench/load.rs"]
mod load;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/scenarios.rs"]
mod scenarios;
#[path = "bench/sql.rs"]
mod sql;
#[path = "bench/stats.rs"]
mod stats;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use changefeed::Client;
use changefeed::connection::connect_with;
use serde_json::json;
use testcontainers::ContainerAsync;
use testcontainers_modules::mssql_server::MssqlServer;

use args::{Command, HELP, Options, URL_VARIABLE};
use load::{Pool, exec, rows};
use report::{Row, legend, one_line, table};
use scenarios::{Bench, run_all};

/// Per-round-trip bound of the harness' connections: preloads insert 50 000 rows a call.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let command = match args::parse(std::env::args().skip(1), std::env::var(URL_VARIABLE).ok()) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("bench: {message}");
            return ExitCode::from(2);
        }
    };
    let options = match command {
        Command::Help => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Command::Run(options) => options,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("bench: cannot start the tokio runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(options))
}

/// Where the server came from; a container is removed at the end.
struct Server {
    ado: String,
    container: Option<ContainerAsync<MssqlServer>>,
}

async fn run(options: Options) -> ExitCode {
    let server = match &options.url {
        Some(url) => Server {
            ado: url.clone(),
            container: None,
        },
        None => match start_container().await {
            Ok(server) => server,
            Err(error) => {
                eprintln!(
                    "bench: no SQL Server to measure: pass --url <ADO.NET connection string> or set \
                     {URL_VARIABLE} (testcontainers could not start one: {})",
                    one_line(&error)
                );
                return ExitCode::from(2);
            }
        },
    };
    let code = run_on(&options, &server).await;
    if let Some(container) = server.container {
        let _ = tokio::time::timeout(Duration::from_secs(60), container.rm()).await;
    }
    code
}

/// Starts SQL Server 2022 with testcontainers (examples/support/container.rs).
async fn start_container() -> Result<Server, String> {
    let started = container::start_sql_server(&format!(
        "bench: no --url or {URL_VARIABLE}: starting SQL Server 2022 with testcontainers \
         (the first run pulls the image)..."
    ))
    .await?;
    Ok(Server {
        ado: started.ado,
        container: Some(started.container),
    })
}

/// Connects with `config`; a fresh container accepts logins a little after it reports
/// ready, so with `patience` the attempts go on that long.
async fn connect_patiently(
    config: &tiberius::Config,
    patience: Duration,
) -> changefeed::Result<Client> {
    let until = Instant::now() + patience;
    loop {
        match connect_with(config.clone()).await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() >= until => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The server's version, edition, CPUs and memory, as far as the login may see them.
async fn server_info(client: &mut Client) -> (String, Option<i64>, Option<i64>) {
    let version = rows(client, sql::SERVER_VERSION)
        .await
        .ok()
        .and_then(|rows| rows.into_iter().next())
        .map(|row| {
            let text = |i: usize| {
                row.try_get::<&str, usize>(i)
                    .ok()
                    .flatten()
                    .unwrap_or("")
                    .to_owned()
            };
            let banner = text(2);
            let first_line = banner.lines().next().unwrap_or("").trim().to_owned();
            format!("{first_line} ({}, {})", text(0), text(1))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let hardware = rows(client, sql::SERVER_HARDWARE)
        .await
        .ok()
        .and_then(|rows| rows.into_iter().next());
    let cpus = hardware.as_ref().and_then(|row| load::integer(row, 0));
    let memory_mb = hardware.as_ref().and_then(|row| load::integer(row, 1));
    (version, cpus, memory_mb)
}

async fn run_on(options: &Options, server: &Server) -> ExitCode {
    let mut base = match tiberius::Config::from_ado_string(&server.ado) {
        Ok(config) => config,
        Err(error) => {
            eprintln!(
                "bench: the connection string is not a valid ADO.NET string ({}); expected e.g. \
                 server=tcp:host,1433;user=...;password=...;TrustServerCertificate=true",
                one_line(&error.to_string())
            );
            return ExitCode::from(2);
        }
    };
    base.command_timeout(Some(COMMAND_TIMEOUT));
    let patience = if server.container.is_some() {
        Duration::from_secs(90)
    } else {
        Duration::ZERO
    };
    let mut master = match connect_patiently(&base, patience).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!(
                "bench: cannot connect to SQL Server ({}); check --url / {URL_VARIABLE}",
                one_line(&error.to_string())
            );
            return ExitCode::from(2);
        }
    };

    // The whole run: database, migrations and every figure (not the container's start).
    let run_started = Instant::now();
    let started_at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let (version, cpus, memory_mb) = server_info(&mut master).await;
    let name = format!("changefeed_bench_{}", std::process::id());
    let client_cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);

    let ado = format!("{};database={name}", server.ado.trim_end_matches(';'));
    let mut config = base.clone();
    config.database(&name);
    let recovery = match prepare_database(&mut master, &config, &name, options.rcsi).await {
        Ok(recovery) => recovery,
        Err(error) => {
            eprintln!(
                "bench: cannot prepare the benchmark database {name}: {}",
                one_line(&error.0)
            );
            drop_database(&mut master, &base, &name, options.keep).await;
            return ExitCode::from(1);
        }
    };

    println!(
        "changefeed bench {} — {started_at}",
        env!("CARGO_PKG_VERSION")
    );
    println!(
        "server:   {version}; {} CPUs, {} MB",
        cpus.map_or("?".to_owned(), |n| n.to_string()),
        memory_mb.map_or("?".to_owned(), |n| n.to_string())
    );
    println!(
        "client:   {client_cpus} CPUs; database {name} (READ_COMMITTED_SNAPSHOT {}, recovery {recovery})",
        if options.rcsi { "on" } else { "off" }
    );
    println!("settings: {}", settings_text(options));
    println!();

    let mut bench = Bench {
        options: options.clone(),
        ado,
        pool: Pool::new(config),
        ids: Arc::new(AtomicI64::new(1)),
    };
    let mut results: Vec<Row> = Vec::new();
    let interrupted = tokio::select! {
        () = run_all(&mut bench, &mut results) => false,
        _ = tokio::signal::ctrl_c() => true,
    };
    bench.pool.clear();
    drop(bench);
    // In figure order; stable, so each figure's parameters stay in the order measured.
    results.sort_by(|a, b| a.figure.cmp(&b.figure));
    let total = run_started.elapsed();

    println!("{}", table(&results));
    print!("{}", legend(&results));
    for row in &results {
        record_figure(row);
    }
    println!(
        "{} in {:.0} s{}",
        if interrupted {
            "interrupted"
        } else {
            "finished"
        },
        total.as_secs_f64(),
        if results.iter().any(|r| r.error.is_some()) {
            "; some measurements failed (see their rows)"
        } else {
            ""
        }
    );

    let mut code = ExitCode::SUCCESS;
    if let Some(path) = &options.json {
        let document = json!({
            "harness": "changefeed bench",
            "changefeed_version": env!("CARGO_PKG_VERSION"),
            "started_at": started_at,
            "interrupted": interrupted,
            "total_seconds": total.as_secs_f64(),
            "server": { "version": version, "cpus": cpus, "memory_mb": memory_mb },
            "client": { "cpus": client_cpus },
            "database": { "name": name, "read_committed_snapshot": options.rcsi, "recovery": recovery },
            "settings": settings_json(options),
            "percentiles": "nearest-rank",
            "ratio": "value / baseline",
            "results": results.iter().map(Row::to_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&document).unwrap_or_default();
        match std::fs::write(path, text + "\n") {
            Ok(()) => eprintln!("bench: wrote {path}"),
            Err(error) => {
                eprintln!("bench: cannot write {path}: {error}");
                code = ExitCode::from(1);
            }
        }
    }

    drop_database(&mut master, &base, &name, options.keep).await;
    if interrupted {
        return ExitCode::from(130);
    }
    code
}

/// Hands `row` on to `bench_all`: figure and parameters, value and baseline with the unit.
fn record_figure(row: &Row) {
    let with_unit = |v: Option<f64>| match v {
        Some(_) => format!("{} {}", report::format_number(v), row.unit),
        None => "-".to_owned(),
    };
    let value = match &row.error {
        Some(error) => format!("error: {}", one_line(error)),
        None => with_unit(row.value),
    };
    figures::record(
        &format!(
            "SQL Server: {} {} ({})",
            row.figure,
            row.measurement,
            row.parameter_text()
        ),
        &value,
        &format!("{} ({})", with_unit(row.baseline), row.baseline_label),
        row.ratio(),
    );
}

fn settings_text(options: &Options) -> String {
    format!(
        "{}duration {} s (warm-up {} s), rows/shard {}, messages {}, rate {}, timeout {} s, \
         figures {}",
        if options.quick { "quick, " } else { "" },
        options.duration.as_secs_f64(),
        options.warmup().as_secs_f64(),
        options.rows_per_shard,
        options.messages,
        if options.rate == 0 {
            "unthrottled".to_owned()
        } else {
            format!("{}/s/writer", options.rate)
        },
        options.timeout.as_secs_f64(),
        options
            .figures
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(",")
    )
}

fn settings_json(options: &Options) -> serde_json::Value {
    json!({
        "quick": options.quick,
        "duration_seconds": options.duration.as_secs_f64(),
        "warmup_seconds": options.warmup().as_secs_f64(),
        "latency_duration_seconds": options.latency_duration().as_secs_f64(),
        "rows_per_shard": options.rows_per_shard,
        "messages": options.messages,
        "rate_per_writer": options.rate,
        "timeout_seconds": options.timeout.as_secs_f64(),
        "figures": options.figures,
    })
}

/// Creates the database (replacing a leftover of the same name), sets its options,
/// applies the migrations and creates schema `bench`. Returns its recovery model.
async fn prepare_database(
    master: &mut Client,
    config: &tiberius::Config,
    name: &str,
    rcsi: bool,
) -> load::Outcome<&'static str> {
    exec(master, &sql::create_database(name)).await?;
    // The preloads write a lot of log; simple recovery keeps it from growing. Not every
    // server allows it (Azure SQL Database), and it changes no figure's meaning.
    let recovery = match exec(master, &sql::recovery_simple(name)).await {
        Ok(()) => "simple",
        Err(_) => "the server's default",
    };
    if rcsi {
        exec(master, &sql::read_committed_snapshot_on(name)).await?;
    }
    let mut client = connect_patiently(config, Duration::from_secs(30)).await?;
    eprintln!("bench: applying the changefeed migrations to {name}");
    changefeed::migrations::migrate(&mut client).await?;
    exec(&mut client, &sql::create_schema()).await?;
    Ok(recovery)
}

async fn drop_database(master: &mut Client, base: &tiberius::Config, name: &str, keep: bool) {
    if keep {
        eprintln!("bench: kept database {name} (--keep)");
        return;
    }
    let drop = async {
        // The connection has been idle for the whole run; open another if it died.
        if exec(master, "select 1").await.is_err() {
            *master = connect_with(base.clone()).await?;
        }
        let _ = exec(master, &sql::single_user(name)).await;
        exec(master, &sql::drop_database(name)).await
    };
    match tokio::time::timeout(Duration::from_secs(120), drop).await {
        Ok(Ok(())) => eprintln!("bench: dropped database {name}"),
        Ok(Err(error)) => eprintln!(
            "bench: could not drop database {name} ({}); drop it by hand",
            one_line(&error.0)
        ),
        Err(_) => {
            eprintln!("bench: could not drop database {name} within 2 minutes; drop it by hand")
        }
    }
}
