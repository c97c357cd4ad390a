"""Backbones for the parity references (SPEC.md "Backbones").

Each backbone is the root `nn.Module` of the model (parameter names `stem.*`, `units.*` /
`blocks.*` / `layers.*`, `norm.*`, `head.*`, …; the topology is attached as attribute `topology`)
and exposes `embed(x)`, `units` (the sublayer units in order, each callable as `unit(x, norm)`),
`block_size`, `width`, `readout(y)`, `input_shape(B)`, `output_shape(B)` and, for language
models, `input_vocab` (inputs are integer tokens in `[0, input_vocab)`).

The Transformer references (vit, gpt, llama) are written from SPEC.md in the style of the
reference code bases (lucidrains' simple ViT, nanoGPT, Hugging Face LLaMA), not from the Rust.
"""

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

import common

# plexus takes a GPU step's fused paths (its CUDA kernels, or their host build under
# PLEXUS_FUSED_KERNELS=cuda-host): RoPE and SwiGLU compute in fp32 and round once (SPEC.md, "Precision").
FUSED = os.environ.get("PLEXUS_PARITY_FUSED") == "1"

PRECISIONS = ("fp32", "bf16")


class Linear(nn.Linear):
    """`torch.nn.Linear`; with `bf16` it computes in bfloat16 from float32 master weights and
    returns bfloat16 (CUDA autocast's rule; SPEC.md "Precision")."""

    def __init__(self, in_features, out_features, bias=True, bf16=False):
        super().__init__(in_features, out_features, bias=bias)
        self.bf16 = bf16

    def forward(self, x):
        if not self.bf16:
            return F.linear(x, self.weight, self.bias)
        b = self.bias.bfloat16() if self.bias is not None else None
        return F.linear(x.bfloat16(), self.weight.bfloat16(), b)


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
        u = pre_norm(self.norm, x, norm)
        if self.fc1.bf16:
            # SPEC.md "mixer": under bf16 each Linear over the token axis is one batched GEMM with
            # the bias inside, rounded once to bf16 (torch's bf16 `F.linear` on the CPU rounds
            # the product and then the bias sum: a valid but different bf16 result).
            return columns(self.fc2, gelu(columns(self.fc1, u)))
        u = u.transpose(1, 2)  # [B, D, T]
        return self.fc2(gelu(self.fc1(u))).transpose(1, 2)


def columns(linear, x):
    """`linear` applied along the middle axis in bf16, returning bf16: x [B, in, N] -> [B, out, N]
    = `baddbmm(b[:, None], W, x)` with W and b broadcast over the batch."""
    B, _, N = x.shape
    W = linear.weight.bfloat16().unsqueeze(0).expand(B, -1, -1)
    b = linear.bias.bfloat16().unsqueeze(-1).expand(B, -1, N)
    return torch.baddbmm(b, W, x.bfloat16())


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


class ImageBackbone(nn.Module):
    """What the image backbones share: inputs [B, C, S, S], outputs [B, num_classes], and the
    patchify of the stem ([B, C, S, S] -> [B, (S/p)^2, C*p*p], patches in row-major order)."""

    def input_shape(self, batch):
        return (batch, self.channels, self.image_size, self.image_size)

    def output_shape(self, batch):
        return (batch, self.num_classes)

    def patches(self, x):
        B, C, p, g = x.shape[0], self.channels, self.patch, self.image_size // self.patch
        return x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)


class MixerBackbone(ImageBackbone):
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

    def embed(self, x):
        return self.stem(self.patches(x))

    def readout(self, y):
        return self.head(self.norm(y).mean(dim=1))


# ---------------------------------------------------------------------------------------------
# Transformer pieces shared by vit, gpt and llama (SPEC.md "Attention", "RoPE")


def sdpa(q, k, v, causal, bf16):
    """q, k, v [B, H, T, hd] -> [B, H, T, hd]: the kernel runs in (and returns) bf16 if asked,
    float32 otherwise (float64 in the high-precision run)."""
    dt = torch.bfloat16 if bf16 else torch.get_default_dtype()
    return F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), is_causal=causal)


