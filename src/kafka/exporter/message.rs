//! Turning a page of events into Kafka messages: the key (the primary-key columns as compact
//! JSON), the value (a [`ValueSerializer`], JSON by default) and the headers (`ulid`,
//! `shard`, `feed`).

use std::sync::Arc;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::{Map, Value};
use ulid::Ulid;

use crate::error::{Error, Result};
use crate::json::JsonColumns;
use crate::reader::{FeedEvent, Page};

/// The header carrying the event's ULID (26 characters).
pub const HEADER_ULID: &str = "ulid";
/// The header carrying the shard the event was read from (decimal).
pub const HEADER_SHARD: &str = "shard";
/// The header carrying the feed (`schema.table`).
pub const HEADER_FEED: &str = "feed";

/// One event as the exporter produces it.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportEvent {
    /// The feed, `schema.table`.
    pub feed: String,
    /// The shard the event was read from.
    pub shard: i32,
    /// The event's position in its shard (the `ulid` header).
    pub ulid: Ulid,
    /// The event's primary-key columns (the message key, as compact JSON).
    pub key: Map<String, Value>,
    /// Every column of the event row.
    pub event: Map<String, Value>,
}

/// Turns an event into a message value: JSON by default ([`JsonValues`]); implement it for
/// Avro or Protobuf. An error is a poison event: the export stops with it, naming the event.
pub trait ValueSerializer: Send + Sync + 'static {
    /// The value bytes of `event`.
    fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String>;
}

/// The event's columns as one JSON object.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonValues;

impl ValueSerializer for JsonValues {
    fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String> {
        serde_json::to_vec(&event.event).map_err(|error| error.to_string())
    }
}

/// The headers of an exported event: [`HEADER_ULID`] (the ULID's 26 characters),
/// [`HEADER_SHARD`] (`shard`, the shard in decimal) and [`HEADER_FEED`] (`schema.table`).
/// What the exporter sends with every message; public so that a producer sending the same
/// messages by hand (a benchmark's baseline) sends exactly these.
pub fn export_headers(ulid: Ulid, shard: &str, feed: &str) -> OwnedHeaders {
    // The ULID's text in a buffer on the stack: librdkafka copies every header value, so
    // no `String` needs to outlive this call.
    let mut text = [0; ulid::ULID_LEN];
    let ulid = ulid.array_to_str(&mut text);
    OwnedHeaders::new_with_capacity(3)
        .insert(Header {
            key: HEADER_ULID,
            value: Some(&*ulid),
        })
        .insert(Header {
            key: HEADER_SHARD,
            value: Some(shard),
        })
        .insert(Header {
            key: HEADER_FEED,
            value: Some(feed),
        })
}

/// A message ready to produce: built once, produced as often as its delivery needs.
pub(super) struct Message {
    pub(super) ulid: Ulid,
    pub(super) key: String,
    pub(super) value: Vec<u8>,
}

/// How the messages of one export are built: its feed, key columns and value serializer.
pub(super) struct Messages {
    pub(super) feed_name: String,
    pub(super) key_columns: Vec<String>,
    pub(super) serializer: Arc<dyn ValueSerializer>,
}

impl Messages {
    /// The messages of a page's events, deleted events left out. Each row's columns are
    /// lent to the serializer's [`ExportEvent`] and put back after, rather than cloned: a
    /// clone of every row (a map of strings) cost about as much as serializing it. One
    /// `ExportEvent` serves the whole page (its feed name and key map are filled once and
    /// then only updated), so a message costs no allocation the serializer does not make.
    pub(super) fn of_page(
        &self,
        shard: i32,
        page: &mut Page<FeedEvent<JsonColumns>>,
    ) -> Result<Vec<Message>> {
        let mut messages = Vec::with_capacity(page.rows.len());
        let mut event = ExportEvent {
            feed: self.feed_name.clone(),
            shard,
            ulid: Ulid::nil(),
            key: Map::new(),
            event: Map::new(),
        };
        for row in &mut page.rows {
            let Some(columns) = &mut row.event.0 else {
                tracing::info!(
                    feed = %self.feed_name, shard, ulid = %row.ulid,
                    "export: event row deleted since it was written; nothing to export, skipped"
                );
                continue;
            };
            let key = message_key(&self.key_columns, columns, &mut event.key)
                .map_err(|error| error.at_row(row.ulid))?;
            event.ulid = row.ulid;
            event.event = std::mem::take(columns);
            let value = self.serializer.serialize(&event);
            *columns = std::mem::take(&mut event.event);
            let value = value.map_err(|reason| Error::Kafka {
                code: None,
                message: format!(
                    "event {} of {} shard {shard} cannot be serialized: {reason}. Nothing of \
                     its page was saved; fix the value serializer (or skip the event by \
                     saving a cursor at its ULID) and export again",
                    row.ulid, self.feed_name
                ),
            })?;
            messages.push(Message {
                ulid: row.ulid,
                key,
                value,
            });
        }
        Ok(messages)
    }

    /// The record of `message` for `topic`, `shard` being the shard in decimal.
    pub(super) fn record<'a>(
        &'a self,
        topic: &'a str,
        message: &'a Message,
        shard: &str,
    ) -> FutureRecord<'a, [u8], [u8]> {
        FutureRecord::to(topic)
            .key(message.key.as_bytes())
            .payload(message.value.as_slice())
            .headers(export_headers(message.ulid, shard, &self.feed_name))
    }
}

