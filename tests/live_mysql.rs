//! Live tests of what only the MariaDB store has (feature `mysql`): the bundle in `mysql/`,
//! `enqueue`'s own checks, `MysqlOutboxStore`'s plan, redrive and faults, the relay over it,
//! and the `BinlogWaker`. The claim-outbox contract every store passes (claims, head of
//! aggregate, fencing, reaper, retries, purge, payloads, a killed relay) runs on MariaDB in
//! `contract_mysql.rs`, from `tests/claim_contract/`.
//!
//! They need a MariaDB (or MySQL 8.0+) server and are `#[ignore]`d, so that `cargo test
//! --all-features` passes on a machine without one. `.ci/run` installs mariadb-server and
//! runs them: `cargo test --features mysql,cli --test live_mysql -- --ignored` (`cli` adds
//! the test of `changefeed relay`). The harness
//! (tests/common_mysql) starts one private `mariadbd` for this test binary, or uses
//! `CHANGEFEED_TEST_MYSQL`; every test has a database of its own, and every concurrent
//! claimer a connection of its own.
//!
//! Where a test waits, it asserts only what must hold however slow the machine is.

mod claim_contract;
mod common_mysql;
#[cfg(feature = "cli")]
mod common_process;
mod common_server;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::Error;
use changefeed::mysql::{
    BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, OutboxTable, WakerState, enqueue,
};
use changefeed::outbox::{ClaimStore, Claimed, Enqueued, Failed, NewMessage, UndecodableMessage};
use changefeed::relay::{Relay, RelayConfig};
use claim_contract::wake::{self, Kinds, WokenRelay};
use claim_contract::{DEAD, HELD, Recorder, claim, ids, message_of, token_of};
use common_mysql::{TestDb, database};
use mysql_async::prelude::Queryable;
use serde_json::json;
use tokio::task::JoinHandle;

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

fn table(name: &str) -> OutboxTable {
    name.parse().expect("a valid outbox name")
}

/// One row as stored.
#[derive(Debug)]
struct RowState {
    status: i64,
    attempts: i64,
    last_error: Option<String>,
}

async fn row_state(db: &TestDb, outbox: &str, id: i64) -> RowState {
    let query = format!("select status, attempts, last_error from `{outbox}` where id = {id}");
    let row: (i64, i64, Option<String>) = db
        .conn()
        .await
        .query_first(&query)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .unwrap_or_else(|| panic!("{outbox} has no row {id}"));
    RowState {
        status: row.0,
        attempts: row.1,
        last_error: row.2,
    }
}

#[track_caller]
fn mysql_code<T: std::fmt::Debug>(result: changefeed::Result<T>, code: u32) -> String {
    match result {
        Err(error) => {
            assert_eq!(error.server_number(), Some(code), "{error}");
            error.to_string()
        }
        Ok(value) => panic!("expected error {code}, got {value:?}"),
    }
}

#[track_caller]
fn config_error<T: std::fmt::Debug>(result: changefeed::Result<T>, needle: &str) {
    match result {
        Err(Error::Config(message)) => assert!(message.contains(needle), "{message}"),
        other => panic!("expected a configuration error about {needle}, got {other:?}"),
    }
}

/// The undecodable row `row` is, handed over with its `message_id` "odd" and an error that
/// names `column`.
#[track_caller]
fn undecodable<'a>(row: &'a Claimed, column: &str) -> &'a UndecodableMessage {
    match row {
        Claimed::Undecodable(odd) => {
            assert_eq!(odd.message_id.as_deref(), Some("odd"));
            assert!(odd.error.contains(column), "{}", odd.error);
            odd
        }
        other => panic!("{other:?}"),
    }
}

/// How many messages one pass of a relay (default settings: a batch of 100) over `store`
/// published.
async fn published_in_one_pass(store: MysqlOutboxStore) -> usize {
    let recorder = Arc::new(Recorder::default());
    let mut relay = Relay::new(store, recorder, RelayConfig::default()).unwrap();
    relay.run_once().await.unwrap().published
}

// ------------------------------------------------------------------------------------------
// 1. the bundle and setup_outbox
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn setup_outbox_checks_names_completes_tables_and_never_drops_data() {
    let db = database("setup").await;
    // migrate is idempotent.
    let again = changefeed::mysql::migrate(&db.pool).await.unwrap();
    assert!(again.applied_migrations().is_empty());

    let mut conn = db.conn().await;
    for bad in ["bad-name", "9x", "changefeed_x", "a`b", ""] {
        let message = mysql_code(
            conn.exec_drop("call changefeed_setup_outbox(?)", (bad,))
                .await
                .map_err(Error::from),
            51000,
        );
        assert!(
            message.contains("not a usable outbox table name"),
            "{message}"
        );
    }
    let store = db.outbox("outbox_setup").await;
    assert_eq!(store.table().name(), "outbox_setup");

    // A partial install: an index dropped by hand comes back; the rows stay.
    db.enqueue_committed("outbox_setup", &[message_of("s-1", 1)])
        .await;
    db.sql("alter table outbox_setup drop index open_messages")
        .await;
    db.outbox("outbox_setup").await;
    assert_eq!(
        db.scalar(
            "select count(*) from information_schema.statistics where table_schema = database() \
             and table_name = 'outbox_setup' and index_name = 'open_messages'"
        )
        .await,
        2,
        "open_messages (is_open, id) is back"
    );
    assert_eq!(db.count("outbox_setup", "1 = 1").await, 1);

    // A hand-made table without trace_id: 51306 naming it; nothing dropped.
    db.sql(
        "create table handmade (id bigint auto_increment primary key, message_id varchar(64), \
         topic varchar(256)); insert into handmade (message_id, topic) values ('k', 't')",
    )
    .await;
    let message = mysql_code(
        conn.exec_drop("call changefeed_setup_outbox(?)", ("handmade",))
            .await
            .map_err(Error::from),
        51306,
    );
    assert!(message.contains("trace_id"), "{message}");
    assert_eq!(db.count("handmade", "1 = 1").await, 1);

    // The Rust name rule is the bundle's.
    assert!("changefeed_x".parse::<OutboxTable>().is_err());
}

