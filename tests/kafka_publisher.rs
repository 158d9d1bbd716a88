//! The relay with [`KafkaPublisher`] against librdkafka's mock cluster (no Kafka, no SQL
//! Server): exactly-once delivery in per-key order, librdkafka's own retries, poison
//! messages to the dead-letter topic, a fatal error handing the batch back, and a broker
//! outage that loses nothing.

mod common_kafka;
#[macro_use]
mod common_relay;
#[path = "../examples/support/memory_store.rs"]
mod memory_store;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use changefeed::Error;
use changefeed::kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use changefeed::kafka::{KafkaPublisher, KafkaPublisherConfig, ProducerSettings};
use changefeed::outbox::{
    ClaimStore, ClaimToken, ClaimedMessage, Failed, Headers, NewMessage, UndecodableMessage,
};
use changefeed::relay::{
    DeadLetter, ErrorKind, PublishError, Publisher, Relay, RelayConfig, RetryPolicy,
    dead_letter_headers,
};
use serde_json::json;

use common_kafka::{
    Cluster, Consumed, ONE_REQUEST_IN_FLIGHT, consume, count_by_message_id, create_topic,
    start_cluster,
};
use common_relay::fatal_publisher_text;
use memory_store::{MemoryStore, Status};

const TOPIC: &str = "orders";
const DLQ: &str = "orders.dlq";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn producer(cluster: &Cluster) -> ProducerSettings {
    ProducerSettings::new(cluster.bootstrap_servers())
        .set("linger.ms", "2")
        // Short, so a test about an outage ends in seconds; still well below the claim
        // timeout, as KafkaPublisher's documentation asks.
        .set("message.timeout.ms", "4000")
        .set(ONE_REQUEST_IN_FLIGHT.0, ONE_REQUEST_IN_FLIGHT.1)
}

fn publisher(settings: ProducerSettings) -> KafkaPublisher {
    KafkaPublisher::new(KafkaPublisherConfig::new(settings)).expect("the producer")
}

fn relay_config(batch_size: u32, max_in_flight: u32) -> RelayConfig {
    RelayConfig::default()
        .batch_size(batch_size)
        .max_in_flight(max_in_flight)
        .poll_interval(Duration::from_millis(10))
        .claim_timeout(Duration::from_secs(15))
        .retry(
            RetryPolicy::default()
                .initial(Duration::from_millis(20))
                .max(Duration::from_millis(200))
                .max_attempts(50),
        )
}

/// How long a test relay may take to drain its outbox.
const DRAIN_LIMIT: Duration = Duration::from_secs(20);

/// Runs the relay until the store has no open row left or `limit` passes.
async fn run_until_drained(
    store: &MemoryStore,
    publisher: KafkaPublisher,
    config: RelayConfig,
    limit: Duration,
) -> changefeed::Result<()> {
    let relay = Relay::new(store.clone(), publisher, config)?;
    let watched = store.clone();
    let shutdown = async move {
        let started = Instant::now();
        while !watched.is_drained() && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    relay.run(shutdown).await
}

/// [`run_until_drained`] with [`KafkaPublisher`] over `settings` and the tests' relay
/// settings, for [`DRAIN_LIMIT`].
async fn drain(
    store: &MemoryStore,
    settings: ProducerSettings,
    batch_size: u32,
    max_in_flight: u32,
) -> changefeed::Result<()> {
    let config = relay_config(batch_size, max_in_flight);
    run_until_drained(store, publisher(settings), config, DRAIN_LIMIT).await
}

fn message(aggregate: &str, seq: usize) -> NewMessage {
    NewMessage::new(TOPIC, json!({ "aggregate": aggregate, "seq": seq }))
        .aggregate("order", aggregate)
}

/// Reads `topic` back, waiting for `expected` records and a little more for duplicates.
async fn read_back(cluster: &Cluster, topic: &str, expected: usize) -> Vec<Consumed> {
    let bootstrap = cluster.bootstrap_servers();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        consume(
            &bootstrap,
            &topic,
            expected,
            Duration::from_secs(10),
            Duration::from_millis(300),
        )
    })
    .await
    .unwrap()
}

/// A mock cluster of `brokers` with the orders topic (`partitions`) and its dead-letter
/// topic (one partition).
fn orders_cluster(brokers: i32, partitions: i32) -> Cluster {
    let cluster = start_cluster(brokers);
    create_topic(&cluster, TOPIC, partitions);
    create_topic(&cluster, DLQ, 1);
    cluster
}

async fn assert_no_dead_letter(cluster: &Cluster) {
    let dead_letters = read_back(cluster, DLQ, 0).await;
    assert!(dead_letters.is_empty(), "no dead letter: {dead_letters:?}");
}

fn assert_once_each(records: &[Consumed], expected: impl IntoIterator<Item = String>) {
    let counts = count_by_message_id(records);
    let expected: BTreeMap<String, usize> = expected.into_iter().map(|id| (id, 1)).collect();
    assert_eq!(counts, expected, "every message exactly once");
}

fn message_ids(store: &MemoryStore, ids: impl IntoIterator<Item = i64>) -> Vec<String> {
    ids.into_iter()
        .map(|id| store.row(id).message.message_id.unwrap())
        .collect()
}

