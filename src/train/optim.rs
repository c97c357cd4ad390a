//! Optimizers with parameter groups and a state that checkpoints can save and restore
//! (tch's built-in optimizers keep their state inside libtorch where it cannot be saved).
//!
//! Groups (REFERENCE.md: "nanoGPT decays every ≥2-D parameter — topology parameters must be
//! excluded explicitly"): `decay` = ≥2-D weights except position embeddings; `no_decay` = norms,
//! biases, other 1-D parameters, position embeddings; `topology` = everything under `topology.`
//! (never decayed, learning rate × `train.topology_lr_mult`).

use crate::config::{Optimizer, TrainConfig};
use anyhow::{bail, Result};
use std::collections::HashMap;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Decay,
    NoDecay,
    Topology,
}

/// The group a parameter belongs to, from its name and shape.
pub fn group_of(name: &str, t: &Tensor) -> Group {
    if name.starts_with("topology.") {
        Group::Topology
    } else if t.dim() >= 2 && !name.contains("pos_emb") && !name.contains("wpe") {
        Group::Decay
    } else {
        Group::NoDecay
    }
}

struct Param {
    name: String,
    value: Tensor,
    group: Group,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// Plain gradient descent or AdamW (PyTorch's update rule, decoupled weight decay).
pub struct Optim {
    kind: Optimizer,
    params: Vec<Param>,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    topology_lr_mult: f64,
    /// Updates applied so far (AdamW's bias correction uses it).
    pub steps_done: u64,
}

impl Optim {
    /// `vars`: the trainable parameters by name.
    pub fn new(cfg: &TrainConfig, mut vars: Vec<(String, Tensor)>) -> Self {
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let params = vars
            .into_iter()
            .map(|(name, value)| {
                let group = group_of(&name, &value);
                let (exp_avg, exp_avg_sq) = match cfg.optimizer {
                    Optimizer::Adamw => (value.zeros_like(), value.zeros_like()),
                    Optimizer::Gd => (Tensor::new(), Tensor::new()),
                };
                Param { name, value, group, exp_avg, exp_avg_sq }
            })
            .collect();
        Self {
            kind: cfg.optimizer,
            params,
            betas: cfg.betas,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
            topology_lr_mult: cfg.topology_lr_mult,
            steps_done: 0,
        }
    }

    pub fn zero_grad(&self) {
        for p in &self.params {
            p.value.shallow_clone().zero_grad();
        }
    }

    /// Global L2 norm of the gradients as a 0-dim fp32 tensor on the parameters' device, computed
    /// as `torch.nn.utils.clip_grad_norm_` does (the norm of the per-tensor norms), with no read:
    /// the trainer reads it on logging steps only.
    pub fn grad_norm(&self) -> Tensor {
        tch::no_grad(|| {
            let norms: Vec<Tensor> = self
                .params
                .iter()
                .map(|p| p.value.grad())
                .filter(|g| g.defined())
                .map(|g| g.to_kind(Kind::Float).norm())
                .collect();
            match norms.first() {
                Some(first) if norms.len() == 1 => first.shallow_clone(),
                Some(_) => Tensor::stack(&norms, 0).norm(),
                None => Tensor::zeros([], (Kind::Float, self.device())),
            }
        })
    }

    /// The trainable parameters, in name order (shallow handles).
    pub fn parameters(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| p.value.shallow_clone()).collect()
    }

    /// The device the parameters live on.
    pub fn device(&self) -> tch::Device {
        self.params.first().map_or(tch::Device::Cpu, |p| p.value.device())
    }

    /// The first parameter (in name order) whose gradient is not finite, for the divergence
    /// message: reads once per parameter, so only after a divergence was detected.
    pub fn first_non_finite_grad(&self) -> Option<&str> {
        self.params
            .iter()
            .find(|p| {
                let g = p.value.grad();
                g.defined() && !crate::host::all_finite(&g)
            })
            .map(|p| p.name.as_str())
    }

    /// The first parameter (in name order) whose value is not finite (see above).
    pub fn first_non_finite_param(&self) -> Option<&str> {
        self.params.iter().find(|p| !crate::host::all_finite(&p.value)).map(|p| p.name.as_str())
    }

    /// Scales the gradients so their global norm is at most `max`, as PyTorch's clip_grad_norm_:
    /// `g ← g · min(1, max / (norm + 1e-6))` with the coefficient kept on the device (`norm` is
    /// [`Optim::grad_norm`]), so clipping costs no read.
    pub fn clip(&self, norm: &Tensor, max: f64) {
        tch::no_grad(|| {
            let coef = (norm + 1e-6).reciprocal().g_mul_scalar(max).clamp_max(1.0);
            for p in &self.params {
                let g = p.value.grad();
                if g.defined() {
                    let _ = g.shallow_clone().g_mul_(&coef);
                }
            }
        });
    }

