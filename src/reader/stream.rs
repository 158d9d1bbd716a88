//! The stream state machine: [`page_stream`] follows a shard over any [`PageSource`]
//! (waiting, retrying, ending on a permanent error), and [`merge_shards`] merges the
//! streams of several shards.

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

use crate::cursor::Cursor;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;

use super::options::{FeedReaderOptions, Wait};
use super::page::Page;
#[cfg(doc)]
use super::{IdleBackoff, PoolSource, ReadRetryPolicy};

/// Where a stream gets its pages: `read_feed` over a connection ([`PoolSource`]), or a fake
/// in tests.
pub trait PageSource: Send + 'static {
    /// What a page holds.
    type Item: Send + 'static;

    /// Reads the page of `shard` after `cursor`; with nothing to return, the server may
    /// wait up to `wait` for rows (zero: answer at once).
    fn read(
        &mut self,
        shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> impl Future<Output = Result<Page<Self::Item>>> + Send;

    /// Drops the current connection, if any: the next read uses a fresh one. Called after
    /// every transient failure.
    fn reset(&mut self);
}

/// The stream of pages of `shard` from `cursor` on, read from `source`.
///
/// * Full pages come back to back; a page that is not full means the stream is caught up,
///   and it waits as the options' `wait` says before the next read. It never polls
///   in a loop: after an empty page it either had the server wait (long-poll) or sleeps
///   the [`IdleBackoff`]. Empty pages are not yielded.
/// * A transient error ([`Error::is_transient`]) calls [`PageSource::reset`] and retries
///   after the [`ReadRetryPolicy`] delay, from the cursor of the last page yielded: no row
///   is lost or repeated. After `max_retries` consecutive failures the error is yielded
///   and the stream ends.
/// * Any other error (unknown feed or missing procedure 2812, permission denied 229, bad
///   arguments 51101, a cursor expired by retention 51104, decoding) is yielded once and
///   ends the stream. Invalid options are
///   yielded as an [`Error::Config`] first thing.
/// * Nothing runs in the background: the stream is a state machine polled by its consumer,
///   and dropping it stops everything at once (an in-flight read is dropped with it).
///
/// `options.page_size` and `options.timeout_margin` are the source's business; the stream
/// uses the others.
pub fn page_stream<S: PageSource>(
    mut source: S,
    shard: i32,
    cursor: Cursor,
    options: FeedReaderOptions,
) -> impl Stream<Item = Result<Page<S::Item>>> + Send + 'static {
    async_stream::stream! {
        if let Err(error) = options.validate() {
            yield Err(error);
            return;
        }
        let wait = match options.wait {
            Wait::LongPoll(wait) => wait,
            Wait::ClientBackoff => Duration::ZERO,
        };
        let mut cursor = cursor;
        let mut failures: u32 = 0;
        let mut idle_streak: u32 = 0;
        loop {
            let started = Instant::now();
            match source.read(shard, cursor, wait).await {
                Ok(page) => {
                    failures = 0;
                    let pause = if page.is_full() {
                        idle_streak = 0;
                        None
                    } else if !page.rows.is_empty() {
                        // Caught up, with rows: under long-poll the next read waits on the
                        // server; under client back-off, sleep the shortest pause.
                        idle_streak = 0;
                        wait.is_zero().then_some(options.idle_backoff.min)
                    } else if !wait.is_zero() && started.elapsed() >= wait / 2 {
                        // The server long-polled: poll again at once.
                        idle_streak = 0;
                        None
                    } else {
                        let delay = options.idle_backoff.delay(idle_streak);
                        idle_streak = idle_streak.saturating_add(1);
                        Some(delay)
                    };
                    if !page.rows.is_empty() {
                        cursor = page.next_cursor;
                        yield Ok(page);
                    }
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(error) if error.is_transient() => {
                    source.reset();
                    failures = failures.saturating_add(1);
                    if !options.retry.retries(failures) {
                        tracing::error!(
                            shard, %cursor, failures, %error,
                            "changefeed stream: giving up after consecutive transient failures"
                        );
                        yield Err(error);
                        return;
                    }
                    let delay = options.retry.delay(failures);
                    tracing::warn!(
                        shard,
                        %cursor,
                        retry = failures,
                        delay_ms = delay.as_millis() as u64,
                        %error,
                        "changefeed stream: transient failure, retrying on a fresh connection"
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    tracing::error!(
                        shard, %cursor, %error,
                        "changefeed stream: permanent failure, ending"
                    );
                    yield Err(error);
                    return;
                }
            }
        }
    }
}

/// Merges per-shard streams into one stream of `(shard, page)`; the pages of each shard
/// keep their order, shards interleave as their pages come. A shard's stream that ends
/// (after its error) leaves the others running; the merged stream ends when all have.
pub fn merge_shards<T, S, I>(streams: I) -> impl Stream<Item = (i32, Result<Page<T>>)> + Send
where
    I: IntoIterator<Item = (i32, S)>,
    S: Stream<Item = Result<Page<T>>> + Send + 'static,
    T: Send + 'static,
{
    futures::stream::select_all(
        streams
            .into_iter()
            .map(|(shard, stream)| Box::pin(stream.map(move |page| (shard, page)))),
    )
}
