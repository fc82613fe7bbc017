"""Eager, torch.compile, max-autotune, Liger and the epilogue-fused GeGLU (or SwiGLU) MLP forward, side by side.

    python3 bench.py                                   # on the GPU machine: the "models" sweep (~5 min)
    uv run bench.py --sweep post --out bench_results/bench.json
    uv run bench.py --shapes 1x4096x11008,8192x768x3072
    uv run bench.py --sweep swiglu --out bench_results/bench_swiglu.json   # SiLU: Llama/Qwen widths

A shape is tokens x dim x hidden; 8192 x 768 x 3072 is the post's (batch 64 x seq 128). The default sweep
("models") is how models run an MLP: the post's shape and a quarter of it; decode (M = 1, 16, 64 tokens)
and prefill (M = 4096..16384) at Llama-2-7B (4096 -> 11008), Gemma-2B (2048 -> 16384) and Llama-3-8B
(4096 -> 14336) sizes; and an odd M. For each shape the variants read the same weights (one copy in memory:
share_weights) and are checked against an fp32 reference before anything is timed (correct before fast). Each
forward is then timed in ROUNDS interleaved rounds (time_interleaved: one call of each variant in turn, the first one
rotated each round); the table shows the median of the rounds. --activation silu (the swiglu sweep's default) times
the SwiGLU MLP instead: transformers' LlamaMLP eager and compiled, Liger's LigerSwiGLUMLP, FusedGatedMLP("silu")
(07_train_step.py's eager_mlp and swapped make the variants).

The timer: CUDA events around each call, median over ~100 ms of calls, L2 evicted before every call by
*reading* 256 MB. (triton.testing.do_bench evicts by writing zeros: the dirty lines it leaves are written
back while the timed kernel runs, ~7 µs extra on a 50 µs decode kernel on the H200.)

What is timed where, at every shape: (1) each forward called from Python, as above ("µs"); (2) the same forward
captured once in a CUDA graph and replayed (graph_replay), timed the same way ("graph µs"): the GPU's time alone;
where it is much lower than "µs" the forward waits on the host (Python, Dynamo guards, launches); (3) "host µs per
call": how long the host takes to enqueue one forward when it does not wait for the GPU (host_bursts_us: 5 bursts of
100 calls, fewer where 100 would be more than HOST_BURST_MS of GPU work, at least 20). "fused vs best of the others"
is then set by the graph replays (the best other by graph time; "SLOWER" only beyond both variants' spread over the
graph rounds), and beside it the same from Python and fused's host µs per call against eager's (eager / fused:
>= 1.00 where fused enqueues no slower; the spread of the bursts). The graph rounds take about as long as the rounds
from Python, the bursts at most a few seconds a prefill shape. Records made before every row had graphs (no
"graph_every_row") have them at M <= 128 only; their tables print as they did, compared from Python
(bench_tables.py).

The yardstick is measured in the same run: an 8192^3 matmul gives the GEMM ceiling (TFLOP/s), a 1 GiB
device copy the memory ceiling (TB/s, bytes read + written). The floor of a shape is the larger of
FLOPs / GEMM ceiling (6 * M * dim * hidden) and bytes / copy bandwidth, where the bytes are what no
forward can avoid moving: the three weights once, x in and y out. Large M is compute-bound; decode is
memory-bound (the weights). "of floor" = floor / time (1.00 = at the ceiling). max-autotune
(`mode="max-autotune-no-cudagraphs"`, what a user tries next) compiles for ~20 s a shape, so by default
it runs at MAX_AUTOTUNE_SHAPES only (--max-autotune all|none). "parts" times (graph replays) the fused
kernels alone against what they replace: cuBLAS on x @ [Wg; Wu]^T, one GEMM of N = 2 * hidden; and
the down_proj GEMM.

Prints a table per shape and a summary (bench_tables.py makes them from the record); writes a JSON record (device,
versions, date, ceilings, per-shape floors, per-variant median µs, graph µs and host µs with their rounds) to --out.
"""

