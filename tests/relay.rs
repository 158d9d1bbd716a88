//! The relay against an in-memory claim store (token fencing, head of aggregate, reaper)
//! and a scripted publisher: every row of the failure table, waking, shutdown, and the
//! faults a relay must survive.
//!
//! Every test runs on tokio's paused clock: time moves only when every task is waiting,
//! and then straight to the next timer, so delays are exact and a 60 s wait costs nothing.
//! Waits that must *not* happen are made 60 s long while a test gives up after 5 s.

mod common_relay;

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use changefeed::Error;
use changefeed::Result;
use changefeed::outbox::{
    ClaimProgress, ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed, Headers,
    UndecodableMessage,
};
use changefeed::outbox_store::CLAIM_PAUSE_MAX;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use changefeed::relay::{
    BatchReport, DeadLetter, ErrorKind, Hooks, MAX_STORE_RETRY_DELAY, PublishError, PublishOutcome,
    Publisher, Relay, RelayConfig, RelayHandle, RetryPolicy, SHUTDOWN_CLAIM_GRACE,
};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use common_relay::fatal_publisher_text;

// ---------------------------------------------------------------- the fake store

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Pending,
    Processing,
    Done,
    Failed,
    Dead,
}

#[derive(Clone, Debug)]
struct Row {
    id: i64,
    topic: String,
    aggregate_id: Option<String>,
    headers: Headers,
    status: Status,
    attempts: i32,
    token: Option<ClaimToken>,
    claimed_at: Option<Instant>,
    next_retry_at: Option<Instant>,
    last_error: Option<String>,
    /// A payload the claim cannot decode (e.g. `[1e400]`): the row comes back as
    /// [`Claimed::Undecodable`] with this raw text.
    undecodable_payload: Option<String>,
}

impl Row {
    fn claimed(&self, token: ClaimToken) -> Claimed {
        match &self.undecodable_payload {
            Some(raw) => Claimed::Undecodable(UndecodableMessage {
                id: self.id,
                message_id: Some(format!("m-{}", self.id)),
                topic: Some(self.topic.clone()),
                payload: Some(raw.clone()),
                headers: None,
                attempts: self.attempts,
                claim_token: token,
                error: format!("cannot decode column payload: {raw} is out of range"),
            }),
            None => Claimed::Message(self.message(token)),
        }
    }

    fn message(&self, token: ClaimToken) -> ClaimedMessage {
        ClaimedMessage {
            id: self.id,
            message_id: format!("m-{}", self.id),
            topic: self.topic.clone(),
            aggregate_type: self.aggregate_id.as_ref().map(|_| "test".to_owned()),
            aggregate_id: self.aggregate_id.clone(),
            partition_key: self.aggregate_id.clone(),
            payload: serde_json::json!({ "n": self.id }),
            headers: self.headers.clone(),
            trace_id: None,
            attempts: self.attempts,
            claim_token: token,
        }
    }
}

/// A store call as the relay made it; `changed` is what the store answered.
#[derive(Clone, Debug, PartialEq)]
enum Call {
    Claim,
    Done {
        ids: Vec<i64>,
        changed: u64,
    },
    Failed {
        id: i64,
        retry_after: Option<Duration>,
        dead: bool,
        error: String,
        changed: u64,
    },
    Requeue {
        id: i64,
        after: Duration,
        changed: u64,
    },
    Error(&'static str),
}

/// Pauses the next claim after it has taken its snapshot, until released.
#[derive(Default)]
struct ClaimGate {
    started: Notify,
    release: Notify,
}

#[derive(Default)]
struct StoreState {
    rows: Vec<Row>,
    next_token: u128,
    calls: Vec<Call>,
    claim_times: Vec<Instant>,
    claim_errors: VecDeque<Error>,
    done_errors: VecDeque<Error>,
    claim_gate: Option<Arc<ClaimGate>>,
    /// Claims never answer (a server that stopped responding, a connect that hangs).
    claims_hang: bool,
    /// A claim that finds nothing tries again every [`CLAIM_PAUSE_MAX`] until it claims
    /// something or this long has passed, as SQL Server's claim with `@wait_ms` does (and
    /// the store says so, `claim_waits`).
    claim_wait: Option<Duration>,
    /// Calls of `cancel_claim`.
    cancelled_claims: usize,
    /// Every claim takes this long to answer after its last try, holding the store (one
    /// connection) as a claim on a real server does: the rows it claimed are committed as
    /// claimed and on their way back.
    claim_delay: Option<Duration>,
    /// How long each try of a claim reads before it commits what it claimed.
    try_time: Option<Duration>,
    /// The flag through which the claim says it answers (`claim_progress`), raised after
    /// its last try, before `claim_delay`, as `SqlClaimStore`'s is when the result's first
    /// packet arrives. `None`: the store does not say, as the trait's default.
    progress: Option<ClaimProgress>,
    /// When each requeue was made.
    requeue_times: Vec<Instant>,
}

impl StoreState {
    fn fresh_token(&mut self) -> ClaimToken {
        self.next_token += 1;
        ClaimToken::new(uuid::Uuid::from_u128(self.next_token))
    }

    /// The claim procedure's rules: due rows only, head of aggregate only, ordered by id,
    /// one fresh token, an expired claim's reclaim counts an attempt.
    fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Vec<Claimed> {
        let now = Instant::now();
        let token = self.fresh_token();
        let mut heads = HashSet::new();
        let mut claimed = Vec::new();
        for row in &mut self.rows {
            if claimed.len() >= batch_size as usize {
                break;
            }
            if !matches!(
                row.status,
                Status::Pending | Status::Processing | Status::Failed
            ) {
                continue;
            }
            if let Some(aggregate) = &row.aggregate_id
                && !heads.insert(aggregate.clone())
            {
                continue; // an earlier open row of the aggregate blocks this one
            }
            let due = match row.status {
                Status::Pending => true,
                Status::Failed => row.next_retry_at.is_some_and(|t| t <= now),
                Status::Processing => row.claimed_at.is_some_and(|t| t + claim_timeout <= now),
                _ => false,
            };
            if !due {
                continue;
            }
            if row.status == Status::Processing {
                row.attempts += 1;
            }
            row.status = Status::Processing;
            row.token = Some(token);
            row.claimed_at = Some(now);
            claimed.push(row.claimed(token));
        }
        claimed
    }

    fn held(&mut self, id: i64, token: ClaimToken) -> Option<&mut Row> {
        self.rows
            .iter_mut()
            .find(|r| r.id == id && r.status == Status::Processing && r.token == Some(token))
    }
}

#[derive(Clone, Default)]
struct FakeStore(Arc<Mutex<StoreState>>);

impl FakeStore {
    fn state(&self) -> std::sync::MutexGuard<'_, StoreState> {
        self.0.lock().unwrap()
    }

    fn enqueue(&self, aggregate: Option<&str>) -> i64 {
        self.enqueue_with(|row| row.aggregate_id = aggregate.map(str::to_owned))
    }

    fn enqueue_with(&self, edit: impl FnOnce(&mut Row)) -> i64 {
        let mut state = self.state();
        let id = state.rows.len() as i64 + 1;
        let mut row = Row {
            id,
            topic: "orders".to_owned(),
            aggregate_id: None,
            headers: Headers::new(),
            status: Status::Pending,
            attempts: 0,
            token: None,
            claimed_at: None,
            next_retry_at: None,
            last_error: None,
            undecodable_payload: None,
        };
        edit(&mut row);
        state.rows.push(row);
        id
    }

    fn row(&self, id: i64) -> Row {
        self.state().rows[id as usize - 1].clone()
    }

    fn status(&self, id: i64) -> Status {
        self.row(id).status
    }

    fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The acknowledgements only, in order.
    fn acks(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| !matches!(c, Call::Claim | Call::Error(_)))
            .collect()
    }

    fn claim_times(&self) -> Vec<Instant> {
        self.state().claim_times.clone()
    }

    /// Another relay re-claims `id` after its claim expired: the row gets a new token.
    fn steal(&self, id: i64) {
        let mut state = self.state();
        let token = state.fresh_token();
        state.rows[id as usize - 1].token = Some(token);
    }

    fn gate_next_claim(&self) -> Arc<ClaimGate> {
        let gate = Arc::new(ClaimGate::default());
        self.state().claim_gate = Some(Arc::clone(&gate));
        gate
    }
}

fn server_error(number: u32) -> Error {
    Error::Server {
        number,
        state: 1,
        class: 13,
        message: "Transaction was deadlocked".to_owned(),
    }
}

impl ClaimStore for FakeStore {
    async fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> changefeed::Result<Vec<Claimed>> {
        if self.state().claims_hang {
            std::future::pending::<()>().await;
        }
        let (try_time, gate) = {
            let mut state = self.state();
            state.claim_times.push(Instant::now());
            if let Some(error) = state.claim_errors.pop_front() {
                state.calls.push(Call::Error("claim"));
                return Err(error);
            }
            state.calls.push(Call::Claim);
            (state.try_time, state.claim_gate.take())
        };
        // One try: it reads (stopped meanwhile, it takes nothing), then commits its claim.
        let try_once = async || {
            if let Some(time) = try_time {
                sleep(time).await;
            }
            self.state().claim(batch_size, claim_timeout)
        };
        let mut claimed = try_once().await;
        if let Some(gate) = gate {
            gate.started.notify_one();
            gate.release.notified().await;
        }
        let wait = self.state().claim_wait;
        if let Some(wait) = wait {
            // A try that took nothing pauses, and tries again until the wait is over.
            let deadline = Instant::now() + wait;
            while claimed.is_empty() && Instant::now() < deadline {
                sleep(CLAIM_PAUSE_MAX.min(deadline - Instant::now())).await;
                claimed = try_once().await;
            }
        }
        let (progress, delay) = {
            let state = self.state();
            (state.progress.clone(), state.claim_delay)
        };
        if let Some(progress) = progress {
            progress.answering();
        }
        if let Some(delay) = delay {
            sleep(delay).await;
        }
        Ok(claimed)
    }

    fn claim_waits(&self) -> bool {
        self.state().claim_wait.is_some()
    }

    async fn cancel_claim(&mut self) {
        self.state().cancelled_claims += 1;
    }

