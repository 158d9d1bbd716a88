//! The broker side of the relay: [`Publisher`], its per-message outcomes, and the
//! dead-letter headers.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::outbox::{ClaimToken, ClaimedMessage, Headers, UndecodableMessage};

/// Dead-letter header: the topic the message was meant for.
pub const HEADER_ORIGINAL_TOPIC: &str = "x-original-topic";
/// Dead-letter header: the message's failed attempts, this last one included.
pub const HEADER_ATTEMPTS: &str = "x-attempts";
/// Dead-letter header: the last error's message.
pub const HEADER_ERROR: &str = "x-error";
/// Dead-letter header: the last error's kind (`retriable` when out of attempts, `poison`).
pub const HEADER_ERROR_KIND: &str = "x-error-kind";

/// A message going to the dead-letter destination: a decoded message, or a claimed row that
/// could not be decoded, which carries its columns' raw text instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeadLetter<'a> {
    /// A message that failed to publish (poison, out of attempts).
    Message(&'a ClaimedMessage),
    /// A row whose payload or headers could not be decoded; never published.
    Undecodable(&'a UndecodableMessage),
}

impl<'a> DeadLetter<'a> {
    /// The outbox row's id.
    pub fn id(&self) -> i64 {
        match self {
            DeadLetter::Message(message) => message.id,
            DeadLetter::Undecodable(row) => row.id,
        }
    }

    /// The idempotency key, when known.
    pub fn message_id(&self) -> Option<&'a str> {
        match self {
            DeadLetter::Message(message) => Some(&message.message_id),
            DeadLetter::Undecodable(row) => row.message_id.as_deref(),
        }
    }

    /// The topic the message was meant for, when known.
    pub fn topic(&self) -> Option<&'a str> {
        match self {
            DeadLetter::Message(message) => Some(&message.topic),
            DeadLetter::Undecodable(row) => row.topic.as_deref(),
        }
    }

    /// The payload as text: a decoded message's JSON, or an undecodable row's raw column
    /// (`None` when even that could not be read).
    pub fn payload_text(&self) -> Option<Cow<'a, str>> {
        match self {
            DeadLetter::Message(message) => Some(Cow::Owned(message.payload.to_string())),
            DeadLetter::Undecodable(row) => row.payload.as_deref().map(Cow::Borrowed),
        }
    }

    /// Failed attempts before this one.
    pub fn attempts(&self) -> i32 {
        match self {
            DeadLetter::Message(message) => message.attempts,
            DeadLetter::Undecodable(row) => row.attempts,
        }
    }

    /// The token the row is held under.
    pub fn claim_token(&self) -> ClaimToken {
        match self {
            DeadLetter::Message(message) => message.claim_token,
            DeadLetter::Undecodable(row) => row.claim_token,
        }
    }
}

/// What kind of failure a publish was, which decides what the relay does with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A failure that may pass (broker unreachable, timeout, leader election): the message
    /// is marked failed and retried after the [`RetryPolicy`](super::RetryPolicy)'s delay,
    /// or marked dead when this failure reaches `max_attempts`.
    Retriable,
    /// This message can never be published (too large, rejected by a schema, cannot be
    /// serialized): it is marked dead at once and handed to the dead-letter publish. The
    /// rest of the batch is unaffected.
    Poison,
    /// The publisher cannot work at all (bad credentials, no permission on any topic,
    /// wrong configuration): the message is not at fault, so it is handed back (requeued,
    /// due at once, no attempt counted; not dead, not dead-lettered), the rest of the batch
    /// is acknowledged by its outcomes, and then the relay stops with an
    /// [`Error::Publisher`](crate::Error::Publisher) naming the error, because every
    /// further claim would fail the same way and burn the attempts of healthy messages.
    /// The message is claimed again by the next relay that runs, after the fix.
    Fatal,
    /// The broker asks to slow down: the message is handed back without counting an
    /// attempt, due again after the retry policy's `initial` delay, and the relay waits that
    /// long before its next claim.
    Backpressure,
}

