"""The fused MLP with SiLU (SwiGLU: Llama, Qwen, Mistral): the same kernels as GeGLU with the constexpr ACT="silu",
against PyTorch (F.silu(g) * u and autograd, in fp64 from the same rounded inputs; transformers' LlamaMLP for the
module), and what must keep the two activations apart: the plans kept per call, the compiled graph's op arguments, a
bad activation refused in one line.

CPU: every kernel under Triton's interpreter in a child process (TRITON_INTERPRET must be set before Triton decorates
a kernel, and must not leak into this process), at odd shapes (dims not multiples of 8 where the pointer kernel takes
them; M = 1, 3, 17 and a tile's worth); each kernel compiled for an H100 (sm_90a) here, without a GPU, by Triton's own
compiler. GPU (skipped without CUDA): the module against LlamaMLP at model widths, in bf16, decode and prefill,
eager, compiled and training, and the kept plans of two modules that differ only in their activation.
"""

import copy
from pathlib import Path

import pytest
from conftest import interpreted_cases, interpreter_cannot_loop
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="needs Triton (Linux wheels only; tests/test_platforms.py runs without it)")
import fused_geglu  # noqa: E402 - after the skip: it imports Triton

ROOT = Path(__file__).resolve().parent.parent
TOL = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}  # ||out - ref|| / ||ref||: the output's rounding dominates
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Shared by this process and the interpreter's child: the references, by PyTorch's own ops (not the kernels' formula).
HELPERS = r"""
import json, sys
import torch, torch.nn.functional as F
import fused_geglu as fg

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

def ref_swiglu(x, wg, wu):
    x, wg, wu = x.double(), wg.double(), wu.double()
    return F.silu(x @ wg.T) * (x @ wu.T)

def ref_grads(dm, g, u):
    # (grad_g, grad_u) of m = silu(g) * u by fp64 autograd, from the same rounded inputs
    g, u = g.double().requires_grad_(), u.double().requires_grad_()
    return torch.autograd.grad(F.silu(g) * u, (g, u), dm.double())

def module_grads(tokens, dim, hidden, dt, recompute):
    # FusedSwiGLUMLP's gradients (x and the three weights) against fp64 autograd of the same MLP, same weights and loss
    fused = fg.FusedSwiGLUMLP(dim, hidden, recompute=recompute).to(DTYPES[dt])
    x, target = torch.randn(tokens, dim).to(DTYPES[dt]), torch.randn(tokens, dim)
    xf = x.clone().requires_grad_()
    F.mse_loss(fused(xf).float(), target).backward()
    ws = [w.detach().double().requires_grad_() for w in (fused.gate_proj.weight, fused.up_proj.weight,
                                                        fused.down_proj.weight)]
    xd = x.double().requires_grad_()
    F.mse_loss((F.silu(xd @ ws[0].T) * (xd @ ws[1].T)) @ ws[2].T, target.double()).backward()
    got = [xf.grad] + [w.grad for w in (fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight)]
    return [rel(a, b.grad) for a, b in zip(got, [xd, *ws])]
"""

CHILD = HELPERS + r"""
def emit(case, **fields):
    print(json.dumps(dict(case=case, **fields)), flush=True)

def launch_pointwise(kernel, tensors, n, grid):
    fg.launcher.launch(kernel, grid, (*tensors, n), FAST_TANH=False, ACT="silu", BLOCK=fg.POINTWISE_BLOCK,
                       num_warps=4, num_stages=1)

torch.manual_seed(0)
# The pointwise kernels (no loop): the "torch" path's SwiGLU over two GEMMs' outputs, the packed one over [g | u] rows
# (m written over g), the backward; sizes no block divides, one of them smaller than a block.
for dt, (M, N) in [("fp32", (37, 57)), ("bf16", (3, 5)), ("fp32", (1, 2500))]:
    g, u, dm = (torch.randn(M, N).mul(3).to(DTYPES[dt]) for _ in range(3))
    m = torch.full_like(g, float("nan"))
    launch_pointwise(fg.kernels.geglu_pointwise_kernel, (g, u, m), g.numel(), (-(-g.numel() // fg.POINTWISE_BLOCK),))
    gu = torch.cat([g, u], dim=1).contiguous()
    fg.launcher.launch(fg.kernels.geglu_packed_kernel, (M, -(-N // fg.POINTWISE_BLOCK)), (gu, N, 2 * N),
                       FAST_TANH=False, ACT="silu", BLOCK=fg.POINTWISE_BLOCK, num_warps=4, num_stages=1)
    ref = F.silu(g.double()) * u.double()
    grad_g, grad_u = g.clone(), u.clone()
    fg.backward_in_place(dm, grad_g, grad_u, "silu")
    op_g, op_u = fg.geglu_backward_op(dm, g, u, "silu")
    inplace_g, inplace_u = g.clone(), u.clone()
    fg.geglu_backward_(dm, inplace_g, inplace_u, "silu")
    want_g, want_u = ref_grads(dm, g, u)
    emit(f"pointwise-{dt}-{M}x{N}", err=rel(m, ref), packed_err=rel(gu[:, :N], ref),
         packed_u_kept=bool(torch.equal(gu[:, N:], u)),
         grad_errs=[rel(t, w) for t, w in ((grad_g, want_g), (grad_u, want_u), (op_g, want_g), (op_u, want_u),
                                            (inplace_g, want_g), (inplace_u, want_u))],
         dtypes=sorted({str(t.dtype) for t in (m, grad_g, grad_u, op_g, op_u)}), want_dtype=str(DTYPES[dt]))
# Far out on both sides: exp(-g) overflows for very negative g; every output must stay finite
g = torch.tensor([-1e4, -100.0, -60.0, -10.0, -3.0, 0.0, 3.0, 10.0, 60.0, 100.0, 1e4])
u, dm = torch.full_like(g, 2.0), torch.ones_like(g)
m = torch.empty_like(g)
launch_pointwise(fg.kernels.geglu_pointwise_kernel, (g, u, m), g.numel(), (1,))
grad_g, grad_u = fg.geglu_backward_op(dm, g, u, "silu")
want_g, want_u = ref_grads(dm, g, u)
emit("extreme", got=m.tolist(), want=(F.silu(g.double()) * 2).tolist(), grad_g=grad_g.tolist(),
     want_g=want_g.tolist(), grad_u=grad_u.tolist(), want_u=want_u.tolist())

if sys.argv[1] == "kernels":  # the GEMM kernels loop over K: not where the interpreter cannot loop
    # geglu by each kernel: pointer at odd dims (and at dims the TMA kernel takes), TMA, and the small-M one at the
    # interpreter's buckets (M = 1: split-K over two programs; 3 and 17: one tile)
    for dt in ("bf16", "fp16", "fp32"):
        for M in (1, 3, 17, 37):
            for K, N in ((41, 57), (40, 72)):
                x = torch.randn(M, K).to(DTYPES[dt])
                wg, wu = (torch.randn(N, K).div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
                ref = ref_swiglu(x, wg, wu)
                for kernel in ("pointer", "tma", "small"):
                    use_tma = None if kernel == "small" else kernel == "tma"
                    if (kernel == "small" and M > 32) or (kernel == "tma" and (dt == "fp32" or K % 8)):
                        continue  # past the small-M buckets; TMA: 2-byte types, 16-byte row strides
                    m = fg.geglu(x, wg, wu, use_tma=use_tma, activation="silu")
                    case = dict(path=fg.kernel_path(x, wg, wu, use_tma), err=rel(m, ref), shape=list(m.shape),
                                dtype=str(m.dtype), want_dtype=str(DTYPES[dt]), finite=bool(torch.isfinite(m).all()))
                    if kernel != "small":  # training's forward: the epilogue also stores g and u (SAVE_GU)
                        saved = fg.geglu_saving_gu(x, wg, wu, use_tma=use_tma, activation="silu")
                        case["saving_errs"] = [rel(saved[0], ref), rel(saved[1], x.double() @ wg.double().T),
                                               rel(saved[2], x.double() @ wu.double().T)]
                    emit(f"kernel-{dt}-{M}x{K}x{N}-{kernel}", **case)
    x = torch.randn(37, 40).bfloat16()
    wg, wu = (torch.randn(72, 40).div(40 ** 0.5).bfloat16() for _ in range(2))
    m = fg.geglu(x, wg, wu, kernel="tma", config=dict(fg.INTERPRETER_CONFIG, ONE_DOT=True), activation="silu")
    emit("onedot-bf16", err=rel(m, ref_swiglu(x, wg, wu)))
    # down_proj has no epilogue: the same with either activation (its kernel is _linear_small_m_kernel)
    for M, K, N in ((1, 41, 57), (3, 40, 72)):
        x = torch.randn(M, K)
        wg, wu, wd = torch.randn(N, K), torch.randn(N, K), torch.randn(K, N)
        y = fg.mlp(x, wg, wu, wd, activation="silu")
        emit(f"mlp-{M}x{K}x{N}", err=rel(y, ref_swiglu(x, wg, wu) @ wd.double().T))
    # the module: inference at 2 x 5 tokens (small-M) and 2 x 20 (pointer); training in both modes at 45 tokens
    for dt in ("fp32", "bf16"):
        for seq in (5, 20):
            fused = fg.FusedSwiGLUMLP(40, 72).to(DTYPES[dt])
            x = torch.randn(2, seq, 40).to(DTYPES[dt])
            with torch.no_grad():
                y = fused(x)
            wg, wu, wd = fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight
            emit(f"module-{dt}-{seq}", err=rel(y, ref_swiglu(x, wg, wu) @ wd.double().T), shape=list(y.shape),
                 path=fg.kernel_path(x.reshape(-1, 40), wg, wu))
        for recompute in (False, True):
            emit(f"train-{dt}-{'recompute' if recompute else 'saved'}", errs=module_grads(45, 40, 72, dt, recompute))
"""
namespace = {}
exec(HELPERS, namespace)  # the same references in this process, for the CPU fallback


@pytest.fixture(scope="module")
def interpreted():
    mode = "pointwise" if interpreter_cannot_loop() else "kernels"
    return interpreted_cases(CHILD, mode), mode


def _needs_loops(mode):
    if mode != "kernels":
        pytest.skip("Triton < 3.7's interpreter cannot run kernel loops under NumPy >= 2.5")


POINTWISE = [f"pointwise-{c}" for c in ("fp32-37x57", "bf16-3x5", "fp32-1x2500")]
# every (dtype, M, K, N, kernel) the child runs: TMA only for bf16/fp16 at K, N multiples of 8, small-M up to M = 32
KERNEL_CASES = [f"kernel-{dt}-{M}x{K}x{N}-{kernel}" for dt in ("bf16", "fp16", "fp32") for M in (1, 3, 17, 37)
                for K, N in ((41, 57), (40, 72)) for kernel in ("pointer", "tma", "small")
                if not (kernel == "small" and M > 32) and not (kernel == "tma" and (dt == "fp32" or K % 8))]


def test_the_cases_are_all_there(interpreted):
    cases, mode = interpreted
    want = set(POINTWISE) | {"extreme"}
    if mode == "kernels":
        want |= set(KERNEL_CASES) | {"onedot-bf16", "mlp-1x41x57", "mlp-3x40x72"}
        want |= {f"module-{dt}-{seq}" for dt in ("fp32", "bf16") for seq in (5, 20)}
        want |= {f"train-{dt}-{m}" for dt in ("fp32", "bf16") for m in ("saved", "recompute")}
    assert set(cases) == want
    assert len(KERNEL_CASES) == 50  # pointer: 3 dtypes x 4 M x 2 widths; TMA: 2 x 4 x 1; small-M: 3 x 3 x 2


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_packed_and_backward_kernels_interpreted(interpreted, case):
    """m = silu(g) * u by the pointwise kernel and by the packed one (over [g | u], written over g, u left as it
    was); grad_g and grad_u by backward_in_place, the out-of-place op and the in-place op: all against PyTorch."""
    r = interpreted[0][case]
    tol = TOL[case.split("-")[1]]
    assert r["err"] < tol and r["packed_err"] < tol and r["packed_u_kept"], r
    assert len(r["grad_errs"]) == 6 and max(r["grad_errs"]) < tol, r
    assert r["dtypes"] == [r["want_dtype"]]


def test_far_out_inputs_stay_finite_and_right(interpreted):
    r = interpreted[0]["extreme"]
    for got, want in ((r["got"], r["want"]), (r["grad_g"], r["want_g"]), (r["grad_u"], r["want_u"])):
        assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(got, want, strict=True)), (got, want)


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_each_kernel_with_the_silu_epilogue_interpreted(interpreted, case):
    cases, mode = interpreted
    _needs_loops(mode)
    r = cases[case]
    dt, shape, kernel = case.split("-")[1:]
    M, K, N = map(int, shape.split("x"))
    assert r["path"] == kernel and r["shape"] == [M, N] and r["dtype"] == r["want_dtype"] and r["finite"], r
    assert r["err"] < TOL[dt], r
    if kernel != "small":
        assert len(r["saving_errs"]) == 3 and max(r["saving_errs"]) < TOL[dt], r


