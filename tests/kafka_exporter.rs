//! The Kafka exporter against librdkafka's in-process mock cluster, without SQL Server: each
//! shard's feed is an in-memory list of events behind a fake `PageSource`, and the cursors
//! a fake `ExportCursors` that records every save together with how many messages the topic
//! held at that moment.
//!
//! What is checked: no cursor is saved before every message of its page is acknowledged;
//! a crash between produce and save (a failed save, a dropped run) produces the page again
//! on restart and skips nothing; every shard arrives in order per shard and per key;
//! retriable failures recover without gaps; a too-large event stops the export naming it;
//! shutdown finishes the page in flight, or gives it up after its grace.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::producer::FutureProducer;
use changefeed::kafka::rdkafka::types::RDKafkaApiKey;
use changefeed::kafka::rdkafka::types::RDKafkaRespErr::{self, *};
use changefeed::kafka::{
    ExportConfig, ExportEvent, ExportReport, FeedExporter, JsonValues, ValueSerializer,
};
use changefeed::reader::{FeedReaderOptions, IdleBackoff, ReadRetryPolicy, Wait};
use changefeed::{Cursor, Error, Feed, Result};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use ulid::Ulid;

/// The longest any wait of these tests may take before the test calls it stuck.
const LIMIT: Duration = Duration::from_secs(60);

/// The feed every test exports.
const FEED: &str = "dbo.Orders";

mod common_kafka;
#[path = "../examples/support/memory_feed.rs"]
mod memory_feed;
#[path = "kafka_exporter/mock.rs"]
mod mock;

use memory_feed::{FakeCursors, FakeFeed, FakeSource, KEY_COLUMNS, Save, Written};
use mock::Received;

// ------------------------------------------------------------------------------------------
// Running an export (the fake feed and cursors are shared with the benchmark:
// examples/support/memory_feed.rs)
// ------------------------------------------------------------------------------------------

type Exporter = FeedExporter<FakeSource, FakeCursors>;

fn exporter(
    feed: &FakeFeed,
    cursors: &FakeCursors,
    producer: FutureProducer,
    config: ExportConfig,
) -> Exporter {
    let page_size = config.page_size;
    let source_feed = feed.clone();
    FeedExporter::from_parts(
        FEED.parse::<Feed>().unwrap(),
        KEY_COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        move |_shard| source_feed.source(page_size),
        cursors.clone(),
        producer,
        config,
    )
    .with_reader_options(
        FeedReaderOptions::default()
            .page_size(page_size)
            .wait(Wait::ClientBackoff)
            .idle_backoff(
                IdleBackoff::default()
                    .min(Duration::from_millis(5))
                    .max(Duration::from_millis(20)),
            )
            .retry(
                ReadRetryPolicy::default()
                    .initial(Duration::from_millis(1))
                    .max(Duration::from_millis(5)),
            ),
    )
}

fn config(topic: &str, page_size: u32) -> ExportConfig {
    ExportConfig::new(topic, "exporter-test")
        .page_size(page_size)
        .backoff_min(Duration::from_millis(50))
        .backoff_max(Duration::from_millis(400))
}

/// What every test starts from: a one-broker mock cluster holding the test's own topic, and
/// an empty feed.
struct Setup {
    /// `export-<test>`: unique per test (tests share nothing, but a name in the failure
    /// helps).
    topic: String,
    cluster: common_kafka::Cluster,
    bootstrap: String,
    feed: FakeFeed,
}

impl Setup {
    fn new(test: &str) -> Setup {
        let topic = format!("export-{test}");
        let cluster = mock::cluster(&topic);
        let bootstrap = cluster.bootstrap_servers();
        Setup {
            topic,
            cluster,
            bootstrap,
            feed: FakeFeed::default(),
        }
    }

    /// Writes `count` events over `keys` keys to shard 0, then as many to shard 1: the
    /// events, in that order.
    fn fill_shards_0_and_1(&self, count: usize, keys: i64) -> Vec<Written> {
        let mut events = self.feed.fill(0, count, keys);
        events.extend(self.feed.fill(1, count, keys));
        events
    }

    /// A cursor store that records, with each save, how many messages the topic holds then.
    fn watching(&self) -> FakeCursors {
        let (bootstrap, topic) = (self.bootstrap.clone(), self.topic.clone());
        FakeCursors::watching(Arc::new(move || {
            Box::pin(mock::topic_total(bootstrap.clone(), topic.clone()))
        }))
    }

    /// An idempotent producer for the cluster, with the `extra` settings.
    fn producer(&self, extra: &[(&str, &str)]) -> FutureProducer {
        mock::producer(&self.bootstrap, extra)
    }

