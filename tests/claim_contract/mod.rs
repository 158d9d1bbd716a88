//! The claim-outbox contract, written once and run against every store: PostgreSQL
//! (`tests/live_postgres.rs`), MariaDB (`tests/contract_mysql.rs`) and SQL Server
//! (`tests/contract_mssql.rs`, under both READ_COMMITTED_SNAPSHOT settings). Each scenario
//! takes a [`ContractDb`]: a fresh outbox on one server, and the few store-specific things a
//! scenario needs (a second connection, an open transaction, moving a row's times back,
//! counting rows). What only one store has (its error numbers, its locks, its wake, its
//! DDL) is tested beside that store.
//!
//! What the contract says is ARCHITECTURE.md's "The claim protocol": no message is claimed
//! twice at once; head of aggregate only (an earlier open message of an aggregate blocks
//! only that aggregate, and the batch is refilled past it); acknowledgements are fenced by
//! the claim token; an expired claim is taken over with one attempt counted; failed rows
//! come back at their retry time, dead ones never; purge deletes only old done rows;
//! payloads come back exactly; an open enqueue delays only its own aggregate; a relay
//! killed mid-batch loses nothing.

#![allow(dead_code)] // each test binary uses its own part

#[cfg(feature = "cli")]
pub mod cli;
pub mod wake;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::outbox::{
    ClaimStore, ClaimToken, Claimed, ClaimedMessage, Enqueued, Failed, Headers, NewMessage,
};
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

    /// Moves the time `column` of rows `ids` back by `by`, as if that time had passed; a
    /// null time is taken as the server's now (so a row that never had one gets an old one,
    /// e.g. a pending row's `processed_at`, which purge must still leave alone).
    fn age(&self, column: &str, by: Duration, ids: &[i64]) -> impl Future<Output = ()>;

    /// How many rows satisfy `condition` (SQL over the outbox's columns; the scenarios use
    /// only comparisons with integers, ASCII strings and `is null`, which every store reads
    /// alike).
    fn count(&self, condition: &str) -> impl Future<Output = i64>;

    /// The store's `purge_done`.
    fn purge_done(
        &self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> impl Future<Output = changefeed::Result<u64>>;
}

