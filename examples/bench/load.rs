//! The moving parts of the measurements: connections, SQL helpers, writer loops, drain and
//! replay loops, and the runner that starts N of them together and times them.
//!
//! Every timed loop runs on its own connection in its own tokio task (so client-side
//! decoding runs in parallel, like N real processes would), waits at a barrier until all
//! are connected and warmed up, and reports when it started and finished. A measurement's
//! elapsed time is from the earliest start to the latest finish.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use changefeed::row::Column;
use changefeed::{Client, Cursor, Feed, ReadOptions, read_page};
use futures::TryStreamExt;
use tiberius::Row;
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use ulid::Ulid;

use crate::sql::{self, PAYLOAD};

/// How long a serialized writer waits for its shard before giving up (error 51202).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Transient failures (deadlocks, lock timeouts) one loop absorbs before it gives up.
const MAX_TRANSIENT: u64 = 1000;

/// Why a measurement failed, as one line of text.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<changefeed::Error> for Failure {
    fn from(error: changefeed::Error) -> Self {
        Failure(error.to_string())
    }
}

impl From<tiberius::error::Error> for Failure {
    fn from(error: tiberius::error::Error) -> Self {
        Failure(changefeed::Error::from(error).to_string())
    }
}

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Failure(text)
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Failure(text.to_owned())
    }
}

/// A measurement's result.
pub type Outcome<T> = Result<T, Failure>;

/// A failure a loop can go on after: the statement rolled back and the connection is still
/// usable (a lost connection is not, so it fails the loop however transient it is).
fn is_transient(error: &changefeed::Error) -> bool {
    error.is_transient() && !matches!(error, changefeed::Error::Connection(_))
}

/// What every loop does with a failed call: a transient failure is counted in `transient`
/// and the loop goes on (`Ok`), until there have been more than [`MAX_TRANSIENT`]; any
/// other failure, and the transient one past that budget, ends the loop (`Err`).
pub fn absorb_transient(error: changefeed::Error, transient: &mut u64) -> Outcome<()> {
    if !is_transient(&error) {
        return Err(error.into());
    }
    *transient += 1;
    if *transient > MAX_TRANSIENT {
        return Err(Failure(format!(
            "more than {MAX_TRANSIENT} transient failures; the last: {error}"
        )));
    }
    Ok(())
}

/// All rows of the first result of a parameterized batch; a transient failure (the
/// batch rolled back, the connection still usable) is counted in `transient` (see
/// [`absorb_transient`]) and comes back as `Ok(None)`.
async fn query_rows(
    client: &mut Client,
    sql: &str,
    params: &[&dyn tiberius::ToSql],
    transient: &mut u64,
) -> Outcome<Option<Vec<Row>>> {
    let result = async {
        client
            .query(sql, params)
            .await?
            .into_first_result()
            .await
            .map_err(changefeed::Error::from)
    }
    .await;
    match result {
        Ok(rows) => Ok(Some(rows)),
        Err(error) => absorb_transient(error, transient).map(|()| None),
    }
}

// ---------------------------------------------------------------------------------------
// Connections and SQL

/// Idle connections to the benchmark database, lent to the loops of one measurement and
/// given back afterwards, so that opening connections is never timed. A loop that failed
/// drops its connection (it may be mid-transaction); the next `take` opens a new one.
pub struct Pool {
    config: tiberius::Config,
    idle: Vec<Client>,
}

impl Pool {
    /// A pool that opens connections with `config`.
    pub fn new(config: tiberius::Config) -> Pool {
        Pool {
            config,
            idle: Vec::new(),
        }
    }

    /// `n` connections: idle ones first, the rest opened concurrently.
    pub async fn take(&mut self, n: usize) -> Outcome<Vec<Client>> {
        let reuse = n.min(self.idle.len());
        let mut clients: Vec<Client> = self.idle.drain(..reuse).collect();
        let opened = futures::future::try_join_all(
            (clients.len()..n).map(|_| changefeed::connection::connect_with(self.config.clone())),
        )
        .await?;
        clients.extend(opened);
        Ok(clients)
    }

