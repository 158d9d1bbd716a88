//! [`BinlogWaker`]: wakes a relay when a message is committed, by following the server's
//! binary log like a replica does, and falls back to polling when it cannot.
//!
//! Server settings it needs: `log_bin` on, `binlog_format=ROW` (with STATEMENT or MIXED an
//! insert is logged as SQL text, not as a row event of the outbox table), a `server_id`
//! (any; the waker registers with its own, [`BinlogWakerConfig::server_id`], which must
//! differ from the server's and from every other replica's and waker's). Grants for the
//! waker's user: `REPLICATION SLAVE` (to stream the log) and, to read the current position
//! with `SHOW MASTER STATUS`, `BINLOG MONITOR` on MariaDB 10.5+ or `REPLICATION CLIENT` on
//! MySQL. MariaDB 10.11 and MySQL 8.0 keep these defaults: MariaDB needs `log_bin` and
//! `binlog_format=ROW` turned on (it defaults to MIXED), MySQL 8.0 has both on by default.
//!
//! The waker sends nothing to the outbox and holds no lock: it is only a hint. Messages are
//! claimed by the relay as always, so a missed or duplicate wake costs at most a poll
//! interval or one empty claim.
//!
//! Faults: every step of (re)connecting is bounded by
//! [`connect_timeout`](BinlogWakerConfig::connect_timeout), and a stream silent for three
//! heartbeats is taken as a dead server; either way the waker polls and tries again. It
//! follows rotations (a `FLUSH LOGS`, a server restart) and, when the server refuses the
//! position it resumes from (error 1236: the file was purged, or the position is no event
//! boundary), it starts again from the server's current position. Compressed events
//! (MariaDB's `log_bin_compress`, MySQL's `binlog_transaction_compression`) still wake it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{Event, EventData, RowsEventData};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, Row};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::connection::{DEFAULT_CONNECT_TIMEOUT, SERVER, with_keepalive};
use super::table::OutboxTable;
use crate::error::Error;
use crate::outbox_backend::{bounded, follow_or_poll};
use crate::relay::RelayHandle;

/// The server refused to send the binlog from the position asked for
/// (`ER_MASTER_FATAL_ERROR_READING_BINLOG`): the file is gone, or the position is no
/// event boundary.
const CANNOT_READ_BINLOG: u16 = 1236;

/// MySQL's `TRANSACTION_PAYLOAD_EVENT`: a whole transaction, compressed
/// (`binlog_transaction_compression`), its commit inside.
const TRANSACTION_PAYLOAD_EVENT: u8 = 40;
/// MariaDB's compressed insert events (`log_bin_compress`): `WRITE_ROWS_COMPRESSED_EVENT_V1`
/// and `WRITE_ROWS_COMPRESSED_EVENT`. Their table id is not compressed.
const MARIADB_COMPRESSED_WRITES: [u8; 2] = [166, 169];

/// How the waker behaves; [`Default`] suits most deployments.
#[derive(Clone, Debug, PartialEq)]
pub struct BinlogWakerConfig {
    /// The server id the waker registers under, as replicas do. Two connections with one id
    /// make the server drop the older, so every waker (and replica) needs its own. Default:
    /// a random id in 2³⁰..2³¹.
    pub server_id: u32,
    /// While the binlog cannot be followed, the waker wakes the relay this often: polling
    /// as a safety net. Default: 500 ms.
    pub fallback_poll: Duration,
    /// How long to wait before trying to follow the binlog again after it broke (or was
    /// off). Default: 1 s.
    pub reconnect_delay: Duration,
    /// The heartbeat the waker asks the server for; a stream silent for three of them is
    /// taken as broken and reconnected. Default: 1 s.
    pub heartbeat: Duration,
    /// A second wake this long after each commit: the server sends a transaction's events
    /// once they are in the binlog, which can be a moment before InnoDB makes the rows
    /// visible, so a claim at the first wake may just miss them. `None`: no second wake.
    /// Default: 2 ms.
    pub settle: Option<Duration>,
    /// The bound on each step of (re)connecting: the connect itself, reading the position,
    /// asking for the stream. Default: [`DEFAULT_CONNECT_TIMEOUT`] (15 s).
    pub connect_timeout: Duration,
}

