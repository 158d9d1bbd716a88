//! An in-memory feed and cursor store for the Kafka exporter, for its tests
//! (`tests/kafka_exporter.rs`) and the Kafka benchmark (`examples/bench_kafka.rs`), which run
//! without SQL Server: each shard's feed is a list of events behind a [`PageSource`]
//! ([`FakeSource`]), and the cursors an [`ExportCursors`] ([`FakeCursors`]) that records
//! every save, optionally with how many messages the topic held at that moment.
//!
//! The events are rows of a fixed table: `Shard` and `OrderId` (the key, in that order),
//! `Payload` (text) and `Total` (a decimal as text).

#![allow(dead_code)] // the tests and the benchmark each use part of it

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use changefeed::json::JsonColumns;
use changefeed::kafka::ExportCursors;
use changefeed::reader::PageSource;
use changefeed::{Cursor, Error, FeedEvent, Page, Result};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use ulid::Ulid;

#[path = "fake_page.rs"]
pub mod fake_page;

use fake_page::page_after;

/// The feed's key columns, in key order.
pub const KEY_COLUMNS: [&str; 2] = ["Shard", "OrderId"];

/// One event of the fake feed.
#[derive(Clone, Debug)]
pub struct Written {
    /// The event's position in its shard.
    pub ulid: Ulid,
    /// The shard it was written to.
    pub shard: i32,
    /// The event's columns; `None` for an event deleted since it was written.
    pub columns: Option<Map<String, Value>>,
}

impl Written {
    /// The message key the exporter must produce: the key columns in key order.
    pub fn key(&self) -> Option<String> {
        let columns = self.columns.as_ref()?;
        Some(format!(
            "{{\"Shard\":{},\"OrderId\":{}}}",
            columns["Shard"], columns["OrderId"]
        ))
    }
}

/// What a [`FakeFeed`] holds.
#[derive(Default)]
pub struct FeedState {
    /// Each shard's events, in ULID order (ULIDs only increase: see [`FakeFeed::push`]), so
    /// a read finds its cursor by binary search instead of scanning every event.
    pub shards: BTreeMap<i32, Vec<Written>>,
    /// Shards whose reads fail with this message (a permanent error).
    pub failing: BTreeMap<i32, String>,
    /// Called with the shard and the cursor of every read, as it starts.
    pub on_read: Option<OnRead>,
}

/// What a test learns of each read (see [`FeedState::on_read`]).
pub type OnRead = Arc<dyn Fn(i32, Cursor) + Send + Sync>;

/// Events per shard, in ULID order, shared by every source of one test.
#[derive(Clone, Default)]
pub struct FakeFeed {
    pub state: Arc<Mutex<FeedState>>,
    /// Reads so far, over every source.
    pub reads: Arc<AtomicUsize>,
    next_ms: Arc<AtomicUsize>,
}

impl FakeFeed {
    /// Appends an event of `shard` with key `order_id` (a payload of `size` characters),
    /// or a deleted one; returns it.
    pub fn push(&self, shard: i32, order_id: i64, size: usize, deleted: bool) -> Written {
        // ULIDs from an hour ago, a millisecond apart: increasing in every shard.
        static BASE_MS: LazyLock<u64> = LazyLock::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                - 3_600_000
        });
        let step = self.next_ms.fetch_add(1, Ordering::SeqCst) as u64;
        let ulid = Ulid::from_parts(*BASE_MS + step, u128::from(step) + 1);
        let columns = (!deleted).then(|| {
            let Value::Object(map) = json!({
                "Shard": shard,
                "OrderId": order_id,
                "Payload": "x".repeat(size),
                "Total": "12.50",
            }) else {
                unreachable!()
            };
            map
        });
        let written = Written {
            ulid,
            shard,
            columns,
        };
        // The lock is taken after the ULID is drawn: concurrent pushes to one shard could
        // land out of order, so keep the shard's list sorted.
        let mut state = self.state.lock().unwrap();
        let events = state.shards.entry(shard).or_default();
        let at = events.partition_point(|event| event.ulid < ulid);
        events.insert(at, written.clone());
        written
    }

    /// `count` live events of `shard` with keys `0..keys` in turn, payloads of `size`
    /// characters.
    pub fn fill_sized(&self, shard: i32, count: usize, keys: i64, size: usize) -> Vec<Written> {
        (0..count)
            .map(|n| self.push(shard, n as i64 % keys, size, false))
            .collect()
    }

    /// `count` live events of `shard` with keys `0..keys` in turn, small payloads.
    pub fn fill(&self, shard: i32, count: usize, keys: i64) -> Vec<Written> {
        self.fill_sized(shard, count, keys, 10)
    }

    /// Makes every later read of `shard` fail with `message` (a permanent error).
    pub fn fail_reads(&self, shard: i32, message: &str) {
        self.state
            .lock()
            .unwrap()
            .failing
            .insert(shard, message.to_owned());
    }

    /// Every event of every shard, in ULID order (the order they were pushed in).
    pub fn events(&self) -> Vec<Written> {
        let state = self.state.lock().unwrap();
        let mut events: Vec<Written> = state.shards.values().flatten().cloned().collect();
        events.sort_by_key(|event| event.ulid);
        events
    }

    /// A page source over this feed serving pages of at most `page_size` rows.
    pub fn source(&self, page_size: u32) -> FakeSource {
        FakeSource {
            feed: self.clone(),
            page_size,
        }
    }
}

