"""A trace's events as the reader holds them: Event (a CPU span, a runtime call, GPU work), Kernel (GPU work tied
to the call that launched it), Step (one ProfilerStep#N and what ran in it), Trace; the event categories and names
the reader keys on; TraceError, the one error bad input raises."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass, field
from operator import attrgetter

DUR = attrgetter("dur")


CPU_SPAN_CATS = {"cpu_op", "user_annotation"}


LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


STEP_RE = re.compile(r"^ProfilerStep#([0-9]+)$")  # ASCII digits: int() reads others too


# The autograd engine runs each backward node as one of these, on its own thread on a GPU.
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


BACKWARD_RE = re.compile("^" + re.escape(BACKWARD_PREFIX))


WHOLE_TRACE = "(the whole trace: no ProfilerStep#N spans)"  # the one step of a trace recorded without steps


OCCUPANCY = "cudaOccupancyMaxActiveBlocksPerMultiprocessor"


MAX_US = 1e11  # a timestamp or duration beyond ~28 hours (in µs) is not a profile of a step


MAX_TS = 1e17  # absolute timestamps are µs since 1970 (~1.8e15)


def plural(n: int, noun: str) -> str:
    """'1 layer', '2 layers'; '1 unit of work', '2 units of work': the first word of `noun` (singular) takes the s."""
    first, space, rest = noun.partition(" ")
    return f"{n} {first}{'' if n == 1 else 's'}{space}{rest}"


class TraceError(Exception):
    """Bad input: the message is one line, meant for the reader."""


class EventMethods:
    """What both kinds of event share: Event, made from a dict, and fast_json.DecodedEvent, decoded by msgspec."""

    __slots__ = ()

    @property
    def self_time(self) -> float:
        """dur less the child spans' (no sum over nothing: most spans of a long trace have no children)."""
        return self.dur - sum(map(DUR, self.children)) if self.children else self.dur

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {self.cat}, ts={self.ts}, dur={self.dur})"


class Event(EventMethods):
    """One complete ("ph": "X") event; spans also get their place in the CPU call tree."""

    __slots__ = ("name", "cat", "ts", "dur", "end", "pid", "tid", "args", "ext", "corr", "parent", "children",
                 "calls", "kernels", "step")

    def __init__(self, raw: dict):
        name = raw.get("name", "")
        self.name = name if type(name) is str else str(name)
        self.cat = raw.get("cat", "")
        self.ts = ts = float(raw["ts"])
        self.dur = dur = float(raw.get("dur") or 0.0)
        if not _usable(ts, dur):
            raise ValueError(f"time out of range: ts={ts}, dur={dur}")
        self.end = self.ts + self.dur
        self.pid = raw.get("pid")
        self.tid = raw.get("tid")
        args = raw.get("args")
        self.args = args = args if isinstance(args, dict) else {}
        self.ext, self.corr = args.get("External id"), args.get("correlation")  # the links parse_trace follows
        self.parent: Event | None = None
        # A list from the first one added (most events have none: 3 lists each would be 10^5-10^6 lists).
        self.children: list[Event] | tuple = ()
        self.calls: list[Event] | tuple = ()  # runtime/driver calls made directly inside this op
        self.kernels: list[Kernel] | tuple = ()  # GPU work launched directly inside this op
        self.step: Step | None = None


def _usable(ts: float, dur: float) -> bool:
    return -MAX_TS <= ts <= MAX_TS and 0.0 <= dur <= MAX_US  # NaN fails every comparison


@dataclass(init=False, slots=True)
class Kernel:
    """GPU work (kernel, memcpy, memset) tied back to the CPU call that launched it."""

    event: Event
    launch: Event | None  # the cudaLaunchKernel / cuLaunchKernel call, via "correlation"
    op: Event | None  # the innermost CPU op or record_function span around the launch
    occupancy_query: bool  # cudaOccupancyMaxActiveBlocksPerMultiprocessor in the same op before this launch
    # The event's, copied once: read for every kernel in every pass of the report.
    name: str = field(repr=False, compare=False)
    dur: float = field(repr=False, compare=False)
    is_kernel: bool = field(repr=False, compare=False)
    order: float = field(repr=False, compare=False)  # when the CPU asked for it: its launch, else its start

    def __init__(self, event: Event, launch: Event | None, op: Event | None, occupancy_query: bool):
        self.event, self.launch, self.op, self.occupancy_query = event, launch, op, occupancy_query
        self.name, self.dur, self.is_kernel = event.name, event.dur, event.cat == "kernel"
        self.order = launch.ts if launch is not None else event.ts


