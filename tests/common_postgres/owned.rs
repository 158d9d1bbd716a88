//! A PostgreSQL of one test's own, for fault tests: frozen (`SIGSTOP` to the postmaster and
//! every backend), thawed, killed (`kill -9` of them all) and restarted on the same data
//! directory (crash recovery) without disturbing the tests that share the process's server
//! (server.rs). Stopped and removed when dropped, and by its watchdog if the test process
//! dies first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::server::private_postgres::PrivatePostgres;
use super::server::{init, wait_until_ready};

/// The owned servers' settings. Unlike the shared server's, commits are synchronous: a
/// commit acknowledged must survive the `kill -9` of the server (with
/// `synchronous_commit=off` the last commits, acknowledgements among them, are lost, and
/// their messages published again). `fsync` stays off: a killed server's writes are in the
/// operating system's cache, which survives it.
const SETTINGS: &str = "-c max_connections=100 -c fsync=off -c full_page_writes=off";

/// The server and its directory.
pub struct OwnedServer {
    dir: PathBuf,
    postgres: PrivatePostgres,
}

impl OwnedServer {
    /// Makes a cluster in a fresh temporary directory and starts it.
    pub fn start(name: &str) -> Self {
        let dir = crate::common_server::temp_dir(&format!("postgres-{name}"));
        let postgres = init(&dir);
        postgres
            .start_watched(SETTINGS)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_until_ready(&postgres, &dir);
        OwnedServer { dir, postgres }
    }

    /// Starts a server of its own (`name`) with a fresh database `cf_<name>` on it, the
    /// bundle applied.
    pub async fn with_database(name: &str) -> (Self, super::TestDb) {
        let server = Self::start(name);
        let db = super::database_on(name, "", |database| server.url_for(database)).await;
        (server, db)
    }

    /// A `postgres://` URL of `database` on this server (over its socket).
    pub fn url_for(&self, database: &str) -> String {
        self.postgres.url_template().replace("{db}", database)
    }

    /// Freezes the server: its sockets stay open and nothing answers (a server that lost
    /// power or hangs, as a client sees it). The postmaster first, so that it starts no
    /// process while the others are stopped.
    pub fn freeze(&self) {
        freeze(&self.dir);
    }

    /// What [`freeze`](Self::freeze)s this server, for a publisher to call from inside a
    /// relay (the relay's connections exist by then).
    pub fn freezer(&self) -> impl FnOnce() + Send + 'static {
        let dir = self.dir.clone();
        move || freeze(&dir)
    }

    /// Lets a frozen server go on.
    pub fn thaw(&self) {
        signal(&server_pids(&self.dir), libc::SIGCONT);
    }

    /// `kill -9` of the postmaster and every process of the server: it dies without a
    /// word, and its connections are reset. Returns once they are all gone.
    pub fn kill(&self) {
        // Listed before: once the postmaster is dead, its children are no longer its.
        let pids = server_pids(&self.dir);
        signal(&pids, libc::SIGKILL);
        let started = Instant::now();
        while pids.iter().any(|pid| exists(*pid)) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the killed server's processes are still there"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server and starts it again on the same data directory (crash recovery);
    /// returns once it accepts connections.
    pub fn restart(&self) {
        self.kill();
        let status = Command::new("sh")
            .args(["-c", &self.postgres.start_command(SETTINGS)])
            .status()
            .unwrap_or_else(|error| panic!("cannot run pg_ctl start: {error}"));
        assert!(
            status.success(),
            "pg_ctl start failed:\n{}",
            self.postgres.log()
        );
        wait_until_ready(&self.postgres, &self.dir);
    }
}

impl Drop for OwnedServer {
    fn drop(&mut self) {
        // A frozen server ignores the stop; thaw it first.
        self.thaw();
        let _ = Command::new("sh")
            .args(["-c", &self.postgres.stop_command()])
            .status();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn freeze(dir: &Path) {
    signal(&server_pids(dir), libc::SIGSTOP);
}

/// Sends `signal` to each of `pids` in turn.
fn signal(pids: &[libc::pid_t], signal: libc::c_int) {
    for &pid in pids {
        // SAFETY: kill(2) with a valid signal number; a process that is gone already
        // (ESRCH) is no error here.
        unsafe { libc::kill(pid, signal) };
    }
}

/// The postmaster's pid (from `postmaster.pid`), then its children's (from `/proc`);
/// nothing when the server is not running. A lock file left by a killed server names a
/// pid that another process may have by now: only a `postgres` process counts.
fn server_pids(dir: &Path) -> Vec<libc::pid_t> {
    let Some(postmaster) = std::fs::read_to_string(dir.join("data/postmaster.pid"))
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse::<libc::pid_t>().ok())
        .filter(|pid| is_postgres(*pid))
    else {
        return Vec::new();
    };
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if parent_of(pid) == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the parenthesized name).
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a process of the PostgreSQL server (its command name).
fn is_postgres(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

/// Whether `pid` is still there: running, or a zombie not yet reaped, which a new postmaster
/// would take for the old one still running (its lock file names that pid).
fn exists(pid: libc::pid_t) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}
