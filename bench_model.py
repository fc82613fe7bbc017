"""The whole decoder, benchmarked: prefill tokens/s and decode ms per token, per execution and MLP, against floors.

    python3 bench_model.py                      # on the GPU machine: 4 Gemma-2B layers, batch 1, prompt 512
                                                # (minutes: compiling six graphs takes most of it)
    uv run bench_model.py --device cpu          # the tiny preset on the CPU: the same code path, no numbers to quote

06_model.py's model (transformers' GemmaForCausalLM, random weights from a preset; vocab 32000), run three
ways (eager; torch.compile; CUDA graphs: torch.compile(mode="reduce-overhead"), decode only) with each MLP
(transformers' own; Liger's LigerGEGLUMLP; this suite's FusedGeGLUMLP; swapped in by 06_model.swap_mlps,
weights copied). Correct before fast: every variant's logits are checked against the eager model's before
anything is timed; a wrong one stops the run (exit 1, nothing written). A variant that cannot run here
(liger-kernel not installed, a Triton kernel on a CPU, a failed compile) is listed as skipped, with the reason.

What is timed (bench.py's timer: CUDA events, L2 evicted before each call; ROUNDS short interleaved rounds,
bench.time_interleaved: one call of each variant of the same execution in turn, ~REP_MS ms of calls of each, the
middle round reported; on a CPU, bench.cpu_median_us):
- prefill: one forward of batch x seq tokens, no cache, logits of the last position only (what generation
  needs): 06_model.py --phase prefill's step. Tokens/s = batch * seq / time.
- decode: one forward of one token per sequence against a static KV cache of --seq entries: 06_model.py
  --phase decode's step. Attention reads all --seq entries (those not yet written are masked), so every step
  does the same work. Each step appends a token; when the cache is full, the call that finds it full first
  resets it and refills the prompt (seq/2 tokens, eager): 1 call in seq/2, which the median leaves out.

Floors, with the ceilings measured in the same run by bench.gemm_ceiling_tflops and bench.copy_bandwidth_tbps:
- P = the weights a token passes through: L * (hidden * (heads + 2 * kv_heads) * head_dim   [q, k, v]
      + heads * head_dim * hidden   [o]  + 3 * hidden * intermediate   [gate, up, down]).
- prefill floor = FLOPs / GEMM ceiling, FLOPs = 2 * P * batch * seq   [every token through every weight]
      + 2 * vocab * hidden * batch   [the LM head, last position only]
      + L * 2 * batch * heads * seq^2 * head_dim   [QK^T and PV, 4*b*H*s*s*d, causal: half the scores].
- decode floor = bytes / copy bandwidth, bytes = itemsize * (P + vocab * hidden   [every weight read once]
      + 2 * L * batch * kv_heads * seq * head_dim)   [the whole K and V cache].
  (The norms' few vectors and the one embedding row per token are left out of both.)
"of floor" = floor / time: 1.00 is at the ceiling.

Against transformers' MLP, side by side: each row with another MLP is set against the row of the same execution
with transformers' MLP, round by round; within a round their calls alternate (a few ms apart), so a slow spell of
the host slows both. "vs eager MLP" is the middle of those per-round ratios (eager MLP's time / this
row's: above 1, this MLP's model is faster) and in how many rounds it was faster. Rows timed by the host (all but
CUDA graphs) move with its speed by tens of % between rounds; their ratio is the number to read.

Prints a table per phase, writes a JSON record (device, versions, date, ceilings, floors, per-variant median
µs) to --out, the table beside it (.txt) and bench.py's chart (.png).
"""

import argparse
import copy
import importlib
import math
import sys
import types
from pathlib import Path

import torch
import transformers

import bench
import common
from trace_reader.render.plot import bench_chart_next_to, byte_rate, flop_rate

