//! The relay's settings and their validation.

use std::time::Duration;

use super::policy::RetryPolicy;
use super::publisher::Publisher;
use crate::error::{Error, Result};

/// The largest claim the outbox's `claim` procedure accepts.
pub const MAX_BATCH_SIZE: u32 = 10_000;

/// The longest claim timeout (and poll interval) the relay accepts: 24 hours.
pub const MAX_CLAIM_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The most batches the relay keeps between claim and acknowledgement at once.
pub const MAX_IN_FLIGHT: u32 = 64;

/// How a [`Relay`](super::Relay) claims, waits and retries.
///
/// ```
/// use std::time::Duration;
/// use changefeed::relay::RelayConfig;
///
/// let config = RelayConfig::default()
///     .batch_size(500)
///     .poll_interval(Duration::from_millis(200));
/// config.validate()?;
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Messages per claim, 1..=10000. Default: 100.
    pub batch_size: u32,
    /// When a claim found nothing, how long after it began the relay claims again (a
    /// [`RelayHandle::wake`](super::RelayHandle::wake) ends the sleep early), 1 ms..=24 h.
    /// Default: 500 ms. A claim that waits on the server for work (SQL Server's, by
    /// default 5 s) has usually taken longer, and the next follows at once.
    pub poll_interval: Duration,
    /// How long a claim holds its messages before another claim may take them back (and
    /// count an attempt), 1 ms..=24 h. Default: 30 s. Also the longest the relay waits for
    /// one `publish` call: past it the claim may already belong to another relay, so the
    /// batch is treated as a retriable failure. A batch's dead letters are waited for until
    /// three quarters of it after the claim.
    pub claim_timeout: Duration,
    /// Back-off and the limit on failures. Default: [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// How many batches may be between claim and acknowledgement at once, 1..=64: the
    /// relay claims the next batch while earlier ones are being delivered, and
    /// acknowledges each as its outcomes arrive. Per-aggregate order does not depend on it
    /// (a claimed message's successors are not claimable until it is acknowledged). 1 is
    /// the strict claim, publish, acknowledge, claim rhythm. Default: 4 (measured by
    /// `examples/bench_kafka.rs`'s latency figure: see README's Performance section).
    pub max_in_flight: u32,
}

impl RelayConfig {
    /// The default batch size, 100.
    pub const DEFAULT_BATCH_SIZE: u32 = 100;
    /// The default poll interval, 500 ms.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
    /// The default claim timeout, 30 s.
    pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default number of batches in flight, 4.
    pub const DEFAULT_MAX_IN_FLIGHT: u32 = 4;

    setters! {
        /// Sets `batch_size`, messages per claim (1..=10000).
        batch_size: u32;
        /// Sets `poll_interval`, the sleep after an empty claim.
        poll_interval: Duration;
        /// Sets `claim_timeout`, how long a claim holds its messages.
        claim_timeout: Duration;
        /// Sets `retry`, the back-off and the limit on failures.
        retry: RetryPolicy;
        /// Sets `max_in_flight`, the batches between claim and acknowledgement at once
        /// (1..=64).
        max_in_flight: u32;
    }

    /// Checks every setting; the [`Error::Config`] names the field, the value and the
    /// accepted range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(Error::Config(format!(
                "relay batch_size is {}; it must be between 1 and {MAX_BATCH_SIZE}",
                self.batch_size
            )));
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(Error::Config(format!(
                "relay max_in_flight is {}; it must be between 1 and {MAX_IN_FLIGHT} (1 \
                 publishes one batch at a time)",
                self.max_in_flight
            )));
        }
        check_duration("poll_interval", self.poll_interval)?;
        check_duration("claim_timeout", self.claim_timeout)?;
        self.retry.validate()
    }
}

