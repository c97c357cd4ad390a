//! `attnres` — Attention Residuals (Kimi 2026): each unit reads a softmax-weighted mixture of
//! earlier outputs, the weights coming from one learned pseudo-query per unit against the
//! RMS-normalised sources: `input_l = Σ_{i<l} softmax_i(w_l · rms(v_i)) v_i`, `v_0 = x0`, `v_i = h_i`,
//! and the readout likewise with its own query. `topology.queries` `[L+1, D]`, init 0: a uniform
//! *mean* of the sources (not the residual sum). `blocks: N > 0` is the block variant: units in N
//! groups; sources are `x0`, the sums of completed groups and the current group's partial sum.
//! The RMS norm and the softmax run in fp32. Effective C: the attention weights, averaged over
//! batch and tokens, spread over the units each source sums.
//!
//! Where a fused kernel takes the step — a CUDA device or the CPU under
//! `PLEXUS_FUSED_KERNELS=cuda-host` with an fp32 stream (`native/src/attnres.cu`), or the CPU in an
//! fp32 or fp64 run with the fused kernels on (the row loops of `native/src/stream_rows.inc`, the
//! same arithmetic) — every source is also pushed into a history buffer ([`common::History`]) and
//! each unit's attention is one kernel each way over it, reading each source once per row;
//! elsewhere (bf16 streams, bf16 runs on the CPU, `PLEXUS_FUSED_KERNELS=0`, a paired trace) the
//! composite below.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native;
use serde::Deserialize;
use std::cell::OnceCell;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "attnres",
    display: "AttnRes",
    about: "Attention Residuals: softmax attention over earlier outputs per unit (full or block)",
    parse,
    color: (23, 190, 207),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// 0 = full AttnRes; N > 0 = block AttnRes with N groups.
    #[serde(default)]
    blocks: usize,
    granularity: Option<Granularity>,
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    depth: usize,
    width: usize,
    blocks: usize,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    if o.blocks > depth {
        return Err(OptionError::new("blocks", o.blocks, format!("0 (full) or a number of groups in 1..={depth}")));
    }
    Ok(Box::new(Spec { granularity, depth, width: stack.width, blocks: o.blocks }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        if self.blocks == 0 {
            "full".into()
        } else {
            format!("{} blocks", self.blocks)
        }
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        let queries = vs.zeros("queries", &[self.depth as i64 + 1, self.width as i64]);
        let group = if self.blocks == 0 { 1 } else { self.depth.div_ceil(self.blocks) };
        Box::new(AttnRes { queries, group, full: self.blocks == 0, compute })
    }
}

struct AttnRes {
    queries: Tensor,
    /// Units per group (block variant).
    group: usize,
    full: bool,
    /// The units' compute dtype: the CPU row loops take only a stream in it (see `run`).
    compute: Kind,
}

/// A source: its value `[.., D]`, which unit outputs it sums (0 = x0), its row in the history
/// buffer (the fused path), and the reciprocal of its RMS `[..]` (fp32; the composite's, computed
/// once on first use, however many later units attend to it).
struct Source {
    value: Tensor,
    members: Vec<usize>,
    slot: usize,
    inv_rms: OnceCell<Tensor>,
}

impl Source {
    /// A new source; with a history, `value` is pushed into it (its next row) and the source holds
    /// the push's output, through which the history's readers send it their gradients.
    fn new(value: Tensor, members: Vec<usize>, history: Option<&mut common::History>) -> Source {
        let (value, slot) = match history {
            Some(h) => (h.push(value).shallow_clone(), h.len() - 1),
            None => (value, 0),
        };
        Source { value, members, slot, inv_rms: OnceCell::new() }
    }

    /// What the attention weights are computed from: the value, or under a paired trace
    /// ([`common::paired_trace`]) its first half, the values (the second, coefficients, is mixed
    /// with the values' weights).
    fn key(&self) -> Tensor {
        if common::paired_trace() {
            self.value.get(0)
        } else {
            self.value.shallow_clone()
        }
    }

    /// 1/√(mean(v²) + ε) `[..]` of the key from one norm over D (one read of v, forward and
    /// backward), not a squared temporary and a mean.
    fn inv_rms(&self) -> &Tensor {
        self.inv_rms.get_or_init(|| {
            let key = self.key();
            let d = *key.size().last().expect("a source has a feature axis") as f64;
            let norm = key.norm_scalaropt_dim_dtype(2.0, [-1i64].as_slice(), false, common::stream_kind(key.kind()));
            (norm.square() / d + 1e-6).rsqrt()
        })
    }
}

