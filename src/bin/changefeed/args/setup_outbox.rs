//! `setup-outbox`'s arguments.

use clap::Args;

/// `setup-outbox`.
#[derive(Debug, Args)]
pub struct SetupOutboxArgs {
    /// The outbox table, as schema.table (checked by the server's rule)
    #[arg(value_name = "SCHEMA.TABLE")]
    pub outbox: String,
}
