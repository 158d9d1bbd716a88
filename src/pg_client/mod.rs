//! The PostgreSQL client pieces the claim outbox (`postgres`) and the feed reader
//! (`reader`, `writer`, `cursor_store`) share, in a module of their own that imports
//! neither, so that no import loops through both (`tests/module_layout.rs`): `session.rs`
//! opening and driving a connection, `feed_info.rs` what `changefeed.feed_info` says of a
//! feed.

pub(crate) mod feed_info;
pub(crate) mod session;