impl AttnRes {
    /// Attention of query `q` `[D]` over the sources; returns the mixture `[.., D]` and the weights
    /// `[.., m]`. With a history, plexus' kernels where they run ([`common::History::attend`]).
    ///
    /// The composite: `rms(v_i)·w = (v_i·w)/rms(v_i)`: each logit is one matrix–vector product over
    /// the source as it is, scaled by its cached `1/rms` — the normalised source is never
    /// materialised (the first version normalised every earlier source again for every unit: O(L²)
    /// full-size temporaries). The mixture is an `addcmul` chain: one pass per source, no `α_i v_i`
    /// temporaries.
    fn attend(&self, query: &Tensor, sources: &[&Source], history: Option<&common::History>) -> (Tensor, Tensor) {
        if let Some(h) = history {
            let slots: Vec<usize> = sources.iter().map(|s| s.slot).collect();
            if let Some(fused) = h.attend(&slots, query) {
                return fused;
            }
        }
        let logits: Vec<Tensor> =
            sources.iter().map(|s| common::in_stream_kind(&s.key()).matmul(query) * s.inv_rms()).collect();
        let alpha = Tensor::stack(&logits, -1);
        let alpha = alpha.softmax(-1, common::stream_kind(alpha.kind()));
        let weight = |i: usize, s: &Source| alpha.select(-1, i as i64).unsqueeze(-1).to_kind(s.value.kind());
        let first = &sources[0].value * weight(0, sources[0]);
        let mixture = sources.iter().enumerate().skip(1).fold(first, |y, (i, s)| y.addcmul(&s.value, &weight(i, s)));
        (mixture, alpha)
    }

    /// Runs the stack; with `trace`, collects the columns of C.
    fn run(&self, x0: &Tensor, units: &[&dyn Unit], train: bool, mut trace: Option<&mut Vec<Vec<f64>>>) -> Tensor {
        let l = units.len();
        // One `unbind` of the queries (backward: one `stack`), not a `get` per unit, whose
        // backward writes a zero `[L+1, D]` gradient each time.
        let queries = self.queries.unbind(0);
        let mut column = |alpha: &Tensor, sources: &[&Source]| {
            if let Some(cols) = trace.as_deref_mut() {
                let mean = common::to_vec(&alpha.reshape([-1, sources.len() as i64]).mean_dim(0, false, Kind::Double));
                let mut col = vec![0.0; l + 1];
                for (w, s) in mean.iter().zip(sources) {
                    for &i in &s.members {
                        col[i] += w;
                    }
                }
                cols.push(col);
            }
        };
        // The fused path's history: x0, then every unit's output (full) or its group's partial sum
        // after it (block), one row each.
        // The CPU row loops only where the units compute in the stream's dtype: their logits differ
        // from the composite's by a float32 unit (another summation order), which a bf16 unit's
        // rounding would turn into a bf16 unit on some tokens (parity/SPEC.md, Tolerance) — a
        // bf16 run on the CPU keeps the composite, the reference's arithmetic.
        let gpu = native::choice::takes_gpu_paths(x0) && x0.kind() == Kind::Float;
        let rows = native::choice::fused_streams_take(x0) && self.compute == x0.kind();
        let fused = (gpu || rows) && l < native::kernels::ATTNRES_MAX_SOURCES && !common::paired_trace();
        let mut history = fused.then(|| common::History::new(l + 1, x0));
        let mut done: Vec<Source> = vec![Source::new(x0.shallow_clone(), vec![0], history.as_mut())];
        let mut partial: Option<Source> = None;
        for (k, f) in units.iter().enumerate() {
            let sources: Vec<&Source> = done.iter().chain(partial.as_ref()).collect();
            let (input, alpha) = self.attend(&queries[k], &sources, history.as_ref());
            column(&alpha, &sources);
            let h = f.forward(&input, Norm::Default, train);
            if self.full {
                done.push(Source::new(h, vec![k + 1], history.as_mut()));
                continue;
            }
            let p = match partial.take() {
                Some(p) => Source::new(p.value + h, [p.members, vec![k + 1]].concat(), history.as_mut()),
                None => Source::new(h, vec![k + 1], history.as_mut()),
            };
            if (k + 1) % self.group == 0 || k + 1 == l {
                done.push(p);
            } else {
                partial = Some(p);
            }
        }
        let sources: Vec<&Source> = done.iter().collect();
        let (y, alpha) = self.attend(&queries[l], &sources, history.as_ref());
        column(&alpha, &sources);
        y
    }
}

impl Topology for AttnRes {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        self.run(x0, units, train, None)
    }

    /// The mean attention weights, spread over the units each source sums (= C).
    fn parameter_view_on(&self, x0: &Tensor, units: &[&dyn Unit]) -> Option<(String, Tensor)> {
        Some(("mean_alpha".into(), self.connectivity(x0, units)))
    }

    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        let mut cols = Vec::new();
        let _ = tch::no_grad(|| self.run(x0, units, false, Some(&mut cols)));
        common::connectivity_from_columns(&cols)
    }
}
