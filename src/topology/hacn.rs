//! `hacn` — Hybrid ACN (H-ACN Alg. 1, App. G): trainable residual weights between chained units,
//! plus ACN's long connections to the readout:
//! `x_k = f_k(x_{k-1}) + a_k · x_{k-1}`, `y = x0 + Σ_k h_k` (or `y = x_L` with `long: false`).
//!
//! `a = 0` is ACN and `a = 1` is the residual network, exactly. C: `C[i][k] = Π_{l=i+1}^{k-1} a_l`
//! (empty product 1), readout all ones. `Γ = ‖a‖₂/√L`.
//!
//! * `topology.alpha` `[L]`, init `N(μ, σ)` (paper default μ = 0.25, σ = 0.005) or the ablation
//!   schedules `half_layers`, `exp_decay`, `constant`; drawn from the run's seed.
//! * `convention: alpha` (the paper, and the authors' ViT/Mixer code): `a = alpha`;
//!   `one_minus_alpha` (the authors' GPT code): `a = 1 − alpha`, so "μ = 0.25" starts at 0.75.
//! * `depth_ln: true` (App. D, eq. 7): each unit's pre-norm becomes `α_l · LN(x)` with
//!   `α_l = 1 + l·s_l` and a learnable strength `s_l` per unit (`topology.norm_strength[l-1]`,
//!   initialised at 0.05: "one extra parameter per layer"); the final norm stays plain. Learning
//!   `s_l` rather than `α_l` itself matters under AdamW, whose steps are about the same size for
//!   every parameter: `α_l` then moves l times as fast as `s_l`, as in the paper.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native;
use serde::Deserialize;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "hacn",
    display: "H-ACN",
    about: "Hybrid ACN: trainable residual weights a_k + long connections to the readout",
    parse,
    color: (44, 160, 44),
};

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Init {
    Normal {
        #[serde(default = "mu")]
        mu: f64,
        #[serde(default = "sigma")]
        sigma: f64,
    },
    HalfLayers {
        #[serde(default = "mu_first")]
        mu_first: f64,
        #[serde(default = "mu_second")]
        mu_second: f64,
        #[serde(default = "sigma")]
        sigma: f64,
    },
    ExpDecay {
        #[serde(default = "mu")]
        mu_start: f64,
        #[serde(default = "mu_end")]
        mu_end: f64,
        #[serde(default = "sigma")]
        sigma: f64,
    },
    Constant {
        value: f64,
    },
}

fn mu() -> f64 {
    0.25
}
fn sigma() -> f64 {
    0.005
}
fn mu_first() -> f64 {
    0.4
}
fn mu_second() -> f64 {
    0.15
}
fn mu_end() -> f64 {
    0.1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Convention {
    Alpha,
    OneMinusAlpha,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    init: Init,
    depth_ln: bool,
    long: bool,
    convention: Convention,
    learnable: bool,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            init: Init::Normal { mu: mu(), sigma: sigma() },
            depth_ln: false,
            long: true,
            convention: Convention::Alpha,
            learnable: true,
            granularity: None,
        }
    }
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    init: Init,
    depth_ln: bool,
    long: bool,
    convention: Convention,
    learnable: bool,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    let (values, sigma) = match &o.init {
        Init::Normal { mu, sigma } => (vec![("init.mu", *mu)], *sigma),
        Init::HalfLayers { mu_first, mu_second, sigma } => {
            (vec![("init.mu_first", *mu_first), ("init.mu_second", *mu_second)], *sigma)
        }
        Init::ExpDecay { mu_start, mu_end, sigma } => {
            if *mu_start <= 0.0 || *mu_end <= 0.0 {
                return Err(OptionError::new("init.mu_end", mu_end, "mu_start and mu_end > 0 (geometric decay)"));
            }
            (vec![("init.mu_start", *mu_start), ("init.mu_end", *mu_end)], *sigma)
        }
        Init::Constant { value } => (vec![("init.value", *value)], 0.0),
    };
    for (key, v) in values {
        if !v.is_finite() {
            return Err(OptionError::new(key, v, "a finite number"));
        }
    }
    if !(sigma.is_finite() && sigma >= 0.0) {
        return Err(OptionError::new("init.sigma", sigma, "a finite standard deviation ≥ 0"));
    }
    if o.depth_ln && !stack.pre_norm {
        return Err(OptionError::new("depth_ln", true, "false: this backbone's units have no pre-norm to scale"));
    }
    Ok(Box::new(Spec {
        granularity,
        depth,
        init: o.init,
        depth_ln: o.depth_ln,
        long: o.long,
        convention: o.convention,
        learnable: o.learnable,
    }))
}

