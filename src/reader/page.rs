//! One page of a feed: what [`read_page`] and [`read_events`] ask `read_feed` for, the
//! rows they decode ([`FeedRow`], [`FeedEvent`], [`Page`]), and the bounds on a call whose
//! connection may die silently ([`CallBounds`]).

use std::time::Duration;

use futures::{Stream, StreamExt};
use tiberius::Row;
use ulid::Ulid;

use crate::connection::Client;
use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::row::{Column, FromRow};

/// The largest page `read_feed` accepts.
pub const MAX_PAGE_SIZE: u32 = 10_000;

/// The longest long-poll `read_feed` accepts (`@wait_ms` up to 3 600 000).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// How long `read_feed` may wait for its shard's lock after its long-poll
/// (`sp_getapplock @LockTimeout = 10000` in both modes' procedures).
pub const SHARD_LOCK_WAIT: Duration = Duration::from_secs(10);

/// What to ask `read_feed` for.
///
/// Built from [`Default`] with setters, so that a field added later is not a breaking
/// change:
///
/// ```
/// use changefeed::ReadOptions;
///
/// let options = ReadOptions::default().page_size(500).wait_ms(2_000);
/// assert_eq!((options.page_size, options.wait_ms), (500, 2_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Rows per page, 1..=[`MAX_PAGE_SIZE`].
    pub page_size: u32,
    /// With nothing to return, how long the server waits for rows before it answers with an
    /// empty page (long-poll), in milliseconds; 0 answers at once.
    pub wait_ms: u32,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            page_size: 1000,
            wait_ms: 0,
        }
    }
}

impl ReadOptions {
    setters! {
        /// Sets `page_size`, rows per page (1..=[`MAX_PAGE_SIZE`]).
        page_size: u32;
        /// Sets `wait_ms`, the server long-poll in milliseconds (0: answer at
        /// once).
        wait_ms: u32;
    }
}

/// One row of a feed: its ULID and the event's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedRow<K> {
    /// The row's position in its shard.
    pub ulid: Ulid,
    /// The event table's primary key, decoded with [`FromRow`].
    pub key: K,
}

/// One row of a feed read with `@with_event = 1`: its ULID and the whole event row.
///
/// `read_feed` then returns `ulid` followed by every column of the event table; `event` is
/// decoded from those columns (from column 1 on) with [`FromRow`] — by hand, or with serde
/// through [`crate::row::Serde`] / [`crate::row::deserialize`].
///
/// An event row deleted since it was written still comes back (so the cursor moves past
/// it), with every event column NULL: decode `FeedEvent<Option<E>>` if that can happen, as
/// a NULL in a non-`Option` column is a decoding error, which ends a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEvent<E> {
    /// The row's position in its shard.
    pub ulid: Ulid,
    /// The event, decoded with [`FromRow`].
    pub event: E,
}

/// A page of rows in ULID order, and the cursor to continue from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    /// The rows, in ULID order.
    pub rows: Vec<T>,
    /// The ULID of the last row, or the requested cursor when the page is empty: pass it
    /// to the next read.
    pub next_cursor: Cursor,
    /// The page size asked for; a full page means more rows may be waiting.
    pub page_size: u32,
}

impl<T> Page<T> {
    /// Whether the page holds as many rows as asked for (read again at once).
    pub fn is_full(&self) -> bool {
        self.rows.len() >= self.page_size as usize
    }
}

/// What a feed row decodes into: [`FeedRow`] (keys) or [`FeedEvent`] (whole events).
pub trait FeedItem: Sized {
    /// Whether `read_feed` is called with `@with_event = 1`.
    const WITH_EVENT: bool;

    /// Decodes a row of `read_feed` whose column 0, the ULID, is already decoded.
    fn from_feed_row(ulid: Ulid, row: &Row) -> Result<Self>;

