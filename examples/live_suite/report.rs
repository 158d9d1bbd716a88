//! The live suite's report: one line per scenario run, appended by the live-test harness
//! (`tests/common/mod.rs`, when [`REPORT_VARIABLE`] names a file) and read back by the
//! runner (`examples/live_suite.rs`), which prints it as a table.
//!
//! A line is five tab-separated fields: scenario, RCSI (`off`, `on`, or `-` where the
//! setting does not apply), result (`passed` or `failed`), milliseconds, and the failure's
//! message (empty when it passed). Tabs and line breaks inside a field are replaced by
//! spaces, so a line is always one record. Each record is written with one `write` to a
//! file opened for appending, so the lines of tests running in parallel do not interleave.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// The environment variable naming the report file. Unset: nothing is written.
pub const REPORT_VARIABLE: &str = "CHANGEFEED_LIVE_REPORT";

/// The longest failure message kept in a record, in characters: the whole message is in
/// the test's own output, the report only has to say which assertion it was.
const MAX_MESSAGE: usize = 300;

/// One run of one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// What ran, e.g. `live_reader::readers_never_skip_an_event`.
    pub scenario: String,
    /// READ_COMMITTED_SNAPSHOT of its database: `Some(false)` off, `Some(true)` on,
    /// `None` where it does not apply (the build, the benchmark).
    pub rcsi: Option<bool>,
    /// Why it failed; `None`: it passed.
    pub failure: Option<String>,
    /// How long it took.
    pub duration: Duration,
}

impl Record {
    /// A run that passed.
    pub fn passed(scenario: &str, rcsi: Option<bool>, duration: Duration) -> Record {
        Record {
            scenario: clean(scenario),
            rcsi,
            failure: None,
            duration,
        }
    }

    /// A run that failed with `message` (kept to its first [`MAX_MESSAGE`] characters).
    pub fn failed(scenario: &str, rcsi: Option<bool>, duration: Duration, message: &str) -> Record {
        let mut message = clean(message);
        if message.chars().count() > MAX_MESSAGE {
            message = message.chars().take(MAX_MESSAGE).collect::<String>() + "...";
        }
        Record {
            scenario: clean(scenario),
            rcsi,
            failure: Some(message),
            duration,
        }
    }

    /// Whether it passed.
    pub fn is_passed(&self) -> bool {
        self.failure.is_none()
    }

    /// The record as one line of the report file, with its line break.
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\n",
            self.scenario,
            rcsi_text(self.rcsi),
            if self.is_passed() { "passed" } else { "failed" },
            self.duration.as_millis(),
            self.failure.as_deref().unwrap_or("")
        )
    }

    /// Parses one line written by [`Record::to_line`] (without its line break).
    pub fn parse(line: &str) -> Result<Record, String> {
        let fields: Vec<&str> = line.split('\t').collect();
        let [scenario, rcsi, result, millis, message] = fields[..] else {
            return Err(format!(
                "expected 5 tab-separated fields (scenario, rcsi, result, ms, message), got {}",
                fields.len()
            ));
        };
        if scenario.is_empty() {
            return Err("the scenario is empty".to_owned());
        }
        let rcsi = match rcsi {
            "off" => Some(false),
            "on" => Some(true),
            "-" => None,
            other => return Err(format!("rcsi is {other:?}; expected off, on or -")),
        };
        let duration = millis
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("the time {millis:?} is not a number of milliseconds"))?;
        match result {
            "passed" if message.is_empty() => Ok(Record::passed(scenario, rcsi, duration)),
            "passed" => Err("a passed record carries a failure message".to_owned()),
            // As written: the writer already cleaned and shortened the message.
            "failed" => Ok(Record {
                scenario: scenario.to_owned(),
                rcsi,
                failure: Some(message.to_owned()),
                duration,
            }),
            other => Err(format!(
                "the result is {other:?}; expected passed or failed"
            )),
        }
    }
}

/// Appends `record` to the report file at `path` (created when missing).
pub fn append(path: &Path, record: &Record) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(record.to_line().as_bytes())
}

/// Parses a whole report; empty lines are skipped. A bad line is an error naming its
/// number, since a report the harness wrote is never malformed.
pub fn parse_report(text: &str) -> Result<Vec<Record>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            Record::parse(line).map_err(|error| format!("report line {}: {error}", index + 1))
        })
        .collect()
}

/// The records as an aligned table (scenario, RCSI, result, time) in the order given,
/// then one line counting them, then each failure's message.
pub fn table(records: &[Record]) -> String {
    let header = ["scenario", "RCSI", "result", "time"];
    let rows: Vec<[String; 4]> = records
        .iter()
        .map(|record| {
            [
                record.scenario.clone(),
                rcsi_text(record.rcsi).to_owned(),
                if record.is_passed() {
                    "passed"
                } else {
                    "FAILED"
                }
                .to_owned(),
                seconds(record.duration),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: [&str; 4]| {
        // Text columns left-aligned, the time right-aligned; no trailing spaces.
        let text = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(&mut out, header);
    let rule = widths.map(|w| "-".repeat(w));
    line(&mut out, [&rule[0], &rule[1], &rule[2], &rule[3]]);
    for row in &rows {
        line(&mut out, [&row[0], &row[1], &row[2], &row[3]]);
    }
    let failed: Vec<&Record> = records.iter().filter(|r| !r.is_passed()).collect();
    let total: Duration = records.iter().map(|r| r.duration).sum();
    let _ = writeln!(
        out,
        "{} runs: {} passed, {} failed ({} in all)",
        records.len(),
        records.len() - failed.len(),
        failed.len(),
        seconds(total)
    );
    for record in failed {
        let _ = writeln!(
            out,
            "FAILED {} (RCSI {}): {}",
            record.scenario,
            rcsi_text(record.rcsi),
            record.failure.as_deref().unwrap_or("")
        );
    }
    out
}

/// A panic's payload as text: the message of `panic!`/`assert!`, or a placeholder.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panicked with a non-text payload".to_owned())
}

fn rcsi_text(rcsi: Option<bool>) -> &'static str {
    match rcsi {
        Some(false) => "off",
        Some(true) => "on",
        None => "-",
    }
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// Tabs and line breaks become spaces, so that a field stays inside its line.
fn clean(text: &str) -> String {
    text.trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
