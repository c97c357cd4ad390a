//! The documentation holds together: every relative link in README.md and docs/*.md points to a
//! file of the repository, and every `#anchor` to a heading of its target (GitHub's slugs). The
//! README stays a front page (what plexus is, the two commands, a first run, the tables, links).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (but `-` and `_`), spaces → `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fence = !fence;
        }
        if !fence && l.starts_with('#') {
            out.push(slug(l.trim_start_matches('#')));
        }
    }
    out
}

/// `(line, target)` of every inline link `[text](target)` outside code blocks.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        if l.starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        let mut rest = l;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.sort();
    files
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved: PathBuf = if path.is_empty() { file.clone() } else { dir.join(path) };
            let at = format!("{}:{line}: ({target})", file.strip_prefix(repo()).unwrap().display());
            if !resolved.exists() {
                broken.push(format!("{at}: no file {}", resolved.display()));
                continue;
            }
            if let Some(a) = anchor {
                let is_md = resolved.extension().is_some_and(|x| x == "md");
                if is_md && !anchors(&std::fs::read_to_string(&resolved).unwrap()).iter().any(|h| h == a) {
                    broken.push(format!("{at}: no heading with the anchor #{a} in {}", resolved.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{} broken link(s):\n{}", broken.len(), broken.join("\n"));
}

/// The README is the front page: the two commands first, then what plexus is, the tables and a
/// link to every page of docs/ (a page no one links to is lost).
#[test]
fn the_readme_opens_with_the_two_commands_and_links_every_docs_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let first_block = readme.split("```").nth(1).unwrap_or_default();
    assert!(first_block.contains("scripts/run.sh") && first_block.contains("scripts/test.sh"), "{first_block}");
    for file in markdown_files().iter().filter(|f| f.parent() == Some(Path::new(&repo().join("docs")))) {
        let name = file.file_name().unwrap().to_string_lossy();
        assert!(readme.contains(&format!("(docs/{name})")), "README.md does not link docs/{name}");
    }
    assert!(readme.lines().count() < 250, "README.md has {} lines: move manual pages to docs/", readme.lines().count());
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug(" Diffusion transformers (`model.kind: dit`)"), "diffusion-transformers-modelkind-dit");
    assert_eq!(slug(" The ANCRe case study (§3, Fig. 2)"), "the-ancre-case-study-3-fig-2");
    assert_eq!(
        links("see [a](docs/x.md#y) and [b](#z)\n```\n[c](nope)\n```\n"),
        [(1, "docs/x.md#y".into()), (1, "#z".into())]
    );
}

/// The config schema table of docs/configs-and-runs.md names every key a config has (top level,
/// `train.*`, `log.*`, `diffusion.*`), and the run files' columns it gives are the ones plexus
/// writes: the page cannot drift from the code unnoticed.
#[test]
fn the_schema_table_and_run_file_columns_match_the_code() {
    let page = std::fs::read_to_string(repo().join("docs/configs-and-runs.md")).unwrap();
    let table: String = page.lines().filter(|l| l.starts_with("| `")).collect::<Vec<_>>().join("\n");
    let loaded = plexus::config::load_file(&repo().join("configs/showcase/res.yaml"), &[]).unwrap();
    let mut doc = serde_yaml::to_value(&loaded.config).unwrap();
    doc["diffusion"] = serde_yaml::to_value(plexus::config::DiffusionConfig::default()).unwrap();
    let mut missing = Vec::new();
    for (key, value) in doc.as_mapping().unwrap() {
        let key = key.as_str().unwrap();
        if !table.contains(&format!("| `{key}` |")) {
            missing.push(key.to_string());
        }
        if let (serde_yaml::Value::Mapping(m), "train" | "log" | "diffusion") = (value, key) {
            let row = table.lines().find(|l| l.starts_with(&format!("| `{key}` |"))).unwrap_or("");
            missing.extend(
                m.keys()
                    .filter_map(|k| k.as_str())
                    .filter(|k| !row.contains(&format!("`{k}`")))
                    .map(|k| format!("{key}.{k}")),
            );
        }
    }
    assert!(missing.is_empty(), "docs/configs-and-runs.md's schema table lacks {missing:?}");

    let header = |row: &dyn Fn(&mut csv::Writer<Vec<u8>>)| {
        let mut w = csv::Writer::from_writer(Vec::new());
        row(&mut w);
        String::from_utf8(w.into_inner().unwrap()).unwrap().lines().next().unwrap().to_string()
    };
    let metrics = header(&|w| {
        w.serialize(plexus::run_dir::MetricsRow {
            step: 0,
            epoch: 0.0,
            loss: 0.0,
            lr: 0.0,
            grad_norm: 0.0,
            gamma: None,
        })
        .unwrap()
    });
    let eval = header(&|w| {
        w.serialize(plexus::run_dir::EvalResult { step: 0, loss: 0.0, accuracy: None, perplexity: None }).unwrap()
    });
    for (file, columns) in [("metrics.csv", metrics), ("eval.csv", eval)] {
        assert!(
            page.contains(&format!("`{file}` (`{columns}`)")),
            "docs/configs-and-runs.md: {file} has columns {columns}"
        );
    }
}

/// docs/configs-and-runs.md's backbone table names every option of every backbone with its default
/// (as `plexus list` prints them from the code), and no option a backbone does not have.
#[test]
fn the_backbone_table_matches_the_options_in_the_code() {
    let page = std::fs::read_to_string(repo().join("docs/configs-and-runs.md")).unwrap();
    for e in plexus::model::REGISTRY {
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", e.name)))
            .unwrap_or_else(|| panic!("docs/configs-and-runs.md: no row for backbone `{}`", e.name));
        let cells: Vec<&str> = row.split(" | ").collect();
        let documented: Vec<&str> = cells[1].split(", ").map(|o| o.trim_matches('`')).collect();
        let options = (e.options)();
        let mut expected = Vec::new();
        for (k, v) in &options {
            let k = k.as_str().unwrap();
            expected.push(match v {
                serde_yaml::Value::Null => k.to_string(),
                serde_yaml::Value::String(s) if s == "required" => k.to_string(),
                v => format!("{k}: {}", serde_yaml::to_string(v).unwrap().trim()),
            });
        }
        let mut sorted_doc: Vec<String> = documented.iter().map(|s| s.to_string()).collect();
        sorted_doc.sort();
        expected.sort();
        assert_eq!(sorted_doc, expected, "docs/configs-and-runs.md: the options of backbone `{}`", e.name);
    }
}

/// docs/claims.md's study blocks (and the README's) are what `plexus report --format summary` prints from the committed
/// per-run values (the overview at the top of claims.md: `--format verdicts` over every study):
/// each block opens with `<!-- plexus report ARGS -->` and ends with
/// `<!-- end -->`, and the text between is the command's output, byte for byte. With
/// `PLEXUS_REGENERATE_DOCS=1` the test writes the outputs into the page instead (after a re-run).
#[test]
fn the_claims_page_is_generated_from_the_committed_runs() {
    for (page, least) in [("docs/claims.md", 3), ("README.md", 1)] {
        check_generated_blocks(page, least);
    }
}

/// The `<!-- plexus report … -->` blocks of `page` (at least `least`), checked or rewritten.
fn check_generated_blocks(page: &str, least: usize) {
    let path = repo().join(page);
    let page_name = page;
    let page = std::fs::read_to_string(&path).unwrap();
    let (mut out, mut rest, mut blocks, mut stale) = (String::new(), page.as_str(), 0, Vec::new());
    while let Some(start) = rest.find("<!-- plexus report ") {
        let head_end = start + rest[start..].find("-->\n").expect("an unclosed <!-- plexus report") + 4;
        let args: Vec<String> =
            rest[start + "<!-- plexus ".len()..head_end - 4].split_whitespace().map(String::from).collect();
        let end = head_end + rest[head_end..].find("<!-- end -->").expect("a block without <!-- end -->");
        // A block's format is `summary` unless its command names one (the overview: `verdicts`).
        let format: &[&str] = if args.iter().any(|a| a == "--format") { &[] } else { &["--format", "summary"] };
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(&args)
            .args(format)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(o.status.success(), "plexus {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
        let text = format!("\n{}", String::from_utf8(o.stdout).unwrap());
        if rest[head_end..end] != text {
            stale.push(args.join(" "));
        }
        out.push_str(&rest[..head_end]);
        out.push_str(&text);
        rest = &rest[end..];
        blocks += 1;
    }
    out.push_str(rest);
    assert!(blocks >= least, "only {blocks} generated blocks in {page_name}");
    if std::env::var_os("PLEXUS_REGENERATE_DOCS").is_some() {
        std::fs::write(&path, out).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "{page_name} differs from what these commands print (PLEXUS_REGENERATE_DOCS=1 cargo test --release --test docs rewrites it):\n{}",
        stale.join("\n")
    );
    // No verdict outside a generated block.
    let mut outside = page.clone();
    while let (Some(a), Some(b)) = (outside.find("<!-- plexus report "), outside.find("<!-- end -->")) {
        outside.replace_range(a..b + "<!-- end -->".len(), "");
    }
    for v in ["**holds**", "**does not hold**", "**inconclusive**", "**underpowered"] {
        assert!(!outside.contains(v), "{page_name} writes a verdict ({v}) outside a generated block");
    }
}

/// The words of a shell command line: split on blanks, with '…' and "…" quoting (enough for the
/// pages' commands: no escapes, no expansions).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None::<char>, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// The pages whose shell blocks are read for `plexus …` commands, in the order a reader meets them
/// (README.md first: docs/analysis.md goes on from its runs).
fn command_pages() -> Vec<PathBuf> {
    let mut files = markdown_files();
    files.push(repo().join("bench/README.md"));
    files.push(repo().join("bench/gpu/README.md"));
    files
}

/// A part of a command line (between `&&`) that is a synopsis, not a command: `[…]`, `…`, `|`, or a
/// placeholder in capitals (`CONFIG`, `RUN_DIR`).
fn is_synopsis(part: &str) -> bool {
    // `SPEC.yaml` is a placeholder too: the name before its extension is in capitals.
    let placeholder = part.split_whitespace().any(|w| {
        let stem = w.split('.').next().unwrap_or(w);
        stem.len() > 2 && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c == '/')
    });
    part.contains('[') || part.contains('…') || part.contains("...") || part.contains(" | ") || placeholder
}

/// `(page, line number, command line)` of every line in the pages' shell blocks that starts with
/// `plexus ` (or `target/release/plexus `), without its trailing comment.
fn page_commands() -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for f in command_pages() {
        let page = f.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let mut in_block = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            let cmd = line.trim().trim_start_matches("$ ");
            let cmd = cmd.strip_prefix("target/release/").unwrap_or(cmd);
            if in_block && cmd.starts_with("plexus ") {
                out.push((page.clone(), n + 1, cmd.split("  #").next().unwrap().trim().to_string()));
            }
        }
    }
    out
}

