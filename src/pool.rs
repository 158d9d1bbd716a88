//! A [`bb8`] connection pool for tiberius 0.13: [`Pool`], [`ConnectionManager`], [`pool`].
//!
//! The published bb8 adapters pin tiberius 0.12, so the crate has its own small manager.
//! A pooled connection is a [`PooledClient`]: a [`Client`] (it dereferences to one, so
//! `&mut conn` can be passed wherever this crate takes `&mut Client`) with a *broken* flag.
//! Code that sees a connection fail calls [`PooledClient::mark_broken`], and the pool
//! discards that connection when it comes back instead of handing it out again.
//!
//! # Why a connection cannot be had
//!
//! bb8 opens connections in the background and a waiting `get` only ever learns that it
//! timed out. [`Pool`] keeps the last connection error and returns it: a check-out that
//! times out says what the last attempt met (an unreachable host, a TLS failure), and a
//! failure no retry can fix — a refused login ([`Error::is_login_failure`]), an unknown
//! database, a bad TLS setup — ends every waiting check-out at once with the server's
//! message instead of a timeout after `connection_timeout`.
//!
//! # Transactions
//!
//! Open transactions with [`PooledClient::transaction`]: the [`Transaction`] guard commits
//! or rolls back when told to, and a guard dropped before that (an error returned with `?`,
//! a cancelled task) leaves the connection marked, so the pool closes it instead of handing
//! it on with the transaction — and its locks — still open; closing the session rolls the
//! transaction back on the server at once.
//!
//! # What a check-out resets
//!
//! tiberius cannot send TDS's reset-connection flag, so on check-out (bb8's
//! `test_on_check_out`, on by default) the pool runs [`CHECKOUT_RESET`]: it rolls back a
//! transaction left open by a borrower that did not use the guard, and puts back the session
//! settings a borrower is likely to have changed and that change how this crate's calls
//! behave: `implicit_transactions` (read_feed must run outside a transaction), the
//! isolation level (read committed, which `read_feed` and the claim are written for),
//! `xact_abort`, `lock_timeout`, `deadlock_priority`, `rowcount` and `nocount`. A failing
//! reset proves the connection dead and it is replaced. Temporary tables, `session_context`
//! keys and session-owned application locks survive a check-out: a borrower that creates
//! them should [`mark_broken`](PooledClient::mark_broken) the connection before returning it.
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

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::connection::{Client, connect_with};
use crate::error::{Error, Result};

/// A connection checked out of a [`Pool`] with [`Pool::get_owned`] (no borrow of the pool).
pub type PooledConnection = bb8::PooledConnection<'static, ConnectionManager>;

