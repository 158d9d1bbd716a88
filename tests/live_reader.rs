//! Live tests of the Rust reader (`FeedReader`, `CursorStore`, `Cursor::at`) against a real
//! SQL Server: independent consumers under concurrent writers, replay from a point in time,
//! a cursor saved in the consumer's own transaction, a connection killed mid-stream, the
//! long-poll latency, and a stream whose cursor a forced purge passes.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_reader -- --ignored`. Every scenario
//! runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of its own. Every
//! task and every wait is bounded, so a stuck stream fails the test instead of hanging it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use changefeed::reader::{FeedReader, FeedReaderOptions, ReadRetryPolicy, Wait};
use changefeed::{Client, Cursor, CursorStore, Error, Feed, FeedRow, Page};
use common::events::{
    column_values, create_feed, exec_ok, feed_reader, hex, keys, pairs, read_to_end, required,
    rows_ok, server_now_ms, spawn_held_writers, spawn_writers, write_all_ok, write_and_read_all,
    write_ok,
};
use common::tasks::{bounded, join, join_all, join_result, spawn_bounded};
use common::{TestDb, exec, rows, scalar_i64};
use futures::{Stream, StreamExt};
use ulid::Ulid;

/// The longest any one task (writer, consumer, killer) may run before the test calls it stuck.
const TASK_LIMIT: Duration = Duration::from_secs(180);

/// A scenario's feed `table` and a reader of it with a pool of `connections`, pages of
/// `page_size` and a short long-poll (500 ms); and the admin connection that created it.
async fn feed_and_reader(
    db: &TestDb,
    table: &str,
    connections: u32,
    page_size: u32,
) -> (Client, Feed, FeedReader) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, table).await;
    let options = FeedReaderOptions::default()
        .page_size(page_size)
        .wait(Wait::LongPoll(Duration::from_millis(500)));
    let reader = feed_reader(db, &feed, connections, options).await;
    (admin, feed, reader)
}

// ------------------------------------------------------------------------------------------
// 1. Three consumers, four writers, one feed
// ------------------------------------------------------------------------------------------

common::live_test!(three_consumers_under_concurrent_writers_see_the_same_ulid_sequence: "reader_three_consumers" => three_consumers_scenario);

/// Three independent consumers, each its own `FeedReader` stream from `Cursor::START`
/// (their own pooled connection and cursor), follow one feed while four writers commit
/// 50 events each. Each consumer collects until it has all 200; the three sequences of
/// (ULID, key) must be identical, hold every event exactly once, be in strictly increasing
/// ULID order, equal the feed table itself, and keep each writer's own commit order (a
/// writer waits for each commit before its next transaction, so the ordering contract
/// applies to its events).
async fn three_consumers_scenario(db: &TestDb) {
    const CONSUMERS: usize = 3;
    const WRITERS: i64 = 4;
    const EVENTS_PER_WRITER: i64 = 50;
    let total = (WRITERS * EVENTS_PER_WRITER) as usize;

    // Small pages, so that pages and moves interleave; a short long-poll.
    let (mut admin, feed, reader) = feed_and_reader(db, "three_consumers", 6, 17).await;

    // The consumers start first, on an empty feed: they long-poll until rows come.
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|consumer| {
            let pages = reader.stream::<i64>(0, Cursor::START);
            spawn_bounded(
                format!("consumer {consumer}"),
                TASK_LIMIT,
                collect_rows(pages, total),
            )
        })
        .collect();
    let writers = spawn_writers(db, &feed, (WRITERS, EVENTS_PER_WRITER), TASK_LIMIT, 0..6);
    join_all(writers).await;
    let mut seen = Vec::new();
    for consumer in consumers {
        seen.push(join(consumer).await);
    }

    let expected_keys: BTreeSet<i64> = (0..WRITERS)
        .flat_map(|writer| (0..EVENTS_PER_WRITER).map(move |seq| event_id(writer, seq)))
        .collect();
    for (consumer, rows) in seen.iter().enumerate() {
        let what = format!("consumer {consumer}");
        assert_eq!(rows.len(), total, "{what}: rows seen");
        assert_exactly_once(&what, rows, &expected_keys);
        assert_strictly_increasing(&what, rows);
        assert_writer_order(&what, rows);
    }
    for consumer in 1..CONSUMERS {
        assert_eq!(
            pairs(&seen[consumer]),
            pairs(&seen[0]),
            "consumers 0 and {consumer} must see the same ULID sequence"
        );
    }
    assert_eq!(
        pairs(&seen[0]),
        feed_rows(&mut admin, &feed, 0).await,
        "the consumers' sequence is the feed's"
    );
}