/// Every complete `plexus …` command in the pages' shell blocks parses with today's command line:
/// its verb and flags exist and take the values shown. Synopsis lines (with `[…]`, `…`, `|` or
/// placeholders in capitals) are not commands and are skipped.
#[test]
fn every_plexus_command_on_the_pages_parses() {
    use clap::Parser;
    let (mut checked, mut bad) = (0, Vec::new());
    for (page, n, cmd) in page_commands() {
        for part in cmd.split("&&").map(str::trim).filter(|p| !is_synopsis(p)) {
            checked += 1;
            if let Err(e) = plexus::cli::Cli::try_parse_from(shell_words(part)) {
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                bad.push(format!("{page}:{n}: `{part}`: {first}"));
            }
        }
    }
    assert!(checked >= 10, "only {checked} commands found: is the page scan broken?");
    assert!(bad.is_empty(), "{} of {checked} commands on the pages do not parse:\n{}", bad.len(), bad.join("\n"));
}

/// The pages' commands that `the_pages_commands_run_at_tiny_size` does not run, and why. Each must
/// still be on a page (checked), so the list cannot outlive what it excuses.
const NOT_RUN: &[(&str, &str)] = &[
    ("plexus report runs/studies/hacn-mu", "reads a finished study (hours); tests/it/study.rs reports on a tiny sweep"),
    ("plexus report runs/a runs/b runs/c --by topology.kind", "an example over any three runs the reader has"),
    (
        "plexus report runs/studies/llama-char --metric eval.perplexity --baseline topology.kind=residual",
        "reads a finished study (hours); tests/it/study.rs checks --metric and --baseline",
    ),
    (
        "plexus bench configs/depth-mixing/cpu/denseformer.yaml --set model.depth=12 --compare \
         denseformer,graph+granularity=block --steps 30 --warmup 3 --csv bench/graph-vs-denseformer.csv --case gpt-char-d12",
        "a benchmark of 30 paired rounds that appends to the repository's bench/ (minutes); tests/it/bench.rs checks --compare",
    ),
];