def split_heads(t, heads):
    """[B, T, D] -> [B, H, T, D/H]."""
    B, T, D = t.shape
    return t.view(B, T, heads, D // heads).transpose(1, 2)


def merge_heads(t):
    """[B, H, T, hd] -> [B, T, H*hd]."""
    B, H, T, hd = t.shape
    return t.transpose(1, 2).reshape(B, T, H * hd)


def rope_tables(T, head_dim, base=10000.0):
    """cos, sin [T, head_dim] float32 (computed in float64), Hugging Face LLaMA convention."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]; cos, sin [T, hd] in x's dtype. `x·cos + rotate_half(x)·sin` as one addcmul
    (one rounding of the sum in bf16, where `+` of two products rounds three times); with FUSED in
    fp32 and rounded once to x's dtype, as plexus' RoPE kernel."""
    if FUSED:
        xf = x.float()
        return torch.addcmul(xf * cos.float(), rotate_half(xf), sin.float()).to(x.dtype)
    return torch.addcmul(x * cos, rotate_half(x), sin)


def swiglu(g, u):
    """silu(g) · u; with FUSED in fp32 and rounded once to g's dtype, as plexus' SwiGLU kernel."""
    if FUSED:
        return (F.silu(g.float()) * u.float()).to(g.dtype)
    return F.silu(g) * u


def head_linear(x, weight, bf16):
    """x @ weight.T without bias (the tied GPT head), in (and returning) bf16 if asked."""
    if not bf16:
        return F.linear(x, weight)
    return F.linear(x.bfloat16(), weight.bfloat16())


# ---------------------------------------------------------------------------------------------
# vit


def posemb_sincos_2d(h, w, dim, temperature=10000.0):
    """[h*w, dim] float32 (computed in float64): [sin(x*om), cos(x*om), sin(y*om), cos(y*om)]."""
    y, x = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )
    omega = torch.arange(dim // 4, dtype=torch.float64) / (dim // 4 - 1)
    omega = 1.0 / (temperature ** omega)
    y = y.flatten()[:, None] * omega[None, :]
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1).float()


class ViTAttention(nn.Module):
    def __init__(self, D, heads, bf16):
        super().__init__()
        self.heads = heads
        self.bf16 = bf16
        self.norm = layer_norm(D)
        self.qkv = Linear(D, 3 * D, bf16=bf16)
        self.proj = Linear(D, D, bf16=bf16)

    def forward(self, x, norm=None):
        D = x.shape[-1]
        q, k, v = self.qkv(pre_norm(self.norm, x, norm)).split(D, dim=-1)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        return self.proj(merge_heads(sdpa(q, k, v, causal=False, bf16=self.bf16)))


class ViTMlp(nn.Module):
    def __init__(self, D, hidden, bf16):
        super().__init__()
        self.norm = layer_norm(D)
        self.fc1 = Linear(D, hidden, bf16=bf16)
        self.fc2 = Linear(hidden, D, bf16=bf16)

    def forward(self, x, norm=None):
        return self.fc2(gelu(self.fc1(pre_norm(self.norm, x, norm))))


class ViTLayer(nn.Module):
    def __init__(self, D, heads, hidden, bf16):
        super().__init__()
        self.attn = ViTAttention(D, heads, bf16)
        self.mlp = ViTMlp(D, hidden, bf16)


class ViTBackbone(ImageBackbone):
    """Simple ViT (Beyer et al. 2022): x [B, C, S, S] -> out [B, num_classes]; 2*depth units."""

    block_size = 2

    def __init__(self, image_size, channels, patch, width, depth, heads, num_classes, mlp_hidden=None,
                 bf16=False):
        super().__init__()
        where = "model 'vit'"
        if image_size % patch != 0:
            raise common.OptionError(f"{where}: image_size {image_size} is not a multiple of patch {patch}")
        if width % 4 != 0 or width < 8:
            raise common.OptionError(f"{where}: width {width} must be a multiple of 4, at least 8")
        if width % heads != 0:
            raise common.OptionError(f"{where}: heads {heads} does not divide width {width}")
        mlp_hidden = 4 * width if mlp_hidden is None else mlp_hidden
        self.image_size = image_size
        self.channels = channels
        self.patch = patch
        self.width = width
        self.num_classes = num_classes
        self.grid = image_size // patch
        self.stem = Linear(channels * patch * patch, width, bf16=bf16)
        self.blocks = nn.ModuleList([ViTLayer(width, heads, mlp_hidden, bf16) for _ in range(depth)])
        self.norm = layer_norm(width)
        self.head = Linear(width, num_classes, bf16=bf16)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @property
    def units(self):
        out = []
        for blk in self.blocks:
            out.append(blk.attn)
            out.append(blk.mlp)
        return out

    def embed(self, x):
        return self.stem(self.patches(x)) + posemb_sincos_2d(self.grid, self.grid, self.width).to(x.device)

    def readout(self, y):
        return self.head(self.norm(y).mean(dim=1))


