//! `gpt`: a GPT-2 decoder (nanoGPT) with rotary position embeddings instead of learned ones, the
//! H-ACN paper's language model (Tables 4–5: 24 layers, 12 heads, D = 768, seq 256, dropout 0.2).
//!
//! Input: token ids `[B, T]` (int64, `T ≤ seq_len`) → `wte` → `x0` `[B, T, D]` (no position
//! embedding: positions enter through RoPE in every attention unit). Each layer is two pre-LN
//! units, attention (`blocks.{b}.attn`: `norm`, `qkv` `D → 3D`, causal multi-head SDPA with RoPE
//! on q and k, `proj`, dropout) and MLP (`blocks.{b}.mlp`: `norm`, `fc1` `D → 4D`, GELU with the
//! tanh approximation, `fc2`, dropout), so `block_size = 2`; readout: final `norm`, then the LM
//! head tied to the embedding, `logits = norm(y) @ wte.weightᵀ` → `[B, T, vocab_size]`.
//!
//! Init (nanoGPT): Linear weights and the embedding `N(0, 0.02²)`, biases 0, the residual
//! projections `proj` and `fc2` `N(0, (0.02/√(2·depth))²)`, LayerNorms 1 and 0.

use super::layers::{
    attention, dropout, embed_tokens, linear, pre_norm_to, FirstValues, LayerNorm, Linear, Rope, ValueMix,
    ValueResidual,
};
use super::{Backbone, ModelEntry, ModelSpec};
use crate::config::{parse_options, required, OptionError};
use crate::data::{DataInfo, Task};
use crate::topology::{Norm, Ports, StackInfo, Unit};
use serde::{Deserialize, Serialize};
use tch::{nn, nn::Module, Kind, Tensor};

pub const ENTRY: ModelEntry = ModelEntry {
    name: "gpt",
    about: "GPT-2 decoder with RoPE and a tied head (language data)",
    parse,
    options: crate::config::option_defaults::<Options>,
    tiny: "model: {kind: gpt, width: 8, depth: 2, heads: 2}\n\
           data: {kind: synthetic_tokens, vocab: 16, seq_len: 6, batch_size: 2}\n",
};

/// RoPE base (GPT-NeoX / LLaMA).
pub const ROPE_BASE: f64 = 10_000.0;

/// Defaults are the paper's GPT-2 medium-like model except `depth` (required) and `dropout` (0).
#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// Defaults to the data's vocabulary; may be larger (e.g. GPT-2's 50257 padded to 50304).
    vocab_size: Option<usize>,
    width: usize,
    /// Number of Transformer layers (the stack has 2·depth sublayer units) (required).
    #[serde(deserialize_with = "crate::config::present", serialize_with = "crate::config::mark_required")]
    depth: Option<usize>,
    heads: usize,
    /// Maximum context; defaults to the data's sequence length and may not be shorter.
    seq_len: Option<usize>,
    dropout: f64,
    /// Biases in the Linears and LayerNorms (nanoGPT's `bias`).
    bias: bool,
    /// The first layer's attention values mixed into every later layer's (ResFormer).
    value_residual: ValueResidual,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            vocab_size: None,
            width: 768,
            depth: None,
            heads: 12,
            seq_len: None,
            dropout: 0.0,
            bias: true,
            value_residual: ValueResidual::None,
        }
    }
}

#[derive(Debug)]
struct Spec {
    vocab_size: usize,
    width: usize,
    depth: usize,
    heads: usize,
    seq_len: usize,
    dropout: f64,
    bias: bool,
    value_residual: ValueResidual,
}

/// The data's `(vocab, seq_len)` for a language model, or an error naming `kind`.
pub(crate) fn language_data(kind: &str, data: &DataInfo) -> Result<(usize, usize), OptionError> {
    match (data.task, data.input_shape.as_slice()) {
        (Task::LanguageModel, [t]) => Ok((data.output_dim, *t)),
        (task, shape) => Err(OptionError::new(
            "kind",
            kind,
            format!(
                "language-model data (token sequences [T], next-token targets; e.g. `synthetic_tokens`); \
                 this dataset is {task:?} with samples of shape {shape:?}"
            ),
        )),
    }
}