/// The overrides that make a page's command tiny, appended to each `plexus` call of the line (a
/// later `--set` wins): a few steps on a few hundred samples on the CPU for `train` and `sweep`, a
/// few thousand environment steps for `rl`; `sample` and `fd` get fewer steps and samples in place
/// of the page's values. What is left is the command as written: its configs, folders and globs.
fn tiny(part: &str) -> String {
    const TRAIN: &[&str] = &[
        "device=cpu",
        "train.steps=4",
        "train.warmup_steps=1",
        "data.train_samples=256",
        "data.eval_samples=128",
        "log.every=2",
        "log.eval_every=4",
        "log.checkpoint_every=4",
        "log.connectivity_every=2",
    ];
    const RL: &[&str] =
        &["device=cpu", "train.env_steps=1600", "train.prefill_env_steps=800", "env.num_envs=16", "network.width=16"];
    let sets = |keys: &[&str]| keys.iter().map(|k| format!(" --set {k}")).collect::<String>();
    let words: Vec<&str> = part.split_whitespace().collect();
    match words.get(1).copied() {
        Some("train" | "sweep") => format!("{part}{}", sets(TRAIN)),
        Some("rl") if words.contains(&"--eval") => with_value(part, "--episodes", "32"),
        Some("rl") if !words.contains(&"--plot") => format!("{part}{} --quiet", sets(RL)),
        Some("sample") => with_value(&with_value(part, "--steps", "4"), "--per-class", "2"),
        Some("fd") => with_value(part, "--samples", "64"),
        _ => part.to_string(),
    }
}

