//! Every CLI verb on a corpus of broken inputs (generated here, in a temporary directory): each
//! must end in a clear error or success, never a panic (exit code 101, "panicked" on stderr) or a
//! crash by signal.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tiny valid config (LNN, a few steps).
const TINY: &str = "name: tiny\ndevice: cpu\nmodel: {kind: lnn, depth: 3}\ntopology: {kind: hacn}\n\
data: {kind: whitened_regression, dim: 8, samples: 16, rank: 4}\ntrain: {lr: 0.05, steps: 4}\n\
log: {every: 1, connectivity_every: 2, checkpoint_every: 2}\n";

/// A tiny image config on the data root (set with PLEXUS_DATA).
fn data_config(data: &str) -> String {
    format!(
        "name: d\ndevice: cpu\nmodel: {{kind: mlp, width: 8, depth: 2}}\ntopology: {{kind: residual}}\n\
         data: {data}\ntrain: {{lr: 0.01, steps: 2}}\nlog: {{every: 1}}\n"
    )
}

struct Case {
    args: Vec<String>,
    data_root: Option<PathBuf>,
}

fn case(args: &[&str]) -> Case {
    Case { args: args.iter().map(|s| s.to_string()).collect(), data_root: None }
}

fn write(p: &Path, bytes: impl AsRef<[u8]>) -> PathBuf {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
    p.to_path_buf()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// Broken configs: syntax, structure, types, values, encodings, sizes.
fn broken_configs(dir: &Path) -> Vec<PathBuf> {
    let mut v = vec![
        write(&dir.join("empty.yaml"), ""),
        write(&dir.join("binary.yaml"), [0xff, 0xfe, 0x00, 0x01, 0x80, 0x90]),
        write(&dir.join("list.yaml"), "- 1\n- 2\n"),
        write(&dir.join("scalar.yaml"), "42\n"),
        write(&dir.join("two-docs.yaml"), format!("{TINY}---\n{TINY}")),
        write(&dir.join("deep.yaml"), format!("name: {}{}", "[".repeat(50_000), "]".repeat(50_000))),
        write(&dir.join("tag.yaml"), TINY.replace("lr: 0.05", "lr: !big 0.05")),
        write(&dir.join("unclosed.yaml"), TINY.replace("depth: 3}", "depth: 3")),
        write(&dir.join("tabs.yaml"), TINY.replace("name: tiny", "name:\ttiny\n\tseed: 1")),
    ];
    for (from, to) in [
        ("steps: 4", "steps: 18446744073709551616"),
        ("steps: 4", "steps: -1"),
        ("steps: 4", "steps: 1e400"),
        ("lr: 0.05", "lr: .nan"),
        ("lr: 0.05", "lr: .inf"),
        ("depth: 3", "depth: 0"),
        ("depth: 3", "depth: 99999999999"),
        ("dim: 8", "dim: 0"),
        ("samples: 16", "samples: 0"),
        ("rank: 4", "rank: 100"),
        ("every: 1", "every: 0"),
        ("kind: hacn", "kind: [hacn]"),
        ("kind: hacn", "kind: hacn, init: {kind: normal, mu: .nan}"),
        ("kind: hacn", "kind: hyper, n: 0"),
        ("kind: hacn", "kind: attnres, blocks: 99"),
        ("kind: hacn", "kind: ancre, tau: 0"),
        ("kind: lnn, depth: 3", "kind: mixer, depth: 2"),
        ("kind: lnn, depth: 3", "kind: gpt, depth: 2, width: 3"),
        ("device: cpu", "device: cuda:99"),
        ("device: cpu", "device: tpu"),
        ("name: tiny", "name: ../../etc"),
        ("name: tiny", "name: ''"),
    ] {
        let name = format!("value-{}.yaml", v.len());
        v.push(write(&dir.join(name), TINY.replace(from, to)));
    }
    v
}

/// A data root with broken files for every file-backed dataset, and configs that read them.
fn broken_data(root: &Path, cfgs: &Path) -> Vec<PathBuf> {
    // Fashion-MNIST: header count 0, and a truncated gzip.
    let fm = root.join("fashion-mnist");
    for p in ["train", "t10k"] {
        let mut img = 2051u32.to_be_bytes().to_vec();
        img.extend([0u32, 28, 28].iter().flat_map(|d| d.to_be_bytes()));
        write(&fm.join(format!("{p}-images-idx3-ubyte")), &img);
        let mut lab = 2049u32.to_be_bytes().to_vec();
        lab.extend(0u32.to_be_bytes());
        write(&fm.join(format!("{p}-labels-idx1-ubyte")), &lab);
    }
    write(&root.join("gz/train-images-idx3-ubyte.gz"), [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2]);
    // CIFAR-10 binary: zero-byte batches.
    let cb = root.join("cifar10/cifar-10-batches-bin");
    for f in ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"] {
        write(&cb.join(f), b"");
    }
    write(&cb.join("test_batch.bin"), vec![0u8; 3073]);
    // An image folder whose images are not images.
    for split in ["train", "val"] {
        for class in ["a", "b"] {
            for k in 0..3 {
                write(&root.join(format!("folder/{split}/{class}/{k}.png")), b"not a png");
            }
        }
    }
    // Text: empty, and invalid UTF-8.
    write(&root.join("text/empty.txt"), b"");
    write(&root.join("text/latin1.txt"), [0xe9u8, 0xe8, 0x20, 0xff].repeat(100));
    [
        ("mnist-zero", "{kind: mnist}"),
        ("mnist-gz", "{kind: mnist, dataset: gz}"),
        ("mnist-missing", "{kind: mnist, dataset: nothing-here}"),
        ("cifar-empty", "{kind: cifar10}"),
        ("folder-bad", "{kind: imagefolder, dir: folder, classes: 2, image_size: 8, batch_size: 2, eval_samples: 2}"),
        ("folder-missing", "{kind: imagefolder, dir: nope, classes: 2}"),
        ("text-empty", "{kind: text, file: text/empty.txt}"),
        ("text-latin1", "{kind: text, file: text/latin1.txt}"),
    ]
    .into_iter()
    .map(|(name, data)| {
        let c = data_config(data);
        let c = if data.contains("text") {
            c.replace("{kind: mlp, width: 8, depth: 2}", "{kind: gpt, width: 8, depth: 1, heads: 2}")
        } else {
            c
        };
        write(&cfgs.join(format!("{name}.yaml")), c)
    })
    .collect()
}

