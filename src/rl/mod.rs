//! Goal-conditioned reinforcement learning with deep residual encoders: contrastive RL
//! (Eysenbach et al. 2022) on a vectorised point-mass maze, with the encoders' depth wired by any
//! registered topology (ANCRe §5.3, after Wang et al. 2025, "1000-layer networks for
//! self-supervised RL"). `plexus rl CONFIG` runs it (`commands::kind_run`, through the registry of run kinds).
//!
//! * [`env`](mod@env): the maze, `N` environments stepped in one call on the host.
//! * [`replay`]: episode replay with discounted hindsight goals.
//! * [`net`]: Linear → LayerNorm → Swish encoders wired by a topology (sublayer or 4-layer blocks).
//! * [`crl`]: the InfoNCE critic, the tanh-Gaussian actor and the update.
//! * [`trainer`]: the loop, evaluation, `metrics.csv`, checkpoints; the figure is the registry's (kinds.rs), drawn by plot/curves.rs.
//! * [`trained`]: a finished run opened again (its final weights), evaluated on held-out tasks.
//! * [`config`]: the strict YAML schema.
//!
//! Networks are built on the configured device and every tensor is made on the VarStore's device;
//! device → host reads go through [`crate::host`].

/// The random generator of the environments, exploration, replay sampling and the actor's noise:
/// ChaCha12, the algorithm behind rand's `Rng` (the same streams from the same seeds), used by
/// name because it serialises: a checkpoint saves every stream, so a resumed run draws exactly what
/// an uninterrupted one would.
pub type RlRng = rand_chacha::ChaCha12Rng;

pub mod config;
pub mod crl;
pub mod env;
pub mod net;
pub mod replay;
pub mod trained;
pub mod trainer;
