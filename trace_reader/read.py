"""Reading a trace: the JSON (or gzip) file into Steps of CPU spans and the GPU work they launched."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import gc
import gzip
import json
import math
import os
import re
import stat
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path


CPU_SPAN_CATS = {"cpu_op", "user_annotation"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP_RE = re.compile(r"^ProfilerStep#([0-9]+)$")  # ASCII digits: int() reads others too
# The autograd engine runs each backward node as one of these, on its own thread on a GPU.
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
BACKWARD_RE = re.compile("^" + re.escape(BACKWARD_PREFIX))
WHOLE_TRACE = "(the whole trace: no ProfilerStep#N spans)"  # the one step of a trace recorded without steps
OCCUPANCY = "cudaOccupancyMaxActiveBlocksPerMultiprocessor"
_TS, _DUR, _THREAD, _ORDER = attrgetter("ts"), attrgetter("dur"), attrgetter("pid", "tid"), attrgetter("order")

# A trace is untrusted input. What it may cost to read is bounded here, well above any real trace
# (the 35 MB, 600-step traces this suite was tried on are ~3% of it): past a limit, one line, nothing more.
MAX_JSON_BYTES = 1 << 30  # JSON text, after gzip
# ...and in objects: each event becomes a Python object of ~200 B, so that 100 MB of `{},` (33M events) took 6.6 GB.
# Real traces hold one `{` per 102-208 B of JSON (events and their args, the traces in tests/data): 2^24 is a 1 GiB trace at 64 B per object.
MAX_JSON_OBJECTS = 1 << 24
MAX_US = 1e11  # a timestamp or duration beyond ~28 hours (in µs) is not a profile of a step
MAX_TS = 1e17  # absolute timestamps are µs since 1970 (~1.8e15)
# Inductor's kernel sources are read only on request (--kernel-files), and then: regular files, this small,
# this long in all.
MAX_KERNEL_FILE_BYTES = 1 << 20
KERNEL_FILES_SECONDS = 2.0
_CHUNK = 1 << 20


def plural(n: int, noun: str) -> str:
    """'1 layer', '2 layers'; '1 unit of work', '2 units of work': the first word of `noun` (singular) takes the s."""
    first, space, rest = noun.partition(" ")
    return f"{n} {first}{'' if n == 1 else 's'}{space}{rest}"


class TraceError(Exception):
    """Bad input: the message is one line, meant for the reader."""


class _EventMethods:
    """What both kinds of event share: Event, made from a dict, and fast_json.DecodedEvent, decoded by msgspec."""

    __slots__ = ()

    @property
    def self_time(self) -> float:
        """dur less the child spans' (no sum over nothing: most spans of a long trace have no children)."""
        return self.dur - sum(map(_DUR, self.children)) if self.children else self.dur

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {self.cat}, ts={self.ts}, dur={self.dur})"


class Event(_EventMethods):
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


