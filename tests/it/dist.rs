//! Data-parallel training (Gloo on this CPU, loopback only): a 2-process run is the 1-process run
//! of the same config (the config's batch is the global batch), a killed 2-process run resumes to
//! the uninterrupted one, and a rank that dies or never arrives ends the others with an error
//! within the timeout instead of a hang.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tch::Tensor;

/// A topology's options (`hacn`, or `compose, depth: {kind: attnres}, …`) as a file name.
fn slug(topology: &str) -> String {
    topology.split(|c: char| !c.is_ascii_alphanumeric()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join("-")
}

fn config(dir: &Path, backbone: &str, topology: &str, steps: u64) -> std::path::PathBuf {
    let data = match backbone {
        "mixer" => {
            "data: {kind: synthetic_images, image_size: 8, channels: 3, classes: 3, samples: 64, batch_size: 8}\n"
        }
        "gpt" => "data: {kind: synthetic_tokens, vocab: 16, seq_len: 6, batch_size: 4}\n",
        other => panic!("no config for {other}"),
    };
    let model = match backbone {
        "mixer" => "model: {kind: mixer, patch: 4, width: 16, token_hidden: 8, channel_hidden: 16, depth: 2}\n",
        _ => "model: {kind: gpt, width: 16, depth: 2, heads: 2}\n",
    };
    let yaml = format!(
        "name: dist-{backbone}-{}\ndevice: cpu\n{model}{data}topology: {{kind: {topology}}}\n\
         train: {{optimizer: adamw, lr: 0.01, steps: {steps}, clip_grad_norm: 1.0, topology_lr_mult: 3.0}}\n\
         log: {{every: 1, eval_every: 10, connectivity_every: 10, checkpoint_every: 10}}\n",
        slug(topology)
    );
    let path = dir.join(format!("{backbone}-{}.yaml", slug(topology)));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn train(args: &[&str], env: &[(&str, &str)], cwd: &Path) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plexus"));
    cmd.arg("train").args(args).arg("--quiet").current_dir(cwd).env("OMP_NUM_THREADS", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run plexus")
}

fn ok(o: &std::process::Output) {
    assert!(o.status.success(), "plexus failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

fn losses(run: &Path) -> Vec<f64> {
    common::read_losses(run).into_iter().map(|(_, l)| l).collect()
}

fn params(run: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(run.join("checkpoints/final.safetensors")).unwrap().into_iter().collect()
}

#[test]
#[ignore = "slow tier: multi-process training"]
fn two_processes_train_what_one_process_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // Two compositions, one per width rule. (AttnRes over mHC on the GPT ends with one unit's
    // `alpha_res` at −6·10⁻⁴, on its way through 0 from its start at 0.01: the parameters' bound
    // below is relative to their value, and there the two runs' 5·10⁻⁷ apart is 10⁻³ of it.)
    let (over_mhc, over_hc) = (
        "compose, depth: {kind: attnres, blocks: 2}, width: {kind: mhc, n: 2}",
        "compose, depth: {kind: denseformer}, width: {kind: hyper, n: 2}",
    );
    for (backbone, topology) in [
        ("mixer", "hacn"),
        ("mixer", "ancre"),
        ("gpt", "hacn"),
        ("gpt", "ancre"),
        ("mixer", over_mhc),
        ("gpt", over_hc),
        ("gpt", "mudd"),
        ("mixer", "mudd"),
    ] {
        let cfg = config(t, backbone, topology, 30);
        let cfg = cfg.to_str().unwrap();
        let (one, two) =
            (t.join(format!("{backbone}-{}-1", slug(topology))), t.join(format!("{backbone}-{}-2", slug(topology))));
        ok(&train(&[cfg, "--out", one.to_str().unwrap()], &[], t));
        ok(&train(&[cfg, "--out", two.to_str().unwrap(), "--nproc", "2"], &[], t));
        // The one-process run again in another valid summation order — libtorch's and MKL's sums
        // on 2 threads (both set: scripts/test.sh pins MKL to 1, which alone would leave the order
        // as it is): how far roundoff alone moves it by each step. The two-process run may be 8
        // times as far (the parity harness's growth factor), and at least 1e-5 relative: a topology
        // whose training amplifies roundoff (MUDD's per-token weights at the topology's 3× learning
        // rate: 2e-5 by step 25, the two-process run at 0.38 of its bound) is judged by its own
        // spread, the others by the floor as before. (`train.accumulation: 2` is no such run: its
        // steps read other batches.)
        let other = t.join(format!("{backbone}-{}-1-threads2", slug(topology)));
        let threads = [("OMP_NUM_THREADS", "2"), ("MKL_NUM_THREADS", "2")];
        ok(&train(&[cfg, "--out", other.to_str().unwrap()], &threads, t));
        let (a, b, c) = (losses(&one), losses(&two), losses(&other));
        assert_eq!(a.len(), 31, "{backbone}/{topology}");
        assert_eq!(a.len(), b.len(), "{backbone}/{topology}");
        let mut spread = 0.0f64;
        for (step, ((x, y), z)) in a.iter().zip(&b).zip(&c).enumerate() {
            spread = spread.max((x - z).abs() / x.abs());
            assert!(
                (x - y).abs() <= (8.0 * spread).max(1e-5) * x.abs(),
                "{backbone}/{topology} step {step}: 1 process {x}, 2 processes {y} (another order of one: {z})"
            );
        }
        let (pa, pb, pc) = (params(&one), params(&two), params(&other));
        assert_eq!(pa.len(), pb.len());
        let mut bad = Vec::new();
        for (name, p) in &pa {
            // Two parameters have an exactly zero true gradient, and AdamW turns the rounding
            // noise of that zero into ±lr steps that differ with any change of summation order:
            // Mixer's token-mixing output bias (a per-token constant added to every channel, which
            // every LayerNorm downstream removes) and the key third of the attention's qkv bias
            // (it adds q·b to every score of a query, which the softmax removes).
            // MUDD's key-port norm's bias likewise: it adds a constant to every key of a head.
            if name.ends_with("token_mix.fc2.bias") || name.ends_with("attn.key_norm.bias") {
                continue;
            }
            let (p, q, r) = if name.ends_with("attn.qkv.bias") {
                let d = p.size()[0] / 3;
                let qv = |t: &Tensor| Tensor::cat(&[t.narrow(0, 0, d), t.narrow(0, 2 * d, d)], 0);
                (qv(p), qv(&pb[name]), qv(&pc[name]))
            } else {
                (p.shallow_clone(), pb[name].shallow_clone(), pc[name].shallow_clone())
            };
            let scale = f64::try_from(p.abs().max()).unwrap().max(1e-3);
            let diff = f64::try_from((&p - &q).abs().max()).unwrap();
            let spread = f64::try_from((&p - &r).abs().max()).unwrap();
            // Losses agree to 1e-5 at every step; after 30 AdamW updates, coordinates with small
            // gradients have amplified the summation-order rounding to a few 1e-5 of their scale
            // (or, as for the losses, to 8 times what another order of one process moves them).
            if diff > (1e-4 * scale).max(8.0 * spread) {
                bad.push(format!("{name}: max |Δ| {diff:e} (scale {scale:e})"));
            }
        }
        assert!(bad.is_empty(), "{backbone}/{topology}: {bad:#?}");
        // Only rank 0 wrote the run directory, and it wrote everything.
        assert!(two.join("connectivity/step_30.csv").is_file() && two.join("summary.json").is_file());
    }
}

#[test]
#[ignore = "slow tier: multi-process training"]
fn a_killed_two_process_run_resumes_to_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cfg = config(t, "mixer", "hacn", 30);
    let cfg = cfg.to_str().unwrap();
    let (full, crashed) = (t.join("full"), t.join("crashed"));
    ok(&train(&[cfg, "--out", full.to_str().unwrap(), "--nproc", "2"], &[], t));
    let o = train(&[cfg, "--out", crashed.to_str().unwrap(), "--nproc", "2"], &[("PLEXUS_CRASH_AFTER", "17")], t);
    assert!(!o.status.success(), "the simulated crash did not happen");
    ok(&train(&["--resume", crashed.to_str().unwrap(), "--nproc", "2"], &[], t));
    let read = |p: &Path| std::fs::read_to_string(p.join("metrics.csv")).unwrap();
    assert_eq!(read(&full), read(&crashed), "resumed 2-process metrics differ from the uninterrupted run");
}

/// Starts one rank by hand, as torchrun would.
fn rank(cfg: &str, out: &Path, rank: usize, port: u16, extra: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plexus"));
    cmd.args(["train", cfg, "--out", out.to_str().unwrap(), "--quiet", "--dist-timeout", "5"])
        .env("WORLD_SIZE", "2")
        .env("RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
#[ignore = "slow tier: multi-process training, waits out a timeout"]
fn a_rank_that_dies_or_never_comes_ends_the_other_with_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cfg = config(t, "mixer", "hacn", 400);
    let cfg = cfg.to_str().unwrap();

    // Rank 1 dies after 5 updates; rank 0 must fail soon after (its next all-reduce).
    let port = free_port();
    let mut r0 = rank(cfg, &t.join("died"), 0, port, &[]);
    let mut r1 = rank(cfg, &t.join("died"), 1, port, &[("PLEXUS_CRASH_AFTER", "5")]);
    let start = Instant::now();
    let s1 = r1.wait().unwrap();
    assert!(!s1.success());
    let s0 = r0.wait().unwrap();
    assert!(!s0.success(), "rank 0 finished although rank 1 died");
    assert!(start.elapsed() < Duration::from_secs(30), "rank 0 took {:?} to notice", start.elapsed());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut r0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("rank 0"), "{err}");

    // Rank 1 never starts: rank 0 gives up after the 5 s timeout, naming the rendezvous.
    let start = Instant::now();
    let mut lone = rank(cfg, &t.join("lone"), 0, free_port(), &[]);
    let s = lone.wait().unwrap();
    let waited = start.elapsed();
    assert!(!s.success());
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(30), "gave up after {waited:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut lone.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("joining the process group"), "{err}");
}

#[test]
fn bad_distributed_settings_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cfg = config(t, "mixer", "hacn", 4);
    let cfg = cfg.to_str().unwrap();
    let err = |o: std::process::Output| {
        assert!(!o.status.success());
        assert_ne!(o.status.code(), Some(101), "panicked");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = err(train(&[cfg, "--out", "x"], &[("WORLD_SIZE", "2"), ("RANK", "2")], t));
    assert!(e.contains("RANK=2"), "{e}");
    let e = err(train(&[cfg, "--out", "x"], &[("WORLD_SIZE", "two"), ("RANK", "0")], t));
    assert!(e.contains("WORLD_SIZE"), "{e}");
    // A global batch of 8 does not split over 3 processes.
    let e = err(train(&[cfg, "--out", "y", "--nproc", "3", "--dist-timeout", "10"], &[], t));
    assert!(e.contains("multiple of 3"), "{e}");
    // Every rank meets it; rank 0 speaks for the group.
    assert_eq!(e.matches("multiple of 3").count(), 1, "printed more than once:\n{e}");
    assert!(!t.join("x").exists() && !t.join("y").exists(), "a failed start left a run directory");
}

/// The pids of the processes whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid …: the fields after the last ')'.
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(parent)
        })
        .collect()
}

