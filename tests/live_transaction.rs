//! Live tests of the pool's transaction guard and check-out reset against a real SQL
//! Server: a writer cancelled while it holds `lock_feed`'s shard lock must not keep the
//! shard locked, and a session setting a borrower changed must not reach the next one.
//!
//! They need a SQL Server (`CHANGEFEED_TEST_MSSQL`, or Docker for testcontainers) and are
//! `#[ignore]`d: run them with `cargo test --test live_transaction -- --ignored`. Every
//! scenario runs with READ_COMMITTED_SNAPSHOT off and on; every wait is bounded.

mod common;

use std::time::Duration;

use changefeed::writer::lock_feed;
use changefeed::{Error, Feed};
use common::events::hex;
use common::{TestDb, exec, scalar_i64};

/// How long the second writer waits for the shard: far below the pool's idle reaper
/// (minutes), so only a closed session can free the lock in time.
const LOCK_WAIT: Duration = Duration::from_secs(5);

async fn serialized_feed(db: &TestDb, table: &str) -> Feed {
    let mut admin = db.client().await;
    exec(
        &mut admin,
        &format!(
            "create table dbo.{table} (id bigint not null primary key, Shard int not null, \
             ULID binary(16) not null); \
             create unique index ux_{table} on dbo.{table} (Shard, ULID); \
             exec changefeed.setup_feed @table_name = N'dbo.{table}', @serialize_writers = 1, \
                 @shard_column = N'Shard', @ulid_column = N'ULID';"
        ),
    )
    .await
    .unwrap_or_else(|error| panic!("create the feed dbo.{table}: {error}"));
    Feed::new("dbo", table).expect("a valid feed name")
}

common::live_test!(a_writer_dropped_inside_its_transaction_does_not_keep_the_shard_locked: "tx_dropped_writer" => dropped_writer_in);

async fn dropped_writer_in(db: &TestDb) {
    let feed = serialized_feed(db, "tx_events").await;
    let pool = changefeed::pool::pool(&db.ado(), 2).await.expect("a pool");

    // A writer takes the shard lock and fails before committing (an early `?`).
    let failed: Result<(), Error> = async {
        let mut conn = pool.get().await?;
        let mut tx = conn.transaction().await?;
        lock_feed(&mut tx, &feed, 0, None, Some(LOCK_WAIT)).await?;
        Err(Error::Config(
            "the writer failed mid-transaction".to_owned(),
        ))
    }
    .await;
    assert!(failed.is_err());

    // Another writer gets the shard at once: the first session was closed and rolled back,
    // not parked in the pool with its transaction open.
    let mut conn = pool.get().await.expect("a connection");
    let mut tx = conn.transaction().await.expect("begin");
    let range = tokio::time::timeout(
        LOCK_WAIT * 2,
        lock_feed(&mut tx, &feed, 0, None, Some(LOCK_WAIT)),
    )
    .await
    .expect("lock_feed is bounded")
    .expect("the shard is free");
    exec(
        &mut tx,
        &format!(
            "insert into dbo.tx_events (id, Shard, ULID) values (1, 0, {});",
            hex(&range.first().to_bytes())
        ),
    )
    .await
    .expect("insert the event");
    tx.commit().await.expect("commit");
    drop(conn);

    let mut check = db.client().await;
    assert_eq!(
        scalar_i64(&mut check, "select count_big(*) from dbo.tx_events;").await,
        1
    );
}

common::live_test!(a_check_out_resets_the_session_a_borrower_changed: "tx_reset" => reset_in);

async fn reset_in(db: &TestDb) {
    // One connection, so both borrowers get the same session.
    let pool = changefeed::pool::pool(&db.ado(), 1).await.expect("a pool");
    let spid = {
        let mut conn = pool.get().await.expect("a connection");
        exec(
            &mut conn,
            "set transaction isolation level serializable; set lock_timeout 0; \
             set implicit_transactions on; set xact_abort on; \
             select 1 into #left_open; begin transaction;",
        )
        .await
        .expect("change the session");
        scalar_i64(&mut conn, "select convert(bigint, @@spid);").await
    };
    let mut conn = pool.get().await.expect("the same connection");
    assert_eq!(
        scalar_i64(&mut conn, "select convert(bigint, @@spid);").await,
        spid,
        "one session"
    );
    let settings = scalar_i64(
        &mut conn,
        "select convert(bigint, @@trancount) * 1000000 \
             + convert(bigint, (@@options & 2) / 2) * 100000 \
             + convert(bigint, (@@options & 16384) / 16384) * 10000 \
             + convert(bigint, @@lock_timeout + 1) * 1000 \
             + (select convert(bigint, transaction_isolation_level) from sys.dm_exec_sessions \
                where session_id = @@spid);",
    )
    .await;
    // No open transaction, implicit_transactions off, xact_abort off, lock_timeout -1,
    // isolation level 2 (read committed).
    assert_eq!(settings, 2, "{settings:07}");
}
