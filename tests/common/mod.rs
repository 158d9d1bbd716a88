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

pub mod claims;
pub mod events;
pub mod load;
pub mod logins;
#[path = "../../examples/live_suite/report.rs"]
pub mod report;
pub mod sessions;
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
            let container = match MssqlServer::default().with_accept_eula().start().await {
                Ok(container) => container,
                Err(error) => {
                    // The test thread panics with this, so that it names the cause.
                    let _ = sender.send(Err(format!(
                        "no SQL Server for the live tests: {SERVER_VARIABLE} is not set and \
                         testcontainers could not start mcr.microsoft.com/mssql/server ({error}). \
                         Set {SERVER_VARIABLE} to an ADO.NET connection string, or start Docker."
                    )));
                    return;
                }
            };
            let port = container
                .get_host_port_ipv4(1433)
                .await
                .expect("the container's mapped port 1433");
            let ado = format!(
                "server=tcp:127.0.0.1,{port};user=sa;password={};TrustServerCertificate=true",
                MssqlServer::DEFAULT_SA_PASSWORD
            );
            sender
                .send(Ok(ado))
                .expect("the harness waits for the address");
            // Keep the container (and this runtime) alive for the rest of the process.
            std::future::pending::<()>().await;
            drop(container);
        });
    });
    match receiver.recv() {
        Ok(Ok(ado)) => Server { ado },
        Ok(Err(message)) => panic!("{message}"),
        Err(_) => panic!("the test container's thread ended without reporting the server address"),
    }
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
    let pause = std::time::Duration::from_millis(500);
    connect_retrying(60, pause, || config(database))
        .await
        .unwrap_or_else(|last_error| {
            panic!("cannot connect to the test server's {database}: {last_error:?}")
        })
}

