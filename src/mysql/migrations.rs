//! The MariaDB/MySQL bundle in `mysql/`, embedded at compile time and applied with refinery.
//!
//! ```no_run
//! # async fn run() -> changefeed::Result<()> {
//! use changefeed::mysql::{OutboxTable, migrate, setup_outbox};
//!
//! let url = "mysql://app:secret@localhost:3306/app";
//! let pool = mysql_async::Pool::new(changefeed::mysql::opts(url)?);
//! migrate(&pool).await?;
//! let mut conn = pool.get_conn().await?;
//! setup_outbox(&mut conn, &"outbox".parse::<OutboxTable>()?).await?;
//! # Ok(()) }
//! ```

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool};

use super::table::OutboxTable;
use crate::error::{Error, Result, find_cause};

mod embedded {
    refinery::embed_migrations!("mysql");
}

/// refinery's history table for the bundle; not refinery's default, so an application's own
/// refinery migrations in the same database keep a separate history. The SQL Server bundle
/// uses the same name (`crate::migrations::HISTORY_TABLE`).
pub const HISTORY_TABLE: &str = crate::migrations::HISTORY_TABLE;

/// A refinery runner over the embedded MariaDB/MySQL bundle, recording into
/// [`HISTORY_TABLE`].
pub fn runner() -> refinery::Runner {
    crate::migrations::with_history(embedded::migrations::runner())
}

/// The embedded migrations as `(version, name)`, in version order.
pub fn bundle() -> Vec<(i32, String)> {
    crate::migrations::versions(&runner())
}

/// Applies every migration of the bundle that the database (the pool's) does not have yet:
/// the procedures `changefeed_check_table_name`, `changefeed_add_index` and
/// `changefeed_setup_outbox`, and the table `changefeed_aggregate_locks` that
/// [`enqueue`](super::enqueue) locks an aggregate in. Run it before your own migrations that
/// call `changefeed_setup_outbox`; after an upgrade of the bundle, call
/// `changefeed_setup_outbox` again for each outbox (it adds what a newer version needs).
pub async fn migrate(pool: &Pool) -> Result<refinery::Report> {
    let mut pool = pool.clone();
    runner().run_async(&mut pool).await.map_err(from_refinery)
}

/// Creates the outbox table `table` in the connection's database, or completes an existing
/// one (`CALL changefeed_setup_outbox(?)`): the same as calling the procedure from a SQL
/// migration of yours. Fails with error 51306 when an existing table lacks columns.
pub async fn setup_outbox(conn: &mut Conn, table: &OutboxTable) -> Result<()> {
    conn.exec_drop("call changefeed_setup_outbox(?)", (table.name(),))
        .await?;
    Ok(())
}

/// Keeps the server's error (code, message) when refinery wraps one.
fn from_refinery(error: refinery::Error) -> Error {
    let server = find_cause(&error, |cause| match cause.downcast_ref() {
        Some(mysql_async::Error::Server(server)) => Some(server),
        _ => None,
    });
    match server {
        Some(server) => Error::Mysql {
            code: server.code,
            state: server.state.clone(),
            message: format!("{} (while applying: {error})", server.message),
        },
        None => Error::Migration(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_mysql_is_embedded_in_version_order() {
        crate::migrations::assert_embedded("mysql", &bundle());
    }

    /// The released migrations of `mysql/`: version, name and refinery's checksum (of name,
    /// version and SQL text). refinery refuses to migrate a database where an applied
    /// migration's name or checksum changed, so these files are frozen: a change to the
    /// bundle is a new file after the last one here (as `sql/` is guarded by
    /// tests/frozen_migrations.rs). Add a file here when it is released.
    const RELEASED: [(i32, &str, u64); 4] = [
        (1, "create_procedure_check_table_name", 14136909801136890283),
        (2, "create_procedure_add_index", 8780334261401610948),
        (3, "create_procedure_setup_outbox", 16270080375401892267),
        (4, "aggregate_locks_and_claim_expiry", 7300041637610772874),
    ];

    #[test]
    fn released_migrations_are_unchanged() {
        crate::migrations::assert_released("mysql", runner().get_migrations(), &RELEASED);
    }
}
