//! Live tests of consumer ownership and of `save_cursor` next to `teardown_feed` (issue 19,
//! items 2, 3 and 9): a consumer belongs to the database user of its first save; two logins
//! in the same readers role cannot move, read or remove each other's consumers; `db_owner`
//! can, and sees the owners in `consumer_lag`; a first save holds no key-range lock and
//! makes `teardown_feed` wait for its transaction (30 s at most, so that other generator
//! calls do not time out behind it; issue 29 item 6), and a save that comes after a teardown
//! is refused and leaves nothing behind; consumer names too long for the column or with
//! trailing spaces are refused when `save_cursor` (or `remove_consumer`) is called from SQL.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: `cargo test --test live_cursor_owner -- --ignored`. Every scenario runs
//! with READ_COMMITTED_SNAPSHOT off and on, each in a database of its own.

mod common;

use std::time::{Duration, Instant};

use changefeed::{Client, Cursor, CursorStore, Feed};
use common::events::create_feed;
use common::logins::{Login, with_logins};
use common::sessions::{self, count_range_locks, session_id};
use common::tasks::{bounded, join, spawn_bounded};
use common::{TestDb, exec, rows, scalar_i64};
use ulid::Ulid;

/// A call that must not wait gets this long before the test calls it blocked.
const NOT_BLOCKED: Duration = Duration::from_secs(20);
/// How long a spawned call may run in all.
const TASK_LIMIT: Duration = Duration::from_secs(120);

/// A cursor at ULID `n` (distinct, comparable values).
fn cursor(n: u128) -> Cursor {
    Cursor::from_ulid(Ulid(n))
}

/// Asserts that `result` failed with SQL Server error `number`; returns its message.
#[track_caller]
fn server_error<T: std::fmt::Debug>(
    result: changefeed::Result<T>,
    number: u32,
    what: &str,
) -> String {
    match result {
        Ok(value) => panic!("{what}: expected error {number}, got Ok({value:?})"),
        Err(error) => {
            assert_eq!(
                error.server_number(),
                Some(number),
                "{what}: expected error {number}, got {error}"
            );
            error.to_string()
        }
    }
}

/// `exec changefeed.save_cursor` as plain SQL, with `consumer` as an N'' literal (so that
/// the server, not the Rust client's own check, sees the name).
async fn save_sql(
    client: &mut Client,
    consumer: &str,
    feed: &Feed,
    shard: i32,
    n: u128,
) -> changefeed::Result<()> {
    exec(
        client,
        &format!(
            "exec changefeed.save_cursor @consumer = N'{}', @feed = N'{feed}', @shard_id = {shard}, \
             @cursor = 0x{:032x};",
            consumer.replace('\'', "''"),
            n
        ),
    )
    .await
}

async fn remove_consumer(
    client: &mut Client,
    consumer: &str,
    feed: &Feed,
) -> changefeed::Result<i64> {
    let found = rows(
        client,
        &format!(
            "exec changefeed.remove_consumer @consumer = N'{}', @feed = N'{feed}';",
            consumer.replace('\'', "''")
        ),
    )
    .await?;
    Ok(i64::from(
        found[0]
            .get::<i32, _>(0)
            .expect("remove_consumer returns removed"),
    ))
}

/// What [`owners`] shows for a consumer of shards 0 to `shards - 1` that `login` owns.
fn shards_of(login: &Login, shards: i32) -> Vec<(i32, Option<String>)> {
    (0..shards)
        .map(|shard| (shard, Some(login.name.clone())))
        .collect()
}

/// The saved cursors of `consumer` (shard, owner's user name) as `consumer_lag` shows them.
async fn owners(admin: &mut Client, consumer: &str, feed: &Feed) -> Vec<(i32, Option<String>)> {
    rows(
        admin,
        &format!(
            "select shard_id, owner from changefeed.consumer_lag \
             where consumer = N'{consumer}' and feed = N'{feed}' order by shard_id;"
        ),
    )
    .await
    .expect("consumer_lag")
    .iter()
    .map(|row| {
        (
            row.get::<i32, _>(0).expect("shard_id"),
            row.get::<&str, _>(1).map(str::to_owned),
        )
    })
    .collect()
}

