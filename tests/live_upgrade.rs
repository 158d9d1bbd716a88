//! The upgrade test (issue 12, item 5): a database as an older release of the bundle left
//! it — feeds of both modes and a claim outbox set up, events written and partly read,
//! consumers' cursors saved, messages enqueued, claimed and partly acknowledged — is
//! migrated to the newest bundle, and then every row and cursor must still be there and
//! every object must work: `read_feed` continues from each saved cursor with no gap and no
//! repeat, new ULIDs come after the old ones, `lock_feed` and `ulid(@i)` work, a claim made
//! before the upgrade can still be acknowledged and `claim` goes on in order, and
//! `feed_status` and `consumer_lag` show the feeds.
//!
//! It also carries four broken objects over the upgrade (issue 19, item 5; issue 29, items
//! 2 and 6): a feed whose key column was renamed, a claim outbox one of whose columns was
//! renamed, a claim outbox whose clustered primary key was dropped by hand (the claim and the
//! acknowledgements now seek it by a hint), and a claim outbox two of whose columns were
//! renamed, which is then repaired as its problem says and upgraded alone (from before V61 it
//! also lacks `claim_expires_at`, which its new code needs). The regeneration `migrate` runs
//! after the migrations must skip them, report them broken with their problem, and
//! regenerate the others.
//!
//! A second test upgrades, in a database with a supplementary-character collation, a claim
//! outbox whose name takes 111 UTF-16 units (possible before V71 counted units): the
//! regeneration must upgrade it instead of failing. The regenerated objects are checked by
//! what they must now contain (the serial feed insert, the `#read` check), never by a
//! version number.
//!
//! A third (`traffic.rs`, issue 29 item 1) upgrades from the baseline while writers,
//! readers and relays run, and bounds how long any of their calls waits.
//!
//! It needs a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and is
//! `#[ignore]`d: `cargo test --test live_upgrade -- --ignored`. It runs once per version in
//! [`FROM_VERSIONS`], each with READ_COMMITTED_SNAPSHOT off and on.
//!
//! # Which versions it starts from, and how to extend it
//!
//! Before an upgrade, the database holds objects generated from an older release's
//! templates; `migrate` regenerates them after the migrations (`upgrade_all_feeds
//! @only_outdated = 1`) without touching their data. So for every migration `V<m>` that
//! changes a template or a generator (its text mentions a `__template…__` object), add
//! `m - 1` — the database as it stood just before that change — to [`FROM_VERSIONS`]. The
//! test `from_versions_cover_every_template_change` below (no server needed, part of
//! `cargo test`) fails until that is done.
//!
//! [`BASELINE`] is the first released bundle (V1 to V49 as one release, the files frozen in
//! tests/frozen_migrations.txt): versions below it
//! were never released on their own, and its files are not upgrades of each other (e.g.
//! V46 adds the purge template without regenerating feeds set up before it, which is right
//! for a bundle that is installed whole). Starting below it would test a database no
//! release ever produced, so no from-version is below the baseline. The setup step calls
//! only objects the baseline has, through plain SQL with the baseline's parameters; the
//! checks after the upgrade use the Rust client, which speaks the newest bundle.

mod claim_contract;
mod common;
#[path = "live_upgrade/traffic.rs"]
mod traffic;

use std::collections::BTreeSet;
use std::time::Duration;

use changefeed::migrations::{MigrationReport, Outcome};
use changefeed::outbox::{ClaimToken, Claimed, ClaimedMessage, NewMessage};
use changefeed::outbox_store::OutboxStore;
use changefeed::writer::lock_feed;
use changefeed::{Client, Cursor, CursorStore, Feed, ReadOptions, read_page};
use common::events::{exec_ok, hex, required, rows_ok};
use common::load::ulid_of;
use common::{Isolation, TestDb, scalar_i64};
use ulid::Ulid;

/// The first released version of the bundle: every from-version is at least this.
const BASELINE: i32 = 49;

/// The versions the upgrade starts from, ascending. Add `m - 1` for each later migration
/// `V<m>` that changes a template (see the module's documentation).
const FROM_VERSIONS: &[i32] = &[
    BASELINE, 51, 52, 53, 55, 56, 58, 59, 61, 62, 70, 76, 78, 82, 83, 84, 85, 86, 87, 88, 97, 103,
    107,
];

/// The first migration whose generated code names the clustered index in a hint (the
/// claim's update, V83): an outbox without one set up before it keeps working code when the
/// upgrade skips it.
const FIRST_SEEK_HINT: i32 = 83;

/// The first version whose `setup_outbox` creates `claim_expires_at` (V61's
/// `create_outbox_storage`): an outbox set up before it and broken before V62 lacks it.
const FIRST_CLAIM_EXPIRY: i32 = 61;

/// The first version with `register_consumer` (V94; V93 created the registrations and
/// registered every consumer that had a saved cursor). A consumer saved at an older version
/// is registered by the upgrade; one saved at this version or later is registered by the
/// setup, as that version requires of a consumer that holds retention back.
const FIRST_REGISTER_CONSUMER: i32 = 94;

/// The consumer whose cursors the test saves before the upgrade.
const CONSUMER: &str = "upgrade-test";
/// Claims made before the upgrade outlive it: ten minutes.
const CLAIM_TIMEOUT_MS: i32 = 600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn an_older_release_upgrades_with_every_row_cursor_and_object_intact() {
    for &from in FROM_VERSIONS {
        common::under_both_isolations_from(&format!("upgrade_from_v{from}"), from, async |db| {
            upgrade_scenario(db, from).await
        })
        .await;
    }
}

/// A supplementary-character collation: there `len()` counts an emoji once (SQL Server 2019
/// and later).
const SC_COLLATION: &str = "Latin1_General_100_CI_AS_SC_UTF8";