impl ErrorKind {
    /// The lower-case name used in the `x-error-kind` header and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Retriable => "retriable",
            ErrorKind::Poison => "poison",
            ErrorKind::Fatal => "fatal",
            ErrorKind::Backpressure => "backpressure",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one message could not be published.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} publish error: {message}")]
pub struct PublishError {
    /// What the relay should do about it.
    pub kind: ErrorKind,
    /// What went wrong, for the outbox's error column, the dead-letter headers and logs.
    pub message: String,
}

impl PublishError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        PublishError {
            kind,
            message: message.into(),
        }
    }

    /// A failure worth retrying later.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retriable, message)
    }

    /// A message that can never be published.
    pub fn poison(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Poison, message)
    }

    /// A publisher that cannot work at all; stops the relay.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fatal, message)
    }

    /// The broker asks to slow down.
    pub fn backpressure(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Backpressure, message)
    }
}

/// The result of publishing one message.
pub type PublishOutcome = Result<(), PublishError>;

/// Sends claimed messages to a broker.
///
/// The relay calls [`publish`](Self::publish) with each claimed batch and acknowledges
/// every message by its outcome. Delivery is at least once: a message whose
/// acknowledgement is lost (a crash, an expired claim) is published again, so publish
/// [`ClaimedMessage::message_id`] for consumers to drop duplicates.
///
/// ```
/// use changefeed::outbox::ClaimedMessage;
/// use changefeed::relay::{PublishError, PublishOutcome, Publisher};
///
/// /// Prints each message as a JSON line.
/// struct Stdout;
///
/// impl Publisher for Stdout {
///     async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
///         batch
///             .iter()
///             .map(|m| match serde_json::to_string(&m.payload) {
///                 Ok(json) => {
///                     println!("{} {} {json}", m.topic, m.message_id);
///                     Ok(())
///                 }
///                 Err(e) => Err(PublishError::poison(e.to_string())),
///             })
///             .collect()
///     }
/// }
/// ```
pub trait Publisher: Send + Sync {
    /// Publishes a batch and returns one outcome per message, in the batch's order.
    ///
    /// A message's failure must not fail the others: return its own error and carry on.
    /// Returning fewer or more outcomes than messages, panicking, or taking longer than
    /// the claim timeout are bugs the relay survives: it reports them through
    /// [`Hooks::on_loop_error`](super::Hooks::on_loop_error) and treats every message
    /// without an outcome as a retriable failure.
    fn publish(&self, batch: &[ClaimedMessage])
    -> impl Future<Output = Vec<PublishOutcome>> + Send;

    /// The longest one [`publish`](Self::publish) call can take, when the publisher bounds
    /// it (`Duration::MAX` for a publish with no bound at all); `None` (the default): not
    /// stated, and the relay's own time-out at `claim_timeout` is the only bound.
    ///
    /// [`Relay::new`](super::Relay::new) refuses a publisher whose longest publish is not
    /// comfortably inside the claim timeout (at most three quarters of it): a publish still
    /// running when its claim expires lets another relay claim and publish the same messages
    /// and their successors, and the late copy then lands out of order.
    fn longest_publish(&self) -> Option<std::time::Duration> {
        None
    }

    /// The longest one [`publish`](Self::publish) call can take, counted from the call,
    /// while up to `in_flight` calls (this one included) are under way at once: the relay
    /// with [`max_in_flight`](super::RelayConfig::max_in_flight) above 1 publishes the next
    /// batch before the earlier ones are delivered. `None` when
    /// [`longest_publish`](Self::longest_publish) is.
    ///
    /// The default assumes the calls may queue behind each other (one connection behind a
    /// lock, say), so a call can wait for every other one first: `in_flight` ×
    /// `longest_publish`. A publisher whose calls run side by side, or whose bound already
    /// counts its waits from the call's start, says so by returning `longest_publish`
    /// (the Kafka publisher does).
    /// [`RelayConfig::check_publisher`](super::RelayConfig::check_publisher) holds this to
    /// three quarters of the claim timeout.
    fn longest_publish_in_flight(&self, in_flight: u32) -> Option<std::time::Duration> {
        self.longest_publish()
            .map(|longest| longest.saturating_mul(in_flight.max(1)))
    }

