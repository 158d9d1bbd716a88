//! Live tests of the plans of the claim and the acknowledgements (issue 29 item 2;
//! ARCHITECTURE.md, "The claim protocol"): next to an enqueue held open, a claim,
//! `mark_done`, `mark_failed` and `requeue` (with and without a token) of other aggregates
//! finish within a bound, on an outbox of 4 rows (where a scan is the optimizer's cheapest
//! plan) and of 1,000,000 rows, and every UPDATE they ran sought the outbox's clustered index
//! (the cached plans say so); an outbox whose indexes were changed by hand is refused by
//! `upgrade_outbox` (51016), skipped and reported by `upgrade_all_feeds` without rolling the
//! others back, and upgraded again once its owner follows the fix the problem names.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`) and are `#[ignore]`d: run them with
//! `cargo test --test live_claim_plans -- --ignored`.
//!
//! On the code before the fix (V77's claim, V31-V33's acknowledgements) the first two fail
//! wherever the optimizer picks a scan or a merge join for an update: the acting session has
//! a lock timeout, so a wait for the open enqueue surfaces as error 1222 (and the plan check
//! finds the scan); which plan it picks is the optimizer's costing, so that failure is
//! reasoned, not forced. The third fails there because neither upgrade_outbox nor
//! upgrade_all_feeds looked at indexes.

mod common;

use std::time::{Duration, Instant};

use changefeed::Client;
use changefeed::outbox::{ClaimToken, ClaimedMessage, Failed, NewMessage};
use changefeed::outbox_store::OutboxStore;
use common::claims::{decoded, enqueue_open};
use common::events::{exec_ok, required, rows_ok};
use common::tasks::bounded;
use common::{TestDb, exec, scalar_i64};
use serde_json::json;

/// How long any claim or acknowledgement next to the open enqueue may take. They need
/// milliseconds; this only has to cover a slow machine, and it is far below any claim
/// timeout a relay uses, which is what a stalled acknowledgement would run into.
const BOUND: Duration = Duration::from_secs(10);
/// The acting session's LOCK_TIMEOUT: a plan that waits for the open enqueue fails with
/// 1222 after this, which names the wait, instead of running into [`BOUND`].
const LOCK_TIMEOUT_MS: u32 = 3000;
/// Claims made here outlive the test.
const HELD: Duration = Duration::from_secs(3600);
/// Rows the large outbox holds in all: filler (done) rows plus the scenario's four.
const LARGE: i64 = 1_000_000;
/// The scenario's own rows: three committed messages and the open one.
const SCENARIO_ROWS: i64 = 4;

fn outbox(table: &str) -> OutboxStore {
    table
        .parse()
        .unwrap_or_else(|error| panic!("{table} is a valid outbox name: {error}"))
}

fn message_of(aggregate: &str) -> NewMessage {
    NewMessage::new("orders", json!({ "aggregate": aggregate })).aggregate("order", aggregate)
}

/// `rows` done messages of no aggregate, inserted straight into `table` (they are never
/// claimed, but every scan of the outbox reads them), in statements of 100,000 rows, each
/// its own transaction so that the log of a new database can be reused.
async fn fill_with_done_rows(client: &mut Client, table: &str, rows: i64) {
    let mut left = rows;
    while left > 0 {
        let batch = left.min(100_000);
        exec_ok(
            client,
            &format!(
                // The SET options a table with a filtered index needs (Msg 1934 otherwise).
                "set ansi_nulls, ansi_padding, ansi_warnings, arithabort, \
                 concat_null_yields_null, quoted_identifier on; set numeric_roundabort off; \
                 insert into {table} (topic, payload, status, processed_at) \
                 select top ({batch}) N'filler', N'{{}}', 2, sysutcdatetime() \
                 from sys.all_columns as a cross join sys.all_columns as b;"
            ),
        )
        .await;
        left -= batch;
    }
}