    /// Gives connections back.
    pub fn give(&mut self, clients: impl IntoIterator<Item = Client>) {
        self.idle.extend(clients);
    }

    /// Closes every idle connection.
    pub fn clear(&mut self) {
        self.idle.clear();
    }
}

/// Runs a batch without parameters and drains every result, so an error anywhere fails.
pub async fn exec(client: &mut Client, sql: &str) -> Outcome<()> {
    let mut stream = client.simple_query(sql).await?;
    while stream.try_next().await?.is_some() {}
    Ok(())
}

/// The rows of every result set of a batch without parameters.
pub async fn rows(client: &mut Client, sql: &str) -> Outcome<Vec<Row>> {
    let stream = client.simple_query(sql).await?;
    Ok(stream.into_row_stream().try_collect().await?)
}

/// An integer in column `index` of `row` (int or bigint), `None` for NULL.
pub fn integer(row: &Row, index: usize) -> Option<i64> {
    match row.try_get::<i64, usize>(index) {
        Ok(value) => value,
        Err(_) => row
            .try_get::<i32, usize>(index)
            .ok()
            .flatten()
            .map(i64::from),
    }
}

/// The first column of the first row of `sql` as an integer.
pub async fn scalar(client: &mut Client, sql: &str) -> Outcome<Option<i64>> {
    let rows = rows(client, sql).await?;
    Ok(rows.first().and_then(|row| integer(row, 0)))
}

/// A block of `count` fresh event ids (ids are unique across the whole run).
pub fn reserve_ids(ids: &AtomicI64, count: u64) -> i64 {
    ids.fetch_add(count as i64, Ordering::Relaxed)
}

/// Preloads `per_shard × shards` events into `table` and their key rows into `outbox`
/// (`shard_id, id`), exactly `per_shard` per shard, in transactions of at most 50 000
/// events. Works for a feed's outbox and for the baseline's plain outbox alike.
pub async fn preload_events(
    client: &mut Client,
    ids: &AtomicI64,
    table: &str,
    outbox: &str,
    shards: i32,
    per_shard: u64,
) -> Outcome<()> {
    const CHUNK: u64 = 50_000;
    let total = per_shard * shards as u64;
    let base = reserve_ids(ids, total);
    let sql = sql::preload_events(table, outbox);
    let mut done = 0u64;
    while done < total {
        let count = (total - done).min(CHUNK) as i64;
        let first = base + done as i64;
        client
            .execute(sql.as_str(), &[&first, &count, &shards, &base])
            .await?;
        done += count as u64;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Running loops together

/// What one loop measured, and when it ran.
#[derive(Debug)]
pub struct Timed<T> {
    /// When its timed part started (after the barrier).
    pub start: Instant,
    /// When it finished.
    pub finish: Instant,
    /// What it measured.
    pub value: T,
}

impl<T> Timed<T> {
    /// Its own elapsed time.
    pub fn elapsed(&self) -> Duration {
        self.finish.saturating_duration_since(self.start)
    }
}

/// From the earliest start to the latest finish of `results`.
pub fn span<T>(results: &[Timed<T>]) -> Duration {
    let start = results.iter().map(|r| r.start).min();
    let finish = results.iter().map(|r| r.finish).max();
    match (start, finish) {
        (Some(start), Some(finish)) => finish.saturating_duration_since(start),
        _ => Duration::ZERO,
    }
}

/// What a loop task returns: its index, its connection when it is still usable, and its
/// result.
pub type TaskResult<T> = (usize, Option<Client>, Outcome<Timed<T>>);

/// Runs `n` loops, each on a connection of `pool` in a task of its own, sharing a barrier
/// of `n` so they start together; returns their results in index order. The first
/// failure aborts the others (a loop may be waiting at the barrier for it) and is
/// returned. Usable connections go back to the pool.
pub async fn parallel<T, F, Fut>(pool: &mut Pool, n: usize, task: F) -> Outcome<Vec<Timed<T>>>
where
    T: Send + 'static,
    F: Fn(usize, Client, Arc<Barrier>) -> Fut,
    Fut: Future<Output = TaskResult<T>> + Send + 'static,
{
    let clients = pool.take(n).await?;
    let barrier = Arc::new(Barrier::new(n));
    let mut set = JoinSet::new();
    for (index, client) in clients.into_iter().enumerate() {
        set.spawn(task(index, client, Arc::clone(&barrier)));
    }
    let mut results: Vec<(usize, Timed<T>)> = Vec::with_capacity(n);
    let mut failure: Option<Failure> = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((index, client, outcome)) => {
                pool.give(client);
                match outcome {
                    Ok(timed) => results.push((index, timed)),
                    Err(error) => {
                        if failure.is_none() {
                            failure = Some(Failure(format!("loop {index}: {error}")));
                        }
                        set.abort_all();
                    }
                }
            }
            Err(error) if error.is_cancelled() => {}
            Err(error) => {
                if failure.is_none() {
                    failure = Some(Failure(format!("a loop panicked: {error}")));
                }
                set.abort_all();
            }
        }
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    results.sort_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, timed)| timed).collect())
}

