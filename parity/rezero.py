"""rezero: x_k = x_{k-1} + alpha[k-1] * f_k(x_{k-1}, norm = off if norm: off), y = x_L.

Option `norm`: `off` (default; the unit's pre-norm is skipped) or `keep`.
Parameters: `topology.alpha` [L] (init 0)."""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'rezero'"
        opts = common.take_options(where, options, {"norm": "off"})
        self.norm_mode = common.as_choice(where, "norm", opts["norm"], ("off", "keep"))
        self.L = L
        self.alpha = nn.Parameter(torch.zeros(L))

    def forward(self, x0, units):
        common.check_units("rezero", units, self.L)
        norm = "off" if self.norm_mode == "off" else None
        x = x0
        for k, f in enumerate(units):
            x = x + self.alpha[k] * f(x, norm)
        return x
