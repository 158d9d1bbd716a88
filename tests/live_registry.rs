//! Live tests of the feed registry around the feeds themselves: setup, upgrade and teardown
//! under implicit transactions, feeds whose event table was dropped or re-created,
//! `feed_status` and `consumer_lag`, the consumers' cursors (`save_cursor`, `load_cursor`:
//! who may touch them, their length, the first-save race), and name checks. Issue 19: event
//! tables outside the bundle owner's ownership chain (item 1), views (item 12), and
//! `upgrade_feed` under the registry's spelling (item 6).
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_registry -- --ignored`. Scenarios where
//! locking matters run twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of
//! its own.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use changefeed::{Client, Cursor, CursorStore, Feed};
use common::events::{
    create_feed, exec_ok, hex, read_to_end, readable_in_both_modes, required, rows_ok,
    write_all_ok, write_ok,
};
use common::logins::{Login, drop_logins};
use common::tasks::{bounded, close, join, spawn_bounded};
use common::{Isolation, TestDb, exec, exec_failure, scalar_i64, setup_outbox_feed};
use tiberius::Row;
use ulid::Ulid;

/// `teardown_feed` of `table` (`schema.table`).
fn teardown_feed(table: &str) -> String {
    format!("exec changefeed.teardown_feed @table_name = N'{table}';")
}

/// Saves `cursor` for `consumer` on `shard` of `feed` as `client`, and loads it back, the same.
async fn assert_round_trip(
    client: &mut Client,
    consumer: &str,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
) {
    CursorStore::save(client, consumer, feed, shard, cursor)
        .await
        .unwrap_or_else(|error| panic!("{consumer} saves its cursor on {feed}: {error}"));
    let loaded = CursorStore::load(client, consumer, feed, shard)
        .await
        .unwrap_or_else(|error| panic!("{consumer} loads its cursor on {feed}: {error}"));
    assert_eq!(loaded, Some(cursor), "{consumer} on {feed}, shard {shard}");
}

/// The longest any one call or task may take before the test calls it stuck.
const LIMIT: Duration = Duration::from_secs(60);

async fn trancount(client: &mut Client) -> i64 {
    scalar_i64(client, "select @@trancount;").await
}

/// Creates `dbo.<table>` with a shard and a ULID column and makes it a serialized-writer feed.
async fn create_serialized_feed(admin: &mut Client, table: &str) -> Feed {
    exec_ok(
        admin,
        &format!(
            "create table [dbo].[{table}] (id bigint not null primary key, \
             Shard int not null, ULID binary(16) not null); \
             create unique index [ux_{table}] on [dbo].[{table}] (Shard, ULID); \
             exec changefeed.setup_feed @table_name = N'dbo.{table}', @serialize_writers = 1, \
             @shard_column = N'Shard', @ulid_column = N'ULID';"
        ),
    )
    .await;
    Feed::new("dbo", table).expect("a valid feed name")
}

fn save_sql(consumer: &str, feed: &str, shard: i32, cursor: &str) -> String {
    format!(
        "exec changefeed.save_cursor @consumer = N'{consumer}', @feed = N'{feed}', \
         @shard_id = {shard}, @cursor = {cursor};"
    )
}

/// The saved cursors of `feed`, by consumer (read as the admin, straight from the table).
async fn saved_cursors(client: &mut Client, feed: &str) -> BTreeMap<String, Vec<u8>> {
    rows_ok(
        client,
        &format!(
            "select consumer, [cursor] from changefeed.consumer_cursor where feed = N'{feed}';"
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            required::<&str>(row, "consumer").to_owned(),
            required::<&[u8]>(row, "cursor").to_vec(),
        )
    })
    .collect()
}

fn text(row: &Row, name: &str) -> Option<String> {
    row.try_get::<&str, &str>(name)
        .unwrap_or_else(|error| panic!("column {name}: {error}"))
        .map(str::to_owned)
}

// ------------------------------------------------------------------------------------------
// 1. Implicit transactions (issue 10, B3)
// ------------------------------------------------------------------------------------------

common::live_test!(registry_procedures_leave_no_transaction_open_under_implicit_transactions: "reg_implicit" => implicit_scenario);

/// A session with `SET IMPLICIT_TRANSACTIONS ON` (JDBC with autocommit off, pyodbc) calls
/// every registry procedure that commits its own work: after each, `@@trancount` is 0 again
/// (before the fix a `begin transaction` opened two levels and the `commit` left one open,
/// with the generators' applock and the schema locks held), and another session can set up a
/// feed at once. `save_cursor` and `load_cursor`, which open no transaction of their own,
/// join the client's implicit transaction: a rollback takes the save back.
async fn implicit_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    exec_ok(
        &mut admin,
        "create table [dbo].[imp_a] (id bigint not null primary key); \
         create table [dbo].[imp_b] (id bigint not null primary key); \
         create table [dbo].[imp_other] (id bigint not null primary key);",
    )
    .await;
    exec_ok(
        &mut admin,
        "create table [dbo].[imp_s] (id bigint not null primary key, \
         Shard int not null, ULID binary(16) not null); \
         create unique index ux_imp_s on [dbo].[imp_s] (Shard, ULID);",
    )
    .await;

    let mut client = db.client().await;
    exec_ok(&mut client, "set implicit_transactions on;").await;
    let calls = [
        "exec changefeed.setup_feed @table_name = N'dbo.imp_a', @outbox = 1;",
        "exec changefeed.setup_feed @table_name = N'dbo.imp_b', @outbox = 1;",
        "exec changefeed.setup_feed @table_name = N'dbo.imp_s', @serialize_writers = 1, \
         @shard_column = N'Shard', @ulid_column = N'ULID';",
        "exec changefeed.upgrade_feed @table_name = N'dbo.imp_a';",
        "exec changefeed.upgrade_all_feeds;",
        "exec changefeed.refresh_feed_status;",
        "exec changefeed.grant_feed_roles @schema_name = N'dbo', @table_name = N'imp_a';",
        "exec changefeed.copy_template \
         @template = N'[changefeed].[status:changefeed.__template__]', \
         @template_table = N'__template__', @schema_name = N'dbo', @table_name = N'imp_a', \
         @key_list = N'[id]', @key_join = N'e.[id] = r.[id]';",
        "exec changefeed.teardown_feed @table_name = N'dbo.imp_b';",
    ];
    for call in calls {
        bounded(call, LIMIT, exec_ok(&mut client, call)).await;
        assert_eq!(
            trancount(&mut client).await,
            0,
            "`{call}` left a transaction open under implicit transactions"
        );
        // Nothing of it is held: another session takes the generators' lock at once.
        bounded(
            "another session's refresh_feed_status",
            Duration::from_secs(10),
            exec_ok(&mut admin, "exec changefeed.refresh_feed_status;"),
        )
        .await;
    }
    bounded(
        "another session's setup_feed",
        Duration::from_secs(10),
        exec_ok(
            &mut admin,
            "exec changefeed.setup_feed @table_name = N'dbo.imp_other', @outbox = 1;",
        ),
    )
    .await;

    // save_cursor joins the client's implicit transaction instead of committing alone.
    let zero = hex(&[0; 16]);
    exec_ok(&mut client, &save_sql("implicit", "dbo.imp_a", 0, &zero)).await;
    assert_eq!(
        trancount(&mut client).await,
        1,
        "save_cursor's write belongs to the client's implicit transaction"
    );
    exec_ok(&mut client, "rollback transaction;").await;
    assert!(
        saved_cursors(&mut admin, "dbo.imp_a").await.is_empty(),
        "the rolled-back save is gone"
    );
    exec_ok(&mut client, &save_sql("implicit", "dbo.imp_a", 0, &zero)).await;
    exec_ok(&mut client, "commit transaction;").await;
    assert_eq!(
        saved_cursors(&mut admin, "dbo.imp_a").await.get("implicit"),
        Some(&vec![0; 16])
    );
    exec_ok(&mut client, "set implicit_transactions off;").await;
    close(client).await;
}

// ------------------------------------------------------------------------------------------
// 2. Far cursors (B9)
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking consumer_lag_shows_cursors_past_the_year_9999_instead_of_failing: "reg_far" => far_cursor_scenario);

/// The last millisecond `datetime2` holds: 9999-12-31T23:59:59.999Z.
const LAST_DATETIME2_MS: u64 = 253_402_300_799_999;

/// Four consumers of one feed: one at an event, one at the last millisecond `datetime2` can
/// hold, one a millisecond later, one at `Ulid::MAX`. `consumer_lag` (the query `changefeed
/// status --consumers` runs) returns all four: the cursor past 9999 has no `cursor_at`, a lag
/// of 0 (it is past the head) and is not expired; before the fix, `ulid_time` overflowed and
/// the whole view failed. `feed_status` is unaffected.
async fn far_cursor_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "far").await;
    let mut writer = db.client().await;
    write_all_ok(&mut writer, &feed, 0, 1..=3).await;
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");
    let reader = changefeed::reader::FeedReader::new(pool, feed.clone());
    let rows = read_to_end(&reader, 0, Cursor::START).await;
    assert_eq!(rows.len(), 3);

    let cursors = [
        ("at_event", Cursor::from_ulid(rows[0].ulid)),
        (
            "last_ms",
            Cursor::from_ulid(Ulid::from_parts(LAST_DATETIME2_MS, 0)),
        ),
        (
            "past_9999",
            Cursor::from_ulid(Ulid::from_parts(LAST_DATETIME2_MS + 1, 0)),
        ),
        ("max", Cursor::from_ulid(Ulid::from_bytes([0xFF; 16]))),
    ];
    for (consumer, cursor) in cursors {
        CursorStore::save(&mut admin, consumer, &feed, 0, cursor)
            .await
            .unwrap_or_else(|error| panic!("save {consumer}: {error}"));
    }

    let lag = rows_ok(
        &mut admin,
        "select consumer, feed, shard_id, [cursor], \
         convert(nvarchar(30), cursor_at, 126) as cursor_at_text, head_at, lag_ms, \
         not_yet_in_feed, expired, problem \
         from changefeed.consumer_lag order by feed, shard_id, consumer;",
    )
    .await;
    let by_consumer: BTreeMap<String, &Row> = lag
        .iter()
        .map(|row| (required::<&str>(row, "consumer").to_owned(), row))
        .collect();
    assert_eq!(by_consumer.len(), 4, "one row per saved cursor");
    let cursor_at = |consumer: &str| text(by_consumer[consumer], "cursor_at_text");
    let lag_ms = |consumer: &str| required::<i64>(by_consumer[consumer], "lag_ms");
    assert_eq!(
        cursor_at("last_ms").as_deref(),
        Some("9999-12-31T23:59:59.999")
    );
    assert_eq!(cursor_at("past_9999"), None, "not a datetime2: NULL");
    assert_eq!(cursor_at("max"), None, "not a datetime2: NULL");
    for consumer in ["last_ms", "past_9999", "max"] {
        assert_eq!(lag_ms(consumer), 0, "{consumer} is past the head");
        assert!(!required::<bool>(by_consumer[consumer], "expired"));
    }
    let head_ms = rows[2].ulid.timestamp_ms() as i64;
    let first_ms = rows[0].ulid.timestamp_ms() as i64;
    assert_eq!(lag_ms("at_event"), head_ms - first_ms);
    assert!(
        by_consumer
            .values()
            .all(|row| text(row, "problem").is_none()),
        "no feed has a problem"
    );
    let status = scalar_i64(
        &mut admin,
        "select count_big(*) from changefeed.feed_status where feed = N'dbo.far';",
    )
    .await;
    assert_eq!(status, 1);

    #[cfg(feature = "cli")]
    {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_changefeed"))
            .args(["status", "--consumers", "--url", &db.ado()])
            .output()
            .expect("the changefeed binary runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{output:?}");
        assert!(stdout.contains("past_9999"), "{stdout}");
        assert!(stdout.contains("max"), "{stdout}");
    }
}

