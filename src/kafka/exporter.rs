//! [`FeedExporter`]: produces a feed's events to a Kafka topic and saves the consumer's
//! cursor only after every message of a page is acknowledged.
//!
//! # What a message is
//!
//! Every event read with `read_feed @with_event = 1` becomes one message:
//!
//! * **key**: the event's primary key as compact JSON, its columns in key order, e.g.
//!   `{"OrderId":42}` or `{"Region":"eu","OrderId":42}`. A row's key never changes, so
//!   Kafka's default partitioner sends every event of one key to one partition, in order.
//! * **value**: the event row, by default as one JSON object of every column
//!   ([`JsonValues`], the types as [`crate::json`] converts them); a [`ValueSerializer`]
//!   can produce Avro, Protobuf or anything else instead.
//! * **headers**: `ulid` (the event's 26-character ULID, its position in its shard),
//!   `shard` (decimal) and `feed` (`schema.table`).
//!
//! An event whose row was deleted after it was written comes back from `read_feed` with
//! every column NULL: it has no key and nothing to export, so it is skipped (counted in
//! [`ProgressSnapshot::skipped_deleted`], logged), and the cursor moves past it.
//!
//! # Delivery: at least once, never a gap
//!
//! Each shard is exported page by page, strictly in order; the shards run concurrently.
//! For each page every message is enqueued, then every delivery report awaited, and only
//! when all are acknowledged (`acks=all`) is the page's cursor saved under the consumer's
//! name ([`SqlCursors`]: `changefeed.consumer_cursor`). A restart resumes from the saved
//! cursor, so an event is never skipped; the events of a page whose cursor was not saved
//! (a crash, a stop) are produced again, with the same `ulid` header, so a consumer drops
//! duplicates by that header.
//!
//! A delivery that fails is judged by [`super::classify`]:
//!
//! * `Retriable` or `Backpressure`: the exporter waits (bounded exponential back-off,
//!   [`ExportConfig::backoff_min`] to [`ExportConfig::backoff_max`]) and produces the page
//!   again from the first failed message on, in order (the ones before it were
//!   acknowledged). It keeps trying as long as the failures last; the page's cursor is
//!   saved once the whole page is acknowledged. Messages after the failed one that were
//!   acknowledged are produced again too: duplicates, never gaps.
//!   A topic that does not exist (`UNKNOWN_TOPIC_OR_PART`, auto-creation off) is such a
//!   retriable failure: the export waits for it as long as it is missing, logging each
//!   retry, and goes on once it is created.
//! * A broker refusal that covers a whole produce request (`MESSAGE_TOO_LARGE`,
//!   `INVALID_RECORD`, `CORRUPT_MESSAGE`, `INVALID_TIMESTAMP`, ...) does not say which event
//!   is at fault: the first event it refused is produced again alone (no other shard's
//!   message in flight meanwhile). Delivered, the page goes on after it; refused alone, it
//!   is poison.
//! * `Poison` or `Fatal`, and a [`ValueSerializer`] error: the export stops with an
//!   [`Error::Kafka`] naming the event (ULID, shard) and what to do; the cursor of that page
//!   is not saved. The topic refusing the producer (`TOPIC_AUTHORIZATION_FAILED`) is fatal
//!   here: the export has one topic.
//!
//! A read error (from [`page_stream`], after its own retries of transient failures) stops
//! the export with that error, and so does a cursor save that fails (a transient save error
//! is retried a few times first).
//!
//! # Stopping
//!
//! When the `shutdown` future given to [`FeedExporter::run`] completes, no new page is
//! read; the page in flight of each shard is finished (produced, acknowledged, saved) and
//! `run` returns `Ok`. If that page cannot be acknowledged within
//! [`ExportConfig::shutdown_grace`] (brokers unreachable), or its cursor cannot be saved
//! within it (the database not answering), it is given up unsaved: the next run produces it
//! again.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use ulid::Ulid;

use crate::cursor::Cursor;
use crate::cursor_store::{CursorStore, check_consumer};
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::json::JsonColumns;
use crate::metrics::ExportMetrics;
use crate::pool::Pool;
use crate::reader::{
    FeedEvent, FeedReader, FeedReaderOptions, Page, PageSource, PoolSource, exponential,
    key_columns, page_stream,
};
use crate::relay::ErrorKind;

