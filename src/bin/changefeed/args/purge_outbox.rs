//! `purge-outbox`'s arguments.

use clap::Args;

use super::values::{parse_max_rows, parse_u32_up_to};
use crate::duration::{CliDuration, parse_retention};

/// `purge-outbox`.
#[derive(Debug, Args)]
pub struct PurgeOutboxArgs {
    /// The claim outbox table (made by setup-outbox): schema.table on SQL Server and
    /// PostgreSQL, a table name on MariaDB/MySQL (checked by the store's rule before
    /// anything connects)
    #[arg(value_name = "TABLE")]
    pub table: String,

    /// Delete done messages processed longer ago than this, e.g. 7d (at most 100 years)
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        value_parser = parse_retention
    )]
    pub older_than: CliDuration,

    /// Rows per delete statement (1 to 4000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true,
        value_parser = parse_u32_up_to::<4000>
    )]
    pub batch_size: u32,

    /// At most this many messages in all
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = parse_max_rows
    )]
    pub max_rows: Option<u64>,
}
