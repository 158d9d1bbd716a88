//! The figures. Each measurement (one parameter set: the changefeed path and its baseline,
//! measured one after the other in the same run) is bounded by `--timeout`; a failure or
//! a timeout becomes the error of its table row, and the run goes on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use changefeed::outbox::{ClaimProgress, ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed};
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::relay::{Hooks, PublishOutcome, Publisher, Relay, RelayConfig};
use changefeed::{Client, Cursor, Feed, Result, TableName};
use tokio::sync::{Barrier, watch};
use tokio::task::JoinSet;

use crate::args::Options;
use crate::load::{
    Failure, Outcome, PlainRead, Pool, Timed, Tx, Waiting, WriteSpec, Written, absorb_transient,
    consume_loop, exec, finish, integer, parallel, plain_read_loop, preload_events, read_feed_loop,
    rows, scalar, span, timed, write_loop,
};
use crate::report::Row;
use crate::sql::{self, SCHEMA};
use crate::stats::{Summary, delays_ms, mean, throughput};

/// Writer counts of figures 1 and 5.
const WRITERS: [usize; 3] = [1, 4, 16];
/// Writer counts of figure 4.
const LATENCY_WRITERS: [usize; 2] = [4, 16];
/// Page sizes of figures 2 and 3.
const PAGE_SIZES: [u32; 3] = [100, 1000, 5000];
/// Relay counts of figure 6.
const RELAYS: [usize; 3] = [1, 2, 4];
/// Figure 6's claim size (RelayConfig's default).
const CLAIM_BATCH: u32 = 100;
/// Figure 6's idle wait, for the relays and the raw loops alike.
const CLAIM_POLL: Duration = Duration::from_millis(20);
/// Figure 4: the long-poll's `@wait_ms` and the polling consumer's sleep.
const LONG_POLL_WAIT_MS: u32 = 1000;
const POLL_SLEEP: Duration = Duration::from_millis(50);

const BASELINE_1: &str = "the same transaction without the outbox insert";
const BASELINE_2: &str = "hand-rolled drain of a plain outbox table: delete top(n) ... output into \
                          a table variable, insert into a log table, commit, return the rows";
const BASELINE_3: &str = "plain paging: select top(n) ulid, id from the feed table where shard_id = \
                          @s and ulid > @c order by ulid";
const BASELINE_4: &str = "client polling: read_feed with @wait_ms = 0, then a 50 ms sleep after a \
                          page that is not full; value = long-poll with @wait_ms = 1000";
const BASELINE_5: &str = "the same insert into an identical plain table, ULID made on the client, \
                          without lock_feed";
const BASELINE_5_ROWS: &str = "the same transaction with each ULID computed in the batch from \
                               lock_feed's @ulid_high/@ulid_low instead of ulid(@i)";
const BASELINE_6: &str = "as many raw claim + mark_done loops over OutboxStore, without Relay";

/// Everything the figures share.
pub struct Bench {
    /// The run's options.
    pub options: Options,
    /// The benchmark database's ADO string (for `SqlClaimStore`, which connects itself).
    pub ado: String,
    /// Connections to the benchmark database.
    pub pool: Pool,
    /// The next event id.
    pub ids: Arc<AtomicI64>,
}

impl Bench {
    async fn client(&mut self) -> Outcome<Client> {
        self.pool
            .take(1)
            .await?
            .pop()
            .ok_or_else(|| Failure::from("no connection"))
    }

    /// Runs a batch on a pooled connection, giving it back only if the batch succeeded.
    async fn admin(&mut self, sql: &str) -> Outcome<()> {
        let mut client = self.client().await?;
        exec(&mut client, sql).await?;
        self.pool.give([client]);
        Ok(())
    }
}

/// Runs every selected figure, appending their rows to `out`.
pub async fn run_all(bench: &mut Bench, out: &mut Vec<Row>) {
    let options = bench.options.clone();
    let mut shard_counts: Vec<i32> = options.shard_counts(2);
    for shards in options.shard_counts(3) {
        if !shard_counts.contains(&shards) {
            shard_counts.push(shards);
        }
    }
    shard_counts.sort_unstable();

    // Figures 1-3 at one shard, 4-6, then the scaling runs (figure 7).
    for shards in options.shard_counts(1).into_iter().filter(|s| *s == 1) {
        figure_1(bench, out, shards).await;
    }
    for shards in shard_counts.iter().copied().filter(|s| *s == 1) {
        figures_2_3(bench, out, shards).await;
    }
    if options.wants(4) {
        figure_4(bench, out).await;
    }
    if options.wants(5) {
        figure_5(bench, out).await;
    }
    if options.wants(6) {
        figure_6(bench, out).await;
    }
    for shards in options.shard_counts(1).into_iter().filter(|s| *s > 1) {
        figure_1(bench, out, shards).await;
    }
    for shards in shard_counts.iter().copied().filter(|s| *s > 1) {
        figures_2_3(bench, out, shards).await;
    }
}

/// The figure's label: "n" at one shard, "7.n" in the scaling runs.
fn label(figure: u8, shards: i32) -> String {
    if shards == 1 {
        figure.to_string()
    } else {
        format!("7.{figure}")
    }
}