    fn claim_progress(&self) -> Option<ClaimProgress> {
        self.state().progress.clone()
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> changefeed::Result<u64> {
        let mut state = self.state();
        if let Some(error) = state.done_errors.pop_front() {
            state.calls.push(Call::Error("mark_done"));
            return Err(error);
        }
        let mut changed = 0;
        for id in ids {
            if let Some(row) = state.held(*id, token) {
                row.status = Status::Done;
                changed += 1;
            }
        }
        state.calls.push(Call::Done {
            ids: ids.to_vec(),
            changed,
        });
        Ok(changed)
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> changefeed::Result<u64> {
        let (id, token, dead) = (failed.id, failed.token, failed.dead);
        let (retry_after, error) = (failed.retry_after, failed.error);
        if retry_after.is_none() && !dead {
            // The procedure refuses failed-with-no-retry-time: it would hot-loop.
            return Err(Error::Server {
                number: 51120,
                state: 1,
                class: 16,
                message: "mark_failed needs a retry time or dead".to_owned(),
            });
        }
        let mut state = self.state();
        let now = Instant::now();
        let changed = match state.held(id, token) {
            Some(row) => {
                row.attempts += 1;
                row.last_error = Some(error.to_owned());
                if dead {
                    row.status = Status::Dead;
                } else {
                    row.status = Status::Failed;
                    row.next_retry_at = retry_after.map(|d| now + d);
                }
                1
            }
            None => 0,
        };
        state.calls.push(Call::Failed {
            id,
            retry_after,
            dead,
            error: error.to_owned(),
            changed,
        });
        Ok(changed)
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        let mut state = self.state();
        let now = Instant::now();
        state.requeue_times.push(now);
        let changed = match state.held(id, token) {
            Some(row) => {
                row.status = Status::Failed;
                row.next_retry_at = Some(now + after);
                1
            }
            None => 0,
        };
        state.calls.push(Call::Requeue { id, after, changed });
        Ok(changed)
    }
}

// ---------------------------------------------------------------- the fake publisher

type Action = Box<dyn FnOnce() + Send>;

/// Publishes by script: each message takes the next outcome scripted for its id, or the
/// default (`Ok`).
#[derive(Default)]
struct FakePublisher {
    scripts: Mutex<HashMap<i64, VecDeque<PublishOutcome>>>,
    default_error: Mutex<Option<PublishError>>,
    /// Every publish call: when, and the ids of its batch.
    batches: Mutex<Vec<(Instant, Vec<i64>)>>,
    dead_letters: Mutex<Vec<(i64, Headers)>>,
    /// The payload text of every dead letter, by id.
    dead_letter_payloads: Mutex<Vec<(i64, Option<String>)>>,
    dead_letter_error: Mutex<Option<PublishError>>,
    /// How long every dead letter takes before its outcome (a destination that does not
    /// answer: a missing topic waits the producer's message timeout).
    dead_letter_delay: Mutex<Option<Duration>>,
    /// Runs once, inside the next publish call.
    during_publish: Mutex<Option<Action>>,
    /// How long the next publish call takes.
    slow_once: Mutex<Option<Duration>>,
    panics: AtomicUsize,
    /// Makes the next publish call return this many outcomes.
    outcome_count_once: Mutex<Option<usize>>,
}

impl FakePublisher {
    fn script(&self, id: i64, outcomes: impl IntoIterator<Item = PublishOutcome>) {
        self.scripts
            .lock()
            .unwrap()
            .insert(id, outcomes.into_iter().collect());
    }

    fn always_fail(&self, error: PublishError) {
        *self.default_error.lock().unwrap() = Some(error);
    }

    fn during_publish(&self, action: impl FnOnce() + Send + 'static) {
        *self.during_publish.lock().unwrap() = Some(Box::new(action));
    }

    fn batches(&self) -> Vec<Vec<i64>> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .map(|(_, ids)| ids.clone())
            .collect()
    }

    fn publishes_of(&self, id: i64) -> usize {
        self.batches().iter().filter(|b| b.contains(&id)).count()
    }

    fn dead_letters(&self) -> Vec<(i64, Headers)> {
        self.dead_letters.lock().unwrap().clone()
    }
}

impl Publisher for FakePublisher {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let ids: Vec<i64> = batch.iter().map(|m| m.id).collect();
        self.batches.lock().unwrap().push((Instant::now(), ids));
        let action = self.during_publish.lock().unwrap().take();
        if let Some(action) = action {
            action();
        }
        let slow = self.slow_once.lock().unwrap().take();
        if let Some(delay) = slow {
            sleep(delay).await;
        }
        if self
            .panics
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("publisher exploded");
        }
        let mut outcomes: Vec<PublishOutcome> = {
            let mut scripts = self.scripts.lock().unwrap();
            let default = self.default_error.lock().unwrap().clone();
            batch
                .iter()
                .map(|m| {
                    scripts
                        .get_mut(&m.id)
                        .and_then(VecDeque::pop_front)
                        .unwrap_or_else(|| default.clone().map_or(Ok(()), Err))
                })
                .collect()
        };
        if let Some(n) = self.outcome_count_once.lock().unwrap().take() {
            outcomes.resize_with(n, || Ok(()));
        }
        outcomes
    }

    async fn publish_dead_letter(
        &self,
        letter: DeadLetter<'_>,
        headers: &Headers,
    ) -> Result<(), PublishError> {
        self.dead_letters
            .lock()
            .unwrap()
            .push((letter.id(), headers.clone()));
        self.dead_letter_payloads
            .lock()
            .unwrap()
            .push((letter.id(), letter.payload_text().map(|t| t.into_owned())));
        let delay = *self.dead_letter_delay.lock().unwrap();
        if let Some(delay) = delay {
            sleep(delay).await;
        }
        match self.dead_letter_error.lock().unwrap().clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn dead_letter_destination(&self, letter: DeadLetter<'_>) -> Option<String> {
        letter.topic().map(|topic| format!("{topic}.dlq"))
    }
}

// ---------------------------------------------------------------- recording hooks

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Claimed(usize),
    Published(usize),
    Failed(i64, ErrorKind),
    Requeued(i64),
    Dead(i64, ErrorKind),
    Fatal(i64),
    DeadLetterFailed(i64),
    ClaimLost(u64),
    LoopError(String),
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    /// Panic in every hook, after recording the event.
    panic: bool,
}

impl Recorder {
    fn panicking() -> Self {
        Recorder {
            panic: true,
            ..Recorder::default()
        }
    }

    fn record(&self, event: Event) {
        self.events.lock().unwrap().push(event);
        if self.panic {
            panic!("hook exploded");
        }
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn loop_errors(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::LoopError(message) => Some(message),
                _ => None,
            })
            .collect()
    }
}

impl Hooks for Recorder {
    fn on_claimed(&self, count: usize) {
        self.record(Event::Claimed(count));
    }
    fn on_published(&self, count: usize) {
        self.record(Event::Published(count));
    }
    fn on_failed(&self, id: i64, error: &PublishError) {
        self.record(Event::Failed(id, error.kind));
    }
    fn on_requeued(&self, id: i64, _error: &PublishError) {
        self.record(Event::Requeued(id));
    }
    fn on_dead(&self, id: i64, error: &PublishError) {
        self.record(Event::Dead(id, error.kind));
    }
    fn on_fatal(&self, id: i64, _error: &PublishError) {
        self.record(Event::Fatal(id));
    }
    fn on_dead_letter_failed(&self, id: i64, _error: &PublishError) {
        self.record(Event::DeadLetterFailed(id));
    }
    fn on_claim_lost(&self, count: u64) {
        self.record(Event::ClaimLost(count));
    }
    fn on_loop_error(&self, error: &Error) {
        self.record(Event::LoopError(error.to_string()));
    }
}

// ---------------------------------------------------------------- harness

thread_local! {
    /// The `max_in_flight` of [`config`]: each test runs at 1 and at 4 (`relay_test!`), on
    /// a current-thread runtime, so the relay task it spawns sees its own value.
    static MAX_IN_FLIGHT: Cell<u32> = const { Cell::new(1) };
}

/// A test that runs twice, with one batch in flight and with four: the failure table,
/// waking, shutdown and the faults behave the same either way.
macro_rules! relay_test {
    ($(#[$doc:meta])* async fn $name:ident() $body:block) => {
        $(#[$doc])*
        mod $name {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn one_batch_in_flight() {
                MAX_IN_FLIGHT.set(1);
                $body
            }

            #[tokio::test(start_paused = true)]
            async fn four_batches_in_flight() {
                MAX_IN_FLIGHT.set(4);
                $body
            }
        }
    };
}

const LONG: Duration = Duration::from_secs(60);
const PATIENCE: Duration = Duration::from_secs(5);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Resolves once messages 1 to `count` of `store` are all done (looked at every 5 ms): the
/// shutdown of a relay run until it has delivered everything.
async fn all_done(store: FakeStore, count: i64) {
    while !(1..=count).all(|id| store.status(id) == Status::Done) {
        sleep(ms(5)).await;
    }
}

/// Quick polling, exact (jitter-free) 10 ms × 2^n retries, 5 attempts.
fn config() -> RelayConfig {
    RelayConfig::default()
        .batch_size(100)
        .poll_interval(ms(20))
        .claim_timeout(Duration::from_secs(10))
        .retry(
            RetryPolicy::default()
                .initial(ms(10))
                .max(Duration::from_secs(1))
                .multiplier(2.0)
                .max_attempts(5)
                .jitter(false),
        )
        .max_in_flight(MAX_IN_FLIGHT.get())
}

struct Running {
    shutdown: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    task: JoinHandle<changefeed::Result<()>>,
    handle: RelayHandle,
}

impl Running {
    /// Signals shutdown and waits for `run` to return.
    async fn stop(self) -> changefeed::Result<()> {
        self.signal_stop();
        self.finish().await
    }

    /// Signals shutdown without waiting for `run` to return.
    fn signal_stop(&self) {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }

    /// Waits for `run` to return by itself.
    async fn finish(self) -> changefeed::Result<()> {
        timeout(PATIENCE, self.task)
            .await
            .expect("the relay did not return")
            .expect("the relay task panicked")
    }
}

fn start(
    store: &FakeStore,
    publisher: &Arc<FakePublisher>,
    hooks: &Arc<Recorder>,
    config: RelayConfig,
) -> Running {
    let relay = Relay::new(store.clone(), Arc::clone(publisher), config)
        .unwrap()
        .with_hooks(Arc::clone(hooks));
    let handle = relay.handle();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async {
        let _ = rx.await;
    }));
    Running {
        shutdown: Arc::new(Mutex::new(Some(tx))),
        task,
        handle,
    }
}

fn fakes() -> (FakeStore, Arc<FakePublisher>, Arc<Recorder>) {
    (
        FakeStore::default(),
        Arc::new(FakePublisher::default()),
        Arc::new(Recorder::default()),
    )
}

async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let waited = timeout(PATIENCE, async {
        while !condition() {
            sleep(ms(2)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "gave up waiting for: {what}");
}

// ---------------------------------------------------------------- the failure table

relay_test! {
    async fn ok_messages_are_marked_done_in_one_call() {
        let (store, publisher, hooks) = fakes();
        for _ in 0..3 {
            store.enqueue(None);
        }
        let relay = start(&store, &publisher, &hooks, config());
        eventually("all done", || {
            (1..=3).all(|id| store.status(id) == Status::Done)
        })
        .await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.acks(),
            [Call::Done {
                ids: vec![1, 2, 3],
                changed: 3
            }]
        );
        let events = hooks.events();
        assert!(events.contains(&Event::Claimed(3)), "{events:?}");
        assert!(events.contains(&Event::Published(3)), "{events:?}");
    }
}

relay_test! {
    async fn retriable_failure_marks_failed_with_the_policy_delay() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        publisher.script(id, [Err(PublishError::retriable("broker down")), Ok(())]);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("retried and done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.acks(),
            [
                Call::Failed {
                    id,
                    retry_after: Some(ms(10)),
                    dead: false,
                    error: "retriable: broker down".to_owned(),
                    changed: 1
                },
                Call::Done {
                    ids: vec![id],
                    changed: 1
                }
            ]
        );
        assert_eq!(store.row(id).attempts, 1);
        assert_eq!(publisher.publishes_of(id), 2);
        assert!(
            hooks
                .events()
                .contains(&Event::Failed(id, ErrorKind::Retriable))
        );
        assert!(publisher.dead_letters().is_empty());
    }
}

relay_test! {
    async fn retriable_delays_grow_until_max_attempts_then_dead() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        publisher.always_fail(PublishError::retriable("broker down"));
        let mut config = config();
        config.retry.max_attempts = 4;
        let relay = start(&store, &publisher, &hooks, config);
        eventually("dead", || store.status(id) == Status::Dead).await;
        relay.stop().await.unwrap();

        let plan: Vec<_> = store
            .acks()
            .into_iter()
            .map(|call| match call {
                Call::Failed {
                    retry_after, dead, ..
                } => (retry_after, dead),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            plan,
            [
                (Some(ms(10)), false),
                (Some(ms(20)), false),
                (Some(ms(40)), false),
                (None, true)
            ]
        );
        assert_eq!(store.row(id).attempts, 4);
        assert_eq!(publisher.publishes_of(id), 4);
        let dead_letters = publisher.dead_letters();
        assert_eq!(dead_letters.len(), 1);
        assert_eq!(dead_letters[0].1["x-attempts"], "4");
        assert_eq!(dead_letters[0].1["x-error-kind"], "retriable");
        let events = hooks.events();
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, Event::Failed(..)))
                .count(),
            3
        );
        assert!(events.contains(&Event::Dead(id, ErrorKind::Retriable)));
    }
}

