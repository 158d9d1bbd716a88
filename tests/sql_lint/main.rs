//! The project's own static lint of the T-SQL migration bundle in `sql/`
//! (ARCHITECTURE.md describes the bundle and the SQL Server facts behind these rules).
//!
//! refinery sends every file of `sql/` to SQL Server as one batch, inside a transaction.
//! CI has no SQL Server, so the rules that a server would only enforce at deploy time (or
//! never: a `GRANT` after a procedure silently becomes part of its body) are checked here,
//! per file, on a small T-SQL tokenizer (`lex.rs`) that knows comments (`--`, nested
//! `/* */`), string literals (`'…'`, `N'…'`, `''` escapes) and quoted identifiers (`[…]`
//! with `]]`, `"…"`). Keywords inside comments and strings never count as code.
//!
//! Rules (each violation names the file, the line, the rule and the fix):
//!
//! * R0 `lexical` — no unterminated comment, string or quoted identifier.
//! * R1 `file-name` — `V<version>__<snake_name>.sql`, versions 1, 2, … without gaps or
//!   duplicates, nothing else in `sql/`.
//! * R2 `no-go` — no `GO` batch-separator line.
//! * R3 `one-module-first` — a `CREATE [OR ALTER] PROCEDURE|PROC|FUNCTION|VIEW|TRIGGER`
//!   (or `ALTER …`) is the first statement of its file and the only module in it;
//!   `CREATE SCHEMA` is the first statement of its file too.
//! * R4 `procedure-preamble` — a procedure's first statement after `AS BEGIN` is
//!   `SET NOCOUNT, XACT_ABORT ON` (or both `SET NOCOUNT ON` and `SET XACT_ABORT ON`).
//! * R5 `nothing-after-module` — nothing but comments and one `;` after the `END` that
//!   closes a procedure, function or trigger body, or after the `;` that ends an inline
//!   table-valued function or a view.
//! * R6 `transaction-catch` — every `BEGIN TRAN[SACTION]` in a procedure is inside a
//!   `BEGIN TRY` whose `BEGIN CATCH` does `IF @@TRANCOUNT > 0 ROLLBACK; THROW;`.
//! * R7 `throw-number` — `THROW <number>` uses 51000–51999.
//! * R8 `template` — a template module (`[changefeed].[<kind>:changefeed.__template__]`,
//!   and likewise `…__template_outbox__`) begins with exactly `create or alter`, and its
//!   `__template_key__` markers are in a form the generator that copies templates rewrites.
//! * R9 `no-transaction-refused` — no statement SQL Server refuses inside a user
//!   transaction (`ALTER|CREATE|DROP DATABASE`, `BACKUP`, `RESTORE`, `RECONFIGURE`,
//!   full-text catalog/index DDL), in code or in dynamic SQL strings.
//! * R10 `ulid-and-time-types` — no line pairs `ulid` with `uniqueidentifier`; no
//!   `datediff(millisecond|ms|microsecond|mcs|nanosecond|ns, …)` (use `datediff_big`).
//!
//! The typed rules (`typed.rs`, over the declarations collected by `schema.rs`): what a
//! server refuses at CREATE time or gets silently wrong from types and collations.
//!
//! * R11 `int-literal-range` — an integer literal outside the int range (typed numeric by
//!   SQL Server) only as the direct operand of `convert(bigint, …)` / `cast(… as bigint)`
//!   or as the initial value of a bigint variable or parameter (`@x bigint = …`). Literals
//!   inside strings (messages) are not code and are not checked.
//! * R12 `collation-mix` — a `coalesce` / `isnull` / `iif` / `nullif` / `case` result /
//!   comparison / `union` column that mixes a column the bundle declares with an explicit
//!   `collate` (in code or in dynamic DDL) with a column of another collation: another
//!   character column, a table-variable column or a `#temp` column, with no `collate` in
//!   the expression. Columns are known by name (see `schema.rs`).
//! * R13 `implicit-transactions` — a procedure that opens its own transaction has `set
//!   implicit_transactions off` before its first `BEGIN TRAN[SACTION]`.
//! * R14 `silent-truncation` — `isnull(a, b)` where `b` can be longer than `a`'s declared
//!   length, and `declare @v type(n) = <value longer than n>`, where both lengths are known
//!   (declared variables, parameters and columns, literals, `convert`/`cast`, `concat`).
//! * R15 `cursor-parameter` — no procedure input parameter `@cursor binary(n)`: binary pads
//!   and cuts silently; take varbinary and check the length.
//! * R16 `view-readpast` — no READPAST in a view (error 650 under SNAPSHOT/SERIALIZABLE).
//! * R17 `session-context-type` — `session_context(…)` (sql_variant) only directly inside
//!   `convert(type, …)` / `cast(… as type)`.
//! * R18 `function-side-effects` — no newid/rand/crypt_gen_random, EXEC, THROW, RAISERROR or
//!   PRINT inside a function.
//! * R19 `bitwise-operand` — `&`, `|`, `^` never take a decimal/numeric/float/money operand
//!   (including an integer literal beyond int) nor two binary operands.
//! * R21 `length-units` — no `len(…)` (or a sum of them) compared with a non-zero number: a
//!   length limit counts what the column or identifier counts, UTF-16 code units for
//!   `nvarchar(n)` and names (`datalength(x) / 2`), while `len()` counts a surrogate pair once
//!   under `_SC` collations and ignores trailing spaces. `len(x) = 0` (emptiness) is fine.
//!   Released (frozen) migrations are exempt: they cannot change, and later files replace
//!   the modules that broke it.
//!
//! * R24 `reserved-name-collation` — a name (an identifier ending in `name`) compared with
//!   `shard_id`, `ulid`, `order_sequence` or `time_hint`, the columns changefeed adds next to
//!   a key, states the comparison's collation with `collate` (`reserved_names.rs` says why).
//!   Released (frozen) migrations are exempt.
//!
//! * R22 `pause-outside-transaction` — no `WAITFOR` and no call of a pause procedure
//!   (`changefeed.pause_*`) between a `BEGIN TRAN[SACTION]` and the `COMMIT` or `ROLLBACK`
//!   after it, in text order: a procedure that waits for work (read_feed's long-poll, the
//!   claim's `@wait_ms`) pauses between its own transactions, or the pause would hold every
//!   lock the transaction took (an enqueue, a claimer, an acknowledgement would wait for it).
//!
//! * R27 `no-regeneration-in-migration` — outside released migrations, no statement of a
//!   migration (code before any module: a module's body is a procedure's, not the
//!   migration's) executes `changefeed.upgrade_all_feeds`, `upgrade_feed` or
//!   `upgrade_outbox`. Regenerating inside a migration does every object in the
//!   migration's one transaction, and every call of a regenerated procedure waits until the
//!   migration commits; regeneration is the step after the migrations, object by object
//!   (`exec changefeed.upgrade_all_feeds @only_outdated = 1`, ARCHITECTURE.md).
//!
//! Over the whole bundle:
//!
//! * R20 `ordered-feed-insert` — a statement `insert into [changefeed].[feed:…]` in the
//!   newest definition of its module has `order by` and `option (maxdop 1)`: readers rely on
//!   feed rows entering the index in ULID order, which only a serial, ordered plan keeps
//!   (ORDER BY alone orders identity values, not the insert). Definitions that a later file
//!   replaces (frozen files) are not what runs, and are not checked.
//! * R23 `never-wait-guard` — in the newest definition of a procedure that must never wait
//!   for another transaction (the claim outbox's `claim`, `mark_done`, `mark_failed`,
//!   `requeue`; the outbox-mode `read_feed`), every read of a table writers hold rows of (the
//!   outbox; read_feed's outbox and event table) carries a guard: `READPAST`,
//!   `READUNCOMMITTED` (not on an UPDATE/DELETE target), `FORCESEEK`, or, for a DELETE or
//!   UPDATE target, a row source of its own driving `OPTION (FORCE ORDER, LOOP JOIN)`, or a
//!   single-row read by key (`INDEX(1)` and `where <alias>.id = @variable`). Inserts,
//!   the feed table, and procedures that may wait are out of scope (`never_wait.rs` says
//!   which and why); the generated text is checked too (`generated.rs`).
//! * R25 `outbox-columns` — every column `create_outbox_storage` creates is required of an
//!   existing outbox table or added to one; one that is added is not reported missing by
//!   `outbox_problem`, and `upgrade_outbox` calls `create_outbox_storage` to add it, so that
//!   an outbox from before the column never gets code naming it without it (Msg 207;
//!   `outbox_columns.rs`).
//! * R26 `catalog-collation` — outside released migrations, a name read from the catalog
//!   (a character column of `sys.*` / `information_schema.*`, or a column a CTE, derived
//!   table, inline function or view of the bundle builds from one) never meets a registry,
//!   `#temp` or table-variable column in a comparison, `like`, `in`, `case`/`coalesce`/
//!   `isnull` result, union column or `+`/`concat` chain without `collate`: in a partially
//!   contained database the catalog has its own collation (Msg 468/451/457;
//!   `catalog_collation.rs`).
//! * R28 `role-grants` — every kind of per-feed and per-outbox object is granted by
//!   `grant_feed_roles` / `grant_outbox_roles` to a role of its table, or listed as granted
//!   to no one with the reason; nothing is granted on a schema (EXECUTE on the schema
//!   `changefeed` would reach every feed and outbox); only objects that check their caller
//!   are granted to `public` (`role_grants.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

mod catalog_collation;
#[cfg(test)]
mod catalog_collation_tests;
#[cfg(test)]
mod coverage;
#[cfg(test)]
mod generated;
mod lex;
mod never_wait;
mod outbox_columns;
mod reserved_names;
mod role_grants;
mod schema;
mod typed;
#[cfg(test)]
mod typed_tests;

use lex::{Kind, Token, code_mask, comment_free, in_strings, lex, snippet};
use schema::Schema;

// ---------------------------------------------------------------------------------------
// Violations
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rule {
    Lexical,
    FileName,
    NoGo,
    OneModuleFirst,
    ProcedurePreamble,
    NothingAfterModule,
    TransactionCatch,
    ThrowNumber,
    Template,
    NoTransactionRefused,
    UlidAndTimeTypes,
    IntLiteral,
    CollationMix,
    ImplicitTransactions,
    Truncation,
    CursorParameter,
    ViewReadpast,
    SessionContext,
    FunctionSideEffects,
    BitwiseOperand,
    OrderedFeedInsert,
    LengthUnits,
    PauseOutsideTransaction,
    NeverWaitGuard,
    ReservedNameCollation,
    OutboxColumns,
    CatalogCollation,
    NoRegenerationInMigration,
    RoleGrants,
}