def real_steps(trace: Trace) -> Trace:
    """The trace with only its ProfilerStep#N steps: what per-step expectations may count (none in a whole trace)."""
    return dataclasses.replace(trace, steps=[]) if trace.whole else trace


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _read_capped(p: Path, max_bytes: int) -> bytes:
    """The file's JSON text (gunzipped whatever its name), at most max_bytes of it; streamed, so a gzip bomb
    costs no more memory than the cap. A trace is a JSON object: anything else is refused at its first byte."""
    with open(p, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise TraceError(f"{p}: not a regular file")
        zipped = f.read(2) == b"\x1f\x8b"  # gzip magic
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        if not zipped and size > max_bytes:
            raise TraceError(f"{p}: larger than {_size(max_bytes)}, the reader's limit for one trace")
        src = gzip.GzipFile(fileobj=f) if zipped else f
        # A plain file, its size known and capped, is read in one piece: nothing to join (87 MB: 0.28 -> 0.15 s).
        piece = _CHUNK if zipped else size + 1
        parts, total, started = [], 0, False
        while chunk := src.read(piece):
            total += len(chunk)
            if total > max_bytes:
                raise TraceError(f"{p}: more than {_size(max_bytes)} of JSON{' once decompressed' if zipped else ''}"
                                 " (the reader's limit for one trace; a gzip bomb?)")
            if not started:  # leading whitespace is not kept: a gzip of blanks costs nothing
                chunk = chunk.lstrip()
                if not chunk:
                    continue
                if chunk[:1] != b"{":
                    raise TraceError(f"{p}: not a torch.profiler trace (a JSON object starts with '{{', "
                                     f"this starts with {chunk[:8]!r})")
                started = True
            parts.append(chunk)
    if not parts:
        raise TraceError(f"{p}: empty file" + (" (only whitespace)" if total else ""))
    return b"".join(parts)


@functools.cache
def _fast():
    """The module fast_json (msgspec's decoders) where msgspec is installed and refuses deep nesting (a decoder
    that recursed without limit would crash the process on a deeply nested file, as orjson 3.13.0 did); else None.
    Only a speed-up: the stdlib decodes everything without it."""
    try:
        from . import fast_json
    except ImportError:
        return None
    try:
        fast_json.decode(b"[" * 2048 + b"]" * 2048)
    except fast_json.refused:
        return fast_json
    return None


def _args_of(raw) -> dict:
    """A decoded event's args, from their raw JSON ({} where they are not an object). msgspec checked that JSON
    while skipping it, without decoding it: what msgspec cannot decode (an integer beyond 64 bits, 1e400) the
    stdlib does. Where the stdlib cannot either (an integer of more than 4300 digits): {} (the one difference from
    the stdlib alone, which refuses the whole file)."""
    if raw is None:
        return {}
    try:
        args = _loads(bytes(raw))
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}


def _loads(text: bytes) -> object:
    """The JSON value of text, by msgspec where usable (see _fast). What msgspec refuses goes to the stdlib
    decoder, which then accepts it (NaN, Infinity, 1e400, integers beyond 64 bits, lone surrogates, UTF-16) or
    words the error as it always has."""
    fast = _fast()
    if fast is not None:
        try:
            return fast.decode(text)
        except fast.refused:
            pass
    return json.loads(text)


def _fast_events(text: bytes) -> tuple[dict, list, object] | None:
    """(the top-level keys but traceEvents, decoded; the events, as msgspec's structs; the fast_json.Source of
    their args) of a trace's JSON; None where msgspec is not in use or refuses any of it (then the stdlib reads it
    all, or says why it cannot). What the reader does not use is checked as JSON but not decoded: an integer of
    more than 4300 digits there does not refuse the file as the stdlib does (see _args_of)."""
    fast = _fast()
    if fast is None:
        return None
    try:
        if not text.isascii():
            text.decode()  # msgspec checks the UTF-8 of what it decodes, not of the args it skips
        top, raw = _split(text, fast)
        if raw is None:
            return None
        try:
            events = fast.events(raw)
        except fast.refused:
            if not isinstance(raw, memoryview):  # the file's own events: msgspec refuses them
                raise
            top = fast.top(text)  # a wrong guess (see _split): the long way (the guess saw the key: it is there)
            events = fast.events(raw := top.pop("traceEvents"))
        return {k: fast.decode(v) for k, v in top.items()}, events, fast.Source(events, raw)
    except (*fast.refused, UnicodeDecodeError):
        return None


_HOLE = b'"(trace_reader: the traceEvents list was here)"'


