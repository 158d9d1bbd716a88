//! Where an export keeps each shard's cursor: [`ExportCursors`], and [`SqlCursors`] in
//! `changefeed.consumer_cursor`.

use std::future::Future;

use crate::cursor::Cursor;
use crate::cursor_store::{CursorStore, check_consumer};
use crate::error::Result;
use crate::feed::Feed;
use crate::pool::Pool;

/// Where the exporter keeps its cursor per shard: `consumer_cursor` ([`SqlCursors`]) or a
/// fake in tests.
pub trait ExportCursors: Send + 'static {
    /// The saved cursor of `shard`, if any.
    fn load(&mut self, shard: i32) -> impl Future<Output = Result<Option<Cursor>>> + Send;
    /// Saves `cursor` for `shard`.
    fn save(&mut self, shard: i32, cursor: Cursor) -> impl Future<Output = Result<()>> + Send;
}

/// Cursors in `changefeed.consumer_cursor`, through [`crate::CursorStore`].
#[derive(Clone, Debug)]
pub struct SqlCursors {
    pool: Pool,
    feed: Feed,
    consumer: String,
}

impl SqlCursors {
    /// The cursors of `consumer` in `feed`; the name is checked here.
    pub fn new(pool: Pool, feed: Feed, consumer: impl Into<String>) -> Result<Self> {
        let consumer = consumer.into();
        check_consumer(&consumer)?;
        Ok(SqlCursors {
            pool,
            feed,
            consumer,
        })
    }
}

impl ExportCursors for SqlCursors {
    async fn load(&mut self, shard: i32) -> Result<Option<Cursor>> {
        let mut conn = self.pool.get().await?;
        CursorStore::load(&mut conn, &self.consumer, &self.feed, shard).await
    }

    async fn save(&mut self, shard: i32, cursor: Cursor) -> Result<()> {
        let mut conn = self.pool.get().await?;
        CursorStore::save(&mut conn, &self.consumer, &self.feed, shard, cursor).await
    }
}
