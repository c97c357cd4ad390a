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
//! have it in the run's root) and the success figure (described in kinds.rs, drawn by plot/curves.rs). A checkpoint also holds what the loop needs
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
use crate::run_dir::RunDir;
use crate::train::checkpoint::{self, Checkpointer, ExtraFile, TrainerState};
use crate::train::divergence::DivergenceGuard;
use crate::train::run_log::{open_board, LogOutput, LogRow, RunLog};
use crate::train::{engine, lifecycle};
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
    /// checkpoint due then, if any: [`engine::CrashAfter`], as `plexus train`'s).
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

/// The checkpoint's loop state at `step` (a file in `checkpoints/`).
fn loop_state_name(step: u64) -> String {
    format!("step_{step}.rl.json")
}

/// The checkpoint's replay buffer at `step` (a file in `checkpoints/`).
fn replay_name(step: u64) -> String {
    format!("step_{step}.replay.safetensors")
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

/// A row of an RL run's `metrics.csv`: an evaluation, with the means of the update statistics
/// since the row before.
struct RlRow {
    env_steps: u64,
    updates: u64,
    success: f64,
    time_at_goal: f64,
    /// The means of [`UPDATE_STATS`], `[5]` (NaN, written empty, before the first update).
    means: Vec<f64>,
    train_success: f64,
    /// Seconds since the process started (written to the millisecond).
    seconds: f64,
}

impl LogRow for RlRow {
    const COLUMNS: &'static [&'static str] = &COLUMNS;

    fn step(&self) -> u64 {
        self.env_steps
    }

    fn scalars(&self) -> Vec<(String, f64)> {
        let mut values = vec![
            ("eval/success".to_string(), self.success),
            ("eval/time_at_goal".to_string(), self.time_at_goal),
            ("train/success".to_string(), self.train_success),
        ];
        let stats = UPDATE_STATS.iter().zip(&self.means).filter(|(_, v)| v.is_finite());
        values.extend(stats.map(|(k, v)| (format!("train/{k}"), *v)));
        values
    }

    fn message(&self) -> String {
        format!("success {:.3}, time at goal {:.3}", self.success, self.time_at_goal)
    }

    fn write(dir: &RunDir, rows: &[Self]) -> Result<()> {
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let mut row = vec![r.env_steps.to_string(), r.updates.to_string()];
                row.extend([r.success.to_string(), r.time_at_goal.to_string()]);
                row.extend(r.means.iter().map(|v| if v.is_nan() { String::new() } else { v.to_string() }));
                row.extend([r.train_success.to_string(), format!("{:.3}", r.seconds)]);
                row
            })
            .collect();
        dir.write_table("metrics.csv", Self::COLUMNS, &cells)
    }

    /// The rows up to and including `step` (the checkpoint's environment steps).
    fn read(dir: &RunDir, step: u64) -> Result<Vec<Self>> {
        let metrics = dir.file("metrics.csv");
        if !metrics.is_file() {
            return Ok(Vec::new());
        }
        let mut rows = Vec::new();
        for (i, record) in
            csv::Reader::from_reader(crate::input_file::open_regular(&metrics)?).into_records().enumerate()
        {
            let record = record.with_context(|| format!("reading {}", metrics.display()))?;
            let cell = |c: usize| record.get(c).unwrap_or_default();
            let bad = || format!("{} line {}: not a row of {}", metrics.display(), i + 2, COLUMNS.join(", "));
            let number = |c: usize| -> Result<f64> {
                match cell(c) {
                    "" => Ok(f64::NAN),
                    v => v.parse().with_context(bad),
                }
            };
            let row = RlRow {
                env_steps: cell(0).parse().with_context(bad)?,
                updates: cell(1).parse().with_context(bad)?,
                success: number(2)?,
                time_at_goal: number(3)?,
                means: (4..4 + UPDATE_STATS.len()).map(number).collect::<Result<_>>()?,
                train_success: number(9)?,
                seconds: number(10)?,
            };
            if row.env_steps <= step {
                rows.push(row);
            }
        }
        Ok(rows)
    }
}