in_flight_variants!(the_relay_delivers_every_message_once_in_per_key_order);
async fn the_relay_delivers_every_message_once_in_per_key_order(max_in_flight: u32) {
    let cluster = orders_cluster(3, 4);
    let store = MemoryStore::new();
    let (aggregates, per_aggregate) = (40, 6);
    // Interleaved, so each claim holds one message of many aggregates.
    for seq in 0..per_aggregate {
        for a in 0..aggregates {
            let mut m = message(&format!("order-{a}"), seq);
            m.headers
                .insert("content-type".into(), "application/json".into());
            if a == 0 {
                m.trace_id = Some(TRACEPARENT.to_owned());
            }
            store.enqueue(m);
        }
    }
    // A message with its own partition key, and one without any key.
    let keyed = store.enqueue(NewMessage {
        partition_key: Some("tenant-7".into()),
        ..message("order-keyed", 0)
    });
    let unkeyed = store.enqueue(NewMessage {
        trace_id: Some("not-a-traceparent".into()),
        ..NewMessage::new(TOPIC, json!({ "loose": true }))
    });
    let total = aggregates * per_aggregate + 2;

    drain(&store, producer(&cluster), 64, max_in_flight)
        .await
        .expect("the relay stops cleanly");
    assert_eq!(store.count(Status::Done), total, "every row acknowledged");

    let records = read_back(&cluster, TOPIC, total).await;
    assert_once_each(&records, message_ids(&store, 1..=total as i64));

    // Per key: one partition, sequence numbers in order.
    let mut by_key: BTreeMap<String, Vec<(i32, u64)>> = BTreeMap::new();
    for record in records.iter().filter(|r| r.json().get("seq").is_some()) {
        let key = record.key.clone().expect("a keyed record");
        let seq = record.json()["seq"].as_u64().unwrap();
        by_key.entry(key).or_default().push((record.partition, seq));
    }
    for a in 0..aggregates {
        let seen = &by_key[&format!("order-{a}")];
        let partition = seen[0].0;
        assert!(
            seen.iter().all(|(p, _)| *p == partition),
            "one partition per key"
        );
        let seqs: Vec<u64> = seen.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            seqs,
            (0..per_aggregate as u64).collect::<Vec<_>>(),
            "order-{a}"
        );
    }

    // Headers: the row's, then message-id, attempts and the trace header.
    let first = records
        .iter()
        .find(|r| r.header("message-id") == Some("m-1"))
        .unwrap();
    assert_eq!(
        first.headers,
        vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("message-id".to_owned(), "m-1".to_owned()),
            ("attempts".to_owned(), "0".to_owned()),
            ("traceparent".to_owned(), TRACEPARENT.to_owned()),
        ]
    );
    assert_eq!(first.json(), json!({ "aggregate": "order-0", "seq": 0 }));
    let keyed_id = format!("m-{keyed}");
    let keyed = records
        .iter()
        .find(|r| r.header("message-id") == Some(keyed_id.as_str()))
        .unwrap();
    assert_eq!(
        keyed.key.as_deref(),
        Some("tenant-7"),
        "the partition key wins"
    );
    let unkeyed_id = format!("m-{unkeyed}");
    let unkeyed = records
        .iter()
        .find(|r| r.header("message-id") == Some(unkeyed_id.as_str()))
        .unwrap();
    assert_eq!(unkeyed.key, None);
    assert_eq!(unkeyed.header("trace-id"), Some("not-a-traceparent"));
    assert_eq!(unkeyed.header("traceparent"), None);
}

in_flight_variants!(leader_changes_and_timeouts_are_retried_inside_librdkafka_without_duplicates);
async fn leader_changes_and_timeouts_are_retried_inside_librdkafka_without_duplicates(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(3, 2);
    use RDKafkaRespErr::*;
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        ],
    );
    let store = MemoryStore::new();
    let total = 120;
    for i in 0..total {
        store.enqueue(message(&format!("order-{}", i % 30), i));
    }

    drain(&store, producer(&cluster), 50, max_in_flight)
        .await
        .unwrap();

    assert_eq!(store.count(Status::Done), total);
    assert!(
        store.rows().iter().all(|row| row.attempts == 0),
        "no failure reached the relay"
    );
    let records = read_back(&cluster, TOPIC, total).await;
    assert_once_each(&records, message_ids(&store, 1..=total as i64));
    assert_no_dead_letter(&cluster).await;
}

in_flight_variants!(a_message_over_message_max_bytes_is_dead_lettered_and_the_rest_delivered);
async fn a_message_over_message_max_bytes_is_dead_lettered_and_the_rest_delivered(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        let payload = if i == 4 {
            json!({ "blob": "x".repeat(20_000) })
        } else {
            json!({ "seq": i })
        };
        let mut m = NewMessage::new(TOPIC, payload).aggregate("order", format!("order-{i}"));
        m.headers.insert("tenant".into(), "t1".into());
        ids.push(store.enqueue(m));
    }
    let big = ids[4];
    let settings = producer(&cluster).set("message.max.bytes", "10000");

    drain(&store, settings, 100, max_in_flight).await.unwrap();

    assert_eq!(store.row(big).status, Status::Dead);
    assert_eq!(store.row(big).attempts, 1);
    assert_eq!(store.count(Status::Done), 9);
    let delivered: Vec<i64> = ids.iter().copied().filter(|id| *id != big).collect();
    let records = read_back(&cluster, TOPIC, 9).await;
    assert_once_each(&records, message_ids(&store, delivered));

    let letters = read_back(&cluster, DLQ, 1).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    let big_id = format!("m-{big}");
    assert_eq!(letter.header("message-id"), Some(big_id.as_str()));
    assert_eq!(letter.header("x-original-topic"), Some(TOPIC));
    assert_eq!(letter.header("x-attempts"), Some("1"));
    assert_eq!(letter.header("x-error-kind"), Some("poison"));
    assert!(
        letter
            .header("x-error")
            .is_some_and(|e| e.contains("MessageSizeTooLarge")),
        "{letter:?}"
    );
    assert_eq!(letter.header("tenant"), Some("t1"), "the row's own headers");
    assert_eq!(letter.key.as_deref(), Some("order-4"));
    // The payload is too large for the dead-letter topic too: the letter goes without
    // it, saying so; the dead row keeps it.
    assert_eq!(letter.value, None);
    assert!(letter.header("x-value-omitted").is_some(), "{letter:?}");
}

