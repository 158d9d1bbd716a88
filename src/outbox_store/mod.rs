//! [`OutboxStore`]: the claim-style outbox's procedures, called from Rust.
//!
//! Each method runs one procedure of `[changefeed].[<kind>:schema.table]` (created by
//! `exec changefeed.setup_outbox`), passing every value as a parameter, and decodes its
//! rows. The semantics live in the SQL (see docs/sql-server.md, "The claim outbox").
//!
//! [`SqlClaimStore`], the relay's store over these procedures (one pooled connection,
//! claims that wait on the server), is `outbox_store/sql_claim_store.rs`.

use std::time::Duration;

use tiberius::Row;

use crate::connection::Client;
use crate::error::{Error, Result, decode_error};
use crate::feed::TableName;
use crate::outbox::{
    BACKLOG_COUNT_LIMIT, ClaimProgress, ClaimToken, Claimed, ClaimedMessage, Enqueued, Failed,
    Headers, NewMessage, OutboxBacklog, UndecodableMessage,
};
use crate::row::Column;

mod sql_claim_store;

pub use sql_claim_store::SqlClaimStore;

/// The procedures of one claim outbox table.
///
/// ```no_run
/// # async fn run(pool: &changefeed::Pool) -> changefeed::Result<()> {
/// use changefeed::outbox::NewMessage;
/// use changefeed::outbox_store::OutboxStore;
///
/// let outbox: OutboxStore = "dbo.outbox".parse()?;
/// let mut conn = pool.get().await?;
/// let mut tx = conn.transaction().await?;
/// // ... the business change, in the same transaction ...
/// let message = NewMessage::new("orders", serde_json::json!({"order": 42})).aggregate("order", "42");
/// outbox.enqueue(&mut tx, &message).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxStore {
    table: TableName,
}

impl std::str::FromStr for OutboxStore {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        name.parse().map(OutboxStore::new)
    }
}

fn duration_ms(what: &str, duration: Duration) -> Result<i64> {
    i64::try_from(duration.as_millis())
        .map_err(|_| Error::Config(format!("{what} of {duration:?} is too long")))
}

impl OutboxStore {
    /// The store of the outbox table `table`.
    pub fn new(table: TableName) -> Self {
        OutboxStore { table }
    }

