//! The claim-style outbox (ARCHITECTURE.md, "The claim protocol"): messages enqueued in the
//! business transaction, claimed in batches by any number of relays, acknowledged with a
//! fenced token.
//!
//! This module holds the message types and [`ClaimStore`], the operations a relay needs.
//! [`crate::outbox_store::SqlClaimStore`] implements it over the SQL Server procedures;
//! [`crate::relay::Relay`] drives it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::Result;

/// A claim's fencing token (`claim_token uniqueidentifier`): acknowledgements change only
/// rows still held under it, so a relay whose claim expired cannot clobber a newer claim.
///
/// It is a plain UUID (the `uuid` crate's type), so a claim store over another database
/// can hand out the same tokens; nothing of the SQL Server driver shows through.
///
/// ```
/// use changefeed::outbox::ClaimToken;
///
/// let token = ClaimToken::from_bytes([7; 16]);
/// assert_eq!(token.as_bytes(), &[7; 16]);
/// assert_eq!(ClaimToken::new(*token.as_uuid()), token);
/// assert_eq!(token.to_string(), "07070707-0707-0707-0707-070707070707");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// The token for a UUID.
    pub const fn new(uuid: uuid::Uuid) -> Self {
        ClaimToken(uuid)
    }

    /// The token for 16 bytes, in the UUID's textual (big-endian) order.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        ClaimToken(uuid::Uuid::from_bytes(bytes))
    }

    /// The token as a UUID.
    pub const fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }

    /// The token's 16 bytes, in the UUID's textual (big-endian) order.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl From<uuid::Uuid> for ClaimToken {
    fn from(uuid: uuid::Uuid) -> Self {
        ClaimToken(uuid)
    }
}

impl fmt::Display for ClaimToken {
    /// The hyphenated lower-case UUID, e.g. `67e55044-10b1-426f-9247-bb680e5fe0c8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Message headers: string keys and values, stored as a JSON object.
pub type Headers = BTreeMap<String, String>;

/// A message to enqueue.
#[derive(Clone, Debug, PartialEq)]
pub struct NewMessage {
    /// Where the relay publishes it (a Kafka topic, a queue name).
    pub topic: String,
    /// The body, stored as JSON.
    pub payload: serde_json::Value,
    /// The kind of aggregate the message is about (e.g. `order`).
    pub aggregate_type: Option<String>,
    /// The aggregate's id: messages of one aggregate are delivered one at a time, in order.
    /// `None` means the message is not ordered after any other.
    pub aggregate_id: Option<String>,
    /// The broker partition key; `None` means the aggregate id.
    pub partition_key: Option<String>,
    /// Headers, stored as a JSON object.
    pub headers: Headers,
    /// An idempotency key (at most 64 characters); `None` lets the server make one.
    pub message_id: Option<String>,
    /// A trace id to carry to the broker.
    pub trace_id: Option<String>,
}

impl NewMessage {
    /// A message with a topic and a payload and nothing else.
    pub fn new(topic: impl Into<String>, payload: serde_json::Value) -> Self {
        NewMessage {
            topic: topic.into(),
            payload,
            aggregate_type: None,
            aggregate_id: None,
            partition_key: None,
            headers: Headers::new(),
            message_id: None,
            trace_id: None,
        }
    }

    /// Orders the message after earlier messages of the same aggregate.
    pub fn aggregate(mut self, aggregate_type: impl Into<String>, id: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self.aggregate_id = Some(id.into());
        self
    }
}

/// What `enqueue` returns: the row id and the message id (given or made by the server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The outbox row's id.
    pub id: i64,
    /// The idempotency key.
    pub message_id: String,
}

/// A message a claim handed to this relay.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedMessage {
    /// The outbox row's id.
    pub id: i64,
    /// The idempotency key; publish it so consumers can drop duplicates.
    pub message_id: String,
    /// The destination.
    pub topic: String,
    /// The aggregate kind, if any.
    pub aggregate_type: Option<String>,
    /// The aggregate id, if any.
    pub aggregate_id: Option<String>,
    /// The partition key (the aggregate id when none was given).
    pub partition_key: Option<String>,
    /// The body.
    pub payload: serde_json::Value,
    /// The headers.
    pub headers: Headers,
    /// The trace id, if any.
    pub trace_id: Option<String>,
    /// Failed attempts so far (explicit failures and expired claims).
    pub attempts: i32,
    /// The token this claim holds the row under.
    pub claim_token: ClaimToken,
}