/// Damaged copies of a trained run: each file of a run directory truncated, emptied or garbled.
fn broken_runs(good: &Path, dir: &Path) -> Vec<PathBuf> {
    let copy = |name: &str| {
        let to = dir.join(name);
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("cp").args(["-r", &s(good), &s(&to)]).output().unwrap();
        assert!(o.status.success());
        to
    };
    let mut runs = Vec::new();
    let damage: Vec<(&str, &str, &[u8])> = vec![
        ("c-empty", "connectivity/step_4.csv", b""),
        ("c-header", "connectivity/step_4.csv", b"node,0,1,2\n"),
        ("c-ragged", "connectivity/step_4.csv", b"node,0,1,2,3,4\n0,0,1\n1,0\n"),
        ("c-nan", "connectivity/step_4.csv", b"node,0,1\n0,x,1\n1,0,0\n"),
        ("c-one", "connectivity/step_4.csv", b"node,0\n0,1\n"),
        ("metrics-empty", "metrics.csv", b""),
        ("metrics-garbage", "metrics.csv", b"step,loss\n1,abc\n,\n"),
        ("metrics-header", "metrics.csv", b"step,epoch,loss,lr,grad_norm,gamma\n"),
        ("eval-garbage", "eval.csv", b"step,loss\nx,y\n"),
        ("config-garbage", "config.yaml", b"\x00\x01\x02"),
        ("config-other-width", "config.yaml", b"name: tiny\ndevice: cpu\nmodel: {kind: lnn, depth: 3}\ntopology: {kind: hacn}\ndata: {kind: whitened_regression, dim: 12, samples: 16, rank: 4}\n"),
        ("final-empty", "checkpoints/final.safetensors", b""),
        ("final-garbage", "checkpoints/final.safetensors", b"\xff\xff\xff\xff\xff\xff\xff\x7f{}"),
        ("marker-garbage", "checkpoints/step_4.json", b"{not json"),
        ("ckpt-truncated", "checkpoints/step_4.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}"),
        ("params-garbage", "params/a_step_4.csv", b"node,0\n0,zz\n"),
        ("summary-garbage", "summary.json", b"[1,2"),
        // TensorBoard's files: a garbled event file where `plexus analyze` replaces its own.
        ("tb-garbage", "tensorboard/events.out.tfevents.analysis.plexus", b"\x10\x00\x00garbage"),
    ];
    for (name, file, bytes) in damage {
        let r = copy(name);
        write(&r.join(file), bytes);
        runs.push(r);
    }
    let r = copy("no-connectivity");
    std::fs::remove_dir_all(r.join("connectivity")).unwrap();
    runs.push(r);
    let r = copy("no-checkpoints");
    std::fs::remove_dir_all(r.join("checkpoints")).unwrap();
    runs.push(r);
    // A file where the run's TensorBoard folder should be.
    let r = copy("tb-is-a-file");
    let _ = std::fs::remove_dir_all(r.join("tensorboard"));
    write(&r.join("tensorboard"), b"not a folder");
    runs.push(r);
    runs
}

/// Whether a case needs a `plexus` process of its own rather than a call inside this test binary:
/// a data root of its own (an environment variable, one per process), a verb or flag that starts
/// processes from the binary it runs in (`sweep`, `--nproc`) or changes libtorch's process-wide
/// thread count (`--threads`, `parity`), `demo` and `doctor` (whole programs), and an output path
/// relative to the working directory (this binary's is the repository).
fn needs_own_process(c: &Case) -> bool {
    let verb = c.args.first().map(String::as_str).unwrap_or("");
    c.data_root.is_some()
        || matches!(verb, "sweep" | "demo" | "doctor" | "parity")
        || c.args.iter().any(|a| a == "--nproc" || a == "--threads")
        || c.args.windows(2).any(|w| w[0] == "--out" && Path::new(&w[1]).is_relative())
}

