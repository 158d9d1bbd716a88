//! A topic refusing the producer (`TOPIC_AUTHORIZATION_FAILED`): that topic's own problem
//! (attempts counted) only when another topic accepted a message since the topic's
//! previous refusal; until then handed back without an attempt, and fatal once no other
//! topic has accepted a message for `authorization_patience` while it kept refusing.
//!
//! Why the evidence must come after the previous refusal, not merely be recent: a producer
//! that loses write access everywhere (its credentials, a wildcard ACL) sees each topic
//! refuse while deliveries from before the loss are still recent, and ACL changes reach
//! the brokers a few seconds apart, so one topic may still accept a message after another
//! began refusing. Evidence taken once and kept would make every later refusal of that
//! topic its own and spend its messages' attempts until they are dead, and their
//! aggregates' successors would go out first once access returns. Asked afresh for each
//! refusal, the evidence spends at most an attempt per delivery to another topic.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::relay::{PublishError, PublishOutcome};

/// Per Kafka topic refusing the producer: what its refusals have shown so far. A delivery
/// to the topic ends its refusals.
#[derive(Default)]
pub(super) struct TopicRefusals(Mutex<HashMap<String, Refusals>>);

#[derive(Debug)]
struct Refusals {
    /// When its last refusal was judged.
    last: Instant,
    /// Whether another topic accepted a message enqueued after `last`.
    evidence: bool,
    /// Since when no refusal of the topic has had evidence; `None` while the last one had.
    unexplained_since: Option<Instant>,
}

/// What a batch's refusals of one topic are.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// The topic's own: another topic accepted a message since its previous refusal.
    Own,
    /// Nothing shows whose it is yet: for this long no other topic has accepted a message
    /// while the topic refused.
    Unexplained(Duration),
}

