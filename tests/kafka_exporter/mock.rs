//! The mock Kafka cluster and the Kafka clients of the exporter tests (`kafka_exporter`, and
//! `live_export` through `#[path]`): a cluster with one topic, an idempotent producer, and a
//! consumer that reads a whole topic back with the exporter's headers decoded.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use changefeed::kafka::rdkafka::message::{Headers, Message};
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::{DefaultProducerContext, FutureProducer};
use changefeed::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use ulid::Ulid;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a whole topic may take to read back.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// A one-broker mock cluster (broker id 1) with `topic` of three partitions.
pub fn cluster(topic: &str) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic(topic, 3, 1)
        .expect("the test topic on the mock cluster");
    cluster
}

/// An idempotent producer (`acks=all`) for `bootstrap`, with the extra settings.
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2");
    for (key, value) in extra {
        config.set(*key, *value);
    }
    config.create().expect("a producer for the mock cluster")
}

/// One message as a consumer of the topic sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: Value,
    pub ulid: Ulid,
    pub shard: i32,
    pub feed: String,
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "kafka-exporter-tests")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer for the mock cluster")
}

/// The partitions of `topic` and their high watermarks.
fn watermarks(consumer: &BaseConsumer, topic: &str) -> BTreeMap<i32, i64> {
    let metadata = consumer
        .fetch_metadata(Some(topic), CLIENT_TIMEOUT)
        .expect("the topic's metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|partition| partition.id())
        .collect();
    assert!(!partitions.is_empty(), "{topic} has partitions");
    partitions
        .into_iter()
        .map(|partition| {
            let (_low, high) = consumer
                .fetch_watermarks(topic, partition, CLIENT_TIMEOUT)
                .expect("the partition's watermarks");
            (partition, high)
        })
        .collect()
}

/// How many messages `topic` holds (acknowledged ones: the mock appends on ack).
pub async fn topic_total(bootstrap: String, topic: String) -> i64 {
    tokio::task::spawn_blocking(move || watermarks(&consumer(&bootstrap), &topic).values().sum())
        .await
        .expect("the watermark query")
}

/// Every message of `topic`, partition by partition in offset order.
pub async fn consume_all(bootstrap: &str, topic: &str) -> Vec<Received> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || consume_blocking(&bootstrap, &topic))
        .await
        .expect("the consumer thread")
}

fn consume_blocking(bootstrap: &str, topic: &str) -> Vec<Received> {
    let consumer = consumer(bootstrap);
    let mut remaining: BTreeMap<i32, i64> = watermarks(&consumer, topic)
        .into_iter()
        .filter(|(_, high)| *high > 0)
        .collect();
    let mut received = Vec::new();
    if remaining.is_empty() {
        return received;
    }
    let mut assignment = TopicPartitionList::new();
    for partition in remaining.keys() {
        assignment
            .add_partition_offset(topic, *partition, Offset::Beginning)
            .expect("a partition to assign");
    }
    consumer.assign(&assignment).expect("assign the partitions");
    let deadline = Instant::now() + READ_LIMIT;
    while !remaining.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{topic}: still waiting for {remaining:?}"
        );
        let message = match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(message) => message.expect("a message"),
        };
        let text = |bytes: Option<&[u8]>| {
            String::from_utf8(bytes.unwrap_or_default().to_vec()).expect("UTF-8")
        };
        let mut headers = BTreeMap::new();
        if let Some(all) = message.headers() {
            for header in all.iter() {
                headers.insert(header.key.to_owned(), text(header.value));
            }
        }
        let header = |name: &str| {
            headers
                .get(name)
                .unwrap_or_else(|| panic!("message without header {name}: {headers:?}"))
                .clone()
        };
        let ulid_text = header("ulid");
        assert_eq!(
            ulid_text.len(),
            26,
            "the ulid header is the 26-character text"
        );
        received.push(Received {
            partition: message.partition(),
            offset: message.offset(),
            key: text(message.key()),
            value: serde_json::from_slice(message.payload().unwrap_or_default())
                .expect("a JSON value"),
            ulid: ulid_text.parse().expect("a ULID"),
            shard: header("shard").parse().expect("a decimal shard"),
            feed: header("feed"),
        });
        if message.offset() + 1 >= remaining[&message.partition()] {
            remaining.remove(&message.partition());
        }
    }
    received
}
