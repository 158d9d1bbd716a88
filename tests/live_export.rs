//! Live test of the Kafka exporter: a feed with a composite key on a real SQL Server,
//! exported to librdkafka's in-process mock cluster with its cursors in
//! `changefeed.consumer_cursor`.
//!
//! It needs a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and is
//! `#[ignore]`d: run it with `cargo test --features kafka --test live_export -- --ignored`.
//! The scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of
//! its own. Every wait is bounded, so a stuck export fails the test instead of hanging it.

mod common;
mod common_kafka;
#[path = "kafka_exporter/mock.rs"]
mod mock;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use changefeed::kafka::{ExportConfig, ExportReport, FeedExporter};
use changefeed::reader::{FeedReader, FeedReaderOptions, Wait, key_columns};
use changefeed::{Client, Cursor, CursorStore, Error, Feed};
use common::TestDb;
use common::events::{exec_ok, feed_reader, required, rows_ok};
use common::logins::{Login, drop_logins};
use common::tasks::{bounded, close};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use ulid::Ulid;

/// The longest an export may take to reach the events it waits for.
const EXPORT_LIMIT: Duration = Duration::from_secs(120);

/// The consumer the exporter saves its cursors as.
const CONSUMER: &str = "kafka-export";

/// The topic of the mock cluster.
const TOPIC: &str = "orders";

/// Shard `n` holds the orders of region `REGIONS[n]`.
const REGIONS: [&str; 3] = ["eu", "us", "ap"];

common::live_test!(a_composite_key_feed_is_exported_with_its_cursors_and_resumes_without_gap: "export_composite" => export_scenario);

common::live_test!(an_unknown_feed_fails_at_connect: "export_unknown_feed" => unknown_feed_scenario);

/// `dbo.Orders (Region, OrderId)` as an outbox-mode feed; 30 orders over three shards, one
/// of them deleted before it is read. The export must produce the 29 others once each, with
/// the key `{"Region":…,"OrderId":…}` in key order, the row as the value, the `ulid`,
/// `shard` and `feed` headers of the feed table's rows, and save each shard's last ULID
/// under the consumer. After a clean stop and 15 more orders, a new exporter resumes from
/// the saved cursors: the topic then holds every live order exactly once.
async fn export_scenario(db: &TestDb) {
    let mut admin = db.client().await;
    exec_ok(
        &mut admin,
        "create table dbo.Orders ( \
             Region nvarchar(10) not null, \
             OrderId bigint not null, \
             Total decimal(10, 2) not null, \
             Note nvarchar(50) null, \
             constraint Orders_pk primary key (Region, OrderId));",
    )
    .await;
    exec_ok(
        &mut admin,
        "exec changefeed.setup_feed @table_name = N'dbo.Orders', @outbox = 1;",
    )
    .await;
    let feed: Feed = "dbo.Orders".parse().expect("a valid feed name");

    // The key columns come from read_feed alone: a login in the readers role reads them.
    let login = Login::new("export_reader", db);
    login.create(&mut admin, &[feed.readers_role()], &[]).await;
    let mut as_reader = login.connect(db).await;
    assert_eq!(
        key_columns(&mut as_reader, &feed)
            .await
            .expect("the key columns"),
        ["Region", "OrderId"],
        "the key columns, in key order (not alphabetical)"
    );
    close(as_reader).await;
    drop_logins(db, &[&login]).await;

    for order in 0..10 {
        for shard in 0..3 {
            write_order(&mut admin, &feed, shard, order).await;
        }
    }
    // Deleted after it was written: read_feed returns its ULID with NULLs, nothing to export.
    exec_ok(
        &mut admin,
        "delete from dbo.Orders where Region = N'eu' and OrderId = 4;",
    )
    .await;

    let reader = feed_reader(
        db,
        &feed,
        8,
        FeedReaderOptions::default().wait(Wait::LongPoll(Duration::from_millis(300))),
    )
    .await;
    let cluster = mock::cluster(TOPIC);
    let bootstrap = cluster.bootstrap_servers();

    // First run: from the start, 30 events (one deleted), pages of 4.
    let report = export(&reader, &bootstrap, 30).await;
    assert_eq!(report.exported, 29, "every live event, once");
    let fed = feed_table(&mut admin).await;
    assert_eq!(fed.len(), 30, "every order has its ULID");
    check_saved(&mut admin, &feed, &fed, &report).await;
    let received = mock::consume_all(&bootstrap, TOPIC).await;
    assert_eq!(received.len(), 29);
    check_messages(&received, &fed);

    // Second run: 15 more orders; a new exporter resumes from the saved cursors.
    for order in 10..15 {
        for shard in 0..3 {
            write_order(&mut admin, &feed, shard, order).await;
        }
    }
    let report = export(&reader, &bootstrap, 15).await;
    assert_eq!(
        report.exported, 15,
        "only the new events: it resumed where it stopped"
    );
    let fed = feed_table(&mut admin).await;
    assert_eq!(fed.len(), 45);
    check_saved(&mut admin, &feed, &fed, &report).await;
    let received = mock::consume_all(&bootstrap, TOPIC).await;
    assert_eq!(
        received.len(),
        44,
        "no gap, no duplicate after a clean stop"
    );
    check_messages(&received, &fed);
}

