//! End to end on a real database, whatever the store (bench_mysql_kafka,
//! bench_postgres_kafka): outbox → relays (the store's `ClaimStore`, `KafkaPublisher`, woken
//! by the store's waker) → librdkafka's mock cluster, with 1 and 4 relays, next to what
//! bounds it, measured in the same run:
//!
//! * the bare claim-and-ack loop in SQL (no client, no relay, no broker), the most the
//!   database does;
//! * the bare producer sending the same number of records to the same cluster, every
//!   delivery awaited, the most the broker side does;
//! * the same relays with a no-op publisher: the store's side alone (round trips and
//!   decoding in the client), so that a gap to the bare loop is told apart into the client's
//!   side (no-op relay / bare loop) and the broker path (relay / no-op relay).
//!
//! Throughput drains a full outbox (`messages` over 1000 aggregates, batch 100). Latency is
//! commit to delivery: single-message transactions committed 15 ms (plus jitter) apart, and
//! the moment the publish that carried the message returned, all its delivery reports in.
//! What is the store's own (its database, store, waker and commits) is an [`Outbox`].

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::FutureRecord;
use changefeed::kafka::{KafkaPublisher, KafkaPublisherConfig, ProducerSettings};
use changefeed::outbox::{ClaimStore, ClaimedMessage, NewMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig, RelayHandle};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::relay_bench::{self, AGGREGATES, BATCH, Rounds, Sizes, Stage, fail};
use crate::stats::{self, Summary};
use crate::{cpu, figures, kafka_bench, store_bench};

/// The topic every message goes to (the outbox rows name it).
const TOPIC: &str = "bench";
/// The bare producer's topic.
const RAW_TOPIC: &str = "bench-raw";
/// The goal for commit to delivery with the store's wake (issue 31 item 3).
const LATENCY_GOAL_MS: f64 = 10.0;

/// One store's database, as the end-to-end run drives it.
pub trait Outbox {
    /// The relay's store.
    type Store: ClaimStore + Send + Sync + 'static;
    /// A connection the latency run commits on.
    type Writer;

    /// A new store on the benchmark's outbox, as a relay process would open.
    fn store(&self) -> Self::Store;
    /// Spawns the store's waker for the relay's `handle`, running until
    /// [`store_bench::stopped`]`(stop)`; resolves to its task once it follows its source.
    fn wake(
        &self,
        handle: RelayHandle,
        stop: watch::Receiver<bool>,
    ) -> impl Future<Output = JoinHandle<()>>;
    /// Empties the outbox.
    async fn reset(&self);
    /// Enqueues `messages` messages (payload `{"n": n}`, aggregate `a{n % 1000}`).
    async fn fill(&self, messages: usize);
    /// Resolves once no message is open.
    async fn until_drained(&self);
    /// Messages per second through `loops` bare SQL loops from a full outbox (what the
    /// machine's threads spent meanwhile added to `split`); `None` when the stage failed or
    /// stalled.
    async fn bare_throughput(
        &self,
        messages: usize,
        loops: usize,
        split: &RefCell<cpu::Split>,
    ) -> Option<f64>;
    /// A connection of its own to commit on.
    async fn writer(&self) -> Self::Writer;
    /// Commits `message` alone on `writer`; returns its id.
    async fn commit_one(&self, writer: &mut Self::Writer, message: &NewMessage) -> i64;
}

/// Wraps the relay's publisher and notes when each message's publish returned (every
/// delivery report of its batch in), by outbox id.
struct Delivered<P> {
    inner: P,
    at: Arc<Mutex<HashMap<i64, Instant>>>,
}

impl<P: Publisher> Publisher for Delivered<P> {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        let outcomes = self.inner.publish(batch).await;
        let now = Instant::now();
        let mut at = self.at.lock().unwrap();
        for (message, outcome) in batch.iter().zip(&outcomes) {
            if outcome.is_ok() {
                at.entry(message.id).or_insert(now);
            }
        }
        outcomes
    }

    fn longest_publish(&self) -> Option<Duration> {
        self.inner.longest_publish()
    }

    // A wrapper must forward this too: the default would assume the inner publisher's
    // calls queue behind each other, and refuse KafkaPublisher at 4 batches in flight.
    fn longest_publish_in_flight(&self, in_flight: u32) -> Option<Duration> {
        self.inner.longest_publish_in_flight(in_flight)
    }
}

