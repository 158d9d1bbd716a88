//! What the examples share: a connection from CHANGEFEED_URL, or one line saying what to set.

use changefeed::connection::{URL_VARIABLE, url_from_env};
use changefeed::outbox::NewMessage;
use changefeed::outbox_store::OutboxStore;
use changefeed::{Client, Pool};

/// Prints `error` as one line and exits with status 2 (no panic, no backtrace).
pub fn exit_with(error: impl std::fmt::Display) -> ! {
    eprintln!("error: {error}");
    std::process::exit(2)
}

/// Connects to CHANGEFEED_URL and applies the changefeed migrations.
pub async fn connect_and_migrate() -> Client {
    let url = url_from_env().unwrap_or_else(|e| exit_with(e));
    let mut client = changefeed::connect(&url)
        .await
        .unwrap_or_else(|e| exit_with(format!("{e} (check {URL_VARIABLE})")));
    changefeed::migrations::migrate(&mut client)
        .await
        .unwrap_or_else(|e| exit_with(e));
    client
}

/// Runs a batch and drains its results.
pub async fn exec(client: &mut Client, sql: &str) -> changefeed::Result<()> {
    client.simple_query(sql).await?.into_results().await?;
    Ok(())
}

/// A pool of two connections to CHANGEFEED_URL.
pub async fn pool_from_env() -> Pool {
    let url = url_from_env().unwrap_or_else(|e| exit_with(e));
    changefeed::pool::pool(&url, 2)
        .await
        .unwrap_or_else(|e| exit_with(e))
}

/// Enqueues `messages` in one transaction, opened with the pool's transaction guard: an
/// error before the commit drops the guard, and the pool closes the connection, so the
/// server rolls the transaction back.
pub async fn enqueue_all(
    pool: &Pool,
    outbox: &OutboxStore,
    messages: &[NewMessage],
) -> changefeed::Result<()> {
    let mut conn = pool.get().await?;
    let mut tx = conn.transaction().await?;
    for message in messages {
        outbox.enqueue(&mut tx, message).await?;
    }
    tx.commit().await
}
