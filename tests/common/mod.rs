//! The live-test harness: a SQL Server for the whole test process, and a fresh database,
//! with the changefeed bundle applied, for every scenario.
//!
//! The server is `CHANGEFEED_TEST_MSSQL` (an ADO.NET connection string with a login that
//! may create databases and logins) when it is set; otherwise SQL Server 2022 started with
//! testcontainers. Every live test is `#[ignore]`d: run them with `cargo test -- --ignored`.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use changefeed::Client;
use futures::TryStreamExt;
use tiberius::{Config, QueryItem, Row};

pub mod events;
pub mod load;
pub mod logins;
pub mod tasks;

/// The environment variable naming the test server.
pub const SERVER_VARIABLE: &str = "CHANGEFEED_TEST_MSSQL";

/// Both isolation settings every scenario runs under.
pub const ISOLATIONS: [Isolation; 2] = [
    Isolation::LockingReadCommitted,
    Isolation::ReadCommittedSnapshot,
];

/// The database setting a scenario runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// READ_COMMITTED_SNAPSHOT OFF: plain reads take shared locks.
    LockingReadCommitted,
    /// READ_COMMITTED_SNAPSHOT ON (Azure SQL Database's default): reads use row versions.
    ReadCommittedSnapshot,
}

struct Server {
    ado: String,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static DATABASE_COUNTER: AtomicU32 = AtomicU32::new(0);

fn server() -> &'static Server {
    SERVER.get_or_init(|| match std::env::var(SERVER_VARIABLE) {
        Ok(ado) if !ado.trim().is_empty() => Server { ado },
        _ => start_container(),
    })
}

/// Starts SQL Server 2022 once, on a runtime of its own that outlives every test's runtime.
/// The container is kept for the whole process (a static is never dropped).
fn start_container() -> Server {
    use testcontainers::runners::AsyncRunner;
    use testcontainers_modules::mssql_server::MssqlServer;

    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the test container");
        runtime.block_on(async move {
            let container = MssqlServer::default()
                .with_accept_eula()
                .start()
                .await
                .unwrap_or_else(|error| {
                    panic!(
                        "no SQL Server for the live tests: {SERVER_VARIABLE} is not set and \
                         testcontainers could not start mcr.microsoft.com/mssql/server ({error}). \
                         Set {SERVER_VARIABLE} to an ADO.NET connection string, or start Docker."
                    )
                });
            let port = container
                .get_host_port_ipv4(1433)
                .await
                .expect("the container's mapped port 1433");
            let ado = format!(
                "server=tcp:127.0.0.1,{port};user=sa;password={};TrustServerCertificate=true",
                MssqlServer::DEFAULT_SA_PASSWORD
            );
            sender.send(ado).expect("the harness waits for the address");
            // Keep the container (and this runtime) alive for the rest of the process.
            std::future::pending::<()>().await;
            drop(container);
        });
    });
    let ado = receiver
        .recv()
        .expect("the container thread reports the server address");
    Server { ado }
}

/// The harness's connection configuration for `database` of the test server.
pub fn config(database: &str) -> Config {
    let mut config = Config::from_ado_string(&server().ado)
        .unwrap_or_else(|error| panic!("{SERVER_VARIABLE} is not a valid ADO string: {error}"));
    config.database(database);
    config
}

