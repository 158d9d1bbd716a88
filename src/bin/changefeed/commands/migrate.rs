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
            applied(
                "changefeed migration",
                report.applied_migrations(),
                changefeed::migrations::bundle().len(),
            )
        }
    };
    out.text(&text)
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
