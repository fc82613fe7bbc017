"""Launching the kernels with little host time: the compiled kernel's own launcher, plans kept per shape, the split-K
workspace, and each kernel's arguments (TMA descriptors included).

At decode the GPU work is short (73 µs for a 4096 -> 11008 MLP at one token on an H200) and the host has to keep up:
a Triton launch through `kernel[grid](...)` re-derives the kernel's specialisation from every argument in Python,
about 25 µs a launch on the H200 machine's CPU against about 12 µs through the compiled kernel's own launcher.
`launch` looks the compiled kernel up once per argument signature and launches it directly, and split-K keeps its
workspace: enqueuing a decode forward went from about 105 µs of host time to about 80, about as long as the GPU work
itself (bench.py's "host µs" line; the machine's host speed varies from run to run). Then every choice a call makes was
kept per shape, dtype, device and stream (`plans`: the module's forward is one plan, ops.mlp):
61-82 µs against eager's 110-133 at three decode shapes (results/bench_decode_host_h200.txt). Those kept launches still
went through Triton's runner: since Triton 3.5 the launch-hook knobs are chains, never None, and an empty chain read as
a hook set. Since 2026-12-02 (`launch_hooked`) they call the compiled kernel's launcher directly while no hook is set:
at M = 1 on the H200 machine, 34-52 µs of host time per forward against 61-63 through the runner (one probe, two
rounds; not a committed record).
"""

import concurrent.futures

import torch
import triton

from . import kernels, machine, table
# By name, not through kernels: torch.library's triton_op finds the kernels an op launches by following plain names from
# its body (ops.geglu_op -> ... -> geglu_launch's return), and AOTAutograd's cache key holds those kernels' source.
from .kernels import geglu_pointer_kernel, geglu_small_m_kernel, geglu_tma_kernel, linear_small_m_kernel


# ---- the compiled kernel's own launcher: compiled once per argument signature, launched directly ----

compiled_kernels = {}  # (kernel, what its launch specialises on) -> (Triton's compiled kernel, the constexprs in order)
_SPEC_TYPES = (torch.Tensor,) if machine.TensorDescriptor is None else (torch.Tensor, machine.TensorDescriptor)


def _spec(arg):
    # What a Triton launch specialises on besides integer values (in the key as they are: a superset of
    # Triton's "== 1" and "% 16"): a tensor's dtype and 16-byte alignment, a TMA descriptor's tensor and block.
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    return _spec(arg.base) + (tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape))


def launch(kernel, grid, args, **meta):
    """kernel[grid](*args, **meta) with less host time. Triton's launch re-derives the kernel's
    specialisation from every argument in Python on each call (about 25 µs on the H200 machine's CPU, and a
    decode step waits on the host); here the compiled kernel is looked up once per argument signature and
    launched directly. args are the non-constexpr arguments in order; meta holds constexprs and options.
    Traced by torch.compile (inside ops.py's triton_ops), the launch goes into the graph through wrap_triton,
    so Inductor calls the kernel from its own generated code."""
    if machine.tracing(args[0]):
        return torch.library.wrap_triton(kernel)[grid](*args, **meta)
    if machine.INTERPRET:  # the kernel runs as CPU ops (new_empty, set_, copy_...): a span named after it says whose
        with torch.profiler.record_function(kernel.fn.__name__):
            return kernel[grid](*args, **meta)
    device = machine.driver().get_current_device()
    compiled, constexprs = _compiled_for(kernel, grid, args, meta, device)
    compiled[grid + (1,) * (3 - len(grid))](*args, *constexprs, stream=machine.driver().get_current_stream(device))


def _compiled_for(kernel, grid, args, meta, device):
    """(Triton's compiled kernel, its constexprs in parameter order) for these arguments: compiled once per
    argument signature."""
    key = (kernel, device, *[_spec(a) if isinstance(a, _SPEC_TYPES) else a for a in args],
           *meta.items())
    entry = compiled_kernels.get(key)
    if entry is None:
        compiled, meta = _compile_to_fit(kernel, grid, args, meta, device)
        if len(compiled_kernels) > 4096:  # integer arguments (M) are part of the key: keep it bounded
            compiled_kernels.clear()
        names = kernel.arg_names[len(args):]
        if not all(name in meta for name in names):  # a constexpr left out takes its default (ACT: GeGLU's)
            meta = {**{p.name: p.default for p in kernel.params if p.has_default}, **meta}
        entry = compiled_kernels[key] = (compiled, tuple(meta[name] for name in names))
    return entry


