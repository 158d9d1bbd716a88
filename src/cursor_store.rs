//! [`CursorStore`]: consumers' cursors kept in `changefeed.consumer_cursor`.
//!
//! Any number of independent consumers read one feed; each names itself and keeps its own
//! cursor per shard. All of them see the same rows with the same ULIDs, in the same order.
//!
//! # Exactly-once processing
//!
//! When a consumer's side effects go to the same database, save the cursor in the same
//! transaction as the side effects: either both commit or neither does, so after a crash
//! the consumer resumes exactly after the last page whose effects are committed.
//!
//! `read_feed` must be called outside a transaction (it commits its own short one), so read
//! on one connection (a [`crate::reader::FeedReader`]) and apply on another:
//!
//! ```no_run
//! # async fn run(reader: changefeed::reader::FeedReader, sinks: changefeed::Pool)
//! # -> changefeed::Result<()> {
//! use changefeed::cursor_store::CursorStore;
//! use changefeed::{Cursor, Feed};
//! use futures::StreamExt;
//!
//! let feed = reader.feed().clone();
//! let mut sink = sinks.get().await?;
//! let start = CursorStore::load(&mut sink, "billing", &feed, 0).await?.unwrap_or(Cursor::START);
//! let mut pages = std::pin::pin!(reader.stream::<i64>(0, start));
//! while let Some(page) = pages.next().await {
//!     let page = page?;
//!     let mut tx = sink.transaction().await?;
//!     for row in &page.rows {
//!         tx.execute("insert into billing.Seen (event_id) values (@P1)", &[&row.key]).await?;
//!     }
//!     CursorStore::save(&mut tx, "billing", &feed, 0, page.next_cursor).await?;
//!     tx.commit().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! If anything fails before the commit, the dropped [`Transaction`](crate::pool::Transaction)
//! guard makes the pool close that connection (the server rolls the transaction back);
//! restart from [`CursorStore::load`] on a fresh one: the rows of the failed page come again
//! and their effects are applied once.
//!
//! Consumer names are compared with the database's collation: on a case-insensitive
//! database `Billing` and `billing` are the same consumer.

use crate::connection::Client;
use crate::cursor::Cursor;
use crate::error::{Error, Result, decode_error};
use crate::feed::Feed;

/// The longest consumer name, in UTF-16 code units (the column is `nvarchar(200)`).
pub const MAX_CONSUMER_LEN: usize = 200;

/// Loads and saves consumers' cursors with `changefeed.load_cursor` and
/// `changefeed.save_cursor`. It holds no state: every call takes the connection to use.
///
/// A consumer belongs to the database user whose save created it: another user's save or
/// load of it fails with server error 51114 (a `db_owner` may do both, and removes a stale
/// consumer with `changefeed.remove_consumer`; docs/sql-server.md, "Consumers and replay").
#[derive(Clone, Copy, Debug, Default)]
pub struct CursorStore;

impl CursorStore {
    /// The cursor `consumer` last saved for `shard` of `feed`, or `None` when it never saved
    /// one (start wherever you decide: [`Cursor::START`] to replay everything, or
    /// [`Cursor::at`] a point in time). Like [`CursorStore::save`], it needs membership in
    /// the feed's readers role or `db_owner` (51112), and a registered feed (51006).
    pub async fn load(
        client: &mut Client,
        consumer: &str,
        feed: &Feed,
        shard: i32,
    ) -> Result<Option<Cursor>> {
        check_consumer(consumer)?;
        let feed_name = feed.to_string();
        let row = client
            .query(
                "exec changefeed.load_cursor @consumer = @P1, @feed = @P2, @shard_id = @P3",
                &[&consumer, &feed_name.as_str(), &shard],
            )
            .await?
            .into_row()
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bytes = row
            .try_get::<&[u8], usize>(0)
            .map_err(|error| decode_error("cursor", error))?
            .ok_or_else(|| decode_error("cursor", "NULL"))?;
        Cursor::from_bytes(bytes).map(Some)
    }

    /// Saves `cursor` as where `consumer` stands in `shard` of `feed`.
    ///
    /// It runs in the caller's transaction when one is open on `client` (and commits or
    /// rolls back with it), else on its own. Any cursor may be saved, an earlier one too:
    /// that is how a consumer rewinds. Two first saves of one consumer at the same time both
    /// succeed; the later one stays. A feed that does not exist is SQL Server error 51006; a
    /// login that is neither in the feed's readers role ([`Feed::readers_role`]) nor
    /// `db_owner` gets 51112.
    pub async fn save(
        client: &mut Client,
        consumer: &str,
        feed: &Feed,
        shard: i32,
        cursor: Cursor,
    ) -> Result<()> {
        check_consumer(consumer)?;
        let feed_name = feed.to_string();
        let bytes = cursor.to_bytes();
        client
            .execute(
                "exec changefeed.save_cursor @consumer = @P1, @feed = @P2, @shard_id = @P3, \
                 @cursor = @P4",
                &[&consumer, &feed_name.as_str(), &shard, &&bytes[..]],
            )
            .await?;
        Ok(())
    }

