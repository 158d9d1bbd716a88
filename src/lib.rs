//! # changefeed
//!
//! Race-safe event feeds and transactional outboxes inside Microsoft SQL Server.
//!
//! The engine is the T-SQL bundle in `sql/`, applied with [`migrations::migrate`]. A
//! migration of yours then turns an event table into a feed with
//! `exec changefeed.setup_feed @table_name = N'myservice.MyEvent', @outbox = 1`; writers
//! insert the event's key into `[changefeed].[outbox:myservice.MyEvent]` in the same
//! transaction as the event, and readers page through the feed with [`read_page`]: every
//! committed event exactly once per consumer, in an order that never changes, with a
//! cursor ([`Cursor`]) that is safe to resume from.
//!
//! [`FeedReader`] follows a shard as an endless stream of typed pages over a connection
//! [`Pool`] (server long-poll, retries on a fresh connection without loss or repeat);
//! [`CursorStore`] keeps each consumer's cursor, in its own transaction if it likes;
//! [`PooledClient::transaction`] opens that transaction with a guard ([`Transaction`]) that
//! never lets a connection go back to the pool with a transaction still open.
//!
//! This crate is a thin client: the procedures own the logic; it calls them, decodes rows
//! and keeps the ULID allocator's reference model ([`allocator`]) for tests.

/// Builder-style setters for the public fields of the option structs, each
/// `fn field(mut self, value) -> Self` with its own documentation: the structs are
/// `#[non_exhaustive]`, so users build them from `Default` with these.
macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

pub mod allocator;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod call_bound;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod claim_limits;
pub mod connection;
pub mod cursor;
pub mod cursor_store;
pub mod error;
pub mod feed;
pub mod json;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
pub mod migrations;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod outbox;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod outbox_backend;
pub mod outbox_store;
#[cfg(feature = "postgres")]
mod pg_client;
pub mod pool;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod reader;
pub mod relay;
pub mod row;
pub mod writer;

pub use connection::{Client, connect};
pub use cursor::Cursor;
pub use cursor_store::CursorStore;
pub use error::{Error, Result};
pub use feed::{Feed, TableName};
pub use pool::{Pool, PooledClient, Transaction};
pub use reader::{FeedEvent, FeedReader, FeedReaderOptions, read_events};
pub use reader::{FeedRow, Page, ReadOptions, read_page};

/// The option structs are `#[non_exhaustive]`: outside the crate no struct expression
/// builds them, so a field added later breaks no one; they are built from `Default` with
/// setters. Each of these must fail to compile:
///
/// ```compile_fail,E0639
/// let _ = changefeed::ReadOptions { ..changefeed::ReadOptions::default() };
/// ```
/// ```compile_fail,E0639
/// use changefeed::FeedReaderOptions as O;
/// let _ = O { ..O::default() };
/// ```
/// ```compile_fail,E0639
/// use changefeed::reader::ReadRetryPolicy as O;
/// let _ = O { ..O::default() };
/// ```
/// ```compile_fail,E0639
/// use changefeed::reader::IdleBackoff as O;
/// let _ = O { ..O::default() };
/// ```
/// ```compile_fail,E0639
/// use changefeed::relay::RelayConfig as O;
/// let _ = O { ..O::default() };
/// ```
/// ```compile_fail,E0639
/// use changefeed::relay::RetryPolicy as O;
/// let _ = O { ..O::default() };
/// ```
#[cfg(doctest)]
pub struct OptionStructsAreNonExhaustive;

/// README.md's Rust examples, compiled as doctests so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

// The documents under docs/ that README links to, one item each so that their Rust examples
// are compiled as doctests like README's (tests/docs.rs checks that every file is here).

/// docs/sql-server.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/sql-server.md")]
pub struct SqlServerDocDoctests;

/// docs/mariadb.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/mariadb.md")]
pub struct MariadbDocDoctests;

/// docs/postgres.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/postgres.md")]
pub struct PostgresDocDoctests;

/// docs/kafka.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/kafka.md")]
pub struct KafkaDocDoctests;

/// docs/operating.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
pub struct OperatingDocDoctests;

/// docs/testing.md's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
pub struct TestingDocDoctests;
