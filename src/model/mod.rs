//! Backbones: the stem, the units of the depth stack and the readout head. A backbone knows
//! nothing of topologies; [`Model`] puts a backbone and a topology together.
//!
//! Adding a backbone: write `src/model/<name>.rs` with an `ENTRY` and add one line to [`REGISTRY`].

pub mod dit;
pub mod gpt;
pub mod layers;
pub mod llama;
pub mod lnn;
pub mod mixer;
pub mod mlp;
pub mod vit;

use crate::config::OptionError;
use crate::data::DataInfo;
use crate::topology::{BlockUnit, Granularity, StackInfo, Topology, TopologySpec, Unit};
use std::fmt::Debug;
use tch::{nn, Kind, Tensor};

/// A built backbone. Parameter names follow PyTorch `state_dict` conventions. Its three parts may
/// return `compute` (bf16) or fp32 tensors ([`layers`]' precision rule); [`Model`] casts what
/// crosses to the topology and out of the model to fp32.
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
    /// The stack's sublayers, block size and width, for the topology.
    fn stack(&self) -> StackInfo;
    /// Builds the backbone under `vs` (the VarStore root); `compute` is the matmul dtype.
    fn build(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone>;
    /// Builds the backbone with its units' ports (where [`ModelSpec::stack`] says it has them:
    /// [`StackInfo::ports`]): the same parameters as [`ModelSpec::build`] plus the key and value
    /// ports' own pre-norms, for a topology that feeds the ports ([`TopologySpec::ports`]). The
    /// default, for a backbone without ports, builds it as it is.
    fn build_with_ports(&self, vs: &nn::Path, compute: Kind) -> Box<dyn Backbone> {
        self.build(vs, compute)
    }
    /// Analytic forward FLOPs of one sample: `2·m·n·k` for every matmul of the backbone (stem,
    /// units, head), attention scores and values counted dense (`4·T²·d` per layer, the PaLM
    /// convention, also for causal attention); elementwise work and the topology's mixing are not
    /// counted. A training step costs 3× this per sample (backward = 2× forward).
    fn forward_flops(&self) -> f64;
    /// `(channels, num_classes, learn_sigma)` of a diffusion backbone, whose task is DDPM training
    /// (the `diffusion` module) whatever the dataset's; `None` (the default) for the others.
    fn diffusion(&self) -> Option<(usize, usize, bool)> {
        None
    }
}

