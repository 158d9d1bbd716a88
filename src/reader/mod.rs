//! Reading a feed: one page at a time with [`read_page`], or as an endless stream of pages
//! with [`FeedReader`].
//!
//! The stream's state machine ([`page_stream`]) is generic over a [`PageSource`], so it is
//! tested without a server; [`PoolSource`] is the real source, `read_feed` over a
//! [`Pool`] connection.
//!
//! One concept a file, each re-exported here (`changefeed::reader::X` names every item):
//! `page.rs` one `read_feed` call and the rows it decodes; `key_columns.rs` a feed's key
//! column names; `options.rs` how a stream waits and retries; `stream.rs` the state
//! machine; `pool_source.rs` the real source; `feed_reader.rs` [`FeedReader`].

mod feed_reader;
mod key_columns;
mod options;
mod page;
mod pool_source;
mod stream;

pub use feed_reader::FeedReader;
pub use key_columns::key_columns;
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
