//! [`PostgresSource`]: the [`PageSource`] of a feed on PostgreSQL (feature `postgres`):
//! the feed's read function on one dedicated connection, long-polling on the client with
//! `LISTEN` because a PostgreSQL function cannot wait without holding its snapshot.

use std::marker::PhantomData;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::{Client, Config, Statement};
use tracing::Instrument;

use crate::call_bound::bounded;
use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::pg_client::feed_info::{feed_info, quote_identifier};
use crate::pg_client::session::{Notifications, SERVER, open, session_settings};

use super::page::{FeedItem, Page, SHARD_LOCK_WAIT, decode_pg_page};
use super::stream::PageSource;

/// A [`PageSource`] reading a feed on PostgreSQL over one connection of its own.
///
/// On its first read it connects (READ COMMITTED, keepalives and the connect timeout of
/// the [`Config`]; a `statement_timeout` just under the margin), asks
/// `changefeed.feed_info` for the feed's read function and NOTIFY channel, `LISTEN`s on
/// the channel and prepares the read of keys: `select r.ulid, (r.key).* from
/// changefeed.read_feed_<id>($1, $2, $3) as r` (a feed's key never changes). A read of
/// [`FeedEvent`](super::FeedEvent)s, `(r.event).*` from `read_events_<id>`, is not
/// prepared: `.*` is expanded when a statement is prepared, and a prepared statement does
/// not depend on the event table (the reader has no right on it), so a column added to the
/// table later would never come through on that connection. Each read is one statement in
/// autocommit, bounded by the margin.
///
/// Long-poll: when a page comes back empty and the stream may wait, the source waits for a
/// notification on the channel (sent when a transaction that wrote events commits) or the
/// end of the wait, whichever comes first, and reads again, until rows come or the wait
/// has passed. Nothing is held on the server while it waits: no transaction, no lock. A
/// notification lost while the connection was down costs nothing, because the first read
/// after `LISTEN` sees everything committed before it.
///
/// [`PageSource::reset`] (and any failed read) drops the connection; the next read opens a
/// new one, asks `feed_info` and `LISTEN`s again.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::reader::{FeedReaderOptions, FeedRow, PostgresSource, page_stream};
/// use changefeed::{Cursor, Feed};
/// use futures::StreamExt;
///
/// let config = changefeed::postgres::config("postgres://reader:secret@localhost/app")?;
/// let feed: Feed = "public.orders".parse()?;
/// let options = FeedReaderOptions::default();
/// let source = PostgresSource::<FeedRow<i64>>::new(config, feed, options.page_size, options.timeout_margin);
/// let mut pages = std::pin::pin!(page_stream(source, 0, Cursor::START, options));
/// while let Some(page) = pages.next().await {
///     for row in &page?.rows {
///         println!("{} {}", row.ulid, row.key);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct PostgresSource<T> {
    config: Config,
    feed: Feed,
    page_size: u32,
    margin: Duration,
    session: Option<Session>,
    item: PhantomData<fn() -> T>,
}

/// One connection of a [`PostgresSource`], ready to read.
struct Session {
    client: Client,
    /// The read of the feed's read function: prepared for keys, text for events (see
    /// [`PostgresSource`]).
    read: Read,
    /// The read function's name, for errors.
    function: String,
    /// The feed's NOTIFY channel, listened on.
    channel: String,
    notifications: Notifications,
}

/// How a [`Session`] reads a page.
enum Read {
    Prepared(Statement),
    Text(String),
}

impl Drop for Session {
    fn drop(&mut self) {
        // The driver ends when the client goes; a connection stuck on a dead peer would
        // keep its task until TCP gives up, so it goes now.
        self.notifications.driver.abort();
    }
}

