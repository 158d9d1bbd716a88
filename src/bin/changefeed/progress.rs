//! The progress line `relay` and `export` print on standard error every
//! `--progress-interval`: what it says (pure functions, tested below), the relay's counters
//! (its [`Hooks`]), and the loop that prints it while a job runs.

use std::collections::HashSet;
use std::future::Future;
use std::io::Write;
use std::pin::pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use changefeed::relay::{Hooks, PublishError};
use tokio::time::{Instant, MissedTickBehavior};
use ulid::Ulid;

use crate::output::{human_lag, one_line};

/// `count` over `elapsed` as a rate: `12/s`, with one decimal below 10 (`0.4/s`), `0/s`
/// for nothing or no time.
pub fn rate(count: u64, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    if count == 0 || seconds <= 0.0 {
        return "0/s".to_owned();
    }
    let per_second = count as f64 / seconds;
    if per_second < 9.95 {
        format!("{per_second:.1}/s")
    } else {
        format!("{per_second:.0}/s")
    }
}

/// The export's counters at one moment, as the line needs them (the library's
/// `ProgressSnapshot`, which exists only with the `kafka` feature).
// Used by `export`, which needs the kafka feature; tested in every build.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportCounts {
    /// Events produced and acknowledged.
    pub exported: u64,
    /// Events whose row was deleted before it was read.
    pub skipped_deleted: u64,
    /// How far behind the feed's head the furthest-behind shard is; `None`: caught up.
    pub behind: Option<Duration>,
    /// The last acknowledged event's ULID.
    pub last_ulid: Option<Ulid>,
}

/// `exported 1200 (240/s), behind 3.5 min, last ulid 01HX…`: the totals `now`, the rate
/// since `before` (`elapsed` ago), the lag or `caught up`, and the last event exported.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub fn export_line(before: &ExportCounts, now: &ExportCounts, elapsed: Duration) -> String {
    let mut line = format!(
        "exported {} ({})",
        now.exported,
        rate(now.exported.saturating_sub(before.exported), elapsed)
    );
    if now.skipped_deleted > 0 {
        line.push_str(&format!(
            ", {} skipped (deleted before read)",
            now.skipped_deleted
        ));
    }
    match now.behind {
        Some(lag) => {
            let ms = i64::try_from(lag.as_millis()).unwrap_or(i64::MAX);
            line.push_str(&format!(", behind {}", human_lag(ms)));
        }
        None => line.push_str(", caught up"),
    }
    match now.last_ulid {
        Some(ulid) => line.push_str(&format!(", last ulid {ulid}")),
        None => line.push_str(", no event yet"),
    }
    line
}

/// The relay's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayCounts {
    /// Messages published (marked done).
    pub published: u64,
    /// Messages that failed and wait for their retry.
    pub failed: u64,
    /// Messages marked dead.
    pub dead: u64,
    /// Dead letters not written (their rows are dead all the same).
    pub dead_letters_failed: u64,
    /// The error of the last message whose dead letter was not written: its own and the
    /// dead letter's, naming its topic and the dead-letter topic.
    pub last_dead_letter_failure: Option<String>,
    /// Errors outside a single message: store calls (retried) and publisher faults.
    pub errors: u64,
    /// The last of those errors.
    pub last_error: Option<String>,
    /// Why the last message failed or went dead (names its topic when the publisher's
    /// error does, e.g. a topic that refuses the producer).
    pub last_failure: Option<String>,
}

/// `published 1200 (240/s), failed 3, dead 0`, then `dead letters failed N` once one has,
/// and the last store or publisher error when one happened since `before` (the relay
/// retries those without a word otherwise).
pub fn relay_line(before: &RelayCounts, now: &RelayCounts, elapsed: Duration) -> String {
    let mut line = format!(
        "published {} ({}), failed {}, dead {}",
        now.published,
        rate(now.published.saturating_sub(before.published), elapsed),
        now.failed,
        now.dead
    );
    let new_dead_letter_failure = (now.dead_letters_failed > before.dead_letters_failed)
        .then_some(now.last_dead_letter_failure.as_ref())
        .flatten();
    let new_failures = (now.failed + now.dead).saturating_sub(before.failed + before.dead);
    if new_failures > 0
        && let Some(failure) = &now.last_failure
        && Some(failure) != new_dead_letter_failure
    {
        line.push_str(&format!(" (last failure: {})", one_line(failure)));
    }
    if now.dead_letters_failed > 0 {
        line.push_str(&format!(
            ", dead letters failed {}",
            now.dead_letters_failed
        ));
    }
    if let Some(failure) = new_dead_letter_failure {
        line.push_str(&format!(" (last: {})", one_line(failure)));
    }
    let new_errors = now.errors.saturating_sub(before.errors);
    if new_errors > 0 {
        line.push_str(&format!(", {new_errors} errors (retrying)"));
        if let Some(error) = &now.last_error {
            line.push_str(&format!(", last: {}", one_line(error)));
        }
    }
    line
}

