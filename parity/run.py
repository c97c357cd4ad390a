"""PyTorch side of `plexus parity` (protocol: SPEC.md).

    python parity/run.py CASE.yaml OUT.safetensors
    python parity/run.py --out-dir DIR CASE.yaml ...   # several cases, one process
    python parity/run.py --draw K --out-dir DIR CASE.yaml ...   # draw K: other weights and inputs
    python parity/run.py --reuse --out-dir DIR CASE.yaml ...   # skip what DIR already holds (same key)
    python parity/run.py --count CASE.yaml        # prints the total number of parameters
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import backbones  # noqa: E402
import common  # noqa: E402

BATCH = 3
# Parameter names redrawn as norm gains, 1 + 0.1·N(0,1) (LayerNorm `norm.weight`; LLaMA's RMSNorms
# `input_layernorm.weight`, `post_attention_layernorm.weight`, `norm.weight`).
NORM_GAINS = ("norm.weight", "layernorm.weight")
# Draw K ≥ 1 (`--draw K`, `plexus parity --draws N`) seeds the case with `seed + DRAW_STRIDE·K`:
# other weights, input and cotangent for the same model, never the seed of a case's own draw 0.
DRAW_STRIDE = 1_000_003
# Runs of the reference with sign-randomised rounding errors (SPEC.md "Tolerance"), per case.
SPREAD_RUNS = 4
COINS = 1 << 16  # the random signs one such run draws from (SignRandomisedRounding.coins)


def load_case(path):
    with open(path) as fh:
        case = yaml.safe_load(fh)
    if not isinstance(case, dict):
        raise common.OptionError(f"{path}: not a mapping")
    return case


def build_model(case):
    precision = case.get("precision", "fp32")
    if "model" not in case:
        raise common.OptionError("case has no 'model' section")
    model = backbones.build_backbone(case["model"], precision)
    model.topology = common.build_topology(case.get("topology"), model)
    return model


def forward(model, x):
    """The model's output, float32. Under bf16 the stem's output, every unit's output and the
    readout are cast to float32 (SPEC.md "Precision"): the stream and the topology stay float32.
    In the high-precision run everything is float64 (`common.stream`)."""
    x0 = common.stream(model.embed(x))
    units, _ = common.make_units(model, model.topology.granularity)
    y = model.topology(x0, units)
    return common.stream(model.readout(y))


def regularizer(model):
    fn = getattr(model.topology, "regularizer", None)
    return fn() if fn is not None else None


def redraw_parameters(model):
    """Overwrite every parameter, in sorted state_dict key order, per the protocol."""
    params = dict(model.named_parameters(remove_duplicate=False))
    keys = sorted(model.state_dict().keys())
    if set(keys) != set(params):
        raise RuntimeError("state_dict holds something other than the parameters")
    with torch.no_grad():
        for name in keys:
            p = params[name]
            noise = torch.randn(p.shape, dtype=torch.float32)
            if name.endswith(NORM_GAINS):
                value = 1.0 + 0.1 * noise
            else:
                scale = 1.0 / math.sqrt(p.shape[-1]) if p.dim() >= 2 else 0.5
                value = noise * scale
            p.copy_(value)
    return keys


def forward_backward(model, x, g):
    """Output, loss and gradients (parameters by name, and the input's where it is a float)."""
    if x.is_floating_point():
        x.requires_grad_(True)
    out = forward(model, x)
    if tuple(out.shape) != tuple(g.shape):
        raise RuntimeError(f"output shape {tuple(out.shape)} != {tuple(g.shape)}")
    loss = (out * g).sum()
    reg = regularizer(model)
    if reg is not None:
        loss = loss + reg
    loss.backward()
    params = dict(model.named_parameters(remove_duplicate=False))
    grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params.items()}
    if x.is_floating_point():
        grads["input"] = x.grad
    return out, loss, grads


