//! The per-feed and per-outbox objects as the generator writes them.
//!
//! setup_feed / setup_outbox do not run the templates: upgrade_feed and upgrade_outbox copy
//! each template's definition through changefeed.copy_template (sql/V21), replacing its
//! markers with the real table's names and key columns. A template that is fine for the
//! template tables (one bigint key) can still break for other key shapes, so this module
//! renders the text copy_template would produce for sample tables and puts it through
//! sqlfluff, the lint (with the sample table's columns and collations added to the bundle's
//! declarations), and a binding check of the object names it refers to.
//!
//! The replacement rules mirror copy_template exactly, in its order (binary collation, so
//! case-sensitive, and every occurrence):
//!
//! ```text
//! 1. e.__template_key__ = r.__template_key__   -> e.[k1] = r.[k1] and e.[k2] = r.[k2]
//! 2. __template_key__                          -> [k1], [k2]
//! 3. __template_shard__, __template_ulid__     -> [shard column], [ulid column]
//! 4. [changefeed].[<template table>]           -> [schema].[table]
//! 5. changefeed.<template table>               -> schema.table
//! ```
//!
//! and which templates are copied mirrors upgrade_feed (sql/V22: the kinds of
//! changefeed.feed_objects with object class P, V or FN whose mode is 'both' or the feed's;
//! the template table `__template_serialized__` for serialize_writers, else `__template__`)
//! and upgrade_outbox (sql/V35: every kind of changefeed.outbox_objects, template table
//! `__template_outbox__`). The kind lists are read from the bundle (feed_objects in V10,
//! outbox_objects in V26), not repeated here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use crate::lex::{Kind, Token, lex};
use crate::never_wait;
use crate::schema::{Column, Schema, parse_type};
use crate::typed::close_paren;
use crate::{Violation, bundle_schema, find_modules, lint_file_in, module_of, read_bundle};

/// `quotename(x)`: NULL (None) past 128 characters.
fn quotename(name: &str) -> Option<String> {
    (name.chars().count() <= 128).then(|| format!("[{}]", name.replace(']', "]]")))
}

/// One key column of a sample event table.
pub struct KeyColumn {
    pub name: &'static str,
    /// The type as key_columns (sql/V9) writes it, collation included.
    pub column_type: &'static str,
}

pub struct Sample {
    pub what: &'static str,
    pub schema: String,
    pub table: String,
    pub key: Vec<KeyColumn>,
    pub shard_column: &'static str,
    pub ulid_column: &'static str,
}

impl Sample {
    fn key_list(&self) -> Option<String> {
        let parts: Option<Vec<String>> = self.key.iter().map(|k| quotename(k.name)).collect();
        parts.map(|p| p.join(", "))
    }

    fn key_join(&self) -> Option<String> {
        let parts: Option<Vec<String>> = self
            .key
            .iter()
            .map(|k| quotename(k.name).map(|q| format!("e.{q} = r.{q}")))
            .collect();
        parts.map(|p| p.join(" and "))
    }

    fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

/// The representative tables.
pub fn samples() -> Vec<Sample> {
    // The longest name parse_feed_name accepts: schema and table together 108 characters.
    let long_schema = "s".repeat(20);
    let long_table = format!("t{}", "x".repeat(87));
    vec![
        Sample {
            what: "a composite key of mixed types",
            schema: "dbo".into(),
            table: "order_events".into(),
            key: vec![
                KeyColumn {
                    name: "tenant_id",
                    column_type: "int",
                },
                KeyColumn {
                    name: "order_no",
                    column_type: "nvarchar(40) collate SQL_Latin1_General_CP1_CI_AS",
                },
                KeyColumn {
                    name: "placed_at",
                    column_type: "datetime2(3)",
                },
                KeyColumn {
                    name: "line",
                    column_type: "decimal(9, 2)",
                },
            ],
            shard_column: "shard",
            ulid_column: "ulid_value",
        },
        Sample {
            what: "a unicode name with a space",
            schema: "ventes".into(),
            table: "Événement commande".into(),
            key: vec![KeyColumn {
                name: "numéro de ligne",
                column_type: "bigint",
            }],
            shard_column: "Fragment",
            ulid_column: "Clé ULID",
        },
        Sample {
            what: "the longest allowed name (schema and table 108 characters)",
            key: vec![KeyColumn {
                name: "k".repeat(128).leak(),
                column_type: "uniqueidentifier",
            }],
            schema: long_schema,
            table: long_table,
            shard_column: "s".repeat(128).leak(),
            ulid_column: "u".repeat(128).leak(),
        },
        Sample {
            what: "a key with a non-default collation",
            schema: "dbo".into(),
            table: "Kunden".into(),
            key: vec![
                KeyColumn {
                    name: "Kundennummer",
                    column_type: "varchar(20) collate German_PhoneBook_CI_AS",
                },
                KeyColumn {
                    name: "Filiale",
                    column_type: "nchar(4) collate Japanese_XJIS_140_CS_AS",
                },
            ],
            shard_column: "Filiale_shard",
            ulid_column: "ulid",
        },
    ]
}

/// The values rows of the inline function `name`'s `values` list, as string literals.
fn values_rows(bundle: &[(String, String)], name: &str) -> Vec<Vec<String>> {
    for (_, text) in bundle {
        if !module_of(text).is_some_and(|m| {
            m.name_parts
                .last()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        }) {
            continue;
        }
        let lexed = lex(text);
        let code = lexed.code();
        let Some(values) = code.iter().position(|t| t.is("values")) else {
            continue;
        };
        let mut rows = Vec::new();
        let mut row: Option<Vec<String>> = None;
        for t in &code[values + 1..] {
            if t.is_punct(b'(') {
                row = Some(Vec::new());
            } else if t.is_punct(b')') {
                match row.take() {
                    Some(r) => rows.push(r),
                    None => break,
                }
            } else if let Some(r) = row.as_mut() {
                match t.kind {
                    Kind::Str => r.push(t.string_value()),
                    Kind::Number => r.push(t.text.to_owned()),
                    _ => {}
                }
            }
        }
        return rows;
    }
    panic!("the bundle defines no function `{name}` with a values list")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A feed in outbox or serialize_writers mode.
    Feed(&'static str),
    /// A claim outbox.
    Outbox,
}

impl Target {
    pub fn template_table(self) -> &'static str {
        match self {
            Target::Feed("serialize_writers") => "__template_serialized__",
            Target::Feed(_) => "__template__",
            Target::Outbox => "__template_outbox__",
        }
    }
}

/// The kinds upgrade_feed / upgrade_outbox copy for `target`, and every per-object kind
/// that exists for it (for the binding check).
pub fn kinds(bundle: &[(String, String)], target: Target) -> (Vec<String>, Vec<String>) {
    match target {
        Target::Feed(mode) => {
            let rows = values_rows(bundle, "feed_objects");
            let applies = |r: &Vec<String>| r[3] == "both" || r[3] == mode;
            let code = rows
                .iter()
                .filter(|r| applies(r) && ["P", "V", "FN"].contains(&r[1].as_str()))
                .map(|r| r[0].clone())
                .collect();
            let all = rows
                .iter()
                .filter(|r| applies(r))
                .map(|r| r[0].clone())
                .collect();
            (code, all)
        }
        Target::Outbox => {
            let all: Vec<String> = values_rows(bundle, "outbox_objects")
                .into_iter()
                .map(|r| r[0].clone())
                .collect();
            (all.clone(), all)
        }
    }
}

/// What copy_template produces from `definition`, or the error it raises.
pub fn copy_template(
    definition: &str,
    template_table: &str,
    sample: &Sample,
    target: Target,
) -> Result<String, String> {
    if !definition.to_ascii_lowercase().contains("create or alter") {
        return Err(
            "the template does not begin with create or alter (copy_template 51009)".into(),
        );
    }
    let (key_list, key_join) = match target {
        Target::Feed(_) => (sample.key_list(), sample.key_join()),
        Target::Outbox => (None, None),
    };
    let (shard, ulid) = match target {
        Target::Feed("serialize_writers") => (Some(sample.shard_column), Some(sample.ulid_column)),
        _ => (None, None),
    };
    if (key_list.is_none() || key_join.is_none()) && definition.contains("__template_key__") {
        return Err("the template uses key columns, but no key was given (51009)".into());
    }
    if (shard.is_none() || ulid.is_none())
        && (definition.contains("__template_shard__") || definition.contains("__template_ulid__"))
    {
        return Err(
            "the template uses the shard and ulid columns, but none were given (51009)".into(),
        );
    }
    let null = || {
        "a replacement was NULL (quotename of a name over 128 characters): copy_template raises 51009".to_owned()
    };
    let mut text = definition.to_owned();
    if let Some(join) = &key_join {
        text = text.replace("e.__template_key__ = r.__template_key__", join);
    }
    if let Some(list) = &key_list {
        text = text.replace("__template_key__", list);
    }
    if let Some(shard) = shard {
        text = text.replace("__template_shard__", &quotename(shard).ok_or_else(null)?);
    }
    if let Some(ulid) = ulid {
        text = text.replace("__template_ulid__", &quotename(ulid).ok_or_else(null)?);
    }
    rename_table(&text, template_table, sample).ok_or_else(null)
}

/// copy_template's last two replacements (4 and 5 above): the template table's name, and
/// `changefeed.<template table>` inside per-object names and literals, by the sample's.
/// None when a quoted name would be NULL (over 128 characters).
fn rename_table(text: &str, template_table: &str, sample: &Sample) -> Option<String> {
    let table = format!(
        "{}.{}",
        quotename(&sample.schema)?,
        quotename(&sample.table)?
    );
    Some(
        text.replace(&format!("[changefeed].[{template_table}]"), &table)
            .replace(&format!("changefeed.{template_table}"), &sample.qualified()),
    )
}

/// The tables (schema, name) whose reads need a guard (R23, `never_wait.rs`) in the object
/// of `kind` generated for `sample` as `target`: the template's tables as copy_template
/// renames them. Empty for a kind that may wait.
pub fn guarded_tables(kind: &str, sample: &Sample, target: Target) -> Vec<(String, String)> {
    let template_table = target.template_table();
    let Some(tables) = never_wait::guarded_tables(&format!("{kind}:changefeed.{template_table}"))
    else {
        return Vec::new();
    };
    tables
        .iter()
        .filter_map(|(schema, name)| {
            let renamed = rename_table(&format!("[{schema}].[{name}]"), template_table, sample)?;
            let lexed = lex(&renamed);
            let code = lexed.code();
            Some((code.first()?.ident_value(), code.get(2)?.ident_value()))
        })
        .collect()
}

/// The R23 problems of one generated object of `kind`: reads of its outbox or event table
/// that lost their guard on the way through the generator.
pub fn never_wait_problems(
    rendered: &Rendered,
    kind: &str,
    sample: &Sample,
    target: Target,
) -> Vec<String> {
    let tables = guarded_tables(kind, sample, target);
    let tables: Vec<(&str, &str)> = tables
        .iter()
        .map(|(schema, name)| (schema.as_str(), name.as_str()))
        .collect();
    let lexed = lex(&rendered.text);
    never_wait::unguarded_reads(&lexed.code(), &tables)
        .into_iter()
        .map(|(line, table)| {
            format!(
                "{} line {line}: [{}] {}",
                rendered.object,
                crate::Rule::NeverWaitGuard.id(),
                never_wait::message(&rendered.object, &table)
            )
        })
        .collect()
}

/// One generated object: its name, the template file it came from, and its text.
pub struct Rendered {
    pub object: String,
    pub template_file: String,
    pub text: String,
}

/// The newest definition of the template of `kind` (bundle in version order): a later
/// `create or alter` replaces an earlier one in the database, and upgrade_outbox and
/// upgrade_feed copy what is there.
fn template_of<'b>(
    bundle: &'b [(String, String)],
    kind: &str,
    template_table: &str,
) -> Option<(&'b str, &'b str)> {
    let wanted = format!("{kind}:changefeed.{template_table}");
    bundle.iter().rev().find_map(|(name, text)| {
        module_of(text)
            .filter(|m| m.name_parts.last().is_some_and(|n| *n == wanted))
            .map(|_| (name.as_str(), text.as_str()))
    })
}

