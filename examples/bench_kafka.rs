//! The Kafka relay's and the feed exporter's throughput, each next to a bare producer's
//! sending the same messages, in one run, without SQL Server or Kafka, into librdkafka's
//! mock cluster, in alternating rounds; it prints the median messages per second of each
//! and their ratios.
//!
//! * **relay**: the relay (`KafkaPublisher` over a claim store of messages built beforehand,
//!   support/prebuilt_store.rs, whose claim hands them over without copying) against a
//!   plain `FutureProducer` sending the same messages (same payload sizes, keys and
//!   headers); the ratio is the relay's overhead (claim, build the records, await the
//!   delivery reports batch by batch, acknowledge). Three diagnostics split it: the bare
//!   producer sending batch by batch (awaiting each batch's reports, the relay's rhythm
//!   without the relay), the store alone (claim and `mark_done` with no publishing), and
//!   `KafkaPublisher` alone publishing pre-claimed batches one at a time (no relay, no
//!   store).
//! * **exporter**: `FeedExporter` over the pages of a feed of several shards, built
//!   beforehand (support/prebuilt_feed.rs, whose read hands each page over without
//!   copying; the cursors are the exporter tests' fake, `support/memory_feed.rs`), run until
//!   every shard's last cursor is saved, against a plain `FutureProducer` sending the same
//!   records (the same key, the event serialized to the same JSON inside the timed loop,
//!   the same `ulid`, `shard` and `feed` headers). The ratio is the exporter's overhead
//!   (page streaming, building the messages, awaiting each page's reports, saving cursors).
//!
//! Both sides start from their messages (or events) built in memory, untimed, and drop each
//! inside the clock once it is sent: the relay and the exporter once a batch or page is
//! acknowledged, the bare producer once a record is handed to librdkafka.
//!
//! * **latency**: the same relay and bare producer against a mock cluster whose every request
//!   takes [`BROKER_ROUND_TRIP`] (20 ms) to answer, the relay's store taking
//!   [`STORE_CALL`] (2 ms) per claim and per acknowledgement, as a database across a
//!   network does: the relay at `max_in_flight` 1, 2, 4 and 8 against the bare producer
//!   under the same broker latency. One batch at a time leaves the producer idle for the
//!   whole round trip of every batch; batches in flight overlap those round trips.
//!
//! Every producer is warmed up (connected, its idempotent producer id acquired) before its
//! clock starts, and dropped only after it stops.
//!
//! ```sh
//! cargo run --release --features kafka --example bench_kafka
//! cargo run --release --features kafka --example bench_kafka -- --messages 100000 --batch-size 2000
//! cargo run --release --features kafka --example bench_kafka -- --figure exporter --shards 8
//! cargo run --release --features kafka --example bench_kafka -- --quick   # seconds
//! cargo run --release --features kafka --example bench_kafka -- --help
//! ```
//!
//! Timing is printed, never asserted.

#[path = "support/figures.rs"]
mod figures;
#[path = "support/kafka_bench.rs"]
mod kafka_bench;
#[path = "support/memory_feed.rs"]
mod memory_feed;
#[path = "support/prebuilt_feed.rs"]
mod prebuilt_feed;
#[path = "support/prebuilt_store.rs"]
mod prebuilt_store;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::message::{Header, OwnedHeaders};
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::FutureRecord;
use changefeed::kafka::{
    ExportConfig, FeedExporter, KafkaPublisher, KafkaPublisherConfig, ProducerSettings,
    export_headers,
};
use changefeed::outbox::{ClaimStore, ClaimToken, Claimed, Failed, NewMessage};
use changefeed::relay::{Publisher, Relay, RelayConfig};
use changefeed::{Cursor, Feed, Result};
use kafka_bench::{check, send, warm_up};
use memory_feed::{FakeCursors, FakeFeed, KEY_COLUMNS};
use prebuilt_feed::PrebuiltPages;
use prebuilt_store::PrebuiltStore;

const HELP: &str = "\
bench_kafka: the relay (pre-built store + KafkaPublisher) and the feed exporter
(FeedExporter over pre-built pages), each against a bare FutureProducer sending the
same messages, all into librdkafka's mock cluster, in alternating rounds.