# ---------------------------------------------------------------------------------------------
# gpt (nanoGPT with RoPE)


class GPTLayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


VALUE_RESIDUALS = ("none", "fixed", "learnable")


def add_value_lambda(module, mode, layer):
    """`value_residual: learnable`: layer b >= 1's `value_lambda` [2], initialised to (0.5, 0.5)."""
    if mode == "learnable" and layer > 0:
        module.value_lambda = nn.Parameter(torch.full((2,), 0.5))


def mix_values(module, mode, layer, first, v):
    """SPEC "Shared Transformer pieces", value residual: layer 0's values v [B, T, D] are kept in
    `first` (a dict the stack shares, emptied by the stem); a later layer's are mixed with them."""
    if mode == "none":
        return v
    if layer == 0:
        first["v"] = v
        return v
    v0 = first["v"]
    if mode == "fixed":
        return 0.5 * v0 + 0.5 * v
    return module.value_lambda[0] * v0 + module.value_lambda[1] * v


class GPTAttention(nn.Module):
    def __init__(self, D, heads, bias, dropout, bf16, value_residual="none", layer=0, first=None):
        super().__init__()
        self.heads = heads
        self.bf16 = bf16
        self.value_residual, self.layer, self.first = value_residual, layer, first
        add_value_lambda(self, value_residual, layer)
        self.norm = GPTLayerNorm(D, bias)
        self.qkv = Linear(D, 3 * D, bias=bias, bf16=bf16)
        self.proj = Linear(D, D, bias=bias, bf16=bf16)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, norm=None):
        B, T, D = x.shape
        q, k, v = self.qkv(pre_norm(self.norm, x, norm)).split(D, dim=2)
        return self.attend(q, k, v)

    def ports(self, q, k, v):
        """SPEC.md "Ports": q, k, v from the query, key and value ports, each through its own
        norm (`norm`, `key_norm`, `value_norm`; the first layer's `norm` serves all three) and its
        third of `qkv`."""
        D = q.shape[-1]
        norms = (self.norm, getattr(self, "key_norm", self.norm), getattr(self, "value_norm", self.norm))
        W, b = self.qkv.weight, self.qkv.bias

        def third(x, i):
            w = W[i * D:(i + 1) * D]
            bb = b[i * D:(i + 1) * D] if b is not None else None
            if self.bf16:
                return F.linear(x.bfloat16(), w.bfloat16(), bb.bfloat16() if bb is not None else None)
            return F.linear(x, w, bb)

        return self.attend(*(third(n(x), i) for i, (n, x) in enumerate(zip(norms, (q, k, v)))))

    def attend(self, q, k, v):
        T, D = q.shape[1], q.shape[2]
        v = mix_values(self, self.value_residual, self.layer, self.first, v)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        cos, sin = (t.to(q.device, q.dtype) for t in rope_tables(T, D // self.heads))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = merge_heads(sdpa(q, k, v, causal=True, bf16=self.bf16))
        return self.resid_dropout(self.proj(y))


class GPTMlp(nn.Module):
    def __init__(self, D, bias, dropout, bf16):
        super().__init__()
        self.norm = GPTLayerNorm(D, bias)
        self.fc1 = Linear(D, 4 * D, bias=bias, bf16=bf16)
        self.fc2 = Linear(4 * D, D, bias=bias, bf16=bf16)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, norm=None):
        h = F.gelu(self.fc1(pre_norm(self.norm, x, norm)), approximate="tanh")
        return self.dropout(self.fc2(h))


class GPTLayer(nn.Module):
    def __init__(self, D, heads, bias, dropout, bf16, value_residual="none", layer=0, first=None):
        super().__init__()
        self.attn = GPTAttention(D, heads, bias, dropout, bf16, value_residual, layer, first)
        self.mlp = GPTMlp(D, bias, dropout, bf16)


class GPTBackbone(nn.Module):
    """GPT-2 with RoPE and a tied head: tokens [B, T] -> logits [B, T, vocab_size]."""

    block_size = 2

    def __init__(self, vocab_size, width, depth, heads, seq_len, dropout=0.0, bias=True, value_residual="none",
                 bf16=False):
        super().__init__()
        if width % heads != 0 or (width // heads) % 2 != 0:
            raise common.OptionError(f"model 'gpt': heads {heads} must divide width {width} into even heads")
        self.vocab_size = vocab_size
        self.input_vocab = vocab_size  # run.py draws integer tokens in [0, vocab_size)
        self.seq_len = seq_len
        self.width = width
        self.bf16 = bf16
        self.wte = nn.Embedding(vocab_size, width)
        common.as_choice("model 'gpt'", "value_residual", value_residual, VALUE_RESIDUALS)
        self.first_values = {}
        self.blocks = nn.ModuleList([GPTLayer(width, heads, bias, dropout, bf16, value_residual, b, self.first_values)
                                     for b in range(depth)])
        self.norm = GPTLayerNorm(width, bias)

    @property
    def units(self):
        out = []
        for blk in self.blocks:
            out.append(blk.attn)
            out.append(blk.mlp)
        return out

    def input_shape(self, batch):
        return (batch, self.seq_len)

    def output_shape(self, batch):
        return (batch, self.seq_len, self.vocab_size)

    def add_ports(self):
        """The key and value ports' norms of every layer after the first (SPEC.md "Ports")."""
        for blk in self.blocks[1:]:
            blk.attn.key_norm = GPTLayerNorm(self.width, blk.attn.norm.bias is not None)
            blk.attn.value_norm = GPTLayerNorm(self.width, blk.attn.norm.bias is not None)

    def embed(self, idx):
        self.first_values.clear()
        return self.wte(idx)

    def readout(self, y):
        return head_linear(self.norm(y), self.wte.weight, self.bf16)


# ---------------------------------------------------------------------------------------------
# llama (Hugging Face LlamaForCausalLM names, without the `model.` prefix)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class LlamaAttention(nn.Module):
    def __init__(self, D, heads, bf16, value_residual="none", layer=0, first=None):
        super().__init__()
        self.heads = heads
        self.bf16 = bf16
        self.value_residual, self.layer, self.first = value_residual, layer, first
        add_value_lambda(self, value_residual, layer)
        self.q_proj = Linear(D, D, bias=False, bf16=bf16)
        self.k_proj = Linear(D, D, bias=False, bf16=bf16)
        self.v_proj = Linear(D, D, bias=False, bf16=bf16)
        self.o_proj = Linear(D, D, bias=False, bf16=bf16)

    def forward(self, u):
        return self.attend(u, u, u)

    def attend(self, uq, uk, uv):
        T, D = uq.shape[1], uq.shape[2]
        q = split_heads(self.q_proj(uq), self.heads)
        k = split_heads(self.k_proj(uk), self.heads)
        v = split_heads(mix_values(self, self.value_residual, self.layer, self.first, self.v_proj(uv)), self.heads)
        cos, sin = (t.to(q.device, q.dtype) for t in rope_tables(T, D // self.heads))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(merge_heads(sdpa(q, k, v, causal=True, bf16=self.bf16)))


class LlamaMLP(nn.Module):
    def __init__(self, D, hidden, bf16):
        super().__init__()
        self.gate_proj = Linear(D, hidden, bias=False, bf16=bf16)
        self.up_proj = Linear(D, hidden, bias=False, bf16=bf16)
        self.down_proj = Linear(hidden, D, bias=False, bf16=bf16)

    def forward(self, u):
        return self.down_proj(swiglu(self.gate_proj(u), self.up_proj(u)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, D, heads, hidden, bf16, value_residual="none", layer=0, first=None):
        super().__init__()
        self.self_attn = LlamaAttention(D, heads, bf16, value_residual, layer, first)
        self.mlp = LlamaMLP(D, hidden, bf16)
        self.input_layernorm = LlamaRMSNorm(D)
        self.post_attention_layernorm = LlamaRMSNorm(D)


class PreNormUnit:
    """A sublayer unit made of a layer's norm and branch (not a module: the parameters live in the
    decoder layer)."""

    def __init__(self, norm_module, branch, port_norms=None):
        self.norm_module = norm_module
        self.branch = branch
        self.port_norms = port_norms

    def __call__(self, x, norm=None):
        return self.branch(pre_norm(self.norm_module, x, norm))

    def ports(self, q, k, v):
        """SPEC.md "Ports": an attention branch from its query, key and value ports, each through
        its own norm (the layer's norm for the query; `key_layernorm`, `value_layernorm`)."""
        kn, vn = self.port_norms
        return self.branch.attend(self.norm_module(q), kn(k), vn(v))


def llama_default_hidden(width):
    """floor(8*D/3) rounded up to a multiple of 64."""
    return 64 * math.ceil((8 * width // 3) / 64)


class LlamaBackbone(nn.Module):
    """LLaMA: tokens [B, T] -> logits [B, T, vocab_size]; 2*depth units."""

    block_size = 2

    def __init__(self, vocab_size, width, depth, heads, seq_len, hidden=None, value_residual="none", bf16=False):
        super().__init__()
        if width % heads != 0 or (width // heads) % 2 != 0:
            raise common.OptionError(f"model 'llama': heads {heads} must divide width {width} into even heads")
        hidden = llama_default_hidden(width) if hidden is None else hidden
        self.vocab_size = vocab_size
        self.input_vocab = vocab_size
        self.seq_len = seq_len
        self.width = width
        self.embed_tokens = nn.Embedding(vocab_size, width)
        common.as_choice("model 'llama'", "value_residual", value_residual, VALUE_RESIDUALS)
        self.first_values = {}
        self.layers = nn.ModuleList([LlamaDecoderLayer(width, heads, hidden, bf16, value_residual, b, self.first_values)
                                     for b in range(depth)])
        self.norm = LlamaRMSNorm(width)
        self.lm_head = Linear(width, vocab_size, bias=False, bf16=bf16)

    @property
    def units(self):
        out = []
        for layer in self.layers:
            ports = (getattr(layer, "key_layernorm", layer.input_layernorm),
                     getattr(layer, "value_layernorm", layer.input_layernorm))
            out.append(PreNormUnit(layer.input_layernorm, layer.self_attn, ports))
            out.append(PreNormUnit(layer.post_attention_layernorm, layer.mlp))
        return out

    def input_shape(self, batch):
        return (batch, self.seq_len)

    def output_shape(self, batch):
        return (batch, self.seq_len, self.vocab_size)

    def add_ports(self):
        """The key and value ports' norms of every layer after the first (SPEC.md "Ports")."""
        for layer in self.layers[1:]:
            layer.key_layernorm = LlamaRMSNorm(self.width)
            layer.value_layernorm = LlamaRMSNorm(self.width)

    def embed(self, idx):
        self.first_values.clear()
        return self.embed_tokens(idx)

    def readout(self, y):
        return self.lm_head(self.norm(y))



# ---------------------------------------------------------------------------------------------
# dit (Peebles & Xie 2023, written in the style of facebookresearch/DiT models.py)


def dit_timestep_embedding(t, dim, max_period=10000):
    """t [B] float -> [B, dim] float32: [cos(t*f), sin(t*f)], f_i = exp(-ln(max_period) i / (dim/2))."""
    half = dim // 2
    dtype = torch.get_default_dtype()  # float32; float64 in the high-precision run
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=dtype) / half).to(t.device)
    args = t[:, None].to(dtype) * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def dit_pos_embed(grid, dim):
    """MAE get_2d_sincos_pos_embed: [grid*grid, dim] float32 (float64 inside)."""
    def one_d(d, pos):
        omega = torch.arange(d // 2, dtype=torch.float64) / (d / 2.0)
        omega = 1.0 / 10000 ** omega
        out = pos.reshape(-1)[:, None] * omega[None]
        return torch.cat([torch.sin(out), torch.cos(out)], dim=1)
    gh = torch.arange(grid, dtype=torch.float64)
    gw = torch.arange(grid, dtype=torch.float64)
    g = torch.meshgrid(gw, gh, indexing="xy")  # g[0][i][j] = column j, g[1][i][j] = row i
    return torch.cat([one_d(dim // 2, g[0]), one_d(dim // 2, g[1])], dim=1).float()


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTAttention(nn.Module):
    def __init__(self, D, heads, bf16):
        super().__init__()
        self.heads = heads
        self.bf16 = bf16
        self.qkv = Linear(D, 3 * D, bf16=bf16)
        self.proj = Linear(D, D, bf16=bf16)

    def forward(self, x):
        D = x.shape[-1]
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        return self.proj(merge_heads(sdpa(q, k, v, causal=False, bf16=self.bf16)))


class DiTMlp(nn.Module):
    def __init__(self, D, hidden, bf16):
        super().__init__()
        self.fc1 = Linear(D, hidden, bf16=bf16)
        self.fc2 = Linear(hidden, D, bf16=bf16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    def __init__(self, D, heads, hidden, bf16):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.attn = DiTAttention(D, heads, bf16)
        self.norm2 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.mlp = DiTMlp(D, hidden, bf16)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(D, 6 * D, bf16=bf16))


class DiTUnit:
    """One sublayer of a DiT block: gate * f(modulate(norm(x), shift, scale)), the modulation read
    from the backbone's conditioning of the current forward."""

    def __init__(self, backbone, block, which):
        self.backbone, self.block, self.which = backbone, block, which

    def __call__(self, x, norm=None):
        mods = self.block.adaLN_modulation(self.backbone.c).chunk(6, dim=1)
        shift, scale, gate = mods[0:3] if self.which == 0 else mods[3:6]
        norm_module = self.block.norm1 if self.which == 0 else self.block.norm2
        f = self.block.attn if self.which == 0 else self.block.mlp
        return gate.unsqueeze(1) * f(modulate(pre_norm(norm_module, x, norm), shift, scale))


class DiTBackbone(nn.Module):
    """DiT: x [B, C*S*S + 2] (noisy image, t, y) -> eps [B, out_C, S, S]; 2*depth units."""

    block_size = 2

    def __init__(self, image_size, channels, patch, width, depth, heads, num_classes, mlp_hidden=None,
                 learn_sigma=False, bf16=False):
        super().__init__()
        where = "model 'dit'"
        if image_size % patch != 0:
            raise common.OptionError(f"{where}: image_size {image_size} is not a multiple of patch {patch}")
        if width % 4 != 0 or width % heads != 0:
            raise common.OptionError(f"{where}: bad width {width} / heads {heads}")
        mlp_hidden = 4 * width if mlp_hidden is None else mlp_hidden
        self.image_size, self.channels, self.patch, self.width = image_size, channels, patch, width
        self.num_classes = num_classes
        self.out_channels = 2 * channels if learn_sigma else channels
        self.grid = image_size // patch
        self.bf16 = bf16
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Conv2d(channels, width, kernel_size=patch, stride=patch, bias=True)
        self.t_embedder = nn.Module()
        self.t_embedder.mlp = nn.Sequential(Linear(256, width, bf16=bf16), nn.SiLU(), Linear(width, width, bf16=bf16))
        self.y_embedder = nn.Module()
        self.y_embedder.embedding_table = nn.Embedding(num_classes + 1, width)
        self.blocks = nn.ModuleList([DiTBlock(width, heads, mlp_hidden, bf16) for _ in range(depth)])
        self.final_layer = nn.Module()
        self.final_layer.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_layer.linear = Linear(width, patch * patch * self.out_channels, bf16=bf16)
        self.final_layer.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(width, 2 * width, bf16=bf16))
        self.c = None

    @property
    def units(self):
        out = []
        for blk in self.blocks:
            out.append(DiTUnit(self, blk, 0))
            out.append(DiTUnit(self, blk, 1))
        return out

    def input_shape(self, batch):
        return (batch, self.channels * self.image_size ** 2 + 2)

    def output_shape(self, batch):
        return (batch, self.out_channels, self.image_size, self.image_size)

    def make_input(self, batch):
        """Valid inputs: a N(0,1) image, t uniform in [0, 1000), y uniform in [0, num_classes]."""
        img = torch.randn(batch, self.channels * self.image_size ** 2)
        t = torch.randint(0, 1000, (batch, 1)).float()
        y = torch.randint(0, self.num_classes + 1, (batch, 1)).float()
        return torch.cat([img, t, y], dim=1)

    def embed(self, inp):
        B, S, C = inp.shape[0], self.image_size, self.channels
        n = C * S * S
        x = inp[:, :n].reshape(B, C, S, S)
        t = inp[:, n]
        y = inp[:, n + 1].detach().round().long()
        if self.bf16:
            w, b = self.x_embedder.proj.weight.bfloat16(), self.x_embedder.proj.bias.bfloat16()
            h = F.conv2d(x.bfloat16(), w, b, stride=self.patch)  # bf16, as every Linear
        else:
            h = self.x_embedder.proj(x)
        x0 = h.flatten(2).transpose(1, 2) + dit_pos_embed(self.grid, self.width).to(inp.device)
        t_emb = self.t_embedder.mlp(dit_timestep_embedding(t, 256))
        self.c = t_emb + self.y_embedder.embedding_table(y)  # [B, D]
        return x0

    def readout(self, y):
        fl = self.final_layer
        shift, scale = fl.adaLN_modulation(self.c).chunk(2, dim=1)
        x = fl.linear(modulate(fl.norm_final(y), shift, scale))
        B, p, c, g = x.shape[0], self.patch, self.out_channels, self.grid
        x = x.reshape(B, g, g, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(B, c, g * p, g * p)

# ---------------------------------------------------------------------------------------------

# kind -> (required integer options, {optional option: (default, parser)})
MODELS = {
    "mlp": (("input_dim", "output_dim", "width", "hidden", "depth"), {}),
    "mixer": (("image_size", "channels", "patch", "width", "token_hidden", "channel_hidden",
               "depth", "num_classes"), {}),
    "vit": (("image_size", "channels", "patch", "width", "depth", "heads", "num_classes"),
            {"mlp_hidden": (None, "int")}),
    "gpt": (("vocab_size", "width", "depth", "heads", "seq_len"),
            {"dropout": (0.0, "prob"), "bias": (True, "bool"), "value_residual": ("none", "str")}),
    "llama": (("vocab_size", "width", "depth", "heads", "seq_len"),
              {"hidden": (None, "int"), "value_residual": ("none", "str")}),
    "dit": (("image_size", "channels", "patch", "width", "depth", "heads", "num_classes"),
            {"mlp_hidden": (None, "int"), "learn_sigma": (False, "bool")}),
}
BUILDERS = {
    "mlp": MLPBackbone,
    "mixer": MixerBackbone,
    "vit": ViTBackbone,
    "gpt": GPTBackbone,
    "llama": LlamaBackbone,
    "dit": DiTBackbone,
}


def build_backbone(cfg, precision="fp32"):
    if not isinstance(cfg, dict):
        raise common.OptionError(f"'model' must be a mapping, got {cfg!r}")
    common.as_choice("case", "precision", precision, PRECISIONS)
    bf16 = precision == "bf16"
    cfg = dict(cfg)
    kind = cfg.pop("kind", None)
    if kind not in MODELS:
        raise common.OptionError(f"model: unknown kind {kind!r}; known: {sorted(MODELS)}")
    required, optional = MODELS[kind]
    where = f"model '{kind}'"
    unknown = sorted(set(cfg) - set(required) - set(optional))
    if unknown:
        raise common.OptionError(
            f"{where}: unknown option(s) {unknown}; allowed: {list(required) + list(optional)}"
        )
    missing = [k for k in required if k not in cfg]
    if missing:
        raise common.OptionError(f"{where}: missing option(s) {missing}")
    args = {k: common.as_int(where, k, cfg[k], minimum=1) for k in required}
    for k, (default, parser) in optional.items():
        if k not in cfg:
            continue
        if parser == "int":
            args[k] = common.as_int(where, k, cfg[k], minimum=1)
        elif parser == "bool":
            args[k] = common.as_bool(where, k, cfg[k])
        elif parser == "str":
            args[k] = cfg[k]  # the builder checks the choice
        else:
            p = common.as_float(where, k, cfg[k], nonnegative=True)
            if p >= 1.0:
                raise common.OptionError(f"{where}: option '{k}' must be < 1, got {p}")
            args[k] = p
    model = BUILDERS[kind](bf16=bf16, **args)
    model.bf16 = bf16
    return model
