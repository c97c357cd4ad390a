//! The contrastive-RL training loop of `plexus rl`, writing a run directory.
//!
//! Each iteration collects one rollout (one episode of every environment: `num_envs ×
//! episode_length` environment steps; uniformly random actions during `prefill_env_steps`, then
//! the actor with its own noise), stores it in replay, and takes `updates_per_rollout` gradient
//! steps ([`Agent::update`]). Every `log.eval_every` environment steps (and after the first rollout
//! and at the end) the deterministic policy `tanh(μ)` runs one episode on each of `log.eval_envs`
//! evaluation environments with fixed seeds (the same tasks every time) and a `metrics.csv` row is
//! written. Two baselines are measured once on the same evaluation tasks: the uniformly random
//! policy (`summary.json`: `random_success`) and the policy that walks straight at the goal
//! (`straight_success`), which needs no learning and fails only where a wall is in the way: a
//! trained agent shows what it learned by beating it.
//!
//! Run directory: `config.yaml` (resolved), `metrics.csv` (`env_steps, updates, success,
//! time_at_goal, critic_loss, actor_loss, accuracy, alpha, log_prob, train_success, seconds`),
//! `summary.json`, `checkpoints/step_<env steps>.{safetensors,optim.safetensors,json}` (the
//! `train` checkpoint format: all networks with PyTorch names, every optimizer's moments),
//! `checkpoints/final.safetensors` (as `plexus train` writes it; runs of plexus before 2026-11-27
//! have it in the run's root) and the success figure (drawn by the command, plot/rl.rs). A checkpoint also holds what the loop needs
//! to go on exactly: `step_N.replay.safetensors` (the replay buffer, and the update statistics
//! accumulated since the last row) and `step_N.rl.json` (counters, every environment's state and
//! random stream, the trainer's stream), both written before the marker `step_N.json`.
//! `plexus rl --resume RUN_DIR` continues from the latest checkpoint (checkpoints fall on rollout
//! boundaries) and writes the `metrics.csv` an uninterrupted run would (up to `seconds`).
//!
//! Determinism: initialisation is seeded; the environments, exploration noise, replay sampling
//! and the actor's reparameterisation noise come from host generators seeded by `seed`; so the
//! same config gives the same `metrics.csv` on the CPU (up to the `seconds` column).
//! Host reads: one per environment step (the actions), two per rollout (the divergence check: the
//! record of the update statistics and the parameters) and one per logged row (the losses).
//!
//! A run whose losses or parameters go non-finite stops at the end of that rollout, naming the
//! update, the losses and the first parameter that are not finite; no checkpoint is written after
//! it. Every update's statistics go through `plexus train`'s divergence guard
//! ([`crate::train::divergence`]), which keeps the first non-finite update on the device. Every file a resume reads is covered by the checkpoint marker's CRC-32s.

use super::config::RlExperiment;
use super::crl::{normals, Agent, UPDATE_STATS};
use super::env::{EnvSpec, VecEnv};
use super::replay::Replay;
use super::RlRng;
use crate::run_dir::{atomic_write, atomic_write_with, RunDir};
use crate::train::checkpoint::{self, TrainerState};
use crate::train::divergence::DivergenceGuard;
use crate::train::lifecycle;
use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// What a run reports (`summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RlSummary {
    pub name: String,
    pub topology: String,
    pub topology_label: String,
    pub depth: usize,
    pub units: usize,
    pub params: i64,
    pub env_steps: u64,
    pub updates: u64,
    /// Final evaluation: share of episodes that reach the goal at least once.
    pub success: f64,
    /// Final evaluation: mean share of steps spent within the goal radius.
    pub time_at_goal: f64,
    /// The uniformly random policy on the same evaluation tasks.
    pub random_success: f64,
    pub random_time_at_goal: f64,
    /// The straight-line policy on the same evaluation tasks ([`straight_line_policy`]; absent
    /// from runs written before it was measured).
    #[serde(default)]
    pub straight_success: f64,
    #[serde(default)]
    pub straight_time_at_goal: f64,
    /// The share of evaluation tasks whose straight line from start to goal crosses a wall, and
    /// the success of the trained, straight-line and random policies on those tasks alone (NaN,
    /// written `null`, without such tasks; absent from runs written before the split).
    #[serde(default)]
    pub blocked_share: f64,
    #[serde(default, deserialize_with = "nan_if_null")]
    pub success_blocked: f64,
    #[serde(default, deserialize_with = "nan_if_null")]
    pub straight_success_blocked: f64,
    #[serde(default, deserialize_with = "nan_if_null")]
    pub random_success_blocked: f64,
    pub seconds: f64,
    pub device: String,
}