relay_test! {
    async fn poison_is_dead_at_once_with_a_dead_letter() {
        let (store, publisher, hooks) = fakes();
        let poison = store.enqueue(None);
        let fine = store.enqueue(None);
        publisher.script(poison, [Err(PublishError::poison("cannot serialize"))]);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("settled", || {
            store.status(poison) == Status::Dead && store.status(fine) == Status::Done
        })
        .await;
        relay.stop().await.unwrap();

        assert_eq!(publisher.publishes_of(poison), 1);
        assert_eq!(store.row(poison).attempts, 1);
        assert_eq!(
            store.row(poison).last_error.as_deref(),
            Some("poison: cannot serialize")
        );
        assert!(store.acks().contains(&Call::Failed {
            id: poison,
            retry_after: None,
            dead: true,
            error: "poison: cannot serialize".to_owned(),
            changed: 1
        }));
        assert_eq!(publisher.dead_letters().len(), 1);
        let events = hooks.events();
        assert!(events.contains(&Event::Dead(poison, ErrorKind::Poison)));
        assert!(!events.iter().any(|e| matches!(e, Event::Fatal(_))));
    }
}

relay_test! {
    async fn fatal_hands_the_message_back_and_stops_the_relay_after_acknowledging_its_batch() {
        let (store, publisher, hooks) = fakes();
        let ok = store.enqueue(None);
        let fatal = store.enqueue(None);
        let retriable = store.enqueue(None);
        let later = store.enqueue(None);
        publisher.script(fatal, [Err(PublishError::fatal("bad credentials"))]);
        publisher.script(retriable, [Err(PublishError::retriable("timeout"))]);
        let config = config().batch_size(3);
        let relay = start(&store, &publisher, &hooks, config);

        let message = fatal_publisher_text(relay.finish().await);
        assert!(message.contains("fatal"), "{message}");
        assert!(message.contains("message 2"), "{message}");
        assert!(message.contains("bad credentials"), "{message}");
        assert!(message.contains("handed the message back"), "{message}");
        // The rest of the batch was acknowledged by its outcomes; nothing was claimed after it.
        // With batches in flight, `later` was claimed (in a batch of its own) before the
        // fatal outcome came, and that batch was finished before the relay stopped.
        assert_eq!(store.status(ok), Status::Done);
        assert_eq!(store.status(retriable), Status::Failed);
        let calls = store.calls();
        let handed_back = calls
            .iter()
            .position(|call| matches!(call, Call::Requeue { id, .. } if *id == fatal))
            .expect("the fatal message handed back");
        assert!(!calls[handed_back..].contains(&Call::Claim), "{calls:?}");
        if MAX_IN_FLIGHT.get() == 1 {
            assert_eq!(store.status(later), Status::Pending);
            assert_eq!(store.claim_times().len(), 1);
        } else {
            assert_eq!(store.status(later), Status::Done);
        }
        // The fatal message is handed back, due at once, its attempts unchanged: not dead,
        // not dead-lettered.
        let row = store.row(fatal);
        assert_eq!(row.status, Status::Failed);
        assert_eq!(row.attempts, 0);
        assert!(store.acks().contains(&Call::Requeue {
            id: fatal,
            after: Duration::ZERO,
            changed: 1
        }));
        assert!(publisher.dead_letters().is_empty());
        let events = hooks.events();
        assert!(events.contains(&Event::Fatal(fatal)), "{events:?}");
        assert!(
            !events.iter().any(|e| matches!(e, Event::Dead(..))),
            "{events:?}"
        );
        assert!(
            !events.contains(&Event::Requeued(fatal)),
            "not backpressure: {events:?}"
        );
        assert!(events.contains(&Event::Failed(retriable, ErrorKind::Retriable)));
        assert!(hooks.loop_errors().iter().any(|m| m.contains("fatal")));
    }
}

relay_test! {
    async fn backpressure_requeues_without_counting_an_attempt_and_slows_polling() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        publisher.script(id, [Err(PublishError::backpressure("slow down")), Ok(())]);
        let mut config = config();
        config.retry.initial = ms(200);
        let relay = start(&store, &publisher, &hooks, config);
        eventually("done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.acks(),
            [
                Call::Requeue {
                    id,
                    after: ms(200),
                    changed: 1
                },
                Call::Done {
                    ids: vec![id],
                    changed: 1
                }
            ]
        );
        assert_eq!(store.row(id).attempts, 0, "backpressure is not an attempt");
        // Without backpressure a batch that moved nothing waits poll_interval (20 ms); with
        // it, the relay waits retry.initial before the next claim. (With batches in flight,
        // a claim may also come at once, while the batch is still being published.)
        let claims = store.claim_times();
        let next = claims.iter().find(|t| **t > claims[0]).expect("a later claim");
        let gap = *next - claims[0];
        assert!(gap >= ms(200) && gap < ms(202), "{gap:?}");
        assert!(hooks.events().contains(&Event::Requeued(id)));
    }
}

relay_test! {
    async fn partial_batch_is_handled_per_message() {
        let (store, publisher, hooks) = fakes();
        let ids: Vec<i64> = (0..5).map(|_| store.enqueue(None)).collect();
        publisher.script(ids[1], [Err(PublishError::retriable("timeout"))]);
        publisher.script(ids[2], [Err(PublishError::poison("too large"))]);
        publisher.script(ids[3], [Err(PublishError::backpressure("throttled"))]);
        let mut config = config();
        config.retry.initial = Duration::from_secs(1); // nothing comes due during the test
        let relay = start(&store, &publisher, &hooks, config);
        eventually("first batch acknowledged", || store.acks().len() == 4).await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.acks(),
            [
                Call::Done {
                    ids: vec![ids[0], ids[4]],
                    changed: 2
                },
                Call::Failed {
                    id: ids[1],
                    retry_after: Some(Duration::from_secs(1)),
                    dead: false,
                    error: "retriable: timeout".to_owned(),
                    changed: 1
                },
                Call::Requeue {
                    id: ids[3],
                    after: Duration::from_secs(1),
                    changed: 1
                },
                Call::Failed {
                    id: ids[2],
                    retry_after: None,
                    dead: true,
                    error: "poison: too large".to_owned(),
                    changed: 1
                },
            ]
        );
        assert_eq!(publisher.batches()[0], ids);
        let events = hooks.events();
        assert!(events.contains(&Event::Published(2)));
    }
}

relay_test! {
    async fn a_failing_message_does_not_stall_other_aggregates_and_its_own_waits() {
        let (store, publisher, hooks) = fakes();
        let a1 = store.enqueue(Some("a"));
        let b1 = store.enqueue(Some("b"));
        let a2 = store.enqueue(Some("a"));
        let b2 = store.enqueue(Some("b"));
        publisher.script(a1, [Err(PublishError::retriable("flaky")), Ok(())]);
        let mut config = config();
        config.retry.initial = ms(100);
        let relay = start(&store, &publisher, &hooks, config);
        eventually("all done", || {
            [a1, b1, a2, b2]
                .iter()
                .all(|id| store.status(*id) == Status::Done)
        })
        .await;
        relay.stop().await.unwrap();

        let batches = publisher.batches();
        // Head of aggregate: a1 and b1 first; then b2 at once while a1 waits out its retry;
        // a2 only after a1 went through.
        assert_eq!(batches[0], [a1, b1]);
        assert_eq!(batches[1], [b2]);
        let a1_ok = batches.iter().rposition(|b| b.contains(&a1)).unwrap();
        let a2_first = batches.iter().position(|b| b.contains(&a2)).unwrap();
        assert!(a1_ok < a2_first, "{batches:?}");
        assert_eq!(publisher.publishes_of(a2), 1);
    }
}

relay_test! {
    async fn dead_letter_headers_name_the_topic_attempts_and_error() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue_with(|row| {
            row.topic = "billing.invoices".to_owned();
            row.attempts = 2;
            row.headers
                .insert("traceparent".to_owned(), "00-abc".to_owned());
        });
        publisher.script(id, [Err(PublishError::poison("schema rejected"))]);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("dead", || store.status(id) == Status::Dead).await;
        relay.stop().await.unwrap();

        let expected: Headers = [
            ("traceparent", "00-abc"),
            ("x-original-topic", "billing.invoices"),
            ("x-attempts", "3"),
            ("x-error", "schema rejected"),
            ("x-error-kind", "poison"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(publisher.dead_letters(), [(id, expected)]);
        assert_eq!(store.row(id).attempts, 3);
    }
}

relay_test! {
    async fn a_failed_dead_letter_still_marks_dead_and_is_reported() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        publisher.script(id, [Err(PublishError::poison("bad payload"))]);
        *publisher.dead_letter_error.lock().unwrap() = Some(PublishError::retriable("dlq down"));
        let relay = start(&store, &publisher, &hooks, config());
        eventually("dead", || store.status(id) == Status::Dead).await;
        relay.stop().await.unwrap();

        let events = hooks.events();
        let reported = events
            .iter()
            .position(|e| *e == Event::DeadLetterFailed(id));
        let dead = events
            .iter()
            .position(|e| *e == Event::Dead(id, ErrorKind::Poison));
        assert!(
            reported.is_some() && reported < dead,
            "dead-letter failure reported, then dead: {events:?}"
        );
        assert_eq!(
            publisher.publishes_of(id),
            1,
            "a dead message is not retried"
        );
        assert_eq!(
            store.row(id).last_error.as_deref(),
            Some(
                "poison: bad payload; its dead letter from topic orders to orders.dlq was not \
                 written either: retriable: dlq down"
            )
        );
    }
}

/// Waits (on the paused clock) until `condition` holds, at most `limit`; returns how long
/// that took.
async fn settled_within(what: &str, limit: Duration, condition: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        sleep(ms(1)).await;
    }
    started.elapsed()
}

/// Five poison messages of five aggregates, each followed by a healthy one, whose dead
/// letters each take `delay` and then fail as `error`; returns the poison ids and their
/// successors', once every poison row is dead and every successor done, and how long the
/// poison rows took to go dead.
async fn dead_letters_that_take(
    store: &FakeStore,
    publisher: &Arc<FakePublisher>,
    hooks: &Arc<Recorder>,
    delay: Duration,
    error: PublishError,
) -> (Vec<i64>, Vec<i64>, Duration) {
    let poison: Vec<i64> = (0..5)
        .map(|n| store.enqueue(Some(&format!("order-{n}"))))
        .collect();
    let successors: Vec<i64> = (0..5)
        .map(|n| store.enqueue(Some(&format!("order-{n}"))))
        .collect();
    for id in &poison {
        publisher.script(
            *id,
            [Err(PublishError::poison(
                "producing to orders: Broker: Message size too large",
            ))],
        );
    }
    *publisher.dead_letter_delay.lock().unwrap() = Some(delay);
    *publisher.dead_letter_error.lock().unwrap() = Some(error);
    let relay = start(store, publisher, hooks, config());
    let took = settled_within("the poison rows dead", LONG, || {
        poison.iter().all(|id| store.status(*id) == Status::Dead)
    })
    .await;
    settled_within("the successors done", LONG, || {
        successors
            .iter()
            .all(|id| store.status(*id) == Status::Done)
    })
    .await;
    relay.stop().await.unwrap();
    (poison, successors, took)
}

