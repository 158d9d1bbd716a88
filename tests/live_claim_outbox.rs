//! Live tests of the claim-style outbox (ARCHITECTURE.md, "The claim protocol"): `changefeed.setup_outbox`,
//! the per-outbox procedures `[enqueue|claim|mark_done|mark_failed|requeue|purge_done:S.T]`
//! and `OutboxStore`, which calls them: what only the SQL Server store has (error numbers,
//! locks, collations, storage, session options, repairs, redrive without a token). The
//! claim-outbox contract every store passes (claims, head of aggregate, fencing, reaper,
//! retries, purge, payloads, a killed relay) runs on SQL Server in `contract_mssql.rs`.
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

mod claim_contract;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::Client;
use changefeed::outbox::{
    ClaimToken, Claimed, ClaimedMessage, Enqueued, Failed, Headers, NewMessage,
};
use changefeed::outbox_store::OutboxStore;
use changefeed::row::Column;
use claim_contract::assert_round_trip;
use common::claims::{decoded, enqueue_open, id_list};
use common::sessions::{await_lock_wait, count_range_locks, session_id};
use common::{TestDb, enqueue_committed, exec, rows, scalar_i64};
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

/// A scenario's start: the outbox `table` set up on a new connection, and that connection.
async fn outbox_in(db: &TestDb, table: &str) -> (OutboxStore, Client) {
    let store = outbox(table);
    let mut client = db.client().await;
    setup_outbox(&mut client, table).await;
    (store, client)
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

/// One message of an aggregate, with a small payload naming it.
fn message_of(aggregate_id: &str, n: usize) -> NewMessage {
    NewMessage::new("orders", json!({ "aggregate": aggregate_id, "n": n }))
        .aggregate("order", aggregate_id)
}

/// One message that belongs to no aggregate.
fn loose_message(n: usize) -> NewMessage {
    NewMessage::new("audit", json!({ "n": n }))
}

/// Enqueues `messages` with [`enqueue_committed`]; their ids, in order.
async fn enqueue_ids<const N: usize>(
    store: &OutboxStore,
    client: &mut Client,
    messages: [NewMessage; N],
) -> [i64; N] {
    let enqueued = enqueue_committed(store, client, &messages).await;
    std::array::from_fn(|i| enqueued[i].id)
}

/// An operator's redrive: `id` requeued without a token, due now; the rows it changed.
async fn redrive(store: &OutboxStore, client: &mut Client, id: i64) -> u64 {
    store
        .requeue(client, id, None, Duration::ZERO)
        .await
        .unwrap()
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
            Ok(batch) => return decoded(batch),
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

/// Asserts the claim `batch` took the rows `expected`, in order, `why` it must.
#[track_caller]
fn assert_ids(batch: &[ClaimedMessage], expected: &[i64], why: &str) {
    assert_eq!(ids(batch), expected, "{why}");
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
}

async fn row_state(client: &mut Client, table: &str, id: i64) -> RowState {
    let query = format!(
        "select status, attempts, claim_token, \
         datediff_big(millisecond, sysutcdatetime(), next_retry_at), \
         convert(bit, case when processed_at is null then 0 else 1 end) \
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
// 10. an operator's requeue without a token (SQL Server's redrive; the relay's fenced requeue
//     is the contract's, tests/contract_mssql.rs)
// ------------------------------------------------------------------------------------------

common::live_test!(requeue_without_a_token_redrives_only_failed_and_dead_messages: "claim_redrive" => redrive_in);

async fn redrive_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_redrive";
    let (store, mut client) = outbox_in(db, TABLE).await;

    let [q, q2] = enqueue_ids(
        &store,
        &mut client,
        [message_of("redrive-1", 1), message_of("redrive-1", 2)],
    )
    .await;

    // Without a token a processing message is left alone.
    let t1 = token_of(&claim(&store, &mut client, 10, HELD).await);
    assert_eq!(redrive(&store, &mut client, q).await, 0);
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!(state.status, PROCESSING, "{state:?}");
    assert_eq!(state.claim_token, Some(*t1.as_uuid()), "{state:?}");

    // Dead (after one failure, so that "unchanged" means 2); the next of its aggregate goes.
    assert_eq!(
        store
            .mark_failed(
                &mut client,
                Failed::retry(q, t1, Duration::ZERO, "transient")
            )
            .await
            .unwrap(),
        1
    );
    let again = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&again), vec![q]);
    assert_eq!(
        store
            .mark_failed(&mut client, Failed::dead(q, token_of(&again), "poison"))
            .await
            .unwrap(),
        1
    );
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!((state.status, state.attempts), (DEAD, 2), "{state:?}");
    assert!(state.processed, "{state:?}");
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
    assert_eq!(redrive(&store, &mut client, q).await, 1);
    let state = row_state(&mut client, TABLE, q).await;
    assert_eq!(state.status, FAILED, "{state:?}");
    assert_eq!(state.attempts, 2, "{state:?}");
    assert!(!state.processed, "{state:?}");
    assert!(state.retry_in_ms.expect("next_retry_at") <= 1, "{state:?}");
    let redriven = claim(&store, &mut client, 10, HELD).await;
    assert_eq!(ids(&redriven), vec![q]);
    assert_eq!(redriven[0].attempts, 2);
    // A done message is not redriven.
    assert_eq!(redrive(&store, &mut client, q2).await, 0);
    assert_eq!(row_state(&mut client, TABLE, q2).await.status, DONE);
}

// ------------------------------------------------------------------------------------------
// 11. text is stored as sent, in nvarchar (its round trip is the contract's)
// ------------------------------------------------------------------------------------------

common::live_test!(unicode_and_one_megabyte_payloads_are_stored_whole_as_nvarchar: "claim_nvarchar" => nvarchar_in);

async fn nvarchar_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_nvarchar";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let blob: String = "ЖжЯя注文🚀é".chars().cycle().take(1_000_000).collect();
    let sent = NewMessage::new("big", json!({ "blob": blob })).aggregate("заказ", "заказ-№42");
    let enqueued = enqueue_committed(&store, &mut client, std::slice::from_ref(&sent)).await;
    let id = enqueued[0].id;
    let stored = strings(
        &mut client,
        &format!("select aggregate_id from {TABLE} where id = {id};"),
    )
    .await;
    assert_eq!(stored, BTreeSet::from(["заказ-№42".to_owned()]));
    let stored_bytes = scalar_i64(
        &mut client,
        &format!("select convert(bigint, datalength(payload)) from {TABLE} where id = {id};"),
    )
    .await;
    assert!(
        stored_bytes >= 2_000_000,
        "1,000,000 characters stored whole as nvarchar, got {stored_bytes} bytes"
    );
}

// ------------------------------------------------------------------------------------------
// 12. re-running setup_outbox repairs a partial install
// ------------------------------------------------------------------------------------------

#[cfg(feature = "cli")]
common::live_test!(the_cli_sets_up_lists_and_purges_a_sql_server_outbox: "claim_cli" => cli_outbox_in);