/// A reader of a feed that does not exist: `connect` fails with SQL Server's 2812 and says
/// what is wrong, before anything is produced.
async fn unknown_feed_scenario(db: &TestDb) {
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");
    let feed: Feed = "dbo.NoSuchFeed".parse().expect("a valid feed name");
    let reader = FeedReader::new(pool, feed);
    let cluster = mock::cluster(TOPIC);
    let producer = mock::producer(&cluster.bootstrap_servers(), &[]);
    let outcome =
        FeedExporter::connect(&reader, producer, ExportConfig::new(TOPIC, CONSUMER)).await;
    let Err(error) = outcome else {
        panic!("connect to an unknown feed succeeded");
    };
    assert_eq!(error.server_number(), Some(2812), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("dbo.NoSuchFeed") && message.contains("does not exist"),
        "{message}"
    );
    assert!(matches!(error, Error::Server { .. }));
}

/// Commits order `order` of shard `shard`'s region and its outbox row in one transaction,
/// as an application would. Odd orders carry a note, even ones NULL.
async fn write_order(client: &mut Client, feed: &Feed, shard: i32, order: i64) {
    let region = REGIONS[shard as usize];
    let note = if order % 2 == 1 {
        format!("N'note {order}'")
    } else {
        "null".to_owned()
    };
    exec_ok(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {} (Region, OrderId, Total, Note) values (N'{region}', {order}, {order}.50, {note}); \
             insert into {} (shard_id, Region, OrderId) values ({shard}, N'{region}', {order}); \
             commit transaction;",
            feed.quoted_table(),
            feed.outbox_table()
        ),
    )
    .await;
}

