//! `compose` — a depth rule over a width rule (docs/topologies.md, "compose"): the depth rule
//! (`residual`, `hacn`, `ancre`, `denseformer`, `layercomb`, `attnres`, `graph`) runs with its
//! states widened from `[.., D]` to n streams `[.., n, D]` (n copies of `x0`), and every unit
//! replaced by the width rule's step increment
//! `ΔH_k(H) = (res − I)ᵀ H + post ⊗ f_k(Σ_s pre[s] H_s)`, whose weights `(pre, res, post)` the
//! width rule (`hyper`, `mhc`, or `single`: one stream, `pre = res = post = 1`) computes from
//! the `H` the depth rule hands the unit. The readout reads the mean over streams of the depth
//! rule's output. `width: single` gives the depth rule alone (bit for bit: `res − I = 0`,
//! `post = 1`), `depth: residual` the width rule alone (`H + ΔH = resᵀH + post ⊗ o`, one more
//! rounding per element).
//!
//! Parameters: the depth rule's under `topology.depth.`, the width rule's under `topology.width.`,
//! each named as that topology alone names them. One granularity for both.
//!
//! C: the coefficient of `h_i` in unit k's input with every mixing weight held at its value on
//! the batch, averaged over batch and tokens — computed by a *paired trace*
//! ([`common::paired_trace`]): the depth rule runs on `[values, coefficients]` stacked on a new
//! leading axis, so that its own code carries the coefficients; each unit mixes both halves
//! with the weights its width rule takes from the values.

use super::common::{self, StreamMixing};
use super::{Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use crate::native::choice::{stream_read, stream_write};
use serde::Deserialize;
use std::cell::RefCell;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "compose",
    display: "Composed",
    about: "a depth rule (residual, H-ACN, ANCRe, DenseFormer, LayerComb, AttnRes, graph) over a width rule (HC, mHC)",
    parse,
    color: (60, 60, 60),
};

/// The depth rules `compose` lifts over streams: every one mixes states or unit outputs with
/// scalar weights (or, AttnRes, weights it computes per stream under a paired trace), so its code
/// runs unchanged on `[.., n, D]` and carries a paired trace's coefficients.
pub const DEPTH_RULES: &[&str] = &["residual", "hacn", "ancre", "denseformer", "layercomb", "attnres", "graph"];

/// Compositions the self-test (`plexus doctor --selftest`) trains on every backbone beside every
/// topology: `(name, topology)`, one per width rule, a depth rule at each granularity.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("attnres.mhc", "{kind: compose, depth: {kind: attnres, blocks: 2}, width: {kind: mhc, n: 2}}"),
    ("dense.hyper", "{kind: compose, depth: {kind: denseformer}, width: {kind: hyper, n: 2}}"),
];

/// The width rules: `single` (one stream) and every topology with a
/// [`TopologySpec::build_width_rule`].
pub const WIDTH_RULES: &[&str] = &["single", "hyper", "mhc"];

/// Why a topology is not a depth rule of `compose`.
fn refusal(kind: &str) -> String {
    let allowed = DEPTH_RULES.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
    let why = match kind {
        "plain" | "acn" => "it carries no stream that a unit's output is added to: over n streams each unit would replace the streams by the width rule's increment",
        "hyper" | "mhc" => "it is a width rule: give it as `width`",
        "compose" => "it is a composition already: compose one depth rule over one width rule",
        "densenet" | "laurel" => "it maps the states through D × D projections, which a width rule's streams do not share and a paired trace cannot carry",
        _ => "compose has no lifted form of it",
    };
    format!("a depth rule, one of {allowed} (not `{kind}`: {why})")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    #[serde(default)]
    depth: Option<serde_yaml::Mapping>,
    #[serde(default)]
    width: Option<serde_yaml::Mapping>,
    granularity: Option<Granularity>,
}

#[derive(Debug)]
struct Spec {
    depth: Box<dyn TopologySpec>,
    /// None: `single`, one stream.
    width: Option<Box<dyn TopologySpec>>,
}

