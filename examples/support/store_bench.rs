//! What the two store benchmarks (bench_mysql, bench_postgres) run alike around their own
//! store, waker and commits: the commit-to-publish latency of a relay woken by the store's
//! waker or polling, the rows (and `bench_all`'s figures) comparing a relay fleet with the
//! bare SQL loop, and claims timed behind a deep backlog on a few aggregates.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::outbox::{ClaimStore, NewMessage};
use changefeed::relay::{Relay, RelayConfig, RelayHandle};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::figures;
use crate::relay_bench::{self, BATCH, Clock, LATENCY_SAMPLES, Rounds, fail};
use crate::stats::Summary;

/// The relay's own poll when a waker wakes it: longer than a latency run.
pub const WOKEN_POLL: Duration = Duration::from_secs(60);

/// Resolves once the run stops: the shutdown future of a waker.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Spawns a waker's `run` and waits until its `state` says it follows its source (`awake`);
/// returns its task.
pub async fn spawn_waker<St>(
    mut state: watch::Receiver<St>,
    awake: impl Fn(&St) -> bool,
    run: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let task = tokio::spawn(run);
    let _ = state.wait_for(awake).await;
    task
}

/// Commit-to-publish latencies of [`LATENCY_SAMPLES`] single-message commits (`commit`
/// commits the message it is given, topic `latency` and payload `{"n": n}` for the `n`th,
/// and returns its id) to a relay over `store` that polls every `poll`;
/// or, with `waker`, that polls every [`WOKEN_POLL`] and is woken by the store's waker:
/// `waker(handle, stop)` spawns one for the relay's `handle`, running until
/// [`stopped`]`(stop)`, and returns its task once it follows its source. The run ends three
/// `poll`s after the last commit.
pub async fn latency<S, W, WF>(
    store: S,
    poll: Duration,
    waker: Option<W>,
    mut commit: impl AsyncFnMut(NewMessage) -> i64,
) -> Option<Summary>
where
    S: ClaimStore + Send + 'static,
    W: FnOnce(RelayHandle, watch::Receiver<bool>) -> WF,
    WF: Future<Output = JoinHandle<()>>,
{
    let clock = Arc::new(Clock::default());
    let relay_poll = if waker.is_some() { WOKEN_POLL } else { poll };
    let config = RelayConfig::default().poll_interval(relay_poll);
    let relay = Relay::new(store, Arc::clone(&clock), config).unwrap_or_else(|e| fail("relay", e));
    let (stop, stop_rx) = watch::channel(false);
    let waker_task = match waker {
        Some(start) => Some(start(relay.handle(), stop_rx.clone()).await),
        None => None,
    };
    let relay_task = tokio::spawn(relay.run(stopped(stop_rx)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let commits = relay_bench::spaced_commits(LATENCY_SAMPLES, async |n| {
        commit(NewMessage::new("latency", serde_json::json!({ "n": n }))).await
    })
    .await;
    tokio::time::sleep(poll * 3).await;
    let _ = stop.send(true);
    let _ = relay_task.await;
    if let Some(task) = waker_task {
        let _ = task.await;
    }
    let published = clock.0.lock().await.clone();
    relay_bench::commit_to_publish(&commits, |id| {
        published.iter().find(|(p, _)| *p == id).map(|(_, at)| *at)
    })
}

/// The table's rows for `relays` relays next to as many bare SQL loops, stage 0 and 1 of
/// `rounds` (the medians and their ratio, and each round's ratio when there were several;
/// `error` for a stage that failed or stalled); the ratio is also a figure of `store`'s for
/// `bench_all`.
pub fn print_relay_and_bare(store: &str, relays: usize, rounds: &Rounds<2>) {
    let (relay, bare) = (rounds.median(0), rounds.median(1));
    let ratio = relay_bench::ratio_cell(relay, bare);
    let (relay, bare) = (relay_bench::rate_cell(relay), relay_bench::rate_cell(bare));
    let n = rounds.0[0].len();
    let median = if n > 1 {
        format!(", median of {n} rounds")
    } else {
        String::new()
    };
    println!("| {relays} relay(s), no-op publisher{median} | {relay} |");
    println!("| {relays} bare SQL loop(s){median} | {bare} |");
    println!("| ratio relay / bare, {relays} | {ratio} |");
    if n > 1 {
        println!(
            "| ratio relay / bare, {relays}, each round | {} |",
            rounds.ratios(0, 1)
        );
    }
    figures::record(
        &format!("{store} outbox: {relays} relay(s), no-op publisher"),
        &relay,
        &format!("{bare} (bare SQL loop)"),
        ratio.parse().ok(),
    );
}

/// The table's row for the commit-to-publish latency `stage` (`None`: it failed or
/// stalled), also a figure of `store`'s for `bench_all` (p99; p50 beside it).
pub fn print_latency(store: &str, stage: &str, summary: Option<Option<Summary>>) {
    let cell = summary.map_or_else(
        || "error".to_owned(),
        |summary| relay_bench::latency_cell(summary, "nothing published"),
    );
    println!("| {stage} | {cell} |");
    let value = match summary.flatten() {
        Some(s) => format!("p99 {:.2} ms (p50 {:.2} ms)", s.p99, s.p50),
        None => cell,
    };
    figures::record(&format!("{store} outbox: {stage}"), &value, "", None);
}

/// One claim of [`BATCH`] and the `mark_done` of what it took: how many were done.
pub async fn claim_and_done<S: ClaimStore>(store: &mut S) -> changefeed::Result<usize> {
    use changefeed::outbox::Claimed;
    let batch = store.claim(BATCH, Duration::from_secs(60)).await?;
    let Some(first) = batch.first() else {
        return Ok(0);
    };
    let ids: Vec<i64> = batch.iter().map(Claimed::id).collect();
    let done = store.mark_done(&ids, first.claim_token()).await?;
    Ok(usize::try_from(done).unwrap_or(0))
}

/// Aggregates of the deep backlog: fewer than a batch, so no claim fills one.
pub const DEEP_AGGREGATES: usize = 10;

/// Claims timed over the deep backlog, each way.
pub const DEEP_CLAIMS: usize = 5;

/// [`DEEP_CLAIMS`] claims of [`BATCH`] through `store`, each with its acknowledgement:
/// milliseconds a claim (median) and messages claimed in all.
pub async fn deep_claims<S: ClaimStore>(store: &mut S) -> Result<(f64, usize), String> {
    let (mut times, mut claimed) = (Vec::new(), 0);
    for _ in 0..DEEP_CLAIMS {
        let started = Instant::now();
        claimed += claim_and_done(store)
            .await
            .map_err(|e| format!("claim and mark_done: {e}"))?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((median(&times), claimed))
}

/// The median of `times`.
pub fn median(times: &[f64]) -> f64 {
    crate::stats::percentile(times, 50.0).unwrap_or(f64::NAN)
}

/// The rows (and `bench_all`'s figure) of claims behind a deep backlog on `store`: `rates`
/// holds the store's claims and the `baseline`'s, each as [`deep_claims`] gives them.
pub fn print_deep_backlog(
    store: &str,
    stage: &str,
    baseline: &str,
    rates: Option<[(f64, usize); 2]>,
) {
    // Messages claimed a second of claiming: each claim takes the heads either way.
    let rate = |(ms, claimed): (f64, usize)| claimed as f64 / (ms * DEEP_CLAIMS as f64 / 1000.0);
    let cell = |(ms, claimed): (f64, usize)| {
        format!(
            "{:.0} msg/s ({ms:.1} ms a claim of {})",
            rate((ms, claimed)),
            claimed / DEEP_CLAIMS
        )
    };
    let (ours, theirs, ratio) = match rates {
        Some([ours, theirs]) => (cell(ours), cell(theirs), Some(rate(ours) / rate(theirs))),
        None => ("error".to_owned(), "error".to_owned(), None),
    };
    println!("| {stage}, the store's claim | {ours} |");
    println!("| {stage}, {baseline} | {theirs} |");
    let ratio_cell = ratio.map_or_else(|| "–".to_owned(), |r| format!("{r:.0}"));
    println!("| ratio store / {baseline} | {ratio_cell} |");
    figures::record(
        &format!("{store} outbox: {stage}"),
        &ours,
        &format!("{theirs} ({baseline})"),
        ratio,
    );
}
