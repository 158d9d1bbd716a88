//! The claim's steps over MariaDB/MySQL ([`claim_in`]), as
//! [`MysqlOutboxStore::claim_batch`](super::MysqlOutboxStore::claim_batch) explains them:
//! the candidate scan, the head-of-aggregate probe, the update, the read-back, and the
//! decoding of what was claimed. Also the SQL literals the store's statements embed.

use std::fmt::Write as _;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use super::table::OutboxTable;
use crate::claim_limits::{CLAIM_REACH, MAX_BATCH};
use crate::error::{Error, Result, decode_error};
use crate::outbox::{ClaimToken, Claimed, ClaimedMessage, UndecodableMessage};
use crate::outbox_backend::{decode_body, utf8_column};

/// MariaDB answers a refused `NOWAIT` with 1205 (lock wait timeout), MySQL with 3572.
const NOWAIT_REFUSED: [u16; 2] = [1205, 3572];
/// Integers for an `IN (…)` list: digits and commas only, safe inside SQL text.
pub(super) fn id_list(ids: &[i64]) -> String {
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
pub(super) fn token_literal(token: ClaimToken) -> String {
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
/// The most aggregates one claim's walk of `open_heads` visits ([`heads_past`]): each is a
/// round trip (about 0.1 ms on a local socket, bench_mysql's statement log), so a walk stays
/// near 200 ms even for the largest batch, which would otherwise walk 160 000 aggregates.
const MAX_WALK: usize = 2048;
/// The largest packet MariaDB/MySQL allow (1 GiB): the limit when the URL sets none (the
/// server's `max_allowed_packet` then decides, in SQL).
pub(super) const MAX_PACKET: usize = 1 << 30;
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

/// Whether the candidate `t` is its aggregate's head in the statement's snapshot: no open
/// row of its aggregate has a lower id (a row without an aggregate always is). Read as the
/// aggregate's first open id, one entry of `head_of_aggregate (aggregate_id, is_open, id)`:
/// `NOT EXISTS (… AND e.id < t.id)` read every open entry of a head's aggregate, because in
/// a dependent subquery the optimizer takes `e.id < t.id` as a filter, not a bound of the
/// range. And this subquery depends on the aggregate alone, so MariaDB's subquery cache
/// answers it once per aggregate in a statement (behind 10 held heads, 200 000 rows took
/// 0.42 s instead of 1.7 s). The subquery is a consistent read, so it never waits.
fn head_probe(t: &str) -> String {
    format!(
        "coalesce((select e.id from {t} as e force index (head_of_aggregate) \
         where e.aggregate_id = t.aggregate_id and e.is_open = 1 order by e.id limit 1), \
         t.id) >= t.id"
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

/// Where the store's claims look for heads (step 1 of
/// [`MysqlOutboxStore::claim_batch`](super::MysqlOutboxStore::claim_batch)).
pub(super) struct Reach {
    /// Whether the next claim stops its scan in id order at the first batch ×
    /// [`CLAIM_REACH`] open messages and walks the index `open_heads` for the heads past
    /// them, instead of scanning every open message (which reads every message behind a
    /// head it cannot take).
    pub(super) near: bool,
    /// Whether the table has the index `open_heads` (the bundle's V5 and
    /// `changefeed_setup_outbox`); looked up on each new connection. Without it every
    /// claim scans every open message.
    pub(super) heads_index: Option<bool>,
    /// The aggregate the last walk stopped after, when it stopped before the end: the next
    /// walk goes on from there, so that every aggregate is reached in turn.
    walked_to: Option<Value>,
}

impl Default for Reach {
    /// A new store's: its first claim stops at the reach (a relay that starts into a deep
    /// backlog does not begin with a claim that reads all of it).
    fn default() -> Self {
        Reach {
            near: true,
            heads_index: None,
            walked_to: None,
        }
    }
}

/// The claim's steps (see [`MysqlOutboxStore::claim_batch`]) on `conn`.
pub(super) async fn claim_in(
    conn: &mut Conn,
    table: &OutboxTable,
    batch_size: u32,
    timeout_us: u128,
    packet_limit: usize,
    reach: &mut Reach,
) -> Result<Vec<Claimed>> {
    let t = table.quoted();
    let wanted = batch_size as usize;
    if reach.heads_index.is_none() {
        let found = has_open_heads(conn, table).await?;
        if !found {
            tracing::warn!(
                outbox = table.name(),
                "the outbox has no index open_heads (bundle V5), so a claim behind held heads \
                 reads every open message behind them; run CALL changefeed_setup_outbox('{}') \
                 (or changefeed setup-outbox) to add it",
                table.name()
            );
        }
        reach.heads_index = Some(found);
    }
    let near = reach.near && reach.heads_index == Some(true);
    conn.query_drop("start transaction").await?;
    // The last open message within the reach (none when fewer are open): the scan stops
    // there.
    let bound = match near {
        true => reach_end(conn, &t, batch_size).await?,
        false => None,
    };
    let mut kept: Vec<Candidate> = Vec::with_capacity(wanted);
    let mut after: Option<i64> = None;
    for round in 0..MAX_ROUNDS {
        // Each round scans twice as far as the one before (a run of blocked candidates
        // longer than the batch is passed in a few rounds); what a round finds beyond the
        // batch is left unclaimed, unlocked at the commit.
        let limit = (wanted - kept.len())
            .max(wanted.saturating_mul(1 << round))
            .min(MAX_BATCH as usize);
        let mut range = String::from("t.is_open = 1");
        if let Some(id) = after {
            let _ = write!(range, " and t.id > {id}");
        }
        if let Some(id) = bound {
            let _ = write!(range, " and t.id <= {id}");
        }
        let candidates = candidates(conn, &t, "open_messages", &range, limit, timeout_us).await?;
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
    match bound {
        Some(bound) if kept.len() < wanted => {
            let past = heads_past(conn, &t, bound, wanted - kept.len(), timeout_us, reach).await?;
            kept.extend(keep_heads(conn, &t, past).await?);
            kept.truncate(wanted);
        }
        // The first open messages held a whole batch of due heads, or fewer messages than
        // the reach are open: a scan of every open message reads no further than this one.
        _ if near => reach.near = false,
        _ => {}
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

/// Step 1: up to `limit` due heads among the rows of `range` (SQL over `t` holding only
/// literals the claim made: ids), read through `index` in id order, locked, without
/// payload and headers.
async fn candidates(
    conn: &mut Conn,
    t: &str,
    index: &str,
    range: &str,
    limit: usize,
    timeout_us: u128,
) -> Result<Vec<Candidate>> {
    let rows: Vec<Row> = conn
        .query(format!(
            "select t.id, t.message_id, t.topic, t.aggregate_type, t.aggregate_id, \
             coalesce(t.partition_key, t.aggregate_id), t.trace_id \
             from {t} as t force index ({index}) \
             where {range} and {due} and {head} \
             order by t.id limit {limit} \
             for update skip locked",
            due = due("t", timeout_us),
            head = head_probe(t),
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

/// Whether `table` has the index `open_heads` (the bundle's V5).
async fn has_open_heads(conn: &mut Conn, table: &OutboxTable) -> Result<bool> {
    let found: Option<i64> = conn
        .exec_first(
            "select count(*) from information_schema.statistics where table_schema = \
             database() and table_name = ? and index_name = 'open_heads'",
            (table.name(),),
        )
        .await?;
    Ok(found.unwrap_or(0) > 0)
}

/// The id of the last open message within the reach of a claim of `n` (none when fewer
/// are open): the (`n` × [`CLAIM_REACH`])th entry of `open_messages`, a consistent read of
/// the index alone.
async fn reach_end(conn: &mut Conn, t: &str, n: u32) -> Result<Option<i64>> {
    let reach = u64::from(n) * u64::from(CLAIM_REACH);
    Ok(conn
        .query_first(format!(
            "select r.id from {t} as r force index (open_messages) where r.is_open = 1 \
             order by r.is_open, r.id limit 1 offset {}",
            reach - 1
        ))
        .await?)
}

/// Step 1 past the reach: up to `more` due heads with ids above `bound`, lowest ids first,
/// locked as in [`candidates`]. Walks `open_heads (is_open, aggregate_id, id)` one index
/// descent per aggregate with open messages (the first entry after the last aggregate is
/// the next aggregate's head), at most `more` × [`CLAIM_REACH`] aggregates (and
/// [`MAX_WALK`]), going on where the last walk stopped; messages without an aggregate, each
/// its own head, come from the same index.
async fn heads_past(
    conn: &mut Conn,
    t: &str,
    bound: i64,
    more: usize,
    timeout_us: u128,
    reach: &mut Reach,
) -> Result<Vec<Candidate>> {
    let mut steps = more.saturating_mul(CLAIM_REACH as usize).min(MAX_WALK);
    let mut heads: Vec<i64> = Vec::new();
    let start = reach.walked_to.take();
    // From where the last walk stopped to the last aggregate; then, if it began past the
    // first, from the first aggregate round to where it began.
    let mut passes = vec![(start.clone(), None)];
    if start.is_some() {
        passes.push((None, start));
    }
    'walk: for (from, upto) in passes {
        let mut after = from;
        while let Some((aggregate, id)) = next_head(conn, t, after.as_ref(), upto.as_ref()).await? {
            if id > bound {
                heads.push(id);
            }
            after = Some(aggregate);
            steps -= 1;
            if steps == 0 {
                reach.walked_to = after;
                break 'walk;
            }
        }
    }
    let mut past = Vec::new();
    if !heads.is_empty() {
        let range = format!("t.id in ({})", id_list(&heads));
        past = candidates(conn, t, "primary", &range, more, timeout_us).await?;
    }
    let range = format!("t.is_open = 1 and t.aggregate_id is null and t.id > {bound}");
    past.extend(candidates(conn, t, "open_heads", &range, more, timeout_us).await?);
    past.sort_by_key(|c| c.id);
    past.truncate(more);
    Ok(past)
}

/// The head of the first aggregate with open messages after `after` (from the first
/// aggregate when `None`) and not after `upto`: its aggregate id (as the server sent it,
/// to be sent back) and its id. One descent of `open_heads`.
async fn next_head(
    conn: &mut Conn,
    t: &str,
    after: Option<&Value>,
    upto: Option<&Value>,
) -> Result<Option<(Value, i64)>> {
    let mut params: Vec<Value> = Vec::with_capacity(2);
    let mut range = String::from("e.is_open = 1");
    match after {
        Some(aggregate) => {
            range.push_str(" and e.aggregate_id > ?");
            params.push(aggregate.clone());
        }
        None => range.push_str(" and e.aggregate_id is not null"),
    }
    if let Some(aggregate) = upto {
        range.push_str(" and e.aggregate_id <= ?");
        params.push(aggregate.clone());
    }
    let row: Option<Row> = conn
        .exec_first(
            format!(
                "select e.aggregate_id, e.id from {t} as e force index (open_heads) \
                 where {range} order by e.is_open, e.aggregate_id, e.id limit 1"
            ),
            params,
        )
        .await?;
    row.map(|mut row| {
        let aggregate = row.take::<Value, usize>(0).unwrap_or(Value::NULL);
        Ok((aggregate, column(&row, 1, "id")?))
    })
    .transpose()
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
    let payload_text = utf8_column(&fetched.payload, "payload");
    let headers_text = utf8_column(&fetched.headers, "headers");
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
        let (payload, headers) = decode_body(&payload_text, &headers_text)?;
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
}
