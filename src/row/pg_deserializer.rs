//! The serde deserializer over a PostgreSQL row (feature `postgres`): [`deserialize_pg`],
//! and through it [`Serde`](super::Serde)'s `from_pg_row`. The row level (struct by column
//! name, tuple by position, one scalar) is `deserializer.rs`'s, shared through
//! [`RowAccess`]; this file brings the cell: one PostgreSQL value in serde's data model,
//! mapped as the SQL Server cell maps its counterpart.

use std::fmt::Write as _;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};

#[cfg(doc)]
use super::FromRow;
use super::deserializer::{
    DATE_TEXT, DATE_TIME_TEXT, DeError, DeResult, RowAccess, TIME_TEXT, deserialize_row, formatted,
};
use super::pg_row::{self, is_text, json_bytes};
use crate::error::Result;

/// Decodes the columns of a PostgreSQL `row` from `first` on with serde, by the rules of
/// [`deserialize`](super::deserialize): a struct or a map by column name, a tuple or a
/// sequence by position, a single value from column `first`; NULL to `None`; errors name
/// the column.
///
/// Values map as: `boolean`, integers (`smallint`, `integer`, `bigint`, `oid`, `"char"`)
/// and floats to themselves; text types and enums to strings; `uuid` to its hyphenated
/// text; `bytea` to a byte sequence; `numeric` to a number when the field is numeric, else
/// to its exact text (`NaN` and the infinities as text); `date`, `time`, `timestamp` to ISO
/// 8601 text and `timestamptz` to RFC 3339 (UTC); `json` and `jsonb` to their JSON value
/// (a struct field of a serde type, or `serde_json::Value`). Other types are refused with
/// an error naming the column and the type.
///
/// ```no_run
/// use changefeed::row::{FromRow, deserialize, deserialize_pg};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: i64, customer: String }
///
/// impl FromRow for OrderPlaced {
///     fn from_row(row: &tiberius::Row, first: usize) -> changefeed::Result<Self> {
///         deserialize(row, first)
///     }
///     fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> changefeed::Result<Self> {
///         deserialize_pg(row, first)
///     }
/// }
/// ```
pub fn deserialize_pg<T: DeserializeOwned>(row: &Row, first: usize) -> Result<T> {
    deserialize_row(row, first)
}

impl RowAccess for Row {
    type Cell<'r> = PgCell<'r>;

    fn column_count(&self) -> usize {
        self.len()
    }

    fn column_name(&self, index: usize) -> Option<&str> {
        self.columns().get(index).map(|column| column.name())
    }

    fn null_at(&self, index: usize) -> bool {
        pg_row::is_null(self, index)
    }

    fn label_at(&self, index: usize) -> String {
        pg_row::column_label(self, index)
    }

    fn cell_at(&self, index: usize) -> Option<PgCell<'_>> {
        pg_row::raw(self, index).map(|(ty, raw)| PgCell { ty, raw })
    }
}

/// One value of a PostgreSQL row: its type and its bytes in the binary format (`None` for
/// NULL).
pub(super) struct PgCell<'r> {
    ty: &'r Type,
    raw: Option<&'r [u8]>,
}

/// `raw` decoded by tokio-postgres as `T`.
fn decode<'a, T: FromSql<'a>>(ty: &Type, raw: &'a [u8]) -> DeResult<T> {
    T::from_sql(ty, raw).map_err(de::Error::custom)
}

