"""`inspect_trace.py --expect FILE TRACE`: expectations of your own, in TOML (reader/trace_reader/declared.py).

Each key on a committed trace where it holds and one where it breaks, the expected verdict worked out here from the
raw JSON in a few lines (kernels, ops, launches counted per ProfilerStep window; shares, peaks and lags from the
events), never from the reader; where no committed trace breaks a check, a copy edited here does. Every mistake a
file can hold is one line and exit code 2; the scripts' own guesses written as files (docs/expect/*.toml) give the
verdicts `--expect SCRIPT` gives, guess by guess. In this process (main()) but for three subprocess cases.
"""

import gzip
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import inspect_trace as it
from trace_reader import declared

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "docs" / "expect"
MLP_EAGER, MLP_COMPILE = DATA / "h200_mlp_eager.json.gz", DATA / "h200_mlp_compile.json.gz"
SMALL, LARGE = DATA / "h200_matmul_add_64_eager.json.gz", DATA / "h200_matmul_add_4096_eager.json.gz"
FOREACH, CKPT = DATA / "train/h200_train_mlp_foreach.json.gz", DATA / "train/h200_train_mlp4_ckpt_memory.json.gz"
CPU_TRACE = DATA / "train_foreign/cpu_compile_break.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
PHASES = ("forward", "backward", "optimizer")


# ---------------------------------------------------------------------------- the raw JSON, read here on its own

def events(path):
    return json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]


