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
//! | the claimed row cannot be decoded ([`Claimed::Undecodable`](crate::outbox::Claimed::Undecodable): payload or headers not readable JSON) | dead, never published | +1 | dead-letter hand-off with the raw text ([`DeadLetter::Undecodable`]) |
//!
//! A batch's dead letters are handed to [`Publisher::publish_dead_letter`] all at once,
//! before their rows are marked dead, and waited for until three quarters of the claim
//! timeout after the claim, leaving the last quarter for marking the rows dead while the
//! claim still holds them. A dead letter that fails (refused, panicked, or not confirmed by
//! then) leaves its row dead all the same, its `last_error` naming both errors, the
//! message's topic and the dead-letter destination; it is reported to
//! [`Hooks::on_dead_letter_failed`] and counted in
//! `changefeed_relay_dead_letters_failed_total`.
//!
//! A message claimed with `attempts >= max_attempts` (its earlier claims expired, e.g.
//! because publishing it crashed the relay process) is marked dead without being
//! published again.
//!
//! Delivery is at least once: a lost acknowledgement (crash, expired claim, store outage
//! longer than the claim timeout, a store error no retry fixes such as a missing grant)
//! means the message is published again.

mod acknowledge;
mod batch;
mod claim_loop;
mod config;
mod hooks;
mod json_lines;
mod pace;
mod policy;
mod publisher;
mod shared;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use config::{MAX_BATCH_SIZE, MAX_CLAIM_TIMEOUT, MAX_IN_FLIGHT, RelayConfig};
pub use hooks::{Hooks, NoHooks};
pub use json_lines::JsonLines;
pub use policy::{MAX_RETRY_DELAY, RetryDecision, RetryPolicy};
pub use publisher::{
    DeadLetter, ErrorKind, HEADER_ATTEMPTS, HEADER_ERROR, HEADER_ERROR_KIND, HEADER_ORIGINAL_TOPIC,
    PublishError, PublishOutcome, Publisher, dead_letter_headers,
};

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::metrics::RelayMetrics;
use crate::outbox::ClaimStore;
use claim_loop::ClaimEnd;
use shared::Shared;

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
///   its outcomes arrive (store calls one at a time; with the store's
///   [concurrent handles](ClaimStore::concurrent_handle), each acknowledgement goes out
///   on a handle of its own as soon as it is ready, before the next claim, and neither
///   waits for the other's answer). Per-aggregate order holds because a
///   claimed message stays claimed until acknowledged, and no claim takes a message
///   while an earlier one of its aggregate is claimed (see ARCHITECTURE.md);
/// * a claim that returned messages is followed at once by the next claim when there is
///   room (acknowledging an aggregate's head makes its next message claimable); a batch
///   in which nothing was published or marked dead holds the next claim back
///   `poll_interval` (so a broker that fails everything is not hammered), one in which
///   something met backpressure holds it back `retry.initial`, wakes or not;
/// * a claim that found nothing is followed by the next one `poll_interval` after it began,
///   or sooner when [`RelayHandle::wake`] is called or a batch in flight moves something; a
///   wake that arrives while the relay claims or publishes is kept and ends the next wait at
///   once. A store whose claim waits on the server for work ([`ClaimStore::claim_waits`],
///   e.g. [`SqlClaimStore`](crate::outbox_store::SqlClaimStore)) has usually spent that long
///   already, so the next claim follows at once and a new message is claimed within the
///   store's pause, not the poll interval. Such a claim holds the store's one connection
///   while it waits, so it runs beside batches in flight only after a full batch (more is
///   probably due), and a batch in flight that needs the store to acknowledge stops it
///   and cancels it on the server ([`ClaimStore::cancel_claim`]) while it waits; once it
///   answers ([`ClaimStore::claim_progress`]: its rows are claimed) the acknowledgement
///   waits for it instead;
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
///   after that, except a claim of a store that waits for work while it still waits: that
///   one is stopped at once and cancelled on the server ([`ClaimStore::cancel_claim`]);
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
/// #     async fn mark_failed(&mut self, _: changefeed::outbox::Failed<'_>) -> changefeed::Result<u64> { Ok(0) }
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
            metrics,
        } = self;
        let acknowledger = store.concurrent_handle();
        Shared::new(
            &mut store,
            acknowledger,
            &publisher,
            &hooks,
            &config,
            &metrics,
            &mut rng,
        )
        .run(&wake, shutdown)
        .await
    }

    /// Claims one batch and publishes and acknowledges it, for callers that drive their
    /// own loop (a scheduled job, a test). Returns an empty report when nothing was due,
    /// the store's error when the claim failed, and an [`Error::Publisher`] after a
    /// [fatal](ErrorKind::Fatal) publish error (the fatal messages are handed back and the
    /// rest of the batch acknowledged first).
    pub async fn run_once(&mut self) -> Result<BatchReport> {
        // One batch: its acknowledgement follows its claim, nothing would overlap.
        let shared = Shared::new(
            &mut self.store,
            None,
            &self.publisher,
            &self.hooks,
            &self.config,
            &self.metrics,
            &mut self.rng,
        );
        // No batch is in flight and nothing stops this claim, so it is answered.
        let ClaimEnd::Answered(batch) = shared.claim().await else {
            return Ok(BatchReport::default());
        };
        let batch = batch.inspect_err(|e| shared.loop_error(e))?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        match shared.process(batch, Instant::now()).await {
            (_, Some(error)) => Err(error),
            (report, None) => Ok(report),
        }
    }
}
