//! The relay of the claim-style outbox: claim a batch, publish it, acknowledge each
//! message by its outcome, repeat.
//!
//! [`Relay`] drives a [`ClaimStore`] (the outbox table's procedures) and a [`Publisher`]
//! (your broker). Any number of relays may run against one outbox: the claim hands each
//! message to one of them, at most one message per aggregate at a time, and every
//! acknowledgement is fenced by the claim's token.
//!
//! What happens to a message after its publish (the failure table):
//!
//! | outcome | outbox row | attempts | then |
//! |---|---|---|---|
//! | `Ok` | done (one `mark_done` for all of a batch's successes) | – | – |
//! | [`Retriable`](ErrorKind::Retriable) | failed, due after the [`RetryPolicy`] delay | +1 | dead when this reaches `max_attempts` (with dead-letter) |
//! | [`Poison`](ErrorKind::Poison) | dead | +1 | dead-letter hand-off |
//! | [`Fatal`](ErrorKind::Fatal) | handed back, due at once (requeue) | – | not dead, no dead letter; the rest of the batch is acknowledged, then `run` returns an error and the message waits for a relay that can publish it |
//! | [`Backpressure`](ErrorKind::Backpressure) | failed, due after `retry.initial` (requeue) | – | the relay waits `retry.initial` before its next claim |
//! | publisher panicked, timed out, or returned the wrong number of outcomes | every message of the batch as `Retriable` | +1 | reported to [`Hooks::on_loop_error`] |
//! | the claimed row cannot be decoded ([`Claimed::Undecodable`]: payload or headers not readable JSON) | dead, never published | +1 | dead-letter hand-off with the raw text ([`DeadLetter::Undecodable`]) |
//!
//! A message claimed with `attempts >= max_attempts` (its earlier claims expired, e.g.
//! because publishing it crashed the relay process) is marked dead without being
//! published again.
//!
//! Delivery is at least once: a lost acknowledgement (crash, expired claim, store outage
//! longer than the claim timeout, a store error no retry fixes such as a missing grant)
//! means the message is published again.

mod config;
mod hooks;
mod json_lines;
mod policy;
mod publisher;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rand::rngs::StdRng;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::Instrument;
use tracing::field::Empty;

pub use config::{MAX_BATCH_SIZE, MAX_CLAIM_TIMEOUT, RelayConfig};
pub use hooks::{Hooks, NoHooks};
pub use json_lines::JsonLines;
pub use policy::{MAX_RETRY_DELAY, RetryDecision, RetryPolicy};
pub use publisher::{
    DeadLetter, ErrorKind, HEADER_ATTEMPTS, HEADER_ERROR, HEADER_ERROR_KIND, HEADER_ORIGINAL_TOPIC,
    PublishError, PublishOutcome, Publisher, dead_letter_headers,
};

use crate::error::{Error, Result};
use crate::metrics::RelayMetrics;
use crate::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage};
use hooks::{guarded, panic_message};

/// How long a claim already under way may still take once shutdown is asked for. A healthy
/// claim answers in milliseconds and its rows are then published and acknowledged; one that
/// hangs (a server that stopped answering, a connect that never completes) is abandoned so
/// the relay stops. Rows of an abandoned claim that did commit are claimed again after the
/// claim timeout.
pub const SHUTDOWN_CLAIM_GRACE: Duration = Duration::from_secs(5);

