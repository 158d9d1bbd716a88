//! R24 `reserved-name-collation`: a name compared with one of the column names changefeed
//! adds next to a feed's key (`shard_id`, `ulid`, `order_sequence`, `time_hint`) states the
//! collation of the comparison.
//!
//! Why: without `collate`, the comparison takes the collation of the name's column (the
//! database's, for `sys.columns.name`), and a case-sensitive database then lets a key column
//! `ULID` through, while tempdb, where read_feed copies the key and a caller's `#read` lives,
//! may ignore case and take `ULID` and `ulid` for one name (Msg 2705 on every read). The
//! collation is a decision (which spellings count as the reserved name), so the code says it.
//!
//! What counts: a string literal whose value is one of those names, compared by `=`, `<>`,
//! `!=` or as an item of `[not] in (…)`, with an operand that is a name: an identifier whose
//! last part ends in `name` (`c.name`, `column_name`), so that comparisons of other values
//! that happen to read `ulid` (`kind = N'ulid'`) are not names. A `collate` right after that
//! operand satisfies the rule.

use crate::lex::{Kind, Token};

/// The column names changefeed adds next to a key (`changefeed.key_columns`).
const RESERVED: [&str; 4] = ["shard_id", "ulid", "order_sequence", "time_hint"];

/// Each violation: its line and the compared name's text.
pub fn violations(code: &[&Token<'_>]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..code.len() {
        let literal = code[i];
        if literal.kind != Kind::Str
            || !RESERVED
                .iter()
                .any(|name| literal.string_value().eq_ignore_ascii_case(name))
        {
            continue;
        }
        let operand = operand_before(code, i).or_else(|| operand_after(code, i));
        if let Some((name, stated)) = operand
            && !stated
            && name.to_ascii_lowercase().ends_with("name")
        {
            out.push((literal.line, name));
        }
    }
    out
}

fn is_comparison(token: &Token<'_>) -> bool {
    token.is_punct(b'=') || token.is_punct(b'<') || token.is_punct(b'>') || token.is_punct(b'!')
}

/// The operand compared with the literal at `at` from its left (`x = N'ulid'`,
/// `x [not] in (N'a', N'ulid')`), and whether a `collate` follows it.
fn operand_before(code: &[&Token<'_>], at: usize) -> Option<(String, bool)> {
    let mut k = at.checked_sub(1)?;
    if is_comparison(code[k]) {
        while k > 0 && is_comparison(code[k]) {
            k -= 1;
        }
    } else {
        // Back through the list to its `(`, then `in` and an optional `not`.
        while k > 0 && (code[k].kind == Kind::Str || code[k].is_punct(b',')) {
            k -= 1;
        }
        if !(code[k].is_punct(b'(') && k > 0 && code[k - 1].is("in")) {
            return None;
        }
        k -= 1;
        if k > 0 && code[k - 1].is("not") {
            k -= 1;
        }
        k = k.checked_sub(1)?;
    }
    // `x collate Y`: the collation is stated; the name is the token before `collate`.
    if k >= 2 && code[k - 1].is("collate") {
        return Some((code[k - 2].ident_value(), true));
    }
    let token = code[k];
    matches!(token.kind, Kind::Word | Kind::Ident).then(|| (token.ident_value(), false))
}

/// The operand compared with the literal at `at` from its right (`N'ulid' = c.name`).
fn operand_after(code: &[&Token<'_>], at: usize) -> Option<(String, bool)> {
    let mut k = at + 1;
    if !code.get(k).is_some_and(|t| is_comparison(t)) {
        return None;
    }
    while code.get(k).is_some_and(|t| is_comparison(t)) {
        k += 1;
    }
    // A dotted name: its last part.
    let mut name = code
        .get(k)
        .filter(|t| matches!(t.kind, Kind::Word | Kind::Ident))?;
    while code.get(k + 1).is_some_and(|t| t.is_punct(b'.'))
        && let Some(next) = code
            .get(k + 2)
            .filter(|t| matches!(t.kind, Kind::Word | Kind::Ident))
    {
        name = next;
        k += 2;
    }
    let stated = code.get(k + 1).is_some_and(|t| t.is("collate"));
    Some((name.ident_value(), stated))
}