/// Connects with the configuration `config` makes, up to `attempts` times with `pause`
/// between them (a server, or a login just created, may refuse for a moment); else the last
/// error.
pub async fn connect_retrying(
    attempts: u32,
    pause: std::time::Duration,
    config: impl Fn() -> Config,
) -> Result<Client, Option<changefeed::Error>> {
    let mut last_error = None;
    for _ in 0..attempts {
        match changefeed::connection::connect_with(config()).await {
            Ok(client) => return Ok(client),
            Err(error) => {
                last_error = Some(error);
                tokio::time::sleep(pause).await;
            }
        }
    }
    Err(last_error)
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

/// `setup_feed` of `table` (`schema.table`) in outbox mode.
pub fn setup_outbox_feed(table: &str) -> String {
    format!("exec changefeed.setup_feed @table_name = N'{table}', @outbox = 1;")
}

/// How many feeds the registry (`changefeed.feeds`) holds.
pub async fn registered_feeds(client: &mut Client) -> i64 {
    scalar_i64(client, "select count_big(*) from changefeed.feeds;").await
}

/// The server's error of a batch that must fail: its number and its message.
pub async fn exec_failure(client: &mut Client, sql: &str) -> (u32, String) {
    match exec(client, sql).await {
        Ok(()) => panic!("`{sql}` succeeded; it must fail"),
        Err(error) => (
            error
                .server_number()
                .unwrap_or_else(|| panic!("`{sql}`: not a server error: {error}")),
            error.to_string(),
        ),
    }
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

/// Enqueues `messages` with `store` in one transaction on `client` and commits it.
pub async fn enqueue_committed(
    store: &changefeed::outbox_store::OutboxStore,
    client: &mut Client,
    messages: &[changefeed::outbox::NewMessage],
) -> Vec<changefeed::outbox::Enqueued> {
    exec(client, "begin transaction;")
        .await
        .expect("begin transaction");
    let mut enqueued = Vec::with_capacity(messages.len());
    for message in messages {
        let result = store
            .enqueue(client, message)
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "enqueue to topic {:?} of {}: {error}",
                    message.topic,
                    store.table()
                )
            });
        enqueued.push(result);
    }
    exec(client, "commit transaction;")
        .await
        .expect("commit transaction");
    enqueued
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
        Self::create_at(label, isolation, None).await
    }

    /// [`TestDb::create`] with the bundle applied only up to `version` when one is given
    /// (an older release's database, for the upgrade test), else all of it.
    pub async fn create_at(label: &str, isolation: Isolation, version: Option<i32>) -> TestDb {
        Self::create_with(label, isolation, version, None).await
    }

    /// [`TestDb::create`] in a database whose default collation is `collation` (e.g.
    /// `Latin1_General_100_CI_AS_SC_UTF8`, SQL Server 2019 and later).
    pub async fn create_collated(label: &str, isolation: Isolation, collation: &str) -> TestDb {
        Self::create_with(label, isolation, None, Some(collation)).await
    }

    /// [`TestDb::create_collated`] with the bundle applied only up to `version` (an older
    /// release's database in that collation, for the upgrade test).
    pub async fn create_collated_at(
        label: &str,
        isolation: Isolation,
        version: i32,
        collation: &str,
    ) -> TestDb {
        Self::create_with(label, isolation, Some(version), Some(collation)).await
    }

    async fn create_with(
        label: &str,
        isolation: Isolation,
        version: Option<i32>,
        collation: Option<&str>,
    ) -> TestDb {
        let collate = collation.map_or_else(String::new, |c| format!(" collate {c}"));
        let name = format!(
            "changefeed_{label}_{}_{}",
            DATABASE_COUNTER.fetch_add(1, Ordering::SeqCst),
            std::process::id()
        );
        let mut master = connect_to("master").await;
        exec(
            &mut master,
            &format!(
                "if db_id(N'{name}') is not null begin alter database [{name}] set single_user with rollback immediate; drop database [{name}]; end; create database [{name}]{collate};"
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
        match version {
            None => {
                changefeed::migrations::migrate(&mut client)
                    .await
                    .expect("apply the changefeed bundle");
            }
            Some(version) => {
                changefeed::migrations::migrate_to(&mut client, version)
                    .await
                    .unwrap_or_else(|error| {
                        panic!("apply the changefeed bundle up to V{version}: {error}")
                    });
            }
        }
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
/// fresh database with the whole bundle applied. A database is dropped when its scenario
/// returns; when the scenario panics, the database is kept to look at, the other setting
/// still runs (so a report shows both), and then the first panic fails the test.
///
/// With [`report::REPORT_VARIABLE`] naming a file, each run appends one line to it: the
/// scenario (test binary and test name), the setting, passed or failed (with the panic's
/// message) and how long it took, database creation included. `cargo run --example
/// live_suite` reads it back.
pub async fn under_both_isolations(label: &str, scenario: impl AsyncFn(&TestDb)) {
    run_under_both_isolations(label, None, None, scenario).await;
}

/// [`under_both_isolations`] in databases whose default collation is `collation`.
pub async fn under_both_isolations_collated(
    label: &str,
    collation: &str,
    scenario: impl AsyncFn(&TestDb),
) {
    run_under_both_isolations(label, None, Some(collation), scenario).await;
}

/// A case-sensitive UTF-8 collation (SQL Server 2019 and later) that is not the server's
/// default, so that a database in it differs from tempdb in case sensitivity or code page
/// or both: `Latin1_General_100_CS_AS_SC_UTF8`, or `Latin1_General_100_BIN2_UTF8` on a
/// server whose default is that one.
pub async fn case_sensitive_utf8_collation() -> &'static str {
    const PREFERRED: &str = "Latin1_General_100_CS_AS_SC_UTF8";
    let mut master = connect_to("master").await;
    let server = rows(
        &mut master,
        "select convert(nvarchar(128), serverproperty('Collation')) as collation;",
    )
    .await
    .expect("the server's collation");
    let server: Option<&str> = server
        .first()
        .and_then(|row| row.try_get::<&str, usize>(0).ok().flatten());
    if server == Some(PREFERRED) {
        "Latin1_General_100_BIN2_UTF8"
    } else {
        PREFERRED
    }
}

/// Declares one live test, in a line above its scenario: `test_name: "label" => scenario`
/// is an `#[ignore]`d test on tokio's multi-thread runtime with four workers that runs
/// `scenario` (an `async fn(&TestDb)`: setup, action, expectation) under
/// [`under_both_isolations`] with `label`; `current_thread test_name: …` runs on tokio's
/// default runtime, and `once_locking test_name: …` runs the scenario once, under
/// [`under_locking_read_committed`], for what does not depend on the setting (the registry's
/// refusals). `test_name: "label" => with_logins("a", "b") scenario` runs `scenario(db,
/// &[login_a, login_b])` under both settings with new logins named after "a" and "b"
/// ([`logins::with_logins`]: dropped afterwards). Attributes (`#[doc]`…) go first, inside
/// the call.
///
/// ```ignore
/// common::live_test!(rows_come_in_commit_order: "commit_order" => commit_order);
/// common::live_test!(current_thread pages_of_three: "paging" => paging);
/// ```
#[allow(unused_macros)] // a test binary without SQL Server scenarios
macro_rules! live_test {
    ($(#[$meta:meta])* current_thread $name:ident: $label:literal => $scenario:expr) => {
        $(#[$meta])*
        #[tokio::test]
        #[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
        async fn $name() {
            $crate::common::under_both_isolations($label, $scenario).await;
        }
    };
    ($(#[$meta:meta])* once_locking $name:ident: $label:literal => $scenario:expr) => {
        $(#[$meta])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
        async fn $name() {
            $crate::common::under_locking_read_committed($label, $scenario).await;
        }
    };
    ($(#[$meta:meta])* $name:ident: $label:literal => with_logins($($what:literal),+) $scenario:expr) => {
        $(#[$meta])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
        async fn $name() {
            $crate::common::under_both_isolations($label, async |db: &$crate::common::TestDb| {
                let logins = async |logins: &_| $scenario(db, logins).await;
                $crate::common::logins::with_logins(db, [$($what),+], logins).await;
            })
            .await;
        }
    };
    ($(#[$meta:meta])* $name:ident: $label:literal => $scenario:expr) => {
        $(#[$meta])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
        async fn $name() {
            $crate::common::under_both_isolations($label, $scenario).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use live_test;

/// Runs `scenario` once, in a fresh database with the bundle applied and
/// READ_COMMITTED_SNAPSHOT off, for a scenario the setting cannot change. The database is
/// dropped when the scenario returns, and kept to look at when it panics.
pub async fn under_locking_read_committed(label: &str, scenario: impl AsyncFn(&TestDb)) {
    let db = TestDb::create(label, Isolation::LockingReadCommitted).await;
    scenario(&db).await;
    db.drop_database().await;
}

/// [`under_both_isolations`] on databases migrated only up to `version`, as an older
/// release of the bundle left them: the scenario itself migrates further.
pub async fn under_both_isolations_from(
    label: &str,
    version: i32,
    scenario: impl AsyncFn(&TestDb),
) {
    run_under_both_isolations(label, Some(version), None, scenario).await;
}

async fn run_under_both_isolations(
    label: &str,
    version: Option<i32>,
    collation: Option<&str>,
    scenario: impl AsyncFn(&TestDb),
) {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;

    let name = scenario_name(label);
    let mut first_panic = None;
    for isolation in ISOLATIONS {
        let started = std::time::Instant::now();
        let run = async {
            let db = TestDb::create_with(label, isolation, version, collation).await;
            eprintln!("-- {label}: {isolation:?} in {}", db.name);
            scenario(&db).await;
            db.drop_database().await;
        };
        let outcome = AssertUnwindSafe(run).catch_unwind().await;
        let rcsi = Some(isolation == Isolation::ReadCommittedSnapshot);
        let record = match &outcome {
            Ok(()) => report::Record::passed(&name, rcsi, started.elapsed()),
            Err(payload) => report::Record::failed(
                &name,
                rcsi,
                started.elapsed(),
                &report::panic_message(payload.as_ref()),
            ),
        };
        write_record(&record);
        if let Err(payload) = outcome {
            first_panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = first_panic {
        std::panic::resume_unwind(payload);
    }
}

/// `<test binary>::<test name> (<label>)`: libtest names each test's thread after the
/// test (when it runs tests on the main thread, with one test thread, only the label is
/// left); the label tells apart the scenarios of a test that runs several, and is part of
/// the database's name.
fn scenario_name(label: &str) -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            // cargo names a test binary <target>-<16 hex digits of hash>.
            Some((target, hash))
                if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
            {
                target.to_owned()
            }
            _ => stem,
        })
        .unwrap_or_else(|| "live".to_owned());
    match std::thread::current().name() {
        Some(test) if test != "main" => format!("{binary}::{test} ({label})"),
        _ => format!("{binary}::{label}"),
    }
}

/// Appends `record` to the report file, if one is asked for. A report that cannot be
/// written fails the test: the runner would otherwise print a table with runs missing.
fn write_record(record: &report::Record) {
    let Some(path) = std::env::var_os(report::REPORT_VARIABLE).filter(|p| !p.is_empty()) else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    if let Err(error) = report::append(&path, record) {
        panic!(
            "cannot append to the live report {} ({} is set): {error}",
            path.display(),
            report::REPORT_VARIABLE
        );
    }
}
