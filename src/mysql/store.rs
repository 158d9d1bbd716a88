//! [`MysqlOutboxStore`]: the claim outbox's operations over MariaDB/MySQL, and
//! [`enqueue`], which runs in the caller's transaction.
//!
//! The semantics are those of the SQL Server procedures (README.md, "Claim outbox"): status
//! 0 pending, 1 processing, 2 done, 3 failed, 4 dead; `attempts` counts failures and expired
//! claims; every acknowledgement is fenced by the claim token; every time is the server's
//! UTC clock. How the claim keeps them under InnoDB's locking is explained on
//! [`MysqlOutboxStore::claim_batch`].

use std::fmt::Write as _;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row, Transaction, Value};

use super::connection;
use super::table::OutboxTable;
use crate::claim_limits::{
    MAX_BATCH, MAX_CLAIM_TIMEOUT, MAX_PURGE_WINDOW, MAX_RETRY, check_claim, check_purge, micros,
};
use crate::error::{Error, Result, decode_error};
use crate::outbox::{
    BACKLOG_COUNT_LIMIT, ClaimStore, ClaimToken, Claimed, ClaimedMessage, Enqueued, Headers,
    NewMessage, OutboxBacklog, UndecodableMessage,
};
use crate::outbox_store::{check_payload, parse_headers};

/// MariaDB answers a refused `NOWAIT` with 1205 (lock wait timeout), MySQL with 3572.
const NOWAIT_REFUSED: [u16; 2] = [1205, 3572];

/// Enqueues `message` into `table` inside the caller's transaction `tx`, so it commits or
/// rolls back with the business change it announces (a [`Transaction`] is the only way in:
/// enqueuing outside one cannot be written). A `message_id` already in the outbox is not
/// enqueued twice: the existing row comes back. Without a `message_id`, a random UUID is
/// made.
///
/// A message with an aggregate first locks that aggregate (its row in the bundle's
/// `changefeed_aggregate_locks`, until `tx` ends), so that within an aggregate the ids
/// follow commit order and the relay publishes in that order however the insert had to wait
/// (ARCHITECTURE.md). Two transactions enqueuing one aggregate therefore run one after the
/// other, and two enqueuing the same aggregates in opposite orders may deadlock (error
/// 1213, [`Error::is_transient`]: retry the transaction).
///
/// ```no_run
/// # async fn run(conn: &mut mysql_async::Conn) -> changefeed::Result<()> {
/// use changefeed::mysql::{OutboxTable, enqueue};
/// use changefeed::outbox::NewMessage;
/// use mysql_async::prelude::Queryable;
///
/// let table: OutboxTable = "outbox".parse()?;
/// let mut tx = conn.start_transaction(Default::default()).await?;
/// tx.exec_drop("update orders set state = 'paid' where id = ?", (42,)).await?;
/// let message = NewMessage::new("orders", serde_json::json!({"order": 42})).aggregate("order", "42");
/// enqueue(&mut tx, &table, &message).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue(
    tx: &mut Transaction<'_>,
    table: &OutboxTable,
    message: &NewMessage,
) -> Result<Enqueued> {
    check_message(message)?;
    let payload = message.payload.to_string();
    let headers = if message.headers.is_empty() {
        None
    } else {
        Some(serde_json::to_string(&message.headers).map_err(|e| decode_error("headers", e))?)
    };
    let message_id = message
        .message_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    // The aggregate's lock first, before the insert gives the row its AUTO_INCREMENT id:
    // whatever the insert may wait on after that (the unique key of a message_id another
    // transaction holds, a next-key lock left by an idempotent retry under REPEATABLE READ),
    // no later message of the aggregate can get an id until this transaction ends, so
    // within an aggregate ids follow commit order (ARCHITECTURE.md, "The claim outbox on
    // MariaDB/MySQL"). A duplicate primary key takes an exclusive record lock, no gap.
    if let Some(aggregate) = message.aggregate_id.as_deref() {
        tx.exec_drop(
            "insert into changefeed_aggregate_locks (outbox, aggregate_id) values (?, ?) \
             on duplicate key update outbox = outbox",
            (table.name(), aggregate),
        )
        .await
        .map_err(|error| before_v4(error.into(), table))?;
    }
    // On a key already there, `id = last_insert_id(id)` changes nothing and makes the OK
    // packet carry the existing row's id. The unique index serializes two transactions
    // enqueuing one key: the second waits for the first and then sees its row.
    let sql = format!(
        "insert into {} (message_id, topic, aggregate_type, aggregate_id, partition_key, \
         payload, headers, trace_id, created_at) \
         values (?, ?, ?, ?, ?, ?, ?, ?, utc_timestamp(3)) \
         on duplicate key update id = last_insert_id(id)",
        table.quoted()
    );
    let result = tx
        .exec_iter(
            sql,
            (
                message_id.as_str(),
                message.topic.as_str(),
                message.aggregate_type.as_deref(),
                message.aggregate_id.as_deref(),
                message.partition_key.as_deref(),
                payload.as_str(),
                headers.as_deref(),
                message.trace_id.as_deref(),
            ),
        )
        .await?;
    let id = result.last_insert_id();
    result.drop_result().await?;
    let id = id.ok_or_else(|| decode_error("id", "the insert reported no id"))?;
    Ok(Enqueued {
        id: i64::try_from(id).map_err(|e| decode_error("id", e))?,
        message_id,
    })
}

