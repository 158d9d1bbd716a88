//! `changefeed migrate`: applies the bundle of the database `--url` names (SQL Server, or
//! PostgreSQL's bundle: claim outboxes and feeds).

use crate::database::{Connect, is_postgres};
use crate::failure::Failure;
use crate::output::{Out, plural};

/// Applies the bundle and prints what it applied.
pub async fn migrate(connect: &Connect, out: &mut Out) -> Result<(), Failure> {
    let text = if is_postgres(&connect.url) {
        postgres(connect).await?
    } else {
        let mut client = connect.open(None).await?;
        let report = changefeed::migrations::migrate(&mut client).await?;
        applied(
            "changefeed migration",
            report.applied_migrations(),
            changefeed::migrations::bundle().len(),
        )
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