    /// The outbox table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Enqueues a message inside the transaction open on `client` (the server refuses,
    /// with error 51300, when none is open). A `message_id` already in the outbox is not
    /// enqueued twice: the existing row comes back.
    pub async fn enqueue(&self, client: &mut Client, message: &NewMessage) -> Result<Enqueued> {
        check_payload(&message.payload)?;
        let payload = message.payload.to_string();
        let headers = if message.headers.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&message.headers).map_err(|e| decode_error("headers", e))?)
        };
        let rows = self
            .call(
                client,
                "enqueue",
                "@topic = @P1, @payload = @P2, @aggregate_type = @P3, @aggregate_id = @P4, \
                 @partition_key = @P5, @headers = @P6, @message_id = @P7, @trace_id = @P8",
                &[
                    &message.topic.as_str(),
                    &payload.as_str(),
                    &message.aggregate_type.as_deref(),
                    &message.aggregate_id.as_deref(),
                    &message.partition_key.as_deref(),
                    &headers.as_deref(),
                    &message.message_id.as_deref(),
                    &message.trace_id.as_deref(),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| decode_error("enqueue", "the procedure returned no row"))?;
        Ok(Enqueued {
            id: i64::column(row, 0)?,
            message_id: String::column(row, 1)?,
        })
    }

    /// Claims up to `batch_size` due messages (1..=10000) for `claim_timeout`
    /// (1 ms..=24 h), head of aggregate only, ordered by id.
    ///
    /// Each row is decoded on its own: one whose payload, headers or columns cannot be
    /// decoded comes back as [`Claimed::Undecodable`] with its raw text, so the caller can
    /// mark it dead while the rest of the batch goes on.
    pub async fn claim(
        &self,
        client: &mut Client,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> Result<Vec<Claimed>> {
        self.claim_waiting(client, batch_size, claim_timeout, Duration::ZERO)
            .await
    }

    /// [`claim`](Self::claim), and with nothing due, waits on the server up to `wait`
    /// (at most [`MAX_CLAIM_WAIT`]) for messages to become due: the procedure tries again
    /// after short pauses (2 ms doubling to [`CLAIM_PAUSE_MAX`]), holding no lock and no
    /// transaction while it pauses, and returns as soon as it claims something; empty when
    /// `wait` passes first. Call it outside a transaction (the server refuses a wait inside
    /// one, error 51311).
    ///
    /// tiberius' command timeout must exceed the wait: [`SqlClaimStore`] asks for no more
    /// than the connection's timeout minus [`CLAIM_WAIT_MARGIN`]. A zero `wait` sends no
    /// `@wait_ms`, so it also runs on an outbox whose code predates the wait.
    pub async fn claim_waiting(
        &self,
        client: &mut Client,
        batch_size: u32,
        claim_timeout: Duration,
        wait: Duration,
    ) -> Result<Vec<Claimed>> {
        self.claim_reporting(client, batch_size, claim_timeout, wait, None)
            .await
    }

    /// [`claim_waiting`](Self::claim_waiting), raising `progress` once the claim has passed
    /// its wait: when the first packet of its result arrives. The procedure's one result
    /// set is its last statement, after the try that claimed has committed (an empty one
    /// after the wait is over), so from then on the rows are claimed and on their way, and
    /// a cancel would lose them to the claim timeout. Before it, the claim is pausing or in
    /// a try that an attention rolls back. What remains is the moment between that commit
    /// and the server's first packet (the select of a table variable, and the network).
    pub(crate) async fn claim_reporting(
        &self,
        client: &mut Client,
        batch_size: u32,
        claim_timeout: Duration,
        wait: Duration,
        progress: Option<&ClaimProgress>,
    ) -> Result<Vec<Claimed>> {
        let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
        let timeout_ms = i32::try_from(claim_timeout.as_millis()).unwrap_or(i32::MAX);
        let rows = if wait.is_zero() {
            self.call_reporting(
                client,
                "claim",
                "@batch_size = @P1, @claim_timeout_ms = @P2",
                &[&batch_size, &timeout_ms],
                progress,
            )
            .await?
        } else {
            check_claim_wait(wait)?;
            let wait_ms = wait.as_millis().max(1) as i32;
            self.call_reporting(
                client,
                "claim",
                "@batch_size = @P1, @claim_timeout_ms = @P2, @wait_ms = @P3",
                &[&batch_size, &timeout_ms, &wait_ms],
                progress,
            )
            .await
            .map_err(|error| no_wait_parameter(error, &self.table))?
        };
        rows.iter().map(claimed_row).collect()
    }

    /// Marks messages done; returns how many were still held under `token`.
    pub async fn mark_done(
        &self,
        client: &mut Client,
        ids: &[i64],
        token: ClaimToken,
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = serde_json::to_string(ids).map_err(|e| decode_error("ids", e))?;
        self.call_count(
            client,
            "mark_done",
            "@ids = @P1, @claim_token = @P2",
            &[&ids.as_str(), token.as_uuid()],
            "updated",
        )
        .await
    }

    /// Marks a message failed (due again after `retry_after`) or dead; counts an attempt.
    /// Returns 1 if the message was still held under its token, else 0.
    pub async fn mark_failed(&self, client: &mut Client, failed: Failed<'_>) -> Result<u64> {
        let (id, token, dead) = (failed.id, failed.token, failed.dead);
        let (retry_after, error) = (failed.retry_after, failed.error);
        let retry_ms = retry_after
            .map(|d| duration_ms("retry_after", d))
            .transpose()?;
        let error: String = error.chars().take(2000).collect();
        self.call_count(
            client,
            "mark_failed",
            "@id = @P1, @claim_token = @P2, @retry_after_ms = @P3, @dead = @P4, @error = @P5",
            &[&id, token.as_uuid(), &retry_ms, &dead, &error.as_str()],
            "updated",
        )
        .await
    }

    /// Hands a message back as failed, due after `after`, attempts unchanged. With a token
    /// it is fenced (a relay hands back what it holds); with `None` it redrives a dead or
    /// failed message (an operator's call).
    pub async fn requeue(
        &self,
        client: &mut Client,
        id: i64,
        token: Option<ClaimToken>,
        after: Duration,
    ) -> Result<u64> {
        let after_ms = duration_ms("after", after)?;
        let token = token.map(|t| *t.as_uuid());
        self.call_count(
            client,
            "requeue",
            "@id = @P1, @claim_token = @P2, @retry_after_ms = @P3",
            &[&id, &token, &after_ms],
            "updated",
        )
        .await
    }

    /// Deletes done messages processed more than `older_than` ago, `batch_size` rows per
    /// statement (1..=4000), at most `max_rows` in all. Dead messages are kept.
    pub async fn purge_done(
        &self,
        client: &mut Client,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> Result<u64> {
        let older_than_ms = duration_ms("older_than", older_than)?;
        let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
        let max_rows = max_rows.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        self.call_count(
            client,
            "purge_done",
            "@older_than_ms = @P1, @batch_size = @P2, @max_rows = @P3",
            &[&older_than_ms, &batch_size, &max_rows],
            "deleted",
        )
        .await
    }
}

/// The longest wait a claim accepts (`@wait_ms` up to 3 600 000).
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(3600);

/// The longest pause of a waiting claim between two tries (`pause_wait`'s
/// `@max_pause_ms` in the claim procedure): how late a waiting claim sees a message that
/// became due, and how often an idle waiting relay probes its outbox (50 times a second).
pub const CLAIM_PAUSE_MAX: Duration = Duration::from_millis(20);

/// How long [`SqlClaimStore`] waits on the server by default when nothing is due: one
/// round trip every 5 s from an idle relay, and a new message is claimed within
/// [`CLAIM_PAUSE_MAX`] of its commit.
pub const DEFAULT_CLAIM_WAIT: Duration = Duration::from_secs(5);

/// What [`SqlClaimStore`] keeps free of tiberius' command timeout (30 s by default) after
/// its wait: the claim's last try, which never waits for a row lock but may read many rows
/// held back behind their aggregates' heads, and the network. The wait asked of the server
/// is at most the command timeout minus this, so a waiting claim is never cut off by it.
pub const CLAIM_WAIT_MARGIN: Duration = Duration::from_secs(10);

fn check_claim_wait(wait: Duration) -> Result<()> {
    if wait > MAX_CLAIM_WAIT {
        return Err(Error::Config(format!(
            "a claim wait of {wait:?} is too long; it must be at most 1 hour ({MAX_CLAIM_WAIT:?})"
        )));
    }
    Ok(())
}

/// Error 8145 (`@wait_ms is not a parameter for procedure …`): the outbox's code predates
/// the claim's wait, so the bundle's migrations were not applied or the outbox was skipped
/// by their upgrade as broken. Says so and names the fix.
fn no_wait_parameter(error: Error, table: &TableName) -> Error {
    if error.server_number() != Some(8145) {
        return error;
    }
    Error::Config(format!(
        "the claim procedure of outbox {table} takes no @wait_ms: its code predates the \
         claim's wait ({error}). Apply the bundle's migrations (changefeed::migrate), and if \
         select problem from changefeed.outboxes names one for this table, repair it and run \
         exec changefeed.upgrade_outbox @table_name = N'{table}'; or claim without a wait \
         (SqlClaimStore::claim_wait(Duration::ZERO))"
    ))
}

impl OutboxStore {
    /// The outbox's backlog from its `backlog` procedure (bundle V79 on): pending,
    /// processing, failed and dead counts, each stopping at [`BACKLOG_COUNT_LIMIT`], and
    /// the oldest open message's age by the server's clock. Cheap on a large outbox: each
    /// count is a range of at most that many entries of the index `done_by_processed_at
    /// (status, …)` read without touching the table, and the oldest open message is the
    /// first entry of `open_messages` (one key lookup for its `created_at`). It reads
    /// uncommitted, so it neither waits for nor blocks a claim or an enqueue: counts are
    /// a moment's approximation, as gauges are.
    pub async fn backlog(&self, client: &mut Client) -> Result<OutboxBacklog> {
        let limit = i64::try_from(BACKLOG_COUNT_LIMIT).unwrap_or(i64::MAX);
        let rows = self
            .call(client, "backlog", "@count_limit = @P1", &[&limit])
            .await?;
        backlog_row(&rows)
    }
}

/// The one row of a `backlog` procedure: pending, processing, failed, dead,
/// oldest_open_age_ms.
pub fn backlog_row(rows: &[Row]) -> Result<OutboxBacklog> {
    let row = rows
        .first()
        .ok_or_else(|| decode_error("backlog", "the procedure returned no row"))?;
    let count = |index: usize, name: &str| -> Result<u64> {
        let value = i64::column(row, index)?;
        u64::try_from(value).map_err(|e| decode_error(name, e))
    };
    Ok(OutboxBacklog::new(
        count(0, "pending")?,
        count(1, "processing")?,
        count(2, "failed")?,
        count(3, "dead")?,
        Option::<i64>::column(row, 4)?,
    ))
}

/// The outbox checks payloads with ISJSON, which (before SQL Server 2022) accepts only JSON
/// objects and arrays: refuse anything else here, with the reason, instead of a server error.
pub(crate) fn check_payload(payload: &serde_json::Value) -> Result<()> {
    if payload.is_object() || payload.is_array() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "an outbox payload must be a JSON object or array, not {payload}; wrap the value, \
             e.g. {{\"value\": {payload}}}"
        )))
    }
}

