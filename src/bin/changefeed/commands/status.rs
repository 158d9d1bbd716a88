//! `changefeed status`: every feed shard (`changefeed.feed_status`), every claim outbox
//! (its part is `outboxes`) and, with `--consumers`, every consumer's lag, as tables or as
//! one JSON object; `postgres` is the same on PostgreSQL.

mod outboxes;
#[cfg(feature = "postgres")]
mod postgres;

use std::time::Duration;

use changefeed::Error;
use tiberius::{ColumnData, Row};

use crate::args::StatusArgs;
use crate::database::{Connect, cell, is_mysql, is_postgres, query_rows, with_migrate_hint};
use crate::failure::Failure;
use crate::output::{Align, Out, Table, human_lag, text_cell, ulid_cell, utc_cell, yes_no_cell};

const FEED_STATUS: &str = "select feed, mode, shard_id, outbox_depth, oldest_pending_at, \
    head_ulid, head_at, state_updated_at, purged_through, problem \
    from changefeed.feed_status order by feed, shard_id";

const CONSUMER_LAG: &str = "select consumer, feed, shard_id, [cursor], cursor_at, head_at, \
    lag_ms, not_yet_in_feed, expired \
    from changefeed.consumer_lag order by feed, shard_id, consumer";

/// How a column of a status table shows its cells.
#[derive(Clone, Copy)]
enum Shown {
    /// As text (numbers, names), `-` for null.
    Text,
    /// A `datetime2` as an RFC 3339 UTC time.
    Utc,
    /// A `binary(16)` as a ULID.
    Ulid,
    /// A bit as yes or no.
    YesNo,
    /// Milliseconds as a human lag (`3 min`).
    Lag,
}

/// The columns of the `status` table: heading, alignment, the result column and how it
/// shows. Last, `problem`: set for a feed that cannot be shown (its event table was
/// dropped, ...), one row with no shard, saying what to run.
const FEED_COLUMNS: &[(&str, Align, &str, Shown)] = &[
    ("feed", Align::Left, "feed", Shown::Text),
    ("mode", Align::Left, "mode", Shown::Text),
    ("shard", Align::Right, "shard_id", Shown::Text),
    ("outbox_depth", Align::Right, "outbox_depth", Shown::Text),
    (
        "oldest_pending_at",
        Align::Left,
        "oldest_pending_at",
        Shown::Utc,
    ),
    ("head_ulid", Align::Left, "head_ulid", Shown::Ulid),
    ("head_at", Align::Left, "head_at", Shown::Utc),
    (
        "state_updated_at",
        Align::Left,
        "state_updated_at",
        Shown::Utc,
    ),
    ("purged_through", Align::Left, "purged_through", Shown::Ulid),
    ("problem", Align::Left, "problem", Shown::Text),
];

/// The columns of the `status --consumers` table.
const CONSUMER_COLUMNS: &[(&str, Align, &str, Shown)] = &[
    ("consumer", Align::Left, "consumer", Shown::Text),
    ("feed", Align::Left, "feed", Shown::Text),
    ("shard", Align::Right, "shard_id", Shown::Text),
    ("cursor", Align::Left, "cursor", Shown::Ulid),
    ("cursor_at", Align::Left, "cursor_at", Shown::Utc),
    ("head_at", Align::Left, "head_at", Shown::Utc),
    ("lag", Align::Right, "lag_ms", Shown::Lag),
    (
        "not_yet_in_feed",
        Align::Right,
        "not_yet_in_feed",
        Shown::Text,
    ),
    ("expired", Align::Left, "expired", Shown::YesNo),
];

/// A table of `rows` with these columns.
fn rows_table(rows: &[Row], columns: &[(&str, Align, &str, Shown)]) -> Result<Table, Error> {
    let headings: Vec<(&str, Align)> = columns
        .iter()
        .map(|&(heading, align, _, _)| (heading, align))
        .collect();
    let mut table = Table::new(&headings);
    for row in rows {
        let mut cells = Vec::with_capacity(columns.len());
        for &(_, _, name, shown) in columns {
            let data = cell(row, name)?;
            cells.push(match (shown, data) {
                (Shown::Text, _) => text_cell(data),
                (Shown::Utc, _) => utc_cell(data),
                (Shown::Ulid, _) => ulid_cell(data),
                (Shown::YesNo, _) => yes_no_cell(data),
                (Shown::Lag, ColumnData::I64(Some(ms))) => human_lag(*ms),
                (Shown::Lag, ColumnData::I32(Some(ms))) => human_lag(i64::from(*ms)),
                (Shown::Lag, _) => text_cell(data),
            });
        }
        table.push(cells);
    }
    Ok(table)
}

/// The `status` table of `changefeed.feed_status` rows.
pub fn feed_status_table(rows: &[Row]) -> Result<Table, Error> {
    rows_table(rows, FEED_COLUMNS)
}

