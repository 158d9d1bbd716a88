//! The PostgreSQL benchmark of the claim outbox (feature `postgres`): relay throughput with
//! 1 and 4 relays and a no-op publisher next to a bare claim-and-ack loop in SQL measured in
//! the same run, claims behind a deep backlog on 10 aggregates (10 × the message count)
//! next to the one claim statement over every open message, and commit-to-publish latency
//! with the NOTIFY wake and with polling at the relay's default interval. Nothing is
//! asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features postgres --example bench_postgres            # private server
//! cargo run --release --features postgres --example bench_postgres -- 20000   # messages per run
//! cargo run --release --features postgres --example bench_postgres -- --rounds 5  # medians of 5 (default 3)
//! ```
//!
//! It starts a private PostgreSQL (tests/common_postgres/server.rs; postgresql must be
//! installed), or uses `CHANGEFEED_TEST_POSTGRES`, and works in its own database
//! `cf_bench_<pid>`.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/figures.rs"]
mod figures;
#[path = "support/postgres_bench.rs"]
#[allow(dead_code)]
mod postgres_bench;
#[path = "support/relay_bench.rs"]
#[allow(dead_code)]
mod relay_bench;
#[path = "../tests/common_postgres/server.rs"]
mod server;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;
#[path = "support/store_bench.rs"]
mod store_bench;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use changefeed::postgres::{PostgresOutboxStore, PostgresWaker, PostgresWakerConfig, WakerState};
use changefeed::relay::RelayConfig;
use postgres_bench::BenchDb;
use relay_bench::{AGGREGATES, BATCH, Stage, fail};
use stats::Summary;
use store_bench::{DEEP_AGGREGATES, DEEP_CLAIMS};

/// The polling relay's interval in the latency comparison: the relay's default.
const POLL: Duration = RelayConfig::DEFAULT_POLL_INTERVAL;

/// Messages per second through `relays` relays with a no-op publisher (what the machine's
/// threads spent meanwhile added to `split`); `None` when the stage failed or stalled.
async fn relay_throughput(
    db: &BenchDb,
    messages: usize,
    relays: usize,
    split: &RefCell<cpu::Split>,
) -> Option<f64> {
    db.reset().await;
    db.fill(messages).await;
    let stage = format!("{relays} relay(s), no-op publisher");
    let store = || PostgresOutboxStore::new(db.table.clone(), db.config.clone());
    let run = relay_bench::relay_throughput(messages, relays, store, Some(split));
    relay_bench::bounded((Stage::Relay, &stage), async { Ok(run.await) }, async || {}).await
}

/// Messages per second through one loop of the store's own calls (`claim_batch`, then
/// `mark_done` of the batch) with no relay around them: it splits the relay's distance from
/// the bare loop into the store's round trips and decoding, and the relay's own work.
async fn store_throughput(db: &BenchDb, messages: usize) -> f64 {
    db.reset().await;
    db.fill(messages).await;
    let mut store = PostgresOutboxStore::new(db.table.clone(), db.config.clone());
    let started = Instant::now();
    let mut done = 0usize;
    while done < messages {
        done += store_bench::claim_and_done(&mut store)
            .await
            .unwrap_or_else(|e| fail("claim and mark_done", e));
    }
    stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0)
}

/// Claims behind a backlog of `backlog` messages on [`DEEP_AGGREGATES`] aggregates (see
/// [`store_bench::deep_claims`]) through the store and through the claim over every open
/// message (the store's statement before it stopped at a reach), each on a fresh backlog.
async fn deep_backlog(db: &BenchDb, backlog: usize) -> Result<[(f64, usize); 2], String> {
    db.reset().await;
    db.fill_on_server(backlog, DEEP_AGGREGATES).await;
    let mut store = PostgresOutboxStore::new(db.table.clone(), db.config.clone());
    let through_store = store_bench::deep_claims(&mut store).await?;
    db.reset().await;
    db.fill_on_server(backlog, DEEP_AGGREGATES).await;
    let (times, claimed) = postgres_bench::client_claims(db, DEEP_CLAIMS).await?;
    Ok([through_store, (store_bench::median(&times), claimed)])
}