/// Runs `call` within [`BOUND`], naming `what` when it is stuck or fails; its value.
async fn prompt<T>(
    what: &str,
    call: impl std::future::Future<Output = changefeed::Result<T>>,
) -> T {
    let started = Instant::now();
    let result = bounded(what, BOUND, call).await;
    let took = started.elapsed();
    match result {
        Ok(value) => {
            eprintln!("{what}: {took:?}");
            value
        }
        Err(error) => panic!(
            "{what} failed after {took:?} next to an open enqueue of another aggregate: \
             {error} (1222 means it waited for that transaction's lock)"
        ),
    }
}

fn ids(batch: &[ClaimedMessage]) -> Vec<i64> {
    batch.iter().map(|m| m.id).collect()
}

fn token_of(batch: &[ClaimedMessage]) -> ClaimToken {
    batch.first().expect("a non-empty claim").claim_token
}

// ------------------------------------------------------------------------------------------
// Claims and acknowledgements next to an open enqueue, on a small and a large outbox
// ------------------------------------------------------------------------------------------

common::live_test!(claims_and_acknowledgements_never_wait_on_an_open_enqueue_in_a_4_row_outbox: "plans_small" => small_in);

async fn small_in(db: &TestDb) {
    never_wait_in(db, "dbo.plans_small", 0).await;
}

common::live_test!(claims_and_acknowledgements_never_wait_on_an_open_enqueue_in_a_million_row_outbox: "plans_large" => large_in);

async fn large_in(db: &TestDb) {
    never_wait_in(db, "dbo.plans_large", LARGE - SCENARIO_ROWS).await;
}

/// The scenario on `table` with `filler` done rows before it: aggregate A's first message is
/// enqueued in a transaction left open, and B, C, D committed; then every kind of call
/// touches B, C and D within [`BOUND`] under a lock timeout, and the cached plans of the
/// UPDATE statements seek the clustered index; A goes out once its writer commits.
async fn never_wait_in(db: &TestDb, table: &str, filler: i64) {
    let store = outbox(table);
    let mut relay = db.client().await;
    exec_ok(
        &mut relay,
        &format!("exec changefeed.setup_outbox @table_name = N'{table}';"),
    )
    .await;
    let started = Instant::now();
    fill_with_done_rows(&mut relay, table, filler).await;
    eprintln!("{filler} filler rows in {:?}", started.elapsed());

    let committed = common::enqueue_committed(
        &store,
        &mut relay,
        &[message_of("B"), message_of("C"), message_of("D")],
    )
    .await;
    let [b1, c1, d1] = [committed[0].id, committed[1].id, committed[2].id];
    let mut writer = db.client().await;
    let a1 = enqueue_open(&store, &mut writer, &message_of("A")).await;
    assert!(a1 > d1, "the open enqueue holds the newest row");
    assert_eq!(
        scalar_i64(
            &mut relay,
            &format!("select count_big(*) from {table} with (readuncommitted);")
        )
        .await,
        filler + SCENARIO_ROWS
    );

    exec_ok(&mut relay, &format!("set lock_timeout {LOCK_TIMEOUT_MS};")).await;

    // The claim: B, C and D, not A's uncommitted row.
    let first = decoded(prompt("claim", store.claim(&mut relay, 10, HELD)).await);
    assert_eq!(ids(&first), [b1, c1, d1]);
    let token = token_of(&first);

    // Each acknowledgement, fenced by the token.
    let done = prompt("mark_done", store.mark_done(&mut relay, &[b1], token)).await;
    assert_eq!(done, 1);
    let failed = prompt(
        "mark_failed",
        store.mark_failed(
            &mut relay,
            Failed::retry(c1, token, Duration::ZERO, "broker unavailable"),
        ),
    )
    .await;
    assert_eq!(failed, 1);
    let requeued = prompt(
        "requeue with a token",
        store.requeue(&mut relay, d1, Some(token), Duration::ZERO),
    )
    .await;
    assert_eq!(requeued, 1);
    // An operator's redrive of the failed message (no token).
    let redriven = prompt(
        "requeue without a token",
        store.requeue(&mut relay, c1, None, Duration::ZERO),
    )
    .await;
    assert_eq!(redriven, 1);

    // C and D are due again; a second claim takes them, mark_done of both at once.
    let second = decoded(prompt("second claim", store.claim(&mut relay, 10, HELD)).await);
    assert_eq!(ids(&second), [c1, d1]);
    let both = prompt(
        "mark_done of two",
        store.mark_done(&mut relay, &[c1, d1], token_of(&second)),
    )
    .await;
    assert_eq!(both, 2);
    let nothing =
        decoded(prompt("claim with nothing due", store.claim(&mut relay, 10, HELD)).await);
    assert!(nothing.is_empty(), "A is not committed yet: {nothing:?}");

    assert_updates_seek_the_clustered_index(&mut relay, table).await;

    // A goes out once its writer commits.
    exec_ok(&mut writer, "commit transaction;").await;
    let last = decoded(prompt("claim after the commit", store.claim(&mut relay, 10, HELD)).await);
    assert_eq!(ids(&last), [a1]);
    assert_eq!(
        prompt(
            "mark_done of A",
            store.mark_done(&mut relay, &[a1], token_of(&last))
        )
        .await,
        1
    );
}