relay_test! {
    /// A dead-letter topic that does not exist (auto-creation off) answers each dead letter
    /// only when the producer's message timeout passes. One at a time, five of them
    /// outlived the batch's claim and the rows were claimed and published again; together,
    /// the batch is done in one wait, inside its claim.
    async fn a_batch_s_dead_letters_are_written_together_inside_its_claim() {
        let recorder = SeriesRecorder::default();
        let _local = metrics::set_default_local_recorder(&recorder);
        let (store, publisher, hooks) = fakes();
        let timed_out = PublishError::retriable(
            "producing to orders.dlq: Message production error: MessageTimedOut (Local: \
             Message timed out)",
        );
        let (poison, successors, took) =
            dead_letters_that_take(&store, &publisher, &hooks, Duration::from_secs(4), timed_out)
                .await;

        // config()'s claim is 10 s; five waits of 4 s one after another are 20 s.
        assert!(took < Duration::from_secs(5), "dead after {took:?}");
        for id in &poison {
            assert_eq!(publisher.publishes_of(*id), 1, "row {id} published once");
            let row = store.row(*id);
            assert_eq!(row.attempts, 1, "{row:?}");
            let error = row.last_error.unwrap();
            for part in [
                "poison: producing to orders: Broker: Message size too large",
                "its dead letter from topic orders to orders.dlq was not written either",
                "retriable: producing to orders.dlq: Message production error: MessageTimedOut",
            ] {
                assert!(error.contains(part), "{part:?} in {error:?}");
            }
        }
        let mut lettered: Vec<i64> = publisher.dead_letters().iter().map(|(id, _)| *id).collect();
        lettered.sort_unstable();
        assert_eq!(lettered, poison, "one dead letter per poison row");
        assert!(successors.iter().all(|id| publisher.publishes_of(*id) == 1));
        let events = hooks.events();
        assert!(
            !events.iter().any(|e| matches!(e, Event::ClaimLost(_))),
            "no acknowledgement came after its claim: {events:?}"
        );
        for id in &poison {
            let failed = events.iter().position(|e| *e == Event::DeadLetterFailed(*id));
            let dead = events.iter().position(|e| *e == Event::Dead(*id, ErrorKind::Poison));
            assert!(failed.is_some() && failed < dead, "{events:?}");
        }
        // What an alert watches.
        let labels = [
            ("outbox", ""),
            ("topic", "orders"),
            ("error_class", "retriable"),
        ];
        assert_eq!(
            recorder.counter(changefeed::metrics::RELAY_DEAD_LETTERS_FAILED, &labels),
            5
        );
    }
}

relay_test! {
    /// A dead letter that never answers is given up at three quarters of the claim timeout
    /// after the claim, and its row marked dead inside the claim, saying so; before, each
    /// waited a whole claim timeout, so the row was claimed and published again.
    async fn a_dead_letter_that_never_answers_is_given_up_inside_the_claim() {
        let (store, publisher, hooks) = fakes();
        let (poison, _successors, took) = dead_letters_that_take(
            &store,
            &publisher,
            &hooks,
            LONG,
            PublishError::retriable("never seen"),
        )
        .await;

        // 7.5 s of config()'s 10 s claim, the claim's own call and the marks included.
        assert!(took >= ms(7_500) && took < ms(8_000), "dead after {took:?}");
        assert_eq!(publisher.dead_letters().len(), poison.len());
        for id in &poison {
            assert_eq!(publisher.publishes_of(*id), 1, "row {id} published once");
            let row = store.row(*id);
            assert_eq!(row.attempts, 1, "{row:?}");
            let error = row.last_error.unwrap();
            assert!(
                error.contains("its dead letter from topic orders to orders.dlq was not written \
                                either: retriable: the dead-letter publish was not confirmed \
                                within its bound, three quarters of the claim timeout (10s)"),
                "{error}"
            );
        }
        assert!(!hooks.events().iter().any(|e| matches!(e, Event::ClaimLost(_))));
    }
}

relay_test! {
    async fn messages_whose_claims_expired_too_often_go_dead_without_publishing() {
        let (store, publisher, hooks) = fakes();
        // Five expired claims (e.g. publishing it crashed the process five times).
        let id = store.enqueue_with(|row| row.attempts = 5);
        let fine = store.enqueue(None);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("settled", || {
            store.status(id) == Status::Dead && store.status(fine) == Status::Done
        })
        .await;
        relay.stop().await.unwrap();

        assert_eq!(publisher.publishes_of(id), 0);
        assert_eq!(publisher.dead_letters().len(), 1);
        assert!(hooks.events().contains(&Event::Dead(id, ErrorKind::Poison)));
    }
}

// ---------------------------------------------------------------- publisher faults

relay_test! {
    async fn wrong_number_of_outcomes_retries_the_whole_batch_and_reports_it() {
        let (store, publisher, hooks) = fakes();
        let ids: Vec<i64> = (0..3).map(|_| store.enqueue(None)).collect();
        *publisher.outcome_count_once.lock().unwrap() = Some(2);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("all done", || {
            ids.iter().all(|id| store.status(*id) == Status::Done)
        })
        .await;
        relay.stop().await.unwrap();

        let acks = store.acks();
        for (i, id) in ids.iter().enumerate() {
            assert!(
                matches!(&acks[i], Call::Failed { id: f, dead: false, .. } if f == id),
                "{acks:?}"
            );
        }
        assert_eq!(
            acks[3],
            Call::Done {
                ids: ids.clone(),
                changed: 3
            }
        );
        assert!(
            hooks
                .loop_errors()
                .iter()
                .any(|m| m.contains("returned 2 outcomes for a batch of 3")),
            "{:?}",
            hooks.events()
        );
    }
}

relay_test! {
    async fn a_panicking_publisher_does_not_kill_the_relay() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        publisher.panics.store(1, Ordering::SeqCst);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.row(id).attempts,
            1,
            "the panic counted as a retriable failure"
        );
        assert!(
            hooks
                .loop_errors()
                .iter()
                .any(|m| m.contains("panicked") && m.contains("publisher exploded"))
        );
    }
}

relay_test! {
    async fn a_hung_publisher_is_cut_off_at_the_claim_timeout() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        *publisher.slow_once.lock().unwrap() = Some(LONG);
        let config = config().claim_timeout(ms(100));
        let relay = start(&store, &publisher, &hooks, config);
        eventually("done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        assert_eq!(store.row(id).attempts, 1);
        assert!(
            hooks
                .loop_errors()
                .iter()
                .any(|m| m.contains("claim timeout"))
        );
    }
}

relay_test! {
    async fn panicking_hooks_do_not_kill_the_relay() {
        let store = FakeStore::default();
        let publisher = Arc::new(FakePublisher::default());
        let hooks = Arc::new(Recorder::panicking());
        let ok = store.enqueue(None);
        let retried = store.enqueue(None);
        let poison = store.enqueue(None);
        publisher.script(retried, [Err(PublishError::retriable("x")), Ok(())]);
        publisher.script(poison, [Err(PublishError::poison("x"))]);
        store.state().claim_errors.push_back(server_error(1205));
        let relay = start(&store, &publisher, &hooks, config());
        eventually("settled", || {
            store.status(ok) == Status::Done
                && store.status(retried) == Status::Done
                && store.status(poison) == Status::Dead
        })
        .await;
        relay.stop().await.unwrap();

        let events = hooks.events();
        for expected in [
            Event::Claimed(3),
            Event::Published(1),
            Event::Failed(retried, ErrorKind::Retriable),
            Event::Dead(poison, ErrorKind::Poison),
        ] {
            assert!(events.contains(&expected), "{expected:?} in {events:?}");
        }
        assert!(matches!(events[0], Event::LoopError(_)));
    }
}

// ---------------------------------------------------------------- store faults

relay_test! {
    async fn a_transient_claim_error_is_reported_and_retried() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        {
            let mut state = store.state();
            state.claim_errors.push_back(server_error(1205));
            state
                .claim_errors
                .push_back(Error::Connection("connection reset".into()));
        }
        let relay = start(&store, &publisher, &hooks, config());
        eventually("done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        let errors = hooks.loop_errors();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("1205"));
        assert!(errors[1].contains("connection reset"));
        let calls = store.calls();
        assert_eq!(
            calls[..3],
            [Call::Error("claim"), Call::Error("claim"), Call::Claim]
        );
    }
}

relay_test! {
    /// An outage of twelve failed claims under the default policy (1 s doubling up to 5 min):
    /// no wait between two claims exceeds `MAX_STORE_RETRY_DELAY`, so the relay resumes within
    /// it of the store's return.
    async fn an_outage_backs_off_at_most_max_store_retry_delay() {
        let (store, publisher, hooks) = fakes();
        {
            let mut state = store.state();
            for _ in 0..12 {
                state
                    .claim_errors
                    .push_back(Error::Connection("connection refused".into()));
            }
        }
        let id = store.enqueue(None);
        let config = config().retry(RetryPolicy::default().jitter(false));
        let relay = start(&store, &publisher, &hooks, config);
        timeout(LONG, async {
            while store.status(id) != Status::Done {
                sleep(ms(10)).await;
            }
        })
        .await
        .expect("the relay resumes after the outage");
        relay.stop().await.unwrap();
        let times = store.claim_times();
        assert!(times.len() >= 13, "{}", times.len());
        for pair in times[..13].windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap <= MAX_STORE_RETRY_DELAY, "a wait of {gap:?}");
        }
    }
}

relay_test! {
    /// A wake (an enqueuer's, the binlog waker's reconnect) ends the wait after a failed claim.
    async fn a_wake_ends_the_wait_after_a_failed_claim() {
        let (store, publisher, hooks) = fakes();
        store
            .state()
            .claim_errors
            .push_back(Error::Connection("connection refused".into()));
        let id = store.enqueue(None);
        let relay = start(&store, &publisher, &hooks, config().poll_interval(LONG));
        eventually("the failed claim", || !store.claim_times().is_empty()).await;
        sleep(ms(100)).await;
        relay.handle.wake();
        eventually("done", || store.status(id) == Status::Done).await;
        let times = store.claim_times();
        // Woken at about 100 ms; without the wake it would be MAX_STORE_RETRY_DELAY (2 s).
        assert!(times[1] - times[0] < ms(500), "{:?}", times[1] - times[0]);
        relay.stop().await.unwrap();
    }
}

relay_test! {
    async fn a_store_error_on_acknowledgement_is_retried() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        store.state().done_errors.push_back(server_error(1205));
        let relay = start(&store, &publisher, &hooks, config());
        eventually("done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();

        // Claims may go between (the next batch is claimed while this one is in flight).
        let calls: Vec<Call> = store
            .calls()
            .into_iter()
            .filter(|call| *call != Call::Claim)
            .collect();
        assert_eq!(
            calls[..2],
            [
                Call::Error("mark_done"),
                Call::Done {
                    ids: vec![id],
                    changed: 1
                }
            ]
        );
        assert_eq!(publisher.publishes_of(id), 1, "not published twice");
        assert_eq!(hooks.loop_errors().len(), 1);
    }
}

relay_test! {
    async fn a_lost_claim_is_reported() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        let thief = store.clone();
        // Another relay re-claims the message while this one is publishing it.
        publisher.during_publish(move || thief.steal(id));
        let relay = start(&store, &publisher, &hooks, config());
        eventually("acknowledged", || !store.acks().is_empty()).await;
        relay.stop().await.unwrap();

        assert_eq!(
            store.acks()[0],
            Call::Done {
                ids: vec![id],
                changed: 0
            }
        );
        assert_eq!(
            store.status(id),
            Status::Processing,
            "the other claim keeps it"
        );
        assert!(hooks.events().contains(&Event::ClaimLost(1)));
    }
}

// ---------------------------------------------------------------- polling and waking

relay_test! {
    async fn an_empty_claim_waits_the_poll_interval() {
        let (store, publisher, hooks) = fakes();
        let config = config().poll_interval(ms(100));
        let relay = start(&store, &publisher, &hooks, config);
        sleep(ms(350)).await;
        relay.stop().await.unwrap();

        let claims = store.claim_times();
        assert!(claims.len() >= 2, "{claims:?}");
        for pair in claims.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= ms(100) && gap < ms(102), "{gap:?}");
        }
    }
}