/// An enqueue in a transaction that a test commits or rolls back when it likes.
pub struct OpenEnqueue {
    inserted: oneshot::Receiver<Enqueued>,
    finish: oneshot::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

/// The enqueuing task's end of an [`OpenEnqueue`].
pub struct Handover {
    inserted: oneshot::Sender<Enqueued>,
    finish: oneshot::Receiver<bool>,
}

impl Handover {
    /// Hands the enqueued `row` to the test, once the transaction counted it `own_count`
    /// times itself (it must see its own enqueue: once), and waits for the test's word:
    /// `true` to commit, `false` (or the [`OpenEnqueue`] dropped) to roll back.
    pub async fn commit_when_told(self, row: Enqueued, own_count: i64) -> bool {
        assert_eq!(own_count, 1, "the transaction sees its own enqueue");
        let _ = self.inserted.send(row);
        self.finish.await.unwrap_or(false)
    }
}

impl OpenEnqueue {
    /// Spawns the task `transaction` makes of a [`Handover`]: a store's harness begins a
    /// transaction on a connection of its own, enqueues, hands the row over with
    /// [`Handover::commit_when_told`], then commits or rolls back as told.
    pub fn spawn<F, T>(transaction: F) -> Self
    where
        F: FnOnce(Handover) -> T,
        T: Future<Output = ()> + Send + 'static,
    {
        let (inserted, inserted_rx) = oneshot::channel();
        let (finish, finish_rx) = oneshot::channel();
        let handover = Handover {
            inserted,
            finish: finish_rx,
        };
        OpenEnqueue {
            inserted: inserted_rx,
            finish,
            done: tokio::spawn(transaction(handover)),
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

/// A message of no aggregate.
pub fn loose_message(n: usize) -> NewMessage {
    NewMessage::new("audit", json!({ "n": n }))
}

pub fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
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

/// Declares the contract's tests in a store's test file: one per scenario below, named as
/// the scenario, `#[ignore]`d with `$ignore` (it needs a live server) on a four-worker
/// runtime, each calling `$run(scenario_name, scenario).await`, where the store's harness
/// makes a fresh outbox (under each setting it has, SQL Server's two isolations) and runs
/// the scenario on it. So every store runs the same list, kept here once.
#[allow(unused_macros)] // the stores' own test files do not declare the contract
macro_rules! contract_tests {
    ($ignore:literal, $run:path) => {
        $crate::claim_contract::contract_tests!(
            @each $ignore,
            $run,
            enqueue_is_transactional_and_idempotent,
            head_of_aggregate_with_refill,
            heads_past_a_deep_backlog,
            six_claimers_share_thirty_aggregates,
            fifty_claimers_on_one_aggregate,
            reaper_and_fenced_acknowledgements,
            a_claim_expires_by_its_holders_timeout,
            retry_requeue_and_dead,
            purge_deletes_only_old_done_rows,
            unicode_and_one_megabyte_payloads_round_trip,
            an_open_enqueue_delays_only_its_aggregate,
            a_relay_killed_mid_batch_loses_nothing,
            a_relay_killed_with_batches_in_flight_loses_nothing,
        );
    };
    (@each $ignore:literal, $run:path, $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = $ignore]
        async fn $name() {
            $run(stringify!($name), $crate::claim_contract::$name).await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use contract_tests;

// ------------------------------------------------------------------------------------------
// The scenarios
// ------------------------------------------------------------------------------------------

/// 1000 messages of one aggregate in front, then others: every claim takes the due heads
/// in id order past the backlog of the aggregate whose head is held, never a message behind
/// a head or a head that is not due, and the batch size holds. (PostgreSQL's and MariaDB's
/// stores claim past the first 16 batches of open messages by another statement than the
/// one before them; their own tests show which way each claim went.)
pub async fn heads_past_a_deep_backlog<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let ids_of = async |messages: &[NewMessage]| -> Vec<i64> {
        let enqueued = db.enqueue_committed(messages).await;
        enqueued.iter().map(|e| e.id).collect()
    };
    let hot: Vec<NewMessage> = (0..1000).map(|n| message_of("hot", n)).collect();
    let hot = ids_of(&hot).await;
    let later = [
        message_of("a", 1),
        message_of("b", 1),
        loose_message(1),
        message_of("c", 1),
        message_of("a", 2),
        loose_message(2),
        message_of("c", 2),
        message_of("a", 3),
        message_of("b", 2),
        message_of("a", 4),
    ];
    let [a1, b1, n1, c1, a2, n2, c2, a3, _b2, a4] = ids_of(&later).await[..] else {
        unreachable!()
    };
    let first = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&first), [hot[0], a1, b1, n1, c1, n2]);
    // b's head fails and waits an hour for its retry: b is blocked.
    let token = token_of(&first);
    assert_eq!(store.requeue(b1, token, HELD).await.unwrap(), 1);
    // Every head is claimed or blocked now, and nothing behind them is taken.
    assert_eq!(claim(&mut store, 10, HELD).await.len(), 0);
    let taken = [hot[0], a1, n1, c1, n2];
    assert_eq!(store.mark_done(&taken, token).await.unwrap(), 5);
    let mut done = async |n: u32| -> Vec<i64> {
        let batch = claim(&mut store, n, HELD).await;
        let done = store.mark_done(&ids(&batch), token_of(&batch)).await;
        assert_eq!(done.unwrap(), batch.len() as u64);
        ids(&batch)
    };
    // The batch size holds: the lowest ids first.
    assert_eq!(done(2).await, [hot[1], a2]);
    assert_eq!(done(10).await, [hot[2], c2, a3]);
    assert_eq!(ids(&claim(&mut store, 1, HELD).await), [hot[3]]);
    assert_eq!(ids(&claim(&mut store, 10, HELD).await), [a4]);
    assert_eq!(db.count("status = 1").await, 2, "hot[3] and a4 held");
    assert_eq!(
        db.state(b1).await,
        (FAILED, 0),
        "b still waits for its retry"
    );
}

/// A rolled-back enqueue leaves nothing (no row, nothing to claim, its message_id still
/// free); a committed one is claimable; a message_id already there returns the existing row
/// (across transactions, with another payload, twice in one transaction) and keeps the
/// first payload; without one, a message_id is made and stored.
pub async fn enqueue_is_transactional_and_idempotent<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let keyed = NewMessage {
        message_id: Some("order-7-paid".to_owned()),
        ..message_of("k", 1)
    };
    let mut rolled_back = db.enqueue_open(keyed.clone()).await;
    let gone = rolled_back
        .inserted(Duration::from_secs(30))
        .await
        .expect("the insert returns");
    assert_eq!(gone.message_id, "order-7-paid");
    rolled_back.finish(false).await;
    assert_eq!(db.count("1 = 1").await, 0, "rolled back");
    assert!(claim(&mut store, 10, HELD).await.is_empty());

    let first = db.enqueue_committed(std::slice::from_ref(&keyed)).await;
    assert_eq!(
        first[0].message_id, "order-7-paid",
        "the rolled-back key is free"
    );
    let retried = NewMessage {
        payload: json!({ "aggregate": "k", "n": 2 }),
        ..keyed.clone()
    };
    let again = db.enqueue_committed(std::slice::from_ref(&retried)).await;
    assert_eq!(again, first, "one row per message_id");
    let twice = db.enqueue_committed(&[keyed.clone(), retried]).await;
    assert_eq!(twice, vec![first[0].clone(), first[0].clone()]);
    assert_eq!(db.count("message_id = 'order-7-paid'").await, 1);
    let generated = db.enqueue_committed(&[message_of("g", 2)]).await;
    assert!(!generated[0].message_id.is_empty(), "a message_id is made");
    assert!(
        generated[0].message_id.is_ascii() && !generated[0].message_id.contains('\''),
        "{generated:?}"
    );
    assert_eq!(
        db.count(&format!(
            "id = {} and message_id = '{}'",
            generated[0].id, generated[0].message_id
        ))
        .await,
        1,
        "the made message_id is the stored one"
    );
    assert_eq!(db.count("1 = 1").await, 2);

    let claimed = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&claimed), vec![first[0].id, generated[0].id]);
    assert_eq!(claimed[0].message_id, "order-7-paid");
    assert_eq!(
        claimed[0].payload, keyed.payload,
        "the first payload is kept"
    );
    assert_eq!(claimed[0].attempts, 0);
}

