"""A training step's phases as windows of CPU time: a forward and a backward pass per micro-batch, the optimizer.

Annotated (07_train_step.py and 09_data_parallel.py write record_function("forward" / "backward" / "optimizer"),
once per micro-batch for the first two): each phase is every span of its name in the step.

Not annotated (another harness): what torch records by itself.
- Backward passes: the autograd engine's `autograd::engine::evaluate_function: ...` spans (on the engine's own
  thread on a GPU), and the regions of a backward graph compiled by compiled autograd ("Torch-Compiled Region:
  !N/..."), which run instead of them. One pass ends where the next micro-batch's forward starts: a forward op, one
  that records an autograd "Sequence number" outside backward, between two of them splits them. A pass also holds
  what DDP and FSDP run when the engine is done (DDP's reducer copying buckets to the gradients, or with
  gradient_as_bucket_view=True pointing them at their buckets with aten::as_strided, FSDP's post-backward callback): `loss.backward()` returns only after them, and it is there that a rank waits for its
  gradients' collectives.
- Forward: from zero_grad (or the step's start) to the first backward pass, and from each pass to the next.
- The optimizer: torch.optim's `Optimizer.step#<class>.step` span.
Compiler work is no phase: Dynamo's and Inductor's own spans (`dynamo`, `entire_frame_compile`,
`entire_backward_compile`, `... (dynamo_timed)`) and everything inside them, where a recompile in the profiled step
runs the model on fake tensors (forward ops, autograd engine spans, GEMMs that do no work) and compiles for seconds.
Their time is cut out of every window and reported apart.

Communication wait: in a distributed trace, the CPU time of a backward pass in which the thread running it ran no
op's own code (no span open, or only a record_function such as FSDP's `FSDP::all_gather`): DDP waiting for its
buckets' all-reduces before it copies them to the gradients, FSDP waiting for its all-gathers and reduce-scatters. (On a GPU NCCL's waits are the stream's, not the thread's: there the wait is read off the GPU.)
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from ..facts import intervals
from ..reading.events import BACKWARD_PREFIX, Event, Step
from .collectives import cpu_busy
from .compiled import REGION_PREFIX

PHASES = ("forward", "backward", "optimizer")
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#(\w+)\.step$")
ZERO_GRAD_RE = re.compile(r"^Optimizer\.zero_grad#")
COMPILER_SPANS = frozenset({"dynamo", "entire_frame_compile", "entire_backward_compile"})
COMPILER_SUFFIX = " (dynamo_timed)"
# What runs at the end of loss.backward() after the engine's last node: DDP's reducer, FSDP's post-backward callback.
TAIL_RE = re.compile(r"^(?:torch\.distributed\.ddp\.reducer::|FSDP::(?:root_)?post_backward)")
# With gradient_as_bucket_view=True DDP's reducer copies nothing at the end: it only points each gradient at its
# bucket again (one top-level aten::as_strided per gradient, after each bucket's wait)
BUCKET_VIEW = "aten::as_strided"
COMPILED_AUTOGRAD_PREFIX = REGION_PREFIX + "!"  # Torch-Compiled Region: !0/1/0
COLLECTIVE_RE = re.compile(r"^(?:record_param_comms$|gloo:|nccl:|c10d::)")


class Window(tuple):
    """A phase's CPU time in one step: the tuple is (start, end) of all of it; `parts` are the intervals it is made
    of (one per micro-batch, less the `holes`: compiler work), `length` their total, `passes` how many intervals
    it was made of before the holes were cut (a micro-batch's pass cut in two by a compile is still one)."""

    parts: tuple
    passes: int
    whole: tuple  # the intervals before the holes were cut: one per pass

    def __new__(cls, parts, holes=()):
        whole = intervals.merge(p for p in parts if p[1] >= p[0])
        merged = subtract(whole, holes) if holes else whole
        self = super().__new__(cls, (merged[0][0], merged[-1][1]) if merged else (0.0, 0.0))
        self.parts, self.whole, self.passes = tuple(merged), tuple(whole), len(whole)
        self._starts = [a for a, _ in merged]
        return self

    @property
    def length(self) -> float:
        return sum(b - a for a, b in self.parts)

    def holds(self, ts: float) -> bool:
        """Is ts inside one of the parts (ends included)?"""
        i = bisect.bisect_right(self._starts, ts) - 1
        return i >= 0 and ts <= self.parts[i][1]


def inside(ts: float, window) -> bool:
    """ts in a phase's window: a Window's parts, or a plain (start, end)."""
    if isinstance(window, Window):
        return window.holds(ts)
    return window[0] <= ts <= window[1]


def is_compiler_span(e: Event) -> bool:
    return e.name in COMPILER_SPANS or e.name.endswith(COMPILER_SUFFIX)


class Compiler:
    """Which spans of a step lie inside the compiler's own work (memoised per span: a walk up once each)."""

    def __init__(self, st: Step):
        self._seen: dict[int, bool] = {}
        self.spans = [e for e in st.spans if is_compiler_span(e) and not self.owns(e.parent)]

    def owns(self, e: Event | None) -> bool:
        """e is compiler work: a compiler span, or inside one."""
        path = []
        while e is not None and id(e) not in self._seen:
            if is_compiler_span(e):
                self._seen[id(e)] = True
                break
            path.append(e)
            e = e.parent
        found = self._seen.get(id(e), False) if e is not None else False
        for p in path:
            self._seen[id(p)] = found
        return found

    @property
    def holes(self) -> list[tuple[float, float]]:
        """The compiler's own time in the step, as intervals."""
        return [(e.ts, e.end) for e in self.spans]


def subtract(parts, holes) -> list[tuple[float, float]]:
    """Intervals less other intervals."""
    return [g for a, b in intervals.merge(parts) for g in intervals.gaps(holes, a, b) if g[1] > g[0]]


def under(e: Event, prefix: str) -> bool:
    """Is some span above e named prefix...? (an op inside an autograd engine node, a region inside another)"""
    node = e.parent
    while node is not None:
        if node.name.startswith(prefix):
            return True
        node = node.parent
    return False


@dataclass
class Pass:
    """One micro-batch's forward and backward, as CPU intervals."""

    forward: tuple[float, float]
    backward: tuple[float, float]


def backward_spans(st: Step, compiler: Compiler) -> list[Event]:
    """The step's outermost autograd engine spans and compiled-autograd regions, compiler work aside."""
    out = []
    for e in st.spans:
        if e.cat == "cpu_op" and e.name.startswith(BACKWARD_PREFIX) and not under(e, BACKWARD_PREFIX):
            if not compiler.owns(e):
                out.append(e)
        elif e.name.startswith(COMPILED_AUTOGRAD_PREFIX) and not under(e, COMPILED_AUTOGRAD_PREFIX):
            out.append(e)
    return out


def passes(st: Step, compiler: Compiler | None = None) -> list[Pass]:
    """The step's forward/backward pairs, one per micro-batch, read from torch's own spans (see the docstring)."""
    compiler = compiler or Compiler(st)
    bwd = backward_spans(st, compiler)
    if not bwd:
        return []
    in_backward = {id(e) for e in bwd}

    def under_backward(e: Event) -> bool:
        node = e
        while node is not None:
            if id(node) in in_backward:
                return True
            node = node.parent
        return False

    # ops outside backward and the compiler, by start: the next micro-batch's forward is among them
    outside = sorted((e for e in st.spans if e.cat == "cpu_op" and not under_backward(e) and not compiler.owns(e)),
                     key=lambda e: e.ts)
    starts = [e.ts for e in outside]

    def forward_between(a: float, b: float) -> float | None:
        """The start of the first forward op (one with an autograd sequence number) in (a, b); its args are read
        only for the ops in that gap (most ops' args are never decoded)."""
        for e in outside[bisect.bisect_right(starts, a):bisect.bisect_left(starts, b)]:
            if "Sequence number" in e.args:
                return e.ts
        return None

    dist = distributed(st)
    tails = sorted((e for e in st.spans if not under_backward(e) and (TAIL_RE.match(e.name) or (
        dist and e.name == BUCKET_VIEW and not under(e, "aten::") and not compiler.owns(e)))), key=lambda e: e.ts)
    opt_starts = sorted(e.ts for e in st.spans if OPTIMIZER_STEP_RE.match(e.name))
    groups: list[list[Event]] = [[bwd[0]]]
    for e in bwd[1:]:
        if forward_between(max(x.end for x in groups[-1]), e.ts) is not None:
            groups.append([e])
        else:
            groups[-1].append(e)
    zeroed = [e.end for e in st.spans if ZERO_GRAD_RE.match(e.name) and e.end <= bwd[0].ts]
    start = max([st.span.ts, *zeroed])
    out = []
    for i, g in enumerate(groups):
        b0, b1 = g[0].ts, max(e.end for e in g)
        limit = min([groups[i + 1][0].ts if i + 1 < len(groups) else st.span.end, *[t for t in opt_starts if t >= b1]])
        limit = forward_between(b1, limit) or limit  # a forward after the last pass (say, an evaluation) ends it too
        b1 = max([b1, *(e.end for e in tails if b1 <= e.ts < limit)])
        out.append(Pass((start, b0), (b0, b1)))
        start = b1
    return out


def distributed(st: Step) -> bool:
    """Does the step call collectives (c10d's record_param_comms, gloo's or NCCL's spans)?"""
    return any(COLLECTIVE_RE.match(e.name) for e in st.spans)


def comm_wait(st: Step, window: Window, compiler: Compiler) -> float:
    """CPU µs of a backward window in which the threads running backward (the engine's spans, DDP's and FSDP's
    tails) ran no op's own code (collectives.cpu_busy: no span open, a wait, or only a record_function such as
    FSDP::all_gather): where DDP and FSDP wait for their collectives on a CPU (see the docstring)."""
    mine = [e for e in st.spans if inside(e.ts, window)]
    threads = {(e.pid, e.tid) for e in backward_spans(st, compiler) + [e for e in mine if TAIL_RE.match(e.name)]
               if inside(e.ts, window)}
    busy = [iv for thread, ivs in cpu_busy(st).items() if thread in threads for iv in ivs]
    return window.length - intervals.common(window.parts, busy)


def phase_windows(st: Step) -> tuple[dict[str, Window], bool]:
    """({phase: its Window}, from annotations?): the step's record_function("forward"/"backward"/"optimizer")
    spans where all three are there (every span of each name: one per micro-batch), else torch's own spans (see the
    docstring); an annotation the step has wins over what torch's spans say. Compiler work is cut out."""
    compiler = Compiler(st)
    found: dict[str, list] = {}
    for e in st.spans:
        if e.cat == "user_annotation" and e.name in PHASES:
            found.setdefault(e.name, []).append((e.ts, e.end))
    if len(found) == len(PHASES):
        return {p: Window(found[p], compiler.holes) for p in PHASES}, True
    inferred: dict[str, list] = {}
    ps = passes(st, compiler)
    if ps:
        inferred["forward"] = [p.forward for p in ps]
        inferred["backward"] = [p.backward for p in ps]
    opt = [(e.ts, e.end) for e in st.spans if OPTIMIZER_STEP_RE.match(e.name)]
    if opt:
        inferred["optimizer"] = opt
    inferred.update(found)
    return {p: Window(v, compiler.holes) for p, v in inferred.items()}, False
