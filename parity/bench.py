"""PyTorch side of the benchmarks: the model of a plexus config, built by the parity references
(the same shapes, topology and parameter names as plexus), trained with torch.optim.AdamW with the
same parameter groups (`fused=True` by default, as nanoGPT does: libtorch's one-pass kernel, which
plexus also runs; `--adamw default` gives torch.optim's own choice, a per-tensor loop on the CPU
and `foreach` on CUDA), in eager mode and with torch.compile, timed like `plexus bench` and written
in the same CSV columns.

    python parity/bench.py CONFIG.yaml [--mode eager|compile] [--steps 20] [--warmup 5] [--adamw fused|default]
                           [--set key=value ...] [--case NAME] [--csv FILE]

Protocol (as `plexus bench`, src/bench.rs): one fixed random batch of the config's shapes is reused
for every step; `warmup` untimed steps (for compile: the compilation happens there), then `steps`
steps each timed on its own (after torch.cuda.synchronize on CUDA). A step is zero_grad, forward,
loss (cross-entropy; plus the topology's regulariser if any), backward, optional clipping, AdamW
step. Memory: peak resident set size after warm-up (VmHWM, reset through /proc/self/clear_refs) and
the bytes malloc holds after forward + loss and before backward (activation memory), from glibc's
mallinfo2 (libtorch allocates CPU tensors with malloc). FLOPs per step are counted by torch.utils.flop_counter on one
step (forward + backward), an independent check of plexus's analytic count.
"""

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

import common  # noqa: E402
import run as parity_run  # noqa: E402

CSV_HEADER = (
    "impl,case,backbone,topology,depth,device,precision,threads,batch,steps,ms_median,ms_p10,ms_p90,"
    "samples_per_s,tokens_per_s,peak_rss_mb,act_mem_mb,params,flops_per_step,achieved_gflops,"
    "peak_gflops,mfu,peak_gpu_mb,spec_gflops,mfu_spec"
)


