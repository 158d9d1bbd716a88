//! The house rules of `src/`, checked by reading the source files as text:
//!
//! * **no import loop**: in the library and in the `changefeed` binary, no module reaches a
//!   sibling module that (directly or through other siblings) reaches it back. A reference
//!   is any `crate::…`, `super::…` or `self::…` path, in a `use` line (braces expanded) or in
//!   an expression; `mod` declarations give the tree. A child using its parent (`use
//!   super::*`) or a parent its child is not a loop: only references between siblings, after
//!   lifting both ends to the children of their closest common ancestor, make the graph.
//! * **the file-size rule**: a file of `src/` has at most 700 lines, unless its `//!` header
//!   says why it must be one piece, in a sentence starting with "One piece:".
//!
//! Nothing here compiles or expands anything: a path hidden in a macro is not seen, and
//! comments and string literals are blanked before reading, so prose is not taken for code.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The most lines a file of `src/` may have without a reason.
const MAX_LINES: usize = 700;

/// What the header of a longer file says, followed by why it is one piece.
const ONE_PIECE: &str = "One piece:";

/// A module's path from its crate's root (`[]` is the root, `["relay", "postgres"]`).
type ModPath = Vec<String>;

/// One use of another module's name.
#[derive(Clone, Debug)]
struct Reference {
    /// The module the path is written in (inline modules included).
    from: ModPath,
    /// Where the path starts: the root for `crate`, an ancestor for `super`, `from` for `self`.
    base: ModPath,
    /// The path's segments after its start (a trailing `*` or `self` dropped).
    rest: Vec<String>,
    /// Where it is written, for the message.
    file: PathBuf,
    line: usize,
}

/// A crate read from its root file: its modules and every reference between them.
#[derive(Debug, Default)]
struct CrateTree {
    /// Every module (file or inline) and the file that holds it.
    modules: BTreeMap<ModPath, PathBuf>,
    references: Vec<Reference>,
}

/// An edge between two sibling modules, and one place that makes it.
#[derive(Clone, Debug)]
struct Edge {
    from: ModPath,
    to: ModPath,
    evidence: String,
}