fn run_case(c: &Case, cwd: &Path) -> Option<String> {
    if !needs_own_process(c) {
        return run_case_in_process(c);
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plexus"));
    cmd.args(&c.args).current_dir(cwd);
    if let Some(root) = &c.data_root {
        cmd.env("PLEXUS_DATA", root);
    }
    let o = cmd.output().expect("run plexus");
    let err = String::from_utf8_lossy(&o.stderr);
    let bad = o.status.code() == Some(101) || o.status.code().is_none() || err.contains("panicked");
    bad.then(|| {
        format!(
            "plexus {}\n  → {:?}\n{}",
            c.args.join(" "),
            o.status,
            err.lines().take(6).collect::<Vec<_>>().join("\n")
        )
    })
}

/// The case as `main` runs it — the arguments parsed by the CLI, then `plexus::cli::run` — inside
/// this process, a panic caught: what a `plexus` process would exit 101 on. Most of a process's
/// time here is libtorch's start-up (~0.7 s), paid once instead of hundreds of times. A crash by
/// signal ends this test binary, which fails the test as the process's death would.
fn run_case_in_process(c: &Case) -> Option<String> {
    let args = std::iter::once("plexus".to_string()).chain(c.args.iter().cloned());
    let outcome = std::panic::catch_unwind(|| match <plexus::cli::Cli as clap::Parser>::try_parse_from(args) {
        Ok(cli) => plexus::cli::run(cli).map_err(|e| format!("{e:#}")),
        Err(e) => Err(e.to_string()),
    });
    outcome.err().map(|payload| {
        let text = plexus::torch_panic::payload_text(payload.as_ref()).unwrap_or("(a panic without text)");
        format!(
            "plexus {}\n  → panicked (in process)\n{}",
            c.args.join(" "),
            text.lines().take(6).collect::<Vec<_>>().join("\n")
        )
    })
}

/// Every panic in this test binary since [`record_panics`]: thread, text and place (the test's
/// check leaves out those of other tests' threads). A case run in
/// this process may panic on a thread of its own (a data prefetcher, a writer), where no
/// `catch_unwind` of the caller sees it; a process would have said "panicked" on stderr.
static PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn record_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = plexus::torch_panic::payload_text(info.payload()).unwrap_or("(no text)");
            let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
            let place = info.location().map(|l| l.to_string()).unwrap_or_default();
            PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(format!("thread {thread} at {place}: {text}"));
            previous(info);
        }));
    });
}

