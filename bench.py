"""Eager, torch.compile, Liger and the epilogue-fused GeGLU MLP forward, side by side on one GPU.

    python3 bench.py                                   # on the GPU machine
    uv run bench.py --dtype bf16 --shapes 8192x768x3072 --out bench_results/bench.json

A shape is tokens x dim x hidden; 8192 x 768 x 3072 is the post's (batch 64 x seq 128). For each
shape the four variants get the same weights and are checked against an fp32 reference before
anything is timed (correct before fast). Then each forward is timed with triton.testing.do_bench
(median, L2 flushed before every run), in ROUNDS round-robin rounds with the order rotated each
round; the table shows the median of the rounds. "graph µs" times the same forward replayed from a
CUDA graph: the GPU's time alone. Where it is much lower than "µs", the forward waits on the host
(Python, Dynamo guards, kernel launches): that happens at small M.

The yardstick is measured in the same run: a dtype 8192^3 matmul gives the GEMM ceiling (TFLOP/s),
and the MLP's floor is its FLOPs, 2 * M * dim * hidden * 3 (three GEMMs), over that ceiling. No
forward runs much faster than the floor; "of floor" = floor / time (1.00 = at the ceiling).
"parts" times (graph replays) the fused kernel alone against what it replaces: cuBLAS on
x @ [Wg; Wu]^T, one GEMM of N = 2 * hidden; and the down_proj GEMM that both share.

Prints a table; writes a JSON record (device, versions, date, per-shape per-variant median µs) to --out.
"""

import argparse
import datetime
import importlib
import json
import math
import platform
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

import common

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SHAPES = "8192x768x3072,2048x768x3072,8192x4096x14336"
# The GPU's clock follows its power draw and heat: on the H200 the same eager forward took 4.39 and
# 4.84 ms minutes apart at the large shape. Rounds with a rotating order keep any variant from always
# running last, on the hottest GPU.
ROUNDS = 3
NO_GPU = "bench.py needs a CUDA GPU; torch.cuda.is_available() is False here (run it on the GPU machine)"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"bench.py: {message}", file=sys.stderr)
        sys.exit(2)


def _shapes(text):
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and 0 < int(p) <= 1 << 20 for p in parts):
            raise argparse.ArgumentTypeError(f"expected MxDIMxHIDDEN with sizes 1..{1 << 20}, got {item!r}")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def parse_args(argv=None):
    p = _Parser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="weights and activations (default bf16)")
    p.add_argument("--shapes", type=_shapes, default=_shapes(DEFAULT_SHAPES),
                   help=f"comma-separated MxDIMxHIDDEN, M = tokens (default {DEFAULT_SHAPES})")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench.json"), help="JSON record to write")
    return p.parse_args(argv)


def median_us(fn, rep_ms=100):
    import triton.testing
    with torch.inference_mode():
        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def time_round_robin(fns):
    """{name: [median µs per round]}: ROUNDS rounds over all fns, the starting point rotated each round."""
    names = list(fns)
    rounds = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rounds[name].append(median_us(fns[name]))
    return rounds


