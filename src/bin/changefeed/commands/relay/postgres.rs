//! `changefeed relay` with a `postgres://` (or `postgresql://`) `--url`: the claim outbox
//! on PostgreSQL, woken by LISTEN/NOTIFY. A child of `relay`, whose targets, progress line
//! and signals it shares.

use super::RelayArgs;
use crate::database::Connect;
use crate::endpoints::Endpoints;
use crate::failure::Failure;

/// `relay` with a `postgres://` URL: the outbox must exist; then the relay runs with the
/// notify wake.
#[cfg(feature = "postgres")]
pub async fn relay(
    connect: &Connect,
    args: RelayArgs,
    endpoints: Option<Endpoints>,
) -> Result<(), Failure> {
    use std::time::Duration;

    use changefeed::Error;
    use changefeed::postgres::{
        OutboxTable, PostgresOutboxStore, PostgresWaker, PostgresWakerConfig,
    };
    use changefeed::relay::RelayHandle;

    use super::{Monitor, Waker, config, run, target};
    use crate::database::postgres::{open, settings};

    let table: OutboxTable = args
        .outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let settings = settings(connect)?;
    let target = target(&args).await?;
    {
        // As for the other stores: one connection, and the table must be there.
        let client = open(connect, &settings).await?;
        let found = client
            .query_one("select to_regclass($1) is not null", &[&table.name()])
            .await
            .map_err(|error| Failure::run(Error::from(error).to_string()))?;
        if !found.get::<_, bool>(0) {
            return Err(Failure::run(format!(
                "{table} is not a table of database {} on PostgreSQL; create the outbox \
                 with `changefeed setup-outbox {table}` (or select \
                 changefeed.setup_outbox('{table}')), or check the database in --url",
                settings.get_dbname().unwrap_or_default()
            )));
        }
    }
    let store = PostgresOutboxStore::new(table.clone(), settings.clone());
    let backlog = PostgresOutboxStore::new(table.clone(), settings.clone());
    // Notifications wake the relay; its own poll is the safety net behind the waker's.
    let config = config(&args).poll_interval(Duration::from_secs(5));
    let start = |handle: RelayHandle| {
        let waker = PostgresWaker::new(settings, table, handle, PostgresWakerConfig::default());
        Waker::spawn(|stopped| {
            waker.run(async {
                let _ = stopped.await;
            })
        })
    };
    let how = " (woken by LISTEN/NOTIFY, polling when it cannot listen)";
    let monitor = Monitor::new(endpoints, backlog, &args);
    run(store, target, config, &args, how, monitor, start).await
}

#[cfg(not(feature = "postgres"))]
pub async fn relay(
    _connect: &Connect,
    _args: RelayArgs,
    _endpoints: Option<Endpoints>,
) -> Result<(), Failure> {
    Err(Failure::without_postgres())
}
