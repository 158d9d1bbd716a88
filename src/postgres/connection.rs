//! Connecting to PostgreSQL: the URL, the time limits every connection gets, and the
//! session settings the outbox needs. The URL's parsing ([`config`]) and the opening of a
//! session live in `pg_client::session`, which the feed reader shares, and are re-exported
//! here.

use std::time::Duration;

use tokio_postgres::{Client, Config};

use crate::error::Result;
use crate::outbox_backend::bounded;
pub use crate::pg_client::session::{DEFAULT_CONNECT_TIMEOUT, config};
pub(crate) use crate::pg_client::session::{
    SERVER, connect_timeout, open_unbounded, session_settings,
};

/// The server-side limit of one statement (`statement_timeout`) on the store's and the
/// waker's sessions. The claim never waits for a lock (SKIP LOCKED) and the other statements
/// touch few rows, so a statement this slow means a stuck server.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The client-side limit of one call: the statement timeout plus time for the answer to
/// travel. It also bounds a call whose server or network went silent, which no server-side
/// setting can.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(35);

/// Opens a connection (without TLS) and runs its I/O on a task of its own; the task ends
/// when the client is dropped. The session gets `statement_timeout` =
/// [`STATEMENT_TIMEOUT`] and READ COMMITTED, which the claim's `FOR UPDATE SKIP LOCKED`
/// assumes (see [`PostgresOutboxStore`](super::PostgresOutboxStore)). The whole connect,
/// settings included, is bounded by the connect timeout.
pub async fn connect(config: &Config) -> Result<Client> {
    let limit = connect_timeout(config);
    bounded(SERVER, limit, "connect", async {
        // Nobody listens on this session: its notifications (none) are dropped.
        let (client, _notifications) = open_unbounded(config).await?;
        client
            .batch_execute(&session_settings(STATEMENT_TIMEOUT))
            .await?;
        Ok(client)
    })
    .await
}

/// The server's version, e.g. `15.8 (Debian 15.8-0+deb12u1)`.
pub async fn server_version(client: &Client) -> Result<String> {
    let row = bounded(SERVER, CALL_TIMEOUT, "show server_version", async {
        Ok(client.query_one("show server_version", &[]).await?)
    })
    .await?;
    row.try_get(0)
        .map_err(|e| crate::error::decode_error("server_version", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_a_database_and_get_time_limits() {
        let config = config("postgres://u:p@localhost:5432/app").unwrap();
        assert_eq!(config.get_connect_timeout(), Some(&DEFAULT_CONNECT_TIMEOUT));
        assert!(config.get_keepalives());
        let own = super::config("postgres://u@localhost/app?connect_timeout=3").unwrap();
        assert_eq!(own.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert!(super::config("host=/run/postgresql dbname=app user=u").is_ok());
        for bad in [
            "postgres://u:p@localhost:5432",
            "postgres://u@h/",
            "http://x/db",
        ] {
            let error = super::config(bad).unwrap_err().to_string();
            assert!(
                error.contains("postgres://user:password@host"),
                "{bad}: {error}"
            );
        }
    }
}
