//! Released migrations are frozen.
//!
//! refinery records every applied migration in its history table with a checksum of its
//! name, version and SQL text (refinery 0.10: SipHash-1-3 over `name`, `version` and `sql`,
//! see `refinery_core::Migration::unapplied`), and refuses to migrate a database where an
//! applied migration's name or checksum no longer matches the file. So once users have
//! applied a file of `sql/`, editing, renaming, renumbering or removing it breaks every
//! database that has it. `tests/frozen_migrations.txt` lists each released file with the
//! checksum refinery computes for it (through refinery itself, so the two cannot drift);
//! this test fails when one of them changes.
//!
//! A change to the bundle is a new migration file after the last frozen one; for generated
//! per-feed or per-outbox code that is the template upgrade pattern: the new version of the
//! template (`create or alter` of the template object) and a new generator version; the code
//! is regenerated after the migrations (`exec changefeed.upgrade_all_feeds @only_outdated =
//! 1`, which `migrate` runs; ARCHITECTURE.md).
//!
//! To (re)generate the list after a release (it freezes every file now in `sql/`):
//!
//! ```text
//! CHANGEFEED_FREEZE=1 cargo test --test frozen_migrations
//! ```

use std::path::{Path, PathBuf};

const LIST: &str = "tests/frozen_migrations.txt";

/// One released migration.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frozen {
    version: i64,
    file: String,
    checksum: u64,
}

/// A migration file now in `sql/`.
struct Current {
    file: String,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The version and refinery checksum of a migration file, computed by refinery.
fn refinery_identity(file: &str, text: &str) -> Result<(i64, u64), String> {
    let stem = file.strip_suffix(".sql").unwrap_or(file);
    let migration = refinery::Migration::unapplied(stem, text)
        .map_err(|e| format!("refinery does not accept `{file}` as a migration: {e}"))?;
    Ok((i64::from(migration.version()), migration.checksum()))
}

fn read_current() -> Vec<Current> {
    let dir = root().join("sql");
    let mut files: Vec<Current> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("an entry of sql/").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| Current {
            file: file_name(&path),
            text: std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())),
        })
        .collect();
    files.sort_by(|a, b| a.file.cmp(&b.file));
    files
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

fn parse_list(text: &str) -> Result<Vec<Frozen>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parsed = match fields[..] {
            [version, file, checksum] => version
                .parse()
                .ok()
                .zip(u64::from_str_radix(checksum, 16).ok())
                .map(|(version, checksum)| Frozen {
                    version,
                    file: file.to_owned(),
                    checksum,
                }),
            _ => None,
        };
        out.push(parsed.ok_or_else(|| {
            format!(
                "{LIST}:{}: `{line}` is not `<version> <file> <checksum in hex>`; regenerate \
                 the list with CHANGEFEED_FREEZE=1 cargo test --test frozen_migrations",
                n + 1
            )
        })?);
    }
    Ok(out)
}

fn render_list(frozen: &[Frozen]) -> String {
    let mut s = String::from(
        "# Released migrations of sql/: version, file, refinery 0.10 checksum (hex; SipHash-1-3\n\
         # of name, version and SQL text, computed by refinery::Migration::unapplied).\n\
         # tests/frozen_migrations.rs fails when one of these files changes, is renamed,\n\
         # renumbered or removed. Never edit this list by hand; after a release regenerate it:\n\
         #   CHANGEFEED_FREEZE=1 cargo test --test frozen_migrations\n",
    );
    for f in frozen {
        s.push_str(&format!("{} {} {:016x}\n", f.version, f.file, f.checksum));
    }
    s
}

const FIX: &str = "Released migrations are frozen: refinery refuses to migrate a database where \
    an applied migration changed (its history table keeps each file's name and checksum). \
    Restore the released file (`git checkout <release> -- sql/<file>`) and make the change in \
    a new migration after the last frozen version; for generated code, the template upgrade \
    pattern: the new template (`create or alter` of the template object) and a new generator \
    version, regenerated after the migrations by `exec changefeed.upgrade_all_feeds \
    @only_outdated = 1` (ARCHITECTURE.md)";

/// Everything that breaks a database migrated with the frozen files.
fn problems(frozen: &[Frozen], current: &[Current]) -> Vec<String> {
    let mut out = Vec::new();
    let mut identities = Vec::new();
    for c in current {
        match refinery_identity(&c.file, &c.text) {
            Ok((version, checksum)) => identities.push((c, version, checksum)),
            Err(e) => out.push(e),
        }
    }
    for f in frozen {
        let same_file = identities
            .iter()
            .find(|(c, _, _)| c.file == f.file)
            .or_else(|| {
                identities
                    .iter()
                    .find(|(c, _, _)| description(&c.file) == description(&f.file))
            });
        let same_version = identities.iter().find(|(_, v, _)| *v == f.version);
        match (same_file, same_version) {
            (Some((_, version, checksum)), _) if *version == f.version => {
                if *checksum != f.checksum {
                    out.push(format!(
                        "sql/{}: the released migration V{} changed (refinery checksum \
                         {checksum:016x}, frozen {:016x} in {LIST}). {FIX}.",
                        f.file, f.version, f.checksum
                    ));
                }
            }
            (_, Some((c, _, _))) => out.push(format!(
                "sql/{}: the released migration V{} `{}` was renamed to `{}`. refinery \
                 compares names too. {FIX}.",
                c.file, f.version, f.file, c.file
            )),
            (Some((c, version, _)), None) => out.push(format!(
                "sql/{}: the released migration V{} was renumbered to V{version}. {FIX}.",
                c.file, f.version
            )),
            (None, None) => out.push(format!(
                "sql/{}: the released migration V{} was removed. A database that applied it \
                 still has it in refinery's history. {FIX}.",
                f.file, f.version
            )),
        }
    }
    if let Some(last) = frozen.iter().map(|f| f.version).max() {
        for (c, version, _) in &identities {
            if *version <= last && !frozen.iter().any(|f| f.version == *version) {
                out.push(format!(
                    "sql/{}: a new migration with version {version}, at or below the last \
                     released version {last}: a database at V{last} would never apply it \
                     (refinery treats it as missing). Number it after {last}.",
                    c.file
                ));
            }
        }
    }
    out
}

