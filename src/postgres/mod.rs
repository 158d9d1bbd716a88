//! The claim outbox on PostgreSQL (feature `postgres`): the same [`ClaimStore`] contract
//! as on SQL Server and MariaDB/MySQL, so a [`Relay`] runs unchanged on any of them, plus a
//! [`PostgresWaker`] that wakes the relay from `LISTEN`/`NOTIFY` instead of polling.
//!
//! * [`migrate`] applies the bundle in `postgres/` (the schema `changefeed` and its
//!   functions); your own migration then creates an outbox table with
//!   `select changefeed.setup_outbox('public.outbox');` (or [`setup_outbox`] from Rust).
//! * [`enqueue`] inserts a message inside your transaction.
//! * [`PostgresOutboxStore`] claims, acknowledges and purges, for a [`Relay`].
//! * [`PostgresWaker`] listens on the outbox's channel and wakes the relay when an
//!   enqueuing transaction commits, polling when it cannot listen.
//!
//! Tested on PostgreSQL 15. Expected to work on 13 and later: everything the bundle and the
//! store use exists from PostgreSQL 11 on (`hashtextextended`, `create trigger … execute
//! function`; `FOR UPDATE SKIP LOCKED` is older still). Releases before 13 are out of the
//! PostgreSQL project's support and untested here, so nothing is promised for them.
//!
//! [`ClaimStore`]: crate::outbox::ClaimStore
//! [`Relay`]: crate::relay::Relay

mod backlog;
mod claim;
mod connection;
mod migrations;
mod prepared;
mod store;
mod table;
mod waker;

pub use backlog::{backlog, backlog_query};
pub use connection::{
    CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, STATEMENT_TIMEOUT, config, connect, server_version,
};
pub use migrations::{HISTORY_TABLE, bundle, migrate, runner, setup_outbox};
pub use store::{PostgresOutboxStore, enqueue};
pub use table::{MAX_OUTBOX_NAME, MAX_TABLE_NAME, OutboxTable};
pub use waker::{PostgresWaker, PostgresWakerConfig, WakerState};
