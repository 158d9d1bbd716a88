//! A [`bb8`] connection pool for tiberius 0.13: [`ConnectionManager`], [`Pool`], [`pool`].
//!
//! The published bb8 adapters pin tiberius 0.12, so the crate has its own small manager.
//! A pooled connection is a [`PooledClient`]: a [`Client`] (it dereferences to one, so
//! `&mut conn` can be passed wherever this crate takes `&mut Client`) with a *broken* flag.
//! Code that sees a connection fail calls [`PooledClient::mark_broken`], and the pool
//! discards that connection when it comes back instead of handing it out again.
//!
//! On check-out (bb8's `test_on_check_out`, on by default) the pool runs
//! `IF @@TRANCOUNT > 0 ROLLBACK; SELECT 1`: a connection returned with a transaction still
//! open (a task that failed or was cancelled between `BEGIN TRAN` and `COMMIT`) is rolled
//! back and cleaned before anyone else uses it, and a dead connection is replaced.
//!
//! # Command timeout
//!
//! tiberius 0.13 bounds every server round-trip of a command by
//! `Config::command_timeout`, 30 s by default (ADO.NET's `Command Timeout`; the ADO
//! connection string does not set it). The timer runs while the client waits for the next
//! part of a response, so a `read_feed` long-poll that waits longer than that on the server
//! would be cut off with `TimedOut` and leave the connection out of sync. The pool keeps the
//! bound (set another with [`ConnectionManager::command_timeout`]) and records it on every
//! [`PooledClient`]; [`crate::reader::FeedReader`] reads it and never asks the server to
//! wait longer than the bound minus its margin.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use crate::connection::{Client, connect_with};
use crate::error::{Error, Result};

/// The pool of this crate: bb8 over [`ConnectionManager`].
pub type Pool = bb8::Pool<ConnectionManager>;

/// A connection checked out of a [`Pool`] with `get_owned` (no borrow of the pool).
pub type PooledConnection = bb8::PooledConnection<'static, ConnectionManager>;

/// Builds a [`Pool`] of at most `max_size` connections from an ADO.NET connection string,
/// e.g. `server=tcp:localhost,1433;user=...;password=...;database=app;TrustServerCertificate=true`.
///
/// No connection is opened until one is needed, so this succeeds without a reachable
/// server; a bad connection string is an [`Error::Config`]. Use
/// `bb8::Pool::builder()...build(ConnectionManager::from_ado(ado)?)` for other pool
/// settings. Must be called inside a tokio runtime (bb8 starts its reaper task).
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// let pool = changefeed::pool::pool("server=tcp:localhost,1433;user=sa;password=...", 8).await?;
/// let mut conn = pool.get().await.map_err(changefeed::pool::run_error)?;
/// conn.simple_query("SELECT 1").await?.into_results().await?;
/// # Ok(()) }
/// ```
pub async fn pool(ado_connection_string: &str, max_size: u32) -> Result<Pool> {
    if max_size == 0 {
        return Err(Error::Config(
            "a pool needs at least one connection (max_size >= 1)".to_owned(),
        ));
    }
    let manager = ConnectionManager::from_ado(ado_connection_string)?;
    bb8::Pool::builder()
        .max_size(max_size)
        .error_sink(Box::new(TracingErrorSink))
        .build(manager)
        .await
}

/// A bb8 error sink that reports, as `tracing` warnings, the failures bb8 does not return
/// to a caller (a check-out that keeps failing to connect ends in a timeout; the reason is
/// logged here).
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingErrorSink;

impl bb8::ErrorSink<Error> for TracingErrorSink {
    fn sink(&self, error: Error) {
        tracing::warn!(%error, "changefeed pool: a connection failed");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<Error>> {
        Box::new(*self)
    }
}

/// Turns bb8's error into this crate's: a check-out that timed out is a transient
/// [`Error::Connection`].
pub fn run_error(error: bb8::RunError<Error>) -> Error {
    match error {
        bb8::RunError::User(error) => error,
        bb8::RunError::TimedOut => Error::Connection(
            "no connection from the pool in time (bb8's connection_timeout): the server is \
             unreachable or every connection is busy"
                .to_owned(),
        ),
    }
}

/// Opens tiberius 0.13 connections for bb8, with [`connect_with`] (which follows one Azure
/// redirect).
#[derive(Clone, Debug)]
pub struct ConnectionManager {
    config: tiberius::Config,
}

impl ConnectionManager {
    /// A manager for a prepared tiberius configuration (its command timeout included).
    pub fn new(config: tiberius::Config) -> Self {
        ConnectionManager { config }
    }

