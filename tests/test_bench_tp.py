"""bench_tp.py: its arithmetic on numbers written here, one real CPU run (gloo, 2 processes, a tiny shape), bad
flags, no GPU; and a real run on the GPUs present."""

import json

import pytest
import torch

import bench_tp


def test_summary_arithmetic_two_and_four_ranks():
    per_world = {1: {"8x4x16": {"1 GPU eager": 100.0, "1 GPU fused": 90.0}},
                 2: {"8x4x16": {"TP2 eager": 80.0, "TP2 eager sp": 90.0, "allreduce": 20.0}},
                 4: {"8x4x16": {"TP4 eager": 125.0, "allreduce": 50.0}}}
    s = bench_tp.summarize("8x4x16", per_world, torch.bfloat16, 1.0, 1.0)
    assert set(s["variants"]) == {"1 GPU eager", "1 GPU fused", "TP2 eager", "TP2 eager sp", "TP4 eager"}
    two, four = s["tp"]["2"], s["tp"]["4"]
    assert two["allreduce_bytes"] == four["allreduce_bytes"] == 8 * 4 * 2  # the [8, 4] bf16 output
    # 64 B / 20 µs = 0.0032 GB/s; all-reduce bus factor 2(2-1)/2 = 1
    assert two["algbw_gbs"] == pytest.approx(0.0032) and two["busbw_gbs"] == pytest.approx(0.0032)
    # 64 B / 50 µs = 0.00128 GB/s; factor 2(4-1)/4 = 1.5
    assert four["busbw_gbs"] == pytest.approx(0.00192)
    assert (two["allreduce_share"], two["speedup"]) == (pytest.approx(0.25), pytest.approx(1.25))
    assert (four["allreduce_share"], four["speedup"]) == (pytest.approx(0.4), pytest.approx(0.8))
    # bench.py's floor at 1 TFLOP/s: 6*8*4*16 = 3072 FLOP take 3072 / 1e6 µs
    assert s["floor_compute_us"] == pytest.approx(6 * 8 * 4 * 16 / 1e6)


def test_cpu_run_writes_a_record_marked_as_cpu(tmp_path, capsys):
    out = tmp_path / "tp.json"
    assert bench_tp.main(["--device", "cpu", "--shapes", "16x32x64", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["cpu_run"] is True and record["device_type"] == "cpu" and record["world_sizes"] == [1, 2]
    (s,) = record["shapes"]
    assert set(s["variants"]) == {"1 CPU eager", "TP2 eager", "TP2 eager sp", "TP2 eager chunks4"}
    t = s["tp"]["2"]
    assert t["allreduce_bytes"] == 16 * 32 * 4  # fp32 on a CPU
    assert t["busbw_gbs"] == pytest.approx(t["allreduce_bytes"] / t["allreduce_us"] / 1e3)  # factor 1 at N = 2
    assert t["allreduce_share"] == pytest.approx(t["allreduce_us"] / s["variants"]["TP2 eager"]["median_us"])
    assert t["speedup"] == pytest.approx(s["variants"]["1 CPU eager"]["median_us"] / s["variants"]["TP2 eager"]["median_us"])
    assert "a CPU run" in printed and (tmp_path / "tp.txt").is_file() and (tmp_path / "tp.png").is_file()


@pytest.mark.parametrize("flags", [["--shapes", "8x4"], ["--device", "tpu"], ["--shapes", "0x4x16"]])
def test_bad_flags_one_line_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as done:
        bench_tp.parse_args(flags)
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("bench_tp.py: ")


def test_hidden_that_does_not_split(tmp_path, capsys):
    assert bench_tp.main(["--device", "cpu", "--shapes", "8x4x15", "--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "8x4x15 does not split over 2 ranks" in err and len(err.strip().splitlines()) == 1


def test_no_gpu_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_tp.main(["--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_tp.py needs a CUDA GPU") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run(tmp_path):
    out = tmp_path / "tp.json"
    assert bench_tp.main(["--shapes", "2048x768x3072", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["cpu_run"] is False and record["world_sizes"][0] == 1
    (s,) = record["shapes"]
    assert {"1 GPU eager", "1 GPU fused"} <= set(s["variants"])
    assert set(s["tp"]) == {str(n) for n in record["world_sizes"][1:]}
