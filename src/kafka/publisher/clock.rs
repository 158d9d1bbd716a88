//! A topic refusing the records' timestamps (`INVALID_TIMESTAMP`): the producing host's
//! clock, not a message, so handed back until it has lasted `clock_patience`, then fatal.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::relay::{PublishError, PublishOutcome};

/// Per Kafka topic refusing the records' timestamps: when the refusals began and when the
/// last one came (a delivery to the topic ends them).
#[derive(Default)]
pub(super) struct ClockRefusals(Mutex<HashMap<String, (Instant, Instant)>>);

impl ClockRefusals {
    /// Makes a batch's refusals of the records' timestamps (the outcomes at `refusals`;
    /// `topics` are the batch's Kafka topics) the clock's problem: handed back without an
    /// attempt (naming the clock) while the topic has refused for less than `patience`,
    /// fatal after. A delivery to a topic ends its refusals.
    pub(super) fn judge(
        &self,
        topics: &[Cow<'_, str>],
        refusals: &HashSet<usize>,
        patience: Duration,
        outcomes: &mut [PublishOutcome],
    ) {
        let now = Instant::now();
        let mut since = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (topic, outcome) in topics.iter().zip(outcomes.iter()) {
            if outcome.is_ok() && !since.is_empty() {
                since.remove(topic.as_ref());
            }
        }
        for &index in refusals {
            let Err(error) = &mut outcomes[index] else {
                continue;
            };
            let topic = &topics[index];
            let (began, last) = since
                .entry(topic.clone().into_owned())
                .or_insert((now, now));
            // Refusals that stopped long ago (nothing to send meanwhile) are not this one's
            // beginning.
            if now.duration_since(*last) > patience {
                *began = now;
            }
            *last = now;
            let lasted = now.duration_since(*began);
            let settings = "the topic's message.timestamp.before.max.ms and \
                            message.timestamp.after.max.ms (message.timestamp.difference.max.ms \
                            before Kafka 3.6)";
            *error = if lasted >= patience {
                PublishError::fatal(format!(
                    "{}; topic {topic} has refused the records' timestamps for {lasted:?} \
                     with nothing delivered to it. The timestamp is this relay host's clock at \
                     produce time, not the message's, so the clock (or the broker's) is off by \
                     more than {settings} allow: set the clock right (NTP) or change those \
                     settings",
                    error.message
                ))
            } else {
                PublishError::backpressure(format!(
                    "{}; topic {topic} refuses the records' timestamps, which are this relay \
                     host's clock, not the message: handed back without an attempt. Check the \
                     clock and {settings}; the relay stops if this lasts {patience:?}",
                    error.message
                ))
            };
        }
    }
}
