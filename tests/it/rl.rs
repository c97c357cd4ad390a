//! Goal-conditioned contrastive RL (`plexus rl`, `src/rl/`): the maze's dynamics, the InfoNCE loss
//! against its PyTorch reference, the encoders under every topology, the config checks, and a
//! short training run that must beat the random policy on the same evaluation tasks.

use crate::common;

use plexus::rl::config::{InfoNce, RlExperiment};
use plexus::rl::crl::{infonce, normals, Agent};
use plexus::rl::env::{EnvSpec, Layout, VecEnv};
use plexus::rl::replay::Replay;
use plexus::rl::trainer::{self, eval_seeds, random_policy, RlOptions};
use plexus::rl::RlRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use tch::{Kind, Tensor};

fn spec(layout: Layout) -> EnvSpec {
    EnvSpec { layout, max_step: 0.1, goal_radius: 0.05, episode_length: 30 }
}

fn random_actions(rng: &mut RlRng, n: usize) -> Vec<f32> {
    (0..2 * n).map(|_| rng.gen_range(-1.5f32..=1.5)).collect()
}

#[test]
fn walls_block_every_move_of_random_walks() {
    let mut env = VecEnv::new(spec(Layout::U), &VecEnv::seeds(3, 64));
    let walls = Layout::U.walls();
    let mut rng = RlRng::seed_from_u64(0);
    for _ in 0..300 {
        let before = env.obs().to_vec();
        let out = env.step(&random_actions(&mut rng, 64));
        for i in 0..64 {
            let (x, y) = (out.obs[2 * i], out.obs[2 * i + 1]);
            assert!(env.is_free(x, y), "env {i} entered a wall or left the arena at ({x}, {y})");
            // A move never crosses the wall: from below it (y ≤ 0.4) inside its x range, the point
            // cannot end above it (y ≥ 0.6), nor the other way round.
            let (y0, x1) = (before[2 * i + 1], out.obs[2 * i]);
            if x1 < walls[0].x1 && !out.done {
                let crossed = (y0 <= 0.4 && y >= 0.6) || (y0 >= 0.6 && y <= 0.4);
                assert!(!crossed, "env {i} jumped the wall");
            }
        }
    }
    // Pushing straight up from under the wall ends on its lower face and stays there.
    env.set_state(&[0.3, 0.2].repeat(64), &[0.3, 0.8].repeat(64));
    for _ in 0..10 {
        env.step(&[0.0, 1.0].repeat(64));
    }
    assert_eq!(&env.obs()[..2], &[0.3, 0.4]);
}

#[test]
fn reaching_the_goal_gives_reward_and_the_episode_has_a_fixed_length() {
    let mut env = VecEnv::new(spec(Layout::Open), &[7, 8]);
    // Env 0 starts 0.24 left of its goal and moves right, env 1 stays put far from its goal.
    env.set_state(&[0.26, 0.5, 0.1, 0.1], &[0.5, 0.5, 0.9, 0.9]);
    let mut rewards = Vec::new();
    for t in 0..30 {
        let out = env.step(&[if t < 2 { 1.0 } else { 0.25 }, 0.0, 0.0, 0.0]);
        rewards.push((out.reward[0], out.reward[1]));
        assert_eq!(out.done, t == 29, "step {t}");
    }
    // x = 0.36, then 0.46 (within the 0.05 radius), 0.485, 0.51, 0.535, then 0.56 (out again).
    let r0: Vec<f32> = rewards.iter().map(|r| r.0).collect();
    assert_eq!(&r0[..6], &[0.0, 1.0, 1.0, 1.0, 1.0, 0.0], "{r0:?}");
    assert!(rewards.iter().all(|r| r.1 == 0.0));
    assert_eq!(env.t(), 0, "reset after the last step");
}

