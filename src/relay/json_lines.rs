//! [`JsonLines`]: a publisher that writes each message to standard output as one JSON line,
//! for trying a relay out and for piping into other tools (`changefeed relay`).

use std::io::Write;

use super::publisher::{PublishError, PublishOutcome, Publisher};
use crate::outbox::ClaimedMessage;

/// Writes each message as one JSON object per line on standard output: `id`,
/// `message_id`, `topic`, `key` (the partition key), `headers`, `payload`, `attempts`.
///
/// ```
/// use changefeed::relay::JsonLines;
/// # use changefeed::outbox::{ClaimToken, ClaimedMessage};
/// # let message = ClaimedMessage {
/// #     id: 7, message_id: "m-7".into(), topic: "orders".into(), aggregate_type: None,
/// #     aggregate_id: Some("42".into()), partition_key: Some("42".into()),
/// #     payload: serde_json::json!({"order": 42}), headers: Default::default(),
/// #     trace_id: None, attempts: 0, claim_token: ClaimToken::new(uuid::Uuid::nil()),
/// # };
/// let line = JsonLines::line(&message);
/// assert_eq!(line["key"], "42");
/// assert_eq!(line["payload"]["order"], 42);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonLines;

impl JsonLines {
    /// The JSON object printed for `message`.
    pub fn line(message: &ClaimedMessage) -> serde_json::Value {
        serde_json::json!({
            "id": message.id,
            "message_id": message.message_id,
            "topic": message.topic,
            "key": message.partition_key,
            "headers": message.headers,
            "payload": message.payload,
            "attempts": message.attempts,
        })
    }
}

impl Publisher for JsonLines {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let mut out = std::io::stdout().lock();
        batch
            .iter()
            .map(|message| {
                // A closed or full stdout stops everything: a retry would not fix it.
                writeln!(out, "{}", Self::line(message))
                    .and_then(|()| out.flush())
                    .map_err(|e| PublishError::fatal(format!("cannot write to stdout: {e}")))
            })
            .collect()
    }
}
