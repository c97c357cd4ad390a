//! No function in src/ is longer than [`CEILING`] lines (from its `fn` line to its closing brace),
//! except today's longer ones in [`ALLOWED`], each held to its length when it was listed: one that
//! grows fails, and one that shrinks fails too until its entry is lowered (or removed, once it
//! fits under the ceiling), so that the list only ever shrinks.

use crate::common;

use common::rust_files;
use std::collections::BTreeMap;
use std::path::Path;

/// The longest a function may be, signature to closing brace.
const CEILING: usize = 120;

/// The functions over [`CEILING`] lines when this test was written (issue 57): file, function,
/// its length then. A new entry is not a fix; shorten the function.
/// Empty since issue 70 split the last two (plot's `draw_xy`, 156, and `draw_heatmaps`, 155).
const ALLOWED: &[(&str, &str, usize)] = &[];

/// A token of Rust source with its line: an identifier or keyword, or one punctuation character.
/// Comments, string, byte-string, raw-string and character literals are skipped (a brace in them
/// is not code); a lifetime's quote is dropped and its name read as an identifier.
#[derive(Debug, PartialEq)]
enum Token {
    Ident(String, usize),
    Punct(char, usize),
}

fn tokens(text: &str) -> Vec<Token> {
    let s: Vec<char> = text.chars().collect();
    let (n, mut i, mut line) = (s.len(), 0, 1);
    let mut out = Vec::new();
    // Where to go on from `i`: `to`, counting the lines passed.
    let advance = |line: &mut usize, i: usize, to: usize| {
        *line += s[i..to.min(n)].iter().filter(|&&c| c == '\n').count();
        to
    };
    let find = |from: usize, pat: &[char]| -> usize { (from..n).find(|&k| s[k..].starts_with(pat)).unwrap_or(n) };
    while i < n {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c.is_whitespace() {
            i = advance(&mut line, i, i + 1);
        } else if c == '/' && next == Some('/') {
            let end = find(i, &['\n']);
            i = advance(&mut line, i, end);
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut k) = (1, i + 2);
            while k < n && depth > 0 {
                if s[k..].starts_with(&['/', '*']) {
                    depth += 1;
                    k += 2;
                } else if s[k..].starts_with(&['*', '/']) {
                    depth -= 1;
                    k += 2;
                } else {
                    k += 1;
                }
            }
            i = advance(&mut line, i, k);
        } else if let Some(end) = raw_string_end(&s, i) {
            i = advance(&mut line, i, end);
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            let mut k = if c == 'b' { i + 2 } else { i + 1 };
            while k < n && s[k] != '"' {
                k += if s[k] == '\\' { 2 } else { 1 };
            }
            i = advance(&mut line, i, k + 1);
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            let k = if c == 'b' { i + 2 } else { i + 1 };
            if s.get(k) == Some(&'\\') {
                let end = find(k + 2, &['\'']);
                i = advance(&mut line, i, end + 1);
            } else if s.get(k + 1) == Some(&'\'') {
                i = advance(&mut line, i, k + 2);
            } else {
                i = k; // a lifetime or a label
            }
        } else if c.is_alphanumeric() || c == '_' {
            let end = (i..n).find(|&k| !(s[k].is_alphanumeric() || s[k] == '_')).unwrap_or(n);
            out.push(Token::Ident(s[i..end].iter().collect(), line));
            i = end;
        } else {
            out.push(Token::Punct(c, line));
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br"…"`) that starts at `i` ends, if one does.
fn raw_string_end(s: &[char], i: usize) -> Option<usize> {
    let mut k = match (s.get(i), s.get(i + 1)) {
        (Some('r'), _) => i + 1,
        (Some('b'), Some('r')) => i + 2,
        _ => return None,
    };
    if i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_') {
        return None;
    }
    let hashes = s[k..].iter().take_while(|&&c| c == '#').count();
    k += hashes;
    if s.get(k) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
    let end = (k + 1..s.len()).find(|&j| s[j..].starts_with(&close)).unwrap_or(s.len());
    Some(end + close.len())
}

/// Every function with a body in `text`: its name, its `fn` line and its length in lines (the `fn`
/// line to the closing brace's, both counted). Nested functions are counted on their own too.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let t = tokens(text);
    let mut out = Vec::new();
    for k in 0..t.len().saturating_sub(1) {
        let (Token::Ident(kw, start), Token::Ident(name, _)) = (&t[k], &t[k + 1]) else { continue };
        if kw != "fn" {
            continue;
        }
        // The body's brace: the first `{` outside the signature's parentheses and brackets; a `;`
        // there first is a declaration without a body.
        let mut depth = 0i32;
        let mut body = None;
        for (m, tok) in t.iter().enumerate().skip(k + 2) {
            match tok {
                Token::Punct('(' | '[', _) => depth += 1,
                Token::Punct(')' | ']', _) => depth -= 1,
                Token::Punct('{', _) if depth == 0 => {
                    body = Some(m);
                    break;
                }
                Token::Punct(';', _) if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let mut braces = 0;
        for tok in &t[open..] {
            match tok {
                Token::Punct('{', _) => braces += 1,
                Token::Punct('}', end) => {
                    braces -= 1;
                    if braces == 0 {
                        out.push((name.clone(), *start, end - start + 1));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn no_function_in_src_grows_past_the_ceiling_and_the_allowed_ones_only_shrink() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&repo.join("src"), &mut files);
    files.sort();
    let allowed: BTreeMap<(&str, &str), usize> = ALLOWED.iter().map(|&(f, name, n)| ((f, name), n)).collect();
    let mut seen = BTreeMap::new();
    let mut problems = Vec::new();
    let mut count = 0;
    for f in &files {
        let rel = f.strip_prefix(repo).unwrap().to_string_lossy().replace('\\', "/");
        for (name, line, len) in functions(&std::fs::read_to_string(f).unwrap()) {
            count += 1;
            if len <= CEILING {
                continue;
            }
            let at = format!("{rel}:{line}: fn {name}, {len} lines");
            match allowed.get(&(rel.as_str(), name.as_str())) {
                None => problems.push(format!("{at}: over the ceiling of {CEILING}; split it")),
                Some(&ceiling) if len > ceiling => problems.push(format!("{at}: grew past its allowed {ceiling}")),
                Some(&ceiling) if len < ceiling => {
                    problems.push(format!("{at}: shrank from {ceiling}; lower its entry in ALLOWED to {len}"))
                }
                Some(_) => {}
            }
            seen.insert((rel.clone(), name), len);
        }
    }
    for &(f, name, n) in ALLOWED {
        if !seen.contains_key(&(f.to_string(), name.to_string())) {
            problems.push(format!(
                "{f}: fn {name} (allowed {n} lines) is gone or fits in {CEILING} lines; remove its entry from ALLOWED"
            ));
        }
    }
    assert!(count > 1000, "only {count} functions read: is the scan broken?");
    assert!(problems.is_empty(), "function lengths:\n{}", problems.join("\n"));
}

/// The scan itself: braces in strings, raw strings, characters and comments are not code;
/// lifetimes are not characters; declarations without a body and `fn` pointer types are not
/// functions; nested functions count on their own.
#[test]
fn functions_are_measured_from_fn_to_closing_brace() {
    let text = "trait T { fn declared(&self); }\n\
                fn outer<'a>(x: &'a str, f: fn(u8) -> u8) -> char {\n\
                \x20   let s = \"}}{\"; let r = r#\"}\"#; let c = '}'; let e = '\\'';\n\
                \x20   // }\n\
                \x20   /* } /* } */ } */\n\
                \x20   fn inner() {\n\
                \x20   }\n\
                \x20   'l: loop { break 'l; }\n\
                \x20   '{'\n\
                }\n";
    let got = functions(text);
    assert_eq!(got, [("outer".to_string(), 2, 9), ("inner".to_string(), 6, 2)]);
}

/// The files of `files` over `max_lines` lines and their functions over `max_fn` lines, each as
/// `path: what`, paths relative to the repository.
fn too_long(files: &[std::path::PathBuf], max_lines: usize, max_fn: usize) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let lines = text.lines().count();
        if lines > max_lines {
            long.push(format!("{rel}: {lines} lines"));
        }
        for (name, _, length) in functions(&text) {
            if length > max_fn {
                long.push(format!("{rel}: fn {name} is {length} lines"));
            }
        }
    }
    long
}

/// The command layer puts the lower layers together and prints (docs/architecture.md, "Adding a
/// verb"): no function in src/commands.rs or src/commands/ over 60 lines, and no file of it over
/// 600 (issue 57: commands.rs had grown to 1,139 lines and `sweep` to 156).
#[test]
fn the_command_layer_stays_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The commands and the command line that dispatches to them (cli::run: dispatch only).
    let mut files = vec![root.join("src/commands.rs"), root.join("src/cli.rs")];
    rust_files(&root.join("src/commands"), &mut files);
    rust_files(&root.join("src/cli"), &mut files);
    assert!(files.len() > 1, "src/commands/ holds the verbs' files");
    let long = too_long(&files, 600, 60);
    assert!(long.is_empty(), "the command layer (at most 600 lines a file, 60 a function):\n{}", long.join("\n"));
}

/// The study pipeline (spec, runner, collect, claims, report tables) reads as small steps: no
/// function in src/study/ over 80 lines and no file over 600 (issue 70: claims.rs had grown to
/// 1,534 lines, `runner::run` to 169 and `collect::read_run` to 124).
#[test]
fn the_study_pipeline_stays_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/study"), &mut files);
    assert!(files.len() > 5, "src/study/ holds the pipeline's files");
    let long = too_long(&files, 600, 80);
    assert!(long.is_empty(), "the study pipeline (at most 600 lines a file, 80 a function):\n{}", long.join("\n"));
}

/// The figures (issue 69: plot/mod.rs had grown to 1,415 lines, `draw_xy` to 156 and
/// `draw_heatmaps` to 155) read as small steps: no function in src/plot/ over 80 lines and no
/// file over 600.
#[test]
fn the_figures_stay_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/plot"), &mut files);
    assert!(files.len() > 5, "src/plot/ holds the figures' files");
    let long = too_long(&files, 600, 80);
    assert!(long.is_empty(), "the figures (at most 600 lines a file, 80 a function):\n{}", long.join("\n"));
}
