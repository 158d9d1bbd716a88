//! How long [`migrate`](super::migrate) lets a statement wait for a lock, which failures of a
//! migration it tries again and after what pause, and the error it gives when it stops.
//!
//! A migration changes shared objects (a procedure, a view, a table) that application
//! sessions use. Its `create or alter` or `alter table` needs a schema-modification lock,
//! which waits for every open transaction that uses the object, and every later request for
//! the object queues behind it: without a bound, one open application transaction would
//! make every call of the application wait on the upgrade. So `migrate` sets
//! [`LOCK_TIMEOUT`] on its session; a migration that cannot get a lock in that time fails
//! with 1222 and is rolled back whole (refinery runs each in its own transaction), the
//! application goes on with what it had, and `migrate` tries again: refinery resumes at
//! the migration that failed.

use std::time::Duration;

use crate::error::Error;

/// How long any one lock request of [`migrate`](super::migrate) waits (`SET LOCK_TIMEOUT`
/// on its session, kept for the regeneration after the migrations).
///
/// This is the bound of an upgrade under traffic: an application call waits on the upgrade
/// at most this long, plus the time one migration's (or one object's regeneration's)
/// transaction runs once it has its locks, milliseconds. A lock not granted in time fails
/// the migration (1222), which is rolled back and tried again, or leaves the object being
/// regenerated on its older code, reported [`Outcome::Busy`](super::Outcome::Busy).
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(2000);

/// How many times [`migrate`](super::migrate) tries one migration that fails for a lock
/// (1222, lock not granted within [`LOCK_TIMEOUT`], or the bundle's 51012) or as a deadlock
/// victim (1205), pausing 1, 2, 4 and 8 s between the attempts (refinery resumes at the
/// failed migration; the next migration to fail gets as many); then it gives up with the
/// server's error number, naming the migration.
pub const MIGRATION_ATTEMPTS: u32 = 5;

/// How long [`migrate`](super::migrate) lets the regeneration after the migrations
/// (`changefeed.upgrade_all_feeds @only_outdated = 1`) run. It regenerates one object per
/// transaction, milliseconds each; an object whose locks are busy takes a few seconds
/// before it is reported busy. Past this bound the call is abandoned (the connection must
/// then be dropped): every object regenerated so far keeps its new code, and the next
/// `migrate` regenerates only what is left.
pub const REGENERATION_TIMEOUT: Duration = Duration::from_secs(600);

/// Lock request time out period exceeded.
const LOCK_NOT_GRANTED: u32 = 1222;
/// Chosen as deadlock victim (the server rolled the transaction back).
const DEADLOCK_VICTIM: u32 = 1205;
/// The bundle's own "a lock was not granted in time": the generators' lock (another setup or
/// upgrade holds it), or the table lock `create_outbox_storage` turns 1222 into.
const GENERATORS_BUSY: u32 = 51012;

/// Whether a migration that failed with `error` may succeed if run again later: SQL Server
/// did not grant it a lock in time (1222, or the bundle's 51012) or chose it as a deadlock
/// victim (1205). Either way its transaction is rolled back whole. Any other failure (a
/// statement the server refuses, a permission, a lost connection) would fail again or is
/// not ours to repeat.
pub(super) fn is_lock_conflict(error: &Error) -> bool {
    matches!(
        error,
        Error::Server { number, .. }
            if matches!(*number, LOCK_NOT_GRANTED | DEADLOCK_VICTIM | GENERATORS_BUSY)
    )
}

/// The pause before attempt `attempt` (2 to [`MIGRATION_ATTEMPTS`]): 1 s, doubling.
pub(super) fn pause_before(attempt: u32) -> Duration {
    Duration::from_secs(1 << attempt.saturating_sub(2).min(16))
}

