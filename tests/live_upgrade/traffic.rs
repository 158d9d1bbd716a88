//! Issue 29 item 1: an upgrade from the first release while the application runs. A database
//! at [`BASELINE`](super::BASELINE) has an outbox-mode feed, a serialized-writer feed and a
//! claim outbox. Four writers commit events and enqueue messages in transactions, two
//! readers read both feeds and save their cursors after every page, two relays (the
//! crate's `Relay` over `SqlClaimStore`) publish to a recording publisher, and a slow
//! consumer keeps a cursor-saving transaction open twice for [`HOLD`] (a consumer that
//! saves its cursor in the transaction that processes its page, as README allows). Then
//! `migrate` runs to the newest bundle in the middle of it all.
//!
//! Every application call is timed. None may take longer than the documented bound,
//! [`LOCK_TIMEOUT`] plus [`MARGIN`]: the upgrade asks for every lock with that timeout, and
//! a migration or an object that cannot get one is rolled back and tried again (or left on
//! its older code, busy), so a call queued behind the upgrade waits at most that long. The
//! slow consumer makes that bite: before the bound, the migration that alters
//! `consumer_cursor` (V65) waited behind its open transaction without a timeout, and every
//! reader's `save_cursor` queued behind that migration until the consumer committed, up to
//! [`HOLD`] (by reasoning: this test needs a SQL Server, and none was reachable where it
//! was written). And nothing is lost or repeated: every enqueued message is published,
//! none again after its acknowledgement, and each reader reads every event of both feeds
//! exactly once, each writer's in commit order.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::migrations::{LOCK_TIMEOUT, MigrationReport, Outcome};
use changefeed::outbox::{ClaimProgress, ClaimStore, ClaimToken, Claimed, Failed};
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::relay::{Relay, RelayConfig};
use changefeed::{Client, Cursor, CursorStore, Feed, FeedRow, ReadOptions, TableName};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim_contract::Recorder;
use crate::claim_contract::wake::stopped;
use crate::common::events::{commit_retrying, exec_ok};
use crate::common::load::{
    IDLE_PAUSE, Load, MAX_TRANSIENT_RETRIES, ReaderLog, TASK_LIMIT, WriterKey, check_all_readers,
    check_stored, read_retrying,
};
use crate::common::tasks::{bounded, join, spawn_bounded};
use crate::common::{TestDb, connect_to, exec, rows, scalar_i64};

/// What an application call may take beyond [`LOCK_TIMEOUT`]: the milliseconds one
/// migration's or one object's transaction runs once it has its locks, the call's own work
/// on a server shared by nine sessions and the upgrade, and a call that the upgrade made
/// fail at once (2801, a procedure altered while it ran) tried again.
const MARGIN: Duration = Duration::from_secs(2);

/// How long the slow consumer keeps each of its [`HOLDS`] transactions open: longer than
/// the bound, so that a migration waiting behind it without a lock timeout makes the calls
/// queued behind that migration wait past the bound.
const HOLD: Duration = Duration::from_secs(8);
/// How many transactions the slow consumer holds open, one after the other. Two cover the
/// migrations before `consumer_cursor`'s; and they end long before `migrate` has used its
/// attempts on one migration (2 s each, 1 + 2 + 4 + 8 s apart: 23 s or more).
const HOLDS: usize = 2;

/// The readers' consumer names; the slow consumer's.
const CONSUMERS: [&str; 2] = ["traffic-reader-0", "traffic-reader-1"];
const SLOW_CONSUMER: &str = "zz-traffic-slow";

/// Traffic runs this long before the slow consumer starts, and on the new code after
/// `migrate` returns.
const SETTLE: Duration = Duration::from_secs(1);
/// Every enqueued message is published this long after the writers stopped, at the latest.
const PUBLISH_DEADLINE: Duration = Duration::from_secs(120);
/// Once told to stop, writers write this many more transactions at most (so that all end
/// at the same count, see [`Writers::stop`]).
const STOP_AHEAD: usize = 5;

