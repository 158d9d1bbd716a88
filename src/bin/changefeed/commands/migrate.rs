//! `changefeed migrate`: applies the bundle of the database `--url` names (SQL Server;
//! PostgreSQL's bundle: claim outboxes and feeds; MariaDB/MySQL's: claim outboxes).

use std::time::Duration;

use crate::database::{Connect, Store};
use crate::failure::Failure;
use crate::output::{Out, plural};

/// The longest a MariaDB/MySQL migration run may take: its migrations only create
/// procedures and one small table, so a run that outlasts this waits on a lock.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
const MYSQL_MIGRATE_TIMEOUT: Duration = Duration::from_secs(600);

/// Applies the bundle and prints what it applied.
pub async fn migrate(connect: &Connect, out: &mut Out) -> Result<(), Failure> {
    let text = match Store::of(&connect.url) {
        Store::Postgres => postgres(connect).await?,
        Store::Mysql => mysql(connect).await?,
        Store::SqlServer => {
            let mut client = connect.open(None).await?;
            let report = changefeed::migrations::migrate(&mut client).await?;
            let mut text = applied(
                "changefeed migration",
                report.applied_migrations(),
                changefeed::migrations::bundle().len(),
            );
            text.push_str(&skipped(&broken_objects(&mut client).await?));
            text
        }
    };
    out.text(&text)
}

/// How long the read of the registry's problems may take after a migration.
const PROBLEMS_TIMEOUT: Duration = Duration::from_secs(30);

/// The feeds and claim outboxes the registry records as broken, `(kind, name, problem)`:
/// the upgrades skip them (they keep their older code) and report them in a result set that
/// a migration runner discards, so `migrate` reads the registry afterwards and says so.
async fn broken_objects(
    client: &mut changefeed::Client,
) -> Result<Vec<(&'static str, String, String)>, Failure> {
    use changefeed::row::Column;

    let read = async {
        let mut broken = Vec::new();
        for (kind, sql) in [
            (
                "feed",
                "select schema_name, table_name, problem from changefeed.feeds \
                 where problem is not null order by schema_name, table_name",
            ),
            (
                "outbox",
                "select schema_name, table_name, problem from changefeed.outboxes \
                 where problem is not null order by schema_name, table_name",
            ),
        ] {
            for row in crate::database::query_rows(client, sql, &[]).await? {
                let name = format!("{}.{}", String::column(&row, 0)?, String::column(&row, 1)?);
                broken.push((kind, name, String::column(&row, 2)?));
            }
        }
        Ok::<_, changefeed::Error>(broken)
    };
    match tokio::time::timeout(PROBLEMS_TIMEOUT, read).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Failure::run(format!(
            "the migration was applied, but reading changefeed.feeds and changefeed.outboxes \
             for skipped objects did not finish within {PROBLEMS_TIMEOUT:?}; run \
             `changefeed status` to see them"
        ))),
    }
}

/// The lines naming what the upgrade skipped, each with its fix (empty when nothing was).
fn skipped(broken: &[(&str, String, String)]) -> String {
    if broken.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "{} skipped as broken (still on older code; each line says the fix):\n",
        plural(broken.len() as u64, "object was", "objects were")
    );
    for (kind, name, problem) in broken {
        text.push_str(&format!("  {kind} {name}: {problem}\n"));
    }
    text
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

    #[test]
    fn skipped_objects_are_named_with_their_fix() {
        assert_eq!(skipped(&[]), "");
        let text = skipped(&[
            (
                "feed",
                "dbo.Orders".to_owned(),
                "The event table was dropped.".to_owned(),
            ),
            (
                "outbox",
                "dbo.Outbox".to_owned(),
                "Run exec changefeed.upgrade_outbox.".to_owned(),
            ),
        ]);
        assert_eq!(
            text,
            "2 objects were skipped as broken (still on older code; each line says the fix):\n  \
             feed dbo.Orders: The event table was dropped.\n  \
             outbox dbo.Outbox: Run exec changefeed.upgrade_outbox.\n"
        );
    }
}