/// serde_json writes NaN as `null`; read it back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Options of a run.
#[derive(Debug, Clone, Default)]
pub struct RlOptions {
    /// Clear a non-empty run directory first.
    pub overwrite: bool,
    /// Print a line per evaluation to stderr.
    pub verbose: bool,
    /// Continue the run in the directory from its latest checkpoint.
    pub resume: bool,
    /// Testing: fail as a crash would once this many environment steps are done (after the
    /// checkpoint due then, if any).
    pub crash_after: Option<u64>,
}

/// The loop's state at a checkpoint (`step_N.rl.json`); the replay buffer is beside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LoopState {
    env_steps: u64,
    updates: u64,
    next_eval: u64,
    next_ckpt: u64,
    /// Updates whose statistics are summed in the replay file's `stats` since the last row.
    stat_updates: u64,
    /// The last evaluation's `(success, time_at_goal)`.
    last: (f64, f64),
    rng: RlRng,
    env: super::env::EnvState,
    replay_stored: usize,
    replay_next: usize,
}

fn loop_state_file(run: &RunDir, step: u64) -> std::path::PathBuf {
    run.checkpoints_dir().join(format!("step_{step}.rl.json"))
}

fn replay_file(run: &RunDir, step: u64) -> std::path::PathBuf {
    run.checkpoints_dir().join(format!("step_{step}.replay.safetensors"))
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The replay buffer of `exp`, or an error naming `train.replay_episodes` when it would not fit in
/// this machine's memory (checked before allocating: a buffer larger than memory would be
/// allocated lazily and kill the process later, mid-run).
fn new_replay(exp: &RlExperiment) -> Result<Replay> {
    let cfg = &exp.config;
    let (t_len, episodes) = (cfg.env.episode_length, cfg.train.replay_episodes);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let need = Replay::bytes(t_len, episodes).unwrap_or(u64::MAX);
    if let Some(have) = crate::device::host_memory_available() {
        if need > have {
            anyhow::bail!(
                "{}: train.replay_episodes = {episodes}: the replay buffer would take {:.1} GiB (episodes × \
                 (4 · env.episode_length + 2) floats), more than the {:.1} GiB of memory available on this machine; \
                 lower train.replay_episodes",
                exp.file.display(),
                gib(need),
                gib(have)
            );
        }
    }
    Replay::new(t_len, episodes).with_context(|| format!("{}: train.replay_episodes = {episodes}", exp.file.display()))
}

/// Whether the updates so far diverged: `guard` watched each update's [`UPDATE_STATS`]; the
/// parameters are checked too, for the updates `updates` (this rollout's). Returns what went
/// non-finite, for the error.
fn divergence(guard: &DivergenceGuard, updates: std::ops::RangeInclusive<u64>, agent: &Agent) -> Option<String> {
    let stats = guard.read();
    let params = agent.vs.variables();
    let param = checkpoint::first_non_finite(&params);
    if stats.is_none() && param.is_none() {
        return None;
    }
    let param = param.map(|p| format!("; the first parameter that is not finite is `{p}`")).unwrap_or_default();
    Some(match stats {
        Some(d) => format!("update {}: {} went non-finite{param}", d.index, d.what.join(", ")),
        None => format!("the parameters went non-finite in updates {}..={}{param}", updates.start(), updates.end()),
    })
}

/// What a resumed `plexus rl` run may change: `train.env_steps` (growing) and checkpointing.
pub const RESUME_POLICY: lifecycle::ResumePolicy = lifecycle::ResumePolicy {
    length: "train.env_steps",
    may_change: |k| k == "log.checkpoint_every" || k == "log.keep_checkpoints" || k == "log.tensorboard",
    describe: "log.checkpoint_every, log.keep_checkpoints, log.tensorboard",
};

/// Seeds of the evaluation environments: the same tasks at every evaluation and for every run
/// with the same `seed` and `eval_envs`.
pub fn eval_seeds(seed: u64, n: usize) -> Vec<u64> {
    VecEnv::seeds(seed.wrapping_add(0x5eed_0000_0000), n)
}

/// One evaluation episode on each of `N` tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Episodes {
    /// Whether the goal radius was reached at some step, `[N]`.
    pub reached: Vec<bool>,
    /// Steps spent within the goal radius, `[N]`.
    pub steps_at_goal: Vec<usize>,
    /// Whether a wall stands on the straight line from the task's start to its goal, `[N]`.
    pub blocked: Vec<bool>,
    pub episode_length: usize,
}

