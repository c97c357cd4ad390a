"""`mudd` against the authors' PyTorch MUDDFormer (github.com/Caiyun-AI/MUDDFormer,
pytorch/muddformer/modeling_muddformer.py), on the same weights, tokens and cotangent.

Their code is not part of plexus: fetch it into a folder of your own and pass that folder, with
`transformers` and `einops` importable (the authors' imports), e.g.

    git clone https://github.com/Caiyun-AI/MUDDFormer /tmp/MUDDFormer
    pip install --target /tmp/authors-deps "transformers==4.44.2" einops
    PYTHONPATH=/tmp/authors-deps scripts/python.sh bench/mudd-vs-authors.py /tmp/MUDDFormer/pytorch/muddformer \
        > bench/mudd-vs-authors.txt

What is compared: plexus' reference (parity/mudd.py on parity/backbones.py's llama, which
`plexus parity` checks the Rust model against: cases parity/cases/llama-mudd*) draws the weights,
tokens and cotangent as a parity case does (parity/run.py); their model gets the same weights by
name; both compute the logits, the loss `sum(logits · g)` and every gradient. Each tensor's error
is measured against the reference's float64 run and judged by the parity harness's error model
(parity/SPEC.md "Tolerance"): at most 8 × the worst of the reference's own float32 runs plus 4
units of roundoff, relative to max(1, max |float64|).

Their model is configured as plexus' llama: `use_qk_norm: false`, `sepln` with `qkvr` (a norm per
port; with `l` their block has its one norm only without it), `round64` and
`expand_last` on (the generator sizes of the released checkpoints, and of plexus), `norm_eps`
1e-6, no GQA. Three adaptations, each to a part their released code fixes and plexus' LLaMA
does not share, none to the MUDD connections:
- FeedForward: their hidden size grows with depth (`scale_with_layer`); built with their own class
  at a constant size (`scale_with_layer=False, round128=False`), as LLaMA's.
- RoPE: their table is cast to bf16 (`precompute_freqs_cis`); recomputed by their formula in fp32.
- `dense_type: l`: their layer mix returns a one-element tuple that their block does not unwrap;
  unwrapped. (Their `l` attention is one `wqkv`; its gradient is compared by thirds.) `dynamic: false`: their forward mixes only when `dynamic_dense` is on, so static
  MUDD is their dynamic one with `w2 = 0` (the dynamic part is then 0, as plexus' static form);
  the generators' gradients are not compared there (plexus has none).
"""

import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from authors_check import D, HEADS, HEADER, HIDDEN, LAYERS, T, VOCAB, Reference, judge, run  # noqa: E402

CASES = [
    ("qkvr, dynamic", {"kind": "mudd"}),
    ("qkvr, static", {"kind": "mudd", "dynamic": False}),
    ("l, dynamic", {"kind": "mudd", "ways": "l"}),
    ("l, static", {"kind": "mudd", "ways": "l", "dynamic": False}),
]