/// Heads only, in id order; the batch is refilled past dropped candidates; done and dead
/// unblock an aggregate, pending, processing and failed block it; messages of no aggregate
/// never block, not even each other; aggregate ids compare exactly ('Case' is not 'case').
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
            .mark_failed(Failed::retry(e[1].id, t, HELD, "broker down"))
            .await
            .unwrap(),
        1
    );
    assert!(
        claim(&mut store, 10, HELD).await.is_empty(),
        "a failed row blocks"
    );
    assert_eq!(db.state(e[1].id).await, (FAILED, 1));
    assert_eq!(db.state(e[2].id).await, (PENDING, 0), "a3 waits");
    assert_eq!(
        db.count(&format!("id = {} and last_error = 'broker down'", e[1].id))
            .await,
        1,
        "the error is kept"
    );
    // Due in an hour on the server's clock: not after 59 minutes, after 60 minutes 1 s.
    db.age("next_retry_at", HELD - Duration::from_secs(60), &[e[1].id])
        .await;
    assert!(
        claim(&mut store, 10, HELD).await.is_empty(),
        "due in an hour"
    );
    db.age("next_retry_at", Duration::from_secs(61), &[e[1].id])
        .await;
    let fourth = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&fourth), vec![e[1].id], "due again");
    assert_eq!(fourth[0].attempts, 1);
    store
        .mark_failed(Failed::dead(e[1].id, token_of(&fourth), "poison"))
        .await
        .unwrap();
    assert_eq!(db.state(e[1].id).await, (DEAD, 2));
    assert_eq!(
        db.count(&format!(
            "id = {} and last_error = 'poison' and processed_at is not null \
             and next_retry_at is null",
            e[1].id
        ))
        .await,
        1,
        "dead: its error, when it ended, no retry time"
    );
    let fifth = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&fifth), vec![e[2].id], "dead unblocks the aggregate");
    assert_eq!(fifth[0].attempts, 0);

    // Messages of no aggregate: all at once, and a later one while they are processing.
    let loose = db
        .enqueue_committed(&[loose_message(1), loose_message(2), loose_message(3)])
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!(
        ids(&batch),
        loose.iter().map(|m| m.id).collect::<Vec<_>>(),
        "all three at once"
    );
    assert!(
        batch
            .iter()
            .all(|m| m.aggregate_id.is_none() && m.partition_key.is_none()),
        "{batch:?}"
    );
    let later = db.enqueue_committed(&[loose_message(4)]).await;
    assert_eq!(ids(&claim(&mut store, 10, HELD).await), vec![later[0].id]);

    // Aggregate ids differ by case only: two aggregates, both heads.
    let cased = db
        .enqueue_committed(&[message_of("Case", 1), message_of("case", 2)])
        .await;
    assert_eq!(
        ids(&claim(&mut store, 10, HELD).await),
        vec![cased[0].id, cased[1].id]
    );
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
/// once, at most one message of an aggregate in flight, each aggregate in enqueue order;
/// every batch within its size, in id order, under a token of its own, with no attempt.
pub async fn six_claimers_share_thirty_aggregates<D: ContractDb>(db: &D) {
    let messages: Vec<NewMessage> = (0..3)
        .flat_map(|n| (0..30).map(move |a| message_of(&format!("agg-{a}"), n)))
        .collect();
    let enqueued = db.enqueue_committed(&messages).await;
    let all: BTreeSet<i64> = enqueued.iter().map(|e| e.id).collect();
    let in_flight = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let order = Arc::new(Mutex::new(BTreeMap::<String, Vec<u64>>::new()));
    let seen = Arc::new(Mutex::new(BTreeSet::<i64>::new()));
    let tokens = Arc::new(Mutex::new(BTreeSet::<ClaimToken>::new()));
    let barrier = Arc::new(Barrier::new(6));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut store = db.store();
        let (in_flight, order, seen, tokens, barrier) = (
            Arc::clone(&in_flight),
            Arc::clone(&order),
            Arc::clone(&seen),
            Arc::clone(&tokens),
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
                assert!(batch.len() <= 5, "batch size 5 honoured: {}", batch.len());
                let batch_ids = ids(&batch);
                assert!(
                    batch_ids.windows(2).all(|w| w[0] < w[1]),
                    "a batch is in id order: {batch_ids:?}"
                );
                let token = token_of(&batch);
                assert!(
                    tokens.lock().unwrap().insert(token),
                    "token {token} handed out twice"
                );
                for m in &batch {
                    let aggregate = m.aggregate_id.clone().unwrap();
                    assert_eq!(m.attempts, 0, "{m:?}");
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
                let acked = store.mark_done(&batch_ids, token).await.unwrap();
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
    assert_eq!(db.count("status = 2 and attempts = 0").await, 90);
}

/// For a store with [concurrent handles](ClaimStore::concurrent_handle), as a relay with two
/// batches in flight uses them: each round acknowledges the older batch on a handle of its
/// own while the store claims the next, over 20 aggregates of 4 messages. Every
/// acknowledgement changes its whole batch (the handle's calls are fenced by the token as
/// the store's are); no claim takes an aggregate of the batch still held; every message is
/// claimed once, each aggregate in enqueue order, and all end done with no attempt.
pub async fn acknowledgements_on_concurrent_handles_beside_claims<D: ContractDb>(db: &D) {
    let messages: Vec<NewMessage> = (0..4)
        .flat_map(|n| (0..20).map(move |a| message_of(&format!("agg-{a}"), n)))
        .collect();
    let all: BTreeSet<i64> = db
        .enqueue_committed(&messages)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    let mut store = db.store();
    let handles = store
        .concurrent_handle()
        .expect("the store has concurrent handles");
    let aggregates = |batch: &[ClaimedMessage]| -> BTreeSet<String> {
        batch
            .iter()
            .map(|m| m.aggregate_id.clone().unwrap())
            .collect()
    };
    // Two batches in flight: the older is acknowledged while the next claim runs.
    let mut older = claim(&mut store, 8, HELD).await;
    let mut newer = claim(&mut store, 8, HELD).await;
    // Every message claimed, in the order the claims returned them.
    let mut claimed: Vec<ClaimedMessage> = older.iter().chain(&newer).cloned().collect();
    let started = Instant::now();
    while !older.is_empty() || !newer.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "no progress");
        let mut handle = handles
            .concurrent_handle()
            .expect("a handle's own concurrent handle");
        let (acked, next) = tokio::join!(
            async {
                if older.is_empty() {
                    return 0;
                }
                handle
                    .mark_done(&ids(&older), token_of(&older))
                    .await
                    .unwrap_or_else(|e| panic!("mark_done on a concurrent handle: {e}"))
            },
            claim(&mut store, 8, HELD),
        );
        assert_eq!(
            acked,
            older.len() as u64,
            "the acknowledgement changed its batch"
        );
        let taken_while_held: Vec<_> = aggregates(&next)
            .intersection(&aggregates(&newer))
            .cloned()
            .collect();
        assert!(
            taken_while_held.is_empty(),
            "a claim took an aggregate whose message is still held: {taken_while_held:?}"
        );
        claimed.extend_from_slice(&next);
        older = std::mem::replace(&mut newer, next);
        if older.is_empty() && newer.is_empty() && claimed.len() < all.len() {
            // The last acknowledgement may have committed after the claim beside it
            // looked: claim once more on its own.
            newer = claim(&mut store, 8, HELD).await;
            claimed.extend_from_slice(&newer);
        }
    }
    assert_eq!(ids(&claimed).len(), all.len(), "a message claimed twice");
    assert_eq!(
        ids(&claimed).into_iter().collect::<BTreeSet<_>>(),
        all,
        "every message claimed"
    );
    let mut order = BTreeMap::<String, Vec<u64>>::new();
    for m in &claimed {
        order
            .entry(m.aggregate_id.clone().unwrap())
            .or_default()
            .push(m.payload["n"].as_u64().unwrap());
    }
    for (aggregate, ns) in &order {
        assert_eq!(ns, &vec![0, 1, 2, 3], "{aggregate} out of order");
    }
    assert_eq!(db.count("status = 2 and attempts = 0").await, 80);
}

