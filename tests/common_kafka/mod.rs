//! Mock-cluster helpers for the Kafka tests: librdkafka's in-process broker
//! ([`MockCluster`]), its topics, and a consumer that reads a topic back from the beginning.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use changefeed::kafka::rdkafka::message::{Headers, Message};
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::DefaultProducerContext;
use changefeed::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

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
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "changefeed-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("a consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .expect("the topic's metadata");
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions as i32 {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("a partition");
    }
    consumer.assign(&assignment).expect("assign");

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
            let message = message.expect("a consumed record");
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
            records.push(Consumed {
                partition: message.partition(),
                offset: message.offset(),
                key: message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                headers,
                value: message.payload().map(<[u8]>::to_vec),
            });
            if records.len() >= expected && linger_until.is_none() {
                linger_until = Some(Instant::now() + linger);
            }
        }
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
