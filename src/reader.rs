//! Reading a feed: one page at a time with [`read_page`], or as an endless stream of pages
//! with [`FeedReader`].
//!
//! The stream's state machine ([`page_stream`]) is generic over a [`PageSource`], so it is
//! tested without a server; [`PoolSource`] is the real source, `read_feed` over a
//! [`Pool`] connection.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use futures::{Stream, StreamExt};
use rand::{Rng, RngExt};
use tiberius::Row;
use tokio::time::Instant;
use tracing::Instrument;
use ulid::Ulid;

use crate::connection::Client;
use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::pool::{Pool, PooledConnection};
use crate::row::{Column, FromRow};

/// The largest page `read_feed` accepts.
pub const MAX_PAGE_SIZE: u32 = 10_000;

/// The longest long-poll `read_feed` accepts (`@wait_ms` up to 3 600 000).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// How long `read_feed` may wait for its shard's lock after its long-poll
/// (`sp_getapplock @LockTimeout = 10000` in both modes' procedures).
pub const SHARD_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The least `timeout_margin` of [`FeedReaderOptions`]: the shard-lock wait plus 2 s for the
/// network and the work `read_feed` does after it, so a call that is only waiting for its
/// lock is never taken for a dead connection.
pub const MIN_TIMEOUT_MARGIN: Duration = Duration::from_secs(12);

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
fn read_feed_sql<T: FeedItem>(feed: &Feed) -> String {
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
    let mut decoded = Vec::with_capacity(rows.len());
    for row in rows {
        let ulid = Ulid::column(row, 0)?;
        decoded.push(T::from_feed_row(ulid, row).map_err(|e| e.at_row(ulid))?);
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
async fn read_items_within<T: FeedItem>(
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

/// The names of `feed`'s key columns, in key order: the columns after `ulid` of a
/// `read_feed` call with `@with_event = 0`, read from the result's column description (which
/// the server sends even for an empty page). The call reads at most one row of shard 0 with
/// no wait, outside any transaction, so membership in the feed's readers role suffices.
///
/// What to do about error `number` (2812: no such procedure; 229: no permission) when
/// [`key_columns`] reads `feed`.
fn key_columns_advice(feed: &Feed, number: u32) -> String {
    if number == 2812 {
        format!(
            "feed {feed} does not exist ({} is missing): check the name (schema.table), or \
             set the feed up with changefeed.setup_feed",
            feed.read_feed_procedure()
        )
    } else {
        format!(
            "the login may not read feed {feed}: add it to the role {} (or db_owner)",
            feed.readers_role()
        )
    }
}

/// A feed that does not exist (no `read_feed` procedure, SQL Server error 2812) or that the
/// login may not read (229) is an [`Error::Server`] with that number and a message saying
/// what to do.
pub async fn key_columns(client: &mut Client, feed: &Feed) -> Result<Vec<String>> {
    let cursor = Cursor::START.to_bytes();
    let (page_size, wait_ms) = (1i32, 0i32);
    let params: [&dyn tiberius::ToSql; 4] = [&0i32, &&cursor[..], &page_size, &wait_ms];
    let named = |error: Error| match error {
        Error::Server {
            number,
            state,
            class,
            message,
        } if number == 2812 || number == 229 => {
            let fix = key_columns_advice(feed, number);
            Error::Server {
                number,
                state,
                class,
                message: format!("{fix} ({message})"),
            }
        }
        other => other,
    };
    let mut stream = client
        .query(
            read_feed_sql::<FeedRow<crate::json::JsonColumns>>(feed),
            &params,
        )
        .await
        .map_err(|error| named(error.into()))?;
    let columns = stream
        .columns()
        .await
        .map_err(|error| named(error.into()))?
        .map(|columns| {
            columns
                .iter()
                .map(|column| column.name().to_owned())
                .collect::<Vec<_>>()
        });
    // Drained, so that the connection is ready for its next call.
    stream.into_results().await?;
    match columns.as_deref() {
        Some([ulid, keys @ ..]) if ulid.eq_ignore_ascii_case("ulid") && !keys.is_empty() => {
            Ok(keys.to_vec())
        }
        _ => Err(Error::Config(format!(
            "read_feed of {feed} returned the columns {columns:?}, not ulid and the key \
             columns: upgrade the feed with changefeed.upgrade_feed"
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// Options

/// How a caught-up stream waits for new rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Server long-poll: every read passes `@wait_ms`, and `read_feed` holds the call until
    /// rows come or the time passes (holding no lock or transaction meanwhile). Rows are
    /// delivered within milliseconds of their commit at the cost of one open call per
    /// waiting stream. If the server answers an empty page much sooner than asked (it did
    /// not wait), the stream falls back to the client back-off for that pause.
    LongPoll(Duration),
    /// Client back-off: reads never wait on the server; after a page that is not full the
    /// stream sleeps the [`IdleBackoff`]'s `min`, doubling after each empty page up to its
    /// `max`.
    ClientBackoff,
}

/// The client-side sleep between polls of a caught-up stream: `min`, doubling after every
/// consecutive empty page, capped at `max`; a page with rows resets it.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::IdleBackoff;
///
/// let backoff = IdleBackoff::default()
///     .min(Duration::from_millis(50))
///     .max(Duration::from_secs(2));
/// assert_eq!(backoff.delay(3), Duration::from_millis(400));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdleBackoff {
    /// The first sleep. Default 100 ms; at least 1 ms.
    pub min: Duration,
    /// The longest sleep. Default 5 s; at least `min`.
    pub max: Duration,
}

impl Default for IdleBackoff {
    fn default() -> Self {
        IdleBackoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl IdleBackoff {
    setters! {
        /// Sets `min`, the first sleep (at least 1 ms).
        min: Duration;
        /// Sets `max`, the longest sleep (at least `min`).
        max: Duration;
    }

    /// The sleep after `streak` consecutive empty polls before this one (0 for the first):
    /// `min × 2^streak`, at most `max`.
    pub fn delay(&self, streak: u32) -> Duration {
        exponential(self.min, self.max, streak)
    }
}

/// `initial × 2^doublings`, at most `cap`: the bounded exponential back-off of the stream's
/// idle sleep, and of the Kafka exporter's re-produce.
pub(crate) fn exponential(initial: Duration, cap: Duration, doublings: u32) -> Duration {
    let factor = 1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(cap)
}

/// How a stream retries transient failures (see [`Error::is_transient`]): capped
/// exponential back-off with full jitter, each retry on a fresh connection.
///
/// Retry `n` (1 for the first after a failure) sleeps a delay drawn uniformly from
/// `[0, min(max, initial × 2^(n−1))]`. After `max_retries` consecutive failed retries the
/// stream yields the error and ends; a successful read resets the count.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::ReadRetryPolicy;
///
/// let retry = ReadRetryPolicy::default()
///     .initial(Duration::from_millis(50))
///     .max_retries(None); // retry forever
/// assert_eq!(retry.ceiling(3), Duration::from_millis(200));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadRetryPolicy {
    /// The upper end of the first delay. Default 100 ms; at least 1 ms.
    pub initial: Duration,
    /// The cap on every delay. Default 10 s; at least `initial`.
    pub max: Duration,
    /// How many consecutive transient failures are retried; `None` retries forever.
    /// Default `Some(20)`: with the default delays, about 70 s of back-off on average
    /// (at most about 140 s), enough to ride out an Azure SQL failover.
    pub max_retries: Option<u32>,
}

impl Default for ReadRetryPolicy {
    fn default() -> Self {
        ReadRetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_retries: Some(20),
        }
    }
}

impl ReadRetryPolicy {
    setters! {
        /// Sets `initial`, the upper end of the first delay (at least 1 ms).
        initial: Duration;
        /// Sets `max`, the cap on every delay (at least `initial`).
        max: Duration;
        /// Sets `max_retries`; `None` retries forever.
        max_retries: Option<u32>;
    }

    /// The upper end of retry `retry`'s delay (1-based): `min(max, initial × 2^(retry−1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        exponential(self.initial, self.max, retry.saturating_sub(1))
    }

    /// A delay for retry `retry` (1-based), drawn from `[0, ceiling(retry)]` with `rng`.
    pub fn delay_with<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(retry).as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(rng.random_range(0..=ceiling))
    }

    /// A delay for retry `retry` (1-based), drawn from `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, &mut rand::rng())
    }

    /// Whether the `failures`-th consecutive transient failure is still retried.
    pub fn retries(&self, failures: u32) -> bool {
        self.max_retries.is_none_or(|max| failures <= max)
    }
}

/// The settings of a [`FeedReader`] and of [`page_stream`]: [`Default`], then setters.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::{FeedReaderOptions, ReadRetryPolicy, Wait};
///
/// let options = FeedReaderOptions::default()
///     .page_size(500)
///     .wait(Wait::LongPoll(Duration::from_secs(20)))
///     .retry(ReadRetryPolicy::default().max_retries(Some(5)));
/// options.validate()?;
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FeedReaderOptions {
    /// Rows per page, 1..=[`MAX_PAGE_SIZE`]. Default 1000.
    pub page_size: u32,
    /// How a caught-up stream waits. Default `Wait::LongPoll(10 s)`.
    pub wait: Wait,
    /// The client back-off (the fallback under `LongPoll`). Default 100 ms to 5 s.
    pub idle_backoff: IdleBackoff,
    /// Retries of transient failures.
    pub retry: ReadRetryPolicy,
    /// How long a connection may stay silent before it is presumed dead: the first
    /// answer of a `read_feed` call must come within the long-poll plus this margin, and
    /// each later part of a page within this margin of the one before (a large
    /// `@with_event` page that keeps arriving is never cut off). A silent connection is
    /// abandoned and discarded, and the read retried as a transient failure. It covers the
    /// network and the work `read_feed` does after its wait, including up to
    /// [`SHARD_LOCK_WAIT`] for the shard's lock. Default 15 s; at least
    /// [`MIN_TIMEOUT_MARGIN`] (12 s).
    pub timeout_margin: Duration,
}

impl Default for FeedReaderOptions {
    fn default() -> Self {
        FeedReaderOptions {
            page_size: 1000,
            wait: Wait::LongPoll(Duration::from_secs(10)),
            idle_backoff: IdleBackoff::default(),
            retry: ReadRetryPolicy::default(),
            timeout_margin: Duration::from_secs(15),
        }
    }
}

impl FeedReaderOptions {
    setters! {
        /// Sets `page_size`, rows per page (1..=[`MAX_PAGE_SIZE`]).
        page_size: u32;
        /// Sets `wait`, how a caught-up stream waits.
        wait: Wait;
        /// Sets `idle_backoff`, the client back-off.
        idle_backoff: IdleBackoff;
        /// Sets `retry`, the retries of transient failures.
        retry: ReadRetryPolicy;
        /// Sets `timeout_margin` (at least [`MIN_TIMEOUT_MARGIN`]).
        timeout_margin: Duration;
    }

    /// Checks the options; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(Error::Config(message));
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return bad(format!(
                "page_size is {}; it must be between 1 and {MAX_PAGE_SIZE}",
                self.page_size
            ));
        }
        if let Wait::LongPoll(wait) = self.wait
            && (wait < Duration::from_millis(1) || wait > MAX_WAIT)
        {
            return bad(format!(
                "the long-poll wait is {wait:?}; it must be between 1 ms and 1 hour (use \
                 Wait::ClientBackoff not to wait on the server)"
            ));
        }
        if self.idle_backoff.min < Duration::from_millis(1)
            || self.idle_backoff.max < self.idle_backoff.min
        {
            return bad(format!(
                "idle_backoff is {:?}; min must be at least 1 ms (0 would poll in a hot loop) \
                 and max at least min",
                self.idle_backoff
            ));
        }
        if self.retry.initial < Duration::from_millis(1) || self.retry.max < self.retry.initial {
            return bad(format!(
                "retry is {:?}; initial must be at least 1 ms and max at least initial",
                self.retry
            ));
        }
        if self.timeout_margin < MIN_TIMEOUT_MARGIN {
            return bad(format!(
                "timeout_margin is {:?}; it must be at least {MIN_TIMEOUT_MARGIN:?}, or a \
                 read_feed call waiting up to {SHARD_LOCK_WAIT:?} for its shard's lock would \
                 be taken for a dead connection",
                self.timeout_margin
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The stream state machine

/// Where a stream gets its pages: `read_feed` over a connection ([`PoolSource`]), or a fake
/// in tests.
pub trait PageSource: Send + 'static {
    /// What a page holds.
    type Item: Send + 'static;

    /// Reads the page of `shard` after `cursor`; with nothing to return, the server may
    /// wait up to `wait` for rows (zero: answer at once).
    fn read(
        &mut self,
        shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> impl Future<Output = Result<Page<Self::Item>>> + Send;

    /// Drops the current connection, if any: the next read uses a fresh one. Called after
    /// every transient failure.
    fn reset(&mut self);
}

/// The stream of pages of `shard` from `cursor` on, read from `source`.
///
/// * Full pages come back to back; a page that is not full means the stream is caught up,
///   and it waits as the options' `wait` says before the next read. It never polls
///   in a loop: after an empty page it either had the server wait (long-poll) or sleeps
///   the [`IdleBackoff`]. Empty pages are not yielded.
/// * A transient error ([`Error::is_transient`]) calls [`PageSource::reset`] and retries
///   after the [`ReadRetryPolicy`] delay, from the cursor of the last page yielded: no row
///   is lost or repeated. After `max_retries` consecutive failures the error is yielded
///   and the stream ends.
/// * Any other error (unknown feed or missing procedure 2812, permission denied 229, bad
///   arguments 51101, a cursor expired by retention 51104, decoding) is yielded once and
///   ends the stream. Invalid options are
///   yielded as an [`Error::Config`] first thing.
/// * Nothing runs in the background: the stream is a state machine polled by its consumer,
///   and dropping it stops everything at once (an in-flight read is dropped with it).
///
/// `options.page_size` and `options.timeout_margin` are the source's business; the stream
/// uses the others.
pub fn page_stream<S: PageSource>(
    mut source: S,
    shard: i32,
    cursor: Cursor,
    options: FeedReaderOptions,
) -> impl Stream<Item = Result<Page<S::Item>>> + Send + 'static {
    async_stream::stream! {
        if let Err(error) = options.validate() {
            yield Err(error);
            return;
        }
        let wait = match options.wait {
            Wait::LongPoll(wait) => wait,
            Wait::ClientBackoff => Duration::ZERO,
        };
        let mut cursor = cursor;
        let mut failures: u32 = 0;
        let mut idle_streak: u32 = 0;
        loop {
            let started = Instant::now();
            match source.read(shard, cursor, wait).await {
                Ok(page) => {
                    failures = 0;
                    let pause = if page.is_full() {
                        idle_streak = 0;
                        None
                    } else if !page.rows.is_empty() {
                        // Caught up, with rows: under long-poll the next read waits on the
                        // server; under client back-off, sleep the shortest pause.
                        idle_streak = 0;
                        wait.is_zero().then_some(options.idle_backoff.min)
                    } else if !wait.is_zero() && started.elapsed() >= wait / 2 {
                        // The server long-polled: poll again at once.
                        idle_streak = 0;
                        None
                    } else {
                        let delay = options.idle_backoff.delay(idle_streak);
                        idle_streak = idle_streak.saturating_add(1);
                        Some(delay)
                    };
                    if !page.rows.is_empty() {
                        cursor = page.next_cursor;
                        yield Ok(page);
                    }
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(error) if error.is_transient() => {
                    source.reset();
                    failures = failures.saturating_add(1);
                    if !options.retry.retries(failures) {
                        tracing::error!(
                            shard, %cursor, failures, %error,
                            "changefeed stream: giving up after consecutive transient failures"
                        );
                        yield Err(error);
                        return;
                    }
                    let delay = options.retry.delay(failures);
                    tracing::warn!(
                        shard,
                        %cursor,
                        retry = failures,
                        delay_ms = delay.as_millis() as u64,
                        %error,
                        "changefeed stream: transient failure, retrying on a fresh connection"
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    tracing::error!(
                        shard, %cursor, %error,
                        "changefeed stream: permanent failure, ending"
                    );
                    yield Err(error);
                    return;
                }
            }
        }
    }
}

/// Merges per-shard streams into one stream of `(shard, page)`; the pages of each shard
/// keep their order, shards interleave as their pages come. A shard's stream that ends
/// (after its error) leaves the others running; the merged stream ends when all have.
pub fn merge_shards<T, S, I>(streams: I) -> impl Stream<Item = (i32, Result<Page<T>>)> + Send
where
    I: IntoIterator<Item = (i32, S)>,
    S: Stream<Item = Result<Page<T>>> + Send + 'static,
    T: Send + 'static,
{
    futures::stream::select_all(
        streams
            .into_iter()
            .map(|(shard, stream)| Box::pin(stream.map(move |page| (shard, page)))),
    )
}

// ---------------------------------------------------------------------------------------
// The real source and the reader

/// The long-poll to ask of the server on a connection whose tiberius command timeout is
/// `command_timeout`: `wait`, but no more than the timeout minus `margin`, so a long-poll
/// is never cut off by tiberius. Zero when the timeout is shorter than the margin.
pub fn effective_wait(
    wait: Duration,
    command_timeout: Option<Duration>,
    margin: Duration,
) -> Duration {
    match command_timeout {
        Some(timeout) => wait.min(timeout.saturating_sub(margin)),
        None => wait,
    }
}

/// A [`PageSource`] calling `read_feed` on a connection of a [`Pool`].
///
/// It holds one pooled connection between reads (one pool slot per running stream) and
/// lets it go on [`PageSource::reset`] or on any failure, marked broken so the pool
/// discards it. A read abandoned half-way (its future dropped) also leaves the connection
/// marked broken.
pub struct PoolSource<T> {
    pool: Pool,
    feed: Feed,
    page_size: u32,
    margin: Duration,
    conn: Option<PooledConnection>,
    item: PhantomData<fn() -> T>,
}

impl<T> PoolSource<T> {
    /// The same source reading `page_size` rows per call (the reader's own page size
    /// otherwise).
    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }

    fn discard(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.mark_broken();
        }
    }
}

impl<T> std::fmt::Debug for PoolSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolSource")
            .field("feed", &self.feed)
            .field("page_size", &self.page_size)
            .field("margin", &self.margin)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl<T: FeedItem + Send + 'static> PoolSource<T> {
    /// One `read_feed` call with a long-poll of at most `wait` (less if the connection's
    /// command timeout needs it); returns the wait it asked of the server.
    async fn call(
        &mut self,
        shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> Result<(Page<T>, Duration)> {
        if self.conn.is_none() {
            self.conn = Some(self.pool.get_owned().await?);
        }
        let Some(conn) = self.conn.as_mut() else {
            unreachable!("the connection was just set");
        };
        let wait = effective_wait(wait, conn.command_timeout(), self.margin);
        let bounds = CallBounds {
            first: wait + self.margin,
            idle: self.margin,
        };
        let options = ReadOptions {
            page_size: self.page_size,
            wait_ms: wait.as_millis().min(MAX_WAIT.as_millis()) as u32,
        };
        // Broken until the call completes: dropped half-way, it stays marked.
        conn.set_broken(true);
        match read_items_within::<T>(conn, &self.feed, shard, cursor, options, Some(bounds)).await {
            Ok(page) => {
                conn.set_broken(false);
                Ok((page, wait))
            }
            Err(error) => {
                self.discard();
                Err(error)
            }
        }
    }
}

impl<T: FeedItem + Send + 'static> PageSource for PoolSource<T> {
    type Item = T;

    /// Calls `read_feed`. A `wait` longer than the connection allows (see
    /// [`effective_wait`]) is served as consecutive shorter long-polls on the same
    /// connection until rows come or `wait` has passed.
    async fn read(&mut self, shard: i32, cursor: Cursor, wait: Duration) -> Result<Page<T>> {
        let span = tracing::debug_span!(
            "changefeed.read",
            feed = %self.feed,
            shard,
            cursor = %cursor,
            with_event = T::WITH_EVENT,
        );
        async {
            let started = Instant::now();
            let deadline = started + wait;
            let mut calls = 0u32;
            let result = loop {
                let call_started = Instant::now();
                let remaining = deadline.saturating_duration_since(call_started);
                calls += 1;
                match self.call(shard, cursor, remaining).await {
                    // Cut short by the connection's bound, and the server did wait: go on.
                    Ok((page, asked))
                        if page.rows.is_empty()
                            && !asked.is_zero()
                            && asked < remaining
                            && call_started.elapsed() >= asked / 2 => {}
                    Ok((page, _)) => break Ok(page),
                    Err(error) => break Err(error),
                }
            };
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(page) => tracing::debug!(
                    rows = page.rows.len(),
                    full = page.is_full(),
                    wait_ms = wait.as_millis() as u64,
                    calls,
                    elapsed_ms,
                    "read_feed returned"
                ),
                Err(error) => tracing::debug!(
                    %error,
                    transient = error.is_transient(),
                    elapsed_ms,
                    "read_feed failed"
                ),
            }
            result
        }
        .instrument(span)
        .await
    }

    fn reset(&mut self) {
        self.discard();
    }
}

/// Reads a feed from a connection [`Pool`]: single pages, or endless streams of pages that
/// follow the head of a shard.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::reader::{FeedReader, FeedReaderOptions};
/// use changefeed::{Cursor, Feed};
/// use futures::StreamExt;
///
/// let pool = changefeed::pool::pool(&std::env::var("CHANGEFEED_URL").unwrap(), 8).await?;
/// let feed: Feed = "myservice.MyEvent".parse()?;
/// let reader = FeedReader::with_options(pool, feed, FeedReaderOptions::default().page_size(500))?;
///
/// // Keys (the event table's primary key, here a bigint), from the beginning, forever.
/// let mut pages = std::pin::pin!(reader.stream::<i64>(0, Cursor::START));
/// while let Some(page) = pages.next().await {
///     let page = page?; // a permanent error, or transient ones past the retry limit
///     for row in &page.rows {
///         println!("{} {}", row.ulid, row.key);
///     }
///     // page.next_cursor is where to resume; save it with changefeed::cursor_store.
/// }
/// # Ok(()) }
/// ```
///
/// # Timeouts
///
/// tiberius 0.13 bounds each server round-trip by its `command_timeout`, 30 s by default,
/// and `read_feed` sends nothing while it long-polls. The reader therefore never asks the
/// server to wait longer than the connection's command timeout minus
/// the `timeout_margin` of [`FeedReaderOptions`] (see [`effective_wait`]; with the defaults, a 10 s
/// long-poll and a 15 s margin fit in 30 s untouched; a longer wait is served as shorter
/// long-polls, which the consumer cannot tell apart). It also bounds each call itself with
/// `tokio::time::timeout` — which also covers connections opened with no command timeout:
/// the first answer must come within the long-poll plus the margin, and every later part
/// of the page within the margin of the one before ([`CallBounds`]), so a large
/// `@with_event` page that is still arriving is never cut off. A call that overruns a
/// bound is taken for a dead connection: dropped, and the read retried on a fresh one.
///
/// # Connections
///
/// Each running stream holds one pooled connection (a long-poll keeps it busy anyway) and
/// gives it back when dropped; a connection that failed is discarded, never reused. Size
/// the pool for one connection per stream (per shard with [`FeedReader::stream_shards`])
/// plus whatever else uses it: a stream that cannot get a connection within bb8's
/// `connection_timeout` counts that as a transient failure.
#[derive(Clone, Debug)]
pub struct FeedReader {
    pool: Pool,
    feed: Feed,
    options: FeedReaderOptions,
}

impl FeedReader {
    /// A reader with the default options.
    pub fn new(pool: Pool, feed: Feed) -> Self {
        FeedReader {
            pool,
            feed,
            options: FeedReaderOptions::default(),
        }
    }

    /// A reader with these options, checked with [`FeedReaderOptions::validate`].
    pub fn with_options(pool: Pool, feed: Feed, options: FeedReaderOptions) -> Result<Self> {
        options.validate()?;
        Ok(FeedReader {
            pool,
            feed,
            options,
        })
    }

    /// The feed it reads.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Its options.
    pub fn options(&self) -> &FeedReaderOptions {
        &self.options
    }

    /// The pool it takes connections from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Reads the page of keys of `shard` after `cursor` at once (no long-poll, no retry).
    pub async fn read_page<K: FromRow>(
        &self,
        shard: i32,
        cursor: Cursor,
    ) -> Result<Page<FeedRow<K>>> {
        self.read_once(shard, cursor).await
    }

    /// Reads the page of whole events of `shard` after `cursor` at once (no long-poll, no
    /// retry).
    pub async fn read_events<E: FromRow>(
        &self,
        shard: i32,
        cursor: Cursor,
    ) -> Result<Page<FeedEvent<E>>> {
        self.read_once(shard, cursor).await
    }

    async fn read_once<T: FeedItem>(&self, shard: i32, cursor: Cursor) -> Result<Page<T>> {
        let mut conn = self.pool.get().await?;
        let options = ReadOptions::default().page_size(self.options.page_size);
        let bounds = CallBounds {
            first: self.options.timeout_margin,
            idle: self.options.timeout_margin,
        };
        conn.set_broken(true);
        let page =
            read_items_within::<T>(&mut conn, &self.feed, shard, cursor, options, Some(bounds))
                .await?;
        conn.set_broken(false);
        Ok(page)
    }

    /// A [`PageSource`] over this reader's pool, for [`page_stream`].
    pub fn source<T: FeedItem + Send + 'static>(&self) -> PoolSource<T> {
        PoolSource {
            pool: self.pool.clone(),
            feed: self.feed.clone(),
            page_size: self.options.page_size,
            margin: self.options.timeout_margin,
            conn: None,
            item: PhantomData,
        }
    }

    /// The endless stream of pages of keys of `shard` after `cursor` (see [`page_stream`]
    /// for waiting, retries and errors). It holds one pooled connection while it runs.
    pub fn stream<K: FromRow + Send + 'static>(
        &self,
        shard: i32,
        cursor: Cursor,
    ) -> impl Stream<Item = Result<Page<FeedRow<K>>>> + Send + use<K> {
        page_stream(self.source::<FeedRow<K>>(), shard, cursor, self.options)
    }

    /// The endless stream of pages of whole events of `shard` after `cursor`
    /// (`@with_event = 1`; see [`FeedEvent`] and [`page_stream`]).
    pub fn event_stream<E: FromRow + Send + 'static>(
        &self,
        shard: i32,
        cursor: Cursor,
    ) -> impl Stream<Item = Result<Page<FeedEvent<E>>>> + Send + use<E> {
        page_stream(self.source::<FeedEvent<E>>(), shard, cursor, self.options)
    }

    /// The streams of keys of several shards, each from its own cursor, merged (see
    /// [`merge_shards`]): `(0..n).map(|shard| (shard, Cursor::START))` follows shards
    /// `0..n`. Each shard holds one pooled connection.
    ///
    /// `cursors` is consumed before this returns, so the stream is `Send + 'static`
    /// whatever it borrowed (`shards.iter().copied()` is fine) and can be `tokio::spawn`ed.
    pub fn stream_shards<K, I>(
        &self,
        cursors: I,
    ) -> impl Stream<Item = (i32, Result<Page<FeedRow<K>>>)> + Send + 'static + use<K, I>
    where
        K: FromRow + Send + 'static,
        I: IntoIterator<Item = (i32, Cursor)>,
    {
        let streams: Vec<_> = cursors
            .into_iter()
            .map(|(shard, cursor)| (shard, self.stream::<K>(shard, cursor)))
            .collect();
        merge_shards(streams)
    }

    /// The streams of whole events of several shards, merged (see [`merge_shards`]); like
    /// [`stream_shards`](Self::stream_shards), `Send + 'static` whatever `cursors` borrowed.
    pub fn event_stream_shards<E, I>(
        &self,
        cursors: I,
    ) -> impl Stream<Item = (i32, Result<Page<FeedEvent<E>>>)> + Send + 'static + use<E, I>
    where
        E: FromRow + Send + 'static,
        I: IntoIterator<Item = (i32, Cursor)>,
    {
        let streams: Vec<_> = cursors
            .into_iter()
            .map(|(shard, cursor)| (shard, self.event_stream::<E>(shard, cursor)))
            .collect();
        merge_shards(streams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiberius::{ColumnData as D, ColumnType as T};

    #[test]
    fn key_columns_advice_is_one_sentence_without_runs_of_spaces() {
        let feed: Feed = "app.OrderPlaced".parse().unwrap();
        for number in [2812, 229] {
            let advice = key_columns_advice(&feed, number);
            assert!(!advice.contains("  "), "{number}: {advice:?}");
            assert!(advice.contains("app.OrderPlaced"), "{advice}");
        }
        assert!(key_columns_advice(&feed, 2812).contains("(schema.table), or set the feed up"));
    }

    #[test]
    fn effective_wait_fits_inside_the_command_timeout() {
        let s = Duration::from_secs;
        assert_eq!(effective_wait(s(10), Some(s(30)), s(15)), s(10));
        assert_eq!(effective_wait(s(60), Some(s(30)), s(15)), s(15));
        assert_eq!(effective_wait(s(60), Some(s(10)), s(15)), Duration::ZERO);
        assert_eq!(effective_wait(s(600), None, s(15)), s(600));
    }

    #[test]
    fn default_options_are_valid_and_bad_ones_are_named() {
        FeedReaderOptions::default().validate().unwrap();
        let cases = [
            (
                FeedReaderOptions {
                    page_size: 0,
                    ..Default::default()
                },
                "page_size",
            ),
            (
                FeedReaderOptions {
                    page_size: 10_001,
                    ..Default::default()
                },
                "page_size",
            ),
            (
                FeedReaderOptions {
                    wait: Wait::LongPoll(Duration::ZERO),
                    ..Default::default()
                },
                "long-poll",
            ),
            (
                FeedReaderOptions {
                    wait: Wait::LongPoll(MAX_WAIT * 2),
                    ..Default::default()
                },
                "long-poll",
            ),
            (
                FeedReaderOptions {
                    idle_backoff: IdleBackoff {
                        min: Duration::ZERO,
                        max: Duration::from_secs(1),
                    },
                    ..Default::default()
                },
                "idle_backoff",
            ),
            (
                FeedReaderOptions {
                    retry: ReadRetryPolicy {
                        initial: Duration::from_secs(2),
                        max: Duration::from_secs(1),
                        max_retries: None,
                    },
                    ..Default::default()
                },
                "retry",
            ),
            (
                FeedReaderOptions {
                    timeout_margin: Duration::ZERO,
                    ..Default::default()
                },
                "timeout_margin",
            ),
        ];
        for (options, field) in cases {
            let error = options.validate().unwrap_err();
            assert!(error.to_string().contains(field), "{field}: {error}");
        }
    }

    fn assert_send_static<T: Send + 'static>(_: &T) {}

    #[tokio::test]
    async fn without_a_server_reads_fail_transiently_and_the_stream_gives_up() {
        let manager = crate::pool::ConnectionManager::from_ado(
            "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true",
        )
        .unwrap();
        let pool = Pool::from_builder(
            Pool::builder()
                .max_size(1)
                .connection_timeout(Duration::from_millis(300)),
            manager,
        );
        let options = FeedReaderOptions {
            retry: ReadRetryPolicy {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(5),
                max_retries: Some(1),
            },
            ..FeedReaderOptions::default()
        };
        let feed: Feed = "app.Event".parse().unwrap();
        let reader = FeedReader::with_options(pool, feed, options).unwrap();

        let error = reader.read_page::<i64>(0, Cursor::START).await.unwrap_err();
        assert!(error.is_transient(), "{error}");

        let stream = reader.stream::<i64>(0, Cursor::START);
        assert_send_static(&stream);
        drop(reader); // the stream owns what it needs
        let items: Vec<_> = stream.collect().await;
        assert_eq!(items.len(), 1, "one error, then the end");
        assert!(matches!(&items[0], Err(Error::Connection(_))), "{items:?}");
    }

    /// A pool whose every check-out fails after `timeout` (nothing listens on port 1).
    async fn unreachable_pool(timeout: Duration) -> Pool {
        let manager = crate::pool::ConnectionManager::from_ado(
            "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true",
        )
        .unwrap();
        Pool::from_builder(
            Pool::builder().max_size(2).connection_timeout(timeout),
            manager,
        )
    }

    /// The streams of several shards own everything they use: a borrowing iterator of
    /// cursors (dropped before the streams run) still gives streams that can be spawned.
    #[tokio::test]
    async fn shard_streams_of_a_borrowing_iterator_can_be_spawned() {
        let options = FeedReaderOptions::default().retry(
            ReadRetryPolicy::default()
                .initial(Duration::from_millis(1))
                .max(Duration::from_millis(5))
                .max_retries(Some(0)),
        );
        let pool = unreachable_pool(Duration::from_millis(200)).await;
        let reader = FeedReader::with_options(pool, "app.Event".parse().unwrap(), options).unwrap();
        let cursors = vec![(0, Cursor::START), (3, Cursor::START)];
        let keys = reader.stream_shards::<i64, _>(cursors.iter().copied());
        let events = reader.event_stream_shards::<(i64, String), _>(cursors.iter().copied());
        drop(cursors);
        drop(reader);
        assert_send_static(&keys);
        assert_send_static(&events);
        let keys = tokio::spawn(keys.collect::<Vec<_>>());
        let events = tokio::spawn(events.collect::<Vec<_>>());
        for items in [
            keys.await
                .unwrap()
                .into_iter()
                .map(|(s, p)| (s, p.map(|_| ())))
                .collect::<Vec<_>>(),
            events
                .await
                .unwrap()
                .into_iter()
                .map(|(s, p)| (s, p.map(|_| ())))
                .collect(),
        ] {
            let mut shards: Vec<i32> = items.iter().map(|(shard, _)| *shard).collect();
            shards.sort();
            assert_eq!(
                shards,
                [0, 3],
                "one error per shard, then the end: {items:?}"
            );
            assert!(
                items
                    .iter()
                    .all(|(_, page)| page.as_ref().is_err_and(Error::is_transient))
            );
        }
    }

    #[test]
    fn the_timeout_margin_covers_the_shard_lock_wait() {
        const { assert!(MIN_TIMEOUT_MARGIN.as_millis() > SHARD_LOCK_WAIT.as_millis()) };
        assert!(FeedReaderOptions::default().timeout_margin >= MIN_TIMEOUT_MARGIN);
        FeedReaderOptions::default()
            .timeout_margin(MIN_TIMEOUT_MARGIN)
            .validate()
            .unwrap();
        for short in [
            Duration::from_secs(1),
            SHARD_LOCK_WAIT,
            MIN_TIMEOUT_MARGIN / 2,
        ] {
            let error = FeedReaderOptions::default()
                .timeout_margin(short)
                .validate()
                .unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("timeout_margin") && message.contains("lock"),
                "{message}"
            );
        }
    }

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
