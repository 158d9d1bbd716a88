//! `setup-feed`'s arguments (SQL Server and PostgreSQL).

use changefeed::Feed;
use clap::{ArgGroup, Args};

use super::values::{parse_column, parse_feed, parse_u32_up_to};

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

    /// The event table's integer shard column: serialized-writer mode; on PostgreSQL
    /// also outbox mode (each row's shard; SQL Server's writers name it in the outbox row)
    #[arg(long, value_name = "COLUMN", value_parser = parse_column)]
    pub shard_column: Option<String>,

    /// The event table's ULID column (binary(16) on SQL Server, bytea on PostgreSQL):
    /// serialized-writer mode
    #[arg(
        long,
        value_name = "COLUMN",
        requires = "serialize_writers",
        conflicts_with = "outbox",
        value_parser = parse_column
    )]
    pub ulid_column: Option<String>,

    /// PostgreSQL only: the feed's number of shards, fixed at setup (1 to 1048576; more
    /// than 1 needs --shard-column). SQL Server's feeds have no fixed count
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = parse_u32_up_to::<1_048_576>)]
    pub shards: Option<u32>,
}