    /// Decodes a row of the feed's PostgreSQL read function (`read_feed_<id>` for keys,
    /// `read_events_<id>` for events, their composite column expanded) whose column 0, the
    /// `ulid bytea`, is already decoded; the keys or the event are the columns from 1 on.
    ///
    /// The default fails with [`Error::Decode`]: [`FeedRow`] and [`FeedEvent`] implement it
    /// (with [`FromRow::from_pg_row`]); an item of your own must too, to be read from
    /// PostgreSQL.
    ///
    /// ```no_run
    /// use changefeed::reader::{FeedItem, FeedRow};
    /// use changefeed::row::Column;
    ///
    /// # fn run(row: &tokio_postgres::Row) -> changefeed::Result<()> {
    /// let ulid = ulid::Ulid::pg_column(row, 0)?;
    /// let item = FeedRow::<(i64, String)>::from_pg_row(ulid, row)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    fn from_pg_row(ulid: Ulid, row: &tokio_postgres::Row) -> Result<Self> {
        let _ = row;
        Err(Error::Decode {
            column: "position 1".to_owned(),
            reason: format!(
                "{} cannot be read from PostgreSQL: implement FeedItem::from_pg_row",
                std::any::type_name::<Self>()
            ),
            row: Some(ulid),
        })
    }

    /// The row's ULID: the cursor after it.
    fn ulid(&self) -> Ulid;
}

impl<K: FromRow> FeedItem for FeedRow<K> {
    const WITH_EVENT: bool = false;

    fn from_feed_row(ulid: Ulid, row: &Row) -> Result<Self> {
        Ok(FeedRow {
            ulid,
            key: K::from_row(row, 1)?,
        })
    }

    #[cfg(feature = "postgres")]
    fn from_pg_row(ulid: Ulid, row: &tokio_postgres::Row) -> Result<Self> {
        Ok(FeedRow {
            ulid,
            key: K::from_pg_row(row, 1)?,
        })
    }

    fn ulid(&self) -> Ulid {
        self.ulid
    }
}

impl<E: FromRow> FeedItem for FeedEvent<E> {
    const WITH_EVENT: bool = true;

    fn from_feed_row(ulid: Ulid, row: &Row) -> Result<Self> {
        Ok(FeedEvent {
            ulid,
            event: E::from_row(row, 1)?,
        })
    }

    #[cfg(feature = "postgres")]
    fn from_pg_row(ulid: Ulid, row: &tokio_postgres::Row) -> Result<Self> {
        Ok(FeedEvent {
            ulid,
            event: E::from_pg_row(row, 1)?,
        })
    }

    fn ulid(&self) -> Ulid {
        self.ulid
    }
}

/// Reads the next page of `shard` after `cursor` with `read_feed`, decoding each key as `K`.
///
/// ```no_run
/// # async fn run(client: &mut changefeed::Client) -> changefeed::Result<()> {
/// use changefeed::{Cursor, Feed, ReadOptions, read_page};
///
/// let feed: Feed = "myservice.MyEvent".parse()?;
/// let mut cursor = Cursor::START;
/// loop {
///     let page = read_page::<i64>(client, &feed, 0, cursor, ReadOptions::default()).await?;
///     for row in &page.rows {
///         println!("{} {}", row.ulid, row.key);
///     }
///     cursor = page.next_cursor;
///     if !page.is_full() { break; }
/// }
/// # Ok(()) }
/// ```
pub async fn read_page<K: FromRow>(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
    options: ReadOptions,
) -> Result<Page<FeedRow<K>>> {
    read_items(client, feed, shard, cursor, options).await
}

/// Like [`read_page`], with `@with_event = 1`: every row carries its whole event, decoded
/// as `E` from column 1 on.
pub async fn read_events<E: FromRow>(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
    options: ReadOptions,
) -> Result<Page<FeedEvent<E>>> {
    read_items(client, feed, shard, cursor, options).await
}

/// Reads one page of `read_feed` into any [`FeedItem`]: what [`read_page`] and
/// [`read_events`] call.
pub async fn read_items<T: FeedItem>(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
    options: ReadOptions,
) -> Result<Page<T>> {
    read_items_within(client, feed, shard, cursor, options, None).await
}

/// The `read_feed` call of [`read_items`]: parameters `@P1` shard, `@P2` cursor, `@P3` page
/// size, `@P4` wait in milliseconds.
pub(super) fn read_feed_sql<T: FeedItem>(feed: &Feed) -> String {
    // The procedure name comes from a validated Feed (no ']' or quote can occur in it);
    // every value is a parameter (`@with_event = 1` is a constant of this code). It always
    // asks for a result set: a #read left in a pooled session must not swallow the page.
    let mut sql = format!(
        "exec {} @shard_id = @P1, @cursor = @P2, @page_size = @P3, @wait_ms = @P4, \
         @use_read_table = 0",
        feed.read_feed_procedure()
    );
    if T::WITH_EVENT {
        sql.push_str(", @with_event = 1");
    }
    sql
}

