//! [`KafkaPublisher`]: the relay's publisher to Kafka.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer, PurgeConfig};
use tokio::time::{Instant, timeout_at};

use crate::error::Result;
use crate::outbox::{ClaimedMessage, Headers};
use crate::relay::{DeadLetter, ErrorKind, PublishError, PublishOutcome, Publisher};

use super::classify::{classify, clock_refused, refuses_whole_request, topic_refused};
use super::producer::ProducerSettings;

mod authorization;
mod clock;
mod record;

use authorization::TopicRefusals;
use clock::ClockRefusals;

pub use record::{
    HEADER_MESSAGE_ID, HEADER_PUBLISH_ATTEMPTS, HEADER_TRACE_ID, HEADER_TRACEPARENT,
    HEADER_VALUE_OMITTED,
};
use record::{message_key, record_headers};

/// Where the publisher sends messages: the topic is the outbox row's topic with
/// `topic_prefix` before it; dead letters go to that topic with `dlq_suffix` after it.
///
/// ```
/// use changefeed::kafka::{KafkaPublisherConfig, ProducerSettings};
///
/// let config = KafkaPublisherConfig::new(ProducerSettings::new("kafka:9092"))
///     .topic_prefix("prod.".to_owned())
///     .undecodable_topic(Some("prod.outbox.undecodable".to_owned()));
/// // A row for `orders` goes to `prod.orders`, its dead letter to `prod.orders.dlq`.
/// assert_eq!(config.dlq_suffix, ".dlq");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KafkaPublisherConfig {
    /// The producer.
    pub producer: ProducerSettings,
    /// Put before every row's topic (default empty).
    pub topic_prefix: String,
    /// Put after the topic for dead letters (default `.dlq`).
    pub dlq_suffix: String,
    /// The topic, taken as it is (no prefix, no suffix), for dead letters of undecodable
    /// rows whose topic column could not be read either. `None` (the default): such a dead
    /// letter fails with an error naming the row, the relay reports it through
    /// [`Hooks::on_dead_letter_failed`](crate::relay::Hooks::on_dead_letter_failed), and the
    /// row stays dead in the outbox with its raw text for an operator.
    pub undecodable_topic: Option<String>,
    /// How long a topic may refuse the records' timestamps (`INVALID_TIMESTAMP`), with
    /// nothing delivered to it meanwhile, before the refusal is fatal (default
    /// [`KafkaPublisher::CLOCK_PATIENCE`]). Until then its messages are handed back
    /// without counting an attempt: the timestamp is this host's clock, not the message.
    pub clock_patience: Duration,
    /// How long a topic may refuse the producer (`TOPIC_AUTHORIZATION_FAILED`) with no
    /// other topic accepting a message meanwhile before the refusal is fatal (default
    /// [`KafkaPublisher::AUTHORIZATION_PATIENCE`]). Until then, and whenever no other topic
    /// accepted a message since the topic's previous refusal, its messages are handed back
    /// without counting an attempt: nothing shows yet that the refusal is the topic's and
    /// not the producer's.
    pub authorization_patience: Duration,
}

impl KafkaPublisherConfig {
    /// Publishes with `producer`, no prefix, dead letters to `<topic>.dlq`.
    pub fn new(producer: ProducerSettings) -> Self {
        KafkaPublisherConfig {
            producer,
            topic_prefix: String::new(),
            dlq_suffix: ".dlq".to_owned(),
            undecodable_topic: None,
            clock_patience: KafkaPublisher::CLOCK_PATIENCE,
            authorization_patience: KafkaPublisher::AUTHORIZATION_PATIENCE,
        }
    }

    setters! {
        /// Sets `topic_prefix`.
        topic_prefix: String;
        /// Sets `dlq_suffix`.
        dlq_suffix: String;
        /// Sets `undecodable_topic`.
        undecodable_topic: Option<String>;
        /// Sets `clock_patience`.
        clock_patience: Duration;
        /// Sets `authorization_patience`.
        authorization_patience: Duration;
    }
}

