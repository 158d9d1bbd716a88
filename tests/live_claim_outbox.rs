//! Live tests of the claim-style outbox (DESIGN.md 4.5, issue 5): `changefeed.setup_outbox`,
//! the per-outbox procedures `[enqueue|claim|mark_done|mark_failed|requeue|purge_done:S.T]`
//! and `OutboxStore`, which calls them.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_claim_outbox -- --ignored`. Every
//! scenario runs twice, with READ_COMMITTED_SNAPSHOT off and on, each in a database of its
//! own. Every concurrent claimer has a connection of its own.
//!
//! Time-based cases do not wait for the clock where they do not have to: the test ages a row
//! by moving its `claimed_at`, `next_retry_at` or `processed_at` back with server-side
//! `dateadd` (it runs as the admin). Where a test does wait (a real 1 s retry, a real 1 s
//! claim timeout) it only asserts what must hold however slow the machine is: after a wait,
//! never before one.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::Client;
use changefeed::outbox::{ClaimToken, ClaimedMessage, Enqueued, Headers, NewMessage};
use changefeed::outbox_store::OutboxStore;
use changefeed::row::Column;
use common::{TestDb, exec, rows, scalar_i64};
use serde_json::json;
use tiberius::Uuid;
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

/// Message states (the `status` column).
const PENDING: u8 = 0;
const PROCESSING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;
const DEAD: u8 = 4;

/// A claim timeout no test outlives: rows claimed with it are never reaped mid-test.
const HELD: Duration = Duration::from_secs(3600);
/// The short claim timeout of the reaper scenarios.
const SHORT: Duration = Duration::from_millis(1000);
/// The longest a concurrent claimer may run before the test calls it stuck.
const TASK_LIMIT: Duration = Duration::from_secs(240);
/// Deadlock victims (1205) and lock timeouts (1222) a claimer retries per call: a relay
/// would too, and a statement that lost a deadlock claimed nothing.
const MAX_TRANSIENT_RETRIES: u32 = 50;

const DAY_MS: u64 = 86_400_000;

fn days(n: u64) -> Duration {
    Duration::from_millis(n * DAY_MS)
}

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

fn outbox(table: &str) -> OutboxStore {
    table
        .parse()
        .unwrap_or_else(|error| panic!("{table} is a valid outbox name: {error}"))
}

/// Runs a batch that must succeed.
async fn sql(client: &mut Client, text: &str) {
    exec(client, text)
        .await
        .unwrap_or_else(|error| panic!("{text}: {error}"));
}

async fn setup_outbox(client: &mut Client, table: &str) {
    sql(
        client,
        &format!("exec changefeed.setup_outbox @table_name = N'{table}';"),
    )
    .await;
}

async fn begin(client: &mut Client) {
    sql(client, "begin transaction;").await;
}

async fn commit(client: &mut Client) {
    sql(client, "commit transaction;").await;
}

async fn rollback(client: &mut Client) {
    sql(client, "rollback transaction;").await;
}

/// Enqueues `messages` in one transaction on `client` and commits it.
async fn enqueue_committed(
    store: &OutboxStore,
    client: &mut Client,
    messages: &[NewMessage],
) -> Vec<Enqueued> {
    begin(client).await;
    let mut enqueued = Vec::with_capacity(messages.len());
    for message in messages {
        let result = store
            .enqueue(client, message)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "enqueue to topic {:?} of {}: {error}",
                    message.topic,
                    store.table()
                )
            });
        enqueued.push(result);
    }
    commit(client).await;
    enqueued
}

/// One message of an aggregate, with a small payload naming it.
fn message_of(aggregate_id: &str, n: usize) -> NewMessage {
    NewMessage::new("orders", json!({ "aggregate": aggregate_id, "n": n }))
        .aggregate("order", aggregate_id)
}

/// One message that belongs to no aggregate.
fn loose_message(n: usize) -> NewMessage {
    NewMessage::new("audit", json!({ "n": n }))
}

/// Claims, retrying deadlock victims and lock timeouts (the statement rolled back, so it
/// claimed nothing); any other error fails the test.
async fn claim(
    store: &OutboxStore,
    client: &mut Client,
    batch_size: u32,
    claim_timeout: Duration,
) -> Vec<ClaimedMessage> {
    let mut retries = 0;
    loop {
        match store.claim(client, batch_size, claim_timeout).await {
            Ok(batch) => return batch,
            Err(error)
                if error.server_number().is_some()
                    && error.is_transient()
                    && retries < MAX_TRANSIENT_RETRIES =>
            {
                retries += 1;
                eprintln!(
                    "claim on {}: transient error, retry {retries}: {error}",
                    store.table()
                );
                tokio::time::sleep(Duration::from_millis(5 * u64::from(retries))).await;
            }
            Err(error) => panic!(
                "claim(batch {batch_size}, timeout {claim_timeout:?}) on {}: {error}",
                store.table()
            ),
        }
    }
}

fn ids(batch: &[ClaimedMessage]) -> Vec<i64> {
    batch.iter().map(|m| m.id).collect()
}

/// The one token of a non-empty claim; every row of one claim carries it.
#[track_caller]
fn token_of(batch: &[ClaimedMessage]) -> ClaimToken {
    let token = batch.first().expect("a non-empty claim").claim_token;
    assert!(
        batch.iter().all(|m| m.claim_token == token),
        "the rows of one claim carry one token: {batch:?}"
    );
    token
}

/// Asserts the call failed with SQL Server error `number`; returns the message.
#[track_caller]
fn server_error<T: Debug>(result: changefeed::Result<T>, number: u32, what: &str) -> String {
    match result {
        Ok(value) => panic!("{what}: expected SQL Server error {number}, got Ok({value:?})"),
        Err(error) => {
            assert_eq!(
                error.server_number(),
                Some(number),
                "{what}: expected SQL Server error {number}, got {error}"
            );
            error.to_string()
        }
    }
}

/// Asserts a batch failed with SQL Server error `number`; returns the message.
async fn batch_error(client: &mut Client, text: &str, number: u32) -> String {
    server_error(exec(client, text).await, number, text)
}

