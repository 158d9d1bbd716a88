//! [`FeedExporter`]: produces a feed's events to a Kafka topic and saves the consumer's
//! cursor only after every message of a page is acknowledged.
//!
//! # What a message is
//!
//! Every event read with its whole row (`read_feed @with_event = 1` on SQL Server,
//! `read_events_<id>` on PostgreSQL, through the [`FeedReader`] either way) becomes one
//! message:
//!
//! * **key**: the event's primary key as compact JSON, its columns in key order, e.g.
//!   `{"OrderId":42}` or `{"Region":"eu","OrderId":42}`. A row's key never changes, so
//!   Kafka's default partitioner sends every event of one key to one partition, in order.
//! * **value**: the event row, by default as one JSON object of every column
//!   ([`JsonValues`], the types as [`crate::json`] converts them); a [`ValueSerializer`]
//!   can produce Avro, Protobuf or anything else instead.
//! * **headers**: `ulid` (the event's 26-character ULID, its position in its shard),
//!   `shard` (decimal) and `feed` (`schema.table`), as [`export_headers`] builds them.
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
//! name ([`SqlCursors`]: `changefeed.consumer_cursor` of the feed's database). A restart resumes from the saved
//! cursor, so an event is never skipped; the events of a page whose cursor was not saved
//! (a crash, a stop) are produced again, with the same `ulid` header, so a consumer drops
//! duplicates by that header.
//!
//! **One page of read-ahead.** While page N is delivered and its cursor saved, page N+1 is
//! read and its messages built (key, value, headers), so the producer does not wait for the
//! feed between pages. N+1 is produced only once N is acknowledged and saved, and no page
//! past N+1 is read before then: a shard never has read more than one page past its saved
//! cursor, and N+1 never overtakes N, however often N is produced again. Order and
//! at-least-once therefore hold as without read-ahead: what reaches the producer, and what
//! is saved, is the same sequence of pages. When N fails (poison, fatal, a serializer
//! error) or is given up, N+1 is dropped unproduced and unsaved; a read or serializer error
//! of N+1 stops the export only after N is saved.
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
//!   `INVALID_RECORD`, `CORRUPT_MESSAGE`, ...) does not say which event
//!   is at fault: the first event it refused is produced again alone (no other shard's
//!   message in flight meanwhile). Delivered, the page goes on after it; refused alone, it
//!   is poison.
//! * `Poison` or `Fatal`, and a [`ValueSerializer`] error: the export stops with an
//!   [`Error::Kafka`] naming the event (ULID, shard) and what to do; the cursor of that page
//!   is not saved. The topic refusing the producer (`TOPIC_AUTHORIZATION_FAILED`) is fatal
//!   here: the export has one topic; so is its refusing the records' timestamps
//!   (`INVALID_TIMESTAMP`: this host's clock, not an event, named as such).
//!
//! A read error (from [`page_stream`], after its own retries of transient failures) stops
//! the export with that error, and so does a cursor save that fails (a transient save error
//! is retried a few times first).
//!
//! # Stopping
//!
//! When the `shutdown` future given to [`FeedExporter::run`] completes, no new page is
//! read (a read under way, the read-ahead's included, is abandoned); the page in flight of
//! each shard is finished (produced, acknowledged, saved), a page already read ahead is
//! dropped unproduced, and `run` returns `Ok`. If that page cannot be acknowledged within
//! [`ExportConfig::shutdown_grace`] (brokers unreachable), or its cursor cannot be saved
//! within it (the database not answering), it is given up unsaved: the next run produces it

mod config;
mod cursors;
mod delivery;
mod job;
mod message;
mod progress;
mod shard;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use rdkafka::producer::FutureProducer;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::json::JsonColumns;
use crate::metrics::ExportMetrics;
use crate::reader::{
    FeedEvent, FeedReader, FeedReaderOptions, FeedSource, PageSource, key_columns, page_stream,
};

pub use config::ExportConfig;
pub use cursors::{ExportCursors, SqlCursors};
pub use message::{
    ExportEvent, HEADER_FEED, HEADER_SHARD, HEADER_ULID, JsonValues, ValueSerializer,
    export_headers,
};
pub use progress::{ExportProgress, ProgressSnapshot};

