//! Mock-cluster helpers for the Kafka tests: librdkafka's in-process broker
//! ([`MockCluster`]), its topics, and a consumer that reads a topic back from the beginning.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use changefeed::kafka::rdkafka::message::{BorrowedMessage, Headers, Message};
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::DefaultProducerContext;
use changefeed::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long a metadata or watermark request may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The producer setting of every test producer that meets failed produce requests: one
/// request in flight to a broker at a time.
///
/// The mock cluster checks an idempotent producer's sequence numbers only when it has a
/// transactional id. With several requests in flight, a request the mock fails lets the
/// next one be written first, and librdkafka then counts the failed request's messages as
/// delivered ("implicitly acked by subsequent batch success") though the mock never wrote
/// them. A real broker refuses that next request with OUT_OF_ORDER_SEQUENCE_NUMBER, so
/// this is the mock's gap, not the client's: seen as an export that "lost" the first
/// messages of a partition (their delivery reports said offset -1001). One request at a
/// time keeps a failed request's messages at the head of their partition's queue, so
/// nothing later is sent before they are written.
pub const ONE_REQUEST_IN_FLIGHT: (&str, &str) = ("max.in.flight.requests.per.connection", "1");

/// A mock cluster of librdkafka's in-process brokers (ids `1..=brokers`).
pub type Cluster = MockCluster<'static, DefaultProducerContext>;

/// Starts a cluster of `brokers` brokers.
pub fn start_cluster(brokers: i32) -> Cluster {
    MockCluster::new(brokers).expect("librdkafka's mock cluster starts")
}

/// Creates `topic` with `partitions` partitions (replication factor 1: the leaders spread
/// over the brokers).
pub fn create_topic(cluster: &Cluster, topic: &str, partitions: i32) {
    cluster
        .create_topic(topic, partitions, 1)
        .unwrap_or_else(|e| panic!("creating mock topic {topic}: {e}"));
}

/// One record read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Consumed {
    /// The partition it landed in.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// The key, as text.
    pub key: Option<String>,
    /// The headers, in order, as text.
    pub headers: Vec<(String, String)>,
    /// The value (`None` for a record without one).
    pub value: Option<Vec<u8>>,
    /// Its timestamp in milliseconds since the Unix epoch: for a record produced without
    /// one, the time the producer was handed it (Kafka's `CreateTime`).
    pub timestamp_ms: Option<i64>,
}

impl Consumed {
    /// The last header named `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().expect("a value")).expect("JSON value")
    }
}

/// A consumer of `bootstrap` that commits nothing (records are read by assignment).
fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "changefeed-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("a consumer")
}

/// The partitions of `topic` (none when it does not exist yet).
fn partitions(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let metadata = consumer
        .fetch_metadata(Some(topic), CLIENT_TIMEOUT)
        .expect("the topic's metadata");
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect()
}

/// Assigns `partitions` of `topic` from their beginning.
fn assign_from_start(consumer: &BaseConsumer, topic: &str, partitions: impl Iterator<Item = i32>) {
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("a partition");
    }
    consumer.assign(&assignment).expect("assign");
}

/// A consumed record, its key and header values as text.
fn record(message: &BorrowedMessage<'_>) -> Consumed {
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| {
                    let value = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                    (h.key.to_owned(), value.unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default();
    Consumed {
        partition: message.partition(),
        offset: message.offset(),
        key: message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        headers,
        value: message.payload().map(<[u8]>::to_vec),
        timestamp_ms: message.timestamp().to_millis(),
    }
}

/// Reads `topic` from the beginning of every partition until `expected` records have come
/// or `timeout` has passed, then for `linger` more, so records beyond `expected` (a
/// duplicate) are read too. Records come grouped by partition, in offset order within it.
/// Blocks its thread: call it once the producing is over.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
    linger: Duration,
) -> Vec<Consumed> {
    let consumer = consumer(bootstrap);
    assign_from_start(&consumer, topic, partitions(&consumer, topic).into_iter());

    let mut records = Vec::new();
    let deadline = Instant::now() + timeout;
    // Nothing expected: only the linger, to see that nothing comes.
    let mut linger_until = (expected == 0).then(|| Instant::now() + linger);
    loop {
        let now = Instant::now();
        if linger_until.is_some_and(|until| now >= until) || now >= deadline {
            break;
        }
        if let Some(message) = consumer.poll(Duration::from_millis(50)) {
            records.push(record(&message.expect("a consumed record")));
            if records.len() >= expected && linger_until.is_none() {
                linger_until = Some(Instant::now() + linger);
            }
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}

/// The high watermark of every partition of `topic`: how many records it holds (the mock
/// cluster appends a record when it acknowledges it).
fn watermarks(consumer: &BaseConsumer, topic: &str) -> BTreeMap<i32, i64> {
    partitions(consumer, topic)
        .into_iter()
        .map(|partition| {
            let (_low, high) = consumer
                .fetch_watermarks(topic, partition, CLIENT_TIMEOUT)
                .expect("the partition's watermarks");
            (partition, high)
        })
        .collect()
}

/// How many records `topic` holds now. Blocks its thread.
pub fn topic_total(bootstrap: &str, topic: &str) -> i64 {
    watermarks(&consumer(bootstrap), topic).values().sum()
}

/// Every record `topic` holds now (up to each partition's high watermark), partition by
/// partition in offset order. Blocks its thread; panics after a minute.
pub fn consume_all(bootstrap: &str, topic: &str) -> Vec<Consumed> {
    let consumer = consumer(bootstrap);
    let mut remaining: BTreeMap<i32, i64> = watermarks(&consumer, topic)
        .into_iter()
        .filter(|(_, high)| *high > 0)
        .collect();
    let mut records = Vec::new();
    if remaining.is_empty() {
        return records;
    }
    assign_from_start(&consumer, topic, remaining.keys().copied());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !remaining.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{topic}: still waiting for {remaining:?}"
        );
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let record = record(&message.expect("a consumed record"));
        if record.offset + 1 >= remaining[&record.partition] {
            remaining.remove(&record.partition);
        }
        records.push(record);
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}

/// How many records carry each `message-id`.
pub fn count_by_message_id(records: &[Consumed]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        let id = record.header("message-id").unwrap_or("<none>").to_owned();
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}
