#!/usr/bin/env bash
# How the training-step traces tests/data/h200_train_*.json.gz are recorded: on one NVIDIA H200 (the device image's
# python3: torch 2.11, triton 3.6, transformers 5.17), 07_train_step.py in bf16, 3 active steps:
#   the post's MLP (64x128 tokens, 768 -> 3072) with AdamW for-loop, foreach and fused;
#   the same compiled (--warmup 3: compiling happens before the profiler starts);
#   four of those MLPs in a row, with and without --checkpoint, both --memory (compare their peaks and pictures);
#   06's Gemma-2B-shaped decoder at 2 layers, batch 4 x 512, plain and --memory (its picture and CUDA snapshot).
# About 2 minutes of GPU time, most of it starting Python and compiling.
# Usage: bash tests/data/record_h200_train.sh OUTDIR
#   writes OUTDIR/h200_train_*.json.gz (the fixtures), OUTDIR/*.memory.png|json (for the page),
#   OUTDIR/raw/ (everything the runs wrote, CUDA snapshots included) and OUTDIR/log.txt
set -u
out=${1:?usage: record_h200_train.sh OUTDIR}
mkdir -p "$out/raw"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
rec() {  # rec NAME ARGS...: run 07_train_step.py, keep its trace as h200_train_NAME.json.gz
  local name=$1; shift
  echo "=== $name: 07_train_step.py $*"
  "$py" 07_train_step.py "$@" --gzip --out "$out/raw/$name" || echo "!!! $name failed with $?"
  local t; t=$(find "$out/raw/$name" -name '*.json.gz' | head -1)
  [ -n "$t" ] && cp "$t" "$out/h200_train_$name.json.gz"
  local f
  for f in "$out/raw/$name"/07_train_step/*.memory.png "$out/raw/$name"/07_train_step/*.memory.json; do
    [ -e "$f" ] && cp "$f" "$out/h200_train_$name.memory.${f##*.}"
  done
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$py" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  "$py" -c "import torch.cuda._memory_viz as v; print('torch.cuda._memory_viz trace_plot:', hasattr(v, 'trace_plot'))"
  rec mlp_forloop --optim-impl for-loop
  rec mlp_foreach --optim-impl foreach
  rec mlp_fused --optim-impl fused
  rec mlp_compile --compile --warmup 3
  rec mlp4_memory --layers 4 --memory
  rec mlp4_ckpt_memory --layers 4 --checkpoint --memory
  rec gemma_2l --model gemma-2b --layers 2 --batch 4 --seq 512
  rec gemma_2l_memory --model gemma-2b --layers 2 --batch 4 --seq 512 --memory
} 2>&1 | tee "$out/log.txt"
