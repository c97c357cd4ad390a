"""A plexus run in PyTorch, from its own files (docs/configs-and-runs.md, "Loading a run into PyTorch").

    python parity/load.py RUN_DIR                  # the model, its parameter count, the transform
    python parity/load.py RUN_DIR --eval           # evaluates on the run's held-out set: JSON
    python parity/load.py RUN_DIR --eval --bound   # and plexus' eval loss against the error model

A run directory holds `config.yaml` (what was written), `resolved.yaml` (what plexus derived: the
model's shapes, the data's normalisation, the held-out rows or token windows) and
`final.safetensors` (the weights, under PyTorch `state_dict` names). From Python:

    import sys; sys.path.insert(0, "parity")
    import load
    run = load.load_run("runs/mixer-fmnist-cpu-res")   # run.model: nn.Module (eval mode, weights in)
    x = run.transform(raw)                              # uint8 pixels [B, C, H, W] -> model input
    logits = run.forward(x)                             # the model's output, float32
    result = load.evaluate(run, load.eval_batches(run)) # {"loss", "accuracy", "samples"} as plexus'

The model is the parity reference (`run.build_model`): the same modules `plexus parity` holds
plexus to. `evaluate` computes what plexus' evaluation computes, in its order: per batch the mean
loss in float32, times the batch's count, summed in float64, over the total count.

The error model (`--bound`, SPEC.md "Tolerance" applied to one number): plexus and PyTorch compute
the same function in float32 and differ only in rounding. With e(a, b) = |a - b| / max(1, |b|),
"high" the evaluation in float64 from the same weights and inputs, and r the worst of PyTorch's
float32 evaluation and 4 more under sign-randomised rounding (run.SignRandomisedRounding),

    e(plexus, high) <= 8 r + 4 * 2^-24.

Accuracies may differ by the samples whose two largest logits are within 1e-4 (relative) in
float64: a rounding can flip their argmax. bf16 runs are loaded and evaluated at bf16 (their bound
is not stated here).
"""

import argparse
import gzip
import hashlib
import json
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import run as parity_run  # noqa: E402

SPREAD_RUNS = parity_run.SPREAD_RUNS
UNIT = 2.0 ** -24
NEAR_TIE = 1e-4


class Run:
    """A loaded run: `model` (nn.Module, eval mode), `resolved` (resolved.yaml as a dict),
    `config` (config.yaml), `transform` (raw input -> model input) and `forward`."""

    def __init__(self, path, model, resolved, config, weights):
        self.path, self.model, self.resolved, self.config, self.weights = path, model, resolved, config, weights

    @property
    def task(self):
        return self.resolved["data"]["task"]

    def transform(self, raw):
        """Raw input -> model input, as plexus' InputTransform: uint8 pixels `[B, C, H, W]` to
        `(x / 255 - mean) / sd` (scalar mean and sd as float64 scalars, per-channel ones as float32
        `[1, C, 1, 1]` tensors); token ids and other inputs unchanged."""
        return make_transform(self.resolved["data"]["transform"])(raw)

    def forward(self, x):
        """The model's output `[B, classes]` or `[B, T, vocab]`, float32 (float64 in a float64 run)."""
        with torch.no_grad():
            return parity_run.forward(self.model, x)


def make_transform(t):
    kind = t.get("kind")
    if kind == "identity":
        return lambda raw: raw
    if kind != "pixels":
        raise ValueError(f"resolved.yaml: unknown data.transform kind {kind!r} (identity or pixels)")
    mean, sd = t["mean"], t["std"]

    def pixels(raw):
        x = raw.to(torch.get_default_dtype()) / 255.0
        if len(mean) == 1:
            return (x - mean[0]) / sd[0]
        c = len(mean)
        as_t = lambda v: torch.tensor(v, dtype=torch.float32).reshape(1, c, 1, 1).to(x.dtype)  # noqa: E731
        return (x - as_t(mean)) / as_t(sd)

    return pixels


