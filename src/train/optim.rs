//! Optimizers with parameter groups and a state that checkpoints can save and restore
//! (tch's built-in optimizers keep their state inside libtorch where it cannot be saved).
//!
//! Groups: `decay` = the ≥2-D weights of the backbone (matrices and embeddings); `no_decay` =
//! norms, biases and other 1-D parameters; `topology` = everything the topology owns (built under
//! `topology.` by `Model::new`): not decayed — nanoGPT's rule "decay every ≥2-D parameter" would
//! otherwise decay ANCRe's logits or mHC's projections towards zero — unless
//! `train.topology_decay` asks for it (epfml's DenseFormer decays its DWA weights), with learning
//! rate × `train.topology_lr_mult`. No backbone has learned position embeddings (ViT's are fixed sin-cos,
//! GPT's and LLaMA's rotary), which nanoGPT also exempts.

use crate::config::{Optimizer, TrainConfig};
use crate::native::{optim::fused_adamw, optim::AdamwHyper};
use anyhow::{bail, Result};
use std::collections::HashMap;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Decay,
    NoDecay,
    Topology,
}

/// The group a parameter belongs to, from where it lives and its shape.
pub fn group_of(name: &str, t: &Tensor) -> Group {
    if name.starts_with("topology.") {
        Group::Topology
    } else if t.dim() >= 2 {
        Group::Decay
    } else {
        Group::NoDecay
    }
}

struct Param {
    name: String,
    value: Tensor,
    group: Group,
    /// AdamW moments: views `[shape]` into the parameter's bucket's flat `exp_avg` / `exp_avg_sq`
    /// (undefined for GD), so that [`Optim::state`] keeps PyTorch's per-parameter names.
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// With `train.ema`: the exponential moving average of the parameter's values (a view into the
    /// bucket's flat `ema` with AdamW, a tensor of its own with GD); undefined otherwise.
    ema: Tensor,
}

/// AdamW's parameters of one group (and dtype, device) held in flat 1-D buffers: `value` `[P]`
/// (every parameter's data is a view into it, installed with `set_data`), `exp_avg`, `exp_avg_sq`
/// `[P]`. The update is then one fused kernel per bucket on `[P]` (libtorch's `_fused_adamw_`,
/// through [`crate::native`]) instead of eight per parameter tensor. Gradients stay per parameter
/// (autograd owns them); they are concatenated once per step into `[P]`.
struct Bucket {
    group: Group,
    /// Indices into `Optim::params`, in name order (the order of the flat layout).
    members: Vec<usize>,
    value: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// `[P]` moving average of `value` (undefined without `train.ema`).
    ema: Tensor,
    /// `[]` float32 on the bucket's device: the update count, which the fused kernel's bias
    /// correction reads where it runs (set before each update, so a restored count needs nothing).
    step: Tensor,
}

/// Plain gradient descent or AdamW (PyTorch's update rule, decoupled weight decay).
pub struct Optim {
    kind: Optimizer,
    params: Vec<Param>,
    buckets: Vec<Bucket>,
    /// The flat gradient `[P]` of every bucket, concatenated by [`Optim::grad_norm`], scaled in place
    /// by [`Optim::clip`] and consumed by [`Optim::step`] (so the trainer's norm → clip → step reads
    /// and writes each gradient once more, not once per parameter tensor); dropped by `zero_grad`
    /// and `step`. `None` for a bucket with a parameter that has no gradient.
    flat_grads: std::cell::RefCell<Option<Vec<Option<Tensor>>>>,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    /// `train.topology_decay`: the topology group decayed at `weight_decay` too.
    topology_decay: bool,
    topology_lr_mult: f64,
    /// `train.ema`: the decay of the parameters' moving average, updated after every step.
    ema_decay: Option<f64>,
    /// The learning rate of the update, 0-dim on the parameters' device, per group: `[0]` every
    /// group but the topology's, `[1]` the topology's (× `topology_lr_mult`). Written by
    /// [`Optim::stage`] before the update, read there by [`Optim::update`]: a captured CUDA graph
    /// replays the update with the values they hold. float64 on the CPU (the update then uses
    /// exactly the f64 learning rate), float32 on CUDA (what libtorch's fused kernel reads).
    lr: [Tensor; 2],
    /// Updates applied so far (AdamW's bias correction uses it).
    pub steps_done: u64,
}

