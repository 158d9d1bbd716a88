//! One shard's export: pages read in order, each page's messages built while the page
//! before it is delivered (one page of read-ahead), produced only once that page is
//! delivered and saved, and each page's cursor saved in page order.

use std::pin::{Pin, pin};

use futures::future::{Either, select};
use futures::{Stream, StreamExt};

use crate::cursor::Cursor;
use crate::error::Result;
use crate::json::JsonColumns;
use crate::reader::{FeedEvent, Page, exponential};

use super::cursors::ExportCursors;
use super::delivery::Delivered;
use super::job::{Job, Stop};
use super::message::Message;

/// How many times a cursor save that fails transiently is tried again before the export
/// stops with the error.
const SAVE_RETRIES: u32 = 5;

/// A shard's pages as the exporter reads them.
type Pages = Result<Page<FeedEvent<JsonColumns>>>;

/// A page read and its messages built, waiting for its turn to be produced.
struct ReadPage {
    page: Page<FeedEvent<JsonColumns>>,
    messages: Vec<Message>,
}

impl<C: ExportCursors> Job<C> {
    /// The saved cursor of `shard`, if any.
    pub(super) async fn load(&self, shard: i32) -> Result<Option<Cursor>> {
        self.cursors.lock().await.load(shard).await
    }

    /// Exports the pages of `stream` until shutdown or an error; returns the cursor saved
    /// last.
    ///
    /// Page N+1 is read and its messages built while page N is delivered and saved, and is
    /// produced only after that: one page ahead at most, so no read is ever more than one
    /// page past the last saved cursor, and N+1 never overtakes N, however often N is
    /// produced again. When N fails or is given up, N+1 is dropped unproduced; after
    /// shutdown no page is read, and a page already read ahead is dropped the same way
    /// (the next run reads it again from the saved cursor).
    pub(super) async fn export_shard(
        &self,
        shard: i32,
        stream: impl Stream<Item = Pages>,
        mut stop: Stop,
    ) -> Result<Option<Cursor>> {
        let mut stream = pin!(stream);
        // The read-ahead watches shutdown on a receiver of its own, as the page in flight
        // holds `stop` meanwhile.
        let mut ahead_stop = stop.clone();
        let mut saved = None;
        let mut next = self
            .read_page(shard, stream.as_mut(), &mut ahead_stop)
            .await?;
        while let Some(current) = next.take() {
            let mut read_ahead = pin!(self.read_page(shard, stream.as_mut(), &mut ahead_stop));
            let mut ahead = None;
            let finished = {
                let finish = pin!(self.finish_page(shard, current, &mut stop));
                match select(finish, read_ahead.as_mut()).await {
                    Either::Left((finished, _reading)) => finished,
                    Either::Right((read, finish)) => {
                        ahead = Some(read);
                        finish.await
                    }
                }
            };
            // An error of the page in flight wins over anything read ahead.
            match finished? {
                Some(cursor) => saved = Some(cursor),
                None => break,
            }
            next = match ahead {
                // A read-ahead that failed before shutdown reports its error even now.
                Some(Err(error)) => return Err(error),
                _ if stop.is_requested() => break,
                Some(Ok(read)) => read,
                None => read_ahead.await?,
            };
        }
        Ok(saved)
    }

    /// The next page of `stream` with its messages built; `None` when shutdown is asked
    /// first (the read is abandoned) or the stream ended.
    async fn read_page(
        &self,
        shard: i32,
        mut stream: Pin<&mut impl Stream<Item = Pages>>,
        stop: &mut Stop,
    ) -> Result<Option<ReadPage>> {
        let next = tokio::select! {
            biased;
            () = stop.requested() => return Ok(None),
            next = stream.next() => next,
        };
        let mut page = match next {
            // page_stream ends only after yielding an error; a finite source may end.
            None => return Ok(None),
            Some(Err(error)) => {
                tracing::error!(
                    feed = %self.messages.feed_name, shard, %error,
                    "export: reading the feed failed"
                );
                return Err(error);
            }
            Some(Ok(page)) => page,
        };
        let messages = self.messages.of_page(shard, &mut page)?;
        Ok(Some(ReadPage { page, messages }))
    }

    /// Delivers `read` and saves its cursor: the cursor saved, or `None` when shutdown's
    /// grace passed first (nothing saved; the next run produces the page again).
    async fn finish_page(
        &self,
        shard: i32,
        read: ReadPage,
        stop: &mut Stop,
    ) -> Result<Option<Cursor>> {
        let ReadPage { page, messages } = read;
        let feed = &self.messages.feed_name;
        let cursor = page.next_cursor;
        let producing = self.metrics.produce_timer();
        let delivered = self.deliver(shard, &messages, stop).await?;
        drop(producing);
        if let Delivered::GivenUp = delivered {
            tracing::warn!(
                feed = %feed, shard, %cursor,
                "export: the page in flight was not acknowledged within the shutdown grace; \
                 not saved, the next run produces it again"
            );
            return Ok(None);
        }
        if !self.save(shard, cursor, stop).await? {
            tracing::warn!(
                feed = %feed, shard, %cursor,
                "export: the cursor of the page in flight was not saved within the shutdown \
                 grace; the next run produces the page again"
            );
            return Ok(None);
        }
        let exported = messages.len() as u64;
        self.progress.page_saved(shard, &page, exported);
        self.metrics.page_saved(shard, &page, exported);
        tracing::debug!(
            feed = %feed, shard, %cursor, rows = page.rows.len(), exported,
            "export: page acknowledged and cursor saved"
        );
        Ok(Some(cursor))
    }

    /// Saves `cursor`, trying a transient failure again a few times: `Ok(true)` once
    /// saved, `Ok(false)` when shutdown's grace passed first (the page is produced again by
    /// the next run). The store is locked for one attempt at a time, never through the
    /// back-off, so the other shards save meanwhile.
    async fn save(&self, shard: i32, cursor: Cursor, stop: &mut Stop) -> Result<bool> {
        let grace = self.config.shutdown_grace;
        let feed = &self.messages.feed_name;
        let mut failures = 0;
        loop {
            let attempt = async { self.cursors.lock().await.save(shard, cursor).await };
            let result = tokio::select! {
                result = attempt => result,
                () = stop.grace_over(grace) => return Ok(false),
            };
            match result {
                Ok(()) => return Ok(true),
                Err(error) if error.is_transient() && failures < SAVE_RETRIES => {
                    failures += 1;
                    let delay =
                        exponential(self.config.backoff_min, self.config.backoff_max, failures);
                    tracing::warn!(
                        feed = %feed, shard, %cursor, %error, retry = failures,
                        "export: saving the cursor failed, retrying"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = stop.grace_over(grace) => return Ok(false),
                    }
                }
                Err(error) => {
                    tracing::error!(
                        feed = %feed, shard, %cursor, %error,
                        "export: saving the cursor failed; its page will be produced again"
                    );
                    return Err(error);
                }
            }
        }
    }
}
