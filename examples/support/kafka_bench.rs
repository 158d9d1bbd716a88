//! What the Kafka benchmarks share: sending a record to librdkafka while its local queue is
//! full, judging a delivery report, warming a producer up (connected, its idempotent
//! producer id acquired) before a clock starts, and the bare producer the relay is measured
//! against.

use std::collections::VecDeque;
use std::time::Duration;

use changefeed::kafka::rdkafka::error::KafkaError;
use changefeed::kafka::rdkafka::producer::future_producer::OwnedDeliveryResult;
use changefeed::kafka::rdkafka::producer::{
    DeliveryFuture, FutureProducer, FutureRecord, Producer,
};
use changefeed::kafka::rdkafka::types::RDKafkaErrorCode;
use changefeed::kafka::{KafkaPublisher, ProducerSettings};

/// Enqueues `record`, its delivery future pushed on `pending`; when the producer's local
/// queue is full, awaits the oldest pending delivery and tries again.
pub async fn send(
    producer: &FutureProducer,
    mut record: FutureRecord<'_, str, [u8]>,
    pending: &mut VecDeque<DeliveryFuture>,
) -> Result<(), String> {
    loop {
        match producer.send_result(record) {
            Ok(delivery) => {
                pending.push_back(delivery);
                return Ok(());
            }
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

/// A bare producer with `settings` and KafkaPublisher's default message timeout (the
/// relay's), warmed up on `topic` before any clock starts.
pub async fn bare_producer(
    settings: ProducerSettings,
    topic: &str,
) -> Result<FutureProducer, String> {
    let timeout = KafkaPublisher::DEFAULT_MESSAGE_TIMEOUT.as_millis();
    let producer: FutureProducer = settings
        .set("message.timeout.ms", timeout.to_string())
        .create()
        .map_err(|e| e.to_string())?;
    warm_up(&producer, topic).await?;
    Ok(producer)
}

/// Connects `producer` to the cluster and has one record delivered.
pub async fn warm_up(producer: &FutureProducer, topic: &str) -> Result<(), String> {
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

/// A delivery report as a result: a failed or cancelled delivery is an error.
pub fn check<E: std::fmt::Debug>(report: Result<OwnedDeliveryResult, E>) -> Result<(), String> {
    match report {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(format!("a raw delivery failed: {error}")),
        Err(e) => Err(format!("a raw delivery was cancelled: {e:?}")),
    }
}
