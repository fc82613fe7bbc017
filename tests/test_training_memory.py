"""Eager training of the fused MLP as one autograd node (training.py's _TrainingMLP: gate, up, the activation and
down_proj): its gradients of x and of the three weights against fp32 autograd of the plain formula (F.linear and
PyTorch's activation), in both modes, GeGLU and SwiGLU, at odd shapes, x with a leading batch shape, some inputs
without grad; what it saves between forward and backward, counted by autograd's saved-tensor hooks (beyond the
parameters, x, g and u, or x alone: never m); the backward kernel's STORE_M (m = act(g) * u over grad_m's buffer); and
what torch.compile's analysis reads the backward kernel as writing, for the launches the compiled graph makes.

CPU: the Triton kernels under Triton's interpreter in a child process (interpreted_cases), the CPU fallback (no
interpreter) in this process. GPU (skipped without CUDA): what stays allocated between forward and backward.
"""

import json

import pytest
from conftest import interpreted_cases, interpreter_cannot_loop
import torch

pytest.importorskip("triton", reason="needs Triton (Linux wheels only; tests/test_platforms.py runs without it)")
import fused_geglu  # noqa: E402 - after the skip: it imports Triton

# Shared by this process and the interpreter's child: the references, by PyTorch's own ops (not the kernels' formula).
HELPERS = r"""
import json, sys
import torch, torch.nn.functional as F
import fused_geglu as fg

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
INPUTS = ("x", "gate", "up", "down")

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

def act(g, activation):
    return F.silu(g) if activation == "silu" else F.gelu(g, approximate="tanh")

def gradient_case(shape, dim, hidden, dt, activation, recompute, needs=INPUTS):
    # FusedGatedMLP's gradients of the inputs in `needs` against fp32 autograd of the plain formula, from the same
    # rounded inputs and the same output gradient; the other inputs must get none
    torch.manual_seed(0)
    fused = fg.FusedGatedMLP(dim, hidden, activation, recompute).to(DTYPES[dt])
    ws = (fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight)
    for name, w in zip(INPUTS[1:], ws):
        w.requires_grad_(name in needs)
    x = torch.randn(*shape, dim).to(DTYPES[dt]).requires_grad_("x" in needs)
    y = fused(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = [t.detach().float().requires_grad_() for t in (x, *ws)]
    out = F.linear(act(F.linear(ref[0], ref[1]), activation) * F.linear(ref[0], ref[2]), ref[3])
    out.backward(dy.float())
    got = (x.grad, *(w.grad for w in ws))
    return dict(errs={n: rel(a, b.grad) for n, a, b in zip(INPUTS, got, ref) if n in needs},
                with_grad=[n for n, a in zip(INPUTS, got) if a is not None], shape=list(y.shape),
                dtypes=sorted({str(a.dtype) for a in got if a is not None}),
                node=type(y.grad_fn.next_functions[0][0]).__name__)  # below the output's reshape

def store_m_case(M, N, dt, activation):
    # backward_in_place with store_m: grad_g over g, grad_u over u and m = act(g) * u over grad_m, in their own
    # buffers; without it grad_m is left as it was; the launch into a fourth buffer (NaN first) writes every element
    dm, g, u = (torch.randn(M, N).mul(2).to(DTYPES[dt]) for _ in range(3))
    gd, ud = g.double().requires_grad_(), u.double().requires_grad_()
    m_ref = act(gd, activation) * ud
    want_g, want_u = torch.autograd.grad(m_ref, (gd, ud), dm.double())
    bufs = dm.clone(), g.clone(), u.clone()
    where = [t.data_ptr() for t in bufs]
    fg.backward_in_place(*bufs, activation, store_m=True)
    kept = dm.clone(), g.clone(), u.clone()
    fg.backward_in_place(kept[0], kept[1], kept[2], activation)
    apart = torch.full_like(dm, float("nan"))
    if fg.INTERPRET:  # the kernel itself (a CPU without the interpreter has none to launch)
        fg.training._launch_backward(dm, g, u, torch.empty_like(g), torch.empty_like(u), activation, apart)
    return dict(errs=[rel(bufs[0], m_ref), rel(bufs[1], want_g), rel(bufs[2], want_u), rel(kept[1], want_g),
                      rel(kept[2], want_u)],
                in_place=[t.data_ptr() for t in bufs] == where, grad_m_kept=bool(torch.equal(kept[0], dm)),
                apart_err=rel(apart, m_ref) if bool(torch.isfinite(apart).all()) else None,
                dtypes=sorted({str(t.dtype) for t in bufs}))

def saved_beyond_parameters(module, x):
    # (shapes, bytes) of what autograd saves during module(x), the parameters left out (by storage: gate's and up's
    # share one, and a saved weight may be a view of its parameter)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved.append((list(t.shape), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sorted(s for s, _ in saved), sum(b for _, b in saved)
"""

