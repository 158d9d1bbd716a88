//! What the claim loop and every batch in flight share, and the one way to the store
//! they all go through.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rand::rngs::StdRng;
use tokio::sync::{Mutex, MutexGuard, Notify};

use super::RelayConfig;
use super::hooks::guarded;
use super::{Hooks, Publisher};
use crate::error::Error;
use crate::metrics::RelayMetrics;
use crate::outbox::{ClaimProgress, ClaimStore};

/// What the claim loop and every batch in flight share: the store (one call at a time:
/// it is one connection) and its concurrent handle if it has one (each acknowledgement's
/// way to the store then, on a handle of its own), the publisher (called for several
/// batches at once), the hooks, the settings, the metrics and the random source of the
/// back-offs.
pub(super) struct Shared<'a, S, P, H> {
    store: Mutex<&'a mut S>,
    /// The store's [concurrent handle](ClaimStore::concurrent_handle), when it has one:
    /// each acknowledgement takes a handle of its own from it, so that it goes out at once,
    /// beside a claim under way or another batch's acknowledgement. (In a mutex only so that
    /// `Shared` is `Sync` for a store that is only `Send`; held for the copy, never across
    /// an await.)
    handles: Option<std::sync::Mutex<S>>,
    pub(super) publisher: &'a P,
    pub(super) hooks: &'a H,
    pub(super) config: &'a RelayConfig,
    pub(super) metrics: &'a RelayMetrics,
    rng: std::sync::Mutex<&'a mut StdRng>,
    /// The store's claim may wait on the server for work ([`ClaimStore::claim_waits`]):
    /// such a claim is stopped and cancelled when the relay stops or when a batch in
    /// flight needs the store (see [`store`](Self::store)), while it still waits.
    pub(super) claim_waits: bool,
    /// How far such a claim has got, when the store says ([`ClaimStore::claim_progress`]):
    /// one that answers is not stopped.
    claim_progress: Option<ClaimProgress>,
    /// Set by the claim loop when shutdown comes.
    stopping: AtomicBool,
    /// Acknowledgements waiting for the store (only counted when `claim_waits`).
    store_wanted: AtomicUsize,
    /// Tells a waiting claim to look at `stopping` and `store_wanted` again.
    interrupt: Notify,
}

impl<'a, S: ClaimStore, P: Publisher, H: Hooks> Shared<'a, S, P, H> {
    pub(super) fn new(
        store: &'a mut S,
        handles: Option<S>,
        publisher: &'a P,
        hooks: &'a H,
        config: &'a RelayConfig,
        metrics: &'a RelayMetrics,
        rng: &'a mut StdRng,
    ) -> Self {
        Shared {
            claim_waits: store.claim_waits(),
            claim_progress: store.claim_progress(),
            store: Mutex::new(store),
            handles: handles.map(std::sync::Mutex::new),
            publisher,
            hooks,
            config,
            metrics,
            rng: std::sync::Mutex::new(rng),
            stopping: AtomicBool::new(false),
            store_wanted: AtomicUsize::new(0),
            interrupt: Notify::new(),
        }
    }

    /// The random source, for one draw (never held across an await).
    pub(super) fn rng(&self) -> std::sync::MutexGuard<'_, &'a mut StdRng> {
        self.rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A concurrent handle of the store's own, for one acknowledgement, when the store has
    /// them ([`ClaimStore::concurrent_handle`]): it goes out at once, waiting for no other
    /// call.
    pub(super) fn acknowledger(&self) -> Option<S> {
        self.handles
            .as_ref()?
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .concurrent_handle()
    }

    /// Whether acknowledgements go out beside claims, each on a concurrent handle.
    pub(super) fn acknowledges_beside_claims(&self) -> bool {
        self.handles.is_some()
    }

    /// The store, for one acknowledgement (the lock is held only for the call), when it
    /// has no concurrent handle. A claim that is waiting on the server for work holds the
    /// store's one connection for as long as it waits (seconds), while this batch's
    /// acknowledgement is what would make its aggregates' next messages due: so the waiting
    /// claim is told to stop and cancel itself, and the acknowledgement goes first (the lock
    /// is fair). A claim that already
    /// answers is not stopped (its rows are claimed): the acknowledgement goes next.
    pub(super) async fn store(&self) -> MutexGuard<'_, &'a mut S> {
        if !self.claim_waits {
            return self.store.lock().await;
        }
        let _wanted = Wanted::new(&self.store_wanted);
        self.interrupt.notify_waiters();
        self.store.lock().await
    }

    /// The store, for the claim loop's own call (a claim waits in line like any other).
    pub(super) async fn store_for_claim(&self) -> MutexGuard<'_, &'a mut S> {
        self.store.lock().await
    }

    /// Stops a claim that waits on the server for work: shutdown came.
    pub(super) fn stop_waiting_claim(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.interrupt.notify_waiters();
    }

    /// A claim of a store that waits for work begins: it waits until the store says it
    /// answers.
    pub(super) fn claim_begins(&self) {
        if let Some(progress) = &self.claim_progress {
            progress.waiting();
        }
    }

    /// Waits until a claim that waits on the server must stop (shutdown, or a batch in
    /// flight needs the store) while it still waits; at once if it must already. Never, once
    /// the store says the claim answers: stopped then, the rows it claimed would be held by
    /// nobody until the claim timeout, and claimed again at the cost of an attempt each.
    pub(super) async fn claim_interrupted(&self) {
        let notified = self.interrupt.notified();
        let mut notified = std::pin::pin!(notified);
        loop {
            // Registered before the check, so a notification between the two is not lost.
            notified.as_mut().enable();
            if self.claim_must_stop() && !self.claim_answers() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.interrupt.notified());
        }
    }

    /// Whether a claim that waits on the server must not start or go on waiting.
    pub(super) fn claim_must_stop(&self) -> bool {
        self.stopping() || self.store_wanted.load(Ordering::SeqCst) > 0
    }

    /// Whether the store said that the claim under way answers.
    fn claim_answers(&self) -> bool {
        self.claim_progress
            .as_ref()
            .is_some_and(ClaimProgress::is_answering)
    }

    /// Whether shutdown came while a claim was under way.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub(super) fn loop_error(&self, error: &Error) {
        self.metrics.loop_error();
        tracing::warn!(%error, transient = error.is_transient(), "relay loop error");
        guarded(self.hooks, "on_loop_error", |h| h.on_loop_error(error));
    }
}

/// One acknowledgement waiting for the store, counted until it has the lock (or its future
/// is dropped).
struct Wanted<'a>(&'a AtomicUsize);

impl<'a> Wanted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Wanted(count)
    }
}

impl Drop for Wanted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
