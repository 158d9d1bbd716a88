//! [`SqlClaimStore`]: the claim outbox over SQL Server as a relay's [`ClaimStore`], on one
//! pooled connection, with claims that wait on the server for work.

use std::time::Duration;

#[cfg(doc)]
use super::{CLAIM_PAUSE_MAX, MAX_CLAIM_WAIT};
use super::{CLAIM_WAIT_MARGIN, DEFAULT_CLAIM_WAIT, OutboxStore, check_claim_wait};
use crate::error::{Error, Result};
use crate::outbox::{ClaimProgress, ClaimStore, ClaimToken, Claimed, Failed, OutboxBacklog};
use crate::pool::{Pool, PooledClient, PooledConnection};
use crate::reader::effective_wait;

/// A [`ClaimStore`] over SQL Server for a relay. It keeps one connection of a [`Pool`]
/// checked out between calls, and gives it back for a fresh one after any failure that may
/// have ended or desynchronised the session (a lost connection, a severity-20 error such as
/// a `KILL`, a call cancelled half-way, text the driver could not read). An ordinary server
/// error (a permission, a missing procedure) keeps the connection.
///
/// Connections come from the crate's [`Pool`], so a connect is bounded (TCP and handshake)
/// and a refused login is reported with the server's message.
///
/// Its claim waits on the server for work ([`OutboxStore::claim_waiting`], by default
/// [`DEFAULT_CLAIM_WAIT`]), so a relay over it claims a new message within
/// [`CLAIM_PAUSE_MAX`] of its commit rather than within its `poll_interval`, and a relay
/// that stops while the claim waits cancels it on the server ([`ClaimStore::cancel_claim`]).
/// The claim says when it has passed its wait ([`ClaimStore::claim_progress`]: when the
/// first packet of its result arrives), so a relay never cancels a claim whose rows are
/// claimed and on their way.
pub struct SqlClaimStore {
    store: OutboxStore,
    source: Source,
    conn: Option<PooledConnection>,
    wait: Duration,
    progress: ClaimProgress,
}

/// How long a [`SqlClaimStore`] gives the server to acknowledge the cancel of an abandoned
/// claim before it closes the connection instead.
const CANCEL_BOUND: Duration = Duration::from_secs(2);

/// Where a [`SqlClaimStore`] gets connections.
enum Source {
    /// A connection string; the pool of one connection is made on first use (bb8 needs a
    /// runtime to make it).
    Ado(String),
    Pool(Pool),
}

impl SqlClaimStore {
    /// A store for `outbox` that connects with `ado_connection_string` (over a pool of one
    /// connection, made on first use).
    pub fn new(outbox: OutboxStore, ado_connection_string: impl Into<String>) -> Self {
        SqlClaimStore {
            store: outbox,
            source: Source::Ado(ado_connection_string.into()),
            conn: None,
            wait: DEFAULT_CLAIM_WAIT,
            progress: ClaimProgress::new(),
        }
    }

    /// A store for `outbox` that takes its connection from `pool` (e.g. one shared with a
    /// [`crate::FeedReader`]).
    pub fn with_pool(outbox: OutboxStore, pool: Pool) -> Self {
        SqlClaimStore {
            store: outbox,
            source: Source::Pool(pool),
            conn: None,
            wait: DEFAULT_CLAIM_WAIT,
            progress: ClaimProgress::new(),
        }
    }

    /// The same store, its claims waiting up to `wait` on the server when nothing is due
    /// (default [`DEFAULT_CLAIM_WAIT`]; zero: answer at once, and the relay polls every
    /// `poll_interval`). Fails past [`MAX_CLAIM_WAIT`]. A wait longer than the connection's
    /// command timeout minus [`CLAIM_WAIT_MARGIN`] is shortened to fit it at each claim.
    pub fn claim_wait(mut self, wait: Duration) -> Result<Self> {
        check_claim_wait(wait)?;
        self.wait = wait;
        Ok(self)
    }

