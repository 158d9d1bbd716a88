//! The one error type of the crate.

use std::fmt;

use ulid::Ulid;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, with SQL Server's error number kept where the server
/// raised it, so callers can match on it (see the error table in README.md).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A table name (a feed's event table, an outbox) that cannot be used; the message
    /// says why and what to do.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// A cursor that cannot be parsed or built.
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    /// An error raised by SQL Server, with its number (e.g. 1205, 51101).
    #[error("SQL Server error {number} (state {state}, class {class}): {message}")]
    Server {
        /// The error number (`ERROR_NUMBER()`).
        number: u32,
        /// The error state.
        state: u8,
        /// The severity class.
        class: u8,
        /// The server's message.
        message: String,
    },
    /// `read_feed` refused the cursor because events after it were purged (server error
    /// 51104): the consumer has lost events. Not transient: resume from
    /// [`crate::Cursor::START`] (the oldest retained event) or a later cursor, knowing what is
    /// gone; so that purges wait for the consumer, save its cursor and have whoever
    /// administers the feed register it (`changefeed.register_consumer`; docs/sql-server.md,
    /// "Retention").
    #[error("cursor expired (error 51104, SQLSTATE CF104 on PostgreSQL): {message}")]
    CursorExpired {
        /// The server's message, naming the cursor and the low-water mark.
        message: String,
    },
    /// An error raised by MariaDB or MySQL (the `mysql` feature), with its error code (e.g.
    /// 1213 deadlock, 1205 lock wait timeout, or 51000 and 51306 from the bundle's
    /// `changefeed_setup_outbox`) and SQLSTATE.
    #[error("MariaDB/MySQL error {code} ({state}): {message}")]
    Mysql {
        /// The server's error code.
        code: u16,
        /// The SQLSTATE, e.g. `40001`.
        state: String,
        /// The server's message.
        message: String,
    },
    /// An error raised by PostgreSQL (the `postgres` feature), with its SQLSTATE (e.g.
    /// `40P01` deadlock, `57014` statement timeout, or `CF000` and `CF306` from the bundle's
    /// `changefeed.setup_outbox`, numbers 51000 and 51306 of the other bundles).
    #[error("PostgreSQL error {state}: {message}")]
    Postgres {
        /// The SQLSTATE.
        state: String,
        /// The server's message, with its detail and hint when it gave them.
        message: String,
    },
    /// An error from the Kafka client (the `kafka` feature): librdkafka's error code name
    /// (e.g. `TopicAuthorizationFailed`, `MessageSizeTooLarge`) when it has one, and its
    /// message.
    #[error("Kafka: {message}")]
    Kafka {
        /// librdkafka's error code, as its `RDKafkaErrorCode` name.
        code: Option<String>,
        /// What went wrong, with what to do about it where that is known.
        message: String,
    },
    /// A connection-level failure: I/O, TLS, protocol, a redirect to another host.
    #[error("connection to the database failed: {0}")]
    Connection(String),
    /// A value that could not be decoded into the requested Rust type, or text the driver
    /// could not read (invalid UTF-8 or UTF-16, an unsupported encoding). Deterministic:
    /// reading the same row again fails the same way, so it is never transient.
    ///
    /// For a feed row, `row` is the row's ULID: a consumer that decides to skip the row
    /// resumes after it with [`crate::Cursor::from_ulid`] (the rows of the same page before
    /// it were not delivered either: resume from the page's cursor with a smaller page to
    /// get them first).
    #[error("cannot decode column {column}{}: {reason}", RowSuffix(row.as_ref()))]
    Decode {
        /// The column (name or position) that failed.
        column: String,
        /// What did not fit.
        reason: String,
        /// The ULID of the feed row that failed, when a feed row failed.
        row: Option<Ulid>,
    },
    /// Applying the migration bundle failed.
    #[error("applying the changefeed migrations failed: {0}")]
    Migration(String),
    /// A setting is missing or wrong (connection string, environment variable).
    #[error("configuration: {0}")]
    Config(String),
    /// The relay's publisher failed in a way the relay cannot retry around (a fatal error,
    /// a panic, outcomes that do not match the batch); the message says what happened.
    #[error("publisher: {0}")]
    Publisher(String),
    /// The server sent the session to another host (Azure SQL gateway); connecting there
    /// again is the fix, which [`crate::connect`] does once.
    #[error("SQL Server redirected the connection to {host}:{port}")]
    Redirect {
        /// The host to connect to.
        host: String,
        /// Its port.
        port: u16,
    },
}