model_script = importlib.import_module("06_model")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
EXECUTIONS = ["eager", "compile", "cuda-graphs"]
MLPS = ["eager", "liger", "fused"]
# Many short rounds rather than bench.py's 5 of 100 ms: a host that slows for seconds slows both sides of a pair.
# 45, not the 15 of the first paired record: the eager rows, timed by the host, spread by up to 120% between rounds,
# and 15 pairs left a 3% difference undecided (5 of 15). A round of the six prefill variants takes ~0.2 s.
# Interleaved (call by call), not round-robin (30 ms of one variant, then the next): the lent H200's host switches
# between a fast and a slow speed (3.5 and 6.5 ms for the same eager step) every few hundred ms, and a switch fell
# between the two halves of many pairs: in the round-robin records made at aa40973, 23 to 26 of the 45 ratios of the
# fused eager rows to transformers' MLP's lay beyond +-5%, around middles of 0.99 to 1.03. Each execution's rows are
# interleaved among themselves only: after a host-bound eager step the GPU's queue is empty, and a CUDA-graph step
# timed next shows its host's time too (0.83 ms a decode step, against 0.48 in a row of its own steps).
ROUNDS, REP_MS = 45, 30
# The shape on the GPU; the tiny preset on the CPU (seconds).
DEFAULTS = {"cuda": {"preset": "gemma-2b", "layers": 4, "seq": 512}, "cpu": {"preset": "tiny", "layers": 2, "seq": 64}}


def _names(choices):
    def parse(text):
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names or not set(names) <= set(choices):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, got {text!r}")
        return list(dict.fromkeys(names))
    return parse


def parse_args(argv=None):
    p = bench.Parser(prog="bench_model.py", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the tiny preset, a smoke test")
    p.add_argument("--preset", choices=list(model_script.PRESETS), help="the model's shape (default gemma-2b; CPU tiny)")
    p.add_argument("--layers", type=common.int_arg(1, 1000), help="decoder layers (default 4; CPU 2)")
    p.add_argument("--batch", type=common.int_arg(1, 1 << 16), default=1, help="sequences (default 1)")
    p.add_argument("--seq", type=common.int_arg(2, 1 << 20), help="prefill tokens; KV cache entries at decode (default 512; CPU 64)")
    p.add_argument("--exec", type=_names(EXECUTIONS), default=EXECUTIONS, metavar="LIST",
                   help=f"executions to run (default {','.join(EXECUTIONS)}; cuda-graphs: decode only)")
    p.add_argument("--mlp", type=_names(MLPS), default=MLPS, metavar="LIST", help=f"MLPs (default {','.join(MLPS)})")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="weights and activations (default bf16)")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench_model.json"), help="JSON record to write")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def model_config(args):
    config = model_script.preset_config(args.preset)
    config.num_hidden_layers = args.layers
    if args.seq > config.max_position_embeddings:
        raise common.Fail(f"--seq {args.seq} is longer than the {args.preset} preset's "
                          f"{config.max_position_embeddings} positions")
    return config


def costs(config, batch, seq, itemsize):
    """The floors' counts, from the config (the formulas in the docstring)."""
    d, h, L, V = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    H, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_token = L * (d * (H + 2 * kv) * hd + H * hd * d + 3 * d * h)
    kv_cache = 2 * L * batch * kv * seq * hd
    return {"params_per_token": per_token,
            "prefill_flops": 2 * per_token * batch * seq + 2 * V * d * batch + L * 2 * batch * H * seq**2 * hd,
            "decode_bytes": itemsize * (per_token + V * d + kv_cache),
            "weight_bytes": itemsize * (per_token + V * d), "kv_cache_bytes": itemsize * kv_cache}


def with_mlp(base, kind, run):
    """The eager model itself, or a copy with every layer's MLP swapped (06_model.swap_mlps: weights copied)."""
    if kind == "eager":
        return base
    model = copy.deepcopy(base)
    model_script.swap_mlps(model, kind, run)
    return model


def executed(model, execution):
    """The forward to call: the model, or a compiled copy (its own: two compiled wrappers never share Dynamo's
    cache entry). dynamic=False: prefill and decode each get a graph for their shape."""
    if execution == "eager":
        return model
    compiled = torch.compile(copy.deepcopy(model), mode="reduce-overhead" if execution == "cuda-graphs" else None,
                             dynamic=False)
    if execution != "cuda-graphs":
        return compiled

    def forward(**kw):  # a new replay may overwrite the last one's outputs: say so, as torch's docs ask
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(**kw)
    return forward


