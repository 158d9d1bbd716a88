//! The command line: subcommands, options and the parsers of their values. Every value is
//! checked here, before any connection is opened.

use std::time::SystemTime;

use changefeed::connection::URL_VARIABLE;
use changefeed::{Cursor, Error, Feed, TableName};
use clap::{ArgGroup, Args, Parser, Subcommand};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::duration::{CliDuration, parse_duration, parse_retention};

/// Race-safe event feeds and transactional outboxes inside SQL Server: apply the bundle,
/// set up feeds, follow them, watch them and trim them.
#[derive(Debug, Parser)]
#[command(name = "changefeed", version, propagate_version = true)]
#[command(after_help = "The connection string is an ADO.NET string, e.g. \
    CHANGEFEED_URL='server=tcp:localhost,1433;user=sa;password=...;database=app;\
    TrustServerCertificate=true'. Exit status: 0 done (relay and export: stopped by \
    SIGINT or SIGTERM after finishing their batch), 1 failed, 2 bad arguments or no usable \
    connection (database or Kafka brokers), 130 tail stopped by Ctrl-C, or relay and export \
    stopped at once by a second signal.")]
pub struct Cli {
    /// The ADO.NET connection string of the database
    #[arg(
        long,
        global = true,
        env = URL_VARIABLE,
        hide_env_values = true,
        value_name = "ADO"
    )]
    pub url: Option<String>,

    /// How long to wait for SQL Server to accept a new connection
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        default_value = "15s",
        allow_hyphen_values = true,
        value_parser = parse_timeout
    )]
    pub connect_timeout: CliDuration,

    /// How relay and export write their lines on standard error: human (the progress
    /// line) or json (one JSON object per line: timestamp, level, target, message and the
    /// event's fields)
    #[arg(long, global = true, value_name = "FORMAT", default_value = "human")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
// Plain comments on the variants: doc comments would become a "Possible values:" block
// in --help, which puts every option's text on a line of its own.
pub enum LogFormat {
    // Lines for people: the start line, the progress line, the last line.
    Human,
    // One JSON object per line, for a log pipeline.
    Json,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the changefeed SQL bundle: every migration the database does not have yet
    Migrate,
    /// Make an event table a feed (changefeed.setup_feed); the table must exist and have a
    /// primary key
    SetupFeed(SetupFeedArgs),
    /// Print a feed shard's events as JSON lines and follow its head, like `tail -f`
    #[command(
        after_help = "One JSON object per line: {\"ulid\":\"<cursor>\",\"time\":\"<the \
        ULID's time, RFC 3339>\",\"shard\":<n>,\"key\":{<key columns>}} or, with \
        --with-event, \"event\":{<event columns>} (null for an event deleted since). Binary \
        values are 0x… hex, decimals exact text, dates and times ISO 8601. Pass a printed \
        ulid to --from to resume after it. Ctrl-C stops (exit status 130, like tail -f)."
    )]
    Tail(TailArgs),
    /// Show every feed shard (changefeed.feed_status) as a table
    Status(StatusArgs),
    /// Delete a feed's rows older than a cutoff (outbox-mode feeds), never past a
    /// registered consumer's cursor unless --force
    Purge(PurgeArgs),
    /// Delete a claim outbox's done messages older than a cutoff (dead ones are kept)
    PurgeOutbox(PurgeOutboxArgs),
    /// Create or complete a claim outbox table on PostgreSQL (changefeed.setup_outbox; a
    /// postgres:// --url, needs the `postgres` feature)
    SetupOutbox(SetupOutboxArgs),
    /// Relay a claim outbox to Kafka (--brokers; needs the `kafka` feature) or to standard
    /// output, one JSON line per message, until SIGINT or SIGTERM. --url may be an ADO.NET
    /// string (SQL Server), a mysql:// URL (MariaDB/MySQL, with the binlog wake; needs
    /// the `mysql` feature) or a postgres:// URL (PostgreSQL, with the LISTEN/NOTIFY wake;
    /// needs the `postgres` feature)
    #[command(after_help = RELAY_HELP)]
    Relay(RelayArgs),
    /// Export a feed's events to a Kafka topic, saving the consumer's cursor after every
    /// acknowledged page, until SIGINT or SIGTERM (needs the `kafka` feature)
    #[command(after_help = EXPORT_HELP)]
    Export(ExportArgs),
}

