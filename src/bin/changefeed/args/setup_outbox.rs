//! `setup-outbox`'s arguments.

use clap::Args;

/// `setup-outbox`.
#[derive(Debug, Args)]
pub struct SetupOutboxArgs {
    /// The outbox table: schema.table on SQL Server and PostgreSQL (checked by the server's
    /// rule; lower case on PostgreSQL), a table name on MariaDB/MySQL (in the URL's database)
    #[arg(value_name = "TABLE")]
    pub outbox: String,

    /// SQL Server only: keep payload and headers in the native json type (SQL Server 2025,
    /// Azure SQL) instead of nvarchar(max) checked by ISJSON
    #[arg(long)]
    pub native_json: bool,
}
