//! Reading a feed: one page at a time with [`read_page`].

use ulid::Ulid;

use crate::connection::Client;
use crate::cursor::Cursor;
use crate::error::{Result, decode_error};
use crate::feed::Feed;
use crate::row::FromRow;

/// The largest page `read_feed` accepts.
pub const MAX_PAGE_SIZE: u32 = 10_000;

/// What to ask `read_feed` for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// One row of a feed: its ULID and the event's key (or the whole event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedRow<K> {
    /// The row's position in its shard.
    pub ulid: Ulid,
    /// The event table's primary key, decoded with [`FromRow`].
    pub key: K,
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
    // The procedure name comes from a validated Feed (no ']' or quote can occur in it);
    // every value is a parameter.
    let sql = format!(
        "exec {} @shard_id = @P1, @cursor = @P2, @page_size = @P3, @wait_ms = @P4",
        feed.read_feed_procedure()
    );
    let cursor_bytes = cursor.to_bytes();
    let stream = client
        .query(
            sql,
            &[
                &shard,
                &&cursor_bytes[..],
                &(options.page_size as i32),
                &(options.wait_ms as i32),
            ],
        )
        .await?;
    let rows = stream.into_first_result().await?;
    let mut decoded = Vec::with_capacity(rows.len());
    for row in &rows {
        let bytes = row
            .try_get::<&[u8], usize>(0)
            .map_err(|e| decode_error("ulid", e))?
            .ok_or_else(|| decode_error("ulid", "NULL"))?;
        let ulid = Cursor::from_bytes(bytes)?.ulid();
        decoded.push(FeedRow {
            ulid,
            key: K::from_row(row, 1)?,
        });
    }
    let next_cursor = decoded
        .last()
        .map_or(cursor, |row| Cursor::from_ulid(row.ulid));
    Ok(Page {
        rows: decoded,
        next_cursor,
        page_size: options.page_size,
    })
}
