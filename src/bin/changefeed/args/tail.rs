//! `tail`'s arguments.

use changefeed::Feed;
use clap::Args;

use super::shared::PageArgs;
use super::start_at::{StartAt, parse_from};
use super::values::parse_feed;

/// `tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// The shard to follow
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub shard: i32,

    /// Where to start: `start` (the oldest retained event), `now` (events from now on, by
    /// this machine's clock), a ULID cursor (the events after it) or an RFC 3339 time such
    /// as 2024-05-01T12:00:00Z (the events of that time and later)
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "start",
        allow_hyphen_values = true,
        value_parser = parse_from
    )]
    pub from: StartAt,

    /// Print every column of each event (SQL Server: read_feed @with_event = 1;
    /// PostgreSQL: read_events_<id>), not only its key
    #[arg(long)]
    pub with_event: bool,

    #[command(flatten)]
    pub page: PageArgs,
}
