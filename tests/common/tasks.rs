//! Bounded waits and tasks for the live tests: a blocked call fails the test with a clear
//! message instead of hanging it.

use std::future::Future;
use std::time::Duration;

use changefeed::Client;
use tokio::task::JoinHandle;

use super::{exec, scalar_i64};

/// A statement that must be refused with a permission error.
pub async fn expect_denied(client: &mut Client, sql: &str, what: &str) {
    match exec(client, sql).await {
        Ok(()) => panic!("{what}: `{sql}` succeeded; it must fail with permission error 229/230"),
        Err(error) => assert!(
            matches!(error.server_number(), Some(229 | 230)),
            "{what}: `{sql}` failed with {error}; expected permission error 229 or 230"
        ),
    }
}

/// Runs `future`, failing the test when it takes longer than `limit`.
pub async fn bounded<T>(what: &str, limit: Duration, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}: it is blocked"),
    }
}

/// Spawns `task` with a time limit: a task past it reports itself stuck.
pub fn spawn_bounded<T, F>(what: String, limit: Duration, task: F) -> JoinHandle<Result<T, String>>
where
    T: Send + 'static,
    F: Future<Output = Result<T, String>> + Send + 'static,
{
    tokio::spawn(async move {
        match tokio::time::timeout(limit, task).await {
            Ok(result) => result.map_err(|error| format!("{what}: {error}")),
            Err(_) => Err(format!(
                "{what} did not finish within {limit:?}: it is stuck"
            )),
        }
    })
}

/// The task's result; a panic in the task is re-raised here with its own message.
pub async fn join_result<T>(handle: JoinHandle<Result<T, String>>) -> Result<T, String> {
    match handle.await {
        Ok(result) => result,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(format!("task cancelled: {error}")),
    }
}

/// The task's value, or the test fails with the task's message.
pub async fn join<T>(handle: JoinHandle<Result<T, String>>) -> T {
    join_result(handle)
        .await
        .unwrap_or_else(|message| panic!("{message}"))
}

/// Closes a connection now, so the server ends its session before the login is dropped.
pub async fn close(client: Client) {
    let _ = client.close().await;
}

/// [`join`]s every task, in order, and returns their results.
pub async fn join_all<T>(handles: Vec<JoinHandle<Result<T, String>>>) -> Vec<T> {
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(join(handle).await);
    }
    results
}

/// Polls the count `sql` on `client` every 100 ms until it is 0, as rows of an ended session
/// disappear once the server has rolled it back; fails the test, naming `what` and the
/// count left, when that takes longer than `limit`.
pub async fn await_none_left(client: &mut Client, sql: &str, limit: Duration, what: &str) {
    let gone_by = std::time::Instant::now() + limit;
    loop {
        let left = scalar_i64(client, sql).await;
        if left == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < gone_by,
            "{what}: {left} rows are still there {limit:?} later"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
