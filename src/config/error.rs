//! Configuration errors that say where and what: the file, the key path, the bad value, what is
//! allowed, and the line when we can find it.

use std::fmt;
use std::path::{Path, PathBuf};

/// One bad value in a config. `Display` gives the one-line message users see.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The YAML file (or `<embedded:NAME>` / `<--set>` for values that did not come from a file).
    pub file: PathBuf,
    /// Dotted key path from the root, e.g. `topology.edges[1]`; empty for the document itself.
    pub key: String,
    /// The offending value as written, or `None` when the problem is a missing key or bad syntax.
    pub value: Option<String>,
    /// What is allowed instead.
    pub allowed: String,
    /// 1-based line in `file`, when known.
    pub line: Option<usize>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The file names the `--set` an error came from, whose value may be a pasted blob too.
        write!(f, "invalid config {}", elide(&self.file.display().to_string()))?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        if !self.key.is_empty() {
            write!(f, ": key `{}`", self.key)?;
        }
        if let Some(v) = &self.value {
            write!(f, " has value `{}`", elide(v))?;
        }
        write!(f, ": {}", elide(&self.allowed))
    }
}

/// `text` with every word (a run without blanks) longer than 100 characters shortened to its first
/// 30, an ellipsis and its length: a 300-digit number or a pasted blob is named, not echoed (a
/// SHA-256, 64 hex digits, or a path of ordinary length is shown whole).
pub(crate) fn elide(text: &str) -> String {
    const LONG: usize = 100;
    if !text.split_whitespace().any(|w| w.chars().count() > LONG) {
        return text.to_string();
    }
    let mut out = String::with_capacity(LONG * 4);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let n = word.chars().count();
        if n > LONG {
            out.extend(word.chars().take(30));
            out.push_str(&format!("… ({n} characters)"));
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for ch in text.chars() {
        if ch.is_whitespace() {
            flush(&mut word, &mut out);
            out.push(ch);
        } else {
            word.push(ch);
        }
    }
    flush(&mut word, &mut out);
    out
}

impl std::error::Error for ConfigError {}

/// A number as an error shows it: plainly where it is short (`0.25`, `1000`), in scientific
/// notation where its plain form would run to dozens of digits (`1e39`, `1e-300`).
pub fn show_number(x: f64) -> String {
    let plain = x.to_string();
    match plain.len() > 16 && x.is_finite() {
        true => format!("{x:e}"),
        false => plain,
    }
}

/// A problem found below some key, before we know the file: topology/model/data option parsers
/// return these and the config loader adds the file, the prefix and the line.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionError {
    pub key: String,
    pub value: Option<String>,
    pub allowed: String,
}

impl OptionError {
    /// An error at `key` (a dotted path within the section) whose `value` is not what is `allowed`
    /// (said in words).
    pub fn new(key: impl Into<String>, value: impl fmt::Display, allowed: impl Into<String>) -> Self {
        Self { key: key.into(), value: Some(value.to_string()), allowed: allowed.into() }
    }

    /// Wraps a serde error from deserialising a sub-mapping, keeping its path.
    pub fn from_serde(err: serde_path_to_error::Error<serde_yaml::Error>) -> Self {
        let path = err.path().to_string();
        let key = if path == "." { String::new() } else { path };
        Self { key, value: None, allowed: clean_serde_message(&err.inner().to_string()) }
    }

    /// Attaches the file, prefixes the key with `prefix` (e.g. `topology`) and finds the line.
    pub fn in_file(self, file: &Path, source: Option<&str>, prefix: &str) -> ConfigError {
        let key = join_key(prefix, &self.key);
        let line = source.and_then(|s| locate_key(s, &key));
        ConfigError { file: file.to_path_buf(), key, value: self.value, allowed: self.allowed, line }
    }
}

fn join_key(prefix: &str, key: &str) -> String {
    match (prefix.is_empty(), key.is_empty()) {
        (true, _) => key.to_string(),
        (_, true) => prefix.to_string(),
        _ if key.starts_with('[') => format!("{prefix}{key}"),
        _ => format!("{prefix}.{key}"),
    }
}

/// The key path of a serde error; for "unknown field `x`" the path stops at the parent, so the
/// field is appended to point at the offending line.
pub(crate) fn serde_key(path: &str, msg: &str) -> String {
    let path = if path == "." { "" } else { path };
    match msg.strip_prefix("unknown field `").and_then(|r| r.split_once('`')) {
        Some((field, _)) if !path.ends_with(field) => join_key(path, field),
        _ => path.to_string(),
    }
}