/// 50 claimers at once on one aggregate of 5 messages: one claim, of its first message;
/// the others stay pending and unclaimed behind it.
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
    assert_eq!(db.state(enqueued[0].id).await, (PROCESSING, 0));
    assert_eq!(
        db.count("status = 0 and claim_token is null").await,
        4,
        "the later rows are untouched"
    );
    let mut store = db.store();
    assert!(
        claim(&mut store, 10, HELD).await.is_empty(),
        "the later rows wait behind the processing head"
    );
}

/// A claim expires by the timeout of the relay that made it, not by the timeout of the
/// relay that finds it (issue 18: a fleet's effective timeout was its smallest): five
/// seconds on, the one-hour relay takes the row whose 1 s claim ran out, and the 1 s relay
/// does not take the row held for an hour; once the hour has passed, it may.
pub async fn a_claim_expires_by_its_holders_timeout<D: ContractDb>(db: &D) {
    let (mut patient, mut hasty) = (db.store(), db.store());
    let second = Duration::from_secs(1);
    let e = db
        .enqueue_committed(&[message_of("h", 0), message_of("i", 0)])
        .await;
    let held = claim(&mut patient, 1, HELD).await;
    assert_eq!(ids(&held), vec![e[0].id]);
    let short = claim(&mut hasty, 1, second).await;
    assert_eq!(ids(&short), vec![e[1].id]);
    let both = [e[0].id, e[1].id];
    db.age("claimed_at", Duration::from_secs(5), &both).await;
    db.age("claim_expires_at", Duration::from_secs(5), &both)
        .await;
    let taken = claim(&mut patient, 10, HELD).await;
    assert_eq!(ids(&taken), vec![e[1].id], "the 1 s claim had expired");
    assert_eq!(taken[0].attempts, 1);
    assert!(
        claim(&mut hasty, 10, second).await.is_empty(),
        "a relay with a shorter timeout took a claim its holder still owns"
    );
    assert_eq!(
        db.state(e[0].id).await,
        (PROCESSING, 0),
        "still processing, no attempt"
    );
    db.age("claimed_at", HELD, &[e[0].id]).await;
    db.age("claim_expires_at", HELD, &[e[0].id]).await;
    assert_eq!(ids(&claim(&mut hasty, 10, second).await), vec![e[0].id]);
}

