"""PyTorch reference of the learned-variance DiT loss (`plexus::diffusion::Diffusion::loss` with
`learn_sigma`): the ε-MSE plus the variational-bound term of Improved DDPM, written from the
formulas (linear β from 1e-4 to 0.02, T = 1000; tables in float64, indexed, then float32).

    python parity/dit_vb.py IN.safetensors OUT.safetensors

IN holds `output` [B, 2C, S, S] (ε̂, then v), `eps`, `x0`, `x_t` [B, C, S, S] and `t` [B] int64.
OUT gets `loss` (0-dim), `vb` [B] (bits per dimension) and `grad.output` (d loss / d output).

    frac       = (v + 1) / 2
    log σ²     = frac · log β_t + (1 − frac) · log β̃_t        (β̃_0 replaced by β̃_1)
    x̂0         = x_t / √ᾱ_t − √(1/ᾱ_t − 1) · ε̂               (ε̂ detached)
    μ(x0)      = β_t √ᾱ_{t−1} / (1 − ᾱ_t) · x0 + (1 − ᾱ_{t−1}) √α_t / (1 − ᾱ_t) · x_t
    vb         = mean KL(N(μ(x0), β̃_t) ‖ N(μ(x̂0), σ²)) / ln 2            for t > 0
               = −mean log P_disc(x0 | μ(x̂0), σ) / ln 2                   for t = 0
    loss       = mean (ε̂ − ε)² + mean_b vb
"""

import math
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

T = 1000


def tables():
    beta = np.linspace(1e-4, 0.02, T, dtype=np.float64)
    ab = np.cumprod(1.0 - beta)
    ab_prev = np.append(1.0, ab[:-1])
    post_var = beta * (1.0 - ab_prev) / (1.0 - ab)
    return {
        "log_beta": np.log(beta),
        "log_post_var": np.log(np.append(post_var[1], post_var[1:])),
        "c0": beta * np.sqrt(ab_prev) / (1.0 - ab),
        "ct": (1.0 - ab_prev) * np.sqrt(1.0 - beta) / (1.0 - ab),
        "recip": np.sqrt(1.0 / ab),
        "recipm1": np.sqrt(1.0 / ab - 1.0),
    }


def take(arr, t):
    return torch.from_numpy(arr)[t].float().view(-1, 1, 1, 1)


def cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def log_disc(x, mean, log_scale):
    c = x - mean
    inv = torch.exp(-log_scale)
    plus, minus = cdf(inv * (c + 1.0 / 255)), cdf(inv * (c - 1.0 / 255))
    lo = torch.log(plus.clamp(min=1e-12))
    hi = torch.log((1.0 - minus).clamp(min=1e-12))
    mid = torch.log((plus - minus).clamp(min=1e-12))
    return torch.where(x < -0.999, lo, torch.where(x > 0.999, hi, mid))


def vb_bits(eps_hat, v, x0, x_t, t):
    k = tables()
    mu = lambda x: take(k["c0"], t) * x + take(k["ct"], t) * x_t
    true_logvar = take(k["log_post_var"], t)
    frac = (v + 1.0) / 2.0
    logvar = frac * take(k["log_beta"], t) + (1.0 - frac) * take(k["log_post_var"], t)
    mean = mu(take(k["recip"], t) * x_t - take(k["recipm1"], t) * eps_hat)
    kl = 0.5 * (-1.0 + logvar - true_logvar + torch.exp(true_logvar - logvar)
                + (mu(x0) - mean) ** 2 * torch.exp(-logvar))
    kl = kl.flatten(1).mean(1) / math.log(2.0)
    nll = -log_disc(x0, mean, 0.5 * logvar).flatten(1).mean(1) / math.log(2.0)
    return torch.where(t == 0, nll, kl)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    d = load_file(argv[0])
    out = d["output"].float().clone().requires_grad_(True)
    c = d["eps"].shape[1]
    eps_hat, v = out[:, :c], out[:, c:]
    vb = vb_bits(eps_hat.detach(), v, d["x0"].float(), d["x_t"].float(), d["t"])
    loss = ((eps_hat - d["eps"].float()) ** 2).mean() + vb.mean()
    loss.backward()
    save_file({"loss": loss.detach().reshape(()), "vb": vb.detach().contiguous(),
               "grad.output": out.grad.contiguous()}, argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