// ------------------------------------------------------------------------------------------
// 3. One broken feed does not break the others (B10)
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking a_dropped_or_recreated_event_table_is_reported_and_the_other_feeds_carry_on: "reg_broken" => broken_feed_scenario);

/// Three feeds: `keep` (outbox mode, working), `ser` (serialized mode, its event table is
/// dropped) and `again` (outbox mode, its event table dropped and re-created). After
/// `refresh_feed_status`: `feed_status` shows `keep` as usual and one row for each broken
/// feed with a NULL shard and a problem naming `teardown_feed`; `consumer_lag` works and
/// shows the problem of `ser`'s consumer; `upgrade_all_feeds` upgrades `keep` and reports
/// the other two as skipped; `setup_feed` on the re-created table says to tear down first
/// (51001, not a duplicate key); tearing both down leaves `keep` alone and `again` can be
/// set up anew.
async fn broken_feed_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let keep = create_feed(&mut admin, "keep").await;
    let ser = create_serialized_feed(&mut admin, "ser").await;
    let again = create_feed(&mut admin, "again").await;
    let mut writer = db.client().await;
    write_ok(&mut writer, &keep, 0, 1, None).await;
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");
    let reader = changefeed::reader::FeedReader::new(pool, keep.clone());
    assert_eq!(read_to_end(&reader, 0, Cursor::START).await.len(), 1);
    CursorStore::save(&mut admin, "ser_consumer", &ser, 0, Cursor::START)
        .await
        .expect("save a cursor on the serialized feed");

    exec_ok(
        &mut admin,
        "drop table [dbo].[ser]; drop table [dbo].[again]; \
         create table [dbo].[again] (id bigint not null primary key, \
         payload nvarchar(50) null);",
    )
    .await;
    // Documented: a view that names a dropped table cannot be bound until it is rebuilt.
    let (number, _) = exec_failure(&mut admin, "select * from changefeed.feed_status;").await;
    assert!(
        matches!(number, 208 | 4413),
        "feed_status before the refresh: {number}"
    );

    exec_ok(&mut admin, "exec changefeed.refresh_feed_status;").await;
    let status = rows_ok(
        &mut admin,
        "select feed, mode, shard_id, problem from changefeed.feed_status order by feed;",
    )
    .await;
    let summary: Vec<(String, Option<i32>, Option<String>)> = status
        .iter()
        .map(|row| {
            (
                required::<&str>(row, "feed").to_owned(),
                row.try_get::<i32, &str>("shard_id").expect("shard_id"),
                text(row, "problem"),
            )
        })
        .collect();
    assert_eq!(summary.len(), 3, "{summary:?}");
    // Per feed: its shard, and what its problem says (with how to tear it down), if any.
    let expected = [
        ("dbo.again", None, Some("re-created")),
        ("dbo.keep", Some(0), None),
        ("dbo.ser", None, Some("dropped")),
    ];
    for ((feed, shard, problem), (name, expected_shard, says)) in summary.iter().zip(expected) {
        assert_eq!((feed.as_str(), *shard), (name, expected_shard));
        let Some(says) = says else {
            assert_eq!(*problem, None, "{feed} has no problem");
            continue;
        };
        let problem = problem
            .clone()
            .unwrap_or_else(|| panic!("{feed} has a problem"));
        let advice = format!("exec changefeed.teardown_feed @table_name = N'{name}'");
        assert!(
            problem.contains(says) && problem.contains(&advice),
            "{problem}"
        );
    }
    let ser_problem = summary[2].2.clone().expect("ser has a problem");
    assert_eq!(
        required::<&str>(&status[2], "mode"),
        "serialize_writers",
        "the registry's mode"
    );

    let lag = rows_ok(
        &mut admin,
        "select consumer, problem from changefeed.consumer_lag;",
    )
    .await;
    assert_eq!(lag.len(), 1);
    assert_eq!(text(&lag[0], "problem"), Some(ser_problem.clone()));

    let report = rows_ok(&mut admin, "exec changefeed.upgrade_all_feeds;").await;
    let report: Vec<(String, String, bool, Option<String>)> = report
        .iter()
        .map(|row| {
            (
                required::<&str>(row, "kind").to_owned(),
                required::<&str>(row, "name").to_owned(),
                required::<bool>(row, "upgraded"),
                text(row, "problem"),
            )
        })
        .collect();
    let feeds: Vec<_> = report.iter().filter(|row| row.0 == "feed").collect();
    assert_eq!(feeds.len(), 3, "{report:?}");
    for (_, name, upgraded, problem) in feeds {
        if name == "dbo.keep" {
            assert!(*upgraded && problem.is_none(), "{report:?}");
        } else {
            assert!(!*upgraded && problem.is_some(), "{report:?}");
        }
    }
    // keep still works after the upgrade.
    write_ok(&mut writer, &keep, 0, 2, None).await;
    assert_eq!(read_to_end(&reader, 0, Cursor::START).await.len(), 2);

    let (number, message) = exec_failure(&mut admin, &setup_outbox_feed("dbo.again")).await;
    assert_eq!(number, 51001, "{message}");
    assert!(message.contains("Tear it down first"), "{message}");

    exec_ok(
        &mut admin,
        "exec changefeed.teardown_feed @table_name = N'dbo.ser'; \
         exec changefeed.teardown_feed @table_name = N'dbo.again';",
    )
    .await;
    let left = rows_ok(
        &mut admin,
        "select feed, problem from changefeed.feed_status;",
    )
    .await;
    assert_eq!(left.len(), 1);
    assert_eq!(required::<&str>(&left[0], "feed"), "dbo.keep");
    assert!(
        saved_cursors(&mut admin, "dbo.ser").await.is_empty(),
        "teardown removed ser's cursors"
    );
    exec_ok(&mut admin, &setup_outbox_feed("dbo.again")).await;
    write_ok(&mut writer, &again, 0, 7, None).await;
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");
    let reader = changefeed::reader::FeedReader::new(pool, again.clone());
    assert_eq!(read_to_end(&reader, 0, Cursor::START).await.len(), 1);
}