impl Optim {
    /// `vars`: the trainable parameters by name. With AdamW, every parameter's data is moved into
    /// its bucket's flat buffer (values unchanged; the VarStore and the model see the same tensors).
    pub fn new(cfg: &TrainConfig, mut vars: Vec<(String, Tensor)>) -> Self {
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut params: Vec<Param> = vars
            .into_iter()
            .map(|(name, value)| {
                let group = group_of(&name, &value);
                Param { name, value, group, exp_avg: Tensor::new(), exp_avg_sq: Tensor::new(), ema: Tensor::new() }
            })
            .collect();
        let mut buckets: Vec<Bucket> = Vec::new();
        if cfg.optimizer == Optimizer::Adamw {
            let mut keys: Vec<(Group, Kind, tch::Device)> = Vec::new();
            for p in &params {
                let key = (p.group, p.value.kind(), p.value.device());
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            for (group, kind, dev) in keys {
                let members: Vec<usize> = (0..params.len())
                    .filter(|&i| {
                        let p = &params[i];
                        (p.group, p.value.kind(), p.value.device()) == (group, kind, dev)
                    })
                    .collect();
                let flat: Vec<Tensor> = members.iter().map(|&i| params[i].value.detach().reshape([-1])).collect();
                let value = tch::no_grad(|| Tensor::cat(&flat, 0));
                let exp_avg = value.zeros_like();
                let exp_avg_sq = value.zeros_like();
                // The average starts at the initial values (as DiT's `update_ema(…, decay=0)`).
                let ema = if cfg.ema.is_some() { tch::no_grad(|| value.copy()) } else { Tensor::new() };
                let mut off = 0i64;
                for &i in &members {
                    let p = &mut params[i];
                    let (numel, shape) = (p.value.numel() as i64, p.value.size());
                    let view = |t: &Tensor| t.narrow(0, off, numel).view(shape.as_slice());
                    tch::no_grad(|| p.value.set_data(&view(&value)));
                    p.exp_avg = view(&exp_avg);
                    p.exp_avg_sq = view(&exp_avg_sq);
                    if ema.defined() {
                        p.ema = view(&ema);
                    }
                    off += numel;
                }
                let step = Tensor::zeros([], (Kind::Float, dev));
                buckets.push(Bucket { group, members, value, exp_avg, exp_avg_sq, ema, step });
            }
        } else if cfg.ema.is_some() {
            for p in &mut params {
                p.ema = tch::no_grad(|| p.value.detach().copy());
            }
        }
        let dev = params.first().map_or(tch::Device::Cpu, |p| p.value.device());
        let lr_kind = if dev.is_cuda() { Kind::Float } else { Kind::Double };
        let lr = [Tensor::zeros([], (lr_kind, dev)), Tensor::zeros([], (lr_kind, dev))];
        Self {
            lr,
            kind: cfg.optimizer,
            params,
            buckets,
            flat_grads: std::cell::RefCell::new(None),
            betas: cfg.betas,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
            topology_decay: cfg.topology_decay,
            topology_lr_mult: cfg.topology_lr_mult,
            ema_decay: cfg.ema,
            steps_done: 0,
        }
    }

    /// Drops every gradient (`None`, as torch.optim's default `set_to_none=True`): the next
    /// backward stores fresh gradients rather than adding into zeroed ones (a `zero_` and an
    /// `add_` per parameter saved, which on a GPU are launches); a parameter that then gets none is
    /// skipped by the update, as in torch.optim.
    pub fn zero_grad(&self) {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::OPTIMIZER);
        self.flat_grads.replace(None);
        let values: Vec<Tensor> = self.params.iter().map(|p| p.value.shallow_clone()).collect();
        crate::native::optim::clear_grads(&values).expect("parameters are defined tensors");
    }

    /// Each bucket's gradient as one flat `[P]` tensor (one `cat`), or `None` where a member has
    /// no gradient (such a bucket is updated per parameter, skipping those, as torch.optim does).
    fn concat_grads(&self) -> Vec<Option<Tensor>> {
        self.buckets
            .iter()
            .map(|b| {
                let grads: Vec<Tensor> = b.members.iter().map(|&i| self.params[i].value.grad()).collect();
                grads.iter().all(Tensor::defined).then(|| {
                    let flat: Vec<Tensor> = grads.iter().map(|g| g.reshape([-1])).collect();
                    Tensor::cat(&flat, 0)
                })
            })
            .collect()
    }

