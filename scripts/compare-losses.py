#!/usr/bin/env python3
"""Compares the logged training losses of pairs of plexus runs (the GPU slot plan's checks).

    compare-losses.py [--first TOL] [--later TOL] RUNS_DIR A B [A B ...]

For each pair, RUNS_DIR/A/metrics.csv against RUNS_DIR/B/metrics.csv at every step both logged: the
relative difference must be at most --first at step 0 (default 1e-5: the same weights and batch,
only the order of summation differs) and at most --later afterwards (default 2e-3). Prints one line
a step; exits 1 if any differs more or a run has no metrics. Standard library only.
"""
import argparse
import csv
import os
import sys


def losses(path):
    with open(path) as fh:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(fh)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--first", type=float, default=1e-5)
    ap.add_argument("--later", type=float, default=2e-3)
    ap.add_argument("runs")
    ap.add_argument("pairs", nargs="+")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("runs come in pairs: A B [A B ...]")
    ok = True
    for a, b in zip(args.pairs[::2], args.pairs[1::2]):
        try:
            la, lb = (losses(os.path.join(args.runs, r, "metrics.csv")) for r in (a, b))
        except OSError as e:
            print(f"{a} / {b}: {e}")
            ok = False
            continue
        common = sorted(set(la) & set(lb))
        if not common:
            print(f"{a} / {b}: no step logged by both")
            ok = False
        for s in common:
            rel = abs(la[s] - lb[s]) / max(abs(lb[s]), 1e-30)
            tol = args.first if s == 0 else args.later
            good = rel <= tol
            ok &= good
            print(f"{a} step {s}: {la[s]:.6f}, {b} {lb[s]:.6f}, relative {rel:.1e} (tolerance {tol:.0e}) "
                  f"{'ok' if good else 'DIFFERS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
