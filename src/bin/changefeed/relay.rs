//! `changefeed relay`: a claim outbox to Kafka (`--brokers`, with the `kafka` feature) or
//! to standard output as JSON lines, over SQL Server (an ADO.NET `--url`) or MariaDB/MySQL
//! (a `mysql://` `--url`, woken by the binlog).
//!
//! Checks come in this order, each a one-line failure: the outbox's name, the brokers,
//! then the database (one connection: reachable, and the outbox exists). Only then does
//! the relay start; it never gives up on its store after that (a failover must not stop
//! it), so a database that goes away later shows in the progress line instead.

use std::sync::Arc;
use std::time::Duration;

use changefeed::outbox::ClaimStore;
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::relay::{JsonLines, Publisher, Relay, RelayConfig, RelayHandle};
use changefeed::{Error, TableName};

pub mod postgres;

use crate::Failure;
use crate::args::RelayArgs;
use crate::commands::{Connect, not_an_outbox, procedure_exists};
use crate::progress::{RelayCounters, print_stderr, relay_line, with_progress};
use crate::signals::Signals;

/// Whether `url` is for MariaDB/MySQL.
fn is_mysql(url: &str) -> bool {
    url.trim_start()
        .to_ascii_lowercase()
        .starts_with("mysql://")
}

fn config(args: &RelayArgs) -> RelayConfig {
    RelayConfig::default()
        .batch_size(args.batch_size)
        .max_in_flight(args.max_in_flight)
}

/// Where the messages go.
enum Target {
    /// Standard output, one JSON line each.
    Stdout,
    /// Kafka, with these settings (the brokers answered).
    #[cfg(feature = "kafka")]
    Kafka(changefeed::kafka::KafkaPublisherConfig),
}

impl Target {
    /// For the banner: `relaying <outbox> <this>`.
    fn describe(&self) -> String {
        match self {
            Target::Stdout => "to standard output".to_owned(),
            #[cfg(feature = "kafka")]
            Target::Kafka(config) => format!(
                "to Kafka at {} (topics {}<topic>, dead letters <topic>{})",
                config.producer.brokers(),
                config.topic_prefix,
                config.dlq_suffix
            ),
        }
    }
}

/// The target `args` ask for; with `--brokers`, once a broker has answered.
async fn target(args: &RelayArgs) -> Result<Target, Failure> {
    match &args.brokers {
        None => Ok(Target::Stdout),
        Some(brokers) => kafka_target(brokers, args).await,
    }
}

#[cfg(feature = "kafka")]
async fn kafka_target(brokers: &str, args: &RelayArgs) -> Result<Target, Failure> {
    use changefeed::kafka::KafkaPublisherConfig;

    let settings = crate::kafka::settings(brokers, &args.producer);
    crate::kafka::check_publish_time(&settings, &config(args))?;
    let checked = crate::kafka::checked_producer(&settings, &args.producer).await?;
    // The publisher makes its own producer from the same settings.
    drop(checked);
    Ok(Target::Kafka(
        KafkaPublisherConfig::new(settings)
            .topic_prefix(args.topic_prefix.clone())
            .dlq_suffix(args.dlq_suffix.clone()),
    ))
}

#[cfg(not(feature = "kafka"))]
async fn kafka_target(_brokers: &str, _args: &RelayArgs) -> Result<Target, Failure> {
    Err(crate::kafka::without_kafka("relay to Kafka (--brokers)"))
}

/// Something that runs beside the relay (the binlog waker) and is stopped after it.
trait Companion {
    /// Stops it and waits for it.
    async fn stop(self);
}

/// Nothing beside the relay.
impl Companion for () {
    async fn stop(self) {}
}

/// Relays until SIGINT or SIGTERM, then finishes the batch in flight.
pub async fn relay(connect: &Connect, args: RelayArgs) -> Result<(), Failure> {
    if is_mysql(&connect.url) {
        return relay_mysql(connect, args).await;
    }
    if postgres::is_postgres(&connect.url) {
        return postgres::relay(connect, args).await;
    }
    let table: TableName = args
        .outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let target = target(&args).await?;
    {
        // One plain connection first: a clear line for an unreachable server or a missing
        // outbox, instead of the relay's endless retries.
        let mut client = connect.open(Some(Duration::from_secs(30))).await?;
        let procedure = table.object("claim");
        if !procedure_exists(&mut client, &procedure).await? {
            return Err(Failure::run(not_an_outbox(&table, &procedure)));
        }
    }
    let store = SqlClaimStore::new(OutboxStore::new(table), &connect.url);
    run(store, target, config(&args), &args, "", |_| ()).await
}

