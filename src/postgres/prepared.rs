//! The store's connection and its prepared statements: each statement is prepared on its
//! first use on a connection and kept with that connection, so a call is one round trip
//! (bind and execute) with the plan PostgreSQL cached, instead of two (parse and describe,
//! then bind and execute) and a parse and plan every time. A new connection starts with no
//! statement, so a reconnect prepares again. A statement whose plan depends on a parameter's
//! value gets a custom plan, planned again on every call: the store writes such values
//! (the claim's batch size) into the statement's text instead.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::TryStreamExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use crate::error::{Error, Result};

/// SQLSTATE 26000 `invalid_sql_statement_name`: the server no longer has the statement
/// (`DISCARD ALL` or `DEALLOCATE ALL` on the session, or a pooler in front of PostgreSQL
/// that handed the session to another server connection).
const STATEMENT_GONE: &str = "26000";
/// SQLSTATE 0A000 `feature_not_supported`, which is what PostgreSQL answers with "cached
/// plan must not change result type" when a table a prepared statement returns columns of
/// changed them (an `alter table` widening a column, say). The state is matched and not
/// the message, which depends on `lc_messages`; any other 0A000 only costs one more try.
const RESULT_TYPE_CHANGED: &str = "0A000";

/// Whether `error` says that the prepared statement a call used is no longer usable while
/// the connection is: the statement failed before it ran, so preparing it again and
/// running it once more changes nothing twice.
fn statement_is_stale(error: &Error) -> bool {
    matches!(error, Error::Postgres { state, .. }
        if state == STATEMENT_GONE || state == RESULT_TYPE_CHANGED)
}

/// What a statement answered: its rows (none for an `update` without `returning`) and how
/// many rows it changed.
pub(crate) struct Answer {
    pub(crate) rows: Vec<Row>,
    pub(crate) changed: u64,
}

/// One connection of a store and the statements prepared on it, by the store's own name
/// for each (`K`). Calls take `&self`: several may be under way at once (a claim and an
/// acknowledgement, from a store and its [concurrent
/// handle](crate::outbox::ClaimStore::concurrent_handle)), and tokio-postgres then sends
/// the second while the first runs (pipelining): the server runs them one after the other,
/// each its own transaction, with no round trip in between.
pub(crate) struct Session<K> {
    client: Client,
    /// Each statement with the text it was prepared from.
    prepared: Mutex<HashMap<K, (String, Statement)>>,
}

impl<K: Copy + Eq + Hash> Session<K> {
    /// A session over a freshly opened `client`, with nothing prepared yet.
    pub(crate) fn new(client: Client) -> Self {
        Session {
            client,
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the connection is gone (the store then opens a new session).
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Runs statement `key` with the text `sql` and `params`, prepared on its first use on
    /// this connection, and again when `key` comes with another text than the one it was
    /// prepared from (the claim's, whose batch size is part of its text): the new statement
    /// replaces the old, so a key holds one statement. When the server answers that the
    /// statement is stale ([`statement_is_stale`]), it is prepared again and runs once more;
    /// a second failure is the caller's. The caller bounds the whole in time.
    pub(crate) async fn run(
        &self,
        key: K,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Answer> {
        match self.run_once(key, sql, params).await {
            Err(error) if statement_is_stale(&error) => {
                tracing::debug!(%error, "prepared statement is stale: preparing it again");
                self.prepared().remove(&key);
                self.run_once(key, sql, params).await
            }
            answer => answer,
        }
    }

    /// One run of statement `key` (prepared first if need be): its rows and how many rows
    /// it changed, as `query` and `execute` would give them.
    async fn run_once(&self, key: K, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Answer> {
        let statement = self.statement(key, sql).await?;
        let stream = self
            .client
            .query_raw(&statement, params.iter().copied())
            .await?;
        let mut stream = std::pin::pin!(stream);
        let mut rows = Vec::new();
        while let Some(row) = stream.try_next().await? {
            rows.push(row);
        }
        let changed = stream.rows_affected().unwrap_or(0);
        Ok(Answer { rows, changed })
    }

    /// Statement `key` with the text `sql`, prepared unless this connection has it already.
    /// Two calls that find it missing at once both prepare it, and the later one is kept:
    /// either serves.
    async fn statement(&self, key: K, sql: &str) -> Result<Statement> {
        if let Some((text, statement)) = self.prepared().get(&key)
            && text == sql
        {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.prepared()
            .insert(key, (sql.to_owned(), statement.clone()));
        Ok(statement)
    }

    /// The prepared statements, for one look-up or change (never held across an await).
    fn prepared(&self) -> MutexGuard<'_, HashMap<K, (String, Statement)>> {
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn postgres(state: &str) -> Error {
        Error::Postgres {
            state: state.to_owned(),
            message: "m".to_owned(),
        }
    }

    #[test]
    fn only_a_vanished_statement_or_a_changed_result_type_is_stale() {
        assert!(statement_is_stale(&postgres("26000")));
        assert!(statement_is_stale(&postgres("0A000")));
        for other in ["40P01", "57014", "42P01", "23505", "CF306"] {
            assert!(!statement_is_stale(&postgres(other)), "{other}");
        }
        assert!(!statement_is_stale(&Error::Connection("gone".to_owned())));
    }
}