#[test]
fn same_seeds_same_trajectories_and_vectorised_equals_sequential() {
    let seeds = VecEnv::seeds(11, 5);
    let run = |envs: &mut [VecEnv], steps: usize| -> Vec<Vec<f32>> {
        let mut rng = RlRng::seed_from_u64(99);
        let mut traj = Vec::new();
        for _ in 0..steps {
            let a = random_actions(&mut rng, 5);
            let mut obs = Vec::new();
            let mut k = 0;
            for e in envs.iter_mut() {
                let n = e.num_envs();
                let out = e.step(&a[2 * k..2 * (k + n)]);
                obs.extend(out.obs);
                obs.extend(out.reward);
                obs.extend(e.goals().to_vec());
                k += n;
            }
            traj.push(obs);
        }
        traj
    };
    // 70 steps: two resets (episode length 30) with new starts and goals from each env's stream.
    let vectorised = run(&mut [VecEnv::new(spec(Layout::U), &seeds)], 70);
    let again = run(&mut [VecEnv::new(spec(Layout::U), &seeds)], 70);
    assert_eq!(vectorised, again, "same seeds, same trajectories");
    let mut singles: Vec<VecEnv> = seeds.iter().map(|&s| VecEnv::new(spec(Layout::U), &[s])).collect();
    let sequential = run(&mut singles, 70);
    // Same numbers, grouped per env instead of per field: regroup the vectorised rows.
    let regroup = |row: &[f32]| -> Vec<f32> {
        (0..5)
            .flat_map(|i| {
                let mut v = row[2 * i..2 * i + 2].to_vec();
                v.push(row[10 + i]);
                v.extend_from_slice(&row[15 + 2 * i..15 + 2 * i + 2]);
                v
            })
            .collect()
    };
    for (t, (v, s)) in vectorised.iter().zip(&sequential).enumerate() {
        assert_eq!(regroup(v), *s, "step {t}");
    }
    let other = run(&mut [VecEnv::new(spec(Layout::U), &VecEnv::seeds(12, 5))], 70);
    assert_ne!(vectorised, other, "another seed, other tasks");
}

#[test]
fn hindsight_goals_come_from_the_future_of_the_same_episode() {
    let (t, n) = (6, 3);
    let mut replay = Replay::new(t, 10).unwrap();
    // State k of episode e is (e, k); action k of episode e is (e, k).
    let states: Vec<f32> = (0..=t).flat_map(|k| (0..n).flat_map(move |e| [e as f32, k as f32])).collect();
    let actions: Vec<f32> = (0..t).flat_map(|k| (0..n).flat_map(move |e| [e as f32, k as f32])).collect();
    replay.add_rollout(&states, &actions, n);
    let b = replay.sample(2000, 0.7, &mut RlRng::seed_from_u64(1));
    for i in 0..2000 {
        let (e, k) = (b.states[2 * i], b.states[2 * i + 1]);
        assert_eq!((b.actions[2 * i], b.actions[2 * i + 1]), (e, k), "the action taken in that state");
        assert_eq!(b.goals[2 * i], e, "goal from the same episode");
        assert!(b.goals[2 * i + 1] > k && b.goals[2 * i + 1] <= t as f32, "goal strictly in the future");
    }
}

/// Writes `phi`, `psi` to a safetensors file, runs `parity/crl_infonce.py` on them with the venv's
/// python (every loss and penalty in one process: importing torch costs more than all of them),
/// and compares loss, accuracy and both gradients with ours.
fn check_infonce_against_pytorch(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let (phi0, psi0) = plexus::device::with_seed(5, || {
        // K = 8: logits of a few units, so the softmax is neither flat nor one-hot.
        let phi = Tensor::randn([16, 8], (Kind::Double, tch::Device::Cpu)) * 0.7;
        let psi = Tensor::randn([16, 8], (Kind::Double, tch::Device::Cpu)) * 0.7;
        // Make some rows right: the accuracy is then neither 0 nor 1.
        let psi = &psi + &phi * Tensor::from_slice(&[1.0f64, 0.0]).repeat([8]).reshape([16, 1]);
        (phi.to_kind(kind), psi.to_kind(kind))
    });
    let input = tmp.path().join("in.safetensors");
    Tensor::write_safetensors(&[("phi", &phi0), ("psi", &psi0)], &input).unwrap();
    let out = tmp.path().join("out.safetensors");
    let (losses, penalties) = ([(InfoNce::Forward, "forward"), (InfoNce::Symmetric, "symmetric")], ["0", "0.1"]);
    let status = std::process::Command::new(plexus::parity::python())
        .arg(common::repo().join("parity/crl_infonce.py"))
        .arg(&input)
        .arg(&out)
        .args(["--loss", "forward,symmetric", "--penalty", &penalties.join(",")])
        .status()
        .expect("run the venv python (scripts/setup.sh)");
    assert!(status.success(), "parity/crl_infonce.py failed");
    let r: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&out).unwrap().into_iter().collect();
    let err = |a: &Tensor, b: &Tensor| {
        let b = b.to_kind(Kind::Double);
        let scale = b.abs().max().double_value(&[]).max(1.0);
        (a.to_kind(Kind::Double) - &b).abs().max().double_value(&[]) / scale
    };
    for (loss, name) in losses {
        for p in penalties {
            let penalty: f64 = p.parse().unwrap();
            let phi = phi0.copy().set_requires_grad(true);
            let psi = psi0.copy().set_requires_grad(true);
            let (l, acc) = infonce(&phi, &psi, loss, penalty);
            l.backward();
            let at = |t: &str| &r[&format!("{name}@{p}.{t}")];
            let acc_ref = at("accuracy").double_value(&[]);
            assert!(acc_ref > 0.0 && acc_ref < 1.0, "accuracy {acc_ref}: pick inputs where it says something");
            for (what, e) in [
                ("loss", err(&l, at("loss"))),
                ("accuracy", err(&acc, at("accuracy"))),
                ("grad.phi", err(&phi.grad(), at("grad.phi"))),
                ("grad.psi", err(&psi.grad(), at("grad.psi"))),
            ] {
                assert!(e <= 1e-6, "{kind:?} {name} penalty {penalty}: {what} differs by {e:e} (relative)");
            }
        }
    }
}

