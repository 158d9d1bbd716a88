//! The claim outbox on PostgreSQL (feature `postgres`): the shared claim-outbox contract
//! (tests/claim_contract) and the PostgreSQL store's own behaviour: the bundle and
//! `changefeed.setup_outbox`, the per-aggregate ordering trigger, the notify wake and its
//! fallback to polling.
//!
//! The harness (tests/common_postgres) starts one private PostgreSQL for this test binary,
//! or uses `CHANGEFEED_TEST_POSTGRES`; each test works in a fresh database. The tests are
//! `#[ignore]`d so that `cargo test` passes without PostgreSQL; `.ci/run` installs it and
//! runs them with `--ignored`.
//!
//! Time-based cases move a row's `claimed_at`, `next_retry_at` or `processed_at` back with
//! server-side arithmetic instead of waiting.

mod claim_contract;
mod common_postgres;
#[cfg(feature = "cli")]
mod common_process;
mod common_server;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::Error;
use changefeed::outbox::{ClaimStore, Claimed, Enqueued, NewMessage};
use changefeed::postgres::{
    OutboxTable, PostgresOutboxStore, PostgresWaker, PostgresWakerConfig, WakerState, enqueue,
    setup_outbox,
};
use changefeed::relay::{Relay, RelayConfig, RelayHandle};
use claim_contract::wake::{self, Kinds, WokenRelay};
use claim_contract::{ContractDb, OpenEnqueue, Recorder, message_of};
use common_postgres::{TestDb, database, database_with};
use futures::StreamExt;
use tokio::sync::watch;

/// One outbox of a test database, for the contract.
struct Outbox {
    db: TestDb,
    table: &'static str,
}

async fn outbox(test: &str) -> Outbox {
    let db = database(test).await;
    db.outbox("public.outbox").await;
    Outbox {
        db,
        table: "public.outbox",
    }
}

impl ContractDb for Outbox {
    type Store = PostgresOutboxStore;

    fn store(&self) -> PostgresOutboxStore {
        self.db.store(self.table)
    }

    async fn enqueue_committed(&self, messages: &[NewMessage]) -> Vec<Enqueued> {
        self.db.enqueue_committed(self.table, messages).await
    }