/// Runs an untimed setup step within `limit` as a measurement of its own (its failure is a
/// row naming it): whether it succeeded.
async fn prepared(
    out: &mut Vec<Row>,
    limit: Duration,
    head: (&str, &str, &[(&str, String)]),
    work: impl Future<Output = Outcome<()>>,
) -> bool {
    let mut ready = false;
    measure(out, limit, head, async {
        work.await?;
        ready = true;
        Ok(Vec::new())
    })
    .await;
    ready
}

/// Runs one measurement within `limit`, and appends its rows, or a failed row for it.
async fn measure(
    out: &mut Vec<Row>,
    limit: Duration,
    head: (&str, &str, &[(&str, String)]),
    work: impl Future<Output = Outcome<Vec<Row>>>,
) {
    let (figure, measurement, parameters) = head;
    let started = Instant::now();
    let outcome = match tokio::time::timeout(limit, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Failure(format!(
            "did not finish within its time limit of {} s (--timeout)",
            limit.as_secs_f64()
        ))),
    };
    let parameter_text = parameters
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    match outcome {
        Ok(rows) => {
            eprintln!(
                "bench: figure {figure} {measurement} {parameter_text}: done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            out.extend(rows);
        }
        Err(error) => {
            eprintln!(
                "bench: figure {figure} {measurement} {parameter_text}: FAILED after {:.1} s: {error}",
                started.elapsed().as_secs_f64()
            );
            out.push(Row::failed(figure, measurement, parameters, &error.0));
        }
    }
}

fn feed(name: &str) -> Outcome<Feed> {
    Ok(Feed::new(SCHEMA, name)?)
}

// ---------------------------------------------------------------------------------------
// Writers (figures 1, 4, 5)

/// What a group of writers did.
struct Phase {
    events: u64,
    transient: u64,
    elapsed: Duration,
    rate: Option<f64>,
    log: Vec<(i64, Instant)>,
}

async fn write_phase(bench: &mut Bench, spec: WriteSpec, writers: usize) -> Outcome<Phase> {
    let spec = Arc::new(spec);
    let ids = Arc::clone(&bench.ids);
    let results: Vec<Timed<Written>> =
        parallel(&mut bench.pool, writers, |index, client, barrier| {
            write_loop(
                index,
                writers,
                client,
                Arc::clone(&spec),
                Arc::clone(&ids),
                barrier,
            )
        })
        .await?;
    let elapsed = span(&results);
    let events = results.iter().map(|r| r.value.commits).sum();
    let transient = results.iter().map(|r| r.value.transient).sum();
    let log = results.into_iter().flat_map(|r| r.value.log).collect();
    Ok(Phase {
        events,
        transient,
        elapsed,
        rate: throughput(events, elapsed),
        log,
    })
}

/// Writers of `tx` on shards 0..`shards`, back to back for the run's duration after its
/// warmup, logging nothing (figures 1 and 5).
fn back_to_back(tx: Tx, shards: i32, options: &Options) -> WriteSpec {
    WriteSpec {
        tx,
        shards,
        warmup: options.warmup(),
        duration: options.duration,
        period: None,
        record: false,
    }
}

/// The row of a write measurement: the rate of `ours` beside `baseline`'s, in events/s,
/// with both phases' counts as its detail.
fn write_row(
    head: (&str, &str, &[(&str, String)]),
    ours: &Phase,
    baseline: &Phase,
    baseline_name: &str,
) -> Row {
    let (figure, what, parameters) = head;
    let (rate, baseline_rate) = (ours.rate, baseline.rate);
    Row::measured(
        figure,
        what,
        parameters,
        rate,
        "events/s",
        baseline_rate,
        baseline_name,
    )
    .with_detail(phases_detail(ours, baseline))
}

fn phases_detail(ours: &Phase, baseline: &Phase) -> String {
    let mut detail = format!(
        "{} / {} events in {:.1} / {:.1} s",
        ours.events,
        baseline.events,
        ours.elapsed.as_secs_f64(),
        baseline.elapsed.as_secs_f64()
    );
    if ours.transient + baseline.transient > 0 {
        detail.push_str(&format!(
            "; transient failures {} / {}",
            ours.transient, baseline.transient
        ));
    }
    detail
}

/// Figure 1 (7.1 at more shards): outbox-mode write cost.
async fn figure_1(bench: &mut Bench, out: &mut Vec<Row>, shards: i32) {
    let figure = label(1, shards);
    let what = "outbox write cost";
    let limit = bench.options.timeout;
    let name = format!("write_s{shards}");
    let plain = format!("write_plain_s{shards}");
    let Ok(feed) = feed(&name) else { return };
    let setup = format!("{} {}", sql::outbox_feed(&name), sql::event_table(&plain));
    if !prepared(
        out,
        limit,
        (
            &figure,
            what,
            &[("shards", shards.to_string()), ("setup", "tables".into())],
        ),
        bench.admin(&setup),
    )
    .await
    {
        return;
    }

    let plain_sql = sql::plain_write(&sql::table(&plain));
    let outbox_sql = sql::outbox_write(&feed);
    for writers in WRITERS {
        let parameters = [
            ("writers", writers.to_string()),
            ("shards", shards.to_string()),
        ];
        let options = bench.options.clone();
        measure(out, limit, (&figure, what, &parameters), async {
            let plain = back_to_back(Tx::Batch(plain_sql.clone()), shards, &options);
            let outbox = back_to_back(Tx::BatchWithShard(outbox_sql.clone()), shards, &options);
            let baseline = write_phase(bench, plain, writers).await?;
            let ours = write_phase(bench, outbox, writers).await?;
            let head = (figure.as_str(), what, &parameters[..]);
            Ok(vec![write_row(head, &ours, &baseline, BASELINE_1)])
        })
        .await;
    }
}