_aten = torch.ops.aten
# Operators whose float32 results are exact (copies, layout, sign, selections, fills): their error
# against float64 is zero, so `SignRandomisedRounding` passes them by without the float64 run.
# `_to_copy` also casts the float64 tables (RoPE, position embeddings) to float32 once: constants,
# the same numbers on both sides.
EXACT = {
    _aten.neg.default, _aten.abs.default, _aten.clone.default, _aten._to_copy.default, _aten.cat.default,
    _aten.stack.default, _aten.select_backward.default, _aten.slice_backward.default, _aten.zeros_like.default,
    _aten.ones_like.default, _aten.zeros.default, _aten.ones.default, _aten.full.default, _aten.full_like.default,
    _aten.empty.memory_format, _aten.empty_like.default, _aten.new_empty_strided.default, _aten.new_zeros.default,
    _aten.new_ones.default, _aten.new_empty.default, _aten.embedding.default, _aten.index_select.default,
    _aten.index.Tensor, _aten.gather.default, _aten.masked_fill.Scalar, _aten.masked_fill.Tensor, _aten.where.self,
    _aten.constant_pad_nd.default, _aten.repeat.default, _aten._unsafe_view.default, _aten.arange.default,
    _aten.arange.start, _aten.arange.start_step, _aten.tril.default, _aten.triu.default, _aten.relu.default,
    _aten.threshold_backward.default, _aten.lift_fresh_copy.default, _aten.scalar_tensor.default,
}


class SignRandomisedRounding(TorchDispatchMode):
    """Another valid float32 computation of the same function (SPEC.md "Tolerance"): every
    operator that returns a new float32 tensor runs as usual, then once more in float64 on the
    same (float32) inputs; each element's rounding error, err = result − float64 result, is kept
    or reflected (the float64 result − err) with probability ½, independently. So each operator
    errs by as much as float32 made it err — a sum's error included, whatever its length — in a
    random direction, as another summation order or another rounding would; results that are
    exact (copies, embeddings, negations, masks) stay exact. Views and in-place operators are left
    as they are, and so are bf16 results: both sides round to bf16 at the same places."""

    def __init__(self, seed, device):
        super().__init__()
        self.generator = generator = torch.Generator().manual_seed(seed)
        # Independent fair coins, 0 (keep) or 2 (reflect: r − 2·err = float64 result − err), read
        # from a random offset for each result (drawing them per operator costs more than the rest).
        self.coins_buf = torch.randint(0, 2, (COINS,), generator=generator, dtype=torch.float64).mul_(2.0).to(device)
        self.offsets = random.Random(seed)
        self.passed = set()  # operators seen to return views or write into an argument

    def coins(self, r):
        n = r.numel()
        if n > COINS // 2:
            return torch.randint(0, 2, r.shape, generator=self.generator, dtype=torch.float64).mul_(2.0).to(r.device)
        start = self.offsets.randrange(COINS - n)
        return self.coins_buf[start:start + n].view(r.shape).to(r.device)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in EXACT or func in self.passed:
            return out
        if any(r.alias_info is not None for r in func._schema.returns):
            self.passed.add(func)  # a view, or an operator that writes into one of its arguments
            return out
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        if not any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() > 0 for t in results):
            return out
        try:
            exact = func(*[_to64(a) for a in args], **{k: _to64(v) for k, v in kwargs.items()})
        except (RuntimeError, TypeError):
            return out  # no float64 version of it (mixed dtypes): left as float32 made it
        exact = list(exact) if isinstance(exact, (tuple, list)) else [exact]
        if len(exact) != len(results):
            return out
        inputs = [t for a in [*args, *kwargs.values()] for t in (a if isinstance(a, (tuple, list)) else [a])]
        storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel() > 0}
        with torch.no_grad():
            for r, e in zip(results, exact):
                if (not isinstance(r, torch.Tensor) or r.dtype != torch.float32 or r.numel() == 0
                        or not isinstance(e, torch.Tensor) or e.shape != r.shape
                        or r.untyped_storage().data_ptr() in storages):
                    continue
                r64 = r.double()
                err = torch.nan_to_num_(r64 - e, nan=0.0, posinf=0.0, neginf=0.0)
                r.copy_(r64.sub_(err.mul_(self.coins(r))))
        return out


def _to64(a):
    """A float32 tensor (or a list of them) in float64; anything else as it is."""
    if isinstance(a, torch.Tensor):
        return a.double() if a.dtype == torch.float32 else a
    if isinstance(a, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in a):
        return type(a)(_to64(t) for t in a)
    return a


def spread(model, x, g, seed):
    """`SPREAD_RUNS` more runs of the reference at the case's precision, each under
    `SignRandomisedRounding` (its coins seeded from the case's seed and the run): a list of
    (output, loss, gradients by name), one per run."""
    runs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # any thread count is a valid order; one is the fastest on small tensors
    try:
        for k in range(SPREAD_RUNS):
            model.zero_grad(set_to_none=True)
            with SignRandomisedRounding(seed * SPREAD_RUNS + k, x.device):
                out, loss, grads = forward_backward(model, x.detach().clone(), g)
            runs.append((out.detach(), loss.detach(), {n: t.detach() for n, t in grads.items()}))
    finally:
        torch.set_num_threads(threads)
    return runs