/// Issue 29 item 6 (b). Before V71 the name rule counted characters with `len()`, so under
/// an `_SC` collation a claim outbox could be set up with a name of 109 to 111 UTF-16 units
/// (the longest name generated for it, `held_aggregates:<schema>.<table>`, then has 128).
/// V71 counts units and allows feeds 108; the upgrade must neither roll back on such an
/// outbox (V73 and every later regenerating migration did, when upgrade_outbox checked the
/// registered name as a feed's) nor leave it behind: it ends upgraded, and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server 2019 or later: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn an_outbox_named_in_111_utf16_units_before_v71_is_upgraded() {
    let db = TestDb::create_collated_at(
        "upgrade_long_outbox",
        Isolation::LockingReadCommitted,
        BASELINE,
        SC_COLLATION,
    )
    .await;
    let mut admin = db.client().await;
    // 102 letters and 3 emoji: 105 characters to len(), 108 UTF-16 units; 111 with `dbo`.
    let table = format!("dbo.{}{}", "o".repeat(102), "\u{1F600}".repeat(3));
    assert_eq!(
        table.encode_utf16().count() - 1,
        111,
        "schema and table in units"
    );
    rows_ok(
        &mut admin,
        &format!(
            "exec changefeed.setup_outbox @table_name = N'{table}'; \
             set xact_abort on; begin transaction; \
             exec [changefeed].[enqueue:{table}] @topic = N'long', \
                 @payload = N'{{\"n\": \"l1\"}}', @message_id = N'l1'; \
             commit transaction;"
        ),
    )
    .await;

    let report = changefeed::migrations::migrate(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("migrating from V{BASELINE} with {table}: {error}"));
    let outcomes: Vec<Outcome> = report
        .objects()
        .iter()
        .filter(|object| object.name == table)
        .map(|object| object.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [Outcome::Upgraded],
        "migrate reports {table} upgraded"
    );

    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from changefeed.outboxes \
                 where schema_name + N'.' + table_name = N'{table}' and problem is null \
                     and generator_version = changefeed.generator_version();"
            ),
        )
        .await,
        1,
        "{table} was upgraded by the newest generator, with no problem recorded"
    );
    // backlog did not exist before V79: only a regeneration created it.
    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) \
                 where object_id(N'[changefeed].[backlog:{table}]', N'P') is not null;"
            ),
        )
        .await,
        1,
        "{table} has the procedures of the newest templates"
    );
    let claimed = rows_ok(
        &mut admin,
        &format!("exec [changefeed].[claim:{table}] @batch_size = 10, @claim_timeout_ms = 60000;"),
    )
    .await;
    let ids: Vec<&str> = claimed
        .iter()
        .map(|row| required::<&str>(row, "message_id"))
        .collect();
    assert_eq!(ids, ["l1"], "the message enqueued before the upgrade");
    let id: i64 = required(&claimed[0], "id");
    let token: tiberius::Uuid = required(&claimed[0], "claim_token");
    let done = rows_ok(
        &mut admin,
        &format!(
            "exec [changefeed].[mark_done:{table}] @ids = N'[{id}]', @claim_token = '{token}';"
        ),
    )
    .await;
    assert_eq!(required::<i32>(&done[0], "updated"), 1, "l1 acknowledged");

    // And the next template change upgrades it again, by itself.
    let report = rows_ok(&mut admin, "exec changefeed.upgrade_all_feeds;").await;
    let upgraded: Vec<bool> = report
        .iter()
        .filter(|row| required::<&str>(row, "name") == table)
        .map(|row| required::<bool>(row, "upgraded"))
        .collect();
    assert_eq!(upgraded, [true], "upgrade_all_feeds upgrades {table}");
    drop(admin);
    db.drop_database().await;
}

/// What the test wrote and read before the upgrade, to compare with after it.
struct Before {
    /// Outbox-mode feed, shard 0: the (ULID, id) pairs of the first page (saved cursor
    /// after it) and of the second page (read, cursor not saved).
    orders_first_page: Vec<(Ulid, i64)>,
    orders_second_page: Vec<(Ulid, i64)>,
    /// Serialized feed: every event with its ULID, and the cursor saved after the first page.
    ledger_events: Vec<(Ulid, i64)>,
    ledger_cursor: Ulid,
    /// Claim outbox: ids by message id, and the token of the claim still open.
    message_ids: Vec<(String, i64)>,
    open_claim: (i64, tiberius::Uuid),
}

async fn upgrade_scenario(db: &TestDb, from: i32) {
    let mut admin = db.client().await;
    let orders = Feed::new("dbo", "up_orders").expect("a valid feed name");
    let ledger = Feed::new("dbo", "up_ledger").expect("a valid feed name");
    let messages: OutboxStore = "dbo.up_messages".parse().expect("a valid outbox name");

    let before = set_up_at_old_version(&mut admin, &orders, &ledger, from).await;

    // The upgrade itself.
    let report = changefeed::migrations::migrate(&mut admin)
        .await
        .unwrap_or_else(|error| panic!("migrating from V{from} to the newest bundle: {error}"));
    let newest = changefeed::migrations::newest_version();
    assert_eq!(
        report.applied_migrations().len(),
        usize::try_from(newest - from).expect("from is at most the newest version"),
        "the upgrade applies exactly V{} to V{newest}",
        from + 1
    );
    assert_eq!(
        scalar_i64(
            &mut admin,
            &format!(
                "select count_big(*) from {} where version between 1 and {newest};",
                changefeed::migrations::HISTORY_TABLE
            ),
        )
        .await,
        i64::from(newest),
        "the history records every version once"
    );

    check_outbox_feed(db, &mut admin, &orders, &before).await;
    check_serialized_feed(&mut admin, &ledger, &before).await;
    check_claim_outbox(&mut admin, &messages, &before).await;
    check_claim_outbox_objects_regenerated(&mut admin, &messages).await;
    check_cursor_owners_after_upgrade(&mut admin, &orders, &ledger).await;
    check_status_views(&mut admin, &orders, &ledger).await;
    #[cfg(feature = "cli")]
    check_the_cli_names_what_was_skipped(db);
    check_broken_objects_were_skipped(&mut admin, &report, from).await;
}