/// A claimed row whose message cannot be decoded: its payload or headers are not JSON this
/// crate can read (a number out of range such as `[1e400]`, a lone surrogate escape such as
/// `"\ud800"`, headers that are not a JSON object), or a column does not fit its type.
///
/// The row is claimed like any other, so the relay can acknowledge it: it is marked dead at
/// once (a [`Poison`](crate::relay::ErrorKind::Poison) outcome) and handed to the
/// dead-letter publish with its raw text, and the rest of its batch goes on. The raw columns
/// are kept as the server sent them, `None` where even the text could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndecodableMessage {
    /// The outbox row's id.
    pub id: i64,
    /// The idempotency key, if it could be read.
    pub message_id: Option<String>,
    /// The destination, if it could be read.
    pub topic: Option<String>,
    /// The payload column's raw text.
    pub payload: Option<String>,
    /// The headers column's raw text (`None` also when the column is NULL).
    pub headers: Option<String>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// The token this claim holds the row under.
    pub claim_token: ClaimToken,
    /// Why the row could not be decoded: the column and the reason.
    pub error: String,
}

/// One row of a claim: a message to publish, or a row that cannot be decoded (which the
/// relay marks dead instead of failing the whole claim).
#[derive(Clone, Debug, PartialEq)]
pub enum Claimed {
    /// A decoded message.
    Message(ClaimedMessage),
    /// A row whose payload, headers or columns could not be decoded.
    Undecodable(UndecodableMessage),
}

impl Claimed {
    /// The outbox row's id.
    pub fn id(&self) -> i64 {
        match self {
            Claimed::Message(message) => message.id,
            Claimed::Undecodable(row) => row.id,
        }
    }

    /// The token the claim holds the row under.
    pub fn claim_token(&self) -> ClaimToken {
        match self {
            Claimed::Message(message) => message.claim_token,
            Claimed::Undecodable(row) => row.claim_token,
        }
    }

    /// The decoded message, or `None` for an undecodable row.
    pub fn message(&self) -> Option<&ClaimedMessage> {
        match self {
            Claimed::Message(message) => Some(message),
            Claimed::Undecodable(_) => None,
        }
    }
}

impl From<ClaimedMessage> for Claimed {
    fn from(message: ClaimedMessage) -> Self {
        Claimed::Message(message)
    }
}

impl From<UndecodableMessage> for Claimed {
    fn from(row: UndecodableMessage) -> Self {
        Claimed::Undecodable(row)
    }
}

/// One failed message's acknowledgement ([`ClaimStore::mark_failed`]): which message,
/// under which claim, and what becomes of it. [`Failed::retry`] and [`Failed::dead`] build
/// the two cases a relay sends.
#[derive(Debug, Clone, Copy)]
pub struct Failed<'a> {
    /// The message's id.
    pub id: i64,
    /// The claim the message must still be held under; a message claimed again since (its
    /// claim expired) is left alone.
    pub token: ClaimToken,
    /// Due again after this long; ignored when `dead`. `None` with `dead` false is refused
    /// by every store (a failed message needs a time to be due again).
    pub retry_after: Option<Duration>,
    /// Dead: not claimed again until redriven.
    pub dead: bool,
    /// Why, kept in the row's `last_error` (its first 2,000 characters).
    pub error: &'a str,
}

impl<'a> Failed<'a> {
    /// Failed, due again after `after`.
    pub fn retry(id: i64, token: ClaimToken, after: Duration, error: &'a str) -> Self {
        Failed {
            id,
            token,
            retry_after: Some(after),
            dead: false,
            error,
        }
    }

    /// Dead.
    pub fn dead(id: i64, token: ClaimToken, error: &'a str) -> Self {
        Failed {
            id,
            token,
            retry_after: None,
            dead: true,
            error,
        }
    }
}

