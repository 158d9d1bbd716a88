//! What the relay, the exporter, the stores and the wakers measure, recorded through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! The library never keeps a registry of its own: every value goes to the recorder the
//! host application installed (`metrics::set_global_recorder`, or an exporter crate that
//! does it, e.g. `metrics-exporter-prometheus`), and with none installed every call is a
//! no-op costing an atomic load. The `changefeed` command line installs its own recorder
//! and serves it as Prometheus text (`--metrics-addr`).
//!
//! **Install the recorder before building a [`Relay`](crate::relay::Relay) or running a
//! [`FeedExporter`](crate::kafka::FeedExporter)**: they take their handles once, when they
//! start, and handles taken before a recorder exists stay no-ops.
//!
//! [`CATALOGUE`] lists every metric with its kind, unit, labels and help text
//! (docs/operating.md, "Metrics", is the same list with the alert each supports);
//! [`describe`] hands the help texts to the installed recorder. Names and labels follow
//! Prometheus' conventions (`changefeed_` prefix, `_total` counters, base units
//! `_seconds`), and no label carries a value that grows with the messages: labels are the
//! outbox, feed, shard and topic (which the operator's configuration bounds; the relay
//! folds topics past [`MAX_TOPICS`] into [`OTHER_TOPIC`]) and fixed sets of words
//! (`error_class`, `status`, `result`, ...).

#[cfg(feature = "kafka")]
mod export;
mod relay;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[cfg(feature = "kafka")]
pub(crate) use export::ExportMetrics;
pub(crate) use relay::RelayMetrics;

use crate::outbox::OutboxBacklog;

/// What kind of series a metric is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MetricKind {
    /// Only goes up (Prometheus counter); the name ends in `_total`.
    Counter,
    /// A value at one moment (Prometheus gauge).
    Gauge,
    /// A distribution, observed into these bucket upper bounds (Prometheus histogram).
    Histogram(&'static [f64]),
}

/// One metric: its name, kind, labels and what it means.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metric {
    /// The metric's name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its label names (every series carries all of them).
    pub labels: &'static [&'static str],
    /// What it measures (the Prometheus `# HELP` text).
    pub help: &'static str,
}

/// Bucket bounds for durations of database and broker calls, in seconds: 1 ms to 1 min.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Bucket bounds for batch sizes, in messages: 1 to the largest claim (10 000).
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// The most topics one relay labels on its own: the topics of messages past this many
/// distinct ones share the label value [`OTHER_TOPIC`], so an application that writes a
/// topic per entity cannot make the series count grow with its messages.
pub const MAX_TOPICS: usize = 256;

/// The `topic` label of messages past [`MAX_TOPICS`], and of undecodable rows whose topic
/// could not be read.
pub const OTHER_TOPIC: &str = "_other";