impl Default for BinlogWakerConfig {
    fn default() -> Self {
        BinlogWakerConfig {
            server_id: (1 << 30) + rand::random_range(0..(1u32 << 30)),
            fallback_poll: Duration::from_millis(500),
            reconnect_delay: Duration::from_secs(1),
            heartbeat: Duration::from_secs(1),
            settle: Some(Duration::from_millis(2)),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// What the waker is doing, for health checks and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WakerState {
    /// Not connected yet.
    Starting,
    /// Following the binlog; the last transaction boundary seen.
    Following {
        /// The binlog file.
        file: String,
        /// The position in it.
        position: u64,
    },
    /// Polling every `fallback_poll`, because the binlog could not be followed.
    Polling {
        /// Why (the error, or the setting that is missing).
        reason: String,
    },
}

/// Where to resume the binlog: the last transaction boundary seen.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position {
    file: String,
    position: u64,
}

/// Follows the ROW binlog events of one outbox table and wakes a relay when a transaction
/// that inserted into it commits.
///
/// ```no_run
/// # async fn run() -> changefeed::Result<()> {
/// use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore};
/// use changefeed::relay::{Relay, RelayConfig};
/// # struct Stdout;
/// # impl changefeed::relay::Publisher for Stdout {
/// #     async fn publish(&self, b: &[changefeed::outbox::ClaimedMessage]) -> Vec<changefeed::relay::PublishOutcome> { vec![Ok(()); b.len()] }
/// # }
/// let url = "mysql://relay:secret@localhost:3306/app";
/// let store = MysqlOutboxStore::connect("outbox", url)?;
/// // The binlog wakes the relay; its own poll is only the last safety net.
/// let config = RelayConfig::default().poll_interval(std::time::Duration::from_secs(5));
/// let relay = Relay::new(store, Stdout, config)?;
/// let waker = BinlogWaker::new(
///     changefeed::mysql::opts(url)?,
///     "outbox".parse()?,
///     relay.handle(),
///     BinlogWakerConfig::default(),
/// );
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// tokio::spawn(waker.run(async { stopped.await.ok(); }));
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// stop.send(()).ok();
/// # Ok(()) }
/// ```
pub struct BinlogWaker {
    opts: Opts,
    database: String,
    table: OutboxTable,
    handle: RelayHandle,
    config: BinlogWakerConfig,
    state: watch::Sender<WakerState>,
    /// The server's `lower_case_table_names` is not 0, so it compares database and table
    /// names without case (and under 1 writes them to the binlog in lower case): the
    /// binlog's names are compared with ours the same way. Read on every connect.
    names_fold_case: AtomicBool,
}

impl BinlogWaker {
    /// A waker for `table` in the database of `opts`, waking `handle`'s relay.
    pub fn new(
        opts: Opts,
        table: OutboxTable,
        handle: RelayHandle,
        config: BinlogWakerConfig,
    ) -> Self {
        let database = opts.db_name().unwrap_or_default().to_owned();
        BinlogWaker {
            opts,
            database,
            table,
            handle,
            config,
            state: watch::Sender::new(WakerState::Starting),
            names_fold_case: AtomicBool::new(false),
        }
    }

    /// Watches the waker's [`WakerState`].
    pub fn state(&self) -> watch::Receiver<WakerState> {
        self.state.subscribe()
    }

    /// Follows the binlog until `shutdown` completes: wakes the relay on every commit that
    /// inserted into the outbox, and while the binlog cannot be followed (off, not ROW, a
    /// missing grant, a broken stream) wakes it every `fallback_poll` and tries again every
    /// `reconnect_delay`, resuming from the last transaction boundary it saw.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (poll, delay) = (self.config.fallback_poll, self.config.reconnect_delay);
        let polling = |reason: String| {
            tracing::warn!(%reason, "binlog waker: polling until the binlog can be followed again");
            self.state.send_replace(WakerState::Polling { reason });
            crate::metrics::wake_following(self.table.name(), "binlog", false);
        };
        let resume: Option<Position> = None;
        follow_or_poll(
            &self.handle,
            poll,
            delay,
            shutdown,
            (&self, resume),
            |(waker, resume)| Box::pin(waker.follow(resume)),
            polling,
        )
        .await;
    }

