//! `llama`: a LLaMA decoder (Touvron et al. 2023), the ANCRe paper's language model (App. C:
//! 60M–1B, seq 256). Parameter names follow Hugging Face's `LlamaForCausalLM` without the
//! `model.` prefix.
//!
//! Input: token ids `[B, T]` (int64, `T ≤ seq_len`) → `embed_tokens` → `x0` `[B, T, D]`. Each
//! layer is two pre-RMSNorm units without biases: attention (`layers.{b}.self_attn`: RMSNorm
//! `layers.{b}.input_layernorm`, `q_proj`, `k_proj`, `v_proj`, RoPE on q and k, causal multi-head
//! SDPA, `o_proj`) and SwiGLU MLP (`layers.{b}.mlp`: RMSNorm `layers.{b}.post_attention_layernorm`,
//! `down_proj(silu(gate_proj(u)) * up_proj(u))`), so `block_size = 2`; readout: final RMSNorm
//! `norm`, untied `lm_head` → `[B, T, vocab_size]`.
//!
//! Init (Hugging Face, `initializer_range = 0.02`): every Linear and the embedding `N(0, 0.02²)`,
//! RMSNorm weights 1 (eps 1e-6).

use super::gpt::{lm_shapes, ROPE_BASE};
use super::layers::{attention, embed_tokens, pre_norm, FirstValues, Linear, RmsNorm, Rope, ValueMix, ValueResidual};
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, required, OptionError};
use crate::data::DataInfo;
use crate::topology::{Norm, Ports, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, nn::Module, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "llama",
    about: "LLaMA decoder: RMSNorm, RoPE, SwiGLU (language data)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: llama, width: 8, depth: 2, heads: 2}\n\
           data: {kind: synthetic_tokens, vocab: 16, seq_len: 6, batch_size: 2}\n",
};

/// RMSNorm epsilon.
pub const RMS_EPS: f64 = 1e-6;

/// Defaults are the 60M model of the ANCRe/GaLore setups (D = 512, 8 heads) except `depth`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// Defaults to the data's vocabulary; may be larger.
    vocab_size: Option<usize>,
    width: usize,
    /// Number of decoder layers (the stack has 2·depth sublayer units) (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
    heads: usize,
    /// SwiGLU hidden size; default [`default_hidden`].
    hidden: Option<usize>,
    /// Maximum context; defaults to the data's sequence length and may not be shorter.
    seq_len: Option<usize>,
    /// The first layer's attention values mixed into every later layer's (ResFormer).
    value_residual: ValueResidual,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            vocab_size: None,
            width: 512,
            depth: None,
            heads: 8,
            hidden: None,
            seq_len: None,
            value_residual: ValueResidual::None,
        }
    }
}

/// LLaMA's SwiGLU size: `⌊8·D/3⌋` rounded up to a multiple of 64 (LLaMA's `multiple_of`, which
/// Meta sets to 256; 64 wastes less at small widths). D = 512 → 1408, D = 768 → 2048.
pub fn default_hidden(width: usize) -> usize {
    (8 * width / 3).div_ceil(64) * 64
}

#[derive(Debug)]
struct Spec {
    vocab_size: usize,
    width: usize,
    depth: usize,
    heads: usize,
    hidden: usize,
    seq_len: usize,
    value_residual: ValueResidual,
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let depth = required(o.depth, "depth")?;
    let (vocab_size, seq_len) = lm_shapes(data, "llama", o.vocab_size, o.seq_len, o.width, depth, o.heads)?;
    let hidden = o.hidden.unwrap_or(default_hidden(o.width));
    if hidden == 0 || hidden > 1 << 18 {
        return Err(OptionError::new("hidden", hidden, "an integer in 1..=262144"));
    }
    Ok(Box::new(Spec {
        vocab_size,
        width: o.width,
        depth,
        heads: o.heads,
        hidden,
        seq_len,
        value_residual: o.value_residual,
    }))
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let (t, w, h) = (self.seq_len as f64, self.width as f64, self.hidden as f64);
        // q, k, v, o projections, scores + values, SwiGLU (gate, up, down); the untied head.
        let block = 2.0 * t * w * 4.0 * w + 4.0 * t * t * w + 2.0 * 3.0 * t * w * h;
        self.depth as f64 * block + 2.0 * t * w * self.vocab_size as f64
    }

    fn kind(&self) -> &'static str {
        "llama"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: 2 * self.depth, block_size: 2, width: self.width, pre_norm: true, ports: true }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        self.build_llama(vs, compute, false)
    }
    fn build_with_ports(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        self.build_llama(vs, compute, true)
    }
}

