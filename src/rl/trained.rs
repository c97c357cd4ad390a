//! A finished `plexus rl` run, opened for what comes after training: its config and its agent
//! with the final weights, through the loader of `plexus train`'s runs
//! ([`crate::train::checkpoint::load_final`]: present, checksummed, finite); and the final policy
//! evaluated again on tasks the run never saw (`plexus rl --eval`).

use super::config::RlExperiment;
use super::crl::Agent;
use super::env::VecEnv;
use super::trainer::{evaluate, random_policy, straight_line_policy, Episodes};
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
use std::path::Path;

/// A finished RL run: its directory, its config (as resolved when it ran) and its agent with the
/// final weights loaded.
pub struct TrainedAgent {
    pub dir: RunDir,
    pub exp: RlExperiment,
    pub agent: Agent,
}

/// Opens the `plexus rl` run at `path` on `device` (the config's if `None`).
pub fn open(path: &Path, device: Option<tch::Device>) -> Result<TrainedAgent> {
    let file = path.join("config.yaml");
    if !file.is_file() {
        bail!("{} is not a `plexus rl` run directory (no config.yaml)", path.display());
    }
    let dir = RunDir::open(path)?;
    let exp = RlExperiment::from_file(&file, &[])?;
    let cfg = &exp.config;
    let device = match device {
        Some(d) => d,
        None => crate::device::resolve(crate::device::parse_device(&cfg.device).map_err(anyhow::Error::msg)?)?,
    };
    let mut agent = crate::device::with_seed(cfg.seed, || Agent::new(cfg, exp.topology.as_ref(), device));
    let weights = dir.final_weights();
    crate::train::checkpoint::load_final(&mut agent.vs, &dir, &weights, "rl")?;
    Ok(TrainedAgent { dir, exp, agent })
}

/// Seeds of `n` evaluation tasks disjoint from the run's own evaluation tasks
/// ([`super::trainer::eval_seeds`], which start at another base: the two sets would meet only
/// beyond a million tasks).
pub fn held_out_seeds(seed: u64, n: usize) -> Vec<u64> {
    VecEnv::seeds(seed.wrapping_add(0x4e1d_0000_0000), n)
}

/// The final policy (deterministic, `tanh(μ)`), the straight-line walker and the random policy,
/// one episode each on the same `n` held-out tasks.
pub struct HeldOut {
    pub trained: Episodes,
    pub straight: Episodes,
    pub random: Episodes,
}

/// Evaluates `run` on `n` held-out tasks.
pub fn held_out(run: &TrainedAgent, n: usize) -> HeldOut {
    let cfg = &run.exp.config;
    let spec = cfg.env.spec();
    let seeds = held_out_seeds(cfg.seed, n);
    HeldOut {
        trained: evaluate(&spec, &seeds, |s, g| run.agent.act(s, g, None)),
        straight: straight_line_policy(&spec, &seeds),
        random: random_policy(&spec, &seeds, cfg.seed),
    }
}

/// The Wilson score interval of a success rate at 95 %: `successes` of `n`.
pub fn wilson95(successes: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let (z, n) = (1.959_963_984_540_054, n as f64);
    let p = successes as f64 / n;
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    (centre - half, centre + half)
}

/// The mean share of steps at the goal and its 95 % interval over the tasks (normal
/// approximation: the tasks are independent, and `plexus rl --eval` runs hundreds).
pub fn time_at_goal95(e: &Episodes) -> (f64, f64, f64) {
    let shares: Vec<f64> = e.steps_at_goal.iter().map(|&s| s as f64 / e.episode_length as f64).collect();
    let n = shares.len() as f64;
    let mean = shares.iter().sum::<f64>() / n;
    let var = shares.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let half = 1.959_963_984_540_054 * (var / n).sqrt();
    (mean, mean - half, mean + half)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against published values (Newcombe 1998, Table I: 81 of 263 → 0.2553–0.3662; 0 of 10 →
    /// 0–0.2775).
    #[test]
    fn the_wilson_interval_matches_published_values() {
        let (lo, hi) = wilson95(81, 263);
        assert!((lo - 0.2553).abs() < 5e-5 && (hi - 0.3662).abs() < 5e-5, "{lo} {hi}");
        let (lo, hi) = wilson95(0, 10);
        assert!(lo.abs() < 1e-12 && (hi - 0.2775).abs() < 5e-5, "{lo} {hi}");
    }

    /// The held-out tasks share no seed with the run's evaluation tasks.
    #[test]
    fn held_out_tasks_are_not_the_runs_evaluation_tasks() {
        let own: std::collections::HashSet<u64> = super::super::trainer::eval_seeds(7, 2000).into_iter().collect();
        assert!(held_out_seeds(7, 2000).iter().all(|s| !own.contains(s)));
    }
}
