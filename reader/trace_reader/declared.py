"""Your own guesses: expectations declared in a TOML file, checked against any trace (`--expect FILE`).

    [[expect]]
    says = "one GEMM per linear, three per step"   # the claim, printed on the ok/BROKEN line (optional)
    kernels_per_step = 3
    match = "gemm|cutlass|nvjet"                   # a regex, searched in each kernel's name

Each [[expect]] table is one check, named by its key (KINDS below; docs/expect_file.md says each one). Each is
built on the reader's own builders and analyzers (expect.py's steps(), kernel(), bound(), ...; report.bound_of;
memory.step_peaks; training.phases_summary and its builders), so a declared check and a script's guess say the same
of the same trace; what no builder counts (a range of counts, a regex over ops or launch calls) is one counter here.
A file is read and checked whole before any trace is: each mistake in it is one line naming the file and the entry
(`my.toml: expect[3]: unknown key 'kernal' (did you mean 'kernel'?)`), exit code 2.

read(path) -> Declared; names_file(value) says whether --expect's value is such a file or a script's name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .analyzers.guesses import (
    bound,
    buffer_request,
    cold_start_gap,
    cpu_event,
    gpu_lag_grows,
    kernel,
    kernels_per_step,
    occupancy_before_gemms,
    steps,
    views_launch_nothing,
)
from .analyzers.memory import step_peaks
from .analyzers.steps import bound_of
from .analyzers.training import has_backward, parameters, phases_summary
from .analyzers.training_expect import backward_flops, optimizer_kind, peak_after_forward, phases_present
from .expectation import Expect, NotApplicable, need_steps
from .facts.kernels import splitk_reduces
from .reading.events import Trace, TraceError, plural, real_steps
from .scripts import SCRIPTS

MAX_FILE_BYTES = 1 << 20  # a file of guesses is a few hundred bytes; a bigger one is not one (or a mistake)
MAX_ENTRIES = 1000
MAX_TEXT = 500  # characters of a pattern or a claim
MIB = 2**20
PHASE_NAMES = ("forward", "backward", "optimizer")


class _Bad(ValueError):
    """One mistake in one entry; read() names the file and the entry in front of it."""


# ------------------------------------------------------------------------------------------ the values, checked

def _count(key, v):
    """An exact count per step (3), or a range ({min = 2, max = 5}, either end left open): (low, high or None)."""
    if type(v) is int and v >= 0:
        return v, v
    if isinstance(v, dict) and v and set(v) <= {"min", "max"} and all(type(x) is int and x >= 0 for x in v.values()):
        low, high = v.get("min", 0), v.get("max")
        if high is not None and low > high:
            raise _Bad(f"{key}: min {low} is more than max {high}")
        return low, high
    if isinstance(v, dict) and (odd := sorted(set(v) - {"min", "max"})):
        raise _Bad(f"{key}: unknown key {odd[0]!r} in its table (it takes min and max)")
    raise _Bad(f"{key} must be a count per step, an integer >= 0 (3) or a range ({{min = 2, max = 5}}), "
               f"got {_shown(v)}")


def _ratio_range(key, v):
    """{min = 1.5, max = 2.5}, numbers >= 0, either end left open: (low, high or None)."""
    if isinstance(v, dict) and v and set(v) <= {"min", "max"} and all(_is_number(x) and x >= 0 for x in v.values()):
        low, high = float(v.get("min", 0.0)), (float(v["max"]) if "max" in v else None)
        if high is not None and low > high:
            raise _Bad(f"{key}: min {low:g} is more than max {high:g}")
        return low, high
    raise _Bad(f"{key} must be a range of numbers >= 0 ({{min = 1.5, max = 2.5}}, either end may be left out), "
               f"got {_shown(v)}")


def _pattern(key, v):
    if not isinstance(v, str) or not v or len(v) > MAX_TEXT:
        raise _Bad(f"{key} must be a regular expression of 1 to {MAX_TEXT} characters, got {_shown(v)}")
    try:
        re.compile(v)
    except (re.error, RecursionError, OverflowError, ValueError) as e:
        raise _Bad(f"{key}: bad regular expression {v!r}: {e}") from None
    return v


def _name(key, v):
    if not isinstance(v, str) or not v.strip() or len(v) > MAX_TEXT or "\n" in v:
        raise _Bad(f"{key} must be a name, one line of 1 to {MAX_TEXT} characters, got {_shown(v)}")
    return v


def _fraction(key, v):
    if not _is_number(v) or not 0 <= v <= 1:
        raise _Bad(f"{key} must be a share between 0 and 1 (0.8 for 80%), got {_shown(v)}")
    return float(v)


def _mib(key, v):
    if not _is_number(v) or not v > 0:
        raise _Bad(f"{key} must be a number of MiB above 0, got {_shown(v)}")
    return float(v)


def _positive(key, v):
    if not _is_number(v) or not v > 0:
        raise _Bad(f"{key} must be a number above 0, got {_shown(v)}")
    return float(v)


def _whole(key, v):
    if type(v) is not int or v < 0:
        raise _Bad(f"{key} must be an integer >= 0, got {_shown(v)}")
    return v


def _at_least_one(key, v):
    if type(v) is not int or v < 1:
        raise _Bad(f"{key} must be an integer >= 1, got {_shown(v)}")
    return v


def _true(key, v):
    if v is not True:
        raise _Bad(f"{key} takes true (leave the entry out to not check it), got {_shown(v)}")
    return v


def _bool(key, v):
    if not isinstance(v, bool):
        raise _Bad(f"{key} must be true or false, got {_shown(v)}")
    return v


def _choice(*options):
    def check(key, v):
        if v not in options:
            raise _Bad(f"{key} must be one of {', '.join(repr(o) for o in options)}, got {_shown(v)}")
        return v
    return check


def _is_number(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _shown(v) -> str:
    """A value as the file wrote it, cut short: one line whatever it holds."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)
    text = repr(v)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


