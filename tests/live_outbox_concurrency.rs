//! Live concurrency tests of outbox-mode feeds (ARCHITECTURE.md, "read_feed"): writers and readers
//! on their own connections, slow and abandoned writers, readers racing for the shard lock,
//! the reader and writer roles with real logins, and concurrent `setup_feed`.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with
//! `cargo test --test live_outbox_concurrency -- --ignored`.
//! Every scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database
//! of its own. Every task, every wait and every loop is bounded, so a stuck reader or a
//! writer that blocks a reader fails the test with a message instead of hanging it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::{Client, Cursor, Feed, FeedRow, Page, ReadOptions, read_page};
use common::events::commit_retrying;
use common::load::{
    Load, MAX_TRANSIENT_RETRIES, TASK_LIMIT, WriterKey, check_stored, keys, load_feed, load_test,
    ulid_of, write_and_read,
};
use common::logins::{Login, deletes_from, selects_from};
use common::tasks::{await_none_left, bounded, close, expect_denied, join, spawn_bounded};
use common::{TestDb, exec, rows, scalar_i64, setup_outbox_feed};
use tokio::sync::Barrier;
use ulid::Ulid;

/// A single call that must not wait for anybody (a read next to an open writer transaction,
/// a status query) gets this long before the test declares it blocked. The open transactions
/// these calls run next to never end by themselves, so a blocked call would wait forever.
const NOT_BLOCKED_LIMIT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------------
// 1. The load matrix
// ------------------------------------------------------------------------------------------

load_test!(load_10_writers_5_readers_100_events_on_1_and_4_shards: "load_10x5x100" => Load::new(10, 5, 100), run_load);
load_test!(load_1_writer_20_readers_1000_events_on_1_and_4_shards: "load_1x20x1000" => Load::new(1, 20, 1000), run_load);
load_test!(load_10_writers_10_readers_200_events_on_1_and_4_shards: "load_10x10x200" => Load::new(10, 10, 200), run_load);

/// W writers commit N events each (one transaction per event, each writer waiting for its
/// previous commit, so the ordering contract applies to a writer's own events) while R
/// readers, each an independent consumer with its own cursors, read the feed from the start.
///
/// Writer w writes to shard `w % shards`. Every reader reads *all* shards round-robin, one
/// page per shard per turn, instead of one reader group per shard: every reader is then a
/// complete consumer of the feed whose whole view can be compared with every other reader's,
/// and each shard's lock is contended by all R readers at once (R racers per shard rather
/// than R/4). With one writer and 4 shards, shards 1-3 stay empty: readers keep polling
/// empty shards between pages of the busy one, which must cost them nothing.
async fn run_load(db: &TestDb, load: Load, shards: i32) {
    let (mut admin, run) = load_feed(db, load, "load", shards, create_writer_feed).await;
    let (table, feed) = (&run.table, &run.feed);
    // Each writer commits its events one by one, each with its outbox row in one transaction.
    let (_, reference) = write_and_read(
        db,
        &run,
        move |mut client, database, feed, shard, writer| async move {
            for seq in 0..load.events_per_writer as i32 {
                // A transient failure (deadlock victim, lock timeout, dropped connection)
                // is retried, after checking whether the commit made it; retrying the same
                // event before the next keeps the writer's commit order.
                let committed = format!(
                    "select count_big(*) from {} where writer = {writer} and seq = {seq};",
                    feed.quoted_table()
                );
                commit_retrying(
                    &mut client,
                    &database,
                    &format!("writer {writer}, event {seq}"),
                    MAX_TRANSIENT_RETRIES,
                    &committed,
                    |client| {
                        let feed = feed.clone();
                        Box::pin(
                            async move { commit_event(client, &feed, shard, writer, seq).await },
                        )
                    },
                )
                .await
                .map_err(|error| format!("commit of event ({writer}, {seq}) failed: {error}"))?;
            }
            Ok(())
        },
    )
    .await;

    // The server agrees: the feed holds exactly what the readers saw, the outbox is empty.
    check_stored(
        &mut admin,
        table,
        "the feed table",
        &format!(
            "select shard_id, ulid, writer, seq from {} order by shard_id, ulid;",
            feed.object("feed")
        ),
        &reference,
        load.events(),
    )
    .await;
    let left = count_rows(&mut admin, &feed.outbox_table(), None).await;
    assert_eq!(
        left, 0,
        "{table}: {left} outbox rows were never moved although every event was read"
    );
}

// ------------------------------------------------------------------------------------------
// 2. A slow writer does not delay the readers of its shard
// ------------------------------------------------------------------------------------------

common::live_test!(slow_uncommitted_writer_does_not_delay_readers_of_its_shard: "slow_writer" => slow_writer_scenario);

