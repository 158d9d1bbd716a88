//! The claim-outbox contract (tests/claim_contract) on SQL Server: the same scenarios the
//! MariaDB and PostgreSQL stores pass, run through `SqlClaimStore` (the store a relay uses)
//! and `OutboxStore::enqueue` / `purge_done`. The SQL Server store's own tests (its error
//! numbers, locks, storage, collations, set options, setup_outbox repairs) stay in
//! `live_claim_outbox.rs`.
//!
//! Like every SQL Server live test they need a server (`CHANGEFEED_TEST_MSSQL`, or Docker for
//! testcontainers; see tests/common) and are `#[ignore]`d: run them with
//! `cargo test --test contract_mssql -- --ignored`. Every scenario runs twice, with
//! READ_COMMITTED_SNAPSHOT off and on, each in a database of its own with the bundle applied.
//!
//! Times are `datetime2(3)` in UTC (`sysutcdatetime()`); the harness moves them back with
//! `dateadd` in whole seconds plus milliseconds, because `dateadd` takes an int and a
//! duration in microseconds or milliseconds can exceed one.

mod claim_contract;
mod common;

use std::time::Duration;

use changefeed::Result;
use changefeed::outbox::{
    ClaimProgress, ClaimStore, ClaimToken, Claimed, Enqueued, Failed, NewMessage,
};
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use claim_contract::{ContractDb, OpenEnqueue};
use common::claims::id_list;
use common::{TestDb, enqueue_committed, exec, scalar_i64};

/// The outbox every scenario works on, in its own database.
const TABLE: &str = "dbo.outbox";

/// Deadlock victims (1205) and lock timeouts (1222) a claim retries: a relay does too
/// (`Error::is_transient`), and a statement that lost a deadlock claimed nothing. The other
/// stores never need it, so the retry lives here, not in the contract.
const MAX_TRANSIENT_RETRIES: u32 = 50;

/// `SqlClaimStore`, with a claim that retries what a relay would retry.
struct Store(SqlClaimStore);

impl ClaimStore for Store {
    async fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Result<Vec<Claimed>> {
        let mut retries = 0;
        loop {
            match self.0.claim(batch_size, claim_timeout).await {
                Err(error)
                    if error.server_number().is_some()
                        && error.is_transient()
                        && retries < MAX_TRANSIENT_RETRIES =>
                {
                    retries += 1;
                    eprintln!("claim: transient error, retry {retries}: {error}");
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(retries))).await;
                }
                result => return result,
            }
        }
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        self.0.mark_done(ids, token).await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> Result<u64> {
        self.0.mark_failed(failed).await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        self.0.requeue(id, token, after).await
    }

    // Forwarded, not left to the defaults: SqlClaimStore's claim waits on the server, and a
    // relay told otherwise starts claims beside batches in flight that hold the connection
    // their acknowledgements need (ClaimStore's documentation).
    fn claim_waits(&self) -> bool {
        self.0.claim_waits()
    }

    async fn cancel_claim(&mut self) {
        self.0.cancel_claim().await;
    }

    fn claim_progress(&self) -> Option<ClaimProgress> {
        self.0.claim_progress()
    }

    fn outbox_name(&self) -> String {
        self.0.outbox_name()
    }
}

/// The outbox `dbo.outbox` of one scenario's database, for the contract.
struct Outbox {
    database: String,
    ado: String,
    outbox: OutboxStore,
}

impl Outbox {
    async fn new(db: &TestDb) -> Outbox {
        let mut client = db.client().await;
        exec(
            &mut client,
            &format!("exec changefeed.setup_outbox @table_name = N'{TABLE}';"),
        )
        .await
        .expect("setup_outbox");
        Outbox {
            database: db.name.clone(),
            ado: db.ado(),
            outbox: TABLE.parse().expect("a valid outbox name"),
        }
    }

    async fn client(&self) -> changefeed::Client {
        common::connect_to(&self.database).await
    }
}

impl ContractDb for Outbox {
    type Store = Store;

    fn store(&self) -> Store {
        Store(SqlClaimStore::new(self.outbox.clone(), self.ado.clone()))
    }

    async fn enqueue_committed(&self, messages: &[NewMessage]) -> Vec<Enqueued> {
        enqueue_committed(&self.outbox, &mut self.client().await, messages).await
    }

    async fn enqueue_open(&self, message: NewMessage) -> OpenEnqueue {
        let mut client = self.client().await;
        let outbox = self.outbox.clone();
        OpenEnqueue::spawn(|handover| async move {
            exec(&mut client, "begin transaction;").await.unwrap();
            let row = outbox.enqueue(&mut client, &message).await.unwrap();
            let own = scalar_i64(
                &mut client,
                &format!("select count_big(*) from {TABLE} where id = {};", row.id),
            )
            .await;
            let end = if handover.commit_when_told(row, own).await {
                "commit transaction;"
            } else {
                "rollback transaction;"
            };
            exec(&mut client, end).await.unwrap();
        })
    }

    async fn state(&self, id: i64) -> (i64, i64) {
        let mut client = self.client().await;
        let status = scalar_i64(
            &mut client,
            &format!("select convert(bigint, status) from {TABLE} where id = {id};"),
        )
        .await;
        let attempts = scalar_i64(
            &mut client,
            &format!("select convert(bigint, attempts) from {TABLE} where id = {id};"),
        )
        .await;
        (status, attempts)
    }

    async fn age(&self, column: &str, by: Duration, ids: &[i64]) {
        let seconds = i32::try_from(by.as_secs()).expect("an age that dateadd's int holds");
        let milliseconds = by.subsec_millis();
        let sql = format!(
            "update {TABLE} set {column} = dateadd(millisecond, -{milliseconds}, \
             dateadd(second, -{seconds}, coalesce({column}, sysutcdatetime()))) \
             where id in ({});",
            id_list(ids)
        );
        exec(&mut self.client().await, &sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn count(&self, condition: &str) -> i64 {
        scalar_i64(
            &mut self.client().await,
            &format!("select count_big(*) from {TABLE} where {condition};"),
        )
        .await
    }

    async fn purge_done(
        &self,
        older_than: Duration,
        batch_size: u32,
        max_rows: Option<u64>,
    ) -> Result<u64> {
        self.outbox
            .purge_done(&mut self.client().await, older_than, batch_size, max_rows)
            .await
    }
}

/// Runs a contract scenario under both READ_COMMITTED_SNAPSHOT settings, each time on the
/// outbox of a fresh database of its own.
async fn under_both_isolations(test: &str, scenario: impl AsyncFn(&Outbox)) {
    common::under_both_isolations(&format!("contract_{test}"), async |db: &TestDb| {
        scenario(&Outbox::new(db).await).await
    })
    .await;
}

claim_contract::contract_tests!(
    "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker",
    under_both_isolations
);
