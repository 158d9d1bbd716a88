//! An in-memory [`ClaimStore`]: a small model of the claim protocol of `src/outbox.rs` and
//! the SQL procedures (ARCHITECTURE.md, "The claim protocol"), for the Kafka tests, which
//! run without SQL Server. (The Kafka benchmark uses `prebuilt_store.rs`, which does not
//! copy each message at its claim.)
//!
//! What it keeps of the contract:
//! * a claim takes due messages in id order, head of aggregate only: a message is claimed
//!   only when every earlier message of its aggregate is done or dead; messages without an
//!   aggregate are never held back;
//! * due means pending, failed whose retry time has come, or processing whose claim is
//!   older than the claim timeout (the reaper, which counts an attempt);
//! * every acknowledgement is fenced by the claim token and returns the rows it changed;
//! * `mark_failed` counts an attempt, `requeue` does not.
//!
//! Handles are cheap clones of one shared state, so a test keeps one to look at the rows
//! while the relay owns another. Each call takes the lock once and never across an await.
//!
//! Not modelled: the uncommitted-transaction subtleties of the SQL claim (one process, no
//! transactions), purging, and redrive.

#![allow(dead_code)] // the tests each use part of it

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use changefeed::Result;
use changefeed::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed, NewMessage};

/// A row's status, as the outbox table's `status` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Enqueued, never claimed.
    Pending,
    /// Held by a claim.
    Processing,
    /// Published.
    Done,
    /// Failed or handed back, due again at its retry time.
    Failed,
    /// Given up on.
    Dead,
}

/// One row as a test sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The message as enqueued (its `message_id` filled in).
    pub message: NewMessage,
    /// The status.
    pub status: Status,
    /// Failed attempts (explicit failures and expired claims).
    pub attempts: i32,
    /// The last failure's text, as the relay wrote it.
    pub last_error: Option<String>,
    claim: Option<(ClaimToken, Instant)>,
    next_retry_at: Option<Instant>,
}

impl Row {
    fn is_open(&self) -> bool {
        !matches!(self.status, Status::Done | Status::Dead)
    }
}

#[derive(Default)]
struct State {
    /// Row `id` is at index `id - 1`.
    rows: Vec<Row>,
    /// Every open row of each aggregate, in id order: the front one is the head.
    aggregates: HashMap<String, VecDeque<i64>>,
    /// Open rows that are the head of their aggregate (or have none): the claim candidates,
    /// in id order, so a claim never walks rows that are done or waiting behind a head.
    heads: BTreeSet<i64>,
}

impl State {
    fn row(&mut self, id: i64) -> Option<&mut Row> {
        usize::try_from(id - 1)
            .ok()
            .and_then(|i| self.rows.get_mut(i))
    }

    /// The row, when it is processing under `token`.
    fn held(&mut self, id: i64, token: ClaimToken) -> Option<&mut Row> {
        self.row(id).filter(|row| {
            row.status == Status::Processing && row.claim.is_some_and(|(t, _)| t == token)
        })
    }

    /// A row became done or dead: the next message of its aggregate becomes the head.
    fn close(&mut self, id: i64) {
        self.heads.remove(&id);
        let State {
            rows,
            aggregates,
            heads,
        } = self;
        let Some(aggregate) = rows[id as usize - 1].message.aggregate_id.as_deref() else {
            return;
        };
        let Some(queue) = aggregates.get_mut(aggregate) else {
            return;
        };
        debug_assert_eq!(queue.front(), Some(&id), "only a head is ever claimed");
        queue.pop_front();
        match queue.front() {
            Some(&next) => {
                heads.insert(next);
            }
            None => {
                aggregates.remove(aggregate);
            }
        }
    }
}