def _compile_to_fit(kernel, grid, args, meta, device):
    """Compile kernel for these arguments; while its pipeline needs more shared memory than the GPU has (the
    configs are sized for a Hopper GPU's 227 KB; fp32 tiles take twice the bytes, a desktop GPU has ~100 KB),
    compile it again with one stage fewer. Returns the compiled kernel and the meta it was compiled with."""
    limit = machine.driver().utils.get_device_properties(device)["max_shared_mem"]
    while True:
        compiled = kernel.warmup(*args, grid=grid, **meta)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
            compiled = compiled.result()
        if compiled.metadata.shared <= limit or meta.get("num_stages", 1) <= 1:
            return compiled, meta  # at one stage Triton's own launch raises its out-of-resources error
        meta = dict(meta, num_stages=meta["num_stages"] - 1)


def bind(kernel, grid, tensors, rest, meta):
    """(launch, head, tail): launch(*head, *tensors, *tail) runs kernel on tensors like these with rest (its integer
    arguments) and meta, on the current stream. Compiled now; launched later with no key to build, through the
    compiled kernel's launcher itself where Triton has no launch hook set now (Proton's; what `kernel[grid]` adds to
    a launch is that hook's check), else through its runner."""
    device = machine.driver().get_current_device()
    compiled, constexprs = _compiled_for(kernel, grid, (*tensors, *rest), meta, device)
    grid, tail = grid + (1,) * (3 - len(grid)), (*rest, *constexprs)
    stream = machine.driver().get_current_stream(device)
    runner = compiled[grid]
    launcher = getattr(compiled, "run", None)
    if launch_hooked() or not all(hasattr(compiled, a) for a in ("function", "packed_metadata")) or launcher is None:
        return (lambda *args: runner(*args, stream=stream)), (), tail
    return launcher, (*grid, stream, compiled.function, compiled.packed_metadata, None, None, None), tail


def bind_tma(kernel, grid, descriptors, rest, meta):
    """launch(*tensors): kernel on the tensors the TMA descriptors (descriptors, each or None) were made of, like
    these, with their block shapes, rest and meta (see bind). A TMA launch through Triton's launcher makes each
    descriptor in Python (TensorDescriptor.from_tensor checks it) and encodes it again on the host (make_tensordesc_arg,
    cuTensorMapEncodeTiled) at every launch: with four or six of them, a few-token forward took longer to enqueue
    than eager PyTorch's (issue 57: 143.8 against 107.7 µs at 40 tokens of 2048 -> 1408 on an H100). Here each
    tensor's encoded descriptor is kept by its address (the plan fixes its shape, strides, dtype and block), so a call
    on tensors at addresses seen before builds and encodes none; where Triton's launcher is not laid out as this
    reads it (encoded_launch), descriptors are made and encoded at each call, as before."""
    launch, head, tail = bind(kernel, grid, descriptors, rest, meta)
    blocks = [None if d is None else list(d.block_shape) for d in descriptors]
    encoded = encoded_launch(launch, head, tail, descriptors, blocks)
    if encoded is not None:
        return encoded
    desc = machine.TensorDescriptor.from_tensor

    def run(*tensors):
        launch(*head, *(None if t is None else desc(t, b) for t, b in zip(tensors, blocks)), *tail)
    return run


KEPT_ENCODINGS = 64  # encoded descriptors kept per tensor slot of a plan: the addresses a model's calls come back to