// ------------------------------------------------------------------------------------------
// 4. Cursors belong to their feed's readers (C13)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn only_a_feeds_readers_and_db_owner_may_save_or_load_its_cursors() {
    let db = TestDb::create("reg_access", Isolation::LockingReadCommitted).await;
    let logins = access_scenario(&db).await;
    drop_logins(&db, &logins.iter().collect::<Vec<_>>()).await;
    db.drop_database().await;
}

/// Feeds `a` and `b`. A reader of `a` saves and loads `a`'s cursors (through `CursorStore`,
/// the Rust binding) but is refused `b`'s with 51112 naming `b`'s readers role; before the
/// fix, every feed's readers could move every other feed's consumers. A user granted EXECUTE
/// on save_cursor directly, in no readers role, is refused too; a db_owner may.
async fn access_scenario(db: &TestDb) -> Vec<Login> {
    let mut admin = db.client().await;
    let a = create_feed(&mut admin, "acc_a").await;
    let b = create_feed(&mut admin, "acc_b").await;
    let reader_a = Login::new("ra", db);
    reader_a.create(&mut admin, &[a.readers_role()], &[]).await;
    let reader_b = Login::new("rb", db);
    reader_b.create(&mut admin, &[b.readers_role()], &[]).await;
    let stranger = Login::new("st", db);
    stranger
        .create(
            &mut admin,
            &[],
            &[
                "grant execute on object::changefeed.save_cursor to".to_owned(),
                "grant execute on object::changefeed.load_cursor to".to_owned(),
            ],
        )
        .await;
    let owner = Login::new("ow", db);
    owner
        .create(&mut admin, &["[db_owner]".to_owned()], &[])
        .await;

    let mut as_a = reader_a.connect(db).await;
    let cursor = Cursor::from_ulid(Ulid::from_parts(1_700_000_000_000, 42));
    // A reader of a saves a's cursor and loads it.
    assert_round_trip(&mut as_a, "billing", &a, 0, cursor).await;
    let mut as_b = reader_b.connect(db).await;
    CursorStore::save(&mut as_b, "billing", &b, 0, Cursor::START)
        .await
        .expect("a reader of b saves b's cursor");

    for (client, feed) in [(&mut as_a, &b), (&mut as_b, &a)] {
        let error = CursorStore::save(client, "billing", feed, 0, Cursor::START)
            .await
            .expect_err("a reader of one feed may not save another feed's cursor");
        assert_eq!(error.server_number(), Some(51112), "{error}");
        assert!(
            error.to_string().contains(&feed.readers_role()),
            "names the role to join: {error}"
        );
        let error = CursorStore::load(client, "billing", feed, 0)
            .await
            .expect_err("nor load it");
        assert_eq!(error.server_number(), Some(51112), "{error}");
    }
    assert_eq!(
        saved_cursors(&mut admin, "dbo.acc_a").await.get("billing"),
        Some(&cursor.to_bytes().to_vec()),
        "b's reader did not move a's consumer"
    );

    let mut as_stranger = stranger.connect(db).await;
    let (number, _) = exec_failure(
        &mut as_stranger,
        &save_sql("billing", "dbo.acc_a", 0, &hex(&[0; 16])),
    )
    .await;
    assert_eq!(number, 51112, "EXECUTE alone is not enough");

    let mut as_owner = owner.connect(db).await;
    CursorStore::save(&mut as_owner, "ops", &b, 0, Cursor::START)
        .await
        .expect("db_owner may save any feed's cursor");
    let (number, _) = exec_failure(
        &mut as_owner,
        "exec changefeed.load_cursor @consumer = N'x', @feed = N'dbo.nothing', @shard_id = 0;",
    )
    .await;
    assert_eq!(number, 51006, "a name that is not a feed");

    for client in [as_a, as_b, as_stranger, as_owner] {
        close(client).await;
    }
    vec![reader_a, reader_b, stranger, owner]
}

