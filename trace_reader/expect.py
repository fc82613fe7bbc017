"""Expectations, "guess first, then look": Expect, its builders, check() and print_expectations()."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .kernels import GEMM_OPS, VIEW_OPS, _view_cuda_time, gemm_operands, is_gemm, op_dtype, short
from .read import OCCUPANCY, STEP_RE, Trace, TraceError, plural, real_steps
from .report import bound_of


COMPILED_REGION = "Torch-Compiled Region"  # the CPU span around a torch.compile'd call: "Torch-Compiled Region: 0/0"


class NotApplicable(str):
    """What a check returns when the trace cannot answer it (e.g. no annotations): "not applicable", not broken."""


@dataclass
class Expect:
    text: str  # the guess, in the post's words
    check: Callable[[Trace], bool | str]  # True = confirmed; False or a str (what was seen instead) = broken
    device: str = "any"  # "any", "cuda" (GPU-only: "not applicable" on a CPU trace) or "cpu"


def _need_steps(trace: Trace) -> str | None:
    """None when the trace has steps to count per; else why not. A trace recorded without prof.step() cannot
    answer a per-step guess (not applicable: steps() alone says the steps are missing); a trace with steps but
    none active is a run that recorded nothing it meant to (broken)."""
    if trace.steps:
        return None
    return (NotApplicable("no ProfilerStep#N spans (recorded without prof.step()): nothing to count per step")
            if trace.whole else "no active steps in the trace")


need_steps = _need_steps  # its public name, for the files outside this one (declared.py)


# record_function spans torch writes by itself, in any harness: torch.optim's step and zero_grad, Inductor's around
# a compiled graph's call, Dynamo's compile steps, DDP's forward, FSDP's hooks, gloo's and NCCL's collectives.
TORCH_SPAN_RE = re.compile(r"^(?:Optimizer\.(step|zero_grad)#|## Call CompiledFxGraph |\w+_data: compile_id=|"
                           r"DistributedDataParallel\.|FSDP::|gloo:|nccl:)")


def has_annotations(t: Trace) -> bool:
    """Any record_function span besides ProfilerStep#k and torch's own? Traces from other harnesses often have none."""
    return any(e.cat == "user_annotation" and not STEP_RE.match(e.name) and not TORCH_SPAN_RE.match(e.name)
               for st in t.steps for e in st.spans)


def steps(n: int, annotation: str) -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):  # "each step has one" says nothing about a trace with none: broken
            return str(miss)
        if len(t.steps) != n:
            return f"{len(t.steps)} active steps"
        if t.steps and not has_annotations(t):
            return NotApplicable(f"{n} active steps as guessed; no annotation in this trace, so "
                                 f"'{annotation}' cannot be looked for")
        for st in t.steps:
            if not any(e.cat == "user_annotation" and e.name == annotation for e in st.spans):
                return f"ProfilerStep#{st.number} has no '{annotation}' span"
        return True
    many = f"{n} active" if n else "active"  # 0: read from a trace without steps, whose run's --active is unknown
    return Expect(f"{many} ProfilerStep#k spans, each around a '{annotation}' record_function", run)


# The reduce kernel cuBLAS (or CUTLASS) launches after a GEMM it split along K: cublasLt::splitKreduce_kernel on
# Hopper (after nvjet_..._splitK_...), splitKreduce_kernel in older cuBLAS, cutlass::reduction::kernel::ReduceSplitK.
SPLIT_K_REDUCE_RE = re.compile(r"splitK_?reduce|ReduceSplitK|reduce_?split_?k", re.I)


def splitk_reduces(step) -> list:
    """The step's split-K reduce kernels: named so, and launched right after a GEMM kernel by the same op (the
    GEMM's own second half, which cuBLAS adds at shapes where K is long next to M x N; not a kernel of its own)."""
    ks = step.kernels
    return [k for prev, k in zip(ks, ks[1:]) if SPLIT_K_REDUCE_RE.search(k.name) and is_gemm(prev)
            and not SPLIT_K_REDUCE_RE.search(prev.name) and prev.op is k.op]


def kernels_per_step(n: int, what: str = "") -> Expect:
    """n kernels in every step, a GEMM counted once: the reduce kernel of a split-K GEMM is not counted."""
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [len(st.kernels) for st in t.steps]
        reduces = [len(splitk_reduces(st)) for st in t.steps]
        launches = [c - r for c, r in zip(counts, reduces)]
        if all(c == n for c in launches):
            return True
        return f"kernels per step: {counts}" + (f", less split-K reduces {reduces}: {launches}" if any(reduces) else "")
    return Expect(f"{n} GPU kernel{'s' if n != 1 else ''} per step" + (f" ({what})" if what else ""), run, "cuda")


