"""residual: x_k = x_{k-1} + f_k(x_{k-1}), y = x_L. No parameters."""

from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        common.take_options("topology 'residual'", options, {})
        self.L = L

    def forward(self, x0, units):
        common.check_units("residual", units, self.L)
        x = x0
        for f in units:
            x = x + f(x)
        return x