    async fn enqueue_open(&self, message: NewMessage) -> OpenEnqueue {
        let mut client = self.db.client().await;
        let table: OutboxTable = self.table.parse().unwrap();
        OpenEnqueue::spawn(|handover| async move {
            let tx = client.transaction().await.unwrap();
            let row = enqueue(&tx, &table, &message).await.unwrap();
            let sql = format!("select count(*) from {table} where id = $1");
            let own: i64 = tx.query_one(&sql, &[&row.id]).await.unwrap().get(0);
            if handover.commit_when_told(row, own).await {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
        })
    }

    async fn state(&self, id: i64) -> (i64, i64) {
        let row = self
            .db
            .client()
            .await
            .query_one(
                &format!(
                    "select status::bigint, attempts::bigint from {} where id = $1",
                    self.table
                ),
                &[&id],
            )
            .await
            .unwrap_or_else(|e| panic!("row {id}: {e}"));
        (row.get(0), row.get(1))
    }

    async fn age(&self, column: &str, by: Duration, ids: &[i64]) {
        let micros = i64::try_from(by.as_micros()).unwrap();
        self.db
            .client()
            .await
            .execute(
                &format!(
                    "update {} set {column} = coalesce({column}, now()) \
                     - $1::bigint * interval '1 microsecond' where id = any($2)",
                    self.table
                ),
                &[&micros, &ids],
            )
            .await
            .unwrap();
    }

    async fn count(&self, condition: &str) -> i64 {
        self.db.count(self.table, condition).await
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

// ------------------------------------------------------------------------------------------
// 1. The contract
// ------------------------------------------------------------------------------------------

/// Runs a contract scenario on the outbox of a fresh database of its own.
async fn on_a_fresh_outbox(test: &str, scenario: impl AsyncFnOnce(&Outbox)) {
    scenario(&outbox(test).await).await;
}

claim_contract::contract_tests!(
    "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES",
    on_a_fresh_outbox
);

// PostgreSQL's store has concurrent handles (SQL Server's and MariaDB's have none): it
// runs this scenario too.
claim_contract::contract_tests!(
    @each "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES",
    on_a_fresh_outbox,
    acknowledgements_on_concurrent_handles_beside_claims,
);

// ------------------------------------------------------------------------------------------
// 2. The bundle and setup_outbox
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn setup_outbox_checks_names_completes_tables_and_never_drops_data() {
    let db = database("setup").await;
    let client = db.client().await;
    // Twice: the second call changes nothing and keeps the row.
    let table: OutboxTable = "public.orders_outbox".parse().unwrap();
    setup_outbox(&client, &table).await.unwrap();
    db.enqueue_committed("public.orders_outbox", &[message_of("a", 0)])
        .await;
    setup_outbox(&client, &table).await.unwrap();
    assert_eq!(db.count("public.orders_outbox", "true").await, 1);
    assert_eq!(
        db.scalar(
            "select count(*) from pg_trigger where tgrelid = 'public.orders_outbox'::regclass \
             and tgname like 'changefeed%'"
        )
        .await,
        2
    );
    // The server applies the same name rule as OutboxTable, with SQLSTATE CF000 (51000).
    for bad in [
        "outbox",
        "Public.outbox",
        "public.x;drop table y",
        "changefeed.x",
        "public.changefeed_x",
    ] {
        let error = client
            .execute("select changefeed.setup_outbox($1)", &[&bad])
            .await
            .map_err(Error::from)
            .unwrap_err();
        assert_eq!(error.server_number(), Some(51000), "{bad}: {error}");
        assert!(error.to_string().contains("schema.table"), "{error}");
        assert!(bad.parse::<OutboxTable>().is_err(), "{bad}");
    }
    let missing = client
        .execute("select changefeed.setup_outbox('nowhere.outbox')", &[])
        .await
        .map_err(Error::from)
        .unwrap_err();
    assert!(
        missing.to_string().contains("create schema nowhere"),
        "{missing}"
    );
    // A hand-made table lacking columns: reported (CF306, 51306), nothing dropped.
    db.sql(
        "create table public.partial (id bigserial primary key, topic text); \
            insert into public.partial (topic) values ('kept')",
    )
    .await;
    let error = setup_outbox(&client, &"public.partial".parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.server_number(), Some(51306), "{error}");
    assert!(
        error.to_string().contains("message_id, aggregate_type"),
        "{error}"
    );
    assert_eq!(db.count("public.partial", "topic = 'kept'").await, 1);
    // A sequence with a per-session cache would break the ids' order: refused.
    db.sql("alter sequence public.orders_outbox_id_seq cache 20")
        .await;
    let cached = setup_outbox(&client, &table).await.unwrap_err();
    assert_eq!(cached.server_number(), Some(51306), "{cached}");
    assert!(cached.to_string().contains("cache 1"), "{cached}");
    // Bad messages are refused by the table, with the column named.
    let empty_topic = db
        .client()
        .await
        .execute(
            "insert into public.orders_outbox (message_id, topic, payload) values ('k', '', '{}')",
            &[],
        )
        .await
        .map_err(Error::from)
        .unwrap_err();
    assert!(empty_topic.to_string().contains("check"), "{empty_topic}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn connections_are_read_committed_with_a_statement_timeout() {
    let db = database("session").await;
    let client = changefeed::postgres::connect(&db.config).await.unwrap();
    let show = async |setting: &str| -> String {
        let row = client.query_one(&format!("show {setting}"), &[]).await;
        row.unwrap_or_else(|e| panic!("show {setting}: {e}")).get(0)
    };
    assert_eq!(show("statement_timeout").await, "30s");
    assert_eq!(
        show("default_transaction_isolation").await,
        "read committed"
    );
    let version = changefeed::postgres::server_version(&client).await.unwrap();
    assert!(version.starts_with(char::is_numeric), "{version}");
}

/// A column other than payload and headers that does not decode (text holding a byte that
/// is not UTF-8, which an `SQL_ASCII` database stores as it is given): the claim has
/// committed the row as claimed, so failing the whole claim would claim the same batch and
/// fail again forever. The row is handed over undecodable, naming the column, and the relay
/// marks it dead by id; the rest of the batch, and the dead row's successor, go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn a_column_that_does_not_decode_makes_the_row_undecodable_and_the_relay_goes_on() {
    let db = database_with(
        "odd_column",
        "encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0",
    )
    .await;
    let mut store = db.outbox("public.outbox").await;
    let e = db
        .enqueue_committed(
            "public.outbox",
            &[
                message_of("a", 1),
                message_of("b", 1),
                message_of("c", 1),
                message_of("b", 2),
            ],
        )
        .await;
    let (odd, successor) = (e[1].id, e[3].id);
    db.sql(&format!(
        "update public.outbox set trace_id = E'ab\\xffcd' where id = {odd}"
    ))
    .await;

    let rows = store.claim(10, Duration::from_secs(30)).await.unwrap();
    let ids: Vec<i64> = rows.iter().map(Claimed::id).collect();
    assert_eq!(ids, [e[0].id, odd, e[2].id], "{rows:?}");
    match &rows[1] {
        Claimed::Undecodable(row) => {
            assert!(row.error.contains("trace_id"), "{}", row.error);
            assert_eq!(row.message_id.as_deref(), Some(e[1].message_id.as_str()));
            assert_eq!(row.topic.as_deref(), Some("orders"));
            assert!(row.payload.is_some(), "{row:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(&rows[0], Claimed::Message(_)) && matches!(&rows[2], Claimed::Message(_)));

    // A relay marks it dead and publishes the rest, then the dead row's successor.
    db.sql("update public.outbox set status = 0, claim_token = null")
        .await;
    let recorder = Arc::new(Recorder::default());
    let mut relay = Relay::new(
        db.store("public.outbox"),
        Arc::clone(&recorder),
        RelayConfig::default(),
    )
    .unwrap();
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.dead), (2, 1), "{first:?}");
    let second = relay.run_once().await.unwrap();
    assert_eq!((second.published, second.dead), (1, 0), "{second:?}");
    assert_eq!(
        recorder.ids(),
        BTreeSet::from([e[0].id, e[2].id, successor])
    );
    assert_eq!(
        db.count("public.outbox", &format!("id = {odd} and status = 4"))
            .await,
        1
    );
    assert_eq!(db.count("public.outbox", "status = 2").await, 3);
}

/// The store prepares each statement once per connection. A migration that changes a
/// column the claim returns makes PostgreSQL refuse the prepared claim ("cached plan must
/// not change result type", 0A000), every time it runs, and a lost connection takes every
/// prepared statement with it: after each, the relay prepares again and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn a_relay_prepares_again_after_its_statements_are_invalidated() {
    let db = outbox("prepared").await;
    let recorder = Arc::new(Recorder::default());
    let mut relay = Relay::new(db.store(), Arc::clone(&recorder), RelayConfig::default()).unwrap();
    // Enqueues message `n` and has the relay publish it, retrying a transient failure as
    // `Relay::run` does (a connection found dead only when a call uses it).
    let mut publish = async |n: usize| {
        let id = db.enqueue_committed(&[message_of("p", n)]).await[0].id;
        let mut tries = 0;
        let report = loop {
            match relay.run_once().await {
                Ok(report) => break report,
                Err(error) if error.is_transient() && tries < 2 => tries += 1,
                Err(error) => panic!("message {n}: {error}"),
            }
        };
        assert_eq!(report.published, 1, "message {n}: {report:?}");
        assert!(recorder.ids().contains(&id), "message {n}");
    };
    publish(0).await;

    db.db
        .sql("alter table public.outbox alter column trace_id type varchar(200)")
        .await;
    publish(1).await;

    // The relay's session, by its last statement (the acknowledgement): the test's own
    // closed sessions may still be on their way out.
    let ended = db
        .db
        .scalar(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity \
             where datname = current_database() and pid <> pg_backend_pid() \
             and query like 'update % set status = 2,%'",
        )
        .await;
    assert_eq!(ended, 1, "the relay's connection");
    publish(2).await;
    assert_eq!(db.count("status = 2").await, 3);
}

// ------------------------------------------------------------------------------------------
// 3. Per-aggregate order: ids follow commit order
// ------------------------------------------------------------------------------------------

/// The hazard issue 18 found on MariaDB, on PostgreSQL: transaction 1 draws an id for
/// aggregate A and stays open; transaction 2 draws a later id for A and commits. Were the
/// insert of transaction 2 allowed to go on, its message would be committed, the head of
/// everything the claim can see, and published before transaction 1's. The outbox's
/// ordering trigger makes transaction 2 wait for transaction 1 instead (and draw its id
/// after), while other aggregates go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn a_later_enqueue_of_an_aggregate_waits_for_the_open_earlier_one() {
    let db = outbox("commit_order").await;
    let mut store = db.store();
    let mut first = db.enqueue_open(message_of("a", 1)).await;
    let first_row = first.inserted(Duration::from_secs(30)).await.unwrap();
    let mut second = db.enqueue_open(message_of("a", 2)).await;
    assert!(
        second.inserted(Duration::from_millis(700)).await.is_none(),
        "the second enqueue of aggregate a went ahead while the first is open"
    );
    // Other aggregates neither wait nor are held back.
    let started = Instant::now();
    let b = db.enqueue_committed(&[message_of("b", 1)]).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let claimed = claim_contract::claim(&mut store, 10, claim_contract::HELD).await;
    assert_eq!(claim_contract::ids(&claimed), vec![b[0].id]);

    // Rolled back, the first leaves the way free; the second draws its id only now.
    first.finish(false).await;
    let second_row = second
        .inserted(Duration::from_secs(30))
        .await
        .expect("goes on");
    assert!(
        second_row.id > b[0].id,
        "the id is drawn after the wait, not before"
    );
    assert!(second_row.id > first_row.id);
    second.finish(true).await;
    let claimed = claim_contract::claim(&mut store, 10, claim_contract::HELD).await;
    assert_eq!(claim_contract::ids(&claimed), vec![second_row.id]);
}

/// Rows without an aggregate take no lock: two open transactions enqueue side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn messages_without_an_aggregate_never_wait() {
    let db = outbox("no_aggregate").await;
    let plain = || NewMessage::new("t", serde_json::json!({}));
    let mut one = db.enqueue_open(plain()).await;
    let mut two = db.enqueue_open(plain()).await;
    assert!(one.inserted(Duration::from_secs(10)).await.is_some());
    assert!(
        two.inserted(Duration::from_secs(10)).await.is_some(),
        "waited"
    );
    one.finish(true).await;
    two.finish(true).await;
    assert_eq!(db.count("true").await, 2);
}

/// Which way a claim goes behind a deep backlog (the results are the contract's,
/// `heads_past_a_deep_backlog`): one that fills its batch near the front sends the store to
/// the one statement over every open message; one that fails sends it back to the two steps
/// (the claim near the front, the heads past it), whose last statement, when every head is
/// held, is the reach check only that path asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn a_failed_claim_sends_the_store_back_to_the_two_steps() {
    let db = outbox("reach").await;
    let hot: Vec<NewMessage> = (0..1000).map(|n| message_of("hot", n)).collect();
    let hot = db.enqueue_committed(&hot).await;
    let mut store = db.store();
    let timeout = Duration::from_secs(60);
    let claim = async |store: &mut PostgresOutboxStore, n: u32| -> Vec<i64> {
        let batch = store.claim_batch(n, timeout).await.unwrap();
        batch.iter().map(Claimed::id).collect()
    };
    assert_eq!(claim(&mut store, 1).await, [hot[0].id]);
    let admin = db.db.client().await;
    let rename =
        |from: &str, to: &str| format!("alter table public.outbox rename column {from} to {to}");
    admin
        .batch_execute(&rename("payload", "moved"))
        .await
        .unwrap();
    assert!(store.claim_batch(10, timeout).await.is_err());
    admin
        .batch_execute(&rename("moved", "payload"))
        .await
        .unwrap();
    assert_eq!(claim(&mut store, 10).await, Vec::<i64>::new());
    let asked: i64 = admin
        .query_one(
            "select count(*) from pg_stat_activity where datname = current_database() \
             and pid <> pg_backend_pid() and query like 'select exists (select r.id %'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        asked, 1,
        "the claim after the failure did not take the two steps"
    );
}

