//! The command line's metrics recorder: keeps what the library records through the
//! `metrics` facade and writes it as Prometheus text (exposition format 0.0.4) for
//! `/metrics`.
//!
//! Our own rather than `metrics-exporter-prometheus`: that crate's `metrics-util` brings a
//! second `rand` and a lock-free map family into the tree, for what is here a few maps
//! behind one mutex touched when a series is first registered (the relay and the exporter
//! hold their handles; updates are atomics).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use changefeed::metrics::{MetricKind, SECONDS_BUCKETS, lookup};
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// A series' labels, in the order they were given.
type Labels = Vec<(String, String)>;

/// What one series holds.
#[derive(Clone)]
enum Series {
    Counter(Arc<AtomicU64>),
    /// The value's bits (`f64::to_bits`), as the facade's `GaugeFn` for `AtomicU64` keeps it.
    Gauge(Arc<AtomicU64>),
    Histogram(Arc<Buckets>),
}

/// A histogram: per bucket the observations up to its bound, plus their sum and count.
struct Buckets {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// The sum's bits, updated by compare-and-swap.
    sum: AtomicU64,
    count: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Buckets {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&bound| value <= bound) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

/// Every series by metric name, and the help texts.
#[derive(Default)]
struct Families {
    series: BTreeMap<String, BTreeMap<Labels, Series>>,
    help: BTreeMap<String, String>,
}

/// The registry behind the recorder; clone it to render while the recorder is installed.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Families>>);

impl Registry {
    fn families(&self) -> std::sync::MutexGuard<'_, Families> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The series of `key`, made by `make` the first time.
    fn series(&self, key: &Key, make: impl FnOnce() -> Series) -> Series {
        let labels: Labels = key
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        let mut families = self.families();
        families
            .series
            .entry(key.name().to_owned())
            .or_default()
            .entry(labels)
            .or_insert_with(make)
            .clone()
    }

    fn describe(&self, name: KeyName, description: SharedString) {
        self.families()
            .help
            .insert(name.as_str().to_owned(), description.into_owned());
    }

    /// The values of gauge `name`, one per series.
    pub fn gauge_values(&self, name: &str) -> Vec<f64> {
        let families = self.families();
        families
            .series
            .get(name)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|series| match series {
                Series::Gauge(bits) => Some(f64::from_bits(bits.load(Ordering::Relaxed))),
                _ => None,
            })
            .collect()
    }

    /// Everything recorded, as Prometheus text: per metric its `# HELP`, `# TYPE` and
    /// series, metrics in name order.
    pub fn render(&self) -> String {
        let families = self.families();
        let mut text = String::new();
        for (name, series) in &families.series {
            let Some(first) = series.values().next() else {
                continue;
            };
            if let Some(help) = families.help.get(name) {
                let _ = writeln!(text, "# HELP {name} {}", escape_help(help));
            }
            let kind = match first {
                Series::Counter(_) => "counter",
                Series::Gauge(_) => "gauge",
                Series::Histogram(_) => "histogram",
            };
            let _ = writeln!(text, "# TYPE {name} {kind}");
            for (labels, series) in series {
                match series {
                    Series::Counter(value) => {
                        let value = value.load(Ordering::Relaxed);
                        let _ = writeln!(text, "{name}{} {value}", label_set(labels, None));
                    }
                    Series::Gauge(bits) => {
                        let value = number(f64::from_bits(bits.load(Ordering::Relaxed)));
                        let _ = writeln!(text, "{name}{} {value}", label_set(labels, None));
                    }
                    Series::Histogram(buckets) => {
                        render_histogram(&mut text, name, labels, buckets)
                    }
                }
            }
        }
        text
    }
}

