//! The crate's modules sit in layers, and a module imports only from its own layer or below, with
//! no cycle among modules, so that the code reads top-down (cli → commands → … → config →
//! foundation). This test reads `src/` and fails on any import (a `crate::` path outside plain comments
//! and test modules) from a lower layer into a higher one, or any cycle, naming the file, the line
//! and the path. Doc comments count (a lower module that names a higher one knows of it); plain
//! `//` comments do not. A new top-level module must be given a layer here. The native crate
//! (`native/src/`, below all of plexus, which Cargo enforces) is held to its own layers the same
//! way, its top-level files' `super::` paths read as the `crate::` paths they are.

use crate::common;
use common::rust_files;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. Within a layer, imports are allowed as long as they form no cycle.
const LAYERS: &[(&str, &[&str])] = &[
    // No domain knowledge: host reads, allocator, libtorch FFI, processes, devices, files.
    (
        "foundation",
        &["host", "input_file", "pins", "malloc", "sets", "tensorboard", "native", "dist", "device", "run_dir"],
    ),
    // Plain data types of the YAML schema.
    ("config", &["config"]),
    // What a model learns from a batch (losses, DDPM noising), and the batch.
    ("task", &["task"]),
    ("data and topologies", &["data", "topology"]),
    ("models", &["model"]),
    ("experiment", &["experiment"]),
    ("trainers", &["train", "rl"]),
    // What kinds of run there are (train, rl) and what each needs above the trainers.
    ("run kinds", &["kinds"]),
    ("uses of trained runs", &["analysis", "diffusion", "fd", "study"]),
    ("outputs", &["bench", "plot", "report", "parity", "doctor"]),
    ("commands", &["commands"]),
    ("command line", &["cli"]),
];

/// The native crate's layers, bottom to top (the FFI declarations and the error convention are its
/// root, lib.rs, below them all).
const NATIVE_LAYERS: &[(&str, &[&str])] = &[
    ("libtorch's errors in words; the fused kernels' settings", &["torch_panic", "setting"]),
    ("bindings by concern", &["cuda", "cuda_graph", "process_group", "profile", "kineto", "optim", "kernels"]),
    ("the composite code the kernels fuse", &["composite"]),
    ("the choice between kernel and composite", &["choice"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn native_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("native/src")
}

/// The top-level module a file under `root` belongs to (`src/data/tokens.rs` → `data`).
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.strip_suffix(".rs").map(str::to_string).unwrap_or(first)
}

/// `(line, module)` of every `crate::module` a file names, outside plain `//` comments and `#[cfg(test)]`
/// modules. `use crate::{a, b::c}` names `a` and `b`.
fn imports(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    // The test module comes last (clippy's items_after_test_module): from `#[cfg(test)]` followed
    // by `mod` to the end of the file.
    let lines: Vec<&str> = text.lines().collect();
    let mut in_tests = false;
    for (n, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") && lines.get(n + 1).is_some_and(|l| l.trim_start().starts_with("mod ")) {
            in_tests = true;
        }
        // Doc comments count: a module that points to a higher one in its docs knows of it too.
        if in_tests || (t.starts_with("//") && !t.starts_with("///") && !t.starts_with("//!")) {
            continue;
        }
        let mut rest: &str = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            // Skip `plexus_crate::` and the like: `crate` must start an identifier.
            let ok = rest[..i].chars().last().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            if ok {
                if let Some(group) = after.strip_prefix('{') {
                    let mut depth = 1;
                    let mut token = String::new();
                    let mut expect_name = true;
                    for c in group.chars() {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            ',' if depth == 1 => expect_name = true,
                            c if depth == 1 && expect_name && (c.is_alphanumeric() || c == '_') => token.push(c),
                            _ if depth == 1 && expect_name && !token.is_empty() => {
                                out.push((n + 1, std::mem::take(&mut token)));
                                expect_name = false;
                            }
                            _ => {}
                        }
                        if depth == 0 {
                            break;
                        }
                    }
                    if !token.is_empty() {
                        out.push((n + 1, token));
                    }
                } else {
                    let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() {
                        out.push((n + 1, name));
                    }
                }
            }
            rest = after;
        }
    }
    out
}

