//! What the claim-outbox stores over MariaDB/MySQL ([`crate::mysql`]) and PostgreSQL
//! ([`crate::postgres`]) share, written once: the time bound on a call, the stored form
//! of a new message, the batching of a purge, and the loop of their wakers (follow the
//! source, fall back to polling).
//! Their argument ranges are [`crate::claim_limits`]. This module imports neither store.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::{Instant, sleep_until};

use crate::error::{Result, decode_error};
use crate::outbox::{Headers, NewMessage};
use crate::relay::RelayHandle;

// Lives in `call_bound`, which imports nothing of the relay, so that the feed reader's
// PostgreSQL session can use it without an import loop.
pub(crate) use crate::call_bound::bounded;

/// A text column a claim read as bytes, as text; an error (naming the column) when it is
/// not UTF-8. Text read as bytes cannot fail the whole claim: the row with it is handed
/// over undecodable instead, while the rest of the batch goes on.
pub(crate) fn utf8_column(bytes: &Option<Vec<u8>>, name: &str) -> Result<Option<String>> {
    bytes
        .as_ref()
        .map(|b| String::from_utf8(b.clone()).map_err(|_| decode_error(name, "not UTF-8")))
        .transpose()
}

/// A claimed row's payload and headers as the relay gets them, from their text (or why
/// that text could not be read); an error names the column.
pub(crate) fn decode_body(
    payload: &Result<Option<String>>,
    headers: &Result<Option<String>>,
) -> Result<(serde_json::Value, Headers)> {
    let payload = payload
        .as_ref()
        .map_err(|e| decode_error("payload", e))?
        .as_deref()
        .ok_or_else(|| decode_error("payload", "NULL"))?;
    let payload = serde_json::from_str::<serde_json::Value>(payload)
        .map_err(|e| decode_error("payload", e))?;
    let headers = match headers.as_ref().map_err(|e| decode_error("headers", e))? {
        Some(text) => crate::outbox_store::parse_headers(text)?,
        None => Headers::new(),
    };
    Ok((payload, headers))
}

/// The `message_id` a new message is stored under: its own, or a random UUID.
pub(crate) fn message_id(message: &NewMessage) -> String {
    message
        .message_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// The headers of a new message as the JSON text stored, `None` when it has none.
pub(crate) fn headers_json(message: &NewMessage) -> Result<Option<String>> {
    if message.headers.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(&message.headers)
        .map(Some)
        .map_err(|e| decode_error("headers", e))
}

/// Runs a purge's batches: `delete(take)` deletes up to `take` done rows (one statement,
/// its own transaction) and returns how many went. Batches go on until one deletes fewer
/// than it was given (nothing old is left) or `max_rows` rows went. Returns how many went in
/// all; an error stops the purge (the batches before it stay deleted).
pub(crate) async fn purge_in_batches(
    batch_size: u32,
    max_rows: Option<u64>,
    mut delete: impl AsyncFnMut(u64) -> Result<u64>,
) -> Result<u64> {
    let mut deleted = 0u64;
    loop {
        let take = purge_batch(batch_size, max_rows, deleted);
        if take == 0 {
            return Ok(deleted);
        }
        let count = delete(take).await?;
        deleted += count;
        if count < take {
            return Ok(deleted);
        }
    }
}

/// How many rows the next batch of a purge deletes, `deleted` rows into it: `batch_size`,
/// or what is left of `max_rows` if that is less (0: the purge is over).
fn purge_batch(batch_size: u32, max_rows: Option<u64>, deleted: u64) -> u64 {
    max_rows.map_or(u64::from(batch_size), |max| {
        (max - deleted).min(u64::from(batch_size))
    })
}

/// What a waker does until `shutdown` completes: `follow(&mut source)` follows its source
/// (the binlog, LISTEN; `source` is the waker and, for the binlog, where to resume, which
/// `follow` keeps up to date) and wakes the relay on each commit, and returns why it
/// stopped; then `polling(reason)` reports the fallback (the waker's state, its log line
/// and metric), and the relay is polled (see [`poll_until_reconnect`]) until it is time to
/// follow again. (`follow`'s future is boxed so that the waker's `run` stays `Send`.)
pub(crate) async fn follow_or_poll<S>(
    handle: &RelayHandle,
    fallback_poll: Duration,
    reconnect_delay: Duration,
    shutdown: impl Future<Output = ()>,
    mut source: S,
    follow: impl for<'a> Fn(&'a mut S) -> BoxFuture<'a, String>,
    polling: impl Fn(String),
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let reason = tokio::select! {
            biased;
            () = shutdown.as_mut() => return,
            reason = follow(&mut source) => reason,
        };
        polling(reason);
        if !poll_until_reconnect(handle, fallback_poll, reconnect_delay, shutdown.as_mut()).await {
            return;
        }
    }
}

/// A waker that cannot follow its source (the binlog, LISTEN) wakes the relay at once (rows
/// may have been committed meanwhile), then every `fallback_poll` until `reconnect_delay`
/// has passed, when it tries its source again. Returns `false` if `shutdown` came first.
async fn poll_until_reconnect<F: Future<Output = ()>>(
    handle: &RelayHandle,
    fallback_poll: Duration,
    reconnect_delay: Duration,
    mut shutdown: Pin<&mut F>,
) -> bool {
    handle.wake();
    let retry_at = Instant::now() + reconnect_delay;
    loop {
        let next_poll = (Instant::now() + fallback_poll).min(retry_at);
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return false,
            () = sleep_until(next_poll) => {}
        }
        if Instant::now() >= retry_at {
            return true;
        }
        handle.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purge_stops_at_max_rows() {
        assert_eq!(purge_batch(100, None, 1_000), 100);
        assert_eq!(purge_batch(100, Some(250), 200), 50);
        assert_eq!(purge_batch(100, Some(250), 250), 0);
    }

    #[test]
    fn a_message_without_an_id_gets_a_fresh_one_and_empty_headers_are_null() {
        let message = NewMessage::new("orders", serde_json::json!({}));
        let (first, second) = (message_id(&message), message_id(&message));
        assert_ne!(first, second);
        assert!(uuid::Uuid::parse_str(&first).is_ok(), "{first}");
        assert_eq!(headers_json(&message).unwrap(), None);
        let named = NewMessage {
            message_id: Some("k1".to_owned()),
            ..message
        };
        assert_eq!(message_id(&named), "k1");
    }
}
