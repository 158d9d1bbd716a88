//! One batch between claim and acknowledgement: publish it, sort the outcomes by the
//! failure table, acknowledge each message, and hand dead ones to the dead-letter
//! destination.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use tokio::time::{Instant, timeout, timeout_at};
use tracing::Instrument;
use tracing::field::Empty;

use super::acknowledge::Ack;
use super::hooks::{guarded, panic_message};
use super::shared::Shared;
use super::{
    BatchReport, DeadLetter, ErrorKind, Hooks, PublishError, PublishOutcome, Publisher,
    RetryDecision, dead_letter_headers,
};
use crate::error::Error;
use crate::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed};

impl<S: ClaimStore, P: Publisher, H: Hooks> Shared<'_, S, P, H> {
    /// Publishes and acknowledges one claimed batch inside its `relay.batch` span; the
    /// error is the one `run` must stop with (a fatal publish error).
    pub(super) async fn process(
        &self,
        batch: Vec<Claimed>,
        claimed_at: Instant,
    ) -> (BatchReport, Option<Error>) {
        // The gauge counts batches, not messages: the bound it shows is max_in_flight.
        let _in_flight = self.metrics.in_flight();
        let span = tracing::info_span!(
            "relay.batch",
            size = batch.len(),
            published = Empty,
            failed = Empty,
            requeued = Empty,
            dead = Empty,
            duration_ms = Empty,
        );
        let (report, fatal) = self
            .process_batch(batch, claimed_at)
            .instrument(span.clone())
            .await;
        span.record("published", report.published);
        span.record("failed", report.failed);
        span.record("requeued", report.requeued);
        span.record("dead", report.dead);
        span.record("duration_ms", claimed_at.elapsed().as_millis() as u64);
        span.in_scope(|| tracing::debug!(?report, "batch acknowledged"));

        let fatal = fatal.map(|(id, error)| {
            let error = Error::Publisher(format!(
                "the publisher reported a fatal error for outbox message {id}: {}; the relay \
                 handed the message back (claimable again, no attempt counted), acknowledged \
                 the rest of its batch and stopped. Fix the publisher (credentials, \
                 permissions, broker address, settings) and start the relay again",
                error.message
            ));
            tracing::error!(%error, "relay stopped");
            self.loop_error(&error);
            error
        });
        (report, fatal)
    }

    async fn process_batch(
        &self,
        batch: Vec<Claimed>,
        claimed_at: Instant,
    ) -> (BatchReport, Option<(i64, PublishError)>) {
        // Past the claim timeout another claim may own these rows, so retrying a failed
        // acknowledgement beyond it is pointless: the reaper will hand them out again.
        let deadline = claimed_at + self.config.claim_timeout;
        let mut report = BatchReport {
            claimed: batch.len(),
            ..BatchReport::default()
        };
        let policy = self.config.retry.clone();

        // One pass, into vectors sized up front: a batch of a thousand messages is a
        // quarter of a megabyte, and growing or copying it again costs more than the
        // relay's own bookkeeping (examples/bench_kafka.rs).
        let mut undecodable = Vec::new();
        let mut exhausted = Vec::new();
        let mut batch_to_publish = Vec::with_capacity(batch.len());
        for claimed in batch {
            match claimed {
                Claimed::Message(message)
                    if attempts_of(message.attempts) >= policy.max_attempts =>
                {
                    exhausted.push(message)
                }
                Claimed::Message(message) => batch_to_publish.push(message),
                Claimed::Undecodable(row) => undecodable.push(row),
            }
        }
        let batch = batch_to_publish;
        // A row that cannot be decoded never will be: it goes dead like a poison message,
        // and the rest of the batch is published as usual.
        let mut dead: Vec<(DeadLetter<'_>, PublishError)> = undecodable
            .iter()
            .map(|row| {
                let error = PublishError::poison(format!(
                    "the outbox row cannot be decoded: {}; not published",
                    row.error
                ));
                (DeadLetter::Undecodable(row), error)
            })
            .collect();

        dead.extend(exhausted.iter().map(|m| {
            let error = PublishError::poison(format!(
                "{} attempts used up by expired claims (max_attempts {}); not published again",
                m.attempts, policy.max_attempts
            ));
            (DeadLetter::Message(m), error)
        }));

        let outcomes = self.publish(&batch).await;

        // Successes grouped by claim token (one group in practice: a claim has one token).
        let mut done: Vec<(ClaimToken, Vec<i64>)> = Vec::new();
        let mut done_index: HashMap<ClaimToken, usize> = HashMap::new();
        let mut retries: Vec<(&ClaimedMessage, Duration, PublishError)> = Vec::new();
        let mut requeues: Vec<(&ClaimedMessage, PublishError)> = Vec::new();
        let mut handed_back: Vec<&ClaimedMessage> = Vec::new();
        let mut fatal: Option<(i64, PublishError)> = None;
        // The published count goes to the metrics once per run of one topic, not once per
        // message: each count takes a lock and three look-ups (examples/bench_kafka.rs).
        let mut published_run: Option<(&str, u64)> = None;
        for (message, outcome) in batch.iter().zip(outcomes) {
            let error = match outcome {
                Ok(()) => {
                    let group = *done_index.entry(message.claim_token).or_insert_with(|| {
                        done.push((message.claim_token, Vec::new()));
                        done.len() - 1
                    });
                    done[group].1.push(message.id);
                    report.published += 1;
                    match &mut published_run {
                        Some((topic, count)) if *topic == message.topic => *count += 1,
                        run => {
                            if let Some((topic, count)) = run.replace((&message.topic, 1)) {
                                self.metrics.published(topic, count);
                            }
                        }
                    }
                    continue;
                }
                Err(error) => error,
            };
            match error.kind {
                ErrorKind::Retriable => {
                    let attempts = attempts_of(message.attempts).saturating_add(1);
                    match policy.next_delay(attempts, &mut *self.rng()) {
                        RetryDecision::RetryAfter(delay) => retries.push((message, delay, error)),
                        RetryDecision::Dead => dead.push((DeadLetter::Message(message), error)),
                    }
                }
                ErrorKind::Poison => dead.push((DeadLetter::Message(message), error)),
                ErrorKind::Fatal => {
                    if fatal.is_none() {
                        fatal = Some((message.id, error.clone()));
                    }
                    guarded(self.hooks, "on_fatal", |h| h.on_fatal(message.id, &error));
                    // The message is not at fault: the publisher is. Marking it dead (or
                    // counting an attempt) would punish it for a broken credential; it
                    // waits for a relay that can publish it.
                    handed_back.push(message);
                }
                ErrorKind::Backpressure => requeues.push((message, error)),
            }
        }

        if let Some((topic, count)) = published_run {
            self.metrics.published(topic, count);
        }

        // Successes first and in one call: they unblock the next message of each aggregate.
        for (token, ids) in &done {
            self.acknowledge(Ack::Done(ids, *token), deadline, &mut report)
                .await;
        }
        if report.published > 0 {
            guarded(self.hooks, "on_published", |h| {
                h.on_published(report.published)
            });
        }

        for (message, delay, error) in &retries {
            let text = error_text(error);
            let ack = Ack::Failed(Failed::retry(
                message.id,
                message.claim_token,
                *delay,
                &text,
            ));
            self.acknowledge(ack, deadline, &mut report).await;
            report.failed += 1;
            self.metrics.failed(&message.topic, error.kind.as_str());
            tracing::debug!(id = message.id, topic = %message.topic, error_class = error.kind.as_str(), ?delay, %error, "message failed; will retry");
            guarded(self.hooks, "on_failed", |h| h.on_failed(message.id, error));
        }

        let requeue_after = policy.initial;
        for (message, error) in &requeues {
            let ack = Ack::Requeue {
                id: message.id,
                token: message.claim_token,
                after: requeue_after,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.requeued += 1;
            self.metrics.requeued(&message.topic, error.kind.as_str());
            guarded(self.hooks, "on_requeued", |h| {
                h.on_requeued(message.id, error)
            });
        }

        // Due at once: the relay stops after this batch, and the next one to run (after
        // the fix, or another of the fleet) should not wait for it.
        for message in &handed_back {
            let ack = Ack::Requeue {
                id: message.id,
                token: message.claim_token,
                after: Duration::ZERO,
            };
            self.acknowledge(ack, deadline, &mut report).await;
            report.requeued += 1;
            self.metrics
                .requeued(&message.topic, ErrorKind::Fatal.as_str());
            tracing::warn!(
                id = message.id,
                "message handed back after a fatal publish error"
            );
        }

        // Dead-letter before marking dead: a crash in between re-publishes the dead letter
        // (at least once) instead of losing it. Every dead letter of the batch at once and
        // under one bound inside the claim: one at a time, a dead-letter destination that
        // never answers (a missing topic) would cost its whole wait per message, the batch
        // would outlive its claim, and its rows would be claimed, published and
        // dead-lettered again while it still held an in-flight slot.
        let written_by = self.dead_letter_deadline(claimed_at);
        let written = join_all(dead.iter().map(|(letter, error)| {
            let attempts = attempts_of(letter.attempts()).saturating_add(1);
            let headers = dead_letter_headers(*letter, attempts, error);
            async move { self.dead_letter(*letter, &headers, written_by).await }
        }))
        .await;
        for ((letter, error), written) in dead.iter().zip(written) {
            let id = letter.id();
            let error = match written {
                Ok(()) => Cow::Borrowed(error),
                Err(dl_error) => {
                    let destination = self.publisher.dead_letter_destination(*letter);
                    tracing::warn!(id, destination, error = %dl_error, "dead-letter publish failed");
                    self.metrics
                        .dead_letter_failed(letter.topic(), dl_error.kind.as_str());
                    guarded(self.hooks, "on_dead_letter_failed", |h| {
                        h.on_dead_letter_failed(id, &dl_error)
                    });
                    Cow::Owned(with_dead_letter_failure(
                        *letter,
                        error,
                        destination.as_deref(),
                        &dl_error,
                    ))
                }
            };
            let text = error_text(&error);
            let ack = Ack::Failed(Failed::dead(id, letter.claim_token(), &text));
            self.acknowledge(ack, deadline, &mut report).await;
            report.dead += 1;
            self.metrics.dead(letter.topic(), error.kind.as_str());
            tracing::warn!(id, topic = letter.topic().unwrap_or(""), error_class = error.kind.as_str(), %error, "message dead");
            guarded(self.hooks, "on_dead", |h| h.on_dead(id, &error));
        }

        (report, fatal)
    }

    /// Calls the publisher, turning a panic, a hang past the claim timeout or a wrong
    /// number of outcomes into a retriable failure of the whole batch.
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let n = batch.len();
        let _publishing = self.metrics.publish_timer();
        // The call sits inside the async block so a panic before its first await is
        // caught too.
        let call = AssertUnwindSafe(async { self.publisher.publish(batch).await }).catch_unwind();
        let problem = match timeout(self.config.claim_timeout, call).await {
            Ok(Ok(outcomes)) if outcomes.len() == n => return outcomes,
            // The outcomes cannot be matched to the messages, so none is trusted: an `Ok`
            // taken for the wrong message would acknowledge one that was never published.
            Ok(Ok(outcomes)) => format!(
                "the publisher returned {} outcomes for a batch of {n}; a Publisher must \
                 return exactly one per message, in order",
                outcomes.len()
            ),
            Ok(Err(payload)) => format!(
                "the publisher panicked: {}",
                panic_message(payload.as_ref())
            ),
            Err(_) => format!(
                "the publisher did not finish within the claim timeout ({:?})",
                self.config.claim_timeout
            ),
        };
        self.loop_error(&Error::Publisher(format!(
            "{problem}; the whole batch of {n} is retried"
        )));
        vec![Err(PublishError::retriable(problem)); n]
    }

    /// When a batch's dead letters must be written by: three quarters of the claim timeout
    /// after the claim, so the last quarter (what [`RelayConfig::check_publisher`] leaves
    /// for acknowledgements after a publish) is there to mark the rows dead while the claim
    /// still holds them. Never later than the claim's end, so never longer than the claim
    /// timeout from now.
    ///
    /// [`RelayConfig::check_publisher`]: super::RelayConfig::check_publisher
    fn dead_letter_deadline(&self, claimed_at: Instant) -> Instant {
        let timeout = self.config.claim_timeout;
        claimed_at + (timeout - timeout / 4)
    }

    /// Hands one dead letter to the publisher, by `deadline` (a call not started by then
    /// is not made: whatever it wrote could land after another claim took the row).
    async fn dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &crate::outbox::Headers,
        deadline: Instant,
    ) -> Result<(), PublishError> {
        let bound = || {
            format!(
                "three quarters of the claim timeout ({:?}) after the claim, so that the row \
                 is marked dead while the claim still holds it",
                self.config.claim_timeout
            )
        };
        if Instant::now() >= deadline {
            return Err(PublishError::retriable(format!(
                "the dead letter was not sent: the batch's publish left no time before its \
                 bound, {}",
                bound()
            )));
        }
        let call =
            AssertUnwindSafe(async { self.publisher.publish_dead_letter(letter, headers).await })
                .catch_unwind();
        match timeout_at(deadline, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(payload)) => Err(PublishError::retriable(format!(
                "the dead-letter publish panicked: {}",
                panic_message(payload.as_ref())
            ))),
            Err(_) => Err(PublishError::retriable(format!(
                "the dead-letter publish was not confirmed within its bound, {}; it may still \
                 arrive",
                bound()
            ))),
        }
    }
}

