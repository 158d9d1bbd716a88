//! The Kafka relay's throughput next to a bare producer's, in one run, without SQL Server
//! or Kafka: the relay (an in-memory claim store and `KafkaPublisher`) and a plain
//! `FutureProducer` each send the same messages (same payload sizes, keys and headers)
//! into librdkafka's mock cluster, in alternating rounds; it prints the median messages
//! per second of each and their ratio (the relay's overhead: claim, build the records,
//! await the delivery reports batch by batch, acknowledge). Two diagnostics split that
//! overhead: the bare producer sending batch by batch (awaiting each batch's reports, the
//! relay's rhythm without the relay), and the in-memory store alone (claim and
//! `mark_done` with no publishing). Every producer is warmed up (connected, its
//! idempotent producer id acquired) before its clock starts.
//!
//! ```sh
//! cargo run --release --features kafka --example bench_kafka
//! cargo run --release --features kafka --example bench_kafka -- --messages 100000 --batch-size 2000
//! cargo run --release --features kafka --example bench_kafka -- --help
//! ```
//!
//! Timing is printed, never asserted.

#[path = "support/memory_store.rs"]
mod memory_store;

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::error::KafkaError;
use changefeed::kafka::rdkafka::message::{Header, OwnedHeaders};
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use changefeed::kafka::rdkafka::types::RDKafkaErrorCode;
use changefeed::kafka::{KafkaPublisher, KafkaPublisherConfig, ProducerSettings};
use changefeed::outbox::{ClaimStore, NewMessage};
use changefeed::relay::{Relay, RelayConfig};
use memory_store::MemoryStore;

const HELP: &str = "\
bench_kafka: the relay (in-memory store + KafkaPublisher) against a bare FutureProducer,
both into librdkafka's mock cluster, in alternating rounds.

Options:
  --messages N       messages per round (default 50000)
  --batch-size N     the relay's claim batch size, 1..=10000 (default 1000)
  --rounds N         rounds of each, alternating (default 5)
  --payload-bytes N  bytes of filler in each JSON payload (default 200)
  --aggregates N     distinct aggregates (keys) the messages spread over (default 5000)
  -X key=value       a librdkafka setting for both producers (repeatable)
  -h, --help         this text
";

struct Args {
    messages: usize,
    batch_size: u32,
    rounds: usize,
    payload_bytes: usize,
    aggregates: usize,
    settings: Vec<(String, String)>,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        messages: 50_000,
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
            "--messages" => args.messages = number(&value)?,
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

/// The relay's round: every message enqueued (untimed), then the relay runs until the
/// store is drained.
async fn relay_round(args: &Args, bootstrap: &str, topic: &str) -> Result<f64, String> {
    let store = MemoryStore::new();
    for message in messages(args, topic) {
        store.enqueue(message);
    }
    let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(settings(args, bootstrap)))
        .map_err(|e| e.to_string())?;
    let config = RelayConfig::default()
        .batch_size(args.batch_size)
        .poll_interval(Duration::from_millis(1));
    warm_up(publisher.producer(), topic).await?;
    // `run` consumes the relay, so the publisher's producer would be torn down (its
    // polling thread joined, up to 100 ms, and librdkafka destroyed) inside the timed
    // span; the bare producer is dropped after its clock stops. This handle keeps the
    // producer alive until after the clock, so neither side times its teardown.
    let producer = publisher.producer().clone();
    let relay = Relay::new(store.clone(), publisher, config).map_err(|e| e.to_string())?;
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
    let done = store.count(memory_store::Status::Done);
    if done != args.messages {
        return Err(format!("the relay published {done} of {}", args.messages));
    }
    Ok(args.messages as f64 / elapsed.as_secs_f64())
}