#[test]
#[ignore = "slow tier: PyTorch parity of the InfoNCE critic loss"]
fn infonce_matches_its_pytorch_reference_forward_and_symmetric() {
    for kind in [Kind::Float, Kind::Double] {
        check_infonce_against_pytorch(kind);
    }
}

fn tiny(topology: &str, overrides: &[&str]) -> RlExperiment {
    let yaml = format!(
        "name: t\nseed: 1\ndevice: cpu\nenv: {{layout: u, num_envs: 8, episode_length: 20, max_step: 0.1, \
         goal_radius: 0.1}}\nnetwork: {{width: 16, depth: 8, block_size: 4, repr_dim: 8, topology: {topology}}}\n\
         train: {{env_steps: 320, batch_size: 32, updates_per_rollout: 2, replay_episodes: 64}}\n\
         log: {{eval_every: 160, eval_envs: 8}}\n"
    );
    let ov: Vec<plexus::config::Override> = overrides.iter().map(|s| s.parse().unwrap()).collect();
    RlExperiment::from_str(&yaml, Path::new("tiny.yaml"), &ov).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_topology_wires_the_encoders_at_both_granularities() {
    for t in plexus::topology::REGISTRY {
        for g in ["sublayer", "block"] {
            let exp = tiny(&format!("{{kind: {}, granularity: {g}}}", t.name), &[]);
            let agent =
                plexus::device::with_seed(0, || Agent::new(&exp.config, exp.topology.as_ref(), tch::Device::Cpu));
            assert_eq!(agent.actor.units(), if g == "block" { 2 } else { 8 }, "{} {g}", t.name);
            let mut agent = agent;
            let mut rng = RlRng::seed_from_u64(0);
            let batch = plexus::rl::replay::Batch {
                states: (0..64).map(|_| rng.gen()).collect(),
                actions: (0..64).map(|_| rng.gen_range(-1.0..1.0)).collect(),
                goals: (0..64).map(|_| rng.gen()).collect(),
            };
            let stats = agent.update(&batch, &normals(&mut rng, 64), 1e-3);
            let v = plexus::host::values(&stats);
            assert!(v.iter().all(|x| x.is_finite()), "{} {g}: {v:?}", t.name);
            let a = agent.act(&batch.states[..8], &batch.goals[..8], None);
            assert!(a.iter().all(|x| x.abs() <= 1.0), "{} {g}", t.name);
        }
    }
}

#[test]
fn parameters_have_pytorch_state_dict_names() {
    let exp = tiny("{kind: hacn, granularity: block}", &[]);
    let agent = plexus::device::with_seed(0, || Agent::new(&exp.config, exp.topology.as_ref(), tch::Device::Cpu));
    let names: std::collections::BTreeSet<String> = agent.vs.variables().into_keys().collect();
    for n in [
        "sa_encoder.stem.linear.weight",
        "sa_encoder.stem.norm.bias",
        "sa_encoder.layers.7.linear.bias",
        "sa_encoder.layers.0.norm.weight",
        "sa_encoder.norm.weight",
        "sa_encoder.head.weight",
        "g_encoder.head.bias",
        "actor.layers.3.linear.weight",
        "log_alpha",
    ] {
        assert!(names.contains(n), "no `{n}` in {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("actor.topology.")), "H-ACN's own parameters: {names:?}");
    assert_eq!(agent.vs.variables()["sa_encoder.stem.linear.weight"].size(), vec![16, 4]);
    assert_eq!(agent.vs.variables()["g_encoder.stem.linear.weight"].size(), vec![16, 2]);
    assert_eq!(agent.vs.variables()["actor.head.weight"].size(), vec![4, 16]);
}

#[test]
fn config_errors_name_the_file_the_key_the_value_and_what_is_allowed() {
    let src = std::fs::read_to_string(common::repo().join("configs/crl-maze/cpu/d4.yaml")).unwrap();
    let file = Path::new("d4.yaml");
    let load = |s: &str, ov: &[&str]| {
        let ov: Vec<plexus::config::Override> = ov.iter().map(|s| s.parse().unwrap()).collect();
        RlExperiment::from_str(s, file, &ov)
    };
    assert!(load(&src, &[]).is_ok());
    let e = load(&src, &["network.depth=6"]).unwrap_err();
    assert_eq!((e.key.as_str(), e.value.as_deref()), ("network.depth", Some("6")), "{e}");
    assert!(e.allowed.contains("multiple of network.block_size = 4"), "{e}");
    assert!(e.to_string().contains("--set network.depth=6"), "{e}");
    let e = load(&src, &["network.topology.kind=resnet"]).unwrap_err();
    assert_eq!(e.key, "network.topology.kind", "{e}");
    assert!(e.allowed.contains("`ancre`"), "{e}");
    let e = load(&src.replace("updates_per_rollout: 32", "updates_per_rollout: 32, lrr: 3"), &[]).unwrap_err();
    assert_eq!(e.key, "train.lrr", "{e}");
    assert!(e.line.is_some() && e.to_string().contains("d4.yaml"), "{e}");
    let e = load(&src, &["env.layout=maze"]).unwrap_err();
    assert!(e.allowed.contains("open") && e.allowed.contains('u'), "{e}");
    let e = load(&src, &["crl.loss=backward"]).unwrap_err();
    assert!(e.allowed.contains("forward") && e.allowed.contains("symmetric"), "{e}");
    let e = load(&src, &["train.env_steps=100"]).unwrap_err();
    assert_eq!((e.key.as_str(), e.value.as_deref()), ("train.env_steps", Some("100")), "{e}");
    let e = load(&src, &["network.topology.granularity=layer"]).unwrap_err();
    assert_eq!(e.key, "network.topology.granularity", "{e}");
}

#[test]
fn shipped_configs_load() {
    for (dir, least) in [("configs/crl-maze", 3), ("configs/crl-maze/cpu", 3), ("configs/crl-maze/serpentine", 2)] {
        let mut n = 0;
        for e in std::fs::read_dir(common::repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                RlExperiment::from_file(&p, &[]).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= least, "{dir}: {n} configs (depth 4, 16 and 64; serpentine 4 and 16)");
    }
}

/// A short run on the CPU (about 10 k environment steps) reaches the goal more often than the
/// uniformly random policy on the same evaluation tasks, by a clear margin.
#[test]
#[ignore = "slow tier: RL training until it beats the random policy"]
fn a_short_training_run_beats_the_random_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let ov: Vec<plexus::config::Override> =
        ["train.env_steps=9600", "log.eval_every=4800", "env.num_envs=16"].iter().map(|s| s.parse().unwrap()).collect();
    let exp = RlExperiment::from_file(&common::repo().join("configs/crl-maze/cpu/d4.yaml"), &ov).unwrap();
    let dir = tmp.path().join("run");
    let t = std::time::Instant::now();
    let s = trainer::train(&exp, &dir, &RlOptions::default()).unwrap();
    let cfg = &exp.config;
    let (random, _) = random_policy(&cfg.env.spec(), &eval_seeds(cfg.seed, cfg.log.eval_envs), cfg.seed).rates();
    assert_eq!(random, s.random_success);
    eprintln!(
        "trained: success {:.3} (time at goal {:.3}); random: {random:.3}; {:.1}s",
        s.success,
        s.time_at_goal,
        t.elapsed().as_secs_f64()
    );
    assert!(s.success >= random + 0.15 && s.success >= 1.5 * random, "trained {} vs random {random}", s.success);
    // The run directory.
    let metrics = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let header = metrics.lines().next().unwrap();
    for col in ["env_steps", "success", "time_at_goal", "critic_loss", "actor_loss", "accuracy"] {
        assert!(header.split(',').any(|c| c == col), "{header}");
    }
    assert_eq!(metrics.lines().count(), 1 + 3, "after the first rollout, at 4800 and at 9600 steps");
    for f in ["config.yaml", "summary.json", "checkpoints/final.safetensors"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    // The figure is the command's (`plexus rl` draws it after training).
    let figures = plexus::plot::curves::kind_figure(&plexus::kinds::RL, std::slice::from_ref(&dir)).unwrap();
    let figures = plexus::plot::write_all(&figures, &Default::default(), &dir.join("figures")).unwrap();
    assert_eq!(
        figures,
        [dir.join("figures/success.png"), dir.join("figures/success.svg"), dir.join("figures/success.pdf")]
    );
    let ckpt = plexus::train::checkpoint::latest(&plexus::run_dir::RunDir::new(&dir)).unwrap().unwrap();
    assert_eq!(ckpt.step, 9600);
}

/// The same config gives the same metrics (but the wall-clock column), through the CLI; `--plot`
/// draws several runs into one figure.
#[test]
#[ignore = "slow tier: several plexus rl runs and their plots (CLI)"]
fn plexus_rl_is_reproducible_and_plots_several_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = common::repo().join("configs/crl-maze/cpu/d4.yaml");
    let args = |out: &str| {
        vec![
            "rl".to_string(),
            cfg.display().to_string(),
            "--quiet".into(),
            "--out".into(),
            out.to_string(),
            "--set".into(),
            "train.env_steps=1600".into(),
            "--set".into(),
            "env.num_envs=16".into(),
            "--set".into(),
            "network.width=16".into(),
        ]
    };
    let metrics = |out: &str| -> Vec<String> {
        let o = common::plexus(&args(out).iter().map(String::as_str).collect::<Vec<_>>(), tmp.path());
        assert!(o.status.success(), "{:?}", common::text(&o));
        let text = std::fs::read_to_string(tmp.path().join(out).join("metrics.csv")).unwrap();
        text.lines().map(|l| l.rsplit_once(',').unwrap().0.to_string()).collect()
    };
    let (a, b) = (metrics("a"), metrics("b"));
    assert_eq!(a, b);
    assert!(a.len() >= 2);
    let o = common::plexus(&["rl", "--plot", "a", "b", "--out", "figs"], tmp.path());
    assert!(o.status.success(), "{:?}", common::text(&o));
    assert!(tmp.path().join("figs/success.png").is_file());
    // A second run into a full directory is refused; a bad value is a config error (exit 2).
    let o = common::plexus(&args("a").iter().map(String::as_str).collect::<Vec<_>>(), tmp.path());
    assert!(!o.status.success() && common::text(&o).1.contains("--overwrite"), "{:?}", common::text(&o));
    let o = common::plexus(&["rl", &cfg.display().to_string(), "--set", "crl.discount=2"], tmp.path());
    assert_eq!(o.status.code(), Some(2), "{:?}", common::text(&o));
    assert!(common::text(&o).1.contains("crl.discount"), "{:?}", common::text(&o));
}

/// A run killed after a checkpoint and resumed writes the `metrics.csv` (but the wall-clock
/// column) and the final weights of the uninterrupted run: the replay buffer, every environment's
/// state and random stream, the trainer's stream and the optimizers come back exactly.
#[test]
fn a_killed_run_resumes_to_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    // 8 environments × 20 steps = 160 per rollout; updates from the first rollout on, rows at 160,
    // 480 and 800, checkpoints after every rollout; the crash comes after the checkpoint at 640,
    // which holds the update statistics summed since the row at 480.
    let ov = ["train.env_steps=800", "train.prefill_env_steps=160", "log.eval_every=320", "log.checkpoint_every=160"];
    let exp = tiny("{kind: ancre, granularity: block}", &ov);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    trainer::train(&exp, &a, &RlOptions::default()).unwrap();
    let crash = RlOptions { crash_after: Some(640), ..Default::default() };
    let e = trainer::train(&exp, &b, &crash).unwrap_err().to_string();
    assert!(e.contains("simulated crash"), "{e}");
    let ckpt = plexus::train::checkpoint::latest(&plexus::run_dir::RunDir::new(&b)).unwrap().unwrap();
    assert_eq!(ckpt.step, 640);
    trainer::train(&exp, &b, &RlOptions { resume: true, ..Default::default() }).unwrap();
    let rows = |d: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(d.join("metrics.csv")).unwrap();
        text.lines().map(|l| l.rsplit_once(',').unwrap().0.to_string()).collect()
    };
    let (ra, rb) = (rows(&a), rows(&b));
    assert_eq!(ra.len(), 4, "{ra:?}");
    assert!(ra[2].split(',').nth(4).is_some_and(|v| !v.is_empty()), "updates ran: {ra:?}");
    assert_eq!(ra, rb);
    let bytes = |d: &Path| std::fs::read(d.join("checkpoints/final.safetensors")).unwrap();
    assert_eq!(bytes(&a), bytes(&b), "final weights differ after resuming");
    // Only the kept checkpoints' loop states remain (2 by default).
    let extras = std::fs::read_dir(b.join("checkpoints"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".rl.json"))
        .count();
    assert_eq!(extras, 2);
    // A config change other than the run's length is refused, naming the key.
    let changed = tiny("{kind: ancre, granularity: block}", &[&ov[..], &["network.width=32"]].concat());
    let e = trainer::train(&changed, &b, &RlOptions { resume: true, ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("`network.width` is `16` in the run but `32` here") && e.contains("train.env_steps"), "{e}");
}

/// `plexus rl --resume RUN_DIR` finishes a run stopped by `PLEXUS_CRASH_AFTER`, and with `--set
/// train.env_steps=N` extends a finished run from its last checkpoint through the command line; a
/// change of any other key is refused, naming it.
#[test]
fn plexus_rl_resume_extends_a_run_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("tiny.yaml");
    std::fs::write(&cfg, common::TINY_RL_CONFIG).unwrap();
    let run = tmp.path().join("run");
    let (r, c) = (run.to_str().unwrap(), cfg.to_str().unwrap());
    // PLEXUS_CRASH_AFTER stops `plexus rl` as it stops `plexus train`, after the checkpoint due then.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
        .args(["rl", c, "--out", r, "--quiet", "--set", "log.checkpoint_every=160"])
        .env("PLEXUS_CRASH_AFTER", "160")
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let (_, err) = common::text(&o);
    assert!(!o.status.success() && err.contains("simulated crash after 160 environment steps"), "{err}");
    assert!(run.join("checkpoints/step_160.json").is_file() && !run.join("summary.json").exists());
    let o = common::plexus(&["rl", "--resume", r, "--quiet"], tmp.path());
    assert!(o.status.success(), "{:?}", common::text(&o));
    let o = common::plexus(&["rl", "--resume", r, "--set", "network.width=32"], tmp.path());
    assert!(!o.status.success());
    let (_, err) = common::text(&o);
    assert!(err.contains("`network.width`") && err.contains("train.env_steps"), "{err}");
    let o = common::plexus(&["rl", "--resume", r, "--set", "train.env_steps=640", "--quiet"], tmp.path());
    assert!(o.status.success(), "{:?}", common::text(&o));
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let steps: Vec<&str> = metrics.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(steps, ["160", "320", "480", "640"], "{metrics}");
    assert!(std::fs::read_to_string(run.join("config.yaml")).unwrap().contains("env_steps: 640"));
}