def read_yaml(path, what):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no {what} (is this a plexus run directory, trained by plexus train?)")
    with open(path) as fh:
        return yaml.safe_load(fh)


def case_of(resolved):
    """The parity case (model, topology, precision) that builds the run's model."""
    return {"model": resolved["model"], "topology": resolved["topology"], "precision": resolved["precision"]}


def sha256_of(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def pinned(path, case):
    """`case` with the inputs the run pinned when it started (`inputs.yaml`: docs/configs-and-runs.md,
    "A run pins its inputs") in place of the files its config names: a graph's C is the run's copy
    (`inputs/topology.init.csv`), whatever the file or run it was read from holds now. A copy that
    no longer matches its recorded SHA-256 is refused, naming both. Runs made before inputs were
    pinned have no record, and their config's files are read as named."""
    record = os.path.join(path, "inputs.yaml")
    if not os.path.isfile(record):
        return case
    pins = {p["key"]: p for p in (read_yaml(record, "inputs.yaml") or {}).get("inputs", [])}
    pin = pins.get("topology.init")
    if pin is not None and isinstance(case["topology"].get("init"), dict):
        copy = os.path.join(path, pin["copy"])
        got = sha256_of(copy)
        if got != pin["sha256"]:
            raise ValueError(f"{copy}: SHA-256 {got}, but {record} records {pin['sha256']} (read from "
                             f"{pin['source']} when the run started): the pinned copy was changed")
        case = dict(case, topology=dict(case["topology"], init={"file": copy}))
    return case


def check_weights(file):
    """`file` against the CRC-32 and size plexus recorded when it wrote it (`weights.json` beside it),
    as plexus checks it before loading: a flipped bit or a truncated file is refused, naming both.
    Runs written before checksums have no record."""
    manifest = os.path.join(os.path.dirname(file), "weights.json")
    if not os.path.isfile(manifest):
        return
    with open(manifest) as fh:
        want = json.load(fh).get(os.path.basename(file))
    if want is None:
        return
    with open(file, "rb") as fh:
        data = fh.read()
    got = {"crc32": f"{zlib.crc32(data) & 0xFFFFFFFF:08x}", "bytes": len(data)}
    if got != {"crc32": want["crc32"], "bytes": want["bytes"]}:
        raise ValueError(f"{file} is corrupt: {got['bytes']} bytes with CRC-32 {got['crc32']}, but {manifest} "
                         f"recorded {want['bytes']} bytes with CRC-32 {want['crc32']} when it was written")


def load_run(path, weights="checkpoints/final.safetensors", float64=False):
    """Builds the run's model from `resolved.yaml` and loads `weights` (a file in the run directory)
    into it, strictly (every name, every shape). `float64`: the model and transform in float64 (the
    error model's exact answer; set torch's default dtype to float64 while using it)."""
    resolved = read_yaml(os.path.join(path, "resolved.yaml"), "resolved.yaml")
    config = read_yaml(os.path.join(path, "config.yaml"), "config.yaml")
    case = pinned(path, case_of(resolved))
    if float64:
        case["precision"] = "fp32"
    model = parity_run.build_model(case)
    file = os.path.join(path, weights)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: no weights (a run leaves checkpoints/final.safetensors when it finishes)")
    check_weights(file)
    state = load_file(file)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"{file}: the weights do not match the model: missing {sorted(missing)}, "
                           f"unexpected {sorted(unexpected)}")
    model = model.double() if float64 else model
    model.eval()
    return Run(path, model, resolved, config, file)


def _idx(path, header):
    with open(path, "rb") as fh:
        data = fh.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data[header:]


