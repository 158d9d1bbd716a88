//! `export`'s arguments.

use changefeed::Feed;
use clap::Args;

use super::shared::{PageArgs, ServiceArgs};
use super::start_at::{StartAt, parse_from};
use super::values::{parse_brokers, parse_consumer, parse_feed, parse_topic};

/// What `export --help` ends with: cursors, stopping, and the exit status.
pub const HELP: &str = "The cursor of each shard is saved under --consumer \
    (changefeed.consumer_cursor) only once every message of a page is acknowledged, so a \
    restart resumes after the last saved page (at least once: a page in flight when the \
    process died is produced again). The brokers are checked first, then the database. A \
    progress line goes to standard error every --progress-interval unless --quiet: events \
    exported and their rate, how far the furthest-behind shard is from the feed's head, \
    and the last ULID. SIGINT or SIGTERM stops the export once the page in flight is \
    acknowledged and its cursor saved; a second signal stops it at once. Exit status: 0 \
    stopped by a signal, 1 failed while running (a fatal produce error, a read error), 2 \
    bad arguments or no usable connection (brokers or database), 130 stopped at once by a \
    second signal.";

/// `export`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct ExportArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// The Kafka cluster's bootstrap brokers
    #[arg(long, value_name = "HOST:PORT,...", value_parser = parse_brokers)]
    pub brokers: String,

    /// The Kafka topic every event goes to: key the event's primary-key columns as JSON,
    /// value every column of the event row as JSON, headers ulid (its position), shard and feed
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic)]
    pub topic: String,

    /// The consumer name the cursors are saved under (changefeed.consumer_cursor); one
    /// name per export job
    #[arg(long, value_name = "NAME", value_parser = parse_consumer)]
    pub consumer: String,

    /// The shards to export, e.g. 0,2 (default: every shard the feed has when the export
    /// starts, as changefeed status shows them; on PostgreSQL every shard of its fixed
    /// count)
    #[arg(
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub shards: Vec<i32>,

    /// Where a shard with no saved cursor starts: `start` (the oldest retained event),
    /// `now`, a ULID cursor (the events after it) or an RFC 3339 time. A shard with a
    /// cursor saved under --consumer resumes after it: the saved cursor wins
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "start",
        allow_hyphen_values = true,
        value_parser = parse_from
    )]
    pub from: StartAt,

    #[command(flatten)]
    pub page: PageArgs,

    #[command(flatten)]
    pub service: ServiceArgs,
}
