//! The feed contract, written once and run against every feed backend through the one reader
//! API (`FeedReader`, `CursorStore`): PostgreSQL in `tests/live_postgres_feed.rs` (live in
//! `.ci/run`), SQL Server in `tests/contract_mssql_feed.rs` (`#[ignore]`d, run where a server
//! is reachable). Each scenario takes a [`FeedContractDb`]: fresh feeds on one server and the
//! few backend-specific things a scenario needs (a writer's transaction, ending the readers'
//! sessions, retention).
//!
//! What the contract says (ARCHITECTURE.md, "The feed"):
//! * every committed event is delivered to every consumer exactly once, per shard in strictly
//!   increasing ULID order, and a replay returns the same rows in the same order;
//! * if transaction A's commit was acknowledged before transaction B began, A's event comes
//!   before B's in its shard (checked over a recorded history of concurrent writers);
//! * a writer that has not committed stalls nobody; its event appears after its commit, or
//!   never after a rollback;
//! * readers racing at the head all get the rows; long-polling readers wake at a commit;
//! * consumers are independent; retention keeps what a saved cursor has not read and refuses
//!   a cursor it passed; a reader whose session dies resumes without loss or repeat;
//! * in serialized-writer mode ULID order is commit order.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use changefeed::reader::{FeedReader, FeedReaderOptions, ReadRetryPolicy, Wait};
use changefeed::{Cursor, Error, Feed, FeedRow, Page};
use futures::StreamExt;
use tokio::sync::oneshot;
use ulid::Ulid;

/// One server, as the contract needs it. Event tables have the key `id bigint` and a `shard`
/// column; `ids` are unique per feed.
pub trait FeedContractDb: Sync {
    /// A fresh outbox-mode feed of `shards` shards.
    fn outbox_feed(&self, shards: i32) -> impl Future<Output = Feed>;

    /// A fresh serialized-writer feed of one shard.
    fn serialized_feed(&self) -> impl Future<Output = Feed>;

    /// A reader of `feed` with `options`.
    fn reader(&self, feed: &Feed, options: FeedReaderOptions) -> FeedReader;

    /// Begins a transaction on a connection of its own that writes the events `ids` into
    /// `shard` and then waits for the test's word ([`OpenWrite`]).
    fn open_write(&self, feed: &Feed, shard: i32, ids: Vec<i64>)
    -> impl Future<Output = OpenWrite>;

    /// In serialized mode: a transaction that locks shard 0, inserts `ids` numbered by the
    /// feed's ulid(i), sleeps `hold` inside the transaction, and commits. Returns the commit's
    /// position among all such commits of the feed (taken under the shard's lock, just before
    /// the commit, so it is the commit order).
    fn serialized_write(
        &self,
        feed: &Feed,
        ids: Vec<i64>,
        hold: Duration,
    ) -> impl Future<Output = i64>;

    /// Ends every session of the server that is reading `feed` (not the test's own), as an
    /// operator or a failover would; returns how many.
    fn end_reader_sessions(&self, feed: &Feed) -> impl Future<Output = usize>;

    /// Saves `consumer`'s cursor of `shard` with the backend's cursor store, as a consumer
    /// whose cursor holds the purge back (registered by whoever administers the feed).
    fn save_cursor(
        &self,
        consumer: &str,
        feed: &Feed,
        shard: i32,
        cursor: Cursor,
    ) -> impl Future<Output = changefeed::Result<()>>;

    /// Loads `consumer`'s cursor of `shard`, if it saved one.
    fn load_cursor(
        &self,
        consumer: &str,
        feed: &Feed,
        shard: i32,
    ) -> impl Future<Output = changefeed::Result<Option<Cursor>>>;

    /// Purges every row of `feed` that every registered consumer's saved cursor has passed
    /// (no time cutoff: all rows are old enough); returns how many rows went.
    fn purge(&self, feed: &Feed) -> impl Future<Output = u64>;
}

/// A writer's transaction that the test commits or rolls back when it likes.
pub struct OpenWrite {
    written: Option<oneshot::Receiver<Instant>>,
    finish: oneshot::Sender<bool>,
    done: tokio::task::JoinHandle<Option<Instant>>,
}