// ------------------------------------------------------------------------------------------
// 2. Replay from a point in time
// ------------------------------------------------------------------------------------------

common::live_test!(replay_from_a_point_in_time_yields_exactly_the_later_events: "reader_replay_at" => replay_at_scenario);

/// Ten events, a point in time `t` read from the server's clock, ten more: a stream from
/// `Cursor::at(t)` yields exactly the second ten.
///
/// Why this holds. A row's ULID is fixed when `read_feed` moves it from the outbox into the
/// feed, and its time is the row's `time_hint` (here the default, the server's
/// `sysutcdatetime()` at the insert) lifted to the running maximum of the shard: never
/// earlier than the hint, never later than the latest hint moved so far (the lift only takes
/// the maximum of hints and of the shard's last millisecond, which is itself an earlier
/// hint). So:
/// * the first ten are written *and read* (moved, their ULIDs fixed) before `t` is taken;
///   their ULID times are at most their latest hint, which is earlier than `t` (50 ms of
///   sleep lie between) — had they stayed in the outbox, they would have been moved later
///   but still with their own, earlier, times: reading them first just makes the test not
///   depend on that;
/// * the second ten are inserted after `t` was read from the same clock, so their hints,
///   hence their ULID times, are `t` or later.
///
/// `Cursor::at(t)` is `t`'s millisecond with a zero tail: below every ULID of that
/// millisecond or later, above every ULID of an earlier one.
async fn replay_at_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = feed_and_reader(db, "replay_at", 3, 100).await;
    let mut writer = db.client().await;

    let first = write_and_read_all(&mut writer, &feed, &reader, 1..=10).await;
    assert_eq!(keys(&first), (1..=10).collect::<Vec<_>>(), "the first ten");

    tokio::time::sleep(Duration::from_millis(50)).await;
    let t_ms = server_now_ms(&mut admin).await;
    let t = UNIX_EPOCH + Duration::from_millis(t_ms as u64);
    for row in &first {
        assert!(
            (row.ulid.timestamp_ms() as i64) < t_ms,
            "the first ten were moved before t = {t_ms}: {} has time {}",
            row.ulid,
            row.ulid.timestamp_ms()
        );
    }
    tokio::time::sleep(Duration::from_millis(5)).await;

    write_all_ok(&mut writer, &feed, 0, 11..=20).await;

    let replay = bounded(
        "the replay from Cursor::at(t)",
        Duration::from_secs(30),
        collect_rows(reader.stream::<i64>(0, Cursor::at(t)), 10),
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        keys(&replay),
        (11..=20).collect::<Vec<_>>(),
        "a stream from Cursor::at(t) yields exactly the second ten, in order"
    );
    for row in &replay {
        assert!(
            row.ulid.timestamp_ms() as i64 >= t_ms,
            "{} (time {}) is before t = {t_ms}",
            row.ulid,
            row.ulid.timestamp_ms()
        );
        assert!(Cursor::from_ulid(row.ulid) > Cursor::at(t));
    }
    // Nothing more after them, and the whole feed is the first ten then these.
    let after = reader
        .read_page::<i64>(0, Cursor::from_ulid(replay[9].ulid))
        .await
        .expect("read after the replay");
    assert!(
        after.rows.is_empty(),
        "nothing after the second ten: {after:?}"
    );
    let all = read_to_end(&reader, 0, Cursor::START).await;
    assert_eq!(pairs(&all[..10]), pairs(&first));
    assert_eq!(pairs(&all[10..]), pairs(&replay));
}

// ------------------------------------------------------------------------------------------
// 3. A cursor saved in the side effect's transaction
// ------------------------------------------------------------------------------------------