/// The steps of the checkpoint markers (`checkpoints/step_<n>.json`) in `run`, ascending.
fn checkpoint_steps(run: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(run.join("checkpoints"))
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("step_")?.strip_suffix(".json")?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// A process that exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Killing the `--nproc` launcher (SIGKILL, or SIGTERM as Slurm's scancel sends) stops its ranks
/// within seconds instead of leaving them training to the end, and the run resumes from its last
/// checkpoint to the end.
#[test]
#[ignore = "slow tier: multi-process training, killed"]
fn killing_the_launcher_stops_its_ranks_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // ~10 s of training on this machine, killed after about 20 steps: ranks left running would
    // outlive the 5 s allowed.
    let cfg = config(t, "mixer", "residual", 1000);
    for signal in ["KILL", "TERM"] {
        let run = t.join(format!("run-{signal}"));
        let mut launcher = Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(["train", cfg.to_str().unwrap(), "--out", run.to_str().unwrap(), "--nproc", "2", "--quiet"])
            .env("OMP_NUM_THREADS", "1")
            .current_dir(t)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(t.join(format!("stderr-{signal}"))).unwrap())
            .spawn()
            .unwrap();
        let stderr = || std::fs::read_to_string(t.join(format!("stderr-{signal}"))).unwrap_or_default();
        // Wait for any checkpoint at step 20 or later, not for `step_20.json` itself: the run
        // keeps the last two, so that one lives only ~20 steps (a fraction of a second on a fast
        // machine) and a poll could miss it.
        let started = Instant::now();
        while checkpoint_steps(&run).last().is_none_or(|&s| s < 20) {
            if let Some(status) = launcher.try_wait().unwrap() {
                panic!("the launcher ended ({status}) before its checkpoint at step 20:\n{}", stderr());
            }
            assert!(started.elapsed() < Duration::from_secs(120), "no checkpoint within 2 minutes:\n{}", stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        let ranks = children_of(launcher.id());
        assert_eq!(ranks.len(), 2, "{ranks:?}");
        let o = Command::new("kill").args([&format!("-{signal}"), &launcher.id().to_string()]).output().unwrap();
        assert!(o.status.success());
        launcher.wait().unwrap();
        let killed = Instant::now();
        while ranks.iter().any(|&p| alive(p)) {
            assert!(killed.elapsed() < Duration::from_secs(5), "SIG{signal}: ranks {ranks:?} still running");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Resumable: the next run continues from the latest checkpoint to the end.
        let latest = plexus::train::checkpoint::latest(&plexus::run_dir::RunDir::new(&run)).unwrap().unwrap();
        assert!(latest.step < 1000, "the run had finished before it was killed");
        ok(&train(&["--resume", run.to_str().unwrap(), "--nproc", "2"], &[], t));
        let steps: Vec<f64> = common::read_losses(&run).into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, (0..=1000).map(f64::from).collect::<Vec<_>>(), "each step once, to the end");
    }
}
