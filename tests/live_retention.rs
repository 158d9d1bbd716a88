//! Live tests of feed retention: `[changefeed].[purge_feed:S.T]`, the per-shard low-water
//! mark (`state.purged_through`), `read_feed`'s expired-cursor error 51104 (the Rust
//! `Error::CursorExpired`), the `changefeed.consumer_lag` view, and which consumers hold a
//! purge back: only registered ones (`changefeed.register_consumer`, issue 29 item 3).
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_retention -- --ignored`. Every
//! scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of its
//! own.
//!
//! What counts for retention is a row's ULID time, fixed when `read_feed` moves the row from
//! the outbox into the feed: its `time_hint` lifted to the running maximum of the shard. To
//! make rows look old, the tests write them with explicit old time hints, oldest first, and
//! read after each group so that each group is moved (and gets its time) on its own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use changefeed::reader::{FeedReader, FeedReaderOptions};
use changefeed::{Client, Cursor, CursorStore, Error, Feed, FeedRow, ReadOptions, read_page};
use common::events::{
    column_values, create_feed, exec_ok, feed_reader, hex, keys, pairs, read_to_end, required,
    rows_ok, server_now_ms, server_number, spawn_writers, state_row, ulids, write_all_ok,
    write_and_read_all, write_ok,
};
use common::logins::Login;
use common::sessions::{await_lock_wait, session_id};
use common::tasks::{expect_denied, join, join_all, spawn_bounded};
use common::{TestDb, exec, rows, scalar_i64};
use tiberius::Row;
use ulid::Ulid;

const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;
/// The longest any one task may run before the test calls it stuck.
const TASK_LIMIT: Duration = Duration::from_secs(180);

// ------------------------------------------------------------------------------------------
// 1. A lagging consumer holds the purge back; @force does not wait for it
// ------------------------------------------------------------------------------------------

common::live_test!(purge_is_held_back_by_a_lagging_consumer_and_force_expires_it: "retention_lagging" => lagging_consumer_scenario);

/// Twenty events; consumer A saved its cursor at event 8, consumer B at event 15. A purge of
/// everything (`@older_than_ms = 0`) deletes events 1–8 only (A has processed up to and
/// including its cursor), stops 'held back by consumer A', and sets the low-water mark to
/// event 8; A reads on from its cursor, and `Cursor::START` reads from the oldest retained
/// event, 9. Then `@force = 1` deletes the rest: A's next `read_page` fails with
/// `Error::CursorExpired`, and `consumer_lag` shows A (and B) expired. `Cursor::START` still
/// works — it reads from the oldest retained event, here the ones written after the purge —
/// and so does a cursor at the low-water mark; A saving `Cursor::START` (what README tells an
/// expired consumer to do) is no longer expired.
async fn lagging_consumer_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "lagging", 100).await;
    let mut writer = db.client().await;
    let u = write_and_read_all(&mut writer, &feed, &reader, 1..=20).await;
    assert_eq!(keys(&u), (1..=20).collect::<Vec<_>>());
    let u = ulids(&u);

    save(&mut admin, "A", &feed, 0, Cursor::from_ulid(u[7])).await;
    save(&mut admin, "B", &feed, 0, Cursor::from_ulid(u[14])).await;
    register(&mut admin, "A", &feed).await;
    register(&mut admin, "B", &feed).await;
    wait_until_older_than_now(&mut admin, u[19]).await;

    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(report.len(), 1, "one row per shard: {report:?}");
    let shard = &report[0];
    assert_eq!(shard.shard_id, 0);
    assert_eq!(shard.deleted, 8, "{shard:?}");
    assert_eq!(
        shard.purged_through,
        Some(u[7]),
        "the low-water mark is A's cursor"
    );
    assert_eq!(shard.stopped_because, "held back by consumer A");
    assert!(!shard.dry_run);
    assert_eq!(
        shard.passed_consumers, None,
        "a registered consumer is never passed"
    );
    assert_eq!(
        feed_keys(&mut admin, &feed, 0).await,
        (9..=20).collect::<Vec<_>>()
    );

    let a = reader
        .read_page::<i64>(0, Cursor::from_ulid(u[7]))
        .await
        .expect("A's cursor is at the low-water mark, not below it");
    assert_eq!(keys(&a.rows), (9..=20).collect::<Vec<_>>());
    let start = reader
        .read_page::<i64>(0, Cursor::START)
        .await
        .expect("Cursor::START is never expired");
    assert_eq!(
        start.rows.first().map(|row| row.key),
        Some(9),
        "the oldest retained event"
    );
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(!lag["A"].expired, "{lag:?}");
    assert!(!lag["B"].expired, "{lag:?}");
    assert!(
        lag["A"].lag_ms >= lag["B"].lag_ms,
        "A is further behind than B: {lag:?}"
    );

    // @force: A's cursor does not hold it back.
    let report = purge(
        &mut admin,
        &feed,
        &Purge {
            force: true,
            ..Purge::older_than(0)
        },
    )
    .await;
    assert_eq!(report[0].deleted, 12, "{report:?}");
    assert_eq!(report[0].purged_through, Some(u[19]));
    assert_eq!(report[0].stopped_because, "cutoff reached");
    assert_eq!(
        report[0].passed_consumers.as_deref(),
        Some("A, B"),
        "the forced purge names the registered consumers it passed"
    );
    assert!(feed_keys(&mut admin, &feed, 0).await.is_empty());

    match reader.read_page::<i64>(0, Cursor::from_ulid(u[7])).await {
        Err(Error::CursorExpired { message }) => {
            assert!(message.contains("purged"), "{message}");
        }
        other => {
            panic!("A's cursor is below the low-water mark: expected CursorExpired, got {other:?}")
        }
    }
    let error = reader
        .read_page::<i64>(0, Cursor::from_ulid(u[14]))
        .await
        .expect_err("B's cursor is below the low-water mark too");
    assert_eq!(error.server_number(), Some(51104));
    assert!(!error.is_transient(), "an expired cursor is final");
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(lag["A"].expired, "{lag:?}");
    assert!(lag["B"].expired, "{lag:?}");

    // New events after the purge: Cursor::START and the low-water mark read them.
    write_all_ok(&mut writer, &feed, 0, 21..=23).await;
    let start = read_to_end(&reader, 0, Cursor::START).await;
    assert_eq!(keys(&start), vec![21, 22, 23]);
    let at_mark = read_to_end(&reader, 0, Cursor::from_ulid(u[19])).await;
    assert_eq!(keys(&at_mark), vec![21, 22, 23]);

    // What an expired consumer does: start again from the oldest retained event.
    save(&mut admin, "A", &feed, 0, Cursor::START).await;
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(!lag["A"].expired, "Cursor::START is never expired: {lag:?}");
}

// ------------------------------------------------------------------------------------------
// 2. 90- and 400-day windows
// ------------------------------------------------------------------------------------------

common::live_test!(purge_windows_of_90_and_400_days_go_by_ulid_time: "retention_windows" => windows_scenario);

/// Shard 0 gets groups of three events 400, 100 and 10 days old and new, then one more
/// event with a 400-day-old time hint: a shard's ULIDs never go back, so that one is lifted
/// to the shard's last millisecond (now) — ULID time is what counts, not the hint. Shard 1
/// (a shard's clock is its own: old rows can be written there after shard 0 moved on) gets
/// groups 500, 401, 399 and 100 days old and new.
///
/// * 90 days on shard 0 removes the 400- and 100-day rows only; shard 1 is untouched.
/// * 400 days on shard 1 removes the 500- and 401-day rows only.
/// * 90 days on all shards then removes shard 1's 399- and 100-day rows, and nothing more
///   from shard 0.
///
/// "N days old" is measured when the purge runs, a little after the write, so a row written
/// exactly 400 days old would be *more* than 400 days old by then: the groups keep a day
/// clear of each window's edge.
async fn windows_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "windows", 100).await;
    let mut writer = db.client().await;

    let mut next_id = 1;
    let mut groups: BTreeMap<(i32, &str), Vec<FeedRow<i64>>> = BTreeMap::new();
    let shard_0 = [
        ("400d", 400 * 24),
        ("100d", 100 * 24),
        ("10d", 10 * 24),
        ("new", 0),
    ];
    let shard_1 = [
        ("500d", 500 * 24),
        ("401d", 401 * 24),
        ("399d", 399 * 24),
        ("100d", 100 * 24),
        ("new", 0),
    ];
    for (shard, ages) in [(0, &shard_0[..]), (1, &shard_1[..])] {
        let mut cursor = Cursor::START;
        for &(label, hours) in ages {
            let ids: Vec<i64> = (next_id..next_id + 3).collect();
            next_id += 3;
            let hint = format!("dateadd(hour, -{hours}, sysutcdatetime())");
            for &id in &ids {
                write_ok(&mut writer, &feed, shard, id, Some(&hint)).await;
            }
            // Move this group on its own: it gets its own time.
            let moved = read_to_end(&reader, shard, cursor).await;
            assert_eq!(keys(&moved), ids, "shard {shard}, group {label}");
            let expected_ms = server_now_ms(&mut admin).await - i64::from(hours) * HOUR_MS;
            for row in &moved {
                let ms = row.ulid.timestamp_ms() as i64;
                assert!(
                    (ms - expected_ms).abs() < 10 * 60_000,
                    "shard {shard}, group {label}: ULID time {ms}, expected about {expected_ms}"
                );
            }
            cursor = Cursor::from_ulid(moved[2].ulid);
            groups.insert((shard, label), moved);
        }
    }
    // An old hint after the shard moved on is lifted to the shard's last millisecond.
    let lifted_id = next_id;
    write_ok(
        &mut writer,
        &feed,
        0,
        lifted_id,
        Some(&format!("dateadd(hour, -{}, sysutcdatetime())", 400 * 24)),
    )
    .await;
    let after_new = Cursor::from_ulid(groups[&(0, "new")][2].ulid);
    let lifted = read_to_end(&reader, 0, after_new).await;
    assert_eq!(keys(&lifted), vec![lifted_id]);
    assert!(
        lifted[0].ulid.timestamp_ms() >= groups[&(0, "new")][2].ulid.timestamp_ms(),
        "a shard's ULID time never goes back"
    );
    let group_keys = |shard: i32, labels: &[&str]| -> Vec<i64> {
        labels
            .iter()
            .flat_map(|label| keys(&groups[&(shard, *label)]))
            .collect()
    };

    // 90 days, shard 0.
    let report = purge_shard(&mut admin, &feed, 0, 90 * DAY_MS, 6).await;
    assert_eq!(report.stopped_because, "cutoff reached");
    assert_eq!(report.purged_through, Some(groups[&(0, "100d")][2].ulid));
    let mut expected_0 = group_keys(0, &["10d", "new"]);
    expected_0.push(lifted_id);
    assert_eq!(feed_keys(&mut admin, &feed, 0).await, expected_0);
    assert_eq!(
        feed_keys(&mut admin, &feed, 1).await,
        group_keys(1, &["500d", "401d", "399d", "100d", "new"]),
        "@shard_id = 0 leaves shard 1 alone"
    );

    // 400 days, shard 1.
    let report = purge_shard(&mut admin, &feed, 1, 400 * DAY_MS, 6).await;
    assert_eq!(report.purged_through, Some(groups[&(1, "401d")][2].ulid));
    assert_eq!(
        feed_keys(&mut admin, &feed, 1).await,
        group_keys(1, &["399d", "100d", "new"])
    );

    // 90 days, every shard.
    let report = purge(&mut admin, &feed, &Purge::older_than(90 * DAY_MS)).await;
    let deleted: Vec<(i32, i64)> = report.iter().map(|r| (r.shard_id, r.deleted)).collect();
    assert_eq!(deleted, vec![(0, 0), (1, 6)], "{report:?}");
    assert_eq!(
        report[0].purged_through,
        Some(groups[&(0, "100d")][2].ulid),
        "a purge that deletes nothing keeps the low-water mark"
    );
    assert_eq!(report[1].purged_through, Some(groups[&(1, "100d")][2].ulid));
    assert_eq!(feed_keys(&mut admin, &feed, 0).await, expected_0);
    assert_eq!(
        feed_keys(&mut admin, &feed, 1).await,
        group_keys(1, &["new"])
    );
}

// ------------------------------------------------------------------------------------------
// 3. Batch size and max rows
// ------------------------------------------------------------------------------------------

common::live_test!(purge_honours_batch_size_and_max_rows: "retention_batches" => batches_scenario);

/// 25 events; another session holds an exclusive lock on event 9's feed row (an update it
/// has not committed). `purge_feed @batch_size = 4, @max_rows = 10` commits batch 1 (events
/// 1–4) and batch 2 (5–8) each in its own transaction, then its third batch waits for event
/// 9: meanwhile the low-water mark, committed with each batch, reads event 8 and events 1–8
/// are gone — exactly two batches of four went through. Once the lock goes, the purge ends
/// with 10 rows deleted ('max rows reached', low-water mark event 10). A second purge with
/// `@batch_size = 4` and no limit deletes the other 15 ('cutoff reached').
async fn batches_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "batches", 100).await;
    let mut writer = db.client().await;
    let u = ulids(&write_and_read_all(&mut writer, &feed, &reader, 1..=25).await);
    assert_eq!(u.len(), 25);
    wait_until_older_than_now(&mut admin, u[24]).await;

    let mut blocker = db.client().await;
    exec_ok(
        &mut blocker,
        &format!(
            "begin transaction; update {} set id = id + 1000 where shard_id = 0 and ulid = {};",
            feed.object("feed"),
            hex(&u[8].to_bytes())
        ),
    )
    .await;

    let purging = {
        let database = db.name.clone();
        let feed = feed.clone();
        tokio::spawn(async move {
            let mut client = common::connect_to(&database).await;
            let purge_call = Purge {
                batch_size: Some(4),
                max_rows: Some(10),
                ..Purge::older_than(0)
            };
            tokio::time::timeout(TASK_LIMIT, purge(&mut client, &feed, &purge_call))
                .await
                .expect("the purge finishes once the lock is gone")
        })
    };

    // Two batches committed, the third waits for event 9.
    let deadline = Instant::now() + Duration::from_secs(20);
    while purged_through(&mut admin, &feed, 0).await != Some(u[7]) {
        assert!(
            Instant::now() < deadline,
            "two batches of 4 should have committed; the low-water mark is {:?}",
            purged_through(&mut admin, &feed, 0).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        purged_through(&mut admin, &feed, 0).await,
        Some(u[7]),
        "the third batch waits for the locked row"
    );
    assert!(!purging.is_finished(), "the purge waits for event 9's lock");
    // READPAST (with READCOMMITTEDLOCK, as read_feed does, so that it means the same under
    // both settings): a range read must not wait at event 9's lock.
    let gone = scalar_i64(
        &mut admin,
        &format!(
            "select count_big(*) from {} with (readcommittedlock, readpast) \
             where shard_id = 0 and ulid <= {};",
            feed.object("feed"),
            hex(&u[7].to_bytes())
        ),
    )
    .await;
    assert_eq!(gone, 0, "events 1-8 were deleted by the first two batches");

    exec_ok(&mut blocker, "rollback transaction;").await;
    let report = purging.await.expect("the purge task");
    assert_eq!(report[0].deleted, 10, "{report:?}");
    assert_eq!(report[0].stopped_because, "max rows reached");
    assert_eq!(report[0].purged_through, Some(u[9]));
    assert_eq!(
        feed_keys(&mut admin, &feed, 0).await,
        (11..=25).collect::<Vec<_>>()
    );

    let report = purge(
        &mut admin,
        &feed,
        &Purge {
            batch_size: Some(4),
            ..Purge::older_than(0)
        },
    )
    .await;
    assert_eq!(report[0].deleted, 15, "{report:?}");
    assert_eq!(report[0].stopped_because, "cutoff reached");
    assert_eq!(report[0].purged_through, Some(u[24]));
    assert!(feed_keys(&mut admin, &feed, 0).await.is_empty());
}

// ------------------------------------------------------------------------------------------
// 4. Dry run
// ------------------------------------------------------------------------------------------

common::live_test!(dry_run_deletes_nothing_and_reports_the_count: "retention_dry_run" => dry_run_scenario);

/// Twelve events. `@dry_run = 1` reports what a purge would delete — all 12; 7 with
/// `@max_rows = 7`; 5 held back by a consumer at event 5, with batches of 5 (the count past
/// the first batch) — and deletes nothing, moves no low-water mark, says `dry_run = 1`.
async fn dry_run_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "dry_run", 100).await;
    let mut writer = db.client().await;
    let u = ulids(&write_and_read_all(&mut writer, &feed, &reader, 1..=12).await);
    wait_until_older_than_now(&mut admin, u[11]).await;
    let all: Vec<i64> = (1..=12).collect();

    let dry = Purge {
        dry_run: true,
        ..Purge::older_than(0)
    };
    let report = purge(&mut admin, &feed, &dry).await;
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].deleted, 12, "{report:?}");
    assert!(report[0].dry_run);
    assert_eq!(report[0].stopped_because, "cutoff reached");
    assert_eq!(
        report[0].purged_through, None,
        "a dry run moves no low-water mark"
    );

    let report = purge(
        &mut admin,
        &feed,
        &Purge {
            max_rows: Some(7),
            batch_size: Some(3),
            ..dry.clone()
        },
    )
    .await;
    assert_eq!(report[0].deleted, 7, "{report:?}");
    assert_eq!(report[0].stopped_because, "max rows reached");

    save(&mut admin, "slow", &feed, 0, Cursor::from_ulid(u[4])).await;
    register(&mut admin, "slow", &feed).await;
    let report = purge(
        &mut admin,
        &feed,
        &Purge {
            batch_size: Some(5),
            ..dry.clone()
        },
    )
    .await;
    assert_eq!(report[0].deleted, 5, "{report:?}");
    assert_eq!(report[0].stopped_because, "held back by consumer slow");
    assert!(report[0].dry_run);

    assert_eq!(
        feed_keys(&mut admin, &feed, 0).await,
        all,
        "a dry run deletes nothing"
    );
    assert_eq!(purged_through(&mut admin, &feed, 0).await, None);
    let start = read_to_end(&reader, 0, Cursor::START).await;
    assert_eq!(keys(&start), all);
}

// ------------------------------------------------------------------------------------------
// 5. Purge alongside writers and readers
// ------------------------------------------------------------------------------------------

common::live_test!(purge_alongside_writers_and_readers_loses_nothing_and_blocks_no_reader_for_long: "retention_concurrent" => concurrent_scenario);

/// Three writers commit 100 events each while three registered readers read the feed from
/// `Cursor::START` (each saved `Cursor::START` before the first event, and saves its cursor
/// after every page) and a purge loop without `@force` (`@older_than_ms = 0`, batches of 7)
/// runs alongside. The purge may only delete what every reader has passed, so at the end
/// every reader has seen every event exactly once and in the same ULID order, and what the
/// purge deleted plus what is left is the whole feed. Each `read_page` is timed: a purge
/// batch is a short transaction of its own, so no read waits long (asserted loosely, under
/// 5 s; the maximum is printed). After the readers are done, one more purge deletes the
/// rest: nothing was lost on the way.
async fn concurrent_scenario(db: &TestDb) {
    const WRITERS: i64 = 3;
    const EVENTS_PER_WRITER: i64 = 100;
    const READERS: usize = 3;
    const READ_LIMIT: Duration = Duration::from_secs(5);
    let total = (WRITERS * EVENTS_PER_WRITER) as usize;

    let (mut admin, feed, reader) = start(db, "concurrent", 10).await;
    let names: Vec<String> = (0..READERS).map(|r| format!("reader {r}")).collect();
    for name in &names {
        save(&mut admin, name, &feed, 0, Cursor::START).await;
        register(&mut admin, name, &feed).await;
    }

    let stop_purging = Arc::new(AtomicBool::new(false));
    let purger = {
        let database = db.name.clone();
        let feed = feed.clone();
        let stop = Arc::clone(&stop_purging);
        spawn_bounded("the purge loop".to_owned(), TASK_LIMIT, async move {
            let mut client = common::connect_to(&database).await;
            let call = Purge {
                batch_size: Some(7),
                ..Purge::older_than(0)
            };
            let (mut deleted, mut rounds) = (0i64, 0u32);
            while !stop.load(Ordering::SeqCst) {
                match try_purge(&mut client, &feed, &call).await {
                    Ok(report) => {
                        rounds += 1;
                        deleted += report.iter().map(|r| r.deleted).sum::<i64>();
                    }
                    Err(error) if error.is_transient() => {
                        eprintln!("-- purge: transient error, retrying: {error}");
                        if matches!(error, Error::Connection(_)) {
                            client = common::connect_to(&database).await;
                        }
                    }
                    Err(error) => return Err(format!("purge_feed failed: {error}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok((deleted, rounds))
        })
    };

    let readers: Vec<_> = names
        .iter()
        .map(|name| {
            let database = db.name.clone();
            let feed = feed.clone();
            let reader = reader.clone();
            let name = name.clone();
            spawn_bounded(name.clone(), TASK_LIMIT, async move {
                let mut saver = common::connect_to(&database).await;
                let mut cursor = Cursor::START;
                let mut rows = Vec::new();
                let mut slowest = Duration::ZERO;
                while rows.len() < total {
                    let started = Instant::now();
                    match reader.read_page::<i64>(0, cursor).await {
                        Ok(page) => {
                            slowest = slowest.max(started.elapsed());
                            let empty = page.rows.is_empty();
                            cursor = page.next_cursor;
                            rows.extend(page.rows);
                            if !empty {
                                CursorStore::save(&mut saver, &name, &feed, 0, cursor)
                                    .await
                                    .map_err(|error| format!("save the cursor: {error}"))?;
                            } else {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        Err(error) if error.is_transient() => {
                            slowest = slowest.max(started.elapsed());
                            eprintln!("-- {name}: transient read error, retrying: {error}");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(error) => {
                            return Err(format!(
                                "read_page after {} rows failed: {error}",
                                rows.len()
                            ));
                        }
                    }
                }
                Ok((rows, slowest))
            })
        })
        .collect();

    let writers = spawn_writers(db, &feed, (WRITERS, EVENTS_PER_WRITER), TASK_LIMIT, 1..10);
    join_all(writers).await;
    let mut seen = Vec::new();
    for (name, reader_task) in names.iter().zip(readers) {
        let (rows, slowest) = join(reader_task).await;
        eprintln!(
            "-- {name}: the slowest read_page next to the purge took {slowest:?} ({:?})",
            db.isolation
        );
        assert!(slowest < READ_LIMIT, "{name}: a read waited {slowest:?}");
        seen.push(rows);
    }
    stop_purging.store(true, Ordering::SeqCst);
    let (deleted_alongside, rounds) = join(purger).await;
    eprintln!("-- the purge loop ran {rounds} times and deleted {deleted_alongside} rows");

    let expected: BTreeSet<i64> = (0..WRITERS)
        .flat_map(|writer| (0..EVENTS_PER_WRITER).map(move |seq| writer * 1_000_000 + seq))
        .collect();
    for (name, rows) in names.iter().zip(&seen) {
        assert_eq!(rows.len(), total, "{name}");
        let unique: BTreeSet<i64> = rows.iter().map(|row| row.key).collect();
        assert_eq!(unique, expected, "{name}: every event exactly once");
        for pair in rows.windows(2) {
            assert!(pair[0].ulid < pair[1].ulid, "{name}: in ULID order");
        }
        let mut last_seq: BTreeMap<i64, i64> = BTreeMap::new();
        for row in rows {
            let (writer, seq) = (row.key / 1_000_000, row.key % 1_000_000);
            if let Some(previous) = last_seq.insert(writer, seq) {
                assert!(previous < seq, "{name}: writer {writer}'s order");
            }
        }
        assert_eq!(
            pairs(rows),
            pairs(&seen[0]),
            "{name} and {} agree",
            names[0]
        );
    }

    // What the purge left, plus what it deleted, is the whole feed; one more purge (every
    // reader has saved the last cursor) deletes the rest.
    let left = feed_keys(&mut admin, &feed, 0).await;
    assert_eq!(deleted_alongside as usize + left.len(), total);
    let last = seen[0][total - 1].ulid;
    assert_eq!(
        left,
        keys(&seen[0][total - left.len()..]),
        "the purge deleted oldest first"
    );
    wait_until_older_than_now(&mut admin, last).await;
    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(report[0].deleted as usize, left.len(), "{report:?}");
    assert_eq!(report[0].purged_through, Some(last));
    assert!(
        deleted_alongside > 0,
        "the purge loop deleted nothing while the readers read ({rounds} rounds)"
    );
}

// ------------------------------------------------------------------------------------------
// 6. An unregistered consumer
// ------------------------------------------------------------------------------------------

common::live_test!(consumer_that_never_saved_a_cursor_is_not_protected: "retention_unregistered" => unregistered_scenario);

/// Documented behaviour, not a bug: `purge_feed` only knows the consumers registered in
/// `changefeed.consumer_cursor` (`CursorStore::save`). A consumer that keeps its cursor in
/// memory (or anywhere else) holds nothing back: the purge deletes past it, and its next read
/// with its in-memory cursor fails with `Error::CursorExpired` — it learns it lost events,
/// it does not skip them silently. A registered consumer on *another* shard protects nothing
/// here either. Register every consumer whose events must wait for it.
async fn unregistered_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "unregistered", 3).await;
    let mut writer = db.client().await;
    write_all_ok(&mut writer, &feed, 0, 1..=10).await;
    let first = reader
        .read_page::<i64>(0, Cursor::START)
        .await
        .expect("the first page");
    assert_eq!(keys(&first.rows), vec![1, 2, 3]);
    let in_memory = first.next_cursor;
    // Move the rest, so that every row has its ULID.
    let rest = read_to_end(&reader, 0, in_memory).await;
    assert_eq!(keys(&rest), (4..=10).collect::<Vec<_>>());
    save(&mut admin, "elsewhere", &feed, 1, Cursor::START).await;
    register(&mut admin, "elsewhere", &feed).await;
    wait_until_older_than_now(&mut admin, rest[6].ulid).await;

    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(
        report[0].deleted, 10,
        "nothing held the purge back: {report:?}"
    );
    assert_eq!(report[0].stopped_because, "cutoff reached");

    match reader.read_page::<i64>(0, in_memory).await {
        Err(Error::CursorExpired { message }) => assert!(message.contains("purged"), "{message}"),
        other => panic!("expected CursorExpired for the unregistered consumer, got {other:?}"),
    }
}

// ------------------------------------------------------------------------------------------
// 7. Refused calls
// ------------------------------------------------------------------------------------------

common::live_test!(purge_refuses_a_transaction_and_a_missing_cutoff: "retention_refused" => refused_scenario);

/// `purge_feed` inside a transaction is 51400 (each batch must commit on its own); without a
/// cutoff, or with an argument out of range, 51401. Nothing is deleted.
async fn refused_scenario(db: &TestDb) {
    let (mut admin, feed, reader) = start(db, "refused", 100).await;
    let mut writer = db.client().await;
    let u = write_and_read_all(&mut writer, &feed, &reader, 1..=3).await;
    wait_until_older_than_now(&mut admin, u[2].ulid).await;
    let procedure = feed.object("purge_feed");

    let in_transaction = exec(
        &mut admin,
        &format!("begin transaction; exec {procedure} @older_than_ms = 0;"),
    )
    .await;
    assert_eq!(
        server_number("purge_feed in a transaction", in_transaction),
        51400
    );
    exec_ok(&mut admin, "if @@trancount > 0 rollback transaction;").await;

    for arguments in [
        "",
        "@older_than_ms = null, @before = null",
        "@shard_id = 0, @force = 1",
        "@older_than_ms = -1",
        "@older_than_ms = 0, @batch_size = 0",
        "@older_than_ms = 0, @batch_size = 50001",
        "@older_than_ms = 0, @max_rows = 0",
    ] {
        let result = exec(&mut admin, &format!("exec {procedure} {arguments};")).await;
        assert_eq!(
            server_number(&format!("purge_feed {arguments}"), result),
            51401,
            "purge_feed {arguments}"
        );
    }
    assert_eq!(feed_keys(&mut admin, &feed, 0).await, vec![1, 2, 3]);
    assert_eq!(purged_through(&mut admin, &feed, 0).await, None);
}

// ------------------------------------------------------------------------------------------
// 8. A consumer only a reader created holds nothing back
// ------------------------------------------------------------------------------------------

common::live_test!(only_a_registered_consumer_holds_the_purge_back: "retention_registered" => with_logins("reader") registered_scenario);

/// Issue 29 item 3. A login that is only in the feed's readers role saves a cursor of zeros
/// under a new consumer name: `consumer_lag` shows it with `holds_retention = 0`, and a purge
/// deletes every row past it and names it in `passed_consumers` (the old purge_feed stopped
/// at that cursor for good: 'held back by consumer squatter', nothing deleted). A cursor of
/// zeros reads on from the oldest row kept; the same reader's next, real cursor is passed
/// too, and reading from it fails with 51104, whose message says to have the consumer
/// registered. The reader cannot register it (or unregister anything): 229. Once the admin
/// registers it (idempotently), its cursor holds the purge back; unregistered again, it does
/// not. The reader removing its own consumer takes the registration with it, so the same
/// name saved again holds nothing back. A consumer registered before its first save is no
/// reader's to remove (51114; the registration stays), and its first save makes it the
/// reader's, holding the purge back.
async fn registered_scenario(db: &TestDb, [reader_login]: &[Login; 1]) {
    let (mut admin, feed, feed_reader) = start(db, "registered", 100).await;
    reader_login
        .create(&mut admin, &[feed.readers_role()], &[])
        .await;
    let mut reader = reader_login.connect(db).await;
    let mut writer = db.client().await;
    let u = ulids(&write_and_read_all(&mut writer, &feed, &feed_reader, 1..=10).await);

    // A cursor of zeros under a new name: saved, but holding nothing back.
    CursorStore::save(&mut reader, "squatter", &feed, 0, Cursor::START)
        .await
        .expect("a reader saves a cursor under a new consumer name");
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(!lag["squatter"].holds_retention, "{lag:?}");
    wait_until_older_than_now(&mut admin, u[9]).await;
    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(
        report[0].deleted, 10,
        "the reader's cursor held nothing back: {report:?}"
    );
    assert_eq!(report[0].stopped_because, "cutoff reached");
    assert_eq!(report[0].passed_consumers.as_deref(), Some("squatter"));
    assert!(feed_keys(&mut admin, &feed, 0).await.is_empty());

    // The reader's real cursor (after event 12) is passed as well: its next read is refused.
    let u = ulids(&write_and_read_all(&mut writer, &feed, &feed_reader, 11..=20).await);
    CursorStore::save(&mut reader, "squatter", &feed, 0, Cursor::from_ulid(u[1]))
        .await
        .expect("the reader moves its consumer on");
    wait_until_older_than_now(&mut admin, u[9]).await;
    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(report[0].deleted, 10, "{report:?}");
    assert_eq!(report[0].passed_consumers.as_deref(), Some("squatter"));
    let saved = CursorStore::load(&mut reader, "squatter", &feed, 0)
        .await
        .expect("the reader loads its cursor")
        .expect("saved");
    match read_page::<i64>(&mut reader, &feed, 0, saved, ReadOptions::default()).await {
        Err(Error::CursorExpired { message }) => {
            assert!(
                message.contains("changefeed.register_consumer"),
                "{message}"
            );
        }
        other => panic!("the purge passed the unregistered cursor: expected 51104, got {other:?}"),
    }

    // Registering is not a reader's to do.
    for procedure in ["register_consumer", "unregister_consumer"] {
        expect_denied(
            &mut reader,
            &format!("exec changefeed.{procedure} @consumer = N'squatter', @feed = N'{feed}';"),
            &format!("the readers-only login calls {procedure}"),
        )
        .await;
    }

    // Registered by the admin (twice: the second call changes nothing), the consumer's
    // cursor holds the purge back.
    assert!(
        register(&mut admin, "squatter", &feed).await,
        "newly registered"
    );
    assert!(
        !register(&mut admin, "squatter", &feed).await,
        "already registered"
    );
    let u = ulids(&write_and_read_all(&mut writer, &feed, &feed_reader, 21..=25).await);
    CursorStore::save(&mut reader, "squatter", &feed, 0, Cursor::from_ulid(u[1]))
        .await
        .expect("the reader starts again after the expiry");
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(lag["squatter"].holds_retention, "{lag:?}");
    assert!(!lag["squatter"].expired, "{lag:?}");
    wait_until_older_than_now(&mut admin, u[4]).await;
    let report = purge(&mut admin, &feed, &Purge::older_than(0)).await;
    assert_eq!(report[0].deleted, 2, "events 21 and 22 only: {report:?}");
    assert_eq!(report[0].stopped_because, "held back by consumer squatter");
    assert_eq!(report[0].passed_consumers, None);
    let page = read_page::<i64>(
        &mut reader,
        &feed,
        0,
        Cursor::from_ulid(u[1]),
        ReadOptions::default(),
    )
    .await
    .expect("the registered consumer reads on from its cursor");
    assert_eq!(keys(&page.rows), vec![23, 24, 25]);

    // Unregistered, it holds nothing back again (a dry run says what would go).
    assert_eq!(unregister(&mut admin, "squatter", &feed).await, 1);
    assert_eq!(unregister(&mut admin, "squatter", &feed).await, 0);
    let report = purge(
        &mut admin,
        &feed,
        &Purge {
            dry_run: true,
            ..Purge::older_than(0)
        },
    )
    .await;
    assert_eq!(report[0].deleted, 3, "{report:?}");
    assert_eq!(report[0].passed_consumers.as_deref(), Some("squatter"));

    // Registered again, then removed by its owner: the registration goes with it, and the
    // name saved again holds nothing back.
    register(&mut admin, "squatter", &feed).await;
    let removed = rows_ok(
        &mut reader,
        &format!("exec changefeed.remove_consumer @consumer = N'squatter', @feed = N'{feed}';"),
    )
    .await;
    assert_eq!(required::<i32>(&removed[0], "removed"), 1);
    CursorStore::save(&mut reader, "squatter", &feed, 0, Cursor::START)
        .await
        .expect("the freed name saved again");
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(!lag["squatter"].holds_retention, "{lag:?}");

    // A consumer the admin registered before its first save has no owner yet: the reader
    // cannot remove it (51114), and its registration stays. A name with neither cursors nor
    // a registration is still "removed: 0" for the reader.
    assert!(register(&mut admin, "reserved", &feed).await);
    let refused = exec(
        &mut reader,
        &format!("exec changefeed.remove_consumer @consumer = N'reserved', @feed = N'{feed}';"),
    )
    .await;
    assert_eq!(
        server_number(
            "the reader removes a registered consumer with no cursor",
            refused
        ),
        51114
    );
    assert_eq!(registrations(&mut admin, "reserved", &feed).await, 1);
    let removed = rows_ok(
        &mut reader,
        &format!("exec changefeed.remove_consumer @consumer = N'nobody', @feed = N'{feed}';"),
    )
    .await;
    assert_eq!(required::<i32>(&removed[0], "removed"), 0);
    // Its first save makes it the reader's, registered: it holds the purge back.
    CursorStore::save(&mut reader, "reserved", &feed, 0, Cursor::START)
        .await
        .expect("the reader saves the registered consumer's first cursor");
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(lag["reserved"].holds_retention, "{lag:?}");
}

// ------------------------------------------------------------------------------------------
// 9. A consumer registered while a purge runs
// ------------------------------------------------------------------------------------------

common::live_test!(consumer_registered_during_a_purge_holds_its_later_batches_back: "retention_late_registration" => late_registration_scenario);

/// `purge_feed` reads who holds it back inside each batch's transaction (sql/V98). Ten
/// events, a purge of everything in batches of one row. A blocker holds event 2's feed row
/// exclusively, so the purge waits there (its batch's hold already read: nobody).
/// Meanwhile another session registers the consumer "late" and saves its cursor at event 4,
/// in one transaction. The purge's key-range locks make that transaction wait for the second
/// batch (or, had it come first, the batch would have seen it); once the blocker commits, the
/// next batch reads the new hold and the purge stops after event 4: 'held back by consumer
/// late', events 5-10 kept. The old purge_feed read the hold once per shard, before the
/// registration, and deleted all ten.
async fn late_registration_scenario(db: &TestDb) {
    const WAIT_LIMIT: Duration = Duration::from_secs(30);
    let (mut admin, feed, reader) = start(db, "late_registration", 100).await;
    let mut writer = db.client().await;
    let u = ulids(&write_and_read_all(&mut writer, &feed, &reader, 1..=10).await);
    wait_until_older_than_now(&mut admin, u[9]).await;

    let mut blocker = db.client().await;
    exec_ok(
        &mut blocker,
        &format!(
            "set xact_abort on; begin transaction; \
             select id from {} with (xlock, rowlock) where shard_id = 0 and ulid = {};",
            feed.object("feed"),
            hex(&u[1].to_bytes())
        ),
    )
    .await;

    let mut purger = db.client().await;
    let purge_session = session_id(&mut purger).await;
    let call = Purge {
        batch_size: Some(1),
        ..Purge::older_than(0)
    };
    let purge_task = {
        let feed = feed.clone();
        spawn_bounded("the purge".to_owned(), TASK_LIMIT, async move {
            try_purge(&mut purger, &feed, &call)
                .await
                .map_err(|error| format!("purge_feed failed: {error}"))
        })
    };
    await_lock_wait(
        &mut admin,
        purge_session,
        "LCK[_]M[_]",
        WAIT_LIMIT,
        "the purge waits for the blocker's row",
    )
    .await;

    let mut late = db.client().await;
    let late_session = session_id(&mut late).await;
    let late_task = {
        let sql = format!(
            "set xact_abort on; begin transaction; \
             exec changefeed.register_consumer @consumer = N'late', @feed = N'{feed}'; \
             exec changefeed.save_cursor @consumer = N'late', @feed = N'{feed}', \
             @shard_id = 0, @cursor = {}; \
             commit transaction;",
            hex(&u[3].to_bytes())
        );
        spawn_bounded("the late registration".to_owned(), TASK_LIMIT, async move {
            exec(&mut late, &sql)
                .await
                .map_err(|error| format!("register and save: {error}"))
        })
    };
    // The registration either waits for the purge's batch (sql/V98) or, with no lock
    // in its way, commits at once; release the blocker only then.
    let deadline = Instant::now() + WAIT_LIMIT;
    let waiting = format!(
        "select count_big(*) from sys.dm_exec_requests \
         where session_id = {late_session} and wait_type like N'LCK[_]M[_]%';"
    );
    while !late_task.is_finished() && scalar_i64(&mut admin, &waiting).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the late registration neither finished nor waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    exec_ok(&mut blocker, "commit transaction;").await;

    let report = join(purge_task).await;
    join(late_task).await;
    assert_eq!(
        report[0].deleted, 4,
        "events 1-4: the batches after the registration held back at its cursor: {report:?}"
    );
    assert_eq!(report[0].stopped_because, "held back by consumer late");
    assert_eq!(report[0].passed_consumers, None, "{report:?}");
    assert_eq!(
        feed_keys(&mut admin, &feed, 0).await,
        (5..=10).collect::<Vec<_>>()
    );
    let lag = consumer_lag(&mut admin, &feed).await;
    assert!(lag["late"].holds_retention, "{lag:?}");
    assert!(!lag["late"].expired, "{lag:?}");
}

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// The arguments of one `purge_feed` call; `None` leaves the procedure's default.
#[derive(Clone, Debug, Default)]
struct Purge {
    shard_id: Option<i32>,
    older_than_ms: Option<i64>,
    before: Option<Ulid>,
    batch_size: Option<i32>,
    max_rows: Option<i64>,
    force: bool,
    dry_run: bool,
}

impl Purge {
    fn older_than(ms: i64) -> Purge {
        Purge {
            older_than_ms: Some(ms),
            ..Purge::default()
        }
    }

    /// The same call, on shard `shard` only.
    fn on_shard(self, shard: i32) -> Purge {
        Purge {
            shard_id: Some(shard),
            ..self
        }
    }

    fn sql(&self, feed: &Feed) -> String {
        let mut arguments = Vec::new();
        if let Some(shard) = self.shard_id {
            arguments.push(format!("@shard_id = {shard}"));
        }
        if let Some(ms) = self.older_than_ms {
            arguments.push(format!("@older_than_ms = {ms}"));
        }
        if let Some(before) = self.before {
            arguments.push(format!("@before = {}", hex(&before.to_bytes())));
        }
        if let Some(size) = self.batch_size {
            arguments.push(format!("@batch_size = {size}"));
        }
        if let Some(max) = self.max_rows {
            arguments.push(format!("@max_rows = {max}"));
        }
        if self.force {
            arguments.push("@force = 1".to_owned());
        }
        if self.dry_run {
            arguments.push("@dry_run = 1".to_owned());
        }
        format!(
            "exec {} {};",
            feed.object("purge_feed"),
            arguments.join(", ")
        )
    }
}

/// One row of `purge_feed`'s result.
#[derive(Debug)]
struct PurgeReport {
    shard_id: i32,
    deleted: i64,
    purged_through: Option<Ulid>,
    stopped_because: String,
    dry_run: bool,
    /// The consumers whose unread rows the call deleted (or would delete), `, `-separated.
    passed_consumers: Option<String>,
}

async fn try_purge(
    client: &mut Client,
    feed: &Feed,
    call: &Purge,
) -> changefeed::Result<Vec<PurgeReport>> {
    let rows = rows(client, &call.sql(feed)).await?;
    Ok(rows
        .iter()
        .map(|row| PurgeReport {
            shard_id: required::<i32>(row, "shard_id"),
            deleted: required::<i64>(row, "deleted"),
            purged_through: optional_ulid(row, "purged_through"),
            stopped_because: required::<&str>(row, "stopped_because").to_owned(),
            dry_run: required::<bool>(row, "dry_run"),
            passed_consumers: row
                .try_get::<&str, &str>("passed_consumers")
                .expect("passed_consumers is text")
                .map(str::to_owned),
        })
        .collect())
}

/// Purges shard `shard` alone of rows older than `older_than_ms`, and asserts the report
/// names that shard only, with `deleted` rows deleted: its report.
async fn purge_shard(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    older_than_ms: i64,
    deleted: i64,
) -> PurgeReport {
    let report = purge(
        client,
        feed,
        &Purge::older_than(older_than_ms).on_shard(shard),
    )
    .await;
    assert_eq!(report.len(), 1, "only shard {shard}: {report:?}");
    assert_eq!(report[0].shard_id, shard);
    assert_eq!(report[0].deleted, deleted, "{report:?}");
    report.into_iter().next().expect("one shard's report")
}

async fn purge(client: &mut Client, feed: &Feed, call: &Purge) -> Vec<PurgeReport> {
    let sql = call.sql(feed);
    try_purge(client, feed, call)
        .await
        .unwrap_or_else(|error| panic!("{sql}\n  failed: {error}"))
}

/// One row of `changefeed.consumer_lag`.
#[derive(Debug)]
struct Lag {
    lag_ms: i64,
    expired: bool,
    holds_retention: bool,
}

async fn consumer_lag(client: &mut Client, feed: &Feed) -> BTreeMap<String, Lag> {
    rows_ok(
        client,
        &format!(
            "select consumer, lag_ms, expired, holds_retention from changefeed.consumer_lag \
             where feed = N'{feed}' and shard_id = 0;"
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            required::<&str>(row, "consumer").to_owned(),
            Lag {
                lag_ms: row
                    .try_get::<i64, &str>("lag_ms")
                    .expect("lag_ms is a bigint")
                    .unwrap_or(0),
                expired: required::<bool>(row, "expired"),
                holds_retention: required::<bool>(row, "holds_retention"),
            },
        )
    })
    .collect()
}

async fn purged_through(client: &mut Client, feed: &Feed, shard: i32) -> Option<Ulid> {
    let row = state_row(client, feed, shard, "purged_through").await?;
    optional_ulid(&row, "purged_through")
}

/// A scenario's start: the feed `table` on an admin connection, and a reader of it with
/// pages of `page_size`.
async fn start(db: &TestDb, table: &str, page_size: u32) -> (Client, Feed, FeedReader) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, table).await;
    let reader = reader_for(db, &feed, page_size).await;
    (admin, feed, reader)
}

async fn reader_for(db: &TestDb, feed: &Feed, page_size: u32) -> FeedReader {
    feed_reader(
        db,
        feed,
        8,
        FeedReaderOptions::default().page_size(page_size),
    )
    .await
}

async fn save(client: &mut Client, consumer: &str, feed: &Feed, shard: i32, cursor: Cursor) {
    CursorStore::save(client, consumer, feed, shard, cursor)
        .await
        .unwrap_or_else(|error| panic!("save {consumer}'s cursor: {error}"));
}

/// Registers `consumer` of `feed` (`changefeed.register_consumer`), so that its saved cursors
/// hold the purge back; true when this call registered it, false when it already was.
async fn register(client: &mut Client, consumer: &str, feed: &Feed) -> bool {
    let found = rows_ok(
        client,
        &format!("exec changefeed.register_consumer @consumer = N'{consumer}', @feed = N'{feed}';"),
    )
    .await;
    required::<bool>(&found[0], "newly_registered")
}

/// Undoes [`register`] (`changefeed.unregister_consumer`): how many registrations went.
async fn unregister(client: &mut Client, consumer: &str, feed: &Feed) -> i32 {
    let found = rows_ok(
        client,
        &format!(
            "exec changefeed.unregister_consumer @consumer = N'{consumer}', @feed = N'{feed}';"
        ),
    )
    .await;
    required::<i32>(&found[0], "unregistered")
}

/// How many registrations `consumer` of `feed` has (0 or 1).
async fn registrations(client: &mut Client, consumer: &str, feed: &Feed) -> i64 {
    scalar_i64(
        client,
        &format!(
            "select count_big(*) from changefeed.registered_consumers as r \
             inner join changefeed.feeds as f on f.feed_id = r.feed_id \
             where r.consumer = N'{consumer}' and f.schema_name + N'.' + f.table_name = N'{feed}';"
        ),
    )
    .await
}

/// Waits until the server's clock is past `ulid`'s millisecond, so that `@older_than_ms = 0`
/// (cutoff: now, exclusive) covers every row up to it.
async fn wait_until_older_than_now(client: &mut Client, ulid: Ulid) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server_now_ms(client).await <= ulid.timestamp_ms() as i64 {
        assert!(
            Instant::now() < deadline,
            "the server's clock does not pass {ulid}'s time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The keys of a shard's feed rows, in ULID order.
async fn feed_keys(client: &mut Client, feed: &Feed, shard: i32) -> Vec<i64> {
    let sql = format!(
        "select id from {} where shard_id = {shard} order by ulid;",
        feed.object("feed")
    );
    column_values(client, &sql, "id").await
}

fn optional_ulid(row: &Row, name: &str) -> Option<Ulid> {
    row.try_get::<&[u8], &str>(name)
        .unwrap_or_else(|error| panic!("column {name}: {error}"))
        .map(|bytes| Cursor::from_bytes(bytes).expect("binary(16)").ulid())
}