/// Publishes claimed messages to Kafka through one idempotent producer.
///
/// Each outbox message becomes one Kafka record:
///
/// | record | from the outbox row |
/// |---|---|
/// | topic | `topic_prefix` + `topic` |
/// | key | `partition_key`, else `aggregate_id`, else none (librdkafka then spreads the messages over the partitions) |
/// | value | the payload as compact JSON bytes |
/// | headers | the row's headers, then [`message-id`](HEADER_MESSAGE_ID) (the idempotency key), [`attempts`](HEADER_PUBLISH_ATTEMPTS) (failed attempts so far), and the trace id: as [`traceparent`](HEADER_TRACEPARENT) when it is a W3C trace context `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), else as [`trace-id`](HEADER_TRACE_ID) unchanged. A row header of one of these names is replaced, so each appears once |
///
/// A trace id that is not a `traceparent` is not turned into one: that would need a parent
/// span id, and an invented one would point consumers' spans at a span no one recorded.
///
/// A batch is published by enqueueing every message first (librdkafka batches and
/// pipelines them) and then awaiting every delivery report; nothing blocks: a full local
/// queue is a [`Backpressure`](crate::relay::ErrorKind::Backpressure) outcome for that
/// message at once. Each outcome is its delivery report judged by
/// [`classify`](super::classify), whose documentation holds the table of librdkafka errors
/// and what each means for the relay. Since the batch holds at most one
/// message per aggregate (the claim's head-of-aggregate rule) and the producer is
/// idempotent, an aggregate's messages reach their partition once each and in order.
///
/// Dead letters go to `topic_prefix` + `topic` + `dlq_suffix` through the same producer,
/// with the relay's dead-letter headers plus `message-id`, the same key, and the payload
/// text as the value (see [`KafkaPublisherConfig::undecodable_topic`] for rows whose
/// topic could not be read). A dead letter whose value the dead-letter topic refuses as
/// poison too (a payload over `message.max.bytes`) is sent again without it, with
/// [`x-value-omitted`](HEADER_VALUE_OMITTED) saying why; the dead row keeps the payload.
///
/// A broker refuses a whole produce request (one partition's batch) when it finds one bad
/// message in it (`MESSAGE_TOO_LARGE`, `INVALID_RECORD`, `CORRUPT_MESSAGE`, ...), so such
/// a delivery report only makes each of its messages suspect. Once the batch's reports are in, every suspect is produced again alone (enqueued
/// and its report awaited before the next, so its request holds nothing else): it is
/// delivered, or refused on its own and then [`Poison`](crate::relay::ErrorKind::Poison).
/// Until then it stays claimed, so no successor of its aggregate is published ahead of it.
/// The relay's batches in flight at once (`max_in_flight`) are produced side by side, but
/// never while a suspect is produced alone: the suspect waits for the reports of the
/// batches already sent, and batches that would start wait for the suspect.
/// librdkafka's own `message.max.bytes` check refuses one message at enqueue and is Poison
/// at once.
///
/// A topic that refuses the producer (`TOPIC_AUTHORIZATION_FAILED`) is that topic's problem
/// (retriable: an attempt counted, dead at `max_attempts`) only when another topic accepted
/// a message enqueued after the topic's previous refusal: deliveries from before a refusal
/// began say nothing about it, since a producer that loses write access everywhere refuses
/// each topic in turn while those are still recent. Without such evidence the refusal is
/// handed back ([`Backpressure`](crate::relay::ErrorKind::Backpressure): no attempt
/// counted, the relay pauses its claims; the message stays its aggregate's head, so no
/// successor goes out first), and once a topic has refused for
/// [`authorization_patience`](KafkaPublisherConfig::authorization_patience) with no other
/// topic accepting a message meanwhile, the refusal is producer-wide (credentials, ACLs):
/// [`Fatal`](crate::relay::ErrorKind::Fatal), and the relay stops. Every such error names
/// its topic.
///
/// A topic that refuses the records' timestamps (`INVALID_TIMESTAMP`: its
/// `message.timestamp.before.max.ms` / `after.max.ms`, or
/// `message.timestamp.difference.max.ms` before Kafka 3.6) refuses this host's clock, which
/// librdkafka stamps on every record, not a message: no message of the request is suspect,
/// each is handed back ([`Backpressure`](crate::relay::ErrorKind::Backpressure): no
/// attempt counted, the relay pauses its claims). Once the topic has refused for
/// [`clock_patience`](KafkaPublisherConfig::clock_patience) with nothing delivered to it,
/// the refusal is [`Fatal`](crate::relay::ErrorKind::Fatal), naming the clock and those
/// settings, and the relay stops.
///
/// A publish takes at most [`longest_publish`](Publisher::longest_publish): twice the
/// message timeout (the batch, then its suspects alone) plus 1 s for librdkafka's timer,
/// counted from the call, whatever other batches are in flight: a batch that would wait for
/// another batch's suspects past the last moment its reports could still come in time is
/// not sent at all ([`Backpressure`](crate::relay::ErrorKind::Backpressure): handed back,
/// no attempt counted), and a suspect that cannot get the producer to itself in time is
/// retried, not judged;
/// [`Relay::new`](crate::relay::Relay::new) refuses it when that is not comfortably inside
/// the relay's `claim_timeout`, and `message.timeout.ms=0` (no limit) is always refused.
/// Should the producer still hold messages past that bound, they are purged from its queue
/// before their rows are marked failed, so no stale copy is sent after another claim took
/// them. When the settings give no message timeout, [`new`](Self::new) sets
/// [`DEFAULT_MESSAGE_TIMEOUT`](Self::DEFAULT_MESSAGE_TIMEOUT), which fits the relay's
/// default claim timeout of 30 s.
///
/// ```no_run
/// use changefeed::kafka::{KafkaPublisher, KafkaPublisherConfig, ProducerSettings, check_brokers};
/// use changefeed::relay::{Relay, RelayConfig};
/// # use std::time::Duration;
/// # async fn f(store: changefeed::outbox_store::SqlClaimStore) -> changefeed::Result<()> {
/// // `store`: a SqlClaimStore over the outbox table.
/// let producer = ProducerSettings::new("kafka-1:9092,kafka-2:9092").set("linger.ms", "5");
/// let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(producer))?;
/// check_brokers(publisher.producer(), Duration::from_secs(10)).await?;
/// let relay = Relay::new(store, publisher, RelayConfig::default())?;
/// # let shutdown = async {};
/// // e.g. `let shutdown = async { tokio::signal::ctrl_c().await.ok(); };`
/// relay.run(shutdown).await?;
/// # Ok(()) }
/// ```
pub struct KafkaPublisher {
    config: KafkaPublisherConfig,
    producer: FutureProducer,
    /// librdkafka's `message.timeout.ms` (zero: no limit).
    message_timeout: Duration,
    /// The topics refusing the producer, and what shows whose problem that is.
    topic_refusals: TopicRefusals,
    /// Batches (and dead letters) are produced under its read side, side by side when the
    /// relay has several batches in flight; a suspect is produced alone under its write
    /// side, so no other message shares its request. Fair: once a suspect waits, later
    /// batches wait behind it.
    producing: tokio::sync::RwLock<()>,
    /// The topics refusing the records' timestamps, and since when.
    clock_refusals: ClockRefusals,
}

