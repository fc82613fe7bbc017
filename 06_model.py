"""Profile a whole decoder, module by module: prefill (the prompt in one forward) and decode (one token at a time).

    uv run 06_model.py --preset tiny --phase prefill
    uv run 06_model.py --preset tiny --phase decode
    uv run 06_model.py --preset gemma-2b --layers 4 --batch 1 --seq 512 --phase decode [--compile | --cuda-graphs]
    uv run 06_model.py --preset gemma-2b --layers 4 --phase prefill --mlp fused      # or --mlp liger
    uv run 06_model.py --preset tiny-llama --phase prefill                           # a SwiGLU model (Llama's)
    uv run 06_model.py --config path/to/config.json                                  # your own model's shape

A transformers decoder with random weights built from a config: nothing is downloaded. The default is
Gemma-shaped, whose MLP is the post's GeGLU MLP (hidden_act="gelu_pytorch_tanh"): gate_proj, up_proj,
gelu_tanh(gate) * up, down_proj. Llama, Qwen and Mistral run the same MLP with SiLU (SwiGLU, hidden_act="silu": the
tiny-llama and llama-1b presets). `--config` takes any causal-LM config: a local config.json, or a Hub id
when the Hub is reachable (offline, one line says so and the preset is used).

What to look for in the trace (Perfetto, or the report printed below):
- every decoder layer's self_attn, mlp and norms, the embedding and the LM head are record_function spans
  named by module path (model.layers.3.mlp), so the report can say where the time goes per module type and
  per layer. A module's time holds its submodules'.
- decode: one token per sequence per step against a static KV cache of --seq entries (what generation runs).
  Eager, the GPU idles most of the step: hundreds of small kernels, each a launch the CPU must pay for.
  --compile fuses the pointwise work into far fewer kernels; --cuda-graphs (mode="reduce-overhead") replays
  the whole token as one cudaGraphLaunch.
- prefill: batch x seq tokens in one forward; compute-bound, and the MLP's GEMMs take the largest share.
- --mlp fused: each MLP is two kernels (the GEMM with the GeGLU or SwiGLU epilogue + down_proj): no GeLU (SiLU), no
  mul. --mlp fused and --mlp liger replace a GeGLU or a SwiGLU MLP; a model with another MLP is refused in one line.
- under --compile the module spans are left out: a record_function in a module hook breaks Dynamo's graph
  into pieces, which would change what is measured. The compiled trace shows the whole forward.
"""

import importlib
import inspect
import logging
import os
import re
from pathlib import Path

import torch
import transformers
from torch.profiler import record_function

import common
import inspect_trace as it
from trace_reader.analyzers import modules

HUB_TIMEOUT = float(os.environ.get("HUB_TIMEOUT", "20"))  # seconds; a firewall can otherwise hang for minutes
# Gemma's architecture (a GeGLU MLP) and Llama's (SwiGLU), vocab 32000 (Gemma's own 256000 would put 1 GB in the
# embedding alone; Llama 3's 128256 half that). llama-1b is Llama-3.2-1B's shape.
PRESETS = {
    "tiny": dict(model_type="gemma", hidden_act="gelu_pytorch_tanh", hidden_size=64, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=512,
                 max_position_embeddings=2048),
    "gemma-2b": dict(model_type="gemma", hidden_act="gelu_pytorch_tanh", hidden_size=2048, intermediate_size=16384,
                     num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=32000,
                     max_position_embeddings=8192),
    "tiny-llama": dict(model_type="llama", hidden_act="silu", hidden_size=64, intermediate_size=176,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                       max_position_embeddings=2048),
    "llama-1b": dict(model_type="llama", hidden_act="silu", hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=32000,
                     max_position_embeddings=8192),
}
# The gated MLPs --mlp fused and --mlp liger replace: transformers' activation name -> the fused kernels' (GeGLU's
# gelu_tanh, SwiGLU's silu; transformers' "swish" is SiLU too).
GATED = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
WHAT_IT_LAUNCHES = {  # per activation: transformers' op, its name, the MLP's, the pattern of Liger's kernel
    "gelu_tanh": (r"^aten::gelu$", "GeLU", "GeGLU", "geglu"),
    "silu": (r"^aten::silu$", "SiLU", "SwiGLU", "swiglu"),
}