def windows(ev, name=None):
    """(start, end) of each ProfilerStep#N span (or of each span named `name`), in time order."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"
                  and (re.fullmatch(r"ProfilerStep#\d+", e["name"]) if name is None else e["name"] == name))


def launches(ev):
    return {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})}


def gpu_per_step(ev, cats=GPU_CATS):
    """Per step, the GPU events whose launch call lies in the step's window (a kernel belongs to its launch's step)."""
    calls = launches(ev)
    out = []
    for a, b in windows(ev):
        out.append([e for e in ev if e.get("cat") in cats and (c := calls.get(e["args"].get("correlation")))
                    and a <= c["ts"] <= b])
    return out


def ops_per_step(ev, cat="cpu_op"):
    return [[e["name"] for e in ev if e.get("cat") == cat and a <= e["ts"] <= b] for a, b in windows(ev)]


def union(intervals):
    total, cur = 0.0, None
    for a, b in sorted(intervals):
        if cur is None or a > cur[1]:
            total += cur[1] - cur[0] if cur else 0.0
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + (cur[1] - cur[0] if cur else 0.0)


def busy_bounds(path):
    """Per step, two raw figures around the GPU's busy share: busy over the step's start to its last GPU end (idle
    the step did not cause counts against it: a floor), busy over its first GPU start to its last GPU end (only the
    gaps between its own work count: a ceiling)."""
    ev = events(path)
    low, high = [], []
    for (a, b), work in zip(windows(ev), gpu_per_step(ev)):
        busy, end = union([(e["ts"], e["ts"] + e["dur"]) for e in work]), max(e["ts"] + e["dur"] for e in work)
        low.append(busy / (max(b, end) - a))
        high.append(busy / (end - min(e["ts"] for e in work)))
    return low, high


def phase_windows(ev):
    """{phase: its annotation's windows} in 07_train_step's traces (record_function("forward"), ...)."""
    return {p: windows(ev, p) for p in PHASES}


# ---------------------------------------------------------------------------- running a file of guesses

def toml(*entries):
    """The [[expect]] tables for `entries` (dicts), as a user would write them."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v) if isinstance(v, str) else repr(v)
    return "\n".join("[[expect]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in e.items()) for e in entries)


def run(tmp_path, capsys, trace, text, name="mine.toml", extra=()):
    """(exit code, stdout, stderr) of `inspect_trace.py --expect FILE TRACE` with FILE holding `text`."""
    f = tmp_path / name
    f.write_bytes(text) if isinstance(text, bytes) else f.write_text(text)
    code = it.main(["--expect", str(f), *extra, str(trace)])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(tmp_path, capsys, trace, cases):
    """Each case's verdict (ok, BROKEN, n/a), one file of them all; the exit code follows the verdicts."""
    code, out, err = run(tmp_path, capsys, trace, toml(*[entry for entry, _ in cases]))
    lines = [ln.split()[0] for ln in out.split("Expectations (guess first, then look):\n", 1)[1].splitlines()
             if ln.startswith(("  ok ", "  BROKEN ", "  n/a "))]
    assert err == "" and code == (1 if "BROKEN" in lines else 0), err
    return lines


def check_cases(tmp_path, capsys, trace, cases):
    got = verdicts(tmp_path, capsys, trace, cases)
    want = [expected for _, expected in cases]
    assert got == want, [(e, g, w) for (e, w), g in zip(cases, got) if g != w]
    return got


def ok(holds: bool) -> str:
    return "ok" if holds else "BROKEN"


# ---------------------------------------------------------------------------- each key: holds, breaks, n/a

def test_counts_per_step_on_the_eager_mlp(tmp_path, capsys):
    ev = events(MLP_EAGER)
    steps = windows(ev)
    kernels = [[e["name"] for e in w] for w in gpu_per_step(ev, ("kernel",))]
    counts = [len(k) for k in kernels]
    gemms = [sum(bool(re.search("nvjet", n)) for n in k) for k in kernels]
    ops = ops_per_step(ev)
    linear = [n.count("aten::linear") for n in ops]
    calls = launches(ev)
    launched = [{e["args"]["correlation"] for e in w} for w in gpu_per_step(ev)]
    memsets = [len({c for c in ls if calls[c]["name"] == "cudaMemsetAsync"}) for ls in launched]
    memcpys = [len(w) for w in gpu_per_step(ev, ("gpu_memcpy",))]
    annotated = [any(e["name"] == "mlp_fwd" and a <= e["ts"] <= b for e in ev if e.get("cat") == "user_annotation")
                 for a, b in steps]
    assert len(steps) == 3 and counts == [5, 5, 5] and gemms == [3, 3, 3], (counts, gemms)  # the post's 5 and 3
    present = lambda names, rx: all(any(re.search(rx, n) for n in ns) for ns in names)  # noqa: E731
    absent = lambda names, rx: not any(re.search(rx, n) for ns in names for n in ns)  # noqa: E731
    n, lo, hi = counts[0], min(counts), max(counts)
    cases = [
        ({"steps": len(steps)}, "ok"), ({"steps": len(steps) + 1}, "BROKEN"),
        ({"annotation": "mlp_fwd"}, ok(all(annotated))), ({"annotation": "mlp_fwd", "steps": len(steps) + 1}, "BROKEN"),
        ({"annotation": "no_such_span"}, "BROKEN"),
        ({"kernels_per_step": n}, ok(all(c == n for c in counts))), ({"kernels_per_step": n + 1}, "BROKEN"),
        ({"kernels_per_step": {"min": lo, "max": hi}}, "ok"), ({"kernels_per_step": {"min": hi + 1}}, "BROKEN"),
        ({"kernels_per_step": {"max": lo - 1}}, "BROKEN"),
        ({"kernels_per_step": gemms[0], "match": "nvjet"}, ok(all(g == gemms[0] for g in gemms))),
        ({"kernels_per_step": gemms[0] + 1, "match": "nvjet"}, "BROKEN"),
        ({"kernels_per_step": {"min": 1}, "match": "elementwise"}, ok(present(kernels, "elementwise"))),
        ({"kernels_per_step": {"max": 0}, "match": "nvjet"}, "BROKEN"),
        ({"kernel": "Gelu|gelu"}, ok(present(kernels, "Gelu|gelu"))), ({"kernel": "^triton_"}, ok(present(kernels, "^triton_"))),
        ({"kernel_absent": "^triton_"}, ok(absent(kernels, "^triton_"))), ({"kernel_absent": "nvjet"}, ok(absent(kernels, "nvjet"))),
        ({"cpu_op": "^aten::gelu$"}, ok(present(ops, "^aten::gelu$"))), ({"cpu_op": "^aten::softmax$"}, ok(present(ops, "^aten::softmax$"))),
        ({"cpu_op_absent": "^aten::softmax$"}, ok(absent(ops, "^aten::softmax$"))),
        ({"cpu_op_absent": "^aten::mul$"}, ok(absent(ops, "^aten::mul$"))),
        ({"cpu_event": "^mlp_fwd$"}, ok(all(annotated))), ({"cpu_event": "^Torch-Compiled Region"}, "BROKEN"),
        ({"ops_per_step": {"min": min(map(len, ops)), "max": max(map(len, ops))}}, "ok"),
        ({"ops_per_step": max(map(len, ops)) + 1}, "BROKEN"),
        ({"ops_per_step": linear[0], "match": "^aten::linear$"}, ok(all(x == linear[0] for x in linear))),
        ({"ops_per_step": linear[0] + 1, "match": "^aten::linear$"}, "BROKEN"),
        ({"launches_per_step": len(launched[0])}, ok(all(len(x) == len(launched[0]) for x in launched))),
        ({"launches_per_step": len(launched[0]) + 1}, "BROKEN"),
        ({"launches_per_step": memsets[0], "match": "^cudaMemsetAsync$"}, ok(all(m == memsets[0] for m in memsets))),
        ({"launches_per_step": {"min": memsets[0] + 1}, "match": "^cudaMemsetAsync$"}, "BROKEN"),
        ({"memcpys_per_step": 0}, ok(not any(memcpys))), ({"memcpys_per_step": {"min": 1}}, ok(all(memcpys))),
    ]
    check_cases(tmp_path, capsys, MLP_EAGER, cases)


def test_a_memcpy_per_step_and_split_k_reduces(tmp_path, capsys):
    """01's compiled run copies the bias into the output every step; the split-K fixture's GEMMs each add a reduce
    kernel, which an exact count and a range both leave out (the scripts' kernels_per_step does)."""
    memcpys = [len(w) for w in gpu_per_step(events(DATA / "h200_matmul_add_64_compile.json.gz"), ("gpu_memcpy",))]
    check_cases(tmp_path, capsys, DATA / "h200_matmul_add_64_compile.json.gz",
                [({"memcpys_per_step": {"min": 1}}, ok(all(memcpys))), ({"memcpys_per_step": 0}, ok(not any(memcpys)))])
    splitk = DATA / "shapes/h200_fused_splitk_2x128x2304x9216.json.gz"
    kernels = [[e["name"] for e in w] for w in gpu_per_step(events(splitk), ("kernel",))]
    reduces = [sum(bool(re.search("splitKreduce", n)) for n in k) for k in kernels]
    launched = [len(k) - r for k, r in zip(kernels, reduces)]
    assert all(reduces) and len(set(launched)) == 1, (reduces, launched)
    n = launched[0]
    check_cases(tmp_path, capsys, splitk, [({"kernels_per_step": n}, "ok"), ({"kernels_per_step": {"min": n, "max": n + 0}}, "ok"),
                                           ({"kernels_per_step": {"min": n - 1, "max": n}}, "ok"),
                                           ({"kernels_per_step": {"min": n + 1}}, "BROKEN")])


def test_busy_and_bound(tmp_path, capsys):
    """Size 64 idles, 4096 computes: the raw floor and ceiling of each step's busy share sit well off 50%."""
    _, small_ceiling = busy_bounds(SMALL)
    large_floor, _ = busy_bounds(LARGE)
    assert max(small_ceiling) < 0.3 and statistics.median(large_floor) > 0.5, (small_ceiling, large_floor)
    cases = [({"busy_below": 0.5}, "ok"), ({"busy_above": 0.5}, "BROKEN"), ({"bound": "overhead"}, "ok"),
             ({"bound": "compute"}, "BROKEN"), ({"busy_above": 0.0, "busy_below": 0.3}, "ok")]
    check_cases(tmp_path, capsys, SMALL, cases)
    cases = [({"busy_above": 0.5}, "ok"), ({"busy_below": 0.5}, "BROKEN"), ({"bound": "overhead"}, "BROKEN")]
    check_cases(tmp_path, capsys, LARGE, cases)


def test_lag_cold_start_and_buffer_request(tmp_path, capsys):
    def lags(path):  # per step, the first launch's kernel start minus the launch
        ev = events(path)
        calls = launches(ev)
        return [min((calls[e["args"]["correlation"]]["ts"], e["ts"] - calls[e["args"]["correlation"]]["ts"])
                    for e in w)[1] for w in gpu_per_step(ev)]
    free, synced = lags(DATA / "h200_matmul_add_4096_active20_eager.json.gz"), lags(
        DATA / "h200_matmul_add_4096_active20_sync_eager.json.gz")
    assert free[-1] > 10 * min(free) and max(synced) < 2 * min(synced) + 50, (free, synced)
    grows = [({"gpu_lag_grows": True}, "ok"), ({"gpu_lag_grows": False}, "BROKEN")]
    check_cases(tmp_path, capsys, DATA / "h200_matmul_add_4096_active20_eager.json.gz", grows)
    check_cases(tmp_path, capsys, DATA / "h200_matmul_add_4096_active20_sync_eager.json.gz",
                [(e, "BROKEN" if v == "ok" else "ok") for e, v in grows])

    ev = events(SMALL)  # per step: entering record_function("matmul_add") to its first aten op
    gaps = [min(e["ts"] for e in ev if e.get("cat") == "cpu_op" and a <= e["ts"] <= b) - a
            for a, b in windows(ev, "matmul_add")]
    later = gaps[1:]
    assert 2 * max(later) < gaps[0] < 10 * min(later), gaps  # cold: well over 2x the later steps, under 10x
    check_cases(tmp_path, capsys, SMALL, [({"cold_start_gap": "matmul_add", "ratio": 2}, "ok"),
                                          ({"cold_start_gap": "matmul_add", "ratio": 10}, "BROKEN"),
                                          ({"cold_start_gap": "matmul_add", "cold": False, "ratio": 10}, "ok")])

    for path in (DATA / "h200_matmul_add_64_wait0_eager.json.gz", SMALL):
        found = any(e.get("name") == "Activity Buffer Request" for e in events(path))
        check_cases(tmp_path, capsys, path, [({"buffer_request": True}, ok(found))])


def test_launches_of_a_cuda_graph(tmp_path, capsys):
    """Under CUDA graphs a step launches its kernels in a few calls: launches_per_step counts the calls."""
    path = DATA / "h200_model_decode_cudagraphs.json.gz"
    ev, work = events(path), gpu_per_step(events(path))
    calls = launches(ev)
    launched = [len({e["args"]["correlation"] for e in w}) for w in work]
    graph = [len({e["args"]["correlation"] for e in w if calls[e["args"]["correlation"]]["name"] == "cudaGraphLaunch"})
             for w in work]
    # a split-K GEMM's reduce kernel is the GEMM's second half, counted with it (as the scripts' kernels_per_step)
    kernels = [sum(e["cat"] == "kernel" and "splitKreduce" not in e["name"] for e in w) for w in work]
    assert all(g >= 1 for g in graph) and all(n < k for n, k in zip(launched, kernels)), (launched, graph, kernels)
    check_cases(tmp_path, capsys, path, [
        ({"launches_per_step": {"min": min(launched), "max": max(launched)}}, "ok"),
        ({"launches_per_step": {"min": min(kernels)}}, "BROKEN"),
        ({"launches_per_step": graph[0], "match": "^cudaGraphLaunch$"}, ok(len(set(graph)) == 1)),
        ({"kernels_per_step": {"min": min(kernels)}}, "ok")])


def occupancy_queried(data):
    """The eager MLP with cudaOccupancyMaxActiveBlocksPerMultiprocessor asked, in its op, just before each GEMM's
    launch (as cuBLAS does on CUDA 12): every GEMM launch queried, no pointwise one."""
    ev = data["traceEvents"]
    calls = launches(ev)
    gemm_launches = {e["args"]["correlation"] for e in ev if e.get("cat") == "kernel" and "nvjet" in e["name"]}
    for c in gemm_launches:
        call = calls[c]
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                   "pid": call["pid"], "tid": call["tid"], "ts": call["ts"] - 0.5, "dur": 0.2, "args": {}})
    return data


