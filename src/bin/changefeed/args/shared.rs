//! The options several subcommands share: the Kafka producer's, the progress line's and
//! the metrics endpoint's (`relay` and `export`, as one [`ServiceArgs`]), and the page size
//! (`tail` and `export`).

use clap::Args;

use super::values::{
    parse_interval, parse_metrics_addr, parse_positive, parse_setting, parse_timeout,
    parse_u32_up_to,
};
use crate::duration::CliDuration;

/// What `relay` and `export`, which run until a signal, both take: the Kafka producer's
/// options, the progress line's and the metrics endpoint's, in that order in `--help`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct ServiceArgs {
    #[command(flatten)]
    pub producer: ProducerArgs,

    #[command(flatten)]
    pub progress: ProgressArgs,

    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// The metrics endpoint's options (part of [`ServiceArgs`]).
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus text on http://HOST:PORT/metrics, and /healthz and /readyz (off
    /// unless given; port 0 picks a free port, printed on the start line)
    #[arg(
        long,
        value_name = "HOST:PORT",
        value_parser = parse_metrics_addr
    )]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// With --metrics-addr: /readyz answers 503 once the last successful claim (relay) or
    /// read of every shard (export) is older than this
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "60s",
        requires = "metrics_addr",
        value_parser = parse_positive
    )]
    pub ready_within: CliDuration,
}

/// The Kafka producer's options (part of [`ServiceArgs`]).
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct ProducerArgs {
    /// A librdkafka producer setting, e.g. -X security.protocol=SASL_SSL; repeat it for
    /// more. enable.idempotence and acks=all cannot be turned off
    #[arg(
        short = 'X',
        long = "producer-setting",
        value_name = "KEY=VALUE",
        value_parser = parse_setting
    )]
    pub settings: Vec<(String, String)>,

    /// How long to wait for a broker to answer before giving up, first thing
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        allow_hyphen_values = true,
        value_parser = parse_timeout
    )]
    pub broker_timeout: CliDuration,
}

/// The progress line's options (part of [`ServiceArgs`]).
#[derive(Debug, Args)]
pub struct ProgressArgs {
    /// How often to print the progress line on standard error
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        allow_hyphen_values = true,
        value_parser = parse_interval
    )]
    pub progress_interval: CliDuration,

    /// Print nothing on standard error but errors: no start line, no progress lines
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl ProgressArgs {
    /// How often to print the progress line: `None` with --quiet.
    pub fn every(&self) -> Option<std::time::Duration> {
        (!self.quiet).then_some(self.progress_interval.value)
    }
}

/// The page size, shared by `tail` and `export`.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// Rows per read_feed call (1 to 10000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true,
        value_parser = parse_u32_up_to::<10_000>
    )]
    pub page_size: u32,
}