/// Parses and validates a section's options (everything but `kind`).
pub type ParseFn = fn(&serde_yaml::Mapping, &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError>;

pub struct ModelEntry {
    pub name: &'static str,
    pub about: &'static str,
    /// Parses and validates `model.*` options for a dataset.
    pub parse: ParseFn,
    /// Every `model.*` option with its default ([`crate::config::option_defaults`]): `plexus list`
    /// prints them and tests/it/docs.rs holds docs/configs-and-runs.md's backbone table to them.
    pub options: fn() -> serde_yaml::Mapping,
    /// The `model:` and `data:` sections of a tiny config (seconds to train on a CPU): the
    /// self-test (`plexus doctor --selftest`) and the tests that run every topology on every
    /// backbone use it.
    pub tiny: &'static str,
}

/// Every backbone plexus knows, by `model.kind`.
pub const REGISTRY: &[ModelEntry] =
    &[lnn::ENTRY, mlp::ENTRY, mixer::ENTRY, vit::ENTRY, gpt::ENTRY, llama::ENTRY, dit::ENTRY];

/// Parses and validates the `model` section's options for backbone `kind` against the data it
/// will train on; an unknown kind is an error that lists the registered ones.
pub fn parse(kind: &str, options: &serde_yaml::Mapping, data: &DataInfo) -> Result<Box<dyn ModelSpec>, OptionError> {
    match REGISTRY.iter().find(|e| e.name == kind) {
        Some(e) => (e.parse)(options, data),
        None => Err(OptionError::new(
            "kind",
            kind,
            format!("one of {}", REGISTRY.iter().map(|e| format!("`{}`", e.name)).collect::<Vec<_>>().join(", ")),
        )),
    }
}

/// A backbone wired by a topology, with all parameters in one VarStore.
pub struct Model {
    pub vs: nn::VarStore,
    pub backbone: Box<dyn Backbone>,
    pub topology: Box<dyn Topology>,
    /// Whether the topology wires sublayers or whole blocks of `block_size` sublayers.
    pub granularity: Granularity,
    pub block_size: usize,
}

impl Model {
    /// Builds both parts on `device`; the caller seeds torch beforehand for reproducible init.
    pub fn new(model: &dyn ModelSpec, topology: &dyn TopologySpec, device: tch::Device, compute: Kind) -> Self {
        let vs = nn::VarStore::new(device);
        let backbone = if topology.ports() {
            model.build_with_ports(&vs.root(), compute)
        } else {
            model.build(&vs.root(), compute)
        };
        let built = topology.build(&(vs.root() / "topology"), compute);
        Self {
            vs,
            backbone,
            topology: built,
            granularity: topology.granularity(),
            block_size: model.stack().block_size,
        }
    }

    /// Calls `f` with the units at the topology's granularity (blocks are assembled here, so
    /// backbones only ever expose sublayers). Each sublayer's output is cast to fp32: under
    /// `precision: bf16` a branch ends in a bf16 `Linear`, and the stream it is added to stays fp32
    /// (`Unit::forward_compute` hands it over uncast, for a single add that promotes it itself).
    pub fn with_units<R>(&self, f: impl FnOnce(&[&dyn Unit]) -> R) -> R {
        let fp32: Vec<Fp32Output> = self.backbone.units().into_iter().map(Fp32Output).collect();
        let subs: Vec<&dyn Unit> = fp32.iter().map(|u| u as &dyn Unit).collect();
        match self.granularity {
            Granularity::Sublayer => f(&subs),
            Granularity::Block => {
                let blocks: Vec<BlockUnit> =
                    subs.chunks(self.block_size).map(|c| BlockUnit { sublayers: c.to_vec() }).collect();
                let refs: Vec<&dyn Unit> = blocks.iter().map(|b| b as &dyn Unit).collect();
                f(&refs)
            }
        }
    }

    /// The stem: model input → `x0` `[.., D]` fp32, what the topology starts from.
    pub fn embed(&self, input: &Tensor, train: bool) -> Tensor {
        self.backbone.embed(input, train).to_kind(Kind::Float)
    }

    /// The readout (final norm and head): `y` `[.., D]` → the model output, fp32 (logits are
    /// computed in `compute`, as autocast's, and the loss reads them in fp32).
    pub fn readout(&self, y: &Tensor, train: bool) -> Tensor {
        self.backbone.readout(y, train).to_kind(Kind::Float)
    }

    /// Full forward pass: input → output, fp32.
    pub fn forward(&self, input: &Tensor, train: bool) -> Tensor {
        self.forward_compute(input, train).to_kind(Kind::Float)
    }

    /// Full forward pass with the output in the compute dtype (the head's own; fp32 under
    /// `precision: fp32`): for a loss that reads it in fp32 itself, as the training step's
    /// language-model loss does ([`crate::data::Task::loss`]), where an fp32 copy of `[B, T, vocab]`
    /// logits would be the largest tensor of the step.
    pub fn forward_compute(&self, input: &Tensor, train: bool) -> Tensor {
        let x0 = self.embed(input, train);
        let y = self.with_units(|units| {
            let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::TOPOLOGY);
            self.topology.forward(&x0, units, train)
        });
        self.backbone.readout(&y, train)
    }

    /// Forward pass through the first `keep` units only (an early exit after unit `keep`): the
    /// readout reads what the topology would hand the readout of a `keep`-unit stack — the stream
    /// for residual, the running sum for ACN/H-ACN, the mean of the streams for HC/mHC — through
    /// the same final norm and head (H-ACN §3.1). `keep = 0` reads the embedding alone.
    pub fn forward_exit(&self, input: &Tensor, keep: usize) -> Tensor {
        let x0 = self.embed(input, false);
        let y = self.with_units(|units| self.topology.forward(&x0, &units[..keep.min(units.len())], false));
        self.readout(&y, false)
    }

    /// The first non-finite activation of a forward pass (training mode) on `input`, named for
    /// the divergence message: the embedding, a unit's output (1-based index), the readout
    /// input or the model output. Reads once per activation: for diagnosis only.
    pub fn first_non_finite_activation(&self, input: &Tensor) -> Option<String> {
        use std::cell::Cell;
        struct Checked<'a> {
            unit: &'a dyn Unit,
            index: usize,
            first: &'a Cell<Option<usize>>,
        }
        impl Unit for Checked<'_> {
            fn forward(&self, x: &Tensor, norm: crate::topology::Norm, train: bool) -> Tensor {
                let h = self.unit.forward(x, norm, train);
                if self.first.get().is_none() && !crate::host::all_finite(&h) {
                    self.first.set(Some(self.index));
                }
                h
            }
        }
        tch::no_grad(|| {
            let x0 = self.embed(input, true);
            if !crate::host::all_finite(&x0) {
                return Some("the embedding (stem output)".to_string());
            }
            let first = Cell::new(None);
            let y = self.with_units(|units| {
                let checked: Vec<Checked> =
                    units.iter().enumerate().map(|(i, &unit)| Checked { unit, index: i + 1, first: &first }).collect();
                let refs: Vec<&dyn Unit> = checked.iter().map(|c| c as &dyn Unit).collect();
                self.topology.forward(&x0, &refs, true)
            });
            if let Some(k) = first.get() {
                return Some(format!("the output of unit {k} of {}", self.depth()));
            }
            if !crate::host::all_finite(&y) {
                return Some("the readout input (the topology's mixing)".to_string());
            }
            (!crate::host::all_finite(&self.readout(&y, true))).then(|| "the model output".to_string())
        })
    }

    /// Features for Fréchet distances (`plexus fd`): the readout representation `y` (what the
    /// topology hands the readout), mean-pooled over every dimension between the batch and the
    /// feature dimension: `[B, ..., D]` → `[B, D]` fp32. Evaluation mode.
    pub fn features(&self, input: &Tensor) -> Tensor {
        let x0 = self.embed(input, false);
        let y = self.with_units(|units| self.topology.forward(&x0, units, false));
        let (b, d) = (y.size()[0], *y.size().last().expect("a feature dimension"));
        y.reshape([b, -1, d]).mean_dim(1, false, Kind::Float)
    }

    /// Number of units at the topology's granularity.
    pub fn depth(&self) -> usize {
        self.with_units(|u| u.len())
    }

    /// Effective connectivity C on this input batch (see [`Topology::connectivity`]).
    pub fn connectivity(&self, input: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let x0 = self.embed(input, false);
            self.with_units(|units| self.topology.connectivity(&x0, units))
        })
    }

    /// The topology's parameter view on this input batch (see [`Topology::parameter_view_on`]).
    pub fn parameter_view(&self, input: &Tensor) -> Option<(String, Tensor)> {
        tch::no_grad(|| {
            let x0 = self.embed(input, false);
            self.with_units(|units| self.topology.parameter_view_on(&x0, units))
        })
    }

    /// The trainable parameters by name.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Number of scalar parameters (trainable or not).
    pub fn num_params(&self) -> i64 {
        self.vs.variables().values().map(|t| t.numel() as i64).sum()
    }
}

