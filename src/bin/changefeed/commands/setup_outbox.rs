//! `changefeed setup-outbox`: creates or completes a claim outbox table on PostgreSQL (on
//! SQL Server and MariaDB/MySQL the bundle's own procedure does it, and the line says which).

use crate::args::SetupOutboxArgs;
use crate::database::{Connect, is_postgres};
use crate::failure::Failure;
use crate::output::Out;

/// Sets the outbox up on PostgreSQL, or says what to run elsewhere.
pub async fn setup_outbox(
    connect: &Connect,
    out: &mut Out,
    args: SetupOutboxArgs,
) -> Result<(), Failure> {
    if !is_postgres(&connect.url) {
        return Err(Failure::usage(format!(
            "setup-outbox takes a postgres:// --url; on SQL Server run exec \
             changefeed.setup_outbox @table_name = N'{0}', on MariaDB/MySQL call \
             changefeed_setup_outbox('{0}')",
            args.outbox
        )));
    }
    out.text(&postgres(connect, &args.outbox).await?)
}

#[cfg(feature = "postgres")]
async fn postgres(connect: &Connect, outbox: &str) -> Result<String, Failure> {
    use changefeed::Error;
    use changefeed::postgres::OutboxTable;

    use crate::database::postgres::{open, settings};

    let table: OutboxTable = outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let config = settings(connect)?;
    let client = open(connect, &config).await?;
    changefeed::postgres::setup_outbox(&client, &table)
        .await
        .map_err(|error| match error.server_number() {
            Some(_) => Failure::run(error.to_string()),
            // The bundle's function is missing: the bundle is not applied.
            None => Failure::run(format!(
                "{error} (is the PostgreSQL bundle applied? run `changefeed migrate` with \
                 the same --url)"
            )),
        })?;
    Ok(format!(
        "outbox {table} is ready (notify channel \"{}\")\n",
        table.channel()
    ))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_connect: &Connect, _outbox: &str) -> Result<String, Failure> {
    Err(Failure::without_postgres())
}
