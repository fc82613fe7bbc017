"""Training, benchmarked: the GeGLU MLP's forward + backward, then a model's whole training step, against a floor.

    python3 bench_train.py                       # on the GPU machine: 3 MLP shapes, then Gemma-2B at 2 layers (~4 min)
    python3 bench_train.py --activation silu     # SwiGLU: 3 Llama/Qwen MLP shapes, then Llama-3.2-1B's shape at 2 layers
    uv run bench_train.py --device cpu           # tiny shapes on the CPU: the same code path, no numbers to quote

MLP (forward + backward): the post's SimpleGeGLUMLP (eager), torch.compile of it, Liger's LigerGEGLUMLP (its own
fused backward) and this suite's FusedGeGLUMLP (gate, up and GeGLU in one Triton kernel, the pointwise part of its
backward in one more) in its two training modes: "fused" saves g and u from the forward kernel, "fused-recompute"
saves neither and recomputes them with two GEMMs in backward; "compile-fused" is torch.compile of the fused module
(its ops in Inductor's graph). All with the same weights, at the post's shape (8192 tokens, 768 -> 3072) and two
model sizes. --activation silu: the SwiGLU MLP (transformers' LlamaMLP, Liger's LigerSwiGLUMLP, FusedGatedMLP("silu"):
07_train_step.py's eager_mlp and swapped) at Llama-3-8B, Qwen2-7B and Qwen2-0.5B widths, and a Llama-shaped model. One timed call: the gradients set to None, y = mlp(x), y.backward(dy) with a fixed dy; x wants a
gradient too (it stands for the previous layer's output, as in 07_train_step.py). Then the model's training step as
07_train_step.py builds it (06_model.py's decoder, the MLP swapped by --mlp, weights copied; compile: torch.compile
of the eager one, compile-fused of the one with the fused MLP): zero_grad(set_to_none=True), the language-model
loss, backward, AdamW (foreach) step. "fused vs best peer": the faster fused form (fused, compile-fused) against
the fastest peer (eager, compile, Liger), each in the execution mode a user would pick; by the CUDA-graph replays
where every variant compared has one (the MLP cases on a GPU), and from Python beside it.

Correct before fast: each variant's gradients (the MLP's weights and x; every parameter of the model, as one
vector) are checked against fp32 autograd of the same weights and inputs before anything is timed; a wrong one
stops the run (exit 1, nothing written). A variant that cannot run here (liger-kernel not installed, a Triton
kernel on a CPU, a failed compile) is listed as skipped, with the reason.

Timer: bench.py's (CUDA events, L2 evicted before each call; ROUNDS round-robin rounds, the middle one reported;
on a CPU, bench.cpu_median_us). On a GPU each MLP variant's call is timed twice: from Python ("µs", what a training
loop in eager Python pays, host time included where the GPU waits on it) and as a CUDA graph ("graph µs": the call
captured once with torch.cuda.graph after 3 warm-up calls on a side stream, then replayed; the GPU's time alone).
A variant whose capture fails is timed from Python alone, the reason in its record ("graph_failed") and its table.
The model's training step is timed from Python only: capturing AdamW needs capturable=True, another optimizer than
the one timed. Peak memory (CUDA only): the most the caching allocator held during one step above what it held
before it, with the gradients freed (activations, gradients, temporaries; optimizer state is made in the first
step, before), measured from Python before any capture.

Floor: backward's GEMMs do twice forward's FLOPs, so a step does at least 3 x the forward's GEMM FLOPs; floor =
3 x forward FLOPs / GEMM ceiling, the ceiling measured in the same run (bench.gemm_ceiling_tflops; on a CPU
bench.cpu_ceilings). Forward FLOPs: the MLP's 6 * tokens * dim * hidden; the model's bench_model.costs() with the
LM head at every position. The pointwise work and the optimizer are not in it. "of floor" = floor / time.

Prints a table per shape, writes a JSON record (device, versions, date, ceiling, floors, per-variant median µs,
graph µs, peak memory and gradient error) to --out, the table beside it (.txt), a markdown table (.md) and bench.py's
chart (.png).
"""

