//! Decoding the rows `read_feed` returns into Rust values.
//!
//! `read_feed` returns `ulid` followed by the event table's key columns (or, with
//! `@with_event = 1`, every column of the event). [`FromRow`] decodes the columns after
//! the ulid; it is implemented for single values and tuples of them, and is small enough to
//! implement by hand for a struct.
//!
//! Three ways to decode a struct:
//!
//! * by hand, column by column with [`Column`] (see [`FromRow`]);
//! * with serde, by column name: `#[derive(Deserialize)]` and a one-line [`FromRow`] that
//!   calls [`deserialize`], or the [`Serde`] wrapper without any impl;
//! * one JSON column into a serde type with [`Json`].
//!
//! Every decoding error is [`crate::Error::Decode`] and names the column (name and
//! position) that did not fit.
//!
//! `Option<T>` is a [`FromRow`] for any `T: FromRow`: it is `None` when every column from
//! the first one on is NULL. Decode events as `FeedEvent<Option<E>>` when event rows may be
//! deleted: `read_feed` still returns the ULID of a deleted event, with NULL event columns.

use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use tiberius::{ColumnData, FromSql, Row};
use ulid::Ulid;

use crate::error::{Result, decode_error};

/// A value decoded from the columns of a row starting at a given position.
///
/// ```
/// use changefeed::row::{Column, FromRow};
///
/// struct OrderKey { tenant: i32, order_no: String }
///
/// impl FromRow for OrderKey {
///     fn from_row(row: &tiberius::Row, first: usize) -> changefeed::Result<Self> {
///         Ok(OrderKey { tenant: i32::column(row, first)?, order_no: String::column(row, first + 1)? })
///     }
/// }
/// ```
pub trait FromRow: Sized {
    /// Decodes the value whose first column is `first` (0-based).
    fn from_row(row: &Row, first: usize) -> Result<Self>;
}

/// One column decoded into an owned Rust value; a null is an error except for `Option`.
pub trait Column: Sized {
    /// Decodes column `index` of `row`.
    fn column(row: &Row, index: usize) -> Result<Self>;
}

fn column_label(row: &Row, index: usize) -> String {
    match row.columns().get(index) {
        Some(column) => format!("{} (position {index})", column.name()),
        None => format!("position {index} (the row has {} columns)", row.len()),
    }
}

fn required<T>(row: &Row, index: usize, value: Option<T>) -> Result<T> {
    value.ok_or_else(|| {
        decode_error(
            column_label(row, index),
            "it is NULL; decode it as an Option",
        )
    })
}

macro_rules! copy_columns {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn column(row: &Row, index: usize) -> Result<Self> {
                if index >= row.len() {
                    return Err(decode_error(column_label(row, index), "no such column"));
                }
                let value = row
                    .try_get::<$t, usize>(index)
                    .map_err(|e| decode_error(column_label(row, index), e))?;
                required(row, index, value)
            }
        }
    )*};
}

copy_columns!(
    bool,
    u8,
    i16,
    i32,
    i64,
    f32,
    f64,
    tiberius::Uuid,
    tiberius::numeric::Numeric,
    time::PrimitiveDateTime,
    time::Date,
    time::Time,
    time::OffsetDateTime
);

impl Column for Ulid {
    /// A `binary(16)` column, such as a feed's `ulid`.
    fn column(row: &Row, index: usize) -> Result<Self> {
        let bytes = Vec::<u8>::column(row, index)?;
        let array: [u8; 16] = bytes.as_slice().try_into().map_err(|_| {
            decode_error(
                column_label(row, index),
                format!("a ULID is binary(16), got {} bytes", bytes.len()),
            )
        })?;
        Ok(Ulid::from_bytes(array))
    }
}

impl Column for String {
    fn column(row: &Row, index: usize) -> Result<Self> {
        if index >= row.len() {
            return Err(decode_error(column_label(row, index), "no such column"));
        }
        let value = row
            .try_get::<&str, usize>(index)
            .map_err(|e| decode_error(column_label(row, index), e))?;
        required(row, index, value.map(str::to_owned))
    }
}