use super::classify::{classify, refuses_whole_request, topic_refused};

/// The header carrying the event's ULID (26 characters).
pub const HEADER_ULID: &str = "ulid";
/// The header carrying the shard the event was read from (decimal).
pub const HEADER_SHARD: &str = "shard";
/// The header carrying the feed (`schema.table`).
pub const HEADER_FEED: &str = "feed";

/// How many times a cursor save that fails transiently is tried again before the export
/// stops with the error.
const SAVE_RETRIES: u32 = 5;

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
        serde_json::to_vec(&event.event).map_err(|error| error.to_string())
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
    /// The first wait before a page is produced again after a retriable failure; it
    /// doubles with each consecutive failure. Default 100 ms.
    pub backoff_min: Duration,
    /// The longest wait between two attempts at a page. Default 10 s.
    pub backoff_max: Duration,
    /// After shutdown, how long the page in flight may still take to be acknowledged
    /// before it is given up unsaved (produced again by the next run). Default 30 s.
    pub shutdown_grace: Duration,
}

impl ExportConfig {
    /// Exports to `topic` as `consumer`.
    pub fn new(topic: impl Into<String>, consumer: impl Into<String>) -> Self {
        ExportConfig {
            topic: topic.into(),
            consumer: consumer.into(),
            page_size: 1000,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
        }
    }

    setters! {
        /// Sets `page_size`.
        page_size: u32;
        /// Sets `backoff_min`, the first wait after a retriable failure (at least 1 ms).
        backoff_min: Duration;
        /// Sets `backoff_max`, the longest wait between attempts (at least `backoff_min`).
        backoff_max: Duration;
        /// Sets `shutdown_grace`, how long the page in flight may take after shutdown.
        shutdown_grace: Duration;
    }

    /// Checks the settings; the error names the setting and what it must be.
    fn validate(&self) -> Result<()> {
        if self.topic.is_empty() {
            return Err(Error::Config(
                "the export topic is empty; name the Kafka topic to produce to".to_owned(),
            ));
        }
        check_consumer(&self.consumer)?;
        if self.backoff_min < Duration::from_millis(1) || self.backoff_max < self.backoff_min {
            return Err(Error::Config(format!(
                "export back-off is {:?} to {:?}; backoff_min must be at least 1 ms and \
                 backoff_max at least backoff_min",
                self.backoff_min, self.backoff_max
            )));
        }
        Ok(())
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

/// The counters behind [`ExportProgress`].
#[derive(Debug, Default)]
struct Counters {
    exported: AtomicU64,
    skipped_deleted: AtomicU64,
    retried: AtomicU64,
    /// The greatest acknowledged ULID, and per shard the last ULID of its last page when
    /// that page was full (the shard is behind), else `None`.
    marks: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    last_ulid: Option<Ulid>,
    behind: BTreeMap<i32, Option<Ulid>>,
}

/// What the exporter has done so far; cheap to clone and to read from another task (the
/// command line's progress line).
#[derive(Clone, Debug, Default)]
pub struct ExportProgress(Arc<Counters>);

impl ExportProgress {
    /// The counters now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        let counters = &self.0;
        let marks = lock(&counters.marks);
        let now = SystemTime::now();
        let behind = marks
            .behind
            .values()
            .flatten()
            .map(|ulid| now.duration_since(ulid.datetime()).unwrap_or_default())
            .max();
        ProgressSnapshot {
            exported: counters.exported.load(Ordering::Relaxed),
            skipped_deleted: counters.skipped_deleted.load(Ordering::Relaxed),
            retried: counters.retried.load(Ordering::Relaxed),
            last_ulid: marks.last_ulid,
            behind,
        }
    }

    /// Counts a page whose cursor was saved.
    fn page_saved(&self, shard: i32, page: &Page<FeedEvent<JsonColumns>>, exported: u64) {
        let counters = &self.0;
        let skipped = page.rows.len() as u64 - exported;
        counters.exported.fetch_add(exported, Ordering::Relaxed);
        counters
            .skipped_deleted
            .fetch_add(skipped, Ordering::Relaxed);
        let last = page.rows.last().map(|row| row.ulid);
        let mut marks = lock(&counters.marks);
        if exported > 0 {
            let acknowledged = page
                .rows
                .iter()
                .rev()
                .find(|row| row.event.0.is_some())
                .map(|row| row.ulid);
            marks.last_ulid = marks.last_ulid.max(acknowledged);
        }
        marks
            .behind
            .insert(shard, if page.is_full() { last } else { None });
    }
}

/// A mutex that a panicking holder cannot make unusable: the counters stay readable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The exporter's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProgressSnapshot {
    /// Events produced and acknowledged (counted when their page's cursor is saved).
    pub exported: u64,
    /// Events whose row was deleted before it was read (nothing to export).
    pub skipped_deleted: u64,
    /// Messages produced again after a retriable or back-pressure failure.
    pub retried: u64,
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
    /// The cursor saved last for each shard exported (shards that saved nothing are left
    /// out), by shard.
    pub saved: Vec<(i32, Cursor)>,
}

