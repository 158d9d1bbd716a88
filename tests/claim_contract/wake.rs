//! A relay woken by its store's waker (MariaDB's binlog waker, PostgreSQL's LISTEN waker):
//! what both wakers promise, written once. The relay's own poll is a minute, so only the
//! waker can move it quickly; each store's test file starts its waker and cuts its
//! connection, and the checks here are the same for both.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::outbox::ClaimStore;
use changefeed::relay::{Relay, RelayConfig, RelayHandle};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Recorder;

/// The relay's own poll: longer than any wait of these tests.
pub const RELAY_POLL: Duration = Duration::from_secs(60);

/// Resolves once [`WokenRelay::stop`] is called: the shutdown future of a waker.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// The two kinds of a waker's state the tests wait for: it follows its source (`awake`),
/// or it polls instead (`polling`, after a cut or when it cannot connect).
pub struct Kinds<S> {
    pub awake: fn(&S) -> bool,
    pub polling: fn(&S) -> bool,
}

/// A relay over a store whose own poll is [`RELAY_POLL`], with the store's waker.
pub struct WokenRelay<S> {
    pub recorder: Arc<Recorder>,
    pub state: watch::Receiver<S>,
    kinds: Kinds<S>,
    stop: watch::Sender<bool>,
    relay: JoinHandle<changefeed::Result<()>>,
}

impl<S: Clone + Debug + Send + Sync + 'static> WokenRelay<S> {
    /// Starts the relay over `store` and the waker `start_waker` makes and spawns for the
    /// relay's handle; it gets a stop switch to pass to [`stopped`] and returns its state.
    pub fn start<C: ClaimStore + Send + 'static>(
        store: C,
        kinds: Kinds<S>,
        start_waker: impl FnOnce(RelayHandle, watch::Receiver<bool>) -> watch::Receiver<S>,
    ) -> Self {
        let recorder = Arc::new(Recorder::default());
        let config = RelayConfig::default().poll_interval(RELAY_POLL);
        let relay = Relay::new(store, Arc::clone(&recorder), config).unwrap();
        let (stop, stopped_rx) = watch::channel(false);
        let state = start_waker(relay.handle(), stopped_rx.clone());
        let relay = tokio::spawn(relay.run(stopped(stopped_rx)));
        WokenRelay {
            recorder,
            state,
            kinds,
            stop,
            relay,
        }
    }

    /// [`Self::start`], then waits (30 s at most) until the waker follows its source and
    /// the relay's first claim (at its start) is over.
    pub async fn start_awake<C: ClaimStore + Send + 'static>(
        store: C,
        kinds: Kinds<S>,
        start_waker: impl FnOnce(RelayHandle, watch::Receiver<bool>) -> watch::Receiver<S>,
    ) -> Self {
        let relay = Self::start(store, kinds, start_waker);
        relay.until_awake(Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        relay
    }

    /// Waits at most `limit` for the waker to follow its source; returns its state then.
    pub async fn until_awake(&self, limit: Duration) -> S {
        self.until(self.kinds.awake, limit, "follows its source")
            .await
    }

    /// Waits at most `limit` for the waker to poll; returns its state then.
    pub async fn until_polling(&self, limit: Duration) -> S {
        self.until(self.kinds.polling, limit, "polls").await
    }

    async fn until(&self, kind: fn(&S) -> bool, limit: Duration, what: &str) -> S {
        let mut state = self.state.clone();
        match tokio::time::timeout(limit, state.wait_for(kind)).await {
            Ok(reached) => reached.expect("the waker's state").clone(),
            Err(_) => panic!(
                "the waker never {what} within {limit:?}: {:?}",
                *self.state.borrow()
            ),
        }
    }

    /// Whether the waker follows its source now.
    pub fn awake(&self) -> bool {
        (self.kinds.awake)(&self.state.borrow())
    }

    /// How long after `committed` message `id` was published (10 s at most, else a panic:
    /// the relay itself polls every minute).
    pub async fn published_after(&self, id: i64, committed: Instant) -> Duration {
        let published = self
            .recorder
            .wait_for(id, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| {
                panic!("message {id} was not published within 10 s (the relay polls every 60 s)")
            });
        published.saturating_duration_since(committed)
    }

    /// Stops the waker and the relay; the relay ends cleanly within 30 s.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(30), self.relay)
            .await
            .expect("the relay stops within 30 s")
            .expect("the relay's task")
            .expect("the relay ends without an error");
    }
}

/// Twenty commits (`commit(n)` enqueues and commits message `n` and returns its id), each
/// published within milliseconds although the relay polls once a minute; after ten the
/// waker's connection is cut (`cut()` returns how many connections it ended: one), the
/// waker says it polls, then follows its source again, and the wake is as fast again.
/// `source` names the wake in the printed figures.
pub async fn commits_wake_the_relay_within_milliseconds<S>(
    relay: &WokenRelay<S>,
    source: &str,
    commit: impl AsyncFn(usize) -> i64,
    cut: impl AsyncFn() -> usize,
) where
    S: Clone + Debug + Send + Sync + 'static,
{
    let mut latencies = Vec::new();
    for n in 0..20 {
        if n == 10 {
            assert_eq!(cut().await, 1, "the waker's connection was there to cut");
            relay.until_polling(Duration::from_secs(10)).await;
            relay.until_awake(Duration::from_secs(10)).await;
        }
        let id = commit(n).await;
        let committed = Instant::now();
        latencies.push(relay.published_after(id, committed).await);
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let worst = *latencies.last().unwrap();
    eprintln!(
        "{source} wake, commit to publish: median {median:?}, worst {worst:?} (20 commits, \
         the connection cut and resumed after 10)"
    );
    // The bound: far below any poll interval. The benchmarks measure the real figures; a
    // shared CI machine gets a generous margin here.
    assert!(
        median < Duration::from_millis(100),
        "median {median:?}: {latencies:?}"
    );
    assert!(
        worst < Duration::from_secs(2),
        "worst {worst:?}: {latencies:?}"
    );
}
