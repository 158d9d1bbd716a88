//! The claim-outbox contract, written once and run against every store that runs here
//! (`tests/live_postgres.rs`; the same scenarios hold for MariaDB and SQL Server). Each
//! scenario takes a [`ContractDb`]: a fresh outbox on one server, and the few
//! store-specific things a scenario needs (a second connection, an open transaction,
//! moving a row's times back, reading a row's state).
//!
//! What the contract says is ARCHITECTURE.md's "The claim protocol": no message is claimed
//! twice at once; head of aggregate only (an earlier open message of an aggregate blocks
//! only that aggregate, and the batch is refilled past it); acknowledgements are fenced by
//! the claim token; an expired claim is taken over with one attempt counted; failed rows
//! come back at their retry time, dead ones never; purge deletes only old done rows;
//! payloads come back exactly; an open enqueue delays only its own aggregate; a relay
//! killed mid-batch loses nothing.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage, Enqueued, NewMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
use serde_json::json;
use tokio::sync::{Barrier, oneshot};

pub const PENDING: i64 = 0;
pub const PROCESSING: i64 = 1;
pub const DONE: i64 = 2;
pub const FAILED: i64 = 3;
pub const DEAD: i64 = 4;

/// A claim timeout no test outlives.
pub const HELD: Duration = Duration::from_secs(3600);

/// One outbox on one server, as the contract needs it.
pub trait ContractDb: Sync {
    /// The store under test.
    type Store: ClaimStore + Sync + 'static;

    /// A new store (its own connection) over the outbox.
    fn store(&self) -> Self::Store;

    /// Enqueues `messages` in one committed transaction.
    fn enqueue_committed(&self, messages: &[NewMessage]) -> impl Future<Output = Vec<Enqueued>>;

    /// Starts a transaction on a connection of its own that enqueues `message` and stays
    /// open until [`OpenEnqueue::finish`]. Returns at once: the insert may wait (for a lock
    /// the store's ordering takes).
    fn enqueue_open(&self, message: NewMessage) -> impl Future<Output = OpenEnqueue>;

    /// `(status, attempts)` of row `id`.
    fn state(&self, id: i64) -> impl Future<Output = (i64, i64)>;

    /// Moves the time `column` of rows `ids` back by `by`, as if that time had passed.
    fn age(&self, column: &str, by: Duration, ids: &[i64]) -> impl Future<Output = ()>;

    /// How many rows satisfy `condition` (SQL over the outbox's columns).
    fn count(&self, condition: &str) -> impl Future<Output = i64>;

    /// The store's `purge_done`.
    fn purge_done(
        &self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> impl Future<Output = u64>;
}

/// An enqueue in a transaction that a test commits or rolls back when it likes.
pub struct OpenEnqueue {
    inserted: oneshot::Receiver<Enqueued>,
    finish: oneshot::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

impl OpenEnqueue {
    /// Wraps the task of a store's harness: it sends the enqueued row on `inserted` once
    /// the insert returned, then commits on `true` from `finish` and rolls back on `false`
    /// (or when the sender is dropped).
    pub fn new(
        inserted: oneshot::Receiver<Enqueued>,
        finish: oneshot::Sender<bool>,
        done: tokio::task::JoinHandle<()>,
    ) -> Self {
        OpenEnqueue {
            inserted,
            finish,
            done,
        }
    }

    /// The row, once the insert has returned; `None` if it has not within `limit`.
    pub async fn inserted(&mut self, limit: Duration) -> Option<Enqueued> {
        match tokio::time::timeout(limit, &mut self.inserted).await {
            Ok(Ok(enqueued)) => Some(enqueued),
            Ok(Err(_)) => panic!("the enqueuing task failed"),
            Err(_) => None,
        }
    }

