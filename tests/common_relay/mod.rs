//! What the relay tests share: a relay test at one batch in flight and at several (the
//! relay's fault behaviour must not depend on `max_in_flight`), the check that a relay
//! was stopped by a publisher's fatal error, and what the fault suites run: a relay on a
//! task of its own with a publisher that records what it published and hooks that count
//! its errors, stopped within a bound.

#![allow(dead_code)] // each test file uses part of it

pub mod faults;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::Error;
use changefeed::outbox::{ClaimStore, ClaimedMessage};
use changefeed::relay::{Hooks, PublishOutcome, Publisher, Relay, RelayConfig, RelayHandle};
use tokio::sync::watch;

/// For an `async fn name(max_in_flight: u32)` of the same file, two tests that call it:
/// `name::one_batch_in_flight` (1) and `name::four_batches_in_flight` (4), each on a
/// two-worker runtime (a relay, a broker and a database at once) and with the given
/// attributes (an `#[ignore]`).
#[allow(unused_macros)] // a test file that runs its variants its own way
macro_rules! in_flight_variants {
    ($(#[$attr:meta])* $name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn one_batch_in_flight() {
                super::$name(1).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn four_batches_in_flight() {
                super::$name(4).await
            }
        }
    };
}

/// The text of the error a relay's run returned, which must be a publisher's fatal error
/// (the one kind that stops a relay while its store and publisher still answer).
pub fn fatal_publisher_text(run: changefeed::Result<()>) -> String {
    match run.expect_err("a fatal error stops the relay") {
        changefeed::Error::Publisher(text) => text,
        other => panic!("expected a publisher error, got {other:?}"),
    }
}

/// What a publisher runs once, right after its first batch is published: a fault test's
/// freeze of the server, so that the batch's acknowledgement meets it.
type AfterFirstBatch = Box<dyn FnOnce() + Send>;

/// A publisher that records each batch (every message succeeds) and runs what
/// [`after_the_first_batch`](Self::after_the_first_batch) gave it after the first.
#[derive(Default)]
pub struct Recording {
    batches: Mutex<Vec<Vec<i64>>>,
    after_first: Mutex<Option<AfterFirstBatch>>,
}

impl Publisher for Recording {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        self.batches
            .lock()
            .unwrap()
            .push(batch.iter().map(|m| m.id).collect());
        let after_first = self.after_first.lock().unwrap().take();
        if let Some(fault) = after_first {
            fault();
        }
        vec![Ok(()); batch.len()]
    }
}

impl Recording {
    /// Runs `fault` right after the next batch is published.
    pub fn after_the_first_batch(&self, fault: impl FnOnce() + Send + 'static) {
        *self.after_first.lock().unwrap() = Some(Box::new(fault));
    }

    /// The ids of each batch published, in order.
    pub fn batches(&self) -> Vec<Vec<i64>> {
        self.batches.lock().unwrap().clone()
    }

    /// How often each id was published.
    pub fn counts(&self) -> BTreeMap<i64, usize> {
        let mut counts = BTreeMap::new();
        for id in self.batches().concat() {
            *counts.entry(id).or_default() += 1;
        }
        counts
    }
}

/// The relay's loop errors, counted.
#[derive(Default)]
pub struct Errors(Mutex<Vec<String>>);

impl Hooks for Errors {
    fn on_loop_error(&self, error: &Error) {
        self.0.lock().unwrap().push(error.to_string());
    }
}

impl Errors {
    /// How many errors the relay's loop met so far.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Polls `condition` every 50 ms until it holds; fails the test after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Completes once `stop` says stop: the shutdown future of a relay or a waker.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// What a fault test starts for a relay beside it: the store's waker for the relay's
/// handle, stopped with the relay (the receiver), returning the waker's state.
pub type StartWaker<W> = Box<dyn FnOnce(RelayHandle, watch::Receiver<bool>) -> watch::Receiver<W>>;

/// A running relay (and its waker, when it has one).
pub struct Running<W> {
    pub publisher: Arc<Recording>,
    pub errors: Arc<Errors>,
    pub waker: Option<watch::Receiver<W>>,
    stop: watch::Sender<bool>,
    pub relay: tokio::task::JoinHandle<changefeed::Result<()>>,
}

/// Starts a relay over `store` with `config`, a [`Recording`] publisher and [`Errors`]
/// hooks, and `waker` beside it.
pub fn start_relay<S, W>(store: S, config: RelayConfig, waker: Option<StartWaker<W>>) -> Running<W>
where
    S: ClaimStore + Send + Sync + 'static,
{
    let publisher = Arc::new(Recording::default());
    let errors = Arc::new(Errors::default());
    let relay = Relay::new(store, Arc::clone(&publisher), config)
        .unwrap()
        .with_hooks(Arc::clone(&errors));
    let (stop, stop_receiver) = watch::channel(false);
    let waker = waker.map(|start| start(relay.handle(), stop_receiver.clone()));
    let relay = tokio::spawn(relay.run(stopped(stop_receiver)));
    Running {
        publisher,
        errors,
        waker,
        stop,
        relay,
    }
}

impl<W> Running<W> {
    /// Asks the relay to stop and waits up to `limit` for it: how long it took.
    pub async fn stop(self, limit: Duration) -> Duration {
        let asked = Instant::now();
        self.stop.send_replace(true);
        tokio::time::timeout(limit, self.relay)
            .await
            .unwrap_or_else(|_| panic!("the relay did not stop within {limit:?}"))
            .expect("the relay task")
            .expect("the relay ends without an error");
        asked.elapsed()
    }
}