fn settings(bootstrap: &str) -> ProducerSettings {
    ProducerSettings::new(bootstrap).set(
        "linger.ms",
        KafkaPublisher::DEFAULT_LINGER.as_millis().to_string(),
    )
}

/// `relays` relays, each with its own store, producer and waker, as separate relay
/// processes would have.
struct Fleet {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    delivered: Arc<Mutex<HashMap<i64, Instant>>>,
}

impl Fleet {
    /// Starts the relays once each one's producer is warmed up and each one's waker follows
    /// its source; returns the fleet and the instant the relays were started, so that a
    /// throughput times the relays' work and not their start (a producer's warm-up takes
    /// milliseconds, and a quick run drains the outbox in a fraction of a second).
    async fn start(db: &impl Outbox, bootstrap: &str, relays: usize) -> (Fleet, Instant) {
        let (stop, stopped) = watch::channel(false);
        let delivered = Arc::new(Mutex::new(HashMap::new()));
        let mut ready = Vec::new();
        for _ in 0..relays {
            let publisher = KafkaPublisher::new(KafkaPublisherConfig::new(settings(bootstrap)))
                .unwrap_or_else(|e| fail("KafkaPublisher", e));
            kafka_bench::warm_up(publisher.producer(), TOPIC)
                .await
                .unwrap_or_else(|e| fail("warm up", e));
            let publisher = Delivered {
                inner: publisher,
                at: Arc::clone(&delivered),
            };
            // The relay's defaults but the batch (the bare loop's), and a poll interval long
            // enough that only the store's waker wakes it.
            let config = RelayConfig::default()
                .batch_size(BATCH)
                .poll_interval(store_bench::WOKEN_POLL);
            let relay =
                Relay::new(db.store(), publisher, config).unwrap_or_else(|e| fail("relay", e));
            let waker_task = db.wake(relay.handle(), stopped.clone()).await;
            ready.push((relay, waker_task));
        }
        let started = Instant::now();
        let tasks = ready
            .into_iter()
            .map(|(relay, waker_task)| {
                let relay_stopped = stopped.clone();
                tokio::spawn(async move {
                    let _ = relay.run(store_bench::stopped(relay_stopped)).await;
                    let _ = waker_task.await;
                })
            })
            .collect();
        let fleet = Fleet {
            stop,
            tasks,
            delivered,
        };
        (fleet, started)
    }

    async fn stop(self) -> HashMap<i64, Instant> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        self.delivered.lock().unwrap().clone()
    }
}

