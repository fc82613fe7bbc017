"""A training step, phase by phase: forward, backward, optimizer; and which forward op's backward is slowest.

Phases. 07_train_step.py wraps them in record_function("forward" / "backward" / "optimizer"). A trace from
another harness has what torch records by itself: torch.optim's `Optimizer.step#AdamW.step` and
`Optimizer.zero_grad#AdamW.zero_grad` spans, and the autograd engine's `autograd::engine::evaluate_function: ...`
spans. There, backward runs from the first such span to the end of the last, the optimizer is the
`Optimizer.step#` span, and forward is what lies between zero_grad (or the step's start) and backward. A phase
is a window of CPU time: an op belongs to it when it starts inside, a kernel when its launch does (on a GPU the
backward ops run on the autograd engine's own thread, so nesting alone could not place them).

Links. torch.profiler writes a flow event pair for each autograd node: {"cat": "fwdbwd", "ph": "s", "id": N} at
the forward op that made it and {"ph": "f", "id": N} at its backward op (MmBackward0 for aten::mm), each at
the op's own pid, tid and start time. parse_trace keeps complete events only, so the flows are read from the
trace file again, and only for a trace with a backward.

analyze(trace) -> data (None without a backward); render/training_text.py prints it, training_expect.py holds
07_train_step.py's guesses.
"""

from __future__ import annotations

import copy
import functools
import re
import statistics
from collections import defaultdict

from ..facts import intervals
from ..facts.kernels import (
    BOOKKEEPING_OPS,
    DTYPE_BYTES,
    GEMM_OPS,
    gemm_flops,
    input_dims,
    input_types,
    is_gemm,
    numel_of,
    shape_of,
)
from ..reading.events import BACKWARD_PREFIX, STEP_RE, Event, Step, Trace, once_per_trace
from .collectives import kind_of
from .memory import device_allocs
from .passes import (
    COMPILED_AUTOGRAD_PREFIX,
    OPTIMIZER_STEP_RE,
    PHASES,
    Compiler,
    Window,
    comm_wait,
    distributed,
    inside,
    is_compiler_span,
    phase_windows,
    under,
)

ACCUMULATE_GRAD = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
ACCUMULATE_OP = "torch::autograd::AccumulateGrad"  # inside ACCUMULATE_GRAD; its input is the gradient
MULTI_TENSOR_RE = re.compile(r"multi_tensor_apply")
TOP_LINKS = 8  # backward ops listed, the slowest first


def has_backward(trace: Trace) -> bool:
    """Does any step run the autograd engine, or a backward graph compiled by compiled autograd (a training step
    rather than an inference forward)?"""
    return any((e.cat == "cpu_op" and e.name.startswith(BACKWARD_PREFIX)) or e.name.startswith(COMPILED_AUTOGRAD_PREFIX)
               for st in trace.steps for e in st.spans)


# ------------------------------------------------------------------------------------------------ phases

_inside = inside  # a phase window's test, kept under the name the tests and this file use


def _top_level(op: Event, names: set[str]) -> bool:
    """No ancestor op of `names` above it: aten::mm inside aten::addmm's fallback is one GEMM, not two."""
    node = op.parent
    while node is not None:
        if node.cat == "cpu_op" and node.name in names:
            return False
        node = node.parent
    return True


def _outermost_op(op: Event) -> bool:
    """An op with no op above it (an annotation may be): what the Python code called, not what that op called."""
    node = op.parent
    while node is not None:
        if node.cat == "cpu_op":
            return False
        node = node.parent
    return True