common::live_test!(cursor_saved_in_the_side_effect_transaction_rolls_back_and_commits_with_it: "reader_cursor_tx" => cursor_transaction_scenario);

/// The consumer reads a page outside any transaction (`read_feed` must), then applies it on
/// a second connection: `begin tran; insert into dbo.sink ...; CursorStore::save(...)`.
/// Rolled back, the saved cursor is the old one and the sink is empty (a consumer that had
/// never saved one still has none); committed, both the cursor and the sink rows are there,
/// and resuming from the loaded cursor reads the next page: each event applied once.
async fn cursor_transaction_scenario(db: &TestDb) {
    const CONSUMER: &str = "billing";
    const NEWCOMER: &str = "audit";
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "cursor_tx").await;
    exec_ok(
        &mut admin,
        "create table dbo.sink (id bigint not null primary key);",
    )
    .await;
    let reader = feed_reader(db, &feed, 3, FeedReaderOptions::default().page_size(4)).await;
    let mut writer = db.client().await;
    write_all_ok(&mut writer, &feed, 0, 1..=10).await;

    // The old cursor.
    CursorStore::save(&mut admin, CONSUMER, &feed, 0, Cursor::START)
        .await
        .expect("save the old cursor");
    let mut sink = db.client().await;
    let start = load(&mut sink, CONSUMER, &feed).await;
    assert_eq!(start, Some(Cursor::START));
    assert_eq!(load(&mut sink, NEWCOMER, &feed).await, None);

    let page = reader
        .read_page::<i64>(0, Cursor::START)
        .await
        .expect("read a page outside a transaction");
    assert_eq!(keys(&page.rows), vec![1, 2, 3, 4]);

    // Rolled back: neither the side effect nor the cursors remain.
    apply_page(&mut sink, &feed, &page, &[CONSUMER, NEWCOMER]).await;
    assert_eq!(
        load(&mut sink, CONSUMER, &feed).await,
        Some(page.next_cursor),
        "inside its transaction, the session sees the cursor it saved"
    );
    exec_ok(&mut sink, "rollback transaction;").await;
    assert_eq!(
        load(&mut admin, CONSUMER, &feed).await,
        Some(Cursor::START),
        "the rolled-back save left the old cursor"
    );
    assert_eq!(
        load(&mut admin, NEWCOMER, &feed).await,
        None,
        "a consumer whose first save was rolled back has no cursor"
    );
    assert_eq!(
        scalar_i64(&mut admin, "select count_big(*) from dbo.sink;").await,
        0,
        "the rolled-back side effect is gone"
    );

    // Committed: both.
    apply_page(&mut sink, &feed, &page, &[CONSUMER, NEWCOMER]).await;
    exec_ok(&mut sink, "commit transaction;").await;
    assert_eq!(
        load(&mut admin, CONSUMER, &feed).await,
        Some(page.next_cursor)
    );
    assert_eq!(
        load(&mut admin, NEWCOMER, &feed).await,
        Some(page.next_cursor)
    );
    assert_eq!(
        sink_ids(&mut admin).await,
        vec![1, 2, 3, 4],
        "the committed side effect"
    );

    // Resuming from the saved cursor continues after the applied page.
    let resume = load(&mut sink, CONSUMER, &feed)
        .await
        .expect("a saved cursor");
    let next = reader
        .read_page::<i64>(0, resume)
        .await
        .expect("the next page");
    assert_eq!(keys(&next.rows), vec![5, 6, 7, 8]);
}

/// Opens a transaction on `sink`, inserts the page's keys and saves the cursor after it for
/// every consumer, and leaves the transaction open.
async fn apply_page(sink: &mut Client, feed: &Feed, page: &Page<FeedRow<i64>>, consumers: &[&str]) {
    exec_ok(sink, "begin transaction;").await;
    for row in &page.rows {
        sink.execute("insert into dbo.sink (id) values (@P1);", &[&row.key])
            .await
            .unwrap_or_else(|error| panic!("insert {} into the sink: {error}", row.key));
    }
    for consumer in consumers {
        CursorStore::save(sink, consumer, feed, 0, page.next_cursor)
            .await
            .unwrap_or_else(|error| panic!("save {consumer}'s cursor: {error}"));
    }
}

