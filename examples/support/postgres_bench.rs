//! What the PostgreSQL claim-outbox benchmarks share: a database of their own with the
//! bundle and one outbox (and the bare loop's procedure), filling and emptying the outbox,
//! single-message commits, and the bare claim-and-ack loop in SQL that the relay is
//! measured against.

use std::cell::RefCell;
use std::time::Duration;

use changefeed::outbox::NewMessage;
use changefeed::postgres::{OutboxTable, connect, enqueue, migrate, setup_outbox};
use tokio_postgres::{Client, Config};

use crate::relay_bench::{self, AGGREGATES, Stage, fail};
use crate::{cpu, stats};

/// The outbox, in the benchmark's database.
const TABLE: &str = "public.bench_outbox";

/// A benchmark's database: `cf_bench_<pid>` with the bundle, the outbox `bench_outbox` and
/// the bare loop's procedure.
pub struct BenchDb {
    pub config: Config,
    pub table: OutboxTable,
    /// The server's version string.
    pub version: String,
    admin: Client,
    database: String,
}

/// A connection of its own to `config`'s database.
pub async fn client(config: &Config) -> Client {
    connect(config).await.unwrap_or_else(|e| fail("connect", e))
}

impl BenchDb {
    /// Creates the database on the server whose URL for a database `url_for` gives.
    pub async fn create(url_for: impl Fn(&str) -> String) -> BenchDb {
        let database = format!("cf_bench_{}", std::process::id());
        let admin_config =
            changefeed::postgres::config(&url_for("postgres")).unwrap_or_else(|e| fail("url", e));
        let admin = client(&admin_config).await;
        admin
            .batch_execute(&format!("create database {database}"))
            .await
            .unwrap_or_else(|e| fail("create database", changefeed::Error::from(e)));
        let config =
            changefeed::postgres::config(&url_for(&database)).unwrap_or_else(|e| fail("url", e));
        let mut setup = client(&config).await;
        migrate(&mut setup)
            .await
            .unwrap_or_else(|e| fail("migrate", e));
        let table: OutboxTable = TABLE.parse().unwrap_or_else(|e| fail("name", e));
        setup_outbox(&setup, &table)
            .await
            .unwrap_or_else(|e| fail("setup_outbox", e));
        setup
            .batch_execute(BARE_LOOP)
            .await
            .unwrap_or_else(|e| fail("bare loop procedure", changefeed::Error::from(e)));
        let version = changefeed::postgres::server_version(&setup)
            .await
            .unwrap_or_default();
        BenchDb {
            config,
            table,
            version,
            admin,
            database,
        }
    }

    /// Drops the database (and ends the sessions still in it).
    pub async fn drop_database(self) {
        let _ = self
            .admin
            .batch_execute(&format!("drop database {} with (force)", self.database))
            .await;
    }