class Decode:
    """One decode step, callable again and again: one token per sequence against a static cache of seq entries.
    The cache starts with the prompt (seq/2 tokens, filled by the eager model); the call that finds it full
    resets it and refills the prompt first."""

    def __init__(self, forward, fill_model, config, ids):
        self.forward, self.fill_model, self.ids = forward, fill_model, ids
        self.prompt, self.room = ids.shape[1] // 2, ids.shape[1] - ids.shape[1] // 2
        self.cache = transformers.StaticCache(config=config, max_cache_len=ids.shape[1])
        self.kw = model_script.cache_argument(fill_model)
        self.fill()

    def fill(self):
        self.cache.reset()
        self.fill_model(input_ids=self.ids[:, :self.prompt], use_cache=True, **{self.kw: self.cache})
        self.steps = 0

    def __call__(self):
        if self.steps == self.room:
            self.fill()
        self.steps += 1
        return self.forward(input_ids=self.ids[:, -1:], use_cache=True, **{self.kw: self.cache}).logits


def build_variants(base, config, ids, args, run):
    """({phase: {name: fn}}, {phase: {name: why skipped}}): every execution x MLP that can run here."""
    calls, skipped = {"prefill": {}, "decode": {}}, {"prefill": {}, "decode": {}}
    for mlp in args.mlp:
        try:
            model = with_mlp(base, mlp, run)
        except common.Fail as e:  # liger-kernel missing, or a Triton kernel on a CPU
            for execution in args.exec:
                for phase in calls if execution != "cuda-graphs" else ["decode"]:
                    skipped[phase][f"{execution} / {mlp}"] = str(e)
            continue
        for execution in args.exec:
            name = f"{execution} / {mlp}"
            if execution == "cuda-graphs" and not run.cuda:
                skipped["decode"][name] = "CUDA graphs need a CUDA GPU"
                continue
            forward = executed(model, execution)
            if execution != "cuda-graphs":  # graphs for decode, where launches are the step: fewer compiles
                calls["prefill"][name] = (lambda f=forward: f(input_ids=ids, use_cache=False, logits_to_keep=1).logits)
            calls["decode"][name] = Decode(forward, base, config, ids)
    return calls, skipped


def check(phase, calls, skipped, reference, tol):
    """Correct before fast: each variant's logits against the eager model's. {name: relative error}; a variant
    that fails to run moves to `skipped`; a wrong one raises AssertionError."""
    errors = {}
    for name, call in list(calls.items()):
        try:
            for _ in range(3):  # CUDA graphs warm up, record, then replay: each can fail; the replay is checked
                if isinstance(call, Decode):
                    call.fill()  # the same state as the reference's: the prompt, then this step
                out = call()
        except Exception as e:  # noqa: BLE001 - a compiler or kernel that cannot run this model: say so, go on
            skipped[name] = f"failed: {type(e).__name__}: {model_script.first_line(e)}"
            del calls[name]
            continue
        errors[name] = common.rel_error(out, reference)
        if not (math.isfinite(errors[name]) and errors[name] <= tol):
            raise AssertionError(f"{name} {phase}: logits differ from the eager model's, relative error "
                                 f"{errors[name]:.2e} > {tol:.0e}")
    return errors


def bench_phase(phase, calls, skipped, reference, floor_us, tokens, tol, cuda):
    errors = check(phase, calls, skipped, reference, tol)
    rounds = {}
    for execution in EXECUTIONS:  # interleaved with the same execution's rows only (see ROUNDS)
        group = {n: c for n, c in calls.items() if n.split(" / ")[0] == execution}
        if group:
            rounds.update(bench.time_interleaved(group, rounds=ROUNDS, rep_ms=REP_MS) if cuda
                          else {n: [bench.cpu_median_us(c)] for n, c in group.items()})
    variants = {}
    for name in calls:
        us = bench.middle(rounds[name])
        execution, mlp = name.split(" / ")
        variants[name] = {"execution": execution, "mlp": mlp, "median_us": us, "rounds_us": rounds[name],
                          "rel_err": errors[name], "of_floor": floor_us / us}
        if phase == "prefill":
            variants[name]["tokens_per_s"] = tokens / us * 1e6
        else:
            variants[name]["ms_per_token"] = us / 1e3
        partner = f"{execution} / eager"
        if mlp != "eager" and partner in rounds:
            variants[name].update(paired(rounds[partner], rounds[name]))
    return variants


def paired(reference_us, rounds_us):
    """This row against the same execution's row with transformers' MLP, round by round: {"vs_eager_mlp": the
    middle per-round ratio (reference / this: above 1 is faster), "faster_rounds": rounds where this one was
    faster, "paired_rounds": rounds compared}."""
    ratios = [ref / us for ref, us in zip(reference_us, rounds_us)]
    return {"vs_eager_mlp": bench.middle(ratios), "faster_rounds": sum(r > 1 for r in ratios),
            "paired_rounds": len(ratios)}