import argparse
import copy
import importlib
import math
import sys
import types
from pathlib import Path

import torch
from trace_reader.render.plot import bench_chart_next_to, flop_rate

import bench
import common

train07 = importlib.import_module("07_train_step")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
VARIANTS = ["eager", "compile", "liger", "fused", "fused-recompute", "compile-fused"]
TRITON_VARIANTS = ("liger", "fused", "fused-recompute", "compile-fused")
PEERS = ("eager", "compile", "liger")  # what the fused MLP is set against
FUSED_FORMS = ("fused", "compile-fused")  # the fused MLP as a user runs it, eager or compiled (recompute: for memory)
# The post's MLP, Gemma-2B's and Llama-2-7B's at 4096 tokens; Gemma-2B at 2 layers for the step (as the H200
# fixtures of 07_train_step.py). On a CPU, shapes that take seconds.
DEFAULTS = {"cuda": {"shapes": "8192x768x3072,4096x2048x16384,4096x4096x11008", "model": "gemma-2b", "layers": 2,
                     "batch": 4, "seq": 512, "dtype": "bf16", "variants": ",".join(VARIANTS)},
            "cpu": {"shapes": "64x32x96,48x40x72", "model": "tiny", "layers": 2, "batch": 2, "seq": 32,
                    "dtype": "fp32", "variants": "eager,compile"}}
# Gradients against fp32 autograd, ||g - g_fp32|| / ||g_fp32||: bf16 rounds every activation on the way, and a
# whole model's gradients gather that over its layers.
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}
NEEDS_CUDA = "runs Triton kernels, which need a CUDA GPU"
# --activation silu: Llama-3-8B's, Qwen2-7B's and Qwen2-0.5B's MLP at 4096 tokens; a Llama preset for the step
# What a CUDA record's "graph_median_us" timed (the MLP cases; the model's step is timed from Python alone)
GRAPH_TIMER = ("the MLP's timed call captured once in a CUDA graph after 3 warm-up calls on a side stream, its replays "
               "timed as above; where a capture failed, the variant's graph_failed says why. The model's step is not "
               "captured: its AdamW would have to be capturable=True, another optimizer than the one timed")
SWIGLU_DEFAULTS = {"cuda": {"shapes": "4096x4096x14336,4096x3584x18944,4096x896x4864", "model": "llama-1b"},
                   "cpu": {"model": "tiny-llama"}}


