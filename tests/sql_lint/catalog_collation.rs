//! R26 `catalog-collation`: a name read from the catalog never meets a registry, `#temp` or
//! table-variable column without `collate`.
//!
//! Why (Microsoft's "Contained Database Collations" and "Collation Precedence" pages): in a
//! non-contained database, metadata is collated in the database's collation, so
//! `sys.columns.name = f.table_name` compares two columns of one collation. A partially
//! contained database (CONTAINMENT = PARTIAL) severs the two: system metadata takes the
//! catalog collation, Latin1_General_100_CI_AS_KS_WS_SC (the page also spells it
//! `_WS_KS_SC`), the same in every contained database and unchangeable, while the database's
//! collation stays the default of user data, `#temp` data included. The registry's columns
//! (changefeed.feeds, changefeed.outboxes, the consumer tables), declared without `collate`,
//! take the database's. A column reference is labelled implicit, and two different implicit
//! collations combine to no collation: a comparison of them (`=`, `<>`, `like`, `in`, a join's
//! `on`) fails (Msg 468), and a concatenation (`+`, `concat`), a `case`/`coalesce`/`isnull`
//! result or a union column of both has no collation, so storing, comparing or returning it
//! fails (Msg 451/457). `collate database_default` on the catalog side is explicit, which
//! wins; in a non-contained database it names the collation the catalog already has there,
//! so the comparison matches what it matched before.
//!
//! A catalog name is: a character column of a catalog view (`sys.*`, `information_schema.*`)
//! (`name`, `definition`, and the columns ending in `_name` or `_desc`), read through the
//! view's alias, or unqualified in a query whose only source is the view; and a column that a
//! CTE, a derived table, an inline table-valued function or a view of the bundle builds from
//! one without `collate` (`changefeed.feed_key_problem(…) as k` makes `k.problem` one, so the
//! rule follows a function's output into the files that call it).
//!
//! Not a catalog name: what the catalog's built-in functions return (object_name,
//! schema_name, col_name, type_name): "Collation Precedence" labels their output
//! coercible-default, like literals, variables and parameters, and coercible-default yields
//! to any implicit collation. So a catalog name compared with a literal or a parameter is
//! fine, and so are two catalog names (one collation). What a value expression hides is not
//! read as a value: the arguments of functions that return no string (`len`, `object_id`,
//! `count`, …), `exists (…)`, the conditions of a `case`, and everything of a subquery but
//! its select list.
//!
//! Released (frozen) migrations are exempt: they cannot change. Every other file is checked
//! with the functions and views as the bundle defines them when it runs (the newest
//! definition before it), and, when no later file replaces it, with their newest definitions
//! too (an inline function's body is expanded into its caller each time the caller compiles).

use std::collections::BTreeMap;

use crate::lex::{Kind, Token, lex};
use crate::schema::Schema;
use crate::typed::{
    Context, Label, arguments, case_branches, close_paren, comparison_at, first_at_depth,
    has_collate, is_assignment, left_span, reference_at, right_span, select_items, text,
};
use crate::{ModuleKind, Rule, Violation, current_files, find_modules, is_frozen};

/// The collation of a contained database's metadata.
const CATALOG_COLLATION: &str = "Latin1_General_100_CI_AS_KS_WS_SC";

/// Functions whose result is not a string: their arguments are not values of the expression.
const NOT_STRING_RESULTS: &[&str] = &[
    "len",
    "datalength",
    "object_id",
    "col_length",
    "columnproperty",
    "objectproperty",
    "objectpropertyex",
    "indexproperty",
    "count",
    "count_big",
    "charindex",
    "patindex",
    "schema_id",
    "type_id",
    "user_id",
    "database_principal_id",
    "has_perms_by_name",
    "is_member",
    "is_rolemember",
    "checksum",
    "binary_checksum",
    "row_number",
    "rank",
    "dense_rank",
    "sum",
    "avg",
    "isjson",
];

