//! changefeed: race-safe event feeds and transactional outboxes inside SQL Server.
//!
//! The SQL bundle in `sql/` is the engine; this crate applies it and reads feeds.

pub mod allocator;
pub mod cursor;
pub mod error;
pub mod feed;