/// `(line, module)` of every reference the crate root `lib.rs` makes to one of its `declared`
/// modules: `crate::m` or `m::` (the root names its children without `crate::`), outside its
/// `mod` lines (which declare them), its `//!` overview (which lists them) and plain comments;
/// item doc comments count, as everywhere.
fn root_references(text: &str, declared: &BTreeSet<String>) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_tests = false;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            in_tests = true;
        }
        let declaration = t.starts_with("mod ") || t.starts_with("pub mod ") || t.starts_with("pub(crate) mod ");
        if in_tests || declaration || t.starts_with("//!") || (t.starts_with("//") && !t.starts_with("///")) {
            continue;
        }
        for m in declared {
            let hit = line.match_indices(&format!("{m}::")).any(|(i, _)| {
                let before = line[..i].chars().last();
                before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) || line[..i].ends_with("crate::")
            });
            if hit {
                out.push((n + 1, m.clone()));
            }
        }
    }
    out
}

#[test]
fn the_crate_roots_refer_to_no_module_of_theirs_but_by_declaring_it() {
    let declared: BTreeSet<String> = ["process_group", "kernels"].iter().map(|s| s.to_string()).collect();
    let planted = "//! see [`process_group::ProcessGroup`]\npub mod process_group;\n\
                   /// One [`kernels::x`] kind.\nstruct A { b: process_group::Backend }\n// kernels::y\n";
    let found = root_references(planted, &declared);
    assert_eq!(found, [(3, "kernels".to_string()), (4, "process_group".to_string())]);
}

#[test]
fn modules_import_only_from_their_layer_or_below_and_form_no_cycle() {
    check_layers(&src(), "src", LAYERS);
}

#[test]
fn the_native_crates_modules_import_only_from_their_layer_or_below_and_form_no_cycle() {
    check_layers(&native_src(), "native/src", NATIVE_LAYERS);
}

/// The layer rule for the crate whose sources are `root` (named `label` in messages).
fn check_layers(root: &Path, label: &str, layers: &[(&str, &[&str])]) {
    let layer_of: BTreeMap<&str, (usize, &str)> =
        layers.iter().enumerate().flat_map(|(i, (name, mods))| mods.iter().map(move |m| (*m, (i, *name)))).collect();
    // Every module of lib.rs has a layer, and every layer entry is a module.
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").map(|m| m.trim_end_matches(';').to_string()))
        .collect();
    for m in &declared {
        assert!(
            layer_of.contains_key(m.as_str()),
            "{label}/lib.rs declares `{m}`, which has no layer in tests/it/layers.rs"
        );
    }
    for m in layer_of.keys() {
        assert!(declared.contains(*m), "tests/it/layers.rs places `{m}`, which {label}/lib.rs does not declare");
    }

    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in &files {
        // The crate's root files, by path (a `lib.rs` or `main.rs` deeper down is a module like any
        // other): the binary's `main.rs` is above every layer; `lib.rs` is below them all.
        if f.parent() == Some(root) && f.file_name().is_some_and(|n| n == "main.rs") {
            continue;
        }
        if f.parent() == Some(root) && f.file_name().is_some_and(|n| n == "lib.rs") {
            let text = std::fs::read_to_string(f).unwrap();
            violations.extend(
                root_references(&text, &declared).into_iter().map(|(line, m)| {
                    format!("{label}/lib.rs:{line}: the crate root (below every layer) refers to `{m}`")
                }),
            );
            continue;
        }
        let me = module_of(root, f);
        let Some(&(mine, my_layer)) = layer_of.get(me.as_str()) else {
            panic!("{}: module `{me}` has no layer in tests/it/layers.rs", f.display());
        };
        let mut text = std::fs::read_to_string(f).unwrap();
        // In a file directly under the crate root, `super::` is `crate::`.
        if f.parent() == Some(root) {
            text = text.replace("super::", "crate::");
        }
        for (line, target) in imports(&text) {
            let Some(&(theirs, their_layer)) = layer_of.get(target.as_str()) else { continue };
            if target == me {
                continue;
            }
            let at = format!("{label}/{}:{line}", f.strip_prefix(root).unwrap().display());
            if theirs > mine {
                violations.push(format!(
                    "{at}: `{me}` ({my_layer}) imports `crate::{target}` ({their_layer}), a layer above it"
                ));
            }
            edges.entry(me.clone()).or_default().entry(target).or_insert(at);
        }
    }
    assert!(violations.is_empty(), "{} upward import(s):\n{}", violations.len(), violations.join("\n"));

    // No cycle, within a layer either: depth-first search for a back edge.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for next in edges.get(m).map(|e| e.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
            match state.get(&next).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| *p == next).unwrap();
                    let mut cycle = path[from..].to_vec();
                    cycle.push(next);
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(&next, edges, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in layer_of.keys() {
        if state.get(*m).copied().unwrap_or(0) == 0 {
            if let Some(cycle) = visit(m, &edges, &mut state, &mut Vec::new()) {
                let hops: Vec<String> =
                    cycle.windows(2).map(|w| format!("  {} → {} ({})", w[0], w[1], edges[&w[0]][&w[1]])).collect();
                panic!("an import cycle among modules:\n{}", hops.join("\n"));
            }
        }
    }
}

