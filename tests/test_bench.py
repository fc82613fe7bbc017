"""bench.py: one clear line and exit code 2 without a GPU or with bad flags; a real run on a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args, hide_gpu=False, timeout=120):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the same CPU-machine path on any machine
    return subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_no_gpu_one_line_exit_2(tmp_path):
    proc = run_bench("--out", str(tmp_path / "b.json"), hide_gpu=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("bench.py needs a CUDA GPU; ")
    assert "Traceback" not in proc.stderr and not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("flags", [["--shapes", "8192x768"], ["--shapes", "0x768x3072"], ["--dtype", "fp8"]])
def test_bad_flags_one_line_exit_2(flags):
    proc = run_bench(*flags, hide_gpu=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("bench.py: ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run_writes_record(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_bench("--shapes", "512x256x1024", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["device"] == torch.cuda.get_device_name() and record["ceiling_tflops"] > 0
    (shape,) = record["shapes"]
    assert {"eager", "compile", "fused"} <= set(shape["variants"])
    for v in shape["variants"].values():
        assert v["median_us"] > 0 and v["graph_median_us"] > 0 and v["rel_err"] < 2e-2
    assert str(out) in proc.stdout


def test_table_from_a_record(capsys):
    # The printing path on the CPU too: a record shaped like the GPU run's, numbers made up.
    import bench
    variants = {name: {"median_us": us, "rounds_us": [us, us * 1.02, us * 0.99], "rel_err": 3e-3,
                       "graph_median_us": us - 5, "graph_rounds_us": [us - 5] * 3}
                for name, us in [("eager", 250.0), ("compile", 240.0), ("liger", 230.0), ("fused", 190.0)]}
    record = {"M": 8192, "dim": 768, "hidden": 3072, "flops": 2 * 8192 * 768 * 3072 * 3, "floor_us": 170.0,
              "variants": variants, "skipped": [], "parts": {"fused geglu kernel": 130.0, "cuBLAS down_proj GEMM": 55.0}}
    bench.print_shape(record, ceiling=680.0)
    out = capsys.readouterr().out
    assert "fused vs best of the others: 1.21x (graph replays: 1.22x)" in out
    (fused_row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["fused"] and "vs" not in line]
    assert fused_row[4] == "0.89"  # of floor = 170 / 190
