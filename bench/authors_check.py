"""What bench/mudd-vs-authors.py and bench/value-residual-vs-authors.py share: plexus' reference run
of a tiny LLaMA case drawn as a parity case is (parity/run.py), and the parity harness's error
model applied to the authors' tensors (parity/SPEC.md "Tolerance")."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import run  # noqa: E402  (parity/run.py)

U32 = 2.0 ** -24
D, LAYERS, HEADS, HIDDEN, VOCAB, T = 32, 3, 4, 64, 48, 8
HEADER = (f"LLaMA D={D}, {LAYERS} layers, {HEADS} heads, SwiGLU {HIDDEN}, vocab {VOCAB}, T={T}, batch {run.BATCH}; fp32\n"
          "error = max|x − float64| / max(1, max|float64|); bound = 8 × the reference's worst fp32 run + 4·2⁻²⁴\n")


class Reference:
    """The reference on a case `{seed, topology, model options}`: its model (weights redrawn as
    the parity protocol draws them), tokens `x`, cotangent `g`, its fp32 run, its float64 run and
    its sign-randomised fp32 runs."""

    def __init__(self, seed, topology, **model):
        self.case = {"seed": seed, "precision": "fp32", "topology": topology,
                     "model": {"kind": "llama", "vocab_size": VOCAB, "width": D, "depth": LAYERS, "heads": HEADS,
                               "seq_len": T, "hidden": HIDDEN, **model}}
        self.model = run.build_model(self.case)
        torch.manual_seed(seed)
        run.redraw_parameters(self.model)
        self.x = torch.randint(0, VOCAB, self.model.input_shape(run.BATCH), dtype=torch.int64)
        self.g = torch.randn(self.model.output_shape(run.BATCH), dtype=torch.float32)
        self.out, self.loss, self.grads = run.forward_backward(self.model, self.x, self.g)
        self.high = run.high_precision(self.case, self.model, self.x, self.g)
        self.spreads = run.spread(self.model, self.x, self.g, seed)

    def rows(self, logits, loss, their_grads):
        """(name, theirs, ours, float64, our other runs) for the output, the loss and every
        gradient named in `their_grads` (our name → their gradient)."""
        high_out, high_loss, high_grads = self.high
        rows = [("output.y", logits.detach(), self.out, high_out, [r[0] for r in self.spreads]),
                ("output.loss", loss.detach(), self.loss, high_loss, [r[1] for r in self.spreads])]
        for name in sorted(their_grads):
            rows.append((f"grad.{name}", their_grads[name], self.grads[name], high_grads[name],
                         [r[2][name] for r in self.spreads]))
        return rows


def judge(label, rows):
    """Prints one line for a case and returns whether every tensor is within its bound."""
    def rel(a, h):
        return (a.double() - h).abs().max().item() / max(1.0, h.abs().max().item())

    worst, bad = None, []
    for name, a, ref, high, runs in rows:
        e_auth = rel(a.detach(), high)
        e_ref = max(rel(ref.detach(), high), *(rel(r, high) for r in runs))
        bound = 8 * e_ref + 4 * U32
        if worst is None or e_auth / bound > worst[-1]:
            worst = (name, e_auth, e_ref, bound, e_auth / bound)
        if e_auth > bound:
            bad.append(name)
    status = "pass" if not bad else f"FAIL ({', '.join(bad)})"
    print(f"{label:15s} {len(rows):3d} tensors  worst: {worst[0]:42s} authors {worst[1]:.2e}  "
          f"reference {worst[2]:.2e}  bound {worst[3]:.2e}  ratio {worst[4]:.2f}  {status}")
    return not bad