impl KafkaPublisher {
    /// `message.timeout.ms` when the settings give neither it nor `delivery.timeout.ms`:
    /// 10 s, so a publish (at most twice that plus 1 s) fits in three quarters of the
    /// relay's default claim timeout of 30 s.
    pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

    /// The default [`authorization_patience`](KafkaPublisherConfig::authorization_patience):
    /// 5 minutes, for low-rate topics to show (by accepting a message) that a refusal is
    /// one topic's and not the producer's. Waiting costs no attempt and moves no message
    /// out of order; stopping sooner would stop the relay for one topic's ACL whenever the
    /// other topics are quiet.
    pub const AUTHORIZATION_PATIENCE: Duration = Duration::from_secs(5 * 60);

    /// The default [`clock_patience`](KafkaPublisherConfig::clock_patience): 1 minute. A
    /// clock stepped back into line (NTP) is accepted again within it; one that is off by
    /// more than a topic allows does not right itself by slewing in minutes.
    pub const CLOCK_PATIENCE: Duration = Duration::from_secs(60);

    /// What librdkafka's message timeout may overrun by: it scans for timed-out messages
    /// about once a second.
    const TIMER_SLACK: Duration = Duration::from_secs(1);

    /// `linger.ms` when the settings give neither it nor `queue.buffering.max.ms`: 1 ms
    /// instead of librdkafka's 5. The relay enqueues a whole batch at once, and the next
    /// batch only after a claim, so little more joins a batch while librdkafka lingers;
    /// lingering mostly delays every batch's acknowledgement (measured by
    /// `examples/bench_kafka.rs`).
    pub const DEFAULT_LINGER: Duration = Duration::from_millis(1);

