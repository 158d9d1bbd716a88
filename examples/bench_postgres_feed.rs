//! The PostgreSQL benchmark of feeds (feature `postgres`, issue 28 item 7): each figure next
//! to a baseline measured in the same run, on the same server, through prepared statements on
//! both sides. Nothing is asserted; it prints one table and a legend.
//!
//! 1. first-read assignment: events/s moved from the outbox into the feed by `read_feed_<id>`
//!    at the head, against a bare `delete … returning` drain of an identical table (same key
//!    columns, same rows, same page size);
//! 2. replay: events/s reading the assigned feed from the start with `read_feed_<id>`, against
//!    a bare `select … where ulid > $1 order by ulid limit n` loop over an identical table
//!    (the medians of 5 passes each, alternately);
//! 3. commit-to-consumer latency p50/p99 of single-event commits, for a reader that LISTENs on
//!    the feed's channel on its reading connection and reads again on each notification,
//!    against a reader polling every 50 ms;
//! 4. serialized-writer throughput: 4 writers, each transaction `lock_feed_<id>(0)`, an insert
//!    of rows numbered by `ulid_<id>(i)`, commit; against the same inserts into an identical
//!    table without `lock_feed` (and without the feed's trigger); then with one writer each,
//!    which takes queueing on the shard's lock out of the comparison.
//!
//! ```sh
//! cargo run --release --features postgres --example bench_postgres_feed            # release sizes
//! cargo run --features postgres --example bench_postgres_feed -- --quick           # a smoke run
//! ```
//!
//! It starts a private PostgreSQL (tests/common_postgres; postgresql must be installed), or
//! uses `CHANGEFEED_TEST_POSTGRES`, and works in its own database `cf_bench_feed_<pid>`, which
//! it drops at the end. Every stage is bounded: one that fails or stalls prints `error` in
//! its rows, and the run goes on.

#[path = "../tests/common_postgres/mod.rs"]
mod common_postgres;
#[path = "../tests/common_server/mod.rs"]
mod common_server;
#[path = "support/cpu.rs"]
#[allow(dead_code)]
mod cpu;
#[path = "support/figures.rs"]
mod figures;
#[path = "support/machine.rs"]
mod machine;
#[path = "support/relay_bench.rs"]
#[allow(dead_code)]
mod relay_bench;
#[path = "bench/report.rs"]
#[allow(dead_code)]
mod report;
#[path = "bench/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use report::{format_number, format_ratio, one_line};
use stats::Summary;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Statement};

/// The polling reader's interval in figure 3.
const POLL: Duration = Duration::from_millis(50);
/// The cursor before the first event.
const START: [u8; 16] = [0; 16];
/// Writers of figure 4.
const WRITERS: usize = 4;
/// Replays of figure 2 (and as many bare loops), alternately.
const REPLAYS: usize = 5;

/// The sizes of a run.
#[derive(Clone, Copy)]
struct Sizes {
    /// Events of figures 1 and 2.
    events: i64,
    /// Rows per page (read_feed's default), of the feed and of the bare loops.
    page: i32,
    /// Transactions per writer in figure 4.
    transactions: i64,
    /// Rows per transaction in figure 4.
    rows: i64,
    /// Single-event commits per reader in figure 3.
    samples: usize,
    /// The bound of each stage.
    limit: Duration,
}

const RELEASE: Sizes = Sizes {
    events: 100_000,
    page: 1000,
    transactions: 1000,
    rows: 10,
    samples: relay_bench::LATENCY_SAMPLES,
    limit: Duration::from_secs(300),
};

const QUICK: Sizes = Sizes {
    events: 10_000,
    page: 1000,
    transactions: 100,
    rows: 10,
    samples: 40,
    limit: Duration::from_secs(30),
};

const HELP: &str =
    "bench_postgres_feed: feed figures on a private PostgreSQL, each beside its baseline
