#!/usr/bin/env bash
# How the committed GPU traces tests/data/h200_*.json.gz are recorded: on one NVIDIA H200
# (torch 2.11, triton 3.6, the device image's python3; liger-kernel 0.8.5 from a wheel),
# with the suite's own scripts at the posts' shapes and the posts' loop: schedule(wait=1, warmup=1,
# active=3, repeat=1), `step(); prof.step()` with no synchronize per step, cold unless --warmup.
# Part 1's runs use the post's [size, size] bias; its schedule experiments are the last block.
# Usage: bash tests/data/record_h200.sh OUTDIR   (writes OUTDIR/h200_*.json.gz and OUTDIR/log.txt)
# then: cp OUTDIR/h200_*.json.gz tests/data/ && cp OUTDIR/log.txt tests/data/h200_record_log.txt
set -u
out=${1:?usage: record_h200.sh OUTDIR}
mkdir -p "$out/raw"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rec() {  # rec NAME SCRIPT ARGS...: run a script, keep its trace as h200_NAME.json.gz
  local name=$1 script=$2; shift 2
  echo "=== $name: $script $*"
  rm -rf "$out/raw/$name"
  "$py" "$script" "$@" --gzip --out "$out/raw/$name" || echo "!!! $name failed with $?"
  local t; t=$(find "$out/raw/$name" -name '*.json.gz' | head -1)
  [ -n "$t" ] && cp "$t" "$out/h200_$name.json.gz"
}
{
  # Part 2, as the post runs it
  rec linear_eager 02_linear.py --batch 1024 --in_dim 32 --out_dim 64
  rec linear_compile 02_linear.py --batch 1024 --in_dim 32 --out_dim 64 --compile
  rec mlp_eager 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  rec mlp_compile 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --compile
  rec mlp_warm_eager 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --warmup 3
  rec mlp_small_eager 03_simple_mlp.py --batch 2 --seq 8 --dim 32 --hidden 64
  rec liger 03_kernels_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  rec fused_eager 04_fused_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
  # Part 1, as the post runs it
  rec matmul_add_64_eager 01_matmul_add.py --size 64
  rec matmul_add_64_warm_eager 01_matmul_add.py --warmup
  rec matmul_add_64_compile 01_matmul_add.py --size 64 --compile
  rec matmul_add_4096_eager 01_matmul_add.py --size 4096
  rec matmul_add_4096_warm_eager 01_matmul_add.py --size 4096 --warmup
  rec matmul_add_4096_warm_compile 01_matmul_add.py --size 4096 --warmup --compile
  rec matmul_add_bmm_eager 01_matmul_add.py --size 64 --batched 4
  # Part 1's schedule experiments (the post edits the schedule; here they are flags)
  rec matmul_add_64_wait0_eager 01_matmul_add.py --size 64 --wait 0 --profiler-warmup 0
  rec matmul_add_4096_active20_eager 01_matmul_add.py --size 4096 --warmup --wait 0 --profiler-warmup 0 --active 20
  rec matmul_add_4096_active20_sync_eager 01_matmul_add.py --size 4096 --warmup --wait 0 --profiler-warmup 0 \
      --active 20 --sync-each-step
} 2>&1 | tee "$out/log.txt"
