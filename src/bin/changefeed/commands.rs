//! The commands: each opens its connection, calls the bundle, and prints.

use std::time::{Duration, SystemTime};

use changefeed::connection::{Client, URL_VARIABLE, connect_with, url_from_env};
use changefeed::outbox_store::OutboxStore;
use changefeed::pool::ConnectionManager;
use changefeed::reader::{FeedEvent, FeedReader, FeedReaderOptions, FeedRow};
use changefeed::row::Column;
use changefeed::{Error, Feed, TableName};
use tiberius::{ColumnData, Row};
use ulid::Ulid;

use crate::Failure;
use crate::args::{Cli, Command, PurgeArgs, PurgeOutboxArgs, SetupFeedArgs, StatusArgs, TailArgs};
use crate::follow::{Stop, follow, interrupted, output_closed};
use crate::output::{
    Align, Out, Table, feed_line, human_lag, text_cell, ulid_cell, utc_cell, yes_no_cell,
};
use changefeed::json::JsonColumns;

use crate::relay::postgres::is_postgres;

/// Where to look when the connection fails.
const CHECK_URL: &str = "check --url or CHANGEFEED_URL";

/// Runs the command `cli` asks for.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    let url = resolve_url(cli.url)?;
    let connect = Connect {
        url,
        timeout: cli.connect_timeout.value,
    };
    let mut out = Out;
    match cli.command {
        Command::Migrate if is_postgres(&connect.url) => {
            out.text(&crate::relay::postgres::migrate(&connect).await?)
        }
        Command::Migrate => migrate(&connect, &mut out).await,
        Command::SetupOutbox(args) if is_postgres(&connect.url) => {
            out.text(&crate::relay::postgres::setup_outbox(&connect, &args.outbox).await?)
        }
        Command::SetupOutbox(args) => Err(Failure::usage(format!(
            "setup-outbox takes a postgres:// --url; on SQL Server run exec \
             changefeed.setup_outbox @table_name = N'{0}', on MariaDB/MySQL call \
             changefeed_setup_outbox('{0}')",
            args.outbox
        ))),
        Command::SetupFeed(args) => setup_feed(&connect, &mut out, args).await,
        Command::Tail(args) => tail(&connect, args).await,
        Command::Status(args) => status(&connect, &mut out, args).await,
        Command::Purge(args) => purge(&connect, &mut out, args).await,
        Command::PurgeOutbox(args) => purge_outbox(&connect, &mut out, args).await,
        Command::Relay(args) => crate::relay::relay(&connect, args).await,
        Command::Export(args) => crate::export::export(&connect, args).await,
    }
}

