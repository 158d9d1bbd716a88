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
use crate::error::{Error, Result, decode_error};
use crate::outbox::{
    ClaimStore, ClaimToken, Claimed, ClaimedMessage, Enqueued, Headers, NewMessage,
    UndecodableMessage,
};
use crate::outbox_store::{check_payload, parse_headers};

/// The largest claim (as on SQL Server).
const MAX_BATCH: u32 = 10_000;
/// The longest claim timeout: 24 hours.
const MAX_CLAIM_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest retry delay: 366 days.
const MAX_RETRY: Duration = Duration::from_secs(366 * 24 * 60 * 60);
/// The longest purge window: 100 years of 365.25 days.
const MAX_PURGE_WINDOW: Duration = Duration::from_secs(3_155_760_000);
/// The largest purge batch (as on SQL Server).
const MAX_PURGE_BATCH: u32 = 4000;
/// MariaDB answers a refused `NOWAIT` with 1205 (lock wait timeout), MySQL with 3572.
const NOWAIT_REFUSED: [u16; 2] = [1205, 3572];

/// Enqueues `message` into `table` inside the caller's transaction `tx`, so it commits or
/// rolls back with the business change it announces (a [`Transaction`] is the only way in:
/// enqueuing outside one cannot be written). A `message_id` already in the outbox is not
/// enqueued twice: the existing row comes back. Without a `message_id`, a random UUID is
/// made.
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
    ///    (<earlier open row of the aggregate>) ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`.
    ///    The index `(is_open, id)` yields candidates in id order, so the LIMIT stops the
    ///    scan early and only the rows returned are locked (a filesort would lock every
    ///    candidate). SKIP LOCKED passes over rows another claimer or an uncommitted enqueue
    ///    holds, so an open business transaction never stalls the claim. The `NOT EXISTS`
    ///    probe is a subquery, which InnoDB reads as a consistent (non-locking) read of
    ///    committed rows: it never waits either.
    /// 2. That probe cannot see an *uncommitted* earlier row of the same aggregate (two
    ///    transactions enqueuing one aggregate at once, the later id committing first). The
    ///    store closes that hole with a second probe, for the candidates with an aggregate:
    ///    `SELECT … FORCE INDEX (head_of_aggregate) WHERE (aggregate_id = ? AND is_open = 1
    ///    AND id < <candidate>) OR … FOR UPDATE NOWAIT`. A row found, or a row locked by
    ///    someone else (NOWAIT refuses at once instead of waiting), means the candidate is
    ///    not provably the head: it is left for a later claim. Each range ends at the
    ///    candidate's own index entry, which this transaction already holds, so rows of
    ///    other aggregates (an uncommitted enqueue of aggregate A) are never touched: claims
    ///    of aggregate B go on while A's transaction is open.
    /// 3. `UPDATE … SET status = 1, attempts = attempts + (status = 1), claimed_at =
    ///    UTC_TIMESTAMP(3), claim_token = <fresh token> WHERE id IN (…)`, then COMMIT. The
    ///    rows were read in step 1 under their locks, so they are returned without reading
    ///    them back.
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
        self.with_conn("claim", self.call_timeout, async |table, conn| {
            let result = claim_in(conn, table, batch_size, timeout_us).await;
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
        if !(1..=MAX_PURGE_BATCH).contains(&batch_size) {
            return Err(Error::Config(format!(
                "purge_done: batch_size is {batch_size}; it must be between 1 and \
                 {MAX_PURGE_BATCH}"
            )));
        }
        if max_rows == Some(0) {
            return Err(Error::Config(
                "purge_done: max_rows must be positive, or None for no limit".to_owned(),
            ));
        }
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
            Ok(deleted)
        })
        .await
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
}

fn check_claim(batch_size: u32, claim_timeout: Duration) -> Result<()> {
    if !(1..=MAX_BATCH).contains(&batch_size) {
        return Err(Error::Config(format!(
            "claim: batch_size is {batch_size}; it must be between 1 and {MAX_BATCH}"
        )));
    }
    if claim_timeout < Duration::from_millis(1) || claim_timeout > MAX_CLAIM_TIMEOUT {
        return Err(Error::Config(format!(
            "claim: claim_timeout is {claim_timeout:?}; it must be between 1 ms and 24 h"
        )));
    }
    Ok(())
}