/// Builds the relay over `store` for `target` and runs it with the progress line, `start`
/// (given the relay's wake handle) running beside it.
async fn run<S: ClaimStore, C: Companion>(
    store: S,
    target: Target,
    config: RelayConfig,
    args: &RelayArgs,
    how: &str,
    start: impl FnOnce(RelayHandle) -> C,
) -> Result<(), Failure> {
    let banner = format!("relaying {} {}{how}", args.outbox, target.describe());
    match target {
        Target::Stdout => drive(Relay::new(store, JsonLines, config)?, args, &banner, start).await,
        #[cfg(feature = "kafka")]
        Target::Kafka(kafka) => {
            let publisher = changefeed::kafka::KafkaPublisher::new(kafka)
                .map_err(|error| crate::kafka::setting_failure(&error))?;
            drive(Relay::new(store, publisher, config)?, args, &banner, start).await
        }
    }
}

async fn drive<S: ClaimStore, P: Publisher, C: Companion>(
    relay: Relay<S, P>,
    args: &RelayArgs,
    banner: &str,
    start: impl FnOnce(RelayHandle) -> C,
) -> Result<(), Failure> {
    let quiet = args.progress.quiet;
    let counters = Arc::new(RelayCounters::default());
    let relay = relay.with_hooks(Arc::clone(&counters));
    let companion = start(relay.handle());
    let signals = Signals::install()?;
    if !quiet {
        print_stderr(&format!("{banner}; SIGINT or SIGTERM stops"));
    }
    let mut before = counters.snapshot();
    let progress_line = |elapsed| {
        let now = counters.snapshot();
        let line = relay_line(&before, &now, elapsed);
        before = now;
        line
    };
    let result = with_progress(
        relay.run(signals.watch(
            "the batch in flight",
            quiet,
            Some(args.shutdown_grace.value),
        )),
        args.progress.every(),
        progress_line,
        print_stderr,
    )
    .await;
    companion.stop().await;
    // A fatal publish error: the batch was acknowledged, the relay stopped.
    result?;
    if !quiet {
        let done = counters.snapshot();
        print_stderr(&format!(
            "stopped: published {}, failed {}, dead {}",
            done.published, done.failed, done.dead
        ));
    }
    Ok(())
}

#[cfg(feature = "mysql")]
async fn relay_mysql(connect: &Connect, args: RelayArgs) -> Result<(), Failure> {
    use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, OutboxTable};
    use mysql_async::prelude::Queryable;

    /// The binlog waker's task and the sender that stops it.
    struct Waker {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Companion for Waker {
        async fn stop(self) {
            let _ = self.stop.send(());
            let _ = self.task.await;
        }
    }

    let usage = |e: Error| Failure::usage(e.to_string());
    let table: OutboxTable = args.outbox.parse().map_err(usage)?;
    let opts = changefeed::mysql::opts(&connect.url).map_err(usage)?;
    let target = target(&args).await?;
    {
        // As for SQL Server: one connection, and the table must be there.
        let address = match opts.socket() {
            Some(socket) => socket.to_owned(),
            None => format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port()),
        };
        let mut conn = changefeed::mysql::connect_within(&opts, connect.timeout)
            .await
            .map_err(|error| {
                Failure::connect(format!(
                    "cannot connect to MariaDB/MySQL at {address}: {error}; check --url or \
                     CHANGEFEED_URL (or raise --connect-timeout)"
                ))
            })?;
        let found: Option<i64> = conn
            .exec_first(
                "select count(*) from information_schema.tables \
                 where table_schema = database() and table_name = ?",
                (table.name(),),
            )
            .await
            .map_err(|error| Failure::run(Error::from(error).to_string()))?;
        conn.disconnect().await.ok();
        if found.unwrap_or(0) == 0 {
            return Err(Failure::run(format!(
                "{} is not a table of database {} on MariaDB/MySQL; create the outbox with \
                 call changefeed_setup_outbox('{}') (or check the database in --url)",
                table.name(),
                opts.db_name().unwrap_or_default(),
                table.name()
            )));
        }
    }
    let store = MysqlOutboxStore::new(table.clone(), opts.clone()).connect_timeout(connect.timeout);
    // The binlog wakes the relay; its own poll is the safety net behind the waker's.
    let config = config(&args).poll_interval(Duration::from_secs(5));
    let start = |handle: RelayHandle| {
        let waker_config = BinlogWakerConfig {
            connect_timeout: connect.timeout,
            ..BinlogWakerConfig::default()
        };
        let waker = BinlogWaker::new(opts, table, handle, waker_config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(waker.run(async {
            let _ = stopped.await;
        }));
        Waker { stop, task }
    };
    let how = " (woken by the binlog, polling when it cannot be followed)";
    run(store, target, config, &args, how, start).await
}

#[cfg(not(feature = "mysql"))]
async fn relay_mysql(_connect: &Connect, _args: RelayArgs) -> Result<(), Failure> {
    Err(Failure::usage(
        "this changefeed was built without MariaDB/MySQL support; build it with \
         --features cli,mysql to relay from a mysql:// URL",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_database() {
        assert!(is_mysql("mysql://relay@db/app"));
        assert!(is_mysql(" MYSQL://relay@db/app"));
        assert!(!is_mysql("server=tcp:db,1433;database=app"));
    }
}
