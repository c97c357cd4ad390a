"""laurel (LAuReL): options `variant` (rw | lr | pa; default rw), `rank` (4), `history` (2).

Per unit k, params under `topology.layers.{k-1}.`:
rw: weights [2] (init 0), (alpha, beta) = softmax(weights), x_k = alpha f_k(x_{k-1}) + beta x_{k-1};
lr: down [rank, D] (init N(0, 1/D)), up [D, rank] (init 0),
    x_k = f_k(x_{k-1}) + x_{k-1} + (x_{k-1} @ down^T) @ up^T;
pa: down, up and gamma [history] (init 1),
    x_k = f_k(x_{k-1}) + x_{k-1} + sum_{j=1..history, k-j>=0} gamma[j-1] (x_{k-j} @ down^T) @ up^T.
y = x_L.
"""

import math

import torch
from torch import nn

import common


class LaurelLayer(nn.Module):
    def __init__(self, variant, D, rank, history):
        super().__init__()
        if variant == "rw":
            self.weights = nn.Parameter(torch.zeros(2))
            return
        self.down = nn.Parameter(torch.randn(rank, D) / math.sqrt(D))
        self.up = nn.Parameter(torch.zeros(D, rank))
        if variant == "pa":
            self.gamma = nn.Parameter(torch.ones(history))

    def low_rank(self, x):
        return common.mm(common.mm(x, self.down.t()), self.up.t())


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'laurel'"
        opts = common.take_options(where, options, {"variant": "rw", "rank": 4, "history": 2})
        self.variant = common.as_choice(where, "variant", opts["variant"], ("rw", "lr", "pa"))
        self.rank = common.as_int(where, "rank", opts["rank"], minimum=1)
        self.history = common.as_int(where, "history", opts["history"], minimum=1)
        self.L = L
        self.layers = nn.ModuleList(
            [LaurelLayer(self.variant, D, self.rank, self.history) for _ in range(L)]
        )

    def forward(self, x0, units):
        common.check_units("laurel", units, self.L)
        xs = [x0]
        for k, (layer, f) in enumerate(zip(self.layers, units), start=1):
            x = xs[k - 1]
            if self.variant == "rw":
                w = torch.softmax(layer.weights, dim=0)
                z = w[0] * f(x) + w[1] * x
            elif self.variant == "lr":
                z = f(x) + x + layer.low_rank(x)
            else:
                z = f(x) + x
                for j in range(1, self.history + 1):
                    if k - j >= 0:
                        z = z + layer.gamma[j - 1] * layer.low_rank(xs[k - j])
            xs.append(z)
        return xs[self.L]