/// `changefeed setup-outbox`, `status` and `purge-outbox` with an ADO.NET URL: the outbox
/// is made by `changefeed.setup_outbox`, listed, and a done message older than the cutoff
/// goes while a newer one stays.
#[cfg(feature = "cli")]
async fn cli_outbox_in(db: &TestDb) {
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_changefeed"))
            .args(args)
            .args(["--url", &db.ado()])
            .output()
            .expect("the changefeed binary runs")
    };
    let made = cli(&["setup-outbox", "dbo.cli_outbox"]);
    assert!(made.status.success(), "{made:?}");
    assert!(
        String::from_utf8_lossy(&made.stdout).starts_with("outbox dbo.cli_outbox is ready"),
        "{made:?}"
    );
    let store = OutboxStore::new("dbo.cli_outbox".parse().unwrap());
    let mut client = db.client().await;
    let e = enqueue_committed(
        &store,
        &mut client,
        &[
            claim_contract::message_of("a", 1),
            claim_contract::message_of("b", 1),
        ],
    )
    .await;
    exec(
        &mut client,
        &format!(
            "update dbo.cli_outbox set status = 2, \
             processed_at = dateadd(day, -10, sysutcdatetime()) where id = {}; \
             update dbo.cli_outbox set status = 2, processed_at = sysutcdatetime() \
             where id = {};",
            e[0].id, e[1].id
        ),
    )
    .await
    .unwrap();
    let status = cli(&["status", "--json"]);
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["outboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["outbox"] == "dbo.cli_outbox"),
        "{status}"
    );
    let purged = cli(&["purge-outbox", "dbo.cli_outbox", "--older-than", "7d"]);
    assert!(purged.status.success(), "{purged:?}");
    assert_eq!(
        String::from_utf8_lossy(&purged.stdout),
        "deleted 1 done message older than 7d from dbo.cli_outbox\n"
    );
    let left = scalar_i64(&mut client, "select count_big(*) from dbo.cli_outbox").await;
    assert_eq!(left, 1);
}

common::live_test!(setup_outbox_repairs_a_partial_install_and_never_drops_data: "claim_repair" => setup_outbox_repairs_in);

const KINDS: [&str; 7] = [
    "enqueue",
    "claim",
    "mark_done",
    "mark_failed",
    "requeue",
    "purge_done",
    "held_aggregates",
];
const INDEXES: [&str; 4] = [
    "message_id_unique",
    "head_of_aggregate",
    "open_messages",
    "done_by_processed_at",
];

/// `create table` for an outbox its owner made by hand: every column setup_outbox requires,
/// `trace_id` only `with_trace_id`, no `claim_expires_at` (setup_outbox adds that itself),
/// and `aggregate_id` and `partition_key` in the `collations` given, else the database's.
fn hand_made_outbox(table: &str, collations: Option<(&str, &str)>, with_trace_id: bool) -> String {
    let (aggregate_id, partition_key) = collations.map_or_else(Default::default, |(a, p)| {
        (format!(" collate {a}"), format!(" collate {p}"))
    });
    let trace_id = if with_trace_id {
        "trace_id nvarchar(128) null,"
    } else {
        ""
    };
    format!(
        "create table {table} ( \
             id bigint identity (1, 1) not null primary key clustered, \
             message_id nvarchar(64) not null default (convert(nvarchar(64), newid())), \
             topic nvarchar(256) not null, \
             aggregate_type nvarchar(128) null, \
             aggregate_id nvarchar(256){aggregate_id} null, \
             partition_key nvarchar(256){partition_key} null, \
             payload nvarchar(max) not null, \
             headers nvarchar(max) null, \
             {trace_id} \
             status tinyint not null default 0, \
             attempts int not null default 0, \
             claimed_at datetime2(3) null, \
             claim_token uniqueidentifier null, \
             next_retry_at datetime2(3) null, \
             created_at datetime2(3) not null default sysutcdatetime(), \
             processed_at datetime2(3) null, \
             last_error nvarchar(2000) null \
         );"
    )
}

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
    assert_queue_storage(client, &format!("dbo.{table}")).await;
}

/// Asserts `table` (a quoted or plain two-part name) is stored for row-by-row queue access:
/// no index allows page locks, and its locks never escalate.
async fn assert_queue_storage(client: &mut Client, table: &str) {
    let escaped = table.replace('\'', "''");
    let indexes = scalar_i64(
        client,
        &format!(
            "select count(*) from sys.indexes \
             where object_id = object_id(N'{escaped}', N'U') and index_id > 0;"
        ),
    )
    .await;
    assert!(indexes >= 1, "{table} has indexes");
    let paged = strings(
        client,
        &format!(
            "select name from sys.indexes \
             where object_id = object_id(N'{escaped}', N'U') and index_id > 0 \
             and allow_page_locks = 1;"
        ),
    )
    .await;
    assert!(
        paged.is_empty(),
        "{table}: indexes allowing page locks: {paged:?}"
    );
    let escalation = strings(
        client,
        &format!(
            "select lock_escalation_desc from sys.tables \
             where object_id = object_id(N'{escaped}', N'U');"
        ),
    )
    .await;
    assert_eq!(
        escalation,
        BTreeSet::from(["DISABLE".to_owned()]),
        "{table}"
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
        &format!(
            "{} insert into dbo.outbox_handmade (topic, payload, aggregate_id) \
             values (N'orders', N'{{\"kept\": true}}', N'handmade-1');",
            hand_made_outbox("dbo.outbox_handmade", None, false)
        ),
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
    // The claim's expiry column is the one setup_outbox adds itself (nullable, metadata only).
    assert_eq!(
        scalar_i64(
            &mut client,
            "select count(*) from sys.columns where object_id = object_id(N'dbo.outbox_handmade', N'U');"
        )
        .await,
        18,
        "trace_id by its owner, claim_expires_at by setup_outbox"
    );
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

common::live_test!(invalid_arguments_are_refused_with_their_error_numbers: "claim_checks" => invalid_arguments_in);

async fn invalid_arguments_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_checks";
    let (store, mut client) = outbox_in(db, TABLE).await;

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
    for (ids_json, token) in [
        ("N'{\"id\": 1}'", some_token),
        ("N'not json'", some_token),
        ("N'12'", some_token),
        ("null", some_token),
        ("N'[1]'", "null"),
    ] {
        let call = format!("{mark_done} @ids = {ids_json}, @claim_token = {token};");
        batch_error(&mut client, &call, 51302).await;
    }

    // Outside a transaction enqueue is refused, and writes nothing.
    let outside = store.enqueue(&mut client, &message_of("order-43", 1)).await;
    let message = server_error(outside, 51300, "enqueue outside a transaction");
    assert!(message.contains("transaction"), "{message}");
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 0);
    assert_eq!(scalar_i64(&mut client, "select @@trancount;").await, 0);

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
    for (retry_after, what) in [
        (Some(days(367)), "mark_failed 367 days"),
        (None, "mark_failed without a retry time"),
    ] {
        let failed = Failed {
            id,
            token,
            retry_after,
            dead: false,
            error: "x",
        };
        server_error(store.mark_failed(&mut client, failed).await, 51303, what);
    }
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
    for (bad, number) in [
        ("dbo.x]y", 51000),
        ("x", 51000),
        ("a.b.c", 51000),
        ("changefeed.outbox", 51000),
        ("no_such_schema.outbox", 51001),
    ] {
        let call = format!("exec changefeed.setup_outbox @table_name = N'{bad}';");
        batch_error(&mut client, &call, number).await;
    }
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

// ------------------------------------------------------------------------------------------
// 14. liveness: an open transaction holds back only its own aggregate (issue 10, B6)
// ------------------------------------------------------------------------------------------

/// How long a claim next to an open transaction may take before the test calls it blocked.
/// The claim never waits for a lock, so this only has to cover a slow machine.
const NOT_BLOCKED: Duration = Duration::from_secs(20);

/// A claim that must not wait for another session's open transaction.
async fn claim_unblocked(
    store: &OutboxStore,
    client: &mut Client,
    what: &str,
) -> Vec<ClaimedMessage> {
    common::tasks::bounded(what, NOT_BLOCKED, claim(store, client, 100, HELD)).await
}

/// Ends `holder`'s open transaction with `end` (`commit` or `rollback`), then claims what
/// that released, as [`claim_unblocked`] does.
async fn claim_after(
    end: &str,
    holder: &mut Client,
    store: &OutboxStore,
    client: &mut Client,
) -> Vec<ClaimedMessage> {
    sql(holder, &format!("{end} transaction;")).await;
    claim_unblocked(store, client, &format!("claim after the {end}")).await
}

/// One held aggregate as `held_aggregates` reports it.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    aggregate_id: String,
    held_id: i64,
    held_status: u8,
    waiting: i64,
    first_waiting_id: i64,
}

