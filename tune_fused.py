"""Measure which fused-MLP kernel and tile to run at each token count, and write the table fused_geglu reads.

    python3 tune_fused.py                       # on the GPU machine (~2 min on an H200): writes fused_geglu_tuned.json
    python3 tune_fused.py --widths all          # also Gemma-2B and Qwen2-7B widths (longer)
    python3 tune_fused.py --out /tmp/t.json     # somewhere else (fused_geglu reads only the file beside it)
    python3 tune_fused.py --packing-only        # re-measure only the packing rows of the table there (~1 min)
    python3 tune_fused.py --down-only           # re-measure only the down_proj rows of the table there
    python3 tune_fused.py --narrow-only         # re-measure only the MoE experts' rows (hidden < dim) there

For each M bucket (its upper edge: M = 1, 8, 32, ..., 16384) and each MLP width (dim -> hidden), every candidate
(kernel, config) of the gate/up GeGLU is checked against an fp32 reference, then timed as a CUDA-graph replay
(bench.median_us: median of CUDA-event times, L2 evicted by a read before each call) next to what it replaces:
cuBLAS's gate and up GEMMs with one pointwise GeGLU kernel of fused_geglu's after them ("torch", also a candidate:
where no kernel beats it, the table says to run it). The fused epilogue saves the same bytes whatever the input
width K (dim) while the GEMM's work grows with it, so the choice depends on K too: per M bucket and per class of K
(one per dim tuned, k_classes), the table keeps the candidate with the lowest geometric mean, over the class's widths,
of its time / torch's time. MoE experts (hidden < dim, NARROW_WIDTHS) have rows of their own by the same rule
(geglu_narrow): at 2048 tokens of 2048 -> 1408 the dense rows' TMA tile ran at 0.92x of eager on an H100 (issue 57's
measurement), its few output tiles filling the GPU unlike a dense MLP's. down_proj's small-M kernel is chosen against cuBLAS's GEMM per M bucket and per class
of its own input width K (hidden), at DOWN_WIDTHS, wider than the gate/up widths: at one token which of the two is
faster moves with the width by a few percent (results/tune_down_h200.txt; docs/04). Then, where the table runs
cuBLAS, whether the module's packed gate and up weights run as one GEMM of twice the width or as two: cuBLAS picks
a kernel per GEMM shape, and at some token counts the two narrower GEMMs are faster.
At each M bucket's upper edge and middle, and for each of PACKING_WIDTHS, the whole module is timed both ways
(CUDA-graph replays, one call of each in turn); a measured M packs only where the packed form was not slower by more
than PACKING_MARGIN at any width of its class of K, and an M between two measured ones only where both ends pack
(cuBLAS's choice can flip between them): the two GEMMs are what eager PyTorch and torch.compile run, so where the
table is unsure it runs theirs. One table per GPU kind, read at import by fused_geglu on GPUs of the same compute
capability: no tuning at a user's first call, and the same choice every run.
"""

import copy
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
# MoE experts (hidden < dim): Qwen3-30B-A3B's, Qwen1.5-MoE-A2.7B's (and DeepSeek-V2-Lite's), Qwen3-235B-A22B's and
# DeepSeek-V3's. Their few output columns tile the GPU unlike a dense MLP's: rows of their own (geglu_narrow).
NARROW_WIDTHS = [(2048, 768), (2048, 1408), (4096, 1536), (7168, 2048)]
# The packing rows: Gemma-2B, Gemma-2-2B, Llama-3.2-3B, Qwen2-7B, Llama-2-7B, Llama-3-8B (and Mistral-7B), Qwen2.5-14B
PACKING_WIDTHS = [(2048, 16384), (2304, 9216), (3072, 8192), (3584, 18944), (4096, 11008), (4096, 14336), (5120, 13824)]
PACKING_MARGIN = 0.005  # packed within 0.5% of the two GEMMs counts as not slower (rounds of one shape vary ~1%)
# down_proj's widths (dim, hidden): the gate/up widths', Gemma-2B's, Qwen2-7B's, Qwen2.5-14B's and Llama-3-70B's.
DOWN_WIDTHS = [(768, 3072), (2304, 9216), (4096, 11008), (5120, 13824), (4096, 14336), (2048, 16384), (3584, 18944),
               (8192, 28672)]
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
                ("small", small(BM, 128, 64, 8 if BM >= 64 else 4, 3)),
                # split K until the programs fill the GPU (FILL CTAs per SM): few output columns (an MoE expert's
                # 768..2048) give a few dozen tiles alone, on 132 SMs
                ("small", small(BM, 64, 128 if BM <= 32 else 64, 4, 4, FILL=2)),
                ("small", small(BM, 32, 128 if BM <= 32 else 64, 4, 4, FILL=1))]
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