/// `--url` if given (clap has already looked at `CHANGEFEED_URL`), else the variable's
/// error, which says what to set.
fn resolve_url(url: Option<String>) -> Result<String, Failure> {
    match url {
        Some(url) if !url.trim().is_empty() => Ok(url),
        _ => match url_from_env() {
            Ok(url) => Ok(url),
            Err(Error::Config(message)) => {
                Err(Failure::usage(format!("{message} (or pass --url)")))
            }
            Err(other) => Err(Failure::usage(other.to_string())),
        },
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

/// The cell named `name` of `row`.
fn cell<'r>(row: &'r Row, name: &str) -> Result<&'r ColumnData<'static>, Error> {
    row.cells()
        .find(|(column, _)| column.name() == name)
        .map(|(_, data)| data)
        .ok_or_else(|| Error::Decode {
            column: name.to_owned(),
            reason: "the result has no such column".to_owned(),
            row: None,
        })
}

/// The position of the column named `name` of `row`.
fn position(row: &Row, name: &str) -> Result<usize, Error> {
    row.columns()
        .iter()
        .position(|column| column.name() == name)
        .ok_or_else(|| Error::Decode {
            column: name.to_owned(),
            reason: "the result has no such column".to_owned(),
            row: None,
        })
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

fn plural(count: u64, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

// ---------------------------------------------------------------------------------------
// migrate

async fn migrate(connect: &Connect, out: &mut Out) -> Result<(), Failure> {
    let mut client = connect.open(None).await?;
    let report = changefeed::migrations::migrate(&mut client).await?;
    let applied = report.applied_migrations();
    let bundle = changefeed::migrations::bundle().len();
    let mut text = format!(
        "applied {} ({bundle} in the bundle{})\n",
        plural(
            applied.len() as u64,
            "changefeed migration",
            "changefeed migrations"
        ),
        if applied.is_empty() {
            "; the database is up to date"
        } else {
            ""
        }
    );
    for migration in applied {
        text.push_str(&format!(
            "  V{} {}\n",
            migration.version(),
            migration.name()
        ));
    }
    out.text(&text)
}

// ---------------------------------------------------------------------------------------
// setup-feed

async fn setup_feed(connect: &Connect, out: &mut Out, args: SetupFeedArgs) -> Result<(), Failure> {
    let SetupFeedArgs {
        feed,
        outbox,
        serialize_writers,
        shard_column,
        ulid_column,
    } = args;
    let mut client = connect.open(None).await?;
    let name = feed.to_string();
    client
        .query(
            "exec changefeed.setup_feed @table_name = @P1, @outbox = @P2, \
             @serialize_writers = @P3, @shard_column = @P4, @ulid_column = @P5",
            &[
                &name,
                &outbox,
                &serialize_writers,
                &shard_column.as_deref(),
                &ulid_column.as_deref(),
            ],
        )
        .await
        .map_err(Error::from)
        .map_err(with_migrate_hint)?
        .into_results()
        .await
        .map_err(Error::from)
        .map_err(with_migrate_hint)?;
    let text = match (serialize_writers, shard_column, ulid_column) {
        (true, Some(shard), Some(ulid)) => format!(
            "{feed} is a feed (serialized-writer mode: shard column {shard}, ULID column \
             {ulid})\n  writers: exec {} in the writer's transaction (role {})\n  readers: \
             exec {} (role {}), or changefeed tail {feed}\n",
            feed.object("lock_feed"),
            feed.writers_role(),
            feed.read_feed_procedure(),
            feed.readers_role()
        ),
        _ => format!(
            "{feed} is a feed (outbox mode)\n  writers: insert into {} in the event's \
             transaction (role {})\n  readers: exec {} (role {}), or changefeed tail {feed}\n",
            feed.outbox_table(),
            feed.writers_role(),
            feed.read_feed_procedure(),
            feed.readers_role()
        ),
    };
    out.text(&text)
}

// ---------------------------------------------------------------------------------------
// tail

async fn tail(connect: &Connect, args: TailArgs) -> Result<(), Failure> {
    let TailArgs {
        feed,
        shard,
        from,
        with_event,
        page_size,
    } = args;
    // One plain connection first: a clear line for an unreachable server or an unknown
    // feed, instead of the stream's retries.
    {
        let mut client = connect.open(Some(Duration::from_secs(30))).await?;
        if !procedure_exists(&mut client, &feed.read_feed_procedure()).await? {
            return Err(Failure::run(not_a_feed(&feed)));
        }
    }
    let manager = ConnectionManager::from_ado(&connect.url)?.connect_timeout(Some(connect.timeout));
    let pool = changefeed::Pool::from_builder(changefeed::Pool::builder().max_size(1), manager);
    let options = FeedReaderOptions::default().page_size(page_size);
    let reader = FeedReader::with_options(pool, feed, options)?;
    let cursor = from.cursor(SystemTime::now());
    let mut stdout = std::io::stdout();
    let stop = if with_event {
        let stream = reader.event_stream::<JsonColumns>(shard, cursor);
        let line = |row: FeedEvent<JsonColumns>| {
            feed_line(row.ulid, shard, "event", &row.event.into_value())
        };
        follow(stream, &mut stdout, line, interrupted(), output_closed()).await
    } else {
        let stream = reader.stream::<JsonColumns>(shard, cursor);
        let line =
            |row: FeedRow<JsonColumns>| feed_line(row.ulid, shard, "key", &row.key.into_value());
        follow(stream, &mut stdout, line, interrupted(), output_closed()).await
    };
    match stop {
        Stop::Ended => Ok(()),
        // Like `tail -f`: Ctrl-C is the normal way to stop, and the status says so. Lines
        // are written whole, and read_feed holds no transaction while it waits, so nothing
        // is left behind on the server.
        Stop::Interrupted => Err(Failure::interrupted()),
        Stop::Closed => Err(Failure::quiet()),
        Stop::Failed(error) => Err(tail_error(error)),
        Stop::Write(error) => Err(Failure::run(format!(
            "cannot write to standard output: {error}"
        ))),
    }
}

pub fn not_a_feed(feed: &Feed) -> String {
    format!(
        "{feed} is not a feed in this database ({} does not exist); make it one with \
         `changefeed setup-feed {feed} --outbox` (or check the database in --url)",
        feed.read_feed_procedure()
    )
}

/// The line a stream's final error ends `tail` with.
fn tail_error(error: Error) -> Failure {
    match &error {
        Error::CursorExpired { .. } => Failure::run(format!(
            "{error}; the events after this cursor are gone: restart with --from start (the \
             oldest retained event) or a later cursor"
        )),
        _ if error.is_transient() => Failure::run(format!(
            "{error} (the stream gave up after retrying on fresh connections; run tail again \
             with --from <the last ulid printed> to resume)"
        )),
        _ => with_migrate_hint(error),
    }
}

// ---------------------------------------------------------------------------------------
// status

const FEED_STATUS: &str = "select feed, mode, shard_id, outbox_depth, oldest_pending_at, \
    head_ulid, head_at, state_updated_at, purged_through, problem \
    from changefeed.feed_status order by feed, shard_id";

const CONSUMER_LAG: &str = "select consumer, feed, shard_id, [cursor], cursor_at, head_at, \
    lag_ms, not_yet_in_feed, expired \
    from changefeed.consumer_lag order by feed, shard_id, consumer";

/// The `status` table of `changefeed.feed_status` rows.
pub fn feed_status_table(rows: &[Row]) -> Result<Table, Error> {
    let mut table = Table::new(&[
        ("feed", Align::Left),
        ("mode", Align::Left),
        ("shard", Align::Right),
        ("outbox_depth", Align::Right),
        ("oldest_pending_at", Align::Left),
        ("head_ulid", Align::Left),
        ("head_at", Align::Left),
        ("state_updated_at", Align::Left),
        ("purged_through", Align::Left),
        // Set for a feed that cannot be shown (its event table was dropped, ...): one row
        // with no shard, saying what to run.
        ("problem", Align::Left),
    ]);
    for row in rows {
        table.push(vec![
            text_cell(cell(row, "feed")?),
            text_cell(cell(row, "mode")?),
            text_cell(cell(row, "shard_id")?),
            text_cell(cell(row, "outbox_depth")?),
            utc_cell(cell(row, "oldest_pending_at")?),
            ulid_cell(cell(row, "head_ulid")?),
            utc_cell(cell(row, "head_at")?),
            utc_cell(cell(row, "state_updated_at")?),
            ulid_cell(cell(row, "purged_through")?),
            text_cell(cell(row, "problem")?),
        ]);
    }
    Ok(table)
}

/// The `status --consumers` table of `changefeed.consumer_lag` rows.
pub fn consumer_lag_table(rows: &[Row]) -> Result<Table, Error> {
    let mut table = Table::new(&[
        ("consumer", Align::Left),
        ("feed", Align::Left),
        ("shard", Align::Right),
        ("cursor", Align::Left),
        ("cursor_at", Align::Left),
        ("head_at", Align::Left),
        ("lag", Align::Right),
        ("not_yet_in_feed", Align::Right),
        ("expired", Align::Left),
    ]);
    for row in rows {
        let lag = match cell(row, "lag_ms")? {
            ColumnData::I64(Some(ms)) => human_lag(*ms),
            ColumnData::I32(Some(ms)) => human_lag(i64::from(*ms)),
            other => text_cell(other),
        };
        table.push(vec![
            text_cell(cell(row, "consumer")?),
            text_cell(cell(row, "feed")?),
            text_cell(cell(row, "shard_id")?),
            ulid_cell(cell(row, "cursor")?),
            utc_cell(cell(row, "cursor_at")?),
            utc_cell(cell(row, "head_at")?),
            lag,
            text_cell(cell(row, "not_yet_in_feed")?),
            yes_no_cell(cell(row, "expired")?),
        ]);
    }
    Ok(table)
}

async fn status(connect: &Connect, out: &mut Out, args: StatusArgs) -> Result<(), Failure> {
    if crate::relay::is_mysql(&connect.url) {
        return mysql_status(connect, out, args).await;
    }
    if is_postgres(&connect.url) {
        return Err(Failure::usage(
            "status reads SQL Server (feeds and outboxes) or MariaDB/MySQL (outboxes); on \
             PostgreSQL count an outbox with select status, count(*) from <outbox> group by \
             status",
        ));
    }
    let mut client = connect.open(Some(Duration::from_secs(30))).await?;
    let feeds = query_rows(&mut client, FEED_STATUS, &[])
        .await
        .map_err(with_migrate_hint)?;
    let outboxes = crate::outbox_status::sql_server(&mut client)
        .await
        .map_err(with_migrate_hint)?;
    let consumers = if args.consumers {
        Some(
            query_rows(&mut client, CONSUMER_LAG, &[])
                .await
                .map_err(with_migrate_hint)?,
        )
    } else {
        None
    };
    if args.json {
        let rows = |rows: &[Row]| -> Result<Vec<serde_json::Value>, Error> {
            rows.iter()
                .map(|row| changefeed::json::row_json(row, 0).map(serde_json::Value::Object))
                .collect()
        };
        let mut document = serde_json::json!({
            "feeds": rows(&feeds)?,
            "outboxes": outboxes,
        });
        if let Some(consumers) = &consumers {
            document["consumers"] = serde_json::Value::Array(rows(consumers)?);
        }
        return out.line(&document.to_string());
    }
    let mut text = feed_status_table(&feeds)?.render("(no feeds)");
    text.push('\n');
    text.push_str(&crate::outbox_status::outbox_table(&outboxes).render("(no outboxes)"));
    if let Some(consumers) = &consumers {
        text.push('\n');
        text.push_str(&consumer_lag_table(consumers)?.render("(no consumers)"));
    }
    out.text(&text)
}

/// `status` with a `mysql://` URL: the database's outboxes (MariaDB/MySQL has no feeds).
#[cfg(feature = "mysql")]
async fn mysql_status(connect: &Connect, out: &mut Out, args: StatusArgs) -> Result<(), Failure> {
    if args.consumers {
        return Err(Failure::usage(
            "--consumers shows feed consumers, which only SQL Server has",
        ));
    }
    let opts = changefeed::mysql::opts(&connect.url).map_err(|e| Failure::usage(e.to_string()))?;
    let outboxes = crate::outbox_status::mysql(&opts, connect.timeout)
        .await
        .map_err(|error| match error {
            Error::Connection(message) => Failure::connect(format!(
                "{message}; {CHECK_URL} (or raise --connect-timeout)"
            )),
            other => Failure::run(other.to_string()),
        })?;
    if args.json {
        return out.line(&serde_json::json!({ "outboxes": outboxes }).to_string());
    }
    out.text(&crate::outbox_status::outbox_table(&outboxes).render("(no outboxes)"))
}

#[cfg(not(feature = "mysql"))]
async fn mysql_status(_: &Connect, _: &mut Out, _: StatusArgs) -> Result<(), Failure> {
    Err(Failure::usage(
        "this changefeed was built without MariaDB/MySQL support; build it with --features \
         cli,mysql to use a mysql:// URL",
    ))
}

// ---------------------------------------------------------------------------------------
// purge

/// One shard's outcome of `purge_feed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgedShard {
    /// The shard.
    pub shard: i32,
    /// Rows deleted (or that would be, in a dry run).
    pub deleted: i64,
    /// The shard's low-water mark after the purge.
    pub purged_through: Option<Ulid>,
    /// Why it stopped: cutoff reached, held back by consumer X, max rows reached.
    pub stopped_because: String,
}

/// Decodes the rows `purge_feed` returns.
pub fn purged_shards(rows: &[Row]) -> Result<Vec<PurgedShard>, Error> {
    rows.iter()
        .map(|row| {
            Ok(PurgedShard {
                shard: i32::column(row, position(row, "shard_id")?)?,
                deleted: i64::column(row, position(row, "deleted")?)?,
                purged_through: Option::<Ulid>::column(row, position(row, "purged_through")?)?,
                stopped_because: String::column(row, position(row, "stopped_because")?)?,
            })
        })
        .collect()
}

/// The `purge` report: a table of shards and the total line.
pub fn purge_report(
    feed: &Feed,
    older_than: &str,
    dry_run: bool,
    shards: &[PurgedShard],
) -> String {
    let mut table = Table::new(&[
        ("shard", Align::Right),
        (
            if dry_run { "would_delete" } else { "deleted" },
            Align::Right,
        ),
        ("purged_through", Align::Left),
        ("stopped_because", Align::Left),
    ]);
    for shard in shards {
        table.push(vec![
            shard.shard.to_string(),
            shard.deleted.to_string(),
            shard
                .purged_through
                .map_or_else(|| "-".to_owned(), |ulid| ulid.to_string()),
            shard.stopped_because.clone(),
        ]);
    }
    let total: i64 = shards.iter().map(|shard| shard.deleted).sum();
    let rows = plural(total.max(0) as u64, "row", "rows");
    let in_shards = plural(shards.len() as u64, "shard", "shards");
    let mut text = table.render("(no shards)");
    if dry_run {
        text.push_str(&format!(
            "would delete {rows} older than {older_than} from {feed} in {in_shards} (dry run: \
             nothing was deleted)\n"
        ));
    } else {
        text.push_str(&format!(
            "deleted {rows} older than {older_than} from {feed} in {in_shards}\n"
        ));
    }
    text
}

async fn purge(connect: &Connect, out: &mut Out, args: PurgeArgs) -> Result<(), Failure> {
    let PurgeArgs {
        feed,
        older_than,
        shard,
        force,
        dry_run,
        batch_size,
        max_rows,
    } = args;
    let mut client = connect.open(None).await?;
    let procedure = feed.object("purge_feed");
    if !procedure_exists(&mut client, &procedure).await? {
        return Err(Failure::run(format!(
            "{feed} has no purge procedure ({procedure} does not exist): it is not an \
             outbox-mode feed in this database (a serialized-writer feed's events are rows \
             of your own table), or the bundle predates retention (run `changefeed migrate`)"
        )));
    }
    let sql = format!(
        "exec {procedure} @shard_id = @P1, @older_than_ms = @P2, @batch_size = @P3, \
         @max_rows = @P4, @force = @P5, @dry_run = @P6"
    );
    let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
    let max_rows = max_rows.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows = query_rows(
        &mut client,
        &sql,
        &[
            &shard,
            &older_than.as_millis_i64(),
            &batch_size,
            &max_rows,
            &force,
            &dry_run,
        ],
    )
    .await?;
    let shards = purged_shards(&rows)?;
    out.text(&purge_report(
        &feed,
        &older_than.to_string(),
        dry_run,
        &shards,
    ))
}

// ---------------------------------------------------------------------------------------
// purge-outbox

async fn purge_outbox(
    connect: &Connect,
    out: &mut Out,
    args: PurgeOutboxArgs,
) -> Result<(), Failure> {
    let PurgeOutboxArgs {
        table,
        older_than,
        batch_size,
        max_rows,
    } = args;
    let mut client = connect.open(None).await?;
    let procedure = table.object("purge_done");
    if !procedure_exists(&mut client, &procedure).await? {
        return Err(Failure::run(not_an_outbox(&table, &procedure)));
    }
    let outbox = OutboxStore::new(table.clone());
    let deleted = outbox
        .purge_done(&mut client, older_than.value, batch_size, max_rows)
        .await?;
    out.line(&format!(
        "deleted {} older than {older_than} from {table}",
        plural(deleted, "done message", "done messages")
    ))
}

pub fn not_an_outbox(table: &TableName, procedure: &str) -> String {
    format!(
        "{table} is not a claim outbox in this database ({procedure} does not exist); create \
         it with exec changefeed.setup_outbox @table_name = N'{table}' (or check the database \
         in --url)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiberius::ColumnType as T;

    fn ulid_data(ulid: Option<Ulid>) -> ColumnData<'static> {
        ColumnData::Binary(ulid.map(|u| u.to_bytes().to_vec().into()))
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
    fn an_explicit_url_wins_and_a_blank_one_does_not_count() {
        assert_eq!(resolve_url(Some("server=x".into())).unwrap(), "server=x");
        // Without the variable (not set in the test environment, or set: either way the
        // blank --url is not used).
        match resolve_url(Some("  ".into())) {
            Ok(url) => assert!(!url.trim().is_empty()),
            Err(failure) => {
                let message = failure.message.unwrap();
                assert!(
                    message.starts_with("CHANGEFEED_URL is not set"),
                    "{message}"
                );
                assert!(message.contains("--url"), "{message}");
                assert_eq!(failure.code, 2);
            }
        }
    }

    #[test]
    fn feed_status_rows_become_the_status_table() {
        let head = Ulid::from_parts(1_714_564_800_123, 1);
        let at = tiberius::time::DateTime2::new(
            tiberius::time::Date::new(
                (time::macros::date!(2024 - 05 - 01).to_julian_day()
                    - time::macros::date!(0001 - 01 - 01).to_julian_day()) as u32,
            ),
            tiberius::time::Time::new(12 * 3_600_000 + 123, 3),
        );
        let row = Row::builder()
            .column(
                "feed",
                T::NVarchar,
                ColumnData::String(Some("app.Order".into())),
            )
            .column(
                "mode",
                T::BigVarChar,
                ColumnData::String(Some("outbox".into())),
            )
            .column("shard_id", T::Int4, ColumnData::I32(Some(0)))
            .column("outbox_depth", T::Int8, ColumnData::I64(Some(12)))
            .column(
                "oldest_pending_at",
                T::Datetime2,
                ColumnData::DateTime2(None),
            )
            .column("head_ulid", T::BigBinary, ulid_data(Some(head)))
            .column("head_at", T::Datetime2, ColumnData::DateTime2(Some(at)))
            .column(
                "state_updated_at",
                T::Datetime2,
                ColumnData::DateTime2(Some(at)),
            )
            .column("purged_through", T::BigBinary, ulid_data(None))
            .column("problem", T::NVarchar, ColumnData::String(None))
            .build();
        let broken = Row::builder()
            .column(
                "feed",
                T::NVarchar,
                ColumnData::String(Some("app.Gone".into())),
            )
            .column(
                "mode",
                T::BigVarChar,
                ColumnData::String(Some("serialize_writers".into())),
            )
            .column("shard_id", T::Int4, ColumnData::I32(None))
            .column("outbox_depth", T::Int8, ColumnData::I64(None))
            .column(
                "oldest_pending_at",
                T::Datetime2,
                ColumnData::DateTime2(None),
            )
            .column("head_ulid", T::BigBinary, ulid_data(None))
            .column("head_at", T::Datetime2, ColumnData::DateTime2(None))
            .column(
                "state_updated_at",
                T::Datetime2,
                ColumnData::DateTime2(None),
            )
            .column("purged_through", T::BigBinary, ulid_data(None))
            .column(
                "problem",
                T::NVarchar,
                ColumnData::String(Some("The event table 'app.Gone' was dropped".into())),
            )
            .build();
        let with_broken = feed_status_table(&[broken]).unwrap().render("(no feeds)");
        assert!(
            with_broken
                .lines()
                .nth(1)
                .is_some_and(|line| line.starts_with("app.Gone")
                    && line.ends_with("The event table 'app.Gone' was dropped")),
            "{with_broken}"
        );
        let text = feed_status_table(&[row]).unwrap().render("(no feeds)");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("feed       mode    shard  outbox_depth  oldest_pending_at"));
        assert!(
            lines[1].starts_with("app.Order  outbox      0            12  -"),
            "{text}"
        );
        assert!(lines[1].contains(&head.to_string()), "{text}");
        assert!(lines[1].contains("2024-05-01T12:00:00.123Z"), "{text}");
        assert!(lines[1].ends_with('-'), "{text}");

        let empty = feed_status_table(&[]).unwrap().render("(no feeds)");
        assert_eq!(empty.lines().nth(1), Some("(no feeds)"));
        assert!(empty.starts_with("feed  mode  shard  outbox_depth  oldest_pending_at  head_ulid"));
    }

    #[test]
    fn consumer_lag_rows_show_a_human_lag() {
        let row = Row::builder()
            .column(
                "consumer",
                T::NVarchar,
                ColumnData::String(Some("billing".into())),
            )
            .column(
                "feed",
                T::NVarchar,
                ColumnData::String(Some("app.Order".into())),
            )
            .column("shard_id", T::Int4, ColumnData::I32(Some(0)))
            .column("cursor", T::BigBinary, ulid_data(Some(Ulid(0))))
            .column("cursor_at", T::Datetime2, ColumnData::DateTime2(None))
            .column("head_at", T::Datetime2, ColumnData::DateTime2(None))
            .column("lag_ms", T::Int8, ColumnData::I64(Some(180_000)))
            .column("not_yet_in_feed", T::Int8, ColumnData::I64(None))
            .column("expired", T::Bit, ColumnData::Bit(Some(false)))
            .build();
        let text = consumer_lag_table(&[row]).unwrap().render("(no consumers)");
        let line = text.lines().nth(1).unwrap();
        assert!(line.contains("00000000000000000000000000"), "{text}");
        assert!(line.contains("3 min"), "{text}");
        assert!(line.ends_with("no"), "{text}");
        let missing = Row::builder()
            .column("consumer", T::NVarchar, ColumnData::String(None))
            .build();
        let error = consumer_lag_table(&[missing]).unwrap_err();
        assert!(error.to_string().contains("no such column"), "{error}");
    }

    #[test]
    fn purge_rows_become_a_report_with_a_total() {
        let through = Ulid::from_parts(1_714_564_800_123, 1);
        let row = |shard: i32, deleted: i64, through: Option<Ulid>, why: &str| {
            Row::builder()
                .column("shard_id", T::Int4, ColumnData::I32(Some(shard)))
                .column("deleted", T::Int8, ColumnData::I64(Some(deleted)))
                .column("purged_through", T::BigBinary, ulid_data(through))
                .column(
                    "stopped_because",
                    T::NVarchar,
                    ColumnData::String(Some(why.to_owned().into())),
                )
                .column("dry_run", T::Bit, ColumnData::Bit(Some(false)))
                .build()
        };
        let shards = purged_shards(&[
            row(0, 1200, Some(through), "cutoff reached"),
            row(1, 0, None, "held back by consumer billing"),
        ])
        .unwrap();
        assert_eq!(shards[0].purged_through, Some(through));
        let feed: Feed = "app.Order".parse().unwrap();
        let text = purge_report(&feed, "30d", false, &shards);
        assert_eq!(
            text,
            format!(
                "shard  deleted  purged_through              stopped_because\n    \
                 0     1200  {through}  cutoff reached\n    \
                 1        0  -                           held back by consumer billing\n\
                 deleted 1200 rows older than 30d from app.Order in 2 shards\n"
            )
        );
        let dry = purge_report(&feed, "30d", true, &shards);
        assert!(dry.starts_with("shard  would_delete"), "{dry}");
        assert!(dry.ends_with("would delete 1200 rows older than 30d from app.Order in 2 shards (dry run: nothing was deleted)\n"), "{dry}");
        let none = purge_report(&feed, "1d", false, &[]);
        assert_eq!(
            none,
            "shard  deleted  purged_through  stopped_because\n(no shards)\n\
             deleted 0 rows older than 1d from app.Order in 0 shards\n"
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
        assert!(failure.message.unwrap().contains("changefeed migrate"));
        assert_eq!(failure.code, 1);
        let other = with_migrate_hint(Error::Config("x".into()));
        assert_eq!(other.message.unwrap(), "configuration: x");
        let expired = tail_error(Error::CursorExpired {
            message: "events were purged".into(),
        });
        assert!(expired.message.unwrap().contains("--from start"));
    }
}
