"""layercomb (H-ACN App. H): input_k = sum_{i<k} w_k[i] h_i for k = 1..L+1 (k = L+1 is y),
h_k = f_k(input_k). Option `init`: residual (all ones) | acn (w_k[k-1] = 1 else 0 for k <= L,
w_{L+1} all ones). Parameters `topology.weights.{k-1}` [k]."""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'layercomb'"
        opts = common.take_options(where, options, {"init": "residual"})
        init = common.as_choice(where, "init", opts["init"], ("residual", "acn"))
        self.L = L
        ws = []
        for k in range(1, L + 2):
            if init == "residual" or k == L + 1:
                w = torch.ones(k)
            else:
                w = torch.zeros(k)
                w[k - 1] = 1.0
            ws.append(nn.Parameter(w))
        self.weights = nn.ParameterList(ws)

    @staticmethod
    def combine(w, h):
        out = None
        for i, hi in enumerate(h):
            t = w[i] * hi
            out = t if out is None else out + t
        return out

    def forward(self, x0, units):
        common.check_units("layercomb", units, self.L)
        h = [x0]
        for k, f in enumerate(units, start=1):
            h.append(f(self.combine(self.weights[k - 1], h)))
        return self.combine(self.weights[self.L], h)
