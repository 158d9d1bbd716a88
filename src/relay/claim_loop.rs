//! The claim loop: when to claim, the claim itself (and how a claim that waits on the
//! server is stopped while it waits), the batches in flight, and shutdown.

use std::future::Future;
use std::pin::pin;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use super::hooks::guarded;
use super::pace::Pace;
use super::shared::Shared;
use super::{BatchReport, Hooks, MAX_STORE_RETRY_DELAY, Publisher, SHUTDOWN_CLAIM_GRACE};
use crate::error::{Error, Result};
use crate::outbox::{ClaimStore, Claimed};

/// How a claim call ended.
pub(super) enum ClaimEnd {
    /// The store answered.
    Answered(Result<Vec<Claimed>>),
    /// A claim of a store that waits for work was stopped before it answered (shutdown,
    /// or a batch in flight needed the store) and cancelled on the server.
    Cancelled,
}

impl<S: ClaimStore, P: Publisher, H: Hooks> Shared<'_, S, P, H> {
    /// The claim loop: up to `max_in_flight` batches between claim and acknowledgement,
    /// each one future ([`process`](Self::process): publish, then acknowledge) polled
    /// alongside the next claim; [`Pace`] says when that claim may start.
    pub(super) async fn run(
        &self,
        wake: &Notify,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        let mut shutdown = pin!(shutdown);
        let max_in_flight = self.config.max_in_flight as usize;
        let mut in_flight = FuturesUnordered::new();
        let mut pace = Pace::Now;
        let mut store_failures = 0u32;
        // Whether the last claim came back full, so more is probably due. A store whose
        // claim waits for work claims beside batches in flight only then: a claim that
        // finds nothing would hold the connection their acknowledgements need, and be
        // cancelled by the first of them (a new connection each time).
        let mut last_full = false;
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

            let room = in_flight.len() < max_in_flight
                && (in_flight.is_empty() || !self.claim_waits || last_full);
            if room && pace.claims_at(Instant::now()) {
                // With a concurrent handle, a batch that is ready to acknowledge (an
                // instant publisher's, or one whose delivery reports have just arrived)
                // sends its acknowledgement before this claim goes out: on a connection
                // the two share, the server runs it first, so the aggregates it finishes
                // are due for this claim, and neither call waits for the other's answer.
                // Claiming first instead let claims run ahead of the acknowledgements:
                // every relay held `max_in_flight` batches of heads claimed, and four
                // relays over 1000 aggregates ran at half the speed of one (BENCHMARKS.md).
                if self.acknowledges_beside_claims()
                    && let Some(Some(done)) = in_flight.next().now_or_never()
                {
                    self.settle(done, &mut pace, &mut fatal);
                    continue;
                }
                // A wake stored before this claim starts is answered by the claim itself;
                // dropping it saves a needless claim after this one.
                let _ = wake.notified().now_or_never();
                let claim_started = Instant::now();
                let claim = self.claim();
                let mut claim = pin!(claim);
                // Abandoning a claim that did commit leaves its rows claimed until the
                // timeout (and charged an attempt), so a claim under way when shutdown
                // comes gets a grace period; a hanging one does not hold shutdown. A claim
                // that waits for work is in its normal state: while it waits, it is stopped
                // at once and cancelled on the server (by `claim` itself, which still
                // answers); once it answers, it gets the grace like any other.
                let mut grace_ends = claim_started;
                let claimed = loop {
                    tokio::select! {
                        biased;
                        end = claim.as_mut() => break Some(end),
                        () = shutdown.as_mut(), if !stopping => {
                            stopping = true;
                            grace_ends = Instant::now() + SHUTDOWN_CLAIM_GRACE;
                            if self.claim_waits {
                                self.stop_waiting_claim();
                            }
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
                match claimed {
                    // Shutdown: the loop's first check drains the batches in flight.
                    None => {}
                    // Shutdown, or a batch in flight needed the store: nothing was due
                    // when the claim began waiting, and the acknowledgement goes first.
                    Some(ClaimEnd::Cancelled) => last_full = false,
                    Some(ClaimEnd::Answered(Ok(batch))) if batch.is_empty() => {
                        store_failures = 0;
                        last_full = false;
                        // Counted from the claim's start: a claim that waited on the
                        // server for work has usually waited poll_interval already.
                        pace.idle(claim_started + self.config.poll_interval);
                    }
                    Some(ClaimEnd::Answered(Ok(batch))) => {
                        store_failures = 0;
                        last_full = batch.len() >= self.config.batch_size as usize;
                        // Claim again at once, unless a batch that finished while
                        // this claim ran paused the claims for backpressure.
                        pace.claimed();
                        in_flight.push(self.process(batch, Instant::now()));
                    }
                    Some(ClaimEnd::Answered(Err(error))) => {
                        store_failures = store_failures.saturating_add(1);
                        last_full = false;
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
                        pace.store_failed(Instant::now() + delay);
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

    /// One claim. A claim of a store that waits for work is stopped when shutdown comes or
    /// a batch in flight needs the store while it still waits, and then cancelled on the
    /// server (the relay's call is gone, so nothing would take the rows it might still
    /// claim). Once the store says the claim answers, it is let finish.
    pub(super) async fn claim(&self) -> ClaimEnd {
        let batch_size = self.config.batch_size;
        let claim_timeout = self.config.claim_timeout;
        let mut store = self.store_for_claim().await;
        if self.claim_waits && self.claim_must_stop() {
            // Nothing sent yet, so nothing to cancel.
            return ClaimEnd::Cancelled;
        }
        self.claim_begins();
        let started = Instant::now();
        let call = store
            .claim(batch_size, claim_timeout)
            .instrument(tracing::debug_span!("relay.claim", batch_size));
        let batch = if self.claim_waits {
            let answer = tokio::select! {
                // The call first: what has arrived of its answer is read, and the store
                // says it answers, before an interruption is looked at; an answer already
                // here is never taken for a wait.
                biased;
                batch = call => Some(batch),
                () = self.claim_interrupted() => None,
            };
            match answer {
                Some(batch) => batch,
                None => {
                    store.cancel_claim().await;
                    if self.stopping() {
                        tracing::info!("relay shutting down: cancelled its waiting claim");
                    } else {
                        tracing::debug!(
                            "cancelled a waiting claim: a batch in flight is being acknowledged"
                        );
                    }
                    return ClaimEnd::Cancelled;
                }
            }
        } else {
            call.await
        };
        self.metrics
            .claim(started.elapsed(), batch.as_ref().ok().map(Vec::len));
        if let Ok(batch) = &batch
            && !batch.is_empty()
        {
            guarded(self.hooks, "on_claimed", |h| h.on_claimed(batch.len()));
        }
        ClaimEnd::Answered(batch)
    }
}