# ------------------------------------------------------------------------------------------ the checks

@dataclass(frozen=True)
class Kind:
    keys: tuple[str, ...]  # any of these names the check (busy_above and busy_below are one check)
    more: tuple[str, ...] = ()  # the keys that may go with them
    device: str = "any"  # "cuda": a GPU check, not applicable on a CPU trace (its `device` cannot be changed)


KINDS = {
    "steps": Kind(("steps", "annotation")),
    "kernels_per_step": Kind(("kernels_per_step",), ("match",), "cuda"),
    "kernel": Kind(("kernel",), (), "cuda"),
    "kernel_absent": Kind(("kernel_absent",), (), "cuda"),
    "cpu_op": Kind(("cpu_op",)),
    "cpu_op_absent": Kind(("cpu_op_absent",)),
    "cpu_event": Kind(("cpu_event",)),
    "ops_per_step": Kind(("ops_per_step",), ("match",)),
    "launches_per_step": Kind(("launches_per_step",), ("match",), "cuda"),
    "memcpys_per_step": Kind(("memcpys_per_step",), (), "cuda"),
    "busy": Kind(("busy_above", "busy_below"), (), "cuda"),
    "bound": Kind(("bound",), (), "cuda"),
    "phase": Kind(("phase",), ("share_above", "share_below")),
    "peak": Kind(("peak_below_mib", "peak_above_mib")),
    "occupancy_before_gemms": Kind(("occupancy_before_gemms",), (), "cuda"),
    "views_launch_nothing": Kind(("views_launch_nothing",), (), "cuda"),
    "buffer_request": Kind(("buffer_request",), (), "cuda"),
    "gpu_lag_grows": Kind(("gpu_lag_grows",), (), "cuda"),
    "cold_start_gap": Kind(("cold_start_gap",), ("cold", "ratio"), "cuda"),
    "phases_present": Kind(("phases_present",)),
    "backward_over_forward_flops": Kind(("backward_over_forward_flops",)),
    "optimizer": Kind(("optimizer",), ("ops_per_parameter",)),
    "peak_phase": Kind(("peak_phase",)),
}