    /// Global L2 norm of the gradients as a 0-dim fp32 tensor on the parameters' device, computed
    /// as `torch.nn.utils.clip_grad_norm_` does (the norm of the per-tensor norms — here of the
    /// per-bucket norms, the same value), with no read: the trainer reads it on logging steps only.
    pub fn grad_norm(&self) -> Tensor {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::OPTIMIZER);
        tch::no_grad(|| {
            let mut norms: Vec<Tensor> = Vec::new();
            let mut flat_grads = None;
            if !self.buckets.is_empty() {
                let flat = self.concat_grads();
                for (b, g) in self.buckets.iter().zip(&flat) {
                    match g {
                        Some(g) => norms.push(g.to_kind(Kind::Float).norm()),
                        None => norms.extend(
                            b.members
                                .iter()
                                .map(|&i| self.params[i].value.grad())
                                .filter(Tensor::defined)
                                .map(|g| g.to_kind(Kind::Float).norm()),
                        ),
                    }
                }
                flat_grads = Some(flat);
            } else {
                norms.extend(
                    self.params
                        .iter()
                        .map(|p| p.value.grad())
                        .filter(|g| g.defined())
                        .map(|g| g.to_kind(Kind::Float).norm()),
                );
            }
            self.flat_grads.replace(flat_grads);
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
    /// [`Optim::grad_norm`]), so clipping costs no read. After `grad_norm` it scales the flat
    /// gradients that the update will use (one kernel per bucket); the per-parameter gradients
    /// of flat buckets then keep their unclipped values.
    pub fn clip(&self, norm: &Tensor, max: f64) {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::OPTIMIZER);
        tch::no_grad(|| {
            let coef = (norm + 1e-6).reciprocal().g_mul_scalar(max).clamp_max(1.0);
            let flat = self.flat_grads.borrow();
            let mut done = vec![false; self.params.len()];
            if let Some(flat) = flat.as_ref() {
                for (b, g) in self.buckets.iter().zip(flat) {
                    if let Some(g) = g {
                        let _ = g.shallow_clone().g_mul_(&coef);
                        for &i in &b.members {
                            done[i] = true;
                        }
                    }
                }
            }
            for (p, done) in self.params.iter().zip(done) {
                let g = p.value.grad();
                if !done && g.defined() {
                    let _ = g.shallow_clone().g_mul_(&coef);
                }
            }
        });
    }

    /// One update with learning rate `lr` (before the group multipliers): [`Optim::stage`], then
    /// [`Optim::update`].
    pub fn step(&mut self, lr: f64) {
        self.stage(lr);
        self.update();
    }

    /// What changes from one update to the next, written into device tensors before it (host
    /// numbers, outside any CUDA graph): the update count (AdamW's bias correction) and the
    /// learning rate of each group. Counts the update.
    pub fn stage(&mut self, lr: f64) {
        self.steps_done += 1;
        let t = self.steps_done as f64;
        tch::no_grad(|| {
            let _ = self.lr[0].fill_(lr);
            let _ = self.lr[1].fill_(lr * self.topology_lr_mult);
            for b in &self.buckets {
                let _ = b.step.shallow_clone().fill_(t);
            }
        });
    }

    /// The update itself, from the gradients and the tensors [`Optim::stage`] wrote: no host number
    /// that changes between steps enters it, so a CUDA graph can capture it.
    pub fn update(&self) {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::OPTIMIZER);
        let flat = self.flat_grads.replace(None).unwrap_or_else(|| self.concat_grads());
        let group_lr = |g: Group| if g == Group::Topology { &self.lr[1] } else { &self.lr[0] };
        tch::no_grad(|| {
            if self.kind == Optimizer::Adamw {
                for (b, g) in self.buckets.iter().zip(flat) {
                    // PyTorch's AdamW (decoupled decay `p ← p(1 − lr·wd)`, bias-corrected moments)
                    // in libtorch's fused kernel: one pass per bucket instead of eight.
                    let hyper = AdamwHyper {
                        betas: self.betas,
                        weight_decay: match b.group {
                            Group::Decay => self.weight_decay,
                            Group::Topology if self.topology_decay => self.weight_decay,
                            _ => 0.0,
                        },
                        eps: self.eps,
                    };
                    let lr = group_lr(b.group);
                    let done = match g {
                        Some(g) => fused_adamw(
                            &[b.value.shallow_clone()],
                            &[g],
                            &[b.exp_avg.shallow_clone()],
                            &[b.exp_avg_sq.shallow_clone()],
                            &b.step,
                            lr,
                            hyper,
                        ),
                        None => {
                            // Only the members that have a gradient, as views of the flat buffers.
                            let with_grad: Vec<&Param> = b
                                .members
                                .iter()
                                .map(|&i| &self.params[i])
                                .filter(|p| p.value.grad().defined())
                                .collect();
                            let list =
                                |f: &dyn Fn(&Param) -> Tensor| with_grad.iter().map(|p| f(p)).collect::<Vec<_>>();
                            fused_adamw(
                                &list(&|p| p.value.shallow_clone()),
                                &list(&|p| p.value.grad().contiguous()),
                                &list(&|p| p.exp_avg.shallow_clone()),
                                &list(&|p| p.exp_avg_sq.shallow_clone()),
                                &b.step,
                                lr,
                                hyper,
                            )
                        }
                    };
                    done.expect("AdamW's tensors share the bucket's device and dtype");
                }
            } else {
                for p in &self.params {
                    let g = p.value.grad();
                    if g.defined() {
                        // `lr` is a 0-dim tensor: the product stays in the gradient's dtype.
                        let _ = p.value.shallow_clone().g_sub_(&(g * group_lr(p.group)));
                    }
                }
            }
        });
        if let Some(decay) = self.ema_decay {
            // `ema ← ema + (1 − decay)·(p − ema)`: one kernel per bucket (per tensor with GD).
            tch::no_grad(|| {
                if self.buckets.is_empty() {
                    for p in &self.params {
                        let _ = p.ema.shallow_clone().lerp_(&p.value, 1.0 - decay);
                    }
                }
                for b in &self.buckets {
                    let _ = b.ema.shallow_clone().lerp_(&b.value, 1.0 - decay);
                }
            });
        }
    }