def encoded_launch(launcher, head, tail, descriptors, blocks):
    """launch(*tensors) calling the compiled kernel's C launcher with descriptors encoded once per tensor address, or
    None where the launcher is not Triton 3.6's (its CudaLauncher: `launch`, the function that encodes the descriptor
    arguments, wraps the C launcher; 13 leading launch arguments; no scratch memory): other versions lay it out
    otherwise and keep encoding at each call (bind_tma)."""
    wrapper = getattr(launcher, "launch", None)
    code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is None or cells is None or len(head) != 9:  # bind's direct head: grid, stream, function, metadata, hooks
        return None
    free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    encode = getattr(wrapper, "__globals__", {}).get("make_tensordesc_arg")
    if (not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= free.keys() or encode is None
            or wrapper.__globals__.get("_BASE_ARGS_FORMAT_LEN") != 13
            or getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1)):
        return None
    slots = [i for i, d in enumerate(descriptors) if d is not None]
    raw, metas = free["launcher"], free["tensordesc_meta"]
    # Without its metadata a descriptor is passed as its tensor (and shape): nothing encoded to keep, and a kept one
    # would hold the tensor.
    if set(free["tensordesc_indices"]) != set(slots) or not metas or len(metas) != len(slots) or None in metas:
        return None
    base = (*head[:5], launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, *head[5:])
    meta_of = dict(zip(slots, metas))
    kept = [{} for _ in descriptors]
    desc = machine.TensorDescriptor.from_tensor

    def encoded(i, t):
        ptr = t.data_ptr()
        args = kept[i].get(ptr)
        if args is None:
            if len(kept[i]) >= KEPT_ENCODINGS:
                kept[i].clear()
            args = kept[i][ptr] = tuple(encode(desc(t, blocks[i]), meta_of[i]))
        return args

    def run(*tensors):
        args = list(base)
        for i, t in enumerate(tensors):
            if t is None:
                args.append(None)  # a constexpr None: the C launcher skips it
            else:
                args += encoded(i, t)
        raw(*args, *tail)
    run.encodes_once = True  # for the tests: this plan's launches keep their encoded descriptors
    return run


def launch_hooked():
    knobs = getattr(triton, "knobs", None)
    return knobs is None or _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)


def _hook_set(hook):
    """A launch hook is set: since Triton 3.5 the knob is a HookChain, never None, holding the hooks added (none by
    default); before, a function or None. A chain whose list is not found counts as set (the runner then)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None) if type(hook).__name__ == "HookChain" else None
    return not isinstance(calls, list) or bool(calls)


# ---- plans kept per shape ----

# Eager calls repeat a few shapes (a decode step's, a prefill chunk's) thousands of times, and with few tokens the
# forward waits on the host. What geglu and down_proj work out per call (the checks, the kernel and tile by M, split-K,
# the compiled kernel and its integer arguments) depends only on the key below: it is worked out once per key and kept
# as a function of the call's tensors, so that a call costs its key, a lookup, its outputs and its launches.
plans = {}


def plan_key(kind, x, weights, with_packing=False):
    """What a call's plan depends on besides the module's globals, or None where every call is planned: a CPU
    tensor, one being traced, a tensor not contiguous or not 16-byte aligned (the kernels specialise on alignment).
    kind says which plan, and holds what else it depends on: the activation of the ones with an epilogue (("geglu",
    save_gu, activation), ("mlp", activation), ("backward", activation, store_m)), so a SwiGLU call never takes a
    GeGLU plan. with_packing: the MLP's plan also depends on whether gate and up are packed (see table.packed). One
    flat tuple: it is built, hashed and compared at every call, on the host's path of each forward."""
    if type(x) is not torch.Tensor or not x.is_cuda or machine.INTERPRET:  # subclasses: traced ones, DTensor...
        return None
    ptrs, contiguous = x.data_ptr(), x.is_contiguous()
    for w in weights:
        ptrs |= w.data_ptr()
        contiguous = contiguous and w.is_contiguous()
    if ptrs & 15 or not contiguous:
        return None
    # Where launch launches, kept or not, and on which stream: the two queries Triton's CUDA driver makes, asked
    # of torch directly (through the driver's lazy proxy they cost several µs a call in a model's forward).
    device = machine.current_device()
    key = [kind, x.shape, x.dtype, x.get_device(), device, machine.current_stream(device), table.TORCH_WHERE_FASTER]
    for w in weights:
        key += (w.shape, w.dtype, w.get_device())
    if with_packing:
        key.append(table.packed(weights[0], weights[1]))
    return tuple(key)


def planned(key, make):
    """The kept plan of key, made by make() on first use; make() itself where there is no key."""
    if key is None:
        return make()
    run = plans.get(key)
    if run is None:
        run = make()
        if len(plans) > 4096:  # M is part of the key: keep it bounded
            plans.clear()
        plans[key] = run
    return run


