"""05_attention.py at tiny shapes on the CPU, and trace_reader.memory on hand-built traces.

The script runs in this process (one torch import, one Inductor cache for the compiled runs), but flex: that is
the README's command, run once for both files (test_readme's run); each trace is read back with plain json
(test_scripts' helpers), not with the reader that printed the report.
"""

import gzip
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import common
import inspect_trace as it
from doc_pages import page
from test_readme import CPU_SHAPE, page_runs
from test_scripts import load, steps
from trace_reader.analyzers import memory

attention = importlib.import_module("05_attention")
DATA = Path(__file__).resolve().parent / "data"
# Prefill: the [1, 2, 512, 512] bf16 scores (1 MiB) outweigh every other activation (32 KiB each).
PREFILL = ["--batch", "1", "--seq", "512", "--heads", "2", "--kv_heads", "1", "--head_dim", "16"]
SMALL = ["--batch", "2", "--seq", "32", "--heads", "4", "--kv_heads", "2", "--head_dim", "16"]
SCORE_BYTES = 1 * 2 * 512 * 512 * 2


def run(monkeypatch, capsys, tmp_path, *args, device="cpu"):
    """(exit code, stdout, stderr, the trace written or None), as `python 05_attention.py ARGS` would give."""
    monkeypatch.setattr(sys, "argv", ["05_attention.py", *args, "--device", device, "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        common.main(attention.main)
    out, err = capsys.readouterr()
    traces = sorted(tmp_path.rglob("*.json"))
    return done.value.code, out, err, (traces[-1] if traces else None)


def memory_peaks(trace):
    """{ProfilerStep#k: max running total - total before the step's first [memory] event}, by plain json."""
    events = load(trace)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    peaks = {}
    for s in (e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")):
        inside = [e["args"] for e in mem if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        peaks[s["name"]] = max(a["Total Allocated"] for a in inside) - (inside[0]["Total Allocated"] - inside[0]["Bytes"])
    return peaks


def test_math_prefill_allocates_the_scores(monkeypatch, capsys, tmp_path):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, "--impl", "math", *PREFILL)
    assert code == 0, err
    assert "check: math attention vs fp32 math attention" in out and "BROKEN" not in out
    assert trace.name == "1x512x2x1x16_math_bf16_cold_eager.json"
    for names in steps(load(trace)).values():
        assert names.count("aten::bmm") == 2 and names.count("aten::_softmax") == 1 and "aten::triu" in names
    peaks = memory_peaks(trace)
    assert len(peaks) == 3 and all(p >= SCORE_BYTES for p in peaks.values())
    assert "allocates the [batch, heads, seq, seq] score matrix (1.0 MiB)" in out
    assert "peak allocation per step, above the step's start: #2 " in out


def test_sdpa_prefill_runs_one_cpu_kernel_and_no_scores(monkeypatch, capsys, tmp_path):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, "--impl", "sdpa", *PREFILL)
    assert code == 0, err
    assert "BROKEN" not in out and "never allocates the [batch, heads, seq, seq] score matrix" in out
    for names in steps(load(trace)).values():
        assert names.count("aten::_scaled_dot_product_flash_attention_for_cpu") == 1 and "aten::bmm" not in names
    assert all(p < SCORE_BYTES for p in memory_peaks(trace).values())


@pytest.mark.parametrize("impl", ["math", "sdpa"])
def test_decode_attends_to_the_cache(monkeypatch, capsys, tmp_path, impl):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, "--impl", impl, "--decode", *SMALL)
    assert code == 0, err
    assert "BROKEN" not in out and trace.name == f"2x32x4x2x16_{impl}{'_auto' if impl == 'sdpa' else ''}_decode_bf16_cold_eager.json"
    dims = {}
    for e in load(trace)["traceEvents"]:
        if e.get("ph") == "X" and "Input Dims" in e.get("args", {}):
            dims.setdefault(e["name"], []).append(e["args"]["Input Dims"])
    assert {tuple(d[0]) for d in dims["aten::linear"]} == {(2, 1, 64)}  # one new token per sequence
    if impl == "sdpa":  # q: 4 heads, 1 token; k: 2 KV heads, a cache of 32 entries
        assert {(tuple(d[0]), tuple(d[1])) for d in dims["aten::scaled_dot_product_attention"]} == {
            ((2, 4, 1, 16), (2, 2, 32, 16))}
    else:  # GQA expanded to 4 heads: [2 * 4, 1, 16] @ [2 * 4, 16, 32], the scores [8, 1, 32] @ [8, 32, 16]
        assert {tuple(map(tuple, d[:2])) for d in dims["aten::bmm"]} == {((8, 1, 16), (8, 16, 32)), ((8, 1, 32), (8, 32, 16))}


def test_gqa_backend_math_and_fp32(monkeypatch, capsys, tmp_path):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, "--impl", "sdpa", "--backend", "math", "--dtype", "fp32",
                                *SMALL)
    assert code == 0, err
    assert "BROKEN" not in out and "(tolerance 1e-04)" in out
    for names in steps(load(trace)).values():
        assert "aten::_scaled_dot_product_attention_math" in names