    /// Every tensor that lives across steps and that a step reads or writes in place: values,
    /// moments, averages, update counts, learning rates (gradients are made by the step itself).
    /// A captured CUDA graph keeps reading and writing these addresses: they must keep their storage.
    pub fn persistent_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out =
            vec![("lr".to_string(), self.lr[0].shallow_clone()), ("lr.topology".into(), self.lr[1].shallow_clone())];
        for (i, b) in self.buckets.iter().enumerate() {
            for (what, t) in [
                ("value", &b.value),
                ("exp_avg", &b.exp_avg),
                ("exp_avg_sq", &b.exp_avg_sq),
                ("ema", &b.ema),
                ("step", &b.step),
            ] {
                if t.defined() {
                    out.push((format!("bucket{i}.{what}"), t.shallow_clone()));
                }
            }
        }
        for p in &self.params {
            out.push((p.name.clone(), p.value.shallow_clone()));
            if self.buckets.is_empty() && p.ema.defined() {
                out.push((format!("ema.{}", p.name), p.ema.shallow_clone()));
            }
        }
        out
    }

    /// The optimizer state as named tensors (`exp_avg.<param>`, `exp_avg_sq.<param>`, and with
    /// `train.ema` `ema.<param>`).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut state: Vec<(String, Tensor)> = Vec::new();
        for p in &self.params {
            if self.kind == Optimizer::Adamw {
                state.push((format!("exp_avg.{}", p.name), p.exp_avg.shallow_clone()));
                state.push((format!("exp_avg_sq.{}", p.name), p.exp_avg_sq.shallow_clone()));
            }
            if p.ema.defined() {
                state.push((format!("ema.{}", p.name), p.ema.shallow_clone()));
            }
        }
        state
    }

    /// With `train.ema`: the moving average of every parameter, by parameter name (views of the
    /// live buffers; copy before changing anything).
    pub fn ema(&self) -> Option<Vec<(String, Tensor)>> {
        self.ema_decay?;
        Some(self.params.iter().map(|p| (p.name.clone(), p.ema.shallow_clone())).collect())
    }

    /// Restores [`Optim::state`] and the update count.
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>, steps_done: u64) -> Result<()> {
        self.steps_done = steps_done;
        let adamw = self.kind == Optimizer::Adamw;
        for p in &mut self.params {
            let mut slots: Vec<(&str, &mut Tensor)> = Vec::new();
            if adamw {
                slots.push(("exp_avg", &mut p.exp_avg));
                slots.push(("exp_avg_sq", &mut p.exp_avg_sq));
            }
            if p.ema.defined() {
                slots.push(("ema", &mut p.ema));
            }
            for (key, dst) in slots {
                let name = format!("{key}.{}", p.name);
                let Some(src) = state.get(&name) else { bail!("checkpoint optimizer state lacks `{name}`") };
                tch::no_grad(|| dst.copy_(src));
            }
        }
        Ok(())
    }
}

