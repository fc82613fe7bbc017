"""The one-trace report as data (report_data: what --json writes): GPU work per step, each step's time and verdict,
GPU and CPU time per annotation, CPU self time, the CPU's work per thread, compiled regions, views, occupancy
queries, memory, training. render/report_text.py prints it, short at any trace length."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from ..facts.kernels import (
    VIEW_OPS,
    cpu_lanes,
    gemm_flops,
    is_gemm,
    is_pointwise,
    most_common,
    op_dtype,
    pointwise_bytes,
    view_cuda_time,
)
from ..facts.peaks import device_peak
from ..facts.schema import SCHEMA_VERSION
from ..reading.events import DUR, Trace, TraceError
from . import memory, training
from .annotations import cpu_time_by_annotation, gpu_time_by_annotation
from .compiled import compiled_regions
from .steps import steps_facts, typical_of


def _versions(trace: Trace) -> dict:
    """Version fields of the trace's metadata (a few, short: the metadata is as untrusted as the rest)."""
    found = {k[:40]: v if not isinstance(v, str) else v[:40] for k, v in trace.meta.items()
             if ("version" in k.lower() or k.lower() in ("torch", "triton")) and isinstance(v, (str, int, float))
             and not isinstance(v, bool)}
    return dict(list(found.items())[:8])


def shapes_recorded(trace: Trace) -> bool:
    """Did the profiler record the ops' input shapes (record_shapes=True)? Rates need them."""
    return any("Input Dims" in e.args for st in trace.steps for e in st.spans if e.cat == "cpu_op")


def kernel_groups(trace: Trace) -> list[dict]:
    """Kernels grouped by (name, launching op) in first-launch order, with their per-call numbers."""
    groups: dict[tuple, dict] = {}
    peak = device_peak(trace.device_name)
    for st in trace.steps:
        for k in st.gpu:
            op = k.op
            key = (k.name, op.name if op is not None else "?")
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"name": k.name, "op": key[1], "durs": [], "lags": [], "rates": [], "unit": None,
                                   "peak": None}
            g["durs"].append(k.dur)
            if k.launch is not None:
                g["lags"].append(k.event.ts - k.launch.ts)
            # The op's work is spread over all the kernels it launched (e.g. a split-K GEMM's two kernels);
            # a workspace memset is not part of the math.
            op_time = sum(x.dur for x in op.kernels if x.is_kernel) if op is not None else 0.0
            if not k.is_kernel or op_time <= 0:
                continue
            gemm = is_gemm(k)  # else, being a kernel, it is_pointwise
            flops = gemm_flops(op) if gemm else None
            kf = op.args.get("kernel_flop")
            if flops is None and gemm and type(kf) in (int, float) and 0 < kf < 1e18:
                flops = float(kf)  # an Inductor Triton GEMM carries its own count
            if flops is not None:
                g["unit"] = "TFLOP/s"
                g["rates"].append(flops / op_time / 1e6)
                if peak is not None:
                    g["peak"] = peak.tflops.get(op_dtype(op) or "")
            elif not gemm and (moved := pointwise_bytes(op, trace.kernel_sources)) is not None:
                g["unit"] = "GB/s" if moved[1] else "GB/s+"  # "+": a lower bound, see pointwise_bytes
                g["rates"].append(moved[0] / op_time / 1e3)
                if peak is not None:
                    g["peak"] = peak.gbs
    return list(groups.values())