/// What `relay --help` ends with: the two outputs, stopping, and the exit status.
const RELAY_HELP: &str = "Without --brokers each message is printed as a JSON line. With \
    --brokers it is produced to the Kafka topic <topic-prefix><the row's topic> by an \
    idempotent producer (acks=all); a message that dies goes to that topic with \
    <dlq-suffix> after it. The brokers are checked first, then the database. A progress \
    line goes to standard error every --progress-interval unless --quiet. SIGINT or \
    SIGTERM stops the relay once the batch in flight is published and acknowledged; a \
    second signal stops it at once. Exit status: 0 stopped by a signal, 1 failed while \
    running (a fatal publish error), 2 bad arguments or no usable connection (brokers or \
    database), 130 stopped at once by a second signal.";

/// What `export --help` ends with: cursors, stopping, and the exit status.
const EXPORT_HELP: &str = "The cursor of each shard is saved under --consumer \
    (changefeed.consumer_cursor) only once every message of a page is acknowledged, so a \
    restart resumes after the last saved page (at least once: a page in flight when the \
    process died is produced again). The brokers are checked first, then the database. A \
    progress line goes to standard error every --progress-interval unless --quiet: events \
    exported and their rate, how far the furthest-behind shard is from the feed's head, \
    and the last ULID. SIGINT or SIGTERM stops the export once the page in flight is \
    acknowledged and its cursor saved; a second signal stops it at once. Exit status: 0 \
    stopped by a signal, 1 failed while running (a fatal produce error, a read error), 2 \
    bad arguments or no usable connection (brokers or database), 130 stopped at once by a \
    second signal.";

/// `relay`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct RelayArgs {
    /// The claim outbox: schema.table on SQL Server and PostgreSQL, a table name on
    /// MariaDB/MySQL
    #[arg(long, value_name = "TABLE")]
    pub outbox: String,

    /// Messages per claim
    #[arg(long, value_name = "N", default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,

    /// Batches between claim and acknowledgement at once: the next batch is claimed while
    /// earlier ones are being delivered (per-aggregate order holds at any value; 1 claims,
    /// publishes and acknowledges one batch at a time)
    #[arg(long, value_name = "N",
        default_value_t = changefeed::relay::RelayConfig::DEFAULT_MAX_IN_FLIGHT,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(changefeed::relay::MAX_IN_FLIGHT)))]
    pub max_in_flight: u32,

    /// Publish to the Kafka cluster at these bootstrap brokers instead of printing JSON
    /// lines (needs the `kafka` feature)
    #[arg(long, value_name = "HOST:PORT,...", value_parser = parse_brokers)]
    pub brokers: Option<String>,

    /// Put before every outbox row's topic to make the Kafka topic (needs --brokers)
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "",
        requires = "brokers",
        value_parser = parse_topic_affix
    )]
    pub topic_prefix: String,

    /// Dead letters go to the message's Kafka topic with this after it (needs --brokers)
    #[arg(
        long,
        value_name = "SUFFIX",
        default_value = ".dlq",
        requires = "brokers",
        value_parser = parse_topic_affix
    )]
    pub dlq_suffix: String,

    /// After the first SIGINT or SIGTERM, how long the batches in flight may take to finish
    /// before the relay exits anyway (130; their messages are claimed again after the claim
    /// timeout)
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_grace
    )]
    pub shutdown_grace: CliDuration,

    /// With --metrics-addr: how often to read the outbox's backlog (counts by status, the
    /// oldest open message's age) for the changefeed_outbox_* gauges
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "15s",
        requires = "metrics_addr",
        value_parser = parse_positive
    )]
    pub backlog_interval: CliDuration,

    #[command(flatten)]
    pub producer: ProducerArgs,

    #[command(flatten)]
    pub progress: ProgressArgs,

    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// The metrics endpoint's options, shared by `relay` and `export`.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus text on http://HOST:PORT/metrics, and /healthz and /readyz (off
    /// unless given; port 0 picks a free port, printed on the start line)
    #[arg(
        long,
        value_name = "HOST:PORT",
        value_parser = crate::endpoints::parse_metrics_addr
    )]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// With --metrics-addr: /readyz answers 503 once the last successful claim (relay) or
    /// read of every shard (export) is older than this
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "60s",
        requires = "metrics_addr",
        value_parser = parse_positive
    )]
    pub ready_within: CliDuration,
}

