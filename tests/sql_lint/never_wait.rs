//! R23 `never-wait-guard`: a read of an outbox or event table in a procedure that must never
//! wait for another transaction has a guard that keeps it off rows it does not own.
//!
//! Which procedures (`NEVER_WAIT`), and why each must not wait:
//! * the claim outbox's `claim`, `mark_done`, `mark_failed` and `requeue`: one business
//!   transaction left open around an uncommitted `enqueue` must delay only its own aggregate
//!   (ARCHITECTURE.md, "The claim protocol"); a claim or an acknowledgement that waits for
//!   it stalls every aggregate, its relay's claims expire and messages are published again;
//! * the outbox-mode `read_feed`: a slow or abandoned writer must never stall its shard, so
//!   its reads of the feed's outbox and of the event table skip or seek past writers' rows.
//!
//! Which statements: every reference, in the newest definition of those procedures (the one
//! that runs; a replaced definition is not checked), to the tables a writer holds rows of
//! while its transaction is open: the template outbox `[changefeed].[__template_outbox__]`
//! in the claim outbox's procedures; the feed's outbox `[changefeed].[outbox:…]` and the
//! event table `[changefeed].[__template__]` in `read_feed`. The same check runs over the
//! text the generator writes for sample tables (`generated.rs`), with their names.
//! Not in scope: an `insert into` one of those tables (an insert reads no existing row);
//! the feed table itself (a reader at the head waits for a mover's commit by design, and
//! movers are serialized by the shard's applock); procedures that may wait by design
//! (`enqueue` waits for its aggregate's lock; `purge_done`, `held_aggregates`, `backlog`,
//! the serialized `read_feed`, which waits for the shard's applock).
//!
//! What is a guard (which rows a guarded read touches, and why no other transaction can hold
//! them, is the statement's argument: the procedures state it beside the statement; the
//! lint checks that the guard is there):
//! * `READPAST` on the reference: rows another transaction holds are skipped, never waited
//!   for;
//! * `READUNCOMMITTED` / `NOLOCK` on the reference: no row locks are taken (not on the
//!   target of an UPDATE or DELETE, where SQL Server ignores them);
//! * `FORCESEEK` on the reference: the access is a seek, so it reads only the rows its seek
//!   predicate names;
//! * for the target of a DELETE or UPDATE, where SQL Server refused FORCESEEK (Msg 10725),
//!   the plan's shape instead, either
//!   - driven: the statement's first table source is a row source of its own (a table
//!     variable, `openjson(…)`, a `(values …)` row) and it ends with `OPTION (FORCE ORDER,
//!     LOOP JOIN)`, so that source drives nested loops into the table, one seek per row
//!     (`read_feed`'s delete of moved rows, the claim's update, `mark_done`); or
//!   - by key: the reference is the statement's only table source, carries `INDEX(1)` (the
//!     clustered index, the outbox's `id`), and its `WHERE` has a top-level conjunct
//!     `<alias>.id = @variable`, an equality on that index's whole key: a single-row seek
//!     (`mark_failed`, `requeue`).

use crate::lex::{Kind, Token};
use crate::typed::close_paren;

const OUTBOX: &[(&str, &str)] = &[("changefeed", "__template_outbox__")];
const FEED_OUTBOX_AND_EVENTS: &[(&str, &str)] = &[
    ("changefeed", "outbox:changefeed.__template__"),
    ("changefeed", "__template__"),
];

/// The procedures that must never wait (by the last part of their name, lowercase), with
/// the tables (schema, name) whose references in them need a guard.
pub const NEVER_WAIT: &[(&str, &[(&str, &str)])] = &[
    ("claim:changefeed.__template_outbox__", OUTBOX),
    ("mark_done:changefeed.__template_outbox__", OUTBOX),
    ("mark_failed:changefeed.__template_outbox__", OUTBOX),
    ("requeue:changefeed.__template_outbox__", OUTBOX),
    ("read_feed:changefeed.__template__", FEED_OUTBOX_AND_EVENTS),
];