impl Episodes {
    /// `(success, time_at_goal)`: the share of tasks whose goal was reached, and the mean share
    /// of steps spent at the goal.
    pub fn rates(&self) -> (f64, f64) {
        let n = self.reached.len();
        let success = self.reached.iter().filter(|&&r| r).count() as f64 / n as f64;
        let time = self.steps_at_goal.iter().sum::<usize>() as f64 / (n * self.episode_length) as f64;
        (success, time)
    }

    /// The success rate on the tasks whose straight line is blocked (`blocked`) or clear; NaN
    /// when there are none.
    pub fn success_where(&self, blocked: bool) -> f64 {
        let hits: Vec<bool> =
            self.reached.iter().zip(&self.blocked).filter(|(_, b)| **b == blocked).map(|(r, _)| *r).collect();
        hits.iter().filter(|&&r| r).count() as f64 / hits.len() as f64
    }

    /// The share of tasks whose straight line is blocked.
    pub fn blocked_share(&self) -> f64 {
        self.blocked.iter().filter(|&&b| b).count() as f64 / self.blocked.len() as f64
    }
}

/// Runs one episode of `policy` on environments seeded by `seeds`. `policy(states, goals)` maps
/// `[N, 2]` states and goals to `[N, 2]` actions.
pub fn evaluate(spec: &EnvSpec, seeds: &[u64], mut policy: impl FnMut(&[f32], &[f32]) -> Vec<f32>) -> Episodes {
    let mut env = VecEnv::new(spec.clone(), seeds);
    let n = seeds.len();
    let goals = env.goals().to_vec();
    let walls = spec.layout.walls();
    let blocked = (0..n)
        .map(|i| {
            let (s, g) = (&env.obs()[2 * i..2 * i + 2], &goals[2 * i..2 * i + 2]);
            super::env::sight_blocked(&walls, [s[0], s[1]], [g[0], g[1]])
        })
        .collect();
    let (mut reached, mut at_goal) = (vec![false; n], vec![0usize; n]);
    for _ in 0..spec.episode_length {
        let a = policy(env.obs(), &goals);
        let out = env.step(&a);
        for i in 0..n {
            if out.reward[i] > 0.0 {
                reached[i] = true;
                at_goal[i] += 1;
            }
        }
    }
    Episodes { reached, steps_at_goal: at_goal, blocked, episode_length: spec.episode_length }
}

/// The uniformly random policy on the evaluation tasks of `seeds` (actions drawn from a
/// generator seeded by `seed`).
pub fn random_policy(spec: &EnvSpec, seeds: &[u64], seed: u64) -> Episodes {
    let mut rng = RlRng::seed_from_u64(seed.wrapping_add(0xdead_beef));
    evaluate(spec, seeds, |s, _| (0..s.len()).map(|_| rng.gen_range(-1.0f32..=1.0)).collect())
}

/// The policy that walks straight at the goal at full speed (`a = (g − s) / max_step`, scaled
/// down so that no coordinate exceeds 1) on the evaluation tasks of `seeds`. It needs no
/// learning; it fails where a wall stands between start and goal.
pub fn straight_line_policy(spec: &EnvSpec, seeds: &[u64]) -> Episodes {
    let m = spec.max_step;
    evaluate(spec, seeds, |s, g| {
        s.chunks_exact(2)
            .zip(g.chunks_exact(2))
            .flat_map(|(s, g)| {
                let (ax, ay) = ((g[0] - s[0]) / m, (g[1] - s[1]) / m);
                let k = ax.abs().max(ay.abs()).max(1.0);
                [ax / k, ay / k]
            })
            .collect()
    })
}

