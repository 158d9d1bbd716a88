//! Unit tests of the benchmark harness' pure parts (examples/bench/): its statistics
//! (nearest-rank percentiles, mean, throughput, ratios), its table and JSON output, its
//! command line, the shape of the SQL batches it sends, and figure 6's relay orchestration
//! against an in-memory claim store. The harness itself needs a SQL Server and is never run by tests; an
//! example's own `#[test]`s would not run under a plain `cargo test`, so the modules are
//! included here by path.

#[allow(dead_code)]
#[path = "../examples/bench/stats.rs"]
mod stats;

#[allow(dead_code)]
#[path = "../examples/bench/report.rs"]
mod report;

#[allow(dead_code)]
#[path = "../examples/bench/args.rs"]
mod args;

#[allow(dead_code)]
#[path = "../examples/bench/sql.rs"]
mod sql;

// The figures' code needs a server, except figure 6's relay orchestration, which runs
// here against an in-memory claim store.
#[allow(dead_code)]
#[path = "../examples/bench/load.rs"]
mod load;

#[allow(dead_code)]
#[path = "../examples/bench/scenarios.rs"]
mod scenarios;

use std::time::Duration;

use args::{Command, parse};
use report::{Row, format_number, format_ratio, table};
use stats::{Summary, delays_ms, mean, percentile, percentile_sorted, ratio, ratio_of, throughput};

fn one_to_hundred() -> Vec<f64> {
    (1..=100).map(f64::from).collect()
}

#[test]
fn nearest_rank_percentiles_of_1_to_100() {
    let samples = one_to_hundred();
    assert_eq!(percentile(&samples, 50.0), Some(50.0));
    assert_eq!(percentile(&samples, 95.0), Some(95.0));
    assert_eq!(percentile(&samples, 99.0), Some(99.0));
    assert_eq!(percentile(&samples, 100.0), Some(100.0));
    assert_eq!(percentile(&samples, 1.0), Some(1.0));
    // Rank ceil(0.5) = 1: the smallest sample, never an interpolation below it.
    assert_eq!(percentile(&samples, 0.5), Some(1.0));
    // Rank ceil(99.5) = 100.
    assert_eq!(percentile(&samples, 99.5), Some(100.0));
}

#[test]
fn percentiles_are_always_one_of_the_samples() {
    // Linear interpolation would give 1.5 and 2.5 here; nearest rank gives samples.
    assert_eq!(percentile(&[1.0, 2.0], 50.0), Some(1.0));
    assert_eq!(percentile(&[1.0, 2.0], 51.0), Some(2.0));
    assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.0));
    assert_eq!(percentile(&[10.0], 99.0), Some(10.0));
    assert_eq!(percentile(&[10.0], 1.0), Some(10.0));
}

#[test]
fn input_order_does_not_matter() {
    let mut shuffled = one_to_hundred();
    shuffled.reverse();
    shuffled.swap(3, 70);
    shuffled.swap(10, 99);
    for p in [1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 100.0] {
        assert_eq!(
            percentile(&shuffled, p),
            percentile(&one_to_hundred(), p),
            "p{p}"
        );
    }
    let sorted = stats::sorted(&shuffled);
    assert_eq!(sorted, one_to_hundred());
    assert_eq!(percentile_sorted(&sorted, 99.0), Some(99.0));
}

#[test]
fn fractional_percentiles_land_on_the_right_rank_for_large_samples() {
    let samples: Vec<f64> = (1..=1_000_000).map(f64::from).collect();
    assert_eq!(percentile_sorted(&samples, 99.0), Some(990_000.0));
    assert_eq!(percentile_sorted(&samples, 99.9), Some(999_000.0));
    assert_eq!(percentile_sorted(&samples, 50.0), Some(500_000.0));
    let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
    assert_eq!(percentile_sorted(&thousand, 99.9), Some(999.0));
    assert_eq!(percentile_sorted(&thousand, 95.0), Some(950.0));
}

