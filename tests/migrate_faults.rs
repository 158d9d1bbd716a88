//! `migrate` against a scripted server (tests/fake_tds), for what it does with its session
//! rather than what the server computes: it sets the lock timeout in a batch of its own and
//! puts the session's back, tries a migration that met a lock again from where it failed
//! (and gives up after `MIGRATION_ATTEMPTS`, naming it), returns any other failure at once,
//! refuses a connection with an open transaction, runs the regeneration once after the last
//! migration and decodes its report; `migrate_to` never regenerates.

mod fake_tds;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use changefeed::migrations::{self, MIGRATION_ATTEMPTS, ObjectKind, ObjectUpgrade, Outcome};
use changefeed::{Client, Error};
use fake_tds::{FakeServer, Reply, Request, Value};

/// What the regeneration is sent as.
const REGENERATE: &str = "exec changefeed.upgrade_all_feeds @only_outdated = 1;";
/// The session's own lock timeout before `migrate`, which it must put back.
const SESSION_LOCK_TIMEOUT: i32 = -1;

/// A database whose history holds every migration but the last `missing`, and in which the
/// migration `failing` (a version) fails `failures` times with `error` before it applies.
struct Database {
    migrations: Vec<refinery::Migration>,
    applied: Mutex<BTreeSet<i32>>,
    pending: Mutex<Option<i32>>,
    failing: i32,
    error: u32,
    failures: usize,
    attempts: AtomicUsize,
    open_transactions: i32,
}

impl Database {
    fn new(missing: usize, failing_from_last: usize, error: u32, failures: usize) -> Self {
        let migrations = migrations::runner().get_migrations().clone();
        let newest = migrations.len() as i32;
        Database {
            applied: Mutex::new((1..=newest - missing as i32).collect()),
            pending: Mutex::new(None),
            failing: newest - failing_from_last as i32,
            error,
            failures,
            attempts: AtomicUsize::new(0),
            open_transactions: 0,
            migrations,
        }
    }

    fn newest(&self) -> i32 {
        self.migrations.len() as i32
    }

    fn sql_of(&self, version: i32) -> &str {
        self.migrations
            .iter()
            .find(|m| m.version() == version)
            .and_then(|m| m.sql())
            .expect("an embedded migration has its SQL")
    }

    fn reply(&self, request: &Request) -> Reply {
        let text = request.text();
        if text.starts_with("select db_name()") {
            return Reply::Rows {
                columns: vec!["database", "level", "lock_timeout", "transactions"],
                rows: vec![vec![
                    Value::Text(Some("app".to_owned())),
                    Value::Int(160),
                    Value::Int(SESSION_LOCK_TIMEOUT),
                    Value::Int(self.open_transactions),
                ]],
            };
        }
        if text.starts_with("SELECT version, name, applied_on, checksum") {
            return self.history();
        }
        if let Some(values) = text.strip_prefix(&format!(
            "INSERT INTO {} (version, name, applied_on, checksum) VALUES (",
            migrations::HISTORY_TABLE
        )) {
            let version = values.split(',').next().and_then(|v| v.parse().ok());
            *self.pending.lock().unwrap() = version;
            return Reply::Done;
        }
        if text == "COMMIT TRAN T1" {
            if let Some(version) = self.pending.lock().unwrap().take() {
                self.applied.lock().unwrap().insert(version);
            }
            return Reply::Done;
        }
        if text.starts_with("ROLLBACK") || text.starts_with("if @@trancount > 0 rollback") {
            *self.pending.lock().unwrap() = None;
            return Reply::Done;
        }
        if text == self.sql_of(self.failing)
            && self.attempts.fetch_add(1, Ordering::SeqCst) < self.failures
        {
            return Reply::error(self.error, 16, "Lock request time out period exceeded.");
        }
        if text == REGENERATE {
            let row = |kind: &str, name: &str, upgraded: bool, outcome: &str, problem| {
                vec![
                    Value::Text(Some(kind.to_owned())),
                    Value::Text(Some(name.to_owned())),
                    Value::Bit(upgraded),
                    Value::Text(Some(outcome.to_owned())),
                    Value::Text(problem),
                ]
            };
            return Reply::Rows {
                columns: vec!["kind", "name", "upgraded", "outcome", "problem"],
                rows: vec![
                    row("feed", "dbo.Orders", true, "upgraded", None),
                    row(
                        "outbox",
                        "dbo.Outbox",
                        false,
                        "busy",
                        Some("Its locks were busy: run changefeed migrate again.".to_owned()),
                    ),
                ],
            };
        }
        Reply::Done
    }

    /// The history table as refinery reads it: the migrations applied so far.
    fn history(&self) -> Reply {
        let applied = self.applied.lock().unwrap();
        Reply::Rows {
            columns: vec!["version", "name", "applied_on", "checksum"],
            rows: self
                .migrations
                .iter()
                .filter(|m| applied.contains(&m.version()))
                .map(|m| {
                    vec![
                        Value::Int(m.version()),
                        Value::Text(Some(m.name().to_owned())),
                        Value::Text(Some("2026-01-01T00:00:00Z".to_owned())),
                        Value::Text(Some(m.checksum().to_string())),
                    ]
                })
                .collect(),
        }
    }
}

/// A server answering as `database` does, and a connection to it.
async fn serve(database: Database) -> (FakeServer, std::sync::Arc<Database>, Client) {
    let database = std::sync::Arc::new(database);
    let script = std::sync::Arc::clone(&database);
    let server = FakeServer::start(move |_, request| script.reply(request)).await;
    let client = changefeed::connect(&server.ado())
        .await
        .expect("the fake server accepts the login");
    (server, database, client)
}