# ---- the split-K workspace, kept per device and stream ----

_maker = None  # one thread that makes the kept tensors on a GPU


def _kept(device, make):
    """make() for a tensor kept across calls (the split-K workspace). On a GPU it runs in a thread of its own:
    while torch.compile's CUDA-graph trees warm a graph up, every allocation of the calling thread goes to the
    graph's private pool, and a tensor that stays alive there breaks their bookkeeping."""
    global _maker
    if device.type != "cuda":
        return make()
    if _maker is None:
        _maker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fused_geglu")
    current = torch.cuda.current_stream(device)

    def on_the_current_stream():  # grad mode and the stream are per thread
        with torch.no_grad(), torch.cuda.device(device), torch.cuda.stream(current):
            return make()

    return _maker.submit(on_the_current_stream).result()


workspaces = {}  # (device, stream) -> (fp32 partials, int32 arrival counters) for split-K
outgrown = []  # workspaces replaced by larger ones: a CUDA graph may have recorded their addresses
KEPT_PARTIALS = 1 << 17  # fp32 partials kept between calls: 512 KB, a decode step's (M <= 16) without allocating


def split_k_workspace(device, stream, n_partials, n_tiles):
    """fp32 room for n_partials split-K partials and n_tiles zeroed arrival counters (the kernel re-zeroes
    them). Kept per device and stream (sequential launches on one stream share them): the counters, and
    KEPT_PARTIALS partials; more partials than that are allocated for the call, so that what stays held
    is under 1 MB whatever M."""
    key = (device, stream)
    kept = workspaces.get(key)
    if kept is None or kept[1].numel() < n_tiles:
        if kept is not None:
            outgrown.append(kept)
        n_tiles = max(n_tiles, 4096)
        kept = workspaces[key] = _kept(device, lambda: (torch.empty(KEPT_PARTIALS, dtype=torch.float32, device=device),
                                                         torch.zeros(n_tiles, dtype=torch.int32, device=device)))
    partials = kept[0] if n_partials <= kept[0].numel() else torch.empty(n_partials, dtype=torch.float32,
                                                                          device=device)
    return partials, kept[1]


def _split_k(device, tiles, k_steps, ctas_per_sm):
    """Split K until the programs fill one wave of the GPU: a power of two, at most 4 (measured) and k_steps."""
    split = 1
    while split < min(4, k_steps) and tiles * split * 1.5 < machine.num_sms(device) * ctas_per_sm:
        split *= 2
    return split


# ---- each kernel's arguments ----

def fast_tanh(x2d):
    # The hardware tanh for bf16 on a GPU; fp16 and fp32 keep the exact form, as does the interpreter.
    return not machine.INTERPRET and x2d.dtype == torch.bfloat16