/// MariaDB/MySQL error codes a client may retry: lock wait timeout (also MariaDB's answer
/// to `NOWAIT`), deadlock, MySQL's `NOWAIT` refusal, too many connections, server shutdown,
/// connection killed (MariaDB 1927, MySQL 4031 idle disconnect), query interrupted.
const TRANSIENT_MYSQL_ERRORS: &[u16] = &[1205, 1213, 3572, 1040, 1053, 1927, 4031, 1317];

/// PostgreSQL SQLSTATEs a client may retry: serialization failure, deadlock, lock not
/// available, statement timeout or cancel, too many connections, out of memory, a prepared
/// statement the server no longer has (26000: `DISCARD ALL`, or a pooler that handed the
/// session to another server connection; a caller drops its connection on a failed call,
/// and the next one prepares again), and the feed bundle's "lock not granted in time"
/// errors (a read function's mover waiting for another mover of the shard CF103,
/// `lock_feed_<id>` CF202: 51103 and 51202 on SQL Server). The session-ending states
/// (class 08, 57P01-57P03) are [`Error::Connection`].
const TRANSIENT_POSTGRES_STATES: &[&str] = &[
    "40001", "40P01", "55P03", "57014", "53300", "53200", "26000", "CF103", "CF202",
];

/// read_feed's "cursor expired" error.
const CURSOR_EXPIRED: u32 = 51104;

/// SQL Server error numbers a client may retry: deadlock victim, lock timeout, a dirty read
/// that lost its place to a page split (601: claim's head probe reads READUNCOMMITTED), a
/// snapshot update conflict (3960: a caller's SNAPSHOT transaction met a concurrent change),
/// our own "lock not granted" errors (generators 51012, read_feed 51103, lock_feed 51202,
/// save_cursor's snapshot conflict 51113, the consumer lock of save_cursor and
/// remove_consumer 51115, enqueue's message_id lock 51305 and its aggregate lock 51310), a
/// module altered while this call ran it (2801, "the definition of object … has changed since
/// it was compiled": an upgrade regenerated a feed's or outbox's procedure; the next call
/// compiles the new definition), and the Azure SQL transient set (reconfiguration,
/// failover, throttling, a serverless database that is paused or resuming: 10936, 42108,
/// 42109).
///
/// 4060 ("cannot open database requested by the login") is *not* here: on SQL Server it
/// means the database does not exist or the login may not use it, which no retry fixes.
/// Azure SQL Database also raises it while a database moves between nodes; for hosts of
/// Azure SQL Database the connect path ([`crate::connection`]) turns it into a transient
/// [`Error::Connection`] instead.
const TRANSIENT_SERVER_ERRORS: &[u32] = &[
    601, 1205, 1222, 2801, 3960, 51012, 51103, 51113, 51115, 51202, 51305, 51310, 4221, 10928,
    10929, 10936, 40143, 40197, 40501, 40540, 40613, 42108, 42109, 49918, 49919, 49920,
];

/// Login failures: a wrong password or unknown login (18456), an untrusted domain login
/// (18452), a disabled (18470) or locked-out (18486) account, an expired password (18487),
/// a password that must be changed (18488), an unknown or forbidden database (4060; from
/// Azure SQL Database it is transient instead, see [`Error::is_transient`]). None of them
/// goes away by retrying.
pub const LOGIN_ERRORS: &[u32] = &[18456, 18452, 18470, 18486, 18487, 18488, 4060];

impl Error {
    /// The server's error number, when the server raised the error: SQL Server's, or
    /// MariaDB/MySQL's code for [`Error::Mysql`].
    pub fn server_number(&self) -> Option<u32> {
        match self {
            Error::Server { number, .. } => Some(*number),
            Error::Mysql { code, .. } => Some(u32::from(*code)),
            // The bundle's own SQLSTATEs CFnnn stand for the numbers 51nnn.
            Error::Postgres { state, .. } => state
                .strip_prefix("CF")
                .and_then(|n| n.parse::<u32>().ok())
                .map(|n| 51_000 + n),
            Error::CursorExpired { .. } => Some(CURSOR_EXPIRED),
            _ => None,
        }
    }

    /// The error for a server error number: [`Error::CursorExpired`] for 51104, else
    /// [`Error::Server`].
    pub fn from_server(number: u32, state: u8, class: u8, message: String) -> Error {
        if number == CURSOR_EXPIRED {
            Error::CursorExpired { message }
        } else {
            Error::Server {
                number,
                state,
                class,
                message,
            }
        }
    }