def kernel(pattern: str, per_step: int | None = None, what: str = "") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for k in st.kernels if rx.search(k.name)) for st in t.steps]
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        if ok:
            return True
        seen = sorted({short(k.name, False, 60) for st in t.steps for k in st.kernels})
        return f"matches per step: {counts}; kernels seen: {seen}"
    times = f", {per_step}x per step" if per_step is not None else " in every step"
    return Expect(f"a GPU kernel matching /{pattern}/{times}" + (f" ({what})" if what else ""), run, "cuda")


def cpu_op(name: str, present: bool = True, per_step: int | None = None) -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if e.cat == "cpu_op" and e.name == name) for st in t.steps]
        if not present and not any(e.cat == "cpu_op" for st in t.steps for e in st.spans):
            return NotApplicable(f"no CPU ops recorded in the active steps: no '{name}' among none says nothing")
        if not present:
            return True if not any(counts) else f"'{name}' per step: {counts}"
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        return True if ok else f"'{name}' per step: {counts}"
    if not present:
        text = f"no '{name}' op"
    else:
        text = f"'{name}' " + (f"{per_step}x per step" if per_step is not None else "in every step")
    return Expect(text, run)


def cpu_event(pattern: str, device: str = "cpu") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if rx.search(e.name)) for st in t.steps]
        return True if all(counts) else f"matching CPU events per step: {counts}"
    return Expect(f"a CPU event matching /{pattern}/ in every step", run, device)


def occupancy_before_gemms() -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        # a split-K reduce is the GEMM's second half: neither a GEMM launch nor a pointwise one
        reduces = {id(k) for st in t.steps for k in splitk_reduces(st)}
        launched = [k for st in t.steps for k in st.kernels if id(k) not in reduces]
        gemms = [k for k in launched if is_gemm(k)]
        if not gemms:
            return "no GEMM kernels in the active steps"
        if any(k.launch is None for k in gemms):  # without the launch call, "before it" means nothing
            return f"{sum(k.launch is None for k in gemms)} GEMM kernels have no linked launch call"
        bare = [k for k in gemms if not k.occupancy_query]
        queried = [k for k in launched if not is_gemm(k) and k.occupancy_query]
        if bare or queried:
            # Say what the GEMM ops called instead: that is where to look next.
            seen = sorted({c.name for k in bare for c in k.op.calls} if bare else set())
            return (f"GEMM launches without the query: {len(bare)}/{len(gemms)}"
                    + (f" (their ops call: {', '.join(seen)})" if seen else "")
                    + f"; non-GEMM launches with it: {len(queried)}"
                    + (f" ({short(queried[0].name, False, 50)})" if queried else ""))
        return True
    return Expect(f"every GEMM launch is preceded by {OCCUPANCY}; pointwise launches are bare", run, "cuda")


def views_launch_nothing() -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        views = [op for st in t.steps for op in st.ops(VIEW_OPS)]
        if not views:
            return "no view ops in the active steps"
        if not any(st.kernels for st in t.steps):
            return "no GPU kernels in the active steps"
        below = _launching(t)
        busy = [op for op in views if id(op) in below][:3]  # the first three that launched anything are named
        if busy:
            return "; ".join(f"{op.name} launched {k} kernel(s), {t_:.1f} µs"
                             for op in busy for k, t_ in [_view_cuda_time(op)])
        return True
    return Expect("view ops (aten::t, transpose, reshape, view, ...) launch no kernel: 0 µs CUDA time",
                  run, "cuda")


def _launching(t: Trace) -> set[int]:
    """The ids of the spans that launched GPU work, themselves or through anything they called: each launching op
    and its callers, walked up until a caller already marked (views nested in views stay linear)."""
    marked: set[int] = set()
    for st in t.steps:
        for e in st.spans:
            node = e if e.kernels else None
            while node is not None and id(node) not in marked:
                marked.add(id(node))
                node = node.parent
    return marked