impl Rule {
    fn id(self) -> &'static str {
        match self {
            Rule::Lexical => "R0 lexical",
            Rule::FileName => "R1 file-name",
            Rule::NoGo => "R2 no-go",
            Rule::OneModuleFirst => "R3 one-module-first",
            Rule::ProcedurePreamble => "R4 procedure-preamble",
            Rule::NothingAfterModule => "R5 nothing-after-module",
            Rule::TransactionCatch => "R6 transaction-catch",
            Rule::ThrowNumber => "R7 throw-number",
            Rule::Template => "R8 template",
            Rule::NoTransactionRefused => "R9 no-transaction-refused",
            Rule::UlidAndTimeTypes => "R10 ulid-and-time-types",
            Rule::IntLiteral => "R11 int-literal-range",
            Rule::CollationMix => "R12 collation-mix",
            Rule::ImplicitTransactions => "R13 implicit-transactions",
            Rule::Truncation => "R14 silent-truncation",
            Rule::CursorParameter => "R15 cursor-parameter",
            Rule::ViewReadpast => "R16 view-readpast",
            Rule::SessionContext => "R17 session-context-type",
            Rule::FunctionSideEffects => "R18 function-side-effects",
            Rule::BitwiseOperand => "R19 bitwise-operand",
            Rule::OrderedFeedInsert => "R20 ordered-feed-insert",
            Rule::LengthUnits => "R21 length-units",
            Rule::PauseOutsideTransaction => "R22 pause-outside-transaction",
            Rule::NeverWaitGuard => "R23 never-wait-guard",
            Rule::ReservedNameCollation => "R24 reserved-name-collation",
            Rule::OutboxColumns => "R25 outbox-columns",
            Rule::CatalogCollation => "R26 catalog-collation",
            Rule::NoRegenerationInMigration => "R27 no-regeneration-in-migration",
            Rule::RoleGrants => "R28 role-grants",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    /// 1-based; 0 when the violation is about the file as a whole (its name).
    line: usize,
    rule: Rule,
    message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: [{}] {}", self.file, self.rule.id(), self.message)
        } else {
            write!(
                f,
                "{}:{}: [{}] {}",
                self.file,
                self.line,
                self.rule.id(),
                self.message
            )
        }
    }
}

/// The violations one a line, as a failed assertion lists them.
fn one_a_line(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

struct Sink<'a> {
    file: &'a str,
    out: Vec<Violation>,
}

impl Sink<'_> {
    fn push(&mut self, line: usize, rule: Rule, message: impl Into<String>) {
        self.out.push(Violation {
            file: self.file.to_owned(),
            line,
            rule,
            message: message.into(),
        });
    }
}

// ---------------------------------------------------------------------------------------
// R1: file names
// ---------------------------------------------------------------------------------------

/// `V<version>__<name>.sql` → version, or why the name is wrong.
fn migration_version(name: &str) -> Result<u32, String> {
    let Some(stem) = name.strip_suffix(".sql") else {
        return Err("is not a `.sql` file".to_owned());
    };
    let Some(rest) = stem.strip_prefix('V') else {
        return Err("does not start with an uppercase `V`".to_owned());
    };
    let Some((version, snake)) = rest.split_once("__") else {
        return Err("has no `__` between version and name".to_owned());
    };
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "has version `{version}`, which is not a positive integer"
        ));
    }
    if version.starts_with('0') {
        return Err(format!(
            "has version `{version}`, which has a leading zero or is zero"
        ));
    }
    let version: u32 = version
        .parse()
        .ok()
        .filter(|&v| i32::try_from(v).is_ok())
        .ok_or_else(|| format!("has version `{version}`, larger than refinery's i32"))?;
    if snake.is_empty()
        || !snake
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "has name `{snake}`, which is not snake_case `[a-z0-9_]+`"
        ));
    }
    Ok(version)
}

