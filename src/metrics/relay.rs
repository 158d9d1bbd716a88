//! The relay's metrics: handles taken once per relay, and per-topic counters kept in a
//! bounded cache.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, SharedString};

use super::{
    MAX_TOPICS, OTHER_TOPIC, RELAY_ACK_SECONDS, RELAY_BATCH_SIZE, RELAY_CLAIM_SECONDS,
    RELAY_CLAIMED, RELAY_CLAIMS, RELAY_CLAIMS_LOST, RELAY_DEAD, RELAY_DEAD_LETTERS_FAILED,
    RELAY_FAILED, RELAY_IN_FLIGHT, RELAY_LAST_CLAIM, RELAY_LOOP_ERRORS, RELAY_PUBLISH_SECONDS,
    RELAY_PUBLISHED, RELAY_REQUEUED, Timer, unix_now,
};

/// What happened to a message, for the per-topic counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Published,
    Failed,
    Dead,
    DeadLetterFailed,
    Requeued,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Published => RELAY_PUBLISHED,
            Outcome::Failed => RELAY_FAILED,
            Outcome::Dead => RELAY_DEAD,
            Outcome::DeadLetterFailed => RELAY_DEAD_LETTERS_FAILED,
            Outcome::Requeued => RELAY_REQUEUED,
        }
    }
}

/// One relay's metric handles, labelled with its outbox. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub(crate) struct RelayMetrics(Arc<Handles>);

struct Handles {
    outbox: SharedString,
    claimed: Counter,
    claims_ok: Counter,
    claims_failed: Counter,
    claims_lost: Counter,
    loop_errors: Counter,
    batch_size: Histogram,
    claim_seconds: Histogram,
    publish_seconds: Histogram,
    ack_seconds: [Histogram; 3],
    in_flight: Gauge,
    last_claim: Gauge,
    /// Per (outcome, error class): per topic, at most [`MAX_TOPICS`] topics in all.
    by_topic: Mutex<TopicCounters>,
}

#[derive(Default)]
struct TopicCounters {
    topics: HashSet<String>,
    counters: HashMap<(Outcome, &'static str), HashMap<String, Counter>>,
}

/// The acknowledgement operations, in the order of `Handles::ack_seconds`.
const ACK_OPERATIONS: [&str; 3] = ["mark_done", "mark_failed", "requeue"];

impl RelayMetrics {
    /// The handles of the relay of `outbox`, from the recorder installed now.
    pub(crate) fn new(outbox: String) -> Self {
        let outbox = SharedString::from(outbox);
        let o = || outbox.clone();
        RelayMetrics(Arc::new(Handles {
            claimed: ::metrics::counter!(RELAY_CLAIMED, "outbox" => o()),
            claims_ok: ::metrics::counter!(RELAY_CLAIMS, "outbox" => o(), "result" => "ok"),
            claims_failed: ::metrics::counter!(RELAY_CLAIMS, "outbox" => o(), "result" => "error"),
            claims_lost: ::metrics::counter!(RELAY_CLAIMS_LOST, "outbox" => o()),
            loop_errors: ::metrics::counter!(RELAY_LOOP_ERRORS, "outbox" => o()),
            batch_size: ::metrics::histogram!(RELAY_BATCH_SIZE, "outbox" => o()),
            claim_seconds: ::metrics::histogram!(RELAY_CLAIM_SECONDS, "outbox" => o()),
            publish_seconds: ::metrics::histogram!(RELAY_PUBLISH_SECONDS, "outbox" => o()),
            ack_seconds: ACK_OPERATIONS.map(
                |operation| ::metrics::histogram!(RELAY_ACK_SECONDS, "outbox" => o(), "operation" => operation),
            ),
            in_flight: ::metrics::gauge!(RELAY_IN_FLIGHT, "outbox" => o()),
            last_claim: ::metrics::gauge!(RELAY_LAST_CLAIM, "outbox" => o()),
            by_topic: Mutex::new(TopicCounters::default()),
            outbox,
        }))
    }