    /// One update with learning rate `lr` (before the group multipliers).
    pub fn step(&mut self, lr: f64) {
        self.steps_done += 1;
        let t = self.steps_done as i32;
        let [b1, b2] = self.betas;
        tch::no_grad(|| {
            for p in &mut self.params {
                let g = p.value.grad();
                if !g.defined() {
                    continue;
                }
                let lr = if p.group == Group::Topology { lr * self.topology_lr_mult } else { lr };
                let mut v = p.value.shallow_clone();
                match self.kind {
                    Optimizer::Gd => {
                        let _ = v.g_sub_(&(g * lr));
                    }
                    Optimizer::Adamw => {
                        // PyTorch's single-tensor AdamW, in place wherever tch allows: two
                        // temporaries per parameter (g², the denominator), as torch.optim has.
                        if p.group == Group::Decay && self.weight_decay > 0.0 {
                            let _ = v.g_mul_scalar_(1.0 - lr * self.weight_decay);
                        }
                        let _ = p.exp_avg.lerp_(&g, 1.0 - b1);
                        let _ = p.exp_avg_sq.lerp_(&g.square(), 1.0 - b2);
                        let c1 = 1.0 - b1.powi(t);
                        let c2 = 1.0 - b2.powi(t);
                        // v += exp_avg / denom with denom = −(√v̂ + eps)/step: tch's addcdiv_ has
                        // no `value`, so the step size is folded into the denominator.
                        let mut denom = p.exp_avg_sq.sqrt();
                        let _ = denom.g_div_scalar_(c2.sqrt()).g_add_scalar_(self.eps).g_mul_scalar_(-c1 / lr);
                        let _ = v.addcdiv_(&p.exp_avg, &denom);
                    }
                }
            }
        });
    }

    /// The optimizer state as named tensors (`exp_avg.<param>`, `exp_avg_sq.<param>`).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        if self.kind == Optimizer::Gd {
            return Vec::new();
        }
        self.params
            .iter()
            .flat_map(|p| {
                [
                    (format!("exp_avg.{}", p.name), p.exp_avg.shallow_clone()),
                    (format!("exp_avg_sq.{}", p.name), p.exp_avg_sq.shallow_clone()),
                ]
            })
            .collect()
    }

    /// Restores [`Optim::state`] and the update count.
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>, steps_done: u64) -> Result<()> {
        self.steps_done = steps_done;
        if self.kind == Optimizer::Gd {
            return Ok(());
        }
        for p in &mut self.params {
            for (key, dst) in [("exp_avg", &mut p.exp_avg), ("exp_avg_sq", &mut p.exp_avg_sq)] {
                let name = format!("{key}.{}", p.name);
                let Some(src) = state.get(&name) else { bail!("checkpoint optimizer state lacks `{name}`") };
                tch::no_grad(|| dst.copy_(src));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two AdamW steps on a decayed weight and a topology parameter, against the update rule of
    /// torch.optim.AdamW written out in f64.
    #[test]
    fn adamw_matches_the_pytorch_update_rule() {
        let cfg: TrainConfig = serde_yaml::from_str(
            "{optimizer: adamw, lr: 0.1, weight_decay: 0.5, betas: [0.8, 0.9], eps: 0.01, topology_lr_mult: 3.0}",
        )
        .unwrap();
        let w0 = [0.5f64, -1.0, 2.0, 0.25];
        let w = Tensor::from_slice(&w0).to_kind(Kind::Float).reshape([2, 2]).set_requires_grad(true);
        let a = Tensor::from_slice(&[0.3f32]).set_requires_grad(true);
        let mut opt =
            Optim::new(&cfg, vec![("units.0.w".into(), w.shallow_clone()), ("topology.a".into(), a.shallow_clone())]);
        let grads = [[0.2f64, -0.4, 1.0, 0.0], [-0.1, 0.3, 0.5, 2.0]];
        let (mut m, mut s, mut want) = ([0.0f64; 4], [0.0f64; 4], w0);
        let (mut ma, mut sa, mut want_a) = (0.0f64, 0.0f64, 0.3f64);
        for (t, g) in grads.iter().enumerate() {
            opt.zero_grad();
            let gw = Tensor::from_slice(g).to_kind(Kind::Float).reshape([2, 2]);
            let loss = (&w * &gw).sum(Kind::Float) + &a * (g[0] * 10.0);
            loss.backward();
            opt.step(0.1);
            let t = t as i32 + 1;
            let (c1, c2) = (1.0 - 0.8f64.powi(t), 1.0 - 0.9f64.powi(t));
            for i in 0..4 {
                want[i] *= 1.0 - 0.1 * 0.5;
                m[i] = 0.8 * m[i] + 0.2 * g[i];
                s[i] = 0.9 * s[i] + 0.1 * g[i] * g[i];
                want[i] -= 0.1 / c1 * m[i] / (s[i].sqrt() / c2.sqrt() + 0.01);
            }
            // Topology group: no decay, lr × 3.
            let ga = g[0] * 10.0;
            ma = 0.8 * ma + 0.2 * ga;
            sa = 0.9 * sa + 0.1 * ga * ga;
            want_a -= 0.3 / c1 * ma / (sa.sqrt() / c2.sqrt() + 0.01);
        }
        let got = Vec::<f64>::try_from(w.to_kind(Kind::Double).reshape([-1])).unwrap();
        for i in 0..4 {
            assert!((got[i] - want[i]).abs() < 1e-6, "w[{i}]: {} vs {}", got[i], want[i]);
        }
        assert!((a.double_value(&[0]) - want_a).abs() < 1e-6, "a: {} vs {want_a}", a.double_value(&[0]));
    }
}
