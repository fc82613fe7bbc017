#!/usr/bin/env bash
# The whole test suite on a GPU machine whose image brings its own torch (no uv environment), as run on the
# lent H200: one test file per worker (a module's fixtures, e.g. test_posts' eleven runs, are made once),
# each test bounded, every result line kept. Writes OUTDIR/pytest.txt; about 6 minutes on an H200 with 16 cores.
# Usage: bash tests/gpu_suite.sh OUTDIR [pytest args...]   (liger-kernel is used if importable)
set -u
out=${1:?usage: gpu_suite.sh OUTDIR [pytest args]}; shift
mkdir -p "$out"
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
python3 -c "import sys, torch, triton, numpy, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, numpy.__version__, transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
# SIGINT at the limit: pytest still prints its summary of what failed so far.
timeout -s INT -k 20 "${SUITE_S:-540}" python3 -m pytest -n "${WORKERS:-10}" --dist loadfile -v --tb=short \
  -p no:cacheprovider --timeout 300 -rfEs --durations=20 "$@" tests > "$out/pytest.txt" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.txt" | tail -30
exit $rc
