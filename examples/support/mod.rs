//! What the examples share: a connection from CHANGEFEED_URL, or one line saying what to set.

use changefeed::Client;
use changefeed::connection::{URL_VARIABLE, url_from_env};

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