fn id_list(ids: &[i64]) -> String {
    assert!(!ids.is_empty(), "an id list needs ids");
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets `column` of the rows `ids` to the server-side expression `value`.
async fn set_column(client: &mut Client, table: &str, column: &str, value: &str, ids: &[i64]) {
    sql(
        client,
        &format!(
            "update {table} set {column} = {value} where id in ({});",
            id_list(ids)
        ),
    )
    .await;
}

/// `count_big(*)` of `table` with a `where` clause.
async fn count(client: &mut Client, table: &str, condition: &str) -> i64 {
    scalar_i64(
        client,
        &format!("select count_big(*) from {table} where {condition};"),
    )
    .await
}

/// One outbox row as stored.
#[derive(Debug)]
struct RowState {
    status: u8,
    attempts: i32,
    claim_token: Option<Uuid>,
    /// `next_retry_at` minus the server's now, in ms.
    retry_in_ms: Option<i64>,
    processed: bool,
    last_error: Option<String>,
}

async fn row_state(client: &mut Client, table: &str, id: i64) -> RowState {
    let query = format!(
        "select status, attempts, claim_token, \
         datediff_big(millisecond, sysutcdatetime(), next_retry_at), \
         convert(bit, case when processed_at is null then 0 else 1 end), last_error \
         from {table} where id = {id};"
    );
    let found = rows(client, &query)
        .await
        .unwrap_or_else(|error| panic!("{query}: {error}"));
    let row = found
        .first()
        .unwrap_or_else(|| panic!("{table} has no row {id}"));
    RowState {
        status: u8::column(row, 0).expect("status"),
        attempts: i32::column(row, 1).expect("attempts"),
        claim_token: Option::<Uuid>::column(row, 2).expect("claim_token"),
        retry_in_ms: Option::<i64>::column(row, 3).expect("next_retry_at"),
        processed: bool::column(row, 4).expect("processed_at"),
        last_error: Option::<String>::column(row, 5).expect("last_error"),
    }
}

/// Strings from the first column of every row of `query`.
async fn strings(client: &mut Client, query: &str) -> BTreeSet<String> {
    rows(client, query)
        .await
        .unwrap_or_else(|error| panic!("{query}: {error}"))
        .iter()
        .map(|row| String::column(row, 0).expect("a string column"))
        .collect()
}

/// Awaits a spawned task within [`TASK_LIMIT`], re-raising its panic as is.
async fn join<T>(what: &str, task: JoinHandle<T>) -> T {
    match tokio::time::timeout(TASK_LIMIT, task).await {
        Err(_) => panic!("{what} is stuck: still running after {TASK_LIMIT:?}"),
        Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Ok(Err(error)) => panic!("{what} was cancelled: {error}"),
        Ok(Ok(value)) => value,
    }
}

// ------------------------------------------------------------------------------------------
// 1. enqueue belongs to the caller's transaction
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn enqueue_is_transactional_and_idempotent() {
    common::under_both_isolations("claim_enqueue", enqueue_is_transactional_and_idempotent_in)
        .await;
}

async fn enqueue_is_transactional_and_idempotent_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_enqueue";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    // A rolled-back enqueue leaves nothing: no row, nothing to claim, its key still free.
    let keyed = NewMessage {
        message_id: Some("order-42-created".to_owned()),
        ..message_of("order-42", 1)
    };
    begin(&mut client).await;
    let rolled_back = store
        .enqueue(&mut client, &keyed)
        .await
        .expect("enqueue inside a transaction");
    assert!(rolled_back.id > 0, "{rolled_back:?}");
    assert_eq!(rolled_back.message_id, "order-42-created");
    assert_eq!(
        count(&mut client, TABLE, &format!("id = {}", rolled_back.id)).await,
        1,
        "the transaction sees its own enqueue"
    );
    rollback(&mut client).await;
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 0);
    assert!(claim(&store, &mut client, 10, HELD).await.is_empty());

    // Outside a transaction the server refuses, and writes nothing.
    let outside = store.enqueue(&mut client, &message_of("order-43", 1)).await;
    let message = server_error(outside, 51300, "enqueue outside a transaction");
    assert!(message.contains("transaction"), "{message}");
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 0);
    assert_eq!(scalar_i64(&mut client, "select @@trancount;").await, 0);

    // A committed enqueue returns the row's id and a server-made message id.
    let made = enqueue_committed(&store, &mut client, &[message_of("order-44", 1)]).await;
    let made = made[0].clone();
    assert!(made.id > 0, "{made:?}");
    assert!(!made.message_id.is_empty(), "{made:?}");
    let stored = strings(
        &mut client,
        &format!("select message_id from {TABLE} where id = {};", made.id),
    )
    .await;
    assert_eq!(stored, BTreeSet::from([made.message_id.clone()]));

    // The rolled-back key is free; enqueued again (other transactions, other payloads, twice
    // within one transaction) it returns the first row every time and stays one row.
    let first = enqueue_committed(&store, &mut client, std::slice::from_ref(&keyed)).await;
    let first = first[0].clone();
    assert_eq!(first.message_id, "order-42-created");
    let retried = NewMessage {
        payload: json!({ "aggregate": "order-42", "n": 2 }),
        ..keyed.clone()
    };
    let second = enqueue_committed(&store, &mut client, std::slice::from_ref(&retried)).await;
    assert_eq!(second[0], first, "the same message_id returns the same row");
    let twice = enqueue_committed(&store, &mut client, &[keyed.clone(), retried.clone()]).await;
    assert_eq!(twice, vec![first.clone(), first.clone()]);
    assert_eq!(
        count(&mut client, TABLE, "message_id = N'order-42-created'").await,
        1
    );
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 2);

    // What a relay gets: the two rows, the keyed one with its first payload.
    let claimed = claim(&store, &mut client, 10, HELD).await;
    let mut expected = vec![made.id, first.id];
    expected.sort_unstable();
    assert_eq!(ids(&claimed), expected);
    let keyed_claim = claimed
        .iter()
        .find(|m| m.id == first.id)
        .expect("the keyed row");
    assert_eq!(keyed_claim.message_id, "order-42-created");
    assert_eq!(keyed_claim.payload, keyed.payload);
}

// ------------------------------------------------------------------------------------------
// 2. concurrent claimers never double-claim
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn six_claimers_share_thirty_aggregates_without_double_claims() {
    common::under_both_isolations("claim_fanout", six_claimers_share_thirty_aggregates_in).await;
}

async fn six_claimers_share_thirty_aggregates_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_fanout";
    const CLAIMERS: usize = 6;
    const MESSAGES: usize = 30;
    let store = outbox(TABLE);
    let mut admin = db.client().await;
    setup_outbox(&mut admin, TABLE).await;

    let messages: Vec<NewMessage> = (0..MESSAGES)
        .map(|i| message_of(&format!("order-{i}"), i))
        .collect();
    let enqueued = enqueue_committed(&store, &mut admin, &messages).await;
    let enqueued_ids: BTreeSet<i64> = enqueued.iter().map(|e| e.id).collect();
    assert_eq!(enqueued_ids.len(), MESSAGES);

    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let mut tasks = Vec::new();
    for _ in 0..CLAIMERS {
        let name = db.name.clone();
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut client = common::connect_to(&name).await;
            barrier.wait().await;
            let started = Instant::now();
            let mut claims: Vec<Vec<ClaimedMessage>> = Vec::new();
            loop {
                let batch = claim(&store, &mut client, 10, HELD).await;
                if !batch.is_empty() {
                    assert!(batch.len() <= 10, "batch size 10 honoured: {}", batch.len());
                    claims.push(batch);
                    continue;
                }
                // Nothing for this claimer: rows it skipped (READPAST) belong to another
                // claimer's statement. Stop once no committed row is pending any more.
                if count(&mut client, TABLE, "status = 0").await == 0 {
                    return claims;
                }
                assert!(
                    started.elapsed() < TASK_LIMIT,
                    "pending rows are left that no claimer takes"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let mut batches: Vec<(usize, Vec<ClaimedMessage>)> = Vec::new();
    for (claimer, task) in tasks.into_iter().enumerate() {
        for batch in join(&format!("claimer {claimer}"), task).await {
            batches.push((claimer, batch));
        }
    }

    let claimed: Vec<&ClaimedMessage> = batches.iter().flat_map(|(_, b)| b.iter()).collect();
    assert_eq!(
        claimed.len(),
        MESSAGES,
        "exactly {MESSAGES} claims in total"
    );
    let claimed_ids: BTreeSet<i64> = claimed.iter().map(|m| m.id).collect();
    assert_eq!(claimed_ids.len(), MESSAGES, "no id was claimed twice");
    assert_eq!(claimed_ids, enqueued_ids, "every enqueued row was claimed");

    // A fresh token per claim, and each batch comes back ordered by id.
    let mut tokens = HashSet::new();
    for (claimer, batch) in &batches {
        let token = token_of(batch);
        assert!(
            tokens.insert(token),
            "claim token {token:?} was handed out twice"
        );
        let batch_ids = ids(batch);
        assert!(
            batch_ids.windows(2).all(|w| w[0] < w[1]),
            "claimer {claimer}'s batch is ordered by id: {batch_ids:?}"
        );
    }

    // The table agrees: every row processing, no attempt counted, and held under the token
    // of the claim that returned it.
    for message in &claimed {
        let state = row_state(&mut admin, TABLE, message.id).await;
        assert_eq!(state.status, PROCESSING, "row {}: {state:?}", message.id);
        assert_eq!(state.attempts, 0, "row {}: {state:?}", message.id);
        assert_eq!(message.attempts, 0);
        assert_eq!(
            state.claim_token,
            Some(message.claim_token.as_uuid()),
            "row {} is held under the token of the claim that returned it",
            message.id
        );
    }
    let per_claimer: BTreeMap<usize, usize> =
        batches
            .iter()
            .fold(BTreeMap::new(), |mut map, (claimer, batch)| {
                *map.entry(*claimer).or_default() += batch.len();
                map
            });
    eprintln!("rows per claimer: {per_claimer:?}");
}

// ------------------------------------------------------------------------------------------
// 3. head of aggregate under 50 concurrent claimers
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn fifty_claimers_on_one_aggregate_claim_only_its_first_row() {
    common::under_both_isolations("claim_head50", fifty_claimers_on_one_aggregate_in).await;
}

async fn fifty_claimers_on_one_aggregate_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_head";
    const CLAIMERS: usize = 50;
    let store = outbox(TABLE);
    let mut admin = db.client().await;
    setup_outbox(&mut admin, TABLE).await;

    let messages: Vec<NewMessage> = (0..5).map(|n| message_of("order-1", n)).collect();
    let enqueued = enqueue_committed(&store, &mut admin, &messages).await;
    let mut row_ids: Vec<i64> = enqueued.iter().map(|e| e.id).collect();
    row_ids.sort_unstable();
    let head = row_ids[0];

    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let mut tasks = Vec::new();
    for _ in 0..CLAIMERS {
        let name = db.name.clone();
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut client = common::connect_to(&name).await;
            barrier.wait().await;
            claim(&store, &mut client, 10, HELD).await
        }));
    }
    let mut claimed = Vec::new();
    for (claimer, task) in tasks.into_iter().enumerate() {
        claimed.extend(join(&format!("claimer {claimer}"), task).await);
    }

    assert_eq!(
        ids(&claimed),
        vec![head],
        "exactly one claim in total, and it is the aggregate's first row"
    );
    assert_eq!(claimed[0].payload, messages[0].payload);
    let state = row_state(&mut admin, TABLE, head).await;
    assert_eq!(state.status, PROCESSING);
    assert_eq!(state.claim_token, Some(claimed[0].claim_token.as_uuid()));
    for &id in &row_ids[1..] {
        let state = row_state(&mut admin, TABLE, id).await;
        assert_eq!(state.status, PENDING, "row {id}: {state:?}");
        assert_eq!(state.claim_token, None, "row {id}: {state:?}");
    }
    assert!(
        claim(&store, &mut admin, 10, HELD).await.is_empty(),
        "the later rows wait behind the processing head"
    );
}