impl Spec {
    /// The backbone; with `ports`, every layer after the first also has its key and value ports'
    /// pre-norms.
    fn build_llama(&self, vs: &nn::Path, compute: Kind, ports: bool) -> Box<dyn Backbone> {
        let (d, h) = (self.width as i64, self.hidden as i64);
        let std = nn::Init::Randn { mean: 0.0, stdev: 0.02 };
        let rope = Rope::new(self.seq_len as i64, d / self.heads as i64, ROPE_BASE, vs.device(), compute);
        let lin = |p: &nn::Path, name: &str, i: i64, o: i64| Linear::with_init(&(p / name), i, o, std, None, compute);
        let embed = (vs / "embed_tokens").var("weight", &[self.vocab_size as i64, d], std);
        let mut values = ValueMix::stack(self.value_residual, self.depth, |b| vs / "layers" / b / "self_attn");
        let first = values.iter().find_map(|m| match m {
            Some(ValueMix::First(f)) => Some(f.clone()),
            _ => None,
        });
        let mut units = Vec::new();
        for (b, value) in values.drain(..).enumerate() {
            let p = vs / "layers" / b;
            let ap = &p / "self_attn";
            let port_norms = (ports && b > 0).then(|| {
                let norm = |name: &str| RmsNorm::new(&(&p / name), d, RMS_EPS);
                (norm("key_layernorm"), norm("value_layernorm"))
            });
            units.push(LlamaUnit::Attn(LlamaAttention {
                norm: RmsNorm::new(&(&p / "input_layernorm"), d, RMS_EPS),
                port_norms,
                q: lin(&ap, "q_proj", d, d),
                k: lin(&ap, "k_proj", d, d),
                v: lin(&ap, "v_proj", d, d),
                o: lin(&ap, "o_proj", d, d),
                value,
                heads: self.heads as i64,
                rope: rope.shallow_clone(),
                compute,
            }));
            let mp = &p / "mlp";
            units.push(LlamaUnit::Mlp {
                norm: RmsNorm::new(&(&p / "post_attention_layernorm"), d, RMS_EPS),
                gate: lin(&mp, "gate_proj", d, h),
                up: lin(&mp, "up_proj", d, h),
                down: lin(&mp, "down_proj", h, d),
            });
        }
        Box::new(Llama {
            embed,
            first,
            units,
            norm: RmsNorm::new(&(vs / "norm"), d, RMS_EPS),
            lm_head: lin(vs, "lm_head", d, self.vocab_size as i64),
        })
    }
}

/// An attention or SwiGLU sublayer, `[B, T, D] → [B, T, D]`.
enum LlamaUnit {
    Attn(LlamaAttention),
    Mlp { norm: RmsNorm, gate: Linear, up: Linear, down: Linear },
}

/// `layers.{b}.self_attn` with its pre-norm `layers.{b}.input_layernorm` (and, built with ports,
/// the key and value ports' own `layers.{b}.key_layernorm`, `layers.{b}.value_layernorm`).
struct LlamaAttention {
    norm: RmsNorm,
    /// The key and value ports' pre-norms (built with ports, every layer but the first, which
    /// MUDD feeds one input: there `norm` serves all three ports).
    port_norms: Option<(RmsNorm, RmsNorm)>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// `value_residual`'s mix of the values (None: off).
    value: Option<ValueMix>,
    heads: i64,
    rope: Rope,
    compute: Kind,
}

impl LlamaAttention {
    /// Attention with q, k and v projected from `uq`, `uk`, `uv` `[B, T, D]` (normed), → `[B, T, D]`.
    fn attend(&self, uq: &Tensor, uk: &Tensor, uv: &Tensor) -> Tensor {
        // q, k, then v, as before value_residual: the order the three projections are recorded
        // in is the order their gradients of a shared input are summed in.
        let (q, k) = (self.q.forward(uq), self.k.forward(uk));
        let v = match &self.value {
            Some(mix) => mix.mix(self.v.forward(uv)),
            None => self.v.forward(uv),
        };
        self.o.forward(&attention(&q, &k, &v, self.heads, true, Some(&self.rope), self.compute))
    }
}

impl Unit for LlamaUnit {
    fn forward(&self, x: &Tensor, mode: Norm, _train: bool) -> Tensor {
        match self {
            LlamaUnit::Attn(a) => {
                // fp32 (not `pre_norm_to`): q, k and v each cast it, as autocast does, so that
                // their three input gradients add in fp32; a bf16 norm output would add them in
                // bf16.
                let u = pre_norm(&a.norm, x, mode);
                a.attend(&u, &u, &u)
            }
            LlamaUnit::Mlp { norm, gate, up, down } => {
                let u = pre_norm(norm, x, mode);
                down.forward(&crate::native::choice::swiglu(&gate.forward(&u), &up.forward(&u)))
            }
        }
    }

    /// The attention from its query, key and value ports, each through its own pre-norm.
    fn forward_ports(&self, ports: &Ports, _train: bool) -> Option<Tensor> {
        let LlamaUnit::Attn(a) = self else { return None };
        let (key_norm, value_norm) = a.port_norms.as_ref().map_or((&a.norm, &a.norm), |(k, v)| (k, v));
        Some(a.attend(&a.norm.forward(ports.query), &key_norm.forward(ports.key), &value_norm.forward(ports.value)))
    }
}

struct Llama {
    /// `[vocab_size, D]`.
    embed: Tensor,
    /// `value_residual`'s first-layer values, cleared by the stem (None: off).
    first: Option<FirstValues>,
    units: Vec<LlamaUnit>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Backbone for Llama {
    /// Tokens `[B, T]` int64 → `[B, T, D]`.
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        if let Some(first) = &self.first {
            first.clear();
        }
        embed_tokens(&self.embed, input)
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    /// `[B, T, D]` → logits `[B, T, vocab_size]`.
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        self.lm_head.forward(&self.norm.forward(y))
    }
}
