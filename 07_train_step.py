"""Profile a training step: forward and loss, backward, optimizer; and where the memory goes.

    uv run 07_train_step.py                                      # the post's MLP, 64x128 tokens, 768 -> 3072, AdamW
    uv run 07_train_step.py --optim-impl for-loop                # or foreach (the default), or fused
    uv run 07_train_step.py --model gemma-2b --layers 2 --batch 4 --seq 512 --memory
    uv run 07_train_step.py --model llama-1b --layers 2 --batch 4 --seq 512 --mlp fused   # a SwiGLU model
    uv run 07_train_step.py --layers 4 --memory [--checkpoint]  # four MLPs in a row: compare the two peaks

On a CPU, shapes that take seconds:
    uv run 07_train_step.py --batch 2 --seq 64 --dim 64 --hidden 256 --dtype fp32 --layers 2 [--memory]
    uv run 07_train_step.py --model tiny --batch 2 --seq 32 --dtype fp32      # or --model tiny-llama

One profiler step is one training step: zero_grad(set_to_none=True), then record_function("forward") around
the forward and its loss (MSE against a fixed random target for the MLP, the language-model loss for a model),
"backward" around loss.backward(), "optimizer" around opt.step(); all of it inside "train_step".
--model tiny | gemma-2b (Gemma's GeGLU MLP) | tiny-llama | llama-1b (Llama's SwiGLU MLP) is 06_model.py's decoder at
that preset (random weights, nothing downloaded), its modules annotated by path as there; --mlp liger and fused swap
its MLPs for Liger's or this suite's GeGLU or SwiGLU, as 06_model.py --mlp does.

What to look for (guess first, then look; all but the last are checked after the run):
- the three phases in every step, each with its own GPU time (CPU time on a CPU).
- backward's GEMMs do about twice forward's FLOPs: each GEMM of forward (x @ W) has two in backward, the
  gradient of its input and the gradient of its weight. (The MLP's input stands for the previous layer's
  output, so it wants a gradient too.) With --checkpoint about three times: the forward runs again inside
  backward. Not counted with --mlp fused or fused-recompute: their gate and up GEMMs are inside a Triton kernel,
  no aten op.
- backward runs on the autograd engine's own thread on a GPU (on the calling thread on a CPU). torch.profiler
  links each backward op to the forward op that made it; the report lists the slowest backward ops with theirs.
- the optimizer: a for-loop AdamW runs several ops per parameter, each a kernel on a GPU; foreach a few
  multi-tensor ops (aten::_foreach_*) for all parameters at once; fused one aten::_fused_adamw_, one or two
  kernels at the post's shape. All memory-bound: they read and write the parameters, gradients and two moments.
- memory (profile_memory=True in every run): the step's peak comes around the end of forward, when every
  activation saved for backward is alive; with --checkpoint it moves into backward (a layer rebuilt at a time),
  and with --mlp fused-recompute it may (the MLP saves no g or u and rebuilds them there).
  With very few tokens the optimizer's temporaries, each the size of a parameter, can top it: then "n/a".
- a guess to check with two traces, not in one run: --checkpoint lowers the peak once there are several layers
  (--layers 4, or a model): only one layer's activations are rebuilt at a time. With one MLP it saves nothing,
  the whole MLP is rebuilt. Run both with --memory and compare the category peaks, or the two pictures.

--memory also records the Python stack (with_stack=True) so torch's memory profiler can sort each tensor into
parameter, gradient, optimizer state, input, activation, temporary: <stem>.memory.png stacks them over time
next to the trace, <stem>.memory.json holds the numbers, and each category's peak is printed. On a GPU it also
writes a CUDA memory snapshot (<stem>.snapshot.pickle) for PyTorch's memory viewer. Its Python stacks cost CPU
time: compare timings between runs without --memory.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import importlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from trace_reader.render import memory_picture
from trace_reader.analyzers import training_expect
import inspect_trace as it
from trace_reader.analyzers import memory_timeline

SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
OPTIMIZERS = {"adamw": lambda params, **kw: torch.optim.AdamW(params, lr=1e-4, **kw),
              "sgd": lambda params, **kw: torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)}
IMPLEMENTATIONS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# At least this many ops per parameter in a for-loop step: AdamW's moments, denominator and update; SGD's
# momentum buffer and update.
OPS_PER_PARAMETER = {"adamw": 3, "sgd": 2}
SNAPSHOT_ENTRIES = 200_000  # allocation events the CUDA memory snapshot keeps (the last ones)
# fused_geglu.FusedGatedMLP's two training modes: g and u saved by the forward kernel, or recomputed in backward
FUSED = {"fused": False, "fused-recompute": True}  # --mlp -> its recompute=
# --model: the post's MLP, or one of 06_model.py's PRESETS (not imported here: it imports transformers, slow to load)
MODELS = ("mlp", "tiny", "gemma-2b", "tiny-llama", "llama-1b")


class MLPStack(nn.Module):
    """--layers of the post's MLP one after another; with `checkpointed`, each one's activations are dropped
    after forward and rebuilt in backward (torch.utils.checkpoint)."""

    def __init__(self, blocks, checkpointed=False):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x


def expectations(args, params, param_bytes):
    """Guess first, then look: checked against the trace after the run."""
    out = [it.steps(args.active, "train_step"), training_expect.phases_present()]
    if args.mlp not in FUSED:  # the fused kernel's GEMMs are no aten op: the trace cannot count their FLOPs
        out.append(training_expect.backward_flops(2.25, 3.5, "--checkpoint: input and weight gradients, and the "
                                           "checkpointed forward once more") if args.checkpoint else
                   training_expect.backward_flops(1.5, 2.5, "a gradient for each GEMM's input and one for its weight"))
    # a trace read back may lower the floor: its SGD's momentum is not known (training.train_flags)
    per_param = args.__dict__.get("ops_per_parameter") or OPS_PER_PARAMETER[args.optimizer]
    out.append(training_expect.optimizer_kind(args.optim_impl, params, per_param))
    out.append(training_expect.peak_after_forward(args.checkpoint, param_bytes,
                                           "the fused MLP with recompute=True (g and u)"
                                           if args.mlp == "fused-recompute" else None))
    return out


def check_optimizer(args, run):
    """An implementation this torch cannot run on this device and dtype fails here, in one line, before the model
    is built: one step on a two-element tensor."""
    probe = torch.zeros(2, device=run.device, dtype=run.dtype, requires_grad=True)
    try:
        opt = OPTIMIZERS[args.optimizer]([probe], **IMPLEMENTATIONS[args.optim_impl])
        probe.grad = torch.ones_like(probe)
        opt.step()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        raise common.Fail(f"--optim-impl {args.optim_impl}: torch {torch.__version__} cannot run {args.optimizer} that "
                          f"way on this {run.device.type} in {args.dtype} ({str(e).strip().splitlines()[0][:120]}); "
                          "try --optim-impl foreach") from None


def build_mlp(args, run):
    d, h = args.dim, args.hidden
    blocks = [SimpleGeGLUMLP(d, h) for _ in range(args.layers)]
    if args.mlp != "eager":  # correct before fast: the same output as the post's MLP, same weights
        eager = MLPStack(blocks).to(run.device, run.dtype)
        blocks = [swapped(args.mlp, b, d, h) for b in blocks]
        model = MLPStack(blocks).to(run.device, run.dtype)
        x = torch.randn(2, 16, d, device=run.device, dtype=run.dtype)
        with torch.no_grad():
            common.check_close(run, f"--mlp {args.mlp}", model(x), eager(x))
    return MLPStack(blocks, args.checkpoint).to(run.device, run.dtype).train()


def eager_mlp(d, h, act="gelu_tanh"):
    """The eager gated MLP: the post's SimpleGeGLUMLP, or for SwiGLU (act="silu") transformers' LlamaMLP (Qwen's and
    Mistral's are the same module). Same parameter names (gate_proj, up_proj, down_proj): the benchmarks' eager peer."""
    if act != "silu":
        return SimpleGeGLUMLP(d, h)
    from transformers import LlamaConfig  # slow to import: only when asked
    from transformers.models.llama.modeling_llama import LlamaMLP
    # one attention head: a config's check that heads divide the width, which the MLP does not read
    return LlamaMLP(LlamaConfig(hidden_size=d, intermediate_size=h, hidden_act="silu", num_attention_heads=1,
                                num_key_value_heads=1))


def swapped(kind, block, d, h, act="gelu_tanh"):
    """Liger's LigerGEGLUMLP (LigerSwiGLUMLP with act="silu") or this suite's FusedGatedMLP with `block`'s weights
    (same parameter names)."""
    try:
        if kind == "liger" and act == "silu":
            from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

            new = LigerSwiGLUMLP(importlib.import_module("03_kernels_mlp").Config(d, h, hidden_act="silu"))
        elif kind == "liger":
            from liger_kernel.transformers.geglu import LigerGEGLUMLP

            new = LigerGEGLUMLP(importlib.import_module("03_kernels_mlp").Config(d, h))
        else:
            from fused_geglu import FusedGatedMLP

            new = FusedGatedMLP(d, h, act, recompute=FUSED[kind])
    except ImportError as e:
        raise common.Fail(f"--mlp {kind} needs the {e.name or '?'} package, which is not installed here") from None
    new.load_state_dict(block.state_dict())
    return new


def checkpoint_layers(model):
    """transformers' activation checkpointing: torch.utils.checkpoint around each decoder layer."""
    if hasattr(model, "activation_checkpointing_enable"):  # the newer name; the old one warns that it is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # transformers before the rename
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_lm(args, run, model06):
    """06_model.py's decoder at a preset, in training mode, its modules annotated (not under --compile)."""
    config = model06.preset_config(args.model)
    config.num_hidden_layers = args.layers
    model = model06.build_model(config, run)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=run.device)
    if args.mlp != "eager":  # correct before fast: the same logits as transformers' own MLP, same weights
        with torch.no_grad():
            expected = model(input_ids=ids[:, :64], use_cache=False).logits
            model06.swap_mlps(model, args.mlp, run)
            common.check_close(run, f"--mlp {args.mlp}", model(input_ids=ids[:, :64], use_cache=False).logits,
                               expected, "the model with its own MLP")
    if args.checkpoint:
        checkpoint_layers(model)
    if not args.compile:  # a record_function in a module hook would split Dynamo's graph
        model06.annotate_modules(model)
    return model.train(), ids