    async fn with_client<T>(
        &mut self,
        call: impl AsyncFnOnce(&OutboxStore, &mut PooledClient) -> Result<T>,
    ) -> Result<T> {
        // A call dropped half-way (a relay shutting down) left its connection marked.
        if self.conn.as_ref().is_some_and(|conn| conn.is_broken()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            if let Source::Ado(ado) = &self.source {
                self.source = Source::Pool(crate::pool::pool(ado, 1).await?);
            }
            let Source::Pool(pool) = &self.source else {
                unreachable!("the pool was just made");
            };
            self.conn = Some(pool.get_owned().await?);
            crate::metrics::store_connected(&self.store.table().to_string(), "sqlserver");
        }
        let Some(conn) = self.conn.as_mut() else {
            unreachable!("the connection was just set");
        };
        // Broken until the call completes: dropped half-way, it stays marked.
        conn.set_broken(true);
        let result = call(&self.store, conn).await;
        match &result {
            Ok(_) => conn.set_broken(false),
            Err(Error::Server { class, .. }) if *class < 20 => conn.set_broken(false),
            // The session is gone, or its response was not read to the end: the pool closes
            // it and the next call takes a fresh one.
            Err(_) => self.conn = None,
        }
        result
    }
}

impl SqlClaimStore {
    /// The outbox's backlog (see [`OutboxStore::backlog`]), on the store's connection.
    pub async fn backlog(&mut self) -> Result<OutboxBacklog> {
        self.with_client(async |store, client| store.backlog(client).await)
            .await
    }
}

impl ClaimStore for SqlClaimStore {
    async fn claim(&mut self, batch_size: u32, claim_timeout: Duration) -> Result<Vec<Claimed>> {
        let wait = self.wait;
        let progress = self.progress.clone();
        progress.waiting();
        self.with_client(async |store, client| {
            let wait = effective_wait(wait, client.command_timeout(), CLAIM_WAIT_MARGIN);
            store
                .claim_reporting(client, batch_size, claim_timeout, wait, Some(&progress))
                .await
        })
        .await
    }

    fn claim_waits(&self) -> bool {
        !self.wait.is_zero()
    }

    fn claim_progress(&self) -> Option<ClaimProgress> {
        Some(self.progress.clone())
    }

    /// Sends the server an attention for the claim a relay abandoned (its future dropped
    /// half-way, which left the connection marked broken): SQL Server stops the procedure,
    /// rolling back a try in progress (`xact_abort`), so the claim neither keeps waiting nor
    /// takes rows for a relay that is gone. Bounded by `CANCEL_BOUND` (2 s); the connection is
    /// closed either way. A relay abandons only a claim whose answer has not begun
    /// ([`ClaimStore::claim_progress`]); a try that committed in the moment before the
    /// attention, its first packet not yet arrived, loses its rows to the claim timeout, as
    /// any abandoned claim does.
    async fn cancel_claim(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !conn.is_broken() {
            self.conn = Some(conn);
            return;
        }
        match tokio::time::timeout(CANCEL_BOUND, conn.cancel_query()).await {
            Ok(Ok(())) => tracing::debug!("cancelled the abandoned claim on the server"),
            Ok(Err(error)) => tracing::warn!(%error, "could not cancel the abandoned claim"),
            Err(_) => tracing::warn!(
                bound = ?CANCEL_BOUND,
                "the server did not acknowledge the cancel of the abandoned claim"
            ),
        }
        // Still marked broken: the pool closes it.
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> Result<u64> {
        self.with_client(async |store, client| store.mark_done(client, ids, token).await)
            .await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> Result<u64> {
        self.with_client(async |store, client| store.mark_failed(client, failed).await)
            .await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        self.with_client(async |store, client| store.requeue(client, id, Some(token), after).await)
            .await
    }

    fn outbox_name(&self) -> String {
        self.store.table().to_string()
    }
}
