//! Run directories that cannot be corrupted: resume checks the config, new runs do not write
//! over existing files, one writer at a time, leftovers of a killed run are cleaned, checkpoints
//! are checksummed, and failures before training leave no directory behind.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

/// A tiny run (seconds) that checkpoints every 2 steps.
const TINY: &str = "name: tiny\nseed: 1\ndevice: cpu\nmodel: {kind: mlp, width: 8, depth: 2}\ntopology: {kind: hacn}\n\
data: {kind: synthetic_images, image_size: 4, channels: 1, classes: 3, samples: 32, batch_size: 8}\n\
train: {optimizer: adamw, lr: 0.01, steps: 4}\nlog: {every: 1, checkpoint_every: 2, keep_checkpoints: 5}\n";

fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("tiny.yaml");
    std::fs::write(&cfg, TINY).unwrap();
    (tmp, cfg)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(o: &std::process::Output) {
    assert!(o.status.success(), "{:?}", text(o));
}

fn fails(o: &std::process::Output) -> String {
    let (out, err) = text(o);
    assert!(!o.status.success(), "expected a failure:\n{out}{err}");
    assert_ne!(o.status.code(), Some(101), "a panic:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("frame #"), "{err}");
    err
}

/// The README's commands: `plexus train CONFIG --out R`, then `plexus train CONFIG --resume R`
/// (with a longer `train.steps`), and `plexus train --resume R` alone.
#[test]
fn the_readme_resume_command_works_and_extends_the_run() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let o = plexus(&["train", s(&cfg), "--resume", s(&run), "--set", "train.steps=6"], tmp.path());
    ok(&o);
    assert_eq!(read_losses(&run).last().unwrap().0, 6.0);
    let resolved = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(resolved.contains("steps: 6"), "config.yaml records the extension:\n{resolved}");
    // The run's own config (now steps: 6) and a logging change are accepted without CONFIG.
    ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=8", "--set", "log.every=2"], tmp.path()));
    let resolved = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(resolved.contains("steps: 8") && resolved.contains("every: 2"), "{resolved}");
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(summary.contains("\"resumed_from\": 6"), "{summary}");
}