def expectations(args, layers, act="gelu_tanh"):
    """Guess first, then look: checked against the trace after the run. act: the gated MLP's activation (GATED's
    values), None for another MLP (nothing guessed about it)."""
    step = args.phase
    out = [it.steps(args.active, step)]
    if args.compile:
        out.append(it.cpu_event(r"^Torch-Compiled Region", device="any"))
    else:  # layers None (a trace read back that does not say): layers 0 to the highest annotated, at least one
        out.append(modules.modules_annotated(layers, step))
    if step == "decode" and args.cuda_graphs:
        out.append(modules.runtime_calls("cudaGraphLaunch", 1, "the whole token replayed as one CUDA graph"))
    elif step == "decode" and args.compile:
        fewer = "Inductor fuses each layer's pointwise work: far fewer than eager's 40+ per layer"
        out.append(modules.kernels_between(0, 25 * layers, fewer) if layers else
                   modules.layers_unknown(f"at most 25 GPU kernels per step per layer ({fewer})", "cuda"))
    elif step == "decode":
        out.append(it.bound("overhead"))
        many = "hundreds of launches per token: 40+ per layer"
        out.append(modules.kernels_between(40 * layers, None, many) if layers else
                   modules.layers_unknown(f"at least 40 GPU kernels per step per layer ({many})", "cuda"))
    else:
        out.append(it.bound("compute"))
        out.append(modules.largest_module("mlp", step))
    if act in WHAT_IT_LAUNCHES and not args.compile:  # what one annotated MLP launches besides its GEMMs
        op, fn, glu, liger = WHAT_IT_LAUNCHES[act]
        pointwise = (op, r"^aten::mul$")
        out.append({"eager": modules.module_launches("mlp", f"a {fn} and a mul kernel between its GEMMs", has=pointwise),
                    "liger": modules.module_launches("mlp", f"Liger's one {glu} kernel: no {fn}, no mul", (liger,),
                                                     pointwise),
                    # the fused kernels keep their _geglu_ names for both activations
                    "fused": modules.module_launches("mlp", f"the GEMM with the {glu} epilogue: no {fn}, no mul",
                                                     ("geglu",), pointwise)}[args.mlp])
    return out


def load_config(args):
    """(config, its name in file names): a preset, a local config.json or folder, or a Hub id (bounded wait, and
    the preset when the Hub cannot be reached)."""
    name = args.config or args.preset
    if not args.config:
        config = preset_config(args.preset)
    elif Path(args.config).exists() or args.config.endswith(".json") or args.config.startswith((".", "/", "~")):
        if not Path(args.config).exists():
            raise common.Fail(f"--config {args.config}: no such file or folder")
        try:
            config = transformers.AutoConfig.from_pretrained(args.config)
        except (OSError, ValueError, KeyError) as e:
            raise common.Fail(f"--config {args.config}: cannot read a transformers config there ({first_line(e)})") \
                from None
        name = Path(args.config).stem if Path(args.config).is_file() else Path(args.config).name
    elif not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", args.config):
        raise common.Fail(f"--config {args.config!r}: neither a file nor a Hub id (owner/name)")
    else:
        # huggingface_hub retries an unreachable Hub with a warning per try ("Retrying in 1s [Retry 1/5]"), also after
        # the wait below gave up (its thread goes on): the one line below says it. Errors (a gated repo) still pass.
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        try:
            config = common.call_with_timeout(lambda: transformers.AutoConfig.from_pretrained(args.config),
                                              HUB_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - a Hub that says "no such repo": fail; an unreachable one: fall back
            if type(e).__name__ in ("RepositoryNotFoundError", "GatedRepoError") or "not a valid model identifier" \
                    in str(e):
                raise common.Fail(f"--config {args.config}: not on the Hugging Face Hub ({first_line(e)})") from None
            print(f"Hugging Face Hub config not available ({type(e).__name__}: {first_line(e)}); "
                  f"using the {args.preset} preset")
            return preset_config(args.preset), args.preset
        name = args.config.split("/")[-1]
    if getattr(config, "is_encoder_decoder", False):
        raise common.Fail(f"--config {args.config}: an encoder-decoder model; this script profiles decoder-only ones")
    return config, re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-").lower() or "model"


def preset_config(preset):
    fields = dict(PRESETS[preset])
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)


def first_line(e):
    return (str(e).strip().splitlines() or ["no details"])[0][:160]


def activation_name(config):
    """transformers' name for the MLP's activation (Gemma 2 and 3 call the field hidden_activation, GPT-2
    activation_function), or None."""
    return next((a for a in (getattr(config, f, None) for f in ("hidden_activation", "hidden_act",
                                                                "activation_function")) if a), None)


def gated_activation(config):
    """The fused kernels' activation for this config's gated MLP, act(gate_proj(x)) * up_proj(x) then down_proj:
    gelu_tanh (GeGLU: Gemma's MLP is the post's) or silu (SwiGLU: Llama's, Qwen's, Mistral's); None for another."""
    return GATED.get(activation_name(config))