def test_occupancy_and_views(tmp_path, capsys):
    ev = events(MLP_EAGER)
    assert not any(e.get("name") == "cudaOccupancyMaxActiveBlocksPerMultiprocessor" for e in ev)
    views = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] in ("aten::t", "aten::view", "aten::reshape",
                                                                         "aten::transpose", "aten::_unsafe_view")]
    calls = launches(ev).values()
    assert views and not any(v["ts"] <= c["ts"] <= v["ts"] + v["dur"] and c["tid"] == v["tid"] for v in views
                             for c in calls)  # no launch call inside any view op
    check_cases(tmp_path, capsys, MLP_EAGER, [({"occupancy_before_gemms": True}, "BROKEN"),
                                              ({"views_launch_nothing": True}, "ok")])
    data = json.loads(gzip.decompress(MLP_EAGER.read_bytes()))
    queried = tmp_path / "queried.json"
    queried.write_text(json.dumps(occupancy_queried(data)))
    for e in data["traceEvents"]:  # and aten::mm renamed a view: a view that launches a GEMM
        if e.get("name") == "aten::mm":
            e["name"] = "aten::view"
    (tmp_path / "renamed.json").write_text(json.dumps(data))
    check_cases(tmp_path, capsys, queried, [({"occupancy_before_gemms": True}, "ok")])
    check_cases(tmp_path, capsys, tmp_path / "renamed.json", [({"views_launch_nothing": True}, "BROKEN")])