Options:
  --quick            a smoke run of seconds: 20000 messages, 3 rounds, the relay and
                     exporter figures (options after it still apply)
  --figure F         relay, exporter, latency, throughput (relay and exporter) or
                     all (default all)
  --messages N       messages per round (default 50000)
  --batch-size N     the relay's claim batch size and the exporter's page size,
                     1..=10000 (default 1000)
  --shards N         shards of the exporter's feed; the messages spread over them
                     (default 4)
  --rounds N         rounds of each, alternating (default 5)
  --payload-bytes N  bytes of filler in each JSON payload (default 200)
  --aggregates N     distinct aggregates (keys) the messages spread over (default 5000);
                     the exporter's keys are (shard, order id) with N order ids
  -X key=value       a librdkafka setting for both producers (repeatable)
  -h, --help         this text
";

/// Which figures to measure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Figure {
    Relay,
    Exporter,
    Latency,
    /// The relay's and the exporter's.
    Throughput,
    All,
}

impl Figure {
    fn relay(self) -> bool {
        matches!(self, Figure::Relay | Figure::Throughput | Figure::All)
    }

    fn exporter(self) -> bool {
        matches!(self, Figure::Exporter | Figure::Throughput | Figure::All)
    }

    fn latency(self) -> bool {
        matches!(self, Figure::Latency | Figure::All)
    }
}

/// The latency figure's broker request round trip.
const BROKER_ROUND_TRIP: Duration = Duration::from_millis(20);
/// The latency figure's store call (claim, or one acknowledgement).
const STORE_CALL: Duration = Duration::from_millis(2);
/// The latency figure's `max_in_flight` values.
const IN_FLIGHT: [u32; 4] = [1, 2, 4, 8];
/// The relay figure's `max_in_flight`: the relay's default.
const DEFAULT_IN_FLIGHT: u32 = RelayConfig::DEFAULT_MAX_IN_FLIGHT;

struct Args {
    figure: Figure,
    messages: usize,
    shards: usize,
    batch_size: u32,
    rounds: usize,
    payload_bytes: usize,
    aggregates: usize,
    settings: Vec<(String, String)>,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        figure: Figure::All,
        messages: 50_000,
        shards: 4,
        batch_size: 1000,
        rounds: 5,
        payload_bytes: 200,
        aggregates: 5000,
        settings: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag == "--quick" {
            args.messages = 20_000;
            args.rounds = 3;
            args.figure = Figure::Throughput;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value (see --help)"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} takes a positive integer, not {v:?}"))
        };
        match flag.as_str() {
            "--figure" => {
                args.figure = match value.as_str() {
                    "relay" => Figure::Relay,
                    "exporter" => Figure::Exporter,
                    "latency" => Figure::Latency,
                    "throughput" => Figure::Throughput,
                    "all" => Figure::All,
                    other => {
                        return Err(format!(
                            "--figure takes relay, exporter, latency, throughput or all, \
                             not {other:?}"
                        ));
                    }
                }
            }
            "--messages" => args.messages = number(&value)?,
            "--shards" => args.shards = number(&value)?,
            "--batch-size" => {
                args.batch_size = u32::try_from(number(&value)?)
                    .map_err(|_| format!("--batch-size {value} is out of range"))?
            }
            "--rounds" => args.rounds = number(&value)?,
            "--payload-bytes" => args.payload_bytes = number(&value)?,
            "--aggregates" => args.aggregates = number(&value)?,
            "-X" => {
                let (key, value) = value
                    .split_once('=')
                    .ok_or_else(|| format!("-X takes key=value, not {value:?}"))?;
                args.settings.push((key.to_owned(), value.to_owned()));
            }
            other => return Err(format!("unknown option {other} (see --help)")),
        }
    }
    if args.batch_size > changefeed::reader::MAX_PAGE_SIZE {
        return Err(format!(
            "--batch-size {} is above {}, the largest page the exporter reads",
            args.batch_size,
            changefeed::reader::MAX_PAGE_SIZE
        ));
    }
    Ok(Some(args))
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The messages of one round, as the outbox holds them.
fn messages(args: &Args, topic: &str) -> Vec<NewMessage> {
    let filler = "x".repeat(args.payload_bytes);
    (0..args.messages)
        .map(|i| {
            let mut m = NewMessage::new(topic, serde_json::json!({ "seq": i, "data": filler }))
                .aggregate("order", format!("order-{}", i % args.aggregates));
            m.headers
                .insert("content-type".into(), "application/json".into());
            m.message_id = Some(format!("m-{i}"));
            m.trace_id = Some(TRACEPARENT.to_owned());
            m
        })
        .collect()
}