/// The writing task's end of an [`OpenWrite`].
pub struct WriteHandover {
    written: oneshot::Sender<Instant>,
    finish: oneshot::Receiver<bool>,
}

impl WriteHandover {
    /// Says the events are written (the transaction began before now), then waits for the
    /// test's word: `true` to commit, `false` (or the [`OpenWrite`] dropped) to roll back.
    pub async fn commit_when_told(self, began: Instant) -> bool {
        let _ = self.written.send(began);
        self.finish.await.unwrap_or(false)
    }
}

impl OpenWrite {
    /// Spawns the task `transaction` makes of a [`WriteHandover`]: it begins a transaction,
    /// writes, calls [`WriteHandover::commit_when_told`], commits or rolls back as told and
    /// returns the instant its commit was acknowledged (None after a rollback).
    pub fn spawn<F, T>(transaction: F) -> Self
    where
        F: FnOnce(WriteHandover) -> T,
        T: Future<Output = Option<Instant>> + Send + 'static,
    {
        let (written, written_rx) = oneshot::channel();
        let (finish, finish_rx) = oneshot::channel();
        let done = tokio::spawn(transaction(WriteHandover {
            written,
            finish: finish_rx,
        }));
        OpenWrite {
            written: Some(written_rx),
            finish,
            done,
        }
    }

    /// Waits until the events are written (uncommitted); returns when the transaction began.
    pub async fn written(&mut self) -> Instant {
        let receiver = self.written.take().expect("written() once");
        tokio::time::timeout(Duration::from_secs(30), receiver)
            .await
            .expect("the writer wrote within 30 s")
            .expect("the writer's task failed")
    }

    /// Commits; returns when the commit was acknowledged.
    pub async fn commit(self) -> Instant {
        let _ = self.finish.send(true);
        self.done
            .await
            .expect("the writer's task failed")
            .expect("the commit was acknowledged")
    }

    /// Rolls back.
    pub async fn rollback(self) {
        let _ = self.finish.send(false);
        assert!(self.done.await.expect("the writer's task failed").is_none());
    }
}

/// Writes `ids` into `shard` in one committed transaction; returns when it began and when its
/// commit was acknowledged.
pub async fn write_committed<D: FeedContractDb>(
    db: &D,
    feed: &Feed,
    shard: i32,
    ids: Vec<i64>,
) -> (Instant, Instant) {
    let mut open = db.open_write(feed, shard, ids).await;
    let began = open.written().await;
    (began, open.commit().await)
}

/// Reader options for tests: small pages, a long-poll, quick retries.
pub fn options(page_size: u32) -> FeedReaderOptions {
    FeedReaderOptions::default()
        .page_size(page_size)
        .wait(Wait::LongPoll(Duration::from_secs(5)))
        .retry(
            ReadRetryPolicy::default()
                .initial(Duration::from_millis(20))
                .max(Duration::from_millis(200))
                .max_retries(Some(50)),
        )
}

/// Follows `shard` from `cursor` until `count` rows came or `limit` passed; returns the rows
/// in delivery order with the instant each page arrived.
pub async fn follow(
    reader: &FeedReader,
    shard: i32,
    cursor: Cursor,
    count: usize,
    limit: Duration,
) -> Vec<(FeedRow<i64>, Instant)> {
    let mut pages = std::pin::pin!(reader.stream::<i64>(shard, cursor));
    let mut rows = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while rows.len() < count {
        match tokio::time::timeout_at(deadline, pages.next()).await {
            Err(_) => panic!("{} of {count} rows came within {limit:?}", rows.len()),
            Ok(None) => panic!("the stream ended after {} rows", rows.len()),
            Ok(Some(Err(error))) => panic!("the stream failed after {} rows: {error}", rows.len()),
            Ok(Some(Ok(page))) => {
                let at = Instant::now();
                rows.extend(page.rows.into_iter().map(|row| (row, at)));
            }
        }
    }
    rows
}

fn keys(rows: &[(FeedRow<i64>, Instant)]) -> Vec<i64> {
    rows.iter().map(|(row, _)| row.key).collect()
}

