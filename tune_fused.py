"""Measure which fused-MLP kernel and tile to run at each token count, and write the table fused_geglu reads.

    python3 tune_fused.py                       # on the GPU machine (~2 min on an H200): writes fused_geglu_tuned.json
    python3 tune_fused.py --widths all          # also Gemma-2B and Qwen2-7B widths (longer)
    python3 tune_fused.py --out /tmp/t.json     # somewhere else (fused_geglu reads only the file beside it)

For each M bucket (its upper edge: M = 1, 8, 32, ..., 16384) and each MLP width (dim -> hidden), every candidate
(kernel, config) of the gate/up GeGLU is checked against an fp32 reference, then timed as a CUDA-graph replay
(bench.median_us: median of CUDA-event times, L2 evicted by a read before each call) next to what it replaces:
cuBLAS's gate and up GEMMs with one pointwise GeGLU kernel of fused_geglu's after them ("torch", also a candidate:
where no kernel beats it, the table says to run it). The fused epilogue saves the same bytes whatever the input
width K (dim) while the GEMM's work grows with it, so the choice depends on K too: per M bucket and per class of K
(one per dim tuned, k_classes), the table keeps the candidate with the lowest geometric mean, over the class's widths,
of its time / torch's time. down_proj's small-M kernel is chosen per M bucket over all widths, against cuBLAS's
GEMM. One table per GPU kind, read at import by fused_geglu on GPUs of the same compute capability: no tuning at a
user's first call, and the same choice every run.
"""

import datetime
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import bench
import common

BUCKETS = [1, 8, 32, 64, 128, 256, 384, 512, 768, 1024, 2048, 4096, 8192, 16384]
WIDTHS = {"models": [(768, 3072), (2304, 9216), (4096, 11008), (4096, 14336)],  # the post's (GPT-2's), Gemma-2-2B,
          # Llama-2-7B, Llama-3-8B; all: + Gemma-2B, Qwen2-7B
          "all": [(768, 3072), (2304, 9216), (4096, 11008), (4096, 14336), (2048, 16384), (3584, 18944)]}
SMALL_MAX_M = 256  # the small-M kernels are tried up to here; past it their tiles are the tiled kernels' anyway
DOWN_MAX_M = 256  # down_proj: cuBLAS is a tuned GEMM; the small-M kernel only ever helps at few tokens


def small(BM, BN, BK, warps, stages, **extra):
    return dict(BM=BM, BN=BN, BK=BK, num_warps=warps, num_stages=stages, **extra)


def tma(BM, BN, BK, warps, stages, flatten, one_dot=False, group=8):
    return dict(BM=BM, BN=BN, BK=BK, GROUP_M=group, num_warps=warps, num_stages=stages, FLATTEN=flatten,
                ONE_DOT=one_dot)


def geglu_candidates(M):
    """(kernel, config) to try at M tokens: a few small-M tiles sized to M, a few persistent TMA tiles, and torch.
    BN counts columns of m: each program reads BN rows of the gate and BN of the up weight."""
    out = [("torch", None)]
    if M <= SMALL_MAX_M:
        BM = max(16, min(128, 1 << (M - 1).bit_length()))  # the smallest tensor-core row tile holding M (<= 128)
        out += [("small", small(BM, 64, 128 if BM <= 32 else 64, 4, 3)),
                ("small", small(BM, 32, 128 if BM <= 32 else 64, 4, 4)),
                ("small", small(BM, 128, 64, 8 if BM >= 64 else 4, 3))]
    if M >= 32:
        out += [("tma", tma(64, 128, 64, 4, 4, False)),
                ("tma", tma(128, 128, 64, 8, 3, True)),
                ("tma", tma(128, 128, 64, 8, 3, False)),
                ("tma", tma(128, 64, 64, 4, 4, False)),
                ("tma", tma(64, 64, 64, 4, 5, False)),
                ("tma", tma(128, 128, 64, 8, 3, True, one_dot=True)),  # the gate and up tiles interleaved on chip
                ("tma", tma(128, 128, 64, 8, 3, False, one_dot=True))]
    return out


def down_candidates(M):
    if M > DOWN_MAX_M:
        return [("torch", None)]
    BM = max(16, min(128, 1 << (M - 1).bit_length()))
    return [("torch", None), ("small", small(BM, 64, 128, 4, 4, FILL=2)), ("small", small(BM, 64, 128, 4, 4, FILL=1)),
            ("small", small(BM, 128, 64, 4, 4, FILL=1))]