impl OutboxStore {
    /// Runs `[changefeed].[<kind>:schema.table] <arguments>` (values only as `@P` parameters;
    /// the name comes from a validated TableName) and returns its first result set.
    async fn call(
        &self,
        client: &mut Client,
        kind: &str,
        arguments: &str,
        parameters: &[&dyn tiberius::ToSql],
    ) -> Result<Vec<Row>> {
        self.call_reporting(client, kind, arguments, parameters, None)
            .await
    }

    /// [`Self::call`], raising `progress` as soon as the answer begins: tiberius' `query`
    /// returns once the first result set's column metadata has arrived (or the answer ended
    /// without one), before its rows are read.
    async fn call_reporting(
        &self,
        client: &mut Client,
        kind: &str,
        arguments: &str,
        parameters: &[&dyn tiberius::ToSql],
        progress: Option<&ClaimProgress>,
    ) -> Result<Vec<Row>> {
        let sql = format!("exec {} {arguments}", self.table.object(kind));
        let answer = client.query(sql, parameters).await?;
        if let Some(progress) = progress {
            progress.answering();
        }
        Ok(answer.into_first_result().await?)
    }
}

impl OutboxStore {
    /// [`Self::call`] of a procedure that answers with one count, the column `what`.
    async fn call_count(
        &self,
        client: &mut Client,
        kind: &str,
        arguments: &str,
        parameters: &[&dyn tiberius::ToSql],
        what: &str,
    ) -> Result<u64> {
        let rows = self.call(client, kind, arguments, parameters).await?;
        count(&rows, what)
    }
}

