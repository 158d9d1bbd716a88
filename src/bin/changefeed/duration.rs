//! Durations on the command line: an integer and one unit, e.g. `500ms`, `30s`, `15m`,
//! `12h`, `30d`, `2w`.

use std::fmt;
use std::time::Duration;

/// The forms a duration may take, for error messages.
pub const ACCEPTED: &str = "write a whole number and one unit: ms, s, m (minutes), h, d (days) or w (weeks), e.g. \
     500ms, 30s, 15m, 12h, 30d, 2w";

/// The longest cutoff the purge procedures accept: 100 years of 365.25 days
/// (`@older_than_ms` up to 3 155 760 000 000).
pub const MAX_RETENTION: Duration = Duration::from_millis(3_155_760_000_000);

/// A duration as given on the command line: its value and its text (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliDuration {
    /// The value.
    pub value: Duration,
    text: String,
}

impl CliDuration {
    /// The value in whole milliseconds, as the procedures take it (`bigint`): every parsed
    /// duration is a whole number of milliseconds that fits.
    pub fn as_millis_i64(&self) -> i64 {
        i64::try_from(self.value.as_millis()).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for CliDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses `<integer><unit>`: units `ms`, `s`, `m`, `h`, `d`, `w`, case-insensitive,
/// surrounding spaces ignored, no space between number and unit. Zero is accepted;
/// negative numbers, fractions, a missing number or unit, an unknown unit and values that
/// overflow (past `i64::MAX` milliseconds, SQL Server's bigint) are refused with a message
/// that says what to write.
pub fn parse_duration(text: &str) -> Result<CliDuration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("the duration is empty; {ACCEPTED}"));
    }
    if trimmed.starts_with('-') {
        return Err(format!("a duration cannot be negative; {ACCEPTED}"));
    }
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{trimmed:?} does not start with a number; {ACCEPTED}"
        ));
    }
    if unit.is_empty() {
        return Err(format!("{trimmed:?} has no unit; {ACCEPTED}"));
    }
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "{trimmed:?} is not a whole number; use a smaller unit instead (e.g. 90m, not \
             1.5h); {ACCEPTED}"
        ));
    }
    let too_large = || format!("{trimmed:?} is too large; {ACCEPTED}");
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    let unit = unit.to_ascii_lowercase();
    let millis_per_unit: u64 = match unit.as_str() {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => {
            return Err(format!(
                "{trimmed:?} has an unknown unit {unit:?}; {ACCEPTED}"
            ));
        }
    };
    // Every caller hands the value to SQL Server in milliseconds, as a bigint.
    let millis = number
        .checked_mul(millis_per_unit)
        .filter(|&ms| i64::try_from(ms).is_ok())
        .ok_or_else(too_large)?;
    Ok(CliDuration {
        value: Duration::from_millis(millis),
        text: format!("{number}{unit}"),
    })
}

/// [`parse_duration`], and no longer than [`MAX_RETENTION`] (what the purge procedures
/// accept): for `--older-than`.
pub fn parse_retention(text: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value > MAX_RETENTION {
        return Err(format!(
            "{duration} is more than 100 years (36525d), the longest cutoff the purge \
             procedures accept"
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse_duration(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .value
    }

    #[test]
    fn every_unit() {
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("15m"), Duration::from_secs(15 * 60));
        assert_eq!(ok("12h"), Duration::from_secs(12 * 3600));
        assert_eq!(ok("30d"), Duration::from_secs(30 * 86_400));
        assert_eq!(ok("2w"), Duration::from_secs(14 * 86_400));
    }

    #[test]
    fn units_are_case_insensitive_and_spaces_around_are_ignored() {
        assert_eq!(ok("30D"), ok("30d"));
        assert_eq!(ok("500MS"), ok("500ms"));
        assert_eq!(ok("2W"), ok("2w"));
        assert_eq!(ok(" 7d "), ok("7d"));
        assert_eq!(parse_duration("30D").unwrap().to_string(), "30d");
    }

    #[test]
    fn zero_is_accepted() {
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("0ms"), Duration::ZERO);
        assert_eq!(ok("0d"), Duration::ZERO);
    }

    #[test]
    fn four_hundred_days_and_its_milliseconds() {
        let d = parse_duration("400d").unwrap();
        assert_eq!(d.value, Duration::from_secs(400 * 86_400));
        assert_eq!(d.as_millis_i64(), 34_560_000_000);
        assert_eq!(parse_retention("400d").unwrap(), d);
    }

    #[test]
    fn bad_forms_are_refused_with_the_accepted_forms() {
        for text in [
            "",
            "  ",
            "30",
            "d",
            "-5d",
            "-0s",
            "1.5h",
            "1,5h",
            "30x",
            "30 d",
            "30dd",
            "ms",
            "+5d",
            "5 ",
            "five days",
            "30mins",
            "1e3s",
        ] {
            if text == "5 " {
                // trimmed to "5": no unit
                assert!(parse_duration(text).unwrap_err().contains("no unit"));
                continue;
            }
            let error = parse_duration(text).expect_err(text);
            assert!(error.contains("e.g. 500ms"), "{text:?}: {error}");
            assert!(!error.contains('\n'), "{text:?}: one line");
        }
        assert!(parse_duration("-5d").unwrap_err().contains("negative"));
        assert!(parse_duration("30").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("30x")
                .unwrap_err()
                .contains("unknown unit \"x\"")
        );
        assert!(parse_duration("1.5h").unwrap_err().contains("whole number"));
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        for text in [
            "18446744073709551616ms", // u64::MAX + 1
            "18446744073709551615ms", // fits u64, not a bigint
            "99999999999999999999999s",
            "18446744073709551615w", // fits u64, the product does not
            "30500000000000000d",    // fits u64 seconds, not i64 milliseconds
            "9223372036854776s",     // one second past i64::MAX ms
        ] {
            let error = parse_duration(text).expect_err(text);
            assert!(error.contains("too large"), "{text}: {error}");
        }
        // The largest that fits in milliseconds as a bigint.
        assert_eq!(
            parse_duration("9223372036854775s").unwrap().as_millis_i64(),
            9_223_372_036_854_775_000
        );
        assert_eq!(
            parse_duration("9223372036854775807ms")
                .unwrap()
                .as_millis_i64(),
            i64::MAX
        );
        assert!(parse_duration("9223372036854775808ms").is_err());
    }

    #[test]
    fn retention_is_at_most_a_hundred_years() {
        assert_eq!(parse_retention("36525d").unwrap().value, MAX_RETENTION);
        let error = parse_retention("36526d").unwrap_err();
        assert!(error.contains("100 years"), "{error}");
        assert!(parse_retention("0d").is_ok());
        assert!(parse_retention("x").is_err());
    }
}