/// Words that end an operand of `+`: a clause, a comparison, a branch.
const CHAIN_ENDS: &[&str] = &["like", "in", "is", "as", "between", "collate", "escape"];

/// The columns that each inline table-valued function or view of the bundle builds from
/// catalog names without `collate`: the module's name (its last part, lowercase) → column
/// (lowercase) → how it is built.
pub type Outputs = BTreeMap<String, BTreeMap<String, String>>;

/// What a value in an expression is, for this rule.
#[derive(Clone, Debug)]
enum Side {
    /// A catalog name: its text and where it comes from.
    Catalog(String, String),
    /// A column in the database's collation (or a declared one): its text and why.
    Database(String, String),
}

#[derive(Clone, Debug)]
enum Source {
    /// A catalog view, by its name as written.
    Catalog(String),
    /// A derived table or a CTE: the index of its `select`.
    Select(usize),
    /// A derived table `(values …)`: the index of its `(`.
    Values(usize),
    /// A table-valued function or view of the bundle, by its last name part.
    Module(String),
    Other,
}

struct Binding {
    alias: String,
    source: Source,
    /// The group of parentheses the binding is made in: (its `(`, its `)`), or the file.
    scope: (usize, usize),
    at: usize,
}

struct FileCx<'a, 't> {
    src: &'a str,
    code: &'a [&'a Token<'t>],
    cx: Context<'a>,
    outputs: &'a Outputs,
    bindings: Vec<Binding>,
}

fn is_catalog_column(name: &str) -> bool {
    name == "name" || name == "definition" || name.ends_with("_name") || name.ends_with("_desc")
}

const NOT_AN_ALIAS: &[&str] = &[
    "where",
    "on",
    "inner",
    "left",
    "right",
    "full",
    "cross",
    "outer",
    "join",
    "with",
    "order",
    "group",
    "set",
    "select",
    "union",
    "option",
    "values",
    "output",
    "having",
    "when",
    "then",
    "end",
    "begin",
    "if",
    "else",
    "apply",
    "for",
    "into",
    "declare",
    "insert",
    "update",
    "delete",
    "exec",
    "execute",
    "return",
    "commit",
    "rollback",
    "while",
    "throw",
    "merge",
    "except",
    "intersect",
];