fn count(rows: &[Row], what: &str) -> Result<u64> {
    let row = rows
        .first()
        .ok_or_else(|| decode_error(what, "the procedure returned no row"))?;
    let value = match row.try_get::<i64, usize>(0) {
        Ok(Some(value)) => value,
        _ => i64::from(i32::column(row, 0)?),
    };
    u64::try_from(value).map_err(|e| decode_error(what, e))
}

/// One claimed row. Its id and token must decode (without them the row could not even be
/// acknowledged, so the claim fails); any other column that does not decode makes the row
/// [`Claimed::Undecodable`].
fn claimed_row(row: &Row) -> Result<Claimed> {
    let id = i64::column(row, 0)?;
    let claim_token = ClaimToken::new(tiberius::Uuid::column(row, 10)?);
    Ok(match claimed_message(row, id, claim_token) {
        Ok(message) => Claimed::Message(message),
        Err(error) => {
            let text = |index| {
                row.try_get::<&str, usize>(index)
                    .ok()
                    .flatten()
                    .map(str::to_owned)
            };
            Claimed::Undecodable(UndecodableMessage {
                id,
                message_id: text(1),
                topic: text(2),
                payload: text(6),
                headers: text(7),
                attempts: i32::column(row, 9).unwrap_or(0),
                claim_token,
                error: error.to_string(),
            })
        }
    })
}

fn claimed_message(row: &Row, id: i64, claim_token: ClaimToken) -> Result<ClaimedMessage> {
    let payload: String = String::column(row, 6)?;
    let headers: Option<String> = Option::<String>::column(row, 7)?;
    Ok(ClaimedMessage {
        id,
        message_id: String::column(row, 1)?,
        topic: String::column(row, 2)?,
        aggregate_type: Option::<String>::column(row, 3)?,
        aggregate_id: Option::<String>::column(row, 4)?,
        partition_key: Option::<String>::column(row, 5)?,
        payload: serde_json::from_str(&payload).map_err(|e| decode_error("payload", e))?,
        headers: match headers {
            Some(text) => parse_headers(&text)?,
            None => Headers::new(),
        },
        trace_id: Option::<String>::column(row, 8)?,
        attempts: i32::column(row, 9)?,
        claim_token,
    })
}