VALUES = {  # every key a table may hold, with what its value must be
    "says": _name, "device": _choice("any", "cuda", "cpu"),
    "steps": _whole, "annotation": _name, "kernels_per_step": _count, "match": _pattern, "kernel": _pattern,
    "kernel_absent": _pattern, "cpu_op": _pattern, "cpu_op_absent": _pattern, "cpu_event": _pattern,
    "ops_per_step": _count, "launches_per_step": _count, "memcpys_per_step": _count,
    "busy_above": _fraction, "busy_below": _fraction, "bound": _choice("overhead", "compute"),
    "phase": _choice(*PHASE_NAMES), "share_above": _fraction, "share_below": _fraction,
    "peak_below_mib": _mib, "peak_above_mib": _mib,
    "occupancy_before_gemms": _true, "views_launch_nothing": _true, "buffer_request": _true, "phases_present": _true,
    "gpu_lag_grows": _bool, "cold_start_gap": _name, "cold": _bool, "ratio": _positive,
    "backward_over_forward_flops": _ratio_range, "optimizer": _choice("for-loop", "foreach", "fused"),
    "ops_per_parameter": _at_least_one, "peak_phase": _choice("forward_end", "backward", "forward_or_backward"),
}
COMMON = ("says", "device")
KIND_OF = {key: name for name, kind in KINDS.items() for key in kind.keys}


def _entry(table) -> tuple[str, dict]:
    """(the check's kind, its values checked) of one [[expect]] table; _Bad names the first mistake."""
    if not isinstance(table, dict):
        raise _Bad(f"must be a table of keys ([[expect]] and key = value lines), got {_shown(table)}")
    for key in table:
        if key not in VALUES:
            near = difflib.get_close_matches(key, VALUES, n=1, cutoff=0.6)
            raise _Bad(f"unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else
                                                 " (docs/expect_file.md lists the keys)"))
    kinds = list(dict.fromkeys(KIND_OF[k] for k in table if k in KIND_OF))
    if not kinds:
        raise _Bad("no check in it: give one of " + ", ".join(KIND_OF))
    if len(kinds) > 1:
        first, second = (next(k for k in table if KIND_OF.get(k) == kind) for kind in kinds[:2])
        raise _Bad(f"two checks in one entry ({first!r} and {second!r}): one check per [[expect]] table")
    name, kind = kinds[0], KINDS[kinds[0]]
    for key in table:
        if key not in kind.keys + kind.more + COMMON:
            goes = [k for k, kd in KINDS.items() if key in kd.keys + kd.more]
            raise _Bad(f"{key!r} does not go with {kind.keys[0]!r}" + (f" (it goes with {', '.join(goes)})"
                                                                       if goes else ""))
    values = {key: VALUES[key](key, v) for key, v in table.items()}
    if "device" in values and kind.device != "any":
        raise _Bad(f"'device' does not go with {kind.keys[0]!r}: a GPU check, not applicable on a CPU trace already")
    for low, high in (("busy_above", "busy_below"), ("share_above", "share_below"), ("peak_above_mib", "peak_below_mib")):
        if low in values and high in values and values[low] >= values[high]:
            raise _Bad(f"{low} {values[low]:g} is not below {high} {values[high]:g}: nothing could pass")
    if name == "phase" and not {"share_above", "share_below"} & set(values):
        raise _Bad("'phase' needs share_above or share_below (its share of the step's time)")
    return name, values


# ------------------------------------------------------------------------------------------ the file

@dataclass
class Declared:
    """An expectations file, read and checked: one (kind, values) per [[expect]] table, in the file's order."""

    path: str
    entries: list[tuple[str, dict]]

    def expectations(self, trace: Trace) -> tuple[list[Expect], str]:
        """(the checks for this trace, a line saying where they come from), as expect.expectations_for gives a
        script's. Some read the trace to be built (a step count, the parameters' count and bytes)."""
        trace = real_steps(trace)
        out = [_built(name, values, trace, i) for i, (name, values) in enumerate(self.entries, 1)]
        return out, (f"{self.path}: {plural(len(out), 'expectation')} of your own, "
                     f"{plural(len(trace.steps), 'step')} in the trace")


def names_file(value: str | None) -> bool:
    """Is --expect's value an expectations file rather than a script? A script's name (SCRIPTS) is always the script;
    otherwise a value ending in .toml is a file (a missing one is an error of its own), and so is any other value
    naming an existing file, unless it ends in .py (a script's file: --expect takes the script's name)."""
    if value is None or value in SCRIPTS:
        return False
    return value.endswith(".toml") or (not value.endswith(".py") and os.path.isfile(value))