/// Lengthening a run on a cosine schedule must say what the added updates do: without `--extend`
/// the resume is refused naming the three rules (and nothing is written); each rule is recorded in
/// config.yaml, the lengthened run equals a fresh run of that config.yaml (metrics.csv and C
/// byte for byte), and the finished run's rows stay as they were (its last row included,
/// which the lengthened run measures again with the next update's rate).
#[test]
fn lengthening_a_cosine_run_takes_a_recorded_rule_and_rewrites_no_row() {
    let (tmp, _) = setup();
    let cfg = tmp.path().join("cosine.yaml");
    let text = TINY
        .replace("steps: 4}", "steps: 6, schedule: cosine, warmup_steps: 1}")
        .replace("checkpoint_every: 2", "checkpoint_every: 2, connectivity_every: 3");
    std::fs::write(&cfg, text).unwrap();
    let finished = tmp.path().join("finished");
    ok(&plexus(&["train", s(&cfg), "--out", s(&finished)], tmp.path()));
    let read = |run: &Path, f: &str| std::fs::read_to_string(run.join(f)).unwrap();
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            match e.file_type().unwrap().is_dir() {
                true => copy_dir(&e.path(), &to.join(e.file_name())),
                false => drop(std::fs::copy(e.path(), to.join(e.file_name())).unwrap()),
            }
        }
    }
    let copy = |name: &str| {
        let to = tmp.path().join(name);
        copy_dir(&finished, &to);
        to
    };
    let run = copy("hold");
    let err = fails(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=9"], tmp.path()));
    for rule in ["--extend hold", "--extend restart", "--extend stretch"] {
        assert!(err.contains(rule), "{rule}: {err}");
    }
    assert!(err.contains("grows from 6 to 9") && err.contains("train.extensions"), "{err}");
    assert_eq!(read(&run, "config.yaml"), read(&finished, "config.yaml"), "a refused resume writes nothing");
    // `hold`: recorded, and the same as a fresh run of the lengthened config.
    ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=9", "--extend", "hold"], tmp.path()));
    let recorded = read(&run, "config.yaml");
    assert!(recorded.contains("extensions:\n  - at: 6\n    from_steps: 6\n    rule: hold"), "{recorded}");
    let fresh = tmp.path().join("fresh");
    ok(&plexus(&["train", s(&run.join("config.yaml")), "--out", s(&fresh)], tmp.path()));
    // Every row but the finished run's last one, which the lengthened run keeps: its Γ (read after
    // the step's update) is after 6 updates there, and after the 7th in the fresh run.
    let (kept, fresh_rows) = (read(&run, "metrics.csv"), read(&fresh, "metrics.csv"));
    for (a, b) in kept.lines().zip(fresh_rows.lines()) {
        match a.starts_with("6,") {
            false => assert_eq!(a, b),
            true => assert_eq!(a.rsplit_once(',').unwrap().0, b.rsplit_once(',').unwrap().0),
        }
    }
    assert_eq!(kept.lines().count(), fresh_rows.lines().count());
    for step in [0, 3, 6, 9] {
        let c = format!("connectivity/step_{step}.csv");
        assert_eq!(read(&run, &c), read(&fresh, &c), "{c}");
    }
    // `restart` and `stretch` change the rate from update 6 on; the rows the run held are kept.
    for rule in ["restart", "stretch"] {
        let run = copy(rule);
        ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=9", "--extend", rule], tmp.path()));
        let (before, after) = (read(&finished, "metrics.csv"), read(&run, "metrics.csv"));
        assert!(after.starts_with(&before), "{rule}: a held row was rewritten:\n{before}\n{after}");
        // Update 7 of a 3-update cosine cycle from update 6 (restart), of a 9-update cosine (stretch).
        let lr7: f64 = after.lines().nth(8).unwrap().split(',').nth(3).unwrap().parse().unwrap();
        let progress = if rule == "restart" { 1.0 / 3.0 } else { 6.0 / 8.0 };
        let expect = 0.01 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        assert!((lr7 - expect).abs() < 1e-12, "{rule}: update 7 at {lr7}, expected {expect}");
    }
    // A rule with nothing to decide is refused; so is one for a constant schedule.
    let err = fails(&plexus(&["train", "--resume", s(&run), "--extend", "hold"], tmp.path()));
    assert!(err.contains("nothing to decide") && err.contains("stays at 9"), "{err}");
    let constant = tmp.path().join("constant");
    let tiny = tmp.path().join("tiny.yaml");
    ok(&plexus(&["train", s(&tiny), "--out", s(&constant)], tmp.path()));
    let err = fails(&plexus(
        &["train", "--resume", s(&constant), "--set", "train.steps=6", "--extend", "stretch"],
        tmp.path(),
    ));
    assert!(err.contains("does not depend on its length (constant schedule)"), "{err}");
}

/// A graph run started from a C in a file pins that C when it starts (a copy in `inputs/`, its
/// SHA-256 in `inputs.yaml`): the file edited before a resume changes nothing (the resumed run
/// equals the uninterrupted one byte for byte), `plexus connectivity` prints the pinned C, and a
/// pinned copy that was changed is refused naming both hashes.
#[test]
fn a_c_from_a_file_is_pinned_and_an_edit_of_the_file_changes_no_reader() {
    let (tmp, _) = setup();
    let c_file = tmp.path().join("c.csv");
    // L = 2 units at sublayer granularity of the 2-layer MLP: C is 4×4.
    let c = "node,0,1,2,3\n0,0,1,0.5,0.25\n1,0,0,1,0.5\n2,0,0,0,1\n3,0,0,0,0\n";
    std::fs::write(&c_file, c).unwrap();
    let cfg = tmp.path().join("graph.yaml");
    let text = TINY
        .replace("topology: {kind: hacn}", "topology: {kind: graph, weights: fixed, init: {file: c.csv}}")
        .replace("steps: 4}", "steps: 6}");
    std::fs::write(&cfg, text).unwrap();
    let whole = tmp.path().join("whole");
    ok(&plexus(&["train", s(&cfg), "--out", s(&whole)], tmp.path()));
    let record = std::fs::read_to_string(whole.join("inputs.yaml")).unwrap();
    assert!(record.contains("key: topology.init") && record.contains(&sha256_hex(c.as_bytes())), "{record}");
    assert_eq!(std::fs::read_to_string(whole.join("inputs/topology.init.csv")).unwrap(), c);
    let summary = std::fs::read_to_string(whole.join("summary.json")).unwrap();
    assert!(summary.contains("C from c.csv fixed"), "a C from a file is labelled as one: {summary}");
    // Stopped after the checkpoint at step 2, the file edited, then resumed.
    let run = tmp.path().join("r");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
        .args(["train", s(&cfg), "--out", s(&run)])
        .env("PLEXUS_CRASH_AFTER", "2")
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(!o.status.success() && run.join("checkpoints/step_2.json").is_file(), "{:?}", text_of(&o));
    std::fs::write(&c_file, c.replace("0.5", "3")).unwrap();
    ok(&plexus(&["train", "--resume", s(&run)], tmp.path()));
    let read = |r: &Path, f: &str| std::fs::read_to_string(r.join(f)).unwrap();
    assert_eq!(read(&run, "metrics.csv"), read(&whole, "metrics.csv"), "the edit reached the resumed run");
    let printed = |r: &Path| text_of(&plexus(&["connectivity", s(r)], tmp.path())).0;
    assert_eq!(printed(&run), printed(&whole));
    assert!(printed(&run).contains("0.5"), "{}", printed(&run));
    // A changed copy is refused, by every reader.
    std::fs::write(run.join("inputs/topology.init.csv"), c.replace("0.25", "0.3")).unwrap();
    for args in [vec!["connectivity", s(&run)], vec!["train", "--resume", s(&run), "--set", "train.steps=8"]] {
        let err = fails(&plexus(&args, tmp.path()));
        assert!(
            err.contains("inputs/topology.init.csv has SHA-256") && err.contains(&sha256_hex(c.as_bytes())),
            "{args:?}: {err}"
        );
    }
}