/// Runs every case (two at a time) and fails listing those that panicked or crashed.
fn run_all(cases: &[Case], cwd: &Path) {
    record_panics();
    let (a, b) = cases.split_at(cases.len() / 2);
    let failures: Vec<String> = std::thread::scope(|sc| {
        let h = sc.spawn(|| a.iter().filter_map(|c| run_case(c, cwd)).collect::<Vec<_>>());
        let mut f: Vec<String> = b.iter().filter_map(|c| run_case(c, cwd)).collect();
        f.extend(h.join().unwrap());
        f
    });
    let own = cases.iter().filter(|c| needs_own_process(c)).count();
    eprintln!("{} cases: {} in this process, {own} in processes of their own", cases.len(), cases.len() - own);
    // This binary runs every integration test: a panic on another test's thread (libtest names it
    // `module::test`) is that test's, not a case's.
    let me = std::thread::current().name().unwrap_or_default().to_string();
    let other_test = |p: &String| {
        let thread = p.strip_prefix("thread ").and_then(|t| t.split(" at ").next()).unwrap_or_default();
        thread.contains("::") && thread != me
    };
    let panics: Vec<String> =
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|p| !other_test(p)).cloned().collect();
    assert!(panics.is_empty(), "panics in this process (a case's own thread, or a case below):\n{}", panics.join("\n"));
    assert!(
        failures.is_empty(),
        "{} of {} invocations panicked or crashed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
#[ignore = "slow tier: the broken-input corpus, every verb"]
fn no_verb_panics_on_broken_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let tiny = write(&t.join("tiny.yaml"), TINY);
    let good = t.join("good");
    let o = plexus(&["train", &s(&tiny), "--out", &s(&good)], t);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = plexus(&["analyze", &s(&good), "--repeats", "1"], t);
    assert!(o.status.success(), "{:?}", text(&o));

    let mut cases = vec![case(&["doctor"]), case(&["list"])];
    // Every broken config through `train`; through `bench` and `connectivity` (which load
    // configs the same way) every third one.
    for (i, cfg) in broken_configs(&t.join("configs")).into_iter().enumerate() {
        let c = s(&cfg);
        let out = s(&t.join("out").join(cfg.file_stem().unwrap()));
        cases.push(case(&["train", &c, "--out", &out]));
        if i % 3 == 0 {
            cases.push(case(&["bench", &c, "--steps", "1", "--warmup", "0"]));
            cases.push(case(&["connectivity", &c]));
        }
    }
    let data_root = t.join("data");
    for cfg in broken_data(&data_root, &t.join("data-configs")) {
        let c = s(&cfg);
        let out = s(&t.join("out").join(cfg.file_stem().unwrap()));
        for args in [
            vec!["train", &c, "--out", &out],
            vec!["bench", &c, "--steps", "1", "--warmup", "0"],
            vec!["connectivity", &c],
        ] {
            let mut k = case(&args);
            k.data_root = Some(data_root.clone());
            cases.push(k);
        }
    }
    for run in broken_runs(&good, &t.join("runs")) {
        let r = s(&run);
        cases.push(case(&["plot", &r]));
        cases.push(case(&["plot", &r, "--step", "2"]));
        cases.push(case(&["analyze", &r, "--repeats", "1", "--sigmas", "0,1", "--probs", "0"]));
        cases.push(case(&["connectivity", &r]));
        cases.push(case(&["train", "--resume", &r, "--set", "train.steps=6"]));
    }
    let g = s(&good);
    let tiny_s = s(&tiny);
    for args in [
        vec!["analyze", &g, "--sigmas", "nan"],
        vec!["analyze", &g, "--sigmas", "inf"],
        vec!["analyze", &g, "--sigmas", "-1"],
        vec!["analyze", &g, "--probs", "2"],
        vec!["analyze", &g, "--repeats", "0"],
        vec!["analyze", &g, "--correlate"],
        vec!["analyze", "nonexistent"],
        vec!["plot", &g, "--step", "999"],
        vec!["plot", "nonexistent"],
        vec!["plot", &g, "--out", "/dev/null/x"],
        vec!["bench", &tiny_s, "--steps", "0"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--csv", "/dev/null/x"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--compare", "nope,residual"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--compare", "residual"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--depths", "0"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--depths", "2", "--topologies", "x+y"],
        vec!["bench", &tiny_s, "--steps", "1", "--warmup", "0", "--depths", "2", "--out", "/dev/null/x"],
        vec!["bench", "nonexistent.yaml"],
        vec!["connectivity", &tiny_s, "--step", "1"],
        vec!["connectivity", &g, "--step", "999"],
        vec!["connectivity", "nonexistent"],
        vec!["train", &tiny_s, "--out", "/dev/null/x"],
        vec!["train", &tiny_s, "--out", &g],
        vec!["train", "--resume", "nonexistent"],
        vec!["train", "--resume", &g, "--set", "topology.kind=plain"],
        vec!["train", "--resume", &g, "--set", "garbage"],
        vec!["train", &tiny_s, "--set", "=", "--out", "x"],
        vec!["train", &tiny_s, "--set", "a..b=1", "--out", "x"],
        vec!["train", &tiny_s, "--set", "name.x=1", "--out", "x"],
        vec!["demo", "--figure", "nope"],
        vec!["parity", "--dir", "nonexistent"],
        vec!["parity", "--only", "no-such-case"],
    ] {
        cases.push(case(&args));
    }
    run_all(&cases, t);
}

/// An undecodable training image in an image folder: without `skip_bad` the run stops with a
/// clear error naming the file (exit 1, not a panic); with `skip_bad: true` it is skipped, with a
/// count, and training completes.
#[test]
fn an_undecodable_training_image_is_an_error_or_skipped_with_a_count() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("data");
    for split in ["train", "val"] {
        for (c, class) in ["a", "b"].iter().enumerate() {
            for k in 0..4u8 {
                let p = root.join(format!("folder/{split}/{class}/{k}.png"));
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                image::RgbImage::from_pixel(10, 10, image::Rgb([40 * c as u8, 10 * k, 99])).save(&p).unwrap();
            }
        }
    }
    let bad = root.join("folder/train/b/2.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\n truncated").unwrap();
    let cfg = write(
        &tmp.path().join("f.yaml"),
        "name: f\ndevice: cpu\nmodel: {kind: mlp, width: 8, depth: 2}\ntopology: {kind: residual}\n\
         data: {kind: imagefolder, dir: folder, classes: 2, image_size: 8, batch_size: 4, eval_samples: 4, workers: 1}\n\
         train: {lr: 0.01, steps: 6}\nlog: {every: 1}\n",
    );
    let train = |extra: &[&str]| {
        let mut args = vec!["train".to_string(), s(&cfg), "--out".into(), s(&tmp.path().join("run"))];
        args.extend(extra.iter().map(|a| a.to_string()));
        Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(&args)
            .env("PLEXUS_DATA", &root)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let o = train(&[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(&s(&bad)) && err.contains("skip_bad"), "{err}");
    let o = train(&["--overwrite", "--set", "data.skip_bad=true"]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("skipping an undecodable training image (1 so far)") && err.contains(&s(&bad)), "{err}");
    assert_eq!(err.matches("skipping an undecodable").count(), 1, "reported once: {err}");
    assert_eq!(read_losses(&tmp.path().join("run")).last().unwrap().0, 6.0);
    // A corrupt evaluation image is named as one (skip_bad does not apply to it).
    // (Every one: data.eval_samples picks 4 of the 8.)
    for class in ["a", "b"] {
        for k in 0..4 {
            std::fs::write(root.join(format!("folder/val/{class}/{k}.png")), b"\x89PNG\r\n\x1a\n truncated").unwrap();
        }
    }
    let bad_val = root.join("folder/val/");
    let o = train(&["--overwrite", "--set", "data.skip_bad=true"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&s(&bad_val)) && err.contains("bad evaluation image") && !err.contains("bad training image"),
        "{err}"
    );
}

/// A tiny DiT (diffusion) config.
const TINY_DIT: &str = "name: dit\nseed: 3\ndevice: cpu\nmodel: {kind: dit, patch: 2, width: 16, depth: 2, heads: 2}\n\
topology: {kind: residual}\n\
data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 4, samples: 32, batch_size: 8}\n\
train: {optimizer: adamw, lr: 3.0e-3, steps: 4}\nlog: {every: 1, checkpoint_every: 2}\n";

/// A tiny classifier on the same images (the `fd` feature extractor).
const TINY_CLS: &str = "name: cls\ndevice: cpu\n\
model: {kind: mixer, patch: 4, width: 8, token_hidden: 8, channel_hidden: 8, depth: 1}\ntopology: {kind: residual}\n\
data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 4, samples: 32, batch_size: 8}\n\
train: {optimizer: adamw, lr: 1.0e-3, steps: 4}\n";

/// A tiny `plexus rl` config (two rollouts, a checkpoint after each).
const TINY_RL: &str = "name: rl\nseed: 1\ndevice: cpu\nenv: {layout: u, num_envs: 8, episode_length: 20}\n\
network: {width: 16, depth: 4, block_size: 4, repr_dim: 8, topology: {kind: residual}}\n\
train: {env_steps: 320, batch_size: 32, updates_per_rollout: 2, replay_episodes: 64}\n\
log: {eval_every: 160, eval_envs: 8, checkpoint_every: 160}\n";

/// `copy` of the run `good` into `dir/name`, with `file` replaced by `bytes` (or removed if `None`).
fn damaged(good: &Path, dir: &Path, name: &str, file: &str, bytes: Option<&[u8]>) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(dir).unwrap();
    let o = Command::new("cp").args(["-r", &s(good), &s(&to)]).output().unwrap();
    assert!(o.status.success());
    match bytes {
        Some(b) => {
            write(&to.join(file), b);
        }
        None => {
            let p = to.join(file);
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    to
}

/// The verbs the first corpus did not reach: `sample`, `fd`, `rl` (configs, flags, damaged runs
/// and resumes), `tokenize` and `--nproc`. Each ends in a clear error or success, never a panic or
/// a signal.
#[test]
#[ignore = "slow tier: the broken-input corpus of sample, fd, rl, tokenize and --nproc"]
fn sample_fd_rl_tokenize_and_nproc_never_panic_on_broken_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let trained = |verb: &str, yaml: &str, name: &str| -> PathBuf {
        let cfg = write(&t.join(format!("{name}.yaml")), yaml);
        let out = t.join(name);
        let o = plexus(&[verb, &s(&cfg), "--out", &s(&out), "--quiet"], t);
        assert!(o.status.success(), "{:?}", text(&o));
        out
    };
    let (dit, cls, rl) =
        (trained("train", TINY_DIT, "dit"), trained("train", TINY_CLS, "cls"), trained("rl", TINY_RL, "rl"));
    let lnn = trained("train", TINY, "lnn");
    let (d, c, r, l) = (s(&dit), s(&cls), s(&rl), s(&lnn));
    let mut cases: Vec<Case> = Vec::new();
    let mut add = |args: &[&str]| cases.push(case(args));

    // sample: flags, the wrong kind of run, damaged runs.
    for flags in [
        &["--per-class", "0"][..],
        &["--per-class", "1000000", "--steps", "1"],
        &["--per-class", "-3"],
        &["--steps", "0"],
        &["--steps", "5000"],
        &["--cfg", "nan"],
        &["--cfg", "inf"],
        &["--cfg", "-1"],
        &["--cfg", "1e30"],
        &["--weights", "ema"],
        &["--weights", "best"],
        &["--sampler", "euler"],
        &["--device", "cuda:9"],
        &["--device", "tpu"],
        &["--seed", "-1"],
    ] {
        add(&[&["sample", d.as_str()][..], flags].concat());
    }
    for run in [l.as_str(), c.as_str(), "nonexistent", "/dev/null"] {
        add(&["sample", run, "--steps", "2"]);
    }
    let runs = t.join("damaged");
    let mut dit_damaged = Vec::new();
    for (name, file, bytes) in [
        ("final-empty", "checkpoints/final.safetensors", Some(&b""[..])),
        ("final-garbage", "checkpoints/final.safetensors", Some(&b"\xff\xff\xff\xff\xff\xff\xff\x7f{}"[..])),
        ("final-missing", "checkpoints/final.safetensors", None),
        ("manifest-garbage", "checkpoints/weights.json", Some(&b"{\"final.safetensors\": 3"[..])),
        ("config-garbage", "config.yaml", Some(&b"\x00\x01"[..])),
        ("config-classifier", "config.yaml", Some(TINY_CLS.as_bytes())),
        ("figures-file", "figures", None),
    ] {
        dit_damaged.push(damaged(&dit, &runs, name, file, bytes));
    }
    write(&runs.join("figures-file/figures"), b"a file where the figures folder was");
    for run in &dit_damaged {
        add(&["sample", &s(run), "--steps", "2", "--per-class", "1"]);
        add(&["fd", &s(run), "--extractor", &c, "--samples", "4", "--steps", "2"]);
    }

    // fd: extractors of the wrong kind or shape, sample counts, damaged extractors.
    for args in [
        &["--extractor", d.as_str()][..],
        &["--extractor", l.as_str()],
        &["--extractor", "nonexistent"],
        &["--extractor", c.as_str(), "--samples", "0"],
        &["--extractor", c.as_str(), "--samples", "1"],
        &["--extractor", c.as_str(), "--samples", "1000000000"],
        &["--extractor", c.as_str(), "--samples", "4", "--steps", "0"],
        &["--extractor", c.as_str(), "--samples", "4", "--cfg", "nan"],
    ] {
        add(&[&["fd", d.as_str()][..], args].concat());
    }
    add(&["fd", &c, "--extractor", &c, "--samples", "4"]);
    let cls_damaged = damaged(&cls, &runs, "cls-final-garbage", "checkpoints/final.safetensors", Some(b"\x00"));
    add(&["fd", &d, "--extractor", &s(&cls_damaged), "--samples", "4", "--steps", "2"]);

    // rl: broken configs.
    let rl_cfgs = t.join("rl-configs");
    for (i, (from, to)) in [
        ("env_steps: 320", "env_steps: 0"),
        ("env_steps: 320", "env_steps: 18446744073709551616"),
        ("num_envs: 8", "num_envs: 0"),
        ("num_envs: 8", "num_envs: 99999999"),
        ("episode_length: 20", "episode_length: 1"),
        ("replay_episodes: 64", "replay_episodes: 1000000000000"),
        ("replay_episodes: 64", "replay_episodes: 1"),
        ("updates_per_rollout: 2", "updates_per_rollout: 2, prefill_env_steps: 100000000000"),
        ("updates_per_rollout: 2", "updates_per_rollout: 2, lr: .nan"),
        ("updates_per_rollout: 2", "updates_per_rollout: 2, lr: 1e10"),
        ("updates_per_rollout: 2", "updates_per_rollout: 0"),
        ("depth: 4", "depth: 0"),
        ("block_size: 4", "block_size: 3"),
        ("kind: residual", "kind: resnet"),
        ("layout: u", "layout: maze"),
        ("device: cpu", "device: cuda:99"),
        ("name: rl", "name: ../../x"),
        ("eval_envs: 8", "eval_envs: 0"),
        ("seed: 1", "seed: -1"),
        ("train:", "trian:"),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = write(&rl_cfgs.join(format!("rl-{i}.yaml")), TINY_RL.replace(from, to));
        add(&["rl", &s(&cfg), "--out", &s(&t.join(format!("rl-out-{i}"))), "--quiet"]);
    }
    add(&["rl", &s(&t.join("tiny.yaml")), "--out", &s(&t.join("rl-from-train"))]);
    add(&["rl", "nonexistent.yaml"]);
    add(&["rl", &r, "--plot", "--out", "/dev/null/x"]);
    add(&["rl", "nonexistent", "--plot"]);
    // rl: damaged runs, resumed and plotted.
    for (name, file, bytes) in [
        (
            "rl-replay-garbage",
            "checkpoints/step_320.replay.safetensors",
            Some(&b"\x08\x00\x00\x00\x00\x00\x00\x00{}"[..]),
        ),
        ("rl-loop-garbage", "checkpoints/step_320.rl.json", Some(&b"{\"env_steps\": "[..])),
        ("rl-loop-missing", "checkpoints/step_320.rl.json", None),
        ("rl-marker-garbage", "checkpoints/step_320.json", Some(&b"[1"[..])),
        ("rl-model-truncated", "checkpoints/step_320.safetensors", Some(&b"\x08\x00"[..])),
        ("rl-config-garbage", "config.yaml", Some(&b"\xff\xfe"[..])),
        ("rl-config-train", "config.yaml", Some(TINY.as_bytes())),
        ("rl-metrics-garbage", "metrics.csv", Some(&b"env_steps,success\nx,y\n,\n"[..])),
        ("rl-no-checkpoints", "checkpoints", None),
    ] {
        let run = s(&damaged(&rl, &runs, name, file, bytes));
        add(&["rl", "--resume", &run, "--set", "train.env_steps=480", "--quiet"]);
        add(&["rl", &run, "--plot"]);
    }
    for ov in ["train.env_steps=160", "network.width=32", "garbage", "train.env_steps=1e99"] {
        add(&["rl", "--resume", &r, "--set", ov]);
    }

    // tokenize: inputs that are not text files, flags out of range, outputs that cannot be written.
    let text_file = write(&t.join("text/a.txt"), "some text\n".repeat(50));
    let empty = write(&t.join("text/empty.txt"), "");
    let binary = write(&t.join("text/binary.bin"), [0xffu8, 0xfe, 0x00, 0x80].repeat(64));
    let a = s(&text_file);
    let tok = s(&t.join("tok"));
    for args in [
        vec!["tokenize", &s(&empty), "--out", &tok, "--encoding", "char"],
        vec!["tokenize", &s(&empty), "--out", &tok],
        vec!["tokenize", &s(&binary), "--out", &tok],
        vec!["tokenize", &s(&t.join("text")), "--out", &tok],
        vec!["tokenize", "nonexistent.txt", "--out", &tok],
        vec!["tokenize", "/dev/null", "--out", &tok],
        vec!["tokenize", &a, "--out", &tok, "--val-fraction", "1"],
        vec!["tokenize", &a, "--out", &tok, "--val-fraction", "nan"],
        vec!["tokenize", &a, "--out", &tok, "--val-fraction", "-0.5"],
        vec!["tokenize", &a, "--out", &tok, "--threads", "0"],
        vec!["tokenize", &a, "--out", &tok, "--encoding", "bpe"],
        vec!["tokenize", &a, "--out", &a],
        vec!["tokenize", &a, "--out", "/dev/null/x"],
    ] {
        add(&args);
    }

    // --nproc: too many, a batch that does not split, broken configs and runs under the launcher.
    let tiny = s(&t.join("tiny.yaml"));
    let broken = s(&write(&t.join("broken.yaml"), TINY.replace("depth: 3", "depth: 0")));
    for args in [
        vec!["train", tiny.as_str(), "--nproc", "65535", "--out", "n1"],
        vec!["train", tiny.as_str(), "--nproc", "0", "--out", "n2"],
        vec!["train", tiny.as_str(), "--nproc", "3", "--out", "n3", "--dist-timeout", "20"],
        vec!["train", broken.as_str(), "--nproc", "2", "--out", "n4", "--dist-timeout", "20"],
        vec!["train", "nonexistent.yaml", "--nproc", "2", "--out", "n5", "--dist-timeout", "20"],
        vec!["train", "--resume", "nonexistent", "--nproc", "2", "--dist-timeout", "20"],
        vec!["train", "--resume", l.as_str(), "--nproc", "2", "--set", "model.depth=4", "--dist-timeout", "20"],
        vec!["bench", tiny.as_str(), "--nproc", "65535"],
        vec!["bench", broken.as_str(), "--nproc", "2", "--steps", "1", "--warmup", "0", "--dist-timeout", "20"],
    ] {
        add(&args);
    }

    run_all(&cases, t);
}

/// Files that never end (`/dev/zero`, `/dev/urandom`), FIFOs, empty and list-shaped specs: every
/// verb that reads a config or spec refuses them at once with the file and what is wrong (the
/// reads were unbounded in `plexus rl` and `plexus sweep`: gigabytes in seconds).
#[test]
fn endless_files_fifos_and_shapeless_specs_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let tiny = s(&write(&t.join("tiny.yaml"), TINY));
    let spec = s(&write(&t.join("spec.yaml"), "configs: [/dev/zero]\n"));
    let empty = s(&write(&t.join("empty.yaml"), ""));
    let list = s(&write(&t.join("list.yaml"), "- a\n- b\n"));
    let fifo = t.join("fifo.yaml");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = s(&fifo);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["rl", "/dev/zero"], "/dev/zero is a character device"),
        (vec!["rl", &fifo], "fifo.yaml is a FIFO"),
        (vec!["train", "/dev/urandom"], "/dev/urandom is a character device"),
        (vec!["train", &fifo], "fifo.yaml is a FIFO"),
        (vec!["sweep", "/dev/zero", "--dry-run", "--out", "o"], "/dev/zero is a character device"),
        (vec!["sweep", &tiny, "/dev/urandom", "--out", "o"], "/dev/urandom is a character device"),
        (vec!["sweep", &spec, "--out", "o", "--dry-run"], "the config /dev/zero"),
        (vec!["sweep", &fifo, "--out", "o"], "fifo.yaml is a FIFO"),
        (vec!["sweep", &empty, "--out", "o"], "empty.yaml: the file is empty; expected a sweep spec"),
        (vec!["sweep", &list, "--out", "o"], "list.yaml: the file holds a list; expected a sweep spec"),
    ];
    for (args, says) in cases {
        let start = std::time::Instant::now();
        let o = plexus(&args, t);
        let (_, err) = text(&o);
        assert!(
            matches!(o.status.code(), Some(1) | Some(2)) && err.contains(says),
            "plexus {args:?}: {:?}\n{err}",
            o.status
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "plexus {args:?} took {:?}", start.elapsed());
    }
}

