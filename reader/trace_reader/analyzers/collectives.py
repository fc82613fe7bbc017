"""One rank's collectives in one step: what its code called, what ran it, how long its thread waited; the step's
compute and communication as intervals (what ranks.py joins over the ranks of a run).

torch records two moments of a collective on each rank:
- the call: c10d's op (`c10d::allreduce_`, `c10d::_reduce_scatter_base_`, `c10d::broadcast_`, ...) on the thread
  that called it: the step's own thread, DDP's reducer inside backward, autograd's thread on a GPU. On NCCL c10d's
  `record_param_comms` sits inside it (and records `work.wait()` as "wait"). The call is when the rank arrived,
  and its name says what the rank asked for;
- the run: on a CPU, gloo's span ("gloo:all_reduce") on one of gloo's worker threads, which take the calls of a
  process group in order, so a call can sit queued behind an earlier one before its span starts; on a GPU, the
  NCCL kernel the call launched. gloo may run a collective as another: `_reduce_scatter_base_` runs as a
  "gloo:all_reduce" of the whole input (the collective's kind is the call's, `ran_as` the run's).
A call and its gloo span are paired in order (gloo's queue is first in, first out), kind and size agreeing; an NCCL
kernel belongs to the call around the op that launched it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..facts import intervals
from ..facts.kernels import cpu_kernels
from ..reading.events import Event, Step

NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
GLOO_RE = re.compile(r"^gloo:(\w+)")
CALL_RE = re.compile(r"^(?:c10d|_c10d_functional)::(\w+)$")  # c10d's ops, and the functional ones DTensor calls
RECORD_COMMS = "record_param_comms"  # c10d's record of a collective (NCCL): its kind in "Collective name"
KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
         ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send_recv"),
         ("recv", "send_recv"), ("reduce", "reduce"), ("barrier", "barrier"))
# A call's name may also be one of these (gather_, scatter_, monitored_barrier_); anything else (wait_tensor, a
# record_param_comms "wait") is not a collective.
CALL_KINDS = KINDS + (("gather", "gather"), ("scatter", "scatter"), ("monitoredbarrier", "barrier"))
RUNS_AS = {"reduce_scatter": ("reduce_scatter", "all_reduce")}  # gloo's _reduce_scatter_base_: an all-reduce
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
               "int": 4, "int32": 4, "longint": 8, "long": 8, "int64": 8, "char": 1, "int8": 1, "bool": 1,
               "unsignedchar": 1, "uint8": 1, "float8e4m3fn": 1, "float8e5m2": 1}
NOT_TENSORS = {"", "Scalar", "ScalarList", "GenericList"}  # "Input type"s of a call's other arguments
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#\w+\.step$")  # torch.optim's own span (as training.py reads it)
WAIT_OPS = {"_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"}  # DTensor's, TP's, FSDP2's waits
# A gap this short on the calling thread is the interpreter between two ops, not a wait: with no collective in
# flight, 95% of the gaps between ops in tests/data/dist's traces are under 30 µs.
MIN_WAIT_US = 50.0
MAX_DEPTH = 1024  # walks up a call stack stop here (Python's recursion limit bounds a real one)


def kind_of(name: str) -> str | None:
    """all_reduce for ncclDevKernel_AllReduce_Sum_bf16_RING_LL and gloo:all_reduce; None for other work."""
    m = NCCL_KERNEL_RE.match(name) or GLOO_RE.match(name)
    if not m:
        return None
    key = m.group(1).lower().replace("_", "")
    return next((kind for prefix, kind in KINDS if key.startswith(prefix)), key)


def call_kind(e: Event) -> str | None:
    """The collective a CPU op calls: c10d's ops by name (c10d::_reduce_scatter_base_ -> reduce_scatter),
    record_param_comms by its "Collective name"; None for any other op and for waits."""
    if e.cat != "cpu_op":
        return None
    m = CALL_RE.match(e.name)
    key = m.group(1) if m else e.args.get("Collective name") if e.name == RECORD_COMMS else None
    if not isinstance(key, str):
        return None
    key = key.lower().replace("_", "")
    return next((kind for prefix, kind in CALL_KINDS if key.startswith(prefix)), None)


def _dtype_bytes(name: object) -> int | None:
    if not isinstance(name, str):
        return None
    return DTYPE_BYTES.get(name.lower().removeprefix("c10::").removeprefix("torch.").replace(" ", "").replace("_", ""))


def _elements(dims: object) -> int | None:
    """Elements of one tensor's dims ([2, 32, 64]) or of a tensor list's ([[2, 32, 64], ...]); None if not dims."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        parts = [_elements(d) for d in dims]
        return None if None in parts else sum(parts)
    if isinstance(dims, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return None


def _size(kind: str, args: dict, world: int) -> int | None:
    """nccl-tests' size of a collective from its event's args: the "In/Out msg nelems" NCCL kernels carry, else
    the first input's "Input Dims" (gloo's spans), an all-gather's output being world x its input."""
    item = _dtype_bytes(args.get("dtype")) or _dtype_bytes((args.get("Input type") or [None])[0]
                                                          if isinstance(args.get("Input type"), list) else None)
    if item is None:
        return None
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    if type(n_in) is int and type(n_out) is int and 0 <= n_in < 1 << 40 and 0 <= n_out < 1 << 40:
        return max(n_in, n_out) * item
    dims = args.get("Input Dims")
    n = _elements(dims[0]) if isinstance(dims, list) and dims else None
    if n is None:
        return None
    return n * item * (world if kind == "all_gather" else 1)


def _with_size(ev: Event, ops: list[Event]) -> dict:
    """The args that say a collective's size: the event's own, else those of the op (or its parents) that ran it:
    NCCL's "In msg nelems" (on the kernel, or c10d's record_param_comms), or the dims of gloo's span or of NCCL's
    record function ("nccl:all_reduce")."""
    for e in [ev, *ops]:
        depth = 0
        while e is not None and depth < MAX_DEPTH:
            if "In msg nelems" in e.args or ((GLOO_RE.match(e.name) or e.name.startswith("nccl:"))
                                             and "Input Dims" in e.args):
                return e.args
            e, depth = e.parent, depth + 1
    return ev.args


def _tensor_sizes(args: dict) -> tuple[int, ...]:
    """Elements of each tensor (or tensor list, summed) a call was given, as its "Input Dims" record them; NCCL's
    record_param_comms says them as "In/Out msg nelems"."""
    sizes = [n for n in (args.get("In msg nelems"), args.get("Out msg nelems")) if type(n) is int and n >= 0]
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list):
        types = types if isinstance(types, list) and len(types) == len(dims) else [None] * len(dims)
        for d, t in zip(dims, types):
            # a 0-d tensor has dims [] and so does an argument that is no tensor: the type tells them apart
            if isinstance(d, list) and (t not in NOT_TENSORS if isinstance(t, str) else bool(d)):
                n = _elements(d)
                if n is not None:
                    sizes.append(n)
    return tuple(sizes)