/// Runs `[held_aggregates:TABLE]`: the held aggregates and the sessions holding rows.
async fn held_aggregates(client: &mut Client, table: &str) -> (Vec<Held>, BTreeSet<i64>) {
    let text = format!("exec [changefeed].[held_aggregates:{table}];");
    let sets = client
        .simple_query(text.as_str())
        .await
        .unwrap_or_else(|error| panic!("{text}: {error}"))
        .into_results()
        .await
        .unwrap_or_else(|error| panic!("{text}: {error}"));
    assert_eq!(sets.len(), 2, "{text} returns two result sets");
    let held = sets[0]
        .iter()
        .map(|row| Held {
            aggregate_id: String::column(row, 0).expect("aggregate_id"),
            held_id: i64::column(row, 1).expect("held_id"),
            held_status: u8::column(row, 2).expect("held_status"),
            waiting: i64::column(row, 3).expect("waiting"),
            first_waiting_id: i64::column(row, 4).expect("first_waiting_id"),
        })
        .collect();
    let sessions = sets[1]
        .iter()
        .map(|row| i64::from(i32::column(row, 0).expect("session_id")))
        .collect();
    (held, sessions)
}

common::live_test!(open_enqueue_of_one_aggregate_does_not_stop_the_claim_of_others: "claim_open_enqueue" => open_enqueue_in);

async fn open_enqueue_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_open_enqueue";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let mut writer = db.client().await;
    let writer_session = session_id(&mut writer).await;

    // A business transaction enqueues A's first message and stays open; A's second message
    // and B's first, and a message without an aggregate, commit after it.
    let a1 = enqueue_open(&store, &mut writer, &message_of("A", 1)).await;
    let [a2, b1, l1] = enqueue_ids(
        &store,
        &mut client,
        [message_of("A", 2), message_of("B", 1), loose_message(1)],
    )
    .await;
    assert!(a1 < a2, "the open enqueue took the earlier id");

    // The claim does not wait for the open transaction: B and the loose message go out,
    // A's committed later message does not overtake A's uncommitted earlier one.
    let first = claim_unblocked(&store, &mut client, "claim next to an open enqueue").await;
    assert_eq!(ids(&first), vec![b1, l1]);
    assert_eq!(
        store
            .mark_done(&mut client, &[b1, l1], token_of(&first))
            .await
            .unwrap(),
        2
    );
    let again = claim_unblocked(&store, &mut client, "claim again").await;
    assert!(again.is_empty(), "A stays held while a1 is open: {again:?}");

    // It is visible: which aggregate, which row, which session.
    let (held, sessions) = held_aggregates(&mut client, TABLE).await;
    assert_eq!(
        held,
        vec![Held {
            aggregate_id: "A".to_owned(),
            held_id: a1,
            held_status: PENDING,
            waiting: 1,
            first_waiting_id: a2,
        }]
    );
    assert!(
        sessions.contains(&writer_session),
        "the writer's session {writer_session} is among the holders: {sessions:?}"
    );

    // The writer commits: A's messages go out in id order, one at a time.
    let after_commit = claim_after("commit", &mut writer, &store, &mut client).await;
    assert_eq!(ids(&after_commit), vec![a1]);
    assert!(
        claim(&store, &mut client, 100, HELD).await.is_empty(),
        "a2 waits for a1"
    );
    store
        .mark_done(&mut client, &[a1], token_of(&after_commit))
        .await
        .unwrap();
    assert_eq!(ids(&claim(&store, &mut client, 100, HELD).await), vec![a2]);
    assert!(held_aggregates(&mut client, TABLE).await.0.is_empty());

    // Another open enqueue, of C, that rolls back: C's later message goes out after it.
    let c1 = enqueue_open(&store, &mut writer, &message_of("C", 1)).await;
    let [c2, d1] = enqueue_ids(
        &store,
        &mut client,
        [message_of("C", 2), message_of("D", 1)],
    )
    .await;
    assert!(c1 < c2);
    let only_d = claim_unblocked(&store, &mut client, "claim next to C's open enqueue").await;
    assert_eq!(ids(&only_d), vec![d1]);
    let after_rollback = claim_after("rollback", &mut writer, &store, &mut client).await;
    assert_eq!(ids(&after_rollback), vec![c2]);
    assert_eq!(count(&mut client, TABLE, &format!("id = {c1}")).await, 0);
}

common::live_test!(acknowledgement_in_flight_holds_only_its_aggregate: "claim_ack_in_flight" => ack_in_flight_in);

