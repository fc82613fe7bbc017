"""A training step's section of the report as text: the phases table, the communication wait, the compiler's
time, the optimizer's work, the slowest backward ops with their forward op (training.analyze's data)."""

from __future__ import annotations

from ..facts.format import fmt_fixed, fmt_gflop, text_table
from ..facts.kernels import short


def text(data: dict | None) -> list[str]:
    """The training section of the one-trace report."""
    if data is None:
        return []
    gpu = data["device"] == "cuda"
    unit = "GPU" if gpu else "CPU"
    main = "gpu_us" if gpu else "cpu_us"
    total = sum(f[main] or 0 for f in data["phases"].values()) or None
    rows = []
    for p, f in data["phases"].items():
        share = "-" if not total or f[main] is None else f"{100 * f[main] / total:.0f}%"
        rows.append([p, fmt_fixed(f[main]), share, *([fmt_fixed(f["kernels"], digits=0)] if gpu else []),
                     fmt_fixed(f["gemms"], digits=0), fmt_gflop(f["gemm_flops"]), *([fmt_fixed(f["cpu_us"])] if gpu else [])])
    heads = ["phase", f"{unit} µs", "share", *(["kernels"] if gpu else []), "GEMMs", "GEMM GFLOP",
             *(["CPU µs"] if gpu else [])]
    out = ["", (f"Training step, phase by phase (phases from {data['phases_from']}; per step, median over "
                f"{len(data['steps'])} steps):"),
           text_table(heads, rows, set(range(1, len(heads))))]
    ratio = data["backward_over_forward_flops"]
    out.append("=> backward's GEMMs do " + (f"{ratio:.2f}x forward's FLOPs (about 2x: a gradient for each GEMM's "
                                             "input and one for its weight, less where an input needs none; ~3x "
                                             "with activation checkpointing)" if ratio is not None else
                                             "? x forward's FLOPs (no GEMM shapes: record_shapes=True, or forward "
                                             "has no aten GEMM)"))
    if (n := data.get("micro_batches")) and n > 1:
        out.append(f"=> {n:g} forward and backward passes a step (gradient accumulation: {n:g} micro-batches to one "
                   "optimizer step); each phase above holds all of them")
    wait = data["phases"].get("backward", {}).get("comm_wait_us")
    if wait is not None:
        bwd = data["phases"]["backward"][main]
        share = f" ({100 * wait / bwd:.0f}% of it)" if bwd else ""
        out.append(f"=> backward waits {fmt_fixed(wait)} µs{share} for communication: " + (
            "collective kernels with no other kernel beside them" if gpu else
            "the thread running it ran no op of its own while collectives were in flight (DDP's gradient "
            "buckets, FSDP's all-gathers and reduce-scatters)"))
    compiling = [s for s in data["steps"] if s.get("compiler_us")]
    if compiling:
        where = ", ".join(f"#{s['number']} {fmt_fixed(s['compiler_us'])} µs" for s in compiling[:4])
        out.append(f"=> the compiler ran inside the profiled steps ({where} of CPU time: Dynamo and Inductor, a "
                   "compile or a recompile), left out of every phase")
    if (o := data["optimizer"]) is not None:
        grads, params = o["gradients"], o.get("parameters")
        params = params if params and grads and params < grads else None  # said apart only where they differ
        what = [(f"{fmt_fixed(o['ops'], digits=0)} ops ({fmt_fixed(o['foreach_ops'], digits=0)} foreach, "
                 f"{fmt_fixed(o['fused_ops'], digits=0)} fused, {fmt_fixed(o['other_ops'], digits=0)} others)")]
        each, count = ("parameter", params) if params else ("gradient", grads)
        if gpu:
            per = f", {o['kernels'] / count:.1f} per {each}" if count and o["kernels"] is not None else ""
            what.append(f"{fmt_fixed(o['kernels'], digits=0)} kernels ({fmt_fixed(o['multi_tensor_kernels'], digits=0)} "
                        f"multi-tensor{per})")
        accumulated = (f"{fmt_fixed(grads, digits=0)} gradients accumulated in backward" if grads is not None else
                       "gradients accumulated inside the compiled backward graph (compiled autograd: not counted)")
        updated = f"{fmt_fixed(params, digits=0)} parameters ({accumulated})" if params else accumulated
        out.append(f"optimizer: {o['class'] or '?'}, looks {o['implementation']}: " + ", ".join(what)
                   + f" per step, for {updated}")
    top = data["slowest_backward"]
    out.append("")
    if not top:
        out.append("Backward ops with their forward op: no fwdbwd flow links in this trace")
        return out
    out.append(f"Backward ops by {unit} time, with the forward op that made each (fwdbwd flow links, "
               f"{data['links_per_step']:g} per step):")
    out.append(text_table(["backward op", f"{unit} µs/step", "calls/step", "forward op", "inside", "forward shapes"],
                      [[short(r["backward_op"], False, 40), fmt_fixed(r["us_per_step"]), f"{r['calls_per_step']:g}",
                        short(r["forward_op"], False, 32), short(r["forward_in"] or "-", False, 32),
                        r["forward_shapes"] or "-"] for r in top], {1, 2}))
    return out