/// The tables whose reads need a guard in the module named `module` (last name part), if
/// it must never wait.
pub fn guarded_tables(module: &str) -> Option<&'static [(&'static str, &'static str)]> {
    NEVER_WAIT
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(module))
        .map(|(_, tables)| *tables)
}

/// Words after a table name that are not an alias.
const NOT_AN_ALIAS: &[&str] = &[
    "with",
    "where",
    "set",
    "inner",
    "left",
    "right",
    "full",
    "cross",
    "outer",
    "join",
    "on",
    "order",
    "group",
    "option",
    "union",
    "except",
    "intersect",
    "output",
    "select",
    "from",
    "having",
    "when",
    "then",
    "else",
    "end",
    "values",
];

/// `schema.name` (bracketed or not, any case) starts at `i`, as a whole two-part name.
fn names_table(code: &[&Token<'_>], i: usize, (schema, name): (&str, &str)) -> bool {
    let part = |t: Option<&&Token<'_>>, want: &str| {
        t.is_some_and(|t| {
            matches!(t.kind, Kind::Word | Kind::Ident) && t.ident_value().eq_ignore_ascii_case(want)
        })
    };
    part(code.get(i), schema)
        && code.get(i + 1).is_some_and(|t| t.is_punct(b'.'))
        && part(code.get(i + 2), name)
        && !(i > 0 && code[i - 1].is_punct(b'.'))
        && !code.get(i + 3).is_some_and(|t| t.is_punct(b'.'))
}

