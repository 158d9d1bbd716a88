//! Callbacks for metrics and alerts, and the guard that keeps a faulty one from breaking
//! the relay.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::publisher::PublishError;
use crate::error::Error;

/// Callbacks the relay makes as it works, for metrics and alerts. Every method has a
/// no-op default, so implement only what you need.
///
/// Hooks run on the relay's task, between store calls: keep them quick (update a counter,
/// send on a channel). A hook that panics is caught and logged, and the relay carries on
/// as if it had returned.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use changefeed::relay::{Hooks, PublishError};
///
/// #[derive(Default)]
/// struct Counters {
///     published: AtomicU64,
///     dead: AtomicU64,
/// }
///
/// impl Hooks for Counters {
///     fn on_published(&self, count: usize) {
///         self.published.fetch_add(count as u64, Ordering::Relaxed);
///     }
///     fn on_dead(&self, _id: i64, _error: &PublishError) {
///         self.dead.fetch_add(1, Ordering::Relaxed);
///     }
/// }
/// ```
pub trait Hooks: Send + Sync {
    /// A claim returned `count` messages (only called when `count > 0`).
    fn on_claimed(&self, count: usize) {
        let _ = count;
    }

    /// The publisher accepted `count` messages of a batch (only called when `count > 0`).
    fn on_published(&self, count: usize) {
        let _ = count;
    }

    /// Message `id` failed and was marked failed, to be retried after a delay.
    fn on_failed(&self, id: i64, error: &PublishError) {
        let _ = (id, error);
    }

    /// Message `id` met backpressure and was handed back without counting an attempt.
    fn on_requeued(&self, id: i64, error: &PublishError) {
        let _ = (id, error);
    }

    /// Message `id` was marked dead: poison, undecodable, or a failure that reached
    /// `max_attempts`. Called after the dead-letter hand-off; `error` is what the row's
    /// `last_error` says: when the dead letter failed, the message's error followed by the
    /// dead letter's, naming the message's topic and the dead-letter destination.
    fn on_dead(&self, id: i64, error: &PublishError) {
        let _ = (id, error);
    }

    /// The publisher reported a fatal error for message `id`: the message is handed back
    /// (no attempt counted) and the relay stops after this batch (see
    /// [`ErrorKind::Fatal`](super::ErrorKind::Fatal)).
    fn on_fatal(&self, id: i64, error: &PublishError) {
        let _ = (id, error);
    }

    /// The dead-letter publish of message `id` failed (or panicked, or was not confirmed
    /// within three quarters of the claim timeout after the claim); the message is marked
    /// dead anyway (right after this call) and stays in the outbox.
    fn on_dead_letter_failed(&self, id: i64, error: &PublishError) {
        let _ = (id, error);
    }

    /// `count` acknowledgements changed nothing because the claim had expired and another
    /// claim holds the messages now: they will be published again. Frequent calls mean
    /// the claim timeout is shorter than a publish takes.
    fn on_claim_lost(&self, count: u64) {
        let _ = count;
    }

    /// Something went wrong outside a single message: a store call failed (the relay backs
    /// off and retries it), or the publisher panicked, timed out or returned the wrong
    /// number of outcomes (the batch is retried). Also called with the error `run` stops
    /// with after a fatal publish error.
    fn on_loop_error(&self, error: &Error) {
        let _ = error;
    }
}

/// The hooks of a relay built without any: every call does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// Lets a caller keep a handle on the hooks it gave the relay.
impl<H: Hooks + ?Sized> Hooks for Arc<H> {
    fn on_claimed(&self, count: usize) {
        (**self).on_claimed(count)
    }
    fn on_published(&self, count: usize) {
        (**self).on_published(count)
    }
    fn on_failed(&self, id: i64, error: &PublishError) {
        (**self).on_failed(id, error)
    }
    fn on_requeued(&self, id: i64, error: &PublishError) {
        (**self).on_requeued(id, error)
    }
    fn on_dead(&self, id: i64, error: &PublishError) {
        (**self).on_dead(id, error)
    }
    fn on_fatal(&self, id: i64, error: &PublishError) {
        (**self).on_fatal(id, error)
    }
    fn on_dead_letter_failed(&self, id: i64, error: &PublishError) {
        (**self).on_dead_letter_failed(id, error)
    }
    fn on_claim_lost(&self, count: u64) {
        (**self).on_claim_lost(count)
    }
    fn on_loop_error(&self, error: &Error) {
        (**self).on_loop_error(error)
    }
}

/// Calls one hook, catching a panic so that metrics code cannot take the relay down
/// (`AssertUnwindSafe`: after a panic the relay only reads its own state, which the hook
/// cannot reach).
pub(crate) fn guarded<H: Hooks + ?Sized>(hooks: &H, name: &'static str, call: impl FnOnce(&H)) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| call(hooks))) {
        tracing::warn!(
            hook = name,
            panic = %panic_message(payload.as_ref()),
            "a relay hook panicked; the relay carries on"
        );
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}