def eval_batches(run):
    """The run's held-out set as raw `(input, target)` batches, in plexus' order, from the files
    that `resolved.yaml` names (Fashion-MNIST and the MNIST family: `idx`; token folders: `tokens`;
    text files: `text-bytes`, or `text-cache` for GPT-2 tokens; CIFAR-10: `cifar10-binary`, or
    `cifar10-cache` for an image folder)."""
    ev = run.resolved["data"].get("eval")
    if ev is None:
        raise ValueError(f"{run.path}: resolved.yaml records no held-out set for data.kind "
                         f"{run.resolved['data']['kind']!r}")
    b = ev["batch_size"]
    if ev["kind"] == "idx":
        side = run.resolved["data"]["input_shape"][-1]
        pixels = torch.frombuffer(bytearray(_idx(ev["images"], 16)), dtype=torch.uint8).reshape(-1, 1, side, side)
        labels = torch.frombuffer(bytearray(_idx(ev["labels"], 8)), dtype=torch.uint8).to(torch.int64)
        rows = ev["rows"]
        if rows != "all":
            sel = torch.tensor(rows, dtype=torch.int64)
            pixels, labels = pixels.index_select(0, sel), labels.index_select(0, sel)
        return [(pixels[s:s + b], labels[s:s + b]) for s in range(0, labels.shape[0], b)]
    if ev["kind"] in ("tokens", "text-bytes", "text-cache"):
        ids = _token_array(ev)
        t = ev["seq_len"]
        windows = torch.stack([ids[s:s + t + 1] for s in ev["starts"]])
        return [(windows[s:s + b, :t], windows[s:s + b, 1:]) for s in range(0, windows.shape[0], b)]
    if ev["kind"] in ("cifar10-binary", "cifar10-cache"):
        pixels, labels = _cifar_test(ev)
        if ev["rows"] != "all":
            sel = torch.tensor(ev["rows"], dtype=torch.int64)
            pixels, labels = pixels.index_select(0, sel), labels.index_select(0, sel)
        new_label = {old: new for new, old in enumerate(ev["classes"])}
        labels = torch.tensor([new_label[int(v)] for v in labels], dtype=torch.int64)
        return [(pixels[s:s + b], labels[s:s + b]) for s in range(0, labels.shape[0], b)]
    raise ValueError(f"resolved.yaml: held-out set of kind {ev['kind']!r} is not read here "
                     "(idx, tokens, text-bytes, text-cache, cifar10-binary, cifar10-cache)")


def _read_cache(ev):
    """The payload of one of plexus' cache files (b"PLXCACHE", the key's length and bytes, the
    payload's length and bytes), after checking that its key is the one the run recorded."""
    raw = open(ev["file"], "rb").read()
    key_len = struct.unpack("<Q", raw[8:16])[0]
    key = raw[16:16 + key_len].decode()
    if raw[:8] != b"PLXCACHE" or key != ev["key"]:
        raise ValueError(f"{ev['file']}: the cache no longer holds the data this run was evaluated on "
                         f"(its key is {key!r}, the run's {ev['key']!r}); load the data with plexus again "
                         "(e.g. a one-step run on the same files) to rebuild it")
    return raw[24 + key_len:]


def _token_array(ev):
    """A language model's token array as int64 ids: `tokens` (val.bin, u16 little-endian),
    `text-bytes` (every byte of the text is a token), `text-cache` (plexus' cache of the text's
    GPT-2 tokens, u16 little-endian)."""
    if ev["kind"] == "text-bytes":
        return torch.frombuffer(bytearray(open(ev["file"], "rb").read()), dtype=torch.uint8).to(torch.int64)
    raw = _read_cache(ev) if ev["kind"] == "text-cache" else open(ev["file"], "rb").read()
    return torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.int64)


def _cifar_test(ev):
    """CIFAR-10's test split as plexus read it: uint8 pixels [n, 3, 32, 32] and original labels [n].

    `cifar10-binary`: the official test batch, records of 1 label byte and 3072 pixel bytes (the
    R, G and B planes). `cifar10-cache`: an image folder as plexus decoded it, from its decode cache
    (b"PLXCACHE", the key's length and bytes, the payload's length and bytes; the payload is the
    n images' pixels, then their n labels). The folder's JPEGs are not decoded here: PIL and
    plexus' decoder differ by a few levels on some pixels."""
    if ev["kind"] == "cifar10-binary":
        raw = open(ev["file"], "rb").read()
        records = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 3073)
        return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].to(torch.int64)
    payload = torch.frombuffer(bytearray(_read_cache(ev)), dtype=torch.uint8)
    n = payload.numel() // 3073
    return payload[:n * 3072].reshape(n, 3, 32, 32), payload[n * 3072:].to(torch.int64)