/// Inputs that were accepted without a word, or refused with an error that blamed the wrong thing:
/// each now has an error naming the file, key or flag and what is allowed, or a warning.
#[test]
fn surprising_inputs_get_errors_that_name_them_or_warnings() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let tiny = s(&write(&t.join("tiny.yaml"), TINY));
    let says = |args: &[&str], ok: bool, what: &str| {
        let o = plexus(args, t);
        let (out, err) = text(&o);
        assert!(o.status.success() == ok && err.contains(what), "plexus {args:?}: {:?}\n{out}\n{err}", o.status);
    };
    let big = s(&write(&t.join("bigseed.yaml"), format!("configs: [{tiny}]\nseeds: [18446744073709551616]\n")));
    says(&["sweep", &big, "--out", "o", "--dry-run"], false, "`seeds[0]` has value `18446744073709551616`");
    says(&["sweep", &tiny, "--set", "seed=5", "--out", "o", "--dry-run"], false, "by --seeds (e.g. --seeds 5)");
    // A --set that is not an override is refused where it is read, the command line, before any
    // config is opened: the flag, the text and what an override is.
    let not_set =
        "invalid value 'model.depth' for '--set <KEY=VALUE>': allowed: an override of the form key.path=value";
    says(&["train", &tiny, "--set", "model.depth", "--out", "x"], false, not_set);
    says(&["sweep", &tiny, "--set", "a..b=1", "--out", "o", "--dry-run"], false, "`a..b`: allowed: a dotted key path");

    says(&["sweep", &tiny, "--seeds", "0,1", "--out", "sw", "--quiet"], true, "");
    says(&["report", "sw", "--curves", "frob"], false, "--curves frob: no run logs this curve; ");
    says(&["report", "sw", "--by", "seed"], true, "report: replacing sw/report/report.md");
    std::fs::create_dir_all(t.join("cfg-only")).unwrap();
    std::fs::copy(t.join("sw/tiny-seed=0/config.yaml"), t.join("cfg-only/config.yaml")).unwrap();
    says(&["plot", "cfg-only"], false, "nothing to plot in cfg-only");

    let o =
        plexus(&["train", &tiny, "--out", "hacn", "--set", "topology.init={kind: normal, mu: 0.5, sigma: 0.01}"], t);
    assert!(o.status.success(), "{:?}", text(&o));
    says(
        &["train", "--resume", "hacn", "--set", "topology.kind=residual"],
        false,
        "`topology.kind` is `hacn` in the run but `residual` here",
    );

    let words = s(&write(&t.join("words.txt"), "a few words\n"));
    says(&["tokenize", &words, &words, "--out", "tk"], false, "is given twice (also as");
    says(&["tokenize", &words, "--out", "tk", "--encoding", "char"], true, "val.bin holds no tokens");

    // Numbers past what a type holds are refused with the option's own range, shown as written.
    let graph = s(&write(
        &t.join("graph.yaml"),
        TINY.replace("{kind: hacn}", "{kind: graph, pattern: {blocks: 99999999999999999999}}"),
    ));
    says(
        &["train", &graph, "--out", "g"],
        false,
        "`topology.pattern.blocks` has value `99999999999999999999`: an integer in 1..=3",
    );
    says(
        &[
            "train",
            &tiny,
            "--out",
            "g",
            "--set",
            "topology.kind=graph",
            "--set",
            "topology.pattern.blocks=99999999999999999999",
        ],
        false,
        "an integer in 1..=3",
    );
    says(
        &["train", &tiny, "--out", "g", "--set", "train.steps=99999999999999999999"],
        false,
        "has value `99999999999999999999`: an integer from 0 to 18446744073709551615",
    );
    says(
        &["train", &tiny, "--out", "g", "--set", "train.lr=1e400"],
        false,
        "a finite number (`1e400` is past the range of a 64-bit float",
    );
    let long = format!("train.steps={}", "9".repeat(300));
    let o = plexus(&["train", &tiny, "--out", "g", "--set", &long], t);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.len() < 400 && !err.contains(&"9".repeat(100)),
        "a 300-digit value echoed: {err}"
    );
    // bench --csv: a folder is refused in words that say rows are appended; a temporary name
    // plexus tried is never shown.
    std::fs::create_dir_all(t.join("csvdir")).unwrap();
    says(
        &["bench", &tiny, "--steps", "1", "--warmup", "0", "--csv", "csvdir"],
        false,
        "the CSV rows are appended to must be",
    );
    let o = plexus(&["bench", &tiny, "--steps", "1", "--warmup", "0", "--csv", "/proc/plexus-x.csv"], t);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("/proc/plexus-x.csv") && !err.contains(".tmp-"), "{err}");
    // A curve value that is not finite (a damaged fd_steps.csv) is an error naming file, row and
    // column, not a group of one with an empty mean.
    let fd = t.join("fd-run");
    std::fs::create_dir_all(&fd).unwrap();
    std::fs::write(fd.join("config.yaml"), "name: fd-run\nseed: 0\n").unwrap();
    std::fs::write(fd.join("summary.json"), r#"{"final_loss": 1.0}"#).unwrap();
    std::fs::write(
        fd.join("fd_steps.csv"),
        "step,fd,real_floor,class_agreement,extractor_accuracy,samples,sampling,extractor\n2,NaN,,0.5,0.9,8,ddim,c\n",
    )
    .unwrap();
    says(
        &["report", "fd-run", "--metric", "fd.fd@2", "--format", "csv"],
        false,
        "fd_steps.csv: row 2, column `fd`: `NaN` is not a finite number",
    );
}