/// `changefeed migrate` (nothing left to apply, nothing left outdated but the broken
/// objects) names each object the upgrade skipped, with its fix, and succeeds: a broken
/// object waits for a repair, not for a retry.
#[cfg(feature = "cli")]
fn check_the_cli_names_what_was_skipped(db: &TestDb) {
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["migrate", "--url", &db.ado()])
        .env_remove("CHANGEFEED_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the changefeed binary runs");
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("the database is up to date"), "{stdout}");
    assert!(
        stdout.contains("4 objects were skipped as broken"),
        "{stdout}"
    );
    for line in [
        "  feed dbo.up_broken: ",
        "  outbox dbo.up_broken_messages: ",
        "  outbox dbo.up_heap_messages: ",
        "  outbox dbo.up_repaired_messages: ",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
}

// ------------------------------------------------------------------------------------------
// Before: plain SQL against the old version
// ------------------------------------------------------------------------------------------

async fn set_up_at_old_version(
    admin: &mut Client,
    orders: &Feed,
    ledger: &Feed,
    from: i32,
) -> Before {
    // An outbox-mode feed: events 1-6 on shard 0, 101-103 on shard 1.
    exec_ok(
        admin,
        "create table dbo.up_orders (id bigint not null primary key, payload nvarchar(50) null); \
         exec changefeed.setup_feed @table_name = N'dbo.up_orders', @outbox = 1;",
    )
    .await;
    for id in 1..=6 {
        write_order(admin, orders, 0, id).await;
    }
    for id in 101..=103 {
        write_order(admin, orders, 1, id).await;
    }
    // Page 1 (events 1-4) is read and its cursor saved; page 2 (5, 6) is read, so those
    // rows are in the feed with their ULIDs, but the consumer has not saved past them.
    let orders_first_page = read_feed_sql(admin, orders, 0, Ulid(0), 4).await;
    assert_eq!(
        keys_of(&orders_first_page),
        [1, 2, 3, 4],
        "page 1 before the upgrade"
    );
    let saved = orders_first_page[3].0;
    save_cursor_sql(admin, orders, 0, saved).await;
    let orders_second_page = read_feed_sql(admin, orders, 0, saved, 4).await;
    assert_eq!(
        keys_of(&orders_second_page),
        [5, 6],
        "page 2 before the upgrade"
    );
    // Events 7-9 stay in the outbox, not yet moved into the feed, across the upgrade.
    for id in 7..=9 {
        write_order(admin, orders, 0, id).await;
    }

    // A serialized-writer feed: three transactions on shard 0 (events 1-2, 3, 4-5).
    exec_ok(
        admin,
        "create table dbo.up_ledger (id bigint not null primary key, Shard int not null, \
             ULID binary(16) not null, amount int not null); \
         create unique index ux_up_ledger on dbo.up_ledger (Shard, ULID); \
         exec changefeed.setup_feed @table_name = N'dbo.up_ledger', @serialize_writers = 1, \
             @shard_column = N'Shard', @ulid_column = N'ULID';",
    )
    .await;
    for ids in [&[1, 2][..], &[3], &[4, 5]] {
        write_ledger_sql(admin, ledger, ids).await;
    }
    let ledger_events = read_feed_sql(admin, ledger, 0, Ulid(0), 100).await;
    assert_eq!(
        keys_of(&ledger_events),
        [1, 2, 3, 4, 5],
        "the ledger before the upgrade"
    );
    let ledger_cursor = ledger_events[1].0;
    save_cursor_sql(admin, ledger, 0, ledger_cursor).await;
    if from >= FIRST_REGISTER_CONSUMER {
        for feed in [orders, ledger] {
            exec_ok(
                admin,
                &format!(
                    "exec changefeed.register_consumer @consumer = N'{CONSUMER}', @feed = N'{feed}';"
                ),
            )
            .await;
        }
    }

    // A claim outbox: m1, m2 of aggregate a-1, m3 of a-2, m4 of none. The claim gets the
    // heads m1, m3, m4; m1 and m4 are acknowledged, m3 stays claimed over the upgrade.
    exec_ok(
        admin,
        "exec changefeed.setup_outbox @table_name = N'dbo.up_messages';",
    )
    .await;
    let mut message_ids = Vec::new();
    for (message_id, aggregate) in [
        ("m1", "N'a-1'"),
        ("m2", "N'a-1'"),
        ("m3", "N'a-2'"),
        ("m4", "null"),
    ] {
        let rows = rows_ok(
            admin,
            &format!(
                "set xact_abort on; begin transaction; \
                 exec [changefeed].[enqueue:dbo.up_messages] @topic = N'orders', \
                     @payload = N'{{\"n\": \"{message_id}\"}}', @aggregate_type = N'order', \
                     @aggregate_id = {aggregate}, @message_id = N'{message_id}'; \
                 commit transaction;"
            ),
        )
        .await;
        let id: i64 = required(&rows[0], "id");
        message_ids.push((message_id.to_owned(), id));
    }
    let claimed = rows_ok(
        admin,
        &format!(
            "exec [changefeed].[claim:dbo.up_messages] @batch_size = 10, \
             @claim_timeout_ms = {CLAIM_TIMEOUT_MS};"
        ),
    )
    .await;
    let claimed_ids: Vec<String> = claimed
        .iter()
        .map(|row| required::<&str>(row, "message_id").to_owned())
        .collect();
    assert_eq!(
        claimed_ids,
        ["m1", "m3", "m4"],
        "the heads of each aggregate, by id"
    );
    let token: tiberius::Uuid = required(&claimed[0], "claim_token");
    let id_of = |name: &str| {
        message_ids
            .iter()
            .find(|(m, _)| m == name)
            .map(|(_, id)| *id)
            .expect("an enqueued message")
    };
    let done = rows_ok(
        admin,
        &format!(
            "exec [changefeed].[mark_done:dbo.up_messages] @ids = N'[{}, {}]', \
             @claim_token = '{token}';",
            id_of("m1"),
            id_of("m4")
        ),
    )
    .await;
    assert_eq!(
        required::<i32>(&done[0], "updated"),
        2,
        "m1 and m4 acknowledged"
    );
    let open_claim = (id_of("m3"), token);

    set_up_broken_objects(admin).await;

    Before {
        orders_first_page,
        orders_second_page,
        ledger_events,
        ledger_cursor,
        message_ids,
        open_claim,
    }
}

