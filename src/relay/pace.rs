//! When the relay's next claim may start, from what the last claim and the batches that
//! finished since came to.

use tokio::time::Instant;

use super::BatchReport;
use super::config::RelayConfig;

/// When the next claim may start (it also needs room: fewer than `max_in_flight` batches
/// in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pace {
    /// At once.
    Now,
    /// At `until`, or earlier on a [`RelayHandle::wake`](super::RelayHandle::wake) when
    /// `wakeable`, or when a batch in flight moves something (publishes a message or
    /// marks one dead) when `on_progress`.
    Wait {
        until: Instant,
        wakeable: bool,
        on_progress: bool,
    },
}

impl Pace {
    /// Whether the next claim may start at `now`.
    pub(super) fn claims_at(&self, now: Instant) -> bool {
        match self {
            Pace::Now => true,
            Pace::Wait { until, .. } => *until <= now,
        }
    }

    /// When the wait ends by itself (now for [`Pace::Now`]).
    pub(super) fn until(&self) -> Instant {
        match self {
            Pace::Now => Instant::now(),
            Pace::Wait { until, .. } => *until,
        }
    }

    pub(super) fn wakeable(&self) -> bool {
        matches!(self, Pace::Wait { wakeable: true, .. })
    }

    /// A backpressure pause, which neither a wake nor progress cuts short.
    fn paused(&self) -> bool {
        matches!(
            self,
            Pace::Wait {
                wakeable: false,
                ..
            }
        )
    }

    /// A claim found nothing: wait until `until`, a wake, or a batch in flight that makes
    /// an aggregate's next message claimable.
    pub(super) fn idle(&mut self, until: Instant) {
        if !self.paused() {
            *self = Pace::Wait {
                until,
                wakeable: true,
                on_progress: true,
            };
        }
    }

    /// A claim returned messages: claim again at once (acknowledging an aggregate's head
    /// makes its next message claimable, and other aggregates may have more), unless a
    /// batch that finished while the claim ran set a backpressure pause: the claim's
    /// messages say nothing about the broker, so the pause stands.
    pub(super) fn claimed(&mut self) {
        if !self.paused() {
            *self = Pace::Now;
        }
    }

    /// A claim failed: wait until `until` (the back-off) or a wake, which says the
    /// database may be back.
    pub(super) fn store_failed(&mut self, until: Instant) {
        if !self.paused() {
            *self = Pace::Wait {
                until,
                wakeable: true,
                on_progress: false,
            };
        }
    }

    /// A batch finished at `now` with `report`:
    /// * something met backpressure: no claim for `retry.initial`, whatever wakes;
    /// * nothing moved (every message failed): wait `poll_interval` (or a wake, or another
    ///   batch's progress), so a broker that fails everything is not hammered;
    /// * something moved: an idle wait ends, since the messages after those acknowledged
    ///   are claimable now.
    pub(super) fn after_batch(&mut self, report: &BatchReport, now: Instant, config: &RelayConfig) {
        if report.requeued > 0 {
            let until = match *self {
                Pace::Wait {
                    until,
                    wakeable: false,
                    ..
                } => until.max(now + config.retry.initial),
                _ => now + config.retry.initial,
            };
            *self = Pace::Wait {
                until,
                wakeable: false,
                on_progress: false,
            };
        } else if report.published + report.dead == 0 {
            self.idle(now + config.poll_interval);
        } else if matches!(
            self,
            Pace::Wait {
                on_progress: true,
                ..
            }
        ) {
            *self = Pace::Now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn report(published: usize, requeued: usize) -> BatchReport {
        BatchReport {
            claimed: published + requeued,
            published,
            requeued,
            ..BatchReport::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backpressure_outlasts_wakes_idleness_and_progress() {
        let config = RelayConfig::default();
        let now = Instant::now();
        let mut pace = Pace::Now;
        pace.after_batch(&report(0, 1), now, &config);
        let pause_ends = now + config.retry.initial;
        assert_eq!(pace.until(), pause_ends);
        assert!(!pace.wakeable());
        pace.idle(now + Duration::from_millis(1));
        pace.store_failed(now + Duration::from_millis(1));
        pace.after_batch(&report(5, 0), now, &config);
        assert_eq!(pace.until(), pause_ends);
        assert!(!pace.claims_at(pause_ends - Duration::from_millis(1)));
        assert!(pace.claims_at(pause_ends));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_that_returned_messages_keeps_a_backpressure_pause() {
        let config = RelayConfig::default();
        let now = Instant::now();
        let mut pace = Pace::Now;
        pace.after_batch(&report(0, 1), now, &config);
        pace.claimed();
        assert_eq!(pace.until(), now + config.retry.initial);
        assert!(!pace.claims_at(now));

        let mut pace = Pace::Now;
        pace.idle(now + config.poll_interval);
        pace.claimed();
        assert_eq!(pace, Pace::Now);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_ends_an_idle_wait_but_not_a_store_back_off() {
        let config = RelayConfig::default();
        let now = Instant::now();
        let mut pace = Pace::Now;
        pace.idle(now + config.poll_interval);
        assert!(pace.wakeable());
        pace.after_batch(&report(1, 0), now, &config);
        assert_eq!(pace, Pace::Now);

        pace.store_failed(now + Duration::from_secs(1));
        pace.after_batch(&report(1, 0), now, &config);
        assert!(!pace.claims_at(now));
        assert!(pace.wakeable());
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_moved_nothing_waits_the_poll_interval() {
        let config = RelayConfig::default();
        let now = Instant::now();
        let mut pace = Pace::Now;
        pace.after_batch(&report(0, 0), now, &config);
        assert_eq!(pace.until(), now + config.poll_interval);
        assert!(pace.wakeable());
    }
}