/// A finished run opens again with its final weights (`rl::trained::open`, the loader of `plexus
/// train`'s runs): its policy on the run's own evaluation tasks gives the summary's final success
/// and time at goal exactly. A run laid out as before 2026-11-27 (final weights in its root)
/// opens the same; one without final weights says how far it got. `plexus rl --eval` evaluates
/// it on held-out tasks and writes what it printed.
#[test]
fn a_finished_run_opens_with_its_final_weights_and_evaluates_on_held_out_tasks() {
    use plexus::rl::trained;
    let tmp = tempfile::tempdir().unwrap();
    let exp = tiny("{kind: ancre, granularity: block}", &["log.checkpoint_every=160"]);
    let dir = tmp.path().join("r");
    let s = trainer::train(&exp, &dir, &RlOptions::default()).unwrap();
    let (spec, seeds) = (exp.config.env.spec(), eval_seeds(exp.config.seed, exp.config.log.eval_envs));
    let rates = |d: &Path| {
        let run = trained::open(d, Some(tch::Device::Cpu)).unwrap();
        trainer::evaluate(&spec, &seeds, |st, g| run.agent.act(st, g, None)).rates()
    };
    assert_eq!(rates(&dir), (s.success, s.time_at_goal));
    // Every weight is the file's, and training moved them from the initialisation.
    let run = trained::open(&dir, Some(tch::Device::Cpu)).unwrap();
    let saved: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("checkpoints/final.safetensors")).unwrap().into_iter().collect();
    let fresh =
        plexus::device::with_seed(exp.config.seed, || Agent::new(&exp.config, exp.topology.as_ref(), tch::Device::Cpu));
    let (vars, init) = (run.agent.vs.variables(), fresh.vs.variables());
    assert_eq!(vars.len(), saved.len());
    assert!(vars.iter().all(|(k, v)| v.equal(&saved[k])));
    assert!(vars.iter().any(|(k, v)| !v.equal(&init[k])), "no weight moved from its initialisation");
    // The layout of older runs.
    let final_weights = dir.join("checkpoints/final.safetensors");
    let legacy = tmp.path().join("legacy");
    std::fs::create_dir(&legacy).unwrap();
    std::fs::copy(dir.join("config.yaml"), legacy.join("config.yaml")).unwrap();
    std::fs::copy(&final_weights, legacy.join("final.safetensors")).unwrap();
    assert_eq!(rates(&legacy), (s.success, s.time_at_goal));
    std::fs::remove_file(legacy.join("final.safetensors")).unwrap();
    let e = trained::open(&legacy, Some(tch::Device::Cpu)).err().unwrap().to_string();
    assert!(e.contains("final.safetensors is missing"), "{e}");
    let e = trained::open(tmp.path(), None).err().unwrap().to_string();
    assert!(e.contains("not a `plexus rl` run directory"), "{e}");
    let unfinished = tmp.path().join("unfinished");
    std::fs::create_dir_all(unfinished.join("checkpoints")).unwrap();
    for f in std::fs::read_dir(dir.join("checkpoints")).unwrap() {
        let f = f.unwrap().path();
        if f.file_name().unwrap() != "final.safetensors" {
            std::fs::copy(&f, unfinished.join("checkpoints").join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(dir.join("config.yaml"), unfinished.join("config.yaml")).unwrap();
    let e = trained::open(&unfinished, Some(tch::Device::Cpu)).err().unwrap().to_string();
    assert!(e.contains("latest checkpoint is at step 320") && e.contains("`plexus rl --resume"), "{e}");

    let r = dir.to_str().unwrap();
    let o = common::plexus(&["rl", "--eval", r, "--episodes", "40"], tmp.path());
    let (out, err) = common::text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("40 held-out tasks"), "{out}");
    let row: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("held_out_eval.json")).unwrap()).unwrap();
    assert_eq!(row["tasks"], 40);
    // The straight-line walker needs no weights: its numbers are those of the same tasks here.
    let straight = trainer::straight_line_policy(&spec, &trained::held_out_seeds(exp.config.seed, 40)).rates().0;
    assert_eq!(row["straight_success"][0].as_f64().unwrap(), straight);
    let [rate, lo, hi] = [0, 1, 2].map(|i| row["success"][i].as_f64().unwrap());
    assert!(lo <= rate && rate <= hi && (0.0..=1.0).contains(&lo) && hi <= 1.0, "{row}");
}

