//! [`PoolSource`]: the real [`PageSource`], `read_feed` on a connection of a [`Pool`],
//! with long-polls that fit inside the connection's command timeout ([`effective_wait`]).

use std::marker::PhantomData;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::cursor::Cursor;
use crate::error::Result;
use crate::feed::Feed;
use crate::pool::{Pool, PooledConnection};

use super::page::{CallBounds, FeedItem, MAX_WAIT, Page, ReadOptions, read_items_within};
use super::stream::PageSource;

/// The long-poll to ask of the server on a connection whose tiberius command timeout is
/// `command_timeout`: `wait`, but no more than the timeout minus `margin`, so a long-poll
/// is never cut off by tiberius. Zero when the timeout is shorter than the margin.
pub fn effective_wait(
    wait: Duration,
    command_timeout: Option<Duration>,
    margin: Duration,
) -> Duration {
    match command_timeout {
        Some(timeout) => wait.min(timeout.saturating_sub(margin)),
        None => wait,
    }
}

/// A [`PageSource`] calling `read_feed` on a connection of a [`Pool`].
///
/// It holds one pooled connection between reads (one pool slot per running stream) and
/// lets it go on [`PageSource::reset`] or on any failure, marked broken so the pool
/// discards it. A read abandoned half-way (its future dropped) also leaves the connection
/// marked broken.
pub struct PoolSource<T> {
    pool: Pool,
    feed: Feed,
    page_size: u32,
    margin: Duration,
    conn: Option<PooledConnection>,
    item: PhantomData<fn() -> T>,
}

impl<T> PoolSource<T> {
    /// A source reading `feed` from `pool`, `page_size` rows a call, presuming a connection
    /// dead after `margin` of silence (see [`CallBounds`]); it connects on its first read.
    pub(super) fn new(pool: Pool, feed: Feed, page_size: u32, margin: Duration) -> Self {
        PoolSource {
            pool,
            feed,
            page_size,
            margin,
            conn: None,
            item: PhantomData,
        }
    }

    /// The same source reading `page_size` rows per call (the reader's own page size
    /// otherwise).
    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }

    fn discard(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.mark_broken();
        }
    }
}

impl<T> std::fmt::Debug for PoolSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolSource")
            .field("feed", &self.feed)
            .field("page_size", &self.page_size)
            .field("margin", &self.margin)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl<T: FeedItem + Send + 'static> PoolSource<T> {
    /// One `read_feed` call with a long-poll of at most `wait` (less if the connection's
    /// command timeout needs it); returns the wait it asked of the server.
    async fn call(
        &mut self,
        shard: i32,
        cursor: Cursor,
        wait: Duration,
    ) -> Result<(Page<T>, Duration)> {
        if self.conn.is_none() {
            self.conn = Some(self.pool.get_owned().await?);
        }
        let Some(conn) = self.conn.as_mut() else {
            unreachable!("the connection was just set");
        };
        let wait = effective_wait(wait, conn.command_timeout(), self.margin);
        let bounds = CallBounds {
            first: wait + self.margin,
            idle: self.margin,
        };
        let options = ReadOptions {
            page_size: self.page_size,
            wait_ms: wait.as_millis().min(MAX_WAIT.as_millis()) as u32,
        };
        // Broken until the call completes: dropped half-way, it stays marked.
        conn.set_broken(true);
        match read_items_within::<T>(conn, &self.feed, shard, cursor, options, Some(bounds)).await {
            Ok(page) => {
                conn.set_broken(false);
                Ok((page, wait))
            }
            Err(error) => {
                self.discard();
                Err(error)
            }
        }
    }
}

impl<T: FeedItem + Send + 'static> PageSource for PoolSource<T> {
    type Item = T;

    /// Calls `read_feed`. A `wait` longer than the connection allows (see
    /// [`effective_wait`]) is served as consecutive shorter long-polls on the same
    /// connection until rows come or `wait` has passed.
    async fn read(&mut self, shard: i32, cursor: Cursor, wait: Duration) -> Result<Page<T>> {
        let span = tracing::debug_span!(
            "changefeed.read",
            feed = %self.feed,
            shard,
            cursor = %cursor,
            with_event = T::WITH_EVENT,
        );
        async {
            let started = Instant::now();
            let deadline = started + wait;
            let mut calls = 0u32;
            let result = loop {
                let call_started = Instant::now();
                let remaining = deadline.saturating_duration_since(call_started);
                calls += 1;
                match self.call(shard, cursor, remaining).await {
                    // Cut short by the connection's bound, and the server did wait: go on.
                    Ok((page, asked))
                        if page.rows.is_empty()
                            && !asked.is_zero()
                            && asked < remaining
                            && call_started.elapsed() >= asked / 2 => {}
                    Ok((page, _)) => break Ok(page),
                    Err(error) => break Err(error),
                }
            };
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(page) => tracing::debug!(
                    rows = page.rows.len(),
                    full = page.is_full(),
                    wait_ms = wait.as_millis() as u64,
                    calls,
                    elapsed_ms,
                    "read_feed returned"
                ),
                Err(error) => tracing::debug!(
                    %error,
                    transient = error.is_transient(),
                    elapsed_ms,
                    "read_feed failed"
                ),
            }
            result
        }
        .instrument(span)
        .await
    }

    fn reset(&mut self) {
        self.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_wait_fits_inside_the_command_timeout() {
        let s = Duration::from_secs;
        assert_eq!(effective_wait(s(10), Some(s(30)), s(15)), s(10));
        assert_eq!(effective_wait(s(60), Some(s(30)), s(15)), s(15));
        assert_eq!(effective_wait(s(60), Some(s(10)), s(15)), Duration::ZERO);
        assert_eq!(effective_wait(s(600), None, s(15)), s(600));
    }
}