usage: cargo run --release --features postgres --example bench_postgres_feed [-- --quick]
  --quick   small sizes (a smoke run of well under a minute, noisy figures)
";

/// What a figure must reach.
#[derive(Clone, Copy)]
enum Goal {
    /// value / baseline at least this.
    RatioAtLeast(f64),
    /// The value at most this.
    AtMost(f64),
    /// Shown for context only.
    None,
}

/// One row of the table.
struct Figure {
    name: String,
    unit: &'static str,
    value: Option<f64>,
    baseline: Option<f64>,
    goal: Goal,
    error: Option<String>,
}

impl Figure {
    fn measured(name: String, unit: &'static str, value: f64, baseline: f64, goal: Goal) -> Self {
        Figure {
            name,
            unit,
            value: Some(value),
            baseline: Some(baseline),
            goal,
            error: None,
        }
    }

    fn failed(name: String, goal: Goal, error: &str) -> Self {
        Figure {
            name,
            unit: "",
            value: None,
            baseline: None,
            goal,
            error: Some(one_line(error)),
        }
    }

    fn ratio(&self) -> Option<f64> {
        stats::ratio_of(self.value, self.baseline)
    }

    fn goal_text(&self) -> String {
        match self.goal {
            Goal::RatioAtLeast(r) => format!("≥ {r}×"),
            Goal::AtMost(v) => format!("≤ {v} {}", self.unit),
            Goal::None => "–".to_owned(),
        }
    }

    fn verdict(&self) -> &'static str {
        if self.error.is_some() {
            return "error";
        }
        let met = match self.goal {
            Goal::RatioAtLeast(r) => self.ratio().map(|x| x >= r),
            Goal::AtMost(v) => self.value.map(|x| x <= v),
            Goal::None => return "–",
        };
        match met {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "error",
        }
    }

    fn with_unit(&self, v: Option<f64>) -> String {
        match v {
            Some(_) => format!("{} {}", format_number(v), self.unit),
            None => "-".to_owned(),
        }
    }

    /// Hands the figure on to `bench_all` (value, baseline, ratio; the goal in the name).
    fn record(&self) {
        let value = match &self.error {
            Some(error) => format!("error: {error}"),
            None => self.with_unit(self.value),
        };
        figures::record(
            &format!("PostgreSQL feed: {} (goal {})", self.name, self.goal_text()),
            &value,
            &self.with_unit(self.baseline),
            self.ratio(),
        );
    }

    fn line(&self) -> String {
        let with_unit = |v: Option<f64>| self.with_unit(v);
        match &self.error {
            Some(error) => format!(
                "| {} | error: {error} | - | - | {} | error |",
                self.name,
                self.goal_text()
            ),
            None => format!(
                "| {} | {} | {} | {} | {} | {} |",
                self.name,
                with_unit(self.value),
                with_unit(self.baseline),
                format_ratio(self.ratio()),
                self.goal_text(),
                self.verdict()
            ),
        }
    }
}

/// A failed statement, as one line naming what failed.
fn why(what: &'static str) -> impl Fn(tokio_postgres::Error) -> String {
    move |e| format!("{what}: {}", changefeed::Error::from(e))
}

/// Runs `work` within `limit`; a stall is an error like any other.
async fn bounded<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result,
        Err(_) => Err(format!("no result within {} s", limit.as_secs())),
    }
}

/// The database of the run.
struct Bench {
    config: Config,
    sizes: Sizes,
}

impl Bench {
    /// A connection with the crate's settings (statement timeout, READ COMMITTED).
    async fn client(&self) -> Result<Client, String> {
        changefeed::postgres::connect(&self.config)
            .await
            .map_err(|e| format!("connect: {e}"))
    }

    /// Runs statements, each in its own implicit transaction (VACUUM needs that).
    async fn sql(&self, statements: &[String]) -> Result<(), String> {
        let client = self.client().await?;
        for statement in statements {
            client
                .batch_execute(statement)
                .await
                .map_err(|e| format!("{statement}: {}", changefeed::Error::from(e)))?;
        }
        Ok(())
    }