def _above(e: Event, test) -> Event | None:
    """The nearest of e's parents that passes test."""
    p, depth = e.parent, 0
    while p is not None and depth < MAX_DEPTH:
        if test(p):
            return p
        p, depth = p.parent, depth + 1
    return None


@dataclass(eq=False)
class Call:
    """One collective the rank's code called in the step, and what ran it."""

    kind: str  # what the call asked for: all_reduce, reduce_scatter, ... (CALL_KINDS)
    event: Event  # the call: the outermost c10d op where one calls another, or record_param_comms
    sizes: tuple[int, ...]  # elements of each tensor it was given, as its record says
    ran: list[Event] = field(default_factory=list)  # its gloo span, or the NCCL kernel(s) it launched
    done: float | None = None  # when its run ended as far as the trace can tell (see step_calls); None: no run seen
    waits: list[tuple[float, float]] = field(default_factory=list)  # its thread idle, waiting for it (see step_calls)

    @property
    def name(self) -> str:
        e = self.event
        return f"{e.name}:{e.args['Collective name']}" if e.name == RECORD_COMMS else e.name

    @property
    def ts(self) -> float:
        return self.event.ts

    @property
    def thread(self) -> tuple:
        return (self.event.pid, self.event.tid)

    @property
    def start(self) -> float | None:
        """When its run began (gloo's span, the first NCCL kernel): after the call, by the time it sat queued."""
        return min(e.ts for e in self.ran) if self.ran else None

    @property
    def ran_as(self) -> str | None:
        return kind_of(self.ran[0].name) if self.ran else None

    @property
    def waited_us(self) -> float:
        return sum(b - a for a, b in self.waits)