@pytest.mark.subprocess
def test_flex_compiled_on_the_cpu(shared_runs, tmp_path_factory):
    """The README's `uv run 05_attention.py --impl flex`, which test_readme runs at this shape: FlexAttention's
    compile (the suite's slowest on a CPU) once in the session, in a process of its own."""
    assert CPU_SHAPE["05_attention.py"] == PREFILL  # the shape SCORE_BYTES and the name below are of
    proc = page_runs(shared_runs, tmp_path_factory).run(["05_attention.py", "--impl", "flex"])
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    trace = Path(re.search(r"^wrote +(\S+\.json)$", out, flags=re.M).group(1)) if code == 0 else None
    if code == 2 and "FlexAttention does not compile for the CPU" in err:  # the script's one line on such a torch
        pytest.skip(err.strip())
    assert code == 0, err
    assert "check: flex attention vs fp32 math attention" in out and "BROKEN" not in out
    assert trace.name == "1x512x2x1x16_flex_bf16_cold_compile.json"  # always compiled, and named so
    assert out.startswith("05_attention: CPU, ") and ", bf16, compile, cold, " in out.splitlines()[0]
    for names in steps(load(trace)).values():
        assert any(n.startswith("Torch-Compiled Region") for n in names) and "aten::bmm" not in names
    assert all(p < SCORE_BYTES for p in memory_peaks(trace).values())


def test_math_compiled_fuses_the_softmax_chain(monkeypatch, capsys, tmp_path):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, "--impl", "math", "--compile", *SMALL)
    assert code == 0, err
    assert "BROKEN" not in out
    for names in steps(load(trace)).values():
        assert any("cpp_fused" in n and "softmax" in n for n in names) and "aten::_softmax" not in names


@pytest.mark.parametrize("args,says", [
    (["--impl", "sdpa", "--backend", "efficient"], "--backend efficient is CUDA-only; on a CPU, sdpa runs"),
    (["--impl", "sdpa", "--backend", "cudnn"], "--backend cudnn is CUDA-only; on a CPU, sdpa runs"),
    (["--heads", "3", "--kv_heads", "2"], "--heads 3 is not a multiple of --kv_heads 2"),
    (["--head_dim", "15"], "--head_dim 15 is odd"),
    (["--impl", "math", "--backend", "flash"], "--backend picks sdpa's kernel"),
    (["--impl", "paged"], "argument --impl: invalid choice"),
    (["--kv_heads", "0"], "argument --kv_heads: must be between 1"),
])
def test_bad_input_is_one_line_exit_2(monkeypatch, capsys, tmp_path, args, says):
    base = dict(zip(SMALL[::2], SMALL[1::2]))
    base.update(zip(args[::2], args[1::2]))
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, *[w for kv in base.items() for w in kv])
    assert code == 2 and trace is None
    assert err.startswith("05_attention.py: error: ") and says in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""  # refused before the run: no model built, nothing checked


# ---- trace_reader.memory on hand-built traces: other harnesses, hostile fields ---------------------------