def train_raw(path):
    """Per step of a 07_train_step trace: each phase's GPU share (the work launched inside its annotation, over the
    three phases'), backward's GEMM FLOPs over forward's (aten::mm, 2*M*K*N), the optimizer's foreach and fused ops,
    the step's peak allocation above its start, where the allocator's total peaks and how much is held when forward
    ends (above the step's lowest)."""
    ev = events(path)
    calls, ph = launches(ev), phase_windows(ev)
    gpu = [e for e in ev if e.get("cat") in GPU_CATS and e["args"].get("correlation") in calls]
    mem = sorted((e for e in ev if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1),
                 key=lambda e: e["ts"])
    inside = lambda ts, w: w[0] <= ts <= w[1]  # noqa: E731
    out = []
    for i, step in enumerate(windows(ev)):
        t = {p: sum(e["dur"] for e in gpu if inside(calls[e["args"]["correlation"]]["ts"], ph[p][i])) for p in PHASES}
        flops = {p: sum(2 * d[0][0] * d[0][1] * d[1][1] for e in ev if e.get("cat") == "cpu_op"
                        and e["name"] == "aten::mm" and inside(e["ts"], ph[p][i]) for d in [e["args"]["Input Dims"]])
                 for p in ("forward", "backward")}
        opt = [e["name"] for e in ev if e.get("cat") == "cpu_op" and inside(e["ts"], ph["optimizer"][i])]
        allocs = [e["args"] for e in mem if inside(e["ts"], step)]
        top = max((e for e in mem if inside(e["ts"], step)), key=lambda e: e["args"]["Total Allocated"])
        low = min(a["Total Allocated"] - max(a["Bytes"], 0) for a in allocs)
        held = [e["args"]["Total Allocated"] for e in mem if inside(e["ts"], step) and e["ts"] <= ph["forward"][i][1]]
        out.append({"share": {p: t[p] / sum(t.values()) for p in PHASES}, "flops": flops["backward"] / flops["forward"],
                    "foreach": sum(n.startswith("aten::_foreach_") for n in opt),
                    "fused": sum(n.startswith("aten::_fused_") for n in opt), "ops": len(opt),
                    "peak": max(a["Total Allocated"] for a in allocs) - (allocs[0]["Total Allocated"] - allocs[0]["Bytes"]),
                    "peak_in": next((p for p in PHASES if inside(top["ts"], ph[p][i])), None),
                    "held_share": (held[-1] - low) / (top["args"]["Total Allocated"] - low)})
    return out


