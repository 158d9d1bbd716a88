//! Reading a feed: one page at a time with [`read_page`], or as an endless stream of pages
//! with [`FeedReader`].
//!
//! The stream's state machine ([`page_stream`]) is generic over a [`PageSource`], so it is
//! tested without a server; the real sources are [`PoolSource`], `read_feed` over a
//! [`Pool`] connection (SQL Server), and `PostgresSource`, the feed's read function on a
//! connection of its own that long-polls with `LISTEN` (PostgreSQL, feature `postgres`).
//! [`FeedReader`] reads either database with the same items, pages and streams.
//!
//! One concept a file, each re-exported here (`changefeed::reader::X` names every item):
//! `page.rs` one `read_feed` call and the rows it decodes; `key_columns.rs` a feed's key
//! column names; `options.rs` how a stream waits and retries; `stream.rs` the state
//! machine; `pool_source.rs` the SQL Server source; `postgres_source.rs` the PostgreSQL
//! source; `feed_source.rs` [`FeedSource`], either of them; `feed_reader.rs` [`FeedReader`].

mod feed_reader;
mod feed_source;
mod key_columns;
mod options;
mod page;
mod pool_source;
#[cfg(feature = "postgres")]
mod postgres_source;
mod stream;

pub use feed_reader::{CONNECT_POOL_SIZE, FeedReader};
pub use feed_source::FeedSource;
pub use key_columns::key_columns;
#[cfg(feature = "postgres")]
pub use postgres_source::PostgresSource;
// The Kafka exporter's delivery back-off; nothing else outside `options` uses it.
#[cfg(feature = "kafka")]
pub(crate) use options::exponential;
pub use options::{FeedReaderOptions, IdleBackoff, MIN_TIMEOUT_MARGIN, ReadRetryPolicy, Wait};
pub use page::{
    CallBounds, FeedEvent, FeedItem, FeedRow, MAX_PAGE_SIZE, MAX_WAIT, Overrun, Page, ReadOptions,
    SHARD_LOCK_WAIT, collect_first_result, read_events, read_items, read_page,
};
pub use pool_source::{PoolSource, effective_wait};
pub use stream::{PageSource, merge_shards, page_stream};

#[cfg(doc)]
use crate::pool::Pool;