/// `init: {from: RUN}` without a step pins the step it read: the source run training on (saving
/// C at later steps) changes neither the dependent run's record nor what its readers see.
#[test]
fn a_c_from_another_run_pins_the_step_it_read() {
    let (tmp, _) = setup();
    let source = tmp.path().join("source");
    let src_cfg = tmp.path().join("src.yaml");
    std::fs::write(
        &src_cfg,
        TINY.replace("kind: hacn}", "kind: layercomb}").replace("every: 1,", "every: 1, connectivity_every: 2,"),
    )
    .unwrap();
    ok(&plexus(&["train", s(&src_cfg), "--out", s(&source)], tmp.path()));
    let cfg = tmp.path().join("graph.yaml");
    let graph = format!("topology: {{kind: graph, weights: fixed, init: {{from: {}}}}}", s(&source));
    std::fs::write(&cfg, TINY.replace("topology: {kind: hacn}", &graph)).unwrap();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let record = std::fs::read_to_string(run.join("inputs.yaml")).unwrap();
    assert!(record.contains("step: 4") && record.contains("connectivity/step_4.csv"), "{record}");
    let before = text_of(&plexus(&["connectivity", s(&run)], tmp.path())).0;
    ok(&plexus(&["train", "--resume", s(&source), "--set", "train.steps=8"], tmp.path()));
    assert!(source.join("connectivity/step_8.csv").is_file());
    assert_eq!(text_of(&plexus(&["connectivity", s(&run)], tmp.path())).0, before);
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(summary.contains(&format!("C of {} at step 4", s(&source))), "{summary}");
}