async fn slow_writer_scenario(db: &TestDb) {
    const SHARD: i32 = 1;
    const HOLD: Duration = Duration::from_secs(5);
    const LATENCY: Duration = Duration::from_secs(1);
    let options = ReadOptions::default().page_size(100).wait_ms(0);
    let mut admin = db.client().await;
    let feed = create_writer_feed(&mut admin, "slow_writer").await;
    let mut writer_a = db.client().await;
    let mut writer_b = db.client().await;
    let mut reader = ShardReader {
        client: db.client().await,
        feed: feed.clone(),
        shard: SHARD,
        options,
    };
    // Warm up the reader's connection and read_feed's plan on another shard, so the timed
    // call below measures waiting, not the first compilation.
    read_page::<WriterKey>(&mut reader.client, &feed, 0, Cursor::START, options)
        .await
        .expect("warm-up read of an empty shard");

    // A takes its order_sequence first, so its row is ahead of B's in the outbox, and
    // keeps its transaction open.
    exec(&mut writer_a, &open_writer_transaction(&feed, SHARD, 1, 1))
        .await
        .expect("writer A inserts its event and outbox row");
    let a_began = Instant::now();
    assert_eq!(
        scalar_i64(&mut writer_a, "select @@trancount;").await,
        1,
        "writer A's transaction must stay open between batches"
    );
    let what = "writer B's commit next to A's open transaction";
    commit_unblocked(&mut writer_b, &feed, (SHARD, 2, 1), what).await;

    let what = format!(
        "{:?}: the read next to writer A's open transaction (it must return B's committed row \
         and not A's uncommitted one)",
        db.isolation
    );
    let page = reader
        .read_within(Cursor::START, LATENCY, &[(2, 1)], &what)
        .await;
    let b_ulid = page.rows[0].ulid;

    // Until A commits, no read returns its row, and none waits for it.
    let mut polls = 0;
    while a_began.elapsed() < HOLD {
        for cursor in [Cursor::START, page.next_cursor] {
            let wanted = if cursor == Cursor::START {
                vec![(2, 1)]
            } else {
                Vec::new()
            };
            let what = format!(
                "{:?}: a read from {cursor} while writer A holds its row",
                db.isolation
            );
            reader.read_within(cursor, LATENCY, &wanted, &what).await;
        }
        polls += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(polls > 0);
    assert_eq!(
        scalar_i64(&mut writer_a, "select @@trancount;").await,
        1,
        "writer A's transaction must still be open after {HOLD:?}"
    );

    exec(&mut writer_a, "commit transaction;")
        .await
        .expect("writer A commits");
    let (after, _) = reader
        .read_unblocked(page.next_cursor, "the read after writer A committed")
        .await;
    assert_eq!(
        keys(&after),
        vec![(1, 1)],
        "{:?}: after A commits, the next read returns A's row",
        db.isolation
    );
    assert!(
        after.rows[0].ulid > b_ulid,
        "{:?}: A's row got ulid {} which is not above B's {b_ulid}; a row moved later must \
         come later in the shard",
        db.isolation,
        after.rows[0].ulid
    );
    let replay = reader
        .read(Cursor::START)
        .await
        .expect("replay from the start");
    assert_eq!(keys(&replay), vec![(2, 1), (1, 1)]);
}

// ------------------------------------------------------------------------------------------
// 3. An abandoned writer never blocks readers and leaves no trace
// ------------------------------------------------------------------------------------------

common::live_test!(abandoned_writer_never_blocks_readers_and_leaves_no_trace: "abandoned" => abandoned_writer_scenario);

async fn abandoned_writer_scenario(db: &TestDb) {
    const SHARD: i32 = 0;
    let options = ReadOptions::default().page_size(100).wait_ms(0);
    let mut admin = db.client().await;
    let feed = create_writer_feed(&mut admin, "abandoned").await;

    // Writer 1 will vanish with its transaction open; writer 2 will roll back explicitly.
    let mut vanishing = db.client().await;
    exec(&mut vanishing, &open_writer_transaction(&feed, SHARD, 1, 1))
        .await
        .expect("the vanishing writer inserts");
    let mut rolling_back = db.client().await;
    exec(
        &mut rolling_back,
        &open_writer_transaction(&feed, SHARD, 2, 1),
    )
    .await
    .expect("the rolling-back writer inserts");

    // A committed writer is not blocked by either, nor is a reader.
    let mut committer = db.client().await;
    for seq in 1..=3 {
        let what = "writer 3's commit next to abandoned transactions";
        commit_unblocked(&mut committer, &feed, (SHARD, 3, seq), what).await;
    }
    let mut reader = ShardReader {
        client: db.client().await,
        feed: feed.clone(),
        shard: SHARD,
        options,
    };
    let (page, _) = reader
        .read_unblocked(Cursor::START, "a read next to abandoned transactions")
        .await;
    assert_eq!(
        keys(&page),
        vec![(3, 1), (3, 2), (3, 3)],
        "{:?}: readers get the committed rows and skip the open ones",
        db.isolation
    );
    // The dashboard does not wait for the open writers either, and counts committed rows.
    let depth = bounded(
        "feed_status next to abandoned transactions",
        NOT_BLOCKED_LIMIT,
        scalar_i64(
            &mut admin,
            "select isnull(sum(outbox_depth), 0) from changefeed.feed_status \
             where feed = N'dbo.abandoned';",
        ),
    )
    .await;
    assert_eq!(depth, 0, "feed_status counts committed outbox rows only");

    // Abandon: one rolls back, the other's connection is dropped without a commit, which
    // makes SQL Server roll its transaction back when it notices the closed socket.
    exec(&mut rolling_back, "rollback transaction;")
        .await
        .expect("rollback");
    drop(vanishing);

    // Bounded wait for the server to finish the dropped session's rollback. NOLOCK sees
    // uncommitted rows, so it tells when they are really gone.
    await_none_left(
        &mut admin,
        &format!(
            "select (select count_big(*) from {} with (nolock) where writer in (1, 2)) \
             + (select count_big(*) from {} with (nolock) where writer in (1, 2));",
            feed.outbox_table(),
            feed.quoted_table()
        ),
        Duration::from_secs(60),
        "the abandoned writers' rows, their connection dropped / rolled back",
    )
    .await;

    // No trace: not in the event table, the outbox, the feed, nor any read.
    let abandoned = Some("writer in (1, 2)");
    let events = count_rows(&mut admin, &feed.quoted_table(), abandoned).await;
    assert_eq!(events, 0, "rolled-back events are gone");
    let outbox = count_rows(&mut admin, &feed.outbox_table(), None).await;
    assert_eq!(outbox, 0, "the outbox is empty after the rollbacks");
    let in_feed = count_rows(&mut admin, &feed.object("feed"), abandoned).await;
    assert_eq!(in_feed, 0, "no rolled-back key reached the feed");
    let nothing = reader
        .read(page.next_cursor)
        .await
        .expect("read after the rollbacks");
    assert_eq!(keys(&nothing), Vec::<WriterKey>::new());

    // The shard goes on: a later commit is read after the earlier ones.
    commit_event(&mut committer, &feed, SHARD, 3, 4)
        .await
        .expect("a commit after the rollbacks");
    let next = reader
        .read(page.next_cursor)
        .await
        .expect("read the later commit");
    assert_eq!(keys(&next), vec![(3, 4)]);
    assert!(next.rows[0].ulid > page.rows[2].ulid);
    let replay = reader.read(Cursor::START).await.expect("replay");
    assert_eq!(keys(&replay), vec![(3, 1), (3, 2), (3, 3), (3, 4)]);
}

// ------------------------------------------------------------------------------------------
// 4. Two readers racing at the head both get the rows
// ------------------------------------------------------------------------------------------

common::live_test!(readers_racing_at_the_head_both_return_the_rows: "head_race" => head_race_scenario);

async fn head_race_scenario(db: &TestDb) {
    const ROUNDS: i32 = 20;
    const EVENTS: i32 = 200;
    let options = ReadOptions::default().page_size(1000).wait_ms(0);
    let mut admin = db.client().await;
    let feed = create_feed(
        &mut admin,
        "head_race",
        "lap int not null, n int not null",
        "lap, n",
    )
    .await;
    let mut racers = [Some(db.client().await), Some(db.client().await)];
    let mut cursor = Cursor::START;

    for round in 0..ROUNDS {
        // K events, each committed in its own transaction, before the race starts.
        exec(
            &mut admin,
            &format!(
                "set xact_abort on; declare @n int = 0; \
                 while @n < {EVENTS} begin \
                   begin transaction; \
                   insert into {table} (lap, n) values ({round}, @n); \
                   insert into {outbox} (shard_id, lap, n) values (0, {round}, @n); \
                   commit transaction; \
                   set @n += 1; \
                 end;",
                table = feed.quoted_table(),
                outbox = feed.outbox_table(),
            ),
        )
        .await
        .expect("commit the round's events");

        // Both start together at the barrier. The lost race has more than one window (the
        // loser may reach the lock while the winner holds it, or check the outbox while the
        // winner is moving it), so in most rounds one racer starts a little later after the
        // barrier, sweeping 0-5.4 ms in 0.6 ms steps; rounds 0 and 10 start at once.
        let delayed = (round % 2) as usize;
        let offset = Duration::from_micros((round as u64 % 10) * 600);
        let name = |racer| format!("round {round}: racer {racer}");
        let pages = race(&mut racers, name, |racer, mut client| {
            let feed = feed.clone();
            async move {
                if racer == delayed && !offset.is_zero() {
                    // tokio's timer ticks in milliseconds; spin for sub-ms offsets.
                    let until = Instant::now() + offset;
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                }
                let page = read_page::<(i32, i32)>(&mut client, &feed, 0, cursor, options)
                    .await
                    .map_err(|error| format!("read_page: {error}"))?;
                Ok((client, page))
            }
        })
        .await;

        let wanted: Vec<(i32, i32)> = (0..EVENTS).map(|n| (round, n)).collect();
        for (racer, page) in pages.iter().enumerate() {
            let mut got = keys(page);
            let in_order = page.rows.windows(2).all(|pair| pair[0].ulid < pair[1].ulid);
            got.sort_unstable();
            assert!(
                got == wanted,
                "{:?}, round {round}: racer {racer} (the delayed one: {}, offset {offset:?}) \
                 returned {} rows instead of the {EVENTS} committed before it started; the \
                 loser of the race at the head must return the winner's rows, never an \
                 empty or short page",
                db.isolation,
                racer == delayed,
                page.rows.len()
            );
            assert!(
                in_order,
                "round {round}: racer {racer}'s page is not in ulid order"
            );
        }
        assert_eq!(
            pages[0], pages[1],
            "round {round}: both racers read from the same cursor and must get the same page"
        );
        let left = count_rows(&mut admin, &feed.outbox_table(), None).await;
        assert_eq!(left, 0, "round {round}: the outbox was not emptied");
        assert!(pages[0].next_cursor > cursor);
        cursor = pages[0].next_cursor;
    }
}

// ------------------------------------------------------------------------------------------
// 5. Roles with real logins
// ------------------------------------------------------------------------------------------

common::live_test!(reader_and_writer_roles_with_real_logins: "roles" => with_logins("reader", "writer") roles_scenario);

async fn roles_scenario(db: &TestDb, [reader_login, writer_login]: &[Login; 2]) {
    let mut admin = db.client().await;
    let feed = create_id_feed(&mut admin, "role_events", Some("nvarchar(100) not null")).await;
    reader_login
        .create(&mut admin, &[feed.readers_role()], &[])
        .await;
    // The event table is the application's own: it grants its writers INSERT on it, so that
    // they can write the event and its outbox row in one transaction. changefeed grants
    // only the outbox.
    writer_login
        .create(
            &mut admin,
            &[feed.writers_role()],
            &[format!("grant insert on {} to", feed.quoted_table())],
        )
        .await;

    let mut reader = reader_login.connect(db).await;
    let mut writer = writer_login.connect(db).await;
    for (login, client, role) in [
        (reader_login, &mut reader, feed.readers_role()),
        (writer_login, &mut writer, feed.writers_role()),
    ] {
        let identity = rows(
            client,
            &format!(
                "select suser_sname(), db_name(), is_member(N'{}');",
                role.trim_start_matches('[').trim_end_matches(']')
            ),
        )
        .await
        .expect("who am I");
        let row = &identity[0];
        assert_eq!(row.get::<&str, _>(0), Some(login.name.as_str()));
        assert_eq!(row.get::<&str, _>(1), Some(db.name.as_str()));
        assert_eq!(
            row.get::<i32, _>(2),
            Some(1),
            "{} is a member of {role}",
            login.name
        );
    }

    // Writer: event + outbox row in one transaction; order_sequence is an IDENTITY the
    // writer cannot choose (issue 10, B8): an explicit value is refused (544), and turning
    // IDENTITY_INSERT on needs ALTER on the outbox, which the writers role does not have.
    let explicit = exec(
        &mut writer,
        &format!(
            "insert into {} (shard_id, order_sequence, id) values (0, 1000000, 1);",
            feed.outbox_table()
        ),
    )
    .await;
    assert_eq!(
        explicit
            .as_ref()
            .err()
            .and_then(changefeed::Error::server_number),
        Some(544),
        "a writer's explicit order_sequence must be refused: {explicit:?}"
    );
    let identity_insert = exec(
        &mut writer,
        &format!("set identity_insert {} on;", feed.outbox_table()),
    )
    .await;
    assert!(
        identity_insert.is_err(),
        "a writer must not be able to turn IDENTITY_INSERT on for the outbox"
    );
    for (id, payload, shard) in [(1, "one", None), (2, "two", None), (3, "three", Some(0))] {
        let outbox_insert = match shard {
            None => format!("insert into {} (id) values ({id});", feed.outbox_table()),
            Some(shard) => format!(
                "insert into {} (shard_id, id) values ({shard}, {id});",
                feed.outbox_table()
            ),
        };
        exec(
            &mut writer,
            &format!(
                "set xact_abort on; begin transaction; \
                 insert into {} (id, payload) values ({id}, N'{payload}'); {outbox_insert} \
                 commit transaction;",
                feed.quoted_table()
            ),
        )
        .await
        .unwrap_or_else(|error| {
            panic!("a member of the writers role must be able to insert into the outbox: {error}")
        });
    }

    // Writer: no reading.
    match read_page::<i32>(&mut writer, &feed, 0, Cursor::START, ReadOptions::default()).await {
        Ok(page) => panic!(
            "the writer login executed read_feed (got {} rows); writers must not read",
            page.rows.len()
        ),
        Err(error) => assert_eq!(
            error.server_number(),
            Some(229),
            "exec read_feed as a writer must fail with 229 (EXECUTE denied), got {error}"
        ),
    }
    for (sql, what) in [
        selects_from(&feed, "writer", "outbox"),
        selects_from(&feed, "writer", "feed"),
        selects_from(&feed, "writer", "state"),
        deletes_from(&feed, "writer", "outbox"),
        (
            format!(
                "update {} set time_hint = sysutcdatetime();",
                feed.outbox_table()
            ),
            "writer updates the outbox".to_owned(),
        ),
    ] {
        expect_denied(&mut writer, &sql, &what).await;
    }

    // Reader: read_page works, and moves the outbox through ownership chaining (it is the
    // first reader of the feed).
    let page = read_page::<i32>(&mut reader, &feed, 0, Cursor::START, ReadOptions::default())
        .await
        .unwrap_or_else(|error| {
            panic!("a member of the readers role must be able to read the feed: {error}")
        });
    assert_eq!(
        page.rows.iter().map(|row| row.key).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "the reader login reads every committed event"
    );
    // @with_event = 1 joins the event table, which the reader cannot select from directly.
    let with_event = read_with_event(&mut reader, &feed, Cursor::START).await;
    assert_eq!(
        with_event,
        vec![
            (page.rows[0].ulid, 1, "one".to_owned()),
            (page.rows[1].ulid, 2, "two".to_owned()),
            (page.rows[2].ulid, 3, "three".to_owned()),
        ],
        "read_feed @with_event = 1 as the reader login"
    );

    // Reader: nothing else.
    let zero_ulid = "0x00000000000000000000000000000000";
    for (sql, what) in [
        selects_from(&feed, "reader", "outbox"),
        selects_from(&feed, "reader", "feed"),
        selects_from(&feed, "reader", "state"),
        (
            format!("insert into {} (id) values (99);", feed.outbox_table()),
            "reader inserts into the outbox".to_owned(),
        ),
        deletes_from(&feed, "reader", "outbox"),
        (
            format!(
                "insert into {} (shard_id, ulid, id) values (0, {zero_ulid}, 99);",
                feed.object("feed")
            ),
            "reader inserts into the feed".to_owned(),
        ),
        deletes_from(&feed, "reader", "feed"),
        (
            format!("update {} set next_counter = 0;", feed.object("state")),
            "reader updates the state".to_owned(),
        ),
        deletes_from(&feed, "reader", "state"),
        selects_from(&feed, "reader", "event table"),
        (
            setup_outbox_feed("dbo.role_events"),
            "reader calls setup_feed".to_owned(),
        ),
    ] {
        expect_denied(&mut reader, &sql, &what).await;
    }

    // None of the refused statements changed anything.
    let state = rows(
        &mut admin,
        &format!(
            "select (select count_big(*) from {}), (select count_big(*) from {}), \
                    (select count_big(*) from {}), (select count_big(*) from {});",
            feed.outbox_table(),
            feed.object("feed"),
            feed.object("state"),
            feed.quoted_table()
        ),
    )
    .await
    .expect("count the feed's tables");
    let counts: Vec<i64> = (0..4)
        .map(|i| state[0].get::<i64, _>(i).expect("count"))
        .collect();
    assert_eq!(
        counts,
        vec![0, 3, 1, 3],
        "outbox, feed, state and event rows after the refused statements"
    );

    close(reader).await;
    close(writer).await;
}

/// `read_feed @with_event = 1`, which `read_page` does not offer: (ulid, id, payload) rows.
async fn read_with_event(
    client: &mut Client,
    feed: &Feed,
    cursor: Cursor,
) -> Vec<(Ulid, i32, String)> {
    let sql = format!(
        "exec {} @shard_id = @P1, @cursor = @P2, @page_size = @P3, @wait_ms = 0, @with_event = 1",
        feed.read_feed_procedure()
    );
    let cursor_bytes = cursor.to_bytes();
    let result = client
        .query(sql, &[&0i32, &&cursor_bytes[..], &100i32])
        .await
        .unwrap_or_else(|error| panic!("read_feed @with_event = 1 as a reader: {error}"))
        .into_first_result()
        .await
        .unwrap_or_else(|error| panic!("read_feed @with_event = 1 as a reader: {error}"));
    result
        .iter()
        .map(|row| {
            (
                ulid_of(row.get::<&[u8], _>(0).expect("ulid")),
                row.get::<i32, _>(1).expect("id"),
                row.get::<&str, _>(2).expect("payload").to_owned(),
            )
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// 5b. A reader login takes the same shard lock as every other reader
// ------------------------------------------------------------------------------------------

common::live_test!(
    /// read_feed names its shard lock after `object_id(N'[changefeed].[feed:...]')`. Inside a
    /// procedure, metadata functions answer with the *caller's* permissions, not the owner's
    /// (ownership chaining does not extend to metadata visibility), and a member of the readers
    /// role has no permission on the feed table. If `object_id` answers NULL for it, its lock is
    /// `changefeed::<shard>` instead of `changefeed:<id>:<shard>`: it moves the outbox while a
    /// dbo reader holds the shard's lock, and the "a lost race returns the winner's rows"
    /// guarantee no longer holds between such readers and others. This test holds the shard
    /// lock by the name read_feed is meant to use, first shows that a dbo reader waits for it
    /// (so the name is right), then requires the same of a reader login.
    reader_login_waits_for_the_same_shard_lock_as_other_readers: "shard_lock" => with_logins("lockreader") shard_lock_scenario
);

async fn shard_lock_scenario(db: &TestDb, [reader_login]: &[Login; 1]) {
    // Far below read_feed's 10 s lock timeout, far above a read that does not wait.
    const HOLD: Duration = Duration::from_secs(2);
    let mut admin = db.client().await;
    let feed = create_id_feed(&mut admin, "lock_events", Some("nvarchar(50) null")).await;
    reader_login
        .create(&mut admin, &[feed.readers_role()], &[])
        .await;
    let mut holder = db.client().await;

    let mut cursor = Cursor::START;
    for (phase, ids) in [("dbo reader", [1, 2, 3]), ("reader login", [4, 5, 6])] {
        for id in ids {
            commit_id_event(&mut admin, &feed, id).await;
        }
        let lock = rows(
            &mut holder,
            &format!(
                "begin transaction; \
                 declare @resource nvarchar(255) = concat(N'changefeed:', object_id(N'{}'), N':', 0); \
                 declare @result int; \
                 exec @result = sys.sp_getapplock @Resource = @resource, \
                     @LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = 0; \
                 select @result;",
                feed.object("feed")
            ),
        )
        .await
        .expect("take the shard lock");
        assert_eq!(lock[0].get::<i32, _>(0), Some(0), "the shard lock was free");

        let mut client = if phase == "dbo reader" {
            db.client().await
        } else {
            reader_login.connect(db).await
        };
        let feed_for_read = feed.clone();
        let read = spawn_bounded(format!("{phase}: read"), TASK_LIMIT, async move {
            let page = read_page::<i32>(
                &mut client,
                &feed_for_read,
                0,
                cursor,
                ReadOptions::default(),
            )
            .await
            .map_err(|error| format!("read_page: {error}"))?;
            Ok((client, page))
        });
        tokio::time::sleep(HOLD).await;
        let waited = !read.is_finished();
        exec(&mut holder, "commit transaction;")
            .await
            .expect("release the shard lock");
        let (client, page) = join(read).await;
        assert_eq!(
            page.rows.iter().map(|row| row.key).collect::<Vec<_>>(),
            ids.to_vec(),
            "{phase}: the read returns the committed events once the lock is free"
        );
        if phase == "dbo reader" {
            assert!(
                waited,
                "test precondition: a dbo reader did not wait for the lock named \
                 changefeed:<object_id of the feed table>:<shard>; read_feed no longer uses \
                 that name, so this test must follow it"
            );
            drop(client);
        } else {
            assert!(
                waited,
                "{:?}: a member of {} moved the outbox while the shard lock \
                 changefeed:<feed object_id>:0 was held: read_feed computes its lock name \
                 with object_id() on the feed table, which answers NULL for a caller without \
                 permission on it (metadata visibility is not covered by ownership \
                 chaining), so reader logins lock 'changefeed::0', shared by every feed and \
                 distinct from dbo's lock",
                db.isolation,
                feed.readers_role()
            );
            close(client).await;
        }
        cursor = page.next_cursor;
    }
}

// ------------------------------------------------------------------------------------------
// 6. Concurrent setup_feed
// ------------------------------------------------------------------------------------------

common::live_test!(concurrent_setup_feed_creates_exactly_one_feed: "setup_race" => setup_race_scenario);

async fn setup_race_scenario(db: &TestDb) {
    const ROUNDS: usize = 4;
    const RACERS: usize = 2;
    let mut admin = db.client().await;
    let mut racers: Vec<Option<Client>> = Vec::new();
    for _ in 0..RACERS {
        racers.push(Some(db.client().await));
    }

    for round in 0..ROUNDS {
        let table = format!("setup_race_{round}");
        exec(
            &mut admin,
            &format!(
                "create table [dbo].[{table}] (id int not null, payload nvarchar(50) null, \
                 constraint [pk_{table}] primary key clustered (id));"
            ),
        )
        .await
        .expect("create the event table");
        let feed = Feed::new("dbo", &table).expect("a valid feed name");

        let tables = vec![table.clone(); RACERS];
        let mut succeeded = 0;
        for (racer, (outcome, open)) in race_setup_feed(&mut racers, &tables)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                open, 0,
                "{table}: racer {racer}'s setup_feed left a transaction open"
            );
            match outcome {
                Ok(()) => succeeded += 1,
                Err(error) => {
                    // "Fails cleanly": a server error, rolled back, connection usable.
                    assert!(
                        error.server_number().is_some(),
                        "{table}: racer {racer} failed without a server error: {error}"
                    );
                    eprintln!("-- {table}: racer {racer} failed cleanly: {error}");
                }
            }
        }
        assert!(
            succeeded >= 1,
            "{table}: no concurrent setup_feed succeeded"
        );

        check_one_feed(&mut admin, &feed).await;
        // A later call is a no-op, and leaves the same single feed.
        exec(&mut admin, &setup_outbox_feed(&format!("dbo.{table}")))
            .await
            .expect("setup_feed again is idempotent");
        check_one_feed(&mut admin, &feed).await;

        // And the feed works, and appears once in feed_status.
        commit_id_event(&mut admin, &feed, 1).await;
        let page = read_page::<i32>(&mut admin, &feed, 0, Cursor::START, ReadOptions::default())
            .await
            .expect("read the raced feed");
        assert_eq!(
            page.rows.iter().map(|row| row.key).collect::<Vec<_>>(),
            vec![1]
        );
        let status_rows = scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from changefeed.feed_status where feed = N'dbo.{table}';"
            ),
        )
        .await;
        assert_eq!(
            status_rows, 1,
            "{table}: feed_status must list the feed's one shard once"
        );
    }
}

