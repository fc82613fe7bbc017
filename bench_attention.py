"""Every causal GQA attention core side by side: math, math compiled, sdpa per backend, flex compiled.

    python3 bench_attention.py                       # on the GPU machine: the default shapes, ~2 minutes
    uv run bench_attention.py --device cpu           # tiny shapes on the CPU: the same code path, no timing worth quoting

The attention core only (q, k, v in; the projections and RoPE are 05_attention.py's), at prefill shapes
(BxSxHxKVxD: batch, sequence, heads, KV heads, head_dim; causal) and decode shapes (one query token per
sequence against a KV cache of S entries). Each variant is checked against fp32 math attention before it is
timed (correct before fast); a backend that cannot run the input (sdpa's "No available kernel") is listed
as skipped, with torch's reason. Timing is bench.py's: median_us (CUDA events, L2 evicted before each call),
ROUNDS round-robin rounds with a rotating order, the middle round reported.

Yardsticks measured in the same run, with bench.py's code: the GEMM ceiling (a dtype 8192^3 matmul) for prefill,
TFLOP/s = 4*B*H*S*S*D / 2 (QK^T and PV; causal keeps half the score matrix); the device-to-device copy
bandwidth (1 GiB, read + written) for decode, GB/s = the KV cache's bytes (2*B*KV*S*D*itemsize) / time.
Prints a table, writes a JSON record (device, versions, date, per-shape per-variant median µs) to --out
and the table beside it (.txt).
"""

import argparse
import importlib
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask

import bench
import common
from trace_reader.render.plot import byte_rate, flop_rate

