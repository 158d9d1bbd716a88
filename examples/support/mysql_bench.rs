//! What the MariaDB/MySQL benchmarks share: a database of their own with the bundle and one
//! outbox (and the bare loop's procedure), filling and emptying the outbox, and the bare
//! claim-and-ack loop in SQL that the relay is measured against.

use std::time::{Duration, Instant};

use changefeed::mysql::{OutboxTable, enqueue, migrate, setup_outbox};
use changefeed::outbox::NewMessage;
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, Pool};

use crate::relay_bench::{AGGREGATES, fail};

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
    /// `messages`.
    pub async fn bare_throughput(&self, messages: usize, loops: usize) -> f64 {
        self.reset().await;
        self.fill(messages).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..loops {
            let pool = self.pool.clone();
            tasks.push(tokio::spawn(async move {
                let mut conn = pool.get_conn().await.unwrap_or_else(|e| fail("connect", e));
                conn.query_drop("set session transaction isolation level read committed")
                    .await
                    .unwrap_or_else(|e| fail("bare loop", e));
                // A deadlock victim claimed nothing; call the loop again, as a relay would.
                loop {
                    match conn.query_drop("call bench_bare_loop()").await {
                        Ok(()) => break,
                        Err(mysql_async::Error::Server(e)) if e.code == 1213 => continue,
                        Err(e) => fail("bare loop", e),
                    }
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        messages as f64 / started.elapsed().as_secs_f64().max(1e-9)
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
const BARE_LOOP: &str = "create procedure bench_bare_loop() modifies sql data
begin
    declare claimed int default 1;
    declare token binary(16);
    create temporary table if not exists bench_claimed (id bigint primary key);
    while claimed > 0 do
        set token = unhex(replace(uuid(), '-', ''));
        start transaction;
        delete from bench_claimed;
        insert into bench_claimed (id)
        select t.id from bench_outbox as t force index (open_messages)
        where t.is_open = 1 and t.status = 0
            and not exists (select 1 from bench_outbox as e force index (head_of_aggregate)
                where e.aggregate_id = t.aggregate_id and e.is_open = 1 and e.id < t.id)
        order by t.id limit 100 for update skip locked;
        set claimed = row_count();
        -- straight_join: the claimed ids first, then the outbox by primary key, so the
        -- update locks only the claimed rows.
        update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
        set t.attempts = t.attempts + (t.status = 1), t.status = 1,
            t.claimed_at = utc_timestamp(3), t.claim_token = token;
        commit;
        update bench_claimed as c straight_join bench_outbox as t on t.id = c.id
        set t.status = 2, t.processed_at = utc_timestamp(3), t.last_error = null
        where t.status = 1 and t.claim_token = token;
        if claimed = 0 then
            -- Another loop may hold the last heads; stop only when nothing is open.
            if exists (select 1 from bench_outbox force index (open_messages) where is_open = 1) then
                set claimed = 1;
            end if;
        end if;
    end while;
end";
