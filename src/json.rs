//! Rows of any shape as JSON: what `changefeed tail` prints and what the Kafka exporter
//! sends for key and event columns it knows nothing about.
//!
//! Integers, floats and `bit` become numbers and booleans; strings and `xml` strings;
//! `uniqueidentifier` its hyphenated text; `binary`/`varbinary` hex text `0x…`; `decimal`
//! and `numeric` their exact text (a JSON number would lose digits); dates and times ISO
//! 8601 text with as many fractional digits as the column's scale (`datetime2(3)`:
//! `2024-05-01T12:00:00.123`; `datetimeoffset` with its offset, `+02:00`); NULL `null`.

use crate::Error;
use crate::row::FromRow;
use serde_json::{Map, Number, Value};
use tiberius::{ColumnData, FromSql, Row};

/// One value as JSON; an error (a value the server sent out of range) says why.
pub fn column_json(data: &ColumnData<'static>) -> Result<Value, String> {
    use ColumnData as D;
    let value = match data {
        D::U8(Some(v)) => Value::from(*v),
        D::I16(Some(v)) => Value::from(*v),
        D::I32(Some(v)) => Value::from(*v),
        D::I64(Some(v)) => Value::from(*v),
        // Through the shortest text of the f32, so that 0.1 stays 0.1 and does not become
        // 0.10000000149011612.
        D::F32(Some(v)) => float(v.to_string().parse().unwrap_or(f64::from(*v))),
        D::F64(Some(v)) => float(*v),
        D::Bit(Some(v)) => Value::Bool(*v),
        D::String(Some(v)) => Value::String(v.to_string()),
        D::Guid(Some(v)) => Value::String(v.to_string()),
        D::Binary(Some(v)) => Value::String(hex(v)),
        D::Numeric(Some(n)) => Value::String(decimal_text(n.value(), n.scale())),
        D::Xml(Some(v)) => Value::String(AsRef::<str>::as_ref(v.as_ref()).to_owned()),
        D::DateTime(Some(_)) => {
            let value = convert::<time::PrimitiveDateTime>(data)?;
            // datetime counts 1/300 s; SQL Server shows it rounded to milliseconds.
            let millis = ((value.nanosecond() + 500_000) / 1_000_000).min(999);
            Value::String(format!(
                "{}T{}.{millis:03}",
                date_text(value.date()),
                hms(value.time())
            ))
        }
        D::SmallDateTime(Some(_)) => {
            let value = convert::<time::PrimitiveDateTime>(data)?;
            Value::String(format!("{}T{}", date_text(value.date()), hms(value.time())))
        }
        D::DateTime2(Some(dt)) => {
            let value = convert::<time::PrimitiveDateTime>(data)?;
            Value::String(format!(
                "{}T{}{}",
                date_text(value.date()),
                hms(value.time()),
                fraction(value.nanosecond(), dt.time().scale())
            ))
        }
        D::Date(Some(_)) => Value::String(date_text(convert::<time::Date>(data)?)),
        D::Time(Some(t)) => {
            let value = convert::<time::Time>(data)?;
            Value::String(format!(
                "{}{}",
                hms(value),
                fraction(value.nanosecond(), t.scale())
            ))
        }
        D::DateTimeOffset(Some(dto)) => {
            let value = convert::<time::OffsetDateTime>(data)?;
            let offset = value.offset().whole_minutes();
            let sign = if offset < 0 { '-' } else { '+' };
            let offset = offset.unsigned_abs();
            Value::String(format!(
                "{}T{}{}{sign}{:02}:{:02}",
                date_text(value.date()),
                hms(value.time()),
                fraction(value.nanosecond(), dto.datetime2().time().scale()),
                offset / 60,
                offset % 60
            ))
        }
        // Every `None`: NULL.
        _ => Value::Null,
    };
    Ok(value)
}

