//! `status`'s arguments.

use clap::Args;

/// `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Also show every registered consumer and how far behind it is
    /// (changefeed.consumer_lag)
    #[arg(long)]
    pub consumers: bool,

    /// Print one JSON object instead of tables: feeds, outboxes (with SQL Server's
    /// held_aggregates) and, with --consumers, consumers
    #[arg(long)]
    pub json: bool,
}