// ------------------------------------------------------------------------------------------
// 5. Teardown removes the feed's cursors; roles come back without members (C14)
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking teardown_removes_the_feeds_cursors_and_a_new_setup_has_empty_roles: "reg_teardown" => teardown_scenario);

async fn teardown_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let gone = create_feed(&mut admin, "td_gone").await;
    let other = create_feed(&mut admin, "td_other").await;
    for (consumer, shard) in [("a", 0), ("a", 1), ("b", 0)] {
        CursorStore::save(&mut admin, consumer, &gone, shard, Cursor::START)
            .await
            .expect("save");
    }
    CursorStore::save(&mut admin, "a", &other, 0, Cursor::START)
        .await
        .expect("save");
    exec_ok(
        &mut admin,
        &format!(
            "create user [td_member] without login; alter role {} add member [td_member];",
            gone.readers_role()
        ),
    )
    .await;

    exec_ok(&mut admin, &teardown_feed("dbo.td_gone")).await;
    assert!(saved_cursors(&mut admin, "dbo.td_gone").await.is_empty());
    assert_eq!(
        saved_cursors(&mut admin, "dbo.td_other").await.len(),
        1,
        "another feed's cursors stay"
    );

    exec_ok(&mut admin, &setup_outbox_feed("dbo.td_gone")).await;
    let members = scalar_i64(
        &mut admin,
        "select count_big(*) from sys.database_role_members \
         where role_principal_id = database_principal_id(N'changefeed.readers:dbo.td_gone');",
    )
    .await;
    assert_eq!(members, 0, "the re-created readers role has no members");
    assert!(
        CursorStore::load(&mut admin, "a", &gone, 0)
            .await
            .expect("load")
            .is_none(),
        "the new feed has no saved cursor"
    );
}