/// Headers are a JSON object; values that are not strings (enqueued from SQL by hand) are
/// kept as their JSON text rather than refused, so one odd row cannot stall a relay.
pub(crate) fn parse_headers(text: &str) -> Result<Headers> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| decode_error("headers", e))?;
    let object = value
        .as_object()
        .ok_or_else(|| decode_error("headers", "not a JSON object"))?;
    Ok(object
        .iter()
        .map(|(key, value)| {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (key.clone(), text)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_procedures_named() {
        let store: OutboxStore = "dbo.outbox".parse().unwrap();
        assert_eq!(
            store.table().object("claim"),
            "[changefeed].[claim:dbo.outbox]"
        );
        assert!("dbo.outbox]; drop table x".parse::<OutboxStore>().is_err());
    }

    #[test]
    fn payloads_must_be_objects_or_arrays() {
        assert!(check_payload(&serde_json::json!({"a": 1})).is_ok());
        assert!(check_payload(&serde_json::json!([1, 2])).is_ok());
        for scalar in [
            serde_json::json!("text"),
            serde_json::json!(42),
            serde_json::json!(null),
        ] {
            let error = check_payload(&scalar).unwrap_err().to_string();
            assert!(error.contains("object or array"), "{error}");
        }
    }

    use tiberius::{ColumnData as D, ColumnType as T};

    /// A row as the claim procedure returns it.
    fn claim_row(id: i64, payload: &str, headers: Option<&str>) -> Row {
        let text = |value: Option<&str>| D::String(value.map(|v| v.to_owned().into()));
        Row::builder()
            .column("id", T::Int8, D::I64(Some(id)))
            .column("message_id", T::NVarchar, text(Some("m-1")))
            .column("topic", T::NVarchar, text(Some("orders")))
            .column("aggregate_type", T::NVarchar, text(None))
            .column("aggregate_id", T::NVarchar, text(Some("o-1")))
            .column("partition_key", T::NVarchar, text(Some("o-1")))
            .column("payload", T::NVarchar, text(Some(payload)))
            .column("headers", T::NVarchar, text(headers))
            .column("trace_id", T::NVarchar, text(None))
            .column("attempts", T::Int4, D::I32(Some(2)))
            .column(
                "claim_token",
                T::Guid,
                D::Guid(Some(tiberius::Uuid::from_u128(9))),
            )
            .build()
    }

    #[test]
    fn a_decodable_row_is_a_message() {
        let row = claim_row(5, r#"{"n":1}"#, Some(r#"{"k":"v"}"#));
        let Claimed::Message(message) = claimed_row(&row).unwrap() else {
            panic!("expected a message");
        };
        assert_eq!(message.id, 5);
        assert_eq!(message.payload, serde_json::json!({"n": 1}));
        assert_eq!(message.headers["k"], "v");
        assert_eq!(
            message.claim_token,
            ClaimToken::new(uuid::Uuid::from_u128(9))
        );
    }

    #[test]
    fn rows_that_do_not_decode_keep_their_raw_text_and_token() {
        let cases = [
            ("[1e400]", None, "payload"),
            (r#"{"s":"\ud800"}"#, None, "payload"),
            (r#"{"n":1}"#, Some("[1,2]"), "headers"),
        ];
        for (payload, headers, column) in cases {
            let row = claim_row(7, payload, headers);
            let Claimed::Undecodable(bad) = claimed_row(&row).unwrap() else {
                panic!("{payload} {headers:?} decoded");
            };
            assert_eq!(bad.id, 7);
            assert_eq!(bad.payload.as_deref(), Some(payload));
            assert_eq!(bad.headers.as_deref(), headers);
            assert_eq!(bad.topic.as_deref(), Some("orders"));
            assert_eq!(bad.message_id.as_deref(), Some("m-1"));
            assert_eq!(bad.attempts, 2);
            assert_eq!(bad.claim_token, ClaimToken::new(uuid::Uuid::from_u128(9)));
            assert!(bad.error.contains(column), "{column}: {}", bad.error);
        }
    }

    #[test]
    fn headers_keep_non_string_values_as_json_text() {
        let headers = parse_headers(r#"{"a":"x","n":5,"o":{"k":true}}"#).unwrap();
        assert_eq!(headers["a"], "x");
        assert_eq!(headers["n"], "5");
        assert_eq!(headers["o"], r#"{"k":true}"#);
        assert!(parse_headers("[1]").is_err());
    }
}
