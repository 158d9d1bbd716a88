//! Every document a file of the repository points to is in the repository: no file cites
//! the reference notes the project was started from, which are not shipped. Their content
//! lives in ARCHITECTURE.md.

use std::path::{Path, PathBuf};

/// The names of the unshipped notes, spelled so that this file does not match itself.
const GONE: [&str; 2] = [concat!("DESIGN", ".md"), concat!("TSQL-NOTES", ".md")];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && name != ".git" {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// The files the crate ships and the examples: they must stand on their own already.
#[test]
fn shipped_files_cite_only_what_is_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut shipped = Vec::new();
    for dir in ["src", "examples"] {
        files(&root.join(dir), &mut shipped);
    }
    for document in [
        "README.md",
        "MOTIVATION.md",
        "POWEROFF.md",
        "ARCHITECTURE.md",
    ] {
        shipped.push(root.join(document));
    }
    files(&root.join("docs"), &mut shipped);
    assert!(shipped.len() > 20, "the walk found the shipped files");
    let citing = citations(root, &shipped);
    assert!(
        citing.is_empty(),
        "cite ARCHITECTURE.md (its relevant section) instead:\n{}",
        citing.join("\n")
    );
}

/// Every line of `paths` that names one of the unshipped notes, as `path:line: text`.
fn citations(root: &Path, paths: &[PathBuf]) -> Vec<String> {
    let mut citing = Vec::new();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue; // not text
        };
        for (number, line) in text.lines().enumerate() {
            if GONE.iter().any(|name| line.contains(name)) {
                let relative = path.strip_prefix(root).unwrap_or(path);
                citing.push(format!(
                    "{}:{}: {}",
                    relative.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    citing
}

#[test]
fn no_file_cites_a_document_that_is_not_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(root, &mut all);
    let citing = citations(root, &all);
    assert!(
        all.len() > 50,
        "the walk found the repository's files ({})",
        all.len()
    );
    assert!(
        citing.is_empty(),
        "cite ARCHITECTURE.md (its relevant section) instead of {GONE:?}, which are not in \
         the repository:\n{}",
        citing.join("\n")
    );
}
