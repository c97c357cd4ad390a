//! Residual topologies: what each unit of the depth stack reads, and what the readout reads.
//!
//! A model is `stem → depth stack of L units → readout head` (see `crate::model`). The topology
//! drives the loop over depth: the backbone hands it the embedding `x0` and its units, and the
//! topology calls the units in order, keeping whatever state it needs between them (one stream, a
//! history of streams, …). Topologies know nothing of attention, patches or tokens.
//!
//! Notation (REFERENCE.md): `h_0 = x0`, `h_k = f_k(input_k)`, nodes `0 = embedding`, `1..=L = units`,
//! `L+1 = readout`, and the direct layer connectivity matrix `C` with
//! `input_k = Σ_{i<k} C[i][k] · h_i`.
//!
//! Adding a topology: write `src/topology/<name>.rs` with an `ENTRY` and add one line to
//! [`REGISTRY`]. Every registry-driven test picks it up.

pub mod common;

pub mod ancre;
pub mod plain;
pub mod residual;
pub mod shortcuts;

use crate::config::OptionError;
use std::fmt::Debug;
use tch::{nn, Tensor};

/// A unit of the depth stack: a branch (with its own pre-norm, if any) mapping `[.., D] → [.., D]`.
pub trait Unit {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor;
}

/// What a topology needs to know about the stack it wires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackInfo {
    /// Number of units `L`.
    pub depth: usize,
    /// Feature width `D` of the stream.
    pub width: usize,
}

/// A built topology, owning its parameters (registered under `topology.` in the VarStore).
pub trait Topology {
    /// Runs the stack. `x0`: embedding `[.., D]`; `units.len() == L`. Returns the readout
    /// representation `y`, same shape as `x0`.
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor;

    /// Effective direct layer connectivity `C`, `[(L+2), (L+2)]` f64 on the CPU, strictly upper
    /// triangular. Static topologies ignore `x0` and `units`; input-dependent ones average over
    /// `x0`'s batch.
    fn connectivity(&self, x0: &Tensor, units: &[&dyn Unit]) -> Tensor;

    /// The topology's own parameter view (ANCRe's `p`, …) as `(name, matrix)`, if it has one.
    fn parameter_view(&self) -> Option<(String, Tensor)> {
        None
    }
}

/// A validated topology configuration that can be built on a VarStore path.
pub trait TopologySpec: Debug {
    /// Registry name (`topology.kind`).
    fn kind(&self) -> &'static str;
    /// Short description of the settings for tables and legends, e.g. `0:2` or `τ=0.1`.
    fn label(&self) -> String;
    /// Builds the topology; `vs` is the `topology` sub-path, so parameters are named
    /// `topology.<name>` like PyTorch `state_dict` keys.
    fn build(&self, vs: &nn::Path) -> Box<dyn Topology>;
}

/// Parses and validates a section's options (everything but `kind`).
pub type ParseFn =
    fn(&serde_yaml::Mapping, StackInfo) -> Result<Box<dyn TopologySpec>, OptionError>;

/// One registry line.
pub struct TopologyEntry {
    pub name: &'static str,
    pub about: &'static str,
    /// Parses and validates `topology.*` options (everything but `kind`) for a stack.
    pub parse: ParseFn,
}

/// Every topology plexus knows, by `topology.kind`.
pub const REGISTRY: &[TopologyEntry] = &[
    plain::ENTRY,
    residual::ENTRY,
    shortcuts::ENTRY,
    ancre::ENTRY,
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
            format!(
                "one of {}",
                REGISTRY
                    .iter()
                    .map(|e| format!("`{}`", e.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}
