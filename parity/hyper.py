"""hyper (Hyper-Connections): options `n` (4), `dynamic` (true).

Streams H [..., n, D], H_0 = n copies of x0. Unit k (params under `topology.layers.{k-1}.`):
A = static_alpha (+ tanh(norm(H) @ dynamic_alpha) * alpha_scale), [..., n, n+1];
Bv = static_beta (+ tanh(norm(H) @ dynamic_beta) * beta_scale), [..., n];
u = sum_s A[..., s, 0] H_s; o = f_k(u); H'_t = sum_s A[..., s, 1+t] H_s + Bv[..., t] o.
y = mean over streams.
"""

import torch
from torch import nn

import backbones
import common


class HyperLayer(nn.Module):
    def __init__(self, n, D, k, dynamic):
        super().__init__()
        self.n = n
        self.dynamic = dynamic
        a = torch.zeros(n, n + 1)
        a[k % n, 0] = 1.0
        a[:, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(a)
        self.static_beta = nn.Parameter(torch.ones(n))
        if dynamic:
            self.norm = backbones.layer_norm(D)
            self.dynamic_alpha = nn.Parameter(torch.zeros(D, n + 1))
            self.dynamic_beta = nn.Parameter(torch.zeros(D))
            self.alpha_scale = nn.Parameter(torch.tensor(0.01))
            self.beta_scale = nn.Parameter(torch.tensor(0.01))

    def mixing(self, H):
        """Unit input weights and write weights from the streams H [..., n, D]: pre [..., n, 1]
        (or [n, 1]), res [..., n, n], post [..., n]."""
        if self.dynamic:
            # Both projections as one product with [dynamic_alpha | dynamic_beta] (one read of
            # norm(H), one bf16 rounding of its gradient), then split, as the Rust side does.
            N = self.norm(H)
            W = torch.cat([self.dynamic_alpha, self.dynamic_beta.unsqueeze(1)], dim=1)
            za, zb = torch.split(common.mm(N, W), [self.n + 1, 1], dim=-1)
            A = self.static_alpha + torch.tanh(za) * self.alpha_scale
            Bv = self.static_beta + torch.tanh(zb.squeeze(-1)) * self.beta_scale
        else:
            A = self.static_alpha
            Bv = self.static_beta
        # One split into the read's column and the write's matrix (backward: one cat), as the Rust
        # side does. Indexing A[..., 0] and A[..., 1:] instead computes the same, but
        # torch.compile's CPU code for that graph corrupts the heap (torch 2.11, bench/README).
        pre, res = torch.split(A, [1, self.n], dim=-1)
        return pre, res, Bv

    def read(self, H):
        """(u, res, post): the unit's input [..., D] and the write's weights."""
        pre, res, post = self.mixing(H)
        return (pre * H).sum(dim=-2), res, post

    def forward(self, H, f):
        u, res, post = self.read(H)
        o = f(u)
        return res.transpose(-1, -2) @ H + post.unsqueeze(-1) * o.unsqueeze(-2)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'hyper'"
        opts = common.take_options(where, options, {"n": 4, "dynamic": True})
        self.n = common.as_int(where, "n", opts["n"], minimum=1)
        self.dynamic = common.as_bool(where, "dynamic", opts["dynamic"])
        self.L = L
        self.layers = nn.ModuleList([HyperLayer(self.n, D, k, self.dynamic) for k in range(L)])

    def forward(self, x0, units):
        common.check_units("hyper", units, self.L)
        H = torch.stack([x0] * self.n, dim=-2)
        for layer, f in zip(self.layers, units):
            H = layer(H, f)
        return H.mean(dim=-2)
