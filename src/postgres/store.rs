//! [`PostgresOutboxStore`]: the claim outbox's operations over PostgreSQL, and [`enqueue`],
//! which runs in the caller's transaction.
//!
//! The semantics are those of the other stores (docs/sql-server.md, "The claim outbox"):
//! status 0 pending, 1 processing, 2 done, 3 failed, 4 dead; `attempts` counts failures and
//! expired claims; every acknowledgement is fenced by the claim token; every time is the
//! server's clock. How the claim keeps them is explained on
//! [`PostgresOutboxStore::claim_batch`], and why an aggregate's messages cannot overtake
//! each other in ARCHITECTURE.md ("The claim outbox on PostgreSQL").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, GenericClient, Row};

use super::claim;
use super::connection::{CALL_TIMEOUT, SERVER, connect};
use super::prepared::{Answer, Session};
use super::table::OutboxTable;
use crate::claim_limits::{
    MAX_CLAIM_TIMEOUT, MAX_RETRY, call_bound, check_claim, check_purge, failure_retry_us, micros,
    read_far,
};
use crate::error::{Error, Result, decode_error};
use crate::outbox::{
    ClaimStore, ClaimToken, Claimed, ClaimedMessage, Enqueued, Failed, NewMessage, OutboxBacklog,
    UndecodableMessage,
};
use crate::outbox_backend::{
    bounded, decode_body, headers_json, message_id, purge_in_batches, utf8_column,
};
use crate::outbox_store::check_payload;

/// Enqueues `message` into `table` through `client`: pass the
/// [`Transaction`](tokio_postgres::Transaction) of your business change, so the message
/// commits or rolls back with it (a plain [`Client`](tokio_postgres::Client) commits the message on its own). A
/// `message_id` already in the outbox is not enqueued twice: the existing row comes back.
/// Without a `message_id`, a random UUID is made.
///
/// Messages of one aggregate are ordered by the outbox's `changefeed_order` trigger: the
/// insert waits while another open transaction has enqueued for the same aggregate, until
/// it commits or rolls back (ARCHITECTURE.md says why). Enqueue for an aggregate as late in
/// your transaction as you can, and in one order of aggregates everywhere, as for any lock.
///
/// ```no_run
/// # async fn run(client: &mut tokio_postgres::Client) -> changefeed::Result<()> {
/// use changefeed::outbox::NewMessage;
/// use changefeed::postgres::{OutboxTable, enqueue};
///
/// let table: OutboxTable = "public.outbox".parse()?;
/// let tx = client.transaction().await?;
/// tx.execute("update orders set state = 'paid' where id = $1", &[&42i64]).await?;
/// let message = NewMessage::new("orders", serde_json::json!({"order": 42})).aggregate("order", "42");
/// enqueue(&tx, &table, &message).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue(
    client: &impl GenericClient,
    table: &OutboxTable,
    message: &NewMessage,
) -> Result<Enqueued> {
    check_payload(&message.payload)?;
    let payload = message.payload.to_string();
    let headers = headers_json(message)?;
    let message_id = message_id(message);
    let t = table.quoted();
    // ON CONFLICT waits for a concurrent enqueue of the same key and then does nothing;
    // the existing row is read by a second statement, whose fresh snapshot (READ
    // COMMITTED) sees it.
    let insert = format!(
        "insert into {t} (message_id, topic, aggregate_type, aggregate_id, partition_key, \
         payload, headers, trace_id) \
         values ($1, $2, $3, $4, $5, $6::text::json, $7::text::json, $8) \
         on conflict (message_id) do nothing returning id"
    );
    let rows = client
        .query(
            &insert,
            &[
                &message_id,
                &message.topic,
                &message.aggregate_type,
                &message.aggregate_id,
                &message.partition_key,
                &payload,
                &headers,
                &message.trace_id,
            ],
        )
        .await?;
    let row = match rows.into_iter().next() {
        Some(row) => row,
        None => {
            client
                .query_one(
                    &format!("select id from {t} where message_id = $1"),
                    &[&message_id],
                )
                .await?
        }
    };
    Ok(Enqueued {
        id: row.try_get(0).map_err(|e| decode_error("id", e))?,
        message_id,
    })
}

