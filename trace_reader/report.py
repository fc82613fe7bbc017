"""The one-trace report: GPU work per step, each step's time and verdict (overhead-, partly overhead- or
compute-bound), why the GPU idles, GPU and CPU time per annotation, CPU self time, the CPU's work per thread,
compiled regions, views, occupancy queries. report_data() is the report as data
(what --json writes); report() prints it, short at any trace length."""

from __future__ import annotations

import bisect
import math
import statistics
from collections import Counter, defaultdict

from .compiled import compiled_regions, describe
from .kernels import (CPP_KERNEL_RE, VIEW_OPS, _view_cuda_time, cpu_lanes, gemm_flops, is_gemm, is_pointwise,
                      most_common, op_dtype, pointwise_bytes, short)
from .peaks import device_peak
from .read import (_DUR, BACKWARD_RE, MAX_US, OCCUPANCY, STEP_RE, Event, Kernel, Step, Trace, TraceError, _no_gc,
                   plural)

# Steps shown one per row; a longer trace shows its first and last EDGE steps and quantiles (--all-steps: all).
STEP_ROWS = 8
EDGE = 3
TOP_OPS = 8  # CPU ops by self time on a GPU trace
TOP_ANNOTATIONS = 8
RECORD_SHAPES = "profile with torch.profiler.profile(..., record_shapes=True) to record them"
# The verdict (README, "Guess first, then look"): overhead-bound below COMPUTE_BUSY of GPU busy time; at or above
# it, compute-bound only while the GPU waits on the host less than HOST_WAIT_LARGE of the step: a step that busy
# which still waits that long for launches is "partly overhead"-bound (launching sooner would shorten it too).
COMPUTE_BUSY = 0.5
HOST_WAIT_LARGE = 0.2


def _table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    """A plain-text table: reads the same in a terminal, a pipe or a file."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(r):
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _num(x: float) -> str:
    """Three significant figures at most, so a tiny GEMM reads 0.27, not 0."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2g}"


def _spread(values: list[float]) -> str:
    return f"{_us(min(values))}–{_us(max(values))}" if len(values) > 1 else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _quantile(values: list[float], q: float) -> float:
    """The value at quantile q of the sorted values (nearest rank): a real step's number, never an average."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _step_numbers(steps: list[Step]) -> str:
    """#2, #3, #4 — or #2..#601 when the numbers run on."""
    nums = [st.number for st in steps]
    if len(nums) > 4 and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"#{nums[0]}..#{nums[-1]}"
    if len(nums) > 8:
        return ", ".join(f"#{n}" for n in nums[:EDGE]) + ", ..., " + ", ".join(f"#{n}" for n in nums[-EDGE:])
    return ", ".join(f"#{n}" for n in nums)


# ------------------------------------------------------------------------------------------------ the facts

def _versions(trace: Trace) -> dict:
    """Version fields of the trace's metadata (a few, short: the metadata is as untrusted as the rest)."""
    found = {k[:40]: v if not isinstance(v, str) else v[:40] for k, v in trace.meta.items()
             if ("version" in k.lower() or k.lower() in ("torch", "triton")) and isinstance(v, (str, int, float))
             and not isinstance(v, bool)}
    return dict(list(found.items())[:8])


def shapes_recorded(trace: Trace) -> bool:
    """Did the profiler record the ops' input shapes (record_shapes=True)? Rates need them."""
    return any("Input Dims" in e.args for st in trace.steps for e in st.spans if e.cat == "cpu_op")


def _group(trace: Trace) -> list[dict]:
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


def _idle(trace: Trace) -> list[tuple[float, float]]:
    """Per step, (waiting on the host, waiting after the launch): the GPU idle time the step is answerable for.

    On the GPU's own timeline (all steps' work, overlapping streams merged), each gap ends when some work
    starts; the gap belongs to that work's step, counted from the step's start at the earliest. The part of
    the gap before the work was launched is the GPU waiting on the host (the CPU had not asked yet); the rest,
    after the launch, is launch latency or earlier work on another stream. After the step's last work, while
    its CPU span still runs and no other work does, the GPU waits on the host too. When the CPU runs ahead
    (no synchronize per step), a step's work queues behind the previous step's and its gaps close: its GPU
    time is all busy, however late the work starts after its launch.
    """
    n = len(trace.steps)
    host, after = [0.0] * n, [0.0] * n
    # Work with no launch in the trace (launch at inf) sorts after launched work that starts and ends with it.
    items = sorted((k.event.ts, k.event.end, k.launch.ts if k.launch is not None else math.inf, i)
                   for i, st in enumerate(trace.steps) for k in st.gpu)
    merged: list[list[float]] = []
    cursor = float("-inf")
    for start, end, launch, i in items:
        gap_start = max(cursor, trace.steps[i].span.ts)
        if start > gap_start:
            gap = start - gap_start
            waited = min(max(launch - gap_start, 0.0), gap) if launch != math.inf else 0.0
            host[i] += waited
            after[i] += gap - waited
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
        cursor = max(cursor, end)
    starts = [m[0] for m in merged]
    for i, st in enumerate(trace.steps):
        if st.gpu:
            last = max(k.event.end for k in st.gpu)
            host[i] += _free(merged, starts, last, st.span.end)
    return list(zip(host, after))


