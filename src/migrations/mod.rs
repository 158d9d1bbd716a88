//! The SQL bundle in `sql/`, embedded at compile time and applied with refinery, and the
//! regeneration of every feed's and claim outbox's code that follows it ([`migrate`]).
//!
//! ```no_run
//! # async fn run(client: &mut changefeed::Client) -> changefeed::Result<()> {
//! let report = changefeed::migrations::migrate(client).await?;
//! println!("applied {} changefeed migrations", report.applied_migrations().len());
//! # Ok(()) }
//! ```

use futures::{AsyncRead, AsyncWrite};

use crate::error::{Error, Result};

mod report;
mod retry;

pub use report::{MigrationReport, ObjectKind, ObjectUpgrade, Outcome};
pub use retry::{LOCK_TIMEOUT, MIGRATION_ATTEMPTS, REGENERATION_TIMEOUT};

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

/// Applies every migration of the bundle that the database does not have yet, then
/// regenerates the code of every feed and claim outbox that an older generator made, and
/// reports both.
///
/// Run it before your own migrations that call `changefeed.setup_feed`, on a connection
/// outside any transaction (one inside a transaction is refused before anything is
/// applied, with [`Error::Migration`]). A database below compatibility level
/// [`MIN_COMPATIBILITY_LEVEL`] is refused before anything is applied
/// ([`check_compatibility_level`]).
///
/// It can run while the application runs. Every lock it asks for waits at most
/// [`LOCK_TIMEOUT`] (it sets that on the session, and puts the session's own value back
/// before it returns), so an application call waits on it at most that long plus the
/// milliseconds one migration's or one object's transaction takes once it has its locks:
///
/// * each migration runs in a transaction of its own. One that does not get a lock in time
///   (1222, or the bundle's 51012), or is chosen as a deadlock victim (1205), is rolled back
///   and the run tried again from it: each migration gets [`MIGRATION_ATTEMPTS`] attempts,
///   1, 2, 4 and 8 s apart; then the error keeps the server's number, names the migration
///   and says to retry at a quieter moment. Any other failure is returned at once, with the
///   server's number; the failed migration is rolled back.
/// * then `exec changefeed.upgrade_all_feeds @only_outdated = 1` regenerates each feed and
///   outbox not yet made by the current generator, one object per transaction, within
///   [`REGENERATION_TIMEOUT`]. No migration regenerates: that would hold every object's
///   code locked for one long transaction. An object whose locks stay busy keeps its older
///   code, which works with the new bundle, and is reported [`Outcome::Busy`]; run
///   `migrate` again ([`MigrationReport::is_complete`] says whether to). Broken objects
///   (a dropped table, a renamed key column) are skipped and reported with their fix.
///
/// A tool that applies `sql/` itself (Flyway, DbUp, sqlcmd) runs that `exec` afterwards.
pub async fn migrate<S>(client: &mut tiberius::Client<S>) -> Result<MigrationReport>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    with_lock_timeout(client, async |client| {
        let applied = run_retrying(client, runner).await?;
        let objects = regenerate(client).await?;
        Ok(MigrationReport::new(
            applied.applied_migrations().clone(),
            objects,
        ))
    })
    .await
}

/// The statement that regenerates what the migrations left outdated, one object per
/// transaction: it must run outside any transaction (inside one it would regenerate
/// everything in that one, holding every object's code locked until it commits).
const REGENERATE: &str = "exec changefeed.upgrade_all_feeds @only_outdated = 1;";

/// Runs [`REGENERATE`] within [`REGENERATION_TIMEOUT`] and decodes its report (its last
/// result set).
async fn regenerate<S>(client: &mut tiberius::Client<S>) -> Result<Vec<ObjectUpgrade>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let call = async {
        let results = client
            .simple_query(REGENERATE)
            .await?
            .into_results()
            .await?;
        results
            .last()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|row| report::ReportColumns::of(row)?.decode())
            .collect::<Result<Vec<_>>>()
    };
    match tokio::time::timeout(REGENERATION_TIMEOUT, call).await {
        Ok(objects) => objects,
        // The answer was not read to its end, so the connection cannot serve another call:
        // a connection error, which the caller drops (and `with_lock_timeout` leaves alone).
        Err(_) => Err(Error::Connection(format!(
            "the changefeed migrations were applied, but changefeed.upgrade_all_feeds did not \
             finish within {REGENERATION_TIMEOUT:?}: the feeds and outboxes it regenerated so \
             far have their new code, the others their older code, which works. Drop this \
             connection (its answer was not read) and run migrate again on a new one: it \
             regenerates only what is left"
        ))),
    }
}

/// What [`with_lock_timeout`] found on the session before it changed it.
struct Session {
    database: String,
    level: i32,
    lock_timeout: i32,
    transactions: i32,
}

