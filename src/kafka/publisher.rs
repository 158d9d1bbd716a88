//! [`KafkaPublisher`]: the relay's publisher to Kafka.

use crate::error::Result;
use crate::outbox::{ClaimedMessage, Headers};
use crate::relay::{DeadLetter, PublishError, PublishOutcome, Publisher};

use super::producer::ProducerSettings;

/// Where the publisher sends messages: the topic is the outbox row's topic with
/// `topic_prefix` before it; dead letters go to that topic with `dlq_suffix` after it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KafkaPublisherConfig {
    /// The producer.
    pub producer: ProducerSettings,
    /// Put before every row's topic (default empty).
    pub topic_prefix: String,
    /// Put after the topic for dead letters (default `.dlq`).
    pub dlq_suffix: String,
}

impl KafkaPublisherConfig {
    /// Publishes with `producer`, no prefix, dead letters to `<topic>.dlq`.
    pub fn new(producer: ProducerSettings) -> Self {
        KafkaPublisherConfig {
            producer,
            topic_prefix: String::new(),
            dlq_suffix: ".dlq".to_owned(),
        }
    }

    setters! {
        /// Sets `topic_prefix`.
        topic_prefix: String;
        /// Sets `dlq_suffix`.
        dlq_suffix: String;
    }
}

/// Publishes claimed messages to Kafka (see the module documentation for keys, headers and
/// the error table).
pub struct KafkaPublisher {
    config: KafkaPublisherConfig,
}

impl KafkaPublisher {
    /// Creates the producer.
    pub fn new(config: KafkaPublisherConfig) -> Result<Self> {
        let _ = config;
        todo!("H1")
    }

    /// The configuration.
    pub fn config(&self) -> &KafkaPublisherConfig {
        &self.config
    }
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let _ = batch;
        todo!("H1")
    }

    async fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> Result<(), PublishError> {
        let _ = (letter, headers);
        todo!("H1")
    }
}