/// Where a dataset is looked for: `data.root` (the file or `--set`) wins over `PLEXUS_DATA`, which
/// wins over the default root that `scripts/fetch-data.sh` fills; the not-found error names the
/// folder looked in and both ways to point elsewhere.
#[test]
fn data_root_comes_from_the_config_then_the_environment_then_the_default_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cfg = s(&write(&t.join("d.yaml"), data_config("{kind: mnist}")));
    let run = |set: Option<&str>, env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_plexus"));
        cmd.args(["train", &cfg, "--out", "o", "--overwrite"]).current_dir(t).env("HOME", t).env_remove("PLEXUS_CACHE");
        if let Some(s) = set {
            cmd.args(["--set", s]);
        }
        match env {
            Some(v) => cmd.env("PLEXUS_DATA", v),
            None => cmd.env_remove("PLEXUS_DATA"),
        };
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
        text(&o).1
    };
    let e = run(Some("data.root=/from-set"), Some("/from-env"));
    assert!(e.contains("/from-set/fashion-mnist/") && !e.contains("/from-env"), "{e}");
    let e = run(None, Some("/from-env"));
    assert!(e.contains("/from-env/fashion-mnist/"), "{e}");
    let e = run(None, None);
    let default = t.join(".cache/plexus/data/root");
    assert!(e.contains(&format!("{}/fashion-mnist/", default.display())), "{e}");
    assert!(e.contains("export PLEXUS_DATA=/path/to/folder") && e.contains("--set data.root=/path/to/folder"), "{e}");
}