/// Commits order `id` and its outbox row on `shard`.
async fn write_order(client: &mut Client, feed: &Feed, shard: i32, id: i64) {
    exec_ok(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {} (id, payload) values ({id}, N'order {id}'); \
             insert into {} (shard_id, id) values ({shard}, {id}); \
             commit transaction;",
            feed.quoted_table(),
            feed.outbox_table()
        ),
    )
    .await;
}

/// One serialized-writer transaction on shard 0, entirely on the server: lock_feed, then
/// the events numbered with ulid(1), ulid(2), ...
async fn write_ledger_sql(client: &mut Client, feed: &Feed, ids: &[i64]) {
    let values: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("({id}, 0, {}({}), {id})", feed.object("ulid"), i + 1))
        .collect();
    exec_ok(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             declare @ulid binary(16); \
             exec {} @shard_id = 0, @lock_timeout_ms = 10000, @ulid = @ulid output; \
             insert into {} (id, Shard, ULID, amount) values {}; \
             commit transaction;",
            feed.object("lock_feed"),
            feed.quoted_table(),
            values.join(", ")
        ),
    )
    .await;
}

/// One read_feed call as the baseline defines it (keys only, no wait): (ULID, id) pairs.
async fn read_feed_sql(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    cursor: Ulid,
    page_size: i32,
) -> Vec<(Ulid, i64)> {
    rows_ok(
        client,
        &format!(
            "exec {} @shard_id = {shard}, @cursor = {}, @page_size = {page_size};",
            feed.read_feed_procedure(),
            hex(&cursor.to_bytes())
        ),
    )
    .await
    .iter()
    .map(|row| (ulid_of(required::<&[u8]>(row, "ulid")), required(row, "id")))
    .collect()
}

async fn save_cursor_sql(client: &mut Client, feed: &Feed, shard: i32, cursor: Ulid) {
    exec_ok(
        client,
        &format!(
            "exec changefeed.save_cursor @consumer = N'{CONSUMER}', @feed = N'{feed}', \
             @shard_id = {shard}, @cursor = {};",
            hex(&cursor.to_bytes())
        ),
    )
    .await;
}

fn keys_of(pairs: &[(Ulid, i64)]) -> Vec<i64> {
    pairs.iter().map(|(_, key)| *key).collect()
}

// ------------------------------------------------------------------------------------------
// After: the Rust client against the newest version
// ------------------------------------------------------------------------------------------

/// Reads `shard` of `feed` from `from` to the end, in pages of `page_size`.
async fn read_all(client: &mut Client, feed: &Feed, shard: i32, from: Cursor) -> Vec<(Ulid, i64)> {
    let options = ReadOptions::default().page_size(3).wait_ms(0);
    let mut cursor = from;
    let mut rows = Vec::new();
    loop {
        let page = read_page::<i64>(client, feed, shard, cursor, options)
            .await
            .unwrap_or_else(|error| panic!("read_page {feed} shard {shard} at {cursor}: {error}"));
        let full = page.is_full();
        cursor = page.next_cursor;
        rows.extend(page.rows.iter().map(|row| (row.ulid, row.key)));
        if !full {
            return rows;
        }
    }
}

async fn load_cursor(client: &mut Client, feed: &Feed, shard: i32) -> Cursor {
    CursorStore::load(client, CONSUMER, feed, shard)
        .await
        .unwrap_or_else(|error| panic!("load_cursor {feed} shard {shard}: {error}"))
        .unwrap_or_else(|| panic!("the cursor saved for {feed} shard {shard} is gone"))
}

async fn check_outbox_feed(db: &TestDb, admin: &mut Client, orders: &Feed, before: &Before) {
    let saved = load_cursor(admin, orders, 0).await;
    assert_eq!(
        saved.ulid(),
        before.orders_first_page[3].0,
        "the saved cursor survives the upgrade unchanged"
    );

    // Events written after the upgrade: 10 on shard 0, 104 on shard 1.
    write_order(admin, orders, 0, 10).await;
    write_order(admin, orders, 1, 104).await;

    // From the saved cursor: the rows read before (same ULIDs), then 7-9 (moved from the
    // outbox only now) and 10, each once, in ULID order.
    let mut reader = db.client().await;
    let resumed = read_all(&mut reader, orders, 0, saved).await;
    assert_eq!(
        keys_of(&resumed),
        [5, 6, 7, 8, 9, 10],
        "read_feed continues from the saved cursor with no gap and no repeat"
    );
    assert_eq!(
        resumed[..2],
        before.orders_second_page[..],
        "rows moved into the feed before the upgrade keep their ULIDs"
    );
    assert_ulids_increase(&resumed, "shard 0 after the upgrade");

    // The whole shard from the start is the old pages followed by the new rows.
    let everything = read_all(&mut reader, orders, 0, Cursor::START).await;
    let mut expected = before.orders_first_page.clone();
    expected.extend_from_slice(&resumed);
    assert_eq!(
        everything, expected,
        "shard 0 replays identically from the start"
    );

    // Shard 1 was never read: every event, the old ones first.
    let shard1 = read_all(&mut reader, orders, 1, Cursor::START).await;
    assert_eq!(
        keys_of(&shard1),
        [101, 102, 103, 104],
        "shard 1 after the upgrade"
    );
    assert_ulids_increase(&shard1, "shard 1 after the upgrade");

    // Retention works on the upgraded feed: a dry run stops at the consumer's saved cursor
    // (events 5 and 6 were moved before the upgrade, so they are older than the cutoff). The
    // consumer saved before the upgrade was registered by it (V93): it still holds the purge
    // back, though no one registered it (issue 29 item 3).
    let purge = rows_ok(
        admin,
        &format!(
            "exec {} @shard_id = 0, @older_than_ms = 0, @dry_run = 1;",
            orders.object("purge_feed")
        ),
    )
    .await;
    assert_eq!(purge.len(), 1, "one row for shard 0");
    let stopped: &str = required(&purge[0], "stopped_because");
    assert!(
        stopped.contains(CONSUMER),
        "a dry-run purge of shard 0 is held back by {CONSUMER}, got {stopped:?}"
    );

    // The consumer moves on with the new client.
    let last = Cursor::from(resumed[resumed.len() - 1].0);
    CursorStore::save(admin, CONSUMER, orders, 0, last)
        .await
        .expect("save_cursor after the upgrade");
    assert_eq!(load_cursor(admin, orders, 0).await, last);
}