// ------------------------------------------------------------------------------------------
// 6. Names with a backslash (C15)
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking names_with_a_backslash_are_refused_with_51000: "reg_backslash" => backslash_scenario);

async fn backslash_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    exec_ok(
        &mut admin,
        "create table [dbo].[back\\slash] (id bigint not null primary key);",
    )
    .await;
    for call in [
        "exec changefeed.setup_feed @table_name = N'dbo.back\\slash', @outbox = 1;",
        "exec changefeed.setup_feed @table_name = N'[dbo].[back\\slash]', @outbox = 1;",
        "exec changefeed.setup_feed @table_name = N'dom\\x.t', @outbox = 1;",
        "exec changefeed.upgrade_feed @table_name = N'dbo.back\\slash';",
        "exec changefeed.teardown_feed @table_name = N'dbo.back\\slash';",
    ] {
        let (number, message) = exec_failure(&mut admin, call).await;
        assert_eq!(number, 51000, "{call}: {message}");
        assert!(
            message.contains('\\'),
            "the message lists the backslash: {message}"
        );
    }
    assert_eq!(common::registered_feeds(&mut admin).await, 0);
}

// ------------------------------------------------------------------------------------------
// 7. Cursors of exactly 16 bytes (C16)
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking save_cursor_refuses_any_cursor_that_is_not_sixteen_bytes: "reg_length" => length_scenario);

