"""Memory in a trace: each step's peak allocation, and how fast a step's kernels stream their bytes.

A run profiled with `profile_memory=True` carries one instant event per allocation and free:

    {"ph": "i", "name": "[memory]", "ts": ..., "args": {"Bytes": 1048576, "Total Allocated": 2097152,
     "Device Type": 1, "Device Id": 0, ...}}

("Bytes" < 0 is a free; "Total Allocated" is the allocator's running total after it; Device Type 0 is the
CPU, 1 CUDA.) A step's peak is the highest running total inside its ProfilerStep span, less the total just
before the step's first event: what the step itself allocated at its worst moment, weights and inputs
excluded. The events are read from the trace file the Trace was loaded from; each field is checked, and
an event with odd types is skipped, never trusted.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import re
from dataclasses import dataclass

from .expect import Expect, _need_steps
from .peaks import device_peak
from .read import Trace, _read_json

DEVICE_TYPE = {"cpu": 0, "cuda": 1}  # c10::DeviceType


@dataclass(frozen=True)
class Alloc:
    ts: float
    nbytes: float  # > 0 allocated, < 0 freed
    total: float  # the allocator's running total after this event
    device: tuple[int, int]  # (device type, device id)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # a 400-digit integer is valid JSON
        return None
    return value if math.isfinite(value) else None


def read_allocs(path: str) -> list[Alloc]:
    """The "[memory]" events of a trace file, in time order; events with odd fields are skipped."""
    st = os.stat(path)
    return list(_read_allocs(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _read_allocs(path: str, mtime_ns: int, size: int) -> tuple[Alloc, ...]:  # cached per file version
    data = _read_json(path)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    allocs = []
    for raw in events if isinstance(events, list) else []:
        if not isinstance(raw, dict) or raw.get("name") != "[memory]" or raw.get("ph") not in ("i", "I"):
            continue
        args = raw.get("args")
        if not isinstance(args, dict):
            continue
        ts, nbytes, total = _number(raw.get("ts")), _number(args.get("Bytes")), _number(args.get("Total Allocated"))
        dtype, did = args.get("Device Type"), args.get("Device Id", 0)
        if None in (ts, nbytes, total) or type(dtype) is not int or type(did) is not int:
            continue
        allocs.append(Alloc(ts, nbytes, total, (dtype, did)))  # no more of these than the file has events
    allocs.sort(key=lambda a: a.ts)
    return tuple(allocs)


def step_peaks(trace: Trace) -> dict[int, float] | None:
    """{ProfilerStep number: peak bytes allocated above the step's start} on the trace's device;
    None when the trace has no memory events for that device (profiled without profile_memory=True)."""
    want = DEVICE_TYPE[trace.device]
    allocs = [a for a in read_allocs(trace.path) if a.device[0] == want]
    if not allocs:
        return None
    times = [a.ts for a in allocs]
    peaks = {}
    for st in trace.steps:
        inside = allocs[bisect.bisect_left(times, st.span.ts):bisect.bisect_right(times, st.span.end)]
        peak = 0.0
        for dev in {a.device for a in inside}:  # one running total per device
            mine = [a for a in inside if a.device == dev]
            base = mine[0].total - mine[0].nbytes
            peak = max(peak, max(a.total for a in mine) - base)
        peaks[st.number] = peak
    return peaks


def _size(nbytes: float) -> str:
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
        f"#{n} {_size(p)}" for n, p in sorted(peaks.items()))
    if reference_bytes:
        line += f" ({what or 'reference'}: {_size(reference_bytes)})"
    return line


def allocates(nbytes: float, what: str, present: bool = True) -> Expect:
    """Every step's peak allocation is at least `nbytes` (present) or below it (not present)."""
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        peaks = step_peaks(t)
        if peaks is None:
            return f"no [memory] events for the {t.device}: profile with profile_memory=True"
        seen = ", ".join(f"#{n} {_size(p)}" for n, p in sorted(peaks.items()))
        ok = all((p >= nbytes) == present for p in peaks.values())
        return True if ok else f"peak allocation per step: {seen}"
    text = (f"allocates {what} ({_size(nbytes)}): each step's peak allocation >= that" if present else
            f"never allocates {what} ({_size(nbytes)}): each step's peak allocation stays below it")
    return Expect(text, run)


def streams(pattern: str, nbytes: float, what: str, at_least: float = 0.5) -> Expect:
    """Memory-bound and at speed: the kernels matching `pattern` move `nbytes` per step at
    >= `at_least` of the device's datasheet bandwidth (GB/s = bytes / their summed time)."""
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        peak = device_peak(t.device_name)
        if peak is None or not peak.gbs:
            return f"no datasheet bandwidth for {t.device_name!r}"
        rates = []
        for st in t.steps:
            us = sum(k.dur for k in st.kernels if rx.search(k.name))
            if us <= 0:
                return f"ProfilerStep#{st.number} has no kernel matching /{pattern}/"
            rates.append(nbytes / us / 1e3)  # bytes per µs -> GB/s
        seen = ", ".join(f"{r:.0f}" for r in rates)
        ok = all(r >= at_least * peak.gbs for r in rates)
        return True if ok else f"{seen} GB/s per step, of {peak.gbs:.0f} GB/s ({peak.source})"
    return Expect(f"memory-bound: the /{pattern}/ kernels read {what} ({_size(nbytes)}) at >= {at_least:.0%} of "
                  "the device's datasheet bandwidth", run, "cuda")