def rel_error(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def time_candidates(fg, M, dim, hidden, dtype, tol):
    """{(which, kernel, config as text): µs} for gate/up (which = 'geglu') and down_proj ('down') at one shape.
    A candidate that fails to compile or gives a wrong result is left out, with one line saying why."""
    x = torch.randn(M, dim, device="cuda", dtype=dtype)
    w_gate, w_up = (torch.randn(hidden, dim, device="cuda", dtype=dtype) / dim ** 0.5 for _ in range(2))
    w_down = torch.randn(dim, hidden, device="cuda", dtype=dtype) / hidden ** 0.5
    ref = F.gelu(x.float() @ w_gate.float().T, approximate="tanh") * (x.float() @ w_up.float().T)
    m = ref.to(dtype)
    down_ref = m.float() @ w_down.float().T
    calls = {}
    for kernel, cfg in geglu_candidates(M):
        calls["geglu", kernel, json.dumps(cfg)] = (lambda k=kernel, c=cfg: fg.geglu(x, w_gate, w_up, kernel=k, config=c),
                                             ref)
    for kernel, cfg in down_candidates(M):
        fn = (lambda: F.linear(m, w_down)) if kernel == "torch" else (lambda c=cfg: fg.down_proj(m, w_down, config=c))
        calls["down", kernel, json.dumps(cfg)] = (fn, down_ref)
    times = {}
    for key, (fn, want) in calls.items():
        try:
            with torch.inference_mode():
                err = rel_error(fn(), want)
            if not err <= tol:  # correct before fast (a NaN fails too)
                raise AssertionError(f"relative error {err:.2e} > {tol:.0e}")
            times[key] = bench.median_us(bench.graph_replay(fn), rep_ms=30)
        except Exception as e:  # out of shared memory, a wrong result: this candidate is out, the sweep goes on
            print(f"  left out at {M}x{dim}x{hidden}: {key[0]} {key[1]} {key[2]}: {str(e).splitlines()[0][:160]}")
    return times


TORCH = {which: (which, "torch", json.dumps(None)) for which in ("geglu", "down")}  # the baselines' keys


def choose(per_width, which):
    """The candidate with the lowest geometric mean of time / torch's time over the widths where it ran at all."""
    keys = [k for k in per_width[0] if k[0] == which]
    scores = {}
    for key in keys:
        ratios = [t[key] / t[TORCH[which]] for t in per_width if key in t and TORCH[which] in t]
        if len(ratios) == len(per_width):  # measured at every width: no choice from a partial record
            scores[key] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    if not scores:  # torch itself missing at a width: nothing to compare with, so nothing but torch is chosen
        return TORCH[which], 1.0
    best = min(scores, key=scores.get)
    return best, scores[best]


def k_classes(widths):
    """[(largest K or None, indices of the widths in the class)]: one class per input width (dim) tuned, each up to
    the geometric middle between its dim and the next (rounded down), the widest class open-ended. A K between two
    tuned dims goes with the nearer one by ratio: the fused epilogue's share of the time falls as 1/K."""
    dims = sorted({d for d, _ in widths})
    tops = [math.isqrt(a * b) for a, b in zip(dims, dims[1:])] + [None]
    return [(top, [i for i, (d, _) in enumerate(widths) if d == dim]) for dim, top in zip(dims, tops)]


def parse_args(argv=None):
    p = bench.Parser(prog="tune_fused.py", description=__doc__.split("\n")[0])
    p.add_argument("--widths", choices=sorted(WIDTHS), default="models",
                   help="MLP widths to tune over: models (3 widths, default) or all (5)")
    p.add_argument("--dtype", choices=sorted(bench.DTYPES), default="bf16")
    p.add_argument("--out", type=Path, default=None, help="table to write (default: fused_geglu's, beside it)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_fused.py needs a CUDA GPU; torch.cuda.is_available() is False here", file=sys.stderr)
        return 2
    import fused_geglu as fg
    out = args.out or fg.TUNED_TABLE
    fg._tuned.clear()  # candidates run as asked, never through an older table
    dtype, widths = bench.DTYPES[args.dtype], WIDTHS[args.widths]
    torch.manual_seed(0)
    record = {**bench.versions("cuda"), "capability": ".".join(map(str, torch.cuda.get_device_capability())),
              "dtype": args.dtype, "widths": [f"{d}x{h}" for d, h in widths],
              "timer": "bench.median_us of a CUDA-graph replay (L2 evicted before each call), ~30 ms of calls",
              "rule": ("gate/up: per M bucket and class of K (dim), the lowest geometric mean over the class's "
                       "widths of time / torch's time; down_proj: per M bucket, over all widths"),
              "geglu": [], "down": [], "measured": []}
    print(f"{record['device']}: tuning {len(BUCKETS)} M buckets x {len(widths)} widths, {args.dtype}")
    classes = k_classes(widths)
    for i, M in enumerate(BUCKETS):
        per_width = [time_candidates(fg, M, d, h, dtype, common.TOLERANCE[dtype]) for d, h in widths]
        max_m = None if i == len(BUCKETS) - 1 else M
        line = [f"M <= {M if max_m else 'any'}:"]
        for which, groups in (("geglu", classes), ("down", [(None, list(range(len(widths))))])):
            for max_k, members in groups:
                (_, kernel, cfg), score = choose([per_width[j] for j in members], which)
                record[which].append({"max_m": max_m, **({"max_k": max_k} if which == "geglu" else {}),
                                      "kernel": kernel, "config": json.loads(cfg), "vs_torch": round(score, 3)})
                torch_us = [per_width[j][TORCH[which]] for j in members]
                line.append(f"{which}{f' K<={max_k}' if which == 'geglu' else ''} {kernel} {score:.2f}x (torch "
                            + ", ".join(f"{us:.1f}" for us in torch_us) + " µs)")
        print("  ".join(line))
        record["measured"] += [{"M": M, "dim": d, "hidden": h,
                                "us": {f"{w} {k} {c}": round(us, 2) for (w, k, c), us in t.items()}}
                               for (d, h), t in zip(widths, per_width)]
    record["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}; fused_geglu reads {fg.TUNED_TABLE} at import (commit it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
