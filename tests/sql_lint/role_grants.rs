//! R28 `role-grants`: who may call what is decided once per kind of per-table object, and
//! never by a grant wider than one table's roles.
//!
//! * Every kind of per-feed object (`feed_objects`: procedures, functions, table types and
//!   tables) and every kind of per-outbox procedure (`outbox_objects`) is either granted by
//!   the newest `grant_feed_roles` / `grant_outbox_roles` to one of its table's roles, or
//!   listed in [`GRANTED_TO_NO_ONE`] with the reason. A kind added to either list without a
//!   decision would otherwise be callable only by `db_owner`, or tempt an administrator into
//!   the schema-wide grant below; a listed kind that is granted, or that no longer exists,
//!   makes the list untrue and fires too.
//! * Nothing is granted (or denied) on a schema, in code or in dynamic SQL: EXECUTE on the
//!   schema `changefeed` reaches every feed's whole event rows, `purge_feed @force = 1`,
//!   `lock_feed` and every outbox's `enqueue` (issue 29 item 4).
//! * Only the objects in [`PUBLIC`], which check their caller themselves, are granted to
//!   `public`.
//!
//! The generators are read as the bundle writes them: `@<variable> = max(case when kind =
//! N'<kind>' then quoted_name end)` names a kind's object, and a string piece ending in
//! `grant <permission> on object::` (or `type::`) followed by `+ @<variable>` grants it.

use std::collections::{BTreeMap, BTreeSet};

use crate::lex::{Kind, Token, lex};
use crate::{Current, Rule, Violation};

/// (list function, kind, why no role of the table gets it).
pub const GRANTED_TO_NO_ONE: &[(&str, &str, &str)] = &[
    (
        "feed_objects",
        "purge_feed",
        "retention, with @force past every consumer, is the administrator's",
    ),
    (
        "feed_objects",
        "status",
        "a dashboard view: feed_status unions it, for whom the administrator grants",
    ),
    (
        "feed_objects",
        "feed",
        "readers reach it through read_feed only",
    ),
    (
        "feed_objects",
        "state",
        "the allocator's state, written by read_feed and lock_feed",
    ),
    (
        "outbox_objects",
        "purge_done",
        "deleting history is the operator's, like purge_feed",
    ),
    (
        "outbox_objects",
        "held_aggregates",
        "a lock diagnosis for the operator; it reads the whole table",
    ),
];

/// Objects (last name part) granted to `public`: each checks who calls it.
pub const PUBLIC: &[&str] = &["remove_consumer"];

/// The list functions and the generator that grants each one's kinds.
const GENERATORS: &[(&str, &str)] = &[
    ("feed_objects", "grant_feed_roles"),
    ("outbox_objects", "grant_outbox_roles"),
];

fn module_name(current: &Current<'_>) -> Option<String> {
    current
        .module
        .as_ref()
        .and_then(|m| m.name_parts.last())
        .map(|n| n.to_lowercase())
}