/// The in-memory outbox; clone it to keep a handle.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the rows from the assertions after it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Enqueues a message and returns its id; a message without a `message_id` gets
    /// `m-<id>`.
    pub fn enqueue(&self, mut message: NewMessage) -> i64 {
        let mut state = self.state();
        let id = state.rows.len() as i64 + 1;
        message.message_id.get_or_insert_with(|| format!("m-{id}"));
        let head = match &message.aggregate_id {
            None => true,
            Some(aggregate) => {
                let queue = state.aggregates.entry(aggregate.clone()).or_default();
                queue.push_back(id);
                queue.len() == 1
            }
        };
        if head {
            state.heads.insert(id);
        }
        state.rows.push(Row {
            message,
            status: Status::Pending,
            attempts: 0,
            last_error: None,
            claim: None,
            next_retry_at: None,
        });
        id
    }

    /// Row `id`.
    pub fn row(&self, id: i64) -> Row {
        self.state().rows[id as usize - 1].clone()
    }

    /// Every row, id `i + 1` at index `i`.
    pub fn rows(&self) -> Vec<Row> {
        self.state().rows.clone()
    }

    /// How many rows have `status`.
    pub fn count(&self, status: Status) -> usize {
        self.state()
            .rows
            .iter()
            .filter(|row| row.status == status)
            .count()
    }

    /// Whether every row is done or dead.
    pub fn is_drained(&self) -> bool {
        // Every open row's aggregate head, or the row itself, is in `heads`.
        self.state().heads.is_empty()
    }
}

impl ClaimStore for MemoryStore {
    async fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> changefeed::Result<Vec<Claimed>> {
        let mut state = self.state();
        let now = Instant::now();
        let token = ClaimToken::new(uuid::Uuid::new_v4());
        let State { rows, heads, .. } = &mut *state;
        // Sized up front: growing a vector of a thousand claimed messages copies it
        // over and over.
        let mut batch = Vec::with_capacity(heads.len().min(batch_size as usize));
        for &id in heads.iter() {
            if batch.len() >= batch_size as usize {
                break;
            }
            let row = &mut rows[id as usize - 1];
            let due = match row.status {
                Status::Pending => true,
                Status::Failed => row.next_retry_at.is_none_or(|at| at <= now),
                // The reaper: a claim older than the timeout is taken over, and that
                // counts an attempt.
                Status::Processing => row
                    .claim
                    .is_some_and(|(_, at)| now.duration_since(at) > claim_timeout),
                Status::Done | Status::Dead => unreachable!("closed rows leave `heads`"),
            };
            if !due {
                continue;
            }
            if row.status == Status::Processing {
                row.attempts += 1;
            }
            row.status = Status::Processing;
            row.claim = Some((token, now));
            row.next_retry_at = None;
            let m = &row.message;
            batch.push(Claimed::Message(ClaimedMessage {
                id,
                message_id: m.message_id.clone().unwrap_or_default(),
                topic: m.topic.clone(),
                aggregate_type: m.aggregate_type.clone(),
                aggregate_id: m.aggregate_id.clone(),
                partition_key: m.partition_key.clone().or_else(|| m.aggregate_id.clone()),
                payload: m.payload.clone(),
                headers: m.headers.clone(),
                trace_id: m.trace_id.clone(),
                attempts: row.attempts,
                claim_token: token,
            }));
        }
        Ok(batch)
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> changefeed::Result<u64> {
        let mut state = self.state();
        let mut changed = 0;
        for &id in ids {
            if let Some(row) = state.held(id, token) {
                row.status = Status::Done;
                row.claim = None;
                state.close(id);
                changed += 1;
            }
        }
        Ok(changed)
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> changefeed::Result<u64> {
        let (id, token, dead) = (failed.id, failed.token, failed.dead);
        let mut state = self.state();
        let Some(row) = state.held(id, token) else {
            return Ok(0);
        };
        row.attempts += 1;
        row.last_error = Some(failed.error.to_owned());
        row.claim = None;
        if dead {
            row.status = Status::Dead;
            state.close(id);
        } else {
            row.status = Status::Failed;
            row.next_retry_at = Some(Instant::now() + failed.retry_after.unwrap_or_default());
        }
        Ok(1)
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        let mut state = self.state();
        let Some(row) = state.held(id, token) else {
            return Ok(0);
        };
        row.status = Status::Failed;
        row.claim = None;
        row.next_retry_at = Some(Instant::now() + after);
        Ok(1)
    }
}