def authors_model(folder, ways, n_layers):
    sys.path.insert(0, folder)
    import configuration_muddformer as cm
    import modeling_muddformer as mm

    cfg = cm.MUDDFormerConfig(
        block_size=T, vocab_size=VOCAB, n_layer=n_layers, n_head=HEADS, dim=D, intermediate_size=HIDDEN,
        n_local_heads=HEADS, head_dim=D // HEADS, rope_base=10000, norm_eps=1e-6, use_qk_norm=False,
        dense=True, dynamic_dense=True, sepln=ways == "qkvr", dense_type=ways, expand_last=True, round64=True,
        is_training=True, use_layer_cache=False, stack_hidden=False,
    )
    m = mm.MUDDFormer(cfg)
    for lidx, layer in enumerate(m.layers):
        layer.feed_forward = mm.FeedForward(cfg, lidx, round128=False, scale_with_layer=False)
    if ways == "l":
        for blk in m.dynamic_dense:
            mix = blk.layer_mix
            blk.layer_mix = types.MethodType(lambda self, h, dw, mix=mix: mix(h, dw)[0], blk)
    m.setup_caches(max_batch_size=run.BATCH, max_seq_length=T)
    # Their RoPE table in fp32 (their formula, without the final bf16 cast).
    hd = D // HEADS
    freqs = 1.0 / (10000 ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    freqs = torch.outer(torch.arange(T), freqs)
    cis = torch.polar(torch.ones_like(freqs), freqs)
    m.freqs_cis = torch.stack([cis.real, cis.imag], dim=-1)
    return m


def names(ways):
    """Our parameter name → theirs."""
    table = {
        "embed_tokens.weight": "tok_embeddings.weight",
        "norm.weight": "norm.weight",
        "lm_head.weight": "output.weight",
    }
    for b in range(LAYERS):
        p, q = f"layers.{b}.", f"layers.{b}."
        if ways == "qkvr" and b > 0:
            table[p + "input_layernorm.weight"] = q + "attention_norms.0.weight"
            table[p + "key_layernorm.weight"] = q + "attention_norms.1.weight"
            table[p + "value_layernorm.weight"] = q + "attention_norms.2.weight"
        else:
            table[p + "input_layernorm.weight"] = q + "attention_norm.weight"
        for a, t in (("q", "wq"), ("k", "wk"), ("v", "wv"), ("o", "wo")):
            table[p + f"self_attn.{a}_proj.weight"] = q + f"attention.{t}.weight"
        table[p + "post_attention_layernorm.weight"] = q + "ffn_norm.weight"
        table[p + "mlp.gate_proj.weight"] = q + "feed_forward.w1.weight"
        table[p + "mlp.up_proj.weight"] = q + "feed_forward.w3.weight"
        table[p + "mlp.down_proj.weight"] = q + "feed_forward.w2.weight"
        i = b + 1
        table[f"topology.dense.{i}"] = f"dense_bs.{b}"
        table[f"topology.dynamic.{i}.w1.weight"] = f"dynamic_dense.{b}.w1.weight"
        table[f"topology.dynamic.{i}.w2.weight"] = f"dynamic_dense.{b}.w2.weight"
    return table


def main(folder):
    seed = 9100
    print(f"mudd against the authors' modeling_muddformer.py ({folder})")
    print(HEADER)
    failed = 0
    for k, (label, topo) in enumerate(CASES):
        ways = topo.get("ways", "qkvr")
        ref = Reference(seed + k, topo)
        theirs = authors_model(folder, ways, LAYERS)
        table = names(ways)
        ours = dict(ref.model.named_parameters())
        static = topo.get("dynamic", True) is False
        state = {}
        for ours_name, their_name in table.items():
            if ours_name in ours:
                state[their_name] = ours[ours_name].detach().clone()
            elif static and ours_name.startswith("topology.dynamic."):
                like = dict(theirs.named_parameters())[their_name]
                state[their_name] = torch.zeros_like(like)  # w2 = 0: the dynamic part is 0
                if ".w1." in ours_name:
                    state[their_name] = torch.randn_like(like)  # any w1: multiplied by w2 = 0
        missing, unexpected = theirs.load_state_dict(state, strict=False)
        missing = [m for m in missing if "kv_cache" not in m and "layer_cache" not in m]
        assert not missing and not unexpected, (missing, unexpected)
        logits = theirs(ref.x, return_tensor=True)
        their_loss = (logits.float() * ref.g).sum()
        their_loss.backward()
        their_params = dict(theirs.named_parameters())
        grads = {}
        for ours_name in ref.grads:
            if ours_name not in table:
                continue
            their_name = table[ours_name]
            if their_name in their_params:
                grads[ours_name] = their_params[their_name].grad
            else:  # `l`: their q, k, v are one `wqkv` (their load hook stacks wq, wk, wv)
                third = "qkv".index(their_name.split(".")[-2][1])
                fused = their_params[their_name.rsplit(".", 2)[0] + ".wqkv.weight"].grad
                grads[ours_name] = fused[third * D:(third + 1) * D]
        failed += not judge(label, ref.rows(logits, their_loss, grads))
    print(f"\n{len(CASES) - failed} of {len(CASES)} cases within the error model")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
