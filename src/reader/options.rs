//! The settings of a stream of pages: how a caught-up stream waits ([`Wait`],
//! [`IdleBackoff`]), how it retries transient failures ([`ReadRetryPolicy`]), and
//! [`FeedReaderOptions`], which holds them and checks them.

use std::time::Duration;

use rand::{Rng, RngExt};

use crate::error::{Error, Result};

use super::page::{MAX_PAGE_SIZE, MAX_WAIT, SHARD_LOCK_WAIT};
#[cfg(doc)]
use super::{FeedReader, page_stream};

/// The least `timeout_margin` of [`FeedReaderOptions`]: the shard-lock wait plus 2 s for the
/// network and the work `read_feed` does after it, so a call that is only waiting for its
/// lock is never taken for a dead connection.
pub const MIN_TIMEOUT_MARGIN: Duration = Duration::from_secs(12);

/// How a caught-up stream waits for new rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Server long-poll: every read passes `@wait_ms`, and `read_feed` holds the call until
    /// rows come or the time passes (holding no lock or transaction meanwhile). Rows are
    /// delivered within milliseconds of their commit at the cost of one open call per
    /// waiting stream. If the server answers an empty page much sooner than asked (it did
    /// not wait), the stream falls back to the client back-off for that pause.
    LongPoll(Duration),
    /// Client back-off: reads never wait on the server; after a page that is not full the
    /// stream sleeps the [`IdleBackoff`]'s `min`, doubling after each empty page up to its
    /// `max`.
    ClientBackoff,
}

/// The client-side sleep between polls of a caught-up stream: `min`, doubling after every
/// consecutive empty page, capped at `max`; a page with rows resets it.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::IdleBackoff;
///
/// let backoff = IdleBackoff::default()
///     .min(Duration::from_millis(50))
///     .max(Duration::from_secs(2));
/// assert_eq!(backoff.delay(3), Duration::from_millis(400));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdleBackoff {
    /// The first sleep. Default 100 ms; at least 1 ms.
    pub min: Duration,
    /// The longest sleep. Default 5 s; at least `min`.
    pub max: Duration,
}

impl Default for IdleBackoff {
    fn default() -> Self {
        IdleBackoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl IdleBackoff {
    setters! {
        /// Sets `min`, the first sleep (at least 1 ms).
        min: Duration;
        /// Sets `max`, the longest sleep (at least `min`).
        max: Duration;
    }

    /// The sleep after `streak` consecutive empty polls before this one (0 for the first):
    /// `min × 2^streak`, at most `max`.
    pub fn delay(&self, streak: u32) -> Duration {
        exponential(self.min, self.max, streak)
    }
}

/// `initial × 2^doublings`, at most `cap`: the bounded exponential back-off of the stream's
/// idle sleep, and of the Kafka exporter's re-produce.
pub(crate) fn exponential(initial: Duration, cap: Duration, doublings: u32) -> Duration {
    let factor = 1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(cap)
}

/// How a stream retries transient failures (see [`Error::is_transient`]): capped
/// exponential back-off with full jitter, each retry on a fresh connection.
///
/// Retry `n` (1 for the first after a failure) sleeps a delay drawn uniformly from
/// `[0, min(max, initial × 2^(n−1))]`. After `max_retries` consecutive failed retries the
/// stream yields the error and ends; a successful read resets the count.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::ReadRetryPolicy;
///
/// let retry = ReadRetryPolicy::default()
///     .initial(Duration::from_millis(50))
///     .max_retries(None); // retry forever
/// assert_eq!(retry.ceiling(3), Duration::from_millis(200));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadRetryPolicy {
    /// The upper end of the first delay. Default 100 ms; at least 1 ms.
    pub initial: Duration,
    /// The cap on every delay. Default 10 s; at least `initial`.
    pub max: Duration,
    /// How many consecutive transient failures are retried; `None` retries forever.
    /// Default `Some(20)`: with the default delays, about 70 s of back-off on average
    /// (at most about 140 s), enough to ride out an Azure SQL failover.
    pub max_retries: Option<u32>,
}

impl Default for ReadRetryPolicy {
    fn default() -> Self {
        ReadRetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_retries: Some(20),
        }
    }
}

impl ReadRetryPolicy {
    setters! {
        /// Sets `initial`, the upper end of the first delay (at least 1 ms).
        initial: Duration;
        /// Sets `max`, the cap on every delay (at least `initial`).
        max: Duration;
        /// Sets `max_retries`; `None` retries forever.
        max_retries: Option<u32>;
    }

    /// The upper end of retry `retry`'s delay (1-based): `min(max, initial × 2^(retry−1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        exponential(self.initial, self.max, retry.saturating_sub(1))
    }

    /// A delay for retry `retry` (1-based), drawn from `[0, ceiling(retry)]` with `rng`.
    pub fn delay_with<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(retry).as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(rng.random_range(0..=ceiling))
    }

    /// A delay for retry `retry` (1-based), drawn from `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, &mut rand::rng())
    }

    /// Whether the `failures`-th consecutive transient failure is still retried.
    pub fn retries(&self, failures: u32) -> bool {
        self.max_retries.is_none_or(|max| failures <= max)
    }
}

