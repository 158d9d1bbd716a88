//! Live tests of outbox-mode feeds (ARCHITECTURE.md, "read_feed"): paging, ordering, the ULID allocator
//! on the server, `#read`, `@with_event`, errors, long-poll, composite keys and unicode names,
//! setup / upgrade / teardown, `feed_status` and shards.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_outbox_feed -- --ignored`. Every
//! scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of its own.

mod common;

use std::time::{Duration, Instant};

use changefeed::allocator::{
    Allocator, MAX_MS, ShardState, clamp_hint, mask_counter, ulid_counter, ulid_from_parts,
    ulid_high, ulid_ms, ulid_random16,
};
use changefeed::row::FromRow;
use changefeed::{Client, Cursor, Feed, FeedRow, ReadOptions, read_page};
use common::TestDb;
use common::events::{
    column_values, exec_ok, hex, read_state, required, rows_ok, server_now_ms, server_number,
};
use tiberius::Row;
use ulid::Ulid;

/// 2023-01-02T15:04:05Z, the time of the allocator's carry vector.
const T: i64 = 1_672_671_845_000;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn feed(name: &str) -> Feed {
    name.parse()
        .unwrap_or_else(|error| panic!("{name} is a valid feed name: {error}"))
}

/// Every result set of a batch, so a test can tell which statement produced rows.
async fn result_sets(client: &mut Client, sql: &str) -> changefeed::Result<Vec<Vec<Row>>> {
    Ok(client.simple_query(sql).await?.into_results().await?)
}

/// Runs a batch that must fail and returns the server's error number.
async fn exec_error(client: &mut Client, sql: &str) -> u32 {
    server_number(sql, common::exec(client, sql).await)
}

async fn count(client: &mut Client, sql: &str) -> i64 {
    common::scalar_i64(client, sql).await
}

/// A `datetime2(3)` expression for `ms` milliseconds since 1970 (days first: dateadd takes
/// an int), so a test can write exact time hints.
fn datetime_sql(ms: i64) -> String {
    format!(
        "dateadd(millisecond, {}, dateadd(day, {}, convert(datetime2(3), '19700101', 112)))",
        ms % 86_400_000,
        ms / 86_400_000
    )
}

fn ms_of(time: time::PrimitiveDateTime) -> i64 {
    (time.assume_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

fn column<'a, T: tiberius::FromSql<'a>>(row: &'a Row, name: &str) -> Option<T> {
    row.try_get::<T, &str>(name)
        .unwrap_or_else(|error| panic!("column {name}: {error}"))
}

fn binary(row: &Row, name: &str) -> Vec<u8> {
    required::<&[u8]>(row, name).to_vec()
}

fn ulid_column(row: &Row, name: &str) -> Ulid {
    Cursor::from_bytes(&binary(row, name))
        .unwrap_or_else(|error| panic!("column {name} is not a binary(16) ULID: {error}"))
        .ulid()
}

fn text(row: &Row, name: &str) -> String {
    required::<&str>(row, name).to_owned()
}

fn column_names(row: &Row) -> Vec<String> {
    row.columns().iter().map(|c| c.name().to_owned()).collect()
}

fn assert_strictly_increasing(what: &str, ulids: &[Ulid]) {
    for pair in ulids.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{what}: ULIDs must strictly increase, got {} then {}",
            pair[0],
            pair[1]
        );
    }
}

fn ulids<K>(rows: &[FeedRow<K>]) -> Vec<Ulid> {
    rows.iter().map(|row| row.ulid).collect()
}

fn keys<K: Clone>(rows: &[FeedRow<K>]) -> Vec<K> {
    rows.iter().map(|row| row.key.clone()).collect()
}

async fn ensure_schema(client: &mut Client, schema: &str) {
    // CREATE SCHEMA must begin its batch; inside exec () it does.
    exec_ok(
        client,
        &format!("if schema_id(N'{schema}') is null exec (N'create schema [{schema}]');"),
    )
    .await;
}

async fn setup_feed(client: &mut Client, feed: &Feed) {
    exec_ok(
        client,
        &format!("exec changefeed.setup_feed @table_name = N'{feed}', @outbox = 1;"),
    )
    .await;
}

/// Creates the event table `(id int primary key, payload nvarchar(100), quantity smallint)`
/// and makes it an outbox-mode feed.
async fn create_feed(client: &mut Client, feed: &Feed) {
    ensure_schema(client, feed.schema()).await;
    exec_ok(
        client,
        &format!(
            "create table {} (id int not null primary key, payload nvarchar(100) null, \
             quantity smallint null);",
            feed.quoted_table()
        ),
    )
    .await;
    setup_feed(client, feed).await;
}

/// The feed `name` (`schema.table`), created with [`create_feed`].
async fn created(client: &mut Client, name: &str) -> Feed {
    let feed = feed(name);
    create_feed(client, &feed).await;
    feed
}

/// A scenario's start: a new connection, and on it the feed `name` created.
async fn feed_in(db: &TestDb, name: &str) -> (Client, Feed) {
    let mut client = db.client().await;
    let feed = created(&mut client, name).await;
    (client, feed)
}

fn quantity_of(id: i32) -> i16 {
    (id % 1000) as i16
}

/// The writer's transaction: the event and its outbox row, committed together. `hint_ms`
/// sets the outbox row's time hint; `None` leaves the default (the server's clock).
async fn write_event(client: &mut Client, feed: &Feed, shard: i32, id: i32, hint_ms: Option<i64>) {
    let (hint_column, hint_value) = match hint_ms {
        Some(ms) => (", time_hint", format!(", {}", datetime_sql(ms))),
        None => ("", String::new()),
    };
    exec_ok(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {table} (id, payload, quantity) values ({id}, N'event {id}', {quantity}); \
             insert into {outbox} (shard_id, id{hint_column}) values ({shard}, {id}{hint_value}); \
             commit transaction;",
            table = feed.quoted_table(),
            outbox = feed.outbox_table(),
            quantity = quantity_of(id),
        ),
    )
    .await;
}

async fn write_events(client: &mut Client, feed: &Feed, shard: i32, ids: &[i32]) {
    for &id in ids {
        write_event(client, feed, shard, id, None).await;
    }
}

fn options(page_size: u32) -> ReadOptions {
    ReadOptions::default().page_size(page_size).wait_ms(0)
}

/// Reads pages until an empty one; returns every row and the cursor reached.
async fn read_all<K: FromRow + std::fmt::Debug>(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    from: Cursor,
    page_size: u32,
) -> (Vec<FeedRow<K>>, Cursor) {
    let mut cursor = from;
    let mut rows = Vec::new();
    for _ in 0..10_000 {
        let page = read_page::<K>(client, feed, shard, cursor, options(page_size))
            .await
            .unwrap_or_else(|error| panic!("read_page {feed} shard {shard}: {error}"));
        assert!(
            page.rows.len() <= page_size as usize,
            "a page holds at most page_size rows"
        );
        if page.rows.is_empty() {
            assert_eq!(
                page.next_cursor, cursor,
                "an empty page keeps the cursor where it was"
            );
            return (rows, cursor);
        }
        assert_eq!(
            page.next_cursor,
            Cursor::from_ulid(page.rows.last().expect("not empty").ulid),
            "next_cursor is the last row's ULID"
        );
        assert!(
            page.rows[0].ulid > cursor.ulid(),
            "rows come after the cursor"
        );
        cursor = page.next_cursor;
        rows.extend(page.rows);
    }
    panic!("{feed} shard {shard}: still reading after 10000 pages");
}

