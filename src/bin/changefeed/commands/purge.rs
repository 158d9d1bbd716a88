//! `changefeed purge`: deletes an outbox-mode feed's rows older than a cutoff
//! (`purge_feed`), shard by shard, and reports what went and what held the rest back; on
//! PostgreSQL through `postgres`.

use changefeed::row::Column;
use changefeed::{Error, Feed};
use tiberius::Row;
use ulid::Ulid;

#[cfg(feature = "postgres")]
mod postgres;

use crate::args::PurgeArgs;
use crate::database::{Connect, is_postgres, position, procedure_exists, query_rows};
use crate::failure::Failure;
use crate::output::{Align, Out, Table, plural};

/// One shard's outcome of `purge_feed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgedShard {
    /// The shard.
    pub shard: i32,
    /// Rows deleted (or that would be, in a dry run).
    pub deleted: i64,
    /// The shard's low-water mark after the purge.
    pub purged_through: Option<Ulid>,
    /// Why it stopped: cutoff reached, held back by consumer X, max rows reached.
    pub stopped_because: String,
    /// The consumers whose unread rows it deleted (or would delete), in name order: those not
    /// registered (`changefeed.register_consumer`), and with `--force` any.
    pub passed_consumers: Vec<String>,
}

/// Decodes the rows `purge_feed` returns.
pub fn purged_shards(rows: &[Row]) -> Result<Vec<PurgedShard>, Error> {
    rows.iter()
        .map(|row| {
            Ok(PurgedShard {
                shard: i32::column(row, position(row, "shard_id")?)?,
                deleted: i64::column(row, position(row, "deleted")?)?,
                purged_through: Option::<Ulid>::column(row, position(row, "purged_through")?)?,
                stopped_because: String::column(row, position(row, "stopped_because")?)?,
                // One ", "-joined list (names may hold commas: it is not split). A feed
                // whose purge_feed predates registrations (skipped by an upgrade as broken)
                // returns no such column.
                passed_consumers: position(row, "passed_consumers")
                    .ok()
                    .map(|at| Option::<String>::column(row, at))
                    .transpose()?
                    .flatten()
                    .into_iter()
                    .collect(),
            })
        })
        .collect()
}

/// The `purge` report: a table of shards, a line per shard that passed consumers, and the
/// total line.
pub fn purge_report(
    feed: &Feed,
    older_than: &str,
    dry_run: bool,
    shards: &[PurgedShard],
) -> String {
    let mut table = Table::new(&[
        ("shard", Align::Right),
        (
            if dry_run { "would_delete" } else { "deleted" },
            Align::Right,
        ),
        ("purged_through", Align::Left),
        ("stopped_because", Align::Left),
    ]);
    for shard in shards {
        table.push(vec![
            shard.shard.to_string(),
            shard.deleted.to_string(),
            shard
                .purged_through
                .map_or_else(|| "-".to_owned(), |ulid| ulid.to_string()),
            shard.stopped_because.clone(),
        ]);
    }
    let total: i64 = shards.iter().map(|shard| shard.deleted).sum();
    let rows = plural(total.max(0) as u64, "row", "rows");
    let in_shards = plural(shards.len() as u64, "shard", "shards");
    let mut text = table.render("(no shards)");
    for shard in shards
        .iter()
        .filter(|shard| !shard.passed_consumers.is_empty())
    {
        text.push_str(&format!(
            "shard {}: {} rows not yet read by {}\n",
            shard.shard,
            if dry_run { "would delete" } else { "deleted" },
            shard.passed_consumers.join(", ")
        ));
    }
    if dry_run {
        text.push_str(&format!(
            "would delete {rows} older than {older_than} from {feed} in {in_shards} (dry run: \
             nothing was deleted)\n"
        ));
    } else {
        text.push_str(&format!(
            "deleted {rows} older than {older_than} from {feed} in {in_shards}\n"
        ));
    }
    text
}