def _calls(st: Step) -> list[Call]:
    """The step's collective calls in time order: each call op that no other call op holds (c10d::allreduce_ holds
    NCCL's record_param_comms), none inside a gloo span (gloo's own thread calls nothing)."""
    out = []
    for e in st.spans:
        kind = call_kind(e)
        if kind is not None and _above(e, lambda p: call_kind(p) is not None or GLOO_RE.match(p.name)) is None:
            out.append(Call(kind, e, _tensor_sizes(e.args)))
    return out


def _runs_of(call: Call, span: Event) -> bool:
    """Whether gloo's span can be the run of this call: a kind the call runs as, and one of its tensors' size."""
    if kind_of(span.name) not in RUNS_AS.get(call.kind, (call.kind,)):
        return False
    dims = span.args.get("Input Dims")
    n = _elements(dims[0]) if isinstance(dims, list) and dims else None
    return n is None or not call.sizes or n in call.sizes


def _pair_gloo(calls: list[Call], spans: list[Event]) -> None:
    """Each call its gloo span: the first one not yet taken that starts after the call and can run it (gloo's
    queue is first in, first out; one queue per process group, so a call of another group may come between)."""
    free = sorted(spans, key=lambda e: e.ts)
    first = 0  # free[:first] started before the call in hand, so before every later one: no call's run
    for c in calls:
        while first < len(free) and (free[first] is None or free[first].ts < c.ts):
            first += 1
        j = next((j for j in range(first, len(free)) if free[j] is not None and _runs_of(c, free[j])), None)
        if j is not None:
            c.ran.append(free[j])
            free[j] = None


def _pair_nccl(calls: list[Call], kernels: list) -> None:
    """Each NCCL kernel to the call around the op that launched it."""
    by_event = {id(c.event): c for c in calls}
    for k in kernels:
        e, depth = k.op, 0
        owner = None
        while e is not None and depth < MAX_DEPTH:  # the outermost call above the launch
            owner = by_event.get(id(e), owner)
            e, depth = e.parent, depth + 1
        if owner is not None:
            owner.ran.append(k.event)


def is_wait(e: Event) -> bool:
    """An op that only waits for a collective: functional collectives' wait_tensor, NCCL's record of work.wait()."""
    return e.name in WAIT_OPS or (e.name == RECORD_COMMS and e.args.get("Collective name") == "wait")


def cpu_busy(st: Step) -> dict[tuple, list[tuple[float, float]]]:
    """Per thread, the time an op of the step ran its own code there (merged): an op's span less its children's,
    waits aside. A thread inside wait_tensor waits as surely as one that runs nothing, and so does one whose
    innermost open span is a record_function (FSDP::all_gather waiting for gloo's thread inside an autograd node):
    only an op's own time is busy."""
    per: dict[tuple, list] = {}
    for e in st.spans:
        if e.cat == "cpu_op" and not is_wait(e) and _above(e, is_wait) is None:
            own = intervals.gaps(intervals.merge((c.ts, c.end) for c in e.children), e.ts, e.end) \
                if e.children else [(e.ts, e.end)]
            per.setdefault((e.pid, e.tid), []).extend(own)
    return {t: intervals.merge(v) for t, v in per.items()}


def window(st: Step) -> tuple[float, float]:
    """The step's time: its ProfilerStep span, to the end of its last GPU work where that runs later."""
    return st.span.ts, st.span.ts + st.wall


def _ends(st: Step, gpu: bool, calls: list[Call], unpaired: list[Event]) -> dict[int, float]:
    """id(run event) -> when it ended as far as the trace can tell: its end, cut to the step's end and, on a CPU, to
    the start of the first torch.optim step after its call. gloo's thread writes a span's end once it runs again;
    on a busy CPU that is milliseconds after the exchange ended (past the step, past the optimizer's start), and the
    optimizer reads the gradients the collectives before it made, so they were over by then. A GPU kernel's end is
    the GPU's own clock: kept."""
    lo, hi = window(st)
    opt = [] if gpu else sorted(e.ts for e in st.spans if OPTIMIZER_STEP_RE.match(e.name))
    out = {}
    for ev, since in [(r, c.ts) for c in calls for r in c.ran] + [(s, s.ts) for s in unpaired]:
        cut = next((t for t in opt if t > since), hi)
        out[id(ev)] = max(min(ev.end, cut, hi), min(ev.ts, hi))
    return out


