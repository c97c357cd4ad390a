//! Residual topologies: what each unit of the depth stack reads, and what the readout reads.
//!
//! A model is `stem → depth stack of L units → readout head` (see model/mod.rs). The topology
//! drives the loop over depth: the backbone hands it the embedding `x0` and its units, and the
//! topology calls the units in order, keeping whatever state it needs between them (one stream, a
//! running sum, a history of streams, n parallel streams, …). Topologies know nothing of attention,
//! patches or tokens.
//!
//! Notation (docs/topologies.md): `h_0 = x0`, `h_k = f_k(input_k)`, nodes `0 = embedding`, `1..=L = units`,
//! `L+1 = readout`, and the direct layer connectivity matrix `C` with
//! `input_k = Σ_{i<k} C[i][k] · h_i`. The exact contract of every topology is in `docs/topologies.md`.
//!
//! Adding a topology: write `src/topology/<name>.rs` with an `ENTRY` and add one line to
//! [`REGISTRY`]. Every registry-driven test picks it up.

pub mod common;

pub mod acn;
pub mod ancre;
pub mod attnres;
pub mod compose;
pub mod denseformer;
pub mod densenet;
pub mod graph;
pub mod hacn;
pub mod hyper;
pub mod laurel;
pub mod layercomb;
pub mod mhc;
pub mod mudd;
pub mod plain;
pub mod residual;
pub mod rezero;
pub mod shortcuts;

use crate::config::OptionError;
use serde::Deserialize;
use std::fmt::Debug;
use tch::{nn, Kind, Tensor};

/// Name of the parameter view of topologies with trainable residual weights `a` (H-ACN): one row
/// `[1, L]`. Analysis reads it for Δ_t and seed correlations, plots for Γ and Δ_t.
pub const RESIDUAL_WEIGHTS: &str = "a";

/// Name of the parameter view of ANCRe's shortcut coefficients `p`: `[A+1, A+1]`, `p[i][j]` the
/// weight of state i in state j. Plots draw `log(p_ij / max_i p_ij)` from it.
pub const SHORTCUT_WEIGHTS: &str = "p";

/// Names of the width rules' stream-mixing views, `[L·n, n]` (row `k·n + s`, column t: the weight
/// of stream s in the new stream t after unit k, averaged over batch and tokens): mHC's `H_res`
/// and HC's `A_res`. Plots draw them per unit beside C (a composed run's two axes).
pub const STREAM_MIXING_VIEWS: [&str; 2] = ["H_res", "A_res"];

/// How a topology asks a unit to treat its pre-norm.
#[derive(Clone, Copy)]
pub enum Norm<'a> {
    /// The unit's own pre-norm, unchanged.
    Default,
    /// The pre-norm output multiplied by a 0-dim tensor (H-ACN Depth-adaptive LayerNorm).
    Scaled(&'a Tensor),
    /// No pre-norm at all (ReZero).
    Off,
}

/// A unit of the depth stack: a branch (with its own pre-norm, if any) mapping `[.., D] → [.., D]`.
pub trait Unit {
    /// `x`: the unit's input `[.., D]`. Returns the branch output `h` (not `x + h`), `[.., D]`.
    fn forward(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor;

    /// The same branch output `h` in the dtype its branch computes in (bf16 under `precision:
    /// bf16`, as the branch's last `Linear` returns it; fp32 otherwise), for a topology that uses
    /// `h` exactly once, in an op that also reads an fp32 tensor of `h`'s shape (`h + x`,
    /// `h.addcmul(x, a)`, `x.addcmul(h, a)`): type promotion makes that op fp32, and it equals
    /// casting `h` to fp32 first bit for bit, forward and backward (the op's gradient for `h` is
    /// rounded to bf16 once, as the cast's backward rounds it). On CUDA the op reads the bf16 `h`
    /// directly: no cast kernel, and no fp32 copy of `h` written and read back per unit (autocast's
    /// residual add does the same). Not for an `h` used twice: its two gradients would be summed in
    /// bf16. Units that only have an fp32 output need not override it.
    fn forward_compute(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor {
        self.forward(x, norm, train)
    }

    /// The unit fed through its named ports (a topology that routes a different mix to each,
    /// `mudd`), each through the port's own pre-norm: an attention sublayer computes q, k and v
    /// from the query, key and value ports and returns its branch output `[.., D]` (it does not
    /// read the residual port); a block runs from the residual port, its first sublayer reading
    /// the ports, and returns its delta over `ports.residual` (as [`BlockUnit`] does over its
    /// input). None: the unit has no ports (the backbone's [`StackInfo::ports`] is false, or this
    /// sublayer is not an attention).
    fn forward_ports(&self, ports: &Ports, train: bool) -> Option<Tensor> {
        let _ = (ports, train);
        None
    }
}

/// The inputs of a unit's ports, each `[.., D]` fp32 (docs/topologies.md, "`mudd`").
pub struct Ports<'a> {
    pub query: &'a Tensor,
    pub key: &'a Tensor,
    pub value: &'a Tensor,
    /// The input the unit's output is added to.
    pub residual: &'a Tensor,
}

/// Whether a topology wires the backbone's sublayers (attention / MLP, token / channel mixing)
/// or whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Sublayer,
    Block,
}

