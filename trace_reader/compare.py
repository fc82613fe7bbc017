"""Comparing two traces: which kernels are the same, gone, new, or replaced which; CPU ops; step times."""

from __future__ import annotations

import difflib
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from .kernels import short, typical_sequence, units
from .read import STEP_RE, Trace, _no_gc
from .report import _table, _us


@dataclass
class Comparison:
    same: list[str]  # names present in both, byte for byte
    only_a: list[str]
    only_b: list[str]
    replaced: list[tuple[list[str], list[str]]]  # A's kernels between two anchors -> B's kernels there
    ops_gone: dict[str, float]  # CPU op -> calls per step in A, absent from B
    ops_new: dict[str, float]


def _per_step_time(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    t: dict[str, float] = defaultdict(float)
    for st in trace.steps:
        for name, dur in units(trace, st):
            t[name] += dur / n
    return t


def _op_calls(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    c: Counter = Counter(e.name for st in trace.steps for e in st.spans if not STEP_RE.match(e.name))
    return {k: v / n for k, v in c.items()}


def match(a: Trace, b: Trace) -> Comparison:
    """Which kernels are the same, which are gone, which replaced which (structure first, names as anchors)."""
    sa, sb = typical_sequence(a), typical_sequence(b)
    names_a, names_b = set(_per_step_time(a)), set(_per_step_time(b))
    replaced = []
    sm = difflib.SequenceMatcher(a=sa, b=sb, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        # Between two anchors (runs of identical names), A's kernels were replaced by B's.
        if tag == "replace":
            replaced.append((sa[i1:i2], sb[j1:j2]))
        elif tag == "delete" and (i1 > 0 and i2 < len(sa)):
            replaced.append((sa[i1:i2], []))
        elif tag == "insert" and (j1 > 0 and j2 < len(sb)):
            replaced.append(([], sb[j1:j2]))
    ca, cb = _op_calls(a), _op_calls(b)
    return Comparison(
        same=[n for n in dict.fromkeys(sa + sorted(names_a)) if n in names_b],
        only_a=[n for n in dict.fromkeys(sa + sorted(names_a)) if n not in names_b],
        only_b=[n for n in dict.fromkeys(sb + sorted(names_b)) if n not in names_a],
        replaced=replaced,
        ops_gone={k: v for k, v in ca.items() if k not in cb},
        ops_new={k: v for k, v in cb.items() if k not in ca},
    )


def compare(a: Trace, b: Trace, full_names: bool = False) -> str:
    """The two-trace report, as plain text (A = before, B = after)."""
    with _no_gc():
        return _compare(a, b, full_names)


def _compare(a: Trace, b: Trace, full_names: bool) -> str:
    m = match(a, b)
    ta, tb = _per_step_time(a), _per_step_time(b)
    what = "GPU kernels" if a.device == "cuda" and b.device == "cuda" else "units of work (CPU kernels)"
    if a.device != b.device:
        what += f" -- note: A is a {a.device} trace, B a {b.device} trace"
    def where(t: Trace) -> str:
        return (t.device_name or "GPU") if t.device == "cuda" else "CPU"

    out = [f"A  {a.path}  ({where(a)}, {len(a.steps)} steps)",
           f"B  {b.path}  ({where(b)}, {len(b.steps)} steps)", ""]

    rows = []
    for i in range(max(len(a.steps), len(b.steps))):
        cells = []
        for t in (a, b):
            st = t.steps[i] if i < len(t.steps) else None
            cells += [f"#{st.number}" if st else "", _us(st.gpu_busy) if st and t.device == "cuda" else "-",
                      _us(st.cpu_time) if st else "-"]
        rows.append(cells)
    mean = []
    for t in (a, b):
        mean += ["mean", _us(statistics.mean(st.gpu_busy for st in t.steps)) if t.device == "cuda" and t.steps
                 else "-", _us(statistics.mean(st.cpu_time for st in t.steps)) if t.steps else "-"]
    rows.append(mean)
    out.append("Per step (µs): GPU busy and CPU span, side by side")
    out.append(_table(["A step", "A GPU", "A CPU", "B step", "B GPU", "B CPU"], rows, right={1, 2, 4, 5}))

    out.append("")
    out.append(f"{what}: same name in both (µs per step)")
    out.append(_table(["name", "A", "B", "change"],
                      [[short(n, full_names), _us(ta[n]), _us(tb[n]), _change(ta[n], tb[n])] for n in m.same],
                      right={1, 2, 3}) if m.same else "(none)")
    out.append("")
    out.append("Replaced (matched by position between anchors in the launch order, not by name):")
    if m.replaced:
        for old, new in m.replaced:
            t_old, t_new = sum(ta[n] for n in set(old)), sum(tb[n] for n in set(new))
            out.append(f"  {' + '.join(short(n, full_names) for n in old) or '(nothing at this position)'}")
            out.append(f"    -> {' + '.join(short(n, full_names) for n in new) or '(nothing at this position)'}"
                       f"   {_us(t_old)} -> {_us(t_new)} µs per step ({_change(t_old, t_new)})")
    else:
        out.append("  (none)")
    for label, names, t in (("Only in A", m.only_a, ta), ("Only in B", m.only_b, tb)):
        out.append("")
        out.append(f"{label}:" + ("" if names else " (none)"))
        for n in names:
            out.append(f"  {_us(t[n]):>8} µs/step  {short(n, full_names)}")
    for label, ops in (("CPU ops gone in B", m.ops_gone), ("CPU ops new in B", m.ops_new)):
        out.append("")
        out.append(f"{label}:" + ("" if ops else " (none)"))
        for name, calls in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {calls:g}/step  {short(name, full_names)}")
    return "\n".join(out)


def _change(old: float, new: float) -> str:
    if old <= 0:
        return "new"
    return f"{100 * (new - old) / old:+.0f}%"