/// The pool of this crate: bb8 over [`ConnectionManager`], whose check-outs return the
/// reason a connection could not be opened (see the [module documentation](self)).
///
/// Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct Pool {
    inner: bb8::Pool<ConnectionManager>,
    log: Arc<ConnectLog>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("state", &self.inner.state())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Pool`] of at most `max_size` connections from an ADO.NET connection string,
/// e.g. `server=tcp:localhost,1433;user=...;password=...;database=app;TrustServerCertificate=true`.
///
/// No connection is opened until one is needed, so this succeeds without a reachable
/// server; a bad connection string is an [`Error::Config`]. Use [`Pool::builder`] and
/// [`Pool::from_builder`] for other pool settings. Must be called inside a tokio runtime
/// (bb8 starts its reaper task).
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// let pool = changefeed::pool::pool("server=tcp:localhost,1433;user=sa;password=...", 8).await?;
/// let mut conn = pool.get().await?;
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
    Ok(Pool::from_builder(
        Pool::builder().max_size(max_size),
        manager,
    ))
}

impl Pool {
    /// bb8's builder with this crate's error sink ([`TracingErrorSink`]); set what you
    /// need (`max_size`, `connection_timeout`, ...) and pass it to [`Pool::from_builder`].
    pub fn builder() -> bb8::Builder<ConnectionManager> {
        bb8::Pool::builder().error_sink(Box::new(TracingErrorSink))
    }

    /// The pool `builder` makes over `manager`. Opens no connection (bb8's
    /// `build_unchecked`); must be called inside a tokio runtime.
    ///
    /// ```no_run
    /// # async fn run() -> changefeed::Result<()> {
    /// use std::time::Duration;
    /// use changefeed::pool::{ConnectionManager, Pool};
    ///
    /// let manager = ConnectionManager::from_ado("server=tcp:localhost,1433;user=sa;password=...")?;
    /// let pool = Pool::from_builder(
    ///     Pool::builder().max_size(4).connection_timeout(Duration::from_secs(10)),
    ///     manager,
    /// );
    /// # Ok(()) }
    /// ```
    pub fn from_builder(
        builder: bb8::Builder<ConnectionManager>,
        manager: ConnectionManager,
    ) -> Pool {
        let log = Arc::clone(&manager.log);
        Pool {
            inner: builder.build_unchecked(manager),
            log,
        }
    }

    /// Checks a connection out (see [`Pool::get_owned`]); it goes back when dropped.
    pub async fn get(&self) -> Result<bb8::PooledConnection<'_, ConnectionManager>> {
        self.check_out(self.inner.get()).await
    }

    /// Checks a connection out without borrowing the pool. Fails with the error of the last
    /// connection attempt when none could be opened within bb8's `connection_timeout`, and
    /// at once when an attempt fails in a way no retry fixes (a refused login, an unknown
    /// database, a TLS failure): the server's message, not a timeout.
    pub async fn get_owned(&self) -> Result<PooledConnection> {
        self.check_out(self.inner.get_owned()).await
    }

    /// Runs bb8's check-out, cut short by a permanent connect failure that happens meanwhile.
    async fn check_out<C>(
        &self,
        get: impl Future<Output = Result<C, bb8::RunError<Error>>>,
    ) -> Result<C> {
        // Subscribed before bb8 starts connecting, so no failure can slip in between.
        let mut permanent = self.log.permanent.subscribe();
        tokio::select! {
            biased;
            got = get => got.map_err(|e| self.run_error(e)),
            Ok(()) = permanent.changed() => Err(self.log.last_error().unwrap_or_else(|| {
                Error::Connection("a connection attempt failed".to_owned())
            })),
        }
    }

    /// bb8's view of the pool: connections open and idle.
    pub fn state(&self) -> bb8::State {
        self.inner.state()
    }

    /// The bb8 pool underneath, for what this type does not forward. Its `get` reports a
    /// failed connect only as a timeout; prefer [`Pool::get`].
    pub fn bb8(&self) -> &bb8::Pool<ConnectionManager> {
        &self.inner
    }

    /// bb8's error, with a timeout explained by the last connection attempt's error.
    fn run_error(&self, error: bb8::RunError<Error>) -> Error {
        match (error, self.log.last_error()) {
            (bb8::RunError::User(error), _) => error,
            (bb8::RunError::TimedOut, Some(Error::Connection(message))) => {
                Error::Connection(format!(
                    "no connection from the pool within {:?}; the last attempt failed: {message}",
                    self.inner.config().connection_timeout
                ))
            }
            (bb8::RunError::TimedOut, Some(error)) => error,
            (bb8::RunError::TimedOut, None) => Error::Connection(format!(
                "no connection from the pool within {:?}: all {} connections are busy \
                 (raise max_size, or return connections sooner)",
                self.inner.config().connection_timeout,
                self.inner.config().max_size
            )),
        }
    }
}

/// A bb8 error sink that reports, as `tracing` warnings, the failures bb8 does not return
/// to a caller (a connection attempt bb8 retries in the background; a connection whose
/// check-out reset failed).
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

/// Turns bb8's error into this crate's when bb8's own pool is used directly: a check-out
/// that timed out is a transient [`Error::Connection`]. [`Pool::get`] does better: it says
/// why.
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