def _free(merged: list[list[float]], starts: list[float], a: float, b: float) -> float:
    """Time in [a, b] covered by none of the merged (sorted, disjoint) intervals."""
    if b <= a:
        return 0.0
    covered = 0.0
    for lo, hi in merged[max(bisect.bisect_right(starts, a) - 1, 0):bisect.bisect_right(starts, b)]:
        covered += max(0.0, min(hi, b) - max(lo, a))
    return b - a - covered


def verdict(busy_fraction: float, host_wait_fraction: float) -> str:
    """"overhead", "partly overhead" or "compute": the rule at COMPUTE_BUSY and HOST_WAIT_LARGE."""
    if busy_fraction < COMPUTE_BUSY:
        return "overhead"
    return "partly overhead" if host_wait_fraction >= HOST_WAIT_LARGE else "compute"


def _step_facts(st: Step, idle: tuple[float, float] | None) -> dict:
    busy, wall, lags = st.gpu_busy, st.wall, st.lags()
    host, after = idle if idle is not None and st.gpu else (None, None)
    window = busy + host + after if host is not None else 0.0
    frac = busy / window if window > 0 else None
    host_frac = host / window if window > 0 else None
    return {
        "number": st.number, "kernels": len(st.kernels), "gpu_work": len(st.gpu),
        "cpu_us": st.cpu_time, "gpu_busy_us": busy, "wall_us": wall, "busy_fraction": frac,
        "host_wait_fraction": host_frac, "bound": None if frac is None else verdict(frac, host_frac),
        "lag_us": {"median": statistics.median(lags), "max": max(lags)} if lags else None,
        "idle_us": None if host is None else {"waiting_on_host": host, "after_launch": after},
    }


def _steps_facts(trace: Trace) -> list[dict]:
    return [_step_facts(st, idle) for st, idle in zip(trace.steps, _idle(trace))]


def bound_of(trace: Trace) -> tuple[str, float] | None:
    """("overhead"|"partly overhead"|"compute", GPU busy fraction) of the typical step: the median step by GPU
    busy fraction, busy / (busy + the GPU idle time the step is answerable for, see _idle).

    Each step is judged on its own (see verdict: overhead-bound when the GPU idles more than half the time
    because the CPU cannot launch work fast enough); pooling steps would let one cold step decide. With an even
    count the lower median is taken."""
    f = _typical(_steps_facts(trace))
    return None if f is None else (f["bound"], f["busy_fraction"])


def _typical(steps: list[dict]) -> dict | None:
    """The median step by GPU busy fraction (the lower one for an even count), None without GPU work."""
    judged = [f for f in steps if f["busy_fraction"] is not None]
    if not judged:
        return None
    frac = statistics.median_low(f["busy_fraction"] for f in judged)
    return next(f for f in judged if f["busy_fraction"] == frac)


def gpu_time_by_annotation(trace: Trace) -> dict[str, list[float]]:
    """{record_function name: GPU time (µs) per active step} of the work launched inside each annotation,
    nested ones included (a module's time holds its submodules'). Kernels on overlapping streams count each
    their own time. ProfilerStep#k is not an annotation here; an annotation absent from a step counts 0.
    Backward work launched on the autograd engine's thread counts for the annotations open on the step's own
    thread at its launch (`with record_function("backward"): loss.backward()`), see annotations_around.
    Kernels with the same annotations are summed first, then added to each of theirs: a step's thousands of
    kernels under a few dozen modules add to each module's row once per module set, not once per kernel."""
    per: dict[str, list[float]] = {}
    cache: dict = {}
    for i, st in enumerate(trace.steps):
        by_names: dict[frozenset, float] = {}
        for k in st.gpu:
            names = _around(k, st, cache)
            by_names[names] = by_names.get(names, 0.0) + k.dur
        for names, dur in by_names.items():
            for name in sorted(names):
                _row(per, name, len(trace.steps))[i] += dur
    return per