/// A new connection to `database` of the test server. SQL Server in a fresh container
/// accepts logins a little after it reports ready, so connecting retries for a while.
pub async fn connect_to(database: &str) -> Client {
    let mut last_error = None;
    for _ in 0..60 {
        match changefeed::connection::connect_with(config(database)).await {
            Ok(client) => return client,
            Err(error) => {
                last_error = Some(error);
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
    panic!("cannot connect to the test server's {database}: {last_error:?}");
}

/// The ADO string of the test server for `database`, for code under test that connects
/// by itself (pools, CLI).
pub fn ado_for(database: &str) -> String {
    format!("{};database={database}", server().ado.trim_end_matches(';'))
}

/// Runs a batch (no parameters) and drains every result, so an error anywhere in it fails.
pub async fn exec(client: &mut Client, sql: &str) -> Result<(), changefeed::Error> {
    let mut stream = client.simple_query(sql).await?;
    while stream.try_next().await?.is_some() {}
    Ok(())
}

/// Runs a batch and returns the rows of all its result sets, in order.
pub async fn rows(client: &mut Client, sql: &str) -> Result<Vec<Row>, changefeed::Error> {
    let mut stream = client.simple_query(sql).await?;
    let mut rows = Vec::new();
    while let Some(item) = stream.try_next().await? {
        if let QueryItem::Row(row) = item {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A scalar i64 from the first column of the first row of `sql`.
pub async fn scalar_i64(client: &mut Client, sql: &str) -> i64 {
    let rows = rows(client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let row = rows.first().unwrap_or_else(|| panic!("{sql}: no row"));
    match row.try_get::<i64, usize>(0) {
        Ok(Some(value)) => value,
        _ => i64::from(
            row.try_get::<i32, usize>(0)
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("{sql}: not an integer")),
        ),
    }
}

/// A database of its own for one scenario, with the changefeed bundle applied.
pub struct TestDb {
    /// The database's name.
    pub name: String,
    /// The setting it runs under.
    pub isolation: Isolation,
}

impl TestDb {
    /// Creates `changefeed_<label>_<n>_<pid>` with READ_COMMITTED_SNAPSHOT as asked and
    /// applies the migrations.
    pub async fn create(label: &str, isolation: Isolation) -> TestDb {
        let name = format!(
            "changefeed_{label}_{}_{}",
            DATABASE_COUNTER.fetch_add(1, Ordering::SeqCst),
            std::process::id()
        );
        let mut master = connect_to("master").await;
        exec(
            &mut master,
            &format!(
                "if db_id(N'{name}') is not null begin alter database [{name}] set single_user with rollback immediate; drop database [{name}]; end; create database [{name}];"
            ),
        )
        .await
        .expect("create the test database");
        let rcsi = match isolation {
            Isolation::LockingReadCommitted => "off",
            Isolation::ReadCommittedSnapshot => "on",
        };
        // Cannot run inside a transaction, so never inside a migration: tests set it here.
        exec(
            &mut master,
            &format!("alter database [{name}] set read_committed_snapshot {rcsi} with rollback immediate;"),
        )
        .await
        .expect("set READ_COMMITTED_SNAPSHOT");
        let db = TestDb { name, isolation };
        let mut client = db.client().await;
        changefeed::migrations::migrate(&mut client)
            .await
            .expect("apply the changefeed bundle");
        db
    }

    /// A new connection to this database.
    pub async fn client(&self) -> Client {
        connect_to(&self.name).await
    }

    /// The ADO string of this database.
    pub fn ado(&self) -> String {
        ado_for(&self.name)
    }

    /// Drops the database (called when a scenario passed; a failed one is kept to look at).
    pub async fn drop_database(self) {
        let mut master = connect_to("master").await;
        let name = &self.name;
        let _ = exec(
            &mut master,
            &format!(
                "alter database [{name}] set single_user with rollback immediate; drop database [{name}];"
            ),
        )
        .await;
    }
}

/// Runs `scenario` once with READ_COMMITTED_SNAPSHOT off and once with it on, each in a
/// fresh database. A database is dropped when its scenario returns; when the scenario
/// panics, the panic unwinds past the drop and the database is kept to look at.
pub async fn under_both_isolations(label: &str, scenario: impl AsyncFn(&TestDb)) {
    for isolation in ISOLATIONS {
        let db = TestDb::create(label, isolation).await;
        eprintln!("-- {label}: {isolation:?} in {}", db.name);
        scenario(&db).await;
        db.drop_database().await;
    }
}
