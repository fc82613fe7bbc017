"""How far behind is the GPU? Per step: launch-to-kernel-start lag, and the wait before the first op.

Kernels launch asynchronously: without a synchronize per step, the CPU can enqueue the next step while the
GPU still works on the last one, and each step's work starts later after its launch (Part 1's ~2.5 ms
offset between the CPU and GPU lanes). In a cold run, the first step also waits on the CPU before its first
op dispatches (Part 1's Figure 6: 228 µs between record_function("matmul_add") and aten::matmul).
"""

from __future__ import annotations

from ..reading.events import Step


def launch_lag(step: Step) -> float | None:
    """µs between the step's first GPU launch on the CPU and the start of that work on the GPU; None if no
    GPU work of the step is linked to its launch call."""
    lags = step.lags()  # in launch order
    return lags[0] if lags else None


def dispatch_gap(step: Step, annotation: str) -> float | None:
    """µs from entering record_function(annotation) to the first aten op inside it; None if either is missing."""
    ann = next((e for e in step.spans if e.cat == "user_annotation" and e.name == annotation), None)
    if ann is None:
        return None
    op = next((e for e in step.spans if e.cat == "cpu_op" and ann.ts <= e.ts <= ann.end), None)
    return op.ts - ann.ts if op else None