def mlp_maker(kind, config, run):
    """make(config) -> --mlp KIND's MLP module; one line (Fail) when it cannot run here: checked before the model
    is built, so a refusal costs nothing."""
    act = gated_activation(config)
    if act is None:
        raise common.Fail(f"--mlp {kind} replaces a GeGLU MLP (gelu_pytorch_tanh) or a SwiGLU MLP (silu); this "
                          f"config's is {activation_name(config) or 'not named'}")
    if not run.cuda and not (kind in ("fused", "fused-recompute") and os.environ.get("TRITON_INTERPRET") == "1"):
        raise common.Fail(f"--mlp {kind} runs a Triton kernel, which needs a CUDA GPU; on this machine use --mlp eager")
    try:
        if kind == "liger" and act == "silu":
            from liger_kernel.transformers.swiglu import LigerSwiGLUMLP as make
        elif kind == "liger":
            from liger_kernel.transformers.geglu import LigerGEGLUMLP as make
        else:
            from fused_geglu import FusedGatedMLP

            def make(c):  # fused-recompute: 07_train_step.py's other training mode
                return FusedGatedMLP(c.hidden_size, c.intermediate_size, act, recompute=kind == "fused-recompute")
    except ImportError as e:
        raise common.Fail(f"--mlp {kind} needs the {e.name or '?'} package, which is not installed here") from None
    return make


def swap_mlps(model, kind, run):
    """Replace every decoder layer's MLP by Liger's (LigerGEGLUMLP, LigerSwiGLUMLP) or this suite's FusedGatedMLP,
    weights copied."""
    make = mlp_maker(kind, model.config, run)
    for layer in decoder_layers(model)[1]:
        with run.device:  # built where it runs: no CPU initialisation of 100M parameters per layer
            new = make(model.config).to(run.dtype).eval()
        try:
            new.load_state_dict(layer.mlp.state_dict())  # same names: gate_proj, up_proj, down_proj
        except RuntimeError as e:
            raise common.Fail(f"--mlp {kind}: this model's MLP has other weights ({first_line(e)})") from None
        layer.mlp = new


def build_model(config, run):
    """Random weights from the config, built on the device: nothing is downloaded."""
    with run.device:
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=run.dtype, attn_implementation="sdpa")
        except ValueError as e:
            raise common.Fail(f"{type(config).__name__} is not a causal language model transformers can build "
                              f"({first_line(e)})") from None
    return model.eval()


