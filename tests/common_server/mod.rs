//! Process handling shared by the private database servers of the live tests (MariaDB in
//! `common_mysql`, PostgreSQL in `common_postgres`): the server a URL variable names
//! instead, a temporary directory, a watchdog that stops the server when the test process
//! ends however it ends, and the wait for the server to answer.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The URL template (`{db}` as the path) of the server `variable` names
/// (`scheme://user:pw@host:port/anything?x=y` becomes `scheme://user:pw@host:port/{db}?x=y`),
/// or `None` when it is unset or blank: then the test starts a private server.
pub fn url_template_from(variable: &str) -> Option<String> {
    let url = std::env::var(variable).ok()?;
    let url = url.trim();
    if url.is_empty() {
        return None;
    }
    let (before_query, query) = match url.split_once('?') {
        Some((a, q)) => (a, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = before_query.find("://").map_or(0, |i| i + 3);
    let base = match before_query[scheme_end..].find('/') {
        Some(slash) => &before_query[..scheme_end + slash],
        None => before_query,
    };
    Some(format!("{base}/{{db}}{query}"))
}

/// A fresh directory `changefeed-<kind>-<pid>-<random>` under the system's temp dir.
pub fn temp_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "changefeed-{kind}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    dir
}

/// Runs `program` to its end; a program that cannot run panics with `missing`, which says
/// how to install it.
pub fn run(program: &str, args: &[String], missing: &str) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {program}: {error}. {missing}"))
}

/// Starts a watchdog shell: it runs `start` (shell text; it may set shell variables that
/// `alive` and `stop` use), then waits while this process and `alive` (a shell condition)
/// both hold, then runs `stop` and removes `dir`. So the server is stopped, and its files
/// removed, when this process ends, even by a panic or a kill.
// The watchdog is never waited for on purpose: it must outlive this process to stop the
// server after it.
#[allow(clippy::zombie_processes)]
pub fn watchdog(start: &str, alive: &str, stop: &str, dir: &Path) {
    let script = format!(
        "{start}; \
         while kill -0 {parent} 2>/dev/null && {alive}; do sleep 1; done; \
         {stop}; rm -rf '{d}'",
        parent = std::process::id(),
        d = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start the server's watchdog: {error}"));
}

/// Calls `ready` every 200 ms until it returns true; after `limit`, panics with `what` and
/// the server's log at `log`.
pub fn wait_until(what: &str, limit: Duration, log: &Path, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        if started.elapsed() > limit {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not answer within {limit:?}; its log:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
