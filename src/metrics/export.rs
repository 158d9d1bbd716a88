//! The feed exporter's metrics: handles per feed and per shard, and the page source that
//! records every read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, SharedString};

use super::{
    EXPORT_EVENTS, EXPORT_LAG, EXPORT_LAST_EVENT, EXPORT_LAST_READ, EXPORT_PAGES,
    EXPORT_PRODUCE_SECONDS, EXPORT_READS, EXPORT_RETRIES, EXPORT_SKIPPED, Timer, unix_now,
    unix_seconds,
};
use crate::cursor::Cursor;
use crate::error::Result;
use crate::reader::{FeedEvent, Page, PageSource};

/// One export's handles, labelled with its feed (and shard). Cheap to clone.
#[derive(Clone)]
pub(crate) struct ExportMetrics(Arc<Handles>);

struct Handles {
    events: Counter,
    skipped: Counter,
    pages: Counter,
    retries: Counter,
    produce_seconds: Histogram,
    reads_ok: Counter,
    reads_failed: Counter,
    shards: BTreeMap<i32, ShardHandles>,
}

struct ShardHandles {
    lag: Gauge,
    last_event: Gauge,
    last_read: Gauge,
}

impl ExportMetrics {
    /// The handles of an export of `feed`'s `shards`, from the recorder installed now.
    pub(crate) fn new(feed: &str, shards: &[i32]) -> Self {
        let feed = SharedString::from(feed.to_owned());
        let f = || feed.clone();
        let shards = shards
            .iter()
            .map(|&shard| {
                let s = || shard.to_string();
                let handles = ShardHandles {
                    lag: ::metrics::gauge!(EXPORT_LAG, "feed" => f(), "shard" => s()),
                    last_event: ::metrics::gauge!(EXPORT_LAST_EVENT, "feed" => f(), "shard" => s()),
                    last_read: ::metrics::gauge!(EXPORT_LAST_READ, "feed" => f(), "shard" => s()),
                };
                (shard, handles)
            })
            .collect();
        ExportMetrics(Arc::new(Handles {
            events: ::metrics::counter!(EXPORT_EVENTS, "feed" => f()),
            skipped: ::metrics::counter!(EXPORT_SKIPPED, "feed" => f()),
            pages: ::metrics::counter!(EXPORT_PAGES, "feed" => f()),
            retries: ::metrics::counter!(EXPORT_RETRIES, "feed" => f()),
            produce_seconds: ::metrics::histogram!(EXPORT_PRODUCE_SECONDS, "feed" => f()),
            reads_ok: ::metrics::counter!(EXPORT_READS, "feed" => f(), "result" => "ok"),
            reads_failed: ::metrics::counter!(EXPORT_READS, "feed" => f(), "result" => "error"),
            shards,
        }))
    }

    /// A page of `shard` was acknowledged and its cursor saved; `exported` of its rows were
    /// produced (the others were deleted before they were read).
    pub(crate) fn page_saved<T>(&self, shard: i32, page: &Page<FeedEvent<T>>, exported: u64) {
        let h = &self.0;
        h.pages.increment(1);
        h.events.increment(exported);
        h.skipped
            .increment((page.rows.len() as u64).saturating_sub(exported));
        let (Some(shard), Some(last)) = (h.shards.get(&shard), page.rows.last()) else {
            return;
        };
        let last_time = unix_seconds(last.ulid.datetime());
        shard.last_event.set(last_time);
        // A full page means more rows wait: the shard is as far behind as its last row is
        // old. A page that is not full reached the head.
        let lag = if page.is_full() {
            (unix_now() - last_time).max(0.0)
        } else {
            0.0
        };
        shard.lag.set(lag);
    }

    /// `count` events are produced again after a failed delivery.
    pub(crate) fn retried(&self, count: u64) {
        self.0.retries.increment(count);
    }

    /// Times a page's produce until the returned guard is dropped.
    pub(crate) fn produce_timer(&self) -> Timer {
        Timer::start(&self.0.produce_seconds)
    }

    /// `source`, recording each of its reads of `shard`.
    pub(crate) fn pages<S: PageSource>(&self, source: S, shard: i32) -> MeteredPages<S> {
        MeteredPages {
            source,
            shard,
            metrics: self.clone(),
        }
    }

    fn read(&self, shard: i32, ok: bool) {
        let h = &self.0;
        if ok {
            h.reads_ok.increment(1);
            if let Some(shard) = h.shards.get(&shard) {
                shard.last_read.set(unix_now());
            }
        } else {
            h.reads_failed.increment(1);
        }
    }
}

/// A page source that records every read's result (the exporter's readiness signal: a
/// long-poll that found nothing is a read that succeeded).
pub(crate) struct MeteredPages<S> {
    source: S,
    shard: i32,
    metrics: ExportMetrics,
}

impl<S: PageSource> PageSource for MeteredPages<S> {
    type Item = S::Item;

    async fn read(&mut self, shard: i32, cursor: Cursor, wait: Duration) -> Result<Page<S::Item>> {
        let page = self.source.read(shard, cursor, wait).await;
        self.metrics.read(self.shard, page.is_ok());
        page
    }

    fn reset(&mut self) {
        self.source.reset();
    }
}
