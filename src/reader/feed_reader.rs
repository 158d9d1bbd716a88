//! [`FeedReader`]: a feed read from SQL Server (a connection [`Pool`]) or PostgreSQL (a
//! `tokio_postgres::Config`), as single pages or as endless streams of pages over the
//! database's own [`PageSource`], behind one [`FeedSource`].

use futures::Stream;

use crate::cursor::Cursor;
use crate::error::Result;
use crate::feed::Feed;
use crate::pool::Pool;
use crate::row::FromRow;

use super::feed_source::FeedSource;
use super::options::FeedReaderOptions;
use super::page::{CallBounds, FeedEvent, FeedItem, FeedRow, Page, ReadOptions, read_items_within};
use super::pool_source::PoolSource;
#[cfg(feature = "postgres")]
use super::postgres_source::PostgresSource;
use super::stream::{merge_shards, page_stream};
#[cfg(doc)]
use super::{PageSource, effective_wait};

/// The pool [`FeedReader::connect`] builds for a SQL Server connection string: at most
/// this many connections, one per running stream (build the [`Pool`] yourself and use
/// [`FeedReader::with_options`] for another size).
pub const CONNECT_POOL_SIZE: u32 = 10;

/// Reads a feed from SQL Server (a connection [`Pool`]) or PostgreSQL (feature `postgres`,
/// `FeedReader::postgres`): single pages, or endless streams of pages that follow the
/// head of a shard. Both databases give the same items, pages, errors and stream
/// behaviour; [`FeedReader::connect`] picks the database by the connection string.
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
///
/// # PostgreSQL
///
/// On PostgreSQL each stream opens a connection of its own (a `PostgresSource`): it
/// `LISTEN`s on the feed's channel and long-polls on the client, holding nothing on the
/// server while it waits; every read is bounded by the `timeout_margin`. `read_page` and
/// `read_events` open a connection for the one read: for repeated reads, use a stream.
#[derive(Clone, Debug)]
pub struct FeedReader {
    backend: Backend,
    feed: Feed,
    options: FeedReaderOptions,
}

/// The database a [`FeedReader`] reads.
#[derive(Clone, Debug)]
enum Backend {
    SqlServer(Pool),
    // Boxed: a Config is many times the size of a Pool handle.
    #[cfg(feature = "postgres")]
    Postgres(Box<tokio_postgres::Config>),
}

/// Whether `url` is a PostgreSQL connection string: a `postgres://` or `postgresql://` URL,
/// or tokio-postgres's `key=value` form with a `host=` key (an ADO.NET string separates its
/// keys with `;` and names the host `server=`).
fn is_postgres_url(url: &str) -> bool {
    let url = url.trim().to_ascii_lowercase();
    url.starts_with("postgres://")
        || url.starts_with("postgresql://")
        || (!url.contains(';')
            && url
                .split_ascii_whitespace()
                .any(|pair| pair.starts_with("host=")))
}

impl FeedReader {
    /// A reader with the default options.
    pub fn new(pool: Pool, feed: Feed) -> Self {
        FeedReader {
            backend: Backend::SqlServer(pool),
            feed,
            options: FeedReaderOptions::default(),
        }
    }

    /// A reader with these options, checked with [`FeedReaderOptions::validate`].
    pub fn with_options(pool: Pool, feed: Feed, options: FeedReaderOptions) -> Result<Self> {
        options.validate()?;
        Ok(FeedReader {
            backend: Backend::SqlServer(pool),
            feed,
            options,
        })
    }

