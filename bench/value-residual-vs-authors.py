"""`model.value_residual: fixed` against the authors' ResFormer (github.com/Zcchill/Value-Residual-Learning,
src/modeling/modeling_llama_resformer.py: `value_states = 0.5*formal_layer_values[0] + 0.5*value_states`),
on the same weights, tokens and cotangent.

Their code is not part of plexus: fetch it into a folder of your own and pass that folder, with
`transformers` 4.44 importable (the version their README pins), e.g.

    git clone https://github.com/Zcchill/Value-Residual-Learning /tmp/VRL
    pip install --target /tmp/authors-deps "transformers==4.44.2"
    PYTHONPATH=/tmp/authors-deps scripts/python.sh bench/value-residual-vs-authors.py /tmp/VRL/src/modeling \\
        > bench/value-residual-vs-authors.txt

As bench/mudd-vs-authors.py: plexus' reference (parity/backbones.py's llama with `value_residual:
fixed`, which `plexus parity` checks the Rust model against, cases parity/cases/*value-residual*)
draws the weights, tokens and cotangent as a parity case does; their `LlamaForCausalLM` (eager
attention, no biases, untied head, RMSNorm eps 1e-6) gets the same weights by name (`model.` added);
each tensor's error against the reference's float64 run is judged by the parity error model. Their
code has the fixed form only; `learnable` at its init is `fixed` bit for bit
(tests/it/backbones.rs).
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import run  # noqa: E402  (parity/run.py)

U32 = 2.0 ** -24
D, LAYERS, HEADS, HIDDEN, VOCAB, T = 32, 3, 4, 64, 48, 8


def main(folder):
    sys.path.insert(0, folder)
    from transformers.models.llama.configuration_llama import LlamaConfig
    import modeling_llama_resformer as vr

    seed = 9200
    print(f"value_residual: fixed against the authors' modeling_llama_resformer.py ({folder})")
    print(f"LLaMA D={D}, {LAYERS} layers, {HEADS} heads, SwiGLU {HIDDEN}, vocab {VOCAB}, T={T}, batch {run.BATCH}; fp32")
    print("error = max|x − float64| / max(1, max|float64|); bound = 8 × the reference's worst fp32 run + 4·2⁻²⁴\n")
    failed = 0
    for k, topo in enumerate([{"kind": "residual"}]):
        case = {"seed": seed + k, "precision": "fp32", "topology": topo,
                "model": {"kind": "llama", "vocab_size": VOCAB, "width": D, "depth": LAYERS, "heads": HEADS,
                          "seq_len": T, "hidden": HIDDEN, "value_residual": "fixed"}}
        model = run.build_model(case)
        torch.manual_seed(case["seed"])
        run.redraw_parameters(model)
        x = torch.randint(0, VOCAB, model.input_shape(run.BATCH), dtype=torch.int64)
        g = torch.randn(model.output_shape(run.BATCH), dtype=torch.float32)
        out, loss, grads = run.forward_backward(model, x, g)
        high_out, high_loss, high_grads = run.high_precision(case, model, x, g)
        spreads = run.spread(model, x, g, case["seed"])
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
                          num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=T,
                          rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
                          tie_word_embeddings=False, attn_implementation="eager")
        theirs = vr.LlamaForCausalLM(cfg)
        ours = dict(model.named_parameters())
        state = {("lm_head.weight" if n == "lm_head.weight" else "model." + n): p.detach().clone() for n, p in ours.items()}
        missing, unexpected = theirs.load_state_dict(state, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        logits = theirs(input_ids=x).logits
        their_loss = (logits.float() * g).sum()
        their_loss.backward()
        tp = dict(theirs.named_parameters())
        rows = [("output.y", logits.detach(), out, high_out, [r[0] for r in spreads]),
                ("output.loss", their_loss.detach(), loss, high_loss, [r[1] for r in spreads])]
        for n in sorted(grads):
            if n == "input":
                continue
            t = tp["lm_head.weight" if n == "lm_head.weight" else "model." + n].grad
            rows.append((f"grad.{n}", t, grads[n], high_grads[n], [r[2][n] for r in spreads]))

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
        failed += bool(bad)
        status = "pass" if not bad else f"FAIL ({', '.join(bad)})"
        print(f"{'residual':12s} {len(rows):3d} tensors  worst: {worst[0]:42s} authors {worst[1]:.2e}  "
              f"reference {worst[2]:.2e}  bound {worst[3]:.2e}  ratio {worst[4]:.2f}  {status}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
