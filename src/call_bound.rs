//! One piece: the time bound on a call to a database whose server or network may go
//! silent, shared by the MariaDB/MySQL and PostgreSQL stores (through `outbox_backend`) and
//! the PostgreSQL feed reader's session (`pg_client`). It imports nothing but the error
//! type, so that neither side's imports loop through the other.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// Runs `call` (a call to `server` named `what`) for at most `limit`. Past it the call is
/// abandoned and an [`Error::Connection`] (transient) says so: a silent server or network
/// must not hold the caller for ever, and the connection the call used is in an unknown
/// state, to be dropped by the caller and never used again.
pub(crate) async fn bounded<T>(
    server: &str,
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Connection(format!(
            "{server}: {what} did not answer within {limit:?} (server stopped, overloaded \
             or unreachable); the connection was dropped"
        ))),
    }
}
