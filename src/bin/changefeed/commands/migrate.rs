//! `changefeed migrate`: applies the bundle of the database `--url` names (SQL Server;
//! PostgreSQL's bundle: claim outboxes and feeds; MariaDB/MySQL's: claim outboxes).

use std::time::Duration;

use changefeed::migrations::{ObjectUpgrade, Outcome};

use crate::database::{Connect, Store};
use crate::failure::Failure;
use crate::output::{Out, plural};

/// The longest a MariaDB/MySQL migration run may take: its migrations only create
/// procedures and one small table, so a run that outlasts this waits on a lock.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
const MYSQL_MIGRATE_TIMEOUT: Duration = Duration::from_secs(600);

/// Applies the bundle and prints what it applied (on SQL Server, also what the
/// regeneration after it did to each feed and claim outbox). Fails, after printing, when an
/// object was left on its older code for a retry (busy or failed).
pub async fn migrate(connect: &Connect, out: &mut Out) -> Result<(), Failure> {
    let (text, left_behind) = match Store::of(&connect.url) {
        Store::Postgres => (postgres(connect).await?, Ok(())),
        Store::Mysql => (mysql(connect).await?, Ok(())),
        Store::SqlServer => {
            let mut client = connect.open(None).await?;
            let report = changefeed::migrations::migrate(&mut client).await?;
            let mut text = applied(
                "changefeed migration",
                report.applied_migrations(),
                changefeed::migrations::bundle().len(),
            );
            text.push_str(&regenerated(report.objects()));
            (text, left_behind(report.objects()))
        }
    };
    out.text(&text)?;
    left_behind
}

/// The lines saying what the regeneration did: each object regenerated, skipped as broken
/// (with its fix), busy or failed (with why), and how many were already current.
fn regenerated(objects: &[ObjectUpgrade]) -> String {
    let count = |outcome| objects.iter().filter(|o| o.outcome == outcome).count() as u64;
    let mut text = String::new();
    for (outcome, heading) in [
        (
            Outcome::Upgraded,
            format!(
                "regenerated {} from the current templates:",
                plural(count(Outcome::Upgraded), "object", "objects")
            ),
        ),
        (
            Outcome::Broken,
            format!(
                "{} skipped as broken (still on older code; each line says the fix):",
                plural(count(Outcome::Broken), "object was", "objects were")
            ),
        ),
        (
            Outcome::Busy,
            format!(
                "{} busy: its locks were held by other sessions' transactions (still on older \
                 code, which works; run changefeed migrate again at a quieter moment):",
                plural(count(Outcome::Busy), "object was", "objects were")
            ),
        ),
        (
            Outcome::Failed,
            format!(
                "{} (rolled back, still on older code):",
                plural(count(Outcome::Failed), "object failed", "objects failed")
            ),
        ),
    ] {
        if count(outcome) == 0 {
            continue;
        }
        text.push_str(&heading);
        text.push('\n');
        for object in objects.iter().filter(|o| o.outcome == outcome) {
            text.push_str(&format!("  {} {}", object.kind, object.name));
            if outcome != Outcome::Upgraded {
                let problem = object.problem.as_deref().unwrap_or("(no reason given)");
                text.push_str(&format!(": {problem}"));
            }
            text.push('\n');
        }
    }
    let current = count(Outcome::Current);
    if current > 0 {
        text.push_str(&format!(
            "{} already current\n",
            plural(current, "object was", "objects were")
        ));
    }
    text
}

/// The failure when objects were left on their older code for a retry (busy or failed):
/// the output names them, and a script must not take the upgrade for done.
fn left_behind(objects: &[ObjectUpgrade]) -> Result<(), Failure> {
    let left = objects
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Busy | Outcome::Failed))
        .count() as u64;
    if left == 0 {
        return Ok(());
    }
    Err(Failure::run(format!(
        "{} not regenerated (busy or failed, listed above) and still on older code; run \
         changefeed migrate again (it regenerates only what is left)",
        plural(left, "object was", "objects were")
    )))
}

/// `applied 2 changefeed migrations (82 in the bundle)` and one line for each.
fn applied(what: &str, applied: &[refinery::Migration], bundle: usize) -> String {
    let mut text = format!(
        "applied {} ({bundle} in the bundle{})\n",
        plural(applied.len() as u64, what, &format!("{what}s")),
        if applied.is_empty() {
            "; the database is up to date"
        } else {
            ""
        }
    );
    for migration in applied {
        text.push_str(&format!(
            "  V{} {}\n",
            migration.version(),
            migration.name()
        ));
    }
    text
}