    /// The ULID of the feed row an [`Error::Decode`] is about, when it is about one.
    pub fn row_ulid(&self) -> Option<Ulid> {
        match self {
            Error::Decode { row, .. } => *row,
            _ => None,
        }
    }

    /// The same error, naming feed row `ulid` when it is an [`Error::Decode`]; other errors
    /// are returned as they are.
    pub fn at_row(self, ulid: Ulid) -> Error {
        match self {
            Error::Decode { column, reason, .. } => Error::Decode {
                column,
                reason,
                row: Some(ulid),
            },
            other => other,
        }
    }

    /// Whether the server refused the login (see [`LOGIN_ERRORS`]).
    pub fn is_login_failure(&self) -> bool {
        matches!(self, Error::Server { number, .. } if LOGIN_ERRORS.contains(number))
    }

    /// Whether the error ended the server session (severity class 20 and above, e.g. 596
    /// after a `KILL`) or the connection itself: the connection it happened on must not be
    /// used again.
    pub fn ends_session(&self) -> bool {
        match self {
            Error::Server { class, .. } => *class >= 20,
            Error::Connection(_) | Error::Redirect { .. } => true,
            _ => false,
        }
    }

    /// Whether retrying the same call on a fresh connection may succeed: deadlocks, lock
    /// timeouts, dropped connections and Azure's transient errors are; bad input, missing
    /// permissions (229), missing procedures (2812), failed logins and undecodable values
    /// are not.
    pub fn is_transient(&self) -> bool {
        match self {
            // Severity 20 and above ends the session (e.g. 596 after a KILL): the call may
            // well succeed on a fresh connection.
            Error::Server { number, class, .. } => {
                *class >= 20 || TRANSIENT_SERVER_ERRORS.contains(number)
            }
            Error::Mysql { code, .. } => TRANSIENT_MYSQL_ERRORS.contains(code),
            Error::Postgres { state, .. } => TRANSIENT_POSTGRES_STATES.contains(&state.as_str()),
            Error::Connection(_) | Error::Redirect { .. } => true,
            _ => false,
        }
    }
}

impl From<tiberius::error::Error> for Error {
    fn from(error: tiberius::error::Error) -> Self {
        use tiberius::error::Error as T;
        match error {
            T::Server(token) => Error::from_server(
                token.code(),
                token.state(),
                token.class(),
                token.message().to_owned(),
            ),
            T::Routing { host, port } => Error::Redirect { host, port },
            T::Io { .. } | T::Tls(_) | T::Protocol(_) => Error::Connection(error.to_string()),
            // Text or numbers the driver cannot read: the same bytes fail the same way on
            // every connection, so these are decode errors, never transient.
            T::Conversion(reason) | T::Encoding(reason) => decode_error("?", reason),
            T::Utf8 => decode_error("?", "the server sent text that is not valid UTF-8"),
            T::Utf16 => decode_error(
                "?",
                "the server sent text that is not valid UTF-16 (an unpaired surrogate)",
            ),
            T::ParseInt(error) => decode_error("?", error),
            T::BulkInput(reason) => decode_error("bulk input", reason),
            // Authentication-library errors exist only with tiberius features this crate
            // does not enable (another crate in the build may).
            #[allow(unreachable_patterns)]
            other => Error::Connection(other.to_string()),
        }
    }
}

