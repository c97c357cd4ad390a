//! Contrastive RL (Eysenbach et al. 2022; the deep-network recipe of Wang et al. 2025).
//!
//! * Critic `f(s, a, g) = φ(s, a) · ψ(g)`: two encoders, `sa_encoder` on `[s, a]` and
//!   `g_encoder` on `g`, trained with InfoNCE ([`infonce`]) on batches of `(s_t, a_t, s_{t+k})`
//!   from replay (hindsight goals, [`crate::rl::replay`]): the positives are the diagonal of the
//!   `[B, B]` logits, the other goals of the batch are the negatives.
//! * Actor `π(s, g)`: a tanh-Gaussian (the `actor` encoder outputs the mean and log-std of
//!   `u ~ N(μ, σ²)`, `a = tanh(u)`), trained to maximise the critic with an entropy bonus,
//!   `mean(α log π(a|s, g) − f(s, a, g))`, on the same batch's states and goals; the temperature
//!   `α = exp(log_alpha)` is tuned towards a target entropy, as in SAC.
//! * All three networks are [`Encoder`]s wired by the configured topology.
//!
//! States and goals enter the networks rescaled from `[0, 1]` to `[-1, 1]`.

use super::config::{CrlConfig, InfoNce, RlConfig};
use super::net::Encoder;
use super::replay::Batch;
use crate::topology::TopologySpec;
use crate::train::optim::Optim;
use tch::{nn, Kind, Tensor};

/// Bounds of the actor's log-std (squashed into this range by a tanh).
pub const LOG_STD_MIN: f64 = -5.0;
pub const LOG_STD_MAX: f64 = 2.0;

/// The InfoNCE loss of the critic and its logits accuracy.
///
/// `phi` `[B, K]` = φ(s_i, a_i), `psi` `[B, K]` = ψ(g_i) (row `i` of each is a positive pair).
/// Logits `ℓ = phi · psiᵀ` `[B, B]`. Forward: `mean_i [lse_j ℓ_ij − ℓ_ii]`; symmetric: forward
/// plus backward, `mean_i [lse_j ℓ_ij + lse_j ℓ_ji − 2 ℓ_ii]`; plus
/// `logsumexp_penalty · mean_i (lse_j ℓ_ij)²`. Returns `(loss, accuracy)`, 0-dim tensors in
/// `phi`'s dtype on its device; accuracy = the share of rows whose largest logit is the diagonal
/// (no gradient). The reference is `parity/crl_infonce.py`.
pub fn infonce(phi: &Tensor, psi: &Tensor, kind: InfoNce, logsumexp_penalty: f64) -> (Tensor, Tensor) {
    let logits = phi.matmul(&psi.tr());
    let diag = logits.diagonal(0, 0, 1);
    let lse_rows = logits.logsumexp([1], false);
    let mut loss = match kind {
        InfoNce::Forward => (&lse_rows - &diag).mean(None),
        InfoNce::Symmetric => (&lse_rows + logits.logsumexp([0], false) - &diag * 2.0).mean(None),
    };
    if logsumexp_penalty > 0.0 {
        loss = loss + lse_rows.square().mean(None) * logsumexp_penalty;
    }
    let accuracy = tch::no_grad(|| {
        let n = logits.size()[0];
        let labels = Tensor::arange(n, (Kind::Int64, logits.device()));
        logits.argmax(1, false).eq_tensor(&labels).to_kind(phi.kind()).mean(None)
    });
    (loss, accuracy)
}

/// The tanh-Gaussian actor's action and log-probability from the actor encoder's output.
/// `out` `[B, 4]` (mean `[B, 2]`, raw log-std `[B, 2]`), `eps` `[B, 2]` standard normal →
/// `(a [B, 2], log π(a) [B])`.
pub fn tanh_gaussian(out: &Tensor, eps: &Tensor) -> (Tensor, Tensor) {
    let mean = out.narrow(1, 0, 2);
    let log_std = log_std_of(&out.narrow(1, 2, 2));
    let u = &mean + log_std.exp() * eps;
    let a = u.tanh();
    let normal = (eps.square() * -0.5) - &log_std - 0.5 * (2.0 * std::f64::consts::PI).ln();
    let log_prob = (normal - (a.square().neg() + 1.0 + 1e-6).log()).sum_dim_intlist(1, false, Kind::Float);
    (a, log_prob)
}

/// Squashes a raw log-std into `[LOG_STD_MIN, LOG_STD_MAX]`; any shape.
pub fn log_std_of(raw: &Tensor) -> Tensor {
    (raw.tanh() + 1.0) * (0.5 * (LOG_STD_MAX - LOG_STD_MIN)) + LOG_STD_MIN
}

