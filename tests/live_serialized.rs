//! Live tests of serialized-writer feeds (ARCHITECTURE.md, "ULIDs and the allocator"): `lock_feed`, the
//! per-feed `ulid(@i)` function, `read_feed` over the event table, `setup_feed`'s checks,
//! the roles with real logins, and the reproduction of POWEROFF.md (`power_off_*`).
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_serialized -- --ignored`.
//! Every scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of
//! its own. Every task, every wait and every loop is bounded, so a blocked writer or reader
//! fails the test with a message instead of hanging it.
//!
//! The `power_off_*` tests print their measurements on lines starting with `POWEROFF`
//! (run with `--nocapture` to see them); POWEROFF.md says how to read them.
//! `CHANGEFEED_POWEROFF_WAIT_SECS` (default 90) bounds how long the unmitigated case waits.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::allocator::{
    Allocator, FixedRandom, HINT_TOLERANCE_MS, RESERVATION_SIZE, UlidRange, ulid_counter,
    ulid_high, ulid_ms, ulid_random16,
};
use changefeed::writer::lock_feed;
use changefeed::{Client, Cursor, Feed, FeedRow, Page, ReadOptions, read_page};
use common::events::{hex, read_state, recover_from_transient, retry_pause, server_now_ms};
use common::load::{
    Load, MAX_TRANSIENT_RETRIES, WriterKey, check_stored, keys, load_feed, load_test,
    write_and_read,
};
use common::logins::Login;
use common::tasks::{await_none_left, bounded, close, expect_denied};
use common::{Isolation, TestDb, exec, rows, scalar_i64};
use tiberius::Row;
use time::PrimitiveDateTime;
use time::macros::datetime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::compat::TokioAsyncWriteCompatExt;
use ulid::Ulid;

/// A single call that must not wait for anybody gets this long before the test declares it
/// blocked.
const NOT_BLOCKED_LIMIT: Duration = Duration::from_secs(20);
/// Load writers bound their wait for the shard lock below tiberius' 30 s command timeout,
/// so that the server, not the client library, reports a wait that long (as 51202).
const LOAD_LOCK_TIMEOUT_MS: i32 = 20_000;
/// How far before the server's clock the range-arithmetic test's first hint lies: hints in
/// the past are taken as they are (a fresh shard) or continue the shard's millisecond, while
/// a hint later than the server's clock + 1 s would be clamped (issue 10, B8).
const T0_BEFORE_NOW_MS: i64 = 60_000;
/// Fragments of the ulid(@i) function's two failure texts (V39).
const NEEDS_LOCK_FEED: &str = "needs lock_feed";
const OUT_OF_RANGE: &str = "takes @i from 1 to 100000000000";
/// Bit 62, cleared in every fresh counter start (ARCHITECTURE.md, "ULIDs and the allocator").
const BIT_62: i64 = 1 << 62;

// ------------------------------------------------------------------------------------------
// 1. Range arithmetic against the allocator model
// ------------------------------------------------------------------------------------------

common::live_test!(range_arithmetic_matches_the_allocator_model: "ser_ranges" => range_scenario);

async fn range_scenario(db: &TestDb) {
    let (mut admin, feed) = id_feed_in(db, "ranges", "bigint").await;
    let lock = feed.object("lock_feed");
    let ulid_fn = feed.object("ulid");
    // The model's clock: every hint below is at least a minute before the server's clock, so
    // none is clamped (except step 5's, which the test checks on its own).
    let now_ms = server_now_ms(&mut admin).await;
    let ms0 = now_ms - T0_BEFORE_NOW_MS;
    let t0 = datetime_of_ms(ms0);
    let mut model = Allocator::new();
    let mut writer = db.client().await;

    // 1. lock_feed with every output, and ulid(1), ulid(2), ulid(10^11) in the same batch.
    begin(&mut writer).await;
    let first = rows(
        &mut writer,
        &format!(
            "declare @u binary(16), @h binary(8), @l bigint; \
             exec {lock} @shard_id = 0, @time_hint = '{}', @ulid = @u output, \
                 @ulid_high = @h output, @ulid_low = @l output; \
             select @u, @h, @l, {ulid_fn}(1), {ulid_fn}(2), {ulid_fn}(100000000000);",
            sql_datetime(t0)
        ),
    )
    .await
    .expect("lock_feed with every output, then ulid(1), ulid(2), ulid(10^11)");
    let row = &first[0];
    let u = ulid_at(row, 0, "@ulid");
    let high: [u8; 8] = bytes_at(row, 1, "@ulid_high")
        .try_into()
        .expect("@ulid_high is binary(8)");
    let low = i64_at(row, 2, "@ulid_low");
    let (u1, u2, u_last) = (
        ulid_at(row, 3, "ulid(1)"),
        ulid_at(row, 4, "ulid(2)"),
        ulid_at(row, 5, "ulid(10^11)"),
    );
    assert_eq!(ulid_high(u), high, "@ulid_high is bytes 0-7 of @ulid");
    assert_eq!(ulid_counter(u), low, "@ulid_low is bytes 8-15 of @ulid");
    assert_eq!(
        ulid_ms(u),
        ms0,
        "a fresh shard's ULID carries the time hint"
    );
    assert_eq!(
        low & BIT_62,
        0,
        "a new millisecond's counter starts with bit 62 cleared, got {low:#x}"
    );
    assert_eq!(u1, u, "ulid(1) is the @ulid lock_feed returned");
    assert_eq!(ulid_high(u2), high, "ulid(2) shares the high 8 bytes");
    assert_eq!(
        ulid_counter(u2),
        low + 1,
        "ulid(2) is ulid(1) + 1 in the counter"
    );
    assert_eq!(
        ulid_counter(u_last),
        low + RESERVATION_SIZE - 1,
        "ulid(10^11) is the last of the reserved range"
    );
    let r1 = UlidRange::from_parts(high, low, RESERVATION_SIZE)
        .expect("a server-made range has headroom");
    assert_eq!(r1.first(), u1);
    assert_eq!(r1.nth(2), Some(u2));
    assert_eq!(r1.nth(RESERVATION_SIZE), Some(u_last));
    assert_eq!(r1.last(), u_last);
    let m1 = model.reserve(
        now_ms,
        ms0,
        RESERVATION_SIZE,
        &mut FixedRandom::new(ulid_random16(u), low),
    );
    assert_eq!(
        m1, r1,
        "the server's first range equals the model's fed the same random parts"
    );

    // 2. A second lock_feed in the same transaction and millisecond: +10^11, same high.
    let r2 = lock_feed(&mut writer, &feed, 0, Some(t0), None)
        .await
        .expect("a second lock_feed in the same transaction");
    assert_eq!(r2.high(), r1.high(), "same millisecond: same high 8 bytes");
    assert_eq!(
        r2.first_counter(),
        r1.first_counter() + RESERVATION_SIZE,
        "same millisecond: the next range starts 10^11 after the previous one"
    );
    assert_eq!(
        model.reserve(now_ms, ms0, RESERVATION_SIZE, &mut FixedRandom::new(0, 0)),
        r2,
        "the model continues the same way"
    );
    assert!(r1.last() < r2.first(), "ranges of a shard never overlap");
    let now = rows(&mut writer, &format!("select {ulid_fn}(1), {ulid_fn}(2);"))
        .await
        .expect("ulid() after the second lock_feed");
    assert_eq!(
        (
            ulid_at(&now[0], 0, "ulid(1)"),
            Some(ulid_at(&now[0], 1, "ulid(2)"))
        ),
        (r2.first(), r2.nth(2)),
        "ulid(@i) hands out the latest range of this feed in the transaction"
    );

    // 3. A later millisecond: a new high whose bytes 0-5 are the new time, a fresh counter.
    let t1 = t0 + time::Duration::seconds(1);
    let r3 = lock_feed(&mut writer, &feed, 0, Some(t1), None)
        .await
        .expect("lock_feed with a later time hint");
    assert_eq!(
        ulid_ms(r3.first()),
        ms0 + 1000,
        "the ULID time is the new hint"
    );
    assert_eq!(
        &r3.high()[..6],
        &(ms0 + 1000).to_be_bytes()[2..],
        "bytes 0-5 are the new millisecond, big-endian"
    );
    assert_ne!(r3.high(), r2.high(), "a new millisecond starts a new high");
    assert_eq!(
        r3.first_counter() & BIT_62,
        0,
        "a new millisecond's counter starts with bit 62 cleared"
    );
    assert_eq!(
        model.reserve(
            now_ms,
            ms0 + 1000,
            RESERVATION_SIZE,
            &mut FixedRandom::new(ulid_random16(r3.first()), r3.first_counter())
        ),
        r3
    );
    assert!(r2.last() < r3.first());

    // 4. An earlier hint continues the shard's counter at the shard's last millisecond.
    let r4 = lock_feed(
        &mut writer,
        &feed,
        0,
        Some(t0 - time::Duration::seconds(5)),
        None,
    )
    .await
    .expect("lock_feed with an earlier time hint");
    assert_eq!(
        r4.high(),
        r3.high(),
        "an earlier hint keeps the shard's high"
    );
    assert_eq!(r4.first_counter(), r3.first_counter() + RESERVATION_SIZE);
    assert_eq!(
        ulid_ms(r4.first()),
        ms0 + 1000,
        "an earlier hint gives the shard's last time, never an earlier one"
    );
    assert_eq!(
        model.reserve(
            now_ms,
            ms0 - 5000,
            RESERVATION_SIZE,
            &mut FixedRandom::new(0, 0)
        ),
        r4
    );

    // 5. A hint in year 9999 counts as the server's clock + 1 s (issue 10, B8): a new
    // millisecond, never further ahead, so one wrong hint cannot move the shard's clock there.
    let far_future = datetime!(9999-12-31 23:59:59.999);
    let before_ms = server_now_ms(&mut admin).await;
    let r5 = lock_feed(&mut writer, &feed, 0, Some(far_future), None)
        .await
        .expect("lock_feed with a hint in year 9999");
    let after_ms = server_now_ms(&mut admin).await;
    let ms5 = ulid_ms(r5.first());
    // + 1: lock_feed rounds the clock to datetime2(3), the probe truncates it.
    assert!(
        (before_ms + HINT_TOLERANCE_MS..=after_ms + HINT_TOLERANCE_MS + 1).contains(&ms5),
        "a year-9999 hint is clamped to the server's clock + {HINT_TOLERANCE_MS} ms: got {ms5}, \
         clock between {before_ms} and {after_ms}"
    );
    assert_ne!(
        r5.high(),
        r4.high(),
        "the clamped hint is a later millisecond"
    );
    assert_eq!(
        model.reserve(
            ms5 - HINT_TOLERANCE_MS,
            unix_ms(far_future),
            RESERVATION_SIZE,
            &mut FixedRandom::new(ulid_random16(r5.first()), r5.first_counter())
        ),
        r5,
        "the model clamps the same way, given the server's clock"
    );

    // The state row is the model's state.
    assert_eq!(
        read_state(&mut writer, &feed, 0).await,
        model.state(),
        "the state row equals the model's state"
    );

    // 6. The documented multi-row insert: ulid(row_number() over (order by ...)).
    exec(
        &mut writer,
        &format!(
            "insert into {} (id, Shard, ULID) \
             select v.n, 0, {ulid_fn}(row_number() over (order by v.n)) \
             from (values (30), (10), (20)) as v (n); \
             commit transaction;",
            feed.quoted_table()
        ),
    )
    .await
    .expect("insert three events numbered by row_number, and commit");
    let mut reader = db.client().await;
    let page = read_from_start::<i64>(&mut reader, &feed, "read_page after the commit").await;
    assert_eq!(
        page.rows
            .iter()
            .map(|row| (row.ulid, row.key))
            .collect::<Vec<_>>(),
        vec![
            (r5.nth(1).unwrap(), 10),
            (r5.nth(2).unwrap(), 20),
            (r5.nth(3).unwrap(), 30),
        ],
        "read_feed returns the events with the ULIDs ulid(1..3) gave them, in ULID order"
    );

    // 7. The state survives the commit; a rolled-back reservation is handed out again.
    begin(&mut writer).await;
    let before_rollback = model;
    let r6 = lock_feed(&mut writer, &feed, 0, Some(t0), None)
        .await
        .expect("lock_feed in a new transaction");
    assert_eq!(
        model.reserve(now_ms, ms0, RESERVATION_SIZE, &mut FixedRandom::new(0, 0)),
        r6,
        "a new transaction continues the committed state"
    );
    exec(&mut writer, "rollback transaction;")
        .await
        .expect("rollback");
    model = before_rollback;
    begin(&mut writer).await;
    let r7 = lock_feed(&mut writer, &feed, 0, Some(t0), None)
        .await
        .expect("lock_feed after a rollback");
    assert_eq!(
        r7, r6,
        "the state row is transactional: a rolled-back range is reserved again"
    );
    assert_eq!(
        model.reserve(now_ms, ms0, RESERVATION_SIZE, &mut FixedRandom::new(0, 0)),
        r7
    );
    exec(&mut writer, "commit transaction;")
        .await
        .expect("commit");

    // 8. Other shards have states of their own; hints before 1970 are clamped to 0. One shard
    // of a feed per transaction (51203 otherwise, see two_shards_of_one_feed_...).
    begin(&mut writer).await;
    let s1 = lock_feed(&mut writer, &feed, 1, Some(t0), None)
        .await
        .expect("lock_feed on shard 1");
    assert_eq!(
        Allocator::new().reserve(
            now_ms,
            ms0,
            RESERVATION_SIZE,
            &mut FixedRandom::new(ulid_random16(s1.first()), s1.first_counter())
        ),
        s1,
        "shard 1 starts from its own (empty) state, whatever shard 0 did"
    );
    exec(&mut writer, "commit transaction; begin transaction;")
        .await
        .expect("commit shard 1, begin shard 2");
    let before_1970 = datetime!(1900-01-01 00:00:00);
    let s2 = lock_feed(&mut writer, &feed, 2, Some(before_1970), None)
        .await
        .expect("lock_feed on shard 2 with a hint before 1970");
    assert_eq!(ulid_ms(s2.first()), 0, "a hint before 1970 is clamped to 0");
    assert_eq!(
        Allocator::new().reserve(
            now_ms,
            unix_ms(before_1970),
            RESERVATION_SIZE,
            &mut FixedRandom::new(ulid_random16(s2.first()), s2.first_counter())
        ),
        s2
    );
    exec(&mut writer, "commit transaction;")
        .await
        .expect("commit");
    assert_eq!(read_state(&mut admin, &feed, 0).await, model.state());
}

// ------------------------------------------------------------------------------------------
// 2. The load matrix: commit order is ULID order, nothing is skipped
// ------------------------------------------------------------------------------------------

/// One committed event as its writer saw it: the ULID its `lock_feed` returned, when the
/// writer sent the batch (before `lock_feed` could start) and when the commit came back.
#[derive(Clone, Copy, Debug)]
struct Written {
    key: WriterKey,
    shard: i32,
    ulid: Ulid,
    sent: Instant,
    done: Instant,
}

load_test!(load_10_writers_5_readers_100_events_on_1_and_4_shards: "ser_load_10x5x100" => Load::new(10, 5, 100), run_load);
load_test!(load_10_writers_10_readers_200_events_on_1_and_4_shards: "ser_load_10x10x200" => Load::new(10, 10, 200), run_load);

/// W writers commit N events each, one per server-side transaction (lock_feed, insert with
/// ulid(1), commit in one batch), each writer waiting for its previous commit. Writer w
/// writes to shard `w % shards`. R readers, each an independent consumer, read every shard
/// round-robin from the start with `read_page` until they have seen all W*N events.
///
/// Checked: every reader sees every event exactly once, per-writer order, ULIDs strictly
/// increasing per shard in the order read (no reader ever sees a ULID below one it saw
/// before), all readers see the same (shard, ulid) -> event mapping, which is the table's;
/// each event's ULID is the @ulid its lock_feed returned (ulid(1) = @ulid); and the ordering
/// contract: when A's commit had come back before B's batch was sent, ulid(A) < ulid(B).
async fn run_load(db: &TestDb, load: Load, shards: i32) {
    let (mut admin, run) = load_feed(db, load, "ser_load", shards, create_writer_feed).await;
    let (table, feed) = (&run.table, &run.feed);
    let expected = load.events();
    // Each writer commits its events one by one, each in one server-side batch, and keeps
    // the ULID its lock_feed returned and when the batch was sent and came back.
    let (written, reference) = write_and_read(
        db,
        &run,
        move |mut client, database, feed, shard, writer| async move {
            let mut written = Vec::with_capacity(load.events_per_writer);
            for seq in 0..load.events_per_writer as i32 {
                written.push(
                    commit_load_event(&mut client, &database, &feed, shard, (writer, seq)).await?,
                );
            }
            Ok(written)
        },
    )
    .await;
    let written: Vec<Written> = written.into_iter().flatten().collect();

    // The table holds exactly what the readers saw.
    check_stored(
        &mut admin,
        table,
        "the event table",
        &format!(
            "select Shard, ULID, writer, seq from {} order by Shard, ULID;",
            feed.quoted_table()
        ),
        &reference,
        expected,
    )
    .await;

    // Each event got the first ULID of its writer's range: ulid(1) = @ulid.
    let by_key: HashMap<WriterKey, (i32, Ulid)> = reference
        .iter()
        .map(|(&(shard, ulid), &key)| (key, (shard, ulid)))
        .collect();
    for event in &written {
        assert_eq!(
            by_key.get(&event.key),
            Some(&(event.shard, event.ulid)),
            "{table}: event {:?} was stored with another ULID than the @ulid its lock_feed \
             returned ({})",
            event.key,
            event.ulid
        );
    }

    let checked = check_commit_order(table, &written, shards);
    eprintln!(
        "-- {table}: {expected} events; {checked} pairs (A committed before B was sent) all \
         had ulid(A) < ulid(B)"
    );
}

/// One load event in one server-side transaction. A transient error is retried after
/// checking whether the commit made it (then its stored ULID counts).
async fn commit_load_event(
    client: &mut Client,
    database: &str,
    feed: &Feed,
    shard: i32,
    key: WriterKey,
) -> Result<Written, String> {
    let (writer, seq) = key;
    let sent = Instant::now();
    let mut failures = 0;
    loop {
        let batch = event_batch(feed, shard, key, LOAD_LOCK_TIMEOUT_MS, 0);
        match rows(client, &batch).await {
            Ok(result) => {
                let ulid = result
                    .first()
                    .map(|row| ulid_at(row, 0, "@ulid"))
                    .ok_or_else(|| format!("event {key:?}: the batch returned no @ulid"))?;
                return Ok(Written {
                    key,
                    shard,
                    ulid,
                    sent,
                    done: Instant::now(),
                });
            }
            Err(error) if error.is_transient() && failures < MAX_TRANSIENT_RETRIES => {
                failures += 1;
                let what = format!("writer {writer}, event {seq}");
                recover_from_transient(client, database, &what, &error).await;
                let stored = rows(
                    client,
                    &format!(
                        "select ULID from {} where writer = {writer} and seq = {seq};",
                        feed.quoted_table()
                    ),
                )
                .await
                .map_err(|error| format!("event {key:?}: checking a retried commit: {error}"))?;
                if let Some(row) = stored.first() {
                    return Ok(Written {
                        key,
                        shard,
                        ulid: ulid_at(row, 0, "ULID"),
                        sent,
                        done: Instant::now(),
                    });
                }
                retry_pause(failures).await;
            }
            Err(error) => return Err(format!("commit of event {key:?} failed: {error}")),
        }
    }
}

/// The ordering contract (ARCHITECTURE.md), from the writers' own clocks: for two events A and
/// B of one shard, if A's commit had come back to its writer before B's writer sent B's
/// batch (so B's lock_feed started after A's commit), then ulid(A) < ulid(B). Returns how
/// many such pairs were checked.
fn check_commit_order(table: &str, written: &[Written], shards: i32) -> usize {
    let mut checked = 0;
    for shard in 0..shards {
        let mut by_done: Vec<&Written> = written.iter().filter(|w| w.shard == shard).collect();
        by_done.sort_by_key(|w| w.done);
        // prefix_max[i] = the largest ULID among the first i + 1 events to complete.
        let mut prefix_max: Vec<(Ulid, WriterKey)> = Vec::with_capacity(by_done.len());
        for event in &by_done {
            let next = match prefix_max.last() {
                Some(&(max, key)) if max > event.ulid => (max, key),
                _ => (event.ulid, event.key),
            };
            prefix_max.push(next);
        }
        for b in &by_done {
            let before = by_done.partition_point(|a| a.done < b.sent);
            if before == 0 {
                continue;
            }
            checked += before;
            let (max, a_key) = prefix_max[before - 1];
            assert!(
                max < b.ulid,
                "{table}, shard {shard}: event {a_key:?} committed before event {:?} was sent, \
                 but got the larger ULID ({max} >= {}): commit order must be ULID order",
                b.key,
                b.ulid
            );
        }
    }
    checked
}

// ------------------------------------------------------------------------------------------
// 3. Two feeds in one transaction
// ------------------------------------------------------------------------------------------

common::live_test!(two_feeds_in_one_transaction_keep_their_own_ranges: "ser_two_feeds" => two_feeds_scenario);

async fn two_feeds_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let feed_a = create_serialized_feed(&mut admin, "two_a", "id int not null", "id").await;
    let feed_b = create_serialized_feed(&mut admin, "two_b", "id int not null", "id").await;
    let (ulid_a, ulid_b) = (feed_a.object("ulid"), feed_b.object("ulid"));
    let mut writer = db.client().await;
    let mut other = db.client().await;

    begin(&mut writer).await;
    let ra = lock_feed(&mut writer, &feed_a, 0, None, Some(Duration::from_secs(5)))
        .await
        .expect("lock_feed of feed A");
    let insert_a = insert_sql(&feed_a, 1, 1);
    exec_expect(&mut writer, &insert_a, "insert into A with A's ulid()").await;

    // Holding feed A's shard 0 does not lock feed B's shard 0.
    let what = (
        "lock_feed of feed B next to a holder of feed A",
        "feed B's shard 0 is free while feed A's is held",
    );
    assert_shard_free(&mut other, &feed_b, 0, what).await;

    let rb = lock_feed(&mut writer, &feed_b, 0, None, Some(Duration::from_secs(5)))
        .await
        .expect("lock_feed of feed B in the same transaction");
    let b_then_a = insert_sql(&feed_b, 1, 1) + &insert_sql(&feed_a, 2, 2);
    exec_expect(
        &mut writer,
        &b_then_a,
        "insert into B with B's ulid(), then into A with A's",
    )
    .await;
    let select = format!("{ulid_a}(1), {ulid_a}(2), {ulid_b}(1)");
    let now = select_ulids(
        &mut writer,
        &select,
        "both functions in the same transaction",
    )
    .await;
    assert_eq!(
        now,
        [ra.nth(1).unwrap(), ra.nth(2).unwrap(), rb.nth(1).unwrap()],
        "after B's lock_feed, A's ulid() still hands out A's range and B's hands out B's"
    );
    assert_ne!(
        ra.first(),
        rb.first(),
        "the two feeds reserved separate ranges"
    );
    exec(&mut writer, "commit transaction;")
        .await
        .expect("commit both feeds' events at once");

    let mut reader = db.client().await;
    let page_a = read_from_start::<i32>(&mut reader, &feed_a, "read feed A").await;
    let page_b = read_from_start::<i32>(&mut reader, &feed_b, "read feed B").await;
    assert_eq!(
        ulids_and_keys(&page_a),
        vec![(ra.nth(1).unwrap(), 1), (ra.nth(2).unwrap(), 2)],
        "feed A returns its two events with A's ULIDs"
    );
    assert_eq!(
        ulids_and_keys(&page_b),
        vec![(rb.nth(1).unwrap(), 1)],
        "feed B returns its event with B's ULID"
    );
    expect_ulid_failure(
        &mut writer,
        &format!("select {ulid_a}(1);"),
        NEEDS_LOCK_FEED,
        "A's ulid() after the commit",
    )
    .await;
}

common::live_test!(two_feeds_locked_in_opposite_orders_resolve_the_deadlock_with_51202: "ser_deadlock" => opposite_order_scenario);

/// Writer 1 locks feed A then B, writer 2 locks B then A: a deadlock between the two
/// applocks. SQL Server's deadlock monitor picks a victim, whose sp_getapplock returns -3,
/// which lock_feed turns into 51202 (its transaction rolled back); the other proceeds.
async fn opposite_order_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let feed_a = create_serialized_feed(&mut admin, "order_a", "id int not null", "id").await;
    let feed_b = create_serialized_feed(&mut admin, "order_b", "id int not null", "id").await;
    let mut w1 = db.client().await;
    let mut w2 = db.client().await;
    begin(&mut w1).await;
    begin(&mut w2).await;
    lock_feed(&mut w1, &feed_a, 0, None, None)
        .await
        .expect("writer 1 locks A");
    lock_feed(&mut w2, &feed_b, 0, None, None)
        .await
        .expect("writer 2 locks B");

    let started = Instant::now();
    let (fa, fb) = (feed_a.clone(), feed_b.clone());
    let second_1 = tokio::spawn(async move {
        let result = lock_feed(&mut w1, &fb, 0, None, None).await;
        (w1, result, Instant::now())
    });
    let second_2 = tokio::spawn(async move {
        let result = lock_feed(&mut w2, &fa, 0, None, None).await;
        (w2, result, Instant::now())
    });
    let (mut w1, result_1, at_1) =
        bounded("writer 1's second lock", Duration::from_secs(60), second_1)
            .await
            .expect("writer 1's task");
    let (mut w2, result_2, at_2) =
        bounded("writer 2's second lock", Duration::from_secs(60), second_2)
            .await
            .expect("writer 2's task");
    let (victim, survivor, error) = match (result_1, result_2) {
        (Err(error), Ok(_)) => (&mut w1, &mut w2, error),
        (Ok(_), Err(error)) => (&mut w2, &mut w1, error),
        (one, two) => panic!(
            "{:?}: exactly one of two writers locking feeds in opposite orders must fail as \
             the deadlock victim; got {one:?} and {two:?}",
            db.isolation
        ),
    };
    eprintln!(
        "-- {:?}: deadlock resolved after {:?} / {:?}: {error}",
        db.isolation,
        at_1 - started,
        at_2 - started
    );
    assert!(
        matches!(error.server_number(), Some(51202 | 1205)),
        "the deadlock victim gets 51202 (sp_getapplock returned -3), or 1205; got {error}"
    );
    if error.server_number() == Some(51202) {
        assert!(
            error.to_string().contains("returned -3"),
            "51202 names sp_getapplock's result -3 (deadlock victim): {error}"
        );
        assert!(
            error.is_transient(),
            "51202 is transient: retry the transaction"
        );
    }
    assert_eq!(
        scalar_i64(victim, "select @@trancount;").await,
        0,
        "the victim's transaction was rolled back"
    );
    exec(survivor, "commit transaction;")
        .await
        .expect("the survivor commits");
}

// ------------------------------------------------------------------------------------------
// 4. Lock timeout and commit order between two writers
// ------------------------------------------------------------------------------------------

common::live_test!(lock_timeout_fails_fast_with_51202_and_rolls_back: "ser_timeout" => lock_timeout_scenario);

async fn lock_timeout_scenario(db: &TestDb) {
    let (_admin, feed) = id_feed_in(db, "timeouts", "int").await;
    let lock = feed.object("lock_feed");
    let mut w1 = db.client().await;
    let mut w2 = db.client().await;

    // Phase 1: writer 1 holds shard 0.
    begin(&mut w1).await;
    let r1 = lock_feed(&mut w1, &feed, 0, None, None)
        .await
        .expect("writer 1 locks shard 0");

    let timeout = Duration::from_millis(500);
    let why = "writer 2 cannot get shard 0 while writer 1 holds it";
    let (error, took) = lock_feed_timing_out(&mut w2, &feed, timeout, why).await;
    eprintln!("-- {:?}: 51202 after {took:?}", db.isolation);
    assert_eq!(
        error.server_number(),
        Some(51202),
        "a lock timeout is error 51202, got {error}"
    );
    assert!(
        error.to_string().contains("lock_feed") && error.to_string().contains("returned -1"),
        "51202 says lock_feed timed out (sp_getapplock returned -1): {error}"
    );
    assert!(
        error.is_transient(),
        "51202 is transient: retry the transaction"
    );
    let limit = Duration::from_secs(3);
    assert_timed_out_and_rolled_back(&mut w2, (took, timeout, limit), "writer 2").await;

    // @lock_timeout_ms = 0 fails at once; the same error from T-SQL, inside TRY/CATCH.
    let started = Instant::now();
    let error = exec(
        &mut w2,
        &format!(
            "set xact_abort on; \
             begin try \
                 begin transaction; \
                 exec {lock} @shard_id = 0, @lock_timeout_ms = 0; \
                 commit transaction; \
             end try \
             begin catch \
                 if @@trancount > 0 rollback transaction; \
                 throw; \
             end catch;"
        ),
    )
    .await
    .expect_err("@lock_timeout_ms = 0 on a held shard");
    assert_eq!(error.server_number(), Some(51202), "got {error}");
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "@lock_timeout_ms = 0 waited {:?}",
        started.elapsed()
    );
    assert_eq!(scalar_i64(&mut w2, "select @@trancount;").await, 0);

    // Another shard is free.
    let what = (
        "lock_feed of shard 1 next to a holder of shard 0",
        "shard 1 is free while shard 0 is held",
    );
    assert_shard_free(&mut w2, &feed, 1, what).await;

    // Writer 1 was not disturbed.
    insert_and_commit(
        &mut w1,
        &feed,
        (1, 1),
        "writer 1 inserts and commits after writer 2's timeouts",
    )
    .await;

    // Phase 2: a writer that waits (within its timeout) gets a range above the holder's and
    // is let in only when the holder commits.
    begin(&mut w1).await;
    let r1b = lock_feed(&mut w1, &feed, 0, None, None)
        .await
        .expect("writer 1 locks shard 0 again");
    assert!(r1b.first() > r1.last());
    begin(&mut w2).await;
    let feed_for_w2 = feed.clone();
    let waiting = tokio::spawn(async move {
        let result = lock_feed(
            &mut w2,
            &feed_for_w2,
            0,
            None,
            Some(Duration::from_secs(10)),
        )
        .await;
        (w2, result, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "writer 2 got shard 0 while writer 1 still held it"
    );
    let commit_sent = Instant::now();
    insert_and_commit(&mut w1, &feed, (2, 1), "writer 1 commits").await;
    let (mut w2, result, granted_at) = bounded("writer 2's wait", NOT_BLOCKED_LIMIT, waiting)
        .await
        .expect("writer 2's task");
    let r2 = result.expect("writer 2 gets shard 0 once writer 1 committed");
    assert!(
        granted_at >= commit_sent,
        "writer 2's lock_feed returned before writer 1 even sent its commit"
    );
    assert!(
        r2.first() > r1b.last(),
        "the writer let in after a commit gets ULIDs above the whole range of the committed one"
    );
    insert_and_commit(&mut w2, &feed, (3, 1), "writer 2 commits").await;

    let mut reader = db.client().await;
    let page = read_from_start::<i32>(&mut reader, &feed, "read_page").await;
    assert_eq!(
        ulids_and_keys(&page),
        vec![(r1.first(), 1), (r1b.first(), 2), (r2.first(), 3)],
        "commit order is ULID order"
    );
}

// ------------------------------------------------------------------------------------------
// 5. ulid(@i) outside its transaction, and lock_feed outside any
// ------------------------------------------------------------------------------------------

common::live_test!(ulid_outside_its_transaction_fails_clearly: "ser_misuse" => misuse_scenario);

async fn misuse_scenario(db: &TestDb) {
    let (_admin, feed) = id_feed_in(db, "misuse", "int").await;
    let ulid_fn = feed.object("ulid");
    let lock = feed.object("lock_feed");
    let mut client = db.client().await;
    let mut other = db.client().await;

    // A session that never called lock_feed, outside and inside a transaction.
    let when = "in a session that never called lock_feed";
    expect_needs_lock_feed_outside_and_inside(&mut client, &ulid_fn, when).await;

    // After the transaction that called lock_feed committed.
    begin_and_lock(&mut client, &feed).await;
    insert_and_commit(&mut client, &feed, (1, 1), "insert and commit").await;
    let when = "after the commit";
    expect_needs_lock_feed_outside_and_inside(&mut client, &ulid_fn, when).await;

    // After a rollback.
    begin_and_lock(&mut client, &feed).await;
    exec(&mut client, "rollback transaction;")
        .await
        .expect("rollback");
    expect_ulid_failure(
        &mut client,
        &format!("select {ulid_fn}(1);"),
        NEEDS_LOCK_FEED,
        "ulid(1) after a rollback",
    )
    .await;

    // Another session, while this one holds a range.
    let range = begin_and_lock(&mut client, &feed).await;
    expect_ulid_failure(
        &mut other,
        &format!("select {ulid_fn}(1);"),
        NEEDS_LOCK_FEED,
        "ulid(1) in another session",
    )
    .await;
    let select = format!("{ulid_fn}(1), {ulid_fn}(100000000000)");
    let edges = select_ulids(&mut client, &select, "ulid(1) and ulid(10^11) are in range").await;
    assert_eq!(edges, [range.first(), range.last()]);
    exec(&mut client, "rollback transaction;")
        .await
        .expect("rollback");

    // Out of range, each in a transaction of its own that did call lock_feed.
    for argument in ["0", "-1", "100000000001", "null"] {
        begin_and_lock(&mut client, &feed).await;
        expect_ulid_failure(
            &mut client,
            &format!("select {ulid_fn}({argument});"),
            OUT_OF_RANGE,
            &format!("ulid({argument})"),
        )
        .await;
        rollback_if_open(&mut client).await;
    }

    // lock_feed outside a transaction, from Rust and from T-SQL.
    let error = lock_feed(&mut client, &feed, 0, None, None)
        .await
        .expect_err("lock_feed outside a transaction");
    // 51200 says to call it inside a transaction.
    assert_refused(&error, (51200, "inside"), "lock_feed outside a transaction");
    let error = exec(&mut client, &format!("exec {lock} @shard_id = 0;"))
        .await
        .expect_err("exec lock_feed outside a transaction");
    assert_eq!(error.server_number(), Some(51200), "got {error}");

    // Bad arguments.
    for (arguments, what) in [
        ("@shard_id = null", "a null shard"),
        (
            "@shard_id = 0, @lock_timeout_ms = -2",
            "a lock timeout below -1",
        ),
        (
            "@shard_id = 0, @lock_timeout_ms = null",
            "a null lock timeout",
        ),
    ] {
        let error = exec(
            &mut client,
            &format!("begin transaction; exec {lock} {arguments};"),
        )
        .await
        .expect_err(what);
        assert_eq!(error.server_number(), Some(51201), "{what}: got {error}");
        rollback_if_open(&mut client).await;
    }

    // read_feed refuses to run inside a transaction (51100), as in outbox mode.
    begin(&mut client).await;
    let error = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10))
        .await
        .expect_err("read_feed inside a transaction");
    assert_eq!(error.server_number(), Some(51100), "got {error}");
    rollback_if_open(&mut client).await;
}

/// `sql` must fail with ulid(@i)'s deliberate conversion error (245) carrying `fragment`.
async fn expect_ulid_failure(client: &mut Client, sql: &str, fragment: &str, what: &str) {
    match exec(client, sql).await {
        Ok(()) => panic!("{what}: `{sql}` succeeded; it must fail with error 245 ({fragment})"),
        Err(error) => {
            let text = error.to_string();
            assert_eq!(
                error.server_number(),
                Some(245),
                "{what}: expected the conversion error 245, got {error}"
            );
            assert!(
                text.contains("changefeed: ulid(@i)") && text.contains(fragment),
                "{what}: the message must start the converted text with 'changefeed: ulid(@i)' \
                 and say '{fragment}': {text}"
            );
        }
    }
}

/// `select ulid(1)` must fail with NEEDS_LOCK_FEED both as it is and at the start of a new
/// transaction that did not call lock_feed, which is then rolled back; `when` says when it
/// is called (`ulid(1) <when>`).
async fn expect_needs_lock_feed_outside_and_inside(client: &mut Client, ulid_fn: &str, when: &str) {
    let outside = format!("ulid(1) {when}");
    let select = format!("select {ulid_fn}(1);");
    expect_ulid_failure(client, &select, NEEDS_LOCK_FEED, &outside).await;
    let inside = format!("{outside}, in a new transaction that did not call lock_feed");
    let in_new_transaction = format!("begin transaction; {select}");
    expect_ulid_failure(client, &in_new_transaction, NEEDS_LOCK_FEED, &inside).await;
    rollback_if_open(client).await;
}

/// Begins a transaction on `client` and calls lock_feed of shard 0 of `feed` with `timeout`,
/// which must fail (`why` says why it cannot get the shard): the error, and how long it
/// took.
async fn lock_feed_timing_out(
    client: &mut Client,
    feed: &Feed,
    timeout: Duration,
    why: &str,
) -> (changefeed::Error, Duration) {
    begin(client).await;
    let started = Instant::now();
    let error = bounded(
        &format!("lock_feed with @lock_timeout_ms = {}", timeout.as_millis()),
        NOT_BLOCKED_LIMIT,
        lock_feed(client, feed, 0, None, Some(timeout)),
    )
    .await
    .expect_err(why);
    (error, started.elapsed())
}

/// Asserts a lock_feed given up after `timing.0` with the lock timeout `timing.1` took about
/// that (at least 90 % of it, at most `timing.2`), and that its 51202 rolled `who`'s
/// transaction back (XACT_ABORT in lock_feed).
async fn assert_timed_out_and_rolled_back(
    client: &mut Client,
    timing: (Duration, Duration, Duration),
    who: &str,
) {
    let (took, timeout, limit) = timing;
    assert!(
        took >= timeout * 9 / 10 && took <= limit,
        "@lock_timeout_ms = {} failed after {took:?}; expected about {timeout:?}",
        timeout.as_millis()
    );
    assert_eq!(
        scalar_i64(client, "select @@trancount;").await,
        0,
        "51202 rolled {who}'s transaction back (XACT_ABORT in lock_feed)"
    );
}

/// Asserts shard `shard` of `feed` is free next to another session's holder: in a
/// transaction of `client`'s, lock_feed with no wait gets it (`what`: the bounded call, and
/// what must hold), and the transaction is rolled back.
async fn assert_shard_free(client: &mut Client, feed: &Feed, shard: i32, what: (&str, &str)) {
    let (call, free) = what;
    begin(client).await;
    bounded(
        call,
        NOT_BLOCKED_LIMIT,
        lock_feed(client, feed, shard, None, Some(Duration::ZERO)),
    )
    .await
    .expect(free);
    exec(client, "rollback transaction;")
        .await
        .expect("rollback");
}

/// Reads shard 0 of `feed` from the start, a page of up to 100 rows; `what` names the read.
async fn read_from_start<K: changefeed::row::FromRow>(
    client: &mut Client,
    feed: &Feed,
    what: &str,
) -> Page<FeedRow<K>> {
    read_page::<K>(client, feed, 0, Cursor::START, options(100))
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
}

/// Inserts event `event.0` of an `id`-keyed serialized `feed` on shard 0 with ulid(`event.1`)
/// and commits, on `client`, inside the transaction whose lock_feed it took; `what` names it.
async fn insert_and_commit(client: &mut Client, feed: &Feed, event: (i32, i32), what: &str) {
    let (id, i) = event;
    let batch = format!("{} commit transaction;", insert_sql(feed, id, i));
    exec_expect(client, &batch, what).await;
}

/// The insert of event `id` of an `id`-keyed serialized `feed` on shard 0 with ulid(`i`).
fn insert_sql(feed: &Feed, id: i32, i: i32) -> String {
    format!(
        "insert into {} (id, Shard, ULID) values ({id}, 0, {}({i}));",
        feed.quoted_table(),
        feed.object("ulid")
    )
}

/// `select <list>` on `client`, `list` being ULID expressions separated by commas: their
/// values, in order; `what` names the query.
async fn select_ulids(client: &mut Client, list: &str, what: &str) -> Vec<Ulid> {
    let found = rows(client, &format!("select {list};"))
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    let row = found.first().unwrap_or_else(|| panic!("{what}: no row"));
    (0..row.len())
        .map(|i| ulid_at(row, i, &format!("{what}, column {i}")))
        .collect()
}

/// Asserts `error`, from `what`, is SQL Server error `expected.0` and that its message says
/// `expected.1`.
#[track_caller]
fn assert_refused(error: &changefeed::Error, expected: (u32, &str), what: &str) {
    let (number, says) = expected;
    assert_eq!(
        error.server_number(),
        Some(number),
        "{what}: expected error {number}, got {error}"
    );
    assert!(
        error.to_string().contains(says),
        "{what}: the message of {number} must say '{says}': {error}"
    );
}

/// Runs `batch` on `client`, which must succeed; `what` names it.
async fn exec_expect(client: &mut Client, batch: &str, what: &str) {
    exec(client, batch)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"));
}

async fn begin(client: &mut Client) {
    exec(client, "begin transaction;").await.expect("begin");
}

/// Begins a transaction and takes shard 0 of `feed` with lock_feed (the server's clock, the
/// default lock timeout), as a writer does before it calls ulid(@i). Returns the range.
async fn begin_and_lock(client: &mut Client, feed: &Feed) -> UlidRange {
    begin(client).await;
    lock_feed(client, feed, 0, None, None)
        .await
        .expect("lock_feed")
}

async fn rollback_if_open(client: &mut Client) {
    exec(client, "if @@trancount > 0 rollback transaction;")
        .await
        .expect("roll back what is open");
}

// ------------------------------------------------------------------------------------------
// 6. setup_feed's checks for serialized-writer mode
// ------------------------------------------------------------------------------------------

common::live_test!(setup_feed_validates_serialized_tables: "ser_setup" => setup_validation_scenario);

/// A table `setup_feed` must refuse, and the error it must give.
struct Refused {
    table: &'static str,
    /// The columns and constraints of `create table`; `{t}` is the table's name.
    definition: &'static str,
    /// Statements after `create table` (indexes); `{t}` is the table's name.
    after: &'static str,
    /// The arguments after @table_name.
    arguments: &'static str,
    number: u32,
    fragment: &'static str,
}

const SERIALIZE: &str = "@serialize_writers = 1, @shard_column = N'Shard', @ulid_column = N'ULID'";

async fn setup_validation_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let plain = "id int not null primary key, Shard int not null, ULID binary(16) not null";
    let unique = "create unique index [ux_{t}] on [dbo].[{t}] (Shard, ULID);";
    let refused = [
        Refused {
            table: "shard_bigint",
            definition: "id int not null primary key, Shard bigint not null, ULID binary(16) not null",
            after: unique,
            arguments: SERIALIZE,
            number: 51010,
            fragment: "shard column is missing or not int",
        },
        Refused {
            table: "shard_missing",
            definition: plain,
            after: unique,
            arguments: "@serialize_writers = 1, @shard_column = N'NoSuchColumn', @ulid_column = N'ULID'",
            number: 51010,
            fragment: "shard column is missing or not int",
        },
        Refused {
            table: "ulid_guid",
            definition: "id int not null primary key, Shard int not null, ULID uniqueidentifier not null",
            after: unique,
            arguments: SERIALIZE,
            number: 51010,
            fragment: "not binary(16)",
        },
        Refused {
            table: "ulid_binary8",
            definition: "id int not null primary key, Shard int not null, ULID binary(8) not null",
            after: unique,
            arguments: SERIALIZE,
            number: 51010,
            fragment: "not binary(16)",
        },
        Refused {
            table: "ulid_varbinary",
            definition: "id int not null primary key, Shard int not null, ULID varbinary(16) not null",
            after: unique,
            arguments: SERIALIZE,
            number: 51010,
            fragment: "not binary(16)",
        },
        Refused {
            table: "no_index",
            definition: plain,
            after: "",
            arguments: SERIALIZE,
            number: 51011,
            fragment: "unique index",
        },
        Refused {
            table: "not_unique",
            definition: plain,
            after: "create index [ix_{t}] on [dbo].[{t}] (Shard, ULID);",
            arguments: SERIALIZE,
            number: 51011,
            fragment: "unique index",
        },
        Refused {
            table: "wrong_order",
            definition: plain,
            after: "create unique index [ux_{t}] on [dbo].[{t}] (ULID, Shard);",
            arguments: SERIALIZE,
            number: 51011,
            fragment: "unique index",
        },
        Refused {
            table: "filtered",
            definition: plain,
            after: "create unique index [ux_{t}] on [dbo].[{t}] (Shard, ULID) where Shard >= 0;",
            arguments: SERIALIZE,
            number: 51011,
            fragment: "unfiltered",
        },
        Refused {
            table: "three_keys",
            definition: plain,
            after: "create unique index [ux_{t}] on [dbo].[{t}] (Shard, ULID, id);",
            arguments: SERIALIZE,
            number: 51011,
            fragment: "unique index",
        },
        Refused {
            table: "reserved_name",
            definition: "id int not null primary key, Shard__template int not null, ULID binary(16) not null",
            after: "create unique index [ux_{t}] on [dbo].[{t}] (Shard__template, ULID);",
            arguments: "@serialize_writers = 1, @shard_column = N'Shard__template', @ulid_column = N'ULID'",
            number: 51008,
            fragment: "__template",
        },
        Refused {
            table: "no_shard_argument",
            definition: plain,
            after: unique,
            arguments: "@serialize_writers = 1, @ulid_column = N'ULID'",
            number: 51004,
            fragment: "@shard_column",
        },
        Refused {
            table: "no_ulid_argument",
            definition: plain,
            after: unique,
            arguments: "@serialize_writers = 1, @shard_column = N'Shard'",
            number: 51004,
            fragment: "@ulid_column",
        },
        Refused {
            table: "both_modes",
            definition: plain,
            after: unique,
            arguments: "@outbox = 1, @serialize_writers = 1, @shard_column = N'Shard', @ulid_column = N'ULID'",
            number: 51004,
            fragment: "exactly one mode",
        },
        Refused {
            table: "outbox_with_columns",
            definition: plain,
            after: unique,
            arguments: "@outbox = 1, @shard_column = N'Shard', @ulid_column = N'ULID'",
            number: 51004,
            fragment: "@serialize_writers = 1",
        },
    ];
    for case in &refused {
        let t = case.table;
        exec(
            &mut admin,
            &format!(
                "create table [dbo].[{t}] ({}); {}",
                case.definition.replace("{t}", t),
                case.after.replace("{t}", t)
            ),
        )
        .await
        .unwrap_or_else(|error| panic!("create table dbo.{t}: {error}"));
        let error = exec(
            &mut admin,
            &format!(
                "exec changefeed.setup_feed @table_name = N'dbo.{t}', {};",
                case.arguments
            ),
        )
        .await
        .err()
        .unwrap_or_else(|| {
            panic!(
                "setup_feed accepted dbo.{t}; it must fail with {}",
                case.number
            )
        });
        let what = format!("setup_feed of dbo.{t}");
        assert_refused(&error, (case.number, case.fragment), &what);
        assert_not_a_feed(&mut admin, t).await;
    }

    // Accepted shapes: included columns, a unique constraint, the ULID in the primary key.
    let accepted: [(&str, &str, &str); 3] = [
        (
            "ok_include",
            "id int not null primary key, Shard int not null, ULID binary(16) not null, payload nvarchar(20) null",
            "create unique index [ux_{t}] on [dbo].[{t}] (Shard, ULID) include (payload);",
        ),
        (
            "ok_constraint",
            "id int not null primary key, Shard int not null, ULID binary(16) not null, constraint [uq_{t}] unique (Shard, ULID)",
            "",
        ),
        (
            "ok_key",
            "Shard int not null, EventUlid binary(16) not null, payload nvarchar(20) null, constraint [pk_{t}] primary key (Shard, EventUlid)",
            "",
        ),
    ];
    for (t, definition, after) in accepted {
        exec(
            &mut admin,
            &format!(
                "create table [dbo].[{t}] ({}); {}",
                definition.replace("{t}", t),
                after.replace("{t}", t)
            ),
        )
        .await
        .unwrap_or_else(|error| panic!("create table dbo.{t}: {error}"));
        let ulid_column = if t == "ok_key" { "EventUlid" } else { "ULID" };
        exec(
            &mut admin,
            &format!(
                "exec changefeed.setup_feed @table_name = N'dbo.{t}', @serialize_writers = 1, \
                 @shard_column = N'Shard', @ulid_column = N'{ulid_column}';"
            ),
        )
        .await
        .unwrap_or_else(|error| panic!("setup_feed must accept dbo.{t}: {error}"));
        let feed = Feed::new("dbo", t).expect("a valid feed name");
        let (lock, ulid_fn) = (feed.object("lock_feed"), feed.object("ulid"));
        let insert = if t == "ok_key" {
            format!(
                "insert into [dbo].[{t}] (Shard, EventUlid) \
                 select 0, {ulid_fn}(row_number() over (order by v.n)) from (values (1), (2)) as v (n);"
            )
        } else {
            format!(
                "insert into [dbo].[{t}] (id, Shard, ULID) \
                 select v.n, 0, {ulid_fn}(row_number() over (order by v.n)) from (values (1), (2)) as v (n);"
            )
        };
        let first = rows(
            &mut admin,
            &format!(
                "set xact_abort on; declare @u binary(16); \
                 begin transaction; exec {lock} @shard_id = 0, @ulid = @u output; {insert} \
                 commit transaction; select @u;"
            ),
        )
        .await
        .unwrap_or_else(|error| panic!("write two events to dbo.{t}: {error}"));
        let u = ulid_at(&first[0], 0, "@ulid");
        let range = UlidRange::from_parts(ulid_high(u), ulid_counter(u), RESERVATION_SIZE)
            .expect("a server-made range");
        let mut reader = db.client().await;
        let read: Vec<Ulid> = if t == "ok_key" {
            let page =
                read_page::<(i32, Vec<u8>)>(&mut reader, &feed, 0, Cursor::START, options(10))
                    .await
                    .unwrap_or_else(|error| panic!("read dbo.{t}: {error}"));
            for row in &page.rows {
                assert_eq!(
                    (row.key.0, row.key.1.as_slice()),
                    (0, &row.ulid.to_bytes()[..]),
                    "dbo.{t}: the key is (Shard, EventUlid), the ULID itself"
                );
            }
            page.rows.iter().map(|row| row.ulid).collect()
        } else {
            let page = read_page::<i32>(&mut reader, &feed, 0, Cursor::START, options(10))
                .await
                .unwrap_or_else(|error| panic!("read dbo.{t}: {error}"));
            assert_eq!(
                page.rows.iter().map(|row| row.key).collect::<Vec<_>>(),
                vec![1, 2]
            );
            page.rows.iter().map(|row| row.ulid).collect()
        };
        assert_eq!(
            read,
            vec![range.nth(1).unwrap(), range.nth(2).unwrap()],
            "dbo.{t}: read_feed returns both events with their ULIDs, in order"
        );
    }

    // Idempotency: the same call again changes nothing.
    let before = registry_snapshot(&mut admin, "ok_constraint").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    exec(
        &mut admin,
        &format!("exec changefeed.setup_feed @table_name = N'dbo.ok_constraint', {SERIALIZE};"),
    )
    .await
    .expect("a second setup_feed with the same arguments is a no-op");
    assert_eq!(
        registry_snapshot(&mut admin, "ok_constraint").await,
        before,
        "a second setup_feed with the same arguments must not regenerate or re-register"
    );

    // Other columns, or the other mode, on a registered feed: 51005.
    exec(
        &mut admin,
        "alter table [dbo].[ok_constraint] add Shard2 int not null default 0, \
         ULID2 binary(16) not null default 0x00000000000000000000000000000000;",
    )
    .await
    .expect("add a second shard/ULID pair");
    exec(
        &mut admin,
        "delete from [dbo].[ok_constraint]; \
         create unique index [ux_ok_constraint_2] on [dbo].[ok_constraint] (Shard2, ULID2);",
    )
    .await
    .expect("a unique index on the second pair");
    for (arguments, what) in [
        (
            "@serialize_writers = 1, @shard_column = N'Shard2', @ulid_column = N'ULID2'",
            "other columns",
        ),
        ("@outbox = 1", "outbox mode"),
    ] {
        let error = exec(
            &mut admin,
            &format!("exec changefeed.setup_feed @table_name = N'dbo.ok_constraint', {arguments};"),
        )
        .await
        .expect_err(what);
        // 51005 says to tear the feed down first.
        let what = format!("setup_feed of a registered feed with {what}");
        assert_refused(&error, (51005, "teardown_feed"), &what);
    }
    assert_eq!(
        registry_snapshot(&mut admin, "ok_constraint").await,
        before,
        "a refused setup_feed leaves the registered feed as it was"
    );

    // After a teardown, the other columns are accepted.
    exec(
        &mut admin,
        "exec changefeed.teardown_feed @table_name = N'dbo.ok_constraint';",
    )
    .await
    .expect("teardown_feed");
    assert_not_a_feed(&mut admin, "ok_constraint").await;
    exec(
        &mut admin,
        "exec changefeed.setup_feed @table_name = N'dbo.ok_constraint', @serialize_writers = 1, \
         @shard_column = N'Shard2', @ulid_column = N'ULID2';",
    )
    .await
    .expect("setup_feed with the other columns after a teardown");
    let registered = rows(
        &mut admin,
        "select shard_column, ulid_column, mode from changefeed.feeds \
         where schema_name = N'dbo' and table_name = N'ok_constraint';",
    )
    .await
    .expect("the registry row");
    assert_eq!(
        (
            registered[0].get::<&str, _>(0),
            registered[0].get::<&str, _>(1),
            registered[0].get::<&str, _>(2)
        ),
        (Some("Shard2"), Some("ULID2"), Some("serialize_writers"))
    );
}

/// What a no-op setup_feed must leave unchanged: the registry row and the modify dates of
/// the generated code.
async fn registry_snapshot(admin: &mut Client, table: &str) -> Vec<String> {
    let result = rows(
        admin,
        &format!(
            "select concat(f.feed_id, N'|', f.mode, N'|', f.shard_column, N'|', f.ulid_column, \
                 N'|', f.generator_version, N'|', convert(nvarchar(30), f.upgraded_at, 126)) \
             from changefeed.feeds as f where f.schema_name = N'dbo' and f.table_name = N'{table}' \
             union all \
             select concat(o.name, N'|', convert(nvarchar(30), o.modify_date, 126)) \
             from sys.objects as o \
             where o.schema_id = schema_id(N'changefeed') and o.name like N'%:dbo.{table}';"
        ),
    )
    .await
    .expect("snapshot the registry");
    let mut snapshot: Vec<String> = result
        .iter()
        .map(|row| row.get::<&str, _>(0).unwrap_or_default().to_owned())
        .collect();
    snapshot.sort();
    assert!(
        snapshot.len() >= 5,
        "dbo.{table}: expected the registry row and the generated objects, got {snapshot:?}"
    );
    snapshot
}

async fn assert_not_a_feed(admin: &mut Client, table: &str) {
    let left = scalar_i64(
        admin,
        &format!(
            "select (select count(*) from changefeed.feeds where schema_name = N'dbo' \
                 and table_name = N'{table}') \
             + (select count(*) from sys.objects where schema_id = schema_id(N'changefeed') \
                 and name like N'%:dbo.{table}');"
        ),
    )
    .await;
    assert_eq!(
        left, 0,
        "dbo.{table}: a refused or torn-down feed leaves no registry row and no object"
    );
}

// ------------------------------------------------------------------------------------------
// 7. Roles with real logins
// ------------------------------------------------------------------------------------------

common::live_test!(writer_and_reader_roles_with_real_logins: "ser_roles" => with_logins("serwriter", "serreader") roles_scenario);

async fn roles_scenario(db: &TestDb, [writer_login, reader_login]: &[Login; 2]) {
    let mut admin = db.client().await;
    let feed_a = create_serialized_feed(&mut admin, "role_a", "id int not null", "id").await;
    let feed_b = create_serialized_feed(&mut admin, "role_b", "id int not null", "id").await;
    let ulid_a = feed_a.object("ulid");
    // The event tables are the application's: it grants its writers INSERT on them;
    // changefeed grants lock_feed and ulid().
    writer_login
        .create(
            &mut admin,
            &[feed_a.writers_role(), feed_b.writers_role()],
            &[
                format!("grant insert on {} to", feed_a.quoted_table()),
                format!("grant insert on {} to", feed_b.quoted_table()),
            ],
        )
        .await;
    reader_login
        .create(&mut admin, &[feed_a.readers_role()], &[])
        .await;
    let mut writer = writer_login.connect(db).await;
    let mut reader = reader_login.connect(db).await;

    // Writer: lock_feed and ulid() of two feeds in one transaction.
    begin(&mut writer).await;
    let ra = lock_feed(&mut writer, &feed_a, 0, None, Some(Duration::from_secs(5)))
        .await
        .unwrap_or_else(|error| panic!("a member of the writers role runs lock_feed: {error}"));
    let insert_a = insert_sql(&feed_a, 1, 1);
    exec_expect(
        &mut writer,
        &insert_a,
        "a member of the writers role uses ulid()",
    )
    .await;
    let rb = lock_feed(&mut writer, &feed_b, 0, None, Some(Duration::from_secs(5)))
        .await
        .expect("the writer locks feed B in the same transaction");
    let b_then_a = insert_sql(&feed_b, 1, 1) + &insert_sql(&feed_a, 2, 2);
    let what = "the writer inserts into both feeds and commits";
    exec_expect(
        &mut writer,
        &format!("{b_then_a} commit transaction;"),
        what,
    )
    .await;
    let stored = rows(
        &mut admin,
        &format!(
            "select N'A', id, ULID from {} union all select N'B', id, ULID from {} \
             order by 1, 2;",
            feed_a.quoted_table(),
            feed_b.quoted_table()
        ),
    )
    .await
    .expect("read both tables");
    let stored: Vec<(String, i32, Ulid)> = stored
        .iter()
        .map(|row| {
            (
                row.get::<&str, _>(0).unwrap_or_default().to_owned(),
                i32_at(row, 1, "id"),
                ulid_at(row, 2, "ULID"),
            )
        })
        .collect();
    assert_eq!(
        stored,
        vec![
            ("A".to_owned(), 1, ra.nth(1).unwrap()),
            ("A".to_owned(), 2, ra.nth(2).unwrap()),
            ("B".to_owned(), 1, rb.nth(1).unwrap()),
        ],
        "a writer login's ulid() of each feed hands out that feed's range, also after \
         another feed's lock_feed in the same transaction"
    );

    // A writer login and a dbo writer share one shard lock.
    begin(&mut admin).await;
    lock_feed(&mut admin, &feed_a, 0, None, None)
        .await
        .expect("dbo locks feed A's shard 0");
    begin(&mut writer).await;
    let started = Instant::now();
    let error = bounded(
        "a writer login's lock_feed next to a dbo holder",
        NOT_BLOCKED_LIMIT,
        lock_feed(
            &mut writer,
            &feed_a,
            0,
            None,
            Some(Duration::from_millis(500)),
        ),
    )
    .await
    .expect_err("the writer login must wait for dbo's lock of the same shard");
    assert_eq!(
        error.server_number(),
        Some(51202),
        "the writer login times out on the same lock as dbo's, got {error} after {:?}",
        started.elapsed()
    );
    exec(&mut admin, "rollback transaction;")
        .await
        .expect("dbo rolls back");
    rollback_if_open(&mut writer).await;

    // Writer: no reading, no state.
    let error = read_page::<i32>(&mut writer, &feed_a, 0, Cursor::START, options(10))
        .await
        .expect_err("a writer login must not execute read_feed");
    assert_eq!(error.server_number(), Some(229), "got {error}");
    for (sql, what) in [
        (
            format!("select * from {};", feed_a.object("state")),
            "writer selects from the state",
        ),
        (
            format!("update {} set next_counter = 0;", feed_a.object("state")),
            "writer updates the state",
        ),
        (
            format!("select * from {};", feed_a.quoted_table()),
            "writer selects from the event table (only INSERT was granted)",
        ),
    ] {
        expect_denied(&mut writer, &sql, what).await;
    }

    // Reader: read_feed of its feed, nothing else.
    let page = read_page::<i32>(&mut reader, &feed_a, 0, Cursor::START, options(10))
        .await
        .unwrap_or_else(|error| panic!("a member of the readers role reads the feed: {error}"));
    assert_eq!(
        ulids_and_keys(&page),
        vec![(ra.nth(1).unwrap(), 1), (ra.nth(2).unwrap(), 2)],
        "the reader login reads every committed event"
    );
    for (sql, what) in [
        (
            format!(
                "begin transaction; declare @u binary(16); \
                 exec {} @shard_id = 0, @ulid = @u output;",
                feed_a.object("lock_feed")
            ),
            "reader executes lock_feed",
        ),
        (format!("select {ulid_a}(1);"), "reader calls ulid()"),
        (
            format!("select * from {};", feed_a.object("state")),
            "reader selects from the state",
        ),
        (
            format!("exec {} @shard_id = 0;", feed_b.read_feed_procedure()),
            "reader executes another feed's read_feed",
        ),
    ] {
        expect_denied(&mut reader, &sql, what).await;
        rollback_if_open(&mut reader).await;
    }
    close(writer).await;
    close(reader).await;
}

// ------------------------------------------------------------------------------------------
// 8. ULIDs inserted out of order inside one writer transaction
// ------------------------------------------------------------------------------------------

common::live_test!(ulids_inserted_out_of_order_in_one_transaction_are_never_skipped: "ser_out_of_order" => out_of_order_scenario);

/// A writer may use its range in any order: the documented multi-row insert
/// `ulid(row_number() over (order by ...))` inserts rows in the order of its plan, and two
/// statements may use ulid(2) before ulid(1). Readers must still see every row: here the
/// writer inserts ulid(2), a reader starts while the transaction is open, then the writer
/// inserts ulid(1) and commits. Under READ_COMMITTED_SNAPSHOT the reader sees neither row
/// until the commit. Under locking READ COMMITTED the reader blocks on ulid(2)'s key lock;
/// if it then continues from ulid(2), it never visits ulid(1), inserted behind its scan
/// position, and its cursor passes ulid(1) for good.
async fn out_of_order_scenario(db: &TestDb) {
    let (mut admin, feed) = id_feed_in(db, "out_of_order", "int").await;
    let ulid_fn = feed.object("ulid");
    let table = feed.quoted_table();
    let first = rows(&mut admin, &event_batch_by_id(&feed, 0, 1))
        .await
        .expect("a first committed event");
    let e0 = ulid_at(&first[0], 0, "@ulid");

    let mut writer = db.client().await;
    let range = begin_and_lock(&mut writer, &feed).await;
    exec(
        &mut writer,
        &format!("insert into {table} (id, Shard, ULID) values (3, 0, {ulid_fn}(2));"),
    )
    .await
    .expect("insert ulid(2) first");

    let mut reader = connect_unbounded(db).await;
    let read_feed = feed.clone();
    let read = tokio::spawn(async move {
        let page = read_page::<i32>(
            &mut reader,
            &read_feed,
            0,
            Cursor::from_ulid(e0),
            options(100),
        )
        .await;
        (reader, page)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let blocked = !read.is_finished();
    eprintln!(
        "-- {:?}: a reader next to the open writer is {}",
        db.isolation,
        if blocked { "blocked" } else { "not blocked" }
    );
    insert_and_commit(
        &mut writer,
        &feed,
        (2, 1),
        "insert ulid(1) second, and commit",
    )
    .await;
    let (mut reader, page) = bounded("the reader", NOT_BLOCKED_LIMIT, read)
        .await
        .expect("the reader's task");
    let page = page.expect("read_page");

    // Everything a consumer gets from the first read on, following its cursor.
    let mut seen = ulids_and_keys(&page);
    let mut cursor = page.next_cursor;
    loop {
        let next = read_page::<i32>(&mut reader, &feed, 0, cursor, options(100))
            .await
            .expect("read_page");
        if next.rows.is_empty() {
            break;
        }
        seen.extend(ulids_and_keys(&next));
        cursor = next.next_cursor;
    }
    assert_eq!(
        seen,
        vec![(range.nth(1).unwrap(), 2), (range.nth(2).unwrap(), 3)],
        "{:?}: a consumer must get both events of the transaction, in ULID order; the \
         reader {} while the writer's transaction was open (see the comment of this test)",
        db.isolation,
        if blocked {
            "was blocked"
        } else {
            "was not blocked"
        }
    );
}

// ------------------------------------------------------------------------------------------
// 9. POWEROFF.md: a writer that stops answering while it holds the shard
// ------------------------------------------------------------------------------------------

common::live_test!(power_off_client_side_transaction_blocks_the_shard_until_the_connection_dies: "ser_poweroff_a" => power_off_unmitigated);

/// (a) A client-side transaction (`begin tran; exec lock_feed; insert`) whose client then
/// stops answering (the proxy between it and the server freezes). Measures how long writer
/// B waits in lock_feed without any mitigation, up to CHANGEFEED_POWEROFF_WAIT_SECS, and then
/// how quickly B proceeds once the frozen connection is reset (as when the client's process
/// dies). Also shows who else waits: readers under locking READ COMMITTED, not under RCSI.
async fn power_off_unmitigated(db: &TestDb) {
    let wait_limit = power_off_wait();
    let isolation = db.isolation;
    let (mut admin, feed, committed, proxy, mut a) = power_off_start(db, "poweroff_a").await;
    let a_session = session_id(&mut a).await;
    exec(
        &mut a,
        &format!(
            "set xact_abort on; begin transaction; declare @u binary(16); \
             exec {} @shard_id = 0, @ulid = @u output; \
             insert into {} (writer, seq, Shard, ULID) values (1, 1, 0, {}(1));",
            feed.object("lock_feed"),
            feed.quoted_table(),
            feed.object("ulid")
        ),
    )
    .await
    .expect("writer A locks shard 0 and inserts, in a client-side transaction");
    proxy.freeze();
    let frozen_at = Instant::now();
    eprintln!(
        "POWEROFF [{isolation:?}] (a) writer A (session {a_session}, server connection {}) \
         holds shard 0 in an open transaction; its connection is frozen",
        proxy.upstream_connections()
    );

    // A reader of the shard: waits under locking READ COMMITTED, not under RCSI.
    let mut reader = connect_unbounded(db).await;
    let read_feed = feed.clone();
    let read = tokio::spawn(async move {
        let started = Instant::now();
        let page =
            read_page::<WriterKey>(&mut reader, &read_feed, 0, Cursor::START, options(100)).await;
        (page, started.elapsed())
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reader_blocked = !read.is_finished();
    eprintln!(
        "POWEROFF [{isolation:?}] (a) reader of shard 0: {}",
        if reader_blocked {
            "blocked by writer A's uncommitted row"
        } else {
            "not blocked"
        }
    );
    match isolation {
        Isolation::LockingReadCommitted => assert!(
            reader_blocked,
            "under locking READ COMMITTED a reader must wait for writer A's open transaction \
             (read_feed takes the shard's lock shared before it reads)"
        ),
        Isolation::ReadCommittedSnapshot => {
            assert!(
                !reader_blocked,
                "under RCSI a reader must not wait for writer A"
            );
        }
    }

    // Writer B, without mitigation: no lock timeout, no client-side command timeout.
    let mut b = connect_unbounded(db).await;
    begin(&mut b).await;
    let b_feed = feed.clone();
    let b_started = Instant::now();
    let mut b_task = tokio::spawn(async move {
        let result = lock_feed(&mut b, &b_feed, 0, None, None).await;
        (b, result, Instant::now())
    });
    let outcome = tokio::time::timeout(wait_limit, &mut b_task).await;
    let (mut b, result, granted_at) = match outcome {
        Ok(joined) => {
            let (b, result, granted_at) = joined.expect("writer B's task");
            eprintln!(
                "POWEROFF [{isolation:?}] (a) without mitigation: writer B waited {:?}; SQL \
                 Server ended writer A's session by itself ({:?} after the freeze)",
                granted_at - b_started,
                granted_at - frozen_at
            );
            (b, result, granted_at)
        }
        Err(_) => {
            let session = rows(
                &mut admin,
                &format!(
                    "select status, open_transaction_count, \
                         datediff(second, last_request_end_time, getdate()) \
                     from sys.dm_exec_sessions where session_id = {a_session};"
                ),
            )
            .await
            .expect("writer A's session");
            let described = session.first().map_or_else(
                || "gone".to_owned(),
                |row| {
                    format!(
                        "status {}, {} open transaction(s), idle for {} s",
                        row.get::<&str, _>(0).unwrap_or("?"),
                        row.get::<i32, _>(1).unwrap_or(-1),
                        row.get::<i32, _>(2).unwrap_or(-1)
                    )
                },
            );
            eprintln!(
                "POWEROFF [{isolation:?}] (a) without mitigation: writer B still waiting at the \
                 deadline ({wait_limit:?}); writer A's session: {described}"
            );
            let reset_at = Instant::now();
            proxy.reset().await;
            let (b, result, granted_at) = bounded(
                "writer B after writer A's connection was reset",
                Duration::from_secs(60),
                &mut b_task,
            )
            .await
            .expect("writer B's task");
            eprintln!(
                "POWEROFF [{isolation:?}] (a) after the reset (RST) of writer A's connection, \
                 writer B proceeded in {:?}",
                granted_at - reset_at
            );
            (b, result, granted_at)
        }
    };
    let waited = granted_at - b_started;
    assert!(
        waited >= Duration::from_secs(5).min(wait_limit),
        "writer B waited only {waited:?} for a writer that stopped answering; the problem \
         POWEROFF.md describes did not happen (did the freeze work?)"
    );
    let range = result.expect("writer B gets the shard once writer A's session is gone");
    assert!(
        range.first() > committed,
        "B's ULIDs are above the committed event's"
    );
    exec(
        &mut b,
        &format!(
            "insert into {} (writer, seq, Shard, ULID) values (2, 1, 0, {}(1)); \
             commit transaction;",
            feed.quoted_table(),
            feed.object("ulid")
        ),
    )
    .await
    .expect("writer B commits");

    let (page, read_took) = bounded("the reader", Duration::from_secs(60), read)
        .await
        .expect("the reader's task");
    eprintln!("POWEROFF [{isolation:?}] (a) the reader returned after {read_took:?}");
    match isolation {
        // The reader waits for the shard's lock up to 10 s, then gives up with the
        // transient 51103 (writer A was still frozen then); it never reads A's event.
        Isolation::LockingReadCommitted => {
            let error = page.expect_err("the reader gives up while writer A holds the shard");
            assert_eq!(error.server_number(), Some(51103), "{error}");
            assert!(error.is_transient());
        }
        Isolation::ReadCommittedSnapshot => {
            let page = page.expect("read_page");
            assert!(
                !page.rows.iter().any(|row| row.key == (1, 1)),
                "writer A's uncommitted event must never be read"
            );
        }
    }
    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count(*) from {} where writer = 1;",
                feed.quoted_table()
            ),
        )
        .await,
        0,
        "writer A's transaction was rolled back when its session ended"
    );
    drop(proxy);
}

common::live_test!(power_off_with_lock_timeout_other_writers_fail_fast: "ser_poweroff_b" => power_off_lock_timeout);

/// (b) The same frozen writer, and writers that pass @lock_timeout_ms = 1000: they fail with
/// 51202 after about a second instead of queueing, from Rust and from a server-side batch.
async fn power_off_lock_timeout(db: &TestDb) {
    let isolation = db.isolation;
    let (_admin, feed, _, proxy, mut a) = power_off_start(db, "poweroff_b").await;
    exec(
        &mut a,
        &format!(
            "set xact_abort on; begin transaction; exec {} @shard_id = 0;",
            feed.object("lock_feed")
        ),
    )
    .await
    .expect("writer A locks shard 0 in a client-side transaction");
    proxy.freeze();

    let mut b = connect_unbounded(db).await;
    for attempt in 1..=3 {
        let timeout = Duration::from_millis(1000);
        let why = "writer B cannot get the shard of the frozen writer";
        let (error, took) = lock_feed_timing_out(&mut b, &feed, timeout, why).await;
        eprintln!(
            "POWEROFF [{isolation:?}] (b) with @lock_timeout_ms = 1000: writer B failed with \
             {:?} after {took:?} (attempt {attempt})",
            error.server_number()
        );
        assert_eq!(error.server_number(), Some(51202), "got {error}");
        let limit = Duration::from_secs(5);
        assert_timed_out_and_rolled_back(&mut b, (took, timeout, limit), "writer B").await;
    }

    // The recommended server-side batch with a lock timeout fails the same way.
    let started = Instant::now();
    let error = rows(&mut b, &event_batch(&feed, 0, (2, 1), 1000, 0))
        .await
        .expect_err("the server-side batch cannot get the shard either");
    let took = started.elapsed();
    eprintln!(
        "POWEROFF [{isolation:?}] (b) server-side batch with @lock_timeout_ms = 1000: failed \
         with {:?} after {took:?}",
        error.server_number()
    );
    assert_eq!(error.server_number(), Some(51202), "got {error}");
    assert!(took <= Duration::from_secs(5), "took {took:?}");

    // Once writer A's connection is gone, the same call goes through.
    let reset_at = Instant::now();
    proxy.reset().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rows(&mut b, &event_batch(&feed, 0, (2, 1), 1000, 0)).await {
            Ok(_) => break,
            Err(error) if error.server_number() == Some(51202) && Instant::now() < deadline => {}
            Err(error) => panic!("writer B after writer A's reset: {error}"),
        }
    }
    eprintln!(
        "POWEROFF [{isolation:?}] (b) after the reset of writer A's connection, writer B \
         committed within {:?}",
        reset_at.elapsed()
    );
    drop(proxy);
}

common::live_test!(power_off_during_a_server_side_batch_blocks_nobody_beyond_the_batch: "ser_poweroff_c" => power_off_server_side_batch);

/// (c) Writer A sends the whole transaction as one server-side batch (lock_feed, insert,
/// 3 s of work, commit) and stops answering while the server runs it. The server does not
/// need the client to finish the batch: the lock is held for the batch's own duration only.
async fn power_off_server_side_batch(db: &TestDb) {
    const HOLD_MS: u32 = 3000;
    let hold = Duration::from_millis(u64::from(HOLD_MS));
    let isolation = db.isolation;
    let (mut admin, feed, _, proxy, mut a) = power_off_start(db, "poweroff_c").await;
    let a_session = session_id(&mut a).await;

    let batch = event_batch(&feed, 0, (1, 1), -1, HOLD_MS);
    let a_task = tokio::spawn(async move {
        let result = rows(&mut a, &batch).await;
        (a, result)
    });
    // Freeze as soon as the server runs the batch (A holds the shard's applock).
    let deadline = Instant::now() + NOT_BLOCKED_LIMIT;
    while !holds_applock(&mut admin, a_session).await {
        assert!(
            Instant::now() < deadline,
            "writer A's batch did not take the shard lock within {NOT_BLOCKED_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.freeze();
    let locked_at = Instant::now();

    let mut b = connect_unbounded(db).await;
    begin(&mut b).await;
    let b_started = Instant::now();
    let range = bounded(
        "writer B next to a frozen server-side batch",
        hold + Duration::from_secs(30),
        lock_feed(&mut b, &feed, 0, None, None),
    )
    .await
    .expect("writer B gets the shard when writer A's batch commits");
    let waited = b_started.elapsed();
    eprintln!(
        "POWEROFF [{isolation:?}] (c) server-side batch holding the lock for {hold:?}: writer \
         B waited {waited:?} (the lock was released {:?} after A took it)",
        locked_at.elapsed()
    );
    assert!(
        waited <= hold + Duration::from_secs(5),
        "writer B waited {waited:?}: longer than writer A's batch ({hold:?}) plus slack, although \
         the batch needs nothing from its frozen client"
    );
    exec(&mut b, "rollback transaction;")
        .await
        .expect("rollback");
    let a_rows = scalar_i64(
        &mut admin,
        &format!(
            "select count(*) from {} where writer = 1 and ULID < {};",
            feed.quoted_table(),
            hex(&range.first().to_bytes())
        ),
    )
    .await;
    assert_eq!(
        a_rows, 1,
        "writer A's batch committed on the server although its client never read the reply"
    );
    a_task.abort();
    drop(proxy);
}

common::live_test!(power_off_in_outbox_mode_blocks_no_writer_and_no_reader: "ser_poweroff_d" => power_off_outbox);

/// (d) Outbox mode: writer A (frozen) holds an uncommitted event and outbox row of shard 0.
/// Writer B commits to the same shard and a reader returns B's event at once: in outbox
/// mode nobody holds a lock that others of the shard need.
async fn power_off_outbox(db: &TestDb) {
    const LATENCY: Duration = Duration::from_secs(1);
    let isolation = db.isolation;
    let mut admin = db.client().await;
    exec(
        &mut admin,
        "create table [dbo].[poweroff_outbox] (writer int not null, seq int not null, \
         constraint [pk_poweroff_outbox] primary key clustered (writer, seq)); \
         exec changefeed.setup_feed @table_name = N'dbo.poweroff_outbox', @outbox = 1;",
    )
    .await
    .expect("an outbox-mode feed");
    let feed = Feed::new("dbo", "poweroff_outbox").expect("a valid feed name");
    let outbox_event = |writer: i32, seq: i32, commit: bool| {
        format!(
            "set xact_abort on; begin transaction; \
             insert into {} (writer, seq) values ({writer}, {seq}); \
             insert into {} (shard_id, writer, seq) values (0, {writer}, {seq});{}",
            feed.quoted_table(),
            feed.outbox_table(),
            if commit { " commit transaction;" } else { "" }
        )
    };

    // Warm up writer B's and the reader's connections and plans.
    let mut b = db.client().await;
    let mut reader = db.client().await;
    exec(&mut b, &outbox_event(2, 0, true))
        .await
        .expect("writer B's first event");
    let warm = read_page::<WriterKey>(&mut reader, &feed, 0, Cursor::START, options(100))
        .await
        .expect("the first read");
    assert_eq!(keys(&warm), vec![(2, 0)]);

    let proxy = FreezableProxy::start(server_address(db)).await;
    let mut a = connect_through(&proxy, db).await;
    exec(&mut a, &outbox_event(1, 1, false))
        .await
        .expect("writer A inserts its event and outbox row and leaves the transaction open");
    proxy.freeze();

    let started = Instant::now();
    bounded(
        "writer B's commit next to the frozen writer A",
        NOT_BLOCKED_LIMIT,
        exec(&mut b, &outbox_event(2, 1, true)),
    )
    .await
    .expect("writer B commits");
    let write_took = started.elapsed();
    let started = Instant::now();
    let page = bounded(
        "the read next to the frozen writer A",
        NOT_BLOCKED_LIMIT,
        read_page::<WriterKey>(&mut reader, &feed, 0, warm.next_cursor, options(100)),
    )
    .await
    .expect("read_page");
    let read_took = started.elapsed();
    eprintln!(
        "POWEROFF [{isolation:?}] (d) outbox mode next to a frozen writer: writer B committed \
         in {write_took:?}, the reader returned B's event in {read_took:?}"
    );
    assert_eq!(
        keys(&page),
        vec![(2, 1)],
        "the reader returns B's committed event and skips A's uncommitted one"
    );
    assert!(
        write_took <= LATENCY && read_took <= LATENCY,
        "{isolation:?}: outbox mode must not make writers ({write_took:?}) or readers \
         ({read_took:?}) wait for a frozen writer (limit {LATENCY:?})"
    );

    // Writer A's connection dies: its rows disappear; the shard goes on.
    proxy.reset().await;
    await_none_left(
        &mut admin,
        &format!(
            "select (select count(*) from {} with (nolock) where writer = 1) \
             + (select count(*) from {} with (nolock) where writer = 1);",
            feed.quoted_table(),
            feed.outbox_table()
        ),
        Duration::from_secs(60),
        "writer A's rows, its connection reset",
    )
    .await;
    exec(&mut b, &outbox_event(2, 2, true))
        .await
        .expect("writer B's next event");
    let next = read_page::<WriterKey>(&mut reader, &feed, 0, page.next_cursor, options(100))
        .await
        .expect("read_page");
    assert_eq!(keys(&next), vec![(2, 2)], "writer A's event never appears");
    drop(proxy);
}

/// A scenario's start: the serialized feed `table` keyed by `id` of type `id_type`, created
/// on a new admin connection; that connection and the feed.
async fn id_feed_in(db: &TestDb, table: &str, id_type: &str) -> (Client, Feed) {
    let mut admin = db.client().await;
    let columns = format!("id {id_type} not null");
    let feed = create_serialized_feed(&mut admin, table, &columns, "id").await;
    (admin, feed)
}

/// A power-off scenario's start: the (writer, seq) feed `table` with one event committed
/// (its ULID), on an admin connection, and writer A connected through a proxy that can
/// freeze.
async fn power_off_start(db: &TestDb, table: &str) -> (Client, Feed, Ulid, FreezableProxy, Client) {
    let mut admin = db.client().await;
    let feed = create_writer_feed(&mut admin, table).await;
    let committed = commit_event(&mut admin, &feed, 0, (0, 0)).await;
    let proxy = FreezableProxy::start(server_address(db)).await;
    let a = connect_through(&proxy, db).await;
    (admin, feed, committed, proxy, a)
}

/// How long the unmitigated case may wait: `CHANGEFEED_POWEROFF_WAIT_SECS`, default 90 s.
fn power_off_wait() -> Duration {
    let seconds = std::env::var("CHANGEFEED_POWEROFF_WAIT_SECS")
        .ok()
        .and_then(|value| value.trim().parse::<u64>().ok())
        .unwrap_or(90);
    Duration::from_secs(seconds.max(1))
}

/// Whether `session` holds a granted application lock (lock_feed's shard lock).
async fn holds_applock(admin: &mut Client, session: i32) -> bool {
    scalar_i64(
        admin,
        &format!(
            "select count(*) from sys.dm_tran_locks where request_session_id = {session} \
             and resource_type = N'APPLICATION' and request_status = N'GRANT';"
        ),
    )
    .await
        > 0
}

// ------------------------------------------------------------------------------------------
// A TCP proxy that can stop answering
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProxyMode {
    /// Bytes flow both ways.
    Forward,
    /// Nothing is read or forwarded in either direction, but both sockets stay open: to the
    /// server, the client has stopped answering. (The proxy's kernel still acknowledges TCP
    /// segments and keep-alive probes; see POWEROFF.md.)
    Freeze,
    /// Both sockets are closed with SO_LINGER 0, which sends RST (like a killed client).
    Reset,
}

/// A TCP proxy on 127.0.0.1 in front of the test server, for the power-off tests.
struct FreezableProxy {
    address: SocketAddr,
    upstream: String,
    mode: watch::Sender<ProxyMode>,
    listener: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The local address of each proxied connection to the server, in accept order.
    upstream_locals: Arc<Mutex<Vec<SocketAddr>>>,
}

impl FreezableProxy {
    /// Listens on 127.0.0.1:0 and forwards every connection to `upstream` (`host:port`).
    async fn start(upstream: String) -> FreezableProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on 127.0.0.1");
        let address = listener.local_addr().expect("the proxy's address");
        let (mode, receiver) = watch::channel(ProxyMode::Forward);
        let upstream_name = upstream.clone();
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accepted = connections.clone();
        let upstream_locals = Arc::new(Mutex::new(Vec::new()));
        let locals = upstream_locals.clone();
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let receiver = receiver.clone();
                let locals = locals.clone();
                let handle = tokio::spawn(async move {
                    match TcpStream::connect(&upstream).await {
                        Ok(server) => {
                            if let Ok(local) = server.local_addr() {
                                locals.lock().expect("the proxy's addresses").push(local);
                            }
                            relay(client, server, receiver).await;
                        }
                        Err(error) => eprintln!("-- proxy: cannot reach {upstream}: {error}"),
                    }
                });
                accepted
                    .lock()
                    .expect("the proxy's connections")
                    .push(handle);
            }
        });
        FreezableProxy {
            address,
            upstream: upstream_name,
            mode,
            listener,
            connections,
            upstream_locals,
        }
    }

    /// `local -> server` of the proxied connections to the server (the sockets a packet
    /// filter would have to drop to turn the freeze into a true power-off; POWEROFF.md).
    fn upstream_connections(&self) -> String {
        let locals = self.upstream_locals.lock().expect("the proxy's addresses");
        locals
            .iter()
            .map(|local| format!("{local} -> {}", self.upstream))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn freeze(&self) {
        self.mode.send_replace(ProxyMode::Freeze);
    }

    /// Resets every connection (RST both ways) and waits until they are closed.
    async fn reset(&self) {
        self.mode.send_replace(ProxyMode::Reset);
        let handles: Vec<JoinHandle<()>> = self
            .connections
            .lock()
            .expect("the proxy's connections")
            .drain(..)
            .collect();
        for handle in handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
        }
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.mode.send_replace(ProxyMode::Reset);
        self.listener.abort();
    }
}

/// Forwards bytes both ways while the mode is Forward; stops reading while Freeze; closes
/// both sockets with RST on Reset, and closes them when either side closes.
async fn relay(client: TcpStream, server: TcpStream, mut mode: watch::Receiver<ProxyMode>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = vec![0u8; 32 * 1024];
    let mut down = vec![0u8; 32 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Reset => {
                // Whole streams again: a dropped OwnedWriteHalf would first send FIN.
                for stream in [
                    client_read.reunite(client_write),
                    server_read.reunite(server_write),
                ]
                .into_iter()
                .flatten()
                {
                    let _ = stream.set_zero_linger();
                }
                return;
            }
            ProxyMode::Freeze => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            ProxyMode::Forward => {
                tokio::select! {
                    changed = mode.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    read = client_read.read(&mut up) => match read {
                        Ok(n) if n > 0 => {
                            if server_write.write_all(&up[..n]).await.is_err() {
                                return;
                            }
                        }
                        _ => return,
                    },
                    read = server_read.read(&mut down) => match read {
                        Ok(n) if n > 0 => {
                            if client_write.write_all(&down[..n]).await.is_err() {
                                return;
                            }
                        }
                        _ => return,
                    },
                }
            }
        }
    }
}

/// The test server's `host:port`, from the test's ADO string.
fn server_address(db: &TestDb) -> String {
    tiberius::Config::from_ado_string(&db.ado())
        .expect("the test's ADO string")
        .get_addr()
}

/// A connection to the test database through `proxy`, with no client-side command timeout.
///
/// It uses the test server's own configuration (from its ADO string) over a TCP stream to
/// the proxy, which is what an ADO string naming the proxy would do, except that TLS still
/// checks the real server's name. A redirect (Azure SQL's gateway) cannot go through the
/// proxy: the power-off tests need a server that answers on the address it is reached at.
async fn connect_through(proxy: &FreezableProxy, db: &TestDb) -> Client {
    let mut config = tiberius::Config::from_ado_string(&db.ado()).expect("the test's ADO string");
    config.command_timeout(None);
    let tcp = TcpStream::connect(proxy.address)
        .await
        .expect("connect to the proxy");
    tcp.set_nodelay(true).expect("nodelay");
    match tiberius::Client::connect(config, tcp.compat_write()).await {
        Ok(client) => client,
        Err(tiberius::error::Error::Routing { host, port }) => panic!(
            "the server redirected the proxied connection to {host}:{port}; the power-off \
             tests need a server without a redirecting gateway"
        ),
        Err(error) => panic!("connect through the proxy: {error}"),
    }
}

/// A direct connection with no client-side command timeout (tiberius' default is 30 s),
/// for calls that wait on purpose: writer B behind a frozen writer, blocked readers.
async fn connect_unbounded(db: &TestDb) -> Client {
    let config = || {
        let mut config =
            tiberius::Config::from_ado_string(&db.ado()).expect("the test's ADO string");
        config.command_timeout(None);
        config
    };
    common::connect_retrying(10, Duration::from_millis(300), config)
        .await
        .unwrap_or_else(|last_error| panic!("cannot connect to {}: {last_error:?}", db.name))
}

async fn session_id(client: &mut Client) -> i32 {
    scalar_i64(client, "select convert(int, @@spid);").await as i32
}

// ------------------------------------------------------------------------------------------
// Feeds, batches and rows
// ------------------------------------------------------------------------------------------

/// Creates the load and power-off scenarios' serialized feed `[dbo].[table]`: events keyed
/// by (writer, seq).
async fn create_writer_feed(admin: &mut Client, table: &str) -> Feed {
    create_serialized_feed(
        admin,
        table,
        "writer int not null, seq int not null",
        "writer, seq",
    )
    .await
}

/// Creates `[dbo].[table]` with `columns`, an int `Shard`, a binary(16) `ULID`, the primary
/// key `key` and a unique index on (Shard, ULID), and makes it a serialized-writer feed.
async fn create_serialized_feed(admin: &mut Client, table: &str, columns: &str, key: &str) -> Feed {
    exec(
        admin,
        &format!(
            "create table [dbo].[{table}] ({columns}, Shard int not null, \
             ULID binary(16) not null, constraint [pk_{table}] primary key clustered ({key})); \
             create unique index [ux_{table}_shard_ulid] on [dbo].[{table}] (Shard, ULID);"
        ),
    )
    .await
    .unwrap_or_else(|error| panic!("create table dbo.{table}: {error}"));
    exec(
        admin,
        &format!("exec changefeed.setup_feed @table_name = N'dbo.{table}', {SERIALIZE};"),
    )
    .await
    .unwrap_or_else(|error| panic!("setup_feed dbo.{table}: {error}"));
    Feed::new("dbo", table).expect("a valid feed name")
}

/// Event `key` = (writer, seq) of a (writer, seq)-keyed feed in one server-side transaction:
/// lock_feed, insert with ulid(1), optionally `hold_ms` of work, commit; the whole
/// transaction in this batch, so no client round trip happens while the shard is locked.
/// The batch's only result is the @ulid lock_feed returned.
fn event_batch(
    feed: &Feed,
    shard: i32,
    key: WriterKey,
    lock_timeout_ms: i32,
    hold_ms: u32,
) -> String {
    let (writer, seq) = key;
    let hold = if hold_ms > 0 {
        format!("waitfor delay '{}';", waitfor_text(hold_ms))
    } else {
        String::new()
    };
    let lock_timeout = format!(", @lock_timeout_ms = {lock_timeout_ms}");
    let row = ("writer, seq", &*format!("{writer}, {seq}"));
    server_side_batch(feed, shard, &lock_timeout, row, &hold)
}

/// The same for an `id`-keyed feed.
fn event_batch_by_id(feed: &Feed, shard: i32, id: i32) -> String {
    server_side_batch(feed, shard, "", ("id", &id.to_string()), "")
}

/// One server-side transaction on shard `shard` of `feed`: lock_feed (with the further
/// arguments `lock_arguments`, each after a comma), an insert of the event `row` (its key
/// columns and their values) with ulid(1), then `hold` (T-SQL, or nothing), commit; any
/// error rolls it back and is raised again. The batch's only result is the @ulid lock_feed
/// returned.
fn server_side_batch(
    feed: &Feed,
    shard: i32,
    lock_arguments: &str,
    row: (&str, &str),
    hold: &str,
) -> String {
    let (columns, values) = row;
    format!(
        "set nocount on; set xact_abort on; \
         declare @ulid binary(16); \
         begin try \
             begin transaction; \
             exec {lock} @shard_id = {shard}{lock_arguments}, @ulid = @ulid output; \
             insert into {table} ({columns}, Shard, ULID) \
                 values ({values}, {shard}, {ulid}(1)); \
             {hold} \
             commit transaction; \
         end try \
         begin catch \
             if @@trancount > 0 rollback transaction; \
             throw; \
         end catch; \
         select @ulid as ulid;",
        lock = feed.object("lock_feed"),
        table = feed.quoted_table(),
        ulid = feed.object("ulid"),
    )
}

/// Commits one (writer, seq) event with [`event_batch`] and returns its ULID.
async fn commit_event(client: &mut Client, feed: &Feed, shard: i32, key: WriterKey) -> Ulid {
    let result = rows(client, &event_batch(feed, shard, key, -1, 0))
        .await
        .unwrap_or_else(|error| panic!("commit event {key:?}: {error}"));
    ulid_at(&result[0], 0, "@ulid")
}

/// `hh:mm:ss.mmm` for WAITFOR DELAY.
fn waitfor_text(ms: u32) -> String {
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

fn unix_ms(t: PrimitiveDateTime) -> i64 {
    (t.assume_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// The UTC instant `ms` milliseconds after 1970, as the `datetime2(3)` value lock_feed takes.
fn datetime_of_ms(ms: i64) -> PrimitiveDateTime {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("a time the server can hold");
    PrimitiveDateTime::new(t.date(), t.time())
}

/// A datetime2(3) literal, e.g. `2200-01-02T03:04:05.678`.
fn sql_datetime(t: PrimitiveDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

fn options(page_size: u32) -> ReadOptions {
    ReadOptions::default().page_size(page_size).wait_ms(0)
}

fn ulids_and_keys<K: Clone>(page: &Page<FeedRow<K>>) -> Vec<(Ulid, K)> {
    page.rows
        .iter()
        .map(|row| (row.ulid, row.key.clone()))
        .collect()
}

fn bytes_at(row: &Row, index: usize, what: &str) -> Vec<u8> {
    row.try_get::<&[u8], usize>(index)
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .unwrap_or_else(|| panic!("{what} is NULL"))
        .to_vec()
}

fn ulid_at(row: &Row, index: usize, what: &str) -> Ulid {
    let bytes = bytes_at(row, index, what);
    Cursor::from_bytes(&bytes)
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .ulid()
}

fn i64_at(row: &Row, index: usize, what: &str) -> i64 {
    row.try_get::<i64, usize>(index)
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .unwrap_or_else(|| panic!("{what} is NULL"))
}

fn i32_at(row: &Row, index: usize, what: &str) -> i32 {
    row.try_get::<i32, usize>(index)
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .unwrap_or_else(|| panic!("{what} is NULL"))
}
