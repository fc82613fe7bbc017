#!/usr/bin/env bash
# The GPU runs behind the fused MLP's records in results/ (docs/04, docs/07): the MoE experts' table rows, the
# forward at widths the sweeps never list, the sweeps, and training's time and memory. Each step is bounded (its
# seconds, and STEP_S at most) so that one slow step leaves the next its turn; bench.py keeps what a cut-short step
# measured in OUTDIR/NAME.json.partial.
# Usage: bash results/fused_mlp_runs.sh OUTDIR STEP...   (the device image's python3, or PYTHON=...)
#   narrow   tune_fused.py --narrow-only: rewrites fused_geglu_tuned.json (copied to OUTDIR) with geglu_narrow rows
#   widths   bench.py at the widths no sweep lists: odd dims, MoE experts, Gemma-3-27B, and held-out models
#   models   bench.py --sweep models (GeGLU)
#   swiglu   bench.py --sweep swiglu (SwiGLU, against LigerSwiGLUMLP and compiled LlamaMLP)
#   train    bench_train.py's MLP forward + backward (time as CUDA graphs, peak memory) at model widths
# then: cp OUTDIR/fused_geglu_tuned.json . and OUTDIR/bench_*.{json,txt,png} into results/ under names that say
# the device (bench_fused_widths_h100.json, ...).
set -u
out=${1:?usage: fused_mlp_runs.sh OUTDIR STEP...}; shift
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# The reader (reader/trace_reader) is a workspace member that `uv run` installs; an image without uv: on the path.
export PYTHONPATH="$PWD/reader${PYTHONPATH:+:$PYTHONPATH}"
# The widths of issue 57's table (300x1000x2730 has dims not multiples of 8; 2048 -> 1408 at 2048 and 40 tokens is
# an MoE expert), then widths no table row or sweep was made at: OLMoE's and DeepSeek-V2's experts, Qwen2-57B-A14B's,
# Gemma-3-4B's, and the odd dims at one token.
WIDTHS=300x1000x2730,2048x2048x1408,40x2048x1408,64x4096x14336,640x5376x21504,96x2048x1024,700x5120x1536,3000x3584x2560,200x2560x10240,1x1000x2730
# Training at the widths issue 57 measured peak memory at: Qwen2-7B's and Qwen2-1.5B's MLPs, and Gemma-2B's at 600
# tokens.
TRAIN=4096x3584x14336,2048x1536x8960,600x2048x8192
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  (( limit > ${STEP_S:-600} )) && limit=$STEP_S
  echo "=== $name (at most ${limit} s): $*"
  timeout -s INT -k 15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $SECONDS s"
  tail -3 "$out/$name.log"
  return $rc
}
"$py" -c "import sys, torch, triton, numpy, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, numpy.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
for s in "$@"; do
  case $s in
    narrow) step narrow 240 "$py" tune_fused.py --narrow-only && cp fused_geglu_tuned.json "$out/" ;;
    widths) step widths 200 "$py" bench.py --max-autotune none --shapes "$WIDTHS" --out "$out/bench_widths.json" ;;
    models) step models 420 "$py" bench.py --sweep models --out "$out/bench_models.json" ;;
    swiglu) step swiglu 300 "$py" bench.py --sweep swiglu --max-autotune none --out "$out/bench_swiglu.json" ;;
    train) step train 200 "$py" bench_train.py --model none --variants eager,compile,liger,fused --shapes "$TRAIN" \
             --out "$out/bench_train_mlp.json" ;;
    *) echo "fused_mlp_runs.sh: no step '$s' (narrow, widths, models, swiglu, train)" >&2; exit 2 ;;
  esac
done