/// `(shard_id, ulid, id)` of every feed row, in order: a snapshot to compare.
async fn feed_rows(client: &mut Client, feed: &Feed) -> Vec<(i32, Vec<u8>, i32)> {
    rows_ok(
        client,
        &format!(
            "select shard_id, ulid, id from {} order by shard_id, ulid;",
            feed.object("feed")
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            required::<i32>(row, "shard_id"),
            binary(row, "ulid"),
            required::<i32>(row, "id"),
        )
    })
    .collect()
}

async fn outbox_count(client: &mut Client, feed: &Feed) -> i64 {
    count(
        client,
        &format!("select count_big(*) from {};", feed.outbox_table()),
    )
    .await
}

async fn feed_count(client: &mut Client, feed: &Feed) -> i64 {
    count(
        client,
        &format!("select count_big(*) from {};", feed.object("feed")),
    )
    .await
}

/// `read_feed @with_event = 1` through sp_executesql, every result set kept.
async fn read_with_event(
    client: &mut Client,
    feed: &Feed,
    cursor: Cursor,
    page_size: i32,
) -> Vec<Vec<Row>> {
    let bytes = cursor.to_bytes();
    let sql = format!(
        "exec {} @shard_id = 0, @cursor = @P1, @page_size = @P2, @with_event = 1",
        feed.read_feed_procedure()
    );
    client
        .query(sql.as_str(), &[&&bytes[..], &page_size])
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .into_results()
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

// ---------------------------------------------------------------------------------------------
// 1. Paging
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread five_events_read_with_page_size_three_come_as_three_then_two_then_an_empty_page: "paging" => paging);

async fn paging(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.paging").await;
    // Not in key order, so "insertion order" cannot pass by sorting on the key.
    write_events(&mut client, &feed, 0, &[30, 10, 50, 20, 40]).await;

    let first = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(3))
        .await
        .expect("first page");
    assert_eq!(keys(&first.rows), [30, 10, 50]);
    assert!(first.is_full());
    assert_eq!(first.next_cursor, Cursor::from_ulid(first.rows[2].ulid));

    let second = read_page::<i32>(&mut client, &feed, 0, first.next_cursor, options(3))
        .await
        .expect("second page");
    assert_eq!(keys(&second.rows), [20, 40]);
    assert!(!second.is_full());
    assert_eq!(second.next_cursor, Cursor::from_ulid(second.rows[1].ulid));

    let third = read_page::<i32>(&mut client, &feed, 0, second.next_cursor, options(3))
        .await
        .expect("third page");
    assert!(third.rows.is_empty(), "caught up: {:?}", third.rows);
    assert_eq!(third.next_cursor, second.next_cursor);

    let mut all = first.rows.clone();
    all.extend(second.rows.clone());
    assert_strictly_increasing("paging", &ulids(&all));

    // The feed is an append-only log: a replay from the start gives the same rows, and a
    // cursor in the middle gives exactly the rows after it.
    let replay = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10))
        .await
        .expect("replay");
    assert_eq!(replay.rows, all);
    let middle = read_page::<i32>(
        &mut client,
        &feed,
        0,
        Cursor::from_ulid(all[1].ulid),
        options(10),
    )
    .await
    .expect("read from the middle");
    assert_eq!(middle.rows, all[2..].to_vec());

    assert_eq!(outbox_count(&mut client, &feed).await, 0);
    assert_eq!(feed_count(&mut client, &feed).await, 5);
}

// ---------------------------------------------------------------------------------------------
// 2. Order follows insertion, not time hints
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread feed_order_follows_insertion_order_even_when_time_hints_decrease: "insertion_order" => insertion_order);

async fn insertion_order(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.insertion_order").await;
    // Hints in the past (a later one would be clamped to the server's clock + 1 s).
    let now = server_now_ms(&mut client).await;
    let hints = [now - 1_000, now - 2_000, now - 3_000, now - 5_000];
    for (id, hint) in (1..).zip(hints) {
        write_event(&mut client, &feed, 0, id, Some(hint)).await;
    }

    let (rows, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    assert_eq!(keys(&rows), [1, 2, 3, 4], "insertion order, not time order");
    assert_strictly_increasing("insertion order", &ulids(&rows));
    // The hints were lifted to their running max, so every ULID carries the first one.
    for row in &rows {
        assert_eq!(ulid_ms(row.ulid), now - 1_000, "ULID time of {}", row.key);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Time hints lifted to a running max
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread time_hints_are_lifted_to_their_running_max_and_ulid_time_never_goes_back: "running_max" => running_max);

async fn running_max(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.running_max").await;
    let t0 = server_now_ms(&mut client).await;
    for (id, hint) in (1..).zip([t0 + 5, t0, t0 + 10, t0 + 2]) {
        write_event(&mut client, &feed, 0, id, Some(hint)).await;
    }

    // One read, one move of all four rows.
    let page = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10))
        .await
        .expect("read the batch");
    assert_eq!(keys(&page.rows), [1, 2, 3, 4]);
    let u = ulids(&page.rows);
    assert_strictly_increasing("one move", &u);
    assert_eq!(
        u.iter().map(|&x| ulid_ms(x)).collect::<Vec<_>>(),
        [t0 + 5, t0 + 5, t0 + 10, t0 + 10]
    );
    // Rows of one millisecond share the high part and take consecutive counters.
    assert_eq!(ulid_high(u[0]), ulid_high(u[1]));
    assert_eq!(ulid_counter(u[1]), ulid_counter(u[0]) + 1);
    assert_eq!(ulid_high(u[2]), ulid_high(u[3]));
    assert_eq!(ulid_counter(u[3]), ulid_counter(u[2]) + 1);

    // A later move with an older hint continues the shard's time, high and counter.
    write_event(&mut client, &feed, 0, 5, Some(t0 - 1_000)).await;
    let later = read_page::<i32>(&mut client, &feed, 0, page.next_cursor, options(10))
        .await
        .expect("read the older hint");
    assert_eq!(keys(&later.rows), [5]);
    let v = later.rows[0].ulid;
    assert!(v > u[3]);
    assert_eq!(
        ulid_ms(v),
        t0 + 10,
        "ULID time never decreases across reads"
    );
    assert_eq!(ulid_high(v), ulid_high(u[3]));
    assert_eq!(ulid_counter(v), ulid_counter(u[3]) + 1);

    // A later hint starts a new millisecond.
    write_event(&mut client, &feed, 0, 6, Some(t0 + 20)).await;
    let newer = read_page::<i32>(&mut client, &feed, 0, later.next_cursor, options(10))
        .await
        .expect("read the newer hint");
    assert_eq!(keys(&newer.rows), [6]);
    assert!(newer.rows[0].ulid > v);
    assert_eq!(ulid_ms(newer.rows[0].ulid), t0 + 20);
}

// ---------------------------------------------------------------------------------------------
// 4. The server's allocation agrees with the reference model
// ---------------------------------------------------------------------------------------------

