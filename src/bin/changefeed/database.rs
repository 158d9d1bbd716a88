//! What the commands share about the database: where it is and how long to wait
//! ([`Connect`]), which database a URL names, opening a SQL Server connection with a one-line
//! failure, the queries every command makes (rows, does this object exist, a column by
//! name), and the lines for what is missing (not a feed, not an outbox, an old bundle). It
//! imports no command, so every command can import it.

#[cfg(feature = "postgres")]
pub mod postgres;

use std::time::Duration;

use changefeed::connection::{Client, URL_VARIABLE, connect_with};
use changefeed::pool::ConnectionManager;
use changefeed::row::Column;
use changefeed::{Error, Feed, TableName};
use tiberius::{ColumnData, Row};

use crate::failure::Failure;

/// Where to look when the connection fails.
pub const CHECK_URL: &str = "check --url or CHANGEFEED_URL";

/// Whether `url` is for MariaDB/MySQL.
pub fn is_mysql(url: &str) -> bool {
    url.trim_start()
        .to_ascii_lowercase()
        .starts_with("mysql://")
}

/// Whether `url` is for PostgreSQL.
pub fn is_postgres(url: &str) -> bool {
    let url = url.trim_start().to_ascii_lowercase();
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The kind of database a `--url` names: every command says which of these it supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// An ADO.NET connection string (SQL Server, Azure SQL).
    SqlServer,
    /// A `postgres://` or `postgresql://` URL.
    Postgres,
    /// A `mysql://` URL (MariaDB/MySQL).
    Mysql,
}

impl Store {
    /// Every store, in the order the messages list them.
    pub const ALL: [Store; 3] = [Store::SqlServer, Store::Postgres, Store::Mysql];

    /// The store `url` names (anything that is not a `postgres://` or `mysql://` URL is
    /// taken for an ADO.NET string, whose parser then says what is wrong with it).
    pub fn of(url: &str) -> Store {
        if is_mysql(url) {
            Store::Mysql
        } else if is_postgres(url) {
            Store::Postgres
        } else {
            Store::SqlServer
        }
    }

    /// The store's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Store::SqlServer => "SQL Server",
            Store::Postgres => "PostgreSQL",
            Store::Mysql => "MariaDB/MySQL",
        }
    }

    /// The store and the kind of `--url` that names it, for messages.
    pub fn described(self) -> &'static str {
        match self {
            Store::SqlServer => "SQL Server (an ADO.NET --url)",
            Store::Postgres => "PostgreSQL (a postgres:// --url)",
            Store::Mysql => "MariaDB/MySQL (a mysql:// --url)",
        }
    }
}

/// How to open a connection.
pub struct Connect {
    /// The connection string (`--url` or `CHANGEFEED_URL`).
    pub url: String,
    /// `--connect-timeout`.
    pub timeout: Duration,
}

impl Connect {
    /// A connection with this tiberius command timeout (`None`: a long purge or migration
    /// is not cut off after 30 s), or a failure naming the server's address.
    pub async fn open(&self, command_timeout: Option<Duration>) -> Result<Client, Failure> {
        let manager = ConnectionManager::from_ado(&self.url).map_err(|error| match error {
            Error::Config(message) => Failure::connect(format!("{message}; {CHECK_URL}")),
            other => Failure::connect(format!("{other}; {CHECK_URL}")),
        })?;
        // --connect-timeout bounds the TCP connect and the login handshake (tiberius'
        // handshake timeout, whose own default of 15 s would otherwise cut a longer one).
        let config = manager
            .command_timeout(command_timeout)
            .connect_timeout(Some(self.timeout))
            .config()
            .clone();
        let address = config.get_addr();
        connect_with(config)
            .await
            .map_err(|error| Failure::connect(connect_message(&address, &error, self.timeout)))
    }
}