def _row(per: dict[str, list[float]], name: str, n: int) -> list[float]:
    """per[name], n zeros when new (built only then: a row per event would be 10^5 lists of 5,000 steps)."""
    row = per.get(name)
    if row is None:
        row = per[name] = [0.0] * n
    return row


def cpu_time_by_annotation(trace: Trace) -> dict[str, list[float]]:
    """{record_function name: CPU time (µs) per active step}: the durations of its spans, on every thread, an
    instance inside another of the same name on its thread counted once. ProfilerStep#k is not an annotation
    here; an annotation absent from a step counts 0."""
    per: dict[str, list[float]] = {}
    for i, st in enumerate(trace.steps):
        open_until: dict[tuple, float] = {}  # (name, thread) -> end of the instance counted last
        for e in st.spans:  # in time order: an enclosing instance comes first
            if e.cat != "user_annotation" or STEP_RE.match(e.name):
                continue
            key = (e.name, e.pid, e.tid)
            if e.ts < open_until.get(key, float("-inf")):
                continue
            open_until[key] = e.end
            _row(per, e.name, len(trace.steps))[i] += e.dur
    return per


def annotations_around(k: Kernel, st: Step, cache: dict | None = None) -> list[str]:
    """The record_function names (ProfilerStep#k aside) around the CPU call that launched k in step st, sorted (so
    that the tables and the JSON built from them keep one order from run to run, whatever the string hashes).

    A kernel launched by the autograd engine (its call's outermost op an `autograd::engine::evaluate_function`,
    on a thread that holds no step span) also counts for the annotations open on the step's thread when it was
    launched: the thread that called backward() waits inside them while the engine works for it. And a launch
    whose op is an outer span (a CUDA graph's replay: cudaGraphLaunch carries the id of the compiled region's op,
    though it runs inside the "## Call CompiledFxGraph" annotation within it) also counts for the annotations
    under that op that hold the launch call in time. cache: what the walks found, kept across calls on one trace."""
    return sorted(_around(k, st, {} if cache is None else cache))


# Python's recursion limit (1000) bounds a real stack of `with record_function(...)`; a made-up chain deeper than
# this is walked this far, so that a hostile trace's walks stay linear in its kernels.
MAX_NESTING = 1024


def _around(k: Kernel, st: Step, cache: dict) -> frozenset[str]:
    """annotations_around's names, unsorted: one frozenset per op where nothing is added to the walk's."""
    names, top = _up(k.op, st, cache)
    extra = set()
    if top is not None and k.launch is not None:
        extra = _open_on_step_thread(st, top, k.launch.ts, cache)
    if k.op is not None and k.launch is not None and k.op.children:
        extra |= _annotations_below(k.op, k.launch.ts, cache)
    return names | extra if extra - names else names


def _up(op: Event | None, st: Step, cache: dict) -> tuple[frozenset[str], Event | None]:
    """(the annotations from op up to st's span, the autograd engine op at the top of the walk when the walk
    left the step: backward work on the engine's thread), found once per op."""
    key = ("up", id(op))
    if (got := cache.get(key)) is not None:
        return got
    names, node, top = set(), op, None
    for _ in range(MAX_NESTING):
        if node is None or node is st.span:
            break
        if node.cat == "user_annotation" and not STEP_RE.match(node.name):
            names.add(node.name)
        top, node = node, node.parent
    engine = top if node is None and top is not None and BACKWARD_RE.match(top.name) else None
    got = cache[key] = (frozenset(names), engine)
    return got


def _annotations_below(op: Event, ts: float, starts: dict) -> set[str]:
    """The annotations among op's descendants that hold ts: one span per level, found by bisection (children are
    kept in time order and do not overlap on one thread)."""
    names, node = set(), op
    for _ in range(64):  # deeper than a real call stack under one op; a made-up chain stops here
        children = node.children
        if not children:
            break
        at = starts.get(id(node))
        if at is None:
            at = starts[id(node)] = [c.ts for c in children]
        i = bisect.bisect_right(at, ts) - 1
        if i < 0 or not children[i].ts <= ts <= children[i].end:
            break
        node = children[i]
        if node.cat == "user_annotation" and not STEP_RE.match(node.name):
            names.add(node.name)
    return names