// ------------------------------------------------------------------------------------------
// 4. The notify wake
// ------------------------------------------------------------------------------------------

/// One notification per committed transaction, however many rows it enqueued; none for a
/// rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn one_notification_per_committed_transaction() {
    let db = outbox("notify_once").await;
    let (client, mut connection) = db.db.config.connect(tokio_postgres::NoTls).await.unwrap();
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = sender.send(n.channel().to_owned());
            }
        }
    });
    client
        .batch_execute("listen \"changefeed:public.outbox\"")
        .await
        .unwrap();
    let many: Vec<NewMessage> = (0..50).map(|i| message_of(&format!("n{i}"), i)).collect();
    db.enqueue_committed(&many).await;
    let mut rolled_back = db.enqueue_open(message_of("r", 0)).await;
    rolled_back.inserted(Duration::from_secs(10)).await.unwrap();
    rolled_back.finish(false).await;
    db.enqueue_committed(&[message_of("x", 0)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut channels = Vec::new();
    while let Ok(channel) = received.try_recv() {
        channels.push(channel);
    }
    assert_eq!(
        channels,
        vec!["changefeed:public.outbox"; 2],
        "one per commit"
    );
}

/// The waker's two kinds of state the tests wait for.
fn kinds() -> Kinds<WakerState> {
    Kinds {
        awake: |s| matches!(s, WakerState::Listening { .. }),
        polling: |s| matches!(s, WakerState::Polling { .. }),
    }
}

/// Starts a `PostgresWaker` on `config` (the outbox's database, or another) for `handle`'s
/// relay and returns its state.
fn start_waker(
    config: tokio_postgres::Config,
    db: &Outbox,
    settings: PostgresWakerConfig,
) -> impl FnOnce(RelayHandle, watch::Receiver<bool>) -> watch::Receiver<WakerState> {
    let table = db.table.parse().unwrap();
    move |handle, stop| {
        let waker = PostgresWaker::new(config, table, handle, settings);
        let state = waker.state();
        tokio::spawn(waker.run(wake::stopped(stop)));
        state
    }
}

/// Ends the waker's listening session, as a failover or a network cut would. Its last
/// statement is its LISTEN or, a heartbeat later, the empty query of the heartbeat (no other
/// session of the test runs one).
async fn terminate_listeners(db: &TestDb) -> usize {
    let ended = db
        .scalar(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity \
             where datname = current_database() and (query ilike 'listen%' or query = '') \
             and pid <> pg_backend_pid()",
        )
        .await;
    usize::try_from(ended).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn notify_wakes_the_relay_and_listening_resumes_after_a_lost_connection() {
    let db = outbox("notify_wake").await;
    let settings = PostgresWakerConfig {
        fallback_poll: Duration::from_millis(100),
        reconnect_delay: Duration::from_millis(300),
        heartbeat: Duration::from_secs(1),
    };
    let waker = start_waker(db.db.config.clone(), &db, settings);
    let relay = WokenRelay::start_awake(db.store(), kinds(), waker).await;
    let commit = async |n: usize| {
        let e = db
            .enqueue_committed(&[message_of(&format!("w-{n}"), n)])
            .await;
        e[0].id
    };
    let cut = async || terminate_listeners(&db.db).await;
    wake::commits_wake_the_relay_within_milliseconds(&relay, "notify", commit, cut).await;
    relay.stop().await;
}

/// A waker that cannot connect says so and polls: the relay still gets its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn a_waker_that_cannot_listen_polls_instead() {
    let db = outbox("notify_poll").await;
    let mut unreachable = db.db.config.clone();
    unreachable.dbname("no_such_database");
    let settings = PostgresWakerConfig {
        fallback_poll: Duration::from_millis(100),
        ..PostgresWakerConfig::default()
    };
    let waker = start_waker(unreachable, &db, settings);
    let relay = WokenRelay::start(db.store(), kinds(), waker);
    let polling = relay.until_polling(Duration::from_secs(30)).await;
    assert!(
        matches!(&polling, WakerState::Polling { reason } if reason.contains("no_such_database")),
        "{polling:?}"
    );
    let e = db.enqueue_committed(&[message_of("p", 0)]).await;
    assert!(
        relay
            .recorder
            .wait_for(e[0].id, Duration::from_secs(5))
            .await
            .is_some(),
        "polled"
    );
    relay.stop().await;
}

// ------------------------------------------------------------------------------------------
// 5. The command line
// ------------------------------------------------------------------------------------------

/// `changefeed migrate`, `setup-outbox` and `relay` with a postgres:// URL: the outbox is
/// made, a message is printed as a JSON line and acknowledged, and SIGTERM stops the relay
/// with exit status 0.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn the_cli_sets_up_and_relays_a_postgres_outbox() {
    use claim_contract::cli::{cli_message, relays_a_message_as_a_json_line};
    use std::process::Command;

    let db = database("cli").await;
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_changefeed"))
            .args(args)
            .args(["--url", &db.url])
            .output()
            .expect("the changefeed binary runs")
    };
    let migrated = cli(&["migrate"]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        String::from_utf8_lossy(&migrated.stdout).contains("up to date"),
        "{migrated:?}"
    );
    let refused = cli(&["setup-outbox", "Public.Outbox"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("lower-case"),
        "{refused:?}"
    );
    let made = cli(&["setup-outbox", "public.cli_outbox"]);
    assert!(made.status.success(), "{made:?}");
    let missing = cli(&["relay", "--outbox", "public.nothing_here"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("setup-outbox"),
        "{missing:?}"
    );

    let e = db
        .enqueue_committed("public.cli_outbox", &[cli_message()])
        .await;
    let done = async || db.count("public.cli_outbox", "status = 2").await;
    relays_a_message_as_a_json_line(&db.url, "public.cli_outbox", &["--quiet"], &e[0], done).await;
}

/// `purge-outbox` with a postgres:// URL: a done message older than the cutoff goes, a
/// newer one and a dead one stay, and a table that is not an outbox is one line saying to
/// run `setup-outbox`.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn the_cli_purges_a_postgres_outbox() {
    use common_process::{assert_one_error_line, changefeed};

    let db = database("cli_purge").await;
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &db.url]);
        changefeed(&all)
    };
    let made = cli(&["setup-outbox", "public.purged_outbox"]);
    assert!(made.status.success(), "{made:?}");
    let e = db
        .enqueue_committed(
            "public.purged_outbox",
            &[message_of("a", 1), message_of("b", 1), message_of("c", 1)],
        )
        .await;
    db.sql(&format!(
        "update public.purged_outbox set status = 2, processed_at = now() - interval '10 days' \
         where id = {0}; \
         update public.purged_outbox set status = 2, processed_at = now() where id = {1}; \
         update public.purged_outbox set status = 4, processed_at = now() - interval '10 days' \
         where id = {2}",
        e[0].id, e[1].id, e[2].id
    ))
    .await;
    let purged = cli(&["purge-outbox", "public.purged_outbox", "--older-than", "7d"]);
    assert!(purged.status.success(), "{purged:?}");
    assert_eq!(
        String::from_utf8_lossy(&purged.stdout),
        "deleted 1 done message older than 7d from public.purged_outbox\n"
    );
    assert_eq!(
        db.count("public.purged_outbox", &format!("id = {}", e[0].id))
            .await,
        0
    );
    assert_eq!(db.count("public.purged_outbox", "1 = 1").await, 2);

    let missing = cli(&["purge-outbox", "public.nothing_here", "--older-than", "7d"]);
    let line = assert_one_error_line(&missing);
    assert_eq!(missing.status.code(), Some(1), "{line}");
    assert!(
        line.contains("changefeed setup-outbox public.nothing_here"),
        "{line}"
    );
    let bad = cli(&["purge-outbox", "Public.Outbox", "--older-than", "7d"]);
    let line = assert_one_error_line(&bad);
    assert_eq!(bad.status.code(), Some(2), "{line}");
}