fn render_histogram(text: &mut String, name: &str, labels: &Labels, buckets: &Buckets) {
    let mut cumulative = 0u64;
    for (bound, count) in buckets.bounds.iter().zip(&buckets.counts) {
        cumulative += count.load(Ordering::Relaxed);
        let le = number(*bound);
        let _ = writeln!(
            text,
            "{name}_bucket{} {cumulative}",
            label_set(labels, Some(&le))
        );
    }
    let count = buckets.count.load(Ordering::Relaxed);
    let _ = writeln!(
        text,
        "{name}_bucket{} {count}",
        label_set(labels, Some("+Inf"))
    );
    let sum = number(f64::from_bits(buckets.sum.load(Ordering::Relaxed)));
    let _ = writeln!(text, "{name}_sum{} {sum}", label_set(labels, None));
    let _ = writeln!(text, "{name}_count{} {count}", label_set(labels, None));
}

/// `{a="1",b="2"}` (with `le` last for a bucket), or nothing for no labels.
fn label_set(labels: &Labels, le: Option<&str>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{}\"", escape_label(value)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A sample value as Prometheus writes it: `NaN`, `+Inf`, `-Inf`, or the shortest decimal.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{value}")
    }
}

/// A label value: backslash, double quote and line feed escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A help text: backslash and line feed escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The recorder over a [`Registry`]; install it with `metrics::set_global_recorder`.
pub struct PrometheusRecorder(pub Registry);

impl Recorder for PrometheusRecorder {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.0.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.0.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.0.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        match self
            .0
            .series(key, || Series::Counter(Arc::new(AtomicU64::new(0))))
        {
            Series::Counter(value) => Counter::from_arc(value),
            // One name, two kinds: a bug of the caller; the second kind records nothing.
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> Gauge {
        match self.0.series(key, || {
            Series::Gauge(Arc::new(AtomicU64::new(0f64.to_bits())))
        }) {
            Series::Gauge(value) => Gauge::from_arc(value),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        // The catalogue's buckets for the library's metrics, durations' for any other.
        let bounds = match lookup(key.name()).map(|metric| metric.kind) {
            Some(MetricKind::Histogram(bounds)) => bounds,
            _ => SECONDS_BUCKETS,
        };
        match self
            .0
            .series(key, || Series::Histogram(Arc::new(Buckets::new(bounds))))
        {
            Series::Histogram(buckets) => Histogram::from_arc(buckets),
            _ => Histogram::noop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_render_as_prometheus_text() {
        let registry = Registry::default();
        let recorder = PrometheusRecorder(registry.clone());
        metrics::with_local_recorder(&recorder, || {
            changefeed::metrics::describe();
            metrics::counter!("changefeed_relay_messages_claimed_total", "outbox" => "dbo.o")
                .increment(3);
            metrics::gauge!("changefeed_relay_batches_in_flight", "outbox" => "a\"b\\c\nd")
                .set(1.5);
            let histogram =
                metrics::histogram!("changefeed_relay_claim_duration_seconds", "outbox" => "x");
            histogram.record(0.003);
            histogram.record(0.2);
            histogram.record(100.0);
        });
        let text = registry.render();
        assert!(text.contains(
            "# TYPE changefeed_relay_messages_claimed_total counter\n\
             changefeed_relay_messages_claimed_total{outbox=\"dbo.o\"} 3\n"
        ));
        assert!(text.contains("# HELP changefeed_relay_messages_claimed_total Messages claimed"));
        assert!(
            text.contains("changefeed_relay_batches_in_flight{outbox=\"a\\\"b\\\\c\\nd\"} 1.5\n"),
            "{text}"
        );
        for line in [
            "changefeed_relay_claim_duration_seconds_bucket{outbox=\"x\",le=\"0.001\"} 0",
            "changefeed_relay_claim_duration_seconds_bucket{outbox=\"x\",le=\"0.005\"} 1",
            "changefeed_relay_claim_duration_seconds_bucket{outbox=\"x\",le=\"0.25\"} 2",
            "changefeed_relay_claim_duration_seconds_bucket{outbox=\"x\",le=\"60\"} 2",
            "changefeed_relay_claim_duration_seconds_bucket{outbox=\"x\",le=\"+Inf\"} 3",
            "changefeed_relay_claim_duration_seconds_sum{outbox=\"x\"} 100.203",
            "changefeed_relay_claim_duration_seconds_count{outbox=\"x\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert_eq!(
            registry.gauge_values("changefeed_relay_batches_in_flight"),
            [1.5]
        );
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(2.0), "2");
    }
}