/// A message's failed attempts so far (its `attempts` column), as the policy counts them.
fn attempts_of(attempts: i32) -> u32 {
    u32::try_from(attempts).unwrap_or(0)
}

/// What the outbox's error column gets.
fn error_text(error: &PublishError) -> String {
    format!("{}: {}", error.kind, error.message)
}

/// The most characters of either error [`with_dead_letter_failure`] keeps: the stores keep
/// the first 2,000 of `last_error`, and the dead letter's failure must be among them.
const ERROR_PART_CHARS: usize = 800;

/// The error a message whose dead letter failed is marked dead with: its own (same kind),
/// then the dead letter's, naming the message's topic and the dead-letter destination
/// (when the publisher states it), so that `last_error`, the `on_dead` hook and the
/// command line's progress line say both.
fn with_dead_letter_failure(
    letter: DeadLetter<'_>,
    error: &PublishError,
    destination: Option<&str>,
    dl_error: &PublishError,
) -> PublishError {
    let route = match (letter.topic(), destination) {
        (Some(topic), Some(destination)) => format!(" from topic {topic} to {destination}"),
        (Some(topic), None) => format!(" from topic {topic}"),
        (None, Some(destination)) => format!(" to {destination}"),
        (None, None) => String::new(),
    };
    PublishError::new(
        error.kind,
        format!(
            "{}; its dead letter{route} was not written either: {}: {}",
            clip(&error.message),
            dl_error.kind,
            clip(&dl_error.message)
        ),
    )
}