/// The migration (`V65__name`) whose failure `error` is, when refinery says.
pub(super) fn failed_migration(error: &refinery::Error) -> Option<String> {
    match error.kind() {
        refinery::error::Kind::Connection(context, _) => context
            .strip_prefix("error applying migration ")
            .map(str::to_owned),
        _ => None,
    }
}

/// The error of the last attempt, `error` (of migration `migration`), once every attempt
/// failed for a lock: the server's number, state and class kept, the message saying what
/// happened and what to do.
pub(super) fn gave_up(error: Error, migration: Option<&str>) -> Error {
    let Error::Server {
        number,
        state,
        class,
        message,
    } = error
    else {
        return error;
    };
    let migration = migration.map_or_else(
        || "the next changefeed migration".to_owned(),
        |name| format!("migration {name}"),
    );
    Error::Server {
        number,
        state,
        class,
        message: format!(
            "{migration} did not get its locks in {MIGRATION_ATTEMPTS} attempts (each lock \
             request waits at most {} ms): other sessions' open transactions hold objects it \
             changes. It was rolled back each time, so nothing of it is applied (the \
             migrations before it are). Retry at a quieter moment: migrate resumes at it. \
             The last attempt failed with: {message}",
            LOCK_TIMEOUT.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    use refinery::error::WrapMigrationError;

    use super::*;

    fn server(number: u32) -> Error {
        Error::Server {
            number,
            state: 1,
            class: 16,
            message: "Lock request time out period exceeded.".to_owned(),
        }
    }

    #[test]
    fn a_lock_timeout_or_a_deadlock_is_retried_and_nothing_else() {
        assert!(is_lock_conflict(&server(1222)));
        assert!(is_lock_conflict(&server(1205)));
        assert!(is_lock_conflict(&server(51012)));
        for number in [2801, 51013, 208, 207, 229, 3960] {
            assert!(!is_lock_conflict(&server(number)), "{number}");
        }
        // MariaDB's 1205 is its own lock wait timeout, not a SQL Server migration's.
        let mysql = Error::Mysql {
            code: 1205,
            state: "HY000".to_owned(),
            message: "Lock wait timeout exceeded".to_owned(),
        };
        assert!(!is_lock_conflict(&mysql));
        assert!(!is_lock_conflict(&Error::Connection("reset".to_owned())));
        assert!(!is_lock_conflict(&Error::Migration("V65".to_owned())));
    }

    #[test]
    fn the_pauses_are_1_2_4_and_8_seconds() {
        let pauses: Vec<u64> = (2..=MIGRATION_ATTEMPTS)
            .map(|attempt| pause_before(attempt).as_secs())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8]);
    }

    #[test]
    fn the_failed_migration_is_read_from_refinerys_error() {
        let failed: refinery::Error = Err::<(), _>(std::io::Error::other("1222"))
            .migration_err("error applying migration V65__alter_cursor", Some(&[]))
            .unwrap_err();
        assert_eq!(
            failed_migration(&failed).as_deref(),
            Some("V65__alter_cursor")
        );
        let other: refinery::Error = Err::<(), _>(std::io::Error::other("gone"))
            .migration_err("error getting applied migrations", None)
            .unwrap_err();
        assert_eq!(failed_migration(&other), None);
    }

    #[test]
    fn giving_up_keeps_the_number_and_names_the_migration_and_what_to_do() {
        let error = gave_up(server(1222), Some("V65__alter_cursor"));
        assert_eq!(error.server_number(), Some(1222));
        let text = error.to_string();
        for part in [
            "migration V65__alter_cursor",
            "5 attempts",
            "2000 ms",
            "Retry at a quieter moment",
            "Lock request time out period exceeded.",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        assert!(
            gave_up(server(1205), None)
                .to_string()
                .contains("the next changefeed migration")
        );
        // Only a server error is rewritten.
        let other = gave_up(Error::Connection("reset".to_owned()), Some("V65__x"));
        assert!(matches!(other, Error::Connection(_)), "{other}");
    }
}