/// The innermost `(` around each token (or None at the top).
fn enclosing_groups(code: &[&Token<'_>]) -> Vec<Option<usize>> {
    let mut stack: Vec<usize> = Vec::new();
    let mut out = Vec::with_capacity(code.len());
    for (i, t) in code.iter().enumerate() {
        if t.is_punct(b')') {
            stack.pop();
        }
        out.push(stack.last().copied());
        if t.is_punct(b'(') {
            stack.push(i);
        }
    }
    out
}

/// `name as (select …)` after `with` or a `,`: each CTE's name (lowercase) and its `select`.
fn ctes(code: &[&Token<'_>]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for i in 1..code.len().saturating_sub(3) {
        let t = code[i];
        if matches!(t.kind, Kind::Word | Kind::Ident)
            && (code[i - 1].is("with") || code[i - 1].is_punct(b','))
            && code[i + 1].is("as")
            && code[i + 2].is_punct(b'(')
            && code[i + 3].is("select")
        {
            out.push((t.ident_value().to_ascii_lowercase(), i + 3));
        }
    }
    out
}

/// The table sources of `from`, `join` and `apply`, with their aliases and scopes.
fn bindings(code: &[&Token<'_>]) -> Vec<Binding> {
    let groups = enclosing_groups(code);
    let ctes = ctes(code);
    let mut out = Vec::new();
    // The token before each source: `from`, `join`, `apply`, or the `,` after a source of
    // a `from` list.
    let mut starts: Vec<usize> = (0..code.len())
        .filter(|&k| code[k].is_any(&["from", "join", "apply"]))
        .collect();
    let mut next = 0;
    while let Some(&k) = starts.get(next) {
        next += 1;
        let j = k + 1;
        let Some(first) = code.get(j) else { continue };
        let (source, end, default_alias) = if first.is_punct(b'(') {
            let Some(close) = close_paren(code, j) else {
                continue;
            };
            let source = if code.get(j + 1).is_some_and(|t| t.is("select")) {
                Source::Select(j + 1)
            } else if code.get(j + 1).is_some_and(|t| t.is("values")) {
                Source::Values(j)
            } else {
                Source::Other
            };
            (source, close + 1, String::new())
        } else if matches!(first.kind, Kind::Word | Kind::Ident)
            && !first.text.starts_with('@')
            && !first.text.starts_with('#')
        {
            let mut parts = vec![first.ident_value().to_ascii_lowercase()];
            let mut e = j + 1;
            while code.get(e).is_some_and(|t| t.is_punct(b'.'))
                && let Some(p) = code
                    .get(e + 1)
                    .filter(|t| matches!(t.kind, Kind::Word | Kind::Ident))
            {
                parts.push(p.ident_value().to_ascii_lowercase());
                e += 2;
            }
            let last = parts.last().cloned().unwrap_or_default();
            if code.get(e).is_some_and(|t| t.is_punct(b'(')) {
                let Some(close) = close_paren(code, e) else {
                    continue;
                };
                (Source::Module(last.clone()), close + 1, last)
            } else {
                let schema = parts.len().checked_sub(2).map(|s| parts[s].as_str());
                let source = if schema.is_some_and(|s| s == "sys" || s == "information_schema") {
                    Source::Catalog(parts.join("."))
                } else if parts.len() == 1
                    && let Some((_, select)) = ctes.iter().find(|(n, _)| *n == last)
                {
                    Source::Select(*select)
                } else if parts.len() >= 2 {
                    // A view of the bundle is read like a function's result.
                    Source::Module(last.clone())
                } else {
                    Source::Other
                };
                (source, e, last)
            }
        } else {
            (Source::Other, j + 1, first.text.to_ascii_lowercase())
        };
        let mut a = end;
        if code.get(a).is_some_and(|t| t.is("as")) {
            a += 1;
        }
        let named = code.get(a).filter(|t| {
            matches!(t.kind, Kind::Word | Kind::Ident)
                && !t.text.starts_with('@')
                && !t.is_any(NOT_AN_ALIAS)
        });
        let (alias, mut after) = match named {
            Some(t) => (t.ident_value().to_ascii_lowercase(), a + 1),
            None => (default_alias, end),
        };
        // `(values …) as r (name)`: the column list.
        if named.is_some() && code.get(after).is_some_and(|t| t.is_punct(b'(')) {
            after = close_paren(code, after).map_or(after, |c| c + 1);
        }
        if code.get(after).is_some_and(|t| t.is_punct(b',')) {
            starts.push(after);
        }
        let scope = groups[k].map_or((0, code.len()), |open| {
            (open, close_paren(code, open).unwrap_or(code.len()))
        });
        out.push(Binding {
            alias,
            source,
            scope,
            at: k,
        });
    }
    out
}

/// The index of the `end` that closes the `case` at `at`.
fn case_end(code: &[&Token<'_>], at: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, t) in code.iter().enumerate().skip(at) {
        if t.is("case") {
            depth += 1;
        } else if t.is("end") {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The column name a select-list item `code[a..b]` gives its value, and where the value is.
fn item_name(code: &[&Token<'_>], a: usize, b: usize) -> Option<(String, usize, usize)> {
    let mut depth = 0i32;
    let mut last_as = None;
    for (i, t) in code.iter().enumerate().take(b).skip(a) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is("as") {
            last_as = Some(i);
        }
    }
    if let Some(k) = last_as {
        let name = code.get(k + 1)?.ident_value().to_ascii_lowercase();
        return Some((name, a, k));
    }
    if b > a + 2 && code[a + 1].is_punct(b'=') && matches!(code[a].kind, Kind::Word | Kind::Ident) {
        return Some((code[a].ident_value().to_ascii_lowercase(), a + 2, b));
    }
    let last = code.get(b.checked_sub(1)?)?;
    matches!(last.kind, Kind::Word | Kind::Ident)
        .then(|| (last.ident_value().to_ascii_lowercase(), a, b))
}

impl<'a, 't> FileCx<'a, 't> {
    fn new(
        src: &'a str,
        code: &'a [&'a Token<'t>],
        schema: &'a Schema,
        outputs: &'a Outputs,
    ) -> Self {
        FileCx {
            src,
            code,
            cx: Context::new(code, schema),
            outputs,
            bindings: bindings(code),
        }
    }

    /// The binding `alias` names at token `i`: the innermost scope around `i` that binds it,
    /// then the nearest binding.
    fn resolve(&self, alias: &str, i: usize) -> Option<&Binding> {
        self.bindings
            .iter()
            .filter(|b| b.alias == alias && b.scope.0 <= i && i <= b.scope.1)
            .min_by_key(|b| (std::cmp::Reverse(b.scope.0), b.at.abs_diff(i)))
    }

    /// The only source of the innermost scope around `i` that has sources, if it is one.
    fn only_source(&self, i: usize) -> Option<&Binding> {
        let around: Vec<&Binding> = self
            .bindings
            .iter()
            .filter(|b| b.scope.0 <= i && i <= b.scope.1)
            .collect();
        let innermost = around.iter().map(|b| b.scope.0).max()?;
        let mut own = around.into_iter().filter(|b| b.scope.0 == innermost);
        let first = own.next()?;
        own.next().is_none().then_some(first)
    }

    /// What each column of the select at `s` is, by what it is built from: a column built
    /// from a catalog name without `collate` is one, one built from a registry column is in
    /// the database's collation, one built from literals and parameters is neither.
    fn select_columns(&self, s: usize, depth: usize) -> BTreeMap<String, Side> {
        let mut out = BTreeMap::new();
        if depth > 8 {
            return out;
        }
        for (a, b) in select_items(self.code, s, false).unwrap_or_default() {
            let Some((name, from, to)) = item_name(self.code, a, b) else {
                continue;
            };
            if has_collate(self.code, from, to) {
                continue;
            }
            let mut found = Vec::new();
            self.values(from, to, depth + 1, &mut found);
            let catalog = found.iter().position(|s| matches!(s, Side::Catalog(..)));
            let side = match catalog.or((!found.is_empty()).then_some(0)) {
                Some(k) => found.swap_remove(k),
                None => continue,
            };
            let side = match side {
                Side::Catalog(text, why) => {
                    let why = format!("built from `{text}`, {why}");
                    Side::Catalog(text, why)
                }
                database => database,
            };
            out.insert(name, side);
        }
        out
    }

    /// What the name token at `i` is, if it is a value this rule cares about.
    fn side_at(&self, i: usize, depth: usize) -> Option<Side> {
        let code = self.code;
        let t = code[i];
        if !matches!(t.kind, Kind::Word | Kind::Ident) || t.text.starts_with('@') {
            return None;
        }
        if code
            .get(i + 1)
            .is_some_and(|n| n.is_punct(b'(') || n.is_punct(b'.'))
        {
            return None;
        }
        let column = t.ident_value().to_ascii_lowercase();
        let qualifier = (i >= 2 && code[i - 1].is_punct(b'.'))
            .then(|| code[i - 2].ident_value().to_ascii_lowercase());
        let shown = match &qualifier {
            Some(q) => format!("{q}.{column}"),
            None => column.clone(),
        };
        let binding = match &qualifier {
            Some(q) => self.resolve(q, i),
            None => self
                .only_source(i)
                .filter(|b| !matches!(b.source, Source::Other)),
        };
        match binding.map(|b| &b.source) {
            Some(Source::Catalog(view)) => {
                return is_catalog_column(&column)
                    .then(|| Side::Catalog(shown, format!("a name from {view}")));
            }
            Some(Source::Select(s)) => {
                return match self.select_columns(*s, depth).remove(&column)? {
                    Side::Catalog(_, why) => Some(Side::Catalog(shown, why)),
                    Side::Database(text, why) => {
                        Some(Side::Database(shown, format!("built from `{text}`, {why}")))
                    }
                };
            }
            Some(Source::Values(open)) => {
                // The columns of `(values …)`: as what its rows hold (literals: neither).
                let close = close_paren(code, *open).unwrap_or(code.len());
                let mut found = Vec::new();
                self.values(open + 1, close, depth + 1, &mut found);
                return found.into_iter().next();
            }
            Some(Source::Module(m)) => {
                if let Some(why) = self.outputs.get(m).and_then(|cols| cols.get(&column)) {
                    return Some(Side::Catalog(shown, why.clone()));
                }
            }
            Some(Source::Other) | None => {}
        }
        let r = reference_at(code, i, 0, &self.cx)?;
        let why = match r.label {
            Label::Default(at) => {
                format!("declared at {at} without a collation: the database's default")
            }
            Label::Temp => "a #temp column: the database's collation in a contained database, \
                            tempdb's otherwise"
                .to_owned(),
            Label::Collated(c, _) if c.eq_ignore_ascii_case(CATALOG_COLLATION) => return None,
            Label::Collated(c, at) => format!("declared `collate {c}` at {at}"),
        };
        Some(Side::Database(r.text, why))
    }

    /// The values `code[from..to]` yields (see the module's documentation for what is not one).
    fn values(&self, from: usize, to: usize, depth: usize, out: &mut Vec<Side>) {
        let code = self.code;
        let mut i = from;
        while i < to {
            let t = code[i];
            let next_open = code.get(i + 1).is_some_and(|n| n.is_punct(b'('));
            if t.is_punct(b'(') && code.get(i + 1).is_some_and(|n| n.is("select")) {
                for (a, b) in select_items(code, i + 1, false).unwrap_or_default() {
                    let (a, b) = item_name(code, a, b).map_or((a, b), |(_, a, b)| (a, b));
                    self.values(a, b.min(to), depth, out);
                }
                i = close_paren(code, i).map_or(to, |c| c + 1);
                continue;
            }
            if next_open && (t.is_any(NOT_STRING_RESULTS) || t.is("exists")) {
                i = close_paren(code, i + 1).map_or(to, |c| c + 1);
                continue;
            }
            if t.is("case") {
                for (a, b) in case_branches(code, i) {
                    self.values(a, b.min(to), depth, out);
                }
                i = case_end(code, i).map_or(to, |e| e + 1);
                continue;
            }
            if let Some(side) = self.side_at(i, depth) {
                out.push(side);
            }
            i += 1;
        }
    }

    fn values_of(&self, from: usize, to: usize) -> Vec<Side> {
        let mut out = Vec::new();
        self.values(from, to, 0, &mut out);
        out
    }

    fn check(&self, sink: &mut Vec<(usize, String)>) {
        let code = self.code;
        let mut chains: Vec<(usize, usize)> = Vec::new();
        for i in 0..code.len() {
            let t = code[i];
            // Comparisons, `like`, `in (…)`.
            let compared = if let Some(after) = comparison_at(code, i) {
                (!(t.is_punct(b'=') && is_assignment(code, i)))
                    .then(|| (left_span(code, i).0, i, after, right_span(code, after)))
            } else if t.is("like") {
                Some((left_span(code, i).0, i, i + 1, right_span(code, i + 1)))
            } else if t.is("in") && code.get(i + 1).is_some_and(|n| n.is_punct(b'(')) {
                close_paren(code, i + 1).map(|close| {
                    let (a, b) = if code.get(i + 2).is_some_and(|n| n.is("select")) {
                        select_items(code, i + 2, false)
                            .and_then(|items| items.first().copied())
                            .unwrap_or((i + 2, close))
                    } else {
                        (i + 2, close)
                    };
                    (left_span(code, i).0, i, a, b.max(a))
                })
            } else {
                None
            };
            if let Some((from, op, a, b)) = compared
                && !has_collate(code, from, b)
            {
                let left = self.values_of(from, op);
                let right = self.values_of(a, b);
                if !left.is_empty() && !right.is_empty() {
                    let both: Vec<Side> = left.into_iter().chain(right).collect();
                    self.report(
                        sink,
                        t.line,
                        &format!("the comparison `{}`", text(self.src, code, from, b)),
                        &both,
                    );
                }
            }
            // The result of case, coalesce, isnull, iif, nullif.
            if t.is("case") {
                let mut all = Vec::new();
                for (a, b) in case_branches(code, i) {
                    if !has_collate(code, a, b) {
                        all.extend(self.values_of(a, b));
                    }
                }
                self.report(sink, t.line, "the branches of this `case`", &all);
            }
            if t.is_any(&["coalesce", "isnull", "iif", "nullif", "concat"])
                && code.get(i + 1).is_some_and(|n| n.is_punct(b'('))
                && let Some(close) = close_paren(code, i + 1)
                && !has_collate(code, i, close + 1)
            {
                let skip = usize::from(t.is("iif"));
                let mut all = Vec::new();
                for (a, b) in arguments(code, i + 1).into_iter().skip(skip) {
                    all.extend(self.values_of(a, b));
                }
                self.report(
                    sink,
                    t.line,
                    &format!("`{}`", text(self.src, code, i, close + 1)),
                    &all,
                );
            }
            // A `+` chain.
            if t.is_punct(b'+') && !code.get(i + 1).is_some_and(|n| n.is_punct(b'=')) {
                let stops = |t: &Token<'_>| {
                    crate::typed::is_boundary(t)
                        || t.is_punct(b'=')
                        || t.is_punct(b'<')
                        || t.is_punct(b'>')
                        || t.is_punct(b'!')
                        || t.is_any(CHAIN_ENDS)
                };
                let from = first_at_depth(code, (0..i).rev(), true, stops).map_or(0, |s| s + 1);
                let to =
                    first_at_depth(code, i + 1..code.len(), false, stops).unwrap_or(code.len());
                // The `collate` that ends a chain applies to its last operand: explicit wins.
                let collated = has_collate(code, from, to)
                    || code.get(to).is_some_and(|t| t.is("collate"))
                    || from > 0 && code[from - 1].is("collate");
                if chains.contains(&(from, to)) || collated {
                    continue;
                }
                chains.push((from, to));
                let all = self.values_of(from, to);
                self.report(
                    sink,
                    code[from.min(i)].line,
                    &format!("the concatenation `{}`", text(self.src, code, from, to)),
                    &all,
                );
            }
        }
        // Union arms.
        for u in 0..code.len() {
            if !code[u].is("union") {
                continue;
            }
            let next = if code.get(u + 1).is_some_and(|t| t.is("all")) {
                u + 2
            } else {
                u + 1
            };
            let (Some(left), Some(right)) =
                (select_items(code, u, true), select_items(code, next, false))
            else {
                continue;
            };
            for (k, (&(a, b), &(c, d))) in left.iter().zip(right.iter()).enumerate() {
                if has_collate(code, a, b) || has_collate(code, c, d) {
                    continue;
                }
                let mut all = self.values_of(a, b);
                all.extend(self.values_of(c, d));
                self.report(
                    sink,
                    code[u].line,
                    &format!("column {} of this union", k + 1),
                    &all,
                );
            }
        }
    }

    fn report(&self, sink: &mut Vec<(usize, String)>, line: usize, what: &str, all: &[Side]) {
        let catalog = all.iter().find_map(|s| match s {
            Side::Catalog(t, why) => Some((t, why)),
            Side::Database(..) => None,
        });
        let database = all.iter().find_map(|s| match s {
            Side::Database(t, why) => Some((t, why)),
            Side::Catalog(..) => None,
        });
        let (Some((catalog, from)), Some((other, why))) = (catalog, database) else {
            return;
        };
        sink.push((
            line,
            format!(
                "{what}: `{catalog}` is a catalog name ({from}) and `{other}` is not ({why}). In \
                 a partially contained database the catalog's names carry the catalog collation \
                 {CATALOG_COLLATION} and the bundle's columns the database's: comparing them \
                 fails (Msg 468), and a concatenation, case/coalesce/isnull result or union \
                 column of both has no collation, so storing, comparing or returning it fails \
                 (Msg 451/457), at migration time for a procedure. Write `{catalog} collate \
                 database_default` (or collate the whole expression): in a non-contained \
                 database the catalog already has that collation, so it matches what it \
                 matched before."
            ),
        ));
    }
}

/// The columns the inline table-valued function or view `src` defines builds from catalog
/// names: its name's last part and them.
fn module_outputs(
    file: &str,
    src: &str,
    schema: &Schema,
    outputs: &Outputs,
) -> Option<(String, BTreeMap<String, String>)> {
    let lexed = lex(src);
    let code: Vec<&Token<'_>> = lexed.code();
    let module = find_modules(src, &code).into_iter().next()?;
    let body = match module.kind {
        ModuleKind::View => (module.name_end..code.len()).find(|&i| code[i].is("as"))?,
        ModuleKind::Function => {
            let returns_table = code
                .get(module.name_end..)?
                .windows(2)
                .any(|w| w[0].is("returns") && w[1].is("table"));
            if !returns_table {
                return None;
            }
            (module.name_end..code.len()).find(|&i| code[i].is("return"))?
        }
        _ => return None,
    };
    let mut depth = 0i32;
    let mut select = None;
    for (i, t) in code.iter().enumerate().skip(body + 1) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is("select") {
            select = Some(i);
            break;
        }
    }
    let name = module.name_parts.last()?.to_ascii_lowercase();
    let shown = module.name_parts.join(".");
    let cx = FileCx::new(src, &code, schema, outputs);
    let columns = cx
        .select_columns(select?, 0)
        .into_iter()
        .filter_map(|(column, side)| match side {
            Side::Catalog(_, why) => Some((
                column,
                format!("which {shown} ({file}) returns without collate, {why}"),
            )),
            Side::Database(..) => None,
        })
        .collect();
    Some((name, columns))
}

fn violations(file: &str, src: &str, schema: &Schema, outputs: &Outputs) -> Vec<Violation> {
    let lexed = lex(src);
    let code: Vec<&Token<'_>> = lexed.code();
    let mut found = Vec::new();
    FileCx::new(src, &code, schema, outputs).check(&mut found);
    found
        .into_iter()
        .map(|(line, message)| Violation {
            file: file.to_owned(),
            line,
            rule: Rule::CatalogCollation,
            message,
        })
        .collect()
}

/// R26 over the bundle's `.sql` files (bundle order), with its declarations.
pub fn lint(files: &[(String, String)], schema: &Schema) -> Vec<Violation> {
    let mut outputs = Outputs::new();
    let mut out = Vec::new();
    for (name, text) in files.iter().filter(|(n, _)| n.ends_with(".sql")) {
        let file = format!("sql/{name}");
        if !is_frozen(&file) {
            out.extend(violations(&file, text, schema, &outputs));
        }
        if let Some((module, columns)) = module_outputs(&file, text, schema, &outputs) {
            outputs.insert(module, columns);
        }
    }
    for current in current_files(files) {
        let file = format!("sql/{}", current.name);
        if !is_frozen(&file) {
            out.extend(violations(&file, current.text, schema, &outputs));
        }
    }
    out.sort_by(|a, b| (&a.file, a.line, &a.message).cmp(&(&b.file, b.line, &b.message)));
    out.dedup();
    out
}
