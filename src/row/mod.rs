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
//!
//! # PostgreSQL (feature `postgres`)
//!
//! The same traits read `tokio_postgres` rows: `FromRow::from_pg_row` and
//! `Column::pg_column`, implemented for every type here that has a PostgreSQL
//! counterpart: `bool`; `i16`, `i32`, `i64` (`smallint`, `integer`, `bigint`); `f32`, `f64`
//! (`real`, `double precision`); `String` (`text`, `varchar`, `char(n)`, `name`); `Vec<u8>`
//! (`bytea`); `uuid::Uuid` (= `tiberius::Uuid`, `uuid`); `time::PrimitiveDateTime`,
//! `Date`, `Time`, `OffsetDateTime` (`timestamp`, `date`, `time`, `timestamptz`); [`Ulid`]
//! (`bytea` of exactly 16 bytes); `Option`, tuples, [`Json`] (`json`, `jsonb` or text) and
//! [`Serde`] (through `deserialize_pg`). Two have no clean counterpart and refuse
//! PostgreSQL rows with an error that says what to use: `u8` (PostgreSQL has no unsigned
//! one-byte integer; read `smallint` as `i16`) and `tiberius::numeric::Numeric` (SQL
//! Server's decimal; read `numeric` through [`Serde`], as a number or its exact text).
//!
//! Both methods have a default that fails with [`crate::Error::Decode`] naming the type, so
//! an implementation written for SQL Server alone still compiles with the feature on; it
//! fails only when a PostgreSQL row is actually decoded with it.
//!
//! This file holds the decoding traits and their implementations; the serde deserializer
//! over a row's columns that [`deserialize`] and [`Serde`] use is `row/deserializer.rs`,
//! PostgreSQL's cells for it `row/pg_deserializer.rs`, and reading one PostgreSQL column
//! `row/pg_row.rs`.

use serde::de::DeserializeOwned;
use tiberius::{FromSql, Row};
use ulid::Ulid;

use crate::error::{Result, decode_error};

// Its macros (the Deserializer methods both drivers' cells write alike) serve
// pg_deserializer too, declared after it.
#[macro_use]
mod deserializer;
#[cfg(feature = "postgres")]
mod pg_deserializer;
#[cfg(feature = "postgres")]
mod pg_row;

pub use deserializer::deserialize;
#[cfg(feature = "postgres")]
pub use pg_deserializer::deserialize_pg;
#[cfg(feature = "postgres")]
pub(crate) use pg_deserializer::pg_column_json;

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

    /// Decodes the value whose first column is `first` (0-based) from a PostgreSQL row.
    ///
    /// The default fails with [`crate::Error::Decode`] naming the type: implement it to read
    /// the type from PostgreSQL (existing implementations keep compiling without it).
    ///
    /// ```no_run
    /// use changefeed::row::{Column, FromRow};
    ///
    /// struct OrderKey { tenant: i32, order_no: String }
    ///
    /// impl FromRow for OrderKey {
    ///     fn from_row(row: &tiberius::Row, first: usize) -> changefeed::Result<Self> {
    ///         Ok(OrderKey { tenant: i32::column(row, first)?, order_no: String::column(row, first + 1)? })
    ///     }
    ///     fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> changefeed::Result<Self> {
    ///         Ok(OrderKey {
    ///             tenant: i32::pg_column(row, first)?,
    ///             order_no: String::pg_column(row, first + 1)?,
    ///         })
    ///     }
    /// }
    /// ```
    #[cfg(feature = "postgres")]
    fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
        Err(pg_row::not_implemented::<Self>(row, first, "from_pg_row"))
    }
}

/// One column decoded into an owned Rust value; a null is an error except for `Option`.
pub trait Column: Sized {
    /// Decodes column `index` of `row`.
    fn column(row: &Row, index: usize) -> Result<Self>;

    /// Decodes column `index` of a PostgreSQL row.
    ///
    /// The default fails with [`crate::Error::Decode`] naming the type: implement it to read
    /// the type from PostgreSQL.
    ///
    /// ```no_run
    /// use changefeed::row::Column;
    ///
    /// # fn run(row: &tokio_postgres::Row) -> changefeed::Result<()> {
    /// let order_id = i64::pg_column(row, 1)?;
    /// let note = Option::<String>::pg_column(row, 2)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        Err(pg_row::not_implemented::<Self>(row, index, "pg_column"))
    }
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

/// Column `index` of `row` as `R` (`None` for NULL); an error names the column.
fn get<'a, R: FromSql<'a>>(row: &'a Row, index: usize) -> Result<Option<R>> {
    if index >= row.len() {
        return Err(decode_error(column_label(row, index), "no such column"));
    }
    row.try_get::<R, usize>(index)
        .map_err(|e| decode_error(column_label(row, index), e))
}

/// [`Column`] and [`FromRow`] (a single column) for types tiberius decodes by value, and
/// tokio-postgres too.
macro_rules! copy_columns {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn column(row: &Row, index: usize) -> Result<Self> {
                required(row, index, get::<$t>(row, index)?)
            }

            #[cfg(feature = "postgres")]
            fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
                pg_row::required(row, index, pg_row::get::<$t>(row, index)?)
            }
        }
    )*
    column_values!($($t),*);
    };
}

/// [`Column`] and [`FromRow`] for types tiberius decodes by value that PostgreSQL has no
/// clean counterpart for: `pg_column` says what to read instead.
macro_rules! sql_server_columns {
    ($($t:ty => $instead:literal),*) => {$(
        impl Column for $t {
            fn column(row: &Row, index: usize) -> Result<Self> {
                required(row, index, get::<$t>(row, index)?)
            }

            #[cfg(feature = "postgres")]
            fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
                Err(decode_error(pg_row::column_label(row, index), $instead))
            }
        }
    )*
    column_values!($($t),*);
    };
}