in_flight_variants!(a_message_the_broker_refuses_as_too_large_is_dead_lettered_with_its_payload);
async fn a_message_the_broker_refuses_as_too_large_is_dead_lettered_with_its_payload(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    // One aggregate: the first claim holds its head alone, so the refused produce request
    // carries that message only; it is refused again when produced alone, which makes it
    // poison; the others follow once it is dead.
    let refused = store.enqueue(message("order-1", 0));
    let rest = [
        store.enqueue(message("order-1", 1)),
        store.enqueue(message("order-1", 2)),
    ];
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 2],
    );

    drain(&store, producer(&cluster), 100, max_in_flight)
        .await
        .unwrap();

    assert_eq!(store.row(refused).status, Status::Dead);
    assert!(rest.iter().all(|id| store.row(*id).status == Status::Done));
    let records = read_back(&cluster, TOPIC, 2).await;
    assert_once_each(&records, message_ids(&store, rest));
    let seqs: Vec<_> = records.iter().map(|r| r.json()["seq"].clone()).collect();
    assert_eq!(seqs, vec![json!(1), json!(2)]);

    let letters = read_back(&cluster, DLQ, 1).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.header("message-id"), Some("m-1"));
    assert_eq!(letter.header("x-original-topic"), Some(TOPIC));
    assert_eq!(letter.header("x-attempts"), Some("1"));
    assert_eq!(letter.header("x-error-kind"), Some("poison"));
    assert_eq!(letter.json(), json!({ "aggregate": "order-1", "seq": 0 }));
}

/// Five messages over `message.max.bytes` (poison at enqueue) of five aggregates, each
/// followed by a small one, and a message of an aggregate of its own; the poison ids and
/// the others'.
fn five_poison_with_successors(store: &MemoryStore) -> (Vec<i64>, Vec<i64>) {
    let poison = (0..5)
        .map(|i| {
            let big = NewMessage::new(TOPIC, json!({ "blob": "x".repeat(20_000) }))
                .aggregate("order", format!("order-{i}"));
            store.enqueue(big)
        })
        .collect();
    let mut healthy: Vec<i64> = (0..5)
        .map(|i| store.enqueue(message(&format!("order-{i}"), 1)))
        .collect();
    healthy.push(store.enqueue(message("order-alone", 0)));
    (poison, healthy)
}

in_flight_variants!(dead_letters_to_a_missing_topic_end_inside_the_claim_and_say_so);
/// The dead-letter topic does not exist and the brokers do not create topics: librdkafka
/// holds each dead letter until its message timeout (4 s here). One at a time, five of
/// them took 20 s, past the 15 s claim: the rows were claimed, published and dead-lettered
/// again. Together they take one timeout; each row is dead once, saying why its dead
/// letter failed, and the healthy messages go out once each, in order.
async fn dead_letters_to_a_missing_topic_end_inside_the_claim_and_say_so(max_in_flight: u32) {
    let cluster = start_cluster(1);
    create_topic(&cluster, TOPIC, 1);
    let store = MemoryStore::new();
    let (poison, healthy) = five_poison_with_successors(&store);
    let settings = producer(&cluster)
        .set("message.max.bytes", "10000")
        .set("allow.auto.create.topics", "false");

    let started = Instant::now();
    drain(&store, settings, 100, max_in_flight).await.unwrap();
    let took = started.elapsed();

    // relay_config's claim: 15 s.
    assert!(took < Duration::from_secs(12), "drained after {took:?}");
    for id in &poison {
        let row = store.row(*id);
        assert_eq!((row.status, row.attempts), (Status::Dead, 1), "{row:?}");
        let error = row.last_error.clone().unwrap_or_default();
        for part in [
            "poison: producing to orders: ",
            "MessageSizeTooLarge",
            "its dead letter from topic orders to orders.dlq was not written either: \
             retriable: producing to orders.dlq: ",
        ] {
            assert!(error.contains(part), "{part:?} in {error}");
        }
    }
    assert_eq!(store.count(Status::Done), healthy.len());
    let records = read_back(&cluster, TOPIC, healthy.len()).await;
    assert_once_each(&records, message_ids(&store, healthy));
}