/// Runs `changefeed.ulid_at` for a batch of hints from `state` with fixed random parts and
/// checks the result against `Allocator::allocate_set_based` fed the same values.
async fn server_ulids_match_model(
    client: &mut Client,
    hints: &[i64],
    state: Option<ShardState>,
    random16: u16,
    raw_counter_start: i64,
) -> Vec<Ulid> {
    // The caller of ulid_at clamps and lifts the hints and numbers the rows (V3's contract).
    // ulid_at itself knows no clock: the model gets the latest clock datetime2 can hold, so
    // that it clamps nothing the callers would not.
    let mut running = 0i64;
    let lifted: Vec<i64> = hints
        .iter()
        .map(|&hint| {
            running = running.max(clamp_hint(hint, MAX_MS));
            running
        })
        .collect();
    let values: Vec<String> = lifted
        .iter()
        .enumerate()
        .map(|(i, &ms)| {
            let position = i + 1;
            let position_in_ms = lifted[..=i].iter().filter(|&&m| m == ms).count();
            format!(
                "({position}, convert(bigint, {ms}), convert(bigint, {position}), \
                 convert(bigint, {position_in_ms}))"
            )
        })
        .collect();
    let (state_ms, state_high, state_next) = match state {
        Some(s) => (
            s.last_ms.to_string(),
            hex(&s.high),
            s.next_counter.to_string(),
        ),
        None => ("null".to_owned(), "null".to_owned(), "null".to_owned()),
    };
    let sql = format!(
        "select a.ulid \
         from (values {values}) as v (n, ms, position, position_in_ms) \
         cross apply changefeed.ulid_at( \
             v.ms, v.position, v.position_in_ms, \
             convert(bigint, {state_ms}), convert(binary(8), {state_high}), \
             convert(bigint, {state_next}), convert(binary(2), {random16}), \
             convert(bigint, {counter_start})) as a \
         order by v.n;",
        values = values.join(", "),
        random16 = hex(&random16.to_be_bytes()),
        counter_start = mask_counter(raw_counter_start),
    );
    let server: Vec<Ulid> = rows_ok(client, &sql)
        .await
        .iter()
        .map(|row| ulid_column(row, "ulid"))
        .collect();
    let mut model = state.map_or_else(Allocator::new, Allocator::with_state);
    let expected = model.allocate_set_based(MAX_MS, hints, random16, raw_counter_start);
    assert_eq!(
        server, expected,
        "ulid_at differs from the model for hints {hints:?} from {state:?}"
    );
    assert_strictly_increasing("ulid_at", &server);
    server
}

common::live_test!(current_thread server_ulid_allocation_agrees_with_the_reference_model_and_the_state_row_follows_it: "allocator_model" => allocator_model);

async fn allocator_model(db: &TestDb) {
    let mut client = db.client().await;

    // The carry vector: 101 rows of one millisecond from counter 0xBFFF...FF carry into
    // byte 8 and stay ordered.
    let carry = server_ulids_match_model(
        &mut client,
        &[T; 101],
        None,
        0xFFFF,
        0xBFFF_FFFF_FFFF_FFFFu64 as i64,
    )
    .await;
    assert_eq!(carry[0].to_string(), "01GNSG5PM8ZZZVZZZZZZZZZZZZ");
    assert_eq!(carry[100].to_string(), "01GNSG5PM8ZZZW000000000033");

    // A fresh shard, several milliseconds, hints going back and forth.
    server_ulids_match_model(
        &mut client,
        &[T + 2, T, T + 2, T + 9, T + 9, T + 1, T + 30],
        None,
        0x0102,
        0x0123_4567_89AB_CDEF,
    )
    .await;

    // A shard with state: a continuing prefix, then new milliseconds.
    let state = ShardState {
        last_ms: T + 5,
        high: ulid_high(ulid_from_parts(T + 5, 0xABCD, 0)),
        next_counter: 1_000_000,
    };
    let continued = server_ulids_match_model(
        &mut client,
        &[T, T + 5, T + 3, T + 6, T + 6, T + 100],
        Some(state),
        0x0001,
        42,
    )
    .await;
    assert_eq!(ulid_high(continued[0]), state.high);
    assert_eq!(ulid_counter(continued[0]), 1_000_000);
    assert_eq!(ulid_counter(continued[2]), 1_000_002);
    assert_eq!(ulid_ms(continued[3]), T + 6);

    // A negative counter continues without changing sign.
    let negative = ShardState {
        last_ms: T,
        high: ulid_high(ulid_from_parts(T, 0x7777, 0)),
        next_counter: -7_000_000_000_000,
    };
    server_ulids_match_model(&mut client, &[T - 1, T, T - 50], Some(negative), 0x0002, -1).await;

    // Every row later than the state: all new, none continue.
    server_ulids_match_model(
        &mut client,
        &[T + 1, T + 1],
        Some(negative),
        0xFFFF,
        i64::MAX,
    )
    .await;

    // A real move through read_feed: its state row is the last ULID + 1, and it agrees with
    // the model given the random parts the server drew.
    let feed = feed("dbo.allocator_model");
    create_feed(&mut client, &feed).await;
    let hint = server_now_ms(&mut client).await;
    for id in 1..=3 {
        write_event(&mut client, &feed, 0, id, Some(hint)).await;
    }
    let (first, cursor) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    let first = ulids(&first);
    assert_eq!(first.len(), 3);
    let last = first[2];
    let state1 = read_state(&mut client, &feed, 0)
        .await
        .expect("the shard has a state row after its first move");
    assert_eq!(state1.next_counter, ulid_counter(last) + 1);
    assert_eq!(state1.high, ulid_high(last));
    assert_eq!(state1.last_ms, ulid_ms(last));
    assert_eq!(state1.last_ms, hint);
    assert_eq!(
        ulid_counter(first[0]) & (1 << 62),
        0,
        "a fresh counter starts with bit 62 cleared"
    );
    let mut model = Allocator::new();
    assert_eq!(
        model.allocate_set_based(
            hint,
            &[hint; 3],
            ulid_random16(first[0]),
            ulid_counter(first[0])
        ),
        first
    );
    assert_eq!(model.state(), Some(state1));

    // Older hints continue the state: the model predicts every ULID exactly.
    let older = [hint - 5_000, hint - 10, hint];
    for (id, h) in (4..).zip(older) {
        write_event(&mut client, &feed, 0, id, Some(h)).await;
    }
    let (second, _) = read_all::<i32>(&mut client, &feed, 0, cursor, 10).await;
    assert_eq!(keys(&second), [4, 5, 6]);
    assert_eq!(
        ulids(&second),
        model.allocate_set_based(hint, &older, 0, 0),
        "continuing rows are fully determined by the state row"
    );
    assert_eq!(read_state(&mut client, &feed, 0).await, model.state());
}

// ---------------------------------------------------------------------------------------------
// 5. A writer that rolls back
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread a_writer_that_rolls_back_leaves_no_trace_in_outbox_or_feed: "rollback" => rolled_back_writer);

async fn rolled_back_writer(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.rolled_back").await;
    exec_ok(
        &mut client,
        &format!(
            "begin transaction; \
             insert into {table} (id, payload) values (1, N'never'); \
             insert into {outbox} (shard_id, id) values (0, 1); \
             rollback transaction;",
            table = feed.quoted_table(),
            outbox = feed.outbox_table()
        ),
    )
    .await;

    let page = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10))
        .await
        .expect("read after the rollback");
    assert!(page.rows.is_empty(), "{:?}", page.rows);
    assert_eq!(outbox_count(&mut client, &feed).await, 0);
    assert_eq!(feed_count(&mut client, &feed).await, 0);
    assert_eq!(
        count(
            &mut client,
            &format!("select count_big(*) from {};", feed.quoted_table())
        )
        .await,
        0
    );

    // The sequence value the rolled-back row used is a harmless gap.
    write_event(&mut client, &feed, 0, 2, None).await;
    let (rows, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    assert_eq!(keys(&rows), [2]);
}

