"""mudd (MUDDFormer's multiway dynamic dense connections): options `ways` ("qkvr" where the
backbone's blocks have ports, else "l"), `dynamic` (true); default granularity block. Written from docs/topologies.md, "`mudd`".

X_0 = x0; block i (1..L) runs from the residual input R_i (x0 for block 1): X_i = R_i + h_i, with
`qkvr` block i >= 2 reading its query, key and value ports from its own three mixes (units'
`ports(q, k, v, r)`). After block i, per token, W_i = b_i + w2_i(gelu(w1_i(rms(X_i)))) [C_i, i+1]
(b_i alone when not dynamic; C_i = 4 for qkvr, 1 for l, and 1 after the last block), way-major;
Z^c = sum_j W_i[c, j] X_j. qkvr: (Q, K, V, R) = Z^0..Z^3; l: R = Z^0. y = Z_L^0.
Parameters `topology.dense.{i}` [C_i, i+1] (init one-hot at j = i), `topology.dynamic.{i}.w1.weight`
[H_i, D] (normal, std 1/sqrt(D)), `.w2.weight` [C_i (i+1), H_i] (zero),
H_i = (floor(C_i (i+1) e_i / 64) + 1) * 64, e_i = 4 for the last block, else 1.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import common

WAYS = ("qkvr", "l")


def default_granularity(_cfg):
    return "block"


def uses_ports(cfg, backbone):
    """Sets the default `ways` (qkvr where the backbone's blocks have ports, else l) into `cfg`."""
    return cfg.setdefault("ways", "qkvr" if hasattr(backbone, "add_ports") else "l") == "qkvr"


def round64(n):
    return (n // 64 + 1) * 64


def lin(x, w):
    """x @ w.T in the compute dtype (bf16 under precision bf16, as every Linear), returned in it."""
    if common.COMPUTE["bf16"]:
        return F.linear(x.bfloat16(), w.bfloat16())
    return F.linear(x, w)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'mudd'"
        opts = common.take_options(where, options, {"ways": "qkvr", "dynamic": True})
        self.ways = common.as_choice(where, "ways", opts["ways"], WAYS)
        self.is_dynamic = common.as_bool(where, "dynamic", opts["dynamic"])
        self.L = L
        C = 4 if self.ways == "qkvr" else 1
        dense, dynamic = {}, {}
        for i in range(1, L + 1):
            c = 1 if i == L else C
            b = torch.zeros(c, i + 1)
            b[:, i] = 1.0
            dense[str(i)] = nn.Parameter(b)
            if self.is_dynamic:
                hidden = round64(c * (i + 1) * (4 if i == L else 1))
                m = nn.Module()
                m.w1 = nn.Linear(D, hidden, bias=False)
                m.w2 = nn.Linear(hidden, c * (i + 1), bias=False)
                with torch.no_grad():
                    m.w1.weight.normal_(0.0, 1.0 / math.sqrt(D))
                    m.w2.weight.zero_()
                dynamic[str(i)] = m
        self.dense = nn.ParameterDict(dense)
        if self.is_dynamic:
            self.dynamic = nn.ModuleDict(dynamic)

    def weights(self, i, x):
        """W_i [..., C_i, i+1] (dynamic) or b_i [C_i, i+1]."""
        b = self.dense[str(i)]
        if not self.is_dynamic:
            return b
        r = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6)
        g = self.dynamic[str(i)]
        dw = lin(F.gelu(lin(r, g.w1.weight), approximate="none"), g.w2.weight)
        return common.stream(dw).reshape(*x.shape[:-1], *b.shape) + b

    def forward(self, x0, units):
        common.check_units("mudd", units, self.L)
        X = [x0]
        ins = [x0] * (4 if self.ways == "qkvr" else 1)
        for i, f in enumerate(units, start=1):
            R = ins[-1]
            if len(ins) == 4 and i > 1:
                Xi = R + f.ports(ins[0], ins[1], ins[2], R)
            else:
                Xi = R + f(R)
            X.append(Xi)
            W = self.weights(i, Xi)
            ins = []
            for c in range(W.shape[-2]):
                z = 0
                for j, Xj in enumerate(X):
                    w = W[..., c, j]
                    z = z + (w if w.dim() == 0 else w.unsqueeze(-1)) * Xj
                ins.append(z)
        return ins[0]