def test_one_dot_tma_variant_and_the_whole_mlp_interpreted(interpreted):
    cases, mode = interpreted
    _needs_loops(mode)
    assert cases["onedot-bf16"]["err"] < TOL["bf16"], cases["onedot-bf16"]
    assert cases["mlp-1x41x57"]["err"] < TOL["fp32"] and cases["mlp-3x40x72"]["err"] < TOL["fp32"]


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_module_inference_and_training_interpreted(interpreted, dt):
    cases, mode = interpreted
    _needs_loops(mode)
    for seq, path in ((5, "small"), (20, "pointer")):
        r = cases[f"module-{dt}-{seq}"]
        assert r["shape"] == [2, seq, 40] and r["path"] == path and r["err"] < TOL[dt], r
    for m in ("saved", "recompute"):  # x's and the three weights' gradients; bf16 rounds g, u and m on the way
        errs = cases[f"train-{dt}-{m}"]["errs"]
        assert len(errs) == 4 and max(errs) < (3e-2 if dt == "bf16" else 1e-5), (m, errs)


# ---- in this process: the CPU fallback (PyTorch's ops), the module's API, what keeps the activations apart ----

def test_the_cpu_fallback_matches_transformers_llama_mlp():
    """Without a GPU or the interpreter the module runs PyTorch's ops: the same output and gradients as transformers'
    LlamaMLP (the SwiGLU MLP Llama, Qwen and Mistral run), weights moved both ways by load_state_dict."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    llama = LlamaMLP(LlamaConfig(hidden_size=24, intermediate_size=40, hidden_act="silu", num_attention_heads=1))
    fused = fused_geglu.FusedSwiGLUMLP(24, 40)
    fused.load_state_dict(llama.state_dict())
    back = LlamaMLP(llama.config)
    back.load_state_dict(fused.state_dict())
    for recompute in (False, True):
        fused.recompute = recompute
        x = torch.randn(2, 7, 24)
        xl, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
        llama(xl).square().sum().backward()
        fused(xf).square().sum().backward()
        torch.testing.assert_close(xf.grad, xl.grad)
        for (name, p), q in zip(fused.named_parameters(), llama.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
            p.grad = q.grad = None
    with torch.no_grad():
        torch.testing.assert_close(back(x), llama(x))


def test_the_backward_op_on_the_cpu_matches_autograd():
    torch.manual_seed(0)
    dm, g, u = (torch.randn(5, 9) * 4 for _ in range(3))
    want = namespace["ref_grads"](dm, g, u)
    got = fused_geglu.geglu_backward_op(dm, g, u, "silu")
    assert max(namespace["rel"](a, b) for a, b in zip(got, want)) < 1e-6
    gelu = fused_geglu.geglu_backward_op(dm, g, u)  # the default: GeGLU's, which differs
    assert namespace["rel"](gelu[0], want[0]) > 1e-2


def test_the_classes_and_their_arguments():
    """FusedGeGLUMLP as it was (dim, hidden, recompute: positionally too), FusedSwiGLUMLP its SiLU twin, both
    FusedGatedMLP; the activation in the repr and kept through a copy; a module pickled before there was an
    activation (no such attribute) reads as GeGLU."""
    geglu, swiglu = fused_geglu.FusedGeGLUMLP(8, 16, True), fused_geglu.FusedSwiGLUMLP(8, 16)
    gated = fused_geglu.FusedGatedMLP(8, 16, "silu", recompute=True)
    assert (geglu.activation, geglu.recompute, swiglu.activation, swiglu.recompute) == ("gelu_tanh", True, "silu", False)
    assert isinstance(geglu, fused_geglu.FusedGatedMLP) and isinstance(swiglu, fused_geglu.FusedGatedMLP)
    assert (gated.activation, gated.recompute) == ("silu", True) and fused_geglu.FusedGatedMLP(8, 16).activation == "gelu_tanh"
    assert "activation='silu', recompute=False" in repr(swiglu)
    assert copy.deepcopy(swiglu).activation == "silu"
    old = copy.copy(geglu)
    del old.__dict__["activation"]
    assert copy.deepcopy(old).activation == "gelu_tanh"
    assert list(swiglu.state_dict()) == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    assert fused_geglu.ACTIVATIONS == ("gelu_tanh", "silu")


@pytest.mark.parametrize("call", ["module", "geglu", "mlp", "backward", "backward_op"])
def test_another_activation_is_one_clear_error(call):
    x, w, wd, g = torch.randn(3, 8), torch.randn(16, 8), torch.randn(8, 16), torch.randn(3, 16)
    run = {"module": lambda: fused_geglu.FusedGatedMLP(8, 16, "relu"),
           "geglu": lambda: fused_geglu.geglu(x, w, w, activation="relu"),
           "mlp": lambda: fused_geglu.mlp(x, w, w, wd, activation="relu"),
           "backward": lambda: fused_geglu.backward_in_place(g, g.clone(), g.clone(), "relu"),
           "backward_op": lambda: fused_geglu.geglu_backward_op(g, g, g, "relu")}[call]
    with pytest.raises(ValueError) as e:
        run()
    assert str(e.value) == "activation 'relu': the fused kernels' epilogue is one of gelu_tanh, silu"


def test_kept_plans_never_mix_activations(monkeypatch):
    """A plan is kept per call signature, and the activation is part of it: a SiLU call like a GeLU one (same shapes,
    dtype, device) gets its own plan, for geglu, for geglu_saving_gu and for the whole MLP. plan_key gives no key on a
    CPU, so a stand-in keys every call by its kind, x's shape and the weights' shapes (the kind is what the launchers
    pass: it must hold the activation); outputs checked against PyTorch's."""
    keys = []

    def plan_key(kind, x, weights, with_packing=False):
        keys.append(kind)
        return (kind, x.shape, *(w.shape for w in weights), with_packing)
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})
    monkeypatch.setattr(fused_geglu.launcher, "plan_key", plan_key)
    torch.manual_seed(0)
    x, wg, wu, wd = torch.randn(6, 8), torch.randn(16, 8), torch.randn(16, 8), torch.randn(8, 16)
    want = {"gelu_tanh": F.gelu(x @ wg.T, approximate="tanh") * (x @ wu.T), "silu": F.silu(x @ wg.T) * (x @ wu.T)}
    for _ in range(2):  # the second round takes the kept plans
        for act in ("gelu_tanh", "silu", "gelu_tanh"):
            torch.testing.assert_close(fused_geglu.geglu(x, wg, wu, activation=act), want[act])
            torch.testing.assert_close(fused_geglu.geglu_saving_gu(x, wg, wu, activation=act)[0], want[act])
            torch.testing.assert_close(fused_geglu.mlp(x, wg, wu, wd, activation=act), want[act] @ wd.T)
    assert set(keys) == {(name, *extra, act) for act in ("gelu_tanh", "silu")
                         for name, *extra in (("geglu", False), ("geglu", True), ("mlp",))}
    assert len(fused_geglu.launcher.plans) == 6


