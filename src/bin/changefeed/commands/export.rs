//! `changefeed export`: a feed's events to a Kafka topic with the library's `FeedExporter`
//! (feature `kafka`) over a `FeedReader` of SQL Server or PostgreSQL, its cursors saved
//! under `--consumer` in the feed's database.
//!
//! Checks come in this order, each a one-line failure: the arguments, the brokers, then the
//! database (one connection: reachable, the feed's `read_feed` exists, its shards).

use crate::args::ExportArgs;
use crate::database::Connect;
use crate::failure::Failure;

/// In a build without Kafka `export` can only say how to get it.
#[cfg(not(feature = "kafka"))]
pub async fn export(_connect: &Connect, _args: ExportArgs) -> Result<(), Failure> {
    Err(crate::kafka::without_kafka("export a feed to Kafka"))
}

/// Exports until SIGINT or SIGTERM, then finishes the page in flight and saves its cursor.
#[cfg(feature = "kafka")]
pub async fn export(connect: &Connect, args: ExportArgs) -> Result<(), Failure> {
    use std::time::{Duration, SystemTime};

    use changefeed::FeedReader;
    use changefeed::kafka::{ExportConfig, FeedExporter};
    use changefeed::pool::ConnectionManager;
    use changefeed::reader::FeedReaderOptions;

    use crate::args::ServiceArgs;
    use crate::database::{is_postgres, require_feed, with_migrate_hint};
    use crate::endpoints::{Endpoints, Freshness};
    use crate::progress::{export_line, print_stderr, with_progress};
    use crate::signals::Signals;
    use tracing::Instrument;

    let ExportArgs {
        feed,
        brokers,
        topic,
        consumer,
        shards,
        from,
        page,
        service,
    } = args;
    let ServiceArgs {
        producer,
        progress,
        metrics,
    } = service;
    // First: a busy or wrong address is a usage error before anything connects.
    let endpoints = Endpoints::serve(&metrics, Freshness::LastRead, progress.quiet).await?;
    let settings = crate::kafka::settings(&brokers, &producer);
    let kafka = crate::kafka::checked_producer(&settings, &producer).await?;
    let options = FeedReaderOptions::default().page_size(page.page_size);
    let (shards, reader) = if is_postgres(&connect.url) {
        postgres_reader(connect, &feed, shards, options).await?
    } else {
        let shards = {
            // One plain connection first: a clear line for an unreachable server or an
            // unknown feed, instead of the reader's retries.
            let mut client = connect.open(Some(Duration::from_secs(30))).await?;
            require_feed(&mut client, &feed).await?;
            if shards.is_empty() {
                let found = shards_of(&mut client, &feed).await?;
                if found.is_empty() {
                    if !progress.quiet {
                        print_stderr(&format!(
                            "{feed} has no shard with events yet: exporting shard 0 (pass \
                             --shards to choose)"
                        ));
                    }
                    vec![0]
                } else {
                    found
                }
            } else {
                distinct(shards)
            }
        };
        // A connection per shard being read, and one for saving cursors.
        let connections = u32::try_from(shards.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let manager =
            ConnectionManager::from_ado(&connect.url)?.connect_timeout(Some(connect.timeout));
        let pool = changefeed::Pool::from_builder(
            changefeed::Pool::builder().max_size(connections),
            manager,
        );
        (
            shards,
            FeedReader::with_options(pool, feed.clone(), options)?,
        )
    };
    let config = ExportConfig::new(topic.clone(), consumer.clone()).page_size(page.page_size);
    let exporter = FeedExporter::connect(&reader, kafka, config)
        .await
        .map_err(with_migrate_hint)?;
    let counters = exporter.progress();
    if let Some(endpoints) = &endpoints {
        endpoints.running();
    }
    let start = from.cursor(SystemTime::now());

    let signals = Signals::install()?;
    if !progress.quiet {
        print_stderr(&format!(
            "exporting {feed} (shards {}) to Kafka topic {topic} at {} as consumer \
             {consumer}; SIGINT or SIGTERM stops",
            list(&shards),
            settings.brokers()
        ));
    }
    let mut before = counts(&counters.snapshot());
    let progress_line = |elapsed| {
        let now = counts(&counters.snapshot());
        let line = export_line(&before, &now, elapsed);
        before = now;
        line
    };
    let report = with_progress(
        exporter.run(
            shards,
            start,
            signals.watch("the page in flight", progress.quiet, None),
        ),
        progress.every(),
        progress_line,
        print_stderr,
    )
    .instrument(tracing::info_span!("export", feed = %feed))
    .await
    .map_err(|error| export_failure(error, &consumer))?;
    drop(endpoints);
    if !progress.quiet {
        let saved: Vec<String> = report
            .saved
            .iter()
            .map(|(shard, cursor)| format!("shard {shard} at {cursor}"))
            .collect();
        print_stderr(&format!(
            "stopped: exported {}; cursors saved: {}",
            report.exported,
            if saved.is_empty() {
                "none".to_owned()
            } else {
                saved.join(", ")
            }
        ));
    }
    Ok(())
}

/// On PostgreSQL: the reader (each shard's stream and the cursor store open connections of
/// their own) and the shards, `--shards` checked against the feed's fixed count, else all
/// of them.
#[cfg(all(feature = "kafka", feature = "postgres"))]
async fn postgres_reader(
    connect: &Connect,
    feed: &changefeed::Feed,
    shards: Vec<i32>,
    options: changefeed::reader::FeedReaderOptions,
) -> Result<(Vec<i32>, changefeed::FeedReader), Failure> {
    let (reader, info) = crate::database::postgres::feed_reader(connect, feed, options).await?;
    if let Some(shard) = shards.iter().find(|s| !(0..info.shards).contains(s)) {
        return Err(Failure::usage(format!(
            "--shards {shard}: {feed} has {} shard(s), 0 to {}",
            info.shards,
            info.shards - 1
        )));
    }
    let shards = if shards.is_empty() {
        (0..info.shards).collect()
    } else {
        distinct(shards)
    };
    Ok((shards, reader))
}

#[cfg(all(feature = "kafka", not(feature = "postgres")))]
async fn postgres_reader(
    _: &Connect,
    _: &changefeed::Feed,
    _: Vec<i32>,
    _: changefeed::reader::FeedReaderOptions,
) -> Result<(Vec<i32>, changefeed::FeedReader), Failure> {
    Err(Failure::without_postgres())
}

/// The shards `changefeed status` shows for `feed` (those with events or outbox rows), or
/// the problem `feed_status` reports for it.
#[cfg(feature = "kafka")]
async fn shards_of(
    client: &mut changefeed::Client,
    feed: &changefeed::Feed,
) -> Result<Vec<i32>, Failure> {
    use changefeed::row::Column;

    use crate::database::query_rows;

    let rows = query_rows(
        client,
        "select shard_id, problem from changefeed.feed_status where feed = @P1 \
         order by shard_id",
        &[&feed.to_string()],
    )
    .await
    .map_err(|error| {
        // Another feed's broken status view breaks the whole view: --shards goes around it.
        Failure::run(format!(
            "cannot list the shards of {feed} from changefeed.feed_status: {error}; name \
             them with --shards"
        ))
    })?;
    let mut shards = Vec::new();
    for row in &rows {
        if let Some(problem) = Option::<String>::column(row, 1)? {
            return Err(Failure::run(format!(
                "{feed} cannot be exported: {problem}"
            )));
        }
        shards.extend(Option::<i32>::column(row, 0)?);
    }
    Ok(shards)
}

/// `shards` in order, each once.
#[cfg(feature = "kafka")]
fn distinct(mut shards: Vec<i32>) -> Vec<i32> {
    shards.sort_unstable();
    shards.dedup();
    shards
}

/// `0, 2, 3`.
#[cfg(feature = "kafka")]
fn list(shards: &[i32]) -> String {
    shards
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The library's counters as the progress line takes them.
#[cfg(feature = "kafka")]
fn counts(snapshot: &changefeed::kafka::ProgressSnapshot) -> crate::progress::ExportCounts {
    crate::progress::ExportCounts {
        exported: snapshot.exported,
        skipped_deleted: snapshot.skipped_deleted,
        behind: snapshot.behind,
        last_ulid: snapshot.last_ulid,
    }
}

/// The line an export that failed while running ends with.
#[cfg(feature = "kafka")]
fn export_failure(error: changefeed::Error, consumer: &str) -> Failure {
    match &error {
        changefeed::Error::CursorExpired { .. } => Failure::run(format!(
            "{error}; the events after consumer {consumer}'s cursor were purged before they \
             were exported. To go on from the oldest retained event, save a new cursor for \
             it with changefeed.save_cursor, or export as a new --consumer with --from \
             start"
        )),
        _ if error.is_transient() => Failure::run(format!(
            "{error} (the export gave up after retrying; run it again: it resumes after the \
             last saved cursor)"
        )),
        _ => crate::database::with_migrate_hint(error),
    }
}

#[cfg(all(test, feature = "kafka"))]
mod tests {
    use super::*;

    #[test]
    fn shards_are_listed_once_in_order() {
        assert_eq!(distinct(vec![2, 0, 2, 1]), [0, 1, 2]);
        assert_eq!(list(&[0, 2]), "0, 2");
        assert_eq!(list(&[]), "");
    }
}