/// Messages claimed (every row of a claim, decodable or not).
pub const RELAY_CLAIMED: &str = "changefeed_relay_messages_claimed_total";
/// Messages published and marked done.
pub const RELAY_PUBLISHED: &str = "changefeed_relay_messages_published_total";
/// Messages marked failed, to be retried.
pub const RELAY_FAILED: &str = "changefeed_relay_messages_failed_total";
/// Messages marked dead.
pub const RELAY_DEAD: &str = "changefeed_relay_messages_dead_total";
/// Dead letters that were not written.
pub const RELAY_DEAD_LETTERS_FAILED: &str = "changefeed_relay_dead_letters_failed_total";
/// Messages handed back without an attempt counted.
pub const RELAY_REQUEUED: &str = "changefeed_relay_messages_requeued_total";
/// Acknowledgements fenced off because the claim had expired.
pub const RELAY_CLAIMS_LOST: &str = "changefeed_relay_messages_claim_lost_total";
/// Claims made, by result.
pub const RELAY_CLAIMS: &str = "changefeed_relay_claims_total";
/// Messages per non-empty claim.
pub const RELAY_BATCH_SIZE: &str = "changefeed_relay_batch_messages";
/// How long a claim call took.
pub const RELAY_CLAIM_SECONDS: &str = "changefeed_relay_claim_duration_seconds";
/// How long a batch's publish took.
pub const RELAY_PUBLISH_SECONDS: &str = "changefeed_relay_publish_duration_seconds";
/// How long one acknowledgement took, retries included.
pub const RELAY_ACK_SECONDS: &str = "changefeed_relay_acknowledge_duration_seconds";
/// Batches claimed and not yet acknowledged.
pub const RELAY_IN_FLIGHT: &str = "changefeed_relay_batches_in_flight";
/// When the last claim succeeded.
pub const RELAY_LAST_CLAIM: &str = "changefeed_relay_last_claim_timestamp_seconds";
/// Store and publisher errors outside a single message.
pub const RELAY_LOOP_ERRORS: &str = "changefeed_relay_loop_errors_total";
/// Database connections a store opened.
pub const STORE_CONNECTIONS: &str = "changefeed_store_connections_total";
/// Whether the wake follows its database (1) or the relay polls (0).
pub const WAKE_FOLLOWING: &str = "changefeed_wake_following";
/// Times the wake (re)started following.
pub const WAKE_CONNECTIONS: &str = "changefeed_wake_connections_total";
/// The outbox's messages by status.
pub const OUTBOX_MESSAGES: &str = "changefeed_outbox_messages";
/// Age of the oldest open message.
pub const OUTBOX_OLDEST_OPEN_AGE: &str = "changefeed_outbox_oldest_open_age_seconds";
/// When the backlog was last read.
pub const OUTBOX_BACKLOG_READ: &str = "changefeed_outbox_backlog_timestamp_seconds";
/// Backlog reads that failed.
pub const OUTBOX_BACKLOG_ERRORS: &str = "changefeed_outbox_backlog_errors_total";
/// Events exported.
pub const EXPORT_EVENTS: &str = "changefeed_export_events_total";
/// Events skipped because their row was deleted before it was read.
pub const EXPORT_SKIPPED: &str = "changefeed_export_events_skipped_total";
/// Pages exported (cursor saved).
pub const EXPORT_PAGES: &str = "changefeed_export_pages_total";
/// Events produced again after a failed delivery.
pub const EXPORT_RETRIES: &str = "changefeed_export_events_retried_total";
/// How long a page's produce took, until every message was acknowledged.
pub const EXPORT_PRODUCE_SECONDS: &str = "changefeed_export_produce_duration_seconds";
/// Page reads, by result.
pub const EXPORT_READS: &str = "changefeed_export_reads_total";
/// How far behind the feed's head a shard is.
pub const EXPORT_LAG: &str = "changefeed_export_lag_seconds";
/// The ULID time of a shard's last exported event.
pub const EXPORT_LAST_EVENT: &str = "changefeed_export_last_event_timestamp_seconds";
/// When a shard's last read succeeded.
pub const EXPORT_LAST_READ: &str = "changefeed_export_last_read_timestamp_seconds";
/// Whether the process is ready (the command line's `/readyz`).
pub const READY: &str = "changefeed_ready";

const OUTBOX: &[&str] = &["outbox"];
const OUTBOX_TOPIC: &[&str] = &["outbox", "topic"];
const OUTBOX_TOPIC_CLASS: &[&str] = &["outbox", "topic", "error_class"];
const FEED: &[&str] = &["feed"];
const FEED_SHARD: &[&str] = &["feed", "shard"];

