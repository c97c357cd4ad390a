"""acn: x_k = f_k(x_{k-1}), y = x0 + sum_{k=1}^{L} h_k. Option `depth_ln` (false): Depth-adaptive
LayerNorm as in hacn, `topology.norm_strength` [L] (init 0.05), unit l's pre-norm scaled by
1 + l * norm_strength[l-1]."""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'acn'"
        opts = common.take_options(where, options, {"depth_ln": False})
        self.depth_ln = common.as_bool(where, "depth_ln", opts["depth_ln"])
        self.L = L
        if self.depth_ln:
            self.norm_strength = nn.Parameter(torch.full((L,), 0.05, dtype=torch.float32))

    def forward(self, x0, units):
        common.check_units("acn", units, self.L)
        x = x0
        acc = x0
        for k, f in enumerate(units):
            if self.depth_ln:
                x = f(x, 1.0 + (k + 1) * self.norm_strength[k])
            else:
                x = f(x)
            acc = acc + x
        return acc