    /// Creates `table` (`schema.table`, columns `columns`), sets a feed up on it with
    /// `arguments` after the name, and returns the feed's id.
    async fn feed(&self, table: &str, columns: &str, arguments: &str) -> Result<i32, String> {
        self.sql(&[format!("create table {table} ({columns})")])
            .await?;
        let setup = format!("select changefeed.setup_feed('{table}'{arguments})");
        let row = self
            .client()
            .await?
            .query_one(&setup, &[])
            .await
            .map_err(why("setup_feed"))?;
        Ok(row.get(0))
    }
}

/// Reads `events` rows through `statement` (parameters: cursor, page size; column 0 the ULID)
/// from the start, a page at a time, each page's last ULID the next cursor; returns the time
/// taken. An empty page before the last event is an error.
async fn read_through(
    client: &Client,
    statement: &Statement,
    events: i64,
    page: i32,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mut cursor = START.to_vec();
    let mut read = 0i64;
    while read < events {
        let rows = client
            .query(statement, &[&cursor, &page])
            .await
            .map_err(why("read"))?;
        let Some(last) = rows.last() else {
            return Err(format!("an empty page after {read} of {events} events"));
        };
        cursor = last.get(0);
        read += rows.len() as i64;
    }
    Ok(started.elapsed())
}

/// The statement that reads a page of an outbox-mode feed with key `id`.
async fn prepare_read_feed(client: &Client, feed: i32) -> Result<Statement, String> {
    client
        .prepare(&format!(
            "select r.ulid, (r.key).id from changefeed.read_feed_{feed}(0, $1, $2) as r"
        ))
        .await
        .map_err(why("prepare read_feed"))
}

/// Events per second of `events` in `elapsed`.
fn rate(events: i64, elapsed: Duration) -> f64 {
    stats::throughput(events.max(0) as u64, elapsed).unwrap_or(0.0)
}

/// Figure 1: the feed's first read at the head, and the bare drain, each over `events` rows
/// of key `id bigint`, page `page`. Returns (feed, bare) events/s.
async fn assignment(bench: &Bench) -> Result<(f64, f64), String> {
    let Sizes { events, page, .. } = bench.sizes;
    let feed = bench
        .feed("app.assign_events", "id bigint primary key, body text", "")
        .await?;
    // The bare table is the outbox's twin: its columns, identity, defaults and key.
    bench
        .sql(&[
            format!("create table bench.drain (like changefeed.outbox_{feed} including all)"),
            format!(
                "insert into app.assign_events (id, body) \
                 select g, 'event ' || g from generate_series(1, {events}) as g"
            ),
            format!(
                "insert into bench.drain (shard_id, id) select 0, g from generate_series(1, {events}) as g"
            ),
            format!("vacuum analyze changefeed.outbox_{feed}"),
            format!("vacuum analyze changefeed.feed_{feed}"),
            "vacuum analyze bench.drain".to_owned(),
        ])
        .await?;

    let client = bench.client().await?;
    let read = prepare_read_feed(&client, feed).await?;
    let moved = read_through(&client, &read, events, page).await?;

    // The mover's delete, alone: the same page of the oldest rows, returned to the client.
    let drain = client
        .prepare(
            "delete from bench.drain as d where d.shard_id = 0 and d.order_sequence in ( \
                 select d2.order_sequence from bench.drain as d2 where d2.shard_id = 0 \
                 order by d2.order_sequence limit $1::integer) \
             returning d.order_sequence, d.time_hint, d.id",
        )
        .await
        .map_err(why("prepare the drain"))?;
    let started = Instant::now();
    let mut drained = 0i64;
    while drained < events {
        let rows = client.query(&drain, &[&page]).await.map_err(why("drain"))?;
        if rows.is_empty() {
            return Err(format!("the drain stopped after {drained} rows"));
        }
        drained += rows.len() as i64;
    }
    Ok((rate(events, moved), rate(events, started.elapsed())))
}