/// Exactly one registry row and one complete set of per-feed objects, roles and grants.
async fn check_one_feed(admin: &mut Client, feed: &Feed) {
    let (schema, table) = (feed.schema(), feed.table());
    // Each count, what it must be, and what it counts.
    let checks = [
        (
            format!(
                "select count_big(*) from changefeed.feeds \
                 where schema_name = N'{schema}' and table_name = N'{table}';"
            ),
            1,
            "registry rows",
        ),
        (
            format!(
                "select count_big(*) from sys.objects \
                 where schema_id = schema_id(N'changefeed') and name in ( \
                   N'read_feed:{feed}', N'status:{feed}', N'feed:{feed}', N'outbox:{feed}', \
                   N'state:{feed}');"
            ),
            5,
            "read_feed, status, feed, outbox, state",
        ),
        (
            format!(
                "select count_big(*) from sys.types \
                 where is_user_defined = 1 and name = N'type:read:{feed}';"
            ),
            1,
            "the read type",
        ),
        (
            format!(
                "select count_big(*) from sys.database_principals where type = 'R' and name in \
                 (N'changefeed.writers:{feed}', N'changefeed.readers:{feed}');"
            ),
            2,
            "the writers and readers roles",
        ),
        (
            format!(
                "select count_big(*) from sys.database_permissions \
                 where state = 'G' and grantee_principal_id in ( \
                   database_principal_id(N'changefeed.writers:{feed}'), \
                   database_principal_id(N'changefeed.readers:{feed}'));"
            ),
            3,
            "INSERT on the outbox, EXECUTE on read_feed and on the read type",
        ),
        (
            format!(
                "select count_big(*) from changefeed.feed_objects(N'{schema}', N'{table}') as o \
                 where case o.object_class \
                         when 'TT' then type_id(o.quoted_name) \
                         when 'R' then database_principal_id(o.object_name) \
                         else object_id(o.quoted_name) \
                       end is null;"
            ),
            0,
            "a per-feed object of feed_objects is missing",
        ),
    ];
    for (sql, expected, what) in checks {
        assert_eq!(scalar_i64(admin, &sql).await, expected, "{feed}: {what}");
    }
}