/// The claim outbox `table` over PostgreSQL, for a [`Relay`](crate::relay::Relay): it owns
/// one connection, opened on first use and again after a connection-level failure, and
/// prepares each of its statements once on it. Every call is bounded: the server ends a
/// statement after [`STATEMENT_TIMEOUT`](super::STATEMENT_TIMEOUT), and the store gives up
/// on an answer after the claim timeout of its last claim (at least 1 s; before any claim,
/// and at most, [`CALL_TIMEOUT`](super::CALL_TIMEOUT)) and then opens a new connection. So
/// a relay whose server went silent (frozen, or cut off without a reset) gets an error
/// within its claim timeout, not the statement timeout, and its shutdown is not held longer.
///
/// Its [concurrent handles](ClaimStore::concurrent_handle) share that connection: a relay
/// acknowledges through one while its next claim runs, and both go out on the connection
/// without waiting for each other (pipelined, in the order they start), so the server runs
/// them back to back.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::postgres::PostgresOutboxStore;
/// use changefeed::relay::{Relay, RelayConfig};
/// # struct Stdout;
/// # impl changefeed::relay::Publisher for Stdout {
/// #     async fn publish(&self, b: &[changefeed::outbox::ClaimedMessage]) -> Vec<changefeed::relay::PublishOutcome> { vec![Ok(()); b.len()] }
/// # }
///
/// let store = PostgresOutboxStore::connect("public.outbox", "postgres://relay:secret@localhost/app")?;
/// let relay = Relay::new(store, Stdout, RelayConfig::default())?;
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct PostgresOutboxStore {
    table: OutboxTable,
    /// The table's name as the statements write it.
    quoted: String,
    config: Config,
    /// What the store and its concurrent handles share.
    shared: Arc<Shared>,
}

/// What a store and its [concurrent handles](ClaimStore::concurrent_handle) share.
struct Shared {
    /// The connection and the statements prepared on it (see [`Call`]); the lock is held
    /// only to look at it or open a new one (so that the handles open one, not one each),
    /// never for a call.
    session: tokio::sync::Mutex<Option<Arc<Session<Call>>>>,
    /// Whether the database is `SQL_ASCII`, so a claim reads text as bytes (see
    /// [`claimed_columns`](claim::claimed_columns)); learned by the first claim.
    sql_ascii: OnceLock<bool>,
    /// Whether the next claim stops at its reach ([`Call::ClaimNear`]) instead of
    /// reading every open message ([`Call::Claim`]); see
    /// [`claim_batch`](PostgresOutboxStore::claim_batch). The first claim does.
    near: AtomicBool,
    /// How long a call may take, in milliseconds: set by each claim from its timeout
    /// ([`call_bound`]), [`CALL_TIMEOUT`] until the first.
    call_bound_ms: AtomicU64,
}

/// The store's statements. Each is prepared on its first use on a connection and kept
/// with it ([`Session`]): a call is then one round trip with a cached plan. The text of
/// each is [`Call::sql`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Call {
    Encoding,
    /// The claim of up to this many messages: every open message is a candidate.
    Claim(u32),
    /// The claim of up to this many messages among the first
    /// [`CLAIM_REACH`](crate::claim_limits::CLAIM_REACH) × that many open ones.
    ClaimNear(u32),
    /// The claim of the heads of aggregates past that reach (up to `$3` of them; the batch
    /// size sets the reach), run when the claim near came back short.
    ClaimHeads(u32),
    /// Whether the reach of a claim near of this many is full (as many messages open).
    PastReach(u32),
    MarkDone,
    MarkFailed,
    Requeue,
    Redrive,
    PurgeCutoff,
    PurgeBatch,
    Backlog,
}

impl Call {
    /// Where the connection keeps the statement: one place per kind, so the claims of
    /// every batch size share one (a relay claims with one size; another size is prepared
    /// and takes its place, see [`Session::run`]).
    fn slot(self) -> Call {
        match self {
            Call::Claim(_) => Call::Claim(0),
            Call::ClaimNear(_) => Call::ClaimNear(0),
            Call::ClaimHeads(_) => Call::ClaimHeads(0),
            Call::PastReach(_) => Call::PastReach(0),
            other => other,
        }
    }

