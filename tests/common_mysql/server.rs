//! A private MariaDB for tests and the benchmark: one `mariadbd` per process, in a temporary
//! directory, reachable only over its socket, stopped when the process ends. Or the server
//! of `CHANGEFEED_TEST_MYSQL` (a `mysql://` URL of a user that may create databases) when
//! that is set.

use std::sync::OnceLock;
use std::time::Duration;

use crate::common_server;

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

/// Extra `mariadbd` options of this test binary's private server (see [`with_options`]).
static EXTRA_OPTIONS: OnceLock<&'static [&'static str]> = OnceLock::new();

/// Starts this test binary's private server with `options` added (e.g.
/// `--innodb-rollback-on-timeout=ON`, which cannot be set at run time). Call it before the
/// first [`server`] of the binary, with the same options from every test. A server of
/// `CHANGEFEED_TEST_MYSQL` is used as it is: the test checks the setting it needs.
// examples/bench_mysql.rs includes this file and does not use it.
#[allow(dead_code)]
pub fn with_options(options: &'static [&'static str]) {
    let set = EXTRA_OPTIONS.get_or_init(|| options);
    assert_eq!(*set, options, "one test binary, one set of server options");
}

/// The process's server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match common_server::url_template_from(URL_VARIABLE) {
        Some(template) => Server { template },
        None => start_private(),
    })
}

/// How to get the server when it is missing.
const MISSING: &str = "The MariaDB live tests need mariadb-server (apt-get install -y \
    mariadb-server; .ci/run does it), or set CHANGEFEED_TEST_MYSQL to a mysql:// URL of a \
    server where the user may create databases";

fn run(program: &str, args: &[String]) -> std::process::Output {
    common_server::run(program, args, MISSING)
}

/// Installs a data directory and starts `mariadbd` on a socket in a fresh temporary
/// directory, with the binlog on in ROW format (for the binlog waker). A watchdog shuts it
/// down (and removes the directory) when this process ends, however it ends.
fn start_private() -> Server {
    let dir = common_server::temp_dir("mariadb");
    let d = dir.display().to_string();
    install(&d);
    let server_args = server_args(&d)
        .into_iter()
        .chain(
            EXTRA_OPTIONS
                .get()
                .into_iter()
                .flat_map(|o| o.iter())
                .map(|o| o.to_string()),
        )
        .collect::<Vec<_>>()
        .join(" ");
    // Shuts down only the server it started.
    common_server::watchdog(
        &format!("mariadbd {server_args} & server=$!"),
        "kill -0 $server 2>/dev/null",
        &format!(
            "mariadb-admin --no-defaults --socket='{d}/sock' -uroot shutdown >/dev/null 2>&1 \
             || kill $server 2>/dev/null; wait $server"
        ),
        &dir,
    );
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
    common_server::wait_until(
        "mariadbd",
        limit,
        &std::path::Path::new(d).join("err.log"),
        || {
            run(
                "mariadb-admin",
                &[
                    "--no-defaults".into(),
                    format!("--socket={d}/sock"),
                    "-uroot".into(),
                    "ping".into(),
                ],
            )
            .status
            .success()
        },
    );
}