async fn sink_ids(client: &mut Client) -> Vec<i64> {
    column_values(client, "select id from dbo.sink order by id;", "id").await
}

// ------------------------------------------------------------------------------------------
// 4. A connection killed mid-stream
// ------------------------------------------------------------------------------------------

common::live_test!(killed_connection_mid_stream_resumes_without_loss_or_repeat: "reader_kill" => kill_scenario);

/// A `FeedReader` stream (pages of 10) follows a feed while five writers commit 500 events;
/// meanwhile an admin session `KILL`s the reader's session, several times. The reader's pool
/// connects with its own `Application Name`, so its sessions are exactly those of
/// `sys.dm_exec_sessions` with that `program_name` (the writers and the admin connect with
/// the default one, and the admin's own `@@spid` is excluded anyway). A kill lands while the
/// session long-polls, reads or moves (the move's transaction is rolled back, its rows stay
/// in the outbox for the next move), or while it sits between calls; the stream must see a
/// transient failure, retry on a fresh connection from the cursor of the last page it
/// yielded, and end up with exactly the feed's rows: no loss, no repeat.
///
/// To be sure the kills land mid-stream, the writers hold back their last 100 events until
/// the killer is done: the stream cannot have finished before.
async fn kill_scenario(db: &TestDb) {
    const WRITERS: i64 = 5;
    const EVENTS_PER_WRITER: i64 = 100;
    /// Each writer's events from this one on wait for the kills.
    const HELD_BACK_FROM: i64 = 80;
    const KILLS: usize = 6;
    let total = (WRITERS * EVENTS_PER_WRITER) as usize;

    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "kill").await;
    let application = format!("{}_reader", db.name);
    let pool = changefeed::pool::pool(&format!("{};Application Name={application}", db.ado()), 2)
        .await
        .expect("a pool");
    let reader = FeedReader::with_options(
        pool,
        feed.clone(),
        FeedReaderOptions::default()
            .page_size(10)
            .wait(Wait::LongPoll(Duration::from_millis(500)))
            .retry(
                ReadRetryPolicy::default()
                    .initial(Duration::from_millis(5))
                    .max(Duration::from_millis(200))
                    .max_retries(Some(100)),
            ),
    )
    .expect("valid options");

    let collected = Arc::new(AtomicUsize::new(0));
    let consumer_done = Arc::new(AtomicBool::new(false));
    let kills_done = Arc::new(AtomicBool::new(false));

    let consumer = {
        let pages = reader.stream::<i64>(0, Cursor::START);
        let collected = Arc::clone(&collected);
        let done = SetOnDrop(Arc::clone(&consumer_done));
        spawn_bounded("the consumer".to_owned(), TASK_LIMIT, async move {
            let _done = done;
            let mut pages = std::pin::pin!(pages);
            let mut rows = Vec::new();
            while rows.len() < total {
                match pages.next().await {
                    Some(Ok(page)) => {
                        rows.extend(page.rows);
                        collected.store(rows.len(), Ordering::SeqCst);
                    }
                    Some(Err(error)) => {
                        return Err(format!(
                            "the stream ended with an error after {} rows (a killed session \
                             must count as a transient failure): {error}",
                            rows.len()
                        ));
                    }
                    None => return Err(format!("the stream ended after {} rows", rows.len())),
                }
            }
            Ok(rows)
        })
    };

    let writers = spawn_held_writers(
        db,
        &feed,
        (WRITERS, EVENTS_PER_WRITER),
        TASK_LIMIT,
        2..12,
        Some((HELD_BACK_FROM, Arc::clone(&kills_done))),
    );

    let killer = {
        let database = db.name.clone();
        let collected = Arc::clone(&collected);
        let consumer_done = Arc::clone(&consumer_done);
        // Set however the killer ends, so that the writers never wait for it in vain.
        let kills_done = SetOnDrop(Arc::clone(&kills_done));
        spawn_bounded("the killer".to_owned(), TASK_LIMIT, async move {
            let _kills_done = kills_done;
            let mut killer = common::connect_to(&database).await;
            // A session is its id and its login time: ids are reused by new connections,
            // and a session being killed may still be listed for a moment.
            let sessions_sql = format!(
                "select session_id, datediff_big(microsecond, '20000101', login_time) \
                 from sys.dm_exec_sessions \
                 where program_name = N'{application}' and session_id <> @@spid;"
            );
            let mut killed_sessions = BTreeSet::new();
            let mut kills = Vec::new();
            while kills.len() < KILLS {
                if consumer_done.load(Ordering::SeqCst) {
                    return Err(format!(
                        "the consumer ended after {} kills, before all {KILLS}",
                        kills.len()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(rand::random_range(30..150))).await;
                let sessions: Vec<(i16, i64)> = rows(&mut killer, &sessions_sql)
                    .await
                    .map_err(|error| format!("list the reader's sessions: {error}"))?
                    .iter()
                    .filter_map(|row| {
                        let id = row.try_get::<i16, usize>(0).ok().flatten()?;
                        let login = row.try_get::<i64, usize>(1).ok().flatten()?;
                        Some((id, login))
                    })
                    .filter(|session| !killed_sessions.contains(session))
                    .collect();
                let mut killed_any = false;
                for session in sessions {
                    match exec(&mut killer, &format!("kill {};", session.0)).await {
                        Ok(()) => {
                            killed_sessions.insert(session);
                            killed_any = true;
                        }
                        // 6106: the session ended between the query and the KILL.
                        Err(error) if error.server_number() == Some(6106) => {}
                        Err(error) => return Err(format!("kill {}: {error}", session.0)),
                    }
                }
                if killed_any {
                    kills.push(collected.load(Ordering::SeqCst));
                }
            }
            Ok(kills)
        })
    };

    // The consumer's failure, if any, is the one to report: the killer then fails too.
    let kills = join_result(killer).await;
    join_all(writers).await;
    let seen = join(consumer).await;
    let kills = kills.unwrap_or_else(|message| panic!("{message}"));
    eprintln!(
        "-- killed the reader's session {} times, after {kills:?} rows",
        kills.len()
    );
    assert_eq!(kills.len(), KILLS);
    assert!(
        kills.iter().all(|&rows| rows < total),
        "every kill landed before the stream had everything"
    );

    let expected_keys: BTreeSet<i64> = (0..WRITERS)
        .flat_map(|writer| (0..EVENTS_PER_WRITER).map(move |seq| event_id(writer, seq)))
        .collect();
    assert_eq!(seen.len(), total);
    assert_exactly_once("the killed consumer", &seen, &expected_keys);
    assert_strictly_increasing("the killed consumer", &seen);
    assert_eq!(
        pairs(&seen),
        feed_rows(&mut admin, &feed, 0).await,
        "the consumer's rows are exactly the feed's"
    );
}

// ------------------------------------------------------------------------------------------
// 5. Long-poll latency
// ------------------------------------------------------------------------------------------

common::live_test!(long_poll_latency_from_commit_to_delivery: "reader_latency" => latency_scenario);

/// A stream with the default options (a 10 s server long-poll) waits at the head; one
/// writer commits 50 events one at a time, each after a random pause (so commits land at
/// every phase of the server's 5–100 ms polling steps) and each only once the previous one
/// was delivered, so the stream is long-polling every time. The latency is from the commit's
/// acknowledgement to the page reaching the consumer (zero when the page came first); p50,
/// p95 and max are printed, and only asserted loosely: every event within 5 s.
async fn latency_scenario(db: &TestDb) {
    const EVENTS: i64 = 50;
    const DELIVERY_LIMIT: Duration = Duration::from_secs(5);

    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "latency").await;
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");
    let reader = FeedReader::new(pool, feed.clone());
    assert_eq!(
        reader.options().wait,
        Wait::LongPoll(Duration::from_secs(10))
    );

    let (deliveries, mut delivered) = tokio::sync::mpsc::unbounded_channel::<(i64, Instant)>();
    let pages = reader.stream::<i64>(0, Cursor::START);
    let consumer = spawn_bounded("the consumer".to_owned(), TASK_LIMIT, async move {
        let mut pages = std::pin::pin!(pages);
        let mut count = 0;
        while count < EVENTS {
            match pages.next().await {
                Some(Ok(page)) => {
                    let now = Instant::now();
                    for row in &page.rows {
                        count += 1;
                        let _ = deliveries.send((row.key, now));
                    }
                }
                Some(Err(error)) => return Err(format!("the stream failed: {error}")),
                None => return Err("the stream ended".to_owned()),
            }
        }
        Ok(())
    });

    // Let the stream reach its first long-poll.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut writer = db.client().await;
    let mut latencies = Vec::new();
    for id in 1..=EVENTS {
        tokio::time::sleep(Duration::from_millis(rand::random_range(20..200))).await;
        write_ok(&mut writer, &feed, 0, id, None).await;
        let committed = Instant::now();
        let (key, at) = bounded(
            &format!("the delivery of event {id}"),
            DELIVERY_LIMIT,
            delivered.recv(),
        )
        .await
        .expect("the consumer is running");
        assert_eq!(key, id, "events are delivered in commit order");
        latencies.push(at.saturating_duration_since(committed));
    }
    join(consumer).await;

    latencies.sort();
    let percentile = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    eprintln!(
        "-- long-poll latency from commit to delivery over {EVENTS} events ({:?}): p50 {:?}, \
         p95 {:?}, max {:?}",
        db.isolation,
        percentile(50),
        percentile(95),
        latencies[latencies.len() - 1]
    );
    assert!(latencies[latencies.len() - 1] < DELIVERY_LIMIT);
}