async fn length_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "len").await;
    let sixteen: Vec<u8> = (1..=16).collect();
    let fifteen = sixteen[..15].to_vec();
    let seventeen = [sixteen.clone(), vec![0]].concat();
    for bytes in [&fifteen[..], &seventeen[..], &[][..]] {
        let literal = if bytes.is_empty() {
            "0x".to_owned()
        } else {
            hex(bytes)
        };
        let (number, message) =
            exec_failure(&mut admin, &save_sql("len", "dbo.len", 0, &literal)).await;
        assert_eq!(number, 51111, "{} bytes: {message}", bytes.len());
    }
    assert!(saved_cursors(&mut admin, "dbo.len").await.is_empty());
    exec_ok(&mut admin, &save_sql("len", "dbo.len", 0, &hex(&sixteen))).await;
    assert_eq!(
        saved_cursors(&mut admin, "dbo.len").await.get("len"),
        Some(&sixteen)
    );
    // The Rust binding still round-trips through the wider parameter.
    let cursor = Cursor::from_bytes(&sixteen).expect("16 bytes");
    assert_round_trip(&mut admin, "rust", &feed, 3, cursor).await;
}

// ------------------------------------------------------------------------------------------
// 8. Two first saves of one consumer (C17)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn concurrent_first_saves_of_one_consumer_never_fail_on_the_primary_key() {
    common::under_both_isolations("reg_race", race_scenario).await;
}

const RACERS: usize = 8;
const ROUNDS: usize = 40;

/// Inside a transaction: a first save holds its key until commit; a second session's first
/// save of the same consumer waits for it and then overwrites it (no 2627). Outside
/// transactions: rounds of eight sessions saving one new consumer's first cursor at the same
/// moment; before the fix, the update-then-insert of autocommit statements let two of them
/// insert, and the second failed with 2627. Every save succeeds and one row remains.
async fn race_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    create_feed(&mut admin, "race").await;

    let mut first = db.client().await;
    exec_ok(
        &mut first,
        &format!(
            "begin transaction; {}",
            save_sql("held", "dbo.race", 0, &hex(&[1; 16]))
        ),
    )
    .await;
    let mut second = db.client().await;
    let waiting = spawn_bounded("the second first save".to_owned(), LIMIT, async move {
        exec(
            &mut second,
            &save_sql("held", "dbo.race", 0, &hex(&[2; 16])),
        )
        .await
        .map_err(|error| error.to_string())?;
        Ok(second)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the second save waits for the first"
    );
    exec_ok(&mut first, "commit transaction;").await;
    close(join(waiting).await).await;
    assert_eq!(
        saved_cursors(&mut admin, "dbo.race").await.get("held"),
        Some(&vec![2; 16]),
        "the later save wins"
    );

    let mut clients = Vec::new();
    for _ in 0..RACERS {
        clients.push(db.client().await);
    }
    for round in 0..ROUNDS {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for (racer, mut client) in clients.drain(..).enumerate() {
            let barrier = barrier.clone();
            let sql = save_sql(
                &format!("round_{round}"),
                "dbo.race",
                0,
                &hex(&[u8::try_from(racer).expect("few racers"); 16]),
            );
            tasks.push(spawn_bounded(
                format!("round {round} racer {racer}"),
                LIMIT,
                async move {
                    barrier.wait().await;
                    exec(&mut client, &sql)
                        .await
                        .map_err(|error| format!("first save: {error}"))?;
                    Ok(client)
                },
            ));
        }
        for task in tasks {
            clients.push(join(task).await);
        }
        let saved = scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from changefeed.consumer_cursor \
                 where consumer = N'round_{round}';"
            ),
        )
        .await;
        assert_eq!(saved, 1, "round {round}: one row");
    }
    for client in clients {
        close(client).await;
    }
}

