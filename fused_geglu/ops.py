"""geglu, down_proj and mlp: the eager launchers, each call's plan kept per shape, and their torch.library ops.

`geglu` runs gate, up and GeGLU (or SwiGLU: `activation="silu"`, the same kernels) as one fused kernel (or, where the tuned table found them faster, cuBLAS's two GEMMs and
one pointwise GeGLU kernel), `down_proj` the small-M kernel or cuBLAS, and `mlp` both, planned as one: the module's
eager forward. What a call works out (the checks, the kernel and tile, the bound launch) is kept as a function of its
tensors (`make_*_plan`, kept by launcher.planned). Under torch.compile the ops are `torch.library.triton_op`s: their
bodies are traced, and the kernels enter Inductor's graph through `wrap_triton`, so a compiled model launches them from
generated code.
"""

import functools

import torch
import torch.nn.functional as F

from . import kernels, launcher, machine, table
from .launcher import geglu_launch, small_m_launch  # by name: see launcher's import of the kernels


def check_activation(activation):
    if activation not in kernels.ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: the fused kernels' epilogue is one of "
                         f"{', '.join(kernels.ACTIVATIONS)}")


def torch_activation(g, activation):
    """act(g) by PyTorch's own op: the same math as the kernels' epilogue, where they do not run."""
    return F.silu(g) if activation == "silu" else F.gelu(g, approximate="tanh")


def _check_geglu_args(x2d, w_gate, w_up):
    if w_gate.shape != w_up.shape:
        raise ValueError(f"gate and up weights differ in shape: {tuple(w_gate.shape)} vs {tuple(w_up.shape)}")
    if x2d.dim() != 2 or w_gate.dim() != 2 or x2d.shape[1] != w_gate.shape[1]:
        raise ValueError(f"geglu expects x2d [M, K] and weights [N, K], got {tuple(x2d.shape)}, {tuple(w_gate.shape)}")
    if not x2d.dtype == w_gate.dtype == w_up.dtype or x2d.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"geglu expects one dtype among bf16/fp16/fp32, got {x2d.dtype}, {w_gate.dtype}, "
                         f"{w_up.dtype}")


def geglu(x2d, w_gate, w_up, *, use_tma=None, kernel=None, config=None, activation="gelu_tanh"):
    """m = act(x2d @ w_gate^T) * (x2d @ w_up^T), act = gelu_tanh (GeGLU) or silu (SwiGLU); [M, K] with [N, K] weights
    -> [M, N]. The kernels read both weights where they are: nothing is kept between calls but the small split-K
    workspace. kernel ('small', 'tma', 'pointer', 'torch') and config override the choice by M (tune_fused.py's sweep);
    use_tma picks a tiled one."""
    return _geglu(x2d, w_gate, w_up, use_tma, kernel, config, False, None, activation)[0]


def geglu_saving_gu(x2d, w_gate, w_up, *, use_tma=None, kernel=None, config=None, activation="gelu_tanh"):
    """(m, g, u) for training: geglu's m, and g = x2d @ w_gate^T and u = x2d @ w_up^T in x2d's dtype for the backward,
    stored by the tiled kernels' epilogue (SAVE_GU) from the accumulators that made m: no GEMM run twice."""
    return _geglu(x2d, w_gate, w_up, use_tma, kernel, config, True, None, activation)


def _torch_plan(save_gu, activation):
    """run(x2d, w_gate, w_up) -> (m, g, u) in PyTorch ops (g and u None unless save_gu)."""
    if save_gu:
        def run(x2d, w_gate, w_up):
            g, u = F.linear(x2d, w_gate), F.linear(x2d, w_up)
            return torch_activation(g, activation) * u, g, u
    else:
        def run(x2d, w_gate, w_up):  # g freed before u is made
            return torch_activation(F.linear(x2d, w_gate), activation) * F.linear(x2d, w_up), None, None
    return run


def _cublas_geglu_plan(x2d, w_gate, save_gu, kept, activation):
    """run(x2d, w_gate, w_up) -> (m, g, u): cuBLAS's two GEMMs, then m = act(g) * u in _geglu_pointwise_kernel
    (g and u returned with save_gu, else None); where kept, its launch bound once for this shape. Without save_gu, m
    is written over g (each element is read before it is written, and g is not kept): no third [tokens, hidden]
    tensor, and one allocation less on the host."""
    like = tuple(torch.empty(1, device=x2d.device, dtype=x2d.dtype) for _ in "gum") if kept else ()
    pointwise = launcher.pointwise_launch(kernels.geglu_pointwise_kernel, x2d.shape[0] * w_gate.shape[0], like,
                                          {"FAST_TANH": launcher.fast_tanh(x2d), "ACT": activation}, kept)

    if save_gu:
        def run(x2d, w_gate, w_up):
            g, u = F.linear(x2d, w_gate), F.linear(x2d, w_up)
            m = torch.empty_like(g)
            pointwise(g, u, m)
            return m, g, u
    else:
        def run(x2d, w_gate, w_up):
            g = F.linear(x2d, w_gate)
            pointwise(g, F.linear(x2d, w_up), g)
            return g, None, None
    run.any_leading_shape = True  # x [..., K] with as many elements as x2d: F.linear keeps its shape
    return run