/// The line for a connection that could not be opened: the address, what went wrong,
/// and where the connection string comes from (and `--connect-timeout` when `timeout` ran
/// out).
pub fn connect_message(address: &str, error: &Error, timeout: Duration) -> String {
    match error {
        Error::Connection(message) if message.contains(&format!("within {timeout:?}")) => {
            format!("{message}; {CHECK_URL} (or raise --connect-timeout)")
        }
        Error::Connection(message) if message.contains(address) => {
            format!("{message}; {CHECK_URL}")
        }
        Error::Server {
            number, message, ..
        } => format!(
            "SQL Server at {address} refused the connection: {message} (error {number}); \
             check the user, password and database in --url or {URL_VARIABLE}"
        ),
        other => format!("cannot connect to SQL Server at {address}: {other}; {CHECK_URL}"),
    }
}

/// One connection to the MariaDB/MySQL database of a `mysql://` URL (and the URL's
/// settings), or a one-line failure naming the server (exit status 2).
#[cfg(feature = "mysql")]
pub async fn open_mysql(
    connect: &Connect,
) -> Result<(mysql_async::Opts, mysql_async::Conn), Failure> {
    let opts = changefeed::mysql::opts(&connect.url).map_err(|e| Failure::usage(e.to_string()))?;
    let address = match opts.socket() {
        Some(socket) => socket.to_owned(),
        None => format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port()),
    };
    let conn = changefeed::mysql::connect_within(&opts, connect.timeout)
        .await
        .map_err(|error| {
            Failure::connect(format!(
                "cannot connect to MariaDB/MySQL at {address}: {error}; {CHECK_URL} (or raise \
                 --connect-timeout)"
            ))
        })?;
    Ok((opts, conn))
}

/// Runs a query and returns its first result set.
pub async fn query_rows(
    client: &mut Client,
    sql: &str,
    params: &[&dyn tiberius::ToSql],
) -> Result<Vec<Row>, Error> {
    Ok(client.query(sql, params).await?.into_first_result().await?)
}

/// Whether the procedure `name` (a bracketed `[changefeed].[kind:schema.table]`) exists.
pub async fn procedure_exists(client: &mut Client, name: &str) -> Result<bool, Error> {
    let rows = query_rows(client, "select object_id(@P1, N'P')", &[&name]).await?;
    Ok(match rows.first() {
        Some(row) => Option::<i32>::column(row, 0)?.is_some(),
        None => false,
    })
}

/// Refuses a database where `feed` is not a feed (its `read_feed` is missing): one clear
/// line, before a stream would retry.
pub async fn require_feed(client: &mut Client, feed: &Feed) -> Result<(), Failure> {
    if procedure_exists(client, &feed.read_feed_procedure()).await? {
        Ok(())
    } else {
        Err(Failure::run(not_a_feed(feed)))
    }
}

/// Refuses a database where `table` is not a claim outbox (its procedure `kind` is
/// missing).
pub async fn require_outbox(
    client: &mut Client,
    table: &TableName,
    kind: &str,
) -> Result<(), Failure> {
    let procedure = table.object(kind);
    if procedure_exists(client, &procedure).await? {
        Ok(())
    } else {
        Err(Failure::run(not_an_outbox(table, &procedure)))
    }
}

/// The position of the column named `name` of `row`.
pub fn position(row: &Row, name: &str) -> Result<usize, Error> {
    row.columns()
        .iter()
        .position(|column| column.name() == name)
        .ok_or_else(|| Error::Decode {
            column: name.to_owned(),
            reason: "the result has no such column".to_owned(),
            row: None,
        })
}

/// The cell named `name` of `row`.
pub fn cell<'r>(row: &'r Row, name: &str) -> Result<&'r ColumnData<'static>, Error> {
    let at = position(row, name)?;
    Ok(row
        .cells()
        .nth(at)
        .map(|(_, data)| data)
        .expect("a row has a cell for each of its columns"))
}

/// A hint for errors that mean the bundle is missing or old (invalid object 208, invalid
/// column 207, missing procedure 2812).
pub fn with_migrate_hint(error: Error) -> Failure {
    match error.server_number() {
        Some(207 | 208 | 2812) => Failure::run(format!(
            "{error} (is the changefeed bundle applied and current? run `changefeed migrate`)"
        )),
        _ => Failure::from(error),
    }
}