common::live_test!(concurrent_setup_feed_of_different_tables_keeps_every_feed_in_feed_status: "setup_pairs" => setup_pairs_scenario);

/// setup_feed for two *different* tables at once. Each call ends by rebuilding
/// changefeed.feed_status from the registry (refresh_feed_status); a call that reads the
/// registry while the other's row is not yet committed must neither drop the other's feed
/// from feed_status (the last rebuild wins) nor deadlock on it. A call may still fail
/// cleanly (a server error, nothing left open); it is then retried alone, as a migration
/// tool would. Afterwards every registered feed is in feed_status.
async fn setup_pairs_scenario(db: &TestDb) {
    const ROUNDS: usize = 6;
    let mut admin = db.client().await;
    // Feeds that exist already: with registry keys spread out, the racers' key-range locks
    // on changefeed.feeds (setup_feed's UPDLOCK, HOLDLOCK probe) may fall into different
    // ranges and stop serializing the two calls.
    for spread in 0..4 {
        create_id_feed(&mut admin, &format!("spread_{spread}"), None).await;
    }
    let mut racers = [Some(db.client().await), Some(db.client().await)];

    for round in 0..ROUNDS {
        let tables = [format!("pair_{round}_a"), format!("pair_{round}_b")];
        for table in &tables {
            exec(
                &mut admin,
                &format!(
                    "create table [dbo].[{table}] (id int not null, \
                     constraint [pk_{table}] primary key clustered (id));"
                ),
            )
            .await
            .expect("create the event table");
        }
        for (racer, (outcome, open)) in race_setup_feed(&mut racers, &tables)
            .await
            .into_iter()
            .enumerate()
        {
            let table = &tables[racer];
            assert_eq!(open, 0, "{table}: setup_feed left a transaction open");
            if let Err(error) = outcome {
                assert!(
                    error.server_number().is_some(),
                    "{table}: setup_feed failed without a server error: {error}"
                );
                eprintln!("-- {table}: setup_feed failed cleanly, retrying alone: {error}");
                exec(&mut admin, &setup_outbox_feed(&format!("dbo.{table}")))
                    .await
                    .unwrap_or_else(|error| panic!("{table}: setup_feed retried alone: {error}"));
            }
        }
    }

    let registered = common::registered_feeds(&mut admin).await;
    assert_eq!(registered, (4 + 2 * ROUNDS) as i64, "registered feeds");
    let missing = rows(
        &mut admin,
        "select f.schema_name + N'.' + f.table_name from changefeed.feeds as f \
         where charindex(N'[status:' + f.schema_name + N'.' + f.table_name + N']', \
                         object_definition(object_id(N'changefeed.feed_status'))) = 0 \
         order by f.feed_id;",
    )
    .await
    .expect("compare feed_status with the registry");
    let missing: Vec<String> = missing
        .iter()
        .map(|row| row.get::<&str, _>(0).unwrap_or("?").to_owned())
        .collect();
    assert!(
        missing.is_empty(),
        "{:?}: registered feeds missing from changefeed.feed_status: {missing:?}. \
         refresh_feed_status rebuilds the view from a registry read that does not see a \
         concurrent setup_feed's uncommitted row, and the last rebuild wins",
        db.isolation
    );
}

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// Creates the load and writer scenarios' feed `[dbo].[table]`: events keyed by
/// (writer, seq), with a payload.
async fn create_writer_feed(admin: &mut Client, table: &str) -> Feed {
    let columns = "writer int not null, seq int not null, payload nvarchar(50) null";
    create_feed(admin, table, columns, "writer, seq").await
}