def bound(kind: str) -> Expect:
    if kind not in ("overhead", "compute"):
        raise ValueError(f"bound(kind): kind must be 'overhead' or 'compute', got {kind!r}")

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        b = bound_of(t)
        if b is None:
            return "no GPU work in the active steps"
        return True if b[0] == kind else f"{b[0]}-bound: the typical step's GPU is busy {100 * b[1]:.0f}%"
    return Expect(f"{kind}-bound: the typical step's GPU is busy {'<' if kind == 'overhead' else '>='} 50% "
                  "(of busy + the idle it caused)",
                  run, "cuda")


def check(trace: Trace, expectations: Iterable[Expect]) -> list[tuple[Expect, str, str]]:
    """(expect, "confirmed" | "broken" | "not applicable", detail) for each; a check that raises is broken.
    Expectations count per ProfilerStep#N: a trace recorded without steps has none to show them."""
    trace = real_steps(trace)
    results = []
    for ex in expectations:
        if ex.device not in ("any", "cuda", "cpu"):  # a typo must not turn into a silent "not applicable"
            results.append((ex, "broken", f"device must be 'any', 'cuda' or 'cpu', got {ex.device!r}"))
            continue
        if ex.device not in ("any", trace.device):
            results.append((ex, "not applicable", f"a {ex.device}-only expectation on a {trace.device} trace"))
            continue
        try:
            seen = ex.check(trace)
        except Exception as e:  # noqa: BLE001 - a failing check is a finding, not a crash
            results.append((ex, "broken", f"check raised {type(e).__name__}: {e}"))
            continue
        if seen is True:
            results.append((ex, "confirmed", ""))
        elif isinstance(seen, NotApplicable):
            results.append((ex, "not applicable", str(seen)))
        elif isinstance(seen, str):
            results.append((ex, "broken", seen))
        else:
            results.append((ex, "broken", "" if seen is False else f"check returned {seen!r}, not True"))
    return results