impl PgCell<'_> {
    fn is_null(&self) -> bool {
        self.raw.is_none()
    }

    /// Dates and times as text; `None` for other values.
    fn time_text(&self, raw: &[u8]) -> DeResult<Option<String>> {
        let text = match *self.ty {
            Type::TIMESTAMP => {
                formatted(decode::<time::PrimitiveDateTime>(self.ty, raw)?.format(DATE_TIME_TEXT))?
            }
            Type::TIMESTAMPTZ => formatted(
                decode::<time::OffsetDateTime>(self.ty, raw)?
                    .format(&time::format_description::well_known::Rfc3339),
            )?,
            Type::DATE => formatted(decode::<time::Date>(self.ty, raw)?.format(DATE_TEXT))?,
            Type::TIME => formatted(decode::<time::Time>(self.ty, raw)?.format(TIME_TEXT))?,
            _ => return Ok(None),
        };
        Ok(Some(text))
    }

    /// A `numeric` value as exact text and its display scale; `None` for other values.
    fn numeric(&self) -> Option<DeResult<Numeric>> {
        match (self.ty, self.raw) {
            (&Type::NUMERIC, Some(raw)) => Some(numeric(raw).map_err(de::Error::custom)),
            _ => None,
        }
    }

    /// A `numeric` with no fractional digits, as an integer.
    fn whole_numeric(&self) -> Option<i128> {
        let Numeric { text, .. } = self.numeric()?.ok()?;
        let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
        if fraction.bytes().all(|digit| digit == b'0') {
            whole.parse().ok()
        } else {
            None
        }
    }

    /// A `numeric` as `f64`; `None` for other values.
    fn numeric_f64(&self) -> Option<f64> {
        self.numeric()?.ok()?.text.parse().ok()
    }
}

/// A `numeric` value: its exact text (`-12.340`, `NaN`, `Infinity`) and its display scale.
struct Numeric {
    text: String,
    scale: u16,
}

/// Decodes `numeric`'s binary format: four 16-bit fields (digit count, weight of the first
/// digit in powers of 10 000, sign, display scale), then the base-10 000 digits.
fn numeric(raw: &[u8]) -> std::result::Result<Numeric, String> {
    let field = |i: usize| {
        raw.get(2 * i..2 * i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let (Some(count), Some(weight), Some(sign), Some(scale)) =
        (field(0), field(1), field(2), field(3))
    else {
        return Err("a numeric value shorter than its header".to_owned());
    };
    let count = usize::from(count);
    if raw.len() != 8 + 2 * count {
        return Err("a numeric value whose length does not match its digit count".to_owned());
    }
    let digits: Vec<u16> = (4..4 + count).filter_map(field).collect();
    let special = |text: &str| {
        Ok(Numeric {
            text: text.to_owned(),
            scale,
        })
    };
    let negative = match sign {
        0x0000 => false,
        0x4000 => true,
        0xC000 => return special("NaN"),
        0xD000 => return special("Infinity"),
        0xF000 => return special("-Infinity"),
        other => return Err(format!("a numeric value with an unknown sign {other:#x}")),
    };
    let weight = i32::from(weight as i16);
    let digit = |i: i32| {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i))
            .copied()
            .unwrap_or(0)
    };
    let mut text = String::new();
    if negative {
        text.push('-');
    }
    if weight < 0 {
        text.push('0');
    } else {
        let _ = write!(text, "{}", digit(0));
        for i in 1..=weight {
            let _ = write!(text, "{:04}", digit(i));
        }
    }
    if scale > 0 {
        let mut fraction = String::new();
        let mut i = weight + 1;
        while fraction.len() < usize::from(scale) {
            let _ = write!(fraction, "{:04}", digit(i));
            i += 1;
        }
        fraction.truncate(usize::from(scale));
        text.push('.');
        text.push_str(&fraction);
    }
    Ok(Numeric { text, scale })
}

