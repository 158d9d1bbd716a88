//! Opening a PostgreSQL connection for `migrate`, `setup-outbox` and `relay` with a
//! `postgres://` (or `postgresql://`) `--url`.

use super::{CHECK_URL, Connect};
use crate::failure::Failure;

/// The URL's settings with `--connect-timeout`.
pub fn settings(connect: &Connect) -> Result<tokio_postgres::Config, Failure> {
    let mut config =
        changefeed::postgres::config(&connect.url).map_err(|e| Failure::usage(e.to_string()))?;
    config.connect_timeout(connect.timeout);
    Ok(config)
}

/// One connection, or a one-line failure naming the server.
pub async fn open(
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
                "cannot connect to PostgreSQL at {} (waited at most {:?}): {error}; \
                 {CHECK_URL}",
                hosts.join(","),
                connect.timeout
            ))
        })
}