impl Column for Vec<u8> {
    fn column(row: &Row, index: usize) -> Result<Self> {
        if index >= row.len() {
            return Err(decode_error(column_label(row, index), "no such column"));
        }
        let value = row
            .try_get::<&[u8], usize>(index)
            .map_err(|e| decode_error(column_label(row, index), e))?;
        required(row, index, value.map(<[u8]>::to_vec))
    }
}

impl<T: Column> Column for Option<T> {
    fn column(row: &Row, index: usize) -> Result<Self> {
        match T::column(row, index) {
            Ok(value) => Ok(Some(value)),
            Err(_) if index < row.len() && is_null(row, index) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

fn is_null(row: &Row, index: usize) -> bool {
    row.cells()
        .nth(index)
        .is_some_and(|(_, data)| column_data_is_null(data))
}

fn column_data_is_null(data: &tiberius::ColumnData<'static>) -> bool {
    use tiberius::ColumnData as D;
    matches!(
        data,
        D::U8(None)
            | D::I16(None)
            | D::I32(None)
            | D::I64(None)
            | D::F32(None)
            | D::F64(None)
            | D::Bit(None)
            | D::String(None)
            | D::Guid(None)
            | D::Binary(None)
            | D::Numeric(None)
            | D::Xml(None)
            | D::DateTime(None)
            | D::SmallDateTime(None)
            | D::Time(None)
            | D::Date(None)
            | D::DateTime2(None)
            | D::DateTimeOffset(None)
    )
}

macro_rules! column_values {
    ($($t:ty),*) => {$(
        impl FromRow for $t {
            fn from_row(row: &Row, first: usize) -> Result<Self> {
                <$t as Column>::column(row, first)
            }
        }
    )*};
}

column_values!(
    bool,
    u8,
    i16,
    i32,
    i64,
    f32,
    f64,
    String,
    Vec<u8>,
    Ulid,
    tiberius::Uuid,
    tiberius::numeric::Numeric,
    time::PrimitiveDateTime,
    time::Date,
    time::Time,
    time::OffsetDateTime
);

/// `None` when every column from `first` on is NULL (for example the event columns of an
/// event row deleted since it was written), else `Some` of `T` decoded as usual.
impl<T: FromRow> FromRow for Option<T> {
    fn from_row(row: &Row, first: usize) -> Result<Self> {
        if first < row.len() && (first..row.len()).all(|index| is_null(row, index)) {
            Ok(None)
        } else {
            T::from_row(row, first).map(Some)
        }
    }
}

macro_rules! tuples {
    ($(($($name:ident $offset:expr),+))*) => {$(
        impl<$($name: Column),+> FromRow for ($($name,)+) {
            fn from_row(row: &Row, first: usize) -> Result<Self> {
                Ok(($($name::column(row, first + $offset)?,)+))
            }
        }
    )*};
}

tuples! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
}

/// One JSON text column (`nvarchar(max)` holding JSON) decoded with `serde_json`.
///
/// ```
/// use changefeed::row::{FromRow, Json};
/// use tiberius::{ColumnData, ColumnType, Row};
///
/// #[derive(serde::Deserialize)]
/// struct Payload { amount: i64 }
///
/// let row = Row::builder()
///     .column("payload", ColumnType::NVarchar, ColumnData::String(Some(r#"{"amount":5}"#.into())))
///     .build();
/// let Json(payload) = Json::<Payload>::from_row(&row, 0)?;
/// assert_eq!(payload.amount, 5);
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned> Column for Json<T> {
    fn column(row: &Row, index: usize) -> Result<Self> {
        let text = String::column(row, index)?;
        serde_json::from_str(&text).map(Json).map_err(|error| {
            decode_error(
                column_label(row, index),
                format!("not valid JSON for the type: {error}"),
            )
        })
    }
}

impl<T: DeserializeOwned> FromRow for Json<T> {
    fn from_row(row: &Row, first: usize) -> Result<Self> {
        Self::column(row, first)
    }
}

/// A serde-decoded value: `Serde<T>` is a [`FromRow`] for every `T: Deserialize`, decoded
/// with [`deserialize`] (by column name for structs and maps, by position for tuples).
///
/// ```
/// use changefeed::row::{FromRow, Serde};
/// use tiberius::{ColumnData, ColumnType, Row};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: i64, customer: String, note: Option<String> }
///
/// let row = Row::builder()
///     .column("ulid", ColumnType::BigBinary, ColumnData::Binary(Some(vec![0u8; 16].into())))
///     .column("order_id", ColumnType::Int8, ColumnData::I64(Some(42)))
///     .column("customer", ColumnType::NVarchar, ColumnData::String(Some("ada".into())))
///     .column("note", ColumnType::NVarchar, ColumnData::String(None))
///     .build();
/// let Serde(event) = Serde::<OrderPlaced>::from_row(&row, 1)?;
/// assert_eq!((event.order_id, event.customer.as_str(), event.note), (42, "ada", None));
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Serde<T>(pub T);

impl<T> Serde<T> {
    /// The decoded value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: DeserializeOwned> FromRow for Serde<T> {
    fn from_row(row: &Row, first: usize) -> Result<Self> {
        deserialize(row, first).map(Serde)
    }
}

/// Decodes the columns of `row` from `first` on with serde.
///
/// A struct or a map reads the columns by name (columns it does not name are ignored,
/// unless it says `#[serde(deny_unknown_fields)]`); a tuple or a sequence reads them by
/// position; a single value reads column `first`. Values map as: integers, floats and `bit`
/// to numbers and `bool`; strings and `xml` to strings; `uniqueidentifier` to its
/// hyphenated text; `binary` to a byte sequence (`Vec<u8>`, `serde_bytes`); `decimal` to a
/// number when the field is numeric, else to its exact text; dates and times to ISO 8601
/// text (`datetimeoffset` as RFC 3339); NULL to `None` (a NULL for a non-`Option` field is
/// an error). Errors name the column.
///
/// Implement [`FromRow`] with it in one line:
///
/// ```
/// use changefeed::row::{FromRow, deserialize};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: i64, customer: String }
///
/// impl FromRow for OrderPlaced {
///     fn from_row(row: &tiberius::Row, first: usize) -> changefeed::Result<Self> {
///         deserialize(row, first)
///     }
/// }
/// ```
pub fn deserialize<T: DeserializeOwned>(row: &Row, first: usize) -> Result<T> {
    T::deserialize(RowDeserializer { row, first }).map_err(|error| {
        let column = error.column.unwrap_or_else(|| {
            let names: Vec<&str> = row
                .columns()
                .iter()
                .skip(first)
                .map(|column| column.name())
                .collect();
            format!("from position {first} ({})", names.join(", "))
        });
        decode_error(column, error.message)
    })
}

/// serde's error while decoding a row: the message, and the column when known.
#[derive(Debug)]
struct DeError {
    column: Option<String>,
    message: String,
}

impl DeError {
    fn at(mut self, row: &Row, index: usize) -> Self {
        if self.column.is_none() {
            self.column = Some(column_label(row, index));
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.column {
            Some(column) => write!(f, "column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        DeError {
            column: None,
            message: message.to_string(),
        }
    }
}

/// The columns of a row from `first` on, as a map (by name) or a sequence (by position).
struct RowDeserializer<'r> {
    row: &'r Row,
    first: usize,
}

impl RowDeserializer<'_> {
    fn single(&self) -> std::result::Result<Cell<'_>, DeError> {
        cell(self.row, self.first)
    }
}

fn cell(row: &Row, index: usize) -> std::result::Result<Cell<'_>, DeError> {
    match row.cells().nth(index) {
        Some((_, data)) => Ok(Cell { data }),
        None => Err(DeError {
            column: Some(column_label(row, index)),
            message: "no such column".to_owned(),
        }),
    }
}