/// The relay's [`Hooks`]: counts for the progress line.
#[derive(Debug, Default)]
pub struct RelayCounters {
    published: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    dead_letters_failed: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    last_failure: Mutex<Option<String>>,
    /// Messages whose dead letter failed and that are not yet marked dead (the relay calls
    /// `on_dead` for them next; other batches' hooks may come in between).
    dead_letter_failed: Mutex<HashSet<i64>>,
    last_dead_letter_failure: Mutex<Option<String>>,
}

impl RelayCounters {
    /// The counts now.
    pub fn snapshot(&self) -> RelayCounts {
        RelayCounts {
            published: self.published.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            dead_letters_failed: self.dead_letters_failed.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            last_error: self.last_error.lock().ok().and_then(|error| error.clone()),
            last_failure: self
                .last_failure
                .lock()
                .ok()
                .and_then(|failure| failure.clone()),
            last_dead_letter_failure: self
                .last_dead_letter_failure
                .lock()
                .ok()
                .and_then(|failure| failure.clone()),
        }
    }
}

impl Hooks for RelayCounters {
    fn on_published(&self, count: usize) {
        self.published.fetch_add(count as u64, Ordering::Relaxed);
    }

    fn on_failed(&self, _id: i64, error: &PublishError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.failure(error);
    }

    fn on_dead(&self, id: i64, error: &PublishError) {
        self.dead.fetch_add(1, Ordering::Relaxed);
        self.failure(error);
        // After a failed dead letter, the row's error says both errors and both topics.
        let letter_failed = self
            .dead_letter_failed
            .lock()
            .is_ok_and(|mut ids| ids.remove(&id));
        if letter_failed && let Ok(mut last) = self.last_dead_letter_failure.lock() {
            *last = Some(error.message.clone());
        }
    }

    fn on_dead_letter_failed(&self, id: i64, _error: &PublishError) {
        self.dead_letters_failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut ids) = self.dead_letter_failed.lock() {
            ids.insert(id);
        }
    }

    fn on_loop_error(&self, error: &changefeed::Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error.to_string());
        }
    }
}

impl RelayCounters {
    fn failure(&self, error: &PublishError) {
        if let Ok(mut last) = self.last_failure.lock() {
            *last = Some(error.message.clone());
        }
    }
}

/// Runs `work` to its end; meanwhile, every `every` (never when `None`: --quiet) hands
/// `line(time since the previous line)` to `print`.
pub async fn with_progress<F: Future>(
    work: F,
    every: Option<Duration>,
    mut line: impl FnMut(Duration) -> String,
    mut print: impl FnMut(&str),
) -> F::Output {
    let mut work = pin!(work);
    let Some(every) = every else {
        return work.await;
    };
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    // After a stall (a suspended laptop), one line, not a burst of them.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            biased;
            output = &mut work => return output,
            _ = ticks.tick() => {
                let now = Instant::now();
                print(&line(now - last));
                last = now;
            }
        }
    }
}