def evaluate(run, batches, with_logits=False):
    """plexus' evaluation: {"loss", "accuracy", "samples"} (and the logits per batch, with_logits)."""
    loss_sum, correct, count, outs = torch.zeros((), dtype=torch.float64), 0, 0, []
    with torch.no_grad():
        for raw, y in batches:
            out = run.forward(run.transform(raw))
            n = y.numel()
            if run.task == "classification":
                loss = F.cross_entropy(out, y)
            elif run.task == "language_model":
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            else:
                raise ValueError(f"evaluation of task {run.task!r} is not done here (classification, language_model)")
            loss_sum = loss_sum + loss.double() * n
            correct += int((out.argmax(-1) == y).sum())
            count += n
            if with_logits:
                outs.append(out)
    result = {"loss": float(loss_sum / count), "accuracy": correct / count, "samples": count}
    return (result, outs) if with_logits else result


def near_ties(logits):
    """Samples whose two largest logits are within NEAR_TIE (relative) of each other."""
    n = 0
    for out in logits:
        top = out.reshape(-1, out.shape[-1]).topk(2, dim=-1).values
        n += int(((top[:, 0] - top[:, 1]).abs() <= NEAR_TIE * top[:, 0].abs().clamp(min=1.0)).sum())
    return n


def bound(path, batches=None):
    """PyTorch's float32 evaluation, the float64 one, the spread runs and the bound on plexus'
    loss (see the module's docstring), with plexus' own eval loss and accuracy from summary.json."""
    run = load_run(path)
    batches = batches if batches is not None else eval_batches(run)
    fp32 = evaluate(run, batches)
    spread = []
    for k in range(SPREAD_RUNS):
        with parity_run.SignRandomisedRounding(run.resolved["seed"] * SPREAD_RUNS + k, torch.device("cpu")):
            spread.append(evaluate(run, batches)["loss"])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        high, logits = evaluate(load_run(path, float64=True), batches, with_logits=True)
    finally:
        torch.set_default_dtype(previous)
    e = lambda a, b: abs(a - b) / max(1.0, abs(b))  # noqa: E731
    r = max([e(fp32["loss"], high["loss"])] + [e(s, high["loss"]) for s in spread])
    with open(os.path.join(path, "summary.json")) as fh:
        plexus = (json.load(fh).get("eval") or {})
    out = {"pytorch": fp32, "high": high, "spread_losses": spread, "r": r, "bound": 8 * r + 4 * UNIT,
           "near_ties": near_ties(logits), "plexus": plexus}
    if "loss" in plexus:
        out["plexus_err"] = e(plexus["loss"], high["loss"])
        out["within"] = out["plexus_err"] <= out["bound"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("run", help="a run directory (plexus train's output)")
    ap.add_argument("--weights", default="checkpoints/final.safetensors",
                    help="the weights file in RUN (default %(default)s)")
    ap.add_argument("--eval", action="store_true", help="evaluate on the run's held-out set; print JSON")
    ap.add_argument("--bound", action="store_true", help="with --eval: plexus' eval loss against the error model")
    args = ap.parse_args(argv)
    try:
        if args.eval and args.bound:
            print(json.dumps(bound(args.run)))
        elif args.eval:
            r = load_run(args.run, args.weights)
            print(json.dumps(evaluate(r, eval_batches(r))))
        else:
            r = load_run(args.run, args.weights)
            n = sum(p.numel() for p in r.model.parameters())
            print(f"{args.run}: {r.resolved['model']['kind']} with {r.resolved['topology']['kind']}, {n} parameters "
                  f"({r.weights}); input transform {r.resolved['data']['transform']}")
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"parity/load.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