/// `count_big(*)` of `table`, of the rows matching `condition` when there is one.
async fn count_rows(client: &mut Client, table: &str, condition: Option<&str>) -> i64 {
    let filter = condition.map_or_else(String::new, |condition| format!(" where {condition}"));
    scalar_i64(
        client,
        &format!("select count_big(*) from {table}{filter};"),
    )
    .await
}

/// A reader connection of one shard of a feed, always reading with the same options.
struct ShardReader {
    client: Client,
    feed: Feed,
    shard: i32,
    options: ReadOptions,
}

impl ShardReader {
    /// One `read_page` from `cursor`.
    async fn read(&mut self, cursor: Cursor) -> changefeed::Result<Page<FeedRow<WriterKey>>> {
        read_page::<WriterKey>(
            &mut self.client,
            &self.feed,
            self.shard,
            cursor,
            self.options,
        )
        .await
    }

    /// A read from `cursor` that must not wait for any open transaction: it fails the test,
    /// naming `what`, after [`NOT_BLOCKED_LIMIT`]. The page, and how long the read took.
    async fn read_unblocked(
        &mut self,
        cursor: Cursor,
        what: &str,
    ) -> (Page<FeedRow<WriterKey>>, Duration) {
        let started = Instant::now();
        let page = bounded(what, NOT_BLOCKED_LIMIT, self.read(cursor))
            .await
            .unwrap_or_else(|error| panic!("{what}: {error}"));
        (page, started.elapsed())
    }

