"""results/fused_mlp_runs.sh, the recipe of the fused MLP's GPU records, without a GPU: every step's command line is
one its script accepts (each script's own parse_args, here, of what a stand-in python was asked to run), the steps run
in the order asked, a step that fails says so, and an unknown step is refused with one line and exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import bench
import bench_train
import tune_fused

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "results" / "fused_mlp_runs.sh"

# Stands in for python3 (no torch imported: fast): `-c CODE` prints a versions line; `SCRIPT ARGS` appends them to
# calls.txt as one JSON list. A made-up failure for tune_fused.py.
STAND_IN = """#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    print("3.12 2.11 3.6 2.5 5.17 a made-up GPU")
    sys.exit(0)
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(3 if sys.argv[1] == "tune_fused.py" and os.environ.get("FAIL_TUNE") else 0)
"""
PARSERS = {"bench.py": bench.parse_args, "bench_train.py": bench_train.parse_args, "tune_fused.py": tune_fused.parse_args}


def run(tmp_path, *steps, **env):
    shim = tmp_path / "python"
    shim.write_text(STAND_IN.format(python=sys.executable))
    shim.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    done = subprocess.run(["bash", str(RECIPE), str(tmp_path / "out"), *steps], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHON": str(shim), "CALLS": str(calls), **env})
    calls = [json.loads(line) for line in calls.read_text().splitlines()]
    for script, *argv in calls:
        PARSERS[script](argv)  # a flag its script does not take: SystemExit here
    return done, [" ".join(c) for c in calls]


def test_every_step_is_a_command_its_script_accepts(tmp_path):
    done, calls = run(tmp_path, "widths", "train", "swiglu", "models")
    assert done.returncode == 0, done.stderr
    assert [c.split()[0] for c in calls] == ["bench.py", "bench_train.py", "bench.py", "bench.py"]
    widths = calls[0].split("--shapes ")[1].split()[0].split(",")
    assert "300x1000x2730" in widths and "40x2048x1408" in widths and len(widths) == len(set(widths))
    assert "--sweep swiglu" in calls[2] and "--sweep models" in calls[3]
    for name in ("widths", "train", "swiglu", "models"):
        assert f"=== {name}: exit 0" in done.stdout
        assert (tmp_path / "out" / f"{name}.log").exists()


def test_a_failed_tuning_copies_no_table_and_says_its_exit(tmp_path):
    done, calls = run(tmp_path, "narrow", FAIL_TUNE="1")
    assert calls == ["tune_fused.py --narrow-only"]
    assert "=== narrow: exit 3" in done.stdout and not (tmp_path / "out" / "fused_geglu_tuned.json").exists()


def test_an_unknown_step_is_one_line_and_exit_2(tmp_path):
    done, calls = run(tmp_path, "widths", "bogus")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "no step 'bogus'" in done.stderr
    assert len(calls) == 1  # the steps before it ran
