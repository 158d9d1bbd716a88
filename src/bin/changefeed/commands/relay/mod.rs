//! `changefeed relay`: a claim outbox to Kafka (`--brokers`, with the `kafka` feature) or
//! to standard output as JSON lines, over SQL Server (an ADO.NET `--url`, here),
//! MariaDB/MySQL (a `mysql://` `--url`, woken by the binlog: `mysql.rs`) or PostgreSQL (a
//! `postgres://` `--url`, woken by LISTEN/NOTIFY: `postgres.rs`). The targets, the
//! progress line, the signals and the metrics endpoint are written once here for all three.
//!
//! Checks come in this order, each a one-line failure: the outbox's name, the brokers,
//! then the database (one connection: reachable, and the outbox exists). Only then does
//! the relay start; it never gives up on its store after that (a failover must not stop
//! it), so a database that goes away later shows in the progress line instead.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use changefeed::outbox::{ClaimStore, OutboxBacklog};
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::relay::{JsonLines, Publisher, Relay, RelayConfig, RelayHandle};
use changefeed::{Error, TableName};
use tracing::Instrument;

mod mysql;
mod postgres;

use crate::args::RelayArgs;
use crate::database::{Connect, is_mysql, is_postgres, require_outbox};
use crate::endpoints::{Endpoints, Freshness};
use crate::failure::Failure;
use crate::progress::{RelayCounters, print_stderr, relay_line, with_progress};
use crate::signals::Signals;

/// The relay's settings from the command line (each store adds its own poll interval).
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

    let settings = crate::kafka::settings(brokers, &args.service.producer);
    crate::kafka::check_publish_time(&settings, &config(args))?;
    let checked = crate::kafka::checked_producer(&settings, &args.service.producer).await?;
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

/// A waker's task beside the relay, and the sender that stops it.
#[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
struct Waker {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

#[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
impl Waker {
    /// Spawns the waker `run` makes, given what resolves when it is to stop.
    fn spawn<F>(run: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        Waker {
            stop,
            task: tokio::spawn(run(stopped)),
        }
    }
}

impl Companion for Waker {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Reads an outbox's backlog for the `changefeed_outbox_*` gauges (a store of its own,
/// beside the relay's). Each store bounds its calls in time.
pub trait Backlog: Send + 'static {
    /// The backlog now.
    fn read(&mut self) -> impl Future<Output = changefeed::Result<OutboxBacklog>> + Send;
}

impl Backlog for SqlClaimStore {
    async fn read(&mut self) -> changefeed::Result<OutboxBacklog> {
        self.backlog().await
    }
}

#[cfg(feature = "mysql")]
impl Backlog for changefeed::mysql::MysqlOutboxStore {
    async fn read(&mut self) -> changefeed::Result<OutboxBacklog> {
        self.backlog().await
    }
}

#[cfg(feature = "postgres")]
impl Backlog for changefeed::postgres::PostgresOutboxStore {
    async fn read(&mut self) -> changefeed::Result<OutboxBacklog> {
        self.backlog().await
    }
}

/// Reads `backlog` every `every` into the gauges of `outbox`, until dropped.
async fn poll_backlog(mut backlog: impl Backlog, outbox: String, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match backlog.read().await {
            Ok(backlog) => changefeed::metrics::record_backlog(&outbox, &backlog),
            Err(error) => {
                changefeed::metrics::record_backlog_error(&outbox);
                tracing::warn!(%outbox, %error, "reading the outbox's backlog failed");
            }
        }
    }
}

