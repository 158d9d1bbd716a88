//! The claim-style outbox (DESIGN.md 4.5): messages enqueued in the business transaction,
//! claimed in batches by any number of relays, acknowledged with a fenced token.
//!
//! This module holds the message types and [`ClaimStore`], the operations a relay needs.
//! [`crate::outbox_store::OutboxStore`] implements it over the SQL procedures;
//! [`crate::relay::Relay`] drives it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::error::Result;

/// A claim's fencing token (`claim_token uniqueidentifier` on SQL Server, `binary(16)` on
/// MariaDB/MySQL): acknowledgements change only rows still held under it, so a relay whose
/// claim expired cannot clobber a newer claim.
///
/// ```
/// use changefeed::outbox::ClaimToken;
///
/// let token = ClaimToken::new();
/// assert_eq!(ClaimToken::from_bytes(*token.as_bytes()), token);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// A fresh random token.
    pub fn new() -> Self {
        ClaimToken(uuid::Uuid::new_v4())
    }

    /// The token as a UUID (tiberius's `Uuid` is the same type).
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The token from its 16 bytes (as a `binary(16)` column stores it).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        ClaimToken(uuid::Uuid::from_bytes(bytes))
    }

    /// The token's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl From<uuid::Uuid> for ClaimToken {
    fn from(uuid: uuid::Uuid) -> Self {
        ClaimToken(uuid)
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

/// A claimed row whose payload or headers could not be decoded (a row written by hand, a
/// column changed behind the store's back). The relay marks it dead with `error` instead of
/// stalling the batch; the rest of the batch goes on.
#[derive(Clone, Debug, PartialEq)]
pub struct UndecodableMessage {
    /// The outbox row's id.
    pub id: i64,
    /// The idempotency key, if it could be read.
    pub message_id: Option<String>,
    /// The destination, if it could be read.
    pub topic: Option<String>,
    /// The payload's raw text, if it could be read.
    pub payload: Option<String>,
    /// The headers' raw text, if any.
    pub headers: Option<String>,
    /// Failed attempts so far.
    pub attempts: i32,
    /// The token this claim holds the row under.
    pub claim_token: ClaimToken,
    /// Why the row could not be decoded.
    pub error: String,
}

/// One row of a claim: a message to publish, or a row the relay must dead-letter.
#[derive(Clone, Debug, PartialEq)]
pub enum Claimed {
    /// A decoded message.
    Message(ClaimedMessage),
    /// A row whose payload or headers do not decode.
    Undecodable(UndecodableMessage),
}

impl Claimed {
    /// The outbox row's id.
    pub fn id(&self) -> i64 {
        match self {
            Claimed::Message(m) => m.id,
            Claimed::Undecodable(u) => u.id,
        }
    }

    /// The claim token the row is held under.
    pub fn claim_token(&self) -> ClaimToken {
        match self {
            Claimed::Message(m) => m.claim_token,
            Claimed::Undecodable(u) => u.claim_token,
        }
    }
}

/// The operations a relay performs on the outbox; implemented over SQL Server by
/// `OutboxStore`, over MariaDB/MySQL by `changefeed::mysql::MysqlOutboxStore` (feature
/// `mysql`), and by fakes in tests.
pub trait ClaimStore: Send {
    /// Claims up to `batch_size` due messages, head of aggregate only, ordered by id. A row
    /// that does not decode comes back as [`Claimed::Undecodable`]; the others as usual.
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

    /// Marks one message failed, due again after `retry_after`, or dead when `dead` is
    /// true (then `retry_after` is ignored). Counts an attempt. Returns 1 if the message was
    /// still held under `token`, else 0.
    fn mark_failed(
        &mut self,
        id: i64,
        token: ClaimToken,
        retry_after: Option<Duration>,
        dead: bool,
        error: &str,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Hands a message back, due again after `after`, without counting an attempt
    /// (backpressure). Returns 1 if it was still held under `token`, else 0.
    fn requeue(
        &mut self,
        id: i64,
        token: ClaimToken,
        after: Duration,
    ) -> impl Future<Output = Result<u64>> + Send;
}