/// Commit-to-publish latencies of single-message commits, woken by NOTIFY (relay poll 60 s)
/// or by polling every [`POLL`] (no waker).
async fn latency(db: &BenchDb, notify: bool) -> Option<Summary> {
    let (config, table) = (&db.config, &db.table);
    db.reset().await;
    let waker = notify.then_some(|handle, stop| {
        let settings = PostgresWakerConfig::default();
        let waker = PostgresWaker::new(config.clone(), table.clone(), handle, settings);
        let state = waker.state();
        let listening = |s: &WakerState| matches!(s, WakerState::Listening { .. });
        store_bench::spawn_waker(state, listening, waker.run(store_bench::stopped(stop)))
    });
    // Every commit on one connection, apart from the relay's.
    let mut writer = postgres_bench::client(config).await;
    let commit = async |message| db.commit_one(&mut writer, &message).await;
    let store = PostgresOutboxStore::new(table.clone(), config.clone());
    store_bench::latency(store, POLL, waker, commit).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes = relay_bench::sizes_arg();
    let messages = sizes.messages;
    let server = server::server();
    let db = BenchDb::create(|database| server.url_for(database)).await;
    let version = &db.version;

    println!(
        "claim outbox on PostgreSQL {version}, {messages} messages over {AGGREGATES} \
         aggregates, batch {BATCH}"
    );
    println!("| figure | value |");
    println!("|---|---|");
    for relays in [1, 4] {
        let (relay_split, bare_split) = (RefCell::default(), RefCell::default());
        let rounds = relay_bench::alternate(sizes.rounds, async |stage| match stage {
            0 => relay_throughput(&db, messages, relays, &relay_split).await,
            _ => {
                db.bare_throughput(messages, relays, Some(&bare_split))
                    .await
            }
        })
        .await;
        store_bench::print_relay_and_bare("PostgreSQL", relays, &rounds);
        // One server process a relay or loop: its cores beside the rate say what the server
        // spent a message, and whether it idled while the relay's client took its turn.
        println!(
            "| cores used, {relays} relay(s) (waiting to run) | {} |",
            relay_split.into_inner().cell()
        );
        println!(
            "| cores used, {relays} bare loop(s) | {} |",
            bare_split.into_inner().cell()
        );
        if relays == 1 {
            let bare = rounds.median(1);
            let run = async { Ok(store_throughput(&db, messages).await) };
            let store = relay_bench::bounded(
                (Stage::Relay, "1 loop of the store's calls"),
                run,
                async || {},
            )
            .await;
            let (rate, ratio) = (
                relay_bench::rate_cell(store),
                relay_bench::ratio_cell(store, bare),
            );
            println!("| 1 loop of the store's calls, no relay | {rate} |");
            println!("| ratio store loop / bare, 1 | {ratio} |");
            let run = postgres_bench::client_loop_throughput(&db, messages);
            let stage = "1 loop of the bare statements from the client";
            let client = relay_bench::bounded((Stage::Baseline, stage), run, async || {}).await;
            let (rate, ratio) = (
                relay_bench::rate_cell(client),
                relay_bench::ratio_cell(client, bare),
            );
            println!("| {stage} (ids only) | {rate} |");
            println!("| ratio client loop / bare, 1 (the round trips) | {ratio} |");
            println!(
                "| ratio store loop / client loop, 1 (the store's decoding) | {} |",
                relay_bench::ratio_cell(store, client)
            );
        }
    }
    let backlog = messages * 10;
    let stage = format!("claims over {backlog} messages on {DEEP_AGGREGATES} aggregates");
    let run = deep_backlog(&db, backlog);
    let rates = relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await;
    let baseline = "one statement over every open message";
    store_bench::print_deep_backlog("PostgreSQL", &stage, baseline, rates);
    let polling = format!("polling every {} ms (default)", POLL.as_millis());
    for (name, notify) in [("NOTIFY wake", true), (polling.as_str(), false)] {
        let stage = format!("commit to publish, {name}");
        let run = async { Ok(latency(&db, notify).await) };
        let summary = relay_bench::bounded((Stage::Relay, &stage), run, async || {}).await;
        store_bench::print_latency("PostgreSQL", &stage, summary);
    }
    db.drop_database().await;
    relay_bench::finish();
}