/// The backlog counts each status (done rows not at all), and the oldest open message's age
/// by the server's clock; it never waits for an open enqueue, whose row it does not count
/// yet. `status` lists every outbox of the database (the tables setup_outbox made, not a
/// look-alike) with those counts.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: .ci/run installs it; or set CHANGEFEED_TEST_POSTGRES"]
async fn the_backlog_counts_by_status_and_status_lists_every_outbox() {
    use common_process::changefeed;

    let db = database("backlog").await;
    db.outbox("public.busy").await;
    db.outbox("public.idle").await;
    db.sql("create table public.lookalike (id bigint primary key, status smallint)")
        .await;
    let e = db
        .enqueue_committed(
            "public.busy",
            &(0..6)
                .map(|n| message_of(&format!("a{n}"), 1))
                .collect::<Vec<_>>(),
        )
        .await;
    // 2 pending (e0, e1), 1 processing, 1 failed, 1 dead, 1 done; the oldest open message
    // was written a minute ago.
    db.sql(&format!(
        "update public.busy set created_at = now() - interval '1 minute' where id = {0}; \
         update public.busy set status = 1, claimed_at = now(), \
             claim_expires_at = now() + interval '1 minute', claim_token = gen_random_uuid() \
             where id = {1}; \
         update public.busy set status = 3, next_retry_at = now() where id = {2}; \
         update public.busy set status = 4, processed_at = now() where id = {3}; \
         update public.busy set status = 2, processed_at = now() where id = {4}",
        e[0].id, e[2].id, e[3].id, e[4].id, e[5].id
    ))
    .await;
    let mut open = db.client().await;
    let open_tx = open.transaction().await.unwrap();
    enqueue(
        &open_tx,
        &"public.busy".parse().unwrap(),
        &message_of("open", 1),
    )
    .await
    .unwrap();

    let mut store = db.store("public.busy");
    let backlog = tokio::time::timeout(Duration::from_secs(5), store.backlog())
        .await
        .expect("the backlog never waits for an open enqueue")
        .unwrap();
    assert_eq!(
        (
            backlog.pending,
            backlog.processing,
            backlog.failed,
            backlog.dead
        ),
        (2, 1, 1, 1),
        "{backlog:?}"
    );
    let age = backlog.oldest_open_age.expect("messages are open");
    assert!(
        age >= Duration::from_secs(59) && age < Duration::from_secs(120),
        "{age:?}"
    );
    let idle = db.store("public.idle").backlog().await.unwrap();
    assert_eq!(
        (idle.pending, idle.dead, idle.oldest_open_age),
        (0, 0, None)
    );

    let status = changefeed(&["status", "--json", "--url", &db.url]);
    assert!(status.status.success(), "{status:?}");
    let document: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let outboxes = document["outboxes"].as_array().unwrap();
    let names: Vec<&str> = outboxes
        .iter()
        .map(|o| o["outbox"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["public.busy", "public.idle"], "{document}");
    assert_eq!(
        [
            &outboxes[0]["pending"],
            &outboxes[0]["processing"],
            &outboxes[0]["failed"],
            &outboxes[0]["dead"]
        ],
        [2, 1, 1, 1],
        "{document}"
    );
    assert!(outboxes[0]["problem"].is_null(), "{document}");
    let table = changefeed(&["status", "--url", &db.url]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("(no feeds)"), "{table}");
    let busy = table
        .lines()
        .find(|line| line.starts_with("public.busy"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(busy.contains(" 1 min "), "{busy}");
    open_tx.rollback().await.unwrap();
}
