//! [`Feed`]: a validated event-table name and the names of its per-feed objects.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The longest kind prefix of a per-feed name (`changefeed.readers:`, a role name); every
/// name `<kind>:<schema>.<table>` must fit SQL Server's 128 characters. The SQL function
/// `changefeed.parse_feed_name` applies the same limit.
const LONGEST_KIND_PREFIX: usize = "changefeed.readers:".len();
const MAX_OBJECT_NAME: usize = 128;
/// Schema and table together, without the dot between them.
pub const MAX_QUALIFIED_LEN: usize = MAX_OBJECT_NAME - LONGEST_KIND_PREFIX - 1;
/// Reserved for the template feed whose code the generator copies.
const RESERVED_MARKER: &str = "__template";

/// A table name changefeed can generate objects for, as `schema.table`: a feed's event
/// table or a claim outbox. The rule is the one `changefeed.parse_feed_name` applies.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: String,
    table: String,
}

impl TableName {
    /// A name from its schema and table; see [`Feed`] for the rule.
    pub fn new(schema: &str, table: &str) -> Result<Self> {
        let name = format!("{schema}.{table}");
        let invalid = |reason: String| Error::InvalidName {
            name: name.clone(),
            reason,
        };
        check_part("schema", schema).map_err(invalid)?;
        check_part("table", table).map_err(invalid)?;
        // UTF-16 code units, as SQL Server counts identifiers (an emoji takes two).
        let length = schema.encode_utf16().count() + table.encode_utf16().count();
        if length > MAX_QUALIFIED_LEN {
            return Err(invalid(format!(
                "schema and table together have {length} UTF-16 code units; at most \
                 {MAX_QUALIFIED_LEN} fit, so that every generated object name stays within \
                 SQL Server's 128"
            )));
        }
        if schema == "changefeed" {
            return Err(invalid(
                "the changefeed schema belongs to changefeed; keep your tables in your own schema"
                    .to_owned(),
            ));
        }
        Ok(TableName {
            schema: schema.to_owned(),
            table: table.to_owned(),
        })
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table within its schema.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// `[schema].[table]`.
    pub fn quoted(&self) -> String {
        format!("[{}].[{}]", self.schema, self.table)
    }

    /// `[changefeed].[<kind>:schema.table]`, the name of one generated object.
    pub fn object(&self, kind: &str) -> String {
        format!("[changefeed].[{kind}:{self}]")
    }
}

impl FromStr for TableName {
    type Err = Error;

    /// Parses `schema.table`. There must be exactly one dot; brackets are not accepted
    /// (no valid name needs them).
    fn from_str(name: &str) -> Result<Self> {
        match name.split_once('.') {
            Some((schema, table)) if !table.contains('.') => TableName::new(schema, table),
            _ => Err(Error::InvalidName {
                name: name.to_owned(),
                reason: "write the table as \"schema.table\", with exactly one dot".to_owned(),
            }),
        }
    }
}

impl fmt::Display for TableName {
    /// `schema.table`, as it appears inside generated object names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// An event table that is (or will be) a feed, as `schema.table`.
///
/// Each part is 1–128 characters with no control character, none of `[ ] ' " . \`, and no
/// leading or trailing space (a backslash cannot be part of the feed's role names); schema
/// and table together have at most [`MAX_QUALIFIED_LEN`] characters. These are exactly the names `changefeed.setup_feed`
/// accepts, so a `Feed` can be placed inside brackets and string literals of SQL without
/// any injection risk — a name that fails here never reaches the server.
///
/// ```
/// use changefeed::Feed;
///
/// let feed: Feed = "myservice.MyEvent".parse()?;
/// assert_eq!(feed.read_feed_procedure(), "[changefeed].[read_feed:myservice.MyEvent]");
/// assert!("dbo.x]; drop table t; --".parse::<Feed>().is_err());
/// # Ok::<(), changefeed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Feed(TableName);

impl Feed {
    /// A feed from its schema and table.
    pub fn new(schema: &str, table: &str) -> Result<Self> {
        TableName::new(schema, table).map(Feed)
    }

    /// The schema of the event table.
    pub fn schema(&self) -> &str {
        self.0.schema()
    }

    /// The name of the event table within its schema.
    pub fn table(&self) -> &str {
        self.0.table()
    }

    /// `[schema].[table]`, the event table itself.
    pub fn quoted_table(&self) -> String {
        self.0.quoted()
    }

    /// `[changefeed].[<kind>:schema.table]`, the name of one per-feed object.
    pub fn object(&self, kind: &str) -> String {
        self.0.object(kind)
    }

    /// `[changefeed].[read_feed:schema.table]`.
    pub fn read_feed_procedure(&self) -> String {
        self.object("read_feed")
    }

    /// `[changefeed].[outbox:schema.table]`, where writers insert.
    pub fn outbox_table(&self) -> String {
        self.object("outbox")
    }

    /// The database role allowed to write to the outbox.
    pub fn writers_role(&self) -> String {
        format!("[changefeed.writers:{self}]")
    }

