"""bench.py: one clear line and exit code 2 without a GPU or with bad flags; a real run on a GPU."""

import json
import os
import re
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


@pytest.mark.parametrize("flags", [["--shapes", "8192x768"], ["--shapes", "0x768x3072"], ["--dtype", "fp8"],
                                   ["--sweep", "llama"], ["--max-autotune", "sometimes"], ["--activation", "relu"]])
def test_bad_flags_one_line_exit_2(flags, capsys):
    import bench
    with pytest.raises(SystemExit) as exit_info:  # in-process: argparse runs before any GPU check
        bench.parse_args(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("bench.py: ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run_writes_record(tmp_path):
    out = tmp_path / "bench.json"
    # A decode shape (memory-bound, small-M kernels, graph replays) and a larger one (compute-bound).
    proc = run_bench("--shapes", "1x256x1024,4096x256x1024", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["device"] == torch.cuda.get_device_name()
    assert record["ceiling_tflops"] > 0 and record["copy_tbps"] > 0
    decode, prefill = record["shapes"]
    assert decode["bound"] == "memory" and decode["fused_path"] == "small" and "fused down_proj kernel" in decode["parts"]
    assert prefill["bound"] == "compute" and prefill["fused_path"] != "small"
    for shape in record["shapes"]:
        assert shape["floor_us"] == max(shape["floor_compute_us"], shape["floor_memory_us"]) > 0
        assert {"eager", "compile", "fused"} <= set(shape["variants"]) and "max-autotune" not in shape["variants"]
        assert any(note.startswith("max-autotune") for note in shape["skipped"])
        for v in shape["variants"].values():
            assert v["median_us"] > 0 and v["rel_err"] < 2e-2
            # graph replays and host time at every M, the host's 5 bursts of 20..100 calls each
            assert v["graph_median_us"] > 0 and len(v["graph_rounds_us"]) == 5
            assert v["host_us"] > 0 and len(v["host_bursts_us"]) == 5
    assert record["graph_every_row"] is True
    assert "fused vs best of the others as CUDA graphs" in proc.stdout and "host vs eager" in proc.stdout
    assert str(out) in proc.stdout and not list(tmp_path.glob("*.partial"))


def test_share_weights_gives_every_module_the_sources_parameters():
    """After share_weights, each module's gate, up and down weights are the source's Parameter objects (one storage
    each), and its forward is the source's; the other parameters are left alone."""
    import importlib

    import bench

    Simple = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    torch.manual_seed(0)
    source, a, b = Simple(16, 40), Simple(16, 40), Simple(16, 40)
    x = torch.randn(3, 16)
    assert not torch.equal(a(x), source(x))
    b.extra = torch.nn.Parameter(torch.ones(2))
    bench.share_weights(source, a, b)
    for m in (a, b):
        for name in ("gate_proj", "up_proj", "down_proj"):
            assert getattr(m, name).weight is getattr(source, name).weight
        assert torch.equal(m(x), source(x))
    assert torch.equal(b.extra, torch.ones(2))
    with torch.no_grad():
        source.down_proj.weight.mul_(2)  # one copy: a change shows in every module
    assert torch.equal(a(x), source(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_every_variant_reads_one_copy_of_the_weights():
    """build_variants: eager, compile, max-autotune, Liger (if installed) and fused read the same storages (the fused
    module's, gate and up packed in one), and the weights are in memory once."""
    import bench

    before = torch.cuda.memory_allocated()
    variants, reference = bench.build_variants(8, 64, 256, torch.bfloat16, True)
    weights = 3 * 64 * 256 * 2
    fused = variants["fused"]
    storages = {n: getattr(fused, n).weight.untyped_storage().data_ptr() for n in ("gate_proj", "up_proj", "down_proj")}
    assert storages["gate_proj"] == storages["up_proj"] != storages["down_proj"]
    for name, v in variants.items():
        module = getattr(v, "_orig_mod", v)  # a compiled wrapper's module
        for n in storages:
            assert getattr(module, n).weight.untyped_storage().data_ptr() == storages[n], (name, n)
    reference_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    assert torch.cuda.memory_allocated() - before - reference_bytes < 2 * weights  # one bf16 copy (and blocks' rounding)


def _record(M=8192, dim=768, hidden=3072, fused_us=190.0, fused_rounds=(1.0, 1.005, 0.995)):
    # A record shaped like the GPU run's, numbers made up; each variant's rounds spread differently (liger 5%,
    # fused 1%), so a rule that took the wrong spread shows.
    import bench
    variants = {name: {"median_us": us, "rounds_us": [us * f for f in rounds], "rel_err": 3e-3,
                       "graph_median_us": us - 5, "graph_rounds_us": [us - 5] * 3}
                for name, us, rounds in [("eager", 250.0, (1.0, 1.02, 0.99)), ("compile", 240.0, (1.0, 1.01, 0.995)),
                                         ("liger", 230.0, (1.0, 1.04, 0.99)), ("fused", fused_us, fused_rounds)]}
    del variants["compile"]["graph_median_us"]  # graph replays are optional per variant
    return {"M": M, "dim": dim, "hidden": hidden, **bench.roofline(M, dim, hidden, 2, 680.0, 4.0),
            "variants": variants, "skipped": ["max-autotune (not at this shape: --max-autotune all)"],
            "parts": {"fused geglu kernel": 130.0, "cuBLAS down_proj GEMM": 55.0}}


def _new_record(M=1, dim=4096, hidden=11008, fused=(82.0, 72.0, 40.0)):
    """A shape of a record with "graph_every_row", numbers made up: (µs from Python, graph µs, host µs) per variant,
    fused's given. By graph time the best other is liger (76), from Python compile (85); eager's host µs 110, its
    bursts 108..112."""
    import bench

    def v(us, graph, host, host_bursts=None):
        return {"median_us": us, "rounds_us": [us] * 3, "graph_median_us": graph, "graph_rounds_us": [graph] * 3,
                "host_us": host, "host_bursts_us": host_bursts or [host] * 5, "rel_err": 1e-3, "held_bytes": 0}
    variants = {"eager": v(90.0, 80.0, 110.0, [110.0, 112.0, 108.0, 111.0, 109.0]), "compile": v(85.0, 78.0, 150.0),
                "liger": v(88.0, 76.0, 120.0), "fused": v(*fused)}
    return {"M": M, "dim": dim, "hidden": hidden, **bench.roofline(M, dim, hidden, 2, 680.0, 4.0),
            "variants": variants, "skipped": ["max-autotune (not at this shape: --max-autotune all)"], "parts": {}}


def test_a_record_with_graphs_in_every_row_compares_graph_times_and_host_time():
    """graphs=True: fused against the best other by graph time (liger 76 / fused 72 = 1.06x), from Python (compile
    85 / fused 82 = 1.04x), and the host: eager's 110 / fused's 40 = 2.75x. The summary's cells are graph µs."""
    import bench
    r = _new_record()
    lines = bench.shape_lines(r, 680.0, 4.0, graphs=True)
    assert lines[-3:] == ["  fused vs best of the others as CUDA graphs (liger): 1.06x",
                          "  fused vs best of the others as called (compile): 1.04x",
                          "  fused vs eager, host µs per call (eager's / fused's): 2.75x"]
    old = bench.shape_lines(r, 680.0, 4.0)  # the same shape as a record without graphs everywhere prints it
    assert lines[0] == old[0] and lines[6:-3] == old[6:-1]  # the title; host µs, MB held, skipped: as before
    assert lines[1].split() == old[1].split()[:10] + ["spread"] + old[1].split()[10:]  # the graph rounds' spread
    assert lines[5].split() == ["fused", "82.0", "0.0%", "3", f"{r['floor_us'] / 82:.2f}", "1.10x", "72.0", "0.0%",
                                f"{r['floor_us'] / 72:.2f}", "1.0e-03"]
    caption, header, row = bench.summary_lines([r], graphs=True)
    assert caption == "\nµs of CUDA-graph replays (the GPU's time alone); host vs eager: eager's host µs per call / fused's"
    assert header.endswith("fused vs best  of floor  host vs eager")
    assert row.split() == ["1x4096x11008", "memory", f"{r['floor_us']:.1f}", "80.0", "78.0", "-", "76.0", "72.0",
                           "1.06x", f"{r['floor_us'] / 72.0:.2f}", "2.75x"]
    # slower on both: graph 80 against liger's 76 (0.95, no spread); host 120 against eager's 110 (0.92, beyond
    # eager's bursts' spread, 4 / 110 = 3.6%); from Python 85 / 86 = 0.99, no spread either
    slow = _new_record(fused=(86.0, 80.0, 120.0))
    assert bench.shape_lines(slow, 680.0, 4.0, graphs=True)[-3:] == [
        "  fused vs best of the others as CUDA graphs (liger): 0.95x SLOWER beyond the spread",
        "  fused vs best of the others as called (compile): 0.99x SLOWER beyond the spread",
        "  fused vs eager, host µs per call (eager's / fused's): 0.92x SLOWER beyond the spread"]
    assert bench.summary_lines([slow], graphs=True)[2].endswith("0.92x  SLOWER than liger  host SLOWER than eager")


def _host(us, top):
    """Host µs in five bursts: four at us, one at top (spread (top - us) / us)."""
    return {"host_us": us, "host_bursts_us": [us] * 4 + [top]}


@pytest.mark.parametrize("fused, slower", [
    (_host(100.0, 100.0), False),  # eager / fused = 75 / 100 = 0.75 = 1 - 0.25 (eager's spread): the edge
    (_host(101.0, 101.0), True),  # 0.743: beyond both spreads
    (_host(90.0, 91.0), False),  # 0.833: beyond fused's own spread, within eager's
    (_host(50.0, 60.0), False),  # fused enqueues faster
], ids=["at the edge", "beyond both", "within the larger", "faster"])
def test_host_is_slower_only_beyond_the_larger_spread(fused, slower):
    import bench
    r = {"variants": {"eager": _host(75.0, 93.75), "fused": fused}}
    assert bench.host_vs_eager(r) == (pytest.approx(75.0 / fused["host_us"]), slower)


def test_graph_comparison_takes_the_best_other_by_graph_time_and_the_graph_spreads():
    """By graph time the best other is liger (76 µs) though compile is the faster from Python; the spreads are the
    graph rounds' (fused's graph rounds 72..80: 10%, so 76 / 80 = 0.95 is within it, where its rounds from Python
    have none)."""
    import bench
    r = _new_record(fused=(86.0, 80.0, 40.0))
    assert bench.fused_vs_best(r, "graph_median_us") == ("liger", pytest.approx(0.95), True)
    r["variants"]["fused"]["graph_rounds_us"] = [72.0, 80.0, 79.2]
    assert bench.fused_vs_best(r, "graph_median_us") == ("liger", pytest.approx(0.95), False)
    assert bench.fused_vs_best(r) == ("compile", pytest.approx(85 / 86), True)  # from Python: as before
    assert bench.spread(r["variants"]["fused"], "graph_median_us") == pytest.approx(0.1)


def test_graph_spreads_are_the_graph_rounds_of_both_sides_and_printed_under_their_header():
    """Where the graph rounds vary and the rounds from Python do not: the best other's graph spread counts (liger's
    graph rounds 76..83.6, 10%, so fused's 80 against its 76, 0.95, is within it), the row's graph spread column
    prints the graph rounds' (fused 72..80 about a median of 72: 8 / 72 = 11.1%, from Python 0.0%) right under its header, and a record's whole
    table (table_text) sums up by graph time."""
    import bench
    r = _new_record(fused=(86.0, 80.0, 40.0))
    r["variants"]["liger"]["graph_rounds_us"] = [76.0, 83.6, 80.0]
    assert bench.fused_vs_best(r, "graph_median_us") == ("liger", pytest.approx(0.95), False)
    r = _new_record()
    r["variants"]["fused"]["graph_rounds_us"] = [72.0, 80.0, 79.2]
    lines = bench.shape_lines(r, 680.0, 4.0, graphs=True)
    header, row = lines[1], lines[5]  # the column names, fused's row
    assert row.split()[5:8] == ["1.10x", "72.0", "11.1%"]
    end = header.index("graph µs") + len("graph µs")
    graph_spread_end = header.index("spread", end) + len("spread")
    assert row[:graph_spread_end].endswith("11.1%") and row[graph_spread_end] == " "
    record = {"device": "NVIDIA H100", "dtype": "bf16", "ceiling_tflops": 680.0, "copy_tbps": 4.0,
              "graph_every_row": True, "shapes": [r]}
    assert "\nµs of CUDA-graph replays (the GPU's time alone)" in bench.table_text(record)


def test_host_bursts_hold_100_calls_or_50_ms_of_gpu_work_at_least_20():
    """100 calls where they take the GPU up to 50 ms (500 µs a call); fewer above (600 µs: 83), never below 20 (a
    5 ms prefill call: 10 would fill 50 ms)."""
    import bench
    assert [bench.host_calls(us) for us in (10.0, 500.0, 600.0, 2500.0, 5000.0)] == [100, 100, 83, 20, 20]


def test_the_page_table_of_a_record_with_graphs_in_every_row():
    """The markdown table of a record with "graph_every_row": the cells are graph µs, fused vs best other by them,
    then from Python (fused 82 against compile 85) and the host (fused 40 against eager 110)."""
    import bench
    shape = _new_record()
    record = {"date": "2027-01-02T03:04:05", "device": "NVIDIA H100", "torch": "2.11", "triton": "3.6", "cuda": "13.0",
              "liger_kernel": "0.8.5", "dtype": "bf16", "ceiling_tflops": 680.0, "copy_tbps": 4.0,
              "graph_every_row": True, "shapes": [shape]}
    floor = shape["floor_us"]
    assert bench.markdown_table(record, "results/x.json").splitlines() == [
        "Measured on 2027-01-02 on an NVIDIA H100 (torch 2.11, triton 3.6, CUDA 13.0, liger-kernel 0.8.5, bf16); "
        "ceilings 680 TFLOP/s (GEMM) and 4.00 TB/s (copy). µs of CUDA-graph replays (the GPU's time alone), median of "
        "3 rounds; host: µs per call to enqueue one forward; full record: `results/x.json` and `.txt`.",
        "",
        "| M×dim→hidden | floor (bound) | eager | compile | max-autotune | Liger | fused (of floor) | fused vs best other "
        "| called from Python: fused vs best other | host µs per call: fused vs eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| 1×4096→11008 | {floor:.1f} µs (memory) | 80.0 | 78.0 | - | 76.0 | **72.0** ({floor / 72:.2f}) | 1.06× "
        "| 82.0 vs 85.0 (1.04×) | 40.0 vs 110.0 (2.75×) |"]
    record["shapes"] = [_new_record(fused=(86.0, 80.0, 120.0))]
    assert bench.markdown_table(record).splitlines()[-1].endswith(
        "| 0.95× (slower: liger) | 86.0 vs 85.0 (0.99×, slower: compile) | 120.0 vs 110.0 (0.92×, slower) |")
    assert bench.table_text(record).count("as CUDA graphs") == 1  # table_text reads the record's field


def test_table_from_a_record():
    import bench
    record = _record()
    out = "\n".join(bench.shape_lines(record, ceiling=680.0, bandwidth=4.0))
    assert "fused vs best of the others (liger): 1.21x" in out and "SLOWER" not in out
    assert "compute-bound" in out and "skipped: max-autotune" in out
    (fused_row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["fused"] and "vs" not in line]
    assert fused_row[4] == f"{record['floor_us'] / 190.0:.2f}"  # of floor = floor / time
    (compile_row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["compile"]]
    assert compile_row[6:8] == ["-", "-"]  # no graph replay for it
    assert "host µs" not in out  # measured at decode shapes only
    for name, v in record["variants"].items():
        v["host_us"] = {"eager": 70.25, "compile": 101.0, "liger": 110.0, "fused": 75.0}[name]
    (host,) = [line for line in bench.shape_lines(record, 680.0, 4.0) if "host µs" in line]
    assert host.endswith("eager 70.2, compile 101.0, liger 110.0, fused 75.0")
    assert not any("MB held" in line for line in bench.shape_lines(record, 680.0, 4.0))  # older records: no line
    for name, v in record["variants"].items():
        v["held_bytes"] = {"eager": 0, "compile": 512, "liger": 0, "fused": 134_217_728}[name]
    (held,) = [line for line in bench.shape_lines(record, 680.0, 4.0) if "MB held" in line]
    assert held.endswith("beyond the parameters: eager 0.00, compile 0.00, liger 0.00, fused 134.22")


def test_committed_tables_are_their_records():
    """Every committed bench.py record's .txt is what bench.py prints for it (results/bench_h200.json and the rest;
    all made before "graph_every_row", so compared from Python, as then)."""
    import bench
    records = [p for p in sorted((ROOT / "results").glob("bench_*.json"))  # bench.py's: its shapes have parts
               if "parts" in json.loads(p.read_text())["shapes"][0]]
    assert ROOT / "results/bench_h200.json" in records and len(records) >= 10
    for path in records:
        record = json.loads(path.read_text())
        assert "graph_every_row" not in record, path
        assert path.with_suffix(".txt").read_text() == bench.table_text(record), path


def fake_gpu(monkeypatch, bench) -> list:
    """bench.main on a made-up GPU: CUDA "available", the ceilings 680 TFLOP/s and 4 TB/s, the versions of "a GPU
    (cuda)"; returns the dtypes the GEMM ceiling was asked for."""
    ceiling_dtypes = []
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "gemm_ceiling_tflops", lambda dtype: ceiling_dtypes.append(dtype) or 680.0)
    monkeypatch.setattr(bench, "copy_bandwidth_tbps", lambda: 4.0)
    monkeypatch.setattr(bench, "versions", lambda device: {"device": f"a GPU ({device})", "date": "2026-11-30T00:00:00"})
    return ceiling_dtypes


def test_main_writes_the_record_and_its_table_together(tmp_path, monkeypatch):
    """A finished sweep leaves OUT.json, OUT.txt = table_text(OUT.json), and no OUT.json.partial (timings faked)."""
    import bench

    fake_gpu(monkeypatch, bench)
    asked = []

    def bench_shape(M, dim, hidden, dtype, tol, ceiling, bandwidth, max_autotune, act):
        asked.append((M, dim, hidden, dtype, ceiling, bandwidth, max_autotune))
        assert act == "gelu_tanh"  # the default; --activation silu: SwiGLU (test_swiglu_sweep_and_flag)
        return _new_record(M, dim, hidden)
    monkeypatch.setattr(bench, "bench_shape", bench_shape)
    monkeypatch.setattr(bench, "bench_chart_next_to", lambda record, out, title: "")
    out = tmp_path / "bench.json"
    # 8192x768x3072 is among the shapes that get the max-autotune peer by default, 2x4096x11008 is not
    assert bench.main(["--shapes", "8192x768x3072,2x4096x11008", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["M"] for r in record["shapes"]] == [8192, 2]
    assert asked == [(8192, 768, 3072, torch.bfloat16, 680.0, 4.0, True), (2, 4096, 11008, torch.bfloat16, 680.0, 4.0,
                                                                            False)]
    assert out.with_suffix(".txt").read_text() == bench.table_text(record)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.txt"]
    assert torch.initial_seed() == 0  # the inputs are seeded
    # the tuned table's rows where they were measured, without its timings
    table = json.loads((ROOT / "fused_geglu_tuned.json").read_text())
    assert record["fused_config"]["tuned"] == {k: table[k] for k in ("device", "capability", "date", "geglu", "down",
                                                                     "packing") if k in table}
    assert "packing" in table and "packing_measured" not in record["fused_config"]["tuned"]
    asked.clear()
    for flag, want in (("none", False), ("all", True)):
        assert bench.main(["--shapes", "8192x768x3072", "--max-autotune", flag, "--out", str(out)]) == 0
        assert asked.pop()[-1] is want


def test_a_wrong_first_shape_stops_the_run_with_one_line_and_no_files(tmp_path, monkeypatch, capsys):
    """A variant whose output differs at the first shape: exit 1, the reason on stderr, nothing written (no record,
    no partial one: none was begun)."""
    import bench

    fake_gpu(monkeypatch, bench)

    def wrong(*args):
        raise AssertionError("fused differs from eager")
    monkeypatch.setattr(bench, "bench_shape", wrong)
    assert bench.main(["--shapes", "8192x768x3072", "--out", str(tmp_path / "bench.json")]) == 1
    assert capsys.readouterr().err == "bench.py: wrong result, nothing timed for this shape: fused differs from eager\n"
    assert list(tmp_path.iterdir()) == []


def test_roofline_picks_the_bound_that_applies():
    import bench
    # One decode token: 3 weights of 4096 x 11008 bf16 and two 4096-vectors; the FLOPs are nothing.
    mem = bench.roofline(1, 4096, 11008, 2, 700.0, 4.25)
    assert mem["bytes"] == 2 * (3 * 4096 * 11008 + 2 * 4096) and mem["bound"] == "memory"
    assert mem["floor_us"] == pytest.approx(mem["bytes"] / 4.25e6) and mem["floor_compute_us"] < 1
    # The post's shape: the GEMMs dominate.
    comp = bench.roofline(8192, 768, 3072, 2, 700.0, 4.25)
    assert comp["bound"] == "compute" and comp["floor_us"] == pytest.approx(6 * 8192 * 768 * 3072 / 700e6)
    # Doubling the bandwidth halves a memory-bound floor and leaves a compute-bound one alone.
    assert bench.roofline(1, 4096, 11008, 2, 700.0, 8.5)["floor_us"] == pytest.approx(mem["floor_us"] / 2)
    assert bench.roofline(8192, 768, 3072, 2, 700.0, 8.5)["floor_us"] == comp["floor_us"]


def test_summary_flags_a_slower_fused_only_beyond_the_spread():
    import bench
    within = _record(M=1, dim=4096, hidden=11008, fused_us=240.0)  # Liger's time is 0.96x fused's; Liger spreads 5%
    beyond = _record(M=16, dim=4096, hidden=11008, fused_us=260.0)
    lines = "\n".join(bench.summary_lines([within, beyond])).splitlines()
    (row_within,) = [line for line in lines if line.startswith("1x4096x11008")]
    (row_beyond,) = [line for line in lines if line.startswith("16x4096x11008")]
    assert "memory" in row_within and "SLOWER" not in row_within
    assert row_beyond.endswith("SLOWER than liger")
    assert " - " in f" {row_within} "  # no max-autotune column value


def _variant(median, top):
    """A variant timed in three rounds: twice its median, once `top` (spread = (top - median) / median)."""
    return {"median_us": median, "rounds_us": [median, median, top], "rel_err": 0.0}


@pytest.mark.parametrize("fused, slower", [
    (_variant(100.0, 106.25), False),  # Liger / fused = 0.75 = 1 - 0.25 (Liger's spread, the larger): the edge
    (_variant(101.0, 101.0), True),  # 0.743: beyond both spreads
    (_variant(90.0, 91.0), False),  # 0.833: beyond fused's own spread (1.1%), within Liger's (25%)
    (_variant(70.0, 100.0), False),  # fused faster
], ids=["at the edge", "beyond both", "within the larger", "faster"])
def test_fused_is_slower_only_beyond_the_larger_spread(fused, slower):
    import bench
    # Liger: 75 µs, one round at 93.75: spread 0.25; eager is slower than Liger, so Liger is the best other
    r = {"variants": {"eager": _variant(200.0, 200.0), "liger": _variant(75.0, 93.75), "fused": fused}}
    assert bench.fused_vs_best(r) == ("liger", pytest.approx(75.0 / fused["median_us"]), slower)


def test_models_sweep_covers_how_models_run():
    import bench
    shapes = bench.parse_args([]).shapes  # the default
    assert (8192, 768, 3072) in shapes and (2048, 768, 3072) in shapes  # the post's
    for dim, hidden in [(2048, 16384), (4096, 11008), (4096, 14336)]:  # Gemma-2B, Llama-2-7B, Llama-3-8B
        ms = {m for m, d, h in shapes if (d, h) == (dim, hidden)}
        assert 1 in ms and any(4096 <= m <= 16384 for m in ms), (dim, hidden, ms)
    assert {16, 64} <= {m for m, _, _ in shapes}
    assert any(m & (m - 1) for m, _, _ in shapes)  # an M that is not a power of two
    assert bench.MAX_AUTOTUNE_SHAPES <= set(shapes)
    assert bench.parse_args(["--sweep", "post"]).shapes == bench.shape_list(bench.SWEEPS["post"])


def test_middle_sweep_is_between_decode_and_prefill():
    import bench
    shapes = bench.parse_args(["--sweep", "middle"]).shapes
    for width in [(2304, 9216), (4096, 11008), (4096, 14336)]:  # Gemma-2-2B, Llama-2-7B, Llama-3-8B
        assert {m for m, d, h in shapes if (d, h) == width} >= {128, 256, 384, 512, 768}, width
    assert sum(1 for m, _, _ in shapes if m & (m - 1) and m % 128) >= 2  # odd M: neither a power of two nor a tile


# ---- correct before fast: a wrong variant stops the run ---------------------------------------------------

class _Wrong(torch.nn.Module):
    """A variant that is off: its output scaled by `factor` (NaN: every output NaN)."""

    def __init__(self, inner, factor):
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, x):
        return self.inner(x) * self.factor

    def state_dict(self, *args, **kwargs):  # the same weights as the module it wraps
        return self.inner.state_dict(*args, **kwargs)


@pytest.mark.parametrize("factor,says", [(1.0, None), (1.05, r"relative error [45]\.\d\de-02 > 2e-02$"),
                                         (float("nan"), r"relative error nan > 2e-02$")])
def test_check_same_output_gate(factor, says, capsys):
    import argparse
    import importlib

    import common

    torch.manual_seed(0)
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    run = common.Run("04_fused_mlp", argparse.Namespace(), torch.device("cpu"), torch.bfloat16)
    model = _Wrong(SimpleGeGLUMLP(24, 40).bfloat16(), factor)
    reference = SimpleGeGLUMLP(24, 40).bfloat16()  # other random weights: check_same_output must copy them over
    x = torch.randn(3, 5, 24, dtype=torch.bfloat16)
    if says is None:
        assert common.check_same_output(run, "fused", model, reference, x) <= common.TOLERANCE[torch.bfloat16]
        return
    with pytest.raises(common.Fail) as e:
        common.check_same_output(run, "fused", model, reference, x)
    assert str(e.value).startswith("fused's output differs from the eager SimpleGeGLUMLP:")
    assert re.search(says, str(e.value)), str(e.value)
    assert "relative error" in capsys.readouterr().out  # the check printed what it measured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("factor", [1.1, float("nan")])
def test_gpu_wrong_variant_stops_the_run(tmp_path, monkeypatch, capsys, factor):
    import bench

    build = bench.build_variants

    def with_a_wrong_fused(*args):
        variants, reference = build(*args)
        variants["fused"] = _Wrong(variants["fused"], factor)
        return variants, reference

    monkeypatch.setattr(bench, "build_variants", with_a_wrong_fused)
    monkeypatch.setattr(bench, "gemm_ceiling_tflops", lambda dtype: 700.0)  # no 8192^3 matmul for this check
    monkeypatch.setattr(bench, "copy_bandwidth_tbps", lambda: 4.0)
    timed = []
    monkeypatch.setattr(bench, "time_interleaved", lambda fns: timed.append(fns) or {n: [1.0] * 3 for n in fns})
    out = tmp_path / "bench.json"
    assert bench.main(["--shapes", "256x128x512", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench.py: wrong result") and "fused at 256x128x512" in err and err.count("\n") == 1
    assert timed == [] and list(tmp_path.iterdir()) == []  # nothing timed, nothing written (no .partial either)


def test_compile_workers_are_kept_alive_for_the_timings():
    """A re-spawned compile-worker pool once slowed a shape's first rounds: the benchmarks switch its idle stop off."""
    import torch._inductor.config as inductor_config

    import bench
    before = inductor_config.quiesce_async_compile_pool
    try:
        inductor_config.quiesce_async_compile_pool = True
        bench.keep_compile_workers()
        assert inductor_config.quiesce_async_compile_pool is False
    finally:
        inductor_config.quiesce_async_compile_pool = before


def test_record_goes_to_bench_results_by_default_and_its_folders_are_made(tmp_path):
    """bench.py with no --out writes bench_results/bench.json; write_record makes the folders it needs."""
    import bench
    assert bench.parse_args([]).out == Path("bench_results/bench.json")
    out = tmp_path / "a" / "b" / "bench.json"
    assert bench.write_record(out, {"x": 1}, ["line"]) == f"\nwrote {out}\n      {out.with_suffix('.txt')}"
    assert json.loads(out.read_text()) == {"x": 1} and out.with_suffix(".txt").read_text() == "line\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["bench.json", "bench.txt"]


def test_the_page_table_has_a_max_autotune_column():
    """The committed record's first shape: its max-autotune median is the table's fifth cell."""
    import bench
    record = json.loads((ROOT / "results" / "bench_h200.json").read_text())
    row = bench.markdown_table(record).splitlines()[4]
    v = record["shapes"][0]["variants"]
    assert row.split(" | ")[2:6] == [f"{v[n]['median_us']:.1f}" for n in ("eager", "compile", "max-autotune", "liger")]


def test_main_says_what_it_measured_in_order(tmp_path, monkeypatch, capsys):
    """stdout: the ceilings line, each shape's lines, the summary, where the record went, the chart's line; the
    record names the CUDA device's versions, the ceiling measured in the run's dtype and liger-kernel's version."""
    import importlib.metadata

    import bench

    ceiling_dtypes = fake_gpu(monkeypatch, bench)
    monkeypatch.setattr(bench, "bench_shape", lambda M, dim, hidden, *rest: _new_record(M, dim, hidden))
    charts = []
    monkeypatch.setattr(bench, "bench_chart_next_to", lambda rec, out, what: charts.append((rec, out, what)) or "chart")
    out = tmp_path / "bench.json"
    assert bench.main(["--shapes", "8192x768x3072", "--dtype", "fp16", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    try:
        liger = importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        liger = None
    assert (record["device"], record["liger_kernel"], ceiling_dtypes) == ("a GPU (cuda)", liger, [torch.float16])
    shape = record["shapes"][0]
    assert capsys.readouterr().out == "\n".join([
        bench.ceilings_line(record), *bench.shape_lines(shape, 680.0, 4.0, graphs=True),
        *bench.summary_lines([shape], graphs=True),
        bench.write_record(out, record, bench.table_text(record).splitlines()), "chart"]) + "\n"
    assert [(json.loads(json.dumps(rec)), out, what) for rec, out, what in charts] == [(record, out, "GeGLU MLP forward")]


def test_no_gpu_is_one_line_and_exit_2_in_process(monkeypatch, capsys, tmp_path):
    import bench

    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path / "b.json")]) == 2
    said = capsys.readouterr()
    assert (said.out, said.err) == ("", bench.NO_GPU + "\n") and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_round_robin_times_forwards_in_inference_mode_unless_told_not_to():
    """Forwards are timed under inference mode (no autograd bookkeeping on the host); a step with a backward
    says inference=False, and every one of its calls then runs outside it."""
    import bench

    for timer in (bench.time_round_robin, bench.time_interleaved):
        seen = {True: [], False: []}
        for inference in (True, False):
            fns = {name: (lambda s=seen[inference]: s.append(torch.is_inference_mode_enabled())) for name in "ab"}
            kwargs = {} if inference else {"inference": False}  # the forward benchmarks take the default
            times = timer(fns, rounds=2, rep_ms=1, **kwargs)
            assert sorted(times) == ["a", "b"] and all(len(v) == 2 and min(v) > 0 for v in times.values())
        assert seen[True] and set(seen[True]) == {True}, timer.__name__
        assert seen[False] and set(seen[False]) == {False}, timer.__name__


def test_swiglu_sweep_and_flag():
    """--sweep swiglu: Llama-3-8B, Qwen2-7B and Qwen2-0.5B widths, decode and prefill, with SiLU unless told otherwise;
    --activation picks it for any shapes; the default stays GeGLU. The fused MLP's own list of activations is the
    flag's."""
    import bench
    import fused_geglu

    args = bench.parse_args(["--sweep", "swiglu"])
    assert args.activation == "silu" and args.shapes == bench.shape_list(bench.SWEEPS["swiglu"])
    for dim, hidden in [(4096, 14336), (3584, 18944), (896, 4864)]:
        ms = {m for m, d, h in args.shapes if (d, h) == (dim, hidden)}
        assert min(ms) <= 16 and max(ms) >= 4096, (dim, hidden, ms)
    assert bench.parse_args(["--sweep", "swiglu", "--activation", "gelu_tanh"]).activation == "gelu_tanh"
    assert bench.parse_args(["--shapes", "3x40x72", "--activation", "silu"]).activation == "silu"
    assert bench.parse_args([]).activation == bench.parse_args(["--sweep", "post"]).activation == "gelu_tanh"
    assert tuple(bench.MLP_NAMES) == fused_geglu.ACTIVATIONS


def test_a_swiglu_record_says_so():
    """A shape of a SwiGLU run says SwiGLU in its table's first line and the page table's caption; a GeGLU one (and
    a record from before there was an activation) says nothing new."""
    import bench
    old, geglu, swiglu = _record(), dict(_record(), activation="gelu_tanh"), dict(_record(), activation="silu")
    first = [bench.shape_lines(r, 680.0, 4.0)[0] for r in (old, geglu, swiglu)]
    assert first[0] == first[1] and first[2] == first[0].replace("hidden=3072:", "hidden=3072 SwiGLU:")
    record = json.loads((ROOT / "results/bench_h200.json").read_text())
    caption = bench.markdown_table(record).splitlines()[0]
    assert bench.markdown_table(dict(record, activation="gelu_tanh")).splitlines()[0] == caption
    assert bench.markdown_table(dict(record, activation="silu")).splitlines()[0] == caption.replace(
        f"{record['dtype']}); ceilings", f"{record['dtype']}, the SwiGLU MLP); ceilings")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_swiglu_variants_read_one_copy_of_the_weights():
    """--activation silu: transformers' LlamaMLP (eager, compiled), Liger's LigerSwiGLUMLP and FusedGatedMLP("silu"),
    one copy of the weights, each within bf16's tolerance of the fp32 LlamaMLP."""
    import bench
    from fused_geglu import FusedGatedMLP

    variants, reference = bench.build_variants(8, 64, 256, torch.bfloat16, False, "silu")
    assert type(reference).__name__ == "LlamaMLP" and type(variants["eager"]).__name__ == "LlamaMLP"
    assert type(variants["liger"]).__name__ == "LigerSwiGLUMLP"
    assert isinstance(variants["fused"], FusedGatedMLP) and variants["fused"].activation == "silu"
    ptrs = {name: variants[name].gate_proj.weight.data_ptr() for name in ("eager", "liger", "fused")}
    assert len(set(ptrs.values())) == 1, ptrs
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        ref = reference(x.float())
        for name, model in variants.items():
            assert bench.common.rel_error(model(x), ref) < 2e-2, name