/// AdamW on `device` against torch.optim.AdamW's update rule written out in f64: two fp32
/// parameters in two groups (a decayed `[2, 2]` weight; a topology scalar: no decay, lr × 3), two
/// steps with fixed gradients; returns the largest absolute deviation. The unit tests run it on
/// the CPU; `plexus doctor --selftest` on the device it tests (the fused kernel there is CUDA's).
pub fn adamw_error_on(device: tch::Device) -> f64 {
    adamw_error_with(device, false)
}

/// [`adamw_error_on`], with the topology group decayed too (`train.topology_decay`) when
/// `topology_decay`: then `a ← a(1 − 3·lr·wd)` before its step, as torch.optim.AdamW decays a group
/// at its own learning rate.
fn adamw_error_with(device: tch::Device, topology_decay: bool) -> f64 {
    let cfg: TrainConfig = serde_yaml::from_str(&format!(
        "{{optimizer: adamw, lr: 0.1, weight_decay: 0.5, betas: [0.8, 0.9], eps: 0.01, topology_lr_mult: 3.0, \
         topology_decay: {topology_decay}}}"
    ))
    .expect("a valid train section");
    let w0 = [0.5f64, -1.0, 2.0, 0.25];
    let w = Tensor::from_slice(&w0).to_kind(Kind::Float).reshape([2, 2]).to_device(device).set_requires_grad(true);
    let a = Tensor::from_slice(&[0.3f32]).to_device(device).set_requires_grad(true);
    let mut opt =
        Optim::new(&cfg, vec![("units.0.w".into(), w.shallow_clone()), ("topology.a".into(), a.shallow_clone())]);
    let grads = [[0.2f64, -0.4, 1.0, 0.0], [-0.1, 0.3, 0.5, 2.0]];
    let (mut m, mut s, mut want) = ([0.0f64; 4], [0.0f64; 4], w0);
    let (mut ma, mut sa, mut want_a) = (0.0f64, 0.0f64, 0.3f64);
    for (t, g) in grads.iter().enumerate() {
        opt.zero_grad();
        let gw = Tensor::from_slice(g).to_kind(Kind::Float).reshape([2, 2]).to_device(device);
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
        // Topology group: lr × 3, decayed only with `topology_decay`.
        if topology_decay {
            want_a *= 1.0 - 0.3 * 0.5;
        }
        let ga = g[0] * 10.0;
        ma = 0.8 * ma + 0.2 * ga;
        sa = 0.9 * sa + 0.1 * ga * ga;
        want_a -= 0.3 / c1 * ma / (sa.sqrt() / c2.sqrt() + 0.01);
    }
    let got = Vec::<f64>::try_from(w.to_kind(Kind::Double).reshape([-1]).to_device(tch::Device::Cpu))
        .expect("a float tensor");
    let got_a = a.to_device(tch::Device::Cpu).double_value(&[0]);
    got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold((got_a - want_a).abs(), f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `train.topology_decay`: the topology's parameters decayed at the group's learning rate, as
    /// torch.optim.AdamW does; without it, not at all (both against the rule written out in f64,
    /// so an optimizer that ignored the flag fails one of the two).
    #[test]
    fn the_topology_group_is_decayed_only_when_asked() {
        for decay in [false, true] {
            let err = adamw_error_with(tch::Device::Cpu, decay);
            assert!(err < 1e-6, "topology_decay {decay}: {err:e}");
        }
    }

    /// Two AdamW steps on a decayed weight and a topology parameter, against the update rule of
    /// torch.optim.AdamW written out in f64.
    /// `train.ema`: after every update `ema ← d·ema + (1 − d)·p`, from `ema = p₀`, for AdamW's
    /// flat buckets and GD's tensors alike; saved and restored with the optimizer state.
    #[test]
    fn the_moving_average_follows_every_update_and_round_trips_through_the_state() {
        for optimizer in ["adamw", "gd"] {
            let cfg: TrainConfig =
                serde_yaml::from_str(&format!("{{optimizer: {optimizer}, lr: 0.1, ema: 0.75}}")).unwrap();
            let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0]).set_requires_grad(true);
            let b = Tensor::from_slice(&[0.3f32]).set_requires_grad(true);
            let mut opt = Optim::new(&cfg, vec![("w".into(), w.shallow_clone()), ("b".into(), b.shallow_clone())]);
            let values = |t: &Tensor| Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap();
            let mut want = [values(&w), values(&b)];
            for g in [1.0, -2.0, 0.5] {
                opt.zero_grad();
                ((&w * g).sum(Kind::Float) + &b * (2.0 * g)).sum(Kind::Float).backward();
                opt.step(0.1);
                for (avg, now) in want.iter_mut().zip([values(&w), values(&b)]) {
                    for (a, p) in avg.iter_mut().zip(now) {
                        *a = 0.75 * *a + 0.25 * p;
                    }
                }
            }
            let ema = opt.ema().expect("train.ema is set");
            for ((name, e), want) in ema.iter().zip([&want[1], &want[0]]) {
                for (got, want) in values(e).iter().zip(want.iter()) {
                    assert!((got - want).abs() < 1e-6, "{optimizer} {name}: {got} vs {want}");
                }
            }
            // Not vacuous: the average lags the parameters.
            assert!((values(&ema[1].1)[0] - values(&w)[0]).abs() > 1e-3);
            let state: HashMap<String, Tensor> = opt.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
            assert!(state.contains_key("ema.w") && state.contains_key("ema.b"), "{:?}", state.keys());
            let mut fresh = Optim::new(&cfg, vec![("w".into(), w.copy()), ("b".into(), b.copy())]);
            fresh.load_state(&state, 3).unwrap();
            assert_eq!(values(&fresh.ema().unwrap()[1].1), values(&ema[1].1), "{optimizer}: not restored");
            let mut lacking: HashMap<String, Tensor> =
                state.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
            lacking.remove("ema.b");
            let e = fresh.load_state(&lacking, 3).unwrap_err().to_string();
            assert!(e.contains("ema.b"), "{e}");
        }
        let none: TrainConfig = serde_yaml::from_str("{optimizer: adamw}").unwrap();
        let opt = Optim::new(&none, vec![("w".into(), Tensor::from_slice(&[1.0f32]).set_requires_grad(true))]);
        assert!(opt.ema().is_none() && !opt.state().iter().any(|(n, _)| n.starts_with("ema.")));
    }

    #[test]
    fn adamw_matches_the_pytorch_update_rule() {
        let err = adamw_error_on(tch::Device::Cpu);
        assert!(err < 1e-6, "largest deviation from the f64 update rule {err:e}");
    }

    /// bf16 parameters (and moments): the update is computed in fp32 and rounded once per tensor
    /// and step, so after a few steps the parameters are within one bf16 rounding of the update
    /// rule done in f64 on the same bf16-rounded state — an eight-kernel bf16 update rounds after
    /// every kernel and drifts by several roundings.
    #[test]
    fn adamw_on_bf16_parameters_rounds_once_per_step() {
        let cfg: TrainConfig =
            serde_yaml::from_str("{optimizer: adamw, lr: 0.05, weight_decay: 0.1, betas: [0.9, 0.99], eps: 1.0e-8}")
                .unwrap();
        let n = 64usize;
        let init: Vec<f64> = (0..n).map(|i| 1.0 + i as f64 / n as f64).collect();
        let grads: Vec<f64> = (0..n).map(|i| ((i * 37 % 17) as f64 - 8.0) / 3.0).collect();
        let bf16 = |x: &[f64]| -> Vec<f64> {
            Vec::<f64>::try_from(Tensor::from_slice(x).to_kind(Kind::BFloat16).to_kind(Kind::Double)).unwrap()
        };
        let w = Tensor::from_slice(&init).to_kind(Kind::BFloat16).reshape([8, 8]).set_requires_grad(true);
        let gw = Tensor::from_slice(&grads).to_kind(Kind::BFloat16).reshape([8, 8]);
        let mut opt = Optim::new(&cfg, vec![("units.0.w".into(), w.shallow_clone())]);
        let (mut p, mut m, mut v) = (bf16(&init), vec![0.0f64; n], vec![0.0f64; n]);
        let g = bf16(&grads);
        for t in 1..=4 {
            opt.zero_grad();
            (&w * &gw).sum(Kind::Float).backward();
            opt.step(0.05);
            let (c1, c2) = (1.0 - 0.9f64.powi(t), 1.0 - 0.99f64.powi(t));
            for i in 0..n {
                m[i] = 0.9 * m[i] + 0.1 * g[i];
                v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
                p[i] = p[i] * (1.0 - 0.05 * 0.1) - 0.05 / c1 * m[i] / (v[i].sqrt() / c2.sqrt() + 1e-8);
            }
            // The state lives in bf16: round it as the kernel stores it.
            (p, m, v) = (bf16(&p), bf16(&m), bf16(&v));
        }
        let got = Vec::<f64>::try_from(w.to_kind(Kind::Double).reshape([-1])).unwrap();
        for i in 0..n {
            // One bf16 rounding of a value in [0.5, 2): at most 2^-8.
            assert!((got[i] - p[i]).abs() <= 2f64.powi(-8), "w[{i}]: {} vs {}", got[i], p[i]);
        }
        assert!((got[0] - init[0]).abs() > 0.1, "the parameters moved");
    }

    /// The flat buckets: parameters become views of one buffer (values kept, shared with the
    /// caller's handles), the state keeps per-parameter names, a parameter without a gradient is
    /// left alone (its bucket falls back to the per-parameter update), and norm → clip → step
    /// clips the gradients the update uses.
    #[test]
    fn flat_buckets_keep_names_values_and_skip_missing_gradients() {
        let cfg: TrainConfig =
            serde_yaml::from_str("{optimizer: adamw, lr: 0.1, weight_decay: 0.0, betas: [0.9, 0.99], eps: 1.0e-8}")
                .unwrap();
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]).set_requires_grad(true);
        let b = Tensor::from_slice(&[5.0f32]).set_requires_grad(true);
        let unused = Tensor::from_slice(&[7.0f32, 8.0]).set_requires_grad(true);
        let vars = vec![
            ("a.w".to_string(), w.shallow_clone()),
            ("a.b".to_string(), b.shallow_clone()),
            ("a.unused".to_string(), unused.shallow_clone()),
        ];
        let mut opt = Optim::new(&cfg, vars);
        assert_eq!(Vec::<f32>::try_from(w.reshape([-1])).unwrap(), [1.0, 2.0, 3.0, 4.0]);
        let names: Vec<String> = opt.state().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"exp_avg.a.w".to_string()) && names.contains(&"exp_avg_sq.a.unused".to_string()));
        opt.zero_grad();
        // Gradient 3 on every element of w and b: norm 3·√5; clipped to norm 1, then Adam's first
        // step moves every parameter by −lr·sign(g) whatever the scale.
        (w.sum(Kind::Float) * 3.0 + &b * 3.0).sum(Kind::Float).backward();
        let norm = opt.grad_norm();
        assert!((norm.double_value(&[]) - 3.0 * 5f64.sqrt()).abs() < 1e-5);
        opt.clip(&norm, 1.0);
        opt.step(0.1);
        let got = Vec::<f32>::try_from(w.reshape([-1])).unwrap();
        for (g, want) in got.iter().zip([0.9f32, 1.9, 2.9, 3.9]) {
            assert!((g - want).abs() < 1e-5, "{got:?}");
        }
        assert!((b.double_value(&[0]) - 4.9).abs() < 1e-5);
        assert_eq!(Vec::<f32>::try_from(&unused).unwrap(), [7.0, 8.0]);
        // exp_avg = (1 − β1)·clipped g = 0.1 · 3/(3√5).
        let m = opt.state().into_iter().find(|(n, _)| n == "exp_avg.a.b").unwrap().1;
        assert!((m.double_value(&[0]) - 0.1 / 5f64.sqrt()).abs() < 1e-6);
        // zero_grad drops the gradients (`None`), and the next backward stores fresh ones: a
        // second gradient is not added to the first.
        opt.zero_grad();
        assert!(!w.grad().defined() && !b.grad().defined());
        (&b * 2.0).sum(Kind::Float).backward();
        assert_eq!(b.grad().double_value(&[0]), 2.0);
        assert!(!w.grad().defined(), "w was not used");
    }
}