    /// Creates the producer (see [`ProducerSettings::create`] for its errors), with
    /// [`DEFAULT_MESSAGE_TIMEOUT`](Self::DEFAULT_MESSAGE_TIMEOUT) and
    /// [`DEFAULT_LINGER`](Self::DEFAULT_LINGER) where the settings give none.
    pub fn new(mut config: KafkaPublisherConfig) -> Result<Self> {
        for (names, value) in [
            (
                ["message.timeout.ms", "delivery.timeout.ms"],
                Self::DEFAULT_MESSAGE_TIMEOUT,
            ),
            (
                ["linger.ms", "queue.buffering.max.ms"],
                Self::DEFAULT_LINGER,
            ),
        ] {
            if names.iter().all(|name| config.producer.get(name).is_none()) {
                config.producer = config.producer.set(names[0], value.as_millis().to_string());
            }
        }
        let message_timeout = config
            .producer
            .message_timeout()?
            .unwrap_or(Self::DEFAULT_MESSAGE_TIMEOUT);
        let producer = config.producer.create()?;
        Ok(KafkaPublisher {
            config,
            producer,
            message_timeout,
            topic_refusals: TopicRefusals::default(),
            producing: tokio::sync::RwLock::new(()),
            clock_refusals: ClockRefusals::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KafkaPublisherConfig {
        &self.config
    }

    /// The producer, for [`check_brokers`](super::check_brokers) or a `flush` at shutdown.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// The Kafka topic of an outbox topic.
    fn topic<'a>(&self, topic: &'a str) -> Cow<'a, str> {
        if self.config.topic_prefix.is_empty() {
            Cow::Borrowed(topic)
        } else {
            Cow::Owned(format!("{}{topic}", self.config.topic_prefix))
        }
    }

    /// Hands one message to librdkafka without waiting for it. A refusal says whether it
    /// was the topic's authorization (librdkafka refuses at once once it knows).
    fn enqueue(&self, message: &ClaimedMessage) -> Result<DeliveryFuture, (PublishError, bool)> {
        let value = serde_json::to_vec(&message.payload).map_err(|error| {
            let error = PublishError::poison(format!("the payload cannot be serialized: {error}"));
            (error, false)
        })?;
        let topic = self.topic(&message.topic);
        let headers = record_headers(
            &message.headers,
            Some(&message.message_id),
            Some(message.attempts),
            message.trace_id.as_deref(),
        );
        let mut record = FutureRecord::<str, [u8]>::to(&topic)
            .payload(value.as_slice())
            .headers(headers);
        if let Some(key) = message_key(message) {
            record = record.key(key);
        }
        self.producer
            .send_result(record)
            .map_err(|(error, _)| (publish_error(&error, &topic), topic_refused(&error)))
    }
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let deadline = self
            .longest_publish_bound()
            .map(|bound| Instant::now() + bound);
        let Some(producing) = self.producing_side_by_side(deadline).await else {
            return batch
                .iter()
                .map(|message| Err(self.not_started(message)))
                .collect();
        };
        // Everything is enqueued before anything is awaited, so librdkafka sends the batch
        // in as few requests as it can instead of one round trip per message.
        let enqueued_at = std::time::Instant::now();
        let pending: Vec<_> = batch.iter().map(|message| self.enqueue(message)).collect();
        let mut reports = Vec::with_capacity(batch.len());
        for enqueued in pending {
            reports.push(match enqueued {
                Ok(delivery) => Report::Pending(delivery),
                Err((error, topic_refusal)) => Report::Refused(error, topic_refusal),
            });
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut suspects = Vec::new();
        let mut topic_refusals = HashSet::new();
        let mut clock_refusals = HashSet::new();
        let mut timed_out = false;
        for (index, (report, message)) in reports.into_iter().zip(batch).enumerate() {
            let topic = self.topic(&message.topic);
            let outcome = match report {
                Report::Refused(error, topic_refusal) => {
                    if topic_refusal {
                        topic_refusals.insert(index);
                    }
                    Err(error)
                }
                Report::Pending(delivery) => match self.await_report(delivery, deadline).await {
                    Awaited::Delivered(Ok(())) => Ok(()),
                    Awaited::Delivered(Err(error)) if refuses_whole_request(&error) => {
                        suspects.push((index, error));
                        // Judged below, alone.
                        Ok(())
                    }
                    Awaited::Delivered(Err(error)) => {
                        if topic_refused(&error) {
                            topic_refusals.insert(index);
                        }
                        if clock_refused(&error) {
                            clock_refusals.insert(index);
                        }
                        Err(publish_error(&error, &topic))
                    }
                    Awaited::TimedOut(error) => {
                        timed_out = true;
                        Err(PublishError::retriable(format!(
                            "producing to {topic}: no delivery report within the publish's \
                             bound ({:?}); purged from the producer's queue ({error})",
                            self.longest_publish_bound().unwrap_or_default()
                        )))
                    }
                },
            };
            outcomes.push(outcome);
        }
        drop(producing);
        // Alone means no other batch's message in the producer either: the write side waits
        // for the batches produced meanwhile to have their reports (and holds back those
        // that would start), within this publish's bound.
        let alone = match (suspects.is_empty() || timed_out, deadline) {
            (true, _) => None,
            (false, None) => Some(self.producing.write().await),
            (false, Some(deadline)) => {
                timeout_at(self.latest_start(deadline), self.producing.write())
                    .await
                    .ok()
            }
        };
        for (index, error) in suspects {
            outcomes[index] = if alone.is_none() {
                Err(self.not_judged(&batch[index], &error))
            } else {
                let (outcome, clock) = self.produce_alone(&batch[index], &error, deadline).await;
                if clock {
                    clock_refusals.insert(index);
                }
                outcome
            };
        }
        drop(alone);
        let topics: Vec<Cow<'_, str>> = batch.iter().map(|m| self.topic(&m.topic)).collect();
        self.topic_refusals.judge(
            &topics,
            enqueued_at,
            &topic_refusals,
            self.config.authorization_patience,
            &mut outcomes,
        );
        self.clock_refusals.judge(
            &topics,
            &clock_refusals,
            self.config.clock_patience,
            &mut outcomes,
        );
        outcomes
    }

    fn longest_publish(&self) -> Option<Duration> {
        Some(self.longest_publish_bound().unwrap_or(Duration::MAX))
    }

    /// The same as alone: the bound counts from the call, and a call that waits (for
    /// another batch's suspect produced alone) waits inside it, giving up what it cannot
    /// start in time (see [`KafkaPublisher`]).
    fn longest_publish_in_flight(&self, _in_flight: u32) -> Option<Duration> {
        self.longest_publish()
    }

    async fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> Result<(), PublishError> {
        let Some(topic) = self.dead_letter_destination(letter) else {
            return Err(PublishError::poison(format!(
                "outbox row {} has no readable topic, so it has no dead-letter topic; \
                 it stays dead in the outbox. Set KafkaPublisherConfig::\
                 undecodable_topic to send such rows to a topic of their own",
                letter.id()
            )));
        };
        let value = letter.payload_text();
        let key = match letter {
            DeadLetter::Message(message) => message_key(message),
            DeadLetter::Undecodable(_) => None,
        };
        let base = record_headers(headers, letter.message_id(), None, None);
        let first = self
            .produce_dead_letter(&topic, key, value.as_deref(), base.clone())
            .await;
        match first {
            // What made the message poison (its size, above all) refuses its dead letter
            // too: send the letter without the value, so the topic still records the
            // failure and where to find the row.
            Err(error) if error.kind == ErrorKind::Poison && value.is_some() => {
                let headers = base.insert(Header {
                    key: HEADER_VALUE_OMITTED,
                    value: Some(error.message.as_str()),
                });
                self.produce_dead_letter(&topic, key, None, headers).await
            }
            other => other,
        }
    }

    /// `topic_prefix` + the row's topic + `dlq_suffix`; for a row whose topic could not be
    /// read, `undecodable_topic`.
    fn dead_letter_destination(&self, letter: DeadLetter<'_>) -> Option<String> {
        match letter.topic() {
            Some(topic) => Some(format!(
                "{}{topic}{}",
                self.config.topic_prefix, self.config.dlq_suffix
            )),
            None => self.config.undecodable_topic.clone(),
        }
    }
}

/// A message of a batch after its enqueue.
enum Report {
    Pending(DeliveryFuture),
    /// Refused at enqueue; `true` for the topic's authorization.
    Refused(PublishError, bool),
}

/// A delivery report, or the publish's bound passing first.
enum Awaited {
    Delivered(Result<(), KafkaError>),
    /// The bound passed; what was still queued was purged, and this is the report that
    /// came after the purge.
    TimedOut(KafkaError),
}

impl KafkaPublisher {
    /// The longest a publish takes: the batch's reports within the message timeout, then
    /// each suspect's alone within what is left of another; `None` when the message timeout
    /// is 0 (no limit).
    fn longest_publish_bound(&self) -> Option<Duration> {
        (!self.message_timeout.is_zero()).then(|| self.message_timeout * 2 + Self::TIMER_SLACK)
    }

