//! `FeedReader` on PostgreSQL, end to end on a private server: a feed with a composite key
//! (bigint, text) read as tuples of keys and as serde events, in pages, in order; a
//! long-poll that wakes on the commit it waits for; the PostgreSQL halves of `FromRow` on
//! the types a feed's columns come in; cursors and serialized writers from Rust. Not the
//! feed contract (tests/feed_contract): the smoke test of the Rust client's PostgreSQL side.
//!
//! `#[ignore]`d like every live test; `.ci/run` runs them with `--ignored`.

mod common_postgres;
mod common_server;

use std::time::{Duration, Instant};

use changefeed::cursor_store::CursorStore;
use changefeed::reader::{FeedEvent, FeedReader, FeedReaderOptions, FeedRow, Wait};
use changefeed::row::{Column, FromRow, Json, Serde};
use changefeed::writer::lock_feed_postgres;
use changefeed::{Cursor, Error, Feed};
use common_postgres::{TestDb, database};
use futures::StreamExt;

/// `app.orders`, keyed by (tenant bigint, order_no text), as an outbox-mode feed.
async fn orders_feed(db: &TestDb) -> Feed {
    db.sql(
        "create schema app; \
         create table app.orders ( \
             tenant bigint not null, order_no text not null, customer text not null, \
             amount numeric(10, 2) not null, note text, placed_at timestamptz not null, \
             primary key (tenant, order_no)); \
         select changefeed.setup_feed('app.orders');",
    )
    .await;
    "app.orders".parse().unwrap()
}