    /// [`CursorStore::load`] on PostgreSQL (feature `postgres`): the cursor `consumer` last
    /// saved for `shard` of `feed` with `changefeed.load_cursor`, or `None` when it never
    /// saved one. `client` is a `tokio_postgres::Client` or a `Transaction` (load and save
    /// in the consumer's own transaction). The consumer name is checked as for SQL Server;
    /// PostgreSQL refuses a feed that does not exist with CF006 and another role's consumer
    /// with CF114.
    ///
    /// ```no_run
    /// # async fn run(client: &tokio_postgres::Client) -> changefeed::Result<()> {
    /// use changefeed::{Cursor, CursorStore, Feed};
    ///
    /// let feed: Feed = "public.orders".parse()?;
    /// let start = CursorStore::load_postgres(client, "billing", &feed, 0).await?.unwrap_or(Cursor::START);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn load_postgres(
        client: &impl tokio_postgres::GenericClient,
        consumer: &str,
        feed: &Feed,
        shard: i32,
    ) -> Result<Option<Cursor>> {
        check_consumer(consumer)?;
        let row = client
            .query_one(
                "select changefeed.load_cursor($1, $2, $3)",
                &[&consumer, &feed.to_string(), &shard],
            )
            .await?;
        let bytes: Option<&[u8]> = row
            .try_get(0)
            .map_err(|error| decode_error("cursor", error))?;
        bytes.map(Cursor::from_bytes).transpose()
    }

    /// [`CursorStore::save`] on PostgreSQL (feature `postgres`): saves `cursor` as where
    /// `consumer` stands in `shard` of `feed` with `changefeed.save_cursor`, in the
    /// transaction of `client` when it is one (commit the side effects and the cursor
    /// together), else on its own. The consumer's owner is the role of its first save
    /// (CF114 for another role).
    ///
    /// ```no_run
    /// # async fn run(client: &mut tokio_postgres::Client, next: changefeed::Cursor) -> changefeed::Result<()> {
    /// use changefeed::{CursorStore, Feed};
    ///
    /// let feed: Feed = "public.orders".parse()?;
    /// let tx = client.transaction().await?;
    /// // apply the page's effects in tx, then:
    /// CursorStore::save_postgres(&tx, "billing", &feed, 0, next).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn save_postgres(
        client: &impl tokio_postgres::GenericClient,
        consumer: &str,
        feed: &Feed,
        shard: i32,
        cursor: Cursor,
    ) -> Result<()> {
        check_consumer(consumer)?;
        let bytes = cursor.to_bytes();
        client
            .execute(
                "select changefeed.save_cursor($1, $2, $3, $4)",
                &[&consumer, &feed.to_string(), &shard, &&bytes[..]],
            )
            .await?;
        Ok(())
    }
}

/// Checks a consumer name before it reaches SQL: 1 to [`MAX_CONSUMER_LEN`] UTF-16 code
/// units, no control characters, no leading or trailing whitespace (SQL Server ignores
/// trailing spaces when comparing, so `a` and `a ` would be one consumer).
pub fn check_consumer(consumer: &str) -> Result<()> {
    let invalid = |reason: &str| {
        Err(Error::Config(format!(
            "invalid consumer name {consumer:?}: {reason}"
        )))
    };
    if consumer.is_empty() {
        return invalid("it is empty; name the consumer (1 to 200 characters)");
    }
    let units = consumer.encode_utf16().count();
    if units > MAX_CONSUMER_LEN {
        return invalid(&format!(
            "it has {units} UTF-16 code units; at most {MAX_CONSUMER_LEN} fit in nvarchar(200)"
        ));
    }
    if consumer.chars().any(char::is_control) {
        return invalid("it contains a control character");
    }
    if consumer.starts_with(char::is_whitespace) || consumer.ends_with(char::is_whitespace) {
        return invalid("it begins or ends with whitespace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names_are_checked_before_sql() {
        for good in [
            "billing",
            "a",
            "équipe-1 / replay",
            &"x".repeat(200),
            "it's; drop",
        ] {
            check_consumer(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
        let too_long_in_utf16 = "😀".repeat(101); // 101 chars, 202 UTF-16 units
        for bad in [
            "",
            &"x".repeat(201),
            too_long_in_utf16.as_str(),
            "a\nb",
            "a\u{0}",
            " billing",
            "billing ",
            "\t",
        ] {
            let error = check_consumer(bad).expect_err(bad);
            assert!(matches!(error, Error::Config(_)), "{bad:?}: {error}");
            assert!(error.to_string().contains("invalid consumer name"));
        }
    }
}