    /// Connects, checks the settings, streams the binlog and wakes on commits; returns why
    /// it stopped. `resume` is kept up to date with the last transaction boundary.
    async fn follow(&self, resume: &mut Option<Position>) -> String {
        let limit = self.config.connect_timeout;
        let connect = async { Ok(Conn::new(with_keepalive(&self.opts)).await?) };
        let mut conn = match bounded(SERVER, limit, "the binlog connect", connect).await {
            Ok(conn) => conn,
            Err(error) => return format!("cannot connect: {error}"),
        };
        let read = async {
            let value: Option<u32> = conn.query_first("select @@lower_case_table_names").await?;
            Ok(value.unwrap_or(0))
        };
        match bounded(SERVER, limit, "lower_case_table_names", read).await {
            Ok(value) => self.names_fold_case.store(value != 0, Ordering::Relaxed),
            Err(error) => return format!("cannot read lower_case_table_names: {error}"),
        }
        let start = match resume.clone() {
            Some(position) => position,
            None => {
                let read = async { Ok(current_position(&mut conn).await) };
                match bounded(SERVER, limit, "show master status", read).await {
                    Ok(Ok(position)) => position,
                    Ok(Err(reason)) => return reason,
                    Err(error) => return error.to_string(),
                }
            }
        };
        let heartbeat_ns = self.config.heartbeat.as_nanos().min(u128::from(u32::MAX));
        // MySQL 8.0.26+ also reads the variable under its new name.
        let set_heartbeat = conn.query_drop(format!(
            "set @master_heartbeat_period = {heartbeat_ns}, \
             @source_heartbeat_period = {heartbeat_ns}"
        ));
        let set_heartbeat = async { Ok(set_heartbeat.await?) };
        if let Err(error) = bounded(SERVER, limit, "setting the heartbeat", set_heartbeat).await {
            return format!("cannot set the heartbeat: {error}");
        }
        let request = BinlogStreamRequest::new(self.config.server_id)
            .with_filename(start.file.as_bytes())
            .with_pos(start.position);
        let ask = async { Ok(conn.get_binlog_stream(request).await?) };
        let mut stream = match bounded(SERVER, limit, "the binlog dump request", ask).await {
            Ok(stream) => stream,
            Err(error) => {
                forget_refused_position(&error, resume);
                return format!("cannot stream the binlog: {error}");
            }
        };
        *resume = Some(start);
        let reason = self.stream(&mut stream, resume).await;
        let _ = timeout(Duration::from_secs(1), stream.close()).await;
        reason
    }

    async fn stream(&self, stream: &mut BinlogStream, resume: &mut Option<Position>) -> String {
        let silence = self.config.heartbeat * 3;
        // The dump request is only written when the stream is returned: the server may still
        // refuse the position (1236). Following is announced once the server has answered
        // with its first event, when its dump thread is running.
        let mut announced = false;
        let mut inserted = false;
        // The server starts a stream with a rotate restating the file asked for, sent before
        // the format description that announces checksums (so its name still carries
        // them): only rotates after that description move the position.
        let mut described = false;
        let mut settle_at: Option<Instant> = None;
        loop {
            let next = tokio::select! {
                biased;
                next = timeout(silence, stream.next()) => next,
                () = async { sleep_until(settle_at.expect("guarded")).await }, if settle_at.is_some() => {
                    settle_at = None;
                    self.handle.wake();
                    continue;
                }
            };
            let event = match next {
                Err(_) => return format!("no event or heartbeat for {silence:?}"),
                Ok(None) => return "the server ended the binlog stream".to_owned(),
                Ok(Some(Err(error))) => {
                    let error = Error::from(error);
                    forget_refused_position(&error, resume);
                    return format!("the binlog stream broke: {error}");
                }
                Ok(Some(Ok(event))) => event,
            };
            if !announced && let Some(start) = resume.as_ref() {
                announced = true;
                tracing::info!(file = %start.file, position = start.position, "binlog waker: following");
                crate::metrics::wake_following(self.table.name(), "binlog", true);
                self.state.send_replace(WakerState::Following {
                    file: start.file.clone(),
                    position: start.position,
                });
            }
            match self.classify(stream, &event, described) {
                Seen::Described => described = true,
                Seen::Insert => inserted = true,
                Seen::Commit => {
                    if inserted {
                        inserted = false;
                        self.handle.wake();
                        if let Some(settle) = self.config.settle {
                            settle_at = Some(Instant::now() + settle);
                        }
                    }
                    if let Some(position) = resume.as_mut()
                        && event.header().log_pos() > 0
                    {
                        position.position = u64::from(event.header().log_pos());
                        self.state.send_replace(WakerState::Following {
                            file: position.file.clone(),
                            position: position.position,
                        });
                    }
                }
                Seen::Payload => {
                    self.handle.wake();
                    if let Some(settle) = self.config.settle {
                        settle_at = Some(Instant::now() + settle);
                    }
                }
                Seen::Rotate(next) => {
                    *resume = Some(next.clone());
                    self.state.send_replace(WakerState::Following {
                        file: next.file,
                        position: next.position,
                    });
                }
                Seen::Other => {}
            }
        }
    }