    /// Waits for one delivery report until `deadline`. Past it, whatever the producer still
    /// holds is purged (its queue and its in-flight requests, which librdkafka then
    /// reports at once) so that no copy is sent after the rows are marked failed and
    /// another claim may have taken them.
    async fn await_report(&self, delivery: DeliveryFuture, deadline: Option<Instant>) -> Awaited {
        let Some(deadline) = deadline else {
            return Awaited::Delivered(delivered(delivery.await));
        };
        let mut delivery = delivery;
        match timeout_at(deadline, &mut delivery).await {
            Ok(report) => Awaited::Delivered(delivered(report)),
            Err(_) => {
                self.producer
                    .purge(PurgeConfig::default().queue().inflight().non_blocking());
                let report = delivered(delivery.await);
                Awaited::TimedOut(report.err().unwrap_or(KafkaError::Canceled))
            }
        }
    }

    /// Produces a suspect message alone: no other message of this publisher is queued or
    /// in flight while it is, so the request that carries it carries nothing else, and a
    /// refusal now is this message's own. `true` with a refusal of the record's timestamp.
    async fn produce_alone(
        &self,
        message: &ClaimedMessage,
        batch_error: &KafkaError,
        deadline: Option<Instant>,
    ) -> (PublishOutcome, bool) {
        if deadline.is_some_and(|deadline| Instant::now() > self.latest_start(deadline)) {
            return (Err(self.not_judged(message, batch_error)), false);
        }
        let topic = self.topic(&message.topic);
        let delivery = match self.enqueue(message) {
            Ok(delivery) => delivery,
            Err((error, _)) => return (Err(error), false),
        };
        let outcome = match self.await_report(delivery, deadline).await {
            Awaited::Delivered(Err(error)) if clock_refused(&error) => {
                return (Err(publish_error(&error, &topic)), true);
            }
            Awaited::Delivered(Ok(())) => Ok(()),
            Awaited::Delivered(Err(error)) if refuses_whole_request(&error) => {
                Err(PublishError::poison(format!(
                    "producing to {topic}: {error}; the broker refused this message when it \
                     was produced alone"
                )))
            }
            Awaited::Delivered(Err(error)) => Err(publish_error(&error, &topic)),
            Awaited::TimedOut(error) => Err(PublishError::retriable(format!(
                "producing to {topic} alone, after its batch's request was refused \
                 ({batch_error}): no delivery report in time; purged ({error})"
            ))),
        };
        (outcome, false)
    }