/// The claim's scan (the statement `claim.rs` writes, copied) reads its order off
/// `open_messages` without a filesort, and its head probe reads one entry of
/// `head_of_aggregate` a row: the first open id of the aggregate. (`NOT EXISTS (… e.id <
/// t.id)` read all of a head's aggregate: 1.9 entries a row here, 10 for each head.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_claim_reads_its_order_off_the_index_and_one_entry_a_head_probe() {
    let db = database("explain").await;
    db.outbox("outbox_explain").await;
    let messages: Vec<NewMessage> = (0..50)
        .map(|i| message_of(&format!("e-{}", i % 5), i))
        .collect();
    db.enqueue_committed("outbox_explain", &messages).await;
    db.sql("analyze table outbox_explain").await;
    // ANALYZE runs the statement (in autocommit: its locks end with it) and reports the
    // rows each table read, on average a loop.
    let plan: Vec<(Option<String>, Option<String>, Option<f64>)> = db
        .conn()
        .await
        .query_map(
            "analyze select t.id from outbox_explain as t force index (open_messages) \
             where t.is_open = 1 and t.status = 0 and coalesce((select e.id from \
             outbox_explain as e force index (head_of_aggregate) where e.aggregate_id = \
             t.aggregate_id and e.is_open = 1 order by e.id limit 1), t.id) >= t.id \
             order by t.id limit 10 for update skip locked",
            |row: mysql_async::Row| (row.get("key"), row.get("Extra"), row.get("r_rows")),
        )
        .await
        .unwrap();
    let text = format!("{plan:?}");
    assert!(!text.contains("filesort"), "{text}");
    assert_eq!(plan[0].0.as_deref(), Some("open_messages"), "{text}");
    assert_eq!(plan[1].0.as_deref(), Some("head_of_aggregate"), "{text}");
    assert!(plan[1].2.is_some_and(|rows| rows <= 1.0), "{text}");
}

// ------------------------------------------------------------------------------------------
// 2. enqueue refuses bad messages before the insert (the transactional and idempotent
//    enqueue is the contract's, tests/contract_mysql.rs)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn enqueue_refuses_bad_messages_before_the_insert_and_makes_uuid_message_ids() {
    let db = database("enqueue").await;
    db.outbox("outbox_enqueue").await;
    let t = table("outbox_enqueue");
    // The message id is made on the client: a UUID.
    let made = db
        .enqueue_committed("outbox_enqueue", &[message_of("order-44", 1)])
        .await;
    assert_eq!(made[0].message_id.len(), 36, "{made:?}");
    let mut tx = db.transaction().await;
    config_error(
        enqueue(&mut tx, &t, &NewMessage::new("", json!({}))).await,
        "topic",
    );
    config_error(
        enqueue(&mut tx, &t, &NewMessage::new("x".repeat(257), json!({}))).await,
        "topic has 257",
    );
    config_error(
        enqueue(&mut tx, &t, &NewMessage::new("t", json!(42))).await,
        "object or array",
    );
    tx.rollback().await.unwrap();
    assert_eq!(db.count("outbox_enqueue", "1 = 1").await, 1);
}

// ------------------------------------------------------------------------------------------
// 3. liveness under an open transaction: a plain INSERT behind an open enqueue (the
//    contract's an_open_enqueue_delays_only_its_aggregate covers enqueue itself)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn an_open_enqueue_of_one_aggregate_does_not_stop_claims_of_another() {
    let db = database("liveness").await;
    let mut store = db.outbox("outbox_live").await;
    // Aggregates whose index entries sit on both sides of the open one ("m"), so that a
    // probe of "l" or "n" that read one entry too far would meet its lock.
    db.enqueue_committed("outbox_live", &[message_of("l", 0)])
        .await;

    let (tx, uncommitted) = db.enqueue_open("outbox_live", &message_of("m", 1)).await;

    let later = db
        .enqueue_committed("outbox_live", &[message_of("n", 2), message_of("l", 3)])
        .await;
    let started = Instant::now();
    let claimed = claim(&mut store, 10, HELD).await;
    let took = started.elapsed();
    let claimed_ids = ids(&claimed);
    assert!(claimed_ids.contains(&later[0].id), "{claimed:?}");
    assert!(
        !claimed_ids.contains(&uncommitted.id),
        "an uncommitted row is never claimed"
    );
    assert!(!claimed_ids.contains(&later[1].id), "l3 waits for l0");
    assert!(
        took < Duration::from_secs(5),
        "the claim did not wait for the open transaction ({took:?})"
    );

    // A second enqueue of aggregate m waits for m1's transaction, before its row gets an id:
    // within an aggregate, ids follow commit order.
    let second_writer = spawn_enqueue(&db, "outbox_live", message_of("m", 4));
    // A writer that does not go through enqueue (a plain INSERT) is not held back: its row
    // m5 commits behind the uncommitted m1, and the claim's NOWAIT probe must keep it back.
    db.sql(
        "insert into outbox_live (message_id, topic, aggregate_id, payload, created_at) \
         values ('m5', 'orders', 'm', '{}', utc_timestamp(3))",
    )
    .await;
    let m5: i64 = db
        .scalar("select id from outbox_live where message_id = 'm5'")
        .await;
    let again = claim(&mut store, 10, HELD).await;
    assert!(
        !ids(&again).contains(&m5),
        "m5 overtook the uncommitted m1: {again:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second_writer.is_finished(),
        "m4's enqueue did not wait for m1's transaction"
    );
    tx.commit().await.unwrap();
    let m4 = second_writer.await.unwrap();
    assert!(
        m4.id > uncommitted.id && m4.id > m5,
        "m4 got its id after m1 committed"
    );
    let after = claim(&mut store, 10, HELD).await;
    assert!(ids(&after).contains(&uncommitted.id), "{after:?}");
    assert!(
        !ids(&after).contains(&m4.id) && !ids(&after).contains(&m5),
        "m4 and m5 wait for m1 to be done"
    );
}

