//! The stream state machine of `changefeed::reader` against a fake page source, in tokio's
//! paused (virtual) time: no server, no real sleeping.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use changefeed::reader::{
    FeedReaderOptions, FeedRow, IdleBackoff, Page, PageSource, ReadRetryPolicy, Wait, merge_shards,
    page_stream,
};
use changefeed::{Cursor, Error};
use futures::{Stream, StreamExt};
use proptest::prelude::*;
use rand::SeedableRng;
use tokio::time::Instant;
use ulid::Ulid;

#[path = "../examples/support/fake_page.rs"]
mod fake_page;

use fake_page::page_after;

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

// ---------------------------------------------------------------------------------------
// The fake

/// How an injected failure looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Deadlock,
    LockTimeout,
    ShardLockNotGranted,
    ConnectionReset,
    Timeout,
    AzureUnavailable,
    MissingProcedure,
    PermissionDenied,
    BadArguments,
    CursorExpired,
    Decode,
}

impl Failure {
    const TRANSIENT: [Failure; 6] = [
        Failure::Deadlock,
        Failure::LockTimeout,
        Failure::ShardLockNotGranted,
        Failure::ConnectionReset,
        Failure::Timeout,
        Failure::AzureUnavailable,
    ];

    fn error(self) -> Error {
        let server = |number: u32| Error::Server {
            number,
            state: 1,
            class: 16,
            message: format!("fake error {number}"),
        };
        match self {
            Failure::Deadlock => server(1205),
            Failure::LockTimeout => server(1222),
            Failure::ShardLockNotGranted => server(51103),
            Failure::ConnectionReset => {
                Error::Connection("connection reset by peer (os error 104)".into())
            }
            Failure::Timeout => Error::Connection("read_feed did not answer in time".into()),
            Failure::AzureUnavailable => server(40613),
            Failure::MissingProcedure => server(2812),
            Failure::PermissionDenied => server(229),
            Failure::BadArguments => server(51101),
            Failure::CursorExpired => Error::from_server(51104, 1, 16, "purged".into()),
            Failure::Decode => Error::Decode {
                column: "id (position 1)".into(),
                reason: "expected int".into(),
                row: None,
            },
        }
    }
}

/// One call the fake saw.
#[derive(Clone, Debug)]
enum Event {
    Read {
        at: Duration,
        cursor: Cursor,
        wait: Duration,
    },
    Reset {
        at: Duration,
    },
}

#[derive(Default)]
struct Shared {
    calls: AtomicUsize,
    resets: AtomicUsize,
    failures_injected: AtomicUsize,
    dropped: AtomicBool,
    events: Mutex<Vec<Event>>,
}

impl Shared {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn resets(&self) -> usize {
        self.resets.load(Ordering::SeqCst)
    }

    fn reads(&self) -> Vec<(Duration, Cursor, Duration)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|event| match event {
                Event::Read { at, cursor, wait } => Some((*at, *cursor, *wait)),
                Event::Reset { .. } => None,
            })
            .collect()
    }
}

/// A shard whose rows become visible at given (virtual) times, in ULID order, like a feed:
/// append-only, a row never appears before one with a smaller ULID.
struct Fake {
    /// (visible after, ulid, key), sorted by ulid with non-decreasing times.
    rows: Vec<(Duration, Ulid, u64)>,
    page_size: u32,
    /// Call number (0-based) → the failure that call returns.
    failures: HashMap<usize, Failure>,
    /// Whether a read with nothing to return waits for rows up to `wait` (long-poll).
    honours_wait: bool,
    start: Instant,
    shared: Arc<Shared>,
}

impl Fake {
    fn new(rows: Vec<(Duration, Ulid, u64)>, page_size: u32) -> Self {
        Fake {
            rows,
            page_size,
            failures: HashMap::new(),
            honours_wait: true,
            start: Instant::now(),
            shared: Arc::new(Shared::default()),
        }
    }

    fn failing(mut self, failures: impl IntoIterator<Item = (usize, Failure)>) -> Self {
        self.failures.extend(failures);
        self
    }

