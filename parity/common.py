"""Shared helpers for the PyTorch parity references (see SPEC.md).

- option parsing with defaults and clear errors,
- block units (`granularity: block`),
- the registry mapping a topology kind to its module (`parity/<kind>.py`).
"""

import importlib
import math
import numbers
import os

import torch
from torch import nn

# kind -> module name: every `parity/<kind>.py` that defines the reference `class Topology` (one
# file per topology, named after its kind), so adding a reference file is all it takes.
_HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGIES = {
    name[:-3]: name[:-3]
    for name in sorted(os.listdir(_HERE))
    if name.endswith(".py") and "\nclass Topology(" in open(os.path.join(_HERE, name), encoding="utf-8").read()
}

# Default granularity: `sublayer` for every topology except these.
DEFAULT_GRANULARITY = {"denseformer": "block"}
GRANULARITIES = ("sublayer", "block")


# The compute dtype of the topology being built: its own matmuls (projections, low-rank maps,
# dynamic mixing weights) run in bf16 under `precision: bf16`, like every Linear; set by
# build_topology from the backbone.
COMPUTE = {"bf16": False}


def mm(a, b):
    """a @ b in the compute dtype, returned in the stream dtype (a [..., m, k], b [k, n])."""
    if COMPUTE["bf16"]:
        return stream((a.bfloat16() @ b.bfloat16()))
    return a @ b


def stream(t):
    """`t` in the stream dtype: float32, or float64 in the high-precision run (run.py
    `high_precision`), which sets torch's default dtype to float64 for its duration."""
    return t.to(torch.get_default_dtype())


class OptionError(ValueError):
    """A case/config option is missing, unknown or has a wrong value."""


# ---------------------------------------------------------------------------------------------
# Option parsing


def take_options(where, options, defaults):
    """Merge `options` over `defaults`; unknown keys are an error."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise OptionError(f"{where}: options must be a mapping, got {options!r}")
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise OptionError(
            f"{where}: unknown option(s) {unknown}; allowed: {sorted(defaults)}"
        )
    out = dict(defaults)
    out.update(options)
    return out


def as_bool(where, name, value):
    if isinstance(value, bool):
        return value
    raise OptionError(f"{where}: option '{name}' must be true or false, got {value!r}")


def as_int(where, name, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionError(f"{where}: option '{name}' must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise OptionError(f"{where}: option '{name}' must be >= {minimum}, got {value}")
    return value


def as_float(where, name, value, positive=False, nonnegative=False):
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            value = float(value)
        except ValueError:
            raise OptionError(
                f"{where}: option '{name}' must be a number, got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(f"{where}: option '{name}' must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise OptionError(f"{where}: option '{name}' must be finite, got {value}")
    if positive and not value > 0:
        raise OptionError(f"{where}: option '{name}' must be > 0, got {value}")
    if nonnegative and value < 0:
        raise OptionError(f"{where}: option '{name}' must be >= 0, got {value}")
    return value


def as_choice(where, name, value, choices):
    if value not in choices:
        raise OptionError(
            f"{where}: option '{name}' must be one of {list(choices)}, got {value!r}"
        )
    return value


def freeze(params, learnable):
    """`learnable: false`: the parameters exist but get no gradient."""
    for p in params:
        p.requires_grad_(learnable)


# ---------------------------------------------------------------------------------------------
# Units and granularity


def check_norm(norm):
    """Validate a unit's `norm` argument: None (default pre-norm), 0-dim tensor (scale), 'off'."""
    if norm is None:
        return
    if isinstance(norm, str):
        if norm != "off":
            raise ValueError(f"unit norm mode must be None, a 0-dim tensor or 'off', got {norm!r}")
        return
    if isinstance(norm, torch.Tensor) and norm.dim() == 0:
        return
    raise ValueError(f"unit norm mode must be None, a 0-dim tensor or 'off', got {norm!r}")


class BlockUnit:
    """A block unit: runs `block_size` consecutive sublayer units with their usual residuals and
    returns the delta `z - x` (the same norm mode is passed to every sublayer)."""

    def __init__(self, subunits):
        self.subunits = list(subunits)

    def __call__(self, x, norm=None):
        check_norm(norm)
        z = x
        for g in self.subunits:
            z = z + g(z, norm)
        return z - x

    def ports(self, q, k, v, r):
        """The block run from the residual port r, its first sublayer (an attention) reading the
        query, key and value ports; returns the delta over r (SPEC.md "Ports")."""
        z = r + self.subunits[0].ports(q, k, v)
        for g in self.subunits[1:]:
            z = z + g(z)
        return z - r


class Float32Output:
    """A sublayer unit whose output is cast to the stream dtype, float32 (under bf16 a branch ends
    in a bf16 Linear; the stream it joins stays float32)."""

    def __init__(self, unit):
        self.unit = unit

    def __call__(self, x, norm=None):
        return stream(self.unit(x, norm))

    def ports(self, q, k, v):
        return stream(self.unit.ports(q, k, v))


def make_units(backbone, granularity):
    """Units at the given granularity and the block size seen by the topology; every sublayer's
    output is float32."""
    as_choice("topology", "granularity", granularity, GRANULARITIES)
    subs = [Float32Output(u) for u in backbone.units]
    bs = backbone.block_size
    if granularity == "sublayer":
        return subs, bs
    if len(subs) % bs != 0:
        raise OptionError(f"{len(subs)} sublayer units do not split into blocks of {bs}")
    return [BlockUnit(subs[i : i + bs]) for i in range(0, len(subs), bs)], 1


def check_units(where, units, L):
    if len(units) != L:
        raise ValueError(f"{where}: built for L = {L} units, called with {len(units)}")


# ---------------------------------------------------------------------------------------------
# Registry


def topology_module(kind):
    if kind not in TOPOLOGIES:
        raise OptionError(f"unknown topology kind {kind!r}; known: {sorted(TOPOLOGIES)}")
    return importlib.import_module(TOPOLOGIES[kind])


def build_topology(cfg, backbone):
    """Build the topology module for a backbone from the case's `topology` section.

    Returns the module with attribute `granularity` set; get its units with
    `make_units(backbone, topo.granularity)`."""
    if cfg is None:
        raise OptionError("case has no 'topology' section")
    if not isinstance(cfg, dict):
        raise OptionError(f"'topology' must be a mapping, got {cfg!r}")
    cfg = dict(cfg)
    kind = cfg.pop("kind", None)
    if kind is None:
        raise OptionError("topology: missing 'kind'")
    module = topology_module(kind)
    COMPUTE["bf16"] = bool(getattr(backbone, "bf16", False))
    # A reference may choose its default from its options (`compose`: its depth rule's default).
    default = getattr(module, "default_granularity", lambda _cfg: DEFAULT_GRANULARITY.get(kind, "sublayer"))
    granularity = cfg.pop("granularity", default(cfg))
    as_choice(f"topology '{kind}'", "granularity", granularity, GRANULARITIES)
    # A topology that feeds the units' ports (`mudd`) has the backbone build the ports' norms.
    if getattr(module, "uses_ports", lambda _cfg, _backbone: False)(cfg, backbone):
        if not hasattr(backbone, "add_ports"):
            raise OptionError(f"topology '{kind}': the backbone's blocks have no query, key and value ports")
        backbone.add_ports()
    units, block_size = make_units(backbone, granularity)
    topo = module.Topology(cfg, len(units), backbone.width, block_size)
    topo.granularity = granularity
    topo.kind = kind
    return topo