    fn classify(&self, stream: &BinlogStream, event: &Event, described: bool) -> Seen {
        let raw_type = event.header().event_type_raw();
        if MARIADB_COMPRESSED_WRITES.contains(&raw_type) {
            // The library cannot read these; their post-header (the 6-byte table id first)
            // is not compressed, and the table map before them is an ordinary event.
            return match event.data().get(..6) {
                Some(id) if self.is_ours(stream, table_id(id)) => Seen::Insert,
                Some(_) => Seen::Other,
                // Unreadable: a needless wake is cheap, a missed one costs a poll.
                None => Seen::Insert,
            };
        }
        if raw_type == TRANSACTION_PAYLOAD_EVENT {
            // A compressed transaction holds its own commit, and no commit event follows:
            // wake for it (it may not touch the outbox; one empty claim is the cost).
            return Seen::Payload;
        }
        let data = match event.read_data() {
            Ok(Some(data)) => data,
            // Event types this library does not know (MariaDB's own) carry nothing we need.
            _ => return Seen::Other,
        };
        match data {
            EventData::RowsEvent(
                rows @ (RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_)),
            ) => {
                if self.is_ours(stream, rows.table_id()) {
                    Seen::Insert
                } else {
                    Seen::Other
                }
            }
            EventData::XidEvent(_) => Seen::Commit,
            EventData::QueryEvent(query) if query.query().eq_ignore_ascii_case("commit") => {
                Seen::Commit
            }
            EventData::FormatDescriptionEvent(_) => Seen::Described,
            // The rotate before the stream's first format description restates the file we
            // asked for with the checksum bytes still in its name: skip it. Every later one,
            // artificial (log_pos 0, sent when the server moves to the next file, e.g. after
            // a restart) or not (a FLUSH LOGS), names the file that follows.
            EventData::RotateEvent(_) if !described => Seen::Other,
            EventData::RotateEvent(rotate) => Seen::Rotate(Position {
                file: rotate.name().into_owned(),
                position: rotate.position(),
            }),
            _ => Seen::Other,
        }
    }

    /// Whether `table_id` maps to the outbox table, its names compared as the server
    /// compares them.
    fn is_ours(&self, stream: &BinlogStream, table_id: u64) -> bool {
        let fold = self.names_fold_case.load(Ordering::Relaxed);
        stream.get_tme(table_id).is_some_and(|map| {
            same_name(&map.table_name(), self.table.name(), fold)
                && same_name(&map.database_name(), &self.database, fold)
        })
    }
}

/// Whether the binlog's name `logged` names `ours`: exactly, or without case when the
/// server's `lower_case_table_names` is not 0 (`fold`).
fn same_name(logged: &str, ours: &str, fold: bool) -> bool {
    if fold {
        logged.to_lowercase() == ours.to_lowercase()
    } else {
        logged == ours
    }
}

/// A rows event's table id: 6 bytes, little-endian.
fn table_id(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .take(6)
        .rev()
        .fold(0, |id, byte| (id << 8) | u64::from(*byte))
}

