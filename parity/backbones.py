"""Backbones for the parity references (SPEC.md "Backbones").

Each backbone is the root `nn.Module` of the model (parameter names `stem.*`, `units.*` /
`blocks.*`, `norm.*`, `head.*`; the topology is attached as attribute `topology`) and exposes
`embed(x)`, `units` (the sublayer units in order, each callable as `unit(x, norm)`),
`block_size`, `width` and `readout(y)`.
"""

import torch
import torch.nn.functional as F
from torch import nn

import common

PRECISIONS = ("fp32", "bf16")


class Linear(nn.Linear):
    """`torch.nn.Linear`; with `bf16` it computes in bfloat16 from float32 master weights."""

    def __init__(self, in_features, out_features, bias=True, bf16=False):
        super().__init__(in_features, out_features, bias=bias)
        self.bf16 = bf16

    def forward(self, x):
        if not self.bf16:
            return F.linear(x, self.weight, self.bias)
        b = self.bias.bfloat16() if self.bias is not None else None
        return F.linear(x.bfloat16(), self.weight.bfloat16(), b).float()


def layer_norm(dim):
    return nn.LayerNorm(dim, eps=1e-5, elementwise_affine=True, bias=True)


def gelu(x):
    return F.gelu(x, approximate="none")


def pre_norm(norm_module, x, norm):
    """Apply a unit's pre-norm according to the norm mode (None / 0-dim scale / 'off')."""
    common.check_norm(norm)
    if norm is None:
        return norm_module(x)
    if isinstance(norm, str):  # 'off'
        return x
    return norm * norm_module(x)


# ---------------------------------------------------------------------------------------------
# mlp


class MLPUnit(nn.Module):
    def __init__(self, D, H, bf16):
        super().__init__()
        self.norm = layer_norm(D)
        self.fc1 = Linear(D, H, bf16=bf16)
        self.fc2 = Linear(H, D, bf16=bf16)

    def forward(self, x, norm=None):
        return self.fc2(gelu(self.fc1(pre_norm(self.norm, x, norm))))


class MLPBackbone(nn.Module):
    """Pre-norm MLP stack: x [B, input_dim] -> out [B, output_dim]."""

    block_size = 1

    def __init__(self, input_dim, output_dim, width, hidden, depth, bf16=False):
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.width = width
        self.stem = Linear(input_dim, width, bf16=bf16)
        self.units = nn.ModuleList([MLPUnit(width, hidden, bf16) for _ in range(depth)])
        self.norm = layer_norm(width)
        self.head = Linear(width, output_dim, bf16=bf16)

    def input_shape(self, batch):
        return (batch, self.input_dim)

    def output_shape(self, batch):
        return (batch, self.output_dim)

    def embed(self, x):
        return self.stem(x)

    def readout(self, y):
        return self.head(self.norm(y))


# ---------------------------------------------------------------------------------------------
# mixer


class TokenMix(nn.Module):
    def __init__(self, D, T, hidden, bf16):
        super().__init__()
        self.norm = layer_norm(D)
        self.fc1 = Linear(T, hidden, bf16=bf16)
        self.fc2 = Linear(hidden, T, bf16=bf16)

    def forward(self, x, norm=None):
        u = pre_norm(self.norm, x, norm).transpose(1, 2)  # [B, D, T]
        return self.fc2(gelu(self.fc1(u))).transpose(1, 2)


class ChannelMix(nn.Module):
    def __init__(self, D, hidden, bf16):
        super().__init__()
        self.norm = layer_norm(D)
        self.fc1 = Linear(D, hidden, bf16=bf16)
        self.fc2 = Linear(hidden, D, bf16=bf16)

    def forward(self, x, norm=None):
        return self.fc2(gelu(self.fc1(pre_norm(self.norm, x, norm))))


class MixerLayer(nn.Module):
    def __init__(self, D, T, token_hidden, channel_hidden, bf16):
        super().__init__()
        self.token_mix = TokenMix(D, T, token_hidden, bf16)
        self.channel_mix = ChannelMix(D, channel_hidden, bf16)


class MixerBackbone(nn.Module):
    """MLP-Mixer: x [B, C, S, S] -> out [B, num_classes]; 2*depth sublayer units."""

    block_size = 2

    def __init__(self, image_size, channels, patch, width, token_hidden, channel_hidden, depth,
                 num_classes, bf16=False):
        super().__init__()
        if image_size % patch != 0:
            raise common.OptionError(
                f"model 'mixer': image_size {image_size} is not a multiple of patch {patch}"
            )
        self.image_size = image_size
        self.channels = channels
        self.patch = patch
        self.width = width
        self.num_classes = num_classes
        self.tokens = (image_size // patch) ** 2
        self.stem = Linear(channels * patch * patch, width, bf16=bf16)
        self.blocks = nn.ModuleList(
            [MixerLayer(width, self.tokens, token_hidden, channel_hidden, bf16) for _ in range(depth)]
        )
        self.norm = layer_norm(width)
        self.head = Linear(width, num_classes, bf16=bf16)

    @property
    def units(self):
        out = []
        for blk in self.blocks:
            out.append(blk.token_mix)
            out.append(blk.channel_mix)
        return out

    def input_shape(self, batch):
        return (batch, self.channels, self.image_size, self.image_size)

    def output_shape(self, batch):
        return (batch, self.num_classes)

    def embed(self, x):
        B, C, S, p = x.shape[0], self.channels, self.image_size, self.patch
        x = x.reshape(B, C, S // p, p, S // p, p).permute(0, 2, 4, 1, 3, 5)
        x = x.reshape(B, self.tokens, C * p * p)
        return self.stem(x)

    def readout(self, y):
        return self.head(self.norm(y).mean(dim=1))


# ---------------------------------------------------------------------------------------------

MODEL_KEYS = {
    "mlp": ("input_dim", "output_dim", "width", "hidden", "depth"),
    "mixer": ("image_size", "channels", "patch", "width", "token_hidden", "channel_hidden",
              "depth", "num_classes"),
}


def build_backbone(cfg, precision="fp32"):
    if not isinstance(cfg, dict):
        raise common.OptionError(f"'model' must be a mapping, got {cfg!r}")
    common.as_choice("case", "precision", precision, PRECISIONS)
    bf16 = precision == "bf16"
    cfg = dict(cfg)
    kind = cfg.pop("kind", None)
    if kind not in MODEL_KEYS:
        raise common.OptionError(f"model: unknown kind {kind!r}; known: {sorted(MODEL_KEYS)}")
    keys = MODEL_KEYS[kind]
    where = f"model '{kind}'"
    unknown = sorted(set(cfg) - set(keys))
    if unknown:
        raise common.OptionError(f"{where}: unknown option(s) {unknown}; allowed: {list(keys)}")
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise common.OptionError(f"{where}: missing option(s) {missing}")
    args = {k: common.as_int(where, k, cfg[k], minimum=1) for k in keys}
    if kind == "mlp":
        return MLPBackbone(bf16=bf16, **args)
    return MixerBackbone(bf16=bf16, **args)