    /// Commits (`true`) or rolls back, and waits for it.
    pub async fn finish(self, commit: bool) {
        let _ = self.finish.send(commit);
        tokio::time::timeout(Duration::from_secs(60), self.done)
            .await
            .expect("the transaction ends within 60 s")
            .expect("the enqueuing task");
    }
}

pub fn message_of(aggregate: &str, n: usize) -> NewMessage {
    NewMessage::new("orders", json!({ "aggregate": aggregate, "n": n }))
        .aggregate("order", aggregate)
}

/// Claims and expects decodable messages only.
pub async fn claim<S: ClaimStore>(
    store: &mut S,
    batch: u32,
    timeout: Duration,
) -> Vec<ClaimedMessage> {
    store
        .claim(batch, timeout)
        .await
        .unwrap_or_else(|e| panic!("claim({batch}, {timeout:?}): {e}"))
        .into_iter()
        .map(|row| match row {
            Claimed::Message(message) => message,
            Claimed::Undecodable(row) => panic!("unexpected undecodable row {row:?}"),
        })
        .collect()
}

pub fn ids(batch: &[ClaimedMessage]) -> Vec<i64> {
    batch.iter().map(|m| m.id).collect()
}

#[track_caller]
pub fn token_of(batch: &[ClaimedMessage]) -> ClaimToken {
    let token = batch.first().expect("a non-empty claim").claim_token;
    assert!(batch.iter().all(|m| m.claim_token == token), "{batch:?}");
    token
}

/// A publisher that records what it got, and can be slow.
#[derive(Default)]
pub struct Recorder {
    pub published: Mutex<Vec<(i64, Instant)>>,
    pub calls: AtomicUsize,
    /// Sleep this long inside every publish (a slow broker).
    pub delay: Mutex<Duration>,
}

impl Publisher for Recorder {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let now = Instant::now();
        self.published
            .lock()
            .unwrap()
            .extend(batch.iter().map(|m| (m.id, now)));
        vec![Ok(()); batch.len()]
    }
}

impl Recorder {
    pub fn ids(&self) -> BTreeSet<i64> {
        self.published
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| *id)
            .collect()
    }

    /// When `id` was published, waiting at most `limit` for it.
    pub async fn wait_for(&self, id: i64, limit: Duration) -> Option<Instant> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some((_, at)) = self
                .published
                .lock()
                .unwrap()
                .iter()
                .find(|(x, _)| *x == id)
            {
                return Some(*at);
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        None
    }
}

// ------------------------------------------------------------------------------------------
// The scenarios
// ------------------------------------------------------------------------------------------

/// A rolled-back enqueue leaves nothing; a committed one is claimable; a message_id already
/// there returns the existing row instead of a second one.
pub async fn enqueue_is_transactional_and_idempotent<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let mut rolled_back = db.enqueue_open(message_of("r", 0)).await;
    let gone = rolled_back
        .inserted(Duration::from_secs(30))
        .await
        .expect("the insert returns");
    rolled_back.finish(false).await;
    assert_eq!(
        db.count(&format!("id = {}", gone.id)).await,
        0,
        "rolled back"
    );

    let keyed = NewMessage {
        message_id: Some("order-7-paid".to_owned()),
        ..message_of("k", 1)
    };
    let first = db.enqueue_committed(std::slice::from_ref(&keyed)).await;
    let again = db.enqueue_committed(std::slice::from_ref(&keyed)).await;
    assert_eq!(first[0].id, again[0].id, "one row per message_id");
    assert_eq!(first[0].message_id, "order-7-paid");
    assert_eq!(db.count("message_id = 'order-7-paid'").await, 1);
    let generated = db.enqueue_committed(&[message_of("g", 2)]).await;
    assert!(!generated[0].message_id.is_empty(), "a message_id is made");

    let claimed = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&claimed), vec![first[0].id, generated[0].id]);
    assert_eq!(claimed[0].message_id, "order-7-paid");
    assert_eq!(claimed[0].attempts, 0);
}

