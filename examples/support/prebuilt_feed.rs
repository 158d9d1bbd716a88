//! A page source for throughput figures that costs next to nothing: every page of every
//! shard is built once, when the pages are made (untimed), and a read hands the next one
//! over instead of copying rows out of a feed. `bench_kafka` times the exporter over it
//! against a bare producer, so the exporter's figure holds the exporter's and the
//! producer's work, not a test feed's (the in-memory feed of the tests, `memory_feed.rs`,
//! clones every row at each read, which cost the exporter's figure about a fifth).
//!
//! A read must continue where the shard's previous page ended: the pages are handed over
//! once, so a read from any other cursor (a page read twice) is an error, which the
//! benchmark reports instead of a figure.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use changefeed::json::JsonColumns;
use changefeed::reader::PageSource;
use changefeed::{Cursor, Error, FeedEvent, Page, Result};

use crate::memory_feed::FakeFeed;
use crate::memory_feed::fake_page::page_after;

/// One shard's pages not read yet, and the cursor the next read must ask for.
struct Shard {
    pages: VecDeque<Page<FeedEvent<JsonColumns>>>,
    next_read: Cursor,
}

/// Every shard's pages; clones share them (one clone is each shard's source).
#[derive(Clone)]
pub struct PrebuiltPages {
    page_size: u32,
    shards: Arc<Mutex<HashMap<i32, Shard>>>,
}

impl PrebuiltPages {
    /// The pages of `page_size` rows of every shard of `feed`, as the feed's own reads from
    /// the start would return them.
    pub fn new(feed: &FakeFeed, page_size: u32) -> Self {
        let state = feed.state.lock().unwrap_or_else(|p| p.into_inner());
        let shards = state
            .shards
            .iter()
            .map(|(&shard, events)| {
                let mut cursor = Cursor::START;
                let pages = events
                    .chunks(page_size as usize)
                    .map(|chunk| {
                        let rows = chunk
                            .iter()
                            .map(|event| FeedEvent {
                                ulid: event.ulid,
                                event: JsonColumns(event.columns.clone()),
                            })
                            .collect();
                        let page = page_after(cursor, rows, page_size, |row| row.ulid);
                        cursor = page.next_cursor;
                        page
                    })
                    .collect();
                let shard_pages = Shard {
                    pages,
                    next_read: Cursor::START,
                };
                (shard, shard_pages)
            })
            .collect();
        PrebuiltPages {
            page_size,
            shards: Arc::new(Mutex::new(shards)),
        }
    }
}

impl PageSource for PrebuiltPages {
    type Item = FeedEvent<JsonColumns>;

    async fn read(
        &mut self,
        shard: i32,
        cursor: Cursor,
        _wait: Duration,
    ) -> Result<Page<Self::Item>> {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pages) = shards.get_mut(&shard) else {
            return Ok(page_after(cursor, Vec::new(), self.page_size, |row| {
                row.ulid
            }));
        };
        if cursor != pages.next_read {
            return Err(Error::Config(format!(
                "shard {shard} read after {cursor:?}, where its next page starts after {:?}: \
                 the pre-built pages are handed over once, so a page was read twice",
                pages.next_read
            )));
        }
        let page = pages
            .pages
            .pop_front()
            .unwrap_or_else(|| page_after(cursor, Vec::new(), self.page_size, |row| row.ulid));
        pages.next_read = page.next_cursor;
        Ok(page)
    }

    /// Nothing to drop: the pages hold no connection.
    fn reset(&mut self) {}
}
