//! [`key_columns`]: the names of a feed's key columns, read from the column description of
//! a `read_feed` call.

use crate::connection::Client;
use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::feed::Feed;

use super::page::{FeedRow, read_feed_sql};

/// What to do about error `number` (2812: no such procedure; 229: no permission) when
/// [`key_columns`] reads `feed`.
fn key_columns_advice(feed: &Feed, number: u32) -> String {
    if number == 2812 {
        format!(
            "feed {feed} does not exist ({} is missing): check the name (schema.table), or \
             set the feed up with changefeed.setup_feed",
            feed.read_feed_procedure()
        )
    } else {
        format!(
            "the login may not read feed {feed}: add it to the role {} (or db_owner)",
            feed.readers_role()
        )
    }
}

/// The names of `feed`'s key columns, in key order: the columns after `ulid` of a
/// `read_feed` call with `@with_event = 0`, read from the result's column description (which
/// the server sends even for an empty page). The call reads at most one row of shard 0 with
/// no wait, outside any transaction, so membership in the feed's readers role suffices.
///
/// A feed that does not exist (no `read_feed` procedure, SQL Server error 2812) or that the
/// login may not read (229) is an [`Error::Server`] with that number and a message saying
/// what to do.
pub async fn key_columns(client: &mut Client, feed: &Feed) -> Result<Vec<String>> {
    let cursor = Cursor::START.to_bytes();
    let (page_size, wait_ms) = (1i32, 0i32);
    let params: [&dyn tiberius::ToSql; 4] = [&0i32, &&cursor[..], &page_size, &wait_ms];
    let named = |error: Error| match error {
        Error::Server {
            number,
            state,
            class,
            message,
        } if number == 2812 || number == 229 => {
            let fix = key_columns_advice(feed, number);
            Error::Server {
                number,
                state,
                class,
                message: format!("{fix} ({message})"),
            }
        }
        other => other,
    };
    let mut stream = client
        .query(
            read_feed_sql::<FeedRow<crate::json::JsonColumns>>(feed),
            &params,
        )
        .await
        .map_err(|error| named(error.into()))?;
    let columns = stream
        .columns()
        .await
        .map_err(|error| named(error.into()))?
        .map(|columns| {
            columns
                .iter()
                .map(|column| column.name().to_owned())
                .collect::<Vec<_>>()
        });
    // Drained, so that the connection is ready for its next call.
    stream.into_results().await?;
    match columns.as_deref() {
        Some([ulid, keys @ ..]) if ulid.eq_ignore_ascii_case("ulid") && !keys.is_empty() => {
            Ok(keys.to_vec())
        }
        _ => Err(Error::Config(format!(
            "read_feed of {feed} returned the columns {columns:?}, not ulid and the key \
             columns: upgrade the feed with changefeed.upgrade_feed"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_columns_advice_is_one_sentence_without_runs_of_spaces() {
        let feed: Feed = "app.OrderPlaced".parse().unwrap();
        for number in [2812, 229] {
            let advice = key_columns_advice(&feed, number);
            assert!(!advice.contains("  "), "{number}: {advice:?}");
            assert!(advice.contains("app.OrderPlaced"), "{advice}");
        }
        assert!(key_columns_advice(&feed, 2812).contains("(schema.table), or set the feed up"));
    }
}