    /// A manager from an ADO.NET connection string; the command timeout is tiberius'
    /// default (30 s).
    pub fn from_ado(ado_connection_string: &str) -> Result<Self> {
        let config = tiberius::Config::from_ado_string(ado_connection_string).map_err(|error| {
            Error::Config(format!(
                "the connection string is not a valid ADO.NET string ({error}); expected e.g. \
                 server=tcp:host,1433;user=...;password=...;database=...;TrustServerCertificate=true"
            ))
        })?;
        Ok(Self::new(config))
    }

    /// Sets tiberius' per-round-trip command timeout of new connections (`None`: unbounded).
    /// See the [module documentation](self#command-timeout).
    pub fn command_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.command_timeout(timeout);
        self
    }

    /// Sets how long opening a new connection may take: the TCP connect and the login
    /// handshake, each (tiberius' handshake timeout, 15 s unless set; `None`: as long as the
    /// network takes). See [`connect_with`].
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.handshake_timeout(timeout);
        self
    }

    /// The configuration new connections are opened with.
    pub fn config(&self) -> &tiberius::Config {
        &self.config
    }
}

/// The statement run on check-out: rolls back a transaction left open, proves the
/// connection alive.
pub const VALIDATION_QUERY: &str = "IF @@TRANCOUNT > 0 ROLLBACK; SELECT 1";

impl bb8::ManageConnection for ConnectionManager {
    type Connection = PooledClient;
    type Error = Error;

    async fn connect(&self) -> Result<PooledClient> {
        let client = connect_with(self.config.clone()).await?;
        Ok(PooledClient {
            client,
            broken: false,
            command_timeout: self.config.get_command_timeout(),
        })
    }

    async fn is_valid(&self, conn: &mut PooledClient) -> Result<()> {
        if conn.broken {
            return Err(Error::Connection(
                "the connection was marked broken".to_owned(),
            ));
        }
        let outcome = async {
            conn.client
                .simple_query(VALIDATION_QUERY)
                .await?
                .into_results()
                .await?;
            Ok::<(), Error>(())
        }
        .await;
        if outcome.is_err() {
            conn.broken = true;
        }
        outcome
    }

    fn has_broken(&self, conn: &mut PooledClient) -> bool {
        conn.broken
    }
}

/// A pooled tiberius [`Client`] and whether it is known to be unusable.
///
/// It dereferences to [`Client`]. Mark it broken after a failure that may have left it out
/// of sync (an I/O error, a timeout, a future dropped mid-command): the pool then drops it
/// instead of reusing it.
#[derive(Debug)]
pub struct PooledClient {
    client: Client,
    broken: bool,
    command_timeout: Option<Duration>,
}

impl PooledClient {
    /// Marks the connection unusable: the pool discards it when it is returned.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Whether the connection was marked unusable.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// tiberius' per-round-trip command timeout this connection was opened with.
    pub fn command_timeout(&self) -> Option<Duration> {
        self.command_timeout
    }

    /// Sets the broken flag; the reader sets it before a call and clears it after, so a
    /// call cancelled half-way leaves the connection marked.
    pub(crate) fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }
}

impl Deref for PooledClient {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for PooledClient {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manager_from_ado_keeps_the_command_timeout_unless_told() {
        let ado = "server=tcp:localhost,1433;user=sa;password=x;TrustServerCertificate=true";
        let manager = ConnectionManager::from_ado(ado).unwrap();
        assert_eq!(
            manager.config().get_command_timeout(),
            Some(Duration::from_secs(30))
        );
        let manager = manager.command_timeout(Some(Duration::from_secs(90)));
        assert_eq!(
            manager.config().get_command_timeout(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            manager.command_timeout(None).config().get_command_timeout(),
            None
        );
        let manager = ConnectionManager::from_ado(ado)
            .unwrap()
            .connect_timeout(Some(Duration::from_secs(40)));
        assert_eq!(
            manager.config().get_handshake_timeout(),
            Some(Duration::from_secs(40))
        );
    }

    #[test]
    fn pool_timeouts_are_transient() {
        assert!(run_error(bb8::RunError::TimedOut).is_transient());
        let user = run_error(bb8::RunError::User(Error::Config("x".into())));
        assert!(matches!(user, Error::Config(_)));
    }

    #[tokio::test]
    async fn pool_builds_without_a_server_and_rejects_zero() {
        let ado = "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true";
        let pool = pool(ado, 2).await.unwrap();
        assert_eq!(pool.state().connections, 0);
        assert!(matches!(super::pool(ado, 0).await, Err(Error::Config(_))));
    }
}