def read(path: str) -> Declared:
    """The file at `path`, read and checked whole; any mistake is a TraceError of one line naming the file."""
    p = Path(path)
    try:
        if p.is_dir():
            raise TraceError(f"{path}: a folder, not an expectations file")
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # read capped: the size a special file reports means nothing
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_FILE_BYTES:
        size = os.path.getsize(p) if p.is_file() else 0  # a pipe or a device has none to say
        raise TraceError(f"{path}: " + (f"{size / MIB:.1f} MiB, " if size > MAX_FILE_BYTES else "")
                         + f"more than the {MAX_FILE_BYTES // MIB} MiB an expectations file may be")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text (a bad byte at offset {e.start}), so not TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise TraceError(f"{path}: not TOML: {e}") from None
    except RecursionError:
        raise TraceError(f"{path}: not TOML this reader can take: nested too deep") from None
    for key in data:
        if key != "expect":
            near = " (did you mean 'expect'?)" if difflib.get_close_matches(key, ["expect"], cutoff=0.6) else ""
            raise TraceError(f"{path}: unknown top-level key {key!r}{near}: the file holds [[expect]] tables")
    tables = data.get("expect")
    if tables is None or tables == []:
        raise TraceError(f"{path}: no [[expect]] tables: nothing to check (docs/expect_file.md)")
    if not isinstance(tables, list):
        raise TraceError(f"{path}: 'expect' must be an array of tables, each written [[expect]], got {_shown(tables)}")
    if len(tables) > MAX_ENTRIES:
        raise TraceError(f"{path}: {len(tables):,} [[expect]] tables, more than the {MAX_ENTRIES:,} a file may hold")
    entries = []
    for i, table in enumerate(tables, 1):  # expect[1] is the file's first table, as a reader counts them
        try:
            entries.append(_entry(table))
        except _Bad as e:
            raise TraceError(f"{path}: expect[{i}]: {e}") from None
    return Declared(str(path), entries)


# ------------------------------------------------------------------------------------------ each check, built

def _built(name: str, v: dict, trace: Trace, index: int) -> Expect:
    """The Expect of one entry: its builder's, with the entry's own claim and device where it gives them. A builder
    that fails on this trace makes a check that says so (broken), as check() does with a check that raises."""
    try:
        ex = BUILD[name](v, trace)
    except Exception as e:  # noqa: BLE001 - one odd trace must not cost the other checks their verdicts
        failed = f"building the check raised {type(e).__name__}: {e}"
        ex = Expect(f"expect[{index}] ({KINDS[name].keys[0]})", lambda t: failed, KINDS[name].device)
    return dataclasses.replace(ex, text=v.get("says", ex.text), device=v.get("device", ex.device))


def _span(low: int, high: int | None) -> str:
    if high is None:
        return f"at least {low}"
    if low == high:
        return f"{low}"
    return f"at most {high}" if low == 0 else f"{low} to {high}"


def counted(text: str, count, low: int, high: int | None, device: str = "any", empty=None, noun: str = "") -> Expect:
    """count(step) between low and high (None: no end) in every step. Where 0 would do and a filter leaves out the
    rest, a step holding nothing of the kind at all (empty(step)) says nothing: not applicable, as expect.cpu_op's
    "no 'aten::add' among none"."""
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        if low == 0 and empty is not None and (none := next((st for st in t.steps if empty(st)), None)):
            return NotApplicable(f"ProfilerStep#{none.number} has no {noun} at all: nothing to count")
        counts = [count(st) for st in t.steps]
        ok = all(c >= low and (high is None or c <= high) for c in counts)
        return True if ok else f"{noun} per step: {counts}"
    return Expect(text, run, device)


def _steps(v, t):
    n, name = v.get("steps"), v.get("annotation")
    if name is not None and n is not None:
        return steps(n, name)
    if name is not None:  # no count given: the trace's own, so only the spans are looked at
        return Expect(steps(0, name).text, steps(len(t.steps), name).check)

    def run(t: Trace):
        return need_steps(t) or len(t.steps) == n or plural(len(t.steps), "active step")
    return Expect(f"{n} active ProfilerStep#k spans", run)