/// Runs an exporter over shards 0-2 from the saved cursors (else the start) until `events`
/// events were exported or skipped, then shuts it down and returns its report.
async fn export(reader: &FeedReader, bootstrap: &str, events: u64) -> ExportReport {
    let producer = mock::producer(bootstrap, &[]);
    let exporter = FeedExporter::connect(
        reader,
        producer,
        ExportConfig::new(TOPIC, CONSUMER).page_size(4),
    )
    .await
    .expect("the exporter connects");
    let progress = exporter.progress();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(exporter.run(vec![0, 1, 2], Cursor::START, async move {
        let _ = stopped.await;
    }));
    bounded("the export", EXPORT_LIMIT, async {
        loop {
            let done = progress.snapshot();
            if done.exported + done.skipped_deleted >= events {
                break;
            }
            assert!(!run.is_finished(), "the export ended early, after {done:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let _ = shutdown.send(());
    bounded("the export's stop", EXPORT_LIMIT, run)
        .await
        .expect("the export task does not panic")
        .expect("the export stops cleanly")
}

/// One row of the feed table: where an order is in the feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fed {
    shard: i32,
    ulid: Ulid,
    /// Whether the order's row still exists (a deleted one is not exported).
    live: bool,
}

/// The feed table, by (Region, OrderId).
async fn feed_table(client: &mut Client) -> BTreeMap<(String, i64), Fed> {
    let rows = rows_ok(
        client,
        "select f.shard_id, f.ulid, f.Region, f.OrderId, \
             case when o.OrderId is null then 0 else 1 end as live \
         from [changefeed].[feed:dbo.Orders] as f \
         left join dbo.Orders as o on o.Region = f.Region and o.OrderId = f.OrderId;",
    )
    .await;
    rows.iter()
        .map(|row| {
            let ulid: &[u8] = required(row, "ulid");
            let ulid = Ulid::from_bytes(ulid.try_into().expect("a 16-byte ULID"));
            let region: &str = required(row, "Region");
            let order: i64 = required(row, "OrderId");
            let live: i32 = required(row, "live");
            (
                (region.to_owned(), order),
                Fed {
                    shard: required(row, "shard_id"),
                    ulid,
                    live: live == 1,
                },
            )
        })
        .collect()
}

/// Each shard's saved cursor, in `consumer_cursor` and in the report, is its last ULID in
/// the feed table.
async fn check_saved(
    client: &mut Client,
    feed: &Feed,
    fed: &BTreeMap<(String, i64), Fed>,
    report: &ExportReport,
) {
    let mut expected = Vec::new();
    for shard in 0..3 {
        let last = fed
            .values()
            .filter(|row| row.shard == shard)
            .map(|row| row.ulid)
            .max()
            .expect("the shard has events");
        let saved = CursorStore::load(client, CONSUMER, feed, shard)
            .await
            .expect("load the saved cursor");
        assert_eq!(
            saved,
            Some(Cursor::from_ulid(last)),
            "shard {shard}'s cursor"
        );
        expected.push((shard, Cursor::from_ulid(last)));
    }
    assert_eq!(report.saved, expected, "the report's cursors");
}

/// Every live order is in the topic exactly once, no deleted one is, and each message has
/// the key, value and headers of its row in the feed table; per partition and shard, ULIDs
/// increase.
fn check_messages(received: &[mock::Received], fed: &BTreeMap<(String, i64), Fed>) {
    let mut seen = BTreeSet::new();
    let mut last: BTreeMap<(i32, i32), Ulid> = BTreeMap::new();
    for message in received {
        assert!(seen.insert(message.ulid), "{} came twice", message.ulid);
        let Value::Object(value) = &message.value else {
            panic!("the value is a JSON object: {message:?}");
        };
        let region = value["Region"].as_str().expect("Region").to_owned();
        let order = value["OrderId"].as_i64().expect("OrderId");
        let row = fed
            .get(&(region.clone(), order))
            .unwrap_or_else(|| panic!("a message of no order: {message:?}"));
        assert!(row.live, "the deleted order was exported: {message:?}");
        assert_eq!(message.ulid, row.ulid, "the ulid header");
        assert_eq!(message.shard, row.shard, "the shard header");
        assert_eq!(message.feed, "dbo.Orders", "the feed header");
        assert_eq!(
            message.key,
            format!(r#"{{"Region":"{region}","OrderId":{order}}}"#),
            "the key: the key columns in key order, compact"
        );
        let note = if order % 2 == 1 {
            json!(format!("note {order}"))
        } else {
            Value::Null
        };
        assert_eq!(
            message.value,
            json!({
                "Region": region,
                "OrderId": order,
                "Total": format!("{order}.50"),
                "Note": note,
            }),
            "the value: every column of the row"
        );
        let slot = (message.partition, message.shard);
        if let Some(previous) = last.insert(slot, message.ulid) {
            assert!(
                previous < message.ulid,
                "partition {} shard {}: {} after {previous}",
                message.partition,
                message.shard,
                message.ulid
            );
        }
    }
    let live: BTreeSet<Ulid> = fed.values().filter(|r| r.live).map(|r| r.ulid).collect();
    assert_eq!(seen, live, "every live order, and only those");
}