/// serde_yaml appends " at line L column C" to messages; we report the line separately. A number
/// where an integer type is expected is said as the range that type allows (serde says
/// "invalid type: floating point `1e20`, expected u64").
pub(crate) fn clean_serde_message(msg: &str) -> String {
    let msg = match msg.find(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    };
    let ranges = [
        ("u64", "an integer from 0 to 18446744073709551615"),
        ("usize", "an integer from 0 to 18446744073709551615"),
        ("u32", "an integer from 0 to 4294967295"),
        ("i64", "an integer from -9223372036854775808 to 9223372036854775807"),
    ];
    // YAML reads a number past f64's range (`1e400`) as a string.
    if let Some(rest) = msg.strip_prefix("invalid type: string \"") {
        let text = rest.split('"').next().unwrap_or_default();
        if msg.ends_with("expected f64") && text.parse::<f64>().is_ok_and(f64::is_infinite) {
            return format!("a finite number (`{text}` is past the range of a 64-bit float, ±1.8e308)");
        }
    }
    if msg.starts_with("invalid type: floating point `") {
        if let Some((_, range)) = ranges.iter().find(|(t, _)| msg.ends_with(&format!("expected {t}"))) {
            return range.to_string();
        }
    }
    msg.to_string()
}

/// Finds the 1-based line of a dotted key path (`a.b[2].c`) by following indentation in block
/// style and brackets in flow style (`model: {kind: mlp, depth: 3}`, lists `[a, b]`). Good
/// enough for the configs we write and for error messages; returns `None` when unsure rather
/// than guessing.
pub fn locate_key(source: &str, key: &str) -> Option<usize> {
    let mut parts: Vec<(String, Option<usize>)> = Vec::new();
    for seg in key.split('.') {
        if seg.is_empty() {
            continue;
        }
        let (name, idx) = match seg.find('[') {
            Some(i) => (seg[..i].to_string(), seg[i + 1..seg.len() - 1].parse::<usize>().ok()),
            None => (seg.to_string(), None),
        };
        parts.push((name, idx));
    }
    let lines: Vec<&str> = source.lines().collect();
    let (mut lo, mut hi, mut min_indent) = (0usize, lines.len(), 0usize);
    let mut found = None;
    if source.trim_start().starts_with('{') {
        let start = source.len() - source.trim_start().len();
        return flow_locate(source, start, &parts).map(|pos| line_of(source, pos));
    }
    for (j, (name, idx)) in parts.iter().cloned().enumerate() {
        // `key: {…}` or `key: […]`: the rest of the path is inside a flow collection.
        if let Some(line) = found.filter(|_| j > 0).map(|l: usize| l - 1) {
            let text = lines[line];
            let (prev, _) = &parts[j - 1];
            if let Some(colon) = text.find(&format!("{prev}:")).map(|c| c + prev.len() + 1) {
                if text[colon..].trim_start().starts_with(['{', '[']) {
                    let start = line_start(source, line) + colon;
                    let start = start + (source[start..].len() - source[start..].trim_start().len());
                    return flow_locate(source, start, &parts[j..]).map(|pos| line_of(source, pos));
                }
            }
        }
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().take(hi).skip(lo) {
            let indent = line.len() - line.trim_start().len();
            let t = line.trim_start();
            if indent < min_indent || t.starts_with('#') {
                continue;
            }
            if t.starts_with(&format!("{name}:")) {
                hit = Some((i, indent));
                break;
            }
        }
        let (i, indent) = hit?;
        if let Some(k) = idx {
            // An inline list on the key's line: `key: [a, b]`.
            let text = lines[i].trim_start();
            let after = text[name.len() + 1..].trim_start();
            if after.starts_with('[') {
                let start = line_start(source, i) + (lines[i].len() - after.len());
                if j + 1 == parts.len() {
                    return flow_index(source, start, k).map(|pos| line_of(source, pos)).or(Some(i + 1));
                }
            }
        }
        found = Some(i + 1);
        // The block of this key ends at the next line with indentation <= its own.
        let end = lines
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, l)| {
                let t = l.trim_start();
                !t.is_empty() && !t.starts_with('#') && l.len() - t.len() <= indent && !t.starts_with("- ")
            })
            .map(|(j, _)| j)
            .unwrap_or(hi);
        lo = i + 1;
        hi = end;
        min_indent = indent + 1;
        if let Some(k) = idx {
            // Inline list `key: [a, b]` stays on the key's line; block lists have one `- ` per item.
            let items: Vec<usize> = (lo..hi).filter(|&j| lines[j].trim_start().starts_with("- ")).collect();
            if let Some(&j) = items.get(k) {
                found = Some(j + 1);
                lo = j;
            }
        }
    }
    found
}