/// A backbone unit whose branch output is cast to fp32 (a no-op when it already is).
struct Fp32Output<'a>(&'a dyn Unit);

impl Unit for Fp32Output<'_> {
    fn forward(&self, x: &Tensor, norm: crate::topology::Norm, train: bool) -> Tensor {
        self.forward_compute(x, norm, train).to_kind(Kind::Float)
    }
    fn forward_compute(&self, x: &Tensor, norm: crate::topology::Norm, train: bool) -> Tensor {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::UNIT);
        self.0.forward(x, norm, train)
    }
    fn forward_ports(&self, ports: &crate::topology::Ports, train: bool) -> Option<Tensor> {
        let _scope = crate::native::kineto::scope(crate::native::kineto::scopes::UNIT);
        self.0.forward_ports(ports, train).map(|h| h.to_kind(Kind::Float))
    }
}

/// `(channels, side)` of square image data `[C, S, S]`, or an error on `kind` that names the shape
/// the dataset gives (for the image backbones).
pub(crate) fn square_images(kind: &'static str, data: &DataInfo) -> Result<(usize, usize), OptionError> {
    match data.input_shape.as_slice() {
        [c, h, w] if h == w => Ok((*c, *h)),
        other => Err(OptionError::new(
            "kind",
            kind,
            format!("image data of shape [C, S, S]; this dataset gives samples of shape {other:?}"),
        )),
    }
}

/// The sizes of a patch transformer with a 2-D sin-cos position table (ViT, DiT), checked against
/// square image data: `(channels, image side, depth, mlp_hidden)`, with `depth` required and
/// `mlp_hidden` defaulting to `4·width`; the width a multiple of 4 (the table's four quarters) and
/// of `heads`.
pub(crate) fn patch_transformer_sizes(
    kind: &'static str,
    data: &DataInfo,
    depth: Option<usize>,
    (width, heads, patch): (usize, usize, usize),
    mlp_hidden: Option<usize>,
) -> Result<(usize, usize, usize, usize), OptionError> {
    let depth = crate::config::required(depth, "depth")?;
    let (c, s) = square_images(kind, data)?;
    let mlp_hidden = mlp_hidden.unwrap_or(4 * width);
    check_sizes(&[("width", width), ("depth", depth), ("heads", heads), ("mlp_hidden", mlp_hidden)], patch, s)?;
    if !width.is_multiple_of(4) || width < 8 {
        return Err(OptionError::new("width", width, "a multiple of 4, at least 8 (the 2-D sin-cos embedding)"));
    }
    if !width.is_multiple_of(heads) {
        return Err(OptionError::new("heads", heads, format!("a divisor of width = {width}")));
    }
    Ok((c, s, depth, mlp_hidden))
}

/// Checks that every `(key, value)` is a size in 1..=65536 and that `patch` divides the image side.
pub(crate) fn check_sizes(sizes: &[(&str, usize)], patch: usize, side: usize) -> Result<(), OptionError> {
    for &(key, v) in sizes {
        if v == 0 || v > 1 << 16 {
            return Err(OptionError::new(key, v, "an integer in 1..=65536"));
        }
    }
    if patch == 0 || !side.is_multiple_of(patch) {
        return Err(OptionError::new("patch", patch, format!("a divisor of the image size {side}")));
    }
    Ok(())
}