    /// The test's export settings, in pages of `page_size`.
    fn config(&self, page_size: u32) -> ExportConfig {
        config(&self.topic, page_size)
    }

    /// An exporter of the feed to the topic.
    fn exporter(
        &self,
        cursors: &FakeCursors,
        producer: FutureProducer,
        config: ExportConfig,
    ) -> Exporter {
        exporter(&self.feed, cursors, producer, config)
    }

    /// Starts exporting `shards` of the feed.
    fn start(
        &self,
        cursors: &FakeCursors,
        producer: FutureProducer,
        config: ExportConfig,
        shards: Vec<i32>,
    ) -> Running {
        start(self.exporter(cursors, producer, config), shards)
    }

    /// Takes the broker down, then starts exporting shard 0 in pages of 4: its first page
    /// stays in flight until the test brings the broker back.
    fn start_with_broker_down(&self, cursors: &FakeCursors) -> Running {
        self.cluster.broker_down(1).expect("the broker goes down");
        self.start(cursors, self.producer(&[]), self.config(4), vec![0])
    }

    /// The broker answers the next produce requests with `errors`, one a request, in order
    /// (`RD_KAFKA_RESP_ERR_NO_ERROR` accepts one).
    fn answer_produce_requests(&self, errors: &[RDKafkaRespErr]) {
        self.cluster.request_errors(RDKafkaApiKey::Produce, errors);
    }

    /// Every message the topic holds now.
    async fn received(&self) -> Vec<Received> {
        mock::consume_all(&self.bootstrap, &self.topic).await
    }
}

/// A running export and the switch that shuts it down.
struct Running {
    handle: JoinHandle<Result<ExportReport>>,
    shutdown: Option<oneshot::Sender<()>>,
    progress: changefeed::kafka::ExportProgress,
}

fn start(exporter: Exporter, shards: Vec<i32>) -> Running {
    let (sender, receiver) = oneshot::channel::<()>();
    let progress = exporter.progress();
    let handle = tokio::spawn(exporter.run(shards, Cursor::START, async move {
        let _ = receiver.await;
    }));
    Running {
        handle,
        shutdown: Some(sender),
        progress,
    }
}