// ---------------------------------------------------------------------------------------------
// 6. #read
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread read_feed_fills_a_callers_read_temp_table_instead_of_returning_rows: "read_temp_table" => read_temp_table);

async fn read_temp_table(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.into_read").await;
    write_events(&mut client, &feed, 0, &[7, 3, 9]).await;
    let read_feed = feed.read_feed_procedure();

    // A raw batch, so #read lives in the session and read_feed (a nested scope) sees it.
    let batch = format!(
        "create table #read (ulid binary(16) not null, id int not null); \
         exec {read_feed} @shard_id = 0, @page_size = 2; \
         select ulid, id from #read order by ulid; \
         drop table #read;"
    );
    let sets = result_sets(&mut client, &batch)
        .await
        .unwrap_or_else(|error| panic!("{batch}: {error}"));
    assert_eq!(
        sets.len(),
        1,
        "read_feed returns no result set when #read exists; only the select does"
    );
    let first: Vec<(Ulid, i32)> = sets[0]
        .iter()
        .map(|row| (ulid_column(row, "ulid"), required::<i32>(row, "id")))
        .collect();
    assert_eq!(first.iter().map(|(_, id)| *id).collect::<Vec<_>>(), [7, 3]);

    let cursor = hex(&Cursor::from_ulid(first[1].0).to_bytes());
    let batch = format!(
        "create table #read (ulid binary(16) not null, id int not null); \
         exec {read_feed} @shard_id = 0, @cursor = {cursor}, @page_size = 10; \
         select ulid, id from #read order by ulid; \
         drop table #read;"
    );
    let sets = result_sets(&mut client, &batch)
        .await
        .unwrap_or_else(|error| panic!("{batch}: {error}"));
    assert_eq!(sets.len(), 1);
    let second: Vec<(Ulid, i32)> = sets[0]
        .iter()
        .map(|row| (ulid_column(row, "ulid"), required::<i32>(row, "id")))
        .collect();
    assert_eq!(second.iter().map(|(_, id)| *id).collect::<Vec<_>>(), [9]);

    // The rows that went to #read were moved into the feed like any other read.
    let (replay, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    let replay: Vec<(Ulid, i32)> = replay.iter().map(|row| (row.ulid, row.key)).collect();
    let mut expected = first.clone();
    expected.extend(second);
    assert_eq!(replay, expected);

    // #read holds keys only: asking for events as well is refused, and nothing moves.
    write_event(&mut client, &feed, 0, 11, None).await;
    let mut other = db.client().await;
    let number = exec_error(
        &mut other,
        &format!(
            "create table #read (ulid binary(16) not null, id int not null); \
             exec {read_feed} @shard_id = 0, @with_event = 1;"
        ),
    )
    .await;
    assert_eq!(number, 51102);
    assert_eq!(outbox_count(&mut client, &feed).await, 1);
}

// ---------------------------------------------------------------------------------------------
// 7. @with_event = 1
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread with_event_returns_every_event_column_and_a_deleted_event_as_nulls: "with_event" => with_event);

async fn with_event(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.with_event").await;
    write_events(&mut client, &feed, 0, &[1, 2, 3]).await;
    // Written and committed, then deleted before anyone read it.
    exec_ok(
        &mut client,
        &format!("delete from {} where id = 2;", feed.quoted_table()),
    )
    .await;

    let sets = read_with_event(&mut client, &feed, Cursor::START, 10).await;
    assert_eq!(sets.len(), 1, "one result set");
    let rows = &sets[0];
    assert_eq!(
        rows.len(),
        3,
        "the deleted event still has its row: no short page"
    );
    assert_eq!(
        column_names(&rows[0]),
        ["ulid", "id", "payload", "quantity"]
    );
    let event_ulids: Vec<Ulid> = rows.iter().map(|row| ulid_column(row, "ulid")).collect();
    assert_strictly_increasing("with_event", &event_ulids);

    for (row, id) in [(&rows[0], 1), (&rows[2], 3)] {
        assert_eq!(column::<i32>(row, "id"), Some(id));
        assert_eq!(text(row, "payload"), format!("event {id}"));
        assert_eq!(column::<i16>(row, "quantity"), Some(quantity_of(id)));
    }
    let deleted = &rows[1];
    assert_eq!(column::<i32>(deleted, "id"), None);
    assert_eq!(column::<&str>(deleted, "payload"), None);
    assert_eq!(column::<i16>(deleted, "quantity"), None);

    // The feed keeps the key; the key-only read agrees on every ULID.
    let (key_rows, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    assert_eq!(keys(&key_rows), [1, 2, 3]);
    assert_eq!(ulids(&key_rows), event_ulids);

    // Past the last row there is nothing, and the result set is still the event's shape.
    let after = read_with_event(&mut client, &feed, Cursor::from_ulid(event_ulids[2]), 10).await;
    assert_eq!(after.len(), 1);
    assert!(after[0].is_empty());
}

// ---------------------------------------------------------------------------------------------
// 8. Errors: inside a transaction, bad arguments
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread read_feed_refuses_a_transaction_with_51100_and_bad_arguments_with_51101: "read_errors" => read_errors);

async fn read_errors(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.read_errors").await;
    write_events(&mut client, &feed, 0, &[1]).await;
    let read_feed = feed.read_feed_procedure();

    // In a raw batch...
    let mut in_batch = db.client().await;
    let number = exec_error(
        &mut in_batch,
        &format!("begin transaction; exec {read_feed} @shard_id = 0;"),
    )
    .await;
    assert_eq!(number, 51100);
    drop(in_batch);

    // ...and through read_page on a session with an open transaction.
    let mut in_transaction = db.client().await;
    exec_ok(&mut in_transaction, "begin transaction;").await;
    let result = read_page::<i32>(&mut in_transaction, &feed, 0, Cursor::START, options(10)).await;
    let error = result.as_ref().err().map(ToString::to_string);
    assert_eq!(
        server_number("read_page in a transaction", result),
        51100,
        "{error:?}"
    );
    exec_ok(
        &mut in_transaction,
        "if @@trancount > 0 rollback transaction;",
    )
    .await;
    // Refused before anything moved.
    assert_eq!(outbox_count(&mut client, &feed).await, 1);
    assert_eq!(feed_count(&mut client, &feed).await, 0);

    for arguments in [
        "@shard_id = null",
        "@cursor = null",
        "@page_size = null",
        "@page_size = 0",
        "@page_size = 10001",
        "@wait_ms = -1",
        "@wait_ms = 3600001",
        "@wait_ms = null",
    ] {
        let number = exec_error(&mut client, &format!("exec {read_feed} {arguments};")).await;
        assert_eq!(number, 51101, "{arguments}");
    }
    for page_size in [0, 10_001] {
        let result =
            read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(page_size)).await;
        let what = format!("read_page with page_size {page_size}");
        let number = server_number(&what, result);
        assert_eq!(number, 51101, "{what}");
    }
    assert_eq!(outbox_count(&mut client, &feed).await, 1, "nothing moved");

    // The bounds themselves are accepted.
    let page = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(1))
        .await
        .expect("page_size 1");
    assert_eq!(keys(&page.rows), [1]);
    let page = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10_000))
        .await
        .expect("page_size 10000");
    assert_eq!(keys(&page.rows), [1]);
}

