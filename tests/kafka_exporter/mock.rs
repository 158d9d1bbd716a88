//! The mock Kafka cluster and the Kafka clients of the exporter tests (`kafka_exporter`, and
//! `live_export` through `#[path]`): a cluster with one topic, an idempotent producer, and a
//! consumer that reads a whole topic back with the exporter's headers decoded.
#![allow(dead_code)]

use changefeed::kafka::rdkafka::ClientConfig;
use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::{DefaultProducerContext, FutureProducer};
use serde_json::Value;
use ulid::Ulid;

use crate::common_kafka::{self, Consumed, ONE_REQUEST_IN_FLIGHT};

/// A one-broker mock cluster (broker id 1) with `topic` of three partitions.
pub fn cluster(topic: &str) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic(topic, 3, 1)
        .expect("the test topic on the mock cluster");
    cluster
}

/// An idempotent producer (`acks=all`) for `bootstrap`, with the extra settings, and one
/// produce request in flight at a time (see [`ONE_REQUEST_IN_FLIGHT`]).
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set(ONE_REQUEST_IN_FLIGHT.0, ONE_REQUEST_IN_FLIGHT.1);
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
    /// When the exporter handed it to the producer (its `CreateTime`, in ms).
    pub produced_ms: i64,
}

/// How many messages `topic` holds (acknowledged ones: the mock appends on ack).
pub async fn topic_total(bootstrap: String, topic: String) -> i64 {
    tokio::task::spawn_blocking(move || common_kafka::topic_total(&bootstrap, &topic))
        .await
        .expect("the watermark query")
}

/// Every message of `topic`, partition by partition in offset order, with the exporter's
/// headers decoded.
pub async fn consume_all(bootstrap: &str, topic: &str) -> Vec<Received> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    let records =
        tokio::task::spawn_blocking(move || common_kafka::consume_all(&bootstrap, &topic))
            .await
            .expect("the consumer thread");
    records.iter().map(received).collect()
}

fn received(record: &Consumed) -> Received {
    let header = |name: &str| {
        record
            .header(name)
            .unwrap_or_else(|| panic!("message without header {name}: {:?}", record.headers))
    };
    let ulid_text = header("ulid");
    assert_eq!(
        ulid_text.len(),
        26,
        "the ulid header is the 26-character text"
    );
    Received {
        partition: record.partition,
        offset: record.offset,
        key: record.key.clone().unwrap_or_default(),
        value: serde_json::from_slice(record.value.as_deref().unwrap_or_default())
            .expect("a JSON value"),
        ulid: ulid_text.parse().expect("a ULID"),
        shard: header("shard").parse().expect("a decimal shard"),
        feed: header("feed").to_owned(),
        produced_ms: record.timestamp_ms.expect("a produce timestamp"),
    }
}