fn assert_strictly_increasing(rows: &[(FeedRow<i64>, Instant)], what: &str) {
    for pair in rows.windows(2) {
        assert!(
            pair[0].0.ulid < pair[1].0.ulid,
            "{what}: ULIDs go back: {pair:?}"
        );
    }
}

/// The checks of a delivered history: exactly once, strictly increasing ULIDs, and the
/// ordering contract (a transaction that began after another's commit was acknowledged comes
/// after it).
fn check_history(
    what: &str,
    delivered: &[(FeedRow<i64>, Instant)],
    transactions: &[(Vec<i64>, Instant, Instant)],
) {
    let all: BTreeSet<i64> = transactions
        .iter()
        .flat_map(|(ids, _, _)| ids.clone())
        .collect();
    let got: Vec<i64> = keys(delivered);
    let unique: BTreeSet<i64> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "{what}: an event came twice");
    assert_eq!(unique, all, "{what}: events missing or unknown");
    assert_strictly_increasing(delivered, what);
    let position: BTreeMap<i64, usize> = got.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut checked = 0;
    for (a_ids, _, a_committed) in transactions {
        for (b_ids, b_began, _) in transactions {
            if a_committed < b_began {
                for a in a_ids {
                    for b in b_ids {
                        assert!(
                            position[a] < position[b],
                            "{what}: {b} began after {a} committed, yet comes first"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        checked > 0,
        "{what}: the history had no ordered pair to check"
    );
}

// ------------------------------------------------------------------------------------------
// The scenarios
// ------------------------------------------------------------------------------------------

/// Eight writers commit transactions of 1 to 3 events after random delays while three
/// consumers follow the shard; every consumer gets every event once, in increasing ULIDs, in
/// an order that respects every commit-before-begin pair of the recorded history; a replay
/// from the start afterwards is the same list.
pub async fn concurrent_writers_keep_the_history<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    const WRITERS: i64 = 8;
    const TRANSACTIONS: i64 = 25;
    let total: usize = (0..WRITERS * TRANSACTIONS)
        .map(|t| 1 + (t % 3) as usize)
        .sum();
    let consumers: Vec<_> = (0..3)
        .map(|_| {
            let reader = db.reader(&feed, options(50));
            tokio::spawn(async move {
                follow(&reader, 0, Cursor::START, total, Duration::from_secs(120)).await
            })
        })
        .collect();
    let history = futures::future::join_all((0..WRITERS).map(|writer| {
        let feed = feed.clone();
        async move {
            let mut transactions = Vec::new();
            for t in 0..TRANSACTIONS {
                let n = writer * TRANSACTIONS + t;
                let ids: Vec<i64> = (0..1 + n % 3).map(|k| n * 10 + k).collect();
                let mut open = db.open_write(&feed, 0, ids.clone()).await;
                let began = open.written().await;
                // Commit delays from 0 to 12 ms, in a spread that makes commits overtake.
                tokio::time::sleep(Duration::from_millis(((n * 7919) % 13) as u64)).await;
                let committed = open.commit().await;
                transactions.push((ids, began, committed));
            }
            transactions
        }
    }))
    .await;
    let transactions: Vec<_> = history.into_iter().flatten().collect();
    let mut live = Vec::new();
    for (i, consumer) in consumers.into_iter().enumerate() {
        let rows = consumer.await.expect("the consumer's task");
        check_history(&format!("consumer {i}"), &rows, &transactions);
        live.push(keys(&rows));
    }
    assert!(
        live.windows(2).all(|pair| pair[0] == pair[1]),
        "consumers saw different orders"
    );
    let replay = follow(
        &db.reader(&feed, options(1000)),
        0,
        Cursor::START,
        total,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(keys(&replay), live[0], "the replay equals the live order");
}

/// Two readers at the head at once both return the rows: the one that waited for the other's
/// move returns what it moved.
pub async fn readers_racing_at_the_head_both_get_the_rows<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    let (a, b) = (
        db.reader(&feed, options(1000)),
        db.reader(&feed, options(1000)),
    );
    let mut cursor = Cursor::START;
    for round in 0..20i64 {
        write_committed(db, &feed, 0, (0..50).map(|k| round * 100 + k).collect()).await;
        let (first, second) =
            tokio::join!(a.read_page::<i64>(0, cursor), b.read_page::<i64>(0, cursor));
        let (first, second) = (first.expect("reader a"), second.expect("reader b"));
        assert_eq!(first.rows.len(), 50, "round {round}");
        assert_eq!(
            first.rows, second.rows,
            "round {round}: a lost race returns the rows"
        );
        cursor = first.next_cursor;
    }
}

/// A writer that never commits stalls nobody: later commits are delivered at once; after its
/// rollback its events never appear; a writer that commits late appears after what was read.
pub async fn a_writer_that_does_not_commit_stalls_nobody<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    let reader = db.reader(&feed, options(100));
    let mut abandoned = db.open_write(&feed, 0, vec![1]).await;
    abandoned.written().await;
    let mut late = db.open_write(&feed, 0, vec![2]).await;
    late.written().await;
    write_committed(db, &feed, 0, vec![3, 4]).await;
    let first = follow(&reader, 0, Cursor::START, 2, Duration::from_secs(10)).await;
    assert_eq!(keys(&first), [3, 4]);
    abandoned.rollback().await;
    late.commit().await;
    let after = first.last().unwrap().0.ulid;
    let second = follow(
        &reader,
        0,
        Cursor::from_ulid(after),
        1,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        keys(&second),
        [2],
        "the late commit comes after, the rolled back never"
    );
    let page = reader
        .read_page::<i64>(0, Cursor::from_ulid(second[0].0.ulid))
        .await
        .unwrap();
    assert!(page.rows.is_empty(), "{:?}", page.rows);
}

/// Twenty readers long-poll an empty shard while one writer commits an event every 150 ms:
/// each reader gets each event within a second of its commit, far inside its 5 s long-poll
/// (it was woken, not timed out).
pub async fn long_polling_readers_wake_at_each_commit<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    const EVENTS: usize = 6;
    let readers: Vec<_> = (0..20)
        .map(|_| {
            let reader = db.reader(&feed, options(100));
            tokio::spawn(async move {
                follow(&reader, 0, Cursor::START, EVENTS, Duration::from_secs(60)).await
            })
        })
        .collect();
    // Let every reader reach its long-poll on the empty shard first.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut commits = BTreeMap::new();
    for id in 0..EVENTS as i64 {
        let (_, committed) = write_committed(db, &feed, 0, vec![id]).await;
        commits.insert(id, committed);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut worst = Duration::ZERO;
    for reader in readers {
        for (row, arrived) in reader.await.expect("the reader's task") {
            let delay = arrived.saturating_duration_since(commits[&row.key]);
            worst = worst.max(delay);
        }
    }
    assert!(
        worst < Duration::from_secs(1),
        "a reader waited {worst:?} after a commit"
    );
}

/// Four shards, each followed by its own stream of `stream_shards`: each shard's events in its
/// own increasing order, all of them, none in another shard.
pub async fn shards_are_independent_logs<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(4).await;
    for round in 0..5i64 {
        for shard in 0..4 {
            write_committed(db, &feed, shard, vec![i64::from(shard) * 1000 + round]).await;
        }
    }
    let reader = db.reader(&feed, options(3));
    let mut merged =
        std::pin::pin!(reader.stream_shards::<i64, _>((0..4).map(|s| (s, Cursor::START))));
    let mut by_shard: BTreeMap<i32, Vec<FeedRow<i64>>> = BTreeMap::new();
    while by_shard.values().map(Vec::len).sum::<usize>() < 20 {
        let (shard, page) = tokio::time::timeout(Duration::from_secs(20), merged.next())
            .await
            .expect("pages within 20 s")
            .expect("the merged stream goes on");
        by_shard
            .entry(shard)
            .or_default()
            .extend(page.expect("a page").rows);
    }
    for shard in 0..4 {
        let rows = &by_shard[&shard];
        let keys: Vec<i64> = rows.iter().map(|row| row.key).collect();
        assert_eq!(
            keys,
            (0..5)
                .map(|r| i64::from(shard) * 1000 + r)
                .collect::<Vec<_>>()
        );
        assert!(rows.windows(2).all(|pair| pair[0].ulid < pair[1].ulid));
    }
}

/// Two consumers with their own saved cursors: one stops half-way and resumes from its saved
/// cursor with the rest, the other reads everything; replays from the start and from a time
/// between two batches return exactly the rows after them.
pub async fn consumers_keep_their_own_cursors_and_replay<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    write_committed(db, &feed, 0, (0..10).collect()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reader = db.reader(&feed, options(5));
    let first = follow(&reader, 0, Cursor::START, 10, Duration::from_secs(10)).await;
    // ULID times are the server's: the boundary is just after the first batch's last ULID.
    let boundary =
        SystemTime::UNIX_EPOCH + Duration::from_millis(first[9].0.ulid.timestamp_ms() + 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    write_committed(db, &feed, 0, (10..20).collect()).await;

    let half = follow(&reader, 0, Cursor::START, 5, Duration::from_secs(10)).await;
    db.save_cursor("half", &feed, 0, Cursor::from_ulid(half[4].0.ulid))
        .await
        .unwrap();
    let resumed_at = db
        .load_cursor("half", &feed, 0)
        .await
        .unwrap()
        .expect("saved");
    assert_eq!(resumed_at, Cursor::from_ulid(half[4].0.ulid));
    let rest = follow(&reader, 0, resumed_at, 15, Duration::from_secs(10)).await;
    assert_eq!(keys(&rest), (5..20).collect::<Vec<_>>());
    assert_eq!(db.load_cursor("whole", &feed, 0).await.unwrap(), None);
    let whole = follow(&reader, 0, Cursor::START, 20, Duration::from_secs(10)).await;
    assert_eq!(keys(&whole), (0..20).collect::<Vec<_>>());
    let from_time = follow(
        &reader,
        0,
        Cursor::at(boundary),
        10,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(keys(&from_time), (10..20).collect::<Vec<_>>());
}

/// Retention keeps what a lagging consumer's saved cursor has not read; the consumer goes on
/// from its cursor; a cursor the purge passed is refused as expired; the start reads from the
/// oldest event kept.
pub async fn retention_keeps_what_a_lagging_consumer_needs<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    write_committed(db, &feed, 0, (0..10).collect()).await;
    let reader = db.reader(&feed, options(100));
    let all = follow(&reader, 0, Cursor::START, 10, Duration::from_secs(10)).await;
    db.save_cursor("lagging", &feed, 0, Cursor::from_ulid(all[3].0.ulid))
        .await
        .unwrap();
    assert_eq!(db.purge(&feed).await, 4, "rows up to the lagging cursor go");
    let rest = reader
        .read_page::<i64>(0, Cursor::from_ulid(all[3].0.ulid))
        .await
        .unwrap();
    assert_eq!(
        rest.rows.iter().map(|row| row.key).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    let error = reader
        .read_page::<i64>(0, Cursor::from_ulid(all[2].0.ulid))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::CursorExpired { .. }), "{error:?}");
    let mut stream = std::pin::pin!(reader.stream::<i64>(0, Cursor::from_ulid(all[1].0.ulid)));
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap();
    assert!(
        matches!(ended, Some(Err(Error::CursorExpired { .. }))),
        "the stream ends on it"
    );
    let start = reader.read_page::<i64>(0, Cursor::START).await.unwrap();
    assert_eq!(start.rows[0].key, 4);
}

/// What a reader refuses before reading: a cursor that is not 16 bytes, page sizes 0 and
/// 1,000,000 (and through the server, a shard the feed does not have).
pub async fn bad_cursors_and_page_sizes_are_refused<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    for bytes in [vec![0u8; 15], vec![0u8; 17]] {
        assert!(Cursor::from_bytes(&bytes).is_err(), "{} bytes", bytes.len());
    }
    // A negative page size does not type-check (u32); the server refuses one (CF101 /
    // 51101) for SQL callers, which tests/live_postgres_feed.rs checks.
    for page_size in [0, 1_000_000] {
        let error = options(page_size)
            .validate()
            .expect_err("the page size is refused");
        assert!(matches!(error, Error::Config(_)), "{page_size}: {error:?}");
    }
    let reader = db.reader(&feed, options(10));
    let error = reader.read_page::<i64>(1, Cursor::START).await.unwrap_err();
    assert_eq!(error.server_number(), Some(51101), "{error:?}");
    assert!(!error.is_transient());
}