/// What a topology needs to know about the backbone's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackInfo {
    /// Number of sublayer units.
    pub sublayers: usize,
    /// Sublayers per block (2 for Transformer/Mixer layers, 1 when a block is one unit).
    pub block_size: usize,
    /// Feature width `D` of the stream.
    pub width: usize,
    /// Whether units have a pre-norm (Depth-adaptive LN and ReZero's `norm: off` need one).
    pub pre_norm: bool,
    /// Whether the blocks have query, key, value and residual ports ([`Unit::forward_ports`]):
    /// an attention sublayer first, whose q, k and v projections may read separate inputs, each
    /// through its own pre-norm (the backbone builds them: `ModelSpec::build_with_ports`).
    pub ports: bool,
}

impl StackInfo {
    /// Number of units `L` at a granularity.
    pub fn depth(&self, g: Granularity) -> usize {
        match g {
            Granularity::Sublayer => self.sublayers,
            Granularity::Block => self.sublayers / self.block_size,
        }
    }
}

/// A block of consecutive sublayers acting as one unit: it returns the *delta* of running its
/// sublayers with their usual residuals, so that a residual topology on blocks equals a residual
/// topology on sublayers.
pub struct BlockUnit<'a> {
    pub sublayers: Vec<&'a dyn Unit>,
}

impl Unit for BlockUnit<'_> {
    fn forward(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor {
        let mut z = x.shallow_clone();
        for g in &self.sublayers {
            z = &z + g.forward_compute(&z, norm, train);
        }
        z - x
    }

    fn forward_ports(&self, ports: &Ports, train: bool) -> Option<Tensor> {
        let (first, rest) = self.sublayers.split_first()?;
        let mut z = ports.residual + first.forward_ports(ports, train)?;
        for g in rest {
            z = &z + g.forward_compute(&z, Norm::Default, train);
        }
        Some(z - ports.residual)
    }
}

/// A built topology, owning its parameters (registered under `topology.` in the VarStore).
pub trait Topology {
    /// Runs the stack. `x0`: embedding `[.., D]`; `units.len() == L` at the topology's granularity.
    /// Returns the readout representation `y`, same shape as `x0`.
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor;

    /// Effective direct layer connectivity `C`, `[(L+2), (L+2)]` f64 on the CPU, strictly upper
    /// triangular. Computed on `x0`'s device (the parameters' device) and copied to the CPU at the
    /// end; it runs only on connectivity-logging steps, so it may read values. The default traces
    /// the topology with probe units (exact for every topology that mixes streams with scalar
    /// weights); input-dependent ones override it and average over `x0`'s batch and tokens.
    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor {
        common::probe_connectivity(|x, u| self.forward(x, u, false), units.len(), x0.device())
    }

    /// The topology's own parameter view (ANCRe's `p`, DWA weights, …) as `(name, matrix)`.
    fn parameter_view(&self) -> Option<(String, Tensor)> {
        None
    }

    /// The parameter view on an input batch: input-dependent topologies (mHC's mean `H_res`,
    /// AttnRes's mean attention) override this; others return [`Topology::parameter_view`].
    fn parameter_view_on(&self, x0: &Tensor, units: &[&dyn Unit]) -> Option<(String, Tensor)> {
        let _ = (x0, units);
        self.parameter_view()
    }

    /// A term added to the training loss (ANCRe's Tsallis regulariser), if any.
    fn regularizer(&self) -> Option<Tensor> {
        None
    }

    /// Total connectivity strength `Γ = ‖a‖₂/√L` where the topology has residual weights `a`, as
    /// a 0-dim f64 tensor (on the parameters' device, or the CPU for a constant): the trainer
    /// reads it together with the loss, in the one read of a logging step.
    fn gamma(&self) -> Option<Tensor> {
        None
    }
}

