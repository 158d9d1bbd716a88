//! What the MariaDB/MySQL benchmarks share: a database of their own with the bundle and one
//! outbox (and the bare loop's procedure), filling and emptying the outbox, and the bare
//! claim-and-ack loop in SQL that the relay is measured against.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use changefeed::mysql::{OutboxTable, enqueue, migrate, setup_outbox};
use changefeed::outbox::NewMessage;
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, Pool};

use crate::cpu;
use crate::relay_bench::{self, AGGREGATES, Stage, fail};

/// A benchmark's database: `cf_bench_<pid>` with the bundle, the outbox `bench_outbox` and
/// the bare loop's procedure.
pub struct BenchDb {
    pub pool: Pool,
    pub opts: Opts,
    pub table: OutboxTable,
    /// The server's version string.
    pub version: String,
    admin: mysql_async::Conn,
    database: String,
}

impl BenchDb {
    /// Creates the database on the server whose URL for a database `url_for` gives.
    pub async fn create(url_for: impl Fn(&str) -> String) -> BenchDb {
        let database = format!("cf_bench_{}", std::process::id());
        let mut admin = mysql_async::Conn::new(
            Opts::from_url(&url_for("mysql")).unwrap_or_else(|e| fail("url", e)),
        )
        .await
        .unwrap_or_else(|e| fail("connect", e));
        admin
            .query_drop(format!(
                "create database `{database}` character set utf8mb4"
            ))
            .await
            .unwrap_or_else(|e| fail("create database", e));
        let opts = changefeed::mysql::opts(&url_for(&database)).unwrap_or_else(|e| fail("url", e));
        let pool = Pool::new(opts.clone());
        migrate(&pool).await.unwrap_or_else(|e| fail("migrate", e));
        let table: OutboxTable = "bench_outbox".parse().unwrap_or_else(|e| fail("name", e));
        let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
        setup_outbox(&mut conn, &table)
            .await
            .unwrap_or_else(|e| fail("setup_outbox", e));
        conn.query_drop(BARE_LOOP)
            .await
            .unwrap_or_else(|e| fail("bare loop procedure", e));
        let version = changefeed::mysql::server_version(&mut conn)
            .await
            .unwrap_or_default();
        drop(conn);
        BenchDb {
            pool,
            opts,
            table,
            version,
            admin,
            database,
        }
    }

    /// Drops the database.
    pub async fn drop_database(mut self) {
        let _ = self
            .admin
            .query_drop(format!("drop database `{}`", self.database))
            .await;
    }

