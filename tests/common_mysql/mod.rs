//! Harness of the MariaDB live tests: a private server per test binary (server.rs) and a
//! fresh database per test, with the bundle applied.

#![allow(dead_code)] // each test binary uses its own part

pub mod owned;
pub mod server;

use changefeed::mysql::{MysqlOutboxStore, OutboxTable, enqueue, migrate, setup_outbox};
use changefeed::outbox::{Enqueued, NewMessage};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool, Transaction};
use std::time::{Duration, Instant};

/// One test's database.
pub struct TestDb {
    /// The database's name.
    pub name: String,
    /// Its `mysql://` URL.
    pub url: String,
    /// Its connection options.
    pub opts: Opts,
    /// A pool for the test's own statements.
    pub pool: Pool,
}

/// A fresh database `cf_<name>` (dropped first if a previous run left it) with the
/// MariaDB/MySQL bundle applied.
pub async fn database(name: &str) -> TestDb {
    let server = server::server();
    database_on(name, |database| server.url_for(database)).await
}

/// [`database`] on the server whose URL of a database `url_for` gives (e.g. an
/// [`owned::OwnedServer`]'s).
pub async fn database_on(name: &str, url_for: impl Fn(&str) -> String) -> TestDb {
    let db = empty_database(name, url_for).await;
    migrate(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("migrate {}: {e}", db.name));
    db
}

/// A fresh database `cf_<name>` with the bundle applied up to `version` only: a database
/// of an earlier release, for upgrade tests.
pub async fn database_at(name: &str, version: i32) -> TestDb {
    let server = server::server();
    let db = empty_database(name, |database| server.url_for(database)).await;
    let mut pool = db.pool.clone();
    changefeed::mysql::runner()
        .set_target(refinery::Target::Version(version))
        .run_async(&mut pool)
        .await
        .unwrap_or_else(|e| panic!("migrate {} to V{version}: {e}", db.name));
    db
}

/// A fresh, empty database `cf_<name>` (dropped first if a previous run left it) on the
/// server whose URL of a database `url_for` gives.
async fn empty_database(name: &str, url_for: impl Fn(&str) -> String) -> TestDb {
    let name = format!("cf_{name}");
    let mut admin = Conn::new(Opts::from_url(&url_for("mysql")).expect("the server URL"))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
    admin
        .query_drop(format!(
            "drop database if exists `{name}`; create database `{name}` \
             character set utf8mb4 collate utf8mb4_bin"
        ))
        .await
        .unwrap_or_else(|e| panic!("cannot create database {name}: {e}"));
    admin.disconnect().await.ok();
    let url = url_for(&name);
    let opts = changefeed::mysql::opts(&url).expect("a valid URL");
    let pool = Pool::new(opts.clone());
    TestDb {
        name,
        url,
        opts,
        pool,
    }
}

impl TestDb {
    /// A connection of the test's own (REPEATABLE READ, the server's default).
    pub async fn conn(&self) -> Conn {
        self.pool
            .get_conn()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }

    /// A transaction on a connection of its own (REPEATABLE READ, the server's default),
    /// open until the test commits or rolls it back (dropped, it is rolled back).
    pub async fn transaction(&self) -> Transaction<'static> {
        self.pool
            .start_transaction(Default::default())
            .await
            .unwrap_or_else(|e| panic!("start a transaction in {}: {e}", self.name))
    }

    /// Enqueues `message` into `outbox` in a [`transaction`](Self::transaction) it leaves
    /// open (holding the aggregate's lock), and returns it with the row.
    pub async fn enqueue_open(
        &self,
        outbox: &str,
        message: &NewMessage,
    ) -> (Transaction<'static>, Enqueued) {
        let table: OutboxTable = outbox.parse().expect("a valid outbox name");
        let mut tx = self.transaction().await;
        let row = enqueue(&mut tx, &table, message)
            .await
            .unwrap_or_else(|e| panic!("enqueue {message:?}: {e}"));
        (tx, row)
    }

    /// Creates the outbox `table` and returns a store over it with a connection of its own.
    pub async fn outbox(&self, table: &str) -> MysqlOutboxStore {
        let table: OutboxTable = table.parse().expect("a valid outbox name");
        setup_outbox(&mut self.conn().await, &table)
            .await
            .unwrap_or_else(|e| panic!("setup_outbox {table}: {e}"));
        self.store(table.name())
    }

    /// Enqueues `messages` into `outbox` in one committed transaction.
    pub async fn enqueue_committed(&self, outbox: &str, messages: &[NewMessage]) -> Vec<Enqueued> {
        let table: OutboxTable = outbox.parse().expect("a valid outbox name");
        let mut tx = self.transaction().await;
        let mut enqueued = Vec::new();
        for message in messages {
            enqueued.push(
                enqueue(&mut tx, &table, message)
                    .await
                    .unwrap_or_else(|e| panic!("enqueue {message:?}: {e}")),
            );
        }
        tx.commit().await.unwrap();
        enqueued
    }

    /// Another store (another connection) over an existing outbox.
    pub fn store(&self, table: &str) -> MysqlOutboxStore {
        MysqlOutboxStore::new(table.parse().expect("a valid name"), self.opts.clone())
    }

    /// Runs statements that must succeed.
    pub async fn sql(&self, text: &str) {
        self.conn()
            .await
            .query_drop(text)
            .await
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }

    /// The first column of the first row of `query`, as an integer.
    pub async fn scalar(&self, query: &str) -> i64 {
        let value: Option<i64> = self
            .conn()
            .await
            .query_first(query)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        value.unwrap_or_else(|| panic!("{query} returned no row"))
    }

    /// Kills the binlog dump connections of this database's binlog wakers (as a failover or
    /// a network cut would) and returns how many there were.
    pub async fn kill_binlog_dumps(&self) -> usize {
        let mut conn = self.conn().await;
        let ids: Vec<u64> = conn
            .query(
                "select id from information_schema.processlist \
                 where command = 'Binlog Dump' and db = database()",
            )
            .await
            .unwrap_or_else(|e| panic!("list the binlog dumps: {e}"));
        for id in &ids {
            // Gone already is as good as killed.
            let _ = conn.query_drop(format!("kill {id}")).await;
        }
        ids.len()
    }

    /// The binlog file the server writes now (`SHOW MASTER STATUS`).
    pub async fn binlog_file(&self) -> String {
        let row: Option<mysql_async::Row> = self
            .conn()
            .await
            .query_first("show master status")
            .await
            .unwrap_or_else(|e| panic!("show master status: {e}"));
        let file: Option<String> = row.expect("binary logging is on").get(0);
        file.expect("a binlog file")
    }

    /// `count(*)` of `table` where `condition`.
    pub async fn count(&self, table: &str, condition: &str) -> i64 {
        self.scalar(&format!("select count(*) from `{table}` where {condition}"))
            .await
    }

    /// Whether [`count`](Self::count) of `table` where `condition` reaches `count` within
    /// `limit`.
    pub async fn count_reaches(
        &self,
        table: &str,
        condition: &str,
        count: i64,
        limit: Duration,
    ) -> bool {
        poll_until(limit, async || self.count(table, condition).await >= count).await
    }
}

/// Polls `condition` every 50 ms: `true` once it holds, `false` when `limit` passed first.
pub async fn poll_until(limit: Duration, mut condition: impl AsyncFnMut() -> bool) -> bool {
    let started = Instant::now();
    while !condition().await {
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}
