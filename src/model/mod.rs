//! Backbones: the stem, the units of the depth stack and the readout head. A backbone knows
//! nothing of topologies; [`Model`] puts a backbone and a topology together.
//!
//! Adding a backbone: write `src/model/<name>.rs` with an `ENTRY` and add one line to [`REGISTRY`].

pub mod lnn;

use crate::config::OptionError;
use crate::data::DataInfo;
use crate::topology::{StackInfo, Topology, TopologySpec, Unit};
use std::fmt::Debug;
use tch::{nn, Kind, Tensor};

/// A built backbone. Parameter names follow PyTorch `state_dict` conventions.
pub trait Backbone {
    /// Stem: model input → `x0`, the embedding the depth stack starts from.
    fn embed(&self, input: &Tensor, train: bool) -> Tensor;
    /// The `L` units of the depth stack, in order.
    fn units(&self) -> Vec<&dyn Unit>;
    /// Readout head (final norm + head): readout representation `y` → model output.
    fn readout(&self, y: &Tensor, train: bool) -> Tensor;
}

/// A validated backbone configuration.
pub trait ModelSpec: Debug {
    fn kind(&self) -> &'static str;
    /// Depth and width of the stack, for the topology.
    fn stack(&self) -> StackInfo;
    /// Builds the backbone under `vs` (the VarStore root); `compute` is the matmul dtype.
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone>;
}

/// Parses and validates a section's options (everything but `kind`).
pub type ParseFn = fn(&serde_yaml::Mapping, &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError>;

pub struct ModelEntry {
    pub name: &'static str,
    pub about: &'static str,
    /// Parses and validates `model.*` options for a dataset.
    pub parse: ParseFn,
}

/// Every backbone plexus knows, by `model.kind`.
pub const REGISTRY: &[ModelEntry] = &[lnn::ENTRY];

pub fn parse(
    kind: &str,
    options: &serde_yaml::Mapping,
    data: &DataInfo,
) -> Result<Box<dyn ModelSpec>, OptionError> {
    match REGISTRY.iter().find(|e| e.name == kind) {
        Some(e) => (e.parse)(options, data),
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

/// A backbone wired by a topology, with all parameters in one VarStore.
pub struct Model {
    pub vs: nn::VarStore,
    pub backbone: Box<dyn Backbone>,
    pub topology: Box<dyn Topology>,
}

impl Model {
    /// Builds both parts on `device`; the caller seeds torch beforehand for reproducible init.
    pub fn new(
        model: &dyn ModelSpec,
        topology: &dyn TopologySpec,
        device: tch::Device,
        compute: Kind,
    ) -> Self {
        let vs = nn::VarStore::new(device);
        let backbone = model.build(&vs.root(), compute);
        let topology = topology.build(&(vs.root() / "topology"));
        Self {
            vs,
            backbone,
            topology,
        }
    }

    /// Full forward pass: input → output.
    pub fn forward(&self, input: &Tensor, train: bool) -> Tensor {
        let x0 = self.backbone.embed(input, train);
        let y = self.topology.forward(&x0, &self.backbone.units(), train);
        self.backbone.readout(&y, train)
    }

    /// Effective connectivity C on this input batch (see [`Topology::connectivity`]).
    pub fn connectivity(&self, input: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let x0 = self.backbone.embed(input, false);
            self.topology.connectivity(&x0, &self.backbone.units())
        })
    }

    /// Number of scalar parameters (trainable or not).
    pub fn num_params(&self) -> i64 {
        self.vs.variables().values().map(|t| t.numel() as i64).sum()
    }
}
