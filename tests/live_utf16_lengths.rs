//! Lengths counted the way SQL Server stores them (issue 19, item 8), in a database whose
//! default collation is `Latin1_General_100_CI_AS_SC_UTF8`: there `len()` counts a
//! character outside the Basic Multilingual Plane (an emoji, a UTF-16 surrogate pair) once,
//! while `nvarchar(n)` columns and identifiers count two UTF-16 code units for it. Every
//! length check of the bundle must count what the column or identifier counts, so that a
//! value that is too long is refused with the bundle's error, never cut or failed with Msg
//! 2628 inside the caller's transaction.
//!
//! It needs SQL Server 2019 or later (UTF-8 collations), through `CHANGEFEED_TEST_MSSQL` or
//! Docker, and is `#[ignore]`d: `cargo test --test live_utf16_lengths -- --ignored`. It runs
//! with READ_COMMITTED_SNAPSHOT off and on, each in a database of its own.

mod common;

use changefeed::outbox::NewMessage;
use changefeed::outbox_store::OutboxStore;
use changefeed::{Client, Feed};
use common::events::create_feed;
use common::{ISOLATIONS, TestDb, exec, scalar_i64};
use serde_json::json;

const COLLATION: &str = "Latin1_General_100_CI_AS_SC_UTF8";
/// One character, two UTF-16 code units.
const EMOJI: &str = "\u{1F600}";

#[track_caller]
fn assert_server_error<T: std::fmt::Debug>(result: changefeed::Result<T>, number: u32, what: &str) {
    match result {
        Ok(value) => panic!("{what}: expected error {number}, got Ok({value:?})"),
        Err(error) => assert_eq!(
            error.server_number(),
            Some(number),
            "{what}: expected error {number}, got {error}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server 2019 or later: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn lengths_are_checked_in_utf16_units_under_a_supplementary_character_collation() {
    for isolation in ISOLATIONS {
        let db = TestDb::create_collated("utf16_lengths", isolation, COLLATION).await;
        eprintln!("-- utf16_lengths: {isolation:?} in {}", db.name);
        scenario(&db).await;
        db.drop_database().await;
    }
}

async fn scenario(db: &TestDb) {
    let mut client = db.client().await;
    // The premise: here len() counts an emoji once, datalength four bytes.
    assert_eq!(
        scalar_i64(
            &mut client,
            &format!("select len(N'{EMOJI}') * 10 + datalength(N'{EMOJI}');")
        )
        .await,
        14,
        "the database's collation is a supplementary-character one"
    );
    enqueue_lengths(&mut client).await;
    cursor_lengths(&mut client).await;
    feed_name_lengths(&mut client).await;
}

/// message_id is nvarchar(64): 32 emoji fit, 33 (66 units, 33 by len()) are refused with
/// 51304 and leave the caller's transaction as the bundle's errors do, not with Msg 2628.
async fn enqueue_lengths(client: &mut Client) {
    exec(
        client,
        "exec changefeed.setup_outbox @table_name = N'dbo.utf16_outbox';",
    )
    .await
    .expect("setup_outbox");
    let store: OutboxStore = "dbo.utf16_outbox".parse().expect("a valid outbox name");
    let keyed = |units: usize| NewMessage {
        message_id: Some(EMOJI.repeat(units / 2)),
        ..NewMessage::new("orders", json!({ "n": units }))
    };

    exec(client, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    let fits = store
        .enqueue(client, &keyed(64))
        .await
        .expect("a message_id of 64 units");
    exec(client, "commit transaction;").await.unwrap();
    assert_eq!(fits.message_id, EMOJI.repeat(32), "stored whole");

    exec(client, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    assert_server_error(
        store.enqueue(client, &keyed(66)).await,
        51304,
        "a message_id of 66 units",
    );
    assert_eq!(scalar_i64(client, "select @@trancount;").await, 0);
    // An aggregate id of 129 emoji (258 units, 129 by len()) too.
    exec(client, "set xact_abort on; begin transaction;")
        .await
        .unwrap();
    let long_aggregate = NewMessage::new("orders", json!({})).aggregate("order", EMOJI.repeat(129));
    assert_server_error(
        store.enqueue(client, &long_aggregate).await,
        51304,
        "an aggregate_id of 258 units",
    );
    assert_eq!(
        scalar_i64(client, "select count_big(*) from dbo.utf16_outbox;").await,
        1,
        "only the message that fits was stored"
    );
}

/// consumer is nvarchar(200): 100 emoji fit, 101 are refused (51110) instead of cut.
async fn cursor_lengths(client: &mut Client) {
    let feed = create_feed(client, "utf16_events").await;
    let save = |units: usize| {
        format!(
            "exec changefeed.save_cursor @consumer = N'{}', @feed = N'{feed}', @shard_id = 0, \
             @cursor = 0x00000000000000000000000000000001;",
            EMOJI.repeat(units / 2)
        )
    };
    exec(client, &save(200))
        .await
        .expect("a consumer name of 200 units");
    assert_server_error(
        exec(client, &save(202)).await,
        51110,
        "a consumer name of 202 units",
    );
    assert_eq!(
        scalar_i64(
            client,
            "select count_big(*) from changefeed.consumer_cursor;"
        )
        .await,
        1
    );
}

/// Schema and table together take at most 108 units: "dbo" and 52 emoji (107 units) can be
/// a feed; 53 emoji (109 units, 56 by len()) are refused with 51000, since the generated
/// names (the 19-unit role prefix, the dot, the name) would pass 128.
async fn feed_name_lengths(client: &mut Client) {
    for (emoji, accepted) in [(52, true), (53, false)] {
        let table = EMOJI.repeat(emoji);
        exec(
            client,
            &format!("create table dbo.[{table}] (id int not null primary key);"),
        )
        .await
        .expect("create the table");
        let setup = exec(
            client,
            &format!("exec changefeed.setup_feed @table_name = N'dbo.{table}', @outbox = 1;"),
        )
        .await;
        if accepted {
            setup.expect("a name of 107 units");
            let feed = Feed::new("dbo", &table).expect("the Rust rule agrees");
            let role = scalar_i64(
                client,
                &format!(
                    "select count_big(*) where database_principal_id(N'{}') is not null;",
                    &feed.readers_role()[1..feed.readers_role().len() - 1]
                ),
            )
            .await;
            assert_eq!(role, 1, "the readers role of 127 units was created");
        } else {
            assert_server_error(setup, 51000, "a name of 109 units");
            assert!(Feed::new("dbo", &table).is_err(), "the Rust rule agrees");
        }
    }
}