#[test]
fn empty_input_and_bad_percentiles_give_none() {
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[f64::NAN], 50.0), None);
    let samples = one_to_hundred();
    assert_eq!(percentile(&samples, 0.0), None);
    assert_eq!(percentile(&samples, -1.0), None);
    assert_eq!(percentile(&samples, 100.1), None);
    assert_eq!(percentile(&samples, f64::NAN), None);
    assert_eq!(mean(&[]), None);
    assert_eq!(Summary::of(&[]), None);
    assert_eq!(Summary::of_durations(&[]), None);
}

#[test]
fn nan_samples_are_ignored() {
    let samples = [3.0, f64::NAN, 1.0, 2.0];
    assert_eq!(percentile(&samples, 100.0), Some(3.0));
    assert_eq!(mean(&samples), Some(2.0));
    assert_eq!(Summary::of(&samples).map(|s| s.count), Some(3));
}

#[test]
fn mean_and_summary_of_1_to_100() {
    assert_eq!(mean(&one_to_hundred()), Some(50.5));
    let summary = Summary::of(&one_to_hundred()).unwrap();
    assert_eq!(summary.count, 100);
    assert_eq!(summary.min, 1.0);
    assert_eq!(summary.max, 100.0);
    assert_eq!(summary.mean, 50.5);
    assert_eq!(summary.p50, 50.0);
    assert_eq!(summary.p95, 95.0);
    assert_eq!(summary.p99, 99.0);
}

#[test]
fn durations_are_summarized_in_milliseconds() {
    let durations: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    let summary = Summary::of_durations(&durations).unwrap();
    assert_eq!(summary.p50, 50.0);
    assert_eq!(summary.p99, 99.0);
    let micro = Summary::of_durations(&[Duration::from_micros(1500)]).unwrap();
    assert!((micro.p50 - 1.5).abs() < 1e-9);
}

#[test]
fn throughput_is_count_over_elapsed_seconds() {
    assert_eq!(throughput(1000, Duration::from_secs(2)), Some(500.0));
    assert_eq!(throughput(0, Duration::from_secs(2)), Some(0.0));
    assert_eq!(throughput(3, Duration::from_millis(1500)), Some(2.0));
    assert_eq!(throughput(1000, Duration::ZERO), None);
}

#[test]
fn ratio_guards_a_zero_baseline() {
    assert_eq!(ratio(50.0, 100.0), Some(0.5));
    assert_eq!(ratio(0.0, 100.0), Some(0.0));
    assert_eq!(ratio(50.0, 0.0), None);
    assert_eq!(ratio(50.0, -0.0), None);
    assert_eq!(ratio(f64::NAN, 1.0), None);
    assert_eq!(ratio(1.0, f64::INFINITY), None);
    assert_eq!(ratio_of(Some(3.0), Some(2.0)), Some(1.5));
    assert_eq!(ratio_of(None, Some(2.0)), None);
    assert_eq!(ratio_of(Some(3.0), None), None);
    assert_eq!(ratio_of(Some(3.0), Some(0.0)), None);
}

#[test]
fn delays_join_ends_to_starts_and_never_go_negative() {
    let t0 = std::time::Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let starts: std::collections::HashMap<i64, std::time::Instant> =
        [(1, at(10)), (2, at(20)), (3, at(30))]
            .into_iter()
            .collect();
    let ends = [(1, at(15)), (2, at(19)), (3, at(130)), (9, at(40))];
    let (delays, unmatched) = delays_ms(&starts, &ends);
    assert_eq!(delays, vec![5.0, 0.0, 100.0]);
    assert_eq!(unmatched, 1);
    let (none, unmatched) = delays_ms(&starts, &[]);
    assert!(none.is_empty() && unmatched == 0);
}

// ---------------------------------------------------------------------------------------
// The table and the JSON