// ------------------------------------------------------------------------------------------
// 5. redrive and the arguments refused before any SQL (reaper, fencing, retry, requeue,
//    dead and purge are the contract's)
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn redrive_brings_back_dead_messages_and_bad_arguments_are_refused_before_any_sql() {
    let db = database("retry").await;
    let mut store = db.outbox("outbox_retry").await;
    let e = db
        .enqueue_committed("outbox_retry", &[NewMessage::new("t", json!({"n": 1}))])
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    let token = token_of(&batch);
    assert_eq!(
        store.redrive(e[0].id, Duration::ZERO).await.unwrap(),
        0,
        "processing is not redriven"
    );
    store
        .mark_failed(Failed::dead(e[0].id, token, "poison"))
        .await
        .unwrap();
    assert_eq!(row_state(&db, "outbox_retry", e[0].id).await.status, DEAD);
    // An operator's redrive brings it back, attempts kept.
    assert_eq!(store.redrive(e[0].id, Duration::ZERO).await.unwrap(), 1);
    let redriven = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&redriven), vec![e[0].id]);
    assert_eq!(redriven[0].attempts, 1);
    assert_eq!(
        store.redrive(e[0].id, Duration::ZERO).await.unwrap(),
        0,
        "processing"
    );
    // Bad arguments are refused before any SQL, naming what is wrong.
    config_error(
        store
            .mark_failed(Failed {
                id: e[0].id,
                token,
                retry_after: None,
                dead: false,
                error: "x",
            })
            .await,
        "retry_after",
    );
    config_error(store.claim(0, HELD).await, "batch_size");
    config_error(store.claim(1, Duration::ZERO).await, "claim_timeout");
    config_error(
        store.purge_done(Duration::ZERO, 4001, None).await,
        "batch_size",
    );
    config_error(
        store.purge_done(Duration::ZERO, 1, Some(0)).await,
        "max_rows",
    );
}

// ------------------------------------------------------------------------------------------
// 6. undecodable rows
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn an_undecodable_row_is_handed_over_and_the_relay_marks_it_dead() {
    let db = database("undecodable").await;
    let mut store = db.outbox("outbox_odd").await;
    let e = db
        .enqueue_committed("outbox_odd", &[NewMessage::new("t", json!({"ok": 1}))])
        .await;
    // Valid JSON (the column's check passes) but not a headers object.
    db.sql(
        "insert into outbox_odd (message_id, topic, payload, headers, created_at) \
         values ('odd', 't', '{}', '[1, 2]', utc_timestamp(3))",
    )
    .await;
    let rows = store.claim(10, HELD).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(matches!(&rows[0], Claimed::Message(m) if m.id == e[0].id));
    let odd = undecodable(&rows[1], "headers");
    assert_eq!(odd.headers.as_deref(), Some("[1, 2]"));
    // A relay dead-letters such a row and publishes the rest.
    db.sql("update outbox_odd set status = 0, claim_token = null")
        .await;
    assert_eq!(published_in_one_pass(db.store("outbox_odd")).await, 1);
    assert_eq!(
        db.count("outbox_odd", "status = 4 and message_id = 'odd'")
            .await,
        1
    );
    assert_eq!(db.count("outbox_odd", "status = 2").await, 1);
}

// ------------------------------------------------------------------------------------------
// 7. the relay on MariaDB: binlog wake, polling fallback (a relay killed mid-batch is the
//    contract's)
// ------------------------------------------------------------------------------------------