fn name(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

// ---------------------------------------------------------------------------------------
// Reading Rust as text

/// `text` with comments and the contents of string and character literals replaced by
/// spaces; newlines are kept, so line numbers stay right.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            continue;
        }
        let starts_word = i == 0 || !ident(chars[i - 1]);
        // Raw strings: r"…", r#"…"#, br#"…"#.
        let raw_at = match (c, next) {
            ('r', Some('"' | '#')) if starts_word => Some(i + 1),
            ('b', Some('r')) if starts_word && matches!(chars.get(i + 2), Some('"' | '#')) => {
                Some(i + 2)
            }
            _ => None,
        };
        if let Some(mut j) = raw_at {
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                // Keep the prefix, blank the rest up to the closing quote and hashes.
                out.extend(&chars[i..=j]);
                j += 1;
                while j < chars.len() {
                    let closes =
                        chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#'));
                    if closes {
                        out.push('"');
                        out.extend(std::iter::repeat_n('#', hashes));
                        j += 1 + hashes;
                        break;
                    }
                    out.push(blank(chars[j]));
                    j += 1;
                }
                i = j;
                continue;
            }
            // `r#ident` (a raw identifier): an ordinary word.
        }
        if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = end {
                out.push('\'');
                out.extend(std::iter::repeat_n(' ', end - i - 1));
                out.push('\'');
                i = end + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// A word or a punctuation mark, with its line.
#[derive(Clone, Debug, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

/// The words (`r#` dropped), `::` and single punctuation marks of blanked code.
fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let mut word: String = chars[start..i].iter().collect();
            if word == "r" && chars.get(i) == Some(&'#') {
                let start = i + 1;
                i = start;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                word = chars[start..i].iter().collect();
            }
            tokens.push(Token { text: word, line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token {
                text: "::".to_owned(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

fn is_word(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The paths a `use` tree names, braces expanded (`a::{b, c::d}` is `a::b` and `a::c::d`),
/// each with the line its last segment is on. `tokens` starts after `use`; returns where
/// the tree ends.
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let mut segments = prefix;
    while let Some(token) = tokens.get(at) {
        match token.text.as_str() {
            "::" => at += 1,
            "{" => {
                at += 1;
                while let Some(token) = tokens.get(at) {
                    match token.text.as_str() {
                        "}" => return at + 1,
                        "," => at += 1,
                        _ => at = use_tree(tokens, at, segments.clone(), out),
                    }
                }
                return at;
            }
            "*" => {
                out.push((segments, token.line));
                return at + 1;
            }
            word if is_word(word) => {
                segments.push(word.to_owned());
                at += 1;
                if tokens.get(at).is_some_and(|t| t.text == "::") {
                    continue;
                }
                if tokens.get(at).is_some_and(|t| t.text == "as") {
                    at += 2;
                }
                out.push((segments, token.line));
                return at;
            }
            _ => return at + 1,
        }
    }
    at
}

/// Where the file of module `name`, declared in `file` inside the inline modules `inline`,
/// is: `name.rs` or `name/mod.rs`, in the folder of `file`'s children.
fn child_file(
    file: &Path,
    inline: &[String],
    name: &str,
    exists: &dyn Fn(&Path) -> bool,
) -> PathBuf {
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let mut folder = file.parent().unwrap_or(Path::new("")).to_path_buf();
    if !matches!(stem, "lib" | "main" | "mod") {
        folder.push(stem);
    }
    for module in inline {
        folder.push(module);
    }
    let flat = folder.join(format!("{name}.rs"));
    let nested = folder.join(name).join("mod.rs");
    if exists(&flat) {
        flat
    } else if exists(&nested) {
        nested
    } else {
        panic!(
            "{}: mod {name}; has no file ({} or {})",
            file.display(),
            flat.display(),
            nested.display()
        )
    }
}

/// Reads the crate whose root file is `root`, with `read` giving a file's text (`None`: no
/// such file).
fn read_crate(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> CrateTree {
    let mut tree = CrateTree::default();
    let mut pending = vec![(Vec::<String>::new(), root.to_path_buf())];
    while let Some((module, file)) = pending.pop() {
        let text = read(&file).unwrap_or_else(|| panic!("cannot read {}", file.display()));
        tree.modules.insert(module.clone(), file.clone());
        let tokens = tokens(&blank_comments_and_literals(&text));
        // The inline modules open at this point, with the brace depth inside each.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let current = |inline: &[(String, usize)]| -> ModPath {
            let mut path = module.clone();
            path.extend(inline.iter().map(|(name, _)| name.clone()));
            path
        };
        let mut at = 0;
        while at < tokens.len() {
            let token = &tokens[at];
            match token.text.as_str() {
                "{" => depth += 1,
                "}" => {
                    if inline.last().is_some_and(|(_, open)| *open == depth) {
                        inline.pop();
                    }
                    depth -= 1;
                }
                "mod" => {
                    let name = tokens[at + 1].text.clone();
                    match tokens.get(at + 2).map(|t| t.text.as_str()) {
                        Some(";") => {
                            let names: Vec<String> =
                                inline.iter().map(|(name, _)| name.clone()).collect();
                            let exists = |path: &Path| read(path).is_some();
                            let child_path = child_file(&file, &names, &name, &exists);
                            let mut child = current(&inline);
                            child.push(name);
                            pending.push((child, child_path));
                            at += 3;
                            continue;
                        }
                        Some("{") => {
                            depth += 1;
                            inline.push((name, depth));
                            tree.modules.insert(current(&inline), file.clone());
                            at += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
                "use" => {
                    let mut paths = Vec::new();
                    let end = use_tree(&tokens, at + 1, Vec::new(), &mut paths);
                    let from = current(&inline);
                    for (segments, line) in paths {
                        if let Some(reference) = reference(&from, &segments, &file, line) {
                            tree.references.push(reference);
                        }
                    }
                    at = end;
                    continue;
                }
                "crate" | "super" | "self"
                    if tokens.get(at + 1).is_some_and(|t| t.text == "::") =>
                {
                    // A path in an expression or a type: `crate::kafka::settings(…)`.
                    let mut segments = vec![token.text.clone()];
                    let mut end = at + 1;
                    while tokens.get(end).is_some_and(|t| t.text == "::")
                        && tokens.get(end + 1).is_some_and(|t| is_word(&t.text))
                    {
                        segments.push(tokens[end + 1].text.clone());
                        end += 2;
                    }
                    let from = current(&inline);
                    if let Some(reference) = reference(&from, &segments, &file, token.line) {
                        tree.references.push(reference);
                    }
                    at = end;
                    continue;
                }
                _ => {}
            }
            at += 1;
        }
    }
    tree
}

/// The reference a path written in `from` makes, if it starts at `crate`, `super` or `self`.
fn reference(from: &ModPath, segments: &[String], file: &Path, line: usize) -> Option<Reference> {
    let mut base = match segments.first()?.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => from.clone(),
        _ => return None,
    };
    let mut rest = &segments[1..];
    if segments[0] == "super" {
        base.pop();
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    let rest = rest
        .iter()
        .filter(|s| *s != "self" && *s != "*")
        .cloned()
        .collect();
    Some(Reference {
        from: from.clone(),
        base,
        rest,
        file: file.to_path_buf(),
        line,
    })
}

// ---------------------------------------------------------------------------------------
// The graph and its loops

/// The edges between sibling modules: each reference's ends are resolved to the deepest
/// module its path names, then lifted to the children of their closest common ancestor. A
/// reference from a module to its own ancestor or descendant makes no edge.
fn sibling_edges(tree: &CrateTree) -> Vec<Edge> {
    let mut edges = Vec::new();
    for reference in &tree.references {
        let mut target = reference.base.clone();
        for segment in &reference.rest {
            let mut deeper = target.clone();
            deeper.push(segment.clone());
            if !tree.modules.contains_key(&deeper) {
                break;
            }
            target = deeper;
        }
        let from = &reference.from;
        let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == target.len() {
            continue;
        }
        edges.push(Edge {
            from: from[..=common].to_vec(),
            to: target[..=common].to_vec(),
            evidence: format!(
                "{}:{} ({} uses {})",
                reference.file.display(),
                reference.line,
                name(from),
                name(&target)
            ),
        });
    }
    edges
}

/// Every loop between sibling modules, each once (shortest first from its smallest module),
/// as the lines that make it.
fn loops(edges: &[Edge]) -> Vec<String> {
    let mut next: BTreeMap<&ModPath, BTreeMap<&ModPath, &Edge>> = BTreeMap::new();
    for edge in edges {
        next.entry(&edge.from)
            .or_default()
            .entry(&edge.to)
            .or_insert(edge);
    }
    let mut seen: BTreeSet<BTreeSet<&ModPath>> = BTreeSet::new();
    let mut found = Vec::new();
    for (&start, targets) in &next {
        for (&first, &first_edge) in targets {
            // The shortest way back from `first` to `start`.
            let mut came_from: BTreeMap<&ModPath, (&ModPath, &Edge)> = BTreeMap::new();
            let mut queue = VecDeque::from([first]);
            let mut reached = false;
            while let Some(at) = queue.pop_front() {
                if reached {
                    break;
                }
                for (&to, &edge) in next.get(at).into_iter().flatten() {
                    if to != first && !came_from.contains_key(to) {
                        came_from.insert(to, (at, edge));
                        if to == start {
                            reached = true;
                            break;
                        }
                        queue.push_back(to);
                    }
                }
            }
            if !reached {
                continue;
            }
            let mut steps = vec![first_edge];
            let mut back = Vec::new();
            let mut at = start;
            while at != first {
                let (previous, edge) = came_from[at];
                back.push(edge);
                at = previous;
            }
            steps.extend(back.into_iter().rev());
            let members: BTreeSet<&ModPath> = steps.iter().map(|edge| &edge.from).collect();
            if !seen.insert(members) {
                continue;
            }
            let mut circle: Vec<String> = steps.iter().map(|edge| name(&edge.from)).collect();
            circle.push(name(start));
            let mut text = format!("loop {}:", circle.join(" -> "));
            for edge in steps {
                text.push_str(&format!("\n    {}", edge.evidence));
            }
            found.push(text);
        }
    }
    found
}

/// The loops of the crate rooted at `root` (relative to the package).
fn loops_of(root: &str) -> Vec<String> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &Path| std::fs::read_to_string(base.join(path)).ok();
    loops(&sibling_edges(&read_crate(Path::new(root), &read)))
}

fn assert_no_loops(root: &str) {
    let found = loops_of(root);
    assert!(
        found.is_empty(),
        "{root}: {} import loop(s) between sibling modules; move what both sides need into \
         a module of its own that imports neither:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_library_has_no_import_loop() {
    assert_no_loops("src/lib.rs");
}

#[test]
fn the_cli_has_no_import_loop() {
    assert_no_loops("src/bin/changefeed/main.rs");
}

// ---------------------------------------------------------------------------------------
// The file-size rule

/// The `//!` lines a file starts with (after blank lines and nothing else).
fn header(text: &str) -> String {
    text.lines()
        .map(str::trim_start)
        .skip_while(|line| line.is_empty())
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a file of `lines` lines with this text breaks the rule.
fn too_long(text: &str) -> bool {
    text.lines().count() > MAX_LINES && !header(text).contains(ONE_PIECE)
}

fn rust_files(folder: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_file_of_src_is_over_700_lines_without_a_reason() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&base.join("src"), &mut files);
    assert!(files.len() > 20, "the walk found the sources: {files:?}");
    let offenders: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).expect("a source file");
            too_long(&text).then(|| {
                format!(
                    "{} ({} lines)",
                    path.strip_prefix(base).unwrap_or(path).display(),
                    text.lines().count()
                )
            })
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "{} file(s) of src/ over {MAX_LINES} lines: split each along its concepts, or say in \
         its //! header why it must be one piece (\"{ONE_PIECE} …\"):\n  {}",
        offenders.len(),
        offenders.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// The checks themselves, on made-up trees

/// The loops of a crate made of `files` (path, text), rooted at the first.
fn loops_in(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, text)| (PathBuf::from(path), (*text).to_owned()))
        .collect();
    let root = files
        .keys()
        .find(|p| p.ends_with("main.rs"))
        .unwrap()
        .clone();
    let read = |path: &Path| files.get(path).cloned();
    loops(&sibling_edges(&read_crate(&root, &read)))
}

/// The only loop of `found`, which goes round `circle`.
fn the_one_loop<'f>(found: &'f [String], circle: &str) -> &'f str {
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(&format!("loop {circle}:")),
        "{}",
        found[0]
    );
    &found[0]
}

#[test]
fn a_loop_between_siblings_is_named_with_where_it_is_written() {
    let found = loops_in(&[
        ("bin/main.rs", "mod commands;\nmod export;\nmod output;\n"),
        (
            "bin/commands.rs",
            "use crate::output::Out;\n\npub fn run() { crate::export::export(); }\n",
        ),
        (
            "bin/export.rs",
            "//! Uses `crate::nothing` in prose.\nuse crate::{output, commands::{Connect, \
             procedure_exists}};\n",
        ),
        ("bin/output.rs", "pub struct Out;\n"),
    ]);
    let found = the_one_loop(&found, "commands -> export -> commands");
    assert!(found.contains("bin/commands.rs:3"), "{found}");
    assert!(found.contains("bin/export.rs:2"), "{found}");
}

#[test]
fn a_longer_loop_and_nested_modules_are_found() {
    let found = loops_in(&[
        ("main.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "pub mod inner;\n"),
        ("a/inner.rs", "fn f() { super::super::b::g(); }\n"),
        ("b.rs", "use crate::c;\n"),
        ("c.rs", "mod tests {\n    use crate::a::inner::*;\n}\n"),
    ]);
    the_one_loop(&found, "a -> b -> c -> a");
}

#[test]
fn parents_children_comments_and_strings_make_no_loop() {
    let found = loops_in(&[
        (
            "main.rs",
            "mod relay;\nmod output;\nfn main() { relay::run(); }\n",
        ),
        (
            "relay.rs",
            "pub mod postgres;\nuse crate::output::line;\n\
             // crate::output uses crate::relay::postgres, in a comment\n\
             fn f() { let _ = \"crate::output::x\"; let _ = r#\"crate::output\"#; }\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        (
            "relay/postgres.rs",
            "use super::Companion;\nmod enabled {\n    use super::super::run;\n    \
             use crate::output::line;\n}\n",
        ),
        (
            "output.rs",
            "/* crate::relay::run() */\npub fn line(c: char) { let _ = '\"'; let _: &'static \
             str = \"\\\"crate::relay\"; }\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn use_trees_expand_their_braces() {
    let code = "crate::{a::{b, c::d as e}, f::*, g::{self}}";
    let mut paths = Vec::new();
    use_tree(&tokens(code), 0, Vec::new(), &mut paths);
    let paths: Vec<String> = paths.into_iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::f",
            "crate::g::self"
        ]
    );
}

#[test]
fn a_long_file_needs_one_piece_in_its_header() {
    let body = "fn f() {}\n".repeat(MAX_LINES);
    assert!(!too_long(&body));
    let long = format!("//! A file.\n{body}");
    assert!(too_long(&long));
    let reasoned = format!("//! A file.\n//!\n//! One piece: the parser's states.\n{body}");
    assert!(!too_long(&reasoned));
    // The reason must be in the header, not further down.
    let buried = format!("//! A file.\n{body}// One piece: no.\n");
    assert!(too_long(&buried));
}