/// Checks the options shared by the language models and resolves `(vocab_size, seq_len)`.
pub(crate) fn lm_shapes(
    data: &DataInfo,
    kind: &str,
    vocab_size: Option<usize>,
    seq_len: Option<usize>,
    width: usize,
    depth: usize,
    heads: usize,
) -> Result<(usize, usize), OptionError> {
    let (vocab, t) = language_data(kind, data)?;
    for (key, v) in [("width", width), ("depth", depth), ("heads", heads)] {
        if v == 0 || v > 1 << 16 {
            return Err(OptionError::new(key, v, "an integer in 1..=65536"));
        }
    }
    if !width.is_multiple_of(heads) || !(width / heads).is_multiple_of(2) {
        return Err(OptionError::new(
            "heads",
            heads,
            format!("a divisor of width = {width} leaving an even head dimension (RoPE)"),
        ));
    }
    let vocab_size = vocab_size.unwrap_or(vocab);
    if vocab_size < vocab || vocab_size > 1 << 24 {
        return Err(OptionError::new(
            "vocab_size",
            vocab_size,
            format!("at least the data's vocabulary {vocab} (at most 2^24), or leave it out"),
        ));
    }
    let seq_len = seq_len.unwrap_or(t);
    if seq_len < t || seq_len > 1 << 20 {
        return Err(OptionError::new(
            "seq_len",
            seq_len,
            format!("at least the data's sequence length {t} (at most 2^20), or leave it out"),
        ));
    }
    Ok((vocab_size, seq_len))
}

fn parse(opts: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let depth = required(o.depth, "depth")?;
    let (vocab_size, seq_len) = lm_shapes(data, "gpt", o.vocab_size, o.seq_len, o.width, depth, o.heads)?;
    if !(0.0..1.0).contains(&o.dropout) {
        return Err(OptionError::new("dropout", o.dropout, "a probability in [0, 1)"));
    }
    Ok(Box::new(Spec {
        vocab_size,
        width: o.width,
        depth,
        heads: o.heads,
        seq_len,
        dropout: o.dropout,
        bias: o.bias,
        value_residual: o.value_residual,
    }))
}

impl ModelSpec for Spec {
    fn forward_flops(&self) -> f64 {
        let (t, w) = (self.seq_len as f64, self.width as f64);
        // qkv + output projection, scores + values, MLP w→4w→w; the tied head on every position.
        let block = 2.0 * t * w * 4.0 * w + 4.0 * t * t * w + 2.0 * 2.0 * t * w * 4.0 * w;
        self.depth as f64 * block + 2.0 * t * w * self.vocab_size as f64
    }

    fn kind(&self) -> &'static str {
        "gpt"
    }
    fn stack(&self) -> StackInfo {
        StackInfo { sublayers: 2 * self.depth, block_size: 2, width: self.width, pre_norm: true, ports: true }
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        self.build_gpt(vs, compute, false)
    }
    fn build_with_ports(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        self.build_gpt(vs, compute, true)
    }
}

impl Spec {
    /// The backbone; with `ports`, every layer after the first also has its key and value ports'
    /// pre-norms.
    fn build_gpt(&self, vs: &nn::Path, compute: Kind, ports: bool) -> Box<dyn Backbone> {
        let d = self.width as i64;
        let std = nn::Init::Randn { mean: 0.0, stdev: 0.02 };
        let resid = nn::Init::Randn { mean: 0.0, stdev: 0.02 / (2.0 * self.depth as f64).sqrt() };
        let bias = self.bias.then_some(nn::Init::Const(0.0));
        let rope = Rope::new(self.seq_len as i64, d / self.heads as i64, ROPE_BASE, vs.device(), compute);
        let wte = (vs / "wte").var("weight", &[self.vocab_size as i64, d], std);
        let mut values = ValueMix::stack(self.value_residual, self.depth, |b| vs / "blocks" / b / "attn");
        let first = values.iter().find_map(|m| match m {
            Some(ValueMix::First(f)) => Some(f.clone()),
            _ => None,
        });
        let mut units = Vec::new();
        for (b, value) in values.drain(..).enumerate() {
            let p = vs / "blocks" / b;
            let ap = &p / "attn";
            let port_norms = (ports && b > 0).then(|| {
                (LayerNorm::new(&(&ap / "key_norm"), d, self.bias), LayerNorm::new(&(&ap / "value_norm"), d, self.bias))
            });
            units.push(GptUnit::Attn {
                norm: LayerNorm::new(&(&ap / "norm"), d, self.bias),
                port_norms,
                qkv: Linear::with_init(&(&ap / "qkv"), d, 3 * d, std, bias, compute),
                proj: Linear::with_init(&(&ap / "proj"), d, d, resid, bias, compute),
                value,
                heads: self.heads as i64,
                rope: rope.shallow_clone(),
                dropout: self.dropout,
                compute,
            });
            let mp = &p / "mlp";
            units.push(GptUnit::Mlp {
                norm: LayerNorm::new(&(&mp / "norm"), d, self.bias),
                fc1: Linear::with_init(&(&mp / "fc1"), d, 4 * d, std, bias, compute),
                fc2: Linear::with_init(&(&mp / "fc2"), 4 * d, d, resid, bias, compute),
                dropout: self.dropout,
            });
        }
        Box::new(Gpt { wte, first, units, norm: LayerNorm::new(&(vs / "norm"), d, self.bias), compute })
    }
}

