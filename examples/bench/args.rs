//! The command line of the benchmark harness, parsed by hand (the `cli` feature's clap is
//! optional, and an example should build without it).

use std::time::Duration;

/// The environment variable read when `--url` is not given.
pub const URL_VARIABLE: &str = "CHANGEFEED_URL";

/// The figures the harness can measure; 7 is figures 1–3 again at 4 and 16 shards.
pub const FIGURES: [u8; 7] = [1, 2, 3, 4, 5, 6, 7];

/// `--help`.
pub const HELP: &str = "\
changefeed benchmark harness: measures every hot path of changefeed next to a baseline
measured in the same run, and prints one table (figure, parameters, value, unit, baseline,
ratio = value / baseline). Nothing is asserted.

USAGE:
    cargo run --release --example bench -- [OPTIONS]

OPTIONS:
    --url <ADO>         The SQL Server to measure, as an ADO.NET connection string, e.g.
                        \"server=tcp:localhost,1433;user=sa;password=...;TrustServerCertificate=true\".
                        Default: $CHANGEFEED_URL; with neither, SQL Server 2022 is started with
                        testcontainers (needs a Docker engine). The login must be able to
                        create databases: the harness creates changefeed_bench_<pid>, applies
                        the migrations, and drops it at the end.
    --quick             Small counts, meant to finish the whole run in under 2 minutes on a
                        small server (the run prints how long it took).
    --json <FILE>       Also write the results (and the settings and server) as JSON to FILE.
    --only <LIST>       Measure only these figures, comma-separated (default: all), e.g.
                        --only 1,4. Figures 1-3 run at 1 shard; figure 7 runs them at 4 and
                        16 shards.
    --keep              Keep the benchmark database instead of dropping it (a testcontainers
                        server is removed at the end anyway).
    --rcsi              Turn READ_COMMITTED_SNAPSHOT on in the benchmark database (Azure SQL
                        Database's default); default off (SQL Server's default).
    --duration <SECS>   Measuring time of each write measurement (figures 1, 5) and writing
                        time of each latency measurement (figure 4, at least 2 s).
                        Default 10, with --quick 1.
    --rows <N>          Events preloaded per shard for figures 2 and 3. Default 50000, with
                        --quick 5000.
    --messages <N>      Messages enqueued for each relay measurement (figure 6). Default
                        20000, with --quick 2000.
    --rate <N>          Figure 4: transactions per second of each writer; 0 writes as fast as
                        possible. Default 100.
    --timeout <SECS>    Time limit of each measurement; one that fails or runs out of time
                        reports its error in its table row and the run goes on. Default 600,
                        with --quick 60.
    -h, --help          Print this text and exit.

FIGURES (value vs baseline):
    1  outbox-mode write cost: events/s of transactions inserting the event and its outbox
       row vs the same transactions without the outbox row; 1, 4, 16 writers
    2  first-read assignment: events/s moved from the outbox into the feed by read_feed vs
       a hand-rolled drain (delete top(n) ... output into a log table); pages 100, 1000, 5000
    3  replay: events/s reading an assigned feed from the start with read_page vs a plain
       select top(n) ... where ulid > @c order by ulid loop; pages 100, 1000, 5000
    4  commit-to-consumer latency p50/p95/p99, long-poll (wait_ms 1000) vs client polling
       (wait_ms 0 and a 50 ms sleep); 4 and 16 writers
    5  serialized-writer transactions/s on one shard (lock_feed + ulid(1)) vs the same
       insert without lock_feed; 1, 4, 16 writers; server-side batch and client-side
       transaction
    6  claim outbox: messages/s from enqueued to done with 1, 2, 4 relays (no-op publisher)
       vs raw claim/mark_done loops; claim-call latency p99
    7  figures 1-3 at 4 and 16 shards (one reader per shard)

EXIT STATUS:
    0 the run finished (a failed measurement is reported in its row); 1 the benchmark
    database could not be prepared; 2 bad arguments, or no SQL Server to connect to.
";

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Print [`HELP`] and exit 0.
    Help,
    /// Run the benchmark.
    Run(Options),
}

/// The options of a run, with the defaults (or `--quick`'s) applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// `--url`, or `CHANGEFEED_URL`; `None`: try testcontainers.
    pub url: Option<String>,
    /// `--quick`.
    pub quick: bool,
    /// `--json`.
    pub json: Option<String>,
    /// The figures to measure, ascending.
    pub figures: Vec<u8>,
    /// `--keep`.
    pub keep: bool,
    /// `--rcsi`.
    pub rcsi: bool,
    /// Measuring time of each write measurement.
    pub duration: Duration,
    /// Events preloaded per shard (figures 2, 3).
    pub rows_per_shard: u64,
    /// Messages per relay measurement (figure 6).
    pub messages: u64,
    /// Figure 4's transactions per second per writer; 0 = unthrottled.
    pub rate: u32,
    /// Time limit of each measurement.
    pub timeout: Duration,
}

