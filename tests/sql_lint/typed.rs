//! The typed rules, R11–R19: the errors SQL Server reports at CREATE time (or on every call)
//! from types, collations and binding, which sqlfluff and the batch rules cannot see. Each
//! rule is a conservative approximation over the token stream and the bundle's declarations
//! (`schema.rs`); what each one does and does not see is written at the rule.

use crate::lex::{Kind, Token};
use crate::schema::{Len, Schema, SqlType, parse_type, variable, variables};
use crate::{Module, ModuleKind, Rule, Sink, body_as, is_begin_transaction, parse_set};

/// The index of the `)` that closes the `(` at `open`.
pub fn close_paren(code: &[&Token<'_>], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in code.iter().enumerate().skip(open) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The index of the `(` that opens the `)` at `close`.
fn open_paren(code: &[&Token<'_>], close: usize) -> Option<usize> {
    let mut depth = 0usize;
    for i in (0..=close).rev() {
        if code[i].is_punct(b')') {
            depth += 1;
        } else if code[i].is_punct(b'(') {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The top-level comma-separated arguments between `open` and its `)`, as index ranges.
pub fn arguments(code: &[&Token<'_>], open: usize) -> Vec<(usize, usize)> {
    let Some(close) = close_paren(code, open) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut depth = 0;
    let mut from = open + 1;
    for (i, t) in code.iter().enumerate().take(close).skip(open + 1) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is_punct(b',') {
            out.push((from, i));
            from = i + 1;
        }
    }
    out.push((from, close));
    out
}

pub fn text(src: &str, code: &[&Token<'_>], from: usize, to: usize) -> String {
    if from >= to {
        return String::new();
    }
    let s = &src[code[from].start..code[to - 1].end()];
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An integer literal: its value, or None for hex, decimal and float literals.
fn integer_literal(t: &Token<'_>) -> Option<u128> {
    if t.kind != Kind::Number || !t.text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Longer than any u128: certainly out of range.
    Some(t.text.parse().unwrap_or(u128::MAX))
}

const INT_MAX: u128 = 2_147_483_647;

/// Whether `t` can end an operand (so that a `-` after it is binary, not a sign).
fn ends_operand(t: &Token<'_>) -> bool {
    match t.kind {
        Kind::Number | Kind::Str | Kind::Ident => true,
        Kind::Punct => t.is_punct(b')'),
        Kind::Word => {
            t.text.starts_with('@')
                || !t.is_any(&[
                    "then", "else", "return", "select", "when", "and", "or", "not", "between",
                    "in", "is", "set", "values", "where", "on", "if", "while", "top", "by",
                ])
        }
        Kind::Comment => false,
    }
}

/// The type of the call `convert(TYPE, …)` / `cast(… as TYPE)` whose `(` is at `open`.
fn converted_type(code: &[&Token<'_>], open: usize) -> Option<SqlType> {
    let func = code.get(open.checked_sub(1)?)?;
    if func.is_any(&["convert", "try_convert"]) {
        return parse_type(code, open + 1).map(|(t, _)| t);
    }
    if func.is_any(&["cast", "try_cast"]) {
        let close = close_paren(code, open)?;
        let mut depth = 0;
        for i in open + 1..close {
            if code[i].is_punct(b'(') {
                depth += 1;
            } else if code[i].is_punct(b')') {
                depth -= 1;
            } else if depth == 0 && code[i].is("as") {
                return parse_type(code, i + 1).map(|(t, _)| t);
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// R11 int-literal-range
// ---------------------------------------------------------------------------------------

/// Whether the literal at `i` (with its sign at `s`, `s == i` when unsigned) is the direct
/// operand of `convert(bigint, …)` / `cast(… as bigint)` or the initial value of a bigint
/// variable or parameter (`@x bigint = …`).
fn typed_as_bigint(code: &[&Token<'_>], s: usize, i: usize) -> bool {
    let at = |k: Option<usize>| k.and_then(|k| code.get(k).copied());
    let before = |n: usize| s.checked_sub(n);
    let next = at(Some(i + 1));
    let convert = at(before(1)).is_some_and(|t| t.is_punct(b','))
        && at(before(2)).is_some_and(|t| t.is("bigint"))
        && at(before(3)).is_some_and(|t| t.is_punct(b'('))
        && at(before(4)).is_some_and(|t| t.is_any(&["convert", "try_convert"]))
        && next.is_some_and(|t| t.is_punct(b')'));
    let cast = at(before(1)).is_some_and(|t| t.is_punct(b'('))
        && at(before(2)).is_some_and(|t| t.is_any(&["cast", "try_cast"]))
        && next.is_some_and(|t| t.is("as"))
        && at(Some(i + 2)).is_some_and(|t| t.is("bigint"))
        && at(Some(i + 3)).is_some_and(|t| t.is_punct(b')'));
    let variable = at(before(1)).is_some_and(|t| t.is_punct(b'='))
        && at(before(2)).is_some_and(|t| t.is("bigint"))
        && (at(before(3)).is_some_and(|t| t.text.starts_with('@'))
            || at(before(3)).is_some_and(|t| t.is("as"))
                && at(before(4)).is_some_and(|t| t.text.starts_with('@')));
    convert || cast || variable
}

fn int_literals(code: &[&Token<'_>], sink: &mut Sink<'_>) {
    for (i, t) in code.iter().enumerate() {
        let Some(value) = integer_literal(t) else {
            continue;
        };
        let signed = i > 0
            && (code[i - 1].is_punct(b'-') || code[i - 1].is_punct(b'+'))
            && (i < 2 || !ends_operand(code[i - 2]));
        let s = if signed { i - 1 } else { i };
        if value <= INT_MAX || typed_as_bigint(code, s, i) {
            continue;
        }
        let literal = if signed {
            format!("{}{}", code[i - 1].text, t.text)
        } else {
            t.text.to_owned()
        };
        sink.push(
            t.line,
            Rule::IntLiteral,
            format!(
                "`{literal}` is outside the int range, so SQL Server types it numeric, not \
                 bigint: arithmetic with it yields numeric, and a bitwise operator refuses it \
                 at CREATE time (Msg 402). Give it its type where it stands: \
                 `convert(bigint, {literal})`, or a variable `declare @name bigint = \
                 {literal};` (ARCHITECTURE.md)."
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------
// R19 bitwise-operand
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    Integer,
    Binary,
    /// decimal/numeric/float/real/money, or an integer literal outside the int range.
    NotInteger,
    Unknown,
}

fn literal_operand(t: &Token<'_>) -> Operand {
    if t.kind != Kind::Number {
        return Operand::Unknown;
    }
    if t.text.starts_with("0x") || t.text.starts_with("0X") {
        return Operand::Binary;
    }
    match integer_literal(t) {
        Some(v) if v <= INT_MAX => Operand::Integer,
        _ => Operand::NotInteger,
    }
}

fn type_operand(ty: Option<SqlType>) -> Operand {
    match ty {
        Some(t) if t.is_integer() => Operand::Integer,
        Some(t) if t.is_binary() => Operand::Binary,
        Some(t) if t.is_not_integer_number() => Operand::NotInteger,
        _ => Operand::Unknown,
    }
}

fn word_operand(t: &Token<'_>, vars: &[(String, SqlType)]) -> Operand {
    if t.kind == Kind::Word && t.text.starts_with('@') {
        type_operand(variable(vars, t.text).cloned())
    } else {
        literal_operand(t)
    }
}

/// The operand that ends at `i` (left of an operator).
fn left_operand(code: &[&Token<'_>], i: usize, vars: &[(String, SqlType)]) -> Operand {
    let t = code[i];
    if t.is_punct(b')') {
        return open_paren(code, i).map_or(Operand::Unknown, |open| {
            type_operand(converted_type(code, open))
        });
    }
    word_operand(t, vars)
}

/// The operand that starts at `i` (right of an operator), after any unary sign.
fn right_operand(code: &[&Token<'_>], mut i: usize, vars: &[(String, SqlType)]) -> Operand {
    while code
        .get(i)
        .is_some_and(|t| t.is_punct(b'-') || t.is_punct(b'+'))
    {
        i += 1;
    }
    let Some(t) = code.get(i) else {
        return Operand::Unknown;
    };
    if code.get(i + 1).is_some_and(|n| n.is_punct(b'(')) {
        return type_operand(converted_type(code, i + 1));
    }
    word_operand(t, vars)
}

fn bitwise_operands(src: &str, code: &[&Token<'_>], sink: &mut Sink<'_>) {
    let vars = variables(code);
    for i in 1..code.len() {
        let t = code[i];
        if !(t.is_punct(b'&') || t.is_punct(b'|') || t.is_punct(b'^')) {
            continue;
        }
        let compound = code.get(i + 1).is_some_and(|n| n.is_punct(b'='));
        let right_at = if compound { i + 2 } else { i + 1 };
        let left = left_operand(code, i - 1, &vars);
        let right = right_operand(code, right_at, &vars);
        let problem = if left == Operand::NotInteger || right == Operand::NotInteger {
            "an operand that is not an integer type (decimal/numeric, float, money, or an \
             integer literal outside the int range, which is numeric)"
        } else if left == Operand::Binary && right == Operand::Binary {
            "two binary operands (at most one operand of a bitwise operator may be binary)"
        } else {
            continue;
        };
        let from = i.saturating_sub(6);
        let to = (right_at + 4).min(code.len());
        sink.push(
            t.line,
            Rule::BitwiseOperand,
            format!(
                "`{}` in `… {} …` has {problem}: SQL Server refuses it at CREATE time (Msg 402). \
                 Bitwise operators take int/bigint/smallint/tinyint/bit (binary on one side \
                 only): give the operand a bigint type, `convert(bigint, …)` or a `bigint` \
                 variable (ARCHITECTURE.md).",
                t.text,
                text(src, code, from, to)
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------
// R12 collation-mix
// ---------------------------------------------------------------------------------------

/// The collation label of one column reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    /// A column the bundle declares `collate X` (X, where it is declared).
    Collated(String, String),
    /// A character column with the database's default collation (where it is declared).
    Default(String),
    /// A column of a `#temp` table: tempdb's default collation.
    Temp,
}

pub struct Ref {
    pub text: String,
    pub label: Label,
}

const NOT_A_COLUMN: &[&str] = &[
    "and", "or", "not", "null", "is", "in", "like", "between", "exists", "case", "when", "then",
    "else", "end", "select", "from", "where", "on", "as", "set", "collate",
];

/// `declare @v [as] table (…)` in `code`: the variable (lowercase) and its columns. A
/// variable of a table type is not here: its columns are the type's (known by name).
fn table_variables(code: &[&Token<'_>]) -> Vec<(String, Schema)> {
    let mut out = Vec::new();
    for i in 0..code.len() {
        let t = code[i];
        if t.kind != Kind::Word || !t.text.starts_with('@') {
            continue;
        }
        let mut j = i + 1;
        if code.get(j).is_some_and(|n| n.is("as")) {
            j += 1;
        }
        if !(code.get(j).is_some_and(|n| n.is("table"))
            && code.get(j + 1).is_some_and(|n| n.is_punct(b'(')))
        {
            continue;
        }
        let close = close_paren(code, j + 1).unwrap_or(code.len());
        let mut columns = Schema::default();
        columns.add_tokens("a table variable", &code[j + 2..close], 0);
        out.push((t.text.to_ascii_lowercase(), columns));
    }
    out
}

/// Aliases of `#temp` tables, and of table variables (alias, variable), in
/// `from`/`join`/`update` clauses.
fn aliases(code: &[&Token<'_>]) -> (Vec<String>, Vec<(String, String)>) {
    let mut temp = Vec::new();
    let mut variables = Vec::new();
    for i in 1..code.len() {
        let t = code[i];
        let is_temp = t.kind == Kind::Word && t.text.starts_with('#');
        let is_variable = t.kind == Kind::Word
            && t.text.starts_with('@')
            && code[i - 1].is_any(&["from", "join", "update"]);
        if !is_temp && !is_variable {
            continue;
        }
        let mut j = i + 1;
        if code.get(j).is_some_and(|t| t.is("as")) {
            j += 1;
        }
        let alias = code.get(j).filter(|a| {
            a.kind == Kind::Word
                && !a.text.starts_with('@')
                && !a.is_any(&[
                    "where", "on", "inner", "left", "right", "full", "cross", "outer", "join",
                    "with", "order", "group", "set", "select", "union", "option", "values",
                    "output", "having", "when", "then", "end", "begin", "if", "else",
                ])
        });
        let name = alias.map_or_else(
            || t.text.to_ascii_lowercase(),
            |a| a.text.to_ascii_lowercase(),
        );
        if is_temp {
            temp.push(name);
        } else {
            variables.push((name, t.text.to_ascii_lowercase()));
        }
    }
    (temp, variables)
}

pub struct Context<'s> {
    schema: &'s Schema,
    temp_aliases: Vec<String>,
    /// (alias, table variable)
    variable_aliases: Vec<(String, String)>,
    table_variables: Vec<(String, Schema)>,
}

impl<'s> Context<'s> {
    /// The aliases and table variables of `code`, and the bundle's declarations.
    pub fn new(code: &[&Token<'_>], schema: &'s Schema) -> Self {
        let (temp_aliases, variable_aliases) = aliases(code);
        Context {
            schema,
            temp_aliases,
            variable_aliases,
            table_variables: table_variables(code),
        }
    }

    /// The columns of the table variable behind `alias`, when it is declared in this file
    /// as `table (…)`.
    fn table_variable(&self, alias: &str) -> Option<&Schema> {
        let (_, variable) = self.variable_aliases.iter().find(|(a, _)| a == alias)?;
        self.table_variables
            .iter()
            .find(|(v, _)| v == variable)
            .map(|(_, s)| s)
    }
}

/// The column references in `code[from..to]` that carry a collation label.
fn references(code: &[&Token<'_>], from: usize, to: usize, cx: &Context<'_>) -> Vec<Ref> {
    (from..to)
        .filter_map(|i| reference_at(code, i, from, cx))
        .collect()
}

/// The column reference whose name is the token at `i` (its qualifier, if any, at `i - 2`,
/// never before `from`), when it carries a collation label.
pub fn reference_at(code: &[&Token<'_>], i: usize, from: usize, cx: &Context<'_>) -> Option<Ref> {
    let t = code[i];
    if !matches!(t.kind, Kind::Word | Kind::Ident) || t.text.starts_with('@') {
        return None;
    }
    let followed_by_call_or_dot = code
        .get(i + 1)
        .is_some_and(|n| n.is_punct(b'(') || n.is_punct(b'.'));
    if followed_by_call_or_dot || t.is_any(NOT_A_COLUMN) {
        return None;
    }
    let qualifier = (i >= from + 2 && code[i - 1].is_punct(b'.'))
        .then(|| code[i - 2].ident_value().to_ascii_lowercase());
    if qualifier.is_none() && i > from && code[i - 1].is_punct(b'.') {
        return None;
    }
    let name = t.ident_value();
    let shown = match &qualifier {
        Some(q) => format!("{q}.{name}"),
        None => name.clone(),
    };
    let label = if qualifier
        .as_ref()
        .is_some_and(|q| q.starts_with('#') || cx.temp_aliases.contains(q))
    {
        Some(Label::Temp)
    } else if let Some(columns) = qualifier.as_ref().and_then(|q| cx.table_variable(q)) {
        // Table-variable columns: their own declaration, else the database default.
        match columns.collated(&name) {
            Some(c) => Some(Label::Collated(
                c.ty.collation.clone().unwrap_or_default(),
                format!("{} (a table variable)", c.at),
            )),
            None => columns
                .string_column(&name)
                .or_else(|| cx.schema.string_column(&name))
                .map(|_| Label::Default("a table variable".to_owned())),
        }
    } else if let Some(c) = cx.schema.collated(&name) {
        Some(Label::Collated(
            c.ty.collation.clone().unwrap_or_default(),
            c.at.clone(),
        ))
    } else {
        cx.schema
            .string_column(&name)
            .map(|c| Label::Default(c.at.clone()))
    };
    label.map(|label| Ref { text: shown, label })
}

/// The conflict between two labels in one expression, described, if any.
fn conflict(refs: &[Ref]) -> Option<String> {
    let (collated, collation, at) = refs.iter().find_map(|r| match &r.label {
        Label::Collated(c, at) => Some((r, c, at)),
        _ => None,
    })?;
    let other = refs.iter().find(|r| match &r.label {
        Label::Collated(c, _) => c != collation,
        Label::Default(_) | Label::Temp => true,
    })?;
    let other_is = match &other.label {
        Label::Collated(c, at) => format!("declared `collate {c}` at {at}"),
        Label::Default(at) => {
            format!("declared at {at} without a collation: the database's default")
        }
        Label::Temp => "a #temp table column: tempdb's default collation".to_owned(),
    };
    Some(format!(
        "`{}` (declared `collate {collation}` at {at}) meets `{}` ({other_is})",
        collated.text, other.text
    ))
}

pub fn has_collate(code: &[&Token<'_>], from: usize, to: usize) -> bool {
    code[from..to].iter().any(|t| t.is("collate"))
}

/// The token ranges of the result branches (`then …`, `else …`) of the `case` at `at`.
pub fn case_branches(code: &[&Token<'_>], at: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut depth = 0i32; // nested case … end and parentheses
    let mut open: Option<usize> = None;
    for (i, t) in code.iter().enumerate().skip(at + 1) {
        if t.is("case") || t.is_punct(b'(') {
            depth += 1;
        } else if (t.is("end") || t.is_punct(b')')) && depth > 0 {
            depth -= 1;
        } else if depth == 0 && (t.is_any(&["when", "else", "end"]) || t.is("then")) {
            if let Some(from) = open.take() {
                out.push((from, i));
            }
            if t.is_any(&["then", "else"]) {
                open = Some(i + 1);
            }
            if t.is("end") {
                break;
            }
        }
    }
    out
}

/// Comparison operators: (index of the first token, index after the operator).
pub fn comparison_at(code: &[&Token<'_>], i: usize) -> Option<usize> {
    let t = code[i];
    let prev = i.checked_sub(1).map(|p| code[p]);
    let next = code.get(i + 1);
    let after_op_char = |p: Option<&Token<'_>>| {
        p.is_some_and(|p| p.is_punct(b'<') || p.is_punct(b'>') || p.is_punct(b'!'))
    };
    if t.is_punct(b'=') && !after_op_char(prev) {
        return Some(i + 1);
    }
    if t.is_punct(b'!') && next.is_some_and(|n| n.is_punct(b'=')) {
        return Some(i + 2);
    }
    if t.is_punct(b'<') {
        return Some(
            if next.is_some_and(|n| n.is_punct(b'>') || n.is_punct(b'=')) {
                i + 2
            } else {
                i + 1
            },
        );
    }
    if t.is_punct(b'>') && !prev.is_some_and(|p| p.is_punct(b'<')) {
        return Some(if next.is_some_and(|n| n.is_punct(b'=')) {
            i + 2
        } else {
            i + 1
        });
    }
    None
}

const BOUNDARY_WORDS: &[&str] = &[
    "and", "or", "not", "where", "on", "when", "then", "else", "end", "if", "while", "select",
    "set", "return", "having", "from", "join", "by", "case", "begin", "values", "exists",
];

pub fn is_boundary(t: &Token<'_>) -> bool {
    t.is_punct(b',') || t.is_punct(b';') || t.is_any(BOUNDARY_WORDS)
}

/// Walks `indices` of `code` away from an operator (`backwards` towards the start), over
/// bracketed groups, to the first token at the operator's own depth that `stops` accepts, or
/// to the bracket that closes the group the operator stands in; `None` at the end.
pub fn first_at_depth(
    code: &[&Token<'_>],
    indices: impl Iterator<Item = usize>,
    backwards: bool,
    mut stops: impl FnMut(&Token<'_>) -> bool,
) -> Option<usize> {
    let (nest, unnest) = if backwards {
        (b')', b'(')
    } else {
        (b'(', b')')
    };
    let mut depth = 0i32;
    for i in indices {
        let t = code[i];
        if t.is_punct(nest) {
            depth += 1;
        } else if t.is_punct(unnest) {
            if depth == 0 {
                return Some(i);
            }
            depth -= 1;
        } else if depth == 0 && stops(t) {
            return Some(i);
        }
    }
    None
}

/// The operand left of the operator at `op`: (first index, the clause word before it).
pub fn left_span(code: &[&Token<'_>], op: usize) -> (usize, Option<usize>) {
    match first_at_depth(code, (0..op).rev(), true, is_boundary) {
        Some(before) => (before + 1, Some(before)),
        None => (0, None),
    }
}

pub fn right_span(code: &[&Token<'_>], from: usize) -> usize {
    first_at_depth(code, from..code.len(), false, is_boundary).unwrap_or(code.len())
}

/// The clause an `=` stands in: `set`/`select` (an assignment or alias, not a comparison)
/// or anything else.
pub fn is_assignment(code: &[&Token<'_>], op: usize) -> bool {
    const ASSIGNING: &[&str] = &["set", "select"];
    const COMPARING: &[&str] = &[
        "where", "on", "when", "if", "while", "and", "or", "having", "then", "else", "case",
        "return", "exists", "not",
    ];
    let clause = |t: &Token<'_>| t.is_any(ASSIGNING) || t.is_any(COMPARING);
    first_at_depth(code, (0..op).rev(), true, clause).is_some_and(|i| code[i].is_any(ASSIGNING))
}

fn collation_mixes(src: &str, code: &[&Token<'_>], schema: &Schema, sink: &mut Sink<'_>) {
    let cx = Context::new(code, schema);
    let fix = "Say the collation in the expression (`<column> collate <the declared \
               collation>` on the other side, or `collate database_default` for a #temp \
               column), or declare both columns with the same collation (ARCHITECTURE.md)";
    let mut report = |line: usize, what: String, conflict: String| {
        sink.push(
            line,
            Rule::CollationMix,
            format!(
                "{what}: {conflict}. Two different implicit collations fail in a comparison \
                 (Msg 468) and leave the result of coalesce/isnull/case/iif/union without a \
                 collation, so storing or comparing it fails (Msg 451/457). {fix}."
            ),
        );
    };
    for i in 0..code.len() {
        let t = code[i];
        // coalesce / isnull / iif / nullif
        if t.is_any(&["coalesce", "isnull", "iif", "nullif"])
            && code.get(i + 1).is_some_and(|n| n.is_punct(b'('))
            && let Some(close) = close_paren(code, i + 1)
        {
            let args: Vec<(usize, usize)> = if t.is("iif") {
                // iif(condition, a, b): the condition is a comparison (below).
                arguments(code, i + 1).into_iter().skip(1).collect()
            } else {
                arguments(code, i + 1)
            };
            let refs: Vec<Ref> = args
                .iter()
                .flat_map(|&(a, b)| references(code, a, b, &cx))
                .collect();
            if !has_collate(code, i, close + 1)
                && let Some(c) = conflict(&refs)
            {
                report(t.line, format!("`{}`", text(src, code, i, close + 1)), c);
            }
        }
        // case … end: the result branches
        if t.is("case") {
            let branches = case_branches(code, i);
            let refs: Vec<Ref> = branches
                .iter()
                .filter(|&&(a, b)| !has_collate(code, a, b))
                .flat_map(|&(a, b)| references(code, a, b, &cx))
                .collect();
            if let Some(c) = conflict(&refs) {
                report(t.line, "the branches of this `case`".to_owned(), c);
            }
        }
        // comparisons
        if let Some(after) = comparison_at(code, i) {
            if t.is_punct(b'=') && is_assignment(code, i) {
                continue;
            }
            let (from, _) = left_span(code, i);
            let to = right_span(code, after);
            if has_collate(code, from, to) {
                continue;
            }
            let left = references(code, from, i, &cx);
            let right = references(code, after, to, &cx);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let mut both = left;
            both.extend(right);
            if let Some(c) = conflict(&both) {
                report(
                    t.line,
                    format!("the comparison `{}`", text(src, code, from, to)),
                    c,
                );
            }
        }
    }
    union_arms(src, code, &cx, sink);
}

/// `select a, b … union [all] select c, d …`: the i-th items of the arms are one column.
fn union_arms(src: &str, code: &[&Token<'_>], cx: &Context<'_>, sink: &mut Sink<'_>) {
    for u in 0..code.len() {
        if !code[u].is("union") {
            continue;
        }
        let mut next = u + 1;
        if code.get(next).is_some_and(|t| t.is("all")) {
            next += 1;
        }
        let (Some(left), Some(right)) =
            (select_items(code, u, true), select_items(code, next, false))
        else {
            continue;
        };
        for (k, (&(a, b), &(c, d))) in left.iter().zip(right.iter()).enumerate() {
            if has_collate(code, a, b) || has_collate(code, c, d) {
                continue;
            }
            let mut refs = references(code, a, b, cx);
            refs.extend(references(code, c, d, cx));
            if let Some(conflict) = conflict(&refs) {
                sink.push(
                    code[u].line,
                    Rule::CollationMix,
                    format!(
                        "column {} of this union (`{}` / `{}`): {conflict}. The arms of a union \
                         with two different implicit collations leave the column without a \
                         collation (Msg 451/457). Say the collation in one arm (`… collate \
                         <the declared collation>`) (ARCHITECTURE.md).",
                        k + 1,
                        text(src, code, a, b),
                        text(src, code, c, d)
                    ),
                );
            }
        }
    }
}

/// The select-list items of the arm before (`backward`) or after the `union` at `at`.
pub fn select_items(code: &[&Token<'_>], at: usize, backward: bool) -> Option<Vec<(usize, usize)>> {
    let select = if backward {
        let mut depth = 0i32;
        let mut found = None;
        for i in (0..at).rev() {
            if code[i].is_punct(b')') {
                depth += 1;
            } else if code[i].is_punct(b'(') {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else if depth == 0 && code[i].is("select") {
                found = Some(i);
                break;
            }
        }
        found?
    } else {
        code.get(at).filter(|t| t.is("select"))?;
        at
    };
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut from = select + 1;
    if code
        .get(from)
        .is_some_and(|t| t.is_any(&["distinct", "all"]))
    {
        from += 1;
    }
    let start = from;
    for (i, t) in code.iter().enumerate().skip(start) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            if depth == 0 {
                items.push((from, i));
                break;
            }
            depth -= 1;
        } else if depth == 0 && t.is_punct(b',') {
            items.push((from, i));
            from = i + 1;
        } else if depth == 0 && t.is_any(&["from", "where", "union", "into", "order", "group"]) {
            items.push((from, i));
            break;
        }
    }
    Some(items)
}

// ---------------------------------------------------------------------------------------
// R14 string-truncation
// ---------------------------------------------------------------------------------------

/// The longest value `code[from..to]` can have, when it is known.
fn max_len_of(
    code: &[&Token<'_>],
    from: usize,
    to: usize,
    vars: &[(String, SqlType)],
    schema: &Schema,
) -> Option<Len> {
    if to <= from {
        return None;
    }
    let t = code[from];
    if to - from == 1 {
        return match t.kind {
            Kind::Str => Some(Len::N(t.string_value().chars().count() as u32)),
            Kind::Word if t.text.starts_with('@') => variable(vars, t.text)?.max_len(),
            Kind::Word | Kind::Ident => schema.column_type(&t.ident_value())?.max_len(),
            _ => None,
        };
    }
    if to - from == 3 && code[from + 1].is_punct(b'.') {
        return schema.column_type(&code[from + 2].ident_value())?.max_len();
    }
    if code.get(from + 1).is_some_and(|n| n.is_punct(b'('))
        && close_paren(code, from + 1) == Some(to - 1)
    {
        if let Some(ty) = converted_type(code, from + 1) {
            // convert(varchar, x) without a length is 30 characters long.
            return if ty.len.is_none() && (ty.is_string() || ty.is_binary()) && ty.base != "sysname"
            {
                Some(Len::N(30))
            } else {
                ty.max_len()
            };
        }
        if t.is("concat") {
            let mut total = 0u32;
            for (a, b) in arguments(code, from + 1) {
                let piece = if b == a + 1 && code[a].text.starts_with('@') {
                    match variable(vars, code[a].text) {
                        Some(ty) if ty.base == "int" => Some(Len::N(11)),
                        Some(ty) if ty.base == "bigint" => Some(Len::N(20)),
                        Some(ty) if ty.base == "smallint" => Some(Len::N(6)),
                        Some(ty) if ty.base == "tinyint" => Some(Len::N(3)),
                        _ => max_len_of(code, a, b, vars, schema),
                    }
                } else {
                    max_len_of(code, a, b, vars, schema)
                };
                match piece? {
                    Len::N(n) => total += n,
                    Len::Max => return Some(Len::Max),
                }
            }
            return Some(Len::N(total));
        }
    }
    None
}

fn truncations(src: &str, code: &[&Token<'_>], schema: &Schema, sink: &mut Sink<'_>) {
    let vars = variables(code);
    for i in 0..code.len() {
        let t = code[i];
        // isnull(a, b): the result has a's type and length.
        if t.is("isnull") && code.get(i + 1).is_some_and(|n| n.is_punct(b'(')) {
            let args = arguments(code, i + 1);
            if let [(a0, a1), (b0, b1)] = args[..] {
                let target_is_declared = a1 == a0 + 1
                    && matches!(code[a0].kind, Kind::Word | Kind::Ident)
                    || a1 == a0 + 3 && code[a0 + 1].is_punct(b'.');
                if target_is_declared
                    && let (Some(Len::N(a)), Some(b)) = (
                        max_len_of(code, a0, a1, &vars, schema),
                        max_len_of(code, b0, b1, &vars, schema),
                    )
                    && b > Len::N(a)
                {
                    sink.push(
                        t.line,
                        Rule::Truncation,
                        format!(
                            "`{}`: isnull takes the type and length of its first argument \
                             ({a}), and the second can be {b} long, so it is silently cut to \
                             {a}. Use coalesce (highest-precedence type), or convert the first \
                             argument to a type long enough (ARCHITECTURE.md).",
                            text(src, code, i, a1.max(b1) + 1)
                        ),
                    );
                }
            }
        }
        // declare @v type(n) = <value longer than n>
        if t.is("declare") {
            let mut j = i + 1;
            while let Some(v) = code.get(j).filter(|v| v.text.starts_with('@')) {
                let Some((ty, after)) = declared_type(code, j) else {
                    break;
                };
                let end = right_span(code, after + 1);
                if code.get(after).is_some_and(|n| n.is_punct(b'='))
                    && let (Some(Len::N(n)), Some(value)) = (
                        ty.max_len(),
                        max_len_of(code, after + 1, end, &vars, schema),
                    )
                    && value > Len::N(n)
                {
                    sink.push(
                        v.line,
                        Rule::Truncation,
                        format!(
                            "`{}` is declared {} but its initial value can be {value} long: \
                             SQL Server cuts it to {n} without an error. Declare it long \
                             enough (ARCHITECTURE.md).",
                            v.text,
                            ty.describe()
                        ),
                    );
                }
                if code.get(end).is_some_and(|n| n.is_punct(b',')) {
                    j = end + 1;
                } else {
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Per-module rules: R13, R15, R16, R17, R18
// ---------------------------------------------------------------------------------------

fn implicit_transactions(code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    let Some(first) = (module.name_end..code.len()).find(|&i| is_begin_transaction(code, i)) else {
        return;
    };
    let off_before = (module.name_end..first).any(|i| {
        parse_set(code, i).is_some_and(|(options, on, _)| {
            !on && options.iter().any(|o| o == "implicit_transactions")
        })
    });
    if !off_before {
        sink.push(
            code[first].line,
            Rule::ImplicitTransactions,
            format!(
                "the {} `{}` opens its own transaction here without `set \
                 implicit_transactions off;` before it. A caller with IMPLICIT_TRANSACTIONS \
                 ON (JDBC with autoCommit off, pyodbc's default) has @@trancount 0 on entry, \
                 so this BEGIN opens two levels and the COMMIT leaves one open with every \
                 lock held. Add `set implicit_transactions off;` after `set nocount, \
                 xact_abort on;` (ARCHITECTURE.md).",
                module.kind.name(),
                module.name_text
            ),
        );
    }
}

fn cursor_parameters(code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    if module.kind != ModuleKind::Procedure {
        return;
    }
    let end = body_as(code, module).unwrap_or(code.len());
    for i in module.name_end..end {
        let t = code[i];
        if !t.is("@cursor") {
            continue;
        }
        let Some((ty, after)) = declared_type(code, i) else {
            continue;
        };
        let mut k = after;
        let mut output = false;
        while k < end && !code[k].is_punct(b',') {
            output |= code[k].is_any(&["output", "out"]);
            k += 1;
        }
        if ty.base == "binary" && !output {
            sink.push(
                t.line,
                Rule::CursorParameter,
                format!(
                    "`{} {}` silently pads a shorter cursor with zeros and cuts a longer one, \
                     so a 15-byte cursor re-reads a row instead of being refused. Declare it \
                     `varbinary(17)` (or wider) and refuse `datalength(@cursor) <> 16` with a \
                     clear error (ARCHITECTURE.md).",
                    t.text,
                    ty.describe()
                ),
            );
        }
    }
}

/// The comment with which a view accepts R16, giving its reason after the colon: a
/// dashboard view that must never wait for writers, whose 650 under SNAPSHOT/SERIALIZABLE is
/// documented where the view is (docs/sql-server.md, "Status views").
pub const ACCEPT_VIEW_READPAST: &str = "-- lint: R16 accepted:";

fn view_readpast(src: &str, code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    if module.kind != ModuleKind::View {
        return;
    }
    let accepted = src.lines().any(|line| {
        line.trim_start()
            .strip_prefix(ACCEPT_VIEW_READPAST)
            .is_some_and(|reason| !reason.trim().is_empty())
    });
    if accepted {
        return;
    }
    for t in code
        .iter()
        .skip(module.name_end)
        .filter(|t| t.is("readpast"))
    {
        sink.push(
            t.line,
            Rule::ViewReadpast,
            format!(
                "READPAST in the view `{}`: a view cannot set its isolation level, so a caller \
                 in a SNAPSHOT or SERIALIZABLE transaction gets error 650 from it. Read \
                 without READPAST, or move the query into a procedure that sets `read \
                 committed` first (ARCHITECTURE.md).",
                module.name_text
            ),
        );
    }
}

fn session_context(code: &[&Token<'_>], sink: &mut Sink<'_>) {
    for i in 0..code.len() {
        if !(code[i].is("session_context") && code.get(i + 1).is_some_and(|n| n.is_punct(b'('))) {
            continue;
        }
        let close = close_paren(code, i + 1).unwrap_or(code.len() - 1);
        // cast(session_context(…) as T)
        let cast = i >= 2
            && code[i - 1].is_punct(b'(')
            && code[i - 2].is_any(&["cast", "try_cast"])
            && code.get(close + 1).is_some_and(|t| t.is("as"));
        // convert(T, session_context(…)): the `(` of convert, then a type, then `,`.
        let convert = i >= 1 && code[i - 1].is_punct(b',') && {
            let mut k = i - 1;
            let mut depth = 0;
            let mut opened = None;
            while k > 0 {
                k -= 1;
                if code[k].is_punct(b')') {
                    depth += 1;
                } else if code[k].is_punct(b'(') {
                    if depth == 0 {
                        opened = Some(k);
                        break;
                    }
                    depth -= 1;
                }
            }
            opened.is_some_and(|o| {
                o > 0
                    && code[o - 1].is_any(&["convert", "try_convert"])
                    && parse_type(code, o + 1).is_some_and(|(_, after)| after == i - 1)
            })
        };
        if !(cast || convert) {
            sink.push(
                code[i].line,
                Rule::SessionContext,
                "session_context(…) returns sql_variant, which compares by type family \
                 first and does no arithmetic: convert it to its exact type where it is read, \
                 `convert(varbinary(24), session_context(N'…'))` (ARCHITECTURE.md).",
            );
        }
    }
}

const SIDE_EFFECTS: &[&str] = &["newid", "newsequentialid", "rand", "crypt_gen_random"];
const NOT_IN_FUNCTIONS: &[&str] = &["exec", "execute", "throw", "raiserror", "print"];

fn function_side_effects(code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    if module.kind != ModuleKind::Function {
        return;
    }
    for (i, t) in code.iter().enumerate().skip(module.name_end) {
        let call = t.is_any(SIDE_EFFECTS) && code.get(i + 1).is_some_and(|n| n.is_punct(b'('));
        if call || t.is_any(NOT_IN_FUNCTIONS) {
            sink.push(
                t.line,
                Rule::FunctionSideEffects,
                format!(
                    "`{}` in the function `{}`: SQL Server refuses side-effecting built-ins \
                     (newid, rand, crypt_gen_random) and EXEC/THROW/RAISERROR/PRINT inside a \
                     function (Msg 443). Pass the value in as a parameter, or fail with a \
                     deliberate conversion error (ARCHITECTURE.md).",
                    t.text, module.name_text
                ),
            );
        }
    }
}

/// R11–R19 over one file's code tokens.
pub fn lint(
    src: &str,
    code: &[&Token<'_>],
    module: Option<&Module>,
    schema: &Schema,
    sink: &mut Sink<'_>,
) {
    int_literals(code, sink);
    bitwise_operands(src, code, sink);
    collation_mixes(src, code, schema, sink);
    truncations(src, code, schema, sink);
    session_context(code, sink);
    if let Some(module) = module {
        if module.kind == ModuleKind::Procedure {
            implicit_transactions(code, module, sink);
        }
        cursor_parameters(code, module, sink);
        view_readpast(src, code, module, sink);
        function_side_effects(code, module, sink);
    }
}

/// The type declared after the name at `name` (`@v int`, `@v as int`) and the index after it.
fn declared_type(code: &[&Token<'_>], name: usize) -> Option<(SqlType, usize)> {
    let at = if code.get(name + 1).is_some_and(|n| n.is("as")) {
        name + 2
    } else {
        name + 1
    };
    parse_type(code, at)
}
