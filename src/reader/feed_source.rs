//! [`FeedSource`]: the [`PageSource`] a [`FeedReader`] hands out, over whichever database
//! the reader reads (a [`PoolSource`] on SQL Server, a `PostgresSource` on PostgreSQL), so
//! that one stream state machine and one exporter serve both.

use std::time::Duration;

use crate::cursor::Cursor;
use crate::error::Result;

#[cfg(doc)]
use super::FeedReader;
use super::page::{FeedItem, Page};
use super::pool_source::PoolSource;
#[cfg(feature = "postgres")]
use super::postgres_source::PostgresSource;
use super::stream::PageSource;

/// The [`PageSource`] of a [`FeedReader`] ([`FeedReader::source`]): the reader's database's
/// own source behind one type.
///
/// ```no_run
/// # fn run(reader: changefeed::FeedReader) {
/// use changefeed::reader::{FeedRow, page_stream};
/// use changefeed::Cursor;
///
/// let source = reader.source::<FeedRow<i64>>().with_page_size(100);
/// let pages = page_stream(source, 0, Cursor::START, *reader.options());
/// # }
/// ```
#[derive(Debug)]
pub struct FeedSource<T>(Backend<T>);

#[derive(Debug)]
enum Backend<T> {
    // Both boxed: each is hundreds of bytes (a PoolSource holds its pooled connection
    // inline, a PostgresSource its Config), of very different sizes.
    SqlServer(Box<PoolSource<T>>),
    #[cfg(feature = "postgres")]
    Postgres(Box<PostgresSource<T>>),
}

impl<T> FeedSource<T> {
    pub(super) fn sql_server(source: PoolSource<T>) -> Self {
        FeedSource(Backend::SqlServer(Box::new(source)))
    }

    #[cfg(feature = "postgres")]
    pub(super) fn postgres(source: PostgresSource<T>) -> Self {
        FeedSource(Backend::Postgres(Box::new(source)))
    }

    /// The same source reading `page_size` rows per call (the reader's own page size
    /// otherwise).
    ///
    /// ```no_run
    /// # fn run(reader: changefeed::FeedReader) {
    /// let source = reader.source::<changefeed::FeedRow<i64>>().with_page_size(50);
    /// # }
    /// ```
    pub fn with_page_size(self, page_size: u32) -> Self {
        FeedSource(match self.0 {
            Backend::SqlServer(source) => {
                Backend::SqlServer(Box::new(source.with_page_size(page_size)))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(source) => {
                Backend::Postgres(Box::new(source.with_page_size(page_size)))
            }
        })
    }
}

impl<T: FeedItem + Send + 'static> PageSource for FeedSource<T> {
    type Item = T;

    async fn read(&mut self, shard: i32, cursor: Cursor, wait: Duration) -> Result<Page<T>> {
        match &mut self.0 {
            Backend::SqlServer(source) => source.read(shard, cursor, wait).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(source) => source.read(shard, cursor, wait).await,
        }
    }

    fn reset(&mut self) {
        match &mut self.0 {
            Backend::SqlServer(source) => source.reset(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(source) => source.reset(),
        }
    }
}
