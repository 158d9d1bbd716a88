//! The machine a figure was measured on, as one line: cores, load average, build profile.
//! Figures of one run are compared as ratios, and only beside this line.

#![allow(dead_code)] // bench_postgres_feed prints the line, bench_all its parts

/// `N cores, load average A B C, debug|release build`.
pub fn line() -> String {
    format!(
        "{} cores, load average {}, {} build",
        cores(),
        load(),
        profile()
    )
}

/// The cores this process may run on (0 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The 1, 5 and 15 minute load averages from /proc/loadavg, or `unknown`.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The build profile of this binary.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}