def versus(v):
    """'1.03x 11/15' (the paired ratio and the rounds this row was faster), or '' for transformers' MLP's rows and
    records written before the pairing."""
    if "vs_eager_mlp" not in v:
        return ""
    return f"{v['vs_eager_mlp']:.2f}x {v['faster_rounds']}/{v['paired_rounds']}"


def format_phase(r):
    prefill = r["phase"] == "prefill"
    if prefill:
        head = (f"\nprefill, {r['label']}: {r['flops'] / 1e9:.1f} GFLOP; floor {r['floor_us'] / 1e3:.3f} ms "
                f"({r['bound']}-bound: FLOPs / GEMM ceiling)")
    else:
        head = (f"\ndecode, {r['label']}: {r['bytes'] / 1e6:.1f} MB a step (weights {r['weight_bytes'] / 1e6:.1f} MB, "
                f"KV cache {r['kv_cache_bytes'] / 1e6:.1f} MB); floor {r['floor_us'] / 1e3:.3f} ms "
                f"({r['bound']}-bound: bytes / copy bandwidth)")
    lines = [head, (f"  {'execution':<13}{'MLP':<8}{'ms':>9}{'spread':>8}"
                    f"{'tokens/s' if prefill else 'ms/token':>12}{'of floor':>10}{'rel err':>10}  vs eager MLP")]
    for v in r["variants"].values():
        spread = (max(v["rounds_us"]) - min(v["rounds_us"])) / v["median_us"]  # across rounds: the noise to beat
        rate = f"{v['tokens_per_s']:12,.0f}" if prefill else f"{v['ms_per_token']:12.3f}"
        lines.append(f"  {v['execution']:<13}{v['mlp']:<8}{v['median_us'] / 1e3:9.3f}{spread:8.1%}{rate}"
                     f"{v['of_floor']:10.2f}{v['rel_err']:10.1e}  {versus(v)}".rstrip())
    lines += [f"  skipped: {name}: {why}" for name, why in r["skipped"].items()]
    return "\n".join(lines)


TABLE_HEADER = ("| execution | MLP | prefill tokens/s (of floor) | decode ms/token (of floor) | "
                "vs transformers' MLP, prefill | vs transformers' MLP, decode |")


def markdown(record):
    """The README's table, from a record: per execution and MLP, prefill tokens/s and decode ms per token, each
    with its fraction of the floor, then each phase's paired ratio against transformers' MLP (versus); "—" where a
    variant did not run or has no ratio."""
    prefill, decode = record["shapes"]
    rows = [TABLE_HEADER, "| --- " * 6 + "|"]
    for execution in EXECUTIONS:
        for mlp in MLPS:
            name = f"{execution} / {mlp}"
            p, d = prefill["variants"].get(name), decode["variants"].get(name)
            if p is None and d is None:
                continue
            cells = [f"{p['tokens_per_s']:,.0f} ({p['of_floor']:.2f})" if p else "—",
                     f"{d['ms_per_token']:.3f} ({d['of_floor']:.2f})" if d else "—",
                     (versus(p) or "—") if p else "—", (versus(d) or "—") if d else "—"]
            rows.append(f"| {execution} | {mlp} | " + " | ".join(cells) + " |")
    m = record["model"]
    rows += ["", (f"Floors: prefill {prefill['floor_us'] / 1e3:.3f} ms ({prefill['flops'] / 1e9:.0f} GFLOP at "
             f"{flop_rate(record['ceiling_tflops'])}), decode {decode['floor_us'] / 1e3:.3f} ms "
             f"({decode['bytes'] / 1e6:.0f} MB at {byte_rate(record['copy_tbps'])}); {m['preset']}, {m['layers']} "
             f"layers, batch {m['batch']}, prompt {m['seq']}, {record['dtype']}, {record['device']}, "
             f"torch {record['torch']}, transformers {record['transformers']}.")]
    return "\n".join(rows)