/// Byte offset of the start of line `line` (0-based).
fn line_start(source: &str, line: usize) -> usize {
    source.split_inclusive('\n').take(line).map(str::len).sum()
}

/// 1-based line of byte offset `pos`.
fn line_of(source: &str, pos: usize) -> usize {
    source[..pos.min(source.len())].matches('\n').count() + 1
}

/// The start offsets of the entries of the flow collection opening at `open` (`{` or `[`).
fn flow_entries(source: &str, open: usize) -> Option<Vec<usize>> {
    let bytes = source.as_bytes();
    if !matches!(bytes.get(open), Some(b'{' | b'[')) {
        return None;
    }
    let (mut depth, mut quote, mut entries) = (0usize, None::<u8>, Vec::new());
    let mut expect_entry = true;
    for (i, &c) in bytes.iter().enumerate().skip(open) {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    expect_entry = true;
                    continue;
                }
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(entries);
                }
            }
            b',' if depth == 1 => {
                expect_entry = true;
                continue;
            }
            b'"' | b'\'' => quote = Some(c),
            _ => {}
        }
        if depth == 1 && expect_entry && !c.is_ascii_whitespace() {
            entries.push(i);
            expect_entry = false;
        } else if depth > 1 && expect_entry {
            // An entry that starts with a nested collection.
            entries.push(i);
            expect_entry = false;
        }
    }
    None
}

/// The offset of entry `k` of the flow sequence opening at `open`.
fn flow_index(source: &str, open: usize, k: usize) -> Option<usize> {
    flow_entries(source, open)?.get(k).copied()
}

/// Follows `parts` into the flow collection opening at `open`; the offset of the last key found.
fn flow_locate(source: &str, open: usize, parts: &[(String, Option<usize>)]) -> Option<usize> {
    let mut at = open;
    let mut best = None;
    for (name, idx) in parts {
        let entry = flow_entries(source, at)?.into_iter().find(|&e| {
            let rest = &source[e..];
            rest.strip_prefix(name.as_str())
                .or_else(|| rest.strip_prefix(&format!("\"{name}\"")))
                .is_some_and(|r| r.trim_start().starts_with(':'))
        });
        let Some(entry) = entry else { return best };
        best = Some(entry);
        let colon = entry + source[entry..].find(':')? + 1;
        let value = colon + (source[colon..].len() - source[colon..].trim_start().len());
        at = value;
        if let Some(k) = idx {
            match flow_index(source, value, *k) {
                Some(item) => {
                    best = Some(item);
                    at = item;
                }
                None => return best,
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_keys_in_flow_mappings_and_lists() {
        let src = "name: x\nmodel: {kind: mlp, width: 8,\n  depth: 3}\ntopology: {kind: shortcuts, edges: [\"0:1\", \"0:5\"]}\ntrain:\n  betas: [0.9, 2]\n";
        assert_eq!(locate_key(src, "model.kind"), Some(2));
        assert_eq!(locate_key(src, "model.depth"), Some(3));
        assert_eq!(locate_key(src, "topology.edges[1]"), Some(4));
        assert_eq!(locate_key(src, "train.betas[1]"), Some(6));
        assert_eq!(locate_key("{name: x, model: {kind: lnn}}", "model.kind"), Some(1));
        // A key that is not there is not guessed.
        assert_eq!(locate_key(src, "model.nope"), None);
    }

    #[test]
    fn locates_nested_keys_and_list_items() {
        let src = "name: x\nmodel:\n  kind: lnn\n  depth: 3\ntopology:\n  kind: shortcuts\n  edges:\n    - \"0:1\"\n    - \"0:5\"\n";
        assert_eq!(locate_key(src, "model.depth"), Some(4));
        assert_eq!(locate_key(src, "topology.kind"), Some(6));
        assert_eq!(locate_key(src, "topology.edges[1]"), Some(9));
        assert_eq!(locate_key(src, "train.lr"), None);
    }

    /// A 300-digit value is named by its start and length, not echoed; short words stay.
    #[test]
    fn long_values_are_elided_in_messages() {
        let e = ConfigError {
            file: "c.yaml".into(),
            key: "seed".into(),
            value: Some("9".repeat(300)),
            allowed: format!("invalid value: integer `{}`, expected u64", "9".repeat(300)),
            line: Some(3),
        }
        .to_string();
        assert!(e.len() < 250 && e.contains("… (300 characters)") && e.contains("expected u64"), "{e}");
        assert_eq!(elide("a short message"), "a short message");
    }
}