def print_expectations(results: list[tuple[Expect, str, str]], file=None) -> int:
    """Print each guess with its verdict; broken ones stand out. Returns how many are broken."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    console.print(Text("Expectations (guess first, then look):", style="bold"))
    for ex, verdict, detail in results:
        if verdict == "confirmed":
            line = Text("  ok      ", style="green") + Text(ex.text)
        elif verdict == "broken":
            line = Text("  BROKEN  ", style="bold red") + Text(ex.text, style="red")
            line += Text(f"\n          seen: {detail or '(no detail)'}  <- BROKEN — look here", style="bold red")
        else:
            line = Text("  n/a     ", style="dim") + Text(f"{ex.text} ({detail})", style="dim")
        console.print(line)
    count = Counter(v for _, v, _ in results)
    broken = count["broken"]
    console.print(Text(f"  {count['confirmed']} confirmed, {broken} broken, {count['not applicable']} not applicable",
                       style="bold red" if broken else "bold green"))
    return broken


# Part 1's schedule experiments: what the profiler itself adds, and how far the GPU lags the CPU.

def cold_start_gap(annotation: str, cold: bool, ratio: float = 3.0) -> Expect:
    """Cold: the first active step waits > ratio x (median of the later steps) between entering
    record_function(annotation) and its first aten op; warm: it does not."""
    from .lag import dispatch_gap

    def run(t: Trace):
        gaps = [dispatch_gap(st, annotation) for st in t.steps]
        if len(gaps) < 2 or None in gaps:
            return f"'{annotation}' -> first aten op per step (µs): {gaps}; needs 2+ steps with both"
        later = sorted(gaps[1:])[(len(gaps) - 2) // 2]
        seen = f"'{annotation}' -> first aten op per step: {', '.join(f'{g:.1f}' for g in gaps)} µs"
        return (gaps[0] > ratio * later) == cold or seen
    which = "waits longest" if cold else "does not wait long"
    return Expect(f"{'cold' if cold else 'warm'}: the first active step {which} between record_function('{annotation}') "
                  f"and its first aten op ({'>' if cold else '<='} {ratio:g}x later steps; the post: 228 vs ~5 µs cold)",
                  run, "cuda")


def gpu_lag_grows(grows: bool) -> Expect:
    """Without a sync per step and with more GPU work per step than CPU work, the GPU starts each step's
    work later after its launch than the step before (launch_lag), from the step where it lagged least on;
    with a sync per step it does not."""
    from .lag import launch_lag

    def run(t: Trace):
        lags = [launch_lag(st) for st in t.steps]
        if len(lags) < 3 or None in lags:
            return f"launch -> GPU start per step (µs): {lags}; needs 3+ steps with linked launches"
        # from its lowest on: a cold first step's slow CPU lets the GPU catch up once, before it falls behind
        low = lags.index(min(lags[:-1]))
        tail = lags[low:]
        growing = all(b > a for a, b in zip(tail, tail[1:])) and tail[-1] > 2 * tail[0] + 50
        return growing == grows or f"launch -> GPU start per step: {', '.join(f'{x:.0f}' for x in lags)} µs"
    if grows:
        text = "no sync per step, compute-bound: the GPU falls further behind the CPU each step (launch -> start lag grows)"
    else:
        text = "a sync after each step: the GPU's launch -> start lag does not grow"
    return Expect(text, run, "cuda")


BUFFER_REQUEST = "Activity Buffer Request"


def buffer_request() -> Expect:
    """schedule(wait=0, warmup=0): CUPTI's 'Activity Buffer Request' lands inside the trace (Part 1's Figure 9).
    Not a step event, so it is looked up in the trace file itself."""
    from .read import _read_json

    def run(t: Trace):
        data = _read_json(t.path)
        events = data.get("traceEvents") if isinstance(data, dict) else None
        found = any(isinstance(e, dict) and e.get("name") == BUFFER_REQUEST for e in events or [])
        return found or f"no '{BUFFER_REQUEST}' event in the trace"
    return Expect(f"wait=0, warmup=0: an '{BUFFER_REQUEST}' event on the GPU lane", run, "cuda")


# ------------------------------------------------------------------------- a script's expectations, later

# The scripts whose expectations `inspect_trace.py --expect NAME TRACE` may load (never a module named by the
# user), with the size flags their trace file names begin with (common.Run.stem: 64x128x768x3072_bf16_cold_eager).
SCRIPTS = {
    "01_matmul_add": ("size",),  # "64", or "4x64" with --batched 4
    "02_linear": ("batch", "in_dim", "out_dim"),
    "03_simple_mlp": ("batch", "seq", "dim", "hidden"),
    "03_kernels_mlp": ("batch", "seq", "dim", "hidden"),
    "04_fused_mlp": ("batch", "seq", "dim", "hidden"),
    "06_model": (),  # its flags come from the annotations and the file name: modules.model_flags
    "07_train_step": (),  # its flags come from the optimizer's ops, the kernels and the file name: training.train_flags
    "08_tensor_parallel": (),  # from distributedInfo, the collectives, the kernels and the file name: ranks.tp_flags
    "09_data_parallel": (),  # from distributedInfo, the spans, the micro-batches and the file name: data_parallel.dp_flags
}


class _ArgsFromTrace(argparse.Namespace):
    """A script's flags as the trace tells them; a flag it cannot tell is one clear error, not a guess."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TraceError(f"{self.__dict__.get('_script')}'s expectations need --{name.replace('_', '-')}, "
                         "which this trace does not say")