/// Runs `scenario` with two logins in `feed`'s readers role under both isolations, dropping
/// the logins (server-level objects) even when it fails.
async fn with_two_readers(label: &str, scenario: impl AsyncFn(&TestDb, &Login, &Login)) {
    common::under_both_isolations(label, async |db: &TestDb| {
        let two = async |[alice, bob]: &[Login; 2]| scenario(db, alice, bob).await;
        with_logins(db, ["alice", "bob"], two).await;
    })
    .await;
}

// ------------------------------------------------------------------------------------------
// 1. a consumer belongs to the user of its first save (item 2)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn a_consumer_belongs_to_the_user_of_its_first_save() {
    with_two_readers("cursor_owner", owner_scenario).await;
}

async fn owner_scenario(db: &TestDb, alice_login: &Login, bob_login: &Login) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "owned_events").await;
    // Both are readers of the feed, nothing more.
    for login in [alice_login, bob_login] {
        login.create(&mut admin, &[feed.readers_role()], &[]).await;
    }
    let mut alice = alice_login.connect(db).await;
    let mut bob = bob_login.connect(db).await;

    // Alice's first save makes the consumer hers; she moves it on, on two shards.
    CursorStore::save(&mut alice, "billing", &feed, 0, cursor(10))
        .await
        .expect("alice's first save");
    CursorStore::save(&mut alice, "billing", &feed, 0, cursor(20))
        .await
        .expect("alice moves on");
    CursorStore::save(&mut alice, "billing", &feed, 1, cursor(5))
        .await
        .expect("alice's second shard");

    // Bob, in the same readers role, can neither move, nor read, nor remove it, nor add a
    // shard to it (which would hold purge back under her name).
    let refused = server_error(
        CursorStore::save(&mut bob, "billing", &feed, 0, cursor(1_000)).await,
        51114,
        "bob saves alice's consumer",
    );
    assert!(refused.contains(&alice_login.name), "{refused}");
    assert!(refused.contains("remove_consumer"), "{refused}");
    server_error(
        CursorStore::save(&mut bob, "billing", &feed, 7, Cursor::START).await,
        51114,
        "bob adds a shard to alice's consumer",
    );
    server_error(
        CursorStore::load(&mut bob, "billing", &feed, 0).await,
        51114,
        "bob loads alice's consumer",
    );
    server_error(
        remove_consumer(&mut bob, "billing", &feed).await,
        51114,
        "bob removes alice's consumer",
    );
    // Nothing moved.
    assert_eq!(billing_cursor(&mut alice, &feed).await, Some(cursor(20)));
    assert_eq!(
        owners(&mut admin, "billing", &feed).await,
        shards_of(alice_login, 2),
        "consumer_lag shows alice as the owner of both shards"
    );

    // Bob's own consumer is his.
    CursorStore::save(&mut bob, "audit", &feed, 0, cursor(3))
        .await
        .expect("bob's own consumer");
    let audit_owners = owners(&mut admin, "audit", &feed).await;
    assert_eq!(audit_owners, shards_of(bob_login, 1));

    // db_owner may rewind alice's consumer (it stays hers) and remove it; then the name is
    // free and bob's first save makes it his.
    CursorStore::save(&mut admin, "billing", &feed, 0, cursor(15))
        .await
        .expect("db_owner rewinds");
    assert_eq!(billing_cursor(&mut alice, &feed).await, Some(cursor(15)));
    assert_eq!(
        owners(&mut admin, "billing", &feed).await[0].1.as_deref(),
        Some(alice_login.name.as_str())
    );
    assert_eq!(
        remove_consumer(&mut admin, "billing", &feed)
            .await
            .expect("db_owner removes"),
        2
    );
    CursorStore::save(&mut bob, "billing", &feed, 0, cursor(1))
        .await
        .expect("bob takes the freed name");
    let billing_owners = owners(&mut admin, "billing", &feed).await;
    assert_eq!(billing_owners, shards_of(bob_login, 1));
    server_error(
        CursorStore::load(&mut alice, "billing", &feed, 0).await,
        51114,
        "alice loads the consumer that is bob's now",
    );

    // The owner removes its own consumer.
    assert_eq!(
        remove_consumer(&mut bob, "audit", &feed)
            .await
            .expect("bob removes his own"),
        1
    );
    assert!(owners(&mut admin, "audit", &feed).await.is_empty());

    // A consumer saved before owners existed (no owner) is bound by its next save.
    exec(
        &mut admin,
        &format!(
            "insert into changefeed.consumer_cursor (consumer, feed, shard_id, [cursor]) \
             values (N'legacy', N'{feed}', 0, 0x{:032x}), (N'legacy', N'{feed}', 1, 0x{:032x});",
            7, 8
        ),
    )
    .await
    .expect("a row as an older version saved it");
    assert_eq!(
        owners(&mut admin, "legacy", &feed).await,
        vec![(0, None), (1, None)]
    );
    // A db_owner saving it (an operator moving its cursor) does not take it over: it stays
    // without an owner, and its own login binds it below.
    CursorStore::save(&mut admin, "legacy", &feed, 0, cursor(10))
        .await
        .expect("a db_owner saves the legacy consumer");
    CursorStore::save(&mut admin, "legacy", &feed, 2, cursor(10))
        .await
        .expect("a db_owner saves a shard the legacy consumer had not saved");
    assert_eq!(
        owners(&mut admin, "legacy", &feed).await,
        vec![(0, None), (1, None), (2, None)],
        "a db_owner's save binds nothing, and its new row has no owner either"
    );
    CursorStore::save(&mut alice, "legacy", &feed, 0, cursor(9))
        .await
        .expect("alice saves the legacy consumer");
    assert_eq!(
        owners(&mut admin, "legacy", &feed).await,
        shards_of(alice_login, 3),
        "the save binds every shard of the consumer"
    );
    server_error(
        CursorStore::save(&mut bob, "legacy", &feed, 1, cursor(9)).await,
        51114,
        "bob saves the now bound legacy consumer",
    );
}