/// Decodes the rows of one `read_feed` result into a page after `cursor`.
fn decode_page<T: FeedItem>(rows: &[Row], cursor: Cursor, page_size: u32) -> Result<Page<T>> {
    decode_page_with(rows, cursor, page_size, |row| {
        let ulid = Ulid::column(row, 0)?;
        T::from_feed_row(ulid, row).map_err(|e| e.at_row(ulid))
    })
}

/// Decodes the rows of one page of the feed's PostgreSQL read function after `cursor`.
#[cfg(feature = "postgres")]
pub(super) fn decode_pg_page<T: FeedItem>(
    rows: &[tokio_postgres::Row],
    cursor: Cursor,
    page_size: u32,
) -> Result<Page<T>> {
    decode_page_with(rows, cursor, page_size, |row| {
        let ulid = Ulid::pg_column(row, 0)?;
        T::from_pg_row(ulid, row).map_err(|e| e.at_row(ulid))
    })
}

/// The page of `rows` after `cursor`, each decoded with `decode` (either driver's rows).
fn decode_page_with<R, T: FeedItem>(
    rows: &[R],
    cursor: Cursor,
    page_size: u32,
    decode: impl Fn(&R) -> Result<T>,
) -> Result<Page<T>> {
    let mut decoded = Vec::with_capacity(rows.len());
    for row in rows {
        decoded.push(decode(row)?);
    }
    let next_cursor = decoded
        .last()
        .map_or(cursor, |row| Cursor::from_ulid(row.ulid()));
    Ok(Page {
        rows: decoded,
        next_cursor,
        page_size,
    })
}

/// The two bounds on a `read_feed` call whose connection may die silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallBounds {
    /// The longest wait for the first answer (the result's column description, which
    /// `read_feed` sends once its page is ready): the long-poll plus the margin.
    pub first: Duration,
    /// The longest silence between two later parts of the answer: the margin.
    pub idle: Duration,
}

/// Which bound of [`CallBounds`] a call overran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overrun {
    /// No first answer within [`CallBounds::first`].
    FirstAnswer(Duration),
    /// The answer stopped for [`CallBounds::idle`] half-way through the page.
    MidPage(Duration),
}

impl Overrun {
    /// The transient error of a call of `feed`'s shard `shard` that overran.
    fn into_error(self, feed: &Feed, shard: i32) -> Error {
        let what = match self {
            Overrun::FirstAnswer(bound) => {
                format!("did not answer within {bound:?} (the long-poll plus the margin)")
            }
            Overrun::MidPage(bound) => {
                format!("stopped sending its page: nothing came for {bound:?}")
            }
        };
        Error::Connection(format!(
            "read_feed of {feed} shard {shard} {what}: the connection is presumed dead and \
             was dropped"
        ))
    }
}