/// The kind of a generated object named `[changefeed].[<kind>:<schema.table>]`.
fn kind_of(object: &str) -> &str {
    object
        .strip_prefix("[changefeed].[")
        .and_then(|rest| rest.split_once(':'))
        .map_or(object, |(kind, _)| kind)
}

/// Every object generated for `sample` as `target`.
pub fn render(
    bundle: &[(String, String)],
    sample: &Sample,
    target: Target,
) -> Result<Vec<Rendered>, String> {
    let template_table = target.template_table();
    let (code_kinds, _) = kinds(bundle, target);
    let mut out = Vec::new();
    for kind in code_kinds {
        let (file, definition) = template_of(bundle, &kind, template_table).ok_or_else(|| {
            format!("no template [changefeed].[{kind}:changefeed.{template_table}] in sql/")
        })?;
        let text = copy_template(definition, template_table, sample, target)
            .map_err(|e| format!("{kind} from sql/{file} for {}: {e}", sample.qualified()))?;
        out.push(Rendered {
            object: format!("[changefeed].[{kind}:{}]", sample.qualified()),
            template_file: format!("sql/{file}"),
            text,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The storage DDL that create_feed_storage and create_outbox_storage build
// ---------------------------------------------------------------------------------------

/// The value of the string expression `code[from..to]`: literals, variables, `+`,
/// parentheses, `quotename(…)` (NULL past 128 characters) and `convert(<type>, …)`.
/// `Ok(None)` is NULL; `Err` names what this evaluator does not know.
fn evaluate(
    code: &[&Token<'_>],
    from: usize,
    to: usize,
    vars: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    let mut value = String::new();
    let mut i = from;
    while i < to {
        let t = code[i];
        let (piece, next) = if t.kind == Kind::Str {
            (Some(t.string_value()), i + 1)
        } else if t.kind == Kind::Word && t.text.starts_with('@') {
            let v = vars
                .get(&t.text.to_ascii_lowercase())
                .ok_or_else(|| format!("`{}` is not bound", t.text))?;
            (Some(v.clone()), i + 1)
        } else if t.is_punct(b'(') || t.is_any(&["quotename", "convert"]) {
            let open = if t.is_punct(b'(') { i } else { i + 1 };
            let close = close_paren(code, open)
                .filter(|&c| c < to)
                .ok_or("an open `(`")?;
            let inner_from = if t.is("convert") {
                // convert(<type>, <value>): the value after the first top-level comma.
                let mut k = open + 1;
                let mut depth = 0;
                while k < close && !(depth == 0 && code[k].is_punct(b',')) {
                    if code[k].is_punct(b'(') {
                        depth += 1;
                    } else if code[k].is_punct(b')') {
                        depth -= 1;
                    }
                    k += 1;
                }
                k + 1
            } else {
                open + 1
            };
            let inner = evaluate(code, inner_from, close, vars)?;
            let piece = if t.is("quotename") {
                inner.and_then(|v| quotename(&v))
            } else {
                inner
            };
            (piece, close + 1)
        } else {
            return Err(format!("`{}` is not evaluated here", t.text));
        };
        let Some(piece) = piece else {
            return Ok(None);
        };
        value.push_str(&piece);
        match code.get(next) {
            Some(p) if next < to && p.is_punct(b'+') => i = next + 1,
            _ if next >= to => i = next,
            Some(p) => return Err(format!("`{}` is not evaluated here", p.text)),
            None => i = next,
        }
    }
    Ok(Some(value))
}

/// Every dynamic statement (`set @sql = …`) of the procedure `procedure`, evaluated with
/// `vars` bound and every `declare`/`set` it can evaluate before it. Statements built from
/// something this evaluator does not know are left out.
fn dynamic_statements(
    bundle: &[(String, String)],
    procedure: &str,
    mut vars: BTreeMap<String, String>,
) -> Vec<(usize, Option<String>)> {
    let (_, text) = bundle
        .iter()
        .find(|(_, text)| {
            module_of(text).is_some_and(|m| m.name_parts.last().is_some_and(|n| n == procedure))
        })
        .unwrap_or_else(|| panic!("no procedure {procedure} in sql/"));
    let lexed = lex(text);
    let code = lexed.code();
    let mut out = Vec::new();
    for i in 0..code.len().saturating_sub(3) {
        let assigns =
            (code[i].is("set") || code[i].is("declare")) && code[i + 1].text.starts_with('@');
        if !assigns {
            continue;
        }
        let Some(eq) = (i + 2..code.len().min(i + 8)).find(|&k| code[k].is_punct(b'=')) else {
            continue;
        };
        let end = (eq..code.len())
            .find(|&k| code[k].is_punct(b';'))
            .unwrap_or(code.len());
        let name = code[i + 1].text.to_ascii_lowercase();
        match evaluate(&code, eq + 1, end, &vars) {
            Ok(value) if name == "@sql" => out.push((code[i].line, value)),
            Ok(Some(value)) => {
                vars.insert(name, value);
            }
            _ => {}
        }
    }
    out
}

/// The DDL create_feed_storage and create_outbox_storage would run for `sample`.
pub fn storage_ddl(bundle: &[(String, String)], sample: &Sample) -> Result<Vec<Rendered>, String> {
    let per_feed = |kind: &str| {
        quotename(&format!("{kind}:{}", sample.qualified()))
            .map(|q| format!("[changefeed].{q}"))
            .ok_or_else(|| {
                format!(
                    "the {kind} name of {} is over 128 characters",
                    sample.qualified()
                )
            })
    };
    // key_definitions as create_feed_storage aggregates them from key_columns (sql/V11).
    let key_definitions = sample
        .key
        .iter()
        .map(|k| quotename(k.name).map(|q| format!("{q} {} not null", k.column_type)))
        .collect::<Option<Vec<_>>>()
        .ok_or("a key column name is over 128 characters")?
        .join(", ");
    let mut feed_vars = BTreeMap::from([
        ("@schema_name".to_owned(), sample.schema.clone()),
        ("@table_name".to_owned(), sample.table.clone()),
        ("@key_definitions".to_owned(), key_definitions),
    ]);
    for (var, kind) in [
        ("@sequence", "sequence"),
        ("@outbox", "outbox"),
        ("@feed", "feed"),
        ("@state", "state"),
        ("@read_type", "type:read"),
    ] {
        feed_vars.insert(var.to_owned(), per_feed(kind)?);
    }
    let outbox_vars = BTreeMap::from([
        ("@schema_name".to_owned(), sample.schema.clone()),
        ("@table_name".to_owned(), sample.table.clone()),
        ("@json_type".to_owned(), "nvarchar(max)".to_owned()),
    ]);
    let mut out = Vec::new();
    for (procedure, vars, at_least) in [
        ("create_feed_storage", feed_vars, 4),
        ("create_outbox_storage", outbox_vars, 4),
    ] {
        let statements = dynamic_statements(bundle, procedure, vars);
        if statements.len() < at_least {
            return Err(format!(
                "only {} of the dynamic statements of changefeed.{procedure} could be built \
                 (extend `evaluate` in tests/sql_lint/generated.rs to what they use)",
                statements.len()
            ));
        }
        for (line, value) in statements {
            let text = value.ok_or_else(|| {
                format!(
                    "the statement built at line {line} of changefeed.{procedure} is NULL for \
                     {} (a quotename over 128 characters?): sp_executesql would run nothing",
                    sample.qualified()
                )
            })?;
            out.push(Rendered {
                object: format!(
                    "changefeed.{procedure} line {line} for {}",
                    sample.qualified()
                ),
                template_file: format!("changefeed.{procedure}"),
                text,
            });
        }
    }
    Ok(out)
}

/// The names a rendered object may refer to as `[changefeed].[…]` / `changefeed.…`.
fn known_names(bundle: &[(String, String)], sample: &Sample, target: Target) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, text) in bundle {
        let lexed = lex(text);
        let code: Vec<&Token<'_>> = lexed.code();
        for m in find_modules(text, &code) {
            if let Some(n) = m.name_parts.last() {
                names.insert(n.to_ascii_lowercase());
            }
        }
        for i in 0..code.len().saturating_sub(3) {
            if code[i].is("create")
                && code[i + 1].is("table")
                && let Some(n) = changefeed_name(&code, i + 2)
            {
                names.insert(n.to_ascii_lowercase());
            }
        }
    }
    let (_, all) = kinds(bundle, target);
    for kind in all {
        names.insert(format!("{kind}:{}", sample.qualified()).to_ascii_lowercase());
    }
    names
}

/// `[changefeed].[x]` or `changefeed.x` at `i` → `x`.
fn changefeed_name(code: &[&Token<'_>], i: usize) -> Option<String> {
    let schema = code.get(i)?;
    if !(matches!(schema.kind, Kind::Word | Kind::Ident)
        && schema.ident_value().eq_ignore_ascii_case("changefeed")
        && code.get(i + 1)?.is_punct(b'.'))
    {
        return None;
    }
    let name = code.get(i + 2)?;
    matches!(name.kind, Kind::Word | Kind::Ident).then(|| name.ident_value())
}

/// Binding problems of one rendered object: leftover markers, names over 128 characters,
/// and references to changefeed objects that do not exist for this feed or outbox.
pub fn binding_problems(rendered: &Rendered, known: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let lexed = lex(&rendered.text);
    let code: Vec<&Token<'_>> = lexed.code();
    for t in &code {
        if t.text.contains("__template") {
            out.push(format!(
                "line {}: `{}` still holds a template marker that copy_template does not \
                 replace; use one of the markers it rewrites (sql/V21)",
                t.line, t.text
            ));
        }
        if t.kind == Kind::Ident && t.ident_value().chars().count() > 128 {
            out.push(format!(
                "line {}: the identifier `{}…` has {} characters, over SQL Server's 128",
                t.line,
                t.text.chars().take(40).collect::<String>(),
                t.ident_value().chars().count()
            ));
        }
    }
    for i in 0..code.len() {
        if i > 0 && code[i - 1].is_punct(b'.') {
            continue; // the middle of a three-part name
        }
        if let Some(name) = changefeed_name(&code, i)
            && !code.get(i + 3).is_some_and(|t| t.is_punct(b'.'))
            && !known.contains(&name.to_ascii_lowercase())
        {
            out.push(format!(
                "line {}: `[changefeed].[{name}]` is not an object the bundle creates, nor one \
                 that setup creates for this table in this mode (feed_objects/outbox_objects)",
                code[i].line
            ));
        }
    }
    out
}

/// The sample's own columns (its key, shard and ulid columns), as the lint's declarations.
fn sample_columns(sample: &Sample) -> Vec<Column> {
    let mut out = Vec::new();
    for k in &sample.key {
        let text = k.column_type;
        let lexed = lex(text);
        let code: Vec<&Token<'_>> = lexed.tokens.iter().collect();
        if let Some((ty, _)) = parse_type(&code, 0) {
            out.push(Column {
                name: k.name.to_ascii_lowercase(),
                ty,
                at: format!("the sample table {}", sample.qualified()),
            });
        }
    }
    out
}

/// The lint's violations in a rendered object that its template does not have at the same
/// line and rule (those are reported by `bundle_passes_lint`).
pub fn new_violations(rendered: &Rendered, template_text: &str, schema: &Schema) -> Vec<Violation> {
    let before: Vec<(usize, crate::Rule)> =
        lint_file_in(&rendered.template_file, template_text, schema)
            .into_iter()
            .map(|v| (v.line, v.rule))
            .collect();
    let name = format!(
        "{} (generated from {})",
        rendered.object, rendered.template_file
    );
    lint_file_in(&name, &rendered.text, schema)
        .into_iter()
        .filter(|v| !before.contains(&(v.line, v.rule)))
        .collect()
}

/// Generated DDL as sqlfluff can parse it: sqlfluff 4.5's tsql dialect does not know
/// `alter table … set (lock_escalation = …)` (SQL Server does: ALTER TABLE's
/// `SET ( LOCK_ESCALATION = { AUTO | TABLE | DISABLE } )`), so those statements are left
/// out of its input; the lint still reads them. The storage DDL holds no string literals,
/// so splitting at `;` is exact.
fn for_sqlfluff(ddl: &str) -> String {
    ddl.split_inclusive(';')
        .filter(|statement| !statement.to_ascii_lowercase().contains("lock_escalation"))
        .collect::<String>()
}

/// Runs `python3 -m sqlfluff parse --dialect tsql` over `files`; None when sqlfluff is
/// missing, else the files it could not parse with its output.
fn sqlfluff(files: &[(String, String)]) -> Option<Result<(), String>> {
    let version = Command::new("python3")
        .args(["-m", "sqlfluff", "--version"])
        .output();
    if !version.is_ok_and(|o| o.status.success()) {
        return None;
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("changefeed-generated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write a rendered object");
    }
    let parse = |path: &std::path::Path, quiet: bool| {
        let mut command = Command::new("python3");
        command.args(["-m", "sqlfluff", "parse", "--dialect", "tsql"]);
        if quiet {
            command.args(["--format", "none"]);
        }
        command.arg(path).output().expect("run sqlfluff")
    };
    let result = if parse(&dir, true).status.success() {
        Ok(())
    } else {
        // Name the files it cannot parse, with sqlfluff's own account of where.
        let mut report = String::new();
        for (name, text) in files {
            let output = parse(&dir.join(name), false);
            if !output.status.success() {
                let stdout = String::from_utf8_lossy(&output.stdout);
                let violations = stdout
                    .split_once("==== parsing violations ====")
                    .map_or(stdout.as_ref(), |(_, v)| v);
                report.push_str(&format!(
                    "{name} (`{}`):{violations}\n",
                    text.lines()
                        .find(|l| l.starts_with("create"))
                        .unwrap_or_default()
                ));
            }
        }
        Err(report)
    };
    let _ = std::fs::remove_dir_all(&dir);
    Some(result)
}

#[test]
fn generated_objects_parse_lint_and_bind_for_every_sample_table() {
    let (bundle, _) = read_bundle();
    let base_schema = bundle_schema(&bundle);
    let mut problems = Vec::new();
    let mut files = Vec::new();
    let mut count = 0;
    for (n, sample) in samples().iter().enumerate() {
        let mut schema = base_schema.clone();
        schema.columns.extend(sample_columns(sample));
        for target in [
            Target::Feed("outbox"),
            Target::Feed("serialize_writers"),
            Target::Outbox,
        ] {
            let known = known_names(&bundle, sample, target);
            let rendered = match render(&bundle, sample, target) {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("{} ({}): {e}", sample.qualified(), sample.what));
                    continue;
                }
            };
            assert!(!rendered.is_empty(), "nothing generated for {target:?}");
            for r in &rendered {
                count += 1;
                let template = &bundle
                    .iter()
                    .find(|(name, _)| format!("sql/{name}") == r.template_file)
                    .expect("the template file")
                    .1;
                for p in binding_problems(r, &known) {
                    problems.push(format!("{} ({}): {p}", r.object, sample.what));
                }
                let kind = kind_of(&r.object);
                for p in never_wait_problems(r, kind, sample, target) {
                    problems.push(format!("{p} [{}]", sample.what));
                }
                for v in new_violations(r, template, &schema) {
                    problems.push(format!("{v} [{}]", sample.what));
                }
                files.push((format!("sample{n}_{count:03}.sql"), r.text.clone()));
            }
        }
    }
    for (n, sample) in samples().iter().enumerate() {
        match storage_ddl(&bundle, sample) {
            Ok(ddl) => {
                let known = known_names(&bundle, sample, Target::Feed("outbox"));
                let mut schema = base_schema.clone();
                schema.columns.extend(sample_columns(sample));
                for (k, r) in ddl.iter().enumerate() {
                    for p in binding_problems(r, &known) {
                        problems.push(format!("{} ({}): {p}", r.object, sample.what));
                    }
                    // R10's line check (a ULID next to uniqueidentifier) is for hand-written
                    // SQL: generated DDL is one line, and a uniqueidentifier key is the
                    // user's choice, not a ULID column.
                    for v in lint_file_in(&r.object, &r.text, &schema)
                        .into_iter()
                        .filter(|v| {
                            !(v.rule == crate::Rule::UlidAndTimeTypes
                                && v.message.contains("uniqueidentifier"))
                        })
                    {
                        problems.push(format!("{v} [{}]", sample.what));
                    }
                    files.push((
                        format!("sample{n}_storage_{k:02}.sql"),
                        for_sqlfluff(&r.text),
                    ));
                }
            }
            Err(e) => problems.push(format!("{} ({}): {e}", sample.qualified(), sample.what)),
        }
    }
    match sqlfluff(&files) {
        None => eprintln!(
            "generated objects: python3 -m sqlfluff is not installed, so the {} rendered \
             objects were not parsed (CI installs it: .ci/run)",
            files.len()
        ),
        Some(Err(output)) => problems.push(format!(
            "sqlfluff cannot parse a generated object (sample<n>_<i>.sql are the rendered \
             objects in order):\n{output}"
        )),
        Some(Ok(())) => {}
    }
    assert!(
        problems.is_empty(),
        "the generated per-feed/per-outbox code breaks for some table shapes:\n{}",
        problems.join("\n")
    );
}

#[test]
fn storage_ddl_is_built_like_the_storage_procedures() {
    let (bundle, _) = read_bundle();
    let sample = &samples()[3];
    let ddl = storage_ddl(&bundle, sample).expect("the storage DDL");
    let read_type = ddl
        .iter()
        .find(|r| {
            r.text
                .starts_with("create type [changefeed].[type:read:dbo.Kunden]")
        })
        .expect("the read type");
    assert!(
        read_type.text.contains(
            "[Kundennummer] varchar(20) collate German_PhoneBook_CI_AS not null, \
             [Filiale] nchar(4) collate Japanese_XJIS_140_CS_AS not null"
        ),
        "{}",
        read_type.text
    );
    assert!(
        ddl.iter()
            .any(|r| r.text.starts_with("create table [dbo].[Kunden] (id bigint"))
    );
    // The evaluator itself: NULL from quotename, and what it does not know.
    let lexed = lex("quotename(@a + N'x') + N'.' + convert(nvarchar(max), @b)");
    let code = lexed.code();
    let vars = BTreeMap::from([
        ("@a".to_owned(), "a]".to_owned()),
        ("@b".to_owned(), "b".to_owned()),
    ]);
    assert_eq!(
        evaluate(&code, 0, code.len(), &vars),
        Ok(Some("[a]]x].b".to_owned()))
    );
    let long = BTreeMap::from([
        ("@a".to_owned(), "a".repeat(128)),
        ("@b".to_owned(), "b".to_owned()),
    ]);
    assert_eq!(evaluate(&code, 0, code.len(), &long), Ok(None));
    let lexed = lex("upper(@a)");
    let code = lexed.code();
    assert!(evaluate(&code, 0, code.len(), &vars).is_err());
}

#[test]
fn the_generator_mirror_replaces_like_copy_template() {
    let sample = &samples()[0];
    let template = "create or alter procedure [changefeed].[read_feed:changefeed.__template__] as\n\
                    select __template_key__ from [changefeed].[__template__] as e\n\
                    join @rows as r on e.__template_key__ = r.__template_key__;\n\
                    -- N'changefeed.__template__'";
    let text = copy_template(template, "__template__", sample, Target::Feed("outbox")).unwrap();
    assert_eq!(
        text,
        "create or alter procedure [changefeed].[read_feed:dbo.order_events] as\n\
         select [tenant_id], [order_no], [placed_at], [line] from [dbo].[order_events] as e\n\
         join @rows as r on e.[tenant_id] = r.[tenant_id] and e.[order_no] = r.[order_no] and \
         e.[placed_at] = r.[placed_at] and e.[line] = r.[line];\n\
         -- N'dbo.order_events'"
    );
    // No key for an outbox: a template that uses one is refused, as copy_template does.
    assert!(copy_template(template, "__template__", sample, Target::Outbox).is_err());
    // quotename is NULL past 128 characters: the whole text would be NULL.
    let mut long = samples().remove(2);
    long.shard_column = "x".repeat(129).leak();
    let serialized = "create or alter view v as select __template_shard__ from t;";
    assert!(
        copy_template(
            serialized,
            "__template_serialized__",
            &long,
            Target::Feed("serialize_writers")
        )
        .is_err()
    );
}

#[test]
fn binding_check_catches_a_marker_left_behind_and_a_missing_object() {
    let (bundle, _) = read_bundle();
    let sample = &samples()[1];
    let known = known_names(&bundle, sample, Target::Feed("serialize_writers"));
    // A serialized feed has no outbox: a template that reads one binds to nothing.
    let bad = Rendered {
        object: "x".into(),
        template_file: "sql/V44.sql".into(),
        text: format!(
            "select 1 from [changefeed].[outbox:{}] where __template_shard__ = 1;",
            sample.qualified()
        ),
    };
    let problems = binding_problems(&bad, &known);
    assert_eq!(problems.len(), 2, "{problems:?}");
    let good = Rendered {
        text: format!(
            "select 1 from [changefeed].[state:{}] cross apply changefeed.ulid_at(1,1,1,1,0x,1,0x,1) as a;",
            sample.qualified()
        ),
        ..bad
    };
    assert_eq!(binding_problems(&good, &known), Vec::<String>::new());
}

#[test]
fn a_key_shape_that_breaks_a_template_is_caught() {
    // A template that compares the key with a #temp column breaks only for a key with a
    // collation: the lint sees it once the sample's columns are known.
    let template = "create or alter procedure [changefeed].[read_feed:changefeed.__template__]\n\
                    as\nbegin\n    set nocount, xact_abort on;\n\
                    select 1 from #read as r join [changefeed].[__template__] as e\n\
                    on e.__template_key__ = r.__template_key__;\nend\n";
    let (bundle, _) = read_bundle();
    let sample = &samples()[3];
    let mut schema = bundle_schema(&bundle);
    schema.columns.extend(sample_columns(sample));
    let text = copy_template(template, "__template__", sample, Target::Feed("outbox")).unwrap();
    let rendered = Rendered {
        object: "[changefeed].[read_feed:dbo.Kunden]".into(),
        template_file: "sql/V15.sql".into(),
        text,
    };
    let found = new_violations(&rendered, template, &schema);
    assert!(
        found.iter().any(|v| v.rule == crate::Rule::CollationMix
            && v.line == 6
            && v.to_string().contains("German_PhoneBook_CI_AS")),
        "{found:?}"
    );
}

#[test]
fn generated_code_is_copied_from_the_newest_template() {
    let (bundle, _) = read_bundle();
    let sample = &samples()[0];
    let rendered = render(&bundle, sample, Target::Outbox).expect("the outbox's objects");
    let claim = rendered
        .iter()
        .find(|r| kind_of(&r.object) == "claim")
        .expect("a claim");
    let newest = bundle
        .iter()
        .rev()
        .find(|(_, text)| {
            module_of(text).is_some_and(|m| {
                m.name_parts.last().map(String::as_str)
                    == Some("claim:changefeed.__template_outbox__")
            })
        })
        .expect("the claim template");
    assert_eq!(claim.template_file, format!("sql/{}", newest.0));
}

#[test]
fn a_generated_read_without_its_guard_is_caught_under_the_real_table_name() {
    let sample = &samples()[1];
    let template = "create or alter procedure [changefeed].[mark_done:changefeed.__template_outbox__]\n\
                    as\nbegin\n    set nocount, xact_abort on;\n\
                    update t set status = 2\n\
                    from [changefeed].[__template_outbox__] as t with (index(1))\n\
                    where t.id = @id;\nend\n";
    let render = |text: &str| Rendered {
        object: format!("[changefeed].[mark_done:{}]", sample.qualified()),
        template_file: "sql/V1__test.sql".into(),
        text: copy_template(text, "__template_outbox__", sample, Target::Outbox).unwrap(),
    };
    let guarded = render(template);
    assert!(
        guarded
            .text
            .contains("from [ventes].[Événement commande] as t")
    );
    assert_eq!(
        never_wait_problems(&guarded, "mark_done", sample, Target::Outbox),
        Vec::<String>::new()
    );
    let bare = render(&template.replace(" with (index(1))", ""));
    let problems = never_wait_problems(&bare, "mark_done", sample, Target::Outbox);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("line 6"), "{problems:?}");
    // The feed's outbox and event table, renamed for the feed.
    assert_eq!(
        guarded_tables("read_feed", sample, Target::Feed("outbox")),
        [
            (
                "changefeed".to_owned(),
                "outbox:ventes.Événement commande".to_owned()
            ),
            ("ventes".to_owned(), "Événement commande".to_owned())
        ]
    );
    assert!(guarded_tables("enqueue", sample, Target::Outbox).is_empty());
}
