//! The load matrix, shared by the outbox-mode (`live_outbox_concurrency`) and
//! serialized-writer (`live_serialized`) load tests: W writers commit N events each, keyed
//! (writer, seq), while R readers, each an independent consumer, read every shard from the
//! start. Both modes promise readers the same things, so the readers and every check of
//! what they saw live here, once; how the writers commit stays with each mode's test file.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed::{Client, Cursor, Feed, FeedRow, Page, ReadOptions, read_page};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;
use ulid::Ulid;

use super::tasks::{join, join_result, spawn_bounded};
use super::{TestDb, rows};

/// The longest any one task (load writer or reader, racer) may run before the test calls it
/// stuck.
pub const TASK_LIMIT: Duration = Duration::from_secs(240);
/// Load readers must have seen every event this long after they and the writers started.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(180);
/// Small pages, so that in the load tests the readers' pages interleave with the writers.
pub const LOAD_PAGE_SIZE: u32 = 50;
/// A caught-up load reader pauses this long before it polls its shards again.
pub const IDLE_PAUSE: Duration = Duration::from_millis(5);
/// Transient errors (deadlock victim, lock timeout, dropped connection) a task tolerates
/// per call before it fails; `FeedReader::stream` would retry them too (ARCHITECTURE.md, "Layers").
pub const MAX_TRANSIENT_RETRIES: u32 = 20;

/// The key of the load tests' event tables: (writer, seq).
pub type WriterKey = (i32, i32);
/// What one reader read: the rows of each shard (indexed by shard), in the order read.
pub type ReaderLog = Vec<Vec<FeedRow<WriterKey>>>;
/// A whole feed as (shard, ulid) -> event key, to compare readers with each other and with
/// the table.
pub type FeedMap = BTreeMap<(i32, Ulid), WriterKey>;

/// One row of the load matrix.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub writers: usize,
    pub readers: usize,
    pub events_per_writer: usize,
}

impl Load {
    /// `writers` writers committing `events_per_writer` events each, read by `readers`.
    pub const fn new(writers: usize, readers: usize, events_per_writer: usize) -> Load {
        Load {
            writers,
            readers,
            events_per_writer,
        }
    }

    /// How many events the writers commit in all.
    pub const fn events(self) -> usize {
        self.writers * self.events_per_writer
    }

    /// The event table of this load on `shards` shards, e.g. `load_w10_r5_n100_s4` for the
    /// prefix `load`: a table of its own for every run, named after what runs on it.
    pub fn table(self, prefix: &str, shards: i32) -> String {
        format!(
            "{prefix}_w{}_r{}_n{}_s{shards}",
            self.writers, self.readers, self.events_per_writer
        )
    }
}

/// Runs `run_load` for `load` on 1 and on 4 shards, under both isolation settings (in
/// databases labelled `label`). With one writer and 4 shards, shards 1-3 stay empty.
pub async fn load_on_1_and_4_shards(
    label: &str,
    load: Load,
    run_load: impl AsyncFn(&TestDb, Load, i32),
) {
    super::under_both_isolations(label, async |db: &TestDb| {
        for shards in [1, 4] {
            run_load(db, load, shards).await;
        }
    })
    .await;
}