/// The `status --consumers` table of `changefeed.consumer_lag` rows.
pub fn consumer_lag_table(rows: &[Row]) -> Result<Table, Error> {
    rows_table(rows, CONSUMER_COLUMNS)
}

/// Shows every feed, outbox and (with `--consumers`) consumer.
pub async fn status(connect: &Connect, out: &mut Out, args: StatusArgs) -> Result<(), Failure> {
    if is_mysql(&connect.url) {
        return mysql_status(connect, out, args).await;
    }
    if is_postgres(&connect.url) {
        return postgres_status(connect, out, args).await;
    }
    let mut client = connect.open(Some(Duration::from_secs(30))).await?;
    let feeds = query_rows(&mut client, FEED_STATUS, &[])
        .await
        .map_err(with_migrate_hint)?;
    let outboxes = outboxes::sql_server(&mut client)
        .await
        .map_err(with_migrate_hint)?;
    let consumers = if args.consumers {
        Some(
            query_rows(&mut client, CONSUMER_LAG, &[])
                .await
                .map_err(with_migrate_hint)?,
        )
    } else {
        None
    };
    if args.json {
        let rows = |rows: &[Row]| -> Result<Vec<serde_json::Value>, Error> {
            rows.iter()
                .map(|row| changefeed::json::row_json(row, 0).map(serde_json::Value::Object))
                .collect()
        };
        let mut document = serde_json::json!({
            "feeds": rows(&feeds)?,
            "outboxes": outboxes,
        });
        if let Some(consumers) = &consumers {
            document["consumers"] = serde_json::Value::Array(rows(consumers)?);
        }
        return out.line(&document.to_string());
    }
    let mut text = feed_status_table(&feeds)?.render("(no feeds)");
    text.push('\n');
    text.push_str(&outboxes::outbox_table(&outboxes).render("(no outboxes)"));
    if let Some(consumers) = &consumers {
        text.push('\n');
        text.push_str(&consumer_lag_table(consumers)?.render("(no consumers)"));
    }
    out.text(&text)
}

/// `status` with a `mysql://` URL: the database's outboxes (MariaDB/MySQL has no feeds).
#[cfg(feature = "mysql")]
async fn mysql_status(connect: &Connect, out: &mut Out, args: StatusArgs) -> Result<(), Failure> {
    use crate::database::CHECK_URL;

    if args.consumers {
        return Err(Failure::usage(
            "--consumers shows feed consumers, which only SQL Server has",
        ));
    }
    let opts = changefeed::mysql::opts(&connect.url).map_err(|e| Failure::usage(e.to_string()))?;
    let outboxes = outboxes::mysql(&opts, connect.timeout)
        .await
        .map_err(|error| match error {
            Error::Connection(message) => Failure::connect(format!(
                "{message}; {CHECK_URL} (or raise --connect-timeout)"
            )),
            other => Failure::run(other.to_string()),
        })?;
    if args.json {
        return out.line(&serde_json::json!({ "outboxes": outboxes }).to_string());
    }
    out.text(&outboxes::outbox_table(&outboxes).render("(no outboxes)"))
}

#[cfg(not(feature = "mysql"))]
async fn mysql_status(_: &Connect, _: &mut Out, _: StatusArgs) -> Result<(), Failure> {
    Err(Failure::usage(
        "this changefeed was built without MariaDB/MySQL support; build it with --features \
         cli,mysql to use a mysql:// URL",
    ))
}

/// `status` with a `postgres://` URL: feeds, outboxes and, with `--consumers`, consumers.
#[cfg(feature = "postgres")]
async fn postgres_status(
    connect: &Connect,
    out: &mut Out,
    args: StatusArgs,
) -> Result<(), Failure> {
    use crate::database::postgres::{call, open, settings};

    let config = settings(connect)?;
    let client = open(connect, &config).await?;
    let decode = |e: tokio_postgres::Error| Failure::run(format!("status: {e}"));
    let rows = call("feed_status", client.query(postgres::FEED_STATUS, &[])).await?;
    let feeds = postgres::feed_shards(&rows).map_err(decode)?;
    let outboxes = outboxes::postgres(&client).await?;
    let consumers = if args.consumers {
        let rows = call("consumer_lag", client.query(postgres::CONSUMER_LAG, &[])).await?;
        Some(postgres::consumer_lags(&rows, &feeds).map_err(decode)?)
    } else {
        None
    };
    if args.json {
        let mut document = serde_json::json!({ "feeds": feeds, "outboxes": outboxes });
        if let Some(consumers) = &consumers {
            document["consumers"] = serde_json::json!(consumers);
        }
        return out.line(&document.to_string());
    }
    let mut text = postgres::feed_table(&feeds).render("(no feeds)");
    text.push('\n');
    text.push_str(&outboxes::outbox_table(&outboxes).render("(no outboxes)"));
    if let Some(consumers) = &consumers {
        text.push('\n');
        text.push_str(&postgres::consumer_table(consumers).render("(no consumers)"));
    }
    out.text(&text)
}

