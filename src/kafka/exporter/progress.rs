//! What an export has done so far: [`ExportProgress`], read from another task as
//! [`ProgressSnapshot`]s (the command line's progress line).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ulid::Ulid;

use crate::json::JsonColumns;
use crate::reader::{FeedEvent, Page};

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

    /// Counts `count` messages produced again after a failed delivery.
    pub(super) fn retried(&self, count: u64) {
        self.0.retried.fetch_add(count, Ordering::Relaxed);
    }

    /// Counts a page whose cursor was saved.
    pub(super) fn page_saved(
        &self,
        shard: i32,
        page: &Page<FeedEvent<JsonColumns>>,
        exported: u64,
    ) {
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