// ------------------------------------------------------------------------------------------
// 4. head of aggregate: claim -> ack -> next; a failed row blocks; dead unblocks
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn head_of_aggregate_sequence() {
    common::under_both_isolations("claim_sequence", head_of_aggregate_sequence_in).await;
}

async fn head_of_aggregate_sequence_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_sequence";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let enqueued = enqueue_committed(
        &store,
        &mut client,
        &[
            message_of("A", 1),
            message_of("A", 2),
            message_of("A", 3),
            message_of("B", 1),
        ],
    )
    .await;
    let [a1, a2, a3, b1] = [
        enqueued[0].id,
        enqueued[1].id,
        enqueued[2].id,
        enqueued[3].id,
    ];

    // Only the head of each aggregate.
    let first = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&first), vec![a1, b1]);
    let t1 = token_of(&first);

    // Ack a1: a2 is next; b1 is still held (not reclaimed within the timeout).
    assert_eq!(store.mark_done(&mut client, &[a1], t1).await.unwrap(), 1);
    let second = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&second), vec![a2]);
    let t2 = token_of(&second);

    // a2 failed, due in an hour: nothing of A is claimable, a3 waits behind it.
    assert_eq!(
        store
            .mark_failed(
                &mut client,
                a2,
                t2,
                Some(Duration::from_secs(3600)),
                false,
                "broker down"
            )
            .await
            .unwrap(),
        1
    );
    let blocked = claim(&store, &mut client, 10, HELD).await;
    assert!(
        blocked.is_empty(),
        "a3 is blocked behind failed a2: {blocked:?}"
    );
    assert_eq!(row_state(&mut client, TABLE, a3).await.status, PENDING);

    // a2 due again: it comes back (attempts counted), a3 still waits behind it.
    set_column(
        &mut client,
        TABLE,
        "next_retry_at",
        "dateadd(second, -1, sysutcdatetime())",
        &[a2],
    )
    .await;
    let retried = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&retried), vec![a2]);
    assert_eq!(retried[0].attempts, 1);
    let t3 = token_of(&retried);

    // a2 dead: it no longer blocks its aggregate, a3 is claimable.
    assert_eq!(
        store
            .mark_failed(&mut client, a2, t3, None, true, "poison")
            .await
            .unwrap(),
        1
    );
    let third = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&third), vec![a3]);
    assert_eq!(third[0].attempts, 0);
    assert_eq!(
        store
            .mark_done(&mut client, &[a3], token_of(&third))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.mark_done(&mut client, &[b1], t1).await.unwrap(), 1);

    // Messages without an aggregate are never blocked, not even by each other.
    let loose = enqueue_committed(
        &store,
        &mut client,
        &[loose_message(1), loose_message(2), loose_message(3)],
    )
    .await;
    let loose_ids: Vec<i64> = loose.iter().map(|e| e.id).collect();
    let batch = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&batch), loose_ids, "all three at once");
    assert!(
        batch
            .iter()
            .all(|m| m.aggregate_id.is_none() && m.partition_key.is_none())
    );
    // Another one while those are still processing: claimable at once.
    let later = enqueue_committed(&store, &mut client, &[loose_message(4)]).await;
    let batch = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&batch), vec![later[0].id]);
}

// ------------------------------------------------------------------------------------------
// 5. the reaper
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn reaper_reclaims_expired_claims_and_counts_an_attempt() {
    common::under_both_isolations("claim_reaper", reaper_in).await;
}

async fn reaper_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_reaper";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let enqueued = enqueue_committed(&store, &mut client, &[message_of("reaped-1", 1)]).await;
    let r1 = enqueued[0].id;

    let first = claim(&store, &mut client, 10, SHORT).await;
    assert_eq!(ids(&first), vec![r1]);
    assert_eq!(first[0].attempts, 0);
    let t1 = token_of(&first);
    let claimed_at = strings(
        &mut client,
        &format!("select convert(nvarchar(30), claimed_at, 121) from {TABLE} where id = {r1};"),
    )
    .await
    .pop_first()
    .expect("claimed_at");

    // Right away, with the same timeout: not due. The assertion holds whenever the second
    // claim ran less than the timeout after the first, which the server's clock tells.
    let again = claim(&store, &mut client, 10, SHORT).await;
    let elapsed_ms = scalar_i64(
        &mut client,
        &format!(
            "select datediff_big(millisecond, convert(datetime2(3), N'{claimed_at}', 121), \
             sysutcdatetime());"
        ),
    )
    .await;
    let mut expected_attempts = 1;
    if elapsed_ms < 1000 {
        assert!(
            again.is_empty(),
            "a claim younger than the timeout is not reaped: {again:?}"
        );
    } else if !again.is_empty() {
        // A very slow machine: the second claim legitimately reaped it.
        eprintln!("the second claim came {elapsed_ms} ms after the first and reaped it");
        assert_eq!(ids(&again), vec![r1]);
        assert_eq!(again[0].attempts, 1);
        expected_attempts = 2;
    }
    // With a long timeout nothing is due, however slow the machine.
    assert!(claim(&store, &mut client, 10, HELD).await.is_empty());

    // The claim is older than the timeout: reclaimed under a new token, one attempt counted.
    set_column(
        &mut client,
        TABLE,
        "claimed_at",
        "dateadd(millisecond, -5000, claimed_at)",
        &[r1],
    )
    .await;
    let reaped = claim(&store, &mut client, 10, SHORT).await;
    assert_eq!(ids(&reaped), vec![r1]);
    assert_eq!(reaped[0].attempts, expected_attempts);
    let t2 = token_of(&reaped);
    assert_ne!(t2, t1, "a fresh token per claim");
    let state = row_state(&mut client, TABLE, r1).await;
    assert_eq!(state.status, PROCESSING);
    assert_eq!(state.attempts, expected_attempts);
    assert_eq!(state.claim_token, Some(t2.as_uuid()));
    assert_eq!(store.mark_done(&mut client, &[r1], t2).await.unwrap(), 1);

    // The same with the real clock: claim, wait past the timeout, reclaim.
    let enqueued = enqueue_committed(&store, &mut client, &[message_of("reaped-2", 1)]).await;
    let r2 = enqueued[0].id;
    let first = claim(&store, &mut client, 10, SHORT).await;
    assert_eq!(ids(&first), vec![r2]);
    let t3 = token_of(&first);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reaped = claim(&store, &mut client, 10, SHORT).await;
    assert_eq!(ids(&reaped), vec![r2], "reclaimed after the timeout");
    assert_eq!(reaped[0].attempts, 1);
    let t4 = token_of(&reaped);
    assert_ne!(t4, t3);

    // Every expiry counts: reaped again, attempts 2.
    set_column(
        &mut client,
        TABLE,
        "claimed_at",
        "dateadd(millisecond, -5000, claimed_at)",
        &[r2],
    )
    .await;
    let reaped = claim(&store, &mut client, 10, SHORT).await;
    assert_eq!(ids(&reaped), vec![r2]);
    assert_eq!(reaped[0].attempts, 2);
    assert_eq!(row_state(&mut client, TABLE, r2).await.attempts, 2);
}

