"""Comparing two traces: which kernels stayed, which are gone or new, which replaced which; CPU ops; step times.

How a replacement is found, on one typical step of each trace (its most common launch order):
1. align()   pairs the kernels that stayed (same name, same order: the anchors), in near-linear time.
2. _group()  pairs the rest by what the kernels do, not by where they sit: the words of the CPU op that
             launched each kernel (aten::gelu -> gelu), of the annotation or autograd Function around it up to
             the first span that also holds an anchor (LigerGELUMulFunction -> liger, gelu, mul), the op names
             Inductor writes into its kernel names (triton_poi_fused__unsafe_view_gelu_mul_0 -> unsafe, view,
             gelu, mul); failing those, the tensor sizes the launching op recorded. A kernel is paired with the
             nearest kernels of the other trace sharing a word, at most two anchors away. What nothing pairs is
             one group: the step's remaining kernels, replaced as a whole, rather than a guess by position.
3. Times are per position (a kernel that stayed is never counted in a replaced group, even if a kernel of the
   same name was replaced), averaged over the steps with that launch order; calls and per-call time per name.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from .kernels import _dims, cpu_kernels, short, typical_sequence
from .read import STEP_RE, Event, Trace, _no_gc
from .report import _table, _us


@dataclass
class Unit:
    """One position of a step's launch order: a GPU kernel, or one of the CPU's kernels on a CPU trace."""

    name: str
    us: float  # mean over the steps with this launch order
    op: Event | None  # the CPU op that launched it (on a CPU trace: the op itself)


@dataclass
class Replaced:
    """A's kernels `old` (launch order) became B's `new`, `times` times per step; µs per step over all times."""

    old: list[str]
    new: list[str]
    old_name_us: dict[str, float]  # µs per step of each name, over all `times`
    new_name_us: dict[str, float]
    times: int
    by: str  # what paired them: "gelu, mul", "tensor sizes", or REST

    @property
    def old_us(self) -> float:
        return sum(self.old_name_us.values())

    @property
    def new_us(self) -> float:
        return sum(self.new_name_us.values())

    def calls(self, side: str) -> dict[str, int]:
        """Calls per step of each name, over all `times`."""
        return {n: c * self.times for n, c in Counter(self.old if side == "old" else self.new).items()}


REST = "nothing tells them apart: the step's remaining kernels"


@dataclass
class Comparison:
    same: list[str]  # names present in both, byte for byte
    only_a: list[str]
    only_b: list[str]
    groups: list[Replaced]
    ops_gone: dict[str, float]  # CPU op -> calls per step in A, absent from B
    ops_new: dict[str, float]
    steps_used: tuple[int, int]  # steps of A and B with the typical launch order (the per-position times)

    @property
    def replaced(self) -> list[tuple[list[str], list[str]]]:
        return [(g.old, g.new) for g in self.groups]


# ------------------------------------------------------------------------------------- steps and positions

def _step_units(trace: Trace, step) -> list[tuple[str, float, Event | None]]:
    if trace.device == "cuda":
        return [(k.name, k.dur, k.op) for k in step.kernels]
    return [(e.name, e.dur, e) for e in cpu_kernels(step)]


def launch_order(trace: Trace) -> tuple[list[Unit], int]:
    """The typical step's units, each timed as the mean over the steps with that launch order; and how many."""
    seq = typical_sequence(trace)
    steps = [u for u in (_step_units(trace, st) for st in trace.steps) if [n for n, _, _ in u] == seq]
    if not steps:
        return [], 0
    return [Unit(name, statistics.fmean(s[i][1] for s in steps), steps[0][i][2])
            for i, name in enumerate(seq)], len(steps)


def per_name(trace: Trace) -> dict[str, tuple[float, float]]:
    """name -> (calls per step, µs per call), over every step."""
    n = max(len(trace.steps), 1)
    calls: Counter = Counter()
    total: dict[str, float] = defaultdict(float)
    for st in trace.steps:
        for name, dur, _ in _step_units(trace, st):
            calls[name] += 1
            total[name] += dur
    return {k: (c / n, total[k] / c) for k, c in calls.items()}


