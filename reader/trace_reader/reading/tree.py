"""A trace's events into a Trace: the CPU call tree per thread, the steps, each launch to its op and each piece of
GPU work to its launch (parse_trace; the files are read by files.py)."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from operator import attrgetter
from typing import NamedTuple

from .events import (
    CPU_SPAN_CATS,
    GPU_CATS,
    LAUNCH_CATS,
    MAX_US,
    OCCUPANCY,
    STEP_RE,
    WHOLE_TRACE,
    Event,
    Kernel,
    Step,
    Trace,
    TraceError,
)

_TS, _THREAD, _ORDER = attrgetter("ts"), attrgetter("pid", "tid"), attrgetter("order")


def parse_trace(data: object, path: str = "<trace>") -> Trace:
    """Build the Trace from the loaded JSON object (see load_trace)."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON, but not a torch.profiler trace (no 'traceEvents' list)")
    spans, calls, gpu, into = event_lists()
    skipped, side = 0, Side()
    for raw in data["traceEvents"]:
        if not isinstance(raw, dict):
            continue
        out = into.get(raw.get("cat")) if raw.get("ph") == "X" else None  # any "cat" of another phase is let be
        if out is None:
            side.take(raw.get("ph"), raw.get("cat"), raw.get("name"), raw.get("id"), raw.get("pid"), raw.get("tid"),
                      raw.get("ts"), lambda: Instant(raw.get("ts"), raw.get("pid"), raw.get("tid"), raw.get("args")))
            continue
        try:
            out.append(Event(raw))
        except (KeyError, TypeError, ValueError):
            skipped += 1  # no usable timestamp or duration (missing, NaN, negative, absurd): cannot be placed
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return assemble(spans, calls, gpu, skipped, meta, path, side)


MEMORY = "[memory]"  # the name of profile_memory=True's instant events, one per allocation and free


class Instant(NamedTuple):
    """A "[memory]" event as the stdlib decoded it: the fields the memory reader takes, unchecked (see Side)."""
    ts: object
    pid: object
    tid: object
    args: object


class Side:
    """The events parse_trace leaves out of the call tree that the training and memory readers need, gathered in
    the same pass over the events (so the file is read once): fwdbwd flow ends, "[memory]" instants."""

    __slots__ = ("flows", "memory", "named_memory")

    def __init__(self):
        self.flows: list[tuple] = []
        self.memory: list = []
        self.named_memory = False  # an event named "[memory]", of any phase: profiled with profile_memory=True

    def take(self, ph, cat, name, fid, pid, tid, ts, instant) -> bool:
        """One event the tree does not keep, by its fields; instant() makes what memory_events holds of it. True
        when it is a "[memory]" instant, kept. A flow end with an odd field (an id neither int nor str, a thread
        named by a list or an object, a time that is not a number) is left out: no op can be found at it."""
        if name == MEMORY:
            self.named_memory = True
        if cat == "fwdbwd" and ph in ("s", "f"):
            if type(ts) in (int, float) and type(fid) in (int, str) and _scalar(pid) and _scalar(tid):
                try:
                    self.flows.append((fid, ph, pid, tid, float(ts)))
                except OverflowError:  # an integer of 400 digits is valid JSON
                    pass
        elif name == MEMORY and ph in ("i", "I"):
            self.memory.append(instant())
            return True
        return False


def _scalar(x) -> bool:
    """A JSON value that can name a thread (a list or an object cannot: no op is on it)."""
    return x is None or type(x) in (int, float, str, bool)


def event_lists() -> tuple[list, list, list, dict]:
    """(CPU spans, runtime calls, GPU work): empty, and each category the reader uses -> the list its events go to."""
    spans: list[Event] = []
    calls: list[Event] = []
    gpu: list[Event] = []
    into = dict.fromkeys(CPU_SPAN_CATS, spans) | dict.fromkeys(LAUNCH_CATS, calls) | dict.fromkeys(GPU_CATS, gpu)
    return spans, calls, gpu, into


