//! The MariaDB claim under `innodb_rollback_on_timeout=ON` (feature `mysql`): a refused
//! `FOR UPDATE NOWAIT` (error 1205) then rolls back the claim's whole transaction and
//! releases its locks, so the claim's update must be guarded to stay correct. A server
//! option cannot be changed at run time, so this binary has a private server of its own,
//! started with it (tests/common_mysql). `#[ignore]`d like tests/live_mysql.rs; run with
//! `cargo test --all-features --test live_mysql_rollback_on_timeout -- --ignored`.

mod common_mysql;
mod common_server;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::mysql::OutboxTable;
use changefeed::outbox::{ClaimStore, Claimed, NewMessage};
use common_mysql::{database, server};
use mysql_async::prelude::Queryable;
use serde_json::json;

/// A claim timeout no test outlives: nothing expires, so no row may be claimed twice.
const HELD: Duration = Duration::from_secs(3600);

fn message_of(aggregate: &str, n: usize) -> NewMessage {
    NewMessage::new("orders", json!({ "aggregate": aggregate, "n": n }))
        .aggregate("order", aggregate)
}

/// Eight relays claim (batch 3) and acknowledge 300 messages while 30 aggregates each
/// have an uncommitted first row written by a plain INSERT and a committed second row:
/// every claim that meets one of those second rows has its NOWAIT probe refused and its
/// transaction rolled back, and claims on after it without its locks. Checked: no row is
/// handed to two claims, every acknowledgement finds its rows still held (none was taken
/// over or reopened), all 300 end done, and the blocked rows are never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn claims_stay_exclusive_when_a_refused_probe_rolls_the_transaction_back() {
    server::with_options(&["--innodb-rollback-on-timeout=ON"]);
    let db = database("rollback_on_timeout").await;
    db.outbox("outbox_rot").await;
    assert_eq!(
        db.scalar("select @@innodb_rollback_on_timeout").await,
        1,
        "this test needs a server started with innodb_rollback_on_timeout=ON"
    );
    let t: OutboxTable = "outbox_rot".parse().unwrap();

    let mut open = db.transaction().await;
    for k in 0..30 {
        open.query_drop(format!(
            "insert into outbox_rot (message_id, topic, aggregate_id, payload, created_at) \
             values ('c-{k}-1', 'orders', 'c-{k}', '{{}}', utc_timestamp(3))"
        ))
        .await
        .unwrap();
    }
    let mut messages = Vec::new();
    for i in 0..300 {
        if i % 10 == 0 {
            messages.push(message_of(&format!("c-{}", i / 10), 2));
        }
        messages.push(message_of(&format!("b-{i}"), i));
    }
    let enqueued = db.enqueue_committed("outbox_rot", &messages).await;
    let blocked: Vec<i64> = enqueued
        .iter()
        .zip(&messages)
        .filter(|(_, m)| {
            m.aggregate_id
                .as_deref()
                .is_some_and(|a| a.starts_with("c-"))
        })
        .map(|(e, _)| e.id)
        .collect();

    let claimed_by: Arc<Mutex<BTreeMap<i64, usize>>> = Arc::default();
    let mut claimers = Vec::new();
    for claimer in 0..8 {
        let mut store = db.store(t.name());
        let claimed_by = Arc::clone(&claimed_by);
        claimers.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut empty_in_a_row = 0;
            while empty_in_a_row < 3 && started.elapsed() < Duration::from_secs(60) {
                let rows = store.claim(3, HELD).await.unwrap();
                if rows.is_empty() {
                    empty_in_a_row += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                empty_in_a_row = 0;
                let mut ids = Vec::new();
                let mut token = None;
                for row in rows {
                    let Claimed::Message(message) = row else {
                        panic!("unexpected {row:?}")
                    };
                    token = Some(message.claim_token);
                    if let Some(other) = claimed_by.lock().unwrap().insert(message.id, claimer) {
                        panic!("row {} claimed by {other} and {claimer}", message.id);
                    }
                    ids.push(message.id);
                }
                let done = store.mark_done(&ids, token.unwrap()).await.unwrap();
                assert_eq!(done, ids.len() as u64, "a claim of {ids:?} was taken over");
            }
        }));
    }
    for claimer in claimers {
        claimer.await.unwrap();
    }
    let claimed = claimed_by.lock().unwrap().clone();
    let states: Vec<(i64, i64, i64)> = db
        .conn()
        .await
        .query("select status, count(*), min(id) from outbox_rot group by status")
        .await
        .unwrap();
    assert_eq!(
        claimed.len(),
        300,
        "every b row once; by status: {states:?}"
    );
    assert!(blocked.iter().all(|id| !claimed.contains_key(id)));
    assert_eq!(db.count("outbox_rot", "status = 2").await, 300);
    assert_eq!(
        db.count("outbox_rot", "status = 1").await,
        0,
        "nothing reopened"
    );
    open.rollback().await.unwrap();
}