/// The parser of the test itself: groups, nested paths, doc and plain comments, test modules.
#[test]
fn imports_are_read_from_paths_groups_and_doc_comments_but_not_plain_comments_or_tests() {
    let text = "use crate::data::Batch;\n// crate::cli in a comment\n/// see [`crate::plot`]\nuse crate::{config::{A, B}, host};\n\
                let x = crate::device::resolve(y);\n#[cfg(test)]\nfn helper() { crate::model::f() }\n\
                #[cfg(test)]\nmod tests { use crate::bench; }\n";
    let got: Vec<String> = imports(text).into_iter().map(|(_, m)| m).collect();
    assert_eq!(got, ["data", "plot", "config", "host", "device", "model"]);
}

/// The layer diagram of docs/architecture.md (its first code block: plexus' layers top to bottom,
/// `→` between layers, `,` within one, a named group's modules in parentheses; then
/// `→ plexus-native (its modules: …)`, the native crate's the same way down to its FFI) is
/// [`LAYERS`] and [`NATIVE_LAYERS`]: the same layers in the same order with the same modules.
#[test]
fn the_architecture_pages_layer_diagram_is_the_layers_tested_here() {
    let doc = std::fs::read_to_string(common::repo().join("docs/architecture.md")).unwrap();
    let block = doc.split("```").nth(1).expect("docs/architecture.md opens with the layer diagram");
    let text = block.split_whitespace().collect::<Vec<_>>().join(" ");
    let (plexus, native) = text.split_once("→ plexus-native (its modules:").expect("the native crate's layers");
    let native = native.trim().trim_end_matches(')').trim_end().trim_end_matches("→ the FFI in lib.rs");
    /// Top-to-bottom layers of a diagram's text, each as its set of modules.
    fn layers_of(text: &str) -> Vec<BTreeSet<String>> {
        text.split('→')
            .map(|group| {
                let inner = group.split_once('(').map_or(group, |(_, rest)| rest.trim_end().trim_end_matches(')'));
                inner.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect()
            })
            .collect()
    }
    let tested = |layers: &[(&str, &[&str])]| -> Vec<BTreeSet<String>> {
        layers.iter().rev().map(|(_, mods)| mods.iter().map(|m| m.to_string()).collect()).collect()
    };
    assert_eq!(layers_of(plexus), tested(LAYERS), "docs/architecture.md's diagram against LAYERS");
    assert_eq!(layers_of(native), tested(NATIVE_LAYERS), "docs/architecture.md's diagram against NATIVE_LAYERS");
}

