#!/usr/bin/env bash
# The whole test suite on a GPU machine whose image brings its own torch (no uv environment), as run on the
# lent H200: one test file per worker (a module's fixtures, e.g. test_posts' eleven runs, are made once),
# each test bounded, every result line kept. Writes OUTDIR/pytest.txt and OUTDIR/pytest_readme.txt; about 6 minutes
# on an H200 with 16 cores.
# Usage: bash tests/gpu_suite.sh OUTDIR [pytest args...]   (liger-kernel is used if importable)
set -u
out=${1:?usage: gpu_suite.sh OUTDIR [pytest args]}; shift
mkdir -p "$out"
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
# The reader (reader/trace_reader) is a workspace member that `uv run` installs; the image has no uv: on the path.
export PYTHONPATH="$PWD/reader${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import sys, torch, triton, numpy, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, numpy.__version__, transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
# SIGINT at the limit: pytest still prints its summary of what failed so far.
run() {  # run OUTFILE PYTEST_ARGS...
  local file=$1; shift
  timeout -s INT -k 20 "${SUITE_S:-540}" python3 -m pytest -v --tb=short -p no:cacheprovider --timeout 300 -rfEs \
    --durations=20 "$@" > "$file" 2>&1
}
# test_readme.py runs each command of the README and the docs pages in a fresh process (about 45): one worker alone
# took 9 minutes, so its tests spread over workers of their own (each command runs once: conftest.SharedRuns), beside
# the others.
run "$out/pytest_readme.txt" -n "${README_WORKERS:-6}" --dist load tests/test_readme.py &
readme=$!
run "$out/pytest.txt" -n "${WORKERS:-10}" --dist loadfile --ignore tests/test_readme.py "$@" tests
rc=$?
wait $readme
rc_readme=$?
for f in "$out/pytest.txt" "$out/pytest_readme.txt"; do
  echo "== $f"; grep -E "^(FAILED|ERROR) |^=+ .*(passed|failed|error)" "$f" | tail -30
done
exit $(( rc || rc_readme ))
