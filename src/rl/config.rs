//! The `plexus rl` schema: one YAML file per run, parsed as strictly as the training config
//! (`crate::config`: unknown keys rejected, every value checked before any work, errors naming the
//! file, line, key, value and what is allowed, `--set key=value` overrides through the same checks).
//!
//! ```yaml
//! name: crl-maze-d4
//! seed: 0
//! device: auto
//! env: {layout: u, num_envs: 256, episode_length: 100, max_step: 0.05, goal_radius: 0.05}
//! network: {width: 256, depth: 4, block_size: 4, repr_dim: 64,
//!           topology: {kind: residual, granularity: block}}
//! crl: {loss: symmetric, discount: 0.99, logsumexp_penalty: 0.1}
//! train: {env_steps: 10000000, batch_size: 256, lr: 3.0e-4, updates_per_rollout: 64}
//! log: {eval_every: 200000, eval_envs: 256, checkpoint_every: 0}
//! ```
//!
//! A schema of its own rather than a new data kind of `Config`: an RL run has no dataset, no
//! single model and no step-indexed optimizer schedule; it has an environment, three encoders and
//! a budget in environment steps. Sharing `Config` would have meant sections that mean nothing
//! here (`data`, `model`, `train.steps`) and checks that do not apply. The parser
//! ([`crate::config::parse_document`]) and the error type are shared.

use crate::config::{locate_error, parse_document, ConfigError, KindSection, OptionError, Override, TrainConfig};
use crate::rl::env::{EnvSpec, Layout};
use crate::topology::{Granularity, TopologySpec};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RlConfig {
    /// Run name; the run directory defaults to `runs/<name>`.
    pub name: String,
    /// Seeds initialisation, the environments, exploration and replay sampling.
    #[serde(default)]
    pub seed: u64,
    /// `auto`, `cpu`, `cuda` or `cuda:N` (where the networks run; the maze runs on the host).
    #[serde(default = "defaults::device")]
    pub device: String,
    pub env: EnvConfig,
    pub network: NetworkConfig,
    #[serde(default)]
    pub crl: CrlConfig,
    pub train: RlTrainConfig,
    #[serde(default)]
    pub log: RlLogConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// `u` (U-maze) or `open`.
    #[serde(default = "defaults::layout")]
    pub layout: Layout,
    /// Parallel environments stepped together (one episode each per rollout).
    pub num_envs: usize,
    /// Steps per episode.
    #[serde(default = "defaults::episode_length")]
    pub episode_length: usize,
    /// Largest move per step and axis, in arena sides.
    #[serde(default = "defaults::max_step")]
    pub max_step: f32,
    /// Reward radius ε.
    #[serde(default = "defaults::goal_radius")]
    pub goal_radius: f32,
}

