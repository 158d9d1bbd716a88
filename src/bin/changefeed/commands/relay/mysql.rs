//! `changefeed relay` with a `mysql://` `--url`: the claim outbox on MariaDB/MySQL, woken
//! by the binlog. A child of `relay`, whose targets, progress line and signals it shares.

use super::RelayArgs;
use crate::database::Connect;
use crate::endpoints::Endpoints;
use crate::failure::Failure;

/// `relay` with a `mysql://` URL: the outbox table must exist; then the relay runs with
/// the binlog wake.
#[cfg(feature = "mysql")]
pub async fn relay(
    connect: &Connect,
    args: RelayArgs,
    endpoints: Option<Endpoints>,
) -> Result<(), Failure> {
    use std::time::Duration;

    use changefeed::Error;
    use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, OutboxTable};
    use changefeed::relay::RelayHandle;

    use super::{Monitor, Waker, config, run, target};
    use crate::database::open_mysql;
    use mysql_async::prelude::Queryable;

    let usage = |e: Error| Failure::usage(e.to_string());
    let table: OutboxTable = args.outbox.parse().map_err(usage)?;
    let target = target(&args).await?;
    let (opts, mut conn) = open_mysql(connect).await?;
    {
        // As for SQL Server: one connection, and the table must be there.
        let found: Option<i64> = conn
            .exec_first(
                "select count(*) from information_schema.tables \
                 where table_schema = database() and table_name = ?",
                (table.name(),),
            )
            .await
            .map_err(|error| Failure::run(Error::from(error).to_string()))?;
        conn.disconnect().await.ok();
        if found.unwrap_or(0) == 0 {
            return Err(Failure::run(format!(
                "{} is not a table of database {} on MariaDB/MySQL; create the outbox with \
                 call changefeed_setup_outbox('{}') (or check the database in --url)",
                table.name(),
                opts.db_name().unwrap_or_default(),
                table.name()
            )));
        }
    }
    let store = MysqlOutboxStore::new(table.clone(), opts.clone()).connect_timeout(connect.timeout);
    let backlog =
        MysqlOutboxStore::new(table.clone(), opts.clone()).connect_timeout(connect.timeout);
    let monitor = Monitor::new(endpoints, backlog, &args);
    // The binlog wakes the relay; its own poll is the safety net behind the waker's.
    let config = config(&args).poll_interval(Duration::from_secs(5));
    let start = |handle: RelayHandle| {
        let waker_config = BinlogWakerConfig {
            connect_timeout: connect.timeout,
            ..BinlogWakerConfig::default()
        };
        let waker = BinlogWaker::new(opts, table, handle, waker_config);
        Waker::spawn(|stopped| {
            waker.run(async {
                let _ = stopped.await;
            })
        })
    };
    let how = " (woken by the binlog, polling when it cannot be followed)";
    run(store, target, config, &args, how, monitor, start).await
}

#[cfg(not(feature = "mysql"))]
pub async fn relay(
    _connect: &Connect,
    _args: RelayArgs,
    _endpoints: Option<Endpoints>,
) -> Result<(), Failure> {
    Err(Failure::usage(
        "this changefeed was built without MariaDB/MySQL support; build it with \
         --features cli,mysql to relay from a mysql:// URL",
    ))
}