/// The settings of a [`FeedReader`] and of [`page_stream`]: [`Default`], then setters.
///
/// ```
/// use std::time::Duration;
/// use changefeed::reader::{FeedReaderOptions, ReadRetryPolicy, Wait};
///
/// let options = FeedReaderOptions::default()
///     .page_size(500)
///     .wait(Wait::LongPoll(Duration::from_secs(20)))
///     .retry(ReadRetryPolicy::default().max_retries(Some(5)));
/// options.validate()?;
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FeedReaderOptions {
    /// Rows per page, 1..=[`MAX_PAGE_SIZE`]. Default 1000.
    pub page_size: u32,
    /// How a caught-up stream waits. Default `Wait::LongPoll(10 s)`.
    pub wait: Wait,
    /// The client back-off (the fallback under `LongPoll`). Default 100 ms to 5 s.
    pub idle_backoff: IdleBackoff,
    /// Retries of transient failures.
    pub retry: ReadRetryPolicy,
    /// How long a connection may stay silent before it is presumed dead: the first
    /// answer of a `read_feed` call must come within the long-poll plus this margin, and
    /// each later part of a page within this margin of the one before (a large
    /// `@with_event` page that keeps arriving is never cut off). A silent connection is
    /// abandoned and discarded, and the read retried as a transient failure. It covers the
    /// network and the work `read_feed` does after its wait, including up to
    /// [`SHARD_LOCK_WAIT`] for the shard's lock. Default 15 s; at least
    /// [`MIN_TIMEOUT_MARGIN`] (12 s).
    pub timeout_margin: Duration,
}

impl Default for FeedReaderOptions {
    fn default() -> Self {
        FeedReaderOptions {
            page_size: 1000,
            wait: Wait::LongPoll(Duration::from_secs(10)),
            idle_backoff: IdleBackoff::default(),
            retry: ReadRetryPolicy::default(),
            timeout_margin: Duration::from_secs(15),
        }
    }
}

impl FeedReaderOptions {
    setters! {
        /// Sets `page_size`, rows per page (1..=[`MAX_PAGE_SIZE`]).
        page_size: u32;
        /// Sets `wait`, how a caught-up stream waits.
        wait: Wait;
        /// Sets `idle_backoff`, the client back-off.
        idle_backoff: IdleBackoff;
        /// Sets `retry`, the retries of transient failures.
        retry: ReadRetryPolicy;
        /// Sets `timeout_margin` (at least [`MIN_TIMEOUT_MARGIN`]).
        timeout_margin: Duration;
    }

    /// Checks the options; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(Error::Config(message));
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return bad(format!(
                "page_size is {}; it must be between 1 and {MAX_PAGE_SIZE}",
                self.page_size
            ));
        }
        if let Wait::LongPoll(wait) = self.wait
            && (wait < Duration::from_millis(1) || wait > MAX_WAIT)
        {
            return bad(format!(
                "the long-poll wait is {wait:?}; it must be between 1 ms and 1 hour (use \
                 Wait::ClientBackoff not to wait on the server)"
            ));
        }
        if self.idle_backoff.min < Duration::from_millis(1)
            || self.idle_backoff.max < self.idle_backoff.min
        {
            return bad(format!(
                "idle_backoff is {:?}; min must be at least 1 ms (0 would poll in a hot loop) \
                 and max at least min",
                self.idle_backoff
            ));
        }
        if self.retry.initial < Duration::from_millis(1) || self.retry.max < self.retry.initial {
            return bad(format!(
                "retry is {:?}; initial must be at least 1 ms and max at least initial",
                self.retry
            ));
        }
        if self.timeout_margin < MIN_TIMEOUT_MARGIN {
            return bad(format!(
                "timeout_margin is {:?}; it must be at least {MIN_TIMEOUT_MARGIN:?}, or a \
                 read_feed call waiting up to {SHARD_LOCK_WAIT:?} for its shard's lock would \
                 be taken for a dead connection",
                self.timeout_margin
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_valid_and_bad_ones_are_named() {
        FeedReaderOptions::default().validate().unwrap();
        let cases = [
            (
                FeedReaderOptions {
                    page_size: 0,
                    ..Default::default()
                },
                "page_size",
            ),
            (
                FeedReaderOptions {
                    page_size: 10_001,
                    ..Default::default()
                },
                "page_size",
            ),
            (
                FeedReaderOptions {
                    wait: Wait::LongPoll(Duration::ZERO),
                    ..Default::default()
                },
                "long-poll",
            ),
            (
                FeedReaderOptions {
                    wait: Wait::LongPoll(MAX_WAIT * 2),
                    ..Default::default()
                },
                "long-poll",
            ),
            (
                FeedReaderOptions {
                    idle_backoff: IdleBackoff {
                        min: Duration::ZERO,
                        max: Duration::from_secs(1),
                    },
                    ..Default::default()
                },
                "idle_backoff",
            ),
            (
                FeedReaderOptions {
                    retry: ReadRetryPolicy {
                        initial: Duration::from_secs(2),
                        max: Duration::from_secs(1),
                        max_retries: None,
                    },
                    ..Default::default()
                },
                "retry",
            ),
            (
                FeedReaderOptions {
                    timeout_margin: Duration::ZERO,
                    ..Default::default()
                },
                "timeout_margin",
            ),
        ];
        for (options, field) in cases {
            let error = options.validate().unwrap_err();
            assert!(error.to_string().contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn the_timeout_margin_covers_the_shard_lock_wait() {
        const { assert!(MIN_TIMEOUT_MARGIN.as_millis() > SHARD_LOCK_WAIT.as_millis()) };
        assert!(FeedReaderOptions::default().timeout_margin >= MIN_TIMEOUT_MARGIN);
        FeedReaderOptions::default()
            .timeout_margin(MIN_TIMEOUT_MARGIN)
            .validate()
            .unwrap();
        for short in [
            Duration::from_secs(1),
            SHARD_LOCK_WAIT,
            MIN_TIMEOUT_MARGIN / 2,
        ] {
            let error = FeedReaderOptions::default()
                .timeout_margin(short)
                .validate()
                .unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("timeout_margin") && message.contains("lock"),
                "{message}"
            );
        }
    }
}
