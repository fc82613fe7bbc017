#!/usr/bin/env bash
# How the whole-decoder traces tests/data/h200_model_*.json.gz are recorded: on one NVIDIA H200 (torch 2.11,
# triton 3.6, transformers 5.17, the device image's python3), 06_model.py at 4 layers of the Gemma-2B shape
# (vocab 32000), batch 1, seq 512, bf16, 3 active steps: prefill and decode, eager, compiled, with CUDA graphs,
# and with the suite's fused MLP. The compiled runs warm up first (--warmup 3) so that compiling and capturing
# the CUDA graph happen before the profiler starts. About 2-3 minutes of GPU time, most of it compiling.
# Usage: bash tests/data/record_h200_model.sh OUTDIR   (writes OUTDIR/h200_model_*.json.gz and OUTDIR/log.txt)
set -u
out=${1:?usage: record_h200_model.sh OUTDIR}
mkdir -p "$out/raw"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
shape=(--preset gemma-2b --layers 4 --batch 1 --seq 512)
rec() {  # rec NAME ARGS...: run 06_model.py, keep its trace as h200_model_NAME.json.gz
  local name=$1; shift
  echo "=== $name: 06_model.py ${shape[*]} $*"
  "$py" 06_model.py "${shape[@]}" "$@" --gzip --out "$out/raw/$name" || echo "!!! $name failed with $?"
  local t; t=$(find "$out/raw/$name" -name '*.json.gz' | head -1)
  [ -n "$t" ] && cp "$t" "$out/h200_model_$name.json.gz"
}
{
  rec prefill_eager --phase prefill
  rec decode_eager --phase decode
  rec decode_compile --phase decode --compile --warmup 3
  rec decode_cudagraphs --phase decode --cuda-graphs --warmup 3
  rec prefill_fused --phase prefill --mlp fused
  rec decode_fused --phase decode --mlp fused
} 2>&1 | tee "$out/log.txt"