impl TopicRefusals {
    /// Judges a batch's authorization refusals (the outcomes at `refusals`; `topics` are
    /// the batch's Kafka topics, its messages enqueued from `enqueued_at` on): the topic's
    /// own when another topic accepted a message since the topic's previous refusal
    /// (retriable, an attempt counted), else handed back without an attempt
    /// (backpressure), or fatal once that has gone on for `patience`. Records the batch's
    /// deliveries first, so that they count as evidence for refusals judged after them.
    pub(super) fn judge(
        &self,
        topics: &[Cow<'_, str>],
        enqueued_at: Instant,
        refusals: &HashSet<usize>,
        patience: Duration,
        outcomes: &mut [PublishOutcome],
    ) {
        let verdicts = self.record(
            Instant::now(),
            topics,
            enqueued_at,
            refusals,
            patience,
            outcomes,
        );
        for &index in refusals {
            let Err(error) = &mut outcomes[index] else {
                continue;
            };
            let topic = &topics[index];
            *error = match verdicts[topic.as_ref()] {
                Verdict::Own => PublishError::retriable(format!(
                    "{}; topic {topic} refuses this producer while another topic accepted a \
                     message since its previous refusal: grant Write on {topic} (or fix the \
                     topic's name); its messages go dead after max_attempts",
                    error.message
                )),
                Verdict::Unexplained(lasted) if lasted >= patience => PublishError::fatal(format!(
                    "{}; topic {topic} has refused this producer for {lasted:?} and no \
                         other topic accepted a message meanwhile, so the producer has lost \
                         write access everywhere: check its credentials and grant its \
                         principal the Write ACL on the topics (kafka-acls --add \
                         --allow-principal User:<name> --operation Write --topic <topic>)",
                    error.message
                )),
                Verdict::Unexplained(_) => PublishError::backpressure(format!(
                    "{}; topic {topic} refuses this producer and no other topic accepted a \
                     message since its previous refusal, so this may be the producer's \
                     credentials or ACLs rather than the topic: handed back without an \
                     attempt. The relay stops if no other topic accepts a message for \
                     {patience:?}",
                    error.message
                )),
            };
        }
    }

    /// The bookkeeping of [`judge`](Self::judge) at `now`: one verdict per refused topic.
    fn record<'t>(
        &self,
        now: Instant,
        topics: &'t [Cow<'_, str>],
        enqueued_at: Instant,
        refusals: &HashSet<usize>,
        patience: Duration,
        outcomes: &[PublishOutcome],
    ) -> HashMap<&'t str, Verdict> {
        let mut refused = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let delivered: HashSet<&str> = topics
            .iter()
            .zip(outcomes)
            .filter(|(_, outcome)| outcome.is_ok())
            .map(|(topic, _)| topic.as_ref())
            .collect();
        if !delivered.is_empty() && !refused.is_empty() {
            refused.retain(|topic, _| !delivered.contains(topic.as_str()));
            // Every topic still refused is another topic than those delivered to. A message
            // enqueued before a refusal was judged may have been accepted before it began.
            for refusals in refused.values_mut() {
                if refusals.last <= enqueued_at {
                    refusals.evidence = true;
                }
            }
        }
        // A topic not tried for that long (its messages went dead, or were deleted) begins
        // anew: what happened to other topics meanwhile is no evidence about it now.
        refused.retain(|_, refusals| now.saturating_duration_since(refusals.last) <= patience);
        let mut verdicts = HashMap::new();
        for &index in refusals {
            let topic = topics[index].as_ref();
            if verdicts.contains_key(topic) {
                continue;
            }
            let refusals = refused.entry(topic.to_owned()).or_insert(Refusals {
                last: now,
                evidence: false,
                unexplained_since: None,
            });
            let verdict = if refusals.evidence {
                refusals.unexplained_since = None;
                Verdict::Own
            } else {
                let since = *refusals.unexplained_since.get_or_insert_with(|| {
                    tracing::warn!(
                        topic,
                        "topic refuses this producer (TopicAuthorizationFailed) and no other \
                         topic has accepted a message since; its messages are handed back \
                         without an attempt until one does, and the relay stops after {patience:?}"
                    );
                    now
                });
                Verdict::Unexplained(now.saturating_duration_since(since))
            };
            refusals.last = now;
            refusals.evidence = false;
            verdicts.insert(topic, verdict);
        }
        verdicts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(60);

    /// A batch: each message's topic and whether it was delivered (else refused).
    struct Batch(Vec<(&'static str, bool)>);

    impl Batch {
        fn topics(&self) -> Vec<Cow<'static, str>> {
            self.0.iter().map(|(t, _)| Cow::Borrowed(*t)).collect()
        }

        fn outcomes(&self) -> Vec<PublishOutcome> {
            self.0
                .iter()
                .map(|(_, ok)| {
                    if *ok {
                        Ok(())
                    } else {
                        Err(PublishError::retriable("refused"))
                    }
                })
                .collect()
        }

        fn refusals(&self) -> HashSet<usize> {
            (0..self.0.len()).filter(|i| !self.0[*i].1).collect()
        }
    }

    /// Judges `batch`, enqueued at `at` and reported at `at` + 10 ms.
    fn judge(
        refusals: &TopicRefusals,
        at: Instant,
        batch: &[(&'static str, bool)],
    ) -> HashMap<String, Verdict> {
        let batch = Batch(batch.to_vec());
        let topics = batch.topics();
        refusals
            .record(
                at + Duration::from_millis(10),
                &topics,
                at,
                &batch.refusals(),
                PATIENCE,
                &batch.outcomes(),
            )
            .into_iter()
            .map(|(t, v)| (t.to_owned(), v))
            .collect()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn deliveries_before_a_refusal_began_are_no_evidence() {
        let refusals = TopicRefusals::default();
        let t0 = Instant::now();
        // Both topics delivered, then both refused, each in a batch of its own.
        assert!(judge(&refusals, t0, &[("a", true), ("b", true)]).is_empty());
        let a = judge(&refusals, t0 + secs(1), &[("a", false)]);
        assert_eq!(a["a"], Verdict::Unexplained(Duration::ZERO));
        let b = judge(&refusals, t0 + secs(2), &[("b", false)]);
        assert_eq!(b["b"], Verdict::Unexplained(Duration::ZERO));
        let a = judge(&refusals, t0 + secs(3), &[("a", false)]);
        assert_eq!(a["a"], Verdict::Unexplained(secs(2)));
        // Delivered in the same batch as a first refusal: enqueued before it was seen.
        let c = judge(&refusals, t0 + secs(4), &[("c", false), ("d", true)]);
        assert_eq!(c["c"], Verdict::Unexplained(Duration::ZERO));
    }

    #[test]
    fn a_delivery_after_the_previous_refusal_makes_the_next_one_the_topics_own() {
        let refusals = TopicRefusals::default();
        let t0 = Instant::now();
        judge(&refusals, t0, &[("a", false)]);
        let next = judge(&refusals, t0 + secs(1), &[("a", false), ("b", true)]);
        assert_eq!(next["a"], Verdict::Own);
        // Asked afresh each time: with nothing delivered since, unexplained again.
        let again = judge(&refusals, t0 + secs(2), &[("a", false)]);
        assert_eq!(again["a"], Verdict::Unexplained(Duration::ZERO));
        let later = judge(&refusals, t0 + secs(3), &[("b", true)]);
        assert!(later.is_empty());
        assert_eq!(
            judge(&refusals, t0 + secs(4), &[("a", false)])["a"],
            Verdict::Own
        );
    }

    #[test]
    fn a_delivery_enqueued_before_the_previous_refusal_was_judged_is_no_evidence() {
        let refusals = TopicRefusals::default();
        let t0 = Instant::now();
        judge(&refusals, t0 + secs(1), &[("a", false)]);
        // Another batch in flight meanwhile, enqueued before that refusal, reports later.
        let topics = [Cow::Borrowed("b")];
        refusals.record(
            t0 + secs(2),
            &topics,
            t0,
            &HashSet::new(),
            PATIENCE,
            &[Ok(())],
        );
        assert_eq!(
            judge(&refusals, t0 + secs(3), &[("a", false)])["a"],
            Verdict::Unexplained(secs(2))
        );
    }

    #[test]
    fn access_lost_a_few_seconds_apart_spends_at_most_one_attempt() {
        let refusals = TopicRefusals::default();
        let t0 = Instant::now();
        judge(&refusals, t0, &[("a", false)]);
        // b still accepts for a moment, then refuses too.
        assert_eq!(
            judge(&refusals, t0 + secs(1), &[("a", false), ("b", true)])["a"],
            Verdict::Own
        );
        let verdicts: Vec<Verdict> = (2..10)
            .map(|s| judge(&refusals, t0 + secs(s), &[("a", false), ("b", false)])["a"])
            .collect();
        assert!(
            verdicts
                .iter()
                .all(|v| matches!(v, Verdict::Unexplained(_))),
            "{verdicts:?}"
        );
    }

    #[test]
    fn a_delivery_to_the_topic_ends_its_refusals_and_an_old_one_begins_anew() {
        let refusals = TopicRefusals::default();
        let t0 = Instant::now();
        judge(&refusals, t0, &[("a", false)]);
        judge(&refusals, t0 + secs(30), &[("a", true)]);
        assert_eq!(
            judge(&refusals, t0 + secs(40), &[("a", false)])["a"],
            Verdict::Unexplained(Duration::ZERO)
        );
        // Not tried for longer than the patience: no streak from before.
        let late = t0 + secs(40) + PATIENCE * 2;
        assert_eq!(
            judge(&refusals, late, &[("a", false)])["a"],
            Verdict::Unexplained(Duration::ZERO)
        );
        assert_eq!(refusals.0.lock().unwrap().len(), 1, "nothing kept twice");
    }

    #[test]
    fn the_outcomes_name_the_topic_and_say_what_happens() {
        let refusals = TopicRefusals::default();
        let topics = [Cow::Borrowed("prod.audit")];
        let refused = HashSet::from([0]);
        let mut outcomes = vec![Err(PublishError::retriable("producing to prod.audit: x"))];
        refusals.judge(
            &topics,
            Instant::now(),
            &refused,
            Duration::ZERO,
            &mut outcomes,
        );
        let error = outcomes[0].clone().unwrap_err();
        assert_eq!(error.kind, crate::relay::ErrorKind::Fatal, "{error:?}");
        assert!(error.message.contains("Write ACL"), "{}", error.message);
        let mut outcomes = vec![Err(PublishError::retriable("producing to prod.audit: x"))];
        refusals.judge(&topics, Instant::now(), &refused, PATIENCE, &mut outcomes);
        let error = outcomes[0].clone().unwrap_err();
        assert_eq!(error.kind, crate::relay::ErrorKind::Backpressure);
        assert!(
            error.message.contains("topic prod.audit refuses"),
            "{}",
            error.message
        );
    }
}