relay_test! {
    async fn a_full_batch_is_followed_by_an_immediate_claim() {
        let (store, publisher, hooks) = fakes();
        let ids: Vec<i64> = (0..5).map(|_| store.enqueue(None)).collect();
        let config = config().batch_size(2).poll_interval(LONG);
        let relay = start(&store, &publisher, &hooks, config);
        eventually("all done without a poll wait", || {
            ids.iter().all(|id| store.status(*id) == Status::Done)
        })
        .await;
        relay.stop().await.unwrap();
        assert_eq!(publisher.batches(), [vec![1, 2], vec![3, 4], vec![5]]);
    }
}

relay_test! {
    async fn a_wake_ends_an_idle_wait() {
        let (store, publisher, hooks) = fakes();
        let config = config().poll_interval(LONG);
        let relay = start(&store, &publisher, &hooks, config);
        eventually("first claim", || !store.claim_times().is_empty()).await;
        let id = store.enqueue(None);
        relay.handle.wake();
        eventually("woken and done", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();
    }
}

relay_test! {
    async fn a_wake_during_a_batch_is_not_lost() {
        let (store, publisher, hooks) = fakes();
        let mut config = config();
        config.poll_interval = LONG;
        config.retry.initial = LONG; // the failed message is not due again during the test
        config.retry.max = LONG;
        let relay = start(&store, &publisher, &hooks, config);
        eventually("first (empty) claim", || !store.claim_times().is_empty()).await;

        // The first message fails, so the relay would go on to sleep poll_interval; while it
        // is being published a second message is enqueued and the relay woken.
        let first = store.enqueue(None);
        publisher.script(first, [Err(PublishError::retriable("flaky"))]);
        let (enqueuer, handle) = (store.clone(), relay.handle.clone());
        publisher.during_publish(move || {
            enqueuer.enqueue(None);
            handle.wake();
        });
        relay.handle.wake();
        eventually("the second message, without waiting 60 s", || {
            store.state().rows.len() == 2 && store.status(2) == Status::Done
        })
        .await;
        relay.stop().await.unwrap();
        assert_eq!(store.status(first), Status::Failed);
        let times = publisher.batches.lock().unwrap().clone();
        assert_eq!(times[1].1, [2]);
        assert_eq!(
            times[1].0 - times[0].0,
            Duration::ZERO,
            "claimed again at once, not after a timer"
        );
    }
}

relay_test! {
    async fn a_wake_during_a_claim_is_not_lost() {
        let (store, publisher, hooks) = fakes();
        let gate = store.gate_next_claim();
        let config = config().poll_interval(LONG);
        let relay = start(&store, &publisher, &hooks, config);
        // The claim has looked at the table (and found nothing) but not returned yet.
        timeout(PATIENCE, gate.started.notified()).await.unwrap();
        let id = store.enqueue(None);
        relay.handle.wake();
        gate.release.notify_one();
        eventually("claimed again at once", || store.status(id) == Status::Done).await;
        relay.stop().await.unwrap();
    }
}

/// A batch that meets backpressure while the next claim is under way (batches in flight:
/// the claim holds the store, the batch's requeue waits for it) pauses the claims all the
/// same: that claim's messages are not the news that the broker is no longer throttled, so
/// only the claim already under way runs before the pause ends.
#[tokio::test(start_paused = true)]
async fn a_backpressure_pause_outlasts_the_claim_under_way() {
    let (store, publisher, hooks) = fakes();
    store.state().claim_delay = Some(ms(10));
    for _ in 0..20 {
        store.enqueue(None);
    }
    publisher.script(1, [Err(PublishError::backpressure("slow down")), Ok(())]);
    let mut config = config().batch_size(1).max_in_flight(4).poll_interval(LONG);
    config.retry.initial = Duration::from_secs(1);
    let relay = start(&store, &publisher, &hooks, config);
    eventually("the requeue", || !store.state().requeue_times.is_empty()).await;
    let paused_at = store.state().requeue_times[0];
    sleep(Duration::from_secs(2)).await;
    relay.stop().await.unwrap();

    let pause_ends = paused_at + Duration::from_secs(1);
    let during_pause: Vec<Duration> = store
        .claim_times()
        .into_iter()
        .filter(|t| *t >= paused_at && *t < pause_ends)
        .map(|t| t - paused_at)
        .collect();
    // The claim already under way when the pause began started at most 10 ms before the
    // requeue it held up; any claim after it is one started into the pause.
    assert!(
        during_pause.len() <= 1,
        "claims started during the pause, after the requeue: {during_pause:?}"
    );
    assert!(
        store.claim_times().iter().any(|t| *t >= pause_ends),
        "the relay claims again after the pause"
    );
}

// ---------------------------------------------------------------- shutdown

relay_test! {
    async fn shutdown_drains_the_in_flight_batch() {
        let (store, publisher, hooks) = fakes();
        let ids: Vec<i64> = (0..2).map(|_| store.enqueue(None)).collect();
        let slot = Arc::new(Mutex::new(None::<oneshot::Sender<()>>));
        let during = Arc::clone(&slot);
        let enqueuer = store.clone();
        let claims_at_shutdown = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&claims_at_shutdown);
        *publisher.slow_once.lock().unwrap() = Some(ms(200));
        publisher.during_publish(move || {
            // Shutdown arrives mid-publish, along with a message that must wait for the next
            // relay.
            enqueuer.enqueue(None);
            counted.store(enqueuer.claim_times().len(), Ordering::SeqCst);
            let _ = during.lock().unwrap().take().unwrap().send(());
        });
        let relay = start(&store, &publisher, &hooks, config());
        *slot.lock().unwrap() = relay.shutdown.lock().unwrap().take();

        relay.finish().await.unwrap();
        assert!(ids.iter().all(|id| store.status(*id) == Status::Done));
        assert_eq!(store.status(3), Status::Pending);
        assert_eq!(
            store.claim_times().len(),
            claims_at_shutdown.load(Ordering::SeqCst),
            "no claim after shutdown"
        );
    }
}

relay_test! {
    async fn shutdown_while_idle_returns_promptly() {
        let (store, publisher, hooks) = fakes();
        let config = config().poll_interval(LONG);
        let relay = start(&store, &publisher, &hooks, config);
        eventually("idle", || !store.claim_times().is_empty()).await;
        relay.stop().await.unwrap();
    }
}

// ---------------------------------------------------------------- run_once and config

relay_test! {
    async fn run_once_processes_one_batch_and_reports_it() {
        let (store, publisher, hooks) = fakes();
        let ids: Vec<i64> = (0..4).map(|_| store.enqueue(None)).collect();
        publisher.script(ids[1], [Err(PublishError::retriable("x"))]);
        publisher.script(ids[2], [Err(PublishError::poison("x"))]);
        publisher.script(ids[3], [Err(PublishError::backpressure("x"))]);
        let mut relay = Relay::new(store.clone(), Arc::clone(&publisher), config())
            .unwrap()
            .with_hooks(Arc::clone(&hooks));

        let report: BatchReport = relay.run_once().await.unwrap();
        assert_eq!(
            (
                report.claimed,
                report.published,
                report.failed,
                report.dead,
                report.requeued
            ),
            (4, 1, 1, 1, 1)
        );
        assert_eq!(report.claim_lost, 0);
        assert_eq!(report.unacknowledged, 0);

        let empty = relay.run_once().await.unwrap();
        assert_eq!(empty, BatchReport::default());

        let fatal = store.enqueue(None);
        publisher.script(fatal, [Err(PublishError::fatal("revoked")), Ok(())]);
        assert!(matches!(relay.run_once().await, Err(Error::Publisher(_))));
        assert_eq!(store.status(fatal), Status::Failed);
        // Handed back due at once: the next claim takes it again, with no attempt counted.
        let report = relay.run_once().await.unwrap();
        assert_eq!((report.claimed, report.published), (1, 1));
        assert_eq!(store.row(fatal).attempts, 0);
        assert_eq!(store.status(fatal), Status::Done);
    }
}

relay_test! {
    async fn an_invalid_config_is_refused() {
        let (store, publisher, _) = fakes();
        let config = config().batch_size(0);
        match Relay::new(store, publisher, config) {
            Err(Error::Config(message)) => assert!(message.contains("batch_size"), "{message}"),
            Err(other) => panic!("expected a config error, got {other:?}"),
            Ok(_) => panic!("batch_size 0 was accepted"),
        }
    }
}

// ---------------------------------------------------------------- undecodable rows

relay_test! {
    async fn an_undecodable_row_goes_dead_with_its_raw_text_and_the_batch_goes_on() {
        let (store, publisher, hooks) = fakes();
        let first = store.enqueue(Some("order-1"));
        let bad = store.enqueue_with(|row| {
            row.aggregate_id = Some("order-2".to_owned());
            row.attempts = 1;
            row.undecodable_payload = Some("[1e400]".to_owned());
        });
        let behind_bad = store.enqueue(Some("order-2"));
        let last = store.enqueue(None);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("everything acknowledged", || {
            [first, behind_bad, last]
                .iter()
                .all(|id| store.status(*id) == Status::Done)
        })
        .await;
        relay.stop().await.unwrap();

        // Dead at once, never published, with an attempt counted and its reason kept.
        assert_eq!(store.status(bad), Status::Dead);
        assert_eq!(publisher.publishes_of(bad), 0);
        let row = store.row(bad);
        assert_eq!(row.attempts, 2);
        let error = row.last_error.unwrap();
        assert!(error.starts_with("poison:"), "{error}");
        assert!(error.contains("cannot be decoded"), "{error}");
        // The dead letter carries the raw text.
        assert_eq!(
            *publisher.dead_letter_payloads.lock().unwrap(),
            [(bad, Some("[1e400]".to_owned()))]
        );
        let (id, headers) = &publisher.dead_letters()[0];
        assert_eq!(*id, bad);
        assert_eq!(headers["x-error-kind"], "poison");
        assert_eq!(headers["x-original-topic"], "orders");
        assert_eq!(headers["x-attempts"], "2");
        assert!(
            hooks
                .events()
                .contains(&Event::Dead(bad, ErrorKind::Poison))
        );
        // The bad row's aggregate was not blocked: its next message went out after it.
        assert_eq!(publisher.publishes_of(behind_bad), 1);
    }
}