/// A learning rate that blows the networks up stops the run at the end of the rollout where it
/// happened, naming the update, the losses and the first parameter that are not finite, with no
/// checkpoint, final weights or summary after it (it used to exit 0 with every weight NaN).
#[test]
fn a_diverging_run_stops_naming_the_update_and_what_went_non_finite() {
    let tmp = tempfile::tempdir().unwrap();
    let ov = ["train.lr=1e10", "train.env_steps=800", "log.checkpoint_every=160"];
    let exp = tiny("{kind: residual}", &ov);
    let dir = tmp.path().join("r");
    let e = format!("{:#}", trainer::train(&exp, &dir, &RlOptions::default()).unwrap_err());
    assert!(e.contains("update ") && e.contains("went non-finite") && e.contains("no checkpoint"), "{e}");
    assert!(e.contains("metrics.csv") && e.contains("train.lr"), "{e}");
    // The rollout that diverged wrote nothing after it.
    let at: u64 = e.split("ended at ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let run = plexus::run_dir::RunDir::new(&dir);
    for (_, s) in plexus::train::checkpoint::list(&run).unwrap() {
        assert!(s.step < at, "a checkpoint at {} after the divergence at {at}", s.step);
    }
    assert!(!dir.join("checkpoints/final.safetensors").exists() && !dir.join("summary.json").exists());
}

/// Every file a resume reads is covered by the marker's checksums: a flipped byte in the replay
/// buffer or the loop state is an error naming the file, not a silently different run.
#[test]
fn a_damaged_replay_file_or_loop_state_is_refused_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let ov = ["train.env_steps=480", "log.checkpoint_every=160", "log.keep_checkpoints=1"];
    let exp = tiny("{kind: residual}", &ov);
    let dir = tmp.path().join("r");
    let crash = RlOptions { crash_after: Some(320), ..Default::default() };
    assert!(trainer::train(&exp, &dir, &crash).is_err());
    let ck = dir.join("checkpoints");
    for name in ["step_320.replay.safetensors", "step_320.rl.json"] {
        let path = ck.join(name);
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        let i = bad.len() - 3;
        bad[i] ^= 0x04;
        std::fs::write(&path, &bad).unwrap();
        let e =
            format!("{:#}", trainer::train(&exp, &dir, &RlOptions { resume: true, ..Default::default() }).unwrap_err());
        assert!(e.contains(&path.display().to_string()) && e.contains("is corrupt"), "{name}: {e}");
        std::fs::write(&path, &good).unwrap();
    }
    trainer::train(&exp, &dir, &RlOptions { resume: true, ..Default::default() }).unwrap();
}