def _trace(tmp_path, mem, device_type=0, gz=False):
    """Two active steps [0, 100) and [100, 200) and the given (ts, bytes, total) [memory] events."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 100 * i, "dur": 99,
               "pid": 1, "tid": 1} for i, n in enumerate((2, 3))]
    for item in mem:
        if isinstance(item, dict):
            events.append(item)
            continue
        ts, nbytes, total = item
        events.append({"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
                       "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": device_type, "Device Id": 0}})
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    raw = json.dumps({"traceEvents": events}).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return it.load_trace(path)


def test_step_peak_is_above_the_steps_start(tmp_path):
    # step #2 starts at 1000 allocated (weights), peaks at 1000 + 300; step #3 allocates 50, frees, allocates 80
    t = _trace(tmp_path, [(10, 200, 1200), (20, 100, 1300), (30, -300, 1000),
                          (110, 50, 1050), (120, -50, 1000), (130, 80, 1080)], gz=True)
    assert memory.step_peaks(t) == {2: 300, 3: 80}
    assert memory.describe_peaks(t, 1024, "the scores").endswith("#2 300 B, #3 80 B (the scores: 1.0 KiB)")


@pytest.mark.parametrize("bad", [
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": "9" * 400, "Total Allocated": 10**9, "Device Type": 0}},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": True, "Total Allocated": 10**9, "Device Type": 0}},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": 10**400, "Total Allocated": 10**9, "Device Type": 0}},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": 5, "Total Allocated": float("nan"), "Device Type": 0}},
    {"ph": "i", "name": "[memory]", "ts": "15", "args": {"Bytes": 5, "Total Allocated": 10**9, "Device Type": 0}},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": [5, 10**9]},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": 5, "Total Allocated": 10**9, "Device Type": "0"}},
    {"ph": "i", "name": "[memory]", "ts": 15, "args": {"Bytes": 5, "Total Allocated": 10**9, "Device Type": 1}},
])
def test_odd_memory_events_are_skipped(tmp_path, bad):
    # json.dumps writes NaN; the last one is a CUDA event in a CPU trace: not this device's memory
    t = _trace(tmp_path, [(10, 100, 100), bad, (20, -100, 0)])
    assert memory.step_peaks(t) == {2: 100, 3: 0}


def test_no_memory_events_is_said_not_guessed(tmp_path):
    t = _trace(tmp_path, [])
    (result,) = it.check(t, [memory.allocates(1, "the scores")])
    assert result[1] == "broken" and "profile_memory=True" in result[2]
    assert "no [memory] events" in memory.describe_peaks(t)


def test_streams_needs_a_gpu_trace_and_a_known_device(tmp_path):
    t = _trace(tmp_path, [])
    (result,) = it.check(t, [memory.streams("flash", 1e6, "the KV cache")])
    assert result[1] == "not applicable"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("args,kernel", [
    (["--impl", "sdpa", "--backend", "flash"], r"flash_fwd"),
    (["--impl", "sdpa", "--backend", "flash", "--decode"], r"splitkv"),
    (["--impl", "flex"], r"^triton_tem_fused_flex_attention"),
    (["--impl", "math"], r"(?i)softmax"),
])
def test_gpu_attention_kernels(monkeypatch, capsys, tmp_path, args, kernel):
    code, out, err, trace = run(monkeypatch, capsys, tmp_path, *args, "--batch", "2", "--seq", "1024", device="cuda")
    assert code == 0, err
    t = it.load_trace(trace)
    assert all(sum(bool(re.search(kernel, k.name)) for k in st.kernels) >= 1 for st in t.steps), out[-3000:]
    if "--decode" not in args:  # [2, 32, 1024, 1024] bf16 scores: 128 MiB, in memory for math only
        assert all((p >= 2 * 32 * 1024 * 1024 * 2) == (args[1] == "math") for p in memory.step_peaks(t).values())


def test_readme_score_matrix_size_is_the_defaults(monkeypatch, capsys, tmp_path):
    """The attention page's "1 GiB in bf16 at the defaults": [batch, heads, seq, seq] x 2 bytes, from --help's defaults."""
    code, out, _, _ = run(monkeypatch, capsys, tmp_path, "--help")
    assert code == 0
    default = {f: int(re.search(rf"^ +--{f} {f.upper()} .*?\(default: (\d+)\)", out, flags=re.M).group(1))
               for f in ("batch", "heads", "seq")}
    gib = default["batch"] * default["heads"] * default["seq"] ** 2 * 2 / 2**30
    assert f"{gib:g} GiB in bf16 at the defaults" in page("docs/05_attention.md")


# ---- the committed H200 traces (tests/data/record_h200_attention.sh), once they exist ----------------------

H200_SCORES = 4 * 32 * 2048 * 2048 * 2  # the defaults' bf16 scores: 1 GiB


def _h200(name):
    path = DATA / f"h200_attention_{name}.json.gz"
    if not path.exists():
        pytest.skip(f"{path.name} is not committed yet (bash tests/data/record_h200_attention.sh OUT on the H200)")
    return it.load_trace(path)


@pytest.mark.parametrize("name,has_scores", [("math", True), ("sdpa", False), ("flex", False)])
def test_h200_score_matrix_in_memory_only_for_math(name, has_scores):
    peaks = memory.step_peaks(_h200(name))
    assert peaks and all((p >= H200_SCORES) == has_scores for p in peaks.values()), peaks


@pytest.mark.parametrize("name,pattern", [("sdpa", r"cudnn|flash_fwd|fmha"), ("flex", r"^triton_tem_fused_flex_attention")])
def test_h200_one_attention_kernel_per_step(name, pattern):
    t = _h200(name)
    assert [sum(bool(re.search(pattern, k.name)) for k in st.kernels) for st in t.steps] == [1, 1, 1]
