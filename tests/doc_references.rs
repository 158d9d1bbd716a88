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

#[test]
#[ignore = "fails until sql/ and tests/ stop citing the unshipped notes (lead: after the merge, \
            point them at ARCHITECTURE.md and remove this ignore)"]
fn no_file_cites_a_document_that_is_not_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(root, &mut all);
    let mut citing = Vec::new();
    for path in &all {
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
