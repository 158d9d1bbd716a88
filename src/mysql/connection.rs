//! Connecting to MariaDB/MySQL: the `mysql://` URL, the session settings the outbox needs,
//! and the time bounds of every call.
//!
//! mysql_async has no connect or read timeout of its own, and a server that loses power (or
//! is frozen) never closes the socket: without a bound, a call waits forever. So every
//! connect here is bounded ([`DEFAULT_CONNECT_TIMEOUT`], or the caller's), every store call
//! is bounded by [`bounded`], and TCP keepalive ([`TCP_KEEPALIVE`]) lets the kernel notice
//! a peer that vanished while a connection sits idle.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::error::{Error, Result};
use crate::outbox_backend::bounded;

/// How long a connect (TCP or socket, handshake, login, session setup) may take when the
/// caller names no bound: 15 s, the CLI's `--connect-timeout` default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The idle time after which the kernel starts probing a connection's peer (`SO_KEEPALIVE`
/// on TCP connections; a local socket has no peer to lose).
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// The session settings of every connection the store opens. READ COMMITTED: under
/// REPEATABLE READ a `FOR UPDATE SKIP LOCKED` scan takes gap locks that make concurrent
/// claimers wait on each other, and the head-of-aggregate probe would read an old snapshot.
const SESSION_SETUP: &str = "set session transaction isolation level read committed";

/// Parses a `mysql://user:password@host:port/database` URL (mysql_async's syntax: a local
/// server's socket goes in `?socket=/path/to/sock`). The database is required: the outbox
/// table lives in it.
///
/// ```
/// let opts = changefeed::mysql::opts("mysql://relay:secret@db.internal:3306/app")?;
/// assert_eq!(opts.db_name(), Some("app"));
/// assert!(changefeed::mysql::opts("mysql://db.internal/").is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
pub fn opts(url: &str) -> Result<Opts> {
    let opts = Opts::from_url(url).map_err(|error| {
        Error::Config(format!(
            "the MariaDB/MySQL URL is not usable ({error}); write it as \
             mysql://user:password@host:3306/database"
        ))
    })?;
    if opts.db_name().is_none_or(str::is_empty) {
        return Err(Error::Config(
            "the MariaDB/MySQL URL names no database; add it as the path, e.g. \
             mysql://user:password@host:3306/app"
                .to_owned(),
        ));
    }
    Ok(opts)
}

/// Opens a connection with the outbox's session settings (READ COMMITTED), TCP keepalive,
/// within [`DEFAULT_CONNECT_TIMEOUT`].
pub async fn connect(opts: &Opts) -> Result<Conn> {
    connect_within(opts, DEFAULT_CONNECT_TIMEOUT).await
}

/// [`connect`] bounded by `limit` instead: a server that accepts the socket but never
/// answers (frozen, overloaded, a half-open route) fails with an [`Error::Connection`]
/// naming the bound, instead of hanging.
pub async fn connect_within(opts: &Opts, limit: Duration) -> Result<Conn> {
    let opts = with_keepalive(opts).setup(vec![SESSION_SETUP]);
    bounded(SERVER, limit, "connect", async {
        Ok(Conn::new(opts).await?)
    })
    .await
}

/// `opts` with TCP keepalive on (the server's own options are kept).
pub(crate) fn with_keepalive(opts: &Opts) -> OptsBuilder {
    OptsBuilder::from_opts(opts.clone()).tcp_keepalive(Some(TCP_KEEPALIVE))
}

/// The server as a call's time-bound error names it.
pub(crate) const SERVER: &str = "MariaDB/MySQL";

/// The server's version line, e.g. `10.11.6-MariaDB-0+deb12u1`.
pub async fn server_version(conn: &mut Conn) -> Result<String> {
    let version: Option<String> = conn.query_first("select version()").await?;
    version.ok_or_else(|| Error::Connection("select version() returned no row".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_bound_is_a_transient_connection_error() {
        let hang = bounded(SERVER, Duration::from_secs(3), "claim", async {
            std::future::pending::<Result<()>>().await
        });
        let error = hang.await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("claim did not answer within 3s"),
            "{error}"
        );
        assert_eq!(
            bounded(SERVER, Duration::from_secs(3), "claim", async { Ok(7) })
                .await
                .unwrap(),
            7
        );
    }

    #[test]
    fn urls_need_a_database() {
        assert!(opts("mysql://u:p@localhost:3306/app").is_ok());
        for bad in [
            "mysql://u:p@localhost:3306",
            "mysql://u:p@localhost:3306/",
            "http://x/db",
        ] {
            let error = opts(bad).unwrap_err().to_string();
            assert!(
                error.contains("mysql://user:password@host"),
                "{bad}: {error}"
            );
        }
    }
}