/// Produces a feed's events to a topic; see the module documentation.
pub struct FeedExporter<S, C> {
    source: Box<dyn Fn(i32) -> S + Send + Sync>,
    cursors: C,
    producer: FutureProducer,
    config: ExportConfig,
    feed: Feed,
    key_columns: Vec<String>,
    serializer: Arc<dyn ValueSerializer>,
    progress: ExportProgress,
    reader_options: FeedReaderOptions,
}

impl FeedExporter<PoolSource<FeedEvent<JsonColumns>>, SqlCursors> {
    /// An exporter reading with `reader` and keeping its cursors in the reader's database.
    ///
    /// Learns the feed's key columns first, from the column description of a `read_feed`
    /// call with `@with_event = 0` ([`key_columns`]: page size 1, no wait, outside a
    /// transaction; only the feed's procedure is called, so a login in the feed's readers
    /// role suffices). An unknown feed fails here, with SQL Server's error 2812 and a
    /// message saying so. Pages are read with the reader's options (long-poll, retries),
    /// `config.page_size` rows at a time.
    pub async fn connect(
        reader: &FeedReader,
        producer: FutureProducer,
        config: ExportConfig,
    ) -> Result<Self> {
        config.validate()?;
        let reader_options = reader.options().page_size(config.page_size);
        reader_options.validate()?;
        let feed = reader.feed().clone();
        let keys = {
            let mut conn = reader.pool().get().await?;
            // Broken until the call completes: abandoned half-way, the pool discards it.
            conn.set_broken(true);
            let bound = reader_options.timeout_margin;
            let keys = tokio::time::timeout(bound, key_columns(&mut conn, &feed))
                .await
                .map_err(|_elapsed| {
                    Error::Connection(format!(
                        "read_feed of {feed} did not answer within {bound:?} while the \
                         exporter asked for its key columns"
                    ))
                })??;
            conn.set_broken(false);
            keys
        };
        let cursors = SqlCursors::new(reader.pool().clone(), feed.clone(), &config.consumer)?;
        let page_size = config.page_size;
        let reader = reader.clone();
        let exporter = FeedExporter::from_parts(
            feed,
            keys,
            move |_shard| {
                reader
                    .source::<FeedEvent<JsonColumns>>()
                    .with_page_size(page_size)
            },
            cursors,
            producer,
            config,
        );
        Ok(exporter.with_reader_options(reader_options))
    }
}