def test_training_keys(tmp_path, capsys):
    raw = train_raw(FOREACH)
    back = [s["share"]["backward"] for s in raw]
    peak = max(s["peak"] for s in raw) / 2**20
    ratio = [s["flops"] for s in raw]
    assert 0.3 < min(back) and max(back) < 0.8 and all(1.6 < r < 2.4 for r in ratio), (back, ratio)
    assert all(s["foreach"] and not s["fused"] for s in raw) and all(s["ops"] < 1000 for s in raw)
    cases = [
        ({"phase": "backward", "share_above": min(back) - 0.1}, "ok"),
        ({"phase": "backward", "share_above": max(back) + 0.1}, "BROKEN"),
        ({"phase": "backward", "share_above": min(back) - 0.1, "share_below": max(back) + 0.1}, "ok"),
        ({"phase": "optimizer", "share_below": min(s["share"]["optimizer"] for s in raw) - 0.05}, "BROKEN"),
        ({"phase": "forward", "share_below": max(s["share"]["forward"] for s in raw) + 0.05}, "ok"),
        # 2% either side: MiB, not MB (5% apart)
        ({"peak_below_mib": 1.02 * peak}, "ok"), ({"peak_below_mib": 0.98 * peak}, "BROKEN"),
        ({"peak_above_mib": 0.98 * peak}, "ok"), ({"peak_above_mib": 1.02 * peak}, "BROKEN"),
        ({"phases_present": True}, "ok"),
        ({"backward_over_forward_flops": {"min": 1.5, "max": 2.5}}, "ok"),
        ({"backward_over_forward_flops": {"min": 2.5}}, "BROKEN"),
        ({"optimizer": "foreach", "ops_per_parameter": 3}, "ok"),  # the run's own verdict (its recording log)
        ({"optimizer": "fused"}, "BROKEN"), ({"optimizer": "for-loop"}, "BROKEN"),
        ({"peak_phase": "forward_end"}, ok(all(s["peak_in"] in ("forward", "backward") and s["held_share"] >= 0.5
                                               for s in raw))),
        ({"peak_phase": "forward_or_backward"}, ok(all(s["peak_in"] in ("forward", "backward") for s in raw))),
    ]
    check_cases(tmp_path, capsys, FOREACH, cases)

    forloop = DATA / "train/h200_train_mlp_forloop.json.gz"
    assert not any(s["foreach"] or s["fused"] for s in train_raw(forloop)) and all(s["ops"] < 1000 for s in train_raw(forloop))
    check_cases(tmp_path, capsys, forloop, [({"optimizer": "for-loop", "ops_per_parameter": 3}, "ok"),
                                            ({"optimizer": "for-loop", "ops_per_parameter": 1000}, "BROKEN"),
                                            ({"optimizer": "foreach"}, "BROKEN")])
    raw = train_raw(CKPT)  # checkpointed: the peak comes in backward, little of it held when forward ends
    check_cases(tmp_path, capsys, CKPT, [
        ({"peak_phase": "backward"}, ok(all(s["peak_in"] == "backward" for s in raw))),
        ({"peak_phase": "forward_end"}, ok(all(s["held_share"] >= 0.5 for s in raw))),
        ({"backward_over_forward_flops": {"min": 2.25, "max": 3.5}}, ok(all(2.25 <= s["flops"] <= 3.5 for s in raw)))])


def test_training_keys_broken_by_an_edited_trace(tmp_path, capsys):
    """The foreach run with a 10 GiB block allocated and freed inside each optimizer phase (the peak moves there),
    and with the optimizer's GPU work taken out (a phase with no time of its own)."""
    data = json.loads(gzip.decompress(FOREACH.read_bytes()))
    ev = data["traceEvents"]
    ph = phase_windows(ev)
    mem = sorted((e for e in ev if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1),
                 key=lambda e: e["ts"])
    for a, b in ph["optimizer"]:
        before = [e for e in mem if e["ts"] < (a + b) / 2][-1]
        for ts, nbytes in (((a + b) / 2, 10 * 2**30), ((a + b) / 2 + 0.01, -10 * 2**30)):
            total = before["args"]["Total Allocated"] + (10 * 2**30 if nbytes > 0 else 0)
            ev.append({**before, "ts": ts, "args": {**before["args"], "Bytes": nbytes, "Total Allocated": total,
                                                    "Addr": 12345}})
    (tmp_path / "big.json").write_text(json.dumps(data))
    check_cases(tmp_path, capsys, tmp_path / "big.json", [
        ({"peak_phase": "forward_end"}, "BROKEN"), ({"peak_phase": "backward"}, "BROKEN"),
        ({"peak_phase": "forward_or_backward"}, "BROKEN"), ({"peak_below_mib": 10 * 1024}, "BROKEN")])
    calls = launches(ev)
    data["traceEvents"] = [e for e in ev if not (e.get("cat") in GPU_CATS and (c := calls.get(e["args"].get("correlation")))
                                                 and any(a <= c["ts"] <= b for a, b in ph["optimizer"]))]
    (tmp_path / "no_optimizer_work.json").write_text(json.dumps(data))
    check_cases(tmp_path, capsys, tmp_path / "no_optimizer_work.json", [({"phases_present": True}, "BROKEN"),
                                                                       ({"phase": "optimizer", "share_below": 0.01}, "ok")])


