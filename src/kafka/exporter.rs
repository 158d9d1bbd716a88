//! [`FeedExporter`]: produces a feed's events to a Kafka topic and saves the consumer's
//! cursor only after every message of a page is acknowledged.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use serde_json::{Map, Value};
use ulid::Ulid;

use crate::cursor::Cursor;
use crate::error::Result;
use crate::feed::Feed;
use crate::json::JsonColumns;
use crate::pool::Pool;
use crate::reader::{FeedEvent, FeedReader, PageSource, PoolSource};

/// One event as the exporter produces it.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportEvent {
    /// The feed, `schema.table`.
    pub feed: String,
    /// The shard the event was read from.
    pub shard: i32,
    /// The event's position in its shard (the `ulid` header).
    pub ulid: Ulid,
    /// The event's primary-key columns (the message key, as compact JSON).
    pub key: Map<String, Value>,
    /// Every column of the event row.
    pub event: Map<String, Value>,
}

/// Turns an event into a message value: JSON by default ([`JsonValues`]); implement it for
/// Avro or Protobuf. An error is a poison event: the export stops with it, naming the event.
pub trait ValueSerializer: Send + Sync + 'static {
    /// The value bytes of `event`.
    fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String>;
}

/// The event's columns as one JSON object.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonValues;

impl ValueSerializer for JsonValues {
    fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String> {
        let _ = event;
        todo!("H2")
    }
}

/// What to export to and as whom.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ExportConfig {
    /// The topic every event goes to.
    pub topic: String,
    /// The consumer name the cursors are saved under (`changefeed.consumer_cursor`).
    pub consumer: String,
    /// Rows per `read_feed` page.
    pub page_size: u32,
}

impl ExportConfig {
    /// Exports to `topic` as `consumer`.
    pub fn new(topic: impl Into<String>, consumer: impl Into<String>) -> Self {
        ExportConfig {
            topic: topic.into(),
            consumer: consumer.into(),
            page_size: 1000,
        }
    }

    setters! {
        /// Sets `page_size`.
        page_size: u32;
    }
}

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
        let _ = (pool, feed, consumer.into());
        todo!("H2")
    }
}

impl ExportCursors for SqlCursors {
    async fn load(&mut self, shard: i32) -> Result<Option<Cursor>> {
        let _ = (shard, &self.pool, &self.feed, &self.consumer);
        todo!("H2")
    }

    async fn save(&mut self, shard: i32, cursor: Cursor) -> Result<()> {
        let _ = (shard, cursor);
        todo!("H2")
    }
}

/// What the exporter has done so far; cheap to clone and to read from another task (the
/// command line's progress line).
#[derive(Clone, Debug, Default)]
pub struct ExportProgress(Arc<()>);

impl ExportProgress {
    /// The counters now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        todo!("H2")
    }
}

/// The exporter's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProgressSnapshot {
    /// Events produced and acknowledged.
    pub exported: u64,
    /// Events whose row was deleted before it was read (nothing to export).
    pub skipped_deleted: u64,
    /// The last acknowledged event's ULID, over all shards.
    pub last_ulid: Option<Ulid>,
    /// How far behind the feed's head the furthest-behind shard is: `None` while every
    /// shard is caught up.
    pub behind: Option<Duration>,
}

/// How an export ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportReport {
    /// Events produced and acknowledged.
    pub exported: u64,
    /// The cursor saved last for each shard exported.
    pub saved: Vec<(i32, Cursor)>,
}

/// Produces a feed's events to a topic; see the module documentation.
pub struct FeedExporter<S, C> {
    source: Box<dyn Fn(i32) -> S + Send + Sync>,
    cursors: C,
    producer: FutureProducer,
    config: ExportConfig,
}

impl FeedExporter<PoolSource<FeedEvent<JsonColumns>>, SqlCursors> {
    /// An exporter reading with `reader` and keeping its cursors in the reader's database.
    /// Learns the feed's key columns from `read_feed` first (an unknown feed fails here).
    pub async fn connect(
        reader: &FeedReader,
        producer: FutureProducer,
        config: ExportConfig,
    ) -> Result<Self> {
        let _ = (reader, producer, config);
        todo!("H2")
    }
}

impl<S, C> FeedExporter<S, C>
where
    S: PageSource<Item = FeedEvent<JsonColumns>>,
    C: ExportCursors,
{
    /// An exporter over any page source (one per shard, from `source`) and cursor store.
    pub fn from_parts(
        feed: Feed,
        key_columns: Vec<String>,
        source: impl Fn(i32) -> S + Send + Sync + 'static,
        cursors: C,
        producer: FutureProducer,
        config: ExportConfig,
    ) -> Self {
        let _ = (feed, key_columns);
        FeedExporter {
            source: Box::new(source),
            cursors,
            producer,
            config,
        }
    }

    /// Uses `serializer` for message values instead of [`JsonValues`].
    pub fn with_serializer(self, serializer: impl ValueSerializer) -> Self {
        let _ = serializer;
        todo!("H2")
    }

    /// A handle on the counters.
    pub fn progress(&self) -> ExportProgress {
        todo!("H2")
    }

    /// Exports `shards` until `shutdown` completes (then finishes the page in flight, saves
    /// and returns) or an error stops it. A shard with no saved cursor starts at `start`.
    pub async fn run(
        self,
        shards: Vec<i32>,
        start: Cursor,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ExportReport> {
        let _ = (
            shards,
            start,
            shutdown,
            &self.source,
            &self.cursors,
            &self.producer,
            &self.config,
        );
        todo!("H2")
    }
}
