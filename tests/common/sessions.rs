//! What a live test learns about a session from the server's views: its id, the key-range
//! locks it holds, and whether it is waiting for a lock.

use std::time::{Duration, Instant};

use changefeed::Client;

use super::scalar_i64;

/// This connection's session id (`@@spid`).
pub async fn session_id(client: &mut Client) -> i64 {
    scalar_i64(client, "select convert(bigint, @@spid);").await
}

/// Key-range locks `session` holds (`sys.dm_tran_locks`, request modes `Range…`).
pub async fn count_range_locks(client: &mut Client, session: i64) -> i64 {
    scalar_i64(
        client,
        &format!(
            "select count_big(*) from sys.dm_tran_locks \
             where request_session_id = {session} and request_mode like N'Range%';"
        ),
    )
    .await
}

/// Waits, asking on `client`, until `session` waits for a lock whose wait type matches the
/// LIKE prefix `wait_type` (`LCK[_]M[_]` for any lock, `LCK_M_RI` for an insert's range
/// check, `LCK_M_X` for an exclusive lock); fails the test, naming `what`, after `limit`.
pub async fn await_lock_wait(
    client: &mut Client,
    session: i64,
    wait_type: &str,
    limit: Duration,
    what: &str,
) {
    let deadline = Instant::now() + limit;
    let query = format!(
        "select count_big(*) from sys.dm_exec_requests \
         where session_id = {session} and wait_type like N'{wait_type}%';"
    );
    while scalar_i64(client, &query).await == 0 {
        assert!(
            Instant::now() < deadline,
            "{what}: session {session} never waited for a lock like {wait_type}% within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