impl Running {
    /// Waits until `events` events were exported or skipped, then shuts down.
    async fn finish_after(mut self, events: u64) -> Result<ExportReport> {
        let deadline = Instant::now() + LIMIT;
        loop {
            let done = self.progress.snapshot();
            if done.exported + done.skipped_deleted >= events {
                break;
            }
            assert!(
                !self.handle.is_finished(),
                "the export ended early, after {done:?}"
            );
            assert!(
                Instant::now() < deadline,
                "stuck at {done:?}, {events} expected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop().await
    }

    async fn stop(&mut self) -> Result<ExportReport> {
        self.ask_shutdown();
        self.join().await
    }

    /// Completes the shutdown future, without waiting for the export to end.
    fn ask_shutdown(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    async fn join(&mut self) -> Result<ExportReport> {
        tokio::time::timeout(LIMIT, &mut self.handle)
            .await
            .expect("the export ends")
            .expect("the export task does not panic")
    }
}

/// Waits until `feed` was read `count` times or more.
async fn until_read(feed: &FakeFeed, count: usize) {
    until(&format!("{count} reads of the feed"), || {
        feed.reads.load(Ordering::SeqCst) >= count
    })
    .await;
}

/// Waits until `condition` holds, checking every 10 ms.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

/// Every save came after the messages of every page saved so far were in the topic: at
/// each save, the topic held at least the live events up to each shard's saved cursor.
fn assert_saved_only_after_ack(log: &[Save], events: &[Written]) {
    let mut cursors: BTreeMap<i32, Cursor> = BTreeMap::new();
    for save in log {
        if let Some(previous) = cursors.get(&save.shard) {
            assert!(
                *previous < save.cursor,
                "cursors of a shard only move on: {log:?}"
            );
        }
        cursors.insert(save.shard, save.cursor);
        let acknowledged = events
            .iter()
            .filter(|event| {
                event.columns.is_some()
                    && cursors
                        .get(&event.shard)
                        .is_some_and(|cursor| event.ulid <= cursor.ulid())
            })
            .count() as i64;
        let in_topic = save.in_topic.expect("the save was watched");
        assert!(
            in_topic >= acknowledged,
            "shard {} saved {} while the topic held {in_topic} messages, fewer than the \
             {acknowledged} its saved cursors cover",
            save.shard,
            save.cursor
        );
    }
}

/// Every message is an event of the feed with its key, value and headers.
fn assert_messages_match(received: &[Received], events: &[Written]) {
    let by_ulid: BTreeMap<Ulid, &Written> = events.iter().map(|e| (e.ulid, e)).collect();
    for message in received {
        let event = by_ulid
            .get(&message.ulid)
            .unwrap_or_else(|| panic!("a message of no event: {message:?}"));
        assert_eq!(message.feed, FEED);
        assert_eq!(message.shard, event.shard);
        assert_eq!(
            Some(&message.key),
            event.key().as_ref(),
            "the key of {}",
            event.ulid
        );
        assert_eq!(
            Some(&message.value),
            event.columns.clone().map(Value::Object).as_ref(),
            "the value of {}",
            event.ulid
        );
    }
}

/// Every live event is in the topic (no gap) and no deleted one is.
fn assert_no_gap(received: &[Received], events: &[Written]) {
    let got: BTreeSet<Ulid> = received.iter().map(|m| m.ulid).collect();
    let live: BTreeSet<Ulid> = events
        .iter()
        .filter(|e| e.columns.is_some())
        .map(|e| e.ulid)
        .collect();
    let missing: Vec<_> = live.difference(&got).collect();
    assert!(missing.is_empty(), "events never produced: {missing:?}");
    let extra: Vec<_> = got.difference(&live).collect();
    assert!(extra.is_empty(), "messages of no live event: {extra:?}");
}

/// Every live event arrived as the message it should be: no gap, nothing extra, each
/// message matching its event, in order per shard and key.
fn assert_exported(received: &[Received], events: &[Written]) {
    assert_no_gap(received, events);
    assert_messages_match(received, events);
    assert_in_order(received);
}

/// The topic holds the events of `expected` (each at least once), and nothing else.
fn assert_holds_only(received: &[Received], expected: &[Written], why: &str) {
    assert_eq!(
        received.iter().map(|m| m.ulid).collect::<BTreeSet<_>>(),
        expected.iter().map(|e| e.ulid).collect::<BTreeSet<_>>(),
        "{why}"
    );
}

/// The ULIDs of each (partition, shard), in offset order, first occurrences only: they
/// must increase (per shard, and so per key, whose messages share a partition).
fn assert_in_order(received: &[Received]) {
    let mut last: BTreeMap<(i32, i32), Ulid> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for message in received {
        if !seen.insert(message.ulid) {
            continue;
        }
        let slot = (message.partition, message.shard);
        if let Some(previous) = last.get(&slot) {
            assert!(
                *previous < message.ulid,
                "partition {} shard {}: {} came after {previous}",
                message.partition,
                message.shard,
                message.ulid
            );
        }
        last.insert(slot, message.ulid);
    }
}

/// How often each ULID arrived, for those that arrived more than once.
fn duplicates(received: &[Received]) -> BTreeMap<Ulid, usize> {
    let mut counts: BTreeMap<Ulid, usize> = BTreeMap::new();
    for message in received {
        *counts.entry(message.ulid).or_default() += 1;
    }
    counts.retain(|_, count| *count > 1);
    counts
}

// ------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_shards_are_exported_in_order_per_shard_and_key() {
    let setup = Setup::new("all-shards");
    for round in 0..40 {
        for shard in 0..3 {
            // Keys repeat (five per shard), so per-key order is at stake.
            let deleted = (shard == 1 && round % 17 == 3) || (shard == 2 && round == 39);
            setup.feed.push(shard, round % 5, 20, deleted);
        }
    }
    let events = setup.feed.events();
    let cursors = setup.watching();
    let producer = setup.producer(&[]);
    let running = setup.start(&cursors, producer, setup.config(7), vec![0, 1, 2]);
    let progress = running.progress.clone();
    let report = running
        .finish_after(events.len() as u64)
        .await
        .expect("the export");

    let received = setup.received().await;
    let deleted = events.iter().filter(|e| e.columns.is_none()).count();
    assert_eq!(deleted, 4);
    assert_eq!(
        received.len(),
        events.len() - deleted,
        "each live event once"
    );
    assert!(duplicates(&received).is_empty());
    assert_exported(&received, &events);
    assert_saved_only_after_ack(&cursors.log(), &events);

    // Each shard's cursor is its last event, the deleted last event of shard 2 included.
    let last: BTreeMap<i32, Cursor> = (0..3)
        .map(|shard| {
            let ulid = events.iter().rev().find(|e| e.shard == shard).unwrap().ulid;
            (shard, Cursor::from_ulid(ulid))
        })
        .collect();
    assert_eq!(cursors.saved(), last);
    assert_eq!(report.saved, last.into_iter().collect::<Vec<_>>());
    assert_eq!(report.exported, (events.len() - deleted) as u64);
    let snapshot = progress.snapshot();
    assert_eq!(snapshot.exported, report.exported);
    assert_eq!(snapshot.skipped_deleted, deleted as u64);
    assert_eq!(snapshot.retried, 0);
    assert_eq!(snapshot.behind, None, "caught up");
    let newest_live = events
        .iter()
        .filter(|e| e.columns.is_some())
        .map(|e| e.ulid)
        .max();
    assert_eq!(snapshot.last_ulid, newest_live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cursor_is_saved_until_every_message_of_its_page_is_acknowledged() {
    let setup = Setup::new("saved-after-ack");
    let events = setup.feed.fill(0, 10, 3);
    let cursors = setup.watching();
    let running = setup.start_with_broker_down(&cursors);

    until_read(&setup.feed, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        cursors.log().is_empty(),
        "saved while the broker was down: {:?}",
        cursors.log()
    );
    assert_eq!(running.progress.snapshot().exported, 0);
    assert_eq!(
        setup.feed.reads.load(Ordering::SeqCst),
        2,
        "one page read ahead of the unacknowledged one, and no more"
    );

    setup.cluster.broker_up(1).expect("the broker comes back");
    running.finish_after(10).await.expect("the export");
    let log = cursors.log();
    assert_eq!(
        log.first().map(|save| save.cursor),
        Some(Cursor::from_ulid(events[3].ulid)),
        "the first save is the first page's last ULID"
    );
    assert!(log[0].in_topic.unwrap() >= 4, "{log:?}");
    assert_saved_only_after_ack(&log, &events);
    let received = setup.received().await;
    assert_no_gap(&received, &events);
    assert_in_order(&received);
}

/// One read of the fake feed: the shard, the cursor it read after, and the cursor that
/// shard had saved when the read started.
type ReadSeen = (i32, Cursor, Option<Cursor>);

/// Records every read of `feed` with the cursor `cursors` held for its shard then.
fn record_reads(feed: &FakeFeed, cursors: &FakeCursors) -> Arc<Mutex<Vec<ReadSeen>>> {
    let reads = Arc::new(Mutex::new(Vec::new()));
    let (log, cursors) = (reads.clone(), cursors.clone());
    feed.state.lock().unwrap().on_read = Some(Arc::new(move |shard, cursor| {
        let saved = cursors.saved().get(&shard).copied();
        log.lock().unwrap().push((shard, cursor, saved));
    }));
    reads
}

/// The pages of `shard` among `events`, in order, `page_size` events each.
fn pages_of(events: &[Written], shard: i32, page_size: usize) -> Vec<Vec<Ulid>> {
    let ulids: Vec<Ulid> = events
        .iter()
        .filter(|e| e.shard == shard)
        .map(|e| e.ulid)
        .collect();
    ulids.chunks(page_size).map(<[Ulid]>::to_vec).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_page_is_read_ahead_at_most_and_never_produced_before_its_predecessor_is_delivered() {
    let setup = Setup::new("read-ahead");
    // Every answer of the broker comes this late, so a page's last delivery report comes
    // at least this long after that message was produced.
    let round_trip = Duration::from_millis(200);
    setup
        .cluster
        .broker_round_trip_time(1, round_trip)
        .expect("the broker's round trip");
    let page_size = 4;
    let events = setup.fill_shards_0_and_1(16, 3);
    let cursors = FakeCursors::default();
    let reads = record_reads(&setup.feed, &cursors);
    // The first pages fail (their messages time out) and are produced again while the
    // broker is down.
    setup.cluster.broker_down(1).expect("the broker goes down");
    let producer = setup.producer(&[("message.timeout.ms", "500")]);
    let running = setup.start(&cursors, producer, setup.config(page_size), vec![0, 1]);
    let progress = running.progress.clone();
    until("retries of the first pages", || {
        progress.snapshot().retried >= 8
    })
    .await;
    assert_eq!(
        setup.feed.reads.load(Ordering::SeqCst),
        4,
        "each shard read its failing page and one page ahead, and nothing more"
    );
    setup.cluster.broker_up(1).expect("the broker comes back");
    running.finish_after(32).await.expect("the export");

    // Never more than one page read past the last saved cursor (a read after cursor C
    // while S is saved has read the events in (S, C] before it).
    let reads = reads.lock().unwrap().clone();
    let mut ahead_seen = 0;
    for (shard, after, saved) in &reads {
        let saved = saved.unwrap_or(Cursor::START);
        let unsaved = events
            .iter()
            .filter(|e| e.shard == *shard && saved.ulid() < e.ulid && e.ulid <= after.ulid())
            .count();
        assert!(
            unsaved <= page_size as usize,
            "shard {shard} read after {after} with only {saved} saved: {unsaved} events \
             read and unsaved, more than a page"
        );
        if unsaved == page_size as usize {
            ahead_seen += 1;
        }
    }
    assert!(ahead_seen >= 2, "pages were read ahead: {reads:?}");

    // Nothing of a page produced before its predecessor's last delivery: each message of
    // page N+1 was handed to the producer at least a round trip after every copy of page
    // N's messages that the topic holds (timestamps are whole milliseconds).
    let received = setup.received().await;
    let produced: BTreeMap<Ulid, Vec<i64>> = received.iter().fold(BTreeMap::new(), |mut map, m| {
        map.entry(m.ulid).or_default().push(m.produced_ms);
        map
    });
    let gap = round_trip.as_millis() as i64 - 1;
    for shard in [0, 1] {
        let pages = pages_of(&events, shard, page_size as usize);
        for (n, pair) in pages.windows(2).enumerate() {
            let last_of_page = pair[0].iter().flat_map(|u| &produced[u]).max().unwrap();
            let first_of_next = pair[1].iter().flat_map(|u| &produced[u]).min().unwrap();
            assert!(
                first_of_next - last_of_page >= gap,
                "shard {shard}: page {} was produced {} ms after page {n}'s last message, \
                 less than the broker's round trip: before that message's delivery",
                n + 1,
                first_of_next - last_of_page
            );
        }
    }
    assert_exported(&received, &events);
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([
            (0, Cursor::from_ulid(events[15].ulid)),
            (1, Cursor::from_ulid(events[31].ulid)),
        ])
    );
}

/// A value serializer that refuses one event and writes every other as JSON.
struct RefusesOne(Ulid);

impl ValueSerializer for RefusesOne {
    fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String> {
        if event.ulid == self.0 {
            return Err("injected: this event has no schema".to_owned());
        }
        JsonValues.serialize(event)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_cannot_be_serialized_stops_the_export_after_the_page_before_it() {
    let setup = Setup::new("serializer");
    let events = setup.feed.fill(0, 12, 3);
    let cursors = setup.watching();
    let producer = setup.producer(&[]);
    // Event 6 is in the second page, which is read (and its messages built) while the
    // first is delivered.
    let exporter = setup
        .exporter(&cursors, producer, setup.config(4))
        .with_serializer(RefusesOne(events[6].ulid));
    let mut running = start(exporter, vec![0]);
    let error = running.join().await.expect_err("the export stops");
    let message = error.to_string();
    assert!(matches!(error, Error::Kafka { .. }), "{error:?}");
    assert!(
        message.contains(&events[6].ulid.to_string()) && message.contains("serialized"),
        "names the event and why: {message}"
    );
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([(0, Cursor::from_ulid(events[3].ulid))]),
        "the page before it is delivered and saved"
    );
    assert_holds_only(
        &setup.received().await,
        &events[..4],
        "nothing of the page holding the event is produced",
    );
    assert_saved_only_after_ack(&cursors.log(), &events);
}

/// How the first run dies between producing a page and saving its cursor.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// The save fails: `run` returns the error.
    SaveFails,
    /// The run future is dropped while the save is under way.
    Dropped,
}

async fn restart_after(crash: Crash) {
    let setup = Setup::new(&format!("crash-{crash:?}"));
    let events = setup.feed.fill(0, 12, 4);
    let cursors = setup.watching();
    match crash {
        Crash::SaveFails => cursors.state.lock().unwrap().fail_at = Some(2),
        Crash::Dropped => cursors.state.lock().unwrap().hang_at = Some(2),
    }
    let producer = setup.producer(&[]);
    let mut first = setup.start(&cursors, producer.clone(), setup.config(4), vec![0]);
    match crash {
        Crash::SaveFails => {
            let error = first
                .join()
                .await
                .expect_err("the failed save stops the export");
            assert!(error.to_string().contains("injected"), "{error}");
        }
        Crash::Dropped => {
            tokio::time::timeout(LIMIT, cursors.hung.notified())
                .await
                .expect("the second save starts");
            first.handle.abort();
            let _ = first.handle.await;
        }
    }
    // The first page is saved, the second produced but not saved.
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([(0, Cursor::from_ulid(events[3].ulid))])
    );
    let unsaved: BTreeSet<Ulid> = events[4..8].iter().map(|e| e.ulid).collect();

    {
        let mut state = cursors.state.lock().unwrap();
        state.fail_at = None;
        state.hang_at = None;
    }
    let second = setup.start(&cursors, producer, setup.config(4), vec![0]);
    // The restart exports pages two and three: eight events.
    let report = second.finish_after(8).await.expect("the restarted export");
    assert_eq!(
        report.exported, 8,
        "the restart resumes from the saved cursor"
    );
    assert_eq!(report.saved, vec![(0, Cursor::from_ulid(events[11].ulid))]);

    let received = setup.received().await;
    assert_exported(&received, &events);
    let twice = duplicates(&received);
    assert_eq!(
        twice.keys().copied().collect::<BTreeSet<_>>(),
        unsaved,
        "exactly the unsaved page came twice"
    );
    assert!(twice.values().all(|count| *count == 2), "{twice:?}");
    // A duplicate is the same message: same key, value and headers.
    for ulid in &unsaved {
        let copies: Vec<_> = received.iter().filter(|m| m.ulid == *ulid).collect();
        assert_eq!(copies[0].key, copies[1].key);
        assert_eq!(copies[0].value, copies[1].value);
        assert_eq!(
            (copies[0].shard, &copies[0].feed),
            (copies[1].shard, &copies[1].feed)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_save_produces_the_page_again_on_restart_and_skips_nothing() {
    restart_after(Crash::SaveFails).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_after_produce_produces_the_page_again_on_restart() {
    restart_after(Crash::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retriable_failures_recover_without_gaps() {
    let setup = Setup::new("retriable");
    let events = setup.fill_shards_0_and_1(20, 6);
    let cursors = setup.watching();
    // Produce requests fail at first (librdkafka retries those itself)...
    setup.answer_produce_requests(&[RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 4]);
    // ...and with the broker down, deliveries time out after 1 s: the exporter's retries.
    setup.cluster.broker_down(1).expect("the broker goes down");
    let producer = setup.producer(&[("message.timeout.ms", "1000")]);
    let running = setup.start(&cursors, producer, setup.config(5), vec![0, 1]);
    let progress = running.progress.clone();
    until("a retry", || progress.snapshot().retried > 0).await;
    assert!(cursors.log().is_empty(), "nothing saved while failing");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    setup.cluster.broker_up(1).expect("the broker comes back");
    running.finish_after(40).await.expect("the export recovers");

    let received = setup.received().await;
    assert_exported(&received, &events);
    assert_saved_only_after_ack(&cursors.log(), &events);
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([
            (0, Cursor::from_ulid(events[19].ulid)),
            (1, Cursor::from_ulid(events[39].ulid)),
        ])
    );
    assert!(
        progress.snapshot().retried >= 5,
        "{:?}",
        progress.snapshot()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_large_event_stops_the_export_naming_it() {
    let setup = Setup::new("too-large");
    let mut events = setup.feed.fill(0, 4, 4);
    events.push(setup.feed.push(0, 99, 5000, false));
    events.extend(setup.feed.fill(0, 4, 4));
    let cursors = setup.watching();
    let producer = setup.producer(&[("message.max.bytes", "1000")]);
    let mut running = setup.start(&cursors, producer, setup.config(3), vec![0]);
    let error = running.join().await.expect_err("the export stops");
    let big = events[4].ulid;
    assert!(matches!(error, Error::Kafka { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&big.to_string()),
        "names the event: {message}"
    );
    assert!(message.contains("shard 0"), "names the shard: {message}");
    // Page one (events 0-2) saved; page two (3-5), holding the large event, not.
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([(0, Cursor::from_ulid(events[2].ulid))])
    );
    let received = setup.received().await;
    assert!(received.iter().all(|m| m.ulid != big));
    assert!(
        received.iter().all(|m| m.ulid <= events[3].ulid),
        "nothing after the page"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_produced_again_event_by_event_and_exports_everything() {
    let setup = Setup::new("refused-request");
    // One key: one partition, so a page is one produce request.
    let events = setup.feed.fill(0, 6, 1);
    let cursors = setup.watching();
    // The broker refuses the page's request as a whole once; each event alone is accepted.
    setup.answer_produce_requests(&[RD_KAFKA_RESP_ERR_INVALID_MSG]);
    let producer = setup.producer(&[("linger.ms", "200")]);
    let running = setup.start(&cursors, producer, setup.config(6), vec![0]);
    running
        .finish_after(6)
        .await
        .expect("no event of the refused request is poison");

    let received = setup.received().await;
    assert_exported(&received, &events);
    assert_eq!(
        cursors.saved(),
        BTreeMap::from([(0, Cursor::from_ulid(events[5].ulid))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_stops_the_export_naming_the_event_refused_alone() {
    let setup = Setup::new("refused-alone");
    let events = setup.feed.fill(0, 6, 1);
    let cursors = setup.watching();
    // What a broker with a size limit answers when event 3 is over it: the page's request
    // refused, then events 0 to 2 alone accepted, event 3 alone refused.
    setup.answer_produce_requests(&[
        RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        RD_KAFKA_RESP_ERR_NO_ERROR,
        RD_KAFKA_RESP_ERR_NO_ERROR,
        RD_KAFKA_RESP_ERR_NO_ERROR,
        RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
    ]);
    let producer = setup.producer(&[("linger.ms", "200")]);
    let mut running = setup.start(&cursors, producer, setup.config(6), vec![0]);
    let error = running.join().await.expect_err("the export stops");
    let message = error.to_string();
    assert!(
        message.contains(&events[3].ulid.to_string()),
        "names the event refused alone: {message}"
    );
    assert!(
        !message.contains(&events[0].ulid.to_string()),
        "never the first event of the refused request: {message}"
    );
    assert!(cursors.saved().is_empty(), "the page is not saved");
    let received: Vec<Ulid> = setup.received().await.iter().map(|m| m.ulid).collect();
    assert_eq!(
        received,
        events[..3].iter().map(|e| e.ulid).collect::<Vec<_>>()
    );
}

/// A topic refusing the records' timestamps refuses this host's clock: the export stops
/// saying so, and never names an event as the one at fault (nor advises skipping it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_timestamp_stops_the_export_naming_the_clock_not_an_event() {
    let setup = Setup::new("refused-timestamp");
    setup.feed.fill(0, 6, 1);
    let cursors = setup.watching();
    setup.answer_produce_requests(&[RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP; 20]);
    let producer = setup.producer(&[("linger.ms", "200")]);
    let mut running = setup.start(&cursors, producer, setup.config(6), vec![0]);
    let error = running.join().await.expect_err("the export stops");
    let message = error.to_string();
    assert!(message.contains("clock"), "{message}");
    assert!(
        message.contains("message.timestamp.after.max.ms"),
        "{message}"
    );
    assert!(!message.contains("skip the event"), "{message}");
    assert!(cursors.saved().is_empty(), "the page is not saved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_page_in_flight_and_saves_it() {
    let setup = Setup::new("shutdown");
    let events = setup.feed.fill(0, 12, 8);
    let cursors = setup.watching();
    let mut running = setup.start_with_broker_down(&cursors);
    // The first page in flight, the second read ahead.
    until_read(&setup.feed, 2).await;
    running.ask_shutdown();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !running.handle.is_finished(),
        "it waits for the page in flight"
    );
    assert!(cursors.log().is_empty());

    setup.cluster.broker_up(1).expect("the broker comes back");
    let report = running.join().await.expect("a clean stop");
    let first_page = Cursor::from_ulid(events[3].ulid);
    assert_eq!(report.saved, vec![(0, first_page)]);
    assert_eq!(report.exported, 4);
    assert_eq!(
        setup.feed.reads.load(Ordering::SeqCst),
        2,
        "no page read after shutdown"
    );
    // Its last page was full and its events are an hour old: an hour behind.
    let behind = running.progress.snapshot().behind.expect("behind");
    assert!(behind >= Duration::from_secs(3500), "{behind:?}");
    assert_holds_only(
        &setup.received().await,
        &events[..4],
        "the page in flight was produced, the page read ahead was not",
    );
    assert_saved_only_after_ack(&cursors.log(), &events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_is_read_after_shutdown_not_even_ahead() {
    let setup = Setup::new("shutdown-no-read");
    // Fewer events than a page: the shard is caught up, and its read-ahead polls the feed
    // (every 5 to 20 ms) while the page in flight waits for the broker.
    let events = setup.feed.fill(0, 3, 3);
    let cursors = FakeCursors::default();
    let mut running = setup.start_with_broker_down(&cursors);
    until_read(&setup.feed, 3).await;
    running.ask_shutdown();
    // A read already under way when shutdown was asked may still be counted.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reads_at_shutdown = setup.feed.reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        setup.feed.reads.load(Ordering::SeqCst),
        reads_at_shutdown,
        "no page read after shutdown"
    );
    setup.cluster.broker_up(1).expect("the broker comes back");
    let report = running.join().await.expect("a clean stop");
    assert_eq!(report.saved, vec![(0, Cursor::from_ulid(events[2].ulid))]);
    assert_eq!(setup.feed.reads.load(Ordering::SeqCst), reads_at_shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_up_a_page_that_cannot_be_acknowledged() {
    let setup = Setup::new("shutdown-grace");
    setup.feed.fill(0, 8, 8);
    let cursors = FakeCursors::default();
    setup.cluster.broker_down(1).expect("the broker goes down");
    let producer = setup.producer(&[("message.timeout.ms", "300")]);
    let config = setup.config(4).shutdown_grace(Duration::from_millis(800));
    let mut running = setup.start(&cursors, producer, config, vec![0]);
    until("a retry", || running.progress.snapshot().retried > 0).await;
    let asked = Instant::now();
    let report = running.stop().await.expect("a clean stop");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        report,
        ExportReport::default(),
        "nothing saved, nothing exported"
    );
    assert!(cursors.log().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_waiting_to_retry_does_not_hold_up_the_other_shards_saves() {
    let setup = Setup::new("save-retry");
    let events = setup.fill_shards_0_and_1(10, 2);
    let cursors = setup.watching();
    // The very first save fails as a lost connection would, and waits 2 s to try again.
    cursors.state.lock().unwrap().transient_at = Some(1);
    let producer = setup.producer(&[]);
    let config = setup
        .config(1)
        .backoff_min(Duration::from_secs(2))
        .backoff_max(Duration::from_secs(4));
    let running = setup.start(&cursors, producer, config, vec![0, 1]);
    running.finish_after(20).await.expect("the export");

    let log = cursors.log();
    // The shard whose save failed saved nothing before its retry; the other shard saved
    // its pages meanwhile.
    let waited = cursors.state.lock().unwrap().transient_failures[0];
    let other = 1 - waited;
    let retried = log.iter().position(|save| save.shard == waited).unwrap();
    let saved_meanwhile = log[..retried]
        .iter()
        .filter(|save| save.shard == other)
        .count();
    assert!(
        saved_meanwhile > 0,
        "shard {other} saved nothing while shard {waited} waited to retry: {log:?}"
    );
    assert_saved_only_after_ack(&log, &events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_save_that_hangs_is_given_up_after_the_shutdown_grace() {
    let setup = Setup::new("save-hangs");
    let events = setup.feed.fill(0, 4, 2);
    let cursors = setup.watching();
    // The database stops answering during the first save.
    cursors.state.lock().unwrap().hang_at = Some(1);
    let producer = setup.producer(&[]);
    let config = setup.config(4).shutdown_grace(Duration::from_millis(500));
    let mut running = setup.start(&cursors, producer, config, vec![0]);
    tokio::time::timeout(LIMIT, cursors.hung.notified())
        .await
        .expect("the save starts");
    let report = running.stop().await.expect("shutdown ends the export");
    assert!(report.saved.is_empty(), "{report:?}");
    assert!(cursors.saved().is_empty());
    assert_eq!(
        setup.received().await.len(),
        events.len(),
        "the page was produced; the next run produces it again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_error_stops_the_export_with_it() {
    let setup = Setup::new("read-error");
    setup.feed.fill(0, 3, 3);
    setup.feed.fail_reads(1, "injected: read_feed refused");
    let cursors = FakeCursors::default();
    let producer = setup.producer(&[]);
    let mut running = setup.start(&cursors, producer, setup.config(4), vec![0, 1]);
    let error = running
        .join()
        .await
        .expect_err("the read error stops the export");
    assert!(
        matches!(&error, Error::Config(m) if m.contains("injected")),
        "{error:?}"
    );
    assert!(!cursors.saved().contains_key(&1));
}

#[tokio::test]
async fn bad_arguments_are_refused_before_anything_runs() {
    let feed = FakeFeed::default();
    let cursors = FakeCursors::default();
    // No broker is needed: nothing is produced.
    let producer = mock::producer("127.0.0.1:1", &[]);
    for (shards, consumer, expected) in [
        (vec![], "c", "no shard"),
        (vec![0, 0], "c", "twice"),
        (vec![0], " c", "consumer"),
    ] {
        let config = ExportConfig::new("t", consumer).page_size(4);
        let exporter = exporter(&feed, &cursors, producer.clone(), config);
        let error = exporter
            .run(shards, Cursor::START, std::future::pending())
            .await
            .expect_err(expected);
        assert!(matches!(error, Error::Config(_)), "{error:?}");
        assert!(error.to_string().contains(expected), "{error}");
    }
    assert_eq!(feed.reads.load(Ordering::SeqCst), 0);
}