def _geglu(x2d, w_gate, w_up, use_tma, kernel, config, save_gu, where_faster, activation):
    """(m, g, u), g and u None unless save_gu. where_faster: see plan (given, it is the plan's: no kept plan)."""
    chosen = use_tma is not None or kernel is not None or config is not None or where_faster is not None
    key = None if chosen else launcher.plan_key(("geglu", save_gu, activation), x2d, (w_gate, w_up))
    run = launcher.planned(key, lambda: make_geglu_plan(x2d, w_gate, w_up, use_tma, kernel, config, save_gu,
                                                        key is not None, where_faster, activation))
    return run(x2d, w_gate, w_up)


def make_geglu_plan(x2d, w_gate, w_up, use_tma, kernel, config, save_gu, kept, where_faster=None,
                    activation="gelu_tanh"):
    """The function (x2d, w_gate, w_up) -> (m, g, u) that runs geglu for tensors like these; kept: it serves later
    calls of the same plan key (see launcher.plan_key), so the launch is bound in full."""
    check_activation(activation)
    _check_geglu_args(x2d, w_gate, w_up)
    path, cfg = table.plan(x2d, w_gate, w_up, use_tma, where_faster) if kernel is None else (kernel, None)
    # No GPU and no interpreter (or nothing faster at this M): the same math through cuBLAS and PyTorch. So too in
    # training at small M: the small-M kernel has no epilogue that stores g and u (and a few tokens' GEMMs are cheap).
    # On a GPU, eagerly, the GeGLU of the two GEMMs' outputs is one kernel of ours (traced, Inductor fuses it itself).
    if path == "torch" or (save_gu and path == "small"):
        if type(x2d) is torch.Tensor and x2d.is_cuda and not machine.INTERPRET and x2d.shape[0] and w_gate.shape[0]:
            return _cublas_geglu_plan(x2d, w_gate, save_gu, kept, activation)
        return _torch_plan(save_gu, activation)
    cfg = config or cfg or table.default_config(path, x2d.shape[0])
    run = functools.partial(_run_geglu, path, cfg, save_gu, activation)
    if not kept or not x2d.shape[0]:
        return run
    if path == "small":  # (save_gu went to PyTorch above)
        small = _kept_small_m(x2d, (w_gate, w_up), cfg, activation)
        return run if small is None else (lambda x2d, w_gate, w_up: (small(x2d, w_gate, w_up), None, None))
    # The tiled kernels, bound from the first call's launch: later calls only make their outputs and descriptors.
    new = functools.partial(torch.empty, (x2d.shape[0], w_gate.shape[0]), device=x2d.device, dtype=x2d.dtype)
    kernel, grid, tensors, rest, meta = geglu_launch(path, cfg, save_gu, activation, x2d, w_gate, w_up, new(),
                                                     *_gu(new, save_gu))
    if path == "tma":  # its descriptors encoded once per tensor address (bind_tma)
        launch_tma = launcher.bind_tma(kernel, grid, tensors, rest, meta)

        def run(x2d, w_gate, w_up):
            m, g, u = new(), *_gu(new, save_gu)
            launch_tma(x2d, w_gate, w_up, m, g, u)
            return m, g, u
        run.encodes_once = getattr(launch_tma, "encodes_once", False)
        return run
    launch, head, tail = launcher.bind(kernel, grid, tensors, rest, meta)

    def run(x2d, w_gate, w_up):
        m, g, u = new(), *_gu(new, save_gu)
        launch(*head, x2d, w_gate, w_up, m, *((g, u) if save_gu else (x2d, x2d)), *tail)
        return m, g, u
    return run


def _kept_small_m(x2d, weights, cfg, activation="gelu_tanh"):
    """run(x2d, *weights) -> out: the small-M kernel (small_m_launch) bound from this call's launch, for later calls
    of its plan key: each makes its out; the split-K workspace is bound, or without split-K out stands in for it.
    None where each call allocates split-K partials of its own (more than KEPT_PARTIALS)."""
    new = functools.partial(torch.empty, (x2d.shape[0], weights[0].shape[0]), device=x2d.device, dtype=x2d.dtype)
    kernel, grid, tensors, rest, meta = small_m_launch(x2d, weights, new(), cfg, activation)
    out, part, counters = tensors[-3:]
    if part is not out and part.numel() > launcher.KEPT_PARTIALS:
        return None
    launch, head, tail = launcher.bind(kernel, grid, tensors, rest, meta)
    if part is out:
        def run(x2d, *weights):
            out = new()
            launch(*head, x2d, *weights, out, out, out, *tail)
            return out
    else:
        def run(x2d, *weights):
            out = new()
            launch(*head, x2d, *weights, out, part, counters, *tail)
            return out
    return run