// ------------------------------------------------------------------------------------------
// 6. fenced acknowledgement
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn stale_token_cannot_ack_after_a_reclaim() {
    common::under_both_isolations("claim_fence", stale_token_cannot_ack_in).await;
}

async fn stale_token_cannot_ack_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_fence";
    let store = outbox(TABLE);
    let mut admin = db.client().await;
    let mut relay1 = db.client().await;
    let mut relay2 = db.client().await;
    setup_outbox(&mut admin, TABLE).await;

    let enqueued = enqueue_committed(
        &store,
        &mut admin,
        &[message_of("fence-1", 1), message_of("fence-2", 1)],
    )
    .await;
    let (m, other) = (enqueued[0].id, enqueued[1].id);

    // Relay 1 claims both; its claim of m expires (aged by ten minutes); relay 2, with a
    // one-minute timeout, re-claims m and leaves relay 1's fresh claim of the other alone.
    let minute = Duration::from_secs(60);
    let claimed = claim(&store, &mut relay1, 10, minute).await;
    assert_eq!(ids(&claimed), vec![m, other]);
    let t1 = token_of(&claimed);
    set_column(
        &mut admin,
        TABLE,
        "claimed_at",
        "dateadd(minute, -10, claimed_at)",
        &[m],
    )
    .await;
    let reclaimed = claim(&store, &mut relay2, 10, minute).await;
    assert_eq!(ids(&reclaimed), vec![m], "only the expired claim is reaped");
    assert_eq!(reclaimed[0].attempts, 1);
    let t2 = token_of(&reclaimed);
    assert_ne!(t1, t2);

    let held_by_relay2 = async |admin: &mut Client| {
        let state = row_state(admin, TABLE, m).await;
        assert_eq!(state.status, PROCESSING, "{state:?}");
        assert_eq!(state.claim_token, Some(t2.as_uuid()), "{state:?}");
        assert_eq!(state.attempts, 1, "{state:?}");
        assert!(!state.processed, "{state:?}");
    };

    // Relay 1's stale token changes nothing.
    assert_eq!(store.mark_done(&mut relay1, &[m], t1).await.unwrap(), 0);
    held_by_relay2(&mut admin).await;
    let stale_failure = store
        .mark_failed(
            &mut relay1,
            m,
            t1,
            Some(Duration::from_secs(60)),
            false,
            "stale",
        )
        .await
        .unwrap();
    assert_eq!(stale_failure, 0);
    assert_eq!(
        store
            .mark_failed(&mut relay1, m, t1, None, true, "stale")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .requeue(&mut relay1, m, Some(t1), Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    held_by_relay2(&mut admin).await;
    assert_eq!(row_state(&mut admin, TABLE, m).await.last_error, None);

    // With both ids, relay 1 acks only the row it still holds.
    assert_eq!(
        store.mark_done(&mut relay1, &[m, other], t1).await.unwrap(),
        1
    );
    assert_eq!(row_state(&mut admin, TABLE, other).await.status, DONE);
    held_by_relay2(&mut admin).await;

    // Relay 2's token works; afterwards relay 1's token still changes nothing.
    assert_eq!(store.mark_done(&mut relay2, &[m], t2).await.unwrap(), 1);
    let state = row_state(&mut admin, TABLE, m).await;
    assert_eq!(state.status, DONE);
    assert!(state.processed);
    assert_eq!(
        store
            .mark_failed(
                &mut relay1,
                m,
                t1,
                Some(Duration::from_secs(60)),
                false,
                "late"
            )
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store.mark_done(&mut relay2, &[m], t2).await.unwrap(),
        0,
        "acked once"
    );
    assert_eq!(row_state(&mut admin, TABLE, m).await.status, DONE);
}

// ------------------------------------------------------------------------------------------
// 7. failed with a retry time, due again, attempts counted
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn failed_message_is_due_again_after_its_retry_time() {
    common::under_both_isolations("claim_retry", failed_message_is_due_again_in).await;
}

async fn failed_message_is_due_again_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_retry";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let enqueued = enqueue_committed(&store, &mut client, &[message_of("retry-1", 1)]).await;
    let f = enqueued[0].id;
    let t1 = token_of(&claim(&store, &mut client, 10, HELD).await);

    // Failed, due in an hour (a server-side time): not claimable, one attempt counted.
    let hour = Duration::from_secs(3600);
    assert_eq!(
        store
            .mark_failed(&mut client, f, t1, Some(hour), false, "broker timeout")
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, f).await;
    assert_eq!(state.status, FAILED);
    assert_eq!(state.attempts, 1);
    assert_eq!(state.last_error.as_deref(), Some("broker timeout"));
    let retry_in = state.retry_in_ms.expect("next_retry_at is set");
    assert!(
        (3_000_000..=3_600_001).contains(&retry_in),
        "due in about an hour on the server's clock, got {retry_in} ms"
    );
    // Not due, and a failed row is not the reaper's either, even with a 1 ms timeout.
    assert!(
        claim(&store, &mut client, 10, Duration::from_millis(1))
            .await
            .is_empty()
    );

    // Its time comes: claimable again, attempts carried (a claim does not add one).
    set_column(
        &mut client,
        TABLE,
        "next_retry_at",
        "dateadd(millisecond, -1, sysutcdatetime())",
        &[f],
    )
    .await;
    let due = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&due), vec![f]);
    assert_eq!(due[0].attempts, 1);
    let t2 = token_of(&due);
    assert_ne!(t2, t1);

    // With a real 1 s retry: once the server's clock passes next_retry_at, it is due.
    assert_eq!(
        store
            .mark_failed(
                &mut client,
                f,
                t2,
                Some(Duration::from_secs(1)),
                false,
                "again"
            )
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, f).await;
    assert_eq!((state.status, state.attempts), (FAILED, 2));
    assert!(
        state.retry_in_ms.expect("next_retry_at") <= 1001,
        "{state:?}"
    );
    let waited = Instant::now();
    while count(
        &mut client,
        TABLE,
        &format!("id = {f} and next_retry_at <= sysutcdatetime()"),
    )
    .await
        == 0
    {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "next_retry_at never came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let due = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&due), vec![f]);
    assert_eq!(due[0].attempts, 2);
    let t3 = token_of(&due);

    // Failed without a retry time would hot-loop: refused, and the row is untouched.
    let refused = store
        .mark_failed(&mut client, f, t3, None, false, "no retry")
        .await;
    server_error(refused, 51303, "mark_failed without a retry time");
    let state = row_state(&mut client, TABLE, f).await;
    assert_eq!(state.status, PROCESSING, "{state:?}");
    assert_eq!(state.attempts, 2, "{state:?}");
    assert_eq!(state.claim_token, Some(t3.as_uuid()), "{state:?}");
    assert_eq!(store.mark_done(&mut client, &[f], t3).await.unwrap(), 1);
}

