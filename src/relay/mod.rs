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
mod pace;
mod policy;
mod publisher;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rand::rngs::StdRng;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::Instrument;
use tracing::field::Empty;

pub use config::{MAX_BATCH_SIZE, MAX_CLAIM_TIMEOUT, MAX_IN_FLIGHT, RelayConfig};
pub use hooks::{Hooks, NoHooks};
pub use json_lines::JsonLines;
pub use policy::{MAX_RETRY_DELAY, RetryDecision, RetryPolicy};
pub use publisher::{
    DeadLetter, ErrorKind, HEADER_ATTEMPTS, HEADER_ERROR, HEADER_ERROR_KIND, HEADER_ORIGINAL_TOPIC,
    PublishError, PublishOutcome, Publisher, dead_letter_headers,
};

use crate::error::{Error, Result};
use crate::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage};
use hooks::{guarded, panic_message};
use pace::Pace;

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
/// * up to [`max_in_flight`](RelayConfig::max_in_flight) batches are between claim and
///   acknowledgement at once: each claimed batch is published at once, the next claim
///   starts while earlier batches are being delivered, and each batch is acknowledged as
///   its outcomes arrive (store calls one at a time). Per-aggregate order holds because a
///   claimed message stays claimed until acknowledged, and no claim takes a message
///   while an earlier one of its aggregate is claimed (see ARCHITECTURE.md);
/// * a claim that returned messages is followed at once by the next claim when there is
///   room (acknowledging an aggregate's head makes its next message claimable); a batch
///   in which nothing was published or marked dead holds the next claim back
///   `poll_interval` (so a broker that fails everything is not hammered), one in which
///   something met backpressure holds it back `retry.initial`, wakes or not;
/// * a claim that found nothing waits `poll_interval`, or less when
///   [`RelayHandle::wake`] is called or a batch in flight moves something; a wake that
///   arrives while the relay claims or publishes is kept and ends the next wait at once;
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
/// * shutdown starts no claim and lets every batch in flight finish (publish and
///   acknowledge it; they run side by side, so that takes as long as the slowest, not
///   their sum) and returns; a claim under way when shutdown comes gets
///   [`SHUTDOWN_CLAIM_GRACE`] to answer (its batch is then finished too) and is abandoned
///   after that;
/// * a [fatal](ErrorKind::Fatal) publish error likewise ends the claims, lets every batch
///   in flight finish, and then ends `run` with the error.
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

    /// Runs the relay until `shutdown` completes, then finishes every batch in flight
    /// (publishes and acknowledges it) and returns `Ok(())`.
    ///
    /// Returns an [`Error::Publisher`] when the publisher reports a
    /// [fatal](ErrorKind::Fatal) error, after handing the fatal messages back and
    /// acknowledging the rest of that batch and every other batch in flight. Store errors
    /// never end it: they are reported and retried.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Relay {
            mut store,
            publisher,
            hooks,
            config,
            wake,
            mut rng,
        } = self;
        Shared::new(&mut store, &publisher, &hooks, &config, &mut rng)
            .run(&wake, shutdown)
            .await
    }

    /// Claims one batch and publishes and acknowledges it, for callers that drive their
    /// own loop (a scheduled job, a test). Returns an empty report when nothing was due,
    /// the store's error when the claim failed, and an [`Error::Publisher`] after a
    /// [fatal](ErrorKind::Fatal) publish error (the fatal messages are handed back and the
    /// rest of the batch acknowledged first).
    pub async fn run_once(&mut self) -> Result<BatchReport> {
        let shared = Shared::new(
            &mut self.store,
            &self.publisher,
            &self.hooks,
            &self.config,
            &mut self.rng,
        );
        let batch = shared.claim().await.inspect_err(|e| shared.loop_error(e))?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        match shared.process(batch, Instant::now()).await {
            (_, Some(error)) => Err(error),
            (report, None) => Ok(report),
        }
    }
}

/// What the claim loop and every batch in flight share: the store (one call at a time:
/// it is one connection), the publisher (called for several batches at once), the hooks,
/// the settings and the random source of the back-offs.
struct Shared<'a, S, P, H> {
    store: tokio::sync::Mutex<&'a mut S>,
    publisher: &'a P,
    hooks: &'a H,
    config: &'a RelayConfig,
    rng: std::sync::Mutex<&'a mut StdRng>,
}

