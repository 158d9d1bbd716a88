//! The outboxes part of `changefeed status`: each claim outbox's backlog (the store's
//! `backlog` query) and, on SQL Server, its `held_aggregates`, on every store.

use changefeed::outbox::OutboxBacklog;
use changefeed::row::Column;
use changefeed::{Error, TableName};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::database::query_rows;
use crate::output::{Align, Table, human_lag};

/// One outbox as `status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct OutboxStatus {
    /// `schema.table` (SQL Server), the table name (MariaDB/MySQL).
    pub outbox: String,
    /// Its backlog; `None` when it could not be read (see `problem`).
    #[serde(flatten)]
    pub backlog: Option<OutboxBacklog>,
    /// SQL Server: the aggregates whose messages wait behind a row an open transaction
    /// holds (`held_aggregates`' first result set), one object per aggregate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_aggregates: Option<Vec<Map<String, Value>>>,
    /// Why the outbox cannot be shown (its table was dropped, the bundle is older than the
    /// backlog procedure, ...), with what to do.
    pub problem: Option<String>,
}

/// The outboxes table: counts, the oldest open message's age, held aggregates, problem.
pub fn outbox_table(outboxes: &[OutboxStatus]) -> Table {
    let mut table = Table::new(&[
        ("outbox", Align::Left),
        ("pending", Align::Right),
        ("processing", Align::Right),
        ("failed", Align::Right),
        ("dead", Align::Right),
        ("oldest_open", Align::Right),
        ("held_aggregates", Align::Right),
        ("problem", Align::Left),
    ]);
    let dash = || "-".to_owned();
    for status in outboxes {
        let counts = match &status.backlog {
            Some(b) => [b.pending, b.processing, b.failed, b.dead].map(count_cell),
            None => [dash(), dash(), dash(), dash()],
        };
        let age = status
            .backlog
            .as_ref()
            .and_then(|b| b.oldest_open_age)
            .map_or_else(dash, |age| {
                human_lag(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
            });
        let [pending, processing, failed, dead] = counts;
        table.push(vec![
            status.outbox.clone(),
            pending,
            processing,
            failed,
            dead,
            age,
            status
                .held_aggregates
                .as_ref()
                .map_or_else(dash, |held| held.len().to_string()),
            status.problem.clone().unwrap_or_else(dash),
        ]);
    }
    table
}

/// A count, `100000+` at the limit (the query counts no further).
fn count_cell(count: u64) -> String {
    if count >= changefeed::outbox::BACKLOG_COUNT_LIMIT {
        format!("{count}+")
    } else {
        count.to_string()
    }
}

/// Every outbox registered in `changefeed.outboxes` of a SQL Server database.
pub async fn sql_server(client: &mut changefeed::Client) -> Result<Vec<OutboxStatus>, Error> {
    let rows = query_rows(
        client,
        "select schema_name, table_name, problem from changefeed.outboxes \
         order by schema_name, table_name",
        &[],
    )
    .await?;
    let mut outboxes = Vec::with_capacity(rows.len());
    for row in &rows {
        let schema = String::column(row, 0)?;
        let name = String::column(row, 1)?;
        let problem = Option::<String>::column(row, 2)?;
        let outbox = format!("{schema}.{name}");
        let mut status = OutboxStatus {
            outbox: outbox.clone(),
            backlog: None,
            held_aggregates: None,
            problem,
        };
        if status.problem.is_none() {
            // The registry's names passed setup_outbox's checks; parse them again anyway
            // before they reach SQL.
            match outbox.parse::<TableName>() {
                Ok(table) => read_sql_server(client, table, &mut status).await?,
                Err(error) => status.problem = Some(error.to_string()),
            }
        }
        outboxes.push(status);
    }
    Ok(outboxes)
}

async fn read_sql_server(
    client: &mut changefeed::Client,
    table: TableName,
    status: &mut OutboxStatus,
) -> Result<(), Error> {
    let store = changefeed::outbox_store::OutboxStore::new(table.clone());
    match store.backlog(client).await {
        Ok(backlog) => status.backlog = Some(backlog),
        // An outbox generated before the bundle's backlog procedure (V79).
        Err(error) if error.server_number() == Some(2812) => {
            status.problem = Some(format!(
                "{} does not exist: run `changefeed migrate`, which regenerates every \
                 outbox's procedures",
                table.object("backlog")
            ));
            return Ok(());
        }
        // One outbox's own problem (its table dropped, a permission missing, a dirty read
        // that lost its place) is shown on its line; the other outboxes are still listed.
        // A lost connection ends the command.
        Err(error) if !matches!(error, Error::Connection(_) | Error::Redirect { .. }) => {
            status.problem = Some(format!("{}: {error}", table.object("backlog")));
            return Ok(());
        }
        Err(error) => return Err(error),
    }
    let held = match query_rows(
        client,
        &format!("exec {}", table.object("held_aggregates")),
        &[],
    )
    .await
    {
        Ok(rows) => rows,
        Err(error) if !matches!(error, Error::Connection(_) | Error::Redirect { .. }) => {
            status.problem = Some(format!("{}: {error}", table.object("held_aggregates")));
            return Ok(());
        }
        Err(error) => return Err(error),
    };
    let held = held
        .iter()
        .map(|row| changefeed::json::row_json(row, 0))
        .collect::<Result<Vec<_>, _>>()?;
    status.held_aggregates = Some(held);
    Ok(())
}

/// Every claim outbox of the URL's MariaDB/MySQL database: the tables with the outbox's
/// `open_messages` and `done_by_processed_at` indexes (there is no registry there).
#[cfg(feature = "mysql")]
pub async fn mysql(
    opts: &mysql_async::Opts,
    connect_timeout: std::time::Duration,
) -> Result<Vec<OutboxStatus>, Error> {
    use changefeed::mysql::MysqlOutboxStore;
    use mysql_async::prelude::Queryable;

    let mut conn = changefeed::mysql::connect_within(opts, connect_timeout).await?;
    let tables: Vec<String> = conn
        .query(
            "select table_name from information_schema.statistics \
             where table_schema = database() \
             and index_name in ('open_messages', 'done_by_processed_at') \
             group by table_name having count(distinct index_name) = 2 \
             order by table_name",
        )
        .await?;
    conn.disconnect().await.ok();
    let mut outboxes = Vec::with_capacity(tables.len());
    for name in tables {
        let mut status = OutboxStatus {
            outbox: name.clone(),
            backlog: None,
            held_aggregates: None,
            problem: None,
        };
        match name.parse() {
            Ok(table) => {
                let mut store =
                    MysqlOutboxStore::new(table, opts.clone()).connect_timeout(connect_timeout);
                status.backlog = Some(store.backlog().await?);
            }
            // A table changefeed would not have made (its name is not one setup_outbox
            // takes): shown, not read.
            Err(error) => status.problem = Some(error.to_string()),
        }
        outboxes.push(status);
    }
    Ok(outboxes)
}

/// Every claim outbox of the URL's PostgreSQL database: the tables whose
/// `changefeed_order` trigger runs `changefeed.order_aggregate` (setup_outbox adds it; the
/// bundle keeps no registry of outboxes). An outbox whose backlog cannot be read (a
/// permission missing, a column dropped) is shown with that problem; the others are still
/// listed. A lost connection, or no answer within the call timeout, ends the command.
#[cfg(feature = "postgres")]
pub async fn postgres(
    client: &tokio_postgres::Client,
) -> Result<Vec<OutboxStatus>, crate::failure::Failure> {
    use changefeed::postgres::{OutboxTable, backlog};

    use crate::database::postgres::call;
    use crate::failure::Failure;

    let rows = call(
        "listing the outboxes",
        client.query(
            "select n.nspname::text, c.relname::text \
             from pg_trigger as t \
             join pg_proc as p on p.oid = t.tgfoid \
             join pg_namespace as pn on pn.oid = p.pronamespace \
             join pg_class as c on c.oid = t.tgrelid \
             join pg_namespace as n on n.oid = c.relnamespace \
             where t.tgname = 'changefeed_order' and pn.nspname = 'changefeed' \
             and p.proname = 'order_aggregate' \
             order by n.nspname, c.relname",
            &[],
        ),
    )
    .await?;
    let mut outboxes = Vec::with_capacity(rows.len());
    for row in &rows {
        let schema: String = row.get(0);
        let name: String = row.get(1);
        let mut status = OutboxStatus {
            outbox: format!("{schema}.{name}"),
            backlog: None,
            held_aggregates: None,
            problem: None,
        };
        // A table changefeed would not have made (its name is not one setup_outbox takes):
        // shown, not read.
        match status.outbox.parse::<OutboxTable>() {
            // Bounded in time by the library.
            Ok(table) => match backlog(client, &table).await {
                Ok(read) => status.backlog = Some(read),
                Err(error) if !matches!(error, Error::Connection(_)) => {
                    status.problem = Some(format!("backlog of {table}: {error}"));
                }
                Err(error) => return Err(Failure::run(format!("status: {error}"))),
            },
            Err(error) => status.problem = Some(error.to_string()),
        }
        outboxes.push(status);
    }
    Ok(outboxes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outboxes_show_counts_age_held_and_problems() {
        let backlog = OutboxBacklog::new(12, 3, 1, 100_000, Some(90_000));
        let ok = OutboxStatus {
            outbox: "dbo.outbox".into(),
            backlog: Some(backlog.clone()),
            held_aggregates: Some(vec![Map::new()]),
            problem: None,
        };
        let broken = OutboxStatus {
            outbox: "dbo.gone".into(),
            backlog: None,
            held_aggregates: None,
            problem: Some("the table was dropped".into()),
        };
        let text = outbox_table(&[ok.clone(), broken]).render("(no outboxes)");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("outbox      pending  processing  failed"),
            "{text}"
        );
        assert!(
            lines[1].contains("12") && lines[1].contains("100000+"),
            "{text}"
        );
        assert!(lines[1].contains("1.5 min"), "{text}");
        assert!(lines[2].ends_with("the table was dropped"), "{text}");
        let json = serde_json::to_value(&ok).unwrap();
        assert_eq!(json["pending"], 12);
        assert_eq!(json["dead"], 100_000);
        assert_eq!(json["oldest_open_age_seconds"], 90.0);
        assert_eq!(json["held_aggregates"].as_array().unwrap().len(), 1);
        assert!(json["problem"].is_null());
        assert_eq!(backlog.oldest_open_age, Some(Duration::from_secs(90)));
        assert!(backlog.is_capped());
    }
}
