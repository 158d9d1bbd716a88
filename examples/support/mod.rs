//! What the examples share: a connection from CHANGEFEED_URL, or one line saying what to set,
//! and the claim outbox the relay examples start from.

pub mod private_postgres;

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

/// Applies the migrations, creates the claim outbox `table` (`schema.table`) if it is not
/// there yet and enqueues `messages` into it in one transaction: where the relay examples
/// start. Returns the outbox and a pool of two connections for the relay's store.
pub async fn outbox_with(table: &str, messages: &[NewMessage]) -> (OutboxStore, Pool) {
    let outbox: OutboxStore = table.parse().unwrap_or_else(|e| exit_with(e));
    let mut client = connect_and_migrate().await;
    // A parsed name holds no quote, so it can stand inside the N'' literal.
    let setup = format!(
        "exec changefeed.setup_outbox @table_name = N'{}';",
        outbox.table()
    );
    exec(&mut client, &setup)
        .await
        .unwrap_or_else(|e| exit_with(e));
    let pool = pool_from_env().await;
    enqueue_all(&pool, &outbox, messages)
        .await
        .unwrap_or_else(|e| exit_with(e));
    (outbox, pool)
}