/// The in-memory store alone: claim and acknowledge every message, batch by batch, with
/// no publishing (a diagnostic: the store's share of the relay's time).
async fn store_round(args: &Args, topic: &str) -> Result<f64, String> {
    let mut store = MemoryStore::new();
    for message in messages(args, topic) {
        store.enqueue(message);
    }
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
    let producer: FutureProducer = settings(args, bootstrap)
        .set("message.timeout.ms", "25000")
        .create()
        .map_err(|e| e.to_string())?;
    warm_up(&producer, topic).await?;
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
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
        let mut record = FutureRecord::<str, [u8]>::to(topic)
            .key(key)
            .payload(payload.as_slice())
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push_back(delivery);
                    break;
                }
                // A full local queue: wait for the oldest delivery, then try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    match pending.pop_front() {
                        Some(delivery) => check(delivery.await)?,
                        None => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                Err((error, _)) => return Err(error.to_string()),
            }
        }
    }
    for delivery in pending {
        check(delivery.await)?;
    }
    Ok(args.messages as f64 / started.elapsed().as_secs_f64())
}

/// Connects the producer, learns the topic's partitions and gets the idempotent
/// producer's id (one record to a topic of its own) before the clock starts, so neither
/// side's figure includes the set-up (about half a second on the mock cluster).
async fn warm_up(producer: &FutureProducer, topic: &str) -> Result<(), String> {
    producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| format!("the mock cluster did not answer: {e}"))?;
    let record = FutureRecord::<str, str>::to("warm-up").payload("warm-up");
    let delivery = producer
        .send_result(record)
        .map_err(|(e, _)| format!("the warm-up record was refused: {e}"))?;
    check(delivery.await)
}

fn check<E: std::fmt::Debug>(
    report: Result<changefeed::kafka::rdkafka::producer::future_producer::OwnedDeliveryResult, E>,
) -> Result<(), String> {
    match report {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(format!("a raw delivery failed: {error}")),
        Err(e) => Err(format!("a raw delivery was cancelled: {e:?}")),
    }
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
        "{} messages per round, batch size {}, {} rounds, {}-byte filler, {} keys, 3 mock brokers",
        args.messages, args.batch_size, args.rounds, args.payload_bytes, args.aggregates
    );
    let (mut relay, mut raw, mut batched) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Fresh topics each round, so no round writes behind another's data; the order
        // alternates, so neither side always runs on a warmer cluster.
        let relay_topic = format!("relay-{round}");
        let raw_topic = format!("raw-{round}");
        let batched_topic = format!("raw-batched-{round}");
        for topic in [&relay_topic, &raw_topic, &batched_topic] {
            if let Err(error) = cluster.create_topic(topic, 6, 1) {
                eprintln!("error: creating mock topic {topic}: {error}");
                return ExitCode::FAILURE;
            }
        }
        let batch = Some(args.batch_size as usize);
        let (a, b, c) = if round % 2 == 0 {
            let a = relay_round(&args, &bootstrap, &relay_topic).await;
            let b = raw_round(&args, &bootstrap, &raw_topic, None).await;
            (
                a,
                b,
                raw_round(&args, &bootstrap, &batched_topic, batch).await,
            )
        } else {
            let c = raw_round(&args, &bootstrap, &batched_topic, batch).await;
            let b = raw_round(&args, &bootstrap, &raw_topic, None).await;
            (relay_round(&args, &bootstrap, &relay_topic).await, b, c)
        };
        match (a, b, c) {
            (Ok(a), Ok(b), Ok(c)) => {
                println!(
                    "round {}: relay {a:>9.0} msg/s   raw {b:>9.0} msg/s   raw batch by batch \
                     {c:>9.0} msg/s",
                    round + 1
                );
                relay.push(a);
                raw.push(b);
                batched.push(c);
            }
            (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
                eprintln!("error: round {}: {error}", round + 1);
                return ExitCode::FAILURE;
            }
        }
    }
    let (relay, raw, batched) = (median(&mut relay), median(&mut raw), median(&mut batched));
    match store_round(&args, "store-only").await {
        Ok(rate) => println!("the in-memory store alone (claim + mark_done): {rate:.0} msg/s"),
        Err(error) => eprintln!("error: the store-only round: {error}"),
    }
    println!(
        "median: relay {relay:.0} msg/s, raw FutureProducer {raw:.0} msg/s, raw batch by \
         batch {batched:.0} msg/s"
    );
    println!("ratio relay/raw: {:.2} (goal >= 0.80)", relay / raw);
    println!(
        "ratio relay/raw batch by batch: {:.2} (what the relay adds to the batch round trip)",
        relay / batched
    );
    ExitCode::SUCCESS
}
