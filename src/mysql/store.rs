//! [`MysqlOutboxStore`]: the claim outbox's operations over MariaDB/MySQL for a relay
//! (claim, acknowledge, backlog, redrive, purge). [`enqueue`](super::enqueue), which runs in
//! the caller's transaction, is `enqueue.rs`; the claim's steps are `claim.rs`.
//!
//! The semantics are those of the SQL Server procedures (docs/sql-server.md, "The claim
//! outbox"): status 0 pending, 1 processing, 2 done, 3 failed, 4 dead; `attempts` counts
//! failures and expired claims; every acknowledgement is fenced by the claim token; every
//! time is the server's UTC clock. How the claim keeps them under InnoDB's locking is
//! explained on [`MysqlOutboxStore::claim_batch`].

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Value};

use super::claim::{MAX_PACKET, Reach, claim_in, id_list, token_literal};
use super::connection;
use super::enqueue::before_v4;
use super::table::OutboxTable;
use crate::claim_limits::{
    MAX_CLAIM_TIMEOUT, MAX_RETRY, call_bound, check_claim, check_purge, failure_retry_us, micros,
    read_far,
};
use crate::error::{Error, Result};
use crate::outbox::{BACKLOG_COUNT_LIMIT, ClaimStore, ClaimToken, Claimed, Failed, OutboxBacklog};
use crate::outbox_backend::{bounded, purge_in_batches};

/// The claim outbox `table` over MariaDB/MySQL, for a [`Relay`](crate::relay::Relay): it
/// owns one connection, opened on first use and again after a connection-level failure.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::mysql::MysqlOutboxStore;
/// use changefeed::relay::{Relay, RelayConfig};
/// # struct Stdout;
/// # impl changefeed::relay::Publisher for Stdout {
/// #     async fn publish(&self, b: &[changefeed::outbox::ClaimedMessage]) -> Vec<changefeed::relay::PublishOutcome> { vec![Ok(()); b.len()] }
/// # }
///
/// let store = MysqlOutboxStore::connect("outbox", "mysql://relay:secret@localhost:3306/app")?;
/// let relay = Relay::new(store, Stdout, RelayConfig::default())?;
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct MysqlOutboxStore {
    table: OutboxTable,
    opts: Opts,
    conn: Option<Conn>,
    connect_timeout: Duration,
    /// The bound on each call: the last claim's timeout (see [`Self::claim_batch`]).
    call_timeout: Duration,
    /// Where the next claim looks for heads (see [`Self::claim_batch`]).
    reach: Reach,
}

impl MysqlOutboxStore {
    /// A store for `table` that connects with `opts` (see [`connection::opts`]).
    pub fn new(table: OutboxTable, opts: Opts) -> Self {
        MysqlOutboxStore {
            table,
            opts,
            conn: None,
            connect_timeout: connection::DEFAULT_CONNECT_TIMEOUT,
            call_timeout: crate::relay::RelayConfig::DEFAULT_CLAIM_TIMEOUT,
            reach: Reach::default(),
        }
    }

