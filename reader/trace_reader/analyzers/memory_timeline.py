"""Where the memory goes, by category: torch's memory timeline read back, each category's peak, a stacked picture.

torch's memory profiler (profile_memory=True, record_shapes=True, with_stack=True, then
`prof.export_memory_timeline(...)`) sorts every tensor into parameter, optimizer state, input, temporary,
activation, gradient, autograd detail (or unknown). 07_train_step.py --memory saves that timeline next to its
trace as <stem>.memory.json, in this file's own labelled form:

    {"device": "cpu", "times_us": [...], "bytes": {"parameter": [...], "activation": [...], ...}}

times on the trace's own clock (the "ts" of its events), so the training phases can be drawn over it. Here:
read it back (untrusted, like a trace), each category's peak and the total's, and the stacked PNG.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..reading.events import Trace, TraceError
from ..reading.files import read_json
from .passes import PHASES, phase_windows

# torch.profiler._memory_profiler's categories in the order its timeline export writes them (after a leading
# zero column); the last one is a tensor it could not place.
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")
COLORS = {"parameter": "darkgreen", "optimizer_state": "goldenrod", "input": "black", "temporary": "mediumpurple",
          "activation": "red", "gradient": "mediumblue", "autograd_detail": "royalblue", "unknown": "grey"}
MAX_POINTS = 2_000_000  # a timeline longer than this is not one profiled run


def from_torch_export(rows: object, device: str, clock_offset_us: float = 0.0, names=CATEGORIES) -> dict:
    """Our labelled timeline from what torch's export_memory_timeline(.json) writes: [times, sizes], each of sizes
    [0, bytes of each category...]; times in µs, minus clock_offset_us (the trace's baseTimeNanoseconds / 1000)."""
    if not (isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, list) for r in rows)):
        raise TraceError("the memory timeline is not [times, sizes]")
    times, sizes = rows
    if len(times) != len(sizes) or any(not isinstance(s, list) or len(s) != len(names) + 1 for s in sizes):
        raise TraceError(f"the memory timeline's rows are not a zero column and {len(names)} categories")
    return {"device": device, "times_us": [t - clock_offset_us for t in times],
            "bytes": {name: [s[i + 1] for s in sizes] for i, name in enumerate(names)}}


def _number(x) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def load(path: str | Path) -> dict:
    """A <stem>.memory.json written by 07_train_step.py, checked field by field."""
    data = read_json(path)
    times = data.get("times_us") if isinstance(data, dict) else None
    cats = data.get("bytes") if isinstance(data, dict) else None
    if not isinstance(times, list) or not isinstance(cats, dict) or len(times) > MAX_POINTS:
        raise TraceError(f"{path}: not a memory timeline (times_us and bytes)")
    if not all(_number(t) for t in times) or any(
            not isinstance(v, list) or len(v) != len(times) or not all(_number(b) for b in v) for v in cats.values()):
        raise TraceError(f"{path}: a memory timeline with odd values (each category needs a number per time)")
    return {"device": str(data.get("device", "?"))[:20], "times_us": times,
            "bytes": {str(k)[:40]: v for k, v in cats.items()}}


def peaks(timeline: dict) -> dict:
    """{"categories": {name: peak bytes} (the largest first, empty categories left out), "total": peak of the sum,
    "total_at_us": when}."""
    cats = {k: max(v) for k, v in timeline["bytes"].items() if v and max(v) > 0}
    totals = [sum(v[i] for v in timeline["bytes"].values()) for i in range(len(timeline["times_us"]))]
    top = max(range(len(totals)), key=totals.__getitem__) if totals else None
    return {"categories": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "total": totals[top] if top is not None else 0, "total_at_us": timeline["times_us"][top] if top is not None
            else None}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def peaks_text(timeline: dict, trace: Trace | None = None) -> str:
    """Each category's peak, and the total's: when, and in which phase of which step (from the trace)."""
    p = peaks(timeline)
    where = ""
    if trace is not None and p["total_at_us"] is not None:
        where = _phase_at(trace, p["total_at_us"])
    cats = ", ".join(f"{k} {_mib(v)}" for k, v in p["categories"].items()) or "none"
    return (f"memory by category (torch's memory profiler, {timeline['device']}), each one's peak: {cats}\n"
            f"  all together peak at {_mib(p['total'])}" + (f", {where}" if where else ""))


def _phase_at(trace: Trace, ts: float) -> str:
    for st in trace.steps:
        if st.span.ts <= ts <= st.span.end:
            windows, _ = phase_windows(st)
            phase = next((ph for ph in PHASES if ph in windows and windows[ph][0] <= ts <= windows[ph][1]), None)
            return f"in ProfilerStep#{st.number}" + (f"'s {phase}" if phase else "")
    return "outside the active steps"




def write(timeline: dict, path: Path) -> Path:
    """The timeline as JSON, atomically (a temporary file in the same folder, then os.replace), mode 0644."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(timeline))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        raise TraceError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path
