//! The argument ranges of the claim outbox, checked in Rust by the stores whose SQL does
//! not check them itself (MariaDB/MySQL and PostgreSQL). They are SQL Server's: its
//! procedures refuse the same ranges with errors 51301, 51303 and 51308, so a relay
//! configured for one store is valid on every store.

use std::time::Duration;

use crate::error::{Error, Result};

/// The largest claim.
pub(crate) const MAX_BATCH: u32 = 10_000;
/// The longest claim timeout: 24 hours.
pub(crate) const MAX_CLAIM_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest retry delay: 366 days.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(366 * 24 * 60 * 60);
/// The longest purge window: 100 years of 365.25 days.
pub(crate) const MAX_PURGE_WINDOW: Duration = Duration::from_secs(3_155_760_000);
/// The largest purge batch (below SQL Server's lock escalation).
pub(crate) const MAX_PURGE_BATCH: u32 = 4000;

/// How many open messages, in id order, a claim of `n` that stops at its reach reads at
/// most (`n` × this) before it looks for heads past them by the aggregate index (on
/// PostgreSQL and MariaDB/MySQL: a claim over every open message reads every message behind
/// heads it cannot take).
pub(crate) const CLAIM_REACH: u32 = 16;

/// Whether the next claims should stop at their reach after a claim of `n` over every open
/// message that `failed` or took `took`: it failed (perhaps past its time bound), or took
/// over 100 ms, or 100 µs a message for a larger batch (a claim of 100 due heads near the
/// front takes a few milliseconds; one that read 50 000 open messages behind blocked heads,
/// half a second).
pub(crate) fn read_far(failed: bool, took: Duration, n: u32) -> bool {
    failed || took > Duration::from_micros(u64::from(n) * 100).max(Duration::from_millis(100))
}

/// The least time a store call gets, whatever the claim timeout: a claim timeout shorter
/// than a round trip must not make every call time out (and drop its connection) forever.
pub(crate) const MIN_CALL_BOUND: Duration = Duration::from_secs(1);

/// How long a store's call may take once its relay claims for `claim_timeout`: the claim
/// timeout (at least [`MIN_CALL_BOUND`], at most `most`, the store's own bound). An
/// acknowledgement that has not answered when the claim expires is worth nothing more than
/// a retry on a fresh connection, and a call to a server gone silent must neither hold the
/// relay, nor its shutdown, past the claim it serves.
pub(crate) fn call_bound(claim_timeout: Duration, most: Duration) -> Duration {
    claim_timeout.max(MIN_CALL_BOUND).min(most)
}

/// A claim's batch size (1..=10000) and timeout (1 ms..=24 h).
pub(crate) fn check_claim(batch_size: u32, claim_timeout: Duration) -> Result<()> {
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

/// A purge's window (0..=100 years), batch size (1..=4000) and row limit (positive, or
/// `None` for none); returns the window in microseconds.
pub(crate) fn check_purge(
    older_than: Duration,
    batch_size: u32,
    max_rows: Option<u64>,
) -> Result<i64> {
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
    Ok(older_than_us)
}

/// `duration` in whole microseconds, refused past `max` (which keeps every value far
/// inside a bigint).
pub(crate) fn micros(what: &str, duration: Duration, max: Duration) -> Result<i64> {
    if duration > max {
        return Err(Error::Config(format!(
            "{what} is {duration:?}; it must be at most {max:?}"
        )));
    }
    i64::try_from(duration.as_micros())
        .map_err(|_| Error::Config(format!("{what} of {duration:?} is too long")))
}

/// The retry delay of `mark_failed` in microseconds: 0 for a message going dead (its
/// `retry_after` is ignored), else `retry_after`, which a failed message must have.
pub(crate) fn failure_retry_us(retry_after: Option<Duration>, dead: bool) -> Result<i64> {
    match (dead, retry_after) {
        (true, _) => Ok(0),
        (false, Some(after)) => micros("mark_failed retry_after", after, MAX_RETRY),
        (false, None) => Err(Error::Config(
            "mark_failed: a failed message needs retry_after (when to try again), or dead = \
             true to give up on it"
                .to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_bounded_by_the_claim_timeout_within_the_least_and_the_stores_most() {
        let most = Duration::from_secs(35);
        assert_eq!(call_bound(Duration::from_millis(5), most), MIN_CALL_BOUND);
        assert_eq!(
            call_bound(Duration::from_secs(3), most),
            Duration::from_secs(3)
        );
        assert_eq!(call_bound(Duration::from_secs(600), most), most);
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
        assert_eq!(check_purge(Duration::ZERO, 1, None).unwrap(), 0);
        assert_eq!(
            check_purge(Duration::from_millis(5), 4000, Some(1)).unwrap(),
            5000
        );
        for (batch, max_rows) in [(0, None), (4001, None), (1, Some(0))] {
            let error = check_purge(Duration::ZERO, batch, max_rows)
                .unwrap_err()
                .to_string();
            assert!(error.contains("purge_done:"), "{error}");
        }
        let too_old = MAX_PURGE_WINDOW + Duration::from_secs(1);
        let error = check_purge(too_old, 1, None).unwrap_err().to_string();
        assert!(error.contains("purge older_than"), "{error}");
        assert_eq!(
            micros("x", Duration::from_millis(5), MAX_RETRY).unwrap(),
            5000
        );
        assert!(micros("x", MAX_RETRY + Duration::from_secs(1), MAX_RETRY).is_err());
        // 100 years in microseconds is far inside a bigint.
        assert!(micros("x", MAX_PURGE_WINDOW, MAX_PURGE_WINDOW).is_ok());
        assert_eq!(failure_retry_us(None, true).unwrap(), 0);
        assert_eq!(failure_retry_us(Some(MAX_RETRY * 2), true).unwrap(), 0);
        assert_eq!(
            failure_retry_us(Some(Duration::from_millis(2)), false).unwrap(),
            2000
        );
        let error = failure_retry_us(None, false).unwrap_err().to_string();
        assert!(error.contains("needs retry_after"), "{error}");
        assert!(failure_retry_us(Some(MAX_RETRY * 2), false).is_err());
    }
}