def _split(text: bytes, fast) -> tuple[dict, object]:
    """(the top-level keys but traceEvents, as raw JSON; the JSON of traceEvents' value, None if there is none).

    Cheap: the events are nearly all of the file, and finding their end by decoding skips through all of them (0.17
    s of 87 MB). A torch trace has a few small keys around them, so their value is guessed as the span from the
    first "[" after the first '"traceEvents"' to one of the file's last "]" (a memoryview), and the rest, with a
    hole where the span was, is decoded alone. It must be a JSON object whose traceEvents (the last of that key,
    as a decoder keeps) is the hole: the text before the span is the same in both, so the span begins where the
    top-level traceEvents' value begins. A "]" inside a string of the last keys cannot pass (the quotes after it
    pair up wrongly); one of a list there can, and then the events decoder, which takes only one whole JSON value,
    refuses the span and _fast_events reads the file the long way, as it does when no guess passes."""
    key = text.find(b'"traceEvents"')
    start = text.find(b"[", key) if key >= 0 else -1
    end = len(text)
    for _ in range(3 if start >= 0 else 0):
        end = text.rfind(b"]", start, end)
        if end < 0:
            break
        rest = text[:start] + _HOLE + text[end + 1:]
        try:
            top = fast.top(rest)
        except fast.refused:
            continue
        hole = top.pop("traceEvents", None)
        if hole is not None and bytes(hole) == _HOLE and rest.count(_HOLE) == 1:
            return top, memoryview(text)[start:end + 1]
    top = fast.top(text)
    return top, top.pop("traceEvents", None)


@contextlib.contextmanager
def _reading(p: Path):
    """Reading and decoding a trace file: what can go wrong, each in one line."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{p}: cannot read ({e.__class__.__name__}: {e}); truncated or not gzip?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not text JSON (binary content)") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{p}: not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}); truncated file?") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits (4300)
        raise TraceError(f"{p}: not valid JSON ({str(e).split(':')[0]})") from None
    except RecursionError:
        raise TraceError(f"{p}: JSON nested too deeply to be a trace") from None
    except MemoryError:
        raise TraceError(f"{p}: out of memory while parsing the JSON") from None


def _read_text(path: str | Path, max_bytes: int | None = None) -> bytes:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if not p.is_file():
        raise TraceError(f"{p}: not a file")
    with _reading(p):
        text = _read_capped(p, MAX_JSON_BYTES if max_bytes is None else max_bytes)
    if (objects := text.count(b"{")) > MAX_JSON_OBJECTS:  # an upper bound (a brace in a string counts too), in C
        raise TraceError(f"{p}: {objects:,} JSON objects in {len(text):,} bytes, past this reader's limit of "
                         f"{MAX_JSON_OBJECTS:,} (a real trace holds one per 100-200 bytes): not read")
    return text


def _decode(text: bytes, path: str | Path) -> object:
    with _reading(Path(path)):
        return _loads(text)


def _read_json(path: str | Path) -> dict:
    return _decode(_read_text(path), path)


@functools.lru_cache(maxsize=2)
def side_events(path: str, mtime_ns: int, size: int) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """(fwdbwd flow ends, "[memory]" events) of a trace file, raw: the events parse_trace leaves out that the
    training and memory readers need, taken in one read of the file per version (mtime and size are the key)."""
    data = _read_json(path)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    flows, memory = [], []
    for raw in events if isinstance(events, list) else []:
        if not isinstance(raw, dict):
            continue
        if raw.get("cat") == "fwdbwd" and raw.get("ph") in ("s", "f"):
            flows.append(raw)
        elif raw.get("name") == "[memory]" and raw.get("ph") in ("i", "I"):
            memory.append(raw)
    return tuple(flows), tuple(memory)


@contextlib.contextmanager
def _no_gc():
    """A trace is 10^5-10^6 small objects: the cyclic GC would rescan them again and again while we work.

    On the way out they go straight to the oldest generation (freeze, then unfreeze: a list splice), so the
    collector's next young pass does not scan them all either; a full collection still frees them when due."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def load_trace(path: str | Path, require_steps: bool = True, kernel_files: bool = False,
               max_bytes: int | None = None) -> Trace:
    """Read a Chrome trace exported by torch.profiler (.json or .json.gz). Raises TraceError on bad input.

    A trace recorded without prof.step() (no ProfilerStep#N spans) is read as one step spanning all of it
    (Trace.whole); require_steps refuses a trace with nothing to read at all.
    kernel_files: also read the Inductor kernel sources the trace names (bounded; see read_kernel_sources).
    Off by default: a trace is untrusted input and must not make the reader open other files.
    """
    with _no_gc():
        text = _read_text(path, max_bytes)
        try:
            trace = _parse_fast(text, str(path))
            if trace is None:
                trace = parse_trace(_decode(text, path), str(path))
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # odd types where a trace has numbers
            raise TraceError(f"{path}: malformed trace ({type(e).__name__}: {e})") from None
    if require_steps and not trace.steps:
        raise TraceError(f"{path}: no CPU ops, runtime calls or GPU work in the trace: nothing to read")
    if kernel_files:
        trace.kernel_sources = read_kernel_sources(trace)
    return trace