/// Waits at `barrier` until every loop is ready, then runs `work` on the clock: what it
/// measured, and when it started and finished.
pub async fn timed<T>(
    barrier: &Barrier,
    work: impl Future<Output = Outcome<T>>,
) -> Outcome<Timed<T>> {
    barrier.wait().await;
    let start = Instant::now();
    let value = work.await?;
    Ok(Timed {
        start,
        finish: Instant::now(),
        value,
    })
}

/// Wraps a loop's result with its connection: kept when the loop succeeded, dropped when
/// it failed (it may be mid-transaction or out of sync).
pub fn finish<T>(index: usize, client: Client, outcome: Outcome<Timed<T>>) -> TaskResult<T> {
    match outcome {
        Ok(timed) => (index, Some(client), Ok(timed)),
        Err(error) => (index, None, Err(error)),
    }
}

// ---------------------------------------------------------------------------------------
// Writers

/// One kind of business transaction, with one event each.
pub enum Tx {
    /// A server-side batch with parameters `@P1` id and `@P2` payload (figure 1's
    /// baseline, figure 5's serialized batch).
    Batch(String),
    /// A server-side batch with `@P1` id, `@P2` payload and `@P3` shard (figure 1's event
    /// plus outbox row).
    BatchWithShard(String),
    /// A server-side batch with `@P1` id, `@P2` payload and `@P3` a ULID made on the
    /// client (figure 5's baseline).
    BatchWithUlid(String),
    /// A client-side transaction: `begin transaction`, `writer::lock_feed`, the insert
    /// (`@P1` id, `@P2` ULID, `@P3` payload), `commit` — one round trip each.
    ClientLocked {
        /// The serialized-writer feed.
        feed: Feed,
        /// The insert.
        insert: String,
    },
    /// The same client-side transaction without `lock_feed`; the ULID is made on the
    /// client.
    ClientPlain {
        /// The insert.
        insert: String,
    },
}

async fn client_transaction(
    client: &mut Client,
    id: i64,
    locked: Option<&Feed>,
    insert: &str,
) -> changefeed::Result<()> {
    client
        .simple_query("begin transaction")
        .await?
        .into_results()
        .await?;
    let ulid = match locked {
        Some(feed) => changefeed::writer::lock_feed(client, feed, 0, None, Some(LOCK_TIMEOUT))
            .await?
            .first(),
        None => Ulid::generate(),
    };
    let bytes = ulid.to_bytes();
    client
        .execute(insert, &[&id, &&bytes[..], &PAYLOAD])
        .await?;
    client
        .simple_query("commit transaction")
        .await?
        .into_results()
        .await?;
    Ok(())
}

