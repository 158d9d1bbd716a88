//! What a client learns of a feed on PostgreSQL from `changefeed.feed_info`: the names of
//! its functions and its NOTIFY channel, checked before any of them goes into SQL. The feed
//! reader and the serialized writer's `lock_feed_postgres` share it.

use tokio_postgres::GenericClient;

use crate::error::{Result, decode_error};
use crate::feed::Feed;

/// A feed's functions and channel, as `feed_info` names them (schema-qualified, checked by
/// [`check_function_name`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FeedInfo {
    /// `read_feed_<id>`: ULIDs and keys.
    pub(crate) read_function: String,
    /// `read_events_<id>`: ULIDs and whole events.
    pub(crate) events_function: String,
    /// `lock_feed_<id>`, serialized-writer feeds only.
    pub(crate) lock_function: Option<String>,
    /// The channel a commit of events notifies, `changefeed_feed_<id>`.
    pub(crate) channel: String,
}

/// Asks `changefeed.feed_info` about `feed` (CF006 when it is not a feed). The feed's name
/// is a parameter, never SQL text.
pub(crate) async fn feed_info(client: &impl GenericClient, feed: &Feed) -> Result<FeedInfo> {
    let row = client
        .query_one(
            "select read_function, events_function, lock_function, channel \
             from changefeed.feed_info($1)",
            &[&feed.to_string()],
        )
        .await?;
    let text = |index: usize| -> Result<Option<String>> {
        row.try_get(index)
            .map_err(|error| decode_error(format!("feed_info column {index}"), error))
    };
    let required = |index: usize| -> Result<String> {
        text(index)?.ok_or_else(|| decode_error(format!("feed_info column {index}"), "NULL"))
    };
    let checked = |name: String| check_function_name(&name).map(|_| name.clone());
    Ok(FeedInfo {
        read_function: checked(required(0)?)?,
        events_function: checked(required(1)?)?,
        lock_function: text(2)?.map(checked).transpose()?,
        channel: required(3)?,
    })
}

/// `name` as a quoted identifier: double quotes, doubled inside.
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Checks a function name `feed_info` returned before it goes into SQL: `schema.function`,
/// each part a plain lower-case identifier or a quoted one without quotes inside. The
/// bundle writes `changefeed.read_feed_<id>`; anything else means the server is not what
/// this client expects.
pub(crate) fn check_function_name(name: &str) -> Result<&str> {
    fn part(part: &str) -> bool {
        let plain = part
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        let quoted = part.len() > 2
            && part.starts_with('"')
            && part.ends_with('"')
            && !part[1..part.len() - 1].contains('"');
        plain || quoted
    }
    match name.split_once('.') {
        Some((schema, function)) if part(schema) && part(function) => Ok(name),
        _ => Err(decode_error(
            "feed_info",
            format!("the function name {name:?} is not a schema-qualified identifier"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_schema_qualified_identifiers_are_called() {
        for good in [
            "changefeed.read_feed_7",
            "changefeed.read_events_12",
            "\"changefeed\".\"read feed 1\"",
        ] {
            assert_eq!(check_function_name(good).unwrap(), good);
        }
        for bad in [
            "read_feed_7",
            "changefeed.read_feed_7(); drop table x; --",
            "changefeed.\"a\"\"b\"",
            "changefeed.",
            "changefeed.Read",
            "a.b.c",
            "",
        ] {
            assert!(check_function_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(
            quote_identifier("changefeed_feed_7"),
            "\"changefeed_feed_7\""
        );
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
    }
}