/// Figure 5: serialized-writer throughput on one shard.
async fn figure_5(bench: &mut Bench, out: &mut Vec<Row>) {
    let limit = bench.options.timeout;
    let name = "serialized";
    let plain = "serialized_plain";
    let Ok(feed) = feed(name) else { return };
    let setup = sql::serialized_setup(name, plain);
    if !prepared(
        out,
        limit,
        ("5", "serialized writers", &[("setup", "tables".into())]),
        bench.admin(&setup),
    )
    .await
    {
        return;
    }

    let server_ours = sql::serialized_write(&feed, crate::load::LOCK_TIMEOUT.as_millis());
    let server_plain = sql::serialized_plain_write(&sql::table(plain));
    for (what, client_side) in [
        ("serialized writers, server-side batch", false),
        ("serialized writers, client-side transaction", true),
    ] {
        for writers in WRITERS {
            let parameters = [("writers", writers.to_string()), ("shard", "0".into())];
            let options = bench.options.clone();
            let (ours_tx, plain_tx) = if client_side {
                (
                    Tx::ClientLocked {
                        feed: feed.clone(),
                        insert: sql::serialized_insert(&feed.quoted_table()),
                    },
                    Tx::ClientPlain {
                        insert: sql::serialized_insert(&sql::table(plain)),
                    },
                )
            } else {
                (
                    Tx::Batch(server_ours.clone()),
                    Tx::BatchWithUlid(server_plain.clone()),
                )
            };
            measure(out, limit, ("5", what, &parameters), async {
                let (plain, outbox) = (
                    back_to_back(plain_tx, 1, &options),
                    back_to_back(ours_tx, 1, &options),
                );
                let baseline = write_phase(bench, plain, writers).await?;
                let ours = write_phase(bench, outbox, writers).await?;
                let head = ("5", what, &parameters[..]);
                Ok(vec![write_row(head, &ours, &baseline, BASELINE_5)])
            })
            .await;
        }
    }

    // The per-row cost of ulid(@i) (issue 19, item 15): it reads the shard's state row for
    // every row it numbers, to refuse a range undone by a rollback to a savepoint. The same
    // transaction of many rows with and without the function; the detail gives the
    // difference per row.
    let rows = sql::ROWS_PER_TRANSACTION;
    let what = "serialized writers, ulid(@i) per row";
    let with_function =
        sql::serialized_rows_write(&feed, crate::load::LOCK_TIMEOUT.as_millis(), true);
    let computed = sql::serialized_rows_write(&feed, crate::load::LOCK_TIMEOUT.as_millis(), false);
    let parameters = [
        ("writers", "1".to_owned()),
        ("rows per transaction", rows.to_string()),
    ];
    let options = bench.options.clone();
    let spec = |tx: Tx| back_to_back(tx, 1, &options);
    measure(out, limit, ("5", what, &parameters), async {
        let baseline = write_phase(bench, spec(Tx::Batch(computed.clone())), 1).await?;
        let ours = write_phase(bench, spec(Tx::Batch(with_function.clone())), 1).await?;
        let per_row = |rate: Option<f64>| rate.map(|r| r * rows as f64);
        let cost_us = match (ours.rate, baseline.rate) {
            (Some(a), Some(b)) if a > 0.0 && b > 0.0 => {
                format!("{:.2}", (1.0 / a - 1.0 / b) * 1e6 / rows as f64)
            }
            _ => "n/a".to_owned(),
        };
        Ok(vec![
            Row::measured(
                "5",
                what,
                &parameters,
                per_row(ours.rate),
                "rows/s",
                per_row(baseline.rate),
                BASELINE_5_ROWS,
            )
            .with_detail(format!(
                "ulid(@i) costs {cost_us} µs per row more; {}",
                phases_detail(&ours, &baseline)
            )),
        ])
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Figure 4: commit-to-consumer latency

async fn figure_4(bench: &mut Bench, out: &mut Vec<Row>) {
    let limit = bench.options.timeout;
    for writers in LATENCY_WRITERS {
        let rate = bench.options.rate;
        let parameters = [
            ("writers", writers.to_string()),
            (
                "rate",
                if rate == 0 {
                    "max".to_owned()
                } else {
                    format!("{rate}/s/writer")
                },
            ),
        ];
        let what = "commit-to-consumer latency";
        measure(out, limit, ("4", what, &parameters), async {
            latency(bench, writers, &parameters).await
        })
        .await;
    }
}

async fn latency(
    bench: &mut Bench,
    writers: usize,
    parameters: &[(&str, String)],
) -> Outcome<Vec<Row>> {
    let name = format!("latency_w{writers}");
    let feed = feed(&name)?;
    bench.admin(&sql::outbox_feed(&name)).await?;

    let (expected_tx, expected_rx) = watch::channel(None::<u64>);
    let give_up = Duration::from_secs(30);
    let mut consumers = JoinSet::new();
    let mut clients = bench.pool.take(2).await?;
    for (index, waiting) in [
        Waiting::LongPoll {
            wait_ms: LONG_POLL_WAIT_MS,
        },
        Waiting::Polling { sleep: POLL_SLEEP },
    ]
    .into_iter()
    .enumerate()
    {
        let client = clients.pop().ok_or("no connection")?;
        let (feed, rx) = (feed.clone(), expected_rx.clone());
        consumers.spawn(async move {
            (
                index,
                consume_loop(client, feed, waiting, rx, give_up).await,
            )
        });
    }
    // Let both consumers reach their idle state (a long-poll, a sleep) before events come.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let options = bench.options.clone();
    let period = (options.rate > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(options.rate)));
    let sql = sql::outbox_write(&feed);
    let phase = write_phase(
        bench,
        WriteSpec {
            tx: Tx::BatchWithShard(sql),
            shards: 1,
            warmup: Duration::ZERO,
            duration: options.latency_duration(),
            period,
            record: true,
        },
        writers,
    )
    .await?;
    let _ = expected_tx.send(Some(phase.events));

    let mut logs: [Option<Vec<(i64, Instant)>>; 2] = [None, None];
    while let Some(joined) = consumers.join_next().await {
        let (index, (client, outcome)) =
            joined.map_err(|e| Failure(format!("a consumer panicked: {e}")))?;
        bench.pool.give(client);
        logs[index] = Some(outcome?);
    }
    let [Some(long_poll), Some(polling)] = logs else {
        return Err("a consumer did not report".into());
    };

    let committed: HashMap<i64, Instant> = phase.log.iter().copied().collect();
    let (long_poll_ms, unmatched_lp) = delays_ms(&committed, &long_poll);
    let (polling_ms, unmatched_p) = delays_ms(&committed, &polling);
    let lp = Summary::of(&long_poll_ms).ok_or("the long-poll consumer saw no event")?;
    let poll = Summary::of(&polling_ms).ok_or("the polling consumer saw no event")?;

    let mut detail = format!(
        "{} events ({:.0}/s committed); mean {:.1} / {:.1} ms; max {:.1} / {:.1} ms",
        phase.events,
        phase.rate.unwrap_or(0.0),
        lp.mean,
        poll.mean,
        lp.max,
        poll.max
    );
    if unmatched_lp + unmatched_p > 0 {
        detail.push_str(&format!(
            "; {} / {} events seen without a commit record",
            unmatched_lp, unmatched_p
        ));
    }
    let row = |name: &str, value: f64, baseline: f64| {
        Row::measured(
            "4",
            &format!("commit-to-consumer latency {name}"),
            parameters,
            Some(value),
            "ms",
            Some(baseline),
            BASELINE_4,
        )
    };
    Ok(vec![
        row("p50", lp.p50, poll.p50).with_detail(detail),
        row("p95", lp.p95, poll.p95),
        row("p99", lp.p99, poll.p99),
    ])
}

// ---------------------------------------------------------------------------------------
// Figures 2 and 3: first-read assignment and replay

struct AssignTables {
    feed: Feed,
    plain_table: String,
    plain_outbox: String,
    plain_log: String,
}

fn assign_tables(shards: i32) -> Outcome<AssignTables> {
    Ok(AssignTables {
        feed: feed(&format!("assign_s{shards}"))?,
        plain_table: sql::table(&format!("assign_plain_s{shards}")),
        plain_outbox: sql::table(&format!("assign_plain_outbox_s{shards}")),
        plain_log: sql::table(&format!("assign_plain_log_s{shards}")),
    })
}

/// The last ULID of each shard of `feed` (the cursor a first read starts from).
async fn feed_heads(client: &mut Client, feed: &Feed, shards: i32) -> Outcome<Vec<Cursor>> {
    let found = rows(client, &sql::feed_heads(&feed.object("feed"))).await?;
    let mut heads = vec![Cursor::START; shards as usize];
    for row in &found {
        let shard = integer(row, 0).unwrap_or(-1);
        let bytes: Option<&[u8]> = row.try_get::<&[u8], usize>(1).ok().flatten();
        if let (Ok(index), Some(bytes)) = (usize::try_from(shard), bytes)
            && index < heads.len()
        {
            heads[index] = Cursor::from_bytes(bytes)?;
        }
    }
    Ok(heads)
}

/// Per-shard rates (each loop's rows over its own time) and the total rate.
fn rates(results: &[Timed<u64>]) -> (Option<f64>, Option<f64>, u64, Duration) {
    let total: u64 = results.iter().map(|r| r.value).sum();
    let elapsed = span(results);
    let per_shard: Vec<f64> = results
        .iter()
        .filter_map(|r| throughput(r.value, r.elapsed()))
        .collect();
    (throughput(total, elapsed), mean(&per_shard), total, elapsed)
}

fn read_detail(ours: &[Timed<u64>], baseline: &[Timed<u64>]) -> String {
    let (_, ours_shard, ours_total, ours_elapsed) = rates(ours);
    let (_, base_shard, base_total, base_elapsed) = rates(baseline);
    let mut detail = format!(
        "{} / {} events in {:.2} / {:.2} s",
        ours_total,
        base_total,
        ours_elapsed.as_secs_f64(),
        base_elapsed.as_secs_f64()
    );
    if ours.len() > 1 {
        detail.push_str(&format!(
            "; per shard {} / {} events/s",
            crate::report::format_number(ours_shard),
            crate::report::format_number(base_shard)
        ));
    }
    detail
}

async fn figures_2_3(bench: &mut Bench, out: &mut Vec<Row>, shards: i32) {
    let limit = bench.options.timeout;
    let per_shard = bench.options.rows_per_shard;
    let do_2 = bench.options.shard_counts(2).contains(&shards);
    let do_3 = bench.options.shard_counts(3).contains(&shards);
    let Ok(tables) = assign_tables(shards) else {
        return;
    };
    let figure_2 = label(2, shards);
    let figure_3 = label(3, shards);
    let first = if do_2 { &figure_2 } else { &figure_3 };
    let setup = sql::assign_setup(shards);
    if !prepared(
        out,
        limit,
        (
            first,
            "read tables",
            &[("shards", shards.to_string()), ("setup", "tables".into())],
        ),
        bench.admin(&setup),
    )
    .await
    {
        return;
    }

    if do_2 {
        read_pages(bench, out, &tables, shards, &figure_2, ReadFigure::Assign).await;
    }

    if do_3 {
        if !prepared(
            out,
            limit,
            (
                &figure_3,
                "replay",
                &[
                    ("shards", shards.to_string()),
                    ("setup", "assigned feed".into()),
                ],
            ),
            ensure_assigned(bench, &tables, shards, per_shard),
        )
        .await
        {
            return;
        }
        read_pages(bench, out, &tables, shards, &figure_3, ReadFigure::Replay).await;
    }
}

/// The two read figures, which measure the same way at every page size.
#[derive(Clone, Copy)]
enum ReadFigure {
    /// Figure 2: the first read moves the outbox into the feed.
    Assign,
    /// Figure 3: reading an already-assigned feed from the start.
    Replay,
}

/// One measurement per page size of figure 2 or 3, each beside its baseline.
async fn read_pages(
    bench: &mut Bench,
    out: &mut Vec<Row>,
    tables: &AssignTables,
    shards: i32,
    figure: &str,
    kind: ReadFigure,
) {
    let limit = bench.options.timeout;
    let per_shard = bench.options.rows_per_shard;
    let (what, baseline_name) = match kind {
        ReadFigure::Assign => ("first-read assignment", BASELINE_2),
        ReadFigure::Replay => ("replay", BASELINE_3),
    };
    for page in PAGE_SIZES {
        let parameters = [
            ("shards", shards.to_string()),
            ("page", page.to_string()),
            ("rows_per_shard", per_shard.to_string()),
        ];
        measure(out, limit, (figure, what, &parameters), async {
            let (ours, baseline) = read_both(bench, tables, kind, shards, page, per_shard).await?;
            Ok(vec![
                Row::measured(
                    figure,
                    what,
                    &parameters,
                    rates(&ours).0,
                    "events/s",
                    rates(&baseline).0,
                    baseline_name,
                )
                .with_detail(read_detail(&ours, &baseline)),
            ])
        })
        .await;
    }
}

/// Figure 2 (`Assign`): preloads both outboxes, then drains the plain one (baseline) and
/// the feed's (read_page) with one reader per shard. Figure 3 (`Replay`): replays the first
/// `per_shard` rows of every shard with the plain select (baseline) and with read_page, one
/// reader per shard. Ours, then the baseline.
async fn read_both(
    bench: &mut Bench,
    tables: &AssignTables,
    kind: ReadFigure,
    shards: i32,
    page: u32,
    per_shard: u64,
) -> Outcome<(Vec<Timed<u64>>, Vec<Timed<u64>>)> {
    let feed = &tables.feed;
    let (read, sql, heads) = match kind {
        ReadFigure::Assign => {
            let mut client = bench.client().await?;
            preload_feed(&mut client, &bench.ids, feed, shards, per_shard).await?;
            preload_events(
                &mut client,
                &bench.ids,
                &tables.plain_table,
                &tables.plain_outbox,
                shards,
                per_shard,
            )
            .await?;
            let heads = feed_heads(&mut client, feed, shards).await?;
            bench.pool.give([client]);
            let sql = sql::plain_drain(&tables.plain_outbox, &tables.plain_log);
            (PlainRead::Drain, sql, heads)
        }
        ReadFigure::Replay => {
            let sql = sql::plain_replay(&feed.object("feed"));
            (PlainRead::Replay, sql, vec![Cursor::START; shards as usize])
        }
    };
    let baseline = plain_reads(bench, read, &sql, shards, page, per_shard).await?;
    let ours = feed_reads(bench, feed, &heads, page, per_shard).await?;
    Ok((ours, baseline))
}

/// Figure 3's data: every shard of the feed holds at least `per_shard` rows (figure 2 put
/// them there; without it, they are preloaded and assigned here, untimed). Then one
/// untimed plain pass reads them, so both replays find them in the buffer pool.
async fn ensure_assigned(
    bench: &mut Bench,
    tables: &AssignTables,
    shards: i32,
    per_shard: u64,
) -> Outcome<()> {
    let feed = &tables.feed;
    let mut client = bench.client().await?;
    let smallest = scalar(
        &mut client,
        &sql::smallest_shard(&feed.object("feed"), shards),
    )
    .await?
    .unwrap_or(0);
    let heads = feed_heads(&mut client, feed, shards).await?;
    if (smallest as u64) < per_shard {
        preload_feed(&mut client, &bench.ids, feed, shards, per_shard).await?;
    }
    bench.pool.give([client]);
    if (smallest as u64) < per_shard {
        feed_reads(bench, feed, &heads, 5000, per_shard).await?;
    }
    let sql = sql::plain_replay(&feed.object("feed"));
    plain_reads(bench, PlainRead::Replay, &sql, shards, 5000, per_shard).await?;
    Ok(())
}

/// Preloads `per_shard × shards` events into `feed`'s table and outbox (see
/// [`preload_events`]).
async fn preload_feed(
    client: &mut Client,
    ids: &AtomicI64,
    feed: &Feed,
    shards: i32,
    per_shard: u64,
) -> Outcome<()> {
    let (table, outbox) = (feed.quoted_table(), feed.outbox_table());
    preload_events(client, ids, &table, &outbox, shards, per_shard).await
}

/// `read`'s plain baseline on every shard at once, one reader per shard, each until it
/// has `per_shard` rows.
async fn plain_reads(
    bench: &mut Bench,
    read: PlainRead,
    sql: &str,
    shards: i32,
    page: u32,
    per_shard: u64,
) -> Outcome<Vec<Timed<u64>>> {
    let sql = Arc::new(sql.to_owned());
    parallel(
        &mut bench.pool,
        shards as usize,
        |index, client, barrier| {
            let sql = Arc::clone(&sql);
            plain_read_loop(
                index,
                client,
                read,
                sql,
                index as i32,
                page,
                per_shard,
                barrier,
            )
        },
    )
    .await
}

/// read_page on every shard of `feed` at once, shard i from `heads[i]`, one reader per
/// shard, each until it has `per_shard` rows.
async fn feed_reads(
    bench: &mut Bench,
    feed: &Feed,
    heads: &[Cursor],
    page: u32,
    per_shard: u64,
) -> Outcome<Vec<Timed<u64>>> {
    parallel(&mut bench.pool, heads.len(), |index, client, barrier| {
        let (feed, from) = (feed.clone(), heads[index]);
        read_feed_loop(
            index,
            client,
            feed,
            index as i32,
            from,
            page,
            per_shard,
            barrier,
        )
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Figure 6: the claim outbox

/// A publisher that accepts everything at once.
struct NoopPublisher;

impl Publisher for NoopPublisher {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        vec![Ok(()); batch.len()]
    }
}

/// A store that times every claim call of the store it wraps.
struct TimedStore<S> {
    inner: S,
    claims: Arc<Mutex<Vec<Duration>>>,
}

impl<S: ClaimStore> ClaimStore for TimedStore<S> {
    async fn claim(
        &mut self,
        batch_size: u32,
        claim_timeout: Duration,
    ) -> changefeed::Result<Vec<Claimed>> {
        let started = Instant::now();
        let result = self.inner.claim(batch_size, claim_timeout).await;
        let took = started.elapsed();
        if let Ok(mut claims) = self.claims.lock() {
            claims.push(took);
        }
        result
    }

    async fn mark_done(&mut self, ids: &[i64], token: ClaimToken) -> changefeed::Result<u64> {
        self.inner.mark_done(ids, token).await
    }

    async fn mark_failed(&mut self, failed: Failed<'_>) -> changefeed::Result<u64> {
        self.inner.mark_failed(failed).await
    }

    async fn requeue(&mut self, id: i64, token: ClaimToken, after: Duration) -> Result<u64> {
        self.inner.requeue(id, token, after).await
    }

    // Forwarded, as every wrapper must (ClaimStore's documentation): the relay treats a
    // claim that waits on the server differently.
    fn claim_waits(&self) -> bool {
        self.inner.claim_waits()
    }

    async fn cancel_claim(&mut self) {
        self.inner.cancel_claim().await;
    }

    fn claim_progress(&self) -> Option<ClaimProgress> {
        self.inner.claim_progress()
    }

    fn outbox_name(&self) -> String {
        self.inner.outbox_name()
    }
}

/// Transient store errors after which figure 6 gives up on its relays.
const MAX_RELAY_ERRORS: u64 = 10;

/// Counts what the relays published and says when the target is reached (or when the
/// relays keep failing, which they never stop on by themselves).
struct Progress {
    target: u64,
    published: AtomicU64,
    loop_errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    finished: OnceLock<Instant>,
    stop: watch::Sender<bool>,
}

impl Hooks for Progress {
    fn on_published(&self, count: usize) {
        let total = self.published.fetch_add(count as u64, Ordering::SeqCst) + count as u64;
        if total >= self.target {
            self.finished.get_or_init(Instant::now);
            let _ = self.stop.send(true);
        }
    }

    fn on_loop_error(&self, error: &changefeed::Error) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error.to_string());
        }
        let errors = self.loop_errors.fetch_add(1, Ordering::SeqCst) + 1;
        // A relay retries its store forever (with a back-off of seconds): a measurement
        // gives up at once on an error that will not pass, and after a few that might.
        if !error.is_transient() || errors >= MAX_RELAY_ERRORS {
            let _ = self.stop.send(true);
        }
    }
}

async fn figure_6(bench: &mut Bench, out: &mut Vec<Row>) {
    let limit = bench.options.timeout;
    let messages = bench.options.messages;
    for relays in RELAYS {
        let parameters = [
            ("relays", relays.to_string()),
            ("batch", CLAIM_BATCH.to_string()),
            ("messages", messages.to_string()),
        ];
        measure(out, limit, ("6", "relay throughput", &parameters), async {
            claim_outbox(bench, relays, messages, &parameters).await
        })
        .await;
    }
}

async fn preload_messages(client: &mut Client, table: &TableName, count: u64) -> Outcome<()> {
    const CHUNK: u64 = 50_000;
    let sql = sql::preload_messages(&table.quoted());
    let mut done = 0;
    while done < count {
        let chunk = (count - done).min(CHUNK) as i64;
        client.execute(sql.as_str(), &[&chunk]).await?;
        done += chunk as u64;
    }
    Ok(())
}

async fn done_count(client: &mut Client, table: &TableName) -> Outcome<i64> {
    Ok(scalar(client, &sql::done_count(&table.quoted()))
        .await?
        .unwrap_or(0))
}

/// Figure 6's baseline loop: claim, mark done, until `done` reaches `target`.
async fn raw_claim_loop(
    index: usize,
    mut client: Client,
    store: OutboxStore,
    target: u64,
    done: Arc<AtomicU64>,
    finished: Arc<OnceLock<Instant>>,
    barrier: Arc<Barrier>,
) -> crate::load::TaskResult<Vec<Duration>> {
    let outcome = timed(&barrier, async {
        let mut claims = Vec::new();
        let mut transient = 0u64;
        while done.load(Ordering::SeqCst) < target {
            let started = Instant::now();
            let batch = match store
                .claim(&mut client, CLAIM_BATCH, RelayConfig::DEFAULT_CLAIM_TIMEOUT)
                .await
            {
                Ok(batch) => batch,
                Err(error) => {
                    absorb_transient(error, &mut transient)?;
                    continue;
                }
            };
            claims.push(started.elapsed());
            let Some(first) = batch.first() else {
                tokio::time::sleep(CLAIM_POLL).await;
                continue;
            };
            let ids: Vec<i64> = batch.iter().map(Claimed::id).collect();
            let changed = store
                .mark_done(&mut client, &ids, first.claim_token())
                .await?;
            let total = done.fetch_add(changed, Ordering::SeqCst) + changed;
            if total >= target {
                finished.get_or_init(Instant::now);
            }
        }
        Ok(claims)
    })
    .await;
    finish(index, client, outcome)
}

/// What [`run_relays`] measured.
#[derive(Debug)]
pub struct RelayRun {
    /// From the relays' start until the last of the `messages` was published and marked
    /// done.
    pub elapsed: Duration,
    /// Messages published (marked done).
    pub published: u64,
    /// The duration of every claim call of every relay.
    pub claims: Vec<Duration>,
    /// Store errors the relays reported (and retried).
    pub loop_errors: u64,
}

/// Runs one [`Relay`] per store, with a no-op publisher, until `messages` messages are
/// published; then shuts them all down (each finishes its batch in flight) and waits for
/// them. Fails when a relay reports a store error that will not pass, or
/// [`MAX_RELAY_ERRORS`] that might, before that.
pub async fn run_relays<S: ClaimStore + Sync + 'static>(
    stores: Vec<S>,
    messages: u64,
    config: RelayConfig,
) -> Outcome<RelayRun> {
    let (stop, stop_rx) = watch::channel(false);
    let progress = Arc::new(Progress {
        target: messages,
        published: AtomicU64::new(0),
        loop_errors: AtomicU64::new(0),
        last_error: Mutex::new(None),
        finished: OnceLock::new(),
        stop,
    });
    let claims = Arc::new(Mutex::new(Vec::new()));
    let mut ready = Vec::with_capacity(stores.len());
    for store in stores {
        let store = TimedStore {
            inner: store,
            claims: Arc::clone(&claims),
        };
        ready.push(
            Relay::new(store, NoopPublisher, config.clone())?.with_hooks(Arc::clone(&progress)),
        );
    }
    let start = Instant::now();
    let mut running = JoinSet::new();
    for relay in ready {
        let mut rx = stop_rx.clone();
        running.spawn(relay.run(async move {
            let _ = rx.wait_for(|stop| *stop).await.is_ok();
        }));
    }
    let mut stop_seen = stop_rx;
    let _ = stop_seen.wait_for(|stop| *stop).await.is_ok();
    while let Some(joined) = running.join_next().await {
        joined
            .map_err(|e| Failure(format!("a relay panicked: {e}")))?
            .map_err(Failure::from)?;
    }
    let loop_errors = progress.loop_errors.load(Ordering::SeqCst);
    let elapsed = match progress.finished.get() {
        Some(end) => end.saturating_duration_since(start),
        None => {
            let last = progress
                .last_error
                .lock()
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or_default();
            return Err(Failure(format!(
                "the relays stopped after {loop_errors} store errors; the last: {last}"
            )));
        }
    };
    let claims = claims.lock().map(|c| c.clone()).unwrap_or_default();
    Ok(RelayRun {
        elapsed,
        published: progress.published.load(Ordering::SeqCst),
        claims,
        loop_errors,
    })
}