def time_candidates(fg, M, dim, hidden, dtype, tol, geglu=True, down=True):
    """{(which, kernel, config as text): µs} for gate/up (which = 'geglu', unless geglu=False) and down_proj ('down',
    unless down=False) at one shape. A candidate that fails to compile or gives a wrong result is left out, with one line saying why."""
    x = torch.randn(M, dim, device="cuda", dtype=dtype)
    w_gate, w_up = (torch.randn(hidden, dim, device="cuda", dtype=dtype) / dim ** 0.5 for _ in range(2))
    w_down = torch.randn(dim, hidden, device="cuda", dtype=dtype) / hidden ** 0.5
    ref = F.gelu(x.float() @ w_gate.float().T, approximate="tanh") * (x.float() @ w_up.float().T)
    m = ref.to(dtype)
    down_ref = m.float() @ w_down.float().T
    calls = {}
    for kernel, cfg in geglu_candidates(M) if geglu else ():
        calls["geglu", kernel, json.dumps(cfg)] = (lambda k=kernel, c=cfg: fg.geglu(x, w_gate, w_up, kernel=k, config=c),
                                             ref)
    for kernel, cfg in down_candidates(M) if down else ():
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


def choose(per_width, which, fused_only=False):
    """The candidate with the lowest geometric mean of time / torch's time over the widths where it ran at all;
    fused_only: the best of the others (torch's own ratio, 1.0, is never chosen then; None where none ran)."""
    keys = [k for k in per_width[0] if k[0] == which and not (fused_only and k[1] == "torch")]
    scores = {}
    for key in keys:
        ratios = [t[key] / t[TORCH[which]] for t in per_width if key in t and TORCH[which] in t]
        if len(ratios) == len(per_width):  # measured at every width: no choice from a partial record
            scores[key] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    if not scores:  # torch itself missing at a width: nothing to compare with, so nothing but torch is chosen
        return (None, None) if fused_only else (TORCH[which], 1.0)
    best = min(scores, key=scores.get)
    return best, scores[best]


def k_classes(widths, at=0):
    """[(largest K or None, indices of the widths in the class)]: one class per input width tuned (K = dim for gate
    and up, at=0; K = hidden for down_proj, at=1), each up to the geometric middle between its K and the next
    (rounded down), the widest class open-ended. A K between two tuned ones goes with the nearer one by ratio: the
    fused epilogue's share of the time falls as 1/K."""
    ks = sorted({w[at] for w in widths})
    tops = [math.isqrt(a * b) for a, b in zip(ks, ks[1:])] + [None]
    return [(top, [i for i, w in enumerate(widths) if w[at] == k]) for k, top in zip(ks, tops)]


