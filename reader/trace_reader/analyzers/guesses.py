"""The guesses rungs 01-05 are made of, each an Expect: steps and their annotation, kernels per step, a kernel or a
CPU op by pattern, the occupancy queries before GEMM launches, views that launch nothing, overhead- or compute-bound,
Part 1's cold start, lag and buffer request."""

from __future__ import annotations

import re

from ..expectation import Expect, NotApplicable, need_steps
from ..facts.kernels import VIEW_OPS, is_gemm, short, splitk_reduces, view_cuda_time
from ..reading.events import OCCUPANCY, Trace
from ..reading.files import read_json
from . import lag  # through the module: tests stand in for its functions
from .annotations import has_annotations
from .steps import bound_of


def steps(n: int, annotation: str) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):  # "each step has one" says nothing about a trace with none: broken
            return str(miss)
        if len(t.steps) != n:
            return f"{len(t.steps)} active steps"
        if t.steps and not has_annotations(t):
            return NotApplicable(f"{n} active steps as guessed; no annotation in this trace, so "
                                 f"'{annotation}' cannot be looked for")
        for st in t.steps:
            if not any(e.cat == "user_annotation" and e.name == annotation for e in st.spans):
                return f"ProfilerStep#{st.number} has no '{annotation}' span"
        return True
    many = f"{n} active" if n else "active"  # 0: read from a trace without steps, whose run's --active is unknown
    return Expect(f"{many} ProfilerStep#k spans, each around a '{annotation}' record_function", run)


def kernels_per_step(n: int, what: str = "") -> Expect:
    """n kernels in every step, a GEMM counted once: the reduce kernel of a split-K GEMM is not counted."""
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [len(st.kernels) for st in t.steps]
        reduces = [len(splitk_reduces(st)) for st in t.steps]
        launches = [c - r for c, r in zip(counts, reduces)]
        if all(c == n for c in launches):
            return True
        return f"kernels per step: {counts}" + (f", less split-K reduces {reduces}: {launches}" if any(reduces) else "")
    return Expect(f"{n} GPU kernel{'s' if n != 1 else ''} per step" + (f" ({what})" if what else ""), run, "cuda")


def kernel(pattern: str, per_step: int | None = None, what: str = "") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [sum(1 for k in st.kernels if rx.search(k.name)) for st in t.steps]
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        if ok:
            return True
        seen = sorted({short(k.name, False, 60) for st in t.steps for k in st.kernels})
        return f"matches per step: {counts}; kernels seen: {seen}"
    times = f", {per_step}x per step" if per_step is not None else " in every step"
    return Expect(f"a GPU kernel matching /{pattern}/{times}" + (f" ({what})" if what else ""), run, "cuda")


def cpu_op(name: str, present: bool = True, per_step: int | None = None) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if e.cat == "cpu_op" and e.name == name) for st in t.steps]
        if not present and not any(e.cat == "cpu_op" for st in t.steps for e in st.spans):
            return NotApplicable(f"no CPU ops recorded in the active steps: no '{name}' among none says nothing")
        if not present:
            return True if not any(counts) else f"'{name}' per step: {counts}"
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        return True if ok else f"'{name}' per step: {counts}"
    if not present:
        text = f"no '{name}' op"
    else:
        text = f"'{name}' " + (f"{per_step}x per step" if per_step is not None else "in every step")
    return Expect(text, run)


def cpu_event(pattern: str, device: str = "cpu") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if rx.search(e.name)) for st in t.steps]
        return True if all(counts) else f"matching CPU events per step: {counts}"
    return Expect(f"a CPU event matching /{pattern}/ in every step", run, device)


def occupancy_before_gemms() -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        # a split-K reduce is the GEMM's second half: neither a GEMM launch nor a pointwise one
        reduces = {id(k) for st in t.steps for k in splitk_reduces(st)}
        launched = [k for st in t.steps for k in st.kernels if id(k) not in reduces]
        gemms = [k for k in launched if is_gemm(k)]
        if not gemms:
            return "no GEMM kernels in the active steps"
        if any(k.launch is None for k in gemms):  # without the launch call, "before it" means nothing
            return f"{sum(k.launch is None for k in gemms)} GEMM kernels have no linked launch call"
        bare = [k for k in gemms if not k.occupancy_query]
        queried = [k for k in launched if not is_gemm(k) and k.occupancy_query]
        if bare or queried:
            # Say what the GEMM ops called instead: that is where to look next.
            seen = sorted({c.name for k in bare for c in k.op.calls} if bare else set())
            return (f"GEMM launches without the query: {len(bare)}/{len(gemms)}"
                    + (f" (their ops call: {', '.join(seen)})" if seen else "")
                    + f"; non-GEMM launches with it: {len(queried)}"
                    + (f" ({short(queried[0].name, False, 50)})" if queried else ""))
        return True
    return Expect(f"every GEMM launch is preceded by {OCCUPANCY}; pointwise launches are bare", run, "cuda")