import argparse
import copy
import datetime
import importlib
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from trace_reader.render.plot import bench_chart_next_to

import common

# The tables (bench_tables.py), re-exported: bench_train.py, the tests and the pages' checks call them as bench.NAME
from bench_tables import (  # noqa: F401
    MLP_NAMES,
    ceilings_line,
    fused_vs_best,
    host_vs_eager,
    markdown_table,
    shape_lines,
    spread,
    summary_lines,
    table_text,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SWEEPS = {
    "models": ",".join([
        "8192x768x3072", "2048x768x3072",  # the post's shape, and a quarter of its tokens
        "1x4096x11008", "16x4096x11008", "64x4096x11008", "4096x4096x11008",  # Llama-2-7B: decode, prefill
        "1000x4096x11008",  # an odd M: a short prompt
        "1x2048x16384", "64x2048x16384", "16384x2048x16384",  # Gemma-2B
        "1x4096x14336", "8192x4096x14336",  # Llama-3-8B
    ]),
    "post": "8192x768x3072,2048x768x3072,8192x4096x14336",
    # SwiGLU (--activation silu) at Llama-3-8B, Qwen2-7B and Qwen2-0.5B widths: decode, an odd M, prefill (not
    # 1x896x4864: a held-out width of results/bench_unlisted_h200.json)
    "swiglu": "1x4096x14336,64x4096x14336,4096x4096x14336,1x3584x18944,1000x3584x18944,4096x3584x18944,16x896x4864,"
              "4096x896x4864",
    # Between decode and prefill (chunked prefill, batched decode) at Gemma-2-2B, Llama-2-7B and Llama-3-8B
    # widths, plus odd M: as many shapes as "models" again, so a sweep of its own (~5 min on the H200).
    "middle": ",".join([f"{M}x{width}" for width in ("2304x9216", "4096x11008", "4096x14336")
                        for M in (128, 256, 384, 512, 768)] + ["200x4096x14336", "600x2304x9216"]),
}
# max-autotune compiles for ~20 s a shape (H200): by default only here, a decode, a prefill and the post's.
MAX_AUTOTUNE_SHAPES = {(8192, 768, 3072), (1, 4096, 11008), (64, 4096, 11008), (4096, 4096, 11008)}
# A host-time burst enqueues 100 calls, fewer where they would keep the GPU busy for more than this (at least 20):
# at prefill sizes a call is milliseconds of GPU work, and 100 of them would only be waited for.
HOST_BURST_MS = 50
# The GPU's clock follows its power draw and heat: on the H200 the same eager forward took 4.39 and
# 4.84 ms minutes apart at the large shape. Rounds with a rotating order keep any variant from always
# running last, on the hottest GPU. Five, not three: on the lent H200 a busy host slowed two consecutive rounds
# of the host-bound variants at one shape or another in each of two runs, and a median of three kept one of them.
# Interleaved call by call, not 100 ms of one variant then the next: in the last round-robin sweep
# (results/bench_round_robin_h200.json) the compute-bound rows' rounds moved by up to 9% from one to the next (fused at
# 8192x4096x14336: 4197 to 4603 µs), so two variants' medians came from different moments of the GPU.
ROUNDS = 5
WEIGHTS = "one copy, read by every variant (share_weights)"  # records made before say nothing: a copy per variant
INTERLEAVED = "interleaved rounds (one call of each variant in turn)"  # how time_interleaved's records say they timed
NO_GPU = "bench.py needs a CUDA GPU; torch.cuda.is_available() is False here (run it on the GPU machine)"


def cuda_missing(device: str, script: str, cpu_hint: str) -> bool:
    """True, after one line on stderr, when a benchmark is asked for CUDA on a machine without it."""
    if device != "cuda" or torch.cuda.is_available():
        return False
    print(f"{script} needs a CUDA GPU; torch.cuda.is_available() is False here "
          f"(run it on the GPU machine, or try --device cpu for {cpu_hint})", file=sys.stderr)
    return True


class Parser(argparse.ArgumentParser):
    """Every benchmark's command line (bench.py, bench_attention.py, bench_model.py): a bad flag is one line,
    `<prog>: <message>`, and exit code 2, not argparse's usage block."""

    def error(self, message):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def shape_list(text):
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and 0 < int(p) <= 1 << 20 for p in parts):
            raise argparse.ArgumentTypeError(f"expected MxDIMxHIDDEN with sizes 1..{1 << 20}, got {item!r}")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def parse_args(argv=None):
    p = Parser(prog="bench.py", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="weights and activations (default bf16)")
    p.add_argument("--sweep", choices=sorted(SWEEPS), default="models",
                   help="named list of shapes: models (decode and prefill at model sizes, default), middle "
                        "(M = 128..768 and odd M at three model widths), post, or swiglu (Llama/Qwen widths)")
    p.add_argument("--activation", choices=list(MLP_NAMES), help="the gated MLP's: gelu_tanh (GeGLU, the default) or "
                   "silu (SwiGLU, the swiglu sweep's default)")
    p.add_argument("--shapes", type=shape_list, help="comma-separated MxDIMxHIDDEN, M = tokens (instead of --sweep)")
    p.add_argument("--max-autotune", choices=["some", "all", "none"], default="some",
                   help="where to run the max-autotune-no-cudagraphs peer (default some: MAX_AUTOTUNE_SHAPES)")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench.json"), help="JSON record to write")
    args = p.parse_args(argv)
    if args.shapes is None:
        args.shapes = shape_list(SWEEPS[args.sweep])
    args.activation = args.activation or ("silu" if args.sweep == "swiglu" else "gelu_tanh")
    return args