impl Options {
    /// Whether figure `n` is to be measured.
    pub fn wants(&self, figure: u8) -> bool {
        self.figures.contains(&figure)
    }

    /// The shard counts figure `n` (1, 2 or 3) runs at: 1 when selected, 4 and 16 when
    /// figure 7 is.
    pub fn shard_counts(&self, figure: u8) -> Vec<i32> {
        let mut counts = Vec::new();
        if self.wants(figure) {
            counts.push(1);
        }
        if self.wants(7) {
            counts.extend([4, 16]);
        }
        counts
    }

    /// The untimed warm-up before each write measurement: a fifth of the duration, at
    /// most 2 s.
    pub fn warmup(&self) -> Duration {
        (self.duration / 5).min(Duration::from_secs(2))
    }

    /// How long figure 4's writers write: the duration, at least 2 s (fewer events give
    /// no meaningful p99).
    pub fn latency_duration(&self) -> Duration {
        self.duration.max(Duration::from_secs(2))
    }
}

/// Parses the arguments after the program name; `env_url` is `CHANGEFEED_URL`'s value.
/// The error is one line saying what is wrong.
pub fn parse<I, S>(args: I, env_url: Option<String>) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut url = None;
    let mut quick = false;
    let mut json = None;
    let mut only: Option<Vec<u8>> = None;
    let mut keep = false;
    let mut rcsi = false;
    let mut duration = None;
    let mut rows = None;
    let mut messages = None;
    let mut rate = None;
    let mut timeout = None;

    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let flag = |inline: &Option<String>| -> Result<(), String> {
            match inline {
                Some(_) => Err(format!("{name} takes no value; see --help")),
                None => Ok(()),
            }
        };
        let mut value = |inline: Option<String>| -> Result<String, String> {
            match inline {
                Some(value) => Ok(value),
                None => args
                    .next()
                    .ok_or_else(|| format!("{name} needs a value; see --help")),
            }
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--quick" => {
                flag(&inline)?;
                quick = true;
            }
            "--keep" => {
                flag(&inline)?;
                keep = true;
            }
            "--rcsi" => {
                flag(&inline)?;
                rcsi = true;
            }
            "--url" => {
                let text = value(inline)?;
                if text.trim().is_empty() {
                    return Err("--url is empty; pass an ADO.NET connection string".to_owned());
                }
                url = Some(text);
            }
            "--json" => {
                let text = value(inline)?;
                if text.is_empty() {
                    return Err("--json needs a file name".to_owned());
                }
                json = Some(text);
            }
            "--only" => only = Some(parse_figures(&value(inline)?)?),
            "--duration" => duration = Some(parse_seconds("--duration", &value(inline)?)?),
            "--timeout" => timeout = Some(parse_seconds("--timeout", &value(inline)?)?),
            "--rows" => rows = Some(parse_count("--rows", &value(inline)?, 1)?),
            "--messages" => messages = Some(parse_count("--messages", &value(inline)?, 1)?),
            "--rate" => {
                let n = parse_count("--rate", &value(inline)?, 0)?;
                rate = Some(u32::try_from(n).map_err(|_| "--rate is too large".to_owned())?);
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; see --help for the options"
                ));
            }
        }
    }

    let url = url.or(env_url.filter(|u| !u.trim().is_empty()));
    Ok(Command::Run(Options {
        url,
        quick,
        json,
        figures: only.unwrap_or_else(|| FIGURES.to_vec()),
        keep,
        rcsi,
        duration: duration.unwrap_or(Duration::from_secs(if quick { 1 } else { 10 })),
        rows_per_shard: rows.unwrap_or(if quick { 5_000 } else { 50_000 }),
        messages: messages.unwrap_or(if quick { 2_000 } else { 20_000 }),
        rate: rate.unwrap_or(100),
        timeout: timeout.unwrap_or(Duration::from_secs(if quick { 60 } else { 600 })),
    }))
}

fn parse_figures(text: &str) -> Result<Vec<u8>, String> {
    let mut figures = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u8>() {
            Ok(n) if FIGURES.contains(&n) => {
                if !figures.contains(&n) {
                    figures.push(n);
                }
            }
            _ => {
                return Err(format!(
                    "--only: {part:?} is not a figure; pass numbers from 1 to 7, e.g. --only 1,4"
                ));
            }
        }
    }
    if figures.is_empty() {
        return Err("--only needs at least one figure, e.g. --only 1,4".to_owned());
    }
    figures.sort_unstable();
    Ok(figures)
}

fn parse_seconds(name: &str, text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0 => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(format!(
            "{name}: {text:?} is not a number of seconds between 0 and 86400 (e.g. 5 or 0.5)"
        )),
    }
}

fn parse_count(name: &str, text: &str, min: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n >= min && n <= 1_000_000_000 => Ok(n),
        _ => Err(format!(
            "{name}: {text:?} is not a whole number between {min} and 1000000000"
        )),
    }
}
