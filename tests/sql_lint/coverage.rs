//! Every SQL object is exercised by a live test.
//!
//! The objects: every procedure, function and view that a file of `sql/` creates. A template
//! object (`[changefeed].[<kind>:changefeed.__template…__]`) stands for the objects generated
//! from it, so it counts as exercised when a live test calls its kind for a table of its
//! mode (`read_feed:` of a feed set up with `@outbox = 1` exercises the outbox-mode
//! template, of one set up with `@serialize_writers = 1` the serialized one; the claim
//! outbox templates need a `setup_outbox`).
//!
//! What counts as a call, per live test file (`tests/live_*.rs`, with `tests/common/`):
//! * SQL in the file: `changefeed.<name>`, `[changefeed].[<name>]`, `[changefeed].[<kind>:…]`
//!   and `<feed or table>.object("<kind>")`;
//! * calls through the crate (`src/`, not the CLI in `src/bin`): a live test reaches a
//!   library function by name (`name(` in its code), that function reaches the functions it
//!   calls by name, and the SQL those functions send counts (the same patterns, plus a kind
//!   literal passed to a function that builds `object(kind)`, like OutboxStore's `call`).
//!   The crate is how users call the bundle, so a live test that reads through FeedReader
//!   exercises read_feed. Matching is by function name, not by type: an over-approximation
//!   in the rare case of two functions with one name;
//! * inside the bundle: an object exercises the objects its code (and its dynamic SQL)
//!   calls, and the statements of the migrations themselves (`exec
//!   changefeed.create_feed_storage` in V12) run in every live test's migration. A view
//!   rebuilt in dynamic SQL (`feed_status`, rewritten by refresh_feed_status as the union of
//!   every feed's `status` view) calls the kinds its generator selects. A GRANT naming an
//!   object is not a call.
//!
//! The test prints `live coverage: <exercised>/<objects> objects` straight to the process's
//! stderr, which cargo test does not capture, so every `cargo test` run (and CI) shows it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::lex::{Kind, Token, lex};
use crate::{find_modules, read_bundle};

// ---------------------------------------------------------------------------------------
// Rust text
// ---------------------------------------------------------------------------------------

/// Rust source with comments blanked (newlines kept), and the byte spans of its string
/// literals (`"…"`, `r"…"`, `r#"…"#`, `b"…"`).
pub fn rust_code(src: &str) -> (String, Vec<(usize, usize)>) {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut strings = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out[i] = b' ';
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out[i] = b' ';
                    out[i + 1] = b' ';
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out[i] = b' ';
                    out[i + 1] = b' ';
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] != b'\n' {
                        out[i] = b' ';
                    }
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                i += 1;
                continue;
            }
            let start = j + 1;
            let mut k = start;
            loop {
                if k >= b.len() {
                    break;
                }
                if b[k] == b'"'
                    && b[k + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&c| c == b'#')
                        .count()
                        == hashes
                {
                    break;
                }
                k += 1;
            }
            strings.push((start, k.min(b.len())));
            i = k + 1 + hashes;
        } else if b[i] == b'"' {
            let start = i + 1;
            let mut k = start;
            while k < b.len() && b[k] != b'"' {
                if b[k] == b'\\' {
                    k += 1;
                }
                k += 1;
            }
            strings.push((start, k.min(b.len())));
            i = k + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\''), kept as a string span so that a brace in
            // it is not code; or a lifetime ('a), left alone.
            let end = if b.get(i + 1) == Some(&b'\\') {
                let mut k = i + 3;
                while k < b.len() && b[k] != b'\'' {
                    k += 1;
                }
                Some(k)
            } else {
                let len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(k) => {
                    strings.push((i + 1, k));
                    i = k + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), strings)
}