/// An expired claim is taken over (one attempt counted, every expiry counts); the old
/// token then changes nothing, the new one does, once.
pub async fn reaper_and_fenced_acknowledgements<D: ContractDb>(db: &D) {
    let (mut first, mut second) = (db.store(), db.store());
    let e = db
        .enqueue_committed(&[message_of("f", 0), message_of("g", 0)])
        .await;
    let old = claim(&mut first, 10, Duration::from_secs(60)).await;
    assert_eq!(ids(&old), vec![e[0].id, e[1].id]);
    assert_eq!(old[0].attempts, 0);
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
            .mark_failed(Failed::retry(e[0].id, t_old, Duration::ZERO, "x"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        first
            .mark_failed(Failed::dead(e[0].id, t_old, "x"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        first.requeue(e[0].id, t_old, Duration::ZERO).await.unwrap(),
        0
    );
    assert_eq!(db.state(e[0].id).await, (PROCESSING, 1));
    assert_eq!(
        db.count(&format!(
            "id = {} and last_error is null and processed_at is null",
            e[0].id
        ))
        .await,
        1,
        "the stale calls wrote nothing"
    );
    // With both ids, the old token acknowledges only the row it still holds.
    assert_eq!(
        first.mark_done(&[e[0].id, e[1].id], t_old).await.unwrap(),
        1,
        "g is still held"
    );
    assert_eq!(db.state(e[1].id).await, (DONE, 0));
    assert_eq!(db.state(e[0].id).await, (PROCESSING, 1));
    assert_eq!(second.mark_done(&[e[0].id], t_new).await.unwrap(), 1);
    assert_eq!(
        second.mark_done(&[e[0].id], t_new).await.unwrap(),
        0,
        "acknowledged once"
    );
    assert_eq!(
        first
            .mark_failed(Failed::retry(
                e[0].id,
                t_old,
                Duration::from_secs(60),
                "late"
            ))
            .await
            .unwrap(),
        0
    );
    assert_eq!(db.state(e[0].id).await, (DONE, 1));
    assert_eq!(db.count("status = 2 and processed_at is not null").await, 2);

    // With the real clock: claimed for 1 s, taken over after it; aged again, taken again.
    let r = db.enqueue_committed(&[message_of("r", 0)]).await;
    let short = Duration::from_secs(1);
    let held = claim(&mut first, 10, short).await;
    assert_eq!(ids(&held), vec![r[0].id]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reaped = claim(&mut second, 10, short).await;
    assert_eq!(ids(&reaped), vec![r[0].id], "reclaimed after the timeout");
    assert_eq!(reaped[0].attempts, 1);
    assert_ne!(token_of(&reaped), token_of(&held));
    db.age("claimed_at", Duration::from_secs(5), &[r[0].id])
        .await;
    db.age("claim_expires_at", Duration::from_secs(5), &[r[0].id])
        .await;
    let again = claim(&mut first, 10, short).await;
    assert_eq!(ids(&again), vec![r[0].id]);
    assert_eq!(again[0].attempts, 2, "every expiry counts");
    assert_eq!(db.state(r[0].id).await, (PROCESSING, 2));
}

/// requeue hands a message back without an attempt, not due before its time, fenced by
/// the token; mark_failed counts one and sets the retry time (a failed row is not the
/// reaper's, whatever the timeout); dead is never claimed again, however old its claim;
/// bad arguments are refused.
pub async fn retry_requeue_and_dead<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let e = db
        .enqueue_committed(&[message_of("q", 0), message_of("q", 1)])
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&batch), vec![e[0].id]);
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
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!(
        (ids(&batch), batch[0].attempts),
        (vec![e[0].id], 0),
        "due at once, still the head of its aggregate"
    );
    let t = token_of(&batch);
    // Requeued for an hour: not due, and not the reaper's even with a 1 ms timeout.
    assert_eq!(store.requeue(e[0].id, t, HELD).await.unwrap(), 1);
    assert_eq!(
        store.requeue(e[0].id, t, Duration::ZERO).await.unwrap(),
        0,
        "no longer held"
    );
    assert!(
        claim(&mut store, 10, Duration::from_millis(1))
            .await
            .is_empty(),
        "not due before its time"
    );
    db.age("next_retry_at", HELD + Duration::from_secs(1), &[e[0].id])
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!((ids(&batch), batch[0].attempts), (vec![e[0].id], 0));

    // Failed with a real 1 s retry: due once the server's clock has passed it.
    assert_eq!(
        store
            .mark_failed(Failed::retry(
                e[0].id,
                token_of(&batch),
                Duration::from_secs(1),
                "try again"
            ))
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.state(e[0].id).await, (FAILED, 1));
    let started = Instant::now();
    let batch = loop {
        let batch = claim(&mut store, 10, HELD).await;
        if !batch.is_empty() {
            break batch;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a 1 s retry never came due"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((ids(&batch), batch[0].attempts), (vec![e[0].id], 1));
    assert!(
        store
            .mark_failed(Failed {
                id: e[0].id,
                token: token_of(&batch),
                retry_after: None,
                dead: false,
                error: "x"
            })
            .await
            .is_err(),
        "failed without a retry time is refused"
    );
    assert_eq!(
        db.state(e[0].id).await,
        (PROCESSING, 1),
        "and changes nothing"
    );

    // Dead (a retry time given with dead is ignored): never claimed again, however old its
    // claim and retry time and however short the timeout; the next of its aggregate goes.
    store
        .mark_failed(Failed {
            id: e[0].id,
            token: token_of(&batch),
            retry_after: Some(Duration::from_secs(5)),
            dead: true,
            error: "give up",
        })
        .await
        .unwrap();
    assert_eq!(db.state(e[0].id).await, (DEAD, 2));
    assert_eq!(
        db.count(&format!("id = {} and next_retry_at is null", e[0].id))
            .await,
        1,
        "dead ignores the retry time"
    );
    let t_dead = token_of(&batch);
    assert_eq!(store.mark_done(&[e[0].id], t_dead).await.unwrap(), 0);
    assert_eq!(
        store
            .requeue(e[0].id, t_dead, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .mark_failed(Failed::retry(e[0].id, t_dead, Duration::ZERO, "x"))
            .await
            .unwrap(),
        0,
        "its old token moves it nowhere"
    );
    db.age("claimed_at", days(1), &[e[0].id]).await;
    db.age("claim_expires_at", days(1), &[e[0].id]).await;
    db.age("next_retry_at", days(1), &[e[0].id]).await;
    let next = claim(&mut store, 10, Duration::from_millis(1)).await;
    assert_eq!(ids(&next), vec![e[1].id], "dead unblocks the aggregate");
    store.mark_done(&[e[1].id], token_of(&next)).await.unwrap();
    for _ in 0..3 {
        assert!(
            claim(&mut store, 10, Duration::from_millis(1))
                .await
                .is_empty(),
            "dead is terminal"
        );
    }
    assert_eq!(db.state(e[0].id).await, (DEAD, 2));
    assert!(store.claim(0, HELD).await.is_err());
    assert!(store.claim(10_001, HELD).await.is_err());
    assert!(store.claim(1, Duration::ZERO).await.is_err());
}

/// purge_done deletes done rows older than the cutoff, in batches, up to max_rows, with
/// windows longer than a 32-bit count of milliseconds, and keeps dead, failed and pending
/// rows however old their times; bad arguments are refused.
pub async fn purge_deletes_only_old_done_rows<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let messages: Vec<NewMessage> = (0..9).map(|i| message_of(&format!("p{i}"), i)).collect();
    let e = db.enqueue_committed(&messages).await;
    let batch = claim(&mut store, 9, HELD).await;
    let token = token_of(&batch);
    let done: Vec<i64> = e[..7].iter().map(|x| x.id).collect();
    store.mark_done(&done, token).await.unwrap();
    store
        .mark_failed(Failed::dead(e[7].id, token, "dead"))
        .await
        .unwrap();
    store
        .mark_failed(Failed::retry(e[8].id, token, HELD, "failed"))
        .await
        .unwrap();
    // Pending behind the failed p8, never claimed here.
    let pending = db.enqueue_committed(&[message_of("p8", 9)]).await[0].id;
    let old: Vec<i64> = vec![
        e[0].id, e[1].id, e[2].id, e[3].id, e[4].id, e[7].id, e[8].id, pending,
    ];
    db.age("processed_at", Duration::from_secs(7200), &old)
        .await;
    assert_eq!(
        db.purge_done(Duration::from_secs(3600), 2, Some(1))
            .await
            .unwrap(),
        1,
        "max_rows"
    );
    assert_eq!(
        db.purge_done(Duration::from_secs(3600), 2, None)
            .await
            .unwrap(),
        4,
        "batches of 2"
    );
    assert_eq!(
        db.purge_done(Duration::from_secs(3600), 2, None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(db.count("status = 2").await, 2, "recent done rows stay");

    // Windows of 90 and 30 days (more milliseconds than an int holds).
    let loose = db
        .enqueue_committed(&[
            loose_message(1),
            loose_message(2),
            loose_message(3),
            loose_message(4),
        ])
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    let loose_ids: Vec<i64> = loose.iter().map(|m| m.id).collect();
    assert_eq!(ids(&batch), loose_ids, "the only claimable rows");
    store.mark_done(&loose_ids, token_of(&batch)).await.unwrap();
    db.age("processed_at", days(91), &loose_ids[..2]).await;
    db.age("processed_at", days(89), &loose_ids[2..]).await;
    assert_eq!(db.purge_done(days(90), 1000, None).await.unwrap(), 2);
    assert_eq!(
        db.count(&format!("id in ({}, {})", loose_ids[0], loose_ids[1]))
            .await,
        0,
        "done 91 days ago"
    );
    assert_eq!(db.purge_done(days(30), 1000, None).await.unwrap(), 2);
    assert_eq!(db.purge_done(days(36_525), 1000, None).await.unwrap(), 0);

    // A zero window takes every done row, and nothing else.
    assert_eq!(db.purge_done(Duration::ZERO, 1, None).await.unwrap(), 2);
    assert_eq!(db.count("status = 2").await, 0);
    assert_eq!(db.state(e[7].id).await, (DEAD, 1));
    assert_eq!(db.state(e[8].id).await, (FAILED, 1));
    assert_eq!(db.state(pending).await, (PENDING, 0));
    assert_eq!(db.count("1 = 1").await, 3);

    assert!(db.purge_done(Duration::ZERO, 0, None).await.is_err());
    assert!(db.purge_done(Duration::ZERO, 4001, None).await.is_err());
    assert!(db.purge_done(Duration::ZERO, 1, Some(0)).await.is_err());
    assert!(db.purge_done(days(101 * 366), 1, None).await.is_err());
}

#[track_caller]
pub fn assert_round_trip(sent: &NewMessage, enqueued: &Enqueued, got: &ClaimedMessage) {
    assert_eq!(got.id, enqueued.id);
    assert_eq!(got.message_id, enqueued.message_id);
    if let Some(message_id) = &sent.message_id {
        assert_eq!(&got.message_id, message_id);
    }
    assert_eq!(got.topic, sent.topic);
    assert_eq!(got.aggregate_type, sent.aggregate_type);
    assert_eq!(got.aggregate_id, sent.aggregate_id);
    let partition_key = sent.partition_key.clone().or(sent.aggregate_id.clone());
    assert_eq!(
        got.partition_key, partition_key,
        "no partition key: the aggregate id"
    );
    assert!(got.payload == sent.payload, "the payload of {}", got.id);
    assert_eq!(got.headers, sent.headers);
    assert_eq!(got.trace_id, sent.trace_id);
    assert_eq!(got.attempts, 0);
}

/// Unicode everywhere (Cyrillic, CJK, emoji with modifiers and joiners, escapes) and a
/// payload of 1,000,000 characters, many outside the BMP, come back exactly.
pub async fn unicode_and_one_megabyte_payloads_round_trip<D: ContractDb>(db: &D) {
    let mut store = db.store();
    let headers = |pairs: &[(&str, &str)]| -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let sent = vec![
        NewMessage {
            topic: "заказы.события".to_owned(),
            payload: json!({
                "заказ": "№42",
                "注文": ["寿司", "ラーメン"],
                "emoji": "🎉👍🏽🇺🇦 👩‍👩‍👧",
                "escapes": "\"quoted\" \\ back\\slash\n\ttab end",
                "number": 12.5,
                "list": [1, 2.5, "∑"],
                "nested": { "ключ": [true, null, "значение"] }
            }),
            aggregate_type: Some("заказ".to_owned()),
            aggregate_id: Some("заказ-№42".to_owned()),
            partition_key: None,
            headers: headers(&[
                ("источник", "склад-№7"),
                ("emoji", "📦🚚✅"),
                ("日本語キー", "値"),
                ("grüße", "merhaba — 你好 — שלום — 🎉"),
            ]),
            message_id: Some("сообщение-1-✓".to_owned()),
            trace_id: Some("трасса-🧵".to_owned()),
        },
        NewMessage {
            topic: "注文".to_owned(),
            payload: json!({ "品目": "抹茶", "数量": 2 }),
            aggregate_type: Some("τύπος".to_owned()),
            aggregate_id: Some("集計-🎉".to_owned()),
            partition_key: Some("パーティション-3".to_owned()),
            headers: headers(&[("k", "v")]),
            message_id: None,
            trace_id: None,
        },
        NewMessage {
            topic: "emoji.🚀".to_owned(),
            payload: json!({ "🚀": "🌕", "text": "rocket" }),
            aggregate_type: Some("🚀".to_owned()),
            aggregate_id: Some("rocket-🚀-1".to_owned()),
            partition_key: None,
            headers: Headers::new(),
            message_id: Some("🆔-rocket-3".to_owned()),
            trace_id: Some("🧵".to_owned()),
        },
    ];
    let enqueued = db.enqueue_committed(&sent).await;
    let claimed = claim(&mut store, 10, HELD).await;
    assert_eq!(
        ids(&claimed),
        enqueued.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    for ((message, enqueued), got) in sent.iter().zip(&enqueued).zip(&claimed) {
        assert_round_trip(message, enqueued, got);
    }
    assert_eq!(
        store
            .mark_done(&ids(&claimed), token_of(&claimed))
            .await
            .unwrap(),
        3
    );

    let pattern: Vec<char> = "0123456789abcdefghijklmnopqrstuvwxyzЖжЯя注文🚀\"\\é"
        .chars()
        .collect();
    let blob: String = pattern.iter().cycle().take(1_000_000).collect();
    let big = NewMessage {
        headers: headers(&[("size", "1000000")]),
        ..NewMessage::new("big", json!({ "blob": blob })).aggregate("blob", "blob-1")
    };
    let ascii = NewMessage::new("big", json!({ "blob": "x".repeat(1024 * 1024) }));
    let enqueued = db.enqueue_committed(&[big.clone(), ascii.clone()]).await;
    let claimed = claim(&mut store, 10, HELD).await;
    assert_eq!(
        ids(&claimed),
        enqueued.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    let got_blob = claimed[0].payload["blob"].as_str().expect("a string");
    assert_eq!(got_blob.chars().count(), 1_000_000);
    assert!(
        got_blob == blob,
        "the 1,000,000 characters round-trip exactly"
    );
    assert_round_trip(&big, &enqueued[0], &claimed[0]);
    assert_round_trip(&ascii, &enqueued[1], &claimed[1]);
}

/// An open transaction's message is never claimed and delays only its own aggregate; a
/// second message of that aggregate gets the higher id and is never claimed before the
/// first is done. Whether its insert waits for the first transaction is the store's own
/// design (PostgreSQL and MariaDB wait for the commit, SQL Server only for the insert), and
/// is tested beside each store.
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

    // A second writer of m, committing as soon as its insert returns (on PostgreSQL and
    // MariaDB that is after m1's transaction ends).
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
        "the later enqueue of an aggregate has the higher id"
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