def spec_peak_flops(gpu_name, dtype):
    """The GPU's data-sheet dense bf16/fp16 peak in FLOP/s (plexus's `device::spec_peak_flops`,
    the same table), or None for another dtype or GPU."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    name = gpu_name.upper()
    if "GH200" in name or "H200" in name:
        tf = 989.4
    elif "H100" in name or "H800" in name:
        tf = 756.0 if "PCIE" in name else 835.0 if "NVL" in name else 989.4
    elif "B200" in name:
        tf = 2250.0
    elif "A100" in name or "A800" in name:
        tf = 312.0
    elif "L40S" in name:
        tf = 362.0
    elif "L4" in name and "L40" not in name:
        tf = 121.0
    else:
        return None
    return tf * 1e12


def apply_override(cfg, item):
    """`key.path=value` (value parsed as YAML), like plexus's --set."""
    if "=" not in item:
        raise common.OptionError(f"--set {item!r}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = yaml.safe_load(value)


def rss_mb():
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return float(fields["VmRSS"].split()[0]) / 1024.0, float(fields["VmHWM"].split()[0]) / 1024.0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def heap_in_use():
    """Bytes allocated through malloc now (glibc mallinfo2: uordblks + hblkhd); None elsewhere."""
    try:
        import ctypes

        class Mallinfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Mallinfo2
        m = libc.mallinfo2()
        return m.uordblks + m.hblkhd
    except (OSError, AttributeError):
        return None


def quantile(xs, q):
    v = sorted(xs)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_matmul_flops(device, dtype):
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(8):
        sync(device)
        t = time.perf_counter()
        c = a @ b
        sync(device)
        s = time.perf_counter() - t
        del c
        if i >= 2:
            best = min(best, s)
    return 2.0 * n**3 / best


def param_groups(model, train):
    """plexus's groups (src/train/optim.rs): topology.* (no decay, lr × topology_lr_mult); ≥2-D
    weights except position embeddings (decay); everything else (no decay)."""
    decay, no_decay, topo = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.startswith("topology."):
            topo.append(p)
        elif p.dim() >= 2 and "pos_emb" not in name and "wpe" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    lr = float(train.get("lr", 1e-3))
    wd = float(train.get("weight_decay", 0.0))
    groups = [
        {"params": decay, "weight_decay": wd, "lr": lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": lr},
        {"params": topo, "weight_decay": 0.0, "lr": lr * float(train.get("topology_lr_mult", 1.0))},
    ]
    return [g for g in groups if g["params"]]


def batch_size(cfg):
    data = cfg.get("data", {})
    if "batch_size" not in data:
        raise common.OptionError("bench.py needs data.batch_size in the config (the plexus defaults are not mirrored)")
    return int(data["batch_size"])


# The model options a plexus config may leave to its dataset (plexus reads them from the data's
# shapes), per data kind: what the PyTorch side then needs, from the data section's options.
IMAGE_BACKBONES = ("mixer", "vit", "dit")
TOKEN_BACKBONES = ("gpt", "llama")


def with_data_shapes(cfg):
    """`cfg` with the model's shape options that plexus takes from the dataset filled in from the
    data section (Fashion-MNIST / MNIST 28×28×1 and 10 classes, CIFAR-10 32×32×3 and its classes,
    text and tokens: their seq_len and vocabulary), as plexus's data registry gives them; options the
    config sets win. Other data kinds need them in the config (see bench/configs/)."""
    model, data = dict(cfg.get("model", {})), cfg.get("data", {}) or {}
    kind, dkind = model.get("kind"), data.get("kind")
    shapes = {}
    if kind in IMAGE_BACKBONES and dkind == "mnist":
        shapes = {"image_size": 28, "channels": 1, "num_classes": 10}
    elif kind in IMAGE_BACKBONES and dkind == "cifar10":
        shapes = {"image_size": 32, "channels": 3, "num_classes": len(data.get("classes") or range(10))}
    elif kind in TOKEN_BACKBONES and dkind == "text":
        vocab = 50304 if data.get("tokenizer", "char") == "gpt2" else 256
        shapes = {"vocab_size": vocab, "seq_len": data.get("seq_len", 128)}
    elif kind in TOKEN_BACKBONES and dkind == "tokens" and "vocab" in data and "seq_len" in data:
        shapes = {"vocab_size": data["vocab"], "seq_len": data["seq_len"]}
    for k, v in shapes.items():
        model.setdefault(k, v)
    return {**cfg, "model": model}


def bench(cfg, mode, steps, warmup, case_name, profile=False, adamw="fused"):
    device = torch.device("cuda" if str(cfg.get("device", "cpu")).startswith("cuda") else "cpu")
    torch.manual_seed(int(cfg.get("seed", 0)))
    cfg = with_data_shapes(cfg)
    try:
        model = parity_run.build_model(cfg).to(device)
    except common.OptionError as e:
        raise common.OptionError(
            f"{e} (this config's data kind `{(cfg.get('data') or {}).get('kind')}` does not give them here: "
            "set them with --set model.KEY=VALUE, or start from a config of bench/configs/)"
        ) from e
    B = batch_size(cfg)
    vocab = getattr(model, "input_vocab", None)
    if vocab is not None:
        x = torch.randint(0, vocab, model.input_shape(B), dtype=torch.int64, device=device)
        y = torch.randint(0, vocab, model.input_shape(B), dtype=torch.int64, device=device)
    else:
        x = torch.randn(model.input_shape(B), device=device)
        y = torch.randint(0, model.output_shape(B)[-1], (B,), device=device)

    def loss_fn(x, y):
        out = parity_run.forward(model, x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        reg = parity_run.regularizer(model)
        return loss + reg if reg is not None else loss

    step_loss = torch.compile(loss_fn) if mode == "compile" else loss_fn
    train = cfg.get("train", {})
    betas = tuple(train.get("betas", (0.9, 0.999)))
    fused = {"fused": True} if adamw == "fused" else {}
    opt = torch.optim.AdamW(param_groups(model, train), betas=betas, eps=float(train.get("eps", 1e-8)), **fused)
    clip = train.get("clip_grad_norm")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = step_loss(x, y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
        opt.step()

    # FLOPs of one forward + backward, counted by PyTorch (eager model, before timing).
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss_fn(x, y).backward()
    flops = float(counter.get_total_flops())
    opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync(device)
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rss0, _ = rss_mb()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    _, hwm = rss_mb()
    peak_gpu = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    if profile:
        phases = []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = step_loss(x, y)
            sync(device)
            t1 = time.perf_counter()
            loss.backward()
            sync(device)
            t2 = time.perf_counter()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
            opt.step()
            sync(device)
            phases.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.perf_counter() - t2) * 1e3))
        f, b, o = (statistics.median(p[k] for p in phases) for k in range(3))
        print(f"profile: forward + loss {f:.2} ms, backward {b:.2} ms, optimizer {o:.2} ms", file=sys.stderr)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)
    # Activation memory (as src/bench.rs): bytes held after forward + loss, before backward —
    # malloc's on the CPU, the CUDA caching allocator's on a GPU.
    def in_use():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            return torch.cuda.memory_allocated(device)
        return heap_in_use()

    act_mem = float("nan")
    opt.zero_grad(set_to_none=True)
    before = in_use()
    loss = step_loss(x, y)
    after = in_use()
    loss.backward()
    if before is not None and after is not None:
        act_mem = (after - before) / (1024.0 * 1024.0)
    ms = [statistics.median(times), quantile(times, 0.1), quantile(times, 0.9)]
    per_s = 1e3 / ms[0]
    tokens = x.numel() * per_s if vocab is not None else None
    dtype = torch.bfloat16 if cfg.get("precision", "fp32") == "bf16" else torch.float32
    peak = peak_matmul_flops(device, dtype) / 1e9
    achieved = flops / (ms[0] * 1e-3) / 1e9
    cpu = device.type == "cpu"
    spec = None if cpu else spec_peak_flops(torch.cuda.get_device_name(device), dtype)
    spec = spec / 1e9 if spec is not None else None
    units, _ = common.make_units(model, model.topology.granularity)
    row = [
        f"torch-{mode}",
        case_name or cfg.get("name", "case"),
        cfg["model"]["kind"],
        cfg.get("topology", {}).get("kind", "residual"),
        str(len(units)),
        str(device),
        cfg.get("precision", "fp32"),
        str(torch.get_num_threads()),
        str(B),
        str(steps),
        f"{ms[0]:.4f}",
        f"{ms[1]:.4f}",
        f"{ms[2]:.4f}",
        f"{B * per_s:.2f}",
        f"{tokens:.2f}" if tokens is not None else "",
        f"{hwm:.1f}" if cpu else "nan",
        f"{act_mem:.1f}",
        str(sum(p.numel() for p in model.parameters())),
        f"{flops:.6e}",
        f"{achieved:.3f}",
        f"{peak:.3f}",
        f"{achieved / peak:.4f}",
        f"{peak_gpu:.1f}",
        f"{spec:.1f}" if spec is not None else "",
        f"{achieved / spec:.4f}" if spec is not None else "",
    ]
    return ",".join(row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--case")
    ap.add_argument("--csv", help="append the row to this CSV (header when new)")
    ap.add_argument("--profile", action="store_true",
                    help="also print (stderr) the forward/backward/optimizer medians and torch.profiler's top ops")
    ap.add_argument("--adamw", choices=["fused", "default"], default="fused",
                    help="fused: torch.optim.AdamW(fused=True), plexus's kernel (default); default: torch.optim's choice")
    args = ap.parse_args(argv)
    try:
        with open(args.config) as fh:
            cfg = yaml.safe_load(fh)
        for item in args.overrides:
            apply_override(cfg, item)
        if args.mode == "compile" and args.warmup < 2:
            raise common.OptionError("--mode compile needs --warmup ≥ 2 (compilation happens there)")
        row = bench(cfg, args.mode, args.steps, args.warmup, args.case, args.profile, args.adamw)
    except common.OptionError as e:
        print(f"parity/bench.py: {e}", file=sys.stderr)
        return 2
    print(CSV_HEADER)
    print(row)
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a") as fh:
            if new:
                fh.write(CSV_HEADER + "\n")
            fh.write(row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
