"""Comparing two traces: which kernels stayed, which replaced which (pairing.py), which are gone or new; CPU ops;
step times; training phases and communication where the traces have them. compare() is the text
(render/compare_text.py), comparison_data() the data (--json); each call is counted once."""

from __future__ import annotations

from collections import Counter

from ..analyzers import ranks, training
from ..analyzers.collectives import backend_of
from ..facts import intervals
from ..facts.schema import SCHEMA_VERSION
from ..reading.events import Trace
from .pairing import match
from .units import Tally


def comparison_data(a: Trace, b: Trace) -> dict:
    """The comparison as plain data (what `inspect_trace.py --json A B` prints); compare() renders it as text.

    µs are per step unless the key says per call, over the steps in the typical launch order. Each unit is counted
    once: `same` holds the calls that stayed (`elsewhere`: that name's other calls per step, counted under
    `replaced` or `only_*`); `replaced` entries: A's kernels `old` (one occurrence, in launch order) became B's
    `new`, `times` times per step, `old_us`/`new_us` and `old_calls`/`new_calls` per step; `only_*`: calls nothing
    took the place of. So `kernel_us` = same + replaced + only, per side. `hidden`: why a side's work may be
    missing from its trace (then a group's side is empty). `training`: both traces' phases where both run a
    backward; `communication`: each side's collectives per step, by kind (_comm_side), where either trace is a rank
    of a distributed run or holds a collective, else None.
    """
    m = match(a, b)

    def trace_info(t: Trace) -> dict:
        return {"path": str(t.path), "device": t.device, "device_name": t.device_name, "whole_trace": t.whole,
                "steps": [{"step": st.number, "gpu_busy_us": st.gpu_busy if t.device == "cuda" else None,
                           "cpu_us": st.cpu_time} for st in t.steps]}

    def one(n: str, t: Tally) -> dict:
        return {"name": n, "calls": t.calls, "us_per_call": t.us / t.calls, "us": t.us}

    elsewhere = {side: Counter() for side in "ab"}
    for g in m.groups:
        elsewhere["a"].update(g.calls("old"))
        elsewhere["b"].update(g.calls("new"))
    for side, lone in (("a", m.lone_a), ("b", m.lone_b)):
        elsewhere[side].update({n: t.calls for n, t in lone.items()})
    return {
        "schema_version": SCHEMA_VERSION, "a": trace_info(a), "b": trace_info(b),
        "units": "GPU kernels" if a.device == "cuda" and b.device == "cuda" else "units of work (CPU kernels)",
        "launch_order_steps": {"a": m.steps_used[0], "b": m.steps_used[1]},
        "kernel_us": {"a": m.total_us[0], "b": m.total_us[1]},
        "hidden": {"a": m.hidden[0], "b": m.hidden[1]},
        "same": [{"name": n, "a": one(n, ta), "b": one(n, tb),
                  "elsewhere": {"a": elsewhere["a"][n], "b": elsewhere["b"][n]}} for n, (ta, tb) in m.kept.items()],
        "replaced": [{"old": g.old, "new": g.new, "times": g.times, "old_us": g.old_us, "new_us": g.new_us,
                      "old_calls": g.calls("old"), "new_calls": g.calls("new"),
                      "old_us_per_call": {n: g.old_name_us[n] / c for n, c in g.calls("old").items()},
                      "new_us_per_call": {n: g.new_name_us[n] / c for n, c in g.calls("new").items()},
                      "by": g.by} for g in m.groups],
        "only_a": [one(n, t) for n, t in m.lone_a.items()],
        "only_b": [one(n, t) for n, t in m.lone_b.items()],
        "ops_gone": m.ops_gone, "ops_new": m.ops_new,
        "training": _training(a, b),
        "communication": _communication(a, b),
    }


def _training(a: Trace, b: Trace) -> dict | None:
    """Both traces' training phases (per step, medians: training.phases_summary), where both run a backward."""
    sides = {"a": training.phases_summary(a), "b": training.phases_summary(b)}
    if None in sides.values():
        return None
    return {side: {k: v for k, v in summary.items() if k != "steps"} for side, summary in sides.items()}


def _communication(a: Trace, b: Trace) -> dict | None:
    """Each trace's collectives per step (mean over its steps), by kind, where either trace has any or says it is a
    rank of a distributed run (DDP against FSDP2, one process against a DDP rank); else None."""
    sides = {"a": _comm_side(a), "b": _comm_side(b)}
    if not any(s["world_size"] > 1 or s["kinds"] for s in sides.values()):
        return None
    return sides


def _comm_side(t: Trace) -> dict:
    """One trace's communication per step: per collective kind its calls, bytes (None where a call's size is not
    in the trace), time and exposed time (with no compute beside it), from ranks.step_work's compute and
    communication intervals and collectives; `total`: all kinds at once (kinds that overlap count once there)."""
    info = t.meta.get("distributedInfo")
    ok = isinstance(info, dict) and type(info.get("world_size")) is int and info["world_size"] >= 1
    world = info["world_size"] if ok else 1
    gpu, n = t.device == "cuda", max(len(t.steps), 1)
    kinds: dict[str, dict] = {}
    total = {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0}
    for st in t.steps:
        compute, comm, colls = ranks.step_work(st, gpu, 0.0, world)  # offset 0: the trace's own clock
        for kind in dict.fromkeys(c.kind for c in colls):  # in the order first called
            mine = [c for c in colls if c.kind == kind]
            k = kinds.setdefault(kind, {"calls": 0, "bytes": 0, "us": 0.0, "exposed_us": 0.0})
            k["calls"] += len(mine)
            k["bytes"] = None if k["bytes"] is None or None in (c.bytes for c in mine) else \
                k["bytes"] + sum(c.bytes for c in mine)
            # its calls as far as step_work counts them communication (cut to the step), less what compute hid
            spans = [(c.start, c.end) for c in mine]
            k["us"] += intervals.common(spans, comm)
            k["exposed_us"] += intervals.common(spans, comm + compute) - intervals.common(spans, compute)
        total["calls"] += len(colls)
        total["bytes"] = None if total["bytes"] is None or None in (c.bytes for c in colls) else \
            total["bytes"] + sum(c.bytes for c in colls)
        total["us"] += intervals.length(comm)
        total["exposed_us"] += intervals.length(comm) - intervals.common(comm, compute)
    per_step = lambda d: {key: (v / n if v is not None else None) for key, v in d.items()}  # noqa: E731
    rank = info.get("rank") if ok else None
    return {"world_size": world, "rank": rank if type(rank) is int else None,
            "backend": backend_of(info) if ok else None, "steps": len(t.steps),
            "kinds": {kind: per_step(v) for kind, v in kinds.items()}, "total": per_step(total)}