/// A relay over `outbox` woken by a binlog waker with `waker_config`, the waker following
/// the binlog.
async fn relay_with_waker(
    db: &TestDb,
    outbox: &str,
    waker_config: BinlogWakerConfig,
) -> WokenRelay<WakerState> {
    let kinds = Kinds {
        awake: |s| matches!(s, WakerState::Following { .. }),
        polling: |s| matches!(s, WakerState::Polling { .. }),
    };
    WokenRelay::start_awake(db.store(outbox), kinds, |handle, stop| {
        let waker = BinlogWaker::new(db.opts.clone(), table(outbox), handle, waker_config);
        let state = waker.state();
        tokio::spawn(waker.run(wake::stopped(stop)));
        state
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_binlog_wakes_the_relay_within_milliseconds_of_a_commit() {
    let db = database("binlog_wake").await;
    db.outbox("outbox_wake").await;
    let relay = relay_with_waker(&db, "outbox_wake", BinlogWakerConfig::default()).await;
    let commit = async |n: usize| {
        let message = message_of(&format!("w-{n}"), n);
        db.enqueue_committed("outbox_wake", &[message]).await[0].id
    };
    let cut = async || db.kill_binlog_dumps().await;
    wake::commits_wake_the_relay_within_milliseconds(&relay, "binlog", commit, cut).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn polling_takes_over_when_the_binlog_stream_is_cut_and_following_resumes() {
    let db = database("binlog_cut").await;
    db.outbox("outbox_cut").await;
    let config = BinlogWakerConfig {
        fallback_poll: Duration::from_millis(200),
        reconnect_delay: Duration::from_secs(3),
        ..BinlogWakerConfig::default()
    };
    let relay = relay_with_waker(&db, "outbox_cut", config).await;
    let before = relay.state.borrow().clone();
    assert!(
        db.kill_binlog_dumps().await >= 1,
        "the waker's dump thread is there"
    );
    relay.until_polling(Duration::from_secs(10)).await;
    // While it polls, a commit is still published, by the 200 ms fallback poll.
    let e = db
        .enqueue_committed("outbox_cut", &[message_of("c", 1)])
        .await;
    let took = relay.published_after(e[0].id, Instant::now()).await;
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // Then it follows again, from where it was (not from the server's current end).
    let after = relay.until_awake(Duration::from_secs(30)).await;
    let (
        WakerState::Following {
            file: f0,
            position: p0,
        },
        WakerState::Following {
            file: f1,
            position: p1,
        },
    ) = (before, after)
    else {
        panic!("states")
    };
    assert!(
        f1 > f0 || (f1 == f0 && p1 >= p0),
        "resumed at {f1}:{p1}, was at {f0}:{p0}"
    );
    let e2 = db
        .enqueue_committed("outbox_cut", &[message_of("c", 2)])
        .await;
    let took = relay.published_after(e2[0].id, Instant::now()).await;
    // Still following (a resume at a wrong position would have fallen back to polling),
    // and the relay polls every 60 s: the binlog delivered it.
    assert!(relay.awake(), "{:?}", *relay.state.borrow());
    assert!(took < Duration::from_secs(1), "took {took:?}");
    relay.stop().await;
}

// ------------------------------------------------------------------------------------------
// 8. the command line: `changefeed relay` with a mysql:// URL
// ------------------------------------------------------------------------------------------

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_cli_relays_a_mariadb_outbox_to_stdout_as_json_lines() {
    use claim_contract::cli::{cli_message, relays_a_message_as_a_json_line};

    let db = database("cli_relay").await;
    db.outbox("outbox_cli").await;
    let e = db.enqueue_committed("outbox_cli", &[cli_message()]).await;
    let done = async || db.count("outbox_cli", "status = 2").await;
    relays_a_message_as_a_json_line(&db.url, "outbox_cli", &[], &e[0], done).await;
}

/// `setup-outbox`, `purge-outbox` and `status` with a mysql:// URL: the table is made by
/// the bundle's procedure, a done message older than the cutoff goes and a newer one stays,
/// `status` lists the outbox, and a name the store refuses, a table that is not there and
/// a feed command are each one line naming what to do.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_cli_sets_up_lists_and_purges_a_mariadb_outbox() {
    use common_process::{assert_one_error_line, changefeed};

    let db = database("cli_admin").await;
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &db.url]);
        changefeed(&all)
    };
    // The database has the bundle: migrate applies nothing and says so.
    let migrated = cli(&["migrate"]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert_eq!(
        String::from_utf8_lossy(&migrated.stdout),
        format!(
            "applied 0 MariaDB/MySQL changefeed migrations ({} in the bundle; the database is \
             up to date)\n",
            changefeed::mysql::bundle().len()
        )
    );
    let made = cli(&["setup-outbox", "outbox_admin"]);
    assert!(made.status.success(), "{made:?}");
    assert_eq!(
        String::from_utf8_lossy(&made.stdout),
        "outbox outbox_admin is ready\n"
    );
    // Again: it completes an existing table and never drops data.
    let e = db
        .enqueue_committed("outbox_admin", &[message_of("a", 1), message_of("b", 1)])
        .await;
    assert!(cli(&["setup-outbox", "outbox_admin"]).status.success());
    assert_eq!(db.count("outbox_admin", "1 = 1").await, 2);

    // One message done ten days ago, one done now.
    db.sql(&format!(
        "update outbox_admin set status = 2, processed_at = utc_timestamp(3) - interval 10 day \
         where id = {}",
        e[0].id
    ))
    .await;
    db.sql(&format!(
        "update outbox_admin set status = 2, processed_at = utc_timestamp(3) where id = {}",
        e[1].id
    ))
    .await;
    let purged = cli(&["purge-outbox", "outbox_admin", "--older-than", "7d"]);
    assert!(purged.status.success(), "{purged:?}");
    assert_eq!(
        String::from_utf8_lossy(&purged.stdout),
        "deleted 1 done message older than 7d from outbox_admin\n"
    );
    assert_eq!(db.count("outbox_admin", "1 = 1").await, 1);
    assert_eq!(
        db.count("outbox_admin", &format!("id = {}", e[1].id)).await,
        1
    );

    let status = cli(&["status", "--json"]);
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["outboxes"][0]["outbox"], "outbox_admin", "{status}");

    let bad = cli(&["setup-outbox", "dbo.outbox"]);
    let line = assert_one_error_line(&bad);
    assert_eq!(bad.status.code(), Some(2), "{line}");
    assert!(line.contains("MariaDB/MySQL"), "{line}");
    let missing = cli(&["purge-outbox", "nothing_here", "--older-than", "7d"]);
    let line = assert_one_error_line(&missing);
    assert_eq!(missing.status.code(), Some(1), "{line}");
    assert!(
        line.contains("changefeed setup-outbox nothing_here"),
        "{line}"
    );
    let feed = cli(&["tail", "app.Event"]);
    let line = assert_one_error_line(&feed);
    assert_eq!(feed.status.code(), Some(2), "{line}");
    assert!(
        line.contains("tail does not work on MariaDB/MySQL"),
        "{line}"
    );
}

