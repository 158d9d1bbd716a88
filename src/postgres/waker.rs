//! [`PostgresWaker`]: wakes a relay when a message is committed, by LISTENing on the
//! outbox's notify channel, and falls back to polling when it cannot.
//!
//! The outbox's statement-level trigger `changefeed_notify` sends `NOTIFY` on the channel
//! `changefeed:<schema>.<table>` ([`OutboxTable::channel`]); PostgreSQL delivers it when the
//! enqueuing transaction commits, once per transaction. The waker holds a connection of its
//! own in LISTEN mode. It sends nothing to the outbox and holds no lock: it is only a hint.
//! Messages are claimed by the relay as always, so a missed or duplicate wake costs at most a
//! poll interval or one empty claim.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_postgres::{Config, Notification};

use super::table::OutboxTable;
use crate::error::Error;
use crate::outbox_backend::follow_or_poll;
use crate::pg_client::session::open;
use crate::relay::RelayHandle;

/// How the waker behaves; [`Default`] suits most deployments.
#[derive(Clone, Debug, PartialEq)]
pub struct PostgresWakerConfig {
    /// While it cannot listen, the waker wakes the relay this often: polling as a safety
    /// net. Default: 500 ms.
    pub fallback_poll: Duration,
    /// How long to wait before connecting again after the connection broke (or could not
    /// be made). Default: 1 s.
    pub reconnect_delay: Duration,
    /// How often the waker checks that its idle connection still answers (an empty query,
    /// which must answer within the same time). A connection that goes silent without
    /// closing (a dead peer, a dropped route) would otherwise deliver nothing for as long as
    /// TCP takes to notice. Default: 5 s.
    pub heartbeat: Duration,
}

impl Default for PostgresWakerConfig {
    fn default() -> Self {
        PostgresWakerConfig {
            fallback_poll: Duration::from_millis(500),
            reconnect_delay: Duration::from_secs(1),
            heartbeat: Duration::from_secs(5),
        }
    }
}

/// What the waker is doing, for health checks and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WakerState {
    /// Not connected yet.
    Starting,
    /// Listening on the channel.
    Listening {
        /// The channel, `changefeed:<schema>.<table>`.
        channel: String,
    },
    /// Polling every `fallback_poll`, because the waker cannot listen.
    Polling {
        /// Why (the error).
        reason: String,
    },
}

/// LISTENs on one outbox's channel and wakes a relay when a transaction that enqueued into
/// it commits.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::postgres::{PostgresOutboxStore, PostgresWaker, PostgresWakerConfig};
/// use changefeed::relay::{Relay, RelayConfig};
/// # struct Stdout;
/// # impl changefeed::relay::Publisher for Stdout {
/// #     async fn publish(&self, b: &[changefeed::outbox::ClaimedMessage]) -> Vec<changefeed::relay::PublishOutcome> { vec![Ok(()); b.len()] }
/// # }
/// let url = "postgres://relay:secret@localhost/app";
/// let store = PostgresOutboxStore::connect("public.outbox", url)?;
/// // Notifications wake the relay; its own poll is only the last safety net.
/// let config = RelayConfig::default().poll_interval(std::time::Duration::from_secs(5));
/// let relay = Relay::new(store, Stdout, config)?;
/// let waker = PostgresWaker::new(
///     changefeed::postgres::config(url)?,
///     "public.outbox".parse()?,
///     relay.handle(),
///     PostgresWakerConfig::default(),
/// );
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// tokio::spawn(waker.run(async { stopped.await.ok(); }));
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// stop.send(()).ok();
/// # Ok(()) }
/// ```
pub struct PostgresWaker {
    config: Config,
    table: OutboxTable,
    handle: RelayHandle,
    settings: PostgresWakerConfig,
    state: watch::Sender<WakerState>,
}