/// Heads only, in id order; the batch is refilled past dropped candidates; done and dead
/// unblock an aggregate, pending, processing and failed block it.
pub async fn head_of_aggregate_with_refill<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let e = db
        .enqueue_committed(&[
            message_of("a", 1),
            message_of("a", 2),
            message_of("a", 3),
            message_of("b", 1),
            message_of("c", 1),
        ])
        .await;
    // Two wanted: a1 and, past a2 and a3 (not heads), b1.
    let first = claim(&mut store, 2, HELD).await;
    assert_eq!(ids(&first), vec![e[0].id, e[3].id], "refilled past a2, a3");
    let second = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&second), vec![e[4].id], "a2 waits for a1 (processing)");
    assert_eq!(
        store.mark_done(&[e[0].id], token_of(&first)).await.unwrap(),
        1
    );
    let third = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&third), vec![e[1].id], "done a1 unblocks a2");
    // Failed a2 (retry in an hour) blocks a3; dead a2 unblocks it.
    let t = token_of(&third);
    assert_eq!(
        store
            .mark_failed(e[1].id, t, Some(HELD), false, "broker down")
            .await
            .unwrap(),
        1
    );
    assert!(
        claim(&mut store, 10, HELD).await.is_empty(),
        "a failed row blocks"
    );
    assert_eq!(db.state(e[1].id).await, (FAILED, 1));
    db.age("next_retry_at", HELD + Duration::from_secs(1), &[e[1].id])
        .await;
    let fourth = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&fourth), vec![e[1].id], "due again");
    assert_eq!(fourth[0].attempts, 1);
    store
        .mark_failed(e[1].id, token_of(&fourth), None, true, "poison")
        .await
        .unwrap();
    assert_eq!(db.state(e[1].id).await, (DEAD, 2));
    let fifth = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&fifth), vec![e[2].id], "dead unblocks the aggregate");
}

/// `claimers` concurrent claims, each on its own store, started together.
async fn concurrent_claims<D: ContractDb>(
    db: &D,
    claimers: usize,
    batch: u32,
) -> Vec<Vec<ClaimedMessage>> {
    let barrier = Arc::new(Barrier::new(claimers));
    let mut tasks = Vec::new();
    for _ in 0..claimers {
        let mut store = db.store();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            // Connect first (an acknowledgement of nothing held), so that the barrier
            // releases claims, not handshakes.
            store
                .mark_done(&[-1], ClaimToken::from_bytes([0; 16]))
                .await
                .unwrap();
            barrier.wait().await;
            claim(&mut store, batch, HELD).await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(
            tokio::time::timeout(Duration::from_secs(120), task)
                .await
                .expect("a claimer is stuck")
                .unwrap(),
        );
    }
    results
}

/// 6 claim-and-acknowledge loops over 30 aggregates of 3 messages: every message exactly
/// once, at most one message of an aggregate in flight, each aggregate in enqueue order.
pub async fn six_claimers_share_thirty_aggregates<D: ContractDb>(db: &D) {
    let messages: Vec<NewMessage> = (0..3)
        .flat_map(|n| (0..30).map(move |a| message_of(&format!("agg-{a}"), n)))
        .collect();
    let enqueued = db.enqueue_committed(&messages).await;
    let all: BTreeSet<i64> = enqueued.iter().map(|e| e.id).collect();
    let in_flight = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let order = Arc::new(Mutex::new(BTreeMap::<String, Vec<u64>>::new()));
    let seen = Arc::new(Mutex::new(BTreeSet::<i64>::new()));
    let barrier = Arc::new(Barrier::new(6));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut store = db.store();
        let (in_flight, order, seen, barrier) = (
            Arc::clone(&in_flight),
            Arc::clone(&order),
            Arc::clone(&seen),
            Arc::clone(&barrier),
        );
        let total = all.len();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let started = Instant::now();
            while seen.lock().unwrap().len() < total {
                assert!(started.elapsed() < Duration::from_secs(120), "no progress");
                let batch = claim(&mut store, 5, HELD).await;
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                for m in &batch {
                    let aggregate = m.aggregate_id.clone().unwrap();
                    assert!(seen.lock().unwrap().insert(m.id), "{} claimed twice", m.id);
                    assert!(
                        in_flight.lock().unwrap().insert(aggregate.clone()),
                        "two messages of {aggregate} in flight at once"
                    );
                    order
                        .lock()
                        .unwrap()
                        .entry(aggregate)
                        .or_default()
                        .push(m.payload["n"].as_u64().unwrap());
                }
                for m in &batch {
                    in_flight
                        .lock()
                        .unwrap()
                        .remove(m.aggregate_id.as_ref().unwrap());
                }
                let acked = store
                    .mark_done(&ids(&batch), token_of(&batch))
                    .await
                    .unwrap();
                assert_eq!(acked, batch.len() as u64);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), all);
    for (aggregate, ns) in order.lock().unwrap().iter() {
        assert_eq!(ns, &vec![0, 1, 2], "{aggregate} out of order");
    }
    assert_eq!(db.count("status = 2").await, 90);
}

