//! Acknowledging a message by its outcome: one store call, kept as data so a failed call
//! can be retried as it was, until the claim's deadline.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::hooks::guarded;
use super::shared::Shared;
use super::{BatchReport, Hooks, Publisher};
use crate::outbox::{ClaimStore, ClaimToken, Failed};

/// One acknowledgement, kept as data so a failed store call can be retried as it was.
pub(super) enum Ack<'a> {
    Done(&'a [i64], ClaimToken),
    Failed(Failed<'a>),
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
            Ack::Failed(_) => "mark_failed",
            Ack::Requeue { .. } => "requeue",
        }
    }

    /// The store call, on `store`.
    async fn send(&self, store: &mut impl ClaimStore) -> crate::error::Result<u64> {
        match self {
            Ack::Done(ids, token) => store.mark_done(ids, *token).await,
            Ack::Failed(failed) => store.mark_failed(*failed).await,
            Ack::Requeue { id, token, after } => store.requeue(*id, *token, *after).await,
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

impl<S: ClaimStore, P: Publisher, H: Hooks> Shared<'_, S, P, H> {
    /// Runs one acknowledgement, retrying store errors with back-off until the claim's
    /// deadline, and counts fenced-off rows as lost claims.
    pub(super) async fn acknowledge(
        &self,
        ack: Ack<'_>,
        deadline: Instant,
        report: &mut BatchReport,
    ) {
        let _acknowledging = self.metrics.ack_timer(ack.name());
        let mut failures = 0u32;
        loop {
            // On a concurrent handle of its own when the store has them (out at once, beside
            // a claim), else on the store, one call at a time, the lock held only for the
            // call: a claim or another batch's acknowledgement may go between two of this
            // batch's calls, and a back-off below sleeps without holding up the others.
            let result = match self.acknowledger() {
                Some(mut handle) => ack.send(&mut handle).await,
                None => ack.send(&mut **self.store().await).await,
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
}