def _gu(new, save_gu):
    return (new(), new()) if save_gu else (None, None)


def _run_geglu(path, cfg, save_gu, activation, x2d, w_gate, w_up):
    """geglu's (m, g, u) by the kernel path and its config, every choice made again."""
    x2d, w_gate, w_up = x2d.contiguous(), w_gate.contiguous(), w_up.contiguous()
    new = functools.partial(torch.empty, (x2d.shape[0], w_gate.shape[0]), device=x2d.device, dtype=x2d.dtype)
    m, g, u = new(), *_gu(new, save_gu)
    if x2d.shape[0]:
        kernel, grid, tensors, rest, meta = geglu_launch(path, cfg, save_gu, activation, x2d, w_gate, w_up, m, g, u)
        launcher.launch(kernel, grid, (*tensors, *rest), **meta)
    return m, g, u


def down_proj(m, w_down, *, config=None):
    """y = m @ w_down^T. For few tokens the small-M kernel (split-K: the weight has only dim rows to spread
    over the GPU; cuBLAS leaves bandwidth unused there); otherwise, and on a CPU, F.linear (cuBLAS)."""
    key = None if config is not None else launcher.plan_key("down", m, (w_down,))
    return launcher.planned(key, lambda: make_down_plan(m, w_down, config, key is not None))(m, w_down)


def make_down_plan(m, w_down, config, kept):
    """The function (m, w_down) -> y for tensors like these (see make_geglu_plan)."""
    if (m.dim() != 2 or w_down.dim() != 2 or m.shape[1] != w_down.shape[1] or m.dtype != w_down.dtype
            or (m.device.type != "cuda" and (not machine.INTERPRET or machine.tracing(m)))):
        return F.linear  # which raises on shapes that do not fit
    kernel, cfg = ("small", config) if config is not None else table.by_m(m.device, m.shape[0], "down", m.shape[1])
    if kernel != "small":
        return F.linear
    run = functools.partial(run_down, cfg)
    small = _kept_small_m(m, (w_down,), cfg) if kept and m.shape[0] else None
    return run if small is None else small


def mlp(x, w_gate, w_up, w_down, activation="gelu_tanh"):
    """down_proj(geglu(x, w_gate, w_up), w_down) over x of any leading shape, planned as one: one key a call, and few
    Python calls (in a model's forward each one costs several times what it does in a loop of its own). The eager
    module's forward, less its memo of the last call."""
    run = mlp_plan(x, w_gate, w_up, w_down, activation)
    return unplanned_mlp(x, w_gate, w_up, w_down, activation) if run is None else run(x, w_gate, w_up, w_down)


def mlp_plan(x, w_gate, w_up, w_down, activation="gelu_tanh"):
    """mlp's kept plan for a call like this one (run(x, w_gate, w_up, w_down)), or None where calls are not planned."""
    key = launcher.plan_key(("mlp", activation), x, (w_gate, w_up, w_down), True)
    return None if key is None else launcher.planned(
        key, lambda: make_mlp_plan(x, w_gate, w_up, w_down, table.packed(w_gate, w_up), activation))


def unplanned_mlp(x, w_gate, w_up, w_down, activation="gelu_tanh"):  # no plan key: geglu and down_proj work it out now
    out_shape = (*x.shape[:-1], w_down.shape[0])  # named, not -1: no tokens give an empty output
    return down_proj(geglu(x.reshape(-1, x.shape[-1]), w_gate, w_up, activation=activation),
                     w_down).reshape(out_shape)