relay_test! {
    async fn run_once_counts_an_undecodable_row_as_dead() {
        let (store, publisher, hooks) = fakes();
        store.enqueue(None);
        store.enqueue_with(|row| row.undecodable_payload = Some(r#"{"s":"\ud800"}"#.to_owned()));
        let mut relay = Relay::new(store.clone(), Arc::clone(&publisher), config())
            .unwrap()
            .with_hooks(Arc::clone(&hooks));
        let report = relay.run_once().await.unwrap();
        assert_eq!((report.claimed, report.published, report.dead), (2, 1, 1));
        assert_eq!(publisher.batches(), [vec![1]]);
    }
}

// ---------------------------------------------------------------- permanent store errors

relay_test! {
    async fn a_permanent_store_error_on_acknowledgement_is_not_retried() {
        for number in [229, 2812] {
            let (store, publisher, hooks) = fakes();
            let id = store.enqueue(None);
            for _ in 0..50 {
                store.state().done_errors.push_back(server_error(number));
            }
            let mut relay = Relay::new(store.clone(), Arc::clone(&publisher), config())
                .unwrap()
                .with_hooks(Arc::clone(&hooks));
            let started = Instant::now();
            let report = relay.run_once().await.unwrap();

            assert_eq!(report.unacknowledged, 1, "{number}");
            assert_eq!(
                store.calls(),
                [Call::Claim, Call::Error("mark_done")],
                "{number}: one attempt, no retries"
            );
            assert_eq!(started.elapsed(), Duration::ZERO, "{number}: no back-off");
            assert_eq!(hooks.loop_errors().len(), 1, "{number}");
            assert_eq!(store.status(id), Status::Processing, "{number}");
        }
    }
}

// ---------------------------------------------------------------- shutdown during a claim

/// Starts a relay, signals shutdown while its first claim is under way, lets the claim
/// answer `after` that, and waits for `run` to return.
async fn stop_during_a_claim_that_answers_after(
    store: &FakeStore,
    publisher: &Arc<FakePublisher>,
    hooks: &Arc<Recorder>,
    after: Duration,
) {
    let gate = store.gate_next_claim();
    let relay = start(store, publisher, hooks, config());
    gate.started.notified().await;
    relay.signal_stop();
    sleep(after).await;
    gate.release.notify_one();
    relay.finish().await.unwrap();
}

relay_test! {
    async fn shutdown_does_not_wait_for_a_claim_that_never_answers() {
        let (store, publisher, hooks) = fakes();
        store.enqueue(None);
        store.state().claims_hang = true;
        let relay = start(&store, &publisher, &hooks, config());
        sleep(ms(50)).await;

        let stopped = Instant::now();
        relay.signal_stop();
        let returned = timeout(SHUTDOWN_CLAIM_GRACE * 2, relay.task)
            .await
            .expect("shutdown waited for a hanging claim")
            .unwrap();
        returned.unwrap();
        assert_eq!(stopped.elapsed(), SHUTDOWN_CLAIM_GRACE);
        assert!(publisher.batches().is_empty());
    }
}

relay_test! {
    async fn a_claim_that_answers_within_the_grace_is_finished_on_shutdown() {
        let (store, publisher, hooks) = fakes();
        let id = store.enqueue(None);
        stop_during_a_claim_that_answers_after(&store, &publisher, &hooks, ms(500)).await;
        assert_eq!(store.status(id), Status::Done);
        assert_eq!(store.claim_times().len(), 1, "no claim after shutdown");
    }
}

relay_test! {
    async fn an_empty_claim_that_answers_within_the_grace_ends_the_run() {
        let (store, publisher, hooks) = fakes();
        stop_during_a_claim_that_answers_after(&store, &publisher, &hooks, ms(500)).await;
        assert_eq!(store.claim_times().len(), 1, "no claim after shutdown");
    }
}

// ---------------------------------------------------------------- batches in flight

/// Delivers each message of a batch after a delay of its own (drawn from a seeded source),
/// some as retriable failures, and checks at each delivery that every earlier message of
/// the aggregate is already acknowledged (done or dead) in the store.
struct DelayPublisher {
    store: FakeStore,
    rng: Mutex<StdRng>,
    /// Delays are drawn from 0..=this.
    max_delay: Duration,
    /// Percent of deliveries that fail (retriable).
    fail_percent: u32,
    /// Every message delivered (an `Ok` outcome), in delivery order.
    delivered: Mutex<Vec<i64>>,
    /// (delivered message, its earlier message of the aggregate not yet acknowledged).
    overtaken: Mutex<Vec<(i64, i64)>>,
    calls: AtomicUsize,
    most_calls: AtomicUsize,
}

impl DelayPublisher {
    fn new(store: &FakeStore, seed: u64, max_delay: Duration, fail_percent: u32) -> Self {
        DelayPublisher {
            store: store.clone(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            max_delay,
            fail_percent,
            delivered: Mutex::new(Vec::new()),
            overtaken: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
            most_calls: AtomicUsize::new(0),
        }
    }

    fn deliver(&self, message: &ClaimedMessage) {
        let state = self.store.state();
        let waiting = state.rows.iter().find(|row| {
            row.id < message.id
                && row.aggregate_id.is_some()
                && row.aggregate_id == message.aggregate_id
                && !matches!(row.status, Status::Done | Status::Dead)
        });
        if let Some(row) = waiting {
            self.overtaken.lock().unwrap().push((message.id, row.id));
        }
        drop(state);
        self.delivered.lock().unwrap().push(message.id);
    }
}

impl Publisher for DelayPublisher {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let calls = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_calls.fetch_max(calls, Ordering::SeqCst);
        let started = Instant::now();
        let mut plan: Vec<(Duration, usize, bool)> = {
            let mut rng = self.rng.lock().unwrap();
            let max = self.max_delay.as_millis() as u64;
            (0..batch.len())
                .map(|index| {
                    let delay = ms(rng.random_range(0..=max));
                    (delay, index, rng.random_range(0..100) >= self.fail_percent)
                })
                .collect()
        };
        plan.sort();
        let mut outcomes = vec![Ok(()); batch.len()];
        for (delay, index, ok) in plan {
            tokio::time::sleep_until(started + delay).await;
            if ok {
                self.deliver(&batch[index]);
            } else {
                outcomes[index] = Err(PublishError::retriable("the broker timed out"));
            }
        }
        self.calls.fetch_sub(1, Ordering::SeqCst);
        outcomes
    }
}

/// One case of the property below: `messages` messages over `aggregates` aggregates
/// (drawn from `seed`), relayed with `max_in_flight` batches of `batch_size` in flight.
async fn in_flight_case(
    seed: u64,
    aggregates: usize,
    messages: usize,
    max_in_flight: u32,
    batch_size: u32,
) {
    let store = FakeStore::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for _ in 0..messages {
        let aggregate = format!("a{}", rng.random_range(0..aggregates));
        store.enqueue(Some(&aggregate));
    }
    let publisher = Arc::new(DelayPublisher::new(&store, seed, ms(40), 10));
    // Plenty of attempts: a message failing ten times in a row is not the point here.
    let config = config()
        .max_in_flight(max_in_flight)
        .batch_size(batch_size)
        .retry(
            RetryPolicy::default()
                .initial(ms(10))
                .max(ms(100))
                .max_attempts(20)
                .jitter(false),
        );
    let relay = Relay::new(store.clone(), Arc::clone(&publisher), config).unwrap();
    let watched = store.clone();
    let all_acknowledged = async move {
        while !watched
            .state()
            .rows
            .iter()
            .all(|row| matches!(row.status, Status::Done | Status::Dead))
        {
            sleep(ms(5)).await;
        }
    };
    timeout(Duration::from_secs(3600), relay.run(all_acknowledged))
        .await
        .expect("the relay did not deliver every message")
        .unwrap();
    assert_acknowledged_once_in_order(&store, &publisher, messages, max_in_flight);
}

/// After a run over messages 1..=`messages`: none was delivered before every earlier
/// message of its aggregate was acknowledged, every one was acknowledged exactly once (done,
/// or dead) and never fenced off, a done one was delivered once and a dead one never, and
/// at most `max_in_flight` publishes ran at once.
fn assert_acknowledged_once_in_order(
    store: &FakeStore,
    publisher: &DelayPublisher,
    messages: usize,
    max_in_flight: u32,
) {
    let overtaken = publisher.overtaken.lock().unwrap().clone();
    assert!(
        overtaken.is_empty(),
        "successors delivered before their predecessor was acknowledged: {overtaken:?}"
    );
    let mut final_acks: HashMap<i64, usize> = HashMap::new();
    for call in store.calls() {
        match call {
            Call::Done { ids, changed } => {
                assert_eq!(changed, ids.len() as u64, "a done was fenced off: {ids:?}");
                for id in ids {
                    *final_acks.entry(id).or_default() += 1;
                }
            }
            Call::Failed {
                id, dead, changed, ..
            } => {
                assert_eq!(changed, 1, "a failure of {id} was fenced off");
                if dead {
                    *final_acks.entry(id).or_default() += 1;
                }
            }
            _ => {}
        }
    }
    let mut delivered: HashMap<i64, usize> = HashMap::new();
    for id in publisher.delivered.lock().unwrap().iter() {
        *delivered.entry(*id).or_default() += 1;
    }
    for id in 1..=messages as i64 {
        assert_eq!(
            final_acks.get(&id),
            Some(&1),
            "message {id}: {final_acks:?}"
        );
        let expected = usize::from(store.status(id) == Status::Done);
        assert_eq!(
            delivered.get(&id).copied().unwrap_or(0),
            expected,
            "message {id}"
        );
    }
    assert!(publisher.most_calls.load(Ordering::SeqCst) <= max_in_flight as usize);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Many aggregates, random delivery delays and failures, up to eight batches in flight:
    /// no message is delivered before every earlier message of its aggregate is
    /// acknowledged, and every message is acknowledged (done, or dead) exactly once.
    #[test]
    fn batches_in_flight_never_deliver_a_successor_before_its_predecessor_is_acknowledged(
        seed in any::<u64>(),
        aggregates in 1usize..60,
        messages in 1usize..400,
        max_in_flight in 1u32..=8,
        batch_size in 1u32..40,
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(in_flight_case(seed, aggregates, messages, max_in_flight, batch_size));
    }
}

/// The cases above do overlap: with several batches in flight, the publisher is called
/// for the next batch before the earlier ones are delivered.
#[tokio::test(start_paused = true)]
async fn batches_overlap_up_to_max_in_flight() {
    let (store, _, hooks) = fakes();
    for n in 0..40 {
        store.enqueue(Some(&format!("a{n}")));
    }
    let publisher = Arc::new(DelayPublisher::new(&store, 1, ms(100), 0));
    let config = config().batch_size(5).max_in_flight(3);
    let relay = Relay::new(store.clone(), Arc::clone(&publisher), config)
        .unwrap()
        .with_hooks(Arc::clone(&hooks));
    relay.run(all_done(store.clone(), 40)).await.unwrap();
    assert_eq!(publisher.most_calls.load(Ordering::SeqCst), 3);
}

/// Shutdown with four batches in flight: no claim starts after it, and all four are
/// delivered and acknowledged side by side, in the time of one, well inside a grace
/// period that four batches one after another would not fit in.
#[tokio::test(start_paused = true)]
async fn shutdown_drains_every_batch_in_flight_within_the_grace() {
    let (store, _, hooks) = fakes();
    for n in 0..40 {
        store.enqueue(Some(&format!("a{n}")));
    }
    // Every message is delivered 2 s after its batch's publish starts.
    struct TwoSeconds(Arc<DelayPublisher>);
    impl Publisher for TwoSeconds {
        async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
            let calls = self.0.calls.fetch_add(1, Ordering::SeqCst) + 1;
            self.0.most_calls.fetch_max(calls, Ordering::SeqCst);
            sleep(Duration::from_secs(2)).await;
            batch.iter().for_each(|m| self.0.deliver(m));
            self.0.calls.fetch_sub(1, Ordering::SeqCst);
            vec![Ok(()); batch.len()]
        }
    }
    let delays = Arc::new(DelayPublisher::new(&store, 1, ms(0), 0));
    let grace = Duration::from_secs(5);
    let config = config().batch_size(5).max_in_flight(4);
    let relay = Relay::new(store.clone(), TwoSeconds(Arc::clone(&delays)), config)
        .unwrap()
        .with_hooks(Arc::clone(&hooks));
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(1);
    timeout(
        grace + Duration::from_secs(1),
        relay.run(tokio::time::sleep_until(stop_at)),
    )
    .await
    .expect("the relay did not stop")
    .unwrap();
    let stopped = Instant::now();
    assert!(
        stopped - stop_at < grace,
        "draining took {:?}",
        stopped - stop_at
    );
    assert_eq!(delays.most_calls.load(Ordering::SeqCst), 4);
    assert_eq!(store.claim_times().len(), 4, "no claim after shutdown");
    let done = (1..=40)
        .filter(|id| store.status(*id) == Status::Done)
        .count();
    assert_eq!(done, 20, "the four batches in flight, and nothing else");
    assert!(delays.overtaken.lock().unwrap().is_empty());
}

/// A publisher stating its longest publish and whether its calls wait for each other.
struct Bounded {
    longest: Duration,
    side_by_side: bool,
}

impl Publisher for Bounded {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        vec![Ok(()); batch.len()]
    }

    fn longest_publish(&self) -> Option<Duration> {
        Some(self.longest)
    }

    fn longest_publish_in_flight(&self, in_flight: u32) -> Option<Duration> {
        if self.side_by_side {
            Some(self.longest)
        } else {
            Some(self.longest * in_flight)
        }
    }
}