/// What the manager's connection attempts came to, shared with its [`Pool`].
#[derive(Debug)]
struct ConnectLog {
    /// The error of the last failed attempt; cleared by a successful one.
    last: Mutex<Option<Error>>,
    /// Counts attempts that failed in a way no retry fixes; check-outs wait on a change.
    permanent: watch::Sender<u64>,
}

impl ConnectLog {
    fn new() -> Self {
        ConnectLog {
            last: Mutex::new(None),
            permanent: watch::Sender::new(0),
        }
    }

    fn last_error(&self) -> Option<Error> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, outcome: Option<&Error>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = outcome.cloned();
        if let Some(error) = outcome
            && !error.is_transient()
        {
            self.permanent.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Opens tiberius 0.13 connections for bb8, with [`connect_with`] (which follows one Azure
/// redirect and bounds the TCP connect), and remembers why the last attempt failed.
#[derive(Clone, Debug)]
pub struct ConnectionManager {
    config: tiberius::Config,
    log: Arc<ConnectLog>,
}

impl ConnectionManager {
    /// A manager for a prepared tiberius configuration (its command timeout included).
    pub fn new(config: tiberius::Config) -> Self {
        ConnectionManager {
            config,
            log: Arc::new(ConnectLog::new()),
        }
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

    /// The error of the last failed connection attempt, `None` when the last attempt
    /// succeeded or none was made.
    pub fn last_connect_error(&self) -> Option<Error> {
        self.log.last_error()
    }
}

/// The batch run on check-out: rolls back a transaction a borrower left open and puts back
/// the session settings this crate's calls depend on (see the
/// [module documentation](self#what-a-check-out-resets)); its round trip also proves the
/// connection alive.
pub const CHECKOUT_RESET: &str = "if @@trancount > 0 rollback; \
     set implicit_transactions off; \
     set transaction isolation level read committed; \
     set xact_abort off; \
     set lock_timeout -1; \
     set deadlock_priority normal; \
     set rowcount 0; \
     set nocount off;";

impl bb8::ManageConnection for ConnectionManager {
    type Connection = PooledClient;
    type Error = Error;

    async fn connect(&self) -> Result<PooledClient> {
        let outcome = connect_with(self.config.clone()).await;
        self.log.record(outcome.as_ref().err());
        Ok(PooledClient {
            client: outcome?,
            broken: false,
            in_transaction: false,
            command_timeout: self.config.get_command_timeout(),
        })
    }

    async fn is_valid(&self, conn: &mut PooledClient) -> Result<()> {
        if conn.is_broken() {
            return Err(Error::Connection(
                "the connection was marked broken".to_owned(),
            ));
        }
        // Broken until the reset completes: a check-out cancelled half-way is discarded.
        conn.broken = true;
        run_batch(&mut conn.client, CHECKOUT_RESET).await?;
        conn.broken = false;
        Ok(())
    }

    fn has_broken(&self, conn: &mut PooledClient) -> bool {
        conn.is_broken()
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
    /// A [`Transaction`] began and has not committed or rolled back yet.
    in_transaction: bool,
    command_timeout: Option<Duration>,
}

impl PooledClient {
    /// Marks the connection unusable: the pool discards it when it is returned.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Whether the connection is unusable: marked broken, or a [`Transaction`] on it was
    /// dropped without commit or rollback.
    pub fn is_broken(&self) -> bool {
        self.broken || self.in_transaction
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

    /// Begins a transaction (with `xact_abort` on) and returns its guard; see [`Transaction`].
    ///
    /// Fails with [`Error::Config`] when an earlier guard on this connection was dropped
    /// without commit or rollback: that transaction is still open, so take a fresh
    /// connection from the pool.
    pub async fn transaction(&mut self) -> Result<Transaction<'_>> {
        if self.in_transaction {
            return Err(Error::Config(
                "a transaction on this connection was dropped without commit or rollback and \
                 is still open; drop the connection (the pool closes it) and take another"
                    .to_owned(),
            ));
        }
        // Set before the batch is sent: a begin cancelled half-way is treated as open.
        self.in_transaction = true;
        run_batch(&mut self.client, BEGIN).await?;
        Ok(Transaction { conn: self })
    }
}

/// Runs a batch and reads its response to the end.
async fn run_batch(client: &mut Client, sql: &str) -> Result<()> {
    client.simple_query(sql).await?.into_results().await?;
    Ok(())
}

/// What [`PooledClient::transaction`] sends. `xact_abort on` makes any statement error,
/// and a command the client cancels (tiberius' command timeout), roll the whole transaction
/// back on the server instead of leaving it open; the pool's check-out reset turns it off
/// again for the next borrower.
const BEGIN: &str = "set xact_abort on; begin transaction;";

/// An open transaction on a pooled connection, in the shape of tokio-postgres' and sqlx's:
/// [`commit`](Self::commit) or [`rollback`](Self::rollback) consume it. Dropped without
/// either — an early `?`, a panic, a cancelled task — it leaves the connection marked, and
/// the pool closes that connection when it comes back instead of lending it out with the
/// transaction still open; SQL Server rolls the transaction back when the session closes,
/// releasing its locks (a `writer::lock_feed` shard lock included) at once.
///
/// It dereferences to [`Client`], so every function of this crate that takes
/// `&mut Client` runs inside it.
///
/// ```no_run
/// # async fn run(pool: &changefeed::Pool) -> changefeed::Result<()> {
/// use changefeed::outbox::NewMessage;
/// use changefeed::outbox_store::OutboxStore;
///
/// let outbox: OutboxStore = "dbo.outbox".parse()?;
/// let mut conn = pool.get().await?;
/// let mut tx = conn.transaction().await?;
/// tx.execute("update app.Orders set status = 'paid' where id = @P1", &[&42i64]).await?;
/// let message = NewMessage::new("orders", serde_json::json!({"paid": 42}));
/// outbox.enqueue(&mut tx, &message).await?; // any error returns here: the guard is dropped
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a transaction dropped without commit or rollback discards its connection"]
pub struct Transaction<'a> {
    conn: &'a mut PooledClient,
}

impl Transaction<'_> {
    /// Commits. On an error the connection stays marked and the pool discards it.
    pub async fn commit(self) -> Result<()> {
        self.finish("commit transaction;").await
    }

    /// Rolls back (nothing to do when the server already did, e.g. after an error under
    /// `xact_abort`). On an error the connection stays marked and the pool discards it.
    pub async fn rollback(self) -> Result<()> {
        self.finish("if @@trancount > 0 rollback transaction;")
            .await
    }

    async fn finish(self, sql: &str) -> Result<()> {
        let conn = self.conn;
        run_batch(&mut conn.client, sql).await?;
        conn.in_transaction = false;
        Ok(())
    }
}

impl Deref for Transaction<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.conn.client
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.conn.client
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
    async fn a_timed_out_check_out_names_the_last_connect_error() {
        // Port 1 on the loopback refuses at once: every attempt fails the same way.
        let ado = "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true";
        let manager = ConnectionManager::from_ado(ado).unwrap();
        let pool = Pool::from_builder(
            Pool::builder()
                .max_size(1)
                .connection_timeout(Duration::from_millis(400)),
            manager,
        );
        let error = pool.get().await.unwrap_err();
        let text = error.to_string();
        assert!(error.is_transient(), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(text.contains("last attempt failed"), "{text}");
    }

    #[tokio::test]
    async fn pool_builds_without_a_server_and_rejects_zero() {
        let ado = "server=tcp:127.0.0.1,1;user=sa;password=x;TrustServerCertificate=true";
        let pool = pool(ado, 2).await.unwrap();
        assert_eq!(pool.state().connections, 0);
        assert_eq!(pool.bb8().config().max_size, 2);
        assert!(matches!(super::pool(ado, 0).await, Err(Error::Config(_))));
    }
}