attention = importlib.import_module("05_attention")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# SPEC's H200 anchors: Llama-3-8B's attention, Gemma-2B's (8 heads, 1 KV head, d256), and a decode batch.
DEFAULT_PREFILL = "4x2048x32x8x128,4x2048x8x1x256"
DEFAULT_DECODE = "16x4096x32x8x128"
CPU_PREFILL, CPU_DECODE = "1x128x4x2x16", "2x256x4x2x16"
SDPA = {"sdpa default": None, "sdpa flash": SDPBackend.FLASH_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa efficient": SDPBackend.EFFICIENT_ATTENTION}


def _shapes(text):
    shapes = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 5 or not all(p.isdigit() and 0 < int(p) <= 1 << 20 for p in parts):
            raise argparse.ArgumentTypeError(f"expected BxSxHxKVxD with sizes 1..{1 << 20}, got {item!r}")
        b, s, h, kv, d = map(int, parts)
        if h % kv:
            raise argparse.ArgumentTypeError(f"{item}: {h} heads is not a multiple of {kv} KV heads")
        shapes.append((b, s, h, kv, d))
    return shapes


def parse_args(argv=None):
    p = bench.Parser(prog="bench_attention.py", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: tiny default shapes, a smoke test")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="q, k, v (default bf16)")
    p.add_argument("--prefill", type=_shapes, default=None, metavar="SHAPES",
                   help=f"comma-separated BxSxHxKVxD (default {DEFAULT_PREFILL}; on the CPU {CPU_PREFILL})")
    p.add_argument("--decode", type=_shapes, default=None, metavar="SHAPES",
                   help=f"comma-separated BxSxHxKVxD, S = KV cache length (default {DEFAULT_DECODE}; CPU {CPU_DECODE})")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench_attention.json"), help="JSON record to write")
    args = p.parse_args(argv)
    cpu = args.device == "cpu"
    args.prefill = args.prefill if args.prefill is not None else _shapes(CPU_PREFILL if cpu else DEFAULT_PREFILL)
    args.decode = args.decode if args.decode is not None else _shapes(CPU_DECODE if cpu else DEFAULT_DECODE)
    return args


def variants(decode, s, compiled_math):
    """{name: fn(q, k, v, block_mask)}: the attention cores, as 05_attention.py writes them."""
    causal = not decode

    def sdpa(backend):
        allowed = list(attention.BACKENDS.values()) if backend is None else [backend]  # default: all allowed

        def run(q, k, v, block_mask):
            with sdpa_kernel(allowed):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return run

    fns = {"math": lambda q, k, v, bm: attention.math_attention(q, k, v, causal),
           "math compiled": lambda q, k, v, bm: compiled_math(q, k, v, causal)}
    fns.update({name: sdpa(backend) for name, backend in SDPA.items()})
    fns["flex compiled"] = lambda q, k, v, bm: attention.compiled_flex_attention()(q, k, v, block_mask=bm, enable_gqa=True)
    return fns


def bench_shape(shape, decode, dtype, device, ceiling, bandwidth, compiled_math):
    b, s, h, kv, d = shape
    s_q = 1 if decode else s
    torch.manual_seed(0)
    q = torch.randn(b, h, s_q, d, device=device, dtype=dtype)
    k, v = (torch.randn(b, kv, s, d, device=device, dtype=dtype) for _ in range(2))
    # bottom-right aligned causal mask, as in 05_attention.py: query i sits at position s - s_q + i
    block_mask = create_block_mask(lambda b_, h_, qi, ki: qi + (s - s_q) >= ki, None, None, s_q, s, device=device)
    flops = 4 * b * h * s_q * s * d / (1 if decode else 2)  # causal prefill: half the score matrix
    kv_bytes = 2 * b * kv * s * d * dtype.itemsize
    result = {"shape": "x".join(map(str, shape)), "decode": decode, "flops": flops, "kv_bytes": kv_bytes,
              "variants": {}, "skipped": {}}
    with torch.inference_mode():
        ref = attention.math_attention(q.float(), k.float(), v.float(), not decode)
    calls, errors = {}, {}
    for name, fn in variants(decode, s, compiled_math).items():
        call = (lambda fn=fn: fn(q, k, v, block_mask))  # fn=fn binds each variant now, not the loop's last
        with torch.inference_mode():
            out, refused = attention.sdpa_refusal(call)
        if refused:
            result["skipped"][name] = refused
            continue
        errors[name] = common.rel_error(out, ref)
        del out
        # Correct before fast: a wrong variant stops the run before any number is printed.
        if not (math.isfinite(errors[name]) and errors[name] <= common.TOLERANCE[dtype]):
            raise AssertionError(f"{name} at {result['shape']}{' decode' if decode else ''}: relative error "
                                 f"{errors[name]:.2e} > {common.TOLERANCE[dtype]:.0e}")
        calls[name] = call
    del ref
    if device == "cuda":
        rounds = bench.time_round_robin(calls)
    else:
        rounds = {name: [bench.cpu_median_us(call)] for name, call in calls.items()}
    for name in calls:
        us = bench.middle(rounds[name])
        result["variants"][name] = {"median_us": us, "rounds_us": rounds[name], "rel_err": errors[name],
                                    "tflops": flops / us / 1e6, "of_ceiling": flops / us / 1e6 / ceiling,
                                    "gbs": kv_bytes / us / 1e3, "of_bandwidth": kv_bytes / us / 1e3 / bandwidth}
    result["fastest"] = min(result["variants"], key=lambda n: result["variants"][n]["median_us"])
    return result


def format_shape(r):
    kind = "decode, 1 query token per sequence" if r["decode"] else "prefill, causal"
    lines = [f"\n{r['shape']} (BxSxHxKVxD, {kind}): {r['flops'] / 1e9:.2f} GFLOP, KV cache {r['kv_bytes'] / 1e6:.1f} MB"]
    yard = "    KV read  of copy bw" if r["decode"] else "attention FLOP/s  of ceiling"
    lines.append(f"  {'variant':<16}{'µs':>10}{'spread':>8}  {yard}{'rel err':>10}")
    for name, v in r["variants"].items():
        spread = (max(v["rounds_us"]) - min(v["rounds_us"])) / v["median_us"]  # across rounds: the noise to beat
        rate = (f"{byte_rate(v['gbs'] / 1e3):>11}{v['of_bandwidth']:12.2f}" if r["decode"]
                else f"{flop_rate(v['tflops']):>16}{v['of_ceiling']:12.2f}")
        mark = "  <- fastest" if name == r["fastest"] else ""
        lines.append(f"  {name:<16}{v['median_us']:10.1f}{spread:8.1%}  {rate}{v['rel_err']:10.1e}{mark}")
    lines += [f"  skipped: {name}: {why}" for name, why in r["skipped"].items()]
    return "\n".join(lines)


COLUMNS = ["math", "math compiled", "sdpa default", "sdpa flash", "sdpa cudnn", "sdpa efficient", "flex compiled"]


def markdown(record):
    """The README's table, from a record: median µs per variant, the fastest in bold, "—" where skipped."""
    rows = ["| shape (BxSxHxKVxD) | " + " | ".join(COLUMNS) + " |", "| --- " * (len(COLUMNS) + 1) + "|"]
    for r in record["shapes"]:
        cells = []
        for name in COLUMNS:
            v = r["variants"].get(name)
            cell = "—" if v is None else f"{v['median_us']:.1f}"
            cells.append(f"**{cell}**" if name == r["fastest"] else cell)
        rows.append(f"| {r['shape']} {'decode' if r['decode'] else 'prefill'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    if bench.cuda_missing(device, "bench_attention.py", "tiny shapes"):
        return 2
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    if device == "cuda":
        ceiling = bench.gemm_ceiling_tflops(dtype)
        bandwidth = 1e3 * bench.copy_bandwidth_tbps()  # GB/s
    else:  # the CPU's own, smaller yardsticks: its fractions are of this CPU, nothing to quote
        ceiling, bandwidth = bench.cpu_ceilings(dtype)
    compiled_math = torch.compile(attention.math_attention, dynamic=False)
    bench.keep_compile_workers()  # no worker start-up burst inside a timing
    record = bench.versions(device)
    table = [f"{record['device']}: {args.dtype} GEMM ceiling {flop_rate(ceiling)}, device copy {byte_rate(bandwidth / 1e3)} "
             f"(measured now{'' if device == 'cuda' else ': ' + bench.CPU_CEILINGS})"]
    print(table[0])
    results = []
    try:
        for decode, shapes in ((False, args.prefill), (True, args.decode)):
            for shape in shapes:
                results.append(bench_shape(shape, decode, dtype, device, ceiling, bandwidth, compiled_math))
                table.append(format_shape(results[-1]))
                print(table[-1])
    except AssertionError as e:
        print(f"bench_attention.py: wrong result, nothing timed for this shape: {e}", file=sys.stderr)
        return 1
    record.update({
        "dtype": args.dtype,
        **bench.timing_fields(device == "cuda"),
        "ceiling_tflops": ceiling,
        "copy_gbs": bandwidth, "shapes": results,
    })
    print(bench.write_record(args.out, record, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