/// `text`'s first [`ERROR_PART_CHARS`] characters, with `…` when it was longer.
fn clip(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(ERROR_PART_CHARS) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::UndecodableMessage;

    fn row(topic: Option<&str>) -> UndecodableMessage {
        UndecodableMessage {
            id: 7,
            message_id: None,
            topic: topic.map(str::to_owned),
            payload: None,
            headers: None,
            attempts: 0,
            claim_token: ClaimToken::new(uuid::Uuid::nil()),
            error: "x".to_owned(),
        }
    }

    #[test]
    fn the_dead_letter_s_failure_survives_the_stores_2000_characters() {
        let row = row(Some("orders"));
        let own = PublishError::poison("é".repeat(3_000));
        let refused = PublishError::retriable("producing to orders.dlq: not authorized");
        let both = with_dead_letter_failure(
            DeadLetter::Undecodable(&row),
            &own,
            Some("orders.dlq"),
            &refused,
        );
        assert_eq!(both.kind, ErrorKind::Poison, "the message's own kind");
        let kept: String = error_text(&both).chars().take(2_000).collect();
        assert!(
            kept.ends_with(
                "…; its dead letter from topic orders to orders.dlq was not written either: \
                 retriable: producing to orders.dlq: not authorized"
            ),
            "{kept}"
        );
    }

    #[test]
    fn the_route_says_what_is_known() {
        let refused = PublishError::retriable("down");
        let own = PublishError::poison("bad");
        for (topic, destination, expected) in [
            (
                None,
                Some("undecodable"),
                "bad; its dead letter to undecodable was not",
            ),
            (
                Some("orders"),
                None,
                "bad; its dead letter from topic orders was not",
            ),
            (None, None, "bad; its dead letter was not"),
        ] {
            let row = row(topic);
            let both = with_dead_letter_failure(
                DeadLetter::Undecodable(&row),
                &own,
                destination,
                &refused,
            );
            assert!(both.message.starts_with(expected), "{}", both.message);
        }
    }
}