async fn ack_in_flight_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_ack_in_flight";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let mut acker = db.client().await;

    let [a1, a2] = enqueue_ids(
        &store,
        &mut client,
        [message_of("A", 1), message_of("A", 2)],
    )
    .await;
    let first = claim(&store, &mut client, 100, HELD).await;
    assert_eq!(ids(&first), vec![a1]);
    let token = token_of(&first);

    // An acknowledgement of a1 inside a transaction that is still open: a1 reads as done
    // to a dirty read, but may still roll back. a2 must not be claimed meanwhile (it would
    // be in flight next to a1 if the acknowledgement rolled back); E goes out; nothing waits.
    begin(&mut acker).await;
    assert_eq!(store.mark_done(&mut acker, &[a1], token).await.unwrap(), 1);
    let e1 = enqueue_committed(&store, &mut client, &[message_of("E", 1)]).await[0].id;
    let during = claim_unblocked(&store, &mut client, "claim next to an open mark_done").await;
    assert_eq!(ids(&during), vec![e1]);
    let (held, _) = held_aggregates(&mut client, TABLE).await;
    assert_eq!(
        held.iter()
            .map(|h| (h.aggregate_id.as_str(), h.held_id, h.held_status))
            .collect::<Vec<_>>(),
        vec![("A", a1, DONE)],
        "a1 is held, as last written (done, uncommitted)"
    );

    // It rolls back: a1 is processing again under its token, and a2 still waits for it.
    rollback(&mut acker).await;
    assert_eq!(row_state(&mut client, TABLE, a1).await.status, PROCESSING);
    let after = claim_unblocked(&store, &mut client, "claim after the rollback").await;
    assert!(after.is_empty(), "a2 waits for processing a1: {after:?}");

    // The same acknowledgement, committed: a2 is the head now.
    assert_eq!(store.mark_done(&mut client, &[a1], token).await.unwrap(), 1);
    assert_eq!(ids(&claim(&store, &mut client, 100, HELD).await), vec![a2]);

    // A claim left open in another transaction holds its rows the same way: the next
    // message of that aggregate waits, other aggregates do not.
    let [f1, f2, g1] = enqueue_ids(
        &store,
        &mut client,
        [message_of("F", 1), message_of("F", 2), message_of("G", 1)],
    )
    .await;
    begin(&mut acker).await;
    let open_claim = decoded(
        store
            .claim(&mut acker, 1, HELD)
            .await
            .expect("claim in a transaction"),
    );
    assert_eq!(ids(&open_claim), vec![f1]);
    let beside = claim_unblocked(&store, &mut client, "claim next to an open claim").await;
    assert_ids(
        &beside,
        &[g1],
        "f2 waits for f1, whose claim is not committed",
    );
    let after_claim_rollback = claim_after("rollback", &mut acker, &store, &mut client).await;
    assert_ids(
        &after_claim_rollback,
        &[f1],
        "f1 is pending again, f2 still waits",
    );
    assert!(!ids(&after_claim_rollback).contains(&f2));
}

// ------------------------------------------------------------------------------------------
// 15. enqueue with a caller's message_id takes no range locks (issue 10, B7)
// ------------------------------------------------------------------------------------------

common::live_test!(enqueue_of_new_message_ids_does_not_block_other_transactions: "claim_enqueue_keys" => enqueue_keys_in);

fn keyed(message_id: &str, n: usize) -> NewMessage {
    NewMessage {
        message_id: Some(message_id.to_owned()),
        ..message_of(message_id, n)
    }
}

/// Starts `message` enqueued on `client` inside a new transaction, in a task; the task
/// commits once the enqueue returned and hands back the result and the connection.
fn enqueue_in_task(
    store: &OutboxStore,
    mut client: Client,
    message: NewMessage,
) -> JoinHandle<(Enqueued, Client)> {
    let store = store.clone();
    tokio::spawn(async move {
        begin(&mut client).await;
        let enqueued = store
            .enqueue(&mut client, &message)
            .await
            .unwrap_or_else(|error| panic!("enqueue {:?}: {error}", message.message_id));
        commit(&mut client).await;
        (enqueued, client)
    })
}

/// Enqueues `key` (payload n = 1) in a transaction left open on `first`, then starts the
/// same key's enqueue (payload n = 2) on `second` in a task, and asserts that it waits.
async fn same_key_race(
    store: &OutboxStore,
    first: &mut Client,
    second: Client,
    key: &str,
) -> (Enqueued, JoinHandle<(Enqueued, Client)>) {
    begin(first).await;
    let enqueued = store
        .enqueue(first, &keyed(key, 1))
        .await
        .unwrap_or_else(|error| panic!("enqueue {key}: {error}"));
    let waiting = enqueue_in_task(store, second, keyed(key, 2));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the same key {key} waits for the open transaction"
    );
    (enqueued, waiting)
}

async fn enqueue_keys_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_enqueue_keys";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let mut first = db.client().await;
    let mut second = db.client().await;
    enqueue_committed(&store, &mut client, &[keyed("key-0005", 1)]).await;
    let first_session = session_id(&mut first).await;

    // Two open transactions enqueue new keys in the same gap of the unique index (after the
    // last key, and between two keys): neither waits for the other, and the first holds no
    // key-range lock.
    begin(&mut first).await;
    store
        .enqueue(&mut first, &keyed("key-0006", 1))
        .await
        .expect("first");
    let range_locks = count_range_locks(&mut client, first_session).await;
    assert_eq!(range_locks, 0, "enqueue holds no key-range lock");
    begin(&mut second).await;
    for key in ["key-0007", "key-0004", "key-0006a"] {
        common::tasks::bounded(
            &format!("enqueue {key} next to an open enqueue of key-0006"),
            NOT_BLOCKED,
            store.enqueue(&mut second, &keyed(key, 1)),
        )
        .await
        .expect("second");
    }
    commit(&mut second).await;
    commit(&mut first).await;
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 5);

    // The same new key in two transactions: the second waits for the first and, once the
    // first commits, gets the first's row; nothing is doomed, one row.
    let (original, waiting) = same_key_race(&store, &mut first, second, "dup-1").await;
    commit(&mut first).await;
    let (repeated, second) = join("the waiting enqueue of dup-1", waiting).await;
    assert_eq!(repeated, original);
    assert_eq!(count(&mut client, TABLE, "message_id = N'dup-1'").await, 1);

    // When the first rolls back, the second inserts its own row.
    let (gone, waiting) = same_key_race(&store, &mut first, second, "dup-2").await;
    rollback(&mut first).await;
    let (inserted, _) = join("the waiting enqueue of dup-2", waiting).await;
    assert_ne!(inserted.id, gone.id);
    assert_eq!(inserted.message_id, "dup-2");
    assert_eq!(count(&mut client, TABLE, "message_id = N'dup-2'").await, 1);
    let payload = strings(
        &mut client,
        &format!("select payload from {TABLE} where message_id = N'dup-2';"),
    )
    .await;
    let stored: serde_json::Value =
        serde_json::from_str(payload.iter().next().expect("the row")).unwrap();
    assert_eq!(stored, json!({ "aggregate": "dup-2", "n": 2 }));
}

// ------------------------------------------------------------------------------------------
// 16. implicit transactions (issue 10, B3)
// ------------------------------------------------------------------------------------------

common::live_test!(outbox_procedures_leave_no_transaction_open_under_implicit_transactions: "claim_implicit" => implicit_transactions_in);

/// Asserts the session has no transaction open, and that IMPLICIT_TRANSACTIONS is still on
/// (a procedure's SET reverts on return: the client's setting is untouched).
async fn assert_no_transaction(client: &mut Client, after: &str) {
    assert_eq!(
        scalar_i64(client, "select @@trancount;").await,
        0,
        "{after} left a transaction open"
    );
    assert_eq!(
        scalar_i64(client, "select @@options & 2;").await,
        2,
        "{after} changed the session's IMPLICIT_TRANSACTIONS"
    );
}