/// A part's `kind` and its other options, `granularity` set to `g` where given (a part that sets
/// another is refused); `part` (`depth`, `width`) prefixes the keys of its errors.
fn part(
    part: &str,
    opts: Option<&serde_yaml::Mapping>,
    default: &str,
    g: Option<Granularity>,
) -> Result<(String, serde_yaml::Mapping), OptionError> {
    let mut opts = opts.cloned().unwrap_or_default();
    let kind = match opts.remove("kind") {
        None => default.to_string(),
        Some(serde_yaml::Value::String(k)) => k,
        Some(v) => return Err(OptionError::new(format!("{part}.kind"), format!("{v:?}"), "a topology name")),
    };
    if let Some(g) = g {
        let given = opts.get("granularity").cloned();
        let want = serde_yaml::to_value(g).expect("a granularity serialises");
        match given {
            None => {
                opts.insert("granularity".into(), want);
            }
            Some(v) if v == want => {}
            Some(v) => {
                return Err(OptionError::new(
                    format!("{part}.granularity"),
                    crate::config::scalar_text(&v).unwrap_or_default(),
                    format!(
                        "the granularity of the whole composition ({g:?}, lowercase): both rules wire the same units"
                    ),
                ))
            }
        }
    }
    Ok((kind, opts))
}

/// Prefixes an option error of a part with the part's name.
fn within(part: &str, e: OptionError) -> OptionError {
    let key = if e.key.is_empty() { part.to_string() } else { format!("{part}.{}", e.key) };
    OptionError { key, ..e }
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (kind, depth_opts) = part("depth", o.depth.as_ref(), "residual", o.granularity)?;
    if !DEPTH_RULES.contains(&kind.as_str()) {
        return Err(OptionError::new("depth.kind", &kind, refusal(&kind)));
    }
    let depth = super::parse(&kind, &depth_opts, stack).map_err(|e| within("depth", e))?;
    // The width rule wires the depth rule's units: its granularity is the depth rule's.
    let g = depth.granularity();
    let (kind, width_opts) = part("width", o.width.as_ref(), "single", Some(g))?;
    let width = match kind.as_str() {
        "single" => {
            if let Some((k, v)) = width_opts.iter().find(|(k, _)| k.as_str() != Some("granularity")) {
                let key = crate::config::scalar_text(k).unwrap_or_default();
                let value = crate::config::scalar_text(v).unwrap_or_default();
                return Err(OptionError::new(format!("width.{key}"), value, "no option: `single` is one stream"));
            }
            None
        }
        k if WIDTH_RULES.contains(&k) => Some(super::parse(k, &width_opts, stack).map_err(|e| within("width", e))?),
        k => {
            let allowed = WIDTH_RULES.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
            return Err(OptionError::new("width.kind", k, format!("a width rule, one of {allowed}")));
        }
    };
    Ok(Box::new(Spec { depth, width }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    /// Each part's name and settings: `AttnRes (4 blocks) × mHC (n=4)`.
    fn label(&self) -> String {
        let named = |s: &dyn TopologySpec| {
            let label = s.label();
            if label.is_empty() || label == s.kind() {
                s.display()
            } else {
                format!("{} ({label})", s.display())
            }
        };
        let width = self.width.as_deref().map_or_else(|| "one stream".to_string(), named);
        format!("{} × {width}", named(self.depth.as_ref()))
    }
    fn display(&self) -> String {
        let width = self.width.as_deref().map_or_else(|| "one stream".to_string(), |w| w.display());
        format!("{} × {width}", self.depth.display())
    }
    fn granularity(&self) -> Granularity {
        self.depth.granularity()
    }
    fn streams(&self) -> usize {
        self.width.as_ref().map_or(1, |w| w.streams())
    }
    /// The parts' together (the depth rule's per stream, n times).
    fn connection_flops(&self) -> u64 {
        let width = self.width.as_ref().map_or(0, |w| w.connection_flops());
        self.depth.connection_flops() * self.streams() as u64 + width
    }
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology> {
        let depth = self.depth.build(&(vs / "depth"), compute);
        let width: Box<dyn StreamMixing> = match &self.width {
            None => Box::new(Single),
            Some(w) => w.build_width_rule(&(vs / "width"), compute).expect("a width rule builds its stream mixing"),
        };
        let view = self.width.is_some();
        Box::new(Compose { depth, width, view })
    }
}

/// The trivial width rule: one stream, read whole, its increment the unit's output.
struct Single;

impl StreamMixing for Single {
    fn streams(&self) -> usize {
        1
    }
    fn view_name(&self) -> &'static str {
        super::STREAM_MIXING_VIEWS[0]
    }
    fn mixing(
        &self,
        _k: usize,
        h: &Tensor,
        _grad: Option<&crate::native::kernels::StreamGrad>,
    ) -> (Tensor, Tensor, Tensor) {
        let opts = (h.kind(), h.device());
        (Tensor::ones([1], opts), Tensor::ones([1, 1], opts), Tensor::ones([1], opts))
    }
}

struct Compose {
    depth: Box<dyn Topology>,
    width: Box<dyn StreamMixing>,
    /// Whether the width rule has a stream-mixing view (not `single`).
    view: bool,
}

/// `res − I`: the stream mixing's change to the carried streams, `[.., n, n]`.
fn less_identity(res: &Tensor) -> Tensor {
    let n = *res.size().last().expect("res is n × n");
    res - Tensor::eye(n, (res.kind(), res.device()))
}

/// Unit k as the depth rule sees it: the width rule's step increment of the streams it is given.
struct Lifted<'a> {
    k: usize,
    width: &'a dyn StreamMixing,
    unit: &'a dyn Unit,
}