    fn ignoring_wait(mut self) -> Self {
        self.honours_wait = false;
        self
    }

    fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    fn visible_after(&self, cursor: Cursor, now: Duration) -> Vec<FeedRow<u64>> {
        self.rows
            .iter()
            .filter(|(at, ulid, _)| *at <= now && Cursor::from_ulid(*ulid) > cursor)
            .take(self.page_size as usize)
            .map(|(_, ulid, key)| FeedRow {
                ulid: *ulid,
                key: *key,
            })
            .collect()
    }

    fn next_visible_at(&self, cursor: Cursor, now: Duration) -> Option<Duration> {
        self.rows
            .iter()
            .find(|(at, ulid, _)| *at > now && Cursor::from_ulid(*ulid) > cursor)
            .map(|(at, _, _)| *at)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
    }
}

impl PageSource for Fake {
    type Item = FeedRow<u64>;

    async fn read(
        &mut self,
        _shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> changefeed::Result<Page<FeedRow<u64>>> {
        let call = self.shared.calls.fetch_add(1, Ordering::SeqCst);
        let at = self.start.elapsed();
        // A busy loop would spin without ever letting virtual time advance (the tests would
        // hang, not fail): fail it here instead.
        let reads_at_this_instant = self
            .shared
            .events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take_while(|event| matches!(event, Event::Read { at: then, .. } if *then == at))
            .count();
        assert!(
            reads_at_this_instant < 200,
            "busy loop: 200 reads at {at:?} without a pause"
        );
        tokio::task::yield_now().await;
        self.shared
            .events
            .lock()
            .unwrap()
            .push(Event::Read { at, cursor, wait });
        if let Some(failure) = self.failures.get(&call) {
            self.shared.failures_injected.fetch_add(1, Ordering::SeqCst);
            return Err(failure.error());
        }
        let deadline = at
            + if self.honours_wait {
                wait
            } else {
                Duration::ZERO
            };
        let rows = loop {
            let now = self.start.elapsed();
            let rows = self.visible_after(cursor, now);
            if !rows.is_empty() || now >= deadline {
                break rows;
            }
            let until = self
                .next_visible_at(cursor, now)
                .map_or(deadline, |at| at.min(deadline));
            tokio::time::sleep_until(self.start + until).await;
        };
        Ok(page_after(cursor, rows, self.page_size, |row| row.ulid))
    }

    fn reset(&mut self) {
        self.shared.resets.fetch_add(1, Ordering::SeqCst);
        let at = self.start.elapsed();
        self.shared.events.lock().unwrap().push(Event::Reset { at });
    }
}

/// `count` rows, all visible from the start.
fn rows_now(count: u64) -> Vec<(Duration, Ulid, u64)> {
    (0..count)
        .map(|key| (Duration::ZERO, ulid_of(key), key))
        .collect()
}

fn ulid_of(key: u64) -> Ulid {
    Ulid::from_parts(1_700_000_000_000 + key, u128::from(key) * 7 + 1)
}

fn long_poll(wait: Duration) -> FeedReaderOptions {
    FeedReaderOptions::default().wait(Wait::LongPoll(wait))
}

fn client_backoff(min: Duration, max: Duration) -> FeedReaderOptions {
    FeedReaderOptions::default()
        .wait(Wait::ClientBackoff)
        .idle_backoff(IdleBackoff::default().min(min).max(max))
}

/// Collects pages until `count` rows have come (or the virtual `limit` passes).
async fn take_rows<S>(stream: &mut S, count: usize, limit: Duration) -> Vec<FeedRow<u64>>
where
    S: Stream<Item = changefeed::Result<Page<FeedRow<u64>>>> + Unpin,
{
    let mut rows = Vec::new();
    let deadline = Instant::now() + limit;
    while rows.len() < count {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(page))) => {
                assert!(!page.rows.is_empty(), "an empty page was yielded");
                rows.extend(page.rows);
            }
            Ok(Some(Err(error))) => panic!("unexpected error: {error}"),
            Ok(None) => panic!("the stream ended after {} rows", rows.len()),
            Err(_) => panic!("only {} of {count} rows within {limit:?}", rows.len()),
        }
    }
    rows
}

