//! `setup-feed`'s arguments.

use changefeed::Feed;
use clap::{ArgGroup, Args};

use super::values::{parse_column, parse_feed};

/// `setup-feed`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["outbox", "serialize_writers"])))]
pub struct SetupFeedArgs {
    /// The event table, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// Outbox mode: writers insert the event's key into the feed's outbox and never wait
    /// for each other
    #[arg(long)]
    pub outbox: bool,

    /// Serialized-writer mode: writers of a shard take turns and know the event's ULID at
    /// write time (needs --shard-column and --ulid-column)
    #[arg(long, requires_all = ["shard_column", "ulid_column"])]
    pub serialize_writers: bool,

    /// Serialized-writer mode: the event table's int shard column
    #[arg(
        long,
        value_name = "COLUMN",
        requires = "serialize_writers",
        conflicts_with = "outbox",
        value_parser = parse_column
    )]
    pub shard_column: Option<String>,

    /// Serialized-writer mode: the event table's binary(16) ULID column
    #[arg(
        long,
        value_name = "COLUMN",
        requires = "serialize_writers",
        conflicts_with = "outbox",
        value_parser = parse_column
    )]
    pub ulid_column: Option<String>,
}