/// Trains `exp` into the run directory `dir` on the run engine ([`engine::run`] drives
/// [`Rollouts`]: one rollout and its updates per iteration, an evaluation row when due, a
/// checkpoint with the replay buffer and the loop state when due).
pub fn train(exp: &RlExperiment, dir: &Path, opts: &RlOptions) -> Result<RlSummary> {
    let cfg = &exp.config;
    // Before anything is created: a replay buffer that cannot fit is a config error.
    let replay = new_replay(exp)?;
    let request = crate::device::parse_device(&cfg.device).map_err(anyhow::Error::msg)?;
    let device = crate::device::resolve(request)?;
    let agent = crate::device::with_seed(cfg.seed, || Agent::new(cfg, exp.topology.as_ref(), device));
    let run = RunDir::new(dir);
    let config_yaml = cfg.to_yaml();
    let mut l = Rollouts::new(exp, &run, agent, replay, device);
    let mode = engine::OpenMode { resume: opts.resume, overwrite: opts.overwrite, writer: true };
    let numerics = crate::train::numerics::Numerics::here(device, 1);
    let _open = engine::open(&run, &config_yaml, mode, &RESUME_POLICY, &numerics, |state, _| l.resume(state))?;
    // A resumed run logs again from its first evaluation after the checkpoint: TensorBoard drops
    // what the killed process logged from there on.
    let steps = l.env_steps;
    let board = match cfg.log.tensorboard {
        true => Some(open_board(&run.path, if steps > 0 { steps + 1 } else { 0 }, steps, &config_yaml)?),
        false => None,
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = LogOutput { progress: opts.verbose && terminal, log_lines: !terminal, main: true };
    let rows = std::mem::take(&mut l.log.rows);
    l.log = RunLog::new(&cfg.name, steps, cfg.train.env_steps, rows, output, board);
    if opts.verbose {
        l.say_start(opts.resume);
    }
    l.verbose = opts.verbose;
    engine::run(&mut l, engine::CrashAfter(opts.crash_after), &cfg.name)?;
    l.log.finish();
    let summary = l.summary();
    lifecycle::finish(&run, &summary)?;
    Ok(summary)
}

/// `plexus rl`'s loop state as the run engine drives it: one iteration is one rollout (an episode
/// of every environment) and its updates, with an evaluation row when due.
struct Rollouts<'a> {
    exp: &'a RlExperiment,
    run: &'a RunDir,
    agent: Agent,
    replay: Replay,
    env: VecEnv,
    rng: RlRng,
    device: tch::Device,
    spec: EnvSpec,
    /// The evaluation tasks, and the two baselines on them.
    seeds: Vec<u64>,
    random_eval: Episodes,
    straight_eval: Episodes,
    env_steps: u64,
    updates: u64,
    next_eval: u64,
    next_ckpt: u64,
    /// The update statistics summed since the last row (`[UPDATE_STATS.len()]` on the device),
    /// over `stat_updates` updates.
    stats: Option<tch::Tensor>,
    stat_updates: u64,
    /// `metrics.csv`'s rows, their TensorBoard scalars and the progress bar.
    log: RunLog<RlRow>,
    /// The last evaluation's `(success, time_at_goal)`, and its episodes (for the blocked/clear
    /// split of the summary).
    last: (f64, f64),
    last_episodes: Option<Episodes>,
    guard: DivergenceGuard,
    checkpoints: Checkpointer,
    start: Instant,
    verbose: bool,
}

