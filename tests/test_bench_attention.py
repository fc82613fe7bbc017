"""bench_attention.py: the whole path on the CPU at tiny shapes, bad flags, and a real run on a GPU."""

import json

import pytest
import torch
from conftest import assert_ceilings_said

import bench_attention


def test_cpu_run_checks_times_and_records(tmp_path, capsys):
    out = tmp_path / "b.json"
    # One prefill shape and one decode shape (the second exercises the bottom-right aligned mask).
    assert bench_attention.main(["--device", "cpu", "--prefill", "1x64x4x2x16", "--decode", "2x96x4x2x16",
                                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["device_type"] == "cpu" and record["ceiling_tflops"] > 0 and record["copy_gbs"] > 0
    prefill, decode = record["shapes"]
    assert (prefill["shape"], prefill["decode"], decode["shape"], decode["decode"]) == (
        "1x64x4x2x16", False, "2x96x4x2x16", True)
    assert prefill["flops"] == 4 * 1 * 4 * 64 * 64 * 16 / 2 and decode["flops"] == 4 * 2 * 4 * 1 * 96 * 16
    assert decode["kv_bytes"] == 2 * 2 * 2 * 96 * 16 * 2
    for shape in record["shapes"]:
        # Every variant PyTorch runs on a CPU was checked and timed; the CUDA-only sdpa backends say why not.
        assert set(shape["variants"]) == {"math", "math compiled", "sdpa default", "sdpa flash", "flex compiled"}
        assert set(shape["skipped"]) == {"sdpa cudnn", "sdpa efficient"} and all(shape["skipped"].values())
        for v in shape["variants"].values():
            assert v["median_us"] > 0 and v["rel_err"] < 2e-2
            assert v["tflops"] == pytest.approx(shape["flops"] / v["median_us"] / 1e6)
        assert shape["fastest"] == min(shape["variants"], key=lambda n: shape["variants"][n]["median_us"])
    assert (tmp_path / "b.txt").read_text().splitlines()[0] in printed
    assert_ceilings_said(printed.splitlines()[0], record["ceiling_tflops"], record["copy_gbs"])
    assert printed.count("<- fastest") == 2


@pytest.mark.parametrize("flags", [["--prefill", "1x64x4x2"], ["--decode", "1x64x3x2x16"], ["--prefill", "0x8x4x2x16"],
                                   ["--dtype", "fp8"], ["--device", "tpu"]])
def test_bad_flags_one_line_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as done:
        bench_attention.parse_args(flags)
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("bench_attention.py: ")


def test_no_gpu_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_attention.main(["--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_attention.py needs a CUDA GPU") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run_writes_record(tmp_path):
    out = tmp_path / "b.json"
    assert bench_attention.main(["--prefill", "2x1024x16x4x128", "--decode", "8x2048x16x4x128", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["device"] == torch.cuda.get_device_name() and record["ceiling_tflops"] > 0 and record["copy_gbs"] > 0
    for shape in record["shapes"]:
        assert {"math", "math compiled", "sdpa default", "sdpa flash", "flex compiled"} <= set(shape["variants"])
        for v in shape["variants"].values():
            assert v["median_us"] > 0 and v["rel_err"] < 2e-2