/// `export`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct ExportArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// The Kafka cluster's bootstrap brokers
    #[arg(long, value_name = "HOST:PORT,...", value_parser = parse_brokers)]
    pub brokers: String,

    /// The Kafka topic every event goes to: key the event's primary-key columns as JSON,
    /// value every column of the event row as JSON, headers ulid (its position), shard and feed
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic)]
    pub topic: String,

    /// The consumer name the cursors are saved under (changefeed.consumer_cursor); one
    /// name per export job
    #[arg(long, value_name = "NAME", value_parser = parse_consumer)]
    pub consumer: String,

    /// The shards to export, e.g. 0,2 (default: every shard the feed has when the export
    /// starts, as changefeed status shows them)
    #[arg(
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub shards: Vec<i32>,

    /// Where a shard with no saved cursor starts: `start` (the oldest retained event),
    /// `now`, a ULID cursor (the events after it) or an RFC 3339 time. A shard with a
    /// cursor saved under --consumer resumes after it: the saved cursor wins
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "start",
        allow_hyphen_values = true,
        value_parser = parse_from
    )]
    pub from: StartAt,

    /// Rows per read_feed call (1 to 10000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, 10_000).map(|n| n as u32)
    )]
    pub page_size: u32,

    #[command(flatten)]
    pub producer: ProducerArgs,

    #[command(flatten)]
    pub progress: ProgressArgs,

    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// The Kafka producer's options, shared by `relay` and `export`.
#[derive(Debug, Args)]
// Without the kafka feature the Kafka options are parsed and refused, never read.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub struct ProducerArgs {
    /// A librdkafka producer setting, e.g. -X security.protocol=SASL_SSL; repeat it for
    /// more. enable.idempotence and acks=all cannot be turned off
    #[arg(
        short = 'X',
        long = "producer-setting",
        value_name = "KEY=VALUE",
        value_parser = parse_setting
    )]
    pub settings: Vec<(String, String)>,

    /// How long to wait for a broker to answer before giving up, first thing
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        allow_hyphen_values = true,
        value_parser = parse_timeout
    )]
    pub broker_timeout: CliDuration,
}

/// The progress line's options, shared by `relay` and `export`.
#[derive(Debug, Args)]
pub struct ProgressArgs {
    /// How often to print the progress line on standard error
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        allow_hyphen_values = true,
        value_parser = parse_interval
    )]
    pub progress_interval: CliDuration,

    /// Print nothing on standard error but errors: no start line, no progress lines
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl ProgressArgs {
    /// How often to print the progress line: `None` with --quiet.
    pub fn every(&self) -> Option<std::time::Duration> {
        (!self.quiet).then_some(self.progress_interval.value)
    }
}

/// `setup-feed`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["outbox", "serialize_writers"])))]
pub struct SetupFeedArgs {
    /// The event table, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// Outbox mode: writers insert the event's key into the feed's outbox and never wait
    /// for each other
    #[arg(long)]
    pub outbox: bool,

    /// Serialized-writer mode: writers of a shard take turns and know the event's ULID at
    /// write time (needs --shard-column and --ulid-column)
    #[arg(long, requires_all = ["shard_column", "ulid_column"])]
    pub serialize_writers: bool,

    /// Serialized-writer mode: the event table's int shard column
    #[arg(
        long,
        value_name = "COLUMN",
        requires = "serialize_writers",
        conflicts_with = "outbox",
        value_parser = parse_column
    )]
    pub shard_column: Option<String>,

    /// Serialized-writer mode: the event table's binary(16) ULID column
    #[arg(
        long,
        value_name = "COLUMN",
        requires = "serialize_writers",
        conflicts_with = "outbox",
        value_parser = parse_column
    )]
    pub ulid_column: Option<String>,
}

/// `tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// The shard to follow
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub shard: i32,

    /// Where to start: `start` (the oldest retained event), `now` (events from now on, by
    /// this machine's clock), a ULID cursor (the events after it) or an RFC 3339 time such
    /// as 2024-05-01T12:00:00Z (the events of that time and later)
    #[arg(
        long,
        value_name = "WHERE",
        default_value = "start",
        allow_hyphen_values = true,
        value_parser = parse_from
    )]
    pub from: StartAt,

    /// Print every column of each event (read_feed @with_event = 1), not only its key
    #[arg(long)]
    pub with_event: bool,

    /// Rows per read_feed call (1 to 10000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, 10_000).map(|n| n as u32)
    )]
    pub page_size: u32,
}

/// `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Also show every registered consumer and how far behind it is
    /// (changefeed.consumer_lag)
    #[arg(long)]
    pub consumers: bool,

    /// Print one JSON object instead of tables: feeds, outboxes (with SQL Server's
    /// held_aggregates) and, with --consumers, consumers
    #[arg(long)]
    pub json: bool,
}