impl<S, C> FeedExporter<S, C>
where
    S: PageSource<Item = FeedEvent<JsonColumns>>,
    C: ExportCursors,
{
    /// An exporter over any page source (one per shard, from `source`) and cursor store.
    /// `key_columns` are the feed's key columns in key order (see [`key_columns`]). Pages
    /// are streamed with [`FeedReaderOptions::default`] and `config.page_size`; see
    /// [`with_reader_options`](Self::with_reader_options).
    pub fn from_parts(
        feed: Feed,
        key_columns: Vec<String>,
        source: impl Fn(i32) -> S + Send + Sync + 'static,
        cursors: C,
        producer: FutureProducer,
        config: ExportConfig,
    ) -> Self {
        let reader_options = FeedReaderOptions::default().page_size(config.page_size);
        FeedExporter {
            source: Box::new(source),
            cursors,
            producer,
            config,
            feed,
            key_columns,
            serializer: Arc::new(JsonValues),
            progress: ExportProgress::default(),
            reader_options,
        }
    }

    /// Uses `serializer` for message values instead of [`JsonValues`].
    pub fn with_serializer(mut self, serializer: impl ValueSerializer) -> Self {
        self.serializer = Arc::new(serializer);
        self
    }

    /// Streams pages with `options`: how a caught-up shard waits and how read failures are
    /// retried (see [`page_stream`]). Rows per page are the source's business, not
    /// `options.page_size` ([`connect`](FeedExporter::connect)'s source reads
    /// `config.page_size`); `connect` passes the reader's options.
    pub fn with_reader_options(mut self, options: FeedReaderOptions) -> Self {
        self.reader_options = options;
        self
    }

    /// A handle on the counters.
    pub fn progress(&self) -> ExportProgress {
        self.progress.clone()
    }

    /// Exports `shards` until `shutdown` completes (then finishes the page in flight, saves
    /// and returns) or an error stops it. A shard with no saved cursor starts at `start`.
    ///
    /// The shards run concurrently on the caller's task; the pages of one shard strictly in
    /// order. The first error of any shard stops them all and is returned: pages in flight
    /// are then not saved, and a restart produces them again.
    pub async fn run(
        self,
        shards: Vec<i32>,
        start: Cursor,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ExportReport> {
        self.config.validate()?;
        self.reader_options.validate()?;
        if shards.is_empty() {
            return Err(Error::Config(
                "no shard to export; name at least one (0 for an unsharded feed)".to_owned(),
            ));
        }
        let mut distinct = shards.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != shards.len() {
            return Err(Error::Config(format!(
                "the shards {shards:?} name a shard twice; name each once"
            )));
        }
        if self.key_columns.is_empty() {
            return Err(Error::Config(format!(
                "no key columns given for feed {}: pass them in key order (see \
                 changefeed::reader::key_columns)",
                self.feed
            )));
        }
        let FeedExporter {
            source,
            cursors,
            producer,
            config,
            feed,
            key_columns,
            serializer,
            progress,
            reader_options,
        } = self;
        let job = Job {
            producer,
            config,
            feed_name: feed.to_string(),
            key_columns,
            serializer,
            progress: progress.clone(),
            metrics: ExportMetrics::new(&feed.to_string(), &shards),
            cursors: tokio::sync::Mutex::new(cursors),
            producing: tokio::sync::RwLock::new(()),
        };
        let (stop_sender, stop) = watch::channel(None);
        let shard_runs = futures::future::try_join_all(shards.iter().map(|&shard| {
            let pages = {
                let stop = Stop(stop.clone());
                let job = &job;
                let source = &source;
                async move {
                    let from = job.load(shard).await?.unwrap_or(start);
                    tracing::info!(feed = %job.feed_name, shard, cursor = %from, "export: shard starts");
                    let source = job.metrics.pages(source(shard), shard);
                    let stream = page_stream(source, shard, from, reader_options);
                    job.export_shard(shard, stream, stop).await
                }
            };
            async move { pages.await.map(|saved| (shard, saved)) }
        }));
        let mut shard_runs = pin!(shard_runs);
        let mut shutdown = pin!(shutdown);
        let mut stopping = false;
        let outcome = loop {
            tokio::select! {
                outcome = &mut shard_runs => break outcome,
                () = &mut shutdown, if !stopping => {
                    stopping = true;
                    tracing::info!(feed = %job.feed_name, "export: shutdown, finishing the pages in flight");
                    stop_sender.send_replace(Some(Instant::now()));
                }
            }
        };
        let saved = outcome?
            .into_iter()
            .filter_map(|(shard, saved)| saved.map(|cursor| (shard, cursor)))
            .collect();
        Ok(ExportReport {
            exported: progress.snapshot().exported,
            saved,
        })
    }
}

/// The shutdown signal as each shard sees it: when shutdown was asked, if it was.
#[derive(Clone)]
struct Stop(watch::Receiver<Option<Instant>>);

impl Stop {
    /// Completes when shutdown is asked (at once if it was).
    async fn requested(&mut self) {
        // The sender lives as long as `run`, which outlives every shard: an error cannot
        // happen, and would mean stopping anyway.
        let _ = self.0.wait_for(Option::is_some).await;
    }

    /// Completes `grace` after shutdown was asked: the page in flight is given up then.
    async fn grace_over(&mut self, grace: Duration) {
        self.requested().await;
        let asked = (*self.0.borrow()).unwrap_or_else(Instant::now);
        tokio::time::sleep_until(asked + grace).await;
    }
}

/// What one page came to.
enum PageOutcome {
    /// Every message acknowledged (`exported` of them; deleted events skipped).
    Acknowledged { exported: u64 },
    /// Shutdown's grace passed before the page was acknowledged: not saved.
    GivenUp,
}

/// A message ready to produce.
struct Prepared {
    ulid: Ulid,
    key: String,
    value: Vec<u8>,
}

/// Everything the shards of one run share.
struct Job<C> {
    producer: FutureProducer,
    config: ExportConfig,
    feed_name: String,
    key_columns: Vec<String>,
    serializer: Arc<dyn ValueSerializer>,
    progress: ExportProgress,
    metrics: ExportMetrics,
    /// One store for all shards; a save is short, so they take turns.
    cursors: tokio::sync::Mutex<C>,
    /// Shards produce their pages under its read side; a suspect event is produced alone
    /// under its write side, so no other shard's message shares its request.
    producing: tokio::sync::RwLock<()>,
}

impl<C: ExportCursors> Job<C> {
    async fn load(&self, shard: i32) -> Result<Option<Cursor>> {
        self.cursors.lock().await.load(shard).await
    }

    /// Saves `cursor`, trying a transient failure again a few times: `Ok(true)` once
    /// saved, `Ok(false)` when shutdown's grace passed first (the page is produced again by
    /// the next run). The store is locked for one attempt at a time, never through the
    /// back-off, so the other shards save meanwhile.
    async fn save(&self, shard: i32, cursor: Cursor, stop: &mut Stop) -> Result<bool> {
        let grace = self.config.shutdown_grace;
        let mut failures = 0;
        loop {
            let attempt = async { self.cursors.lock().await.save(shard, cursor).await };
            let result = tokio::select! {
                result = attempt => result,
                () = stop.grace_over(grace) => return Ok(false),
            };
            match result {
                Ok(()) => return Ok(true),
                Err(error) if error.is_transient() && failures < SAVE_RETRIES => {
                    failures += 1;
                    let delay =
                        exponential(self.config.backoff_min, self.config.backoff_max, failures);
                    tracing::warn!(
                        feed = %self.feed_name, shard, %cursor, %error, retry = failures,
                        "export: saving the cursor failed, retrying"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stop.grace_over(grace) => return Ok(false),
                    }
                }
                Err(error) => {
                    tracing::error!(
                        feed = %self.feed_name, shard, %cursor, %error,
                        "export: saving the cursor failed; its page will be produced again"
                    );
                    return Err(error);
                }
            }
        }
    }

    /// Exports the pages of `stream` until shutdown or an error; returns the cursor saved
    /// last.
    async fn export_shard(
        &self,
        shard: i32,
        stream: impl futures::Stream<Item = Result<Page<FeedEvent<JsonColumns>>>>,
        mut stop: Stop,
    ) -> Result<Option<Cursor>> {
        let mut stream = pin!(stream);
        let mut saved = None;
        loop {
            let next = tokio::select! {
                biased;
                () = stop.requested() => break,
                next = stream.next() => next,
            };
            let mut page = match next {
                // page_stream ends only after yielding an error; a finite source may end.
                None => break,
                Some(Err(error)) => {
                    tracing::error!(feed = %self.feed_name, shard, %error, "export: reading the feed failed");
                    return Err(error);
                }
                Some(Ok(page)) => page,
            };
            let producing = self.metrics.produce_timer();
            let outcome = self.export_page(shard, &mut page, &mut stop).await?;
            drop(producing);
            match outcome {
                PageOutcome::Acknowledged { exported } => {
                    if !self.save(shard, page.next_cursor, &mut stop).await? {
                        tracing::warn!(
                            feed = %self.feed_name, shard, cursor = %page.next_cursor,
                            "export: the cursor of the page in flight was not saved within \
                             the shutdown grace; the next run produces the page again"
                        );
                        break;
                    }
                    self.progress.page_saved(shard, &page, exported);
                    self.metrics.page_saved(shard, &page, exported);
                    saved = Some(page.next_cursor);
                    tracing::debug!(
                        feed = %self.feed_name, shard, cursor = %page.next_cursor,
                        rows = page.rows.len(), exported,
                        "export: page acknowledged and cursor saved"
                    );
                }
                PageOutcome::GivenUp => {
                    tracing::warn!(
                        feed = %self.feed_name, shard, cursor = %page.next_cursor,
                        "export: the page in flight was not acknowledged within the shutdown \
                         grace; not saved, the next run produces it again"
                    );
                    break;
                }
            }
        }
        Ok(saved)
    }

    /// The messages of a page's events, deleted events left out. Each row's columns are
    /// lent to the serializer's [`ExportEvent`] and put back after, rather than cloned: a
    /// clone of every row (a map of strings) cost about as much as serializing it.
    fn prepare(
        &self,
        shard: i32,
        page: &mut Page<FeedEvent<JsonColumns>>,
    ) -> Result<Vec<Prepared>> {
        let mut messages = Vec::with_capacity(page.rows.len());
        for row in &mut page.rows {
            let Some(columns) = &mut row.event.0 else {
                tracing::info!(
                    feed = %self.feed_name, shard, ulid = %row.ulid,
                    "export: event row deleted since it was written; nothing to export, skipped"
                );
                continue;
            };
            let (key, key_text) =
                message_key(&self.key_columns, columns).map_err(|error| error.at_row(row.ulid))?;
            let event = ExportEvent {
                feed: self.feed_name.clone(),
                shard,
                ulid: row.ulid,
                key,
                event: std::mem::take(columns),
            };
            let value = self.serializer.serialize(&event);
            *columns = event.event;
            let value = value.map_err(|reason| Error::Kafka {
                code: None,
                message: format!(
                    "event {} of {} shard {shard} cannot be serialized: {reason}. Nothing of \
                     its page was saved; fix the value serializer (or skip the event by \
                     saving a cursor at its ULID) and export again",
                    row.ulid, self.feed_name
                ),
            })?;
            messages.push(Prepared {
                ulid: row.ulid,
                key: key_text,
                value,
            });
        }
        Ok(messages)
    }

    /// Produces every event of `page` and waits until all are acknowledged, producing again
    /// from the first failure on after a retriable one.
    async fn export_page(
        &self,
        shard: i32,
        page: &mut Page<FeedEvent<JsonColumns>>,
        stop: &mut Stop,
    ) -> Result<PageOutcome> {
        let messages = self.prepare(shard, page)?;
        let shard_text = shard.to_string();
        let mut first = 0;
        let mut failures: u32 = 0;
        while first < messages.len() {
            let (reports, refused) = {
                let producing = tokio::select! {
                    guard = self.producing.read() => guard,
                    () = stop.grace_over(self.config.shutdown_grace) => return Ok(PageOutcome::GivenUp),
                };
                let (deliveries, refused) = self.enqueue(&messages[first..], &shard_text);
                let acks = futures::future::join_all(deliveries);
                let results = tokio::select! {
                    results = acks => results,
                    () = stop.grace_over(self.config.shutdown_grace) => return Ok(PageOutcome::GivenUp),
                };
                drop(producing);
                let reports: Vec<Option<KafkaError>> =
                    results.into_iter().map(delivery_error).collect();
                (reports, refused)
            };
            let failed = reports
                .iter()
                .position(Option::is_some)
                .map(|offset| (offset, reports[offset].clone().expect("a failed report")))
                .or(refused);
            let Some((offset, error)) = failed else {
                break;
            };
            let mut index = first + offset;
            // A broker refuses a whole request for one bad message in it: the events it
            // refused are only suspect until one is refused alone, and the error must never
            // name a bystander. They are produced alone, in order, up to the first that is
            // refused alone (or the first the request did not refuse).
            let error = if offset < reports.len() && refuses_whole_request(&error) {
                let mut refused_alone = None;
                while let Some(Some(batch_error)) = reports.get(index - first) {
                    if !refuses_whole_request(batch_error) {
                        break;
                    }
                    match self
                        .produce_alone(&messages[index], &shard_text, stop)
                        .await
                    {
                        None => return Ok(PageOutcome::GivenUp),
                        Some(Ok(())) => index += 1,
                        Some(Err(error)) => {
                            refused_alone = Some(error);
                            break;
                        }
                    }
                }
                match refused_alone {
                    Some(error) => error,
                    None => {
                        first = index;
                        failures = 0;
                        continue;
                    }
                }
            } else {
                error
            };
            let message = &messages[index];
            // The export has one topic: its refusal is every topic's, so it is fatal.
            let kind = if topic_refused(&error) {
                ErrorKind::Fatal
            } else {
                classify(&error)
            };
            match kind {
                ErrorKind::Retriable | ErrorKind::Backpressure => {
                    failures = if index > first { 1 } else { failures + 1 };
                    let delay = exponential(
                        self.config.backoff_min,
                        self.config.backoff_max,
                        failures - 1,
                    );
                    let again = (messages.len() - index) as u64;
                    self.progress.0.retried.fetch_add(again, Ordering::Relaxed);
                    self.metrics.retried(again);
                    tracing::warn!(
                        feed = %self.feed_name, shard, ulid = %message.ulid, %error,
                        kind = kind.as_str(), again, delay_ms = delay.as_millis() as u64,
                        "export: delivery failed, producing the rest of the page again"
                    );
                    first = index;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stop.grace_over(self.config.shutdown_grace) => return Ok(PageOutcome::GivenUp),
                    }
                }
                ErrorKind::Poison | ErrorKind::Fatal => {
                    let advice = if kind == ErrorKind::Poison {
                        "this event can never be produced as it is (e.g. larger than the \
                         producer's message.max.bytes or the topic's max.message.bytes): \
                         raise the limit, or skip the event by saving a cursor at its ULID, \
                         then export again"
                    } else {
                        "the producer cannot work (credentials, the topic's ACLs, \
                         configuration): fix that and export again"
                    };
                    tracing::error!(
                        feed = %self.feed_name, shard, ulid = %message.ulid, %error,
                        kind = kind.as_str(), "export: stopping"
                    );
                    return Err(Error::Kafka {
                        code: error.rdkafka_error_code().map(|code| format!("{code:?}")),
                        message: format!(
                            "producing event {} of {} shard {shard} to topic {} failed ({}: \
                             {error}); its page's cursor was not saved, the export resumes \
                             before it. What to do: {advice}",
                            message.ulid,
                            self.feed_name,
                            self.config.topic,
                            kind.as_str()
                        ),
                    });
                }
            }
        }
        Ok(PageOutcome::Acknowledged {
            exported: messages.len() as u64,
        })
    }

    /// Produces one suspect event alone: under the write side of `producing`, so no other
    /// message of the producer is queued or in flight and its request carries it only.
    /// `None` when shutdown's grace passed first.
    async fn produce_alone(
        &self,
        message: &Prepared,
        shard: &str,
        stop: &mut Stop,
    ) -> Option<std::result::Result<(), KafkaError>> {
        let grace = self.config.shutdown_grace;
        let alone = async {
            let _alone = self.producing.write().await;
            let (deliveries, refused) = self.enqueue(std::slice::from_ref(message), shard);
            if let Some((_, error)) = refused {
                return Err(error);
            }
            match deliveries.into_iter().next() {
                Some(delivery) => delivery_error(delivery.await).map_or(Ok(()), Err),
                None => Err(KafkaError::Canceled),
            }
        };
        tokio::select! {
            result = alone => Some(result),
            () = stop.grace_over(grace) => None,
        }
    }

    /// Enqueues `messages` in order until the producer refuses one (its queue is full, the
    /// message too large): the deliveries of those enqueued, and the refusal with the
    /// refused message's offset in `messages`.
    fn enqueue(
        &self,
        messages: &[Prepared],
        shard: &str,
    ) -> (Vec<DeliveryFuture>, Option<(usize, KafkaError)>) {
        let mut deliveries = Vec::with_capacity(messages.len());
        for (offset, message) in messages.iter().enumerate() {
            let ulid = message.ulid.to_string();
            let headers = OwnedHeaders::new_with_capacity(3)
                .insert(Header {
                    key: HEADER_ULID,
                    value: Some(ulid.as_str()),
                })
                .insert(Header {
                    key: HEADER_SHARD,
                    value: Some(shard),
                })
                .insert(Header {
                    key: HEADER_FEED,
                    value: Some(self.feed_name.as_str()),
                });
            let record = FutureRecord::to(&self.config.topic)
                .key(message.key.as_bytes())
                .payload(&message.value)
                .headers(headers);
            match self.producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((error, _record)) => return (deliveries, Some((offset, error))),
            }
        }
        (deliveries, None)
    }
}

