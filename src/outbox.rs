//! The claim-style outbox (ARCHITECTURE.md, "The claim protocol"): messages enqueued in the business transaction,
//! claimed in batches by any number of relays, acknowledged with a fenced token.
//!
//! This module holds the message types and [`ClaimStore`], the operations a relay needs.
//! [`crate::outbox_store::OutboxStore`] implements it over the SQL procedures;
//! [`crate::relay::Relay`] drives it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::error::Result;

/// A claim's fencing token (`claim_token uniqueidentifier`): acknowledgements change only
/// rows still held under it, so a relay whose claim expired cannot clobber a newer claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub tiberius::Uuid);

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

/// The operations a relay performs on the outbox; implemented over SQL Server by
/// `OutboxStore` and by fakes in tests.
pub trait ClaimStore: Send {
    /// Claims up to `batch_size` due messages, head of aggregate only, ordered by id.
    fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> impl Future<Output = Result<Vec<ClaimedMessage>>> + Send;

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