/// Figure 2: replay of an assigned feed from the start, and the bare loop over a copy of the
/// feed's table (same rows, same ULIDs, same key). Returns (feed, bare) events/s.
async fn replay(bench: &Bench) -> Result<(f64, f64), String> {
    let Sizes { events, page, .. } = bench.sizes;
    let feed = bench
        .feed("app.replay_events", "id bigint primary key, body text", "")
        .await?;
    bench
        .sql(&[format!(
            "insert into app.replay_events (id, body) \
             select g, 'event ' || g from generate_series(1, {events}) as g"
        )])
        .await?;
    let client = bench.client().await?;
    let read = prepare_read_feed(&client, feed).await?;
    // Untimed: the first read assigns every event.
    read_through(&client, &read, events, page).await?;
    bench
        .sql(&[
            format!("create table bench.replay (like changefeed.feed_{feed} including all)"),
            format!("insert into bench.replay select * from changefeed.feed_{feed}"),
            format!("vacuum analyze changefeed.feed_{feed}"),
            format!("vacuum analyze changefeed.outbox_{feed}"),
            "vacuum analyze bench.replay".to_owned(),
        ])
        .await?;
    let bare = client
        .prepare(
            "select r.ulid, r.id from bench.replay as r where r.shard_id = 0 and r.ulid > $1 \
             order by r.ulid limit $2::integer",
        )
        .await
        .map_err(why("prepare the bare loop"))?;
    // Replay reads and writes nothing, so it runs [`REPLAYS`] times, alternately with the
    // bare loop, and the medians are compared: one slow moment of a shared machine does not
    // make the figure.
    let (mut replayed, mut looped) = (Vec::new(), Vec::new());
    for _ in 0..REPLAYS {
        replayed.push(rate(
            events,
            read_through(&client, &read, events, page).await?,
        ));
        looped.push(rate(
            events,
            read_through(&client, &bare, events, page).await?,
        ));
    }
    let median = |rates: &[f64]| stats::percentile(rates, 50.0).unwrap_or(0.0);
    Ok((median(&replayed), median(&looped)))
}

/// How the reader of figure 3 learns that there may be more.
enum Wake {
    /// Notifications of the feed's channel, on the reading connection.
    Notify(mpsc::UnboundedReceiver<()>),
    /// Every interval.
    Poll(Duration),
}

/// A connection whose notifications of `channel` arrive on the receiver (the connection is
/// driven by a task of its own, as the crate's waker does it).
async fn listening_connection(
    config: &Config,
    channel: &str,
) -> Result<(Client, mpsc::UnboundedReceiver<()>), String> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(why("connect"))?;
    let (notified, notifications) = mpsc::unbounded_channel();
    let ours = channel.to_owned();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message
                && n.channel() == ours
                && notified.send(()).is_err()
            {
                return;
            }
        }
    });
    Ok((client, notifications))
}

/// The reader of figure 3: reads to the head, then waits as `wake` says, until `stop`;
/// returns each event's id with the instant its page arrived.
async fn follow(
    client: &Client,
    read: &Statement,
    page: i32,
    mut wake: Wake,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<(i64, Instant)>, String> {
    let mut seen = Vec::new();
    let mut cursor = START.to_vec();
    loop {
        // Notifications that came during the last read are answered by this one.
        if let Wake::Notify(notifications) = &mut wake {
            while notifications.try_recv().is_ok() {}
        }
        loop {
            let rows = client
                .query(read, &[&cursor, &page])
                .await
                .map_err(why("read"))?;
            let now = Instant::now();
            seen.extend(rows.iter().map(|row| (row.get::<_, i64>(1), now)));
            if let Some(last) = rows.last() {
                cursor = last.get(0);
            }
            if rows.len() < page as usize {
                break;
            }
        }
        let woken = async {
            match &mut wake {
                // A long-poll still reads now and then: a lost notification costs a second.
                Wake::Notify(notifications) => {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), notifications.recv()).await;
                }
                Wake::Poll(interval) => tokio::time::sleep(*interval).await,
            }
        };
        tokio::select! {
            () = woken => {}
            _ = stop.wait_for(|stopped| *stopped) => return Ok(seen),
        }
    }
}