macro_rules! row_forward_to_single {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DeError> {
            let (row, first) = (self.row, self.first);
            self.single()?.$method(visitor).map_err(|error| error.at(row, first))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for RowDeserializer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        self.deserialize_map(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_map(RowMap {
            row: self.row,
            index: self.first,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        self.deserialize_map(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_seq(RowSeq {
            row: self.row,
            index: self.first,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        if self.first < self.row.len()
            && (self.first..self.row.len()).all(|index| is_null(self.row, index))
        {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        let (row, first) = (self.row, self.first);
        self.single()?
            .deserialize_enum(name, variants, visitor)
            .map_err(|error| error.at(row, first))
    }

    row_forward_to_single! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_identifier
    }
}

struct RowMap<'r> {
    row: &'r Row,
    index: usize,
}

impl<'de> MapAccess<'de> for RowMap<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, DeError> {
        match self.row.columns().get(self.index) {
            Some(column) => seed
                .deserialize(column.name().into_deserializer())
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, DeError> {
        let index = self.index;
        self.index += 1;
        seed.deserialize(cell(self.row, index)?)
            .map_err(|error| error.at(self.row, index))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.row.len().saturating_sub(self.index))
    }
}

struct RowSeq<'r> {
    row: &'r Row,
    index: usize,
}

impl<'de> SeqAccess<'de> for RowSeq<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> std::result::Result<Option<T::Value>, DeError> {
        if self.index >= self.row.len() {
            return Ok(None);
        }
        let index = self.index;
        self.index += 1;
        seed.deserialize(cell(self.row, index)?)
            .map(Some)
            .map_err(|error| error.at(self.row, index))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.row.len().saturating_sub(self.index))
    }
}

/// One value of a row.
struct Cell<'r> {
    data: &'r ColumnData<'static>,
}

const DATE_TIME_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond]");
const DATE_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[year]-[month]-[day]");
const TIME_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[hour]:[minute]:[second].[subsecond]");