/// Declares one load test, in one line: `test_name: "label" => Load::new(w, r, n), run_load`
/// is an `#[ignore]`d test on tokio's multi-thread runtime with four workers that runs
/// `run_load` with that load by [`load_on_1_and_4_shards`].
#[allow(unused_macros)] // a test binary without load tests
macro_rules! load_test {
    ($name:ident: $label:literal => $load:expr, $run_load:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = "needs SQL Server: set CHANGEFEED_TEST_MSSQL or run Docker"]
        async fn $name() {
            $crate::common::load::load_on_1_and_4_shards($label, $load, $run_load).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use load_test;

/// One run of a load scenario: its feed, over how many shards, under which load.
pub struct LoadFeed {
    /// The feed's table, named for the load and the shards ([`Load::table`]).
    pub table: String,
    pub feed: Feed,
    pub shards: i32,
    pub load: Load,
}

/// A load scenario's start: the table `prefix` named for `load` on `shards` shards, made a
/// feed by `create` on a new admin connection; that connection and the run.
pub async fn load_feed(
    db: &TestDb,
    load: Load,
    prefix: &str,
    shards: i32,
    create: impl AsyncFnOnce(&mut Client, &str) -> Feed,
) -> (Client, LoadFeed) {
    let table = load.table(prefix, shards);
    let mut admin = db.client().await;
    let feed = create(&mut admin, &table).await;
    let run = LoadFeed {
        table,
        feed,
        shards,
        load,
    };
    (admin, run)
}

/// One load run on `feed`, whose `shards` shards the writers fill: `load.writers` writers
/// and `load.readers` readers, each on a connection of its own, all starting together once
/// every connection is open.
///
/// Writer w runs `write(client, database, feed, shard, w)` with shard `w % shards`; how it
/// commits is the mode's own. Every reader reads the whole feed with [`read_whole_feed`]
/// (all shards round-robin, pages of [`LOAD_PAGE_SIZE`], within [`LOAD_DEADLINE`]), so
/// that each is a complete consumer. Then every reader's log is checked, and that all saw
/// the same feed ([`check_all_readers`]).
///
/// Returns what each writer returned, in writer order, and the feed all readers saw.
pub async fn write_and_read<T, F, Fut>(db: &TestDb, run: &LoadFeed, write: F) -> (Vec<T>, FeedMap)
where
    T: Send + 'static,
    F: Fn(Client, String, Feed, i32, i32) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
{
    let (table, feed, shards, load) = (&run.table, &run.feed, run.shards, run.load);
    eprintln!("-- {table}: {load:?} over {shards} shard(s) in {}", db.name);
    let barrier = Arc::new(Barrier::new(load.writers + load.readers));
    let writers: Vec<_> = (0..load.writers as i32)
        .map(|writer| {
            let (database, feed, write) = (db.name.clone(), feed.clone(), write.clone());
            spawn_at_barrier(
                db,
                format!("{table}: writer {writer}"),
                &barrier,
                move |client| write(client, database, feed, writer % shards, writer),
            )
        })
        .collect();
    let options = ReadOptions::default().page_size(LOAD_PAGE_SIZE).wait_ms(0);
    let readers: Vec<_> = (0..load.readers)
        .map(|reader| {
            let (database, feed) = (db.name.clone(), feed.clone());
            spawn_at_barrier(
                db,
                format!("{table}: reader {reader}"),
                &barrier,
                move |mut client| async move {
                    read_whole_feed(
                        &mut client,
                        &database,
                        &feed,
                        shards,
                        load.events(),
                        options,
                        LOAD_DEADLINE,
                    )
                    .await
                },
            )
        })
        .collect();
    let (written, logs) = join_writers_then_readers(writers, readers).await;
    (written, check_all_readers(table, &logs, load, shards))
}

/// Spawns a task of a load run, bounded by [`TASK_LIMIT`]: it opens a connection of its own
/// to `db`, waits at `barrier` (shared by all writers and readers, so that all start
/// together once every connection is open), then runs `task` on that connection.
fn spawn_at_barrier<T, F, Fut>(
    db: &TestDb,
    what: String,
    barrier: &Arc<Barrier>,
    task: F,
) -> JoinHandle<Result<T, String>>
where
    T: Send + 'static,
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
{
    let (database, barrier) = (db.name.clone(), barrier.clone());
    spawn_bounded(what, TASK_LIMIT, async move {
        let client = super::connect_to(&database).await;
        barrier.wait().await;
        task(client).await
    })
}

/// Joins the writers, then the readers, and returns what each writer and each reader
/// returned. Writers first: when one fails, the readers would only run into their
/// deadline, so they are aborted and the writer's message fails the test.
async fn join_writers_then_readers<W>(
    writers: Vec<JoinHandle<Result<W, String>>>,
    readers: Vec<JoinHandle<Result<ReaderLog, String>>>,
) -> (Vec<W>, Vec<ReaderLog>) {
    let mut written = Vec::with_capacity(writers.len());
    for handle in writers {
        match join_result(handle).await {
            Ok(value) => written.push(value),
            Err(message) => {
                for reader in &readers {
                    reader.abort();
                }
                panic!("{message}");
            }
        }
    }
    let mut logs = Vec::with_capacity(readers.len());
    for handle in readers {
        logs.push(join(handle).await);
    }
    (written, logs)
}

/// Reads every shard round-robin from the start until `expected` rows came back, for at
/// most `within`, failing as soon as a shard returns a ULID that is not above the last one
/// read from it. Then checks that the feed has nothing more. Returns the rows per shard, in
/// the order read.
///
/// Every reader reads *all* shards, one page per shard per turn, so that each is a complete
/// consumer whose whole view can be compared with every other reader's.
pub async fn read_whole_feed(
    client: &mut Client,
    database: &str,
    feed: &Feed,
    shards: i32,
    expected: usize,
    options: ReadOptions,
    within: Duration,
) -> Result<ReaderLog, String> {
    let deadline = Instant::now() + within;
    let mut cursors = vec![Cursor::START; shards as usize];
    let mut seen: ReaderLog = vec![Vec::new(); shards as usize];
    let mut total = 0usize;
    while total < expected {
        if Instant::now() >= deadline {
            return Err(format!(
                "stuck: saw {total} of {expected} committed events within {within:?} \
                 (per shard: {:?}, cursors: {:?}); a committed event the cursor has passed is \
                 lost for good",
                seen.iter().map(Vec::len).collect::<Vec<_>>(),
                cursors.iter().map(ToString::to_string).collect::<Vec<_>>()
            ));
        }
        let mut progressed = false;
        for shard in 0..shards {
            let index = shard as usize;
            let page =
                read_retrying::<WriterKey>(client, database, feed, shard, cursors[index], options)
                    .await?;
            if page.rows.len() > options.page_size as usize {
                return Err(format!(
                    "shard {shard}: a page of {} rows for a page size of {}",
                    page.rows.len(),
                    options.page_size
                ));
            }
            for row in &page.rows {
                if let Some(last) = seen[index].last()
                    && row.ulid <= last.ulid
                {
                    return Err(format!(
                        "shard {shard}: read ulid {} ({:?}) after ulid {} ({:?}): a reader \
                         must never see a ULID below one it saw before",
                        row.ulid, row.key, last.ulid, last.key
                    ));
                }
                seen[index].push(row.clone());
            }
            progressed |= !page.rows.is_empty();
            total += page.rows.len();
            cursors[index] = page.next_cursor;
        }
        if !progressed {
            tokio::time::sleep(IDLE_PAUSE).await;
        }
    }
    // Every event was seen: the feed must hold nothing more (no late duplicate).
    for shard in 0..shards {
        let index = shard as usize;
        let page =
            read_retrying::<WriterKey>(client, database, feed, shard, cursors[index], options)
                .await?;
        if !page.rows.is_empty() {
            return Err(format!(
                "shard {shard}: after all {expected} events, the feed still returned {} more \
                 rows: {:?}",
                page.rows.len(),
                page.rows.iter().map(|row| row.key).collect::<Vec<_>>()
            ));
        }
    }
    Ok(seen)
}

/// Checks every reader's log with [`check_reader_log`], and that all readers saw one and the
/// same feed (independent consumers of one feed must). Returns that feed.
pub fn check_all_readers(table: &str, logs: &[ReaderLog], load: Load, shards: i32) -> FeedMap {
    let mut reference: Option<FeedMap> = None;
    for (reader, log) in logs.iter().enumerate() {
        let mapping = check_reader_log(table, reader, log, load, shards);
        match &reference {
            None => reference = Some(mapping),
            Some(first) => {
                if *first != mapping {
                    let differing: Vec<_> = first
                        .iter()
                        .filter(|(position, key)| mapping.get(position) != Some(key))
                        .take(5)
                        .collect();
                    panic!(
                        "{table}: reader {reader} saw another feed than reader 0 (first \
                         differences, as reader 0 saw them: {differing:?}); every consumer \
                         must see the same ulid -> key mapping per shard"
                    );
                }
            }
        }
    }
    reference.expect("at least one reader")
}

/// Checks one reader's log: ULIDs strictly increase per shard, every event comes from the
/// shard its writer wrote to, exactly once, and each writer's events in its commit order.
/// Returns the reader's (shard, ulid) -> key mapping.
pub fn check_reader_log(
    table: &str,
    reader: usize,
    log: &[Vec<FeedRow<WriterKey>>],
    load: Load,
    shards: i32,
) -> FeedMap {
    let mut mapping = BTreeMap::new();
    let mut first_seen: HashMap<WriterKey, (i32, Ulid)> = HashMap::new();
    let mut per_writer: Vec<Vec<i32>> = vec![Vec::new(); load.writers];
    for (shard, rows) in log.iter().enumerate() {
        let shard = shard as i32;
        for pair in rows.windows(2) {
            assert!(
                pair[1].ulid > pair[0].ulid,
                "{table}: reader {reader}, shard {shard}: ulid {} of {:?} is not above the \
                 previous ulid {} of {:?}: ULIDs must strictly increase in a shard",
                pair[1].ulid,
                pair[1].key,
                pair[0].ulid,
                pair[0].key
            );
        }
        for row in rows {
            let (writer, seq) = row.key;
            assert!(
                (0..load.writers as i32).contains(&writer)
                    && (0..load.events_per_writer as i32).contains(&seq),
                "{table}: reader {reader}, shard {shard}: an event nobody wrote: {:?}",
                row.key
            );
            assert_eq!(
                writer % shards,
                shard,
                "{table}: reader {reader}: event {:?} was written to shard {} but read from \
                 shard {shard}",
                row.key,
                writer % shards
            );
            if let Some((first_shard, first_ulid)) = first_seen.insert(row.key, (shard, row.ulid)) {
                panic!(
                    "{table}: reader {reader} saw event {:?} twice: at ulid {first_ulid} \
                     (shard {first_shard}) and at ulid {} (shard {shard})",
                    row.key, row.ulid
                );
            }
            per_writer[writer as usize].push(seq);
            mapping.insert((shard, row.ulid), row.key);
        }
    }
    let expected = load.events();
    if first_seen.len() != expected {
        let missing: Vec<WriterKey> = (0..load.writers as i32)
            .flat_map(|w| (0..load.events_per_writer as i32).map(move |s| (w, s)))
            .filter(|key| !first_seen.contains_key(key))
            .take(10)
            .collect();
        panic!(
            "{table}: reader {reader} saw {} distinct events of {expected} committed; \
             missing (first 10): {missing:?}",
            first_seen.len()
        );
    }
    let in_order: Vec<i32> = (0..load.events_per_writer as i32).collect();
    for (writer, seqs) in per_writer.iter().enumerate() {
        if *seqs != in_order {
            let first_wrong = seqs
                .iter()
                .zip(&in_order)
                .position(|(seen, wanted)| seen != wanted);
            panic!(
                "{table}: reader {reader} saw writer {writer}'s events out of commit order \
                 (first difference at position {first_wrong:?}: {:?}); each of them \
                 committed before the next began, so the feed must keep their order",
                first_wrong.map(|at| &seqs[at..(at + 5).min(seqs.len())])
            );
        }
    }
    mapping
}

/// The server agrees with the readers: `source` (what `sql` reads, as rows of shard, ulid,
/// writer, seq) holds exactly the `expected` committed events, with the ULIDs the readers
/// saw (`reference`, from [`check_all_readers`]).
pub async fn check_stored(
    admin: &mut Client,
    table: &str,
    source: &str,
    sql: &str,
    reference: &FeedMap,
    expected: usize,
) {
    let stored: FeedMap = rows(admin, sql)
        .await
        .unwrap_or_else(|error| panic!("{table}: read {source}: {error}"))
        .iter()
        .map(|row| {
            let shard: i32 = row.get(0).expect("the shard");
            let ulid = ulid_of(row.get::<&[u8], _>(1).expect("the ulid"));
            let key = (
                row.get::<i32, _>(2).expect("writer"),
                row.get::<i32, _>(3).expect("seq"),
            );
            ((shard, ulid), key)
        })
        .collect();
    assert_eq!(
        stored.len(),
        expected,
        "{table}: {source} holds {} events for {expected} commits",
        stored.len()
    );
    assert!(
        stored == *reference,
        "{table}: {source} differs from what the readers saw"
    );
}

/// `read_page`, retrying transient errors on a fresh connection when the old one broke.
/// A failed call returned nothing, so the same cursor is read again: no row is lost or
/// repeated.
pub async fn read_retrying<K: changefeed::row::FromRow>(
    client: &mut Client,
    database: &str,
    feed: &Feed,
    shard: i32,
    cursor: Cursor,
    options: ReadOptions,
) -> Result<Page<FeedRow<K>>, String> {
    let mut failures = 0;
    loop {
        match read_page::<K>(client, feed, shard, cursor, options).await {
            Ok(page) => return Ok(page),
            Err(error) if error.is_transient() && failures < MAX_TRANSIENT_RETRIES => {
                failures += 1;
                eprintln!("-- shard {shard}: transient read error, retrying: {error}");
                if matches!(error, changefeed::Error::Connection(_)) {
                    *client = super::connect_to(database).await;
                }
                tokio::time::sleep(Duration::from_millis(20 * u64::from(failures))).await;
            }
            Err(error) => {
                return Err(format!(
                    "read_page(shard {shard}, cursor {cursor}) failed: {error}"
                ));
            }
        }
    }
}

/// The keys of a page, in page order: what most assertions about a page compare.
pub fn keys<K: Clone>(page: &Page<FeedRow<K>>) -> Vec<K> {
    page.rows.iter().map(|row| row.key.clone()).collect()
}

/// A binary(16) ULID column's bytes as a [`Ulid`].
pub fn ulid_of(bytes: &[u8]) -> Ulid {
    Cursor::from_bytes(bytes)
        .expect("a ulid is binary(16)")
        .ulid()
}