/// `purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The feed, as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_feed)]
    pub feed: Feed,

    /// Delete rows whose ULID time is older than this, e.g. 30d (at most 100 years)
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        value_parser = parse_retention
    )]
    pub older_than: CliDuration,

    /// Only this shard (default: every shard)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub shard: Option<i32>,

    /// Also delete rows registered consumers have not read yet: they will get the
    /// cursor-expired error
    #[arg(long)]
    pub force: bool,

    /// Delete nothing; report what would go and what holds the rest back
    #[arg(long)]
    pub dry_run: bool,

    /// Rows per batch, each its own short transaction (1 to 50000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 5000,
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, 50_000).map(|n| n as u32)
    )]
    pub batch_size: u32,

    /// At most this many rows per shard
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, i64::MAX as u64)
    )]
    pub max_rows: Option<u64>,
}

/// `setup-outbox`.
#[derive(Debug, Args)]
pub struct SetupOutboxArgs {
    /// The outbox table, as schema.table (checked by the server's rule)
    #[arg(value_name = "SCHEMA.TABLE")]
    pub outbox: String,
}

/// `purge-outbox`.
#[derive(Debug, Args)]
pub struct PurgeOutboxArgs {
    /// The claim outbox table (created by changefeed.setup_outbox), as schema.table
    #[arg(value_name = "SCHEMA.TABLE", value_parser = parse_table)]
    pub table: TableName,

    /// Delete done messages processed longer ago than this, e.g. 7d (at most 100 years)
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        value_parser = parse_retention
    )]
    pub older_than: CliDuration,

    /// Rows per delete statement (1 to 4000)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, 4000).map(|n| n as u32)
    )]
    pub batch_size: u32,

    /// At most this many messages in all
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = |text: &str| parse_count(text, i64::MAX as u64)
    )]
    pub max_rows: Option<u64>,
}