async fn check_serialized_feed(admin: &mut Client, ledger: &Feed, before: &Before) {
    let saved = load_cursor(admin, ledger, 0).await;
    assert_eq!(
        saved.ulid(),
        before.ledger_cursor,
        "the ledger cursor survives"
    );

    // A writer after the upgrade: the Rust lock_feed, then ulid(1) on the server.
    exec_ok(admin, "set xact_abort on; begin transaction;").await;
    let range = lock_feed(admin, ledger, 0, None, Some(Duration::from_secs(10)))
        .await
        .expect("lock_feed after the upgrade");
    let written = rows_ok(
        admin,
        &format!(
            "insert into {} (id, Shard, ULID, amount) output inserted.ULID \
             values (6, 0, {}(1), 6);",
            ledger.quoted_table(),
            ledger.object("ulid")
        ),
    )
    .await;
    exec_ok(admin, "commit transaction;").await;
    let new_ulid = ulid_of(required::<&[u8]>(&written[0], "ULID"));
    assert_eq!(
        new_ulid,
        range.first(),
        "ulid(1) is the first ULID lock_feed reserved"
    );
    let last_before = before.ledger_events[before.ledger_events.len() - 1].0;
    assert!(
        new_ulid > last_before,
        "a ULID reserved after the upgrade ({new_ulid}) comes after every earlier one \
         ({last_before})"
    );

    let resumed = read_all(admin, ledger, 0, saved).await;
    let mut expected = before.ledger_events[2..].to_vec();
    expected.push((new_ulid, 6));
    assert_eq!(
        resumed, expected,
        "the ledger continues from the saved cursor with no gap and no repeat"
    );
}

async fn check_claim_outbox(admin: &mut Client, messages: &OutboxStore, before: &Before) {
    let (open_id, token) = before.open_claim;
    // The claim made before the upgrade is still held and can be acknowledged.
    let acknowledged = messages
        .mark_done(admin, &[open_id], ClaimToken::new(token))
        .await
        .expect("mark_done of a claim made before the upgrade");
    assert_eq!(
        acknowledged, 1,
        "the claim made before the upgrade still holds m3"
    );

    // A message enqueued after the upgrade, then one claim: m2 (now the head of a-1) and m5.
    exec_ok(admin, "set xact_abort on; begin transaction;").await;
    let mut m5 =
        NewMessage::new("orders", serde_json::json!({ "n": "m5" })).aggregate("order", "a-3");
    m5.message_id = Some("m5".to_owned());
    let enqueued = messages
        .enqueue(admin, &m5)
        .await
        .expect("enqueue after the upgrade");
    exec_ok(admin, "commit transaction;").await;
    let newest_old_id = before
        .message_ids
        .iter()
        .map(|(_, id)| *id)
        .max()
        .unwrap_or(0);
    assert!(enqueued.id > newest_old_id, "ids go on after the upgrade");

    let claimed: Vec<ClaimedMessage> = messages
        .claim(admin, 10, Duration::from_secs(60))
        .await
        .expect("claim after the upgrade")
        .into_iter()
        .map(|row| match row {
            Claimed::Message(message) => message,
            Claimed::Undecodable(row) => panic!("a row written before the upgrade: {row:?}"),
        })
        .collect();
    let claimed_ids: Vec<&str> = claimed.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(
        claimed_ids,
        ["m2", "m5"],
        "claim goes on in order after the upgrade"
    );
    assert_eq!(
        claimed[0].payload,
        serde_json::json!({ "n": "m2" }),
        "m2's payload survives"
    );
    let ids: Vec<i64> = claimed.iter().map(|m| m.id).collect();
    assert_eq!(
        messages
            .mark_done(admin, &ids, claimed[0].claim_token)
            .await
            .expect("mark_done after the upgrade"),
        2
    );
    assert_eq!(
        scalar_i64(
            admin,
            &format!(
                "select count_big(*) from {} where status = 2; -- 2: done",
                messages.table().quoted()
            ),
        )
        .await,
        5,
        "all five messages are done, none lost or doubled"
    );

    // The regenerated claim takes a wait: with nothing due it answers empty, after the wait.
    let wait = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let nothing = messages
        .claim_waiting(admin, 10, Duration::from_secs(60), wait)
        .await
        .expect("a waiting claim after the upgrade");
    assert!(nothing.is_empty(), "{nothing:?}");
    // Less a millisecond: the server's deadline is rounded to datetime2(3).
    assert!(
        started.elapsed() >= wait - Duration::from_millis(1),
        "{:?}",
        started.elapsed()
    );
}

/// The claim outbox's objects that the migrations after the baseline changed are the new
/// ones, by object (issue 19 items 8, 11, 16): each generated procedure carries what only its
/// new template has.
async fn check_claim_outbox_objects_regenerated(admin: &mut Client, messages: &OutboxStore) {
    let table = messages.table().to_string();
    for (kind, marker) in [
        // The aggregate lock held across the insert (item 16) and the SET options check (11).
        ("enqueue", "changefeed:enqueue-aggregate:"),
        ("enqueue", "sessionproperty(N'NUMERIC_ROUNDABORT')"),
        // Lengths in UTF-16 units (item 8).
        ("enqueue", "datalength(@message_id) / 2 > 64"),
        // The ordering argument that covers an insert waiting after its id (item 16).
        ("claim", "No row is invisible to the dirty read"),
        // Each claim stores its own expiry (issue 18, 5b).
        ("claim", "claim_expires_at = @expires_at"),
        // The claim waits for work between its own transactions (issue 20, item 2).
        ("claim", "exec changefeed.pause_wait"),
        // Every outbox gains its backlog procedure (issue 22).
        ("backlog", "datediff_big(millisecond, @oldest_at"),
        // The claim's update and the acknowledgements seek their rows only (issue 29, 2).
        ("claim", "with (rowlock, index(1))"),
        ("mark_done", "option (force order, loop join)"),
        ("mark_failed", "with (index(1))"),
        ("requeue", "with (index(1))"),
    ] {
        let name = format!("[changefeed].[{kind}:{table}]");
        let found = scalar_i64(
            admin,
            &format!(
                "select count_big(*) \
                 where charindex(N'{}', object_definition(object_id(N'{}'))) > 0;",
                marker.replace('\'', "''"),
                name.replace('\'', "''")
            ),
        )
        .await;
        assert_eq!(
            found, 1,
            "{name} was regenerated from the new template ({marker})"
        );
    }

    // The outbox table got the claim's expiry column, and open_messages includes it
    // (create_outbox_storage, run on every registered outbox by the migration).
    assert_claim_expiry_in_open_messages(admin, messages).await;
}

