//! [`enqueue`]: a message into a MariaDB/MySQL claim outbox, inside the caller's
//! transaction, with the checks SQL Server's `enqueue` makes ([`check_message`]).

use mysql_async::Transaction;
use mysql_async::prelude::Queryable;

use super::table::OutboxTable;
use crate::error::{Error, Result, decode_error};
use crate::outbox::{Enqueued, NewMessage};
use crate::outbox_backend::{headers_json, message_id};
use crate::outbox_store::check_payload;

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
    let headers = headers_json(message)?;
    let message_id = message_id(message);
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
pub(super) fn before_v4(error: Error, table: &OutboxTable) -> Error {
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

#[cfg(test)]
mod tests {
    use super::*;

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