/// [`FromRow`] for a [`Column`] type: the single column `first`.
macro_rules! column_values {
    ($($t:ty),*) => {$(
        impl FromRow for $t {
            fn from_row(row: &Row, first: usize) -> Result<Self> {
                <$t as Column>::column(row, first)
            }

            #[cfg(feature = "postgres")]
            fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
                <$t as Column>::pg_column(row, first)
            }
        }
    )*};
}

copy_columns!(
    bool,
    i16,
    i32,
    i64,
    f32,
    f64,
    tiberius::Uuid,
    time::PrimitiveDateTime,
    time::Date,
    time::Time,
    time::OffsetDateTime
);

sql_server_columns!(
    u8 => "u8 has no PostgreSQL counterpart (PostgreSQL has no unsigned one-byte \
           integer): read smallint as i16",
    tiberius::numeric::Numeric => "tiberius's Numeric is SQL Server's decimal: read a \
           PostgreSQL numeric through Serde, as f64 or as its exact text (String)"
);

column_values!(String, Vec<u8>, Ulid);

impl Column for Ulid {
    /// A `binary(16)` column, such as a feed's `ulid`.
    fn column(row: &Row, index: usize) -> Result<Self> {
        let bytes = Vec::<u8>::column(row, index)?;
        ulid_from_bytes(&bytes, || column_label(row, index), "binary(16)")
    }

    /// A `bytea` column of exactly 16 bytes, such as a feed's `ulid`.
    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        let bytes = Vec::<u8>::pg_column(row, index)?;
        ulid_from_bytes(
            &bytes,
            || pg_row::column_label(row, index),
            "bytea of 16 bytes",
        )
    }
}

/// The ULID of 16 `bytes`; else an error naming the column (`label`) and the SQL type a
/// ULID is stored as (`stored_as`).
fn ulid_from_bytes(bytes: &[u8], label: impl FnOnce() -> String, stored_as: &str) -> Result<Ulid> {
    let array: [u8; 16] = bytes.try_into().map_err(|_| {
        decode_error(
            label(),
            format!("a ULID is {stored_as}, got {} bytes", bytes.len()),
        )
    })?;
    Ok(Ulid::from_bytes(array))
}

impl Column for String {
    fn column(row: &Row, index: usize) -> Result<Self> {
        required(row, index, get::<&str>(row, index)?.map(str::to_owned))
    }

    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        pg_row::required(
            row,
            index,
            pg_row::get::<&str>(row, index)?.map(str::to_owned),
        )
    }
}

impl Column for Vec<u8> {
    fn column(row: &Row, index: usize) -> Result<Self> {
        required(row, index, get::<&[u8]>(row, index)?.map(<[u8]>::to_vec))
    }

    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        pg_row::required(
            row,
            index,
            pg_row::get::<&[u8]>(row, index)?.map(<[u8]>::to_vec),
        )
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

    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        match T::pg_column(row, index) {
            Ok(value) => Ok(Some(value)),
            Err(_) if pg_row::is_null(row, index) => Ok(None),
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

    #[cfg(feature = "postgres")]
    fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
        if first < row.len() && (first..row.len()).all(|index| pg_row::is_null(row, index)) {
            Ok(None)
        } else {
            T::from_pg_row(row, first).map(Some)
        }
    }
}

macro_rules! tuples {
    ($(($($name:ident $offset:expr),+))*) => {$(
        impl<$($name: Column),+> FromRow for ($($name,)+) {
            fn from_row(row: &Row, first: usize) -> Result<Self> {
                Ok(($($name::column(row, first + $offset)?,)+))
            }

            #[cfg(feature = "postgres")]
            fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
                Ok(($($name::pg_column(row, first + $offset)?,)+))
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

/// One JSON text column (`nvarchar(max)` holding JSON) decoded with `serde_json`; on
/// PostgreSQL a `json`, `jsonb` or text column.
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
        json_from_slice(text.as_bytes(), || column_label(row, index))
    }

    #[cfg(feature = "postgres")]
    fn pg_column(row: &tokio_postgres::Row, index: usize) -> Result<Self> {
        let text = pg_row::json_text(row, index)?;
        json_from_slice(text, || pg_row::column_label(row, index))
    }
}

/// `text` parsed as JSON into `T`; an error names the column (`label`).
fn json_from_slice<T: DeserializeOwned>(
    text: &[u8],
    label: impl FnOnce() -> String,
) -> Result<Json<T>> {
    serde_json::from_slice(text)
        .map(Json)
        .map_err(|error| decode_error(label(), format!("not valid JSON for the type: {error}")))
}

impl<T: DeserializeOwned> FromRow for Json<T> {
    fn from_row(row: &Row, first: usize) -> Result<Self> {
        Self::column(row, first)
    }

    #[cfg(feature = "postgres")]
    fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
        Self::pg_column(row, first)
    }
}

/// A serde-decoded value: `Serde<T>` is a [`FromRow`] for every `T: Deserialize`, decoded
/// with [`deserialize`] (by column name for structs and maps, by position for tuples); on
/// PostgreSQL with `deserialize_pg`, by the same rules.
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

    #[cfg(feature = "postgres")]
    fn from_pg_row(row: &tokio_postgres::Row, first: usize) -> Result<Self> {
        deserialize_pg(row, first).map(Serde)
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