def middle(values):
    return sorted(values)[len(values) // 2]


def graph_replay(fn):
    """fn captured once in a CUDA graph; replays time the GPU work alone, without Python or launch cost."""
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
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


def build_variants(M, dim, hidden, dtype):
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    from fused_geglu import FusedGeGLUMLP

    eager = SimpleGeGLUMLP(dim, hidden).cuda().to(dtype).eval()
    variants = {"eager": eager, "compile": torch.compile(eager, dynamic=False)}
    try:
        from liger_kernel.transformers.geglu import LigerGEGLUMLP
    except ImportError:
        LigerGEGLUMLP = None  # reported as a skipped variant, never as a time
    if LigerGEGLUMLP is not None:
        config = types.SimpleNamespace(hidden_size=dim, intermediate_size=hidden, hidden_act="gelu_pytorch_tanh")
        variants["liger"] = LigerGEGLUMLP(config).cuda().to(dtype).eval()
    variants["fused"] = FusedGeGLUMLP(dim, hidden).cuda().to(dtype).eval()
    for name in ("liger", "fused"):
        if name in variants:
            variants[name].load_state_dict(eager.state_dict())  # same parameter names
    reference = SimpleGeGLUMLP(dim, hidden).cuda().float().eval()
    reference.load_state_dict(eager.state_dict())
    return variants, reference


def bench_shape(M, dim, hidden, dtype, tol, ceiling):
    from fused_geglu import geglu_packed, kernel_path

    variants, reference = build_variants(M, dim, hidden, dtype)
    x = torch.randn(M, dim, device="cuda", dtype=dtype)
    with torch.inference_mode():
        ref = reference(x.float())
        errors = {}
        for name, model in variants.items():
            y = model(x)
            errors[name] = common.rel_error(y, ref)  # vs fp32: eager itself rounds g, u, m
            # Correct before fast: a wrong variant stops the run before any number is printed.
            if not (math.isfinite(errors[name]) and errors[name] <= tol):
                raise AssertionError(f"{name} at {M}x{dim}x{hidden}: relative error {errors[name]:.2e} > {tol:.0e}")
    flops = 2 * M * dim * hidden * 3
    result = {"M": M, "dim": dim, "hidden": hidden, "flops": flops, "floor_us": flops / ceiling / 1e6,
              "variants": {}, "parts": {}}
    # model=model binds each variant now, not the loop's last value.
    calls = {name: (lambda model=model: model(x)) for name, model in variants.items()}
    rounds = time_round_robin(calls)
    # The same forwards replayed from CUDA graphs: GPU time only. Where the two columns differ, the
    # forward waits on the host (Python, guards, launches), not on the GPU.
    graph_rounds = time_round_robin({name: graph_replay(fn) for name, fn in calls.items()})
    for name in variants:
        result["variants"][name] = {"median_us": middle(rounds[name]), "rounds_us": rounds[name],
                                    "graph_median_us": middle(graph_rounds[name]),
                                    "graph_rounds_us": graph_rounds[name], "rel_err": errors[name]}
    result["skipped"] = [] if "liger" in variants else ["liger (liger-kernel is not installed)"]

    # The fused kernel alone vs the cuBLAS work it replaces (gate+up as one N = 2*hidden GEMM).
    fused = variants["fused"]
    packed = fused.packed_gate_up()
    w_cat = torch.cat([fused.gate_proj.weight, fused.up_proj.weight]).detach()
    m = geglu_packed(x, packed)
    w_down = fused.down_proj.weight.detach()
    result["fused_path"] = kernel_path(x, packed)
    rounds = time_round_robin({  # GPU time of each kernel alone (graph replays)
        "fused geglu kernel": graph_replay(lambda: geglu_packed(x, packed)),
        "cuBLAS gate+up GEMM": graph_replay(lambda: F.linear(x, w_cat)),
        "cuBLAS down_proj GEMM": graph_replay(lambda: F.linear(m, w_down)),
    })
    result["parts"] = {name: middle(r) for name, r in rounds.items()}
    return result


def print_shape(r, ceiling):
    print(f"\nM={r['M']} dim={r['dim']} hidden={r['hidden']}: {r['flops'] / 1e9:.1f} GFLOP, "
          f"floor {r['floor_us']:.1f} µs at {ceiling:.0f} TFLOP/s")
    print(f"  {'variant':<12}{'µs':>9}{'spread':>8}{'TFLOP/s':>9}{'of floor':>10}{'vs eager':>10}"
          f"{'graph µs':>10}{'of floor':>10}{'rel err':>10}")
    eager_us = r["variants"]["eager"]["median_us"]
    for name, v in r["variants"].items():
        us = v["median_us"]
        spread = (max(v["rounds_us"]) - min(v["rounds_us"])) / us  # across rounds: the noise to beat
        graph_us = v["graph_median_us"]
        print(f"  {name:<12}{us:9.1f}{spread:8.1%}{r['flops'] / us / 1e6:9.0f}{r['floor_us'] / us:10.2f}"
              f"{eager_us / us:9.2f}x{graph_us:10.1f}{r['floor_us'] / graph_us:10.2f}{v['rel_err']:10.1e}")
    for note in r["skipped"]:
        print(f"  skipped: {note}")
    others = [v for k, v in r["variants"].items() if k != "fused"]
    fused = r["variants"]["fused"]
    print(f"  fused vs best of the others: {min(v['median_us'] for v in others) / fused['median_us']:.2f}x"
          f" (graph replays: {min(v['graph_median_us'] for v in others) / fused['graph_median_us']:.2f}x)")
    gemm_flops = 2 * r["M"] * r["dim"] * r["hidden"]
    for name, us in r["parts"].items():
        n_gemms = 1 if "down" in name else 2
        print(f"  part (graph): {name:<22}{us:9.1f} µs{n_gemms * gemm_flops / us / 1e6:8.0f} TFLOP/s")


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    import triton

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    ceiling = gemm_ceiling_tflops(dtype)
    print(f"{torch.cuda.get_device_name()}: {args.dtype} 8192^3 matmul {ceiling:.0f} TFLOP/s (the ceiling)")
    results = []
    try:
        for M, dim, hidden in args.shapes:
            results.append(bench_shape(M, dim, hidden, dtype, common.TOLERANCE[dtype], ceiling))
            print_shape(results[-1], ceiling)
    except AssertionError as e:
        print(f"bench.py: wrong result, nothing timed for this shape: {e}", file=sys.stderr)
        return 1
    try:
        from importlib.metadata import version
        liger_version = version("liger-kernel")
    except Exception:
        liger_version = None
    from fused_geglu import HOPPER_CONFIG, PORTABLE_CONFIG

    record = {
        "device": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "liger_kernel": liger_version, "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype": args.dtype,
        "timer": f"triton.testing.do_bench median (L2 flushed per run); middle of {ROUNDS} round-robin rounds",
        "ceiling_tflops": ceiling, "ceiling_gemm": "8192x8192x8192",
        "fused_config": {"hopper": HOPPER_CONFIG, "portable": PORTABLE_CONFIG},
        "shapes": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