/// Figure 3: commit-to-consumer latencies of `samples` single-event commits to a reader woken
/// by NOTIFY (`notify`) or polling every [`POLL`]. Event ids start at `first_id`.
async fn latency(
    bench: &Bench,
    feed: i32,
    notify: bool,
    first_id: i64,
) -> Result<(Summary, usize), String> {
    let channel = format!("changefeed_feed_{feed}");
    let (reader, notifications) = listening_connection(&bench.config, &channel).await?;
    let wake = if notify {
        reader
            .batch_execute(&format!("listen {channel}"))
            .await
            .map_err(why("listen"))?;
        Wake::Notify(notifications)
    } else {
        Wake::Poll(POLL)
    };
    let read = prepare_read_feed(&reader, feed).await?;
    let writer = bench.client().await?;
    let insert = writer
        .prepare("insert into app.latency_events (id, body) values ($1, 'latency')")
        .await
        .map_err(why("prepare the insert"))?;
    let (stop, stopped) = watch::channel(false);
    let reading = follow(&reader, &read, bench.sizes.page, wake, stopped);
    let mut failed = None;
    let writing = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let commits = relay_bench::spaced_commits(bench.sizes.samples, async |n| {
            let id = first_id + n as i64;
            if let Err(e) = writer.execute(&insert, &[&id]).await {
                failed.get_or_insert_with(|| why("insert")(e));
            }
            id
        })
        .await;
        // Three polls after the last commit, as in the claim outbox's benchmark.
        tokio::time::sleep(POLL * 3).await;
        let _ = stop.send(true);
        commits
    };
    let (seen, commits) = tokio::join!(reading, writing);
    let seen = seen?;
    if let Some(error) = failed {
        return Err(error);
    }
    let missed = commits
        .iter()
        .filter(|(id, _)| !seen.iter().any(|(s, _)| s == id))
        .count();
    let summary = relay_bench::commit_to_publish(&commits, |id| {
        seen.iter().find(|(s, _)| *s == id).map(|(_, at)| *at)
    })
    .ok_or("the reader saw no event")?;
    Ok((summary, missed))
}

/// Figure 4: rows/s of `count` writers, each committing `transactions` transactions of `rows`
/// rows: `begin`, `lock` (if any), `insert` (its parameters: the first id and the row count),
/// `commit`, all writers at once. Ids start at `first_id`.
async fn writers(
    bench: &Bench,
    count: usize,
    first_id: i64,
    lock: Option<&str>,
    insert: &str,
) -> Result<f64, String> {
    let Sizes {
        transactions, rows, ..
    } = bench.sizes;
    let mut clients = Vec::new();
    for _ in 0..count {
        let client = bench.client().await?;
        let lock = match lock {
            Some(sql) => Some(
                client
                    .prepare(sql)
                    .await
                    .map_err(why("prepare lock_feed"))?,
            ),
            None => None,
        };
        let insert = client
            .prepare(insert)
            .await
            .map_err(why("prepare insert"))?;
        clients.push((client, lock, insert));
    }
    let started = Instant::now();
    let runs = clients
        .iter_mut()
        .enumerate()
        .map(|(w, (client, lock, insert))| async move {
            for t in 0..transactions {
                let first = first_id + (w as i64 * transactions + t) * rows;
                let tx = client.transaction().await.map_err(why("begin"))?;
                if let Some(lock) = lock {
                    tx.query(lock, &[]).await.map_err(why("lock_feed"))?;
                }
                tx.execute(insert, &[&first, &rows])
                    .await
                    .map_err(why("insert"))?;
                tx.commit().await.map_err(why("commit"))?;
            }
            Ok::<(), String>(())
        });
    for result in futures::future::join_all(runs).await {
        result?;
    }
    Ok(rate(count as i64 * transactions * rows, started.elapsed()))
}

