//! Every metric the library and the command line record follows Prometheus' naming rules
//! (<https://prometheus.io/docs/practices/naming/> and the data model's name and label
//! grammar): a `changefeed_` prefix, `_total` on counters and only there, base units in
//! the name (`_seconds`), valid and unreserved label names. The labels themselves are
//! checked against real relay runs in tests/relay.rs (`metric_series_do_not_grow_with_
//! messages`).

use std::collections::BTreeSet;

use changefeed::metrics::{CATALOGUE, MetricKind};

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the metric name grammar.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved), the label name grammar.
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn every_metric_name_follows_prometheus_conventions() {
    let mut seen = BTreeSet::new();
    for metric in CATALOGUE {
        let name = metric.name;
        assert!(is_metric_name(name), "{name}: not a valid metric name");
        assert!(seen.insert(name), "{name} is listed twice");
        assert!(
            name.starts_with("changefeed_"),
            "{name}: every name starts with the application's prefix"
        );
        assert!(
            !name.contains("__") && !name.contains(':'),
            "{name}: colons are for recording rules, double underscores are reserved"
        );
        assert_eq!(
            name.ends_with("_total"),
            metric.kind == MetricKind::Counter,
            "{name}: counters, and only counters, end in _total"
        );
        for suffix in ["_bucket", "_sum", "_count", "_created", "_info"] {
            assert!(
                !name.ends_with(suffix),
                "{name}: {suffix} is what Prometheus adds to histograms and counters"
            );
        }
        // Base units: seconds, never milliseconds or minutes.
        for unit in ["_ms", "_milliseconds", "_minutes", "_hours", "_millis"] {
            assert!(!name.contains(unit), "{name}: use _seconds");
        }
        let help = metric.help.to_ascii_lowercase();
        if help.contains("duration") || help.starts_with("age") || help.contains("unix time") {
            assert!(
                name.ends_with("_seconds"),
                "{name}: a duration, age or time is in seconds, and says so"
            );
        }
        if help.contains("unix time") {
            assert!(name.ends_with("_timestamp_seconds"), "{name}");
        }
        if let MetricKind::Histogram(buckets) = metric.kind {
            assert!(!buckets.is_empty(), "{name}: no buckets");
            assert!(
                buckets.windows(2).all(|pair| pair[0] < pair[1]),
                "{name}: buckets must increase"
            );
        }
        assert!(
            !metric.help.is_empty() && !metric.help.contains('\n'),
            "{name}: one line of help"
        );
        let mut labels = BTreeSet::new();
        for &label in metric.labels {
            assert!(is_label_name(label), "{name}: label {label:?} is not valid");
            assert!(labels.insert(label), "{name}: label {label} twice");
            assert!(
                !["le", "quantile", "job", "instance"].contains(&label),
                "{name}: label {label} is reserved for Prometheus"
            );
            // Never an identifier of a message, an aggregate, a row or a claim: a series
            // per message would grow without bound.
            for unbounded in [
                "id",
                "message",
                "aggregate",
                "key",
                "token",
                "ulid",
                "cursor",
            ] {
                assert!(
                    !label.contains(unbounded),
                    "{name}: label {label} would carry an unbounded value"
                );
            }
        }
    }
}

#[test]
fn the_grammar_checks_refuse_bad_names() {
    assert!(is_metric_name("changefeed_relay_messages_claimed_total"));
    for bad in ["", "1abc", "a-b", "a b", "é"] {
        assert!(!is_metric_name(bad), "{bad:?}");
    }
    assert!(is_label_name("error_class"));
    for bad in ["", "__name__", "a:b", "2x", "a-b"] {
        assert!(!is_label_name(bad), "{bad:?}");
    }
}

#[test]
fn the_operating_document_lists_every_metric() {
    let operating = include_str!("../docs/operating.md");
    for metric in CATALOGUE {
        assert!(
            operating.contains(&format!("`{}`", metric.name)),
            "docs/operating.md's Metrics table must list `{}`",
            metric.name
        );
    }
}

#[test]
fn the_alert_rules_name_only_real_metrics() {
    let rules = include_str!("../examples/prometheus/changefeed-alerts.yml");
    let mut named = 0;
    for (start, _) in rules.match_indices("changefeed_") {
        let name: String = rules[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            changefeed::metrics::lookup(&name).is_some()
                || changefeed::metrics::lookup(base).is_some(),
            "the alert rules use {name}, which nothing records"
        );
        named += 1;
    }
    assert!(named >= 8, "the rules name the metrics they watch");
}