/// 50 claimers at once on one aggregate of 5 messages: one claim, of its first message.
pub async fn fifty_claimers_on_one_aggregate<D: ContractDb>(db: &D) {
    let messages: Vec<NewMessage> = (0..5).map(|i| message_of("order-1", i)).collect();
    let enqueued = db.enqueue_committed(&messages).await;
    let claims: Vec<ClaimedMessage> = concurrent_claims(db, 50, 10)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(
        ids(&claims),
        vec![enqueued[0].id],
        "one claim, of the first row"
    );
    assert_eq!(claims[0].payload["n"], 0);
}

/// A claim expires by the timeout of the relay that made it, not by the timeout of the
/// relay that finds it: a relay with a 1 s timeout does not take a row another relay claimed
/// for 10 minutes, 5 s ago (issue 18: a fleet's effective timeout was its smallest).
pub async fn a_claim_expires_by_its_holders_timeout<D: ContractDb>(db: &D) {
    let (mut patient, mut hasty) = (db.store(), db.store());
    let e = db.enqueue_committed(&[message_of("h", 0)]).await;
    let held = claim(&mut patient, 10, Duration::from_secs(600)).await;
    assert_eq!(ids(&held), vec![e[0].id]);
    db.age("claimed_at", Duration::from_secs(5), &[e[0].id])
        .await;
    assert!(
        claim(&mut hasty, 10, Duration::from_secs(1))
            .await
            .is_empty(),
        "a relay with a shorter timeout took a claim its holder still owns"
    );
    assert_eq!(
        db.state(e[0].id).await,
        (1, 0),
        "still processing, no attempt"
    );
}

/// An expired claim is taken over (one attempt counted); the old token then changes
/// nothing, the new one does.
pub async fn reaper_and_fenced_acknowledgements<D: ContractDb>(db: &D) {
    let (mut first, mut second) = (db.store(), db.store());
    let e = db
        .enqueue_committed(&[message_of("f", 0), message_of("g", 0)])
        .await;
    let old = claim(&mut first, 10, Duration::from_secs(60)).await;
    assert_eq!(ids(&old), vec![e[0].id, e[1].id]);
    assert!(
        claim(&mut second, 10, Duration::from_secs(60))
            .await
            .is_empty(),
        "held"
    );
    // Every store keeps the claim's own expiry next to its time (issue 18): both move back.
    db.age("claimed_at", Duration::from_secs(61), &[e[0].id])
        .await;
    db.age("claim_expires_at", Duration::from_secs(61), &[e[0].id])
        .await;
    let taken = claim(&mut second, 10, Duration::from_secs(60)).await;
    assert_eq!(
        ids(&taken),
        vec![e[0].id],
        "only the expired claim is reaped"
    );
    assert_eq!(taken[0].attempts, 1, "an expired claim counts an attempt");
    let (t_old, t_new) = (token_of(&old), token_of(&taken));
    assert_ne!(t_old, t_new);
    assert_eq!(
        first.mark_done(&[e[0].id], t_old).await.unwrap(),
        0,
        "fenced"
    );
    assert_eq!(
        first
            .mark_failed(e[0].id, t_old, Some(Duration::ZERO), false, "x")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        first.requeue(e[0].id, t_old, Duration::ZERO).await.unwrap(),
        0
    );
    assert_eq!(db.state(e[0].id).await, (PROCESSING, 1));
    assert_eq!(second.mark_done(&[e[0].id], t_new).await.unwrap(), 1);
    assert_eq!(
        first.mark_done(&[e[1].id], t_old).await.unwrap(),
        1,
        "still held"
    );
    assert_eq!(db.count("status = 2").await, 2);
}