fn sample_rows() -> Vec<Row> {
    vec![
        Row::measured(
            "1",
            "outbox write cost",
            &[("writers", "16".to_owned()), ("shards", "1".to_owned())],
            Some(8123.4),
            "events/s",
            Some(10_000.0),
            "the same transaction without the outbox insert",
        )
        .with_detail("81234 / 100000 events in 10.0 / 10.0 s"),
        Row::measured(
            "4",
            "commit-to-consumer latency p99",
            &[("writers", "4".to_owned())],
            Some(12.345),
            "ms",
            Some(0.0),
            "client polling",
        ),
        Row::failed(
            "6",
            "relay throughput",
            &[("relays", "2".to_owned())],
            "SQL Server error 229:\n  permission denied",
        ),
    ]
}

#[test]
fn numbers_are_formatted_for_reading() {
    assert_eq!(format_number(Some(1_234_567.4)), "1,234,567");
    assert_eq!(format_number(Some(1000.0)), "1,000");
    assert_eq!(format_number(Some(999.6)), "1000");
    assert_eq!(format_number(Some(123.4)), "123");
    assert_eq!(format_number(Some(12.34)), "12.3");
    assert_eq!(format_number(Some(1.234)), "1.23");
    assert_eq!(format_number(Some(0.1234)), "0.123");
    assert_eq!(format_number(Some(0.0)), "0.00");
    assert_eq!(format_number(Some(-2500.0)), "-2,500");
    assert_eq!(format_number(None), "-");
    assert_eq!(format_number(Some(f64::NAN)), "-");
    assert_eq!(format_ratio(Some(0.8123)), "0.81");
    assert_eq!(format_ratio(None), "-");
}

#[test]
fn the_table_is_aligned_and_shows_errors_in_their_row() {
    let text = table(&sample_rows());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 + 3, "{text}");
    assert!(lines[0].starts_with("figure"));
    assert!(lines[1].starts_with("------"));
    let header = lines[0];
    let at = |name: &str| header.find(name).unwrap();
    // Text columns start where their header starts.
    for (line, unit) in lines[2..].iter().zip(["events/s", "ms", ""]) {
        assert_eq!(
            &line[at("measurement") - 2..at("measurement")],
            "  ",
            "{line}"
        );
        if !unit.is_empty() {
            assert_eq!(&line[at("unit")..at("unit") + unit.len()], unit, "{line}");
        }
    }
    // Numbers end where their header ends (right-aligned).
    let value_end = at("value") + "value".len();
    let baseline_end = at("baseline") + "baseline".len();
    let ratio_end = at("ratio") + "ratio".len();
    let cell = |line: &str, end: usize| line[..end].split_whitespace().last().unwrap().to_owned();
    assert_eq!(cell(lines[2], value_end), "8,123");
    assert_eq!(cell(lines[2], baseline_end), "10,000");
    assert_eq!(cell(lines[2], ratio_end), "0.81");
    assert_eq!(cell(lines[3], value_end), "12.3");
    assert_eq!(cell(lines[3], baseline_end), "0.00");
    // A zero baseline gives no ratio.
    assert_eq!(cell(lines[3], ratio_end), "-");
    assert_eq!(
        &lines[2][at("detail")..],
        "81234 / 100000 events in 10.0 / 10.0 s"
    );
    // The failed row: "error" as its value, the error on one line as its detail.
    assert_eq!(cell(lines[4], value_end), "error");
    assert_eq!(
        &lines[4][at("detail")..],
        "SQL Server error 229: permission denied"
    );
    // No line ends in spaces (the detail column is not padded).
    assert!(lines.iter().all(|l| !l.ends_with(' ')));
}

#[test]
fn json_rows_carry_value_baseline_ratio_and_error() {
    let rows = sample_rows();
    let first = rows[0].to_json();
    assert_eq!(first["figure"], "1");
    assert_eq!(first["parameters"]["writers"], 16);
    assert_eq!(first["parameters"]["shards"], 1);
    assert_eq!(first["value"], 8123.4);
    assert_eq!(first["baseline"], 10_000.0);
    assert!((first["ratio"].as_f64().unwrap() - 0.81234).abs() < 1e-9);
    assert_eq!(first["unit"], "events/s");
    assert!(first["error"].is_null());

    let zero_baseline = rows[1].to_json();
    assert!(zero_baseline["ratio"].is_null());

    let failed = rows[2].to_json();
    assert!(failed["value"].is_null());
    assert!(failed["ratio"].is_null());
    assert_eq!(failed["error"], "SQL Server error 229: permission denied");
}

