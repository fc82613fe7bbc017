"""The one-trace report as text (report()): short at any trace length: a long trace shows its first and last steps
and quantiles (--all-steps: every step)."""

from __future__ import annotations

import statistics
from collections import Counter

from ..analyzers.compiled import describe
from ..analyzers.report import report_data
from ..analyzers.steps import EDGE, STEP_ROWS, step_numbers_shown
from ..facts.format import fmt_num, fmt_pct, fmt_spread, fmt_us, nearest_rank, text_table
from ..facts.kernels import CPP_KERNEL_RE, short
from ..reading.events import MAX_US, OCCUPANCY, Trace, plural
from ..reading.files import no_gc
from .training_text import text as training_text

TOP_OPS = 8  # CPU ops by self time on a GPU trace


TOP_ANNOTATIONS = 8


RECORD_SHAPES = "profile with torch.profiler.profile(..., record_shapes=True) to record them"


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
        out.append(f"steps   {len(trace.steps)} active ProfilerStep ({step_numbers_shown(trace.steps)})")
    if trace.skipped:
        out.append(f"skipped {trace.skipped} events with unusable times (missing, NaN, negative or beyond "
                   f"{int(MAX_US / 3.6e9)} hours): not counted anywhere below")
    return out


def report(trace: Trace, full_names: bool = False, all_steps: bool = False) -> str:
    """The one-trace report, as plain text; all_steps=True lists every step of a long trace."""
    with no_gc():
        data = report_data(trace)
        lines = _header(trace, data)
        if not trace.steps:
            return "\n".join(lines + ["no active ProfilerStep#N spans: nothing to report per step"])
        lines.append("")
        gpu = trace.device == "cuda"
        lines += _text_gpu(data, full_names, all_steps) if gpu else _text_cpu(data, full_names, all_steps)

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
            target = nearest_rank(values, q) if have else None
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
        return (f"it also waits {fmt_us(host)} µs ({fmt_pct(t['host_wait_fraction'])}) on the host: faster kernels and "
                "fewer launches both help")
    return "the GPU is the bottleneck: faster kernels help, launch overhead does not"


def _lag(step: dict, which: str) -> float | None:
    return step["lag_us"][which] if step["lag_us"] else None