/// A page source over a [`FakeFeed`]: the rows of the shard after the cursor, at most a
/// page; never waits.
pub struct FakeSource {
    feed: FakeFeed,
    page_size: u32,
}

impl PageSource for FakeSource {
    type Item = FeedEvent<JsonColumns>;

    async fn read(
        &mut self,
        shard: i32,
        cursor: Cursor,
        _wait: Duration,
    ) -> Result<Page<Self::Item>> {
        self.feed.reads.fetch_add(1, Ordering::SeqCst);
        let state = self.feed.state.lock().unwrap();
        if let Some(on_read) = &state.on_read {
            on_read(shard, cursor);
        }
        if let Some(message) = state.failing.get(&shard) {
            return Err(Error::Config(message.clone()));
        }
        let events = state.shards.get(&shard).map_or(&[][..], Vec::as_slice);
        let after = events.partition_point(|event| event.ulid <= cursor.ulid());
        let rows: Vec<_> = events[after..]
            .iter()
            .take(self.page_size as usize)
            .map(|event| FeedEvent {
                ulid: event.ulid,
                event: JsonColumns(event.columns.clone()),
            })
            .collect();
        Ok(page_after(cursor, rows, self.page_size, |row| row.ulid))
    }

    fn reset(&mut self) {}
}

/// One save, as the fake cursor store saw it.
#[derive(Clone, Debug)]
pub struct Save {
    /// The shard whose cursor was saved.
    pub shard: i32,
    /// The cursor saved.
    pub cursor: Cursor,
    /// Messages in the topic when the save happened (when watched).
    pub in_topic: Option<i64>,
}

/// Counts the messages of a topic at each save (see [`FakeCursors::watching`]).
pub type Watch = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = i64> + Send>> + Send + Sync>;

/// What a [`FakeCursors`] holds.
#[derive(Default)]
pub struct CursorState {
    /// Each shard's cursor saved last.
    pub saved: BTreeMap<i32, Cursor>,
    /// Every save, in order.
    pub log: Vec<Save>,
    /// Save attempts so far, failed and hung ones included.
    pub attempts: usize,
    /// The save attempt (1-based) that fails.
    pub fail_at: Option<usize>,
    /// The save attempt (1-based) that fails with a transient error (a lost connection).
    pub transient_at: Option<usize>,
    /// The shard of each save that failed with that transient error.
    pub transient_failures: Vec<i32>,
    /// The save attempt (1-based) that never completes.
    pub hang_at: Option<usize>,
    /// What counts the topic's messages at every save.
    pub watch: Option<Watch>,
}

/// A cursor store in memory recording every save; clones share it.
#[derive(Clone, Default)]
pub struct FakeCursors {
    /// The saves and the injected faults.
    pub state: Arc<Mutex<CursorState>>,
    /// Notified when a save starts to hang (`hang_at`).
    pub hung: Arc<Notify>,
}

impl FakeCursors {
    /// A store that records, with each save, what `count` says the topic holds then.
    pub fn watching(count: Watch) -> Self {
        let cursors = FakeCursors::default();
        cursors.state.lock().unwrap().watch = Some(count);
        cursors
    }

    /// Every save so far, in order.
    pub fn log(&self) -> Vec<Save> {
        self.state.lock().unwrap().log.clone()
    }

    /// Each shard's cursor saved last.
    pub fn saved(&self) -> BTreeMap<i32, Cursor> {
        self.state.lock().unwrap().saved.clone()
    }
}

impl ExportCursors for FakeCursors {
    async fn load(&mut self, shard: i32) -> Result<Option<Cursor>> {
        Ok(self.state.lock().unwrap().saved.get(&shard).copied())
    }

    async fn save(&mut self, shard: i32, cursor: Cursor) -> Result<()> {
        let (attempt, fail_at, transient_at, hang_at, watch) = {
            let mut state = self.state.lock().unwrap();
            state.attempts += 1;
            (
                state.attempts,
                state.fail_at,
                state.transient_at,
                state.hang_at,
                state.watch.clone(),
            )
        };
        if fail_at == Some(attempt) {
            return Err(Error::Config("injected: the cursor save failed".to_owned()));
        }
        if transient_at == Some(attempt) {
            self.state.lock().unwrap().transient_failures.push(shard);
            return Err(Error::Connection(
                "injected: the connection was lost during the cursor save".to_owned(),
            ));
        }
        if hang_at == Some(attempt) {
            self.hung.notify_one();
            std::future::pending::<()>().await;
        }
        let in_topic = match watch {
            Some(count) => Some(count().await),
            None => None,
        };
        let mut state = self.state.lock().unwrap();
        state.saved.insert(shard, cursor);
        state.log.push(Save {
            shard,
            cursor,
            in_topic,
        });
        Ok(())
    }
}