def _waits(calls: list[Call], busy: dict[tuple, list]) -> None:
    """Each call's waits: the time its thread ran no op but waits (gaps of MIN_WAIT_US or more) between the call's
    return and its run's end, each moment given to the earliest call still in flight (the one the thread waits
    for: DDP and FSDP wait for their buckets in order)."""
    taken: dict[tuple, list] = {}
    for c in calls:
        if c.done is None or c.done <= c.event.end:
            continue
        idle = [g for g in intervals.gaps(busy.get(c.thread, []), c.event.end, c.done) if g[1] - g[0] >= MIN_WAIT_US]
        free = intervals.gaps(taken.get(c.thread, []), c.event.end, c.done)
        c.waits = intervals.intersection(idle, free)
        taken[c.thread] = intervals.merge(taken.get(c.thread, []) + c.waits)


@dataclass
class StepWork:
    """One step of one rank, on the trace's own clock: (thread or stream as (pid, tid), start, end) of each unit of
    compute and each collective's run, both cut to the step; its calls; its runs no call was found for."""

    compute: list[tuple[object, float, float]]
    comm: list[tuple[object, float, float]]
    calls: list[Call]
    unpaired: list[Event]
    ends: dict[int, float]  # id(run event) -> its end as cut (see _ends)


def work(st: Step, gpu: bool) -> StepWork:
    """The step's compute, communication and calls (see StepWork). Compute is GPU kernels that are no collective,
    or on a CPU the ops that compute (kernels.cpu_kernels) outside gloo's spans: gloo's own copies and divisions
    inside its span are the collective's work, not compute that could hide it."""
    lo, hi = window(st)
    calls = _calls(st)
    if gpu:
        nccl = [k for k in st.gpu if kind_of(k.name)]
        _pair_nccl(calls, nccl)
        runs = [k.event for k in nccl]
        compute = [((k.event.pid, k.event.tid), k.event.ts, k.event.end) for k in st.gpu if not kind_of(k.name)]
    else:
        runs = [e for e in st.spans if e.cat == "user_annotation" and kind_of(e.name)]
        _pair_gloo(calls, runs)
        compute = [((e.pid, e.tid), e.ts, e.end) for e in cpu_kernels(st)
                   if _above(e, lambda p: GLOO_RE.match(p.name) is not None) is None]
    paired = {id(r) for c in calls for r in c.ran}
    unpaired = [r for r in runs if id(r) not in paired]
    ends = _ends(st, gpu, calls, unpaired)
    for c in calls:
        c.done = max((ends[id(r)] for r in c.ran), default=None)
    if not gpu:  # on a GPU the host goes on after a launch, idle or not: it is the streams that wait
        _waits(calls, cpu_busy(st))
    comm = [((r.pid, r.tid), r.ts, ends[id(r)]) for r in runs]
    return StepWork(_cut(compute, lo, hi), _cut(comm, lo, hi), calls, unpaired, ends)


def _cut(items: list[tuple[object, float, float]], lo: float, hi: float) -> list[tuple[object, float, float]]:
    """(thread, start, end) items cut to [lo, hi]; what lies wholly outside is dropped."""
    return [(t, max(a, lo), min(b, hi)) for t, a, b in items if min(b, hi) > max(a, lo)]


def overlapped(w: StepWork) -> float:
    """Time a collective ran while compute ran on another thread or stream: what hid it. (A thread cannot compute
    and wait for its own collective at once; on a GPU one stream runs one kernel at a time.)"""
    shared = []
    for thread in {t for t, _, _ in w.comm}:
        mine = [(a, b) for t, a, b in w.comm if t == thread]
        others = [(a, b) for t, a, b in w.compute if t != thread]
        shared += intervals.intersection(mine, others)
    return intervals.length(shared)


