"""A comparison of two traces as text: kept, gone, new kernels, which replaced which and why, CPU ops, step times,
training phases and communication."""

from __future__ import annotations

import statistics
from collections import Counter

from ..analyzers.memory import fmt_size
from ..comparison.compare import comparison_data
from ..facts.format import fmt_us, text_table
from ..facts.kernels import short
from ..reading.events import Trace


def render(d: dict, full_names: bool = False) -> str:
    """comparison_data() as text."""
    def nm(n):
        return short(n, full_names)

    what = d["units"][0].upper() + d["units"][1:]
    da, db = d["a"], d["b"]
    mixed = f" -- note: A is a {da['device']} trace, B a {db['device']} trace" if da["device"] != db["device"] else ""

    def where(t):
        return (t["device_name"] or "GPU") if t["device"] == "cuda" else "CPU"

    def steps(t):  # a trace without ProfilerStep#N spans: its "per step" is the whole trace
        return ("no ProfilerStep spans: one step, the whole trace" if t.get("whole_trace")
                else f"{len(t['steps'])} steps")

    out = [f"A  {da['path']}  ({where(da)}, {steps(da)})",
           f"B  {db['path']}  ({where(db)}, {steps(db)})", ""]
    if bool(da.get("whole_trace")) != bool(db.get("whole_trace")):
        whole = "A" if da.get("whole_trace") else "B"
        out += [f"note: {whole} has no ProfilerStep spans, so its \"per step\" below is per trace; the other's is "
                "per step", ""]
    out += _steps_table(da, db)
    out += _training_lines(d.get("training"), da["device"] == db["device"] == "cuda")
    out += _communication_lines(d.get("communication"))

    na, nb = d["launch_order_steps"]["a"], d["launch_order_steps"]["b"]
    out += ["", f"{what}, time per step: A {fmt_us(d['kernel_us']['a'])} µs, B {fmt_us(d['kernel_us']['b'])} µs "
                f"({na} + {nb} steps in the typical launch order): the sum of what follows, each call counted once"]
    out += ["", f"{what}, same name in both: calls per step, µs per call, µs per step{mixed}"]
    rows = [[nm(s["name"]) + (" *" if s["elsewhere"]["a"] or s["elsewhere"]["b"] else ""),
             f"{s['a']['calls']:g}", f"{s['b']['calls']:g}", fmt_us(s["a"]["us_per_call"]),
             fmt_us(s["b"]["us_per_call"]), _change(s["a"]["us_per_call"], s["b"]["us_per_call"]),
             fmt_us(s["a"]["us"]), fmt_us(s["b"]["us"])] for s in d["same"]]
    headers = ["name", "calls A", "calls B", "µs/call A", "µs/call B", "per call", "µs/step A", "µs/step B"]
    out.append(text_table(headers, rows, right=set(range(1, 8))) if rows else "(none)")
    if any(r[0].endswith(" *") for r in rows):
        out.append("* the calls that stayed; this name's other calls are counted below (Replaced, Only in), once")

    out += ["", f"Replaced, paired by what the kernels do (µs per step; {na} + {nb} steps in the typical "
                "launch order):"]
    for r in d["replaced"]:
        out += _replaced(r, d["hidden"], nm)
    if not d["replaced"]:
        out.append("  (none)")
    for label, rows_ in (("Only in A", d["only_a"]), ("Only in B", d["only_b"])):
        out += ["", f"{label}:" + ("" if rows_ else " (none)")]
        out += [f"  {fmt_us(r['us']):>8} µs/step  {r['calls']:g} × {fmt_us(r['us_per_call'])}  {nm(r['name'])}"
                for r in rows_]
    for label, ops in (("CPU ops gone in B", d["ops_gone"]), ("CPU ops new in B", d["ops_new"])):
        out += ["", f"{label}:" + ("" if ops else " (none)")]
        out += [f"  {calls:g}/step  {nm(name)}" for name, calls in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(out)


def _training_lines(t: dict | None, gpu: bool) -> list[str]:
    """Two training steps phase by phase, and each one's optimizer (GPU µs on GPUs, else CPU µs)."""
    if t is None:
        return []
    key, unit = ("gpu_us", "GPU") if gpu else ("cpu_us", "CPU")
    rows, both = [], {}
    for p in ("forward", "backward", "optimizer"):
        fa, fb = t["a"]["phases"].get(p), t["b"]["phases"].get(p)
        if fa is None or fb is None or fa[key] is None or fb[key] is None:
            continue
        both[p] = fa[key], fb[key]
        rows.append([p, fmt_us(fa[key]), fmt_us(fb[key]), _change(fa[key], fb[key]),
                     *([f"{fa['kernels']:g}", f"{fb['kernels']:g}"] if gpu else [])])
    out = ["", f"Training step, phase by phase ({unit} µs per step, median over the steps):"]
    out.append(text_table(["phase", f"A {unit} µs", f"B {unit} µs", "change", *(["kernels A", "kernels B"] if gpu else [])],
                      rows, right=set(range(1, 6))) if rows else "(no phase in both)")
    out += _micro_batch_lines(t["a"].get("micro_batches"), t["b"].get("micro_batches"), both, unit)
    for side in "ab":
        o = t[side]["optimizer"]
        if o is not None:
            kernels = f", {o['kernels']:g} kernels" if gpu and o.get("kernels") is not None else ""
            out.append(f"optimizer {side.upper()}: {o['class'] or '?'}, looks {o['implementation']}: "
                       f"{o['ops']:g} ops{kernels} per step")
    return out


def _micro_batch_lines(na, nb, both: dict, unit: str) -> list[str]:
    """Where A and B run a different number of micro-batches a step (gradient accumulation: na, nb; None where not
    told), their per-step forward and backward hold that many passes each: say so, and set them side by side per
    micro-batch too (both: {phase: (A's µs, B's µs)} of the phases in both)."""
    if na == nb or not na or not nb:
        return []
    per = [f"{p} {fmt_us(both[p][0] / na)} -> {fmt_us(both[p][1] / nb)} ({_change(both[p][0] / na, both[p][1] / nb)})"
           for p in ("forward", "backward") if p in both]
    return [f"micro-batches per step: A {na:g}, B {nb:g}: each phase above holds that many passes"
            + (f"; per micro-batch ({unit} µs): " + ", ".join(per) if per else "")]


def _communication_lines(c: dict | None) -> list[str]:
    """Both traces' collectives per step, kind by kind: calls, bytes, time and the part no compute hid."""
    if c is None:
        return []

    def who(s):
        if s["world_size"] <= 1:
            return "one process" + (" (a group of one rank)" if s["backend"] else ", no process group")
        rank = s["rank"] if type(s["rank"]) is int else "?"  # distributedInfo is the trace's word, untrusted
        return f"rank {rank} of {s['world_size']} ({s['backend'] if isinstance(s['backend'], str) else '?'})"

    def size(x):
        return "?" if x is None else fmt_size(x) if x else "0"

    out = ["", f"Communication per step (mean over {c['a']['steps']} + {c['b']['steps']} steps; exposed: no compute "
               f"ran beside it). A: {who(c['a'])}; B: {who(c['b'])}"]
    kinds = list(dict.fromkeys([*c["a"]["kinds"], *c["b"]["kinds"]]))
    none = {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0}
    rows = []
    for kind, sides in [(k, [c[s]["kinds"].get(k, none) for s in "ab"]) for k in kinds] + (
            [("total", [c["a"]["total"], c["b"]["total"]])] if len(kinds) > 1 else []):
        x, y = sides
        rows.append([kind, f"{x['calls']:g}", f"{y['calls']:g}", size(x["bytes"]), size(y["bytes"]), fmt_us(x["us"]),
                     fmt_us(y["us"]), fmt_us(x["exposed_us"]), fmt_us(y["exposed_us"])])
    out.append(text_table(["collective", "calls A", "calls B", "bytes A", "bytes B", "µs A", "µs B", "exposed µs A",
                       "exposed µs B"], rows, right=set(range(1, 9))) if rows else "(no collectives in either trace)")
    if len(kinds) > 1:
        out.append("total: all kinds at once (where two kinds ran at the same time, that time counts once)")
    return out


def _replaced(r: dict, hidden: dict, nm) -> list[str]:
    """One group: A's side, B's side (or why a side is missing from its trace), µs, calls, the evidence."""
    sides = [_names(r["old"], r["times"], nm) or f"({hidden['a'] or 'nothing'})",
             _names(r["new"], r["times"], nm) or f"({hidden['b'] or 'nothing'})"]
    calls = "; ".join(f"{side} " + (" + ".join(f"{c} × {fmt_us(r[f'{key}_us_per_call'][n])}"
                                               for n, c in r[f"{key}_calls"].items()) or "none")
                      for side, key in (("A", "old"), ("B", "new")))
    if (not r["new"] and hidden["b"]) or (not r["old"] and hidden["a"]):  # no change to state: a side is unseen
        time = f"{fmt_us(r['old_us'])} -> ? µs per step" if r["old"] else f"? -> {fmt_us(r['new_us'])} µs per step"
    else:
        time = f"{fmt_us(r['old_us'])} -> {fmt_us(r['new_us'])} µs per step ({_change(r['old_us'], r['new_us'])})"
    return [f"  {sides[0]}", f"    -> {sides[1]}", f"    {time}, calls × µs: {calls}", f"    paired by: {r['by']}"]


def _names(names: list[str], times: int, nm) -> str:
    counts = Counter(names)
    text = " + ".join(f"{c} × {nm(n)}" if c > 1 else nm(n) for n, c in counts.items())
    return f"{times} × ({text})" if times > 1 and text else text


def _steps_table(da: dict, db: dict, head: int = 3, tail: int = 2) -> list[str]:
    """GPU busy and CPU span per step, side by side; a long run shows its first and last steps and the median."""
    n = max(len(da["steps"]), len(db["steps"]))
    shown = list(range(n)) if n <= head + tail + 1 else list(range(head)) + [None] + list(range(n - tail, n))
    rows = []
    for i in shown:
        cells = []
        for t in (da, db):
            st = t["steps"][i] if i is not None and i < len(t["steps"]) else None
            cells += ["…" if i is None else f"#{st['step']}" if st else "", fmt_us(st["gpu_busy_us"]) if st else "",
                      fmt_us(st["cpu_us"]) if st else ""]
        rows.append(cells)
    for label, f in (("median", statistics.median), ("mean", statistics.fmean)):
        cells = []
        for t in (da, db):
            gpu = [s["gpu_busy_us"] for s in t["steps"] if s["gpu_busy_us"] is not None]
            cpu = [s["cpu_us"] for s in t["steps"]]
            cells += [label, fmt_us(f(gpu)) if gpu else "-", fmt_us(f(cpu)) if cpu else "-"]
        rows.append(cells)
    return [f"Per step (µs): GPU busy and CPU span, side by side ({n} steps)",
            text_table(["A step", "A GPU", "A CPU", "B step", "B GPU", "B CPU"], rows, right={1, 2, 4, 5})]


def _change(old: float, new: float) -> str:
    if old <= 0:
        return "new"
    return f"{100 * (new - old) / old:+.0f}%"


def compare(a: Trace, b: Trace, full_names: bool = False) -> str:
    """The two-trace report, as plain text (A = before, B = after)."""
    return render(comparison_data(a, b), full_names)