// ------------------------------------------------------------------------------------------
// 9. Status views and isolation levels (C18, documented)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn status_views_inside_snapshot_or_serializable_fail_only_with_650_and_work_at_read_committed()
 {
    common::under_both_isolations("reg_views", views_scenario).await;
}

/// docs/sql-server.md, "Status views": the views read with READPAST, which SQL Server may
/// refuse inside a SNAPSHOT or SERIALIZABLE transaction; then the error is 650 (nothing
/// else), and at READ COMMITTED they work, also on a session that switches back from one of
/// those levels.
async fn views_scenario(db: &TestDb) {
    let mut master = common::connect_to("master").await;
    exec_ok(
        &mut master,
        &format!(
            "alter database [{}] set allow_snapshot_isolation on;",
            db.name
        ),
    )
    .await;
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "views").await;
    let mut writer = db.client().await;
    write_ok(&mut writer, &feed, 0, 1, None).await;
    CursorStore::save(&mut admin, "c", &feed, 0, Cursor::START)
        .await
        .expect("save");

    let mut client = db.client().await;
    for level in ["snapshot", "serializable"] {
        for view in ["changefeed.feed_status", "changefeed.consumer_lag"] {
            let inside = format!(
                "set transaction isolation level {level}; begin transaction; \
                 select * from {view};"
            );
            match exec(&mut client, &inside).await {
                Ok(()) => eprintln!("-- {view} works under {level} on this server"),
                Err(error) => assert_eq!(
                    error.server_number(),
                    Some(650),
                    "{view} under {level}: the documented refusal is 650, got {error}"
                ),
            }
            exec_ok(
                &mut client,
                "if @@trancount > 0 rollback transaction; \
                 set transaction isolation level read committed;",
            )
            .await;
            let rows = rows_ok(&mut client, &format!("select * from {view};")).await;
            assert_eq!(rows.len(), 1, "{view} at read committed");
        }
    }
    close(client).await;
}

// ------------------------------------------------------------------------------------------
// Issue 19 item 1: event tables in a schema another user owns
// ------------------------------------------------------------------------------------------

common::live_test!(a_table_outside_the_bundle_owners_chain_is_refused_and_reads_once_given_to_dbo: "reg_owner" => owner_scenario);

/// Schema `ext` is created with `authorization` a user other than dbo. `setup_feed` refuses
/// its tables in both modes with 51013 naming `alter authorization on object::[ext].[…] to
/// [dbo]` and what it drops, and registers nothing (before the fix it set them up, and a
/// readers-only login then got Msg 229 on every read with events: rows moved, cursor
/// stuck). Once the schema is given to dbo (the wider fix) both feeds are set up, and a login that is only in their readers roles reads
/// every event with `@with_event = 1`, in both modes.
async fn owner_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    exec_ok(
        &mut admin,
        "create user [ext_owner] without login; \
         exec (N'create schema [ext] authorization [ext_owner];'); \
         create table [ext].[ev_o] (id bigint not null primary key, payload nvarchar(50) not null); \
         create table [ext].[ev_s] (id bigint not null primary key, Shard int not null, \
             ULID binary(16) not null, payload nvarchar(50) not null); \
         create unique index [ux_ev_s] on [ext].[ev_s] (Shard, ULID);",
    )
    .await;
    let setups = [
        "exec changefeed.setup_feed @table_name = N'ext.ev_o', @outbox = 1;",
        "exec changefeed.setup_feed @table_name = N'ext.ev_s', @serialize_writers = 1, \
         @shard_column = N'Shard', @ulid_column = N'ULID';",
    ];
    for setup in setups {
        let (number, message) = exec_failure(&mut admin, setup).await;
        assert_eq!(number, 51013, "{setup}: {message}");
        // The narrowest fix: the table alone, with what it drops (issue 29 item 4).
        assert!(
            message.contains("alter authorization on object::[ext].[ev_")
                && message.contains(" to [dbo]")
                && message.contains("ext_owner")
                && message.contains("drops the 0 permissions"),
            "51013 names the owner, the statement that fixes it and what it drops: {message}"
        );
    }
    assert_eq!(
        common::registered_feeds(&mut admin).await,
        0,
        "nothing was registered"
    );

    exec_ok(&mut admin, "alter authorization on schema::[ext] to [dbo];").await;
    for setup in setups {
        exec_ok(&mut admin, setup).await;
    }
    let (outbox, serial, reader, mut client) = readable_in_both_modes(
        db,
        &mut admin,
        "own",
        ["ext.ev_o", "ext.ev_s"],
        ("id", "1"),
        "id, payload",
        ["1, N'outbox event'", "2, N'serialized event'"],
    )
    .await;
    for (feed, id, payload) in [
        (&outbox, 1, "outbox event"),
        (&serial, 2, "serialized event"),
    ] {
        let rows = rows_ok(
            &mut client,
            &format!(
                "exec {} @shard_id = 0, @with_event = 1;",
                feed.read_feed_procedure()
            ),
        )
        .await;
        assert_eq!(
            rows.len(),
            1,
            "{feed}: one event for the readers-only login"
        );
        assert_eq!(required::<i64>(&rows[0], "id"), id, "{feed}");
        assert_eq!(required::<&str>(&rows[0], "payload"), payload, "{feed}");
    }
    drop(client);
    drop_logins(db, &[&reader]).await;
}

