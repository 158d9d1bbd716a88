//! Where an export keeps each shard's cursor: [`ExportCursors`], and [`SqlCursors`] in
//! `changefeed.consumer_cursor` of the feed's own database (SQL Server, or PostgreSQL with
//! the feature `postgres`).

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

/// Cursors in `changefeed.consumer_cursor`, through [`crate::CursorStore`]: on SQL Server
/// through a pool, on PostgreSQL on one connection of their own, opened on first use and
/// again after any failure.
#[derive(Debug)]
pub struct SqlCursors {
    store: Store,
    feed: Feed,
    consumer: String,
}

#[derive(Debug)]
enum Store {
    SqlServer(Pool),
    #[cfg(feature = "postgres")]
    Postgres {
        config: Box<tokio_postgres::Config>,
        client: Option<tokio_postgres::Client>,
    },
}

/// A copy shares the SQL Server pool; on PostgreSQL it opens a connection of its own.
impl Clone for SqlCursors {
    fn clone(&self) -> Self {
        SqlCursors {
            store: match &self.store {
                Store::SqlServer(pool) => Store::SqlServer(pool.clone()),
                #[cfg(feature = "postgres")]
                Store::Postgres { config, .. } => Store::Postgres {
                    config: config.clone(),
                    client: None,
                },
            },
            feed: self.feed.clone(),
            consumer: self.consumer.clone(),
        }
    }
}

impl SqlCursors {
    /// The cursors of `consumer` in `feed` on SQL Server; the name is checked here.
    pub fn new(pool: Pool, feed: Feed, consumer: impl Into<String>) -> Result<Self> {
        let consumer = consumer.into();
        check_consumer(&consumer)?;
        Ok(SqlCursors {
            store: Store::SqlServer(pool),
            feed,
            consumer,
        })
    }

    /// The cursors of `consumer` in `feed` on PostgreSQL (feature `postgres`), in the
    /// database of `config`; the name is checked here, nothing is opened yet. Each load or
    /// save is one statement in autocommit, bounded by
    /// [`CALL_TIMEOUT`](crate::postgres::CALL_TIMEOUT).
    #[cfg(feature = "postgres")]
    pub fn postgres(
        config: tokio_postgres::Config,
        feed: Feed,
        consumer: impl Into<String>,
    ) -> Result<Self> {
        let consumer = consumer.into();
        check_consumer(&consumer)?;
        Ok(SqlCursors {
            store: Store::Postgres {
                config: Box::new(config),
                client: None,
            },
            feed,
            consumer,
        })
    }
}

#[cfg(feature = "postgres")]
impl SqlCursors {
    /// Runs `call` on the PostgreSQL connection (opening it first if needed), bounded by
    /// the call timeout; any failure drops the connection, so the next call opens a new one.
    async fn on_postgres<T>(
        config: &tokio_postgres::Config,
        client: &mut Option<tokio_postgres::Client>,
        what: &str,
        call: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T>,
    ) -> Result<T> {
        use crate::postgres::CALL_TIMEOUT;

        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            *client = Some(crate::postgres::connect(config).await?);
        }
        let connection = client.as_ref().expect("opened above");
        let outcome = match tokio::time::timeout(CALL_TIMEOUT, call(connection)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(crate::error::Error::Connection(format!(
                "PostgreSQL: {what} did not answer within {CALL_TIMEOUT:?}"
            ))),
        };
        if outcome.is_err() {
            *client = None;
        }
        outcome
    }
}

impl ExportCursors for SqlCursors {
    async fn load(&mut self, shard: i32) -> Result<Option<Cursor>> {
        let SqlCursors {
            store,
            feed,
            consumer,
        } = self;
        match store {
            Store::SqlServer(pool) => {
                let mut conn = pool.get().await?;
                CursorStore::load(&mut conn, consumer, feed, shard).await
            }
            #[cfg(feature = "postgres")]
            Store::Postgres { config, client } => {
                Self::on_postgres(config, client, "load_cursor", async |client| {
                    CursorStore::load_postgres(client, consumer, feed, shard).await
                })
                .await
            }
        }
    }

    async fn save(&mut self, shard: i32, cursor: Cursor) -> Result<()> {
        let SqlCursors {
            store,
            feed,
            consumer,
        } = self;
        match store {
            Store::SqlServer(pool) => {
                let mut conn = pool.get().await?;
                CursorStore::save(&mut conn, consumer, feed, shard, cursor).await
            }
            #[cfg(feature = "postgres")]
            Store::Postgres { config, client } => {
                Self::on_postgres(config, client, "save_cursor", async |client| {
                    CursorStore::save_postgres(client, consumer, feed, shard, cursor).await
                })
                .await
            }
        }
    }
}
