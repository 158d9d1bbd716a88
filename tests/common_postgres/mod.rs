//! Harness of the PostgreSQL live tests: a private server per test binary (server.rs) and a
//! fresh database per test, with the bundle applied.

#![allow(dead_code)] // each test binary uses its own part

pub mod owned;
pub mod server;

use changefeed::outbox::{Enqueued, NewMessage};
use changefeed::postgres::{OutboxTable, PostgresOutboxStore, enqueue, migrate, setup_outbox};
use tokio_postgres::{Client, Config};

/// One test's database.
pub struct TestDb {
    /// The database's name.
    pub name: String,
    /// Its connection string.
    pub url: String,
    /// Its connection settings (with the crate's time limits).
    pub config: Config,
}

/// A fresh database `cf_<name>` (dropped first if a previous run left it) with the
/// PostgreSQL bundle applied.
pub async fn database(name: &str) -> TestDb {
    database_with(name, "").await
}

/// [`database`], created with `options` after `create database <name>` (e.g.
/// `encoding 'SQL_ASCII' template template0`).
pub async fn database_with(name: &str, options: &str) -> TestDb {
    let server = server::server();
    database_on(name, options, |database| server.url_for(database)).await
}

/// [`database_with`] on the server whose URLs `url_for` makes from a database's name.
pub async fn database_on(name: &str, options: &str, url_for: impl Fn(&str) -> String) -> TestDb {
    let name = format!("cf_{name}");
    let admin = connect_to(&url_for("postgres")).await;
    // Two statements: CREATE DATABASE cannot run in the implicit transaction of a batch.
    for statement in [
        format!("drop database if exists {name} with (force)"),
        format!("create database {name} {options}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .map_err(changefeed::Error::from)
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let url = url_for(&name);
    let config = changefeed::postgres::config(&url).expect("a valid URL");
    let mut client = connect_to(&url).await;
    migrate(&mut client)
        .await
        .unwrap_or_else(|e| panic!("migrate {name}: {e}"));
    TestDb { name, url, config }
}

async fn connect_to(url: &str) -> Client {
    let config = changefeed::postgres::config(url).expect("a valid URL");
    changefeed::postgres::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test server ({url}): {e}"))
}

impl TestDb {
    /// A connection of the test's own.
    pub async fn client(&self) -> Client {
        connect_to(&self.url).await
    }

    /// Creates the outbox `table` (`schema.table`) and returns a store over it with a
    /// connection of its own.
    pub async fn outbox(&self, table: &str) -> PostgresOutboxStore {
        let parsed: OutboxTable = table.parse().expect("a valid outbox name");
        setup_outbox(&self.client().await, &parsed)
            .await
            .unwrap_or_else(|e| panic!("setup_outbox {table}: {e}"));
        self.store(table)
    }

    /// Another store (another connection) over an existing outbox.
    pub fn store(&self, table: &str) -> PostgresOutboxStore {
        PostgresOutboxStore::new(table.parse().expect("a valid name"), self.config.clone())
    }

    /// Enqueues `messages` into `outbox` in one committed transaction.
    pub async fn enqueue_committed(&self, outbox: &str, messages: &[NewMessage]) -> Vec<Enqueued> {
        let table: OutboxTable = outbox.parse().expect("a valid outbox name");
        let mut client = self.client().await;
        let tx = client.transaction().await.unwrap();
        let mut enqueued = Vec::new();
        for message in messages {
            enqueued.push(
                enqueue(&tx, &table, message)
                    .await
                    .unwrap_or_else(|e| panic!("enqueue {message:?}: {e}")),
            );
        }
        tx.commit().await.unwrap();
        enqueued
    }

    /// Runs statements that must succeed.
    pub async fn sql(&self, text: &str) {
        self.client()
            .await
            .batch_execute(text)
            .await
            .map_err(changefeed::Error::from)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }

    /// The first column of the first row of `query`, as a bigint.
    pub async fn scalar(&self, query: &str) -> i64 {
        self.client()
            .await
            .query_one(query, &[])
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"))
            .get(0)
    }

    /// `count(*)` of `table` where `condition`.
    pub async fn count(&self, table: &str, condition: &str) -> i64 {
        self.scalar(&format!("select count(*) from {table} where {condition}"))
            .await
    }
}