// ------------------------------------------------------------------------------------------
// 8. requeue keeps attempts
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn requeue_keeps_attempts_and_redrives_dead_messages() {
    common::under_both_isolations("claim_requeue", requeue_in).await;
}

async fn requeue_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_requeue";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let enqueued = enqueue_committed(
        &store,
        &mut client,
        &[message_of("requeue-1", 1), message_of("requeue-1", 2)],
    )
    .await;
    let (q, q2) = (enqueued[0].id, enqueued[1].id);

    // One failure first, so that "unchanged" means 1, not 0.
    let t1 = token_of(&claim(&store, &mut client, 10, HELD).await);
    assert_eq!(
        store
            .mark_failed(&mut client, q, t1, Some(Duration::ZERO), false, "transient")
            .await
            .unwrap(),
        1
    );
    let again = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&again), vec![q]);
    assert_eq!(again[0].attempts, 1);
    let t2 = token_of(&again);

    // Requeue with the token, due at once: failed, attempts unchanged, claimable again.
    assert_eq!(
        store
            .requeue(&mut client, q, Some(t2), Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!(state.status, FAILED, "{state:?}");
    assert_eq!(state.attempts, 1, "{state:?}");
    assert!(state.retry_in_ms.expect("next_retry_at") <= 1, "{state:?}");
    let again = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(
        ids(&again),
        vec![q],
        "requeued q is due and still heads its aggregate"
    );
    assert_eq!(again[0].attempts, 1, "requeue did not count an attempt");
    let t3 = token_of(&again);

    // The old token is fenced; without a token a processing message is left alone.
    assert_eq!(
        store
            .requeue(&mut client, q, Some(t2), Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .requeue(&mut client, q, None, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!(state.status, PROCESSING, "{state:?}");
    assert_eq!(state.claim_token, Some(t3.as_uuid()), "{state:?}");
    assert_eq!(state.attempts, 1, "{state:?}");

    // Requeue with a later time: not due before it.
    assert_eq!(
        store
            .requeue(&mut client, q, Some(t3), Duration::from_secs(3600))
            .await
            .unwrap(),
        1
    );
    assert!(claim(&store, &mut client, 10, HELD).await.is_empty());
    set_column(
        &mut client,
        TABLE,
        "next_retry_at",
        "dateadd(millisecond, -1, sysutcdatetime())",
        &[q],
    )
    .await;
    let again = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&again), vec![q]);
    assert_eq!(again[0].attempts, 1);
    let t4 = token_of(&again);

    // Dead; the next of its aggregate goes through.
    assert_eq!(
        store
            .mark_failed(&mut client, q, t4, None, true, "poison")
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!((state.status, state.attempts), (DEAD, 2));
    let next = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&next), vec![q2]);
    assert_eq!(
        store
            .mark_done(&mut client, &[q2], token_of(&next))
            .await
            .unwrap(),
        1
    );

    // An operator redrives the dead message: failed, due, attempts unchanged.
    assert_eq!(
        store
            .requeue(&mut client, q, None, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!(state.status, FAILED, "{state:?}");
    assert_eq!(state.attempts, 2, "{state:?}");
    assert!(!state.processed, "{state:?}");
    let redriven = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&redriven), vec![q]);
    assert_eq!(redriven[0].attempts, 2);
}

// ------------------------------------------------------------------------------------------
// 9. dead is terminal
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn dead_is_terminal_never_reaped_never_purged() {
    common::under_both_isolations("claim_dead", dead_is_terminal_in).await;
}

async fn dead_is_terminal_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_dead";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let enqueued = enqueue_committed(
        &store,
        &mut client,
        &[
            message_of("dead-1", 1),
            message_of("dead-1", 2),
            loose_message(1),
        ],
    )
    .await;
    let (d, d2, x) = (enqueued[0].id, enqueued[1].id, enqueued[2].id);
    let first = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&first), vec![d, x]);
    let t1 = token_of(&first);
    assert_eq!(store.mark_done(&mut client, &[x], t1).await.unwrap(), 1);

    assert_eq!(
        store
            .mark_failed(
                &mut client,
                d,
                t1,
                Some(Duration::from_secs(5)),
                true,
                "poison"
            )
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, d).await;
    assert_eq!(state.status, DEAD, "{state:?}");
    assert_eq!(state.attempts, 1, "{state:?}");
    assert_eq!(
        state.retry_in_ms, None,
        "a dead message has no retry time: {state:?}"
    );
    assert_eq!(state.last_error.as_deref(), Some("poison"));

    // Its old token moves it nowhere.
    assert_eq!(store.mark_done(&mut client, &[d], t1).await.unwrap(), 0);
    assert_eq!(
        store
            .mark_failed(&mut client, d, t1, Some(Duration::ZERO), false, "x")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .requeue(&mut client, d, Some(t1), Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    assert_eq!(row_state(&mut client, TABLE, d).await.status, DEAD);

    // The reaper never takes it, however old its claim and however short the timeout.
    set_column(
        &mut client,
        TABLE,
        "claimed_at",
        "dateadd(day, -1, sysutcdatetime())",
        &[d],
    )
    .await;
    let next = claim(&store, &mut client, 10, Duration::from_millis(1)).await;
    assert_eq!(
        ids(&next),
        vec![d2],
        "the dead message no longer blocks its aggregate"
    );
    assert_eq!(
        store
            .mark_done(&mut client, &[d2], token_of(&next))
            .await
            .unwrap(),
        1
    );
    for _ in 0..3 {
        let nothing = claim(&store, &mut client, 10, Duration::from_millis(1)).await;
        assert!(
            nothing.is_empty(),
            "a dead message is never claimed: {nothing:?}"
        );
    }
    let state = row_state(&mut client, TABLE, d).await;
    assert_eq!((state.status, state.attempts), (DEAD, 1), "{state:?}");

    // Purge takes the done rows and never the dead one, even with a zero window.
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -30, sysutcdatetime())",
        &[d, d2, x],
    )
    .await;
    assert_eq!(
        store
            .purge_done(&mut client, Duration::ZERO, 100, None)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .purge_done(&mut client, Duration::ZERO, 100, None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 1);
    assert_eq!(row_state(&mut client, TABLE, d).await.status, DEAD);
}

// ------------------------------------------------------------------------------------------
// 10. purge
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn purge_deletes_only_old_done_rows_in_batches_and_long_windows() {
    common::under_both_isolations("claim_purge", purge_in).await;
}

/// Enqueues `n` loose messages, claims exactly them and acks them: `n` done rows.
/// Needs a table with no other open row.
async fn done_rows(store: &OutboxStore, client: &mut Client, n: usize) -> Vec<i64> {
    let messages: Vec<NewMessage> = (0..n).map(loose_message).collect();
    let enqueued: Vec<i64> = enqueue_committed(store, client, &messages)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    let batch_size = u32::try_from(n).expect("a small n");
    let claimed = claim(store, client, batch_size, HELD).await;
    assert_eq!(
        ids(&claimed),
        enqueued,
        "the new rows are the only open rows"
    );
    let acked = store
        .mark_done(client, &enqueued, token_of(&claimed))
        .await
        .unwrap();
    assert_eq!(acked, n as u64);
    enqueued
}

async fn existing(client: &mut Client, table: &str, ids: &[i64]) -> i64 {
    count(client, table, &format!("id in ({})", id_list(ids))).await
}