async fn implicit_transactions_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_implicit";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let mut other = db.client().await;
    sql(&mut client, "create table dbo.business (n int not null);").await;
    let [a1, b1, c1] = enqueue_ids(
        &store,
        &mut client,
        [message_of("A", 1), message_of("B", 1), message_of("C", 1)],
    )
    .await;

    sql(&mut client, "set implicit_transactions on;").await;
    assert_no_transaction(&mut client, "set implicit_transactions on").await;

    // Setup and upgrade commit their own transactions.
    setup_outbox(&mut client, TABLE).await;
    assert_no_transaction(&mut client, "setup_outbox").await;
    sql(
        &mut client,
        &format!("exec changefeed.upgrade_outbox @table_name = N'{TABLE}';"),
    )
    .await;
    assert_no_transaction(&mut client, "upgrade_outbox").await;

    // The claim commits: another session can acknowledge and claim at once.
    let claimed = claim(&store, &mut client, 100, HELD).await;
    assert_eq!(ids(&claimed), vec![a1, b1, c1]);
    assert_no_transaction(&mut client, "claim").await;
    let token = token_of(&claimed);
    assert_eq!(
        common::tasks::bounded(
            "mark_done on another session after an implicit-transaction claim",
            NOT_BLOCKED,
            store.mark_done(&mut other, &[a1], token),
        )
        .await
        .unwrap(),
        1
    );

    // The acknowledgements commit: the rows they touched are not held.
    assert_eq!(store.mark_done(&mut client, &[b1], token).await.unwrap(), 1);
    assert_no_transaction(&mut client, "mark_done").await;
    assert_eq!(
        store
            .mark_failed(
                &mut client,
                Failed::retry(c1, token, Duration::from_secs(3600), "x")
            )
            .await
            .unwrap(),
        1
    );
    assert_no_transaction(&mut client, "mark_failed").await;
    assert_eq!(
        store
            .requeue(&mut client, c1, None, Duration::from_secs(3600))
            .await
            .unwrap(),
        1
    );
    assert_no_transaction(&mut client, "requeue").await;
    held_aggregates(&mut client, TABLE).await;
    assert_no_transaction(&mut client, "held_aggregates").await;
    set_column(
        &mut other,
        TABLE,
        "processed_at",
        "dateadd(day, -2, sysutcdatetime())",
        &[a1, b1],
    )
    .await;
    assert_eq!(
        store
            .purge_done(&mut client, days(1), 1, None)
            .await
            .unwrap(),
        2
    );
    assert_no_transaction(&mut client, "purge_done").await;
    let held = held_aggregates(&mut other, TABLE).await.0;
    assert!(
        held.is_empty(),
        "nothing is held by the implicit-transaction session: {held:?}"
    );

    // enqueue needs the caller's transaction; the EXEC alone opens none, and the error says
    // what to do. After the business change (which opens the implicit transaction) it runs.
    let refused = store.enqueue(&mut client, &message_of("D", 1)).await;
    let message = server_error(refused, 51300, "enqueue as the first statement");
    assert!(message.contains("IMPLICIT_TRANSACTIONS"), "{message}");
    assert!(message.contains("BEGIN TRANSACTION"), "{message}");
    sql(&mut client, "insert into dbo.business (n) values (1);").await;
    let d1 = store
        .enqueue(&mut client, &message_of("D", 1))
        .await
        .expect("enqueue after the business change")
        .id;
    assert_eq!(scalar_i64(&mut client, "select @@trancount;").await, 1);
    sql(&mut client, "commit transaction;").await;
    assert_no_transaction(&mut client, "commit").await;
    assert_eq!(count(&mut other, TABLE, &format!("id = {d1}")).await, 1);
}

// ------------------------------------------------------------------------------------------
// 17. collations of the key columns (issue 10, A2)
// ------------------------------------------------------------------------------------------

common::live_test!(partition_key_is_binary_and_claim_works_with_any_collation_of_it: "claim_collation" => collation_in);

/// The collation of every column of `table` named in `columns`, by column.
async fn collations(client: &mut Client, table: &str) -> BTreeMap<String, String> {
    let query = format!(
        "select name, collation_name from sys.columns \
         where object_id = object_id(N'{table}') \
         and name in (N'message_id', N'aggregate_id', N'partition_key');"
    );
    rows(client, &query)
        .await
        .unwrap_or_else(|error| panic!("{query}: {error}"))
        .iter()
        .map(|row| {
            (
                String::column(row, 0).expect("name"),
                String::column(row, 1).expect("collation_name"),
            )
        })
        .collect()
}

async fn collation_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_collation";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let binary = "Latin1_General_100_BIN2".to_owned();
    assert_eq!(
        collations(&mut client, TABLE).await,
        BTreeMap::from([
            ("aggregate_id".to_owned(), binary.clone()),
            ("message_id".to_owned(), binary.clone()),
            ("partition_key".to_owned(), binary.clone()),
        ])
    );

    // partition_key defaults to aggregate_id; aggregates compare exactly ('Ord-1' and
    // 'ord-1' are two aggregates, so both heads go out in one claim).
    let routed = NewMessage {
        partition_key: Some("pk-x".to_owned()),
        ..message_of("ord-1", 1)
    };
    let loose_routed = NewMessage {
        partition_key: Some("pk-y".to_owned()),
        ..loose_message(1)
    };
    enqueue_committed(
        &store,
        &mut client,
        &[message_of("Ord-1", 1), routed, loose_routed],
    )
    .await;
    let claimed = claim(&store, &mut client, 100, HELD).await;
    let keys: Vec<Option<&str>> = claimed.iter().map(|m| m.partition_key.as_deref()).collect();
    assert_eq!(keys, vec![Some("Ord-1"), Some("pk-x"), Some("pk-y")]);

    // A table made by hand with two other, different collations on aggregate_id and
    // partition_key: setup_outbox keeps them (the owner's decision), and claim still mixes
    // the two columns without a collation conflict.
    sql(
        &mut client,
        &hand_made_outbox(
            "dbo.outbox_collation_handmade",
            Some(("Latin1_General_CI_AS", "French_CI_AS")),
            true,
        ),
    )
    .await;
    setup_outbox(&mut client, "dbo.outbox_collation_handmade").await;
    let handmade = "dbo.outbox_collation_handmade";
    let kept = collations(&mut client, handmade).await;
    assert_eq!(
        kept.get("aggregate_id").map(String::as_str),
        Some("Latin1_General_CI_AS")
    );
    assert_eq!(
        kept.get("partition_key").map(String::as_str),
        Some("French_CI_AS")
    );
    let handmade_store = outbox(handmade);
    let routed = NewMessage {
        partition_key: Some("pk-z".to_owned()),
        ..message_of("h-2", 1)
    };
    enqueue_committed(
        &handmade_store,
        &mut client,
        &[message_of("h-1", 1), routed],
    )
    .await;
    let claimed = claim(&handmade_store, &mut client, 100, HELD).await;
    let keys: Vec<Option<&str>> = claimed.iter().map(|m| m.partition_key.as_deref()).collect();
    assert_eq!(keys, vec![Some("h-1"), Some("pk-z")]);
}

// ------------------------------------------------------------------------------------------
// 18. outbox storage for queue access (issue 10, B11)
// ------------------------------------------------------------------------------------------