_l2_flush = None


def keep_compile_workers():
    """Inductor stops its Triton-compile worker processes after a minute idle and starts them again (each importing
    torch) at the next compile: host work that can overlap a shape's first timing rounds. Kept alive, they start
    once. (Not the only noise: on the H200 a run with them kept alive still had one shape whose host was busy.)"""
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "quiesce_async_compile_pool"):  # absent in older torch: nothing to keep
        inductor_config.quiesce_async_compile_pool = False


def median_us(fn, rep_ms=100, inference=True):
    """Median GPU time of fn in µs: CUDA events around each call, L2 evicted by a 256 MB read before each.
    inference=False for a fn that runs a backward (autograd cannot run under inference mode)."""
    return time_interleaved({"fn": fn}, inference, rounds=1, rep_ms=rep_ms)["fn"][0]  # one fn, one round


def _warm_up(fn):
    """~25 ms of calls of fn (clocks up, caches filled); the ms one call took, estimated from three of them."""
    global _l2_flush
    if _l2_flush is None:  # larger than any GPU's L2; read, so it leaves no dirty lines behind
        _l2_flush = torch.empty(256 << 20, device="cuda", dtype=torch.int8)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    est_ms = max((time.perf_counter() - t0) / 3 * 1e3, 1e-3)
    for _ in range(min(int(25 / est_ms), 200)):
        fn()
    return est_ms


def _events(n):
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def _timed_call(fn, start, end):
    _l2_flush.max()
    start.record()
    fn()
    end.record()


def _median_of(events):
    return 1e3 * statistics.median(start.elapsed_time(end) for start, end in events)


