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

/// The lowest database compatibility level the bundle runs under: `mark_done` of a claim
/// outbox reads its ids with OPENJSON, which SQL Server only knows at level 130 and above
/// (SQL Server 2017–2022 accept databases at lower levels).
pub const MIN_COMPATIBILITY_LEVEL: i32 = 130;

/// Decides whether a database at compatibility `level` can take the bundle; the error names
/// the database and the statement that fixes it.
///
/// ```
/// use changefeed::migrations::check_compatibility_level;
///
/// assert!(check_compatibility_level("app", 160).is_ok());
/// let error = check_compatibility_level("app", 120).unwrap_err();
/// assert!(error.to_string().contains("alter database [app] set compatibility_level = 130"));
/// ```
pub fn check_compatibility_level(database: &str, level: i32) -> Result<()> {
    if level >= MIN_COMPATIBILITY_LEVEL {
        return Ok(());
    }
    Err(Error::Migration(format!(
        "the database {database:?} is at compatibility level {level}, and the changefeed \
         bundle needs {MIN_COMPATIBILITY_LEVEL} or higher (OPENJSON). Nothing was applied. \
         Raise it first: alter database [{}] set compatibility_level = {MIN_COMPATIBILITY_LEVEL};",
        database.replace(']', "]]")
    )))
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

/// Checks that each released migration of `folder` (version, name, refinery's checksum of
/// name, version and SQL text) is still embedded unchanged in `migrations`. refinery refuses
/// to migrate a database where an applied migration's name or checksum changed, so released
/// files are frozen: a change is a new file after the last released one.
#[cfg(all(test, any(feature = "mysql", feature = "postgres")))]
pub(crate) fn assert_released(
    folder: &str,
    migrations: &[refinery::Migration],
    released: &[(i32, &str, u64)],
) {
    for &(version, name, checksum) in released {
        let found = migrations
            .iter()
            .find(|m| m.version() == version)
            .unwrap_or_else(|| panic!("{folder}/V{version}__{name}.sql was removed"));
        assert_eq!(
            (found.name(), found.checksum()),
            (name, checksum),
            "{folder}/V{version}__{name}.sql is released and frozen: restore it and make the \
             change in a new migration after the last released one"
        );
    }
}

/// Applies every migration of the bundle that the database does not have yet.
///
/// Run it before your own migrations that call `changefeed.setup_feed`. A database below
/// compatibility level [`MIN_COMPATIBILITY_LEVEL`] is refused before anything is applied
/// ([`check_compatibility_level`]). A migration that fails is rolled back, and the error
/// keeps SQL Server's error number.
pub async fn migrate<S>(client: &mut tiberius::Client<S>) -> Result<refinery::Report>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (database, level) = compatibility_level(client).await?;
    check_compatibility_level(&database, level)?;
    runner().run_async(client).await.map_err(from_refinery)
}

/// The current database's name and compatibility level.
async fn compatibility_level<S>(client: &mut tiberius::Client<S>) -> Result<(String, i32)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let row = client
        .simple_query(
            "select db_name(), convert(int, compatibility_level) \
             from sys.databases where database_id = db_id();",
        )
        .await?
        .into_row()
        .await?
        .ok_or_else(|| Error::Migration("sys.databases has no row for this database".into()))?;
    let database = row
        .try_get::<&str, usize>(0)?
        .unwrap_or_default()
        .to_owned();
    let level = row
        .try_get::<i32, usize>(1)?
        .ok_or_else(|| Error::Migration("the database has no compatibility level".into()))?;
    Ok((database, level))
}

/// Applies the migrations of the bundle up to and including `version`, and none after it;
/// migrations the database already has are skipped, as in [`migrate`].
///
/// [`migrate`] is what applications call. This one stops a database at an earlier release
/// of the bundle: the upgrade test (`tests/live_upgrade.rs`) builds a database as an older
/// release left it, then runs [`migrate`] to check that the newest release upgrades it.
/// `version` must be one of the bundle's versions (see [`bundle`]); anything else is
/// [`Error::Config`], naming the range.
///
/// ```no_run
/// # async fn run(client: &mut changefeed::Client) -> changefeed::Result<()> {
/// changefeed::migrations::migrate_to(client, 49).await?; // as release 0.1 left it
/// changefeed::migrations::migrate(client).await?; // the newest release
/// # Ok(()) }
/// ```
pub async fn migrate_to<S>(
    client: &mut tiberius::Client<S>,
    version: i32,
) -> Result<refinery::Report>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    check_target(version, newest_version())?;
    let (database, level) = compatibility_level(client).await?;
    check_compatibility_level(&database, level)?;
    runner()
        .set_target(refinery::Target::Version(version))
        .run_async(client)
        .await
        .map_err(from_refinery)
}

/// The highest version of the embedded bundle.
pub fn newest_version() -> i32 {
    bundle().last().map_or(0, |(version, _)| *version)
}

/// A target version must be a version of the bundle: refinery would silently treat a
/// higher one as "everything", and versions start at 1.
fn check_target(version: i32, newest: i32) -> Result<()> {
    if (1..=newest).contains(&version) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "cannot migrate to version {version}: the changefeed bundle has versions 1 to \
             {newest}; pass one of them (or call migrate for the newest)"
        )))
    }
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
    fn compatibility_level_130_and_above_is_accepted() {
        for level in [130, 140, 150, 160, 170] {
            assert!(check_compatibility_level("app", level).is_ok(), "{level}");
        }
    }

    #[test]
    fn a_target_outside_the_bundle_is_refused_with_the_range() {
        assert!(check_target(1, 47).is_ok());
        assert!(check_target(47, 47).is_ok());
        for version in [0, -1, 48, i32::MAX] {
            let message = check_target(version, 47).unwrap_err().to_string();
            assert!(
                message.contains(&format!("version {version}")) && message.contains("1 to 47"),
                "{message}"
            );
        }
    }

    #[test]
    fn compatibility_level_below_130_is_refused_with_the_fix() {
        for level in [80, 90, 100, 110, 120, 129] {
            let error = check_compatibility_level("my]db", level).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, Error::Migration(_)), "{text}");
            assert!(
                text.contains(&format!("compatibility level {level}")),
                "{text}"
            );
            assert!(
                text.contains("alter database [my]]db] set compatibility_level = 130;"),
                "{text}"
            );
            assert!(text.contains("Nothing was applied"), "{text}");
        }
    }

    #[test]
    fn the_newest_version_is_the_last_file() {
        assert_eq!(newest_version(), bundle().len() as i32);
    }

    #[test]
    fn the_history_table_is_ours() {
        assert_ne!(HISTORY_TABLE, "refinery_schema_history");
    }
}