/// A run records the SHA-256 of its dataset's files when it starts, and a resume, `analyze` or
/// `connectivity` on files that changed since is refused, naming the file and both hashes (nothing
/// is trained or written).
#[test]
fn a_resume_on_changed_data_files_is_refused_naming_both_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data/tiny-mnist");
    std::fs::create_dir_all(&data).unwrap();
    let idx = |magic: u32, dims: &[u32], body: Vec<u8>| {
        let mut b = magic.to_be_bytes().to_vec();
        dims.iter().for_each(|d| b.extend(d.to_be_bytes()));
        b.extend(body);
        b
    };
    for (split, n) in [("train", 32u32), ("t10k", 8)] {
        let pixels: Vec<u8> = (0..n * 784).map(|i| (i * 7 % 251) as u8).collect();
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        std::fs::write(data.join(format!("{split}-images-idx3-ubyte")), idx(2051, &[n, 28, 28], pixels)).unwrap();
        std::fs::write(data.join(format!("{split}-labels-idx1-ubyte")), idx(2049, &[n], labels)).unwrap();
    }
    let cfg = tmp.path().join("mnist.yaml");
    let root = tmp.path().join("data").display().to_string();
    std::fs::write(
        &cfg,
        format!(
            "name: m\nseed: 1\ndevice: cpu\nmodel: {{kind: mlp, width: 8, depth: 2}}\ntopology: {{kind: residual}}\n\
             data: {{kind: mnist, root: {root:?}, dataset: tiny-mnist, batch_size: 8}}\n\
             train: {{optimizer: adamw, lr: 0.01, steps: 4}}\nlog: {{every: 1, checkpoint_every: 2}}\n"
        ),
    )
    .unwrap();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let record = std::fs::read_to_string(run.join("inputs.yaml")).unwrap();
    let labels = data.join("train-labels-idx1-ubyte");
    let old = sha256_hex(&std::fs::read(&labels).unwrap());
    assert!(record.contains("data.files[1]") && record.contains(&old), "{record}");
    let mut changed = std::fs::read(&labels).unwrap();
    changed[8] = 9;
    std::fs::write(&labels, &changed).unwrap();
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    for args in [
        vec!["train", "--resume", s(&run), "--set", "train.steps=6"],
        vec!["analyze", s(&run)],
        vec!["connectivity", s(&run)],
    ] {
        let err = fails(&plexus(&args, tmp.path()));
        assert!(
            err.contains("train-labels-idx1-ubyte") && err.contains(&old) && err.contains(&sha256_hex(&changed)),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_to_string(run.join("metrics.csv")).unwrap(), metrics);
    assert!(!run.join("analysis.json").exists());
}

fn text_of(o: &std::process::Output) -> (String, String) {
    text(o)
}

/// The SHA-256 of `bytes` in hex, as `sha256sum` prints it.
fn sha256_hex(bytes: &[u8]) -> String {
    plexus::pins::sha256(bytes)
}

/// Resuming with anything that changes what is trained is refused, naming the keys; config.yaml
/// and the checkpoints are left as they were.
#[test]
fn resume_refuses_a_changed_config_naming_the_keys() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let before = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    for (set, key) in [
        ("topology.kind=plain", "topology.kind"),
        ("seed=2", "seed"),
        ("data.seed=3", "data.seed"),
        ("train.optimizer=gd", "train.optimizer"),
        ("model.width=16", "model.width"),
    ] {
        // Even together with an allowed change (a longer run).
        let err = fails(&plexus(&["train", "--resume", s(&run), "--set", set, "--set", "train.steps=9"], tmp.path()));
        assert!(err.contains(&format!("`{key}`")) && err.contains("Only train.steps"), "{set}: {err}");
    }
    let err = fails(&plexus(&["train", s(&cfg), "--resume", s(&run), "--set", "train.steps=2"], tmp.path()));
    assert!(err.contains("`train.steps`") && err.contains("not shrink"), "{err}");
    // CONFIG given with --resume: a different file is compared the same way.
    let other = tmp.path().join("other.yaml");
    std::fs::write(&other, TINY.replace("kind: hacn", "kind: residual")).unwrap();
    let err = fails(&plexus(&["train", s(&other), "--resume", s(&run)], tmp.path()));
    assert!(err.contains("`topology.kind` is `hacn` in the run but `residual` here"), "{err}");
    assert_eq!(std::fs::read_to_string(run.join("config.yaml")).unwrap(), before);
    assert_eq!(std::fs::read_to_string(run.join("metrics.csv")).unwrap(), metrics);
}

/// A new run into a directory that holds files is refused (naming the directory and both ways
/// out); --overwrite clears it; an existing run's checkpoints do not leak into a new run.
#[test]
fn a_new_run_into_a_non_empty_directory_is_refused_unless_overwrite() {
    let (tmp, cfg) = setup();
    let dir = tmp.path().join("mine");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "precious").unwrap();
    let err = fails(&plexus(&["train", s(&cfg), "--out", s(&dir)], tmp.path()));
    assert!(err.contains(s(&dir)) && err.contains("--overwrite") && err.contains("--resume"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("notes.txt")).unwrap(), "precious");
    assert!(!dir.join("config.yaml").exists());

    // An existing run: refused, its checkpoints intact.
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run), "--set", "train.steps=6"], tmp.path()));
    let err = fails(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    assert!(err.contains("already holds a plexus run"), "{err}");
    assert!(run.join("checkpoints/step_6.json").is_file());
    // --overwrite: a fresh run, no checkpoint of the old one left to win a later --resume.
    ok(&plexus(&["train", s(&cfg), "--out", s(&run), "--overwrite"], tmp.path()));
    assert!(!run.join("checkpoints/step_6.json").exists());
    assert_eq!(read_losses(&run).last().unwrap().0, 4.0);
    ok(&plexus(&["train", s(&dir.parent().unwrap().join("tiny.yaml")), "--out", s(&dir), "--overwrite"], tmp.path()));
    assert!(!dir.join("notes.txt").exists() && dir.join("config.yaml").is_file());
    // A directory that exists but is empty is fine.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(empty.join("figures")).unwrap();
    ok(&plexus(&["train", s(&cfg), "--out", s(&empty)], tmp.path()));
}

