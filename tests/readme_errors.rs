//! README.md's error table is the contract callers code against: it must list every error
//! number the SQL bundle raises, and nothing it does not.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Numbers after `throw` in the SQL Server bundle, and the PostgreSQL bundle's CFnnn codes (comments are not stripped: a number only mentioned in
/// a comment after the word throw would count, which the bundle does not do).
fn thrown_numbers() -> BTreeSet<u32> {
    let mut numbers = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("sql")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let lower = text.to_lowercase();
        let mut rest = lower.as_str();
        while let Some(at) = rest.find("throw ") {
            rest = &rest[at + "throw ".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(number) = digits.parse() {
                numbers.insert(number);
            }
        }
    }
    // The PostgreSQL bundle raises SQLSTATE CFnnn for the number 51nnn.
    for entry in std::fs::read_dir(root().join("postgres")).unwrap() {
        let lower = std::fs::read_to_string(entry.unwrap().path())
            .unwrap()
            .to_lowercase();
        for (at, _) in lower.match_indices("errcode = ") {
            let code = lower[at + "errcode = ".len()..].trim_start_matches('\'');
            if let Some(digits) = code.strip_prefix("cf").and_then(|rest| rest.get(..3))
                && let Ok(number) = digits.parse::<u32>()
            {
                numbers.insert(51_000 + number);
            }
        }
    }
    numbers
}

/// Numbers in the first column of README's error table (rows starting with `| 51`).
fn documented_numbers() -> BTreeSet<u32> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    error_numbers(readme.lines())
}

/// The project error numbers (51000-51999) that start README table rows among `lines`.
fn error_numbers<'a>(lines: impl Iterator<Item = &'a str>) -> BTreeSet<u32> {
    lines
        .filter_map(|line| line.strip_prefix("| "))
        .filter_map(|rest| rest.split(' ').next())
        .filter_map(|first| first.parse::<u32>().ok())
        .filter(|n| (51000..52000).contains(n))
        .collect()
}

#[test]
fn every_thrown_error_is_documented_and_every_documented_error_is_thrown() {
    let thrown = thrown_numbers();
    let documented = documented_numbers();
    assert!(!thrown.is_empty(), "found no THROW in sql/");
    let undocumented: Vec<_> = thrown.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&thrown).collect();
    assert!(
        undocumented.is_empty(),
        "add these to README.md's error table: {undocumented:?}"
    );
    assert!(
        stale.is_empty(),
        "README.md documents errors no SQL file raises: {stale:?}"
    );
}

#[test]
fn every_number_is_in_the_project_range() {
    for number in thrown_numbers() {
        assert!((51000..52000).contains(&number), "{number}");
    }
}

/// The numbers whose row's last column (what to do) starts with "Transient".
fn documented_transient_numbers() -> BTreeSet<u32> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    error_numbers(readme.lines().filter(|line| {
        line.trim_end()
            .trim_end_matches('|')
            .rsplit('|')
            .next()
            .is_some_and(|advice| advice.trim_start().starts_with("Transient"))
    }))
}

/// A caller's retry loop asks `Error::is_transient`; the table tells a reader the same. An
/// error README calls transient that the client calls final (51115 and 51310 were) stops a
/// relay or a writer that a retry would have carried on, and the reverse retries forever.
#[test]
fn the_client_retries_exactly_the_errors_readme_calls_transient() {
    let transient = documented_transient_numbers();
    assert!(
        transient.contains(&51305),
        "found no transient rows: {transient:?}"
    );
    for number in documented_numbers() {
        let error = changefeed::Error::from_server(number, 1, 16, String::new());
        assert_eq!(
            error.is_transient(),
            transient.contains(&number),
            "{number}: README calls it {}transient, Error::is_transient says {}",
            if transient.contains(&number) {
                ""
            } else {
                "not "
            },
            error.is_transient()
        );
    }
}
