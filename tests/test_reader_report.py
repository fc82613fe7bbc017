"""The one-trace report on traces it was not written against: overlapping streams, long runs, a cold step among
warm ones, no shapes, no annotations, another launch order; the report as data (--json); --expect; and the
numbers HTA gives (why the GPU idles, launch-to-start lag, CPU self time, GPU time per annotation).

Every awkward trace is built here from the committed H200 traces or the hand-built kineto-format trace of
test_inspect_trace.py, by editing the parsed JSON."""

import contextlib
import copy
import gzip
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import bench_inspect
from trace_reader.analyzers import steps
import inspect_trace as it
from doc_pages import page
from test_inspect_trace import GELU, MUL, gpu_trace, parse

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def here(*args):
    """What cli(*args) gives, inspect_trace.main run in this process: for --expect, which imports the script and
    so torch, a child would import torch again (3 CPU-s); test_readme runs the pages' --expect commands as children."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = it.main([str(a) for a in args])
        except SystemExit as e:  # argparse's own exits
            code = e.code
    return subprocess.CompletedProcess(["inspect_trace.py", *args], code, out.getvalue(), err.getvalue())


def raw(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"h200_{name}.json.gz").read_bytes()))


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# ---------------------------------------------------------------------------------------- GPU busy, idle, lag

def test_gpu_busy_is_the_union_of_overlapping_streams():
    data = gpu_trace()
    evs = data["traceEvents"]
    # the mul kernel moves to a second stream and starts 10 µs into the GeLU: they overlap by 23 µs
    for gelu, mul in zip([e for e in evs if e["name"] == GELU], [e for e in evs if e["name"] == MUL]):
        mul["ts"], mul["tid"], mul["args"]["stream"] = gelu["ts"] + 10, 8, 8
    t = parse(data)
    for st in t.steps:
        intervals = sorted((k.event.ts, k.event.end) for k in st.gpu)
        assert len(intervals) == 5
        plain_sum = sum(e - s for s, e in intervals)
        union, end = 0.0, -1.0
        for s, e in intervals:  # independent count: the length covered by at least one interval
            union += max(0.0, e - max(s, end))
            end = max(end, e)
        assert plain_sum - union == pytest.approx(23.0)
        assert st.gpu_busy == pytest.approx(union)


def two_kernels_step() -> dict:
    """One step, 0..100 µs on the CPU: kernel A launched at 10, runs 15..30; kernel B launched at 50 (after A
    ended), runs 55..70. Idle: 0..15 (10 before A's launch, 5 after), 30..55 (20 + 5), 70..100 (30, host)."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("work", "user_annotation", 1, 98),
          x("aten::a", "cpu_op", 9, 5, **{"External id": 1}), x("aten::b", "cpu_op", 49, 5, **{"External id": 2}),
          x("cudaLaunchKernel", "cuda_runtime", 10, 2, **{"External id": 1, "correlation": 11}),
          x("cudaLaunchKernel", "cuda_runtime", 50, 2, **{"External id": 2, "correlation": 12}),
          x("kernel_a", "kernel", 15, 15, pid=0, tid=7, correlation=11),
          x("kernel_b", "kernel", 55, 15, pid=0, tid=7, correlation=12)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_idle_split_and_lag_per_step():
    t = parse(two_kernels_step())
    [step] = it.report_data(t)["steps"]
    assert step["gpu_busy_us"] == 30 and step["wall_us"] == 100 and step["bound"] == "overhead"
    assert step["idle_us"] == {"waiting_on_host": 60.0, "after_launch": 10.0}
    assert step["lag_us"] == {"median": 5.0, "max": 5.0}
    text = it.report(t)
    assert "\n   GPU idle per step (median): 60.0 µs waiting on the host (work not yet launched), 10.0 µs after the " \
           "launch (launch latency, earlier work)\n" in text
    assert "\n#2          2      30.0     100.0  100.0    30%    60%  overhead         5.0      5.0\n" in text


def launched_at_the_step_start(kernels, span=100.0) -> dict:
    """Steps 0..span, span + 10..2 * span + 10, ...: each a list of (start, dur, stream) kernels, all launched as the
    step starts (one op, its launch calls 0.1 µs apart), so no GPU idle time is waiting on the host: every gap
    is after the launch. Kernel times are relative to the step's start."""
    ev, corr = [], 0
    for s, step in enumerate(kernels):
        t0 = s * (span + 10)
        ev += [x(f"ProfilerStep#{s + 2}", "user_annotation", t0, span), x("aten::op", "cpu_op", t0, 1, **{"External id": s})]
        for i, (start, dur, stream) in enumerate(step):
            corr += 1
            ev += [x("cudaLaunchKernel", "cuda_runtime", t0 + 0.1 * i, 0.1, **{"External id": s, "correlation": corr}),
                   x(f"k{corr}", "kernel", t0 + start, dur, pid=0, tid=stream, correlation=corr)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_compute_bound_from_exactly_half_busy():
    """The documented rule: GPU busy >= 50% of (busy + the idle the step caused) is compute-bound, below is
    overhead-bound. Steps of 100 µs whose one kernel ends with the step: busy 49, 50 and 51 µs."""
    d = it.report_data(parse(launched_at_the_step_start([[(51.0, 49.0, 7)], [(50.0, 50.0, 7)], [(49.0, 51.0, 7)]])))
    assert [s["idle_us"] for s in d["steps"]] == [{"waiting_on_host": 0.0, "after_launch": a} for a in (51.0, 50.0, 49.0)]
    assert [s["busy_fraction"] for s in d["steps"]] == [pytest.approx(f) for f in (0.49, 0.5, 0.51)]
    assert [s["bound"] for s in d["steps"]] == ["overhead", "compute", "compute"]
    # the typical step is the median one, exactly at the edge: compute-bound
    t = d["typical_step"]
    assert {k: t[k] for k in ("number", "bound", "busy_fraction", "host_wait_fraction")} == {
        "number": 3, "bound": "compute", "busy_fraction": 0.5, "host_wait_fraction": 0.0}
    for busy, want in ((50.0, "compute"), (49.0, "overhead")):
        t = parse(launched_at_the_step_start([[(100 - busy, busy, 7)]] * 3))
        assert it.bound_of(t) == (want, busy / 100)
        assert [v for _, v, _ in it.check(t, [it.bound("compute"), it.bound("overhead")])] == \
            (["confirmed", "broken"] if want == "compute" else ["broken", "confirmed"])


def test_a_long_kernel_covering_others_leaves_no_gap_under_them():
    """Stream 7 runs a long kernel 10..90 µs; two short ones on streams 8 and 9 (20..30, 40..50) run inside it;
    the last kernel runs 95..100. The GPU idles 0..10 and 90..95 only: 15 µs after the launch, busy 85 of 100."""
    t = parse(launched_at_the_step_start([[(10.0, 80.0, 7), (20.0, 10.0, 8), (40.0, 10.0, 9), (95.0, 5.0, 7)]]))
    [step] = it.report_data(t)["steps"]
    assert step["gpu_busy_us"] == 85.0
    assert step["idle_us"] == {"waiting_on_host": 0.0, "after_launch": 15.0}
    assert step["busy_fraction"] == pytest.approx(0.85)


def test_a_kernel_launched_before_the_window_is_in_no_step():
    # Without a per-step sync the GPU runs the profiler's warm-up step's kernels inside the first active step's
    # span; their launches are not in the trace (only a correlation id is). Counting them by GPU time would
    # give the first step an extra kernel (seen on the H200's attention trace: softmax per step [2, 1, 1]).
    data = two_kernels_step()
    data["traceEvents"].append(x("left_over", "kernel", 5, 8, pid=0, tid=7, correlation=3))
    t = parse(data)
    assert [k.name for k in t.steps[0].gpu] == ["kernel_a", "kernel_b"]
    # a trace with no runtime calls at all (another harness): the GPU's clock is all there is, so it counts
    bare = {"traceEvents": [e for e in data["traceEvents"] if e["cat"] != "cuda_runtime"],
            "deviceProperties": data["deviceProperties"]}
    assert sorted(k.name for k in parse(bare).steps[0].gpu) == ["kernel_a", "kernel_b", "left_over"]


def cpu_runs_ahead(steps=6) -> dict:
    """The post's loop, no synchronize per step: each 20 µs CPU step launches a 100 µs kernel 5 µs in; the
    kernels queue back to back (step k's starts at 10 + 100k), so the launch-to-start lag grows by 70 µs a step."""
    ev = []
    for k in range(steps):
        t0 = 30.0 * k
        ev += [x(f"ProfilerStep#{k + 2}", "user_annotation", t0, 20), x("fwd", "user_annotation", t0 + 1, 18),
               x("aten::mm", "cpu_op", t0 + 4, 5, **{"External id": k + 1}),
               x("cudaLaunchKernel", "cuda_runtime", t0 + 5, 2, **{"External id": k + 1, "correlation": 100 + k}),
               x("gemm", "kernel", 10.0 + 100 * k, 100, pid=0, tid=7, correlation=100 + k)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_a_gpu_that_falls_behind_is_compute_bound_and_its_lag_grows():
    t = parse(cpu_runs_ahead())
    d = it.report_data(t)
    assert [s["lag_us"]["max"] for s in d["steps"]] == [5.0 + 70 * k for k in range(6)]
    # busy / wall would shrink with the lag (0.91, 0.56, 0.40, ...: "overhead-bound"); the GPU never waited
    assert [round(st.gpu_busy / st.wall, 2) for st in t.steps][:3] == [0.91, 0.56, 0.4]
    assert [s["idle_us"] for s in d["steps"]][1:] == [{"waiting_on_host": 0.0, "after_launch": 0.0}] * 5
    assert d["steps"][0]["idle_us"] == {"waiting_on_host": 5.0, "after_launch": 5.0}
    assert [s["bound"] for s in d["steps"]] == ["compute"] * 6
    assert it.bound_of(t) == ("compute", 1.0)


@pytest.mark.skipif(not (DATA / "h200_mlp_eager.json.gz").exists(), reason="no H200 fixtures")
def test_lag_per_step_is_launch_to_start_on_the_h200_trace():
    data = raw("mlp_eager")
    evs = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in evs
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    steps = sorted((e for e in evs if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    rows = it.report_data(it.parse_trace(data))["steps"]
    assert len(rows) == len(steps) == 3
    for row, st in zip(rows, steps):
        lags = [g["ts"] - launches[g["args"]["correlation"]]["ts"] for g in evs
                if g.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and g["args"].get("correlation") in launches
                and st["ts"] <= launches[g["args"]["correlation"]]["ts"] <= st["ts"] + st["dur"]]
        assert len(lags) == 7  # 5 kernels + cuBLAS's 2 workspace memsets
        assert row["lag_us"] == {"median": pytest.approx(statistics.median(lags)), "max": pytest.approx(max(lags))}


# ------------------------------------------------------------------------------------------------ verdicts

def test_verdict_is_the_typical_step_not_the_pool():
    data = gpu_trace()
    # a cold first step: the CPU span runs 1,500 µs longer (the first call's costs), the GPU work is the same
    first = min((e for e in data["traceEvents"] if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    end = first["ts"] + first["dur"]
    for e in data["traceEvents"]:
        if e["ts"] >= end:
            e["ts"] += 1500  # the later steps move on, unchanged
    first["dur"] += 1500
    t = parse(data)
    fracs = [st.gpu_busy / st.wall for st in t.steps]
    pooled = sum(st.gpu_busy for st in t.steps) / sum(st.wall for st in t.steps)
    assert fracs[0] < 0.5 <= min(fracs[1:]) and pooled < 0.5  # pooling would say overhead-bound
    assert it.bound_of(t) == ("compute", pytest.approx(statistics.median_low(fracs)))
    d = it.report_data(t)
    assert [s["bound"] for s in d["steps"]] == ["overhead", "compute", "compute"]
    # of the two compute-bound steps, the first whose fraction is the lower median (here their fractions may tie)
    low = statistics.median_low(fracs)
    assert d["typical_step"]["bound"] == "compute"
    assert d["typical_step"]["number"] == next(st.number for st, f in zip(t.steps, fracs) if f == low)
    text = it.report(t)
    assert f"=> typical step (median, #{d['typical_step']['number']}): compute-bound, GPU busy " \
           f"{100 * statistics.median_low(fracs):.0f}% of the step (2 compute-bound, 1 overhead-bound)" in text


def test_the_typical_step_of_an_even_count_is_the_lower_median():
    """Four 100 µs steps, #2..#5, whose one kernel (launched at the step's start) ends with the step, busy 60, 20,
    80 and 40 µs: the fractions sorted are 0.2, 0.4, 0.6, 0.8; the lower median 0.4 is #5's (overhead-bound), the
    upper one 0.6 #2's (compute-bound). Every other hand-made trace has an odd count or ties at the middle, where
    the two medians are one step."""
    busy = [60.0, 20.0, 80.0, 40.0]
    data = launched_at_the_step_start([[(100 - b, b, 7)] for b in busy])
    steps = sorted((e for e in data["traceEvents"] if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    frac = {int(s["name"].split("#")[1]): sum(e["dur"] for e in data["traceEvents"] if e["cat"] == "kernel"
                                              and s["ts"] <= e["ts"] < s["ts"] + s["dur"]) / s["dur"] for s in steps}
    ranked = sorted(frac, key=frac.get)
    number = ranked[(len(ranked) - 1) // 2]  # the lower of the two middle ones
    assert (number, frac[number], frac[ranked[len(ranked) // 2]]) == (5, 0.4, 0.6)
    t = parse(data)
    d = it.report_data(t)
    assert (d["typical_step"]["number"], d["typical_step"]["bound"]) == (5, "overhead")
    assert d["typical_step"]["busy_fraction"] == pytest.approx(0.4)
    assert it.bound_of(t) == ("overhead", pytest.approx(0.4))
    assert "=> typical step (median, #5): overhead-bound, GPU busy 40% of the step (2 compute-bound, " \
           "2 overhead-bound)" in it.report(t)


@pytest.mark.parametrize("name", ["h200_matmul_add_4096_active20_eager", "h200_matmul_add_4096_active20_sync_eager"])
def test_the_typical_step_of_twenty_is_the_lower_median(name):
    """Part 1's 20-step H200 traces: the typical step is the 10th of the 20 by GPU busy fraction (the lower of
    the two middle ones), not the 11th; in both traces those are different steps (#3 and #19 in the first)."""
    d = it.report_data(it.load_trace(DATA / f"{name}.json.gz"))
    ranked = sorted(d["steps"], key=lambda s: s["busy_fraction"])
    assert len(ranked) == 20 and ranked[9]["number"] != ranked[10]["number"]
    assert ranked[9]["busy_fraction"] < ranked[10]["busy_fraction"]
    assert d["typical_step"]["number"] == ranked[9]["number"]
    assert d["typical_step"]["busy_fraction"] == ranked[9]["busy_fraction"]

def one_kernel_step(busy: int, host: int) -> dict:
    """One 100 µs step launching one kernel of `busy` µs at 1 µs, which starts at 101 - busy - host: the GPU waits
    1 µs on the host before the launch, 100 - busy - host after it, and host - 1 µs on the host again after the
    kernel, while the CPU span runs on. busy + host + after = 100, the step's window."""
    start = 101 - busy - host
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("aten::a", "cpu_op", 0.5, 2, **{"External id": 1}),
          x("cudaLaunchKernel", "cuda_runtime", 1, 1, **{"External id": 1, "correlation": 11}),
          x("kernel_a", "kernel", start, busy, pid=0, tid=7, correlation=11)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


@pytest.mark.parametrize("busy, host, bound", [
    (50, 19, "compute"), (50, 20, "partly overhead"), (49, 19, "overhead"), (49, 20, "overhead"),
    (63, 32, "partly overhead"), (80, 19, "compute"), (80, 20, "partly overhead")])
def test_verdict_rule_at_its_edges(busy, host, bound):
    """busy fraction < 0.5: overhead-bound; >= 0.5: compute-bound unless the GPU waited on the host >= 20% of the
    step's window, then partly overhead-bound (an eager step busy 63% that waits 32% on the host is not
    "compute-bound, launch overhead does not help")."""
    t = parse(one_kernel_step(busy, host))
    [step] = it.report_data(t)["steps"]
    window = 100
    assert step["idle_us"]["waiting_on_host"] == pytest.approx(host)
    assert step["busy_fraction"] == pytest.approx(busy / window)
    assert step["host_wait_fraction"] == pytest.approx(host / window)
    assert step["bound"] == bound and it.bound_of(t) == (bound, pytest.approx(busy / window))
    line = next(ln for ln in it.report(t).splitlines() if ln.startswith("=> typical step"))
    assert f": {bound}-bound, GPU busy {busy}% of the step (1 {bound}-bound); " in line
    if bound == "partly overhead":
        assert f"it also waits {host:.1f} µs ({host}%) on the host: faster kernels and fewer launches both help" in line
    else:
        assert "on the host" not in line


# --------------------------------------------------------------------------------------------- long traces

@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """The H200 eager MLP's first step, 1,150 times: ~20 MB of JSON."""
    path = tmp_path_factory.mktemp("long") / "long.json"
    size = bench_inspect.replicate(DATA / "h200_mlp_eager.json.gz", 1150, path)
    return path, size


def test_a_20_mb_trace_reads_every_step(long_trace):
    """A 20 MB trace of 1150 steps reads whole (how fast is bench_inspect.py's to say, on a quiet machine)."""
    path, size = long_trace
    assert 19e6 < size < 22e6
    t = it.load_trace(path)
    assert len(t.steps) == 1150 and [st.number for st in t.steps] == list(range(2, 1152))
    first = it.load_trace(DATA / "h200_mlp_eager.json.gz").steps[0]
    assert {len(st.gpu) for st in t.steps} == {len(first.gpu)}


def test_long_trace_report_fits_two_screens(long_trace):
    path, _ = long_trace
    proc = cli(path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) < 100 and max(map(len, lines)) < 200
    assert "steps   1150 active ProfilerStep (#2..#1151)" in lines
    assert "(1150 steps: the first and last 3, then each column's quantiles; --all-steps lists all)" in lines
    shown = [ln.split()[0] for ln in lines if ln.startswith("#") and ln.split()[0][1:].isdigit()]
    assert shown == ["#2", "#3", "#4", "#1149", "#1150", "#1151"]
    assert [ln.split()[0] for ln in lines if ln.split()[:1] in (["min"], ["median"], ["p90"], ["max"])] == \
        ["min", "median", "p90", "max"]
    # per-kernel numbers are exact at any length: every step is a copy of the first, so each mean is its value
    first = it.load_trace(DATA / "h200_mlp_eager.json.gz").steps[0]
    want: dict = {}
    for k in first.gpu:
        want.setdefault((k.name, k.op.name), []).append(k.dur)
    got = it.report_data(it.load_trace(path))["kernels"]
    assert [(g["name"], g["launched_by"]) for g in got] == list(want)
    for g, durs in zip(got, want.values()):
        assert g["calls_per_step"] == len(durs)
        assert g["mean_us"] == pytest.approx(statistics.mean(durs), abs=1e-6)
    table = [ln for ln in lines if ln[:2] in ("1 ", "2 ", "3 ", "4 ", "5 ")]
    assert [ln.split("  ")[0] for ln in table] == ["1", "2", "3", "4", "5"]
    every = cli("--all-steps", path)
    assert sum(ln.startswith("#") and ln.split()[0][1:].isdigit() for ln in every.stdout.splitlines()) == 1150


def test_step_quantiles_are_real_steps():
    t = parse(bench_inspect_data(12))
    rows = {ln.split()[0]: ln.split()[2] for ln in it.report(t).splitlines()
            if ln.split()[:1] in (["min"], ["median"], ["p90"], ["max"])}
    # step k's GPU busy: 2 x 57.5 + (33 - k) + 37 + 52.9 = 237.9 - k, so 226.9 .. 237.9 over 12 steps; nearest rank
    # of 11 gaps: the median is rank round(5.5) = 6 (232.9, a real step; the mean of the middle two, 232.4, is none),
    # p90 rank round(9.9) = 10
    assert rows == {"min": "226.9", "median": "232.9", "p90": "236.9", "max": "237.9"}


def bench_inspect_data(n):
    """The hand-built trace with n steps whose GeLU kernel is 1 µs shorter each step (33, 32, ...): no kernel
    moves, so each step's GPU busy time is 1 µs less than the step before."""
    data = gpu_trace(steps=n)
    for i, e in enumerate(e for e in data["traceEvents"] if e["name"] == GELU):
        e["dur"] = 33.0 - i
    return data


# --------------------------------------------------------------------------------- why a column is empty

def test_no_shapes_says_why_and_how_to_record_them():
    data = raw("mlp_eager")
    for e in data["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            e.get("args", {}).pop(key, None)
    text = it.report(it.parse_trace(data))
    assert "\nachieved: empty, this trace has no tensor shapes (profile with torch.profiler.profile(..., " \
           "record_shapes=True) to record them)\n" in text
    assert "TFLOP/s" not in text and "GB/s" not in text
    assert "achieved: empty" not in it.report(it.parse_trace(raw("mlp_eager")))


def test_no_annotations_is_not_applicable_not_broken():
    data = raw("mlp_eager")
    data["traceEvents"] = [e for e in data["traceEvents"]
                           if e.get("cat") != "user_annotation" or e["name"].startswith("ProfilerStep#")]
    t = it.parse_trace(data)
    [(_, verdict, detail)] = it.check(t, [it.steps(3, "mlp_fwd")])
    assert verdict == "not applicable"
    assert detail == "3 active steps as guessed; no annotation in this trace, so 'mlp_fwd' cannot be looked for"
    assert it.check(t, [it.steps(4, "mlp_fwd")])[0][1:] == ("broken", "3 active steps")
    assert "\nGPU time per annotation: no record_function annotation in this trace\n" in it.report(t)
    # the kernels still read as before: the annotation was never what linked them
    assert [len(st.kernels) for st in t.steps] == [5, 5, 5]


def test_event_order_in_the_file_does_not_matter():
    data = raw("mlp_compile")
    shuffled = copy.deepcopy(data)
    shuffled["traceEvents"].reverse()
    a, b = it.report(it.parse_trace(data)), it.report(it.parse_trace(shuffled))
    assert a == b and "triton_poi_fused__unsafe_view_gelu_mul_0" in a


# ------------------------------------------------------------------------------- annotations and CPU time

def test_gpu_time_by_annotation_nests():
    data = gpu_trace()
    # a "gate_proj" annotation around each step's first linear (its GEMM is the first nvjet kernel)
    linears = [e for e in data["traceEvents"] if e["name"] == "aten::linear"][::3]
    data["traceEvents"] += [x("gate_proj", "user_annotation", e["ts"] - 0.5, e["dur"] + 1) for e in linears]
    t = parse(data)
    per = it.gpu_time_by_annotation(t)
    assert set(per) == {"mlp_fwd", "gate_proj"}
    for i, st in enumerate(t.steps):
        assert per["mlp_fwd"][i] == pytest.approx(sum(k.dur for k in st.gpu))
        assert per["gate_proj"][i] == pytest.approx(st.kernels[0].dur) == pytest.approx(57.5)


def test_cpu_self_time_on_a_gpu_trace_includes_runtime_calls():
    t = parse(gpu_trace())
    rows = {r["name"]: r for r in it.cpu_self_times(t)}
    syncs = [c.dur for st in t.steps for c in st.span.calls if c.name == "cudaDeviceSynchronize"]
    assert len(syncs) == 3
    assert rows["cudaDeviceSynchronize"]["self_us_per_step"] == pytest.approx(sum(syncs) / 3)
    assert rows["cudaLaunchKernel"]["calls_per_step"] == 5
    # aten::mm's self time excludes the launch calls made inside it: 25 µs span - 1 µs query - 3 µs launch
    assert rows["aten::mm"]["self_us_per_step"] == pytest.approx(3 * (25 - 1 - 3))
    assert "\nCPU self time per step, top 8 (ops, annotations and runtime calls; µs):\n" in it.report(t)


# ------------------------------------------------------------------------------------ --json and --expect

def test_json_is_the_report_as_data():
    proc = here("--json", "--expect", "03_simple_mlp", DATA / "h200_mlp_eager.json.gz")
    assert proc.returncode == 1, proc.stderr  # one guess broken, as in the text report
    d = json.loads(proc.stdout)
    t = it.load_trace(DATA / "h200_mlp_eager.json.gz")
    expectations = d.pop("expectations")
    assert [e["verdict"] for e in expectations] == ["confirmed"] * 5 + ["broken", "confirmed"]
    assert expectations[5]["seen"].startswith("GEMM launches without the query: 9/9")
    assert d == json.loads(json.dumps(it.report_data(t)))
    assert d["device"] == "cuda" and d["device_name"] == "NVIDIA H200" and len(d["steps"]) == 3
    assert [k["launched_by"] for k in d["kernels"]] == ["aten::mm", "aten::mm", "aten::gelu", "aten::mul", "aten::mm"]
    assert d["kernels"][1]["mean_us"] == pytest.approx(statistics.mean(
        k.dur for st in t.steps for k in st.kernels if "coopA" in k.name))
    assert d["typical_step"]["bound"] == "compute"
    assert d["annotations"]["mlp_fwd"][0] == pytest.approx(t.steps[0].gpu_busy, abs=0.05)  # JSON keeps 0.1 µs


def test_expect_reads_the_mode_from_the_trace():
    eager = here("--expect", "03_simple_mlp", DATA / "h200_mlp_eager.json.gz")
    # the H200 issues no occupancy query before its GEMMs (CUDA 13, nvjet): one guess broken, exit 1
    assert eager.returncode == 1, eager.stderr
    assert "\n03_simple_mlp eager, 3 steps (read from the trace)\n" in eager.stdout
    assert "  6 confirmed, 1 broken, 0 not applicable" in eager.stdout
    comp = it.load_trace(DATA / "h200_mlp_compile.json.gz")
    exps, said = it.expectations_for("03_simple_mlp", comp)
    assert said == "03_simple_mlp compile, 3 steps (read from the trace)"
    assert [v for _, v, _ in it.check(comp, exps)].count("broken") == 0
    for bad in (["--expect", "os", DATA / "h200_mlp_eager.json.gz"],
                ["--expect", "03_simple_mlp", DATA / "h200_mlp_eager.json.gz", DATA / "h200_mlp_compile.json.gz"]):
        proc = here(*bad)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, bad


def test_expect_reads_part_1_sizes_from_the_gemm_when_the_file_is_renamed():
    """h200_matmul_add_4096_eager.json.gz is not the suite's file name: the size comes from the GEMM's shapes,
    and with it Part 1's guess (compute-bound at 4096, overhead-bound at 64)."""
    for name, guess, op in (("4096_eager", "compute-bound: the typical step's GPU is busy >= 50%", "aten::mm"),
                            ("64_eager", "overhead-bound: the typical step's GPU is busy < 50%", "aten::mm"),
                            ("bmm_eager", "overhead-bound: the typical step's GPU is busy < 50%", "aten::bmm")):
        t = it.load_trace(DATA / f"h200_matmul_add_{name}.json.gz")
        exps, said = it.expectations_for("01_matmul_add", t)
        verdicts = {ex.text: v for ex, v, _ in it.check(t, exps)}
        assert verdicts[f"{guess} (of busy + the idle it caused)"] == "confirmed", name
        assert verdicts[f"'{op}' 1x per step"] == "confirmed", name


# ------------------------------------------------------------------------------------------ CPU addmm

@pytest.mark.profiles
def test_cpu_work_in_order_shows_the_addmm(tmp_path):
    """nn.Linear with a bias on the CPU is aten::addmm, which copies the bias into its output (aten::copy_) first:
    the GEMM is the unit of work, not the copy."""
    layer, inp = torch.nn.Linear(32, 64), torch.randn(16, 32)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            with record_function("linear_fwd"), torch.no_grad():
                layer(inp)
            prof.step()
    prof.export_chrome_trace(str(tmp_path / "linear.json"))
    t = it.load_trace(tmp_path / "linear.json")
    for st in t.steps:
        assert st.ops({"aten::addmm"}) and [e.name for e in it.cpu_kernels(st)] == ["aten::addmm"]
    work = it.report(t).split("Work in order")[1].split("Inductor C++ kernels")[0]
    assert "aten::addmm" in work and "aten::copy_" not in work


# ------------------------------------------------------------------------------------------------- README

def test_readme_quotes_the_step_table_of_the_h200_trace():
    """The step table and verdict quoted in the reader's page, re-derived from the committed trace."""
    import re

    text = page("docs/reading_traces.md")
    quoted = re.search(r"```\n(Step time \(µs\).*?)```", text, flags=re.S).group(1)
    report = it.report(it.load_trace(DATA / "h200_mlp_eager.json.gz"))
    assert quoted.count("\n") == 9 and "\n" + quoted in report


def test_readme_states_the_verdict_rule_the_reader_applies():
    """The rule paragraph under that block: its thresholds are the reader's, its example is step #2 of the trace."""
    import re


    text = " ".join((ROOT / "docs" / "reading_traces.md").read_text().split())
    rule = re.search(r"busy less than (\d+)% of its window .*? less than (\d+)% of the window \(host%\)", text)
    assert rule and (int(rule.group(1)) / 100, int(rule.group(2)) / 100) == (steps.COMPUTE_BUSY,
                                                                             steps.HOST_WAIT_LARGE)
    example = re.search(r"Step #2 above, the cold first step, is one: busy (\d+)%, yet (\d+)% of it", text)
    step = it.report_data(it.load_trace(DATA / "h200_mlp_eager.json.gz"))["steps"][0]
    assert step["number"] == 2 and step["bound"] == "partly overhead"
    assert example and [int(example.group(1)), int(example.group(2))] == [
        round(100 * step["busy_fraction"]), round(100 * step["host_wait_fraction"])]


def test_memory_peaks_show_when_the_memory_reader_gives_them(monkeypatch):
    """When analyzers/memory.py (per-step peak allocation) answers, the report shows it."""
    import types

    from trace_reader.analyzers import report as report_room

    data = gpu_trace()
    data["traceEvents"].append({"ph": "i", "name": "[memory]", "ts": 1001, "args": {}})
    t = parse(data)
    assert t.has_memory_events
    fake = types.SimpleNamespace(step_peaks=lambda trace: {st.number: (st.number + 1) * 2**20 for st in trace.steps})
    monkeypatch.setattr(report_room, "memory", fake)
    assert it.report_data(t)["memory_peak_bytes"] == {2: 3 * 2**20, 3: 4 * 2**20, 4: 5 * 2**20}
    assert it.report(t).endswith("\n\nPeak allocation per step, above the step's start (MiB): median 4.0, max 5.0")
    assert it.report_data(parse(gpu_trace()))["memory_peak_bytes"] is None  # no [memory] events: not asked



def test_a_long_cpu_trace_is_short_too():
    data = gpu_trace(steps=40)
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    t = parse(data)
    assert t.device == "cpu" and len(t.steps) == 40
    lines = it.report(t).splitlines()
    assert "steps   40 active ProfilerStep (#2..#41)" in lines and len(lines) < 60
    shown = [ln.split()[0] for ln in lines if ln.startswith("#") and ln.split()[0][1:].isdigit()]
    assert shown == ["#2", "#3", "#4", "#39", "#40", "#41"]
    every = [ln.split()[0] for ln in it.report(t, all_steps=True).splitlines() if ln[:1] == "#" and ln[1:2].isdigit()]
    assert every == [f"#{n}" for n in range(2, 42)]


@pytest.mark.profiles
def test_memory_peaks_from_a_real_profile(tmp_path):
    """With trace_reader/memory.py and profile_memory=True, each step's peak shows: a step's two 64x64 fp32 inputs
    and its product are alive at once (3 x 16 KiB)."""
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                 profile_memory=True) as prof:
        for _ in range(4):
            with record_function("fwd"):
                torch.randn(64, 64) @ torch.randn(64, 64)
            prof.step()
    prof.export_chrome_trace(str(tmp_path / "mem.json"))
    d = it.report_data(it.load_trace(tmp_path / "mem.json"))
    assert d["memory_peak_bytes"] == {2: 3 * 64 * 64 * 4, 3: 3 * 64 * 64 * 4}


@pytest.mark.parametrize("script, fixture", [("01_matmul_add", "matmul_add_4096_eager"), ("02_linear", "linear_eager"),
                                             ("03_simple_mlp", "mlp_compile"), ("03_kernels_mlp", "liger"),
                                             ("04_fused_mlp", "fused_eager")])
def test_every_known_script_checks_a_saved_trace(script, fixture):
    """Each script --expect knows builds its guesses from what the trace says: no flag it needs is missing."""
    assert script in it.SCRIPTS
    t = it.load_trace(DATA / f"h200_{fixture}.json.gz")
    exps, said = it.expectations_for(script, t)
    assert said.startswith(f"{script} {'compile' if 'compile' in fixture else 'eager'}, 3 steps") and len(exps) >= 5
    assert all(v in ("confirmed", "broken", "not applicable") for _, v, _ in it.check(t, exps))


def test_the_json_report_is_the_same_whatever_the_hash_seed():
    """A training trace's kernels sit inside two annotations each (train_step and forward, ...): the report built
    from them must not follow Python's per-process string hashing (it once did: three seeds, three outputs)."""
    import os

    trace = ROOT / "tests/data/train/h200_train_mlp_foreach.json.gz"
    outs = {subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--json", str(trace)], capture_output=True,
                           text=True, env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
            for seed in ("1", "2", "3")}
    assert len(outs) == 1


def test_a_cuda_graph_replay_counts_for_the_annotation_it_runs_in():
    """In the committed CUDA-graph decode trace, cudaGraphLaunch carries the id of the compiled region's op, though
    it runs inside the "## Call CompiledFxGraph" annotation within that op: the graph's 72 kernels count for the
    annotation (it showed 1.2 µs of GPU time, the replay's 466 µs going to "decode" alone). By hand: the GPU work of
    every runtime call made inside the annotation's span on its thread, per step; the median over the steps."""
    events = raw("model_decode_cudagraphs")["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    notes = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("## Call CompiledFxGraph")]
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})]
    gpu = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu[e["args"]["correlation"]] = gpu.get(e["args"]["correlation"], 0.0) + e["dur"]
    per_step = []
    for st in steps:
        inside = [n for n in notes if st["ts"] <= n["ts"] <= st["ts"] + st["dur"]]
        per_step.append(sum(gpu.get(c["args"]["correlation"], 0.0) for n in inside for c in calls
                            if c["tid"] == n["tid"] and n["ts"] <= c["ts"] <= n["ts"] + n["dur"]))
    assert min(per_step) > 400  # the replay, not the launch of a kernel or two
    per = it.gpu_time_by_annotation(it.load_trace(DATA / "h200_model_decode_cudagraphs.json.gz"))
    (name,) = [n for n in per if n.startswith("## Call CompiledFxGraph")]
    assert statistics.median(per[name]) == pytest.approx(statistics.median(per_step), rel=1e-6)
