//! Device bugs made visible on a CPU.
//!
//! * Host reads: a training step that reads a tensor's value waits for the GPU to drain its queue;
//!   the step must read nothing except on logging steps (one read). Every read goes through
//!   `plexus::host`, which counts them, and the trainer records the count of each step. libtorch's
//!   dispatcher counts the operators that sync as well (`plexus::native::profile::watch_syncs`), so a read
//!   hidden inside an operator fails at run time too, not only by the source scan below.
//! * Device discipline: code that builds tensors on a hard-coded device (`Device::Cpu`) or reads
//!   values behind `plexus::host`'s back works on a CPU and breaks or stalls on a GPU (the
//!   connectivity probe once crashed every H-ACN run at step 0 that way). The source of
//!   `src/topology`, `src/model`, `src/train`, `src/rl` and `src/diffusion.rs` is scanned for both,
//!   and `src/diffusion.rs` (the DiT task, which runs inside the step) for uploads to the device.

use crate::common;
use common::rust_files;

use plexus::experiment::Experiment;
use plexus::run_dir::RunDir;
use plexus::train::{self, TrainOptions};
use std::path::Path;

#[test]
fn only_logging_steps_read_from_the_device_for_every_topology_on_every_backbone() {
    // libtorch's own count as well: a read hidden inside an operator (an `.item()` in a composite,
    // a `nonzero`) is a sync that plexus::host never sees. On the CPU the trainer counts the syncs of
    // its own thread, so the tests training beside it in this binary add none.
    plexus::native::profile::watch_syncs().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for m in plexus::model::REGISTRY {
        for t in plexus::topology::REGISTRY {
            // 7 updates; metrics logged at steps 0 and 5 and at the end (step 7, which also
            // evaluates and saves C); accumulation and clipping on, as in the paper configs.
            let yaml = format!(
                "name: x\n{}topology: {{kind: {}}}\ntrain: {{optimizer: adamw, lr: 0.01, steps: 7, accumulation: 2, \
                 clip_grad_norm: 1.0}}\nlog: {{every: 5, eval_every: 0, connectivity_every: 0, checkpoint_every: 0}}\n",
                common::tiny_backbone(m.name),
                t.name
            );
            let e = Experiment::from_str(&yaml, "discipline.yaml", &[]).unwrap();
            let dir = RunDir::create(&tmp.path().join(format!("{}-{}", m.name, t.name))).unwrap();
            let s = train::train(&e, &dir, &TrainOptions::default())
                .unwrap_or_else(|err| panic!("{} on {}: {err:#}", t.name, m.name));
            let reads = &s.host_reads;
            assert_eq!(reads.len(), 8, "{} on {}: {reads:?}", t.name, m.name);
            assert_eq!(&reads[..7], &[1, 0, 0, 0, 0, 1, 0], "{} on {}: reads per step", t.name, m.name);
            assert!(reads[7] >= 1, "{} on {}: the last step logs", t.name, m.name);
            let syncs = &s.device_syncs;
            assert_eq!(syncs.len(), 8, "{} on {}: {syncs:?}", t.name, m.name);
            let quiet: Vec<u64> = [1, 2, 3, 4, 6].iter().map(|&i| syncs[i]).collect();
            assert_eq!(
                quiet,
                [0; 5],
                "{} on {}: libtorch ran host-device syncs on steps 1-4 and 6, which read nothing ({:?})",
                t.name,
                m.name,
                plexus::native::profile::sync_count().map(|c| c.by_name)
            );
        }
    }
}

/// Lines allowed to name a device or read a value in the scanned directories, each with why.
/// Keep it short: every entry is a place where a GPU run copies to the host.
const ALLOWED: &[(&str, &str, &str)] = &[
    ("src/train/optim.rs", "Device::Cpu", "the device of an optimizer with no parameters at all"),
    (
        "src/topology/ancre.rs",
        "tch::Device::Cpu",
        "the constant-weight variant has no parameter to take a device from; a log view",
    ),
    ("src/topology/denseformer.rs", "tch::Device::Cpu", "the DWA weight view is assembled on the CPU for logs"),
    (
        "src/model/layers.rs",
        "Device::Cpu",
        "RoPE tables are computed in f64 on the CPU once, at build time, then moved",
    ),
    (
        "src/model/vit.rs",
        "Device::Cpu",
        "sin-cos position table computed in f64 on the CPU once, at build time, then moved",
    ),
    (
        "src/model/dit.rs",
        "Device::Cpu",
        "DiT's sin-cos position table computed in f64 on the CPU once, at build time, then moved",
    ),
    (
        "src/task/ddpm.rs",
        "(Kind::Double, Device::Cpu)",
        "the β schedule's tables in f64 on the CPU; Schedule::on moves them to a device once and caches them",
    ),
    (
        "src/task/ddpm.rs",
        "let put = |t: Tensor| t.to_kind(Kind::Float).to_device(device);",
        "the one upload of those tables",
    ),
    (
        "src/task/ddpm.rs",
        "t.to_kind(Kind::Float).reshape([b, 1]).to_device(x.device()),",
        "DiT input packing: in the step t and y are drawn on x's device (no copy); other callers may pass CPU ones",
    ),
    ("src/task/ddpm.rs", "y.to_kind(Kind::Float).reshape([b, 1]).to_device(x.device()),", "as above, for the labels"),
];

