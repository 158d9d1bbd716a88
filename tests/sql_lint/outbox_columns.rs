//! R25 `outbox-columns`: every column of a claim outbox table, which the code generated for
//! an outbox may name, reaches an outbox set up before the column existed.
//!
//! The template outbox's procedures name its columns, and an outbox's code is regenerated
//! from them by `upgrade_outbox` (alone, or for every outbox through `upgrade_all_feeds`).
//! A column the table lacks fails that regeneration (Msg 207), which under XACT_ABORT rolls
//! back the migration running it. So each column that `create_outbox_storage` writes in its
//! `create table` must be, in the newest definitions:
//! * either required of an existing table (its `required` list: refused with 51306 when
//!   missing, reported by `outbox_problem` for the owner to repair),
//! * or added to an existing table (`col_length(@table, N'<column>') is null`, then `alter
//!   table … add`): then `outbox_problem` must not report its absence (a `t.name <>
//!   N'<column>'` exemption), and `upgrade_outbox` must call `create_outbox_storage`, so that
//!   an outbox that the migration adding the column skipped (broken at the time, repaired
//!   since) gets the column when it is upgraded (issue 29 item 6: it did not, and failed with
//!   Msg 207 on `claim_expires_at`).
//!
//! The texts are read as the bundle writes them: the `create table` as string pieces, one
//! piece starting each column's definition with its name (a piece that starts with a space
//! continues the previous one), up to the `constraint` piece.

use crate::lex::{Kind, Token, lex};
use crate::{Current, Rule, Violation};

/// The modules the rule reads, by the last part of their name.
const STORAGE: &str = "create_outbox_storage";
const PROBLEM: &str = "outbox_problem";
const UPGRADE: &str = "upgrade_outbox";

/// What `create_outbox_storage` says about the columns: (name, line) of each.
#[derive(Debug, Default)]
struct StorageColumns {
    created: Vec<(String, usize)>,
    required: Vec<String>,
    added: Vec<(String, usize)>,
}

fn storage_columns(code: &[&Token<'_>]) -> StorageColumns {
    let mut out = StorageColumns::default();
    // The create table pieces.
    if let Some(start) = code.iter().position(|t| {
        t.kind == Kind::Str && t.string_value().trim_start().starts_with("create table")
    }) {
        for t in code[start + 1..].iter().filter(|t| t.kind == Kind::Str) {
            let value = t.string_value();
            if value.trim_start().starts_with("constraint") {
                break;
            }
            if value.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                let name: String = value
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.created.push((name, t.line));
            }
        }
    }
    // `values (N'id'), … ) as required (name)`.
    for (i, t) in code.iter().enumerate() {
        if !t.is("values") {
            continue;
        }
        let Some(end) = (i..code.len().saturating_sub(1))
            .find(|&j| code[j].is("as") && code[j + 1].is("required"))
        else {
            continue;
        };
        out.required.extend(
            code[i..end]
                .iter()
                .filter(|t| t.kind == Kind::Str)
                .map(|t| t.string_value()),
        );
    }
    // `col_length(@table, N'<column>') is null`.
    for w in code.windows(8) {
        if w[0].is("col_length")
            && w[1].is_punct(b'(')
            && w[3].is_punct(b',')
            && w[4].kind == Kind::Str
            && w[5].is_punct(b')')
            && w[6].is("is")
            && w[7].is("null")
        {
            out.added.push((w[4].string_value(), w[4].line));
        }
    }
    out
}

