//! `changefeed status` with a `postgres://` URL: every feed shard (`changefeed.feed_status`)
//! and, with `--consumers`, every saved cursor's lag (`changefeed.consumer_lag`); the
//! outboxes are `super::outboxes::postgres`.

use serde::Serialize;
use ulid::Ulid;

use crate::output::{Align, Table, human_lag, ulid_time};

/// The feed_status query: ULIDs as bytea, the times computed from them in Rust.
pub const FEED_STATUS: &str = "select feed, case when serialize_writers then \
    'serialize_writers' else 'outbox' end, shard_id, outbox_depth, head_ulid, purged_through \
    from changefeed.feed_status order by feed, shard_id";

/// The consumer_lag query, with the lag in milliseconds.
pub const CONSUMER_LAG: &str = "select consumer, feed, shard_id, owner, cursor, head_ulid, \
    (extract(epoch from behind) * 1000)::bigint from changefeed.consumer_lag \
    order by feed, shard_id, consumer";

/// One shard of one feed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FeedShard {
    pub feed: String,
    pub mode: String,
    pub shard_id: i32,
    /// Outbox mode: committed events not moved into the feed yet.
    pub outbox_depth: Option<i64>,
    pub head_ulid: Option<String>,
    pub head_at: Option<String>,
    pub purged_through: Option<String>,
}

/// One consumer's cursor on one shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsumerLag {
    pub consumer: String,
    pub feed: String,
    pub shard_id: i32,
    pub owner: String,
    pub cursor: String,
    pub cursor_at: Option<String>,
    pub head_at: Option<String>,
    pub lag_ms: Option<i64>,
    /// Its cursor is below the shard's purge mark: reading from it fails (CF104).
    pub expired: bool,
}

/// A ULID column (bytea) as its text and its time.
fn ulid_of(bytes: Option<Vec<u8>>) -> Option<Ulid> {
    bytes.and_then(|bytes| {
        <[u8; 16]>::try_from(bytes.as_slice())
            .ok()
            .map(Ulid::from_bytes)
    })
}

/// Decodes the feed_status rows.
pub fn feed_shards(rows: &[tokio_postgres::Row]) -> Result<Vec<FeedShard>, tokio_postgres::Error> {
    rows.iter()
        .map(|row| {
            let head = ulid_of(row.try_get(4)?);
            Ok(FeedShard {
                feed: row.try_get(0)?,
                mode: row.try_get(1)?,
                shard_id: row.try_get(2)?,
                outbox_depth: row.try_get(3)?,
                head_ulid: head.map(|u| u.to_string()),
                head_at: head.and_then(ulid_time),
                purged_through: ulid_of(row.try_get(5)?).map(|u| u.to_string()),
            })
        })
        .collect()
}

/// Decodes the consumer_lag rows; `shards` gives each shard's purge mark.
pub fn consumer_lags(
    rows: &[tokio_postgres::Row],
    shards: &[FeedShard],
) -> Result<Vec<ConsumerLag>, tokio_postgres::Error> {
    rows.iter()
        .map(|row| {
            let feed: String = row.try_get(1)?;
            let shard_id: i32 = row.try_get(2)?;
            let cursor = ulid_of(row.try_get(4)?).unwrap_or(Ulid(0));
            let head = ulid_of(row.try_get(5)?);
            Ok(ConsumerLag {
                consumer: row.try_get(0)?,
                expired: expired(&feed, shard_id, cursor, shards),
                feed,
                shard_id,
                owner: row.try_get(3)?,
                cursor: cursor.to_string(),
                cursor_at: ulid_time(cursor),
                head_at: head.and_then(ulid_time),
                lag_ms: row.try_get(6)?,
            })
        })
        .collect()
}

/// Whether `cursor` is below the purge mark of `feed`'s `shard`.
fn expired(feed: &str, shard: i32, cursor: Ulid, shards: &[FeedShard]) -> bool {
    shards
        .iter()
        .find(|s| s.feed == feed && s.shard_id == shard)
        .and_then(|s| s.purged_through.as_deref())
        .and_then(|mark| mark.parse::<Ulid>().ok())
        .is_some_and(|mark| cursor < mark)
}

fn dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// The feeds table.
pub fn feed_table(shards: &[FeedShard]) -> Table {
    let mut table = Table::new(&[
        ("feed", Align::Left),
        ("mode", Align::Left),
        ("shard", Align::Right),
        ("outbox_depth", Align::Right),
        ("head_ulid", Align::Left),
        ("head_at", Align::Left),
        ("purged_through", Align::Left),
    ]);
    for shard in shards {
        table.push(vec![
            shard.feed.clone(),
            shard.mode.clone(),
            shard.shard_id.to_string(),
            dash(shard.outbox_depth.map(|n| n.to_string())),
            dash(shard.head_ulid.clone()),
            dash(shard.head_at.clone()),
            dash(shard.purged_through.clone()),
        ]);
    }
    table
}

/// The consumers table.
pub fn consumer_table(consumers: &[ConsumerLag]) -> Table {
    let mut table = Table::new(&[
        ("consumer", Align::Left),
        ("feed", Align::Left),
        ("shard", Align::Right),
        ("owner", Align::Left),
        ("cursor", Align::Left),
        ("cursor_at", Align::Left),
        ("head_at", Align::Left),
        ("lag", Align::Right),
        ("expired", Align::Left),
    ]);
    for lag in consumers {
        table.push(vec![
            lag.consumer.clone(),
            lag.feed.clone(),
            lag.shard_id.to_string(),
            lag.owner.clone(),
            lag.cursor.clone(),
            dash(lag.cursor_at.clone()),
            dash(lag.head_at.clone()),
            dash(lag.lag_ms.map(human_lag)),
            if lag.expired { "yes" } else { "no" }.to_owned(),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_and_consumers_become_tables_and_a_cursor_below_the_mark_is_expired() {
        let mark = Ulid::from_parts(1_714_564_800_123, 5);
        let shards = vec![FeedShard {
            feed: "app.Order".into(),
            mode: "outbox".into(),
            shard_id: 0,
            outbox_depth: Some(3),
            head_ulid: Some(Ulid::from_parts(1_714_564_900_000, 1).to_string()),
            head_at: Some("2024-05-01T12:01:40.000Z".into()),
            purged_through: Some(mark.to_string()),
        }];
        assert!(expired(
            "app.Order",
            0,
            Ulid::from_parts(1_714_564_800_123, 4),
            &shards
        ));
        assert!(!expired("app.Order", 0, mark, &shards));
        assert!(!expired("app.Order", 1, Ulid(0), &shards));
        let text = feed_table(&shards).render("(no feeds)");
        let line = text.lines().nth(1).unwrap();
        assert!(
            line.starts_with("app.Order  outbox      0             3  "),
            "{text}"
        );
        assert!(line.ends_with(&mark.to_string()), "{text}");
        let lag = ConsumerLag {
            consumer: "billing".into(),
            feed: "app.Order".into(),
            shard_id: 0,
            owner: "app".into(),
            cursor: Ulid(0).to_string(),
            cursor_at: None,
            head_at: None,
            lag_ms: Some(180_000),
            expired: true,
        };
        let text = consumer_table(&[lag]).render("(no consumers)");
        let line = text.lines().nth(1).unwrap();
        assert!(line.contains("3 min") && line.ends_with("yes"), "{text}");
    }
}
