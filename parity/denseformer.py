"""denseformer (DenseFormer DWA): options `dilation` (1), `period` (1); default granularity block.

X_0 = z_0 = x0; X_i = z_{i-1} + f_i(z_{i-1}); if i mod period == 0:
z_i = sum_{k in S_i} w_i[n] X_k, S_i = [k in 0..=i ascending, (i - k) mod dilation == 0]; else z_i = X_i.
y = z_L. Parameters `topology.weights.{i}` [|S_i|] (key = i, 1-based), init 1 at k = i, else 0.
"""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'denseformer'"
        opts = common.take_options(where, options, {"dilation": 1, "period": 1})
        self.dilation = common.as_int(where, "dilation", opts["dilation"], minimum=1)
        self.period = common.as_int(where, "period", opts["period"], minimum=1)
        self.L = L
        weights = {}
        for i in range(1, L + 1):
            if i % self.period == 0:
                S = self.sources(i)
                w = torch.zeros(len(S))
                w[S.index(i)] = 1.0
                weights[str(i)] = nn.Parameter(w)
        self.weights = nn.ParameterDict(weights)

    def sources(self, i):
        return [k for k in range(0, i + 1) if (i - k) % self.dilation == 0]

    def forward(self, x0, units):
        common.check_units("denseformer", units, self.L)
        X = [x0]
        z = x0
        for i, f in enumerate(units, start=1):
            Xi = z + f(z)
            X.append(Xi)
            if i % self.period == 0:
                w = self.weights[str(i)]
                z = None
                for n, k in enumerate(self.sources(i)):
                    t = w[n] * X[k]
                    z = t if z is None else z + t
            else:
                z = Xi
        return z