    /// Runs `sql` (statements named `what` in a failure) on a connection of its own.
    async fn execute(&self, sql: &str, what: &str) {
        client(&self.config)
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| fail(what, changefeed::Error::from(e)));
    }

    /// Enqueues `messages` messages over [`AGGREGATES`] aggregates, 1000 per transaction,
    /// and refreshes the outbox's statistics (as autovacuum would for a long-lived outbox).
    pub async fn fill(&self, messages: usize) {
        let mut client = client(&self.config).await;
        for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
            let tx = client
                .transaction()
                .await
                .unwrap_or_else(|e| fail("begin", e));
            for n in chunk {
                let message = NewMessage::new("bench", serde_json::json!({ "n": n }))
                    .aggregate("bench", format!("a{}", n % AGGREGATES));
                enqueue(&tx, &self.table, &message)
                    .await
                    .unwrap_or_else(|e| fail("enqueue", e));
            }
            tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        }
        let analyze = format!("analyze {}", self.table);
        self.execute(&analyze, "analyze").await;
    }

    /// Enqueues `messages` messages over `aggregates` aggregates (`a0`, `a1`, … in turn) in
    /// one statement on the server, and refreshes the outbox's statistics: a backlog of
    /// hundreds of thousands in seconds. The outbox's trigger orders each row as it does for
    /// [`enqueue`].
    pub async fn fill_on_server(&self, messages: usize, aggregates: usize) {
        let sql = format!(
            "insert into {0} (message_id, topic, aggregate_type, aggregate_id, payload) \
             select gen_random_uuid()::text, 'bench', 'bench', 'a' || (n % {aggregates}), \
             json_build_object('n', n) from generate_series(0, {1}) as n; analyze {0}",
            self.table,
            messages.saturating_sub(1)
        );
        self.execute(&sql, "fill on the server").await;
    }

    /// Empties the outbox and refreshes its statistics, so every run starts alike.
    pub async fn reset(&self) {
        let sql = format!("truncate table {0}; analyze {0}", self.table);
        self.execute(&sql, "truncate").await;
    }

    /// Enqueues `message` alone in a transaction of its own on `client` and commits it;
    /// returns the message's id.
    pub async fn commit_one(&self, client: &mut Client, message: &NewMessage) -> i64 {
        let tx = client
            .transaction()
            .await
            .unwrap_or_else(|e| fail("begin", e));
        let enqueued = enqueue(&tx, &self.table, message)
            .await
            .unwrap_or_else(|e| fail("enqueue", e));
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        enqueued.id
    }

    /// Whether the outbox has no open message left (pending, claimed or failed to retry).
    async fn drained(&self, client: &Client) -> bool {
        let sql = format!(
            "select not exists (select 1 from {} where status in (0, 1, 3))",
            self.table
        );
        client
            .query_one(&sql, &[])
            .await
            .map(|row| row.get::<_, bool>(0))
            .unwrap_or_else(|e| fail("count open messages", changefeed::Error::from(e)))
    }

    /// Waits until the outbox is drained, polling every 2 ms on one connection.
    pub async fn until_drained(&self) {
        let client = client(&self.config).await;
        while !self.drained(&client).await {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Messages per second through `loops` concurrent bare loops, from a full outbox of
    /// `messages`, within [`STAGE_LIMIT`](relay_bench::STAGE_LIMIT); `None` (said on
    /// standard error) when a loop failed or the stage stalled, and then no loop is left
    /// running on the server.
    /// With `split`, what the machine's threads spent while the loops ran is added to it.
    pub async fn bare_throughput(
        &self,
        messages: usize,
        loops: usize,
        split: Option<&RefCell<cpu::Split>>,
    ) -> Option<f64> {
        self.reset().await;
        self.fill(messages).await;
        let stage = format!("{loops} bare SQL loop(s)");
        let run = async {
            let meter = cpu::Meter::start(split);
            let started = std::time::Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..loops {
                let config = self.config.clone();
                // Two simple queries: in one, the procedure would run inside the implicit
                // transaction of a multi-statement query and could not commit (2D000).
                tasks.spawn(async move {
                    let client = client(&config).await;
                    for sql in ["set statement_timeout = 0", "call bench_bare_loop()"] {
                        client
                            .batch_execute(sql)
                            .await
                            .map_err(|e| format!("bare loop: {}", changefeed::Error::from(e)))?;
                    }
                    // Returned, not dropped: its server process (and its CPU time) is
                    // there until the sample below.
                    Ok::<Client, String>(client)
                });
            }
            let mut clients = Vec::with_capacity(loops);
            while let Some(done) = tasks.join_next().await {
                clients.push(done.map_err(|e| e.to_string())??);
            }
            let rate = stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0);
            meter.stop();
            drop(clients);
            Ok(rate)
        };
        // A stalled loop runs on in its server process until it is told to stop.
        let stop = async || {
            let _ = client(&self.config)
                .await
                .batch_execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity \
                     where datname = current_database() and pid <> pg_backend_pid() \
                     and query = 'call bench_bare_loop()'",
                )
                .await;
        };
        relay_bench::bounded((Stage::Baseline, &stage), run, stop).await
    }
}

/// A connection with the bare loop's claim and acknowledgement prepared on it.
struct ClientStatements {
    client: Client,
    claim: tokio_postgres::Statement,
    ack: tokio_postgres::Statement,
}

/// A failure of the client's statements, as text naming `what`.
fn why(what: &'static str) -> impl Fn(tokio_postgres::Error) -> String {
    move |e| format!("{what}: {}", changefeed::Error::from(e))
}

impl ClientStatements {
    async fn prepare(db: &BenchDb) -> Result<Self, String> {
        let client = client(&db.config).await;
        let claim = client.prepare(CLIENT_CLAIM).await.map_err(why("prepare"))?;
        let ack = client.prepare(CLIENT_ACK).await.map_err(why("prepare"))?;
        Ok(ClientStatements { client, claim, ack })
    }