// ------------------------------------------------------------------------------------------
// 2. save_cursor next to teardown_feed (item 3)
// ------------------------------------------------------------------------------------------

/// Waits until `session` is waiting for a lock, any lock.
async fn await_lock_wait(client: &mut Client, session: i64, what: &str) {
    sessions::await_lock_wait(client, session, "LCK[_]M[_]", NOT_BLOCKED, what).await;
}

async fn cursor_rows(admin: &mut Client, feed: &Feed) -> i64 {
    scalar_i64(
        admin,
        &format!("select count_big(*) from changefeed.consumer_cursor where feed = N'{feed}';"),
    )
    .await
}

common::live_test!(save_cursor_and_teardown_feed_never_leave_a_cursor_of_a_dropped_feed: "cursor_teardown" => teardown_scenario);

async fn teardown_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let mut consumer = db.client().await;
    let feed = create_feed(&mut admin, "torn_events").await;
    let consumer_session = session_id(&mut consumer).await;

    // A first save inside the consumer's open transaction holds no key-range lock: first
    // saves of other consumers do not wait for it.
    exec(&mut consumer, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    save_sql(&mut consumer, "first", &feed, 0, 1)
        .await
        .expect("first save");
    let range_locks = count_range_locks(&mut admin, consumer_session).await;
    assert_eq!(range_locks, 0, "a first save holds no key-range lock");
    let mut other = db.client().await;
    bounded(
        "another consumer's first save next to the open one",
        NOT_BLOCKED,
        save_sql(&mut other, "second", &feed, 0, 1),
    )
    .await
    .expect("another consumer's first save");

    // The save holds the feed: teardown_feed waits for the consumer's commit, then drops the
    // feed with every cursor, the one just saved included.
    let mut tearer = db.client().await;
    let tearer_session = session_id(&mut tearer).await;
    let table = format!("{feed}");
    let teardown = spawn_bounded("teardown_feed".to_owned(), TASK_LIMIT, async move {
        exec(
            &mut tearer,
            &format!("exec changefeed.teardown_feed @table_name = N'{table}';"),
        )
        .await
        .map_err(|error| format!("teardown_feed: {error}"))
    });
    await_lock_wait(
        &mut admin,
        tearer_session,
        "teardown_feed behind the open save",
    )
    .await;
    assert!(
        !teardown.is_finished(),
        "teardown_feed waits for the saving transaction"
    );
    exec(&mut consumer, "commit transaction;").await.unwrap();
    join(teardown).await;
    assert_eq!(
        cursor_rows(&mut admin, &feed).await,
        0,
        "no cursor of the dropped feed is left"
    );

    // The other order: a teardown not yet committed, then a save. The save waits for it and
    // is refused once the feed is gone, leaving nothing (the old save_cursor, under
    // READ_COMMITTED_SNAPSHOT, read the feed as still there and wrote a cursor of a feed
    // that no longer existed).
    let feed = create_feed(&mut admin, "torn_again").await;
    exec(&mut admin, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    exec(
        &mut admin,
        &format!("exec changefeed.teardown_feed @table_name = N'{feed}';"),
    )
    .await
    .expect("teardown_feed inside an open transaction");
    let saving_feed = feed.clone();
    let save = spawn_bounded(
        "save next to an open teardown".to_owned(),
        TASK_LIMIT,
        async move { Ok(save_sql(&mut consumer, "late", &saving_feed, 0, 1).await) },
    );
    await_lock_wait(
        &mut other,
        consumer_session,
        "save_cursor behind the open teardown",
    )
    .await;
    exec(&mut admin, "commit transaction;").await.unwrap();
    server_error(join(save).await, 51006, "a save after the teardown");
    assert_eq!(
        cursor_rows(&mut admin, &feed).await,
        0,
        "the refused save left no cursor"
    );
}

common::live_test!(teardown_feed_behind_an_open_save_gives_up_before_other_generators_time_out: "teardown_bounded" => bounded_teardown_scenario);

/// Issue 29 item 6 (c): `teardown_feed` behind a consumer's open save holds the generators
/// lock while it waits, so it waits at most 30 s and then gives up (51012, nothing dropped).
/// A `setup_feed` queued behind it for the generators lock meanwhile then gets that lock
/// within its own 60 s and succeeds (it failed with 51012 while the teardown waited on). Once
/// the consumer commits, the teardown goes through.
async fn bounded_teardown_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let mut consumer = db.client().await;
    let feed = create_feed(&mut admin, "held_events").await;
    exec(&mut consumer, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    save_sql(&mut consumer, "holder", &feed, 0, 1)
        .await
        .expect("the save left open");

    let mut tearer = db.client().await;
    let tearer_session = session_id(&mut tearer).await;
    let teardown_sql = format!("exec changefeed.teardown_feed @table_name = N'{feed}';");
    let started = Instant::now();
    let sql = teardown_sql.clone();
    let teardown = spawn_bounded("teardown_feed".to_owned(), TASK_LIMIT, async move {
        Ok(exec(&mut tearer, &sql).await)
    });
    await_lock_wait(
        &mut admin,
        tearer_session,
        "teardown_feed behind the open save",
    )
    .await;
    let mut setter = db.client().await;
    exec(
        &mut setter,
        "create table dbo.queued_events (id bigint not null primary key, payload nvarchar(50) null);",
    )
    .await
    .unwrap();
    let setup = spawn_bounded("setup_feed".to_owned(), TASK_LIMIT, async move {
        Ok(exec(&mut setter, &common::setup_outbox_feed("dbo.queued_events")).await)
    });

    let refused = server_error(
        join(teardown).await,
        51012,
        "teardown_feed behind the open save",
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(29) && waited < Duration::from_secs(59),
        "teardown_feed gave up after its 30 s, before a queued generator's 60 s: {waited:?}"
    );
    assert!(refused.contains("Nothing was dropped"), "{refused}");
    join(setup)
        .await
        .expect("setup_feed queued behind the teardown that gave up");

    exec(&mut consumer, "commit transaction;").await.unwrap();
    assert_eq!(
        cursor_rows(&mut admin, &feed).await,
        1,
        "the teardown that gave up dropped nothing: the saved cursor is there"
    );
    assert_eq!(
        scalar_i64(
            &mut admin,
            "select count_big(*) from changefeed.feeds \
             where table_name in (N'held_events', N'queued_events');",
        )
        .await,
        2,
        "both feeds are registered"
    );
    exec(&mut admin, &teardown_sql)
        .await
        .expect("teardown_feed once the save committed");
    assert_eq!(
        cursor_rows(&mut admin, &feed).await,
        0,
        "the cursor went with it"
    );
}

// ------------------------------------------------------------------------------------------
// 3. consumer names from SQL (items 8, 9)
// ------------------------------------------------------------------------------------------

common::live_test!(save_cursor_from_sql_refuses_names_it_would_cut_or_merge: "cursor_names" => names_scenario);

async fn names_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    let feed = create_feed(&mut admin, "named_events").await;

    // 200 characters fit; 201 would be cut to the first 200, another consumer's name.
    let longest = "c".repeat(200);
    save_sql(&mut admin, &longest, &feed, 0, 1)
        .await
        .expect("a 200-character name");
    let message = server_error(
        save_sql(&mut admin, &format!("{longest}x"), &feed, 0, 2).await,
        51110,
        "a 201-character name",
    );
    assert!(message.contains("200"), "{message}");
    server_error(
        load_sql(&mut admin, &format!("{longest}x"), &feed).await,
        51110,
        "loading a 201-character name",
    );
    // 'a' and 'a ' compare equal: refused rather than merged.
    save_sql(&mut admin, "a", &feed, 0, 1).await.expect("a");
    server_error(
        save_sql(&mut admin, "a ", &feed, 0, 2).await,
        51110,
        "a trailing space",
    );
    // remove_consumer refuses it too (V74): 'a ' would delete consumer 'a' under a lock
    // resource other than the one save_cursor takes for 'a', so the two would not wait for
    // each other. Consumer 'a' is left as it was.
    let message = server_error(
        remove_consumer(&mut admin, "a ", &feed).await,
        51110,
        "remove_consumer with a trailing space",
    );
    assert!(message.contains("space"), "{message}");
    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from changefeed.consumer_cursor where feed = N'{feed}' \
                 and consumer = N'a';"
            ),
        )
        .await,
        1,
        "the refused removal deleted nothing"
    );
    // Outside the Basic Multilingual Plane a character takes two of the 200 units: 100
    // emoji fit, 101 do not (len() would count 101).
    let emoji = "\u{1F600}".repeat(100);
    save_sql(&mut admin, &emoji, &feed, 0, 1)
        .await
        .expect("100 emoji");
    server_error(
        save_sql(&mut admin, &format!("{emoji}\u{1F600}"), &feed, 0, 1).await,
        51110,
        "101 emoji",
    );
    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from changefeed.consumer_cursor where feed = N'{feed}' \
                 and [cursor] = 0x{:032x};",
                2
            ),
        )
        .await,
        0,
        "no refused save changed a cursor"
    );
}

async fn load_sql(client: &mut Client, consumer: &str, feed: &Feed) -> changefeed::Result<()> {
    exec(
        client,
        &format!(
            "exec changefeed.load_cursor @consumer = N'{}', @feed = N'{feed}', @shard_id = 0;",
            consumer.replace('\'', "''")
        ),
    )
    .await
}

/// The cursor of consumer `billing` on shard 0 that `client`'s login loads (alice's).
async fn billing_cursor(client: &mut Client, feed: &Feed) -> Option<Cursor> {
    CursorStore::load(client, "billing", feed, 0)
        .await
        .expect("alice loads")
}