#[cfg(not(feature = "postgres"))]
async fn postgres_status(_: &Connect, _: &mut Out, _: StatusArgs) -> Result<(), Failure> {
    Err(Failure::without_postgres())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::test_rows::{row, text, ulid};
    use tiberius::ColumnType as T;
    use ulid::Ulid;

    /// A `feed_status` row: feed, mode, shard, depth, head, the time of everything, problem.
    fn feed_status(
        feed: &str,
        mode: &str,
        shard: Option<i32>,
        depth: Option<i64>,
        head: Option<Ulid>,
        at: Option<tiberius::time::DateTime2>,
        problem: Option<&str>,
    ) -> Row {
        row(vec![
            ("feed", T::NVarchar, text(Some(feed))),
            ("mode", T::BigVarChar, text(Some(mode))),
            ("shard_id", T::Int4, ColumnData::I32(shard)),
            ("outbox_depth", T::Int8, ColumnData::I64(depth)),
            (
                "oldest_pending_at",
                T::Datetime2,
                ColumnData::DateTime2(None),
            ),
            ("head_ulid", T::BigBinary, ulid(head)),
            ("head_at", T::Datetime2, ColumnData::DateTime2(at)),
            ("state_updated_at", T::Datetime2, ColumnData::DateTime2(at)),
            ("purged_through", T::BigBinary, ulid(None)),
            ("problem", T::NVarchar, text(problem)),
        ])
    }

    #[test]
    fn feed_status_rows_become_the_status_table() {
        let head = Ulid::from_parts(1_714_564_800_123, 1);
        let at = tiberius::time::DateTime2::new(
            tiberius::time::Date::new(
                (time::macros::date!(2024 - 05 - 01).to_julian_day()
                    - time::macros::date!(0001 - 01 - 01).to_julian_day()) as u32,
            ),
            tiberius::time::Time::new(12 * 3_600_000 + 123, 3),
        );
        let ok = feed_status(
            "app.Order",
            "outbox",
            Some(0),
            Some(12),
            Some(head),
            Some(at),
            None,
        );
        let broken = feed_status(
            "app.Gone",
            "serialize_writers",
            None,
            None,
            None,
            None,
            Some("The event table 'app.Gone' was dropped"),
        );
        let with_broken = feed_status_table(&[broken]).unwrap().render("(no feeds)");
        assert!(
            with_broken
                .lines()
                .nth(1)
                .is_some_and(|line| line.starts_with("app.Gone")
                    && line.ends_with("The event table 'app.Gone' was dropped")),
            "{with_broken}"
        );
        let text = feed_status_table(&[ok]).unwrap().render("(no feeds)");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("feed       mode    shard  outbox_depth  oldest_pending_at"));
        assert!(
            lines[1].starts_with("app.Order  outbox      0            12  -"),
            "{text}"
        );
        assert!(lines[1].contains(&head.to_string()), "{text}");
        assert!(lines[1].contains("2024-05-01T12:00:00.123Z"), "{text}");
        assert!(lines[1].ends_with('-'), "{text}");

        let empty = feed_status_table(&[]).unwrap().render("(no feeds)");
        assert_eq!(empty.lines().nth(1), Some("(no feeds)"));
        assert!(empty.starts_with("feed  mode  shard  outbox_depth  oldest_pending_at  head_ulid"));
    }

    #[test]
    fn consumer_lag_rows_show_a_human_lag() {
        let lag = row(vec![
            ("consumer", T::NVarchar, text(Some("billing"))),
            ("feed", T::NVarchar, text(Some("app.Order"))),
            ("shard_id", T::Int4, ColumnData::I32(Some(0))),
            ("cursor", T::BigBinary, ulid(Some(Ulid(0)))),
            ("cursor_at", T::Datetime2, ColumnData::DateTime2(None)),
            ("head_at", T::Datetime2, ColumnData::DateTime2(None)),
            ("lag_ms", T::Int8, ColumnData::I64(Some(180_000))),
            ("not_yet_in_feed", T::Int8, ColumnData::I64(None)),
            ("expired", T::Bit, ColumnData::Bit(Some(false))),
        ]);
        let shown = consumer_lag_table(&[lag]).unwrap().render("(no consumers)");
        let line = shown.lines().nth(1).unwrap();
        assert!(line.contains("00000000000000000000000000"), "{shown}");
        assert!(line.contains("3 min"), "{shown}");
        assert!(line.ends_with("no"), "{shown}");
        let missing = row(vec![("consumer", T::NVarchar, text(None))]);
        let error = consumer_lag_table(&[missing]).unwrap_err();
        assert!(error.to_string().contains("no such column"), "{error}");
    }
}
