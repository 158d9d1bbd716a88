//! The rules of the PostgreSQL bundle (`postgres/`), checked on its text:
//!
//! * each file creates one function, `changefeed.<name>`, named like the file
//!   (`V<n>__create_function_<name>.sql`);
//! * every function pins `search_path = pg_catalog, pg_temp`, so that a caller's search path
//!   can neither hide the bundle's objects nor slip another function in their place (the
//!   bundle names its own objects with their schema);
//! * every `raise exception` carries one of the bundle's SQLSTATEs, `CF` and three digits,
//!   which `Error::server_number` maps to 51000–51999.

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
fn each_file_creates_the_function_it_is_named_after() {
    for (file, text) in bundle() {
        let name = file
            .split_once("__create_function_")
            .and_then(|(_, rest)| rest.strip_suffix(".sql"))
            .unwrap_or_else(|| panic!("{file}: name it V<n>__create_function_<name>.sql"));
        let creates: Vec<&str> = text.matches("create function ").collect();
        assert_eq!(creates.len(), 1, "{file}: one function per file");
        assert!(
            text.contains(&format!("create function changefeed.{name}(")),
            "{file}: creates changefeed.{name}"
        );
    }
}

#[test]
fn every_function_pins_its_search_path() {
    for (file, text) in bundle() {
        assert!(
            text.contains("\nset search_path = pg_catalog, pg_temp\n"),
            "{file}: add `set search_path = pg_catalog, pg_temp` to the function"
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
                .map(|(_, after)| &after[..5.min(after.len())])
                .unwrap_or_else(|| panic!("{file}: a raise exception without errcode"));
            assert!(
                state.starts_with("cf") && state[2..].chars().all(|c| c.is_ascii_digit()),
                "{file}: SQLSTATE {state} is not CFnnn"
            );
        }
    }
}