/// The batches the session sent after its login, in order.
fn batches(server: &FakeServer) -> Vec<String> {
    server.texts_of(0)
}

fn position(batches: &[String], text: &str) -> usize {
    batches
        .iter()
        .position(|b| b == text)
        .unwrap_or_else(|| panic!("{text:?} was not sent: {batches:#?}"))
}

#[tokio::test]
async fn a_migration_that_met_a_lock_is_tried_again_from_where_it_failed() {
    // Three missing; the second of them fails twice for a lock, then applies.
    let (server, database, mut client) = serve(Database::new(3, 1, 1222, 2)).await;

    let report = migrations::migrate(&mut client).await.expect("migrate");

    let newest = database.newest();
    let applied: Vec<i32> = report
        .applied_migrations()
        .iter()
        .map(|m| m.version())
        .collect();
    assert_eq!(
        applied,
        [newest - 2, newest - 1, newest],
        "over all attempts"
    );
    assert_eq!(
        database.attempts.load(Ordering::SeqCst),
        3,
        "two failures, then it"
    );
    assert_eq!(
        report.objects(),
        [
            ObjectUpgrade::new(ObjectKind::Feed, "dbo.Orders", Outcome::Upgraded, None),
            ObjectUpgrade::new(
                ObjectKind::Outbox,
                "dbo.Outbox",
                Outcome::Busy,
                Some("Its locks were busy: run changefeed migrate again.".to_owned())
            ),
        ]
    );
    assert!(!report.is_complete(), "a busy object asks for another run");

    let sent = batches(&server);
    let timeout = position(&sent, "set lock_timeout 2000;");
    assert!(
        timeout < position(&sent, "BEGIN TRAN T1;"),
        "the lock timeout is set before refinery begins: {sent:#?}"
    );
    assert_eq!(
        sent.iter()
            .filter(|b| b.starts_with("if @@trancount > 0 rollback"))
            .count(),
        2,
        "no transaction is left open across a pause: {sent:#?}"
    );
    let regenerate = position(&sent, REGENERATE);
    assert_eq!(
        sent.iter().rposition(|b| b == "COMMIT TRAN T1"),
        Some(regenerate - 1),
        "the regeneration runs once, after the last migration committed: {sent:#?}"
    );
    assert_eq!(
        sent.last().map(String::as_str),
        Some("set lock_timeout -1;"),
        "the session's own lock timeout is put back last: {sent:#?}"
    );
}

#[tokio::test]
async fn a_migration_that_keeps_meeting_a_lock_fails_naming_it_with_the_servers_number() {
    let (server, database, mut client) = serve(Database::new(2, 1, 1222, usize::MAX)).await;

    let error = migrations::migrate(&mut client)
        .await
        .expect_err("every attempt met a lock");

    assert_eq!(error.server_number(), Some(1222), "{error}");
    // By version: refinery's list is not in version order.
    let failing = database
        .migrations
        .iter()
        .find(|m| m.version() == database.failing)
        .expect("the failing version is embedded");
    let text = error.to_string();
    for part in [
        format!("migration {failing}"),
        format!("{MIGRATION_ATTEMPTS} attempts"),
        "Retry at a quieter moment".to_owned(),
    ] {
        assert!(text.contains(&part), "{part:?} in {text}");
    }
    assert_eq!(
        database.attempts.load(Ordering::SeqCst),
        MIGRATION_ATTEMPTS as usize
    );
    let sent = batches(&server);
    assert!(!sent.iter().any(|b| b == REGENERATE), "{sent:#?}");
    assert_eq!(
        sent.last().map(String::as_str),
        Some("set lock_timeout -1;"),
        "{sent:#?}"
    );
}

#[tokio::test]
async fn any_other_failure_of_a_migration_is_returned_at_once() {
    let (server, database, mut client) = serve(Database::new(2, 1, 208, 1)).await;

    let error = migrations::migrate(&mut client)
        .await
        .expect_err("an invalid object name");

    assert_eq!(error.server_number(), Some(208), "{error}");
    assert_eq!(database.attempts.load(Ordering::SeqCst), 1, "not retried");
    assert!(!batches(&server).iter().any(|b| b == REGENERATE));
}

#[tokio::test]
async fn a_connection_with_an_open_transaction_is_refused_before_anything_is_sent() {
    let mut database = Database::new(2, 1, 1222, 0);
    database.open_transactions = 1;
    let (server, _, mut client) = serve(database).await;

    let error = migrations::migrate(&mut client)
        .await
        .expect_err("an open transaction");

    assert!(matches!(error, Error::Migration(_)), "{error}");
    let sent = batches(&server);
    assert_eq!(
        sent.len(),
        1,
        "only the session's state was read: {sent:#?}"
    );
}

#[tokio::test]
async fn migrate_to_stops_at_its_version_and_does_not_regenerate() {
    let (server, database, mut client) = serve(Database::new(3, 0, 1222, 0)).await;
    let newest = database.newest();

    let report = migrations::migrate_to(&mut client, newest - 1)
        .await
        .expect("migrate_to");

    let applied: Vec<i32> = report
        .applied_migrations()
        .iter()
        .map(|m| m.version())
        .collect();
    assert_eq!(applied, [newest - 2, newest - 1]);
    let sent = batches(&server);
    assert!(!sent.iter().any(|b| b == REGENERATE), "{sent:#?}");
    assert_eq!(
        sent.last().map(String::as_str),
        Some("set lock_timeout -1;"),
        "{sent:#?}"
    );
}
