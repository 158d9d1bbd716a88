//! What the database relay benchmarks (bench_mysql, bench_postgres, bench_mysql_kafka) share:
//! the outbox's shape, the do-nothing and the clocking publishers, a fleet of relays run to
//! the end of a filled outbox, single-message commits spaced like real traffic, and the
//! commit-to-publish summary. The store and the database are each benchmark's own.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use changefeed::outbox::{ClaimStore, ClaimedMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
use tokio::sync::Mutex;

use crate::cpu;
use crate::stats::{self, Summary};

/// Aggregates the messages are spread over (each message waits for its aggregate's
/// previous one, as in production).
pub const AGGREGATES: usize = 1000;
/// Messages per claim, of the relays and of the bare loop.
pub const BATCH: u32 = 100;
/// Commits per latency run, spaced `LATENCY_GAP` apart (plus up to 10 ms of jitter).
pub const LATENCY_SAMPLES: usize = 200;
const LATENCY_GAP: Duration = Duration::from_millis(15);

/// The longest one stage of a benchmark (a throughput run, a latency run, a baseline) may
/// take. A stalled stage is reported and its cells say `error`; the run goes on with the
/// next stage, and the process exits with status 1 at the end when it was a relay's
/// ([`finish`]).
pub const STAGE_LIMIT: Duration = Duration::from_secs(120);

/// Whether a stage of the product (a relay's) failed or stalled in this run.
static RELAY_FAILED: AtomicBool = AtomicBool::new(false);

/// What a stage measures.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The product: relays, the store's calls. Its failure fails the run.
    Relay,
    /// A ceiling the product is compared with (a bare SQL loop, the bare producer). Its
    /// failure leaves its cells `error` and the ratios unknown, and is no finding about the
    /// product, so the run's status does not change.
    Baseline,
}

/// Runs one stage named `name` within [`STAGE_LIMIT`]: its result, or `None` once it failed
/// or stalled (said on standard error). Dropping a stalled stage drops its relays' stop
/// sender, so they stop; work the stage left running on the server (a bare loop in SQL) is
/// the caller's to stop, which `cleanup` does.
pub async fn bounded<T, C: Future<Output = ()>>(
    (kind, name): (Stage, &str),
    work: impl Future<Output = Result<T, String>>,
    cleanup: impl FnOnce() -> C,
) -> Option<T> {
    let stage = name;
    let started = Instant::now();
    let error = match tokio::time::timeout(STAGE_LIMIT, work).await {
        Ok(Ok(value)) => return Some(value),
        Ok(Err(error)) => error,
        Err(_) => format!(
            "did not finish within {} s (relay_bench::STAGE_LIMIT)",
            STAGE_LIMIT.as_secs()
        ),
    };
    eprintln!(
        "bench: {stage}: error after {:.1} s: {error}",
        started.elapsed().as_secs_f64()
    );
    if kind == Stage::Relay {
        RELAY_FAILED.store(true, Ordering::Relaxed);
    }
    cleanup().await;
    None
}

/// Ends the run: exit status 1 when a relay's stage failed or stalled (the table printed
/// `error` for it).
pub fn finish() {
    if RELAY_FAILED.load(Ordering::Relaxed) {
        eprintln!("bench: a relay's stage failed or stalled (see above); its cells say error");
        std::process::exit(1);
    }
}

/// A throughput cell: `n msg/s`, or `error`.
pub fn rate_cell(rate: Option<f64>) -> String {
    rate.map_or_else(|| "error".to_owned(), |r| format!("{r:.0} msg/s"))
}

/// A ratio cell: two decimals, or `error` when either figure is missing.
pub fn ratio_cell(value: Option<f64>, baseline: Option<f64>) -> String {
    stats::ratio_of(value, baseline).map_or_else(|| "error".to_owned(), |r| format!("{r:.2}"))
}

/// Prints `error` with what failed and exits with status 1.
pub fn fail(what: &str, error: impl std::fmt::Display) -> ! {
    eprintln!("bench: {what}: {error}");
    std::process::exit(1)
}

/// A run's sizes: messages per throughput run, commits per latency run, and rounds of the
/// throughput figures (each figure and its baseline run alternately, and the medians are
/// compared: one round's ratio moved by a fifth from run to run on two shared cores).
#[derive(Clone, Copy)]
pub struct Sizes {
    pub messages: usize,
    pub samples: usize,
    pub rounds: usize,
}

/// The sizes of a quick run (`--quick`): a smoke run of seconds, noisy figures.
pub const QUICK: Sizes = Sizes {
    messages: 2_000,
    samples: 40,
    rounds: 1,
};

/// The sizes of a full run: 20,000 messages, [`LATENCY_SAMPLES`] commits, 3 rounds.
pub const FULL: Sizes = Sizes {
    messages: 20_000,
    samples: LATENCY_SAMPLES,
    rounds: 3,
};

