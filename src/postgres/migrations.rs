//! The PostgreSQL bundle in `postgres/`, embedded at compile time and applied with
//! refinery.
//!
//! ```no_run
//! # async fn run() -> changefeed::Result<()> {
//! use changefeed::postgres::{OutboxTable, connect, config, migrate, setup_outbox};
//!
//! let mut client = connect(&config("postgres://app:secret@localhost:5432/app")?).await?;
//! migrate(&mut client).await?;
//! setup_outbox(&client, &"public.outbox".parse::<OutboxTable>()?).await?;
//! # Ok(()) }
//! ```

use tokio_postgres::Client;

use super::connection::{CALL_TIMEOUT, SERVER};
use super::table::OutboxTable;
use crate::error::{Error, Result, find_cause};
use crate::outbox_backend::bounded;

mod embedded {
    refinery::embed_migrations!("postgres");
}

/// refinery's history table for the bundle, the same name as the other bundles' (in the
/// first schema of the connection's `search_path`), so that an application's own refinery
/// migrations keep a separate history.
pub const HISTORY_TABLE: &str = crate::migrations::HISTORY_TABLE;

/// A refinery runner over the embedded PostgreSQL bundle, recording into
/// [`HISTORY_TABLE`]. Each migration runs in its own transaction.
pub fn runner() -> refinery::Runner {
    crate::migrations::with_history(embedded::migrations::runner())
}

/// The embedded migrations as `(version, name)`, in version order.
pub fn bundle() -> Vec<(i32, String)> {
    crate::migrations::versions(&runner())
}

/// Applies every migration of the bundle that the database does not have yet: the schema
/// `changefeed` with the claim outbox's functions (`setup_outbox` and its triggers) and the
/// feed's (`setup_feed`, `feed_info`, `save_cursor`, `purge_feed`, the views `feed_status`
/// and `consumer_lag`, …). Run it before your own migrations that call
/// `changefeed.setup_outbox` or `changefeed.setup_feed`.
pub async fn migrate(client: &mut Client) -> Result<refinery::Report> {
    runner().run_async(client).await.map_err(from_refinery)
}

/// Creates the outbox table `table`, or completes an existing one (`select
/// changefeed.setup_outbox($1)`): the same as calling the function from a SQL migration of
/// yours. Fails with SQLSTATE CF306 (number 51306) when an existing table lacks columns.
pub async fn setup_outbox(client: &Client, table: &OutboxTable) -> Result<()> {
    bounded(SERVER, CALL_TIMEOUT, "changefeed.setup_outbox", async {
        client
            .execute("select changefeed.setup_outbox($1::text)", &[&table.name()])
            .await?;
        Ok(())
    })
    .await
}

/// Keeps the server's error (SQLSTATE, message) when refinery wraps one.
fn from_refinery(error: refinery::Error) -> Error {
    let db = find_cause(&error, |cause| {
        cause
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
    });
    match db.map(Error::from_postgres) {
        Some(Error::Postgres { state, message }) => Error::Postgres {
            state,
            message: format!("{message} (while applying: {error})"),
        },
        Some(other) => other,
        None => Error::Migration(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_postgres_is_embedded_in_version_order() {
        crate::migrations::assert_embedded("postgres", &bundle());
    }

    /// The released migrations of `postgres/`: version, name and refinery's checksum (of
    /// name, version and SQL text). refinery refuses to migrate a database where an applied
    /// migration's name or checksum changed, so these files are frozen: a change to the
    /// bundle is a new file after the last one here (as `mysql/` is pinned in
    /// src/mysql/migrations.rs and `sql/` by tests/frozen_migrations.rs). Add a file here
    /// when it is released.
    const RELEASED: [(i32, &str, u64); 4] = [
        (1, "create_function_check_outbox_name", 6383792943835012964),
        (2, "create_function_order_aggregate", 6999478900129027596),
        (3, "create_function_notify", 6208870227541648096),
        (4, "create_function_setup_outbox", 40441773380668834),
    ];

    #[test]
    fn released_migrations_are_unchanged() {
        crate::migrations::assert_released("postgres", runner().get_migrations(), &RELEASED);
    }
}