/// A second writer is refused while the first holds the lock, naming the holder's pid; the lock
/// goes with its holder.
#[test]
fn a_second_writer_is_refused_naming_the_pid() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let rd = plexus::run_dir::RunDir::open(&run).unwrap();
    let lock = rd.lock().unwrap();
    let err = fails(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=6"], tmp.path()));
    assert!(
        err.contains("in use by another plexus process") && err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    let err = fails(&plexus(&["train", s(&cfg), "--out", s(&run), "--overwrite"], tmp.path()));
    assert!(err.contains("in use"), "{err}");
    assert!(run.join("checkpoints/step_4.json").is_file(), "the refused --overwrite deleted nothing");
    // analyze writes into the run directory too: refused while a training run holds it.
    let err = fails(&plexus(&["analyze", s(&run)], tmp.path()));
    assert!(err.contains("in use by another plexus process"), "{err}");
    assert!(!run.join("analysis.json").exists());
    drop(lock);
    ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=6"], tmp.path()));
}

/// Temporary files and marker-less checkpoint files left by a kill are removed on resume (and the
/// run resumes from the last complete checkpoint).
#[test]
fn leftovers_of_a_killed_run_are_cleaned_on_resume() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let ck = run.join("checkpoints");
    let planted = [
        run.join(".tmp-abc123"),
        ck.join(".tmp-x.safetensors"),
        run.join("connectivity/.tmp-y"),
        ck.join("step_5.safetensors"),
        ck.join("step_5.optim.safetensors"),
    ];
    for p in &planted {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"half").unwrap();
    }
    ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=6"], tmp.path()));
    for p in &planted {
        assert!(!p.exists(), "{} survived", p.display());
    }
    assert!(ck.join("step_6.safetensors").is_file() && ck.join("step_4.json").is_file());
}

/// A flipped bit in a checkpoint is an error naming the file, not a different model.
#[test]
fn a_corrupted_checkpoint_is_detected_by_its_checksum() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let marker = std::fs::read_to_string(run.join("checkpoints/step_4.json")).unwrap();
    assert!(marker.contains("model_crc32") && marker.contains("optim_crc32"), "{marker}");
    for file in ["step_4.safetensors", "step_4.optim.safetensors"] {
        let f = run.join("checkpoints").join(file);
        let good = std::fs::read(&f).unwrap();
        let mut bad = good.clone();
        let i = bad.len() - 3; // in the tensor data, past the header: still parses
        bad[i] ^= 0x10;
        std::fs::write(&f, &bad).unwrap();
        let err = fails(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=6"], tmp.path()));
        assert!(err.contains(s(&f)) && err.contains("corrupt") && err.contains("CRC-32"), "{err}");
        std::fs::write(&f, &good).unwrap();
    }
    ok(&plexus(&["train", "--resume", s(&run), "--set", "train.steps=6"], tmp.path()));
}

/// Weights of another shape (a hand-edited config.yaml) are reported by parameter and shapes,
/// without libtorch's C++ frames.
#[test]
fn a_width_mismatch_on_resume_names_the_parameter_and_both_shapes() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let c = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    std::fs::write(run.join("config.yaml"), c.replace("width: 8", "width: 12")).unwrap();
    let err = fails(&plexus(&["train", "--resume", s(&run)], tmp.path()));
    assert!(err.contains("step_4.safetensors") && err.contains("[3, 8]") && err.contains("[3, 12]"), "{err}");
    assert!(err.contains("parameter `"), "{err}");
    let err = fails(&plexus(&["connectivity", s(&run)], tmp.path()));
    assert!(err.contains("final.safetensors") && err.contains("parameter `"), "{err}");
}