impl Tx {
    /// Runs one transaction writing event `id` on `shard`.
    pub async fn run(&self, client: &mut Client, id: i64, shard: i32) -> changefeed::Result<()> {
        match self {
            Tx::Batch(sql) => {
                client.execute(sql.as_str(), &[&id, &PAYLOAD]).await?;
            }
            Tx::BatchWithShard(sql) => {
                client
                    .execute(sql.as_str(), &[&id, &PAYLOAD, &shard])
                    .await?;
            }
            Tx::BatchWithUlid(sql) => {
                let bytes = Ulid::generate().to_bytes();
                client
                    .execute(sql.as_str(), &[&id, &PAYLOAD, &&bytes[..]])
                    .await?;
            }
            Tx::ClientLocked { feed, insert } => {
                let result = client_transaction(client, id, Some(feed), insert).await;
                if result.is_err() {
                    let _ = client
                        .simple_query("if @@trancount > 0 rollback transaction")
                        .await;
                }
                result?;
            }
            Tx::ClientPlain { insert } => {
                let result = client_transaction(client, id, None, insert).await;
                if result.is_err() {
                    let _ = client
                        .simple_query("if @@trancount > 0 rollback transaction")
                        .await;
                }
                result?;
            }
        }
        Ok(())
    }
}

/// How a group of writers writes.
pub struct WriteSpec {
    /// The transaction each writer repeats.
    pub tx: Tx,
    /// Events go to shards 0..shards, round robin.
    pub shards: i32,
    /// Untimed writing before the barrier.
    pub warmup: Duration,
    /// Timed writing after it.
    pub duration: Duration,
    /// With `Some`, each writer starts one transaction per period (figure 4's pace);
    /// `None` writes back to back.
    pub period: Option<Duration>,
    /// Whether to log each committed event's id and commit time (figure 4).
    pub record: bool,
}

/// What one writer did in its timed part.
#[derive(Debug, Default)]
pub struct Written {
    /// Transactions committed.
    pub commits: u64,
    /// Transient failures absorbed (the transaction was not retried; the next one runs).
    pub transient: u64,
    /// With `record`: each committed event's id and the instant its commit returned.
    pub log: Vec<(i64, Instant)>,
}

/// One writer: warm up, wait for the others, then write until the duration is over.
pub async fn write_loop(
    index: usize,
    writers: usize,
    mut client: Client,
    spec: Arc<WriteSpec>,
    ids: Arc<AtomicI64>,
    barrier: Arc<Barrier>,
) -> TaskResult<Written> {
    let outcome = write_timed(index, writers, &mut client, &spec, &ids, &barrier).await;
    finish(index, client, outcome)
}

/// One transaction of a writer: `Some(id)` when it committed, `None` after a transient
/// failure (counted in `transient`; the next transaction goes on).
async fn write_one(
    client: &mut Client,
    spec: &WriteSpec,
    ids: &AtomicI64,
    k: &mut i64,
    transient: &mut u64,
) -> Outcome<Option<i64>> {
    let id = reserve_ids(ids, 1);
    let shard = (*k % i64::from(spec.shards.max(1))) as i32;
    *k += 1;
    match spec.tx.run(client, id, shard).await {
        Ok(()) => Ok(Some(id)),
        Err(error) => absorb_transient(error, transient).map(|()| None),
    }
}