def cpu_self_times(trace: Trace) -> list[dict]:
    """CPU ops, annotations and runtime calls (cudaLaunchKernel, cudaDeviceSynchronize, ...) by self time per
    step, largest first: a span's self time excludes its child spans and the runtime calls made inside it."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(trace.steps))
    calls: Counter = Counter()
    for i, st in enumerate(trace.steps):
        for e in st.spans:
            name, spent = e.name, e.self_time  # less its runtime calls (no sum over nothing)
            if e.calls:
                spent -= sum(map(DUR, e.calls))
            per[name][i] += spent
            calls[name] += 1
        for owner in [st.span, *st.spans]:
            for c in owner.calls:
                per[c.name][i] += c.dur
                calls[c.name] += 1
    n = max(len(trace.steps), 1)
    rows = [{"name": name, "calls_per_step": calls[name] / n, "self_us_per_step": sum(v) / n, "per_step_us": v}
            for name, v in per.items()]
    return sorted(rows, key=lambda r: -r["self_us_per_step"])


def _memory(trace: Trace) -> dict[int, float] | None:
    """Per-step peak allocation from memory.py (when the trace has [memory] events)."""
    if not trace.has_memory_events:
        return None
    try:
        peaks = memory.step_peaks(trace)
    except (OSError, TraceError, ValueError):
        return None
    return {int(k): float(v) for k, v in peaks.items()} if peaks else None  # None: no allocation on the device


def report_data(trace: Trace) -> dict:
    """The whole one-trace report as plain data (str, int, float, None, lists, dicts): what --json writes.

    Keys: schema_version (the --json schema's, facts/schema.py), trace, whole_trace (no ProfilerStep#N spans: one step spans the whole trace), device, device_name,
    versions, skipped_events, shapes_recorded, peak, steps (one dict per step: kernels, cpu_us, gpu_busy_us,
    wall_us, busy_fraction, host_wait_fraction, bound, lag_us, idle_us), typical_step (the median step's
    number, bound, busy_fraction, host_wait_fraction and idle_us), kernels (GPU: one dict per kernel and
    launching op), same_order and step_orders (the steps grouped by their sequence of units: GPU kernels, or the
    CPU's kernels), cpu_work (CPU traces: the CPU's kernels in order, thread by thread) and cpu_work_steps (the
    steps it is the mean of), cpu_ops, annotations (GPU µs per step), annotations_cpu (CPU µs per step),
    compiled (torch.compile's regions, see compiled.py), views, occupancy, memory_peak_bytes (per step, when
    recorded), training (a training step's phases, see training.py; None without a backward)."""
    peak = device_peak(trace.device_name)
    steps = steps_facts(trace)
    t = typical_of(steps)
    typical = None if t is None else {k: t[k] for k in ("number", "bound", "busy_fraction", "host_wait_fraction",
                                                          "idle_us")}
    n = max(len(trace.steps), 1)
    total = sum(k.dur for st in trace.steps for k in st.gpu) or 1.0
    kernels = []
    for g in kernel_groups(trace):
        rate = statistics.mean(g["rates"]) if g["rates"] else None
        kernels.append({
            "name": g["name"], "launched_by": g["op"], "calls_per_step": len(g["durs"]) / n,
            "mean_us": statistics.mean(g["durs"]), "min_us": min(g["durs"]), "max_us": max(g["durs"]),
            "lag_us_median": statistics.median(g["lags"]) if g["lags"] else None,
            "gpu_share": sum(g["durs"]) / total, "rate": rate, "unit": g["unit"] and g["unit"].rstrip("+"),
            "rate_is_lower_bound": g["unit"] == "GB/s+", "peak": g["peak"],
            "of_peak": rate / g["peak"] if rate is not None and g["peak"] else None})
    views: dict[str, list] = {}
    for st in trace.steps:
        for op in st.ops(VIEW_OPS):
            nk, t = view_cuda_time(op)
            v = views.setdefault(op.name, [0, 0, 0.0])
            v[0], v[1], v[2] = v[0] + 1, v[1] + nk, v[2] + t
    launches = [k for st in trace.steps for k in st.kernels if k.launch is not None]
    occupancy = []
    for label, pick in (("GEMM", is_gemm), ("pointwise/other", is_pointwise)):
        sel = [k for k in launches if pick(k)]
        if sel:
            occupancy.append({"kernels": label, "with_query": sum(k.occupancy_query for k in sel), "launches": len(sel),
                              "launch_calls": sorted({k.launch.name for k in sel})})
    lanes = [cpu_lanes(st) for st in trace.steps] if trace.device == "cpu" else None
    seqs = [tuple(e.name for _, evs in ls for e in evs) for ls in lanes] if lanes is not None else \
        [tuple(k.name for k in st.kernels) for st in trace.steps]
    cpu_work, cpu_work_steps = _cpu_work(lanes, most_common(seqs)) if lanes is not None else ([], 0)
    return {
        "schema_version": SCHEMA_VERSION, "trace": trace.path, "whole_trace": trace.whole, "device": trace.device, "device_name": trace.device_name,
        "versions": _versions(trace), "skipped_events": trace.skipped, "shapes_recorded": shapes_recorded(trace),
        "peak": None if peak is None else {"source": peak.source, "tflops": peak.tflops, "gbs": peak.gbs},
        "steps": steps, "typical_step": typical, "kernels": kernels, **_orders(trace, seqs),
        "cpu_work": cpu_work, "cpu_work_steps": cpu_work_steps,
        "cpu_ops": [{k: v for k, v in r.items() if k != "per_step_us"} for r in cpu_self_times(trace)],
        "annotations": gpu_time_by_annotation(trace), "annotations_cpu": cpu_time_by_annotation(trace),
        "compiled": compiled_regions(trace),
        "views": [{"op": k, "calls_per_step": v[0] / n, "kernels_per_step": v[1] / n, "cuda_us_per_step": v[2] / n}
                  for k, v in sorted(views.items())],
        "occupancy": occupancy,
        "memory_peak_bytes": _memory(trace),
        "training": _training(trace),
    }


def _training(trace: Trace) -> dict | None:
    """A training step's phases and forward/backward links (training.py); None without a backward."""
    return training.analyze(trace)


def _orders(trace: Trace, seqs: list[tuple[str, ...]]) -> dict:
    """same_order, and step_orders: the steps grouped by their sequence of units (seqs, one per step; most common
    first), each group with its step numbers and unit count."""
    groups: dict[tuple, list[int]] = {}
    for st, seq in zip(trace.steps, seqs):
        groups.setdefault(seq, []).append(st.number)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))  # stable: ties keep the first step's order
    return {"same_order": len(groups) <= 1,
            "step_orders": [{"steps": nums, "units": len(seq)} for seq, nums in ranked]}


def _cpu_work(lanes_per_step: list[list[tuple]], seq: list[str]) -> tuple[list[dict], int]:
    """The CPU's kernels of the typical sequence seq, thread by thread (kernels.cpu_lanes of each step), each timed
    over the steps in that sequence, per position (two calls of one op stay apart); and how many steps that is.
    lane 0 is the thread running the step loop; tids: the thread ids seen at that position."""
    durs: list[list[float]] = [[] for _ in seq]
    lanes: list[int] = [0] * len(seq)
    tids: list[set] = [set() for _ in seq]
    used = 0
    for step_lanes in lanes_per_step:
        work = [(lane, tid, e) for lane, (tid, evs) in enumerate(step_lanes) for e in evs]
        if [e.name for _, _, e in work] != seq:
            continue
        used += 1
        for i, (lane, tid, e) in enumerate(work):
            durs[i].append(e.dur)
            tids[i].add(tid)
            lanes[i] = lane if used == 1 else lanes[i]
    work = [{"name": name, "mean_us": statistics.mean(d), "min_us": min(d), "max_us": max(d), "lane": lane,
             "tids": sorted(ts, key=str)} for name, d, lane, ts in zip(seq, durs, lanes, tids)]
    return work, used