/// The same producer settings for both sides: KafkaPublisher's `linger.ms` default (so
/// the bare producer does not pay librdkafka's 5 ms where the relay does not), then the
/// `-X` settings.
fn settings(args: &Args, bootstrap: &str) -> ProducerSettings {
    let linger = KafkaPublisher::DEFAULT_LINGER.as_millis().to_string();
    args.settings.iter().fold(
        ProducerSettings::new(bootstrap).set("linger.ms", linger),
        |settings, (key, value)| settings.set(key, value),
    )
}

/// A claim store whose every call takes `delay` more, as a database across a network.
struct SlowStore {
    store: PrebuiltStore,
    delay: Duration,
}

impl ClaimStore for SlowStore {
    async fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> changefeed::Result<Vec<Claimed>> {
        tokio::time::sleep(self.delay).await;
        self.store.claim(batch_size, claim_timeout).await
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> changefeed::Result<u64> {
        tokio::time::sleep(self.delay).await;
        self.store.mark_done(ids, token).await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> changefeed::Result<u64> {
        tokio::time::sleep(self.delay).await;
        self.store.mark_failed(failed).await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        tokio::time::sleep(self.delay).await;
        self.store.requeue(id, token, after).await
    }
}

/// The relay's round: every message enqueued (untimed), then the relay (`max_in_flight`
/// batches in flight, every store call `store_delay` longer) runs until the store is
/// drained.
async fn relay_round(
    args: &Args,
    bootstrap: &str,
    topic: &str,
    max_in_flight: u32,
    store_delay: Duration,
) -> Result<f64, String> {
    let store = PrebuiltStore::new(messages(args, topic));
    let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(settings(args, bootstrap)))
        .map_err(|e| e.to_string())?;
    let config = RelayConfig::default()
        .batch_size(args.batch_size)
        .max_in_flight(max_in_flight)
        .poll_interval(Duration::from_millis(1));
    warm_up(publisher.producer(), topic).await?;
    // `run` consumes the relay, so the publisher's producer would be torn down (its
    // polling thread joined, up to 100 ms, and librdkafka destroyed) inside the timed
    // span; the bare producer is dropped after its clock stops. This handle keeps the
    // producer alive until after the clock, so neither side times its teardown.
    let producer = publisher.producer().clone();
    let slow = SlowStore {
        store: store.clone(),
        delay: store_delay,
    };
    let relay = Relay::new(slow, publisher, config).map_err(|e| e.to_string())?;
    let watched = store.clone();
    let started = Instant::now();
    relay
        .run(async move {
            while !watched.is_drained() {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(producer);
    let done = store.done();
    if done != args.messages || store.unexpected() > 0 {
        return Err(format!(
            "the relay published {done} of {} ({} failed or requeued)",
            args.messages,
            store.unexpected()
        ));
    }
    Ok(args.messages as f64 / elapsed.as_secs_f64())
}

/// `KafkaPublisher` alone: every message claimed beforehand (untimed), then each batch
/// published in turn, one at a time, with no relay and no store (a diagnostic: next to the
/// bare producer sending batch by batch, the publisher's own work per message, building
/// each record and its headers and judging the outcomes).
async fn publisher_round(args: &Args, bootstrap: &str, topic: &str) -> Result<f64, String> {
    let mut store = PrebuiltStore::new(messages(args, topic));
    let mut batches = Vec::new();
    loop {
        let batch = store
            .claim(args.batch_size, Duration::from_secs(300))
            .await
            .map_err(|e| e.to_string())?;
        let Some(first) = batch.first() else { break };
        // Acknowledged at once: an aggregate's next message is claimed only after it.
        let ids: Vec<i64> = batch.iter().map(|c| c.id()).collect();
        store
            .mark_done(&ids, first.claim_token())
            .await
            .map_err(|e| e.to_string())?;
        batches.push(
            batch
                .into_iter()
                .filter_map(|c| match c {
                    Claimed::Message(message) => Some(message),
                    Claimed::Undecodable(_) => None,
                })
                .collect::<Vec<_>>(),
        );
    }
    let claimed: usize = batches.iter().map(Vec::len).sum();
    if claimed != args.messages {
        return Err(format!("{claimed} of {} messages claimed", args.messages));
    }
    let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(settings(args, bootstrap)))
        .map_err(|e| e.to_string())?;
    warm_up(publisher.producer(), topic).await?;
    let started = Instant::now();
    for batch in &batches {
        let outcomes = publisher.publish(batch).await;
        if let Some(Err(error)) = outcomes.iter().find(|o| o.is_err()) {
            return Err(format!("the publisher failed a message: {error:?}"));
        }
    }
    Ok(args.messages as f64 / started.elapsed().as_secs_f64())
}

/// The store alone: claim and acknowledge every message, batch by batch, with
/// no publishing (a diagnostic: the store's share of the relay's time).
async fn store_round(args: &Args, topic: &str) -> Result<f64, String> {
    let mut store = PrebuiltStore::new(messages(args, topic));
    let started = Instant::now();
    loop {
        let batch = store
            .claim(args.batch_size, Duration::from_secs(30))
            .await
            .map_err(|e| e.to_string())?;
        let Some(first) = batch.first() else { break };
        let token = first.claim_token();
        let ids: Vec<i64> = batch.iter().map(|c| c.id()).collect();
        store
            .mark_done(&ids, token)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(args.messages as f64 / started.elapsed().as_secs_f64())
}

/// The bare producer's round: the same records (payload bytes, key, the same headers)
/// sent as fast as librdkafka takes them, every delivery awaited. With `batch`, every
/// `batch` records wait for their deliveries before the next are sent: the relay's rhythm
/// without the relay (a diagnostic: what the batch round trip itself costs).
async fn raw_round(
    args: &Args,
    bootstrap: &str,
    topic: &str,
    batch: Option<usize>,
) -> Result<f64, String> {
    let messages = messages(args, topic);
    let producer = kafka_bench::bare_producer(settings(args, bootstrap), topic).await?;
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(messages.len());
    // Each message is dropped once it is sent, inside the clock, as the relay drops each
    // claimed message once its batch is acknowledged.
    for (i, m) in messages.into_iter().enumerate() {
        if batch.is_some_and(|b| i % b == 0) {
            for delivery in pending.drain(..) {
                check(delivery.await)?;
            }
        }
        let payload = serde_json::to_vec(&m.payload).map_err(|e| e.to_string())?;
        let message_id = m.message_id.as_deref().unwrap_or_default();
        let mut headers = OwnedHeaders::new_with_capacity(4);
        for (key, value) in &m.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_str()),
            });
        }
        let headers = headers
            .insert(Header {
                key: "message-id",
                value: Some(message_id),
            })
            .insert(Header {
                key: "attempts",
                value: Some("0"),
            })
            .insert(Header {
                key: "traceparent",
                value: Some(TRACEPARENT),
            });
        let key = m.aggregate_id.as_deref().unwrap_or_default();
        let record = FutureRecord::<str, [u8]>::to(topic)
            .key(key)
            .payload(payload.as_slice())
            .headers(headers);
        send(&producer, record, &mut pending).await?;
    }
    for delivery in pending {
        check(delivery.await)?;
    }
    Ok(args.messages as f64 / started.elapsed().as_secs_f64())
}

