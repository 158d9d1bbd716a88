//! The binlog waker on a MariaDB started with `lower_case_table_names=1` (feature `mysql`):
//! such a server keeps database and table names in lower case, and so names them in the
//! binlog, whatever case the relay was given them in. A server option cannot be changed at
//! run time, so this binary has a private server of its own, started with it
//! (tests/common_mysql). `#[ignore]`d like tests/live_mysql.rs; run with
//! `cargo test --all-features --test live_mysql_lower_case -- --ignored`.

mod claim_contract;
mod common_mysql;
mod common_server;

use std::time::{Duration, Instant};

use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, OutboxTable, WakerState};
use claim_contract::message_of;
use claim_contract::wake::{self, Kinds, WokenRelay};
use common_mysql::{database, server};

/// A database named in mixed case (the relay's URL names it so; the server keeps and logs
/// it in lower case): the waker compares it with the binlog's names as the server does, so
/// it wakes the relay on a commit (the relay itself polls once a minute), instead of saying
/// it follows while never waking. (The outbox is named in lower case: under this setting
/// the bundle's `changefeed_setup_outbox` does not find the columns of a table it was
/// given in mixed case.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_mixed_case_database_wakes_the_relay_under_lower_case_table_names() {
    server::with_options(&["--lower-case-table-names=1"]);
    let db = database("Lower_Case").await;
    assert_eq!(
        db.scalar("select @@lower_case_table_names").await,
        1,
        "this test needs a server started with lower_case_table_names=1"
    );
    let outbox = "outbox_lc";
    db.outbox(outbox).await;
    let kinds = Kinds {
        awake: |s| matches!(s, WakerState::Following { .. }),
        polling: |s| matches!(s, WakerState::Polling { .. }),
    };
    let table: OutboxTable = outbox.parse().unwrap();
    let relay = WokenRelay::start_awake(db.store(outbox), kinds, |handle, stop| {
        let config = BinlogWakerConfig::default();
        let waker = BinlogWaker::new(db.opts.clone(), table, handle, config);
        let state = waker.state();
        tokio::spawn(waker.run(wake::stopped(stop)));
        state
    })
    .await;
    for n in 0..3 {
        let committed = Instant::now();
        let id = db
            .enqueue_committed(outbox, &[message_of(&format!("m-{n}"), n)])
            .await[0]
            .id;
        let after = relay.published_after(id, committed).await;
        assert!(after < Duration::from_secs(2), "message {n}: {after:?}");
    }
    relay.stop().await;
}

/// An outbox the relay, the enqueuer and the waker name in mixed case (the server keeps
/// and logs it in lower case; it was set up under its lower-case name, which
/// `changefeed_setup_outbox` needs under this setting): woken on every commit too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL"]
async fn a_mixed_case_outbox_wakes_the_relay_under_lower_case_table_names() {
    server::with_options(&["--lower-case-table-names=1"]);
    let db = database("lower_case_table").await;
    db.outbox("outbox_mixed").await;
    let outbox = "Outbox_Mixed";
    let kinds = Kinds {
        awake: |s| matches!(s, WakerState::Following { .. }),
        polling: |s| matches!(s, WakerState::Polling { .. }),
    };
    let table: OutboxTable = outbox.parse().unwrap();
    let relay = WokenRelay::start_awake(db.store(outbox), kinds, |handle, stop| {
        let config = BinlogWakerConfig::default();
        let waker = BinlogWaker::new(db.opts.clone(), table, handle, config);
        let state = waker.state();
        tokio::spawn(waker.run(wake::stopped(stop)));
        state
    })
    .await;
    for n in 0..3 {
        let committed = Instant::now();
        let id = db
            .enqueue_committed(outbox, &[message_of(&format!("m-{n}"), n)])
            .await[0]
            .id;
        let after = relay.published_after(id, committed).await;
        assert!(after < Duration::from_secs(2), "message {n}: {after:?}");
    }
    relay.stop().await;
}
