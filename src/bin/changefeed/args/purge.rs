//! `purge`'s arguments.

use changefeed::Feed;
use clap::Args;

use super::values::{parse_feed, parse_max_rows, parse_u32_up_to};
use crate::duration::{CliDuration, parse_retention};

/// `purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// Delete rows whose ULID time is older than this, e.g. 30d (at most 100 years)
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        value_parser = parse_retention
    )]
    pub older_than: CliDuration,

    /// Only this shard (default: every shard)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub shard: Option<i32>,

    /// Also delete rows registered consumers have not read yet: they will get the
    /// cursor-expired error
    #[arg(long)]
    pub force: bool,

    /// Delete nothing; report what would go and what holds the rest back
    #[arg(long)]
    pub dry_run: bool,

    /// Rows per batch, each its own short transaction (1 to 50000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 5000,
        allow_hyphen_values = true,
        value_parser = parse_u32_up_to::<50_000>
    )]
    pub batch_size: u32,

    /// At most this many rows per shard
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = parse_max_rows
    )]
    pub max_rows: Option<u64>,
}
