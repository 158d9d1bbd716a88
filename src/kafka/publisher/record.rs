//! How an outbox message becomes a Kafka record: its key and its headers (the names the
//! publisher adds, and the trace id's recognition).

use rdkafka::message::{Header, OwnedHeaders};

use crate::outbox::{ClaimedMessage, Headers};

/// Header carrying the outbox message's idempotency key, for consumers to drop duplicates.
pub const HEADER_MESSAGE_ID: &str = "message-id";
/// Header carrying the message's failed attempts before this publish (`0` the first time).
pub const HEADER_PUBLISH_ATTEMPTS: &str = "attempts";
/// Header carrying the row's trace id when it is a W3C `traceparent`.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// Header carrying the row's trace id when it is anything else (passed as it is).
pub const HEADER_TRACE_ID: &str = "trace-id";
/// Dead-letter header: present when the dead letter goes without its value because the
/// dead-letter topic refused it too (a message too large for the producer or the broker);
/// says why. The dead outbox row keeps the payload.
pub const HEADER_VALUE_OMITTED: &str = "x-value-omitted";

/// The record key: the partition key, else the aggregate id.
pub(super) fn message_key(message: &ClaimedMessage) -> Option<&str> {
    message
        .partition_key
        .as_deref()
        .or(message.aggregate_id.as_deref())
}

/// The record's headers: `base` without the names set here, then the idempotency key, the
/// attempts and the trace header.
pub(super) fn record_headers(
    base: &Headers,
    message_id: Option<&str>,
    attempts: Option<i32>,
    trace_id: Option<&str>,
) -> OwnedHeaders {
    let trace = trace_id.map(|id| {
        let name = if is_traceparent(id) {
            HEADER_TRACEPARENT
        } else {
            HEADER_TRACE_ID
        };
        (name, id)
    });
    let ours = |name: &str| {
        (message_id.is_some() && name == HEADER_MESSAGE_ID)
            || (attempts.is_some() && name == HEADER_PUBLISH_ATTEMPTS)
            || trace.is_some_and(|(trace_name, _)| name == trace_name)
    };
    let mut headers = OwnedHeaders::new_with_capacity(base.len() + 3);
    for (key, value) in base.iter().filter(|(key, _)| !ours(key)) {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_str()),
        });
    }
    if let Some(id) = message_id {
        headers = headers.insert(Header {
            key: HEADER_MESSAGE_ID,
            value: Some(id),
        });
    }
    if let Some(attempts) = attempts {
        // Formatted on the stack: a `String` here was one allocation per published message.
        let mut digits = [0u8; 11];
        headers = headers.insert(Header {
            key: HEADER_PUBLISH_ATTEMPTS,
            value: Some(decimal(attempts, &mut digits)),
        });
    }
    if let Some((name, id)) = trace {
        headers = headers.insert(Header {
            key: name,
            value: Some(id),
        });
    }
    headers
}

/// `n` in decimal, written into `buffer` (an `i32` takes at most 11 bytes: a sign and ten
/// digits).
fn decimal(n: i32, buffer: &mut [u8; 11]) -> &str {
    use std::io::Write as _;
    let mut rest = &mut buffer[..];
    // Eleven bytes always hold an i32, so the write cannot fail.
    let _ = write!(rest, "{n}");
    let written = 11 - rest.len();
    std::str::from_utf8(&buffer[..written]).unwrap_or_default()
}

/// Whether `value` is a W3C trace context `traceparent`: `version-trace_id-parent_id-flags`
/// in lower-case hex (2, 32, 16 and 2 digits), version not `ff`, ids not all zeros.
fn is_traceparent(value: &str) -> bool {
    // Exactly four fields, read off the split without collecting them: this runs for
    // every published message.
    let mut parts = value.split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    hex(version, 2)
        && version != "ff"
        // Version 00 has exactly these four fields; later versions may append more, which
        // the split above already refused, so only 00's shape is accepted.
        && hex(trace_id, 32)
        && nonzero(trace_id)
        && hex(parent_id, 16)
        && nonzero(parent_id)
        && hex(flags, 2)
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers as _;

    use super::*;

    #[test]
    fn decimal_writes_every_i32_as_to_string_does() {
        for n in [0, 1, 9, 10, 42, -1, -10, 1_000_000, i32::MAX, i32::MIN] {
            let mut buffer = [0u8; 11];
            assert_eq!(decimal(n, &mut buffer), n.to_string());
        }
    }

    fn header_map(headers: &OwnedHeaders) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                let value = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                (h.key.to_owned(), value.unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn a_w3c_traceparent_is_recognised() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for not in [
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "",
        ] {
            assert!(!is_traceparent(not), "{not}");
        }
    }

    #[test]
    fn record_headers_add_ours_once_after_the_rows() {
        let mut base = Headers::new();
        base.insert("content-type".into(), "application/json".into());
        base.insert("message-id".into(), "spoofed".into());
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let headers = header_map(&record_headers(
            &base,
            Some("m-1"),
            Some(2),
            Some(traceparent),
        ));
        assert_eq!(
            headers,
            vec![
                ("content-type".into(), "application/json".into()),
                ("message-id".into(), "m-1".into()),
                ("attempts".into(), "2".into()),
                ("traceparent".into(), traceparent.into()),
            ]
        );
        let headers = header_map(&record_headers(&base, None, None, Some("abc")));
        assert_eq!(
            headers,
            vec![
                ("content-type".into(), "application/json".into()),
                ("message-id".into(), "spoofed".into()),
                ("trace-id".into(), "abc".into()),
            ]
        );
    }
}