/// Reads the session's database, compatibility level, lock timeout and open transactions.
async fn session<S>(client: &mut tiberius::Client<S>) -> Result<Session>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let row = client
        .simple_query(
            "select db_name(), convert(int, compatibility_level), \
                 convert(int, @@lock_timeout), convert(int, @@trancount) \
             from sys.databases where database_id = db_id();",
        )
        .await?
        .into_row()
        .await?
        .ok_or_else(|| Error::Migration("sys.databases has no row for this database".into()))?;
    let int = |index: usize, what: &str| {
        row.try_get::<i32, usize>(index)?
            .ok_or_else(|| Error::Migration(format!("the session has no {what}")))
    };
    Ok(Session {
        database: row
            .try_get::<&str, usize>(0)?
            .unwrap_or_default()
            .to_owned(),
        level: int(1, "compatibility level")?,
        lock_timeout: int(2, "lock timeout")?,
        transactions: int(3, "transaction count")?,
    })
}

/// Runs `work` on `client` with [`LOCK_TIMEOUT`] set on the session (in a batch of its own:
/// a migration file cannot set it, since its module must begin its batch), after checking
/// that the database can take the bundle and that no transaction is open; then puts the
/// session's lock timeout back. A connection that failed is left as it is: the caller drops
/// it.
async fn with_lock_timeout<S, T>(
    client: &mut tiberius::Client<S>,
    work: impl AsyncFnOnce(&mut tiberius::Client<S>) -> Result<T>,
) -> Result<T>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let session = session(client).await?;
    check_compatibility_level(&session.database, session.level)?;
    check_no_transaction(session.transactions)?;
    set_lock_timeout(client, LOCK_TIMEOUT.as_millis()).await?;
    let result = work(client).await;
    if matches!(result, Err(Error::Connection(_))) {
        return result;
    }
    let restored = set_lock_timeout(client, session.lock_timeout).await;
    match (result, restored) {
        (Ok(value), Ok(())) => Ok(value),
        (Ok(_), Err(error)) | (Err(error), _) => Err(error),
    }
}

/// `set lock_timeout <milliseconds>` on the session, in a batch of its own.
async fn set_lock_timeout<S>(
    client: &mut tiberius::Client<S>,
    milliseconds: impl std::fmt::Display,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    client
        .simple_query(format!("set lock_timeout {milliseconds};"))
        .await?
        .into_results()
        .await?;
    Ok(())
}

/// Refinery runs each migration in a transaction it begins and, on failure, rolls back by
/// name: inside a caller's transaction a failure would roll back the caller's work too, and
/// the regeneration would hold every object's code locked until the caller commits.
fn check_no_transaction(transactions: i32) -> Result<()> {
    if transactions == 0 {
        return Ok(());
    }
    Err(Error::Migration(format!(
        "the connection has {transactions} open transaction(s); the changefeed migrations \
         run each in a transaction of their own and regenerate each feed and outbox in its \
         own. Nothing was applied. Commit or roll back first, or migrate on a connection of \
         its own"
    )))
}

/// Runs the migrations `runner` makes until they all applied, trying again from the failed
/// one while it fails for a lock ([`retry::is_lock_conflict`]): each migration gets
/// [`MIGRATION_ATTEMPTS`] attempts (one that got through resets the count for the next).
/// The report lists every migration applied, over all attempts.
async fn run_retrying<S>(
    client: &mut tiberius::Client<S>,
    runner: impl Fn() -> refinery::Runner,
) -> Result<refinery::Report>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut applied = Vec::new();
    let mut attempt = 1;
    let mut failing: Option<String> = None;
    loop {
        let failure = match runner().run_async(client).await {
            Ok(report) => {
                applied.extend(report.applied_migrations().iter().cloned());
                return Ok(refinery::Report::new(applied));
            }
            Err(failure) => failure,
        };
        // The migrations before the failed one committed.
        if let Some(report) = failure.report() {
            applied.extend(report.applied_migrations().iter().cloned());
        }
        let migration = retry::failed_migration(&failure);
        let error = from_refinery(failure);
        if !retry::is_lock_conflict(&error) {
            return Err(error);
        }
        // refinery rolled the migration back (a deadlock victim's, the server did): make
        // sure no transaction is left open to hold locks during the pause.
        client
            .simple_query("if @@trancount > 0 rollback transaction;")
            .await?
            .into_results()
            .await?;
        if migration != failing {
            attempt = 1;
            failing = migration;
        }
        if attempt == MIGRATION_ATTEMPTS {
            return Err(retry::gave_up(error, failing.as_deref()));
        }
        attempt += 1;
        tokio::time::sleep(retry::pause_before(attempt)).await;
    }
}

/// Applies the migrations of the bundle up to and including `version`, and none after it;
/// migrations the database already has are skipped, as in [`migrate`], with the same lock
/// timeout and retries.
///
/// [`migrate`] is what applications call. This one stops a database at an earlier release
/// of the bundle: the upgrade test (`tests/live_upgrade.rs`) builds a database as an older
/// release left it, then runs [`migrate`] to check that the newest release upgrades it. It
/// does **not** regenerate feeds and outboxes afterwards, so objects set up before keep the
/// code their generator made, as the older release left them; [`migrate`] regenerates.
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
    with_lock_timeout(client, async |client| {
        run_retrying(client, || {
            runner().set_target(refinery::Target::Version(version))
        })
        .await
    })
    .await
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
    fn an_open_transaction_is_refused_before_anything_is_applied() {
        assert!(check_no_transaction(0).is_ok());
        let error = check_no_transaction(2).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::Migration(_)), "{text}");
        for part in [
            "2 open transaction(s)",
            "Nothing was applied",
            "Commit or roll back",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
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