// ------------------------------------------------------------------------------------------
// 8. order, fill and isolation under the faults found live (issue 18)
// ------------------------------------------------------------------------------------------

/// Enqueues `message` into `outbox` on a connection and transaction of its own, committed
/// as soon as the enqueue returns (which may be after a lock wait).
fn spawn_enqueue(db: &TestDb, outbox: &str, message: NewMessage) -> JoinHandle<Enqueued> {
    let (url, t) = (db.url.clone(), table(outbox));
    tokio::spawn(async move {
        let opts = changefeed::mysql::opts(&url).expect("a valid URL");
        let mut conn = mysql_async::Conn::new(opts).await.expect("connect");
        let mut tx = conn.start_transaction(Default::default()).await.unwrap();
        let enqueued = enqueue(&mut tx, &t, &message).await.unwrap();
        tx.commit().await.unwrap();
        enqueued
    })
}

fn keyed(key: &str, message: NewMessage) -> NewMessage {
    NewMessage {
        message_id: Some(key.to_owned()),
        ..message
    }
}

/// Sleeps long enough for a spawned statement to reach the server and start waiting.
async fn let_it_reach_the_server() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

/// The issue's first reproduction: A#1's insert waits on the unique key of a message_id
/// another transaction holds. Before the fix its id was allocated already, A#2 committed
/// behind it with a higher id and, A#1 not being in the claim's index yet, was claimed
/// first. Now A#1 holds aggregate a's lock from before its id exists, so A#2 waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn an_enqueue_waiting_on_a_held_message_id_keeps_its_aggregate_in_order() {
    let db = database("order_key").await;
    let mut store = db.outbox("outbox_order_key").await;
    let (holder, _) = db
        .enqueue_open("outbox_order_key", &keyed("k", message_of("other", 0)))
        .await;

    let a1 = spawn_enqueue(&db, "outbox_order_key", keyed("k", message_of("a", 1)));
    let_it_reach_the_server().await;
    let a2 = spawn_enqueue(&db, "outbox_order_key", keyed("z-2", message_of("a", 2)));
    let_it_reach_the_server().await;
    let early = claim(&mut store, 10, HELD).await;
    assert!(early.is_empty(), "a#2 overtook a#1: {early:?}");
    assert!(
        !a2.is_finished(),
        "a#2's enqueue did not wait for a#1's transaction"
    );

    holder.rollback().await.unwrap();
    let (a1, a2) = (a1.await.unwrap(), a2.await.unwrap());
    assert!(a1.id < a2.id, "{a1:?} {a2:?}");
    let first = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&first), vec![a1.id]);
    store.mark_done(&[a1.id], token_of(&first)).await.unwrap();
    assert_eq!(ids(&claim(&mut store, 10, HELD).await), vec![a2.id]);
}

/// The issue's second reproduction: an idempotent retry of key "m" under REPEATABLE READ
/// (the application's default) leaves a next-key lock on "m" and the gap before it; A#1 with
/// key "l" falls into that gap and waits. A#2 (key "n", outside it) must not pass A#1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn an_enqueue_waiting_on_a_next_key_lock_keeps_its_aggregate_in_order() {
    let db = database("order_gap").await;
    let mut store = db.outbox("outbox_order_gap").await;
    let t = table("outbox_order_gap");
    let other = db
        .enqueue_committed("outbox_order_gap", &[keyed("m", message_of("other", 0))])
        .await;
    let mut retry_conn = db.conn().await;
    retry_conn
        .query_drop("set session transaction isolation level repeatable read")
        .await
        .unwrap();
    let mut retry = retry_conn
        .start_transaction(Default::default())
        .await
        .unwrap();
    let again = enqueue(&mut retry, &t, &keyed("m", message_of("other", 0)))
        .await
        .unwrap();
    assert_eq!(again, other[0], "an idempotent retry");

    let a1 = spawn_enqueue(&db, "outbox_order_gap", keyed("l", message_of("a", 1)));
    let_it_reach_the_server().await;
    let a2 = spawn_enqueue(&db, "outbox_order_gap", keyed("n", message_of("a", 2)));
    let_it_reach_the_server().await;
    let early = claim(&mut store, 10, HELD).await;
    assert!(
        early.iter().all(|m| m.aggregate_id.as_deref() != Some("a")),
        "a#2 overtook a#1: {early:?}"
    );

    retry.commit().await.unwrap();
    let (a1, a2) = (a1.await.unwrap(), a2.await.unwrap());
    assert!(a1.id < a2.id, "{a1:?} {a2:?}");
    let next = claim(&mut store, 10, HELD).await;
    assert!(ids(&next).contains(&a1.id), "{next:?}");
    assert!(!ids(&next).contains(&a2.id), "{next:?}");
}