    /// Enqueues `messages` messages over [`AGGREGATES`] aggregates, 1000 per transaction.
    pub async fn fill(&self, messages: usize) {
        let mut conn = self
            .pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e));
        for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
            let mut tx = conn
                .start_transaction(Default::default())
                .await
                .unwrap_or_else(|e| fail("begin", e));
            for n in chunk {
                let message = NewMessage::new("bench", serde_json::json!({ "n": n }))
                    .aggregate("bench", format!("a{}", n % AGGREGATES));
                enqueue(&mut tx, &self.table, &message)
                    .await
                    .unwrap_or_else(|e| fail("enqueue", e));
            }
            tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        }
    }

    /// Inserts `messages` messages over `aggregates` aggregates in one statement on the
    /// server (MariaDB's `seq` engine), for a backlog too deep to enqueue one by one.
    pub async fn fill_on_server(&self, messages: usize, aggregates: usize) {
        self.run(&format!(
            "insert into {} (message_id, topic, aggregate_type, aggregate_id, payload, \
             created_at) select uuid(), 'bench', 'bench', concat('a', seq % {aggregates}), \
             json_object('n', seq), utc_timestamp(3) from seq_0_to_{}",
            self.table.quoted(),
            messages.saturating_sub(1)
        ))
        .await;
    }

    /// Runs `sql` on a connection of the pool; fails the benchmark on an error.
    pub async fn run(&self, sql: &str) {
        let mut conn = self
            .pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e));
        conn.query_drop(sql).await.unwrap_or_else(|e| fail(sql, e));
    }

    /// Enqueues `message` alone in a transaction of its own on `conn` and commits it;
    /// returns the message's id.
    pub async fn commit_one(&self, conn: &mut mysql_async::Conn, message: &NewMessage) -> i64 {
        let mut tx = conn
            .start_transaction(Default::default())
            .await
            .unwrap_or_else(|e| fail("begin", e));
        let enqueued = enqueue(&mut tx, &self.table, message)
            .await
            .unwrap_or_else(|e| fail("enqueue", e));
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        enqueued.id
    }

    /// Empties the outbox.
    pub async fn reset(&self) {
        let mut conn = self
            .pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e));
        conn.query_drop(format!("truncate table {}", self.table.quoted()))
            .await
            .unwrap_or_else(|e| fail("truncate", e));
    }

    /// Whether the outbox has no open message left.
    pub async fn drained(&self) -> bool {
        let mut conn = self
            .pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e));
        let open: Option<i64> = conn
            .query_first(format!(
                "select count(*) from (select 1 from {} force index (open_messages) \
                 where is_open = 1 limit 1) as o",
                self.table.quoted()
            ))
            .await
            .unwrap_or_else(|e| fail("count open messages", e));
        open == Some(0)
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
        relay_bench::bounded(
            (Stage::Baseline, &stage),
            async {
                let meter = cpu::Meter::start(split);
                let started = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..loops {
                    let opts = self.opts.clone();
                    tasks.spawn(async move { bare_loop(opts).await });
                }
                // Kept, not dropped, until the sample below: a connection's server thread
                // may end with it.
                let mut conns = Vec::with_capacity(loops);
                while let Some(done) = tasks.join_next().await {
                    conns.push(done.map_err(|e| e.to_string())??);
                }
                let rate = messages as f64 / started.elapsed().as_secs_f64().max(1e-9);
                meter.stop();
                drop(conns);
                self.report_expired_claims(&stage).await;
                Ok(rate)
            },
            || self.stop_bare_loops(),
        )
        .await
    }

    /// Says on standard error how many rows a bare loop claimed again after their claim
    /// expired (each such claim counted an attempt), when any was.
    async fn report_expired_claims(&self, stage: &str) {
        let mut conn = self
            .pool
            .get_conn()
            .await
            .unwrap_or_else(|e| fail("connect", e));
        let again: Option<i64> = conn
            .query_first(format!(
                "select count(*) from {} where attempts > 0",
                self.table.quoted()
            ))
            .await
            .unwrap_or_else(|e| fail("count expired claims", e));
        if let Some(again) = again.filter(|n| *n > 0) {
            eprintln!("bench: {stage}: {again} row(s) claimed again after their claim expired");
        }
    }

    /// Ends every bare loop still running in the benchmark's database (a stalled stage's).
    async fn stop_bare_loops(&self) {
        let Ok(mut conn) = mysql_async::Conn::new(self.opts.clone()).await else {
            return;
        };
        let running: Vec<u64> = conn
            .query(
                "select id from information_schema.processlist \
                 where db = database() and id <> connection_id() and command = 'Query'",
            )
            .await
            .unwrap_or_default();
        for id in running {
            let _ = conn.query_drop(format!("kill {id}")).await;
        }
    }
}

/// One bare loop on a connection of its own (not the pool's: a stalled loop's connection is
/// killed, and must not be handed to a later stage), until the outbox is drained.
async fn bare_loop(opts: Opts) -> Result<mysql_async::Conn, String> {
    let mut conn = mysql_async::Conn::new(opts)
        .await
        .map_err(|e| e.to_string())?;
    conn.query_drop("set session transaction isolation level read committed")
        .await
        .map_err(|e| e.to_string())?;
    // The procedure retries its own deadlocks; one that escapes it (e.g. from the
    // temporary table's creation) claimed nothing, so the loop is called again.
    loop {
        match conn.query_drop("call bench_bare_loop()").await {
            Ok(()) => return Ok(conn),
            Err(mysql_async::Error::Server(e)) if e.code == 1213 => continue,
            Err(e) => return Err(format!("bare loop: {e}")),
        }
    }
}