impl Unit for Lifted<'_> {
    /// `h` `[.., n, D]` → `ΔH_k(h)` `[.., n, D]`.
    fn forward(&self, h: &Tensor, norm: Norm, train: bool) -> Tensor {
        let (u, res, post) = self.width.read_and_mixing(self.k, h, None);
        let o = self.unit.forward(&u, norm, train);
        stream_write(h, &less_identity(&res), &post, &o, None)
    }
}

/// Unit k in a paired trace: it takes `[values, coefficients]` `[2, .., n, D]`, mixes both with
/// the weights the width rule computes from the values, records the mean coefficients of its
/// input (its column of C, the channels of this chunk) and of the stream mixing, and returns the
/// increment of both, its own output's coefficients being `e_k` (where this chunk holds it).
struct Paired<'a> {
    k: usize,
    width: &'a dyn StreamMixing,
    unit: &'a dyn Unit,
    /// The first coefficient channel of this chunk.
    start: usize,
    column: RefCell<Vec<f64>>,
    res: RefCell<Option<Tensor>>,
}

impl Unit for Paired<'_> {
    fn forward(&self, pair: &Tensor, norm: Norm, train: bool) -> Tensor {
        let (h, hc) = (pair.get(0), pair.get(1));
        let (pre, res, post) = self.width.mixing(self.k, &h, None);
        let (u, uc) = (stream_read(&h, &pre, None), stream_read(&hc, &pre, None));
        *self.column.borrow_mut() = common::mean_over_leading(&uc);
        let n = self.width.streams() as i64;
        *self.res.borrow_mut() = Some(res.to_kind(Kind::Double).reshape([-1, n, n]).mean_dim(0, false, Kind::Double));
        let o = self.unit.forward(&u, norm, train);
        let oc = Tensor::zeros_like(&uc);
        let d = *oc.size().last().expect("a feature axis") as usize;
        if (self.start..self.start + d).contains(&(self.k + 1)) {
            let _ = oc.narrow(-1, (self.k + 1 - self.start) as i64, 1).fill_(1.0);
        }
        let change = less_identity(&res);
        Tensor::stack(&[stream_write(&h, &change, &post, &o, None), stream_write(&hc, &change, &post, &oc, None)], 0)
    }
}