/// A data or device error leaves no run directory behind.
#[test]
fn failures_before_training_leave_no_run_directory() {
    let (tmp, _) = setup();
    let cfg = tmp.path().join("mnist.yaml");
    std::fs::write(
        &cfg,
        TINY.replace(
            "{kind: synthetic_images, image_size: 4, channels: 1, classes: 3, samples: 32, batch_size: 8}",
            "{kind: mnist, dataset: nowhere}",
        ),
    )
    .unwrap();
    let run = tmp.path().join("r");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
        .args(["train", s(&cfg), "--out", s(&run)])
        .env("PLEXUS_DATA", tmp.path())
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let err = fails(&o);
    assert!(err.contains("nowhere"), "{err}");
    assert!(!run.exists(), "a data error left {}", run.display());
    let gpu = tmp.path().join("gpu.yaml");
    std::fs::write(&gpu, TINY.replace("device: cpu", "device: cuda:63")).unwrap();
    let err = fails(&plexus(&["train", s(&gpu), "--out", s(&run)], tmp.path()));
    assert!(err.contains("cuda"), "{err}");
    assert!(!run.exists(), "a device error left {}", run.display());
    assert!(!tmp.path().join("runs").exists());
}

/// Outputs honour the umask like any other file (not tempfile's private 0600); write errors name
/// the path asked for.
#[cfg(unix)]
#[test]
fn outputs_follow_the_umask_and_errors_name_the_path() {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run)], tmp.path()));
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask =
        status.lines().find_map(|l| l.strip_prefix("Umask:")).map(|u| u32::from_str_radix(u.trim(), 8).unwrap());
    let want = 0o666 & !umask.unwrap_or(0o022);
    for f in [
        "config.yaml",
        "metrics.csv",
        "summary.json",
        "checkpoints/step_4.safetensors",
        "checkpoints/final.safetensors",
    ] {
        let mode = std::fs::metadata(run.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, want, "{f}: {mode:o}");
    }
    let err =
        fails(&plexus(&["bench", s(&cfg), "--steps", "1", "--warmup", "0", "--csv", "/dev/null/x.csv"], tmp.path()));
    assert!(err.contains("/dev/null/x.csv"), "{err}");
}

/// `final.safetensors` is checked by every command that loads it: a flipped bit is an error naming
/// the file and `weights.json`; weights that are not finite are refused naming the parameter; a
/// missing file says how far the run got and how to finish it. Never a number measured on them.
#[test]
fn final_weights_are_checksummed_finite_and_present_or_refused() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run), "--quiet"], tmp.path()));
    let fin = run.join("checkpoints/final.safetensors");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("checkpoints/weights.json")).unwrap()).unwrap();
    let good = std::fs::read(&fin).unwrap();
    assert_eq!(manifest["final.safetensors"]["bytes"], good.len() as u64);
    ok(&plexus(&["analyze", s(&run), "--repeats", "1"], tmp.path()));
    let verbs: [&[&str]; 2] = [&["analyze", s(&run), "--repeats", "1"], &["connectivity", s(&run)]];

    // One flipped bit in the last tensor's data.
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x10;
    std::fs::write(&fin, &flipped).unwrap();
    for args in verbs {
        let err = fails(&plexus(args, tmp.path()));
        assert!(err.contains(s(&fin)) && err.contains("is corrupt") && err.contains("weights.json"), "{err}");
    }

    // NaN weights in a run without a manifest (written before checksums): refused by name.
    let mut tensors = tch::Tensor::read_safetensors(fin.with_file_name("step_4.safetensors")).unwrap();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let _ = tensors[1].1.get(0).fill_(f64::NAN);
    let named: Vec<(&str, &tch::Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    tch::Tensor::write_safetensors(&named, &fin).unwrap();
    std::fs::remove_file(run.join("checkpoints/weights.json")).unwrap();
    for args in verbs {
        let err = fails(&plexus(args, tmp.path()));
        assert!(err.contains(&format!("parameter `{}`", tensors[1].0)) && err.contains("not finite"), "{err}");
    }

    std::fs::remove_file(&fin).unwrap();
    for args in verbs {
        let err = fails(&plexus(args, tmp.path()));
        assert!(
            err.contains(s(&fin))
                && err.contains("has not finished")
                && err.contains("step 4")
                && err.contains(&format!("--resume {}", run.display())),
            "{err}"
        );
    }
}