    /// A claim call ended after `took`: `Some(count)` messages, or `None` when it failed.
    pub(crate) fn claim(&self, took: Duration, claimed: Option<usize>) {
        let h = &self.0;
        h.claim_seconds.record(took.as_secs_f64());
        match claimed {
            Some(count) => {
                h.claims_ok.increment(1);
                h.last_claim.set(unix_now());
                if count > 0 {
                    h.claimed.increment(count as u64);
                    h.batch_size.record(count as f64);
                }
            }
            None => h.claims_failed.increment(1),
        }
    }

    /// Counts a batch in flight until the returned guard is dropped (also when the batch's
    /// future is dropped half-way).
    pub(crate) fn in_flight(&self) -> InFlight {
        self.0.in_flight.increment(1.0);
        InFlight(self.0.in_flight.clone())
    }

    /// Times a batch's publish until the returned guard is dropped.
    pub(crate) fn publish_timer(&self) -> Timer {
        Timer::start(&self.0.publish_seconds)
    }

    /// Times an acknowledgement (`mark_done`, `mark_failed`, `requeue`), its retries
    /// included, until the returned guard is dropped.
    pub(crate) fn ack_timer(&self, operation: &str) -> Timer {
        let i = ACK_OPERATIONS
            .iter()
            .position(|&o| o == operation)
            .unwrap_or(0);
        Timer::start(&self.0.ack_seconds[i])
    }

    /// `count` acknowledgements were fenced off (the claim had expired).
    pub(crate) fn claims_lost(&self, count: u64) {
        self.0.claims_lost.increment(count);
    }

    /// A store call or the publisher failed outside a single message.
    pub(crate) fn loop_error(&self) {
        self.0.loop_errors.increment(1);
    }

    /// `count` messages of `topic` were published.
    pub(crate) fn published(&self, topic: &str, count: u64) {
        self.count(Outcome::Published, topic, "", count);
    }

    // The error class arrives as its label (`ErrorKind::as_str`), not as the relay's type:
    // the relay imports these metrics, so they must not import the relay.

    /// A message of `topic` was marked failed with an error of class `class`.
    pub(crate) fn failed(&self, topic: &str, class: &'static str) {
        self.count(Outcome::Failed, topic, class, 1);
    }

    /// A message of `topic` (`None`: unreadable) was marked dead with an error of class
    /// `class`.
    pub(crate) fn dead(&self, topic: Option<&str>, class: &'static str) {
        self.count(Outcome::Dead, topic.unwrap_or(OTHER_TOPIC), class, 1);
    }

    /// The dead letter of a message of `topic` (`None`: unreadable) was not written; its
    /// error was of class `class`.
    pub(crate) fn dead_letter_failed(&self, topic: Option<&str>, class: &'static str) {
        self.count(
            Outcome::DeadLetterFailed,
            topic.unwrap_or(OTHER_TOPIC),
            class,
            1,
        );
    }

    /// A message of `topic` was handed back after an error of class `class`.
    pub(crate) fn requeued(&self, topic: &str, class: &'static str) {
        self.count(Outcome::Requeued, topic, class, 1);
    }

    /// `class` is "" for an outcome without an error (and then no `error_class` label).
    fn count(&self, outcome: Outcome, topic: &str, class: &'static str, count: u64) {
        let mut cache = self
            .0
            .by_topic
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cache = &mut *cache;
        // The label: the topic itself while fewer than MAX_TOPICS were seen, else _other.
        let topic = if cache.topics.contains(topic) {
            topic
        } else if cache.topics.len() < MAX_TOPICS {
            cache.topics.insert(topic.to_owned());
            topic
        } else {
            OTHER_TOPIC
        };
        let counters = cache.counters.entry((outcome, class)).or_default();
        if let Some(counter) = counters.get(topic) {
            counter.increment(count);
            return;
        }
        let outbox = self.0.outbox.clone();
        let label = topic.to_owned();
        let counter = if class.is_empty() {
            ::metrics::counter!(outcome.name(), "outbox" => outbox, "topic" => label)
        } else {
            ::metrics::counter!(
                outcome.name(), "outbox" => outbox, "topic" => label, "error_class" => class
            )
        };
        counter.increment(count);
        counters.insert(topic.to_owned(), counter);
    }
}

/// A batch in flight: the gauge goes down when this is dropped.
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
