"""hacn (Hybrid ACN): x_k = f_k(x_{k-1}, norm) + a_k x_{k-1}; y = x0 + sum_k h_k (long) or x_L.

Options: `init` (alpha init, below), `depth_ln` (false), `long` (true),
`convention` (`alpha`: a_k = alpha[k-1]; `one_minus_alpha`: a_k = 1 - alpha[k-1]),
`learnable` (true; false freezes `alpha`).
Parameters: `topology.alpha` [L]; with depth_ln also `topology.norm_strength` [L] (init 0.05): unit l's
pre-norm is scaled by 1 + l * norm_strength[l-1] (l = 1..L).
Alpha init kinds: normal (mu 0.25, sigma 0.005), half_layers (mu_first 0.4 for the first ceil(L/2)
units, mu_second 0.15 after, sigma 0.005), exp_decay (mu_start 0.25 to mu_end 0.1, geometric in
depth, sigma 0.005), constant (value 0.25).
"""

import math

import torch
from torch import nn

import common

INIT_DEFAULTS = {
    "normal": {"mu": 0.25, "sigma": 0.005},
    "half_layers": {"mu_first": 0.4, "mu_second": 0.15, "sigma": 0.005},
    "exp_decay": {"mu_start": 0.25, "mu_end": 0.1, "sigma": 0.005},
    "constant": {"value": 0.25},
}


def alpha_init(where, init, L):
    if init is None:
        init = {}
    if not isinstance(init, dict):
        raise common.OptionError(f"{where}: option 'init' must be a mapping with 'kind'")
    init = dict(init)
    kind = init.pop("kind", "normal")
    common.as_choice(where, "init.kind", kind, tuple(INIT_DEFAULTS))
    o = common.take_options(f"{where} init '{kind}'", init, INIT_DEFAULTS[kind])
    o = {k: common.as_float(where, f"init.{k}", v) for k, v in o.items()}
    if "sigma" in o and o["sigma"] < 0:
        raise common.OptionError(f"{where}: init.sigma must be >= 0")
    if kind == "constant":
        return torch.full((L,), o["value"])
    if kind == "normal":
        mu = torch.full((L,), o["mu"])
    elif kind == "half_layers":
        first = math.ceil(L / 2)
        mu = torch.tensor([o["mu_first"] if l < first else o["mu_second"] for l in range(L)])
    else:  # exp_decay
        a, b = o["mu_start"], o["mu_end"]
        if a <= 0 or b <= 0:
            raise common.OptionError(f"{where}: exp_decay needs mu_start, mu_end > 0")
        mu = torch.tensor(
            [a * (b / a) ** (l / (L - 1)) if L > 1 else a for l in range(L)], dtype=torch.float32
        )
    return mu + o["sigma"] * torch.randn(L)


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'hacn'"
        opts = common.take_options(
            where,
            options,
            {"init": None, "depth_ln": False, "long": True, "convention": "alpha",
             "learnable": True},
        )
        self.depth_ln = common.as_bool(where, "depth_ln", opts["depth_ln"])
        self.long = common.as_bool(where, "long", opts["long"])
        self.convention = common.as_choice(
            where, "convention", opts["convention"], ("alpha", "one_minus_alpha")
        )
        learnable = common.as_bool(where, "learnable", opts["learnable"])
        self.L = L
        self.alpha = nn.Parameter(alpha_init(where, opts["init"], L).float())
        common.freeze([self.alpha], learnable)
        if self.depth_ln:
            # Depth-adaptive LayerNorm (H-ACN App. D, eq. 7): scale_l = 1 + l * s_l, s_l from 0.05.
            self.norm_strength = nn.Parameter(torch.full((L,), 0.05, dtype=torch.float32))

    def weight(self, k):
        a = self.alpha[k]
        return a if self.convention == "alpha" else 1.0 - a

    def forward(self, x0, units):
        common.check_units("hacn", units, self.L)
        x = x0
        acc = x0
        for k, f in enumerate(units):
            norm = 1.0 + (k + 1) * self.norm_strength[k] if self.depth_ln else None
            h = f(x, norm)
            x = h + self.weight(k) * x
            acc = acc + h
        return acc if self.long else x