/// Every metric the library and the command line record.
pub const CATALOGUE: &[Metric] = &[
    Metric {
        name: RELAY_CLAIMED,
        kind: MetricKind::Counter,
        labels: OUTBOX,
        help: "Messages claimed by the relay (every row of a claim, decodable or not).",
    },
    Metric {
        name: RELAY_PUBLISHED,
        kind: MetricKind::Counter,
        labels: OUTBOX_TOPIC,
        help: "Messages the publisher accepted, marked done.",
    },
    Metric {
        name: RELAY_FAILED,
        kind: MetricKind::Counter,
        labels: OUTBOX_TOPIC_CLASS,
        help: "Messages whose publish failed, marked failed to be retried later.",
    },
    Metric {
        name: RELAY_DEAD,
        kind: MetricKind::Counter,
        labels: OUTBOX_TOPIC_CLASS,
        help: "Messages marked dead: poison, undecodable, or out of attempts.",
    },
    Metric {
        name: RELAY_DEAD_LETTERS_FAILED,
        kind: MetricKind::Counter,
        labels: OUTBOX_TOPIC_CLASS,
        help: "Dead letters not written (refused, failed, or not confirmed within the claim): \
               the row is dead in the outbox, its last_error names both errors; topic is the \
               message's own, error_class the dead letter's.",
    },
    Metric {
        name: RELAY_REQUEUED,
        kind: MetricKind::Counter,
        labels: OUTBOX_TOPIC_CLASS,
        help: "Messages handed back without an attempt counted (backpressure, or a fatal \
               publisher error).",
    },
    Metric {
        name: RELAY_CLAIMS_LOST,
        kind: MetricKind::Counter,
        labels: OUTBOX,
        help: "Acknowledgements that changed nothing because the claim had expired; those \
               messages are published again.",
    },
    Metric {
        name: RELAY_CLAIMS,
        kind: MetricKind::Counter,
        labels: &["outbox", "result"],
        help: "Claim calls, by result (ok, error); an empty claim is ok.",
    },
    Metric {
        name: RELAY_BATCH_SIZE,
        kind: MetricKind::Histogram(BATCH_BUCKETS),
        labels: OUTBOX,
        help: "Messages per claim that returned any.",
    },
    Metric {
        name: RELAY_CLAIM_SECONDS,
        kind: MetricKind::Histogram(SECONDS_BUCKETS),
        labels: OUTBOX,
        help: "Duration of claim calls, failed ones included.",
    },
    Metric {
        name: RELAY_PUBLISH_SECONDS,
        kind: MetricKind::Histogram(SECONDS_BUCKETS),
        labels: OUTBOX,
        help: "Duration of a batch's publish, until every message's outcome is known.",
    },
    Metric {
        name: RELAY_ACK_SECONDS,
        kind: MetricKind::Histogram(SECONDS_BUCKETS),
        labels: &["outbox", "operation"],
        help: "Duration of an acknowledgement (mark_done, mark_failed, requeue), its \
               retries included.",
    },
    Metric {
        name: RELAY_IN_FLIGHT,
        kind: MetricKind::Gauge,
        labels: OUTBOX,
        help: "Batches claimed and not yet fully acknowledged.",
    },
    Metric {
        name: RELAY_LAST_CLAIM,
        kind: MetricKind::Gauge,
        labels: OUTBOX,
        help: "Unix time of the last claim call that succeeded (empty or not).",
    },
    Metric {
        name: RELAY_LOOP_ERRORS,
        kind: MetricKind::Counter,
        labels: OUTBOX,
        help: "Errors outside a single message: failed store calls (retried) and publisher \
               faults (panic, timeout, wrong number of outcomes).",
    },
    Metric {
        name: STORE_CONNECTIONS,
        kind: MetricKind::Counter,
        labels: &["outbox", "store"],
        help: "Database connections the relay's store opened; more than one means it \
               reconnected after a failure.",
    },
    Metric {
        name: WAKE_FOLLOWING,
        kind: MetricKind::Gauge,
        labels: &["outbox", "wake"],
        help: "1 while the wake follows the database (binlog, notify), 0 while the relay \
               falls back to polling.",
    },
    Metric {
        name: WAKE_CONNECTIONS,
        kind: MetricKind::Counter,
        labels: &["outbox", "wake"],
        help: "Times the wake connected and started following; more than one means it \
               reconnected.",
    },
    Metric {
        name: OUTBOX_MESSAGES,
        kind: MetricKind::Gauge,
        labels: &["outbox", "status"],
        help: "Messages in the outbox by status (pending, processing, failed, dead), as \
               last read; each count stops at 100000.",
    },
    Metric {
        name: OUTBOX_OLDEST_OPEN_AGE,
        kind: MetricKind::Gauge,
        labels: OUTBOX,
        help: "Age of the oldest message neither published nor dead, as last read; 0 when \
               there is none.",
    },
    Metric {
        name: OUTBOX_BACKLOG_READ,
        kind: MetricKind::Gauge,
        labels: OUTBOX,
        help: "Unix time the backlog gauges were last read.",
    },
    Metric {
        name: OUTBOX_BACKLOG_ERRORS,
        kind: MetricKind::Counter,
        labels: OUTBOX,
        help: "Backlog reads that failed.",
    },
    Metric {
        name: EXPORT_EVENTS,
        kind: MetricKind::Counter,
        labels: FEED,
        help: "Events produced, acknowledged and their cursor saved.",
    },
    Metric {
        name: EXPORT_SKIPPED,
        kind: MetricKind::Counter,
        labels: FEED,
        help: "Events skipped because their row was deleted before it was read.",
    },
    Metric {
        name: EXPORT_PAGES,
        kind: MetricKind::Counter,
        labels: FEED,
        help: "Pages exported and their cursor saved.",
    },
    Metric {
        name: EXPORT_RETRIES,
        kind: MetricKind::Counter,
        labels: FEED,
        help: "Events produced again after a failed delivery.",
    },
    Metric {
        name: EXPORT_PRODUCE_SECONDS,
        kind: MetricKind::Histogram(SECONDS_BUCKETS),
        labels: FEED,
        help: "Duration of a page's produce, until every message is acknowledged.",
    },
    Metric {
        name: EXPORT_READS,
        kind: MetricKind::Counter,
        labels: &["feed", "result"],
        help: "read_feed calls, by result (ok, error); a long-poll that found nothing is ok.",
    },
    Metric {
        name: EXPORT_LAG,
        kind: MetricKind::Gauge,
        labels: FEED_SHARD,
        help: "How far the shard's last exported page is behind now, when that page was \
               full (more waits); 0 when the shard is caught up.",
    },
    Metric {
        name: EXPORT_LAST_EVENT,
        kind: MetricKind::Gauge,
        labels: FEED_SHARD,
        help: "Unix time of the shard's last exported event (its ULID's time).",
    },
    Metric {
        name: EXPORT_LAST_READ,
        kind: MetricKind::Gauge,
        labels: FEED_SHARD,
        help: "Unix time of the shard's last read_feed call that succeeded.",
    },
    Metric {
        name: READY,
        kind: MetricKind::Gauge,
        labels: &[],
        help: "1 when the process is ready (what /readyz answers), else 0.",
    },
];

