//! The claim outbox on MariaDB and MySQL (feature `mysql`): the same [`ClaimStore`] contract
//! as on SQL Server, so a [`Relay`] runs unchanged on either database, plus a
//! [`BinlogWaker`] that wakes the relay from the binary log instead of polling.
//!
//! * [`migrate`] applies the bundle in `mysql/` (stored procedures); your own migration
//!   then creates an outbox table with `CALL changefeed_setup_outbox('outbox');` (or
//!   [`setup_outbox`] from Rust).
//! * [`enqueue`] inserts a message inside your transaction.
//! * [`MysqlOutboxStore`] claims, acknowledges and purges, for a [`Relay`].
//! * [`BinlogWaker`] follows ROW binlog events and wakes the relay within about a
//!   millisecond of a commit, polling when the binlog cannot be followed.
//!
//! Tested on MariaDB 10.11; expected to work on MariaDB 10.6+ and MySQL 8.0+ (the first
//! versions with `FOR UPDATE SKIP LOCKED`).
//!
//! [`ClaimStore`]: crate::outbox::ClaimStore
//! [`Relay`]: crate::relay::Relay

mod binlog;
mod claim;
mod connection;
mod enqueue;
mod migrations;
mod store;
mod table;

pub use binlog::{BinlogWaker, BinlogWakerConfig, WakerState};
pub use connection::{
    DEFAULT_CONNECT_TIMEOUT, TCP_KEEPALIVE, connect, connect_within, opts, server_version,
};
pub use enqueue::enqueue;
pub use migrations::{HISTORY_TABLE, bundle, migrate, runner, setup_outbox};
pub use store::{MysqlOutboxStore, backlog_query};
pub use table::{MAX_TABLE_NAME, OutboxTable};
