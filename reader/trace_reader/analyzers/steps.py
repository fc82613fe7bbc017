"""Each step's time and verdict: GPU busy against the step, why the GPU idles (waiting on the host, or after the
launch), overhead-, partly overhead- or compute-bound, and the typical (median) step's (bound_of).

The verdict (README, "Guess first, then look"): overhead-bound below COMPUTE_BUSY of GPU busy time; at or above
it, compute-bound only while the GPU waits on the host less than HOST_WAIT_LARGE of the step: a step that busy
which still waits that long for launches is "partly overhead"-bound (launching sooner would shorten it too)."""

from __future__ import annotations

import bisect
import math
import statistics

from ..reading.events import Step, Trace

# Steps shown one per row; a longer trace shows its first and last EDGE steps and quantiles (--all-steps: all).
STEP_ROWS = 8


EDGE = 3


# The verdict (README, "Guess first, then look"): overhead-bound below COMPUTE_BUSY of GPU busy time; at or above
# it, compute-bound only while the GPU waits on the host less than HOST_WAIT_LARGE of the step: a step that busy
# which still waits that long for launches is "partly overhead"-bound (launching sooner would shorten it too).
COMPUTE_BUSY = 0.5


HOST_WAIT_LARGE = 0.2


def step_numbers_shown(steps: list[Step]) -> str:
    """#2, #3, #4 — or #2..#601 when the numbers run on."""
    nums = [st.number for st in steps]
    if len(nums) > 4 and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"#{nums[0]}..#{nums[-1]}"
    if len(nums) > 8:
        return ", ".join(f"#{n}" for n in nums[:EDGE]) + ", ..., " + ", ".join(f"#{n}" for n in nums[-EDGE:])
    return ", ".join(f"#{n}" for n in nums)


def _idle(trace: Trace) -> list[tuple[float, float]]:
    """Per step, (waiting on the host, waiting after the launch): the GPU idle time the step is answerable for.

    On the GPU's own timeline (all steps' work, overlapping streams merged), each gap ends when some work
    starts; the gap belongs to that work's step, counted from the step's start at the earliest. The part of
    the gap before the work was launched is the GPU waiting on the host (the CPU had not asked yet); the rest,
    after the launch, is launch latency or earlier work on another stream. After the step's last work, while
    its CPU span still runs and no other work does, the GPU waits on the host too. When the CPU runs ahead
    (no synchronize per step), a step's work queues behind the previous step's and its gaps close: its GPU
    time is all busy, however late the work starts after its launch.
    """
    n = len(trace.steps)
    host, after = [0.0] * n, [0.0] * n
    # Work with no launch in the trace (launch at inf) sorts after launched work that starts and ends with it.
    items = sorted((k.event.ts, k.event.end, k.launch.ts if k.launch is not None else math.inf, i)
                   for i, st in enumerate(trace.steps) for k in st.gpu)
    merged: list[list[float]] = []
    cursor = float("-inf")
    for start, end, launch, i in items:
        gap_start = max(cursor, trace.steps[i].span.ts)
        if start > gap_start:
            gap = start - gap_start
            waited = min(max(launch - gap_start, 0.0), gap) if launch != math.inf else 0.0
            host[i] += waited
            after[i] += gap - waited
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
        cursor = max(cursor, end)
    starts = [m[0] for m in merged]
    for i, st in enumerate(trace.steps):
        if st.gpu:
            last = max(k.event.end for k in st.gpu)
            host[i] += _free(merged, starts, last, st.span.end)
    return list(zip(host, after))


def _free(merged: list[list[float]], starts: list[float], a: float, b: float) -> float:
    """Time in [a, b] covered by none of the merged (sorted, disjoint) intervals."""
    if b <= a:
        return 0.0
    covered = 0.0
    for lo, hi in merged[max(bisect.bisect_right(starts, a) - 1, 0):bisect.bisect_right(starts, b)]:
        covered += max(0.0, min(hi, b) - max(lo, a))
    return b - a - covered


def verdict(busy_fraction: float, host_wait_fraction: float) -> str:
    """"overhead", "partly overhead" or "compute": the rule at COMPUTE_BUSY and HOST_WAIT_LARGE."""
    if busy_fraction < COMPUTE_BUSY:
        return "overhead"
    return "partly overhead" if host_wait_fraction >= HOST_WAIT_LARGE else "compute"


def _step_facts(st: Step, idle: tuple[float, float] | None) -> dict:
    busy, wall, lags = st.gpu_busy, st.wall, st.lags()
    host, after = idle if idle is not None and st.gpu else (None, None)
    window = busy + host + after if host is not None else 0.0
    frac = busy / window if window > 0 else None
    host_frac = host / window if window > 0 else None
    return {
        "number": st.number, "kernels": len(st.kernels), "gpu_work": len(st.gpu),
        "cpu_us": st.cpu_time, "gpu_busy_us": busy, "wall_us": wall, "busy_fraction": frac,
        "host_wait_fraction": host_frac, "bound": None if frac is None else verdict(frac, host_frac),
        "lag_us": {"median": statistics.median(lags), "max": max(lags)} if lags else None,
        "idle_us": None if host is None else {"waiting_on_host": host, "after_launch": after},
    }


def steps_facts(trace: Trace) -> list[dict]:
    return [_step_facts(st, idle) for st, idle in zip(trace.steps, _idle(trace))]


def bound_of(trace: Trace) -> tuple[str, float] | None:
    """("overhead"|"partly overhead"|"compute", GPU busy fraction) of the typical step: the median step by GPU
    busy fraction, busy / (busy + the GPU idle time the step is answerable for, see _idle).

    Each step is judged on its own (see verdict: overhead-bound when the GPU idles more than half the time
    because the CPU cannot launch work fast enough); pooling steps would let one cold step decide. With an even
    count the lower median is taken."""
    f = typical_of(steps_facts(trace))
    return None if f is None else (f["bound"], f["busy_fraction"])


def typical_of(steps: list[dict]) -> dict | None:
    """The median step by GPU busy fraction (the lower one for an even count), None without GPU work."""
    judged = [f for f in steps if f["busy_fraction"] is not None]
    if not judged:
        return None
    frac = statistics.median_low(f["busy_fraction"] for f in judged)
    return next(f for f in judged if f["busy_fraction"] == frac)