def cache_argument(model):
    """The forward's name for the KV cache: transformers >= 5.20 says `cache`, earlier 5.x `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decoder_layers(model):
    """(path, the ModuleList of decoder layers): the longest ModuleList in the model."""
    lists = [(p, m) for p, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise common.Fail(f"{type(model).__name__} has no list of decoder layers to annotate")
    return max(lists, key=lambda pm: len(pm[1]))


def annotate_modules(model):
    """record_function spans named by module path, entered in a forward pre-hook and left in a forward hook:
    the embedding, final norm, rotary embedding, each decoder layer and each of its parts, the LM head.
    Returns the paths annotated."""
    path, layers = decoder_layers(model)
    parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    prefix = path.rpartition(".")[0]
    names = {f"{prefix}.{n}" if prefix else n: m for n, m in parent.named_children() if m is not layers}
    for i, layer in enumerate(layers):
        names[f"{path}.{i}"] = layer
        names.update({f"{path}.{i}.{n}": m for n, m in layer.named_children()})
    head = model.get_output_embeddings()
    if head is not None:
        names[next(p for p, m in model.named_modules() if m is head)] = head
    for name, module in names.items():
        add_span(module, name)
    return list(names)


def add_span(module, name):
    """Every call of module becomes a record_function span called name (a pre-hook opens it, a hook closes it)."""
    spans = []  # a stack: one open span per call in flight

    def enter(mod, args):
        span = record_function(name)
        span.__enter__()
        spans.append(span)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(lambda mod, args, out: spans.pop().__exit__(None, None, None))


def main():
    p = common.parser(__doc__, post_sizes=False, batch=1, seq=512)
    p.add_argument("--preset", choices=list(PRESETS), default="gemma-2b", help="the model's shape (see PRESETS)")
    p.add_argument("--config", metavar="NAME_OR_PATH",
                   help="a transformers config: config.json, a folder, or a Hub id (default: the --preset's)")
    p.add_argument("--layers", type=common.int_arg(1, 1000), help="decoder layers (default: the config's)")
    p.add_argument("--vocab", type=common.int_arg(1, 1 << 22), help="vocabulary size (default: the config's)")
    p.add_argument("--phase", choices=["prefill", "decode"], default="decode",
                   help="prefill: batch x seq tokens in one forward; decode: one token per sequence against a KV cache "
                   "of --seq entries")
    p.add_argument("--cuda-graphs", action="store_true", help="decode with torch.compile(mode='reduce-overhead')")
    p.add_argument("--mlp", choices=["eager", "liger", "fused"], default="eager",
                   help="each layer's MLP: transformers' own, Liger's LigerGEGLUMLP (LigerSwiGLUMLP for a SwiGLU "
                   "model) or fused_geglu.FusedGatedMLP")
    args = p.parse_args()
    if args.cuda_graphs and args.phase != "decode":
        raise common.Fail("--cuda-graphs replays a decode step; use it with --phase decode")
    args.compile = args.compile or args.cuda_graphs

    config, config_name = load_config(args)
    config.num_hidden_layers = args.layers or config.num_hidden_layers
    config.vocab_size = args.vocab or config.vocab_size
    b, s, positions = args.batch, args.seq, getattr(config, "max_position_embeddings", None)
    if positions and s > positions:
        raise common.Fail(f"--seq {s} is longer than this config's {positions} positions (max_position_embeddings)")
    decode_steps = args.warmup + args.wait + args.profiler_warmup + args.active  # each one appends a token to the cache
    if args.phase == "decode" and s <= decode_steps:
        raise common.Fail(f"--seq {s}: the KV cache must hold a prompt and the {decode_steps} decode steps")
    d, h, L = config.hidden_size, getattr(config, "intermediate_size", 4 * config.hidden_size), config.num_hidden_layers
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
    weights = L * (3 * d * h + 2 * d * (config.num_attention_heads + kv) * head_dim) + 2 * config.vocab_size * d
    activations = b * s * (4 * d + 3 * h + config.num_attention_heads * s)  # prefill's largest at once, scores too
    run = common.setup(__file__, args, elements=weights + 2 * L * b * kv * s * head_dim + activations)
    if args.cuda_graphs and not run.cuda:
        raise common.Fail("--cuda-graphs replays a CUDA graph, which needs a CUDA GPU; on this machine try --compile")
    if args.mlp != "eager":
        mlp_maker(args.mlp, config, run)  # a refusal now, not after building the model
    common.describe(run)
    variant = "cudagraphs" if args.cuda_graphs else run.mode
    print(f"model: {config_name} ({type(config).__name__}), {common.plural(L, 'layer')}, hidden {d}, intermediate {h}, "
          f"{config.num_attention_heads} heads / {kv} KV, head_dim {head_dim}, vocab {config.vocab_size}; "
          f"{args.phase}, batch {b}, seq {s}, MLP {args.mlp}, {variant}")
    if args.mlp == "fused" and run.cuda:  # the kernel it asks to see, at any token count
        tokens = b * s if args.phase == "prefill" else b
        importlib.import_module("fused_geglu").show_the_kernel(run.device, tokens, d, h)

    model = build_model(config, run)
    ids = torch.randint(0, config.vocab_size, (b, s), device=run.device)
    if args.mlp != "eager":  # correct before fast: the same logits as transformers' own MLP, same weights
        with torch.no_grad():
            expected = model(input_ids=ids[:, :64], use_cache=False).logits
            swap_mlps(model, args.mlp, run)
            common.check_close(run, f"--mlp {args.mlp}", model(input_ids=ids[:, :64], use_cache=False).logits,
                               expected, "the model with its own MLP")
    annotated = [] if args.compile else annotate_modules(model)  # hooks after the swap: they name the new MLPs
    forward = torch.compile(model, mode="reduce-overhead" if args.cuda_graphs else None) if args.compile else model
    cache_kw = cache_argument(model)

    if args.phase == "prefill":
        @torch.no_grad()
        def step():  # the whole prompt in one forward; generation only needs the last position's logits
            return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    else:
        cache = transformers.StaticCache(config=config, max_cache_len=s)
        with torch.no_grad():  # the prompt fills the cache up to where the profiled tokens go (not profiled)
            model(input_ids=ids[:, : s - decode_steps], use_cache=True, **{cache_kw: cache})
        token = ids[:, -1:]

        @torch.no_grad()
        def step():  # one new token per sequence; attention reads all --seq cache entries (the rest masked)
            return forward(input_ids=token, use_cache=True, **{cache_kw: cache}).logits

    shape = f"{config_name}-{L}L_{args.phase}_{b}x{s}_mlp-{args.mlp}" + ("_cudagraphs" if args.cuda_graphs else "")
    vocab = f"_vocab{args.vocab}" if args.vocab else ""  # the only size not already in the shape
    if args.compile:
        print("module spans: off under --compile (a record_function in a module hook splits Dynamo's graph)")
    else:
        example = next((n for n in annotated if n.endswith(".mlp")), annotated[0])  # this model's names
        print(f"module spans: {len(annotated)} modules annotated by path ({example}, ...)")
    trace, _ = common.record(run, step, args.phase, shape, expectations(args, L, gated_activation(config)), flags=vocab)
    if not args.compile:
        print()
        print(modules.breakdown_text(modules.breakdown(it.load_trace(trace), args.phase)))


if __name__ == "__main__":
    common.main(main)
