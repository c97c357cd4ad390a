"""PyTorch reference of the contrastive-RL critic loss (`plexus::rl::crl::infonce`).

    python parity/crl_infonce.py IN.safetensors OUT.safetensors --loss forward,symmetric --penalty 0,0.1

IN holds `phi` [B, K] = phi(s_i, a_i) and `psi` [B, K] = psi(g_i) (float32 or float64; row i of
each is a positive pair). With logits = phi @ psi.T [B, B], written here with cross-entropy:

    forward   = cross_entropy(logits, arange(B))                       (mean over rows)
    symmetric = cross_entropy(logits, arange(B)) + cross_entropy(logits.T, arange(B))
    loss      = (forward | symmetric) + P * mean_i(logsumexp_j logits_ij ** 2)
    accuracy  = mean_i [argmax_j logits_ij == i]

For each LOSS in --loss and P in --penalty (both comma-separated, P written as given), OUT gets
`LOSS@P.loss` (0-dim), `LOSS@P.accuracy` (0-dim), `LOSS@P.grad.phi`, `LOSS@P.grad.psi`
(d loss / d input), in the inputs' dtype.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def infonce(phi, psi, loss, penalty):
    logits = phi @ psi.T
    labels = torch.arange(logits.shape[0])
    value = F.cross_entropy(logits, labels)
    if loss == "symmetric":
        value = value + F.cross_entropy(logits.T, labels)
    elif loss != "forward":
        raise ValueError(f"unknown loss {loss!r}")
    if penalty > 0:
        value = value + penalty * torch.logsumexp(logits, dim=1).pow(2).mean()
    accuracy = (logits.argmax(dim=1) == labels).to(phi.dtype).mean()
    return value, accuracy


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--loss", default="symmetric", help="comma-separated: forward, symmetric")
    ap.add_argument("--penalty", default="0", help="comma-separated penalty weights P")
    args = ap.parse_args(argv)
    t = load_file(args.inp)
    # Every (loss, P) in one process: importing torch costs more than all of them together.
    out = {}
    for loss in args.loss.split(","):
        for text in args.penalty.split(","):
            penalty = float(text)
            phi = t["phi"].clone().requires_grad_(True)
            psi = t["psi"].clone().requires_grad_(True)
            value, accuracy = infonce(phi, psi, loss, penalty)
            value.backward()
            key = f"{loss}@{text}"
            out[f"{key}.loss"] = value.detach().reshape(()).contiguous()
            out[f"{key}.accuracy"] = accuracy.detach().reshape(()).contiguous()
            out[f"{key}.grad.phi"] = phi.grad.contiguous()
            out[f"{key}.grad.psi"] = psi.grad.contiguous()
    save_file(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
