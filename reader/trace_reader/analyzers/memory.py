"""Memory in a trace: each step's peak allocation, and how fast a step's kernels stream their bytes.

A run profiled with `profile_memory=True` carries one instant event per allocation and free:

    {"ph": "i", "name": "[memory]", "ts": ..., "args": {"Bytes": 1048576, "Total Allocated": 2097152,
     "Device Type": 1, "Device Id": 0, ...}}

("Bytes" < 0 is a free; "Total Allocated" is the allocator's running total after it; Device Type 0 is the
CPU, 1 CUDA.) A step's peak is the highest running total inside its ProfilerStep span, less the total just
before the step's first event: what the step itself allocated at its worst moment, weights and inputs
excluded. The events are those the Trace kept when its file was read (Trace.memory_events); each field is checked,
and an event with odd types is skipped, never trusted.

Whether a step allocates a given tensor (attention's score matrix) is asked of the allocations themselves, not of
the peak: the peak also holds every other live tensor. "Addr" pairs an allocation with its free, and the CPU span
around it on its thread says which op made it.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from ..expectation import Expect, NotApplicable, need_steps
from ..facts.kernels import BOOKKEEPING_OPS
from ..facts.peaks import device_peak
from ..reading.events import COMPILED_REGION, Event, Step, Trace, once_per_trace

DEVICE_TYPE = {"cpu": 0, "cuda": 1}  # c10::DeviceType


@dataclass(frozen=True)
class Alloc:
    ts: float
    nbytes: float  # > 0 allocated, < 0 freed
    total: float  # the allocator's running total after this event
    device: tuple[int, int]  # (device type, device id)
    addr: int | None = None  # the block's address: pairs an allocation with its free (None: not recorded)
    thread: tuple = (None, None)  # (pid, tid) of the CPU thread that asked for it


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # a 400-digit integer is valid JSON
        return None
    return value if math.isfinite(value) else None


def read_allocs(trace: Trace) -> tuple[Alloc, ...]:
    """The trace's "[memory]" events, in time order; events with odd fields are skipped."""
    allocs = []
    for ev in trace.memory_events:  # no more of them than the file has events
        args = ev.args
        if not isinstance(args, dict):
            continue
        ts, nbytes, total = _number(ev.ts), _number(args.get("Bytes")), _number(args.get("Total Allocated"))
        dtype, did, addr = args.get("Device Type"), args.get("Device Id", 0), args.get("Addr")
        if None in (ts, nbytes, total) or type(dtype) is not int or type(did) is not int:
            continue
        thread = tuple(x if isinstance(x, (int, str)) else None for x in (ev.pid, ev.tid))
        allocs.append(Alloc(ts, nbytes, total, (dtype, did), addr if type(addr) is int else None, thread))
    allocs.sort(key=lambda a: a.ts)
    return tuple(allocs)


read_allocs = once_per_trace(read_allocs)  # not as a decorator: mutmut leaves decorated functions unmutated


def device_allocs(trace: Trace) -> list[Alloc]:
    """The trace's "[memory]" events on its own device (a CPU trace's on the CPU, a GPU trace's on the GPU)."""
    want = DEVICE_TYPE[trace.device]
    return [a for a in read_allocs(trace) if a.device[0] == want]


def step_peaks(trace: Trace) -> dict[int, float] | None:
    """{ProfilerStep number: peak bytes allocated above the step's start} on the trace's device;
    None when the trace has no memory events for that device (profiled without profile_memory=True)."""
    allocs = device_allocs(trace)
    if not allocs:
        return None
    times = [a.ts for a in allocs]
    peaks = {}
    for st in trace.steps:
        inside = allocs[bisect.bisect_left(times, st.span.ts):bisect.bisect_right(times, st.span.end)]
        base: dict = {}  # one running total per device: each one's before its first event in the step
        peak = 0.0
        for a in inside:
            if a.device not in base:
                base[a.device] = a.total - a.nbytes
            peak = max(peak, a.total - base[a.device])
        peaks[st.number] = peak
    return peaks