def views_launch_nothing() -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        views = [op for st in t.steps for op in st.ops(VIEW_OPS)]
        if not views:
            return "no view ops in the active steps"
        if not any(st.kernels for st in t.steps):
            return "no GPU kernels in the active steps"
        below = _launching(t)
        busy = [op for op in views if id(op) in below][:3]  # the first three that launched anything are named
        if busy:
            return "; ".join(f"{op.name} launched {k} kernel(s), {t_:.1f} µs"
                             for op in busy for k, t_ in [view_cuda_time(op)])
        return True
    return Expect("view ops (aten::t, transpose, reshape, view, ...) launch no kernel: 0 µs CUDA time",
                  run, "cuda")


def _launching(t: Trace) -> set[int]:
    """The ids of the spans that launched GPU work, themselves or through anything they called: each launching op
    and its callers, walked up until a caller already marked (views nested in views stay linear)."""
    marked: set[int] = set()
    for st in t.steps:
        for e in st.spans:
            node = e if e.kernels else None
            while node is not None and id(node) not in marked:
                marked.add(id(node))
                node = node.parent
    return marked


def bound(kind: str) -> Expect:
    if kind not in ("overhead", "compute"):
        raise ValueError(f"bound(kind): kind must be 'overhead' or 'compute', got {kind!r}")

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        b = bound_of(t)
        if b is None:
            return "no GPU work in the active steps"
        return True if b[0] == kind else f"{b[0]}-bound: the typical step's GPU is busy {100 * b[1]:.0f}%"
    return Expect(f"{kind}-bound: the typical step's GPU is busy {'<' if kind == 'overhead' else '>='} 50% "
                  "(of busy + the idle it caused)",
                  run, "cuda")


def cold_start_gap(annotation: str, cold: bool, ratio: float = 3.0) -> Expect:
    """Cold: the first active step waits > ratio x (median of the later steps) between entering
    record_function(annotation) and its first aten op; warm: it does not."""
    def run(t: Trace):
        gaps = [lag.dispatch_gap(st, annotation) for st in t.steps]
        if len(gaps) < 2 or None in gaps:
            return f"'{annotation}' -> first aten op per step (µs): {gaps}; needs 2+ steps with both"
        later = sorted(gaps[1:])[(len(gaps) - 2) // 2]
        seen = f"'{annotation}' -> first aten op per step: {', '.join(f'{g:.1f}' for g in gaps)} µs"
        return (gaps[0] > ratio * later) == cold or seen
    which = "waits longest" if cold else "does not wait long"
    return Expect(f"{'cold' if cold else 'warm'}: the first active step {which} between record_function('{annotation}') "
                  f"and its first aten op ({'>' if cold else '<='} {ratio:g}x later steps; the post: 228 vs ~5 µs cold)",
                  run, "cuda")


def gpu_lag_grows(grows: bool) -> Expect:
    """Without a sync per step and with more GPU work per step than CPU work, the GPU starts each step's
    work later after its launch than the step before (launch_lag), from the step where it lagged least on;
    with a sync per step it does not."""
    def run(t: Trace):
        lags = [lag.launch_lag(st) for st in t.steps]
        if len(lags) < 3 or None in lags:
            return f"launch -> GPU start per step (µs): {lags}; needs 3+ steps with linked launches"
        # from its lowest on: a cold first step's slow CPU lets the GPU catch up once, before it falls behind
        low = lags.index(min(lags[:-1]))
        tail = lags[low:]
        growing = all(b > a for a, b in zip(tail, tail[1:])) and tail[-1] > 2 * tail[0] + 50
        return growing == grows or f"launch -> GPU start per step: {', '.join(f'{x:.0f}' for x in lags)} µs"
    if grows:
        text = "no sync per step, compute-bound: the GPU falls further behind the CPU each step (launch -> start lag grows)"
    else:
        text = "a sync after each step: the GPU's launch -> start lag does not grow"
    return Expect(text, run, "cuda")


BUFFER_REQUEST = "Activity Buffer Request"


def buffer_request() -> Expect:
    """schedule(wait=0, warmup=0): CUPTI's 'Activity Buffer Request' lands inside the trace (Part 1's Figure 9).
    Not a step event, so it is looked up in the trace file itself."""
    def run(t: Trace):
        data = read_json(t.path)
        events = data.get("traceEvents") if isinstance(data, dict) else None
        found = any(isinstance(e, dict) and e.get("name") == BUFFER_REQUEST for e in events or [])
        return found or f"no '{BUFFER_REQUEST}' event in the trace"
    return Expect(f"wait=0, warmup=0: an '{BUFFER_REQUEST}' event on the GPU lane", run, "cuda")