in_flight_variants!(a_dead_letter_topic_that_refuses_the_producer_is_named_with_both_errors);
/// The dead-letter topic refuses the producer (ACLs): each dead row's `last_error` names
/// its own error and topic and the dead-letter topic's refusal; the relay runs on.
async fn a_dead_letter_topic_that_refuses_the_producer_is_named_with_both_errors(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(1, 1);
    cluster
        .topic_error(
            DLQ,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let store = MemoryStore::new();
    let (poison, healthy) = five_poison_with_successors(&store);
    let settings = producer(&cluster).set("message.max.bytes", "10000");

    drain(&store, settings, 100, max_in_flight).await.unwrap();

    for id in &poison {
        let row = store.row(*id);
        assert_eq!((row.status, row.attempts), (Status::Dead, 1), "{row:?}");
        let error = row.last_error.clone().unwrap_or_default();
        for part in [
            "poison: producing to orders: ",
            "MessageSizeTooLarge",
            "its dead letter from topic orders to orders.dlq was not written either: ",
            "producing to orders.dlq: ",
            "TopicAuthorizationFailed",
        ] {
            assert!(error.contains(part), "{part:?} in {error}");
        }
    }
    let records = read_back(&cluster, TOPIC, healthy.len()).await;
    assert_once_each(&records, message_ids(&store, healthy));
}

/// Settings that put a whole claim of one partition into one produce request.
fn one_request(cluster: &Cluster) -> ProducerSettings {
    producer(cluster).set("linger.ms", "200")
}

/// The `seq` of each record of `aggregate`, in the order the topic holds them.
fn seqs_of(records: &[Consumed], aggregate: &str) -> Vec<i64> {
    records
        .iter()
        .filter(|r| r.json()["aggregate"] == aggregate)
        .map(|r| r.json()["seq"].as_i64().unwrap())
        .collect()
}

in_flight_variants!(a_refused_request_of_five_aggregates_kills_none_and_lets_no_successor_first);
async fn a_refused_request_of_five_aggregates_kills_none_and_lets_no_successor_first(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    let aggregates: Vec<String> = (0..5).map(|a| format!("order-{a}")).collect();
    for seq in 0..2 {
        for aggregate in &aggregates {
            store.enqueue(message(aggregate, seq));
        }
    }
    // The first claim's five heads go in one request, which the broker refuses as a
    // whole; the same message produced alone is accepted.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
    );

    drain(&store, one_request(&cluster), 100, max_in_flight)
        .await
        .unwrap();

    assert_eq!(store.count(Status::Dead), 0, "{:?}", store.rows());
    assert_eq!(store.count(Status::Done), 10);
    assert!(
        store.rows().iter().all(|row| row.attempts == 0),
        "a bystander is not charged an attempt: {:?}",
        store.rows()
    );
    let records = read_back(&cluster, TOPIC, 10).await;
    assert_once_each(&records, message_ids(&store, 1..=10));
    for aggregate in &aggregates {
        assert_eq!(seqs_of(&records, aggregate), vec![0, 1], "{aggregate}");
    }
    assert_no_dead_letter(&cluster).await;
}

in_flight_variants!(an_oversize_message_among_small_ones_is_the_only_one_dead);
async fn an_oversize_message_among_small_ones_is_the_only_one_dead(max_in_flight: u32) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    let ids: Vec<i64> = (0..5)
        .map(|a| store.enqueue(message(&format!("order-{a}"), 0)))
        .collect();
    let big = ids[2];
    let successor = store.enqueue(message("order-2", 1));
    // The mock broker has no size limit of its own, so it is told what a broker with a
    // limit between the small messages and the big one answers: the batch's request is
    // refused, then each message alone: the two before the big one are accepted, the big
    // one is refused, the two after it accepted.
    use RDKafkaRespErr::*;
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
            RD_KAFKA_RESP_ERR_NO_ERROR,
            RD_KAFKA_RESP_ERR_NO_ERROR,
            RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ],
    );

    drain(&store, one_request(&cluster), 100, max_in_flight)
        .await
        .unwrap();

    let dead: Vec<i64> = (1..=store.rows().len() as i64)
        .filter(|id| store.row(*id).status == Status::Dead)
        .collect();
    assert_eq!(dead, vec![big]);
    assert!(
        store
            .row(big)
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("alone")),
        "{:?}",
        store.row(big)
    );
    let delivered: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| *id != big)
        .chain([successor])
        .collect();
    let records = read_back(&cluster, TOPIC, delivered.len()).await;
    assert_once_each(&records, message_ids(&store, delivered));
    let letters = read_back(&cluster, DLQ, 1).await;
    let big_id = format!("m-{big}");
    assert_eq!(
        letters
            .iter()
            .map(|l| l.header("message-id"))
            .collect::<Vec<_>>(),
        vec![Some(big_id.as_str())]
    );
}