/// The writers: 0 and 1 commit an event of the outbox-mode feed with its outbox row and
/// enqueue a message; 2 takes the serialized feed's lock, commits an event with its ULID and
/// enqueues a message; 3 enqueues two messages of one aggregate. Each transaction is one
/// batch, as the baseline's procedures take it, and stays the same across the upgrade.
const WRITERS: usize = 4;
/// A writer pauses this many milliseconds between transactions: the relays publish an
/// aggregate's messages one claim after the other, and must keep up.
const WRITER_PAUSE_MS: std::ops::Range<u64> = 10..30;
const ORDERS_WRITERS: usize = 2;
const LEDGER_WRITERS: usize = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn an_upgrade_under_traffic_keeps_every_call_within_the_bound_and_loses_nothing() {
    crate::common::under_both_isolations_from(
        "upgrade_under_traffic",
        super::BASELINE,
        async |db| upgrade_under_traffic(db).await,
    )
    .await;
}

/// The longest call of each kind the application made.
#[derive(Default)]
struct Waits(Mutex<BTreeMap<&'static str, Duration>>);

impl Waits {
    /// Runs `call`, recording how long it took under `kind`.
    async fn time<T>(&self, kind: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let result = call.await;
        let took = started.elapsed();
        let mut longest = self.0.lock().unwrap();
        let entry = longest.entry(kind).or_default();
        *entry = (*entry).max(took);
        result
    }

    /// Every kind's longest call is under `bound`.
    fn check(&self, bound: Duration) {
        let longest = self.0.lock().unwrap();
        eprintln!("-- longest application calls during the upgrade: {longest:?}");
        let over: Vec<_> = longest.iter().filter(|(_, took)| **took >= bound).collect();
        assert!(
            over.is_empty(),
            "application calls waited past the bound of {bound:?} (lock timeout {LOCK_TIMEOUT:?} \
             plus {MARGIN:?}): {over:?}"
        );
        for kind in [
            "read_feed",
            "save_cursor",
            "claim",
            "mark_done",
            "enqueue (orders)",
        ] {
            assert!(longest.contains_key(kind), "no {kind} call was timed");
        }
    }
}

/// A relay's store whose every call is timed, and whose acknowledgements are recorded with
/// their time when every message of the batch was still held (so acknowledged by it).
struct TimedStore {
    inner: SqlClaimStore,
    waits: Arc<Waits>,
    acknowledged: Arc<Mutex<Acknowledgements>>,
}

impl ClaimStore for TimedStore {
    async fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> changefeed::Result<Vec<Claimed>> {
        let waits = Arc::clone(&self.waits);
        waits
            .time("claim", self.inner.claim(batch_size, claim_timeout))
            .await
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> changefeed::Result<u64> {
        let waits = Arc::clone(&self.waits);
        let done = waits
            .time("mark_done", self.inner.mark_done(ids, token))
            .await;
        if matches!(done, Ok(count) if count == ids.len() as u64) {
            let at = Instant::now();
            self.acknowledged.lock().unwrap().push((ids.to_vec(), at));
        }
        done
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> changefeed::Result<u64> {
        let waits = Arc::clone(&self.waits);
        waits
            .time("mark_failed", self.inner.mark_failed(failed))
            .await
    }

    async fn requeue(
        &mut self,
        id: i64,
        token: ClaimToken,
        after: Duration,
    ) -> changefeed::Result<u64> {
        let waits = Arc::clone(&self.waits);
        waits
            .time("requeue", self.inner.requeue(id, token, after))
            .await
    }

    fn claim_waits(&self) -> bool {
        self.inner.claim_waits()
    }

    async fn cancel_claim(&mut self) {
        self.inner.cancel_claim().await;
    }

    fn claim_progress(&self) -> Option<ClaimProgress> {
        self.inner.claim_progress()
    }

    fn outbox_name(&self) -> String {
        self.inner.outbox_name()
    }
}

/// Each acknowledgement that a relay's batch was still held: its ids, and when it returned.
type Acknowledgements = Vec<(Vec<i64>, Instant)>;

/// The objects of the scenario.
#[derive(Clone)]
struct Objects {
    orders: Feed,
    ledger: Feed,
    messages: TableName,
}

async fn upgrade_under_traffic(db: &TestDb) {
    let mut admin = db.client().await;
    let objects = set_up_at_baseline(&mut admin).await;
    let waits = Arc::new(Waits::default());

    let writers = Writers::start(db, &objects, &waits);
    let expected = Arc::new(AtomicUsize::new(usize::MAX));
    let readers: Vec<_> = CONSUMERS
        .iter()
        .map(|consumer| spawn_reader(db, &objects, consumer, &expected, &waits))
        .collect();
    let relays = Relays::start(db, &objects, &waits);
    tokio::time::sleep(SETTLE).await;
    let slow = spawn_slow_consumer(db, &objects, &waits);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let first = changefeed::migrations::migrate(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("migrating under traffic: {error}"));
    eprintln!(
        "-- migrate took {:?}: {} migrations, objects {:?}",
        started.elapsed(),
        first.applied_migrations().len(),
        first.objects()
    );
    tokio::time::sleep(SETTLE).await;

    let events = writers.stop().await;
    expected.store(events, Ordering::SeqCst);
    let logs: Vec<[ReaderLog; 2]> = crate::common::tasks::join_all(readers).await;
    await_every_message_done(&mut admin, &objects.messages).await;
    let (recorder, acknowledged) = relays.stop().await;
    join(slow).await;

    let second = finish_upgrade(&mut admin, &first).await;
    check_every_object_upgraded(&first, second.as_ref());
    waits.check(LOCK_TIMEOUT + MARGIN);
    check_feeds(&mut admin, &objects, &logs, events).await;
    check_messages(
        &mut admin,
        &objects.messages,
        events,
        &recorder,
        &acknowledged,
    )
    .await;
}

/// At the baseline, through its own procedures: the two feeds and the outbox, and every
/// consumer's cursor saved once (so that saves under traffic update their rows).
async fn set_up_at_baseline(admin: &mut Client) -> Objects {
    exec_ok(
        admin,
        "create table dbo.tr_orders (writer int not null, seq int not null, \
             primary key (writer, seq)); \
         exec changefeed.setup_feed @table_name = N'dbo.tr_orders', @outbox = 1; \
         create table dbo.tr_ledger (writer int not null, seq int not null, \
             Shard int not null, ULID binary(16) not null, primary key (writer, seq)); \
         create unique index ux_tr_ledger on dbo.tr_ledger (Shard, ULID); \
         exec changefeed.setup_feed @table_name = N'dbo.tr_ledger', @serialize_writers = 1, \
             @shard_column = N'Shard', @ulid_column = N'ULID'; \
         exec changefeed.setup_outbox @table_name = N'dbo.tr_messages';",
    )
    .await;
    let objects = Objects {
        orders: Feed::new("dbo", "tr_orders").expect("a valid feed name"),
        ledger: Feed::new("dbo", "tr_ledger").expect("a valid feed name"),
        messages: "dbo.tr_messages".parse().expect("a valid outbox name"),
    };
    for feed in [&objects.orders, &objects.ledger] {
        for consumer in CONSUMERS {
            CursorStore::save(admin, consumer, feed, 0, Cursor::START)
                .await
                .unwrap_or_else(|error| panic!("save {consumer}'s cursor of {feed}: {error}"));
        }
    }
    CursorStore::save(admin, SLOW_CONSUMER, &objects.orders, 0, Cursor::START)
        .await
        .expect("save the slow consumer's cursor");
    objects
}

/// The four writers, each on a connection of its own, until told to stop.
struct Writers {
    handles: Vec<JoinHandle<Result<usize, String>>>,
    /// Transactions each writer has started.
    progress: Arc<[AtomicUsize; WRITERS]>,
    /// How many transactions each writer commits in all (`usize::MAX` until stopped).
    target: Arc<AtomicUsize>,
}

impl Writers {
    fn start(db: &TestDb, objects: &Objects, waits: &Arc<Waits>) -> Writers {
        let progress = Arc::new([const { AtomicUsize::new(0) }; WRITERS]);
        let target = Arc::new(AtomicUsize::new(usize::MAX));
        let handles = (0..WRITERS)
            .map(|writer| {
                let (database, objects) = (db.name.clone(), objects.clone());
                let (progress, target, waits) = (progress.clone(), target.clone(), waits.clone());
                spawn_bounded(format!("writer {writer}"), TASK_LIMIT, async move {
                    let mut client = connect_to(&database).await;
                    let mut seq = 0;
                    while seq < target.load(Ordering::SeqCst) {
                        progress[writer].store(seq + 1, Ordering::SeqCst);
                        write(&mut client, &database, &objects, &waits, writer, seq).await?;
                        seq += 1;
                        let pause = rand::random_range(WRITER_PAUSE_MS);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    Ok(seq)
                })
            })
            .collect();
        Writers {
            handles,
            progress,
            target,
        }
    }

    /// Stops every writer at one count of transactions, a few past the furthest one (a
    /// writer checks the target before each transaction, and has announced it in
    /// `progress` before it begins, so none is past the target), and returns that count.
    async fn stop(self) -> usize {
        let furthest = self
            .progress
            .iter()
            .map(|p| p.load(Ordering::SeqCst))
            .max()
            .unwrap_or(0);
        let target = furthest + STOP_AHEAD;
        self.target.store(target, Ordering::SeqCst);
        for (writer, count) in crate::common::tasks::join_all(self.handles)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(count, target, "writer {writer} stopped at the common count");
        }
        target
    }
}

/// The messages writer `writer` enqueues in its transaction `seq`: their message ids, and
/// the `exec` of each. Each writer's messages are one aggregate (a relay publishes its
/// messages one after the other), but writer 3's second message has none.
fn messages_of(messages: &TableName, writer: usize, seq: usize) -> Vec<(String, String)> {
    let aggregate = format!("N'w{writer}'");
    let ids = if writer == 3 {
        vec![
            (format!("w3-{seq}-a"), Some(aggregate)),
            (format!("w3-{seq}-b"), None),
        ]
    } else {
        vec![(format!("w{writer}-{seq}"), Some(aggregate))]
    };
    ids.into_iter()
        .map(|(id, aggregate)| {
            let (aggregate_type, aggregate_id) = match aggregate {
                Some(aggregate) => ("N'writer'".to_owned(), aggregate),
                None => ("null".to_owned(), "null".to_owned()),
            };
            let exec = format!(
                "exec {} @topic = N'traffic', @payload = N'{{\"id\": \"{id}\"}}', \
                 @aggregate_type = {aggregate_type}, @aggregate_id = {aggregate_id}, \
                 @message_id = N'{id}';",
                messages.object("enqueue")
            );
            (id, exec)
        })
        .collect()
}

/// Writer `writer`'s transaction `seq`, one batch, retried (as an application would) after a
/// transient failure unless it committed; each attempt is one timed call.
async fn write(
    client: &mut Client,
    database: &str,
    objects: &Objects,
    waits: &Arc<Waits>,
    writer: usize,
    seq: usize,
) -> Result<(), String> {
    let enqueued = messages_of(&objects.messages, writer, seq);
    let enqueue: String = enqueued.iter().map(|(_, exec)| exec.as_str()).collect();
    let (kind, change) = match writer {
        0 | 1 => (
            "enqueue (orders)",
            format!(
                "insert into dbo.tr_orders (writer, seq) values ({writer}, {seq}); \
                 insert into {} (shard_id, writer, seq) values (0, {writer}, {seq});",
                objects.orders.outbox_table()
            ),
        ),
        2 => (
            "enqueue (ledger)",
            format!(
                "exec {} @shard_id = 0, @lock_timeout_ms = 10000; \
                 insert into dbo.tr_ledger (writer, seq, Shard, ULID) \
                     values (0, {seq}, 0, {}(1));",
                objects.ledger.object("lock_feed"),
                objects.ledger.object("ulid")
            ),
        ),
        _ => ("enqueue (messages only)", String::new()),
    };
    let batch =
        format!("set xact_abort on; begin transaction; {change} {enqueue} commit transaction;");
    // The transaction's messages commit with its event: the first one says whether it did.
    let committed = format!(
        "select count_big(*) from {} where message_id = N'{}';",
        objects.messages.quoted(),
        enqueued[0].0
    );
    commit_retrying(
        client,
        database,
        &format!("writer {writer}, transaction {seq}"),
        MAX_TRANSIENT_RETRIES,
        &committed,
        |client| {
            let (waits, batch) = (Arc::clone(waits), batch.clone());
            Box::pin(async move { waits.time(kind, exec(client, &batch)).await })
        },
    )
    .await
    .map_err(|error| format!("writer {writer}, transaction {seq}: {error}"))
}

/// A reader of both feeds (shard 0 each) as `consumer`: reads a page of each in turn and
/// saves its cursor after every page that had rows, until it has read `expected` events
/// per writer of each feed (known once the writers stopped); then a last read of each must
/// be empty. Returns what it read, per feed.
fn spawn_reader(
    db: &TestDb,
    objects: &Objects,
    consumer: &'static str,
    expected: &Arc<AtomicUsize>,
    waits: &Arc<Waits>,
) -> JoinHandle<Result<[ReaderLog; 2], String>> {
    let (database, objects) = (db.name.clone(), objects.clone());
    let (expected, waits) = (expected.clone(), waits.clone());
    spawn_bounded(format!("reader {consumer}"), TASK_LIMIT, async move {
        let mut client = connect_to(&database).await;
        let feeds = [
            (&objects.orders, ORDERS_WRITERS),
            (&objects.ledger, LEDGER_WRITERS),
        ];
        let options = ReadOptions::default().page_size(20).wait_ms(0);
        let mut cursors = [Cursor::START; 2];
        let mut read: [Vec<FeedRow<WriterKey>>; 2] = Default::default();
        loop {
            let per_writer = expected.load(Ordering::SeqCst);
            let all_read = feeds
                .iter()
                .zip(&read)
                // More than expected ends the loop too: the checks then name the repeat.
                .all(|((_, writers), rows)| rows.len() >= writers.saturating_mul(per_writer));
            if all_read {
                break;
            }
            let mut progressed = false;
            for (index, (feed, _)) in feeds.iter().enumerate() {
                let page = waits
                    .time(
                        "read_feed",
                        read_retrying::<WriterKey>(
                            &mut client,
                            &database,
                            feed,
                            0,
                            cursors[index],
                            options,
                        ),
                    )
                    .await?;
                if page.rows.is_empty() {
                    continue;
                }
                progressed = true;
                cursors[index] = page.next_cursor;
                read[index].extend(page.rows);
                save_cursor(
                    &mut client,
                    &database,
                    &waits,
                    consumer,
                    feed,
                    cursors[index],
                )
                .await?;
            }
            if !progressed {
                tokio::time::sleep(IDLE_PAUSE).await;
            }
        }
        for (index, (feed, _)) in feeds.iter().enumerate() {
            let page = read_retrying::<WriterKey>(
                &mut client,
                &database,
                feed,
                0,
                cursors[index],
                options,
            )
            .await?;
            if !page.rows.is_empty() {
                return Err(format!(
                    "{feed}: after every event, {} more rows: {:?}",
                    page.rows.len(),
                    page.rows.iter().map(|row| row.key).collect::<Vec<_>>()
                ));
            }
        }
        let [orders, ledger] = read;
        Ok([vec![orders], vec![ledger]])
    })
}

/// `save_cursor` of `consumer`, retried after a transient failure (it is idempotent); each
/// attempt is one timed call.
async fn save_cursor(
    client: &mut Client,
    database: &str,
    waits: &Arc<Waits>,
    consumer: &str,
    feed: &Feed,
    cursor: Cursor,
) -> Result<(), String> {
    commit_retrying(
        client,
        database,
        &format!("{consumer}'s save_cursor of {feed}"),
        MAX_TRANSIENT_RETRIES,
        "select count_big(*) where 1 = 0; -- saved again, whatever the failed try did",
        |client| {
            let (waits, feed, consumer) = (Arc::clone(waits), feed.clone(), consumer.to_owned());
            Box::pin(async move {
                waits
                    .time(
                        "save_cursor",
                        CursorStore::save(client, &consumer, &feed, 0, cursor),
                    )
                    .await
            })
        },
    )
    .await
    .map_err(|error| format!("{consumer}: save_cursor of {feed} at {cursor}: {error}"))
}

/// The slow consumer: [`HOLDS`] times, a transaction that saves its cursor and stays open
/// for [`HOLD`] before it commits (its calls are timed like every other).
fn spawn_slow_consumer(
    db: &TestDb,
    objects: &Objects,
    waits: &Arc<Waits>,
) -> JoinHandle<Result<(), String>> {
    let (database, orders, waits) = (db.name.clone(), objects.orders.clone(), waits.clone());
    spawn_bounded("the slow consumer".to_owned(), TASK_LIMIT, async move {
        let mut client = connect_to(&database).await;
        for hold in 0..HOLDS {
            commit_retrying(
                &mut client,
                &database,
                &format!("the slow consumer's transaction {hold}"),
                MAX_TRANSIENT_RETRIES,
                "select count_big(*) where 1 = 0; -- held again, whatever the failed try did",
                |client| {
                    let (waits, orders) = (Arc::clone(&waits), orders.clone());
                    Box::pin(async move {
                        waits
                            .time("begin (slow consumer)", exec(client, "begin transaction;"))
                            .await?;
                        waits
                            .time(
                                "save_cursor (slow consumer, held open)",
                                CursorStore::save(client, SLOW_CONSUMER, &orders, 0, Cursor::START),
                            )
                            .await?;
                        tokio::time::sleep(HOLD).await;
                        waits
                            .time(
                                "commit (slow consumer)",
                                exec(client, "commit transaction;"),
                            )
                            .await
                    })
                },
            )
            .await
            .map_err(|error| format!("the slow consumer's transaction {hold}: {error}"))?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    })
}

/// Two relays of the outbox, each over a `SqlClaimStore` of its own whose claims do not
/// wait on the server (so that a claim's time is its work and its waits), publishing to one
/// recorder.
struct Relays {
    handles: Vec<JoinHandle<changefeed::Result<()>>>,
    stop: watch::Sender<bool>,
    recorder: Arc<Recorder>,
    acknowledged: Arc<Mutex<Acknowledgements>>,
}

impl Relays {
    fn start(db: &TestDb, objects: &Objects, waits: &Arc<Waits>) -> Relays {
        let recorder = Arc::new(Recorder::default());
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let (stop, stop_rx) = watch::channel(false);
        let config = RelayConfig::default()
            .batch_size(10)
            .poll_interval(Duration::from_millis(20));
        let handles = (0..2)
            .map(|_| {
                let store = TimedStore {
                    inner: SqlClaimStore::new(OutboxStore::new(objects.messages.clone()), db.ado())
                        .claim_wait(Duration::ZERO)
                        .expect("a claim without a wait"),
                    waits: Arc::clone(waits),
                    acknowledged: Arc::clone(&acknowledged),
                };
                let relay = Relay::new(store, Arc::clone(&recorder), config.clone())
                    .expect("a valid relay configuration");
                tokio::spawn(relay.run(stopped(stop_rx.clone())))
            })
            .collect();
        Relays {
            handles,
            stop,
            recorder,
            acknowledged,
        }
    }

    /// Stops both relays (they finish their batches in flight) and returns what was
    /// published and acknowledged.
    async fn stop(self) -> (Arc<Recorder>, Acknowledgements) {
        let _ = self.stop.send(true);
        for (relay, handle) in self.handles.into_iter().enumerate() {
            bounded(
                &format!("relay {relay}'s stop"),
                Duration::from_secs(60),
                handle,
            )
            .await
            .expect("the relay task")
            .unwrap_or_else(|error| panic!("relay {relay} failed: {error}"));
        }
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        (self.recorder, acknowledged)
    }
}

/// Waits until every message of `messages` is done (published and acknowledged).
async fn await_every_message_done(admin: &mut Client, messages: &TableName) {
    let deadline = Instant::now() + PUBLISH_DEADLINE;
    let open = format!(
        "select count_big(*) from {} where status <> 2; -- 2: done",
        messages.quoted()
    );
    loop {
        let left = scalar_i64(admin, &open).await;
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} messages are still not done {PUBLISH_DEADLINE:?} after the writers stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the first `migrate` left objects on their older code (busy: the slow consumer or
/// a writer held their locks every time), runs it again now that the traffic has stopped,
/// as `changefeed migrate` says to; that run must leave none.
async fn finish_upgrade(admin: &mut Client, first: &MigrationReport) -> Option<MigrationReport> {
    assert_eq!(
        first.with_outcome(Outcome::Failed).count(),
        0,
        "no regeneration failed: {:?}",
        first.objects()
    );
    if first.is_complete() {
        return None;
    }
    let second = changefeed::migrations::migrate(admin)
        .await
        .unwrap_or_else(|error| panic!("migrating again after the traffic: {error}"));
    assert!(second.applied_migrations().is_empty(), "all applied before");
    assert!(second.is_complete(), "{:?}", second.objects());
    Some(second)
}

/// Both feeds and the outbox were regenerated by one of the runs, and nothing was broken.
fn check_every_object_upgraded(first: &MigrationReport, second: Option<&MigrationReport>) {
    assert_eq!(
        first.applied_migrations().len(),
        usize::try_from(changefeed::migrations::newest_version() - super::BASELINE)
            .expect("the baseline is at most the newest version"),
        "the upgrade applied every migration after the baseline"
    );
    let mut upgraded: BTreeSet<(String, String)> = BTreeSet::new();
    for report in std::iter::once(first).chain(second) {
        assert_eq!(
            report.with_outcome(Outcome::Broken).count(),
            0,
            "{:?}",
            report.objects()
        );
        upgraded.extend(
            report
                .with_outcome(Outcome::Upgraded)
                .map(|o| (o.kind.to_string(), o.name.clone())),
        );
    }
    let expected: BTreeSet<(String, String)> = [
        ("feed", "dbo.tr_orders"),
        ("feed", "dbo.tr_ledger"),
        ("outbox", "dbo.tr_messages"),
    ]
    .into_iter()
    .map(|(kind, name)| (kind.to_owned(), name.to_owned()))
    .collect();
    assert_eq!(upgraded, expected, "every object regenerated once");
}

/// Each reader read every event of each feed exactly once, each writer's in commit order,
/// and all readers the same feed, which the server holds; each reader's saved cursor is the
/// last row it read.
async fn check_feeds(
    admin: &mut Client,
    objects: &Objects,
    logs: &[[ReaderLog; 2]],
    events: usize,
) {
    for (index, (feed, writers, stored)) in [
        (
            &objects.orders,
            ORDERS_WRITERS,
            format!(
                "select shard_id, ulid, writer, seq from {} order by shard_id, ulid;",
                objects.orders.object("feed")
            ),
        ),
        (
            &objects.ledger,
            LEDGER_WRITERS,
            "select Shard, ULID, writer, seq from dbo.tr_ledger order by Shard, ULID;".to_owned(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let load = Load::new(writers, CONSUMERS.len(), events);
        let table = feed.to_string();
        let feed_logs: Vec<ReaderLog> = logs.iter().map(|log| log[index].clone()).collect();
        let reference = check_all_readers(&table, &feed_logs, load, 1);
        check_stored(
            admin,
            &table,
            "the feed",
            &stored,
            &reference,
            load.events(),
        )
        .await;
        for (consumer, log) in CONSUMERS.iter().zip(&feed_logs) {
            let last = log[0]
                .last()
                .map(|row| row.ulid)
                .expect("a reader read rows");
            let saved = CursorStore::load(admin, consumer, feed, 0)
                .await
                .unwrap_or_else(|error| panic!("load {consumer}'s cursor of {feed}: {error}"))
                .expect("a saved cursor");
            assert_eq!(
                saved.ulid(),
                last,
                "{consumer} saved its last row of {feed}"
            );
        }
    }
}

/// The outbox holds exactly the messages the writers committed; each was published, and
/// none again after a relay acknowledged it.
async fn check_messages(
    admin: &mut Client,
    messages: &TableName,
    events: usize,
    recorder: &Recorder,
    acknowledged: &Acknowledgements,
) {
    let stored: BTreeMap<String, i64> = rows(
        admin,
        &format!("select message_id, id from {};", messages.quoted()),
    )
    .await
    .expect("the outbox's messages")
    .iter()
    .map(|row| {
        (
            row.get::<&str, _>(0).expect("message_id").to_owned(),
            row.get::<i64, _>(1).expect("id"),
        )
    })
    .collect();
    let committed: BTreeSet<String> = (0..WRITERS)
        .flat_map(|writer| (0..events).flat_map(move |seq| messages_of(messages, writer, seq)))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        stored.keys().cloned().collect::<BTreeSet<_>>(),
        committed,
        "the outbox holds every message the writers committed, once"
    );
    let published = recorder.ids();
    let unpublished: Vec<&String> = stored
        .iter()
        .filter(|(_, id)| !published.contains(id))
        .map(|(message_id, _)| message_id)
        .collect();
    assert!(unpublished.is_empty(), "never published: {unpublished:?}");

    let mut first_acknowledged: BTreeMap<i64, Instant> = BTreeMap::new();
    for (ids, at) in acknowledged {
        for id in ids {
            first_acknowledged
                .entry(*id)
                .and_modify(|first| *first = (*first).min(*at))
                .or_insert(*at);
        }
    }
    let again: Vec<i64> = recorder
        .published
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, at)| first_acknowledged.get(id).is_some_and(|acked| at > acked))
        .map(|(id, _)| *id)
        .collect();
    assert!(
        again.is_empty(),
        "published again after a relay acknowledged them: {again:?}"
    );
}