/// Settings that would abort or silently do nothing are refused: a replay buffer larger than
/// memory (before any directory is created), a prefill that leaves no update, and a resume that
/// shrinks the run below where it is (config.yaml unchanged).
#[test]
fn impossible_rl_settings_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let exp = tiny("{kind: residual}", &["train.replay_episodes=1000000000000"]);
    let e = format!("{:#}", trainer::train(&exp, &dir, &RlOptions::default()).unwrap_err());
    assert!(e.contains("train.replay_episodes = 1000000000000") && e.contains("GiB"), "{e}");
    assert!(!dir.exists(), "a run directory was left behind");
    let yaml = |ov: &[&str]| {
        let ov: Vec<plexus::config::Override> = ov.iter().map(|s| s.parse().unwrap()).collect();
        let src = "name: t\nseed: 1\ndevice: cpu\nenv: {layout: u, num_envs: 8, episode_length: 20}\n\
                   network: {width: 16, depth: 4, block_size: 4, repr_dim: 8, topology: {kind: residual}}\n\
                   train: {env_steps: 320, batch_size: 32, updates_per_rollout: 2, replay_episodes: 64}\n";
        RlExperiment::from_str(src, Path::new("p.yaml"), &ov)
    };
    let e = yaml(&["train.prefill_env_steps=100000000000"]).unwrap_err();
    assert_eq!(e.key, "train.prefill_env_steps", "{e}");
    assert!(e.allowed.contains("train.env_steps = 320"), "{e}");
    assert!(yaml(&["train.prefill_env_steps=160"]).is_ok());

    let exp = tiny("{kind: residual}", &["train.env_steps=320"]);
    trainer::train(&exp, &dir, &RlOptions::default()).unwrap();
    let before = std::fs::read_to_string(dir.join("config.yaml")).unwrap();
    let shorter = tiny("{kind: residual}", &["train.env_steps=160"]);
    let e =
        format!("{:#}", trainer::train(&shorter, &dir, &RlOptions { resume: true, ..Default::default() }).unwrap_err());
    assert!(e.contains("`train.env_steps` is `320` in the run but `160` here") && e.contains("not shrink"), "{e}");
    assert_eq!(std::fs::read_to_string(dir.join("config.yaml")).unwrap(), before);
}