// ------------------------------------------------------------------------------------------
// 6. A stream whose cursor a forced purge passes
// ------------------------------------------------------------------------------------------

common::live_test!(stream_ends_with_cursor_expired_when_a_forced_purge_passes_its_cursor: "reader_expired" => expired_stream_scenario);

/// A stream has yielded its first page (events 1–5; its cursor is event 5's ULID) when
/// `purge_feed @before = <event 10>, @force = 1` deletes events 1–9 (its cursor is not
/// registered, and `@force` would ignore it anyway). The stream's next read finds events
/// 10.. but its cursor is below the low-water mark (event 9): `read_feed` raises 51104,
/// and the stream yields `Error::CursorExpired` once and ends — it does not retry, and it
/// does not go on as if nothing were missing. A stream at the low-water mark itself, or
/// from `Cursor::START`, reads on from event 10.
async fn expired_stream_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = feed_and_reader(db, "expired_stream", 4, 5).await;
    let mut writer = db.client().await;
    let all = write_and_read_all(&mut writer, &feed, &reader, 1..=20).await;
    assert_eq!(keys(&all), (1..=20).collect::<Vec<_>>());

    let mut pages = std::pin::pin!(reader.stream::<i64>(0, Cursor::START));
    let first = next_item(&mut pages, "the first page")
        .await
        .expect("the first page");
    assert_eq!(keys(&first.rows), vec![1, 2, 3, 4, 5]);

    // The stream is suspended after yielding: its next read starts when it is polled.
    exec_ok(
        &mut admin,
        &format!(
            "exec {} @before = {}, @force = 1;",
            feed.object("purge_feed"),
            hex(&all[9].ulid.to_bytes())
        ),
    )
    .await;
    assert_eq!(
        feed_rows(&mut admin, &feed, 0)
            .await
            .first()
            .map(|row| row.1),
        Some(10),
        "the forced purge deleted events 1-9"
    );

    match next_item(&mut pages, "the read after the purge").await {
        Err(Error::CursorExpired { message }) => {
            assert!(message.contains("purged"), "{message}");
        }
        other => panic!("expected Error::CursorExpired, got {other:?}"),
    }
    let end = bounded(
        "the end of the expired stream",
        Duration::from_secs(10),
        pages.next(),
    )
    .await;
    assert!(
        end.is_none(),
        "the stream ends after CursorExpired: {end:?}"
    );

    // At the low-water mark (event 9) nothing was lost: it reads on.
    let at_mark = first_page(&reader, Cursor::from_ulid(all[8].ulid)).await;
    assert_eq!(keys(&at_mark.rows), vec![10, 11, 12, 13, 14]);
    // From the start: the oldest retained event.
    let from_start = first_page(&reader, Cursor::START).await;
    assert_eq!(keys(&from_start.rows), vec![10, 11, 12, 13, 14]);
}