/// Messages per second from a full outbox of `messages` through `relays` relays into the
/// cluster, from the relays' start (their producers warmed up, their wakers following) to
/// the outbox drained; what the machine's threads spent meanwhile is added to `split`.
async fn relay_throughput(
    db: &impl Outbox,
    bootstrap: &str,
    messages: usize,
    relays: usize,
    split: &RefCell<cpu::Split>,
) -> Result<f64, String> {
    db.reset().await;
    db.fill(messages).await;
    let (fleet, started) = Fleet::start(db, bootstrap, relays).await;
    let meter = cpu::Meter::start(Some(split));
    // Counted in the process until the last delivery, then the outbox is asked: a query
    // every 2 ms all along took a server process a sixth of a core, beside relays that
    // compete for the server's cores and loops that do not (no such query runs beside them).
    while fleet.delivered.lock().unwrap().len() < messages {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    db.until_drained().await;
    let elapsed = started.elapsed();
    // Before the fleet stops: its producers' threads end with it.
    meter.stop();
    let delivered = fleet.stop().await;
    if delivered.len() != messages {
        return Err(format!("{} of {messages} delivered", delivered.len()));
    }
    Ok(stats::throughput(messages as u64, elapsed).unwrap_or(0.0))
}

/// Messages per second through `relays` relays with a no-op publisher (the store's side
/// alone), from a full outbox of `messages`.
async fn no_op_throughput(db: &impl Outbox, messages: usize, relays: usize) -> f64 {
    db.reset().await;
    db.fill(messages).await;
    relay_bench::relay_throughput(messages, relays, || db.store(), None).await
}

/// Commit-to-delivery latencies of `samples` single-message commits.
async fn latency(
    db: &impl Outbox,
    bootstrap: &str,
    relays: usize,
    samples: usize,
) -> Option<Summary> {
    db.reset().await;
    let (fleet, _) = Fleet::start(db, bootstrap, relays).await;
    // Every commit on one connection.
    let mut writer = db.writer().await;
    let commits = relay_bench::spaced_commits(samples, async |n| {
        let message = NewMessage::new(TOPIC, serde_json::json!({ "n": n }))
            .aggregate("bench", format!("a{}", n % AGGREGATES));
        db.commit_one(&mut writer, &message).await
    })
    .await;
    db.until_drained().await;
    let delivered = fleet.stop().await;
    relay_bench::commit_to_publish(&commits, |id| delivered.get(&id).copied())
}

/// The bare producer: `messages` records of the outbox's shape (payload `{"n": n}`, key the
/// aggregate), sent as fast as librdkafka takes them, every delivery awaited.
async fn producer_throughput(bootstrap: &str, messages: usize) -> Result<f64, String> {
    let producer = kafka_bench::bare_producer(settings(bootstrap), RAW_TOPIC).await?;
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(messages);
    for n in 0..messages {
        let payload =
            serde_json::to_vec(&serde_json::json!({ "n": n })).map_err(|e| e.to_string())?;
        let key = format!("a{}", n % AGGREGATES);
        let record = FutureRecord::<str, [u8]>::to(RAW_TOPIC)
            .key(key.as_str())
            .payload(payload.as_slice());
        kafka_bench::send(&producer, record, &mut pending).await?;
    }
    for delivery in pending {
        kafka_bench::check(delivery.await)?;
    }
    Ok(stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0))
}

/// The figures of one relay count.
struct Column {
    relay: Option<f64>,
    no_op: Option<f64>,
    bare: Option<f64>,
    latency: Option<Summary>,
    /// Cores each group of threads used while the relays sent to the cluster.
    cpu: String,
    /// And while the bare loops ran.
    bare_cpu: String,
    /// Every round of the relay (0), the no-op relay (1) and the bare loop (2).
    rounds: Rounds<3>,
}

/// Runs every stage against `db` (`store` names it, `wake` its waker, in the table and
/// the figures) at `sizes`, and prints one table; the headline figures also go to
/// `bench_all` ([`figures`]).
pub async fn run(db: &impl Outbox, store: &str, wake: &str, sizes: Sizes) {
    let Sizes {
        messages,
        samples,
        rounds,
    } = sizes;
    let cluster = MockCluster::new(3).unwrap_or_else(|e| fail("the mock cluster", e));
    for topic in [TOPIC, RAW_TOPIC] {
        cluster
            .create_topic(topic, 6, 1)
            .unwrap_or_else(|e| fail("a mock topic", e));
    }
    let bootstrap = cluster.bootstrap_servers();
    println!(
        "{store} outbox -> relay -> mock cluster (3 brokers), {}, {messages} messages over \
         {AGGREGATES} aggregates, batch {BATCH}, {wake}",
        if cfg!(debug_assertions) {
            "debug build"
        } else {
            "release build"
        },
    );
    let mut columns = Vec::new();
    for relays in [1, 4] {
        let bootstrap = &bootstrap;
        let split = RefCell::new(cpu::Split::default());
        let bare_split = RefCell::new(cpu::Split::default());
        let throughputs = relay_bench::alternate(rounds, async |i| match i {
            0 => {
                let stage = format!("{relays} relay(s) -> cluster");
                let run = relay_throughput(db, bootstrap, messages, relays, &split);
                relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await
            }
            1 => {
                let stage = format!("{relays} relay(s), no-op publisher");
                let run = async { Ok(no_op_throughput(db, messages, relays).await) };
                relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await
            }
            _ => db.bare_throughput(messages, relays, &bare_split).await,
        })
        .await;
        let stage = format!("commit to delivery, {relays} relay(s)");
        let run = async { Ok(latency(db, bootstrap, relays, samples).await) };
        let latency = relay_bench::bounded((Stage::Relay, &stage), run, async || {})
            .await
            .flatten();
        columns.push(Column {
            relay: throughputs.median(0),
            no_op: throughputs.median(1),
            bare: throughputs.median(2),
            latency,
            cpu: split.into_inner().cell(),
            bare_cpu: bare_split.into_inner().cell(),
            rounds: throughputs,
        });
    }
    let run = producer_throughput(&bootstrap, messages);
    let producer = relay_bench::bounded((Stage::Baseline, "bare producer"), run, async || {}).await;
    print_table(&columns, producer, wake);
    record_figures(&columns, store, wake);
}

