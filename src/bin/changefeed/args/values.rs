//! The parsers of the command line's values: names (feeds, tables, columns, consumers),
//! counts, durations, Kafka brokers, topics and settings, the metrics address. Each returns
//! the reason a value is refused, which clap's error names the argument and value with.

use std::net::SocketAddr;

use changefeed::{Error, Feed};

use crate::duration::{CliDuration, parse_duration};

/// What an invalid table name is refused with: the reason alone (the value is quoted
/// by the caller).
fn name_error(error: Error) -> String {
    match error {
        Error::InvalidName { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// A feed name, checked with [`Feed`]'s rule (the one `setup_feed` applies).
pub fn parse_feed(text: &str) -> Result<Feed, String> {
    text.parse().map_err(name_error)
}

/// A column name for `setup_feed` (passed as a parameter; the procedure checks the
/// column itself).
pub fn parse_column(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the column name is empty".to_owned());
    }
    if text.chars().count() > 128 {
        return Err("a column name has at most 128 characters".to_owned());
    }
    if text.chars().any(char::is_control) {
        return Err("a column name cannot contain control characters".to_owned());
    }
    Ok(text.to_owned())
}

/// A count from 1 to `max`: the error says what is wrong with the text (the caller quotes
/// it and names the argument).
pub fn parse_count(text: &str, max: u64) -> Result<u64, String> {
    let range = format!("give a whole number from 1 to {max}");
    let trimmed = text.trim();
    let Ok(number) = trimmed.parse::<i128>() else {
        return Err(if trimmed.is_empty() {
            format!("the number is missing; {range}")
        } else if trimmed.parse::<f64>().is_ok() {
            format!("not a whole number; {range}")
        } else {
            format!("not a number; {range}")
        });
    };
    match u64::try_from(number) {
        Ok(count) if (1..=max).contains(&count) => Ok(count),
        _ if number < 0 => Err(format!("a count cannot be negative; {range}")),
        _ if number == 0 => Err(format!("a count of zero does nothing; {range}")),
        _ => Err(format!("too large; {range}")),
    }
}

/// A count from 1 to `MAX` as a `u32` (page and batch sizes).
pub fn parse_u32_up_to<const MAX: u32>(text: &str) -> Result<u32, String> {
    parse_count(text, u64::from(MAX)).map(|n| n as u32)
}

/// `--max-rows`: a count a `bigint` holds.
pub fn parse_max_rows(text: &str) -> Result<u64, String> {
    parse_count(text, i64::MAX as u64)
}

/// A duration other than zero; `zero` says why zero is refused and what to give instead.
fn parse_nonzero(text: &str, zero: &str) -> Result<CliDuration, String> {
    let duration = parse_duration(text)?;
    if duration.value.is_zero() {
        return Err(zero.to_owned());
    }
    Ok(duration)
}

/// `--connect-timeout` and `--broker-timeout`: a duration other than zero.
pub fn parse_timeout(text: &str) -> Result<CliDuration, String> {
    parse_nonzero(text, "a timeout of zero would never connect; give e.g. 15s")
}

/// `--shutdown-grace`: a duration other than zero.
pub fn parse_grace(text: &str) -> Result<CliDuration, String> {
    parse_nonzero(
        text,
        "a grace of zero would never let the batch in flight finish; give e.g. 10s",
    )
}

/// `--progress-interval`: a duration other than zero.
pub fn parse_interval(text: &str) -> Result<CliDuration, String> {
    parse_nonzero(
        text,
        "an interval of zero would print without pause; give e.g. 5s, or pass --quiet for no \
         progress lines",
    )
}

/// A duration above zero (`--ready-within`, `--backlog-interval`).
pub fn parse_positive(text: &str) -> Result<CliDuration, String> {
    parse_nonzero(text, "a duration of zero cannot be met; give e.g. 15s")
}

/// `--brokers`: librdkafka's `bootstrap.servers`, a comma-separated list of `host:port`,
/// returned without the spaces around its commas. Only the shape is checked here; whether
/// one answers is checked before the job starts.
pub fn parse_brokers(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("no brokers; give host:port[,host:port...]".to_owned());
    }
    let brokers: Vec<&str> = text.split(',').map(str::trim).collect();
    let bad = |broker: &str| {
        broker.is_empty() || broker.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    if let Some(broker) = brokers.iter().find(|broker| bad(broker)) {
        return Err(format!(
            "{broker:?} is not a broker; give host:port[,host:port...]"
        ));
    }
    Ok(brokers.join(","))
}

/// The longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

/// Refuses what cannot be (part of) a Kafka topic name, whose characters are ASCII
/// letters, digits, `.`, `_` and `-`.
fn topic_characters(text: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    match text.chars().find(|&c| !allowed(c)) {
        Some(c) => Err(format!(
            "{c:?} cannot be in a Kafka topic name; use ASCII letters, digits, '.', '_' and '-'"
        )),
        None if text.len() > MAX_TOPIC_LEN => Err(format!(
            "a Kafka topic name has at most {MAX_TOPIC_LEN} characters"
        )),
        None => Ok(()),
    }
}

/// `--topic`: a Kafka topic name.
pub fn parse_topic(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the topic is empty; name the Kafka topic".to_owned());
    }
    if text == "." || text == ".." {
        return Err("Kafka refuses the topic names '.' and '..'".to_owned());
    }
    topic_characters(text)?;
    Ok(text.to_owned())
}

/// `--topic-prefix` and `--dlq-suffix`: a part of a Kafka topic name, maybe empty.
pub fn parse_topic_affix(text: &str) -> Result<String, String> {
    topic_characters(text)?;
    Ok(text.to_owned())
}

/// `--consumer`: checked with the rule the cursor store applies.
pub fn parse_consumer(text: &str) -> Result<String, String> {
    match changefeed::cursor_store::check_consumer(text) {
        Ok(()) => Ok(text.to_owned()),
        Err(Error::Config(message)) => Err(message),
        Err(other) => Err(other.to_string()),
    }
}

/// `-X key=value`: a librdkafka setting. Only the shape is checked here; librdkafka judges
/// the key and the value when the producer is made.
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    const EXAMPLE: &str = "write key=value, e.g. -X compression.type=zstd";
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("no '=' in the producer setting; {EXAMPLE}"));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("the setting's name is missing; {EXAMPLE}"));
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{key:?} is not a setting name; {EXAMPLE}"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// Parses `--metrics-addr`: `HOST:PORT` with an IP address (IPv6 in brackets) or
/// `localhost`.
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    if let Some(port) = text.strip_prefix("localhost:")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    Err(format!(
        "{text:?} is not HOST:PORT with an IP address or localhost; e.g. 127.0.0.1:9187, \
         0.0.0.0:9187 (every interface) or [::1]:9187"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_say_what_is_wrong() {
        assert_eq!(parse_count("5", 10), Ok(5));
        assert_eq!(parse_count(" 10 ", 10), Ok(10));
        for (text, expect) in [
            ("-5", "negative"),
            ("0", "zero"),
            ("11", "too large"),
            ("1.5", "whole number"),
            ("five", "not a number"),
            ("", "missing"),
            ("99999999999999999999999999", "too large"),
        ] {
            let error = parse_count(text, 10).unwrap_err();
            assert!(error.contains(expect), "{text:?}: {error}");
            assert!(error.contains("from 1 to 10"), "{text:?}: {error}");
        }
    }

    #[test]
    fn feed_names_are_checked_before_anything_else() {
        assert_eq!(
            parse_feed("myservice.OrderPlaced").unwrap().to_string(),
            "myservice.OrderPlaced"
        );
        for bad in [
            "dbo.x]; drop table y",
            "dbo.x'; --",
            "x",
            "a.b.c",
            "changefeed.feeds",
        ] {
            let error = parse_feed(bad).expect_err(bad);
            assert!(!error.is_empty() && !error.contains('\n'), "{bad}: {error}");
        }
        assert!(parse_column("Shard").is_ok());
        assert!(parse_column(" ").is_err());
        assert!(parse_column("a\u{0}").is_err());
    }

    #[test]
    fn kafka_values_are_checked_with_a_reason() {
        assert_eq!(
            parse_brokers(" k1:9092, k2:9092 ").unwrap(),
            "k1:9092,k2:9092"
        );
        for bad in ["", " ", "k1:9092,", "k1:9092,,k2:9092", "k1 :9092"] {
            let error = parse_brokers(bad).expect_err(bad);
            assert!(error.contains("host:port"), "{bad:?}: {error}");
        }
        assert_eq!(parse_topic("prod.orders-v2_x").unwrap(), "prod.orders-v2_x");
        for bad in ["", ".", "..", "a b", "orders/1", &"t".repeat(250)] {
            assert!(parse_topic(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_topic_affix("").unwrap(), "");
        assert!(parse_topic_affix(".dead letters").is_err());
        assert_eq!(
            parse_setting("linger.ms=5").unwrap(),
            ("linger.ms".to_owned(), "5".to_owned())
        );
        assert_eq!(
            parse_setting("client.id=").unwrap(),
            ("client.id".to_owned(), String::new())
        );
        for bad in ["linger.ms", "=5", "bad key=1"] {
            let error = parse_setting(bad).expect_err(bad);
            assert!(error.contains("key=value"), "{bad:?}: {error}");
        }
        assert!(parse_consumer("to-kafka").is_ok());
        let error = parse_consumer(" to-kafka").unwrap_err();
        assert!(error.contains("whitespace"), "{error}");
        assert!(parse_interval("0s").unwrap_err().contains("--quiet"));
        assert_eq!(parse_interval("2s").unwrap().value, Duration::from_secs(2));
    }

    #[test]
    fn addresses_are_ip_and_port_or_localhost() {
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9187").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 9187))
        );
        assert_eq!(parse_metrics_addr("localhost:0").unwrap().port(), 0);
        assert!(parse_metrics_addr("[::1]:80").is_ok());
        for bad in [
            "",
            "9187",
            "127.0.0.1",
            "127.0.0.1:99999",
            "example.com:80",
            ":80",
        ] {
            let error = parse_metrics_addr(bad).unwrap_err();
            assert!(error.contains("HOST:PORT"), "{bad:?}: {error}");
        }
    }
}