/// One enqueue of aggregate a held open, a later row of a committed behind it by a writer
/// that does not use `enqueue` (so the claim's NOWAIT probe has to drop it), and 100
/// messages of other aggregates after both: at batch sizes 1 and 2 all 100 flow. Before the
/// fix, a batch of 1 was spent on the dropped row every time and nothing flowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_claim_fills_its_batch_past_an_open_transaction() {
    for batch in [1u32, 2] {
        let outbox = format!("outbox_fill_{batch}");
        let db = database(&format!("fill_{batch}")).await;
        db.outbox(&outbox).await;
        let (open, _) = db.enqueue_open(&outbox, &message_of("a", 1)).await;
        db.sql(&format!(
            "insert into {outbox} (message_id, topic, aggregate_id, payload, created_at) \
             values ('a-2', 'orders', 'a', '{{}}', utc_timestamp(3))"
        ))
        .await;
        let others: Vec<NewMessage> = (0..100).map(|i| message_of(&format!("b-{i}"), i)).collect();
        let wanted: BTreeSet<i64> = db
            .enqueue_committed(&outbox, &others)
            .await
            .iter()
            .map(|e| e.id)
            .collect();

        let poll = Duration::from_millis(100);
        let recorder = Arc::new(Recorder::default());
        let config = RelayConfig::default().batch_size(batch).poll_interval(poll);
        let relay = Relay::new(db.store(&outbox), Arc::clone(&recorder), config).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(relay.run(async {
            stopped.await.ok();
        }));
        // A liveness bound, not a timing: 100 claims run back to back while batches are
        // full; before the fix nothing at all arrived at batch size 1.
        let started = Instant::now();
        while !recorder.ids().is_superset(&wanted) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "batch {batch}: {} of 100 delivered",
                recorder.ids().intersection(&wanted).count()
            );
            tokio::time::sleep(poll).await;
        }
        stop.send(()).unwrap();
        run.await.unwrap().unwrap();
        assert_eq!(recorder.ids(), wanted, "batch {batch}: a#2 waits for a#1");
        open.rollback().await.unwrap();
    }
}

/// Enqueues one message of each aggregate z19, z18 … z00, in that order, so that their
/// names sort against their ids: a scan in id order and a walk in aggregate order take
/// different heads. Returns the ids by the aggregates' numbers, `[z00, z01, …, z19]`.
async fn aggregates_named_against_ids(db: &TestDb, outbox: &str) -> Vec<i64> {
    let messages: Vec<NewMessage> = (0..20)
        .rev()
        .map(|n| message_of(&format!("z{n:02}"), 1))
        .collect();
    let enqueued = db.enqueue_committed(outbox, &messages).await;
    enqueued.iter().rev().map(|e| e.id).collect()
}

/// Which way each claim goes behind a deep backlog (the results are the contract's,
/// `heads_past_a_deep_backlog`): the first claim stops at the first batch × 16 open
/// messages, and one that fills its batch there sends the store to the scan of every open
/// message; a failed claim sends it back to the reach, where the heads past it come from a
/// walk of `open_heads` in aggregate order, at most batch × 16 aggregates, each walk going
/// on where the last stopped. Without `open_heads` every claim scans every open message.
/// Twenty aggregates whose names sort against their ids tell the two ways apart: the scan
/// takes the lowest id, the walk the lowest among the aggregates it reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_claim_behind_a_deep_backlog_walks_the_heads_only_after_a_slow_or_failed_claim() {
    let db = database("reach").await;
    let mut store = db.outbox("outbox_reach").await;
    let ids_of = async |messages: &[NewMessage]| -> Vec<i64> {
        let enqueued = db.enqueue_committed("outbox_reach", messages).await;
        enqueued.iter().map(|e| e.id).collect()
    };
    let hot: Vec<NewMessage> = (0..1000).map(|n| message_of("hot", n)).collect();
    let hot = ids_of(&hot).await;
    // Its head fills the first claim's batch near the front: the store scans every open
    // message from now on, and hot is blocked behind its held head.
    assert_eq!(ids(&claim(&mut store, 1, HELD).await), [hot[0]]);
    let z = aggregates_named_against_ids(&db, "outbox_reach").await;
    let taken = async |store: &mut MysqlOutboxStore, n: u32| -> Vec<i64> {
        let batch = claim(store, n, HELD).await;
        let done = store.mark_done(&ids(&batch), token_of(&batch)).await;
        assert_eq!(done.unwrap(), batch.len() as u64);
        ids(&batch)
    };
    // The scan of every open message takes the lowest due head.
    assert_eq!(taken(&mut store, 1).await, [z[19]]);
    // A claim that fails sends the store back to the reach: the next claim of 1 walks 16
    // aggregates (hot, z00 … z14) and takes the lowest due head among them, z14's.
    db.sql("alter table outbox_reach rename column trace_id to moved")
        .await;
    assert!(store.claim(1, HELD).await.is_err());
    db.sql("alter table outbox_reach rename column moved to trace_id")
        .await;
    assert_eq!(taken(&mut store, 1).await, [z[14]]);
    // The next walk goes on where that one stopped: z15 … z18, then round from hot.
    assert_eq!(taken(&mut store, 1).await, [z[18]]);

    // Without open_heads (an outbox of the bundle's V4) even a new store's first claim
    // scans every open message: it takes the lowest due head, z17's.
    db.sql("alter table outbox_reach drop index open_heads")
        .await;
    let mut old = db.store("outbox_reach");
    assert_eq!(taken(&mut old, 1).await, [z[17]]);
    assert_eq!(
        db.count("outbox_reach", "status = 1").await,
        1,
        "hot's head"
    );
}

