#!/usr/bin/env bash
# The GPU slot plan: every check of plexus that needs a GPU, in named groups of at most 8 minutes
# each, in the order that buys the most, from a prebuilt binary (no cargo, no set-up, no download:
# GPU machines lent to this project are offline and held ~30 minutes). Each group leaves ONE archive,
# OUTDIR/gpu-check-GROUP.tar.gz (its logs, CSVs, summaries and figures; no checkpoints), and prints a
# table of its steps. Exit status 1 if any step failed, timed out or was skipped.
#
#   scripts/gpu-check.sh [--out OUTDIR] [--budget S] GROUP...  (OUTDIR default: $OUT, else runs/gpu-check)
#   scripts/gpu-check.sh --list                       the groups, their steps and time limits
#   scripts/gpu-check.sh --device cpu --quick kernels graphs   a dry run of the plumbing on a CPU
#
# Before the slot, on a machine with cargo: scripts/gpu-slot-pack.sh (the binary, the data and the
# Python packages the references need into .gpu-slot/, ignored by git). On the GPU machine, from
# the repository root:
#   scripts/gpu-check.sh --out "$OUT" doctor kernels
# --budget (default 560 s) is the whole command's: a step whose limit no longer fits is skipped and
# listed as such (run it again in the next command), so that one command stays inside a 10-minute
# limit whatever groups it names. The archive of a group is rewritten after every step, so a
# command killed from outside still leaves what its finished steps measured.
#
# Groups, in the order to run them (the first ones buy the most):
#   doctor       doctor (driver, runtime, GPU, bf16, NCCL), then `doctor --selftest --device cuda`:
#                AdamW's fused CUDA kernel against the f64 rule, the CUDA Sinkhorn and stream kernels
#                against their CPU reference, every topology (and two compositions) × backbone, tiny, fp32 and bf16
#   kernels      a small GPT (bench/configs/gpu/slot-kernels.yaml) with hyper and mHC in fp32 and
#                bf16 and AttnRes in fp32, eager, under PLEXUS_CUDA_SYNC_CHECK=1 (a fault names its kernel) and
#                PLEXUS_COUNT_SYNCS=1 (libtorch's count of host-device syncs; must be 0 on steps that
#                read nothing), then with PLEXUS_FUSED_KERNELS=0: the fused run's losses must follow
#                the composite graph's; residual in bf16 with the loss's and the pre-norms' CUDA
#                kernels against libtorch's composite operators
#   graphs       train.cuda_graphs: residual, hyper and mHC captured and eager (their losses must
#                agree), dropout in a replay, and the paper Mixer's step times both ways
#   bench        GPT-2 124M at 16×1024 in bf16: the residual step (ms, MFU against the GPU's
#                data-sheet peak and the measured matmul rate) and the paired overheads of hacn,
#                ancre, denseformer, hyper, mhc, attnres, each with CUDA graphs and eager
#   profile      `bench --profile` of GPT-2 124M with residual, hyper, mHC and AttnRes: one step's GPU kernel
#                time by category (GEMM, attention, norm, …, topology-own) and its Chrome trace
#   bench-more   hyper/mHC with PLEXUS_FUSED_KERNELS=0 (what the CUDA kernels buy), LLaMA-130M at
#                16×1024, the paper Mixer with every topology, graphs and eager
#   parity       `parity --device cuda`: Rust and the PyTorch references, both on the GPU
#   bench-torch  plexus, PyTorch eager and torch.compile on the same GPT and LLaMA steps, back to back
#                in one step each (paired: the same machine state), then their ratios
#                (scripts/slot-results.py), for "plexus ≤ torch.compile"
#   train        CPU-size configs trained on the GPU in bf16 on real data (Fashion-MNIST Mixers with
#                H-ACN, residual, mHC; GPT and LLaMA on text), then analyze and plot; a pixel DiT,
#                sample and fd
#
# Environment: PLEXUS (default .gpu-slot/plexus, else target/release/plexus), PLEXUS_DATA (default
# .gpu-slot/data; only `train` reads data), PLEXUS_PYTHON (Python with torch for `parity` and
# `bench-torch`, default python3; PyYAML and safetensors come from .gpu-slot/py when it lacks them;
# torch.compile also needs a C compiler and Python.h, else its steps are skipped). libtorch comes
# from that Python's torch when the binary's own rpath (the build machine's venv) does not resolve:
# the torch versions must be the same (2.11.0; `doctor` prints both).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# group → "NAME LIMIT_S" lines of its steps (the limits of a group add up to ≤ 470 s). The limits
# are about 3× what each step took on the H200 slot of 2026-11-26 (bench/gpu/2026-11-26-h200/), at
# least 10 s; the self-test's (which failed early there) is 20× its CPU time, torch.compile's 3× its
# compile-and-run time.
declare -A STEPS=(
    [doctor]="nvidia-smi 10
doctor 15
selftest 180"
    [kernels]="hyper-fp32 15
mhc-fp32 15
attnres-fp32 15
hyper-bf16 15
mhc-bf16 15
hyper-fp32-composite 15
mhc-fp32-composite 15
attnres-fp32-composite 15
fused-follows-composite 10
residual-bf16 15
residual-bf16-composite 15
hyper-bf16-composite 15
mhc-bf16-composite 15
hacn-bf16 15
hacn-bf16-composite 15
bf16-kernels-follow-composite 10
syncs 10"
    [graphs]="residual-graph 15
residual-eager 15
hyper-graph 15
hyper-eager 15
mhc-graph 15
mhc-eager 15
dropout-graph 15
graphs-follow-eager 10
bench-mixer-graph 20
bench-mixer-eager 20"
    [bench]="gpt-residual 20
gpt-residual-eager 15
gpt-compare 45
gpt-compare-eager 40"
    [profile]="gpt-residual 45
gpt-hyper 45
gpt-mhc 45
gpt-attnres 45"
    [bench-more]="gpt-composite 30
llama-residual 15
llama-compare 30
mixer-compare 20
mixer-compare-eager 20"
    [parity]="parity 60"
    [bench-torch]="gpt-paired 210
llama-paired 200
ratios 10"
    [train]="train-mixer-hacn 60
train-mixer-res 60
train-mixer-mhc 60
train-gpt-hacn 60
train-llama-ancre 60
analyze 50
plot 30
train-dit-ancre 60
sample-dit 15
fd-dit 15"
)
ORDER=(doctor kernels graphs bench profile bench-more parity bench-torch train)