def main(argv=None):
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if bench.cuda_missing(args.device, "bench_model.py", "the tiny preset"):
        return 2
    try:
        config = model_config(args)
    except common.Fail as e:
        print(f"bench_model.py: {e}", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    run = types.SimpleNamespace(cuda=cuda, device=torch.device(args.device), dtype=dtype)  # what 06_model wants
    torch.manual_seed(0)
    if cuda:
        ceiling, bandwidth = bench.gemm_ceiling_tflops(dtype), bench.copy_bandwidth_tbps()
    else:  # the CPU's own, smaller yardsticks: its floors and fractions are of this CPU, nothing to quote
        ceiling, bandwidth = bench.cpu_ceilings(dtype)
        bandwidth /= 1e3  # TB/s
    bench.keep_compile_workers()  # no worker start-up burst inside a timing
    record = bench.versions(args.device)
    table = [(f"{record['device']}: {args.dtype} GEMM ceiling {flop_rate(ceiling)}, device copy {byte_rate(bandwidth)} "
              f"(measured now{'' if cuda else ': ' + bench.CPU_CEILINGS})"),
             (f"model: {args.preset}, {args.layers} layers, hidden {config.hidden_size}, intermediate "
              f"{config.intermediate_size}, {config.num_attention_heads} heads / {config.num_key_value_heads} KV, "
              f"head_dim {config.head_dim}, vocab {config.vocab_size}; batch {args.batch}, seq {args.seq}")]
    print("\n".join(table))
    c = costs(config, args.batch, args.seq, dtype.itemsize)
    # Each compiled variant holds two graphs (prefill, decode) of the same forward: above Dynamo's default limit
    # of 8 per function, it would silently run the rest eager.
    limit = max(torch._dynamo.config.recompile_limit, 4 * len(args.mlp) * len(args.exec))
    # Weights made outside inference mode, as a user's model's are.
    with torch.no_grad():
        base = model_script.build_model(config, run)
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=run.device)
        calls, skipped = build_variants(base, config, ids, args, run)
    # One grad mode for checks and timing: no recompiles between them.
    with torch._dynamo.config.patch(recompile_limit=limit), torch.inference_mode():
        ref_prefill = base(input_ids=ids, use_cache=False, logits_to_keep=1).logits
        ref_decode = Decode(base, base, config, ids)()
        tokens, tol = args.batch * args.seq, common.TOLERANCE[dtype]
        phases = [("prefill", c["prefill_flops"] / ceiling / 1e6, f"{args.batch}x{args.seq} tokens", "compute"),
                  ("decode", c["decode_bytes"] / bandwidth / 1e6,
                   f"1 token per sequence x {args.batch}, KV cache of {args.seq}", "memory")]
        results = []
        try:
            for (phase, floor_us, label, bound), ref in zip(phases, (ref_prefill, ref_decode)):
                results.append({"phase": phase, "label": label, "bound": bound, "floor_us": floor_us,
                                "flops": c["prefill_flops"], "bytes": c["decode_bytes"],
                                "weight_bytes": c["weight_bytes"], "kv_cache_bytes": c["kv_cache_bytes"],
                                "variants": bench_phase(phase, calls[phase], skipped[phase], ref, floor_us, tokens,
                                                        tol, cuda),
                                "skipped": skipped[phase]})
                table.append(format_phase(results[-1]))
                print(table[-1])
        except AssertionError as e:
            print(f"bench_model.py: wrong result, nothing written: {e}", file=sys.stderr)
            return 1
    record.update({
        "transformers": transformers.__version__, "dtype": args.dtype,
        "model": {"preset": args.preset, "layers": args.layers, "hidden": config.hidden_size,
                  "intermediate": config.intermediate_size, "heads": config.num_attention_heads,
                  "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim, "vocab": config.vocab_size,
                  "batch": args.batch, "seq": args.seq, "params_per_token": c["params_per_token"]},
        **bench.timing_fields(cuda, ROUNDS, REP_MS, interleaved=True),
        "timed": {"prefill": "one forward of batch x seq tokens, no cache, logits of the last position",
                  "decode": "one forward of 1 token per sequence, static KV cache of seq entries (all read)"},
        "ceiling_tflops": ceiling,
        "copy_tbps": bandwidth, "floors": {"prefill": "FLOPs / ceiling_tflops", "decode": "bytes / copy_tbps"},
        "shapes": results,
    })
    print(bench.write_record(args.out, record, table))
    print(bench_chart_next_to(record, args.out, f"{args.preset} decoder, {args.layers} layers"))  # the same numbers, as bars
    return 0


if __name__ == "__main__":
    sys.exit(main())