def _open_on_step_thread(st: Step, engine_op: Event, ts: float, cache: dict) -> set[str]:
    """Annotations open at ts on the step's thread (the thread of its ProfilerStep span; without one, any thread
    but the engine's)."""
    threads = _annotation_threads(st, cache)
    if st.span.tid is not None:
        lanes = [threads[key]] if (key := (st.span.pid, st.span.tid)) in threads else []
    else:
        lanes = [lane for thread, lane in threads.items() if thread != (engine_op.pid, engine_op.tid)]
    names = set()
    for starts, spans, outer, nested in lanes:
        if not nested:  # spans that overlap without one holding the other: each one looked at
            names.update(e.name for e in spans if e.ts <= ts <= e.end)
            continue
        first, past = bisect.bisect_left(starts, ts), bisect.bisect_right(starts, ts)
        names.update(e.name for e in spans[first:min(past, first + MAX_NESTING)])  # those that start at ts
        i = first - 1
        for _ in range(MAX_NESTING):  # up from the last to start before ts: each one holds the next one found
            if i < 0:
                break
            if spans[i].end >= ts:
                names.add(spans[i].name)
            i = outer[i]
    return names


def _annotation_threads(st: Step, cache: dict) -> dict[tuple, tuple[list[float], list[Event], list[int], bool]]:
    """{thread: (starts, annotation spans in time order (the longer first at one start), the index of the one
    around each (-1 for none), whether each one that overlaps another holds it or is held)} of st's annotations,
    ProfilerStep#k aside; made once per step. A span of no length holds nothing after its instant: it is no one's
    outer span (a thousand of them in a row would make a chain of closed spans)."""
    key = ("threads", id(st))
    if (got := cache.get(key)) is not None:
        return got
    lanes: dict[tuple, list[Event]] = defaultdict(list)
    for e in st.spans:
        if e.cat == "user_annotation" and not STEP_RE.match(e.name):
            lanes[e.pid, e.tid].append(e)
    got = cache[key] = {}
    for thread, spans in lanes.items():
        spans.sort(key=lambda e: (e.ts, -e.dur))
        outer, open_, nested = [], [], True
        for j, e in enumerate(spans):
            while open_ and spans[open_[-1]].end < e.end:  # not around e: closed before e ends
                nested = nested and spans[open_[-1]].end <= e.ts  # closed before e starts, or it overlaps e
                open_.pop()
            outer.append(open_[-1] if open_ else -1)
            if e.dur > 0:
                open_.append(j)
        got[thread] = ([e.ts for e in spans], spans, outer, nested)
    return got