def furthest(samples, high):
    """The sample furthest from the float64 result (max |sample − high|), as float32: the
    reference's worst error over its runs, measured in Rust like every other (src/parity.rs)."""
    dist = [(s.double().cpu() - high).abs().max().item() for s in samples]
    return samples[max(range(len(samples)), key=lambda i: dist[i])].detach().to(torch.float32).cpu().contiguous()


def high_precision(case, model, x, g):
    """The case once more in float64, from the same parameters, input and cotangent: the model
    built at `precision: fp32` (no bf16 cast anywhere), every parameter, the input, the stream and
    the output in float64. What plexus and the reference are both measured against (SPEC.md
    "Tolerance"). Returns (output, loss, gradients) as float64 on the CPU."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        high = build_model({**case, "precision": "fp32"})
        missing, unexpected = high.load_state_dict(model.state_dict(), strict=True)
        assert not missing and not unexpected
        high.double().to(x.device)
        xh = x.detach().clone()
        xh = xh.double() if xh.is_floating_point() else xh
        out, loss, grads = forward_backward(high, xh, g.detach().double())
    finally:
        torch.set_default_dtype(previous)

    def f64(t):
        return t.detach().to(torch.float64).cpu().contiguous().clone()

    return f64(out), f64(loss).reshape(()), {n: f64(t) for n, t in grads.items()}


def run(case_path, out_path, draw=0):
    case = load_case(case_path)
    seed = case.get("seed", 0)
    seed = common.as_int("case", "seed", seed, minimum=0) + DRAW_STRIDE * draw
    model = build_model(case)

    torch.manual_seed(seed)
    keys = redraw_parameters(model)  # drawn on the CPU: the same numbers whatever the device
    vocab = getattr(model, "input_vocab", None)
    if hasattr(model, "make_input"):  # structured inputs (dit: image, timestep, label)
        x = model.make_input(BATCH)
    elif vocab is not None:  # language models: integer tokens, uniform in [0, vocab)
        x = torch.randint(0, vocab, model.input_shape(BATCH), dtype=torch.int64)
    else:
        x = torch.randn(model.input_shape(BATCH), dtype=torch.float32)
    g = torch.randn(model.output_shape(BATCH), dtype=torch.float32)
    # `--device cuda` (plexus parity --device cuda): run the reference there, from the same draws.
    device = torch.device(os.environ.get("PLEXUS_PARITY_DEVICE", "cpu"))
    model.to(device)
    x, g = x.to(device), g.to(device)
    out, loss, grads = forward_backward(model, x, g)
    out, loss = out.detach(), loss.detach()
    grads = {n: t.detach().clone() for n, t in grads.items()}
    high_out, high_loss, high_grads = high_precision(case, model, x, g)
    runs = spread(model, x, g, seed)

    def f32(t):
        return t.detach().to(torch.float32).cpu().contiguous().clone()

    params = dict(model.named_parameters(remove_duplicate=False))
    tensors = {}
    for name in keys:
        tensors[f"param.{name}"] = f32(params[name])
        tensors[f"grad.{name}"] = f32(grads[name])
        tensors[f"high.grad.{name}"] = high_grads[name]
        tensors[f"spread.grad.{name}"] = furthest([r[2][name] for r in runs], high_grads[name])
    tensors["input.x"] = f32(x) if x.is_floating_point() else x.cpu().contiguous().clone()
    tensors["input.g"] = f32(g)
    tensors["output.y"] = f32(out)
    tensors["output.loss"] = f32(loss).reshape(())
    tensors["high.output.y"] = high_out
    tensors["high.output.loss"] = high_loss
    tensors["spread.output.y"] = furthest([r[0] for r in runs], high_out)
    tensors["spread.output.loss"] = furthest([r[1] for r in runs], high_loss).reshape(())
    if x.is_floating_point():  # no gradient for integer tokens
        tensors["grad.input"] = f32(grads["input"])
        tensors["high.grad.input"] = high_grads["input"]
        tensors["spread.grad.input"] = furthest([r[2]["input"] for r in runs], high_grads["input"])
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    save_file(tensors, out_path)


def device_check(case_path):
    """Forward and backward of the reference on PyTorch's `meta` device: no numbers, but any tensor
    a reference makes on the CPU inside forward (a table, a mask) meets the model's meta tensors
    and raises, as it would on a GPU. Lets `parity --device cuda` bugs be caught on a CPU machine."""
    case = load_case(case_path)
    model = build_model(case)
    vocab = getattr(model, "input_vocab", None)
    meta = torch.device("meta")
    model.to(meta)
    if hasattr(model, "make_input"):
        x = model.make_input(BATCH).to(meta).requires_grad_(True)
    elif vocab is not None:
        x = torch.zeros(model.input_shape(BATCH), dtype=torch.int64, device=meta)
    else:
        x = torch.zeros(model.input_shape(BATCH), dtype=torch.float32, device=meta, requires_grad=True)
    out = forward(model, x)
    loss = (out * torch.zeros(model.output_shape(BATCH), device=meta)).sum()
    reg = regularizer(model)
    if reg is not None:
        loss = loss + reg
    loss.backward()


def count(case_path):
    model = build_model(load_case(case_path))
    return sum(p.numel() for p in model.parameters())


def reference_key(case_path, draw):
    """What a case's reference file is a function of: the case file, every parity/*.py, the draw,
    the device, the thread count, the kernel path (PLEXUS_PARITY_FUSED) and the torch version. A
    file written under the same key is the same file (`--reuse`; `plexus parity --keep DIR`)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = hashlib.sha256()
    for name in sorted(f for f in os.listdir(here) if f.endswith(".py")):
        with open(os.path.join(here, name), "rb") as fh:
            code.update(name.encode() + b"\0" + fh.read() + b"\0")
    with open(case_path, "rb") as fh:
        case = hashlib.sha256(fh.read()).hexdigest()
    return {
        "case": case,
        "code": code.hexdigest(),
        "draw": draw,
        "device": os.environ.get("PLEXUS_PARITY_DEVICE", "cpu"),
        "threads": torch.get_num_threads(),
        "fused": os.environ.get("PLEXUS_PARITY_FUSED") == "1",
        "torch": torch.__version__,
    }