/// The longest wait between two claims while the store fails (an outage, a failover): the
/// retry back-off grows up to this and no further, and a [`RelayHandle::wake`] ends the
/// wait early, so a relay resumes within this of its database's return.
pub const MAX_STORE_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Publishes an outbox: claims batches from a [`ClaimStore`], hands them to a
/// [`Publisher`], and acknowledges every message by its outcome (see the
/// [module documentation](self) for the failure table).
///
/// The loop, [`run`](Self::run):
/// * a claim that returned messages is followed at once by the next claim (acknowledging
///   an aggregate's head makes its next message claimable), unless nothing in the batch
///   was published or marked dead (then it waits `poll_interval`, so a broker that fails
///   everything is not hammered) or something met backpressure (then it waits
///   `retry.initial`);
/// * a claim that found nothing is followed by the next one `poll_interval` after it began,
///   or sooner when [`RelayHandle::wake`] is called; a wake that arrives while a batch is
///   in flight is kept and ends the next wait at once. A store whose claim waits on the
///   server for work ([`ClaimStore::claim_waits`], e.g.
///   [`SqlClaimStore`](crate::outbox_store::SqlClaimStore)) has usually spent that long
///   already, so the next claim follows at once and a new message is claimed within the
///   store's pause, not the poll interval;
/// * a failing claim is reported to [`Hooks::on_loop_error`] and retried after a
///   back-off of at least `poll_interval` (or [`MAX_STORE_RETRY_DELAY`] if that is less)
///   and at most [`MAX_STORE_RETRY_DELAY`], cut short by a wake; the relay never gives up
///   on its store, so an operator can fix a missing
///   grant or a failover without restarting it (a hook that wants to stop it on a
///   non-[transient](Error::is_transient) error can trigger the shutdown future);
/// * a failing acknowledgement is retried until the claim's deadline when the error is
///   [transient](Error::is_transient), and given up at once when it is not (a missing
///   grant, a missing procedure): those messages are published again after the claim
///   timeout;
/// * shutdown lets the in-flight batch finish (publish and acknowledge it) and returns; a
///   claim under way when shutdown comes gets [`SHUTDOWN_CLAIM_GRACE`] to answer and is
///   abandoned after that, except a claim of a store that waits for work: that one is
///   abandoned at once and cancelled on the server ([`ClaimStore::cancel_claim`]).
///
/// ```
/// use std::time::Duration;
/// use changefeed::outbox::ClaimedMessage;
/// use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
/// # use changefeed::outbox::{ClaimStore, ClaimToken};
/// # struct Empty;
/// # impl ClaimStore for Empty {
/// #     async fn claim(&mut self, _: u32, _: Duration) -> changefeed::Result<Vec<changefeed::outbox::Claimed>> { Ok(vec![]) }
/// #     async fn mark_done(&mut self, _: &[i64], _: ClaimToken) -> changefeed::Result<u64> { Ok(0) }
/// #     async fn mark_failed(&mut self, _: i64, _: ClaimToken, _: Option<Duration>, _: bool, _: &str) -> changefeed::Result<u64> { Ok(0) }
/// #     async fn requeue(&mut self, _: i64, _: ClaimToken, _: Duration) -> changefeed::Result<u64> { Ok(0) }
/// # }
/// # fn connect_outbox_store() -> Empty { Empty }
///
/// struct Stdout;
///
/// impl Publisher for Stdout {
///     async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
///         for m in batch {
///             println!("{} {} {}", m.topic, m.message_id, m.payload);
///         }
///         vec![Ok(()); batch.len()]
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> changefeed::Result<()> {
/// let store = connect_outbox_store(); // an OutboxStore over SQL Server
/// let config = RelayConfig::default().batch_size(500);
/// let relay = Relay::new(store, Stdout, config)?;
///
/// // Enqueuers call `handle.wake()` after their transaction commits.
/// let handle = relay.handle();
/// # let shutdown = tokio::time::sleep(Duration::from_millis(20));
/// // e.g. `let shutdown = async { tokio::signal::ctrl_c().await.ok(); };`
/// relay.run(shutdown).await?;
/// # drop(handle);
/// # Ok(())
/// # }
/// ```
pub struct Relay<S, P, H = NoHooks> {
    store: S,
    publisher: P,
    hooks: H,
    config: RelayConfig,
    wake: Arc<Notify>,
    rng: StdRng,
    metrics: RelayMetrics,
}

/// Wakes a sleeping [`Relay`] so it claims at once; cheap to clone and send to
/// enqueuers.
#[derive(Clone, Debug)]
pub struct RelayHandle {
    wake: Arc<Notify>,
}

impl RelayHandle {
    /// Ends the relay's current (or next) idle wait. Call it after the transaction that
    /// enqueued a message commits. Wakes never queue up: many calls during one batch
    /// cause one early claim.
    pub fn wake(&self) {
        // `notify_one` stores a permit when the relay is not waiting (it is publishing),
        // so the wake is seen by the next wait instead of being lost.
        self.wake.notify_one();
    }
}

/// What one batch came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages the publisher accepted (marked done).
    pub published: usize,
    /// Messages marked failed, to be retried.
    pub failed: usize,
    /// Messages handed back without counting an attempt: for backpressure, or after a
    /// fatal error.
    pub requeued: usize,
    /// Messages marked dead.
    pub dead: usize,
    /// Acknowledgements the store fenced off because the claim had expired.
    pub claim_lost: u64,
    /// Acknowledgements given up after store errors until the claim timed out; those
    /// messages will be claimed and published again.
    pub unacknowledged: usize,
}