def _text_gpu(d: dict, full: bool, all_steps: bool) -> list[str]:
    n = len(d["steps"])
    rows, lower_bound = [], False
    for i, g in enumerate(d["kernels"], 1):
        rate = g["rate"]
        achieved = "-" if rate is None else f"{fmt_num(rate)} {g['unit']}"
        if g["rate_is_lower_bound"]:
            achieved, lower_bound = f">={fmt_num(rate)} GB/s", True
        of_peak = "unknown" if rate is not None and not g["peak"] else "-"
        if g["of_peak"] is not None:
            of_peak = f"{fmt_num(100 * g['of_peak'])}% of {g['peak']:,.0f}"
        rows.append([i, short(g["name"], full), g["launched_by"], f"{g['calls_per_step']:g}", fmt_us(g["mean_us"]),
                     fmt_spread([g["min_us"], g["max_us"]]) if n > 1 else "-", fmt_us(g["lag_us_median"]),
                     f"{100 * g['gpu_share']:.1f}%", achieved, of_peak])
    out = [f"GPU work per step, in launch order (mean over {n} steps; µs per call; lag: launch to start, median):"]
    out.append(text_table(["#", "kernel", "launched by", "calls/step", "mean µs", "min–max", "lag", "GPU share",
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
        ("GPU busy", lambda f: fmt_us(f["gpu_busy_us"]), lambda f: f["gpu_busy_us"]),
        ("CPU span", lambda f: fmt_us(f["cpu_us"]), lambda f: f["cpu_us"]),
        ("wall", lambda f: fmt_us(f["wall_us"]), lambda f: f["wall_us"]),
        ("busy%", lambda f: fmt_pct(f["busy_fraction"]), lambda f: f["busy_fraction"]),
        ("host%", lambda f: fmt_pct(f["host_wait_fraction"]), lambda f: f["host_wait_fraction"]),
        ("verdict", lambda f: f["bound"] or "-", None),
        ("lag median", lambda f: fmt_us(_lag(f, "median")), lambda f: _lag(f, "median")),
        ("lag max", lambda f: fmt_us(_lag(f, "max")), lambda f: _lag(f, "max")),
    ]
    out.append(text_table(["step"] + [c[0] for c in cols], _step_rows(d["steps"], cols, all_steps),
                      right=set(range(1, len(cols) + 1)) - {7}))
    if n > STEP_ROWS and not all_steps:
        out.append(f"({n} steps: the first and last {EDGE}, then each column's quantiles; --all-steps lists all)")
    t = d["typical_step"]
    if t is not None:
        kinds = Counter(f["bound"] for f in d["steps"] if f["bound"])
        tally = ", ".join(f"{c} {k}-bound" for k, c in kinds.most_common())
        out.append(f"=> typical step (median, #{t['number']}): {t['bound']}-bound, GPU busy {fmt_pct(t['busy_fraction'])} "
                   f"of the step ({tally}); {_why(t)}")
        idle = [f["idle_us"] for f in d["steps"] if f["idle_us"]]
        host = statistics.median(i["waiting_on_host"] for i in idle)
        after = statistics.median(i["after_launch"] for i in idle)
        out.append(f"   GPU idle per step (median): {fmt_us(host)} µs waiting on the host (work not yet launched), "
                   f"{fmt_us(after)} µs after the launch (launch latency, earlier work)")

    out.append("")
    out += _text_annotations(d, full, gpu=True)
    out += _text_compiled(d)

    ops = d["cpu_ops"][:TOP_OPS]
    out.append("")
    out.append(f"CPU self time per step, top {len(ops)} (ops, annotations and runtime calls; µs):")
    out.append(text_table(["name", "calls/step", "self µs/step"],
                      [[short(r["name"], full, 60), f"{r['calls_per_step']:g}", fmt_us(r["self_us_per_step"])]
                       for r in ops],
                      right={1, 2}))

    out.append("")
    if d["views"]:
        out.append("View ops (no data moved, so no kernel expected):")
        out.append(text_table(["op", "calls/step", "kernels/step", "CUDA µs/step"],
                          [[v["op"], f"{v['calls_per_step']:g}", f"{v['kernels_per_step']:g}",
                            fmt_us(v["cuda_us_per_step"])] for v in d["views"]],
                          right={1, 2, 3}))
    else:
        out.append("View ops: none in the active steps")

    out.append("")
    out.append(f"Launches preceded by {OCCUPANCY} (in the same op):")
    orows = [[o["kernels"], f"{o['with_query']}/{o['launches']}", ", ".join(o["launch_calls"])] for o in d["occupancy"]]
    out.append(text_table(["kernels", "with query", "launch call"], orows) if orows else "no linked launches")
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
        rows = [[short(k, full, 48), fmt_us(statistics.median(gpu_ann.get(k, zeros))), fmt_spread(gpu_ann.get(k, zeros)),
                 fmt_us(statistics.median(cpu.get(k, zeros)))] for k in names[:TOP_ANNOTATIONS]]
        out.append(text_table(["annotation", "GPU median", "GPU min–max", "CPU median"], rows, right={1, 2, 3}))
    else:
        out = ["CPU time per annotation (record_function; its spans, µs per step):"]
        rows = [[short(k, full, 48), fmt_us(statistics.median(cpu[k])), fmt_spread(cpu[k])] for k in names[:TOP_ANNOTATIONS]]
        out.append(text_table(["annotation", "median", "min–max"], rows, right={1, 2}))
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
    rows = [[short(r["name"], full), f"{r['calls_per_step']:g}", fmt_us(r["self_us_per_step"]),
             f"{100 * r['self_us_per_step'] / all_self:.1f}%"] for r in ranked[:20]]
    out = [f"CPU ops by self time per step (mean over {n} steps; top {len(rows)} of {len(ranked)}):"]
    out.append(text_table(["op", "calls/step", "self µs/step", "share"], rows, right={1, 2, 3}))
    out.append("")
    out += _text_cpu_work(d, full)
    out.append("Inductor C++ kernels: " + _cpp_kernels(d))
    out.append("")
    cols = [("CPU span µs", lambda f: fmt_us(f["cpu_us"]), lambda f: f["cpu_us"])]
    out.append(text_table(["step"] + [c[0] for c in cols], _step_rows(d["steps"], cols, all_steps), right={1}))
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
            [short(w["name"], full), fmt_us(w["mean_us"]), fmt_spread([w["min_us"], w["max_us"]]) if n > 1 else "-"]
            for i, w in enumerate(d["cpu_work"])]
    out.append(text_table(["#"] + (["thread"] if threads else []) + ["kernel", "mean µs", "min–max"], rows,
                      right={0, 3, 4} if threads else {0, 2, 3}))
    out.append(_order_line(d, "unit of work", "runs"))
    return out


def _thread(w: dict) -> str:
    """A CPU unit's thread: its lane (main: the thread running the step loop) and the thread ids seen there."""
    tids = "/".join(str(t)[:12] for t in w["tids"][:3]) + ("/…" if len(w["tids"]) > 3 else "")
    return f"main {tids}" if w["lane"] == 0 else tids
