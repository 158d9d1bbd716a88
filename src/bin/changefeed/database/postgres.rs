//! What the commands share on PostgreSQL (a `postgres://` or `postgresql://` `--url`):
//! opening a connection, one bounded call, the one-line failure of a call (with the
//! `changefeed migrate` hint when the bundle is missing), and a feed's entry in the
//! registry (`changefeed.feed_info`).

use std::future::Future;

use changefeed::postgres::CALL_TIMEOUT;
use changefeed::{Error, Feed};

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

/// Runs one statement of a command, bounded on the client by the crate's
/// [`CALL_TIMEOUT`] (the session's `statement_timeout` bounds it on the server), as a
/// failure line when it fails.
pub async fn call<T>(
    what: &str,
    statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(CALL_TIMEOUT, statement).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(failure(Error::from(error))),
        Err(_) => Err(Failure::run(format!(
            "{what}: PostgreSQL did not answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

/// The line for an error of the bundle's functions: a missing function, relation or
/// schema means the bundle is not applied or older than feeds, and says to migrate.
pub fn failure(error: Error) -> Failure {
    match &error {
        Error::Postgres { state, .. } if matches!(state.as_str(), "42883" | "42P01" | "3F000") => {
            Failure::run(format!(
                "{error} (is the PostgreSQL changefeed bundle applied and current? run \
                 `changefeed migrate` with the same --url)"
            ))
        }
        _ => Failure::from(error),
    }
}

/// A feed's entry in the registry, as `changefeed.feed_info` gives it.
#[derive(Clone, Debug)]
pub struct FeedInfo {
    /// Serialized-writer mode (else outbox mode).
    pub serialize_writers: bool,
    /// The shard count, fixed at setup.
    pub shards: i32,
    /// `changefeed.read_feed_<id>`, quoted and qualified.
    pub read_function: String,
    /// `changefeed.lock_feed_<id>` in serialized-writer mode.
    pub lock_function: Option<String>,
    /// `changefeed.ulid_<id>` in serialized-writer mode.
    pub ulid_function: Option<String>,
    /// The NOLOGIN role that may read the feed.
    pub readers_role: String,
    /// The NOLOGIN role that may write it.
    pub writers_role: String,
}

/// `feed`'s registry entry, or the line that says it is not a feed here (CF006 from the
/// bundle, or no row).
pub async fn feed_info(client: &tokio_postgres::Client, feed: &Feed) -> Result<FeedInfo, Failure> {
    let name = feed.to_string();
    let rows = tokio::time::timeout(
        CALL_TIMEOUT,
        client.query(
            "select serialize_writers, shards, read_function, lock_function, ulid_function, \
             readers_role, writers_role from changefeed.feed_info($1)",
            &[&name],
        ),
    )
    .await
    .map_err(|_| {
        Failure::run(format!(
            "feed_info({feed}): PostgreSQL did not answer within {CALL_TIMEOUT:?}"
        ))
    })?;
    let not_a_feed = || {
        Failure::run(format!(
            "{feed} is not a feed in this PostgreSQL database; make it one with \
             `changefeed setup-feed {feed} --outbox` (or check the database in --url)"
        ))
    };
    let rows = match rows.map_err(Error::from) {
        Ok(rows) => rows,
        Err(Error::Postgres { state, .. }) if state == "CF006" => return Err(not_a_feed()),
        Err(other) => return Err(failure(other)),
    };
    let row = rows.first().ok_or_else(not_a_feed)?;
    let get = |error: tokio_postgres::Error| Failure::run(format!("feed_info({feed}): {error}"));
    Ok(FeedInfo {
        serialize_writers: row.try_get(0).map_err(get)?,
        shards: row.try_get(1).map_err(get)?,
        read_function: row.try_get(2).map_err(get)?,
        lock_function: row.try_get(3).map_err(get)?,
        ulid_function: row.try_get(4).map_err(get)?,
        readers_role: row.try_get(5).map_err(get)?,
        writers_role: row.try_get(6).map_err(get)?,
    })
}

/// A reader of `feed` on PostgreSQL, after one plain connection has checked that the
/// server answers and `feed` is a feed there (one clear line instead of the stream's
/// retries), with the feed's registry entry.
pub async fn feed_reader(
    connect: &Connect,
    feed: &Feed,
    options: changefeed::reader::FeedReaderOptions,
) -> Result<(changefeed::FeedReader, FeedInfo), Failure> {
    let config = settings(connect)?;
    let info = {
        let client = open(connect, &config).await?;
        feed_info(&client, feed).await?
    };
    let reader = changefeed::FeedReader::postgres(config, feed.clone(), options)?;
    Ok((reader, info))
}

/// `feed` as PostgreSQL writes the table's name: `"schema"."table"`, each part quoted.
pub fn quoted_table(feed: &Feed) -> String {
    let quote = |part: &str| format!("\"{}\"", part.replace('"', "\"\""));
    format!("{}.{}", quote(feed.schema()), quote(feed.table()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_bundle_function_suggests_migrate_and_others_do_not() {
        let missing = Error::Postgres {
            state: "42883".into(),
            message: "function changefeed.feed_info(text) does not exist".into(),
        };
        let line = failure(missing).message().unwrap().to_owned();
        assert!(line.contains("changefeed migrate"), "{line}");
        let refused = Error::Postgres {
            state: "CF401".into(),
            message: "changefeed.purge_feed: no cutoff".into(),
        };
        let line = failure(refused).message().unwrap().to_owned();
        assert!(!line.contains("migrate"), "{line}");
        assert!(line.contains("CF401"), "{line}");
    }

    #[test]
    fn table_names_are_quoted_part_by_part() {
        let feed = Feed::new("App", "Order Line").unwrap();
        assert_eq!(quoted_table(&feed), r#""App"."Order Line""#);
    }
}