/// Asserts the stream yields nothing more within `time` (virtual).
async fn assert_quiet<S: Stream + Unpin>(stream: &mut S, time: Duration) {
    assert!(
        tokio::time::timeout(time, stream.next()).await.is_err(),
        "the stream yielded after it should have been caught up"
    );
}

fn keys(rows: &[FeedRow<u64>]) -> Vec<u64> {
    rows.iter().map(|row| row.key).collect()
}

// ---------------------------------------------------------------------------------------
// Pages back to back, waiting, no busy loop

#[tokio::test(start_paused = true)]
async fn full_pages_come_back_to_back_without_waiting() {
    let fake = Fake::new(rows_now(10), 3);
    let shared = fake.shared();
    let start = Instant::now();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    let mut sizes = Vec::new();
    for _ in 0..4 {
        let page = stream.next().await.unwrap().unwrap();
        sizes.push(page.rows.len());
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a full page was followed by a wait"
        );
    }
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert_eq!(shared.calls(), 4);
    let cursors: Vec<Cursor> = shared
        .reads()
        .iter()
        .map(|(_, cursor, _)| *cursor)
        .collect();
    assert_eq!(
        cursors,
        [
            Cursor::START,
            Cursor::from_ulid(ulid_of(2)),
            Cursor::from_ulid(ulid_of(5)),
            Cursor::from_ulid(ulid_of(8)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn caught_up_stream_long_polls_the_server_and_skips_empty_pages() {
    let mut rows = rows_now(2);
    rows.push((25 * SECOND, ulid_of(2), 2));
    let fake = Fake::new(rows, 10);
    let shared = fake.shared();
    let start = Instant::now();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));

    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(keys(&first.rows), [0, 1]);
    let second = stream.next().await.unwrap().unwrap();
    assert_eq!(keys(&second.rows), [2], "empty pages must not be yielded");
    assert_eq!(
        start.elapsed(),
        25 * SECOND,
        "the row is delivered when it appears"
    );

    let reads = shared.reads();
    // t=0 page [0, 1]; t=0 waits 10 s, empty; t=10 empty; t=20 returns the row at 25.
    let times: Vec<Duration> = reads.iter().map(|(at, _, _)| *at).collect();
    assert_eq!(
        times,
        [Duration::ZERO, Duration::ZERO, 10 * SECOND, 20 * SECOND]
    );
    assert!(reads.iter().all(|(_, _, wait)| *wait == 10 * SECOND));
    assert_eq!(shared.resets(), 0);
}

#[tokio::test(start_paused = true)]
async fn client_backoff_sleeps_growing_capped_pauses() {
    let fake = Fake::new(rows_now(1), 10);
    let shared = fake.shared();
    let options = client_backoff(Duration::from_millis(100), SECOND);
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    assert_eq!(keys(&stream.next().await.unwrap().unwrap().rows), [0]);
    assert_quiet(&mut stream, 10 * SECOND).await;

    let reads = shared.reads();
    assert!(
        reads.iter().all(|(_, _, wait)| wait.is_zero()),
        "no server wait"
    );
    let gaps: Vec<u128> = reads
        .windows(2)
        .map(|pair| (pair[1].0 - pair[0].0).as_millis())
        .collect();
    // A page with rows (not full): the shortest pause; then empty pages double it, capped.
    assert_eq!(&gaps[..7], [100, 100, 200, 400, 800, 1000, 1000]);
    assert!(gaps.iter().all(|gap| *gap >= 100 && *gap <= 1000));
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_is_never_a_busy_loop() {
    // Long-poll: one read per wait.
    let fake = Fake::new(Vec::new(), 100);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    assert_quiet(&mut stream, HOUR).await;
    assert!(
        (360..=362).contains(&shared.calls()),
        "{} reads",
        shared.calls()
    );

    // Client back-off: at most one read per `max` once it has grown.
    let fake = Fake::new(Vec::new(), 100);
    let shared = fake.shared();
    let options = client_backoff(Duration::from_millis(100), 5 * SECOND);
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    assert_quiet(&mut stream, HOUR).await;
    assert!(shared.calls() <= 720 + 10, "{} reads", shared.calls());

    // Long-poll asked, but the server answers at once: the client back-off takes over.
    let fake = Fake::new(Vec::new(), 100).ignoring_wait();
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    assert_quiet(&mut stream, HOUR).await;
    assert!(shared.calls() <= 720 + 10, "{} reads", shared.calls());
    let reads = shared.reads();
    assert!(
        reads.windows(2).all(|pair| pair[1].0 > pair[0].0),
        "two reads at one instant"
    );
}

#[tokio::test(start_paused = true)]
async fn a_trickle_of_rows_is_delivered_in_order_as_it_comes() {
    let rows: Vec<_> = (0..20)
        .map(|key| (Duration::from_millis(key * 700), ulid_of(key), key))
        .collect();
    for options in [
        long_poll(10 * SECOND),
        client_backoff(Duration::from_millis(50), SECOND),
    ] {
        let fake = Fake::new(rows.clone(), 4);
        let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
        let got = take_rows(&mut stream, 20, HOUR).await;
        assert_eq!(keys(&got), (0..20).collect::<Vec<_>>());
        assert_quiet(&mut stream, HOUR).await;
    }
}

// ---------------------------------------------------------------------------------------
// Failures

#[tokio::test(start_paused = true)]
async fn transient_error_then_resume_without_loss_or_repeat() {
    for failure in Failure::TRANSIENT {
        let fake = Fake::new(rows_now(10), 3).failing([(1, failure), (3, failure)]);
        let shared = fake.shared();
        let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
        let got = take_rows(&mut stream, 10, HOUR).await;
        assert_eq!(keys(&got), (0..10).collect::<Vec<_>>(), "{failure:?}");
        assert_quiet(&mut stream, HOUR).await;
        assert_eq!(shared.resets(), 2, "{failure:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_resets_the_connection_before_the_retry() {
    let fake = Fake::new(rows_now(6), 2).failing([(1, Failure::ConnectionReset)]);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    let got = take_rows(&mut stream, 6, HOUR).await;
    assert_eq!(keys(&got), [0, 1, 2, 3, 4, 5]);

    let events = shared.events.lock().unwrap().clone();
    // read (ok) · read (fails) · reset · read from the same cursor · ...
    match &events[..4] {
        [
            Event::Read { cursor: c0, .. },
            Event::Read { cursor: c1, .. },
            Event::Reset { at: reset_at },
            Event::Read {
                cursor: c2,
                at: retry_at,
                ..
            },
        ] => {
            assert_eq!(*c0, Cursor::START);
            assert_eq!(*c1, Cursor::from_ulid(ulid_of(1)));
            assert_eq!(c2, c1, "the retry resumes from the last cursor handed out");
            let ceiling = ReadRetryPolicy::default().ceiling(1);
            assert!(
                *retry_at - *reset_at <= ceiling,
                "retry after {:?}",
                *retry_at - *reset_at
            );
        }
        other => panic!("unexpected calls {other:?}"),
    }
    assert_eq!(shared.resets(), 1);
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_are_yielded_once_and_end_the_stream() {
    for failure in [
        Failure::MissingProcedure,
        Failure::PermissionDenied,
        Failure::BadArguments,
        Failure::CursorExpired,
        Failure::Decode,
    ] {
        let fake = Fake::new(rows_now(10), 3).failing([(2, failure)]);
        let shared = fake.shared();
        let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
        assert_eq!(keys(&stream.next().await.unwrap().unwrap().rows), [0, 1, 2]);
        assert_eq!(keys(&stream.next().await.unwrap().unwrap().rows), [3, 4, 5]);
        let error = stream.next().await.unwrap().unwrap_err();
        assert!(!error.is_transient());
        assert_eq!(error.to_string(), failure.error().to_string());
        assert!(
            stream.next().await.is_none(),
            "{failure:?}: the stream must end"
        );
        assert_eq!(
            shared.calls(),
            3,
            "{failure:?}: no read after a permanent error"
        );
        assert_eq!(shared.resets(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn retries_give_up_after_the_maximum_of_consecutive_failures() {
    let options = long_poll(10 * SECOND).retry(ReadRetryPolicy::default().max_retries(Some(3)));
    let failures = (1..=4).map(|call| (call, Failure::Deadlock));
    let fake = Fake::new(rows_now(10), 3).failing(failures);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    assert_eq!(keys(&stream.next().await.unwrap().unwrap().rows), [0, 1, 2]);
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(error.server_number(), Some(1205));
    assert!(stream.next().await.is_none());
    assert_eq!(
        shared.calls(),
        5,
        "one read and four failures (three retried)"
    );
    assert_eq!(shared.resets(), 4);

    // With no retries at all, the first transient error ends the stream.
    let options = long_poll(10 * SECOND).retry(ReadRetryPolicy::default().max_retries(Some(0)));
    let fake = Fake::new(rows_now(10), 3).failing([(0, Failure::ConnectionReset)]);
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    assert!(stream.next().await.unwrap().is_err());
    assert!(stream.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_successful_read_resets_the_retry_count() {
    let options = long_poll(10 * SECOND).retry(ReadRetryPolicy::default().max_retries(Some(2)));
    let failures = [1, 2, 4, 5, 7, 8].map(|call| (call, Failure::LockTimeout));
    let fake = Fake::new(rows_now(12), 3).failing(failures);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    let got = take_rows(&mut stream, 12, HOUR).await;
    assert_eq!(keys(&got), (0..12).collect::<Vec<_>>());
    assert_eq!(shared.resets(), 6);
}

#[tokio::test(start_paused = true)]
async fn retry_pauses_stay_within_the_policy_bounds() {
    let retry = ReadRetryPolicy::default()
        .initial(Duration::from_millis(100))
        .max(SECOND)
        .max_retries(None);
    let options = long_poll(10 * SECOND).retry(retry);
    let failures = (0..12).map(|call| (call, Failure::Timeout));
    let fake = Fake::new(rows_now(1), 3).failing(failures);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    let got = take_rows(&mut stream, 1, HOUR).await;
    assert_eq!(keys(&got), [0]);
    let reads = shared.reads();
    assert_eq!(reads.len(), 13);
    for (retry_number, pair) in (1..).zip(reads.windows(2)) {
        let pause = pair[1].0 - pair[0].0;
        assert!(
            pause <= retry.ceiling(retry_number),
            "retry {retry_number} waited {pause:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn invalid_options_are_an_error_first_thing() {
    let options = FeedReaderOptions::default()
        .idle_backoff(IdleBackoff::default().min(Duration::ZERO).max(SECOND));
    let fake = Fake::new(rows_now(3), 3);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
    assert!(matches!(stream.next().await, Some(Err(Error::Config(_)))));
    assert!(stream.next().await.is_none());
    assert_eq!(shared.calls(), 0);
}

// ---------------------------------------------------------------------------------------
// Dropping

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_stops_polling() {
    // Dropped between pages.
    let fake = Fake::new(rows_now(10), 3);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    stream.next().await.unwrap().unwrap();
    drop(stream);
    assert!(
        shared.dropped.load(Ordering::SeqCst),
        "the source must be dropped with it"
    );
    let calls = shared.calls();
    tokio::time::sleep(HOUR).await;
    assert_eq!(shared.calls(), calls);

    // Dropped while a long-poll is in flight (caught up, the fake is waiting).
    let fake = Fake::new(rows_now(1), 3);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    stream.next().await.unwrap().unwrap();
    assert!(
        tokio::time::timeout(3 * SECOND, stream.next())
            .await
            .is_err()
    );
    let calls = shared.calls();
    assert_eq!(calls, 2, "the second read is the long-poll in flight");
    drop(stream);
    assert!(shared.dropped.load(Ordering::SeqCst));
    tokio::time::sleep(HOUR).await;
    assert_eq!(shared.calls(), calls);

    // Dropped during a retry back-off.
    let fake = Fake::new(rows_now(10), 3).failing([(1, Failure::Deadlock)]);
    let shared = fake.shared();
    let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, long_poll(10 * SECOND)));
    stream.next().await.unwrap().unwrap();
    let mut next = stream.next();
    for _ in 0..10 {
        assert!(
            futures::poll!(&mut next).is_pending(),
            "no page before the retry"
        );
        if shared.resets() == 1 {
            break;
        }
    }
    assert_eq!(
        (shared.calls(), shared.resets()),
        (2, 1),
        "sleeping before the retry"
    );
    drop(next);
    drop(stream);
    let calls = shared.calls();
    tokio::time::sleep(HOUR).await;
    assert_eq!(shared.calls(), calls);
}

// ---------------------------------------------------------------------------------------
// Several shards

#[tokio::test(start_paused = true)]
async fn merged_shards_keep_per_shard_order() {
    let mut expected: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    let mut streams = Vec::new();
    let mut total = 0;
    for shard in 0..3i32 {
        let count = 7 + shard as u64 * 5;
        let rows: Vec<_> = (0..count)
            .map(|i| {
                let key = shard as u64 * 1000 + i;
                (
                    Duration::from_millis(i * 300 * (shard as u64 + 1)),
                    ulid_of(key),
                    key,
                )
            })
            .collect();
        expected.insert(shard, rows.iter().map(|(_, _, key)| *key).collect());
        total += count as usize;
        let fake = Fake::new(rows, 2 + shard as u32)
            .failing([(3, Failure::Deadlock), (6, Failure::ConnectionReset)]);
        streams.push((
            shard,
            page_stream(fake, shard, Cursor::START, long_poll(10 * SECOND)),
        ));
    }
    let mut merged = Box::pin(merge_shards(streams));
    let mut got: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    let mut received = 0;
    let mut order = Vec::new();
    while received < total {
        let (shard, page) = tokio::time::timeout(HOUR, merged.next())
            .await
            .expect("rows within an hour")
            .expect("the merged stream does not end");
        let page = page.unwrap();
        received += page.rows.len();
        order.push(shard);
        got.entry(shard).or_default().extend(keys(&page.rows));
    }
    assert_eq!(got, expected);
    order.dedup();
    assert!(order.len() > 3, "shards interleave: {order:?}");
    assert_quiet(&mut merged, HOUR).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_shard_ends_alone_in_the_merge() {
    let ok = Fake::new(rows_now(4), 2);
    let bad = Fake::new(rows_now(4), 2).failing([(0, Failure::PermissionDenied)]);
    let streams = vec![
        (0, page_stream(ok, 0, Cursor::START, long_poll(10 * SECOND))),
        (
            1,
            page_stream(bad, 1, Cursor::START, long_poll(10 * SECOND)),
        ),
    ];
    let mut merged = Box::pin(merge_shards(streams));
    let mut rows0 = Vec::new();
    let mut errors1 = 0;
    while rows0.len() < 4 || errors1 == 0 {
        match merged.next().await.unwrap() {
            (0, Ok(page)) => rows0.extend(keys(&page.rows)),
            (1, Err(error)) => {
                assert_eq!(error.server_number(), Some(229));
                errors1 += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(rows0, [0, 1, 2, 3]);
    assert_eq!(errors1, 1);
}

// ---------------------------------------------------------------------------------------
// Back-off arithmetic

#[test]
fn retry_ceiling_doubles_and_is_capped() {
    let policy = ReadRetryPolicy::default()
        .initial(Duration::from_millis(100))
        .max(Duration::from_secs(10))
        .max_retries(Some(20));
    let ceilings: Vec<u128> = (1..=10).map(|n| policy.ceiling(n).as_millis()).collect();
    assert_eq!(
        ceilings,
        [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
    );
    assert_eq!(policy.ceiling(0), Duration::from_millis(100));
    assert_eq!(policy.ceiling(u32::MAX), Duration::from_secs(10));
    assert!(policy.retries(20));
    assert!(!policy.retries(21));
    let forever = policy.max_retries(None);
    assert!(forever.retries(u32::MAX));
}

#[test]
fn retry_delays_use_the_whole_jitter_window_and_never_exceed_it() {
    let policy = ReadRetryPolicy::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for retry in 1..=12 {
        let ceiling = policy.ceiling(retry);
        let delays: Vec<Duration> = (0..400)
            .map(|_| policy.delay_with(retry, &mut rng))
            .collect();
        assert!(delays.iter().all(|delay| *delay <= ceiling));
        assert!(
            delays.iter().any(|delay| *delay < ceiling / 4),
            "full jitter reaches low"
        );
        assert!(
            delays.iter().any(|delay| *delay > ceiling * 3 / 4),
            "and high"
        );
    }
}

#[test]
fn idle_backoff_doubles_and_is_capped() {
    let backoff = IdleBackoff::default()
        .min(Duration::from_millis(100))
        .max(Duration::from_secs(5));
    let delays: Vec<u128> = (0..9).map(|n| backoff.delay(n).as_millis()).collect();
    assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(5));
}

#[test]
fn a_page_is_full_at_its_page_size() {
    let page = |rows: usize| Page {
        rows: vec![0u8; rows],
        next_cursor: Cursor::START,
        page_size: 3,
    };
    assert!(!page(0).is_full());
    assert!(!page(2).is_full());
    assert!(page(3).is_full());
}

// ---------------------------------------------------------------------------------------
// Properties

fn failure_strategy() -> impl proptest::strategy::Strategy<Value = Failure> {
    proptest::sample::select(Failure::TRANSIENT.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever transient failures hit whichever reads, the rows the stream yields are the
    /// feed's rows exactly: none lost, none repeated, in order; every failure is followed
    /// by a reset; afterwards the stream is quiet.
    #[test]
    fn transient_failures_never_lose_or_repeat_rows(
        row_count in 0u64..40,
        page_size in 1u32..6,
        gaps_ms in proptest::collection::vec(0u64..3000, 40),
        failures in proptest::collection::vec((0usize..60, failure_strategy()), 0..20),
        client_side in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut at = Duration::ZERO;
            let rows: Vec<_> = (0..row_count)
                .map(|key| {
                    at += Duration::from_millis(gaps_ms[key as usize]);
                    (at, ulid_of(key), key)
                })
                .collect();
            let fake = Fake::new(rows, page_size).failing(failures.iter().copied());
            let shared = fake.shared();
            let options = if client_side {
                    client_backoff(Duration::from_millis(50), 2 * SECOND)
                } else {
                    long_poll(5 * SECOND)
                };
            let options = options.retry(ReadRetryPolicy::default().max_retries(None));
            let mut stream = Box::pin(page_stream(fake, 0, Cursor::START, options));
            let got = take_rows(&mut stream, row_count as usize, 24 * HOUR).await;
            assert_eq!(keys(&got), (0..row_count).collect::<Vec<_>>());
            let ulids: Vec<Ulid> = got.iter().map(|row| row.ulid).collect();
            assert_eq!(ulids, (0..row_count).map(ulid_of).collect::<Vec<_>>());
            assert_quiet(&mut stream, HOUR).await;
            assert_eq!(shared.resets(), shared.failures_injected.load(Ordering::SeqCst));
        });
    }

    #[test]
    fn retry_delays_are_bounded(
        initial_ms in 1u64..1000,
        extra_ms in 0u64..60_000,
        retry in 0u32..100,
        seed in any::<u64>(),
    ) {
        let policy = ReadRetryPolicy::default().initial(Duration::from_millis(initial_ms)).max(Duration::from_millis(initial_ms + extra_ms)).max_retries(None);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let ceiling = policy.ceiling(retry);
        prop_assert!(ceiling >= policy.initial.min(policy.max));
        prop_assert!(ceiling <= policy.max);
        prop_assert!(policy.ceiling(retry + 1) >= ceiling);
        prop_assert!(policy.delay_with(retry, &mut rng) <= ceiling);
    }
}
