"""Where the record_function annotations are: GPU and CPU time per annotation, the annotations around an event,
which spans are torch's own and which the user's (has_annotations)."""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

from ..reading.events import BACKWARD_RE, STEP_RE, Event, Kernel, Step, Trace

# record_function spans torch writes by itself, in any harness: torch.optim's step and zero_grad, Inductor's around
# a compiled graph's call, Dynamo's compile steps, DDP's forward, FSDP's hooks, gloo's and NCCL's collectives.
TORCH_SPAN_RE = re.compile(r"^(?:Optimizer\.(step|zero_grad)#|## Call CompiledFxGraph |\w+_data: compile_id=|"
                           r"DistributedDataParallel\.|FSDP::|gloo:|nccl:)")


def has_annotations(t: Trace) -> bool:
    """Any record_function span besides ProfilerStep#k and torch's own? Traces from other harnesses often have none."""
    return any(e.cat == "user_annotation" and not STEP_RE.match(e.name) and not TORCH_SPAN_RE.match(e.name)
               for st in t.steps for e in st.spans)


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