def time_interleaved(fns, inference=True, rounds=ROUNDS, rep_ms=100):
    """{name: [median µs per round]}, as time_round_robin's, but each round calls the fns in turn, one call each,
    again and again (~rep_ms of calls of each; the starting fn rotated each round): a slow spell of the host, a few
    ms or a few seconds long, or a lower clock of the GPU, falls on all of them alike. Interleave fns alike: a call
    whose host time is longer than the L2 eviction's GPU time (~70 µs on the H200) is timed from an empty queue after
    a host-bound call, its host time in its span, where in a row of its own calls the GPU's queue would hide it."""
    names = list(fns)
    with torch.inference_mode(inference):
        est_ms = max(_warm_up(fns[name]) for name in names)
        calls = max(5, min(int(rep_ms / est_ms), 300))
        times = {name: [] for name in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            events = {name: _events(calls) for name in order}
            for i in range(calls):
                for name in order:
                    _timed_call(fns[name], *events[name][i])
            torch.cuda.synchronize()
            for name in names:
                times[name].append(_median_of(events[name]))
    return times


def host_bursts_us(fn, calls=100, bursts=5):
    """The host's µs per call of fn in each of `bursts` bursts of calls enqueued without waiting for the GPU (their
    launches fit in its queue: a forward launches a few kernels, 100 calls a few hundred). Where it exceeds the GPU's
    time, the forward waits on Python and launches."""
    times = []
    with torch.inference_mode():
        fn()
        for _ in range(bursts):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return times


def host_us(fn, calls=100, bursts=5):
    """The host's µs per call of fn: the median over bursts (host_bursts_us)."""
    return statistics.median(host_bursts_us(fn, calls, bursts))


def host_calls(gpu_us):
    """Calls per host burst for a call of gpu_us on the GPU: 100, or as many as fill HOST_BURST_MS (at least 20)."""
    return max(20, min(100, int(HOST_BURST_MS * 1e3 / gpu_us)))


def cpu_median_us(fn, reps=5, inference=True):
    """The CPU's stand-in for median_us: median wall time of `reps` calls after one warm-up call."""
    with torch.inference_mode(inference):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


CPU_CEILINGS = "a 512^3 matmul and a 16 MiB copy on this CPU"  # what cpu_ceilings measures, for the printed line


def cpu_ceilings(dtype):
    """The CPU's own ceilings, measured now: (TFLOP/s of a 512^3 matmul, GB/s of a 16 MiB copy read + written).
    A CPU smoke run's floors and fractions are of this CPU at these small sizes: nothing to set beside a GPU's."""
    a, w = (torch.randn(512, 512, dtype=dtype) for _ in range(2))
    src = torch.empty(1 << 24, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    return 2 * 512**3 / cpu_median_us(lambda: a @ w) / 1e6, 2 * src.numel() / cpu_median_us(lambda: dst.copy_(src)) / 1e3


def timing_fields(cuda, rounds=ROUNDS, rep_ms=100, interleaved=False):
    """A round-robin (or interleaved) benchmark record's "timer" and "ceiling_gemm": how it timed, and the ceiling's
    matmul."""
    if cuda:
        each = "" if rep_ms == 100 else f" of ~{rep_ms} ms of calls each"
        how = INTERLEAVED if interleaved else "round-robin rounds"
        return {"timer": f"bench.median_us (CUDA events, L2 evicted before each call); middle of {rounds} {how}"
                         f"{each}", "ceiling_gemm": "8192x8192x8192"}
    return {"timer": "bench.cpu_median_us: time.perf_counter median of 5 calls (CPU smoke test)",
            "ceiling_gemm": "512x512x512"}


def versions(device="cuda"):
    """What a benchmark record says about where it ran: device, versions, date (UTC)."""
    try:
        import triton
    except ImportError:  # a CPU smoke run on a machine without Triton's wheels
        triton = None
    cuda = device == "cuda"
    return {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "CPU", "device_type": device,
            "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
            "torch": torch.__version__, "triton": triton and triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_record(out, record, table_lines):
    """The JSON record at `out` and its table beside it (.txt); a crash mid-write leaves an earlier record whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(out)
    out.with_suffix(".txt").write_text("\n".join(table_lines) + "\n")
    return f"\nwrote {out}\n      {out.with_suffix('.txt')}"


def time_round_robin(fns, inference=True, rounds=ROUNDS, rep_ms=100):
    """{name: [median µs per round]}: `rounds` rounds over all fns, the starting point rotated each round; each
    round times ~rep_ms of calls of each fn (median_us)."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(median_us(fns[name], rep_ms=rep_ms, inference=inference))
    return times


def middle(values):
    return sorted(values)[len(values) // 2]


def graph_replay(fn, inference=True, warm_ups=1):
    """fn captured once in a CUDA graph; replays time the GPU work alone, without Python or launch cost. Warmed up
    first on a side stream, as capture wants (PyTorch's CUDA-graph notes): warm_ups calls, under inference mode
    unless inference=False (a fn that runs a backward)."""
    with torch.inference_mode(inference):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            for _ in range(warm_ups):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return graph.replay


def gemm_ceiling_tflops(dtype):
    # Random data: a matmul on zeros runs faster than on real data (METHOD.md).
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=dtype) for _ in range(2))
    return 2 * 8192**3 / median_us(lambda: a @ b, rep_ms=300) / 1e6


def copy_bandwidth_tbps():
    """The memory ceiling: a 1 GiB device-to-device copy, bytes read + written per second."""
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_us(lambda: dst.copy_(src), rep_ms=300) / 1e6


def roofline(M, dim, hidden, elem_bytes, ceiling_tflops, bandwidth_tbps):
    """The MLP forward's floor: max(FLOPs / GEMM ceiling, unavoidable bytes / copy bandwidth)."""
    flops = 2 * M * dim * hidden * 3  # three GEMMs
    moved = elem_bytes * (3 * dim * hidden + 2 * M * dim)  # the weights once, x in, y out
    compute_us, memory_us = flops / ceiling_tflops / 1e6, moved / bandwidth_tbps / 1e6
    return {"flops": flops, "bytes": moved, "floor_compute_us": compute_us, "floor_memory_us": memory_us,
            "floor_us": max(compute_us, memory_us), "bound": "compute" if compute_us >= memory_us else "memory"}


def share_weights(source, *modules):
    """Give each module source's weight Parameters (gate_proj, up_proj, down_proj: the same objects, so the same
    memory). Where a variant's weights lay moved a GEMM's time by up to 2% on the H200: at 384x4096->14336 the fused
    MLP against torch.compile was 1.00x as the second shape of a run and 1.04x with the allocator's cache emptied
    before it, same code, two runs each (a probe, 2026-12-04). Reading one copy, the variants differ in their code only."""
    for module in modules:
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(module, name).weight = getattr(source, name).weight


def build_variants(M, dim, hidden, dtype, max_autotune, act="gelu_tanh"):
    mlps = importlib.import_module("07_train_step")  # the eager MLP, Liger's and the fused one, for this activation
    eager = mlps.eager_mlp(dim, hidden, act).cuda().to(dtype).eval()
    # same parameter names; gate and up end in one storage (packed)
    fused = mlps.swapped("fused", eager, dim, hidden, act).cuda().to(dtype).eval()
    share_weights(fused, eager)  # the old copy is freed: one copy of the weights in memory, read by every variant
    variants = {"eager": eager, "compile": torch.compile(eager, dynamic=False)}
    if max_autotune:  # its own module: two compiled wrappers never share Dynamo's cache entry; the same weights
        own = copy.deepcopy(eager)
        share_weights(fused, own)
        variants["max-autotune"] = torch.compile(own, mode="max-autotune-no-cudagraphs", dynamic=False)
    try:
        variants["liger"] = mlps.swapped("liger", eager, dim, hidden, act).cuda().to(dtype).eval()
        share_weights(fused, variants["liger"])
    except common.Fail:  # liger-kernel not installed: reported as a skipped variant, never as a time
        pass
    variants["fused"] = fused
    reference = mlps.eager_mlp(dim, hidden, act).cuda().float().eval()
    reference.load_state_dict(eager.state_dict())
    return variants, reference


def bench_shape(M, dim, hidden, dtype, tol, ceiling, bandwidth, max_autotune, act="gelu_tanh"):
    from fused_geglu import down_proj, geglu, kernel_path, packs_gate_up, small_m_config

    torch._dynamo.reset()  # a fresh cache per shape: no recompile limit across a long sweep
    variants, reference = build_variants(M, dim, hidden, dtype, max_autotune, act)
    x = torch.randn(M, dim, device="cuda", dtype=dtype)
    with torch.inference_mode():
        ref = reference(x.float())
        errors, held = {}, {}
        for name, model in variants.items():
            before = torch.cuda.memory_allocated()
            y = model(x)
            errors[name] = common.rel_error(y, ref)  # vs fp32: eager itself rounds g, u, m
            del y
            # What the first call leaves allocated beyond the parameters (a packed copy of weights would show).
            held[name] = torch.cuda.memory_allocated() - before
            # Correct before fast: a wrong variant stops the run before any number is printed.
            if not (math.isfinite(errors[name]) and errors[name] <= tol):
                raise AssertionError(f"{name} at {M}x{dim}x{hidden}: relative error {errors[name]:.2e} > {tol:.0e}")
    result = {"M": M, "dim": dim, "hidden": hidden, "activation": act,
              **roofline(M, dim, hidden, x.element_size(), ceiling, bandwidth), "variants": {}, "parts": {}}
    # model=model binds each variant now, not the loop's last value.
    calls = {name: (lambda model=model: model(x)) for name, model in variants.items()}
    rounds = time_interleaved(calls)
    # The same forwards replayed from CUDA graphs, at every M: GPU time only, what fused is set against the others
    # by. Where the two columns differ, the forward waits on the host (Python, guards, launches), not on the GPU.
    # (The graphs, and the memory their pools hold, are freed when the call returns.)
    graph_rounds = time_interleaved({name: graph_replay(fn) for name, fn in calls.items()})
    for name in variants:
        graph_us = middle(graph_rounds[name])
        bursts = host_bursts_us(calls[name], calls=host_calls(graph_us))
        result["variants"][name] = {"median_us": middle(rounds[name]), "rounds_us": rounds[name],
                                    "graph_median_us": graph_us, "graph_rounds_us": graph_rounds[name],
                                    "host_us": statistics.median(bursts), "host_bursts_us": bursts,
                                    "rel_err": errors[name], "held_bytes": held[name]}
    result["skipped"] = ([] if "liger" in variants else ["liger (liger-kernel is not installed)"]) + \
        ([] if max_autotune else ["max-autotune (not at this shape: --max-autotune all)"])

    # The fused kernels alone vs the cuBLAS work they replace (gate+up as one N = 2*hidden GEMM).
    fused = variants["fused"]
    w_gate, w_up = fused.gate_proj.weight.detach(), fused.up_proj.weight.detach()
    w_cat = torch.cat([w_gate, w_up])  # cuBLAS's best case, one GEMM: made here for the comparison only
    m = geglu(x, w_gate, w_up, activation=act)
    w_down = fused.down_proj.weight.detach()
    result["fused_path"] = kernel_path(x, w_gate, w_up)
    # cuBLAS: gate and up as one GEMM over the packed weights, or as two (fused_geglu.packs_gate_up); None: a kernel
    result["fused_gate_up_gemms"] = (1 if packs_gate_up(x.device, M, dim) else 2) if result["fused_path"] == "torch" \
        else None
    parts = {"fused geglu kernel": graph_replay(lambda: geglu(x, w_gate, w_up, activation=act)),
             "cuBLAS gate+up GEMM": graph_replay(lambda: F.linear(x, w_cat)),
             "cuBLAS down_proj GEMM": graph_replay(lambda: F.linear(m, w_down))}
    if small_m_config(M, "down") is not None:
        parts["fused down_proj kernel"] = graph_replay(lambda: down_proj(m, w_down))
    result["parts"] = {name: middle(r) for name, r in time_interleaved(parts).items()}
    return result


def _tuned_rows(path):
    """The table tune_fused.py wrote (where it was measured, and its rows), without its timings; None if none."""
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return {key: table[key] for key in ("device", "capability", "date", "geglu", "down", "packing") if key in table}


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    keep_compile_workers()
    ceiling, bandwidth = gemm_ceiling_tflops(dtype), copy_bandwidth_tbps()
    try:
        from importlib.metadata import version
        liger_version = version("liger-kernel")
    except Exception:
        liger_version = None
    from fused_geglu import HOPPER_CONFIG, PORTABLE_CONFIG, SMALL_M_CONFIGS, TUNED_TABLE

    results = []
    record = {
        **versions("cuda"), "liger_kernel": liger_version,
        "dtype": args.dtype, "activation": args.activation,
        "timer": f"CUDA events, median over ~100 ms of calls, L2 evicted by a 256 MB read before each call; "
                 f"middle of {ROUNDS} {INTERLEAVED}",
        "weights": WEIGHTS,
        # every shape's variants also replayed from CUDA graphs, and their host µs per call: the tables compare
        # those (records without the field have them at M <= 128 only, and compare the times from Python)
        "graph_every_row": True,
        "graph_timer": f"the same forward captured in a CUDA graph and replayed, timed as above ({ROUNDS} "
                       f"{INTERLEAVED})",
        "host_timer": f"bench.host_bursts_us: µs per call over a burst of calls enqueued without waiting for the GPU, "
                      f"100 a burst or as many as fill ~{HOST_BURST_MS} ms of the GPU's time (at least 20); the median "
                      f"of 5 bursts",
        "ceiling_tflops": ceiling, "ceiling_gemm": "8192x8192x8192",
        "copy_tbps": bandwidth, "copy": "1 GiB device-to-device, bytes read + written",
        "floor": "max(6*M*dim*hidden / ceiling, bytes / copy) with bytes = the 3 weights + x + y",
        "fused_config": {"hopper": HOPPER_CONFIG, "portable": PORTABLE_CONFIG, "small_m": SMALL_M_CONFIGS,
                         # the kernel per M bucket tune_fused.py measured, where it applies to this GPU
                         "tuned": _tuned_rows(TUNED_TABLE)},
        "shapes": results,
    }
    print(ceilings_line(record))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Shapes done so far go to OUT.partial (a long sweep that is cut short still shows what it measured);
    # --out itself is only ever replaced by a complete record.
    partial = args.out.with_name(args.out.name + ".partial")
    try:
        for M, dim, hidden in args.shapes:
            tuned = {"all": True, "none": False, "some": (M, dim, hidden) in MAX_AUTOTUNE_SHAPES}[args.max_autotune]
            results.append(bench_shape(M, dim, hidden, dtype, common.TOLERANCE[dtype], ceiling, bandwidth, tuned,
                                       args.activation))
            print("\n".join(shape_lines(results[-1], ceiling, bandwidth, graphs=True)))
            partial.write_text(json.dumps(record, indent=2) + "\n")
    except AssertionError as e:
        partial.unlink(missing_ok=True)
        print(f"bench.py: wrong result, nothing timed for this shape: {e}", file=sys.stderr)
        return 1
    print("\n".join(summary_lines(results, graphs=True)))
    print(write_record(args.out, record, table_text(record).splitlines()))
    partial.unlink(missing_ok=True)
    print(bench_chart_next_to(record, args.out, f"{MLP_NAMES[args.activation]} MLP forward"))  # the numbers, as bars
    return 0


if __name__ == "__main__":
    sys.exit(main())