/// requeue hands a message back without an attempt; mark_failed counts one and sets the
/// retry time; dead is never claimed again; bad arguments are refused before the server.
pub async fn retry_requeue_and_dead<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let e = db.enqueue_committed(&[message_of("q", 0)]).await;
    let batch = claim(&mut store, 1, HELD).await;
    assert_eq!(
        store
            .requeue(e[0].id, token_of(&batch), Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        db.state(e[0].id).await,
        (FAILED, 0),
        "requeue counts no attempt"
    );
    let batch = claim(&mut store, 1, HELD).await;
    assert_eq!((ids(&batch), batch[0].attempts), (vec![e[0].id], 0));
    assert_eq!(
        store
            .mark_failed(
                e[0].id,
                token_of(&batch),
                Some(Duration::ZERO),
                false,
                "try again"
            )
            .await
            .unwrap(),
        1
    );
    let batch = claim(&mut store, 1, HELD).await;
    assert_eq!((ids(&batch), batch[0].attempts), (vec![e[0].id], 1));
    assert!(
        store
            .mark_failed(e[0].id, token_of(&batch), None, false, "x")
            .await
            .is_err(),
        "failed without a retry time is refused"
    );
    store
        .mark_failed(e[0].id, token_of(&batch), None, true, "give up")
        .await
        .unwrap();
    db.age("next_retry_at", HELD, &[e[0].id]).await;
    assert!(
        claim(&mut store, 10, HELD).await.is_empty(),
        "dead is terminal"
    );
    assert_eq!(db.state(e[0].id).await, (DEAD, 2));
    assert!(store.claim(0, HELD).await.is_err());
    assert!(store.claim(10_001, HELD).await.is_err());
}

/// purge_done deletes done rows older than the cutoff, in batches, up to max_rows, and
/// keeps dead, failed and recent done rows.
pub async fn purge_deletes_only_old_done_rows<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let messages: Vec<NewMessage> = (0..9).map(|i| message_of(&format!("p{i}"), i)).collect();
    let e = db.enqueue_committed(&messages).await;
    let batch = claim(&mut store, 9, HELD).await;
    let token = token_of(&batch);
    let done: Vec<i64> = e[..7].iter().map(|x| x.id).collect();
    store.mark_done(&done, token).await.unwrap();
    store
        .mark_failed(e[7].id, token, None, true, "dead")
        .await
        .unwrap();
    store
        .mark_failed(e[8].id, token, Some(HELD), false, "failed")
        .await
        .unwrap();
    let old: Vec<i64> = vec![
        e[0].id, e[1].id, e[2].id, e[3].id, e[4].id, e[7].id, e[8].id,
    ];
    db.age("processed_at", Duration::from_secs(7200), &old)
        .await;
    assert_eq!(
        db.purge_done(Duration::from_secs(3600), 2, Some(1)).await,
        1,
        "max_rows"
    );
    assert_eq!(
        db.purge_done(Duration::from_secs(3600), 2, None).await,
        4,
        "batches of 2"
    );
    assert_eq!(db.purge_done(Duration::from_secs(3600), 2, None).await, 0);
    assert_eq!(db.count("status = 2").await, 2, "recent done rows stay");
    assert_eq!(
        db.count("status in (3, 4)").await,
        2,
        "failed and dead stay"
    );
}

/// A 1 MB payload and Unicode everywhere come back exactly.
pub async fn unicode_and_one_megabyte_payloads_round_trip<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let big = "x".repeat(1024 * 1024);
    let unicode = NewMessage::new(
        "名前-topic",
        json!({"text": "héllo 🎉 \u{1F600} ß", "list": [1, 2.5, "∑"]}),
    )
    .aggregate("τύπος", "集計-🎉");
    let mut unicode = unicode;
    unicode
        .headers
        .insert("ключ".to_owned(), "значение 🎉".to_owned());
    unicode.trace_id = Some("trace-ü".to_owned());
    let large = NewMessage::new("big", json!({ "blob": big }));
    let e = db.enqueue_committed(&[unicode.clone(), large]).await;
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&batch), vec![e[0].id, e[1].id]);
    assert_eq!(batch[0].topic, unicode.topic);
    assert_eq!(batch[0].payload, unicode.payload);
    assert_eq!(batch[0].headers, unicode.headers);
    assert_eq!(batch[0].aggregate_id, unicode.aggregate_id);
    assert_eq!(batch[0].aggregate_type, unicode.aggregate_type);
    assert_eq!(
        batch[0].partition_key, unicode.aggregate_id,
        "defaults to the aggregate"
    );
    assert_eq!(batch[0].trace_id, unicode.trace_id);
    assert_eq!(
        batch[1].payload["blob"].as_str().map(str::len),
        Some(1024 * 1024)
    );
}