/// Relays until SIGINT or SIGTERM, then finishes the batch in flight.
pub async fn relay(connect: &Connect, args: RelayArgs) -> Result<(), Failure> {
    // First: a busy or wrong address is a usage error before anything connects, and the
    // probes get answers (not ready) while the checks run.
    let endpoints = Endpoints::serve(
        &args.service.metrics,
        Freshness::LastClaim,
        args.service.progress.quiet,
    )
    .await?;
    if is_mysql(&connect.url) {
        return mysql::relay(connect, args, endpoints).await;
    }
    if is_postgres(&connect.url) {
        return postgres::relay(connect, args, endpoints).await;
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
        require_outbox(&mut client, &table, "claim").await?;
    }
    let store = SqlClaimStore::new(OutboxStore::new(table.clone()), &connect.url);
    let backlog = SqlClaimStore::new(OutboxStore::new(table), &connect.url);
    let monitor = Monitor::new(endpoints, backlog, &args);
    run(store, target, config(&args), &args, "", monitor, |_| ()).await
}

/// What runs beside the relay for `--metrics-addr`: the endpoints and the backlog reads.
pub struct Monitor<B> {
    endpoints: Option<Endpoints>,
    backlog: Option<B>,
    every: Duration,
}

impl<B: Backlog> Monitor<B> {
    /// The endpoints, if any, and `backlog` read every `--backlog-interval` while they run.
    pub fn new(endpoints: Option<Endpoints>, backlog: B, args: &RelayArgs) -> Self {
        Monitor {
            endpoints,
            backlog: Some(backlog),
            every: args.backlog_interval.value,
        }
    }

    /// The relay of `outbox` starts: readiness follows its claims, and the backlog is read
    /// until the returned guard is dropped.
    fn start(mut self, outbox: String) -> Option<(Endpoints, Option<tokio::task::JoinHandle<()>>)> {
        let endpoints = self.endpoints.take()?;
        endpoints.running();
        let poller = self
            .backlog
            .take()
            .map(|backlog| tokio::spawn(poll_backlog(backlog, outbox, self.every)));
        Some((endpoints, poller))
    }
}

/// Builds the relay over `store` for `target` and runs it with the progress line, `start`
/// (given the relay's wake handle) running beside it.
#[allow(clippy::too_many_arguments)]
async fn run<S: ClaimStore, B: Backlog, C: Companion>(
    store: S,
    target: Target,
    config: RelayConfig,
    args: &RelayArgs,
    how: &str,
    monitor: Monitor<B>,
    start: impl FnOnce(RelayHandle) -> C,
) -> Result<(), Failure> {
    let banner = format!("relaying {} {}{how}", args.outbox, target.describe());
    match target {
        Target::Stdout => {
            let relay = Relay::new(store, JsonLines, config)?;
            drive(relay, args, &banner, monitor, start).await
        }
        #[cfg(feature = "kafka")]
        Target::Kafka(kafka) => {
            let publisher = changefeed::kafka::KafkaPublisher::new(kafka)
                .map_err(|error| crate::kafka::setting_failure(&error))?;
            let relay = Relay::new(store, publisher, config)?;
            drive(relay, args, &banner, monitor, start).await
        }
    }
}

async fn drive<S: ClaimStore, P: Publisher, B: Backlog, C: Companion>(
    relay: Relay<S, P>,
    args: &RelayArgs,
    banner: &str,
    monitor: Monitor<B>,
    start: impl FnOnce(RelayHandle) -> C,
) -> Result<(), Failure> {
    let quiet = args.service.progress.quiet;
    let monitoring = monitor.start(args.outbox.clone());
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
        args.service.progress.every(),
        progress_line,
        print_stderr,
    )
    .instrument(tracing::info_span!("relay", outbox = %args.outbox))
    .await;
    companion.stop().await;
    if let Some((_endpoints, Some(poller))) = monitoring {
        poller.abort();
    }
    // A fatal publish error: the batch was acknowledged, the relay stopped.
    result?;
    if !quiet {
        let done = counters.snapshot();
        let mut line = format!(
            "stopped: published {}, failed {}, dead {}",
            done.published, done.failed, done.dead
        );
        if done.dead_letters_failed > 0 {
            line.push_str(&format!(
                ", dead letters failed {}",
                done.dead_letters_failed
            ));
        }
        print_stderr(&line);
    }
    Ok(())
}