/// One acknowledgement, kept as data so a failed store call can be retried as it was.
enum Ack<'a> {
    Done(&'a [i64], ClaimToken),
    Failed {
        id: i64,
        token: ClaimToken,
        retry_after: Option<Duration>,
        dead: bool,
        error: &'a str,
    },
    Requeue {
        id: i64,
        token: ClaimToken,
        after: Duration,
    },
}

impl Ack<'_> {
    fn name(&self) -> &'static str {
        match self {
            Ack::Done(..) => "mark_done",
            Ack::Failed { .. } => "mark_failed",
            Ack::Requeue { .. } => "requeue",
        }
    }

    /// How many rows the acknowledgement should change.
    fn expected(&self) -> u64 {
        match self {
            Ack::Done(ids, _) => ids.len() as u64,
            _ => 1,
        }
    }
}

impl<S: ClaimStore, P: Publisher> Relay<S, P, NoHooks> {
    /// A relay over `store` and `publisher`, without hooks. Fails with
    /// [`Error::Config`] when `config` is out of range, or when the publisher's
    /// [longest publish](Publisher::longest_publish) is more than three quarters of
    /// `claim_timeout` (the last quarter is left for the acknowledgement).
    pub fn new(store: S, publisher: P, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        config.check_publisher(&publisher)?;
        Ok(Relay {
            metrics: RelayMetrics::new(store.outbox_name()),
            store,
            publisher,
            hooks: NoHooks,
            config,
            wake: Arc::new(Notify::new()),
            rng: rand::make_rng(),
        })
    }
}

impl<S: ClaimStore, P: Publisher, H: Hooks> Relay<S, P, H> {
    /// The same relay, reporting to `hooks`.
    pub fn with_hooks<H2: Hooks>(self, hooks: H2) -> Relay<S, P, H2> {
        Relay {
            store: self.store,
            publisher: self.publisher,
            hooks,
            config: self.config,
            wake: self.wake,
            rng: self.rng,
            metrics: self.metrics,
        }
    }

    /// A handle that wakes this relay from its idle wait.
    pub fn handle(&self) -> RelayHandle {
        RelayHandle {
            wake: Arc::clone(&self.wake),
        }
    }