list() {
    for g in "${ORDER[@]}"; do
        local total=0 line
        while read -r _ s; do total=$((total + s)); done <<<"${STEPS[$g]}"
        echo "$g (limits add up to ${total} s):"
        while read -r line; do echo "    $line s"; done <<<"${STEPS[$g]}"
    done
}

OUTDIR="${OUT:-runs/gpu-check}"
BUDGET=560
GROUPS_ASKED=()
DEV=cuda
QUICK=()
while (($#)); do
    case "$1" in
        --out) OUTDIR="$2"; shift 2 ;;
        --budget) BUDGET="$2"; shift 2 ;;
        --device) DEV="$2"; shift 2 ;;
        # A dry run of the plumbing: 4 steps of a model 4× narrower on 4× fewer tokens.
        --quick) QUICK=(--set train.steps=4 --set log.every=2 --set model.width=64 --set data.batch_size=2); shift ;;
        --list) list; exit 0 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) GROUPS_ASKED+=("$1"); shift ;;
    esac
done
if ((${#GROUPS_ASKED[@]} == 0)); then
    echo "gpu-check.sh: name at least one group: ${ORDER[*]} (--list shows their steps)" >&2
    exit 2
fi
for g in "${GROUPS_ASKED[@]}"; do
    if [[ -z "${STEPS[$g]+x}" ]]; then
        echo "gpu-check.sh: no group '$g'; the groups are: ${ORDER[*]}" >&2
        exit 2
    fi
done

# The binary, prebuilt: nothing here builds or downloads.
if [[ -z "${PLEXUS:-}" ]]; then
    for p in "$ROOT/.gpu-slot/plexus" "$ROOT/target/release/plexus"; do
        [[ -x "$p" ]] && { PLEXUS="$p"; break; }
    done
fi
if [[ -z "${PLEXUS:-}" || ! -x "$PLEXUS" ]]; then
    echo "gpu-check.sh: no plexus binary (looked at \$PLEXUS, .gpu-slot/plexus, target/release/plexus): build one" \
         "with scripts/gpu-slot-pack.sh on a machine with cargo and bring .gpu-slot/ along" >&2
    exit 2
fi
# A packed binary built from other sources than the checkout's measures other code: refused
# (scripts/source-hash.sh, with or without git), unless GPU_CHECK_ALLOW_STALE=1.
BINARY_COMMIT="$(cat "$(dirname "$PLEXUS")/COMMIT" 2>/dev/null || echo 'commit unknown')"
HEAD_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
PACKED_SOURCES="$(cat "$(dirname "$PLEXUS")/SOURCES" 2>/dev/null || true)"
if [[ -n $PACKED_SOURCES && ${GPU_CHECK_ALLOW_STALE:-0} != 1 ]]; then
    CHECKOUT_SOURCES="$("$ROOT/scripts/source-hash.sh")"
    if [[ $PACKED_SOURCES != "$CHECKOUT_SOURCES" ]]; then
        echo "gpu-check.sh: $PLEXUS was built from other sources (hash $PACKED_SOURCES, commit $BINARY_COMMIT)" \
             "than this checkout's ($CHECKOUT_SOURCES, commit $HEAD_COMMIT): run scripts/gpu-slot-pack.sh again," \
             "or set GPU_CHECK_ALLOW_STALE=1 to measure that binary anyway" >&2
        exit 2
    fi
fi
PY="${PLEXUS_PYTHON:-python3}"
export PLEXUS_PYTHON="$PY"
# libtorch: the binary's rpath names the build machine's venv; elsewhere, the local torch's.
# (ldd's output taken whole first: `ldd | grep -q` under pipefail can fail on SIGPIPE.)
LDD_OUT="$(ldd "$PLEXUS" 2>&1 || true)"
if [[ $LDD_OUT == *"not found"* ]]; then
    TORCH_LIBS="$("$PY" - <<'PYEOF'
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
print(":".join(dirs))
PYEOF
)" || { echo "gpu-check.sh: the binary's libtorch is not found and $PY has no torch" >&2; exit 2; }
    export LD_LIBRARY_PATH="$TORCH_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    LDD_OUT="$(ldd "$PLEXUS" 2>&1 || true)"
    if [[ $LDD_OUT == *"not found"* ]]; then
        grep "not found" <<<"$LDD_OUT" >&2
        echo "gpu-check.sh: libraries still missing with $PY's torch (above; a 'version ... not found' means this" \
             "machine's glibc or libstdc++ is older than the build machine's)" >&2
        exit 2
    fi
fi
# The references' Python packages beyond torch: from .gpu-slot/py when this Python lacks them.
if ! "$PY" -c 'import yaml, safetensors' 2>/dev/null && [[ -d "$ROOT/.gpu-slot/py" ]]; then
    export PYTHONPATH="$ROOT/.gpu-slot/py${PYTHONPATH:+:$PYTHONPATH}"
fi
export PLEXUS_DATA="${PLEXUS_DATA:-$ROOT/.gpu-slot/data}"

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
WORK_ROOT="${GPU_CHECK_WORK:-/tmp/plexus-gpu-check}"
G=""          # the running group's folder (logs, CSVs, runs)
RESULTS=()    # the running group's step outcomes
FAILED=0

# Lines in a step's log that make it fail whatever its exit status: a CUDA graph given up or the
# CUDA kernels unavailable would otherwise let the graphs and kernels checks compare eager runs
# with eager runs, or composite with composite.
FAIL_PATTERN="capture of the training step failed|CUDA graph: off|CUDA kernels cannot run here|plexus' CUDA kernel failed"

# step NAME CMD...: run CMD under the limit the group table gives NAME, log to G/NAME.log; skipped
# when the command's budget cannot hold that limit any more. (`train.cuda_graphs: off` logs no
# "CUDA graph: off" line: only a graph that auto or on could not capture does.)
step() {
    local name="$1"
    shift
    local limit
    limit="$(awk -v n="$name" '$1 == n { print $2 }' <<<"${STEPS[$GROUP]}")"
    [[ -n "$limit" ]] || { echo "gpu-check.sh: step $name is not in group $GROUP's table" >&2; exit 3; }
    # The limits are a GPU's; a dry run on a CPU (tests, a shared 2-core machine) gets 6× as long.
    [[ $DEV == cpu ]] && limit=$((limit * 6))
    local left=$((BUDGET - SECONDS))
    # Once a step of a group is skipped, so are the rest (its comparisons need the skipped runs).
    if ((GROUP_SKIPPING || limit + 10 > left)); then
        GROUP_SKIPPING=1
        echo "== $GROUP/$name: SKIPPED (its limit of ${limit} s does not fit the ${left} s left of --budget $BUDGET)"
        RESULTS+=("$(printf '%-26s %-18s %4d s of %4d' "$name" "SKIPPED (budget)" 0 "$limit")")
        SKIPPED=1
        FAILED=1
        archive
        return 0
    fi
    local t0=$SECONDS
    echo "== $GROUP/$name (limit ${limit} s): $*" | tee "$G/$name.log"
    # In the background and waited for, so that a TERM to this script is handled at once.
    timeout --kill-after=10 "$limit" "$@" >>"$G/$name.log" 2>&1 &
    CHILD=$!
    CURRENT_STEP="$name"
    wait "$CHILD"
    local rc=$?
    CHILD=""
    CURRENT_STEP=""
    local dt=$((SECONDS - t0))
    local verdict=ok
    if [[ $rc == 124 || $rc == 137 ]]; then
        verdict="TIMEOUT"
    elif [[ $rc != 0 ]]; then
        verdict="FAILED (exit $rc)"
    elif [[ $DEV != cpu ]] && grep -Eq "$FAIL_PATTERN" "$G/$name.log"; then
        verdict="FAILED (log)"
        grep -E "$FAIL_PATTERN" "$G/$name.log" | head -3
    fi
    [[ $verdict == ok ]] || FAILED=1
    tail -n +2 "$G/$name.log" | tail -n 12
    echo "== $GROUP/$name: $verdict in ${dt} s"
    RESULTS+=("$(printf '%-26s %-18s %4d s of %4d' "$name" "$verdict" "$dt" "$limit")")
    archive
}

# skip NAME WHY: a step that cannot run on this machine (counts as a failure: nothing was measured).
skip() {
    echo "== $GROUP/$1: SKIPPED ($2)" | tee "$G/$1.log"
    RESULTS+=("$(printf '%-26s %-18s %s' "$1" "SKIPPED" "$2")")
    FAILED=1
    archive
}

# Whether $PY can run the PyTorch references (torch, PyYAML, safetensors); says what is missing.
python_references() {
    "$PY" -c 'import torch, yaml, safetensors' 2>"$G/python-imports.log" && return 0
    tail -n 1 "$G/python-imports.log" >&2
    return 1
}

# The running group's summary and archive, rewritten after every step: a command killed from
# outside still leaves what its finished steps measured.
archive() {
    [[ -n $G && -d $G ]] || return 0
    {
        cat "$G/about.txt"
        echo "steps:"
        printf '  %s\n' "${RESULTS[@]}"
        echo "group time: $((SECONDS - GROUP_T0)) s"
    } >"$G/summary.txt"
    # Everything but model weights and checkpoints. (Exit status 1: a file changed while read,
    # a log still being written; the archive is whole all the same.)
    local tmp="$OUTDIR/gpu-check-$GROUP.tar.gz.tmp" rc=0
    tar -czf "$tmp" --warning=no-file-changed -C "$WORK_ROOT" \
        --exclude='*.safetensors' --exclude='checkpoints' --exclude='*.bin' "$GROUP" || rc=$?
    if ((rc <= 1)); then
        mv "$tmp" "$OUTDIR/gpu-check-$GROUP.tar.gz"
    else
        rm -f "$tmp"
        echo "gpu-check.sh: could not archive $G (tar exit $rc)" >&2
    fi
}

CHILD=""
CURRENT_STEP=""
SKIPPED=0
GROUP_SKIPPING=0
GROUP_T0=$SECONDS
on_signal() {
    echo "gpu-check.sh: stopped by a signal during ${GROUP:-?}/${CURRENT_STEP:-(between steps)}" >&2
    if [[ -n $CHILD ]]; then
        # timeout passes the TERM on to the step (and KILLs it 10 s later): its last lines reach the log.
        kill -TERM "$CHILD" 2>/dev/null
        wait "$CHILD" 2>/dev/null
    fi
    RESULTS+=("$(printf '%-26s %-18s' "${CURRENT_STEP:-(between steps)}" "STOPPED (signal)")")
    archive
    exit 143
}
trap on_signal TERM INT HUP

GPU=(--set "device=$DEV" --set precision=bf16 --quiet --overwrite)

group_doctor() {
    [[ $DEV == cpu ]] || step nvidia-smi nvidia-smi
    step doctor "$PLEXUS" doctor
    step selftest "$PLEXUS" doctor --selftest --device "$DEV"
}

group_kernels() {
    local cfg=bench/configs/gpu/slot-kernels.yaml
    # Eager steps here (a fault inside a captured graph would not name its kernel): group `graphs`
    # checks the capture.
    local k=(env PLEXUS_CUDA_SYNC_CHECK=1 PLEXUS_COUNT_SYNCS=1 "$PLEXUS" train "$cfg" --quiet --overwrite
        --set "device=$DEV" --set train.cuda_graphs=off ${QUICK[@]+"${QUICK[@]}"})
    step hyper-fp32 "${k[@]}" --set topology.kind=hyper --out "$G/runs/hyper-fp32"
    step mhc-fp32 "${k[@]}" --set topology.kind=mhc --out "$G/runs/mhc-fp32"
    step attnres-fp32 "${k[@]}" --set topology.kind=attnres --out "$G/runs/attnres-fp32"
    # bf16 on a CPU takes minutes for this model (no bf16 matrix units): a CPU dry run skips it.
    if [[ $DEV != cpu ]]; then
        step hyper-bf16 "${k[@]}" --set topology.kind=hyper --set precision=bf16 --out "$G/runs/hyper-bf16"
        step mhc-bf16 "${k[@]}" --set topology.kind=mhc --set precision=bf16 --out "$G/runs/mhc-bf16"
    fi
    local c=(env PLEXUS_FUSED_KERNELS=0 "$PLEXUS" train "$cfg" --quiet --overwrite --set "device=$DEV"
        --set train.cuda_graphs=off ${QUICK[@]+"${QUICK[@]}"})
    step hyper-fp32-composite "${c[@]}" --set topology.kind=hyper --out "$G/runs/hyper-fp32-composite"
    step mhc-fp32-composite "${c[@]}" --set topology.kind=mhc --out "$G/runs/mhc-fp32-composite"
    step attnres-fp32-composite "${c[@]}" --set topology.kind=attnres --out "$G/runs/attnres-fp32-composite"
    # fp32, same seed and batches: the logged losses agree to 1e-5 at step 0 and 2e-3 after 30
    # AdamW updates (summation order differs between the kernels and the composite graph).
    step fused-follows-composite "$PY" "$ROOT/scripts/compare-losses.py" "$G/runs" hyper-fp32 hyper-fp32-composite \
        mhc-fp32 mhc-fp32-composite attnres-fp32 attnres-fp32-composite
    # The bf16 step's CUDA kernels (the language-model loss, the pre-norms written in bf16, RoPE;
    # Hyper-Connections' dynamic logits, mHC's RMS projection, H-ACN's update) against libtorch's
    # composite operators: they round in other places (RoPE rounds once where the composite rounds
    # twice), so within one bf16 unit (2⁻⁸) at step 0, not fp32's 1e-5 (the same paths on a CPU,
    # PLEXUS_FUSED_KERNELS=cuda-host, already differ from the composite by more than 1e-5), then
    # bf16 roundings apart.
    if [[ $DEV != cpu ]]; then
        step residual-bf16 "${k[@]}" --set topology.kind=residual --set precision=bf16 --out "$G/runs/residual-bf16"
        step residual-bf16-composite "${c[@]}" --set topology.kind=residual --set precision=bf16 \
            --out "$G/runs/residual-bf16-composite"
        step hyper-bf16-composite "${c[@]}" --set topology.kind=hyper --set precision=bf16 \
            --out "$G/runs/hyper-bf16-composite"
        step mhc-bf16-composite "${c[@]}" --set topology.kind=mhc --set precision=bf16 \
            --out "$G/runs/mhc-bf16-composite"
        step hacn-bf16 "${k[@]}" --set topology.kind=hacn --set precision=bf16 --out "$G/runs/hacn-bf16"
        step hacn-bf16-composite "${c[@]}" --set topology.kind=hacn --set precision=bf16 \
            --out "$G/runs/hacn-bf16-composite"
        step bf16-kernels-follow-composite "$PY" "$ROOT/scripts/compare-losses.py" --first 4e-3 --later 5e-2 "$G/runs" \
            residual-bf16 residual-bf16-composite hyper-bf16 hyper-bf16-composite mhc-bf16 mhc-bf16-composite \
            hacn-bf16 hacn-bf16-composite
    fi
    # Every fused run's sync line: 0 syncs on the steps that read nothing.
    step syncs bash -c 'bad=0; for f in "$1"/hyper-*.log "$1"/mhc-*.log "$1"/hacn-*.log "$1"/attnres-*.log; do
        [[ -e $f ]] || continue  # a pattern without a match (the bf16 runs are not made on a CPU)
        case "$f" in *composite*) continue;; esac
        line=$(grep "host-device syncs counted by libtorch" "$f") || { echo "$f: no sync line"; bad=1; continue; }
        echo "$(basename "$f"): $line"
        grep -q ": 0 on the " <<<"$line" || bad=1
    done; exit $bad' _ "$G"
}

group_graphs() {
    # The same runs captured (train.cuda_graphs: on) and eager, fp32, 30 steps, logged every 5:
    # the captured runs' losses must follow the eager ones (the same kernels; 1e-5 at step 0,
    # 1e-3 after 30 updates).
    local cfg=bench/configs/gpu/slot-kernels.yaml
    local t=("$PLEXUS" train "$cfg" --quiet --overwrite --set "device=$DEV" --set log.every=5 ${QUICK[@]+"${QUICK[@]}"})
    local graph=(--set train.cuda_graphs=on) eager=(--set train.cuda_graphs=off)
    [[ $DEV == cpu ]] && graph=(--set train.cuda_graphs=auto)
    local topo
    for topo in residual hyper mhc; do
        step "$topo-graph" env PLEXUS_COUNT_SYNCS=1 "${t[@]}" --set topology.kind=$topo "${graph[@]}" --out "$G/runs/$topo-graph"
        step "$topo-eager" "${t[@]}" --set topology.kind=$topo "${eager[@]}" --out "$G/runs/$topo-eager"
    done
    # Dropout inside a replay: the generator's state at replay time (trains, finite, close to eager).
    step dropout-graph "${t[@]}" --set model.dropout=0.1 "${graph[@]}" --out "$G/runs/dropout-graph"
    step graphs-follow-eager "$PY" "$ROOT/scripts/compare-losses.py" --later 1e-3 "$G/runs" residual-graph residual-eager \
        hyper-graph hyper-eager mhc-graph mhc-eager
    # What a replay buys where launches dominate: the paper Mixer's step, captured and eager.
    [[ $DEV == cpu ]] && return 0  # (a CPU dry run stops here: the paper Mixer is GPU-sized)
    local mixer=bench/configs/gpu/mixer.yaml
    step bench-mixer-graph "$PLEXUS" bench "$mixer" --compare residual,hacn,hyper,mhc --steps 10 --warmup 3 \
        --csv "$G/overhead.csv" --case mixer-graph
    step bench-mixer-eager "$PLEXUS" bench "$mixer" --compare residual,hacn,hyper,mhc --steps 10 --warmup 3 \
        --set train.cuda_graphs=off --csv "$G/overhead.csv" --case mixer-graph-off
}

group_bench() {
    local gpt=bench/configs/gpu/gpt.yaml
    local all=residual,hacn,ancre,denseformer,hyper,mhc,attnres
    step gpt-residual "$PLEXUS" bench "$gpt" --steps 20 --warmup 5 --csv "$G/raw.csv" --case gpt/residual
    step gpt-residual-eager "$PLEXUS" bench "$gpt" --steps 20 --warmup 5 --set train.cuda_graphs=off \
        --csv "$G/raw.csv" --case gpt/residual-eager
    step gpt-compare "$PLEXUS" bench "$gpt" --compare "$all" --steps 10 --warmup 3 --csv "$G/overhead.csv" --case gpt
    step gpt-compare-eager "$PLEXUS" bench "$gpt" --compare "$all" --steps 10 --warmup 3 --set train.cuda_graphs=off \
        --csv "$G/overhead.csv" --case gpt-eager
}

group_profile() {
    local gpt=bench/configs/gpu/gpt.yaml topo
    for topo in residual hyper mhc attnres; do
        step "gpt-$topo" "$PLEXUS" bench "$gpt" --set topology.kind=$topo --steps 5 --warmup 3 --profile \
            --trace "$G/trace-gpt-$topo.json" --case "gpt/$topo"
    done
}

group_bench-more() {
    local gpt=bench/configs/gpu/gpt.yaml llama=bench/configs/gpu/llama.yaml mixer=bench/configs/gpu/mixer.yaml
    step gpt-composite env PLEXUS_FUSED_KERNELS=0 "$PLEXUS" bench "$gpt" --compare residual,hyper,mhc --steps 10 \
        --warmup 3 --csv "$G/overhead.csv" --case gpt-composite
    step llama-residual "$PLEXUS" bench "$llama" --steps 20 --warmup 5 --csv "$G/raw.csv" --case llama/residual
    step llama-compare "$PLEXUS" bench "$llama" --compare residual,hacn,ancre,hyper,mhc --steps 10 --warmup 3 \
        --csv "$G/overhead.csv" --case llama
    local all=residual,hacn,ancre,denseformer,hyper,mhc,attnres
    step mixer-compare "$PLEXUS" bench "$mixer" --compare "$all" --steps 10 --warmup 3 --csv "$G/overhead.csv" --case mixer
    step mixer-compare-eager "$PLEXUS" bench "$mixer" --compare "$all" --steps 10 --warmup 3 \
        --set train.cuda_graphs=off --csv "$G/overhead.csv" --case mixer-eager
}

group_parity() {
    if ! python_references; then
        skip parity "$PY cannot import torch, yaml and safetensors (scripts/gpu-slot-pack.sh packs the last two)"
        return 0
    fi
    step parity "$PLEXUS" parity --device "$DEV"
}

group_bench-torch() {
    local gpt=bench/configs/gpu/gpt.yaml llama=bench/configs/gpu/llama.yaml
    local b=(env PYTHONUNBUFFERED=1 "$PY" parity/bench.py)
    if ! python_references; then
        local s
        for s in gpt-paired llama-paired ratios; do
            skip "$s" "$PY cannot import torch, yaml and safetensors (scripts/gpu-slot-pack.sh packs the last two)"
        done
        return 0
    fi
    # torch.compile's Triton builds a helper with the C compiler against Python.h on first use.
    local no_compile=""
    command -v "${CC:-cc}" >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || no_compile="no C compiler (cc, gcc)"
    "$PY" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
        2>/dev/null || no_compile="${no_compile:+$no_compile, }no Python.h for $PY"
    # plexus, eager and compiled, back to back in one step per model: the ratio is paired.
    local m cfg impl
    for m in gpt llama; do
        cfg=bench/configs/gpu/$m.yaml
        local cmds="\"\$1\" bench $cfg --steps 20 --warmup 5 --csv $G/raw.csv --case $m/residual"
        cmds+=" && ${b[*]} $cfg --mode eager --steps 20 --warmup 5 --csv $G/raw.csv --case $m/residual"
        if [[ -n $no_compile ]]; then
            echo "torch.compile cannot build here: $no_compile" >>"$G/about.txt"
        else
            cmds+=" && ${b[*]} $cfg --mode compile --steps 20 --warmup 5 --csv $G/raw.csv --case $m/residual"
        fi
        step "$m-paired" bash -c "$cmds" _ "$PLEXUS"
    done
    step ratios "$PY" "$ROOT/scripts/slot-results.py" "$G"
}

group_train() {
    local s=(--set train.steps=300 --set log.eval_every=100)
    step train-mixer-hacn "$PLEXUS" train configs/mixer-fmnist/cpu/hacn.yaml "${GPU[@]}" "${s[@]}" --out "$G/runs/mixer-hacn"
    step train-mixer-res "$PLEXUS" train configs/mixer-fmnist/cpu/res.yaml "${GPU[@]}" "${s[@]}" --out "$G/runs/mixer-res"
    step train-mixer-mhc "$PLEXUS" train configs/mixer-fmnist/cpu/res.yaml "${GPU[@]}" "${s[@]}" --set topology.kind=mhc \
        --set name=mixer-fmnist-mhc --out "$G/runs/mixer-mhc"
    step train-gpt-hacn "$PLEXUS" train configs/gpt2/cpu/hacn-bpe.yaml "${GPU[@]}" "${s[@]}" --out "$G/runs/gpt-hacn"
    step train-llama-ancre "$PLEXUS" train configs/llama/cpu/ancre-bpe.yaml "${GPU[@]}" "${s[@]}" --out "$G/runs/llama-ancre"
    step analyze "$PLEXUS" analyze "$G/runs/mixer-hacn" "$G/runs/mixer-res"
    step plot "$PLEXUS" plot "$G/runs/mixer-hacn" "$G/runs/mixer-res" --out "$G/figures"
    step train-dit-ancre "$PLEXUS" train configs/dit-fmnist/cpu/ancre.yaml "${GPU[@]}" "${s[@]}" --out "$G/runs/dit-ancre"
    step sample-dit "$PLEXUS" sample "$G/runs/dit-ancre" --device "$DEV" --cfg 2
    step fd-dit "$PLEXUS" fd "$G/runs/dit-ancre" --extractor "$G/runs/mixer-res" --samples 500 --device "$DEV"
}

for GROUP in "${GROUPS_ASKED[@]}"; do
    G="$WORK_ROOT/$GROUP"
    rm -rf "$G"
    mkdir -p "$G"
    RESULTS=()
    {
        echo "group $GROUP at $HEAD_COMMIT (binary: $BINARY_COMMIT)"
        date -u
        nvidia-smi -L 2>/dev/null || echo "nvidia-smi: none"
    } >"$G/about.txt"
    GROUP_T0=$SECONDS
    GROUP_SKIPPING=0
    "group_$GROUP"
    archive
    echo
    cat "$G/summary.txt"
    echo "archive: $OUTDIR/gpu-check-$GROUP.tar.gz ($(du -h "$OUTDIR/gpu-check-$GROUP.tar.gz" | cut -f1))"
done
((SKIPPED)) && echo "gpu-check.sh: steps were skipped for --budget $BUDGET (above): run their groups again" >&2
exit $FAILED
