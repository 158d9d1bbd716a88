//! End to end on a real database (features `mysql` and `kafka`): MariaDB outbox → relay
//! (`MysqlOutboxStore`, `KafkaPublisher`, woken by `BinlogWaker`) → librdkafka's mock
//! cluster, with 1 and 4 relays, next to its two ceilings measured in the same run:
//!
//! * the bare claim-and-ack loop in SQL (bench_mysql's stored procedure: no client, no
//!   relay, no broker), the most the database does;
//! * the bare producer sending the same number of records to the same cluster, every
//!   delivery awaited, the most the broker side does.
//!
//! Throughput drains a full outbox (`messages` over 1000 aggregates, batch 100). Latency is
//! commit to delivery: single-message transactions committed 15 ms (plus jitter) apart, and
//! the moment the publish that carried the message returned, all its delivery reports in.
//! Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka            # 20000
//! cargo run --release --features mysql,kafka --example bench_mysql_kafka -- 50000
//! cargo run --features mysql,kafka --example bench_mysql_kafka -- --quick   # CI: ~10 s
//! ```
//!
//! It starts a private `mariadbd` (tests/common_mysql/server.rs; mariadb-server must be
//! installed), or uses `CHANGEFEED_TEST_MYSQL`, and works in its own database.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
#[path = "support/kafka_bench.rs"]
mod kafka_bench;
#[path = "support/mysql_bench.rs"]
mod mysql_bench;
#[path = "support/relay_bench.rs"]
#[allow(dead_code)]
mod relay_bench;
#[path = "../tests/common_mysql/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed::kafka::rdkafka::mocking::MockCluster;
use changefeed::kafka::rdkafka::producer::FutureRecord;
use changefeed::kafka::{KafkaPublisher, KafkaPublisherConfig, ProducerSettings};
use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, WakerState};
use changefeed::outbox::{ClaimedMessage, NewMessage};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig};
use mysql_bench::BenchDb;
use relay_bench::{AGGREGATES, BATCH, Stage, fail};
use stats::Summary;
use tokio::sync::watch;

/// The topic every message goes to (the outbox rows name it).
const TOPIC: &str = "bench";
/// The bare producer's topic.
const RAW_TOPIC: &str = "bench-raw";

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

/// `relays` relays, each with its own store, producer and binlog waker, as separate relay
/// processes would have.
struct Fleet {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    delivered: Arc<Mutex<HashMap<i64, Instant>>>,
}

impl Fleet {
    async fn start(db: &BenchDb, bootstrap: &str, relays: usize) -> Fleet {
        let (stop, stopped) = watch::channel(false);
        let delivered = Arc::new(Mutex::new(HashMap::new()));
        let mut tasks = Vec::new();
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
            // The relay's defaults but the batch (bench_mysql's), and a poll interval long
            // enough that only the binlog wakes it.
            let config = RelayConfig::default()
                .batch_size(BATCH)
                .poll_interval(Duration::from_secs(60));
            let store = MysqlOutboxStore::new(db.table.clone(), db.opts.clone());
            let relay = Relay::new(store, publisher, config).unwrap_or_else(|e| fail("relay", e));
            let waker = BinlogWaker::new(
                db.opts.clone(),
                db.table.clone(),
                relay.handle(),
                BinlogWakerConfig::default(),
            );
            let mut state = waker.state();
            let mut waker_stopped = stopped.clone();
            let waker_task = tokio::spawn(waker.run(async move {
                let _ = waker_stopped.wait_for(|s| *s).await;
            }));
            let _ = state
                .wait_for(|s| matches!(s, WakerState::Following { .. }))
                .await;
            let mut relay_stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                let _ = relay
                    .run(async move {
                        let _ = relay_stopped.wait_for(|s| *s).await;
                    })
                    .await;
                let _ = waker_task.await;
            }));
        }
        Fleet {
            stop,
            tasks,
            delivered,
        }
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
/// cluster.
async fn relay_throughput(
    db: &BenchDb,
    bootstrap: &str,
    messages: usize,
    relays: usize,
) -> Result<f64, String> {
    db.reset().await;
    db.fill(messages).await;
    // The relays start claiming at once: the clock includes their first claims.
    let started = Instant::now();
    let fleet = Fleet::start(db, bootstrap, relays).await;
    mysql_bench::until_drained(db).await;
    let elapsed = started.elapsed();
    let delivered = fleet.stop().await;
    if delivered.len() != messages {
        return Err(format!("{} of {messages} delivered", delivered.len()));
    }
    Ok(messages as f64 / elapsed.as_secs_f64())
}