/// Files outside the scanned directories that run inside the training step, scanned as well.
const STEP_FILES: &[&str] = &["src/task/ddpm.rs"];

/// In [`STEP_FILES`], copies to a device are flagged too: a CPU-made tensor moved to the GPU in
/// every step is a blocking copy that waits for the GPU's queue (the diffusion task once copied its
/// schedule table that way on every step).
const UPLOADS: &str = ".to_device(";

/// Reading methods of tch that must go through `plexus::host` in these directories.
const READS: &[&str] =
    &["double_value(", "int64_value(", "f64_value(", "try_from(", ".to_device(Device::Cpu)", "Device::Cpu"];

/// `(file, line number, line)` of every forbidden use outside `#[cfg(test)]` modules and the
/// allowlist.
fn violations(root: &Path) -> Vec<(String, usize, String)> {
    let mut found = Vec::new();
    for sub in ["src/topology", "src/model", "src/train", "src/rl"].iter().chain(STEP_FILES) {
        let mut files = Vec::new();
        if sub.ends_with(".rs") {
            files.push(root.join(sub));
        } else {
            rust_files(&root.join(sub), &mut files);
        }
        files.sort();
        for f in files {
            let rel = f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("#[cfg(test)]") {
                    break; // unit tests run on the CPU on purpose
                }
                if line.trim_start().starts_with("//") {
                    continue;
                }
                let hit = READS.iter().any(|r| line.contains(r))
                    || (STEP_FILES.contains(&rel.as_str()) && line.contains(UPLOADS));
                let allowed = ALLOWED.iter().any(|(file, what, _)| rel == *file && line.contains(what));
                if hit && !allowed {
                    found.push((rel.clone(), i + 1, line.trim().to_string()));
                }
            }
        }
    }
    found
}

#[test]
fn no_hard_coded_device_and_no_unaccounted_read_in_topology_model_or_train() {
    let v = violations(&common::repo());
    assert!(
        v.is_empty(),
        "tensors on a hard-coded device or reads behind plexus::host's back (derive the device from an input \
         or the VarStore; read through plexus::host; or add a commented entry to ALLOWED):\n{}",
        v.iter().map(|(f, n, l)| format!("  {f}:{n}: {l}")).collect::<Vec<_>>().join("\n")
    );
    // Every allowlist entry still matches something (a stale entry would hide a new violation).
    for (file, what, why) in ALLOWED {
        let text = std::fs::read_to_string(common::repo().join(file)).unwrap();
        assert!(text.contains(what), "stale ALLOWED entry {file} / {what} ({why})");
    }
}

/// The scan finds the defect it exists for: the connectivity probe built on `Device::Cpu`, and a
/// per-parameter `double_value` in the gradient norm.
#[test]
fn the_scan_catches_the_defects_it_guards_against() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for sub in ["src/topology", "src/model", "src/train", "src/rl"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::write(
        root.join("src/topology/common.rs"),
        "pub fn probe() {\n    let x0 = Tensor::zeros([1, n], (Kind::Double, Device::Cpu));\n}\n#[cfg(test)]\nmod tests { fn t() { Device::Cpu; } }\n",
    )
    .unwrap();
    std::fs::write(
        root.join("src/train/optim.rs"),
        "fn grad_norm() { g.square().sum(Kind::Double).double_value(&[]) }\n",
    )
    .unwrap();
    std::fs::write(root.join("src/model/ok.rs"), "fn f(x: &Tensor) -> Tensor { x.zeros_like() }\n").unwrap();
    // The diffusion task's first version: the schedule table uploaded in every step.
    std::fs::create_dir_all(root.join("src/task")).unwrap();
    std::fs::write(
        root.join("src/task/ddpm.rs"),
        "pub fn noisy(x0: &Tensor, t: &Tensor) -> Tensor {\n    \
         let ab = alpha_bar().to_kind(Kind::Float).to_device(x0.device()).index_select(0, t);\n}\n",
    )
    .unwrap();
    let v = violations(root);
    let lines: Vec<(String, usize)> = v.iter().map(|(f, n, _)| (f.clone(), *n)).collect();
    assert_eq!(
        lines,
        vec![
            ("src/topology/common.rs".to_string(), 2),
            ("src/train/optim.rs".to_string(), 1),
            ("src/task/ddpm.rs".to_string(), 2)
        ]
    );
}