/// `[0, 1]` coordinates to the networks' `[-1, 1]`; any shape.
fn scaled(x: &Tensor) -> Tensor {
    x * 2.0 - 1.0
}

/// The three networks, the temperature and their optimizers, in one VarStore (names
/// `sa_encoder.*`, `g_encoder.*`, `actor.*`, `log_alpha`).
pub struct Agent {
    pub vs: nn::VarStore,
    pub sa_encoder: Encoder,
    pub g_encoder: Encoder,
    pub actor: Encoder,
    pub log_alpha: Tensor,
    /// One optimizer per network (parameter names relative to the network, so each topology's
    /// own parameters form the `topology` group) and one for `log_alpha`.
    optims: Vec<(&'static str, Optim)>,
    crl: CrlConfig,
    clip: Option<f64>,
}

/// Statistics of one update, `[5]` f32 on the device: critic loss, actor loss, logits accuracy,
/// α, mean log π.
pub const UPDATE_STATS: [&str; 5] = ["critic_loss", "actor_loss", "accuracy", "alpha", "log_prob"];

impl Agent {
    /// Builds the networks on `device`; the caller seeds torch beforehand for reproducible init.
    pub fn new(cfg: &RlConfig, topology: &dyn TopologySpec, device: tch::Device) -> Self {
        let vs = nn::VarStore::new(device);
        let n = &cfg.network;
        let (w, k) = (n.width as i64, n.repr_dim as i64);
        let enc = |name: &str, input: i64, out: i64| {
            Encoder::new(&(vs.root() / name), input, w, n.depth, n.block_size, out, topology, Kind::Float)
        };
        let sa_encoder = enc("sa_encoder", 4, k);
        let g_encoder = enc("g_encoder", 2, k);
        let actor = enc("actor", 4, 4);
        let log_alpha = vs.root().var("log_alpha", &[], nn::Init::Const(0.0));
        let train_cfg = cfg.train.optim();
        let vars = vs.variables();
        let group = |prefix: &str| -> Vec<(String, Tensor)> {
            vars.iter()
                .filter_map(|(name, t)| {
                    name.strip_prefix(prefix)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .filter(|_| t.requires_grad())
                        .map(|rest| (rest.to_string(), t.shallow_clone()))
                })
                .collect()
        };
        let optims = ["sa_encoder", "g_encoder", "actor"]
            .into_iter()
            .map(|p| (p, Optim::new(&train_cfg, group(p))))
            .chain(std::iter::once((
                "log_alpha",
                Optim::new(&train_cfg, vec![("log_alpha".to_string(), log_alpha.shallow_clone())]),
            )))
            .collect();
        Self {
            vs,
            sa_encoder,
            g_encoder,
            actor,
            log_alpha,
            optims,
            crl: cfg.crl.clone(),
            clip: cfg.train.clip_grad_norm,
        }
    }

    /// The device the agent's networks live on.
    pub fn device(&self) -> tch::Device {
        self.vs.device()
    }

    /// A host `[B, 2]` row-major buffer as a tensor on the networks' device.
    fn rows(&self, v: &[f32]) -> Tensor {
        Tensor::from_slice(v).reshape([-1, 2]).to_device(self.device())
    }

    /// The actor's output `[N, 4]` for states and goals `[N, 2]` (host), read back to the host:
    /// one device read. Used for acting; no gradient.
    pub fn policy_outputs(&self, states: &[f32], goals: &[f32]) -> Vec<f32> {
        let out = tch::no_grad(|| {
            let x = Tensor::cat(&[scaled(&self.rows(states)), scaled(&self.rows(goals))], 1);
            self.actor.forward(&x, false)
        });
        crate::host::values(&out).into_iter().map(|v| v as f32).collect()
    }

    /// Actions `[N, 2]` for states and goals `[N, 2]`: `tanh(μ)` when `noise` is `None`
    /// (evaluation), else `tanh(μ + σ·ε)` with `noise` = ε `[N, 2]` (exploration).
    pub fn act(&self, states: &[f32], goals: &[f32], noise: Option<&[f32]>) -> Vec<f32> {
        let out = self.policy_outputs(states, goals);
        let n = states.len() / 2;
        let mut a = vec![0.0f32; 2 * n];
        for i in 0..n {
            for d in 0..2 {
                let mean = out[4 * i + d] as f64;
                let u = match noise {
                    None => mean,
                    Some(eps) => {
                        let raw = out[4 * i + 2 + d] as f64;
                        let log_std = (raw.tanh() + 1.0) * 0.5 * (LOG_STD_MAX - LOG_STD_MIN) + LOG_STD_MIN;
                        mean + log_std.exp() * eps[2 * i + d] as f64
                    }
                };
                a[2 * i + d] = u.tanh() as f32;
            }
        }
        a
    }