impl<T> PostgresSource<T> {
    /// A source reading `feed` from the database of `config`, `page_size` rows a read,
    /// each read (and the connection's set-up) bounded by `margin`; it connects on its
    /// first read. [`FeedReader::postgres`](super::FeedReader::postgres) builds it from the
    /// reader's options.
    ///
    /// ```no_run
    /// # fn run() -> changefeed::Result<()> {
    /// use changefeed::reader::{FeedEvent, PostgresSource};
    /// use changefeed::row::Serde;
    /// use std::time::Duration;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: i64, customer: String }
    ///
    /// let config = changefeed::postgres::config("postgres://reader:secret@localhost/app")?;
    /// let source = PostgresSource::<FeedEvent<Serde<Order>>>::new(
    ///     config, "public.orders".parse()?, 500, Duration::from_secs(15));
    /// # Ok(()) }
    /// ```
    pub fn new(config: Config, feed: Feed, page_size: u32, margin: Duration) -> Self {
        PostgresSource {
            config,
            feed,
            page_size,
            margin,
            session: None,
            item: PhantomData,
        }
    }

    /// The same source reading `page_size` rows per call.
    ///
    /// ```no_run
    /// # fn run(source: changefeed::reader::PostgresSource<changefeed::FeedRow<i64>>) {
    /// let source = source.with_page_size(100);
    /// # }
    /// ```
    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }
}

impl<T> std::fmt::Debug for PostgresSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSource")
            .field("feed", &self.feed)
            .field("page_size", &self.page_size)
            .field("margin", &self.margin)
            .field("connected", &self.session.is_some())
            .finish()
    }
}

/// The `statement_timeout` of a reader's session: just under the client's bound (`margin`),
/// so the server stops a read before the client gives up on the connection; never below
/// the read function's own wait for the shard's lock, which it must be able to finish.
fn statement_timeout(margin: Duration) -> Duration {
    margin
        .saturating_sub(Duration::from_secs(1))
        .max(SHARD_LOCK_WAIT + Duration::from_secs(1))
}

/// The read of one page: column 0 the ULID, then the key's or the event's columns (the
/// function returns them as one composite column, expanded here).
fn read_sql(function: &str, with_event: bool) -> String {
    let column = if with_event { "event" } else { "key" };
    format!("select r.ulid, (r.{column}).* from {function}($1::int, $2::bytea, $3::int) as r")
}

impl<T: FeedItem> PostgresSource<T> {
    /// Opens a connection and makes it ready to read (see the type's documentation).
    async fn connect(&self) -> Result<Session> {
        let (client, notifications) = open(&self.config).await?;
        let what = format!("setting up the reader of {}", self.feed);
        bounded(SERVER, self.margin, &what, async {
            client
                .batch_execute(&session_settings(statement_timeout(self.margin)))
                .await?;
            let info = feed_info(&client, &self.feed).await?;
            let function = if T::WITH_EVENT {
                info.events_function
            } else {
                info.read_function
            };
            let channel = info.channel;
            client
                .batch_execute(&format!("listen {}", quote_identifier(&channel)))
                .await?;
            let sql = read_sql(&function, T::WITH_EVENT);
            let read = if T::WITH_EVENT {
                Read::Text(sql)
            } else {
                Read::Prepared(client.prepare(&sql).await?)
            };
            Ok(Session {
                client,
                read,
                function,
                channel,
                notifications,
            })
        })
        .await
    }

