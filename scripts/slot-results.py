#!/usr/bin/env python3
"""The figures of a GPU slot, from what scripts/gpu-check.sh left: its archives
(gpu-check-GROUP.tar.gz) or its groups' work folders.

    scripts/slot-results.py SOURCE... [--out DIR] [--title TEXT]

Collects every raw.csv (one full training step per row: plexus, torch-eager, torch-compile) and
overhead.csv (`plexus bench --compare`: paired overheads over residual) and each group's
summary.txt, and prints — or, with --out, writes DIR/raw.csv, DIR/overhead.csv and DIR/results.md
— three tables: plexus against PyTorch eager and torch.compile per case (medians of the rows),
the topology overheads per case, and the groups' step verdicts. Standard library only (runs on a
GPU machine's bare Python).
"""
import argparse
import csv
import io
import os
import statistics
import sys
import tarfile


def sources(paths):
    """(name, text) of every raw.csv, overhead.csv and summary.txt under the given archives or folders."""
    for path in paths:
        if os.path.isdir(path):
            for root, _, files in os.walk(path):
                for f in sorted(files):
                    if f in ("raw.csv", "overhead.csv", "summary.txt"):
                        with open(os.path.join(root, f)) as fh:
                            yield os.path.join(root, f), fh.read()
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    if m.isfile() and os.path.basename(m.name) in ("raw.csv", "overhead.csv", "summary.txt"):
                        yield f"{path}:{m.name}", tar.extractfile(m).read().decode()
        else:
            sys.exit(f"slot-results: {path} is neither a folder nor a tar archive")


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--out", help="write raw.csv, overhead.csv and results.md here")
    ap.add_argument("--title", default="GPU slot", help="the first line of results.md")
    args = ap.parse_args()

    raw, overhead, summaries = [], [], []
    raw_header = overhead_header = None
    for name, text in sources(args.sources):
        base = os.path.basename(name.split(":")[-1])
        if base == "raw.csv":
            raw += rows_of(text)
            raw_header = raw_header or text.splitlines()[0]
        elif base == "overhead.csv":
            # The group it came from (gpu-check-GROUP.tar.gz, or the folder), to tell apart two
            # groups' cases of one name.
            where = name.split(":")[0] if ":" in name else os.path.dirname(name)
            group = os.path.basename(where).removeprefix("gpu-check-").removesuffix(".tar.gz")
            for r in rows_of(text):
                r["_group"] = group
                overhead.append(r)
            overhead_header = overhead_header or text.splitlines()[0]
        else:
            summaries.append(text.strip())

    out = []
    # plexus against PyTorch, per case: the median of each implementation's rows.
    by = {}
    for r in raw:
        by.setdefault(r["case"], {}).setdefault(r["impl"], []).append(r)

    def med(rs, col):
        vals = [float(r[col]) for r in rs or [] if r.get(col) not in (None, "", "nan", "NaN")]
        return statistics.median(vals) if vals else None

    out.append("## plexus against PyTorch (same model, same batch; medians of the rows)\n")
    out.append("| case | plexus ms | eager ms | compile ms | plexus/eager | plexus/compile | MFU plexus | MFU compile |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in sorted(by):
        p, e, c = (by[case].get(k) for k in ("plexus", "torch-eager", "torch-compile"))
        pm, em, cm = med(p, "ms_median"), med(e, "ms_median"), med(c, "ms_median")
        ratio = lambda a, b: a / b if a is not None and b else None  # noqa: E731
        mfu = lambda rs: None if med(rs, "mfu_spec") is None else 100 * med(rs, "mfu_spec")  # noqa: E731
        out.append(f"| {case} | {fmt(pm, '.1f')} | {fmt(em, '.1f')} | {fmt(cm, '.1f')} | {fmt(ratio(pm, em), '.2f')} "
                   f"| {fmt(ratio(pm, cm), '.2f')} | {fmt(mfu(p), '.1f')} % | {fmt(mfu(c), '.1f')} % |")
    out.append("")

    # Overheads: one column per case (the rows of one `bench --compare` process each).
    groups_of = {}
    for r in overhead:
        groups_of.setdefault(r["case"], set()).add(r["_group"])
    label = lambda r: r["case"] if len(groups_of[r["case"]]) == 1 else f"{r['case']} ({r['_group']})"  # noqa: E731
    cases = list(dict.fromkeys(label(r) for r in overhead))
    topologies = list(dict.fromkeys(r["topology"] for r in overhead))
    cell = {(label(r), r["topology"]): r for r in overhead}
    if overhead:
        out.append("## Topology overhead over residual (`plexus bench --compare`, paired rounds in one process)\n")
        out.append("| topology | " + " | ".join(cases) + " |")
        out.append("|---|" + "---:|" * len(cases))
        for t in topologies:
            vals = []
            for c in cases:
                r = cell.get((c, t))
                if r is None:
                    vals.append("")
                elif t == "residual":
                    vals.append(f"{float(r['ms_median']):.1f} ms")
                else:
                    vals.append(f"{float(r['overhead_pct']):+.1f} %")
            out.append(f"| {t} | " + " | ".join(vals) + " |")
        out.append("\n(residual's row: its step time; the others: their median paired overhead.)\n")

    if summaries:
        out.append("## Steps\n")
        out.append("```")
        out.extend(summaries)
        out.append("```")
    text = "\n".join(out) + "\n"

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for fname, header, rows in (("raw.csv", raw_header, raw), ("overhead.csv", overhead_header, overhead)):
            if header:
                with open(os.path.join(args.out, fname), "w", newline="") as fh:
                    w = csv.DictWriter(fh, fieldnames=header.split(","), extrasaction="ignore", lineterminator="\n")
                    w.writeheader()
                    w.writerows(rows)
        with open(os.path.join(args.out, "results.md"), "w") as fh:
            fh.write(f"# {args.title}\n\nGenerated by `scripts/slot-results.py` from the slot's archives.\n\n" + text)
        print(f"wrote {args.out}/raw.csv, overhead.csv, results.md")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