def make_mlp_plan(x, w_gate, w_up, w_down, both_packed=False, activation="gelu_tanh"):
    x2d = x.view(-1, x.shape[-1])  # contiguous: it has a plan key
    gate_up = make_geglu_plan(x2d, w_gate, w_up, None, None, None, False, True, None, activation)
    m = torch.empty((x2d.shape[0], w_gate.shape[0]), device=x.device, dtype=x.dtype)  # what down_proj will get
    down = make_down_plan(m, w_down, None, True)
    if x.dim() == 2 or (getattr(gate_up, "any_leading_shape", False) and down is F.linear):
        # cuBLAS's GEMMs take [..., K] as it is, and the GeGLU kernel runs over the elements: no views to make
        run = lambda x, w_gate, w_up, w_down: down(gate_up(x, w_gate, w_up)[0], w_down)  # noqa: E731
    else:
        shape_2d, out_shape = x2d.shape, (*x.shape[:-1], w_down.shape[0])
        run = lambda x, w_gate, w_up, w_down: down(  # noqa: E731
            gate_up(x.view(shape_2d), w_gate, w_up)[0], w_down).view(out_shape)
    if (both_packed and getattr(gate_up, "any_leading_shape", False) and down is F.linear
            and table.packs_gate_up(x.device, *x2d.shape)):
        return make_packed_mlp_plan(x2d, w_gate, run, activation)
    return run


def make_packed_mlp_plan(x2d, w_gate, unpacked, activation="gelu_tanh"):
    """Where cuBLAS runs gate and up, the two weights are packed and packs_gate_up says so: one
    [tokens, 2 * hidden] GEMM over both, _geglu_packed_kernel writing m over its g half, and down_proj's GEMM reading
    that half where it is (row stride 2 * hidden). Three launches, against the unpacked plan's four and
    transformers' MLP's five: in an eager model's forward, each is host time. unpacked: the plan for two weights
    adjacent by chance in two allocations, which no one view can span."""
    (M, K), N = x2d.shape, w_gate.shape[0]
    like = (torch.empty(1, device=x2d.device, dtype=x2d.dtype),)  # a fresh allocation's alignment, as gu's
    block = kernels.POINTWISE_BLOCK
    launch, head, tail = launcher.bind(kernels.geglu_packed_kernel, (M, launcher.cdiv(N, block)), like, (N, 2 * N),
                                       {"FAST_TANH": launcher.fast_tanh(x2d), "ACT": activation, "BLOCK": block,
                                        "num_warps": 4,
                                        "num_stages": 1})

    def kept(w_gate):
        """run for calls on weights at these addresses, over the [2 * hidden, dim] view of both made now (a view of
        their own storage: no memory), or None where w_gate's storage ends where w_gate does."""
        try:
            both = w_gate.as_strided((2 * N, K), (K, 1))
        except RuntimeError:
            return None

        def run_on_both(x, w_gate, w_up, w_down):
            gu = F.linear(x, both)
            launch(*head, gu, *tail)
            return F.linear(gu.narrow(-1, 0, N), w_down)
        return run_on_both

    def run(x, w_gate, w_up, w_down):
        return (kept(w_gate) or unpacked)(x, w_gate, w_up, w_down)
    run.kept = kept
    return run


def run_down(cfg, m, w_down):
    m, w_down = m.contiguous(), w_down.contiguous()
    y = torch.empty((m.shape[0], w_down.shape[0]), device=m.device, dtype=m.dtype)
    if m.shape[0]:
        kernel, grid, tensors, rest, meta = small_m_launch(m, (w_down,), y, cfg)
        launcher.launch(kernel, grid, (*tensors, *rest), **meta)
    return y


# torch.compile sees the fused MLP as two triton_ops: Dynamo puts each in its graph as one op (it cannot trace the
# launchers' host-side choices), then AOTAutograd traces their bodies with fake tensors, so the kernels enter the
# graph through wrap_triton and Inductor launches them from its generated code, with no Python of this package per
# call. Called outside a compiled graph, a triton_op runs its body with plain tensors (launcher.launch's fast path).
# where_faster is TORCH_WHERE_FASTER, passed in by the module's forward, which Dynamo traces: the graph then holds
# the value the body's choice of kernel depends on, so a graph compiled with one value is never taken from the
# compile caches for the other (the caches key on that graph, not on this module's globals). The tuned table is not
# in it: after re-tuning, clear the caches (TORCHINDUCTOR_CACHE_DIR) for compiled graphs to pick the new kernels.
# activation: "gelu_tanh" (GeGLU, the default: the calls and traces made before SwiGLU) or "silu"; a compiled graph holds
# it as it holds where_faster.
@torch.library.triton_op("fused_geglu::geglu", mutates_args=())
def geglu_op(x2d: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, where_faster: bool = True,
             activation: str = "gelu_tanh") -> torch.Tensor:
    return _geglu(x2d, w_gate, w_up, None, None, None, False, where_faster, activation)[0]


@torch.library.triton_op("fused_geglu::geglu_saving_gu", mutates_args=())
def geglu_saving_gu_op(x2d: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, where_faster: bool = True,
                       activation: str = "gelu_tanh") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _geglu(x2d, w_gate, w_up, None, None, None, True, where_faster, activation)


@torch.library.triton_op("fused_geglu::down_proj", mutates_args=())
def down_proj_op(m: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    return down_proj(m, w_down)
