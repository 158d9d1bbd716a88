//! The tokenizer the lint and the other bundle checks share: comments (`--`, nested
//! `/* */`), string literals (`'…'`, `N'…'`, `''` escapes), quoted identifiers (`[…]` with
//! `]]`, `"…"`), numbers, words and punctuation. It never fails: an unterminated construct
//! runs to the end of the text and is recorded in `problems`.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Keyword or plain identifier, including `@variable`, `@@function`, `#temp`.
    Word,
    Number,
    /// `'…'` or `N'…'`; `text` includes the prefix and the quotes.
    Str,
    /// `[…]` or `"…"`; `text` includes the delimiters.
    Ident,
    Punct,
    /// `-- …` (without the newline) or `/* … */` (nested).
    Comment,
}

#[derive(Clone, Debug)]
pub struct Token<'a> {
    pub kind: Kind,
    pub text: &'a str,
    /// Byte offset in the lexed text.
    pub start: usize,
    /// 1-based line of the first character.
    pub line: usize,
}

impl Token<'_> {
    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }

    /// A keyword or plain identifier, compared case-insensitively.
    pub fn is(&self, word: &str) -> bool {
        self.kind == Kind::Word && self.text.eq_ignore_ascii_case(word)
    }

    pub fn is_any(&self, words: &[&str]) -> bool {
        words.iter().any(|w| self.is(w))
    }

    pub fn is_punct(&self, c: u8) -> bool {
        self.kind == Kind::Punct && self.text.as_bytes() == [c]
    }

    /// The value of a string literal (without `N`, quotes and `''` escapes).
    pub fn string_value(&self) -> String {
        let body = self.text.strip_prefix(['N', 'n']).unwrap_or(self.text);
        let body = body.strip_prefix('\'').unwrap_or(body);
        // Find the closing quote (a lone `'`); an unterminated literal runs to the end.
        let bytes = body.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\'' {
                if bytes.get(i + 1) == Some(&b'\'') {
                    i += 2;
                    continue;
                }
                break;
            }
            i += 1;
        }
        body[..i].replace("''", "'")
    }

    /// The name inside `[…]`/`"…"` (escapes undone), or the word itself.
    pub fn ident_value(&self) -> String {
        match self.kind {
            Kind::Ident if self.text.starts_with('[') => {
                let body = &self.text[1..];
                body.strip_suffix(']').unwrap_or(body).replace("]]", "]")
            }
            Kind::Ident => {
                let body = &self.text[1..];
                body.strip_suffix('"').unwrap_or(body).replace("\"\"", "\"")
            }
            _ => self.text.to_owned(),
        }
    }
}

pub struct Lexed<'a> {
    pub tokens: Vec<Token<'a>>,
    /// (line, message) of unterminated comments, strings and quoted identifiers.
    pub problems: Vec<(usize, String)>,
}

fn is_word_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'@' || b == b'#' || b >= 0x80
}

fn is_word_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'@' || b == b'#' || b == b'$' || b >= 0x80
}

impl<'a> Lexed<'a> {
    /// The tokens without comments: what the server compiles.
    pub fn code(&self) -> Vec<&Token<'a>> {
        self.tokens
            .iter()
            .filter(|t| t.kind != Kind::Comment)
            .collect()
    }
}

