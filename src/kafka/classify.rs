//! [`classify`]: what each librdkafka error means for the relay and the exporter.

use rdkafka::error::KafkaError;

use crate::relay::ErrorKind;

/// The kind of a produce failure, by the table in this module's documentation.
pub fn classify(error: &KafkaError) -> ErrorKind {
    let _ = error;
    todo!("H1")
}
