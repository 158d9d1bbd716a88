//! `changefeed relay`: a relay that prints each message as a JSON line, over SQL Server
//! (an ADO.NET `--url`) or MariaDB/MySQL (a `mysql://` `--url`, woken by the binlog).

use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::relay::{JsonLines, Relay, RelayConfig};
use changefeed::{Error, TableName};

use crate::Failure;
use crate::args::RelayArgs;

/// Whether `url` is for MariaDB/MySQL.
fn is_mysql(url: &str) -> bool {
    url.trim_start()
        .to_ascii_lowercase()
        .starts_with("mysql://")
}

fn config(args: &RelayArgs) -> RelayConfig {
    RelayConfig::default().batch_size(args.batch_size)
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Relays until Ctrl-C, then finishes the batch in flight.
pub async fn relay(url: &str, args: RelayArgs) -> Result<(), Failure> {
    if is_mysql(url) {
        return relay_mysql(url, args).await;
    }
    let table: TableName = args
        .outbox
        .parse()
        .map_err(|e: Error| Failure::usage(e.to_string()))?;
    let store = SqlClaimStore::new(OutboxStore::new(table), url);
    let relay = Relay::new(store, JsonLines, config(&args))?;
    eprintln!("relaying {} to stdout; Ctrl-C stops", args.outbox);
    relay.run(ctrl_c()).await?;
    Ok(())
}

#[cfg(feature = "mysql")]
async fn relay_mysql(url: &str, args: RelayArgs) -> Result<(), Failure> {
    use changefeed::mysql::{BinlogWaker, BinlogWakerConfig, MysqlOutboxStore, OutboxTable};

    let usage = |e: Error| Failure::usage(e.to_string());
    let table: OutboxTable = args.outbox.parse().map_err(usage)?;
    let opts = changefeed::mysql::opts(url).map_err(usage)?;
    let store = MysqlOutboxStore::new(table.clone(), opts.clone());
    // The binlog wakes the relay; its own poll is the safety net behind the waker's.
    let relay = Relay::new(
        store,
        JsonLines,
        config(&args).poll_interval(std::time::Duration::from_secs(5)),
    )?;
    let waker = BinlogWaker::new(opts, table, relay.handle(), BinlogWakerConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let waker = tokio::spawn(waker.run(async {
        let _ = stopped.await;
    }));
    eprintln!(
        "relaying {} to stdout (woken by the binlog, polling when it cannot be followed); \
         Ctrl-C stops",
        args.outbox
    );
    let result = relay.run(ctrl_c()).await;
    let _ = stop.send(());
    let _ = waker.await;
    result?;
    Ok(())
}

#[cfg(not(feature = "mysql"))]
async fn relay_mysql(_url: &str, _args: RelayArgs) -> Result<(), Failure> {
    Err(Failure::usage(
        "this changefeed was built without MariaDB/MySQL support; build it with \
         --features cli,mysql to relay from a mysql:// URL",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_database() {
        assert!(is_mysql("mysql://relay@db/app"));
        assert!(is_mysql(" MYSQL://relay@db/app"));
        assert!(!is_mysql("server=tcp:db,1433;database=app"));
    }
}