in_flight_variants!(one_refused_topic_among_200_messages_goes_dead_alone_and_the_relay_runs_on);
async fn one_refused_topic_among_200_messages_goes_dead_alone_and_the_relay_runs_on(
    max_in_flight: u32,
) {
    const SECRET: &str = "secret";
    let cluster = orders_cluster(1, 2);
    create_topic(&cluster, SECRET, 1);
    create_topic(&cluster, "secret.dlq", 1);
    // Kafka with ACLs answers a topic the producer may not write to like this.
    cluster
        .topic_error(
            SECRET,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let store = MemoryStore::new();
    let mut ids = Vec::new();
    for i in 0..200 {
        ids.push(store.enqueue(message(&format!("order-{}", i % 40), i)));
        if i == 100 {
            let refused = NewMessage::new(SECRET, json!({ "seq": i })).aggregate("audit", "a-1");
            ids.push(store.enqueue(refused));
        }
    }
    let refused = ids[101];
    let max_attempts = 3;
    let config = relay_config(50, max_in_flight).retry(
        RetryPolicy::default()
            .initial(Duration::from_millis(20))
            .max(Duration::from_millis(100))
            .max_attempts(max_attempts),
    );
    // A refusal is the topic's own (an attempt counted) only when another topic accepted a
    // message since its previous one: the orders keep coming until the refused one is dead.
    let fed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let feeding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let feeder = {
        let (store, fed, feeding) = (store.clone(), fed.clone(), feeding.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            for seq in 200.. {
                if store.row(refused).status == Status::Dead || started.elapsed() > DRAIN_LIMIT {
                    break;
                }
                let id = store.enqueue(message(&format!("order-{}", seq % 40), seq));
                fed.lock().unwrap().push(id);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            feeding.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let relay = Relay::new(store.clone(), publisher(producer(&cluster)), config).unwrap();
    let watched = store.clone();
    relay
        .run(async move {
            let started = Instant::now();
            while (feeding.load(std::sync::atomic::Ordering::SeqCst) || !watched.is_drained())
                && started.elapsed() < DRAIN_LIMIT * 2
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("one topic's refusal does not stop the relay");
    feeder.await.unwrap();

    let row = store.row(refused);
    assert_eq!(row.status, Status::Dead, "{row:?}");
    assert_eq!(row.attempts, max_attempts as i32, "{row:?}");
    let error = row.last_error.clone().unwrap_or_default();
    assert!(error.contains("TopicAuthorizationFailed"), "{error}");
    assert!(
        error.contains("topic secret refuses"),
        "names the topic: {error}"
    );
    let fed = fed.lock().unwrap().clone();
    assert_eq!(store.count(Status::Done), 200 + fed.len());
    let delivered: Vec<i64> = ids
        .iter()
        .chain(&fed)
        .copied()
        .filter(|id| *id != refused)
        .collect();
    let records = read_back(&cluster, TOPIC, delivered.len()).await;
    assert_once_each(&records, message_ids(&store, delivered));
}

#[tokio::test]
async fn a_publisher_whose_publish_can_outlive_the_claim_is_refused_naming_both_settings() {
    let cluster = start_cluster(1);
    let config = RelayConfig::default();
    for (timeout, fits) in [
        (None, true),
        (Some("8000"), true),
        (Some("20000"), false),
        (Some("0"), false),
    ] {
        let mut settings = ProducerSettings::new(cluster.bootstrap_servers());
        if let Some(timeout) = timeout {
            settings = settings.set("message.timeout.ms", timeout);
        }
        let publisher = publisher(settings);
        let stated = match timeout {
            None => Some(KafkaPublisher::DEFAULT_MESSAGE_TIMEOUT * 2 + Duration::from_secs(1)),
            Some("8000") => Some(Duration::from_secs(17)),
            Some("20000") => Some(Duration::from_secs(41)),
            _ => Some(Duration::MAX),
        };
        assert_eq!(publisher.longest_publish(), stated, "{timeout:?}");
        // Its bound counts from the call whatever else is in flight: batches in flight do
        // not lengthen it, so eight of them fit the same claim.
        assert_eq!(
            publisher.longest_publish_in_flight(8),
            stated,
            "{timeout:?}"
        );
        let result = Relay::new(
            MemoryStore::new(),
            publisher,
            config.clone().max_in_flight(8),
        );
        match (result, fits) {
            (Ok(_), true) => {}
            (Err(Error::Config(text)), false) => {
                assert!(text.contains("claim_timeout"), "{text}");
                assert!(text.contains("message.timeout.ms"), "{text}");
            }
            (Ok(_), false) => panic!("message.timeout.ms={timeout:?} accepted"),
            (Err(error), _) => panic!("message.timeout.ms={timeout:?}: {error}"),
        }
    }
    // A longer claim makes room for the same publisher.
    let publisher = publisher(
        ProducerSettings::new(cluster.bootstrap_servers()).set("message.timeout.ms", "20000"),
    );
    Relay::new(
        MemoryStore::new(),
        publisher,
        config.claim_timeout(Duration::from_secs(60)),
    )
    .expect("fits a 60 s claim");
}

in_flight_variants!(a_producer_wide_authorization_failure_stops_the_relay_and_hands_the_batch_back);
async fn a_producer_wide_authorization_failure_stops_the_relay_and_hands_the_batch_back(
    max_in_flight: u32,
) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    let ids: Vec<i64> = (0..5)
        .map(|i| store.enqueue(message(&format!("order-{i}"), 0)))
        .collect();
    // Every produce request fails; one partition, so the batch is one request anyway.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 20_000],
    );
    let publisher = KafkaPublisher::new(
        KafkaPublisherConfig::new(producer(&cluster))
            .authorization_patience(Duration::from_millis(500)),
    )
    .unwrap();

    let run = run_until_drained(
        &store,
        publisher,
        relay_config(100, max_in_flight),
        DRAIN_LIMIT,
    )
    .await;
    let text = fatal_publisher_text(run);
    assert!(text.contains("TopicAuthorizationFailed"), "{text}");
    assert!(text.contains("handed the message back"), "{text}");

    // Handed back: not dead, no attempt counted, claimable again at once.
    for id in &ids {
        let row = store.row(*id);
        assert_eq!((row.status, row.attempts), (Status::Failed, 0), "row {id}");
    }
    let mut store = store;
    let reclaimed = store.claim(100, Duration::from_secs(15)).await.unwrap();
    let reclaimed: Vec<(i64, i32)> = reclaimed
        .iter()
        .map(|c| (c.id(), c.message().unwrap().attempts))
        .collect();
    assert_eq!(reclaimed, ids.iter().map(|id| (*id, 0)).collect::<Vec<_>>());
    cluster.clear_request_errors(RDKafkaApiKey::Produce);
    assert_no_dead_letter(&cluster).await;
}

in_flight_variants!(losing_write_access_to_every_topic_stops_the_relay_and_kills_nothing);
/// Two low-rate topics, each delivered to once; then the producer loses write access to
/// every topic (every produce request refused with `TOPIC_AUTHORIZATION_FAILED`), and
/// each topic gets an aggregate's next two messages, the second topic's only after the
/// first's refusal began. The deliveries from before the refusal are no evidence that
/// either refusal is its topic's own, so no message counts an attempt or goes dead: the
/// relay stops naming the Write ACL, and once access returns every message goes out, each
/// aggregate in order.
async fn losing_write_access_to_every_topic_stops_the_relay_and_kills_nothing(max_in_flight: u32) {
    const PAYMENTS: &str = "payments";
    let cluster = orders_cluster(1, 1);
    create_topic(&cluster, PAYMENTS, 1);
    create_topic(&cluster, "payments.dlq", 1);
    let on = |topic: &str, aggregate: &str, seq: usize| {
        NewMessage::new(topic, json!({ "aggregate": aggregate, "seq": seq }))
            .aggregate("account", aggregate)
    };
    let store = MemoryStore::new();
    let patience = Duration::from_secs(2);
    let publisher = KafkaPublisher::new(
        KafkaPublisherConfig::new(producer(&cluster)).authorization_patience(patience),
    )
    .unwrap();
    // Attempts that would run out in well under a second, were they spent.
    let config = relay_config(100, max_in_flight).retry(
        RetryPolicy::default()
            .initial(Duration::from_millis(20))
            .max(Duration::from_millis(100))
            .max_attempts(3),
    );
    let relay = Relay::new(store.clone(), publisher, config).unwrap();
    // Stopped by its fatal error, or (the old code, which ran on) after DRAIN_LIMIT.
    let run = tokio::spawn(relay.run(tokio::time::sleep(DRAIN_LIMIT)));
    let settled = |id: i64, wanted: fn(Status) -> bool| {
        let store = store.clone();
        async move {
            let started = Instant::now();
            while !wanted(store.row(id).status) {
                assert!(
                    started.elapsed() < DRAIN_LIMIT,
                    "row {id}: {:?}",
                    store.row(id)
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };

    let first = store.enqueue(on(TOPIC, "order-1", 0));
    settled(first, |s| s == Status::Done).await;
    let first = store.enqueue(on(PAYMENTS, "payment-1", 0));
    settled(first, |s| s == Status::Done).await;

    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 20_000],
    );
    let refused_at = Instant::now();
    let order = store.enqueue(on(TOPIC, "order-1", 1));
    store.enqueue(on(TOPIC, "order-1", 2));
    settled(order, |s| s != Status::Pending && s != Status::Processing).await;
    // Low rate: the other topic's next message comes a while after the first refusal.
    tokio::time::sleep(patience / 2).await;
    store.enqueue(on(PAYMENTS, "payment-1", 1));
    store.enqueue(on(PAYMENTS, "payment-1", 2));

    let result = tokio::time::timeout(DRAIN_LIMIT * 2, run)
        .await
        .expect("the relay stops")
        .unwrap();
    let took = refused_at.elapsed();
    let rows = store.rows();
    assert!(
        rows.iter()
            .all(|row| row.status != Status::Dead && row.attempts == 0),
        "no attempt counted, nothing dead: {rows:?}"
    );
    let text = fatal_publisher_text(result);
    for needed in ["TopicAuthorizationFailed", "Write", "ACL"] {
        assert!(text.contains(needed), "{needed} in: {text}");
    }
    assert!(
        text.contains("topic orders has refused"),
        "names the topic: {text}"
    );
    assert!(took >= patience, "stopped after {took:?}");
    // Both topics were tried and refused; their next messages wait behind them.
    let statuses: Vec<Status> = rows.iter().map(|row| row.status).collect();
    use Status::{Done, Failed, Pending};
    assert_eq!(statuses, [Done, Done, Failed, Pending, Failed, Pending]);

    // Access returns: a relay started again delivers the rest, each aggregate in order.
    cluster.clear_request_errors(RDKafkaApiKey::Produce);
    drain(&store, producer(&cluster), 100, max_in_flight)
        .await
        .unwrap();
    assert_eq!(store.count(Status::Done), 6, "{:?}", store.rows());
    let orders = read_back(&cluster, TOPIC, 3).await;
    assert_eq!(seqs_of(&orders, "order-1"), vec![0, 1, 2]);
    let payments = read_back(&cluster, PAYMENTS, 3).await;
    assert_eq!(seqs_of(&payments, "payment-1"), vec![0, 1, 2]);
    assert_no_dead_letter(&cluster).await;
    assert!(read_back(&cluster, "payments.dlq", 0).await.is_empty());
}

in_flight_variants!(a_refused_timestamp_kills_no_message_and_counts_no_attempt);
/// The broker refusing the records' timestamps (`INVALID_TIMESTAMP`, the topic's
/// `message.timestamp.*` limits) refuses the relay host's clock, not a message: while it
/// lasts, the messages are handed back without an attempt; once it passes, every one is
/// delivered, in order, and none is dead.
async fn a_refused_timestamp_kills_no_message_and_counts_no_attempt(max_in_flight: u32) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    for seq in 0..2 {
        for aggregate in ["order-1", "order-2", "order-3"] {
            store.enqueue(message(aggregate, seq));
        }
    }
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP; 4],
    );

    drain(&store, one_request(&cluster), 100, max_in_flight)
        .await
        .unwrap();

    assert_eq!(store.count(Status::Dead), 0, "{:?}", store.rows());
    assert_eq!(store.count(Status::Done), 6);
    assert!(
        store.rows().iter().all(|row| row.attempts == 0),
        "the clock is not the messages' attempt: {:?}",
        store.rows()
    );
    let records = read_back(&cluster, TOPIC, 6).await;
    assert_once_each(&records, message_ids(&store, 1..=6));
    for aggregate in ["order-1", "order-2", "order-3"] {
        assert_eq!(seqs_of(&records, aggregate), vec![0, 1], "{aggregate}");
    }
    assert_no_dead_letter(&cluster).await;
}

in_flight_variants!(a_clock_the_topic_keeps_refusing_stops_the_relay_naming_the_clock);
/// A topic that refuses the timestamps for `clock_patience`, with nothing delivered to it
/// meanwhile, is a clock that will not right itself: the relay stops, naming the clock and
/// the topic's settings, and hands its messages back unharmed.
async fn a_clock_the_topic_keeps_refusing_stops_the_relay_naming_the_clock(max_in_flight: u32) {
    let cluster = orders_cluster(1, 1);
    let store = MemoryStore::new();
    let ids: Vec<i64> = (0..3)
        .map(|a| store.enqueue(message(&format!("order-{a}"), 0)))
        .collect();
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP; 1000],
    );
    let patience = Duration::from_millis(500);
    let publisher =
        KafkaPublisher::new(KafkaPublisherConfig::new(producer(&cluster)).clock_patience(patience))
            .unwrap();

    let started = Instant::now();
    let run = run_until_drained(
        &store,
        publisher,
        relay_config(100, max_in_flight),
        DRAIN_LIMIT,
    )
    .await;
    let took = started.elapsed();
    let text = fatal_publisher_text(run);
    assert!(took >= patience && took < DRAIN_LIMIT / 2, "{took:?}");
    for needed in [
        "clock",
        "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms",
        "message.timestamp.difference.max.ms",
        TOPIC,
    ] {
        assert!(text.contains(needed), "{needed} in: {text}");
    }
    for id in &ids {
        let row = store.row(*id);
        assert_eq!((row.status, row.attempts), (Status::Failed, 0), "row {id}");
    }
    cluster.clear_request_errors(RDKafkaApiKey::Produce);
    assert_no_dead_letter(&cluster).await;
}