impl<'a> Rollouts<'a> {
    /// A new run's state (the baselines measured on the evaluation tasks).
    fn new(exp: &'a RlExperiment, run: &'a RunDir, agent: Agent, replay: Replay, device: tch::Device) -> Self {
        let cfg = &exp.config;
        let spec = cfg.env.spec();
        let seeds = eval_seeds(cfg.seed, cfg.log.eval_envs);
        Rollouts {
            exp,
            run,
            agent,
            replay,
            env: VecEnv::new(spec.clone(), &VecEnv::seeds(cfg.seed, cfg.env.num_envs)),
            rng: RlRng::seed_from_u64(cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1)),
            device,
            random_eval: random_policy(&spec, &seeds, cfg.seed),
            straight_eval: straight_line_policy(&spec, &seeds),
            spec,
            seeds,
            env_steps: 0,
            updates: 0,
            next_eval: 0,
            next_ckpt: cfg.log.checkpoint_every.max(1),
            stats: None,
            stat_updates: 0,
            log: RunLog::new(&cfg.name, 0, cfg.train.env_steps, Vec::new(), LogOutput::hidden(), None),
            last: (0.0, 0.0),
            last_episodes: None,
            guard: DivergenceGuard::new(&UPDATE_STATS, device),
            checkpoints: Checkpointer {
                every: cfg.log.checkpoint_every,
                keep: cfg.log.keep_checkpoints,
                accumulation: 1,
            },
            start: Instant::now(),
            verbose: false,
        }
    }

    /// Loads the checkpoint `state` (verified against its marker's checksums by
    /// [`checkpoint::load`]): the networks, the optimizers, the replay buffer, every environment's
    /// state and stream, the trainer's stream, the counters, and `metrics.csv` as it was then.
    fn resume(&mut self, state: &TrainerState) -> Result<()> {
        let run = self.run;
        let optim = checkpoint::load(run, state, &mut self.agent.vs)?;
        let loop_file = run.checkpoints_dir().join(loop_state_name(state.step));
        let text = std::fs::read_to_string(&loop_file).with_context(|| {
            format!(
                "--resume: reading {} (checkpoints of older plexus versions hold no loop state)",
                loop_file.display()
            )
        })?;
        let ls: LoopState = serde_json::from_str(&text).with_context(|| format!("reading {}", loop_file.display()))?;
        self.agent.load_optim_state(&optim, ls.updates)?;
        let rf = run.checkpoints_dir().join(replay_name(state.step));
        let saved: std::collections::HashMap<String, tch::Tensor> = tch::Tensor::read_safetensors(&rf)
            .map_err(|e| anyhow::anyhow!("reading {}: {}", rf.display(), checkpoint::torch_message(&e)))?
            .into_iter()
            .collect();
        let floats = |name: &str| -> Result<Vec<f32>> {
            let t = saved.get(name).with_context(|| format!("{} lacks `{name}`", rf.display()))?;
            // f32 → f64 → f32 is exact.
            Ok(crate::host::values(t).into_iter().map(|v| v as f32).collect())
        };
        self.replay.restore(floats("states")?, floats("actions")?, ls.replay_stored, ls.replay_next)?;
        self.stats = saved.get("stats").map(|s| s.to_device(self.device));
        self.env.restore(ls.env)?;
        (self.rng, self.env_steps, self.updates, self.next_eval, self.next_ckpt, self.stat_updates, self.last) =
            (ls.rng, ls.env_steps, ls.updates, ls.next_eval, ls.next_ckpt, ls.stat_updates, ls.last);
        // metrics.csv as it was at the checkpoint.
        self.log.rows = RlRow::read(run, self.env_steps)?;
        Ok(())
    }

    /// The line a verbose run starts with: the network, the device and both baselines.
    fn say_start(&self, resumed: bool) {
        let (cfg, (rs, rt), (ss, st)) = (&self.exp.config, self.random_eval.rates(), self.straight_eval.rates());
        self.log.say(format!(
            "{}: {} on {} ({} parameters); random policy: success {rs:.3}, time at goal {rt:.3}; straight at \
             the goal: success {ss:.3}, time at goal {st:.3}{}",
            cfg.name,
            self.exp.topology.kind(),
            crate::device::describe(self.device),
            self.agent.num_params(),
            if resumed { format!("; resumed at {} environment steps", self.env_steps) } else { String::new() }
        ));
    }

    /// One rollout (an episode of every environment) into the replay buffer; returns the share of
    /// environments that reached their goal.
    fn rollout(&mut self) -> f64 {
        let t = &self.exp.config.train;
        let (n, t_len) = (self.exp.config.env.num_envs, self.exp.config.env.episode_length);
        let random = self.env_steps < t.prefill_env_steps;
        let goals = self.env.goals().to_vec();
        let mut states = self.env.obs().to_vec();
        let mut actions = Vec::with_capacity(2 * n * t_len);
        let mut reached = vec![false; n];
        for _ in 0..t_len {
            let a = if random {
                (0..2 * n).map(|_| self.rng.gen_range(-1.0f32..=1.0)).collect()
            } else {
                let eps = normals(&mut self.rng, 2 * n);
                self.agent.act(self.env.obs(), &goals, Some(&eps))
            };
            let out = self.env.step(&a);
            for (r, &w) in reached.iter_mut().zip(&out.reward) {
                *r |= w > 0.0;
            }
            actions.extend_from_slice(&a);
            states.extend_from_slice(&out.obs);
        }
        self.replay.add_rollout(&states, &actions, n);
        self.env_steps += (n * t_len) as u64;
        reached.iter().filter(|&&r| r).count() as f64 / n as f64
    }

    /// The rollout's updates (after the prefill), their statistics summed and recorded by the
    /// divergence guard (one record per rollout); an error naming what went non-finite.
    fn update(&mut self) -> Result<()> {
        let (cfg, t) = (&self.exp.config, &self.exp.config.train);
        if self.env_steps < t.prefill_env_steps {
            return Ok(());
        }
        let first_update = self.updates + 1;
        let mut rollout_stats = Vec::with_capacity(t.updates_per_rollout);
        for _ in 0..t.updates_per_rollout {
            let batch = self.replay.sample(t.batch_size, cfg.crl.discount, &mut self.rng);
            let eps = normals(&mut self.rng, 2 * t.batch_size);
            let s = self.agent.update(&batch, &eps, t.lr);
            self.updates += 1;
            rollout_stats.push(s.shallow_clone());
            self.stats = Some(match self.stats.take() {
                Some(acc) => acc + s,
                None => s,
            });
            self.stat_updates += 1;
        }
        self.guard.at(first_update);
        self.guard.record_rows(&tch::Tensor::stack(&rollout_stats, 0));
        if let Some(what) = divergence(&self.guard, first_update..=self.updates, &self.agent) {
            anyhow::bail!(
                "{}: {what} (in the rollout that ended at {} environment steps); metrics up to here are in {}, and \
                 no checkpoint after the divergence was written (lower train.lr, or set train.clip_grad_norm)",
                cfg.name,
                self.env_steps,
                self.run.file("metrics.csv").display()
            );
        }
        Ok(())
    }

    /// The evaluation row: the deterministic policy on the evaluation tasks, with the update
    /// statistics' means since the last row; to `metrics.csv`, TensorBoard and (verbose) stderr.
    fn eval_row(&mut self, train_success: f64) -> Result<()> {
        let cfg = &self.exp.config;
        let env_steps = self.env_steps;
        self.next_eval = env_steps + cfg.log.eval_every;
        let agent = &self.agent;
        let episodes = evaluate(&self.spec, &self.seeds, |s, g| agent.act(s, g, None));
        let (success, time) = episodes.rates();
        self.last = (success, time);
        self.last_episodes = Some(episodes);
        let means: Vec<f64> = match self.stats.take() {
            Some(acc) => crate::host::values(&(acc / self.stat_updates as f64)),
            None => vec![f64::NAN; UPDATE_STATS.len()],
        };
        self.stat_updates = 0;
        let secs = self.start.elapsed().as_secs_f64();
        let row = RlRow {
            env_steps,
            updates: self.updates,
            success,
            time_at_goal: time,
            means,
            train_success,
            seconds: secs,
        };
        let (critic, accuracy) = (row.means[0], row.means[2]);
        self.log.row(row, Vec::new())?;
        self.log.write(self.run)?;
        if self.verbose {
            self.log.say(format!(
                "  env steps {env_steps:>9}  updates {:>7}  success {success:.3}  time at goal {time:.3}  \
                 critic {critic:.4}  accuracy {accuracy:.3}  ({secs:.1}s)",
                self.updates
            ));
        }
        Ok(())
    }

    /// What `summary.json` records. The final evaluation's episodes are split by task; a resume
    /// that had nothing left to train evaluates the (deterministic) final policy again, which
    /// gives the same episodes.
    fn summary(self) -> RlSummary {
        let cfg = &self.exp.config;
        let agent = &self.agent;
        let trained =
            self.last_episodes.unwrap_or_else(|| evaluate(&self.spec, &self.seeds, |s, g| agent.act(s, g, None)));
        let ((random_success, random_time), (straight_success, straight_time)) =
            (self.random_eval.rates(), self.straight_eval.rates());
        RlSummary {
            name: cfg.name.clone(),
            topology: self.exp.topology.kind().to_string(),
            topology_label: self.exp.topology.label(),
            depth: cfg.network.depth,
            units: agent.actor.units(),
            params: agent.num_params(),
            env_steps: self.env_steps,
            updates: self.updates,
            success: self.last.0,
            time_at_goal: self.last.1,
            random_success,
            random_time_at_goal: random_time,
            straight_success,
            straight_time_at_goal: straight_time,
            blocked_share: trained.blocked_share(),
            success_blocked: trained.success_where(true),
            straight_success_blocked: self.straight_eval.success_where(true),
            random_success_blocked: self.random_eval.success_where(true),
            seconds: self.start.elapsed().as_secs_f64(),
            device: crate::device::describe(self.device),
        }
    }
}

