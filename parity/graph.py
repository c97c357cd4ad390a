"""graph: a topology given by its connectivity matrix (docs/topologies.md, `graph`).

h_0 = x0; node j = 1..L+1 reads input_j = sum_n c_j[n] * h_{S_j[n]} over its sources S_j
(ascending); h_j = f_j(input_j) for the units, y = input_{L+1}.

Options: `pattern` (all | chain | {window: k} | {dilation: d} | {blocks: b}) or `edges`
(["i:j", ...], 0 <= i < j <= L+1), `readout` (pattern | last | all | [i, ...]), `weights`
(learnable | fixed), `init` (residual | acn | uniform | number | {from: RUN_DIR, step: N} |
{file: C.csv}),
`frozen`, `normalize` (none | softmax), `temperature` (softmax only, default 1).
c_j = w_j (none) or softmax(logits_j / temperature) (softmax, logits start at temperature*ln w_j).
Parameters (learnable): `topology.weights.{j-1}` or `topology.logits.{j-1}`, shape [|S_j|].
"""

import csv
import math
import numbers
import os

import torch
from torch import nn

import common


def pattern_sources(where, pattern, L):
    """S_j for j = 1..L+1 from a pattern option."""
    if pattern == "all":
        return [list(range(j)) for j in range(1, L + 2)]
    if pattern == "chain":
        return [[j - 1] for j in range(1, L + 2)]
    if isinstance(pattern, dict) and len(pattern) == 1:
        (name, n), = pattern.items()
        if name == "window":
            k = common.as_int(where, "pattern.window", n, minimum=1)
            if k > L + 1:
                raise common.OptionError(f"{where}: pattern.window must be <= L+1 = {L + 1}, got {k}")
            return [list(range(max(0, j - k), j)) for j in range(1, L + 2)]
        if name == "dilation":
            d = common.as_int(where, "pattern.dilation", n, minimum=1)
            if d > L:
                raise common.OptionError(f"{where}: pattern.dilation must be <= L = {L}, got {d}")
            return [[i for i in range(j) if (j - 1 - i) % d == 0] for j in range(1, L + 2)]
        if name == "blocks":
            b = common.as_int(where, "pattern.blocks", n, minimum=1)
            if b > L:
                raise common.OptionError(f"{where}: pattern.blocks must be <= L = {L}, got {b}")
            # Unit j is in block g = (j-1)//b; it reads node g*b (just before its block) onward.
            return [list(range((j - 1) // b * b, j)) for j in range(1, L + 2)]
    raise common.OptionError(f"{where}: option 'pattern' must be all, chain, {{window|dilation|blocks: n}}, got {pattern!r}")


def edge_sources(where, edges, L):
    sources = [[] for _ in range(L + 1)]
    for e in edges:
        try:
            a, b = e.split(":")
            i, j = int(a), int(b)
        except (AttributeError, ValueError):
            raise common.OptionError(f"{where}: edge {e!r} is not of the form 'i:j'") from None
        if not (0 <= i < j <= L + 1):
            raise common.OptionError(f"{where}: edge {e!r} needs 0 <= i < j <= L+1 = {L + 1}")
        if i in sources[j - 1]:
            raise common.OptionError(f"{where}: edge {e!r} given twice")
        sources[j - 1].append(i)
    return [sorted(s) for s in sources]


def read_c(where, path):
    """A C written as CSV (`plexus connectivity`'s output, a run's `connectivity/step_N.csv`, or a
    run's pinned copy): a header `node,0,1,...`, then a row per source node with its label first;
    rows and columns are matched by their labels (each of 0..n-1 once), every entry a finite number
    (docs/graph.md)."""
    with open(path, encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r]
    try:
        cols = [int(x) for x in rows[0][1:]]
        n = len(cols)
        if n < 2 or sorted(cols) != list(range(n)) or len(rows) != n + 1:
            raise ValueError
        c = [[0.0] * n for _ in range(n)]
        seen = set()
        for r in rows[1:]:
            i = int(r[0])
            if i in seen or not 0 <= i < n or len(r) != n + 1:
                raise ValueError
            seen.add(i)
            for j, v in zip(cols, r[1:]):
                c[i][j] = float(v)
                if not math.isfinite(c[i][j]):
                    raise ValueError
    except (ValueError, IndexError):
        raise common.OptionError(f"{where}: {path} is not a C as CSV (header node,0,1,...; one labelled row per "
                                 f"node; finite entries)") from None
    return c


def saved_connectivity(where, spec):
    """C of `init`: `{file: C.csv}`, or `{from: RUN_DIR, step: N}` (the run's
    `connectivity/step_N.csv`; without `step`, its last saved step). `parity/load.py` passes a
    run's pinned copy as `{file}`."""
    if "file" in spec:
        if set(spec) != {"file"}:
            raise common.OptionError(f"{where}: init.file takes no other key, got {sorted(spec)}")
        return read_c(where, spec["file"])
    if set(spec) - {"from", "step"} or "from" not in spec:
        raise common.OptionError(f"{where}: init must be {{from: RUN_DIR, step: N}} or {{file: C.csv}}, got {spec!r}")
    run = spec["from"]
    folder = os.path.join(run, "connectivity")
    steps = sorted(int(f[5:-4]) for f in os.listdir(folder) if f.startswith("step_") and f.endswith(".csv"))
    step = spec.get("step", steps[-1] if steps else None)
    if step not in steps:
        raise common.OptionError(f"{where}: init.from {run!r} has no C at step {step!r} (saved: {steps})")
    return read_c(where, os.path.join(folder, f"step_{step}.csv"))


def check_against_edges(where, c, sources):
    """Every entry the graph has no edge for is 0 (docs/graph.md): on or below the diagonal, or off
    the pattern or edge list."""
    n = len(c)
    if n != len(sources) + 1:
        raise common.OptionError(f"{where}: a C of {n} nodes for a graph of {len(sources) + 1}")
    for i in range(n):
        for j in range(n):
            if c[i][j] != 0.0 and not (j >= 1 and i in sources[j - 1]):
                raise common.OptionError(f"{where}: C[{i}][{j}] = {c[i][j]} is off the graph's edges (must be 0)")


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'graph'"
        opts = common.take_options(
            where,
            options,
            {"pattern": None, "edges": None, "readout": "pattern", "weights": "learnable", "init": "residual",
             "frozen": False, "normalize": "none", "temperature": None},
        )
        if opts["edges"] is not None:
            if opts["pattern"] is not None:
                raise common.OptionError(f"{where}: give 'pattern' or 'edges', not both")
            sources = edge_sources(where, opts["edges"], L)
        else:
            sources = pattern_sources(where, "all" if opts["pattern"] is None else opts["pattern"], L)
        readout = opts["readout"]
        if readout == "last":
            sources[L] = [L]
        elif readout == "all":
            sources[L] = list(range(L + 1))
        elif isinstance(readout, list):
            nodes = [common.as_int(where, "readout", i, minimum=0) for i in readout]
            if not nodes or len(set(nodes)) != len(nodes) or max(nodes) > L:
                raise common.OptionError(f"{where}: readout must list distinct nodes in 0..{L}, got {readout!r}")
            sources[L] = sorted(nodes)
        elif readout != "pattern":
            raise common.OptionError(f"{where}: option 'readout' must be pattern, last, all or a list, got {readout!r}")
        if any(not s for s in sources):
            raise common.OptionError(f"{where}: every unit and the readout needs at least one source")
        self.sources = sources
        self.L = L

        init = opts["init"]
        if init == "residual":
            w = [[1.0] * len(s) for s in sources]
        elif init == "acn":
            w = [[1.0 if (j == L + 1 or i == j - 1) else 0.0 for i in s] for j, s in enumerate(sources, start=1)]
        elif init == "uniform":
            w = [[1.0 / len(s)] * len(s) for s in sources]
        elif isinstance(init, numbers.Real) and not isinstance(init, bool):
            w = [[float(init)] * len(s) for s in sources]
        elif isinstance(init, dict):
            c = saved_connectivity(where, init)
            check_against_edges(where, c, sources)
            w = [[c[i][j] for i in s] for j, s in enumerate(sources, start=1)]
        else:
            raise common.OptionError(f"{where}: option 'init' must be residual, acn, uniform, a number, {{from}} "
                                     f"or {{file}}")

        self.normalize = common.as_choice(where, "normalize", opts["normalize"], ("none", "softmax"))
        if self.normalize == "softmax":
            t = 1.0 if opts["temperature"] is None else opts["temperature"]
            self.temperature = common.as_float(where, "temperature", t, positive=True)
            if any(x <= 0 for col in w for x in col):
                raise common.OptionError(f"{where}: softmax needs initial weights > 0")
            values = [[self.temperature * math.log(x) for x in col] for col in w]
        else:
            if opts["temperature"] is not None:
                raise common.OptionError(f"{where}: 'temperature' only with normalize: softmax")
            values = w
        self.learnable = common.as_choice(where, "weights", opts["weights"], ("learnable", "fixed")) == "learnable"
        frozen = common.as_bool(where, "frozen", opts["frozen"])
        if self.learnable:
            params = nn.ParameterList([nn.Parameter(torch.tensor(v)) for v in values])
            common.freeze(params, not frozen)
            if self.normalize == "softmax":
                self.logits = params
            else:
                self.weights = params
        else:
            if frozen:
                raise common.OptionError(f"{where}: frozen needs weights: learnable")
            self.constants = values

    def coefficients(self, j):
        """c_j: node j's weights over S_j, in the stream dtype."""
        if self.learnable:
            p = (self.logits if self.normalize == "softmax" else self.weights)[j - 1]
        else:
            p = common.stream(torch.tensor(self.constants[j - 1], dtype=torch.float64))
        if self.normalize == "softmax":
            p = torch.softmax(p / self.temperature, dim=0)
        return p

    def read(self, h, j):
        c = self.coefficients(j)
        out = None
        for n, i in enumerate(self.sources[j - 1]):
            t = c[n] * h[i]
            out = t if out is None else out + t
        return out

    def forward(self, x0, units):
        common.check_units("graph", units, self.L)
        h = [x0]
        for j, f in enumerate(units, start=1):
            h.append(f(self.read(h, j)))
        return self.read(h, self.L + 1)
