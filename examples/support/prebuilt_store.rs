//! A claim store for throughput figures that costs next to nothing: every message is built
//! once, when the store is made (untimed), and a claim hands it over instead of copying it.
//! `bench_kafka` times the relay over it against a bare producer, so the relay's figure
//! holds the relay's and the publisher's work, not a store's (the in-memory store of the
//! tests, `memory_store.rs`, copies every message at each claim, which cost a quarter of
//! the relay's time per message).
//!
//! It keeps what the relay's figure depends on: a claim takes due heads of aggregates in id
//! order, an aggregate's next message is due once its head is done, and every
//! acknowledgement is fenced by the claim token. It hands each message over once: a failed,
//! requeued or expired message is not claimed again but counted as unexpected, which the
//! benchmark reports as an error (no round against the mock cluster has one).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use changefeed::Result;
use changefeed::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed, NewMessage};

#[derive(Default)]
struct State {
    /// Message `id` at index `id - 1`, until a claim takes it.
    messages: Vec<Option<ClaimedMessage>>,
    /// The token of each message's claim, from its claim until it is done.
    tokens: Vec<Option<ClaimToken>>,
    /// The index of the next message of each message's aggregate.
    next: Vec<Option<usize>>,
    /// Indexes of messages that are due: heads of their aggregates, not claimed.
    due: BTreeSet<usize>,
    /// Messages done.
    done_count: usize,
    /// Acknowledgements this store does not model (failed, requeued).
    unexpected: usize,
}

/// The store; clones share it, so the benchmark keeps one to watch the relay's.
#[derive(Clone, Default)]
pub struct PrebuiltStore {
    state: Arc<Mutex<State>>,
}

impl PrebuiltStore {
    /// A store holding `messages` as ids 1, 2, …, each built into the message a claim
    /// hands over (its partition key the aggregate's when it has none of its own).
    pub fn new(messages: Vec<NewMessage>) -> Self {
        let mut state = State::default();
        let mut last_of: HashMap<String, usize> = HashMap::new();
        for (index, m) in messages.into_iter().enumerate() {
            let id = index as i64 + 1;
            state.next.push(None);
            match m.aggregate_id.as_ref().and_then(|a| last_of.get(a)) {
                Some(&last) => state.next[last] = Some(index),
                None => {
                    state.due.insert(index);
                }
            }
            if let Some(aggregate) = &m.aggregate_id {
                last_of.insert(aggregate.clone(), index);
            }
            state.messages.push(Some(ClaimedMessage {
                id,
                message_id: m.message_id.unwrap_or_else(|| format!("m-{id}")),
                topic: m.topic,
                aggregate_type: m.aggregate_type,
                partition_key: m.partition_key.or_else(|| m.aggregate_id.clone()),
                aggregate_id: m.aggregate_id,
                payload: m.payload,
                headers: m.headers,
                trace_id: m.trace_id,
                attempts: 0,
                claim_token: ClaimToken::new(uuid::Uuid::nil()),
            }));
            state.tokens.push(None);
        }
        PrebuiltStore {
            state: Arc::new(Mutex::new(state)),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether every message is done.
    pub fn is_drained(&self) -> bool {
        let state = self.state();
        state.done_count == state.messages.len()
    }

    /// How many messages are done.
    pub fn done(&self) -> usize {
        self.state().done_count
    }

    /// How many acknowledgements were of a kind this store does not model (a failure, a
    /// requeue): the round that had one is not a throughput figure.
    pub fn unexpected(&self) -> usize {
        self.state().unexpected
    }
}

impl ClaimStore for PrebuiltStore {
    async fn claim(&mut self, batch_size: u32, _claim_timeout: Duration) -> Result<Vec<Claimed>> {
        let token = ClaimToken::new(uuid::Uuid::new_v4());
        let mut state = self.state();
        let take = state.due.len().min(batch_size as usize);
        let mut batch = Vec::with_capacity(take);
        for _ in 0..take {
            let Some(index) = state.due.pop_first() else {
                break;
            };
            state.tokens[index] = Some(token);
            if let Some(mut message) = state.messages[index].take() {
                message.claim_token = token;
                batch.push(Claimed::Message(message));
            }
        }
        Ok(batch)
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        let mut state = self.state();
        let mut changed = 0;
        for &id in ids {
            let index = id as usize - 1;
            if state.tokens[index] != Some(token) {
                continue;
            }
            state.tokens[index] = None;
            state.done_count += 1;
            if let Some(next) = state.next[index] {
                state.due.insert(next);
            }
            changed += 1;
        }
        Ok(changed)
    }

    async fn mark_failed(&mut self, _failed: Failed<'_>) -> Result<u64> {
        self.state().unexpected += 1;
        Ok(0)
    }

    async fn requeue(&mut self, _id: i64, _token: ClaimToken, _after: Duration) -> Result<u64> {
        self.state().unexpected += 1;
        Ok(0)
    }
}