/// Nothing above the trainers decides "train or rl" by the verb's name: the registry of run kinds
/// (src/kinds.rs) is the one place that says which kind a config or run is, and the RL module the
/// other that names its own verb. A `"rl"` literal anywhere else in src/ fails.
#[test]
fn only_the_rl_module_and_the_registry_name_the_rl_verb() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap();
        if rel.starts_with("rl") || rel == Path::new("kinds.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("\"rl\"") {
                found.push(format!("src/{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "ask crate::kinds instead of naming the verb:\n{}", found.join("\n"));
}

/// The study pipeline (src/study/) knows no kind's own fields: a run's metrics beyond its
/// summary, the column its curves are drawn against, which direction is better, what is not a
/// result — each kind says (`crate::kinds::RunKind`). None of the RL kind's own names
/// (`env_steps`, `success`, `time_at_goal`, `straight_success`, `held_out_eval`) may appear in
/// study/'s code or docs.
#[test]
fn the_study_pipeline_names_no_fields_of_a_kind() {
    let mut files = Vec::new();
    rust_files(&src().join("study"), &mut files);
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        // The tests at the end of a file may hold a kind's runs as data.
        let code = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or(&text);
        for (n, line) in code.lines().enumerate() {
            for name in ["env_steps", "\"success", "`success", "time_at_goal", "straight_success", "held_out_eval"] {
                if line.contains(name) {
                    found.push(format!("{}:{}: {}", f.strip_prefix(src()).unwrap().display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "study/ names a kind's own fields; let crate::kinds say them:\n{}", found.join("\n"));
}

/// `train::train` and `rl::trainer::train` stay runs that read top-down on the run engine
/// (train/engine.rs; issue: at most 80 lines each, signature to closing brace); what they do is in
/// components (train/run_log.rs, checkpoint.rs' Checkpointer, the trainers' loop states, …).
#[test]
fn the_training_loop_fits_in_80_lines() {
    for file in ["src/train/mod.rs", "src/rl/trainer.rs"] {
        let text = std::fs::read_to_string(common::repo().join(file)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.iter().position(|l| l.starts_with("pub fn train(")).expect("pub fn train");
        let end = start + lines[start..].iter().position(|l| *l == "}").expect("its closing brace");
        assert!(end - start < 80, "{file}: train is {} lines; move a job into a component", end - start + 1);
    }
}

/// Every `pub fn` of plexus (src/) and of the native crate has a doc comment (attributes may
/// stand between): what it does, and the shapes of the tensors it takes and returns where tensors
/// cross.
#[test]
fn every_pub_fn_is_documented() {
    let mut files = Vec::new();
    for dir in ["src", "native/src"] {
        rust_files(&common::repo().join(dir), &mut files);
    }
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut in_ffi = false;
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with("#[cfg(test)]") {
                break;
            }
            // The native crate's private `mod ffi` holds the C declarations, documented at their
            // definitions in C++.
            in_ffi = (in_ffi || l.starts_with("mod ffi {")) && *l != "}";
            let t = l.trim_start();
            if in_ffi {
                continue;
            }
            // `pub fn`, `pub(crate) fn`, and either with `const`, `async` or `unsafe` before `fn`.
            let Some(rest) = t.strip_prefix("pub ").or_else(|| t.strip_prefix("pub(crate) ")) else { continue };
            let rest = ["const ", "async ", "unsafe "].iter().fold(rest, |r, q| r.strip_prefix(q).unwrap_or(r));
            if !rest.starts_with("fn ") {
                continue;
            }
            let mut j = i;
            while j > 0 && lines[j - 1].trim_start().starts_with("#[") {
                j -= 1;
            }
            if j == 0 || !lines[j - 1].trim_start().starts_with("///") {
                missing.push(format!("{}:{}: {}", f.strip_prefix(common::repo()).unwrap().display(), i + 1, t));
            }
        }
    }
    assert!(files.len() > 40, "only {} files read", files.len());
    assert!(missing.is_empty(), "pub fn without a doc comment:\n{}", missing.join("\n"));
}