fn print_table(columns: &[Column], producer: Option<f64>, wake: &str) {
    let row = |name: &str, cell: &dyn Fn(&Column) -> String| {
        let cells: Vec<String> = columns.iter().map(cell).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    let n = columns.first().map_or(1, |c| c.rounds.0[0].len());
    if n > 1 {
        println!("throughputs: medians of {n} rounds, alternating");
    }
    println!("| figure | 1 relay | 4 relays |");
    println!("|---|---|---|");
    row("outbox -> relay -> cluster", &|c| {
        relay_bench::rate_cell(c.relay)
    });
    row("relay, no-op publisher (no broker)", &|c| {
        relay_bench::rate_cell(c.no_op)
    });
    row("bare claim-and-ack loop in SQL", &|c| {
        relay_bench::rate_cell(c.bare)
    });
    println!(
        "| bare producer (one) | {} | |",
        relay_bench::rate_cell(producer)
    );
    row("relay / bare loop", &|c| {
        relay_bench::ratio_cell(c.relay, c.bare)
    });
    if n > 1 {
        row("relay / bare loop, each round", &|c| c.rounds.ratios(0, 2));
    }
    row("no-op relay / bare loop (client side)", &|c| {
        relay_bench::ratio_cell(c.no_op, c.bare)
    });
    if n > 1 {
        row("no-op relay / bare loop, each round", &|c| {
            c.rounds.ratios(1, 2)
        });
    }
    row("relay / no-op relay (broker path)", &|c| {
        relay_bench::ratio_cell(c.relay, c.no_op)
    });
    row("relay / bare producer", &|c| {
        relay_bench::ratio_cell(c.relay, producer)
    });
    row(&format!("commit to delivery, {wake}"), &|c| {
        relay_bench::latency_cell(c.latency, "error")
    });
    row(
        "cores used while the relays sent (in brackets: waiting to run)",
        &|c| c.cpu.clone(),
    );
    row("cores used while the bare loops ran", &|c| {
        c.bare_cpu.clone()
    });
}

/// The headline figures for `bench_all`: each relay count against the bare loop, and the
/// commit-to-delivery p99 against its goal.
fn record_figures(columns: &[Column], store: &str, wake: &str) {
    for (relays, c) in [1, 4].iter().zip(columns) {
        figures::record(
            &format!("{store} e2e: {relays} relay(s) -> cluster"),
            &relay_bench::rate_cell(c.relay),
            &format!("{} (bare SQL loop)", relay_bench::rate_cell(c.bare)),
            stats::ratio_of(c.relay, c.bare),
        );
        let (value, ratio) = match &c.latency {
            Some(s) => (
                format!("p99 {:.2} ms (p50 {:.2} ms)", s.p99, s.p50),
                stats::ratio(s.p99, LATENCY_GOAL_MS),
            ),
            None => ("error".to_owned(), None),
        };
        figures::record(
            &format!("{store} e2e: commit to delivery, {wake}, {relays} relay(s)"),
            &value,
            &format!("goal {LATENCY_GOAL_MS} ms"),
            ratio,
        );
    }
}