def cpu_self_times(trace: Trace) -> list[dict]:
    """CPU ops, annotations and runtime calls (cudaLaunchKernel, cudaDeviceSynchronize, ...) by self time per
    step, largest first: a span's self time excludes its child spans and the runtime calls made inside it."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(trace.steps))
    calls: Counter = Counter()
    for i, st in enumerate(trace.steps):
        for e in st.spans:
            name, spent = e.name, e.self_time  # less its runtime calls (no sum over nothing)
            if e.calls:
                spent -= sum(map(_DUR, e.calls))
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
    """Per-step peak allocation from trace_reader/memory.py (when present and the trace has [memory] events)."""
    if not trace.has_memory_events:
        return None
    try:
        from . import memory  # optional: the per-step memory reader
    except ImportError:
        return None
    try:
        peaks = memory.step_peaks(trace)
    except (OSError, TraceError, ValueError):
        return None
    return {int(k): float(v) for k, v in peaks.items()} if peaks else None  # None: no allocation on the device


def report_data(trace: Trace) -> dict:
    """The whole one-trace report as plain data (str, int, float, None, lists, dicts): what --json writes.

    Keys: trace, whole_trace (no ProfilerStep#N spans: one step spans the whole trace), device, device_name,
    versions, skipped_events, shapes_recorded, peak, steps (one dict per step: kernels, cpu_us, gpu_busy_us,
    wall_us, busy_fraction, host_wait_fraction, bound, lag_us, idle_us), typical_step (the median step's
    number, bound, busy_fraction, host_wait_fraction and idle_us), kernels (GPU: one dict per kernel and
    launching op), same_order and step_orders (the steps grouped by their sequence of units: GPU kernels, or the
    CPU's kernels), cpu_work (CPU traces: the CPU's kernels in order, thread by thread) and cpu_work_steps (the
    steps it is the mean of), cpu_ops, annotations (GPU µs per step), annotations_cpu (CPU µs per step),
    compiled (torch.compile's regions, see compiled.py), views, occupancy, memory_peak_bytes (per step, when
    recorded), training (a training step's phases, see training.py; None without a backward)."""
    peak = device_peak(trace.device_name)
    steps = _steps_facts(trace)
    t = _typical(steps)
    typical = None if t is None else {k: t[k] for k in ("number", "bound", "busy_fraction", "host_wait_fraction",
                                                          "idle_us")}
    n = max(len(trace.steps), 1)
    total = sum(k.dur for st in trace.steps for k in st.gpu) or 1.0
    kernels = []
    for g in _group(trace):
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
            nk, t = _view_cuda_time(op)
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
        "trace": trace.path, "whole_trace": trace.whole, "device": trace.device, "device_name": trace.device_name,
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
    from . import training  # training.py builds on expect.py, which imports this file

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


# -------------------------------------------------------------------------------------------------- the text

def _header(trace: Trace, data: dict) -> list[str]:
    out = [f"trace   {trace.path}"]
    if trace.device == "cuda" and trace.device_props:
        p = trace.device_props[0]
        extra = []
        if type(p.get("computeMajor")) is int:
            minor = p.get("computeMinor")
            extra.append(f"sm_{p['computeMajor']}{minor if type(minor) is int else ''}")
        if type(p.get("numSms")) is int:
            extra.append(f"{p['numSms']} SMs")
        if type(p.get("totalGlobalMem")) in (int, float) and 0 < p["totalGlobalMem"] < 2**60:
            extra.append(f"{p['totalGlobalMem'] / 2**30:.0f} GiB")
        out.append(f"device  {trace.device_name or '? (no usable name)'}" + (f" ({', '.join(extra)})" if extra else ""))
    elif trace.device == "cuda":
        out.append("device  a GPU (no deviceProperties in the trace)")
    else:
        gpu = f"; the machine has {trace.device_name}, not profiled" if trace.device_name else ""
        out.append(f"device  CPU only (no GPU activity in the trace{gpu})")
    if data["versions"]:
        out.append("versions " + ", ".join(f"{k}={v}" for k, v in data["versions"].items()))
    if trace.whole:
        out.append("steps   none (no ProfilerStep#N spans): the whole trace is read as one step; record with "
                   "schedule(...) and prof.step() for per-step numbers")
    else:
        out.append(f"steps   {len(trace.steps)} active ProfilerStep ({_step_numbers(trace.steps)})")
    if trace.skipped:
        out.append(f"skipped {trace.skipped} events with unusable times (missing, NaN, negative or beyond "
                   f"{int(MAX_US / 3.6e9)} hours): not counted anywhere below")
    return out


def report(trace: Trace, full_names: bool = False, all_steps: bool = False) -> str:
    """The one-trace report, as plain text; all_steps=True lists every step of a long trace."""
    with _no_gc():
        data = report_data(trace)
        lines = _header(trace, data)
        if not trace.steps:
            return "\n".join(lines + ["no active ProfilerStep#N spans: nothing to report per step"])
        lines.append("")
        gpu = trace.device == "cuda"
        lines += _text_gpu(data, full_names, all_steps) if gpu else _text_cpu(data, full_names, all_steps)
        from .training import text as training_text  # see _training

        lines += training_text(data["training"])
        return "\n".join(lines)


def _step_rows(steps: list[dict], cols: list, all_steps: bool) -> list[list]:
    """One row per step; past STEP_ROWS, the first and last EDGE steps, then min / median / p90 / max per column
    (each a real step's value, nearest rank). cols: (header, format a step, its value or None)."""
    def row(f):
        return [f"#{f['number']}"] + [fmt(f) for _, fmt, _ in cols]

    if all_steps or len(steps) <= STEP_ROWS:
        return [row(f) for f in steps]
    rows = [row(f) for f in steps[:EDGE]] + [["..."] + [""] * len(cols)] + [row(f) for f in steps[-EDGE:]]
    rows.append([""] * (len(cols) + 1))
    columns = []  # per column: (format, the steps with a value, their values), read once for the four rows
    for _, fmt, value in cols:
        have = [f for f in steps if value is not None and value(f) is not None]
        columns.append((fmt, have, [value(f) for f in have]))
    for label, q in (("min", 0.0), ("median", 0.5), ("p90", 0.9), ("max", 1.0)):
        cells = []
        for fmt, have, values in columns:
            target = _quantile(values, q) if have else None
            cells.append(next(fmt(f) for f, v in zip(have, values) if v == target) if have else "")
        rows.append([label] + cells)
    return rows


def _order_line(d: dict, what: str, verb: str) -> str:
    """Whether every step has the same sequence of units (what: "kernel", "unit of work"), else its groups."""
    orders = d["step_orders"]  # one group at least: the report has returned before this without a step
    if d["same_order"]:
        return f"every step {verb} the same {plural(orders[0]['units'], what)} in the same order"
    parts, counts = [], set()
    for g in orders:
        nums = g["steps"]
        where = ", ".join(f"#{x}" for x in nums[:4]) + (", ..." if len(nums) > 4 else "")
        again = " in another order" if g["units"] in counts else ""
        counts.add(g["units"])
        parts.append(f"{plural(len(nums), 'step')} with {plural(g['units'], what)}{again} ({where})")
    return "steps differ: " + "; ".join(parts)


def _why(t: dict) -> str:
    """The typical step's verdict in words, with the numbers that decided it (see verdict)."""
    if t["bound"] == "overhead":
        return "the GPU waits on the CPU to launch work: fewer, bigger kernels (or CUDA graphs) help"
    if t["bound"] == "partly overhead":
        host = t["idle_us"]["waiting_on_host"]  # the typical step is judged: it has an idle split
        return (f"it also waits {_us(host)} µs ({_pct(t['host_wait_fraction'])}) on the host: faster kernels and "
                "fewer launches both help")
    return "the GPU is the bottleneck: faster kernels help, launch overhead does not"


def _lag(step: dict, which: str) -> float | None:
    return step["lag_us"][which] if step["lag_us"] else None


def _text_gpu(d: dict, full: bool, all_steps: bool) -> list[str]:
    n = len(d["steps"])
    rows, lower_bound = [], False
    for i, g in enumerate(d["kernels"], 1):
        rate = g["rate"]
        achieved = "-" if rate is None else f"{_num(rate)} {g['unit']}"
        if g["rate_is_lower_bound"]:
            achieved, lower_bound = f">={_num(rate)} GB/s", True
        of_peak = "unknown" if rate is not None and not g["peak"] else "-"
        if g["of_peak"] is not None:
            of_peak = f"{_num(100 * g['of_peak'])}% of {g['peak']:,.0f}"
        rows.append([i, short(g["name"], full), g["launched_by"], f"{g['calls_per_step']:g}", _us(g["mean_us"]),
                     _spread([g["min_us"], g["max_us"]]) if n > 1 else "-", _us(g["lag_us_median"]),
                     f"{100 * g['gpu_share']:.1f}%", achieved, of_peak])
    out = [f"GPU work per step, in launch order (mean over {n} steps; µs per call; lag: launch to start, median):"]
    out.append(_table(["#", "kernel", "launched by", "calls/step", "mean µs", "min–max", "lag", "GPU share",
                       "achieved", "of peak"], rows, right={0, 3, 4, 5, 6, 7, 8}))
    if not d["shapes_recorded"]:
        out.append(f"achieved: empty, this trace has no tensor shapes ({RECORD_SHAPES})")
    if lower_bound:
        out.append(">= : Triton kernel whose source was not read (--kernel-files reads it); a buffer it reads and "
                   "writes (in_out_ptr) counted once")
    src = d["peak"]["source"] if d["peak"] else "unknown (device not in torch's datasheet table)"
    out.append(f"peak: {d['device_name'] or '?'}: {src}")
    out.append(_order_line(d, "kernel", "launches"))

    out.append("")
    out.append("Step time (µs): wall = from step start until its last GPU work ends; "
               "busy% = GPU busy / (busy + GPU idle the step caused); host% = its GPU idle waiting on the host")
    out.append("lag = launch call to kernel start: it grows when the CPU runs ahead of the GPU")
    cols = [
        ("kernels", lambda f: f["kernels"], lambda f: f["kernels"]),
        ("GPU busy", lambda f: _us(f["gpu_busy_us"]), lambda f: f["gpu_busy_us"]),
        ("CPU span", lambda f: _us(f["cpu_us"]), lambda f: f["cpu_us"]),
        ("wall", lambda f: _us(f["wall_us"]), lambda f: f["wall_us"]),
        ("busy%", lambda f: _pct(f["busy_fraction"]), lambda f: f["busy_fraction"]),
        ("host%", lambda f: _pct(f["host_wait_fraction"]), lambda f: f["host_wait_fraction"]),
        ("verdict", lambda f: f["bound"] or "-", None),
        ("lag median", lambda f: _us(_lag(f, "median")), lambda f: _lag(f, "median")),
        ("lag max", lambda f: _us(_lag(f, "max")), lambda f: _lag(f, "max")),
    ]
    out.append(_table(["step"] + [c[0] for c in cols], _step_rows(d["steps"], cols, all_steps),
                      right=set(range(1, len(cols) + 1)) - {7}))
    if n > STEP_ROWS and not all_steps:
        out.append(f"({n} steps: the first and last {EDGE}, then each column's quantiles; --all-steps lists all)")
    t = d["typical_step"]
    if t is not None:
        kinds = Counter(f["bound"] for f in d["steps"] if f["bound"])
        tally = ", ".join(f"{c} {k}-bound" for k, c in kinds.most_common())
        out.append(f"=> typical step (median, #{t['number']}): {t['bound']}-bound, GPU busy {_pct(t['busy_fraction'])} "
                   f"of the step ({tally}); {_why(t)}")
        idle = [f["idle_us"] for f in d["steps"] if f["idle_us"]]
        host = statistics.median(i["waiting_on_host"] for i in idle)
        after = statistics.median(i["after_launch"] for i in idle)
        out.append(f"   GPU idle per step (median): {_us(host)} µs waiting on the host (work not yet launched), "
                   f"{_us(after)} µs after the launch (launch latency, earlier work)")

    out.append("")
    out += _text_annotations(d, full, gpu=True)
    out += _text_compiled(d)

    ops = d["cpu_ops"][:TOP_OPS]
    out.append("")
    out.append(f"CPU self time per step, top {len(ops)} (ops, annotations and runtime calls; µs):")
    out.append(_table(["name", "calls/step", "self µs/step"],
                      [[short(r["name"], full, 60), f"{r['calls_per_step']:g}", _us(r["self_us_per_step"])]
                       for r in ops],
                      right={1, 2}))

    out.append("")
    if d["views"]:
        out.append("View ops (no data moved, so no kernel expected):")
        out.append(_table(["op", "calls/step", "kernels/step", "CUDA µs/step"],
                          [[v["op"], f"{v['calls_per_step']:g}", f"{v['kernels_per_step']:g}",
                            _us(v["cuda_us_per_step"])] for v in d["views"]],
                          right={1, 2, 3}))
    else:
        out.append("View ops: none in the active steps")

    out.append("")
    out.append(f"Launches preceded by {OCCUPANCY} (in the same op):")
    orows = [[o["kernels"], f"{o['with_query']}/{o['launches']}", ", ".join(o["launch_calls"])] for o in d["occupancy"]]
    out.append(_table(["kernels", "with query", "launch call"], orows) if orows else "no linked launches")
    out += _text_memory(d)
    return out


def _text_annotations(d: dict, full: bool, gpu: bool) -> list[str]:
    """Time per record_function annotation, µs per step: GPU (work launched inside it) and CPU (its spans) on a
    GPU trace, largest GPU time first; CPU only on a CPU trace."""
    cpu = d["annotations_cpu"]
    gpu_ann = d["annotations"] if gpu else {}
    names = sorted(set(cpu) | set(gpu_ann), key=lambda k: (-statistics.median(gpu_ann.get(k, [0.0])),
                                                            -statistics.median(cpu.get(k, [0.0]))))
    which = "GPU time" if gpu else "CPU time"
    if not names:
        return [f"{which} per annotation: no record_function annotation in this trace"]
    zeros = [0.0] * len(d["steps"])
    if gpu:
        out = [("GPU and CPU time per annotation (record_function; GPU: work launched inside it, CPU: its spans; "
                "µs per step):")]
        rows = [[short(k, full, 48), _us(statistics.median(gpu_ann.get(k, zeros))), _spread(gpu_ann.get(k, zeros)),
                 _us(statistics.median(cpu.get(k, zeros)))] for k in names[:TOP_ANNOTATIONS]]
        out.append(_table(["annotation", "GPU median", "GPU min–max", "CPU median"], rows, right={1, 2, 3}))
    else:
        out = ["CPU time per annotation (record_function; its spans, µs per step):"]
        rows = [[short(k, full, 48), _us(statistics.median(cpu[k])), _spread(cpu[k])] for k in names[:TOP_ANNOTATIONS]]
        out.append(_table(["annotation", "median", "min–max"], rows, right={1, 2}))
    if len(names) > TOP_ANNOTATIONS:
        out.append(f"({len(names) - TOP_ANNOTATIONS} more in --json)")
    return out


def _text_compiled(d: dict) -> list[str]:
    lines = describe(d["compiled"])
    return [""] + lines if lines else []


def _text_memory(d: dict) -> list[str]:
    peaks = d["memory_peak_bytes"]
    if not peaks:
        return []
    vals = list(peaks.values())
    return ["", "Peak allocation per step, above the step's start (MiB): "
                f"median {statistics.median(vals) / 2**20:,.1f}, max {max(vals) / 2**20:,.1f}"]


def _cpp_kernels(d: dict) -> str:
    """The C++ kernels Inductor generated, or which of the reasons for none holds."""
    fused = [w["name"] for w in d["cpu_work"] if CPP_KERNEL_RE.search(w["name"])]
    if fused:
        return ", ".join(dict.fromkeys(fused))
    if not any(r["name"].startswith("Torch-Compiled Region") for r in d["cpu_ops"]):
        return "none: an eager run (no Torch-Compiled Region in the trace)"
    calls = list(dict.fromkeys(w["name"] for w in d["cpu_work"]))
    if calls:  # e.g. a lone matmul + add: Inductor calls the library's GEMM with the add folded in (aten::addmm)
        return (f"none: compiled, and Inductor generated no C++ kernel for this graph: it calls {', '.join(calls)} "
                "instead (cpp.enable_kernel_profile on, as the suite's scripts set it, would show any)")
    return ("none: compiled, but nothing ran inside the compiled region that the trace names: recorded without "
            "cpp.enable_kernel_profile (the suite's scripts set it)")


def _text_cpu(d: dict, full: bool, all_steps: bool) -> list[str]:
    n = len(d["steps"])
    ranked = d["cpu_ops"]
    all_self = sum(r["self_us_per_step"] for r in ranked) or 1.0
    rows = [[short(r["name"], full), f"{r['calls_per_step']:g}", _us(r["self_us_per_step"]),
             f"{100 * r['self_us_per_step'] / all_self:.1f}%"] for r in ranked[:20]]
    out = [f"CPU ops by self time per step (mean over {n} steps; top {len(rows)} of {len(ranked)}):"]
    out.append(_table(["op", "calls/step", "self µs/step", "share"], rows, right={1, 2, 3}))
    out.append("")
    out += _text_cpu_work(d, full)
    out.append("Inductor C++ kernels: " + _cpp_kernels(d))
    out.append("")
    cols = [("CPU span µs", lambda f: _us(f["cpu_us"]), lambda f: f["cpu_us"])]
    out.append(_table(["step"] + [c[0] for c in cols], _step_rows(d["steps"], cols, all_steps), right={1}))
    if n > STEP_ROWS and not all_steps:
        out.append(f"({n} steps: the first and last {EDGE}, then the quantiles; --all-steps lists all)")
    out.append("")
    out += _text_annotations(d, full, gpu=False)
    out += _text_compiled(d)
    out += _text_memory(d)
    return out


def _text_cpu_work(d: dict, full: bool) -> list[str]:
    """The CPU's kernels in order, with a thread column where more than one thread computed."""
    n = len(d["steps"])
    if not d["cpu_work"]:
        if d["compiled"] is not None:
            return [("Work in order: none seen. The compiled code runs inside its Torch-Compiled Region, its C++ "
                     "kernels not in the trace: profile with torch._inductor.config.cpp.enable_kernel_profile = True")]
        return ["Work in order: none (no computing aten op or C++ kernel in the active steps)"]
    threads = any(w["lane"] for w in d["cpu_work"])
    used = f"mean over {d['cpu_work_steps']} of {n} steps, those in the typical order"
    out = ["Work in order (the CPU's kernels: fused C++ kernels, GEMMs and other computing aten ops, each with what "
           f"it calls; {used}" + ("; thread by thread, main = the one running the step loop):" if threads else "):")]
    rows = [[i + 1] + ([_thread(w)] if threads else []) +
            [short(w["name"], full), _us(w["mean_us"]), _spread([w["min_us"], w["max_us"]]) if n > 1 else "-"]
            for i, w in enumerate(d["cpu_work"])]
    out.append(_table(["#"] + (["thread"] if threads else []) + ["kernel", "mean µs", "min–max"], rows,
                      right={0, 3, 4} if threads else {0, 2, 3}))
    out.append(_order_line(d, "unit of work", "runs"))
    return out


def _thread(w: dict) -> str:
    """A CPU unit's thread: its lane (main: the thread running the step loop) and the thread ids seen there."""
    tids = "/".join(str(t)[:12] for t in w["tids"][:3]) + ("/…" if len(w["tids"]) > 3 else "")
    return f"main {tids}" if w["lane"] == 0 else tids