// ---------------------------------------------------------------------------------------------
// 9. Long-poll
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread a_long_polling_reader_returns_when_a_writer_commits_or_after_wait_ms_when_none_does: "long_poll" => long_poll);

async fn long_poll(db: &TestDb) {
    let mut reader = db.client().await;
    let mut writer = db.client().await;
    let feed = feed("dbo.long_poll");
    create_feed(&mut reader, &feed).await;

    let waiting = ReadOptions::default().page_size(10).wait_ms(5_000);
    let started = Instant::now();
    let (page, ()) = tokio::join!(
        read_page::<i32>(&mut reader, &feed, 0, Cursor::START, waiting),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            write_event(&mut writer, &feed, 0, 1, None).await;
        }
    );
    let elapsed = started.elapsed();
    let page = page.expect("long-poll read");
    assert_eq!(
        keys(&page.rows),
        [1],
        "the reader got the row committed while it waited"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "the reader returned {elapsed:?} after it started: it must return soon after the \
         commit (about 0.3 s), well before wait_ms (5 s)"
    );

    // Nothing written: an empty page after about wait_ms.
    let idle = ReadOptions::default().page_size(10).wait_ms(1_000);
    let started = Instant::now();
    let empty = read_page::<i32>(&mut reader, &feed, 0, page.next_cursor, idle)
        .await
        .expect("idle long-poll");
    let elapsed = started.elapsed();
    assert!(empty.rows.is_empty(), "{:?}", empty.rows);
    assert_eq!(empty.next_cursor, page.next_cursor);
    assert!(
        elapsed >= Duration::from_millis(900),
        "an idle long-poll of 1000 ms returned after {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "an idle long-poll of 1000 ms took {elapsed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. Composite, mixed-type keys; unicode names; a non-dbo schema
// ---------------------------------------------------------------------------------------------

const GUIDS: [&str; 4] = [
    "6f9619ff-8b86-d011-b42d-00c04fc964ff",
    "0e984725-c51c-4bf4-9960-e1c80e27aba0",
    "a8098c1a-f86e-11da-bd1a-00112444be1e",
    "00000000-0000-0000-0000-000000000001",
];

/// `sys.columns` of the four key columns of one object: name, type, max_length, precision,
/// scale, collation, nullability.
type KeyColumn = (String, String, i16, u8, u8, Option<String>, bool);

async fn key_column_types(client: &mut Client, object_id_sql: &str) -> Vec<KeyColumn> {
    rows_ok(
        client,
        &format!(
            "select c.name, type_name(c.user_type_id) as type_name, c.max_length, c.precision, \
                    c.scale, c.collation_name, c.is_nullable \
             from sys.columns as c \
             where c.object_id = {object_id_sql} \
               and c.name in (N'tenant', N'order_no', N'line', N'id') \
             order by c.column_id;"
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            text(row, "name"),
            text(row, "type_name"),
            required::<i16>(row, "max_length"),
            required::<u8>(row, "precision"),
            required::<u8>(row, "scale"),
            column::<&str>(row, "collation_name").map(str::to_owned),
            required::<bool>(row, "is_nullable"),
        )
    })
    .collect()
}

common::live_test!(current_thread composite_mixed_type_key_in_a_unicode_table_of_a_non_dbo_schema_is_carried_exactly: "composite_key" => composite_key);

async fn composite_key(db: &TestDb) {
    let mut client = db.client().await;
    let feed = Feed::new("ventes", "Événement").expect("a valid unicode feed name");
    ensure_schema(&mut client, "ventes").await;
    exec_ok(
        &mut client,
        "create table [ventes].[Événement] ( \
             tenant int not null, \
             order_no nvarchar(20) collate Latin1_General_100_CI_AS not null, \
             line smallint not null, \
             id uniqueidentifier not null, \
             note nvarchar(100) null, \
             constraint [Événement_pk] primary key clustered (tenant, order_no, line, id));",
    )
    .await;
    exec_ok(
        &mut client,
        "exec changefeed.setup_feed @table_name = N'ventes.Événement', @outbox = 1;",
    )
    .await;

    // The generated read_feed: the key list and the join on every key column, no marker left.
    let definition = rows_ok(
        &mut client,
        "select object_definition(object_id(N'[changefeed].[read_feed:ventes.Événement]')) \
         as definition;",
    )
    .await;
    let definition = column::<&str>(&definition[0], "definition")
        .expect("read_feed:ventes.Événement exists")
        .to_owned();
    assert!(
        definition.contains("[tenant], [order_no], [line], [id]"),
        "key list missing:\n{definition}"
    );
    assert!(
        definition.contains(
            "e.[tenant] = r.[tenant] and e.[order_no] = r.[order_no] and e.[line] = r.[line] \
             and e.[id] = r.[id]"
        ),
        "key join missing:\n{definition}"
    );
    assert!(
        definition.contains("[ventes].[Événement]"),
        "event table missing:\n{definition}"
    );
    assert!(
        definition.contains("[changefeed].[outbox:ventes.Événement]"),
        "outbox missing:\n{definition}"
    );
    assert!(
        !definition.contains("__template"),
        "template marker left in:\n{definition}"
    );
    let status = rows_ok(
        &mut client,
        "select object_definition(object_id(N'[changefeed].[status:ventes.Événement]')) \
         as definition;",
    )
    .await;
    let status = column::<&str>(&status[0], "definition").expect("status view exists");
    assert!(!status.contains("__template"), "{status}");

    // Outbox, feed and read type carry the key columns with the event table's exact types.
    let event = key_column_types(&mut client, "object_id(N'[ventes].[Événement]')").await;
    assert_eq!(event.len(), 4);
    assert_eq!(
        event[1].5.as_deref(),
        Some("Latin1_General_100_CI_AS"),
        "{event:?}"
    );
    for object in [
        "object_id(N'[changefeed].[outbox:ventes.Événement]')",
        "object_id(N'[changefeed].[feed:ventes.Événement]')",
        "(select type_table_object_id from sys.table_types \
          where schema_id = schema_id(N'changefeed') and name = N'type:read:ventes.Événement')",
    ] {
        assert_eq!(
            key_column_types(&mut client, object).await,
            event,
            "{object}"
        );
    }

    let events: [(i32, &str, i16, &str, &str); 4] = [
        (7, "FA-2024-001", 1, GUIDS[0], "première ligne"),
        (7, "FA-2024-001", 2, GUIDS[1], "zweite Zeile"),
        (-3, "Bestellung-Ü", 1, GUIDS[2], "注文"),
        (7, "fa-2024-001", 3, GUIDS[3], "même commande, autre casse"),
    ];
    for (tenant, order_no, line, id, note) in events {
        exec_ok(
            &mut client,
            &format!(
                "set xact_abort on; begin transaction; \
                 insert into [ventes].[Événement] (tenant, order_no, line, id, note) \
                 values ({tenant}, N'{order_no}', {line}, '{id}', N'{note}'); \
                 insert into [changefeed].[outbox:ventes.Événement] \
                 (shard_id, tenant, order_no, line, id) \
                 values (0, {tenant}, N'{order_no}', {line}, '{id}'); \
                 commit transaction;"
            ),
        )
        .await;
    }

    let expected: Vec<(i32, String, i16, tiberius::Uuid)> = events
        .iter()
        .map(|(tenant, order_no, line, id, _)| {
            (
                *tenant,
                (*order_no).to_owned(),
                *line,
                tiberius::Uuid::parse_str(id).expect("a valid GUID"),
            )
        })
        .collect();
    let (rows, _) =
        read_all::<(i32, String, i16, tiberius::Uuid)>(&mut client, &feed, 0, Cursor::START, 3)
            .await;
    assert_eq!(keys(&rows), expected, "decoded keys in insertion order");
    assert_strictly_increasing("composite", &ulids(&rows));

    let sets = read_with_event(&mut client, &feed, Cursor::START, 10).await;
    assert_eq!(sets.len(), 1);
    let event_rows = &sets[0];
    assert_eq!(event_rows.len(), 4);
    assert_eq!(
        column_names(&event_rows[0]),
        ["ulid", "tenant", "order_no", "line", "id", "note"]
    );
    for ((row, feed_row), (tenant, order_no, line, id, note)) in
        event_rows.iter().zip(&rows).zip(events)
    {
        assert_eq!(ulid_column(row, "ulid"), feed_row.ulid);
        assert_eq!(required::<i32>(row, "tenant"), tenant);
        assert_eq!(text(row, "order_no"), order_no);
        assert_eq!(required::<i16>(row, "line"), line);
        assert_eq!(
            required::<tiberius::Uuid>(row, "id"),
            tiberius::Uuid::parse_str(id).expect("a valid GUID")
        );
        assert_eq!(text(row, "note"), note);
    }
}

// ---------------------------------------------------------------------------------------------
// 11. Setup and teardown idempotency
// ---------------------------------------------------------------------------------------------

/// `(quoted_name, object_class, present)` for every per-feed object of `dbo.<table>`.
async fn per_feed_objects(client: &mut Client, table: &str) -> Vec<(String, String, bool)> {
    rows_ok(
        client,
        &format!(
            "select o.quoted_name, o.object_class, \
                 case \
                     when o.object_class = 'TT' then ( \
                         select count(*) from sys.types as t \
                         where t.schema_id = schema_id(N'changefeed') and t.name = o.object_name) \
                     when o.object_class = 'R' then \
                         case when database_principal_id(o.object_name) is null then 0 else 1 end \
                     else case when object_id(o.quoted_name) is null then 0 else 1 end \
                 end as present \
             from changefeed.feed_objects(N'dbo', N'{table}') as o \
             where o.mode in ('outbox', 'both') \
             order by o.drop_order;"
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            text(row, "quoted_name"),
            text(row, "object_class"),
            required::<i32>(row, "present") == 1,
        )
    })
    .collect()
}