def packing_ms():
    """The token counts the packing is measured at: each M bucket's upper edge and its middle."""
    points, low = set(), 0
    for top in BUCKETS:
        points |= {max(1, (low + top) // 2), top}
        low = top
    return sorted(points)


def packing_spans(points):
    """[(largest M of a row or None, the measured Ms its choice comes from)], in order: each measured M on its own,
    and the Ms between two measured ones from both (cuBLAS's choice of kernel can flip between them: packed only
    where both ends say so); from the last measured M on, its own."""
    spans = []
    for i, M in enumerate(points):
        if i and M - 1 > points[i - 1]:
            spans.append((M - 1, [points[i - 1], M]))
        spans.append((None if i == len(points) - 1 else M, [M]))
    return spans


def apart(module):
    """A copy of a FusedGeGLUMLP whose gate and up weights have storages of their own (not packed)."""
    other = copy.deepcopy(module)
    for proj in (other.gate_proj, other.up_proj):
        proj.weight.data = proj.weight.data.clone()
    return other


def time_packing(fg, module, other, M, dtype, tol):
    """(packed µs, unpacked µs) of the whole module at M tokens, the second form `other` (apart(module)), or None
    where the plan does not run cuBLAS for gate and up (the packing does not matter there). Both forms are checked
    against an fp32 reference first."""
    dim = module.gate_proj.in_features
    x = torch.randn(M, dim, device="cuda", dtype=dtype)
    w_gate, w_up, w_down = (p.weight for p in (module.gate_proj, module.up_proj, module.down_proj))
    if fg.kernel_path(x, w_gate, w_up) != "torch":
        return None
    # one storage, and two (their addresses may still be adjacent: the plan then runs two GEMMs, as no view spans both)
    assert w_gate.untyped_storage().data_ptr() == w_up.untyped_storage().data_ptr() and fg.packed(w_gate, w_up)
    assert other.gate_proj.weight.untyped_storage().data_ptr() != other.up_proj.weight.untyped_storage().data_ptr()
    ref = (F.gelu(x.float() @ w_gate.float().T, approximate="tanh") * (x.float() @ w_up.float().T)) @ w_down.float().T
    with torch.inference_mode():
        for form in (module, other):
            err = rel_error(form(x), ref)
            if not err <= tol:
                raise AssertionError(f"{M}x{dim}: relative error {err:.2e} > {tol:.0e}")
        times = bench.time_interleaved({"packed": bench.graph_replay(lambda: module(x)),
                                        "unpacked": bench.graph_replay(lambda: other(x))}, rounds=3, rep_ms=25)
    return bench.middle(times["packed"]), bench.middle(times["unpacked"])


def choose_packing(pairs, margin=PACKING_MARGIN):
    """(packed?, the worst packed / unpacked ratio or None) over (packed µs, unpacked µs) pairs: packed where no pair
    has it slower by more than margin, and where there is no pair at all (cuBLAS does not run gate and up there)."""
    if not pairs:
        return True, None
    worst = max(p / u for p, u in pairs)
    return worst <= 1 + margin, round(worst, 3)


def measure_packing(fg, record, dtype):
    """{(M, dim, hidden): (packed µs, unpacked µs)} at each PACKING_WIDTHS width and each M of packing_ms where
    record's kernel rows run cuBLAS for gate and up."""
    fg.table.tuned.clear()
    fg.table.tuned.update({cap: {**rows, "packing": []}  # measured as the module runs without packing rows: packed
                           for cap, rows in fg.table_rows(record, "the new table").items()})
    fg.launcher.plans.clear()  # plans made under another table
    measured = {}
    for d, h in PACKING_WIDTHS:
        module = fg.FusedGeGLUMLP(d, h).to("cuda", dtype).eval()
        other = apart(module)
        for M in packing_ms():
            pair = time_packing(fg, module, other, M, dtype, common.TOLERANCE[dtype])
            if pair is not None:
                measured[M, d, h] = pair
        del module, other
    return measured


def tune_packing(fg, record, dtype):
    """record's packing rows and what they were chosen from (packing_measured), under record's kernel rows."""
    measured = measure_packing(fg, record, dtype)
    rows, classes = [], k_classes(PACKING_WIDTHS)
    for top, Ms in packing_spans(packing_ms()):
        line = [f"M = {Ms[0]}:"]
        for max_k, members in classes:
            pairs = [measured[M, *PACKING_WIDTHS[j]] for M in Ms for j in members if (M, *PACKING_WIDTHS[j]) in measured]
            pack, worst = choose_packing(pairs)
            rows.append({"max_m": top, "max_k": max_k, "packed": pack, "worst_packed_vs_unpacked": worst})
            if pairs:
                line.append(f"K<={max_k} {'packed' if pack else 'two GEMMs'} {worst:.3f}")
        if len(Ms) == 1 and len(line) > 1:
            print("packing " + "  ".join(line))
    record["packing"] = rows
    record["packing_rule"] = (f"per class of K (widths {', '.join(f'{d}x{h}' for d, h in PACKING_WIDTHS)})"
                              " and per measured M (each M bucket's upper edge and middle; an M between two measured"
                              " ones from both): packed unless, at a width of the class and such an M, the whole"
                              f" module took more than {1 + PACKING_MARGIN:.3f}x the time "
                              "with gate and up apart; timer: bench.time_interleaved of CUDA-graph replays, 3 rounds")
    record["packing_measured"] = [{"M": M, "dim": d, "hidden": h, "packed_us": round(p, 2), "unpacked_us": round(u, 2)}
                                  for (M, d, h), (p, u) in sorted(measured.items())]


def parse_args(argv=None):
    p = bench.Parser(prog="tune_fused.py", description=__doc__.split("\n")[0])
    p.add_argument("--widths", choices=sorted(WIDTHS), default="models",
                   help=f"MLP widths of the kernel rows: models ({len(WIDTHS['models'])} widths, default) or all "
                        f"({len(WIDTHS['all'])})")
    p.add_argument("--dtype", choices=sorted(bench.DTYPES), default="bf16")
    p.add_argument("--out", type=Path, default=None, help="table to write (default: fused_geglu's, beside it)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--packing-only", action="store_true",
                      help="keep the table's kernel rows (from --out's file) and re-measure only its packing rows")
    only.add_argument("--down-only", action="store_true",
                      help="keep the table's other rows (from --out's file) and re-measure only its down_proj rows")
    only.add_argument("--narrow-only", action="store_true",
                      help="keep the table's other rows (from --out's file) and re-measure only its MoE-expert rows "
                           "(hidden < dim)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_fused.py needs a CUDA GPU; torch.cuda.is_available() is False here", file=sys.stderr)
        return 2
    import fused_geglu as fg
    out = args.out or fg.TUNED_TABLE
    dtype, widths = bench.DTYPES[args.dtype], WIDTHS[args.widths]
    torch.manual_seed(0)
    if args.packing_only or args.down_only or args.narrow_only:
        flag, rows = (("--packing-only", "packing") if args.packing_only else ("--down-only", "down_proj")
                      if args.down_only else ("--narrow-only", "MoE-expert (hidden < dim)"))
        try:
            record = json.loads(out.read_text())
            fg.table_rows(record, out.name)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"tune_fused.py {flag}: cannot read the table's kernel rows from {out}: {e}", file=sys.stderr)
            return 2
        print(f"{bench.versions('cuda')['device']}: tuning the {rows} rows of {out}, {args.dtype}")
    else:
        record = tune_kernels(fg, dtype, widths, args.dtype)
    if not (args.packing_only or args.down_only):
        tune_narrow(fg, record, dtype)
    if not (args.packing_only or args.narrow_only):
        tune_down(fg, record, dtype)
    # the packing rows choose where cuBLAS runs gate and up: down_proj's and the narrow rows do not move them
    if not (args.down_only or args.narrow_only):
        tune_packing(fg, record, dtype)
    # --down-only and --narrow-only date their rows alone: the table's date stays its kernel and packing rows' (docs/04
    # reads it so)
    # (and name the GPU they were measured on: one of the same family, by the table's capability, may have made the rest)
    part = "down_" if args.down_only else "narrow_" if args.narrow_only else ""
    record[part + "date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if part:
        record[part + "device"] = bench.versions("cuda")["device"]
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}; fused_geglu reads {fg.TUNED_TABLE} at import (commit it)")
    return 0


def tune_kernels(fg, dtype, widths, dtype_name):
    """A new table's kernel rows (geglu and down), and what they were chosen from."""
    fg.table.tuned.clear()  # candidates run as asked, never through an older table
    record = {**bench.versions("cuda"), "capability": ".".join(map(str, torch.cuda.get_device_capability())),
              "dtype": dtype_name, "widths": [f"{d}x{h}" for d, h in widths],
              "timer": "bench.median_us of a CUDA-graph replay (L2 evicted before each call), ~30 ms of calls",
              "rule": ("gate/up: per M bucket and class of K (dim), the lowest geometric mean over the class's "
                       "widths of time / torch's time; down_proj: per M bucket, over all widths"),
              "geglu": [], "down": [], "measured": []}
    print(f"{record['device']}: tuning {len(BUCKETS)} M buckets x {len(widths)} widths, {dtype_name}")
    for i, M in enumerate(BUCKETS):
        per_width = [time_candidates(fg, M, d, h, dtype, common.TOLERANCE[dtype]) for d, h in widths]
        record["measured"] += [{"M": M, "dim": d, "hidden": h,
                                "us": {f"{w} {k} {c}": round(us, 2) for (w, k, c), us in t.items()}}
                               for (d, h), t in zip(widths, per_width)]
        geglu, down = bucket_rows(per_width, widths, None if i == len(BUCKETS) - 1 else M)
        record["geglu"] += geglu
        record["down"] += down
        print(f"M <= {M if i < len(BUCKETS) - 1 else 'any'}: " + "  ".join(
            f"{w}{' K<=%s' % r['max_k'] if w == 'geglu' else ''} {r['kernel']} {r['vs_torch']:.2f}x"
            for w, rows in (("geglu", geglu), ("down", down)) for r in rows))
    return record


def bucket_rows(per_width, widths, max_m):
    """One M bucket's geglu rows (one per class of K) and down row, from its times at each width ({(which, kernel,
    config as text): µs}). A geglu row where torch won also names the best fused candidate ("fused"): what the
    scripts that show the fused kernel at any token count run there (fused_geglu.show_the_kernel)."""
    (_, kernel, cfg), score = choose(per_width, "down")
    return geglu_rows(per_width, widths, max_m), [{"max_m": max_m, "kernel": kernel, "config": json.loads(cfg),
                                                   "vs_torch": round(score, 3)}]


def geglu_rows(per_width, widths, max_m):
    """One M bucket's geglu rows, one per class of K, from its times at each width (see bucket_rows)."""
    rows = []
    for max_k, members in k_classes(widths):
        times = [per_width[j] for j in members]
        (_, kernel, cfg), score = choose(times, "geglu")
        row = {"max_m": max_m, "max_k": max_k, "kernel": kernel, "config": json.loads(cfg), "vs_torch": round(score, 3)}
        best, fused_score = choose(times, "geglu", fused_only=True)
        if kernel == "torch" and best is not None:
            row["fused"] = {"kernel": best[1], "config": json.loads(best[2]), "vs_torch": round(fused_score, 3)}
        rows.append(row)
    return rows


def down_rows(per_width, widths, max_m):
    """One M bucket's down_proj rows, one per class of its input width K (hidden), from its times at each width."""
    rows = []
    for max_k, members in k_classes(widths, at=1):
        (_, kernel, cfg), score = choose([per_width[j] for j in members], "down")
        rows.append({"max_m": max_m, "max_k": max_k, "kernel": kernel, "config": json.loads(cfg),
                     "vs_torch": round(score, 3)})
    return rows


def down_buckets():
    """The M buckets down_proj is measured at (the small-M kernel is tried up to DOWN_MAX_M); past them, cuBLAS."""
    return [M for M in BUCKETS if M <= DOWN_MAX_M]


def time_down(fg, M, dim, hidden, dtype, tol):
    """{("down", kernel, config as text): µs} at one shape (time_candidates' down_proj half)."""
    return time_candidates(fg, M, dim, hidden, dtype, tol, geglu=False)


def tune_down(fg, record, dtype):
    """record's down_proj rows, per M bucket and class of hidden at DOWN_WIDTHS, and what they were chosen from."""
    fg.table.tuned.clear()
    record["down"], record["down_measured"] = [], []
    for M in down_buckets():
        per_width = [time_down(fg, M, d, h, dtype, common.TOLERANCE[dtype]) for d, h in DOWN_WIDTHS]
        record["down_measured"] += [{"M": M, "dim": d, "hidden": h,
                                     "us": {f"{w} {k} {c}": round(us, 2) for (w, k, c), us in t.items()}}
                                    for (d, h), t in zip(DOWN_WIDTHS, per_width)]
        rows = down_rows(per_width, DOWN_WIDTHS, M)
        record["down"] += rows
        print(f"down M <= {M}: " + "  ".join(f"K<={r['max_k']} {r['kernel']} {r['vs_torch']:.2f}x" for r in rows))
    record["down"].append({"max_m": None, "max_k": None, "kernel": "torch", "config": None, "vs_torch": 1.0})
    record["down_widths"] = [f"{d}x{h}" for d, h in DOWN_WIDTHS]
    record["rule"] = ("gate/up: per M bucket and class of K (dim), the lowest geometric mean over the class's widths "
                      "of time / torch's time; down_proj: the same per M bucket up to "
                      f"{DOWN_MAX_M} and class of K (hidden) at down_widths, cuBLAS past it")


def tune_narrow(fg, record, dtype):
    """record's geglu_narrow rows (MoE experts: hidden < dim), per M bucket and class of K (dim) at NARROW_WIDTHS, the
    same rule as the dense rows', and what they were chosen from. fused_geglu takes them where hidden < dim."""
    fg.table.tuned.clear()
    record["geglu_narrow"], record["narrow_measured"] = [], []
    for i, M in enumerate(BUCKETS):
        tol = common.TOLERANCE[dtype]
        per_width = [time_candidates(fg, M, d, h, dtype, tol, down=False) for d, h in NARROW_WIDTHS]
        record["narrow_measured"] += [{"M": M, "dim": d, "hidden": h,
                                       "us": {f"{w} {k} {c}": round(us, 2) for (w, k, c), us in t.items()}}
                                      for (d, h), t in zip(NARROW_WIDTHS, per_width)]
        rows = geglu_rows(per_width, NARROW_WIDTHS, None if i == len(BUCKETS) - 1 else M)
        record["geglu_narrow"] += rows
        print(f"narrow M <= {M if i < len(BUCKETS) - 1 else 'any'}: "
              + "  ".join(f"K<={r['max_k']} {r['kernel']} {r['vs_torch']:.2f}x" for r in rows))
    record["narrow_widths"] = [f"{d}x{h}" for d, h in NARROW_WIDTHS]


def narrow_from_measured(record):
    """The geglu_narrow rows that record's narrow_measured give (tune_narrow's rule, no GPU)."""
    widths = [tuple(map(int, w.split("x"))) for w in record["narrow_widths"]]
    times = _by_m(record["narrow_measured"])
    return [r for i, M in enumerate(BUCKETS)
            for r in geglu_rows([times[M][w] for w in widths], widths, None if i == len(BUCKETS) - 1 else M)]


def _by_m(entries):
    """{M: {(dim, hidden): {(which, kernel, config as text): µs}}} of a table's measurements."""
    out = {}
    for entry in entries:
        t = {tuple(key.split(" ", 2)): us for key, us in entry["us"].items()}
        out.setdefault(entry["M"], {})[entry["dim"], entry["hidden"]] = t
    return out


def rows_from_measured(record):
    """The kernel rows (geglu, down) that record's own measurements give: the same rule, no GPU (a test checks a
    committed table against it). down_proj's from its own measurements where the table has them (down_from_measured)."""
    widths = [tuple(map(int, w.split("x"))) for w in record["widths"]]
    times = _by_m(record["measured"])
    geglu, down = [], []
    for i, M in enumerate(BUCKETS):
        g, d = bucket_rows([times[M][w] for w in widths], widths, None if i == len(BUCKETS) - 1 else M)
        geglu += g
        down += d
    return geglu, down_from_measured(record) if "down_measured" in record else down


def down_from_measured(record):
    """The down_proj rows that record's down_measured give (tune_down's rule, no GPU)."""
    widths = [tuple(map(int, w.split("x"))) for w in record["down_widths"]]
    times = _by_m(record["down_measured"])
    rows = [r for M in down_buckets() for r in down_rows([times[M][w] for w in widths], widths, M)]
    return rows + [{"max_m": None, "max_k": None, "kernel": "torch", "config": None, "vs_torch": 1.0}]


if __name__ == "__main__":
    sys.exit(main())
