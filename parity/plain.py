"""plain: x_k = f_k(x_{k-1}), y = x_L. No parameters."""

from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        common.take_options("topology 'plain'", options, {})
        self.L = L

    def forward(self, x0, units):
        common.check_units("plain", units, self.L)
        x = x0
        for f in units:
            x = f(x)
        return x