#[cfg(feature = "mysql")]
impl From<mysql_async::Error> for Error {
    fn from(error: mysql_async::Error) -> Self {
        use mysql_async::Error as M;
        match error {
            M::Server(server) => Error::Mysql {
                code: server.code,
                state: server.state,
                message: server.message,
            },
            M::Url(url) => Error::Config(format!("the MariaDB/MySQL URL is not usable: {url}")),
            M::Driver(mysql_async::DriverError::FromValue { value }) => Error::Decode {
                column: "?".to_owned(),
                reason: format!("unexpected value {value:?}"),
                row: None,
            },
            other => {
                let text = other.to_string();
                // mysql_async refuses to send a packet over the server's limit (read when the
                // connection opened): the same statement fails the same way on every
                // connection, so it is permanent, and the fix is the limit or the message.
                if text.contains("larger than max_allowed_packet") {
                    return Error::Mysql {
                        code: NET_PACKET_TOO_LARGE,
                        state: "08S01".to_owned(),
                        message: format!(
                            "the statement is larger than max_allowed_packet, the server's \
                             limit on one packet ({text}); send a smaller message, or raise \
                             the limit on the server (SET GLOBAL max_allowed_packet; \
                             connections opened after that get it)"
                        ),
                    };
                }
                Error::Connection(format!("MariaDB/MySQL: {text}"))
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        match error.as_db_error() {
            Some(db) => Error::from_postgres(db),
            // No answer from the server: the connection broke, timed out or was closed.
            None => Error::Connection(format!("PostgreSQL: {error}")),
        }
    }
}

#[cfg(feature = "postgres")]
impl Error {
    /// An error PostgreSQL raised. Class 08 (connection exception) and 57P01-57P03 (the
    /// server is shutting down or starting) end the session, so they become
    /// [`Error::Connection`] and the store opens a new one.
    pub(crate) fn from_postgres(db: &tokio_postgres::error::DbError) -> Error {
        let state = db.code().code();
        let mut message = db.message().to_owned();
        for extra in [db.detail(), db.hint()].into_iter().flatten() {
            message.push_str(". ");
            message.push_str(extra);
        }
        if state.starts_with("08") || matches!(state, "57P01" | "57P02" | "57P03") {
            return Error::Connection(format!("PostgreSQL error {state}: {message}"));
        }
        // read_feed's expired cursor is the same error on every engine, so that a consumer
        // matches one variant.
        if state == "CF104" {
            return Error::CursorExpired { message };
        }
        Error::Postgres {
            state: state.to_owned(),
            message,
        }
    }
}

/// MariaDB/MySQL's `ER_NET_PACKET_TOO_LARGE`, the server's own code for a packet over
/// `max_allowed_packet`.
#[cfg(feature = "mysql")]
const NET_PACKET_TOO_LARGE: u16 = 1153;

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Connection(error.to_string())
    }
}

/// Wraps a column position or name for [`Error::Decode`].
pub(crate) fn decode_error(column: impl fmt::Display, reason: impl fmt::Display) -> Error {
    Error::Decode {
        column: column.to_string(),
        reason: reason.to_string(),
        row: None,
    }
}

/// An [`Error::InvalidName`]: `name` refused for `reason`.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn invalid_name(name: &str, reason: &str) -> Error {
    Error::InvalidName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    }
}

/// The first of the causes of `error` (its source, the source's source, …) that `pick`
/// takes: how a migration error keeps the server error that refinery wrapped.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn find_cause<'e, T>(
    error: &'e (dyn std::error::Error + 'static),
    pick: impl Fn(&'e (dyn std::error::Error + 'static)) -> Option<T>,
) -> Option<T> {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(picked) = pick(cause) {
            return Some(picked);
        }
        source = cause.source();
    }
    None
}

/// " of row <ulid>" in an [`Error::Decode`] message when the row is known.
struct RowSuffix<'a>(Option<&'a Ulid>);