def test_what_a_trace_cannot_answer_is_not_applicable(tmp_path, capsys):
    """No training phases, no memory events (the eager MLP's inference trace); no GPU (a CPU trace); no CPU ops."""
    ev = events(MLP_EAGER)
    assert not any(e.get("name") == "[memory]" or e["name"].startswith("autograd::engine") for e in ev if "name" in e)
    training = [{"phase": "backward", "share_above": 0.5}, {"phases_present": True}, {"optimizer": "foreach"},
                {"backward_over_forward_flops": {"min": 1.5}}, {"peak_phase": "forward_end"}]
    check_cases(tmp_path, capsys, MLP_EAGER, [(e, "n/a") for e in training] + [({"peak_below_mib": 1}, "n/a")])
    cpu = events(CPU_TRACE)
    assert not any(e.get("cat") in GPU_CATS + ("cuda_runtime", "cuda_driver") for e in cpu)
    gpu_only = [{"kernels_per_step": 1}, {"kernel": "."}, {"kernel_absent": "."}, {"busy_above": 0.5},
                {"bound": "compute"}, {"launches_per_step": 1}, {"memcpys_per_step": 0},
                {"occupancy_before_gemms": True}, {"views_launch_nothing": True}, {"gpu_lag_grows": True},
                {"cold_start_gap": "x"}, {"buffer_request": True}, {"cpu_op": ".", "device": "cuda"}]
    ops = ops_per_step(cpu)
    check_cases(tmp_path, capsys, CPU_TRACE, [(e, "n/a") for e in gpu_only] + [
        ({"cpu_op": "^aten::mm$", "device": "cpu"}, ok(all("aten::mm" in n for n in ops))),
        ({"ops_per_step": {"min": min(map(len, ops))}}, "ok")])
    data = json.loads(gzip.decompress(MLP_EAGER.read_bytes()))  # its ops taken out: "none" of nothing is no answer
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "cpu_op"]
    (tmp_path / "no_ops.json").write_text(json.dumps(data))
    check_cases(tmp_path, capsys, tmp_path / "no_ops.json", [({"cpu_op_absent": "^aten::add$"}, "n/a"),
                                                             ({"ops_per_step": {"max": 3}, "match": "add"}, "n/a"),
                                                             ({"ops_per_step": 0}, "ok")])


def test_says_and_the_default_claim(tmp_path, capsys):
    code, out, _ = run(tmp_path, capsys, MLP_EAGER, toml({"says": "one GEMM per linear, three per step",
                                                           "kernels_per_step": 3, "match": "gemm|cutlass|nvjet"},
                                                          {"kernels_per_step": 4}))
    assert code == 1
    assert "\n  ok      one GEMM per linear, three per step\n" in out
    assert "\n  BROKEN  4 GPU kernels per step\n          seen: kernels per step: [5, 5, 5]" in out
    assert f"\n{tmp_path / 'mine.toml'}: 2 expectations of your own, 3 steps in the trace\n" in out
    code, out, _ = run(tmp_path, capsys, MLP_EAGER, toml({"kernels_per_step": 5}), extra=["--json"])
    assert code == 0 and json.loads(out)["expectations"] == [{"guess": "5 GPU kernels per step", "verdict": "confirmed",
                                                              "seen": ""}]


# ---------------------------------------------------------------------------- mistakes: one line, exit code 2