/// The reader's session is ended by the server mid-stream (an operator, a failover): the
/// stream reconnects and goes on from its cursor with no row lost or repeated.
pub async fn a_reader_whose_session_ends_resumes_without_loss<D: FeedContractDb>(db: &D) {
    let feed = db.outbox_feed(1).await;
    write_committed(db, &feed, 0, (0..300).collect()).await;
    let reader = db.reader(&feed, options(10));
    let mut pages = std::pin::pin!(reader.stream::<i64>(0, Cursor::START));
    let mut rows: Vec<FeedRow<i64>> = Vec::new();
    let mut ended = 0;
    while rows.len() < 600 {
        let page: Page<FeedRow<i64>> = tokio::time::timeout(Duration::from_secs(30), pages.next())
            .await
            .expect("a page within 30 s")
            .expect("the stream goes on")
            .expect("transient failures are retried");
        rows.extend(page.rows);
        if rows.len().is_multiple_of(100) && ended < 4 {
            ended += db.end_reader_sessions(&feed).await.min(1);
        }
        if rows.len() == 300 {
            write_committed(db, &feed, 0, (300..600).collect()).await;
        }
    }
    assert!(ended >= 2, "the reader's session was ended {ended} times");
    assert_eq!(
        rows.iter().map(|row| row.key).collect::<Vec<_>>(),
        (0..600).collect::<Vec<_>>()
    );
    assert!(rows.windows(2).all(|pair| pair[0].ulid < pair[1].ulid));
}

