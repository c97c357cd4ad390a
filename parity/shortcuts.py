"""shortcuts: s_0 = x0, s_j = f_j(s_{j-1}) + sum_{(i,j) in edges} s_i, y = s_L. No parameters.

Option `edges`: list of "i:j" strings (0 <= i < j <= L); default none (= plain)."""

from torch import nn

import common


def parse_edge(where, e, L):
    if isinstance(e, str):
        parts = e.split(":")
        if len(parts) != 2:
            raise common.OptionError(f"{where}: edge {e!r} is not of the form 'i:j'")
        try:
            i, j = int(parts[0]), int(parts[1])
        except ValueError:
            raise common.OptionError(f"{where}: edge {e!r} is not of the form 'i:j'") from None
    elif isinstance(e, (list, tuple)) and len(e) == 2:
        i = common.as_int(where, "edges", e[0])
        j = common.as_int(where, "edges", e[1])
    else:
        raise common.OptionError(f"{where}: edge {e!r} is not of the form 'i:j'")
    if not (0 <= i < j <= L):
        raise common.OptionError(f"{where}: edge {e!r} needs 0 <= i < j <= L = {L}")
    return i, j


class Topology(nn.Module):
    def __init__(self, options, L, D, block_size):
        super().__init__()
        where = "topology 'shortcuts'"
        opts = common.take_options(where, options, {"edges": []})
        edges = opts["edges"] if opts["edges"] is not None else []
        if not isinstance(edges, (list, tuple)):
            raise common.OptionError(f"{where}: option 'edges' must be a list of 'i:j'")
        self.edges = [parse_edge(where, e, L) for e in edges]
        self.L = L

    def forward(self, x0, units):
        common.check_units("shortcuts", units, self.L)
        s = [x0]
        for j, f in enumerate(units, start=1):
            z = f(s[j - 1])
            for i, jj in self.edges:
                if jj == j:
                    z = z + s[i]
            s.append(z)
        return s[self.L]