/// `outbox` has `claim_expires_at`, included in its `open_messages` index, as
/// `create_outbox_storage` makes them.
async fn assert_claim_expiry_in_open_messages(admin: &mut Client, outbox: &OutboxStore) {
    let quoted = outbox.table().quoted();
    assert_eq!(
        scalar_i64(
            admin,
            &format!(
                "select count_big(*) from sys.index_columns as ic \
                 inner join sys.indexes as i \
                     on i.object_id = ic.object_id and i.index_id = ic.index_id \
                 inner join sys.columns as c \
                     on c.object_id = ic.object_id and c.column_id = ic.column_id \
                 where i.object_id = object_id(N'{quoted}') and i.name = N'open_messages' \
                     and c.name = N'claim_expires_at' and ic.is_included_column = 1;"
            ),
        )
        .await,
        1,
        "{quoted} has claim_expires_at, included in open_messages"
    );
}

/// The cursor objects after the upgrade (issue 19, items 2 and 3): the consumer saved before
/// it has no owner until its next save, which binds it to the saving user (the admin saved
/// the orders cursor after the upgrade, not the ledger's); consumer_lag shows the owner;
/// remove_consumer exists.
async fn check_cursor_owners_after_upgrade(admin: &mut Client, orders: &Feed, ledger: &Feed) {
    let owner_of = async |admin: &mut Client, feed: &Feed| {
        let found = rows_ok(
            admin,
            &format!(
                "select owner from changefeed.consumer_lag \
                 where consumer = N'{CONSUMER}' and feed = N'{feed}' and shard_id = 0;"
            ),
        )
        .await;
        assert_eq!(
            found.len(),
            1,
            "{CONSUMER}'s cursor of {feed} is in consumer_lag"
        );
        found[0].get::<&str, _>(0).map(str::to_owned)
    };
    assert_eq!(
        owner_of(admin, ledger).await,
        None,
        "not saved since the upgrade"
    );
    let admin_user = rows_ok(admin, "select user_name();").await[0]
        .get::<&str, _>(0)
        .map(str::to_owned);
    assert_eq!(
        owner_of(admin, orders).await,
        admin_user,
        "bound by its save"
    );
    assert_eq!(
        scalar_i64(
            admin,
            "select count_big(*) where object_id(N'changefeed.remove_consumer', N'P') is not null;",
        )
        .await,
        1,
        "remove_consumer exists"
    );
    // parse_feed_name counts UTF-16 units (issue 19, item 8).
    assert_eq!(
        scalar_i64(
            admin,
            "select count_big(*) where charindex(N'datalength(@table_name) / 2 <= 128', \
             object_definition(object_id(N'changefeed.parse_feed_name'))) > 0;",
        )
        .await,
        1,
        "parse_feed_name is the new version"
    );
}