    /// One read of the page of `shard` after `cursor`, on the session (opened first if
    /// there is none).
    async fn read_once(&mut self, shard: i32, cursor: Cursor) -> Result<Page<T>> {
        if self.session.is_none() {
            self.session = Some(self.connect().await?);
        }
        let Some(session) = self.session.as_mut() else {
            unreachable!("the session was just set");
        };
        // What was notified before this read, this read sees: only later notifications
        // may bring something new.
        while session.notifications.received.try_recv().is_ok() {}
        let bytes = cursor.to_bytes();
        let page_size = i32::try_from(self.page_size).unwrap_or(i32::MAX);
        let what = format!("{} of {} shard {shard}", session.function, self.feed);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&shard, &&bytes[..], &page_size];
        let rows = bounded(SERVER, self.margin, &what, async {
            Ok(match &session.read {
                Read::Prepared(statement) => session.client.query(statement, &params).await?,
                Read::Text(sql) => session.client.query(sql.as_str(), &params).await?,
            })
        })
        .await?;
        decode_pg_page(&rows, cursor, self.page_size)
    }

    /// Waits until `deadline` for a notification on the feed's channel: `Ok(true)` when
    /// one came, `Ok(false)` at the deadline, an error when the connection ended.
    async fn notified(&mut self, deadline: Instant) -> Result<bool> {
        let Some(session) = self.session.as_mut() else {
            return Ok(false);
        };
        let channel = session.channel.as_str();
        let received = &mut session.notifications.received;
        let ours = async {
            while let Some(notification) = received.recv().await {
                if notification.channel() == channel {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout_at(deadline, ours).await {
            Err(_deadline) => Ok(false),
            Ok(true) => Ok(true),
            Ok(false) => Err(Error::Connection(format!(
                "PostgreSQL: the connection reading {} ended while it waited for a \
                 notification",
                self.feed
            ))),
        }
    }
}

impl<T: FeedItem> PostgresSource<T> {
    /// Reads the page; if it is empty, waits for a notification of the feed or the end of
    /// `wait` and reads again, until rows come or `wait` has passed. What
    /// [`PageSource::read`] does, for any item (a one-off read needs no `Send`).
    pub(super) async fn read_waiting(
        &mut self,
        shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> Result<Page<T>> {
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
                calls += 1;
                let page = match self.read_once(shard, cursor).await {
                    Ok(page) => page,
                    Err(error) => break Err(error),
                };
                if !page.rows.is_empty() || Instant::now() >= deadline {
                    break Ok(page);
                }
                match self.notified(deadline).await {
                    Ok(true) => {}
                    Ok(false) => break Ok(page),
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
                    "PostgreSQL feed read returned"
                ),
                Err(error) => {
                    // A failed read leaves the session in an unknown state: the next read
                    // starts on a fresh one.
                    self.session = None;
                    tracing::debug!(
                        %error,
                        transient = error.is_transient(),
                        elapsed_ms,
                        "PostgreSQL feed read failed"
                    );
                }
            }
            result
        }
        .instrument(span)
        .await
    }
}

impl<T: FeedItem + Send + 'static> PageSource for PostgresSource<T> {
    type Item = T;

    /// See [`PostgresSource`]: a read, and on an empty page the long-poll on `LISTEN`.
    async fn read(&mut self, shard: i32, cursor: Cursor, wait: Duration) -> Result<Page<T>> {
        self.read_waiting(shard, cursor, wait).await
    }

    fn reset(&mut self) {
        self.session = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_expands_the_composite_column() {
        assert_eq!(
            read_sql("changefeed.read_feed_7", false),
            "select r.ulid, (r.key).* from changefeed.read_feed_7($1::int, $2::bytea, $3::int) as r"
        );
        assert!(read_sql("changefeed.read_events_7", true).contains("(r.event).*"));
    }

    #[test]
    fn the_server_stops_a_read_before_the_client_does() {
        let s = Duration::from_secs;
        assert_eq!(statement_timeout(s(15)), s(14));
        assert_eq!(statement_timeout(s(12)), s(11));
        assert!(statement_timeout(s(1)) > SHARD_LOCK_WAIT);
    }

    #[tokio::test]
    async fn without_a_server_a_read_fails_transiently() {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(1)
            .user("reader")
            .dbname("app")
            .connect_timeout(Duration::from_millis(300));
        let mut source = PostgresSource::<super::super::FeedRow<i64>>::new(
            config,
            "app.Event".parse().unwrap(),
            10,
            Duration::from_secs(15),
        );
        let error = source
            .read(0, Cursor::START, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(error.is_transient(), "{error}");
        source.reset();
        assert!(format!("{source:?}").contains("connected: false"));
    }
}
