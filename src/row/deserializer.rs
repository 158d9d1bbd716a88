//! The serde deserializer over the columns of a row: [`deserialize`] (and through it
//! [`Serde`](super::Serde)) decodes a row as a map by column name, a sequence by position,
//! or a single value, each [`Cell`] mapping its SQL Server value to serde's data model.
//!
//! The row-level half (map, sequence, single value, the error that names the column) is
//! written once over [`RowAccess`], so the PostgreSQL deserializer (`pg_deserializer.rs`)
//! shares it and only brings its own cell.

use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use tiberius::{ColumnData, FromSql, Row};

#[cfg(doc)]
use super::FromRow;
use super::{column_data_is_null, column_label, is_null};
use crate::error::{Result, decode_error};

pub(super) type DeResult<T> = std::result::Result<T, DeError>;

/// A row as the row-level deserializer sees it: its columns' count and names, which are
/// NULL, how an error names one, and each column's value as a serde deserializer. One
/// implementation per driver's row type.
pub(super) trait RowAccess {
    /// One value of the row.
    type Cell<'r>: for<'de> de::Deserializer<'de, Error = DeError>
    where
        Self: 'r;

    /// How many columns the row has.
    fn column_count(&self) -> usize;
    /// The name of column `index`, if there is one.
    fn column_name(&self, index: usize) -> Option<&str>;
    /// Whether column `index` is NULL (false when there is no such column).
    fn null_at(&self, index: usize) -> bool;
    /// How an error names column `index`: its name and position.
    fn label_at(&self, index: usize) -> String;
    /// Column `index` as a deserializer, if there is such a column.
    fn cell_at(&self, index: usize) -> Option<Self::Cell<'_>>;
}

impl RowAccess for Row {
    type Cell<'r> = Cell<'r>;

    fn column_count(&self) -> usize {
        self.len()
    }

    fn column_name(&self, index: usize) -> Option<&str> {
        self.columns().get(index).map(|column| column.name())
    }

    fn null_at(&self, index: usize) -> bool {
        is_null(self, index)
    }

    fn label_at(&self, index: usize) -> String {
        column_label(self, index)
    }

    fn cell_at(&self, index: usize) -> Option<Cell<'_>> {
        self.cells().nth(index).map(|(_, data)| Cell { data })
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
    deserialize_row(row, first)
}

/// Decodes the columns of any [`RowAccess`] row from `first` on: what [`deserialize`] and
/// the PostgreSQL `deserialize_pg` call. An error with no column of its own names the
/// columns it read from.
pub(super) fn deserialize_row<T: DeserializeOwned, R: RowAccess + ?Sized>(
    row: &R,
    first: usize,
) -> Result<T> {
    T::deserialize(RowDeserializer { row, first }).map_err(|error| {
        let column = error.column.unwrap_or_else(|| {
            let names: Vec<&str> = (first..row.column_count())
                .filter_map(|index| row.column_name(index))
                .collect();
            format!("from position {first} ({})", names.join(", "))
        });
        decode_error(column, error.message)
    })
}

/// serde's error while decoding a row: the message, and the column when known.
#[derive(Debug)]
pub(super) struct DeError {
    column: Option<String>,
    message: String,
}

impl DeError {
    fn at<R: RowAccess + ?Sized>(mut self, row: &R, index: usize) -> Self {
        if self.column.is_none() {
            self.column = Some(row.label_at(index));
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
struct RowDeserializer<'r, R: ?Sized> {
    row: &'r R,
    first: usize,
}

impl<'r, R: RowAccess + ?Sized> RowDeserializer<'r, R> {
    fn single(&self) -> DeResult<R::Cell<'r>> {
        cell(self.row, self.first)
    }
}

fn cell<R: RowAccess + ?Sized>(row: &R, index: usize) -> DeResult<R::Cell<'_>> {
    row.cell_at(index).ok_or_else(|| DeError {
        column: Some(row.label_at(index)),
        message: "no such column".to_owned(),
    })
}

/// `Deserializer` methods that ignore their leading arguments (a type's name, its length,
/// its field or variant list) and deserialize as `$target` does, written once for the row
/// and the cells of both drivers.
macro_rules! ignoring_arguments {
    ($($method:ident($($argument:ty),*) => $target:ident;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $(_: $argument,)* visitor: V) -> DeResult<V::Value> {
            self.$target(visitor)
        }
    )*};
}

/// The `Deserializer` methods the row and the cells write alike: an option is
/// `None` when `$none` holds of the deserializer `$this` (its NULLs), else `Some` of the
/// value itself; a newtype is its content.
macro_rules! option_and_newtype {
    ($this:ident => $none:expr) => {
        fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
            let $this = &self;
            if $none {
                visitor.visit_none()
            } else {
                visitor.visit_some(self)
            }
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            visitor: V,
        ) -> DeResult<V::Value> {
            visitor.visit_newtype_struct(self)
        }
    };
}