in_flight_variants!(a_broker_outage_during_a_batch_loses_nothing);
async fn a_broker_outage_during_a_batch_loses_nothing(max_in_flight: u32) {
    let cluster = orders_cluster(3, 3);
    let store = MemoryStore::new();
    let total = 600;
    for i in 0..total {
        store.enqueue(message(&format!("order-{}", i % 100), i));
    }
    // Deliveries time out (as retriable failures) while every broker is down.
    // Reconnects quickly once they are back (librdkafka's back-off grows to 10 s).
    let settings = producer(&cluster)
        .set("message.timeout.ms", "1000")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "100");
    let relay = {
        let store = store.clone();
        tokio::spawn(async move {
            run_until_drained(
                &store,
                publisher(settings),
                relay_config(100, max_in_flight),
                Duration::from_secs(30),
            )
            .await
        })
    };
    let started = Instant::now();
    while store.count(Status::Done) == 0 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cluster.broker_down(-1).unwrap();
    let at_outage = store.count(Status::Done);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Nothing is lost while the brokers are away: rows are done, pending or failed.
    assert_eq!(store.count(Status::Dead), 0);
    assert!(store.count(Status::Done) < total, "the outage came mid-run");
    cluster.broker_up(-1).unwrap();
    relay.await.unwrap().expect("the relay survives the outage");

    assert_eq!(store.count(Status::Dead), 0);
    assert_eq!(
        store.count(Status::Done),
        total,
        "everything delivered after the outage"
    );
    assert!(at_outage < total);
    assert!(
        store.rows().iter().any(|row| row.attempts > 0),
        "deliveries in flight during the outage timed out and were retried"
    );
    let records = read_back(&cluster, TOPIC, total).await;
    let counts = count_by_message_id(&records);
    for id in message_ids(&store, 1..=total as i64) {
        assert!(counts.get(&id).is_some_and(|n| *n >= 1), "{id} delivered");
    }
}

