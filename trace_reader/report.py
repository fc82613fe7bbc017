"""The one-trace report: GPU work per step, step time (overhead- or compute-bound), views, occupancy queries."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from .kernels import (CPP_KERNEL_RE, VIEW_OPS, _view_cuda_time, cpu_kernels, gemm_flops, is_gemm, is_pointwise,
                      op_dtype, pointwise_bytes, short, typical_sequence)
from .peaks import device_peak
from .read import OCCUPANCY, Trace, _no_gc


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


def _header(trace: Trace) -> list[str]:
    out = [f"trace   {trace.path}"]
    if trace.device == "cuda" and trace.device_props:
        p = trace.device_props[0]
        extra = []
        if "computeMajor" in p:
            extra.append(f"sm_{p.get('computeMajor')}{p.get('computeMinor', '')}")
        if "numSms" in p:
            extra.append(f"{p['numSms']} SMs")
        if isinstance(p.get("totalGlobalMem"), (int, float)):
            extra.append(f"{p['totalGlobalMem'] / 2**30:.0f} GiB")
        out.append(f"device  {p.get('name', '?')}" + (f" ({', '.join(extra)})" if extra else ""))
    elif trace.device == "cuda":
        out.append("device  a GPU (no deviceProperties in the trace)")
    else:
        gpu = f"; the machine has {trace.device_name}, not profiled" if trace.device_name else ""
        out.append(f"device  CPU only (no GPU activity in the trace{gpu})")
    versions = [f"{k}={v}" for k, v in trace.meta.items()
                if ("version" in k.lower() or k.lower() in ("torch", "triton")) and isinstance(v, (str, int, float))]
    if versions:
        out.append("versions " + ", ".join(versions))
    nums = ", ".join(f"#{st.number}" for st in trace.steps)
    out.append(f"steps   {len(trace.steps)} active ProfilerStep ({nums})")
    return out


def report(trace: Trace, full_names: bool = False) -> str:
    """The one-trace report, as plain text."""
    with _no_gc():
        return _report(trace, full_names)


def _report(trace: Trace, full_names: bool) -> str:
    lines = _header(trace)
    if not trace.steps:
        return "\n".join(lines + ["no active ProfilerStep#N spans: nothing to report per step"])
    lines.append("")
    lines += _report_gpu(trace, full_names) if trace.device == "cuda" else _report_cpu(trace, full_names)
    return "\n".join(lines)


def _group(trace: Trace) -> list[dict]:
    """Kernels grouped by (name, launching op) in first-launch order, with their per-call numbers."""
    groups: dict[tuple, dict] = {}
    peak = device_peak(trace.device_name)
    for st in trace.steps:
        for k in st.gpu:
            key = (k.name, k.op.name if k.op is not None else "?")
            g = groups.setdefault(key, {"name": k.name, "op": key[1], "durs": [], "rates": [], "unit": None,
                                        "peak": None})
            g["durs"].append(k.dur)
            op = k.op
            # The op's work is spread over all the kernels it launched (e.g. a split-K GEMM's two kernels);
            # a workspace memset is not part of the math.
            op_time = sum(x.dur for x in op.kernels if x.is_kernel) if op is not None else 0.0
            if not k.is_kernel or op_time <= 0:
                continue
            flops = gemm_flops(op) if is_gemm(k) else None
            if flops is None and is_gemm(k) and isinstance(op.args.get("kernel_flop"), (int, float)):
                flops = float(op.args["kernel_flop"])  # an Inductor Triton GEMM carries its own count
            if flops is not None:
                g["unit"] = "TFLOP/s"
                g["rates"].append(flops / op_time / 1e6)
                if peak is not None:
                    g["peak"] = peak.tflops.get(op_dtype(op) or "")
            elif is_pointwise(k) and (moved := pointwise_bytes(op)) is not None:
                g["unit"] = "GB/s" if moved[1] else "GB/s+"  # "+": a lower bound, see pointwise_bytes
                g["rates"].append(moved[0] / op_time / 1e3)
                if peak is not None:
                    g["peak"] = peak.gbs
    return list(groups.values())


def _report_gpu(trace: Trace, full: bool) -> list[str]:
    n = len(trace.steps)
    groups = _group(trace)
    total = sum(sum(g["durs"]) for g in groups) or 1.0
    peak = device_peak(trace.device_name)
    rows, lower_bound = [], False
    for i, g in enumerate(groups, 1):
        rate = statistics.mean(g["rates"]) if g["rates"] else None
        achieved = "-" if rate is None else f"{_num(rate)} {g['unit']}"
        if g["unit"] == "GB/s+":
            achieved, lower_bound = f">={_num(rate)} GB/s", True
        of_peak = "unknown" if rate is not None and not g["peak"] else "-"
        if rate is not None and g["peak"]:
            of_peak = f"{_num(100 * rate / g['peak'])}% of {g['peak']:,.0f}"
        calls = len(g["durs"]) / n
        rows.append([i, short(g["name"], full), g["op"], f"{calls:g}", _us(statistics.mean(g["durs"])),
                     _spread(g["durs"]), f"{100 * sum(g['durs']) / total:.1f}%", achieved, of_peak])
    out = [f"GPU work per step, in launch order (mean over {n} steps; µs per call):"]
    out.append(_table(["#", "kernel", "launched by", "calls/step", "mean µs", "min–max", "GPU share",
                       "achieved", "of peak"], rows, right={0, 3, 4, 5, 6, 7}))
    if lower_bound:
        out.append(">= : Triton kernel whose source is not on this machine; a buffer it reads and writes "
                   "(in_out_ptr) counted once")
    src = peak.source if peak else "unknown (device not in torch's datasheet table)"
    out.append(f"peak: {trace.device_name or '?'}: {src}")
    orders = Counter(tuple(k.name for k in st.kernels) for st in trace.steps)
    if len(orders) == 1:
        out.append(f"every step launches the same {len(next(iter(orders)))} kernels in the same order")
    else:
        out.append("steps differ: " + ", ".join(f"#{st.number}: {len(st.kernels)} kernels" for st in trace.steps))

    out.append("")
    out.append("Step time (µs): GPU busy vs step wall time (CPU span until the last GPU work ends)")
    srows = []
    for st in trace.steps:
        busy, wall = st.gpu_busy, st.wall
        srows.append([f"#{st.number}", len(st.kernels), _us(busy), _us(st.cpu_time), _us(wall),
                      f"{100 * busy / wall:.0f}%" if wall else "-"])
    out.append(_table(["step", "kernels", "GPU busy", "CPU span", "wall", "GPU busy/wall"], srows,
                      right={1, 2, 3, 4, 5}))
    b = bound_of(trace)
    if b is not None:
        kind, frac = b
        why = ("the GPU waits on the CPU to launch work: fewer, bigger kernels (or CUDA graphs) help"
               if kind == "overhead" else "the GPU is the bottleneck: faster kernels help, launch overhead does not")
        out.append(f"=> {kind}-bound: GPU busy {100 * frac:.0f}% of the step; {why}")

    views: dict[str, list] = {}
    for st in trace.steps:
        for op in st.ops(VIEW_OPS):
            nk, t = _view_cuda_time(op)
            v = views.setdefault(op.name, [0, 0, 0.0])
            v[0] += 1
            v[1] += nk
            v[2] += t
    out.append("")
    if views:
        out.append("View ops (no data moved, so no kernel expected):")
        out.append(_table(["op", "calls/step", "kernels", "CUDA µs"],
                          [[k, f"{v[0] / n:g}", v[1], _us(v[2])] for k, v in sorted(views.items())],
                          right={1, 2, 3}))
    else:
        out.append("View ops: none in the active steps")

    launches = [k for st in trace.steps for k in st.kernels if k.launch is not None]
    out.append("")
    out.append(f"Launches preceded by {OCCUPANCY} (in the same op):")
    orows = []
    for label, pick in (("GEMM", is_gemm), ("pointwise/other", is_pointwise)):
        sel = [k for k in launches if pick(k)]
        if sel:
            api = ", ".join(sorted({k.launch.name for k in sel}))
            orows.append([label, f"{sum(k.occupancy_query for k in sel)}/{len(sel)}", api])
    out.append(_table(["kernels", "with query", "launch call"], orows) if orows else "no linked launches")
    return out


def _report_cpu(trace: Trace, full: bool) -> list[str]:
    n = len(trace.steps)
    per_op: dict[str, list[float]] = defaultdict(list)
    calls: Counter = Counter()
    for st in trace.steps:
        totals: dict[str, float] = defaultdict(float)
        for e in st.spans:
            totals[e.name] += e.self_time
            calls[e.name] += 1
        for name, t in totals.items():
            per_op[name].append(t)
    all_self = sum(sum(v) for v in per_op.values()) or 1.0
    ranked = sorted(per_op.items(), key=lambda kv: -sum(kv[1]))
    rows = [[short(name, full), f"{calls[name] / n:g}", _us(sum(v) / n), _spread(v), f"{100 * sum(v) / all_self:.1f}%"]
            for name, v in ranked[:20]]
    out = [f"CPU ops by self time per step (mean over {n} steps; top {len(rows)} of {len(ranked)}):"]
    out.append(_table(["op", "calls/step", "self µs/step", "min–max", "share"], rows, right={1, 2, 3, 4}))
    seq = typical_sequence(trace)
    out.append("")
    out.append("Work in order (the CPU's kernels: fused C++ kernels and computing aten ops):")
    # Per position over the steps that ran in the typical order, so two calls of one op stay apart.
    durs: list[list[float]] = [[] for _ in seq]
    for st in trace.steps:
        work = cpu_kernels(st)
        if [e.name for e in work] == seq:
            for i, e in enumerate(work):
                durs[i].append(e.dur)
    out.append(_table(["#", "kernel", "mean µs", "min–max"],
                      [[i + 1, short(name, full), _us(statistics.mean(durs[i])), _spread(durs[i])]
                       for i, name in enumerate(seq)], right={0, 2, 3}))
    fused = sorted({e.name for st in trace.steps for e in st.spans if CPP_KERNEL_RE.search(e.name)})
    out.append("Inductor C++ kernels: " + (", ".join(fused) if fused else
                                           "none (eager, or compiled without cpp.enable_kernel_profile)"))
    out.append("")
    out.append(_table(["step", "CPU span µs"], [[f"#{st.number}", _us(st.cpu_time)] for st in trace.steps],
                      right={1}))
    return out


def bound_of(trace: Trace) -> tuple[str, float] | None:
    """("overhead"|"compute", GPU busy fraction of the steps' wall time); the GPU idles more than half
    the step when the CPU cannot launch work fast enough."""
    wall = sum(st.wall for st in trace.steps)
    if not trace.steps or wall <= 0 or not any(st.gpu for st in trace.steps):
        return None
    frac = sum(st.gpu_busy for st in trace.steps) / wall
    return ("compute" if frac >= 0.5 else "overhead"), frac