/// The line for a feed that is not there.
fn not_a_feed(feed: &Feed) -> String {
    format!(
        "{feed} is not a feed in this database ({} does not exist); make it one with \
         `changefeed setup-feed {feed} --outbox` (or check the database in --url)",
        feed.read_feed_procedure()
    )
}

/// The line for a claim outbox that is not there (`procedure`, one of its procedures, is
/// missing).
fn not_an_outbox(table: &TableName, procedure: &str) -> String {
    format!(
        "{table} is not a claim outbox in this database ({procedure} does not exist); create \
         it with exec changefeed.setup_outbox @table_name = N'{table}' (or check the database \
         in --url)"
    )
}

/// Rows made by hand, for the tests of what the commands do with a result.
#[cfg(test)]
pub mod test_rows {
    use tiberius::{ColumnData, ColumnType, Row};
    use ulid::Ulid;

    /// A row of these columns: name, type, value.
    pub fn row(columns: Vec<(&str, ColumnType, ColumnData<'static>)>) -> Row {
        columns
            .into_iter()
            .fold(Row::builder(), |row, (name, kind, data)| {
                row.column(name, kind, data)
            })
            .build()
    }

    /// An `nvarchar` value.
    pub fn text(value: Option<&str>) -> ColumnData<'static> {
        ColumnData::String(value.map(|v| v.to_owned().into()))
    }

    /// A `binary(16)` ULID value.
    pub fn ulid(value: Option<Ulid>) -> ColumnData<'static> {
        ColumnData::Binary(value.map(|u| u.to_bytes().to_vec().into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_database() {
        assert!(is_mysql("mysql://relay@db/app"));
        assert!(is_mysql(" MYSQL://relay@db/app"));
        assert!(!is_mysql("server=tcp:db,1433;database=app"));
        assert!(is_postgres("postgres://relay@db/app"));
        assert!(is_postgres(" POSTGRESQL://relay@db/app"));
        assert!(!is_postgres("mysql://relay@db/app"));
        assert!(!is_postgres("server=tcp:db,1433;database=app"));
    }

    #[test]
    fn the_connection_line_names_the_address_and_what_to_set() {
        let unreachable = Error::Connection(
            "cannot reach SQL Server at 127.0.0.1:1: Connection refused (os error 111)".into(),
        );
        assert_eq!(
            connect_message("127.0.0.1:1", &unreachable, Duration::from_secs(15)),
            "cannot reach SQL Server at 127.0.0.1:1: Connection refused (os error 111); \
             check --url or CHANGEFEED_URL"
        );
        let login = Error::Server {
            number: 18456,
            state: 1,
            class: 14,
            message: "Login failed for user 'sa'.".into(),
        };
        let line = connect_message("db:1433", &login, Duration::from_secs(15));
        assert!(line.contains("db:1433") && line.contains("18456"), "{line}");
        assert!(
            line.contains("--url") && line.contains("CHANGEFEED_URL"),
            "{line}"
        );
        let stalled = Error::Connection(
            "SQL Server at db:1433 accepted the TCP connection but did not complete the login \
             within 20s (…)"
                .into(),
        );
        let line = connect_message("db:1433", &stalled, Duration::from_secs(20));
        assert!(line.ends_with("(or raise --connect-timeout)"), "{line}");
        let tls = Error::Connection("tls handshake failed".into());
        let line = connect_message("db:1433", &tls, Duration::from_secs(15));
        assert!(
            line.starts_with("cannot connect to SQL Server at db:1433: "),
            "{line}"
        );
    }

    #[test]
    fn errors_of_a_missing_bundle_suggest_migrate() {
        let missing = Error::Server {
            number: 208,
            state: 1,
            class: 16,
            message: "Invalid object name 'changefeed.feed_status'.".into(),
        };
        let failure = with_migrate_hint(missing);
        assert!(failure.message().unwrap().contains("changefeed migrate"));
        assert_eq!(failure.code(), 1);
        let other = with_migrate_hint(Error::Config("x".into()));
        assert_eq!(other.message().unwrap(), "configuration: x");
    }
}