fn in_string(strings: &[(usize, usize)], at: usize) -> bool {
    strings.iter().any(|&(a, b)| a <= at && at < b)
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every `name(` outside strings: the functions and methods this code calls.
fn called_names(code: &str, strings: &[(usize, usize)]) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        if is_ident_byte(b[i]) && (i == 0 || !is_ident_byte(b[i - 1])) {
            let start = i;
            while i < b.len() && is_ident_byte(b[i]) {
                i += 1;
            }
            let mut j = i;
            // `name::<T>(` and `name (`
            if code[j..].starts_with("::<") {
                let mut depth = 0;
                while j < b.len() {
                    if b[j] == b'<' {
                        depth += 1;
                    } else if b[j] == b'>' {
                        depth -= 1;
                        if depth == 0 {
                            j += 1;
                            break;
                        }
                    }
                    j += 1;
                }
            }
            if b.get(j) == Some(&b'(') && !in_string(strings, start) {
                out.insert(code[start..i].to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A function of `src/`: its name and its body (comment-free, strings kept).
struct RustFn {
    name: String,
    body: String,
    strings: Vec<(usize, usize)>,
}

fn rust_functions(src: &str) -> Vec<RustFn> {
    let (code, strings) = rust_code(src);
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("fn ") {
        let at = from + pos;
        from = at + 3;
        if (at > 0 && is_ident_byte(b[at - 1])) || in_string(&strings, at) {
            continue;
        }
        let name_start = at + 3;
        let mut k = name_start;
        while k < b.len() && is_ident_byte(b[k]) {
            k += 1;
        }
        if k == name_start {
            continue;
        }
        let name = code[name_start..k].to_owned();
        // The body: from the first `{` (or `;` for a declaration) to its matching `}`.
        let mut j = k;
        while j < b.len()
            && (b[j] != b'{' || in_string(&strings, j))
            && (b[j] != b';' || in_string(&strings, j))
        {
            j += 1;
        }
        if j >= b.len() || b[j] == b';' {
            continue;
        }
        let open = j;
        let mut depth = 0;
        while j < b.len() {
            if !in_string(&strings, j) {
                if b[j] == b'{' {
                    depth += 1;
                } else if b[j] == b'}' {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
            }
            j += 1;
        }
        let body_strings = strings
            .iter()
            .filter(|&&(a, e)| a >= open && e <= j)
            .map(|&(a, e)| (a - open, e - open))
            .collect();
        out.push(RustFn {
            name,
            body: code[open..j.min(b.len())].to_owned(),
            strings: body_strings,
        });
    }
    out
}

/// What a piece of Rust (a live test file or a function body) names of the bundle:
/// object names (`changefeed.x`, `[changefeed].[x]`) and kinds (`[changefeed].[kind:…]`,
/// `.object("kind")`, and kind literals passed to an object forwarder).
#[derive(Default, Debug)]
struct Mentions {
    names: BTreeSet<String>,
    kinds: BTreeSet<String>,
}

fn mentions(code: &str, strings: &[(usize, usize)], forwarders: &BTreeSet<String>) -> Mentions {
    let mut m = Mentions::default();
    let lower = code.to_ascii_lowercase();
    for prefix in ["changefeed.", "[changefeed].["] {
        for (at, _) in lower.match_indices(prefix) {
            if at > 0
                && (is_ident_byte(lower.as_bytes()[at - 1]) || lower.as_bytes()[at - 1] == b'.')
            {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let word = &rest[..end];
            match word.split_once(':') {
                Some((kind, _)) => m.kinds.insert(kind.to_ascii_lowercase()),
                None => m.names.insert(word.to_ascii_lowercase()),
            };
        }
    }
    for (at, _) in code.match_indices("object(\"") {
        let rest = &code[at + 8..];
        if let Some(end) = rest.find('"') {
            m.kinds.insert(rest[..end].to_ascii_lowercase());
        }
    }
    for f in forwarders {
        for (at, _) in code.match_indices(&format!("{f}(")) {
            if at > 0 && is_ident_byte(code.as_bytes()[at - 1]) {
                continue;
            }
            let open = at + f.len();
            let mut depth = 0;
            for (k, c) in code[open..].char_indices() {
                match c {
                    '(' if !in_string(strings, open + k) => depth += 1,
                    ')' if !in_string(strings, open + k) => {
                        depth -= 1;
                        if depth == 0 {
                            let args = open..open + k;
                            for &(a, e) in strings.iter().filter(|(a, _)| args.contains(a)) {
                                let literal = &code[a..e];
                                if !literal.is_empty()
                                    && literal.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')
                                {
                                    m.kinds.insert(literal.to_owned());
                                }
                            }
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    m
}

/// Functions that build `object(<their parameter>)`: a kind passed to them is called. So
/// are functions that hand their own `kind` on to one of those (`call_count` passing `kind`
/// to `call`), however long the chain.
fn forwarders(functions: &[RustFn]) -> BTreeSet<String> {
    let mut found: BTreeSet<String> = functions
        .iter()
        .filter(|f| {
            f.body.match_indices("object(").any(|(at, _)| {
                let rest = &f.body[at + 7..];
                rest.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && !in_string(&f.strings, at)
            })
        })
        .map(|f| f.name.clone())
        .filter(|n| n != "object")
        .collect();
    loop {
        let more: Vec<String> = functions
            .iter()
            .filter(|f| !found.contains(&f.name))
            .filter(|f| found.iter().any(|to| passes_kind_to(f, to)))
            .map(|f| f.name.clone())
            .collect();
        if more.is_empty() {
            return found;
        }
        found.extend(more);
    }
}

/// Whether `f` calls `to(…)` with the identifier `kind` among the call's arguments.
fn passes_kind_to(f: &RustFn, to: &str) -> bool {
    let call = format!("{to}(");
    f.body.match_indices(&call).any(|(at, _)| {
        let named = at == 0
            || !f.body[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !named || in_string(&f.strings, at) {
            return false;
        }
        let arguments = &f.body[at + call.len()..];
        let mut depth = 1;
        let end = arguments
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(arguments.len(), |(i, _)| i);
        arguments[..end]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == "kind")
    })
}

// ---------------------------------------------------------------------------------------
// The bundle's objects and what each one calls
// ---------------------------------------------------------------------------------------

/// A template table and the setup that gives a table of its mode.
const TEMPLATE_MODES: &[(&str, &str)] = &[
    ("__template__", "outbox"),
    ("__template_serialized__", "serialize_writers"),
    ("__template_outbox__", "claim outbox"),
];

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Object {
    Plain(String),
    /// (kind, template table)
    Template(String, String),
}

impl Object {
    fn shown(&self) -> String {
        match self {
            Object::Plain(n) => format!("[changefeed].[{n}]"),
            Object::Template(k, t) => format!("[changefeed].[{k}:changefeed.{t}]"),
        }
    }
}

#[derive(Default, Debug)]
struct Edges {
    names: BTreeSet<String>,
    kinds: BTreeSet<String>,
    templates: BTreeSet<Object>,
}

fn classify(name: &str) -> Object {
    let lower = name.to_ascii_lowercase();
    match lower.split_once(":changefeed.") {
        Some((kind, table)) if table.starts_with("__template") => {
            Object::Template(kind.to_owned(), table.to_owned())
        }
        _ => Object::Plain(lower),
    }
}

/// References in one token stream: (object named, is a definition).
fn references(code: &[&Token<'_>], edges: &mut Edges, defined: &mut BTreeSet<String>) {
    for i in 0..code.len() {
        let t = code[i];
        if !(matches!(t.kind, Kind::Word | Kind::Ident)
            && t.ident_value().eq_ignore_ascii_case("changefeed")
            && code.get(i + 1).is_some_and(|n| n.is_punct(b'.')))
            || (i > 0 && code[i - 1].is_punct(b'.'))
        {
            continue;
        }
        let Some(name) = code
            .get(i + 2)
            .filter(|n| matches!(n.kind, Kind::Word | Kind::Ident))
        else {
            continue;
        };
        let granted = i >= 2 && code[i - 1].is_punct(b':') && code[i - 2].is_punct(b':');
        let definition = i >= 1 && code[i - 1].is_any(&["view", "procedure", "proc", "function"]);
        let name = name.ident_value();
        if definition {
            defined.insert(name.to_ascii_lowercase());
        } else if !granted {
            match classify(&name) {
                Object::Plain(n) => {
                    edges.names.insert(n);
                }
                template => {
                    edges.templates.insert(template);
                }
            }
        }
    }
}

/// `kind = N'<k>'` in a generator: the kinds of per-feed objects it selects.
fn selected_kinds(code: &[&Token<'_>]) -> BTreeSet<String> {
    (2..code.len())
        .filter(|&i| {
            code[i].kind == Kind::Str && code[i - 1].is_punct(b'=') && code[i - 2].is("kind")
        })
        .map(|i| code[i].string_value().to_ascii_lowercase())
        .collect()
}

struct Bundle {
    objects: BTreeSet<Object>,
    edges: BTreeMap<Object, Edges>,
    /// Objects the migrations themselves call.
    migration_calls: Edges,
}

fn bundle() -> Bundle {
    let (files, _) = read_bundle();
    let mut objects = BTreeSet::new();
    let mut edges: BTreeMap<Object, Edges> = BTreeMap::new();
    let mut migration_calls = Edges::default();
    let mut dynamic: Vec<(String, BTreeSet<String>, Edges)> = Vec::new();
    for (_, text) in &files {
        let lexed = lex(text);
        let code: Vec<&Token<'_>> = lexed.code();
        let module = find_modules(text, &code).into_iter().next();
        let mut own = Edges::default();
        let mut defined = BTreeSet::new();
        references(&code, &mut own, &mut defined);
        let mut in_strings = Edges::default();
        let mut defined_in_strings = BTreeSet::new();
        for s in code.iter().filter(|t| t.kind == Kind::Str) {
            let value = s.string_value();
            let inner = lex(&value);
            let inner: Vec<&Token<'_>> = inner.code();
            references(&inner, &mut in_strings, &mut defined_in_strings);
        }
        match module {
            None => {
                migration_calls.names.extend(own.names);
                migration_calls.names.extend(in_strings.names);
            }
            Some(m) => {
                let name = m.name_parts.last().cloned().unwrap_or_default();
                let object = classify(&name);
                objects.insert(object.clone());
                if let Some(target) = defined_in_strings.iter().next() {
                    // A generator: what its dynamic text defines calls what it selects.
                    in_strings.kinds.extend(selected_kinds(&code));
                    dynamic.push((target.clone(), BTreeSet::new(), in_strings));
                } else {
                    own.names.extend(in_strings.names);
                    own.templates.extend(in_strings.templates);
                }
                own.names.remove(&name.to_ascii_lowercase());
                edges.insert(object, own);
            }
        }
    }
    for (target, _, extra) in dynamic {
        let e = edges.entry(Object::Plain(target)).or_default();
        e.names.extend(extra.names);
        e.kinds.extend(extra.kinds);
        e.templates.extend(extra.templates);
    }
    Bundle {
        objects,
        edges,
        migration_calls,
    }
}

// ---------------------------------------------------------------------------------------
// Reachability from the live tests
// ---------------------------------------------------------------------------------------

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modes a live test file sets tables up in.
fn modes(text: &str) -> BTreeSet<&'static str> {
    let compact: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = BTreeSet::new();
    if compact.contains("@outbox = 1") {
        out.insert("outbox");
    }
    if compact.contains("@serialize_writers = 1") {
        out.insert("serialize_writers");
    }
    if compact.contains("setup_outbox") {
        out.insert("claim outbox");
    }
    out
}

/// The objects one live test file exercises.
fn exercised_by(
    bundle: &Bundle,
    live: &str,
    common: &str,
    library: &[RustFn],
    forwarders: &BTreeSet<String>,
) -> BTreeSet<Object> {
    let (code, strings) = rust_code(live);
    let (common_code, common_strings) = rust_code(common);
    let mut file_modes = modes(&code);
    file_modes.extend(modes(&common_code));

    let mut found = mentions(&code, &strings, forwarders);
    let common_mentions = mentions(&common_code, &common_strings, forwarders);
    found.names.extend(common_mentions.names);
    found.kinds.extend(common_mentions.kinds);

    // Library functions reached by name.
    let mut called = called_names(&code, &strings);
    called.extend(called_names(&common_code, &common_strings));
    let mut reached: BTreeSet<String> = BTreeSet::new();
    let mut queue: Vec<String> = called.into_iter().collect();
    while let Some(name) = queue.pop() {
        if !reached.insert(name.clone()) {
            continue;
        }
        for f in library.iter().filter(|f| f.name == name) {
            let m = mentions(&f.body, &f.strings, forwarders);
            found.names.extend(m.names);
            found.kinds.extend(m.kinds);
            queue.extend(called_names(&f.body, &f.strings));
        }
    }

    // The bundle's own calls.
    let mut exercised = BTreeSet::new();
    let mut names: Vec<String> = found.names.into_iter().collect();
    names.extend(bundle.migration_calls.names.iter().cloned());
    let mut kinds: Vec<String> = found.kinds.into_iter().collect();
    let mut templates: Vec<Object> = Vec::new();
    let mut seen_kinds = BTreeSet::new();
    loop {
        let mut next: Vec<Object> = Vec::new();
        next.extend(names.drain(..).map(Object::Plain));
        next.append(&mut templates);
        for kind in kinds.drain(..) {
            if !seen_kinds.insert(kind.clone()) {
                continue;
            }
            for (table, mode) in TEMPLATE_MODES {
                if file_modes.contains(mode) {
                    next.push(Object::Template(kind.clone(), (*table).to_owned()));
                }
            }
        }
        if next.is_empty() {
            break;
        }
        for object in next {
            if !bundle.objects.contains(&object) || !exercised.insert(object.clone()) {
                continue;
            }
            if let Some(e) = bundle.edges.get(&object) {
                names.extend(e.names.iter().cloned());
                kinds.extend(e.kinds.iter().cloned());
                templates.extend(e.templates.iter().cloned());
            }
        }
    }
    exercised
}

#[test]
fn every_sql_object_is_called_by_a_live_test() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bundle = bundle();
    assert!(bundle.objects.len() > 10, "found only {:?}", bundle.objects);

    let mut library_files = Vec::new();
    rust_files(&root.join("src"), &mut library_files);
    let library: Vec<RustFn> = library_files
        .iter()
        .filter(|p| !p.starts_with(root.join("src").join("bin")))
        .flat_map(|p| rust_functions(&std::fs::read_to_string(p).expect("a source file")))
        .collect();
    let forwarders = forwarders(&library);

    let mut common_files = Vec::new();
    rust_files(&root.join("tests").join("common"), &mut common_files);
    let common: String = common_files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("a common test file"))
        .collect::<Vec<_>>()
        .join("\n");

    let mut live_files: Vec<PathBuf> = std::fs::read_dir(root.join("tests"))
        .expect("tests/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("live_") && n.ends_with(".rs"))
        })
        .collect();
    live_files.sort();
    assert!(!live_files.is_empty(), "no tests/live_*.rs");

    let mut exercised = BTreeSet::new();
    for file in &live_files {
        let text = std::fs::read_to_string(file).expect("a live test file");
        exercised.extend(exercised_by(&bundle, &text, &common, &library, &forwarders));
    }
    let missing: Vec<String> = bundle
        .objects
        .iter()
        .filter(|o| !exercised.contains(o))
        .map(Object::shown)
        .collect();
    let line = format!(
        "live coverage: {}/{} objects{}\n",
        bundle.objects.len() - missing.len(),
        bundle.objects.len(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(" (never called: {})", missing.join(", "))
        }
    );
    // Straight to stderr: cargo test captures eprintln! of passing tests, not this.
    let _ = std::io::stderr().write_all(line.as_bytes());
    assert!(
        missing.is_empty(),
        "{} SQL object(s) are never called by a live test (tests/live_*.rs, directly or \
         through the crate): {}. Add a live scenario that calls each (a template counts when \
         its kind is called for a table of its mode).",
        missing.len(),
        missing.join(", ")
    );
}

#[test]
fn rust_scanning_sees_calls_and_sql_but_not_comments() {
    let src = r##"
        // exec changefeed.not_called
        /// changefeed.nor_this
        pub async fn enqueue(&self) -> u8 {
            let sql = "exec changefeed.setup_outbox @table_name = N'{x}'; } {";
            let raw = r#"select * from [changefeed].[status:dbo.t] -- "quoted""#;
            let c = '}';
            self.call(client, "claim", "@x = @P1");
            feed.object("lock_feed");
            helper::<u8>(1)
        }
        fn call(&self, kind: &str) -> String { format!("exec {}", self.table.object(kind)) }
    "##;
    let functions = rust_functions(src);
    let names: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["enqueue", "call"]);
    let forwarders = forwarders(&functions);
    assert_eq!(forwarders, BTreeSet::from(["call".to_owned()]));
    let f = &functions[0];
    let m = mentions(&f.body, &f.strings, &forwarders);
    assert_eq!(m.names, BTreeSet::from(["setup_outbox".to_owned()]));
    assert_eq!(
        m.kinds,
        BTreeSet::from([
            "claim".to_owned(),
            "lock_feed".to_owned(),
            "status".to_owned()
        ])
    );
    let called = called_names(&f.body, &f.strings);
    assert!(called.contains("call") && called.contains("helper") && called.contains("object"));
    assert!(!called.contains("exec"));
}

#[test]
fn a_kind_handed_on_to_a_forwarder_is_called() {
    let src = r##"
        fn mark_failed(&self) -> u8 { self.call_count(client, "mark_failed", "@id = @P1") }
        fn call_count(&self, kind: &str) -> u8 { self.call(client, kind, arguments) }
        fn call(&self, kind: &str) -> String { format!("exec {}", self.table.object(kind)) }
        fn recall(&self, kinds: &str) -> u8 { self.call(client, "done", kinds) }
    "##;
    let functions = rust_functions(src);
    let forwarders = forwarders(&functions);
    // recall passes no `kind` of its own: its literal is the call, not a forwarded kind.
    assert_eq!(
        forwarders,
        BTreeSet::from(["call".to_owned(), "call_count".to_owned()])
    );
    let m = mentions(&functions[0].body, &functions[0].strings, &forwarders);
    assert_eq!(m.kinds, BTreeSet::from(["mark_failed".to_owned()]));
}

#[test]
fn templates_count_only_for_a_table_of_their_mode() {
    let bundle = bundle();
    let read_outbox = Object::Template("read_feed".into(), "__template__".into());
    let read_serialized = Object::Template("read_feed".into(), "__template_serialized__".into());
    let live = "exec(&mut c, \"exec changefeed.setup_feed @table_name = N'dbo.t', @outbox = 1;\");\n\
                exec(&mut c, &format!(\"exec {} @shard_id = 0\", feed.object(\"read_feed\")));";
    let exercised = exercised_by(&bundle, live, "", &[], &BTreeSet::new());
    assert!(exercised.contains(&read_outbox), "{exercised:?}");
    assert!(!exercised.contains(&read_serialized), "{exercised:?}");
    // setup_feed calls what it needs inside the bundle (upgrade_feed, copy_template, …),
    // and the migrations call create_feed_storage.
    for name in [
        "setup_feed",
        "upgrade_feed",
        "copy_template",
        "create_feed_storage",
    ] {
        assert!(
            exercised.contains(&Object::Plain(name.into())),
            "{name}: {exercised:?}"
        );
    }
    // Nothing reads feed_status here, so no status view is exercised.
    assert!(!exercised.contains(&Object::Template("status".into(), "__template__".into())));
    let with_status = format!("{live}\nrows(&mut c, \"select * from changefeed.feed_status\");");
    let exercised = exercised_by(&bundle, &with_status, "", &[], &BTreeSet::new());
    assert!(exercised.contains(&Object::Template("status".into(), "__template__".into())));
}
