//! `changefeed relay`, `migrate` and `setup-outbox` with a `postgres://` (or
//! `postgresql://`) `--url`: the claim outbox on PostgreSQL, woken by LISTEN/NOTIFY. A
//! child of `relay` so that it shares the relay's targets, progress line and signals.

use super::RelayArgs;
use crate::Failure;
use crate::commands::Connect;

/// Whether `url` is for PostgreSQL.
pub fn is_postgres(url: &str) -> bool {
    let url = url.trim_start().to_ascii_lowercase();
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(feature = "postgres")]
mod enabled {
    use std::time::Duration;

    use super::super::{Companion, Monitor, NoBacklog, config, run, target};
    use super::*;
    use crate::endpoints::Endpoints;
    use changefeed::Error;
    use changefeed::postgres::{
        OutboxTable, PostgresOutboxStore, PostgresWaker, PostgresWakerConfig,
    };
    use changefeed::relay::RelayHandle;

    /// The URL's settings with `--connect-timeout`.
    fn settings(connect: &Connect) -> Result<tokio_postgres::Config, Failure> {
        let mut config = changefeed::postgres::config(&connect.url)
            .map_err(|e| Failure::usage(e.to_string()))?;
        config.connect_timeout(connect.timeout);
        Ok(config)
    }

    /// One connection, or a one-line failure naming the server.
    async fn open(
        connect: &Connect,
        config: &tokio_postgres::Config,
    ) -> Result<tokio_postgres::Client, Failure> {
        changefeed::postgres::connect(config)
            .await
            .map_err(|error| {
                let hosts: Vec<String> = config
                    .get_hosts()
                    .iter()
                    .map(|host| match host {
                        tokio_postgres::config::Host::Tcp(name) => name.clone(),
                        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                    })
                    .collect();
                Failure::connect(format!(
                    "cannot connect to PostgreSQL at {} (waited at most {:?}): {error}; check \
                 --url or CHANGEFEED_URL",
                    hosts.join(","),
                    connect.timeout
                ))
            })
    }

    /// `migrate`: applies the PostgreSQL bundle.
    pub async fn migrate(connect: &Connect) -> Result<String, Failure> {
        let config = settings(connect)?;
        let mut client = open(connect, &config).await?;
        let report = changefeed::postgres::migrate(&mut client).await?;
        let applied = report.applied_migrations();
        let mut text = format!(
            "applied {} PostgreSQL changefeed migration(s) ({} in the bundle{})\n",
            applied.len(),
            changefeed::postgres::bundle().len(),
            if applied.is_empty() {
                "; the database is up to date"
            } else {
                ""
            }
        );
        for migration in applied {
            text.push_str(&format!(
                "  V{} {}\n",
                migration.version(),
                migration.name()
            ));
        }
        Ok(text)
    }

    /// `setup-outbox`: creates or completes the outbox table.
    pub async fn setup_outbox(connect: &Connect, outbox: &str) -> Result<String, Failure> {
        let table: OutboxTable = outbox
            .parse()
            .map_err(|e: Error| Failure::usage(e.to_string()))?;
        let config = settings(connect)?;
        let client = open(connect, &config).await?;
        changefeed::postgres::setup_outbox(&client, &table)
            .await
            .map_err(|error| match error.server_number() {
                Some(_) => Failure::run(error.to_string()),
                // The bundle's function is missing: the bundle is not applied.
                None => Failure::run(format!(
                    "{error} (is the PostgreSQL bundle applied? run `changefeed migrate` with \
                     the same --url)"
                )),
            })?;
        Ok(format!(
            "outbox {table} is ready (notify channel \"{}\")\n",
            table.channel()
        ))
    }

    /// The waker's task and the sender that stops it.
    struct Waker {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Companion for Waker {
        async fn stop(self) {
            let _ = self.stop.send(());
            let _ = self.task.await;
        }
    }

    /// `relay`: the outbox must exist; then the relay runs with the notify wake.
    pub async fn relay(
        connect: &Connect,
        args: RelayArgs,
        endpoints: Option<Endpoints>,
    ) -> Result<(), Failure> {
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
        // Notifications wake the relay; its own poll is the safety net behind the waker's.
        let config = config(&args).poll_interval(Duration::from_secs(5));
        let start = |handle: RelayHandle| {
            let waker = PostgresWaker::new(settings, table, handle, PostgresWakerConfig::default());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(waker.run(async {
                let _ = stopped.await;
            }));
            Waker { stop, task }
        };
        let how = " (woken by LISTEN/NOTIFY, polling when it cannot listen)";
        let monitor = Monitor::<NoBacklog>::without_backlog(endpoints);
        run(store, target, config, &args, how, monitor, start).await
    }
}

#[cfg(feature = "postgres")]
pub use enabled::{migrate, relay, setup_outbox};

#[cfg(not(feature = "postgres"))]
fn without_postgres() -> Failure {
    Failure::usage(
        "this changefeed was built without PostgreSQL support; build it with --features \
         cli,postgres to use a postgres:// URL",
    )
}

#[cfg(not(feature = "postgres"))]
pub async fn migrate(_connect: &Connect) -> Result<String, Failure> {
    Err(without_postgres())
}

#[cfg(not(feature = "postgres"))]
pub async fn setup_outbox(_connect: &Connect, _outbox: &str) -> Result<String, Failure> {
    Err(without_postgres())
}

#[cfg(not(feature = "postgres"))]
pub async fn relay(
    _connect: &Connect,
    _args: RelayArgs,
    _endpoints: Option<crate::endpoints::Endpoints>,
) -> Result<(), Failure> {
    Err(without_postgres())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_postgres() {
        assert!(is_postgres("postgres://relay@db/app"));
        assert!(is_postgres(" POSTGRESQL://relay@db/app"));
        assert!(!is_postgres("mysql://relay@db/app"));
        assert!(!is_postgres("server=tcp:db,1433;database=app"));
    }
}
