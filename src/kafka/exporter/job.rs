//! What the shards of one run share ([`Job`]: the producer, the settings, the cursor
//! store) and how each sees shutdown ([`Stop`]). Its own module so that the shard loop and
//! the delivery of a page, which both work on a `Job`, import it and not each other.

use std::time::Duration;

use rdkafka::producer::FutureProducer;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::ExportMetrics;

use super::config::ExportConfig;
use super::message::Messages;
use super::progress::ExportProgress;

/// Everything the shards of one run share.
pub(super) struct Job<C> {
    pub(super) producer: FutureProducer,
    pub(super) config: ExportConfig,
    pub(super) messages: Messages,
    pub(super) progress: ExportProgress,
    pub(super) metrics: ExportMetrics,
    /// One store for all shards; a save is short, so they take turns.
    pub(super) cursors: tokio::sync::Mutex<C>,
    /// Shards produce their pages under its read side; a suspect event is produced alone
    /// under its write side, so no other shard's message shares its request.
    pub(super) producing: tokio::sync::RwLock<()>,
}

/// The shutdown signal as each shard sees it: when shutdown was asked, if it was.
#[derive(Clone)]
pub(super) struct Stop(watch::Receiver<Option<Instant>>);

impl Stop {
    /// The signal of `receiver`, which holds the instant shutdown was asked.
    pub(super) fn new(receiver: watch::Receiver<Option<Instant>>) -> Self {
        Stop(receiver)
    }

    /// Whether shutdown was asked.
    pub(super) fn is_requested(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Completes when shutdown is asked (at once if it was).
    pub(super) async fn requested(&mut self) {
        // The sender lives as long as `run`, which outlives every shard: an error cannot
        // happen, and would mean stopping anyway.
        let _ = self.0.wait_for(Option::is_some).await;
    }

    /// Completes `grace` after shutdown was asked: the page in flight is given up then.
    pub(super) async fn grace_over(&mut self, grace: Duration) {
        self.requested().await;
        let asked = (*self.0.borrow()).unwrap_or_else(Instant::now);
        tokio::time::sleep_until(asked + grace).await;
    }
}
