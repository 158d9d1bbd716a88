//! The SQL bundle in `sql/`, embedded at compile time and applied with refinery.
//!
//! ```no_run
//! # async fn run(client: &mut changefeed::Client) -> changefeed::Result<()> {
//! let report = changefeed::migrations::migrate(client).await?;
//! println!("applied {} changefeed migrations", report.applied_migrations().len());
//! # Ok(()) }
//! ```

use futures::{AsyncRead, AsyncWrite};

use crate::error::{Error, Result};

mod embedded {
    refinery::embed_migrations!("sql");
}

/// refinery's history table for the changefeed bundle. It is not refinery's default, so an
/// application that runs its own refinery migrations (whose versions also start at 1) in
/// the same database keeps a separate history.
pub const HISTORY_TABLE: &str = "changefeed_schema_history";

/// A refinery runner over the embedded bundle, recording into [`HISTORY_TABLE`].
/// Each migration runs in its own transaction (refinery's default).
pub fn runner() -> refinery::Runner {
    with_history(embedded::migrations::runner())
}

/// `runner`, recording into [`HISTORY_TABLE`] (both bundles do).
pub(crate) fn with_history(mut runner: refinery::Runner) -> refinery::Runner {
    runner.set_migration_table_name(HISTORY_TABLE);
    runner
}

/// The embedded migrations as `(version, name)`, in version order.
pub fn bundle() -> Vec<(i32, String)> {
    versions(&runner())
}

/// A runner's migrations as `(version, name)`, in version order.
pub(crate) fn versions(runner: &refinery::Runner) -> Vec<(i32, String)> {
    let mut list: Vec<(i32, String)> = runner
        .get_migrations()
        .iter()
        .map(|m| (m.version(), m.name().to_owned()))
        .collect();
    list.sort();
    list
}

/// Checks that every `.sql` file of `folder` (under the crate's root) is embedded in
/// `bundle`, with versions contiguous from 1.
#[cfg(test)]
pub(crate) fn assert_embedded(folder: &str, bundle: &[(i32, String)]) {
    let on_disk = std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(folder))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count();
    assert_eq!(bundle.len(), on_disk, "every file in {folder}/ is embedded");
    for (index, (version, name)) in bundle.iter().enumerate() {
        assert_eq!(
            *version as usize,
            index + 1,
            "versions must be contiguous from 1"
        );
        assert!(!name.is_empty());
    }
}

/// Applies every migration of the bundle that the database does not have yet.
///
/// Run it before your own migrations that call `changefeed.setup_feed`. A migration that
/// fails is rolled back, and the error keeps SQL Server's error number.
pub async fn migrate<S>(client: &mut tiberius::Client<S>) -> Result<refinery::Report>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    runner().run_async(client).await.map_err(from_refinery)
}

/// Keeps the server's error (number, message) when refinery wraps one.
fn from_refinery(error: refinery::Error) -> Error {
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        if let Some(Error::Server {
            number,
            state,
            class,
            message,
        }) = cause
            .downcast_ref::<tiberius::error::Error>()
            .map(|e| Error::from(clone_tiberius(e)))
        {
            return Error::Server {
                number,
                state,
                class,
                message: format!("{message} (while applying: {error})"),
            };
        }
        source = cause.source();
    }
    Error::Migration(error.to_string())
}

/// tiberius errors are not Clone; only a server error's fields matter here.
fn clone_tiberius(error: &tiberius::error::Error) -> tiberius::error::Error {
    match error {
        tiberius::error::Error::Server(token) => tiberius::error::Error::Server(token.clone()),
        other => tiberius::error::Error::Protocol(other.to_string().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_sql_is_embedded_in_version_order() {
        assert_embedded("sql", &bundle());
    }

    #[test]
    fn the_history_table_is_ours() {
        assert_ne!(HISTORY_TABLE, "refinery_schema_history");
    }
}