/// Prints a progress line on standard error (nothing to do if that is closed).
pub fn print_stderr(line: &str) {
    if crate::logging::json() {
        tracing::info!(target: "changefeed", "{line}");
        return;
    }
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_to_what_a_reader_needs() {
        assert_eq!(rate(0, Duration::from_secs(5)), "0/s");
        assert_eq!(rate(10, Duration::ZERO), "0/s");
        assert_eq!(rate(2, Duration::from_secs(5)), "0.4/s");
        assert_eq!(rate(49, Duration::from_secs(5)), "9.8/s");
        assert_eq!(rate(50, Duration::from_secs(5)), "10/s");
        assert_eq!(rate(1200, Duration::from_secs(5)), "240/s");
        assert_eq!(rate(1201, Duration::from_millis(5000)), "240/s");
    }

    #[test]
    fn the_export_line_says_the_rate_the_lag_and_the_last_ulid() {
        let ulid = Ulid::from_parts(1_714_564_800_123, 7);
        let before = ExportCounts {
            exported: 300,
            ..ExportCounts::default()
        };
        let now = ExportCounts {
            exported: 1500,
            skipped_deleted: 0,
            behind: Some(Duration::from_secs(210)),
            last_ulid: Some(ulid),
        };
        assert_eq!(
            export_line(&before, &now, Duration::from_secs(5)),
            format!("exported 1500 (240/s), behind 3.5 min, last ulid {ulid}")
        );
        let caught_up = ExportCounts {
            behind: None,
            skipped_deleted: 2,
            ..now.clone()
        };
        assert_eq!(
            export_line(&now, &caught_up, Duration::from_secs(5)),
            format!(
                "exported 1500 (0/s), 2 skipped (deleted before read), caught up, last ulid \
                 {ulid}"
            )
        );
        let idle = ExportCounts::default();
        assert_eq!(
            export_line(&idle, &idle, Duration::from_secs(5)),
            "exported 0 (0/s), caught up, no event yet"
        );
    }

    #[test]
    fn the_relay_line_counts_and_shows_new_errors_only() {
        let before = RelayCounts {
            published: 10,
            errors: 1,
            last_error: Some("old".into()),
            ..RelayCounts::default()
        };
        let now = RelayCounts {
            published: 60,
            failed: 3,
            dead: 1,
            ..before.clone()
        };
        assert_eq!(
            relay_line(&before, &now, Duration::from_secs(5)),
            "published 60 (10/s), failed 3, dead 1"
        );
        // A new failure shows why, naming the topic when the error does.
        let refused = RelayCounts {
            failed: 4,
            last_failure: Some("producing to secret: TopicAuthorizationFailed".into()),
            ..now.clone()
        };
        assert_eq!(
            relay_line(&now, &refused, Duration::from_secs(5)),
            "published 60 (0/s), failed 4, dead 1 (last failure: producing to secret: \
             TopicAuthorizationFailed)"
        );
        // A dead letter that failed: counted from then on, and the last failure (the
        // row's error) names both topics and both errors.
        let both = "producing to orders: MessageSizeTooLarge; its dead letter from topic \
                    orders to orders.dlq was not written either: retriable: producing to \
                    orders.dlq: TopicAuthorizationFailed";
        let undelivered = RelayCounts {
            dead: 2,
            dead_letters_failed: 1,
            last_failure: Some(both.into()),
            last_dead_letter_failure: Some(both.into()),
            ..now.clone()
        };
        assert_eq!(
            relay_line(&now, &undelivered, Duration::from_secs(5)),
            format!("published 60 (0/s), failed 3, dead 2, dead letters failed 1 (last: {both})")
        );
        // Another failure since: both are said; an old dead-letter failure only counted.
        let later = RelayCounts {
            failed: 4,
            last_failure: Some("producing to orders: MsgTimedOut".into()),
            ..undelivered.clone()
        };
        assert_eq!(
            relay_line(&now, &later, Duration::from_secs(5)),
            format!(
                "published 60 (0/s), failed 4, dead 2 (last failure: producing to orders: \
                 MsgTimedOut), dead letters failed 1 (last: {both})"
            )
        );
        assert_eq!(
            relay_line(&undelivered, &later, Duration::from_secs(5)),
            "published 60 (0/s), failed 4, dead 2 (last failure: producing to orders: \
             MsgTimedOut), dead letters failed 1"
        );
        let failing = RelayCounts {
            errors: 3,
            last_error: Some("connection: cannot reach SQL Server\nat db:1433".into()),
            ..now.clone()
        };
        let line = relay_line(&now, &failing, Duration::from_secs(5));
        assert_eq!(
            line,
            "published 60 (0/s), failed 3, dead 1, 2 errors (retrying), last: connection: \
             cannot reach SQL Server\\nat db:1433"
        );
    }

    #[test]
    fn the_counters_follow_the_hooks() {
        let counters = RelayCounters::default();
        counters.on_published(5);
        counters.on_published(2);
        counters.on_failed(1, &PublishError::retriable("x"));
        // Another batch's hooks may come between a dead letter's failure and its row's
        // on_dead.
        counters.on_dead_letter_failed(3, &PublishError::retriable("dlq refused"));
        counters.on_dead(3, &PublishError::poison("z; its dead letter failed"));
        counters.on_dead(2, &PublishError::poison("y"));
        counters.on_loop_error(&changefeed::Error::Config("z".into()));
        assert_eq!(
            counters.snapshot(),
            RelayCounts {
                published: 7,
                failed: 1,
                dead: 2,
                dead_letters_failed: 1,
                errors: 1,
                last_error: Some("configuration: z".into()),
                last_failure: Some("y".into()),
                last_dead_letter_failure: Some("z; its dead letter failed".into()),
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_every_interval_while_the_work_runs_and_none_when_quiet() {
        let mut printed = Vec::new();
        let output = with_progress(
            async {
                tokio::time::sleep(Duration::from_millis(12_500)).await;
                42
            },
            Some(Duration::from_secs(5)),
            |elapsed| format!("after {elapsed:?}"),
            |line| printed.push(line.to_owned()),
        )
        .await;
        assert_eq!(output, 42);
        assert_eq!(printed, ["after 5s", "after 5s"]);

        let mut printed = Vec::new();
        with_progress(
            tokio::time::sleep(Duration::from_secs(60)),
            None,
            |_| "never".to_owned(),
            |line| printed.push(line.to_owned()),
        )
        .await;
        assert!(printed.is_empty());
    }
}