    /// One claim, acknowledged when it took anything: how many it took.
    async fn claim_and_ack(&self) -> Result<usize, String> {
        let token = uuid::Uuid::new_v4();
        let rows = self
            .client
            .query(&self.claim, &[&token])
            .await
            .map_err(why("claim"))?;
        if !rows.is_empty() {
            let ids: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
            self.client
                .execute(&self.ack, &[&ids, &token])
                .await
                .map_err(why("acknowledge"))?;
        }
        Ok(rows.len())
    }
}

/// Messages per second through one loop, in the client, of the bare loop's two statements
/// (prepared once; the claim returns only the ids): the bare loop with a round trip per
/// statement added, and none of the store's decoding. Between it and the bare loop lie the
/// round trips; between it and a loop of the store's calls, the store's decoding of every
/// claimed column.
pub async fn client_loop_throughput(db: &BenchDb, messages: usize) -> Result<f64, String> {
    db.reset().await;
    db.fill(messages).await;
    let statements = ClientStatements::prepare(db).await?;
    let started = std::time::Instant::now();
    loop {
        if statements.claim_and_ack().await? == 0 {
            if db.drained(&statements.client).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0))
}

/// Milliseconds each of `claims` claims of [`BATCH`](relay_bench::BATCH) took through
/// [`CLIENT_CLAIM`] (the claim over every open message) with its acknowledgement, and the
/// messages they claimed in all.
pub async fn client_claims(db: &BenchDb, claims: usize) -> Result<(Vec<f64>, usize), String> {
    let statements = ClientStatements::prepare(db).await?;
    let (mut times, mut claimed) = (Vec::with_capacity(claims), 0);
    for _ in 0..claims {
        let started = std::time::Instant::now();
        claimed += statements.claim_and_ack().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((times, claimed))
}

/// [`BARE_LOOP`]'s claim, the token a parameter.
const CLIENT_CLAIM: &str = "with due as (
    select t.id from public.bench_outbox as t
    where t.status in (0, 1, 3)
        and (t.status = 0
            or (t.status = 3 and t.next_retry_at <= now())
            or (t.status = 1 and t.claim_expires_at < now()))
        and not exists (select 1 from public.bench_outbox as e
            where e.aggregate_id = t.aggregate_id and e.status in (0, 1, 3) and e.id < t.id)
    order by t.id limit 100
    for update skip locked)
update public.bench_outbox as t
set attempts = t.attempts + (t.status = 1)::int, status = 1, claimed_at = now(),
    claim_expires_at = now() + interval '1 minute', claim_token = $1
from due where t.id = due.id
returning t.id";

/// [`BARE_LOOP`]'s acknowledgement.
const CLIENT_ACK: &str = "update public.bench_outbox
set status = 2, processed_at = now(), last_error = null
where id = any($1) and status = 1 and claim_token = $2";

/// The same claim (the store's statement, batch 100) and acknowledgement by id and token,
/// in a procedure: no client, no relay, no round trips, each step its own transaction as
/// the relay's are. When another loop holds the last heads it sleeps 5 ms, the relays'
/// poll interval in the no-op figures. Its rate is the ceiling the relay is compared with.
const BARE_LOOP: &str = "create procedure bench_bare_loop() language plpgsql as $$
declare
    claimed bigint[];
    token uuid;
begin
    loop
        token := gen_random_uuid();
        with due as (
            select t.id from public.bench_outbox as t
            where t.status in (0, 1, 3)
                and (t.status = 0
                    or (t.status = 3 and t.next_retry_at <= now())
                    or (t.status = 1 and t.claim_expires_at < now()))
                and not exists (select 1 from public.bench_outbox as e
                    where e.aggregate_id = t.aggregate_id and e.status in (0, 1, 3)
                        and e.id < t.id)
            order by t.id limit 100
            for update skip locked),
        taken as (
            update public.bench_outbox as t
            set attempts = t.attempts + (t.status = 1)::int, status = 1, claimed_at = now(),
                claim_expires_at = now() + interval '1 minute', claim_token = token
            from due where t.id = due.id
            returning t.id)
        select array_agg(id) into claimed from taken;
        commit;
        if claimed is null then
            -- Another loop may hold the last heads; stop only when nothing is open.
            exit when not exists (
                select 1 from public.bench_outbox where status in (0, 1, 3));
            perform pg_sleep(0.005);
        else
            update public.bench_outbox
            set status = 2, processed_at = now(), last_error = null
            where id = any(claimed) and status = 1 and claim_token = token;
            commit;
        end if;
    end loop;
end $$";
