"""The suite's scripts' guesses for a saved trace (--expect SCRIPT): which scripts, the flags their run had as the
trace tells them (args_from_trace), and their expectations (expectations_for). The reader never imports a script on
its own: the caller (the suite's inspect_trace.py) hands it the loader."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Callable

from .analyzers.data_parallel import dp_flags
from .analyzers.modules import model_flags
from .analyzers.ranks import tp_flags
from .analyzers.training_expect import train_flags
from .expectation import Expect
from .facts.kernels import GEMM_OPS, gemm_operands, op_dtype
from .reading.events import COMPILED_REGION, Trace, TraceError, plural, real_steps

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
        model_flags(a, trace, words)
    elif script == "07_train_step":
        train_flags(a, trace, words)
    elif script == "08_tensor_parallel":
        tp_flags(a, trace, words)
    elif script == "09_data_parallel":
        dp_flags(a, trace, words)
    elif len(dims) == len(names):
        for name, d in zip(names, dims):
            setattr(a, name, int(d))
    return a


def expectations_for(script: str, trace: Trace, load: Callable[[str], object] | None = None
                     ) -> tuple[list[Expect], str]:
    """(the script's expectations for this trace, what was read from the trace to choose them).

    A script declares them as expectations(args) (06, 07 and 08 take more, read from the trace too); load(name)
    imports the script (the suite's inspect_trace.py passes importlib.import_module). Without it, as in the reader
    installed on its own, a script's guesses are one line: they live in the suite's scripts."""
    if script not in SCRIPTS:
        raise TraceError(f"--expect: unknown script {script!r}; one of {', '.join(SCRIPTS)}")
    if load is None:
        raise TraceError(f"--expect {script}: a script's guesses live in the suite's scripts, not in this installed "
                         "reader: run `uv run inspect_trace.py --expect ...` in the suite, or give your own (--expect "
                         "FILE.toml)")
    module = load(script)  # a fixed name from SCRIPTS
    args = args_from_trace(script, trace)
    mode = "compile" if args.compile else "eager"
    said = f"{script} {mode}, {args.active} steps (read from the trace)"
    if script == "06_model":  # its expectations also take the layer count and the gated MLP's activation
        phase = args.phase  # needed; the layer count is not: the guesses that need it are then not applicable
        layers = args.__dict__.get("layers")
        exps = module.expectations(args, layers, args.act)
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
