//! The claim-outbox contract (tests/claim_contract) on MariaDB: the same scenarios the
//! PostgreSQL store passes in `live_postgres.rs`. The MariaDB store's own tests (the bundle,
//! the binlog waker, the claim's plan) stay in `live_mysql.rs`.
//!
//! `#[ignore]`d so that `cargo test` passes without MariaDB; `.ci/run` installs it and runs
//! them with `--ignored` (tests/common_mysql starts a private server, or set
//! `CHANGEFEED_TEST_MYSQL`).

mod claim_contract;
mod common_mysql;
mod common_server;

use std::time::Duration;

use changefeed::mysql::{MysqlOutboxStore, OutboxTable, enqueue};
use changefeed::outbox::{Enqueued, NewMessage};
use claim_contract::{ContractDb, OpenEnqueue};
use common_mysql::{TestDb, database};
use mysql_async::prelude::Queryable;

/// The outbox `outbox` of a test database, for the contract.
struct Outbox {
    db: TestDb,
}

const TABLE: &str = "outbox";

impl ContractDb for Outbox {
    type Store = MysqlOutboxStore;

    fn store(&self) -> MysqlOutboxStore {
        self.db.store(TABLE)
    }

    async fn enqueue_committed(&self, messages: &[NewMessage]) -> Vec<Enqueued> {
        self.db.enqueue_committed(TABLE, messages).await
    }

    async fn enqueue_open(&self, message: NewMessage) -> OpenEnqueue {
        let mut tx = self.db.transaction().await;
        let table: OutboxTable = TABLE.parse().unwrap();
        OpenEnqueue::spawn(|handover| async move {
            let row = enqueue(&mut tx, &table, &message).await.unwrap();
            let own: Option<i64> = tx
                .exec_first(
                    format!("select count(*) from `{TABLE}` where id = ?"),
                    (row.id,),
                )
                .await
                .unwrap();
            if handover.commit_when_told(row, own.unwrap_or(0)).await {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
        })
    }

    async fn state(&self, id: i64) -> (i64, i64) {
        let row: Option<(i64, i64)> = self
            .db
            .conn()
            .await
            .exec_first(
                format!("select status, attempts from `{TABLE}` where id = ?"),
                (id,),
            )
            .await
            .unwrap();
        row.unwrap_or_else(|| panic!("no row {id}"))
    }

    async fn age(&self, column: &str, by: Duration, ids: &[i64]) {
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        self.db
            .sql(&format!(
                "update `{TABLE}` set {column} = coalesce({column}, utc_timestamp(6)) \
                 - interval {} microsecond where id in ({})",
                by.as_micros(),
                list.join(", ")
            ))
            .await;
    }

    async fn count(&self, condition: &str) -> i64 {
        self.db.count(TABLE, condition).await
    }

    async fn purge_done(
        &self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> changefeed::Result<u64> {
        self.store()
            .purge_done(older_than, batch_size, max_rows)
            .await
    }
}

/// Runs a contract scenario on the outbox of a fresh database of its own.
async fn on_a_fresh_outbox(test: &str, scenario: impl AsyncFnOnce(&Outbox)) {
    let db = database(&format!("contract_{test}")).await;
    db.outbox(TABLE).await;
    scenario(&Outbox { db }).await;
}

claim_contract::contract_tests!(
    "needs MariaDB: .ci/run installs it; or set CHANGEFEED_TEST_MYSQL",
    on_a_fresh_outbox
);