    /// A read from `cursor` ([`Self::read_unblocked`]) that must return the rows `wanted`
    /// within `latency`, `what` says which read: an uncommitted writer must not delay the
    /// readers of its shard. The page.
    async fn read_within(
        &mut self,
        cursor: Cursor,
        latency: Duration,
        wanted: &[WriterKey],
        what: &str,
    ) -> Page<FeedRow<WriterKey>> {
        let (page, took) = self.read_unblocked(cursor, what).await;
        assert_eq!(keys(&page), wanted, "{what}: the rows it returned");
        assert!(
            took <= latency,
            "{what}: the read took {took:?}: an uncommitted writer must not delay the readers \
             of its shard (limit {latency:?})"
        );
        page
    }
}

/// [`commit_event`] of `event` (shard, writer, seq) that must not wait for any open
/// transaction: it fails the test, naming `what`, after [`NOT_BLOCKED_LIMIT`].
async fn commit_unblocked(client: &mut Client, feed: &Feed, event: (i32, i32, i32), what: &str) {
    let (shard, writer, seq) = event;
    bounded(
        what,
        NOT_BLOCKED_LIMIT,
        commit_event(client, feed, shard, writer, seq),
    )
    .await
    .unwrap_or_else(|error| panic!("{what}: {error}"));
}

