//! A PostgreSQL session as changefeed opens it: the URL (`config`, public as
//! `changefeed::postgres::config`), the connect timeout, the session settings,
//! and the task that drives a connection and forwards its notifications (`LISTEN`). The
//! outbox's store and waker (`postgres`) and the feed reader's source (`reader`) share it.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

use crate::call_bound::bounded;
use crate::error::{Error, Result};

/// The connect timeout when the URL sets none (`connect_timeout=` in seconds).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Parses a `postgres://user:password@host:5432/database` URL or a `key=value` connection
/// string (tokio-postgres's syntax; a local server's socket directory goes in the host, e.g.
/// `host=/run/postgresql`, or `postgres://user@%2Frun%2Fpostgresql/app`). The database is
/// required: the outbox lives in it. TCP keepalives are turned on (idle 30 s) and the
/// connect timeout defaults to 10 s, so that no connect and no dead peer hangs for ever.
///
/// ```
/// let config = changefeed::postgres::config("postgres://relay:secret@db.internal:5432/app")?;
/// assert_eq!(config.get_dbname(), Some("app"));
/// assert!(changefeed::postgres::config("postgres://db.internal/").is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
pub fn config(url: &str) -> Result<Config> {
    let mut config: Config = url.parse().map_err(|error| {
        Error::Config(format!(
            "the PostgreSQL URL is not usable ({error}); write it as \
             postgres://user:password@host:5432/database"
        ))
    })?;
    if config.get_dbname().is_none_or(str::is_empty) {
        return Err(Error::Config(
            "the PostgreSQL URL names no database; add it as the path, e.g. \
             postgres://user:password@host:5432/app"
                .to_owned(),
        ));
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
    if config.get_application_name().is_none() {
        config.application_name("changefeed");
    }
    Ok(config)
}

/// The server as a call's time-bound error names it.
pub(crate) const SERVER: &str = "PostgreSQL";

/// The connect timeout of `config`, or [`DEFAULT_CONNECT_TIMEOUT`].
pub(crate) fn connect_timeout(config: &Config) -> Duration {
    config
        .get_connect_timeout()
        .copied()
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
}

/// The session settings of a connection whose statements may run `statement_timeout` at
/// most, in READ COMMITTED (which the claim's `FOR UPDATE SKIP LOCKED` and the feed's read
/// functions assume, whatever the database's `default_transaction_isolation`).
pub(crate) fn session_settings(statement_timeout: Duration) -> String {
    format!(
        "set statement_timeout = {}; \
         set session characteristics as transaction isolation level read committed",
        statement_timeout.as_millis()
    )
}

/// The notifications a connection receives (`LISTEN`), and the task that drives it.
pub(crate) struct Notifications {
    /// Every notification, of whatever channel: the listener picks its own.
    pub(crate) received: mpsc::UnboundedReceiver<Notification>,
    /// Ends when the connection does, with why (closed by the client, broken, closed by the
    /// server).
    pub(crate) driver: JoinHandle<String>,
}

/// Opens a connection (without TLS), bounded by the connect timeout, and drives it on a
/// task of its own that forwards every notification: what the waker and the feed reader
/// listen with. No session settings; the task ends when the client is dropped.
pub(crate) async fn open(config: &Config) -> Result<(Client, Notifications)> {
    bounded(
        SERVER,
        connect_timeout(config),
        "connect",
        open_unbounded(config),
    )
    .await
}

/// [`open`] without its time bound.
pub(crate) async fn open_unbounded(config: &Config) -> Result<(Client, Notifications)> {
    let (client, mut connection) = config.connect(NoTls).await?;
    // The connection's messages (notifications among them) arrive only while it is polled.
    let (forward, received) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                // A receiver that is gone wants none; the connection still serves its client.
                Ok(AsyncMessage::Notification(notification)) => {
                    let _ = forward.send(notification);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "PostgreSQL connection ended");
                    return format!("the connection broke: {}", Error::from(error));
                }
            }
        }
        "the server closed the connection".to_owned()
    });
    Ok((client, Notifications { received, driver }))
}
