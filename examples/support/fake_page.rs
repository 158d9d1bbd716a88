//! The answer of a fake [`PageSource`](changefeed::reader::PageSource), for the in-memory
//! feeds of the tests (`tests/stream.rs`) and of the Kafka exporter's tests and benchmark
//! (`memory_feed.rs`).

use changefeed::{Cursor, Page};
use ulid::Ulid;

/// The page of a read after `cursor` that found `rows` (`ulid` gives a row's ULID): its
/// next cursor is the last row's ULID, or `cursor` again when the read found nothing.
pub fn page_after<T>(
    cursor: Cursor,
    rows: Vec<T>,
    page_size: u32,
    ulid: impl Fn(&T) -> Ulid,
) -> Page<T> {
    let next_cursor = rows
        .last()
        .map_or(cursor, |row| Cursor::from_ulid(ulid(row)));
    Page {
        rows,
        next_cursor,
        page_size,
    }
}