/// The straight-line baseline: without walls it reaches every goal (and stays there), in the U
/// maze the wall stops it on part of the tasks, and it beats the random policy; a run reports it
/// in summary.json beside the random one.
#[test]
fn the_straight_line_baseline_reaches_open_goals_and_is_stopped_by_the_wall() {
    use plexus::rl::trainer::straight_line_policy;
    let seeds = eval_seeds(7, 256);
    let (open, open_time) = straight_line_policy(&spec(Layout::Open), &seeds).rates();
    assert_eq!(open, 1.0, "every goal of the open arena is on a straight line");
    assert!(open_time > 0.5, "it stays at the goal once there: {open_time}");
    let u = spec(Layout::U);
    let on_u = straight_line_policy(&u, &seeds);
    let (straight, _) = on_u.rates();
    let (random, _) = random_policy(&u, &seeds, 7).rates();
    // It fails only where the wall is in its way: every task with a clear line is reached.
    assert_eq!(on_u.success_where(false), 1.0);
    assert!(on_u.success_where(true) < 0.5 && on_u.blocked_share() > 0.2, "{on_u:?}");
    println!("U maze, 256 tasks: straight line {straight:.3}, random {random:.3}");
    assert!(straight < 1.0 && straight > random, "straight {straight}, random {random}");
    let tmp = tempfile::tempdir().unwrap();
    let s = trainer::train(&tiny("{kind: residual}", &[]), &tmp.path().join("r"), &RlOptions::default()).unwrap();
    let cfg = &tiny("{kind: residual}", &[]).config;
    let expected = straight_line_policy(&cfg.env.spec(), &eval_seeds(cfg.seed, cfg.log.eval_envs));
    assert_eq!((s.straight_success, s.straight_time_at_goal), expected.rates());
    assert_eq!((s.blocked_share, s.straight_success_blocked), (expected.blocked_share(), expected.success_where(true)));
    // The split of the trained policy is its last evaluation's: the blocked and clear tasks
    // together give the success rate in summary.json.
    let share = s.blocked_share;
    let clear = (s.success - share * s.success_blocked) / (1.0 - share);
    assert!((0.0..=1.0 + 1e-9).contains(&clear), "success {} blocked {} share {share}", s.success, s.success_blocked);
}

