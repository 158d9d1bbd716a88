//! What the bundle declares, as far as the typed rules (R11–R19) need it: the type, length
//! and explicit collation of every column definition and of every variable and parameter.
//!
//! Column definitions are found by their shape, `<name> <type>[(n[, m])] [collate X]` after
//! `(` or `,` (or at the start of a string fragment), in code and in the text of every
//! string literal, so that the dynamic DDL that create_feed_storage and create_outbox_storage
//! build piece by piece (`N'aggregate_id nvarchar(256) collate Latin1_General_100_BIN2 null, '`)
//! counts like a `create table`. That covers `create table`, table variables, table types
//! and `openjson … with (…)`.
//!
//! The approximation, deliberately conservative: columns are known by name only, not by
//! table. A name that the bundle declares with an explicit collation anywhere is treated as
//! having that collation wherever it is referenced (except through the alias of a table
//! variable or `#temp` table, whose columns take the database's or tempdb's default).

use crate::lex::{Kind, Token, lex};

/// A declared length: characters for character types, bytes for binary types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Len {
    N(u32),
    Max,
}

impl std::fmt::Display for Len {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Len::N(n) => write!(f, "{n}"),
            Len::Max => f.write_str("max"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlType {
    /// Lowercase base type name, e.g. `nvarchar`.
    pub base: String,
    /// The length in parentheses, if the type has one (`sysname` is `nvarchar(128)`).
    pub len: Option<Len>,
    /// The collation named by `collate X`, if any.
    pub collation: Option<String>,
}

const STRING_TYPES: &[&str] = &[
    "char", "varchar", "nchar", "nvarchar", "sysname", "text", "ntext",
];
const BINARY_TYPES: &[&str] = &["binary", "varbinary", "image", "rowversion", "timestamp"];
const INTEGER_TYPES: &[&str] = &["bigint", "int", "smallint", "tinyint", "bit"];
/// Types a bitwise operator refuses.
const NOT_INTEGER_NUMBERS: &[&str] = &[
    "decimal",
    "numeric",
    "dec",
    "float",
    "real",
    "money",
    "smallmoney",
];
const OTHER_TYPES: &[&str] = &[
    "date",
    "datetime",
    "datetime2",
    "datetimeoffset",
    "smalldatetime",
    "time",
    "uniqueidentifier",
    "xml",
    "sql_variant",
    "json",
    "hierarchyid",
    "geometry",
    "geography",
];

pub fn is_type_word(t: &Token<'_>) -> bool {
    t.kind == Kind::Word
        && [
            STRING_TYPES,
            BINARY_TYPES,
            INTEGER_TYPES,
            NOT_INTEGER_NUMBERS,
            OTHER_TYPES,
        ]
        .iter()
        .any(|list| t.is_any(list))
}

impl SqlType {
    pub fn is_string(&self) -> bool {
        STRING_TYPES.contains(&self.base.as_str())
    }

    pub fn is_binary(&self) -> bool {
        BINARY_TYPES.contains(&self.base.as_str())
    }

    pub fn is_integer(&self) -> bool {
        INTEGER_TYPES.contains(&self.base.as_str())
    }

    pub fn is_not_integer_number(&self) -> bool {
        NOT_INTEGER_NUMBERS.contains(&self.base.as_str())
    }

    /// The longest value it holds, for character and binary types.
    pub fn max_len(&self) -> Option<Len> {
        if !(self.is_string() || self.is_binary()) {
            return None;
        }
        match self.base.as_str() {
            "sysname" => Some(Len::N(128)),
            "text" | "ntext" | "image" => Some(Len::Max),
            "rowversion" | "timestamp" => Some(Len::N(8)),
            // A declared char type without a length holds one character.
            _ => Some(self.len.unwrap_or(Len::N(1))),
        }
    }

    pub fn describe(&self) -> String {
        let mut s = self.base.clone();
        if let Some(len) = self.len {
            s.push_str(&format!("({len})"));
        }
        if let Some(c) = &self.collation {
            s.push_str(&format!(" collate {c}"));
        }
        s
    }
}

/// `TYPE [(n[, m])] [collate X]` at `i` → the type and the index after it.
pub fn parse_type(code: &[&Token<'_>], i: usize) -> Option<(SqlType, usize)> {
    let t = code.get(i)?;
    if !is_type_word(t) {
        return None;
    }
    let base = t.text.to_ascii_lowercase();
    let mut j = i + 1;
    let mut len = None;
    if code.get(j).is_some_and(|t| t.is_punct(b'(')) {
        let first = code.get(j + 1)?;
        len = if first.is("max") {
            Some(Len::Max)
        } else {
            first.text.parse().ok().map(Len::N)
        };
        // Skip to the closing parenthesis (precision and scale).
        let mut k = j + 1;
        while k < code.len() && !code[k].is_punct(b')') {
            k += 1;
        }
        j = k + 1;
    }
    let mut collation = None;
    if code.get(j).is_some_and(|t| t.is("collate"))
        && let Some(c) = code.get(j + 1)
    {
        collation = Some(c.ident_value());
        j += 2;
    }
    Some((
        SqlType {
            base,
            len,
            collation,
        },
        j,
    ))
}

/// A column definition somewhere in the bundle.
#[derive(Clone, Debug)]
pub struct Column {
    /// Lowercase name.
    pub name: String,
    pub ty: SqlType,
    /// `sql/V27__….sql:44`, for messages.
    pub at: String,
}

#[derive(Clone, Debug, Default)]
pub struct Schema {
    pub columns: Vec<Column>,
}

/// Words that can stand before a type without being a column name.
const NOT_COLUMN_NAMES: &[&str] = &[
    "as",
    "convert",
    "cast",
    "try_convert",
    "try_cast",
    "returns",
    "table",
    "then",
    "else",
    "select",
    "and",
    "or",
    "not",
    "when",
    "return",
];

impl Schema {
    /// The schema of one text (a snippet in a test, a rendered object).
    pub fn of(file: &str, src: &str) -> Self {
        let mut schema = Schema::default();
        schema.add(file, src);
        schema
    }

    /// Adds every column definition in `src` (code and string literals).
    pub fn add(&mut self, file: &str, src: &str) {
        let lexed = lex(src);
        let code: Vec<&Token<'_>> = lexed.code();
        self.add_tokens(file, &code, 0);
        for t in code.iter().filter(|t| t.kind == Kind::Str) {
            let value = t.string_value();
            let inner = lex(&value);
            let inner: Vec<&Token<'_>> = inner.code();
            self.add_tokens(file, &inner, t.line - 1);
        }
    }

    pub fn add_tokens(&mut self, file: &str, code: &[&Token<'_>], line_offset: usize) {
        for i in 0..code.len() {
            let t = code[i];
            let named = match t.kind {
                Kind::Ident => true,
                Kind::Word => {
                    !t.text.starts_with('@')
                        && !t.text.starts_with('#')
                        && !t.is_any(NOT_COLUMN_NAMES)
                }
                _ => false,
            };
            let after_separator =
                i == 0 || code[i - 1].is_punct(b'(') || code[i - 1].is_punct(b',');
            if !named || !after_separator {
                continue;
            }
            if let Some((ty, _)) = parse_type(code, i + 1) {
                self.columns.push(Column {
                    name: t.ident_value().to_ascii_lowercase(),
                    ty,
                    at: format!("{file}:{}", t.line + line_offset),
                });
            }
        }
    }

    fn named<'s>(&'s self, name: &str) -> impl Iterator<Item = &'s Column> + 's {
        let name = name.to_ascii_lowercase();
        self.columns.iter().filter(move |c| c.name == name)
    }

    /// The first declaration of `name` with an explicit collation.
    pub fn collated(&self, name: &str) -> Option<&Column> {
        self.named(name).find(|c| c.ty.collation.is_some())
    }

    /// Whether the bundle declares `name` as a character column anywhere.
    pub fn string_column(&self, name: &str) -> Option<&Column> {
        self.named(name).find(|c| c.ty.is_string())
    }

    /// The type of `name` when every declaration of it agrees.
    pub fn column_type(&self, name: &str) -> Option<&SqlType> {
        let mut all = self.named(name);
        let first = all.next()?;
        all.all(|c| c.ty == first.ty).then_some(&first.ty)
    }
}

/// Every `@name [as] TYPE` in `code` (parameters and declared variables), lowercase names.
/// A later declaration of the same name replaces an earlier one.
pub fn variables(code: &[&Token<'_>]) -> Vec<(String, SqlType)> {
    let mut out: Vec<(String, SqlType)> = Vec::new();
    for i in 0..code.len() {
        let t = code[i];
        if t.kind != Kind::Word || !t.text.starts_with('@') || t.text.starts_with("@@") {
            continue;
        }
        let at = if code.get(i + 1).is_some_and(|n| n.is("as")) {
            i + 2
        } else {
            i + 1
        };
        if let Some((ty, _)) = parse_type(code, at) {
            let name = t.text.to_ascii_lowercase();
            out.retain(|(n, _)| *n != name);
            out.push((name, ty));
        }
    }
    out
}

pub fn variable<'v>(vars: &'v [(String, SqlType)], name: &str) -> Option<&'v SqlType> {
    vars.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| t)
}