def run_into(out_dir, cases, draw, reuse):
    """Every case's reference into OUT_DIR/<case>.safetensors, each written whole (a temporary file
    renamed), and OUT_DIR/references.json: each file's key (`reference_key`). With `reuse`, a case
    whose file is there under the same key is not run again."""
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, "references.json")
    manifest = {}
    if reuse and os.path.exists(manifest_path):
        try:
            with open(manifest_path) as fh:
                manifest = json.load(fh)
        except (OSError, ValueError):
            manifest = {}  # unreadable: every case is run again and the manifest rewritten
        if not isinstance(manifest, dict):
            manifest = {}
    reused = 0
    for c in cases:
        stem = os.path.splitext(os.path.basename(c))[0]
        out = os.path.join(out_dir, stem + ".safetensors")
        key = reference_key(c, draw)
        if reuse and manifest.get(stem) == key and os.path.exists(out):
            reused += 1
            continue
        manifest.pop(stem, None)
        tmp = out + ".partial"
        run(c, tmp, draw)
        os.replace(tmp, out)
        manifest[stem] = key
    tmp = manifest_path + ".partial"
    with open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    os.replace(tmp, manifest_path)
    if reuse:
        print(f"reused {reused} of {len(cases)} references in {out_dir}", file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", action="store_true", help="print the total number of parameters")
    ap.add_argument("--device-check", action="store_true",
                    help="run each case's forward and backward on the meta device (catches CPU-made tensors)")
    ap.add_argument("--out-dir", help="run every CASE.yaml given, writing OUT_DIR/<case>.safetensors")
    ap.add_argument("--draw", type=int, default=0,
                    help="draw K: seed each case with seed + %d·K (0: the case's own draw)" % DRAW_STRIDE)
    ap.add_argument("--reuse", action="store_true",
                    help="with --out-dir: skip a case whose reference is there under the same key")
    ap.add_argument("case", nargs="+", help="CASE.yaml [OUT.safetensors], or several cases with --out-dir")
    args = ap.parse_args(argv)
    if args.draw < 0:
        ap.error(f"--draw must be 0 or more, got {args.draw}")
    # `plexus parity` passes its libtorch thread count: both sides sum in the same thread layout.
    threads = os.environ.get("PLEXUS_PARITY_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    cases = args.case
    try:
        if args.count:
            for c in cases:
                print(count(c))
        elif args.device_check:
            for c in cases:
                try:
                    device_check(c)
                except RuntimeError as e:
                    raise RuntimeError(f"{c}: {e}") from e
        elif args.out_dir is not None:
            run_into(args.out_dir, cases, args.draw, args.reuse)
        else:
            if len(cases) != 2:
                ap.error("expected CASE.yaml OUT.safetensors (or --out-dir DIR CASE.yaml ...)")
            run(cases[0], cases[1], args.draw)
    except common.OptionError as e:
        print(f"parity/run.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