/// The message key of an event: its key columns taken by name from the event row, in key
/// order, as a compact JSON object (written by hand, as `serde_json::Map` may sort its
/// keys); and the same columns put into `key` (kept from one event to the next: only the
/// values change).
fn message_key(
    key_columns: &[String],
    event: &Map<String, Value>,
    key: &mut Map<String, Value>,
) -> Result<String> {
    // Names and values are written straight into one buffer, the text `Value`'s `Display`
    // gives, rather than through a `Value::String` and a `String` each (six allocations per
    // message for a two-column key).
    let mut text = Vec::with_capacity(64);
    text.push(b'{');
    for (index, column) in key_columns.iter().enumerate() {
        let value = event.get(column).ok_or_else(|| Error::Decode {
            column: column.clone(),
            reason: "the feed's key column is not among the event row's columns; was the \
                     event table changed? Upgrade the feed (changefeed.upgrade_feed) and \
                     restart the export"
                .to_owned(),
            row: None,
        })?;
        if index > 0 {
            text.push(b',');
        }
        write_json(&mut text, column.as_str());
        text.push(b':');
        write_json(&mut text, value);
        match key.get_mut(column) {
            Some(slot) => slot.clone_from(value),
            None => {
                key.insert(column.clone(), value.clone());
            }
        }
    }
    text.push(b'}');
    Ok(String::from_utf8(text).expect("serde_json writes UTF-8"))
}

/// Appends `value` to `text` as compact JSON.
fn write_json(text: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    // Cannot fail: a string or a `Value` always serializes (a `Map`'s keys are strings),
    // and a `Vec` takes every byte.
    serde_json::to_writer(text, value).expect("a JSON value serializes into a Vec");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::Cursor;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        let Value::Object(map) = value else {
            unreachable!("an object")
        };
        map
    }

    fn key_of(columns: &[&str], event: &Map<String, Value>) -> Result<String> {
        let columns: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
        message_key(&columns, event, &mut Map::new())
    }

    #[test]
    fn keys_keep_key_order_and_are_compact() {
        let event = object(json!({"Region": "eu", "OrderId": 42, "Total": "9.50"}));
        let mut map = Map::new();
        let columns = vec!["Region".to_owned(), "OrderId".to_owned()];
        let text = message_key(&columns, &event, &mut map).unwrap();
        assert_eq!(text, r#"{"Region":"eu","OrderId":42}"#);
        assert_eq!(map, object(json!({"Region": "eu", "OrderId": 42})));
        assert_eq!(
            key_of(&["OrderId", "Region"], &event).unwrap(),
            r#"{"OrderId":42,"Region":"eu"}"#
        );
        let missing = key_of(&["Nope"], &event).unwrap_err();
        assert!(missing.to_string().contains("Nope"), "{missing}");
    }

    #[test]
    fn keys_escape_names_and_values_as_json_does() {
        let event = object(json!({"Na\"me": "é\n\"x\"", "Id": [1.5, null]}));
        let text = key_of(&["Na\"me", "Id"], &event).unwrap();
        let expected = format!(
            "{{{}:{},{}:{}}}",
            Value::String("Na\"me".to_owned()),
            event["Na\"me"],
            Value::String("Id".to_owned()),
            event["Id"]
        );
        assert_eq!(text, expected);
        assert_eq!(text, r#"{"Na\"me":"é\n\"x\"","Id":[1.5,null]}"#);
    }

    #[test]
    fn json_values_are_the_event_object() {
        let export = ExportEvent {
            feed: "dbo.Orders".to_owned(),
            shard: 0,
            ulid: Ulid::nil(),
            key: Map::new(),
            event: object(json!({"OrderId": 1, "Note": null})),
        };
        let bytes = JsonValues.serialize(&export).unwrap();
        let back: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, json!({"OrderId": 1, "Note": null}));
    }

    /// A serializer that writes out everything it was given.
    struct Echo;

    impl ValueSerializer for Echo {
        fn serialize(&self, event: &ExportEvent) -> std::result::Result<Vec<u8>, String> {
            let seen = json!([
                event.feed,
                event.shard,
                event.ulid.to_string(),
                event.key,
                event.event
            ]);
            Ok(seen.to_string().into_bytes())
        }
    }

    #[test]
    fn each_message_gets_its_own_event_key_and_row_and_the_rows_are_kept() {
        let rows: Vec<Option<Value>> = vec![
            Some(json!({"Id": 1, "Name": "one"})),
            None,
            Some(json!({"Id": 2, "Name": "two"})),
            Some(json!({"Id": 3, "Name": null})),
        ];
        let rows: Vec<FeedEvent<JsonColumns>> = rows
            .into_iter()
            .enumerate()
            .map(|(n, row)| FeedEvent {
                ulid: Ulid::from_parts(1, n as u128 + 1),
                event: JsonColumns(row.map(object)),
            })
            .collect();
        let expected_rows = rows.clone();
        let mut page = Page {
            next_cursor: Cursor::from_ulid(rows[3].ulid),
            page_size: 4,
            rows,
        };
        let messages = Messages {
            feed_name: "dbo.Things".to_owned(),
            key_columns: vec!["Id".to_owned()],
            serializer: Arc::new(Echo),
        };
        let built = messages.of_page(7, &mut page).unwrap();
        assert_eq!(
            page.rows, expected_rows,
            "the rows are put back as they were"
        );
        let ulids: Vec<Ulid> = built.iter().map(|m| m.ulid).collect();
        assert_eq!(
            ulids,
            [0, 2, 3].map(|n| page.rows[n].ulid),
            "the deleted row is skipped"
        );
        for (message, n) in built.iter().zip([0, 2, 3]) {
            let row = page.rows[n].event.0.clone().unwrap();
            assert_eq!(message.key, format!("{{\"Id\":{}}}", row["Id"]));
            let seen: Value = serde_json::from_slice(&message.value).unwrap();
            assert_eq!(
                seen,
                json!(["dbo.Things", 7, message.ulid.to_string(), {"Id": row["Id"]}, row])
            );
        }
    }
}