    /// The bound on opening a connection (default
    /// [`DEFAULT_CONNECT_TIMEOUT`](connection::DEFAULT_CONNECT_TIMEOUT), 15 s).
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    /// A store for the table named `table` at the `mysql://` URL `url`. Nothing connects
    /// until the first call.
    pub fn connect(table: &str, url: &str) -> Result<Self> {
        Ok(Self::new(table.parse()?, connection::opts(url)?))
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// Runs `call` (named `what` in a timeout's error) on the store's connection, opening it
    /// first if needed, for at most `limit`; a connection-level failure (a timeout among
    /// them) drops the connection so that the next call opens a fresh one.
    async fn with_conn<T>(
        &mut self,
        what: &str,
        limit: Duration,
        call: impl AsyncFnOnce(&OutboxTable, &mut Conn) -> Result<T>,
    ) -> Result<T> {
        if self.conn.is_none() {
            self.conn = Some(connection::connect_within(&self.opts, self.connect_timeout).await?);
            crate::metrics::store_connected(self.table.name(), "mysql");
        }
        let conn = self.conn.as_mut().expect("connected above");
        let result = bounded(connection::SERVER, limit, what, call(&self.table, conn)).await;
        // A connection-level failure (or no answer in time) leaves the connection in an
        // unknown state: the next call opens a fresh one.
        if let Err(Error::Connection(_)) = &result {
            self.conn = None;
        }
        result
    }

    /// Claims up to `batch_size` due messages (1..=10000) for `claim_timeout`
    /// (1 ms..=24 h), head of aggregate only, ordered by id, in one transaction:
    ///
    /// 1. `SELECT … FORCE INDEX (open_messages) WHERE is_open = 1 AND <due> AND <no earlier
    ///    open row of the aggregate> AND id > <last candidate> ORDER BY id LIMIT n FOR UPDATE
    ///    SKIP LOCKED`, without the payload and headers. The index `(is_open, id)` yields
    ///    candidates in id order, so the LIMIT stops the scan early and only the rows
    ///    returned are locked (a filesort would lock every candidate). SKIP LOCKED passes
    ///    over rows another claimer or an uncommitted enqueue holds, so an open business
    ///    transaction never stalls the claim. The head probe (the aggregate's first open id,
    ///    no lower than the candidate's) is a subquery, which InnoDB reads as a consistent
    ///    (non-locking) read of committed rows: it never waits either. Due: pending; failed
    ///    and due again; or processing past its claim's own expiry (`claim_expires_at`, set
    ///    by the claimer from its timeout; for a row claimed before the bundle's V4,
    ///    `claimed_at` plus this claim's timeout).
    /// 2. That probe cannot see an *uncommitted* earlier row of the same aggregate. Rows
    ///    [`enqueue`](super::enqueue) writes cannot be in that state (it takes the
    ///    aggregate's lock before the row gets its id, so a later row of the aggregate
    ///    commits after it), but rows written by other means can, so for the candidates
    ///    with an aggregate a second probe `SELECT … FORCE INDEX (head_of_aggregate) WHERE
    ///    (aggregate_id = ? AND is_open = 1 AND id < <candidate>) OR … FOR UPDATE NOWAIT`
    ///    drops a candidate whose range holds a row or a lock (NOWAIT refuses at once
    ///    instead of waiting). Each range ends at the candidate's own index entry, which
    ///    this transaction already holds, so rows of other aggregates are never touched.
    /// 3. Steps 1 and 2 repeat after the last candidate seen, up to 8 rounds each scanning
    ///    twice as far as the one before (up to 10 000 rows), until the batch is full or the
    ///    scan runs out: candidates dropped in step 2 do not use up the batch, so an open
    ///    transaction delays only its own aggregates.
    ///
    ///    That scan reads every open message behind heads it cannot take (in flight,
    ///    waiting for a retry): with a deep backlog on a few aggregates each claim would
    ///    take as long as the backlog is long, and past a few million messages longer than
    ///    the claim's time bound, so that nothing would be delivered. So the store's first
    ///    claim, and every claim after one that took over 100 ms (or 100 µs a message of
    ///    the batch) or failed, stops its scan at the first batch × 16 open messages
    ///    (the id at that offset of `open_messages`), and if the batch is not full there
    ///    walks the index `open_heads (is_open, aggregate_id, id)`: one descent per
    ///    aggregate with open messages finds its head, at most batch × 16 aggregates (and
    ///    2048) a claim, each walk going on where the last stopped; the due heads past the scan
    ///    (and due messages without an aggregate) are taken as in steps 1 and 2, lowest
    ///    ids first. The store goes back to the one scan once a scan fills its batch
    ///    within that reach or fewer messages than the reach are open. A table without
    ///    `open_heads` (an outbox made before the bundle's V5, until
    ///    `changefeed_setup_outbox` runs again) is always scanned whole.
    /// 4. `UPDATE … SET status = 1, attempts = attempts + (status = 1), claimed_at,
    ///    claim_expires_at, claim_token = <fresh token> WHERE id IN (…) AND <due>`. The
    ///    `<due>` guard matters when the transaction did not survive step 2: with
    ///    `innodb_rollback_on_timeout=ON` a refused NOWAIT rolls the whole transaction back
    ///    and releases step 1's locks; the guard then keeps the update from taking a row
    ///    another relay claimed meanwhile or reopening one already done. A row the update
    ///    cannot write (a payload that breaks the table's CHECK constraint, MariaDB error
    ///    4025) is isolated by updating the batch row by row, and marked dead with its
    ///    error; the rest is claimed.
    /// 5. `SELECT id, attempts, payload, headers … WHERE id IN (…) AND claim_token = <token>`
    ///    reads back what this claim holds, then COMMIT. A row whose payload and headers
    ///    would not fit in one packet of this connection (`max_allowed_packet`, as the server
    ///    and the URL's `max_allowed_packet` set it, less 1 KiB for the rest of the row) comes
    ///    without them, as [`Claimed::Undecodable`], and so does a row whose columns do not
    ///    decode: the relay marks such rows dead instead of failing every claim.
    ///
    /// The session runs READ COMMITTED (see [`connection::connect`]): under REPEATABLE
    /// READ the scan's gap locks would make concurrent claimers wait on each other.
    pub async fn claim_batch(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> Result<Vec<Claimed>> {
        check_claim(batch_size, claim_timeout)?;
        self.call_timeout = call_bound(claim_timeout, MAX_CLAIM_TIMEOUT);
        let timeout_us = claim_timeout.as_micros();
        let packet_limit = self.opts.max_allowed_packet().unwrap_or(MAX_PACKET);
        let mut reach = std::mem::take(&mut self.reach);
        let started = Instant::now();
        let result = self
            .with_conn("claim", self.call_timeout, async |table, conn| {
                let result = claim_in(
                    conn,
                    table,
                    batch_size,
                    timeout_us,
                    packet_limit,
                    &mut reach,
                )
                .await
                .map_err(|error| before_v4(error, table));
                if let Err(error) = &result
                // The transaction may still be open (an error after START TRANSACTION).
                && let Err(rollback) = conn.query_drop("rollback").await
                {
                    // Reported as a connection failure, so that with_conn drops the connection.
                    return Err(Error::Connection(format!(
                        "{error}; then the rollback failed too ({rollback})"
                    )));
                }
                result
            })
            .await;
        if !reach.near && read_far(result.is_err(), started.elapsed(), batch_size) {
            // It read far, or did not finish: the next claims stop at the reach.
            reach.near = true;
        }
        if self.conn.is_none() {
            // A new connection looks for the index again (setup_outbox may have added it).
            reach.heads_index = None;
        }
        self.reach = reach;
        result
    }

    /// The outbox's backlog: pending, processing, failed and dead counts (each stopping at
    /// [`BACKLOG_COUNT_LIMIT`]) and the age of the oldest open message, by the server's
    /// clock, in one statement ([`backlog_query`]) that stays cheap on a large outbox:
    ///
    /// * each count reads entries of the index `done_by_processed_at (status, …)` for one
    ///   status and nothing else (an index-only range, EXPLAIN's "Using index"), at most
    ///   [`BACKLOG_COUNT_LIMIT`] of them (`LIMIT` inside the count): done rows, however
    ///   many, are never read;
    /// * the oldest open message is `MIN(id)` over `open_messages (is_open, id)`, which
    ///   the optimizer answers from the index's first entry ("Select tables optimized
    ///   away"), then one primary-key read for its `created_at`.
    ///
    /// It reads under the session's READ COMMITTED without locking, so it never waits for a
    /// claim, an acknowledgement or an open enqueue (whose rows it does not count yet).
    pub async fn backlog(&mut self) -> Result<OutboxBacklog> {
        let sql = backlog_query(&self.table);
        self.with_conn("backlog", self.call_timeout, async |_table, conn| {
            let row: Option<(i64, i64, i64, i64, Option<i64>)> = conn.query_first(sql).await?;
            let (pending, processing, failed, dead, age_ms) = row.unwrap_or_default();
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            Ok(OutboxBacklog::new(
                count(pending),
                count(processing),
                count(failed),
                count(dead),
                age_ms,
            ))
        })
        .await
    }

    /// Hands a dead or failed message back as failed, due after `after` (server clock),
    /// attempts unchanged: an operator's redrive after fixing the cause (SQL Server's
    /// `requeue` without a token). Returns 1 if the message was dead or failed, else 0.
    pub async fn redrive(&mut self, id: i64, after: Duration) -> Result<u64> {
        let after_us = micros("after", after, MAX_RETRY)?;
        self.with_conn("redrive", self.call_timeout, async |table, conn| {
            conn.query_drop(format!(
                "update {} set status = 3, \
                 next_retry_at = utc_timestamp(3) + interval {after_us} microsecond, \
                 processed_at = null where id = {id} and status in (3, 4)",
                table.quoted()
            ))
            .await?;
            Ok(conn.affected_rows())
        })
        .await
    }

    /// Deletes done messages processed more than `older_than` ago (cutoff on the server's
    /// clock, 0..=100 years), `batch_size` rows per statement (1..=4000, each its own
    /// transaction), at most `max_rows` in all (`None`: no limit). Dead messages are kept.
    /// Returns how many rows went.
    pub async fn purge_done(
        &mut self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> Result<u64> {
        let older_than_us = check_purge(older_than, batch_size, max_rows)?;
        // A purge of many batches may take long as a whole: each statement is bounded
        // instead (a timeout drops the connection, and the purge stops with the error).
        let limit = self.call_timeout;
        self.with_conn("purge_done", MAX_CLAIM_TIMEOUT, async |table, conn| {
            // One cutoff for every batch, so rows done while the purge runs are not chased.
            bounded(connection::SERVER, limit, "purge_done", async {
                Ok(conn
                    .query_drop(format!(
                        "set @changefeed_cutoff = utc_timestamp(3) - interval {older_than_us} \
                         microsecond"
                    ))
                    .await?)
            })
            .await?;
            let deleted = purge_in_batches(batch_size, max_rows, async |take| {
                bounded(connection::SERVER, limit, "purge_done", async {
                    Ok(conn
                        .query_drop(format!(
                            "delete from {} where status = 2 \
                             and processed_at < @changefeed_cutoff limit {take}",
                            table.quoted()
                        ))
                        .await?)
                })
                .await?;
                Ok(conn.affected_rows())
            })
            .await?;
            forget_idle_aggregates(conn, table, batch_size).await?;
            Ok(deleted)
        })
        .await
        .map_err(|error| before_v4(error, &self.table))
    }
}

/// The statement [`MysqlOutboxStore::backlog`] runs on `table`: one row of the pending,
/// processing, failed and dead counts and the oldest open message's age in milliseconds
/// (NULL when none is open). Public so that its plan can be checked with `EXPLAIN`.
pub fn backlog_query(table: &OutboxTable) -> String {
    let t = table.quoted();
    let count = |status: u8| {
        format!(
            "(select count(*) from (select 1 from {t} force index (done_by_processed_at) \
             where status = {status} limit {BACKLOG_COUNT_LIMIT}) as s{status})"
        )
    };
    format!(
        "select {}, {}, {}, {}, (select timestampdiff(microsecond, o.created_at, \
         utc_timestamp(3)) div 1000 from {t} as o where o.id = (select min(m.id) from {t} as m \
         force index (open_messages) where m.is_open = 1)) as oldest_open_age_ms",
        count(0),
        count(1),
        count(3),
        count(4)
    )
}

/// Deletes the `changefeed_aggregate_locks` rows of `table` whose aggregate has no row left
/// in the outbox and which no enqueue holds (SKIP LOCKED), `batch_size` at a time, so that
/// the table does not grow with every aggregate ever seen. Deleting a lock row nobody holds
/// never affects order: the row is only a lock, and the next enqueue of the aggregate makes
/// it again.
async fn forget_idle_aggregates(
    conn: &mut Conn,
    table: &OutboxTable,
    batch_size: u32,
) -> Result<()> {
    let t = table.quoted();
    loop {
        conn.query_drop("start transaction").await?;
        let idle: Vec<String> = match conn
            .exec(
                format!(
                    "select l.aggregate_id from changefeed_aggregate_locks as l \
                     where l.outbox = ? and not exists (select 1 from {t} as e \
                     force index (head_of_aggregate) where e.aggregate_id = l.aggregate_id) \
                     limit {batch_size} for update skip locked"
                ),
                (table.name(),),
            )
            .await
        {
            Ok(idle) => idle,
            Err(error) => {
                conn.query_drop("rollback").await.ok();
                return Err(error.into());
            }
        };
        if !idle.is_empty() {
            let marks = vec!["?"; idle.len()].join(", ");
            let mut params: Vec<Value> = vec![table.name().into()];
            params.extend(idle.iter().map(|a| Value::from(a.as_str())));
            if let Err(error) = conn
                .exec_drop(
                    format!(
                        "delete from changefeed_aggregate_locks where outbox = ? \
                         and aggregate_id in ({marks})"
                    ),
                    params,
                )
                .await
            {
                conn.query_drop("rollback").await.ok();
                return Err(error.into());
            }
        }
        conn.query_drop("commit").await?;
        if idle.len() < batch_size as usize {
            return Ok(());
        }
    }
}

impl ClaimStore for MysqlOutboxStore {
    async fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Result<Vec<Claimed>> {
        self.claim_batch(batch_size, claim_timeout).await
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.with_conn("mark_done", self.call_timeout, async |table, conn| {
            conn.query_drop(format!(
                "update {} set status = 2, processed_at = utc_timestamp(3), last_error = null \
                 where id in ({}) and status = 1 and claim_token = {}",
                table.quoted(),
                id_list(ids),
                token_literal(token)
            ))
            .await?;
            Ok(conn.affected_rows())
        })
        .await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> Result<u64> {
        let (id, token, dead) = (failed.id, failed.token, failed.dead);
        let retry_us = failure_retry_us(failed.retry_after, dead)?;
        let error: String = failed.error.chars().take(2000).collect();
        self.with_conn("mark_failed", self.call_timeout, async |table, conn| {
            let sql = format!(
                "update {} set status = if(?, 4, 3), attempts = attempts + 1, \
                 next_retry_at = if(?, null, utc_timestamp(3) + interval ? microsecond), \
                 processed_at = if(?, utc_timestamp(3), null), last_error = ? \
                 where id = ? and status = 1 and claim_token = ?",
                table.quoted()
            );
            let params: Vec<Value> = vec![
                dead.into(),
                dead.into(),
                retry_us.into(),
                dead.into(),
                error.as_str().into(),
                id.into(),
                token.as_bytes().to_vec().into(),
            ];
            conn.exec_drop(sql, params).await?;
            Ok(conn.affected_rows())
        })
        .await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        let after_us = micros("requeue after", after, MAX_RETRY)?;
        self.with_conn("requeue", self.call_timeout, async |table, conn| {
            conn.query_drop(format!(
                "update {} set status = 3, \
                 next_retry_at = utc_timestamp(3) + interval {after_us} microsecond, \
                 processed_at = null where id = {id} and status = 1 and claim_token = {}",
                table.quoted(),
                token_literal(token)
            ))
            .await?;
            Ok(conn.affected_rows())
        })
        .await
    }

    fn outbox_name(&self) -> String {
        self.table.name().to_owned()
    }
}