#[tokio::test]
async fn the_memory_store_claims_heads_of_aggregates_and_fences_acknowledgements() {
    let mut store = MemoryStore::new();
    let a1 = store.enqueue(message("a", 0));
    let a2 = store.enqueue(message("a", 1));
    let b1 = store.enqueue(message("b", 0));
    let loose = store.enqueue(NewMessage::new(TOPIC, json!(null)));
    let timeout = Duration::from_secs(30);
    let batch = store.claim(10, timeout).await.unwrap();
    let claimed: Vec<i64> = batch.iter().map(|c| c.id()).collect();
    assert_eq!(claimed, vec![a1, b1, loose], "a2 waits behind a1");
    let token = batch[0].claim_token();
    let other = changefeed::outbox::ClaimToken::new(uuid::Uuid::new_v4());
    assert_eq!(store.mark_done(&[a1], other).await.unwrap(), 0, "fenced");
    assert_eq!(store.mark_done(&[a1], token).await.unwrap(), 1);
    assert_eq!(
        store
            .mark_failed(Failed::dead(b1, token, "poison: x"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.requeue(loose, token, Duration::ZERO).await.unwrap(),
        1
    );
    let batch = store.claim(10, timeout).await.unwrap();
    let claimed: Vec<(i64, i32)> = batch
        .iter()
        .map(|c| (c.id(), c.message().unwrap().attempts))
        .collect();
    assert_eq!(
        claimed,
        vec![(a2, 0), (loose, 0)],
        "requeue counts no attempt"
    );
    assert_eq!(store.row(b1).status, Status::Dead);
    assert_eq!(store.row(b1).attempts, 1);
    // An expired claim is taken over, and that counts an attempt.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let batch = store.claim(10, Duration::ZERO).await.unwrap();
    let claimed: Vec<(i64, i32)> = batch
        .iter()
        .map(|c| (c.id(), c.message().unwrap().attempts))
        .collect();
    assert_eq!(claimed, vec![(a2, 1), (loose, 1)]);
}

fn claimed(id: i64, aggregate: &str) -> ClaimedMessage {
    ClaimedMessage {
        id,
        message_id: format!("m-{id}"),
        topic: TOPIC.to_owned(),
        aggregate_type: Some("order".to_owned()),
        aggregate_id: Some(aggregate.to_owned()),
        partition_key: Some(aggregate.to_owned()),
        payload: json!({ "id": id }),
        headers: Headers::new(),
        trace_id: None,
        attempts: 0,
        claim_token: ClaimToken::new(uuid::Uuid::nil()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_local_queue_is_backpressure_for_the_messages_that_do_not_fit() {
    let cluster = orders_cluster(1, 1);
    // Room for three messages until their deliveries are reported.
    let settings = producer(&cluster).set("queue.buffering.max.messages", "3");
    let publisher = publisher(settings);
    let batch: Vec<ClaimedMessage> = (1..=5).map(|id| claimed(id, &format!("k{id}"))).collect();
    let outcomes = publisher.publish(&batch).await;
    let kinds: Vec<Option<ErrorKind>> = outcomes
        .iter()
        .map(|o| o.as_ref().err().map(|e| e.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            None,
            None,
            None,
            Some(ErrorKind::Backpressure),
            Some(ErrorKind::Backpressure)
        ]
    );
    assert!(
        outcomes[3]
            .as_ref()
            .unwrap_err()
            .message
            .contains("QueueFull")
    );
    // Once the queue has drained, the handed-back messages go through. librdkafka frees a
    // queue slot just after the delivery report that resolved the future, so, as the relay
    // does after backpressure, try again after a pause.
    let started = Instant::now();
    let outcomes = loop {
        let outcomes = publisher.publish(&batch[3..]).await;
        if outcomes.iter().all(Result::is_ok) || started.elapsed() > Duration::from_secs(5) {
            break outcomes;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(outcomes, vec![Ok(()), Ok(())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_row_without_a_topic_goes_to_the_configured_topic_or_fails_clearly() {
    let cluster = start_cluster(1);
    let fallback = "outbox.undecodable";
    create_topic(&cluster, fallback, 1);
    let row = UndecodableMessage {
        id: 42,
        message_id: None,
        topic: None,
        payload: Some("[1e400]".to_owned()),
        headers: None,
        attempts: 0,
        claim_token: ClaimToken::new(uuid::Uuid::nil()),
        error: "payload: number out of range".to_owned(),
    };
    let error = PublishError::poison("the outbox row cannot be decoded");
    let headers = dead_letter_headers(DeadLetter::Undecodable(&row), 1, &error);

    let without = publisher(producer(&cluster));
    let failed = without
        .publish_dead_letter(DeadLetter::Undecodable(&row), &headers)
        .await
        .expect_err("no topic to send it to");
    assert!(failed.message.contains("outbox row 42"), "{failed}");
    assert!(failed.message.contains("undecodable_topic"), "{failed}");

    let config =
        KafkaPublisherConfig::new(producer(&cluster)).undecodable_topic(Some(fallback.to_owned()));
    let with = KafkaPublisher::new(config).unwrap();
    with.publish_dead_letter(DeadLetter::Undecodable(&row), &headers)
        .await
        .expect("sent to the configured topic");
    let letters = read_back(&cluster, fallback, 1).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].value.as_deref(), Some(&b"[1e400]"[..]));
    assert_eq!(letters[0].header("x-error-kind"), Some("poison"));
    assert_eq!(letters[0].header("x-original-topic"), None);
    assert_eq!(letters[0].key, None);
}