def fmt_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def describe_peaks(trace: Trace, reference_bytes: float | None = None, what: str = "") -> str:
    """One line: each step's peak allocation, optionally against a tensor's size (`what`)."""
    peaks = step_peaks(trace)
    if peaks is None:
        return f"peak allocation per step: no [memory] events for the {trace.device} (profile_memory=False?)"
    line = "peak allocation per step, above the step's start: " + ", ".join(
        f"#{n} {fmt_size(p)}" for n, p in sorted(peaks.items()))
    if reference_bytes:
        line += f" ({what or 'reference'}: {fmt_size(reference_bytes)})"
    return line


# The CUDA caching allocator reports the block it hands out: the request rounded up to 512 B, and, from its large
# pool (requests over 1 MiB), a cached block up to 1 MiB bigger that it did not split (CUDACachingAllocator.cpp).
ROUND_BYTES, LARGE_POOL_BYTES, UNSPLIT_SLACK = 512, 1 << 20, 1 << 20


def largest_block(nbytes: float, device: str) -> float:
    """The largest allocation the trace may show for a request of `nbytes` (the CPU's allocator reports it as is)."""
    if device != "cuda":
        return nbytes
    rounded = math.ceil(nbytes / ROUND_BYTES) * ROUND_BYTES
    return rounded + (UNSPLIT_SLACK if rounded > LARGE_POOL_BYTES else 0)


def _maker(step: Step, a: Alloc) -> Event | None:
    """The op that made the allocation: the innermost span around it on its thread that is an aten op computing
    something (not aten::empty and kin, which only ask the allocator) or a compiled region (Inductor's graph is one
    op: its buffers are its own). None outside any."""
    around = [e for e in step.spans if (e.pid, e.tid) == a.thread and e.ts <= a.ts <= e.end]
    node = max(around, key=lambda e: (e.ts, -e.dur), default=None)  # nested spans: the innermost starts last
    while node is not None and not (node.cat == "cpu_op" and (node.name.startswith(COMPILED_REGION) or (
            node.name.startswith("aten::") and node.name not in BOOKKEEPING_OPS))):
        node = node.parent
    return node


def temporaries(trace: Trace, min_bytes: float, between_ops: bool = True) -> dict[int, list | None] | None:
    """{ProfilerStep number: [(bytes, the op that made it)]} for each allocation of >= min_bytes on the trace's
    device that lives and dies in the step (the step's output and blocks kept across steps, such as cuBLAS's
    workspace, are not temporaries). between_ops: only those still alive after the op that made them returned,
    passed from one op to the next as a materialised score matrix is; not a kernel's own scratch, freed before its
    op returns (flash's split-KV accumulators, cuDNN's workspace, the CPU flash kernel's per-thread buffers, a
    compiled region's buffers). Without "Addr" an allocation cannot be paired with its free and counts. A step with
    no allocation at all maps to None; the whole answer is None when the trace has no memory events for its device."""
    allocs = device_allocs(trace)
    if not allocs:
        return None
    frees: dict[tuple, list[float]] = {}
    for a in allocs:
        if a.nbytes < 0 and a.addr is not None:
            frees.setdefault((a.device, a.addr), []).append(a.ts)  # allocs is in time order
    times = [a.ts for a in allocs]
    out: dict[int, list | None] = {}
    for st in trace.steps:
        inside = allocs[bisect.bisect_left(times, st.span.ts):bisect.bisect_right(times, st.span.end)]
        if not any(a.nbytes > 0 for a in inside):
            out[st.number] = None  # a step that allocated nothing at all is no evidence either way
            continue
        found = []
        for a in inside:
            if a.nbytes < min_bytes:
                continue
            maker = _maker(st, a)
            if a.addr is not None:
                later = frees.get((a.device, a.addr), [])
                i = bisect.bisect_right(later, a.ts)
                freed = later[i] if i < len(later) else None
                if freed is None or freed > st.span.end:
                    continue  # kept past the step
                if between_ops and maker is not None and freed <= maker.end:
                    continue  # the op's own scratch
            found.append((a.nbytes, maker.name if maker is not None else "no op"))
        out[st.number] = found
    return out