/// `Deserializer` methods of [`RowDeserializer`] that read the single column `first`.
macro_rules! row_forward_to_single {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
            let (row, first) = (self.row, self.first);
            self.single()?.$method(visitor).map_err(|error| error.at(row, first))
        }
    )*};
}

impl<'de, R: RowAccess + ?Sized> de::Deserializer<'de> for RowDeserializer<'_, R> {
    type Error = DeError;

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        visitor.visit_map(Columns {
            row: self.row,
            index: self.first,
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        visitor.visit_seq(Columns {
            row: self.row,
            index: self.first,
        })
    }

    option_and_newtype!(this => {
        let count = this.row.column_count();
        this.first < count && (this.first..count).all(|index| this.row.null_at(index))
    });

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        visitor.visit_unit()
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> DeResult<V::Value> {
        let (row, first) = (self.row, self.first);
        self.single()?
            .deserialize_enum(name, variants, visitor)
            .map_err(|error| error.at(row, first))
    }

    ignoring_arguments! {
        deserialize_any() => deserialize_map;
        deserialize_struct(&'static str, &'static [&'static str]) => deserialize_map;
        deserialize_tuple(usize) => deserialize_seq;
        deserialize_tuple_struct(&'static str, usize) => deserialize_seq;
        deserialize_unit_struct(&'static str) => deserialize_unit;
        deserialize_ignored_any() => deserialize_unit;
    }

    row_forward_to_single! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_identifier
    }
}

/// The columns of a row from `index` on, one by one: the entries of a map (the column's
/// name, then its value) or the elements of a sequence.
struct Columns<'r, R: ?Sized> {
    row: &'r R,
    index: usize,
}

impl<R: RowAccess + ?Sized> Columns<'_, R> {
    /// Deserializes the value of the next column with `seed`; an error names the column.
    fn next_cell<'de, S: DeserializeSeed<'de>>(&mut self, seed: S) -> DeResult<S::Value> {
        let index = self.index;
        self.index += 1;
        seed.deserialize(cell(self.row, index)?)
            .map_err(|error| error.at(self.row, index))
    }

    fn remaining(&self) -> Option<usize> {
        Some(self.row.column_count().saturating_sub(self.index))
    }
}

impl<'de, R: RowAccess + ?Sized> MapAccess<'de> for Columns<'_, R> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> DeResult<Option<K::Value>> {
        if self.index >= self.row.column_count() {
            return Ok(None);
        }
        let name = self.row.column_name(self.index).unwrap_or_default();
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> DeResult<V::Value> {
        self.next_cell(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.remaining()
    }
}

impl<'de, R: RowAccess + ?Sized> SeqAccess<'de> for Columns<'_, R> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> DeResult<Option<T::Value>> {
        if self.index >= self.row.column_count() {
            return Ok(None);
        }
        self.next_cell(seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        self.remaining()
    }
}

/// One value of a SQL Server row.
pub(super) struct Cell<'r> {
    data: &'r ColumnData<'static>,
}

pub(super) const DATE_TIME_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond]");
pub(super) const DATE_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[year]-[month]-[day]");
pub(super) const TIME_TEXT: &[time::format_description::BorrowedFormatItem<'static>] =
    time::macros::format_description!("[hour]:[minute]:[second].[subsecond]");

fn convert<'a, T: FromSql<'a>>(data: &'a ColumnData<'static>) -> DeResult<T> {
    match T::from_sql(data) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(de::Error::custom("unexpected NULL")),
        Err(error) => Err(de::Error::custom(error)),
    }
}

pub(super) fn formatted(
    value: std::result::Result<String, time::error::Format>,
) -> DeResult<String> {
    value.map_err(de::Error::custom)
}

impl Cell<'_> {
    fn is_null(&self) -> bool {
        column_data_is_null(self.data)
    }

    /// Dates and times as text; `None` for other values.
    fn time_text(&self) -> DeResult<Option<String>> {
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

    /// A decimal as `f64`; `None` for other values.
    fn numeric_f64(&self) -> Option<f64> {
        match self.data {
            ColumnData::Numeric(Some(n)) => Some(f64::from(*n)),
            _ => None,
        }
    }
}

/// `Deserializer` methods of a cell for integers: a decimal with no fractional digits
/// is a whole number, anything else is what it is. The cell has `whole_numeric`.
macro_rules! cell_integers {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
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

/// `Deserializer` methods of a cell for floats: a decimal converts to `f64`. The cell has
/// `numeric_f64`.
macro_rules! cell_floats {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
            match self.numeric_f64() {
                Some(value) => visitor.visit_f64(value),
                None => self.deserialize_any(visitor),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Cell<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
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

    option_and_newtype!(this => this.is_null());

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> DeResult<V::Value> {
        match self.data {
            ColumnData::Binary(Some(v)) => visitor.visit_bytes(v),
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
        match self.data {
            ColumnData::String(Some(v)) => visitor.visit_enum(v.as_ref().into_deserializer()),
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
