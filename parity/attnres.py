"""attnres (Attention Residuals): option `blocks` (0 = full).

Parameters `topology.queries` [L+1, D] (init 0). Unit l's input is a softmax-weighted sum of its
sources, weights softmax_i(rms(v_i) . queries[l-1]) per token; y the same with queries[L].
Full: sources x0, h_1 .. h_{l-1}. Block (N > 0): units in consecutive groups of ceil(L/N); sources
x0, the sums of the completed groups, and the partial sum of l's group (if l is not its first).
"""

import math

import torch
from torch import nn

import common


def rms(v):
    return v / torch.sqrt((v * v).mean(dim=-1, keepdim=True) + 1e-6)


def mix(sources, q):
    V = torch.stack(sources, dim=0)  # [S, ..., D]
    a = torch.softmax((rms(V) * q).sum(dim=-1), dim=0)  # [S, ...]
    return (a.unsqueeze(-1) * V).sum(dim=0)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'attnres'"
        opts = common.take_options(where, options, {"blocks": 0})
        self.blocks = common.as_int(where, "blocks", opts["blocks"], minimum=0)
        self.L = L
        self.group = math.ceil(L / self.blocks) if self.blocks > 0 else None
        self.queries = nn.Parameter(torch.zeros(L + 1, D))

    def forward(self, x0, units):
        common.check_units("attnres", units, self.L)
        if self.blocks == 0:
            sources = [x0]
            for l, f in enumerate(units, start=1):
                sources.append(f(mix(sources, self.queries[l - 1])))
            return mix(sources, self.queries[self.L])
        completed = [x0]
        partial = None
        for l, f in enumerate(units, start=1):
            if (l - 1) % self.group == 0 and partial is not None:
                completed.append(partial)
                partial = None
            srcs = completed + ([partial] if partial is not None else [])
            h = f(mix(srcs, self.queries[l - 1]))
            partial = h if partial is None else partial + h
        if partial is not None:
            completed.append(partial)
        return mix(completed, self.queries[self.L])