def _kernels(v, t):
    low, high = v["kernels_per_step"]
    rx = re.compile(v["match"]) if "match" in v else None
    if low == high:  # exact: the scripts' own builders (a split-K GEMM's reduce kernel not counted without a filter)
        return kernel(v["match"], per_step=low) if rx else kernels_per_step(low)
    if rx is None:
        return counted(f"GPU kernels per step: {_span(low, high)} (a split-K GEMM's reduce kernel not counted)",
                       lambda st: len(st.kernels) - len(splitk_reduces(st)), low, high, "cuda",
                       noun="kernels less split-K reduces")
    return counted(f"GPU kernels matching /{v['match']}/ per step: {_span(low, high)}",
                   lambda st: sum(bool(rx.search(k.name)) for k in st.kernels), low, high, "cuda",
                   lambda st: not st.kernels, "GPU kernels matching it")


def _kernel_absent(v, t):
    found = kernel(v["kernel_absent"], per_step=0)  # 0 matches in every step
    return Expect(f"no GPU kernel matching /{v['kernel_absent']}/ in any step", found.check, found.device)


def _ops(key, present):
    def build(v, t):
        rx = re.compile(v[key])
        text = f"a CPU op matching /{v[key]}/ in every step" if present else f"no CPU op matching /{v[key]}/"
        return counted(text, lambda st: sum(bool(rx.search(e.name)) for e in st.ops()),
                       *((1, None) if present else (0, 0)), empty=lambda st: not st.ops(), noun="CPU ops matching it")
    return build


def _ops_per_step(v, t):
    low, high = v["ops_per_step"]
    rx = re.compile(v["match"]) if "match" in v else None
    which = f" matching /{v['match']}/" if rx else ""
    return counted(f"CPU ops{which} per step: {_span(low, high)}",
                   lambda st: sum(bool(rx is None or rx.search(e.name)) for e in st.ops()), low, high,
                   empty=(lambda st: not st.ops()) if rx else None, noun=f"CPU ops{which}")


def _launches(v, t):
    """The runtime calls that started the step's GPU work (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync,
    cudaGraphLaunch, ...), each once: a CUDA graph's launch is one call, however many kernels it runs."""
    low, high = v["launches_per_step"]
    rx = re.compile(v["match"]) if "match" in v else None
    which = f" matching /{v['match']}/" if rx else ""

    def count(st):
        return len({id(k.launch) for k in st.gpu if k.launch is not None and (rx is None or rx.search(k.launch.name))})
    return counted(f"launch calls{which} per step: {_span(low, high)}", count, low, high, "cuda",
                   (lambda st: not st.gpu) if rx else None, f"launch calls{which}")


def _memcpys(v, t):
    low, high = v["memcpys_per_step"]
    return counted(f"GPU memcpys per step: {_span(low, high)}",
                   lambda st: sum(k.event.cat == "gpu_memcpy" for k in st.gpu), low, high, "cuda", noun="memcpys")


def _between(value: float, above: float | None, below: float | None) -> bool:
    return (above is None or value > above) and (below is None or value < below)


def _limits(above: float | None, below: float | None, unit=lambda x: f"{100 * x:g}%") -> str:
    if above is not None and below is not None:
        return f"between {unit(above)} and {unit(below)}"
    return f"above {unit(above)}" if above is not None else f"below {unit(below)}"


def _busy(v, t):
    above, below = v.get("busy_above"), v.get("busy_below")

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        b = bound_of(t)  # the report's verdict: the typical step, busy over busy + the idle it caused
        if b is None:
            return "no GPU work in the active steps"
        return _between(b[1], above, below) or f"the typical step's GPU is busy {100 * b[1]:.1f}% ({b[0]}-bound)"
    return Expect(f"the typical step's GPU is busy {_limits(above, below)} (of busy + the idle it caused)", run, "cuda")