def parse_args(argv=None):
    p = bench.Parser(prog="bench_train.py", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: tiny shapes, a smoke test")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="weights and activations (default bf16; CPU fp32)")
    p.add_argument("--shapes", help="the MLP's shapes, comma-separated TOKENSxDIMxHIDDEN (default: the post's and two "
                   "model sizes; CPU tiny)")
    p.add_argument("--model", choices=["gemma-2b", "tiny", "llama-1b", "tiny-llama", "none"],
                   help="06_model.py's preset for the training step (default gemma-2b, with --activation silu "
                   "llama-1b; CPU tiny, tiny-llama; none: the MLP only)")
    p.add_argument("--activation", choices=["gelu_tanh", "silu"], default="gelu_tanh",
                   help="the MLP's: gelu_tanh (GeGLU, default) or silu (SwiGLU)")
    p.add_argument("--layers", type=common.int_arg(1, 1000), help="decoder layers (default 2)")
    p.add_argument("--batch", type=common.int_arg(1, 1 << 16), help="sequences (default 4; CPU 2)")
    p.add_argument("--seq", type=common.int_arg(2, 1 << 20), help="tokens per sequence (default 512; CPU 32)")
    p.add_argument("--variants", metavar="LIST", help=f"among {','.join(VARIANTS)} (default all; CPU eager,compile)")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench_train.json"), help="JSON record to write")
    args = p.parse_args(argv)
    for key, value in {**DEFAULTS[args.device], **(SWIGLU_DEFAULTS[args.device] if args.activation == "silu" else {})
                       }.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.shapes = bench.shape_list(args.shapes)
    except argparse.ArgumentTypeError as e:
        p.error(f"--shapes: {e}")
    args.variants = list(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    if not args.variants or not set(args.variants) <= set(VARIANTS):
        p.error(f"--variants: expected a comma-separated list of {', '.join(VARIANTS)}, got {','.join(args.variants)!r}")
    return args


# ------------------------------------------------------------------------------------------------ measuring

def peak_bytes(clear, step, cuda):
    """The most the allocator held during one step above what it held just before (gradients freed first)."""
    if not cuda:
        return None
    clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def grad_error(grads, reference):
    """||all gradients - fp32's|| / ||fp32's||, the gradients as one vector (names matched)."""
    missing = set(reference) - {k for k, g in grads.items() if g is not None}
    if missing:
        raise AssertionError(f"no gradient for {', '.join(sorted(missing))}")
    names = sorted(reference)
    return common.rel_error(torch.cat([grads[n].float().flatten() for n in names]),
                            torch.cat([reference[n].float().flatten() for n in names]))


def failure(e):
    """An exception in one line, for the record: its type and the first line of its message."""
    return f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"


def graph_step(step):
    """step captured once in a CUDA graph, its replay (bench.graph_replay: 3 warm-up calls on a side stream first, as
    PyTorch's CUDA-graph notes warm up a whole-network capture; a compiled variant has been compiled and run before,
    by the gradient check). Each replay writes the gradients anew in the graph's own memory: at capture they were
    set to None, so the backward captured assigns them rather than adding to them. A failed capture leaves
    torch.cuda.graph's side stream current (its exit stops at capture_end): set back before the error goes on."""
    stream = torch.cuda.current_stream()
    try:
        return bench.graph_replay(step, inference=False, warm_ups=3)
    except Exception:
        torch.cuda.set_stream(stream)
        torch.cuda.synchronize()
        raise


def timed(calls, checks, skipped, floor_us, tol, cuda, what, graphs=False):
    """Check every call's gradients (a failing one moves to skipped, a wrong one raises), then time them.
    checks: {name: (clear, grads)}, grads() running one forward and backward (no optimizer step) and returning
    its error against fp32. graphs (on CUDA): each call also captured in a CUDA graph (graph_step) and its replays
    timed the same way, after the calls from Python; a variant whose capture fails keeps its time from Python, the
    reason in "graph_failed". Peak memory is measured before any capture, from Python. Returns {name: the variant's
    record}."""
    errors, peaks = {}, {}
    for name in list(calls):
        clear, grads = checks[name]
        try:
            found = grads()
            calls[name]()  # the whole call once: a compile, or an optimizer that cannot run, fails here
        except Exception as e:  # noqa: BLE001 - a compiler or kernel that cannot run here: say so, go on
            skipped[name] = failure(e)
            del calls[name]
            continue
        errors[name] = found
        if not (math.isfinite(found) and found <= tol):
            raise AssertionError(f"{name} {what}: gradients differ from fp32 autograd's, relative error "
                                 f"{found:.2e} > {tol:.0e}")
        peaks[name] = peak_bytes(clear, calls[name], cuda)
    rounds = (bench.time_round_robin(calls, inference=False) if cuda else
              {n: [bench.cpu_median_us(c, inference=False)] for n, c in calls.items()})
    replays, graph_failed = {}, {}
    for name in calls if graphs and cuda else ():
        try:
            replays[name] = graph_step(calls[name])
        except Exception as e:  # noqa: BLE001 - a kernel or compiled graph that cannot be captured: say so, go on
            graph_failed[name] = failure(e)
    graph_rounds = bench.time_round_robin(replays, inference=False) if replays else {}
    del replays  # the graphs and their memory
    out = {}
    for name in calls:
        us = bench.middle(rounds[name])
        out[name] = {"median_us": us, "rounds_us": rounds[name], "of_floor": floor_us / us,
                     "grad_rel_err": errors[name], "peak_mib": None if peaks[name] is None else peaks[name] / 2**20}
        if name in graph_rounds:
            graph_us = bench.middle(graph_rounds[name])
            out[name].update(graph_median_us=graph_us, graph_rounds_us=graph_rounds[name],
                             graph_of_floor=floor_us / graph_us)
        elif name in graph_failed:
            out[name]["graph_failed"] = graph_failed[name]
    return out


# ------------------------------------------------------------------------------------------------ the MLP

def mlp_variants(dim, hidden, run, names, skipped, act="gelu_tanh"):
    """{name: module} with the eager MLP's weights, and the fp32 reference; what cannot run here goes to skipped."""
    eager = train07.eager_mlp(dim, hidden, act).to(run.device, run.dtype)
    modules = {}
    for name in names:
        if name == "eager":
            modules[name] = eager
        elif name == "compile":  # its own copy: two compiled wrappers never share Dynamo's cache entry
            modules[name] = torch.compile(copy.deepcopy(eager), dynamic=False)
        elif not run.cuda:
            skipped[name] = NEEDS_CUDA
        else:
            try:
                module = train07.swapped(name.removeprefix("compile-"), eager, dim, hidden, act).to(run.device,
                                                                                                    run.dtype)
            except common.Fail as e:  # liger-kernel not installed
                skipped[name] = str(e)
                continue
            modules[name] = torch.compile(module, dynamic=False) if name.startswith("compile-") else module
    return modules, copy.deepcopy(eager).float()


def mlp_case(M, dim, hidden, run, names, ceiling, tol, act="gelu_tanh"):
    skipped = {}
    modules, reference = mlp_variants(dim, hidden, run, names, skipped, act)
    x = torch.randn(M, dim, device=run.device, dtype=run.dtype, requires_grad=True)
    dy = torch.randn(M, dim, device=run.device, dtype=run.dtype)

    def fp32_grads():
        xf = x.detach().float().requires_grad_()
        reference(xf).backward(dy.float())
        return {"x": xf.grad, **{n: p.grad for n, p in reference.named_parameters()}}

    want = fp32_grads()
    calls, checks = {}, {}
    for name, module in modules.items():
        def clear(m=module):
            x.grad = None
            for p in m.parameters():
                p.grad = None

        def step(m=module, clear=clear):
            clear()
            m(x).backward(dy)

        def grads(m=module, step=step):  # names as the eager module's: torch.compile's wrapper adds "_orig_mod."
            step()
            return grad_error({"x": x.grad, **{n.removeprefix("_orig_mod."): p.grad for n, p in m.named_parameters()}},
                              want)
        calls[name], checks[name] = step, (clear, grads)
    forward = 6 * M * dim * hidden
    floor_us = 3 * forward / ceiling / 1e6
    variants = timed(calls, checks, skipped, floor_us, tol, run.cuda, f"MLP {M}x{dim}x{hidden}", graphs=True)
    swiglu = "SwiGLU " if act == "silu" else ""  # records before SwiGLU: GeGLU, and no word
    return {"label": f"{swiglu}MLP fwd+bwd {M}x{dim}x{hidden}", "kind": "mlp", "M": M, "dim": dim, "hidden": hidden,
            "activation": act,
            "forward_flops": forward, "flops": 3 * forward, "floor_us": floor_us, "bound": "compute",
            "variants": variants, "skipped": skipped}


# ------------------------------------------------------------------------------------------------ the model

def model_forward_flops(config, batch, seq, itemsize):
    """bench_model.costs()' prefill FLOPs, which count the LM head at the last position only; a training step
    runs it at every position."""
    costs = importlib.import_module("bench_model").costs(config, batch, seq, itemsize)
    return costs["prefill_flops"] + 2 * config.vocab_size * config.hidden_size * batch * (seq - 1)


def built(args, run, model06, mlp):
    """07_train_step.py's model, seeded the same for every MLP: the same weights (a swapped MLP gets copies)."""
    torch.manual_seed(0)
    # compile=True only keeps build_lm from adding its record_function hooks per module: they would be timed
    opts = types.SimpleNamespace(model=args.model, layers=args.layers, batch=args.batch, seq=args.seq, mlp=mlp,
                                 checkpoint=False, compile=True)
    return train07.build_lm(opts, run, model06)


def model_case(args, run, ceiling, tol):
    model06 = importlib.import_module("06_model")
    skipped, models = {}, {}
    for name in args.variants:
        mlp = "eager" if name == "compile" else name.removeprefix("compile-")
        if mlp in TRITON_VARIANTS and not run.cuda:
            skipped[name] = NEEDS_CUDA
            continue
        try:
            model, ids = built(args, run, model06, mlp)
        except common.Fail as e:
            skipped[name] = str(e)
            continue
        models[name] = (model, torch.compile(model) if name.startswith("compile") else model)
    if not models:
        return None
    reference = copy.deepcopy(next(iter(models.values()))[0]).float()  # the same weights, in fp32
    reference(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    del reference
    calls, checks = {}, {}
    for name, (model, forward) in models.items():
        opt = train07.OPTIMIZERS["adamw"](model.parameters(), **train07.IMPLEMENTATIONS["foreach"])

        def clear(opt=opt):
            opt.zero_grad(set_to_none=True)

        def step(forward=forward, opt=opt):
            opt.zero_grad(set_to_none=True)
            forward(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            opt.step()

        def grads(model=model, forward=forward):  # one backward without the optimizer: the weights still fp32's
            model.zero_grad(set_to_none=True)
            forward(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            return grad_error({n: p.grad for n, p in model.named_parameters()}, want)
        calls[name], checks[name] = step, (clear, grads)
    config = next(iter(models.values()))[0].config
    forward = model_forward_flops(config, args.batch, args.seq, run.dtype.itemsize)
    floor_us = 3 * forward / ceiling / 1e6
    variants = timed(calls, checks, skipped, floor_us, tol, run.cuda, f"{args.model} training step")
    label = f"{args.model} {args.layers}L train step {args.batch}x{args.seq}"
    return {"label": label, "kind": "model", "preset": args.model, "layers": args.layers, "batch": args.batch,
            "seq": args.seq, "forward_flops": forward, "flops": 3 * forward, "floor_us": floor_us, "bound": "compute",
            "variants": {n: {**v, "execution": "compile" if n.startswith("compile") else "eager",
                             "mlp": "eager" if n == "compile" else n.removeprefix("compile-")}
                         for n, v in variants.items()},
            "skipped": skipped}


# ------------------------------------------------------------------------------------------------ the record

def graphed(r):
    """True where the case's variants were also timed as CUDA graphs (each has a graph time or says why not): the
    MLP cases of a CUDA record made since; not the model's step, a CPU run or a record made before."""
    return any("graph_median_us" in v or "graph_failed" in v for v in r["variants"].values())


def case_lines(r):
    """One case's table: each variant's time from Python, its spread, fraction of the floor, peak memory and
    gradient error; where graphed, its graph replays' time, spread and fraction beside them, and fused against the
    best peer by graph time first (where every variant compared has one), then from Python."""
    graphs = graphed(r)
    lines = [f"\n{r['label']}: forward {r['forward_flops'] / 1e9:.3g} GFLOP, x3 = {r['flops'] / 1e9:.3g} GFLOP; "
             f"floor {r['floor_us']:.1f} µs (3 x forward FLOPs / GEMM ceiling)",
             f"  {'variant':<16}{'µs':>11}{'spread':>8}{'of floor':>10}{'vs eager':>10}{'peak MiB':>10}{'grad err':>10}"
             + (f"{'graph µs':>11}{'spread':>8}{'of floor':>10}" if graphs else "")]
    eager = r["variants"].get("eager", {}).get("median_us")
    for name, v in r["variants"].items():
        peak = f"{v['peak_mib']:10.1f}" if v["peak_mib"] is not None else f"{'-':>10}"
        vs = f"{eager / v['median_us']:9.2f}x" if eager else f"{'-':>10}"
        graph = ""
        if graphs:
            graph = (f"{v['graph_median_us']:11.1f}{bench.spread(v, 'graph_median_us'):8.1%}{v['graph_of_floor']:10.2f}"
                     if "graph_median_us" in v else f"{'-':>11}{'-':>8}{'-':>10}")
        lines.append(f"  {name:<16}{v['median_us']:11.1f}{bench.spread(v):8.1%}{v['of_floor']:10.2f}{vs}{peak}"
                     f"{v['grad_rel_err']:10.1e}{graph}")
    lines += [f"  skipped: {name}: {why}" for name, why in r["skipped"].items()]
    lines += [f"  not as a CUDA graph (timed from Python alone): {name}: {v['graph_failed']}"
              for name, v in r["variants"].items() if "graph_failed" in v]
    if graphs:
        versus = fused_vs_peers(r, "graph_median_us")
        if versus is not None:
            best, ratio, slower, form = versus
            lines.append(f"  fused vs best peer as CUDA graphs: {form} against {best}, {ratio:.2f}x"
                         f"{' SLOWER beyond the spread' if slower else ''}")
        elif fused_vs_peers(r) is not None:
            lines.append("  fused vs best peer as CUDA graphs: - (not every variant compared was captured)")
    if (versus := fused_vs_peers(r)) is not None:
        best, ratio, slower, form = versus
        lines.append(f"  fused vs best peer{' as called' if graphs else ''}: {form} against {best}, {ratio:.2f}x"
                     f"{' SLOWER beyond the spread' if slower else ''}")
    return lines


def fused_vs_peers(r, key="median_us"):
    """(best peer, its µs / the fused form's µs, True when slower beyond both spreads, the fused form): the faster of
    fused (eager) and compile-fused against the fastest of eager, compile and Liger (bench.fused_vs_best), or None
    where no fused form or no peer ran. fused-recompute is the memory mode, not a contender. key "graph_median_us":
    by the graph replays (their rounds' spreads), and None unless every form and peer that ran has one."""
    forms = [name for name in FUSED_FORMS if name in r["variants"]]
    peers = {name: v for name, v in r["variants"].items() if name in PEERS}
    if not forms or not peers or any(key not in r["variants"][name] for name in [*forms, *peers]):
        return None
    form = min(forms, key=lambda name: r["variants"][name][key])
    return (*bench.fused_vs_best({"variants": {**peers, "fused": r["variants"][form]}}, key), form)


def markdown(record):
    """The record as a markdown table (written beside it as .md): per case, each variant's µs, its fraction of the
    floor and its peak memory, and where graphed its graph replays' µs and fraction; "—" where a variant did not run.
    A column per variant the run asked for (timed or skipped somewhere), so a record made before a variant existed
    reads as it did. "fused vs best peer" by graph time where every variant compared has one."""
    asked = [name for name in VARIANTS if any(name in r["variants"] or name in r["skipped"] for r in record["shapes"])]
    rows = ["| case | floor | " + " | ".join(asked) + " | fused vs best peer |", "| --- " * (len(asked) + 3) + "|"]
    for r in record["shapes"]:
        cells = []
        for name in asked:
            v = r["variants"].get(name)
            peak = "" if v is None or v["peak_mib"] is None else f", {v['peak_mib']:,.0f} MiB"
            graph = (f"; graph {v['graph_median_us']:,.1f} µs ({v['graph_of_floor']:.2f})"
                     if v is not None and "graph_median_us" in v else "")
            cells.append("—" if v is None else f"{v['median_us']:,.1f} µs ({v['of_floor']:.2f}{peak}){graph}")
        best = "—"
        by_graph = fused_vs_peers(r, "graph_median_us")
        if (versus := by_graph or fused_vs_peers(r)) is not None:
            other, ratio, slower, form = versus
            best = f"{ratio:.2f}× ({form} / {other}{', graphs' if by_graph else ''}{', slower' if slower else ''})"
        rows.append(f"| {r['label']} | {r['floor_us']:,.1f} µs | " + " | ".join(cells) + f" | {best} |")
    graphs = (f" Graph: {record['graph_timer']}; fused vs best peer by graph time where every variant compared has one."
              if "graph_timer" in record else "")
    rows += ["", (f"µs per step ({record['timer']}); of floor = 3 x forward FLOPs / GEMM ceiling "
                  f"{flop_rate(record['ceiling_tflops'])} over the time; peak memory above the step's start.{graphs} "
                  f"{record['device']}, {record['dtype']}, torch {record['torch']}, triton {record['triton']}, "
                  f"liger-kernel {record['liger_kernel']}, {record['date'][:10]}.")]
    return "\n".join(rows) + "\n"


def main(argv=None):
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if bench.cuda_missing(args.device, "bench_train.py", "tiny shapes"):
        return 2
    dtype = DTYPES[args.dtype]
    run = types.SimpleNamespace(cuda=cuda, device=torch.device(args.device), dtype=dtype)  # what 06 and 07 want
    torch.manual_seed(0)
    ceiling = bench.gemm_ceiling_tflops(dtype) if cuda else bench.cpu_ceilings(dtype)[0]
    try:
        from importlib.metadata import version
        liger_version = version("liger-kernel")
    except Exception:  # noqa: BLE001 - not installed, or no metadata: the record says None
        liger_version = None
    bench.keep_compile_workers()  # no worker start-up burst inside a timing
    record = {**bench.versions(args.device), "liger_kernel": liger_version, "dtype": args.dtype,
              **bench.timing_fields(cuda), "ceiling_tflops": ceiling,
              "floor": "3 x forward GEMM FLOPs / ceiling_tflops (backward's GEMMs do twice forward's)",
              "timed": {"mlp": "grads to None, y = mlp(x), y.backward(dy); x wants a gradient",
                        "model": "07_train_step.py's step: zero_grad, LM loss, backward, AdamW foreach step"},
              **({"graph_timer": GRAPH_TIMER} if cuda else {}),
              "grad_tolerance": GRAD_TOLERANCE[dtype], "activation": args.activation, "shapes": []}
    table = [f"{record['device']}: {args.dtype} GEMM ceiling {flop_rate(ceiling)} (measured now"
             f"{'' if cuda else ': ' + bench.CPU_CEILINGS})"]
    print(table[0])
    tol = GRAD_TOLERANCE[dtype]
    try:
        for M, dim, hidden in args.shapes:
            torch._dynamo.reset()  # a fresh cache per shape: no recompile limit across the sweep
            record["shapes"].append(mlp_case(M, dim, hidden, run, args.variants, ceiling, tol, args.activation))
            table += case_lines(record["shapes"][-1])
            print("\n".join(case_lines(record["shapes"][-1])))
        if args.model != "none":
            torch._dynamo.reset()
            if (case := model_case(args, run, ceiling, tol)) is not None:
                record["shapes"].append(case)
                table += case_lines(case)
                print("\n".join(case_lines(case)))
    except AssertionError as e:
        print(f"bench_train.py: wrong result, nothing written: {e}", file=sys.stderr)
        return 1
    except common.Fail as e:
        print(f"bench_train.py: {e}", file=sys.stderr)
        return 2
    print(bench.write_record(args.out, record, table))
    args.out.with_suffix(".md").write_text(markdown(record))
    print(f"      {args.out.with_suffix('.md')}")
    print(bench_chart_next_to(record, args.out, "training: MLP forward + backward, model step"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