/// `duration` in whole microseconds, refused past `max` (which keeps every value far
/// inside a bigint).
fn micros(what: &str, duration: Duration, max: Duration) -> Result<i64> {
    if duration > max {
        return Err(Error::Config(format!(
            "{what} is {duration:?}; it must be at most {max:?}"
        )));
    }
    i64::try_from(duration.as_micros())
        .map_err(|_| Error::Config(format!("{what} of {duration:?} is too long")))
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

/// A candidate row of step 1, as locked.
struct Candidate {
    row: Row,
    id: i64,
    aggregate_id: Option<String>,
}

/// The claim's three steps (see [`MysqlOutboxStore::claim_batch`]) on `conn`.
async fn claim_in(
    conn: &mut Conn,
    table: &OutboxTable,
    batch_size: u32,
    timeout_us: u128,
) -> Result<Vec<Claimed>> {
    let t = table.quoted();
    let select = format!(
        "start transaction; \
         select t.id, t.message_id, t.topic, t.aggregate_type, t.aggregate_id, \
         coalesce(t.partition_key, t.aggregate_id), t.payload, t.headers, t.trace_id, \
         t.attempts + (t.status = 1) \
         from {t} as t force index (open_messages) \
         where t.is_open = 1 \
         and (t.status = 0 \
         or (t.status = 3 and t.next_retry_at <= utc_timestamp(3)) \
         or (t.status = 1 and t.claimed_at < utc_timestamp(3) - interval {timeout_us} microsecond)) \
         and not exists (select 1 from {t} as e force index (head_of_aggregate) \
         where e.aggregate_id = t.aggregate_id and e.is_open = 1 and e.id < t.id) \
         order by t.id limit {batch_size} \
         for update skip locked"
    );
    let mut result = conn.query_iter(select).await?;
    let _: Vec<Row> = result.collect().await?; // start transaction
    let rows: Vec<Row> = result.collect().await?;
    result.drop_result().await?;

    let mut candidates = Vec::with_capacity(rows.len());
    for row in rows {
        candidates.push(Candidate {
            id: column(&row, 0, "id")?,
            aggregate_id: column(&row, 4, "aggregate_id")?,
            row,
        });
    }
    let candidates = keep_heads(conn, &t, candidates).await?;

    if candidates.is_empty() {
        conn.query_drop("commit").await?;
        return Ok(Vec::new());
    }
    let token = ClaimToken::new(uuid::Uuid::new_v4());
    let ids: Vec<i64> = candidates.iter().map(|c| c.id).collect();
    conn.query_drop(format!(
        "update {t} set attempts = attempts + (status = 1), status = 1, \
         claimed_at = utc_timestamp(3), claim_token = {} where id in ({}); commit",
        token_literal(token),
        id_list(&ids)
    ))
    .await?;
    candidates
        .into_iter()
        .map(|c| claimed(c.row, token))
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
        .filter_map(|c| c.aggregate_id.as_deref().map(|a| (a, c.id)))
        .collect();
    if probed.is_empty() {
        return Ok(candidates);
    }
    let blocked: Vec<String> = match probe(conn, t, &probed).await {
        Ok(found) => found,
        // Someone holds a row in one of the ranges; find out which, one range at a time.
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
        .filter(|c| c.aggregate_id.as_ref().is_none_or(|a| !blocked.contains(a)))
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

/// A locked candidate as the relay gets it: the payload and headers decoded, or the row as
/// [`Claimed::Undecodable`] when they do not decode.
fn claimed(row: Row, token: ClaimToken) -> Result<Claimed> {
    let id: i64 = column(&row, 0, "id")?;
    let attempts: i32 = column(&row, 9, "attempts")?;
    let payload_text: Option<String> = column(&row, 6, "payload").ok();
    let headers_text: Option<String> = column(&row, 7, "headers").unwrap_or(None);
    let decoded = payload_text
        .as_deref()
        .ok_or_else(|| decode_error("payload", "not UTF-8 text"))
        .and_then(|text| {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| decode_error("payload", e))
        })
        .and_then(|payload| {
            let headers = match headers_text.as_deref() {
                Some(text) => parse_headers(text)?,
                None => Headers::new(),
            };
            Ok((payload, headers))
        });
    let (payload, headers) = match decoded {
        Ok(decoded) => decoded,
        Err(error) => {
            return Ok(Claimed::Undecodable(UndecodableMessage {
                id,
                message_id: column(&row, 1, "message_id").ok(),
                topic: column(&row, 2, "topic").ok(),
                payload: payload_text,
                headers: headers_text,
                attempts,
                claim_token: token,
                error: error.to_string(),
            }));
        }
    };
    Ok(Claimed::Message(ClaimedMessage {
        id,
        message_id: column(&row, 1, "message_id")?,
        topic: column(&row, 2, "topic")?,
        aggregate_type: column(&row, 3, "aggregate_type")?,
        aggregate_id: column(&row, 4, "aggregate_id")?,
        partition_key: column(&row, 5, "partition_key")?,
        payload,
        headers,
        trace_id: column(&row, 8, "trace_id")?,
        attempts,
        claim_token: token,
    }))
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
    fn arguments_are_checked_with_the_sql_server_ranges() {
        assert!(check_claim(1, Duration::from_millis(1)).is_ok());
        assert!(check_claim(10_000, MAX_CLAIM_TIMEOUT).is_ok());
        for (batch, timeout) in [
            (0, Duration::from_secs(1)),
            (10_001, Duration::from_secs(1)),
            (1, Duration::from_micros(999)),
            (1, MAX_CLAIM_TIMEOUT + Duration::from_millis(1)),
        ] {
            let error = check_claim(batch, timeout).unwrap_err().to_string();
            assert!(error.contains("claim:"), "{error}");
        }
        assert_eq!(
            micros("x", Duration::from_millis(5), MAX_RETRY).unwrap(),
            5000
        );
        assert!(micros("x", MAX_RETRY + Duration::from_secs(1), MAX_RETRY).is_err());
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
