"""PyTorch side of `plexus parity` (protocol: SPEC.md).

    python parity/run.py CASE.yaml OUT.safetensors
    python parity/run.py --out-dir DIR CASE.yaml ...   # several cases, one process
    python parity/run.py --count CASE.yaml        # prints the total number of parameters
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import backbones  # noqa: E402
import common  # noqa: E402

BATCH = 3
# Parameter names redrawn as norm gains, 1 + 0.1·N(0,1) (LayerNorm `norm.weight`; LLaMA's RMSNorms
# `input_layernorm.weight`, `post_attention_layernorm.weight`, `norm.weight`).
NORM_GAINS = ("norm.weight", "layernorm.weight")


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


def run(case_path, out_path):
    case = load_case(case_path)
    seed = case.get("seed", 0)
    seed = common.as_int("case", "seed", seed, minimum=0)
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
    high_out, high_loss, high_grads = high_precision(case, model, x, g)

    def f32(t):
        return t.detach().to(torch.float32).cpu().contiguous().clone()

    params = dict(model.named_parameters(remove_duplicate=False))
    tensors = {}
    for name in keys:
        tensors[f"param.{name}"] = f32(params[name])
        tensors[f"grad.{name}"] = f32(grads[name])
        tensors[f"high.grad.{name}"] = high_grads[name]
    tensors["input.x"] = f32(x) if x.is_floating_point() else x.cpu().contiguous().clone()
    tensors["input.g"] = f32(g)
    tensors["output.y"] = f32(out)
    tensors["output.loss"] = f32(loss).reshape(())
    tensors["high.output.y"] = high_out
    tensors["high.output.loss"] = high_loss
    if x.is_floating_point():  # no gradient for integer tokens
        tensors["grad.input"] = f32(grads["input"])
        tensors["high.grad.input"] = high_grads["input"]
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", action="store_true", help="print the total number of parameters")
    ap.add_argument("--device-check", action="store_true",
                    help="run each case's forward and backward on the meta device (catches CPU-made tensors)")
    ap.add_argument("--out-dir", help="run every CASE.yaml given, writing OUT_DIR/<case>.safetensors")
    ap.add_argument("case", nargs="+", help="CASE.yaml [OUT.safetensors], or several cases with --out-dir")
    args = ap.parse_args(argv)
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
            os.makedirs(args.out_dir, exist_ok=True)
            for c in cases:
                stem = os.path.splitext(os.path.basename(c))[0]
                run(c, os.path.join(args.out_dir, stem + ".safetensors"))
        else:
            if len(cases) != 2:
                ap.error("expected CASE.yaml OUT.safetensors (or --out-dir DIR CASE.yaml ...)")
            run(cases[0], cases[1])
    except common.OptionError as e:
        print(f"parity/run.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
