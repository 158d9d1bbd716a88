//! A private MariaDB for tests and the benchmark: one `mariadbd` per process, in a temporary
//! directory, reachable only over its socket, stopped when the process ends. Or the server
//! of `CHANGEFEED_TEST_MYSQL` (a `mysql://` URL of a user that may create databases) when
//! that is set.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable naming an existing server instead of a private one.
pub const URL_VARIABLE: &str = "CHANGEFEED_TEST_MYSQL";

/// Where the server is: `url_for(database)` gives a `mysql://` URL.
pub struct Server {
    /// `mysql://user@host/` or `mysql://root@localhost/` with the socket as a parameter,
    /// without the database; `{db}` marks where it goes.
    template: String,
}

impl Server {
    /// A URL of `database` on this server.
    pub fn url_for(&self, database: &str) -> String {
        self.template.replace("{db}", database)
    }
}

/// The process's server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => from_url(url.trim()),
        _ => start_private(),
    })
}

/// `mysql://user:pw@host:port/anything?x=y` becomes a template with `{db}` as the path.
fn from_url(url: &str) -> Server {
    let (before_query, query) = match url.split_once('?') {
        Some((a, q)) => (a, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = before_query.find("://").map_or(0, |i| i + 3);
    let base = match before_query[scheme_end..].find('/') {
        Some(slash) => &before_query[..scheme_end + slash],
        None => before_query,
    };
    Server {
        template: format!("{base}/{{db}}{query}"),
    }
}

fn run(program: &str, args: &[String]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run {program}: {error}. The MariaDB live tests need mariadb-server \
                 (apt-get install -y mariadb-server; .ci/run does it), or set \
                 {URL_VARIABLE} to a mysql:// URL of a server where the user may create \
                 databases"
            )
        })
}

/// Installs a data directory and starts `mariadbd` on a socket in a fresh temporary
/// directory, with the binlog on in ROW format (for the binlog waker). A watchdog shell
/// shuts it down (and removes the directory) when this process ends, however it ends.
// The watchdog is never waited for on purpose: it must outlive this process to stop the
// server after it.
#[allow(clippy::zombie_processes)]
fn start_private() -> Server {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "changefeed-mariadb-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    let d = dir.display().to_string();
    install(&d);
    let server_args = server_args(&d).join(" ");
    // The watchdog: starts the server, waits for this process to end, shuts the server
    // down (only the one it started) and removes the directory.
    let script = format!(
        "mariadbd {server_args} & server=$!; \
         while kill -0 {parent} 2>/dev/null && kill -0 $server 2>/dev/null; do sleep 1; done; \
         mariadb-admin --no-defaults --socket='{d}/sock' -uroot shutdown >/dev/null 2>&1 \
           || kill $server 2>/dev/null; \
         wait $server; rm -rf '{d}'",
        parent = std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start mariadbd: {error}"));
    wait_until_up(&d, Duration::from_secs(120));
    Server {
        template: format!("mysql://root@localhost/{{db}}?socket={d}/sock"),
    }
}

/// Installs a fresh data directory in `{d}/data`.
pub fn install(d: &str) {
    let install = run(
        "mariadb-install-db",
        &[
            "--no-defaults".into(),
            "--user=root".into(),
            format!("--datadir={d}/data"),
            "--auth-root-authentication-method=normal".into(),
            "--skip-test-db".into(),
            // Its own temporary files: installs running at once (fault tests) collide in /tmp.
            format!("--tmpdir={d}"),
        ],
    );
    assert!(
        install.status.success(),
        "mariadb-install-db failed: {}",
        String::from_utf8_lossy(&install.stderr)
    );
}

/// The arguments of a private `mariadbd` whose files are all in directory `d`: socket
/// `{d}/sock`, data `{d}/data`, log `{d}/err.log`, binlog on in ROW format.
pub fn server_args(d: &str) -> Vec<String> {
    [
        "--no-defaults".to_owned(),
        "--user=root".into(),
        format!("--datadir={d}/data"),
        format!("--socket={d}/sock"),
        "--skip-networking".into(),
        format!("--pid-file={d}/pid"),
        format!("--log-error={d}/err.log"),
        format!("--tmpdir={d}"),
        format!("--log-bin={d}/binlog"),
        "--binlog-format=ROW".into(),
        "--server-id=1".into(),
        "--binlog-row-metadata=FULL".into(),
        "--character-set-server=utf8mb4".into(),
        "--max-connections=500".into(),
        // Tests and the benchmark need no durability across a power cut.
        "--innodb-flush-log-at-trx-commit=2".into(),
        "--sync-binlog=0".into(),
    ]
    .into()
}

/// Waits up to `limit` for the server on `{d}/sock` to answer a ping.
pub fn wait_until_up(d: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let ping = run(
            "mariadb-admin",
            &[
                "--no-defaults".into(),
                format!("--socket={d}/sock"),
                "-uroot".into(),
                "ping".into(),
            ],
        );
        if ping.status.success() {
            break;
        }
        if started.elapsed() > limit {
            let log = std::fs::read_to_string(format!("{d}/err.log")).unwrap_or_default();
            panic!("mariadbd did not answer within {limit:?}; its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