/// Every operator that reads `table` (`dbo.<name>`) inside an UPDATE statement of the cached
/// plans of its claim, mark_done, mark_failed and requeue seeks its clustered index, and each
/// of the four has one: the plan is pinned, not merely cheap this time. A read is an
/// `IndexScan` (a seek when it has seek predicates) or a `TableScan` of the table, or a
/// `SimpleUpdate` (an update operator that finds its row itself, by a seek predicate).
async fn assert_updates_seek_the_clustered_index(client: &mut Client, table: &str) {
    let name = table.strip_prefix("dbo.").expect("a dbo table");
    let clustered = rows_ok(
        client,
        &format!(
            "select name from sys.indexes where object_id = object_id(N'{table}') and index_id = 1;"
        ),
    )
    .await;
    let clustered = required::<&str>(&clustered[0], "name").to_owned();
    let procedures = ["claim", "mark_done", "mark_failed", "requeue"]
        .iter()
        .map(|kind| format!("(N'{kind}', N'[changefeed].[{kind}:{table}]')"))
        .collect::<Vec<_>>()
        .join(", ");
    let found = rows_ok(
        client,
        &format!(
            "with xmlnamespaces (default 'http://schemas.microsoft.com/sqlserver/2004/07/showplan') \
             select k.kind, \
                 r.op.value('@PhysicalOp', 'nvarchar(60)') as physical_op, \
                 r.op.exist('IndexScan[SeekPredicates]/Object[@Index = \"[{clustered}]\"] \
                     | SimpleUpdate[SeekPredicate or SeekPredicateNew]\
                     /Object[@Index = \"[{clustered}]\"]') as seeks_clustered \
             from (values {procedures}) as k (kind, procedure_name) \
             inner join sys.dm_exec_procedure_stats as s \
                 on s.database_id = db_id() and s.object_id = object_id(k.procedure_name) \
             cross apply sys.dm_exec_query_plan(s.plan_handle) as p \
             cross apply p.query_plan.nodes('//StmtSimple[@StatementType = \"UPDATE\"]\
                 //RelOp[IndexScan/Object/@Table = \"[{name}]\" \
                 or TableScan/Object/@Table = \"[{name}]\" \
                 or SimpleUpdate/Object/@Table = \"[{name}]\"]') as r(op);"
        ),
    )
    .await;
    let reads: Vec<(String, String, bool)> = found
        .iter()
        .map(|row| {
            (
                required::<&str>(row, "kind").to_owned(),
                required::<&str>(row, "physical_op").to_owned(),
                required::<bool>(row, "seeks_clustered"),
            )
        })
        .collect();
    eprintln!("reads of {table} in the UPDATE statements: {reads:?}");
    for kind in ["claim", "mark_done", "mark_failed", "requeue"] {
        assert!(
            reads.iter().any(|(k, _, _)| k == kind),
            "the cached plan of [changefeed].[{kind}:{table}] reads {table} in an UPDATE: {reads:?}"
        );
    }
    for (kind, op, seeks) in &reads {
        assert!(
            *seeks,
            "{kind} reads {table} with {op}, not by a seek of its clustered index \
             [{clustered}]: a scan waits for any open transaction's row"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Indexes changed by hand: refused, skipped and reported, then repaired
// ------------------------------------------------------------------------------------------

common::live_test!(once_locking an_outbox_whose_indexes_were_changed_by_hand_is_reported_not_regenerated: "plans_indexes" => indexes_in);

/// One row of upgrade_all_feeds' report.
#[derive(Debug, PartialEq, Eq)]
struct Reported {
    name: String,
    upgraded: bool,
    problem: Option<String>,
}

async fn upgrade_all(client: &mut Client) -> Vec<Reported> {
    rows_ok(client, "exec changefeed.upgrade_all_feeds;")
        .await
        .iter()
        .filter(|row| required::<&str>(row, "kind") == "outbox")
        .map(|row| Reported {
            name: required::<&str>(row, "name").to_owned(),
            upgraded: required(row, "upgraded"),
            problem: row.get::<&str, _>("problem").map(str::to_owned),
        })
        .collect()
}

fn problem_of<'a>(report: &'a [Reported], table: &str) -> &'a str {
    let row = report
        .iter()
        .find(|r| r.name == table)
        .unwrap_or_else(|| panic!("{table} is in the report: {report:?}"));
    assert!(!row.upgraded, "{table} was skipped: {row:?}");
    row.problem
        .as_deref()
        .unwrap_or_else(|| panic!("{table} has a problem: {row:?}"))
}

/// The server error of `exec changefeed.upgrade_outbox` for `table`: its number and message.
async fn upgrade_outbox_error(client: &mut Client, table: &str) -> (u32, String) {
    common::exec_failure(
        client,
        &format!("exec changefeed.upgrade_outbox @table_name = N'{table}';"),
    )
    .await
}

async fn indexes_in(db: &TestDb) {
    let mut admin = db.client().await;
    for table in ["fine", "renamed", "heap", "reshaped"] {
        exec_ok(
            &mut admin,
            &format!("exec changefeed.setup_outbox @table_name = N'dbo.idx_{table}';"),
        )
        .await;
    }
    // By hand: head_of_aggregate renamed; the clustered primary key dropped (a heap);
    // head_of_aggregate re-created without id in its key.
    exec_ok(
        &mut admin,
        "exec sp_rename N'dbo.idx_renamed.head_of_aggregate', N'by_aggregate', N'INDEX'; \
         alter table dbo.idx_heap drop constraint [idx_heap:pk]; \
         drop index head_of_aggregate on dbo.idx_reshaped; \
         create index head_of_aggregate on dbo.idx_reshaped (aggregate_id) include (status) \
             with (allow_page_locks = off);",
    )
    .await;

    // Their generated code cannot run any more: that is why the upgrade must not regenerate
    // it silently. (308: an index named in a hint does not exist; the heap has no index 1.)
    for table in ["renamed", "heap"] {
        let store = outbox(&format!("dbo.idx_{table}"));
        let error = store
            .claim(&mut admin, 10, HELD)
            .await
            .expect_err("a claim whose hinted index is gone");
        eprintln!("claim of dbo.idx_{table}: {error}");
        assert!(error.server_number().is_some(), "a server error: {error}");
    }

    // The upgrade of everything commits: the fine outbox is upgraded, the others skipped
    // with a problem that names the index and the statement that fixes it.
    let before = scalar_i64(&mut admin, "select count_big(*) from changefeed.outboxes where generator_version = changefeed.generator_version();").await;
    assert_eq!(before, 4);
    let report = upgrade_all(&mut admin).await;
    assert!(
        report
            .iter()
            .any(|r| r.name == "dbo.idx_fine" && r.upgraded && r.problem.is_none()),
        "{report:?}"
    );
    let renamed = problem_of(&report, "dbo.idx_renamed");
    assert!(
        renamed.contains("head_of_aggregate")
            && renamed.contains("dropped or renamed")
            && renamed.contains("exec changefeed.setup_outbox @table_name = N'dbo.idx_renamed';"),
        "{renamed}"
    );
    let heap = problem_of(&report, "dbo.idx_heap");
    assert!(
        heap.contains("no unique clustered index on (id)")
            && heap.contains("exec changefeed.setup_outbox @table_name = N'dbo.idx_heap';"),
        "{heap}"
    );
    let reshaped = problem_of(&report, "dbo.idx_reshaped");
    assert!(
        reshaped.contains("(aggregate_id, id)")
            && reshaped.contains("drop index head_of_aggregate on [dbo].[idx_reshaped]"),
        "{reshaped}"
    );
    assert_eq!(
        scalar_i64(
            &mut admin,
            "select count_big(*) from changefeed.outboxes where problem is not null;"
        )
        .await,
        3,
        "the registry keeps the three problems"
    );

    // Asked for directly, upgrade_outbox refuses each with 51016 and the same text, before
    // regenerating anything, and leaves no transaction open.
    for (table, problem) in [
        ("dbo.idx_renamed", renamed),
        ("dbo.idx_heap", heap),
        ("dbo.idx_reshaped", reshaped),
    ] {
        let (number, message) = upgrade_outbox_error(&mut admin, table).await;
        assert_eq!(number, 51016, "{message}");
        assert!(message.contains(problem), "{message}");
    }
    assert_eq!(
        scalar_i64(&mut admin, "select convert(bigint, @@trancount);").await,
        0
    );
    // A table made with a heap is refused by setup_outbox the same way; nothing registered.
    let (number, _) = common::exec_failure(
        &mut admin,
        "create table dbo.idx_new (id bigint identity (1, 1) not null primary key nonclustered, \
             message_id nvarchar(64) not null default (convert(nvarchar(64), newid())), \
             topic nvarchar(256) not null, aggregate_type nvarchar(128) null, \
             aggregate_id nvarchar(256) null, partition_key nvarchar(256) null, \
             payload nvarchar(max) not null, headers nvarchar(max) null, \
             trace_id nvarchar(128) null, status tinyint not null default 0, \
             attempts int not null default 0, claimed_at datetime2(3) null, \
             claim_token uniqueidentifier null, next_retry_at datetime2(3) null, \
             created_at datetime2(3) not null default sysutcdatetime(), \
             processed_at datetime2(3) null, last_error nvarchar(2000) null); \
         exec changefeed.setup_outbox @table_name = N'dbo.idx_new';",
    )
    .await;
    assert_eq!(number, 51016);
    assert_eq!(
        scalar_i64(
            &mut admin,
            "select count_big(*) from changefeed.outboxes where table_name = N'idx_new';"
        )
        .await,
        0
    );

    // The owner follows each fix; the next upgrade regenerates all four.
    exec_ok(
        &mut admin,
        "exec sp_rename N'dbo.idx_renamed.by_aggregate', N'head_of_aggregate', N'INDEX'; \
         alter table dbo.idx_heap add constraint [idx_heap:pk] primary key clustered (id) \
             with (allow_page_locks = off); \
         drop index head_of_aggregate on dbo.idx_reshaped; \
         exec changefeed.setup_outbox @table_name = N'dbo.idx_reshaped'; \
         exec changefeed.setup_outbox @table_name = N'dbo.idx_heap';",
    )
    .await;
    let report = upgrade_all(&mut admin).await;
    assert!(
        report.iter().all(|r| r.upgraded && r.problem.is_none()),
        "{report:?}"
    );
    assert_eq!(
        scalar_i64(
            &mut admin,
            "select count_big(*) from changefeed.outboxes where problem is not null;"
        )
        .await,
        0
    );
    for table in ["renamed", "heap", "reshaped"] {
        let store = outbox(&format!("dbo.idx_{table}"));
        let ids = common::enqueue_committed(&store, &mut admin, &[message_of(table)]).await;
        let claimed = decoded(store.claim(&mut admin, 10, HELD).await.expect("a claim"));
        assert_eq!(
            claimed.iter().map(|m| m.id).collect::<Vec<_>>(),
            [ids[0].id],
            "dbo.idx_{table} works again"
        );
    }
    let _ = exec(&mut admin, "drop table dbo.idx_new;").await;
}