def allocates(nbytes: float, what: str, present: bool = True, others: tuple[float, str] = (0.0, "")) -> Expect:
    """Does every step allocate a temporary of `nbytes` (present), or does no step pass one from an op to the next
    (not present; see temporaries)? `others` is the largest other temporary the step makes (bytes, what it is).
    Where that can show as big, only an allocation bigger than it still tells: without one the answer is "not
    applicable"; no allocation of `nbytes` or more at all is an answer either way."""
    other_bytes, other_what = others

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        found = temporaries(t, nbytes, between_ops=not present)
        if found is None:
            return f"no [memory] events for the {t.device}: profile with profile_memory=True"
        if (empty := [n for n, f in found.items() if f is None]):
            return NotApplicable(f"ProfilerStep#{empty[0]} has no [memory] event for the {t.device}: nothing to look at")
        seen = "; ".join(f"#{n} " + (f"{len(f)}: " + ", ".join(f"{fmt_size(b)} from {op}" for b, op in f[:2])
                                     + (", ..." if len(f) > 2 else "") if f else "none")
                         for n, f in sorted(found.items()))
        kind = "temporaries" if present else "allocations passed between ops"
        seen = f"{kind} of >= {fmt_size(nbytes)} per step: {seen}"
        other = largest_block(other_bytes, t.device)
        have = [bool(f) for f in found.values()]  # at least nbytes
        bigger = [any(b > other for b, _ in f) for f in found.values()]  # ... and more than any other tensor
        unclear = NotApplicable(f"{other_what} ({fmt_size(other_bytes)}) can show as big as {what}, and nothing bigger "
                                f"{'was allocated' if present else 'passed between ops'}: an allocation's size cannot "
                                "tell them apart at this shape")
        if present:
            return True if all(bigger) else unclear if all(have) and other >= nbytes else seen
        return True if not any(have) else seen if any(bigger) else unclear
    text = (f"allocates {what} ({fmt_size(nbytes)}): a temporary of at least that size in every step" if present else
            f"never allocates {what} ({fmt_size(nbytes)}): no allocation of that size passes between ops in any step")
    return Expect(text, run)


# A kernel's fixed cost (its start, the first loads' latency, the drain) is a few µs: data that the datasheet's
# bandwidth moves in less than this cannot show the bandwidth (on the H200, an 8 MiB KV cache, 1.7 µs at 4.8 TB/s,
# took about 13 µs).
MIN_STREAM_US = 5.0


def streams(pattern: str, nbytes: float, what: str, at_least: float = 0.5) -> Expect:
    """Memory-bound and at speed: the kernels matching `pattern` move `nbytes` per step at
    >= `at_least` of the device's datasheet bandwidth (GB/s = bytes / their summed time). Not applicable where
    the datasheet's bandwidth would move nbytes in under MIN_STREAM_US."""
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        peak = device_peak(t.device_name)
        if peak is None or not peak.gbs:
            return f"no datasheet bandwidth for {t.device_name!r}"
        if (ideal_us := nbytes / peak.gbs / 1e3) < MIN_STREAM_US:
            return NotApplicable(f"{fmt_size(nbytes)} takes {ideal_us:.1f} µs at the datasheet's {peak.gbs:.0f} GB/s, "
                                 f"under the {MIN_STREAM_US:g} µs a kernel's start and drain cost: too little to "
                                 "stream at speed")
        rates = []
        for st in t.steps:
            us = sum(k.dur for k in st.kernels if rx.search(k.name))
            if us <= 0:
                return f"ProfilerStep#{st.number} has no kernel matching /{pattern}/"
            rates.append(nbytes / us / 1e3)  # bytes per µs -> GB/s
        seen = ", ".join(f"{r:.0f}" for r in rates)
        ok = all(r >= at_least * peak.gbs for r in rates)
        return True if ok else f"{seen} GB/s per step, of {peak.gbs:.0f} GB/s ({peak.source})"
    return Expect(f"memory-bound: the /{pattern}/ kernels read {what} ({fmt_size(nbytes)}) at >= {at_least:.0%} of "
                  "the device's datasheet bandwidth", run, "cuda")