    /// The relay's settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Runs the relay until `shutdown` completes, then finishes the batch in flight
    /// (publishes and acknowledges it) and returns `Ok(())`.
    ///
    /// Returns an [`Error::Publisher`] when the publisher reports a
    /// [fatal](ErrorKind::Fatal) error, after handing the fatal messages back and
    /// acknowledging the rest of the batch. Store errors never end it: they are reported
    /// and retried.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut shutdown = pin!(shutdown);
        let wake = Arc::clone(&self.wake);
        let mut store_failures = 0u32;
        // Set when shutdown completed while a claim was under way and the claim still
        // answered: its batch is finished, then the loop ends (a completed future must not
        // be polled again).
        let mut stopping = false;
        loop {
            if stopping || shutdown.as_mut().now_or_never().is_some() {
                tracing::info!("relay shutting down");
                return Ok(());
            }
            // A wake stored before this claim starts is answered by the claim itself;
            // dropping it saves a needless claim after this one.
            let _ = wake.notified().now_or_never();

            let claim_waits = self.store.claim_waits();
            let claim_started = Instant::now();
            let claimed = {
                let claim = self.claim();
                let mut claim = pin!(claim);
                tokio::select! {
                    biased;
                    result = claim.as_mut() => Some(result),
                    () = shutdown.as_mut() => {
                        stopping = true;
                        if claim_waits {
                            // Waiting for work is its normal state: abandoned now, and
                            // cancelled on the server below.
                            None
                        } else {
                            // Abandoning a claim that did commit leaves its rows claimed
                            // until the timeout (and charged an attempt), so a claim that is
                            // merely slow gets a grace period; a hanging one does not hold
                            // shutdown.
                            match timeout(SHUTDOWN_CLAIM_GRACE, claim.as_mut()).await {
                                Ok(result) => Some(result),
                                Err(_) => {
                                    tracing::warn!(
                                        grace = ?SHUTDOWN_CLAIM_GRACE,
                                        "relay shutting down: abandoned a claim that did not answer"
                                    );
                                    return Ok(());
                                }
                            }
                        }
                    }
                }
            };
            let Some(claimed) = claimed else {
                self.store.cancel_claim().await;
                tracing::info!("relay shutting down: cancelled its waiting claim");
                return Ok(());
            };
            let batch = match claimed {
                Ok(batch) => {
                    store_failures = 0;
                    batch
                }
                Err(error) => {
                    store_failures = store_failures.saturating_add(1);
                    self.loop_error(&error);
                    if stopping {
                        return Ok(());
                    }
                    // Capped low: an outage's back-off must not outlast the outage by
                    // minutes. A wake (an enqueuer's, or the binlog waker's reconnect) says
                    // the database may be back, so it ends the wait too.
                    let delay = self
                        .config
                        .retry
                        .backoff(store_failures, &mut self.rng)
                        .max(self.config.poll_interval)
                        .min(MAX_STORE_RETRY_DELAY);
                    tokio::select! {
                        biased;
                        () = shutdown.as_mut() => return Ok(()),
                        () = wake.notified() => {}
                        () = sleep(delay) => {}
                    }
                    continue;
                }
            };

            // When the idle wait began: an empty claim's own wait counts (a store that waits
            // on the server for work has usually waited poll_interval already).
            let idle_since = if batch.is_empty() {
                Some(claim_started)
            } else {
                let (report, fatal) = self.process(batch).await;
                if let Some(error) = fatal {
                    return Err(error);
                }
                if report.requeued > 0 && !stopping {
                    // The broker asked us to slow down: a wake must not cut this short.
                    tokio::select! {
                        biased;
                        () = shutdown.as_mut() => return Ok(()),
                        () = sleep(self.config.retry.initial) => {}
                    }
                    None
                } else {
                    // Nothing moved (every message failed): claiming again at once would
                    // only fail the next batch too.
                    (report.published + report.dead == 0).then(Instant::now)
                }
            };
            if stopping {
                continue; // the loop's first check returns
            }
            if let Some(since) = idle_since {
                tokio::select! {
                    biased;
                    () = shutdown.as_mut() => return Ok(()),
                    () = wake.notified() => {}
                    () = sleep_until(since + self.config.poll_interval) => {}
                }
            }
        }
    }

    /// Claims one batch and publishes and acknowledges it, for callers that drive their
    /// own loop (a scheduled job, a test). Returns an empty report when nothing was due,
    /// the store's error when the claim failed, and an [`Error::Publisher`] after a
    /// [fatal](ErrorKind::Fatal) publish error (the fatal messages are handed back and the
    /// rest of the batch acknowledged first).
    pub async fn run_once(&mut self) -> Result<BatchReport> {
        let batch = self.claim().await.inspect_err(|e| self.loop_error(e))?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        match self.process(batch).await {
            (_, Some(error)) => Err(error),
            (report, None) => Ok(report),
        }
    }

    async fn claim(&mut self) -> Result<Vec<Claimed>> {
        let batch_size = self.config.batch_size;
        let claim_timeout = self.config.claim_timeout;
        let started = Instant::now();
        let batch = self
            .store
            .claim(batch_size, claim_timeout)
            .instrument(tracing::debug_span!("relay.claim", batch_size))
            .await;
        self.metrics
            .claim(started.elapsed(), batch.as_ref().ok().map(Vec::len));
        let batch = batch?;
        if !batch.is_empty() {
            guarded(&self.hooks, "on_claimed", |h| h.on_claimed(batch.len()));
        }
        Ok(batch)
    }

    /// Publishes and acknowledges one claimed batch inside its `relay.batch` span; the
    /// error is the one `run` must stop with (a fatal publish error).
    async fn process(&mut self, batch: Vec<Claimed>) -> (BatchReport, Option<Error>) {
        let _in_flight = self.metrics.in_flight();
        let started = Instant::now();
        let span = tracing::info_span!(
            "relay.batch",
            size = batch.len(),
            published = Empty,
            failed = Empty,
            requeued = Empty,
            dead = Empty,
            duration_ms = Empty,
        );
        let (report, fatal) = self
            .process_batch(batch, started)
            .instrument(span.clone())
            .await;
        span.record("published", report.published);
        span.record("failed", report.failed);
        span.record("requeued", report.requeued);
        span.record("dead", report.dead);
        span.record("duration_ms", started.elapsed().as_millis() as u64);
        span.in_scope(|| tracing::debug!(?report, "batch acknowledged"));

        let fatal = fatal.map(|(id, error)| {
            let error = Error::Publisher(format!(
                "the publisher reported a fatal error for outbox message {id}: {}; the relay \
                 handed the message back (claimable again, no attempt counted), acknowledged \
                 the rest of its batch and stopped. Fix the publisher (credentials, \
                 permissions, broker address, settings) and start the relay again",
                error.message
            ));
            tracing::error!(%error, "relay stopped");
            self.loop_error(&error);
            error
        });
        (report, fatal)
    }

    async fn process_batch(
        &mut self,
        batch: Vec<Claimed>,
        claimed_at: Instant,
    ) -> (BatchReport, Option<(i64, PublishError)>) {
        // Past the claim timeout another claim may own these rows, so retrying a failed
        // acknowledgement beyond it is pointless: the reaper will hand them out again.
        let deadline = claimed_at + self.config.claim_timeout;
        let mut report = BatchReport {
            claimed: batch.len(),
            ..BatchReport::default()
        };
        let policy = self.config.retry.clone();

        // One pass, into vectors sized up front: a batch of a thousand messages is a
        // quarter of a megabyte, and growing or copying it again costs more than the
        // relay's own bookkeeping (examples/bench_kafka.rs).
        let mut undecodable = Vec::new();
        let mut exhausted = Vec::new();
        let mut batch_to_publish = Vec::with_capacity(batch.len());
        for claimed in batch {
            match claimed {
                Claimed::Message(message)
                    if attempts_of(message.attempts) >= policy.max_attempts =>
                {
                    exhausted.push(message)
                }
                Claimed::Message(message) => batch_to_publish.push(message),
                Claimed::Undecodable(row) => undecodable.push(row),
            }
        }
        let batch = batch_to_publish;
        // A row that cannot be decoded never will be: it goes dead like a poison message,
        // and the rest of the batch is published as usual.
        let mut dead: Vec<(DeadLetter<'_>, PublishError)> = undecodable
            .iter()
            .map(|row| {
                let error = PublishError::poison(format!(
                    "the outbox row cannot be decoded: {}; not published",
                    row.error
                ));
                (DeadLetter::Undecodable(row), error)
            })
            .collect();

        dead.extend(exhausted.iter().map(|m| {
            let error = PublishError::poison(format!(
                "{} attempts used up by expired claims (max_attempts {}); not published again",
                m.attempts, policy.max_attempts
            ));
            (DeadLetter::Message(m), error)
        }));

        let outcomes = self.publish(&batch).await;

        // Successes grouped by claim token (one group in practice: a claim has one token).
        let mut done: Vec<(ClaimToken, Vec<i64>)> = Vec::new();
        let mut done_index: HashMap<ClaimToken, usize> = HashMap::new();
        let mut retries: Vec<(&ClaimedMessage, Duration, PublishError)> = Vec::new();
        let mut requeues: Vec<(&ClaimedMessage, PublishError)> = Vec::new();
        let mut handed_back: Vec<&ClaimedMessage> = Vec::new();
        let mut fatal: Option<(i64, PublishError)> = None;
        for (message, outcome) in batch.iter().zip(outcomes) {
            let error = match outcome {
                Ok(()) => {
                    let group = *done_index.entry(message.claim_token).or_insert_with(|| {
                        done.push((message.claim_token, Vec::new()));
                        done.len() - 1
                    });
                    done[group].1.push(message.id);
                    report.published += 1;
                    self.metrics.published(&message.topic, 1);
                    continue;
                }
                Err(error) => error,
            };
            match error.kind {
                ErrorKind::Retriable => {
                    let attempts = attempts_of(message.attempts).saturating_add(1);
                    match policy.next_delay(attempts, &mut self.rng) {
                        RetryDecision::RetryAfter(delay) => retries.push((message, delay, error)),
                        RetryDecision::Dead => dead.push((DeadLetter::Message(message), error)),
                    }
                }
                ErrorKind::Poison => dead.push((DeadLetter::Message(message), error)),
                ErrorKind::Fatal => {
                    if fatal.is_none() {
                        fatal = Some((message.id, error.clone()));
                    }
                    guarded(&self.hooks, "on_fatal", |h| h.on_fatal(message.id, &error));
                    // The message is not at fault: the publisher is. Marking it dead (or
                    // counting an attempt) would punish it for a broken credential; it
                    // waits for a relay that can publish it.
                    handed_back.push(message);
                }
                ErrorKind::Backpressure => requeues.push((message, error)),
            }
        }

        // Successes first and in one call: they unblock the next message of each aggregate.
        for (token, ids) in &done {
            self.acknowledge(Ack::Done(ids, *token), deadline, &mut report)
                .await;
        }
        if report.published > 0 {
            guarded(&self.hooks, "on_published", |h| {
                h.on_published(report.published)
            });
        }

        for (message, delay, error) in &retries {
            let text = error_text(error);
            let ack = Ack::Failed {
                id: message.id,
                token: message.claim_token,
                retry_after: Some(*delay),
                dead: false,
                error: &text,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.failed += 1;
            self.metrics.failed(&message.topic, error.kind);
            tracing::debug!(id = message.id, topic = %message.topic, error_class = error.kind.as_str(), ?delay, %error, "message failed; will retry");
            guarded(&self.hooks, "on_failed", |h| h.on_failed(message.id, error));
        }

        let requeue_after = policy.initial;
        for (message, error) in &requeues {
            let ack = Ack::Requeue {
                id: message.id,
                token: message.claim_token,
                after: requeue_after,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.requeued += 1;
            self.metrics.requeued(&message.topic, error.kind);
            guarded(&self.hooks, "on_requeued", |h| {
                h.on_requeued(message.id, error)
            });
        }

        // Due at once: the relay stops after this batch, and the next one to run (after
        // the fix, or another of the fleet) should not wait for it.
        for message in &handed_back {
            let ack = Ack::Requeue {
                id: message.id,
                token: message.claim_token,
                after: Duration::ZERO,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.requeued += 1;
            self.metrics.requeued(&message.topic, ErrorKind::Fatal);
            tracing::warn!(
                id = message.id,
                "message handed back after a fatal publish error"
            );
        }

        // Dead-letter before marking dead: a crash in between re-publishes the dead letter
        // (at least once) instead of losing it.
        for (letter, error) in &dead {
            let id = letter.id();
            let attempts = attempts_of(letter.attempts()).saturating_add(1);
            let headers = dead_letter_headers(*letter, attempts, error);
            if let Err(dl_error) = self.dead_letter(*letter, &headers).await {
                tracing::warn!(id, error = %dl_error, "dead-letter publish failed");
                guarded(&self.hooks, "on_dead_letter_failed", |h| {
                    h.on_dead_letter_failed(id, &dl_error)
                });
            }
            let text = error_text(error);
            let ack = Ack::Failed {
                id,
                token: letter.claim_token(),
                retry_after: None,
                dead: true,
                error: &text,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.dead += 1;
            self.metrics.dead(letter.topic(), error.kind);
            tracing::warn!(id, topic = letter.topic().unwrap_or(""), error_class = error.kind.as_str(), %error, "message dead");
            guarded(&self.hooks, "on_dead", |h| h.on_dead(id, error));
        }

        (report, fatal)
    }

    /// Calls the publisher, turning a panic, a hang past the claim timeout or a wrong
    /// number of outcomes into a retriable failure of the whole batch.
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let n = batch.len();
        let _publishing = self.metrics.publish_timer();
        // The call sits inside the async block so a panic before its first await is
        // caught too.
        let call = AssertUnwindSafe(async { self.publisher.publish(batch).await }).catch_unwind();
        let problem = match timeout(self.config.claim_timeout, call).await {
            Ok(Ok(outcomes)) if outcomes.len() == n => return outcomes,
            // The outcomes cannot be matched to the messages, so none is trusted: an `Ok`
            // taken for the wrong message would acknowledge one that was never published.
            Ok(Ok(outcomes)) => format!(
                "the publisher returned {} outcomes for a batch of {n}; a Publisher must \
                 return exactly one per message, in order",
                outcomes.len()
            ),
            Ok(Err(payload)) => format!(
                "the publisher panicked: {}",
                panic_message(payload.as_ref())
            ),
            Err(_) => format!(
                "the publisher did not finish within the claim timeout ({:?})",
                self.config.claim_timeout
            ),
        };
        self.loop_error(&Error::Publisher(format!(
            "{problem}; the whole batch of {n} is retried"
        )));
        vec![Err(PublishError::retriable(problem)); n]
    }

    async fn dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &crate::outbox::Headers,
    ) -> Result<(), PublishError> {
        let call =
            AssertUnwindSafe(async { self.publisher.publish_dead_letter(letter, headers).await })
                .catch_unwind();
        match timeout(self.config.claim_timeout, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(payload)) => Err(PublishError::retriable(format!(
                "the dead-letter publish panicked: {}",
                panic_message(payload.as_ref())
            ))),
            Err(_) => Err(PublishError::retriable(format!(
                "the dead-letter publish did not finish within the claim timeout ({:?})",
                self.config.claim_timeout
            ))),
        }
    }

    /// Runs one acknowledgement, retrying store errors with back-off until the claim's
    /// deadline, and counts fenced-off rows as lost claims.
    async fn acknowledge(&mut self, ack: Ack<'_>, deadline: Instant, report: &mut BatchReport) {
        let _acknowledging = self.metrics.ack_timer(ack.name());
        let mut failures = 0u32;
        loop {
            let result = match &ack {
                Ack::Done(ids, token) => self.store.mark_done(ids, *token).await,
                Ack::Failed {
                    id,
                    token,
                    retry_after,
                    dead,
                    error,
                } => {
                    self.store
                        .mark_failed(*id, *token, *retry_after, *dead, error)
                        .await
                }
                Ack::Requeue { id, token, after } => self.store.requeue(*id, *token, *after).await,
            };
            match result {
                Ok(changed) => {
                    let lost = ack.expected().saturating_sub(changed);
                    if lost > 0 {
                        report.claim_lost += lost;
                        self.metrics.claims_lost(lost);
                        tracing::warn!(
                            op = ack.name(),
                            lost,
                            "acknowledgement fenced off: the claim expired and another claim \
                             holds the message; it will be published again"
                        );
                        guarded(&self.hooks, "on_claim_lost", |h| h.on_claim_lost(lost));
                    }
                    return;
                }
                Err(error) if !error.is_transient() => {
                    // A missing grant (229) or procedure (2812) fails every retry the same
                    // way; retrying until the deadline would only hold up the batch.
                    self.loop_error(&error);
                    tracing::warn!(
                        op = ack.name(),
                        %error,
                        "giving up on an acknowledgement at once: the store error is not \
                         transient; its messages will be claimed and published again"
                    );
                    report.unacknowledged += ack.expected() as usize;
                    return;
                }
                Err(error) => {
                    self.loop_error(&error);
                    failures = failures.saturating_add(1);
                    let delay = self.config.retry.backoff(failures, &mut self.rng);
                    if Instant::now() + delay >= deadline {
                        tracing::warn!(
                            op = ack.name(),
                            "giving up on an acknowledgement: the claim is about to expire, \
                             and its messages will be claimed and published again"
                        );
                        report.unacknowledged += ack.expected() as usize;
                        return;
                    }
                    sleep(delay).await;
                }
            }
        }
    }

    fn loop_error(&self, error: &Error) {
        self.metrics.loop_error();
        tracing::warn!(%error, transient = error.is_transient(), "relay loop error");
        guarded(&self.hooks, "on_loop_error", |h| h.on_loop_error(error));
    }
}

/// A message's failed attempts so far (its `attempts` column), as the policy counts them.
fn attempts_of(attempts: i32) -> u32 {
    u32::try_from(attempts).unwrap_or(0)
}

/// What the outbox's error column gets.
fn error_text(error: &PublishError) -> String {
    format!("{}: {}", error.kind, error.message)
}
