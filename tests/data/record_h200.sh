#!/usr/bin/env bash
# How the committed GPU traces tests/data/h200_*.json.gz were recorded: on one NVIDIA H200
# (torch 2.11, triton 3.6, the device image's python3; liger-kernel 0.8.5 from a wheel),
# with the suite's own scripts at the post's shapes, 3 active steps, cold runs.
# Usage: bash tests/data/record_h200.sh OUTDIR   (writes OUTDIR/*.json.gz and OUTDIR/log.txt)
set -u
out=${1:?usage: record_h200.sh OUTDIR}
mkdir -p "$out/raw"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rec() {  # rec NAME SCRIPT ARGS...: run a script, keep its trace as NAME.json.gz
  local name=$1 script=$2; shift 2
  echo "=== $name: $script $*"
  "$py" "$script" "$@" --gzip --out "$out/raw/$name" || echo "!!! $name failed with $?"
  local t; t=$(find "$out/raw/$name" -name '*.json.gz' | head -1)
  [ -n "$t" ] && cp "$t" "$out/h200_$name.json.gz"
}
{
  rec linear_eager 02_linear.py --batch 1024 --in_dim 32 --out_dim 64
  rec linear_compile 02_linear.py --batch 1024 --in_dim 32 --out_dim 64 --compile
  rec mlp_eager 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  rec mlp_compile 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --compile
  rec mlp_warm_eager 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --warmup 3
  rec mlp_small_eager 03_simple_mlp.py --batch 2 --seq 8 --dim 32 --hidden 64
  rec liger 03_kernels_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  rec fused_eager 04_fused_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  rec matmul_add_64_eager 01_matmul_add.py --size 64
  rec matmul_add_64_compile 01_matmul_add.py --size 64 --compile
  rec matmul_add_4096_eager 01_matmul_add.py --size 4096
  rec matmul_add_bmm_eager 01_matmul_add.py --size 64 --batched 4
} 2>&1 | tee "$out/log.txt"
