"""PyTorch reference of the contrastive-RL critic loss (`plexus::rl::crl::infonce`).

    python parity/crl_infonce.py IN.safetensors OUT.safetensors --loss forward|symmetric --penalty P

IN holds `phi` [B, K] = phi(s_i, a_i) and `psi` [B, K] = psi(g_i) (float32 or float64; row i of
each is a positive pair). With logits = phi @ psi.T [B, B], written here with cross-entropy:

    forward   = cross_entropy(logits, arange(B))                       (mean over rows)
    symmetric = cross_entropy(logits, arange(B)) + cross_entropy(logits.T, arange(B))
    loss      = (forward | symmetric) + P * mean_i(logsumexp_j logits_ij ** 2)
    accuracy  = mean_i [argmax_j logits_ij == i]

OUT gets `loss` (0-dim), `accuracy` (0-dim), `grad.phi`, `grad.psi` (d loss / d input), in the
inputs' dtype.
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
    ap.add_argument("--loss", default="symmetric")
    ap.add_argument("--penalty", type=float, default=0.0)
    args = ap.parse_args(argv)
    t = load_file(args.inp)
    phi = t["phi"].clone().requires_grad_(True)
    psi = t["psi"].clone().requires_grad_(True)
    value, accuracy = infonce(phi, psi, args.loss, args.penalty)
    value.backward()
    save_file(
        {
            "loss": value.detach().reshape(()).contiguous(),
            "accuracy": accuracy.detach().reshape(()).contiguous(),
            "grad.phi": phi.grad.contiguous(),
            "grad.psi": psi.grad.contiguous(),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