/// What the other verbs say of a finished RL run: `analyze` and `connectivity` point to what can be
/// done with it (`rl --plot`, `rl --eval`) instead of advising to retrain it; `--episodes` past its
/// bound is refused before anything is allocated; final weights replaced by a directory are named
/// as damage, not as an unfinished run.
#[test]
fn other_verbs_on_an_rl_run_say_what_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tiny("{kind: residual}", &[]);
    let dir = tmp.path().join("r");
    trainer::train(&exp, &dir, &RlOptions::default()).unwrap();
    let d = dir.to_str().unwrap();
    for args in [vec!["analyze", d], vec!["connectivity", d]] {
        let o = common::plexus(&args, tmp.path());
        let (_, err) = common::text(&o);
        assert!(
            !o.status.success() && err.contains("is a `plexus rl` run") && err.contains("rl --eval"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("run it with"), "{err}");
    }
    for n in ["18446744073709551615", "1000000000", "0"] {
        let o = common::plexus(&["rl", "--eval", d, "--episodes", n], tmp.path());
        let (_, err) = common::text(&o);
        assert_eq!(o.status.code(), Some(2), "{n}: {err}");
        assert!(err.contains("--episodes") && !err.contains("panicked"), "{n}: {err}");
    }
    let weights = dir.join("checkpoints/final.safetensors");
    std::fs::remove_file(&weights).unwrap();
    std::fs::create_dir(&weights).unwrap();
    let o = common::plexus(&["rl", "--eval", d, "--episodes", "4"], tmp.path());
    let (_, err) = common::text(&o);
    assert!(!o.status.success() && err.contains("is a directory, not a weights file"), "{err}");
}