@dataclass
class Step:
    """One active ProfilerStep#k: its CPU span, the CPU spans inside it, the GPU work it launched."""

    number: int
    span: Event
    spans: list[Event] = field(default_factory=list)  # cpu_op / user_annotation inside, in time order
    gpu: list[Kernel] = field(default_factory=list)  # in launch order

    @property
    def kernels(self) -> list[Kernel]:
        return [k for k in self.gpu if k.is_kernel]

    @property
    def cpu_time(self) -> float:
        return self.span.dur

    @property
    def gpu_busy(self) -> float:
        """Union of the GPU work intervals: overlapping streams count once."""
        busy, cur_start, cur_end = 0.0, None, None
        for start, end in sorted((k.event.ts, k.event.end) for k in self.gpu):
            if cur_end is None or start > cur_end:
                if cur_end is not None:
                    busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        return busy + (cur_end - cur_start if cur_end is not None else 0.0)

    def lags(self) -> list[float]:
        """Launch to start (µs) of each GPU work item with a linked launch call: how far the GPU runs behind
        the CPU. Near the launch latency (~5-20 µs) when the GPU is waiting for work; growing when it is queued."""
        return [k.event.ts - k.launch.ts for k in self.gpu if k.launch is not None]

    @property
    def wall(self) -> float:
        """From the step's start until both the CPU span and its last GPU work have ended."""
        end = max([self.span.end] + [k.event.end for k in self.gpu])
        return end - self.span.ts

    def ops(self, names: set[str] | None = None) -> list[Event]:
        return [e for e in self.spans if e.cat == "cpu_op" and (names is None or e.name in names)]


@dataclass
class Trace:
    path: str
    meta: dict  # top-level keys other than traceEvents
    steps: list[Step]
    device_props: list[dict]
    has_gpu_work: bool
    skipped: int = 0  # events dropped for unusable times (NaN, negative, absurd)
    kernel_sources: dict[str, str] = field(default_factory=dict)  # Inductor source files, read on request only
    has_memory_events: bool = False  # "[memory]" events: profiled with profile_memory=True (see memory.py)
    whole: bool = False  # no ProfilerStep#N spans: steps is one step spanning the whole trace (WHOLE_TRACE)
    # What the call tree leaves out and the training and memory readers need, gathered in the same pass
    # (tree.Side): each fwdbwd flow end as (id, "s" | "f", pid, tid, ts), and the "[memory]" instant events
    # (ts, pid, tid and args as attributes; the args unchecked).
    flow_ends: tuple = field(default=(), repr=False, compare=False)
    memory_events: tuple = field(default=(), repr=False, compare=False)

    @property
    def device(self) -> str:
        """'cuda' when the trace holds GPU activity or launch calls, else 'cpu'.

        deviceProperties alone is not enough: a CPU-only profile on a GPU machine lists the GPU too.
        """
        return "cuda" if self.has_gpu_work else "cpu"

    @property
    def device_name(self) -> str | None:
        name = self.device_props[0].get("name") if self.device_props else None
        return name if isinstance(name, str) and 0 < len(name) <= 200 else None  # a name, not a payload


_ONCE = itertools.count()


def once_per_trace(fn):
    """fn(trace), worked out once per Trace object and kept beside its fields (not compared, not printed, not carried
    by dataclasses.replace): for what several readers of one trace ask for and none changes."""
    attr = f"_once_{next(_ONCE)}_{fn.__name__}"  # one key per wrapped function, whatever its name

    @functools.wraps(fn)
    def once(trace: Trace):
        memo = vars(trace)
        if attr not in memo:
            memo[attr] = fn(trace)
        return memo[attr]
    return once


def real_steps(trace: Trace) -> Trace:
    """The trace with only its ProfilerStep#N steps: what per-step expectations may count (none in a whole trace)."""
    return dataclasses.replace(trace, steps=[]) if trace.whole else trace


COMPILED_REGION = "Torch-Compiled Region"  # the CPU span around a torch.compile'd call: "Torch-Compiled Region: 0/0"