    /// The read side of `producing`, unless `deadline` leaves no time for a message's
    /// report after it: a batch waits while another batch's suspect is produced alone, and
    /// gives up (without producing anything) rather than send messages whose reports
    /// could come after its bound.
    async fn producing_side_by_side(
        &self,
        deadline: Option<Instant>,
    ) -> Option<tokio::sync::RwLockReadGuard<'_, ()>> {
        match deadline {
            None => Some(self.producing.read().await),
            Some(deadline) => timeout_at(self.latest_start(deadline), self.producing.read())
                .await
                .ok(),
        }
    }

    /// The latest a message may be enqueued and still have its report (within the message
    /// timeout and librdkafka's timer) by `deadline`.
    fn latest_start(&self, deadline: Instant) -> Instant {
        deadline
            .checked_sub(self.message_timeout + Self::TIMER_SLACK)
            .unwrap_or(deadline)
    }

    /// A message of a batch that could not start in time: another batch's suspects held
    /// the producer. Not at fault, so handed back without counting an attempt.
    fn not_started(&self, message: &ClaimedMessage) -> PublishError {
        PublishError::backpressure(format!(
            "producing to {}: not sent; another batch's suspect messages were being produced \
             alone for longer than this publish could wait, so it is handed back",
            self.topic(&message.topic)
        ))
    }