/// The kinds a list function's `values` rows name, with their line: `(N'<kind>', '<class>',
/// …)` rows of feed_objects (database roles, class R, are the grantees, not objects) and
/// `(N'<kind>')` rows of outbox_objects.
fn listed_kinds(code: &[&Token<'_>]) -> Vec<(String, usize)> {
    // The rows follow `values`; a string in parentheses before it (`quotename(N'…')`) is
    // not a kind.
    let start = code
        .iter()
        .position(|t| t.is("values"))
        .unwrap_or(code.len());
    let code = &code[start..];
    let mut out = Vec::new();
    for w in code.windows(3) {
        if !(w[0].is_punct(b'(') && w[1].kind == Kind::Str) {
            continue;
        }
        if w[2].is_punct(b')') || w[2].is_punct(b',') {
            out.push((w[1].string_value(), w[1].line));
        }
    }
    // Drop role rows: a kind whose next string is the class 'R'.
    let roles: BTreeSet<String> = code
        .windows(4)
        .filter(|w| {
            w[0].is_punct(b'(')
                && w[1].kind == Kind::Str
                && w[2].is_punct(b',')
                && w[3].kind == Kind::Str
                && w[3].string_value() == "R"
        })
        .map(|w| w[1].string_value())
        .collect();
    out.retain(|(kind, _)| !roles.contains(kind));
    out
}

/// The kinds a generator grants: its `@variable = max(case when kind = N'<kind>' …)`
/// assignments joined with its `…grant <permission> on object::' + @variable` pieces.
fn granted_kinds(code: &[&Token<'_>]) -> BTreeSet<String> {
    let mut kind_of: BTreeMap<String, String> = BTreeMap::new();
    for w in code.windows(10) {
        if w[0].kind == Kind::Word
            && w[0].text.starts_with('@')
            && w[1].is_punct(b'=')
            && w[2].is("max")
            && w[3].is_punct(b'(')
            && w[4].is("case")
            && w[5].is("when")
            && w[6].is("kind")
            && w[7].is_punct(b'=')
            && w[8].kind == Kind::Str
        {
            kind_of.insert(w[0].text.to_lowercase(), w[8].string_value());
        }
    }
    let mut out = BTreeSet::new();
    for w in code.windows(3) {
        let grants = w[0].kind == Kind::Str && {
            let piece = w[0].string_value().to_lowercase();
            let piece = piece.trim_end();
            piece.contains("grant ")
                && (piece.ends_with("on object::") || piece.ends_with("on type::"))
        };
        if grants
            && w[1].is_punct(b'+')
            && w[2].kind == Kind::Word
            && let Some(kind) = kind_of.get(&w[2].text.to_lowercase())
        {
            out.insert(kind.clone());
        }
    }
    out
}

/// The statements of `text` (split at `;`) that start a grant or deny, lowercased, with
/// `::` written without spaces.
fn grant_statements(text: &str) -> Vec<String> {
    let text = text
        .to_lowercase()
        .replace(": :", "::")
        .replace(" ::", "::");
    let mut out = Vec::new();
    for statement in text.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        if let Some(start) = words.iter().position(|w| *w == "grant" || *w == "deny") {
            out.push(words[start..].join(" ").replace(":: ", "::"));
        }
    }
    out
}

/// What is wrong with one grant statement: a schema as its securable, or `public` as its
/// grantee for an object not in [`PUBLIC`].
fn grant_problem(statement: &str) -> Option<String> {
    if statement.contains(" on schema::") {
        return Some(format!(
            "`{statement}` grants on a whole schema: EXECUTE on the schema changefeed reaches \
             every feed's event rows, purge_feed @force = 1, lock_feed and every outbox's \
             enqueue. Grant a table's roles their objects (grant_feed_roles, \
             grant_outbox_roles)."
        ));
    }
    let words: Vec<&str> = statement.split_whitespace().collect();
    if words.last() == Some(&"public") && words.len() >= 2 && words[words.len() - 2] == "to" {
        // The securable: the words between `on` and `to`, whatever the spacing of its dots.
        let on = words.iter().position(|w| *w == "on")?;
        let object = words[on + 1..words.len() - 2].concat();
        let name = object
            .rsplit(['.', ':'])
            .next()
            .unwrap_or(&object)
            .trim_matches(['[', ']']);
        if !PUBLIC.contains(&name) {
            return Some(format!(
                "`{statement}` grants to public: every user of the database could call it. \
                 Grant it to a role, or make the object check its caller and list it in \
                 role_grants.rs's PUBLIC."
            ));
        }
    }
    None
}

/// R28 over the current files (what runs): the generators against their lists, and every
/// grant in code or dynamic SQL.
pub fn lint(current: &[Current<'_>]) -> Vec<Violation> {
    let mut out = Vec::new();
    let find = |name: &str| {
        current
            .iter()
            .find(|c| module_name(c).as_deref() == Some(name))
    };
    for (list, generator) in GENERATORS {
        let (Some(list_file), Some(generator_file)) = (find(list), find(generator)) else {
            out.push(Violation {
                file: "sql".to_owned(),
                line: 0,
                rule: Rule::RoleGrants,
                message: format!("no definition of changefeed.{list} or changefeed.{generator}"),
            });
            continue;
        };
        let kinds = listed_kinds(&lex(list_file.text).code());
        let granted = granted_kinds(&lex(generator_file.text).code());
        for (kind, line) in &kinds {
            let exempt = GRANTED_TO_NO_ONE
                .iter()
                .any(|(l, k, _)| l == list && k == kind);
            if exempt && granted.contains(kind) {
                out.push(Violation {
                    file: format!("sql/{}", generator_file.name),
                    line: 0,
                    rule: Rule::RoleGrants,
                    message: format!(
                        "{generator} grants the {list} kind `{kind}`, which role_grants.rs \
                         lists as granted to no one: remove one of the two"
                    ),
                });
            } else if !exempt && !granted.contains(kind) {
                out.push(Violation {
                    file: format!("sql/{}", list_file.name),
                    line: *line,
                    rule: Rule::RoleGrants,
                    message: format!(
                        "the {list} kind `{kind}` is granted to no role by {generator}: grant \
                         it to the role of the table whose callers call it, or list it in \
                         role_grants.rs's GRANTED_TO_NO_ONE with who calls it instead"
                    ),
                });
            }
        }
        for (l, kind, _) in GRANTED_TO_NO_ONE.iter().filter(|(l, _, _)| l == list) {
            if !kinds.iter().any(|(k, _)| k == kind) {
                out.push(Violation {
                    file: format!("sql/{}", list_file.name),
                    line: 0,
                    rule: Rule::RoleGrants,
                    message: format!(
                        "role_grants.rs lists `{kind}` of {l} as granted to no one, but {l} \
                         has no such kind: remove it from GRANTED_TO_NO_ONE"
                    ),
                });
            }
        }
    }
    for file in current {
        let lexed = lex(file.text);
        let code = lexed.code();
        let code_text: String = code
            .iter()
            .filter(|t| t.kind != Kind::Str)
            .map(|t| t.text)
            .collect::<Vec<_>>()
            .join(" ");
        let mut statements = grant_statements(&code_text);
        for t in code.iter().filter(|t| t.kind == Kind::Str) {
            statements.extend(grant_statements(&t.string_value()));
        }
        for statement in statements {
            if let Some(message) = grant_problem(&statement) {
                out.push(Violation {
                    file: format!("sql/{}", file.name),
                    line: 0,
                    rule: Rule::RoleGrants,
                    message,
                });
            }
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
        crate::assert_rule_says(violations, Rule::RoleGrants, words);
    }

    #[test]
    fn the_bundle_passes_and_is_read_as_written() {
        let (files, _) = read_bundle();
        let current = current_files(&files);
        assert!(lint(&current).is_empty(), "{:?}", lint(&current));
        let granted = |generator: &str| {
            let file = current
                .iter()
                .find(|c| module_name(c).as_deref() == Some(generator))
                .expect("the generator");
            granted_kinds(&lex(file.text).code())
        };
        assert_eq!(
            granted("grant_outbox_roles"),
            [
                "backlog",
                "claim",
                "enqueue",
                "mark_done",
                "mark_failed",
                "requeue"
            ]
            .map(str::to_owned)
            .into(),
        );
        assert_eq!(
            granted("grant_feed_roles"),
            ["lock_feed", "outbox", "read_feed", "type:read", "ulid"]
                .map(str::to_owned)
                .into(),
        );
    }

    #[test]
    fn a_new_kind_without_a_decision_fires() {
        let violations = lint_edited("outbox_objects", |text| {
            text.replace("(N'backlog')", "(N'backlog'),\n    (N'redrive')")
        });
        assert_fires_saying(
            &violations,
            "`redrive` is granted to no role by grant_outbox_roles",
        );
    }

    #[test]
    fn granting_a_kind_listed_as_granted_to_no_one_fires() {
        let violations = lint_edited("grant_outbox_roles", |text| {
            text.replace("kind = N'backlog'", "kind = N'purge_done'")
        });
        assert_fires_saying(&violations, "grants the outbox_objects kind `purge_done`");
        // And backlog, no longer granted, has no decision.
        assert_fires_saying(&violations, "`backlog` is granted to no role");
    }

    #[test]
    fn a_grant_on_a_schema_fires_in_code_and_in_dynamic_sql() {
        let violations = lint_edited("grant_outbox_roles", |text| {
            text.replace(
                "+ N'grant execute on object::' + @enqueue",
                "+ N'grant execute on schema::[changefeed] to ' + @relay + N'; '\n            \
                 + N'grant execute on object::' + @enqueue",
            )
        });
        assert_fires_saying(&violations, "grants on a whole schema");
        assert!(grant_problem("grant execute on schema::changefeed to [x]").is_some());
        let code = grant_statements("grant select , execute on schema : : [changefeed] to r;");
        assert!(grant_problem(&code[0]).is_some(), "{code:?}");
    }

    #[test]
    fn a_grant_to_public_fires_unless_the_object_checks_its_caller() {
        assert!(
            grant_problem("grant execute on object::[changefeed].[remove_consumer] to public")
                .is_none()
        );
        let problem =
            grant_problem("grant execute on object::[changefeed].[save_cursor] to public");
        assert!(problem.is_some_and(|p| p.contains("grants to public")));
    }
}
