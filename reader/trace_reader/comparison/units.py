"""What a comparison of two traces is made of: a step's units (its kernels, or the CPU's kernels on a CPU trace) in
launch order, their tallies, the groups that replaced each other, the Comparison itself."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ..analyzers.compiled import REGION_PREFIX
from ..facts.kernels import CPP_KERNEL_RE, cpu_kernels, input_dims, typical_sequence
from ..reading.events import STEP_RE, Event, Trace


@dataclass
class Unit:
    """One position of a step's launch order: a GPU kernel, or one of the CPU's kernels on a CPU trace."""

    name: str
    us: float  # mean over the steps with this launch order
    op: Event | None  # the CPU op that launched it (on a CPU trace: the op itself)


@dataclass
class Tally:
    """Calls per step of one name, and their µs per step."""

    calls: int = 0
    us: float = 0.0

    def add(self, u: Unit) -> None:
        self.calls += 1
        self.us += u.us


@dataclass
class Replaced:
    """A's kernels `old` (launch order) became B's `new`, `times` times per step; µs per step over all times."""

    old: list[str]
    new: list[str]
    old_name_us: dict[str, float]  # µs per step of each name, over all `times`
    new_name_us: dict[str, float]
    times: int
    by: str  # what paired them: "gelu, mul", "GEMM for GEMM, ...", "tensor sizes", or REST

    @property
    def old_us(self) -> float:
        return sum(self.old_name_us.values())

    @property
    def new_us(self) -> float:
        return sum(self.new_name_us.values())

    def calls(self, side: str) -> dict[str, int]:
        """Calls per step of each name, over all `times`."""
        return {n: c * self.times for n, c in Counter(self.old if side == "old" else self.new).items()}


REST = "nothing tells them apart: the nearest kernels left, replaced as a whole"


GEMM_SIZES = "GEMM for GEMM, the same tensor sizes"


GEMM_ORDER = "GEMM for GEMM, in launch order"


SIZES = "tensor sizes"


UNSEEN = "nothing: the other trace does not record this work"


MODULE = "the same module, its kernels launched with no op in one trace: replaced as a whole"


# A compiled CPU run records its fused C++ kernels only when asked: its work is then in no span of the trace.
HIDDEN_CPP = ("compiled C++ kernels are not in the trace: profile with "
              "torch._inductor.config.cpp.enable_kernel_profile")


@dataclass
class Comparison:
    kept: dict[str, tuple[Tally, Tally]]  # name -> A's and B's calls that stayed (paired by align), A's order
    lone_a: dict[str, Tally]  # A's calls that nothing in B took the place of
    lone_b: dict[str, Tally]
    groups: list[Replaced]
    ops_gone: dict[str, float]  # CPU op -> calls per step in A, absent from B
    ops_new: dict[str, float]
    steps_used: tuple[int, int]  # steps of A and B with the typical launch order (the per-position times)
    total_us: tuple[float, float]  # each trace's units, µs per step: kept + groups + lone, nothing twice
    hidden: tuple[str | None, str | None]  # why a trace's own work may be missing from it, if it may

    @property
    def same(self) -> list[str]:
        return list(self.kept)

    @property
    def only_a(self) -> list[str]:
        return list(self.lone_a)

    @property
    def only_b(self) -> list[str]:
        return list(self.lone_b)

    @property
    def replaced(self) -> list[tuple[list[str], list[str]]]:
        return [(g.old, g.new) for g in self.groups]


def _step_units(trace: Trace, step) -> list[tuple[str, float, Event | None]]:
    if trace.device == "cuda":
        return [(k.name, k.dur, k.op) for k in step.kernels]
    return [(e.name, e.dur, e) for e in cpu_kernels(step)]


def launch_order(trace: Trace) -> tuple[list[Unit], int]:
    """The typical step's units, each timed as the mean over the steps with that launch order; and how many."""
    seq = typical_sequence(trace)
    steps = [u for u in (_step_units(trace, st) for st in trace.steps) if [n for n, _, _ in u] == seq]
    if not steps:
        return [], 0
    means = [math.fsum(col) / len(steps) for col in zip(*([dur for _, dur, _ in s] for s in steps))]
    return [Unit(name, us, op) for (name, _, op), us in zip(steps[0], means)], len(steps)


def op_calls(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    c: Counter = Counter(e.name for st in trace.steps for e in st.spans)
    return {k: v / n for k, v in c.items() if not STEP_RE.match(k)}  # one match per name, not per span


def hidden_work(trace: Trace) -> str | None:
    """Why some of this trace's work is in no span: a compiled CPU run without Inductor's kernel profiling."""
    if trace.device != "cpu":
        return None
    names = {e.name for st in trace.steps for e in st.spans}
    compiled = any(map(_compiled_span, names))
    return HIDDEN_CPP if compiled and not any(CPP_KERNEL_RE.search(n) for n in names) else None


def op_of(u: Unit) -> Event | None:
    """The CPU op that launched the unit, if the trace says: not a ProfilerStep span around bare launches."""
    return u.op if u.op is not None and not STEP_RE.match(u.op.name) else None


def unit_key(u: Unit):
    """What align() prefers to agree between two same-name kernels: the launching op and its tensor sizes."""
    op = op_of(u)
    return (op.name, repr(input_dims(op))) if op is not None else None


def _compiled_span(name: str) -> bool:
    """torch.compile's spans around its code: "Torch-Compiled Region: 0/0", "## Call CompiledFxGraph <hash> ##"."""
    return name.startswith(REGION_PREFIX) or "CompiledFxGraph" in name


def in_compiled(u: Unit) -> bool:
    """The unit was launched inside compiled code (a span of _compiled_span's around its op, within the step)."""
    e = u.op
    while e is not None and not STEP_RE.match(e.name):
        if _compiled_span(e.name):
            return True
        e = e.parent
    return False


def tally_units(units: list[Unit], positions: list[int]) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    for i in positions:
        out.setdefault(units[i].name, Tally()).add(units[i])
    return out