common::live_test!(outbox_tables_allow_no_page_locks_and_never_escalate: "claim_storage" => storage_in);

async fn storage_in(db: &TestDb) {
    let mut client = db.client().await;
    setup_outbox(&mut client, "dbo.outbox_storage").await;
    assert_queue_storage(&mut client, "dbo.outbox_storage").await;

    // The feed outbox of an outbox-mode feed.
    sql(
        &mut client,
        "create table dbo.storage_events (Id bigint not null primary key); \
         exec changefeed.setup_feed @table_name = N'dbo.storage_events', @outbox = 1;",
    )
    .await;
    assert_queue_storage(&mut client, "[changefeed].[outbox:dbo.storage_events]").await;

    // An existing claim outbox with page locks allowed and escalation on is repaired.
    sql(
        &mut client,
        "alter index all on dbo.outbox_storage set (allow_page_locks = on); \
         alter table dbo.outbox_storage set (lock_escalation = table);",
    )
    .await;
    setup_outbox(&mut client, "dbo.outbox_storage").await;
    assert_queue_storage(&mut client, "dbo.outbox_storage").await;
}

// ------------------------------------------------------------------------------------------
// 19. compatibility level (issue 10, B12)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
async fn migrate_refuses_a_database_below_compatibility_level_130() {
    let name = format!("changefeed_compat_{}", std::process::id());
    let mut master = common::connect_to("master").await;
    sql(
        &mut master,
        &format!(
            "if db_id(N'{name}') is not null begin alter database [{name}] set single_user \
             with rollback immediate; drop database [{name}]; end; create database [{name}];"
        ),
    )
    .await;
    sql(
        &mut master,
        &format!("alter database [{name}] set compatibility_level = 120;"),
    )
    .await;

    let mut client = common::connect_to(&name).await;
    let error = changefeed::migrations::migrate(&mut client)
        .await
        .expect_err("a database at level 120 is refused");
    let text = error.to_string();
    assert!(matches!(error, changefeed::Error::Migration(_)), "{text}");
    assert!(text.contains("compatibility level 120"), "{text}");
    assert!(
        text.contains(&format!(
            "alter database [{name}] set compatibility_level = 130;"
        )),
        "{text}"
    );
    assert_eq!(
        scalar_i64(
            &mut client,
            &format!(
                "select (select count(*) from sys.objects where name = N'{}') \
                 + (select count(*) from sys.schemas where name = N'changefeed');",
                changefeed::migrations::HISTORY_TABLE
            ),
        )
        .await,
        0,
        "nothing was applied"
    );

    // The fix the message names makes it work.
    sql(
        &mut master,
        &format!("alter database [{name}] set compatibility_level = 130;"),
    )
    .await;
    changefeed::migrations::migrate(&mut client)
        .await
        .expect("a database at level 130 takes the bundle");
    drop(client);
    sql(
        &mut master,
        &format!("alter database [{name}] set single_user with rollback immediate; drop database [{name}];"),
    )
    .await;
}

// ------------------------------------------------------------------------------------------
// 20. relays racing: one message per aggregate in flight, in id order (issue 10, B6)
// ------------------------------------------------------------------------------------------

common::live_test!(racing_relays_keep_one_message_per_aggregate_in_flight_in_id_order: "claim_race_order" => racing_relays_in);

/// What the relays of `racing_relays_in` share: the message of each aggregate they hold,
/// and the order in which each aggregate's messages were claimed.
#[derive(Default)]
struct Flight {
    holding: BTreeMap<String, i64>,
    order: BTreeMap<String, Vec<i64>>,
}

async fn racing_relays_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_race_order";
    const RELAYS: usize = 6;
    const AGGREGATES: usize = 5;
    const PER_AGGREGATE: usize = 12;
    let store = outbox(TABLE);
    let mut admin = db.client().await;
    setup_outbox(&mut admin, TABLE).await;

    // Interleaved: each aggregate's messages are spread over the id range.
    let messages: Vec<NewMessage> = (0..PER_AGGREGATE)
        .flat_map(|n| (0..AGGREGATES).map(move |a| message_of(&format!("race-{a}"), n)))
        .collect();
    let enqueued = enqueue_committed(&store, &mut admin, &messages).await;
    let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (message, row) in messages.iter().zip(&enqueued) {
        let aggregate = message.aggregate_id.clone().expect("an aggregate");
        expected.entry(aggregate).or_default().push(row.id);
    }

    let flight = Arc::new(std::sync::Mutex::new(Flight::default()));
    let barrier = Arc::new(Barrier::new(RELAYS));
    let mut tasks = Vec::new();
    for relay in 0..RELAYS {
        let name = db.name.clone();
        let store = store.clone();
        let flight = Arc::clone(&flight);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut client = common::connect_to(&name).await;
            barrier.wait().await;
            let started = Instant::now();
            let mut acks = 0usize;
            loop {
                let batch = claim(&store, &mut client, 3, HELD).await;
                {
                    let mut flight = flight.lock().expect("the flight log");
                    for message in &batch {
                        let aggregate = message.aggregate_id.clone().expect("an aggregate");
                        if let Some(held) = flight.holding.get(&aggregate) {
                            panic!(
                                "relay {relay} claimed {} of {aggregate} while {held} is in \
                                 flight",
                                message.id
                            );
                        }
                        flight.holding.insert(aggregate.clone(), message.id);
                        flight.order.entry(aggregate).or_default().push(message.id);
                    }
                }
                if batch.is_empty() {
                    if count(&mut client, TABLE, "status <> 2").await == 0 {
                        return;
                    }
                    assert!(
                        started.elapsed() < TASK_LIMIT,
                        "relay {relay}: messages are left that no relay claims"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let token = token_of(&batch);
                for message in &batch {
                    acks += 1;
                    // Every third acknowledgement first runs in a transaction that stays
                    // open a moment and rolls back: the message is still in flight then.
                    if acks.is_multiple_of(3) {
                        begin(&mut client).await;
                        assert_eq!(
                            store
                                .mark_done(&mut client, &[message.id], token)
                                .await
                                .unwrap(),
                            1
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        rollback(&mut client).await;
                    }
                    // Released before the acknowledgement commits: the next message of
                    // the aggregate can only be claimed after that.
                    let aggregate = message.aggregate_id.clone().expect("an aggregate");
                    flight
                        .lock()
                        .expect("the flight log")
                        .holding
                        .remove(&aggregate);
                    assert_eq!(
                        store
                            .mark_done(&mut client, &[message.id], token)
                            .await
                            .unwrap(),
                        1,
                        "relay {relay}: {} was still held under its token",
                        message.id
                    );
                }
            }
        }));
    }
    for (relay, task) in tasks.into_iter().enumerate() {
        join(&format!("relay {relay}"), task).await;
    }

    let order = std::mem::take(&mut flight.lock().expect("the flight log").order);
    assert_eq!(
        order, expected,
        "each aggregate's messages were claimed once each, in id order"
    );
    assert_eq!(
        count(&mut admin, TABLE, "status = 2").await,
        enqueued.len() as i64
    );
}