/// Runs `task` once for each connection of `racers`, in tasks of their own released together
/// by a barrier (each named by `name`, bounded by [`TASK_LIMIT`]); each task hands its
/// connection back, and the connections go back into `racers`. The tasks' values, in racer
/// order.
async fn race<T, F, Fut>(
    racers: &mut [Option<Client>],
    name: impl Fn(usize) -> String,
    task: F,
) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, Client) -> Fut,
    Fut: Future<Output = Result<(Client, T), String>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(racers.len()));
    let mut handles = Vec::new();
    for (racer, slot) in racers.iter_mut().enumerate() {
        let run = task(racer, slot.take().expect("racer connection"));
        let barrier = barrier.clone();
        handles.push(spawn_bounded(name(racer), TASK_LIMIT, async move {
            barrier.wait().await;
            run.await
        }));
    }
    let mut values = Vec::new();
    for (racer, handle) in handles.into_iter().enumerate() {
        let (client, value) = join(handle).await;
        racers[racer] = Some(client);
        values.push(value);
    }
    values
}

/// Races `setup_feed` of `tables[racer]` (in `dbo`, outbox mode) on each connection of
/// `racers` ([`race`]): each call's outcome, and how many transactions it left open.
async fn race_setup_feed(
    racers: &mut [Option<Client>],
    tables: &[String],
) -> Vec<(changefeed::Result<()>, i64)> {
    let name = |racer| format!("{}: setup_feed racer {racer}", tables[racer]);
    race(racers, name, |racer, mut client| {
        let setup = setup_outbox_feed(&format!("dbo.{}", tables[racer]));
        async move {
            let outcome = exec(&mut client, &setup).await;
            let open = scalar_i64(&mut client, "select @@trancount;").await;
            Ok((client, (outcome, open)))
        }
    })
    .await
}

