"""compose: a depth rule over a width rule (docs/topologies.md, `compose`).

Options `depth` ({kind, ...}, default residual) and `width` ({kind, ...}, default single), each
part's other options as that topology alone takes them; one granularity for both (the harness
builds the units at it; a part may repeat it, not change it).

The depth rule's reference runs unchanged on states of n streams [..., n, D] (x0 as n copies),
with unit k replaced by the width rule's increment
    dH_k(H) = (res - I)^T H + post (x) f_k(sum_s pre[s] H_s),
(pre, res, post) unit k's mixing weights from H (`single`: n = 1, dH_k(H) = f_k(H)).
y = mean over streams of the depth rule's output. Parameters: the depth rule's under
`topology.depth.`, the width rule's under `topology.width.`.
"""

import torch
from torch import nn

import common

DEPTH_RULES = ("residual", "hacn", "ancre", "denseformer", "layercomb", "attnres", "graph")
WIDTH_RULES = ("single", "hyper", "mhc")


def _part(where, options, name, default):
    opts = options.get(name)
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise common.OptionError(f"{where}: option '{name}' must be a mapping, got {opts!r}")
    opts = dict(opts)
    kind = opts.pop("kind", default)
    opts.pop("granularity", None)  # checked by the Rust side; the units are built at one granularity
    return kind, opts


def default_granularity(cfg):
    """The depth rule's own default, unless the composition or its depth part sets one."""
    depth = cfg.get("depth") or {}
    kind = depth.get("kind", "residual")
    return depth.get("granularity", common.DEFAULT_GRANULARITY.get(kind, "sublayer"))


class Increment:
    """Unit k as the depth rule sees it: H [..., n, D] -> dH_k(H) [..., n, D]."""

    def __init__(self, layer, f):
        self.layer = layer
        self.f = f

    def __call__(self, H, norm=None):
        u, res, post = self.layer.read(H)
        o = self.f(u, norm)
        eye = torch.eye(res.shape[-1], dtype=res.dtype, device=res.device)
        return (res - eye).transpose(-1, -2) @ H + post.unsqueeze(-1) * o.unsqueeze(-2)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'compose'"
        opts = common.take_options(where, options, {"depth": None, "width": None})
        depth_kind, depth_opts = _part(where, opts, "depth", "residual")
        width_kind, width_opts = _part(where, opts, "width", "single")
        common.as_choice(where, "depth.kind", depth_kind, DEPTH_RULES)
        common.as_choice(where, "width.kind", width_kind, WIDTH_RULES)
        self.L = L
        self.depth = common.topology_module(depth_kind).Topology(depth_opts, L, D, block_size)
        if width_kind == "single":
            if width_opts:
                raise common.OptionError(f"{where}: width 'single' takes no option, got {sorted(width_opts)}")
            self.width = None
            self.n = 1
        else:
            self.width = common.topology_module(width_kind).Topology(width_opts, L, D, block_size)
            self.n = self.width.n

    def regularizer(self):
        fn = getattr(self.depth, "regularizer", None)
        return fn() if fn is not None else None

    def forward(self, x0, units):
        common.check_units("compose", units, self.L)
        H = torch.stack([x0] * self.n, dim=-2)
        if self.width is None:
            lifted = [lambda h, norm=None, f=f: f(h.squeeze(-2), norm).unsqueeze(-2) for f in units]
        else:
            lifted = [Increment(layer, f) for layer, f in zip(self.width.layers, units)]
        return self.depth(H, lifted).mean(dim=-2)
