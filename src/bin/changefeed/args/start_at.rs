//! `--from` of `tail` and `export`: where reading starts.

use std::time::SystemTime;

use changefeed::{Cursor, Error};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Where `tail` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// `start`: from the oldest retained event.
    Start,
    /// `now`: from the current time of this machine.
    Now,
    /// After this cursor.
    Cursor(Cursor),
    /// From the first event of this time on.
    Time(OffsetDateTime),
}

impl StartAt {
    /// The cursor to read from, `now` being the current time.
    pub fn cursor(self, now: SystemTime) -> Cursor {
        match self {
            StartAt::Start => Cursor::START,
            StartAt::Now => Cursor::at(now),
            StartAt::Cursor(cursor) => cursor,
            StartAt::Time(time) => Cursor::at(SystemTime::from(time)),
        }
    }
}

/// The forms `--from` accepts, for error messages.
pub const FROM_FORMS: &str = "use start (the oldest retained event), now, a 26-character ULID \
    cursor such as 01HX5Z8N3C0000000000000000, or an RFC 3339 time such as \
    2024-05-01T12:00:00Z";

/// Parses `--from`: `start`, `now` (case-insensitive), a ULID cursor, or an RFC 3339 time.
pub fn parse_from(text: &str) -> Result<StartAt, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("start") {
        return Ok(StartAt::Start);
    }
    if text.eq_ignore_ascii_case("now") {
        return Ok(StartAt::Now);
    }
    // An RFC 3339 time has '-' and ':', which a ULID never has; 26 characters alone do not
    // tell them apart (2024-05-01T12:00:00.12345Z is 26 long).
    let looks_like_ulid = text.len() == 26 && text.chars().all(|c| c.is_ascii_alphanumeric());
    if looks_like_ulid {
        // Cursor's parser refuses a first character past 7 (see Cursor::from_str).
        return match text.parse::<Cursor>() {
            Ok(cursor) => Ok(StartAt::Cursor(cursor)),
            Err(Error::InvalidCursor(reason)) => Err(format!("{reason}; {FROM_FORMS}")),
            Err(other) => Err(format!("{other}; {FROM_FORMS}")),
        };
    }
    match OffsetDateTime::parse(text, &Rfc3339) {
        Ok(time) => Ok(StartAt::Time(time)),
        Err(error) if text.contains(':') => Err(format!(
            "{text:?} is not an RFC 3339 time ({error}); {FROM_FORMS}"
        )),
        Err(_) => Err(format!("{text:?} is not a starting point; {FROM_FORMS}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn from_start_now_cursor_and_time() {
        let now = UNIX_EPOCH + Duration::from_millis(1_714_564_800_123);
        assert_eq!(parse_from("start").unwrap().cursor(now), Cursor::START);
        assert_eq!(parse_from("START").unwrap(), StartAt::Start);
        assert_eq!(parse_from("now").unwrap().cursor(now), Cursor::at(now));

        let cursor: Cursor = "01HX5Z8N3C0000000000000000".parse().unwrap();
        assert_eq!(
            parse_from("01HX5Z8N3C0000000000000000").unwrap(),
            StartAt::Cursor(cursor)
        );
        // Crockford base32 is case-insensitive.
        assert_eq!(
            parse_from("01hx5z8n3c0000000000000000").unwrap(),
            StartAt::Cursor(cursor)
        );

        let at = parse_from("2024-05-01T12:00:00.123Z").unwrap();
        assert_eq!(
            at.cursor(now),
            Cursor::at(UNIX_EPOCH + Duration::from_millis(1_714_564_800_123))
        );
        assert_eq!(at.cursor(now).to_string(), "01HWT0D7KV0000000000000000");
        // An offset is honoured: 14:00+02:00 is 12:00Z.
        assert_eq!(
            parse_from("2024-05-01T14:00:00+02:00").unwrap().cursor(now),
            parse_from("2024-05-01T12:00:00Z").unwrap().cursor(now)
        );
        // 26 characters long, yet a time, not a ULID.
        let tricky = "2024-05-01T12:00:00.12345Z";
        assert_eq!(tricky.len(), 26);
        assert!(matches!(parse_from(tricky).unwrap(), StartAt::Time(_)));
        // Before 1970: from the start.
        assert_eq!(
            parse_from("1969-12-31T23:59:59Z").unwrap().cursor(now),
            Cursor::START
        );
    }

    #[test]
    fn bad_from_names_every_accepted_form() {
        for text in [
            "",
            "yesterday",
            "01HX5Z8N3C",                 // too short for a ULID
            "01HX5Z8N3C000000000000000U", // U is not Crockford base32
            "81HX5Z8N3C0000000000000000", // more than 128 bits
            "2024-05-01",                 // a date, not a time
            "2024-05-01 12:00:00",        // no offset
            "2024-13-01T12:00:00Z",
            "1714564800",
        ] {
            let error = parse_from(text).expect_err(text);
            for form in ["start", "now", "ULID", "RFC 3339"] {
                assert!(error.contains(form), "{text:?}: {error}");
            }
            assert!(!error.contains('\n'), "{text:?}: one line");
        }
    }
}
