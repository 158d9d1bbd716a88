//! The Markdown documents a user reads (README.md, docs/, and the documents beside README):
//! every relative link leads to a file that exists and, with an anchor, to a heading that
//! file has; and every document under docs/ is compiled as doctests (src/lib.rs includes it),
//! so a Rust example moved out of README keeps being checked against the API.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The user-facing Markdown documents: the top-level ones and everything under docs/.
fn documents() -> Vec<PathBuf> {
    let mut documents: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "MOTIVATION.md",
        "POWEROFF.md",
        "BENCHMARKS.md",
    ]
    .iter()
    .map(|name| root().join(name))
    .collect();
    documents.extend(docs_files());
    documents
}

/// The Markdown files under docs/, sorted.
fn docs_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// The anchor GitHub gives a heading: lower case, letters, digits, `-` and `_` kept, spaces
/// made `-`, everything else (punctuation, backticks, symbols such as `→`) dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading of a document; a repeated heading gets `-1`, `-2`, … as on
/// GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line
            .strip_prefix('#')
            .map(|rest| rest.trim_start_matches('#'))
            .filter(|rest| rest.starts_with(' '))
        else {
            continue;
        };
        let base = anchor(heading.trim());
        let mut name = base.clone();
        let mut repeat = 0;
        while seen.contains(&name) {
            repeat += 1;
            name = format!("{base}-{repeat}");
        }
        seen.insert(name);
    }
    seen
}

/// The targets of the inline links `[text](target)` on a line, code spans left out.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut in_code = false;
    let mut rest = line;
    while let Some(at) = rest.find(['`', ']']) {
        // Both markers are one byte: what follows the one found.
        let marker = rest.as_bytes()[at];
        rest = &rest[at + 1..];
        if marker == b'`' {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(inner) = rest.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            targets.push(&inner[..end]);
            rest = &inner[end..];
        }
    }
    targets
}

#[test]
fn the_anchor_of_a_heading_is_githubs() {
    assert_eq!(
        anchor("13. Feeds on PostgreSQL (feature `postgres`)"),
        "13-feeds-on-postgresql-feature-postgres"
    );
    assert_eq!(anchor("Reading into `#read`"), "reading-into-read");
    assert_eq!(
        anchor("End to end: MariaDB outbox → relay → mock cluster"),
        "end-to-end-mariadb-outbox--relay--mock-cluster"
    );
    let text = "# A\n```sh\n# not a heading\n```\n## A\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(["a".to_owned(), "a-1".to_owned()])
    );
    assert_eq!(
        link_targets("see [x](a.md#b), `[c](not a link)` and [d](#e)"),
        ["a.md#b", "#e"]
    );
}

#[test]
fn every_relative_link_leads_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document).expect("a readable document");
        let directory = document.parent().expect("a directory");
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    document.clone()
                } else {
                    directory.join(path)
                };
                let place = format!(
                    "{}:{number}: ({target})",
                    document.strip_prefix(root()).unwrap_or(&document).display()
                );
                if !file.exists() {
                    broken.push(format!("{place}: no file {}", file.display()));
                    continue;
                }
                if fragment.is_empty() || file.extension().is_none_or(|ext| ext != "md") {
                    continue;
                }
                let target_text = std::fs::read_to_string(&file).expect("a readable document");
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{place}: no heading #{fragment}"));
                }
            }
        }
    }
    assert!(checked > 30, "found the documents' links ({checked})");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_document_under_docs_is_compiled_as_doctests() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let files = docs_files();
    assert!(!files.is_empty(), "docs/ holds the user documents");
    let missing: Vec<String> = files
        .iter()
        .map(|file| {
            file.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| !lib.contains(&format!("include_str!(\"../docs/{name}\")")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs must include these as a #[cfg(doctest)] item each, as it does README.md: \
         {missing:?}"
    );
}
