#!/usr/bin/env bash
# The first thing to run on a new GPU machine: every check of plexus that needs a GPU, each step's
# log in OUTDIR, and a table of what passed at the end. Exit status 1 if any step failed.
#
#   scripts/gpu-check.sh [OUTDIR [STEP...]]   (default: runs/gpu-check, every step)
#
# STEP names a step or the start of names (`train` = every train-* step).
#
# Steps (each under its own time limit, so one hang does not eat the rest):
#   doctor            the CUDA set-up (driver, runtime, GPUs, bf16, NCCL built)
#   selftest          `doctor --selftest --device cuda`: AdamW's fused CUDA kernel against the f64 update
#                     rule, then every topology on every backbone, tiny, on the
#                     GPU (connectivity, checkpoints, crash + resume, analyze, bf16 against fp32)
#   parity            `parity --device cuda`: Rust and the PyTorch references, both on the GPU
#   train-*           CPU-size configs trained on the GPU in bf16 (Fashion-MNIST Mixers, mHC among them,
#                     GPT and LLaMA on text), then analyze and plot on one of them
#   train-dit-ancre   a pixel-space DiT on Fashion-MNIST in bf16, then `sample` (a PNG grid) and `fd`
#   bench-*           paired step times: DiT-B/2 residual vs ANCRe; the paper Mixer × 6 topologies, and
#                     its mHC again with PLEXUS_FUSED_KERNELS=0 (the composite Sinkhorn, for comparison)
#   nproc             `train --nproc 2`: NCCL on 2 GPUs; on a 1-GPU machine (nproc-refused) it must
#                     stop with an error that says there are fewer GPUs than processes
#
# Environment: PLEXUS (the binary; default target/release/plexus after scripts/setup.sh), PLEXUS_DATA
# (a data root with fashion-mnist/ and text/; default: scripts/fetch-data.sh), PLEXUS_PYTHON (Python
# with torch, for parity), STEPS (training steps of the train-* runs, default 300).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-runs/gpu-check}"
shift || true
ONLY=("$@")
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
if [[ -z "${PLEXUS:-}" ]]; then
    scripts/setup.sh >&2 || exit 1
    PLEXUS="$ROOT/target/release/plexus"
fi
if [[ -z "${PLEXUS_DATA:-}" ]]; then
    PLEXUS_DATA="$(scripts/fetch-data.sh)" || exit 1
fi
export PLEXUS_DATA
STEPS="${STEPS:-300}"
GPU=(--set device=cuda --set precision=bf16 --set "train.steps=$STEPS" --set log.eval_every=100 --quiet)

