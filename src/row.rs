//! Decoding the rows `read_feed` returns into Rust values.
//!
//! `read_feed` returns `ulid` followed by the event table's key columns (or, with
//! `@with_event = 1`, every column of the event). [`FromRow`] decodes the columns after
//! the ulid; it is implemented for single values and tuples of them, and is small enough to
//! implement by hand for a struct.

use tiberius::Row;

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
    time::PrimitiveDateTime,
    time::Date,
    time::OffsetDateTime
);

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
    tiberius::Uuid,
    time::PrimitiveDateTime,
    time::Date,
    time::OffsetDateTime
);

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
