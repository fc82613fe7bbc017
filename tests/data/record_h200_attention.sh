#!/usr/bin/env bash
# How the committed attention traces tests/data/h200_attention_*.json.gz and results/bench_attention_h200.*
# are recorded: on one NVIDIA H200 (torch 2.11, triton 3.6, the device image's python3), 05_attention.py
# at its defaults (batch 4 x 2048, 32 heads, 8 KV heads, head_dim 128; 3 active steps, cold, bf16), then
# bench_attention.py at its default shapes. About 3-4 minutes of GPU time in all (most of it compiling).
# Usage: bash tests/data/record_h200_attention.sh OUTDIR
#   writes OUTDIR/h200_attention_*.json.gz, OUTDIR/bench_attention_h200.{json,txt} and OUTDIR/log.txt
set -u
out=${1:?usage: record_h200_attention.sh OUTDIR}
mkdir -p "$out/raw"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rec() {  # rec NAME ARGS...: run 05_attention.py, keep its trace as h200_attention_NAME.json.gz
  local name=$1; shift
  echo "=== $name: 05_attention.py $*"
  "$py" 05_attention.py "$@" --gzip --out "$out/raw/$name" || echo "!!! $name failed with $?"
  local t; t=$(find "$out/raw/$name" -name '*.json.gz' | head -1)
  [ -n "$t" ] && cp "$t" "$out/h200_attention_$name.json.gz"
}
{
  rec math --impl math
  rec sdpa --impl sdpa
  rec flex --impl flex
  rec decode_flash --impl sdpa --backend flash --decode
  echo "=== bench_attention.py"
  "$py" bench_attention.py --out "$out/bench_attention_h200.json" || echo "!!! bench_attention.py failed with $?"
} 2>&1 | tee "$out/log.txt"
