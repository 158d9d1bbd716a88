//! What the commands print: aligned tables, JSON lines, human lags, and the one writer
//! that flushes every line.

use std::io::Write;

use serde_json::Value;
use tiberius::ColumnData;
use ulid::Ulid;

use crate::failure::Failure;
use changefeed::json::column_json;

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table printed with its columns aligned: a header line, then one line per row, cells
/// separated by two spaces.
#[derive(Clone, Debug)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(name, _)| (*name).to_owned()).collect(),
            align: columns.iter().map(|(_, align)| *align).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank, extra ones dropped. Control characters are
    /// escaped so that a row stays on one line.
    pub fn push(&mut self, row: Vec<String>) {
        let mut row: Vec<String> = row.into_iter().map(|cell| one_line(&cell)).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// The table as text, every line ending in a newline and without trailing spaces;
    /// `empty` (e.g. "(no feeds)") on the line after the header when there are no rows.
    pub fn render(&self, empty: &str) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|row| row[i].chars().count())
                    .chain(std::iter::once(self.headers[i].chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                // Headers line up with their column: right-aligned over numbers.
                if self.align[i] == Align::Right {
                    text.extend(std::iter::repeat_n(' ', pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            let mut text = text.trim_end().to_owned();
            text.push('\n');
            text
        };
        let mut out = line(&self.headers);
        if self.rows.is_empty() {
            out.push_str(empty);
            out.push('\n');
        }
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// `text` with control characters (newlines, tabs) escaped.
pub fn one_line(text: &str) -> String {
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        text.to_owned()
    }
}

/// A lag in milliseconds for people: `850 ms`, `1.2 s`, `3 min`, `2.5 h`, `4 d` (one
/// decimal, dropped when zero; the unit chosen after rounding, so 59 999 ms is `1 min`).
pub fn human_lag(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = i128::from(ms).abs();
    if ms < 1000 {
        return format!("{sign}{ms} ms");
    }
    // (unit in ms, its name, the value in this unit from which the next unit is used)
    const UNITS: [(i128, &str, i128); 4] = [
        (1000, "s", 60),
        (60_000, "min", 60),
        (3_600_000, "h", 48),
        (86_400_000, "d", i128::MAX / 10),
    ];
    for (unit, name, next_at) in UNITS {
        let tenths = (ms * 10 + unit / 2) / unit;
        if tenths < next_at * 10 {
            let (whole, tenth) = (tenths / 10, tenths % 10);
            return if tenth == 0 {
                format!("{sign}{whole} {name}")
            } else {
                format!("{sign}{whole}.{tenth} {name}")
            };
        }
    }
    unreachable!("days cover every i64 of milliseconds")
}

/// The time carried by a ULID, RFC 3339 in UTC with milliseconds
/// (`2024-05-01T12:00:00.123Z`); `None` past year 9999.
pub fn ulid_time(ulid: Ulid) -> Option<String> {
    let ms = ulid.timestamp_ms();
    let time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    if time.year() > 9999 {
        return None;
    }
    Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        time.year(),
        u8::from(time.month()),
        time.day(),
        time.hour(),
        time.minute(),
        time.second(),
        time.millisecond()
    ))
}

/// One line of `tail`: `{"ulid":…,"time":…,"shard":…,"<field>":…}`, in that order.
pub fn feed_line(ulid: Ulid, shard: i32, field: &str, value: &Value) -> String {
    let time = ulid_time(ulid).map_or(Value::Null, Value::String);
    format!(
        "{{\"ulid\":\"{ulid}\",\"time\":{time},\"shard\":{shard},{}:{value}}}",
        Value::String(field.to_owned())
    )
}

/// A value in a table: text as is, NULL as `-`, other values as their JSON text (numbers,
/// `true`/`false`, dates as ISO 8601, binary as `0x…`).
pub fn text_cell(data: &ColumnData<'static>) -> String {
    match column_json(data) {
        Ok(Value::Null) => "-".to_owned(),
        Ok(Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(error) => format!("(invalid: {error})"),
    }
}

/// A `datetime2` the views compute in UTC: [`text_cell`] with a `Z`.
pub fn utc_cell(data: &ColumnData<'static>) -> String {
    match data {
        ColumnData::DateTime2(Some(_))
        | ColumnData::DateTime(Some(_))
        | ColumnData::SmallDateTime(Some(_)) => format!("{}Z", text_cell(data)),
        other => text_cell(other),
    }
}

/// A `binary(16)` ULID as its 26-character text; NULL as `-`.
pub fn ulid_cell(data: &ColumnData<'static>) -> String {
    match data {
        ColumnData::Binary(Some(bytes)) => match <[u8; 16]>::try_from(bytes.as_ref()) {
            Ok(array) => Ulid::from_bytes(array).to_string(),
            Err(_) => text_cell(data),
        },
        other => text_cell(other),
    }
}

/// A `bit` as `yes`/`no`.
pub fn yes_no_cell(data: &ColumnData<'static>) -> String {
    match data {
        ColumnData::Bit(Some(true)) => "yes".to_owned(),
        ColumnData::Bit(Some(false)) => "no".to_owned(),
        other => text_cell(other),
    }
}

/// Standard output, flushed after every write: a consumer piping `tail` sees each line at
/// once. A closed pipe (`| head`) ends the command quietly.
#[derive(Debug, Default)]
pub struct Out;

impl Out {
    /// Writes `text` and a newline in one write, then flushes.
    pub fn line(&mut self, text: &str) -> Result<(), Failure> {
        let mut buffer = String::with_capacity(text.len() + 1);
        buffer.push_str(text);
        buffer.push('\n');
        self.text(&buffer)
    }

    /// Writes `text` as is, then flushes.
    pub fn text(&mut self, text: &str) -> Result<(), Failure> {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|error| {
                if error.kind() == std::io::ErrorKind::BrokenPipe {
                    Failure::quiet()
                } else {
                    Failure::run(format!("cannot write to standard output: {error}"))
                }
            })
    }
}

/// `1 row`, `2 rows`.
pub fn plural(count: u64, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cells(row: &[&str]) -> Vec<String> {
        row.iter().map(|cell| (*cell).to_owned()).collect()
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut table = Table::new(&[
            ("feed", Align::Left),
            ("shard", Align::Right),
            ("head_ulid", Align::Left),
        ]);
        table.push(cells(&[
            "app.OrderPlaced",
            "0",
            "01HX5Z8N3C0000000000000000",
        ]));
        table.push(cells(&["app.É", "12", "-"]));
        assert_eq!(
            table.render("(no feeds)"),
            "feed             shard  head_ulid\n\
             app.OrderPlaced      0  01HX5Z8N3C0000000000000000\n\
             app.É               12  -\n"
        );
    }

    #[test]
    fn an_empty_table_prints_its_header_and_the_empty_line() {
        let table = Table::new(&[("feed", Align::Left), ("mode", Align::Left)]);
        assert_eq!(table.render("(no feeds)"), "feed  mode\n(no feeds)\n");
    }

    #[test]
    fn headers_wider_than_cells_and_control_characters() {
        let mut table = Table::new(&[("outbox_depth", Align::Right), ("x", Align::Left)]);
        table.push(cells(&["5", "a\nb"]));
        table.push(cells(&["123"]));
        assert_eq!(
            table.render(""),
            "outbox_depth  x\n           5  a\\nb\n         123\n"
        );
    }

    #[test]
    fn lags_for_people() {
        assert_eq!(human_lag(0), "0 ms");
        assert_eq!(human_lag(850), "850 ms");
        assert_eq!(human_lag(999), "999 ms");
        assert_eq!(human_lag(1000), "1 s");
        assert_eq!(human_lag(1234), "1.2 s");
        assert_eq!(human_lag(59_940), "59.9 s");
        assert_eq!(human_lag(59_999), "1 min");
        assert_eq!(human_lag(180_000), "3 min");
        assert_eq!(human_lag(90_000), "1.5 min");
        assert_eq!(human_lag(3_600_000), "1 h");
        assert_eq!(human_lag(9_000_000), "2.5 h");
        assert_eq!(human_lag(47 * 3_600_000), "47 h");
        assert_eq!(human_lag(48 * 3_600_000), "2 d");
        assert_eq!(human_lag(400 * 86_400_000), "400 d");
        assert_eq!(human_lag(-1500), "-1.5 s");
        assert_eq!(human_lag(i64::MAX), "106751991167.3 d");
        assert_eq!(human_lag(i64::MIN), "-106751991167.3 d");
    }

    #[test]
    fn ulid_times_and_feed_lines() {
        let ulid = Ulid::from_parts(1_714_564_800_123, 7);
        assert_eq!(ulid_time(ulid).unwrap(), "2024-05-01T12:00:00.123Z");
        assert_eq!(ulid_time(Ulid(0)).unwrap(), "1970-01-01T00:00:00.000Z");
        assert_eq!(ulid_time(Ulid(u128::MAX)), None);

        let line = feed_line(ulid, 3, "key", &json!({"Id": 7}));
        let parsed: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            parsed,
            json!({
                "ulid": ulid.to_string(),
                "time": "2024-05-01T12:00:00.123Z",
                "shard": 3,
                "key": {"Id": 7}
            })
        );
        assert!(line.starts_with(&format!("{{\"ulid\":\"{ulid}\",\"time\":")));
        assert!(!line.contains('\n'));
        let deleted = feed_line(ulid, 0, "event", &Value::Null);
        assert!(deleted.ends_with(",\"event\":null}"), "{deleted}");
    }

    #[test]
    fn table_cells() {
        assert_eq!(text_cell(&ColumnData::I64(None)), "-");
        assert_eq!(text_cell(&ColumnData::I64(Some(12))), "12");
        assert_eq!(
            text_cell(&ColumnData::String(Some("outbox".into()))),
            "outbox"
        );
        let ulid = Ulid::from_parts(1_714_564_800_123, 7);
        assert_eq!(
            ulid_cell(&ColumnData::Binary(Some(ulid.to_bytes().to_vec().into()))),
            ulid.to_string()
        );
        assert_eq!(ulid_cell(&ColumnData::Binary(None)), "-");
        assert_eq!(
            ulid_cell(&ColumnData::Binary(Some(vec![1, 2].into()))),
            "0x0102"
        );
        let at = tiberius::time::DateTime2::new(
            tiberius::time::Date::new(
                (time::macros::date!(2024 - 05 - 01).to_julian_day()
                    - time::macros::date!(0001 - 01 - 01).to_julian_day()) as u32,
            ),
            tiberius::time::Time::new(12 * 3_600_000 + 123, 3),
        );
        assert_eq!(
            utc_cell(&ColumnData::DateTime2(Some(at))),
            "2024-05-01T12:00:00.123Z"
        );
        assert_eq!(utc_cell(&ColumnData::DateTime2(None)), "-");
        assert_eq!(yes_no_cell(&ColumnData::Bit(Some(true))), "yes");
        assert_eq!(yes_no_cell(&ColumnData::Bit(Some(false))), "no");
    }
}
