//! The figures a benchmark hands on to `bench_all`: when [`VARIABLE`] names a file, each
//! headline figure is appended to it as one tab-separated line (figure, value, baseline,
//! ratio), and `bench_all` reads them back into its one table. Without the variable nothing
//! is written: a benchmark run on its own prints only its own table.

#![allow(dead_code)] // the benchmarks write figures, bench_all reads them

use std::io::Write;

/// The environment variable naming the file the figures are appended to.
pub const VARIABLE: &str = "CHANGEFEED_BENCH_FIGURES";

/// One figure: what it is, its value and its baseline as printed (with their units), and
/// the ratio of the value to the baseline when both were measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub figure: String,
    pub value: String,
    pub baseline: String,
    pub ratio: Option<f64>,
}

/// Appends `figure` to the file [`VARIABLE`] names, if any. A file that cannot be written
/// is said on standard error: the benchmark's own table is printed either way.
pub fn record(figure: &str, value: &str, baseline: &str, ratio: Option<f64>) {
    let Some(path) = std::env::var_os(VARIABLE) else {
        return;
    };
    // A tab or a line break inside a cell would split the line: each becomes a space.
    let clean = |cell: &str| cell.replace(['\t', '\n', '\r'], " ");
    let ratio = ratio.map_or_else(String::new, |r| format!("{r:.2}"));
    let line = format!(
        "{}\t{}\t{}\t{ratio}\n",
        clean(figure),
        clean(value),
        clean(baseline)
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        eprintln!(
            "bench: could not append a figure to {} ({VARIABLE}): {error}",
            path.to_string_lossy()
        );
    }
}

/// The figures in `text` (what [`record`] wrote), in order; a line that is not four cells
/// is skipped.
pub fn parse(text: &str) -> Vec<Figure> {
    text.lines()
        .filter_map(|line| {
            let mut cells = line.split('\t');
            let (figure, value, baseline, ratio) =
                (cells.next()?, cells.next()?, cells.next()?, cells.next()?);
            Some(Figure {
                figure: figure.to_owned(),
                value: value.to_owned(),
                baseline: baseline.to_owned(),
                ratio: ratio.parse().ok(),
            })
        })
        .collect()
}