async fn purge_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_purge";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    // Done 10 days ago, 1 day ago, just now.
    let ten_days = done_rows(&store, &mut client, 3).await;
    let one_day = done_rows(&store, &mut client, 3).await;
    let just_now = done_rows(&store, &mut client, 3).await;
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -10, sysutcdatetime())",
        &ten_days,
    )
    .await;
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -1, sysutcdatetime())",
        &one_day,
    )
    .await;

    // Rows that are not done, all with an old processed_at: never purged. The pending one
    // waits behind the failed one of its aggregate, so that done_rows never claims it.
    let not_done = enqueue_committed(
        &store,
        &mut client,
        &[loose_message(100), message_of("purge-kept", 1)],
    )
    .await;
    let (dead, failed) = (not_done[0].id, not_done[1].id);
    let claimed = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&claimed), vec![dead, failed]);
    let token = token_of(&claimed);
    assert_eq!(
        store
            .mark_failed(&mut client, dead, token, None, true, "poison")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .mark_failed(
                &mut client,
                failed,
                token,
                Some(Duration::from_secs(3600)),
                false,
                "later"
            )
            .await
            .unwrap(),
        1
    );
    let pending =
        enqueue_committed(&store, &mut client, &[message_of("purge-kept", 2)]).await[0].id;
    let kept_open = [dead, failed, pending];
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -10, sysutcdatetime())",
        &kept_open,
    )
    .await;

    let five_days = days(5);
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 1000, None)
            .await
            .unwrap(),
        3,
        "only the rows done 10 days ago"
    );
    assert_eq!(existing(&mut client, TABLE, &ten_days).await, 0);
    assert_eq!(existing(&mut client, TABLE, &one_day).await, 3);
    assert_eq!(existing(&mut client, TABLE, &just_now).await, 3);
    assert_eq!(existing(&mut client, TABLE, &kept_open).await, 3);
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 1000, None)
            .await
            .unwrap(),
        0
    );

    // Batch size and max rows: 25 old rows, batches of 10, at most 15; then the rest.
    let old = done_rows(&store, &mut client, 25).await;
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -10, sysutcdatetime())",
        &old,
    )
    .await;
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 10, Some(15))
            .await
            .unwrap(),
        15
    );
    assert_eq!(existing(&mut client, TABLE, &old).await, 10);
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 10, None)
            .await
            .unwrap(),
        10
    );
    assert_eq!(existing(&mut client, TABLE, &old).await, 0);
    // Batches of one.
    let old = done_rows(&store, &mut client, 3).await;
    set_column(
        &mut client,
        TABLE,
        "processed_at",
        "dateadd(day, -10, sysutcdatetime())",
        &old,
    )
    .await;
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 1, Some(1))
            .await
            .unwrap(),
        1
    );
    assert_eq!(existing(&mut client, TABLE, &old).await, 2);
    assert_eq!(
        store
            .purge_done(&mut client, five_days, 1, None)
            .await
            .unwrap(),
        2
    );
    assert_eq!(existing(&mut client, TABLE, &old).await, 0);
    assert_eq!(existing(&mut client, TABLE, &one_day).await, 3);
    assert_eq!(existing(&mut client, TABLE, &just_now).await, 3);

    // Long windows (more milliseconds than an int holds): 90 and 30 days.
    let d91 = done_rows(&store, &mut client, 2).await;
    let d89 = done_rows(&store, &mut client, 2).await;
    let d31 = done_rows(&store, &mut client, 2).await;
    let d29 = done_rows(&store, &mut client, 2).await;
    for (rows_of, age) in [(&d91, 91), (&d89, 89), (&d31, 31), (&d29, 29)] {
        set_column(
            &mut client,
            TABLE,
            "processed_at",
            &format!("dateadd(day, -{age}, sysutcdatetime())"),
            rows_of,
        )
        .await;
    }
    assert_eq!(
        store
            .purge_done(&mut client, days(90), 1000, None)
            .await
            .unwrap(),
        2,
        "a 90-day window deletes the rows done 91 days ago"
    );
    assert_eq!(existing(&mut client, TABLE, &d91).await, 0);
    assert_eq!(existing(&mut client, TABLE, &d89).await, 2);
    assert_eq!(
        store
            .purge_done(&mut client, days(30), 1000, None)
            .await
            .unwrap(),
        4,
        "a 30-day window deletes the rows done 89 and 31 days ago"
    );
    assert_eq!(existing(&mut client, TABLE, &d29).await, 2);
    assert_eq!(existing(&mut client, TABLE, &one_day).await, 3);

    // The longest window there is (100 years), and one past it.
    assert_eq!(
        store
            .purge_done(&mut client, days(36_525), 1000, None)
            .await
            .unwrap(),
        0
    );
    let too_long = store
        .purge_done(&mut client, days(101 * 366), 1000, None)
        .await;
    server_error(too_long, 51308, "purge_done older than 100 years");

    // The rows that are not done were never touched.
    assert_eq!(row_state(&mut client, TABLE, dead).await.status, DEAD);
    assert_eq!(row_state(&mut client, TABLE, failed).await.status, FAILED);
    assert_eq!(row_state(&mut client, TABLE, pending).await.status, PENDING);
}

// ------------------------------------------------------------------------------------------
// 11. unicode and 1 MB payloads
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn unicode_and_one_megabyte_messages_round_trip() {
    common::under_both_isolations("claim_unicode", unicode_round_trip_in).await;
}

#[track_caller]
fn assert_round_trip(sent: &NewMessage, enqueued: &Enqueued, got: &ClaimedMessage) {
    assert_eq!(got.id, enqueued.id);
    assert_eq!(got.message_id, enqueued.message_id);
    if let Some(message_id) = &sent.message_id {
        assert_eq!(&got.message_id, message_id);
    }
    assert_eq!(got.topic, sent.topic);
    assert_eq!(got.aggregate_type, sent.aggregate_type);
    assert_eq!(got.aggregate_id, sent.aggregate_id);
    let partition_key = sent.partition_key.clone().or(sent.aggregate_id.clone());
    assert_eq!(
        got.partition_key, partition_key,
        "null partition key = aggregate id"
    );
    assert_eq!(got.payload, sent.payload);
    assert_eq!(got.headers, sent.headers);
    assert_eq!(got.trace_id, sent.trace_id);
    assert_eq!(got.attempts, 0);
}

async fn unicode_round_trip_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_unicode";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    let headers = |pairs: &[(&str, &str)]| -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // Aggregate ids differ in their letters, not only in emoji: comparisons follow the
    // database's collation.
    let sent = vec![
        NewMessage {
            topic: "заказы.события".to_owned(),
            payload: json!({
                "заказ": "№42",
                "注文": ["寿司", "ラーメン"],
                "emoji": "🎉👍🏽🇺🇦 👩‍👩‍👧",
                "escapes": "\"quoted\" \\ back\\slash\n\ttab end",
                "number": 12.5,
                "nested": { "ключ": [true, null, "значение"] }
            }),
            aggregate_type: Some("заказ".to_owned()),
            aggregate_id: Some("заказ-№42".to_owned()),
            partition_key: None,
            headers: headers(&[
                ("источник", "склад-№7"),
                ("emoji", "📦🚚✅"),
                ("日本語キー", "値"),
            ]),
            message_id: Some("сообщение-1-✓".to_owned()),
            trace_id: Some("трасса-🧵".to_owned()),
        },
        NewMessage {
            topic: "注文".to_owned(),
            payload: json!({ "品目": "抹茶", "数量": 2 }),
            aggregate_type: Some("注文".to_owned()),
            aggregate_id: Some("注文-7".to_owned()),
            partition_key: Some("パーティション-3".to_owned()),
            headers: headers(&[("k", "v")]),
            message_id: None,
            trace_id: None,
        },
        NewMessage {
            topic: "emoji.🚀".to_owned(),
            payload: json!({ "🚀": "🌕", "text": "rocket" }),
            aggregate_type: Some("🚀".to_owned()),
            aggregate_id: Some("rocket-🚀-1".to_owned()),
            partition_key: None,
            headers: Headers::new(),
            message_id: Some("🆔-rocket-3".to_owned()),
            trace_id: Some("🧵".to_owned()),
        },
    ];
    let enqueued = enqueue_committed(&store, &mut client, &sent).await;
    let claimed = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(
        ids(&claimed),
        enqueued.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    for ((message, enqueued), got) in sent.iter().zip(&enqueued).zip(&claimed) {
        assert_round_trip(message, enqueued, got);
    }
    // Stored as sent, not only decoded as sent.
    let stored = strings(
        &mut client,
        &format!(
            "select aggregate_id from {TABLE} where id = {};",
            enqueued[0].id
        ),
    )
    .await;
    assert_eq!(stored, BTreeSet::from(["заказ-№42".to_owned()]));
    assert_eq!(
        store
            .mark_done(&mut client, &ids(&claimed), token_of(&claimed))
            .await
            .unwrap(),
        3
    );

    // A 1 MB payload: a JSON object holding a string of 1,000,000 characters (the server's
    // ISJSON accepts only objects and arrays as payloads).
    let pattern: Vec<char> = "0123456789abcdefghijklmnopqrstuvwxyzЖжЯя注文🚀\"\\é"
        .chars()
        .collect();
    let blob: String = pattern.iter().cycle().take(1_000_000).collect();
    let big = NewMessage {
        headers: headers(&[("size", "1000000")]),
        ..NewMessage::new("big", json!({ "blob": blob })).aggregate("blob", "blob-1")
    };
    let enqueued = enqueue_committed(&store, &mut client, std::slice::from_ref(&big)).await;
    let stored_bytes = scalar_i64(
        &mut client,
        &format!(
            "select convert(bigint, datalength(payload)) from {TABLE} where id = {};",
            enqueued[0].id
        ),
    )
    .await;
    assert!(
        stored_bytes >= 2_000_000,
        "1,000,000 characters stored whole as nvarchar, got {stored_bytes} bytes"
    );
    let claimed = claim(&store, &mut client, 1, HELD).await;
    assert_eq!(ids(&claimed), vec![enqueued[0].id]);
    let got = &claimed[0];
    let got_blob = got.payload["blob"].as_str().expect("the blob is a string");
    assert_eq!(got_blob.chars().count(), 1_000_000);
    assert!(got_blob == blob, "the 1 MB payload round-trips exactly");
    assert!(got.payload == big.payload);
    assert_eq!(got.headers, big.headers);
    assert_eq!(got.aggregate_id.as_deref(), Some("blob-1"));
}