def cdiv(a, b):  # triton.cdiv is a constexpr function: about 2 µs a call from host code
    return -(-a // b)


def _precision(x2d):
    # fp32 inputs: full-precision dots, like PyTorch's default matmul (tf32 would cost ~1e-3).
    return "ieee" if x2d.dtype == torch.float32 else "tf32"


def _upcast_needed(x2d):
    return machine.INTERPRET and x2d.dtype == torch.bfloat16


def small_m_launch(x2d, weights, out, cfg, activation="gelu_tanh"):
    """(kernel, grid, tensors, rest, meta) of the small-M kernel over weights = (w_gate, w_up) (GeGLU or SwiGLU, by
    activation) or (w,) (down_proj): out = x2d @ w^T and epilogue. Its arguments are tensors + rest (the integers); meta
    its constexprs."""
    M, K = x2d.shape
    N = weights[0].shape[0]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    tiles_m, tiles_n = cdiv(M, BM), cdiv(N, BN)
    fill = cfg.get("FILL")  # CTAs per SM to aim for by splitting K (down_proj: few output columns)
    split_k = cfg.get("SPLIT_K", 1) if fill is None else _split_k(x2d.device, tiles_m * tiles_n, cdiv(K, BK), fill)
    part = counters = out  # unused without split-K
    if split_k > 1:  # fp32 partials [SPLIT_K, M, N] per accumulator and one arrival counter per output tile
        n_partials = split_k * M * N * len(weights)
        if machine.tracing(x2d):  # in a compiled graph: its own buffers (Inductor plans their memory)
            part = torch.empty(n_partials, dtype=torch.float32, device=x2d.device)
            counters = torch.zeros(tiles_m * tiles_n, dtype=torch.int32, device=x2d.device)
        else:
            stream = x2d.device.type == "cuda" and machine.driver().get_current_stream(x2d.device.index)
            part, counters = split_k_workspace(x2d.device, stream, n_partials, tiles_m * tiles_n)
    geglu = len(weights) == 2
    return (geglu_small_m_kernel if geglu else linear_small_m_kernel, (tiles_m, tiles_n, split_k),
            (x2d, *weights, out, part, counters),
            (M, N, K, x2d.stride(0), *(w.stride(0) for w in weights), out.stride(0)),
            dict(BM=BM, BN=BN, BK=BK, SPLIT_K=split_k, UPCAST=_upcast_needed(x2d), DOT_PRECISION=_precision(x2d),
                 **({"FAST_TANH": fast_tanh(x2d), "ACT": activation} if geglu else {}),
                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


def geglu_launch(path, cfg, save_gu, activation, x2d, w_gate, w_up, m, g, u):
    """(kernel, grid, tensors, rest, meta) of geglu's kernel on this path with this activation (see small_m_launch)."""
    if path == "small":
        return small_m_launch(x2d, (w_gate, w_up), m, cfg, activation)
    (M, K), N = x2d.shape, w_gate.shape[0]
    flags = dict(UPCAST=_upcast_needed(x2d), FAST_TANH=fast_tanh(x2d), SAVE_GU=save_gu, ACT=activation)
    if path == "tma":
        cfg = {"ONE_DOT": False, **cfg}  # every constexpr named: launch passes them in order
        num_sms = machine.num_sms(x2d.device)
        return (geglu_tma_kernel, (min(num_sms, cdiv(M, cfg["BM"]) * cdiv(N, cfg["BN"])),),
                tma_descriptors(cfg, x2d, w_gate, w_up, m, g, u), (M, N, K), dict(NUM_SMS=num_sms, **flags, **cfg))
    cfg = {k: v for k, v in cfg.items() if k not in ("FLATTEN", "ONE_DOT")}  # the TMA kernel's only
    # Without SAVE_GU, g and u are never written: x2d stands in (not m, so that torch.compile's analysis of what a
    # kernel writes never sees one output under three names)
    return (geglu_pointer_kernel, (cdiv(M, cfg["BM"]) * cdiv(N, cfg["BN"]),),
            (x2d, w_gate, w_up, m, *((g, u) if save_gu else (x2d, x2d))),
            (M, N, K, x2d.stride(0), w_gate.stride(0), w_up.stride(0), m.stride(0)),
            dict(DOT_PRECISION=_precision(x2d), **flags, **cfg))


def tma_descriptors(cfg, x2d, w_gate, w_up, m, g, u):
    """The TMA kernel's descriptors: x, the weights, m, and with SAVE_GU g and u (else None: each one is made here
    and encoded again by Triton's launcher, on the host, at every launch, an unused one too)."""
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    desc = machine.TensorDescriptor.from_tensor
    return (desc(x2d, [BM, BK]), desc(w_gate, [BN, BK]), desc(w_up, [BN, BK]), desc(m, [BM, BN]),
            *((desc(g, [BM, BN]), desc(u, [BM, BN])) if g is not None else (None, None)))


def pointwise_launch(kernel, n, like, meta, kept):
    """launch(*tensors) of a pointwise kernel over n contiguous elements (its tensor arguments, then n): bound once
    where kept, from tensors `like` them (a dtype and an alignment are all a launch specialises on), else through
    launch at each call."""
    block = kernels.POINTWISE_BLOCK
    grid, meta = (cdiv(n, block),), {**meta, "BLOCK": block, "num_warps": 4, "num_stages": 1}
    if not kept:
        return lambda *tensors: launch(kernel, grid, (*tensors, n), **meta)
    bound, head, tail = bind(kernel, grid, like, (n,), meta)
    return lambda *tensors: bound(*head, *tensors, *tail)
