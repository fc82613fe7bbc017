"""What did torch.compile run? Its "Torch-Compiled Region: F/C" spans: which compiled frames ran in each step,
the graph breaks (a frame resumed inside another frame's region) and the recompiles (a frame's C-th version)."""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

from ..reading.events import BACKWARD_PREFIX, Event, Trace

REGION_RE = re.compile(r"^Torch-Compiled Region: (.*)$")
REGION_PREFIX = "Torch-Compiled Region: "  # tested first: a regex per span of a long trace costs 0.1 s
# Dynamo's CompileId: "frame/compile", behind "!N/" when compiled autograd compiled it; "Unknown" or "!N" otherwise
ID_RE = re.compile(r"^(?:!\d{1,9}/)?(\d{1,9})/(\d{1,9})$")
STEPS_LISTED = 4


def compiled_regions(trace: Trace) -> dict | None:
    """The compiled regions of the active steps as data; None when nothing compiled ran.

    frames: {frame: its compiled versions seen}; graph_breaks: [[frame, frame resumed inside it]], from the
    nesting: after a graph break Dynamo compiles the rest of the function as a new frame, called from inside the
    first one's compiled code; recompiled: the frames whose version > 0 ran (the C-th compile of frame F, after a
    guard failed: a new shape, dtype or Python value); per_step: each step's region ids in time order, an
    enclosed one written "1/0 inside 0/0"; other_ids: ids that are not frame/compile (e.g. "Unknown")."""
    per_step, frames, breaks, other = [], defaultdict(set), set(), set()
    at_backward, autograd_graphs = set(), set()
    for st in trace.steps:
        regions = [e for e in st.spans if e.name.startswith(REGION_PREFIX) and REGION_RE.match(e.name)]
        ids = []
        for r, outer in _enclosing(regions):
            rid = _id(r)
            parsed, outer_parsed = ID_RE.match(rid), outer is not None and ID_RE.match(_id(outer))
            if parsed:
                frames[int(parsed.group(1))].add(int(parsed.group(2)))
            else:
                other.add(rid[:40])
            if rid.startswith("!"):  # compiled autograd's backward graph: its own graph, no continuation of a frame
                autograd_graphs.add(rid[:40])
            elif parsed and outer_parsed and outer_parsed.group(1) != parsed.group(1) and not _id(outer).startswith("!"):
                breaks.add((int(outer_parsed.group(1)), int(parsed.group(1))))
            ids.append(f"{rid} inside {_id(outer)}" if outer is not None else rid)
        at_backward |= _backward_inside(st)
        per_step.append({"number": st.number, "regions": ids})
    if not any(s["regions"] for s in per_step):
        return None
    return {"frames": {f: sorted(v) for f, v in sorted(frames.items())},
            "graph_breaks": [list(b) for b in sorted(breaks)],
            "recompiled": sorted(f for f, v in frames.items() if max(v) > 0),
            "per_step": per_step, "other_ids": sorted(other),
            "backward_in_frame": sorted(at_backward), "compiled_autograd": sorted(autograd_graphs)}


def _backward_inside(st) -> set[str]:
    """The regions during which the autograd engine started a backward node: loss.backward() called in a compiled
    function, where Dynamo breaks the graph and runs the call eagerly, inside the frame's region. On a CPU the
    engine's spans nest in the region; on a GPU they run on the engine's own thread while the region's thread
    waits in backward(), so a node's start inside a region's time, in the same process, is what tells."""
    regions = sorted((e for e in st.spans if e.name.startswith(REGION_PREFIX) and REGION_RE.match(e.name)
                      and not _id(e).startswith("!")), key=lambda e: e.ts)
    if not regions:
        return set()
    starts = [r.ts for r in regions]
    out = set()
    for e in st.spans:
        if not (e.cat == "cpu_op" and e.name.startswith(BACKWARD_PREFIX)):
            continue
        # the innermost region open at the node's start: the latest-starting one that still holds it
        for r in reversed(regions[:bisect.bisect_right(starts, e.ts)]):
            if r.pid == e.pid and r.end >= e.ts:
                out.add(_id(r)[:40])
                break
    return out


def _id(region: Event) -> str:
    return REGION_RE.match(region.name).group(1)


def _enclosing(regions: list[Event]) -> list[tuple[Event, Event | None]]:
    """Each region with the innermost region around it on its thread (a stack per thread: linear time)."""
    out, stacks = [], defaultdict(list)
    for r in sorted(regions, key=lambda e: (e.ts, -e.dur)):
        stack = stacks[(r.pid, r.tid)]
        while stack and stack[-1].end < r.end:
            stack.pop()
        out.append((r, stack[-1] if stack else None))
        stack.append(r)
    out.sort(key=lambda pair: pair[0].ts)
    return out


def describe(data: dict | None) -> list[str]:
    """The compiled regions in a few lines: frames, graph breaks, recompiles, which steps ran which."""
    if data is None:
        return []
    frames = data["frames"]
    versions = ", ".join(f"{f}/{c}" for f, cs in frames.items() for c in cs) or "-"
    head = (f"Compiled regions (Torch-Compiled Region: frame/version): {len(frames)} compiled "
            f"frame{'s' if len(frames) != 1 else ''}, {versions}")
    orders: dict[tuple, list[int]] = defaultdict(list)
    for step in data["per_step"]:
        orders[tuple(step["regions"])].append(step["number"])
    at_backward, autograd_graphs = data.get("backward_in_frame", []), data.get("compiled_autograd", [])
    plain = not (data["graph_breaks"] or data["recompiled"] or data["other_ids"] or at_backward or autograd_graphs)
    if plain and len(orders) == 1:
        return [head + " in every step: no graph break, no recompile"]
    out = [head]
    for outer, inner in data["graph_breaks"]:
        out.append(f"  graph break: frame {inner} runs inside frame {outer}'s region (Dynamo compiled the rest of "
                   f"frame {outer} after the break as a new frame)")
    if at_backward:
        out.append(f"  graph break at backward(): the autograd engine runs inside region{'s' if len(at_backward) > 1 else ''} "
                   f"{', '.join(at_backward)}, outside the compiled graph (Dynamo cannot trace .backward(): it ends "
                   "the graph there and runs the call eagerly)")
    if autograd_graphs:
        out.append(f"  compiled autograd: the backward ran as the compiled graph(s) {', '.join(autograd_graphs)} "
                   "(!N/ is compiled autograd's graph N), not as autograd engine nodes")
    for f in data["recompiled"]:
        seen = ", ".join(f"{f}/{c}" for c in frames[f])
        out.append(f"  recompiled: frame {f} ran {seen}; a version after /0 means a guard failed and Dynamo "
                   "compiled the frame again (a new shape, dtype or Python value)")
    if others := [i for i in data["other_ids"] if i not in autograd_graphs]:
        out.append(f"  other regions: {', '.join(others)}")
    if len(orders) == 1:
        out.append(f"  every step runs: {', '.join(next(iter(orders))) or 'none'}")
    else:
        for regions, nums in sorted(orders.items(), key=lambda kv: kv[1][0]):
            where = ", ".join(f"#{n}" for n in nums[:STEPS_LISTED]) + (", ..." if len(nums) > STEPS_LISTED else "")
            out.append(f"  step{'s' if len(nums) > 1 else ''} {where} run{'' if len(nums) > 1 else 's'}: "
                       f"{', '.join(regions) or 'none'}")
    return out
