//! How long a message waits before its next try, and when the relay gives up on it.

use std::time::Duration;

use rand::{Rng, RngExt};

use crate::error::{Error, Result};

/// The longest delay a policy may ask for: 24 hours keeps every delay, in milliseconds,
/// inside a 32-bit `int` on the server, and a message that has waited a day longer than
/// that needs an operator, not another retry.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Exponential back-off, capped, with full jitter, and a limit on failures.
///
/// The `n`-th failure of a message (n = 1 for the first) waits a delay drawn uniformly
/// from `[0, min(max, initial × multiplier^(n−1))]` ("full jitter"; with `jitter: false`,
/// exactly the upper end). When a failure brings a message's attempts to `max_attempts`,
/// the message is marked dead instead.
///
/// Full jitter is the default because many relays retrying a broker that just came back
/// at the same instants would knock it over again; spreading the retries over the whole
/// window avoids that at the cost of sometimes retrying early.
///
/// ```
/// use std::time::Duration;
/// use changefeed::relay::{RetryDecision, RetryPolicy};
///
/// let policy = RetryPolicy::default().jitter(false);
/// let mut rng = rand::rng();
/// assert_eq!(policy.next_delay(1, &mut rng), RetryDecision::RetryAfter(Duration::from_secs(1)));
/// assert_eq!(policy.next_delay(4, &mut rng), RetryDecision::RetryAfter(Duration::from_secs(8)));
/// assert_eq!(policy.next_delay(10, &mut rng), RetryDecision::Dead);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The upper end of the first delay. Default: 1 s. At least 1 ms.
    pub initial: Duration,
    /// The cap on every delay. Default: 5 min. At least `initial`, at most
    /// [`MAX_RETRY_DELAY`].
    pub max: Duration,
    /// The factor each failure multiplies the delay by. Default: 2. Finite and at least 1
    /// (1 gives a constant delay).
    pub multiplier: f64,
    /// The failure that brings a message's attempts to this number makes it dead.
    /// Default: 10. At least 1 (1 = never retry).
    pub max_attempts: u32,
    /// Whether to draw the delay at random below its upper end (full jitter). Default: true.
    pub jitter: bool,
}

/// What to do with a message after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Mark it failed, due again after this delay.
    RetryAfter(Duration),
    /// It has failed `max_attempts` times: mark it dead.
    Dead,
}

impl RetryPolicy {
    /// The default first delay, 1 s.
    pub const DEFAULT_INITIAL: Duration = Duration::from_secs(1);
    /// The default cap, 5 min.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(5 * 60);
    /// The default multiplier, 2.
    pub const DEFAULT_MULTIPLIER: f64 = 2.0;
    /// The default number of failures before a message is dead, 10.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

    setters! {
        /// Sets `initial`, the upper end of the first delay.
        initial: Duration;
        /// Sets `max`, the cap on every delay.
        max: Duration;
        /// Sets `multiplier`, the factor of each failure.
        multiplier: f64;
        /// Sets `max_attempts`, the failures that make a message dead.
        max_attempts: u32;
        /// Sets `jitter`, whether delays are drawn at random (full jitter).
        jitter: bool;
    }