// ------------------------------------------------------------------------------------------
// 16. Rows a relay cannot decode
// ------------------------------------------------------------------------------------------

common::live_test!(an_undecodable_row_is_claimed_with_its_raw_text_and_can_be_marked_dead: "claim_undecodable" => undecodable_in);

async fn undecodable_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_undecodable";
    let (store, mut client) = outbox_in(db, TABLE).await;
    // Headers that are a JSON array pass the table's ISJSON check (enqueue refuses them,
    // but a hand-written insert does not go through enqueue).
    sql(
        &mut client,
        &format!(
            "insert into {TABLE} (topic, payload, headers) values \
             (N'orders', N'{{\"n\": 1}}', N'[1, 2]'), \
             (N'orders', N'{{\"n\": 2}}', null);"
        ),
    )
    .await;

    let claimed = store
        .claim(&mut client, 10, HELD)
        .await
        .expect("the claim does not fail for one bad row");
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    let Claimed::Undecodable(bad) = &claimed[0] else {
        panic!("the row with array headers decoded: {claimed:?}");
    };
    assert_eq!(bad.headers.as_deref(), Some("[1, 2]"));
    assert_eq!(bad.payload.as_deref(), Some("{\"n\": 1}"));
    assert_eq!(bad.topic.as_deref(), Some("orders"));
    assert!(bad.error.contains("headers"), "{}", bad.error);
    let Claimed::Message(good) = &claimed[1] else {
        panic!("the good row did not decode: {claimed:?}");
    };
    assert_eq!(good.payload, serde_json::json!({"n": 2}));
    assert_eq!(bad.claim_token, good.claim_token, "one claim, one token");

    // The token of the undecodable row fences its acknowledgement like any other.
    let dead = store
        .mark_failed(
            &mut client,
            Failed::dead(bad.id, bad.claim_token, &bad.error),
        )
        .await
        .expect("mark the undecodable row dead");
    assert_eq!(dead, 1);
    let state = row_state(&mut client, TABLE, bad.id).await;
    assert_eq!((state.status, state.attempts), (DEAD, 1), "{state:?}");
}

// ------------------------------------------------------------------------------------------
// 17. an enqueue that waits inside its insert is not overtaken (issue 19, item 16)
// ------------------------------------------------------------------------------------------

/// A message of aggregate `aggregate_id` with the message id `message_id`.
fn keyed_of(aggregate_id: &str, message_id: &str, n: usize) -> NewMessage {
    NewMessage {
        message_id: Some(message_id.to_owned()),
        ..message_of(aggregate_id, n)
    }
}

/// Starts `message`'s enqueue on `client` with [`enqueue_in_task`], then waits, asking on
/// `observer`, until that session waits for a lock like `wait_type` (`LCK_M_RI` for an
/// insert's range check, `LCK_M_X` for an exclusive applock); fails the test after
/// [`NOT_BLOCKED`].
async fn enqueue_waiting(
    store: &OutboxStore,
    observer: &mut Client,
    mut client: Client,
    message: NewMessage,
    wait_type: &str,
    what: &str,
) -> JoinHandle<(Enqueued, Client)> {
    let session = session_id(&mut client).await;
    let task = enqueue_in_task(store, client, message);
    await_lock_wait(observer, session, wait_type, NOT_BLOCKED, what).await;
    task
}

common::live_test!(enqueue_waiting_inside_its_insert_is_not_overtaken: "claim_insert_wait" => insert_wait_in);

/// A SERIALIZABLE reader's range lock on `message_id_unique` stops A's first enqueue inside
/// its insert: its id is taken and its clustered row written, but its index entries wait.
/// A's second enqueue (a message_id in another gap, so not stopped by that range lock) must
/// not get a later id and commit meanwhile, or the head probe, which does not see the first
/// row yet, would let the claim take A's second message first. Enqueue's aggregate lock
/// makes it wait for the first insert instead; another aggregate does not wait.
async fn insert_wait_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_insert_wait";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let mut reader = db.client().await;
    let first = db.client().await;
    let second = db.client().await;
    // A done message whose message_id 'm' is the key after 'k' in message_id_unique: the
    // reader's range lock on it covers 'k' and not 'y' or 'z'.
    let fence = enqueue_committed(&store, &mut client, &[keyed_of("other", "m", 0)]).await[0].id;
    set_column(&mut client, TABLE, "status", "2", &[fence]).await;

    let reader_session = session_id(&mut reader).await;
    sql(
        &mut reader,
        "set transaction isolation level serializable; begin transaction;",
    )
    .await;
    let found = scalar_i64(
        &mut reader,
        &format!(
            "select count_big(*) from {TABLE} with (index(message_id_unique)) \
             where message_id = N'k';"
        ),
    )
    .await;
    assert_eq!(found, 0);
    let range_locks = count_range_locks(&mut client, reader_session).await;
    assert!(
        range_locks > 0,
        "the SERIALIZABLE reader holds a key-range lock"
    );

    // A's enqueues start one after the other, each seen waiting on its lock.
    let mut waiting = Vec::new();
    for (connection, message, wait_type, what) in [
        (
            first,
            keyed_of("A", "k", 1),
            "LCK_M_RI",
            "A's first enqueue inside its insert, behind the reader's range lock",
        ),
        (
            second,
            keyed_of("A", "z", 2),
            "LCK_M_X",
            "A's second enqueue waits for A's aggregate lock",
        ),
    ] {
        let task = enqueue_waiting(&store, &mut client, connection, message, wait_type, what);
        waiting.push(task.await);
    }
    let [a1_task, a2_task]: [_; 2] = waiting.try_into().expect("two enqueues");
    assert!(!a2_task.is_finished(), "A's second enqueue waits");

    // Another aggregate neither waits nor is held back.
    let b1 = common::tasks::bounded(
        "B's enqueue next to A's waiting insert",
        NOT_BLOCKED,
        enqueue_committed(&store, &mut client, &[keyed_of("B", "y", 1)]),
    )
    .await[0]
        .id;
    let during = claim_unblocked(&store, &mut client, "claim while A's insert waits").await;
    assert_eq!(ids(&during), vec![b1], "nothing of A is claimable yet");

    // The reader ends: A's first insert finishes and commits, then the second.
    commit(&mut reader).await;
    let (a1, _) = join("A's first enqueue", a1_task).await;
    let (a2, _) = join("A's second enqueue", a2_task).await;
    assert!(a1.id < a2.id, "A's second message got the later id");
    let after = claim_unblocked(&store, &mut client, "claim after the reader ended").await;
    assert_ids(&after, &[a1.id], "A's first message comes first, alone");
    store
        .mark_done(&mut client, &[a1.id], token_of(&after))
        .await
        .unwrap();
    assert_eq!(
        ids(&claim_unblocked(&store, &mut client, "claim of A's second").await),
        vec![a2.id]
    );
}

// ------------------------------------------------------------------------------------------
// 18. a claim stores its own expiry; one from before claim_expires_at existed (issue 18, 5b)
//     (that each claim expires by its holder's timeout is the contract's,
//     tests/contract_mssql.rs)
// ------------------------------------------------------------------------------------------