results=()
step() { # step NAME LIMIT_S CMD...: run CMD under a time limit, log to OUT/NAME.log, record the outcome
    local name="$1" limit="$2"
    shift 2
    if ((${#ONLY[@]})); then
        local want=0 o
        for o in "${ONLY[@]}"; do [[ "$name" == "$o"* ]] && want=1; done
        ((want)) || return 0
    fi
    local t0=$SECONDS
    echo "== $name: $*" | tee "$OUT/$name.log"
    timeout --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
    local rc=$?
    local dt=$((SECONDS - t0))
    local verdict=ok
    if [[ $rc == 124 || $rc == 137 ]]; then verdict="TIMEOUT (${limit} s)"; elif [[ $rc != 0 ]]; then verdict="FAILED (exit $rc)"; fi
    tail -n 25 "$OUT/$name.log"
    echo "== $name: $verdict in ${dt} s"
    results+=("$(printf '%-22s %-18s %5d s' "$name" "$verdict" "$dt")")
}

if command -v nvidia-smi >/dev/null; then nvidia-smi >"$OUT/nvidia-smi.log" 2>&1; head -n 15 "$OUT/nvidia-smi.log"; fi
step doctor 60 "$PLEXUS" doctor
step selftest 420 "$PLEXUS" doctor --selftest --device cuda
step parity 420 "$PLEXUS" parity --device cuda
step train-mixer-hacn 300 "$PLEXUS" train configs/mixer-fmnist/cpu/hacn.yaml "${GPU[@]}" --out "$OUT/runs/mixer-hacn" --overwrite
step train-mixer-res 300 "$PLEXUS" train configs/mixer-fmnist/cpu/res.yaml "${GPU[@]}" --out "$OUT/runs/mixer-res" --overwrite
# mHC trains through the NVRTC-compiled CUDA Sinkhorn (its self-test is in `selftest`; a fallback to
# the composite graph prints a warning into this log).
step train-mixer-mhc 300 "$PLEXUS" train configs/mixer-fmnist/cpu/res.yaml "${GPU[@]}" --set topology.kind=mhc --set name=mixer-fmnist-mhc --out "$OUT/runs/mixer-mhc" --overwrite
step train-gpt-hacn 300 "$PLEXUS" train configs/gpt2/cpu/hacn-bpe.yaml "${GPU[@]}" --out "$OUT/runs/gpt-hacn" --overwrite
step train-llama-ancre 300 "$PLEXUS" train configs/llama/cpu/ancre-bpe.yaml "${GPU[@]}" --out "$OUT/runs/llama-ancre" --overwrite
step analyze 300 "$PLEXUS" analyze "$OUT/runs/mixer-hacn" "$OUT/runs/mixer-res"
step plot 120 "$PLEXUS" plot "$OUT/runs/mixer-hacn" "$OUT/runs/mixer-res" --out "$OUT/figures"
step train-dit-ancre 300 "$PLEXUS" train configs/dit-fmnist/cpu/ancre.yaml "${GPU[@]}" --out "$OUT/runs/dit-ancre" --overwrite
step sample-dit 120 "$PLEXUS" sample "$OUT/runs/dit-ancre" --device cuda --cfg 2
step fd-dit 300 "$PLEXUS" fd "$OUT/runs/dit-ancre" --extractor "$OUT/runs/mixer-res" --samples 500 --device cuda
# Step times on the GPU (paired, in one process): DiT-B/2 residual against ANCRe, and the paper
# Mixer with the multi-stream and history topologies. Full matrix against PyTorch:
# `python3 bench/run.py --suite gpu` (bench/README.md).
step bench-dit 300 "$PLEXUS" bench bench/configs/gpu/dit.yaml --compare residual,ancre --steps 10 --warmup 3
step bench-mixer 300 "$PLEXUS" bench bench/configs/gpu/mixer.yaml --compare residual,hacn,ancre,hyper,mhc,attnres --steps 10 --warmup 3
# The same mHC case with the composite Sinkhorn (PLEXUS_FUSED_KERNELS=0): the CUDA kernel's gain.
step bench-mixer-mhc-composite 300 env PLEXUS_FUSED_KERNELS=0 "$PLEXUS" bench bench/configs/gpu/mixer.yaml --compare residual,mhc --steps 10 --warmup 3
NPROC=(train configs/mixer-fmnist/cpu/hacn.yaml --set device=cuda --set train.steps=50 --quiet --nproc 2 --dist-timeout 60 --out "$OUT/runs/nproc" --overwrite)
GPUS=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU')
if ((GPUS >= 2)); then
    step nproc 120 "$PLEXUS" "${NPROC[@]}"
else
    # One GPU: two ranks cannot each have one; the run must stop with a message that says so.
    export LOG="$OUT/nproc-refused.log"
    step nproc-refused 120 bash -c '! "$@" && grep -v "^== " "$LOG" | grep -q "CUDA device(s): start at most"' _ "$PLEXUS" "${NPROC[@]}"
fi

echo
echo "gpu-check summary ($OUT)"
failed=0
for r in "${results[@]}"; do
    echo "  $r"
    [[ "$r" == *" ok "* ]] || failed=1
done
exit $failed