/// A database whose bundle or outbox predates V4 (no `changefeed_aggregate_locks` table, no
/// `claim_expires_at` column) answers 1146 or 1054: say what to run instead.
fn before_v4(error: Error, table: &OutboxTable) -> Error {
    match &error {
        Error::Mysql { code, message, .. }
            if (*code == 1146 && message.contains("changefeed_aggregate_locks"))
                || (*code == 1054 && message.contains("claim_expires_at")) =>
        {
            Error::Config(format!(
                "{error}. The outbox `{table}` or its database predates the bundle's V4: run \
                 changefeed::mysql::migrate, then CALL changefeed_setup_outbox('{table}') \
                 again (it adds what is missing and drops nothing)"
            ))
        }
        _ => error,
    }
}

/// The checks SQL Server's `enqueue` makes (its error 51304), made here before the insert:
/// MariaDB/MySQL outside strict mode would silently truncate a value too long for its
/// column, merging two message ids or changing a topic.
fn check_message(message: &NewMessage) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::Config(format!(
            "enqueue: {what}. Topic, aggregate_id and partition_key take at most 256 \
             characters, aggregate_type and trace_id 128, message_id 1 to 64 without \
             trailing spaces"
        )))
    };
    if message.topic.is_empty() {
        return refuse("the topic is empty".to_owned());
    }
    let limits = [
        ("topic", Some(message.topic.as_str()), 256),
        ("aggregate_type", message.aggregate_type.as_deref(), 128),
        ("aggregate_id", message.aggregate_id.as_deref(), 256),
        ("partition_key", message.partition_key.as_deref(), 256),
        ("message_id", message.message_id.as_deref(), 64),
        ("trace_id", message.trace_id.as_deref(), 128),
    ];
    for (field, value, limit) in limits {
        let length = value.map_or(0, |v| v.chars().count());
        if length > limit {
            return refuse(format!("{field} has {length} characters"));
        }
    }
    // utf8mb4_bin pads with spaces when comparing: 'k' and 'k ' would be one key.
    if let Some(id) = &message.message_id
        && (id.is_empty() || id.ends_with(' '))
    {
        return refuse(format!("message_id {id:?} is empty or ends with a space"));
    }
    check_payload(&message.payload)
}

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
        let result = connection::bounded(limit, what, call(&self.table, conn)).await;
        if let Err(Error::Connection(_)) = &result {
            self.conn = None;
        }
        result
    }

    /// Claims up to `batch_size` due messages (1..=10000) for `claim_timeout`
    /// (1 ms..=24 h), head of aggregate only, ordered by id, in one transaction:
    ///
    /// 1. `SELECT … FORCE INDEX (open_messages) WHERE is_open = 1 AND <due> AND NOT EXISTS
    ///    (<earlier open row of the aggregate>) AND id > <last candidate> ORDER BY id LIMIT n
    ///    FOR UPDATE SKIP LOCKED`, without the payload and headers. The index `(is_open, id)`
    ///    yields candidates in id order, so the LIMIT stops the scan early and only the rows
    ///    returned are locked (a filesort would lock every candidate). SKIP LOCKED passes
    ///    over rows another claimer or an uncommitted enqueue holds, so an open business
    ///    transaction never stalls the claim. The `NOT EXISTS` probe is a subquery, which
    ///    InnoDB reads as a consistent (non-locking) read of committed rows: it never waits
    ///    either. Due: pending; failed and due again; or processing past its claim's own
    ///    expiry (`claim_expires_at`, set by the claimer from its timeout; for a row claimed
    ///    before the bundle's V4, `claimed_at` plus this claim's timeout).
    /// 2. That probe cannot see an *uncommitted* earlier row of the same aggregate. Rows
    ///    [`enqueue`] writes cannot be in that state (it takes the aggregate's lock before
    ///    the row gets its id, so a later row of the aggregate commits after it), but rows
    ///    written by other means can, so for the candidates with an aggregate a second
    ///    probe `SELECT … FORCE INDEX (head_of_aggregate) WHERE (aggregate_id = ? AND
    ///    is_open = 1 AND id < <candidate>) OR … FOR UPDATE NOWAIT` drops a candidate whose
    ///    range holds a row or a lock (NOWAIT refuses at once instead of waiting). Each range
    ///    ends at the candidate's own index entry, which this transaction already holds, so
    ///    rows of other aggregates are never touched.
    /// 3. Steps 1 and 2 repeat after the last candidate seen, up to 8 rounds each scanning
    ///    twice as far as the one before (up to 10 000 rows), until the batch is full or the
    ///    scan runs out: candidates dropped in step 2 do not use up the batch, so an open
    ///    transaction delays only its own aggregates.
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
        self.call_timeout = claim_timeout.max(connection::MIN_CALL_BOUND);
        let timeout_us = claim_timeout.as_micros();
        let packet_limit = self.opts.max_allowed_packet().unwrap_or(MAX_PACKET);
        self.with_conn("claim", self.call_timeout, async |table, conn| {
            let result = claim_in(conn, table, batch_size, timeout_us, packet_limit)
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
        .await
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
        let older_than_us = micros("purge older_than", older_than, MAX_PURGE_WINDOW)?;
        check_purge(batch_size, max_rows)?;
        // A purge of many batches may take long as a whole: each statement is bounded
        // instead (a timeout drops the connection, and the purge stops with the error).
        let limit = self.call_timeout;
        self.with_conn("purge_done", MAX_CLAIM_TIMEOUT, async |table, conn| {
            // One cutoff for every batch, so rows done while the purge runs are not chased.
            connection::bounded(limit, "purge_done", async {
                Ok(conn
                    .query_drop(format!(
                        "set @changefeed_cutoff = utc_timestamp(3) - interval {older_than_us} \
                         microsecond"
                    ))
                    .await?)
            })
            .await?;
            let mut deleted = 0u64;
            loop {
                let take = max_rows.map_or(u64::from(batch_size), |max| {
                    (max - deleted).min(u64::from(batch_size))
                });
                if take == 0 {
                    break;
                }
                connection::bounded(limit, "purge_done", async {
                    Ok(conn
                        .query_drop(format!(
                            "delete from {} where status = 2 \
                             and processed_at < @changefeed_cutoff limit {take}",
                            table.quoted()
                        ))
                        .await?)
                })
                .await?;
                let count = conn.affected_rows();
                deleted += count;
                if count < take {
                    break;
                }
            }
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

    async fn mark_failed(
        &mut self,
        id: i64,
        token: ClaimToken,
        retry_after: Option<Duration>,
        dead: bool,
        error: &str,
    ) -> Result<u64> {
        let retry_us = match (dead, retry_after) {
            (true, _) => 0,
            (false, Some(after)) => micros("mark_failed retry_after", after, MAX_RETRY)?,
            (false, None) => {
                return Err(Error::Config(
                    "mark_failed: a failed message needs retry_after (when to try again), or \
                     dead = true to give up on it"
                        .to_owned(),
                ));
            }
        };
        let error: String = error.chars().take(2000).collect();
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

/// Integers for an `IN (…)` list: digits and commas only, safe inside SQL text.
fn id_list(ids: &[i64]) -> String {
    let mut list = String::with_capacity(ids.len() * 8);
    for (n, id) in ids.iter().enumerate() {
        if n > 0 {
            list.push_str(", ");
        }
        let _ = write!(list, "{id}");
    }
    list
}

/// The token as a hex literal, `x'…'`: hex digits only, safe inside SQL text.
fn token_literal(token: ClaimToken) -> String {
    let mut text = String::with_capacity(35);
    text.push_str("x'");
    for byte in token.as_bytes() {
        let _ = write!(text, "{byte:02x}");
    }
    text.push('\'');
    text
}

/// How many times one claim scans on after its last candidate before it settles for a
/// smaller batch (step 3 of [`MysqlOutboxStore::claim_batch`]).
const MAX_ROUNDS: usize = 8;
/// The largest packet MariaDB/MySQL allow (1 GiB): the limit when the URL sets none (the
/// server's `max_allowed_packet` then decides, in SQL).
const MAX_PACKET: usize = 1 << 30;
/// Room left in a packet, when deciding whether a row's payload and headers can be fetched,
/// for the rest of the row step 5 reads (id, attempts, two sizes) and its framing.
const ROW_HEADROOM: usize = 1024;
/// MariaDB's "CONSTRAINT … failed" on a row that breaks a CHECK, MySQL's "Check constraint
/// … is violated".
const CHECK_FAILED: [u16; 2] = [4025, 3819];

/// The claim's "due" condition on the row alias `t`: pending; failed and due again; or
/// processing past its claim's expiry (for a claim made before the bundle's V4, which has
/// none stored, `claimed_at` plus this claim's timeout).
fn due(t: &str, timeout_us: u128) -> String {
    format!(
        "({t}.status = 0 \
         or ({t}.status = 3 and {t}.next_retry_at <= utc_timestamp(3)) \
         or ({t}.status = 1 and coalesce({t}.claim_expires_at, \
         {t}.claimed_at + interval {timeout_us} microsecond) <= utc_timestamp(3)))"
    )
}

/// A candidate row of step 1, as locked: the columns other than payload and headers.
struct Candidate {
    row: Row,
    id: i64,
    /// The aggregate, or why it does not decode (the row is then handed over undecodable
    /// and takes no part in the head probe).
    aggregate_id: std::result::Result<Option<String>, String>,
}

/// The claim's steps (see [`MysqlOutboxStore::claim_batch`]) on `conn`.
async fn claim_in(
    conn: &mut Conn,
    table: &OutboxTable,
    batch_size: u32,
    timeout_us: u128,
    packet_limit: usize,
) -> Result<Vec<Claimed>> {
    let t = table.quoted();
    let wanted = batch_size as usize;
    conn.query_drop("start transaction").await?;
    let mut kept: Vec<Candidate> = Vec::with_capacity(wanted);
    let mut after: Option<i64> = None;
    for round in 0..MAX_ROUNDS {
        // Each round scans twice as far as the one before (a run of blocked candidates
        // longer than the batch is passed in a few rounds); what a round finds beyond the
        // batch is left unclaimed, unlocked at the commit.
        let limit = (wanted - kept.len())
            .max(wanted.saturating_mul(1 << round))
            .min(MAX_BATCH as usize);
        let candidates = candidates(conn, &t, after, limit, timeout_us).await?;
        let scanned = candidates.len();
        if let Some(last) = candidates.last() {
            after = Some(last.id);
        }
        kept.extend(keep_heads(conn, &t, candidates).await?);
        if scanned < limit || kept.len() >= wanted {
            kept.truncate(wanted);
            break;
        }
    }
    if kept.is_empty() {
        conn.query_drop("commit").await?;
        return Ok(Vec::new());
    }
    let token = ClaimToken::new(uuid::Uuid::new_v4());
    take(conn, &t, &kept, token, timeout_us).await?;
    let held: std::collections::HashMap<i64, Fetched> =
        read_back(conn, &t, &kept, token, packet_limit)
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect();
    conn.query_drop("commit").await?;
    Ok(kept
        .into_iter()
        .filter_map(|candidate| {
            let fetched = held.get(&candidate.id)?;
            Some(claimed(candidate, fetched, token))
        })
        .collect())
}

/// Step 1: up to `limit` due heads after id `after`, locked, without payload and headers.
async fn candidates(
    conn: &mut Conn,
    t: &str,
    after: Option<i64>,
    limit: usize,
    timeout_us: u128,
) -> Result<Vec<Candidate>> {
    let rows: Vec<Row> = conn
        .query(format!(
            "select t.id, t.message_id, t.topic, t.aggregate_type, t.aggregate_id, \
             coalesce(t.partition_key, t.aggregate_id), t.trace_id \
             from {t} as t force index (open_messages) \
             where t.is_open = 1 {after} and {due} \
             and not exists (select 1 from {t} as e force index (head_of_aggregate) \
             where e.aggregate_id = t.aggregate_id and e.is_open = 1 and e.id < t.id) \
             order by t.id limit {limit} \
             for update skip locked",
            due = due("t", timeout_us),
            after = after.map_or(String::new(), |id| format!("and t.id > {id}"))
        ))
        .await?;
    rows.into_iter()
        .map(|row| {
            Ok(Candidate {
                id: column(&row, 0, "id")?,
                aggregate_id: column::<Option<String>>(&row, 4, "aggregate_id")
                    .map_err(|error| error.to_string()),
                row,
            })
        })
        .collect()
}

/// Step 4: the guarded update of `kept` to this claim; a row whose update breaks a CHECK
/// constraint is isolated and marked dead, so that the others are claimed.
async fn take(
    conn: &mut Conn,
    t: &str,
    kept: &[Candidate],
    token: ClaimToken,
    timeout_us: u128,
) -> Result<()> {
    let ids: Vec<i64> = kept.iter().map(|c| c.id).collect();
    let update = |ids: &[i64]| {
        format!(
            "update {t} as t set t.attempts = t.attempts + (t.status = 1), t.status = 1, \
             t.claimed_at = utc_timestamp(3), \
             t.claim_expires_at = utc_timestamp(3) + interval {timeout_us} microsecond, \
             t.claim_token = {} where t.id in ({}) and {}",
            token_literal(token),
            id_list(ids),
            due("t", timeout_us)
        )
    };
    match conn.query_drop(update(&ids)).await.map_err(Error::from) {
        Err(Error::Mysql { code, .. }) if CHECK_FAILED.contains(&code) => {}
        other => return other,
    }
    // One row at a time, to find the rows that cannot be written.
    for id in ids {
        match conn.query_drop(update(&[id])).await.map_err(Error::from) {
            Err(Error::Mysql { code, message, .. }) if CHECK_FAILED.contains(&code) => {
                mark_unwritable_dead(conn, t, id, code, &message, timeout_us).await?;
            }
            other => other?,
        }
    }
    Ok(())
}

/// Marks dead a due row that no UPDATE can write because it breaks a CHECK constraint of
/// the table (on MariaDB, a payload that is not JSON, inserted with the checks off). Only
/// the status columns change; the row's checks are suspended for this one statement
/// (MariaDB's `check_constraint_checks`), as they were when the row was written. The
/// error says how to fix it; [`MysqlOutboxStore::redrive`] works again once it is fixed.
async fn mark_unwritable_dead(
    conn: &mut Conn,
    t: &str,
    id: i64,
    code: u16,
    message: &str,
    timeout_us: u128,
) -> Result<()> {
    let error: String = format!(
        "the row breaks a CHECK constraint of the outbox table, so it cannot be claimed \
         (error {code}: {message}); marked dead by the claim. Correct the row (a payload and \
         headers of valid JSON), then redrive it"
    )
    .chars()
    .take(2000)
    .collect();
    let set_statement = if code == 4025 {
        "set statement check_constraint_checks = 0 for "
    } else {
        ""
    };
    let params: Vec<Value> = vec![error.as_str().into(), id.into()];
    conn.exec_drop(
        format!(
            "{set_statement}update {t} as t set t.attempts = t.attempts + 1, t.status = 4, \
             t.processed_at = utc_timestamp(3), t.next_retry_at = null, t.last_error = ? \
             where t.id = ? and {}",
            due("t", timeout_us)
        ),
        params,
    )
    .await?;
    Ok(())
}

/// A row as step 5 reads it back: held by this claim.
struct Fetched {
    id: i64,
    attempts: std::result::Result<i32, String>,
    payload: Option<Vec<u8>>,
    headers: Option<Vec<u8>>,
    /// Bytes of payload and headers when they were too large to fetch.
    too_large: Option<u64>,
    limit: i64,
}

/// Step 5: the rows this claim holds (the update's guard may have passed some over), with
/// payload and headers unless they would not fit in a packet of this connection.
async fn read_back(
    conn: &mut Conn,
    t: &str,
    kept: &[Candidate],
    token: ClaimToken,
    packet_limit: usize,
) -> Result<Vec<Fetched>> {
    let ids: Vec<i64> = kept.iter().map(|c| c.id).collect();
    let size = "(octet_length(t.payload) + coalesce(octet_length(t.headers), 0))";
    let limit = format!("(least(@@max_allowed_packet, {packet_limit}) - {ROW_HEADROOM})");
    let rows: Vec<Row> = conn
        .query(format!(
            "select t.id, t.attempts, if({size} > {limit}, null, t.payload), \
             if({size} > {limit}, null, t.headers), if({size} > {limit}, {size}, null), \
             {limit} from {t} as t where t.id in ({}) and t.claim_token = {}",
            id_list(&ids),
            token_literal(token)
        ))
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Fetched {
                id: column(row, 0, "id")?,
                attempts: column(row, 1, "attempts").map_err(|e| e.to_string()),
                payload: column(row, 2, "payload").unwrap_or(None),
                headers: column(row, 3, "headers").unwrap_or(None),
                too_large: column(row, 4, "size").unwrap_or(None),
                limit: column(row, 5, "limit").unwrap_or(0),
            })
        })
        .collect()
}

/// Step 2: drops the candidates that have an earlier open row of their aggregate which the
/// consistent read of step 1 could not see (uncommitted), without ever waiting for a lock.
async fn keep_heads(
    conn: &mut Conn,
    t: &str,
    candidates: Vec<Candidate>,
) -> Result<Vec<Candidate>> {
    let probed: Vec<(&str, i64)> = candidates
        .iter()
        .filter_map(|c| match &c.aggregate_id {
            Ok(Some(aggregate)) => Some((aggregate.as_str(), c.id)),
            _ => None,
        })
        .collect();
    if probed.is_empty() {
        return Ok(candidates);
    }
    let blocked: Vec<String> = match probe(conn, t, &probed).await {
        Ok(found) => found,
        // Someone holds a row in one of the ranges; find out which, one range at a time.
        // (With innodb_rollback_on_timeout=ON the refusal has rolled the transaction back;
        // step 4's guard keeps the claim correct all the same.)
        Err(Error::Mysql { code, .. }) if NOWAIT_REFUSED.contains(&code) => {
            let mut blocked = Vec::new();
            for (aggregate, id) in &probed {
                match probe(conn, t, &[(*aggregate, *id)]).await {
                    Ok(found) => blocked.extend(found),
                    Err(Error::Mysql { code, .. }) if NOWAIT_REFUSED.contains(&code) => {
                        blocked.push((*aggregate).to_owned());
                    }
                    Err(error) => return Err(error),
                }
            }
            blocked
        }
        Err(error) => return Err(error),
    };
    drop(probed);
    if blocked.is_empty() {
        return Ok(candidates);
    }
    Ok(candidates
        .into_iter()
        .filter(|c| match &c.aggregate_id {
            Ok(Some(aggregate)) => !blocked.contains(aggregate),
            _ => true,
        })
        .collect())
}

/// One `FOR UPDATE NOWAIT` probe over the ranges `(aggregate, is_open = 1, id < candidate)`;
/// returns the aggregates that have an earlier open row. The number of ranges is padded to
/// a power of two (repeating the last) so that the prepared statements stay few.
async fn probe(conn: &mut Conn, t: &str, ranges: &[(&str, i64)]) -> Result<Vec<String>> {
    let slots = ranges.len().next_power_of_two();
    let mut sql =
        format!("select e.aggregate_id from {t} as e force index (head_of_aggregate) where ");
    let mut params: Vec<Value> = Vec::with_capacity(slots * 2);
    for slot in 0..slots {
        if slot > 0 {
            sql.push_str(" or ");
        }
        sql.push_str("(e.aggregate_id = ? and e.is_open = 1 and e.id < ?)");
        let (aggregate, id) = ranges[slot.min(ranges.len() - 1)];
        params.push(aggregate.into());
        params.push(id.into());
    }
    sql.push_str(" for update nowait");
    let rows: Vec<Row> = conn.exec(sql, params).await?;
    rows.iter()
        .map(|row| column::<String>(row, 0, "aggregate_id"))
        .collect()
}

/// A column of a row, decoded; the error names the column.
fn column<T: mysql_async::prelude::FromValue>(row: &Row, index: usize, name: &str) -> Result<T> {
    match row.get_opt::<T, usize>(index) {
        Some(Ok(value)) => Ok(value),
        Some(Err(error)) => Err(decode_error(name, error)),
        None => Err(decode_error(name, "missing from the row")),
    }
}

/// A claimed row as the relay gets it: decoded, or as [`Claimed::Undecodable`] (with the
/// reason) when any of its columns does not decode or its payload was too large to fetch.
/// Never an error: a row that failed the whole claim would be claimed again and again.
fn claimed(candidate: Candidate, fetched: &Fetched, token: ClaimToken) -> Claimed {
    let row = &candidate.row;
    let text = |bytes: &Option<Vec<u8>>, name: &str| -> Result<Option<String>> {
        bytes
            .as_ref()
            .map(|b| String::from_utf8(b.clone()).map_err(|_| decode_error(name, "not UTF-8")))
            .transpose()
    };
    let payload_text = text(&fetched.payload, "payload");
    let headers_text = text(&fetched.headers, "headers");
    let decoded = (|| -> Result<ClaimedMessage> {
        if let Some(size) = fetched.too_large {
            return Err(decode_error(
                "payload",
                format!(
                    "payload and headers are {size} bytes, more than this connection can \
                     fetch ({} bytes: its max_allowed_packet less 1 KiB for the rest of the \
                     row); raise max_allowed_packet on the server (and in the relay's URL \
                     if it sets one), then redrive the row",
                    fetched.limit
                ),
            ));
        }
        let payload = payload_text
            .as_ref()
            .map_err(|e| decode_error("payload", e))?
            .as_deref()
            .ok_or_else(|| decode_error("payload", "NULL"))?;
        let payload = serde_json::from_str::<serde_json::Value>(payload)
            .map_err(|e| decode_error("payload", e))?;
        let headers = match headers_text
            .as_ref()
            .map_err(|e| decode_error("headers", e))?
        {
            Some(text) => parse_headers(text)?,
            None => Headers::new(),
        };
        Ok(ClaimedMessage {
            id: candidate.id,
            message_id: column(row, 1, "message_id")?,
            topic: column(row, 2, "topic")?,
            aggregate_type: column(row, 3, "aggregate_type")?,
            aggregate_id: candidate
                .aggregate_id
                .clone()
                .map_err(|e| decode_error("aggregate_id", e))?,
            partition_key: column(row, 5, "partition_key")?,
            payload,
            headers,
            trace_id: column(row, 6, "trace_id")?,
            attempts: fetched
                .attempts
                .clone()
                .map_err(|e| decode_error("attempts", e))?,
            claim_token: token,
        })
    })();
    match decoded {
        Ok(message) => Claimed::Message(message),
        Err(error) => Claimed::Undecodable(UndecodableMessage {
            id: candidate.id,
            message_id: column(row, 1, "message_id").ok(),
            topic: column(row, 2, "topic").ok(),
            payload: payload_text.ok().flatten(),
            headers: headers_text.ok().flatten(),
            attempts: fetched.attempts.clone().unwrap_or(0),
            claim_token: token,
            error: error.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_hold_only_digits_and_hex() {
        assert_eq!(id_list(&[1, -2, 30]), "1, -2, 30");
        let token = ClaimToken::from_bytes([0xab; 16]);
        assert_eq!(token_literal(token), format!("x'{}'", "ab".repeat(16)));
    }

    #[test]
    fn messages_are_checked_before_the_insert() {
        let ok = NewMessage::new("orders", serde_json::json!({"a": 1}));
        assert!(check_message(&ok).is_ok());
        let unicode = NewMessage::new("ü".repeat(256), serde_json::json!({})).aggregate("t", "🎉");
        assert!(check_message(&unicode).is_ok(), "limits count characters");
        for bad in [
            NewMessage::new("", serde_json::json!({})),
            NewMessage::new("t".repeat(257), serde_json::json!({})),
            NewMessage {
                message_id: Some("k ".to_owned()),
                ..ok.clone()
            },
            NewMessage {
                message_id: Some(String::new()),
                ..ok.clone()
            },
            NewMessage::new("orders", serde_json::json!(42)),
        ] {
            assert!(
                matches!(check_message(&bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }
}