/// Figure 4: serialized writers against plain inserts, [`WRITERS`] writers and then one (which
/// splits the cost of queueing on the shard's lock from the cost of each transaction's calls).
/// Returns (feed, bare) rows/s for each.
async fn serialized(bench: &Bench) -> Result<[(f64, f64); 2], String> {
    let columns = "shard integer not null, ulid bytea not null, id bigint primary key, body text";
    bench
        .sql(&[
            format!("create table bench.orders ({columns})"),
            "create unique index on bench.orders (shard, ulid)".to_owned(),
        ])
        .await?;
    bench
        .sql(&[
            format!("create table app.orders ({columns})"),
            "create unique index on app.orders (shard, ulid)".to_owned(),
        ])
        .await?;
    let feed: i32 = bench
        .client()
        .await?
        .query_one(
            "select changefeed.setup_feed('app.orders', 1, true, 'shard', 'ulid')",
            &[],
        )
        .await
        .map_err(why("setup_feed"))?
        .get(0);
    let lock = format!("select * from changefeed.lock_feed_{feed}(0)");
    let feed_insert = format!(
        "insert into app.orders (shard, ulid, id, body) \
         select 0, changefeed.ulid_{feed}(g), $1 + g, 'order' from generate_series(1, $2::bigint) as g"
    );
    // A unique 16-byte key the database computes as cheaply as it can.
    let bare_insert = "insert into bench.orders (shard, ulid, id, body) \
         select 0, int8send(0::bigint) || int8send($1 + g), $1 + g, 'order' \
         from generate_series(1, $2::bigint) as g";
    let mut rates = [(0.0, 0.0); 2];
    for (i, count) in [WRITERS, 1].into_iter().enumerate() {
        // Ids of the second round follow the first's.
        let first = i as i64 * (WRITERS as i64 * bench.sizes.transactions * bench.sizes.rows);
        rates[i] = (
            writers(bench, count, first, Some(&lock), &feed_insert).await?,
            writers(bench, count, first, None, bare_insert).await?,
        );
    }
    Ok(rates)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut sizes = RELEASE;
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--quick" => sizes = QUICK,
            "--help" | "-h" => {
                print!("{HELP}");
                return;
            }
            other => relay_bench::fail("arguments", format!("unknown argument {other}\n{HELP}")),
        }
    }
    let started = Instant::now();
    let at_start = machine::line();
    let db = common_postgres::database(&format!("bench_feed_{}", std::process::id())).await;
    let bench = Bench {
        config: db.config.clone(),
        sizes,
    };
    if let Err(e) = bench
        .sql(&["create schema app; create schema bench".to_owned()])
        .await
    {
        relay_bench::fail("schemas", e);
    }
    let version = match bench.client().await {
        Ok(client) => changefeed::postgres::server_version(&client)
            .await
            .unwrap_or_default(),
        Err(e) => relay_bench::fail("connect", e),
    };
    let Sizes {
        events,
        page,
        transactions,
        rows,
        samples,
        limit,
    } = sizes;
    println!(
        "feeds on PostgreSQL {version}: {events} events (figures 1-2), page {page}, {samples} \
         commits per reader (3), {WRITERS} writers x {transactions} transactions x {rows} rows (4)"
    );
    println!("machine at start: {at_start}");
    println!();

    let mut figures = Vec::new();
    let name1 = format!("1 first-read assignment (page {page})");
    figures.push(match bounded(limit, assignment(&bench)).await {
        Ok((feed, bare)) => {
            Figure::measured(name1, "events/s", feed, bare, Goal::RatioAtLeast(0.8))
        }
        Err(e) => Figure::failed(name1, Goal::RatioAtLeast(0.8), &e),
    });
    let name2 = format!("2 replay (page {page}, median of {REPLAYS})");
    figures.push(match bounded(limit, replay(&bench)).await {
        Ok((feed, bare)) => {
            Figure::measured(name2, "events/s", feed, bare, Goal::RatioAtLeast(0.9))
        }
        Err(e) => Figure::failed(name2, Goal::RatioAtLeast(0.9), &e),
    });

    let latency_feed = bounded(
        limit,
        bench.feed("app.latency_events", "id bigint primary key, body text", ""),
    )
    .await;
    let mut summaries = Vec::new();
    for (notify, first_id) in [(true, 1_000_000), (false, 2_000_000)] {
        let result = match &latency_feed {
            Ok(feed) => bounded(limit, latency(&bench, *feed, notify, first_id)).await,
            Err(e) => Err(e.clone()),
        };
        summaries.push(result);
    }
    let missed = |r: &Result<(Summary, usize), String>| match r {
        Ok((_, 0)) => String::new(),
        Ok((_, n)) => format!(", {n} events never seen"),
        Err(_) => String::new(),
    };
    let notes = format!("{}{}", missed(&summaries[0]), missed(&summaries[1]));
    for (label, percentile, goal) in [("p50", 50, Goal::None), ("p99", 99, Goal::AtMost(10.0))] {
        let name = format!(
            "3 commit to consumer {label}, NOTIFY long-poll vs polling every {} ms{notes}",
            POLL.as_millis()
        );
        let pick = |s: &Summary| if percentile == 50 { s.p50 } else { s.p99 };
        figures.push(match (&summaries[0], &summaries[1]) {
            (Ok((notify, _)), Ok((poll, _))) => {
                Figure::measured(name, "ms", pick(notify), pick(poll), goal)
            }
            (Err(e), _) | (_, Err(e)) => Figure::failed(name, goal, e),
        });
    }

    let name4 = |writers: usize| {
        let plural = if writers == 1 { "" } else { "s" };
        format!("4 serialized writers ({writers} writer{plural}, {rows} rows a transaction)")
    };
    let goals4 = [Goal::RatioAtLeast(0.7), Goal::None];
    match bounded(limit, serialized(&bench)).await {
        Ok(rates) => {
            for ((count, (feed, bare)), goal) in [WRITERS, 1].into_iter().zip(rates).zip(goals4) {
                figures.push(Figure::measured(name4(count), "rows/s", feed, bare, goal));
            }
        }
        Err(e) => {
            for (count, goal) in [WRITERS, 1].into_iter().zip(goals4) {
                figures.push(Figure::failed(name4(count), goal, &e));
            }
        }
    }

    println!("| figure | value | baseline | ratio | goal | met |");
    println!("|---|---|---|---|---|---|");
    for figure in &figures {
        println!("{}", figure.line());
        figure.record();
    }
    println!();
    println!("baselines, in the same run, prepared statements on both sides:");
    println!("  1  `delete … returning` of the oldest page of a twin of the outbox (same rows)");
    println!("  2  `select … where ulid > $1 order by ulid limit n` over a copy of the feed table");
    println!(
        "  3  the same reader polling every {} ms instead of LISTENing",
        POLL.as_millis()
    );
    println!("  4  the same transactions into a twin table without lock_feed, ulid(i) or trigger");
    println!("machine at end:   {}", machine::line());
    println!("{:.0} s", started.elapsed().as_secs_f64());

    let server = common_postgres::server::server();
    if let Ok(admin) = changefeed::postgres::config(&server.url_for("postgres"))
        && let Ok(admin) = changefeed::postgres::connect(&admin).await
    {
        let _ = admin
            .batch_execute(&format!("drop database {} with (force)", db.name))
            .await;
    }
}