common::live_test!(a_claim_from_before_claim_expires_at_expires_by_the_reclaimers_timeout: "claim_own_expiry" => own_expiry_in);

/// The claim stores claimed_at + its timeout; a row claimed before the column existed (null)
/// expires by the re-claiming relay's timeout.
async fn own_expiry_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_own_expiry";
    let (store, mut client) = outbox_in(db, TABLE).await;
    let enqueued = enqueue_committed(&store, &mut client, &[loose_message(1)]).await;
    let m1 = enqueued[0].id;

    let long = claim(&store, &mut client, 1, HELD).await;
    assert_eq!(ids(&long), vec![m1]);
    let expires_in = scalar_i64(
        &mut client,
        &format!(
            "select datediff_big(millisecond, claimed_at, claim_expires_at) from {TABLE} \
             where id = {m1};"
        ),
    )
    .await;
    assert_eq!(expires_in, 3_600_000, "the claim stores its own expiry");
    assert!(
        claim(&store, &mut client, 10, SHORT).await.is_empty(),
        "held for an hour"
    );

    sql(
        &mut client,
        &format!(
            "update {TABLE} set claim_expires_at = null, \
             claimed_at = dateadd(hour, -2, sysutcdatetime()) where id = {m1};"
        ),
    )
    .await;
    let taken = claim(&store, &mut client, 10, HELD).await;
    assert_ids(&taken, &[m1], "two hours old, past the re-claimer's hour");
    assert_eq!(taken[0].attempts, 1);
}

// ------------------------------------------------------------------------------------------
// 19. enqueue refuses session options the filtered index cannot be written under (issue 19, 11)
// ------------------------------------------------------------------------------------------

common::live_test!(enqueue_refuses_set_options_that_break_the_filtered_index: "claim_set_options" => set_options_in);

/// Each option that would make the insert fail with Msg 1934 is refused with 51309 before
/// anything is written; with the option restored, the same session enqueues.
async fn set_options_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_set_options";
    let (store, mut client) = outbox_in(db, TABLE).await;
    // The session as the driver leaves it passes: the premise of the check.
    enqueue_committed(&store, &mut client, &[loose_message(0)]).await;

    for (wrong, right) in [
        ("set ansi_warnings off;", "set ansi_warnings on;"),
        ("set ansi_padding off;", "set ansi_padding on;"),
        (
            "set concat_null_yields_null off;",
            "set concat_null_yields_null on;",
        ),
        ("set numeric_roundabort on;", "set numeric_roundabort off;"),
    ] {
        sql(&mut client, wrong).await;
        begin(&mut client).await;
        let message = server_error(
            store.enqueue(&mut client, &loose_message(1)).await,
            51309,
            wrong,
        );
        assert!(message.contains("1934"), "{wrong}: {message}");
        assert_eq!(
            scalar_i64(&mut client, "select @@trancount;").await,
            0,
            "{wrong}: the transaction was rolled back"
        );
        sql(&mut client, right).await;
    }
    assert_eq!(
        count(&mut client, TABLE, "1 = 1").await,
        1,
        "nothing refused was written"
    );
    enqueue_committed(&store, &mut client, &[loose_message(2)]).await;
    assert_eq!(count(&mut client, TABLE, "1 = 1").await, 2);
}

// ------------------------------------------------------------------------------------------
// 20. READPAST under optimized locking (issue 19, item 14)
// ------------------------------------------------------------------------------------------

/// Whether the test database runs with optimized locking. Azure SQL Database always does;
/// on SQL Server 2025 the test turns it on for its own database (it needs accelerated
/// database recovery first); older servers do not have it.
async fn optimized_locking(client: &mut Client, db: &TestDb) -> bool {
    let query =
        "select isnull(convert(int, databasepropertyex(db_name(), 'IsOptimizedLockingOn')), 0);";
    if scalar_i64(client, query).await == 1 {
        return true;
    }
    let major = scalar_i64(
        client,
        "select convert(int, serverproperty('ProductMajorVersion'));",
    )
    .await;
    if major >= 17 {
        let name = &db.name;
        let mut master = common::connect_to("master").await;
        for option in [
            "accelerated_database_recovery = on",
            "optimized_locking = on",
        ] {
            if let Err(error) = exec(
                &mut master,
                &format!("alter database [{name}] set {option} with rollback immediate;"),
            )
            .await
            {
                eprintln!("-- {name}: set {option}: {error}");
            }
        }
    }
    scalar_i64(client, query).await == 1
}

common::live_test!(readpast_skips_open_transactions_rows_under_optimized_locking: "claim_optimized_locking" => optimized_locking_in);

/// The claim's liveness rests on READPAST skipping rows an open transaction holds instead of
/// waiting for it. Under optimized locking a writer keeps no row locks, only its transaction
/// id (TID) lock, and a locking reader of such a row waits on that; whether READPAST then
/// skips the row or waits is what this shows. An open enqueue (an insert) and an open
/// acknowledgement (an update) next to a claim: the claim must return within
/// [`NOT_BLOCKED`] with the other aggregates and hold back only theirs. Where optimized
/// locking is not available it shows the same with classic row locks, and says so.
async fn optimized_locking_in(db: &TestDb) {
    const TABLE: &str = "dbo.outbox_optimized_locking";
    let store = outbox(TABLE);
    let mut client = db.client().await;
    let mut writer = db.client().await;
    let optimized = optimized_locking(&mut client, db).await;
    eprintln!(
        "-- {}: optimized locking {}",
        db.name,
        if optimized {
            "ON"
        } else {
            "not available: classic row locks"
        }
    );
    setup_outbox(&mut client, TABLE).await;
    let [a1, b1, c1] = enqueue_ids(
        &store,
        &mut client,
        [message_of("A", 1), message_of("B", 1), message_of("C", 1)],
    )
    .await;
    let first = claim_unblocked(&store, &mut client, "the first claim").await;
    assert_eq!(ids(&first), vec![a1, b1, c1]);
    let token = token_of(&first);
    store.mark_done(&mut client, &[c1], token).await.unwrap();

    // Open: an enqueue of D, and the acknowledgement of A; B is acknowledged and committed.
    let d1 = enqueue_open(&store, &mut writer, &message_of("D", 1)).await;
    store.mark_done(&mut writer, &[a1], token).await.unwrap();
    store.mark_done(&mut client, &[b1], token).await.unwrap();
    let [a2, b2, d2] = enqueue_ids(
        &store,
        &mut client,
        [message_of("A", 2), message_of("B", 2), message_of("D", 2)],
    )
    .await;

    let what = if optimized {
        "a claim next to open transactions under optimized locking (READPAST waited for the TID lock)"
    } else {
        "a claim next to open transactions"
    };
    let during = claim_unblocked(&store, &mut client, what).await;
    assert_ids(
        &during,
        &[b2],
        "READPAST skipped the open rows: A waits for its acknowledgement, D for its enqueue",
    );
    let after = claim_after("commit", &mut writer, &store, &mut client).await;
    assert_eq!(ids(&after), vec![a2, d1]);
    assert!(d1 < d2);
}
