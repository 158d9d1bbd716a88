//! The harness' results: one [`Row`] per figure and parameter set, rendered as an aligned
//! table and as JSON.

use serde_json::{Map, Value, json};

use crate::stats::ratio_of;

/// One line of the results: a figure, its parameters, the value measured through
/// changefeed and the baseline measured next to it in the same run.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The figure: "1" to "6", or "7.1" to "7.3" for figures 1–3 at more shards.
    pub figure: String,
    /// What was measured, e.g. "outbox write cost".
    pub measurement: String,
    /// The parameters, in order, e.g. `[("writers", "4"), ("shards", "1")]`.
    pub parameters: Vec<(String, String)>,
    /// The figure itself (through changefeed); `None` if it failed.
    pub value: Option<f64>,
    /// The unit of `value` and `baseline`.
    pub unit: String,
    /// The baseline, measured side by side in the same run.
    pub baseline: Option<f64>,
    /// What the baseline is.
    pub baseline_label: String,
    /// Anything else worth knowing (counts, per-shard rates, other percentiles).
    pub detail: String,
    /// Why the measurement failed, if it did.
    pub error: Option<String>,
}

impl Row {
    /// A measured row.
    pub fn measured(
        figure: &str,
        measurement: &str,
        parameters: &[(&str, String)],
        value: Option<f64>,
        unit: &str,
        baseline: Option<f64>,
        baseline_label: &str,
    ) -> Row {
        Row {
            figure: figure.to_owned(),
            measurement: measurement.to_owned(),
            parameters: parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
            value,
            unit: unit.to_owned(),
            baseline,
            baseline_label: baseline_label.to_owned(),
            detail: String::new(),
            error: None,
        }
    }

    /// A row for a measurement that failed or ran out of time.
    pub fn failed(
        figure: &str,
        measurement: &str,
        parameters: &[(&str, String)],
        error: &str,
    ) -> Row {
        Row {
            error: Some(one_line(error)),
            ..Row::measured(figure, measurement, parameters, None, "", None, "")
        }
    }

    /// The same row with `detail`.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Row {
        self.detail = detail.into();
        self
    }

    /// `value / baseline`, when both exist and the baseline is not zero.
    pub fn ratio(&self) -> Option<f64> {
        ratio_of(self.value, self.baseline)
    }

    /// The parameters as `k=v k=v`.
    pub fn parameter_text(&self) -> String {
        self.parameters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The row as a JSON object; numeric parameters become numbers, missing figures null.
    pub fn to_json(&self) -> Value {
        let mut parameters = Map::new();
        for (key, text) in &self.parameters {
            let value = match text.parse::<i64>() {
                Ok(n) => json!(n),
                Err(_) => json!(text),
            };
            parameters.insert(key.clone(), value);
        }
        json!({
            "figure": self.figure,
            "measurement": self.measurement,
            "parameters": parameters,
            "value": finite(self.value),
            "unit": self.unit,
            "baseline": finite(self.baseline),
            "baseline_label": self.baseline_label,
            "ratio": finite(self.ratio()),
            "detail": self.detail,
            "error": self.error,
        })
    }
}

fn finite(value: Option<f64>) -> Value {
    match value {
        Some(v) if v.is_finite() => json!(v),
        _ => Value::Null,
    }
}

/// Newlines and runs of spaces collapsed, so an error fits one table row.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A number for the table: thousands separators from 1000 on, else three significant
/// digits or so (`12.3`, `1.23`, `0.123`); `-` for a missing one.
pub fn format_number(value: Option<f64>) -> String {
    let Some(v) = value else {
        return "-".to_owned();
    };
    if !v.is_finite() {
        return "-".to_owned();
    }
    let magnitude = v.abs();
    if magnitude >= 1000.0 {
        let rounded = v.round() as i64;
        let digits = rounded.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if rounded < 0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else if magnitude >= 100.0 {
        format!("{v:.0}")
    } else if magnitude >= 10.0 {
        format!("{v:.1}")
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A ratio for the table: two decimals, `-` when there is none.
pub fn format_ratio(ratio: Option<f64>) -> String {
    match ratio {
        Some(r) if r.is_finite() => format!("{r:.2}"),
        _ => "-".to_owned(),
    }
}

/// The header of the table.
pub const COLUMNS: [&str; 8] = [
    "figure",
    "measurement",
    "parameters",
    "value",
    "unit",
    "baseline",
    "ratio",
    "detail",
];

/// The rows as an aligned text table: text columns left-aligned, numbers right-aligned,
/// the last column (detail, or the error) unpadded. A failed row shows `error` as its
/// value and the error as its detail.
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|row| {
            let failed = row.error.is_some();
            [
                row.figure.clone(),
                row.measurement.clone(),
                row.parameter_text(),
                if failed {
                    "error".to_owned()
                } else {
                    format_number(row.value)
                },
                row.unit.clone(),
                format_number(row.baseline),
                format_ratio(row.ratio()),
                match &row.error {
                    Some(error) => error.clone(),
                    None => row.detail.clone(),
                },
            ]
        })
        .collect();
    let mut widths = COLUMNS.map(|c| c.chars().count());
    for line in &cells {
        for (width, cell) in widths.iter_mut().zip(line.iter()) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let right_aligned = [false, false, false, true, false, true, true, false];
    let render = |line: &[String]| -> String {
        let mut out = String::new();
        for (i, cell) in line.iter().enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i == line.len() - 1 {
                out.push_str(cell);
            } else if right_aligned[i] {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned()
    };
    let header: Vec<String> = COLUMNS.iter().map(|c| (*c).to_owned()).collect();
    let mut out = render(&header);
    out.push('\n');
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&render(&rule));
    out.push('\n');
    for line in &cells {
        out.push_str(&render(line));
        out.push('\n');
    }
    out
}

/// The legend printed under the table: each figure's baseline, once.
pub fn legend(rows: &[Row]) -> String {
    let mut seen: Vec<(String, String)> = Vec::new();
    for row in rows {
        if row.baseline_label.is_empty() {
            continue;
        }
        let figure = row.figure.clone();
        if !seen
            .iter()
            .any(|(f, l)| *f == figure && *l == row.baseline_label)
        {
            seen.push((figure, row.baseline_label.clone()));
        }
    }
    let mut out = String::from("ratio = value / baseline. Baselines:\n");
    for (figure, label) in seen {
        out.push_str(&format!("  {figure:<4} {label}\n"));
    }
    out
}
