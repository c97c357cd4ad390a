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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from authors_check import D, HEADS, HEADER, HIDDEN, LAYERS, T, VOCAB, Reference, judge  # noqa: E402


def main(folder):
    sys.path.insert(0, folder)
    from transformers.models.llama.configuration_llama import LlamaConfig
    import modeling_llama_resformer as vr

    print(f"value_residual: fixed against the authors' modeling_llama_resformer.py ({folder})")
    print(HEADER)
    ref = Reference(9200, {"kind": "residual"}, value_residual="fixed")
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=T,
                      rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
                      tie_word_embeddings=False, attn_implementation="eager")
    theirs = vr.LlamaForCausalLM(cfg)

    def theirs_of(name):
        return name if name == "lm_head.weight" else "model." + name

    ours = dict(ref.model.named_parameters())
    missing, unexpected = theirs.load_state_dict({theirs_of(n): p.detach().clone() for n, p in ours.items()},
                                                 strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    logits = theirs(input_ids=ref.x).logits
    their_loss = (logits.float() * ref.g).sum()
    their_loss.backward()
    tp = dict(theirs.named_parameters())
    grads = {n: tp[theirs_of(n)].grad for n in ref.grads if n != "input"}
    failed = not judge("residual", ref.rows(logits, their_loss, grads))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