/// What an invalid table name is refused with: the reason alone (the value is quoted
/// by the caller).
fn name_error(error: Error) -> String {
    match error {
        Error::InvalidName { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// A feed name, checked with [`Feed`]'s rule (the one `setup_feed` applies).
pub fn parse_feed(text: &str) -> Result<Feed, String> {
    text.parse().map_err(name_error)
}

/// A claim outbox's table name, checked with [`TableName`]'s rule.
pub fn parse_table(text: &str) -> Result<TableName, String> {
    text.parse().map_err(name_error)
}

/// A column name for `setup_feed` (passed as a parameter; the procedure checks the
/// column itself).
pub fn parse_column(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the column name is empty".to_owned());
    }
    if text.chars().count() > 128 {
        return Err("a column name has at most 128 characters".to_owned());
    }
    if text.chars().any(char::is_control) {
        return Err("a column name cannot contain control characters".to_owned());
    }
    Ok(text.to_owned())
}

/// A count from 1 to `max`: the error says what is wrong with the text (the caller quotes
/// it and names the argument).
pub fn parse_count(text: &str, max: u64) -> Result<u64, String> {
    let range = format!("give a whole number from 1 to {max}");
    let trimmed = text.trim();
    let Ok(number) = trimmed.parse::<i128>() else {
        return Err(if trimmed.is_empty() {
            format!("the number is missing; {range}")
        } else if trimmed.parse::<f64>().is_ok() {
            format!("not a whole number; {range}")
        } else {
            format!("not a number; {range}")
        });
    };
    match u64::try_from(number) {
        Ok(count) if (1..=max).contains(&count) => Ok(count),
        _ if number < 0 => Err(format!("a count cannot be negative; {range}")),
        _ if number == 0 => Err(format!("a count of zero does nothing; {range}")),
        _ => Err(format!("too large; {range}")),
    }
}

/// `--connect-timeout`: a duration other than zero.
pub fn parse_timeout(text: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value.is_zero() {
        return Err("a timeout of zero would never connect; give e.g. 15s".to_owned());
    }
    Ok(duration)
}

/// `--shutdown-grace`: a duration other than zero.
pub fn parse_grace(text: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value.is_zero() {
        return Err(
            "a grace of zero would never let the batch in flight finish; give e.g. 10s".to_owned(),
        );
    }
    Ok(duration)
}

/// `--progress-interval`: a duration other than zero.
pub fn parse_interval(text: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value.is_zero() {
        return Err(
            "an interval of zero would print without pause; give e.g. 5s, or pass --quiet \
             for no progress lines"
                .to_owned(),
        );
    }
    Ok(duration)
}

/// A duration above zero (`--ready-within`, `--backlog-interval`).
pub fn parse_positive(text: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value.is_zero() {
        return Err("a duration of zero cannot be met; give e.g. 15s".to_owned());
    }
    Ok(duration)
}

/// `--brokers`: librdkafka's `bootstrap.servers`, a comma-separated list of `host:port`,
/// returned without the spaces around its commas. Only the shape is checked here; whether
/// one answers is checked before the job starts.
pub fn parse_brokers(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("no brokers; give host:port[,host:port...]".to_owned());
    }
    let brokers: Vec<&str> = text.split(',').map(str::trim).collect();
    let bad = |broker: &str| {
        broker.is_empty() || broker.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    if let Some(broker) = brokers.iter().find(|broker| bad(broker)) {
        return Err(format!(
            "{broker:?} is not a broker; give host:port[,host:port...]"
        ));
    }
    Ok(brokers.join(","))
}

/// The longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

/// Refuses what cannot be (part of) a Kafka topic name, whose characters are ASCII
/// letters, digits, `.`, `_` and `-`.
fn topic_characters(text: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    match text.chars().find(|&c| !allowed(c)) {
        Some(c) => Err(format!(
            "{c:?} cannot be in a Kafka topic name; use ASCII letters, digits, '.', '_' and '-'"
        )),
        None if text.len() > MAX_TOPIC_LEN => Err(format!(
            "a Kafka topic name has at most {MAX_TOPIC_LEN} characters"
        )),
        None => Ok(()),
    }
}

/// `--topic`: a Kafka topic name.
pub fn parse_topic(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the topic is empty; name the Kafka topic".to_owned());
    }
    if text == "." || text == ".." {
        return Err("Kafka refuses the topic names '.' and '..'".to_owned());
    }
    topic_characters(text)?;
    Ok(text.to_owned())
}

/// `--topic-prefix` and `--dlq-suffix`: a part of a Kafka topic name, maybe empty.
pub fn parse_topic_affix(text: &str) -> Result<String, String> {
    topic_characters(text)?;
    Ok(text.to_owned())
}

/// `--consumer`: checked with the rule the cursor store applies.
pub fn parse_consumer(text: &str) -> Result<String, String> {
    match changefeed::cursor_store::check_consumer(text) {
        Ok(()) => Ok(text.to_owned()),
        Err(Error::Config(message)) => Err(message),
        Err(other) => Err(other.to_string()),
    }
}

/// `-X key=value`: a librdkafka setting. Only the shape is checked here; librdkafka judges
/// the key and the value when the producer is made.
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    const EXAMPLE: &str = "write key=value, e.g. -X compression.type=zstd";
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("no '=' in the producer setting; {EXAMPLE}"));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("the setting's name is missing; {EXAMPLE}"));
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{key:?} is not a setting name; {EXAMPLE}"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// Where `tail` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// `start`: from the oldest retained event.
    Start,
    /// `now`: from the current time of this machine.
    Now,
    /// After this cursor.
    Cursor(Cursor),
    /// From the first event of this time on.
    Time(OffsetDateTime),
}

impl StartAt {
    /// The cursor to read from, `now` being the current time.
    pub fn cursor(self, now: SystemTime) -> Cursor {
        match self {
            StartAt::Start => Cursor::START,
            StartAt::Now => Cursor::at(now),
            StartAt::Cursor(cursor) => cursor,
            StartAt::Time(time) => Cursor::at(SystemTime::from(time)),
        }
    }
}

/// The forms `--from` accepts, for error messages.
pub const FROM_FORMS: &str = "use start (the oldest retained event), now, a 26-character ULID \
    cursor such as 01HX5Z8N3C0000000000000000, or an RFC 3339 time such as \
    2024-05-01T12:00:00Z";

