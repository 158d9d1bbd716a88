//! [`OutboxTable`]: a validated `schema.table` outbox name for PostgreSQL.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result, invalid_name};

/// The longest table part: index names add up to 12 characters and must fit PostgreSQL's
/// 63-byte identifiers.
pub const MAX_TABLE_NAME: usize = 40;
/// The longest `schema.table`: the notify channel `changefeed:schema.table` must fit in 63
/// bytes.
pub const MAX_OUTBOX_NAME: usize = 52;

/// An outbox table as `schema.table`, e.g. `public.outbox`.
///
/// Two parts of lower-case ASCII letters, digits and underscores, not starting with a
/// digit; the table at most 40 characters, the whole at most 52; not in the schemas
/// `changefeed`, `information_schema` or `pg_*`, and no table named `changefeed*`. This is
/// exactly the rule of the bundle's `changefeed.check_outbox_name` (SQLSTATE CF000), so a
/// name that passes here needs no quoting in SQL text, and one that fails never reaches the
/// server. Upper case is refused rather than quoted: PostgreSQL folds unquoted names to lower
/// case, so a table made as `"Outbox"` would need quotes in every query of your own.
///
/// ```
/// use changefeed::postgres::OutboxTable;
///
/// let table: OutboxTable = "public.outbox".parse()?;
/// assert_eq!(table.channel(), "changefeed:public.outbox");
/// assert!("outbox".parse::<OutboxTable>().is_err());
/// assert!("public.outbox; drop table t".parse::<OutboxTable>().is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OutboxTable {
    name: String,
    dot: usize,
}

impl OutboxTable {
    /// `schema.table`, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.name[..self.dot]
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.name[self.dot + 1..]
    }

    /// `"schema"."table"`, for SQL text.
    pub fn quoted(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema(), self.table())
    }

    /// The channel the outbox's trigger notifies on commit: `changefeed:schema.table`.
    pub fn channel(&self) -> String {
        format!("changefeed:{}", self.name)
    }
}

/// Whether `part` is lower-case ASCII letters, digits and underscores, not starting with a
/// digit.
fn plain_identifier(part: &str) -> bool {
    !part.is_empty()
        && !part.starts_with(|c: char| c.is_ascii_digit())
        && part
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl FromStr for OutboxTable {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        let invalid = |reason: &str| invalid_name(name, reason);
        let Some((schema, table)) = name.split_once('.') else {
            return Err(invalid(
                "a PostgreSQL outbox is named schema.table, e.g. public.outbox",
            ));
        };
        if !plain_identifier(schema) || !plain_identifier(table) {
            return Err(invalid(
                "use lower-case ASCII letters, digits and underscores, not starting with a \
                 digit, in both parts of schema.table (PostgreSQL outbox names are never \
                 quoted)",
            ));
        }
        if table.len() > MAX_TABLE_NAME || name.len() > MAX_OUTBOX_NAME {
            return Err(invalid(
                "the table part has at most 40 characters and schema.table at most 52 \
                 (index and notify channel names must fit PostgreSQL's 63 bytes)",
            ));
        }
        if matches!(schema, "changefeed" | "information_schema")
            || schema.starts_with("pg_")
            || table.starts_with("changefeed")
        {
            return Err(invalid(
                "the schemas changefeed, information_schema and pg_*, and tables named \
                 changefeed*, are reserved; choose another",
            ));
        }
        Ok(OutboxTable {
            name: name.to_owned(),
            dot: schema.len(),
        })
    }
}

impl fmt::Display for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_matches_the_bundles() {
        let longest = format!("{}.{}", "s".repeat(11), "t".repeat(40));
        for good in ["public.outbox", "app_2.out_box", "_s._t", longest.as_str()] {
            let table = good.parse::<OutboxTable>().unwrap();
            assert_eq!(table.name(), good);
            assert_eq!(format!("{}.{}", table.schema(), table.table()), good);
            assert!(table.channel().len() <= 63, "{}", table.channel());
        }
        let too_long = format!("{}.{}", "s".repeat(12), "t".repeat(40));
        let long_table = format!("s.{}", "t".repeat(41));
        for bad in [
            "",
            "outbox",
            "public.",
            ".outbox",
            "a.b.c",
            "Public.outbox",
            "public.Outbox",
            "public.9x",
            "public.out-box",
            "public.\"x\"",
            "public.héllo",
            "changefeed.outbox",
            "pg_catalog.outbox",
            "information_schema.outbox",
            "public.changefeed_x",
            too_long.as_str(),
            long_table.as_str(),
        ] {
            let error = bad.parse::<OutboxTable>().unwrap_err();
            assert!(
                matches!(&error, Error::InvalidName { name, .. } if name == bad),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn quoting_and_channel() {
        let table: OutboxTable = "app.outbox".parse().unwrap();
        assert_eq!(table.quoted(), "\"app\".\"outbox\"");
        assert_eq!(table.channel(), "changefeed:app.outbox");
    }
}