def main():
    p = common.parser(__doc__, batch=64, seq=128, dim=768, hidden=3072)
    p.add_argument("--model", choices=MODELS, default="mlp",
                   help="the post's MLP, or 06_model.py's decoder at a preset: Gemma's (tiny, gemma-2b) or Llama's "
                   "(tiny-llama, llama-1b; a SwiGLU MLP); --dim/--hidden then come from it")
    p.add_argument("--layers", type=common.int_arg(1, 1000), default=None,
                   help="MLPs in a row, or decoder layers (default: 1 MLP; the preset's layers)")
    p.add_argument("--mlp", choices=["eager", "liger", *FUSED], default="eager",
                   help="the MLP: PyTorch ops, Liger's LigerGEGLUMLP (LigerSwiGLUMLP for a SwiGLU model) or "
                   "fused_geglu.FusedGatedMLP (CUDA only; fused saves g and u for backward, fused-recompute rebuilds "
                   "them there)")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), default="adamw",
                   help="torch.optim.AdamW (lr 1e-4) or SGD with momentum 0.9 (lr 1e-3)")
    p.add_argument("--optim-impl", choices=list(IMPLEMENTATIONS), default="foreach",
                   help="torch.optim's for-loop (foreach=False), foreach=True or fused=True")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing: each MLP / decoder layer's "
                   "activations rebuilt in backward (torch.utils.checkpoint)")
    p.add_argument("--memory", action="store_true", help="memory by category: with_stack=True, <stem>.memory.png and "
                   ".json; on a GPU also a CUDA memory snapshot")
    args = p.parse_args()
    lm = args.model != "mlp"
    if args.mlp != "eager" and (args.device == "cpu" or not torch.cuda.is_available()):
        raise common.Fail(f"--mlp {args.mlp} runs a Triton kernel, which needs a CUDA GPU; on this machine use "
                          "--mlp eager")
    model06 = importlib.import_module("06_model") if lm else None  # imports transformers: only when needed
    if lm:
        preset = model06.PRESETS[args.model]
        args.layers = args.layers or preset["num_hidden_layers"]
        if args.seq > preset["max_position_embeddings"]:
            raise common.Fail(f"--seq {args.seq} is longer than the {args.model} preset's "
                              f"{preset['max_position_embeddings']} positions")
        d, h, vocab = preset["hidden_size"], preset["intermediate_size"], preset["vocab_size"]
    else:
        args.layers = args.layers or 1
        d, h, vocab = args.dim, args.hidden, 0
    b, s, L = args.batch, args.seq, args.layers
    weights = L * (3 * d * h + (4 * d * d if lm else 0)) + 2 * vocab * d
    # parameters, gradients and two moments; per token and layer the MLP's four [tokens, hidden] activations and
    # a few [tokens, dim] ones; a model's logits in fp32 and their gradient
    run = common.setup(__file__, args, elements=4 * weights + b * s * (L * (4 * h + 6 * d) + 4 * vocab))
    common.describe(run)
    check_optimizer(args, run)
    if args.mlp in FUSED and run.cuda:  # the kernel it asks to see, at any token count
        importlib.import_module("fused_geglu").show_the_kernel(run.device, b * s, d, h)

    if lm:
        model, ids = build_lm(args, run, model06)
        forward = torch.compile(model) if args.compile else model

        def loss_fn():  # the language-model loss: next-token cross-entropy, computed by transformers
            return forward(input_ids=ids, labels=ids, use_cache=False).loss
    else:
        model = build_mlp(args, run)
        forward = torch.compile(model) if args.compile else model
        # The input stands for the previous layer's output, so backward computes its gradient too (as in a model).
        x = torch.randn(b, s, d, device=run.device, dtype=run.dtype, requires_grad=True)
        target = torch.randn(b, s, d, device=run.device, dtype=run.dtype)

        def loss_fn():
            x.grad = None  # not a parameter: the optimizer's zero_grad leaves it alone
            return F.mse_loss(forward(x), target)
    opt = OPTIMIZERS[args.optimizer](model.parameters(), **IMPLEMENTATIONS[args.optim_impl])
    params = sum(1 for _ in model.parameters())
    param_bytes = sum(q.numel() * q.element_size() for q in model.parameters())
    print(f"model: {args.model}, {common.plural(L, 'layer' if lm else 'MLP')}, {params} parameter "
          f"tensors ({sum(q.numel() for q in model.parameters()) / 1e6:,.1f} M elements); "
          f"{args.optimizer} {args.optim_impl}, MLP {args.mlp}{', checkpointed' if args.checkpoint else ''}")

    def step():
        opt.zero_grad(set_to_none=True)
        with record_function("forward"):
            loss = loss_fn()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()

    shape = (f"{args.model}-{L}L_{b}x{s}" if lm else f"mlp-{L}L_{b}x{s}x{d}x{h}") + \
        f"_{args.optimizer}-{args.optim_impl}_mlp-{args.mlp}" + "_ckpt" * args.checkpoint + "_memory" * args.memory
    snapshot = args.memory and run.cuda
    if snapshot:  # every allocation and free from here on, with its stack, for PyTorch's memory viewer
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
    prof = common.profile(run, step, "train_step", profile_memory=True, with_stack=args.memory)
    trace, table = common.export(run, prof, shape)
    notes = []
    if snapshot:
        notes.append(write_snapshot(trace))
    if args.memory:
        notes.append(memory_pictures(run, prof, trace))
    common.show(run, trace, table, expectations(args, params, param_bytes))
    for note in notes:
        print(f"\n{note}")