/// Parses `--from`: `start`, `now` (case-insensitive), a ULID cursor, or an RFC 3339 time.
pub fn parse_from(text: &str) -> Result<StartAt, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("start") {
        return Ok(StartAt::Start);
    }
    if text.eq_ignore_ascii_case("now") {
        return Ok(StartAt::Now);
    }
    // An RFC 3339 time has '-' and ':', which a ULID never has; 26 characters alone do not
    // tell them apart (2024-05-01T12:00:00.12345Z is 26 long).
    let looks_like_ulid = text.len() == 26 && text.chars().all(|c| c.is_ascii_alphanumeric());
    if looks_like_ulid {
        // Cursor's parser refuses a first character past 7 (see Cursor::from_str).
        return match text.parse::<Cursor>() {
            Ok(cursor) => Ok(StartAt::Cursor(cursor)),
            Err(Error::InvalidCursor(reason)) => Err(format!("{reason}; {FROM_FORMS}")),
            Err(other) => Err(format!("{other}; {FROM_FORMS}")),
        };
    }
    match OffsetDateTime::parse(text, &Rfc3339) {
        Ok(time) => Ok(StartAt::Time(time)),
        Err(error) if text.contains(':') => Err(format!(
            "{text:?} is not an RFC 3339 time ({error}); {FROM_FORMS}"
        )),
        Err(_) => Err(format!("{text:?} is not a starting point; {FROM_FORMS}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn from_start_now_cursor_and_time() {
        let now = UNIX_EPOCH + Duration::from_millis(1_714_564_800_123);
        assert_eq!(parse_from("start").unwrap().cursor(now), Cursor::START);
        assert_eq!(parse_from("START").unwrap(), StartAt::Start);
        assert_eq!(parse_from("now").unwrap().cursor(now), Cursor::at(now));

        let cursor: Cursor = "01HX5Z8N3C0000000000000000".parse().unwrap();
        assert_eq!(
            parse_from("01HX5Z8N3C0000000000000000").unwrap(),
            StartAt::Cursor(cursor)
        );
        // Crockford base32 is case-insensitive.
        assert_eq!(
            parse_from("01hx5z8n3c0000000000000000").unwrap(),
            StartAt::Cursor(cursor)
        );

        let at = parse_from("2024-05-01T12:00:00.123Z").unwrap();
        assert_eq!(
            at.cursor(now),
            Cursor::at(UNIX_EPOCH + Duration::from_millis(1_714_564_800_123))
        );
        assert_eq!(at.cursor(now).to_string(), "01HWT0D7KV0000000000000000");
        // An offset is honoured: 14:00+02:00 is 12:00Z.
        assert_eq!(
            parse_from("2024-05-01T14:00:00+02:00").unwrap().cursor(now),
            parse_from("2024-05-01T12:00:00Z").unwrap().cursor(now)
        );
        // 26 characters long, yet a time, not a ULID.
        let tricky = "2024-05-01T12:00:00.12345Z";
        assert_eq!(tricky.len(), 26);
        assert!(matches!(parse_from(tricky).unwrap(), StartAt::Time(_)));
        // Before 1970: from the start.
        assert_eq!(
            parse_from("1969-12-31T23:59:59Z").unwrap().cursor(now),
            Cursor::START
        );
    }

    #[test]
    fn bad_from_names_every_accepted_form() {
        for text in [
            "",
            "yesterday",
            "01HX5Z8N3C",                 // too short for a ULID
            "01HX5Z8N3C000000000000000U", // U is not Crockford base32
            "81HX5Z8N3C0000000000000000", // more than 128 bits
            "2024-05-01",                 // a date, not a time
            "2024-05-01 12:00:00",        // no offset
            "2024-13-01T12:00:00Z",
            "1714564800",
        ] {
            let error = parse_from(text).expect_err(text);
            for form in ["start", "now", "ULID", "RFC 3339"] {
                assert!(error.contains(form), "{text:?}: {error}");
            }
            assert!(!error.contains('\n'), "{text:?}: one line");
        }
    }

    #[test]
    fn counts_say_what_is_wrong() {
        assert_eq!(parse_count("5", 10), Ok(5));
        assert_eq!(parse_count(" 10 ", 10), Ok(10));
        for (text, expect) in [
            ("-5", "negative"),
            ("0", "zero"),
            ("11", "too large"),
            ("1.5", "whole number"),
            ("five", "not a number"),
            ("", "missing"),
            ("99999999999999999999999999", "too large"),
        ] {
            let error = parse_count(text, 10).unwrap_err();
            assert!(error.contains(expect), "{text:?}: {error}");
            assert!(error.contains("from 1 to 10"), "{text:?}: {error}");
        }
    }

    #[test]
    fn feed_names_are_checked_before_anything_else() {
        assert_eq!(
            parse_feed("myservice.OrderPlaced").unwrap().to_string(),
            "myservice.OrderPlaced"
        );
        for bad in [
            "dbo.x]; drop table y",
            "dbo.x'; --",
            "x",
            "a.b.c",
            "changefeed.feeds",
        ] {
            let error = parse_feed(bad).expect_err(bad);
            assert!(!error.is_empty() && !error.contains('\n'), "{bad}: {error}");
            assert!(parse_table(bad).is_err(), "{bad}");
        }
        assert!(parse_column("Shard").is_ok());
        assert!(parse_column(" ").is_err());
        assert!(parse_column("a\u{0}").is_err());
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("changefeed").chain(args.iter().copied()))
    }

    #[test]
    fn subcommands_parse_with_their_defaults() {
        let cli = parse(&["--url", "server=x", "tail", "app.Event"]).unwrap();
        assert_eq!(cli.url.as_deref(), Some("server=x"));
        assert_eq!(cli.connect_timeout.value, Duration::from_secs(15));
        match cli.command {
            Command::Tail(tail) => {
                assert_eq!(tail.shard, 0);
                assert_eq!(tail.from, StartAt::Start);
                assert!(!tail.with_event);
                assert_eq!(tail.page_size, 1000);
            }
            other => panic!("{other:?}"),
        }

        let cli = parse(&[
            "purge",
            "app.Event",
            "--older-than",
            "30d",
            "--shard",
            "2",
            "--dry-run",
            "--max-rows",
            "10",
        ])
        .unwrap();
        match cli.command {
            Command::Purge(purge) => {
                assert_eq!(purge.older_than.as_millis_i64(), 2_592_000_000);
                assert_eq!(purge.shard, Some(2));
                assert!(purge.dry_run && !purge.force);
                assert_eq!(purge.batch_size, 5000);
                assert_eq!(purge.max_rows, Some(10));
            }
            other => panic!("{other:?}"),
        }

        let cli = parse(&["purge-outbox", "dbo.outbox", "--older-than", "7d"]).unwrap();
        match cli.command {
            Command::PurgeOutbox(purge) => {
                assert_eq!(purge.older_than.value, Duration::from_secs(7 * 86_400));
                assert_eq!(purge.batch_size, 1000);
            }
            other => panic!("{other:?}"),
        }
        // The global options also go after the subcommand.
        let cli = parse(&["status", "--consumers", "--url", "server=y"]).unwrap();
        assert_eq!(cli.url.as_deref(), Some("server=y"));
        assert!(matches!(
            cli.command,
            Command::Status(StatusArgs {
                consumers: true,
                json: false
            })
        ));
    }

    #[test]
    fn relay_and_export_parse_with_their_kafka_defaults() {
        let cli = parse(&["relay", "--outbox", "dbo.outbox"]).unwrap();
        match cli.command {
            Command::Relay(relay) => {
                assert_eq!(relay.brokers, None);
                assert_eq!(relay.topic_prefix, "");
                assert_eq!(relay.dlq_suffix, ".dlq");
                assert_eq!(relay.max_in_flight, 4);
                assert!(relay.producer.settings.is_empty());
                assert_eq!(relay.producer.broker_timeout.value, Duration::from_secs(10));
                assert_eq!(relay.progress.every(), Some(Duration::from_secs(5)));
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&[
            "export",
            "app.Order",
            "--brokers",
            "k1:9092,k2:9092",
            "--topic",
            "orders",
            "--consumer",
            "to-kafka",
            "--shards",
            "2,0,2",
            "-X",
            "compression.type=zstd",
            "-X",
            "sasl.password=a=b",
            "--quiet",
        ])
        .unwrap();
        match cli.command {
            Command::Export(export) => {
                assert_eq!(export.brokers, "k1:9092,k2:9092");
                assert_eq!(export.shards, [2, 0, 2]);
                assert_eq!(export.from, StartAt::Start);
                assert_eq!(export.page_size, 1000);
                assert_eq!(
                    export.producer.settings,
                    [
                        ("compression.type".to_owned(), "zstd".to_owned()),
                        ("sasl.password".to_owned(), "a=b".to_owned())
                    ]
                );
                assert_eq!(export.progress.every(), None);
            }
            other => panic!("{other:?}"),
        }
        // The Kafka-only relay options need --brokers; export needs all three names.
        for bad in [
            &["relay", "--outbox", "o", "--topic-prefix", "p."][..],
            &["relay", "--outbox", "o", "--dlq-suffix", ".dead"],
            &["export", "app.Order", "--brokers", "k:1", "--topic", "t"],
            &["export", "app.Order", "--brokers", "k:1", "--consumer", "c"],
            &["export", "app.Order", "--topic", "t", "--consumer", "c"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn max_in_flight_is_between_1_and_64() {
        for (given, expected) in [("1", 1), ("8", 8), ("64", 64)] {
            let cli = parse(&["relay", "--outbox", "o", "--max-in-flight", given]).unwrap();
            match cli.command {
                Command::Relay(relay) => assert_eq!(relay.max_in_flight, expected),
                other => panic!("{other:?}"),
            }
        }
        for bad in ["0", "65", "-1", "four"] {
            let error = parse(&["relay", "--outbox", "o", "--max-in-flight", bad])
                .expect_err(bad)
                .to_string();
            assert!(error.contains("--max-in-flight"), "{bad}: {error}");
        }
    }

    #[test]
    fn kafka_values_are_checked_with_a_reason() {
        assert_eq!(
            parse_brokers(" k1:9092, k2:9092 ").unwrap(),
            "k1:9092,k2:9092"
        );
        for bad in ["", " ", "k1:9092,", "k1:9092,,k2:9092", "k1 :9092"] {
            let error = parse_brokers(bad).expect_err(bad);
            assert!(error.contains("host:port"), "{bad:?}: {error}");
        }
        assert_eq!(parse_topic("prod.orders-v2_x").unwrap(), "prod.orders-v2_x");
        for bad in ["", ".", "..", "a b", "orders/1", &"t".repeat(250)] {
            assert!(parse_topic(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_topic_affix("").unwrap(), "");
        assert!(parse_topic_affix(".dead letters").is_err());
        assert_eq!(
            parse_setting("linger.ms=5").unwrap(),
            ("linger.ms".to_owned(), "5".to_owned())
        );
        assert_eq!(
            parse_setting("client.id=").unwrap(),
            ("client.id".to_owned(), String::new())
        );
        for bad in ["linger.ms", "=5", "bad key=1"] {
            let error = parse_setting(bad).expect_err(bad);
            assert!(error.contains("key=value"), "{bad:?}: {error}");
        }
        assert!(parse_consumer("to-kafka").is_ok());
        let error = parse_consumer(" to-kafka").unwrap_err();
        assert!(error.contains("whitespace"), "{error}");
        assert!(parse_interval("0s").unwrap_err().contains("--quiet"));
        assert_eq!(parse_interval("2s").unwrap().value, Duration::from_secs(2));
    }

    #[test]
    fn setup_feed_takes_exactly_one_mode() {
        let cli = parse(&["setup-feed", "app.Event", "--outbox"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::SetupFeed(SetupFeedArgs { outbox: true, .. })
        ));
        let cli = parse(&[
            "setup-feed",
            "app.Event",
            "--serialize-writers",
            "--shard-column",
            "Shard",
            "--ulid-column",
            "ULID",
        ])
        .unwrap();
        match cli.command {
            Command::SetupFeed(setup) => {
                assert!(setup.serialize_writers && !setup.outbox);
                assert_eq!(setup.shard_column.as_deref(), Some("Shard"));
                assert_eq!(setup.ulid_column.as_deref(), Some("ULID"));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            &["setup-feed", "app.Event"][..],
            &["setup-feed", "app.Event", "--outbox", "--serialize-writers"],
            &["setup-feed", "app.Event", "--serialize-writers"],
            &[
                "setup-feed",
                "app.Event",
                "--serialize-writers",
                "--shard-column",
                "S",
            ],
            &["setup-feed", "app.Event", "--outbox", "--shard-column", "S"],
            &["setup-feed", "app.Event", "--outbox", "--ulid-column", "U"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn out_of_range_numbers_and_durations_are_refused() {
        for bad in [
            &["tail", "app.Event", "--page-size", "0"][..],
            &["tail", "app.Event", "--page-size", "10001"],
            &["tail", "app.Event", "--from", "tomorrow"],
            &["purge", "app.Event"],
            &["purge", "app.Event", "--older-than", "30"],
            &["purge", "app.Event", "--older-than", "-5d"],
            &["purge", "app.Event", "--older-than", "36526d"],
            &[
                "purge",
                "app.Event",
                "--older-than",
                "30d",
                "--batch-size",
                "50001",
            ],
            &[
                "purge",
                "app.Event",
                "--older-than",
                "30d",
                "--max-rows",
                "0",
            ],
            &[
                "purge-outbox",
                "dbo.outbox",
                "--older-than",
                "7d",
                "--batch-size",
                "4001",
            ],
            &["purge-outbox", "dbo.x]", "--older-than", "7d"],
            &["status", "--connect-timeout", "0s"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse(&["purge", "app.Event", "--older-than", "0s"]).is_ok());
        assert!(parse(&["tail", "app.Event", "--shard", "-1"]).is_ok());
    }
}