/// After the server refused the resume position (error 1236: purged file, or a position
/// the server cannot read from), the next attempt starts from its current position instead
/// of failing the same way for good. The relay is woken on every reconnect, so commits in
/// between are not missed.
fn forget_refused_position(error: &Error, resume: &mut Option<Position>) {
    let refused = match error {
        Error::Mysql { code, .. } => *code == CANNOT_READ_BINLOG,
        // Some servers close the stream with the error text only.
        other => other.to_string().contains("1236"),
    };
    if refused && let Some(position) = resume.take() {
        tracing::warn!(
            file = %position.file,
            position = position.position,
            "binlog waker: the server cannot send the binlog from here; following from its \
             current position"
        );
    }
}

/// What one event means to the waker.
enum Seen {
    /// The stream's format description: checksums are known from here on.
    Described,
    /// A compressed transaction (its commit inside): wake.
    Payload,
    /// A row inserted into the outbox (its transaction's commit follows).
    Insert,
    /// A transaction boundary.
    Commit,
    /// The server moved to another binlog file.
    Rotate(Position),
    Other,
}

/// The server's current binlog file and position, after checking that the binlog is on
/// and in ROW format; the error says which setting or grant is missing.
async fn current_position(conn: &mut Conn) -> Result<Position, String> {
    let format: Option<String> = conn
        .query_first("select @@global.binlog_format")
        .await
        .map_err(|e| format!("cannot read binlog_format: {e}"))?;
    let format = format.unwrap_or_default();
    if !format.eq_ignore_ascii_case("ROW") {
        return Err(format!(
            "binlog_format is {format}; the waker needs ROW (set binlog_format=ROW)"
        ));
    }
    // MySQL 8.4 renamed the statement; MariaDB and MySQL 8.0 know the old name.
    let row: Option<Row> = match conn.query_first("show master status").await {
        Ok(row) => row,
        Err(_) => conn
            .query_first("show binary log status")
            .await
            .map_err(|e| {
                format!(
                    "cannot read the binlog position ({e}); grant BINLOG MONITOR (MariaDB) or \
                     REPLICATION CLIENT (MySQL)"
                )
            })?,
    };
    let row = row.ok_or_else(|| {
        "binary logging is off; start the server with log_bin (and binlog_format=ROW)".to_owned()
    })?;
    match (row.get::<String, usize>(0), row.get::<u64, usize>(1)) {
        (Some(file), Some(position)) => Ok(Position { file, position }),
        _ => Err("SHOW MASTER STATUS returned no file and position".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_compared_as_the_server_compares_them() {
        assert!(same_name("outbox", "outbox", false));
        assert!(!same_name("cf_mixed", "cf_Mixed", false));
        assert!(same_name("cf_mixed", "cf_Mixed", true));
        assert!(!same_name("cf_mixed", "cf_other", true));
    }

    #[test]
    fn table_ids_are_six_little_endian_bytes() {
        assert_eq!(table_id(&[0x2a, 0, 0, 0, 0, 0]), 42);
        assert_eq!(table_id(&[1, 2, 3, 4, 5, 6]), 0x0605_0403_0201);
    }

    #[test]
    fn only_a_refused_position_is_forgotten() {
        let position = || {
            Some(Position {
                file: "binlog.000001".to_owned(),
                position: 4,
            })
        };
        let refused = Error::Mysql {
            code: 1236,
            state: "HY000".to_owned(),
            message: "log event entry exceeded max_allowed_packet".to_owned(),
        };
        let mut resume = position();
        forget_refused_position(&refused, &mut resume);
        assert_eq!(resume, None);
        let mut resume = position();
        forget_refused_position(&Error::Connection("reset".to_owned()), &mut resume);
        assert_eq!(resume, position());
    }

    #[test]
    fn default_server_ids_stay_clear_of_small_configured_ones() {
        for _ in 0..100 {
            let id = BinlogWakerConfig::default().server_id;
            assert!((1 << 30..1 << 31).contains(&id), "{id}");
        }
        let config = BinlogWakerConfig::default();
        assert!(config.fallback_poll > Duration::ZERO);
        assert!(config.heartbeat > Duration::ZERO);
    }
}