def assemble(spans: list[Event], calls: list[Event], gpu: list[Event], skipped: int, meta: dict, path: str,
             side: Side) -> Trace:
    """The Trace of a trace's events, sorted into its CPU spans, runtime calls and GPU work: the call tree,
    the steps, each launch to its op and each GPU activity to its launch."""
    threads = _build_tree(spans)

    steps = [Step(int(m.group(1)), s) for s in spans
             if s.cat == "user_annotation" and (m := STEP_RE.match(s.name))]
    steps.sort(key=lambda st: st.span.ts)
    # Another harness's trace (a bare `with profile():`, no prof.step()): the whole trace is one step, its CPU
    # span from the first CPU event to the last (the GPU's own clock where the trace has no CPU side).
    whole = not steps and bool(spans or calls or gpu)
    if whole:
        host = spans + calls or gpu
        start = min(e.ts for e in host)
        if (length := max(e.end for e in host) - start) > MAX_US:
            raise TraceError(f"{path}: no ProfilerStep#N spans, and its events span {length / 3.6e9:.3g} hours: "
                             "not one profiled run")
        steps = [Step(0, Event({"name": WHOLE_TRACE, "cat": "user_annotation", "ts": start, "dur": length}))]
    step_starts = [st.span.ts for st in steps]

    def step_at(ts: float) -> Step | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        return steps[i] if i >= 0 and ts <= steps[i].span.end else None

    # CPU spans into their steps (step_at, walked along: spans and steps are sorted by time); each "External id"
    # to its span, the innermost one: a cpu_op wins over a user_annotation sharing it.
    by_ext: dict[int, Event] = {}
    i, last, st = -1, len(steps) - 1, None
    for s in spans:
        ts = s.ts
        while i < last and step_starts[i + 1] <= ts:
            i += 1
            st = steps[i]
        if st is not None and ts <= st.span.end and s is not st.span:
            s.step = st
            st.spans.append(s)
        ext = s.ext
        if ext and (s.cat == "cpu_op" or ext not in by_ext):
            by_ext[ext] = s

    # Runtime calls belong to the op they were made in: by "External id", else by time on their thread.
    # A launch counts as "queried" if an occupancy query came in the same op since that op's previous launch.
    by_corr: dict[object, Event] = {}
    starts: dict[tuple, list[float]] = {}
    queried: set[int] = set()
    pending: set[int] = set()  # the ops with a query since their last launch
    calls.sort(key=_TS)
    for c in calls:
        owner = by_ext.get(c.ext) or _innermost(threads, starts, c)
        c.parent = owner
        if owner is not None:
            owner.calls = _added(owner.calls, c)
            if c.name.startswith(OCCUPANCY):
                pending.add(id(owner))
            elif _launches(c) and pending:
                if id(owner) in pending:
                    queried.add(id(c))
                    pending.discard(id(owner))
        corr = c.corr
        if corr is not None:
            seen = by_corr.get(corr)
            if seen is not None and None not in (seen.pid, c.pid) and str(seen.pid) != str(c.pid):
                # CUPTI numbers one process's calls: the same number from two processes is two files' events in
                # one, and which launch a kernel came from is not known (nor which process's step it is in). A pid
                # written 1234 once and "1234" once, or left out, is no second process.
                raise TraceError(f"{path}: processes {seen.pid} and {c.pid} both made a call with correlation id "
                                 f"{corr}: several processes' traces merged into one file? Read each process's own "
                                 "trace (a folder of rank traces: --ranks)")
            by_corr[corr] = c

    for g in gpu:
        launch = by_corr.get(g.corr)
        op = launch.parent if launch is not None else by_ext.get(g.ext)
        k = Kernel(g, launch, op, launch is not None and id(launch) in queried)
        if op is not None:
            op.kernels = _added(op.kernels, k)
        if whole:
            st = steps[0]  # all of it, wherever the GPU ran it
        elif launch is not None:
            st = step_at(launch.ts)
        elif op is not None:
            st = op.step
        elif by_corr and g.corr is not None:
            # Its launch is not in the trace: the CPU made it before the recorded window (the profiler's warm-up
            # step), and the GPU, running behind without a per-step sync, ran it inside an active step's span.
            st = None
        else:  # a trace without runtime calls: the GPU's own clock is all there is
            st = step_at(g.ts)
        if st is not None:
            st.gpu.append(k)
    for st in steps:
        st.gpu.sort(key=_ORDER)

    props = meta.get("deviceProperties")
    props = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    # GPU activity or a launch makes it a GPU trace. Runtime calls that launch nothing (cudaGetDevice,
    # cudaStreamIsCapturing) do not: without a launch, no GPU work belongs to the trace.
    has_gpu_work = bool(gpu) or any(_launches(c) for c in calls)
    return Trace(path, meta, steps, props, has_gpu_work, skipped, has_memory_events=side.named_memory, whole=whole,
                 flow_ends=tuple(side.flows), memory_events=tuple(side.memory))


