//! `changefeed tail`: prints a feed shard's events as JSON lines and follows its head, like
//! `tail -f`, until Ctrl-C (exit status 130) or a closed output pipe; on SQL Server or
//! PostgreSQL, through the same `FeedReader`.

use std::time::{Duration, SystemTime};

use changefeed::Error;
use changefeed::json::JsonColumns;
use changefeed::pool::ConnectionManager;
use changefeed::reader::{FeedEvent, FeedReader, FeedReaderOptions, FeedRow};

use crate::args::TailArgs;
use crate::database::{Connect, is_postgres, require_feed, with_migrate_hint};
use crate::failure::Failure;
use crate::follow::{Stop, follow, interrupted, output_closed};
use crate::output::feed_line;

/// Follows the shard until stopped.
pub async fn tail(connect: &Connect, args: TailArgs) -> Result<(), Failure> {
    let TailArgs {
        feed,
        shard,
        from,
        with_event,
        page,
    } = args;
    let options = FeedReaderOptions::default().page_size(page.page_size);
    let reader = if is_postgres(&connect.url) {
        postgres_reader(connect, &feed, shard, options).await?
    } else {
        // One plain connection first: a clear line for an unreachable server or an unknown
        // feed, instead of the stream's retries.
        {
            let mut client = connect.open(Some(Duration::from_secs(30))).await?;
            require_feed(&mut client, &feed).await?;
        }
        let manager =
            ConnectionManager::from_ado(&connect.url)?.connect_timeout(Some(connect.timeout));
        let pool = changefeed::Pool::from_builder(changefeed::Pool::builder().max_size(1), manager);
        FeedReader::with_options(pool, feed, options)?
    };
    let cursor = from.cursor(SystemTime::now());
    let mut stdout = std::io::stdout();
    let stop = if with_event {
        let stream = reader.event_stream::<JsonColumns>(shard, cursor);
        let line = |row: FeedEvent<JsonColumns>| {
            feed_line(row.ulid, shard, "event", &row.event.into_value())
        };
        follow(stream, &mut stdout, line, interrupted(), output_closed()).await
    } else {
        let stream = reader.stream::<JsonColumns>(shard, cursor);
        let line =
            |row: FeedRow<JsonColumns>| feed_line(row.ulid, shard, "key", &row.key.into_value());
        follow(stream, &mut stdout, line, interrupted(), output_closed()).await
    };
    match stop {
        Stop::Ended => Ok(()),
        // Like `tail -f`: Ctrl-C is the normal way to stop, and the status says so. Lines
        // are written whole, and read_feed holds no transaction while it waits, so nothing
        // is left behind on the server.
        Stop::Interrupted => Err(Failure::interrupted()),
        Stop::Closed => Err(Failure::quiet()),
        Stop::Failed(error) => Err(tail_error(error)),
        Stop::Write(error) => Err(Failure::run(format!(
            "cannot write to standard output: {error}"
        ))),
    }
}

/// The reader of a feed on PostgreSQL (checked with one plain connection first); a shard
/// outside the feed's fixed count is refused here rather than by every read.
#[cfg(feature = "postgres")]
async fn postgres_reader(
    connect: &Connect,
    feed: &changefeed::Feed,
    shard: i32,
    options: FeedReaderOptions,
) -> Result<FeedReader, Failure> {
    let (reader, info) = crate::database::postgres::feed_reader(connect, feed, options).await?;
    if !(0..info.shards).contains(&shard) {
        return Err(Failure::usage(format!(
            "--shard {shard}: {feed} has {} shard(s), 0 to {}",
            info.shards,
            info.shards - 1
        )));
    }
    Ok(reader)
}

#[cfg(not(feature = "postgres"))]
async fn postgres_reader(
    _: &Connect,
    _: &changefeed::Feed,
    _: i32,
    _: FeedReaderOptions,
) -> Result<FeedReader, Failure> {
    Err(Failure::without_postgres())
}

/// The line a stream's final error ends `tail` with.
fn tail_error(error: Error) -> Failure {
    match &error {
        Error::CursorExpired { .. } => Failure::run(format!(
            "{error}; the events after this cursor are gone: restart with --from start (the \
             oldest retained event) or a later cursor"
        )),
        _ if error.is_transient() => Failure::run(format!(
            "{error} (the stream gave up after retrying on fresh connections; run tail again \
             with --from <the last ulid printed> to resume)"
        )),
        _ => with_migrate_hint(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_cursor_says_where_to_restart() {
        let expired = tail_error(Error::CursorExpired {
            message: "events were purged".into(),
        });
        assert!(expired.message().unwrap().contains("--from start"));
    }
}