/// The catalogue's entry for `name`.
pub fn lookup(name: &str) -> Option<&'static Metric> {
    CATALOGUE.iter().find(|metric| metric.name == name)
}

/// Hands every metric's help text and unit to the installed recorder. Call it once, after
/// installing the recorder.
pub fn describe() {
    for metric in CATALOGUE {
        let unit = metric
            .name
            .ends_with("_seconds")
            .then_some(::metrics::Unit::Seconds);
        match metric.kind {
            MetricKind::Counter => ::metrics::with_recorder(|recorder| {
                recorder.describe_counter(metric.name.into(), unit, metric.help.into())
            }),
            MetricKind::Gauge => ::metrics::with_recorder(|recorder| {
                recorder.describe_gauge(metric.name.into(), unit, metric.help.into())
            }),
            MetricKind::Histogram(_) => ::metrics::with_recorder(|recorder| {
                recorder.describe_histogram(metric.name.into(), unit, metric.help.into())
            }),
        }
    }
}

/// Records an outbox's backlog (a store's `backlog` call) as the `changefeed_outbox_*`
/// gauges of `outbox`.
pub fn record_backlog(outbox: &str, backlog: &OutboxBacklog) {
    for (status, count) in [
        ("pending", backlog.pending),
        ("processing", backlog.processing),
        ("failed", backlog.failed),
        ("dead", backlog.dead),
    ] {
        ::metrics::gauge!(OUTBOX_MESSAGES, "outbox" => outbox.to_owned(), "status" => status)
            .set(count as f64);
    }
    ::metrics::gauge!(OUTBOX_OLDEST_OPEN_AGE, "outbox" => outbox.to_owned())
        .set(backlog.oldest_open_age.unwrap_or_default().as_secs_f64());
    ::metrics::gauge!(OUTBOX_BACKLOG_READ, "outbox" => outbox.to_owned()).set(unix_now());
}

/// Counts a backlog read of `outbox` that failed (the gauges keep their last values; the
/// timestamp gauge says how old they are).
pub fn record_backlog_error(outbox: &str) {
    ::metrics::counter!(OUTBOX_BACKLOG_ERRORS, "outbox" => outbox.to_owned()).increment(1);
}

/// A store of `outbox` opened a database connection (`store`: `sqlserver`, `mysql`,
/// `postgres`).
pub(crate) fn store_connected(outbox: &str, store: &'static str) {
    ::metrics::counter!(STORE_CONNECTIONS, "outbox" => outbox.to_owned(), "store" => store)
        .increment(1);
}

#[cfg(any(feature = "mysql", feature = "postgres"))]
/// The wake of `outbox` (`binlog`, `notify`) started following its database (`true`: also
/// counts a connection) or fell back to polling (`false`).
pub(crate) fn wake_following(outbox: &str, wake: &'static str, following: bool) {
    ::metrics::gauge!(WAKE_FOLLOWING, "outbox" => outbox.to_owned(), "wake" => wake)
        .set(if following { 1.0 } else { 0.0 });
    if following {
        ::metrics::counter!(WAKE_CONNECTIONS, "outbox" => outbox.to_owned(), "wake" => wake)
            .increment(1);
    }
}

/// Now as Unix seconds (with milliseconds), for the `_timestamp_seconds` gauges.
fn unix_now() -> f64 {
    unix_seconds(SystemTime::now())
}

/// `time` as Unix seconds; 0 before 1970.
fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// A call under way: records its duration into a histogram when dropped, so that a call
/// whose future is dropped half-way (shutdown) is measured too.
pub(crate) struct Timer {
    histogram: ::metrics::Histogram,
    started: Instant,
}

impl Timer {
    fn start(histogram: &::metrics::Histogram) -> Self {
        Timer {
            histogram: histogram.clone(),
            started: Instant::now(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.histogram.record(self.started.elapsed().as_secs_f64());
    }
}