/// Figures and CSVs are replaced whole or not at all: with writes failing part-way (a file-size
/// limit, as a full disk fails them), `plexus plot` and `plexus bench --csv` exit with an error
/// and leave the previous files byte for byte, and no temporary file.
#[test]
fn a_failing_write_leaves_the_previous_figure_and_csv_intact() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    ok(&plexus(&["train", s(&cfg), "--out", s(&run), "--quiet"], tmp.path()));
    ok(&plexus(&["plot", s(&run)], tmp.path()));
    let csv = tmp.path().join("bench.csv");
    let bench = ["bench", s(&cfg), "--steps", "1", "--warmup", "0", "--csv", s(&csv)];
    ok(&plexus(&bench, tmp.path()));
    // (path, size, hash of the bytes) of every file in `dir`.
    let snapshot = |dir: &Path| -> Vec<(PathBuf, usize, u64)> {
        use std::hash::{Hash, Hasher};
        let mut v: Vec<(PathBuf, usize, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                (p.clone(), bytes.len(), h.finish())
            })
            .collect();
        v.sort();
        v
    };
    let figures = snapshot(&run.join("figures"));
    assert!(figures.iter().any(|(p, len, _)| p.extension().is_some_and(|e| e == "png") && *len > 8192));
    let csv_before = std::fs::read(&csv).unwrap();
    // Writes beyond 8 KiB fail with EFBIG (SIGXFSZ ignored): the PNGs are larger, the CSV's rewrite
    // is not, so pad the CSV past the limit first.
    let limited = |args: &[&str]| {
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("ulimit -f 8; trap '' XFSZ; exec '{}' {}", env!("CARGO_BIN_EXE_plexus"), quoted.join(" ")))
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let err = fails(&limited(&["plot", s(&run)]));
    assert!(err.contains("figures") && err.contains(".png"), "{err}");
    assert_eq!(snapshot(&run.join("figures")), figures, "a figure was changed or a temporary file left");
    let padded = [csv_before.clone(), format!("# {}\n", "x".repeat(9000)).into_bytes()].concat();
    std::fs::write(&csv, &padded).unwrap();
    fails(&limited(&bench));
    assert_eq!(std::fs::read(&csv).unwrap(), padded, "the CSV was changed");
    assert!(snapshot(tmp.path()).iter().all(|(p, _, _)| !p.to_string_lossy().contains(".tmp-")));
}

/// A resume under other settings than its run started with, of those its numbers depend on (here
/// libtorch's CPU threads, `OMP_NUM_THREADS` and `MKL_NUM_THREADS`), goes on, says so on stderr naming the setting and
/// both values, and is listed in the run's numerics.yaml; a resume under the same settings says
/// and records nothing.
#[test]
fn a_resume_on_other_cpu_threads_goes_on_and_says_so() {
    let (tmp, cfg) = setup();
    let run = tmp.path().join("r");
    let train = |threads: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(["train", s(&cfg)])
            .args(args)
            // Both: libtorch's threads follow MKL_NUM_THREADS where it is set (scripts/test.sh sets
            // both to 1), else OMP_NUM_THREADS.
            .env("OMP_NUM_THREADS", threads)
            .env("MKL_NUM_THREADS", threads)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let record = || std::fs::read_to_string(run.join("numerics.yaml")).unwrap();
    ok(&train("1", &["--out", s(&run)]));
    assert!(record().contains("cpu_threads: 1") && !record().contains("\nresumed:"), "{}", record());
    let same = train("1", &["--resume", s(&run), "--set", "train.steps=6"]);
    ok(&same);
    assert!(!text(&same).1.contains("warning"), "{}", text(&same).1);
    assert!(!record().contains("\nresumed:"), "{}", record());
    let other = train("2", &["--resume", s(&run), "--set", "train.steps=8"]);
    ok(&other);
    let err = text(&other).1;
    assert!(err.contains("resumes at step 6") && err.contains("cpu_threads: 1 → 2"), "{err}");
    assert!(record().contains("resumed:\n- step: 6\n  changed:\n  - 'cpu_threads: 1 → 2'"), "{}", record());
    assert_eq!(read_losses(&run).last().unwrap().0, 8.0, "the resumed run went on");
}