/// The columns of `row` from position `first` on, by column name (a later column with the
/// same name wins). A value that cannot be converted is [`Error::Decode`] naming the column.
pub fn row_json(row: &Row, first: usize) -> Result<Map<String, Value>, Error> {
    let mut map = Map::new();
    for (index, (column, data)) in row.cells().enumerate().skip(first) {
        let value = column_json(data).map_err(|reason| Error::Decode {
            column: format!("{} (position {index})", column.name()),
            reason,
            row: None,
        })?;
        map.insert(column.name().to_owned(), value);
    }
    Ok(map)
}

/// The key or event columns of a feed row as a JSON object: `None` when every column is
/// NULL, which `read_feed` returns for an event deleted since it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonColumns(pub Option<Map<String, Value>>);

impl FromRow for JsonColumns {
    fn from_row(row: &Row, first: usize) -> crate::Result<Self> {
        Ok(JsonColumns::of(row_json(row, first)?))
    }

    /// The same object from a PostgreSQL row: [`pg_row_json`].
    #[cfg(feature = "postgres")]
    fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> crate::Result<Self> {
        Ok(JsonColumns::of(pg_row_json(row, first)?))
    }
}

/// The columns of a PostgreSQL `row` from position `first` on, by column name (feature
/// `postgres`), with the values [`row_json`] gives their SQL Server counterparts: binary
/// as `0x…` hex, `numeric` as exact text, dates and times as ISO 8601 text, `json` and
/// `jsonb` as their value. A value that cannot be converted is [`Error::Decode`] naming the
/// column.
#[cfg(feature = "postgres")]
pub fn pg_row_json(row: &tokio_postgres::Row, first: usize) -> Result<Map<String, Value>, Error> {
    let mut map = Map::new();
    for (index, column) in row.columns().iter().enumerate().skip(first) {
        let value = crate::row::pg_column_json(row, index).map_err(|reason| Error::Decode {
            column: format!("{} (position {index})", column.name()),
            reason,
            row: None,
        })?;
        map.insert(column.name().to_owned(), value);
    }
    Ok(map)
}

impl JsonColumns {
    /// `None` when every column is NULL (a deleted event).
    fn of(map: Map<String, Value>) -> Self {
        if !map.is_empty() && map.values().all(Value::is_null) {
            JsonColumns(None)
        } else {
            JsonColumns(Some(map))
        }
    }

    /// The object, or `null` for a deleted event.
    pub fn into_value(self) -> Value {
        self.0.map_or(Value::Null, Value::Object)
    }
}

fn float(value: f64) -> Value {
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

fn convert<'a, T: FromSql<'a>>(data: &'a ColumnData<'static>) -> Result<T, String> {
    match T::from_sql(data) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err("unexpected NULL".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

/// `0x` and upper-case hex, as SQL Server prints binary values.
pub fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + 2 * bytes.len());
    text.push_str("0x");
    for byte in bytes {
        text.push_str(&format!("{byte:02X}"));
    }
    text
}

/// The exact text of `value × 10^-scale`: `12.34`, `-0.50`, `7` (scale 0).
pub fn decimal_text(value: i128, scale: u8) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    let scale = usize::from(scale);
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = digits.split_at(digits.len() - scale);
    format!("{sign}{whole}.{fraction}")
}

