//! A private PostgreSQL for tests: one server per test process, in a temporary directory,
//! reachable only over its Unix socket, stopped when the process ends. Or the server of
//! `CHANGEFEED_TEST_POSTGRES` (a `postgres://` URL of a user that may create databases)
//! when that is set.
//!
//! `initdb`, `pg_ctl` and `postgres` refuse to run as root, so as root they run as the
//! `postgres` user (which Debian's package creates) through `runuser`, and the directory is
//! given to that user.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common_server;

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

/// The directory of `initdb` and `pg_ctl`: Debian keeps them out of PATH, in
/// `pg_config --bindir`.
fn bindir() -> String {
    let output = common_server::run("pg_config", &["--bindir".to_owned()], MISSING);
    assert!(output.status.success(), "pg_config --bindir failed");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program args…`, as the `postgres` user when this process is root.
fn as_server_user(program: &str, args: &str) -> String {
    if is_root() {
        format!("runuser -u postgres -- {program} {args}")
    } else {
        format!("{program} {args}")
    }
}

/// Makes a cluster in a fresh temporary directory and starts it on a socket there (no TCP),
/// tuned for tests (no fsync: nothing here must survive a power cut). The watchdog stops
/// it (fast shutdown) and removes the directory when this process ends.
fn start_private() -> Server {
    let dir = common_server::temp_dir("postgres");
    let d = dir.display().to_string();
    if is_root() {
        let chown = Command::new("chown")
            .args(["postgres:postgres", &d])
            .status()
            .expect("run chown");
        assert!(chown.success(), "chown postgres {d} failed");
    }
    let bin = bindir();
    let init = Command::new("sh")
        .args([
            "-c",
            &as_server_user(
                &format!("{bin}/initdb"),
                &format!("-D '{d}/data' -A trust -U postgres -E UTF8 --locale=C.UTF-8 >'{d}/initdb.log' 2>&1"),
            ),
        ])
        .status()
        .unwrap_or_else(|e| panic!("cannot run initdb: {e}. {MISSING}"));
    assert!(
        init.success(),
        "initdb failed: {}",
        std::fs::read_to_string(dir.join("initdb.log")).unwrap_or_default()
    );
    let options = format!(
        "-k {d} -c listen_addresses= -c max_connections=300 -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off"
    );
    let pg_ctl = format!("{bin}/pg_ctl");
    common_server::watchdog(
        &as_server_user(
            &pg_ctl,
            &format!("-D '{d}/data' -o '{options}' -l '{d}/server.log' start >/dev/null 2>&1"),
        ),
        &format!("test -f '{d}/data/postmaster.pid'"),
        &as_server_user(
            &pg_ctl,
            &format!("-D '{d}/data' -m fast -w stop >/dev/null 2>&1"),
        ),
        &dir,
    );
    let isready = format!("{bin}/pg_isready");
    common_server::wait_until(
        "postgres",
        Duration::from_secs(60),
        &dir.join("server.log"),
        || {
            common_server::run(
                &isready,
                &["-h".into(), d.clone(), "-U".into(), "postgres".into()],
                MISSING,
            )
            .status
            .success()
        },
    );
    Server {
        template: format!("postgres://postgres@/{{db}}?host={d}"),
    }
}