CHILD = HELPERS + r"""
def emit(case, **fields):
    print(json.dumps(dict(case=case, **fields)), flush=True)

for dt, activation in (("fp32", "gelu_tanh"), ("bf16", "silu")):
    for M, N in ((37, 57), (3, 5)):  # sizes no block divides, one smaller than a block
        emit(f"store-m-{dt}-{activation}-{M}x{N}", **store_m_case(M, N, dt, activation))
if sys.argv[1] == "modules":  # the forward kernels loop over K: not where the interpreter cannot loop
    for case, args in json.loads(sys.argv[2]).items():
        emit(case, **gradient_case(*args))
    fused = fg.FusedGeGLUMLP(24, 40)  # 105 tokens: the tiled kernel, storing g and u
    shapes, nbytes = saved_beyond_parameters(fused, torch.randn(3, 5, 7, 24, requires_grad=True))
    emit("saved", shapes=shapes, nbytes=nbytes)
"""
namespace = {}
exec(HELPERS, namespace)  # the same references in this process, for the CPU fallback

TOL = {"bf16": 2e-2, "fp32": 1e-5}  # ||out - ref|| / ||ref||: bf16 rounds the inputs, the gradients and m
ALL = ["x", "gate", "up", "down"]
# gradient_case's arguments: x's leading shape, dim, hidden, dtype, activation, recompute, the inputs that need a
# gradient. 105 tokens and 35: the tiled kernel in the interpreter (storing g and u, or not); 6: the small-M kernel.
GRADIENTS = {f"{activation}-{'recompute' if recompute else 'saved'}": [[3, 5, 7], 24, 40, "fp32", activation,
                                                                      recompute, ALL]
             for activation in ("gelu_tanh", "silu") for recompute in (False, True)}
GRADIENTS.update({"bf16": [[3, 5, 7], 24, 40, "bf16", "gelu_tanh", False, ALL],
                  "small-m": [[2, 3], 24, 40, "fp32", "silu", True, ALL],
                  "no-down": [[35], 24, 40, "fp32", "gelu_tanh", False, ["x", "gate", "up"]],
                  "down-only": [[35], 24, 40, "fp32", "silu", True, ["down"]],
                  "weights-only": [[5, 7], 24, 40, "fp32", "gelu_tanh", True, ["gate", "up", "down"]]})
STORE_M = [f"store-m-{c}-{s}" for c in ("fp32-gelu_tanh", "bf16-silu") for s in ("37x57", "3x5")]
cpu_only = pytest.mark.skipif(fused_geglu.INTERPRET or torch.cuda.is_available(),
                              reason="CPU without the interpreter only")


@pytest.fixture(scope="module")
def interpreted():
    mode = "pointwise" if interpreter_cannot_loop() else "modules"
    return interpreted_cases(CHILD, mode, json.dumps(GRADIENTS)), mode


def _needs_loops(mode):
    if mode != "modules":
        pytest.skip("Triton < 3.7's interpreter cannot run the forward's loops under NumPy >= 2.5")


def _check_gradients(r, case):
    shape, dim, _, dt, _, _, needs = GRADIENTS[case]
    assert r["with_grad"] == needs and sorted(r["errs"]) == sorted(needs), r  # every gradient asked for, no other
    assert max(r["errs"].values()) < TOL[dt], r
    assert r["dtypes"] == [str(namespace["DTYPES"][dt])] and r["shape"] == [*shape, dim], r
    assert r["node"] == "_TrainingMLPBackward", r  # one node for the whole MLP: no autograd linear of down_proj


@pytest.mark.parametrize("case", GRADIENTS)
def test_gradients_interpreted(interpreted, case):
    """The forward kernels and the backward kernel (with STORE_M where down_proj's weight needs its gradient)."""
    cases, mode = interpreted
    _needs_loops(mode)
    _check_gradients(cases[case], case)


@cpu_only
@pytest.mark.parametrize("case", GRADIENTS)
def test_gradients_cpu_fallback(case):
    """The same cases on a CPU without the interpreter: the forward in PyTorch ops, the backward in fp32 ones."""
    _check_gradients(namespace["gradient_case"](*GRADIENTS[case]), case)


def _expected_saved(tokens, dim, hidden, recompute, itemsize):
    """Beyond the parameters: x ([tokens, dim]), and without recompute g and u ([tokens, hidden] each); no m."""
    shapes = [[tokens, dim]] + ([] if recompute else [[tokens, hidden]] * 2)
    return sorted(shapes), itemsize * (tokens * dim + (0 if recompute else 2 * tokens * hidden))