/// Serialized writers: 16 writers, 500 events each in transactions of 25, sleeping inside
/// their transactions; the feed's ULID order is the order in which the transactions committed.
pub async fn serialized_writers_commit_in_ulid_order<D: FeedContractDb>(db: &D) {
    let feed = db.serialized_feed().await;
    let commits = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    futures::future::join_all((0..16i64).map(|writer| {
        let (feed, commits) = (feed.clone(), commits.clone());
        async move {
            for t in 0..20i64 {
                let first = (writer * 20 + t) * 25;
                let ids: Vec<i64> = (first..first + 25).collect();
                let order = db
                    .serialized_write(&feed, ids, Duration::from_millis((t % 3) as u64))
                    .await;
                commits.lock().unwrap().insert(order, first);
            }
        }
    }))
    .await;
    let commits = commits.lock().unwrap().clone();
    assert_eq!(commits.len(), 320);
    let reader = db.reader(&feed, options(1000));
    let rows = follow(&reader, 0, Cursor::START, 8000, Duration::from_secs(60)).await;
    assert_strictly_increasing(&rows, "serialized");
    let first_of_each: Vec<i64> = keys(&rows).into_iter().filter(|id| id % 25 == 0).collect();
    let in_commit_order: Vec<i64> = commits.values().copied().collect();
    assert_eq!(first_of_each, in_commit_order, "ULID order is commit order");
    let ulids: BTreeSet<Ulid> = rows.iter().map(|(row, _)| row.ulid).collect();
    assert_eq!(ulids.len(), 8000);
}

/// Declares one `#[tokio::test]` per scenario, each calling `$run(name, scenario)`.
macro_rules! feed_contract_tests {
    ($ignore:literal, $run:path) => {
        $crate::feed_contract::feed_contract_tests!(
            @each $ignore,
            $run,
            concurrent_writers_keep_the_history,
            readers_racing_at_the_head_both_get_the_rows,
            a_writer_that_does_not_commit_stalls_nobody,
            long_polling_readers_wake_at_each_commit,
            shards_are_independent_logs,
            consumers_keep_their_own_cursors_and_replay,
            retention_keeps_what_a_lagging_consumer_needs,
            bad_cursors_and_page_sizes_are_refused,
            a_reader_whose_session_ends_resumes_without_loss,
            serialized_writers_commit_in_ulid_order,
        );
    };
    (@each $ignore:literal, $run:path, $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = $ignore]
        async fn $name() {
            $run(stringify!($name), $crate::feed_contract::$name).await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use feed_contract_tests;
