//! `changefeed setup-outbox`: creates or completes a claim outbox table with the bundle's
//! own procedure, on the store the URL names (`changefeed.setup_outbox` on SQL Server and
//! PostgreSQL, `changefeed_setup_outbox` on MariaDB/MySQL). It never drops data.

use std::time::Duration;

use changefeed::{Error, TableName};

use crate::args::SetupOutboxArgs;
use crate::database::{Connect, Store, with_migrate_hint};
use crate::failure::Failure;
use crate::output::Out;

/// How long the setup may take on SQL Server and MariaDB/MySQL: completing an existing
/// table builds its indexes, which on a large table takes minutes, not the seconds of a
/// claim. (PostgreSQL's is bounded by the library's call bound.)
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// Sets the outbox up and says it is ready.
pub async fn setup_outbox(
    connect: &Connect,
    out: &mut Out,
    args: SetupOutboxArgs,
) -> Result<(), Failure> {
    let store = Store::of(&connect.url);
    if args.native_json && store != Store::SqlServer {
        return Err(Failure::usage(format!(
            "--native-json is for SQL Server; on {} the outbox's payload type is fixed by \
             its bundle (drop --native-json)",
            store.name()
        )));
    }
    let text = match store {
        Store::SqlServer => sql_server(connect, &args).await?,
        Store::Postgres => postgres(connect, &args.outbox).await?,
        Store::Mysql => mysql(connect, &args.outbox).await?,
    };
    out.text(&text)
}

/// `exec changefeed.setup_outbox @table_name, @native_json`.
async fn sql_server(connect: &Connect, args: &SetupOutboxArgs) -> Result<String, Failure> {
    let table: TableName = args
        .outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let name = table.to_string();
    let mut client = connect.open(Some(SETUP_TIMEOUT)).await?;
    client
        .execute(
            "exec changefeed.setup_outbox @table_name = @P1, @native_json = @P2",
            &[&name, &args.native_json],
        )
        .await
        .map_err(|error| with_migrate_hint(Error::from(error)))?;
    // The roles grant_outbox_roles creates (docs/sql-server.md, "Roles").
    Ok(format!(
        "outbox {table} is ready\n  writers: exec {} in the business transaction (role \
         [changefeed.enqueue:{table}])\n  relay: changefeed relay --outbox {table} (role \
         [changefeed.relay:{table}])\n",
        table.object("enqueue")
    ))
}

#[cfg(feature = "postgres")]
async fn postgres(connect: &Connect, outbox: &str) -> Result<String, Failure> {
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

/// `call changefeed_setup_outbox(?)` in the URL's database.
#[cfg(feature = "mysql")]
async fn mysql(connect: &Connect, outbox: &str) -> Result<String, Failure> {
    use changefeed::mysql::OutboxTable;

    use crate::database::open_mysql;

    let table: OutboxTable = outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let (_, mut conn) = open_mysql(connect).await?;
    let done = tokio::time::timeout(
        SETUP_TIMEOUT,
        changefeed::mysql::setup_outbox(&mut conn, &table),
    )
    .await;
    conn.disconnect().await.ok();
    let done = done.map_err(|_| {
        Failure::run(format!(
            "changefeed_setup_outbox('{}'): MariaDB/MySQL did not answer within \
             {SETUP_TIMEOUT:?}",
            table.name()
        ))
    })?;
    done.map_err(|error| match &error {
        // ER_SP_DOES_NOT_EXIST: the bundle is not applied.
        Error::Mysql { code: 1305, .. } => Failure::run(format!(
            "{error} (the MariaDB/MySQL bundle is not applied to this database: apply it with \
             changefeed migrate, or changefeed::mysql::migrate from Rust)"
        )),
        _ => Failure::run(error.to_string()),
    })?;
    Ok(format!("outbox {} is ready\n", table.name()))
}

#[cfg(not(feature = "mysql"))]
async fn mysql(_connect: &Connect, _outbox: &str) -> Result<String, Failure> {
    Err(Failure::without_mysql())
}