def _op_calls(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    c: Counter = Counter(e.name for st in trace.steps for e in st.spans if not STEP_RE.match(e.name))
    return {k: v / n for k, v in c.items()}


# ---------------------------------------------------------------------------------------------- alignment

SMALL = 64 * 64  # gaps up to this many name pairs are aligned exactly (quadratic, but small)
WINDOW = 32  # launches looked ahead on each side to resynchronise in a long gap


def align(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Pairs (i, j) with a[i] == b[j], increasing in both: the kernels that stayed. Near-linear in len(a) + len(b).

    Names that occur once on each side anchor first (the longest run of them in the same order); each gap
    between anchors is aligned exactly when small, else by a walk that, where the names differ, resumes at
    the nearest name the two sides share within WINDOW launches.
    """
    pairs: list[tuple[int, int]] = []
    i0 = j0 = 0
    for i, j in _unique_anchors(a, b) + [(len(a), len(b))]:
        pairs += _align_gap(a, b, i0, i, j0, j)
        if i < len(a):
            pairs.append((i, j))
        i0, j0 = i + 1, j + 1
    return pairs


def _unique_anchors(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    ca, cb = Counter(a), Counter(b)
    in_b = {n: j for j, n in enumerate(b) if cb[n] == 1}
    cand = [(i, in_b[n]) for i, n in enumerate(a) if ca[n] == 1 and n in in_b]
    # Longest increasing subsequence of the j's (patience sorting), O(k log k).
    tails: list[int] = []  # tails[L] = j of the smallest tail of an increasing run of length L+1
    at: list[int] = []  # index into cand of that tail
    back = [-1] * len(cand)
    for k, (_, j) in enumerate(cand):
        pos = bisect.bisect_left(tails, j)
        back[k] = at[pos - 1] if pos else -1
        if pos == len(tails):
            tails.append(j)
            at.append(k)
        else:
            tails[pos], at[pos] = j, k
    out, k = [], at[-1] if at else -1
    while k >= 0:
        out.append(cand[k])
        k = back[k]
    return out[::-1]


def _align_gap(a, b, i0: int, i1: int, j0: int, j1: int) -> list[tuple[int, int]]:
    if (i1 - i0) * (j1 - j0) <= SMALL:
        return _lcs(a, b, i0, i1, j0, j1)
    pairs, i, j = [], i0, j0
    while i < i1 and j < j1:
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        fa, fb = _first(a, i, min(i1, i + WINDOW)), _first(b, j, min(j1, j + WINDOW))
        best = min(((fa[n] + fb[n], fa[n], fb[n]) for n in fa if n in fb), default=None)
        if best is None:  # nothing in common nearby: both launches are unmatched
            i, j = i + 1, j + 1
        else:
            i, j = i + best[1], j + best[2]
    return pairs


def _lcs(a, b, i0: int, i1: int, j0: int, j1: int) -> list[tuple[int, int]]:
    """Exact: the most pairs, and of those the nearest to the same offset into the gap (of two same-name GEMMs,
    the one in the same place stayed)."""
    n, m = i1 - i0, j1 - j0
    best = [[(0, 0)] * (m + 1) for _ in range(n + 1)]  # (pairs, -displacement) for a[i0 + i:], b[j0 + j:]
    for i in range(n - 1, -1, -1):
        row, below = best[i], best[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = max(below[j], row[j + 1])
            if a[i0 + i] == b[j0 + j]:
                row[j] = max(row[j], (below[j + 1][0] + 1, below[j + 1][1] - abs(i - j)))
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if a[i0 + i] == b[j0 + j] and best[i][j] == (best[i + 1][j + 1][0] + 1, best[i + 1][j + 1][1] - abs(i - j)):
            pairs.append((i0 + i, j0 + j))
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            i += 1
        else:
            j += 1
    return pairs


def _first(seq, lo: int, hi: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in range(lo, hi):
        out.setdefault(seq[k], k - lo)
    return out


# ------------------------------------------------------------------------------ pairing the rest by meaning

INDUCTOR_RE = re.compile(r"(?:triton|cpp)_\w*?fused_(\w+?)(?:_\d+)?$")
STOP_WORDS = {"aten", "fused", "kernel", "function", "forward", "backward", "triton", "poi", "per", "red", "tem",
              "cpp", "graph", "call", "compiled", "fx", "torch", "region", "default", "out", "impl", "autograd"}


def _inductor(name: str) -> re.Match | None:
    """Inductor's kernel names are short (a few fused ops); a long name is not one, and is not searched."""
    return INDUCTOR_RE.search(name) if len(name) <= 300 else None


def _words(name: str) -> set[str]:
    """aten::gelu -> gelu; LigerGELUMulFunction -> liger, gelu, mul; triton_poi_fused__unsafe_view_gelu_mul_0 ->
    unsafe, view, gelu, mul."""
    m = _inductor(name)
    name = m.group(1) if m else name.split("::")[-1]
    return {w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", name) if len(w) > 1} - STOP_WORDS


def _ancestors(units: list[Unit]) -> set[int]:
    """ids of the spans that hold these units (their ops and everything above them)."""
    seen: set[int] = set()
    for u in units:
        e = u.op
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            e = e.parent
    return seen


def _tags(u: Unit, shared: set[int]) -> set[str]:
    """Words for what this unit does: Inductor's name, its launching op, the spans around it that hold no anchor."""
    words = _words(u.name) if _inductor(u.name) else set()
    e = u.op
    while e is not None and not STEP_RE.match(e.name):
        words |= _words(e.name)
        e = e.parent
        if e is not None and id(e) in shared:
            break
    return words


def _sizes(u: Unit) -> set[str]:
    """Element counts of the launching op's tensor inputs (compiled, [64, 128, 3072] is [8192, 3072])."""
    out = set()
    for d in _dims(u.op) if u.op is not None else []:
        if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d):
            out.add(f"{math.prod(d)} elements")
    return out


class _Union:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x, y):
        self.parent[self.find(x)] = self.find(y)


def _link(uf: _Union, side_a: list, side_b: list, max_gap: int = 2) -> None:
    """Join each unit to the nearest units of the other side sharing a tag (at most max_gap anchors away).

    side_*: (node, gap, tags); a unit's gap is the number of anchors before it. The units of one side with the
    same tag in the same gap are a bucket, joined together once, the first time a unit of the other side links
    to it: the work stays linear in the number of tags.
    """
    def index(side):
        idx: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        for node, gap, tags in side:
            for t in tags:
                idx[t][gap].append(node)
        return {t: (sorted(g), g) for t, g in idx.items()}

    ia, ib = index(side_a), index(side_b)
    joined: set[int] = set()
    for side, other in ((side_a, ib), (side_b, ia)):
        for node, gap, tags in side:
            best, hits = max_gap + 1, []
            for t in tags & other.keys():
                gaps, buckets = other[t]
                k = bisect.bisect_left(gaps, gap)
                for g in gaps[max(k - 1, 0): k + 1]:  # the nearest gap below, and the nearest at or above
                    d = abs(g - gap)
                    if d < best:
                        best, hits = d, [buckets[g]]
                    elif d == best:
                        hits.append(buckets[g])
            for bucket in hits:
                if id(bucket) not in joined:
                    joined.add(id(bucket))
                    for other_node in bucket[1:]:
                        uf.union(bucket[0], other_node)
                uf.union(node, bucket[0])


def _group(ua: list[Unit], ub: list[Unit], pairs: list[tuple[int, int]]) -> list[Replaced]:
    """The unmatched units of one step, grouped by what they do (see the module's docstring)."""
    gap_a, gap_b = [0] * len(ua), [0] * len(ub)
    for k, (i, j) in enumerate(pairs + [(len(ua), len(ub))]):
        i0, j0 = (pairs[k - 1][0] + 1, pairs[k - 1][1] + 1) if k else (0, 0)
        gap_a[i0:i], gap_b[j0:j] = [k] * (i - i0), [k] * (j - j0)
    matched_a, matched_b = {i for i, _ in pairs}, {j for _, j in pairs}
    free_a = [i for i in range(len(ua)) if i not in matched_a]
    free_b = [j for j in range(len(ub)) if j not in matched_b]
    shared_a = _ancestors([ua[i] for i in matched_a])
    shared_b = _ancestors([ub[j] for j in matched_b])
    tags = {("a", i): _tags(ua[i], shared_a) for i in free_a} | {("b", j): _tags(ub[j], shared_b) for j in free_b}

    uf = _Union()
    _link(uf, [(("a", i), gap_a[i], tags["a", i]) for i in free_a],
          [(("b", j), gap_b[j], tags["b", j]) for j in free_b])

    def components():
        comp: dict = defaultdict(lambda: ([], []))
        for i in free_a:
            comp[uf.find(("a", i))][0].append(i)
        for j in free_b:
            comp[uf.find(("b", j))][1].append(j)
        return list(comp.values())

    # Units nothing paired yet: try the tensor sizes their launching ops recorded.
    lone = [c for c in components() if not (c[0] and c[1])]
    _link(uf, [(("a", i), gap_a[i], _sizes(ua[i])) for c in lone for i in c[0]],
          [(("b", j), gap_b[j], _sizes(ub[j])) for c in lone for j in c[1]])

    groups, rest_a, rest_b = [], [], []
    for ia, jb in components():
        if ia and jb:
            words = set().union(*(tags["a", i] for i in ia)) & set().union(*(tags["b", j] for j in jb))
            groups.append((ia, jb, ", ".join(sorted(words)) or "tensor sizes"))
        else:
            rest_a += ia
            rest_b += jb
    if rest_a or rest_b:
        groups.append((sorted(rest_a), sorted(rest_b), REST))

    # In launch order (of A, then of B for groups with nothing from A); the same replacement repeated (one per
    # layer of a model) is one entry, `times` per step.
    merged: dict[tuple, Replaced] = {}
    for ia, jb, by in sorted(groups, key=lambda g: (0, min(g[0])) if g[0] else (1, min(g[1]))):
        old, new = [ua[i].name for i in sorted(ia)], [ub[j].name for j in sorted(jb)]
        r = merged.setdefault((tuple(old), tuple(new), by), Replaced(old, new, defaultdict(float),
                                                                     defaultdict(float), 0, by))
        for i in ia:  # per position: only the kernels in this group, never a same-name anchor
            r.old_name_us[ua[i].name] += ua[i].us
        for j in jb:
            r.new_name_us[ub[j].name] += ub[j].us
        r.times += 1
    return list(merged.values())


# --------------------------------------------------------------------------------------------- the result

def match(a: Trace, b: Trace) -> Comparison:
    """Which kernels are the same, which are gone or new, which replaced which (see the module's docstring)."""
    with _no_gc():
        ua, na = launch_order(a)
        ub, nb = launch_order(b)
        pairs = align([u.name for u in ua], [u.name for u in ub])
        groups = _group(ua, ub, pairs)
        names_a, names_b = per_name(a), per_name(b)
        order_a = list(dict.fromkeys([u.name for u in ua] + sorted(names_a)))
        order_b = list(dict.fromkeys([u.name for u in ub] + sorted(names_b)))
        ca, cb = _op_calls(a), _op_calls(b)
    return Comparison(
        same=[n for n in order_a if n in names_b],
        only_a=[n for n in order_a if n not in names_b],
        only_b=[n for n in order_b if n not in names_a],
        groups=groups,
        ops_gone={k: v for k, v in ca.items() if k not in cb},
        ops_new={k: v for k, v in cb.items() if k not in ca},
        steps_used=(na, nb),
    )


def comparison_data(a: Trace, b: Trace) -> dict:
    """The comparison as plain data (what `inspect_trace.py --json A B` prints); compare() renders it as text.

    µs are per step unless the key says per call; `replaced` entries: A's kernels `old` (one occurrence, in launch
    order) became B's `new`, `times` times per step; `old_us`/`new_us` per step; `old_calls`/`new_calls` per step.
    """
    m = match(a, b)
    sa, sb = per_name(a), per_name(b)

    def trace_info(t: Trace) -> dict:
        return {"path": str(t.path), "device": t.device, "device_name": t.device_name, "whole_trace": t.whole,
                "steps": [{"step": st.number, "gpu_busy_us": st.gpu_busy if t.device == "cuda" else None,
                           "cpu_us": st.cpu_time} for st in t.steps]}

    def one(s: dict, n: str) -> dict:
        calls, per_call = s[n]
        return {"name": n, "calls": calls, "us_per_call": per_call, "us": calls * per_call}

    return {
        "a": trace_info(a), "b": trace_info(b),
        "units": "GPU kernels" if a.device == "cuda" and b.device == "cuda" else "units of work (CPU kernels)",
        "launch_order_steps": {"a": m.steps_used[0], "b": m.steps_used[1]},
        "same": [{"name": n, "a": one(sa, n), "b": one(sb, n)} for n in m.same],
        "replaced": [{"old": g.old, "new": g.new, "times": g.times, "old_us": g.old_us, "new_us": g.new_us,
                      "old_calls": g.calls("old"), "new_calls": g.calls("new"),
                      "old_us_per_call": {n: g.old_name_us[n] / c for n, c in g.calls("old").items()},
                      "new_us_per_call": {n: g.new_name_us[n] / c for n, c in g.calls("new").items()},
                      "by": g.by} for g in m.groups],
        "only_a": [one(sa, n) for n in m.only_a],
        "only_b": [one(sb, n) for n in m.only_b],
        "ops_gone": m.ops_gone, "ops_new": m.ops_new,
    }


# ------------------------------------------------------------------------------------------------ the text

def compare(a: Trace, b: Trace, full_names: bool = False) -> str:
    """The two-trace report, as plain text (A = before, B = after)."""
    return render(comparison_data(a, b), full_names)


def render(d: dict, full_names: bool = False) -> str:
    """comparison_data() as text."""
    def nm(n):
        return short(n, full_names)

    what = d["units"]
    da, db = d["a"], d["b"]
    if da["device"] != db["device"]:
        what += f" -- note: A is a {da['device']} trace, B a {db['device']} trace"

    def where(t):
        return (t["device_name"] or "GPU") if t["device"] == "cuda" else "CPU"

    def steps(t):  # a trace without ProfilerStep#N spans: its "per step" is the whole trace
        return "no ProfilerStep spans: one step, the whole trace" if t.get("whole_trace") else f"{len(t['steps'])} steps"

    out = [f"A  {da['path']}  ({where(da)}, {steps(da)})",
           f"B  {db['path']}  ({where(db)}, {steps(db)})", ""]
    out += _steps_table(da, db)

    out += ["", f"{what[0].upper()}{what[1:]}, same name in both: calls per step, µs per call, µs per step"]
    rows = [[nm(s["name"]), f"{s['a']['calls']:g}", f"{s['b']['calls']:g}", _us(s["a"]["us_per_call"]),
             _us(s["b"]["us_per_call"]), _change(s["a"]["us_per_call"], s["b"]["us_per_call"]),
             _us(s["a"]["us"]), _us(s["b"]["us"])] for s in d["same"]]
    headers = ["name", "calls A", "calls B", "µs/call A", "µs/call B", "per call", "µs/step A", "µs/step B"]
    out.append(_table(headers, rows, right=set(range(1, 8))) if rows else "(none)")

    na, nb = d["launch_order_steps"]["a"], d["launch_order_steps"]["b"]
    out += ["", f"Replaced, paired by what the kernels do (µs per step; {na} + {nb} steps in the typical "
                "launch order):"]
    for r in d["replaced"]:
        out.append(f"  {_names(r['old'], r['times'], nm) or '(nothing)'}")
        out.append(f"    -> {_names(r['new'], r['times'], nm) or '(nothing)'}")
        calls = "; ".join(f"{side} " + (" + ".join(f"{c} × {_us(r[f'{key}_us_per_call'][n])}"
                                                   for n, c in r[f"{key}_calls"].items()) or "none")
                          for side, key in (("A", "old"), ("B", "new")))
        out.append(f"    {_us(r['old_us'])} -> {_us(r['new_us'])} µs per step ({_change(r['old_us'], r['new_us'])}),"
                   f" calls × µs: {calls}")
        out.append(f"    paired by: {r['by']}")
    if not d["replaced"]:
        out.append("  (none)")
    for label, rows_ in (("Only in A", d["only_a"]), ("Only in B", d["only_b"])):
        out += ["", f"{label}:" + ("" if rows_ else " (none)")]
        out += [f"  {_us(r['us']):>8} µs/step  {r['calls']:g} × {_us(r['us_per_call'])}  {nm(r['name'])}"
                for r in rows_]
    for label, ops in (("CPU ops gone in B", d["ops_gone"]), ("CPU ops new in B", d["ops_new"])):
        out += ["", f"{label}:" + ("" if ops else " (none)")]
        out += [f"  {calls:g}/step  {nm(name)}" for name, calls in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(out)


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
            cells += ["…" if i is None else f"#{st['step']}" if st else "", _us(st["gpu_busy_us"]) if st else "",
                      _us(st["cpu_us"]) if st else ""]
        rows.append(cells)
    for label, f in (("median", statistics.median), ("mean", statistics.fmean)):
        cells = []
        for t in (da, db):
            gpu = [s["gpu_busy_us"] for s in t["steps"] if s["gpu_busy_us"] is not None]
            cpu = [s["cpu_us"] for s in t["steps"]]
            cells += [label, _us(f(gpu)) if gpu else "-", _us(f(cpu)) if cpu else "-"]
        rows.append(cells)
    return [f"Per step (µs): GPU busy and CPU span, side by side ({n} steps)",
            _table(["A step", "A GPU", "A CPU", "B step", "B GPU", "B CPU"], rows, right={1, 2, 4, 5})]


def _change(old: float, new: float) -> str:
    if old <= 0:
        return "new"
    return f"{100 * (new - old) / old:+.0f}%"
