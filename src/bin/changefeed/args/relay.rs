//! `relay`'s arguments.

use clap::Args;

use super::shared::ServiceArgs;
use super::values::{parse_brokers, parse_grace, parse_positive, parse_topic_affix};
use crate::duration::CliDuration;

/// What `relay --help` ends with: the two outputs, stopping, and the exit status.
pub const HELP: &str = "Without --brokers each message is printed as a JSON line. With \
    --brokers it is produced to the Kafka topic <topic-prefix><the row's topic> by an \
    idempotent producer (acks=all); a message that dies goes to that topic with \
    <dlq-suffix> after it. The brokers are checked first, then the database. A progress \
    line goes to standard error every --progress-interval unless --quiet. SIGINT or \
    SIGTERM stops the relay once the batch in flight is published and acknowledged; a \
    second signal stops it at once. Exit status: 0 stopped by a signal, 1 failed while \
    running (a fatal publish error), 2 bad arguments or no usable connection (brokers or \
    database), 130 stopped at once by a second signal.";

/// `relay`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct RelayArgs {
    /// The claim outbox: schema.table on SQL Server and PostgreSQL, a table name on
    /// MariaDB/MySQL
    #[arg(long, value_name = "TABLE")]
    pub outbox: String,

    /// Messages per claim
    #[arg(long, value_name = "N", default_value_t = 100, allow_hyphen_values = true,
        value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,

    /// Batches between claim and acknowledgement at once: the next batch is claimed while
    /// earlier ones are being delivered (per-aggregate order holds at any value; 1 claims,
    /// publishes and acknowledges one batch at a time)
    #[arg(long, value_name = "N", allow_hyphen_values = true,
        default_value_t = changefeed::relay::RelayConfig::DEFAULT_MAX_IN_FLIGHT,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(changefeed::relay::MAX_IN_FLIGHT)))]
    pub max_in_flight: u32,

    /// Publish to the Kafka cluster at these bootstrap brokers instead of printing JSON
    /// lines (needs the `kafka` feature)
    #[arg(long, value_name = "HOST:PORT,...", value_parser = parse_brokers)]
    pub brokers: Option<String>,

    /// Put before every outbox row's topic to make the Kafka topic (needs --brokers)
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "",
        requires = "brokers",
        value_parser = parse_topic_affix
    )]
    pub topic_prefix: String,

    /// Dead letters go to the message's Kafka topic with this after it (needs --brokers)
    #[arg(
        long,
        value_name = "SUFFIX",
        default_value = ".dlq",
        requires = "brokers",
        value_parser = parse_topic_affix
    )]
    pub dlq_suffix: String,

    /// After the first SIGINT or SIGTERM, how long the batches in flight may take to finish
    /// before the relay exits anyway (130; their messages are claimed again after the claim
    /// timeout)
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_grace
    )]
    pub shutdown_grace: CliDuration,

    /// With --metrics-addr: how often to read the outbox's backlog (counts by status, the
    /// oldest open message's age) for the changefeed_outbox_* gauges
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "15s",
        requires = "metrics_addr",
        value_parser = parse_positive
    )]
    pub backlog_interval: CliDuration,

    #[command(flatten)]
    pub service: ServiceArgs,
}