use job::{Job, Stop};
use message::Messages;

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

impl FeedExporter<FeedSource<FeedEvent<JsonColumns>>, SqlCursors> {
    /// An exporter reading with `reader` and keeping its cursors in the reader's database
    /// (SQL Server, or PostgreSQL with the feature `postgres`).
    ///
    /// Learns the feed's key columns first: on SQL Server from the column description of a
    /// `read_feed` call with `@with_event = 0` ([`key_columns`]: page size 1, no wait,
    /// outside a transaction; only the feed's procedure is called, so a login in the feed's
    /// readers role suffices), on PostgreSQL from `changefeed.feed_info` (CF006 for a
    /// feed that is not there). An unknown feed fails here, with SQL Server's error 2812 and a
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
        let (keys, cursors) = match reader.pool() {
            Some(pool) => {
                let keys = {
                    let mut conn = pool.get().await?;
                    // Broken until the call completes: abandoned half-way, the pool
                    // discards it.
                    conn.set_broken(true);
                    let bound = reader_options.timeout_margin;
                    let keys = tokio::time::timeout(bound, key_columns(&mut conn, &feed))
                        .await
                        .map_err(|_elapsed| {
                            Error::Connection(format!(
                                "read_feed of {feed} did not answer within {bound:?} while \
                                 the exporter asked for its key columns"
                            ))
                        })??;
                    conn.set_broken(false);
                    keys
                };
                let cursors = SqlCursors::new(pool.clone(), feed.clone(), &config.consumer)?;
                (keys, cursors)
            }
            None => postgres_parts(reader, &feed, &config, reader_options.timeout_margin).await?,
        };
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

/// The key columns (from `changefeed.feed_info`, in key order) and the cursor store of a
/// feed on PostgreSQL, whose reader has no pool.
#[cfg(feature = "postgres")]
async fn postgres_parts(
    reader: &FeedReader,
    feed: &Feed,
    config: &ExportConfig,
    bound: std::time::Duration,
) -> Result<(Vec<String>, SqlCursors)> {
    let settings = reader.postgres_config().ok_or_else(|| {
        Error::Config(format!(
            "the reader of {feed} has neither a pool nor PostgreSQL settings"
        ))
    })?;
    let keys = tokio::time::timeout(bound, async {
        let client = crate::postgres::connect(settings).await?;
        let row = client
            .query_one(
                "select key_columns from changefeed.feed_info($1)",
                &[&feed.to_string()],
            )
            .await?;
        row.try_get::<_, Vec<String>>(0)
            .map_err(|error| crate::error::decode_error("key_columns", error))
    })
    .await
    .map_err(|_elapsed| {
        Error::Connection(format!(
            "PostgreSQL did not answer within {bound:?} while the exporter asked for the key \
             columns of {feed}"
        ))
    })??;
    let cursors = SqlCursors::postgres(settings.clone(), feed.clone(), &config.consumer)?;
    Ok((keys, cursors))
}

#[cfg(not(feature = "postgres"))]
async fn postgres_parts(
    _reader: &FeedReader,
    feed: &Feed,
    _config: &ExportConfig,
    _bound: std::time::Duration,
) -> Result<(Vec<String>, SqlCursors)> {
    Err(Error::Config(format!("the reader of {feed} has no pool")))
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
            messages: Messages {
                feed_name: feed.to_string(),
                key_columns,
                serializer,
            },
            progress: progress.clone(),
            metrics: ExportMetrics::new(&feed.to_string(), &shards),
            cursors: tokio::sync::Mutex::new(cursors),
            producing: tokio::sync::RwLock::new(()),
        };
        let (stop_sender, stop) = watch::channel(None);
        let shard_runs = futures::future::try_join_all(shards.iter().map(|&shard| {
            let pages = {
                let stop = Stop::new(stop.clone());
                let job = &job;
                let source = &source;
                async move {
                    let from = job.load(shard).await?.unwrap_or(start);
                    tracing::info!(feed = %job.messages.feed_name, shard, cursor = %from, "export: shard starts");
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
                    tracing::info!(feed = %job.messages.feed_name, "export: shutdown, finishing the pages in flight");
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