/// The columns of an RL run's `metrics.csv`.
const COLUMNS: [&str; 11] = [
    "env_steps",
    "updates",
    "success",
    "time_at_goal",
    "critic_loss",
    "actor_loss",
    "accuracy",
    "alpha",
    "log_prob",
    "train_success",
    "seconds",
];

/// Trains `exp` into the run directory `dir`.
pub fn train(exp: &RlExperiment, dir: &Path, opts: &RlOptions) -> Result<RlSummary> {
    let cfg = &exp.config;
    // Before anything is created: a replay buffer that cannot fit is a config error.
    let mut replay = new_replay(exp)?;
    let request = crate::device::parse_device(&cfg.device).map_err(anyhow::Error::msg)?;
    let device = crate::device::resolve(request)?;
    let mut agent = crate::device::with_seed(cfg.seed, || Agent::new(cfg, exp.topology.as_ref(), device));

    let run = RunDir::new(dir);
    let config_yaml = cfg.to_yaml();
    let mut opened = lifecycle::open(&run, &config_yaml, opts.resume, opts.overwrite, &RESUME_POLICY, true)?;
    let spec = cfg.env.spec();
    let (n, t_len) = (cfg.env.num_envs, cfg.env.episode_length);
    let seeds = eval_seeds(cfg.seed, cfg.log.eval_envs);
    let random_eval = random_policy(&spec, &seeds, cfg.seed);
    let straight_eval = straight_line_policy(&spec, &seeds);
    let (random_success, random_time) = random_eval.rates();
    let (straight_success, straight_time) = straight_eval.rates();
    let mut env = VecEnv::new(spec.clone(), &VecEnv::seeds(cfg.seed, n));
    let mut rng = RlRng::seed_from_u64(cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1));
    let t = &cfg.train;
    let start = Instant::now();
    let (mut env_steps, mut updates) = (0u64, 0u64);
    let (mut next_eval, mut next_ckpt) = (0u64, cfg.log.checkpoint_every.max(1));
    let mut stats: Option<tch::Tensor> = None;
    let mut stat_updates = 0u64;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut last = (0.0, 0.0);
    // The last evaluation's episodes, for the blocked/clear split of the summary.
    let mut last_episodes = None;
    if let Some(state) = opened.checkpoint.clone() {
        let optim = checkpoint::load(&run, &state, &mut agent.vs)?;
        let loop_file = loop_state_file(&run, state.step);
        let text = std::fs::read_to_string(&loop_file).with_context(|| {
            format!(
                "--resume: reading {} (checkpoints of older plexus versions hold no loop state)",
                loop_file.display()
            )
        })?;
        let ls: LoopState = serde_json::from_str(&text).with_context(|| format!("reading {}", loop_file.display()))?;
        agent.load_optim_state(&optim, ls.updates)?;
        let rf = replay_file(&run, state.step);
        let saved: std::collections::HashMap<String, tch::Tensor> = tch::Tensor::read_safetensors(&rf)
            .map_err(|e| anyhow::anyhow!("reading {}: {}", rf.display(), checkpoint::torch_message(&e)))?
            .into_iter()
            .collect();
        let floats = |name: &str| -> Result<Vec<f32>> {
            let t = saved.get(name).with_context(|| format!("{} lacks `{name}`", rf.display()))?;
            // f32 → f64 → f32 is exact.
            Ok(crate::host::values(t).into_iter().map(|v| v as f32).collect())
        };
        replay.restore(floats("states")?, floats("actions")?, ls.replay_stored, ls.replay_next)?;
        stats = saved.get("stats").map(|s| s.to_device(device));
        env.restore(ls.env)?;
        (rng, env_steps, updates, next_eval, next_ckpt, stat_updates, last) =
            (ls.rng, ls.env_steps, ls.updates, ls.next_eval, ls.next_ckpt, ls.stat_updates, ls.last);
        // metrics.csv as it was at the checkpoint.
        let metrics = run.file("metrics.csv");
        let records = match metrics.is_file() {
            true => csv::Reader::from_reader(crate::input_file::open_regular(&metrics)?).into_records().collect(),
            false => Vec::new(),
        };
        for row in records {
            let row = row.with_context(|| format!("reading {}", metrics.display()))?;
            if row.get(0).and_then(|v| v.parse::<u64>().ok()).is_some_and(|step| step <= env_steps) {
                rows.push(row.iter().map(String::from).collect());
            }
        }
        opened.resumed(&run)?;
    }
    // A resumed run logs again from its first evaluation after the checkpoint: TensorBoard drops
    // what the killed process logged from there on.
    let mut board = match cfg.log.tensorboard {
        true => {
            let mut b =
                crate::tensorboard::EventWriter::create(&run.path, if env_steps > 0 { env_steps + 1 } else { 0 })?;
            b.text(env_steps, "config", &format!("```yaml\n{config_yaml}```"))?;
            Some(b)
        }
        false => None,
    };
    if opts.verbose {
        eprintln!(
            "{}: {} on {} ({} parameters); random policy: success {:.3}, time at goal {:.3}; straight at \
             the goal: success {:.3}, time at goal {:.3}{}",
            cfg.name,
            exp.topology.kind(),
            crate::device::describe(device),
            agent.num_params(),
            random_success,
            random_time,
            straight_success,
            straight_time,
            if opts.resume { format!("; resumed at {env_steps} environment steps") } else { String::new() }
        );
    }
    let mut guard = DivergenceGuard::new(&UPDATE_STATS, device);
    while env_steps < t.env_steps {
        // One rollout: an episode of every environment.
        let random = env_steps < t.prefill_env_steps;
        let goals = env.goals().to_vec();
        let mut states = env.obs().to_vec();
        let mut actions = Vec::with_capacity(2 * n * t_len);
        let mut reached = vec![false; n];
        for _ in 0..t_len {
            let a = if random {
                (0..2 * n).map(|_| rng.gen_range(-1.0f32..=1.0)).collect()
            } else {
                let eps = normals(&mut rng, 2 * n);
                agent.act(env.obs(), &goals, Some(&eps))
            };
            let out = env.step(&a);
            for (r, &w) in reached.iter_mut().zip(&out.reward) {
                *r |= w > 0.0;
            }
            actions.extend_from_slice(&a);
            states.extend_from_slice(&out.obs);
        }
        replay.add_rollout(&states, &actions, n);
        env_steps += (n * t_len) as u64;
        let train_success = reached.iter().filter(|&&r| r).count() as f64 / n as f64;

        if env_steps >= t.prefill_env_steps {
            let first_update = updates + 1;
            let mut rollout_stats = Vec::with_capacity(t.updates_per_rollout);
            for _ in 0..t.updates_per_rollout {
                let batch = replay.sample(t.batch_size, cfg.crl.discount, &mut rng);
                let eps = normals(&mut rng, 2 * t.batch_size);
                let s = agent.update(&batch, &eps, t.lr);
                updates += 1;
                rollout_stats.push(s.shallow_clone());
                stats = Some(match stats.take() {
                    Some(acc) => acc + s,
                    None => s,
                });
                stat_updates += 1;
            }
            // One record per rollout, of every update's statistics.
            guard.at(first_update);
            guard.record_rows(&tch::Tensor::stack(&rollout_stats, 0));
            if let Some(what) = divergence(&guard, first_update..=updates, &agent) {
                anyhow::bail!(
                    "{}: {what} (in the rollout that ended at {env_steps} environment steps); metrics up to here are \
                     in {}, and no checkpoint after the divergence was written (lower train.lr, or set \
                     train.clip_grad_norm)",
                    cfg.name,
                    run.file("metrics.csv").display()
                );
            }
        }

        let done = env_steps >= t.env_steps;
        if env_steps >= next_eval || done {
            next_eval = env_steps + cfg.log.eval_every;
            let episodes = evaluate(&spec, &seeds, |s, g| agent.act(s, g, None));
            let (success, time) = episodes.rates();
            last = (success, time);
            last_episodes = Some(episodes);
            let means: Vec<f64> = match stats.take() {
                Some(acc) => crate::host::values(&(acc / stat_updates as f64)),
                None => vec![f64::NAN; UPDATE_STATS.len()],
            };
            stat_updates = 0;
            let secs = start.elapsed().as_secs_f64();
            let mut row = vec![env_steps.to_string(), updates.to_string(), success.to_string(), time.to_string()];
            row.extend(means.iter().map(|v| if v.is_nan() { String::new() } else { v.to_string() }));
            row.extend([train_success.to_string(), format!("{secs:.3}")]);
            rows.push(row);
            run.write_table("metrics.csv", &COLUMNS, &rows)?;
            if let Some(b) = board.as_mut() {
                let mut values =
                    vec![("eval/success", success), ("eval/time_at_goal", time), ("train/success", train_success)];
                values.extend(UPDATE_STATS.iter().zip(&means).filter(|(_, v)| v.is_finite()).map(|(k, v)| (*k, *v)));
                let tagged: Vec<(String, f64)> = values
                    .iter()
                    .map(|(k, v)| (if k.contains('/') { k.to_string() } else { format!("train/{k}") }, *v))
                    .collect();
                let refs: Vec<(&str, f64)> = tagged.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                b.scalars(env_steps, &refs)?;
            }
            if opts.verbose {
                eprintln!(
                    "  env steps {env_steps:>9}  updates {updates:>7}  success {success:.3}  time at goal {time:.3}  \
                     critic {:.4}  accuracy {:.3}  ({secs:.1}s)",
                    means[0], means[2]
                );
            }
        }
        if (cfg.log.checkpoint_every > 0 && env_steps >= next_ckpt) || done {
            next_ckpt = env_steps + cfg.log.checkpoint_every.max(1);
            // The loop's state first, then the checkpoint, whose marker commits all of it.
            let (states, actions, stored, next) = replay.contents();
            let mut tensors =
                vec![("states", tch::Tensor::from_slice(states)), ("actions", tch::Tensor::from_slice(actions))];
            if let Some(s) = &stats {
                tensors.push(("stats", crate::host::to_cpu(s)));
            }
            let mut files_crc32 = std::collections::BTreeMap::new();
            let replay_path = replay_file(&run, env_steps);
            atomic_write_with(&replay_path, |p| {
                let refs: Vec<(&str, &tch::Tensor)> = tensors.iter().map(|(k, t)| (*k, t)).collect();
                tch::Tensor::write_safetensors(&refs, p)?;
                files_crc32.insert(file_name(&replay_path), checkpoint::crc32_of(p)?);
                Ok(())
            })?;
            let ls = LoopState {
                env_steps,
                updates,
                next_eval,
                next_ckpt,
                stat_updates,
                last,
                rng: rng.clone(),
                env: env.state(),
                replay_stored: stored,
                replay_next: next,
            };
            let loop_json = serde_json::to_string(&ls)?;
            let loop_path = loop_state_file(&run, env_steps);
            atomic_write(&loop_path, loop_json.as_bytes())?;
            let mut crc = flate2::Crc::new();
            crc.update(loop_json.as_bytes());
            files_crc32.insert(file_name(&loop_path), crc.sum());
            let state = TrainerState::at(env_steps, updates, files_crc32);
            // Pruning the oldest also removes its loop state and replay buffer (files_crc32 lists them).
            checkpoint::save(&run, &state, &agent.vs, &agent.optim_state(), cfg.log.keep_checkpoints)?;
        }
        if opts.crash_after.is_some_and(|c| env_steps >= c) && !done {
            anyhow::bail!("{}: simulated crash after {env_steps} environment steps", cfg.name);
        }
    }
    checkpoint::save_weights(&run.final_checkpoint(), |p| Ok(agent.vs.save(p)?))?;
    // The final evaluation's episodes, split by task; a resume that had nothing left to train
    // evaluates the (deterministic) final policy again, which gives the same episodes.
    let trained = last_episodes.unwrap_or_else(|| evaluate(&spec, &seeds, |s, g| agent.act(s, g, None)));
    let summary = RlSummary {
        name: cfg.name.clone(),
        topology: exp.topology.kind().to_string(),
        topology_label: exp.topology.label(),
        depth: cfg.network.depth,
        units: agent.actor.units(),
        params: agent.num_params(),
        env_steps,
        updates,
        success: last.0,
        time_at_goal: last.1,
        random_success,
        random_time_at_goal: random_time,
        straight_success,
        straight_time_at_goal: straight_time,
        blocked_share: trained.blocked_share(),
        success_blocked: trained.success_where(true),
        straight_success_blocked: straight_eval.success_where(true),
        random_success_blocked: random_eval.success_where(true),
        seconds: start.elapsed().as_secs_f64(),
        device: crate::device::describe(device),
    };
    lifecycle::finish(&run, &summary)?;
    Ok(summary)
}
