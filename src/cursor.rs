//! [`Cursor`]: a consumer's position in a feed shard.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ulid::Ulid;

use crate::error::{Error, Result};

/// A position in one shard of a feed: the ULID of the last row a consumer processed.
/// `read_feed` returns the rows with a ULID greater than the cursor.
///
/// Its text form is the ULID's 26-character Crockford base32, so cursors can be stored,
/// logged and passed on the command line.
///
/// ```
/// use changefeed::Cursor;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let start = Cursor::START;
/// assert_eq!(start.to_string(), "00000000000000000000000000");
/// let replay = Cursor::at(UNIX_EPOCH + Duration::from_millis(1_672_671_845_000));
/// assert_eq!(replay.to_string(), "01GNSG5PM80000000000000000");
/// assert_eq!(replay.to_string().parse::<Cursor>()?, replay);
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cursor(Ulid);

impl Cursor {
    /// Before every row: a consumer starting here reads the feed from its beginning.
    pub const START: Cursor = Cursor(Ulid(0));

    /// The position just before the first row written at `time` or later: the ULID of
    /// that millisecond with a zero tail. Replaying from here returns every row whose
    /// ULID time is `time` or later. Times before 1970 give [`Cursor::START`]; times past
    /// the ULID's 48-bit millisecond range give the last position of that range.
    pub fn at(time: SystemTime) -> Cursor {
        let ms = time
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
            .min((1u128 << 48) - 1);
        Cursor(Ulid(ms << 80))
    }

    /// The cursor at a row's ULID: the next read returns the rows after it.
    pub const fn from_ulid(ulid: Ulid) -> Cursor {
        Cursor(ulid)
    }

    /// A cursor from its 16 bytes as stored in `binary(16)`. Any other length is an
    /// error, never padded: a truncated cursor would silently move the consumer.
    pub fn from_bytes(bytes: &[u8]) -> Result<Cursor> {
        let array: [u8; 16] = bytes.try_into().map_err(|_| {
            Error::InvalidCursor(format!(
                "a cursor is exactly 16 bytes (binary(16)), got {}; pass the ulid column of \
                 the last row read, unchanged",
                bytes.len()
            ))
        })?;
        Ok(Cursor(Ulid::from_bytes(array)))
    }

    /// The 16 bytes to pass as `read_feed`'s `@cursor` (which refuses any other length).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_bytes()
    }

    /// The ULID this cursor stands at.
    pub fn ulid(self) -> Ulid {
        self.0
    }

    /// The time carried by the cursor's ULID (milliseconds since 1970).
    pub fn time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0.timestamp_ms())
    }
}

impl From<Ulid> for Cursor {
    fn from(ulid: Ulid) -> Self {
        Cursor(ulid)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Cursor {
    type Err = Error;

    /// Parses the 26-character Crockford base32 form (case-insensitive). 26 characters hold
    /// 130 bits, so the first must be `0`–`7`; the ulid crate would silently drop the top
    /// bits of a larger one, which would move a consumer somewhere else without a word.
    fn from_str(text: &str) -> Result<Self> {
        if text.len() == 26 && !matches!(text.as_bytes()[0], b'0'..=b'7') {
            return Err(Error::InvalidCursor(format!(
                "{text:?} is not a ULID: its first character must be 0-7 (26 Crockford base32 \
                 characters carry 128 bits); pass a cursor as printed by a previous read"
            )));
        }
        Ulid::from_string(text).map(Cursor).map_err(|error| {
            Error::InvalidCursor(format!(
                "{text:?} is not a ULID ({error}); a cursor is 26 Crockford base32 characters, \
                 as printed by a previous read"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn start_is_below_every_ulid() {
        assert_eq!(Cursor::START.to_bytes(), [0; 16]);
        assert!(Cursor::START < Cursor::from_ulid(Ulid(1)));
    }

    #[test]
    fn wrong_lengths_are_errors_not_padding() {
        for len in [0, 1, 8, 15, 17, 32] {
            let error = Cursor::from_bytes(&vec![1u8; len]).unwrap_err();
            assert!(error.to_string().contains("exactly 16 bytes"), "{error}");
        }
        assert!("01GNSG5PM8".parse::<Cursor>().is_err());
        // 26 characters hold 130 bits: a first character above 7 does not fit in a ULID.
        assert!("81GNSG5PM8ZZZVZZZZZZZZZZZZ".parse::<Cursor>().is_err());
        assert!("ZZZZZZZZZZZZZZZZZZZZZZZZZZ".parse::<Cursor>().is_err());
        assert!("7ZZZZZZZZZZZZZZZZZZZZZZZZZ".parse::<Cursor>().is_ok());
        assert!("01GNSG5PM8ZZZVZZZZZZZZZZZU".parse::<Cursor>().is_err());
    }

    #[test]
    fn time_cursor_has_a_zero_tail_and_sorts_before_that_millisecond() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let cursor = Cursor::at(t);
        assert_eq!(&cursor.to_bytes()[6..], &[0; 10]);
        assert_eq!(cursor.time(), t);
        let first_of_that_ms = crate::allocator::ulid_from_parts(1_700_000_000_123, 0, 0);
        assert!(Cursor::from_ulid(first_of_that_ms) >= cursor);
        let last_of_previous_ms =
            crate::allocator::ulid_from_parts(1_700_000_000_122, u16::MAX, -1);
        assert!(Cursor::from_ulid(last_of_previous_ms) < cursor);
        assert_eq!(
            Cursor::at(UNIX_EPOCH - Duration::from_secs(5)),
            Cursor::START
        );
    }

    proptest! {
        #[test]
        fn text_and_bytes_round_trip(value in any::<u128>()) {
            let cursor = Cursor::from_ulid(Ulid(value));
            prop_assert_eq!(cursor.to_string().parse::<Cursor>().unwrap(), cursor);
            prop_assert_eq!(cursor.to_string().to_lowercase().parse::<Cursor>().unwrap(), cursor);
            prop_assert_eq!(Cursor::from_bytes(&cursor.to_bytes()).unwrap(), cursor);
        }

        #[test]
        fn time_cursors_are_monotonic(a in 0u64..(1 << 48), b in 0u64..(1 << 48)) {
            let ca = Cursor::at(UNIX_EPOCH + Duration::from_millis(a));
            let cb = Cursor::at(UNIX_EPOCH + Duration::from_millis(b));
            prop_assert_eq!(a.cmp(&b), ca.cmp(&cb));
        }
    }
}
