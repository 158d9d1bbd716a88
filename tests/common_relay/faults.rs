//! The relay's fault scenarios, written once for every store whose server a test can freeze
//! (MariaDB's and PostgreSQL's private servers): a server frozen under an acknowledgement
//! and then under a claim, and shutdown while it is frozen. Each store's suite starts the
//! server and the relay, and hands them over through [`FaultTarget`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Running, wait_until};

/// How long the scenarios keep a server frozen.
pub const FROZEN: Duration = Duration::from_secs(20);
/// The claim timeout of the relays in the fault suites: every store call is bounded by it.
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(3);

/// A store's test server and database, as the scenarios use them.
pub trait FaultTarget {
    /// Freezes the server: nothing answers, the connections stay open.
    fn freeze(&self);
    /// Lets the frozen server go on.
    fn thaw(&self);
    /// Enqueues `count` messages into `outbox` in one committed transaction; their ids.
    async fn enqueue(&self, outbox: &str, count: usize) -> Vec<i64>;
    /// How many messages of `outbox` are done.
    async fn done(&self, outbox: &str) -> i64;
}

/// `running` relays `outbox` (`enqueued` messages in it) and has published its first batch,
/// which froze the server (the relay's publisher did), so that batch's `mark_done` meets the
/// frozen server; later the server freezes again while the relay idles (its claim meets
/// it). The calls come back as errors while it is frozen instead of hanging, the relay
/// resumes after it, every message is published, and only the batch whose acknowledgement
/// never succeeded is published again.
pub async fn a_frozen_server_neither_hangs_the_relay_nor_loses_a_message<W>(
    target: &impl FaultTarget,
    outbox: &str,
    enqueued: usize,
    running: Running<W>,
) {
    let frozen_at = Instant::now();
    // Its mark_done gives up at the claim timeout, the next claim's connect at the connect
    // timeout: errors, not a hang.
    wait_until("two store errors while frozen", FROZEN, async || {
        running.errors.count() >= 2
    })
    .await;
    assert!(!running.relay.is_finished(), "the relay keeps going");
    tokio::time::sleep(FROZEN.saturating_sub(frozen_at.elapsed())).await;
    target.thaw();
    let all = i64::try_from(enqueued).unwrap();
    wait_until("every message done after the thaw", secs(60), async || {
        target.done(outbox).await == all
    })
    .await;

    // Mid-claim: frozen while the relay polls.
    let before = running.errors.count();
    target.freeze();
    let frozen_at = Instant::now();
    wait_until("a claim error while frozen", FROZEN, async || {
        running.errors.count() > before
    })
    .await;
    tokio::time::sleep(FROZEN.saturating_sub(frozen_at.elapsed())).await;
    target.thaw();
    let more = target.enqueue(outbox, 5).await;
    wait_until(
        "the messages enqueued after the thaw",
        secs(30),
        async || target.done(outbox).await == all + 5,
    )
    .await;
    let publisher = Arc::clone(&running.publisher);
    running.stop(secs(30)).await;

    let counts = publisher.counts();
    assert_eq!(
        counts.len(),
        enqueued + 5,
        "every message published: {counts:?}"
    );
    assert!(more.iter().all(|id| counts.contains_key(id)));
    let first: BTreeSet<i64> = publisher.batches()[0].iter().copied().collect();
    for (id, times) in &counts {
        assert!(
            *times == 1 || first.contains(id),
            "message {id} was published {times} times, but only the frozen batch's \
             acknowledgement failed"
        );
    }
}

/// `running` has published its first batch, which froze the server, so its acknowledgement
/// hangs: shutdown returns within the claim timeout (the bound of the hanging call), not
/// when the server comes back.
pub async fn shutdown_during_an_acknowledgement_to_a_frozen_server_is_bounded<W>(
    target: &impl FaultTarget,
    running: Running<W>,
) {
    let took = running.stop(FROZEN).await;
    assert!(
        took < CLAIM_TIMEOUT + secs(5),
        "shutdown took {took:?} with the server frozen"
    );
    target.thaw();
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