#[cfg(feature = "postgres")]
async fn postgres(connect: &Connect) -> Result<String, Failure> {
    use crate::database::postgres::{open, settings};

    let config = settings(connect)?;
    let mut client = open(connect, &config).await?;
    let report = changefeed::postgres::migrate(&mut client).await?;
    Ok(applied(
        "PostgreSQL changefeed migration",
        report.applied_migrations(),
        changefeed::postgres::bundle().len(),
    ))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_connect: &Connect) -> Result<String, Failure> {
    Err(Failure::without_postgres())
}

#[cfg(feature = "mysql")]
async fn mysql(connect: &Connect) -> Result<String, Failure> {
    // Connect once first: a bad URL or an unreachable server gets the same one-line failure
    // (exit status 2) as every other MariaDB/MySQL command.
    let (opts, conn) = crate::database::open_mysql(connect).await?;
    conn.disconnect().await.ok();
    let pool = mysql_async::Pool::new(opts);
    let report =
        tokio::time::timeout(MYSQL_MIGRATE_TIMEOUT, changefeed::mysql::migrate(&pool)).await;
    pool.disconnect().await.ok();
    let report = report.map_err(|_| {
        Failure::run(format!(
            "the MariaDB/MySQL migrations did not finish within {MYSQL_MIGRATE_TIMEOUT:?} \
             (a lock held by another session? see SHOW PROCESSLIST)"
        ))
    })??;
    Ok(applied(
        "MariaDB/MySQL changefeed migration",
        report.applied_migrations(),
        changefeed::mysql::bundle().len(),
    ))
}

#[cfg(not(feature = "mysql"))]
async fn mysql(_connect: &Connect) -> Result<String, Failure> {
    Err(Failure::without_mysql())
}

#[cfg(test)]
mod tests {
    use super::*;

    use changefeed::migrations::ObjectKind;

    fn object(
        kind: ObjectKind,
        name: &str,
        outcome: Outcome,
        problem: Option<&str>,
    ) -> ObjectUpgrade {
        ObjectUpgrade::new(kind, name, outcome, problem.map(str::to_owned))
    }

    #[test]
    fn every_object_not_left_as_it_was_is_named_and_broken_ones_with_their_fix() {
        assert_eq!(regenerated(&[]), "");
        let objects = [
            object(ObjectKind::Feed, "dbo.Orders", Outcome::Upgraded, None),
            object(ObjectKind::Feed, "dbo.Old", Outcome::Current, None),
            object(
                ObjectKind::Feed,
                "dbo.Gone",
                Outcome::Broken,
                Some("The event table was dropped."),
            ),
            object(ObjectKind::Outbox, "dbo.Outbox", Outcome::Upgraded, None),
            object(
                ObjectKind::Outbox,
                "dbo.Renamed",
                Outcome::Broken,
                Some("Run exec changefeed.upgrade_outbox."),
            ),
            object(ObjectKind::Outbox, "dbo.Other", Outcome::Current, None),
        ];
        assert_eq!(
            regenerated(&objects),
            "regenerated 2 objects from the current templates:\n  \
             feed dbo.Orders\n  \
             outbox dbo.Outbox\n\
             2 objects were skipped as broken (still on older code; each line says the fix):\n  \
             feed dbo.Gone: The event table was dropped.\n  \
             outbox dbo.Renamed: Run exec changefeed.upgrade_outbox.\n\
             2 objects were already current\n"
        );
        assert!(
            left_behind(&objects).is_ok(),
            "broken objects wait for a repair"
        );
    }

    #[test]
    fn busy_or_failed_objects_are_named_and_fail_the_command() {
        let objects = [
            object(
                ObjectKind::Outbox,
                "dbo.Hot",
                Outcome::Busy,
                Some("Lock request time out period exceeded."),
            ),
            object(
                ObjectKind::Feed,
                "dbo.Odd",
                Outcome::Failed,
                Some("Msg 2714"),
            ),
            object(ObjectKind::Feed, "dbo.Done", Outcome::Upgraded, None),
        ];
        let text = regenerated(&objects);
        assert!(
            text.contains(
                "1 object was busy: its locks were held by other sessions' transactions (still \
                 on older code, which works; run changefeed migrate again at a quieter \
                 moment):\n  outbox dbo.Hot: Lock request time out period exceeded.\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "1 object failed (rolled back, still on older code):\n  feed dbo.Odd: Msg 2714\n"
            ),
            "{text}"
        );
        let failure = left_behind(&objects).expect_err("busy and failed objects fail the run");
        assert_eq!(failure.code(), 1);
        let message = failure.message().expect("a line");
        assert!(
            message.contains("2 objects were not regenerated"),
            "{message}"
        );
        assert!(
            message.contains("run changefeed migrate again"),
            "{message}"
        );
    }
}