/// The claim must outlast a publish that waits behind the other batches in flight: 10 s
/// publishes that queue behind each other fit a 30 s claim (three quarters: 22.5 s) at two
/// in flight, not at three; side by side they fit at any number.
#[tokio::test]
async fn the_claim_timeout_covers_the_wait_behind_other_batches() {
    let config = RelayConfig::default().claim_timeout(Duration::from_secs(30));
    let queued = Bounded {
        longest: Duration::from_secs(10),
        side_by_side: false,
    };
    config
        .clone()
        .max_in_flight(1)
        .check_publisher(&queued)
        .unwrap();
    config
        .clone()
        .max_in_flight(2)
        .check_publisher(&queued)
        .unwrap();
    let error = config
        .clone()
        .max_in_flight(3)
        .check_publisher(&queued)
        .expect_err("30 s of publish in a 30 s claim");
    let message = error.to_string();
    for part in [
        "30s with 3 batches in flight",
        "lower max_in_flight",
        "22.5s",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(matches!(
        Relay::new(
            FakeStore::default(),
            queued,
            config.clone().max_in_flight(3)
        ),
        Err(Error::Config(_))
    ));

    // The trait's default: calls may queue, so each one in flight adds a whole publish.
    struct Default10s;
    impl Publisher for Default10s {
        async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
            vec![Ok(()); batch.len()]
        }
        fn longest_publish(&self) -> Option<Duration> {
            Some(Duration::from_secs(10))
        }
    }
    assert_eq!(
        Default10s.longest_publish_in_flight(4),
        Some(Duration::from_secs(40))
    );
    config
        .clone()
        .max_in_flight(2)
        .check_publisher(&Default10s)
        .unwrap();
    config
        .clone()
        .max_in_flight(3)
        .check_publisher(&Default10s)
        .unwrap_err();

    let side_by_side = Bounded {
        longest: Duration::from_secs(20),
        side_by_side: true,
    };
    config
        .max_in_flight(64)
        .check_publisher(&side_by_side)
        .unwrap();
}

// ---------------------------------------------------------------- a store whose claim waits