impl<'de> de::Deserializer<'de> for PgCell<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        let Some(raw) = self.raw else {
            return visitor.visit_none();
        };
        if let Some(text) = self.time_text(raw)? {
            return visitor.visit_string(text);
        }
        if let Some(numeric) = self.numeric() {
            let numeric = numeric?;
            return match self.whole_numeric() {
                Some(value) if numeric.scale == 0 => match i64::try_from(value) {
                    Ok(small) => visitor.visit_i64(small),
                    Err(_) => visitor.visit_i128(value),
                },
                _ => visitor.visit_string(numeric.text),
            };
        }
        let ty = self.ty;
        match *ty {
            Type::BOOL => visitor.visit_bool(decode(ty, raw)?),
            Type::CHAR => visitor.visit_i8(decode(ty, raw)?),
            Type::INT2 => visitor.visit_i16(decode(ty, raw)?),
            Type::INT4 => visitor.visit_i32(decode(ty, raw)?),
            Type::INT8 => visitor.visit_i64(decode(ty, raw)?),
            Type::OID => visitor.visit_u32(decode(ty, raw)?),
            Type::FLOAT4 => visitor.visit_f32(decode(ty, raw)?),
            Type::FLOAT8 => visitor.visit_f64(decode(ty, raw)?),
            Type::UUID => visitor.visit_string(decode::<uuid::Uuid>(ty, raw)?.to_string()),
            Type::BYTEA => visitor.visit_seq(de::value::SeqDeserializer::new(raw.iter().copied())),
            Type::JSON | Type::JSONB => {
                let text = json_bytes(ty, raw).map_err(de::Error::custom)?;
                let value: serde_json::Value =
                    serde_json::from_slice(text).map_err(de::Error::custom)?;
                de::Deserializer::deserialize_any(value, visitor).map_err(de::Error::custom)
            }
            _ if is_text(ty) => visitor.visit_str(text(raw)?),
            _ => Err(de::Error::custom(format!(
                "unsupported PostgreSQL type {ty}"
            ))),
        }
    }

    option_and_newtype!(this => this.is_null());

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        match (self.ty, self.raw) {
            (&Type::BYTEA, Some(raw)) => visitor.visit_bytes(raw),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        if self.is_null() {
            visitor.visit_unit()
        } else {
            self.deserialize_any(visitor)
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> DeResult<V::Value> {
        match self.raw {
            Some(raw) if is_text(self.ty) => visitor.visit_enum(text(raw)?.into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
    }

    ignoring_arguments! {
        deserialize_byte_buf() => deserialize_bytes;
    }

    cell_integers! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
    }

    cell_floats! { deserialize_f32 deserialize_f64 }

    serde::forward_to_deserialize_any! {
        bool char str string unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// Column `index` of a PostgreSQL `row` as the JSON value `tail` prints and the Kafka
/// exporter sends ([`crate::json::JsonColumns`]), by the rules of SQL Server's
/// `column_json`: NULL `null`; `bytea` `0x…` hex; `numeric` its exact text; dates and times
/// ISO 8601 text (`timestamptz` RFC 3339 in UTC); `real` through its shortest text;
/// `json`/`jsonb` their value; the rest as [`deserialize_pg`] maps them. Else why not.
pub(crate) fn pg_column_json(
    row: &Row,
    index: usize,
) -> std::result::Result<serde_json::Value, String> {
    use serde::Deserialize as _;
    use serde_json::Value;

    let Some((ty, raw)) = pg_row::raw(row, index) else {
        return Err("no such column".to_owned());
    };
    let Some(bytes) = raw else {
        return Ok(Value::Null);
    };
    let cell = PgCell { ty, raw };
    if let Some(text) = cell.time_text(bytes).map_err(|e| e.to_string())? {
        return Ok(Value::String(text));
    }
    if let Some(numeric) = cell.numeric() {
        return numeric
            .map(|numeric| Value::String(numeric.text))
            .map_err(|e| e.to_string());
    }
    match *ty {
        // 0x and upper-case hex, as crate::json::hex writes SQL Server's binary (not called:
        // json imports row).
        Type::BYTEA => {
            let mut hex = String::with_capacity(2 + 2 * bytes.len());
            hex.push_str("0x");
            for byte in bytes {
                let _ = write!(hex, "{byte:02X}");
            }
            Ok(Value::String(hex))
        }
        Type::FLOAT4 => {
            let value: f32 = decode(ty, bytes).map_err(|e: DeError| e.to_string())?;
            let value: f64 = value.to_string().parse().unwrap_or(f64::from(value));
            Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
        }
        _ => Value::deserialize(cell).map_err(|e| e.to_string()),
    }
}

/// A text value's bytes as `&str` (PostgreSQL sends text in the client encoding, UTF-8).
fn text(raw: &[u8]) -> DeResult<&str> {
    std::str::from_utf8(raw).map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `numeric`'s binary form of digits (base 10 000), weight, sign and scale.
    fn encoded(digits: &[u16], weight: i16, sign: u16, scale: u16) -> Vec<u8> {
        let mut raw = Vec::new();
        for field in [digits.len() as u16, weight as u16, sign, scale] {
            raw.extend_from_slice(&field.to_be_bytes());
        }
        for digit in digits {
            raw.extend_from_slice(&digit.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numeric_text_is_exact() {
        let text = |digits: &[u16], weight, sign, scale| {
            numeric(&encoded(digits, weight, sign, scale)).unwrap().text
        };
        assert_eq!(text(&[12, 3400], 0, 0, 2), "12.34");
        assert_eq!(text(&[12, 3400], 0, 0x4000, 3), "-12.340");
        assert_eq!(text(&[1, 0, 5], 2, 0, 0), "100000005");
        assert_eq!(text(&[1], 1, 0, 0), "10000");
        assert_eq!(text(&[5], -1, 0, 4), "0.0005");
        assert_eq!(text(&[5], -2, 0, 8), "0.00000005");
        assert_eq!(text(&[], 0, 0, 0), "0");
        assert_eq!(text(&[], 0, 0, 2), "0.00");
        assert_eq!(text(&[], 0, 0xC000, 0), "NaN");
        assert_eq!(text(&[], 0, 0xF000, 0), "-Infinity");
        assert!(numeric(&[0, 1]).is_err());
        assert!(numeric(&encoded(&[1], 0, 0x1234, 0)).is_err());
        let mut short = encoded(&[1, 2], 0, 0, 0);
        short.pop();
        assert!(numeric(&short).is_err());
    }

    fn cell<'a>(ty: &'a Type, raw: Option<&'a [u8]>) -> PgCell<'a> {
        PgCell { ty, raw }
    }

    #[test]
    fn cells_map_to_serde_as_the_sql_server_ones() {
        use serde::Deserialize as _;
        let amount = encoded(&[12, 3400], 0, 0, 2);
        assert_eq!(
            f64::deserialize(cell(&Type::NUMERIC, Some(&amount))).unwrap(),
            12.34
        );
        assert_eq!(
            String::deserialize(cell(&Type::NUMERIC, Some(&amount))).unwrap(),
            "12.34"
        );
        let whole = encoded(&[42], 0, 0, 2);
        assert_eq!(
            i64::deserialize(cell(&Type::NUMERIC, Some(&whole))).unwrap(),
            42
        );
        assert_eq!(
            serde_json::Value::deserialize(cell(&Type::NUMERIC, Some(&encoded(&[7], 0, 0, 0))))
                .unwrap(),
            serde_json::json!(7)
        );
        let jsonb = b"\x01{\"a\":[1,2]}";
        assert_eq!(
            serde_json::Value::deserialize(cell(&Type::JSONB, Some(jsonb))).unwrap(),
            serde_json::json!({"a": [1, 2]})
        );
        assert_eq!(
            <Option<i32>>::deserialize(cell(&Type::INT4, None)).unwrap(),
            None
        );
        assert_eq!(
            i32::deserialize(cell(&Type::INT4, Some(&7i32.to_be_bytes()))).unwrap(),
            7
        );
        assert_eq!(
            <Vec<u8>>::deserialize(cell(&Type::BYTEA, Some(&[1, 2, 3]))).unwrap(),
            vec![1, 2, 3]
        );
        let day = (time::macros::date!(2024 - 01 - 02).to_julian_day()
            - time::macros::date!(2000 - 01 - 01).to_julian_day())
        .to_be_bytes();
        assert_eq!(
            String::deserialize(cell(&Type::DATE, Some(&day))).unwrap(),
            "2024-01-02"
        );
        let error = String::deserialize(cell(&Type::POINT, Some(&[0; 16]))).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("unsupported PostgreSQL type point"),
            "{error}"
        );
        #[derive(Debug, PartialEq, serde::Deserialize)]
        enum Kind {
            Placed,
        }
        assert_eq!(
            Kind::deserialize(cell(&Type::TEXT, Some(b"Placed"))).unwrap(),
            Kind::Placed
        );
    }
}