    /// A suspect there was no time left to produce alone: retried, never judged poison on
    /// another message's account.
    fn not_judged(&self, message: &ClaimedMessage, batch_error: &KafkaError) -> PublishError {
        PublishError::retriable(format!(
            "producing to {}: the broker refused the request that held this message and \
             others ({batch_error}); there was no time left in this publish to produce it \
             alone and see whether it is at fault, so it is tried again",
            self.topic(&message.topic)
        ))
    }

    async fn produce_dead_letter(
        &self,
        topic: &str,
        key: Option<&str>,
        value: Option<&str>,
        headers: OwnedHeaders,
    ) -> Result<(), PublishError> {
        let mut record = FutureRecord::<str, [u8]>::to(topic).headers(headers);
        if let Some(value) = value {
            record = record.payload(value.as_bytes());
        }
        if let Some(key) = key {
            record = record.key(key);
        }
        // Side by side with batches, never inside a suspect's request.
        let _producing = self.producing.read().await;
        let delivery = self
            .producer
            .send_result(record)
            .map_err(|(error, _)| publish_error(&error, topic))?;
        delivered(delivery.await).map_err(|error| publish_error(&error, topic))
    }
}

/// A delivery report's error, if it has one.
fn delivered<E>(report: std::result::Result<OwnedDeliveryResult, E>) -> Result<(), KafkaError> {
    match report {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(error),
        // The report's sender was dropped: the producer went away before reporting.
        Err(_) => Err(KafkaError::Canceled),
    }
}

/// A librdkafka error as the relay's error, judged by the classify table.
fn publish_error(error: &KafkaError, topic: &str) -> PublishError {
    PublishError::new(classify(error), format!("producing to {topic}: {error}"))
}
