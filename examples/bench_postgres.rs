//! The PostgreSQL benchmark of the claim outbox (feature `postgres`): relay throughput with
//! 1 and 4 relays and a no-op publisher next to a bare claim-and-ack loop in SQL measured in
//! the same run, and commit-to-publish latency with the NOTIFY wake and with polling at the
//! relay's default interval. Nothing is asserted; it prints one table.
//!
//! ```sh
//! cargo run --release --features postgres --example bench_postgres            # private server
//! cargo run --release --features postgres --example bench_postgres -- 20000   # messages per run
//! ```
//!
//! It starts a private PostgreSQL (tests/common_postgres/server.rs; postgresql must be
//! installed), or uses `CHANGEFEED_TEST_POSTGRES`, and works in its own database
//! `cf_bench_<pid>`.

#[path = "../tests/common_server/mod.rs"]
mod common_server;
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

use std::time::{Duration, Instant};

use changefeed::outbox::NewMessage;
use changefeed::postgres::{
    OutboxTable, PostgresOutboxStore, PostgresWaker, PostgresWakerConfig, WakerState, connect,
    enqueue, migrate, setup_outbox,
};
use changefeed::relay::RelayConfig;
use relay_bench::{AGGREGATES, BATCH, Stage, fail};
use stats::Summary;
use tokio_postgres::{Client, Config};

/// The outbox, in the database of the run.
const TABLE: &str = "public.bench_outbox";
/// The polling relay's interval in the latency comparison: the relay's default.
const POLL: Duration = RelayConfig::DEFAULT_POLL_INTERVAL;

async fn client(config: &Config) -> Client {
    connect(config).await.unwrap_or_else(|e| fail("connect", e))
}

async fn fill(config: &Config, table: &OutboxTable, messages: usize) {
    let mut client = client(config).await;
    for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
        let tx = client
            .transaction()
            .await
            .unwrap_or_else(|e| fail("begin", e));
        for n in chunk {
            let message = NewMessage::new("bench", serde_json::json!({ "n": n }))
                .aggregate("bench", format!("a{}", n % AGGREGATES));
            enqueue(&tx, table, &message)
                .await
                .unwrap_or_else(|e| fail("enqueue", e));
        }
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
    }
}

/// Runs `sql` (statements named `what` in a failure) on a connection of its own.
async fn execute(config: &Config, sql: &str, what: &str) {
    client(config)
        .await
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| fail(what, changefeed::Error::from(e)));
}

/// Empties the outbox and refreshes its statistics, so every run starts alike.
async fn reset(config: &Config, table: &OutboxTable) {
    let sql = format!("truncate table {table}; analyze {table}");
    execute(config, &sql, "truncate").await;
}

/// An outbox of `messages` pending messages and no other row, with fresh statistics (as
/// autovacuum would give a long-lived outbox).
async fn refill(config: &Config, table: &OutboxTable, messages: usize) {
    reset(config, table).await;
    fill(config, table, messages).await;
    execute(config, &format!("analyze {table}"), "analyze").await;
}

/// Messages per second through `relays` relays with a no-op publisher; `None` when the
/// stage failed or stalled.
async fn relay_throughput(
    config: &Config,
    table: &OutboxTable,
    messages: usize,
    relays: usize,
) -> Option<f64> {
    refill(config, table, messages).await;
    let stage = format!("{relays} relay(s), no-op publisher");
    let run = relay_bench::relay_throughput(messages, relays, || {
        PostgresOutboxStore::new(table.clone(), config.clone())
    });
    relay_bench::bounded((Stage::Relay, &stage), async { Ok(run.await) }, async || {}).await
}

/// Messages per second through one loop of the store's own calls (`claim_batch`, then
/// `mark_done` of the batch) with no relay around them: it splits the relay's distance from
/// the bare loop into the store's round trips and decoding, and the relay's own work.
async fn store_throughput(config: &Config, table: &OutboxTable, messages: usize) -> f64 {
    use changefeed::outbox::ClaimStore;
    refill(config, table, messages).await;
    let mut store = PostgresOutboxStore::new(table.clone(), config.clone());
    let started = Instant::now();
    let mut done = 0usize;
    while done < messages {
        let batch = store
            .claim_batch(BATCH, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| fail("claim", e));
        if batch.is_empty() {
            continue;
        }
        let ids: Vec<i64> = batch.iter().map(changefeed::outbox::Claimed::id).collect();
        let token = batch[0].claim_token();
        done += usize::try_from(
            store
                .mark_done(&ids, token)
                .await
                .unwrap_or_else(|e| fail("mark_done", e)),
        )
        .unwrap_or(0);
    }
    stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0)
}

/// The same claim (the store's statement, batch 100) and acknowledgement by id and token,
/// in a procedure: no client, no relay, no round trips, each step its own transaction as
/// the relay's are. When another loop holds the last heads it sleeps 5 ms, the relays'
/// poll interval here. Its rate is the ceiling the relay is compared with.
const BARE_LOOP: &str = "create procedure bench_bare_loop() language plpgsql as $$
declare
    claimed bigint[];
    token uuid;
begin
    loop
        token := gen_random_uuid();
        with due as (
            select t.id from public.bench_outbox as t
            where t.status in (0, 1, 3)
                and (t.status = 0
                    or (t.status = 3 and t.next_retry_at <= now())
                    or (t.status = 1 and t.claim_expires_at < now()))
                and not exists (select 1 from public.bench_outbox as e
                    where e.aggregate_id = t.aggregate_id and e.status in (0, 1, 3)
                        and e.id < t.id)
            order by t.id limit 100
            for update skip locked),
        taken as (
            update public.bench_outbox as t
            set attempts = t.attempts + (t.status = 1)::int, status = 1, claimed_at = now(),
                claim_expires_at = now() + interval '1 minute', claim_token = token
            from due where t.id = due.id
            returning t.id)
        select array_agg(id) into claimed from taken;
        commit;
        if claimed is null then
            -- Another loop may hold the last heads; stop only when nothing is open.
            exit when not exists (
                select 1 from public.bench_outbox where status in (0, 1, 3));
            perform pg_sleep(0.005);
        else
            update public.bench_outbox
            set status = 2, processed_at = now(), last_error = null
            where id = any(claimed) and status = 1 and claim_token = token;
            commit;
        end if;
    end loop;