/// Commit-to-delivery latencies of `samples` single-message commits.
async fn latency(db: &BenchDb, bootstrap: &str, relays: usize, samples: usize) -> Option<Summary> {
    db.reset().await;
    let fleet = Fleet::start(db, bootstrap, relays).await;
    // Every commit on one connection.
    let mut conn = db
        .pool
        .get_conn()
        .await
        .unwrap_or_else(|e| fail("connect", e));
    let commits = relay_bench::spaced_commits(samples, async |n| {
        let message = NewMessage::new(TOPIC, serde_json::json!({ "n": n }))
            .aggregate("bench", format!("a{}", n % AGGREGATES));
        db.commit_one(&mut conn, &message).await
    })
    .await;
    mysql_bench::until_drained(db).await;
    let delivered = fleet.stop().await;
    relay_bench::commit_to_publish(&commits, |id| delivered.get(&id).copied())
}

/// The bare producer: `messages` records of the outbox's shape (payload `{"n": n}`, key the
/// aggregate), sent as fast as librdkafka takes them, every delivery awaited.
async fn producer_throughput(bootstrap: &str, messages: usize) -> f64 {
    let producer = kafka_bench::bare_producer(settings(bootstrap), RAW_TOPIC)
        .await
        .unwrap_or_else(|e| fail("the bare producer", e));
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(messages);
    for n in 0..messages {
        let payload = serde_json::to_vec(&serde_json::json!({ "n": n }))
            .unwrap_or_else(|e| fail("payload", e));
        let key = format!("a{}", n % AGGREGATES);
        let record = FutureRecord::<str, [u8]>::to(RAW_TOPIC)
            .key(key.as_str())
            .payload(payload.as_slice());
        kafka_bench::send(&producer, record, &mut pending)
            .await
            .unwrap_or_else(|e| fail("send", e));
    }
    for delivery in pending {
        kafka_bench::check(delivery.await).unwrap_or_else(|e| fail("delivery", e));
    }
    messages as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut messages = 20_000;
    let mut samples = 200;
    for arg in std::env::args().skip(1) {
        if arg == "--quick" {
            messages = 2_000;
            samples = 40;
        } else {
            messages = arg
                .parse()
                .unwrap_or_else(|e| fail("the message count (or --quick)", e));
        }
    }
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    let cluster = MockCluster::new(3).unwrap_or_else(|e| fail("the mock cluster", e));
    for topic in [TOPIC, RAW_TOPIC] {
        cluster
            .create_topic(topic, 6, 1)
            .unwrap_or_else(|e| fail("a mock topic", e));
    }
    let bootstrap = cluster.bootstrap_servers();

    println!(
        "MariaDB outbox -> relay -> mock cluster (3 brokers), {} on {}, {messages} messages \
         over {AGGREGATES} aggregates, batch {BATCH}, binlog wake",
        if cfg!(debug_assertions) {
            "debug build"
        } else {
            "release build"
        },
        db.version
    );
    println!("| figure | 1 relay | 4 relays |");
    println!("|---|---|---|");
    let mut relay = Vec::new();
    let mut bare = Vec::new();
    let mut latencies = Vec::new();
    for relays in [1, 4] {
        let stage = format!("{relays} relay(s) -> cluster");
        let run = relay_throughput(&db, &bootstrap, messages, relays);
        relay.push(relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await);
        bare.push(db.bare_throughput(messages, relays).await);
        let stage = format!("commit to delivery, {relays} relay(s)");
        let run = async { Ok(latency(&db, &bootstrap, relays, samples).await) };
        latencies.push(
            relay_bench::bounded((Stage::Relay, &stage), run, async || {})
                .await
                .map_or_else(
                    || "error".to_owned(),
                    |summary| relay_bench::latency_cell(summary, "nothing delivered"),
                ),
        );
    }
    let run = async { Ok(producer_throughput(&bootstrap, messages).await) };
    let producer = relay_bench::bounded((Stage::Baseline, "bare producer"), run, async || {}).await;
    let cells = |figures: &[Option<f64>]| {
        figures
            .iter()
            .map(|f| relay_bench::rate_cell(*f))
            .collect::<Vec<_>>()
    };
    let (relay_cells, bare_cells) = (cells(&relay), cells(&bare));
    println!(
        "| outbox -> relay -> cluster | {} | {} |",
        relay_cells[0], relay_cells[1]
    );
    println!(
        "| bare claim-and-ack loop in SQL | {} | {} |",
        bare_cells[0], bare_cells[1]
    );
    println!(
        "| bare producer (one) | {} | |",
        relay_bench::rate_cell(producer)
    );
    for (name, ceiling) in [
        ("bare loop", bare.as_slice()),
        ("bare producer", &[producer, producer][..]),
    ] {
        println!(
            "| relay / {name} | {} | {} |",
            relay_bench::ratio_cell(relay[0], ceiling[0]),
            relay_bench::ratio_cell(relay[1], ceiling[1])
        );
    }
    println!(
        "| commit to delivery | {} | {} |",
        latencies[0], latencies[1]
    );
    db.drop_database().await;
    relay_bench::finish();
}