/// `line` with the value after `flag` (where it is given) replaced by `value`.
fn with_value(line: &str, flag: &str, value: &str) -> String {
    let mut w: Vec<&str> = line.split_whitespace().collect();
    if let Some(i) = w.iter().position(|x| *x == flag) {
        w[i + 1] = value;
    }
    w.join(" ")
}

/// Every complete command on the pages runs, at tiny size (see [`tiny`]), in the order of the pages,
/// in one scratch folder where `configs/` is the repository's: trainings, then the analyses,
/// figures, samples and reports that read them, through a shell as a reader types them (globs,
/// `&&`). The commands that only read runs (`analyze`, `plot`, `rl --plot`, `rl --eval`, `report`,
/// `connectivity`) run a second time, as a reader runs them again after more runs.
#[test]
#[ignore = "needs real data: cifar10"]
fn the_pages_commands_run_at_tiny_size() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_plexus"), bin.join("plexus")).unwrap();
    std::os::unix::fs::symlink(repo().join("configs"), tmp.path().join("configs")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let commands = page_commands();
    for (excused, why) in NOT_RUN {
        assert!(commands.iter().any(|(_, _, c)| c == excused), "NOT_RUN lists `{excused}` ({why}), on no page");
    }
    let mut ran = 0;
    for (page, n, cmd) in &commands {
        if cmd.split("&&").any(|p| is_synopsis(p.trim())) || NOT_RUN.iter().any(|(c, _)| c == cmd) {
            continue;
        }
        let line = cmd.split("&&").map(|p| tiny(p.trim())).collect::<Vec<_>>().join(" && ");
        let reads_only = cmd.split("&&").all(|p| {
            let w: Vec<&str> = p.split_whitespace().collect();
            matches!(w.get(1).copied(), Some("analyze" | "plot" | "report" | "connectivity"))
                || (w.get(1) == Some(&"rl") && (w.contains(&"--plot") || w.contains(&"--eval")))
        });
        for round in 0..if reads_only { 2 } else { 1 } {
            let t = std::time::Instant::now();
            let o = std::process::Command::new("bash")
                .args(["-c", &line])
                .current_dir(tmp.path())
                .env("PATH", &path)
                .output()
                .unwrap();
            eprintln!("{page}:{n} (round {}): {:.1} s: {line}", round + 1, t.elapsed().as_secs_f64());
            assert!(
                o.status.success(),
                "{page}:{n}: `{line}` failed (round {}):\n{}{}",
                round + 1,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        ran += 1;
    }
    assert!(ran >= 10, "only {ran} commands ran: is the page scan broken?");
}

/// Every file below `dir`, recursively, appended to `out`.
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The source roots whose every file docs/architecture.md's tree names, and whose every path it
/// names must exist.
const TREE_ROOTS: [&str; 2] = ["src/", "native/src/"];

/// The repository-relative paths under [`TREE_ROOTS`] that the tree of an architecture page names
/// (its code block that starts with `src/`). The tree is a list of entries: a name (`src/`, then
/// indented `train/`, `cli.rs`, `lib.rs, main.rs`) and a description that may run on over lines
/// indented further. A top-level entry ending in `/` opens a directory; an indented name is a
/// path in it. In a description, a bare file name (`optim.rs`) is a file of the entry's own
/// directory, a path with a folder (`gloo_decl/`, `train/optim.rs`) is relative to the top-level
/// directory (or to the repository when it starts with `src/` or `native/`), and a folder names
/// every file below it. So `optim.rs` in the `train/` entry is `src/train/optim.rs` and nothing
/// else: a file is named by its relative path, never by a basename that another file shares.
fn tree_paths(doc: &str) -> BTreeSet<String> {
    let block: Vec<&str> = doc
        .split("```")
        .find(|b| b.trim_start_matches(|c: char| c != '\n').trim_start().starts_with("src/"))
        .expect("docs/architecture.md has a tree starting with src/")
        .lines()
        .collect();
    // Each entry: (its directory, the names in its name column, its text).
    let mut entries: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut top = String::new();
    for line in block {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if body.is_empty() {
            continue;
        }
        if indent >= 8 {
            if let Some(e) = entries.last_mut() {
                e.2.push(' ');
                e.2.push_str(body);
            }
            continue;
        }
        let (name, text) = body.split_once("  ").unwrap_or((body, ""));
        let names: Vec<String> = name.split(", ").map(|n| n.trim().to_string()).collect();
        if indent == 0 {
            top = names[0].clone();
            entries.push((top.clone(), Vec::new(), text.to_string()));
            continue;
        }
        let dir = match names.as_slice() {
            [one] if one.ends_with('/') => format!("{top}{one}"),
            _ => top.clone(),
        };
        let named = names.iter().filter(|n| !n.ends_with('/')).map(|n| format!("{top}{n}")).collect();
        entries.push((dir, named, text.to_string()));
    }
    let is_path_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut out = BTreeSet::new();
    for (dir, names, text) in entries {
        let top = TREE_ROOTS.iter().find(|r| dir.starts_with(**r)).map_or(dir.clone(), |r| r.to_string());
        out.extend(names);
        for token in text.split(|c: char| !is_path_char(c)) {
            let token = token.trim_end_matches('.');
            let is_file = [".rs", ".cpp", ".cu", ".cuh", ".h", ".inc"].iter().any(|e| token.ends_with(e));
            let is_folder = token.ends_with('/') && token.len() > 1;
            if !(is_file || is_folder) || token.starts_with('/') {
                continue;
            }
            let path = if token.starts_with("src/") || token.starts_with("native/") {
                token.to_string()
            } else if token.contains('/') {
                format!("{top}{token}")
            } else {
                format!("{dir}{token}")
            };
            out.insert(path);
        }
    }
    out.retain(|p| TREE_ROOTS.iter().any(|r| p.starts_with(r) && p.len() > r.len()));
    out
}

/// Against the files under [`TREE_ROOTS`] in `repo`: the files the tree's paths leave out, and the
/// paths it names that do not exist.
fn tree_mismatches(repo: &Path, named: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let mut files = Vec::new();
    for root in TREE_ROOTS {
        if repo.join(root).is_dir() {
            source_files(&repo.join(root), &mut files);
        }
    }
    let rel: BTreeSet<String> =
        files.iter().map(|f| f.strip_prefix(repo).unwrap().to_string_lossy().into_owned()).collect();
    let unnamed = rel
        .iter()
        .filter(|f| !named.iter().any(|n| *f == n || (n.ends_with('/') && f.starts_with(n.as_str()))))
        .cloned()
        .collect();
    let stale = named.iter().filter(|n| !repo.join(n).exists()).cloned().collect();
    (unnamed, stale)
}

/// docs/architecture.md's tree names every file under src/ and native/src/ by its relative path
/// (a new file must be placed in the architecture, in words), and every path it names exists (a
/// moved or deleted file must leave it).
#[test]
fn the_architecture_tree_names_every_source_file_by_its_path() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let named = tree_paths(&doc);
    assert!(named.len() > 100, "only {} paths read from the tree: is the parser broken?", named.len());
    let (unnamed, stale) = tree_mismatches(&repo(), &named);
    assert!(unnamed.is_empty(), "files not in docs/architecture.md's tree by their path: {unnamed:?}");
    assert!(stale.is_empty(), "docs/architecture.md's tree names paths that do not exist: {stale:?}");
}

/// The tree check on a planted tree: a file whose basename another folder's entry names is still
/// unnamed, a stale entry is caught, a folder names the files below it, and an indented name, a
/// bare name in a description and a path from the top directory each resolve where they should.
#[test]
fn the_tree_check_reads_relative_paths_not_basenames() {
    let doc = "```\nsrc/\n  lib.rs, main.rs   the crate\n  train/            the loop (mod.rs), optim.rs;\n\
               \x20                   gone.rs, and model/gpt.rs\n  model/            backbones\n\
               native/src/         lib.rs: FFI; gloo_decl/: headers\n```\n";
    let named = tree_paths(doc);
    let want = [
        "native/src/gloo_decl/",
        "native/src/lib.rs",
        "src/lib.rs",
        "src/main.rs",
        "src/model/gpt.rs",
        "src/train/gone.rs",
        "src/train/mod.rs",
        "src/train/optim.rs",
    ];
    assert_eq!(named.iter().map(String::as_str).collect::<Vec<_>>(), want);
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "src/lib.rs",
        "src/main.rs",
        "src/train/mod.rs",
        "src/train/optim.rs",
        "src/model/gpt.rs",
        "src/model/optim.rs",
        "src/model/mod.rs",
        "native/src/lib.rs",
        "native/src/gloo_decl/a.h",
    ] {
        let path = tmp.path().join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }
    let (unnamed, stale) = tree_mismatches(tmp.path(), &named);
    assert_eq!(unnamed, ["src/model/mod.rs", "src/model/optim.rs"]);
    assert_eq!(stale, ["src/train/gone.rs"]);
}