/// Collects the rows of the first result set of `items` (a tiberius `QueryStream`), each
/// part of it within `idle` of the one before: however long the whole page takes, only a
/// silence longer than `idle` fails it.
pub async fn collect_first_result<S>(
    items: S,
    idle: Duration,
) -> std::result::Result<Result<Vec<Row>>, Overrun>
where
    S: Stream<Item = tiberius::Result<tiberius::QueryItem>>,
{
    let mut items = std::pin::pin!(items);
    let mut rows = Vec::new();
    loop {
        match tokio::time::timeout(idle, items.next()).await {
            Err(_elapsed) => return Err(Overrun::MidPage(idle)),
            Ok(None) => return Ok(Ok(rows)),
            Ok(Some(Err(error))) => return Ok(Err(error.into())),
            Ok(Some(Ok(tiberius::QueryItem::Row(row)))) if row.result_index() == 0 => {
                rows.push(row);
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// [`read_items`], and with `bounds` under [`CallBounds`] rather than one bound on the whole
/// call, for a connection that may die without a word.
pub(super) async fn read_items_within<T: FeedItem>(
    client: &mut Client,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
    options: ReadOptions,
    bounds: Option<CallBounds>,
) -> Result<Page<T>> {
    let cursor_bytes = cursor.to_bytes();
    let (page_size, wait_ms) = (options.page_size as i32, options.wait_ms as i32);
    let params: [&dyn tiberius::ToSql; 4] = [&shard, &&cursor_bytes[..], &page_size, &wait_ms];
    let query = client.query(read_feed_sql::<T>(feed), &params);
    let rows = match bounds {
        None => query.await?.into_first_result().await?,
        Some(bounds) => {
            let stream = match tokio::time::timeout(bounds.first, query).await {
                Err(_elapsed) => {
                    return Err(Overrun::FirstAnswer(bounds.first).into_error(feed, shard));
                }
                Ok(stream) => stream?,
            };
            collect_first_result(stream, bounds.idle)
                .await
                .map_err(|overrun| overrun.into_error(feed, shard))??
        }
    };
    decode_page(&rows, cursor, options.page_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiberius::{ColumnData as D, ColumnType as T};
    use tokio::time::Instant;

    fn key_row(key: i64, result_index: usize) -> tiberius::QueryItem {
        tiberius::QueryItem::Row(
            tiberius::Row::builder()
                .column("ulid", T::BigBinary, D::Binary(Some(vec![0u8; 16].into())))
                .column("id", T::Int8, D::I64(Some(key)))
                .result_index(result_index)
                .build(),
        )
    }

    /// Rows arriving `gaps` apart (virtual time), one per gap.
    fn arriving(gaps: Vec<Duration>) -> impl Stream<Item = tiberius::Result<tiberius::QueryItem>> {
        futures::stream::iter(gaps.into_iter().enumerate()).then(|(key, gap)| async move {
            tokio::time::sleep(gap).await;
            Ok(key_row(key as i64, 0))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_page_that_keeps_arriving_is_not_cut_off() {
        let idle = Duration::from_secs(15);
        // 40 rows 5 s apart: 200 s in all, far past the margin, but never silent for 15 s.
        let started = Instant::now();
        let rows = collect_first_result(arriving(vec![Duration::from_secs(5); 40]), idle)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rows.len(), 40);
        assert!(started.elapsed() >= Duration::from_secs(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_that_stops_arriving_is_an_overrun() {
        let idle = Duration::from_secs(15);
        let mut gaps = vec![Duration::from_secs(1); 5];
        gaps.push(Duration::from_secs(16));
        let outcome = collect_first_result(arriving(gaps), idle).await;
        assert_eq!(outcome.unwrap_err(), Overrun::MidPage(idle));
        let feed: Feed = "app.Event".parse().unwrap();
        let error = Overrun::MidPage(idle).into_error(&feed, 2);
        assert!(error.is_transient(), "{error}");
        assert!(error.to_string().contains("app.Event shard 2"), "{error}");
    }

    #[tokio::test]
    async fn only_the_first_result_is_collected_and_errors_pass_through() {
        let items =
            futures::stream::iter([Ok(key_row(1, 0)), Ok(key_row(2, 1)), Ok(key_row(3, 0))]);
        let rows = collect_first_result(items, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        let keys: Vec<i64> = rows
            .iter()
            .map(|row| i64::column(row, 1).unwrap())
            .collect();
        assert_eq!(keys, [1, 3]);
        let failing = futures::stream::iter([
            Ok(key_row(1, 0)),
            Err(tiberius::error::Error::Protocol("torn".into())),
        ]);
        let outcome = collect_first_result(failing, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(outcome.is_err());
    }

    #[test]
    fn feed_items_decode_from_column_one() {
        let row = tiberius::Row::builder()
            .column("ulid", T::BigBinary, D::Binary(Some(vec![2u8; 16].into())))
            .column("id", T::Int8, D::I64(Some(9)))
            .column("name", T::NVarchar, D::String(Some("x".into())))
            .build();
        let ulid = Ulid::column(&row, 0).unwrap();
        let key = <FeedRow<i64>>::from_feed_row(ulid, &row).unwrap();
        assert_eq!(key, FeedRow { ulid, key: 9 });
        let event = <FeedEvent<(i64, String)>>::from_feed_row(ulid, &row).unwrap();
        assert_eq!(event.event, (9, "x".to_owned()));
        assert_eq!(FeedItem::ulid(&event), ulid);
        const { assert!(<FeedEvent<i64> as FeedItem>::WITH_EVENT) };
        const { assert!(!<FeedRow<i64> as FeedItem>::WITH_EVENT) };
    }
}