/// The feed the exporter reads.
const FEED: &str = "dbo.Orders";

/// The exporter's events of one round: `messages` live events spread over the shards in
/// turn, keys (shard, order id) with `aggregates` order ids per shard, each row with a
/// `payload_bytes`-character text column.
fn event_feed(args: &Args) -> FakeFeed {
    let feed = FakeFeed::default();
    let shards = args.shards as i32;
    for i in 0..args.messages {
        let shard = i as i32 % shards;
        let order_id = (i / args.shards % args.aggregates) as i64;
        feed.push(shard, order_id, args.payload_bytes, false);
    }
    feed
}

/// The exporter's round: `FeedExporter` over the pre-built pages, from the start of every
/// shard until every shard's last cursor is saved; then checks that the export is whole
/// (every event exported, every shard's cursor at its last event).
async fn exporter_round(args: &Args, bootstrap: &str, topic: &str) -> Result<f64, String> {
    let feed = event_feed(args);
    let last: std::collections::BTreeMap<i32, Cursor> = feed
        .events()
        .iter()
        .map(|event| (event.shard, Cursor::from_ulid(event.ulid)))
        .collect();
    let cursors = FakeCursors::default();
    let producer = settings(args, bootstrap)
        .set("message.timeout.ms", "25000")
        .create()
        .map_err(|e| e.to_string())?;
    warm_up(&producer, topic).await?;
    let page_size = args.batch_size;
    let pages = PrebuiltPages::new(&feed, page_size);
    drop(feed);
    let exporter = FeedExporter::from_parts(
        FEED.parse::<Feed>().map_err(|e| e.to_string())?,
        KEY_COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        move |_shard| pages.clone(),
        cursors.clone(),
        // The exporter owns this clone and drops it when `run` returns, inside the timed
        // span; `producer` keeps librdkafka alive until after the clock, as in the relay's
        // round, so neither side times the producer's teardown.
        producer.clone(),
        ExportConfig::new(topic, "bench").page_size(page_size),
    );
    let progress = exporter.progress();
    let total = args.messages as u64;
    let shards = (0..args.shards as i32).collect();
    let started = Instant::now();
    let report = exporter
        .run(shards, Cursor::START, async move {
            // Every event is counted once its page's cursor is saved: then all are.
            while progress.snapshot().exported < total {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(producer);
    if report.exported != total {
        return Err(format!(
            "the exporter exported {} of {total}",
            report.exported
        ));
    }
    let saved = cursors.saved();
    if saved != last {
        return Err(format!(
            "the exporter saved the cursors {saved:?}, not every shard's last event {last:?}"
        ));
    }
    Ok(args.messages as f64 / elapsed.as_secs_f64())
}

/// The bare producer's side of the exporter's figure: the same events as records with the
/// exporter's key, value (each event's JSON, serialized here, inside the timed loop, as the
/// exporter does) and headers, sent as fast as librdkafka takes them, every delivery
/// awaited.
async fn raw_events_round(args: &Args, bootstrap: &str, topic: &str) -> Result<f64, String> {
    let events = event_feed(args).events();
    let producer = kafka_bench::bare_producer(settings(args, bootstrap), topic).await?;
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(events.len());
    // Each event is dropped once it is sent, inside the clock, as the exporter drops each
    // page once its cursor is saved.
    for event in events {
        let (Some(columns), Some(key)) = (&event.columns, event.key()) else {
            return Err(format!("event {} of the bench feed has no row", event.ulid));
        };
        let value = serde_json::to_vec(columns).map_err(|e| e.to_string())?;
        let shard = event.shard.to_string();
        // The exporter's headers, built as the exporter builds them.
        let headers = export_headers(event.ulid, &shard, FEED);
        let record = FutureRecord::<str, [u8]>::to(topic)
            .key(key.as_str())
            .payload(value.as_slice())
            .headers(headers);
        send(&producer, record, &mut pending).await?;
    }
    for delivery in pending {
        check(delivery.await)?;
    }
    let elapsed = started.elapsed();
    drop(producer);
    Ok(args.messages as f64 / elapsed.as_secs_f64())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let cluster = match MockCluster::new(3) {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("error: librdkafka's mock cluster did not start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let bootstrap = cluster.bootstrap_servers();
    println!(
        "{} messages per round, batch size {}, {} rounds, {}-byte filler, {} keys, {} shards, \
         3 mock brokers",
        args.messages,
        args.batch_size,
        args.rounds,
        args.payload_bytes,
        args.aggregates,
        args.shards
    );
    let mut relay = Figures::default();
    let mut exporter = Figures::default();
    for round in 0..args.rounds {
        // Fresh topics each round, so no round writes behind another's data; the order
        // alternates, so neither side always runs on a warmer cluster.
        let topics: Vec<String> = ["relay", "raw", "raw-batched", "export", "raw-export"]
            .iter()
            .map(|name| format!("{name}-{round}"))
            .collect();
        for topic in &topics {
            if let Err(error) = cluster.create_topic(topic, 6, 1) {
                eprintln!("error: creating mock topic {topic}: {error}");
                return ExitCode::FAILURE;
            }
        }
        let [
            relay_topic,
            raw_topic,
            batched_topic,
            export_topic,
            raw_export_topic,
        ] = &topics[..]
        else {
            unreachable!("five topics")
        };
        let even = round % 2 == 0;
        if args.figure.relay() {
            let batch = Some(args.batch_size as usize);
            let (a, b, c) = if even {
                let a = relay_round(
                    &args,
                    &bootstrap,
                    relay_topic,
                    DEFAULT_IN_FLIGHT,
                    Duration::ZERO,
                )
                .await;
                let b = raw_round(&args, &bootstrap, raw_topic, None).await;
                (
                    a,
                    b,
                    raw_round(&args, &bootstrap, batched_topic, batch).await,
                )
            } else {
                let c = raw_round(&args, &bootstrap, batched_topic, batch).await;
                let b = raw_round(&args, &bootstrap, raw_topic, None).await;
                (
                    relay_round(
                        &args,
                        &bootstrap,
                        relay_topic,
                        DEFAULT_IN_FLIGHT,
                        Duration::ZERO,
                    )
                    .await,
                    b,
                    c,
                )
            };
            match (a, b, c) {
                (Ok(a), Ok(b), Ok(c)) => {
                    println!(
                        "round {}: relay    {a:>9.0} msg/s   raw {b:>9.0} msg/s   raw batch by \
                         batch {c:>9.0} msg/s",
                        round + 1
                    );
                    relay.push(a, b, Some(c));
                }
                (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
                    eprintln!("error: round {} (relay): {error}", round + 1);
                    return ExitCode::FAILURE;
                }
            }
        }
        if args.figure.exporter() {
            let (a, b) = if even {
                let a = exporter_round(&args, &bootstrap, export_topic).await;
                (
                    a,
                    raw_events_round(&args, &bootstrap, raw_export_topic).await,
                )
            } else {
                let b = raw_events_round(&args, &bootstrap, raw_export_topic).await;
                (exporter_round(&args, &bootstrap, export_topic).await, b)
            };
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    println!(
                        "round {}: exporter {a:>9.0} msg/s   raw {b:>9.0} msg/s",
                        round + 1
                    );
                    exporter.push(a, b, None);
                }
                (Err(error), _) | (_, Err(error)) => {
                    eprintln!("error: round {} (exporter): {error}", round + 1);
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if args.figure.relay() {
        match store_round(&args, "store-only").await {
            Ok(rate) => println!("the store alone (claim + mark_done): {rate:.0} msg/s"),
            Err(error) => eprintln!("error: the store-only round: {error}"),
        }
        if let Err(error) = cluster.create_topic("publisher-only", 6, 1) {
            eprintln!("error: creating mock topic publisher-only: {error}");
            return ExitCode::FAILURE;
        }
        match publisher_round(&args, &bootstrap, "publisher-only").await {
            Ok(rate) => {
                println!("KafkaPublisher alone, batch by batch, no relay or store: {rate:.0} msg/s")
            }
            Err(error) => eprintln!("error: the publisher-only round: {error}"),
        }
        let (ours, raw, batched) = relay.medians();
        println!(
            "median: relay {ours:.0} msg/s, raw FutureProducer {raw:.0} msg/s, raw batch by \
             batch {batched:.0} msg/s"
        );
        println!("ratio relay/raw: {:.2} (goal >= 0.95)", ours / raw);
        figures::record(
            "Kafka: relay (pre-built store) -> mock cluster",
            &format!("{ours:.0} msg/s"),
            &format!("{raw:.0} msg/s (bare producer)"),
            stats::ratio(ours, raw),
        );
        println!(
            "ratio relay/raw batch by batch: {:.2} (what the relay adds to the batch round trip)",
            ours / batched
        );
    }
    if args.figure.exporter() {
        let (ours, raw, _) = exporter.medians();
        println!("median: exporter {ours:.0} msg/s, raw FutureProducer {raw:.0} msg/s");
        println!("ratio exporter/raw: {:.2} (goal >= 1.0)", ours / raw);
        figures::record(
            "Kafka: exporter (pre-built pages) -> mock cluster",
            &format!("{ours:.0} msg/s"),
            &format!("{raw:.0} msg/s (bare producer)"),
            stats::ratio(ours, raw),
        );
    }
    if args.figure.latency()
        && let Err(error) = latency_figure(&args).await
    {
        eprintln!("error: the latency figure: {error}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The relay at each of [`IN_FLIGHT`] against the bare producer, on a mock cluster of its
/// own whose brokers answer every request after [`BROKER_ROUND_TRIP`], the store's calls
/// each [`STORE_CALL`] long; rounds alternate the order.
async fn latency_figure(args: &Args) -> Result<(), String> {
    let cluster = MockCluster::new(3).map_err(|e| format!("the mock cluster: {e}"))?;
    for broker in 1..=3 {
        cluster
            .broker_round_trip_time(broker, BROKER_ROUND_TRIP)
            .map_err(|e| format!("setting broker {broker}'s round trip: {e}"))?;
    }
    let bootstrap = cluster.bootstrap_servers();
    println!(
        "latency: broker round trip {BROKER_ROUND_TRIP:?}, store claim and acknowledgement \
         {STORE_CALL:?} each"
    );
    let mut relay: Vec<Vec<f64>> = vec![Vec::new(); IN_FLIGHT.len()];
    let mut raw = Vec::new();
    for round in 0..args.rounds {
        // The bare producer first in even rounds, last in odd ones.
        let raw_topic = format!("latency-raw-{round}");
        cluster
            .create_topic(&raw_topic, 6, 1)
            .map_err(|e| format!("creating mock topic {raw_topic}: {e}"))?;
        let raw_first = round % 2 == 0;
        if raw_first {
            raw.push(raw_round(args, &bootstrap, &raw_topic, None).await?);
        }
        let mut line = format!("round {}:", round + 1);
        for (i, in_flight) in IN_FLIGHT.iter().enumerate() {
            let topic = format!("latency-relay-{in_flight}-{round}");
            cluster
                .create_topic(&topic, 6, 1)
                .map_err(|e| format!("creating mock topic {topic}: {e}"))?;
            let rate = relay_round(args, &bootstrap, &topic, *in_flight, STORE_CALL).await?;
            line.push_str(&format!("   in flight {in_flight}: {rate:>8.0}"));
            relay[i].push(rate);
        }
        if !raw_first {
            raw.push(raw_round(args, &bootstrap, &raw_topic, None).await?);
        }
        println!(
            "{line}   raw {:>8.0} msg/s",
            raw.last().copied().unwrap_or(f64::NAN)
        );
    }
    let raw = median(&mut raw);
    println!("median, raw FutureProducer: {raw:.0} msg/s");
    for (in_flight, rates) in IN_FLIGHT.iter().zip(&mut relay) {
        let rate = median(rates);
        println!(
            "median, relay at max_in_flight {in_flight}: {rate:.0} msg/s, ratio relay/raw {:.2}",
            rate / raw
        );
    }
    Ok(())
}

/// One figure's rates, round by round: ours, the bare producer's, and the batch-by-batch
/// diagnostic's (the relay's only).
#[derive(Default)]
struct Figures {
    ours: Vec<f64>,
    raw: Vec<f64>,
    batched: Vec<f64>,
}

impl Figures {
    fn push(&mut self, ours: f64, raw: f64, batched: Option<f64>) {
        self.ours.push(ours);
        self.raw.push(raw);
        self.batched.extend(batched);
    }

    /// The medians; NaN for a diagnostic never measured.
    fn medians(&mut self) -> (f64, f64, f64) {
        let batched = if self.batched.is_empty() {
            f64::NAN
        } else {
            median(&mut self.batched)
        };
        (median(&mut self.ours), median(&mut self.raw), batched)
    }
}