#[test]
fn the_legend_names_each_baseline_once() {
    let mut rows = sample_rows();
    rows.push(rows[0].clone());
    let legend = report::legend(&rows);
    assert_eq!(
        legend
            .matches("the same transaction without the outbox insert")
            .count(),
        1
    );
    assert!(legend.contains("client polling"));
}

// ---------------------------------------------------------------------------------------
// The command line

fn run_options(arguments: &[&str], env_url: Option<&str>) -> args::Options {
    match parse(arguments.iter().copied(), env_url.map(str::to_owned)) {
        Ok(Command::Run(options)) => options,
        other => panic!("{arguments:?}: {other:?}"),
    }
}

#[test]
fn help_wins_and_documents_every_option() {
    assert_eq!(parse(["--help"], None), Ok(Command::Help));
    assert_eq!(parse(["--quick", "-h"], None), Ok(Command::Help));
    for option in [
        "--url",
        "--quick",
        "--json",
        "--only",
        "--keep",
        "--rcsi",
        "--duration",
        "--rows",
        "--messages",
        "--rate",
        "--timeout",
        "--help",
        "CHANGEFEED_URL",
    ] {
        assert!(
            args::HELP.contains(option),
            "--help does not mention {option}"
        );
    }
}

#[test]
fn defaults_quick_and_the_url() {
    let default = run_options(&[], None);
    assert_eq!(default.url, None);
    assert!(!default.quick && !default.keep && !default.rcsi);
    assert_eq!(default.figures, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(default.duration, Duration::from_secs(10));
    assert_eq!(default.rows_per_shard, 50_000);
    assert_eq!(default.warmup(), Duration::from_secs(2));

    let quick = run_options(&["--quick"], Some("server=tcp:env,1433"));
    assert!(quick.quick);
    assert_eq!(quick.url.as_deref(), Some("server=tcp:env,1433"));
    assert_eq!(quick.duration, Duration::from_secs(1));
    assert_eq!(quick.rows_per_shard, 5_000);
    assert_eq!(quick.messages, 2_000);
    assert_eq!(quick.warmup(), Duration::from_millis(200));
    assert_eq!(quick.latency_duration(), Duration::from_secs(2));
    assert!(quick.timeout < default.timeout);

    // --url beats the environment; both forms of a value are accepted.
    let url = run_options(&["--url", "server=tcp:a,1;user=sa"], Some("server=tcp:env"));
    assert_eq!(url.url.as_deref(), Some("server=tcp:a,1;user=sa"));
    let inline = run_options(&["--url=server=tcp:b,1;user=sa", "--json=out.json"], None);
    assert_eq!(inline.url.as_deref(), Some("server=tcp:b,1;user=sa"));
    assert_eq!(inline.json.as_deref(), Some("out.json"));
    // An empty variable is no URL.
    assert_eq!(run_options(&[], Some("  ")).url, None);
}

#[test]
fn numbers_and_figures_are_checked() {
    let options = run_options(
        &[
            "--only",
            "6,1,1",
            "--duration",
            "0.5",
            "--rows",
            "100",
            "--messages",
            "10",
            "--rate",
            "0",
            "--timeout",
            "5",
            "--keep",
            "--rcsi",
        ],
        None,
    );
    assert_eq!(options.figures, vec![1, 6]);
    assert_eq!(options.duration, Duration::from_millis(500));
    assert_eq!(options.rows_per_shard, 100);
    assert_eq!(options.messages, 10);
    assert_eq!(options.rate, 0);
    assert_eq!(options.timeout, Duration::from_secs(5));
    assert!(options.keep && options.rcsi);
    assert_eq!(options.shard_counts(1), vec![1]);
    assert!(options.shard_counts(2).is_empty());

    let scaling = run_options(&["--only", "2,7"], None);
    assert_eq!(scaling.shard_counts(2), vec![1, 4, 16]);
    assert_eq!(scaling.shard_counts(1), vec![4, 16]);
    assert_eq!(scaling.shard_counts(3), vec![4, 16]);

    for bad in [
        &["--only", "8"][..],
        &["--only", ""],
        &["--only", "x"],
        &["--duration", "0"],
        &["--duration", "-1"],
        &["--duration", "soon"],
        &["--rows", "0"],
        &["--messages", "-5"],
        &["--rate", "1.5"],
        &["--url"],
        &["--url", ""],
        &["--json"],
        &["--quick=yes"],
        &["--frobnicate"],
        &["extra"],
    ] {
        let error = parse(bad.iter().copied(), None).expect_err(&format!("{bad:?}"));
        assert!(!error.contains('\n'), "{error}");
        assert!(!error.is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// The SQL batches (their meaning needs a server; their shape does not)

/// The `@Pn` placeholders a batch uses, ascending.
fn placeholders(batch: &str) -> Vec<u32> {
    let mut found: Vec<u32> = batch
        .match_indices("@P")
        .filter_map(|(at, _)| {
            let digits: String = batch[at + 2..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

fn every_batch() -> Vec<(&'static str, String, u32)> {
    let feed: changefeed::Feed = "bench.write_s1".parse().unwrap();
    let serialized: changefeed::Feed = "bench.serialized".parse().unwrap();
    let feed_table = feed.object("feed");
    vec![
        (
            "create_database",
            sql::create_database("changefeed_bench_7"),
            0,
        ),
        ("drop_database", sql::drop_database("changefeed_bench_7"), 0),
        ("single_user", sql::single_user("changefeed_bench_7"), 0),
        (
            "recovery_simple",
            sql::recovery_simple("changefeed_bench_7"),
            0,
        ),
        (
            "rcsi",
            sql::read_committed_snapshot_on("changefeed_bench_7"),
            0,
        ),
        ("create_schema", sql::create_schema(), 0),
        ("event_table", sql::event_table("write_plain_s1"), 0),
        ("outbox_feed", sql::outbox_feed("write_s1"), 0),
        (
            "plain_write",
            sql::plain_write(&sql::table("write_plain_s1")),
            2,
        ),
        ("outbox_write", sql::outbox_write(&feed), 3),
        (
            "serialized_setup",
            sql::serialized_setup("serialized", "serialized_plain"),
            0,
        ),
        (
            "serialized_write",
            sql::serialized_write(&serialized, 10_000),
            2,
        ),
        (
            "serialized_plain_write",
            sql::serialized_plain_write(&sql::table("serialized_plain")),
            3,
        ),
        (
            "serialized_insert",
            sql::serialized_insert(&serialized.quoted_table()),
            3,
        ),
        (
            "preload_events",
            sql::preload_events(&feed.quoted_table(), &feed.outbox_table()),
            4,
        ),
        ("assign_setup", sql::assign_setup(16), 0),
        (
            "plain_drain",
            sql::plain_drain("[bench].[o]", "[bench].[l]"),
            2,
        ),
        ("plain_replay", sql::plain_replay(&feed_table), 3),
        ("feed_heads", sql::feed_heads(&feed_table), 0),
        ("smallest_shard", sql::smallest_shard(&feed_table, 4), 0),
        ("setup_outbox", sql::setup_outbox("bench.relay_k1"), 0),
        (
            "preload_messages",
            sql::preload_messages("[bench].[relay_k1]"),
            1,
        ),
        ("done_count", sql::done_count("[bench].[relay_k1]"), 0),
        ("server_version", sql::SERVER_VERSION.to_owned(), 0),
        ("server_hardware", sql::SERVER_HARDWARE.to_owned(), 0),
    ]
}

#[test]
fn every_batch_uses_exactly_its_parameters() {
    for (name, batch, count) in every_batch() {
        let expected: Vec<u32> = (1..=count).collect();
        assert_eq!(placeholders(&batch), expected, "{name}: {batch}");
    }
}

#[test]
fn every_batch_is_filled_in_and_balanced() {
    for (name, batch, _) in every_batch() {
        let lower = batch.to_lowercase();
        // No format! placeholder left behind; the only braces are the JSON payload's.
        let without_json = batch.replace("{\"bench\":true}", "");
        assert!(
            !without_json.contains('{') && !without_json.contains('}'),
            "{name}: {batch}"
        );
        assert_eq!(
            lower.matches("begin transaction").count(),
            lower.matches("commit transaction").count(),
            "{name}: every transaction it opens it commits: {batch}"
        );
        if lower.contains("begin transaction") {
            assert!(lower.contains("set xact_abort on"), "{name}: {batch}");
        }
        assert!(!lower.contains("\ngo"), "{name}");
        assert_eq!(
            batch.matches('(').count(),
            batch.matches(')').count(),
            "{name}"
        );
        assert_eq!(
            batch.matches('[').count(),
            batch.matches(']').count(),
            "{name}"
        );
        assert_eq!(batch.matches('\'').count() % 2, 0, "{name}: {batch}");
    }
}

#[test]
fn batches_name_changefeeds_objects() {
    let feed: changefeed::Feed = "bench.write_s1".parse().unwrap();
    let write = sql::outbox_write(&feed);
    assert!(write.contains("insert into [bench].[write_s1] (id, payload)"));
    assert!(write.contains("insert into [changefeed].[outbox:bench.write_s1] (shard_id, id)"));

    let serialized: changefeed::Feed = "bench.serialized".parse().unwrap();
    let locked = sql::serialized_write(&serialized, 10_000);
    let lock_at = locked
        .find("exec [changefeed].[lock_feed:bench.serialized]")
        .unwrap();
    let ulid_at = locked
        .find("[changefeed].[ulid:bench.serialized](1)")
        .unwrap();
    assert!(
        lock_at < ulid_at,
        "lock_feed comes before ulid(1): {locked}"
    );
    assert!(locked.contains("@lock_timeout_ms = 10000"));

    let setup = sql::serialized_setup("serialized", "serialized_plain");
    assert!(setup.contains("@serialize_writers = 1"));
    assert!(setup.contains(
        "create unique index [serialized_shard_ulid] on [bench].[serialized] (shard, ulid)"
    ));
    assert!(setup.contains("[bench].[serialized_plain]"));

    // The plain replay compares the cursor as binary(16), the column's type.
    let replay = sql::plain_replay(&feed.object("feed"));
    assert!(replay.contains("from [changefeed].[feed:bench.write_s1]"));
    assert!(replay.contains("ulid > convert(binary(16), @P3) order by ulid"));

    // The plain drain takes the oldest rows of one shard and returns them in order.
    let drain = sql::plain_drain("[bench].[o]", "[bench].[l]");
    assert!(drain.contains("where shard_id = @P1 order by order_sequence"));
    assert!(
        drain
            .trim_end()
            .ends_with("select order_sequence, id from @m order by order_sequence;")
    );
}

#[test]
fn the_preload_puts_the_same_number_of_events_in_every_shard() {
    // shard = (id - base) % shards over ids base..base + shards × n, chunked like the
    // harness (chunks of 50 000 starting anywhere).
    let (base, shards, per_shard) = (1_234_567i64, 16i64, 5_000i64);
    let mut counts = vec![0i64; shards as usize];
    let total = shards * per_shard;
    let mut first = base;
    while first < base + total {
        let count = (base + total - first).min(50_000);
        for id in first..first + count {
            counts[((id - base) % shards) as usize] += 1;
        }
        first += count;
    }
    assert!(counts.iter().all(|c| *c == per_shard), "{counts:?}");
    assert!(sql::preload_events("[t]", "[o]").contains("convert(int, (id - @P4) % @P3)"));
}

// ---------------------------------------------------------------------------------------
// Figure 6's relays, against an in-memory claim store

mod fake {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use changefeed::outbox::{ClaimStore, ClaimToken, Claimed, ClaimedMessage, Failed};

    /// Pending ids shared by every store, as the outbox table is by every relay.
    #[derive(Clone, Default)]
    pub struct Outbox {
        pub pending: Arc<Mutex<VecDeque<i64>>>,
        pub done: Arc<AtomicU64>,
    }

    pub struct Store {
        pub outbox: Outbox,
        pub failure: Option<fn() -> changefeed::Error>,
    }

    impl ClaimStore for Store {
        async fn claim(
            &mut self,
            batch_size: u32,
            _claim_timeout: Duration,
        ) -> changefeed::Result<Vec<Claimed>> {
            if let Some(failure) = self.failure {
                return Err(failure());
            }
            // A claim takes a little time, like a round trip.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let ids: Vec<i64> = {
                let mut pending = self.outbox.pending.lock().unwrap();
                (0..batch_size).map_while(|_| pending.pop_front()).collect()
            };
            Ok(ids
                .into_iter()
                .map(|id| {
                    Claimed::Message(ClaimedMessage {
                        id,
                        message_id: id.to_string(),
                        topic: "bench".to_owned(),
                        aggregate_type: None,
                        aggregate_id: None,
                        partition_key: None,
                        payload: serde_json::json!({"bench": true}),
                        headers: Default::default(),
                        trace_id: None,
                        attempts: 0,
                        claim_token: ClaimToken::new(uuid::Uuid::nil()),
                    })
                })
                .collect())
        }

        async fn mark_done(&mut self, ids: &[i64], _token: ClaimToken) -> changefeed::Result<u64> {
            self.outbox
                .done
                .fetch_add(ids.len() as u64, Ordering::SeqCst);
            Ok(ids.len() as u64)
        }

        async fn mark_failed(&mut self, _failed: Failed<'_>) -> changefeed::Result<u64> {
            Ok(1)
        }

        async fn requeue(
            &mut self,
            _id: i64,
            _token: ClaimToken,
            _after: Duration,
        ) -> changefeed::Result<u64> {
            Ok(1)
        }
    }
}

fn relay_config() -> changefeed::relay::RelayConfig {
    changefeed::relay::RelayConfig::default()
        .batch_size(100)
        .poll_interval(Duration::from_millis(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_run_until_every_message_is_done_then_stop() {
    for relays in [1usize, 2, 4] {
        let outbox = fake::Outbox::default();
        outbox.pending.lock().unwrap().extend(1..=1000);
        let stores = (0..relays)
            .map(|_| fake::Store {
                outbox: outbox.clone(),
                failure: None,
            })
            .collect();
        let run = tokio::time::timeout(
            Duration::from_secs(20),
            scenarios::run_relays(stores, 1000, relay_config()),
        )
        .await
        .expect("the relays stop once every message is done")
        .unwrap_or_else(|e| panic!("{relays} relays: {e}"));
        assert_eq!(run.published, 1000, "{relays} relays");
        assert_eq!(outbox.done.load(std::sync::atomic::Ordering::SeqCst), 1000);
        assert!(run.elapsed > Duration::ZERO);
        // At least ten claims of 100 returned messages; every claim call was timed.
        assert!(
            run.claims.len() >= 10,
            "{relays} relays: {}",
            run.claims.len()
        );
        assert_eq!(run.loop_errors, 0);
        assert!(throughput(run.published, run.elapsed).is_some());
    }
}

#[tokio::test]
async fn relays_give_up_at_once_on_an_error_that_will_not_pass() {
    let outbox = fake::Outbox::default();
    outbox.pending.lock().unwrap().extend(1..=10);
    let permission_denied = || changefeed::Error::Server {
        number: 229,
        state: 5,
        class: 14,
        message: "The EXECUTE permission was denied".to_owned(),
    };
    let stores = vec![fake::Store {
        outbox,
        failure: Some(permission_denied),
    }];
    let error = tokio::time::timeout(
        Duration::from_secs(10),
        scenarios::run_relays(stores, 10, relay_config()),
    )
    .await
    .expect("a relay with a failing store is stopped, not waited for")
    .expect_err("no message was published");
    assert!(error.0.contains("EXECUTE permission"), "{error}");
}