    /// A reader of a feed on PostgreSQL (feature `postgres`) in the database of `config`,
    /// with these options, checked with [`FeedReaderOptions::validate`]. No connection is
    /// opened here: each stream opens its own (see "PostgreSQL" above).
    /// [`crate::postgres::config`] parses a URL and sets the time limits and keepalives a
    /// reader wants.
    ///
    /// ```no_run
    /// # async fn run() -> changefeed::Result<()> {
    /// use changefeed::reader::{FeedReader, FeedReaderOptions};
    /// use changefeed::Cursor;
    /// use futures::StreamExt;
    ///
    /// let config = changefeed::postgres::config("postgres://reader:secret@localhost/app")?;
    /// let reader = FeedReader::postgres(config, "public.orders".parse()?, FeedReaderOptions::default())?;
    /// let mut pages = std::pin::pin!(reader.stream::<(i64, String)>(0, Cursor::START));
    /// while let Some(page) = pages.next().await {
    ///     for row in &page?.rows {
    ///         println!("{} {:?}", row.ulid, row.key);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(
        config: tokio_postgres::Config,
        feed: Feed,
        options: FeedReaderOptions,
    ) -> Result<Self> {
        options.validate()?;
        Ok(FeedReader {
            backend: Backend::Postgres(Box::new(config)),
            feed,
            options,
        })
    }

    /// A reader of the database `url` names: a `postgres://` or `postgresql://` URL, or a
    /// `key=value` string with a `host=` key, is PostgreSQL (feature `postgres`, through
    /// `changefeed::postgres::config`); anything else is a SQL Server ADO.NET connection
    /// string, read through a pool of at most [`CONNECT_POOL_SIZE`] connections
    /// ([`crate::pool::pool`]). Opens no connection.
    ///
    /// ```no_run
    /// # async fn run() -> changefeed::Result<()> {
    /// use changefeed::reader::{FeedReader, FeedReaderOptions};
    ///
    /// let url = std::env::var("CHANGEFEED_URL").unwrap();
    /// let reader = FeedReader::connect(&url, "myservice.MyEvent".parse()?, FeedReaderOptions::default()).await?;
    /// let page = reader.read_page::<i64>(0, changefeed::Cursor::START).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, feed: Feed, options: FeedReaderOptions) -> Result<Self> {
        if is_postgres_url(url) {
            #[cfg(feature = "postgres")]
            return FeedReader::postgres(crate::pg_client::session::config(url)?, feed, options);
            #[cfg(not(feature = "postgres"))]
            return Err(crate::error::Error::Config(
                "the connection string is for PostgreSQL, which this build cannot read: \
                 enable changefeed's `postgres` feature"
                    .to_owned(),
            ));
        }
        let pool = crate::pool::pool(url, CONNECT_POOL_SIZE).await?;
        FeedReader::with_options(pool, feed, options)
    }

    /// The feed it reads.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Its options.
    pub fn options(&self) -> &FeedReaderOptions {
        &self.options
    }

    /// The pool it takes connections from on SQL Server; `None` on PostgreSQL.
    pub fn pool(&self) -> Option<&Pool> {
        match &self.backend {
            Backend::SqlServer(pool) => Some(pool),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// The connection settings it reads with on PostgreSQL (feature `postgres`); `None` on
    /// SQL Server. The Kafka exporter opens its own connections with them.
    #[cfg(feature = "postgres")]
    pub fn postgres_config(&self) -> Option<&tokio_postgres::Config> {
        match &self.backend {
            Backend::SqlServer(_) => None,
            Backend::Postgres(config) => Some(config),
        }
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
        match &self.backend {
            Backend::SqlServer(pool) => self.read_once_from(pool, shard, cursor).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(config) => {
                // One read on a connection of its own, no wait.
                let mut source = PostgresSource::<T>::new(
                    (**config).clone(),
                    self.feed.clone(),
                    self.options.page_size,
                    self.options.timeout_margin,
                );
                source
                    .read_waiting(shard, cursor, std::time::Duration::ZERO)
                    .await
            }
        }
    }

    /// [`read_once`](Self::read_once) on SQL Server: one `read_feed` call on a connection
    /// of `pool`.
    async fn read_once_from<T: FeedItem>(
        &self,
        pool: &Pool,
        shard: i32,
        cursor: Cursor,
    ) -> Result<Page<T>> {
        let mut conn = pool.get().await?;
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

    /// A [`PageSource`] over this reader's database (its pool on SQL Server, a
    /// connection of its own on PostgreSQL), for [`page_stream`].
    pub fn source<T: FeedItem + Send + 'static>(&self) -> FeedSource<T> {
        let (feed, page_size, margin) = (
            self.feed.clone(),
            self.options.page_size,
            self.options.timeout_margin,
        );
        match &self.backend {
            Backend::SqlServer(pool) => {
                FeedSource::sql_server(PoolSource::new(pool.clone(), feed, page_size, margin))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(config) => FeedSource::postgres(PostgresSource::new(
                (**config).clone(),
                feed,
                page_size,
                margin,
            )),
        }
    }

    /// The endless stream of pages of keys of `shard` after `cursor` (see [`page_stream`]
    /// for waiting, retries and errors). It holds one connection while it runs (pooled on
    /// SQL Server, its own on PostgreSQL).
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
        self.merged::<FeedRow<K>, I>(cursors)
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
        self.merged::<FeedEvent<E>, I>(cursors)
    }

    /// The streams of `T` of the shards of `cursors`, each from its cursor, merged: what
    /// [`stream_shards`](Self::stream_shards) and
    /// [`event_stream_shards`](Self::event_stream_shards) return.
    fn merged<T, I>(
        &self,
        cursors: I,
    ) -> impl Stream<Item = (i32, Result<Page<T>>)> + Send + 'static + use<T, I>
    where
        T: FeedItem + Send + 'static,
        I: IntoIterator<Item = (i32, Cursor)>,
    {
        let streams: Vec<_> = cursors
            .into_iter()
            .map(|(shard, cursor)| {
                let source = self.source::<T>();
                (shard, page_stream(source, shard, cursor, self.options))
            })
            .collect();
        merge_shards(streams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use futures::StreamExt;

    use crate::error::Error;
    use crate::reader::ReadRetryPolicy;

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

    #[test]
    fn the_url_picks_the_backend() {
        for postgres in [
            "postgres://reader@db/app",
            "  PostgreSQL://reader@db/app",
            "host=/run/postgresql dbname=app user=reader",
            "user=reader host=db dbname=app",
        ] {
            assert!(is_postgres_url(postgres), "{postgres}");
        }
        for sql_server in [
            "server=tcp:localhost,1433;user=sa;password=x;TrustServerCertificate=true",
            "Server=db;Database=app;host=x;",
            "mysql://u@h/app",
        ] {
            assert!(!is_postgres_url(sql_server), "{sql_server}");
        }
    }

    #[tokio::test]
    async fn connect_reads_sql_server_from_an_ado_string_and_postgres_from_a_url() {
        let feed: Feed = "app.Event".parse().unwrap();
        let options = FeedReaderOptions::default();
        let sql_server = FeedReader::connect(
            "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true",
            feed.clone(),
            options,
        )
        .await
        .unwrap();
        assert!(sql_server.pool().is_some());
        let postgres =
            FeedReader::connect("postgres://reader@127.0.0.1:1/app", feed, options).await;
        #[cfg(feature = "postgres")]
        assert!(postgres.unwrap().pool().is_none());
        #[cfg(not(feature = "postgres"))]
        assert!(
            matches!(&postgres, Err(Error::Config(message)) if message.contains("`postgres` feature")),
            "{postgres:?}"
        );
    }

    /// Without a server a PostgreSQL reader fails as the SQL Server one does: transiently,
    /// until the retries run out, and its streams own what they use.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn without_a_postgres_server_reads_fail_transiently_and_the_stream_gives_up() {
        let options = FeedReaderOptions::default().retry(
            ReadRetryPolicy::default()
                .initial(Duration::from_millis(1))
                .max(Duration::from_millis(5))
                .max_retries(Some(1)),
        );
        let mut config =
            crate::pg_client::session::config("postgres://reader@127.0.0.1:1/app").unwrap();
        config.connect_timeout(Duration::from_millis(300));
        let reader = FeedReader::postgres(config, "app.Event".parse().unwrap(), options).unwrap();
        let error = reader
            .read_events::<(i64, String)>(0, Cursor::START)
            .await
            .unwrap_err();
        assert!(error.is_transient(), "{error}");
        let stream = reader.stream::<i64>(0, Cursor::START);
        assert_send_static(&stream);
        drop(reader);
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
}