/// The tokens of the statement around `i`: from after the previous `;` to the next one.
fn statement_around(code: &[&Token<'_>], i: usize) -> (usize, usize) {
    let start = code[..i]
        .iter()
        .rposition(|t| t.is_punct(b';'))
        .map_or(0, |p| p + 1);
    let end = code[i..]
        .iter()
        .position(|t| t.is_punct(b';'))
        .map_or(code.len(), |p| i + p);
    (start, end)
}

/// Whether the reference at `i` (alias `alias`) is the target of the UPDATE or DELETE the
/// statement from `start` begins with: `update <it or its alias>`, `delete [from] <…>`.
fn is_dml_target(code: &[&Token<'_>], start: usize, i: usize, alias: Option<&str>) -> bool {
    let mut depth = 0i32;
    for k in start..i {
        let t = code[k];
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is_any(&["update", "delete"]) {
            let mut target = k + 1;
            if code.get(target).is_some_and(|t| t.is("top")) {
                target = code
                    .get(target + 1)
                    .filter(|t| t.is_punct(b'('))
                    .and_then(|_| close_paren(code, target + 1))
                    .map_or(target + 1, |close| close + 1);
            }
            if t.is("delete") && code.get(target).is_some_and(|t| t.is("from")) {
                target += 1;
            }
            if target == i {
                return true;
            }
            return match (code.get(target), alias) {
                (Some(name), Some(alias)) => {
                    code.get(target + 1).is_none_or(|t| !t.is_punct(b'.'))
                        && name.ident_value().eq_ignore_ascii_case(alias)
                }
                _ => false,
            };
        }
    }
    false
}

/// `OPTION (… FORCE ORDER … LOOP JOIN …)` ends the statement `code[start..end]`, and its
/// first table source (after its first `FROM` outside parentheses) is a row source of its
/// own: a table variable, `openjson(…)` or `(values …)`.
fn driven_by_row_source(code: &[&Token<'_>], start: usize, end: usize) -> bool {
    let statement = &code[start..end];
    let forced = statement.iter().enumerate().any(|(k, t)| {
        t.is("option")
            && statement.get(k + 1).is_some_and(|p| p.is_punct(b'('))
            && close_paren(statement, k + 1).is_some_and(|close| {
                let hints = &statement[k + 2..close];
                let has = |a: &str, b: &str| hints.windows(2).any(|w| w[0].is(a) && w[1].is(b));
                has("force", "order") && has("loop", "join")
            })
    });
    let mut depth = 0i32;
    let first_source = statement.iter().enumerate().find_map(|(k, t)| {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is("from") {
            return Some(k + 1);
        }
        None
    });
    let row_source = first_source.is_some_and(|k| {
        let next = statement.get(k + 1);
        statement.get(k).is_some_and(|t| {
            is_variable(t)
                || (t.is("openjson") && next.is_some_and(|n| n.is_punct(b'(')))
                || (t.is_punct(b'(') && next.is_some_and(|n| n.is("values")))
        })
    });
    forced && row_source
}

/// A local variable (`@x`, not a `@@function`).
fn is_variable(t: &Token<'_>) -> bool {
    t.kind == Kind::Word && t.text.starts_with('@') && !t.text.starts_with("@@")
}

/// The indexes of `statement[from..]` outside parentheses opened after `from`.
fn top_level(statement: &[&Token<'_>], from: usize) -> Vec<usize> {
    let mut depth = 0i32;
    let mut out = Vec::new();
    for (k, t) in statement.iter().enumerate().skip(from) {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 {
            out.push(k);
        }
    }
    out
}

/// The reference at `code[i]` (its hints `hints`, alias `alias`) is the only table source of
/// the statement `code[start..end]`, carries `INDEX(1)`, and the statement's `WHERE` has a
/// top-level conjunct `<alias>.id = @variable` (either way round).
fn single_row_by_key(
    code: &[&Token<'_>],
    (start, end): (usize, usize),
    i: usize,
    hints: &[&Token<'_>],
    alias: Option<&str>,
) -> bool {
    let clustered = hints.windows(4).any(|w| {
        w[0].is("index") && w[1].is_punct(b'(') && w[2].text == "1" && w[3].is_punct(b')')
    });
    let statement = &code[start..end];
    let outside = top_level(statement, 0);
    let Some(&where_at) = outside
        .iter()
        .find(|&&k| k > i - start && statement[k].is("where"))
    else {
        return false;
    };
    // Nothing joined to it and no second source after a comma, between FROM and WHERE.
    let from_at = outside
        .iter()
        .copied()
        .rfind(|&k| k < i - start && statement[k].is("from"));
    let alone = from_at.is_some_and(|from_at| {
        !outside.iter().any(|&k| {
            k > from_at
                && k < where_at
                && (statement[k].is_any(&["join", "apply"]) || statement[k].is_punct(b','))
        })
    });
    let name = alias.unwrap_or("id");
    let conditions: Vec<usize> = top_level(statement, where_at + 1);
    let keyed = conditions
        .split(|&k| statement[k].is("and"))
        .any(|conjunct| {
            let words: Vec<&Token<'_>> = conjunct.iter().map(|&k| statement[k]).collect();
            let column = |w: &[&Token<'_>]| {
                w[0].ident_value().eq_ignore_ascii_case(name)
                    && w[1].is_punct(b'.')
                    && w[2].ident_value().eq_ignore_ascii_case("id")
            };
            words.len() == 5
                && ((column(&words[..3]) && words[3].is_punct(b'=') && is_variable(words[4]))
                    || (is_variable(words[0]) && words[1].is_punct(b'=') && column(&words[2..])))
        });
    clustered && alone && keyed
}

/// Every reference to one of `tables` in `code` that lacks a guard (see the module's
/// documentation): its line and the table as written.
pub fn unguarded_reads(code: &[&Token<'_>], tables: &[(&str, &str)]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..code.len() {
        let Some(&table) = tables.iter().find(|&&table| names_table(code, i, table)) else {
            continue;
        };
        let inserted_into = i >= 1
            && (code[i - 1].is("insert")
                || (code[i - 1].is("into") && i >= 2 && code[i - 2].is("insert")));
        if inserted_into {
            continue;
        }
        let mut j = i + 3;
        let mut alias = None;
        if code.get(j).is_some_and(|t| t.is("as")) {
            alias = code.get(j + 1).map(|t| t.ident_value());
            j += 2;
        } else if let Some(t) = code.get(j)
            && matches!(t.kind, Kind::Word | Kind::Ident)
            && !t.text.starts_with('@')
            && !t.is_any(NOT_AN_ALIAS)
        {
            alias = Some(t.ident_value());
            j += 1;
        }
        let hints: &[&Token<'_>] = if code.get(j).is_some_and(|t| t.is("with"))
            && code.get(j + 1).is_some_and(|t| t.is_punct(b'('))
            && let Some(close) = close_paren(code, j + 1)
        {
            &code[j + 2..close]
        } else {
            &[]
        };
        let hinted = |word: &str| hints.iter().any(|h| h.is(word));
        let (start, end) = statement_around(code, i);
        let target = is_dml_target(code, start, i, alias.as_deref());
        let guarded = hinted("readpast")
            || hinted("forceseek")
            || (!target && (hinted("readuncommitted") || hinted("nolock")))
            || (target
                && (driven_by_row_source(code, start, end)
                    || single_row_by_key(code, (start, end), i, hints, alias.as_deref())));
        if !guarded {
            out.push((code[i].line, format!("{}.{}", table.0, table.1)));
        }
    }
    out
}

/// The violation message for an unguarded reference to `table` in `module`.
pub fn message(module: &str, table: &str) -> String {
    format!(
        "a read of {table} without a guard in {module}, which must never wait for another \
         transaction: in a scan, or a merge or hash join, the optimizer's choice on a small \
         table, it reads every row and waits for any open transaction holding one (an \
         uncommitted enqueue or write), stalling every aggregate or shard (issue 29). Give the \
         reference WITH (READPAST) to skip held rows, READUNCOMMITTED to take no locks (not \
         on an UPDATE/DELETE target), or FORCESEEK so it reads only the rows it names; on an \
         UPDATE/DELETE target, drive it from a table variable, openjson or (values ...) with \
         OPTION (FORCE ORDER, LOOP JOIN), or read one row by key: WITH (INDEX(1)) and `where \
         <alias>.id = @variable`. State beside the statement why no one else can hold the \
         rows it reads (tests/sql_lint/never_wait.rs)."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::lex;

    fn unguarded(src: &str) -> Vec<usize> {
        let lexed = lex(src);
        unguarded_reads(&lexed.code(), OUTBOX)
            .into_iter()
            .map(|(line, _)| line)
            .collect()
    }

    #[test]
    fn an_update_driven_by_its_candidates_passes_and_one_left_to_the_optimizer_fires() {
        let unpinned = "update t\nset status = 1\nfrom [changefeed].[__template_outbox__] as t with (rowlock)\n\
                        inner join @candidates as c on t.id = c.id\noption (maxdop 1);";
        assert_eq!(unguarded(unpinned), [3]);
        let driven = "update t\nset status = 1\nfrom @candidates as c\n\
                      inner join [changefeed].[__template_outbox__] as t with (rowlock, index(1))\n\
                      on t.id = c.id\noption (force order, loop join, maxdop 1);";
        assert!(unguarded(driven).is_empty());
        assert_eq!(
            unguarded(&driven.replace("force order, ", "")),
            [4],
            "without FORCE ORDER the optimizer may put the outbox first"
        );
        let ids = "update t set status = 2\nfrom openjson(@ids) with (id bigint '$') as j\n\
                   inner join [changefeed].[__template_outbox__] as t with (index(1))\n\
                   on t.id = j.id where t.status = 1 option (force order, loop join);";
        assert!(unguarded(ids).is_empty());
        let one_row = "update t set status = 2\nfrom (values (@id)) as k (id)\n\
                       inner join [changefeed].[__template_outbox__] as t on t.id = k.id\n\
                       option (force order, loop join);";
        assert!(unguarded(one_row).is_empty());
    }

    #[test]
    fn a_single_row_update_by_its_key_passes_only_on_the_clustered_index_alone() {
        let by_key = "update t set status = 3\nfrom [changefeed].[__template_outbox__] as t with (index(1))\n\
                      where t.id = @id and t.status = 1 and t.claim_token = @claim_token;";
        assert!(unguarded(by_key).is_empty());
        assert!(
            unguarded(&by_key.replace("t.id = @id", "@id = t.id")).is_empty(),
            "either way round"
        );
        assert_eq!(
            unguarded(&by_key.replace(" with (index(1))", "")),
            [2],
            "without INDEX(1) another index (status) may serve it"
        );
        assert_eq!(
            unguarded(&by_key.replace("t.id = @id and ", "")),
            [2],
            "no equality on the key"
        );
        assert_eq!(
            unguarded(&by_key.replace("t.id = @id and", "(t.id = @id or t.id = @other) and")),
            [2],
            "an equality inside an OR is no key"
        );
        assert_eq!(
            unguarded(&by_key.replace(
                "with (index(1))\n",
                "with (index(1)) inner join @c as c on c.id = t.id\n"
            )),
            [2],
            "a joined source can drive a scan"
        );
    }

    #[test]
    fn a_direct_update_target_fires_and_readuncommitted_does_not_guard_a_target() {
        assert_eq!(
            unguarded("update [changefeed].[__template_outbox__]\nset status = 3\nwhere id = @id;"),
            [1]
        );
        assert_eq!(
            unguarded(
                "update t set status = 2\nfrom changefeed.__template_outbox__ as t with (nolock)\n\
                 where t.status = 1;"
            ),
            [2],
            "NOLOCK is ignored on a DML target"
        );
        assert!(
            unguarded(
                "update t set status = 2 from [changefeed].[__template_outbox__] as t \
                 with (readpast) where t.status = 1;"
            )
            .is_empty()
        );
    }

    #[test]
    fn skipping_and_dirty_reads_guard_a_read() {
        assert!(
            unguarded(
                "insert into @c (id) select top (@n) t.id \
                 from [changefeed].[__template_outbox__] as t \
                 with (readcommittedlock, readpast, updlock, rowlock) \
                 where not exists (select d.id from [changefeed].[__template_outbox__] as d \
                 with (readuncommitted, index(head_of_aggregate)) where d.id < t.id);"
            )
            .is_empty()
        );
        assert_eq!(
            unguarded(
                "select @n = count(*)\nfrom [changefeed].[__template_outbox__] with (readcommittedlock);"
            ),
            [2]
        );
    }

    #[test]
    fn a_delete_driven_by_a_table_variable_with_forced_loops_passes() {
        let src = "delete o\nfrom @moved as m\n\
                   inner join [changefeed].[__template_outbox__] as o with (rowlock)\n\
                   on o.id = m.id\noption (force order, loop join);";
        assert!(unguarded(src).is_empty());
        let unforced = src.replace("force order, ", "");
        assert_eq!(unguarded(&unforced), [3]);
        let from_the_table = "delete o\nfrom [changefeed].[__template_outbox__] as o with (rowlock)\n\
                              inner join @moved as m on o.id = m.id\n\
                              option (force order, loop join);";
        assert_eq!(unguarded(from_the_table), [2]);
        // Only a DML target may lean on the plan's shape: a plain read needs its own hint.
        let read = "select o.id\nfrom @moved as m\n\
                    inner join [changefeed].[__template_outbox__] as o on o.id = m.id\n\
                    option (force order, loop join);";
        assert_eq!(unguarded(read), [3]);
    }

    #[test]
    fn inserts_other_tables_and_names_in_strings_or_three_parts_are_not_reads() {
        assert!(
            unguarded(
                "insert into [changefeed].[__template_outbox__] (topic) values (N'x');\n\
                 select 1 from [changefeed].[outboxes];\n\
                 select object_id(N'[changefeed].[__template_outbox__]');\n\
                 select 1 from db.[changefeed].[__template_outbox__] with (readpast);"
            )
            .is_empty()
        );
    }

    #[test]
    fn the_scope_is_the_named_procedures() {
        assert!(guarded_tables("CLAIM:changefeed.__template_outbox__").is_some());
        assert!(guarded_tables("read_feed:changefeed.__template__").is_some());
        for may_wait in [
            "enqueue:changefeed.__template_outbox__",
            "purge_done:changefeed.__template_outbox__",
            "held_aggregates:changefeed.__template_outbox__",
            "backlog:changefeed.__template_outbox__",
            "read_feed:changefeed.__template_serialized__",
        ] {
            assert!(guarded_tables(may_wait).is_none(), "{may_wait}");
        }
    }
}