/// Purges and prints the report.
pub async fn purge(connect: &Connect, out: &mut Out, args: PurgeArgs) -> Result<(), Failure> {
    if is_postgres(&connect.url) {
        let shards = postgres::purge(connect, &args).await?;
        return out.text(&purge_report(
            &args.feed,
            &args.older_than.to_string(),
            args.dry_run,
            &shards,
        ));
    }
    let PurgeArgs {
        feed,
        older_than,
        shard,
        force,
        dry_run,
        batch_size,
        max_rows,
    } = args;
    let mut client = connect.open(None).await?;
    let procedure = feed.object("purge_feed");
    if !procedure_exists(&mut client, &procedure).await? {
        return Err(Failure::run(format!(
            "{feed} has no purge procedure ({procedure} does not exist): it is not an \
             outbox-mode feed in this database (a serialized-writer feed's events are rows \
             of your own table), or the bundle predates retention (run `changefeed migrate`)"
        )));
    }
    let sql = format!(
        "exec {procedure} @shard_id = @P1, @older_than_ms = @P2, @batch_size = @P3, \
         @max_rows = @P4, @force = @P5, @dry_run = @P6"
    );
    let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
    let max_rows = max_rows.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows = query_rows(
        &mut client,
        &sql,
        &[
            &shard,
            &older_than.as_millis_i64(),
            &batch_size,
            &max_rows,
            &force,
            &dry_run,
        ],
    )
    .await?;
    let shards = purged_shards(&rows)?;
    out.text(&purge_report(
        &feed,
        &older_than.to_string(),
        dry_run,
        &shards,
    ))
}

#[cfg(not(feature = "postgres"))]
mod postgres {
    use super::PurgedShard;
    use crate::args::PurgeArgs;
    use crate::database::Connect;
    use crate::failure::Failure;

    pub async fn purge(_: &Connect, _: &PurgeArgs) -> Result<Vec<PurgedShard>, Failure> {
        Err(Failure::without_postgres())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::test_rows::{row, text, ulid};
    use tiberius::ColumnData;
    use tiberius::ColumnType as T;

    #[test]
    fn purge_rows_become_a_report_with_a_total() {
        let through = Ulid::from_parts(1_714_564_800_123, 1);
        let row = |shard: i32, deleted: i64, through: Option<Ulid>, why: &str, passed| {
            row(vec![
                ("shard_id", T::Int4, ColumnData::I32(Some(shard))),
                ("deleted", T::Int8, ColumnData::I64(Some(deleted))),
                ("purged_through", T::BigBinary, ulid(through)),
                ("stopped_because", T::NVarchar, text(Some(why))),
                ("dry_run", T::Bit, ColumnData::Bit(Some(false))),
                ("passed_consumers", T::NVarchar, text(passed)),
            ])
        };
        let shards = purged_shards(&[
            row(0, 1200, Some(through), "cutoff reached", Some("idle, x")),
            row(1, 0, None, "held back by consumer billing", None),
        ])
        .unwrap();
        assert_eq!(shards[0].purged_through, Some(through));
        assert_eq!(shards[0].passed_consumers, ["idle, x"]);
        assert!(shards[1].passed_consumers.is_empty());
        let feed: Feed = "app.Order".parse().unwrap();
        let text = purge_report(&feed, "30d", false, &shards);
        assert_eq!(
            text,
            format!(
                "shard  deleted  purged_through              stopped_because\n    \
                 0     1200  {through}  cutoff reached\n    \
                 1        0  -                           held back by consumer billing\n\
                 shard 0: deleted rows not yet read by idle, x\n\
                 deleted 1200 rows older than 30d from app.Order in 2 shards\n"
            )
        );
        let dry = purge_report(&feed, "30d", true, &shards);
        assert!(dry.starts_with("shard  would_delete"), "{dry}");
        assert!(
            dry.contains("shard 0: would delete rows not yet read by idle, x\n"),
            "{dry}"
        );
        assert!(dry.ends_with("would delete 1200 rows older than 30d from app.Order in 2 shards (dry run: nothing was deleted)\n"), "{dry}");
        let none = purge_report(&feed, "1d", false, &[]);
        assert_eq!(
            none,
            "shard  deleted  purged_through  stopped_because\n(no shards)\n\
             deleted 0 rows older than 1d from app.Order in 0 shards\n"
        );
    }
}