def phase_facts(st: Step, window: Window, gpu: bool, compiler: Compiler | None = None) -> dict:
    """One phase of one step: CPU µs (the window's parts), GPU µs of the work launched in it (memsets and copies
    too, as in the report's time per annotation), its kernels, GEMMs and their FLOPs; compiler work left out."""
    compiler = compiler or Compiler(st)
    work = [k for k in st.gpu if _inside(k.order, window) and not compiler.owns(k.op)]  # kernels, memsets, copies
    kernels = [k for k in work if k.is_kernel]
    gemm_ops = [e for e in st.spans if e.cat == "cpu_op" and e.name in GEMM_OPS and _inside(e.ts, window)
                and _top_level(e, GEMM_OPS) and not compiler.owns(e)]
    flops = [gemm_flops(e) for e in gemm_ops]
    return {
        "cpu_us": window.length if isinstance(window, Window) else window[1] - window[0],
        "gpu_us": sum(k.dur for k in work) if gpu else None,
        "kernels": len(kernels) if gpu else None,
        "gemms": sum(is_gemm(k) for k in kernels) if gpu else len(gemm_ops),
        # None: a GEMM without recorded shapes, whose FLOPs cannot be counted (record_shapes=False)
        "gemm_flops": None if None in flops else float(sum(flops)),
    }


def _first_pass(window) -> tuple[float, float]:
    """The first backward pass of a window (a micro-batch's): where each leaf gets its gradient once."""
    return window.whole[0] if isinstance(window, Window) and window.whole else window


def _median(values: list) -> float | None:
    have = [v for v in values if v is not None]
    return statistics.median(have) if len(have) == len(values) and have else None


# ------------------------------------------------------------------------------------------------ optimizer

def optimizer_facts(st: Step, window: tuple[float, float], gpu: bool, backward=None) -> dict:
    """What the optimizer phase ran: the ops the Python code called (foreach, fused, others) and, on a GPU,
    its kernels, those of them multi-tensor kernels (one launch over a list of tensors); the gradients the first
    backward pass gave (each micro-batch gives every leaf its gradient again)."""
    first = _first_pass(backward) if backward is not None else None
    ops = [e for e in st.spans if e.cat == "cpu_op" and _inside(e.ts, window) and _outermost_op(e)
           and e.name not in BOOKKEEPING_OPS and not OPTIMIZER_STEP_RE.match(e.name)]
    kernels = [k for k in st.kernels if _inside(k.order, window)]
    foreach = sum(e.name.startswith("aten::_foreach_") for e in ops)
    fused = sum(e.name.startswith("aten::_fused_") for e in ops)
    return {
        "ops": len(ops), "foreach_ops": foreach, "fused_ops": fused, "other_ops": len(ops) - foreach - fused,
        "kernels": len(kernels) if gpu else None,
        "multi_tensor_kernels": sum(bool(MULTI_TENSOR_RE.search(k.name)) for k in kernels) if gpu else None,
        "gradients": _gradients(st, first),
    }


def _gradients(st: Step, first: tuple[float, float] | None) -> int | None:
    """Leaves given a gradient in (the first pass of) backward: one AccumulateGrad each; None where the backward
    ran as a compiled graph (compiled autograd), which accumulates them inside its kernels."""
    n = sum(e.name == ACCUMULATE_GRAD and (first is None or _inside(e.ts, first)) for e in st.spans)
    if not n and any(e.name.startswith(COMPILED_AUTOGRAD_PREFIX) for e in st.spans):
        return None
    return n


def implementation(opt: dict) -> str:
    """Which of torch.optim's implementations the optimizer's ops look like."""
    if opt["fused_ops"]:
        return "fused"
    if opt["foreach_ops"]:
        return "foreach"
    return "for-loop" if opt["other_ops"] else "?"


# ------------------------------------------------------------------------------------------------ links

def links(trace: Trace) -> list[tuple[Event, Event]]:
    """(forward op, the backward op it made) for each fwdbwd flow pair whose two ends are ops of the trace (the
    compiler's own work aside).

    An end is the op at the flow's pid, tid and start time; where several start there, the one that carries the
    autograd "Sequence number", else the innermost."""
    at: dict[tuple, list[Event]] = defaultdict(list)
    for st in trace.steps:
        compiler = Compiler(st)
        for e in st.spans:  # not the compiler's tracing on fake tensors: its nodes run no real backward
            if e.cat == "cpu_op" and not compiler.owns(e):
                at[(e.pid, e.tid, e.ts)].append(e)

    def op_at(pid, tid, ts) -> Event | None:
        here = at.get((pid, tid, ts))
        if not here:
            return None
        return min(here, key=lambda e: ("Sequence number" not in e.args, e.dur))

    ends: dict[object, dict[str, Event]] = defaultdict(dict)
    for fid, ph, pid, tid, ts in trace.flow_ends:
        if (op := op_at(pid, tid, ts)) is not None:
            ends[fid][ph] = op
    return [(e["s"], e["f"]) for e in ends.values() if "s" in e and "f" in e]


