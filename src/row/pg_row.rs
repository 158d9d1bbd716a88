//! Reading one column of a `tokio_postgres` row (feature `postgres`): what the PostgreSQL
//! halves of [`Column`](super::Column) and [`FromRow`](super::FromRow) and the PostgreSQL
//! serde cells build on. Every error names the column the way the SQL Server path does:
//! `name (position i)`.

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};

use crate::error::{Error, Result, decode_error};

/// How an error names column `index` of `row`.
pub(super) fn column_label(row: &Row, index: usize) -> String {
    match row.columns().get(index) {
        Some(column) => format!("{} (position {index})", column.name()),
        None => format!("position {index} (the row has {} columns)", row.len()),
    }
}

/// `value`, or the error of a NULL where a value is required.
pub(super) fn required<T>(row: &Row, index: usize, value: Option<T>) -> Result<T> {
    value.ok_or_else(|| {
        decode_error(
            column_label(row, index),
            "it is NULL; decode it as an Option",
        )
    })
}

/// Column `index` of `row` as `R` (`None` for NULL); an error names the column and the two
/// types that did not fit.
pub(super) fn get<'a, R: FromSql<'a>>(row: &'a Row, index: usize) -> Result<Option<R>> {
    if index >= row.len() {
        return Err(decode_error(column_label(row, index), "no such column"));
    }
    row.try_get::<usize, Option<R>>(index)
        .map_err(|error| decode_error(column_label(row, index), error))
}

/// A column's value as the server sent it (binary format), whatever its type: `None` for
/// NULL. For the NULL test and the types decoded here rather than by tokio-postgres.
pub(super) struct Raw<'a>(pub(super) Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(
        _: &Type,
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Column `index`'s type and raw value; `None` when there is no such column.
pub(super) fn raw(row: &Row, index: usize) -> Option<(&Type, Option<&[u8]>)> {
    let column = row.columns().get(index)?;
    let Raw(bytes) = row.try_get::<usize, Raw<'_>>(index).ok()?;
    Some((column.type_(), bytes))
}

/// Whether column `index` is NULL (false when there is no such column).
pub(super) fn is_null(row: &Row, index: usize) -> bool {
    matches!(raw(row, index), Some((_, None)))
}

/// Whether values of `ty` arrive as UTF-8 text in the binary format: the string types
/// tokio-postgres reads as `&str`, and enums (sent as their label).
pub(super) fn is_text(ty: &Type) -> bool {
    <&str as FromSql>::accepts(ty) || matches!(ty.kind(), tokio_postgres::types::Kind::Enum(_))
}

/// The JSON text of column `index`: a `json` column as is, a `jsonb` column without its
/// format version byte (1, the only one PostgreSQL has), a text column as is.
pub(super) fn json_text(row: &Row, index: usize) -> Result<&[u8]> {
    let (ty, bytes) =
        raw(row, index).ok_or_else(|| decode_error(column_label(row, index), "no such column"))?;
    let bytes = required(row, index, bytes)?;
    json_bytes(ty, bytes).map_err(|reason| decode_error(column_label(row, index), reason))
}

/// The JSON text of a value of type `ty` sent as `bytes`; else why not.
pub(super) fn json_bytes<'a>(ty: &Type, bytes: &'a [u8]) -> std::result::Result<&'a [u8], String> {
    match *ty {
        Type::JSONB => match bytes.split_first() {
            Some((1, text)) => Ok(text),
            _ => Err("a jsonb value in an unknown format version".to_owned()),
        },
        Type::JSON => Ok(bytes),
        _ if is_text(ty) => Ok(bytes),
        _ => Err(format!(
            "it is {ty}; JSON is read from a json, jsonb or text column"
        )),
    }
}

/// The error of a type whose [`FromRow`](super::FromRow) or [`Column`](super::Column)
/// implementation has no PostgreSQL half (`method`).
pub(super) fn not_implemented<T>(row: &Row, index: usize, method: &str) -> Error {
    decode_error(
        column_label(row, index),
        format!(
            "{} cannot be read from PostgreSQL: implement {method} to read it from PostgreSQL",
            std::any::type_name::<T>()
        ),
    )
}
