//! The command line: the global options, the list of subcommands, and where each
//! subcommand's arguments are defined (one file each; `shared` holds the options `relay`
//! and `export` have in common, `values` the parsers of their values, `start_at` the
//! `--from` of `tail` and `export`). Every value is checked here, before any connection is
//! opened.

mod export;
mod purge;
mod purge_outbox;
mod relay;
mod setup_feed;
mod setup_outbox;
mod shared;
mod start_at;
mod status;
mod tail;
mod values;

use changefeed::connection::URL_VARIABLE;
use clap::{Parser, Subcommand};

use crate::duration::CliDuration;

pub use export::ExportArgs;
pub use purge::PurgeArgs;
pub use purge_outbox::PurgeOutboxArgs;
pub use relay::RelayArgs;
pub use setup_feed::SetupFeedArgs;
pub use setup_outbox::SetupOutboxArgs;
pub use shared::MetricsArgs;
#[cfg(feature = "kafka")]
pub use shared::ProducerArgs;
#[cfg(feature = "kafka")]
pub use shared::ServiceArgs;
pub use status::StatusArgs;
pub use tail::TailArgs;

use values::parse_timeout;

/// Race-safe event feeds and transactional outboxes inside SQL Server and PostgreSQL (and
/// claim outboxes on MariaDB/MySQL): apply the bundle, set up feeds, follow them, watch
/// them and trim them.
#[derive(Debug, Parser)]
#[command(name = "changefeed", version, propagate_version = true)]
#[command(
    after_help = "The connection string is an ADO.NET string for SQL Server, e.g. \
    CHANGEFEED_URL='server=tcp:localhost,1433;user=sa;password=...;database=app;\
    TrustServerCertificate=true', a postgres:// URL for PostgreSQL (feature postgres), e.g. \
    postgres://app:...@localhost:5432/app, or a mysql:// URL for MariaDB/MySQL (feature \
    mysql; outboxes only). Which command takes which store is in each command's help. \
    Exit status: 0 done (relay and export: stopped by \
    SIGINT or SIGTERM after finishing their batch), 1 failed, 2 bad arguments or no usable \
    connection (database or Kafka brokers), 130 tail stopped by Ctrl-C, or relay and export \
    stopped at once by a second signal."
)]
pub struct Cli {
    /// The database: an ADO.NET string (SQL Server), a postgres:// URL (PostgreSQL) or a
    /// mysql:// URL (MariaDB/MySQL)
    #[arg(
        long,
        global = true,
        env = URL_VARIABLE,
        hide_env_values = true,
        value_name = "URL"
    )]
    pub url: Option<String>,

    /// How long to wait for the database to accept a new connection
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
    /// (SQL Server, PostgreSQL, MariaDB/MySQL: each store's own bundle)
    Migrate,
    /// Make an event table a feed (changefeed.setup_feed; SQL Server, PostgreSQL); the
    /// table must exist and have a primary key
    SetupFeed(SetupFeedArgs),
    /// Print a feed shard's events as JSON lines and follow its head, like `tail -f` (SQL
    /// Server, PostgreSQL)
    #[command(
        after_help = "One JSON object per line: {\"ulid\":\"<cursor>\",\"time\":\"<the \
        ULID's time, RFC 3339>\",\"shard\":<n>,\"key\":{<key columns>}} or, with \
        --with-event, \"event\":{<event columns>} (null for an event deleted since). Binary \
        values are 0x… hex, decimals exact text, dates and times ISO 8601. Pass a printed \
        ulid to --from to resume after it. Ctrl-C stops (exit status 130, like tail -f)."
    )]
    Tail(TailArgs),
    /// Show feeds, claim outboxes and consumers as tables: SQL Server (feeds, outboxes,
    /// consumers), PostgreSQL (feeds and consumers; its bundle keeps no list of outboxes),
    /// MariaDB/MySQL (outboxes)
    Status(StatusArgs),
    /// Delete a feed's rows older than a cutoff (outbox-mode feeds; SQL Server, PostgreSQL),
    /// never past a registered consumer's cursor unless --force
    Purge(PurgeArgs),
    /// Delete a claim outbox's done messages older than a cutoff, dead ones kept (SQL
    /// Server, PostgreSQL, MariaDB/MySQL)
    PurgeOutbox(PurgeOutboxArgs),
    /// Create or complete a claim outbox table, never dropping data (SQL Server,
    /// PostgreSQL with the `postgres` feature, MariaDB/MySQL with the `mysql` feature)
    SetupOutbox(SetupOutboxArgs),
    /// Relay a claim outbox to Kafka (--brokers; needs the `kafka` feature) or to standard
    /// output, one JSON line per message, until SIGINT or SIGTERM (SQL Server; MariaDB/MySQL
    /// with the binlog wake, `mysql` feature; PostgreSQL with the LISTEN/NOTIFY wake,
    /// `postgres` feature)
    #[command(after_help = relay::HELP)]
    Relay(RelayArgs),
    /// Export a feed's events to a Kafka topic, saving the consumer's cursor after every
    /// acknowledged page, until SIGINT or SIGTERM (SQL Server, PostgreSQL; needs the
    /// `kafka` feature)
    #[command(after_help = export::HELP)]
    Export(ExportArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::start_at::StartAt;
    use clap::CommandFactory;
    use std::time::Duration;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("changefeed").chain(args.iter().copied()))
    }

    /// The arguments of `$command` if it is the subcommand `$variant`, else a panic that
    /// shows what it is.
    macro_rules! arguments_of {
        ($variant:path, $command:expr) => {
            match $command {
                $variant(arguments) => arguments,
                other => panic!("{other:?}"),
            }
        };
    }

    #[test]
    fn subcommands_parse_with_their_defaults() {
        let cli = parse(&["--url", "server=x", "tail", "app.Event"]).unwrap();
        assert_eq!(cli.url.as_deref(), Some("server=x"));
        assert_eq!(cli.connect_timeout.value, Duration::from_secs(15));
        let tail = arguments_of!(Command::Tail, cli.command);
        assert_eq!(tail.shard, 0);
        assert_eq!(tail.from, StartAt::Start);
        assert!(!tail.with_event);
        assert_eq!(tail.page.page_size, 1000);

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
        let purge = arguments_of!(Command::Purge, cli.command);
        assert_eq!(purge.older_than.as_millis_i64(), 2_592_000_000);
        assert_eq!(purge.shard, Some(2));
        assert!(purge.dry_run && !purge.force);
        assert_eq!(purge.batch_size, 5000);
        assert_eq!(purge.max_rows, Some(10));

        let cli = parse(&["purge-outbox", "dbo.outbox", "--older-than", "7d"]).unwrap();
        let purge = arguments_of!(Command::PurgeOutbox, cli.command);
        assert_eq!(purge.table, "dbo.outbox");
        assert_eq!(purge.older_than.value, Duration::from_secs(7 * 86_400));
        assert_eq!(purge.batch_size, 1000);
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
        let relay = arguments_of!(Command::Relay, cli.command);
        assert_eq!(relay.brokers, None);
        assert_eq!(relay.topic_prefix, "");
        assert_eq!(relay.dlq_suffix, ".dlq");
        assert_eq!(relay.max_in_flight, 4);
        assert!(relay.service.producer.settings.is_empty());
        assert_eq!(
            relay.service.producer.broker_timeout.value,
            Duration::from_secs(10)
        );
        assert_eq!(relay.service.progress.every(), Some(Duration::from_secs(5)));
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
        let export = arguments_of!(Command::Export, cli.command);
        assert_eq!(export.brokers, "k1:9092,k2:9092");
        assert_eq!(export.shards, [2, 0, 2]);
        assert_eq!(export.from, StartAt::Start);
        assert_eq!(export.page.page_size, 1000);
        assert_eq!(
            export.service.producer.settings,
            [
                ("compression.type".to_owned(), "zstd".to_owned()),
                ("sasl.password".to_owned(), "a=b".to_owned())
            ]
        );
        assert_eq!(export.service.progress.every(), None);
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
        let setup = arguments_of!(Command::SetupFeed, cli.command);
        assert!(setup.serialize_writers && !setup.outbox);
        assert_eq!(setup.shard_column.as_deref(), Some("Shard"));
        assert_eq!(setup.ulid_column.as_deref(), Some("ULID"));
        // PostgreSQL's outbox mode takes a shard column and a shard count (the command
        // refuses them on SQL Server, where the writer names the shard).
        let cli = parse(&[
            "setup-feed",
            "app.Event",
            "--outbox",
            "--shard-column",
            "S",
            "--shards",
            "4",
        ])
        .unwrap();
        let setup = arguments_of!(Command::SetupFeed, cli.command);
        assert_eq!(
            (setup.shard_column.as_deref(), setup.shards),
            (Some("S"), Some(4))
        );
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
            &["setup-feed", "app.Event", "--outbox", "--ulid-column", "U"],
            &["setup-feed", "app.Event", "--outbox", "--shards", "0"],
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
            &["status", "--connect-timeout", "0s"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse(&["purge", "app.Event", "--older-than", "0s"]).is_ok());
        assert!(parse(&["tail", "app.Event", "--shard", "-1"]).is_ok());
    }

    #[test]
    fn max_in_flight_is_between_1_and_64() {
        for (given, expected) in [("1", 1), ("8", 8), ("64", 64)] {
            let cli = parse(&["relay", "--outbox", "o", "--max-in-flight", given]).unwrap();
            let relay = arguments_of!(Command::Relay, cli.command);
            assert_eq!(relay.max_in_flight, expected);
        }
        // "-1" is read as the option's value (not as an unknown option), so its error
        // names the option and its range like any other out-of-range number.
        for bad in ["0", "65", "four", "-1"] {
            let error = parse(&["relay", "--outbox", "o", "--max-in-flight", bad])
                .expect_err(bad)
                .to_string();
            assert!(error.contains("--max-in-flight"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_negative_count_is_refused_naming_its_option() {
        for (option, bad) in [("--batch-size", "-1"), ("--max-in-flight", "-4")] {
            let error = parse(&["relay", "--outbox", "o", option, bad])
                .expect_err(bad)
                .to_string();
            assert!(error.contains(option), "{option} {bad}: {error}");
        }
    }
}
