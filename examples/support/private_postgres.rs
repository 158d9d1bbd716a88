//! A private PostgreSQL from the installed binaries, in a directory of its own, reachable
//! only over a Unix socket there (`listen_addresses=''`): what the quick start falls back
//! to, and what the PostgreSQL live tests start (tests/common_postgres/server.rs includes
//! this file, so both use one copy).
//!
//! `initdb`, `pg_ctl` and `postgres` refuse to run as root, so as root they run as the
//! `postgres` user (which Debian's package creates) through `runuser`, and the directory is
//! given to that user. Debian keeps the binaries out of PATH, in `pg_config --bindir`.

#![allow(dead_code)] // the quick start and the tests each use their part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What to install when the binaries are missing.
pub const INSTALL: &str = "apt-get install -y postgresql";

/// A cluster made in `dir` (its data in `dir/data`, its socket in `dir`).
pub struct PrivatePostgres {
    /// The directory of the cluster, its socket and its logs.
    pub dir: PathBuf,
    /// The directory of `initdb`, `pg_ctl` and `pg_isready`.
    bin: String,
}

/// The directory of the server binaries (`pg_config --bindir`), or why there is none.
pub fn bindir() -> Result<String, String> {
    let output = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("pg_config cannot run ({error})"))?;
    if !output.status.success() {
        return Err("pg_config --bindir failed".to_owned());
    }
    let bin = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !Path::new(&bin).join("initdb").exists() {
        return Err(format!(
            "{bin}/initdb does not exist (only the client is installed)"
        ));
    }
    Ok(bin)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program args…` as shell text, as the `postgres` user when this process is root.
fn as_server_user(program: &str, args: &str) -> String {
    if is_root() {
        format!("runuser -u postgres -- {program} {args}")
    } else {
        format!("{program} {args}")
    }
}

/// Runs shell text; its failure is the text and `log`'s content.
fn shell(text: &str, log: &Path) -> Result<(), String> {
    let status = Command::new("sh")
        .args(["-c", text])
        .stdin(Stdio::null())
        .status()
        .map_err(|error| format!("cannot run sh: {error}"))?;
    if status.success() {
        Ok(())
    } else {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        Err(format!("{text} failed: {}", log.trim()))
    }
}

impl PrivatePostgres {
    /// Makes a cluster in `dir` (which must exist and be empty) with `initdb`: trust
    /// authentication for the `postgres` user, UTF-8.
    pub fn init(dir: &Path) -> Result<Self, String> {
        let bin = bindir()?;
        let d = dir.display();
        if is_root() {
            let chown = Command::new("chown")
                .args(["postgres:postgres", &d.to_string()])
                .status()
                .map_err(|error| format!("cannot run chown: {error}"))?;
            if !chown.success() {
                return Err(format!(
                    "chown postgres {d} failed (is there a postgres user?)"
                ));
            }
        }
        shell(
            &as_server_user(
                &format!("{bin}/initdb"),
                &format!(
                    "-D '{d}/data' -A trust -U postgres -E UTF8 --locale=C.UTF-8 \
                     >'{d}/initdb.log' 2>&1"
                ),
            ),
            &dir.join("initdb.log"),
        )?;
        Ok(PrivatePostgres {
            dir: dir.to_owned(),
            bin,
        })
    }

    /// Shell text that starts the server (not waiting for it) with these extra `-c`
    /// settings, e.g. `-c fsync=off`; its log goes to `dir/server.log`.
    pub fn start_command(&self, settings: &str) -> String {
        let d = self.dir.display();
        let options = format!("-k {d} -c listen_addresses= {settings}");
        as_server_user(
            &format!("{}/pg_ctl", self.bin),
            &format!("-D '{d}/data' -o '{options}' -l '{d}/server.log' start >/dev/null 2>&1"),
        )
    }

    /// Starts the server with these extra `-c` settings under a watchdog: a shell that
    /// waits while this process and the server both live, then stops the server (fast
    /// shutdown) and removes the directory. So the server goes with this process however it
    /// ends (a panic, a kill, a closed pipe). Does not wait for the server to accept
    /// connections (see [`PrivatePostgres::is_ready`]).
    // The watchdog is never waited for on purpose: it must outlive this process.
    #[allow(clippy::zombie_processes)]
    pub fn start_watched(&self, settings: &str) -> Result<(), String> {
        let script = format!(
            "{start}; \
             while kill -0 {parent} 2>/dev/null && {alive}; do sleep 1; done; \
             {stop}; rm -rf '{dir}'",
            start = self.start_command(settings),
            parent = std::process::id(),
            alive = self.alive_condition(),
            stop = self.stop_command(),
            dir = self.dir.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(drop)
            .map_err(|error| format!("cannot start the server's watchdog: {error}"))
    }

    /// A shell condition that holds while the server runs.
    pub fn alive_condition(&self) -> String {
        format!("test -f '{}/data/postmaster.pid'", self.dir.display())
    }

    /// Shell text that stops the server (fast shutdown) and waits for it.
    pub fn stop_command(&self) -> String {
        as_server_user(
            &format!("{}/pg_ctl", self.bin),
            &format!(
                "-D '{}/data' -m fast -w stop >/dev/null 2>&1",
                self.dir.display()
            ),
        )
    }

    /// Whether the server accepts connections now (`pg_isready`).
    pub fn is_ready(&self) -> bool {
        Command::new(format!("{}/pg_isready", self.bin))
            .args(["-h", &self.dir.display().to_string(), "-U", "postgres"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A `postgres://` URL template of this server, `{db}` standing for the database.
    pub fn url_template(&self) -> String {
        format!("postgres://postgres@/{{db}}?host={}", self.dir.display())
    }
}