async fn next_item<S, T>(stream: &mut S, what: &str) -> changefeed::Result<T>
where
    S: Stream<Item = changefeed::Result<T>> + Unpin,
{
    bounded(what, Duration::from_secs(30), stream.next())
        .await
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
}

async fn first_page(reader: &FeedReader, cursor: Cursor) -> Page<FeedRow<i64>> {
    let mut pages = std::pin::pin!(reader.stream::<i64>(0, cursor));
    next_item(&mut pages, &format!("the first page from {cursor}"))
        .await
        .unwrap_or_else(|error| panic!("the stream from {cursor} failed: {error}"))
}

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// The key of writer `writer`'s event `seq`.
fn event_id(writer: i64, seq: i64) -> i64 {
    writer * 1_000_000 + seq
}

/// Collects the rows of a stream until it has `want` of them; an error or the end of the
/// stream first is a failure.
async fn collect_rows<S>(pages: S, want: usize) -> Result<Vec<FeedRow<i64>>, String>
where
    S: Stream<Item = changefeed::Result<Page<FeedRow<i64>>>>,
{
    let mut pages = std::pin::pin!(pages);
    let mut rows = Vec::new();
    while rows.len() < want {
        match pages.next().await {
            Some(Ok(page)) => rows.extend(page.rows),
            Some(Err(error)) => {
                return Err(format!(
                    "the stream failed after {} rows: {error}",
                    rows.len()
                ));
            }
            None => return Err(format!("the stream ended after {} rows", rows.len())),
        }
    }
    Ok(rows)
}