/// What a paired trace yields: C and the stream mixing per unit, `[L·n, n]`.
struct Trace {
    connectivity: Tensor,
    res: Tensor,
}

impl Compose {
    /// `x` `[.., D]` as n equal streams `[.., n, D]`.
    fn widen(&self, x: &Tensor) -> Tensor {
        let n = self.width.streams() as i64;
        x.unsqueeze(-2).repeat_interleave_self_int(n, Some(-2), None)
    }

    /// C and the stream mixing on `x0`'s batch (see the module's doc), in chunks of D coefficient
    /// channels where `L + 1 > D`.
    fn trace(&self, x0: &Tensor, units: &[&dyn Unit]) -> Trace {
        let l = units.len();
        let d = *x0.size().last().expect("a feature axis") as usize;
        let mut cols = vec![vec![0.0; l + 1]; l + 1];
        let mut res = Vec::new();
        for start in (0..=l).step_by(d) {
            let coef0 = Tensor::zeros_like(x0);
            if start == 0 {
                let _ = coef0.narrow(-1, 0, 1).fill_(1.0);
            }
            let paired: Vec<Paired> = units
                .iter()
                .enumerate()
                .map(|(k, &unit)| Paired {
                    k,
                    width: self.width.as_ref(),
                    unit,
                    start,
                    column: RefCell::new(Vec::new()),
                    res: RefCell::new(None),
                })
                .collect();
            let refs: Vec<&dyn Unit> = paired.iter().map(|p| p as &dyn Unit).collect();
            let pair = Tensor::stack(&[x0.shallow_clone(), coef0], 0);
            let y = tch::no_grad(|| common::with_paired_trace(|| self.depth.forward(&self.widen(&pair), &refs, false)));
            let readout = common::mean_over_leading(&y.get(1).mean_dim(-2, false, Kind::Double));
            let columns = paired.iter().map(|p| p.column.take()).chain(std::iter::once(readout));
            for (col, got) in cols.iter_mut().zip(columns) {
                for (c, v) in got.into_iter().enumerate().filter(|(c, _)| start + c <= l) {
                    col[start + c] = v;
                }
            }
            if start == 0 {
                res = paired.iter().filter_map(|p| p.res.take()).collect();
            }
        }
        Trace {
            connectivity: common::connectivity_from_columns(&cols),
            res: crate::host::to_cpu(&Tensor::cat(&res, 0)),
        }
    }
}

impl Topology for Compose {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        let lifted: Vec<Lifted> =
            units.iter().enumerate().map(|(k, &unit)| Lifted { k, width: self.width.as_ref(), unit }).collect();
        let refs: Vec<&dyn Unit> = lifted.iter().map(|u| u as &dyn Unit).collect();
        let y = self.depth.forward(&self.widen(x0), &refs, train);
        y.mean_dim(-2, false, y.kind())
    }

    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        self.trace(x0, units).connectivity
    }

    /// The depth rule's own view (DWA weights, ANCRe's `p`, H-ACN's `a`).
    fn parameter_view(&self) -> Option<(String, Tensor)> {
        self.depth.parameter_view()
    }

    /// The width rule's stream mixing per unit on the batch (`H_res`, `A_res`), as the width rule
    /// alone reports it; under `single`, the depth rule's view on the batch.
    fn parameter_view_on(&self, x0: &Tensor, units: &[&dyn Unit]) -> Option<(String, Tensor)> {
        if self.view {
            Some((self.width.view_name().into(), self.trace(x0, units).res))
        } else {
            self.depth.parameter_view_on(x0, units)
        }
    }

    fn regularizer(&self) -> Option<Tensor> {
        self.depth.regularizer()
    }

    fn gamma(&self) -> Option<Tensor> {
        self.depth.gamma()
    }
}