/// An attention or MLP sublayer, `[B, T, D] → [B, T, D]`.
enum GptUnit {
    Attn {
        norm: LayerNorm,
        /// The key and value ports' pre-norms `key_norm`, `value_norm` (built with ports, every
        /// layer but the first, which MUDD feeds one input: there `norm` serves all three ports).
        port_norms: Option<(LayerNorm, LayerNorm)>,
        qkv: Linear,
        proj: Linear,
        /// `value_residual`'s mix of the values (None: off).
        value: Option<ValueMix>,
        heads: i64,
        rope: Rope,
        dropout: f64,
        compute: Kind,
    },
    Mlp {
        norm: LayerNorm,
        fc1: Linear,
        fc2: Linear,
        dropout: f64,
    },
}

impl Unit for GptUnit {
    fn forward(&self, x: &Tensor, mode: Norm, train: bool) -> Tensor {
        match self {
            GptUnit::Attn { norm, qkv, proj, value, heads, rope, dropout: p, compute, .. } => {
                let u = pre_norm_to(norm, x, mode, *compute);
                let qkv = qkv.forward(&u).chunk(3, -1); // q, k, v: [B, T, D] each
                let v = match value {
                    Some(mix) => mix.mix(qkv[2].shallow_clone()),
                    None => qkv[2].shallow_clone(),
                };
                let a = attention(&qkv[0], &qkv[1], &v, *heads, true, Some(rope), *compute);
                dropout(proj.forward(&a), *p, train)
            }
            GptUnit::Mlp { norm, fc1, fc2, dropout: p } => {
                let u = pre_norm_to(norm, x, mode, fc1.compute);
                dropout(fc2.forward(&fc1.forward(&u).gelu("tanh")), *p, train)
            }
        }
    }

    /// The attention from its query, key and value ports, each through its own pre-norm and its
    /// third of `qkv` (rows `0..D` for q, `D..2D` for k, `2D..3D` for v, with their biases).
    fn forward_ports(&self, ports: &Ports, train: bool) -> Option<Tensor> {
        let GptUnit::Attn { norm, port_norms, qkv, proj, value, heads, rope, dropout: p, compute } = self else {
            return None;
        };
        let (key_norm, value_norm) = port_norms.as_ref().map_or((norm, norm), |(k, v)| (k, v));
        let d = qkv.weight.size()[1];
        let third = |x: &Tensor, i: i64| {
            let bias = qkv.bias.as_ref().map(|b| b.narrow(0, i * d, d));
            linear(x, &qkv.weight.narrow(0, i * d, d), bias.as_ref(), *compute)
        };
        let (q, k) = (third(&norm.forward(ports.query), 0), third(&key_norm.forward(ports.key), 1));
        let v = third(&value_norm.forward(ports.value), 2);
        let v = match value {
            Some(mix) => mix.mix(v),
            None => v,
        };
        let a = attention(&q, &k, &v, *heads, true, Some(rope), *compute);
        Some(dropout(proj.forward(&a), *p, train))
    }
}

struct Gpt {
    /// `[vocab_size, D]`: the token embedding and the (tied) LM head.
    wte: Tensor,
    /// `value_residual`'s first-layer values, cleared by the stem (None: off).
    first: Option<FirstValues>,
    units: Vec<GptUnit>,
    norm: LayerNorm,
    compute: Kind,
}

impl Backbone for Gpt {
    /// Tokens `[B, T]` int64 → `[B, T, D]`.
    fn embed(&self, input: &Tensor, _train: bool) -> Tensor {
        if let Some(first) = &self.first {
            first.clear();
        }
        embed_tokens(&self.wte, input)
    }
    fn units(&self) -> Vec<&dyn Unit> {
        self.units.iter().map(|u| u as &dyn Unit).collect()
    }
    /// `[B, T, D]` → logits `[B, T, vocab_size]`.
    fn readout(&self, y: &Tensor, _train: bool) -> Tensor {
        linear(&self.norm.forward(y), &self.wte, None, self.compute)
    }
}
