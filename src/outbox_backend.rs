//! What the claim-outbox stores over MariaDB/MySQL ([`crate::mysql`]) and PostgreSQL
//! ([`crate::postgres`]) share, written once: the time bound on a call, the stored form
//! of a new message, the batching of a purge, and the polling fallback of their wakers.
//! Their argument ranges are [`crate::claim_limits`]. This module imports neither store.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::error::{Error, Result, decode_error};
use crate::outbox::NewMessage;
use crate::relay::RelayHandle;

/// `call`, failing as an [`Error::Connection`] (transient) with the message `overran`
/// after `limit`: a silent server or network must not hold the caller for ever, and the
/// connection the call used is not to be trusted after that.
pub(crate) async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T>>,
    overran: impl FnOnce() -> String,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Connection(overran())),
    }
}

/// Forgets the connection in `slot` when `result` failed at the connection level (or had
/// no answer in time): the next call opens a fresh one instead of reusing a connection in
/// an unknown state.
pub(crate) fn forget_if_broken<C, T>(slot: &mut Option<C>, result: &Result<T>) {
    if let Err(Error::Connection(_)) = result {
        *slot = None;
    }
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

/// How many rows the next batch of a purge deletes, `deleted` rows into it: `batch_size`,
/// or what is left of `max_rows` if that is less (0: the purge is over).
pub(crate) fn purge_batch(batch_size: u32, max_rows: Option<u64>, deleted: u64) -> u64 {
    max_rows.map_or(u64::from(batch_size), |max| {
        (max - deleted).min(u64::from(batch_size))
    })
}

/// A waker that cannot follow its source (the binlog, LISTEN) wakes the relay at once (rows
/// may have been committed meanwhile), then every `fallback_poll` until `reconnect_delay`
/// has passed, when it tries its source again. Returns `false` if `shutdown` came first.
pub(crate) async fn poll_until_reconnect<F: Future<Output = ()>>(
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
