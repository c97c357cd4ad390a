"""mhc (Manifold-Constrained Hyper-Connections): options `n` (4), `sinkhorn_iters` (20), `init`
(`residual`, `lucidrains` or `symmetric`), `res_bias` (`zeros` or `identity`, replacing b_res).

Streams as in hyper (H_0 = n copies of x0, y = mean over streams). Unit k (params under
`topology.layers.{k-1}.`): v = flatten(H); r = sqrt(mean(v^2)); q = v @ phi split into pre [n],
post [n], res [n, n]; H_pre = sigmoid(alpha_pre pre / r + bias_pre); H_post = 2 sigmoid(...);
H_res = Sinkhorn(exp(R - max R)), R = alpha_res res / r + bias_res (rows then columns, iters times);
u = sum_s H_pre[s] H_s; o = f_k(u); H'_t = sum_s H_res[s, t] H_s + H_post[t] o.

Init (alpha = 0.01 in each): `residual` starts as the pre-norm residual network, HC's static init
through mHC's maps: bias_pre = +8 at stream (k-1) mod n and -8 elsewhere, bias_res = 0 on the
diagonal and -8 off it, bias_post = 0, phi = 0. `lucidrains`: bias_pre = one-hot(k-1 mod n),
bias_res = I, bias_post = 1 (H_post = 2 sigmoid(1)), phi = 0. `symmetric`: biases 0, phi ~ N(0, 0.02^2).
"""

import torch
from torch import nn

import common


def sinkhorn(R, iters):
    M = torch.exp(R - R.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        M = M / M.sum(dim=-1, keepdim=True)
        M = M / M.sum(dim=-2, keepdim=True)
    return M


class MHCLayer(nn.Module):
    def __init__(self, n, D, iters, index, init, res_bias):
        super().__init__()
        self.n = n
        self.iters = iters
        own = index % n  # the stream this unit reads at init
        if init == "symmetric":
            phi = torch.randn(n * D, n * n + 2 * n) * 0.02
            bias_pre, bias_res = torch.zeros(n), torch.zeros(n, n)
        else:
            on, off = (8.0, -8.0) if init == "residual" else (1.0, 0.0)
            phi = torch.zeros(n * D, n * n + 2 * n)
            bias_pre = torch.full((n,), off)
            bias_pre[own] = on
            diag_on, diag_off = (0.0, -8.0) if init == "residual" else (1.0, 0.0)
            bias_res = torch.full((n, n), diag_off) + torch.eye(n) * (diag_on - diag_off)
        if res_bias == "zeros":
            bias_res = torch.zeros(n, n)
        elif res_bias == "identity":
            bias_res = 5.0 * torch.eye(n)
        self.phi = nn.Parameter(phi)
        self.alpha_pre = nn.Parameter(torch.tensor(0.01))
        self.alpha_post = nn.Parameter(torch.tensor(0.01))
        self.alpha_res = nn.Parameter(torch.tensor(0.01))
        self.bias_pre = nn.Parameter(bias_pre)
        # lucidrains' port starts its static beta at 1 (H_post = 2 sigmoid(1)).
        self.bias_post = nn.Parameter(torch.full((n,), 1.0 if init == "lucidrains" else 0.0))
        self.bias_res = nn.Parameter(bias_res)

    def coefficients(self, H):
        n = self.n
        v = H.flatten(-2)
        r = torch.sqrt((v * v).mean(dim=-1, keepdim=True))
        q = common.mm(v, self.phi)
        pre = q[..., :n]
        post = q[..., n : 2 * n]
        res = q[..., 2 * n :].reshape(*q.shape[:-1], n, n)
        h_pre = torch.sigmoid(self.alpha_pre * pre / r + self.bias_pre)
        h_post = 2.0 * torch.sigmoid(self.alpha_post * post / r + self.bias_post)
        R = self.alpha_res * res / r.unsqueeze(-1) + self.bias_res
        h_res = sinkhorn(R, self.iters)
        return h_pre, h_post, h_res

    def read(self, H):
        """(u, res, post): the unit's input [..., D] and the write's weights H_res [..., n, n],
        H_post [..., n]."""
        h_pre, h_post, h_res = self.coefficients(H)
        return (h_pre.unsqueeze(-1) * H).sum(dim=-2), h_res, h_post

    def forward(self, H, f):
        u, h_res, h_post = self.read(H)
        o = f(u)
        return h_res.transpose(-1, -2) @ H + h_post.unsqueeze(-1) * o.unsqueeze(-2)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'mhc'"
        opts = common.take_options(
            where, options, {"n": 4, "sinkhorn_iters": 20, "init": "residual", "res_bias": None}
        )
        self.n = common.as_int(where, "n", opts["n"], minimum=1)
        self.iters = common.as_int(where, "sinkhorn_iters", opts["sinkhorn_iters"], minimum=0)
        if opts["init"] not in ("residual", "lucidrains", "symmetric"):
            raise common.OptionError(f"{where}: init {opts['init']!r}: expected residual, lucidrains or symmetric")
        if opts["res_bias"] not in (None, "zeros", "identity"):
            raise common.OptionError(f"{where}: res_bias {opts['res_bias']!r}: expected zeros or identity")
        self.L = L
        self.layers = nn.ModuleList(
            [MHCLayer(self.n, D, self.iters, k, opts["init"], opts["res_bias"]) for k in range(L)]
        )

    def forward(self, x0, units):
        common.check_units("mhc", units, self.L)
        H = torch.stack([x0] * self.n, dim=-2)
        for layer, f in zip(self.layers, units):
            H = layer(H, f)
        return H.mean(dim=-2)
