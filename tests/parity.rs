//! `plexus parity` as a test: every topology and backbone against its PyTorch reference
//! (parity/SPEC.md), forward and every gradient, plus coverage and parameter counts.

use plexus::parity;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn parity_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("parity")
}

fn case_kinds() -> Vec<(String, String, String)> {
    parity::cases(&parity_dir().join("cases"), None)
        .unwrap()
        .iter()
        .map(|p| {
            let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            let s = |k: &str, f: &str| doc[k][f].as_str().map(str::to_string).unwrap_or_default();
            let precision = doc["precision"].as_str().unwrap_or("fp32").to_string();
            (parity::case_name(p), s("topology", "kind"), format!("{}/{precision}", s("model", "kind")))
        })
        .collect()
}

#[test]
fn every_registered_topology_has_a_parity_case() {
    let cases = case_kinds();
    for entry in plexus::topology::REGISTRY {
        let on: BTreeSet<&str> = cases.iter().filter(|c| c.1 == entry.name).map(|c| c.2.as_str()).collect();
        assert!(on.contains("mlp/fp32"), "topology `{}` has no fp32 mlp case in parity/cases", entry.name);
    }
    for name in ["residual", "hacn", "ancre", "mhc"] {
        assert!(cases.iter().any(|c| c.1 == name && c.2.ends_with("/bf16")), "no bf16 parity case for {name}");
    }
    // The bf16 rule lives in the backbones (which kernels, where the casts are): every backbone
    // with a reference has a bf16 case.
    for m in plexus::model::REGISTRY {
        if cases.iter().any(|c| c.2.starts_with(&format!("{}/", m.name))) {
            let bf16 = format!("{}/bf16", m.name);
            assert!(cases.iter().any(|c| c.2 == bf16), "no bf16 parity case on backbone `{}`", m.name);
        }
    }
    assert!(cases.iter().filter(|c| c.2.starts_with("mixer")).count() >= 5, "too few Transformer-like (mixer) cases");
}

/// Adding a topology is its Rust file, its registry line, its reference, its section in
/// `docs/topologies.md` and a case: nothing else names topologies (colours and labels come from
/// the registry entry, the parity harness finds references by file). This fails when one of those
/// places is missing or orphaned.
#[test]
fn every_topology_is_complete_and_nothing_else_lists_them() {
    let registered: BTreeSet<&str> = plexus::topology::REGISTRY.iter().map(|e| e.name).collect();
    let references: BTreeSet<String> = std::fs::read_dir(parity_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "py")
                && std::fs::read_to_string(p).unwrap().contains("\nclass Topology(")
        })
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let references: BTreeSet<&str> = references.iter().map(String::as_str).collect();
    assert_eq!(registered, references, "Rust registry vs parity/<kind>.py references");
    let readme = std::fs::read_to_string(parity_dir().join("../README.md")).unwrap();
    let docs = std::fs::read_to_string(parity_dir().join("../docs/topologies.md")).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/topology");
    for name in &registered {
        assert!(src.join(format!("{name}.rs")).is_file(), "src/topology/{name}.rs missing");
        assert!(readme.contains(&format!("| `{name}` |")), "README's topology table has no row for `{name}`");
        assert!(docs.contains(&format!("\n## `{name}`")), "docs/topologies.md has no section for `{name}`");
    }
    // The places that used to list topologies by name, and must not again.
    for file in ["src/plot/mod.rs", "src/plot/figures.rs", "parity/common.py"] {
        let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        for name in ["\"hacn\"", "\"densenet\"", "\"laurel\"", "\"rezero\""] {
            assert!(!text.contains(name), "{file} names the topology {name}: take it from the registry instead");
        }
    }
}

/// Adding a backbone is its Rust file (with a tiny config in its registry entry), its registry
/// line, its PyTorch reference in `parity/backbones.py`, fp32 and bf16 parity cases and a row in
/// the README's backbone table. This fails when one of those is missing.
#[test]
fn every_backbone_is_complete() {
    let cases = case_kinds();
    let references = std::fs::read_to_string(parity_dir().join("backbones.py")).unwrap();
    let readme = std::fs::read_to_string(parity_dir().join("../README.md")).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/model");
    // The deep linear network is checked against its closed form instead (tests/lnn_case_study.rs).
    let without_reference = ["lnn"];
    for e in plexus::model::REGISTRY {
        let name = e.name;
        assert!(src.join(format!("{name}.rs")).is_file(), "src/model/{name}.rs missing");
        assert!(readme.contains(&format!("| `{name}` |")), "README's backbone table has no row for `{name}`");
        let yaml = format!("name: t\n{}topology: {{kind: residual}}\n", e.tiny);
        let exp = plexus::experiment::Experiment::from_str(&yaml, "<tiny>", &[])
            .unwrap_or_else(|err| panic!("the tiny config of `{name}` does not load: {err}"));
        assert_eq!(exp.model.kind(), name, "the tiny config of `{name}` builds another backbone");
        if without_reference.contains(&name) {
            continue;
        }
        assert!(
            references.contains(&format!("\n    \"{name}\": (")),
            "parity/backbones.py: no MODELS entry for `{name}`"
        );
        for precision in ["fp32", "bf16"] {
            let on = format!("{name}/{precision}");
            assert!(cases.iter().any(|c| c.2 == on), "parity/cases: no {precision} case on backbone `{name}`");
        }
    }
}

#[test]
#[ignore = "slow tier: PyTorch parity, every case"]
fn all_parity_cases_pass_and_parameter_counts_match_the_references() {
    let cases = parity::cases(&parity_dir().join("cases"), None).unwrap();
    let work = tempfile::tempdir().unwrap();
    let results = parity::run_all(&parity_dir(), &cases, work.path(), tch::Device::Cpu).unwrap();
    let counts = std::process::Command::new(parity::python())
        .arg(parity_dir().join("run.py"))
        .arg("--count")
        .args(&cases)
        .output()
        .unwrap();
    assert!(counts.status.success(), "{}", String::from_utf8_lossy(&counts.stderr));
    let counts: Vec<i64> = String::from_utf8_lossy(&counts.stdout).lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(counts.len(), cases.len());
    let mut failures = Vec::new();
    for ((case, r), py_count) in cases.iter().zip(results).zip(counts) {
        match r {
            Ok(r) => {
                println!(
                    "{:<26} out {:.2e} grad {:.2e} ({}) tol {:.0e} params {}",
                    r.name, r.output_err, r.grad_err, r.worst_grad, r.tolerance, r.params
                );
                if !r.pass {
                    failures.push(format!(
                        "{}: output {:e}, grad {:e} ({})",
                        r.name, r.output_err, r.grad_err, r.worst_grad
                    ));
                }
                if r.params != py_count {
                    failures.push(format!("{}: {} parameters in plexus, {py_count} in PyTorch", r.name, r.params));
                }
            }
            Err(e) => failures.push(format!("{}: {e:#}", parity::case_name(case))),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `plexus parity --device cuda` runs the references on the GPU; a reference that makes a tensor on
/// the CPU inside forward (a RoPE table, a position embedding) fails there. PyTorch's `meta` device
/// fails the same way, so every case's forward and backward on `meta` catches it without a GPU (it
/// caught the GPT/LLaMA RoPE tables and the ViT position embedding, the first GPU run's failures).
#[test]
fn every_reference_runs_off_the_cpu() {
    let cases = parity::cases(&parity_dir().join("cases"), None).unwrap();
    let out = std::process::Command::new(parity::python())
        .arg(parity_dir().join("run.py"))
        .arg("--device-check")
        .args(&cases)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