impl RelayConfig {
    /// Checks that a batch's publish is comfortably inside `claim_timeout`: `publisher`'s
    /// [longest publish with `max_in_flight` batches in flight](Publisher::longest_publish_in_flight)
    /// (the time a call can wait behind the other batches' calls included) is at most three
    /// quarters of it, the last quarter left for the acknowledgement.
    /// [`Relay::new`](super::Relay::new) calls it; call it yourself to refuse settings
    /// before anything connects.
    pub fn check_publisher(&self, publisher: &impl Publisher) -> Result<()> {
        let Some(longest) = publisher.longest_publish_in_flight(self.max_in_flight) else {
            return Ok(());
        };
        let claim_timeout = self.claim_timeout;
        let limit = claim_timeout * 3 / 4;
        if longest <= limit {
            return Ok(());
        }
        let longest = if longest == Duration::MAX {
            "has no time limit".to_owned()
        } else if self.max_in_flight > 1 && publisher.longest_publish() != Some(longest) {
            format!(
                "can take up to {longest:?} with {} batches in flight (its calls may wait for \
                 each other)",
                self.max_in_flight
            )
        } else {
            format!("can take up to {longest:?}")
        };
        let in_flight = if self.max_in_flight > 1 {
            ", or lower max_in_flight"
        } else {
            ""
        };
        Err(Error::Config(format!(
            "the publisher's publish {longest}, more than three quarters of the relay's \
             claim_timeout ({claim_timeout:?}): a publish still running when its claim expires \
             lets another relay publish the same messages and their successors first, and the \
             late copy lands out of order. Raise claim_timeout{in_flight}, or shorten the \
             publisher's time-out so a publish fits in {limit:?} (KafkaPublisher: -X \
             message.timeout.ms, or its alias delivery.timeout.ms, not 0; a publish takes up \
             to twice it plus 1 s)"
        )))
    }
}

fn check_duration(field: &str, value: Duration) -> Result<()> {
    if value < Duration::from_millis(1) || value > MAX_CLAIM_TIMEOUT {
        return Err(Error::Config(format!(
            "relay {field} is {value:?}; it must be between 1 ms and 24 h"
        )));
    }
    Ok(())
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: Self::DEFAULT_BATCH_SIZE,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
            claim_timeout: Self::DEFAULT_CLAIM_TIMEOUT,
            retry: RetryPolicy::default(),
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(config: RelayConfig) -> String {
        match config.validate() {
            Err(Error::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_documented() {
        let c = RelayConfig::default();
        assert_eq!(c.batch_size, 100);
        assert_eq!(c.poll_interval, Duration::from_millis(500));
        assert_eq!(c.claim_timeout, Duration::from_secs(30));
        assert_eq!(c.retry, RetryPolicy::default());
        assert_eq!(c.max_in_flight, 4);
        c.validate().unwrap();
    }

    #[test]
    fn max_in_flight_bounds() {
        for ok in [1, 4, MAX_IN_FLIGHT] {
            RelayConfig::default().max_in_flight(ok).validate().unwrap();
        }
        for bad in [0, MAX_IN_FLIGHT + 1] {
            let message = config_error(RelayConfig::default().max_in_flight(bad));
            assert!(message.contains("max_in_flight"), "{message}");
            assert!(message.contains("between 1 and 64"), "{message}");
        }
    }

    #[test]
    fn batch_size_bounds() {
        for ok in [1, 100, 10_000] {
            RelayConfig {
                batch_size: ok,
                ..RelayConfig::default()
            }
            .validate()
            .unwrap();
        }
        for bad in [0, 10_001, u32::MAX] {
            let message = config_error(RelayConfig {
                batch_size: bad,
                ..RelayConfig::default()
            });
            assert!(message.contains("batch_size"), "{message}");
            assert!(message.contains("10000"), "{message}");
        }
    }

    #[test]
    fn claim_timeout_bounds() {
        for ok in [Duration::from_millis(1), MAX_CLAIM_TIMEOUT] {
            RelayConfig {
                claim_timeout: ok,
                ..RelayConfig::default()
            }
            .validate()
            .unwrap();
        }
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            MAX_CLAIM_TIMEOUT + Duration::from_millis(1),
        ] {
            let message = config_error(RelayConfig {
                claim_timeout: bad,
                ..RelayConfig::default()
            });
            assert!(message.contains("claim_timeout"), "{message}");
        }
    }

    #[test]
    fn poll_interval_bounds() {
        let message = config_error(RelayConfig {
            poll_interval: Duration::ZERO,
            ..RelayConfig::default()
        });
        assert!(message.contains("poll_interval"), "{message}");
    }

    #[test]
    fn retry_policy_is_validated_too() {
        let message = config_error(RelayConfig {
            retry: RetryPolicy {
                max_attempts: 0,
                ..RetryPolicy::default()
            },
            ..RelayConfig::default()
        });
        assert!(message.contains("max_attempts"), "{message}");
    }
}