impl EnvConfig {
    /// The environment these options describe (what every one of `num_envs` copies runs).
    pub fn spec(&self) -> EnvSpec {
        EnvSpec {
            layout: self.layout,
            max_step: self.max_step,
            goal_radius: self.goal_radius,
            episode_length: self.episode_length,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// Width `D` of every encoder's stack.
    #[serde(default = "defaults::width")]
    pub width: usize,
    /// Layers (Linear → LayerNorm → Swish) in each encoder's stack (Wang et al.'s depth).
    pub depth: usize,
    /// Layers per block at `granularity: block` (Wang et al. and ANCRe §5.3: 4).
    #[serde(default = "defaults::block_size")]
    pub block_size: usize,
    /// Dimension of the representations φ(s, a) and ψ(g).
    #[serde(default = "defaults::repr_dim")]
    pub repr_dim: usize,
    /// The topology of all three encoders (φ, ψ and the actor π): `kind` and its options.
    pub topology: KindSection,
}

/// Which InfoNCE the critic minimises over the `[B, B]` logits `ℓ_ij = φ(s_i, a_i)·ψ(g_j)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InfoNce {
    /// `mean_i [logsumexp_j ℓ_ij − ℓ_ii]` (each (s, a) picks its goal among the batch's goals).
    Forward,
    /// Forward plus backward: `mean_i [logsumexp_j ℓ_ij + logsumexp_j ℓ_ji − 2 ℓ_ii]`.
    Symmetric,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CrlConfig {
    #[serde(default = "defaults::loss")]
    pub loss: InfoNce,
    /// Discount γ of the hindsight-goal distribution: the goal of `(s_t, a_t)` is `s_{t+k}`,
    /// `P(k) ∝ γ^(k−1)` for `1 ≤ k ≤ T − t`.
    #[serde(default = "defaults::discount")]
    pub discount: f64,
    /// Coefficient of `mean_i (logsumexp_j ℓ_ij)²` added to the critic loss (0 = none).
    #[serde(default)]
    pub logsumexp_penalty: f64,
    /// Target entropy of the tanh-Gaussian actor (default `−action_dim = −2`).
    #[serde(default = "defaults::target_entropy")]
    pub target_entropy: f64,
}

impl Default for CrlConfig {
    fn default() -> Self {
        serde_yaml::from_str("{}").expect("every CrlConfig field has a default")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RlTrainConfig {
    /// Total environment steps (all environments together); ≥ one rollout.
    pub env_steps: u64,
    /// Transitions per gradient step (also the number of InfoNCE negatives + 1).
    #[serde(default = "defaults::batch_size")]
    pub batch_size: usize,
    /// AdamW learning rate of the critic, the actor and the entropy temperature.
    #[serde(default = "defaults::lr")]
    pub lr: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "defaults::betas")]
    pub betas: [f64; 2],
    #[serde(default = "defaults::eps")]
    pub eps: f64,
    /// Learning-rate multiplier of the topologies' own parameters.
    #[serde(default = "defaults::topology_lr_mult")]
    pub topology_lr_mult: f64,
    /// Clip each network's gradient norm to this value (none if absent).
    #[serde(default)]
    pub clip_grad_norm: Option<f64>,
    /// Gradient steps after each rollout (one episode of every environment).
    #[serde(default = "defaults::updates_per_rollout")]
    pub updates_per_rollout: usize,
    /// Environment steps with uniformly random actions before learning starts.
    #[serde(default)]
    pub prefill_env_steps: u64,
    /// Replay capacity in episodes (the oldest are overwritten).
    #[serde(default = "defaults::replay_episodes")]
    pub replay_episodes: usize,
}

impl RlTrainConfig {
    /// The optimizer settings in the trainer's form (AdamW, parameter groups as in `train`).
    pub fn optim(&self) -> TrainConfig {
        TrainConfig {
            optimizer: crate::config::Optimizer::Adamw,
            lr: self.lr,
            weight_decay: self.weight_decay,
            betas: self.betas,
            eps: self.eps,
            clip_grad_norm: self.clip_grad_norm,
            topology_lr_mult: self.topology_lr_mult,
            ..TrainConfig::default()
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RlLogConfig {
    /// Evaluate (and write a `metrics.csv` row) every this many environment steps; also after the
    /// first rollout and at the end.
    #[serde(default = "defaults::eval_every")]
    pub eval_every: u64,
    /// Evaluation environments (one episode each, deterministic actions, fixed seeds).
    #[serde(default = "defaults::eval_envs")]
    pub eval_envs: usize,
    /// Write a checkpoint every this many environment steps (0 = only at the end).
    #[serde(default)]
    pub checkpoint_every: u64,
    #[serde(default = "defaults::keep_checkpoints")]
    pub keep_checkpoints: usize,
    /// Also write TensorBoard event files in `<run>/tensorboard/` (each evaluation row as scalars,
    /// the config as text).
    #[serde(default = "defaults::tensorboard")]
    pub tensorboard: bool,
}

impl Default for RlLogConfig {
    fn default() -> Self {
        serde_yaml::from_str("{}").expect("every RlLogConfig field has a default")
    }
}

/// The defaults of the optional keys, one function per key (serde's `default = "…"` takes a path).
mod defaults {
    use super::{InfoNce, Layout};

    /// `device: auto`.
    pub fn device() -> String {
        "auto".into()
    }
    /// `log.tensorboard: true`.
    pub fn tensorboard() -> bool {
        true
    }
    /// `env.layout: u`.
    pub fn layout() -> Layout {
        Layout::U
    }
    /// `env.episode_length: 100`.
    pub fn episode_length() -> usize {
        100
    }
    /// `env.max_step: 0.05`.
    pub fn max_step() -> f32 {
        0.05
    }
    /// `env.goal_radius: 0.05`.
    pub fn goal_radius() -> f32 {
        0.05
    }
    /// `network.width: 256`.
    pub fn width() -> usize {
        256
    }
    /// `network.block_size: 4`.
    pub fn block_size() -> usize {
        4
    }
    /// `network.repr_dim: 64`.
    pub fn repr_dim() -> usize {
        64
    }
    /// `crl.loss: symmetric`.
    pub fn loss() -> InfoNce {
        InfoNce::Symmetric
    }
    /// `crl.discount: 0.99`.
    pub fn discount() -> f64 {
        0.99
    }
    /// `crl.target_entropy: -2`.
    pub fn target_entropy() -> f64 {
        -2.0
    }
    /// `train.batch_size: 256`.
    pub fn batch_size() -> usize {
        256
    }
    /// `train.lr: 3e-4`.
    pub fn lr() -> f64 {
        3e-4
    }
    /// `train.betas: [0.9, 0.999]`.
    pub fn betas() -> [f64; 2] {
        [0.9, 0.999]
    }
    /// `train.eps: 1e-8`.
    pub fn eps() -> f64 {
        1e-8
    }
    /// `train.topology_lr_mult: 1`.
    pub fn topology_lr_mult() -> f64 {
        1.0
    }
    /// `train.updates_per_rollout: 16`.
    pub fn updates_per_rollout() -> usize {
        16
    }
    /// `train.replay_episodes: 10000`.
    pub fn replay_episodes() -> usize {
        10_000
    }
    /// `log.eval_every: 10000`.
    pub fn eval_every() -> u64 {
        10_000
    }
    /// `log.eval_envs: 64`.
    pub fn eval_envs() -> usize {
        64
    }
    /// `log.keep_checkpoints: 2`.
    pub fn keep_checkpoints() -> usize {
        2
    }
}

/// A validated RL config with its resolved topology.
#[derive(Debug)]
pub struct RlExperiment {
    pub config: RlConfig,
    pub topology: Box<dyn TopologySpec>,
    /// Where the config came from (for messages).
    pub file: PathBuf,
}

impl RlExperiment {
    /// Reads the RL config at `path` (a bounded read of a regular file) and parses it as
    /// [`from_str`](Self::from_str) does.
    pub fn from_file(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let fail = |allowed: String| ConfigError {
            file: path.to_path_buf(),
            key: String::new(),
            value: None,
            allowed,
            line: None,
        };
        let text = crate::config::read_config_text(path).map_err(fail)?;
        Self::from_str(&text, path, overrides)
    }

    /// Parses an RL config from YAML `source` (named `file` in messages) with the `--set`
    /// `overrides`, validates it and resolves its topology against the network's stack.
    pub fn from_str(source: &str, file: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let (config, source) = parse_document::<RlConfig>(source, file, overrides)?;
        let at = |e: OptionError| locate_error(file, &source, overrides, "", e);
        config.validate().map_err(at)?;
        let n = &config.network;
        let stack = crate::rl::net::stack_info(n.width, n.depth, n.block_size);
        let topology = crate::topology::parse(&n.topology.kind, &n.topology.options, stack)
            .map_err(|e| locate_error(file, &source, overrides, "network.topology", e))?;
        if topology.granularity() == Granularity::Block && !n.depth.is_multiple_of(n.block_size) {
            return Err(at(OptionError::new(
                "network.depth",
                n.depth,
                format!("a multiple of network.block_size = {} (the topology wires blocks)", n.block_size),
            )));
        }
        Ok(Self { config, topology, file: file.to_path_buf() })
    }
}

impl RlConfig {
    /// Checks the values serde's types cannot express.
    pub fn validate(&self) -> Result<(), OptionError> {
        crate::config::check_name_and_device(&self.name, &self.device)?;
        let size = |key: &str, v: usize, max: usize| {
            if v == 0 || v > max {
                Err(OptionError::new(key, v, format!("an integer in 1..={max}")))
            } else {
                Ok(())
            }
        };
        let e = &self.env;
        size("env.num_envs", e.num_envs, 1 << 16)?;
        size("env.episode_length", e.episode_length, 100_000)?;
        if !(e.max_step.is_finite() && e.max_step > 0.0 && e.max_step <= 1.0) {
            return Err(OptionError::new("env.max_step", e.max_step, "a step size in (0, 1]"));
        }
        if !(e.goal_radius.is_finite() && e.goal_radius > 0.0 && e.goal_radius < 1.0) {
            return Err(OptionError::new("env.goal_radius", e.goal_radius, "a radius in (0, 1)"));
        }
        let n = &self.network;
        size("network.width", n.width, 1 << 16)?;
        size("network.depth", n.depth, 100_000)?;
        size("network.block_size", n.block_size, 100_000)?;
        size("network.repr_dim", n.repr_dim, 1 << 16)?;
        let c = &self.crl;
        if !(0.0..=1.0).contains(&c.discount) {
            return Err(OptionError::new("crl.discount", c.discount, "a discount in [0, 1]"));
        }
        if !(c.logsumexp_penalty.is_finite() && c.logsumexp_penalty >= 0.0) {
            return Err(OptionError::new("crl.logsumexp_penalty", c.logsumexp_penalty, "a finite value ≥ 0"));
        }
        if !c.target_entropy.is_finite() {
            return Err(OptionError::new("crl.target_entropy", c.target_entropy, "a finite entropy"));
        }
        let t = &self.train;
        let rollout = (e.num_envs * e.episode_length) as u64;
        if t.env_steps < rollout {
            return Err(OptionError::new(
                "train.env_steps",
                t.env_steps,
                format!("at least one rollout, env.num_envs × env.episode_length = {rollout}"),
            ));
        }
        size("train.batch_size", t.batch_size, 1 << 20)?;
        crate::config::check_optimizer(t.lr, t.weight_decay, t.betas, t.eps)?;
        if !(t.topology_lr_mult.is_finite() && t.topology_lr_mult >= 0.0) {
            return Err(OptionError::new("train.topology_lr_mult", t.topology_lr_mult, "a finite multiplier ≥ 0"));
        }
        if let Some(c) = t.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(OptionError::new("train.clip_grad_norm", c, "a finite norm > 0"));
            }
        }
        size("train.updates_per_rollout", t.updates_per_rollout, 1 << 20)?;
        let min_episodes = t.batch_size.div_ceil(e.episode_length).max(e.num_envs);
        if t.replay_episodes < min_episodes {
            return Err(OptionError::new(
                "train.replay_episodes",
                t.replay_episodes,
                format!("at least {min_episodes} (one rollout of env.num_envs episodes)"),
            ));
        }
        if t.prefill_env_steps > t.env_steps {
            return Err(OptionError::new(
                "train.prefill_env_steps",
                t.prefill_env_steps,
                format!(
                    "at most train.env_steps = {} (the first prefill_env_steps act at random and the updates start \
                     after them: beyond env_steps the run would never update)",
                    t.env_steps
                ),
            ));
        }
        if e.episode_length < 2 {
            return Err(OptionError::new(
                "env.episode_length",
                e.episode_length,
                "at least 2 (a hindsight goal is a later state of the episode)",
            ));
        }
        if self.log.eval_every == 0 {
            return Err(OptionError::new("log.eval_every", 0, "an integer ≥ 1 (environment steps)"));
        }
        size("log.eval_envs", self.log.eval_envs, 1 << 16)?;
        size("log.keep_checkpoints", self.log.keep_checkpoints, 1 << 16)?;
        Ok(())
    }

    /// The config as YAML, every default filled in (a run directory's `config.yaml`).
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("an RlConfig always serialises")
    }
}
