//! The harness' statistics: percentiles, mean, throughput and ratios.
//!
//! Percentiles use the **nearest-rank** method: the p-th percentile of n sorted samples is
//! the sample of rank `ceil(p / 100 × n)` (1-based, at least 1). It always returns one of
//! the samples (never an interpolated value), so a p99 latency is a latency some event
//! really had. For the samples 1, 2, …, 100 it gives p50 = 50, p95 = 95, p99 = 99.
//!
//! Every function that could divide by zero or summarize nothing returns `None` instead:
//! an empty sample, a zero elapsed time, a zero baseline. NaN samples are ignored.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The samples without NaNs, sorted ascending.
pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The nearest-rank `p`-th percentile of samples already sorted ascending (see
/// [`sorted`]). `None` for no samples or a `p` outside `(0, 100]`.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || p.is_nan() || p <= 0.0 || p > 100.0 {
        return None;
    }
    let n = sorted.len();
    // p × n / 100 is exact for a whole p (a quotient that is an integer is exact in
    // floating point); the tiny relative margin keeps a fractional p whose product lands
    // a rounding error above an integer from skipping to the next rank.
    let exact = p * n as f64 / 100.0;
    let rank = (exact - exact * 1e-12).ceil().max(1.0) as usize;
    Some(sorted[rank.min(n) - 1])
}

/// The nearest-rank `p`-th percentile of samples in any order.
#[allow(dead_code)] // The harness summarizes with `Summary`; tests/bench_stats.rs uses this.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    percentile_sorted(&sorted(samples), p)
}

/// The arithmetic mean; `None` for no samples.
pub fn mean(samples: &[f64]) -> Option<f64> {
    let values: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// `count / elapsed` per second; `None` when no time elapsed.
pub fn throughput(count: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        Some(count as f64 / seconds)
    } else {
        None
    }
}

/// `value / baseline`; `None` when the baseline is zero or either is not a finite number.
pub fn ratio(value: f64, baseline: f64) -> Option<f64> {
    if !value.is_finite() || !baseline.is_finite() || baseline == 0.0 {
        None
    } else {
        Some(value / baseline)
    }
}

/// [`ratio`] of two figures that may be missing.
pub fn ratio_of(value: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    ratio(value?, baseline?)
}

/// A duration in milliseconds, with fractions.
pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Latencies in milliseconds from `start[key]` to each `(key, end)` of `ends`, and how
/// many ends had no start. An end before its start counts as zero: figure 4's consumer can
/// see an event a moment before its writer's commit call returns.
pub fn delays_ms<K: Eq + Hash>(
    starts: &HashMap<K, Instant>,
    ends: &[(K, Instant)],
) -> (Vec<f64>, usize) {
    let mut delays = Vec::with_capacity(ends.len());
    let mut unmatched = 0;
    for (key, end) in ends {
        match starts.get(key) {
            Some(start) => delays.push(millis(end.saturating_duration_since(*start))),
            None => unmatched += 1,
        }
    }
    (delays, unmatched)
}

/// Count, extremes, mean and the nearest-rank p50, p95 and p99 of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Samples summarized (NaNs excluded).
    pub count: usize,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
    /// The median (nearest rank).
    pub p50: f64,
    /// The 95th percentile (nearest rank).
    pub p95: f64,
    /// The 99th percentile (nearest rank).
    pub p99: f64,
}

impl Summary {
    /// Summarizes samples in any order; `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let sorted = sorted(samples);
        Some(Summary {
            count: sorted.len(),
            min: *sorted.first()?,
            max: *sorted.last()?,
            mean: mean(&sorted)?,
            p50: percentile_sorted(&sorted, 50.0)?,
            p95: percentile_sorted(&sorted, 95.0)?,
            p99: percentile_sorted(&sorted, 99.0)?,
        })
    }

    /// Summarizes durations, in milliseconds.
    pub fn of_durations(durations: &[Duration]) -> Option<Summary> {
        let ms: Vec<f64> = durations.iter().copied().map(millis).collect();
        Summary::of(&ms)
    }
}