/// The linear-network verdicts and figures come from the same committed files: every run's
/// `steps_to_1e3`, `steps_to_1e6`, `steps_to_1e9`, the rate (`loss_rate`, `decades_per_1k`), the
/// mean log-loss and `final_loss` in
/// docs/claims/ancre-fig2*.csv are what its per-step loss in the companion `.curves.csv` gives
/// (the definitions of `summary.json`, recomputed here), and the report drawn from the tables
/// has the curves to draw.
#[test]
fn the_committed_loss_curves_give_the_committed_rate_metrics() {
    let mut checked = 0;
    for study in ["ancre-fig2a", "ancre-fig2b", "ancre-fig2c"] {
        let table = repo().join(format!("docs/claims/{study}.csv"));
        let runs = plexus::study::collect::read_runs_csv(&table).unwrap();
        assert!(runs.len() >= 30, "{study}: {} runs", runs.len());
        for run in &runs {
            let name = run.dir.display().to_string();
            let loss = run.curve("loss").unwrap();
            assert!(loss.len() > 100 && loss[0].0 == 0.0, "{study} {name}: {} points of loss", loss.len());
            let first = loss[0].1;
            let steps_to = |f: f64| loss.iter().find(|p| p.1 <= f * first).map(|p| p.0);
            for (metric, value) in [
                ("steps_to_1e3", steps_to(1e-3)),
                ("steps_to_1e6", steps_to(1e-6)),
                ("steps_to_1e9", steps_to(1e-9)),
                ("loss_rate", plexus::train::loss_rate(&loss)),
                ("decades_per_1k", plexus::train::loss_rate(&loss).map(|r| -r)),
                ("mean_log_loss", plexus::study::sensitivity::from_loss_curve("mean_log_loss", &loss)),
                ("final_loss", loss.last().map(|p| p.1)),
            ] {
                // A column the table has (the report shows a metric every run has, plus the
                // claims'); an empty cell: the run never reached the level, nor do its curves.
                if runs.iter().any(|r| r.metrics.contains_key(metric)) {
                    // Equal but for the last bit or two: these tables were made from summary.json
                    // read by serde_json's default parser, which may round a float an ulp off
                    // (plexus now reads them with `float_roundtrip`).
                    let (recorded, recomputed) = (run.metrics.get(metric).copied(), value);
                    assert_eq!(recorded.is_some(), recomputed.is_some(), "{study} {name}: {metric}");
                    if let (Some(a), Some(b)) = (recorded, recomputed) {
                        assert!((a - b).abs() <= 4.0 * f64::EPSILON * b.abs(), "{study} {name}: {metric} {a} vs {b}");
                    }
                    checked += 1;
                }
            }
        }
    }
    // 150 runs, each with steps_to_1e3, the rate (decades_per_1k), the mean log-loss and final_loss.
    assert!(checked >= 450, "only {checked} values checked");
}