    /// The statement over the quoted outbox table `t`; `raw`: the claim reads its text
    /// columns as bytes (see [`claimed_columns`](claim::claimed_columns)).
    ///
    /// The claim's batch size is written into its text, not passed: with `limit $1` the
    /// plan depends on the value (a generic plan expects a tenth of the table and reads it
    /// all for a hash join), so PostgreSQL planned the claim afresh on every call, which
    /// cost as much as a third of its run. With the number in the text, the plan is made
    /// once per connection and batch size and kept.
    fn sql(self, t: &str, raw: bool) -> String {
        match self {
            Call::Encoding => "select getdatabaseencoding()".to_owned(),
            Call::Claim(limit) => claim::every_open(t, limit, raw),
            Call::ClaimNear(limit) => claim::near(t, limit, raw),
            Call::ClaimHeads(limit) => claim::heads(t, limit, raw),
            Call::PastReach(limit) => claim::past_reach(t, limit),
            Call::MarkDone => format!(
                "update {t} set status = 2, processed_at = now(), last_error = null \
                 where id = any($1) and status = 1 and claim_token = $2"
            ),
            Call::MarkFailed => format!(
                "update {t} set status = case when $1 then 4 else 3 end, \
                 attempts = attempts + 1, \
                 next_retry_at = case when $1 then null \
                 else now() + $2::bigint * interval '1 microsecond' end, \
                 processed_at = case when $1 then now() end, last_error = $3 \
                 where id = $4 and status = 1 and claim_token = $5"
            ),
            Call::Requeue => hand_back(t, "status = 1 and claim_token = $3"),
            Call::Redrive => hand_back(t, "status in (3, 4)"),
            Call::PurgeCutoff => {
                "select (now() - $1::bigint * interval '1 microsecond')::text".to_owned()
            }
            Call::PurgeBatch => format!(
                "delete from {t} where id in (select id from {t} \
                 where status = 2 and processed_at < $1::text::timestamptz limit $2)"
            ),
            Call::Backlog => super::backlog::backlog_query(t),
        }
    }
}

impl PostgresOutboxStore {
    /// A store for `table` that connects with `config` (see [`super::config`]).
    pub fn new(table: OutboxTable, config: Config) -> Self {
        PostgresOutboxStore {
            quoted: table.quoted(),
            table,
            config,
            shared: Arc::new(Shared {
                session: tokio::sync::Mutex::default(),
                sql_ascii: OnceLock::new(),
                near: AtomicBool::new(true),
                call_bound_ms: AtomicU64::new(millis(CALL_TIMEOUT)),
            }),
        }
    }