    fn optim(&mut self, name: &str) -> &mut Optim {
        &mut self.optims.iter_mut().find(|(n, _)| *n == name).expect("a known optimizer").1
    }

    fn step(&mut self, names: &[&str], lr: f64) {
        let clip = self.clip;
        for name in names {
            let opt = self.optim(name);
            if let Some(max) = clip {
                let norm = opt.grad_norm();
                opt.clip(&norm, max);
            }
            opt.step(lr);
        }
    }

    fn zero_grad(&self) {
        for (_, o) in &self.optims {
            o.zero_grad();
        }
    }

    /// One gradient step of the critic, then the actor, then the temperature, on `batch` (host
    /// `[B, 2]` states, actions, goals) with `eps` `[B, 2]` standard-normal noise for the actor's
    /// reparameterised sample. Returns the [`UPDATE_STATS`] `[5]` on the device (no read).
    pub fn update(&mut self, batch: &Batch, eps: &[f32], lr: f64) -> Tensor {
        let (s, a, g) =
            (scaled(&self.rows(&batch.states)), self.rows(&batch.actions), scaled(&self.rows(&batch.goals)));
        let eps = self.rows(eps);

        // Critic.
        self.zero_grad();
        let phi = self.sa_encoder.forward(&Tensor::cat(&[&s, &a], 1), true);
        let psi = self.g_encoder.forward(&g, true);
        let (mut critic_loss, accuracy) = infonce(&phi, &psi, self.crl.loss, self.crl.logsumexp_penalty);
        for r in [self.sa_encoder.regularizer(), self.g_encoder.regularizer()].into_iter().flatten() {
            critic_loss = critic_loss + r;
        }
        critic_loss.backward();
        self.step(&["sa_encoder", "g_encoder"], lr);

        // Actor, against the updated critic (its gradients into the critic are discarded).
        self.zero_grad();
        let out = self.actor.forward(&Tensor::cat(&[&s, &g], 1), true);
        let (a_pi, log_prob) = tanh_gaussian(&out, &eps);
        let psi = tch::no_grad(|| self.g_encoder.forward(&g, false));
        let q =
            (self.sa_encoder.forward(&Tensor::cat(&[&s, &a_pi], 1), true) * psi).sum_dim_intlist(1, false, Kind::Float);
        let alpha = self.log_alpha.exp().detach();
        let mut actor_loss = (&log_prob * &alpha - q).mean(None);
        if let Some(r) = self.actor.regularizer() {
            actor_loss = actor_loss + r;
        }
        actor_loss.backward();
        self.step(&["actor"], lr);

        // Temperature: α (−log π − H̄), gradient on log α only.
        self.zero_grad();
        let lp = log_prob.detach();
        let alpha_loss = (self.log_alpha.exp() * (lp.neg() - self.crl.target_entropy)).mean(None);
        alpha_loss.backward();
        self.step(&["log_alpha"], lr);
        self.zero_grad();

        Tensor::stack(
            &[critic_loss.detach(), actor_loss.detach(), accuracy, alpha, lp.mean(None)]
                .map(|t| t.to_kind(Kind::Float)),
            0,
        )
    }

    /// Every optimizer's state, named `<network>.exp_avg.<param>` (for checkpoints).
    pub fn optim_state(&self) -> Vec<(String, Tensor)> {
        self.optims
            .iter()
            .flat_map(|(net, o)| o.state().into_iter().map(move |(k, t)| (format!("{net}.{k}"), t)))
            .collect()
    }

    /// Restores [`Agent::optim_state`] into every optimizer, after `updates` updates (each update
    /// steps each optimizer once).
    pub fn load_optim_state(
        &mut self,
        state: &std::collections::HashMap<String, Tensor>,
        updates: u64,
    ) -> anyhow::Result<()> {
        for (net, o) in self.optims.iter_mut() {
            let prefix = format!("{net}.");
            let mine: std::collections::HashMap<String, Tensor> = state
                .iter()
                .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|rest| (rest.to_string(), t.shallow_clone())))
                .collect();
            o.load_state(&mine, updates).map_err(|e| anyhow::anyhow!("{net}: {e}"))?;
        }
        Ok(())
    }

    /// Number of scalar parameters.
    pub fn num_params(&self) -> i64 {
        self.vs.variables().values().map(|t| t.numel() as i64).sum()
    }
}

/// `n` standard normals from `rng` (Box–Muller), for exploration and the actor's samples.
pub fn normals(rng: &mut super::RlRng, n: usize) -> Vec<f32> {
    use rand::Rng;
    let mut v = Vec::with_capacity(n + 1);
    while v.len() < n {
        let u1: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
        let u2: f64 = rng.gen();
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        v.push((r * th.cos()) as f32);
        v.push((r * th.sin()) as f32);
    }
    v.truncate(n);
    v
}