/// An open transaction's message is never claimed and delays only its own aggregate; a
/// second message of that aggregate (its insert may wait, depending on the store) is
/// never claimed before the first is done.
pub async fn an_open_enqueue_delays_only_its_aggregate<D: ContractDb>(db: &D) {
    let mut store = db.store();
    db.enqueue_committed(&[message_of("l", 0)]).await;
    let mut m1 = db.enqueue_open(message_of("m", 1)).await;
    let m1_row = m1
        .inserted(Duration::from_secs(30))
        .await
        .expect("m1 inserted");
    let later = db
        .enqueue_committed(&[message_of("n", 2), message_of("l", 3)])
        .await;
    let started = Instant::now();
    let claimed = ids(&claim(&mut store, 10, HELD).await);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the claim did not wait"
    );
    assert!(claimed.contains(&later[0].id), "{claimed:?}");
    assert!(
        !claimed.contains(&m1_row.id),
        "an uncommitted row is never claimed"
    );
    assert!(!claimed.contains(&later[1].id), "l3 waits for l0");

    // A second writer of m, committing as soon as its insert returns (on a store whose
    // enqueue waits for m1's transaction, that is after m1 commits).
    let mut m4 = db.enqueue_open(message_of("m", 4)).await;
    let m4_commit = tokio::spawn(async move {
        let row = m4
            .inserted(Duration::from_secs(60))
            .await
            .expect("m4 inserted");
        m4.finish(true).await;
        row
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = ids(&claim(&mut store, 10, HELD).await);
    assert!(
        again.is_empty(),
        "nothing of m is claimable while m1 is open: {again:?}"
    );
    m1.finish(true).await;
    let m4_row = tokio::time::timeout(Duration::from_secs(60), m4_commit)
        .await
        .expect("m4 commits once m1 has")
        .unwrap();
    assert!(
        m1_row.id < m4_row.id,
        "ids of an aggregate follow commit order"
    );
    let after = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&after), vec![m1_row.id], "m1 first");
    store
        .mark_done(&[m1_row.id], token_of(&after))
        .await
        .unwrap();
    assert_eq!(ids(&claim(&mut store, 10, HELD).await), vec![m4_row.id]);
}

/// A relay killed mid-batch leaves its claim; another relay publishes everything, the
/// killed batch after its claim timeout, with one attempt counted.
pub async fn a_relay_killed_mid_batch_loses_nothing<D: ContractDb>(db: &D) {
    relay_killed_mid_batch(db, 1).await;
}

/// The same with four batches in flight in each relay.
pub async fn a_relay_killed_with_batches_in_flight_loses_nothing<D: ContractDb>(db: &D) {
    relay_killed_mid_batch(db, 4).await;
}

async fn relay_killed_mid_batch<D: ContractDb>(db: &D, max_in_flight: u32) {
    let messages: Vec<NewMessage> = (0..40)
        .map(|i| message_of(&format!("k-{}", i % 8), i))
        .collect();
    let e = db.enqueue_committed(&messages).await;
    let all: BTreeSet<i64> = e.iter().map(|x| x.id).collect();
    let slow = Arc::new(Recorder::default());
    *slow.delay.lock().unwrap() = Duration::from_secs(30);
    let config = RelayConfig::default()
        .batch_size(10)
        .max_in_flight(max_in_flight)
        .claim_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50));
    let killed = Relay::new(db.store(), Arc::clone(&slow), config.clone()).unwrap();
    let task = tokio::spawn(killed.run(std::future::pending()));
    while slow.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    let _ = task.await;
    assert!(
        db.count("status = 1").await > 0,
        "the kill left a claim behind"
    );

    let survivor = Arc::new(Recorder::default());
    let relay = Relay::new(db.store(), Arc::clone(&survivor), config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(relay.run(async {
        stopped.await.ok();
    }));
    let started = Instant::now();
    while survivor.ids() != all {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not everything was published: {:?}",
            all.difference(&survivor.ids())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(db.count("status = 2").await, 40);
    assert!(
        db.count("attempts = 1").await > 0,
        "the killed batch counted an attempt"
    );
}