async fn load(client: &mut Client, consumer: &str, feed: &Feed) -> Option<Cursor> {
    CursorStore::load(client, consumer, feed, 0)
        .await
        .unwrap_or_else(|error| panic!("load {consumer}'s cursor: {error}"))
}

/// The feed table's (ulid, key) rows of a shard, in ULID order.
async fn feed_rows(client: &mut Client, feed: &Feed, shard: i32) -> Vec<(Ulid, i64)> {
    rows_ok(
        client,
        &format!(
            "select ulid, id from {} where shard_id = {shard} order by ulid;",
            feed.object("feed")
        ),
    )
    .await
    .iter()
    .map(|row| {
        let bytes = required::<&[u8]>(row, "ulid");
        let ulid = Cursor::from_bytes(bytes).expect("binary(16)").ulid();
        (ulid, required::<i64>(row, "id"))
    })
    .collect()
}

fn assert_exactly_once(what: &str, rows: &[FeedRow<i64>], expected: &BTreeSet<i64>) {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for row in rows {
        *counts.entry(row.key).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "{what}: repeated events {repeated:?}");
    let seen: BTreeSet<i64> = counts.keys().copied().collect();
    let missing: Vec<_> = expected.difference(&seen).collect();
    let unexpected: Vec<_> = seen.difference(expected).collect();
    assert!(missing.is_empty(), "{what}: lost events {missing:?}");
    assert!(
        unexpected.is_empty(),
        "{what}: unknown events {unexpected:?}"
    );
}

fn assert_strictly_increasing(what: &str, rows: &[FeedRow<i64>]) {
    for pair in rows.windows(2) {
        assert!(
            pair[0].ulid < pair[1].ulid,
            "{what}: ULIDs must strictly increase, got {} (key {}) then {} (key {})",
            pair[0].ulid,
            pair[0].key,
            pair[1].ulid,
            pair[1].key
        );
    }
}

/// Each writer's events come in the order it committed them (keys `writer * 10^6 + seq`).
fn assert_writer_order(what: &str, rows: &[FeedRow<i64>]) {
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for row in rows {
        let (writer, seq) = (row.key / 1_000_000, row.key % 1_000_000);
        if let Some(previous) = last.insert(writer, seq) {
            assert!(
                previous < seq,
                "{what}: writer {writer}'s event {seq} came after its event {previous}"
            );
        }
    }
}

/// Sets its flag when dropped: however a task ends, those waiting for it learn.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