fn date_text(date: time::Date) -> String {
    format!(
        "{:04}-{:02}-{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    )
}

fn hms(time: time::Time) -> String {
    format!(
        "{:02}:{:02}:{:02}",
        time.hour(),
        time.minute(),
        time.second()
    )
}

/// `.` and the first `scale` digits of the nanoseconds (none for scale 0).
fn fraction(nanosecond: u32, scale: u8) -> String {
    let digits = usize::from(scale.min(9));
    if digits == 0 {
        return String::new();
    }
    format!(".{}", &format!("{nanosecond:09}")[..digits])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tiberius::ColumnType as T;
    use tiberius::ToSql;
    use tiberius::numeric::Numeric;
    use tiberius::time as tds;

    fn j(data: ColumnData<'static>) -> Value {
        column_json(&data).unwrap()
    }

    /// Days since 0001-01-01, as `date` and `datetime2` count them.
    fn tds_days(date: time::Date) -> u32 {
        (date.to_julian_day() - time::macros::date!(0001 - 01 - 01).to_julian_day()) as u32
    }

    #[test]
    fn numbers_bits_and_strings() {
        assert_eq!(j(ColumnData::U8(Some(255))), json!(255));
        assert_eq!(j(ColumnData::I16(Some(-2))), json!(-2));
        assert_eq!(j(ColumnData::I32(Some(42))), json!(42));
        assert_eq!(
            j(ColumnData::I64(Some(9_007_199_254_740_993))),
            json!(9_007_199_254_740_993i64)
        );
        assert_eq!(j(ColumnData::F32(Some(0.1))), json!(0.1));
        assert_eq!(j(ColumnData::F64(Some(-2.5))), json!(-2.5));
        assert_eq!(j(ColumnData::F64(Some(f64::NAN))), Value::Null);
        assert_eq!(j(ColumnData::Bit(Some(true))), json!(true));
        assert_eq!(
            j(ColumnData::String(Some("Événement \"x\"".into()))),
            json!("Événement \"x\"")
        );
    }

    #[test]
    fn guid_binary_and_decimal_as_text() {
        let guid = tiberius::Uuid::parse_str("6F9619FF-8B86-D011-B42D-00C04FC964FF").unwrap();
        assert_eq!(
            j(ColumnData::Guid(Some(guid))),
            json!("6f9619ff-8b86-d011-b42d-00c04fc964ff")
        );
        assert_eq!(
            j(ColumnData::Binary(Some(vec![0x00, 0x0a, 0xff].into()))),
            json!("0x000AFF")
        );
        assert_eq!(j(ColumnData::Binary(Some(vec![].into()))), json!("0x"));
        let d = |value, scale| {
            j(ColumnData::Numeric(Some(Numeric::new_with_scale(
                value, scale,
            ))))
        };
        assert_eq!(d(1234, 2), json!("12.34"));
        assert_eq!(d(-50, 2), json!("-0.50"));
        assert_eq!(d(5, 3), json!("0.005"));
        assert_eq!(d(7, 0), json!("7"));
        assert_eq!(d(-7, 0), json!("-7"));
        assert_eq!(
            d(i128::MAX, 38),
            json!("1.70141183460469231731687303715884105727")
        );
    }

    #[test]
    fn every_null_is_null() {
        for data in [
            ColumnData::U8(None),
            ColumnData::I16(None),
            ColumnData::I32(None),
            ColumnData::I64(None),
            ColumnData::F32(None),
            ColumnData::F64(None),
            ColumnData::Bit(None),
            ColumnData::String(None),
            ColumnData::Guid(None),
            ColumnData::Binary(None),
            ColumnData::Numeric(None),
            ColumnData::Xml(None),
            ColumnData::DateTime(None),
            ColumnData::SmallDateTime(None),
            ColumnData::Time(None),
            ColumnData::Date(None),
            ColumnData::DateTime2(None),
            ColumnData::DateTimeOffset(None),
        ] {
            assert_eq!(column_json(&data).unwrap(), Value::Null, "{data:?}");
        }
    }

    #[test]
    fn dates_and_times_are_iso_8601_with_the_columns_scale() {
        let day = time::macros::date!(2024 - 05 - 01);
        assert_eq!(
            j(ColumnData::Date(Some(tds::Date::new(tds_days(day))))),
            json!("2024-05-01")
        );
        // 12:00:00.123 at scale 3 (datetime2(3)) and 7 (datetime2, the default).
        let at = |scale: u8| {
            let increments = (12 * 3600 * 1000 + 123) * 10u64.pow(u32::from(scale)) / 1000;
            tds::Time::new(increments, scale)
        };
        assert_eq!(
            j(ColumnData::DateTime2(Some(tds::DateTime2::new(
                tds::Date::new(tds_days(day)),
                at(3)
            )))),
            json!("2024-05-01T12:00:00.123")
        );
        assert_eq!(
            j(ColumnData::DateTime2(Some(tds::DateTime2::new(
                tds::Date::new(tds_days(day)),
                tds::Time::new(12 * 3600, 0)
            )))),
            json!("2024-05-01T12:00:00")
        );
        assert_eq!(
            j(time::macros::datetime!(2024-05-01 12:00:00.123).to_sql()),
            json!("2024-05-01T12:00:00.1230000")
        );
        assert_eq!(j(ColumnData::Time(Some(at(3)))), json!("12:00:00.123"));
        assert_eq!(
            j(time::macros::time!(23:59:59.9999999).to_sql()),
            json!("23:59:59.9999999")
        );
        // datetime: days since 1900, 1/300 s; 2 fragments are 6.67 ms, shown as .007.
        let days_1900 = day.to_julian_day() - time::macros::date!(1900 - 01 - 01).to_julian_day();
        assert_eq!(
            j(ColumnData::DateTime(Some(tds::DateTime::new(
                days_1900,
                12 * 3600 * 300 + 2
            )))),
            json!("2024-05-01T12:00:00.007")
        );
        // smalldatetime: minutes.
        assert_eq!(
            j(ColumnData::SmallDateTime(Some(tds::SmallDateTime::new(
                days_1900 as u16,
                12 * 60 + 30
            )))),
            json!("2024-05-01T12:30:00")
        );
        // datetimeoffset: the local time and its offset.
        assert_eq!(
            j(time::macros::datetime!(2024-05-01 12:00:00.5 +02:00).to_sql()),
            json!("2024-05-01T12:00:00.5000000+02:00")
        );
        assert_eq!(
            j(time::macros::datetime!(2024-05-01 12:00:00 -05:30).to_sql()),
            json!("2024-05-01T12:00:00.0000000-05:30")
        );
        assert_eq!(
            j(time::macros::datetime!(2024-05-01 12:00:00 UTC).to_sql()),
            json!("2024-05-01T12:00:00.0000000+00:00")
        );
    }

    #[test]
    fn a_value_out_of_range_is_an_error_not_a_panic() {
        let error = column_json(&ColumnData::Date(Some(tds::Date::new(0x00FF_FFFF)))).unwrap_err();
        assert!(!error.is_empty());
    }

    fn feed_row(id: ColumnData<'static>, note: ColumnData<'static>) -> Row {
        Row::builder()
            .column(
                "ulid",
                T::BigBinary,
                ColumnData::Binary(Some(vec![1u8; 16].into())),
            )
            .column("Id", T::Int8, id)
            .column("Note", T::NVarchar, note)
            .build()
    }

    #[test]
    fn rows_by_column_name_from_a_position() {
        let row = feed_row(ColumnData::I64(Some(7)), ColumnData::String(None));
        let map = row_json(&row, 1).unwrap();
        assert_eq!(Value::Object(map), json!({"Id": 7, "Note": null}));
        let all = row_json(&row, 0).unwrap();
        assert_eq!(all["ulid"], json!("0x01010101010101010101010101010101"));

        let columns = JsonColumns::from_row(&row, 1).unwrap();
        assert_eq!(columns.into_value(), json!({"Id": 7, "Note": null}));
        let deleted = feed_row(ColumnData::I64(None), ColumnData::String(None));
        assert_eq!(
            JsonColumns::from_row(&deleted, 1).unwrap(),
            JsonColumns(None)
        );
    }

    #[test]
    fn a_bad_value_names_its_column() {
        let row = Row::builder()
            .column("ulid", T::BigBinary, ColumnData::Binary(None))
            .column(
                "Day",
                T::Daten,
                ColumnData::Date(Some(tds::Date::new(0x00FF_FFFF))),
            )
            .build();
        let error = row_json(&row, 1).unwrap_err();
        assert!(error.to_string().contains("Day (position 1)"), "{error}");
    }
}