    /// Hands a message that just went dead to a dead-letter destination. `headers` are
    /// the message's own headers plus [`HEADER_ORIGINAL_TOPIC`], [`HEADER_ATTEMPTS`],
    /// [`HEADER_ERROR`] and [`HEADER_ERROR_KIND`].
    ///
    /// A claimed row that could not be decoded comes as [`DeadLetter::Undecodable`], with
    /// its payload's and headers' raw text (use [`DeadLetter::payload_text`] to forward
    /// either kind); its headers here are only the dead-letter ones.
    ///
    /// The relay calls it for every dead letter of a batch at once, and waits for them
    /// until three quarters of the claim timeout after the claim (the last quarter is for
    /// marking the rows dead while the claim still holds them); a call still running then
    /// is dropped and counts as failed.
    ///
    /// The default does nothing: the dead row stays in the outbox (dead rows are never
    /// purged), which is a dead-letter queue of its own. An error here (or the bound
    /// passing, or a panic) is reported through
    /// [`Hooks::on_dead_letter_failed`](super::Hooks::on_dead_letter_failed) and counted
    /// (`changefeed_relay_dead_letters_failed_total`), and the message is marked dead anyway,
    /// with both errors and both destinations in its `last_error`: retrying it would publish
    /// a message already judged unpublishable, and its dead row keeps it for an operator.
    fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let _ = (letter, headers);
        async { Ok(()) }
    }

    /// Where [`publish_dead_letter`](Self::publish_dead_letter) sends `letter` (a topic, a
    /// queue), for the row's `last_error` when the dead letter fails; `None` (the default)
    /// when there is no such place or it is not stated.
    fn dead_letter_destination(&self, letter: DeadLetter<'_>) -> Option<String> {
        let _ = letter;
        None
    }
}

/// Lets a caller keep a handle on the publisher it gave the relay.
impl<P: Publisher> Publisher for Arc<P> {
    fn publish(
        &self,
        batch: &[ClaimedMessage],
    ) -> impl Future<Output = Vec<PublishOutcome>> + Send {
        (**self).publish(batch)
    }

    fn longest_publish(&self) -> Option<std::time::Duration> {
        (**self).longest_publish()
    }

    fn longest_publish_in_flight(&self, in_flight: u32) -> Option<std::time::Duration> {
        (**self).longest_publish_in_flight(in_flight)
    }

    fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish_dead_letter(letter, headers)
    }

    fn dead_letter_destination(&self, letter: DeadLetter<'_>) -> Option<String> {
        (**self).dead_letter_destination(letter)
    }
}

/// The headers of a dead letter: the message's own (none for an undecodable row), plus
/// where it was going (when known), how many attempts it failed (`attempts`, this failure
/// included) and the last error.
pub fn dead_letter_headers(letter: DeadLetter<'_>, attempts: u32, error: &PublishError) -> Headers {
    let mut headers = match letter {
        DeadLetter::Message(message) => message.headers.clone(),
        DeadLetter::Undecodable(_) => Headers::new(),
    };
    if let Some(topic) = letter.topic() {
        headers.insert(HEADER_ORIGINAL_TOPIC.to_owned(), topic.to_owned());
    }
    headers.insert(HEADER_ATTEMPTS.to_owned(), attempts.to_string());
    headers.insert(HEADER_ERROR.to_owned(), error.message.clone());
    headers.insert(HEADER_ERROR_KIND.to_owned(), error.kind.as_str().to_owned());
    headers
}