impl<'a, S: ClaimStore, P: Publisher, H: Hooks> Shared<'a, S, P, H> {
    fn new(
        store: &'a mut S,
        publisher: &'a P,
        hooks: &'a H,
        config: &'a RelayConfig,
        rng: &'a mut StdRng,
    ) -> Self {
        Shared {
            store: tokio::sync::Mutex::new(store),
            publisher,
            hooks,
            config,
            rng: std::sync::Mutex::new(rng),
        }
    }

    /// The random source, for one draw (never held across an await).
    fn rng(&self) -> std::sync::MutexGuard<'_, &'a mut StdRng> {
        self.rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The claim loop: up to `max_in_flight` batches between claim and acknowledgement,
    /// each one future ([`process`](Self::process): publish, then acknowledge) polled
    /// alongside the next claim; [`Pace`] says when that claim may start.
    async fn run(&self, wake: &Notify, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut shutdown = pin!(shutdown);
        let max_in_flight = self.config.max_in_flight as usize;
        let mut in_flight = FuturesUnordered::new();
        let mut pace = Pace::Now;
        let mut store_failures = 0u32;
        // Set when shutdown completed (a completed future must not be polled again): no
        // claim starts after it, and the batches in flight are finished.
        let mut stopping = false;
        // The first fatal publish error: no claim starts after it either, and `run` returns
        // it once the batches in flight are finished.
        let mut fatal: Option<Error> = None;
        loop {
            if stopping || fatal.is_some() {
                if stopping {
                    tracing::info!(in_flight = in_flight.len(), "relay shutting down");
                }
                // Every batch in flight is published already (or being published): its
                // outcomes are acknowledged, so none waits out the claim timeout.
                while let Some((_, error)) = in_flight.next().await {
                    if fatal.is_none() {
                        fatal = error;
                    }
                }
                return fatal.map_or(Ok(()), Err);
            }

            let room = in_flight.len() < max_in_flight;
            if room && pace.claims_at(Instant::now()) {
                // A wake stored before this claim starts is answered by the claim itself;
                // dropping it saves a needless claim after this one.
                let _ = wake.notified().now_or_never();
                let claim = self.claim();
                let mut claim = pin!(claim);
                // Abandoning a claim that did commit leaves its rows claimed until the
                // timeout (and charged an attempt), so a claim under way when shutdown
                // comes gets a grace period; a hanging one does not hold shutdown.
                let mut grace_ends = Instant::now();
                let claimed = loop {
                    tokio::select! {
                        biased;
                        result = claim.as_mut() => break Some(result),
                        () = shutdown.as_mut(), if !stopping => {
                            stopping = true;
                            grace_ends = Instant::now() + SHUTDOWN_CLAIM_GRACE;
                        }
                        () = sleep_until(grace_ends), if stopping => {
                            tracing::warn!(
                                grace = ?SHUTDOWN_CLAIM_GRACE,
                                "relay shutting down: abandoned a claim that did not answer"
                            );
                            break None;
                        }
                        Some(done) = in_flight.next() => self.settle(done, &mut pace, &mut fatal),
                    }
                };
                let claimed_at = Instant::now();
                match claimed {
                    None => {}
                    Some(Ok(batch)) if batch.is_empty() => {
                        store_failures = 0;
                        pace.idle(claimed_at + self.config.poll_interval);
                    }
                    Some(Ok(batch)) => {
                        store_failures = 0;
                        // Acknowledging an aggregate's head makes its next message
                        // claimable, and other aggregates may have more: claim again.
                        pace = Pace::Now;
                        in_flight.push(self.process(batch, claimed_at));
                    }
                    Some(Err(error)) => {
                        store_failures = store_failures.saturating_add(1);
                        self.loop_error(&error);
                        // Capped low: an outage's back-off must not outlast the outage by
                        // minutes. A wake (an enqueuer's, or the binlog waker's reconnect)
                        // says the database may be back, so it ends the wait too.
                        let delay = self
                            .config
                            .retry
                            .backoff(store_failures, &mut *self.rng())
                            .max(self.config.poll_interval)
                            .min(MAX_STORE_RETRY_DELAY);
                        pace.store_failed(claimed_at + delay);
                    }
                }
                continue;
            }

            let claim_at = pace.until();
            tokio::select! {
                biased;
                () = shutdown.as_mut() => stopping = true,
                Some(done) = in_flight.next() => self.settle(done, &mut pace, &mut fatal),
                () = wake.notified(), if room && pace.wakeable() => pace = Pace::Now,
                () = sleep_until(claim_at), if room => pace = Pace::Now,
            }
        }
    }

    /// Takes in what a finished batch came to: a fatal error ends the claims, the rest
    /// sets the pace of the next claim.
    fn settle(
        &self,
        (report, error): (BatchReport, Option<Error>),
        pace: &mut Pace,
        fatal: &mut Option<Error>,
    ) {
        match error {
            Some(error) => {
                fatal.get_or_insert(error);
            }
            None => pace.after_batch(&report, Instant::now(), self.config),
        }
    }

    async fn claim(&self) -> Result<Vec<Claimed>> {
        let batch_size = self.config.batch_size;
        let claim_timeout = self.config.claim_timeout;
        let batch = async {
            self.store
                .lock()
                .await
                .claim(batch_size, claim_timeout)
                .await
        }
        .instrument(tracing::debug_span!("relay.claim", batch_size))
        .await?;
        if !batch.is_empty() {
            guarded(self.hooks, "on_claimed", |h| h.on_claimed(batch.len()));
        }
        Ok(batch)
    }

    /// Publishes and acknowledges one claimed batch inside its `relay.batch` span; the
    /// error is the one `run` must stop with (a fatal publish error).
    async fn process(
        &self,
        batch: Vec<Claimed>,
        claimed_at: Instant,
    ) -> (BatchReport, Option<Error>) {
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
            .process_batch(batch, claimed_at)
            .instrument(span.clone())
            .await;
        span.record("published", report.published);
        span.record("failed", report.failed);
        span.record("requeued", report.requeued);
        span.record("dead", report.dead);
        span.record("duration_ms", claimed_at.elapsed().as_millis() as u64);
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
        &self,
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
                    continue;
                }
                Err(error) => error,
            };
            match error.kind {
                ErrorKind::Retriable => {
                    let attempts = attempts_of(message.attempts).saturating_add(1);
                    match policy.next_delay(attempts, &mut *self.rng()) {
                        RetryDecision::RetryAfter(delay) => retries.push((message, delay, error)),
                        RetryDecision::Dead => dead.push((DeadLetter::Message(message), error)),
                    }
                }
                ErrorKind::Poison => dead.push((DeadLetter::Message(message), error)),
                ErrorKind::Fatal => {
                    if fatal.is_none() {
                        fatal = Some((message.id, error.clone()));
                    }
                    guarded(self.hooks, "on_fatal", |h| h.on_fatal(message.id, &error));
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
            guarded(self.hooks, "on_published", |h| {
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
            tracing::debug!(id = message.id, ?delay, %error, "message failed; will retry");
            guarded(self.hooks, "on_failed", |h| h.on_failed(message.id, error));
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
            guarded(self.hooks, "on_requeued", |h| {
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
                guarded(self.hooks, "on_dead_letter_failed", |h| {
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
            tracing::warn!(id, %error, "message dead");
            guarded(self.hooks, "on_dead", |h| h.on_dead(id, error));
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
    async fn acknowledge(&self, ack: Ack<'_>, deadline: Instant, report: &mut BatchReport) {
        let mut failures = 0u32;
        loop {
            // One store call at a time, the lock held only for the call: a claim or another
            // batch's acknowledgement may go between two of this batch's calls, and a
            // back-off below sleeps without holding up the others.
            let mut store = self.store.lock().await;
            let result = match &ack {
                Ack::Done(ids, token) => store.mark_done(ids, *token).await,
                Ack::Failed {
                    id,
                    token,
                    retry_after,
                    dead,
                    error,
                } => {
                    store
                        .mark_failed(*id, *token, *retry_after, *dead, error)
                        .await
                }
                Ack::Requeue { id, token, after } => store.requeue(*id, *token, *after).await,
            };
            drop(store);
            match result {
                Ok(changed) => {
                    let lost = ack.expected().saturating_sub(changed);
                    if lost > 0 {
                        report.claim_lost += lost;
                        tracing::warn!(
                            op = ack.name(),
                            lost,
                            "acknowledgement fenced off: the claim expired and another claim \
                             holds the message; it will be published again"
                        );
                        guarded(self.hooks, "on_claim_lost", |h| h.on_claim_lost(lost));
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
                    let delay = self.config.retry.backoff(failures, &mut *self.rng());
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
        tracing::warn!(%error, transient = error.is_transient(), "relay loop error");
        guarded(self.hooks, "on_loop_error", |h| h.on_loop_error(error));
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
