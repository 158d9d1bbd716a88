//! A private PostgreSQL for tests: one server per test process, in a temporary directory,
//! reachable only over its Unix socket, stopped when the process ends. Or the server of
//! `CHANGEFEED_TEST_POSTGRES` (a `postgres://` URL of a user that may create databases)
//! when that is set.
//!
//! How the server is made and started (as the `postgres` user when root, socket only) is
//! examples/support/private_postgres.rs, which the quick start uses too; this file adds
//! the watchdog and the wait.

use std::sync::OnceLock;
use std::time::Duration;

use crate::common_server;

// The private server's recipe, shared with the quick start (and owned.rs).
#[path = "../../examples/support/private_postgres.rs"]
pub mod private_postgres;
use private_postgres::PrivatePostgres;

/// The environment variable naming an existing server instead of a private one.
pub const URL_VARIABLE: &str = "CHANGEFEED_TEST_POSTGRES";

/// How to get the server when it is missing.
const MISSING: &str = "The PostgreSQL live tests need postgresql (apt-get install -y \
    postgresql; .ci/run does it), or set CHANGEFEED_TEST_POSTGRES to a postgres:// URL of a \
    server where the user may create databases";

/// Where the server is.
pub struct Server {
    /// A `postgres://` URL whose path is `{db}`.
    template: String,
}

impl Server {
    /// A `postgres://` URL of `database` on this server.
    pub fn url_for(&self, database: &str) -> String {
        self.template.replace("{db}", database)
    }
}

/// The process's server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match common_server::url_template_from(URL_VARIABLE) {
        Some(template) => Server { template },
        None => start_private(),
    })
}

/// Makes a cluster in a fresh temporary directory and starts it on a socket there (no TCP),
/// tuned for tests (no fsync: nothing here must survive a power cut). The watchdog stops
/// it (fast shutdown) and removes the directory when this process ends.
fn start_private() -> Server {
    let dir = common_server::temp_dir("postgres");
    let postgres = init(&dir);
    postgres
        .start_watched(SETTINGS)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_until_ready(&postgres, &dir);
    Server {
        template: postgres.url_template(),
    }
}

/// The private server's settings, tuned for tests.
const SETTINGS: &str =
    "-c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off";

/// A new cluster in `dir`, or a panic that says how to get PostgreSQL.
pub fn init(dir: &std::path::Path) -> PrivatePostgres {
    PrivatePostgres::init(dir).unwrap_or_else(|e| panic!("{e}. {MISSING}"))
}

/// Waits (a minute at most) until the server in `dir` accepts connections.
pub fn wait_until_ready(postgres: &PrivatePostgres, dir: &std::path::Path) {
    common_server::wait_until(
        "postgres",
        Duration::from_secs(60),
        &dir.join("server.log"),
        || postgres.is_ready(),
    );
}