/// A claim that reads far (here 200 000 messages behind a held head: about 0.4 s, where the
/// switch is at 100 ms) sends the store to the reach: the next claim walks the heads past it
/// (the aggregates' names sort against their ids, so the walk takes another head than the
/// scan would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_slow_claim_sends_the_store_to_the_reach() {
    let db = database("slow_reach").await;
    let mut store = db.outbox("outbox_slow").await;
    let head = db
        .enqueue_committed("outbox_slow", &[message_of("hot", 0)])
        .await;
    db.sql(
        "insert into outbox_slow (message_id, topic, aggregate_type, aggregate_id, payload, \
         created_at) select concat('hot-', seq), 'orders', 'order', 'hot', '{}', \
         utc_timestamp(3) from seq_1_to_200000",
    )
    .await;
    // Filled near the front: the store scans every open message from now on.
    assert_eq!(ids(&claim(&mut store, 1, HELD).await), [head[0].id]);
    let z = aggregates_named_against_ids(&db, "outbox_slow").await;
    // The scan reads every message of hot behind its held head: slow.
    let started = Instant::now();
    assert_eq!(ids(&claim(&mut store, 1, HELD).await), [z[19]]);
    assert!(
        started.elapsed() > Duration::from_millis(100),
        "the scan was not slow ({:?}): the test proves nothing",
        started.elapsed()
    );
    // So the next claim walks 16 aggregates (hot, z00 … z14) and takes z14's head.
    assert_eq!(ids(&claim(&mut store, 1, HELD).await), [z[14]]);
}

/// A payload that is not JSON, inserted with MariaDB's checks off, fails every UPDATE of its
/// row with error 4025. Before the fix every claim failed and nothing flowed; now the row is
/// marked dead with the error and the 21 others are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_row_that_breaks_a_check_constraint_is_marked_dead_and_the_rest_flows() {
    let db = database("check_row").await;
    db.outbox("outbox_check").await;
    db.sql(
        "set statement check_constraint_checks = 0 for insert into outbox_check \
         (message_id, topic, aggregate_id, payload, created_at) \
         values ('bad', 'orders', 'bad', 'not json', utc_timestamp(3))",
    )
    .await;
    let others: Vec<NewMessage> = (0..21).map(|i| message_of(&format!("c-{i}"), i)).collect();
    db.enqueue_committed("outbox_check", &others).await;
    assert_eq!(published_in_one_pass(db.store("outbox_check")).await, 21);
    let bad: i64 = db
        .scalar("select id from outbox_check where message_id = 'bad'")
        .await;
    let state = row_state(&db, "outbox_check", bad).await;
    assert_eq!((state.status, state.attempts), (DEAD, 1), "{state:?}");
    let error = state.last_error.unwrap();
    assert!(
        error.contains("4025") && error.contains("redrive"),
        "{error}"
    );
}

/// A 2 MiB payload, enqueued by a connection that allows it, and a relay whose connection
/// allows 1 MiB (`max_allowed_packet` in its options): before the fix every claim failed on
/// the packet and the 20 other messages never flowed. Now the row is claimed without its
/// payload, handed over undecodable, and marked dead with the limit named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_row_larger_than_the_relays_packet_is_isolated_and_the_rest_flows() {
    let db = database("big_row").await;
    db.outbox("outbox_big").await;
    let big =
        NewMessage::new("orders", json!({ "blob": "x".repeat(2 << 20) })).aggregate("order", "big");
    let others: Vec<NewMessage> = (0..20).map(|i| message_of(&format!("s-{i}"), i)).collect();
    let big_id = db.enqueue_committed("outbox_big", &[big]).await[0].id;
    db.enqueue_committed("outbox_big", &others).await;

    let small_packets = mysql_async::OptsBuilder::from_opts(db.opts.clone())
        .max_allowed_packet(Some(1 << 20))
        .into();
    let store = MysqlOutboxStore::new(table("outbox_big"), small_packets);
    assert_eq!(published_in_one_pass(store).await, 20);
    let state = row_state(&db, "outbox_big", big_id).await;
    assert_eq!(state.status, DEAD, "{state:?}");
    let error = state.last_error.unwrap();
    assert!(error.contains("max_allowed_packet"), "{error}");
    assert_eq!(
        db.count(
            "outbox_big",
            "status = 4 and octet_length(payload) > 2000000"
        )
        .await,
        1,
        "the payload is kept"
    );
}

