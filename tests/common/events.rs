//! Events and the helpers the live scenarios share around them: the simple event table of
//! the reader and retention tests (`dbo.<table> (id bigint primary key, payload)` as an
//! outbox-mode feed) with its writers and readers; one event in each mode read by a
//! readers-only login (`readable_in_both_modes`, for `live_feed_read_path` and
//! `live_registry`); a commit retried through a transient failure (`commit_retrying`); a
//! feed's state row; and the small row, error and SQL helpers (`server_number`,
//! `column_values`, `feed_reader`). What each test file asserts stays with it.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use changefeed::allocator::ShardState;
use changefeed::reader::{FeedReader, FeedReaderOptions};
use changefeed::{Client, Cursor, Error, Feed, FeedRow};
use futures::future::BoxFuture;
use tiberius::Row;
use ulid::Ulid;

use tokio::task::JoinHandle;

use super::logins::Login;
use super::tasks::spawn_bounded;
use super::{TestDb, connect_to, exec, rows, scalar_i64};

/// Transient write errors (deadlock victim, lock timeout, dropped connection) a writer
/// retries per event before it fails.
pub const MAX_WRITE_RETRIES: u32 = 20;

/// Creates `dbo.<table> (id bigint primary key, ...)` and makes it an outbox-mode feed, so
/// that each scenario has a feed of its own whose rows get their ULIDs only when read.
pub async fn create_feed(admin: &mut Client, table: &str) -> Feed {
    exec_ok(
        admin,
        &format!(
            "create table [dbo].[{table}] (id bigint not null primary key, \
             payload nvarchar(50) null);"
        ),
    )
    .await;
    exec_ok(
        admin,
        &format!("exec changefeed.setup_feed @table_name = N'dbo.{table}', @outbox = 1;"),
    )
    .await;
    Feed::new("dbo", table).expect("a valid feed name")
}

/// Commits event `id` and its outbox row (shard `shard`, the given `time_hint` expression or
/// the default, the server's clock) in one transaction, as an application would; the error
/// is returned so that writers can tell transient failures apart.
pub async fn write_event(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    id: i64,
    time_hint: Option<&str>,
) -> changefeed::Result<()> {
    let (hint_column, hint_value) = match time_hint {
        Some(hint) => (", time_hint", format!(", {hint}")),
        None => ("", String::new()),
    };
    exec(
        client,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {} (id, payload) values ({id}, N'event {id}'); \
             insert into {} (shard_id, id{hint_column}) values ({shard}, {id}{hint_value}); \
             commit transaction;",
            feed.quoted_table(),
            feed.outbox_table()
        ),
    )
    .await
}

/// [`write_event`] for a single writer with nothing to race: any failure fails the test.
pub async fn write_ok(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    id: i64,
    time_hint: Option<&str>,
) {
    write_event(client, feed, shard, id, time_hint)
        .await
        .unwrap_or_else(|error| panic!("write event {id}: {error}"));
}

/// [`write_ok`] for each of `ids` in turn, on `shard`, with the server's clock: one
/// committed event after the other.
pub async fn write_all_ok(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    ids: impl IntoIterator<Item = i64>,
) {
    for id in ids {
        write_ok(client, feed, shard, id, None).await;
    }
}

/// Writes events `ids` on shard 0 with `writer` ([`write_all_ok`]), then reads shard 0 from
/// the start to its end with `reader`, so that every row has its ULID: every row the feed
/// has.
pub async fn write_and_read_all(
    writer: &mut Client,
    feed: &Feed,
    reader: &FeedReader,
    ids: impl IntoIterator<Item = i64>,
) -> Vec<FeedRow<i64>> {
    write_all_ok(writer, feed, 0, ids).await;
    read_to_end(reader, 0, Cursor::START).await
}

/// [`write_event`] for concurrent writers: a transient failure (deadlock victim, lock
/// timeout, dropped connection) is retried, up to [`MAX_WRITE_RETRIES`] times, after
/// checking whether the commit made it (a dropped connection may have lost only the
/// answer). A dropped connection is replaced by a new one to `database`.
pub async fn write_retrying(
    client: &mut Client,
    database: &str,
    feed: &Feed,
    shard: i32,
    id: i64,
) -> Result<(), String> {
    let committed = format!(
        "select count_big(*) from {} where id = {id};",
        feed.quoted_table()
    );
    commit_retrying(
        client,
        database,
        &format!("event {id}"),
        MAX_WRITE_RETRIES,
        &committed,
        |client| {
            let feed = feed.clone();
            Box::pin(async move { write_event(client, &feed, shard, id, None).await })
        },
    )
    .await
    .map_err(|error| format!("write event {id}: {error}"))
}