    /// A store for the table named `table` (`schema.table`) at the PostgreSQL URL `url`.
    /// Nothing connects until the first call.
    pub fn connect(table: &str, url: &str) -> Result<Self> {
        Ok(Self::new(table.parse()?, super::config(url)?))
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// Runs the statement `key` with `params` (see [`Session::run`]) on the store's
    /// connection, opening it first if needed, within the store's call bound (see the
    /// type); a connection-level failure (or no answer in time) drops the connection, and
    /// its statements, so that the next call opens a fresh one and prepares them again.
    async fn run(&self, what: &str, key: Call, params: &[&(dyn ToSql + Sync)]) -> Result<Answer> {
        let session = self.session().await?;
        let raw = self.shared.sql_ascii.get() == Some(&true);
        let sql = key.sql(&self.quoted, raw);
        let run = session.run(key.slot(), &sql, params);
        let limit = Duration::from_millis(self.shared.call_bound_ms.load(Ordering::Relaxed));
        let result = bounded(SERVER, limit, what, run).await;
        if let Err(Error::Connection(_)) = &result {
            // Unless a concurrent handle has already put a new one in its place.
            let mut slot = self.shared.session.lock().await;
            if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &session)) {
                *slot = None;
            }
        }
        result
    }

    /// The store's connection, opened if there is none or it is closed.
    async fn session(&self) -> Result<Arc<Session<Call>>> {
        let mut slot = self.shared.session.lock().await;
        match slot.as_ref() {
            Some(session) if !session.is_closed() => Ok(Arc::clone(session)),
            _ => {
                let session = Arc::new(Session::new(connect(&self.config).await?));
                crate::metrics::store_connected(self.table.name(), "postgres");
                *slot = Some(Arc::clone(&session));
                Ok(session)
            }
        }
    }

    /// The one row statement `key` returns with `params` (see [`Self::run`]).
    async fn row(&self, what: &str, key: Call, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
        let answer = self.run(what, key, params).await?;
        answer
            .rows
            .into_iter()
            .next()
            .ok_or_else(|| decode_error(what, "no row"))
    }

    /// How many rows statement `key` changed with `params` (see [`Self::run`]).
    async fn execute(&self, what: &str, key: Call, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        Ok(self.run(what, key, params).await?.changed)
    }

    /// Claims up to `batch_size` due messages (1..=10000) for `claim_timeout`
    /// (1 ms..=24 h), head of aggregate only, ordered by id, in one statement:
    ///
    /// ```sql
    /// with due as (
    ///     select t.id from <outbox> as t
    ///     where t.status in (0, 1, 3) and (<pending, failed and due, or claim expired>)
    ///       and not exists (select 1 from <outbox> as e where e.aggregate_id = t.aggregate_id
    ///                       and e.status in (0, 1, 3) and e.id < t.id)
    ///     order by t.id limit <batch_size>
    ///     for update skip locked)
    /// update <outbox> as t set status = 1, … from due where t.id = due.id returning …
    /// ```
    ///
    /// * `FOR UPDATE SKIP LOCKED` passes over rows another claimer holds, so claimers never
    ///   wait for each other; PostgreSQL locks below the `LIMIT`, so a skipped row does
    ///   not count and the batch is refilled from later candidates. A row that changed
    ///   since the statement's snapshot is checked again, on its new version, before it is
    ///   taken (READ COMMITTED's recheck), so a message another claimer just took or
    ///   acknowledged is dropped, not claimed twice.
    /// * The `NOT EXISTS` probe reads the snapshot and never waits. It sees every earlier
    ///   message of the candidate's aggregate, because the outbox's `changefeed_order`
    ///   trigger makes an aggregate's ids follow commit order (ARCHITECTURE.md): a later
    ///   message is committed only after every earlier one is committed or gone. An open
    ///   enqueue therefore delays only the writers of its own aggregate, never a claim.
    /// * The session is READ COMMITTED (see [`super::connect`]): each statement takes a
    ///   fresh snapshot, and the recheck above exists only there. Under REPEATABLE READ or
    ///   SERIALIZABLE, a row changed by another claimer would fail the whole claim with a
    ///   serialization error instead.
    /// * The claim times are `now()`, the server's clock at the statement's start.
    /// * What a claim reads. That statement reads open messages in id order until it has
    ///   the batch, so one that finds fewer due heads than `batch_size` (the messages
    ///   waiting fall on few aggregates, or their heads are in flight or waiting for a
    ///   retry) reads every open message behind them: its cost grows with the backlog, and
    ///   a large enough backlog would make every claim outlast the statement timeout
    ///   (BENCHMARKS.md). So after a claim that took long (100 ms, or 100 µs a message)
    ///   or failed, and for the first claim, the store claims in two steps instead: the
    ///   same statement over only the first `batch_size` × 16 open messages; and, when that
    ///   comes back short, a second statement (its own transaction, the same token) that
    ///   finds the head of every aggregate with open messages on the head index (a
    ///   recursive skip scan: one index descent per aggregate), adds the due messages
    ///   without an aggregate, and claims the due ones in id order by the same probe and
    ///   `SKIP LOCKED`. It never reads the messages behind a head. Once the first step
    ///   fills a batch, or fewer messages than its reach are open, the one statement reads
    ///   no further, and the store goes back to it (the two steps cost more a message:
    ///   the first reads each row twice, and a short claim takes more round trips).
    pub async fn claim_batch(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> Result<Vec<Claimed>> {
        check_claim(batch_size, claim_timeout)?;
        let timeout_us = micros("claim_timeout", claim_timeout, MAX_CLAIM_TIMEOUT)?;
        let bound = call_bound(claim_timeout, CALL_TIMEOUT);
        self.shared
            .call_bound_ms
            .store(millis(bound), Ordering::Relaxed);
        let token = ClaimToken::new(uuid::Uuid::new_v4());
        if self.shared.sql_ascii.get().is_none() {
            let row = self
                .row("the database's encoding", Call::Encoding, &[])
                .await?;
            let encoding: String = column(&row, 0, "getdatabaseencoding()")?;
            let _ = self.shared.sql_ascii.set(encoding == "SQL_ASCII");
        }
        let params: [&(dyn ToSql + Sync); 2] = [&timeout_us, token.as_uuid()];
        let near = self.shared.near.load(Ordering::Relaxed);
        let started = Instant::now();
        let first = if near {
            Call::ClaimNear(batch_size)
        } else {
            Call::Claim(batch_size)
        };
        let answer = self.run("the claim", first, &params).await;
        if !near && read_far(answer.is_err(), started.elapsed(), batch_size) {
            // It read far, or did not finish: the next claims stop at the reach.
            self.shared.near.store(true, Ordering::Relaxed);
        }
        let mut rows = answer?.rows;
        if near && rows.len() == batch_size as usize {
            // The first open messages held a whole batch of due heads, so a claim over
            // every open message reads no further than this one did.
            self.shared.near.store(false, Ordering::Relaxed);
        } else if near {
            // Its own transaction, under the same token: what the first one claimed is
            // committed, so if this one fails the batch is what the first one claimed
            // (an error would leave those rows to expire), and the next claim looks again.
            let more = i64::from(batch_size) - rows.len() as i64;
            let params: [&(dyn ToSql + Sync); 3] = [&timeout_us, token.as_uuid(), &more];
            match self
                .run(
                    "the claim past its reach",
                    Call::ClaimHeads(batch_size),
                    &params,
                )
                .await
            {
                Ok(answer) if answer.rows.is_empty() => {
                    // Nothing past the reach: when that is because fewer messages than the
                    // reach are open, a claim over every open message reads no more than
                    // this one did, in one statement instead of three.
                    let within = self
                        .row("the claim's reach", Call::PastReach(batch_size), &[])
                        .await
                        .and_then(|row| column::<bool>(&row, 0, "past reach"));
                    if let Ok(false) = within {
                        self.shared.near.store(false, Ordering::Relaxed);
                    }
                }
                Ok(answer) => rows.extend(answer.rows),
                Err(error) if rows.is_empty() => return Err(error),
                Err(error) => tracing::warn!(
                    %error,
                    claimed = rows.len(),
                    "the claim past its reach failed; the batch is what the first statement claimed"
                ),
            }
        }
        // A row that does not decode is handed over undecodable, never an error: the rows
        // are committed as claimed, so an error would leave them to expire, and the next
        // claim would take the same batch and fail again.
        let mut claimed: Vec<Claimed> = rows
            .iter()
            .map(|row| claimed(row, token))
            .collect::<Result<_>>()?;
        // RETURNING has no order.
        claimed.sort_by_key(Claimed::id);
        Ok(claimed)
    }

    /// Hands a dead or failed message back as failed, due after `after` (server clock),
    /// attempts unchanged: an operator's redrive after fixing the cause. Returns 1 if the
    /// message was dead or failed, else 0.
    pub async fn redrive(&mut self, id: i64, after: Duration) -> Result<u64> {
        let after_us = micros("after", after, MAX_RETRY)?;
        self.execute("redrive", Call::Redrive, &[&after_us, &id])
            .await
    }

    /// The outbox's backlog: pending, processing, failed and dead counts (each stopping at
    /// [`BACKLOG_COUNT_LIMIT`](crate::outbox::BACKLOG_COUNT_LIMIT)) and the age of the
    /// oldest open message, by the server's clock, in one statement
    /// ([`backlog_query`](super::backlog_query), which says what it reads).
    pub async fn backlog(&mut self) -> Result<OutboxBacklog> {
        let row = self.row("backlog", Call::Backlog, &[]).await?;
        super::backlog::decode(&row)
    }

    /// Deletes done messages processed more than `older_than` ago (cutoff on the server's
    /// clock, 0..=100 years), `batch_size` rows per statement (1..=4000, each its own
    /// transaction, so no lock is held long and the table's other users go on), at most
    /// `max_rows` in all (`None`: no limit). Dead messages are kept. Returns how many rows
    /// went.
    pub async fn purge_done(
        &mut self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> Result<u64> {
        let older_than_us = check_purge(older_than, batch_size, max_rows)?;
        // One cutoff for every batch, so rows done while the purge runs are not chased. It
        // travels as text, which PostgreSQL reads back to the same microsecond.
        let row = self
            .row("the purge cutoff", Call::PurgeCutoff, &[&older_than_us])
            .await?;
        let cutoff: String = column(&row, 0, "cutoff")?;
        purge_in_batches(batch_size, max_rows, async |take| {
            let limit = i64::try_from(take).unwrap_or(i64::MAX);
            self.execute("a purge batch", Call::PurgeBatch, &[&cutoff, &limit])
                .await
        })
        .await
    }
}

impl ClaimStore for PostgresOutboxStore {
    async fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Result<Vec<Claimed>> {
        self.claim_batch(batch_size, claim_timeout).await
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.execute("mark_done", Call::MarkDone, &[&ids, token.as_uuid()])
            .await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> Result<u64> {
        let (id, token, dead) = (failed.id, failed.token, failed.dead);
        let retry_us = failure_retry_us(failed.retry_after, dead)?;
        // PostgreSQL text cannot hold NUL; the column holds 2000 characters.
        let error: String = failed
            .error
            .replace('\0', "\u{fffd}")
            .chars()
            .take(2000)
            .collect();
        self.execute(
            "mark_failed",
            Call::MarkFailed,
            &[&dead, &retry_us, &error, &id, token.as_uuid()],
        )
        .await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        let after_us = micros("requeue after", after, MAX_RETRY)?;
        self.execute("requeue", Call::Requeue, &[&after_us, &id, token.as_uuid()])
            .await
    }

    fn outbox_name(&self) -> String {
        self.table.name().to_owned()
    }

    fn concurrent_handle(&self) -> Option<Self> {
        Some(PostgresOutboxStore {
            table: self.table.clone(),
            quoted: self.quoted.clone(),
            config: self.config.clone(),
            shared: Arc::clone(&self.shared),
        })
    }
}

/// `limit` in whole milliseconds.
fn millis(limit: Duration) -> u64 {
    u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)
}

/// The statement that hands message `$2` of `t` back as failed, due `$1` microseconds from
/// now (server clock), attempts unchanged, if `condition` holds: a redrive or a requeue.
fn hand_back(t: &str, condition: &str) -> String {
    format!(
        "update {t} set status = 3, \
         next_retry_at = now() + $1::bigint * interval '1 microsecond', \
         processed_at = null where id = $2 and {condition}"
    )
}

/// A column of a row, decoded; the error names the column.
fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
    name: &str,
) -> Result<T> {
    row.try_get(index).map_err(|e| decode_error(name, e))
}