impl Spec {
    /// The per-unit means of the alpha initialisation, and its standard deviation.
    fn init_means(&self) -> (Vec<f64>, f64) {
        let l = self.depth;
        match self.init {
            Init::Normal { mu, sigma } => (vec![mu; l], sigma),
            Init::HalfLayers { mu_first, mu_second, sigma } => {
                ((0..l).map(|k| if k < l.div_ceil(2) { mu_first } else { mu_second }).collect(), sigma)
            }
            Init::ExpDecay { mu_start, mu_end, sigma } => {
                let t = |k: usize| if l > 1 { k as f64 / (l - 1) as f64 } else { 0.0 };
                ((0..l).map(|k| mu_start * (mu_end / mu_start).powf(t(k))).collect(), sigma)
            }
            Init::Constant { value } => (vec![value; l], 0.0),
        }
    }
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        let init = match &self.init {
            Init::Normal { mu, .. } => format!("μ={mu}"),
            Init::HalfLayers { mu_first, mu_second, .. } => format!("half {mu_first}/{mu_second}"),
            Init::ExpDecay { mu_start, mu_end, .. } => format!("exp {mu_start}→{mu_end}"),
            Init::Constant { value } => format!("a={value}"),
        };
        let mut parts = vec![init];
        if self.convention == Convention::OneMinusAlpha {
            parts.push("1−α".into());
        }
        if self.depth_ln {
            parts.push("DLN".into());
        }
        if !self.long {
            parts.push("w/o long".into());
        }
        if !self.learnable {
            parts.push("frozen".into());
        }
        parts.join(", ")
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        let (means, sigma) = self.init_means();
        let dev = vs.device();
        let init = Tensor::from_slice(&means).to_kind(Kind::Float).to_device(dev)
            + Tensor::randn([self.depth as i64], (Kind::Float, dev)) * sigma;
        let alpha = common::param_from(vs, "alpha", &init, self.learnable);
        let depth_ln = self.depth_ln.then(|| common::DepthLn::new(vs, self.depth));
        Box::new(Hacn { alpha, depth_ln, long: self.long, convention: self.convention })
    }
}

struct Hacn {
    alpha: Tensor,
    depth_ln: Option<common::DepthLn>,
    long: bool,
    convention: Convention,
}

impl Hacn {
    /// The residual weights `a` `[L]`.
    fn a(&self) -> Tensor {
        match self.convention {
            Convention::Alpha => self.alpha.shallow_clone(),
            Convention::OneMinusAlpha => 1.0 - &self.alpha,
        }
    }
}

impl Topology for Hacn {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // The per-unit scalars as one `unbind` each: its backward is one `stack`, where a `get(k)`
        // per unit costs a zero-filled `[L]` gradient, a copy and an accumulation per unit.
        let a = self.a().unbind(0);
        let scales = self.depth_ln.as_ref().map(common::DepthLn::scales);
        let mut x = x0.shallow_clone();
        let mut acc = x0.shallow_clone();
        for (k, f) in units.iter().enumerate() {
            let norm = scales.as_ref().map_or(Norm::Default, |s| Norm::Scaled(&s[k]));
            // `h` in its compute dtype (see `Unit::forward_compute`).
            let h = f.forward_compute(&x, norm, train);
            if !self.long {
                // Read once: `h + a_k·x` as one kernel, type promotion making it fp32.
                x = h.addcmul(&x, &a[k]);
                continue;
            }
            // The long path: on a GPU one kernel each way ([`native::choice::hacn_step_gpu`]); otherwise
            // `h` in fp32, read twice, so that its two gradients add in fp32.
            if let Some((xn, accn)) = native::choice::hacn_step_gpu(&x, &acc, &h, &a[k]) {
                (x, acc) = (xn, accn);
                continue;
            }
            let h = common::in_stream_kind(&h);
            x = h.addcmul(&x, &a[k]);
            acc = acc + h;
        }
        if self.long {
            acc
        } else {
            x
        }
    }

    fn parameter_view(&self) -> Option<(String, Tensor)> {
        Some((super::RESIDUAL_WEIGHTS.into(), crate::host::to_cpu(&self.a().to_kind(Kind::Double)).unsqueeze(0)))
    }

    fn gamma(&self) -> Option<Tensor> {
        // ‖a‖₂/√L = sqrt(mean(a²)), on the device: no read here.
        Some(self.a().detach().to_kind(Kind::Double).square().mean(Kind::Double).sqrt())
    }
}