// ------------------------------------------------------------------------------------------
// 12. re-running setup_outbox repairs a partial install
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn setup_outbox_repairs_a_partial_install_and_never_drops_data() {
    common::under_both_isolations("claim_repair", setup_outbox_repairs_in).await;
}

const KINDS: [&str; 6] = [
    "enqueue",
    "claim",
    "mark_done",
    "mark_failed",
    "requeue",
    "purge_done",
];
const INDEXES: [&str; 4] = [
    "message_id_unique",
    "head_of_aggregate",
    "open_messages",
    "done_by_processed_at",
];

/// The named indexes, check constraints and per-outbox procedures of `dbo.<table>`.
async fn parts(
    client: &mut Client,
    table: &str,
) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let indexes = strings(
        client,
        &format!(
            "select name from sys.indexes \
             where object_id = object_id(N'dbo.{table}') and name is not null;"
        ),
    )
    .await;
    let checks = strings(
        client,
        &format!(
            "select name from sys.check_constraints \
             where parent_object_id = object_id(N'dbo.{table}');"
        ),
    )
    .await;
    let names = KINDS
        .iter()
        .map(|kind| format!("N'{kind}:dbo.{table}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let procedures = strings(
        client,
        &format!(
            "select name from sys.procedures \
             where schema_id = schema_id(N'changefeed') and name in ({names});"
        ),
    )
    .await;
    (indexes, checks, procedures)
}

/// Asserts `dbo.<table>` has every index, check and procedure setup_outbox makes.
async fn assert_complete(client: &mut Client, table: &str) {
    let (indexes, checks, procedures) = parts(client, table).await;
    for index in INDEXES {
        assert!(
            indexes.contains(index),
            "dbo.{table} lacks index {index}: {indexes:?}"
        );
    }
    for check in ["status_ck", "json_ck"] {
        let name = format!("{table}:{check}");
        assert!(
            checks.contains(&name),
            "dbo.{table} lacks {name}: {checks:?}"
        );
    }
    let expected: BTreeSet<String> = KINDS.iter().map(|k| format!("{k}:dbo.{table}")).collect();
    assert_eq!(procedures, expected);
    let filtered = scalar_i64(
        client,
        &format!(
            "select convert(int, has_filter) from sys.indexes \
             where object_id = object_id(N'dbo.{table}') and name = N'open_messages';"
        ),
    )
    .await;
    assert_eq!(
        filtered, 1,
        "open_messages is the filtered index on open rows"
    );
}

async fn registry_rows(client: &mut Client, table: &str) -> i64 {
    count(
        client,
        "changefeed.outboxes",
        &format!("schema_name = N'dbo' and table_name = N'{table}'"),
    )
    .await
}

async fn setup_outbox_repairs_in(db: &TestDb) {
    let mut client = db.client().await;

    // A whole install, then parts of it removed by hand.
    let store = outbox("dbo.outbox_repair");
    setup_outbox(&mut client, "dbo.outbox_repair").await;
    assert_complete(&mut client, "outbox_repair").await;
    sql(
        &mut client,
        "drop index open_messages on dbo.outbox_repair; \
         alter table dbo.outbox_repair drop constraint [outbox_repair:status_ck]; \
         drop procedure [changefeed].[claim:dbo.outbox_repair];",
    )
    .await;
    let (indexes, checks, procedures) = parts(&mut client, "outbox_repair").await;
    assert!(!indexes.contains("open_messages"));
    assert!(!checks.contains("outbox_repair:status_ck"));
    assert!(!procedures.contains("claim:dbo.outbox_repair"));
    server_error(
        store.claim(&mut client, 10, HELD).await,
        2812,
        "claim after its procedure was dropped",
    );
    let kept = enqueue_committed(&store, &mut client, &[message_of("repair-1", 1)]).await;

    // Re-running setup_outbox puts every part back and keeps the row.
    setup_outbox(&mut client, "dbo.outbox_repair").await;
    assert_complete(&mut client, "outbox_repair").await;
    assert_eq!(count(&mut client, "dbo.outbox_repair", "1 = 1").await, 1);
    let claimed = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&claimed), vec![kept[0].id]);
    assert_eq!(
        claimed[0].payload,
        json!({ "aggregate": "repair-1", "n": 1 })
    );
    // The restored check constraint is enforced again.
    batch_error(
        &mut client,
        &format!(
            "update dbo.outbox_repair set status = 9 where id = {};",
            kept[0].id
        ),
        547,
    )
    .await;

    // Twice more: no error, one registry row, the data still there.
    setup_outbox(&mut client, "dbo.outbox_repair").await;
    setup_outbox(&mut client, "dbo.outbox_repair").await;
    assert_eq!(registry_rows(&mut client, "outbox_repair").await, 1);
    assert_eq!(count(&mut client, "dbo.outbox_repair", "1 = 1").await, 1);
    assert_complete(&mut client, "outbox_repair").await;

    // A table made by hand that lacks a column: refused with 51306 naming it; nothing was
    // dropped, added or registered.
    sql(
        &mut client,
        "create table dbo.outbox_handmade ( \
             id bigint identity (1, 1) not null primary key clustered, \
             message_id nvarchar(64) not null default (convert(nvarchar(64), newid())), \
             topic nvarchar(256) not null, \
             aggregate_type nvarchar(128) null, \
             aggregate_id nvarchar(256) null, \
             partition_key nvarchar(256) null, \
             payload nvarchar(max) not null, \
             headers nvarchar(max) null, \
             status tinyint not null default 0, \
             attempts int not null default 0, \
             claimed_at datetime2(3) null, \
             claim_token uniqueidentifier null, \
             next_retry_at datetime2(3) null, \
             created_at datetime2(3) not null default sysutcdatetime(), \
             processed_at datetime2(3) null, \
             last_error nvarchar(2000) null \
         ); \
         insert into dbo.outbox_handmade (topic, payload, aggregate_id) \
         values (N'orders', N'{\"kept\": true}', N'handmade-1');",
    )
    .await;
    let message = batch_error(
        &mut client,
        "exec changefeed.setup_outbox @table_name = N'dbo.outbox_handmade';",
        51306,
    )
    .await;
    assert!(
        message.contains("trace_id"),
        "the error names the missing column: {message}"
    );
    assert_eq!(
        scalar_i64(
            &mut client,
            "select count(*) from sys.columns where object_id = object_id(N'dbo.outbox_handmade', N'U');"
        )
        .await,
        16,
        "the table is still there, as it was"
    );
    assert_eq!(count(&mut client, "dbo.outbox_handmade", "1 = 1").await, 1);
    let (indexes, checks, procedures) = parts(&mut client, "outbox_handmade").await;
    assert!(
        INDEXES.iter().all(|index| !indexes.contains(*index)),
        "nothing was added: {indexes:?}"
    );
    assert!(checks.is_empty(), "nothing was added: {checks:?}");
    assert!(
        procedures.is_empty(),
        "nothing was generated: {procedures:?}"
    );
    assert_eq!(registry_rows(&mut client, "outbox_handmade").await, 0);
    assert_eq!(scalar_i64(&mut client, "select @@trancount;").await, 0);

    // With the column added by its owner, setup_outbox completes the hand-made table and
    // its row is claimable.
    sql(
        &mut client,
        "alter table dbo.outbox_handmade add trace_id nvarchar(128) null;",
    )
    .await;
    setup_outbox(&mut client, "dbo.outbox_handmade").await;
    assert_complete(&mut client, "outbox_handmade").await;
    assert_eq!(registry_rows(&mut client, "outbox_handmade").await, 1);
    let handmade = outbox("dbo.outbox_handmade");
    let claimed = claim(&handmade, &mut client, 10, HELD).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].payload, json!({ "kept": true }));
    assert_eq!(claimed[0].aggregate_id.as_deref(), Some("handmade-1"));
}

