//! The rules of the PostgreSQL bundle (`postgres/`), checked on its text:
//!
//! * each file creates one function, `changefeed.<name>`, named like the file
//!   (`V<n>__create_function_<name>.sql`), or one view (`V<n>__create_view_<name>.sql`), or
//!   tables and nothing that runs (`V<n>__create_table_<name>.sql`, the first being `<name>`);
//! * every function pins `search_path = pg_catalog, pg_temp`, so that a caller's search path
//!   can neither hide the bundle's objects nor slip another function in their place (the
//!   bundle names its own objects with their schema);
//! * every `raise exception` carries one of the bundle's SQLSTATEs, `CF` and three digits,
//!   which `Error::server_number` maps to 51000–51999;
//! * a statement that calls a feed's `read_feed_<id>` joins nothing: that function moves
//!   outbox rows it reads with later snapshots than its calling statement's, so a join in the
//!   same statement misses the rows of writers that committed in between (an event read as
//!   deleted). The join goes in a statement of its own, after the call.

use std::path::Path;

fn bundle() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("postgres");
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap().to_lowercase())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "postgres/ is empty");
    files
}

#[test]
fn each_file_creates_the_object_it_is_named_after() {
    for (file, text) in bundle() {
        // Functions the file itself creates; generated ones are named with format() slots.
        let functions = text
            .match_indices("create function changefeed.")
            .filter(|(at, _)| {
                let name = &text[at + "create function changefeed.".len()..];
                name.find('(').is_some_and(|end| {
                    name[..end]
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_')
                })
            })
            .count();
        if let Some(name) = object_name(&file, "__create_function_") {
            assert_eq!(functions, 1, "{file}: one function per file");
            assert!(
                text.contains(&format!("create function changefeed.{name}(")),
                "{file}: creates changefeed.{name}"
            );
        } else if let Some(name) = object_name(&file, "__create_view_") {
            assert_eq!(functions, 0, "{file}: a view file creates no function");
            assert_eq!(
                text.matches("create view ").count(),
                1,
                "{file}: one view per file"
            );
            assert!(
                text.contains(&format!("create view changefeed.{name} as")),
                "{file}: creates the view changefeed.{name}"
            );
        } else if let Some(name) = object_name(&file, "__create_table_") {
            assert_eq!(functions, 0, "{file}: a table file creates no function");
            assert!(
                text.contains(&format!("create table changefeed.{name} (")),
                "{file}: creates the table changefeed.{name}"
            );
        } else {
            panic!(
                "{file}: name it V<n>__create_function_<name>.sql, __create_view_ or __create_table_"
            );
        }
    }
}

fn object_name<'a>(file: &'a str, kind: &str) -> Option<&'a str> {
    file.split_once(kind)
        .and_then(|(_, rest)| rest.strip_suffix(".sql"))
}

#[test]
fn every_function_pins_its_search_path() {
    for (file, text) in bundle() {
        // Each function the file creates, the generated ones inside generate_feed and
        // setup_feed included: every `language` clause of a function stands before its
        // `set search_path`.
        let definitions = text.matches("\nreturns ").count();
        let pinned = text
            .matches("\nset search_path = pg_catalog, pg_temp\n")
            .count();
        assert!(
            pinned >= definitions,
            "{file}: {definitions} function definitions, {pinned} `set search_path = pg_catalog, pg_temp`"
        );
    }
}

#[test]
fn every_raised_error_has_a_bundle_sqlstate() {
    for (file, text) in bundle() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("raise exception") {
            rest = &rest[at + "raise exception".len()..];
            let statement = &rest[..rest.find(';').unwrap_or(rest.len())];
            let state = statement
                .split_once("errcode = '")
                // A generated function's text doubles the quote.
                .map(|(_, after)| after.trim_start_matches('\''))
                .map(|after| &after[..5.min(after.len())])
                .unwrap_or_else(|| panic!("{file}: a raise exception without errcode"));
            assert!(
                state.starts_with("cf") && state[2..].chars().all(|c| c.is_ascii_digit()),
                "{file}: SQLSTATE {state} is not CFnnn"
            );
        }
    }
}

#[test]
fn a_statement_that_calls_read_feed_joins_nothing() {
    let mut calls = 0;
    for (file, text) in bundle() {
        for (at, _) in text.match_indices("from changefeed.read_feed_") {
            calls += 1;
            let begins = text[..at].rfind(';').map_or(0, |end| end + 1);
            let ends = text[at..].find(';').map_or(text.len(), |end| at + end);
            let statement = &text[begins..ends];
            assert!(
                !statement.contains(" join "),
                "{file}: a statement calls read_feed_<id> and joins in the same statement; \
                 read the page first, then join in a statement of its own:\n{statement}"
            );
        }
    }
    assert!(
        calls > 0,
        "no call of read_feed_<id> found: the rule checks nothing"
    );
}