def _annotation(op: Event) -> str | None:
    """The innermost record_function around an op, below its phase's (a module path in 07's model); None when
    there is none before the phase or ProfilerStep span."""
    node = op.parent
    while node is not None and node.cat == "cpu_op":
        node = node.parent
    if node is None or node.name in PHASES or STEP_RE.match(node.name):
        return None
    return node.name


def _shapes(op: Event) -> str:
    shapes = [s for d in input_dims(op) if (s := shape_of(d)) is not None and s]
    return " x ".join(str(s) for s in shapes[:3])


def _compiling_inside(op: Event) -> float:
    """µs of compiler work inside an op (AOTAutograd compiling the backward graph the first time it runs)."""
    total, todo = 0.0, list(op.children)
    while todo:
        e = todo.pop()
        if is_compiler_span(e):
            total += e.dur
        else:
            todo.extend(e.children)
    return total


def slowest_backward(trace: Trace, pairs: list[tuple[Event, Event]], gpu: bool) -> list[dict]:
    """Backward ops grouped by (backward op, forward op, the forward op's annotation and shapes), by time per step:
    GPU time of the work launched inside the backward op on a GPU trace, its CPU span on a CPU trace (less the
    compiler's work inside it: AOTAutograd compiles the backward graph when it first runs)."""
    n = max(len(trace.steps), 1)
    own: dict[int, float] = defaultdict(float)  # id(backward op) -> GPU µs launched inside it
    if gpu:
        backward_ids = {id(b) for _, b in pairs}
        for st in trace.steps:
            for k in st.gpu:
                node = k.op
                while node is not None and id(node) not in backward_ids:
                    node = node.parent
                if node is not None:
                    own[id(node)] += k.dur
    rows: dict[tuple, dict] = {}
    for fwd, bwd in pairs:
        key = (bwd.name, fwd.name, _annotation(fwd), _shapes(fwd))
        r = rows.setdefault(key, {"backward_op": key[0], "forward_op": key[1], "forward_in": key[2],
                                  "forward_shapes": key[3], "calls": 0, "us": 0.0})
        r["calls"] += 1
        r["us"] += own[id(bwd)] if gpu else bwd.dur - _compiling_inside(bwd)
    out = [{**{k: v for k, v in r.items() if k not in ("calls", "us")}, "calls_per_step": r["calls"] / n,
            "us_per_step": r["us"] / n, "us_per_call": r["us"] / r["calls"]} for r in rows.values()]
    return sorted(out, key=lambda r: -r["us_per_step"])


# ------------------------------------------------------------------------------------------------ the analysis

def _once_per_trace(fn):
    """fn(trace) worked out once per Trace object, a copy to each caller: one report reads a training step's analysis
    in several places (the report, the flags read from the trace, each of 07's guesses), and each is a walk over every
    step. A copy, so that what one caller changes no other sees."""
    kept = once_per_trace(fn)

    @functools.wraps(fn)
    def once(trace: Trace) -> dict | None:
        return copy.deepcopy(kept(trace))
    return once


def analyze(trace: Trace) -> dict | None:
    """The training step as data; None when no step runs a backward. Per step and per phase: CPU µs, GPU µs,
    kernels, GEMMs and their FLOPs; medians over the steps; backward's GEMM FLOPs over forward's; the
    optimizer's ops and kernels; the backward ops by time with the forward op each came from (fwdbwd flows)."""
    summary = phases_summary(trace)
    if summary is None:
        return None
    pairs = links(trace)
    gpu = trace.device == "cuda"
    return {
        "device": trace.device,
        **summary,
        "links_per_step": len(pairs) / len(trace.steps),
        "slowest_backward": slowest_backward(trace, pairs, gpu)[:TOP_LINKS],
    }