/// `create_schema` of `V1__create_schema.sql`.
fn description(file: &str) -> &str {
    file.split_once("__").map_or(file, |(_, rest)| rest)
}

fn freeze(current: &[Current]) -> Vec<Frozen> {
    let mut frozen: Vec<Frozen> = current
        .iter()
        .map(|c| {
            let (version, checksum) =
                refinery_identity(&c.file, &c.text).unwrap_or_else(|e| panic!("{e}"));
            Frozen {
                version,
                file: c.file.clone(),
                checksum,
            }
        })
        .collect();
    frozen.sort_by_key(|f| f.version);
    frozen
}

#[test]
fn released_migrations_are_unchanged() {
    let current = read_current();
    let path = root().join(LIST);
    if std::env::var_os("CHANGEFEED_FREEZE").is_some_and(|v| v == "1") {
        let frozen = freeze(&current);
        std::fs::write(&path, render_list(&frozen))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("froze {} migrations in {LIST}", frozen.len());
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); generate it with CHANGEFEED_FREEZE=1 cargo test --test \
             frozen_migrations",
            path.display()
        )
    });
    let frozen = parse_list(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(!frozen.is_empty(), "{LIST} freezes no migration");
    let problems = problems(&frozen, &current);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// The check itself, on made-up bundles.

fn bundle(files: &[(&str, &str)]) -> Vec<Current> {
    files
        .iter()
        .map(|(file, text)| Current {
            file: (*file).to_owned(),
            text: (*text).to_owned(),
        })
        .collect()
}

fn released() -> (Vec<Frozen>, Vec<Current>) {
    let current = with_v2("V2__create_table.sql", "create table x.t (a int);");
    (freeze(&current), current)
}

/// The released bundle's V1 as it was, then `file` with `text` in place of its V2.
fn with_v2(file: &str, text: &str) -> Vec<Current> {
    bundle(&[
        ("V1__create_schema.sql", "create schema [x];"),
        (file, text),
    ])
}

#[test]
fn the_list_round_trips() {
    let (frozen, _) = released();
    assert_eq!(parse_list(&render_list(&frozen)), Ok(frozen));
    assert!(parse_list("1 V1__a.sql not-hex").is_err());
}

#[test]
fn an_unchanged_bundle_and_a_new_migration_pass() {
    let (frozen, mut current) = released();
    assert_eq!(problems(&frozen, &current), Vec::<String>::new());
    current.extend(bundle(&[("V3__add.sql", "alter table x.t add b int;")]));
    assert_eq!(problems(&frozen, &current), Vec::<String>::new());
}

#[test]
fn an_edited_migration_fails() {
    let (frozen, _) = released();
    let edited = with_v2("V2__create_table.sql", "create table x.t (a bigint);");
    let found = problems(&frozen, &edited);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("sql/V2__create_table.sql: the released migration V2 changed"));
    assert!(found[0].contains("new migration"), "{}", found[0]);
    // Even a trailing newline counts: refinery hashes the exact text.
    let newline = bundle(&[
        ("V1__create_schema.sql", "create schema [x];\n"),
        ("V2__create_table.sql", "create table x.t (a int);"),
    ]);
    assert_eq!(problems(&frozen, &newline).len(), 1);
}

#[test]
fn a_renamed_renumbered_or_removed_migration_fails() {
    let (frozen, _) = released();
    let renamed = with_v2("V2__create_the_table.sql", "create table x.t (a int);");
    assert!(problems(&frozen, &renamed)[0].contains("was renamed"));
    let renumbered = with_v2("V3__create_table.sql", "create table x.t (a int);");
    let found = problems(&frozen, &renumbered);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("was renumbered to V3"), "{}", found[0]);
    let removed = bundle(&[("V1__create_schema.sql", "create schema [x];")]);
    assert!(problems(&frozen, &removed)[0].contains("was removed"));
}

#[test]
fn a_new_migration_inside_the_released_range_fails() {
    let frozen = freeze(&bundle(&[
        ("V1__a.sql", "select 1;"),
        ("V3__c.sql", "select 3;"),
    ]));
    let current = bundle(&[
        ("V1__a.sql", "select 1;"),
        ("V2__b.sql", "select 2;"),
        ("V3__c.sql", "select 3;"),
    ]);
    let found = problems(&frozen, &current);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("Number it after 3"), "{}", found[0]);
}
