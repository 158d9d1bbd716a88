//! `--log-format`: where the lines `relay` and `export` write on standard error go. Human
//! (the default) prints them as they are and nothing of the library's `tracing` events;
//! json installs tracing's JSON formatter, so every line (start, progress, stop, the final
//! error) and every library event at info level or above is one JSON object: `timestamp`,
//! `level`, `target`, `message`, the event's own fields (`outbox`, `feed`, `shard`, `id`,
//! `error`, `error_class`, ...) and, under `span`, the job's (`outbox` or `feed`).

use std::sync::OnceLock;

use crate::args::LogFormat;

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Sets the format for the rest of the process (once; later calls change nothing).
pub fn init(format: LogFormat) {
    if FORMAT.set(format).is_err() || format != LogFormat::Json {
        return;
    }
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .finish();
    // Only fails when a subscriber is already set, which nothing else in the tool does.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Whether lines go out as JSON.
pub fn json() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}