/// R1 over the names of every entry of `sql/`.
fn lint_file_names(names: &[&str]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut versions: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for name in names {
        match migration_version(name) {
            Ok(v) => versions.entry(v).or_default().push(name),
            Err(why) => out.push(Violation {
                file: format!("sql/{name}"),
                line: 0,
                rule: Rule::FileName,
                message: format!(
                    "`{name}` {why}. Every file in sql/ is a refinery migration named \
                     `V<version>__<snake_name>.sql` (e.g. `V20__create_procedure_x.sql`); \
                     rename it, or move anything that is not a migration out of sql/."
                ),
            }),
        }
    }
    for (version, files) in &versions {
        if files.len() > 1 {
            for name in files {
                out.push(Violation {
                    file: format!("sql/{name}"),
                    line: 0,
                    rule: Rule::FileName,
                    message: format!(
                        "version {version} is used by {} files ({}); give the newest \
                         (unapplied) one the next free version.",
                        files.len(),
                        files.join(", ")
                    ),
                });
            }
        }
    }
    if let Some((&max, _)) = versions.last_key_value() {
        for missing in (1..max).filter(|v| !versions.contains_key(v)) {
            out.push(Violation {
                file: format!("sql/V{missing}__*.sql"),
                line: 0,
                rule: Rule::FileName,
                message: format!(
                    "version {missing} is missing: versions must run 1, 2, …, {max} without \
                     gaps. Renumber the newest unapplied file(s) to close the gap (never \
                     rename a file that was already applied)."
                ),
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Per-file rules
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModuleKind {
    Procedure,
    Function,
    View,
    Trigger,
}

impl ModuleKind {
    fn from_word(t: &Token<'_>) -> Option<Self> {
        if t.is_any(&["procedure", "proc"]) {
            Some(ModuleKind::Procedure)
        } else if t.is("function") {
            Some(ModuleKind::Function)
        } else if t.is("view") {
            Some(ModuleKind::View)
        } else if t.is("trigger") {
            Some(ModuleKind::Trigger)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            ModuleKind::Procedure => "procedure",
            ModuleKind::Function => "function",
            ModuleKind::View => "view",
            ModuleKind::Trigger => "trigger",
        }
    }
}

struct Module {
    kind: ModuleKind,
    /// Index (in the code tokens) of `CREATE` or `ALTER`.
    statement: usize,
    /// Index just after the module's name.
    name_end: usize,
    /// Name parts with quoting undone, e.g. `["changefeed", "read_feed:x.y"]`.
    name_parts: Vec<String>,
    /// The name as written.
    name_text: String,
    line: usize,
}

fn find_modules(src: &str, code: &[&Token<'_>]) -> Vec<Module> {
    let mut modules = Vec::new();
    for i in 0..code.len() {
        let kind_at = if code[i].is("create") {
            if code.get(i + 1).is_some_and(|t| t.is("or"))
                && code.get(i + 2).is_some_and(|t| t.is("alter"))
            {
                i + 3
            } else {
                i + 1
            }
        } else if code[i].is("alter") && (i == 0 || !code[i - 1].is("or")) {
            i + 1
        } else {
            continue;
        };
        let Some(kind) = code.get(kind_at).and_then(|t| ModuleKind::from_word(t)) else {
            continue;
        };
        let mut j = kind_at + 1;
        let mut name_parts = Vec::new();
        while let Some(t) = code.get(j) {
            if matches!(t.kind, Kind::Word | Kind::Ident) {
                name_parts.push(t.ident_value());
                j += 1;
                if code.get(j).is_some_and(|t| t.is_punct(b'.')) {
                    j += 1;
                    continue;
                }
            }
            break;
        }
        let name_text = if j > kind_at + 1 {
            src[code[kind_at + 1].start..code[j - 1].end()].to_owned()
        } else {
            String::from("<no name>")
        };
        modules.push(Module {
            kind,
            statement: i,
            name_end: j,
            name_parts,
            name_text,
            line: code[i].line,
        });
    }
    modules
}

/// The module a file creates (the first), if any.
fn module_of(src: &str) -> Option<Module> {
    let lexed = lex(src);
    find_modules(src, &lexed.code()).into_iter().next()
}

/// The `AS` that starts the module's body: the first `AS` outside parentheses after the
/// name that is not `@param AS type` nor `EXECUTE AS`.
fn body_as(code: &[&Token<'_>], module: &Module) -> Option<usize> {
    let mut depth = 0i32;
    for i in module.name_end..code.len() {
        let t = code[i];
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth -= 1;
        } else if depth == 0 && t.is("as") {
            let prev = code[i - 1];
            if prev.kind == Kind::Word && prev.text.starts_with('@')
                || prev.is_any(&["execute", "exec"])
            {
                continue;
            }
            return Some(i);
        }
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    Try,
    Catch,
    Begin,
    Case,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    kind: BlockKind,
    open: usize,
    /// Index of the matching `END`, if any.
    close: Option<usize>,
}

/// `BEGIN TRAN[SACTION]` or `BEGIN DISTRIBUTED TRAN[SACTION]` at `i`.
fn is_begin_transaction(code: &[&Token<'_>], i: usize) -> bool {
    code[i].is("begin")
        && match code.get(i + 1) {
            Some(t) if t.is_any(&["tran", "transaction"]) => true,
            Some(t) if t.is("distributed") => code
                .get(i + 2)
                .is_some_and(|t| t.is_any(&["tran", "transaction"])),
            _ => false,
        }
}

/// Every `BEGIN … END` / `BEGIN TRY|CATCH … END TRY|CATCH` / `CASE … END` from `from` on.
fn blocks(code: &[&Token<'_>], from: usize) -> Vec<Block> {
    let mut all: Vec<Block> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    for i in from..code.len() {
        let t = code[i];
        let next = code.get(i + 1);
        if t.is("begin") {
            if is_begin_transaction(code, i)
                || next.is_some_and(|n| n.is_any(&["dialog", "conversation"]))
            {
                continue;
            }
            let kind = match next {
                Some(n) if n.is("try") => BlockKind::Try,
                Some(n) if n.is("catch") => BlockKind::Catch,
                _ => BlockKind::Begin,
            };
            stack.push(all.len());
            all.push(Block {
                kind,
                open: i,
                close: None,
            });
        } else if t.is("case") {
            stack.push(all.len());
            all.push(Block {
                kind: BlockKind::Case,
                open: i,
                close: None,
            });
        } else if t.is("end")
            && !next.is_some_and(|n| n.is("conversation"))
            && let Some(b) = stack.pop()
        {
            all[b].close = Some(i);
        }
    }
    all
}

/// `SET opt [, opt]* ON|OFF [;]` at `i` → (lowercased options, on?, index after).
fn parse_set(code: &[&Token<'_>], i: usize) -> Option<(Vec<String>, bool, usize)> {
    if !code.get(i)?.is("set") {
        return None;
    }
    let mut j = i + 1;
    let mut options = Vec::new();
    loop {
        let t = code.get(j)?;
        if t.kind != Kind::Word {
            return None;
        }
        options.push(t.text.to_ascii_lowercase());
        j += 1;
        if code.get(j).is_some_and(|t| t.is_punct(b',')) {
            j += 1;
        } else {
            break;
        }
    }
    let on = match code.get(j) {
        Some(t) if t.is("on") => true,
        Some(t) if t.is("off") => false,
        _ => return None,
    };
    j += 1;
    if code.get(j).is_some_and(|t| t.is_punct(b';')) {
        j += 1;
    }
    Some((options, on, j))
}

/// Inside a catch block: `IF @@TRANCOUNT > 0 ROLLBACK [TRAN[SACTION] [name]]; THROW;`.
fn catch_rolls_back_and_rethrows(code: &[&Token<'_>], block: &Block) -> bool {
    let end = block.close.unwrap_or(code.len());
    (block.open..end).any(|i| {
        let at = |j: usize| code.get(j).copied();
        if !code[i].is("if") {
            return false;
        }
        let mut j = i + 1;
        let mut parens = 0;
        while at(j).is_some_and(|t| t.is_punct(b'(')) {
            parens += 1;
            j += 1;
        }
        if !(at(j).is_some_and(|t| t.is("@@trancount"))
            && at(j + 1).is_some_and(|t| t.is_punct(b'>'))
            && at(j + 2).is_some_and(|t| t.kind == Kind::Number && t.text == "0"))
        {
            return false;
        }
        j += 3;
        for _ in 0..parens {
            if !at(j).is_some_and(|t| t.is_punct(b')')) {
                return false;
            }
            j += 1;
        }
        if !at(j).is_some_and(|t| t.is("rollback")) {
            return false;
        }
        j += 1;
        if at(j).is_some_and(|t| t.is_any(&["tran", "transaction"])) {
            j += 1;
            if at(j).is_some_and(|t| matches!(t.kind, Kind::Word | Kind::Ident) && !t.is("throw")) {
                j += 1;
            }
        }
        at(j).is_some_and(|t| t.is_punct(b';'))
            && at(j + 1).is_some_and(|t| t.is("throw"))
            && at(j + 2).is_some_and(|t| t.is_punct(b';'))
    })
}

const TEMPLATE_INFIX: &str = ":changefeed.";
const MARKER: &str = "__template_key__";
const JOIN: &str = "e.__template_key__ = r.__template_key__";
/// Offsets of the two markers inside `JOIN`.
const JOIN_MARKERS: [usize; 2] = [2, 23];

/// A per-feed (or per-outbox) template: `[changefeed].[<kind>:changefeed.__template…__]`,
/// e.g. `[changefeed].[read_feed:changefeed.__template__]`.
fn is_template(module: &Module) -> bool {
    let parts = &module.name_parts;
    let Some(object) = parts.last() else {
        return false;
    };
    let schema_ok = parts.len() < 2 || parts[parts.len() - 2].eq_ignore_ascii_case("changefeed");
    let lower = object.to_ascii_lowercase();
    schema_ok
        && lower
            .split_once(TEMPLATE_INFIX)
            .is_some_and(|(kind, table)| {
                !kind.is_empty() && table.starts_with("__template") && table.ends_with("__")
            })
}

fn in_join(text: &str, pos: usize) -> bool {
    JOIN_MARKERS.iter().any(|&offset| {
        pos.checked_sub(offset)
            .and_then(|from| text.get(from..))
            .is_some_and(|rest| rest.starts_with(JOIN))
    })
}

const MARKER_FIX: &str = "the generator that copies templates (upgrade_feed) only rewrites \
    the marker in two forms: bare (a column list, replaced by `[k1], [k2]`) and the exact \
    join text `e.__template_key__ = r.__template_key__` (replaced by `e.[k1] = r.[k1] and \
    e.[k2] = r.[k2]`); any other form breaks for composite keys. Select the bare column, or \
    write the join exactly like that (aliases `e` and `r`, single spaces)";

fn lint_template(src: &str, code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    let s = module.statement;
    let begins_right = code[s].is("create")
        && code.get(s + 2).is_some_and(|t| t.is("alter"))
        && &src[code[s].start..code[s + 2].end()] == "create or alter";
    if !begins_right {
        sink.push(
            module.line,
            Rule::Template,
            format!(
                "the template {} `{}` must begin with exactly `create or alter` (lowercase, \
                 single spaces): the generator that copies templates (upgrade_feed) looks for \
                 that text in the definition and re-runs it for every feed, also for feeds \
                 that already have the object. Write `create or alter {} {}`.",
                module.kind.name(),
                module.name_text,
                module.kind.name(),
                module.name_text
            ),
        );
    }
    for (i, t) in code.iter().enumerate() {
        let lower = t.text.to_ascii_lowercase();
        if !lower.contains(MARKER) {
            continue;
        }
        match t.kind {
            Kind::Word => {
                if t.text != MARKER {
                    sink.push(
                        t.line,
                        Rule::Template,
                        format!(
                            "`{}` is not the exact marker `{MARKER}`: the generator replaces \
                             it case-sensitively and as a whole word. Write `{MARKER}`.",
                            t.text
                        ),
                    );
                } else if !in_join(src, t.start) && i > 0 && code[i - 1].is_punct(b'.') {
                    let qualifier = if i >= 2 { code[i - 2].text } else { "" };
                    sink.push(
                        t.line,
                        Rule::Template,
                        format!("`{qualifier}.{MARKER}` is a qualified key marker. {MARKER_FIX}."),
                    );
                }
            }
            Kind::Ident => sink.push(
                t.line,
                Rule::Template,
                format!(
                    "`{}` quotes the key marker: the generator would produce nested quotes \
                     (`[[k1], [k2]]`). {MARKER_FIX}.",
                    t.text
                ),
            ),
            Kind::Str => {
                let value = t.string_value();
                let lower_value = value.to_ascii_lowercase();
                for (pos, _) in lower_value.match_indices(MARKER) {
                    let line = t.line + value[..pos].matches('\n').count();
                    let before = value[..pos].trim_end();
                    if &value[pos..pos + MARKER.len()] != MARKER {
                        sink.push(
                            line,
                            Rule::Template,
                            format!(
                                "the key marker in this string is not spelled exactly \
                                 `{MARKER}`; the generator replaces it case-sensitively."
                            ),
                        );
                    } else if before.ends_with('.') && !in_join(&value, pos) {
                        sink.push(
                            line,
                            Rule::Template,
                            format!(
                                "a qualified `.{MARKER}` inside a string literal. {MARKER_FIX}."
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

fn lint_module(src: &str, code: &[&Token<'_>], module: &Module, sink: &mut Sink<'_>) {
    let kind = module.kind;
    let what = format!("{} `{}`", kind.name(), module.name_text);
    let Some(body_as) = body_as(code, module) else {
        sink.push(
            module.line,
            Rule::NothingAfterModule,
            format!(
                "cannot find the `AS` that starts the body of {what}; write the module as \
                 `create or alter {} <name> … as …`.",
                kind.name()
            ),
        );
        return;
    };
    let body = body_as + 1;
    let block_body =
        code.get(body).is_some_and(|t| t.is("begin")) && !is_begin_transaction(code, body);
    let all_blocks = if block_body {
        blocks(code, body)
    } else {
        Vec::new()
    };

    // R5
    if block_body {
        match all_blocks.first().and_then(|b| b.close) {
            None => sink.push(
                code[body].line,
                Rule::NothingAfterModule,
                format!(
                    "the `BEGIN` that opens the body of {what} has no matching `END` \
                     (count the BEGIN/CASE … END pairs); close the body with `END` at the end \
                     of the file."
                ),
            ),
            Some(end) => {
                let mut after = end + 1;
                if code.get(after).is_some_and(|t| t.is_punct(b';')) {
                    after += 1;
                }
                if let Some(t) = code.get(after) {
                    sink.push(
                        t.line,
                        Rule::NothingAfterModule,
                        format!(
                            "`{}` follows the final `END` (line {}) of {what}. SQL Server \
                             makes everything up to the end of the batch part of the \
                             {} body, so this would run inside it on every call instead of \
                             once at migration time. Move it to its own migration file (the \
                             next free `V<n>__<name>.sql`).",
                            snippet(code, after),
                            code[end].line,
                            kind.name()
                        ),
                    );
                }
            }
        }
    } else if matches!(kind, ModuleKind::Procedure | ModuleKind::Trigger) {
        let line = code.get(body).map_or(code[body_as].line, |t| t.line);
        sink.push(
            line,
            Rule::NothingAfterModule,
            format!(
                "the body of {what} is not enclosed in `AS BEGIN … END`; write `as begin … \
                 end` so that its end is visible and nothing can follow it."
            ),
        );
    } else {
        // Inline table-valued function or view: one statement, ended by `;`.
        let mut depth = 0i32;
        let mut semicolon = None;
        for (i, t) in code.iter().enumerate().skip(body) {
            if t.is_punct(b'(') {
                depth += 1;
            } else if t.is_punct(b')') {
                depth -= 1;
            } else if depth == 0 && t.is_punct(b';') {
                semicolon = Some(i);
                break;
            }
        }
        match semicolon {
            None => sink.push(
                code.last().map_or(module.line, |t| t.line),
                Rule::NothingAfterModule,
                format!(
                    "the statement of {what} does not end with `;`. End it with `;` at the \
                     end of the file, so that anything after it stands out."
                ),
            ),
            Some(semi) => {
                if let Some(t) = code.get(semi + 1) {
                    sink.push(
                        t.line,
                        Rule::NothingAfterModule,
                        format!(
                            "`{}` follows the `;` (line {}) that ends {what}. A {} is one \
                             statement and the only thing in its batch; move this to its own \
                             migration file (the next free `V<n>__<name>.sql`).",
                            snippet(code, semi + 1),
                            code[semi].line,
                            kind.name()
                        ),
                    );
                }
            }
        }
    }

    if kind == ModuleKind::Procedure {
        // R4
        let first = body + 1;
        let found = |i: usize| {
            code.get(i).map_or_else(
                || (module.line, "nothing".to_owned()),
                |t| (t.line, format!("`{}`", snippet(code, i))),
            )
        };
        let preamble_ok = block_body
            && match parse_set(code, first) {
                Some((options, true, next)) => {
                    let has = |o: &[String], name: &str| o.iter().any(|x| x == name);
                    let mut nocount = has(&options, "nocount");
                    let mut xact_abort = has(&options, "xact_abort");
                    if nocount != xact_abort
                        && let Some((second, true, _)) = parse_set(code, next)
                    {
                        nocount |= has(&second, "nocount");
                        xact_abort |= has(&second, "xact_abort");
                    }
                    nocount && xact_abort
                }
                _ => false,
            };
        if !preamble_ok {
            let (line, what_found) = if block_body {
                found(first)
            } else {
                found(body)
            };
            sink.push(
                line,
                Rule::ProcedurePreamble,
                format!(
                    "the first statement of {what} after `AS BEGIN` must be `set nocount, \
                     xact_abort on;` (found {what_found}). Without XACT_ABORT a run-time \
                     error can leave the caller's transaction open; without NOCOUNT every \
                     statement sends a row count (ARCHITECTURE.md)."
                ),
            );
        }

        // R6
        for t in (body..code.len()).filter(|&i| is_begin_transaction(code, i)) {
            let covered = all_blocks.iter().any(|b| {
                b.kind == BlockKind::Try
                    && b.open < t
                    && b.close.is_some_and(|close| t < close)
                    && b.close
                        .and_then(|close| {
                            all_blocks.iter().find(|c| {
                                c.kind == BlockKind::Catch
                                    && (c.open == close + 2
                                        || c.open == close + 3 && code[close + 2].is_punct(b';'))
                            })
                        })
                        .is_some_and(|c| catch_rolls_back_and_rethrows(code, c))
            });
            if !covered {
                sink.push(
                    code[t].line,
                    Rule::TransactionCatch,
                    format!(
                        "`{}` in {what} is not inside a `BEGIN TRY` whose `BEGIN CATCH` rolls \
                         back and re-raises. Wrap it as `begin try begin transaction; … commit \
                         transaction; end try begin catch if @@trancount > 0 rollback \
                         transaction; throw; end catch;` (ARCHITECTURE.md; the `;` before \
                         `throw` is required).",
                        snippet(code, t)
                            .split(';')
                            .next()
                            .unwrap_or_default()
                            .trim()
                    ),
                );
            }
        }
    }

    // R8
    if is_template(module) {
        lint_template(src, code, module, sink);
    }
}

/// R9 over a token stream. In dynamic SQL (`in_string`) the bare words `backup`, `restore`
/// and `reconfigure` count only in statement form, so that prose in messages does not.
fn refused_statements(code: &[&Token<'_>], in_string: bool) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for i in 0..code.len() {
        let t = code[i];
        let next = code.get(i + 1).copied();
        let next2 = code.get(i + 2).copied();
        let hit = if t.is_any(&["alter", "create", "drop"]) {
            next.is_some_and(|n| n.is("database"))
                || next.is_some_and(|n| n.is("fulltext"))
                    && next2.is_some_and(|n| n.is_any(&["catalog", "index"]))
        } else if t.is_any(&["backup", "restore"]) {
            !in_string
                || next.is_some_and(|n| {
                    n.is_any(&[
                        "database",
                        "log",
                        "certificate",
                        "master",
                        "service",
                        "headeronly",
                        "filelistonly",
                        "verifyonly",
                        "labelonly",
                    ])
                })
        } else if t.is("reconfigure") {
            !in_string || next.is_none_or(|n| n.is_punct(b';') || n.is("with"))
        } else {
            false
        };
        if hit {
            let words: Vec<&str> = code[i..]
                .iter()
                .take(3)
                .take_while(|t| t.kind == Kind::Word)
                .map(|t| t.text)
                .collect();
            found.push((t.line, words.join(" ")));
        }
    }
    found
}

const TOO_FINE_DATEPARTS: &[&str] = &[
    "millisecond",
    "ms",
    "microsecond",
    "mcs",
    "nanosecond",
    "ns",
];

/// R10 (datediff) over a token stream.
fn fine_datediffs(code: &[&Token<'_>]) -> Vec<(usize, String)> {
    (0..code.len())
        .filter(|&i| {
            code[i].is("datediff")
                && code.get(i + 1).is_some_and(|t| t.is_punct(b'('))
                && code
                    .get(i + 2)
                    .is_some_and(|t| t.is_any(TOO_FINE_DATEPARTS))
        })
        .map(|i| (code[i].line, code[i + 2].text.to_owned()))
        .collect()
}

fn is_go_line(line: &str) -> bool {
    let t = line.trim();
    let Some(rest) = t.get(..2).filter(|go| go.eq_ignore_ascii_case("go")) else {
        return false;
    };
    let rest = t[rest.len()..].trim_start();
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit()).trim();
    let rest = rest.strip_prefix(';').unwrap_or(rest).trim();
    rest.is_empty()
}

/// Rules R0 and R2–R19 for one file, knowing only what the file itself declares; `file`
/// is the name shown in messages.
fn lint_file(file: &str, src: &str) -> Vec<Violation> {
    lint_file_in(file, src, &Schema::of(file, src))
}

/// Rules R0 and R2–R19 for one file, with the declarations of the whole bundle.
fn lint_file_in(file: &str, src: &str, schema: &Schema) -> Vec<Violation> {
    let mut sink = Sink {
        file,
        out: Vec::new(),
    };
    let lexed = lex(src);
    for (line, message) in &lexed.problems {
        sink.push(*line, Rule::Lexical, message.clone());
    }
    let code: Vec<&Token<'_>> = lexed.code();

    // R2
    for (n, line) in code_mask(src, &lexed.tokens).split('\n').enumerate() {
        if is_go_line(line) {
            sink.push(
                n + 1,
                Rule::NoGo,
                format!(
                    "`{}` is a batch separator of client tools, not T-SQL: refinery sends \
                     the file as one batch and SQL Server rejects it. Remove it; if the file \
                     holds two batches, split it into two migration files.",
                    line.trim()
                ),
            );
        }
    }

    // R3
    let modules = find_modules(src, &code);
    if let Some(first) = modules.first()
        && first.statement != 0
    {
        sink.push(
            first.line,
            Rule::OneModuleFirst,
            format!(
                "the {} `{}` is not the first statement of the file (the file starts with \
                 `{}` at line {}). SQL Server requires CREATE {} to start its batch: keep \
                 only comments before it and move the other statements to their own \
                 migration file.",
                first.kind.name(),
                first.name_text,
                snippet(&code, 0),
                code[0].line,
                first.kind.name().to_ascii_uppercase()
            ),
        );
    }
    if let Some(first) = modules.first() {
        for extra in &modules[1..] {
            sink.push(
                extra.line,
                Rule::OneModuleFirst,
                format!(
                    "a second module, {} `{}`, in a file that already creates {} `{}` (line \
                     {}): one file holds one module, since everything after a module's \
                     CREATE is part of its body. Move it to its own migration file.",
                    extra.kind.name(),
                    extra.name_text,
                    first.kind.name(),
                    first.name_text,
                    first.line
                ),
            );
        }
    }
    for (i, _) in code.iter().enumerate().filter(|(i, t)| {
        *i > 0 && t.is("create") && code.get(i + 1).is_some_and(|n| n.is("schema"))
    }) {
        sink.push(
            code[i].line,
            Rule::OneModuleFirst,
            "`create schema` is not the first statement of the file: SQL Server requires \
             CREATE SCHEMA to start its batch. Move it to its own migration file (or before \
             everything else).",
        );
    }

    // R4, R5, R6, R8
    if let Some(module) = modules.first() {
        lint_module(src, &code, module, &mut sink);
    }

    // R7
    for i in 0..code.len() {
        if !code[i].is("throw") {
            continue;
        }
        let (sign, number) = match code.get(i + 1) {
            Some(t) if t.is_punct(b'-') || t.is_punct(b'+') => (t.text, code.get(i + 2)),
            other => ("", other),
        };
        let Some(number) = number.filter(|t| t.kind == Kind::Number) else {
            continue;
        };
        let value: Option<i64> = format!("{sign}{}", number.text).parse().ok();
        if !value.is_some_and(|v| (51_000..=51_999).contains(&v)) {
            sink.push(
                code[i].line,
                Rule::ThrowNumber,
                format!(
                    "`throw {sign}{}` uses a number outside 51000–51999, the range this \
                     project reserves for its errors (ARCHITECTURE.md). Pick a number in that \
                     range and add it to the error table in README.md.",
                    number.text
                ),
            );
        }
    }

    // R9
    let mut refused = refused_statements(&code, false);
    refused.extend(in_strings(&code, |inner| refused_statements(inner, true)));
    for (line, what) in refused {
        sink.push(
            line,
            Rule::NoTransactionRefused,
            format!(
                "`{what}` cannot run inside a user transaction, and refinery runs every \
                 migration in one. Do it outside the migrations (e.g. in the test or \
                 deployment setup), not in sql/."
            ),
        );
    }

    // R10
    for (n, line) in comment_free(src, &lexed.tokens).split('\n').enumerate() {
        let lower = line.to_ascii_lowercase();
        if lower.contains("ulid") && lower.contains("uniqueidentifier") {
            sink.push(
                n + 1,
                Rule::UlidAndTimeTypes,
                "a ULID next to `uniqueidentifier`: store ULIDs as `binary(16)`, never \
                 `uniqueidentifier`, whose sort order scrambles the bytes (ARCHITECTURE.md).",
            );
        }
    }
    let mut datediffs = fine_datediffs(&code);
    datediffs.extend(in_strings(&code, fine_datediffs));
    for (line, part) in datediffs {
        sink.push(
            line,
            Rule::UlidAndTimeTypes,
            format!(
                "`datediff({part}, …)` returns int, which overflows after ~24.8 days in \
                 milliseconds (sooner for finer units). Use `datediff_big({part}, …)`."
            ),
        );
    }

    // R11–R19
    typed::lint(src, &code, modules.first(), schema, &mut sink);

    // R21
    if !is_frozen(file) {
        length_units(&code, &mut sink);
    }

    // R22
    pauses_in_transactions(&code, &mut sink);

    // R24
    if !is_frozen(file) {
        for (line, name) in reserved_names::violations(&code) {
            sink.push(
                line,
                Rule::ReservedNameCollation,
                format!(
                    "`{name}` is compared with a column name changefeed adds next to a key \
                     without `collate`: it then compares in the database's collation, and in a \
                     case-sensitive database `ULID` passes, while tempdb (read_feed's copy of \
                     the key, a caller's #read) may take `ULID` and `ulid` for one name (Msg \
                     2705). Say which spellings count: `{name} collate \
                     Latin1_General_100_CI_AI in (…)` (or `_BIN2` for the exact name)."
                ),
            );
        }
    }

    // R27
    if !is_frozen(file) {
        let migration_end = modules.first().map_or(code.len(), |m| m.statement);
        for (line, name) in regenerations(&code[..migration_end]) {
            sink.push(
                line,
                Rule::NoRegenerationInMigration,
                format!(
                    "this migration runs `changefeed.{name}`: it would regenerate every object \
                     in the migration's one transaction, and every call of a regenerated \
                     procedure would wait until the migration commits. Remove it: the code \
                     is regenerated after the migrations, object by object, by `exec \
                     changefeed.upgrade_all_feeds @only_outdated = 1` (migrate runs it; \
                     ARCHITECTURE.md)."
                ),
            );
        }
    }

    let mut out = sink.out;
    out.sort_by_key(|v| (v.line, v.rule));
    out
}

/// R27: `exec[ute] [@status =] changefeed.upgrade_all_feeds | upgrade_feed | upgrade_outbox`
/// (either part bracketed or not) → (line, procedure name).
fn regenerations(code: &[&Token<'_>]) -> Vec<(usize, String)> {
    const REGENERATORS: [&str; 3] = ["upgrade_all_feeds", "upgrade_feed", "upgrade_outbox"];
    let mut found = Vec::new();
    for i in 0..code.len() {
        if !code[i].is_any(&["exec", "execute"]) {
            continue;
        }
        let mut j = i + 1;
        // `exec @status = changefeed.…`
        if code.get(j).is_some_and(|t| t.text.starts_with('@'))
            && code.get(j + 1).is_some_and(|t| t.is_punct(b'='))
        {
            j += 2;
        }
        let (Some(schema), Some(dot), Some(name)) = (code.get(j), code.get(j + 1), code.get(j + 2))
        else {
            continue;
        };
        let name = name.ident_value().to_ascii_lowercase();
        if schema.ident_value().eq_ignore_ascii_case("changefeed")
            && dot.is_punct(b'.')
            && REGENERATORS.contains(&name.as_str())
        {
            found.push((code[i].line, name));
        }
    }
    found
}

/// Whether `file` (`sql/V<n>__name.sql`, or an object `… (generated from sql/V<n>__name.sql)`)
/// is, or is generated from, a released migration: its version is at most the last one
/// listed in tests/frozen_migrations.txt. Names outside `sql/` (the lint's own tests) never
/// are.
fn is_frozen(file: &str) -> bool {
    let Some(at) = file.rfind("sql/V") else {
        return false;
    };
    let name = file[at + 4..].split([')', ' ']).next().unwrap_or_default();
    let last_frozen = include_str!("../frozen_migrations.txt")
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    migration_version(name).is_ok_and(|version| version <= last_frozen)
}

/// R22: a `waitfor`, or an `exec` of `changefeed.pause_…`, after a `begin tran[saction]`
/// and before the next `commit` or `rollback`, in text order. Text order is the order of a
/// try block's statements (its `commit` comes before the catch block's `rollback`), which
/// is how every procedure of the bundle writes a transaction.
fn pauses_in_transactions(code: &[&Token<'_>], sink: &mut Sink<'_>) {
    let mut open_since: Option<usize> = None;
    for i in 0..code.len() {
        if is_begin_transaction(code, i) {
            open_since = Some(code[i].line);
            continue;
        }
        if code[i].is_any(&["commit", "rollback"]) {
            open_since = None;
            continue;
        }
        let Some(began) = open_since else {
            continue;
        };
        let pause_call = i >= 2
            && code[i - 1].is_punct(b'.')
            && code[i]
                .ident_value()
                .to_ascii_lowercase()
                .starts_with("pause_")
            && code[i - 2].ident_value().eq_ignore_ascii_case("changefeed");
        if code[i].is("waitfor") || pause_call {
            sink.push(
                code[i].line,
                Rule::PauseOutsideTransaction,
                format!(
                    "a pause inside the transaction begun on line {began}: it would hold every \
                     lock the transaction took until the pause ends, and enqueues, claims and \
                     acknowledgements would wait for it. Commit (or roll back) first and \
                     pause between transactions, as read_feed and claim do."
                ),
            );
        }
    }
}

/// R21: `len(…)`, or a sum or difference of terms starting with one, compared with a
/// non-zero integer literal.
fn length_units(code: &[&Token<'_>], sink: &mut Sink<'_>) {
    let is_comparison = |t: &Token<'_>| t.is_punct(b'<') || t.is_punct(b'>') || t.is_punct(b'=');
    for i in 0..code.len() {
        if !(code[i].is("len") && code.get(i + 1).is_some_and(|t| t.is_punct(b'('))) {
            continue;
        }
        let Some(close) = typed::close_paren(code, i + 1) else {
            continue;
        };
        // Through `+ len(b)`, `- 1`, … to the operator.
        let mut k = close + 1;
        while code
            .get(k)
            .is_some_and(|t| t.is_punct(b'+') || t.is_punct(b'-'))
        {
            k += 1;
            if code.get(k + 1).is_some_and(|t| t.is_punct(b'(')) {
                match typed::close_paren(code, k + 1) {
                    Some(end) => k = end + 1,
                    None => break,
                }
            } else {
                k += 1;
            }
        }
        if !code.get(k).is_some_and(|t| is_comparison(t)) {
            continue;
        }
        while code.get(k).is_some_and(|t| is_comparison(t)) {
            k += 1;
        }
        let Some(limit) = code.get(k).filter(|t| t.kind == Kind::Number) else {
            continue;
        };
        if limit.text.trim_start_matches('0').is_empty() {
            continue;
        }
        sink.push(
            code[i].line,
            Rule::LengthUnits,
            format!(
                "`len(…)` compared with {}: len() counts a surrogate pair (an emoji) once \
                 under `_SC` collations and ignores trailing spaces, but nvarchar(n) columns \
                 and identifiers count UTF-16 code units, so a value that passes this check \
                 can still be too long (Msg 2628, or a name cut by parsename/quotename). \
                 Compare `datalength(x) / 2` for nvarchar (`datalength(x)` for varchar) \
                 (ARCHITECTURE.md).",
                limit.text
            ),
        );
    }
}

/// R1 over the names plus every per-file rule over the `.sql` files, R20, R23, R25, R26 and
/// R27.
fn lint_bundle(files: &[(String, String)]) -> Vec<Violation> {
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    let mut out = lint_file_names(&names);
    let schema = bundle_schema(files);
    for (name, text) in files.iter().filter(|(name, _)| name.ends_with(".sql")) {
        out.extend(lint_file_in(&format!("sql/{name}"), text, &schema));
    }
    out.extend(lint_feed_inserts(files));
    out.extend(lint_never_wait(files));
    out.extend(outbox_columns::lint(&current_files(files)));
    out.extend(catalog_collation::lint(files, &schema));
    out.extend(role_grants::lint(&current_files(files)));
    out
}

/// A `.sql` file of the bundle that no later file replaces: its name, its text, and the
/// module it defines, if any.
struct Current<'a> {
    name: &'a str,
    text: &'a str,
    module: Option<Module>,
}

/// The `.sql` files of `files` (in bundle order) whose module, if they define one, no later
/// file defines again: what runs. A file without a module is always current.
fn current_files(files: &[(String, String)]) -> Vec<Current<'_>> {
    let sql: Vec<&(String, String)> = files.iter().filter(|(n, _)| n.ends_with(".sql")).collect();
    let modules: Vec<Option<Module>> = sql.iter().map(|(_, text)| module_of(text)).collect();
    let keys: Vec<Option<String>> = modules
        .iter()
        .map(|m| m.as_ref().map(|m| m.name_parts.join(".").to_lowercase()))
        .collect();
    let mut out = Vec::new();
    for (index, ((name, text), module)) in sql.iter().zip(modules).enumerate() {
        let replaced = keys[index].as_ref().is_some_and(|own| {
            keys[index + 1..]
                .iter()
                .any(|later| later.as_ref() == Some(own))
        });
        if !replaced {
            out.push(Current { name, text, module });
        }
    }
    out
}

/// R23 over the newest definition of every procedure that must never wait.
fn lint_never_wait(files: &[(String, String)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for current in current_files(files) {
        let Some(module) = &current.module else {
            continue;
        };
        let Some(tables) = module
            .name_parts
            .last()
            .and_then(|name| never_wait::guarded_tables(name))
        else {
            continue;
        };
        let lexed = lex(current.text);
        for (line, table) in never_wait::unguarded_reads(&lexed.code(), tables) {
            out.push(Violation {
                file: format!("sql/{}", current.name),
                line,
                rule: Rule::NeverWaitGuard,
                message: never_wait::message(&module.name_text, &table),
            });
        }
    }
    out
}

/// R20 over the newest definition of every module (files in bundle order).
fn lint_feed_inserts(files: &[(String, String)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for current in current_files(files) {
        let (name, lexed) = (current.name, lex(current.text));
        for line in unordered_feed_inserts(&lexed.code()) {
            out.push(Violation {
                file: format!("sql/{name}"),
                line,
                rule: Rule::OrderedFeedInsert,
                message: "an insert into a feed table without `order by` the ULID and \
                          `option (maxdop 1)`: a parallel plan may insert a later ULID before \
                          an earlier one, and a reader waiting on the later row then passes \
                          the earlier one for good (ARCHITECTURE.md, read_feed). Add both."
                    .to_owned(),
            });
        }
    }
    out
}

/// The lines of `insert into [changefeed].[feed:…]` statements (up to their `;`) that lack
/// `order by` or `option (maxdop 1)`.
fn unordered_feed_inserts(code: &[&Token<'_>]) -> Vec<usize> {
    let mut lines = Vec::new();
    for i in 0..code.len() {
        let is_feed_insert = code[i].is("insert")
            && code.get(i + 1).is_some_and(|t| t.is("into"))
            && code
                .get(i + 2)
                .is_some_and(|t| t.ident_value().eq_ignore_ascii_case("changefeed"))
            && code.get(i + 3).is_some_and(|t| t.is_punct(b'.'))
            && code
                .get(i + 4)
                .is_some_and(|t| t.ident_value().to_ascii_lowercase().starts_with("feed:"));
        if !is_feed_insert {
            continue;
        }
        let end = (i..code.len())
            .find(|&j| code[j].is_punct(b';'))
            .unwrap_or(code.len());
        let statement = &code[i..end];
        let ordered = statement
            .windows(2)
            .any(|w| w[0].is("order") && w[1].is("by"));
        let serial = statement.windows(5).any(|w| {
            w[0].is("option")
                && w[1].is_punct(b'(')
                && w[2].is("maxdop")
                && w[3].text == "1"
                && w[4].is_punct(b')')
        });
        if !(ordered && serial) {
            lines.push(code[i].line);
        }
    }
    lines
}

/// The declarations of every file of the bundle (code and dynamic DDL).
fn bundle_schema(files: &[(String, String)]) -> Schema {
    let mut schema = Schema::default();
    for (name, text) in files.iter().filter(|(name, _)| name.ends_with(".sql")) {
        schema.add(&format!("sql/{name}"), text);
    }
    schema
}

/// Every entry of `sql/` as (name, text), sorted by version then name. Directories and
/// unreadable files are reported as violations.
fn read_bundle() -> (Vec<(String, String)>, Vec<Violation>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
    let mut files = Vec::new();
    let mut problems = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the SQL bundle {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("directory entry of sql/");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !path.is_file() {
            problems.push(Violation {
                file: format!("sql/{name}"),
                line: 0,
                rule: Rule::FileName,
                message: "is not a regular file: sql/ holds only the migration files. Move \
                          it out of sql/."
                    .to_owned(),
            });
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => files.push((name, text)),
            Err(e) => problems.push(Violation {
                file: format!("sql/{name}"),
                line: 0,
                rule: Rule::Lexical,
                message: format!("cannot be read as UTF-8 text ({e}); save it as UTF-8."),
            }),
        }
    }
    files.sort_by_key(|(name, _)| (migration_version(name).unwrap_or(u32::MAX), name.clone()));
    (files, problems)
}

// ---------------------------------------------------------------------------------------
// The bundle
// ---------------------------------------------------------------------------------------

#[test]
fn bundle_passes_lint() {
    let (files, mut violations) = read_bundle();
    violations.extend(lint_bundle(&files));
    assert!(
        violations.is_empty(),
        "the SQL bundle breaks {} lint rule(s) (tests/sql_lint/, ARCHITECTURE.md):\n{}",
        violations.len(),
        one_a_line(&violations)
    );
}

#[test]
fn bundle_is_non_empty_and_starts_at_version_1() {
    let (files, _) = read_bundle();
    assert!(!files.is_empty(), "sql/ holds no migration files");
    assert!(
        files
            .iter()
            .any(|(name, _)| migration_version(name) == Ok(1)),
        "sql/ has no V1__<name>.sql"
    );
    assert!(
        files
            .iter()
            .any(|(name, _)| name.starts_with("V1__") && name.ends_with(".sql")),
        "sql/ has no V1__<name>.sql"
    );
}

/// The lint really parses every file of the bundle: breaking each one the way an edit could
/// makes the matching rule fire on it.
#[test]
fn broken_copies_of_the_bundle_fail_lint() {
    let (files, _) = read_bundle();
    let mut modules = 0;
    for (name, text) in &files {
        let file = format!("sql/{name}");
        let fires = |src: &str, rule: Rule| lint_file(&file, src).iter().any(|v| v.rule == rule);

        let go = format!("{text}\nGO\n");
        assert!(fires(&go, Rule::NoGo), "{file}: a GO line is not caught");

        let lexed = lex(text);
        let code: Vec<&Token<'_>> = lexed.code();
        let Some(module) = find_modules(text, &code).into_iter().next() else {
            continue;
        };
        modules += 1;
        let grant = format!("{text}\ngrant execute on object::x to public;\n");
        assert!(
            fires(&grant, Rule::NothingAfterModule),
            "{file}: a GRANT after its {} is not caught",
            module.kind.name()
        );
        if module.kind == ModuleKind::Procedure {
            let preamble = text.replacen("set nocount, xact_abort on;", "set nocount on;", 1);
            assert_ne!(&preamble, text, "{file}: no `set nocount, xact_abort on;`");
            assert!(
                fires(&preamble, Rule::ProcedurePreamble),
                "{file}: a missing XACT_ABORT is not caught"
            );
            if code
                .iter()
                .enumerate()
                .any(|(i, _)| is_begin_transaction(&code, i))
            {
                let swallowed = text.replacen("throw;", ";", 1);
                assert!(
                    fires(&swallowed, Rule::TransactionCatch),
                    "{file}: a catch without THROW is not caught"
                );
            }
        }
        let second = text.replacen("--", "select 1;\n--", 1);
        assert!(
            second == *text || fires(&second, Rule::OneModuleFirst),
            "{file}: a statement before its module is not caught"
        );
    }
    assert!(modules > 0, "the bundle has no module at all");
}

// ---------------------------------------------------------------------------------------
// The lint itself: each rule fires on a bad snippet, and not on a good one
// ---------------------------------------------------------------------------------------

const F: &str = "V1__test.sql";

fn rules(src: &str) -> Vec<Rule> {
    lint_file(F, src).into_iter().map(|v| v.rule).collect()
}

#[track_caller]
fn assert_clean(src: &str) {
    let violations = lint_file(F, src);
    assert!(
        violations.is_empty(),
        "expected no violations, got:\n{}",
        one_a_line(&violations)
    );
}

/// For a rule over the whole bundle: `lint` over the bundle with `edit` applied to the file
/// that holds the newest definition of `module` (its last name part, in any case).
fn lint_with_edit(
    module: &str,
    edit: impl Fn(&str) -> String,
    lint: impl Fn(&[Current<'_>]) -> Vec<Violation>,
) -> Vec<Violation> {
    let (mut files, _) = read_bundle();
    let newest = current_files(&files)
        .iter()
        .find(|c| {
            c.module
                .as_ref()
                .and_then(|m| m.name_parts.last())
                .is_some_and(|n| n.eq_ignore_ascii_case(module))
        })
        .map(|c| c.name.to_owned())
        .unwrap_or_else(|| panic!("no definition of {module}"));
    let file = files
        .iter_mut()
        .find(|(name, _)| *name == newest)
        .expect("the file just found");
    let edited = edit(&file.1);
    assert_ne!(edited, file.1, "the edit of {newest} changed nothing");
    file.1 = edited;
    lint(&current_files(&files))
}

/// One of `violations` is `rule`'s and says `words`.
#[track_caller]
fn assert_rule_says(violations: &[Violation], rule: Rule, words: &str) {
    assert!(
        violations
            .iter()
            .any(|v| v.rule == rule && v.message.contains(words)),
        "expected {} saying {words:?}, got {violations:?}",
        rule.id()
    );
}

/// [`assert_fires`] whose message also says `words` (the point of the rule, or its fix).
#[track_caller]
fn assert_fires_saying(src: &str, rule: Rule, line: usize, words: &str) {
    let message = assert_fires(src, rule, line);
    assert!(message.contains(words), "{message}");
}

/// Asserts that `rule` fires on `line`, and returns its message.
#[track_caller]
fn assert_fires(src: &str, rule: Rule, line: usize) -> String {
    let violations = lint_file(F, src);
    match violations.iter().find(|v| v.rule == rule && v.line == line) {
        Some(v) => {
            let shown = v.to_string();
            assert!(
                shown.starts_with(&format!("{F}:{line}: [{}]", rule.id())),
                "{shown}"
            );
            shown
        }
        None => panic!(
            "expected {} at line {line}, got:\n{}",
            rule.id(),
            one_a_line(&violations)
        ),
    }
}

const GOOD_PROCEDURE: &str = "\
-- A comment: create procedure x as select 1; GO
/* nested /* comment */ still a comment: end; grant execute on x to y */
create or alter procedure [changefeed].[good]
    @name nvarchar(100) = N'it''s -- not a comment /* nor this',
    @mode varchar(10) = 'end'
as
begin
    set nocount, xact_abort on;
    set implicit_transactions off;

    declare @x int = case when @mode = 'go' then 1 else 0 end;
    if @name is null
        throw 51000, N'good: @name is null.
GO
end', 1;

    begin try
        begin transaction;
        select [end] = 1, \"go\" = 2, [a]]b] = 3;
        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end; -- end
/* trailing comment */
";

#[test]
fn a_good_procedure_passes() {
    assert_clean(GOOD_PROCEDURE);
}

#[test]
fn tokenizer_handles_comments_strings_and_quoted_identifiers() {
    let src = concat!(
        "select /* a /* b */ c */ N'x''y', 'z' -- tail\n",
        ", [a]]b], \"q\"\"r\", @@trancount, #t, 0x0A;"
    );
    let lexed = lex(src);
    assert!(lexed.problems.is_empty());
    let kinds: Vec<(Kind, &str)> = lexed.tokens.iter().map(|t| (t.kind, t.text)).collect();
    assert_eq!(
        kinds,
        vec![
            (Kind::Word, "select"),
            (Kind::Comment, "/* a /* b */ c */"),
            (Kind::Str, "N'x''y'"),
            (Kind::Punct, ","),
            (Kind::Str, "'z'"),
            (Kind::Comment, "-- tail"),
            (Kind::Punct, ","),
            (Kind::Ident, "[a]]b]"),
            (Kind::Punct, ","),
            (Kind::Ident, "\"q\"\"r\""),
            (Kind::Punct, ","),
            (Kind::Word, "@@trancount"),
            (Kind::Punct, ","),
            (Kind::Word, "#t"),
            (Kind::Punct, ","),
            (Kind::Number, "0x0A"),
            (Kind::Punct, ";"),
        ]
    );
    assert_eq!(lexed.tokens[2].string_value(), "x'y");
    assert_eq!(lexed.tokens[7].ident_value(), "a]b");
    assert_eq!(lexed.tokens[9].ident_value(), "q\"r");
    assert_eq!(lexed.tokens[6].line, 2);
}

#[test]
fn unterminated_comment_string_and_identifier_fire() {
    assert_fires("select 1;\n/* a /* b */ never closed", Rule::Lexical, 2);
    assert_fires("select 'abc;\n", Rule::Lexical, 1);
    assert_fires("select [abc;\n", Rule::Lexical, 1);
}

// R1

#[test]
fn file_names_must_follow_refinery() {
    for bad in [
        "V1_create.sql",
        "v1__create.sql",
        "V01__create.sql",
        "V0__create.sql",
        "V1__Create.sql",
        "V1__create-table.sql",
        "V1__.sql",
        "V1__create.SQL",
        "Vx__create.sql",
        "README.md",
        "U1__create.sql",
    ] {
        let violations = lint_file_names(&[bad]);
        assert!(
            violations.iter().any(|v| v.rule == Rule::FileName
                && v.file == format!("sql/{bad}")
                && v.message.contains("V<version>__<snake_name>.sql")),
            "{bad}: {violations:?}"
        );
    }
    assert!(lint_file_names(&["V1__a.sql", "V2__b_2.sql", "V3__c.sql"]).is_empty());
}

#[test]
fn version_gap_fires() {
    let violations = lint_file_names(&["V1__a.sql", "V2__b.sql", "V4__d.sql"]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].rule, Rule::FileName);
    assert!(violations[0].message.contains("version 3 is missing"));
    // Versions start at 1.
    let violations = lint_file_names(&["V2__b.sql"]);
    assert!(violations[0].message.contains("version 1 is missing"));
}

#[test]
fn duplicate_version_fires() {
    let violations = lint_file_names(&["V1__a.sql", "V2__b.sql", "V2__c.sql"]);
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations.iter().all(|v| v.rule == Rule::FileName
        && v.message.contains("version 2 is used by 2 files")));
}

// R2

#[test]
fn go_line_fires() {
    assert_fires("create table t (a int);\nGO\nselect 1;", Rule::NoGo, 2);
    assert_fires("select 1;\n  go  \n", Rule::NoGo, 2);
    assert_fires("select 1;\nGo;\n", Rule::NoGo, 2);
    assert_fires("select 1;\nGO 2\n", Rule::NoGo, 2);
    assert_fires("select 1;\ngo -- next batch\n", Rule::NoGo, 2);
}

#[test]
fn go_in_a_string_or_comment_or_word_does_not_fire() {
    assert_clean("select N'first\nGO\nsecond';");
    assert_clean("select 'a\n  go 2\n';");
    assert_clean("-- the end\n-- GO\nselect 1;");
    assert_clean("/*\nGO\n/* nested\nGO\n*/\nGO\n*/\nselect 1;");
    assert_clean("select [x\nGO\n];");
    assert_clean("select 1 as gone;\ngoto_label:\nselect 2;");
}

// R3

#[test]
fn module_not_first_fires() {
    let src = "declare @x int = 1;\ncreate or alter view v as select 1 as a;";
    assert_fires_saying(src, Rule::OneModuleFirst, 2, "not the first statement");
    assert_fires(
        "select 1;\nCreate Procedure p as begin set nocount, xact_abort on; end",
        Rule::OneModuleFirst,
        2,
    );
}

#[test]
fn second_module_fires() {
    let src = "create or alter function f() returns int as begin return 1; end\n\
               create or alter view v as select 1 as a;";
    assert_fires_saying(src, Rule::OneModuleFirst, 2, "second module");
}

#[test]
fn modules_in_strings_and_comments_are_not_modules() {
    assert_clean(
        "-- create procedure p\n\
         declare @sql nvarchar(max) = N'create or alter view v as select 1 as a';\n\
         exec sys.sp_executesql @sql;\n\
         create table t (a int);",
    );
}

#[test]
fn create_schema_not_first_fires() {
    assert_fires(
        "create table t (a int);\ncreate schema [s];",
        Rule::OneModuleFirst,
        2,
    );
    assert_clean("-- ours\ncreate schema [s] authorization [dbo];");
}

// R4

#[test]
fn missing_xact_abort_fires() {
    let src = "create or alter procedure p\nas\nbegin\n    set nocount on;\n    select 1;\nend";
    assert_fires_saying(
        src,
        Rule::ProcedurePreamble,
        4,
        "set nocount, xact_abort on",
    );
}

#[test]
fn preamble_must_be_the_first_statement() {
    let src = "create or alter procedure p as\nbegin\n    select 1;\n    \
               set nocount, xact_abort on;\nend";
    assert_fires(src, Rule::ProcedurePreamble, 3);
}

#[test]
fn preamble_variants_pass() {
    assert_clean("CREATE PROCEDURE p AS BEGIN SET NOCOUNT, XACT_ABORT ON; SELECT 1; END");
    assert_clean("create proc p as begin set xact_abort on; set nocount on; select 1; end");
    assert_clean("create proc p as begin set nocount on set xact_abort on select 1 end");
    assert_clean(
        "create or alter procedure p @a as int = 1 with execute as owner as begin \
         set nocount, xact_abort on; end",
    );
}

// R5

#[test]
fn procedure_followed_by_grant_fires() {
    let src = "create or alter procedure p\nas\nbegin\n    set nocount, xact_abort on;\n    \
               select case when 1 = 1 then 1 end;\nend;\ngrant execute on p to public;";
    let message = assert_fires(src, Rule::NothingAfterModule, 7);
    assert!(
        message.contains("`grant execute on p to public`"),
        "{message}"
    );
    assert!(message.contains("final `END` (line 6)"), "{message}");
}

#[test]
fn view_or_inline_function_followed_by_a_statement_fires() {
    assert_fires(
        "create or alter view v as\nselect 1 as a;\ngrant select on v to public;",
        Rule::NothingAfterModule,
        3,
    );
    assert_fires(
        "create or alter function f (@a int) returns table as return\nselect @a as a;\nexec x;",
        Rule::NothingAfterModule,
        3,
    );
    assert_fires(
        "create or alter view v as select 1 as a",
        Rule::NothingAfterModule,
        1,
    );
}

#[test]
fn scalar_function_followed_by_a_statement_fires() {
    assert_fires(
        "create or alter function f() returns int as\nbegin\n  return 1;\nend\nselect 2;",
        Rule::NothingAfterModule,
        5,
    );
}

#[test]
fn procedure_without_begin_end_fires() {
    assert_fires(
        "create procedure p as\nselect 1;",
        Rule::NothingAfterModule,
        2,
    );
}

// R6

#[test]
fn transaction_without_catch_fires() {
    let src = "create procedure p as begin\nset nocount, xact_abort on;\nbegin tran;\n\
               update t set a = 1;\ncommit;\nend";
    assert_fires_saying(
        src,
        Rule::TransactionCatch,
        3,
        "if @@trancount > 0 rollback",
    );
}

#[test]
fn catch_without_rethrow_or_semicolon_fires() {
    let swallowing = "create procedure p as begin\nset nocount, xact_abort on;\n\
                      set implicit_transactions off; begin try\nbegin transaction;\ncommit;\nend try\nbegin catch\n\
                      if @@trancount > 0 rollback;\nend catch\nend";
    assert_fires(swallowing, Rule::TransactionCatch, 4);
    let no_semicolon = swallowing.replace("rollback;\n", "rollback throw;\n");
    assert_fires(&no_semicolon, Rule::TransactionCatch, 4);
    let good = swallowing.replace("rollback;\n", "rollback; throw;\n");
    assert_clean(&good);
}

// R7

#[test]
fn an_unguarded_read_in_a_procedure_that_must_never_wait_fires_unless_replaced() {
    let procedure = |kind: &str, hints: &str| {
        format!(
            "create or alter procedure [changefeed].[{kind}:changefeed.__template_outbox__]\n\
             as\nbegin\n    set nocount, xact_abort on;\n\
             update [changefeed].[__template_outbox__]{hints}\n\
             set status = 3 where id = 1;\nend\n"
        )
    };
    let r23 = |files: &[(&str, &str)]| violations_of(Rule::NeverWaitGuard, files);
    let bare = procedure("requeue", "");
    let pinned = procedure("requeue", " with (readpast)");
    assert_eq!(
        r23(&[("V1__p.sql", &bare)]),
        [("sql/V1__p.sql".to_owned(), 5)]
    );
    assert!(r23(&[("V1__p.sql", &pinned)]).is_empty());
    assert!(
        r23(&[("V1__p.sql", &bare), ("V2__p.sql", &pinned)]).is_empty(),
        "a definition replaced by a later file is not checked"
    );
    assert_eq!(
        r23(&[("V1__p.sql", &pinned), ("V2__p.sql", &bare)]),
        [("sql/V2__p.sql".to_owned(), 5)]
    );
    assert!(
        r23(&[("V1__p.sql", &procedure("enqueue", ""))]).is_empty(),
        "enqueue may wait (for its aggregate's lock): out of scope"
    );
    let message = lint_bundle(&[("V1__p.sql".to_owned(), bare)])
        .into_iter()
        .find(|v| v.rule == Rule::NeverWaitGuard)
        .expect("R23")
        .to_string();
    assert!(
        message.contains("FORCESEEK") && message.contains("READPAST"),
        "{message}"
    );
}

/// Where `rule` fires in a bundle of `(file name, text)`: each violation's file and line.
fn violations_of(rule: Rule, files: &[(&str, &str)]) -> Vec<(String, usize)> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    lint_bundle(&files)
        .into_iter()
        .filter(|v| v.rule == rule)
        .map(|v| (v.file, v.line))
        .collect()
}

#[test]
fn feed_insert_without_order_and_maxdop_fires_unless_a_later_file_replaces_it() {
    let unordered = "create or alter procedure [changefeed].[p]\nas\nbegin\n\
                     set nocount, xact_abort on;\n\
                     insert into [changefeed].[feed:dbo.t] (shard_id, ulid) \
                     select 0, ulid from @moved;\nend\n";
    let ordered = "create or alter procedure [changefeed].[p]\nas\nbegin\n\
                   set nocount, xact_abort on;\n\
                   insert into [changefeed].[feed:dbo.t] (shard_id, ulid) \
                   select 0, ulid from @moved order by ulid option (maxdop 1);\nend\n";
    let r20 = |files: &[(&str, &str)]| violations_of(Rule::OrderedFeedInsert, files);
    assert_eq!(
        r20(&[("V1__p.sql", unordered)]),
        [("sql/V1__p.sql".to_owned(), 5)]
    );
    assert!(r20(&[("V1__p.sql", ordered)]).is_empty());
    assert!(
        r20(&[("V1__p.sql", unordered), ("V2__p.sql", ordered)]).is_empty(),
        "a definition replaced by a later file is not checked"
    );
    assert_eq!(
        r20(&[("V1__p.sql", ordered), ("V2__p.sql", unordered)]),
        [("sql/V2__p.sql".to_owned(), 5)]
    );
    let only_order = ordered.replace(" option (maxdop 1)", "");
    assert_eq!(r20(&[("V1__p.sql", &only_order)]).len(), 1);
}

#[test]
fn throw_outside_the_project_range_fires() {
    let src = "create procedure p as begin\nset nocount, xact_abort on;\n\
               throw 50001, N'no', 1;\nend";
    assert_fires_saying(src, Rule::ThrowNumber, 3, "51000–51999");
    assert_fires("throw 52000, 'x', 1;", Rule::ThrowNumber, 1);
    assert_clean("throw 51000, 'x', 1;\nthrow 51999, N'throw 50001', 1;\nthrow @n, @m, 1;");
}

// R8

const TEMPLATE: &str = "\
create or alter procedure [changefeed].[read_feed:changefeed.__template__]
as
begin
    set nocount, xact_abort on;
    select r.ulid, __template_key__
    from [changefeed].[feed:changefeed.__template__] as r
    left outer join [changefeed].[__template__] as e
        on e.__template_key__ = r.__template_key__;
end
";

#[test]
fn template_passes() {
    assert_clean(TEMPLATE);
}

/// Asserts that R8 fires on `line` of [`TEMPLATE`] with `from` (which it must contain)
/// replaced by `to`, and returns the message.
#[track_caller]
fn assert_template_edit_fires(from: &str, to: &str, line: usize) -> String {
    assert!(TEMPLATE.contains(from), "the template has no {from:?}");
    assert_fires(&TEMPLATE.replace(from, to), Rule::Template, line)
}

#[test]
fn template_with_qualified_marker_fires() {
    let message = assert_template_edit_fires(
        "select r.ulid, __template_key__",
        "select r.ulid, o.__template_key__",
        5,
    );
    assert!(message.contains("`o.__template_key__`"), "{message}");
    assert_template_edit_fires("e.__template_key__ = r.", "e.__template_key__=r.", 8);
    assert_template_edit_fires(", __template_key__", ", [__template_key__]", 5);
    assert_template_edit_fires(", __template_key__", ", __Template_Key__", 5);
}

#[test]
fn template_without_create_or_alter_fires() {
    let create_or_alter = "create or alter procedure";
    assert_template_edit_fires(create_or_alter, "create procedure", 1);
    assert_template_edit_fires(create_or_alter, "alter procedure", 1);
    assert_template_edit_fires(create_or_alter, "CREATE OR ALTER PROCEDURE", 1);
}

#[test]
fn markers_outside_templates_are_not_checked() {
    assert_clean(
        "create or alter view [changefeed].[other] as select o.__template_key__ from x as o;",
    );
}

// R9

#[test]
fn statements_refused_in_a_transaction_fire() {
    assert_fires(
        "select 1;\nalter database current set read_committed_snapshot on;",
        Rule::NoTransactionRefused,
        2,
    );
    assert_fires("CREATE DATABASE x;", Rule::NoTransactionRefused, 1);
    assert_fires("backup log x to disk = 'x';", Rule::NoTransactionRefused, 1);
    assert_fires("restore database x;", Rule::NoTransactionRefused, 1);
    assert_fires(
        "declare @sql nvarchar(max) = N'select 1;\nalter database current set x on';",
        Rule::NoTransactionRefused,
        2,
    );
}

#[test]
fn refused_statements_in_comments_or_prose_do_not_fire() {
    assert_clean(
        "-- alter database current set read_committed_snapshot on\n\
         /* backup first */\nselect N'restore the backup first';",
    );
}

// R10

#[test]
fn ulid_as_uniqueidentifier_fires() {
    assert_fires(
        "create table t (\n    ulid uniqueidentifier not null\n);",
        Rule::UlidAndTimeTypes,
        2,
    );
    assert_fires(
        "declare @head_ulid UNIQUEIDENTIFIER;",
        Rule::UlidAndTimeTypes,
        1,
    );
    assert_clean("-- a ulid is never a uniqueidentifier\ncreate table t (ulid binary(16));");
}

#[test]
fn datediff_in_milliseconds_fires() {
    assert_fires_saying(
        "select\n  DateDiff (\n millisecond, @a, @b);",
        Rule::UlidAndTimeTypes,
        2,
        "datediff_big",
    );
    assert_fires("select datediff(ms, @a, @b);", Rule::UlidAndTimeTypes, 1);
    assert_fires(
        "exec sys.sp_executesql N'select datediff(millisecond, @a, @b)';",
        Rule::UlidAndTimeTypes,
        1,
    );
    assert_clean("select datediff_big(millisecond, @a, @b), datediff(day, @a, @b);");
}

#[test]
fn rules_report_every_violation_of_a_bad_file() {
    // A file that breaks several rules reports each.
    let src =
        "select 1;\ncreate procedure p as begin\nselect 1; begin tran; throw 1, 'x', 1;\nend\nGO";
    let found = rules(src);
    for rule in [
        Rule::NoGo,
        Rule::OneModuleFirst,
        Rule::ProcedurePreamble,
        Rule::NothingAfterModule,
        Rule::TransactionCatch,
        Rule::ThrowNumber,
    ] {
        assert!(found.contains(&rule), "{rule:?} missing from {found:?}");
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn lint_never_panics(src in any::<String>()) {
            let _ = lint_file(F, &src);
        }

        #[test]
        fn lint_never_panics_on_sql_like_text(
            src in concat!(
                r"(create |or |alter |procedure |view |as |begin |end |case |try |catch |tran ",
                r"|;|\(|\)|'|N'|\[|\]|--|/\*|\*/|\n|go|x|\.|__template_key__|[ a-z0-9])*"
            )
        ) {
            let _ = lint_file(F, &src);
        }

        #[test]
        fn anything_in_a_block_comment_is_ignored(body in r"[^*/]*") {
            let src = format!("/* {body} */\nselect 1;");
            prop_assert!(lint_file(F, &src).is_empty());
        }

        #[test]
        fn anything_in_a_line_comment_is_ignored(body in r"[^\n]*") {
            let src = format!("select 1; -- {body}\nselect 2;");
            prop_assert!(lint_file(F, &src).is_empty());
        }

        #[test]
        fn anything_in_a_string_is_ignored_by_go(body in r"(GO|go|[ \n;0-9a-z'])*") {
            let src = format!("select N'{}';", body.replace('\'', "''"));
            prop_assert!(!lint_file(F, &src).iter().any(|v| v.rule == Rule::NoGo));
        }
    }
}

// R21

#[test]
fn length_limit_with_len_fires() {
    assert_fires_saying(
        "select 1;\nif len(@message_id) > 64 throw 51304, N'too long', 1;",
        Rule::LengthUnits,
        2,
        "datalength(x) / 2",
    );
    assert_fires(
        "select 1 where len(@table_name) <= 128;",
        Rule::LengthUnits,
        1,
    );
    assert_fires(
        "select 1 where len(p.schema_name) + len(p.table_name) > 108;",
        Rule::LengthUnits,
        1,
    );
}

#[test]
fn emptiness_and_datalength_do_not_fire() {
    assert_clean("select 1 where len(@x) = 0;");
    assert_clean("select 1 where datalength(@x) / 2 > 64;");
    assert_clean("select 1 where (datalength(@a) + datalength(@b)) / 2 > 108;");
    assert_clean("select N'len(@x) > 64';");
}

#[test]
fn released_migrations_are_exempt_from_length_units() {
    let src = "select 1 where len(@x) > 64;";
    assert!(lint_file("sql/V7__parse.sql", src).is_empty());
    let later = lint_file("sql/V999__parse.sql", src);
    assert!(
        later.iter().any(|v| v.rule == Rule::LengthUnits),
        "{later:?}"
    );
}

// R24

#[test]
fn a_name_compared_with_a_reserved_name_without_collate_fires() {
    // key_columns (V9) as released: `ULID` passes in a case-sensitive database.
    assert_fires_saying(
        "select 1;\nselect 1 from t where column_name in (N'shard_id', N'ulid', N'time_hint');",
        Rule::ReservedNameCollation,
        2,
        "collate",
    );
    assert_fires(
        "select 1 from sys.columns as c where c.name <> N'ulid';",
        Rule::ReservedNameCollation,
        1,
    );
    assert_fires(
        "select 1 from sys.columns as c where N'ULID' = c.[name];",
        Rule::ReservedNameCollation,
        1,
    );
    assert_fires(
        "select 1 from t where column_name not in (N'x', N'order_sequence');",
        Rule::ReservedNameCollation,
        1,
    );
}

#[test]
fn a_stated_collation_or_a_value_that_is_not_a_name_does_not_fire() {
    assert_clean(
        "select 1 from t where column_name collate Latin1_General_100_CI_AI \
         in (N'shard_id', N'ulid');",
    );
    assert_clean(
        "select 1 from sys.columns as c where c.name collate Latin1_General_100_BIN2 <> N'ulid';",
    );
    assert_clean(
        "select 1 from sys.columns as c where N'ulid' = c.name collate Latin1_General_100_CI_AI;",
    );
    assert_clean("select 1 from f where kind = N'ulid';");
    assert_clean("select * from (values (N'ulid', 'FN')) as v (name, type);");
    assert_clean("select N'column_name in (N''ulid'')';");
}

#[test]
fn released_migrations_are_exempt_from_reserved_name_collation() {
    let src = "select 1 from t where column_name in (N'ulid');";
    assert!(lint_file("sql/V9__key_columns.sql", src).is_empty());
    let later = lint_file("sql/V999__key_columns.sql", src);
    assert!(
        later.iter().any(|v| v.rule == Rule::ReservedNameCollation),
        "{later:?}"
    );
}

// R22

const WAITING_PROCEDURE: &str = "\
create or alter procedure p as
begin
    set nocount, xact_abort on;
    set implicit_transactions off;
    declare @pause_ms int = 2;
    while 1 = 1
    begin
        begin try
            begin transaction;
            update t set a = 1;
            PAUSE_IN
            commit transaction;
        end try
        begin catch
            if @@trancount > 0 rollback transaction;
            throw;
        end catch;
        PAUSE_OUT
    end;
end
";

#[test]
fn a_pause_between_transactions_passes() {
    assert_clean(
        &WAITING_PROCEDURE
            .replace("PAUSE_IN", "")
            .replace("PAUSE_OUT", "waitfor delay '00:00:00.010';"),
    );
    assert_clean(&WAITING_PROCEDURE.replace("PAUSE_IN", "").replace(
        "PAUSE_OUT",
        "exec changefeed.pause_wait @deadline = null, @max_pause_ms = 20, @pause_ms = @pause_ms output;",
    ));
}

#[test]
fn a_pause_inside_a_transaction_fires() {
    for pause in [
        "waitfor delay '00:00:00.010';",
        "exec changefeed.pause_wait @deadline = null, @max_pause_ms = 20, @pause_ms = @pause_ms output;",
        "exec [changefeed].[pause_read] @deadline = null, @pause_ms = @pause_ms output;",
    ] {
        let src = WAITING_PROCEDURE
            .replace("PAUSE_IN", pause)
            .replace("PAUSE_OUT", "");
        assert_fires_saying(&src, Rule::PauseOutsideTransaction, 11, "line 9");
    }
    // Another procedure whose name starts the same way is not a pause.
    assert_clean(
        &WAITING_PROCEDURE
            .replace("PAUSE_IN", "exec dbo.pause_wait;")
            .replace("PAUSE_OUT", ""),
    );
}

// R27

#[test]
fn a_migration_that_regenerates_fires_unless_released() {
    for call in [
        "exec changefeed.upgrade_all_feeds;",
        "EXECUTE [changefeed].[upgrade_feed] @table_name = N'dbo.t';",
        "exec @status = changefeed.[Upgrade_Outbox] @table_name = N'dbo.o';",
    ] {
        let src = format!("-- a migration\ninsert into t (a) values (1);\n{call}\n");
        assert_fires_saying(
            &src,
            Rule::NoRegenerationInMigration,
            3,
            "@only_outdated = 1",
        );
        assert!(
            lint_file("sql/V49__released.sql", &src).is_empty(),
            "a released migration is exempt"
        );
        assert!(
            lint_file("sql/V999__later.sql", &src)
                .iter()
                .any(|v| v.rule == Rule::NoRegenerationInMigration),
            "a later migration is not"
        );
    }
}

#[test]
fn a_regenerator_called_by_a_procedure_or_named_in_a_comment_does_not_fire() {
    // A procedure's body is the procedure's: upgrade_all_feeds calls upgrade_feed.
    assert_clean(
        "create or alter procedure p as
begin
    set nocount, xact_abort on;
    exec changefeed.upgrade_feed @table_name = N'dbo.t';
end
",
    );
    assert_clean(
        "-- No migration runs exec changefeed.upgrade_all_feeds; it runs after them.
select N'exec changefeed.upgrade_outbox' as hint;
exec changefeed.upgrade_something_else;
exec dbo.upgrade_all_feeds;
",
    );
}
