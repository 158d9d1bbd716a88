//! Real SQL logins for the role tests: created per test database, dropped afterwards.

use std::time::Duration;

use changefeed::{Client, Feed};

use super::{TestDb, exec};

/// A SQL login and its database user, created for one test database.
pub struct Login {
    /// The login's (and its user's) name.
    pub name: String,
    password: String,
}

impl Login {
    /// `cf_<what>_<database>` with a fresh random password (letters, digits and '!': safe
    /// unquoted in an ADO string and in an N'...' literal).
    pub fn new(what: &str, db: &TestDb) -> Login {
        Login {
            name: format!("cf_{what}_{}", db.name),
            password: format!("Cf1!{:032x}", rand::random::<u128>()),
        }
    }

    /// Creates the login and its user in the test database, adds the user to each of
    /// `roles` (bracketed), and runs each of `grants` (e.g. `grant insert on t to`) for it.
    pub async fn create(&self, admin: &mut Client, roles: &[String], grants: &[String]) {
        let name = &self.name;
        let memberships: String = roles
            .iter()
            .map(|role| format!("alter role {role} add member [{name}]; "))
            .collect();
        let grants: String = grants
            .iter()
            .map(|grant| format!("{grant} [{name}]; "))
            .collect();
        exec(
            admin,
            &format!(
                "if suser_id(N'{name}') is not null drop login [{name}]; \
                 create login [{name}] with password = N'{password}', check_policy = off; \
                 create user [{name}] for login [{name}]; {memberships}{grants}",
                password = self.password
            ),
        )
        .await
        .unwrap_or_else(|error| panic!("create login {name}: {error}"));
    }

    /// A connection as this login to the test database: the harness's configuration with
    /// SQL Server authentication as this login.
    pub async fn connect(&self, db: &TestDb) -> Client {
        let config = || {
            let mut config = super::config(&db.name);
            config.authentication(tiberius::AuthMethod::sql_server(&self.name, &self.password));
            config
        };
        super::connect_retrying(10, Duration::from_millis(300), config)
            .await
            .unwrap_or_else(|last_error| panic!("cannot connect as {}: {last_error:?}", self.name))
    }
}

/// Runs `scenario` with new logins named after `whats` (see [`Login::new`]; the scenario
/// creates them with the roles it needs) and drops them afterwards even when the scenario
/// panics: logins are server-level objects that outlive the test database. A panic then
/// goes on.
pub async fn with_logins<const N: usize>(
    db: &TestDb,
    whats: [&str; N],
    scenario: impl AsyncFnOnce(&[Login; N]),
) {
    use futures::FutureExt;
    let logins = whats.map(|what| Login::new(what, db));
    let outcome = std::panic::AssertUnwindSafe(scenario(&logins))
        .catch_unwind()
        .await;
    drop_logins(db, &logins.iter().collect::<Vec<_>>()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Drops the logins' users and the logins, best effort: a login cannot be dropped while a
/// session of it is open, so its sessions (only ever this test's) are ended first.
pub async fn drop_logins(db: &TestDb, logins: &[&Login]) {
    let mut admin = db.client().await;
    for login in logins {
        let name = &login.name;
        if let Err(error) = exec(
            &mut admin,
            &format!("if database_principal_id(N'{name}') is not null drop user [{name}];"),
        )
        .await
        {
            eprintln!("-- cleanup: drop user {name}: {error}");
        }
        let mut dropped = false;
        for _ in 0..20 {
            let _ = exec(
                &mut admin,
                &format!(
                    "declare @kill nvarchar(max) = (select string_agg(concat(N'kill ', \
                     session_id), N'; ') from sys.dm_exec_sessions where login_name = N'{name}' \
                     and session_id <> @@spid); if @kill is not null exec (@kill);"
                ),
            )
            .await;
            match exec(
                &mut admin,
                &format!("if suser_id(N'{name}') is not null drop login [{name}];"),
            )
            .await
            {
                Ok(()) => {
                    dropped = true;
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        if !dropped {
            eprintln!("-- cleanup: could not drop login {name}; drop it by hand");
        }
    }
}

/// The table of `feed` that `object` names: `outbox`, `feed`, `state` or `event table`.
fn feed_table(feed: &Feed, object: &str) -> String {
    match object {
        "outbox" => feed.outbox_table(),
        "feed" | "state" => feed.object(object),
        "event table" => feed.quoted_table(),
        other => panic!("{other} is not one of a feed's tables"),
    }
}

/// `select * from` the table of `feed` that `object` names (see [`feed_table`]), and what
/// that is when `who` tries it: a statement for [`super::tasks::expect_denied`].
pub fn selects_from(feed: &Feed, who: &str, object: &str) -> (String, String) {
    (
        format!("select * from {};", feed_table(feed, object)),
        format!("{who} selects from the {object}"),
    )
}

/// `delete from` the table of `feed` that `object` names, as [`selects_from`].
pub fn deletes_from(feed: &Feed, who: &str, object: &str) -> (String, String) {
    (
        format!("delete from {};", feed_table(feed, object)),
        format!("{who} deletes from the {object}"),
    )
}
