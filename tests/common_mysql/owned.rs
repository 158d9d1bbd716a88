//! A MariaDB of one test's own, for fault tests: frozen (`SIGSTOP`), thawed (`SIGCONT`),
//! killed (`kill -9`) and restarted on the same data directory without disturbing the
//! tests that share the process's server (server.rs). Stopped and removed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::server::{install, server_args, wait_until_up};

/// How long a (re)start may take before the test fails.
const START_LIMIT: Duration = Duration::from_secs(120);

/// The server process and its directory.
pub struct OwnedServer {
    dir: PathBuf,
    child: Option<Child>,
}

impl OwnedServer {
    /// Installs a data directory in a fresh temporary directory and starts the server.
    pub fn start(name: &str) -> Self {
        let dir = crate::common_server::temp_dir(&format!("mariadb-{name}"));
        // Owned before the install, so that a failing install still removes the directory.
        let mut server = OwnedServer { dir, child: None };
        install(&server.d());
        server.launch();
        server
    }

    fn d(&self) -> String {
        self.dir.display().to_string()
    }

    fn launch(&mut self) {
        let child = Command::new("mariadbd")
            .args(server_args(&self.d()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start mariadbd: {error}"));
        self.child = Some(child);
        wait_until_up(&self.d(), START_LIMIT);
    }

    /// Starts a server of its own (`name`) with a fresh database of the same name on it,
    /// the bundle applied.
    pub async fn with_database(name: &str) -> (Self, super::TestDb) {
        let server = Self::start(name);
        let db = super::database_on(name, |database| server.url_for(database)).await;
        (server, db)
    }

    /// A `mysql://` URL of `database` on this server (over its socket).
    pub fn url_for(&self, database: &str) -> String {
        format!("mysql://root@localhost/{database}?socket={}/sock", self.d())
    }

    /// The server's process id (to freeze it from inside a publisher, say).
    pub fn pid(&self) -> libc::pid_t {
        let child = self.child.as_ref().expect("the server runs");
        libc::pid_t::try_from(child.id()).expect("a pid")
    }

    fn signal(&self, signal: libc::c_int) {
        send_signal(self.pid(), signal);
    }

    /// Freezes the server: its sockets stay open, nothing answers (a server that lost
    /// power or hangs, as a client sees it).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen server go on.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// `kill -9`: the server dies without a word, its connections are reset.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Starts the server again on the same data directory (crash recovery) and waits
    /// until it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for OwnedServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A frozen server ignores everything but SIGKILL; thaw it anyway so that its
            // state is sane for the kill.
            self.thaw();
        }
        self.kill();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// kill(2) of `pid` with `signal`, which must succeed.
pub fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid of a child of this process and a valid signal number.
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal})");
}