    /// The database role allowed to call `read_feed`.
    pub fn readers_role(&self) -> String {
        format!("[changefeed.readers:{self}]")
    }
}

fn check_part(what: &str, part: &str) -> std::result::Result<(), String> {
    // UTF-16 code units, as SQL Server counts identifiers (an emoji takes two).
    let chars = part.encode_utf16().count();
    if chars == 0 {
        return Err(format!(
            "the {what} name is empty; write the feed as \"schema.table\""
        ));
    }
    if chars > MAX_OBJECT_NAME {
        return Err(format!(
            "the {what} name has {chars} UTF-16 code units; SQL Server names have at most 128"
        ));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| c.is_control() || matches!(c, '[' | ']' | '\'' | '"' | '.' | '\\'))
    {
        return Err(format!(
            "the {what} name contains {bad:?}; names must not contain [ ] ' \" . \\ or \
             control characters (rename the table)"
        ));
    }
    if part.starts_with(' ') || part.ends_with(' ') {
        return Err(format!(
            "the {what} name begins or ends with a space; rename the table"
        ));
    }
    if part.contains(RESERVED_MARKER) {
        return Err(format!(
            "the {what} name contains {RESERVED_MARKER:?}, which changefeed reserves for its \
             template feed; use another name"
        ));
    }
    Ok(())
}

impl FromStr for Feed {
    type Err = Error;

    /// Parses `schema.table`, as [`TableName`] does.
    fn from_str(name: &str) -> Result<Self> {
        name.parse().map(Feed)
    }
}

impl fmt::Display for Feed {
    /// `schema.table`, as it appears inside per-feed object names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_and_unicode_names_are_accepted() {
        let feed: Feed = "myservice.MyEvent".parse().unwrap();
        assert_eq!(feed.schema(), "myservice");
        assert_eq!(feed.table(), "MyEvent");
        assert_eq!(
            feed.outbox_table(),
            "[changefeed].[outbox:myservice.MyEvent]"
        );
        assert_eq!(feed.quoted_table(), "[myservice].[MyEvent]");
        assert_eq!(
            feed.writers_role(),
            "[changefeed.writers:myservice.MyEvent]"
        );
        let unicode: Feed = "ventes.Événement commandé".parse().unwrap();
        assert_eq!(unicode.to_string(), "ventes.Événement commandé");
    }

    #[test]
    fn injection_attempts_are_rejected() {
        for name in [
            "dbo.x]; drop table t; --",
            "dbo.x'; drop table t; --",
            "dbo.[x]",
            "dbo.\"x\"",
            "db.dbo.x",
            "x",
            ".x",
            "dbo.",
            "dbo.x\u{0}",
            "dbo.x\n",
            " dbo.x",
            "dbo.x ",
            "changefeed.feeds",
            "dbo.__template__",
            "dbo.x\\y",
            "a\\b.x",
            "dbo.x\\",
        ] {
            let error = name.parse::<Feed>().expect_err(name);
            assert!(
                matches!(&error, Error::InvalidName { name: n, .. } if n == name),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn length_limit_matches_the_longest_per_feed_name() {
        let schema = "s".repeat(8);
        let fits = "t".repeat(MAX_QUALIFIED_LEN - 8);
        let feed = Feed::new(&schema, &fits).unwrap();
        assert_eq!(feed.readers_role().chars().count() - 2, 128);
        assert!(Feed::new(&schema, &format!("{fits}t")).is_err());
    }

    #[test]
    fn lengths_count_utf16_code_units_as_sql_server_does() {
        // An emoji is one char but two UTF-16 units. Schema "s" and 53 emoji are 107 units
        // and fit; 54 emoji are 109 units (by chars, 55 would have looked like 108).
        let emoji = "\u{1F600}";
        assert!(Feed::new("s", &emoji.repeat(53)).is_ok());
        let error = Feed::new("s", &emoji.repeat(54)).unwrap_err().to_string();
        assert!(error.contains("109 UTF-16 code units"), "{error}");
    }

    proptest! {
        #[test]
        fn accepted_names_are_safe_inside_brackets_and_literals(
            schema in "[^\\[\\]'\".]{1,20}", table in "[^\\[\\]'\".]{1,20}"
        ) {
            if let Ok(feed) = Feed::new(&schema, &table) {
                let text = feed.to_string();
                prop_assert!(!text.contains(']') && !text.contains('\'') && !text.contains('['));
                prop_assert!(!text.contains('\\'), "a backslash cannot be in a role name");
                prop_assert!(!text.chars().any(char::is_control));
                prop_assert_eq!(text.parse::<Feed>().unwrap(), feed);
            }
        }

        #[test]
        fn a_backslash_anywhere_in_either_part_is_refused(
            before in "[a-z]{0,10}", after in "[a-z]{0,10}", in_schema in any::<bool>()
        ) {
            let with_backslash = format!("{before}\\{after}");
            let (schema, table) = if in_schema {
                (with_backslash.as_str(), "events")
            } else {
                ("dbo", with_backslash.as_str())
            };
            let error = Feed::new(schema, table).expect_err("a backslash is refused");
            prop_assert!(error.to_string().contains("'\\\\'"), "{}", error);
        }
    }
}