/// The sizes from the arguments: `--quick` ([`QUICK`]) or a message count (else
/// [`FULL`]'s), then optionally `--rounds N`.
pub fn sizes_arg() -> Sizes {
    let mut sizes = FULL;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => {
                sizes.messages = QUICK.messages;
                sizes.samples = QUICK.samples;
                sizes.rounds = QUICK.rounds;
            }
            "--rounds" => {
                sizes.rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| fail("--rounds", "needs a positive whole number"));
            }
            n => {
                sizes.messages = n
                    .parse()
                    .unwrap_or_else(|e| fail("the message count (or --quick, --rounds N)", e))
            }
        }
    }
    sizes
}

/// Each of `N` throughput stages run `rounds` times, alternately (stage 0, 1, …, then the
/// next round), so that a drift of the machine's load falls on all of them alike;
/// `stage(i)` runs stage `i` once.
pub async fn alternate<const N: usize>(
    rounds: usize,
    mut stage: impl AsyncFnMut(usize) -> Option<f64>,
) -> Rounds<N> {
    let mut values: [Vec<Option<f64>>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..rounds {
        for (i, values) in values.iter_mut().enumerate() {
            values.push(stage(i).await);
        }
    }
    Rounds(values)
}

/// What [`alternate`] measured: every round of every stage.
pub struct Rounds<const N: usize>(pub [Vec<Option<f64>>; N]);

impl<const N: usize> Rounds<N> {
    /// Stage `i`'s median (`None` when a round of it failed).
    pub fn median(&self, i: usize) -> Option<f64> {
        let values: Option<Vec<f64>> = self.0[i].iter().copied().collect();
        stats::percentile(&values?, 50.0)
    }

    /// Stage `i` over stage `baseline`, round by round ("0.95, 1.02, 0.88"), for the table
    /// beside the ratio of the medians: how far the rounds spread.
    pub fn ratios(&self, i: usize, baseline: usize) -> String {
        let ratios: Vec<String> = self.0[i]
            .iter()
            .zip(&self.0[baseline])
            .map(|(&value, &base)| ratio_cell(value, base))
            .collect();
        ratios.join(", ")
    }
}

/// Counts messages and does nothing else.
#[derive(Default)]
pub struct NoOp(pub AtomicU64);

impl Publisher for NoOp {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        vec![Ok(()); batch.len()]
    }
}

/// Records when each message id was published.
#[derive(Default)]
pub struct Clock(pub Mutex<Vec<(i64, Instant)>>);

impl Publisher for Clock {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let now = Instant::now();
        self.0
            .lock()
            .await
            .extend(batch.iter().map(|m| (m.id, now)));
        vec![Ok(()); batch.len()]
    }
}

/// Messages per second through `relays` relays (batch [`BATCH`], poll 5 ms) with a no-op
/// publisher, each on a store `store()` makes, until `messages` were published. The outbox
/// must already hold them. With `split`, what the machine's threads spent meanwhile is added
/// to it.
pub async fn relay_throughput<S>(
    messages: usize,
    relays: usize,
    store: impl Fn() -> S,
    split: Option<&RefCell<cpu::Split>>,
) -> f64
where
    S: ClaimStore + Send + Sync + 'static,
{
    let published = Arc::new(NoOp::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let meter = cpu::Meter::start(split);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..relays {
        let config = RelayConfig::default()
            .batch_size(BATCH)
            .poll_interval(Duration::from_millis(5));
        let relay = Relay::new(store(), Arc::clone(&published), config)
            .unwrap_or_else(|e| fail("relay", e));
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(relay.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }
    while published.0.load(Ordering::Relaxed) < messages as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    // Before the relays stop: their connections' server processes end with them.
    meter.stop();
    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }
    stats::throughput(messages as u64, elapsed).unwrap_or(0.0)
}

/// Commits `samples` single messages through `commit(n)` (which returns the message's id
/// once committed), each followed by a jittered gap so commits do not fall into step with a
/// poll; returns each id with the instant its commit returned.
pub async fn spaced_commits(
    samples: usize,
    mut commit: impl AsyncFnMut(usize) -> i64,
) -> Vec<(i64, Instant)> {
    let mut commits = Vec::with_capacity(samples);
    for n in 0..samples {
        let id = commit(n).await;
        commits.push((id, Instant::now()));
        let jitter = Duration::from_micros(rand::random_range(0..10_000));
        tokio::time::sleep(LATENCY_GAP + jitter).await;
    }
    commits
}

/// The commit-to-publish summary: for each commit whose id `published_at` knows, the time
/// from the commit to its publication; `None` when nothing was published.
pub fn commit_to_publish(
    commits: &[(i64, Instant)],
    published_at: impl Fn(i64) -> Option<Instant>,
) -> Option<Summary> {
    let latencies: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, committed)| {
            published_at(*id).map(|at| at.saturating_duration_since(*committed))
        })
        .collect();
    Summary::of_durations(&latencies)
}

/// One table cell for a latency summary.
pub fn latency_cell(summary: Option<Summary>, nothing: &str) -> String {
    match summary {
        Some(s) => format!("p50 {:.2} ms, p99 {:.2} ms (n = {})", s.p50, s.p99, s.count),
        None => nothing.to_owned(),
    }
}