/// A text column of a claimed row, read as text or (from an `SQL_ASCII` database, see
/// [`claimed_columns`](claim::claimed_columns)) as bytes; an error names the column.
fn text(row: &Row, index: usize, name: &str) -> Result<Option<String>> {
    if row.columns()[index].type_() == &tokio_postgres::types::Type::BYTEA {
        utf8_column(&column(row, index, name)?, name)
    } else {
        column(row, index, name)
    }
}

/// A claimed row as the relay gets it: decoded, or as [`Claimed::Undecodable`] (with the
/// reason) when any of its columns does not decode. An error only when its id or attempts
/// do not (a bigint and an integer: never).
fn claimed(row: &Row, token: ClaimToken) -> Result<Claimed> {
    let id: i64 = column(row, 0, "id")?;
    let attempts: i32 = column(row, 9, "attempts")?;
    let payload_text = text(row, 6, "payload");
    let headers_text = text(row, 7, "headers");
    let required = |index: usize, name: &str| -> Result<String> {
        text(row, index, name)?.ok_or_else(|| decode_error(name, "null"))
    };
    let decoded = (|| -> Result<ClaimedMessage> {
        let (payload, headers) = decode_body(&payload_text, &headers_text)?;
        Ok(ClaimedMessage {
            id,
            message_id: required(1, "message_id")?,
            topic: required(2, "topic")?,
            aggregate_type: text(row, 3, "aggregate_type")?,
            aggregate_id: text(row, 4, "aggregate_id")?,
            partition_key: text(row, 5, "partition_key")?,
            payload,
            headers,
            trace_id: text(row, 8, "trace_id")?,
            attempts,
            claim_token: token,
        })
    })();
    Ok(match decoded {
        Ok(message) => Claimed::Message(message),
        Err(error) => Claimed::Undecodable(UndecodableMessage {
            id,
            message_id: required(1, "message_id").ok(),
            topic: required(2, "topic").ok(),
            payload: payload_text.ok().flatten(),
            headers: headers_text.ok().flatten(),
            attempts,
            claim_token: token,
            error: error.to_string(),
        }),
    })
}