def _added(items: list | tuple, item) -> list:
    """items with item added: an event's children, calls and kernels are () until the first (see Event)."""
    if items:
        items.append(item)
        return items
    return [item]


def _launches(call: Event) -> bool:
    return "Launch" in call.name or "launch" in call.name


def _build_tree(spans: list[Event]) -> dict[tuple, list[Event]]:
    """Sort spans by time (the longer first at one start) and nest them per thread: a span's parent is the
    innermost one that contains it. Returns each thread's spans, for _innermost."""
    spans.sort(key=_TS)  # a trace lists them nearly in order: a sort on one float is almost free
    if not spans:
        return {}
    # Most traces: one thread, no two spans starting together. Walked as such, and walked again the long way
    # (per thread, the longer first at one start) at the first span that says otherwise.
    if _nest(spans, (spans[0].pid, spans[0].tid)):
        return {(spans[0].pid, spans[0].tid): spans}
    for s in spans:
        s.parent, s.children = None, ()
    spans.sort(key=lambda e: (e.ts, -e.dur))
    per = defaultdict(list)
    for s in spans:
        per[s.pid, s.tid].append(s)
    for lane in per.values():
        _nest(lane, None)
    return per


def _nest(lane: list[Event], thread: tuple | None) -> bool:
    """Give each span of lane (sorted) its parent and children. With a thread (pid, tid): stop, returning False,
    at a span of another thread or one that starts with the one before it (which comes first is then not known)."""
    check = thread is not None
    pid, tid = thread or (None, None)
    # The open spans, innermost last, each with its end; the bottom one (no span) never closes.
    stack: list[tuple[float, Event | None]] = [(math.inf, None)]
    open_end, parent, last_ts = math.inf, None, None
    for s in lane:
        if check and (s.ts == last_ts or s.tid != tid or s.pid != pid):
            return False
        end, last_ts = s.end, s.ts
        while open_end < end:
            stack.pop()
            open_end, parent = stack[-1]
        if parent is not None:
            s.parent = parent
            if parent.children:  # _added, inlined: once per span
                parent.children.append(s)
            else:
                parent.children = [s]
        stack.append((end, s))
        open_end, parent = end, s
    return True


def _innermost(threads: dict, starts: dict, ev: Event) -> Event | None:
    """The innermost span on ev's thread that contains ev's start (bisect, then up the tree). starts: each
    thread's span starts, filled on first use (most calls find their op by "External id")."""
    thread = (ev.pid, ev.tid)
    spans = threads.get(thread)
    if spans is None:
        return None
    if thread not in starts:
        starts[thread] = list(map(_TS, spans))
    i = bisect.bisect_right(starts[thread], ev.ts) - 1
    node = spans[i] if i >= 0 else None
    while node is not None and node.end < ev.ts:
        node = node.parent
    return node