// ------------------------------------------------------------------------------------------
// Issue 19 item 12: a view is not a table
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking setup_feed_on_a_view_says_it_is_a_view: "reg_view" => view_scenario);

async fn view_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    exec_ok(
        &mut admin,
        "create table [dbo].[viewed] (id bigint not null primary key); \
         exec (N'create view [dbo].[a_view] as select id from [dbo].[viewed];');",
    )
    .await;
    let (number, message) = exec_failure(&mut admin, &setup_outbox_feed("dbo.a_view")).await;
    assert_eq!(number, 51001, "{message}");
    assert!(
        message.contains("is a view") && message.contains("needs a table"),
        "the refusal says it is a view and what a feed needs: {message}"
    );
    // A name that is neither still gets the message about a missing table.
    let (number, message) = exec_failure(&mut admin, &setup_outbox_feed("dbo.nothing_here")).await;
    assert_eq!(number, 51001, "{message}");
    assert!(message.contains("does not exist"), "{message}");
}

// ------------------------------------------------------------------------------------------
// Issue 19 item 6: upgrade_feed regenerates under the registry's spelling
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking upgrade_feed_called_with_other_casing_keeps_the_registrys_spelling: "reg_casing" => casing_scenario);

async fn casing_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    assert_eq!(
        scalar_i64(
            &mut admin,
            "select convert(bigint, collationproperty(convert(sysname, \
             databasepropertyex(db_name(), 'Collation')), 'ComparisonStyle')) & 1;",
        )
        .await,
        1,
        "this test needs a case-insensitive database (the server's default collation)"
    );
    let feed = create_serialized_feed(&mut admin, "Spelled").await;
    exec_ok(
        &mut admin,
        "exec changefeed.upgrade_feed @table_name = N'DBO.SPELLED';",
    )
    .await;
    // The lock resource names in the generated code are the registry's spelling: the
    // caller's would make a serialized reader stop waiting for writers of the old code.
    for kind in ["lock_feed", "read_feed"] {
        let definition = rows_ok(
            &mut admin,
            &format!(
                "select object_definition(object_id(N'{}')) as definition;",
                feed.object(kind).replace('\'', "''")
            ),
        )
        .await;
        let definition: &str = required(&definition[0], "definition");
        assert!(
            definition.contains("N'changefeed:lock_feed:dbo.Spelled:'"),
            "{kind} locks under the registry's spelling"
        );
        assert!(
            !definition.contains("SPELLED"),
            "{kind} has none of the caller's spelling"
        );
    }
    // And the feed still works: a writer and a reader.
    let mut writer = db.client().await;
    exec_ok(
        &mut writer,
        &format!(
            "set xact_abort on; begin transaction; exec {} @shard_id = 0; \
             insert into {} (id, Shard, ULID) values (1, 0, {}(1)); commit transaction;",
            feed.object("lock_feed"),
            feed.quoted_table(),
            feed.object("ulid")
        ),
    )
    .await;
    let rows = rows_ok(
        &mut admin,
        &format!("exec {} @shard_id = 0;", feed.read_feed_procedure()),
    )
    .await;
    assert_eq!(rows.len(), 1);
}