/// Splits T-SQL into tokens. Never fails: an unterminated construct runs to the end of the
/// text and is recorded in `problems`.
pub fn lex(src: &str) -> Lexed<'_> {
    let bytes = src.as_bytes();
    let n = bytes.len();
    let mut tokens = Vec::new();
    let mut problems = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < n {
        let b = bytes[i];
        let start = i;
        let start_line = line;
        let kind;
        if b == b'\n' {
            line += 1;
            i += 1;
            continue;
        } else if b.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if b == b'-' && bytes.get(i + 1) == Some(&b'-') {
            while i < n && bytes[i] != b'\n' {
                i += 1;
            }
            kind = Kind::Comment;
        } else if b == b'/' && bytes.get(i + 1) == Some(&b'*') {
            // T-SQL block comments nest.
            let mut depth = 1;
            i += 2;
            while i < n && depth > 0 {
                if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                } else {
                    if bytes[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
            if depth > 0 {
                problems.push((
                    start_line,
                    "block comment `/*` is never closed (T-SQL block comments nest: every \
                     `/*` inside it needs its own `*/`); close it with `*/`"
                        .to_owned(),
                ));
            }
            kind = Kind::Comment;
        } else if b == b'\'' || ((b == b'N' || b == b'n') && bytes.get(i + 1) == Some(&b'\'')) {
            i += if b == b'\'' { 1 } else { 2 };
            let (next, closed) = scan_quoted(bytes, i, b'\'', &mut line);
            i = next;
            if !closed {
                problems.push((
                    start_line,
                    "string literal is never closed; end it with `'` (write a quote inside \
                     a string as `''`)"
                        .to_owned(),
                ));
            }
            kind = Kind::Str;
        } else if b == b'[' || b == b'"' {
            let close = if b == b'[' { b']' } else { b'"' };
            let (next, closed) = scan_quoted(bytes, i + 1, close, &mut line);
            i = next;
            if !closed {
                problems.push((
                    start_line,
                    format!(
                        "quoted identifier `{}` is never closed; end it with `{}` (write `{}` \
                         inside it as `{}{}`)",
                        b as char, close as char, close as char, close as char, close as char
                    ),
                ));
            }
            kind = Kind::Ident;
        } else if b.is_ascii_digit() {
            while i < n && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
            kind = Kind::Number;
        } else if is_word_start(b) {
            while i < n && is_word_char(bytes[i]) {
                i += 1;
            }
            kind = Kind::Word;
        } else {
            i += 1;
            kind = Kind::Punct;
        }
        tokens.push(Token {
            kind,
            text: &src[start..i],
            start,
            line: start_line,
        });
    }
    Lexed { tokens, problems }
}

/// Scans to the closing `close` (a doubled `close` is an escape). Returns the index after
/// the literal and whether it was closed.
fn scan_quoted(bytes: &[u8], mut i: usize, close: u8, line: &mut usize) -> (usize, bool) {
    while i < bytes.len() {
        if bytes[i] == close {
            if bytes.get(i + 1) == Some(&close) {
                i += 2;
                continue;
            }
            return (i + 1, true);
        }
        if bytes[i] == b'\n' {
            *line += 1;
        }
        i += 1;
    }
    (i, false)
}

/// The text with comments, string contents and quoted-identifier contents blanked
/// (newlines kept): what the server sees as bare code, line by line.
pub fn code_mask(src: &str, tokens: &[Token<'_>]) -> String {
    let mut mask: Vec<u8> = src
        .bytes()
        .map(|b| if b == b'\n' { b'\n' } else { b' ' })
        .collect();
    for t in tokens {
        match t.kind {
            Kind::Comment => {}
            Kind::Str | Kind::Ident => {
                mask[t.start] = b'x';
                mask[t.end() - 1] = b'x';
            }
            _ => mask[t.start..t.end()].copy_from_slice(t.text.as_bytes()),
        }
    }
    String::from_utf8_lossy(&mask).into_owned()
}

/// The text with comments blanked (newlines kept); strings and identifiers stay.
pub fn comment_free(src: &str, tokens: &[Token<'_>]) -> String {
    let mut text = src.as_bytes().to_vec();
    for t in tokens.iter().filter(|t| t.kind == Kind::Comment) {
        for b in &mut text[t.start..t.end()] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

pub fn snippet(code: &[&Token<'_>], from: usize) -> String {
    let mut s = String::new();
    for t in code.iter().skip(from).take(6) {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(t.text.lines().next().unwrap_or(""));
    }
    s
}

/// Runs `f` over the tokens of every string literal's value (dynamic SQL), with lines
/// mapped back to the file.
pub fn in_strings(
    code: &[&Token<'_>],
    f: impl Fn(&[&Token<'_>]) -> Vec<(usize, String)>,
) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for t in code.iter().filter(|t| t.kind == Kind::Str) {
        let value = t.string_value();
        let lexed = lex(&value);
        let inner: Vec<&Token<'_>> = lexed.code();
        found.extend(
            f(&inner)
                .into_iter()
                .map(|(line, what)| (t.line + line - 1, what)),
        );
    }
    found
}