@pytest.mark.parametrize("recompute", [False, True])
def test_what_training_saves_beyond_the_parameters(recompute):
    """Between forward and backward the graph holds x, g and u (recompute=False) or x alone (recompute=True) beyond
    the parameters: not m, which down_proj's autograd would save for its weight gradient. Counted by autograd's
    pack hook over one call, x with a batch shape; fp32 here (CPU fallback), 4 bytes an element."""
    fused = fused_geglu.FusedGeGLUMLP(24, 40, recompute=recompute)
    got = namespace["saved_beyond_parameters"](fused, torch.randn(3, 5, 7, 24, requires_grad=True))
    assert got == _expected_saved(105, 24, 40, recompute, 4)  # 105 x (24 + 2 x 40) x 4 = 43,680 bytes, or 10,080


def test_what_training_saves_interpreted(interpreted):
    """The same with the forward kernel storing g and u (SAVE_GU)."""
    cases, mode = interpreted
    _needs_loops(mode)
    r = cases["saved"]
    assert (r["shapes"], r["nbytes"]) == _expected_saved(105, 24, 40, False, 4)


@pytest.mark.parametrize("case", STORE_M)
def test_backward_kernel_stores_m_over_grad_m_interpreted(interpreted, case):
    """STORE_M: m = act(g) * u written over grad_m (each element read first), grad_g over g and grad_u over u, in
    the buffers they had; without it grad_m left as it was; into a NaN-filled buffer of its own, every element."""
    r = interpreted[0][case]
    tol = 1e-2 if "bf16" in case else 1e-5
    assert r["in_place"] and r["grad_m_kept"] and max(r["errs"]) < tol and r["apart_err"] < tol, r
    assert r["dtypes"] == [str(namespace["DTYPES"][case.split("-")[2]])], r


@cpu_only
def test_store_m_cpu_fallback():
    r = namespace["store_m_case"](37, 57, "bf16", "silu")
    assert r["in_place"] and r["grad_m_kept"] and max(r["errs"]) < 1e-2 and r["dtypes"] == ["torch.bfloat16"], r


@pytest.mark.skipif(fused_geglu.INTERPRET or fused_geglu.TensorDescriptor is None, reason="needs Triton's compiler")
@pytest.mark.parametrize("store_m", [False, True])
def test_compiles_analysis_of_what_the_backward_kernel_writes(store_m, monkeypatch):
    """torch.compile functionalizes a traced kernel by what its TTIR stores to: the out-of-place op's launch
    (geglu_backward_op's, no m) writes grad_g and grad_u only, grad_m standing in for the unused m_ptr; with m, m_ptr
    too. The launch's own arguments, recorded; the TTIR for an H100 (sm_90), made here without a GPU."""
    import triton
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors
    from triton.backends.compiler import GPUTarget

    launched = []
    monkeypatch.setattr(fused_geglu.launcher, "launch", lambda kernel, grid, args, **meta: launched.append(
        (kernel, args, meta)))
    grad_m, g, u, grad_g, grad_u = (torch.empty(100, dtype=torch.bfloat16) for _ in range(5))
    fused_geglu.training._launch_backward(grad_m, g, u, grad_g, grad_u, "silu", grad_m if store_m else None)
    (kernel, args, meta), = launched
    kwargs = {**dict(zip(kernel.arg_names, args)), **meta}
    assert kwargs["m_ptr"] is grad_m and kwargs["STORE_M"] is store_m
    monkeypatch.setattr(triton.runtime.driver, "_active", type("Hopper", (), {
        "get_current_target": staticmethod(lambda: GPUTarget("cuda", 90, 32))})())
    accessed = identify_accessed_tensors(kernel, kwargs, {}).read_writes
    assert {d.name for d in accessed.writes} == {"grad_g_ptr", "grad_u_ptr"} | ({"m_ptr"} if store_m else set())
    assert {d.name for d in accessed.reads} == {"grad_m_ptr", "g_ptr", "u_ptr"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recompute", [False, True])
def test_gpu_held_between_forward_and_backward(recompute):
    """What stays allocated from forward to backward beyond x and the parameters: the output, and g and u unless
    recompute (1024 x 512 bf16, 1 MiB each here); no m. Each mode runs once first, so that anything kept between
    calls is already made."""
    M, d, h = 1024, 256, 512
    fused = fused_geglu.FusedGeGLUMLP(d, h, recompute=recompute).cuda().bfloat16()
    x = torch.randn(M, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fused(x).sum().backward()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = fused(x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before == 2 * (M * d + (0 if recompute else 2 * M * h))
    y.sum().backward()
