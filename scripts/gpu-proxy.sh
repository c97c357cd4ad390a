#!/usr/bin/env bash
# The GPU step measured on a CPU (bench/README.md, "The GPU step's paths on a CPU"): the GPU bench
# configs (GPT-2 124M, LLaMA-130M; bf16) stepped once on the CPU at 1 and 4 sequences of 1,024
# tokens, with the composite operators (PLEXUS_FUSED_KERNELS=1, what a CPU runs) and with the paths
# a GPU step takes (cuda-host: plexus' CUDA kernels run by their host build), and GPT with
# Hyper-Connections, mHC and AttnRes at one sequence. Each run's `plexus bench --profile` output goes to
# OUT/<case>.txt: the operators that do work (a GPU's kernel launches) and the bytes they write by
# dtype. About 10 minutes on 2 cores; needs ~6 GB of memory.
#
#   scripts/gpu-proxy.sh [OUT]     # default bench/proxy
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" >/dev/null
OUT="${1:-$ROOT/bench/proxy}"
mkdir -p "$OUT"
cd "$ROOT"
# A copy of the binary, so that a rebuild while this runs does not change what is measured.
BIN="$(mktemp -d)/plexus"
cp "$ROOT/target/release/plexus" "$BIN"
trap 'rm -rf "$(dirname "$BIN")"' EXIT
step() {  # NAME CONFIG PATHS BATCH [--set …]
  local name="$1" config="$2" paths="$3" batch="$4"
  shift 4
  echo "$name" >&2
  {
    echo "# PLEXUS_FUSED_KERNELS=$paths plexus bench $config --device cpu --set data.batch_size=$batch $* --steps 1 --warmup 1 --profile"
    PLEXUS_FUSED_KERNELS="$paths" "$BIN" bench "$config" --device cpu --set "data.batch_size=$batch" "$@" \
      --steps 1 --warmup 1 --profile --trace "$OUT/.trace-$name.json" 2>&1
  } >"$OUT/$name.txt"
  rm -f "$OUT/.trace-$name.json"
}
for model in gpt llama; do
  for batch in 1 4; do
    step "$model-$batch-composite" "bench/configs/gpu/$model.yaml" 1 "$batch"
    step "$model-$batch-gpu-paths" "bench/configs/gpu/$model.yaml" cuda-host "$batch"
  done
done
for topology in hyper mhc attnres; do
  step "gpt-$topology-1-composite" bench/configs/gpu/gpt.yaml 1 1 --set "topology.kind=$topology"
  step "gpt-$topology-1-gpu-paths" bench/configs/gpu/gpt.yaml cuda-host 1 --set "topology.kind=$topology"
done
echo "written: $OUT/*.txt" >&2