async fn check_status_views(admin: &mut Client, orders: &Feed, ledger: &Feed) {
    let status = rows_ok(
        admin,
        &format!(
            "select feed, shard_id, outbox_depth from changefeed.feed_status \
             where feed in (N'{orders}', N'{ledger}') order by feed, shard_id;"
        ),
    )
    .await;
    let shown: Vec<(String, i32, Option<i64>)> = status
        .iter()
        .map(|row| {
            (
                required::<&str>(row, "feed").to_owned(),
                required(row, "shard_id"),
                row.try_get::<i64, &str>("outbox_depth")
                    .expect("outbox_depth is a bigint"),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (ledger.to_string(), 0, None),
            (orders.to_string(), 0, Some(0)),
            (orders.to_string(), 1, Some(0)),
        ],
        "feed_status shows every shard of both feeds, with the outboxes drained"
    );

    let lag = rows_ok(
        admin,
        &format!(
            "select feed, shard_id, expired, holds_retention from changefeed.consumer_lag \
             where consumer = N'{CONSUMER}' order by feed, shard_id;"
        ),
    )
    .await;
    let shown: Vec<(String, i32, bool, bool)> = lag
        .iter()
        .map(|row| {
            (
                required::<&str>(row, "feed").to_owned(),
                required(row, "shard_id"),
                required(row, "expired"),
                required(row, "holds_retention"),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (ledger.to_string(), 0, false, true),
            (orders.to_string(), 0, false, true)
        ],
        "consumer_lag shows both saved cursors, neither expired, both holding retention back \
         (registered by the upgrade, or by the setup at a version with registrations)"
    );
}

fn assert_ulids_increase(rows: &[(Ulid, i64)], what: &str) {
    for pair in rows.windows(2) {
        assert!(
            pair[0].0 < pair[1].0,
            "{what}: ULIDs must strictly increase, got {} then {}",
            pair[0].0,
            pair[1].0
        );
    }
}

// ------------------------------------------------------------------------------------------
// A broken feed and a broken outbox across the upgrade (issue 19, item 5)
// ------------------------------------------------------------------------------------------

/// A feed whose key column `id` is then renamed `order_id`, and a claim outbox whose
/// `payload` column is then renamed `body`: regenerating either fails to compile (Msg 207).
/// Another claim outbox whose `trace_id` and `last_error` are then renamed (Msg 207 too).
/// And a claim outbox whose clustered primary key is then dropped (a heap): the code of
/// V83 on reads it by hint (`INDEX(1)`), which a heap cannot satisfy; it holds one pending
/// message.
async fn set_up_broken_objects(admin: &mut Client) {
    exec_ok(
        admin,
        "create table dbo.up_broken (id bigint not null primary key, payload nvarchar(50) null); \
         exec changefeed.setup_feed @table_name = N'dbo.up_broken', @outbox = 1; \
         exec changefeed.setup_outbox @table_name = N'dbo.up_broken_messages'; \
         exec sp_rename N'dbo.up_broken.id', N'order_id', N'COLUMN'; \
         exec sp_rename N'dbo.up_broken_messages.payload', N'body', N'COLUMN'; \
         exec changefeed.setup_outbox @table_name = N'dbo.up_heap_messages'; \
         alter table dbo.up_heap_messages drop constraint [up_heap_messages:pk]; \
         insert into dbo.up_heap_messages (topic, payload) values (N'heap', N'{\"n\": 1}');",
    )
    .await;
    // Issue 29 item 6: an outbox with one pending message, two of whose columns are then
    // renamed; repaired only after the upgrade (check_repaired_outbox_upgrades).
    exec_ok(
        admin,
        "exec changefeed.setup_outbox @table_name = N'dbo.up_repaired_messages'; \
         set xact_abort on; begin transaction; \
         exec [changefeed].[enqueue:dbo.up_repaired_messages] @topic = N'repaired', \
             @payload = N'{\"n\": \"r1\"}', @aggregate_type = N'order', \
             @aggregate_id = N'r-1', @message_id = N'r1'; \
         commit transaction; \
         exec sp_rename N'dbo.up_repaired_messages.trace_id', N'trace', N'COLUMN'; \
         exec sp_rename N'dbo.up_repaired_messages.last_error', N'error_text', N'COLUMN';",
    )
    .await;
}

/// The regeneration after the migrations skipped the broken feed and outboxes, reported
/// them in `migrate`'s report and recorded why; it regenerated every other object (the
/// checks above, and the report).
async fn check_broken_objects_were_skipped(
    admin: &mut Client,
    report: &MigrationReport,
    from: i32,
) {
    let reported = |outcome| -> BTreeSet<String> {
        report
            .with_outcome(outcome)
            .map(|object| format!("{} {}", object.kind, object.name))
            .collect()
    };
    let named = |names: &[&str]| -> BTreeSet<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    };
    assert_eq!(
        reported(Outcome::Broken),
        named(&[
            "feed dbo.up_broken",
            "outbox dbo.up_broken_messages",
            "outbox dbo.up_heap_messages",
            "outbox dbo.up_repaired_messages"
        ]),
        "migrate reports exactly the broken feed and outboxes as broken"
    );
    assert_eq!(
        reported(Outcome::Upgraded),
        named(&[
            "feed dbo.up_orders",
            "feed dbo.up_ledger",
            "outbox dbo.up_messages"
        ]),
        "and every other object as upgraded: {:?}",
        report.objects()
    );
    assert_eq!(report.objects().len(), 7, "{:?}", report.objects());
    assert!(
        report
            .with_outcome(Outcome::Broken)
            .all(|object| object.problem.as_deref().is_some_and(|p| !p.is_empty())),
        "every broken object comes with its problem: {:?}",
        report.objects()
    );
    let feed_problem = problem_of(admin, "feeds", "up_broken").await;
    assert!(
        feed_problem.contains("[id] is now [order_id]")
            && feed_problem.contains("teardown_feed @table_name = N'dbo.up_broken'"),
        "the broken feed's problem names the renamed key column and the fix: {feed_problem}"
    );
    let outbox_problem = problem_of(admin, "outboxes", "up_broken_messages").await;
    assert!(
        outbox_problem.contains("[payload]")
            && outbox_problem.contains("upgrade_outbox @table_name = N'dbo.up_broken_messages'"),
        "the broken outbox's problem names the missing column and the fix: {outbox_problem}"
    );
    let heap_problem = problem_of(admin, "outboxes", "up_heap_messages").await;
    assert!(
        heap_problem.contains("no unique clustered index on (id)")
            && heap_problem.contains("upgrade_outbox @table_name = N'dbo.up_heap_messages'"),
        "the heap outbox's problem names the index and the fix: {heap_problem}"
    );
    check_skipped_heap_outbox_still_works(admin, from).await;
    let with_problems = scalar_i64(
        admin,
        "select count_big(*) from changefeed.feeds where problem is not null; ",
    )
    .await
        + scalar_i64(
            admin,
            "select count_big(*) from changefeed.outboxes where problem is not null;",
        )
        .await;
    assert_eq!(
        with_problems, 4,
        "only the four broken objects have a problem"
    );
    check_repaired_outbox_upgrades(admin, from).await;
    // Asked for directly, upgrade_feed refuses the broken feed before regenerating anything.
    let refused = common::exec(
        admin,
        "exec changefeed.upgrade_feed @table_name = N'dbo.up_broken';",
    )
    .await
    .expect_err("upgrade_feed of a feed whose key column was renamed");
    assert_eq!(refused.server_number(), Some(51014), "got {refused}");

    // The working feeds run the regenerated read_feed: the serial, ULID-ordered feed insert
    // (outbox mode) and the #read check (both modes).
    for (procedure, must_contain) in [
        (
            "[changefeed].[read_feed:dbo.up_orders]",
            &["option (maxdop 1)", "changefeed.check_read_table"][..],
        ),
        (
            "[changefeed].[read_feed:dbo.up_ledger]",
            &["changefeed.check_read_table"][..],
        ),
    ] {
        let definition = rows_ok(
            admin,
            &format!("select object_definition(object_id(N'{procedure}')) as definition;"),
        )
        .await;
        let definition: &str = required(&definition[0], "definition");
        for text in must_contain {
            assert!(
                definition.contains(text),
                "{procedure} was regenerated from the current template ({text})"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Which versions to start from (no server needed)
// ------------------------------------------------------------------------------------------

/// Every migration after the baseline that changes a template or a generator has the
/// version before it in [`FROM_VERSIONS`], and every from-version is a real version of
/// the bundle, at or after the baseline.
#[test]
fn from_versions_cover_every_template_change() {
    let newest = changefeed::migrations::newest_version();
    let last_frozen = include_str!("frozen_migrations.txt")
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse::<i32>().ok())
        .max();
    assert_eq!(
        last_frozen,
        Some(BASELINE),
        "BASELINE must be the last frozen version (tests/frozen_migrations.txt)"
    );
    assert!(
        FROM_VERSIONS.windows(2).all(|pair| pair[0] < pair[1]),
        "FROM_VERSIONS must be ascending without repeats: {FROM_VERSIONS:?}"
    );
    for &from in FROM_VERSIONS {
        assert!(
            (BASELINE..=newest).contains(&from),
            "from-version {from} must be between the baseline V{BASELINE} and the newest \
             V{newest}"
        );
    }
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
    for (version, name) in changefeed::migrations::bundle() {
        if version <= BASELINE {
            continue;
        }
        let path = format!("{directory}/V{version}__{name}.sql");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("read {path}: {error}"));
        if text.contains("__template") {
            assert!(
                FROM_VERSIONS.contains(&(version - 1)),
                "V{version}__{name}.sql changes a template: add {} to FROM_VERSIONS in \
                 tests/live_upgrade.rs, so that the upgrade test starts from the database as it \
                 stood just before it",
                version - 1
            );
        }
    }
}

/// The outbox the upgrade skipped for its dropped primary key kept its old code, which names
/// no index, so it works as before: its pending message is claimed and acknowledged. (Set up
/// at V83 or later, its code already seeks by the hint, and only the repair brings it back.)
/// upgrade_outbox refuses it (51016) until the key is back.
async fn check_skipped_heap_outbox_still_works(admin: &mut Client, from: i32) {
    let heap: OutboxStore = "dbo.up_heap_messages".parse().expect("a valid outbox name");
    let refused = common::exec(
        admin,
        "exec changefeed.upgrade_outbox @table_name = N'dbo.up_heap_messages';",
    )
    .await
    .expect_err("upgrade_outbox of an outbox without its clustered primary key");
    assert_eq!(refused.server_number(), Some(51016), "got {refused}");
    if from >= FIRST_SEEK_HINT {
        return;
    }
    let claimed = claim_decoded(admin, &heap, "claim with the skipped outbox's old code").await;
    assert_eq!(claimed.len(), 1, "its one pending message: {claimed:?}");
    assert_eq!(
        heap.mark_done(admin, &[claimed[0].id], claimed[0].claim_token)
            .await
            .expect("mark_done with the skipped outbox's old code"),
        1
    );
}

/// One claim of up to ten messages from `outbox` (held for a minute), each of which must
/// decode; `what` names the call in a failure.
async fn claim_decoded(
    admin: &mut Client,
    outbox: &OutboxStore,
    what: &str,
) -> Vec<ClaimedMessage> {
    outbox
        .claim(admin, 10, Duration::from_secs(60))
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .into_iter()
        .map(|row| match row {
            Claimed::Message(message) => message,
            Claimed::Undecodable(row) => panic!("{what}: an undecodable row {row:?}"),
        })
        .collect()
}

/// Issue 29 item 6 (a): the outbox whose `trace_id` and `last_error` were renamed. Its
/// problem names both (and, set up before V61, says that upgrade_outbox adds the
/// `claim_expires_at` it lacks: the migration adding that column skipped it as broken);
/// upgrade_outbox refuses it with that text until it is repaired. Repaired as the text
/// says, `upgrade_outbox` alone brings it up to date: it gets `claim_expires_at` (in
/// `open_messages` too), its problem is cleared, and its message written before the upgrade
/// is claimed and acknowledged by the new code.
async fn check_repaired_outbox_upgrades(admin: &mut Client, from: i32) {
    let name = "dbo.up_repaired_messages";
    let problem = problem_of(admin, "outboxes", "up_repaired_messages").await;
    assert!(
        problem.contains("lacks the columns [trace_id], [last_error],")
            && problem.contains(&format!("upgrade_outbox @table_name = N'{name}'")),
        "the problem names every missing column and the fix: {problem}"
    );
    assert_eq!(
        problem.contains("claim_expires_at, which it lacks too, upgrade_outbox adds itself"),
        from < FIRST_CLAIM_EXPIRY,
        "the problem says claim_expires_at is missing exactly when it is: {problem}"
    );
    let upgrade = format!("exec changefeed.upgrade_outbox @table_name = N'{name}';");
    let refused = common::exec(admin, &upgrade)
        .await
        .expect_err("upgrade_outbox of an outbox with renamed columns");
    assert_eq!(refused.server_number(), Some(51016), "got {refused}");
    assert!(
        refused.to_string().contains("[trace_id], [last_error]"),
        "the refusal is the problem: {refused}"
    );

    exec_ok(
        admin,
        &format!(
            "exec sp_rename N'{name}.trace', N'trace_id', N'COLUMN'; \
             exec sp_rename N'{name}.error_text', N'last_error', N'COLUMN'; {upgrade}"
        ),
    )
    .await;

    let repaired: OutboxStore = name.parse().expect("a valid outbox name");
    assert_claim_expiry_in_open_messages(admin, &repaired).await;
    assert_eq!(
        scalar_i64(
            admin,
            "select count_big(*) from changefeed.outboxes \
             where table_name = N'up_repaired_messages' and problem is null \
                 and generator_version = changefeed.generator_version();",
        )
        .await,
        1,
        "upgrade_outbox cleared the problem and recorded the newest generator"
    );
    let claimed = claim_decoded(admin, &repaired, "claim from the repaired outbox").await;
    let ids: Vec<&str> = claimed.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["r1"], "the message written before the upgrade");
    assert_eq!(
        repaired
            .mark_done(admin, &[claimed[0].id], claimed[0].claim_token)
            .await
            .expect("mark_done on the repaired outbox"),
        1
    );
}

/// The `problem` a registry (`changefeed.feeds` or `changefeed.outboxes`) holds for the
/// table named `table_name`.
async fn problem_of(admin: &mut Client, registry: &str, table_name: &str) -> String {
    let rows = rows_ok(
        admin,
        &format!("select problem from changefeed.{registry} where table_name = N'{table_name}';"),
    )
    .await;
    required::<&str>(&rows[0], "problem").to_owned()
}