/// Runs a relay over an empty outbox whose claim waits `claim_wait` on the server, with
/// `poll_interval`, for `run_for`; returns the gaps between its claims' starts.
async fn gaps_between_waiting_claims(
    claim_wait: Duration,
    poll_interval: Duration,
    run_for: Duration,
) -> Vec<Duration> {
    let (store, publisher, hooks) = fakes();
    store.state().claim_wait = Some(claim_wait);
    let relay = start(
        &store,
        &publisher,
        &hooks,
        config().poll_interval(poll_interval),
    );
    sleep(run_for).await;
    relay.stop().await.unwrap();
    let claims = store.claim_times();
    assert!(claims.len() >= 3, "{claims:?}");
    claims.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

relay_test! {
    async fn an_empty_claim_that_waited_on_the_server_is_followed_at_once() {
        // The poll interval counts from the claim's start, and the claim's own wait is longer.
        for gap in gaps_between_waiting_claims(ms(300), ms(100), ms(1000)).await {
            assert!(gap >= ms(300) && gap < ms(302), "{gap:?}");
        }
    }
}

relay_test! {
    async fn a_short_server_wait_still_keeps_the_poll_interval_between_claims() {
        for gap in gaps_between_waiting_claims(ms(30), ms(100), ms(450)).await {
            assert!(gap >= ms(100) && gap < ms(102), "{gap:?}");
        }
    }
}

relay_test! {
    async fn shutdown_cancels_a_waiting_claim_at_once() {
        let (store, publisher, hooks) = fakes();
        store.state().claim_wait = Some(LONG);
        // It says when it answers, as SqlClaimStore does: a claim still waiting is stopped.
        store.state().progress = Some(ClaimProgress::new());
        let relay = start(&store, &publisher, &hooks, config());
        eventually("the claim is waiting", || store.claim_times().len() == 1).await;

        let stopped = Instant::now();
        relay.signal_stop();
        relay.finish().await.unwrap();
        assert!(stopped.elapsed() < ms(1), "{:?}", stopped.elapsed());
        assert_eq!(store.state().cancelled_claims, 1);
        assert_eq!(store.claim_times().len(), 1, "no claim after shutdown");
    }
}

relay_test! {
    async fn a_claim_that_does_not_wait_is_not_cancelled_on_shutdown() {
        let (store, publisher, hooks) = fakes();
        stop_during_a_claim_that_answers_after(&store, &publisher, &hooks, ms(500)).await;
        assert_eq!(store.state().cancelled_claims, 0);
    }
}

/// A claim that waits on the server holds the store's one connection. Beside a batch in
/// flight it would hold up that batch's acknowledgement for its whole wait (and with it
/// the aggregates' next messages): the acknowledgement stops the waiting claim, which is
/// cancelled on the server, and goes first. So whether or not the store says when its
/// claim answers (`reports_progress`): this one never does, it only waits.
async fn a_batch_in_flight_stops_a_waiting_claim_to_acknowledge(reports_progress: bool) {
    let (store, publisher, hooks) = fakes();
    store.state().claim_wait = Some(LONG);
    if reports_progress {
        store.state().progress = Some(ClaimProgress::new());
    }
    for n in 0..5 {
        store.enqueue(Some(&format!("a{n}")));
    }
    *publisher.slow_once.lock().unwrap() = Some(ms(200));
    // A full batch: more may be due, so the next claim starts beside it (and waits).
    let relay = start(
        &store,
        &publisher,
        &hooks,
        config().batch_size(5).max_in_flight(4),
    );
    let started = Instant::now();
    eventually("the batch is acknowledged", || {
        (1..=5).all(|id| store.status(id) == Status::Done)
    })
    .await;
    assert!(started.elapsed() < ms(250), "{:?}", started.elapsed());
    assert_eq!(store.state().cancelled_claims, 1);
    assert!(
        store.claim_times().len() >= 2,
        "a claim ran beside the batch"
    );
    relay.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_batch_in_flight_stops_a_waiting_claim_to_acknowledge_when_the_store_says_nothing() {
    a_batch_in_flight_stops_a_waiting_claim_to_acknowledge(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_batch_in_flight_stops_a_claim_that_says_it_still_waits() {
    a_batch_in_flight_stops_a_waiting_claim_to_acknowledge(true).await;
}

/// After a batch that was not full, nothing more is probably due: a store whose claim waits
/// claims again only once the batch is acknowledged, so no claim is started only to be
/// cancelled (SQL Server's cancel closes the connection).
#[tokio::test(start_paused = true)]
async fn a_waiting_claim_does_not_run_beside_a_batch_that_was_not_full() {
    let (store, publisher, hooks) = fakes();
    store.state().claim_wait = Some(LONG);
    store.enqueue(Some("a"));
    *publisher.slow_once.lock().unwrap() = Some(ms(200));
    let relay = start(&store, &publisher, &hooks, config().max_in_flight(4));
    sleep(ms(100)).await;
    assert_eq!(store.claim_times().len(), 1, "no claim beside the batch");
    eventually("the message is acknowledged", || {
        store.status(1) == Status::Done
    })
    .await;
    eventually("the next claim waits", || store.claim_times().len() == 2).await;
    assert_eq!(store.state().cancelled_claims, 0);
    relay.stop().await.unwrap();
    assert_eq!(store.state().cancelled_claims, 1, "the shutdown's");
}

/// A store whose claim waits, says when it answers, and answers `answer` after its last
/// try: the claim has committed its rows as claimed and they are on their way back, as a
/// large batch's rows are over the network.
fn store_answering_in(answer: Duration) -> FakeStore {
    let store = FakeStore::default();
    {
        let mut state = store.state();
        state.claim_wait = Some(Duration::from_secs(5));
        state.try_time = Some(ms(5));
        state.claim_delay = Some(answer);
        state.progress = Some(ClaimProgress::new());
    }
    store
}

/// A claim beside batches in flight that has committed rows as claimed and is returning them
/// is not stopped when a batch needs the store to acknowledge: the acknowledgement waits for
/// it. Stopped, its rows would be held by nobody until the claim timeout (10 s here) and
/// their next claim would count an attempt each, and every collision would make the relay
/// drain its batches in flight before claiming again: about one batch at a time. Here the
/// claims beside four batches in flight meet many acknowledgements.
#[tokio::test(start_paused = true)]
async fn an_acknowledgement_waits_for_a_claim_that_answers() {
    const MESSAGES: usize = 400;
    const BATCH: u32 = 10;
    const IN_FLIGHT: u32 = 4;
    let answer = ms(30);
    let publish = ms(150);
    let store = store_answering_in(answer);
    // 100 aggregates of 4 messages: each message's successor is claimed only after it.
    for n in 0..MESSAGES {
        store.enqueue(Some(&format!("a{}", n % 100)));
    }
    // Each message is delivered within `publish` of its batch's start (seeded draws).
    let publisher = Arc::new(DelayPublisher::new(&store, 30, publish, 0));
    let config = config().batch_size(BATCH).max_in_flight(IN_FLIGHT);
    let relay = Relay::new(store.clone(), Arc::clone(&publisher), config).unwrap();
    let started = Instant::now();
    timeout(
        Duration::from_secs(600),
        relay.run(all_done(store.clone(), MESSAGES as i64)),
    )
    .await
    .expect("the relay did not deliver every message")
    .unwrap();
    let took = started.elapsed();
    let batches = MESSAGES as u32 / BATCH;
    let one_at_a_time = (answer + publish) * batches;
    eprintln!(
        "{batches} batches, {IN_FLIGHT} in flight: {took:?} (one at a time: about \
         {one_at_a_time:?}); {} claims, {} stopped while waiting",
        store.claim_times().len(),
        store.state().cancelled_claims
    );

    let taken_back: Vec<(i64, i32)> = store
        .state()
        .rows
        .iter()
        .filter(|row| row.attempts > 0)
        .map(|row| (row.id, row.attempts))
        .collect();
    assert!(
        taken_back.is_empty(),
        "claims stopped after they had claimed: their rows were claimed again after the \
         claim timeout, an attempt each (id, attempts): {taken_back:?}"
    );
    assert_acknowledged_once_in_order(&store, &publisher, MESSAGES, IN_FLIGHT);
    assert!(
        took < one_at_a_time / 2,
        "{batches} batches took {took:?}; one at a time they take about {one_at_a_time:?}"
    );
    assert_eq!(
        publisher.most_calls.load(Ordering::SeqCst),
        IN_FLIGHT as usize,
        "batches overlapped"
    );
}

relay_test! {
    /// Shutdown while a claim answers: the claim is finished (within the grace) and its
    /// batch published and acknowledged, not stopped and left to the claim timeout.
    async fn shutdown_lets_a_claim_that_answers_finish_and_delivers_its_batch() {
        let store = store_answering_in(ms(500));
        let (_, publisher, hooks) = fakes();
        for n in 0..3 {
            store.enqueue(Some(&format!("a{n}")));
        }
        let relay = start(&store, &publisher, &hooks, config());
        eventually("the claim answers", || store.claim_times().len() == 1).await;
        sleep(ms(100)).await;

        relay.signal_stop();
        relay.finish().await.unwrap();
        let claimed = store.claim_times()[0];
        assert_eq!(
            claimed.elapsed(),
            ms(5 + 500),
            "the relay returned when the answer ended (and its batch was acknowledged)"
        );
        assert_eq!(publisher.batches(), [vec![1, 2, 3]]);
        assert!((1..=3).all(|id| store.status(id) == Status::Done));
        assert_eq!(store.state().cancelled_claims, 0);
        assert_eq!(store.claim_times().len(), 1, "no claim after shutdown");
    }
}

relay_test! {
    /// An answer that never ends (a network gone mid-answer) holds shutdown no longer than
    /// any claim under way: [`SHUTDOWN_CLAIM_GRACE`].
    async fn shutdown_abandons_a_claim_that_never_finishes_its_answer_after_the_grace() {
        let store = store_answering_in(LONG * 10);
        let (_, publisher, hooks) = fakes();
        store.enqueue(None);
        let relay = start(&store, &publisher, &hooks, config());
        eventually("the claim answers", || store.claim_times().len() == 1).await;
        sleep(ms(100)).await;

        let stopped = Instant::now();
        relay.signal_stop();
        let returned = timeout(SHUTDOWN_CLAIM_GRACE * 2, relay.task)
            .await
            .expect("shutdown waited for an answer that never ends")
            .unwrap();
        returned.unwrap();
        assert_eq!(stopped.elapsed(), SHUTDOWN_CLAIM_GRACE);
        assert!(publisher.batches().is_empty());
    }
}

// ---------------------------------------------------------------- metrics

/// One series: the metric's name and its labels in order.
type Series = (String, Vec<(String, String)>);

/// A `metrics` recorder that keeps the series the relay registers, and its counters'
/// values.
#[derive(Default)]
struct SeriesRecorder(Mutex<HashMap<Series, Arc<AtomicU64>>>);

impl SeriesRecorder {
    fn keep(&self, key: &metrics::Key) -> Arc<AtomicU64> {
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let mut series = self.0.lock().unwrap();
        Arc::clone(series.entry((key.name().to_owned(), labels)).or_default())
    }

    fn series(&self) -> HashSet<Series> {
        self.0.lock().unwrap().keys().cloned().collect()
    }

    /// The value of counter `name` with `labels` (0 when never registered).
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.0
            .lock()
            .unwrap()
            .get(&(name.to_owned(), labels))
            .map_or(0, |value| value.load(Ordering::SeqCst))
    }
}

impl metrics::Recorder for SeriesRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.keep(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.keep(key);
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.keep(key);
        metrics::Histogram::noop()
    }
}

/// Relays `count` messages, each of its own aggregate, over `topics` in turn, a fifth of
/// them poison (whose dead letters fail), a fifth failing once, a fifth meeting
/// backpressure once; returns the series the relay registered.
async fn series_of_a_run(count: usize, topics: &[&str]) -> HashSet<Series> {
    let recorder = SeriesRecorder::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (store, publisher, _hooks) = fakes();
    *publisher.dead_letter_error.lock().unwrap() = Some(PublishError::retriable("dlq down"));
    for n in 0..count {
        let topic = topics[n % topics.len()].to_owned();
        let id = store.enqueue_with(|row| {
            row.topic = topic;
            row.aggregate_id = Some(format!("aggregate-{n}"));
        });
        match id % 5 {
            1 => publisher.script(id, [Err(PublishError::poison("too large"))]),
            2 => publisher.script(id, [Err(PublishError::retriable("timed out"))]),
            3 => publisher.script(
                id,
                [Err(PublishError::new(
                    ErrorKind::Backpressure,
                    "queue full",
                ))],
            ),
            _ => {}
        }
    }
    let mut relay = Relay::new(store.clone(), Arc::clone(&publisher), config()).unwrap();
    for _ in 0..(count * 4) {
        if (1..=count as i64).all(|id| matches!(store.status(id), Status::Done | Status::Dead)) {
            break;
        }
        relay.run_once().await.unwrap();
        sleep(Duration::from_secs(2)).await; // past every retry delay
    }
    assert!(
        (1..=count as i64).all(|id| matches!(store.status(id), Status::Done | Status::Dead)),
        "every message was published or went dead"
    );
    recorder.series()
}

/// The relay's series are the same for 20 messages and for 200: no label carries a message
/// id, an aggregate id or anything else that grows with the messages, every series is in
/// the catalogue with its labels, and topics past MAX_TOPICS fold into one label value.
#[tokio::test(start_paused = true)]
async fn metric_series_do_not_grow_with_messages() {
    let topics = ["orders", "payments", "refunds"];
    let few = series_of_a_run(20, &topics).await;
    let many = series_of_a_run(200, &topics).await;
    assert_eq!(few, many, "the series of 20 and of 200 messages");
    let names: HashSet<&str> = many.iter().map(|(name, _)| name.as_str()).collect();
    for name in [
        changefeed::metrics::RELAY_PUBLISHED,
        changefeed::metrics::RELAY_FAILED,
        changefeed::metrics::RELAY_DEAD,
        changefeed::metrics::RELAY_DEAD_LETTERS_FAILED,
        changefeed::metrics::RELAY_REQUEUED,
        changefeed::metrics::RELAY_CLAIM_SECONDS,
        changefeed::metrics::RELAY_BATCH_SIZE,
    ] {
        assert!(names.contains(name), "{name} was recorded: {names:?}");
    }
    for (name, labels) in &many {
        let metric = changefeed::metrics::lookup(name)
            .unwrap_or_else(|| panic!("{name} is not in the catalogue"));
        let keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, metric.labels, "{name}'s labels");
        for (key, value) in labels {
            assert!(
                !value.contains("aggregate-") && !value.starts_with("m-"),
                "{name}{{{key}={value:?}}} carries a message's identity"
            );
        }
    }

    // An application that writes a topic per entity: the labels stop at MAX_TOPICS.
    let per_entity: Vec<String> = (0..300).map(|n| format!("entity-{n}")).collect();
    let per_entity: Vec<&str> = per_entity.iter().map(String::as_str).collect();
    let series = series_of_a_run(300, &per_entity).await;
    let published_topics: HashSet<&str> = series
        .iter()
        .filter(|(name, _)| name == changefeed::metrics::RELAY_PUBLISHED)
        .flat_map(|(_, labels)| labels.iter().filter(|(k, _)| k == "topic"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        published_topics.len() <= changefeed::metrics::MAX_TOPICS + 1,
        "{} topic labels",
        published_topics.len()
    );
    assert!(published_topics.contains(changefeed::metrics::OTHER_TOPIC));
}

/// A [`FakeStore`] whose calls run as on one pipelined connection shared with its
/// concurrent handles (PostgreSQL's): a call takes effect when it is sent (the server runs
/// the calls in the order they were sent) and its answer arrives some time later. The log
/// says what was sent, when, and when it was answered.
#[derive(Clone)]
struct PipelinedStore {
    store: FakeStore,
    log: Arc<Mutex<Vec<PipelinedCall>>>,
    claim_answer: Duration,
    ack_answer: Duration,
    claims: Arc<AtomicUsize>,
    /// Pauses the second claim at this gate (after its snapshot) until released.
    second_claim: Option<Arc<ClaimGate>>,
}

#[derive(Clone, Debug)]
struct PipelinedCall {
    /// "claim" (one that claimed rows), "empty claim" or "done".
    what: &'static str,
    sent: Instant,
    answered: Option<Instant>,
}

impl PipelinedStore {
    fn new(store: FakeStore, claim_answer: Duration, ack_answer: Duration) -> Self {
        PipelinedStore {
            store,
            log: Arc::default(),
            claim_answer,
            ack_answer,
            claims: Arc::default(),
            second_claim: None,
        }
    }

    fn sent(&self, what: &'static str) -> usize {
        let mut log = self.log.lock().unwrap();
        log.push(PipelinedCall {
            what,
            sent: Instant::now(),
            answered: None,
        });
        log.len() - 1
    }

    fn answered(&self, call: usize) {
        self.log.lock().unwrap()[call].answered = Some(Instant::now());
    }

    fn log(&self) -> Vec<PipelinedCall> {
        self.log.lock().unwrap().clone()
    }
}

impl ClaimStore for PipelinedStore {
    async fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Result<Vec<Claimed>> {
        if self.claims.fetch_add(1, Ordering::SeqCst) == 1
            && let Some(gate) = &self.second_claim
        {
            self.store.state().claim_gate = Some(Arc::clone(gate));
        }
        let claimed = self.store.claim(batch_size, claim_timeout).await?;
        let call = self.sent(if claimed.is_empty() {
            "empty claim"
        } else {
            "claim"
        });
        sleep(self.claim_answer).await;
        self.answered(call);
        Ok(claimed)
    }
    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        let changed = self.store.mark_done(ids, token).await?;
        let call = self.sent("done");
        sleep(self.ack_answer).await;
        self.answered(call);
        Ok(changed)
    }
    async fn mark_failed(&mut self, failed: Failed<'_>) -> Result<u64> {
        self.store.mark_failed(failed).await
    }
    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        self.store.requeue(id, token, after).await
    }
    fn concurrent_handle(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Runs a relay (batch 5, 4 in flight, an instant publisher) over a [`PipelinedStore`]
/// until its 20 messages on 20 aggregates are done, and returns the store's log.
async fn pipelined_run(claim_answer: Duration, ack_answer: Duration) -> Vec<PipelinedCall> {
    let store = FakeStore::default();
    for n in 0..20 {
        store.enqueue(Some(&format!("a{n}")));
    }
    let pipelined = PipelinedStore::new(store.clone(), claim_answer, ack_answer);
    let config = config().batch_size(5).max_in_flight(4);
    let relay = Relay::new(
        pipelined.clone(),
        Arc::new(FakePublisher::default()),
        config,
    )
    .unwrap();
    relay.run(all_done(store, 20)).await.unwrap();
    pipelined.log()
}

/// With a concurrent handle, a batch that is ready to acknowledge sends its
/// acknowledgement before the next claim: the calls go out claim, done, claim, done, …, so
/// the server runs each acknowledgement before the claim that follows it (claiming first,
/// the relay kept its batches' aggregates claimed while it claimed again).
#[tokio::test(start_paused = true)]
async fn a_ready_acknowledgement_goes_out_before_the_next_claim() {
    let log = pipelined_run(ms(1), ms(10)).await;
    let order: Vec<&str> = log
        .iter()
        .map(|c| c.what)
        .filter(|w| *w != "empty claim")
        .collect();
    assert_eq!(
        order,
        [
            "claim", "done", "claim", "done", "claim", "done", "claim", "done"
        ],
        "{log:?}"
    );
}

/// With a concurrent handle, a claim does not wait for the answer of the acknowledgement
/// sent before it: both go out together, so the acknowledgements' round trips (10 ms here,
/// a claim's 1 ms) are not paid once per batch. All four batches are claimed before the
/// first acknowledgement answers (before, the third claim waited for it).
#[tokio::test(start_paused = true)]
async fn a_claim_does_not_wait_for_the_answer_of_the_acknowledgement_before_it() {
    let log = pipelined_run(ms(1), ms(10)).await;
    let claims: Vec<&PipelinedCall> = log.iter().filter(|c| c.what == "claim").collect();
    let first_done = log.iter().find(|c| c.what == "done").expect("a done");
    let first_answer = first_done.answered.expect("every acknowledgement answered");
    assert_eq!(claims.len(), 4, "{log:?}");
    assert!(
        claims.iter().all(|claim| claim.sent < first_answer),
        "a claim waited for an acknowledgement's answer: {log:?}"
    );
}

/// With a store's concurrent handle, a batch is acknowledged while the next claim is still
/// under way (with one connection and no such handle, the acknowledgement waits for the
/// claim, and this fails).
#[tokio::test(start_paused = true)]
async fn an_acknowledgement_goes_beside_a_claim_through_the_concurrent_handle() {
    let store = FakeStore::default();
    for n in 0..10 {
        store.enqueue(Some(&format!("a{n}")));
    }
    let gate = Arc::new(ClaimGate::default());
    let mut overlapping = PipelinedStore::new(store.clone(), Duration::ZERO, Duration::ZERO);
    overlapping.second_claim = Some(Arc::clone(&gate));
    let config = config().batch_size(5).max_in_flight(2);
    let relay = Relay::new(overlapping, Arc::new(FakePublisher::default()), config).unwrap();
    let watched = store.clone();
    let released = Arc::clone(&gate);
    relay
        .run(async move {
            released.started.notified().await;
            // The second claim holds its call open; the first batch is acknowledged anyway.
            timeout(Duration::from_secs(5), async {
                while !(1..=5).all(|id| watched.status(id) == Status::Done) {
                    sleep(ms(1)).await;
                }
            })
            .await
            .expect("the first batch was not acknowledged while the second claim ran");
            released.release.notify_one();
        })
        .await
        .unwrap();
}