impl fmt::Display for RowSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ulid) => write!(f, " of feed row {ulid}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(number: u32) -> Error {
        Error::Server {
            number,
            state: 1,
            class: 16,
            message: String::new(),
        }
    }

    #[test]
    fn deadlocks_and_lock_timeouts_are_transient() {
        assert!(server(1205).is_transient());
        assert!(server(1222).is_transient());
        assert!(server(51103).is_transient());
        assert!(
            server(51305).is_transient(),
            "enqueue's message_id lock not granted"
        );
        assert!(Error::Connection("reset".into()).is_transient());
        // A procedure regenerated by an upgrade while the call ran it: the next call compiles
        // the new definition (a feed stream goes on instead of ending).
        assert!(server(2801).is_transient());
    }

    #[test]
    fn an_expired_cursor_is_its_own_variant_and_final() {
        let error = Error::from_server(
            51104,
            1,
            16,
            "read_feed: cursor expired: events after 0x01 up to 0x02 in shard 0 were purged."
                .into(),
        );
        assert!(matches!(&error, Error::CursorExpired { message } if message.contains("purged")));
        assert_eq!(error.server_number(), Some(51104));
        assert!(!error.is_transient());
    }

    #[test]
    fn errors_that_end_the_session_are_transient() {
        let killed = Error::from_server(596, 1, 21, "session is in the kill state".into());
        assert!(killed.is_transient());
        assert!(Error::from_server(0, 0, 20, String::new()).is_transient());
    }

    #[test]
    fn azure_serverless_pause_and_resume_are_transient() {
        for number in [10936, 42108, 42109, 40613, 40501] {
            assert!(server(number).is_transient(), "{number}");
        }
    }

    #[test]
    fn login_failures_are_permanent_and_recognised() {
        for number in [18456, 18452, 18470, 18486, 18487, 18488, 4060] {
            let error = Error::from_server(number, 1, 14, "Login failed".into());
            assert!(!error.is_transient(), "{number}");
            assert!(error.is_login_failure(), "{number}");
        }
        assert!(!server(1205).is_login_failure());
    }

    #[test]
    fn driver_decode_errors_are_permanent_decode_errors() {
        use std::borrow::Cow;
        use tiberius::error::Error as T;
        let parse = "x".parse::<i32>().unwrap_err();
        for error in [
            T::Utf8,
            T::Utf16,
            T::Encoding(Cow::Borrowed("collation 0x0409 unsupported")),
            T::ParseInt(parse),
            T::BulkInput(Cow::Borrowed("column count")),
            T::Conversion(Cow::Borrowed("i64 from nvarchar")),
        ] {
            let shown = error.to_string();
            let error = Error::from(error);
            assert!(matches!(error, Error::Decode { .. }), "{shown}: {error:?}");
            assert!(!error.is_transient(), "{shown}");
            assert!(!error.ends_session(), "{shown}");
        }
        let io = Error::from(T::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        });
        assert!(io.is_transient() && io.ends_session());
    }

    #[test]
    fn decode_errors_name_the_feed_row() {
        let ulid = Ulid::from_bytes([1; 16]);
        let error = decode_error("payload (position 3)", "expected a number").at_row(ulid);
        assert_eq!(error.row_ulid(), Some(ulid));
        assert!(error.to_string().contains(&ulid.to_string()), "{error}");
        assert_eq!(decode_error("x", "y").row_ulid(), None);
        assert!(matches!(
            Error::Config("x".into()).at_row(ulid),
            Error::Config(_)
        ));
    }

    #[test]
    fn only_fatal_classes_and_lost_connections_end_the_session() {
        assert!(Error::from_server(596, 1, 21, String::new()).ends_session());
        assert!(Error::from_server(0, 0, 20, String::new()).ends_session());
        assert!(!server(1205).ends_session());
        assert!(Error::Connection("gone".into()).ends_session());
    }

    #[test]
    #[cfg(feature = "mysql")]
    fn a_packet_over_max_allowed_packet_is_permanent_and_names_the_limit() {
        let io = std::io::Error::other("Packet is larger than max_allowed_packet");
        let error = Error::from(mysql_async::Error::Io(mysql_async::IoError::Io(io)));
        assert!(!error.is_transient(), "{error}");
        assert_eq!(error.server_number(), Some(1153));
        assert!(
            error.to_string().contains("SET GLOBAL max_allowed_packet"),
            "{error}"
        );
        // Any other I/O failure stays a (transient) connection error.
        let io = std::io::Error::other("Broken pipe");
        let error = Error::from(mysql_async::Error::Io(mysql_async::IoError::Io(io)));
        assert!(error.is_transient(), "{error}");
    }

    #[test]
    fn mysql_deadlocks_and_lock_waits_are_transient_and_numbered() {
        let mysql = |code| Error::Mysql {
            code,
            state: "HY000".into(),
            message: String::new(),
        };
        assert!(mysql(1213).is_transient());
        assert!(mysql(1205).is_transient());
        assert!(!mysql(51000).is_transient());
        assert!(!mysql(1146).is_transient()); // no such table
        assert_eq!(mysql(51306).server_number(), Some(51306));
    }

    #[test]
    fn bad_input_and_permissions_are_not_transient() {
        assert!(!server(2812).is_transient()); // could not find stored procedure
        assert!(!server(51101).is_transient());
        assert!(!server(229).is_transient()); // permission denied
        assert!(!Error::InvalidCursor("x".into()).is_transient());
        assert_eq!(server(51101).server_number(), Some(51101));
        assert_eq!(Error::Config("x".into()).server_number(), None);
    }

    /// What a PostgreSQL feed reader retries on a fresh connection and what ends its
    /// stream (57P01 and the other session-ending states arrive as `Connection`).
    #[test]
    fn postgres_feed_states_are_transient_or_permanent_as_on_sql_server() {
        let postgres = |state: &str| Error::Postgres {
            state: state.to_owned(),
            message: String::new(),
        };
        for transient in [
            "40001", "40P01", "55P03", "57014", "26000", "CF103", "CF202",
        ] {
            assert!(postgres(transient).is_transient(), "{transient}");
        }
        for permanent in ["CF101", "CF104", "CF006", "CF100", "42883", "42501"] {
            assert!(!postgres(permanent).is_transient(), "{permanent}");
        }
        assert!(Error::Connection("PostgreSQL error 57P01: terminating".into()).is_transient());
    }
}