async fn claim_outbox(
    bench: &mut Bench,
    relays: usize,
    messages: u64,
    parameters: &[(&str, String)],
) -> Outcome<Vec<Row>> {
    let relay_table = TableName::new(SCHEMA, &format!("relay_k{relays}"))?;
    let raw_table = TableName::new(SCHEMA, &format!("relay_raw_k{relays}"))?;
    let mut client = bench.client().await?;
    for table in [&relay_table, &raw_table] {
        exec(&mut client, &sql::setup_outbox(&table.to_string())).await?;
        preload_messages(&mut client, table, messages).await?;
    }
    bench.pool.give([client]);

    // Baseline: raw loops.
    let done = Arc::new(AtomicU64::new(0));
    let raw_finished = Arc::new(OnceLock::new());
    let raw = parallel(&mut bench.pool, relays, |index, client, barrier| {
        raw_claim_loop(
            index,
            client,
            OutboxStore::new(raw_table.clone()),
            messages,
            Arc::clone(&done),
            Arc::clone(&raw_finished),
            barrier,
        )
    })
    .await?;
    let raw_start = raw.iter().map(|r| r.start).min().ok_or("no raw loop ran")?;
    let raw_elapsed = raw_finished
        .get()
        .map(|end| end.saturating_duration_since(raw_start))
        .ok_or("the raw loops stopped before every message was done")?;
    let raw_claims: Vec<Duration> = raw.into_iter().flat_map(|r| r.value).collect();

    // Relays, each with its own connection opened before the clock starts.
    let mut stores = Vec::with_capacity(relays);
    for _ in 0..relays {
        let mut store =
            SqlClaimStore::new(OutboxStore::new(relay_table.clone()), bench.ado.clone());
        // Opens the store's connection: an acknowledgement of nothing changes nothing.
        store
            .mark_done(&[-1], ClaimToken::new(uuid::Uuid::nil()))
            .await?;
        stores.push(store);
    }
    let config = RelayConfig::default()
        .batch_size(CLAIM_BATCH)
        .poll_interval(CLAIM_POLL);
    let relayed = run_relays(stores, messages, config).await?;
    let (relay_elapsed, relay_claims) = (relayed.elapsed, relayed.claims);

    let mut client = bench.client().await?;
    let relay_done = done_count(&mut client, &relay_table).await?;
    let raw_done = done_count(&mut client, &raw_table).await?;
    bench.pool.give([client]);

    let relay_rate = throughput(relayed.published, relay_elapsed);
    let raw_rate = throughput(done.load(Ordering::SeqCst), raw_elapsed);
    let relay_latency = Summary::of_durations(&relay_claims);
    let raw_latency = Summary::of_durations(&raw_claims);
    let mut detail = format!(
        "done {relay_done} / {raw_done} in {:.2} / {:.2} s",
        relay_elapsed.as_secs_f64(),
        raw_elapsed.as_secs_f64()
    );
    let errors = relayed.loop_errors;
    if errors > 0 {
        detail.push_str(&format!("; relay loop errors {errors}"));
    }
    let latency_detail = format!(
        "p50 {} / {} ms; {} / {} claim calls",
        crate::report::format_number(relay_latency.map(|s| s.p50)),
        crate::report::format_number(raw_latency.map(|s| s.p50)),
        relay_claims.len(),
        raw_claims.len()
    );
    Ok(vec![
        Row::measured(
            "6",
            "relay throughput",
            parameters,
            relay_rate,
            "messages/s",
            raw_rate,
            BASELINE_6,
        )
        .with_detail(detail),
        Row::measured(
            "6",
            "claim call latency p99",
            parameters,
            relay_latency.map(|s| s.p99),
            "ms",
            raw_latency.map(|s| s.p99),
            BASELINE_6,
        )
        .with_detail(latency_detail),
    ])
}