/// A column that does not decode (here trace_id made VARBINARY by hand and holding a byte
/// that is not UTF-8): the row is handed over undecodable, naming the column, instead of
/// failing every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_column_that_does_not_decode_makes_the_row_undecodable() {
    let db = database("odd_column").await;
    let mut store = db.outbox("outbox_odd_column").await;
    db.sql("alter table outbox_odd_column modify trace_id varbinary(128) null")
        .await;
    db.sql(
        "insert into outbox_odd_column (message_id, topic, aggregate_id, payload, trace_id, \
         created_at) values ('odd', 'orders', 'o', '{}', x'ff', utc_timestamp(3))",
    )
    .await;
    let good = db
        .enqueue_committed("outbox_odd_column", &[message_of("g", 1)])
        .await;
    let rows = store.claim(10, HELD).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let odd = undecodable(&rows[0], "trace_id");
    assert_eq!(odd.payload.as_deref(), Some("{}"));
    assert!(matches!(&rows[1], Claimed::Message(m) if m.id == good[0].id));
}

/// A database and an outbox of the bundle's V3 (before the aggregate locks and the claim
/// expiry): enqueue and claim say what to run; after `migrate` and `setup_outbox` the
/// outbox keeps its rows and works, and a claim made before the upgrade (no expiry stored)
/// expires by `claimed_at` and the claimer's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn an_outbox_of_v3_is_upgraded_by_migrate_and_setup_outbox() {
    let db = common_mysql::database_at("upgrade_v3", 3).await;
    db.sql("call changefeed_setup_outbox('outbox_v3')").await;
    db.sql(
        "insert into outbox_v3 (message_id, topic, aggregate_id, payload, created_at) \
         values ('p', 'orders', 'p', '{}', utc_timestamp(3)); \
         insert into outbox_v3 (message_id, topic, aggregate_id, payload, status, claimed_at, \
         claim_token, created_at) values ('q', 'orders', 'q', '{}', 1, \
         utc_timestamp(3) - interval 2 hour, x'00000000000000000000000000000001', \
         utc_timestamp(3))",
    )
    .await;
    let mut store = db.store("outbox_v3");
    config_error(store.claim(10, HELD).await, "setup_outbox");
    let mut tx = db.transaction().await;
    config_error(
        enqueue(&mut tx, &table("outbox_v3"), &message_of("r", 1)).await,
        "changefeed::mysql::migrate",
    );
    tx.rollback().await.unwrap();

    changefeed::mysql::migrate(&db.pool).await.unwrap();
    db.sql("call changefeed_setup_outbox('outbox_v3')").await;
    db.sql("call changefeed_setup_outbox('outbox_v3')").await;
    assert_eq!(db.count("outbox_v3", "1 = 1").await, 2, "nothing dropped");
    let claimed = claim(&mut store, 10, HELD).await;
    let keys: Vec<&str> = claimed.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(keys, ["p", "q"]);
    assert_eq!(claimed[1].attempts, 1, "q's old claim expired");
    db.enqueue_committed("outbox_v3", &[message_of("r", 1)])
        .await;
}

/// `changefeed migrate` with a mysql:// URL applies what a database of the bundle's V3
/// lacks, then nothing.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn the_cli_migrates_a_database_of_v3() {
    let db = common_mysql::database_at("cli_v3", 3).await;
    let migrate = || common_process::changefeed(&["migrate", "--url", &db.url]);
    let first = migrate();
    assert!(first.status.success(), "{first:?}");
    let said = String::from_utf8_lossy(&first.stdout);
    assert!(
        said.starts_with("applied 2 MariaDB/MySQL changefeed migrations (")
            && said.contains("\n  V4 ")
            && said.contains("\n  V5 "),
        "{said}"
    );
    let again = migrate();
    assert!(String::from_utf8_lossy(&again.stdout).contains("the database is up to date"));
}

/// purge_done also forgets the aggregate locks of aggregates with no row left, but never one
/// an enqueue holds or one whose aggregate still has rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn purge_forgets_the_locks_of_aggregates_it_emptied() {
    let db = database("purge_locks").await;
    let mut store = db.outbox("outbox_purge_locks").await;
    let e = db
        .enqueue_committed(
            "outbox_purge_locks",
            &[
                message_of("x", 1),
                message_of("y", 1),
                message_of("y", 2),
                message_of("z", 1),
            ],
        )
        .await;
    let batch = claim(&mut store, 10, HELD).await;
    assert_eq!(ids(&batch), vec![e[0].id, e[1].id, e[3].id]);
    store
        .mark_done(&ids(&batch), token_of(&batch))
        .await
        .unwrap();
    // z's second message, uncommitted: it holds z's lock, which purge must pass over even
    // though z has no committed row left once z1 is purged.
    let (open, _) = db
        .enqueue_open("outbox_purge_locks", &message_of("z", 2))
        .await;

    assert_eq!(store.purge_done(Duration::ZERO, 1, None).await.unwrap(), 3);
    let locks: Vec<String> = db
        .conn()
        .await
        .query(
            "select aggregate_id from changefeed_aggregate_locks \
             where outbox = 'outbox_purge_locks' order by aggregate_id",
        )
        .await
        .unwrap();
    assert_eq!(locks, ["y", "z"], "x's rows are gone, y has one, z is held");
    open.commit().await.unwrap();
}