def read_kernel_sources(trace: Trace) -> dict[str, str]:
    """{path: text} of the Inductor kernel files the trace's ops name ("kernel_file"), where each is a regular
    file of at most MAX_KERNEL_FILE_BYTES on this machine, within KERNEL_FILES_SECONDS in all; others are left out."""
    paths = {e.args["kernel_file"] for st in trace.steps for e in st.spans
             if isinstance(e.args.get("kernel_file"), str) and e.args["kernel_file"]}
    out: dict[str, str] = {}
    deadline = time.monotonic() + KERNEL_FILES_SECONDS
    for path in sorted(paths):
        if time.monotonic() > deadline:
            break
        try:  # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (OSError, ValueError):
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_KERNEL_FILE_BYTES:
                out[path] = os.read(fd, MAX_KERNEL_FILE_BYTES).decode()
        except (OSError, UnicodeDecodeError):
            pass
        finally:
            os.close(fd)
    return out


def parse_trace(data: object, path: str = "<trace>") -> Trace:
    """Build the Trace from the loaded JSON object (see load_trace)."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON, but not a torch.profiler trace (no 'traceEvents' list)")
    spans, calls, gpu, into = _event_lists()
    skipped, memory = 0, False
    for raw in data["traceEvents"]:
        if not isinstance(raw, dict):
            continue
        out = into.get(raw.get("cat")) if raw.get("ph") == "X" else None  # any "cat" of another phase is let be
        if out is None:
            memory = memory or raw.get("name") == "[memory]"
            continue
        try:
            out.append(Event(raw))
        except (KeyError, TypeError, ValueError):
            skipped += 1  # no usable timestamp or duration (missing, NaN, negative, absurd): cannot be placed
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return _assemble(spans, calls, gpu, skipped, memory, meta, path)


def _parse_fast(text: bytes, path: str) -> Trace | None:
    """The Trace of a trace's JSON text, decoded by msgspec (see fast_json); None where msgspec is not in use or
    refuses any of it."""
    decoded = _fast_events(text)
    if decoded is None:
        return None
    meta, events, source = decoded
    spans, calls, gpu, into = _event_lists()
    skipped, memory, sort = 0, False, into.get
    for i, e in enumerate(events):  # as parse_trace does with each dict, and Event.__init__ with what it keeps
        if e.ph != "X" or (out := sort(e.cat)) is None:
            memory = memory or e.name == "[memory]"
            events[i] = None  # not the reader's: freed now, not held for the args pass (see fast_json.Source)
            continue
        ts = e.ts  # in range, or msgspec refused it (fast_json.DecodedEvent): then the stdlib skips the event
        if ts is None:
            skipped += 1
            events[i] = None
            continue
        e.dur = dur = e.dur or 0.0
        e.end, e.source = ts + dur, source
        if (links := e.links) is not None:
            e.ext, e.corr = links.ext, links.corr
        out.append(e)
    return _assemble(spans, calls, gpu, skipped, memory, meta, path)


def _event_lists() -> tuple[list, list, list, dict]:
    """(CPU spans, runtime calls, GPU work): empty, and each category the reader uses -> the list its events go to."""
    spans: list[Event] = []
    calls: list[Event] = []
    gpu: list[Event] = []
    into = dict.fromkeys(CPU_SPAN_CATS, spans) | dict.fromkeys(LAUNCH_CATS, calls) | dict.fromkeys(GPU_CATS, gpu)
    return spans, calls, gpu, into


def _assemble(spans: list[Event], calls: list[Event], gpu: list[Event], skipped: int, memory: bool, meta: dict,
              path: str) -> Trace:
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
    return Trace(path, meta, steps, props, has_gpu_work, skipped, has_memory_events=memory, whole=whole)


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