def stem_of(trace: Path) -> str:
    return trace.name.removesuffix(".gz").removesuffix(".json")


def write_snapshot(trace: Path) -> str:
    """The CUDA memory snapshot next to the trace (written whole, then moved into place), and how to open it."""
    path = trace.with_name(stem_of(trace) + ".snapshot.pickle")
    fd, tmp = tempfile.mkstemp(prefix=".snapshot-", dir=trace.parent)
    os.close(fd)
    try:
        torch.cuda.memory._dump_snapshot(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        raise common.Fail(f"could not write {path.name}: {e.strerror or e} (the trace was written: {trace})") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
        torch.cuda.memory._record_memory_history(enabled=None)
    return (f"wrote {path}\n      open it at https://pytorch.org/memory_viz (drag the file in: the page reads it in "
            f"your browser, nothing is uploaded), or offline: python -m torch.cuda._memory_viz trace_plot {path.name} "
            f"-o {stem_of(trace)}.snapshot.html")


def memory_pictures(run, prof, trace: Path) -> str:
    """torch's memory timeline by category, saved as <stem>.memory.json and drawn as <stem>.memory.png."""
    stem = stem_of(trace)
    fd, tmp = tempfile.mkstemp(prefix=".timeline-", suffix=".json", dir=trace.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings():  # deprecated in newer torch in favour of the CUDA snapshot, which is CUDA-only
            warnings.simplefilter("ignore", FutureWarning)
            prof.export_memory_timeline(tmp, device="cuda:0" if run.cuda else "cpu")
        rows = json.loads(Path(tmp).read_text())
    except (AttributeError, OSError, ValueError, RuntimeError) as e:
        return f"memory timeline: not written ({type(e).__name__}: {str(e).strip()[:120]})"
    finally:
        Path(tmp).unlink(missing_ok=True)
    loaded = it.load_trace(trace)
    base = loaded.meta.get("baseTimeNanoseconds")  # the trace's "ts" are µs after this; the timeline's since 1970
    aligned = type(base) is int
    try:
        timeline = memory_timeline.from_torch_export(rows, run.device.type, base / 1e3 if aligned else 0.0,
                                                     category_names())
        data = memory_timeline.write(timeline, trace.with_name(stem + ".memory.json"))
        png = memory_picture.draw(timeline, trace.with_name(stem + ".memory.png"), loaded if aligned else None,
                                   f"{stem}: memory by category")
    except it.TraceError as e:
        return f"memory timeline: not drawn: {e}"
    return f"wrote {data}\n      {png}\n{memory_timeline.peaks_text(timeline, loaded if aligned else None)}"


def category_names():
    """torch's memory categories in the order its timeline export writes them (memory_timeline's copy if moved)."""
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX
    except ImportError:
        return memory_timeline.CATEGORIES
    return [c.name.lower() if c is not None else "unknown" for c in sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.get)]


if __name__ == "__main__":
    common.main(main)
