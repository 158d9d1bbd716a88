//! The claim's statements on PostgreSQL (see
//! [`PostgresOutboxStore::claim_batch`](super::PostgresOutboxStore::claim_batch), which
//! chooses between them): the one statement over every open message, the claim near the
//! front of the open messages and the claim of the heads past it, and what they share.

use crate::claim_limits::CLAIM_REACH;

/// The columns a claim returns, in the order the store's `claimed` reads them. With `raw`,
/// every text column comes as its bytes (`convert_to` the database's own encoding,
/// `SQL_ASCII`, which converts nothing): an `SQL_ASCII` database stores whatever bytes it
/// is given, and the server refuses to send text that is not valid in the client's UTF-8
/// (22021), which would fail the whole claim, every time, for one row. As bytes, such a row
/// is handed over undecodable instead. Other encodings convert to UTF-8 on the server.
pub(super) fn claimed_columns(raw: bool) -> String {
    let text = |expr: &str| {
        if raw {
            format!("convert_to({expr}, 'SQL_ASCII')")
        } else {
            expr.to_owned()
        }
    };
    format!(
        "t.id, {}, {}, {}, {}, {}, {}, {}, {}, t.attempts",
        text("t.message_id"),
        text("t.topic"),
        text("t.aggregate_type"),
        text("t.aggregate_id"),
        text("coalesce(t.partition_key, t.aggregate_id)"),
        text("t.payload::text"),
        text("t.headers::text"),
        text("t.trace_id"),
    )
}

/// The one statement: up to `limit` due heads among every open message of `t`, in id
/// order (`raw`: see [`claimed_columns`]).
pub(super) fn every_open(t: &str, limit: u32, raw: bool) -> String {
    format!(
        "with due as ( \
         select t.id from {t} as t \
         where t.status in (0, 1, 3) and ({due}) \
         and {head} \
         order by t.id limit {limit} \
         for update skip locked) \
         {update}",
        due = due_condition("t"),
        head = head_probe(t),
        update = claim_update(t, "due", raw),
    )
}

/// The claim near the front: the same, among the first `limit` × [`CLAIM_REACH`] open
/// messages only.
///
/// The subquery stops at the reach; each row it yields is read again by id, so that the
/// lock and the recheck fall on the table's row (a `FOR UPDATE` on the subquery would lock
/// every row it reads, before the filter).
pub(super) fn near(t: &str, limit: u32, raw: bool) -> String {
    format!(
        "with due as ( \
         select t.id from (select r.id from {t} as r where r.status in (0, 1, 3) \
         order by r.id limit {reach}) as near \
         join {t} as t on t.id = near.id \
         where t.status in (0, 1, 3) and ({due}) \
         and {head} \
         order by t.id limit {limit} \
         for update of t skip locked) \
         {update}",
        reach = u64::from(limit) * u64::from(CLAIM_REACH),
        due = due_condition("t"),
        head = head_probe(t),
        update = claim_update(t, "due", raw),
    )
}

/// The claim past the reach: up to `$3` of the due heads with the lowest ids, found by a
/// recursive skip scan of the head index (one descent per aggregate with open messages),
/// and due messages without an aggregate; nothing when fewer messages than the reach of a
/// claim near of `limit` are open.
///
/// The skip scan reads each head's row with its status, so only the due heads
/// with the lowest ids (a batch of them: more when some turn out locked) are
/// read again, probed and locked.
pub(super) fn heads(t: &str, limit: u32, raw: bool) -> String {
    format!(
        "with recursive reach as ({reach}), \
         heads (aggregate_id, id, due) as ( \
         (select e.aggregate_id, e.id, ({due_e}) from {t} as e \
         where e.status in (0, 1, 3) and e.aggregate_id is not null \
         and exists (select from reach) \
         order by e.aggregate_id, e.id limit 1) \
         union all \
         select n.aggregate_id, n.id, n.due from heads as h cross join lateral ( \
         select e.aggregate_id, e.id, ({due_e}) as due from {t} as e \
         where e.status in (0, 1, 3) and e.aggregate_id > h.aggregate_id \
         order by e.aggregate_id, e.id limit 1) as n), \
         candidates as ( \
         select t.id from {t} as t \
         where t.id in ( \
         (select h.id from heads as h where h.due order by h.id limit {limit}) \
         union all \
         (select e.id from {t} as e \
         where e.aggregate_id is null and e.status in (0, 1, 3) and ({due_e}) \
         and exists (select from reach) \
         order by e.aggregate_id, e.id limit {limit})) \
         and t.status in (0, 1, 3) and ({due}) \
         and {head} \
         order by t.id limit {limit} \
         for update skip locked), \
         due as (select c.id from candidates as c order by c.id limit $3) \
         {update}",
        reach = reach_end(t, limit),
        due = due_condition("t"),
        due_e = due_condition("e"),
        head = head_probe(t),
        update = claim_update(t, "due", raw),
    )
}

/// Whether the reach of a claim near of `limit` is full (as many messages open).
pub(super) fn past_reach(t: &str, limit: u32) -> String {
    format!("select exists ({})", reach_end(t, limit))
}

/// The last open message within the reach of a claim of `n` (none when fewer are open):
/// the first `n` × [`CLAIM_REACH`] entries of the open-messages index.
fn reach_end(t: &str, n: u32) -> String {
    format!(
        "select r.id from {t} as r where r.status in (0, 1, 3) \
         order by r.id offset {} limit 1",
        u64::from(n) * u64::from(CLAIM_REACH) - 1
    )
}

/// Whether the candidate `t` is its aggregate's head in the statement's snapshot: no
/// earlier open message of its aggregate (a message without an aggregate always is).
fn head_probe(t: &str) -> String {
    format!(
        "not exists (select 1 from {t} as e \
         where e.aggregate_id = t.aggregate_id and e.status in (0, 1, 3) and e.id < t.id)"
    )
}

/// Whether the open message `a` is due: pending, failed and due for its retry, or claimed
/// and expired (`$1`: the claim timeout in microseconds, for rows claimed before
/// `claim_expires_at` existed).
fn due_condition(a: &str) -> String {
    format!(
        "{a}.status = 0 \
         or ({a}.status = 3 and {a}.next_retry_at <= now()) \
         or ({a}.status = 1 and coalesce({a}.claim_expires_at, \
         {a}.claimed_at + $1::bigint * interval '1 microsecond') < now())"
    )
}

/// The update that claims the ids of `due` (a query of the statement) under token `$2`
/// for `$1` microseconds, returning [`claimed_columns`].
fn claim_update(t: &str, due: &str, raw: bool) -> String {
    format!(
        "update {t} as t set attempts = t.attempts + (t.status = 1)::int, status = 1, \
         claimed_at = now(), \
         claim_expires_at = now() + $1::bigint * interval '1 microsecond', \
         claim_token = $2 \
         from {due} where t.id = {due}.id \
         returning {}",
        claimed_columns(raw)
    )
}