/// Runs `commit` (one whole transaction, a boxed future so that a writer task stays `Send`)
/// until it succeeds; a transient failure (deadlock
/// victim, lock timeout, dropped connection) is retried up to `max_retries` times, unless
/// `committed` (a `select count_big(*)` of the event) finds the commit made it after all
/// (a dropped connection may have lost only the answer). Retrying one event before the
/// next keeps a writer's commit order. Returns the failure that was not retried.
pub async fn commit_retrying(
    client: &mut Client,
    database: &str,
    what: &str,
    max_retries: u32,
    committed: &str,
    mut commit: impl for<'c> FnMut(&'c mut Client) -> BoxFuture<'c, changefeed::Result<()>>,
) -> changefeed::Result<()> {
    let mut failures: u32 = 0;
    loop {
        match commit(client).await {
            Ok(()) => return Ok(()),
            Err(error) if error.is_transient() && failures < max_retries => {
                failures += 1;
                recover_from_transient(client, database, what, &error).await;
                if scalar_i64(client, committed).await > 0 {
                    return Ok(());
                }
                retry_pause(failures).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// What a writer does after a transient failure of its transaction, before it checks
/// whether the commit made it: says so on stderr, replaces a dropped connection with a new
/// one to `database`, and rolls back what is left of the transaction.
pub async fn recover_from_transient(
    client: &mut Client,
    database: &str,
    what: &str,
    error: &Error,
) {
    eprintln!("-- {what}: transient error, retrying: {error}");
    if matches!(error, Error::Connection(_)) {
        *client = connect_to(database).await;
    }
    let _ = exec(client, "if @@trancount > 0 rollback transaction;").await;
}

/// The pause before retry number `failures`: 20 ms more for each.
pub async fn retry_pause(failures: u32) {
    tokio::time::sleep(Duration::from_millis(20 * u64::from(failures))).await;
}

/// Reads pages with `read_page` (no wait) until one is not full; moves every committed
/// outbox row of the shard on the way, so that every row written so far has its ULID.
pub async fn read_to_end(reader: &FeedReader, shard: i32, from: Cursor) -> Vec<FeedRow<i64>> {
    let mut cursor = from;
    let mut rows = Vec::new();
    loop {
        let page = reader
            .read_page::<i64>(shard, cursor)
            .await
            .unwrap_or_else(|error| panic!("read_page(shard {shard}, {cursor}): {error}"));
        let full = page.is_full();
        cursor = page.next_cursor;
        rows.extend(page.rows);
        if !full {
            return rows;
        }
    }
}

/// The server's clock (`sysutcdatetime()`) in Unix milliseconds: ULID times come from it,
/// not from the test machine's clock, so times are compared with this one.
pub async fn server_now_ms(client: &mut Client) -> i64 {
    scalar_i64(
        client,
        "select datediff_big(millisecond, convert(datetime2(3), '19700101', 112), \
         sysutcdatetime());",
    )
    .await
}

/// The keys of `rows`, in order: what the assertions on which events came compare.
pub fn keys(rows: &[FeedRow<i64>]) -> Vec<i64> {
    rows.iter().map(|row| row.key).collect()
}

/// The ULIDs of `rows`, in order.
pub fn ulids(rows: &[FeedRow<i64>]) -> Vec<Ulid> {
    rows.iter().map(|row| row.ulid).collect()
}

/// The (ULID, key) pairs of `rows`, in order: what two consumers (or a consumer and the
/// feed table) must agree on.
pub fn pairs(rows: &[FeedRow<i64>]) -> Vec<(Ulid, i64)> {
    rows.iter().map(|row| (row.ulid, row.key)).collect()
}

/// `bytes` as a T-SQL binary literal (`0x...`), to put a ULID into a statement.
pub fn hex(bytes: &[u8]) -> String {
    let mut text = String::from("0x");
    for byte in bytes {
        text.push_str(&format!("{byte:02X}"));
    }
    text
}

/// Column `name` of `row`, which must be there and not NULL: a wrong column fails the test
/// with its name.
pub fn required<'a, T: tiberius::FromSql<'a>>(row: &'a Row, name: &str) -> T {
    row.try_get::<T, &str>(name)
        .unwrap_or_else(|error| panic!("column {name}: {error}"))
        .unwrap_or_else(|| panic!("column {name} is NULL"))
}

/// [`exec`] that must succeed: a failure fails the test with the statement.
pub async fn exec_ok(client: &mut Client, sql: &str) {
    exec(client, sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}\n  failed: {error}"));
}

/// [`rows`] that must succeed: a failure fails the test with the statement.
pub async fn rows_ok(client: &mut Client, sql: &str) -> Vec<Row> {
    rows(client, sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}\n  failed: {error}"))
}

/// `columns` of `feed`'s state row for `shard`, none before the shard's first event.
pub async fn state_row(client: &mut Client, feed: &Feed, shard: i32, columns: &str) -> Option<Row> {
    let rows = rows_ok(
        client,
        &format!(
            "select {columns} from {} where shard_id = {shard};",
            feed.object("state")
        ),
    )
    .await;
    rows.into_iter().next()
}

/// The allocator's state row of `shard`, as the reference model's [`ShardState`].
pub async fn read_state(client: &mut Client, feed: &Feed, shard: i32) -> Option<ShardState> {
    let row = state_row(client, feed, shard, "last_ms, ulid_high, next_counter").await?;
    Some(ShardState {
        last_ms: required::<i64>(&row, "last_ms"),
        high: required::<&[u8]>(&row, "ulid_high")
            .try_into()
            .expect("ulid_high is binary(8)"),
        next_counter: required::<i64>(&row, "next_counter"),
    })
}

/// Concurrent writers of `feed`: `writers` tasks (each bounded by `limit`), each on a
/// connection of its own, commit their `events` events `writer * 1_000_000 + seq` (seq from
/// 0) one by one on shard 0 with [`write_retrying`], pausing a random number of milliseconds
/// from `pause_ms` after each.
pub fn spawn_writers(
    db: &TestDb,
    feed: &Feed,
    (writers, events): (i64, i64),
    limit: Duration,
    pause_ms: Range<u64>,
) -> Vec<JoinHandle<Result<(), String>>> {
    spawn_held_writers(db, feed, (writers, events), limit, pause_ms, None)
}

/// [`spawn_writers`] whose writers, with `hold_from` = `(seq, released)`, each wait at
/// event `seq` until `released` is set (checked every 20 ms).
pub fn spawn_held_writers(
    db: &TestDb,
    feed: &Feed,
    (writers, events): (i64, i64),
    limit: Duration,
    pause_ms: Range<u64>,
    hold_from: Option<(i64, Arc<AtomicBool>)>,
) -> Vec<JoinHandle<Result<(), String>>> {
    (0..writers)
        .map(|writer| {
            let database = db.name.clone();
            let feed = feed.clone();
            let pause_ms = pause_ms.clone();
            let hold_from = hold_from.clone();
            spawn_bounded(format!("writer {writer}"), limit, async move {
                let mut client = connect_to(&database).await;
                for seq in 0..events {
                    if let Some((held, released)) = &hold_from
                        && seq == *held
                    {
                        while !released.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    let id = writer * 1_000_000 + seq;
                    write_retrying(&mut client, &database, &feed, 0, id).await?;
                    let pause = rand::random_range(pause_ms.clone());
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Ok(())
            })
        })
        .collect()
}

/// `column` of every row `sql` returns, in order; a NULL fails the test.
pub async fn column_values<T>(client: &mut Client, sql: &str, column: &str) -> Vec<T>
where
    T: for<'a> tiberius::FromSql<'a>,
{
    rows_ok(client, sql)
        .await
        .iter()
        .map(|row| required::<T>(row, column))
        .collect()
}

/// A [`FeedReader`] of `feed` with `options`, on a pool of up to `connections` connections
/// to `db`.
pub async fn feed_reader(
    db: &TestDb,
    feed: &Feed,
    connections: u32,
    options: FeedReaderOptions,
) -> FeedReader {
    let pool = changefeed::pool::pool(&db.ado(), connections)
        .await
        .expect("a pool");
    FeedReader::with_options(pool, feed.clone(), options).expect("valid reader options")
}

/// The SQL Server error number of a call that must fail on the server.
pub fn server_number<T: std::fmt::Debug>(what: &str, result: changefeed::Result<T>) -> u32 {
    match result {
        Ok(value) => panic!("{what}: expected a SQL Server error, got {value:?}"),
        Err(error) => error
            .server_number()
            .unwrap_or_else(|| panic!("{what}: expected a SQL Server error, got {error}")),
    }
}

/// Two feeds of one shape, `tables` (`schema.table`, already set up): the first in outbox
/// mode, the second a serialized-writer feed. Commits one event in each, on shard 0, in a
/// transaction of its own: `values[0]` into the first (`columns`), with its outbox row keyed
/// by `key` (column, value); then, under the second's lock_feed, `values[1]` into the second
/// with its `ulid(1)`. Then creates a login named after `login` that is only in both feeds'
/// readers roles: the feeds, the login and a connection as it.
pub async fn readable_in_both_modes(
    db: &TestDb,
    admin: &mut Client,
    login: &str,
    tables: [&str; 2],
    key: (&str, &str),
    columns: &str,
    values: [&str; 2],
) -> (Feed, Feed, Login, Client) {
    let [outbox, serial] = tables.map(|table| {
        table
            .parse::<Feed>()
            .unwrap_or_else(|error| panic!("{table} is a valid feed name: {error}"))
    });
    let ((key_column, key_value), [outbox_values, serial_values]) = (key, values);
    exec_ok(
        admin,
        &format!(
            "set xact_abort on; begin transaction; \
             insert into {} ({columns}) values ({outbox_values}); \
             insert into {} (shard_id, {key_column}) values (0, {key_value}); \
             commit transaction; \
             begin transaction; \
             exec {} @shard_id = 0; \
             insert into {} ({columns}, Shard, ULID) values ({serial_values}, 0, {}(1)); \
             commit transaction;",
            outbox.quoted_table(),
            outbox.outbox_table(),
            serial.object("lock_feed"),
            serial.quoted_table(),
            serial.object("ulid"),
        ),
    )
    .await;
    let reader = Login::new(login, db);
    reader
        .create(admin, &[outbox.readers_role(), serial.readers_role()], &[])
        .await;
    let client = reader.connect(db).await;
    (outbox, serial, reader, client)
}