/// The count the architecture page states in prose is the code's: "All N cases" of its parity
/// section is the number of cases under parity/cases (the page said 71 while there were 83).
#[test]
fn the_parity_count_in_prose_is_the_codes() {
    let cases = plexus::parity::cases(&repo().join("parity/cases"), None).unwrap().len();
    let arch = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let stated: Vec<usize> = arch
        .split("All ")
        .skip(1)
        .filter_map(|rest| rest.split_once(" cases").and_then(|(n, _)| n.trim().parse().ok()))
        .collect();
    assert!(!stated.is_empty(), "docs/architecture.md states how many parity cases pass (\"All N cases\")");
    assert!(
        stated.iter().all(|&n| n == cases),
        "docs/architecture.md says All {stated:?} cases; parity/cases holds {cases}"
    );
}

/// The figure lines of scripts/docs-figures.sh: (docs/figures name, table under docs/claims/,
/// spec under configs/studies/ or `-`, the report's figure, the flags that stand for a spec).
fn docs_figure_lines() -> Vec<(String, String, String, String, Vec<String>)> {
    let script = std::fs::read_to_string(repo().join("scripts/docs-figures.sh")).unwrap();
    let body = script.split("<<'TABLE'\n").nth(1).expect("docs-figures.sh's TABLE block");
    let body = &body[..body.find("\nTABLE").expect("the TABLE block's end")];
    body.lines()
        .map(|line| {
            let w: Vec<String> = line.split_whitespace().map(String::from).collect();
            assert!(w.len() >= 4, "docs-figures.sh: a figure line needs 4 words: {line}");
            (w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone(), w[4..].to_vec())
        })
        .collect()
}