end $$";

/// Messages per second through `loops` concurrent bare loops; `None` when a loop failed or
/// the stage stalled, and then no loop is left running on the server.
async fn bare_throughput(
    config: &Config,
    table: &OutboxTable,
    messages: usize,
    loops: usize,
) -> Option<f64> {
    refill(config, table, messages).await;
    let stage = format!("{loops} bare SQL loop(s)");
    let run = async {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..loops {
            let config = config.clone();
            // Two simple queries: in one, the procedure would run inside the implicit
            // transaction of a multi-statement query and could not commit (2D000).
            tasks.spawn(async move {
                let client = client(&config).await;
                for sql in ["set statement_timeout = 0", "call bench_bare_loop()"] {
                    client
                        .batch_execute(sql)
                        .await
                        .map_err(|e| format!("bare loop: {}", changefeed::Error::from(e)))?;
                }
                Ok::<(), String>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| e.to_string())??;
        }
        Ok(stats::throughput(messages as u64, started.elapsed()).unwrap_or(0.0))
    };
    // A stalled loop runs on in its server process until it is told to stop.
    let stop = async || {
        let _ = client(config)
            .await
            .batch_execute(
                "select pg_terminate_backend(pid) from pg_stat_activity \
                 where datname = current_database() and pid <> pg_backend_pid() \
                 and query = 'call bench_bare_loop()'",
            )
            .await;
    };
    relay_bench::bounded((Stage::Baseline, &stage), run, stop).await
}

/// Commit-to-publish latencies of single-message commits, woken by NOTIFY (relay poll 60 s)
/// or by polling every [`POLL`] (no waker).
async fn latency(config: &Config, table: &OutboxTable, notify: bool) -> Option<Summary> {
    reset(config, table).await;
    let waker = notify.then_some(|handle, stop| {
        let settings = PostgresWakerConfig::default();
        let waker = PostgresWaker::new(config.clone(), table.clone(), handle, settings);
        let state = waker.state();
        let listening = |s: &WakerState| matches!(s, WakerState::Listening { .. });
        store_bench::spawn_waker(state, listening, waker.run(store_bench::stopped(stop)))
    });
    // Every commit on one connection, apart from the relay's.
    let mut writer = client(config).await;
    let commit = async |message| {
        let tx = writer
            .transaction()
            .await
            .unwrap_or_else(|e| fail("begin", e));
        let e = enqueue(&tx, table, &message)
            .await
            .unwrap_or_else(|e| fail("enqueue", e));
        tx.commit().await.unwrap_or_else(|e| fail("commit", e));
        e.id
    };
    let store = PostgresOutboxStore::new(table.clone(), config.clone());
    store_bench::latency(store, POLL, waker, commit).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let messages = relay_bench::message_count_arg();
    let server = server::server();
    let database = format!("cf_bench_{}", std::process::id());
    let admin_config = changefeed::postgres::config(&server.url_for("postgres"))
        .unwrap_or_else(|e| fail("url", e));
    let admin = client(&admin_config).await;
    admin
        .batch_execute(&format!("create database {database}"))
        .await
        .unwrap_or_else(|e| fail("create database", changefeed::Error::from(e)));
    let config =
        changefeed::postgres::config(&server.url_for(&database)).unwrap_or_else(|e| fail("url", e));
    let mut setup = client(&config).await;
    migrate(&mut setup)
        .await
        .unwrap_or_else(|e| fail("migrate", e));
    let table: OutboxTable = TABLE.parse().unwrap_or_else(|e| fail("name", e));
    setup_outbox(&setup, &table)
        .await
        .unwrap_or_else(|e| fail("setup_outbox", e));
    setup
        .batch_execute(BARE_LOOP)
        .await
        .unwrap_or_else(|e| fail("bare loop procedure", changefeed::Error::from(e)));
    let version = changefeed::postgres::server_version(&setup)
        .await
        .unwrap_or_default();
    drop(setup);

    println!(
        "claim outbox on PostgreSQL {version}, {messages} messages over {AGGREGATES} \
         aggregates, batch {BATCH}"
    );
    println!("| figure | value |");
    println!("|---|---|");
    for relays in [1, 4] {
        let relay = relay_throughput(&config, &table, messages, relays).await;
        let bare = bare_throughput(&config, &table, messages, relays).await;
        store_bench::print_relay_and_bare(relays, relay, bare);
        if relays == 1 {
            let run = async { Ok(store_throughput(&config, &table, messages).await) };
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
        }
    }
    let polling = format!("polling every {} ms (default)", POLL.as_millis());
    for (name, notify) in [("NOTIFY wake", true), (polling.as_str(), false)] {
        let stage = format!("commit to publish, {name}");
        let run = async { Ok(latency(&config, &table, notify).await) };
        let cell = relay_bench::bounded((Stage::Relay, &stage), run, async || {})
            .await
            .map_or_else(
                || "error".to_owned(),
                |summary| relay_bench::latency_cell(summary, "nothing published"),
            );
        println!("| {stage} | {cell} |");
    }
    let _ = admin
        .batch_execute(&format!("drop database {database} with (force)"))
        .await;
    relay_bench::finish();
}