async fn code_and_storage_ids(client: &mut Client, feed: &Feed) -> Vec<Option<i32>> {
    let rows = rows_ok(
        client,
        &format!(
            "select object_id(N'{}') as a, object_id(N'{}') as b, object_id(N'{}') as c, \
                    object_id(N'{}') as d, object_id(N'{}') as e;",
            feed.outbox_table(),
            feed.object("feed"),
            feed.object("state"),
            feed.read_feed_procedure(),
            feed.object("status"),
        ),
    )
    .await;
    ["a", "b", "c", "d", "e"]
        .iter()
        .map(|name| column::<i32>(&rows[0], name))
        .collect()
}

async fn registry_rows(client: &mut Client, table: &str) -> i64 {
    count(
        client,
        &format!(
            "select count_big(*) from changefeed.feeds \
             where schema_name = N'dbo' and table_name = N'{table}';"
        ),
    )
    .await
}

common::live_test!(current_thread setup_twice_changes_nothing_and_teardown_drops_every_per_feed_object_once: "setup_teardown" => setup_teardown);

async fn setup_teardown(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.idem").await;
    write_events(&mut client, &feed, 0, &[1, 2, 3]).await;
    let (read_before, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    let ids = code_and_storage_ids(&mut client, &feed).await;
    assert!(ids.iter().all(Option::is_some), "{ids:?}");
    let rows = feed_rows(&mut client, &feed).await;

    // The same call again, and the same table in bracketed spelling: nothing changes.
    setup_feed(&mut client, &feed).await;
    exec_ok(
        &mut client,
        "exec changefeed.setup_feed @table_name = N'[dbo].[idem]', @outbox = 1;",
    )
    .await;
    assert_eq!(code_and_storage_ids(&mut client, &feed).await, ids);
    assert_eq!(registry_rows(&mut client, "idem").await, 1);
    assert_eq!(feed_rows(&mut client, &feed).await, rows);
    let (read_after, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    assert_eq!(read_after, read_before);

    // Another mode is refused. Without shard and ULID columns the argument check (51004)
    // refuses it first; live_serialized.rs covers 51005 for a complete call on a registered
    // feed. Either way nothing changes.
    let number = exec_error(
        &mut client,
        "exec changefeed.setup_feed @table_name = N'dbo.idem', @serialize_writers = 1;",
    )
    .await;
    assert_eq!(number, 51004, "setup in another mode");
    assert_eq!(code_and_storage_ids(&mut client, &feed).await, ids);

    // A member in a feed role must not stop teardown.
    exec_ok(
        &mut client,
        &format!(
            "create user [idem_reader] without login; alter role {} add member [idem_reader];",
            feed.readers_role()
        ),
    )
    .await;

    let objects = per_feed_objects(&mut client, "idem").await;
    assert_eq!(objects.len(), 9, "{objects:?}");
    for (name, class, present) in &objects {
        assert!(present, "{class} {name} exists after setup");
    }

    exec_ok(
        &mut client,
        "exec changefeed.teardown_feed @table_name = N'dbo.idem';",
    )
    .await;
    for (name, class, present) in per_feed_objects(&mut client, "idem").await {
        assert!(!present, "{class} {name} is gone after teardown");
    }
    assert_eq!(registry_rows(&mut client, "idem").await, 0);
    assert_eq!(
        count(
            &mut client,
            "select count_big(*) from changefeed.feed_status where feed = N'dbo.idem';"
        )
        .await,
        0
    );
    // The event table and its rows are the user's.
    assert_eq!(
        count(&mut client, "select count_big(*) from [dbo].[idem];").await,
        3
    );
    assert_eq!(
        count(
            &mut client,
            "select count_big(*) from sys.database_principals where name = N'idem_reader';"
        )
        .await,
        1
    );

    // Again: nothing left to drop, no error.
    exec_ok(
        &mut client,
        "exec changefeed.teardown_feed @table_name = N'dbo.idem';",
    )
    .await;

    // Set up again: an empty feed that works.
    setup_feed(&mut client, &feed).await;
    assert_eq!(registry_rows(&mut client, "idem").await, 1);
    for (name, class, present) in per_feed_objects(&mut client, "idem").await {
        assert!(present, "{class} {name} exists after the second setup");
    }
    let page = read_page::<i32>(&mut client, &feed, 0, Cursor::START, options(10))
        .await
        .expect("read the new feed");
    assert!(
        page.rows.is_empty(),
        "a new feed starts empty: {:?}",
        page.rows
    );
    write_events(&mut client, &feed, 0, &[4]).await;
    let (rows, _) = read_all::<i32>(&mut client, &feed, 0, Cursor::START, 10).await;
    assert_eq!(keys(&rows), [4]);
}

// ---------------------------------------------------------------------------------------------
// 12. Bad setup inputs
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread setup_feed_rejects_bad_names_tables_keys_and_modes_with_the_documented_errors: "bad_setup" => bad_setup);

async fn bad_setup(db: &TestDb) {
    let mut client = db.client().await;
    exec_ok(
        &mut client,
        "create table dbo.no_pk (id int not null); \
         create table dbo.ulid_key (ulid binary(16) not null primary key, payload int null); \
         create table dbo.shard_key (shard_id int not null, id int not null, \
             constraint shard_key_pk primary key (shard_id, id)); \
         create table dbo.modes (id int not null primary key);",
    )
    .await;

    let setup = |name: &str, rest: &str| {
        format!("exec changefeed.setup_feed @table_name = N'{name}'{rest};")
    };
    let long_table = "t".repeat(106); // dbo + 106 = 109 characters
    let longest_table = "t".repeat(105); // dbo + 105 = 108: the name is fine, the table missing
    let cases: Vec<(String, u32)> = vec![
        (setup("dbo.no_such_table", ", @outbox = 1"), 51001),
        (
            setup(&format!("dbo.{longest_table}"), ", @outbox = 1"),
            51001,
        ),
        (setup("dbo.no_pk", ", @outbox = 1"), 51002),
        (setup("dbo.ab]c", ", @outbox = 1"), 51000),
        (setup("dbo.it''s", ", @outbox = 1"), 51000),
        (setup("otherdb.dbo.three_parts", ", @outbox = 1"), 51000),
        (setup(&format!("dbo.{long_table}"), ", @outbox = 1"), 51000),
        (setup("no_schema", ", @outbox = 1"), 51000),
        (setup("dbo.my__template__x", ", @outbox = 1"), 51000),
        (setup("changefeed.feeds", ", @outbox = 1"), 51000),
        (setup("dbo.ulid_key", ", @outbox = 1"), 51008),
        (setup("dbo.shard_key", ", @outbox = 1"), 51008),
        (
            setup("dbo.modes", ", @outbox = 1, @serialize_writers = 1"),
            51004,
        ),
        (setup("dbo.modes", ""), 51004),
        (setup("dbo.modes", ", @outbox = 0"), 51004),
        (
            setup("dbo.modes", ", @outbox = 1, @shard_column = N'id'"),
            51004,
        ),
    ];
    for (sql, expected) in &cases {
        assert_eq!(exec_error(&mut client, sql).await, *expected, "{sql}");
    }
    let null_name = "exec changefeed.setup_feed @table_name = null, @outbox = 1;";
    assert_eq!(exec_error(&mut client, null_name).await, 51000);

    // Nothing was left behind by any refused call.
    for left_behind in [
        "select count_big(*) from changefeed.feeds;",
        "select count_big(*) from sys.objects \
         where schema_id = schema_id(N'changefeed') and name like N'%:dbo.%';",
        "select count_big(*) from sys.types \
         where schema_id = schema_id(N'changefeed') and name like N'%:dbo.%';",
        "select count_big(*) from sys.database_principals \
         where name like N'changefeed.%:dbo.%';",
    ] {
        assert_eq!(count(&mut client, left_behind).await, 0, "{left_behind}");
    }

    // The table refused for a bad call is fine with good arguments.
    setup_feed(&mut client, &feed("dbo.modes")).await;
    assert_eq!(common::registered_feeds(&mut client).await, 1);
}

// ---------------------------------------------------------------------------------------------
// 13. upgrade_feed / upgrade_all_feeds
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread upgrade_all_feeds_regenerates_code_and_keeps_every_row_and_cursor: "upgrade" => upgrade);