async fn write_timed(
    index: usize,
    writers: usize,
    client: &mut Client,
    spec: &WriteSpec,
    ids: &AtomicI64,
    barrier: &Barrier,
) -> Outcome<Timed<Written>> {
    // Writer i starts at shard i, so writers spread over the shards from the first event.
    let mut k = index as i64;
    let mut warmup_transient = 0u64;
    let warm_until = Instant::now() + spec.warmup;
    while Instant::now() < warm_until {
        write_one(client, spec, ids, &mut k, &mut warmup_transient).await?;
    }

    barrier.wait().await;
    let start = Instant::now();
    let deadline = start + spec.duration;
    let mut pace = spec.period.map(|period| {
        // Writers start their periods staggered, so they do not all commit at once.
        let offset = period.mul_f64(index as f64 / writers.max(1) as f64);
        let mut interval =
            tokio::time::interval_at(tokio::time::Instant::from_std(start + offset), period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    });
    let mut written = Written::default();
    loop {
        if let Some(interval) = pace.as_mut() {
            interval.tick().await;
        }
        if Instant::now() >= deadline {
            break;
        }
        if let Some(id) = write_one(client, spec, ids, &mut k, &mut written.transient).await? {
            written.commits += 1;
            if spec.record {
                // The client's clock right after the commit returned: the consumer's
                // clock is the same process's Instant, so there is no clock skew.
                written.log.push((id, Instant::now()));
            }
        }
    }
    Ok(Timed {
        start,
        finish: Instant::now(),
        value: written,
    })
}

// ---------------------------------------------------------------------------------------
// Readers

/// Reads shard `shard` of `feed` with `read_page` from `cursor` on, until `expected` rows
/// came back: figure 2's first read (the rows are in the outbox, so every call moves a
/// page of them into the feed) and figure 3's replay (the rows are in the feed already).
#[allow(clippy::too_many_arguments)]
pub async fn read_feed_loop(
    index: usize,
    mut client: Client,
    feed: Feed,
    shard: i32,
    cursor: Cursor,
    page_size: u32,
    expected: u64,
    barrier: Arc<Barrier>,
) -> TaskResult<u64> {
    let outcome = timed(&barrier, async {
        let mut cursor = cursor;
        let mut seen = 0u64;
        let mut empty = 0u32;
        let mut transient = 0u64;
        let options = ReadOptions::default().page_size(page_size);
        while seen < expected {
            match read_page::<i64>(&mut client, &feed, shard, cursor, options).await {
                Ok(page) => {
                    if page.rows.is_empty() {
                        // Nothing else writes to this shard now: an empty page before
                        // `expected` rows means they are not there.
                        empty += 1;
                        if empty > 3 {
                            return Err(Failure(format!(
                                "shard {shard}: read_feed returned {seen} of {expected} rows, \
                                 then empty pages"
                            )));
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    seen += page.rows.len() as u64;
                    cursor = page.next_cursor;
                }
                Err(error) => absorb_transient(error, &mut transient)?,
            }
        }
        Ok(seen)
    })
    .await;
    finish(index, client, outcome)
}

/// The baselines of figures 2 and 3: plain statements that page through a shard the same
/// way.
#[derive(Clone, Copy)]
pub enum PlainRead {
    /// Figure 2's `plain_drain_sql (@shard, @page)`: deletes what it returns, so every
    /// page is new.
    Drain,
    /// Figure 3's `plain_replay_sql (@page, @shard, @after)`, from the start: pages on by
    /// the last ULID returned.
    Replay,
}

/// Figures 2 and 3's baseline loop: runs `read`'s `sql` on shard `shard`, `page_size` rows
/// a call, until `expected` rows came back, decoding them like read_page decodes its rows
/// so that the client does the same work.
#[allow(clippy::too_many_arguments)]
pub async fn plain_read_loop(
    index: usize,
    mut client: Client,
    read: PlainRead,
    sql: Arc<String>,
    shard: i32,
    page_size: u32,
    expected: u64,
    barrier: Arc<Barrier>,
) -> TaskResult<u64> {
    let outcome = timed(&barrier, async {
        let mut seen = 0u64;
        let mut cursor = [0u8; 16];
        let mut transient = 0u64;
        let page = page_size as i32;
        while seen < expected {
            let rows = match read {
                PlainRead::Drain => {
                    query_rows(&mut client, &sql, &[&shard, &page], &mut transient).await?
                }
                PlainRead::Replay => {
                    query_rows(
                        &mut client,
                        &sql,
                        &[&page, &shard, &&cursor[..]],
                        &mut transient,
                    )
                    .await?
                }
            };
            let Some(rows) = rows else {
                continue;
            };
            if rows.is_empty() {
                let statement = match read {
                    PlainRead::Drain => "drain",
                    PlainRead::Replay => "select",
                };
                return Err(Failure(format!(
                    "shard {shard}: the plain {statement} returned {seen} of {expected} rows"
                )));
            }
            seen += match read {
                PlainRead::Drain => {
                    let mut decoded = Vec::with_capacity(rows.len());
                    for row in &rows {
                        decoded.push((i64::column(row, 0)?, i64::column(row, 1)?));
                    }
                    decoded.len()
                }
                PlainRead::Replay => {
                    let mut decoded = Vec::with_capacity(rows.len());
                    for row in &rows {
                        decoded.push((Ulid::column(row, 0)?, i64::column(row, 1)?));
                    }
                    if let Some((last, _)) = decoded.last() {
                        cursor = last.to_bytes();
                    }
                    decoded.len()
                }
            } as u64;
        }
        Ok(seen)
    })
    .await;
    finish(index, client, outcome)
}

/// How figure 4's consumers wait when they are caught up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// `read_feed` with `@wait_ms`: the server holds the call until rows come.
    LongPoll {
        /// `@wait_ms`.
        wait_ms: u32,
    },
    /// `read_feed` with `@wait_ms = 0`, and a client sleep after a page that is not full.
    Polling {
        /// The sleep.
        sleep: Duration,
    },
}

/// Figure 4's consumer: follows shard 0 of `feed` from the start, logging each event's id
/// with the instant its page came back, until it has seen as many events as `expected`
/// says (sent once the writers are done) or `give_up` passes after that.
pub async fn consume_loop(
    mut client: Client,
    feed: Feed,
    waiting: Waiting,
    mut expected: tokio::sync::watch::Receiver<Option<u64>>,
    give_up: Duration,
) -> (Option<Client>, Outcome<Vec<(i64, Instant)>>) {
    let outcome = async {
        let mut cursor = Cursor::START;
        let mut log: Vec<(i64, Instant)> = Vec::new();
        let mut transient = 0u64;
        let mut deadline: Option<Instant> = None;
        let page_size = 1000;
        loop {
            let target = *expected.borrow_and_update();
            if let Some(target) = target {
                if log.len() as u64 >= target {
                    return Ok(log);
                }
                let deadline = *deadline.get_or_insert_with(|| Instant::now() + give_up);
                if Instant::now() >= deadline {
                    return Err(Failure(format!(
                        "the consumer saw {} of {target} events within {give_up:?} after the \
                         writers stopped",
                        log.len()
                    )));
                }
            }
            let wait_ms = match waiting {
                Waiting::LongPoll { wait_ms } => wait_ms,
                Waiting::Polling { .. } => 0,
            };
            let options = ReadOptions::default().page_size(page_size).wait_ms(wait_ms);
            match read_page::<i64>(&mut client, &feed, 0, cursor, options).await {
                Ok(page) => {
                    let seen_at = Instant::now();
                    log.extend(page.rows.iter().map(|row| (row.key, seen_at)));
                    cursor = page.next_cursor;
                    if let Waiting::Polling { sleep } = waiting
                        && !page.is_full()
                    {
                        tokio::time::sleep(sleep).await;
                    }
                }
                Err(error) => absorb_transient(error, &mut transient)?,
            }
        }
    }
    .await;
    match outcome {
        Ok(log) => (Some(client), Ok(log)),
        Err(error) => (None, Err(error)),
    }
}