/// Figures as data: every figure docs/figures holds from a committed table is what
/// scripts/docs-figures.sh draws from it with this checkout's binary, byte for byte (the renderer
/// embeds its fonts, so a PNG does not depend on the machine), and every other figure there is one
/// that the script's header names as drawn from a run. A figure committed before a renderer change
/// and never redrawn fails here (hacn-paper-training's Γ curves did: drawn before arms got colours).
#[test]
#[ignore = "slow tier: redraws every report figure of docs/figures"]
fn the_committed_report_figures_are_what_the_script_draws() {
    let script = std::fs::read_to_string(repo().join("scripts/docs-figures.sh")).unwrap();
    let header: String = script.lines().take_while(|l| l.starts_with('#')).collect();
    let lines = docs_figure_lines();
    let tmp = tempfile::tempdir().unwrap();
    let mut stale = Vec::new();
    for (name, table, spec, figure, flags) in &lines {
        let out = tmp.path().join(name);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"));
        cmd.current_dir(repo()).arg("report").arg(format!("docs/claims/{table}"));
        if spec == "-" {
            cmd.args(flags);
        } else {
            cmd.arg("--spec").arg(format!("configs/studies/{spec}"));
        }
        let o = cmd.arg("--out").arg(&out).args(["--formats", "png"]).output().unwrap();
        assert!(o.status.success(), "report {table}: {}", String::from_utf8_lossy(&o.stderr));
        let drawn = std::fs::read(out.join(figure)).unwrap_or_else(|e| panic!("{table} drew no {figure}: {e}"));
        if drawn != std::fs::read(repo().join("docs/figures").join(name)).unwrap() {
            stale.push(name.clone());
        }
    }
    assert!(
        stale.is_empty(),
        "docs/figures differs from what scripts/docs-figures.sh draws (run it, and open each): {stale:?}"
    );
    let mut unlisted = Vec::new();
    for e in std::fs::read_dir(repo().join("docs/figures")).unwrap() {
        let path = e.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_file() && !lines.iter().any(|l| l.0 == file) && !header.contains(&file) {
            unlisted.push(file);
        }
    }
    assert!(unlisted.is_empty(), "docs/figures holds figures docs-figures.sh neither draws nor names: {unlisted:?}");
}