async fn upgrade(db: &TestDb) {
    let mut client = db.client().await;
    let a = created(&mut client, "dbo.upgrade_a").await;
    let b = created(&mut client, "dbo.upgrade_b").await;
    write_events(&mut client, &a, 0, &[1, 2, 3]).await;
    write_events(&mut client, &b, 1, &[10, 20]).await;
    let (read_a, cursor_a) = read_all::<i32>(&mut client, &a, 0, Cursor::START, 2).await;
    let (read_b, cursor_b) = read_all::<i32>(&mut client, &b, 1, Cursor::START, 2).await;
    assert_eq!(keys(&read_a), [1, 2, 3]);
    assert_eq!(keys(&read_b), [10, 20]);
    // One event of a waits in the outbox across the upgrade.
    write_events(&mut client, &a, 0, &[4]).await;

    let rows_a = feed_rows(&mut client, &a).await;
    let rows_b = feed_rows(&mut client, &b).await;
    let state_a = read_state(&mut client, &a, 0).await;
    let state_b = read_state(&mut client, &b, 1).await;
    let ids_a = code_and_storage_ids(&mut client, &a).await;
    let ids_b = code_and_storage_ids(&mut client, &b).await;

    // A stale read_feed, as if generated by an older bundle: the upgrade must replace it.
    exec_ok(
        &mut client,
        &format!(
            "create or alter procedure {} \
                 @shard_id int = 0, @cursor binary(16) = null, @page_size int = 1000, \
                 @wait_ms int = 0, @with_event bit = 0 \
             as \
             begin \
                 set nocount on; \
                 throw 51999, N'stale read_feed: upgrade_all_feeds did not regenerate it', 1; \
             end",
            a.read_feed_procedure()
        ),
    )
    .await;
    let stale = read_page::<i32>(&mut client, &a, 0, cursor_a, options(10)).await;
    assert_eq!(server_number("the stale read_feed", stale), 51999);

    exec_ok(&mut client, "exec changefeed.upgrade_all_feeds;").await;

    // Data untouched.
    assert_eq!(feed_rows(&mut client, &a).await, rows_a);
    assert_eq!(feed_rows(&mut client, &b).await, rows_b);
    assert_eq!(read_state(&mut client, &a, 0).await, state_a);
    assert_eq!(read_state(&mut client, &b, 1).await, state_b);
    assert_eq!(outbox_count(&mut client, &a).await, 1);
    let after_a = code_and_storage_ids(&mut client, &a).await;
    let after_b = code_and_storage_ids(&mut client, &b).await;
    assert_eq!(
        after_a[..3],
        ids_a[..3],
        "outbox, feed and state tables are the same"
    );
    assert_eq!(
        after_b[..3],
        ids_b[..3],
        "outbox, feed and state tables are the same"
    );

    // The registry records the current generator.
    let versions = rows_ok(
        &mut client,
        "select table_name, generator_version, changefeed.generator_version() as current_version, \
                case when upgraded_at >= created_at then 1 else 0 end as upgraded_after_created \
         from changefeed.feeds order by feed_id;",
    )
    .await;
    assert_eq!(versions.len(), 2);
    for row in &versions {
        assert_eq!(
            required::<i32>(row, "generator_version"),
            required::<i32>(row, "current_version"),
            "{}",
            text(row, "table_name")
        );
        assert_eq!(required::<i32>(row, "upgraded_after_created"), 1);
    }

    // Reading continues from the previous cursors: the waiting event, then new ones.
    write_events(&mut client, &a, 0, &[5]).await;
    write_events(&mut client, &b, 1, &[30]).await;
    let (more_a, _) = read_all::<i32>(&mut client, &a, 0, cursor_a, 10).await;
    let (more_b, _) = read_all::<i32>(&mut client, &b, 1, cursor_b, 10).await;
    assert_eq!(keys(&more_a), [4, 5]);
    assert_eq!(keys(&more_b), [30]);
    assert!(more_a[0].ulid > cursor_a.ulid());
    assert!(more_b[0].ulid > cursor_b.ulid());
    let (all_a, _) = read_all::<i32>(&mut client, &a, 0, Cursor::START, 10).await;
    assert_strictly_increasing("across the upgrade", &ulids(&all_a));

    // upgrade_feed of one feed works too; a table that is not a feed is refused.
    exec_ok(
        &mut client,
        "exec changefeed.upgrade_feed @table_name = N'dbo.upgrade_b';",
    )
    .await;
    assert_eq!(feed_rows(&mut client, &b).await.len(), 3);
    let number = exec_error(
        &mut client,
        "exec changefeed.upgrade_feed @table_name = N'dbo.not_a_feed';",
    )
    .await;
    assert_eq!(number, 51006);
}