def _phase(v, t):
    phase, above, below = v["phase"], v.get("share_above"), v.get("share_below")
    unit = "gpu_us" if t.device == "cuda" else "cpu_us"
    what = "GPU" if t.device == "cuda" else "CPU"

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        data = phases_summary(t)
        if data is None:
            return NotApplicable("no backward in the active steps (no autograd::engine spans): no training phases")
        shares = []
        for s in data["steps"]:
            if phase not in s["phases"]:
                return f"ProfilerStep#{s['number']} has no {phase} phase"
            total = sum(f[unit] or 0 for f in s["phases"].values())  # the report's share: of the phases' sum
            if not total:
                return f"ProfilerStep#{s['number']}: no {what} time in its phases"
            shares.append(s["phases"][phase][unit] / total)
        ok = all(_between(x, above, below) for x in shares)
        return ok or f"{phase}'s share of each step's {what} time: " + ", ".join(f"{100 * x:.1f}%" for x in shares)
    return Expect(f"{phase} takes {_limits(above, below)} of each step's {what} time (of forward + backward + "
                  "optimizer)", run)


def _peak(v, t):
    above, below = v.get("peak_above_mib"), v.get("peak_below_mib")

    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        peaks = step_peaks(t) if t.has_memory_events else None
        if peaks is None:
            return NotApplicable(f"no [memory] events for the {t.device}: recorded without profile_memory=True")
        mib = [peaks[st.number] / MIB for st in t.steps]
        return all(_between(x, above, below) for x in mib) or (
            "peak allocation per step: " + ", ".join(f"{x:.2f} MiB" for x in mib))
    return Expect(f"each step's peak allocation (above the step's start) is {_limits(above, below, '{:g} MiB'.format)}",
                  run)


def _training(ex: Expect) -> Expect:
    """A training step's guess on a trace with no backward: not applicable (its builder would call it broken, right
    for a run of 07_train_step.py, not for any trace)."""
    def run(t: Trace):
        if t.steps and not has_backward(t):
            return NotApplicable("no backward in the active steps (no autograd::engine spans): not a training step")
        return ex.check(t)
    return Expect(ex.text, run, ex.device)


def _counted_parameters(t: Trace) -> tuple[int | None, int | None]:
    """(parameters, their bytes) as --expect 07_train_step reads them (training.parameters); None where unknown."""
    found = parameters(t)
    return found if found is not None else (None, None)


def _flops(v, t):
    low, high = v["backward_over_forward_flops"]
    ex = backward_flops(low, math.inf if high is None else high, "")
    text = f"backward's GEMMs do {_limits(low, high, '{:g}x'.format) if high is None else f'{low:g}x-{high:g}x'}"
    return _training(Expect(f"{text} forward's FLOPs", ex.check, ex.device))


def _optimizer(v, t):
    return _training(optimizer_kind(v["optimizer"], _counted_parameters(t)[0], v.get("ops_per_parameter", 1)))


def _peak_phase(v, t):
    where = v["peak_phase"]
    rebuilds = "a module that rebuilds its tensors in backward" if where == "forward_or_backward" else None
    return _training(peak_after_forward(where == "backward", _counted_parameters(t)[1], rebuilds))


BUILD = {
    "steps": _steps,
    "kernels_per_step": _kernels,
    "kernel": lambda v, t: kernel(v["kernel"]),
    "kernel_absent": _kernel_absent,
    "cpu_op": _ops("cpu_op", True),
    "cpu_op_absent": _ops("cpu_op_absent", False),
    "cpu_event": lambda v, t: cpu_event(v["cpu_event"], device="any"),
    "ops_per_step": _ops_per_step,
    "launches_per_step": _launches,
    "memcpys_per_step": _memcpys,
    "busy": _busy,
    "bound": lambda v, t: bound(v["bound"]),
    "phase": _phase,
    "peak": _peak,
    "occupancy_before_gemms": lambda v, t: occupancy_before_gemms(),
    "views_launch_nothing": lambda v, t: views_launch_nothing(),
    "buffer_request": lambda v, t: buffer_request(),
    "gpu_lag_grows": lambda v, t: gpu_lag_grows(v["gpu_lag_grows"]),
    "cold_start_gap": lambda v, t: cold_start_gap(v["cold_start_gap"], v.get("cold", True), v.get("ratio", 3.0)),
    "phases_present": lambda v, t: _training(phases_present()),
    "backward_over_forward_flops": _flops,
    "optimizer": _optimizer,
    "peak_phase": _peak_phase,
}
