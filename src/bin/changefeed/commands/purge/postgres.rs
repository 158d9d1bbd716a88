//! `changefeed purge` with a `postgres://` URL: `changefeed.purge_feed` shard by shard, in
//! batches of `--batch-size` rows, each call its own transaction (the function deletes in
//! its caller's transaction, and each call here is one autocommit statement), so that no
//! purge holds one long transaction and every call stays under the statement timeout.

use ulid::Ulid;

use super::PurgedShard;
use crate::args::PurgeArgs;
use crate::database::Connect;
use crate::database::postgres::{call, feed_info, open, settings};
use crate::failure::Failure;

/// `purge_feed`'s reason when it stopped at its `p_max_rows`.
const MAX_ROWS_REACHED: &str = "max rows reached";

/// Purges and returns one outcome per shard.
pub async fn purge(connect: &Connect, purge: &PurgeArgs) -> Result<Vec<PurgedShard>, Failure> {
    let feed = &purge.feed;
    let older_than_ms = purge.older_than.as_millis_i64();
    let config = settings(connect)?;
    let client = open(connect, &config).await?;
    let info = feed_info(&client, feed).await?;
    if info.serialize_writers {
        return Err(Failure::run(format!(
            "{feed} has serialized writers: its feed is the event table itself, whose old rows \
             are yours to delete (purge trims outbox-mode feeds)"
        )));
    }
    let shards: Vec<i32> = match purge.shard {
        Some(shard) if !(0..info.shards).contains(&shard) => {
            return Err(Failure::usage(format!(
                "--shard {shard}: {feed} has {} shard(s), 0 to {}",
                info.shards,
                info.shards - 1
            )));
        }
        Some(shard) => vec![shard],
        None => (0..info.shards).collect(),
    };
    let name = feed.to_string();
    let mut outcomes = Vec::with_capacity(shards.len());
    for shard in shards {
        let mut outcome = PurgedShard {
            shard,
            deleted: 0,
            purged_through: None,
            stopped_because: String::new(),
            passed_consumers: Vec::new(),
        };
        loop {
            let left = purge
                .max_rows
                .map(|max| max.saturating_sub(u64::try_from(outcome.deleted).unwrap_or(0)));
            if left == Some(0) {
                outcome.stopped_because = MAX_ROWS_REACHED.to_owned();
                break;
            }
            // A dry run deletes nothing, so one call sees everything it would delete.
            let take = if purge.dry_run {
                left
            } else {
                Some(left.map_or(u64::from(purge.batch_size), |left| {
                    left.min(u64::from(purge.batch_size))
                }))
            };
            let take_i64 = take.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
            let rows = call(
                "purge_feed",
                client.query(
                    "select deleted, purged_through, stopped, passed_consumers from \
                     changefeed.purge_feed($1, \
                     p_older_than_ms => $2, p_shard => $3, p_max_rows => $4, p_force => $5, \
                     p_dry_run => $6)",
                    &[
                        &name,
                        &older_than_ms,
                        &shard,
                        &take_i64,
                        &purge.force,
                        &purge.dry_run,
                    ],
                ),
            )
            .await?;
            let row = rows.first().ok_or_else(|| {
                Failure::run(format!("purge_feed returned no row for shard {shard}"))
            })?;
            let decode = |e: tokio_postgres::Error| Failure::run(format!("purge_feed: {e}"));
            let deleted: i64 = row.try_get(0).map_err(decode)?;
            let through: Option<Vec<u8>> = row.try_get(1).map_err(decode)?;
            let stopped: String = row.try_get(2).map_err(decode)?;
            outcome.deleted += deleted;
            if let Some(through) = through.and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok()) {
                outcome.purged_through = Some(Ulid::from_bytes(through));
            }
            outcome.stopped_because = stopped;
            let passed: Option<Vec<String>> = row.try_get(3).map_err(decode)?;
            // Each batch names the consumers below its own last row: keep every name once.
            for consumer in passed.unwrap_or_default() {
                if !outcome.passed_consumers.contains(&consumer) {
                    outcome.passed_consumers.push(consumer);
                }
            }
            outcome.passed_consumers.sort();
            let batch_full = !purge.dry_run
                && outcome.stopped_because == MAX_ROWS_REACHED
                && take.is_some_and(|take| u64::try_from(deleted).unwrap_or(0) >= take);
            if !batch_full {
                break;
            }
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}