fn convert<'a, T: FromSql<'a>>(data: &'a ColumnData<'static>) -> std::result::Result<T, DeError> {
    match T::from_sql(data) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(de::Error::custom("unexpected NULL")),
        Err(error) => Err(de::Error::custom(error)),
    }
}

fn formatted(
    value: std::result::Result<String, time::error::Format>,
) -> std::result::Result<String, DeError> {
    value.map_err(de::Error::custom)
}

impl Cell<'_> {
    fn is_null(&self) -> bool {
        column_data_is_null(self.data)
    }

    /// Dates and times as text; `None` for other values.
    fn time_text(&self) -> std::result::Result<Option<String>, DeError> {
        use tiberius::ColumnData as D;
        let text = match self.data {
            D::DateTime(Some(_)) | D::SmallDateTime(Some(_)) | D::DateTime2(Some(_)) => {
                formatted(convert::<time::PrimitiveDateTime>(self.data)?.format(DATE_TIME_TEXT))?
            }
            D::DateTimeOffset(Some(_)) => formatted(
                convert::<time::OffsetDateTime>(self.data)?
                    .format(&time::format_description::well_known::Rfc3339),
            )?,
            D::Date(Some(_)) => formatted(convert::<time::Date>(self.data)?.format(DATE_TEXT))?,
            D::Time(Some(_)) => formatted(convert::<time::Time>(self.data)?.format(TIME_TEXT))?,
            _ => return Ok(None),
        };
        Ok(Some(text))
    }

    /// A decimal with no fractional digits, as an integer.
    fn whole_numeric(&self) -> Option<i128> {
        match self.data {
            ColumnData::Numeric(Some(n)) if n.dec_part() == 0 => Some(n.int_part()),
            _ => None,
        }
    }
}

