"""ancre (ANCRe): learned, normalised shortcuts into the anchor units.

Options: `normalization` (ingoing | outgoing), `tau` (0.01), `learnable` (true),
`weights` (softmax | constant | cascaded), `placement` (block | module | ffn),
`tsallis` ({weight: 0, q: 2}).
Anchors a_1 < ... < a_A; units before a_1 run residually from x0 (giving s_0); anchor j:
z = f_{a_j}(s_{j-1}) + sum_{i<j} p_ij s_i, the following non-anchor units run residually, and the
stream before a_{j+1} (or the end) is s_j; y = s_A.
"""

import torch
from torch import nn

import common


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'ancre'"
        opts = common.take_options(
            where,
            options,
            {"normalization": "ingoing", "tau": 0.01, "learnable": True, "weights": "softmax",
             "placement": "block", "tsallis": None},
        )
        self.normalization = common.as_choice(
            where, "normalization", opts["normalization"], ("ingoing", "outgoing")
        )
        self.tau = common.as_float(where, "tau", opts["tau"], positive=True)
        learnable = common.as_bool(where, "learnable", opts["learnable"])
        self.weights = common.as_choice(
            where, "weights", opts["weights"], ("softmax", "constant", "cascaded")
        )
        self.placement = common.as_choice(
            where, "placement", opts["placement"], ("block", "module", "ffn")
        )
        ts = common.take_options(f"{where} tsallis", opts["tsallis"], {"weight": 0.0, "q": 2.0})
        self.tsallis_weight = common.as_float(where, "tsallis.weight", ts["weight"], nonnegative=True)
        self.tsallis_q = common.as_float(where, "tsallis.q", ts["q"])
        if self.tsallis_weight > 0:
            if self.weights != "softmax":
                raise common.OptionError(
                    f"{where}: the Tsallis regulariser needs weights: softmax, got {self.weights!r}"
                )
            if self.tsallis_q == 1.0:
                raise common.OptionError(f"{where}: tsallis.q must differ from 1")

        self.L = L
        if block_size == 1 or self.placement == "module":
            anchors = list(range(1, L + 1))
        elif self.placement == "block":
            anchors = [k for k in range(1, L + 1) if (k - 1) % block_size == 0]
        else:  # ffn
            anchors = [k for k in range(1, L + 1) if (k - 1) % block_size == 1]
        if not anchors:
            raise common.OptionError(f"{where}: no anchor units (L = {L})")
        self.anchors = anchors
        A = len(anchors)
        self.A = A

        if self.weights == "softmax":
            if self.normalization == "ingoing":
                self.logits = nn.ParameterList([nn.Parameter(torch.zeros(j)) for j in range(1, A + 1)])
            else:
                self.logits = nn.ParameterList([nn.Parameter(torch.zeros(A - i)) for i in range(A)])
            common.freeze(self.logits, learnable)
        elif self.weights == "cascaded":
            self.scale = nn.Parameter(torch.ones(A))
            common.freeze([self.scale], learnable)

    def distributions(self):
        """The softmax distributions (ingoing: one per target j; outgoing: one per source i)."""
        return [torch.softmax(c / self.tau, dim=-1) for c in self.logits]

    def coefficients(self):
        """coef[j] = list of (i, p_ij) for target j = 1..A (coef[0] unused)."""
        A = self.A
        coef = [[] for _ in range(A + 1)]
        if self.weights == "softmax":
            dists = self.distributions()
            if self.normalization == "ingoing":
                for j in range(1, A + 1):
                    coef[j] = [(i, dists[j - 1][i]) for i in range(j)]
            else:
                for j in range(1, A + 1):
                    coef[j] = [(i, dists[i][j - i - 1]) for i in range(j)]
        elif self.weights == "constant":
            for j in range(1, A + 1):
                coef[j] = [(i, 1.0 / j) for i in range(j)]
        else:  # cascaded
            for j in range(1, A + 1):
                coef[j] = [(j - 1, self.scale[j - 1])]
        return coef

    def forward(self, x0, units):
        common.check_units("ancre", units, self.L)
        coef = self.coefficients()
        z = x0
        for k in range(1, self.anchors[0]):
            z = z + units[k - 1](z)
        s = [z]
        for j, a in enumerate(self.anchors, start=1):
            end = self.anchors[j] if j < self.A else self.L + 1
            z = units[a - 1](s[j - 1])
            for i, p in coef[j]:
                z = z + p * s[i]
            for k in range(a + 1, end):
                z = z + units[k - 1](z)
            s.append(z)
        return s[self.A]

    def regularizer(self):
        if self.tsallis_weight <= 0:
            return None
        q = self.tsallis_q
        total = None
        for p in self.distributions():
            sq = (1.0 - torch.pow(p, q).sum()) / (q - 1.0)
            total = sq if total is None else total + sq
        return self.tsallis_weight * total
