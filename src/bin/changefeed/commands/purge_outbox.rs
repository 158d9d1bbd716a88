//! `changefeed purge-outbox`: deletes a claim outbox's done messages older than a cutoff,
//! in batches, with the store's own purge (`purge_done` on SQL Server, `purge_done` of the
//! PostgreSQL and MariaDB/MySQL stores); dead ones are kept.

use changefeed::outbox_store::OutboxStore;
use changefeed::{Error, TableName};

use crate::args::PurgeOutboxArgs;
use crate::database::{Connect, Store, require_outbox};
use crate::failure::Failure;
use crate::output::{Out, plural};

/// Purges and prints how many went.
pub async fn purge_outbox(
    connect: &Connect,
    out: &mut Out,
    args: PurgeOutboxArgs,
) -> Result<(), Failure> {
    let (deleted, table) = match Store::of(&connect.url) {
        Store::SqlServer => sql_server(connect, &args).await?,
        Store::Postgres => postgres(connect, &args).await?,
        Store::Mysql => mysql(connect, &args).await?,
    };
    out.line(&format!(
        "deleted {} older than {} from {table}",
        plural(deleted, "done message", "done messages"),
        args.older_than
    ))
}

/// A name the store's rule refuses: a usage error, before anything connects.
fn bad_name(error: Error) -> Failure {
    Failure::usage(error.to_string())
}

async fn sql_server(connect: &Connect, args: &PurgeOutboxArgs) -> Result<(u64, String), Failure> {
    let table: TableName = args.table.parse().map_err(bad_name)?;
    let mut client = connect.open(None).await?;
    require_outbox(&mut client, &table, "purge_done").await?;
    let outbox = OutboxStore::new(table.clone());
    let deleted = outbox
        .purge_done(
            &mut client,
            args.older_than.value,
            args.batch_size,
            args.max_rows,
        )
        .await?;
    Ok((deleted, table.to_string()))
}

/// The line for a purge of a table that is not there (or not an outbox): what to run.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn not_an_outbox(table: &str, error: &Error) -> Failure {
    Failure::run(format!(
        "{error} ({table} is not a claim outbox in this database? create it with \
         `changefeed setup-outbox {table}` with the same --url)"
    ))
}

#[cfg(feature = "postgres")]
async fn postgres(connect: &Connect, args: &PurgeOutboxArgs) -> Result<(u64, String), Failure> {
    use changefeed::postgres::{OutboxTable, PostgresOutboxStore};

    use crate::database::postgres::settings;

    let table: OutboxTable = args.table.parse().map_err(bad_name)?;
    let config = settings(connect)?;
    // One plain connection first: an unreachable server is a connection failure (status
    // 2), not a failed purge.
    drop(crate::database::postgres::open(connect, &config).await?);
    let mut store = PostgresOutboxStore::new(table.clone(), config);
    let deleted = store
        .purge_done(args.older_than.value, args.batch_size, args.max_rows)
        .await
        .map_err(|error| match &error {
            // undefined_table, undefined_column: not an outbox.
            Error::Postgres { state, .. } if matches!(state.as_str(), "42P01" | "42703") => {
                not_an_outbox(&table.to_string(), &error)
            }
            _ => Failure::from(error),
        })?;
    Ok((deleted, table.to_string()))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &Connect, _: &PurgeOutboxArgs) -> Result<(u64, String), Failure> {
    Err(Failure::without_postgres())
}

#[cfg(feature = "mysql")]
async fn mysql(connect: &Connect, args: &PurgeOutboxArgs) -> Result<(u64, String), Failure> {
    use changefeed::mysql::{MysqlOutboxStore, OutboxTable};

    use crate::database::open_mysql;

    let table: OutboxTable = args.table.parse().map_err(bad_name)?;
    // One plain connection first: an unreachable server is a connection failure (status
    // 2), not a failed purge.
    let (opts, conn) = open_mysql(connect).await?;
    conn.disconnect().await.ok();
    let mut store = MysqlOutboxStore::new(table.clone(), opts).connect_timeout(connect.timeout);
    let deleted = store
        .purge_done(args.older_than.value, args.batch_size, args.max_rows)
        .await
        .map_err(|error| match &error {
            // ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR: not an outbox.
            Error::Mysql {
                code: 1146 | 1054, ..
            } => not_an_outbox(table.name(), &error),
            _ => Failure::from(error),
        })?;
    Ok((deleted, table.name().to_owned()))
}

#[cfg(not(feature = "mysql"))]
async fn mysql(_: &Connect, _: &PurgeOutboxArgs) -> Result<(u64, String), Failure> {
    Err(Failure::without_mysql())
}