/// How far the claim under way has got, for a store whose claim waits for work
/// ([`ClaimStore::claim_progress`]): still **waiting** (it has taken no row, so stopping it
/// loses nothing), or **answering** (it has committed rows as claimed, so stopping it would
/// leave them held by nobody until the claim timeout, and their next claim would count an
/// attempt each).
///
/// One shared flag, cheap to clone: the store keeps one clone and raises it from inside its
/// claim once the claim has passed the point where it waits; the relay keeps another,
/// lowers it before each claim, and reads it when a batch in flight needs the store.
///
/// ```
/// use changefeed::outbox::ClaimProgress;
///
/// let store_side = ClaimProgress::new();
/// let relay_side = store_side.clone();
/// relay_side.waiting();
/// assert!(!relay_side.is_answering());
/// store_side.answering();
/// assert!(relay_side.is_answering());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClaimProgress(Arc<AtomicBool>);

impl ClaimProgress {
    /// A flag that says waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// A claim begins: it is waiting until it says it answers.
    pub fn waiting(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// The claim has passed the point where it waits: it has committed rows as claimed (or
    /// is returning an empty answer), and must be let finish. Raised by the store, from
    /// inside its claim, as soon as it knows.
    pub fn answering(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the claim under way has said it is answering.
    pub fn is_answering(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The operations a relay performs on the outbox; implemented over SQL Server by
/// `SqlClaimStore`, over MariaDB/MySQL and PostgreSQL by their stores, and by fakes in tests.
///
/// A store that wraps another (to time or count its calls, say) must forward
/// [`claim_waits`](Self::claim_waits), [`cancel_claim`](Self::cancel_claim),
/// [`claim_progress`](Self::claim_progress) and [`outbox_name`](Self::outbox_name) too, not
/// leave them to their defaults. A wrapper of
/// `SqlClaimStore` that says its claims do not wait lets the relay start a claim beside
/// every batch in flight; that claim then holds the store's connection, waiting on the
/// server, while the batch's acknowledgement queues behind it, and with a claim timeout
/// shorter than the wait the claim takes the batch's messages back before they are
/// acknowledged, again and again.
pub trait ClaimStore: Send {
    /// Claims up to `batch_size` due messages, head of aggregate only, ordered by id.
    ///
    /// Rows are decoded one by one: a row that cannot be decoded comes back as
    /// [`Claimed::Undecodable`] (still claimed under the batch's token) instead of failing
    /// the call, so one bad row cannot stall the relay.
    fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>>> + Send;

    /// Marks messages done; returns how many were still held under `token`.
    fn mark_done(
        &mut self,
        ids: &[i64],
        token: ClaimToken,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Marks one message failed, due again after `failed.retry_after`, or dead when
    /// `failed.dead` (then `retry_after` is ignored). Counts an attempt. Returns 1 if the
    /// message was still held under `failed.token`, else 0.
    fn mark_failed(&mut self, failed: Failed<'_>) -> impl Future<Output = Result<u64>> + Send;

    /// Hands a message back, due again after `after`, without counting an attempt
    /// (backpressure). Returns 1 if it was still held under `token`, else 0.
    fn requeue(
        &mut self,
        id: i64,
        token: ClaimToken,
        after: Duration,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Whether a [`claim`](Self::claim) may wait on the server for messages when none is
    /// due (SQL Server's `@wait_ms`), so that it can last long with nothing wrong. A relay
    /// that stops while such a claim waits abandons it at once and calls
    /// [`cancel_claim`](Self::cancel_claim), instead of granting it
    /// [`SHUTDOWN_CLAIM_GRACE`](crate::relay::SHUTDOWN_CLAIM_GRACE) to answer (a claim that
    /// says it answers, [`claim_progress`](Self::claim_progress), gets the grace). Default:
    /// `false`.
    fn claim_waits(&self) -> bool {
        false
    }

    /// Stops, on the server, the claim whose future was dropped before it answered, if the
    /// store can; bounded in time. Default: nothing.
    fn cancel_claim(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// For a store whose claim waits ([`claim_waits`](Self::claim_waits)): the flag its
    /// claims raise once they have passed the point where they wait ([`ClaimProgress`]).
    /// The relay then stops a claim for a batch in flight that needs the store (or for
    /// shutdown) only while the claim still waits; one that answers is let finish and the
    /// acknowledgement goes next. Default `None`: the relay cannot tell, and stops a waiting
    /// claim whenever a batch in flight needs the store, even one that has just claimed
    /// rows (those are claimed again after the claim timeout, an attempt each).
    fn claim_progress(&self) -> Option<ClaimProgress> {
        None
    }

    /// Another handle onto this store whose calls may run while this handle's (and other
    /// handles') do, or `None` (the default): one call at a time. A
    /// [`Relay`](crate::relay::Relay) claims through the store and sends each
    /// acknowledgement on a handle of its own as soon as it is ready, before its next claim,
    /// so an acknowledgement does not wait for a claim to answer, nor a claim for an
    /// acknowledgement. [`PostgresOutboxStore`](crate::postgres::PostgresOutboxStore)'s
    /// handles share its connection, on which tokio-postgres sends a call while the ones
    /// before it run, in the order they were first polled: the server runs them back to back,
    /// each its own transaction, with no round trip between them, so an acknowledgement sent
    /// before a claim has made its aggregates' next messages due for it. Every call keeps its
    /// own guarantees (a claim never takes a claimed row, every acknowledgement is fenced by
    /// its token), so correctness never rests on their order; only how many heads of
    /// aggregates a relay keeps claimed does.
    fn concurrent_handle(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// The outbox's name as metrics and logs label it (`dbo.outbox`, `outbox`): the
    /// `outbox` label of every relay metric ([`crate::metrics`]). The default, for stores
    /// that do not say, is empty, which Prometheus treats as no label.
    fn outbox_name(&self) -> String {
        String::new()
    }
}

/// Every backlog count stops here: a count this high means "at least this many". Each
/// count reads at most this many index entries, so the backlog query costs the same on an
/// outbox of a billion rows as on one of a hundred thousand open or dead ones.
pub const BACKLOG_COUNT_LIMIT: u64 = 100_000;

/// An outbox's backlog at one moment, as the stores' `backlog` calls read it: what waits,
/// what is in flight, what is dead, and how long the oldest unpublished message has
/// waited. Cheap enough to read every few seconds on a large outbox (each store's `backlog`
/// says how); counts stop at [`BACKLOG_COUNT_LIMIT`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OutboxBacklog {
    /// Messages waiting for their first claim (status 0).
    pub pending: u64,
    /// Messages claimed by a relay and not yet acknowledged (status 1), expired claims
    /// included.
    pub processing: u64,
    /// Messages that failed and wait for their retry (status 3).
    pub failed: u64,
    /// Messages marked dead (status 4); they stay until an operator redrives or deletes
    /// them.
    pub dead: u64,
    /// How long the oldest open message (pending, processing or failed: not yet published
    /// and not dead) has been in the outbox, by the database's clock; `None` when there is
    /// none.
    #[serde(rename = "oldest_open_age_seconds", serialize_with = "seconds")]
    pub oldest_open_age: Option<Duration>,
}

impl OutboxBacklog {
    /// A backlog from the counts and the oldest open message's age in milliseconds (what
    /// the stores' queries return; a negative age, from a clock step, counts as zero).
    pub fn new(pending: u64, processing: u64, failed: u64, dead: u64, age_ms: Option<i64>) -> Self {
        OutboxBacklog {
            pending,
            processing,
            failed,
            dead,
            oldest_open_age: age_ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        }
    }

    /// Whether any count reached [`BACKLOG_COUNT_LIMIT`] (and so may be larger).
    pub fn is_capped(&self) -> bool {
        [self.pending, self.processing, self.failed, self.dead]
            .iter()
            .any(|&count| count >= BACKLOG_COUNT_LIMIT)
    }
}

/// An age as seconds with millisecond precision (`null` for none), as scripts read it.
fn seconds<S: serde::Serializer>(
    age: &Option<Duration>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match age {
        Some(age) => serializer.serialize_f64(age.as_millis() as f64 / 1000.0),
        None => serializer.serialize_none(),
    }
}