/// A validated topology configuration that can be built on a VarStore path.
pub trait TopologySpec: Debug {
    /// Registry name (`topology.kind`).
    fn kind(&self) -> &'static str;
    /// Short description of the settings for tables and legends, e.g. `0:2` or `τ=0.1`.
    fn label(&self) -> String;
    /// Which units the topology wires.
    fn granularity(&self) -> Granularity;
    /// Number of parallel residual streams the topology carries (n for Hyper-Connections and
    /// mHC, 1 otherwise): the benchmark's memory-traffic bound of the stream update uses it.
    fn streams(&self) -> usize {
        1
    }
    /// Floating-point operations per token of one unit's connection beyond residual's add, forward
    /// and backward: the matrix arithmetic (mixing weights, stream read and write) that no
    /// implementation can skip, for the benchmark's arithmetic lower bound of the overhead. 0 for
    /// topologies whose connection is a few operations per element (the traffic bound covers them).
    fn connection_flops(&self) -> u64 {
        0
    }
    /// The entries `(i, j)` of C (i < j) that this wiring never carries — node j does not read
    /// node i — so that figures draw them as absent, not as a learned 0. None for topologies whose
    /// every later node may read every earlier one.
    fn absent_edges(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }
    /// The topology's name in figures and tables: the registry's display name (`H-ACN`); a
    /// composition names its parts (`AttnRes × mHC`).
    fn display(&self) -> String {
        display_name(self.kind())
    }
    /// The per-unit stream mixing of a width rule (`hyper`, `mhc`), for `compose`: built as
    /// [`TopologySpec::build`] builds the topology, under the same parameter names. None for a
    /// topology that is not a width rule.
    fn build_width_rule(&self, vs: &nn::Path, compute: Kind) -> Option<Box<dyn common::StreamMixing>> {
        let _ = (vs, compute);
        None
    }
    /// Whether the topology feeds units through their ports ([`Unit::forward_ports`]): the
    /// backbone is then built with the ports' own pre-norms.
    fn ports(&self) -> bool {
        false
    }
    /// Builds the topology; `vs` is the `topology` sub-path, so parameters are named
    /// `topology.<name>` like PyTorch `state_dict` keys. `compute` is the dtype the topology's own
    /// matmuls (projections, low-rank maps, dynamic mixing weights) run in, like every `Linear` of
    /// the backbone; its stream arithmetic stays fp32.
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Topology>;
}

/// Parses and validates `topology.*` options (everything but `kind`) for a stack.
pub type ParseFn = fn(&serde_yaml::Mapping, StackInfo) -> Result<Box<dyn TopologySpec>, OptionError>;

/// One registry line.
pub struct TopologyEntry {
    pub name: &'static str,
    /// The name as the papers print it (`hacn` → `H-ACN`), for legends and tables.
    pub display: &'static str,
    pub about: &'static str,
    pub parse: ParseFn,
    /// The topology's colour in every figure (RGB), so that it reads the same across papers'
    /// figures; runs of one topology with different settings get lighter shades of it.
    pub color: (u8, u8, u8),
}

/// The registry line of `kind`, if there is one.
pub fn entry(kind: &str) -> Option<&'static TopologyEntry> {
    REGISTRY.iter().find(|e| e.name == kind)
}

/// A topology's name as the papers print it (`hacn` → `H-ACN`), for legends and tables; the
/// registry holds it, so a new topology brings its own. Any other name is shown as it is.
pub fn display_name(kind: &str) -> String {
    entry(kind).map_or(kind, |e| e.display).to_string()
}

/// Every topology plexus knows, by `topology.kind`.
pub const REGISTRY: &[TopologyEntry] = &[
    plain::ENTRY,
    residual::ENTRY,
    shortcuts::ENTRY,
    acn::ENTRY,
    hacn::ENTRY,
    ancre::ENTRY,
    denseformer::ENTRY,
    layercomb::ENTRY,
    densenet::ENTRY,
    hyper::ENTRY,
    mhc::ENTRY,
    attnres::ENTRY,
    laurel::ENTRY,
    rezero::ENTRY,
    graph::ENTRY,
    compose::ENTRY,
    mudd::ENTRY,
];

/// Looks up `kind` and parses its options. The error lists the known kinds.
pub fn parse(
    kind: &str,
    options: &serde_yaml::Mapping,
    stack: StackInfo,
) -> Result<Box<dyn TopologySpec>, OptionError> {
    match REGISTRY.iter().find(|e| e.name == kind) {
        Some(e) => (e.parse)(options, stack),
        None => Err(OptionError::new(
            "kind",
            kind,
            format!("one of {}", REGISTRY.iter().map(|e| format!("`{}`", e.name)).collect::<Vec<_>>().join(", ")),
        )),
    }
}