// ------------------------------------------------------------------------------------------
// 13. validation errors
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn invalid_arguments_are_refused_with_their_error_numbers() {
    common::under_both_isolations("claim_checks", invalid_arguments_in).await;
}

async fn invalid_arguments_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_checks";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    setup_outbox(&mut client, TABLE).await;

    // Claim batch size 1..=10000 and timeout 1 ms..=24 h.
    for batch_size in [0, 10_001] {
        let result = store.claim(&mut client, batch_size, HELD).await;
        server_error(result, 51301, &format!("claim batch size {batch_size}"));
    }
    for timeout_ms in [0, 86_400_001] {
        let result = store
            .claim(&mut client, 10, Duration::from_millis(timeout_ms))
            .await;
        server_error(result, 51301, &format!("claim timeout {timeout_ms} ms"));
    }
    for (batch_size, timeout_ms) in [(1, 1), (10_000, 86_400_000)] {
        let claimed = store
            .claim(&mut client, batch_size, Duration::from_millis(timeout_ms))
            .await
            .unwrap_or_else(|e| panic!("claim({batch_size}, {timeout_ms} ms) is valid: {e}"));
        assert!(claimed.is_empty());
    }

    // mark_done needs a JSON array of ids and a token.
    let mark_done = format!("exec [changefeed].[mark_done:{TABLE}]");
    let some_token = "'6F9619FF-8B86-D011-B42D-00C04FC964FF'";
    for bad_ids in ["N'{\"id\": 1}'", "N'not json'", "N'12'", "null"] {
        batch_error(
            &mut client,
            &format!("{mark_done} @ids = {bad_ids}, @claim_token = {some_token};"),
            51302,
        )
        .await;
    }
    batch_error(
        &mut client,
        &format!("{mark_done} @ids = N'[1]', @claim_token = null;"),
        51302,
    )
    .await;

    // enqueue checks its payload, headers and topic (inside a transaction, as it must run).
    let enqueue = format!("exec [changefeed].[enqueue:{TABLE}] @topic = N'orders'");
    for arguments in [
        "@payload = N'not json'",
        "@payload = N'{\"a\": 1'",
        "@payload = N'{\"a\": 1}', @headers = N'[1, 2]'",
        "@payload = N'{\"a\": 1}', @headers = N'not json'",
        "@payload = N'{\"a\": 1}', @message_id = N''",
    ] {
        begin(&mut client).await;
        batch_error(&mut client, &format!("{enqueue}, {arguments};"), 51304).await;
        sql(&mut client, "if @@trancount > 0 rollback transaction;").await;
    }
    begin(&mut client).await;
    let empty_topic = store
        .enqueue(&mut client, &NewMessage::new("", json!({ "a": 1 })))
        .await;
    server_error(empty_topic, 51304, "enqueue with an empty topic");
    sql(&mut client, "if @@trancount > 0 rollback transaction;").await;
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 0);

    // mark_failed and requeue retry times: at most 366 days; failed needs one.
    let enqueued = enqueue_committed(&store, &mut client, &[message_of("checks-1", 1)]).await;
    let id = enqueued[0].id;
    let token = token_of(&claim(&store, &mut client, 10, HELD).await);
    let too_late = Some(days(367));
    server_error(
        store
            .mark_failed(&mut client, id, token, too_late, false, "x")
            .await,
        51303,
        "mark_failed 367 days",
    );
    server_error(
        store
            .mark_failed(&mut client, id, token, None, false, "x")
            .await,
        51303,
        "mark_failed without a retry time",
    );
    server_error(
        store.requeue(&mut client, id, Some(token), days(367)).await,
        51303,
        "requeue 367 days",
    );
    let state = row_state(&mut client, TABLE, id).await;
    assert_eq!((state.status, state.attempts), (PROCESSING, 0), "{state:?}");

    // purge_done: window 0..=100 years, batch 1..=4000, max rows positive.
    server_error(
        store
            .purge_done(&mut client, days(36_526), 1000, None)
            .await,
        51308,
        "purge_done older than 100 years",
    );
    for batch_size in [0, 4001] {
        server_error(
            store
                .purge_done(&mut client, days(1), batch_size, None)
                .await,
            51308,
            &format!("purge_done batch size {batch_size}"),
        );
    }
    server_error(
        store.purge_done(&mut client, days(1), 100, Some(0)).await,
        51308,
        "purge_done max rows 0",
    );

    // setup_outbox refuses names it cannot use.
    for bad in ["dbo.x]y", "x", "a.b.c", "changefeed.outbox"] {
        batch_error(
            &mut client,
            &format!("exec changefeed.setup_outbox @table_name = N'{bad}';"),
            51000,
        )
        .await;
    }
    batch_error(
        &mut client,
        "exec changefeed.setup_outbox @table_name = N'no_such_schema.outbox';",
        51001,
    )
    .await;
    assert_eq!(
        count(
            &mut client,
            "sys.tables",
            "name in (N'x]y', N'x', N'outbox')"
        )
        .await,
        0,
        "no table was created for a refused name"
    );

    // @native_json = 1: refused where the json type does not exist, else a json outbox.
    let has_json = scalar_i64(
        &mut client,
        "select case when type_id(N'json') is null then 0 else 1 end;",
    )
    .await
        == 1;
    let native =
        "exec changefeed.setup_outbox @table_name = N'dbo.outbox_native', @native_json = 1;";
    if has_json {
        sql(&mut client, native).await;
        let payload_type = strings(
            &mut client,
            "select type_name(user_type_id) from sys.columns \
             where object_id = object_id(N'dbo.outbox_native') and name = N'payload';",
        )
        .await;
        assert_eq!(payload_type, BTreeSet::from(["json".to_owned()]));
        let native_store = outbox("dbo.outbox_native");
        let sent = NewMessage {
            headers: Headers::from([("h".to_owned(), "v".to_owned())]),
            ..message_of("native-1", 1)
        };
        let enqueued =
            enqueue_committed(&native_store, &mut client, std::slice::from_ref(&sent)).await;
        let claimed = claim(&native_store, &mut client, 10, HELD).await;
        assert_eq!(claimed.len(), 1);
        assert_round_trip(&sent, &enqueued[0], &claimed[0]);
    } else {
        let message = batch_error(&mut client, native, 51307).await;
        assert!(message.contains("native_json"), "{message}");
        assert_eq!(
            scalar_i64(
                &mut client,
                "select case when object_id(N'dbo.outbox_native', N'U') is null then 0 else 1 end;"
            )
            .await,
            0,
            "no table was created"
        );
        assert_eq!(registry_rows(&mut client, "outbox_native").await, 0);
    }
}