impl engine::Trainer for Rollouts<'_> {
    fn progress(&self) -> u64 {
        self.env_steps
    }

    fn unit(&self) -> &'static str {
        "environment steps"
    }

    fn done(&self) -> bool {
        self.env_steps >= self.exp.config.train.env_steps
    }

    fn iterate(&mut self) -> Result<()> {
        let train_success = self.rollout();
        self.update()?;
        if self.env_steps >= self.next_eval || self.done() {
            self.eval_row(train_success)?;
        }
        self.log.at(self.env_steps);
        Ok(())
    }

    fn checkpoint_due(&self) -> bool {
        self.exp.config.log.checkpoint_every > 0 && self.env_steps >= self.next_ckpt
    }

    fn checkpoint(&mut self, _last: bool) -> Result<()> {
        self.next_ckpt = self.env_steps + self.exp.config.log.checkpoint_every.max(1);
        // The loop's state first, then the checkpoint, whose marker commits all of it (and whose
        // pruning removes them with it).
        let (states, actions, stored, next) = self.replay.contents();
        let mut tensors =
            vec![("states", tch::Tensor::from_slice(states)), ("actions", tch::Tensor::from_slice(actions))];
        if let Some(s) = &self.stats {
            tensors.push(("stats", crate::host::to_cpu(s)));
        }
        let ls = LoopState {
            env_steps: self.env_steps,
            updates: self.updates,
            next_eval: self.next_eval,
            next_ckpt: self.next_ckpt,
            stat_updates: self.stat_updates,
            last: self.last,
            rng: self.rng.clone(),
            env: self.env.state(),
            replay_stored: stored,
            replay_next: next,
        };
        let loop_json = serde_json::to_string(&ls)?;
        let extra = vec![
            ExtraFile {
                name: replay_name(self.env_steps),
                write: Box::new(move |p| {
                    let refs: Vec<(&str, &tch::Tensor)> = tensors.iter().map(|(k, t)| (*k, t)).collect();
                    Ok(tch::Tensor::write_safetensors(&refs, p)?)
                }),
            },
            ExtraFile {
                name: loop_state_name(self.env_steps),
                write: Box::new(move |p| Ok(std::fs::write(p, loop_json.as_bytes())?)),
            },
        ];
        let at = (self.env_steps, self.updates);
        self.checkpoints.save_with(self.run, &self.agent.vs, &self.agent.optim_state(), at, extra)
    }

    fn final_weights(&mut self) -> Result<()> {
        checkpoint::save_weights(&self.run.final_checkpoint(), |p| Ok(self.agent.vs.save(p)?))
    }
}