/// Writes orders `numbers` (tenant = number % 3, order_no = `o<number>`) in one
/// transaction.
async fn write_orders(db: &TestDb, numbers: std::ops::Range<i64>) {
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    for n in numbers {
        tx.execute(
            "insert into app.orders (tenant, order_no, customer, amount, note, placed_at) \
             values ($1, $2, $3, $4::text::numeric, $5, now())",
            &[
                &(n % 3),
                &format!("o{n:02}"),
                &format!("customer {n}"),
                &format!("{n}.50"),
                &(n % 2 == 0).then(|| format!("note {n}")),
            ],
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

fn options(page_size: u32) -> FeedReaderOptions {
    FeedReaderOptions::default()
        .page_size(page_size)
        .wait(Wait::LongPoll(Duration::from_secs(5)))
}

#[derive(Debug, PartialEq, serde::Deserialize)]
struct Order {
    tenant: i64,
    order_no: String,
    customer: String,
    amount: f64,
    note: Option<String>,
    placed_at: String,
}

/// The order numbers of keys `(tenant, order_no)`.
fn numbers<'a>(keys: impl IntoIterator<Item = &'a (i64, String)>) -> Vec<i64> {
    keys.into_iter()
        .map(|(tenant, order_no)| {
            let n: i64 = order_no[1..].parse().unwrap();
            assert_eq!(*tenant, n % 3);
            n
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn twenty_five_events_in_three_transactions_read_as_keys_and_events_in_pages_of_ten() {
    let db = database("reader_pages").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..10).await;
    write_orders(&db, 10..20).await;
    write_orders(&db, 20..25).await;
    let reader = FeedReader::postgres(db.config.clone(), feed.clone(), options(10)).unwrap();
    assert!(reader.pool().is_none());

    // Keys, one page at a time: 10, 10, 5, then an empty page at the same cursor.
    let mut cursor = Cursor::START;
    let mut keys = Vec::new();
    let mut ulids = Vec::new();
    for expected in [10, 10, 5, 0] {
        let page = reader.read_page::<(i64, String)>(0, cursor).await.unwrap();
        assert_eq!(page.rows.len(), expected);
        if expected == 0 {
            assert_eq!(page.next_cursor, cursor);
        }
        for row in &page.rows {
            ulids.push(row.ulid);
            keys.push(row.key.clone());
        }
        cursor = page.next_cursor;
    }
    assert_eq!(numbers(&keys), (0..25).collect::<Vec<_>>());
    assert!(ulids.windows(2).all(|pair| pair[0] < pair[1]), "ULID order");

    // Whole events through serde, as a stream: the same rows, the same ULIDs, in pages of 10.
    let mut events = std::pin::pin!(reader.event_stream::<Serde<Order>>(0, Cursor::START));
    let mut read = Vec::new();
    let mut sizes = Vec::new();
    while read.len() < 25 {
        let page = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("a page in time")
            .expect("the stream goes on")
            .unwrap();
        sizes.push(page.rows.len());
        read.extend(page.rows);
    }
    assert_eq!(sizes, [10, 10, 5]);
    assert_eq!(
        read.iter().map(|event| event.ulid).collect::<Vec<_>>(),
        ulids
    );
    for (n, FeedEvent { event, .. }) in read.iter().enumerate() {
        let Serde(order) = event;
        let n = n as i64;
        assert_eq!(
            (order.tenant, order.order_no.as_str()),
            (n % 3, &*format!("o{n:02}"))
        );
        assert_eq!(order.customer, format!("customer {n}"));
        assert_eq!(order.amount, n as f64 + 0.5);
        assert_eq!(order.note, (n % 2 == 0).then(|| format!("note {n}")));
        assert!(
            order.placed_at.ends_with('Z'),
            "RFC 3339 in UTC: {}",
            order.placed_at
        );
    }

    // Shards through the merged stream: the one shard, from the middle.
    let mut shards = std::pin::pin!(
        reader.stream_shards::<(i64, String), _>([(0, Cursor::from_ulid(ulids[19]))])
    );
    let (shard, page) = shards.next().await.unwrap();
    assert_eq!(shard, 0);
    assert_eq!(
        numbers(
            &page
                .unwrap()
                .rows
                .iter()
                .map(|row| row.key.clone())
                .collect::<Vec<_>>()
        ),
        [20, 21, 22, 23, 24]
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn a_long_poll_wakes_on_the_commit_it_waits_for() {
    let db = database("reader_long_poll").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..3).await;
    let options = options(10).wait(Wait::LongPoll(Duration::from_secs(20)));
    let reader = FeedReader::postgres(db.config.clone(), feed, options).unwrap();
    let mut stream = std::pin::pin!(reader.stream::<(i64, String)>(0, Cursor::START));
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.rows.len(), 3);

    // The stream is now long-polling (20 s): a commit 1.5 s later must reach it within ~1 s.
    let writer = {
        let db_url = db.url.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let config = changefeed::postgres::config(&db_url).unwrap();
            let mut client = changefeed::postgres::connect(&config).await.unwrap();
            let tx = client.transaction().await.unwrap();
            tx.execute(
                "insert into app.orders (tenant, order_no, customer, amount, placed_at) \
                 values (0, 'o03', 'late', 1, now())",
                &[],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            Instant::now()
        })
    };
    let page = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the long-poll delivers the commit, not its deadline")
        .unwrap()
        .unwrap();
    let arrived = Instant::now();
    let committed = writer.await.unwrap();
    assert_eq!(page.rows.len(), 1);
    assert_eq!(page.rows[0].key, (0, "o03".to_owned()));
    let latency = arrived.saturating_duration_since(committed);
    assert!(
        latency < Duration::from_secs(1),
        "woke {latency:?} after the commit"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn a_session_ended_by_the_server_is_retried_on_a_fresh_connection() {
    let db = database("reader_terminated").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..2).await;
    let options = options(10)
        .wait(Wait::LongPoll(Duration::from_secs(20)))
        .retry(
            changefeed::reader::ReadRetryPolicy::default()
                .initial(Duration::from_millis(50))
                .max(Duration::from_millis(200)),
        );
    let reader = FeedReader::postgres(db.config.clone(), feed, options).unwrap();
    let mut stream = Box::pin(reader.stream::<(i64, String)>(0, Cursor::START));
    assert_eq!(stream.next().await.unwrap().unwrap().rows.len(), 2);
    // While it long-polls, its backend is terminated (57P01), then an event commits.
    let admin = db.client().await;
    let next = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(15), stream.next())
            .await
            .map(|page| page.unwrap().map(|page| page.rows))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The pids first: a volatile call in a WHERE clause may run before the other tests.
    let pids: Vec<i32> = admin
        .query(
            "select a.pid from pg_stat_activity as a \
             where a.datname = current_database() and a.pid <> pg_backend_pid() \
             and a.application_name = 'changefeed'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut ended = 0;
    for pid in pids {
        let row = admin
            .query_one("select pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        ended += i32::from(row.get::<_, bool>(0));
    }
    assert!(ended >= 1, "the reader's session was found and ended");
    write_orders(&db, 2..3).await;
    let rows = next
        .await
        .unwrap()
        .expect("rows after the reconnect")
        .unwrap();
    assert_eq!(
        rows.into_iter().map(|row| row.key).collect::<Vec<_>>(),
        [(2, "o02".to_owned())]
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn columns_decode_from_postgres_types_and_errors_name_the_column() {
    let db = database("reader_columns").await;
    let client = db.client().await;
    let row = client
        .query_one(
            "select true as b, 2::smallint as s, 3 as i, 4::bigint as l, 1.5::real as f, \
             2.5::float8 as d, 'x'::text as t, '\\x0102'::bytea as bytes, \
             '7d444840-9dc0-11d1-b245-5ffdce74fad2'::uuid as u, \
             '2024-01-02 03:04:05'::timestamp as ts, '2024-01-02'::date as day, \
             '{\"a\": [1, 2]}'::jsonb as doc, null::text as nothing, \
             decode('0102030405060708090a0b0c0d0e0f10', 'hex') as ulid, 12.30::numeric(5,2) as n",
            &[],
        )
        .await
        .unwrap();
    assert!(bool::from_pg_row(&row, 0).unwrap());
    assert_eq!(<(i16, i32, i64)>::from_pg_row(&row, 1).unwrap(), (2, 3, 4));
    assert_eq!(
        <(f32, f64, String)>::from_pg_row(&row, 4).unwrap(),
        (1.5, 2.5, "x".to_owned())
    );
    assert_eq!(Vec::<u8>::pg_column(&row, 7).unwrap(), [1, 2]);
    assert_eq!(
        uuid::Uuid::pg_column(&row, 8).unwrap().to_string(),
        "7d444840-9dc0-11d1-b245-5ffdce74fad2"
    );
    assert_eq!(
        time::PrimitiveDateTime::pg_column(&row, 9).unwrap(),
        time::macros::datetime!(2024-01-02 03:04:05)
    );
    assert_eq!(
        time::Date::pg_column(&row, 10).unwrap(),
        time::macros::date!(2024 - 01 - 02)
    );
    let Json(doc) = Json::<serde_json::Value>::pg_column(&row, 11).unwrap();
    assert_eq!(doc, serde_json::json!({"a": [1, 2]}));
    assert_eq!(Option::<String>::pg_column(&row, 12).unwrap(), None);
    assert_eq!(
        ulid::Ulid::pg_column(&row, 13).unwrap().to_bytes(),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    );
    assert!(
        ulid::Ulid::pg_column(&row, 7)
            .unwrap_err()
            .to_string()
            .contains("bytes (position 7)")
    );
    let error = i32::pg_column(&row, 6).unwrap_err();
    assert!(matches!(error, Error::Decode { .. }));
    assert!(error.to_string().contains("t (position 6)"), "{error}");
    let error = String::pg_column(&row, 12).unwrap_err();
    assert!(
        error.to_string().contains("nothing (position 12)"),
        "{error}"
    );
    assert!(
        u8::pg_column(&row, 1)
            .unwrap_err()
            .to_string()
            .contains("i16")
    );

    #[derive(Debug, serde::Deserialize)]
    struct Mixed {
        s: i16,
        n: String,
        doc: serde_json::Value,
        day: String,
        nothing: Option<String>,
    }
    let Serde(mixed) = Serde::<Mixed>::from_pg_row(&row, 0).unwrap();
    assert_eq!(
        (mixed.s, mixed.n.as_str(), mixed.day.as_str()),
        (2, "12.30", "2024-01-02")
    );
    assert_eq!(mixed.doc, serde_json::json!({"a": [1, 2]}));
    assert_eq!(mixed.nothing, None);
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Wrong {
        t: i64,
    }
    let error = changefeed::row::deserialize_pg::<Wrong>(&row, 0).unwrap_err();
    assert!(error.to_string().contains("t (position 6)"), "{error}");

    /// A key type written for SQL Server only.
    #[derive(Debug)]
    struct SqlServerOnly;
    impl FromRow for SqlServerOnly {
        fn from_row(_: &tiberius::Row, _: usize) -> changefeed::Result<Self> {
            Ok(SqlServerOnly)
        }
    }
    let error = SqlServerOnly::from_pg_row(&row, 0).unwrap_err().to_string();
    assert!(
        error.contains("SqlServerOnly") && error.contains("implement from_pg_row"),
        "{error}"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn cursors_and_serialized_writers_from_rust() {
    let db = database("reader_cursors").await;
    let feed = orders_feed(&db).await;
    let mut client = db.client().await;
    assert_eq!(
        CursorStore::load_postgres(&client, "billing", &feed, 0)
            .await
            .unwrap(),
        None
    );
    let cursor = Cursor::from_ulid(ulid::Ulid::from_bytes([7; 16]));
    let tx = client.transaction().await.unwrap();
    CursorStore::save_postgres(&tx, "billing", &feed, 0, cursor)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        CursorStore::load_postgres(&client, "billing", &feed, 0)
            .await
            .unwrap(),
        Some(cursor)
    );
    assert!(matches!(
        CursorStore::load_postgres(&client, " billing", &feed, 0).await,
        Err(Error::Config(_))
    ));

    // An outbox-mode feed has no lock; a serialized one hands out ULIDs in commit order.
    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        lock_feed_postgres(&tx, &feed, 0, None).await,
        Err(Error::Config(_))
    ));
    drop(tx);
    db.sql(
        "create table app.ledger (shard int not null, ulid bytea not null, entry text not null, \
             primary key (shard, ulid)); \
         select changefeed.setup_feed('app.ledger', 1, true, 'shard', 'ulid');",
    )
    .await;
    let ledger: Feed = "app.ledger".parse().unwrap();
    let mut written = Vec::new();
    for entry in ["a", "b"] {
        let tx = client.transaction().await.unwrap();
        let range = lock_feed_postgres(&tx, &ledger, 0, None).await.unwrap();
        let ulid = range.first();
        tx.execute(
            "insert into app.ledger (shard, ulid, entry) values (0, $1, $2)",
            &[&&ulid.to_bytes()[..], &entry],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        written.push(ulid);
    }
    let reader = FeedReader::postgres(db.config.clone(), ledger, options(10)).unwrap();
    let page = reader
        .read_events::<Serde<serde_json::Value>>(0, Cursor::START)
        .await
        .unwrap();
    assert_eq!(
        page.rows.iter().map(|row| row.ulid).collect::<Vec<_>>(),
        written
    );
    assert_eq!(page.rows[1].event.0["entry"], "b");
    // The keys of a serialized feed are its (shard, ulid) columns.
    let keys = reader
        .read_page::<(i32, Vec<u8>)>(0, Cursor::START)
        .await
        .unwrap();
    let FeedRow { ulid, key } = &keys.rows[0];
    assert_eq!((key.0, &key.1[..]), (0, &ulid.to_bytes()[..]));
}

/// A column added to the event table while a stream of whole events runs (an ordinary
/// schema migration of the application) comes through on the stream's next page: its
/// prepared read, whose result type changed, is prepared again instead of failing.
#[tokio::test]
#[ignore = "needs PostgreSQL (CHANGEFEED_TEST_POSTGRES, or the installed binaries)"]
async fn a_column_added_to_the_event_table_comes_through_to_a_running_stream() {
    let db = database("reader_added_column").await;
    let feed = orders_feed(&db).await;
    write_orders(&db, 0..2).await;
    let reader = FeedReader::postgres(db.config.clone(), feed, options(10)).unwrap();
    let mut events =
        std::pin::pin!(reader.event_stream::<Serde<serde_json::Value>>(0, Cursor::START));
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(first.rows.len(), 2);
    assert!(first.rows[0].event.0.get("channel").is_none());

    db.sql("alter table app.orders add column channel text not null default 'web'")
        .await;
    write_orders(&db, 2..3).await;
    let next = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("the stream goes on")
        .unwrap()
        .expect("the stream prepares its read again for the new row type");
    assert_eq!(next.rows.len(), 1);
    assert_eq!(next.rows[0].event.0["order_no"], "o02");
    assert_eq!(next.rows[0].event.0["channel"], "web");
}