def blocked(w: StepWork, gpu: bool) -> float | None:
    """Time the step's calling threads sat idle waiting for their collectives (the calls' waits, each moment
    once); None on a GPU, where the host does not wait for them (see step_calls)."""
    return None if gpu else intervals.length(iv for c in w.calls for iv in c.waits)


def step_calls(st: Step, gpu: bool | None = None) -> list[Call]:
    """The collectives the rank's code called in the step, in call order, each with what ran it and its wait.

    For each Call: kind (what was called), name (c10d::allreduce_, ...), ts (the call: when the rank arrived),
    thread (pid, tid) that called it, sizes (elements of its tensors), ran (its gloo span or NCCL kernels; [] where
    the trace holds none: a group of one rank launches no kernel), start (when that run began: ts + the time it
    sat queued on gloo's thread), ran_as (gloo may run a reduce-scatter as an all-reduce), done (the run's end, cut
    to the step and, on a CPU, to the next torch.optim step: see _ends), waits and waited_us: the stretches of at
    least MIN_WAIT_US in which the calling thread ran no op, or only a wait (wait_tensor: is_wait), between the
    call's return and `done`, each moment given to the earliest call still in flight. That is where DDP's
    backward waits for its buckets (after its last bucket's call, in the autograd engine's final callback), FSDP's
    root_post_backward_callback for its reduce-scatters, TP's wait_tensor for its all-reduce: the time a training
    step's phases should show as waiting for communication. On a GPU waits
    stay empty: the host goes on after a launch and the streams wait, so the thread's idle time says nothing of
    communication (there, each collective's kernel waiting for the last rank is ranks' waited_us). gpu: the
    trace's device is "cuda" (None: the step has GPU work)."""
    return work(st, bool(st.gpu) if gpu is None else gpu).calls


@dataclass
class Collective:
    kind: str  # what the rank called: all_reduce, all_gather, reduce_scatter, ... (the run's kind with no call)
    name: str  # the kernel's or gloo span's own name
    start: float  # when it began running: µs on the run's common clock (the trace's baseTimeNanoseconds added)
    end: float  # when it ended (see _ends: a gloo span's end cut to the step and the optimizer's start)
    bytes: int | None  # nccl-tests' size: None where the trace does not say
    called: float | None = None  # when the rank called it, on the same clock; None: no call found
    call: str | None = None  # the call's name (c10d::allreduce_)
    ran_as: str | None = None  # the run's kind (gloo:all_reduce for c10d's _reduce_scatter_base_)


def collectives(w: StepWork, gpu: bool, offset: float, world: int, st: Step) -> list[Collective]:
    """The step's collectives that ran, in call order (start order where there is no call): one per NCCL kernel or
    gloo span, with its call where one was found."""
    kernels = {id(k.event): k for k in st.gpu} if gpu else {}
    rows = []
    for c in w.calls:
        for r in c.ran:
            rows.append((c.ts, r, c))
    rows += [(r.ts, r, None) for r in w.unpaired]
    out = []
    for order, r, c in sorted(rows, key=lambda x: (x[0], x[1].ts)):
        ran_as = kind_of(r.name)
        k = kernels.get(id(r))
        ops = [k.op] if k is not None and k.op is not None else []
        if c is not None:
            ops.append(c.event)
        out.append(Collective(c.kind if c else ran_as, r.name, r.ts + offset, w.ends[id(r)] + offset,
                              _size(ran_as, _with_size(r, ops), world), None if c is None else c.ts + offset,
                              None if c is None else c.name, ran_as))
    return out


def step_work(st: Step, gpu: bool, offset: float, world: int) -> tuple[list, list, list[Collective]]:
    """(compute intervals, communication intervals, collectives in call order) of one step on one rank: the
    intervals on the trace's own clock and cut to the step (see work), the collectives on the run's clock (+ offset)."""
    w = work(st, gpu)
    return ([(a, b) for _, a, b in w.compute], [(a, b) for _, a, b in w.comm],
            collectives(w, gpu, offset, world, st))


def backend_of(info) -> str | None:
    """distributedInfo's process-group backend ("nccl", "gloo", "cpu:gloo,cuda:nccl"), a short string or None: the
    trace's word, untrusted (a list or an object there is no backend)."""
    backend = info.get("backend") if isinstance(info, dict) else None
    return backend[:64] if isinstance(backend, str) else None