impl PostgresWaker {
    /// A waker for `table` in the database of `config`, waking `handle`'s relay.
    pub fn new(
        config: Config,
        table: OutboxTable,
        handle: RelayHandle,
        settings: PostgresWakerConfig,
    ) -> Self {
        PostgresWaker {
            config,
            table,
            handle,
            settings,
            state: watch::Sender::new(WakerState::Starting),
        }
    }

    /// Watches the waker's [`WakerState`].
    pub fn state(&self) -> watch::Receiver<WakerState> {
        self.state.subscribe()
    }

    /// Listens until `shutdown` completes: wakes the relay on every notification, and while
    /// it cannot listen (no connection, a broken or silent one) wakes it every
    /// `fallback_poll` and tries again every `reconnect_delay`. Each (re)connection wakes the
    /// relay once, for what was committed while nobody listened.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (poll, delay) = (self.settings.fallback_poll, self.settings.reconnect_delay);
        let polling = |reason: String| {
            tracing::warn!(%reason, "PostgreSQL waker: polling until it can listen again");
            self.state.send_replace(WakerState::Polling { reason });
            crate::metrics::wake_following(self.table.name(), "notify", false);
        };
        // LISTEN has no position to resume from: the source is the waker alone.
        follow_or_poll(
            &self.handle,
            poll,
            delay,
            shutdown,
            &self,
            |waker| Box::pin(waker.listen()),
            polling,
        )
        .await;
    }

    /// Connects, LISTENs and wakes on notifications; returns why it stopped.
    async fn listen(&self) -> String {
        let (client, mut notifications) = match open(&self.config).await {
            Ok(pair) => pair,
            Err(error) => return format!("cannot connect: {error}"),
        };
        let channel = self.table.channel();
        let reason = self
            .listening(&client, &channel, &mut notifications.received)
            .await;
        drop(client);
        // The driver ends once the client is gone; its reason is more precise when the
        // connection broke first.
        match timeout(Duration::from_secs(1), notifications.driver).await {
            Ok(Ok(broke)) if notifications.received.is_closed() => broke,
            _ => reason,
        }
    }

    async fn listening(
        &self,
        client: &tokio_postgres::Client,
        channel: &str,
        notifications: &mut mpsc::UnboundedReceiver<Notification>,
    ) -> String {
        let heartbeat = self.settings.heartbeat;
        // The channel is an identifier: double quotes, doubled inside (the name rule allows
        // none, but the quoting does not rely on it).
        let listen = format!("listen \"{}\"", channel.replace('"', "\"\""));
        match timeout(
            heartbeat.max(Duration::from_secs(5)),
            client.batch_execute(&listen),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return format!("LISTEN failed: {}", Error::from(error)),
            Err(_) => return "LISTEN got no answer".to_owned(),
        }
        tracing::info!(%channel, "PostgreSQL waker: listening");
        crate::metrics::wake_following(self.table.name(), "notify", true);
        self.state.send_replace(WakerState::Listening {
            channel: channel.to_owned(),
        });
        // Rows may have been committed while nobody listened.
        self.handle.wake();
        let mut next_beat = Instant::now() + heartbeat;
        loop {
            tokio::select! {
                received = notifications.recv() => match received {
                    Some(notification) if notification.channel() == channel => {
                        self.handle.wake();
                    }
                    Some(_) => {}
                    None => return "the connection ended".to_owned(),
                },
                () = sleep_until(next_beat) => {
                    match timeout(heartbeat, client.simple_query("")).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => {
                            return format!("the heartbeat failed: {}", Error::from(error));
                        }
                        Err(_) => {
                            return format!("the connection did not answer within {heartbeat:?}")
                        }
                    }
                    next_beat = Instant::now() + heartbeat;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_poll_and_beat() {
        let config = PostgresWakerConfig::default();
        assert!(config.fallback_poll > Duration::ZERO);
        assert!(config.heartbeat > Duration::ZERO);
        assert!(config.reconnect_delay > Duration::ZERO);
    }
}
