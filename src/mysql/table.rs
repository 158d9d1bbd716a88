//! [`OutboxTable`]: a validated outbox table name for MariaDB/MySQL.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result, invalid_name};

/// The longest outbox table name: MySQL identifiers have 64 characters, and 48 leaves room
/// for names derived from it.
pub const MAX_TABLE_NAME: usize = 48;

/// An outbox table in the connection's current database, e.g. `outbox`.
///
/// 1–48 ASCII letters, digits and underscores, not starting with a digit, and not starting
/// with `changefeed` (the bundle's own objects, any case). This is exactly the rule the
/// bundle's `changefeed_check_table_name` applies (error 51000), so a name that passes here
/// can be placed inside backquotes in SQL without any injection risk, and a name that fails
/// never reaches the server.
///
/// ```
/// use changefeed::mysql::OutboxTable;
///
/// let table: OutboxTable = "outbox".parse()?;
/// assert_eq!(table.quoted(), "`outbox`");
/// assert!("outbox`; drop table t; --".parse::<OutboxTable>().is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OutboxTable(String);

impl OutboxTable {
    /// The name as given.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// `` `name` ``, for SQL text.
    pub fn quoted(&self) -> String {
        format!("`{}`", self.0)
    }
}

impl FromStr for OutboxTable {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        let invalid = |reason: &str| invalid_name(name, reason);
        let length = name.chars().count();
        if length == 0 || length > MAX_TABLE_NAME {
            return Err(invalid(
                "an outbox table name has 1 to 48 characters (MariaDB/MySQL)",
            ));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(invalid(
                "use only ASCII letters, digits and underscores (MariaDB/MySQL outbox names \
                 go inside backquotes unescaped); the table lives in the connection's database",
            ));
        }
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(invalid("a name cannot start with a digit"));
        }
        if name.to_ascii_lowercase().starts_with("changefeed") {
            return Err(invalid(
                "names starting with \"changefeed\" belong to the changefeed bundle; choose \
                 another",
            ));
        }
        Ok(OutboxTable(name.to_owned()))
    }
}

impl fmt::Display for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_matches_the_bundles() {
        for good in ["outbox", "Outbox_2", "_x", &"a".repeat(48)] {
            assert_eq!(good.parse::<OutboxTable>().unwrap().name(), good);
        }
        for bad in [
            "",
            "9x",
            "bad-name",
            "db.outbox",
            "x`y",
            "héllo",
            "changefeed_x",
            "ChangeFeedY",
            &"a".repeat(49),
        ] {
            let error = bad.parse::<OutboxTable>().unwrap_err();
            assert!(
                matches!(&error, Error::InvalidName { name, .. } if name == bad),
                "{bad}: {error}"
            );
        }
    }
}
