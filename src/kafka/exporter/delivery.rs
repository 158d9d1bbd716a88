//! Delivering one page: every message produced, every delivery report awaited, a failed
//! delivery judged by [`classify`] and produced again after a bounded back-off from the
//! first failed message on, a refused request's suspects produced alone, poison and fatal
//! errors turned into the error that stops the export naming the event.

use rdkafka::error::KafkaError;
use rdkafka::producer::DeliveryFuture;

use crate::error::{Error, Result};
use crate::reader::exponential;
use crate::relay::ErrorKind;

use super::super::classify::{classify, clock_refused, refuses_whole_request, topic_refused};
use super::cursors::ExportCursors;
use super::job::{Job, Stop};
use super::message::Message;

/// What delivering one page came to.
pub(super) enum Delivered {
    /// Every message acknowledged.
    All,
    /// Shutdown's grace passed before the page was acknowledged: not to be saved.
    GivenUp,
}

impl<C: ExportCursors> Job<C> {
    /// Produces every message of a page of `shard` and waits until all are acknowledged,
    /// producing again from the first failure on after a retriable one.
    pub(super) async fn deliver(
        &self,
        shard: i32,
        messages: &[Message],
        stop: &mut Stop,
    ) -> Result<Delivered> {
        let shard_text = shard.to_string();
        let grace = self.config.shutdown_grace;
        let mut first = 0;
        let mut failures: u32 = 0;
        while first < messages.len() {
            let (reports, refused) = {
                let producing = tokio::select! {
                    guard = self.producing.read() => guard,
                    () = stop.grace_over(grace) => return Ok(Delivered::GivenUp),
                };
                let (deliveries, refused) = self.enqueue(&messages[first..], &shard_text);
                let reports = tokio::select! {
                    reports = reports_in_order(deliveries) => reports,
                    () = stop.grace_over(grace) => return Ok(Delivered::GivenUp),
                };
                drop(producing);
                (reports, refused)
            };
            let failed = reports
                .iter()
                .position(Option::is_some)
                .map(|offset| (offset, reports[offset].clone().expect("a failed report")))
                .or(refused);
            let Some((offset, error)) = failed else {
                break;
            };
            let mut index = first + offset;
            // A broker refuses a whole request for one bad message in it: the events it
            // refused are only suspect until one is refused alone, and the error must never
            // name a bystander. They are produced alone, in order, up to the first that is
            // refused alone (or the first the request did not refuse).
            let error = if offset < reports.len() && refuses_whole_request(&error) {
                let mut refused_alone = None;
                while let Some(Some(batch_error)) = reports.get(index - first) {
                    if !refuses_whole_request(batch_error) {
                        break;
                    }
                    match self
                        .produce_alone(&messages[index], &shard_text, stop)
                        .await
                    {
                        None => return Ok(Delivered::GivenUp),
                        Some(Ok(())) => index += 1,
                        Some(Err(error)) => {
                            refused_alone = Some(error);
                            break;
                        }
                    }
                }
                match refused_alone {
                    Some(error) => error,
                    None => {
                        first = index;
                        failures = 0;
                        continue;
                    }
                }
            } else {
                error
            };
            let message = &messages[index];
            // The export has one topic: its refusal is every topic's, so it is fatal; so is
            // its refusing the timestamps, which are this host's clock, not the event's.
            let kind = if topic_refused(&error) || clock_refused(&error) {
                ErrorKind::Fatal
            } else {
                classify(&error)
            };
            match kind {
                ErrorKind::Retriable | ErrorKind::Backpressure => {
                    failures = if index > first { 1 } else { failures + 1 };
                    let delay = exponential(
                        self.config.backoff_min,
                        self.config.backoff_max,
                        failures - 1,
                    );
                    let again = (messages.len() - index) as u64;
                    self.progress.retried(again);
                    self.metrics.retried(again);
                    tracing::warn!(
                        feed = %self.messages.feed_name, shard, ulid = %message.ulid, %error,
                        kind = kind.as_str(), again, delay_ms = delay.as_millis() as u64,
                        "export: delivery failed, producing the rest of the page again"
                    );
                    first = index;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stop.grace_over(grace) => return Ok(Delivered::GivenUp),
                    }
                }
                ErrorKind::Poison | ErrorKind::Fatal => {
                    return Err(self.stopping_error(shard, message, &error, kind));
                }
            }
        }
        Ok(Delivered::All)
    }

    /// The error that stops the export for `message`, refused as `kind` (poison or fatal),
    /// with what to do about it.
    fn stopping_error(
        &self,
        shard: i32,
        message: &Message,
        error: &KafkaError,
        kind: ErrorKind,
    ) -> Error {
        let advice = if clock_refused(error) {
            "the topic refuses the records' timestamps, which are this host's clock at \
             produce time, not the event's: the clock (or the broker's) is off by more than \
             the topic's message.timestamp.before.max.ms / message.timestamp.after.max.ms \
             (message.timestamp.difference.max.ms before Kafka 3.6) allow; set the clock \
             right or change those settings, then export again"
        } else if kind == ErrorKind::Poison {
            "this event can never be produced as it is (e.g. larger than the producer's \
             message.max.bytes or the topic's max.message.bytes): raise the limit, or skip \
             the event by saving a cursor at its ULID, then export again"
        } else {
            "the producer cannot work (credentials, the topic's ACLs, configuration): fix \
             that and export again"
        };
        let feed = &self.messages.feed_name;
        tracing::error!(
            feed = %feed, shard, ulid = %message.ulid, %error,
            kind = kind.as_str(), "export: stopping"
        );
        Error::Kafka {
            code: error.rdkafka_error_code().map(|code| format!("{code:?}")),
            message: format!(
                "producing event {} of {feed} shard {shard} to topic {} failed ({}: \
                 {error}); its page's cursor was not saved, the export resumes before it. \
                 What to do: {advice}",
                message.ulid,
                self.config.topic,
                kind.as_str()
            ),
        }
    }

    /// Produces one suspect event alone: under the write side of `producing`, so no other
    /// message of the producer is queued or in flight and its request carries it only.
    /// `None` when shutdown's grace passed first.
    async fn produce_alone(
        &self,
        message: &Message,
        shard: &str,
        stop: &mut Stop,
    ) -> Option<std::result::Result<(), KafkaError>> {
        let grace = self.config.shutdown_grace;
        let alone = async {
            let _alone = self.producing.write().await;
            let (deliveries, refused) = self.enqueue(std::slice::from_ref(message), shard);
            if let Some((_, error)) = refused {
                return Err(error);
            }
            match deliveries.into_iter().next() {
                Some(delivery) => delivery_error(delivery.await).map_or(Ok(()), Err),
                None => Err(KafkaError::Canceled),
            }
        };
        tokio::select! {
            result = alone => Some(result),
            () = stop.grace_over(grace) => None,
        }
    }

    /// Enqueues `messages` in order until the producer refuses one (its queue is full, the
    /// message too large): the deliveries of those enqueued, and the refusal with the
    /// refused message's offset in `messages`.
    fn enqueue(
        &self,
        messages: &[Message],
        shard: &str,
    ) -> (Vec<DeliveryFuture>, Option<(usize, KafkaError)>) {
        let mut deliveries = Vec::with_capacity(messages.len());
        for (offset, message) in messages.iter().enumerate() {
            let record = self.messages.record(&self.config.topic, message, shard);
            match self.producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((error, _record)) => return (deliveries, Some((offset, error))),
            }
        }
        (deliveries, None)
    }
}

/// Each delivery's failure, if it failed, in the order produced. The reports are awaited
/// one after the other rather than all at once (`join_all`): a page's reports arrive about
/// in order, so awaiting the oldest mostly finds the next ones already there, and only the
/// report being awaited can wake the task, where with `join_all` each report could.
async fn reports_in_order(deliveries: Vec<DeliveryFuture>) -> Vec<Option<KafkaError>> {
    let mut reports = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        reports.push(delivery_error(delivery.await));
    }
    reports
}

/// The failure of one delivery report, if it failed. A report that never comes (the
/// producer was closed under it) counts as a retriable failure.
fn delivery_error(
    result: std::result::Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> Option<KafkaError> {
    match result {
        Ok(Ok(_delivery)) => None,
        Ok(Err((error, _message))) => Some(error),
        Err(_canceled) => Some(KafkaError::Canceled),
    }
}
