"""densenet (concatenation): input_k = P_k(concat(h_0..h_{k-1}, -1)) for k = 1..L+1 (k = L+1 is y),
P_k = Linear(k D, D, bias=False) named `topology.proj.{k-1}`, init [I I ... I] (sum-like)."""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        common.take_options("topology 'densenet'", options, {})
        self.L = L
        proj = []
        for k in range(1, L + 2):
            p = nn.Linear(k * D, D, bias=False)
            with torch.no_grad():
                p.weight.copy_(torch.cat([torch.eye(D)] * k, dim=1))
            proj.append(p)
        self.proj = nn.ModuleList(proj)

    def forward(self, x0, units):
        common.check_units("densenet", units, self.L)
        h = [x0]
        for k, f in enumerate(units, start=1):
            h.append(f(common.mm(torch.cat(h, dim=-1), self.proj[k - 1].weight.t())))
        return common.mm(torch.cat(h, dim=-1), self.proj[self.L].weight.t())
