//! To Kafka (feature `kafka`): [`KafkaPublisher`], the relay's publisher for a claim outbox,
//! and [`FeedExporter`], which produces a feed's events to a topic and keeps its cursor.
//!
//! Both produce through one idempotent librdkafka producer ([`ProducerSettings`]:
//! `enable.idempotence=true`, `acks=all`, any other librdkafka setting passed through) and
//! judge every delivery report with [`classify`], whose table is the contract between
//! librdkafka's errors and what the relay or exporter does about them.

mod classify;
mod exporter;
mod producer;
mod publisher;

pub use classify::classify;
pub use exporter::{
    ExportConfig, ExportCursors, ExportEvent, ExportProgress, ExportReport, FeedExporter,
    HEADER_FEED, HEADER_SHARD, HEADER_ULID, JsonValues, ProgressSnapshot, SqlCursors,
    ValueSerializer, export_headers,
};
pub use producer::{ProducerSettings, check_brokers};
pub use publisher::{
    HEADER_MESSAGE_ID, HEADER_PUBLISH_ATTEMPTS, HEADER_TRACE_ID, HEADER_TRACEPARENT,
    HEADER_VALUE_OMITTED, KafkaPublisher, KafkaPublisherConfig,
};

/// The rdkafka this crate was built with, for its `ClientConfig`, `FutureProducer` and
/// `mocking::MockCluster`.
pub use rdkafka;