    /// Checks the policy; the error names the field, the value and what to use instead.
    pub fn validate(&self) -> Result<()> {
        if self.initial < Duration::from_millis(1) {
            return Err(Error::Config(format!(
                "retry.initial is {:?}; it must be at least 1 ms (the outbox keeps retry \
                 times in milliseconds, and 0 would retry a failing message in a hot loop)",
                self.initial
            )));
        }
        if self.max < self.initial {
            return Err(Error::Config(format!(
                "retry.max ({:?}) is less than retry.initial ({:?}); raise max or lower initial",
                self.max, self.initial
            )));
        }
        if self.max > MAX_RETRY_DELAY {
            return Err(Error::Config(format!(
                "retry.max is {:?}; it must be at most 24 h",
                self.max
            )));
        }
        if !self.multiplier.is_finite() || self.multiplier < 1.0 {
            return Err(Error::Config(format!(
                "retry.multiplier is {}; it must be a finite number of at least 1.0 \
                 (2.0 doubles each delay, 1.0 keeps it constant)",
                self.multiplier
            )));
        }
        if self.max_attempts == 0 {
            return Err(Error::Config(
                "retry.max_attempts is 0; it must be at least 1 (1 marks a message dead on \
                 its first failure)"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The upper end of the delay after a message's `attempts`-th failure:
    /// `min(max, initial × multiplier^(attempts − 1))`; `attempts` 0 is treated as 1.
    pub fn ceiling(&self, attempts: u32) -> Duration {
        let exponent = f64::from(attempts.saturating_sub(1));
        // Nanoseconds in f64 are exact for every power-of-two multiple of a whole number
        // of milliseconds below the cap, so `jitter: false` gives exact delays.
        let nanos = self.initial.as_nanos() as f64 * self.multiplier.powf(exponent);
        let cap = self.max.as_nanos() as f64;
        // An overflowing product is infinite, which the comparison caps too.
        if nanos.is_nan() || nanos >= cap {
            return self.max;
        }
        Duration::from_nanos(nanos.round() as u64)
    }

    /// The delay after a message's `attempts`-th failure, ignoring `max_attempts`: the
    /// [`ceiling`](Self::ceiling), or a uniform draw from `[0, ceiling]` with jitter.
    pub fn backoff<R: Rng + ?Sized>(&self, attempts: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(attempts);
        if !self.jitter {
            return ceiling;
        }
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.random_range(0..=nanos))
    }

    /// What to do after a failure that brings a message's attempts to
    /// `attempts_after_this_failure`: dead when that reaches `max_attempts`, else retry
    /// after [`backoff`](Self::backoff).
    pub fn next_delay<R: Rng + ?Sized>(
        &self,
        attempts_after_this_failure: u32,
        rng: &mut R,
    ) -> RetryDecision {
        if attempts_after_this_failure >= self.max_attempts {
            RetryDecision::Dead
        } else {
            RetryDecision::RetryAfter(self.backoff(attempts_after_this_failure, rng))
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Self::DEFAULT_INITIAL,
            max: Self::DEFAULT_MAX,
            multiplier: Self::DEFAULT_MULTIPLIER,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            jitter: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn exact() -> RetryPolicy {
        RetryPolicy {
            jitter: false,
            ..RetryPolicy::default()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = RetryPolicy::default();
        assert_eq!(p.initial, Duration::from_secs(1));
        assert_eq!(p.max, Duration::from_secs(300));
        assert_eq!(p.multiplier, 2.0);
        assert_eq!(p.max_attempts, 10);
        assert!(p.jitter);
        p.validate().unwrap();
    }

    #[test]
    fn no_jitter_is_exact_exponential() {
        let p = exact();
        let mut rng = StdRng::seed_from_u64(1);
        let delays: Vec<_> = (1..=6).map(|n| p.backoff(n, &mut rng)).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16, 32].map(Duration::from_secs).to_vec()
        );
        let p = RetryPolicy {
            initial: ms(100),
            multiplier: 3.0,
            ..exact()
        };
        assert_eq!(p.backoff(1, &mut rng), ms(100));
        assert_eq!(p.backoff(2, &mut rng), ms(300));
        assert_eq!(p.backoff(3, &mut rng), ms(900));
    }

    #[test]
    fn attempts_zero_is_treated_as_the_first_failure() {
        assert_eq!(exact().ceiling(0), Duration::from_secs(1));
    }

    #[test]
    fn cap_is_respected_even_for_huge_attempts() {
        let p = exact();
        assert_eq!(p.ceiling(9), Duration::from_secs(256));
        assert_eq!(p.ceiling(10), Duration::from_secs(300));
        assert_eq!(p.ceiling(5000), Duration::from_secs(300));
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(300));
        let p = RetryPolicy {
            multiplier: 1e300,
            ..exact()
        };
        assert_eq!(p.ceiling(3), p.max);
    }

    #[test]
    fn multiplier_one_is_constant() {
        let p = RetryPolicy {
            multiplier: 1.0,
            ..exact()
        };
        assert!((1..50).all(|n| p.ceiling(n) == p.initial));
    }

    #[test]
    fn jittered_delays_stay_within_bounds_and_spread() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        for attempts in 1..=12 {
            let ceiling = p.ceiling(attempts);
            let draws: Vec<_> = (0..200).map(|_| p.backoff(attempts, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= ceiling), "attempt {attempts}");
            // Full jitter: draws cover the low half of the window too, not just the top.
            assert!(draws.iter().any(|d| *d < ceiling / 2), "attempt {attempts}");
            assert!(draws.iter().any(|d| *d > ceiling / 2), "attempt {attempts}");
        }
    }

    #[test]
    fn reaching_max_attempts_is_dead() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..exact()
        };
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(
            p.next_delay(1, &mut rng),
            RetryDecision::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(
            p.next_delay(2, &mut rng),
            RetryDecision::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(p.next_delay(3, &mut rng), RetryDecision::Dead);
        assert_eq!(p.next_delay(4, &mut rng), RetryDecision::Dead);
        let once = RetryPolicy {
            max_attempts: 1,
            ..exact()
        };
        assert_eq!(once.next_delay(1, &mut rng), RetryDecision::Dead);
    }

    #[test]
    fn invalid_policies_are_config_errors_naming_the_field() {
        let cases = [
            (
                RetryPolicy {
                    initial: Duration::ZERO,
                    ..exact()
                },
                "retry.initial",
            ),
            (
                RetryPolicy {
                    max: ms(10),
                    ..exact()
                },
                "retry.max",
            ),
            (
                RetryPolicy {
                    max: Duration::from_secs(25 * 3600),
                    ..exact()
                },
                "retry.max",
            ),
            (
                RetryPolicy {
                    multiplier: 0.5,
                    ..exact()
                },
                "retry.multiplier",
            ),
            (
                RetryPolicy {
                    multiplier: f64::NAN,
                    ..exact()
                },
                "retry.multiplier",
            ),
            (
                RetryPolicy {
                    multiplier: f64::INFINITY,
                    ..exact()
                },
                "retry.multiplier",
            ),
            (
                RetryPolicy {
                    max_attempts: 0,
                    ..exact()
                },
                "retry.max_attempts",
            ),
        ];
        for (policy, field) in cases {
            match policy.validate() {
                Err(Error::Config(message)) => assert!(message.contains(field), "{message}"),
                other => panic!("{policy:?}: expected a config error, got {other:?}"),
            }
        }
    }
}