MISTAKES = [
    ("[[expect]]\nsteps = 3\n[[expect]]\nbusy_above = 0.5\n[[expect]]\nkernal = 'gemm'\n",
     "expect[3]: unknown key 'kernal' (did you mean 'kernel'?)"),
    ("[[expect]]\nwhatever = 1\n", "expect[1]: unknown key 'whatever' (docs/expect_file.md lists the keys)"),
    ("[[expect]]\nkernels_per_step = 'three'\n", "expect[1]: kernels_per_step must be a count per step, an integer "
     ">= 0 (3) or a range ({min = 2, max = 5}), got a string 'three'"),
    ("[[expect]]\nkernels_per_step = -1\n", "expect[1]: kernels_per_step must be a count per step"),
    ("[[expect]]\nkernels_per_step = true\n", "expect[1]: kernels_per_step must be a count per step"),
    ("[[expect]]\nkernels_per_step = {min = 3, max = 2}\n", "expect[1]: kernels_per_step: min 3 is more than max 2"),
    ("[[expect]]\nkernels_per_step = {mn = 3}\n", "expect[1]: kernels_per_step: unknown key 'mn' in its table"),
    ("[[expect]]\nsteps = 2.5\n", "expect[1]: steps must be an integer >= 0, got a number 2.5"),
    ("[[expect]]\nbusy_above = 1.5\n", "expect[1]: busy_above must be a share between 0 and 1 (0.8 for 80%), got a number 1.5"),
    ("[[expect]]\nbusy_above = nan\n", "expect[1]: busy_above must be a share between 0 and 1"),
    ("[[expect]]\nbusy_above = 0.8\nbusy_below = 0.2\n", "expect[1]: busy_above 0.8 is not below busy_below 0.2"),
    ("[[expect]]\npeak_below_mib = 0\n", "expect[1]: peak_below_mib must be a number of MiB above 0, got an integer 0"),
    ("[[expect]]\nbound = 'memory'\n", "expect[1]: bound must be one of 'overhead', 'compute', got a string 'memory'"),
    ("[[expect]]\nphase = 'warmup'\nshare_above = 0.5\n", "expect[1]: phase must be one of 'forward', 'backward', "
     "'optimizer'"),
    ("[[expect]]\nphase = 'backward'\n", "expect[1]: 'phase' needs share_above or share_below"),
    ("[[expect]]\nshare_above = 0.5\n", "expect[1]: no check in it: give one of steps, annotation, kernels_per_step"),
    ("[[expect]]\nsays = 'nothing else'\n", "expect[1]: no check in it"),
    ("[[expect]]\noccupancy_before_gemms = false\n", "expect[1]: occupancy_before_gemms takes true"),
    ("[[expect]]\ngpu_lag_grows = 'yes'\n", "expect[1]: gpu_lag_grows must be true or false, got a string 'yes'"),
    ("[[expect]]\nsays = 3\nkernel = 'x'\n", "expect[1]: says must be a name, one line of 1 to 500 characters"),
    ("[[expect]]\nsays = \"two\\nlines\"\nkernel = 'x'\n", "expect[1]: says must be a name, one line"),
    ("[[expect]]\nkernel = 'gemm('\n", "expect[1]: kernel: bad regular expression 'gemm(': missing ), unterminated "
     "subpattern at position 4"),
    ("[[expect]]\nkernels_per_step = 1\nmatch = '[a-'\n", "expect[1]: match: bad regular expression '[a-'"),
    ("[[expect]]\nkernel = 'x'\nbusy_above = 0.5\n", "expect[1]: two checks in one entry ('kernel' and 'busy_above')"),
    ("[[expect]]\nkernel = 'x'\nmatch = 'y'\n", "expect[1]: 'match' does not go with 'kernel' (it goes with "
     "kernels_per_step, ops_per_step, launches_per_step)"),
    ("[[expect]]\nkernel = 'x'\ndevice = 'cpu'\n", "expect[1]: 'device' does not go with 'kernel'"),
    ("[[expect]]\ncpu_op = 'x'\ndevice = 'tpu'\n", "expect[1]: device must be one of 'any', 'cuda', 'cpu'"),
    ("[[expect]]\noptimizer = 'adam'\n", "expect[1]: optimizer must be one of 'for-loop', 'foreach', 'fused'"),
    ("[[expect]]\nbackward_over_forward_flops = 2\n", "expect[1]: backward_over_forward_flops must be a range"),
    ("[[expect]]\ncold_start_gap = 'x'\nratio = -1\n", "expect[1]: ratio must be a number above 0"),
    ("", "no [[expect]] tables: nothing to check"),
    ("# only a comment\n", "no [[expect]] tables: nothing to check"),
    ("expect = []\n", "no [[expect]] tables: nothing to check"),
    ("expct = 1\n", "unknown top-level key 'expct' (did you mean 'expect'?): the file holds [[expect]] tables"),
    ("[expect]\nkernel = 'x'\n", "'expect' must be an array of tables, each written [[expect]], got a table"),
    ("expect = [1, 2]\n", "expect[1]: must be a table of keys"),
    ("[[expect]\nkernel = 'x'\n", "not TOML: "),
    ("kernel = gemm\n", "not TOML: "),
    (b"[[expect]]\nkernel = '\xff'\n", "not UTF-8 text (a bad byte at offset 21), so not TOML"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "not TOML"),
    ("[[expect]]\nkernel = 'x'\n" * 1001, "1,001 [[expect]] tables, more than the 1,000 a file may hold"),
]


@pytest.mark.parametrize("text, message", MISTAKES, ids=[m[:40] for _, m in MISTAKES])
def test_a_mistake_in_the_file_is_one_line(text, message, tmp_path, capsys):
    """Read before any trace: the trace named here does not exist, and the file's mistake is what is said."""
    f = tmp_path / "mine.toml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    code = it.main(["--expect", str(f), str(tmp_path / "no-such-trace.json")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"inspect_trace.py: error: {f}: {message}"), err