/// The columns `outbox_problem` leaves to the upgrade: `name <> N'<column>'`.
fn exempted(code: &[&Token<'_>]) -> Vec<String> {
    code.windows(4)
        .filter(|w| {
            w[0].is("name") && w[1].is_punct(b'<') && w[2].is_punct(b'>') && w[3].kind == Kind::Str
        })
        .map(|w| w[3].string_value())
        .collect()
}

/// Whether the code runs `exec changefeed.create_outbox_storage`.
fn calls_storage(code: &[&Token<'_>]) -> bool {
    code.windows(4).any(|w| {
        w[0].is_any(&["exec", "execute"])
            && w[1].ident_value().eq_ignore_ascii_case("changefeed")
            && w[2].is_punct(b'.')
            && w[3].ident_value().eq_ignore_ascii_case(STORAGE)
    })
}

/// R25 over the newest definitions of the three modules.
pub fn lint(current: &[Current<'_>]) -> Vec<Violation> {
    let find = |wanted: &str| {
        current.iter().find(|c| {
            c.module
                .as_ref()
                .and_then(|m| m.name_parts.last())
                .is_some_and(|n| n.eq_ignore_ascii_case(wanted))
        })
    };
    let mut out = Vec::new();
    let violation = |file: &str, line: usize, message: String| Violation {
        file: format!("sql/{file}"),
        line,
        rule: Rule::OutboxColumns,
        message,
    };
    let (Some(storage), Some(problem), Some(upgrade)) =
        (find(STORAGE), find(PROBLEM), find(UPGRADE))
    else {
        out.push(violation(
            "",
            0,
            format!(
                "the bundle must define {STORAGE}, {PROBLEM} and {UPGRADE}, which this rule \
                 reads (tests/sql_lint/outbox_columns.rs): update the rule with them"
            ),
        ));
        return out;
    };
    let storage_lexed = lex(storage.text);
    let columns = storage_columns(&storage_lexed.code());
    let problem_lexed = lex(problem.text);
    let exempt = exempted(&problem_lexed.code());
    let upgrade_lexed = lex(upgrade.text);
    let upgrade_adds = calls_storage(&upgrade_lexed.code());

    if columns.created.is_empty() {
        out.push(violation(
            storage.name,
            0,
            format!("no column found in {STORAGE}'s `create table` pieces: update the rule"),
        ));
    }
    for (name, line) in &columns.created {
        let required = columns
            .required
            .iter()
            .any(|r| r.eq_ignore_ascii_case(name));
        let added = columns
            .added
            .iter()
            .any(|(a, _)| a.eq_ignore_ascii_case(name));
        if !required && !added {
            out.push(violation(
                storage.name,
                *line,
                format!(
                    "the outbox column `{name}` is neither required of an existing table (the \
                     `required` list) nor added to one (`col_length(@table, N'{name}') is \
                     null`, then `alter table … add`): an outbox set up before it keeps a \
                     table without it, and its regenerated code fails (Msg 207). Add it \
                     (nullable or with a default) or require it."
                ),
            ));
        }
    }
    for (name, line) in &columns.added {
        if !exempt.iter().any(|e| e.eq_ignore_ascii_case(name)) {
            out.push(violation(
                problem.name,
                0,
                format!(
                    "{STORAGE} adds `{name}` to an existing table (line {line}), but {PROBLEM} \
                     reports an outbox without it as broken, so the upgrade skips the outbox \
                     instead of adding it: exempt it (`t.name <> N'{name}'`)."
                ),
            ));
        }
        if !upgrade_adds {
            out.push(violation(
                upgrade.name,
                0,
                format!(
                    "{STORAGE} adds `{name}` to an existing table (line {line}), but {UPGRADE} \
                     never calls it: an outbox that the migration adding `{name}` skipped as \
                     broken, repaired since, gets code naming the column and fails (Msg 207). \
                     Call {STORAGE} when the table lacks a column of the template outbox."
                ),
            ));
        }
    }
    for name in &exempt {
        if !columns
            .added
            .iter()
            .any(|(a, _)| a.eq_ignore_ascii_case(name))
        {
            out.push(violation(
                problem.name,
                0,
                format!(
                    "{PROBLEM} leaves `{name}` to the upgrade, but {STORAGE} does not add it to \
                     an existing table: {UPGRADE} would generate code naming a column the \
                     table lacks (Msg 207). Add it in {STORAGE} or stop exempting it."
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{current_files, read_bundle};

    /// This rule over the bundle with `edit` applied to the newest definition of `module`.
    fn lint_edited(module: &str, edit: impl Fn(&str) -> String) -> Vec<Violation> {
        crate::lint_with_edit(module, edit, lint)
    }

    #[track_caller]
    fn assert_fires_saying(violations: &[Violation], words: &str) {
        crate::assert_rule_says(violations, Rule::OutboxColumns, words);
    }

    #[test]
    fn the_bundle_reads_as_expected() {
        let (files, _) = read_bundle();
        let current = current_files(&files);
        assert!(lint(&current).is_empty(), "{:?}", lint(&current));
        let storage = current
            .iter()
            .find(|c| {
                c.module
                    .as_ref()
                    .is_some_and(|m| m.name_parts.last().is_some_and(|n| n == STORAGE))
            })
            .expect("create_outbox_storage");
        let columns = storage_columns(&lex(storage.text).code());
        let created: Vec<&str> = columns.created.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(created.len(), 18, "{created:?}");
        assert!(created.contains(&"payload") && created.contains(&"claim_expires_at"));
        assert_eq!(
            columns
                .added
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            ["claim_expires_at"]
        );
        assert_eq!(columns.required.len(), 17, "{:?}", columns.required);
    }

    /// The defect of issue 29 item 6 (a): upgrade_outbox regenerated an outbox without the
    /// column the migration skipped it for.
    #[test]
    fn an_upgrade_that_does_not_add_the_column_fires() {
        let violations = lint_edited(UPGRADE, |text| {
            text.replace(
                "exec changefeed.create_outbox_storage",
                "exec changefeed.nothing",
            )
        });
        assert_fires_saying(&violations, "never calls it");
    }

    #[test]
    fn a_problem_check_that_reports_the_added_column_fires() {
        let violations = lint_edited(PROBLEM, |text| {
            text.replace("t.name <> N'claim_expires_at'", "t.name <> N''")
        });
        assert_fires_saying(&violations, "reports an outbox without it as broken");
    }

    #[test]
    fn a_new_column_neither_required_nor_added_fires() {
        let violations = lint_edited(STORAGE, |text| {
            text.replacen(
                "+ N'last_error nvarchar(2000) null, '",
                "+ N'last_error nvarchar(2000) null, '\n                + N'tenant int null, '",
                1,
            )
        });
        assert_fires_saying(&violations, "the outbox column `tenant`");
    }
}