// ---------------------------------------------------------------------------------------------
// 14. feed_status
// ---------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
struct Status {
    feed: String,
    mode: String,
    shard_id: i32,
    outbox_depth: i64,
    head_ulid: Option<Ulid>,
    head_at_ms: Option<i64>,
}

async fn feed_status(client: &mut Client) -> Vec<Status> {
    rows_ok(
        client,
        "select feed, mode, shard_id, outbox_depth, head_ulid, head_at \
         from changefeed.feed_status order by feed, shard_id;",
    )
    .await
    .iter()
    .map(|row| Status {
        feed: text(row, "feed"),
        mode: text(row, "mode"),
        shard_id: required::<i32>(row, "shard_id"),
        outbox_depth: required::<i64>(row, "outbox_depth"),
        head_ulid: column::<&[u8]>(row, "head_ulid").map(|bytes| {
            Cursor::from_bytes(bytes)
                .expect("head_ulid is binary(16)")
                .ulid()
        }),
        head_at_ms: column::<time::PrimitiveDateTime>(row, "head_at").map(ms_of),
    })
    .collect()
}

fn status(feed: &str, shard_id: i32, outbox_depth: i64, head: Option<Ulid>) -> Status {
    Status {
        feed: feed.to_owned(),
        mode: "outbox".to_owned(),
        shard_id,
        outbox_depth,
        head_ulid: head,
        head_at_ms: head.map(ulid_ms),
    }
}

common::live_test!(current_thread feed_status_shows_each_feed_and_shard_with_committed_depth_and_head: "feed_status" => status_view);

async fn status_view(db: &TestDb) {
    let mut client = db.client().await;
    let a = created(&mut client, "dbo.status_a").await;
    let b = created(&mut client, "dbo.status_b").await;
    assert!(
        feed_status(&mut client).await.is_empty(),
        "no shard used yet"
    );

    // a: shard 0 read then two more written; shard 1 read then one more written.
    write_events(&mut client, &a, 0, &[1, 2, 3]).await;
    let (a0, _) = read_all::<i32>(&mut client, &a, 0, Cursor::START, 2).await;
    write_events(&mut client, &a, 0, &[4, 5]).await;
    write_events(&mut client, &a, 1, &[101, 102]).await;
    let (a1, _) = read_all::<i32>(&mut client, &a, 1, Cursor::START, 10).await;
    write_events(&mut client, &a, 1, &[103]).await;
    // b: shard 0 written, never read; shard 1 written and read.
    write_events(&mut client, &b, 0, &[1, 2]).await;
    write_events(&mut client, &b, 1, &[201]).await;
    let (b1, _) = read_all::<i32>(&mut client, &b, 1, Cursor::START, 10).await;

    let head = |rows: &[FeedRow<i32>]| rows.iter().map(|row| row.ulid).max();
    let expected = vec![
        status("dbo.status_a", 0, 2, head(&a0)),
        status("dbo.status_a", 1, 1, head(&a1)),
        status("dbo.status_b", 0, 2, None),
        status("dbo.status_b", 1, 0, head(&b1)),
    ];
    assert_eq!(feed_status(&mut client).await, expected);

    // An uncommitted writer neither counts nor blocks the view (READPAST), in a shard that
    // has rows and in one that has none.
    let mut writer = db.client().await;
    exec_ok(
        &mut writer,
        &format!(
            "begin transaction; \
             insert into {table} (id, payload) values (900, N'uncommitted'), (901, N'uncommitted'); \
             insert into {outbox} (shard_id, id) values (0, 900), (7, 901);",
            table = a.quoted_table(),
            outbox = a.outbox_table()
        ),
    )
    .await;
    let during = tokio::time::timeout(Duration::from_secs(15), feed_status(&mut client))
        .await
        .expect("feed_status waited for an uncommitted writer instead of skipping its rows");
    assert_eq!(during, expected);
    exec_ok(&mut writer, "rollback transaction;").await;
    assert_eq!(feed_status(&mut client).await, expected);
}

// ---------------------------------------------------------------------------------------------
// 15. Shards are independent
// ---------------------------------------------------------------------------------------------

common::live_test!(current_thread shards_are_independent_logs_each_with_strictly_increasing_ulids: "shards" => shards);

async fn shards(db: &TestDb) {
    let (mut client, feed) = feed_in(db, "dbo.sharded").await;
    // Interleaved: shard s gets s*100 + 1 .. s*100 + 4.
    for i in 1..=4 {
        for shard in 0..4 {
            write_event(&mut client, &feed, shard, shard * 100 + i, None).await;
        }
    }

    let (two, cursor_two) = read_all::<i32>(&mut client, &feed, 2, Cursor::START, 3).await;
    assert_eq!(keys(&two), [201, 202, 203, 204]);
    assert_strictly_increasing("shard 2", &ulids(&two));
    // Reading shard 2 moved only shard 2's outbox rows.
    let pending = rows_ok(
        &mut client,
        &format!(
            "select shard_id, count(*) as pending from {} group by shard_id order by shard_id;",
            feed.outbox_table()
        ),
    )
    .await
    .iter()
    .map(|row| {
        (
            required::<i32>(row, "shard_id"),
            required::<i32>(row, "pending"),
        )
    })
    .collect::<Vec<_>>();
    assert_eq!(pending, [(0, 4), (1, 4), (3, 4)]);

    for shard in [0, 1, 3] {
        let (rows, _) = read_all::<i32>(&mut client, &feed, shard, Cursor::START, 3).await;
        let expected: Vec<i32> = (1..=4).map(|i| shard * 100 + i).collect();
        assert_eq!(keys(&rows), expected, "shard {shard}");
        assert_strictly_increasing(&format!("shard {shard}"), &ulids(&rows));
    }
    let (again, _) = read_all::<i32>(&mut client, &feed, 2, cursor_two, 3).await;
    assert!(again.is_empty(), "shard 2 is caught up: {again:?}");
    let (never, _) = read_all::<i32>(&mut client, &feed, 9, Cursor::START, 3).await;
    assert!(never.is_empty(), "shard 9 has no rows: {never:?}");

    assert_eq!(outbox_count(&mut client, &feed).await, 0);
    let states_sql = format!(
        "select shard_id from {} order by shard_id;",
        feed.object("state")
    );
    let states: Vec<i32> = column_values(&mut client, &states_sql, "shard_id").await;
    assert_eq!(states, [0, 1, 2, 3], "one allocator state per shard");
}