/// The failure of one delivery report, if it failed. A report that never comes (the
/// producer was closed under it) counts as a retriable failure.
fn delivery_error(
    result: std::result::Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> Option<KafkaError> {
    match result {
        Ok(Ok(_delivery)) => None,
        Ok(Err((error, _message))) => Some(error),
        Err(_canceled) => Some(KafkaError::Canceled),
    }
}

/// The message key of an event: its key columns taken by name from the event row, in key
/// order, as a compact JSON object (written by hand, as `serde_json::Map` may sort its
/// keys); and the same columns as a map.
fn message_key(
    key_columns: &[String],
    event: &Map<String, Value>,
) -> Result<(Map<String, Value>, String)> {
    let mut map = Map::new();
    // Names and values are written straight into one buffer, the text `Value`'s `Display`
    // gives, rather than through a `Value::String` and a `String` each (six allocations per
    // message for a two-column key).
    let mut text = Vec::with_capacity(64);
    text.push(b'{');
    for (index, column) in key_columns.iter().enumerate() {
        let value = event.get(column).ok_or_else(|| Error::Decode {
            column: column.clone(),
            reason: "the feed's key column is not among the event row's columns; was the \
                     event table changed? Upgrade the feed (changefeed.upgrade_feed) and \
                     restart the export"
                .to_owned(),
            row: None,
        })?;
        if index > 0 {
            text.push(b',');
        }
        write_json(&mut text, column.as_str());
        text.push(b':');
        write_json(&mut text, value);
        map.insert(column.clone(), value.clone());
    }
    text.push(b'}');
    let text = String::from_utf8(text).expect("serde_json writes UTF-8");
    Ok((map, text))
}

/// Appends `value` to `text` as compact JSON.
fn write_json(text: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    // Cannot fail: a string or a `Value` always serializes (a `Map`'s keys are strings),
    // and a `Vec` takes every byte.
    serde_json::to_writer(text, value).expect("a JSON value serializes into a Vec");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_keep_key_order_and_are_compact() {
        let event = json!({"Region": "eu", "OrderId": 42, "Total": "9.50"});
        let Value::Object(event) = event else {
            unreachable!()
        };
        let columns = vec!["Region".to_owned(), "OrderId".to_owned()];
        let (map, text) = message_key(&columns, &event).unwrap();
        assert_eq!(text, r#"{"Region":"eu","OrderId":42}"#);
        assert_eq!(map.len(), 2);
        let reversed = vec!["OrderId".to_owned(), "Region".to_owned()];
        assert_eq!(
            message_key(&reversed, &event).unwrap().1,
            r#"{"OrderId":42,"Region":"eu"}"#
        );
        let missing = message_key(&["Nope".to_owned()], &event).unwrap_err();
        assert!(missing.to_string().contains("Nope"), "{missing}");
    }

    #[test]
    fn keys_escape_names_and_values_as_json_does() {
        let Value::Object(event) = json!({"Na\"me": "é\n\"x\"", "Id": [1.5, null]}) else {
            unreachable!()
        };
        let columns = vec!["Na\"me".to_owned(), "Id".to_owned()];
        let (_, text) = message_key(&columns, &event).unwrap();
        let expected = format!(
            "{{{}:{},{}:{}}}",
            Value::String("Na\"me".to_owned()),
            event["Na\"me"],
            Value::String("Id".to_owned()),
            event["Id"]
        );
        assert_eq!(text, expected);
        assert_eq!(text, r#"{"Na\"me":"é\n\"x\"","Id":[1.5,null]}"#);
    }

    #[test]
    fn json_values_are_the_event_object() {
        let Value::Object(event) = json!({"OrderId": 1, "Note": null}) else {
            unreachable!()
        };
        let export = ExportEvent {
            feed: "dbo.Orders".to_owned(),
            shard: 0,
            ulid: Ulid::nil(),
            key: Map::new(),
            event,
        };
        let bytes = JsonValues.serialize(&export).unwrap();
        let back: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, json!({"OrderId": 1, "Note": null}));
    }
}