def args_from_trace(script: str, trace: Trace) -> _ArgsFromTrace:
    """The flags a script's run had, read from its trace: --compile from a 'Torch-Compiled Region', --active
    from the steps, --wait/--profiler-warmup from the first step's number, --sync-each-step from a
    cudaDeviceSynchronize in every step; sizes, dtype and cold/warm from the file name the suite writes (the dtype
    from a GEMM's inputs when the name does not say)."""
    trace = real_steps(trace)
    spans = [e for st in trace.steps for e in st.spans]
    first = trace.steps[0].number if trace.steps else 0
    a = _ArgsFromTrace(_script=script, active=len(trace.steps), device=trace.device,
                       compile=any(e.name.startswith(COMPILED_REGION) for e in spans),
                       profiler_warmup=min(first, 1), wait=first - min(first, 1),
                       sync_each_step=bool(trace.steps) and all(
                           any(c.name == "cudaDeviceSynchronize" for o in [st.span, *st.spans] for c in o.calls)
                           for st in trace.steps))
    words = Path(trace.path).name.split(".")[0].split("_")
    a.warmup = 1 if "warm" in words else 0
    if (dtype := next((w for w in words if w in ("bf16", "fp16", "fp32")), None)) is None:  # a renamed file
        gemm = next((e for e in spans if e.cat == "cpu_op" and e.name in GEMM_OPS and op_dtype(e)), None)
        dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(op_dtype(gemm))
    if dtype is not None:
        a.dtype = dtype
    dims = words[0].split("x") if words and all(d.isdigit() for d in words[0].split("x")) else []
    names = SCRIPTS[script]
    # a renamed file: the sizes from the first GEMM's second operand, [(B,) K, N] (the weight for 01 and 02)
    shapes = [gemm_operands(e)[1] for e in spans if e.cat == "cpu_op" and e.name in GEMM_OPS]
    b = next((s for s in shapes if s and len(s) in (2, 3)), None)
    bmm = next((int(w[3:]) for w in words if re.fullmatch(r"bmm\d+", w)), None)  # 01's --batched B: _bmmB
    if script == "01_matmul_add" and len(dims) in (1, 2):  # BxN: the name 01 gave a --batched run before _bmmB
        a.size, a.batched = int(dims[-1]), bmm or (int(dims[0]) if len(dims) == 2 else None)
    elif script == "01_matmul_add":  # Part 1's square matrices: [(B,) size, size]
        if b is not None:
            a.size, a.batched = b[-1], (b[0] if len(b) == 3 else None)
    elif script == "02_linear" and len(dims) != len(names):  # the layer's weight, transposed: [in_dim, out_dim]
        if b is not None and len(b) == 2:
            a.in_dim, a.out_dim = b
    elif script == "06_model":
        from .modules import model_flags  # modules.py builds on this file

        model_flags(a, trace, words)
    elif script == "07_train_step":
        from .training import train_flags  # training.py builds on this file

        train_flags(a, trace, words)
    elif script == "08_tensor_parallel":
        from .ranks import tp_flags  # ranks.py builds on this file

        tp_flags(a, trace, words)
    elif script == "09_data_parallel":
        from .data_parallel import dp_flags  # data_parallel.py builds on this file

        dp_flags(a, trace, words)
    elif len(dims) == len(names):
        for name, d in zip(names, dims):
            setattr(a, name, int(d))
    return a


def expectations_for(script: str, trace: Trace) -> tuple[list[Expect], str]:
    """(the script's expectations for this trace, what was read from the trace to choose them).

    A script declares them as expectations(args) (06, 07 and 08 take more, read from the trace too)."""
    if script not in SCRIPTS:
        raise TraceError(f"--expect: unknown script {script!r}; one of {', '.join(SCRIPTS)}")
    module = importlib.import_module(script)  # a fixed name from SCRIPTS: "01_..." is no identifier, hence importlib
    args = args_from_trace(script, trace)
    mode = "compile" if args.compile else "eager"
    said = f"{script} {mode}, {args.active} steps (read from the trace)"
    if script == "06_model":  # its expectations also take the layer count and whether the MLP is the post's
        phase = args.phase  # needed; the layer count is not: the guesses that need it are then not applicable
        layers = args.__dict__.get("layers")
        exps = module.expectations(args, layers, args.geglu)
        mlp = f", MLP {args.mlp}" if not args.compile else ""
        told = plural(layers, "layer") if layers else "layers not told"
        return list(exps), (f"{script} {phase}, {'CUDA graphs' if args.cuda_graphs else mode}, {told}{mlp}, "
                            f"{args.active} steps (read from the trace)")
    if script == "07_train_step":  # its expectations also take the parameters' count and bytes
        optimizer, impl, params = args.optimizer, args.optim_impl, args.params  # the first one unknown is named
        exps = module.expectations(args, params, args.param_bytes)
        return list(exps), (f"{script} {mode}, {optimizer} {impl}, MLP {args.mlp}"
                            f"{', checkpointed' if args.checkpoint else ''}, {params if params is not None else '?'} parameter tensors, "
                            f"{args.active} steps (read from the trace)")
    if script == "08_tensor_parallel":  # its expectations also take the ranks and the device
        sp = ", sequence parallel" if args.sequence_parallel else ""
        chunks = f", {args.chunks} chunks" if args.chunks > 1 else ""
        return (list(module.expectations(args, args.world, trace.device == "cuda")),
                f"{script} {mode}, TP={args.world}{sp}, MLP {args.mlp}{chunks}, {args.active} steps (read from the trace)")
    if script == "09_data_parallel":  # its expectations also take the ranks and DDP's bucket count (not in a trace)
        exps = module.expectations(args, args.world, args.buckets)
        slow = f", rank {args.slow_rank} slow" if args.slow_rank is not None else ""
        return list(exps), (f"{script} {mode}, {args.dp.upper()} over {args.world} rank(s), {args.accumulate} "
                            f"micro-batch(es) per step{slow}, {args.active} steps (read from the trace)")
    return list(module.expectations(args)), said