macro_rules! cell_integers {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DeError> {
            match self.whole_numeric() {
                Some(value) => match i64::try_from(value) {
                    Ok(small) => visitor.visit_i64(small),
                    Err(_) => visitor.visit_i128(value),
                },
                None => self.deserialize_any(visitor),
            }
        }
    )*};
}

macro_rules! cell_floats {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, DeError> {
            match self.data {
                ColumnData::Numeric(Some(n)) => visitor.visit_f64(f64::from(*n)),
                _ => self.deserialize_any(visitor),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Cell<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        use tiberius::ColumnData as D;
        if self.is_null() {
            return visitor.visit_none();
        }
        if let Some(text) = self.time_text()? {
            return visitor.visit_string(text);
        }
        match self.data {
            D::U8(Some(v)) => visitor.visit_u8(*v),
            D::I16(Some(v)) => visitor.visit_i16(*v),
            D::I32(Some(v)) => visitor.visit_i32(*v),
            D::I64(Some(v)) => visitor.visit_i64(*v),
            D::F32(Some(v)) => visitor.visit_f32(*v),
            D::F64(Some(v)) => visitor.visit_f64(*v),
            D::Bit(Some(v)) => visitor.visit_bool(*v),
            D::String(Some(v)) => visitor.visit_str(v),
            D::Guid(Some(v)) => visitor.visit_string(v.to_string()),
            D::Binary(Some(v)) => {
                visitor.visit_seq(de::value::SeqDeserializer::new(v.iter().copied()))
            }
            D::Numeric(Some(n)) => match self.whole_numeric() {
                Some(value) if n.scale() == 0 => match i64::try_from(value) {
                    Ok(small) => visitor.visit_i64(small),
                    Err(_) => visitor.visit_i128(value),
                },
                _ => visitor.visit_string(n.to_string()),
            },
            D::Xml(Some(v)) => visitor.visit_str(v.as_ref().as_ref()),
            _ => Err(de::Error::custom("unsupported SQL Server type")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        if self.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_bytes<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        match self.data {
            ColumnData::Binary(Some(v)) => visitor.visit_bytes(v),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_unit<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        if self.is_null() {
            visitor.visit_unit()
        } else {
            self.deserialize_any(visitor)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, DeError> {
        match self.data {
            ColumnData::String(Some(v)) => visitor.visit_enum(v.as_ref().into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::collections::BTreeMap;
    use tiberius::ColumnData as D;
    use tiberius::ColumnType as T;

    fn event_row() -> Row {
        Row::builder()
            .column("ulid", T::BigBinary, D::Binary(Some(vec![1u8; 16].into())))
            .column("id", T::Int8, D::I64(Some(7)))
            .column("kind", T::NVarchar, D::String(Some("Placed".into())))
            .column(
                "amount",
                T::Decimaln,
                D::Numeric(Some(tiberius::numeric::Numeric::new_with_scale(1234, 2))),
            )
            .column("note", T::NVarchar, D::String(None))
            .column("flag", T::Bit, D::Bit(Some(true)))
            .build()
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    enum Kind {
        Placed,
        Cancelled,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Event {
        id: i64,
        kind: Kind,
        amount: f64,
        note: Option<String>,
        flag: bool,
    }

    #[test]
    fn serde_struct_by_column_name() {
        let event: Event = deserialize(&event_row(), 1).unwrap();
        assert_eq!(
            event,
            Event {
                id: 7,
                kind: Kind::Placed,
                amount: 12.34,
                note: None,
                flag: true
            }
        );
        let _ = Kind::Cancelled;
    }

    #[test]
    fn serde_tuple_by_position_and_map_of_json_values() {
        let (id, kind): (i64, String) = deserialize(&event_row(), 1).unwrap();
        assert_eq!((id, kind.as_str()), (7, "Placed"));
        let map: BTreeMap<String, serde_json::Value> = deserialize(&event_row(), 1).unwrap();
        assert_eq!(map["id"], serde_json::json!(7));
        assert_eq!(map["amount"], serde_json::json!("12.34"));
        assert_eq!(map["note"], serde_json::Value::Null);
        assert!(!map.contains_key("ulid"));
        let single: i64 = deserialize(&event_row(), 1).unwrap();
        assert_eq!(single, 7);
    }

    #[test]
    fn serde_errors_name_the_column() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Wrong {
            id: i64,
            kind: i32,
        }
        let error = deserialize::<Wrong>(&event_row(), 1).unwrap_err();
        match &error {
            Error::Decode { column, .. } => assert_eq!(column, "kind (position 2)"),
            other => panic!("{other}"),
        }

        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct NotNull {
            note: String,
        }
        let error = deserialize::<NotNull>(&event_row(), 1).unwrap_err();
        assert!(error.to_string().contains("note (position 4)"), "{error}");

        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Missing {
            customer: String,
        }
        let error = deserialize::<Missing>(&event_row(), 1).unwrap_err();
        assert!(error.to_string().contains("customer"), "{error}");
    }

    #[test]
    fn hand_written_columns_name_the_column_on_mismatch() {
        let error = i32::column(&event_row(), 2).unwrap_err();
        assert!(error.to_string().contains("kind (position 2)"), "{error}");
        let error = i32::column(&event_row(), 9).unwrap_err();
        assert!(error.to_string().contains("no such column"), "{error}");
        assert_eq!(
            Ulid::column(&event_row(), 0).unwrap(),
            Ulid::from_bytes([1; 16])
        );
        assert!(Ulid::column(&event_row(), 2).is_err());
    }

    #[test]
    fn option_is_none_only_when_every_column_is_null() {
        let deleted = Row::builder()
            .column("ulid", T::BigBinary, D::Binary(Some(vec![1u8; 16].into())))
            .column("id", T::Int8, D::I64(None))
            .column("note", T::NVarchar, D::String(None))
            .build();
        assert_eq!(
            <Option<(i64, Option<String>)>>::from_row(&deleted, 1).unwrap(),
            None
        );
        assert_eq!(<Option<Serde<Event>>>::from_row(&deleted, 1).unwrap(), None);
        let some = <Option<(i64, String)>>::from_row(&event_row(), 1).unwrap();
        assert_eq!(some, Some((7, "Placed".to_owned())));
        assert!(<(i64, i64)>::from_row(&deleted, 1).is_err());
    }

    #[test]
    fn json_column() {
        let row = Row::builder()
            .column(
                "payload",
                T::NVarchar,
                D::String(Some("{\"a\":[1,2]}".into())),
            )
            .column("bad", T::NVarchar, D::String(Some("{".into())))
            .build();
        let Json(value) = Json::<serde_json::Value>::column(&row, 0).unwrap();
        assert_eq!(value, serde_json::json!({"a": [1, 2]}));
        let error = Json::<serde_json::Value>::column(&row, 1).unwrap_err();
        assert!(error.to_string().contains("bad (position 1)"), "{error}");
    }

    #[test]
    fn dates_and_binary_through_serde() {
        let date = time::macros::date!(2024 - 01 - 02);
        let row = Row::builder()
            .column(
                "day",
                T::Daten,
                D::Date(Some(tiberius::time::Date::new(
                    (date.to_julian_day() - 1_721_426) as u32,
                ))),
            )
            .column(
                "bytes",
                T::BigVarBin,
                D::Binary(Some(vec![1u8, 2, 3].into())),
            )
            .build();
        #[derive(serde::Deserialize)]
        struct Dated {
            day: String,
            bytes: Vec<u8>,
        }
        let dated: Dated = deserialize(&row, 0).unwrap();
        assert_eq!(dated.day, "2024-01-02");
        assert_eq!(dated.bytes, vec![1, 2, 3]);
    }
}
