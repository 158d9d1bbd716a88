//! The outbox's backlog on PostgreSQL: what `changefeed status` and the relay's
//! `changefeed_outbox_*` gauges show, as on the other stores.

use tokio_postgres::{Client, Row};

use super::connection::{CALL_TIMEOUT, SERVER};
use super::table::OutboxTable;
use crate::call_bound::bounded;
use crate::error::{Result, decode_error};
use crate::outbox::{BACKLOG_COUNT_LIMIT, OutboxBacklog};

/// The backlog of `table` read on `client`, a connection of your own (the store's
/// [`PostgresOutboxStore::backlog`](super::PostgresOutboxStore::backlog) is the same on the
/// store's connection), within [`CALL_TIMEOUT`]: past it, [`Error::Connection`] (the
/// connection is then in an unknown state; drop it).
///
/// [`Error::Connection`]: crate::Error::Connection
pub async fn backlog(client: &Client, table: &OutboxTable) -> Result<OutboxBacklog> {
    let sql = backlog_query(&table.quoted());
    let row = bounded(SERVER, CALL_TIMEOUT, "backlog", async {
        Ok(client.query_one(&sql, &[]).await?)
    })
    .await?;
    decode(&row)
}

/// The statement [`PostgresOutboxStore::backlog`](super::PostgresOutboxStore::backlog) runs
/// on the quoted table `table`: one row of the pending, processing, failed and dead counts,
/// each stopping at [`BACKLOG_COUNT_LIMIT`], and the oldest open message's age in
/// milliseconds by the server's clock (NULL when none is open).
///
/// * Pending, processing and failed are open statuses, which imply the predicate of the
///   partial index `<table>_open` (`(id) where status in (0, 1, 3)`): those counts read
///   open rows only, however many rows are done.
/// * The oldest open message is the first entry of that index.
/// * Dead rows have no index of their own (setup_outbox makes none for them), so the dead
///   count reads the table until it has counted the limit; like every call of the store it
///   is bounded by the session's statement timeout.
///
/// It reads its snapshot and takes no lock, so it never waits for a claim, an
/// acknowledgement or an open enqueue (whose rows it does not count yet).
pub fn backlog_query(table: &str) -> String {
    let count = |status: u8| {
        format!(
            "(select count(*) from (select 1 from {table} where status = {status} \
             limit {BACKLOG_COUNT_LIMIT}) as s{status})"
        )
    };
    format!(
        "select {}, {}, {}, {}, (select (extract(epoch from now() - o.created_at) * 1000)::bigint \
         from {table} as o where o.status in (0, 1, 3) order by o.id limit 1)",
        count(0),
        count(1),
        count(3),
        count(4)
    )
}

/// The backlog in the row [`backlog_query`] returns.
pub(super) fn decode(row: &Row) -> Result<OutboxBacklog> {
    let count = |at: usize| -> Result<u64> {
        let n: i64 = row
            .try_get(at)
            .map_err(|e| decode_error("a backlog count", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let age_ms: Option<i64> = row
        .try_get(4)
        .map_err(|e| decode_error("the oldest open message's age", e))?;
    Ok(OutboxBacklog::new(
        count(0)?,
        count(1)?,
        count(2)?,
        count(3)?,
        age_ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_count_stops_at_the_limit_and_the_age_reads_open_rows_in_id_order() {
        let sql = backlog_query("\"app\".\"outbox\"");
        for status in [0, 1, 3, 4] {
            assert!(
                sql.contains(&format!(
                    "where status = {status} limit {BACKLOG_COUNT_LIMIT}"
                )),
                "{sql}"
            );
        }
        assert!(
            sql.contains("where o.status in (0, 1, 3) order by o.id limit 1"),
            "{sql}"
        );
    }
}