/// Waits until `drained` says the outbox is empty, polling every 2 ms.
pub async fn until_drained(db: &BenchDb) {
    while !db.drained().await {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The same claim and acknowledgement, in a stored procedure: no client, no relay, no round
/// trips. Its rate is the ceiling the relay is compared with.
///
/// Written as the relay's claim is, so that it is a ceiling and not a different race:
/// * the heads are read by a plain `select … for update skip locked` (a cursor), whose
///   head probe (the aggregate's first open id, as the store's) reads the outbox without
///   locks. An `insert … select` would take shared
///   locks on the rows its subquery reads (MariaDB does, even in READ COMMITTED), so loops
///   waited on each other's claims and deadlocked with each other's acknowledgements;
/// * a deadlock or lock-wait victim rolls its claim back and claims again, and an
///   acknowledgement is repeated until it lands (it matches only this claim's rows). The bare
///   loop has no claim expiry: an acknowledgement lost to a deadlock left its rows claimed
///   for good, and every loop then spun on them without end (issue 30 item 9);
/// * the claim's token waits in the session's `@bench_unacknowledged` until its
///   acknowledgement lands, at the top of the next turn or of the next call: MariaDB 10.11
///   returns some deadlocks of that multi-table update to the caller although the procedure
///   has a handler for 1213 (a loop's log showed the acknowledgement's one try, then the
///   error), and the batch was then left claimed until its expiry, 5 s (1 round in 3);
/// * as the relay's, its claim expires (after 5 s): rows left claimed by a loop that did not
///   acknowledge them are claimed again, not waited for forever; `bare_throughput` says on
///   standard error when it happened;
/// * a loop that finds no head while other loops hold the last ones sleeps 1 ms instead of
///   scanning the outbox in a hot loop, which starved the loops that were working.
const BARE_LOOP: &str = "create procedure bench_bare_loop() modifies sql data
begin
    declare claimed int default 1;
    declare done bool default false;
    declare failed bool default false;
    declare head bigint;
    declare token binary(16);
    declare heads cursor for
        select t.id from bench_outbox as t force index (open_messages)
        where t.is_open = 1
            and (t.status = 0 or (t.status = 1 and t.claimed_at < utc_timestamp(3) - interval 5 second))
            and coalesce((select e.id from bench_outbox as e force index (head_of_aggregate)
                where e.aggregate_id = t.aggregate_id and e.is_open = 1 order by e.id limit 1),
                t.id) >= t.id
        order by t.id limit 100 for update skip locked;
    declare continue handler for not found set done = true;
    declare continue handler for 1205, 1213 set failed = true;
    create temporary table if not exists bench_claimed (id bigint primary key);
    while claimed > 0 do
        -- The acknowledgement of the last claim, repeated until it lands.
        while @bench_unacknowledged is not null do
            set failed = false;
            update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
            set t.status = 2, t.processed_at = utc_timestamp(3), t.last_error = null
            where t.status = 1 and t.claim_token = @bench_unacknowledged;
            if not failed then
                set @bench_unacknowledged = null;
            end if;
        end while;
        set token = unhex(replace(uuid(), '-', ''));
        set claimed = 0, done = false, failed = false;
        start transaction;
        delete from bench_claimed;
        open heads;
        fetch_heads: loop
            fetch heads into head;
            if done or failed then
                leave fetch_heads;
            end if;
            insert into bench_claimed (id) values (head);
            set claimed = claimed + 1;
        end loop;
        close heads;
        -- straight_join: the claimed ids first, then the outbox by primary key, so the
        -- update locks only the claimed rows.
        if not failed then
            update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
            set t.attempts = t.attempts + (t.status = 1), t.status = 1,
                t.claimed_at = utc_timestamp(3), t.claim_token = token;
        end if;
        if failed then
            rollback;
            set claimed = 1;
        else
            commit;
            -- Acknowledged at the top of the next turn (claimed > 0 makes one), or by the
            -- caller's next call if a deadlock escapes this one.
            set @bench_unacknowledged = token;
        end if;
        if claimed = 0 then
            -- Another loop may hold the last heads; stop only when nothing is open.
            if exists (select 1 from bench_outbox force index (open_messages) where is_open = 1) then
                set claimed = 1;
                do sleep(0.001);
            end if;
        end if;
    end while;
end";