def test_the_compiled_graph_holds_the_activation():
    """torch.compile's graph calls the op with the module's activation: a SwiGLU graph and a GeGLU one are two graphs,
    and the compile caches (which key on the graph) never serve one for the other."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append([(str(n.target), n.args[3:]) for n in gm.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("fused_geglu.geglu")])
        return gm.forward

    x = torch.randn(5, 16)
    for module in (fused_geglu.FusedSwiGLUMLP(16, 32), fused_geglu.FusedGeGLUMLP(16, 32)):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(module, backend=record)(x)
    torch._dynamo.reset()
    where_faster = fused_geglu.TORCH_WHERE_FASTER
    assert graphs == [[("fused_geglu.geglu.default", (where_faster, "silu"))],
                      [("fused_geglu.geglu.default", (where_faster, "gelu_tanh"))]]


def _compile_for_h100(kernel, args, meta):
    """PTX of kernel for an H100/H200 (sm_90a), compiled here by Triton's own compiler, without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type
    import triton
    meta = dict(meta)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {name: mangle_type(a) for name, a in zip(kernel.arg_names, args)}
    signature.update({name: "constexpr" for name in kernel.arg_names[len(args):]})
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=meta),
                              target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.asm["ptx"]


@pytest.mark.skipif(fused_geglu.INTERPRET or fused_geglu.TensorDescriptor is None, reason="needs Triton's compiler")
def test_every_kernel_compiles_with_the_silu_epilogue():
    """What the interpreter does not run: Triton's compiler, for a Hopper GPU. Every kernel with an epilogue compiles
    with ACT="silu"; in bf16 (FAST_TANH) the SwiGLU's sigmoid is the hardware tanh (tanh.approx) and no exp, exactly
    (FAST_TANH off) an exp (ex2.approx) and no tanh: the two forms the constexprs choose between."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    k, bf = fused_geglu.kernels, torch.bfloat16
    t = torch.empty(256, 256, dtype=bf)
    pointwise = dict(BLOCK=fused_geglu.POINTWISE_BLOCK, num_warps=4, num_stages=1, ACT="silu")
    for fast in (True, False):
        for kernel, args in ((k.geglu_pointwise_kernel, (t, t, t, 1000)), (k.geglu_packed_kernel, (t, 100, 200))):
            ptx = _compile_for_h100(kernel, args, dict(pointwise, FAST_TANH=fast))
            assert ("tanh.approx" in ptx, "ex2.approx" in ptx) == (fast, not fast), (kernel.fn.__name__, fast)
    for store_m in (False, True):  # m written or not: both compile, the exact form's exp in each
        assert "ex2.approx" in _compile_for_h100(k.geglu_backward_kernel, (t,) * 6 + (1000,),
                                                 dict(pointwise, STORE_M=store_m))
    flags = dict(UPCAST=False, FAST_TANH=True, ACT="silu")
    small = dict(fused_geglu.SMALL_M_CONFIGS["geglu"][0][1], SPLIT_K=2, DOT_PRECISION="tf32", **flags)
    assert "tanh.approx" in _compile_for_h100(k.geglu_small_m_kernel, (t,) * 6 + (16, 256, 256, 256, 256, 256, 256),
                                              small)
    pointer = dict(fused_geglu.PORTABLE_CONFIG, DOT_PRECISION="tf32", SAVE_GU=True, **flags)
    assert "tanh.approx" in _compile_for_h100(k.geglu_pointer_kernel, (t,) * 6 + (256,) * 7, pointer)
    cfg = fused_geglu.HOPPER_CONFIG
    descs = [TensorDescriptor.from_tensor(t, block) for block in ([cfg["BM"], cfg["BK"]], *[[cfg["BN"], cfg["BK"]]] * 2,
                                                                   *[[cfg["BM"], cfg["BN"]]] * 3)]
    tma = _compile_for_h100(k.geglu_tma_kernel, (*descs, 256, 256, 256), dict(cfg, NUM_SMS=132, SAVE_GU=True, **flags))
    assert "tanh.approx" in tma and "wgmma" in tma


def test_the_kernels_keep_their_names():
    """Traces name the kernels (and the trace reader's MLP_KERNELS knows them): SwiGLU runs the same ones."""
    k = fused_geglu.kernels
    assert [f.fn.__name__ if hasattr(f, "fn") else f.__name__ for f in (
        k.geglu_tma_kernel, k.geglu_pointer_kernel, k.geglu_small_m_kernel, k.geglu_pointwise_kernel,
        k.geglu_packed_kernel, k.geglu_backward_kernel)] == [
        "_geglu_tma_kernel", "_geglu_pointer_kernel", "_geglu_small_m_kernel", "_geglu_pointwise_kernel",
        "_geglu_packed_kernel", "_geglu_backward_kernel"]


# ---- on a GPU -------------------------------------------------------------------------------------------------

def _llama_and_fused(dim, hidden, recompute=False, dtype=torch.bfloat16):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    llama = LlamaMLP(LlamaConfig(hidden_size=dim, intermediate_size=hidden, hidden_act="silu", num_attention_heads=1))
    fused = fused_geglu.FusedSwiGLUMLP(dim, hidden, recompute=recompute)
    fused.load_state_dict(llama.state_dict())
    return llama.cuda(), fused.cuda().to(dtype)


@cuda
@pytest.mark.parametrize("M, dim, hidden", [(1, 4096, 14336), (16, 896, 4864), (300, 1000, 2730), (1000, 3584, 18944),
                                            (4096, 896, 4864)])
def test_gpu_module_matches_llama_mlp(M, dim, hidden):
    """bf16, against the fp32 LlamaMLP with the same weights: decode (small-M), dims not multiples of 8 (the pointer
    kernel), prefill (the tuned table's kernel at this M, the TMA one or cuBLAS and the pointwise SwiGLU), eager and
    compiled."""
    torch.manual_seed(0)
    llama, fused = _llama_and_fused(dim, hidden)
    x = torch.randn(M, dim, device="cuda")
    with torch.inference_mode():
        want = llama(x)
        for run in (fused, torch.compile(fused)):
            assert namespace["rel"](run(x.bfloat16()), want) < 2e-2
    torch._dynamo.reset()


@cuda
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("M", [9, 1000])
def test_gpu_training_matches_fp32_autograd(M, recompute):
    torch.manual_seed(0)
    llama, fused = _llama_and_fused(1024, 2816, recompute)
    x, dy = torch.randn(M, 1024, device="cuda"), torch.randn(M, 1024, device="cuda")
    xl, xf = x.clone().requires_grad_(), x.bfloat16().requires_grad_()
    llama(xl).backward(dy)
    fused(xf).backward(dy.bfloat16())
    assert namespace["rel"](xf.grad, xl.grad) < 5e-2
    for (name, p), q in zip(fused.named_parameters(), llama.parameters(), strict=True):
        assert namespace["rel"](p.grad, q.grad) < 5e-2, name


@cuda
@pytest.mark.parametrize("M", [1, 300, 4096])
def test_gpu_two_modules_one_shape_keep_their_own_plans(M):
    """A GeGLU and a SwiGLU module of one shape, called in turn: each output its own activation's, and each module's
    kept plan (launcher.plans, and its memo of the last call) its own."""
    torch.manual_seed(0)
    geglu = fused_geglu.FusedGeGLUMLP(1024, 2816).cuda().bfloat16()
    swiglu = fused_geglu.FusedSwiGLUMLP(1024, 2816).cuda().bfloat16()
    swiglu.load_state_dict(geglu.state_dict())  # the same weights: only the activation differs
    x = torch.randn(M, 1024, device="cuda").bfloat16()
    wg, wu, wd = (w.detach().double() for w in (geglu.gate_proj.weight, geglu.up_proj.weight, geglu.down_proj.weight))
    want = {"gelu_tanh": (F.gelu(x.double() @ wg.T, approximate="tanh") * (x.double() @ wu.T)) @ wd.T,
            "silu": (F.silu(x.double() @ wg.T) * (x.double() @ wu.T)) @ wd.T}
    with torch.inference_mode():
        for module in (geglu, swiglu, geglu, swiglu, geglu):
            assert namespace["rel"](module(x), want[module.activation]) < 2e-2, module.activation
    mlp_keys = [k for k in fused_geglu.launcher.plans if k[0] in (("mlp", "gelu_tanh"), ("mlp", "silu"))
                and k[1] == x.shape]
    assert {k[0] for k in mlp_keys} == {("mlp", "gelu_tanh"), ("mlp", "silu")}


@cuda
@pytest.mark.parametrize("M, use_tma", [(16, None), (4096, False), (4096, True)])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_gpu_epilogue_is_silu_over_its_whole_range(M, use_tma, dt):
    """m = silu(g) * 1 for g from -30 to 30, elementwise, on each path (bf16 takes the hardware tanh: sigmoid(g) =
    (1 + tanh(g / 2)) / 2): within the output's rounding where silu is large, and far below it where it is near zero
    (the bound of tests/test_fused_geglu.py's GeLU twin)."""
    if use_tma and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0+")
    K, N = 16, 64
    x = torch.zeros(M, K, device="cuda")
    x[:, 0], x[:, 1] = torch.linspace(-30, 30, M, device="cuda"), 1.0
    w_gate, w_up = torch.zeros(N, K, device="cuda"), torch.zeros(N, K, device="cuda")
    w_gate[:, 0], w_up[:, 1] = 1.0, 1.0  # every column: g = x[:, 0], u = 1
    x, w_gate, w_up = x.to(dt), w_gate.to(dt), w_up.to(dt)
    g = x[:, 0].float()[:, None]  # g as the kernel sees it
    m = fused_geglu.geglu(x, w_gate, w_up, use_tma=use_tma, activation="silu").float()
    ref = F.silu(g).expand(M, N)
    unit = 2.0 ** -8 if dt == torch.bfloat16 else 2.0 ** -11
    assert ((m - ref).abs() <= unit * ref.abs() + 2.0 ** -11 * g.abs()).all(), (m - ref).abs().max()