def phases_summary(trace: Trace) -> dict | None:
    """The phases of a training step, without the backward links: per step and median (see analyze); None
    when no step runs a backward."""
    if not trace.steps or not has_backward(trace):
        return None
    gpu = trace.device == "cuda"
    steps, annotated = [], True
    for st in trace.steps:
        windows, from_annotations = phase_windows(st)
        annotated = annotated and from_annotations
        compiler = Compiler(st)
        facts = {p: phase_facts(st, windows[p], gpu, compiler) for p in PHASES if p in windows}
        if "backward" in windows and distributed(st):
            facts["backward"]["comm_wait_us"] = backward_wait(st, windows["backward"], gpu, compiler)
        steps.append({"number": st.number, "phases": facts,
                      "micro_batches": windows["backward"].passes if "backward" in windows else 0,
                      "compiler_us": intervals.length(compiler.holes),
                      "optimizer": optimizer_facts(st, windows["optimizer"], gpu, windows.get("backward"))
                      if "optimizer" in windows else None})
    phases = {}
    for p in PHASES:
        per = [s["phases"].get(p) for s in steps]
        if None in per:
            continue
        phases[p] = {key: _median([f.get(key) for f in per]) for key in per[0]}
    ratios = [s["phases"]["backward"]["gemm_flops"] / s["phases"]["forward"]["gemm_flops"]
              for s in steps if {"forward", "backward"} <= set(s["phases"])
              and s["phases"]["forward"]["gemm_flops"] and s["phases"]["backward"]["gemm_flops"] is not None]
    opts = [s["optimizer"] for s in steps if s["optimizer"] is not None]
    optimizer = None
    if opts:
        optimizer = {key: _median([o[key] for o in opts]) for key in opts[0]}
        optimizer["implementation"] = implementation(opts[len(opts) // 2])
        names = {m.group(1) for st in trace.steps for e in st.spans if (m := OPTIMIZER_STEP_RE.match(e.name))}
        optimizer["class"] = next(iter(names)) if len(names) == 1 else None
        # the leaves the optimizer updates: the gradients less an input's (07's MLP input wants one too)
        counted = parameters(trace)
        optimizer["parameters"] = counted[0] if counted is not None else None
    return {"phases_from": "annotations" if annotated else "torch.optim and autograd spans", "steps": steps,
            "phases": phases, "backward_over_forward_flops": statistics.median(ratios) if ratios else None,
            "micro_batches": _median([s["micro_batches"] for s in steps]), "optimizer": optimizer}


# Not as decorators: mutmut leaves decorated functions unmutated.
analyze = _once_per_trace(analyze)
phases_summary = _once_per_trace(phases_summary)


def backward_wait(st: Step, window: Window, gpu: bool, compiler: Compiler) -> float:
    """µs of backward spent waiting for communication: on a GPU, the collectives' kernels launched in backward with
    no other kernel running beside them (exposed); on a CPU, the time the backward thread ran no op (passes.py)."""
    if not gpu:
        return comm_wait(st, window, compiler)

    work = [k for k in st.gpu if _inside(k.order, window) and not compiler.owns(k.op)]
    comm = [(k.event.ts, k.event.end) for k in work if kind_of(k.name)]
    compute = [(k.event.ts, k.event.end) for k in work if not kind_of(k.name)]
    return intervals.length(comm) - intervals.common(comm, compute)










# ------------------------------------------------------------------------------------------------ memory

def memory_peak(trace: Trace) -> list[dict] | None:
    """Per step, where the allocator's running total peaks: the phase it falls in, the peak and the total held
    when forward ends (bytes above the lowest total of the step), from the "[memory]" events (profile_memory=True).
    None without such events on the trace's device."""
    allocs = device_allocs(trace) if trace.has_memory_events else []
    if not allocs:
        return None
    out = []
    for st in trace.steps:
        windows, _ = phase_windows(st)
        inside = [a for a in allocs if _inside(a.ts, (st.span.ts, st.span.end))]
        if not inside or "forward" not in windows:
            continue
        low = min(a.total - max(a.nbytes, 0) for a in inside)  # before the allocation that follows
        top = max(inside, key=lambda a: a.total)
        held = [a.total for a in inside if a.ts <= windows["forward"][1]]
        phase = next((p for p in PHASES if p in windows and _inside(top.ts, windows[p])), "between phases")
        out.append({"number": st.number, "phase": phase, "peak_bytes": top.total - low,
                    "at_forward_end_bytes": (held[-1] - low) if held else None})
    return out


# ------------------------------------------------------------------------------------------------ the run, read back

def _optimizer_shapes(st: Step, window: tuple[float, float]) -> set[tuple] | None:
    """Every tensor shape the optimizer's ops take (a foreach or fused op's tensor lists unpacked); None where an
    op's tensor lists are all recorded empty: torch records no shapes for a long list (164 tensors, a Gemma-2B of
    18 layers; 20 were recorded), so the shapes the optimizer takes are not known."""
    out = set()
    for e in st.spans:
        if e.cat != "cpu_op" or not _inside(e.ts, window):
            continue
        dims, types = input_dims(e), e.args.get("Input type")
        lists = [d for d, t in zip(dims, types) if t == "TensorList"] if isinstance(types, list) else []
        if lists and not any(lists):
            return None
        for d in dims:
            for s in ([d] if shape_of(d) is not None else d if isinstance(d, list) else []):
                if shape_of(s) is not None:
                    out.add(tuple(s))
    return out


def parameters(trace: Trace) -> tuple[int, int | None] | None:
    """(parameters, their bytes or None) in the first step: the leaves given a gradient in backward (one
    AccumulateGrad each; its input, the gradient, has the parameter's shape and dtype), less those whose shape no
    optimizer op takes (an input that wants a gradient, as 07's MLP input does). Where the optimizer's tensor
    lists were too long for torch to record, every leaf counts; without recorded shapes every such leaf counts and
    the bytes are unknown; a kept one of a dtype DTYPE_BYTES does not size leaves the bytes
    unknown too. None without a backward and an optimizer."""
    if not trace.steps:
        return None
    st = trace.steps[0]
    windows, _ = phase_windows(st)
    first = _first_pass(windows["backward"]) if "backward" in windows else None
    leaves = [e for e in st.spans if e.name == ACCUMULATE_GRAD and (first is None or _inside(e.ts, first))]
    if not leaves or "optimizer" not in windows:
        return None
    grads = []
    for leaf in leaves:
        inner = next((c for c in leaf.children if c.name == ACCUMULATE_OP), None)
        dims, types = (input_dims(inner), input_types(inner)) if inner is not None else ([], [])
        shape = shape_of(dims[0]) if dims else None
        grads.append((shape, types[0] if types else None))
    if any(shape is None for shape, _ in grads):
        return len(grads), None
    touched = _optimizer_shapes(st, windows["optimizer"])  # None: not recorded, so every leaf counts
    kept = grads if touched is None else [(shape, t) for shape, t in grads if tuple(shape) in touched]
    if any(t not in DTYPE_BYTES for _, t in kept):  # a dtype DTYPE_BYTES does not size: the count, not the bytes
        return len(kept), None
    return len(kept), sum(numel_of(shape) * DTYPE_BYTES[t] for shape, t in kept)


def recomputes_forward(trace: Trace) -> bool:
    """Activation checkpointing: an nn.Linear (aten::linear, a forward op no backward formula calls) runs inside a
    backward node in backward, rebuilding what forward dropped (not the next micro-batch's forward, not the
    compiler tracing the model)."""
    for st in trace.steps:
        windows, _ = phase_windows(st)
        if "backward" not in windows:
            continue
        compiler = Compiler(st)
        if any(e.cat == "cpu_op" and e.name == "aten::linear" and _inside(e.ts, windows["backward"])
               and under(e, BACKWARD_PREFIX) and not compiler.owns(e) for e in st.spans):
            return True
    return False






# ------------------------------------------------------------------------------------------------ expectations











