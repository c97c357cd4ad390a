//! Deep residual MLP encoders for contrastive RL (Wang et al. 2025), wired by any registered
//! topology.
//!
//! An encoder maps `[B, in]` → `[B, out]`:
//! `stem` (Linear → LayerNorm → Swish) → a stack of `depth` layers, each `Swish(LayerNorm(Linear(x)))`
//! (`D → D`) → final `norm` (LayerNorm) → `head` (Linear `D → out`).
//!
//! The topology wires the stack. With `granularity: sublayer` every layer is a unit; with
//! `granularity: block` a unit is a chain of `block_size` consecutive layers run one after the
//! other **without** inner shortcuts, so `residual` at block granularity with `block_size: 4` is
//! Wang et al.'s residual block (`x + f₄∘f₃∘f₂∘f₁(x)`) and ANCRe §5.3's 4-layer blocks. (The
//! Transformer backbones' [`crate::topology::BlockUnit`] keeps the sublayer residuals inside a
//! block instead: there a block is a Transformer layer.) The final LayerNorm is plexus's readout
//! convention (every backbone has one); it keeps topologies that sum unit outputs (ACN) at scale.
//!
//! Parameter names (PyTorch `state_dict` style, under the encoder's path): `stem.linear.weight`,
//! `stem.norm.weight`, `layers.{k}.linear.weight`, `layers.{k}.norm.bias`, `norm.weight`,
//! `head.weight`, and the topology's own `topology.*`.

use crate::model::layers::{layer_norm, LayerNorm, Linear};
use crate::topology::{Granularity, Norm, StackInfo, Topology, TopologySpec, Unit};
use tch::{nn, nn::Module, Kind, Tensor};

/// The shape of an encoder's stack, for [`crate::topology::parse`].
pub fn stack_info(width: usize, depth: usize, block_size: usize) -> StackInfo {
    StackInfo { sublayers: depth, block_size, width, pre_norm: false, ports: false }
}

/// One layer `Swish(LayerNorm(Linear(x)))`, `[.., D]` → `[.., D]`: a unit of the stack.
pub struct DenseLayer {
    pub linear: Linear,
    pub norm: LayerNorm,
}

impl DenseLayer {
    /// A layer from `d_in` to `d_out` features, its linear map in the `compute` dtype, under `vs`.
    pub fn new(vs: &nn::Path, d_in: i64, d_out: i64, compute: Kind) -> Self {
        Self {
            linear: Linear::new(&(vs / "linear"), d_in, d_out, true, compute),
            norm: layer_norm(&(vs / "norm"), d_out),
        }
    }

    /// `x` `[.., d_in]` → `[.., d_out]`.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        self.norm.forward(&self.linear.forward(x)).silu()
    }
}

impl Unit for DenseLayer {
    /// The layer has no pre-norm (its LayerNorm follows the Linear), so `Norm::Off` changes
    /// nothing; `Norm::Scaled(s)` (never asked of a stack without pre-norm) scales the LayerNorm.
    fn forward(&self, x: &Tensor, norm: Norm, _train: bool) -> Tensor {
        match norm {
            Norm::Scaled(s) => (self.norm.forward(&self.linear.forward(x)) * s).silu(),
            Norm::Default | Norm::Off => self.apply(x),
        }
    }
}

/// `block_size` layers chained without shortcuts: one unit at `granularity: block`.
struct Chain<'a> {
    layers: &'a [DenseLayer],
}

impl Unit for Chain<'_> {
    fn forward(&self, x: &Tensor, norm: Norm, train: bool) -> Tensor {
        self.layers.iter().fold(x.shallow_clone(), |z, l| l.forward(&z, norm, train))
    }
}

/// A deep MLP encoder wired by a topology.
pub struct Encoder {
    pub stem: DenseLayer,
    pub layers: Vec<DenseLayer>,
    pub norm: LayerNorm,
    pub head: Linear,
    pub topology: Box<dyn Topology>,
    granularity: Granularity,
    block_size: usize,
}

impl Encoder {
    /// Builds the encoder under `vs` (its root, e.g. `sa_encoder`): `in_dim → width`, `depth`
    /// layers, `width → out_dim`. `depth` is a multiple of `block_size` at block granularity
    /// (checked by the config).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        vs: &nn::Path,
        in_dim: i64,
        width: i64,
        depth: usize,
        block_size: usize,
        out_dim: i64,
        topology: &dyn TopologySpec,
        compute: Kind,
    ) -> Self {
        Self {
            stem: DenseLayer::new(&(vs / "stem"), in_dim, width, compute),
            layers: (0..depth).map(|k| DenseLayer::new(&(vs / "layers" / k), width, width, compute)).collect(),
            norm: layer_norm(&(vs / "norm"), width),
            head: Linear::new(&(vs / "head"), width, out_dim, true, compute),
            topology: topology.build(&(vs / "topology"), compute),
            granularity: topology.granularity(),
            block_size,
        }
    }

    /// Calls `f` with the units at the topology's granularity.
    fn with_units<R>(&self, f: impl FnOnce(&[&dyn Unit]) -> R) -> R {
        match self.granularity {
            Granularity::Sublayer => f(&self.layers.iter().map(|l| l as &dyn Unit).collect::<Vec<_>>()),
            Granularity::Block => {
                let chains: Vec<Chain> = self.layers.chunks(self.block_size).map(|c| Chain { layers: c }).collect();
                f(&chains.iter().map(|c| c as &dyn Unit).collect::<Vec<_>>())
            }
        }
    }

    /// Number of units the topology wires.
    pub fn units(&self) -> usize {
        self.with_units(|u| u.len())
    }

    /// `x` `[B, in_dim]` → `[B, out_dim]` fp32.
    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let x0 = self.stem.apply(x);
        let y = self.with_units(|units| self.topology.forward(&x0, units, train));
        // The head computes in `compute` (bf16 under `precision: bf16`); callers get fp32.
        self.head.forward(&self.norm.forward(&y)).to_kind(Kind::Float)
    }

    /// The topology's regulariser (ANCRe's Tsallis term), if any.
    pub fn regularizer(&self) -> Option<Tensor> {
        self.topology.regularizer()
    }

    /// The effective connectivity `C` of the stack on the embedding of `x` `[B, in_dim]`
    /// (`[(L+2), (L+2)]` f64 on the CPU; see [`Topology::connectivity`]).
    pub fn connectivity(&self, x: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let x0 = self.stem.apply(x);
            self.with_units(|units| self.topology.connectivity(&x0, units))
        })
    }
}