/// Creates `[dbo].[table]` and makes it an outbox-mode feed.
async fn create_feed(admin: &mut Client, table: &str, columns: &str, key: &str) -> Feed {
    exec(
        admin,
        &format!(
            "create table [dbo].[{table}] ({columns}, \
             constraint [pk_{table}] primary key clustered ({key}));"
        ),
    )
    .await
    .unwrap_or_else(|error| panic!("create table dbo.{table}: {error}"));
    exec(admin, &setup_outbox_feed(&format!("dbo.{table}")))
        .await
        .unwrap_or_else(|error| panic!("setup_feed dbo.{table}: {error}"));
    Feed::new("dbo", table).expect("a valid feed name")
}

/// Creates `[dbo].[table]` keyed by `id int` alone, with a column `payload` of the type
/// `payload` when there is one, and makes it an outbox-mode feed.
async fn create_id_feed(admin: &mut Client, table: &str, payload: Option<&str>) -> Feed {
    let columns = match payload {
        Some(payload) => format!("id int not null, payload {payload}"),
        None => "id int not null".to_owned(),
    };
    create_feed(admin, table, &columns, "id").await
}

/// Commits event `id` of a feed keyed by `id` alone, and its outbox row (the default shard),
/// in one transaction.
async fn commit_id_event(client: &mut Client, feed: &Feed, id: i32) {
    exec(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {} (id) values ({id}); insert into {} (id) values ({id}); \
             commit transaction;",
            feed.quoted_table(),
            feed.outbox_table()
        ),
    )
    .await
    .unwrap_or_else(|error| panic!("commit event {id} of {feed}: {error}"));
}

/// The batch that inserts event (writer, seq) and its outbox row and leaves the
/// transaction open.
fn open_writer_transaction(feed: &Feed, shard: i32, writer: i32, seq: i32) -> String {
    format!(
        "set xact_abort on; begin transaction; \
         insert into {} (writer, seq, payload) values ({writer}, {seq}, N'{writer}-{seq}'); \
         insert into {} (shard_id, writer, seq) values ({shard}, {writer}, {seq});",
        feed.quoted_table(),
        feed.outbox_table()
    )
}

/// Commits event (writer, seq) and its outbox row in one transaction, in one batch.
async fn commit_event(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    writer: i32,
    seq: i32,
) -> Result<(), changefeed::Error> {
    let batch = format!(
        "{} commit transaction;",
        open_writer_transaction(feed, shard, writer, seq)
    );
    exec(client, &batch).await
}