def test_too_big_missing_a_folder(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * (10 * 2**20) + b"\n")
    missing, folder = tmp_path / "missing.toml", tmp_path / "folder.toml"
    folder.mkdir()
    for path, said in ((big, "10.0 MiB, more than the 1 MiB an expectations file may be"), (missing, "no such file"),
                       (folder, "a folder, not an expectations file")):
        assert it.main(["--expect", str(path), str(MLP_EAGER)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"inspect_trace.py: error: {path}: {said}\n"


def test_a_script_name_a_toml_or_any_other_file(tmp_path, monkeypatch, capsys):
    """The rule: a script's name is the script (even beside a file of that name); a .toml is a file; another value
    is a file if one exists by that name, unless it ends in .py (then today's "not one of the scripts")."""
    monkeypatch.chdir(tmp_path)
    for name in ("03_simple_mlp", "guesses", "01_matmul_add.py"):
        (tmp_path / name).write_text(toml({"kernels_per_step": 5}))
    assert [declared.names_file(v) for v in ("03_simple_mlp", "guesses", "01_matmul_add.py", "gone.toml", "gone",
                                             None)] == [False, True, False, True, False, False]
    assert it.main(["--expect", "guesses", str(MLP_EAGER)]) == 0
    assert "guesses: 1 expectation of your own" in capsys.readouterr().out
    assert it.main(["--expect", "gone", str(MLP_EAGER)]) == 2
    assert capsys.readouterr().err.startswith("inspect_trace.py: error: --expect gone: not one of the scripts it knows")


# ---------------------------------------------------------------------------- exit codes, as a shell sees them

@pytest.mark.subprocess
def test_exit_codes_in_a_shell(tmp_path):
    def shell(*args):
        return subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), *map(str, args)], capture_output=True,
                              text=True, cwd=ROOT, timeout=60)
    held = shell("--expect", EXAMPLES / "03_simple_mlp_compile.toml", MLP_COMPILE)
    broken = shell("--expect", EXAMPLES / "03_simple_mlp_eager.toml", MLP_EAGER)  # no occupancy query on CUDA 13
    missing = shell("--expect", tmp_path / "missing.toml", MLP_EAGER)
    assert (held.returncode, held.stderr) == (0, "") and "6 confirmed, 0 broken, 1 not applicable" in held.stdout
    assert broken.returncode == 1 and "  6 confirmed, 1 broken, 0 not applicable" in broken.stdout
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"inspect_trace.py: error: {tmp_path / 'missing.toml'}: no such file\n"


# ---------------------------------------------------------------------------- the scripts' guesses, as files

# (file, script, the trace of a run with that configuration, the script's guesses the file leaves out)
PAIRS = [
    ("01_matmul_add_64", "01_matmul_add", "h200_matmul_add_64_eager", ()),
    ("01_matmul_add_64", "01_matmul_add", "h200_matmul_add_64_wait0_eager",
     ("wait=0, warmup=0: an 'Activity Buffer Request' event on the GPU lane",)),  # a flag of that run: buffer_request
    ("01_matmul_add_4096", "01_matmul_add", "h200_matmul_add_4096_eager", ()),
    ("01_matmul_add_compile", "01_matmul_add", "h200_matmul_add_64_compile", ()),
    ("03_simple_mlp_eager", "03_simple_mlp", "h200_mlp_eager", ()),
    ("03_simple_mlp_eager", "03_simple_mlp", "h200_mlp_warm_eager", ()),
    ("03_simple_mlp_compile", "03_simple_mlp", "h200_mlp_compile", ()),
    ("07_train_step", "07_train_step", "train/h200_train_mlp_foreach", ()),
    ("07_train_step", "07_train_step", "train/h200_train_mlp4_memory", ()),
    ("07_train_step_forloop", "07_train_step", "train/h200_train_mlp_forloop", ()),
    ("07_train_step_checkpoint", "07_train_step", "train/h200_train_mlp4_ckpt_memory", ()),
]


@pytest.mark.parametrize("name, script, trace, left_out", PAIRS, ids=[f"{n}-{t}" for n, _, t, _ in PAIRS])
def test_a_scripts_guesses_as_a_file_give_its_verdicts(name, script, trace, left_out):
    """Guess by guess (paired by the claim, which the file words as the script does): the same verdict and the same
    detail; every guess of the file is the script's, and the script's are all in the file but `left_out`."""
    t = it.load_trace(DATA / f"{trace}.json.gz")
    theirs = {ex.text: (v, d) for ex, v, d in it.check(t, it.expectations_for(script, t)[0])}
    ours = [(ex.text, v, d) for ex, v, d in it.check(t, declared.read(str(EXAMPLES / f"{name}.toml")).expectations(t)[0])]
    assert [text for text, _, _ in ours if text not in theirs] == []
    assert sorted(set(theirs) - {text for text, _, _ in ours}) == sorted(left_out)
    assert [(text, v) for text, v, _ in ours] == [(text, theirs[text][0]) for text, _, _ in ours]
    assert any(v != "confirmed" for v, _ in theirs.values()) or len(ours) >= 5
    for text, v, d in ours:  # the details too, but where the file counts ops with a regex (its own wording)
        assert d == theirs[text][1] or ("per step" in text and v == "broken"), text


def test_every_example_file_is_checked():
    assert {p.stem for p in EXAMPLES.glob("*.toml")} == {n for n, _, _, _ in PAIRS} | {"example"}


def test_the_doc_pages_example_prints_what_it_quotes(capsys):
    """docs/expect_file.md quotes the verdicts of docs/expect/example.toml on the compiled MLP's H200 trace."""
    page = (ROOT / "docs/expect_file.md").read_text()
    quoted = re.search(r"```text\n(docs/expect/example.toml: .*?)```", page, flags=re.S).group(1)
    assert it.main(["--expect", str(EXAMPLES / "example.toml"), str(MLP_COMPILE)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n" + quoted.replace("docs/expect/example.toml", str(EXAMPLES / "example.toml"), 1))
