"""The fused MLP's backward: its pointwise kernel (backward_in_place and the op geglu_backward_, in place; the op
geglu_backward, out of place) against fp64 autograd of gelu_tanh(g) * u, and the whole FusedGeGLUMLP's gradients in
both training modes (g and u saved by the forward kernel, or recomputed) against fp32 autograd of the eager MLP; what
each mode saves for backward, counted by autograd's saved-tensor hooks; which path eager and compiled training take.

CPU: the Triton kernel under Triton's interpreter, in a child process (TRITON_INTERPRET must be set before Triton
decorates a kernel, and must not leak into other modules), at tiny odd shapes; the CPU fallback (no interpreter) in
this process. GPU (skipped without CUDA): the compiled kernel at the post's shape and the module at odd shapes.
"""

import importlib
from pathlib import Path

import pytest
from conftest import interpreted_cases, interpreter_cannot_loop
import torch

pytest.importorskip("triton", reason="needs Triton (Linux wheels only; tests/test_platforms.py runs without it)")
import fused_geglu  # noqa: E402 - after the skip: it imports Triton

ROOT = Path(__file__).resolve().parent.parent
# ||out - ref|| / ||ref||: fp32 math throughout, so the outputs' rounding dominates
TOL = {"bf16": 1e-2, "fp32": 1e-5}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# Shared by this process and the interpreter's child: the references, by fp64 autograd (not the kernel's formula).
HELPERS = r"""
import importlib, json, sys
import torch, torch.nn.functional as F
import fused_geglu as fg

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

def reference(dm, g, u):
    # (grad_g, grad_u) of m = gelu_tanh(g) * u by fp64 autograd, from the same rounded inputs
    g, u = g.double().requires_grad_(), u.double().requires_grad_()
    m = F.gelu(g, approximate="tanh") * u
    return torch.autograd.grad(m, (g, u), dm.double())

def backward(dm, g, u):
    # geglu_backward_ writes the gradients over its g and u: give it copies
    grad_g, grad_u = g.clone(), u.clone()
    fg.geglu_backward_(dm, grad_g, grad_u)
    return grad_g, grad_u

def pointwise_case(M, N, dt, scale=1.0):
    dm, g, u = (torch.randn(M, N).mul(scale).to(DTYPES[dt]) for _ in range(3))
    grad_g, grad_u = backward(dm, g, u)
    ref_g, ref_u = reference(dm, g, u)
    kept = g.clone(), u.clone()
    op_g, op_u = fg.geglu_backward_op(dm, g, u)  # out of place: new tensors, g and u as they were
    return dict(err_g=rel(grad_g, ref_g), err_u=rel(grad_u, ref_u), shape=list(grad_g.shape),
                dtypes=[str(t.dtype) for t in (grad_g, grad_u, op_g, op_u)], want_dtype=str(DTYPES[dt]),
                finite=bool(torch.isfinite(grad_g).all() and torch.isfinite(grad_u).all()),
                op_err=max(rel(op_g, ref_g), rel(op_u, ref_u)), op_shape=list(op_g.shape),
                op_kept_inputs=bool(torch.equal(g, kept[0]) and torch.equal(u, kept[1])))

def second_backward_refused(tokens, device):
    # the default mode's backward writes over the saved g and u: a second one through the graph must be refused
    fused = fg.FusedGeGLUMLP(40, 72).to(device)
    y = fused(torch.randn(tokens, 40, device=device, requires_grad=True)).sum()
    y.backward(retain_graph=True)
    try:
        y.backward()
    except RuntimeError as e:
        return "modified by an inplace operation" in str(e)
    return False

def module_case(tokens, dim, hidden, dt, need_x=True, recompute=False, compiled=False):
    # FusedGeGLUMLP's gradients (bf16 or fp32; compiled: torch.compile's default, Inductor) against the eager MLP's in
    # fp32 autograd, same weights and loss
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(dim, hidden)
    fused = fg.FusedGeGLUMLP(dim, hidden, recompute=recompute).to(DTYPES[dt])
    fused.load_state_dict(eager.state_dict())
    x, target = torch.randn(tokens, dim), torch.randn(tokens, dim)
    xe, xf = x.clone().requires_grad_(need_x), x.to(DTYPES[dt]).requires_grad_(need_x)
    F.mse_loss(eager(xe), target).backward()
    F.mse_loss((torch.compile(fused) if compiled else fused)(xf).float(), target).backward()
    errs = {n: rel(pf.grad, pe.grad) for (n, pf), pe in zip(fused.named_parameters(), eager.parameters())}
    if need_x:
        errs["x"] = rel(xf.grad, xe.grad)
    return dict(errs=errs, x_grad=xf.grad is not None)
"""

CHILD = HELPERS + r"""
def emit(case, **fields):
    print(json.dumps(dict(case=case, **fields)), flush=True)

torch.manual_seed(0)
# sizes no block divides (the interpreter runs POINTWISE_BLOCK = 1024 elements a program), one smaller than a block
for dt in ("bf16", "fp32"):
    for M, N in [(37, 57), (3, 5), (64, 48)]:
        emit(f"pointwise-{dt}-{M}x{N}", **pointwise_case(M, N, dt))
# far out on both sides: exp(-2y) overflows for very negative g; the gradients must stay finite
g = torch.tensor([[-60.0, -10.0, -3.0, 0.0, 3.0, 10.0, 60.0, 1e4, -1e4]])
dm, u = torch.ones_like(g), torch.full_like(g, 2.0)
grad_g, grad_u = backward(dm, g, u)
ref_g, ref_u = reference(dm, g, u)
emit("pointwise-extreme", err_g=rel(grad_g, ref_g), err_u=rel(grad_u, ref_u),
     finite=bool(torch.isfinite(grad_g).all() and torch.isfinite(grad_u).all()))
# the forward's pointwise GeGLU (the "torch" bucket's on a GPU): m = gelu_tanh(g) * u, against fp64's formula by F.gelu
for dt, (M, N) in [("fp32", (37, 57)), ("bf16", (3, 5)), ("fp32", (1, 2500))]:
    g, u = (torch.randn(M, N).mul(3).to(DTYPES[dt]) for _ in "gu")
    m = torch.full_like(g, float("nan"))
    fg.launcher.launch(fg.kernels.geglu_pointwise_kernel, (-(-g.numel() // fg.POINTWISE_BLOCK),),
                       (g, u, m, g.numel()), FAST_TANH=False, BLOCK=fg.POINTWISE_BLOCK, num_warps=4, num_stages=1)
    ref = F.gelu(g.double(), approximate="tanh") * u.double()
    emit(f"forward-pointwise-{dt}-{M}x{N}", err=rel(m, ref), finite=bool(torch.isfinite(m).all()))
g = torch.tensor([-60.0, -10.0, -3.0, 0.0, 3.0, 10.0, 60.0, 1e4, -1e4])
m = torch.empty_like(g)
fg.launcher.launch(fg.kernels.geglu_pointwise_kernel, (1,), (g, torch.full_like(g, 2.0), m, 9), FAST_TANH=False,
                   BLOCK=fg.POINTWISE_BLOCK, num_warps=4, num_stages=1)
emit("forward-pointwise-extreme", got=m.tolist(), want=(F.gelu(g.double(), approximate="tanh") * 2).tolist())
if sys.argv[1] == "modules":  # the forward kernels loop over K: not where the interpreter cannot loop
    for dt in ("fp32", "bf16"):  # 45 tokens: the tiled kernel (storing g and u, or not), no tile divides them
        emit(f"module-{dt}", **module_case(45, 40, 72, dt))
        emit(f"module-{dt}-recompute", **module_case(45, 40, 72, dt, recompute=True))
    emit("module-fp32-no-x-grad", **module_case(45, 40, 72, "fp32", need_x=False))
    emit("module-bf16-small-m", **module_case(9, 40, 72, "bf16"))  # the small-M bucket: g and u by F.linear
    emit("second-backward", refused=second_backward_refused(45, "cpu"))
"""
namespace = {}
exec(HELPERS, namespace)  # the same references in this process, for the CPU fallback and the GPU


@pytest.fixture(scope="module")
def interpreted():
    return interpreted_cases(CHILD, "pointwise" if interpreter_cannot_loop() else "modules")


POINTWISE = [f"pointwise-{dt}-{s}" for dt in ("bf16", "fp32") for s in ("37x57", "3x5", "64x48")]


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_kernel_interpreted(interpreted, case):
    r = interpreted[case]
    dt, shape = case.split("-")[1:]
    assert r["shape"] == r["op_shape"] == [int(d) for d in shape.split("x")] and r["dtypes"] == [r["want_dtype"]] * 4
    assert r["finite"] and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt] and r["op_err"] < TOL[dt], r
    assert r["op_kept_inputs"], r


@pytest.mark.parametrize("case", ["fp32-37x57", "bf16-3x5", "fp32-1x2500"])
def test_forward_pointwise_kernel_interpreted(interpreted, case):
    """The "torch" bucket's GeGLU kernel: every element written (NaN-filled output first, sizes no block divides and
    one of 2.4 blocks), fp64's values within the dtype's rounding."""
    r = interpreted[f"forward-pointwise-{case}"]
    assert r["finite"] and r["err"] < TOL[case.split("-")[0]], r


def test_forward_pointwise_kernel_far_out(interpreted):
    """exp(-2y) overflows for very negative g: gelu goes to -0, not NaN; large positive g passes through."""
    r = interpreted["forward-pointwise-extreme"]
    assert r["got"] == pytest.approx(r["want"], rel=1e-6, abs=1e-6), r


def test_pointwise_kernel_far_out_stays_finite(interpreted):
    r = interpreted["pointwise-extreme"]
    assert r["finite"] and r["err_g"] < 1e-6 and r["err_u"] < 1e-6, r


@pytest.mark.skipif(interpreter_cannot_loop(), reason="Triton < 3.7's interpreter cannot run the forward's loops "
                    "under NumPy >= 2.5")
@pytest.mark.parametrize("case", ["module-fp32", "module-bf16", "module-fp32-recompute", "module-bf16-recompute",
                                  "module-fp32-no-x-grad", "module-bf16-small-m"])
def test_module_gradients_interpreted(interpreted, case):
    r = interpreted[case]
    # bf16: the weights and x rounded to bf16, the gradients too; eager computes in fp32 throughout
    tol = 2e-2 if "bf16" in case else TOL["fp32"]
    assert set(r["errs"]) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"} | (
        set() if "no-x" in case else {"x"})
    assert r["x_grad"] == ("no-x" not in case)
    assert max(r["errs"].values()) < tol, r


@pytest.mark.skipif(fused_geglu.INTERPRET or torch.cuda.is_available(), reason="CPU without the interpreter only")
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_cpu_fallback_matches_fp64(dt):
    torch.manual_seed(0)
    r = namespace["pointwise_case"](37, 57, dt)
    assert r["finite"] and r["dtypes"] == [r["want_dtype"]] * 4 and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt], r
    assert r["op_err"] < TOL[dt] and r["op_kept_inputs"], r


@pytest.mark.skipif(fused_geglu.INTERPRET or torch.cuda.is_available(), reason="CPU without the interpreter only")
@pytest.mark.parametrize("recompute", [False, True])
def test_cpu_module_gradients(recompute):
    """On a CPU the forward falls back to PyTorch ops and the backward to fp32 ones: the same gradients."""
    torch.manual_seed(0)
    r = namespace["module_case"](9, 40, 72, "fp32", recompute=recompute)
    assert max(r["errs"].values()) < TOL["fp32"], r


def _graph_ops(module, x):
    """{"dynamo" | "forward" | "backward": the ops each graph of a compiled training step calls (an op that an
    auto-functionalized in-place op wraps counts too)}, after running it (aot_eager: AOTAutograd's graphs, no
    Inductor)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def record(kind, gm):
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        graphs[kind] = {str(n.target) for n in nodes} | {str(a) for n in nodes for a in n.args
                                                         if isinstance(a, torch._ops.OpOverload)}

    def compiler(kind):
        def compile_(gm, example_inputs):
            record(kind, gm)
            return make_boxed_func(gm.forward)
        return compile_

    aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))

    def backend(gm, example_inputs):
        record("dynamo", gm)
        return aot(gm, example_inputs)

    torch.compile(module, backend=backend, fullgraph=True)(x).square().sum().backward()
    return graphs


@pytest.mark.parametrize("recompute, op", [(False, "fused_geglu.geglu_saving_gu.default"),
                                           (True, "fused_geglu.geglu.default")])
def test_compiled_training_traces_the_ops(recompute, op):
    """torch.compile sees each mode as its op (Dynamo cannot trace the launchers' host-side choices; eager training
    goes around the ops). In backward, recompute=True writes over the g and u it made (the in-place op, which
    AOTAutograd functionalizes); the default's g and u come from forward, inputs of the backward graph, so its
    backward makes new tensors (geglu_backward, traced through here) and nothing in the graph is in place. A compiled
    training step gives eager's gradients (CPU fallback ops here)."""
    torch.manual_seed(0)
    dim, hidden = 24, 40
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(dim, hidden)
    fused = fused_geglu.FusedGeGLUMLP(dim, hidden, recompute=recompute)
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(7, dim)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(xe).square().sum().backward()
    graphs = _graph_ops(fused, xc)
    assert op in graphs["dynamo"] and not {o for o in graphs["dynamo"] if o.startswith("fused_geglu.")} - {op}
    assert ("fused_geglu.geglu_backward_.default" in graphs["backward"]) == recompute, graphs["backward"]
    for (name, pe), pc in zip(eager.named_parameters(), fused.parameters()):
        assert torch.allclose(pc.grad, pe.grad, rtol=1e-5, atol=1e-6), name
    assert torch.allclose(xc.grad, xe.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recompute", [False, True])
def test_eager_training_goes_around_the_dispatcher(recompute, monkeypatch):
    """Eager training calls the launchers and the backward kernel directly (a plain autograd.Function), never the
    custom ops: their dispatch cost more host time than the GPU work at the post's shape."""
    def refuse(*args, **kwargs):
        raise AssertionError("a custom op was called in eager training")

    for holder, name in ((fused_geglu.ops, "geglu_op"), (fused_geglu.ops, "geglu_saving_gu_op"),
                         (fused_geglu.training, "geglu_backward_"), (fused_geglu.training, "geglu_backward_op")):
        monkeypatch.setattr(holder, name, refuse)  # where they live: every file reads them there
    fused = fused_geglu.FusedGeGLUMLP(8, 16, recompute=recompute)
    x = torch.randn(5, 8, requires_grad=True)
    y = fused(x)
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "_TrainingMLPBackward"  # below the output's reshape
    y.sum().backward()
    assert x.grad.shape == x.shape and fused.gate_proj.weight.grad is not None


def saved_for_backward(module, x):
    """The shapes (sorted) and total bytes of every tensor autograd saves during module(x), by its pack hook."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sorted(shape for shape, _ in saved), sum(nbytes for _, nbytes in saved)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
@pytest.mark.parametrize("recompute", [False, True])
def test_what_forward_saves(device, recompute):
    """recompute=True saves x and the three weights and no [tokens, hidden] tensor; the default saves exactly g and
    u besides. Neither saves m, which down_proj's own F.linear would (eager training is one node for the whole MLP:
    its backward makes m again). bf16: 2 bytes an element."""
    M, d, h = 45, 24, 40
    fused = fused_geglu.FusedGeGLUMLP(d, h, recompute=recompute).to(device, torch.bfloat16)
    shapes, nbytes = saved_for_backward(fused, torch.randn(M, d, device=device, dtype=torch.bfloat16,
                                                            requires_grad=True))
    inputs = [(M, d), (h, d), (h, d), (d, h)]  # x, the gate, up and down weights
    gu = [] if recompute else [(M, h), (M, h)]
    assert shapes == sorted(inputs + gu)
    assert nbytes == 2 * (M * d + 3 * h * d + (0 if recompute else 2 * M * h))


@pytest.mark.parametrize("recompute", [False, True])
def test_a_weight_changed_in_place_before_backward_fails_as_eager_does(recompute):
    """An in-place change of the gate weight between forward and backward (an optimizer step in the wrong place):
    eager's F.linear saved that weight for x's gradient, so PyTorch refuses the backward; both modes save it too and
    refuse the same way, rather than give a gradient of weights the forward did not use."""
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(8, 16)
    fused = fused_geglu.FusedGeGLUMLP(8, 16, recompute=recompute)
    fused.load_state_dict(eager.state_dict())
    for module in (eager, fused):
        y = module(torch.randn(5, 8, requires_grad=True))
        with torch.no_grad():
            module.gate_proj.weight.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_a_second_backward_fails_clearly():
    """The default mode's backward writes the gradients of g and u over the saved g and u: a second backward through
    the same graph (retain_graph=True) is refused by autograd's version check, not computed from overwritten values
    (here the CPU fallback's copy_; the kernel's writes in the interpreter's run and on the GPU). recompute=True
    rebuilds g and u each time: its second backward is as good as the first."""
    assert namespace["second_backward_refused"](9, "cpu")
    fused = fused_geglu.FusedGeGLUMLP(40, 72, recompute=True)
    y = fused(torch.randn(9, 40, requires_grad=True)).sum()
    y.backward(retain_graph=True)
    first = fused.gate_proj.weight.grad.clone()
    y.backward()
    torch.testing.assert_close(fused.gate_proj.weight.grad, 2 * first)


@pytest.mark.skipif(interpreter_cannot_loop(), reason="Triton < 3.7's interpreter cannot run the forward's loops "
                    "under NumPy >= 2.5")
def test_a_second_backward_fails_clearly_interpreted(interpreted):
    assert interpreted["second-backward"]["refused"]


def test_load_state_dict_both_ways_between_the_modes():
    """One set of names for the eager MLP and both modes: weights move any way and give the same output."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(8, 16)
    saving, recomputing = fused_geglu.FusedGeGLUMLP(8, 16), fused_geglu.FusedGeGLUMLP(8, 16, recompute=True)
    saving.load_state_dict(eager.state_dict())
    recomputing.load_state_dict(saving.state_dict())
    back = SimpleGeGLUMLP(8, 16)
    back.load_state_dict(recomputing.state_dict())
    x = torch.randn(3, 8)
    with torch.no_grad():
        for module in (saving, recomputing, back):
            torch.testing.assert_close(module(x), eager(x))
    assert recomputing.recompute and not saving.recompute and "recompute=True" in repr(recomputing)


def test_the_gradients_are_written_over_g_and_u():
    """In place: g's buffer ends as grad_g and u's as grad_u (no new [M, hidden] tensors), the values fp64's."""
    torch.manual_seed(0)
    dm, g, u = (torch.randn(5, 9) for _ in range(3))
    ref_g, ref_u = namespace["reference"](dm, g, u)
    grad_g, grad_u = g.clone(), u.clone()
    where = (grad_g.data_ptr(), grad_u.data_ptr())
    fused_geglu.geglu_backward_(dm, grad_g, grad_u)
    assert (grad_g.data_ptr(), grad_u.data_ptr()) == where
    assert torch.allclose(grad_g.double(), ref_g, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad_u.double(), ref_u, rtol=1e-5, atol=1e-6)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("tokens", [45, 1000])
def test_gpu_a_second_backward_fails_clearly(tokens):
    assert namespace["second_backward_refused"](tokens, "cuda")


@cuda
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(8192, 3072), (1000, 11008), (3, 5)])
def test_gpu_pointwise_kernel(dt, shape):
    torch.manual_seed(0)
    with torch.device("cuda"):
        r = namespace["pointwise_case"](*shape, dt)
    assert r["finite"] and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt], r
    assert r["op_err"] < TOL[dt] and r["op_kept_inputs"] and r["dtypes"] == [r["want_dtype"]] * 4, r


@cuda
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [45, 1000])  # the small-M bucket's forward at 45, the tiled kernel at 1000
def test_gpu_module_gradients(dt, tokens, recompute):
    torch.manual_seed(0)
    with torch.device("cuda"):
        r = namespace["module_case"](tokens, 200, 520, dt, recompute=recompute)
    assert max(r["errs"].values()) < (2e-2 if dt == "bf16" else 1e-4), r  # fp32 GEMMs may use TF32 on the GPU


@cuda
@pytest.mark.parametrize("recompute", [False, True])
def test_gpu_compiled_module_gradients(recompute):
    """Inductor's graph with each mode's ops (and the saving mode's out-of-place backward) gives eager's gradients."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    with torch.device("cuda"):
        r = namespace["module_case"](1000, 256, 520, "bf16", recompute=recompute, compiled=True)
    assert max(r["errs"].values()) < 2e-2, r


@cuda
def test_gpu_the_kept_backward_launch_runs_on_each_calls_own_tensors(monkeypatch):
    """The pointwise backward is planned once per shape: later calls build no launch key, yet each writes its own
    gradients, in place and out of place, values fp64's; another shape and another stream plan again."""
    rng = lambda *shape: torch.randn(*shape, device="cuda").bfloat16()  # noqa: E731
    reference = namespace["reference"]

    def check(shape):
        dm, g, u = rng(*shape), rng(*shape), rng(*shape)
        ref_g, ref_u = reference(dm.double(), g.double(), u.double())
        grad_g, grad_u = fused_geglu.geglu_backward_op(dm, g, u)  # out of place
        in_g, in_u = g.clone(), u.clone()
        fused_geglu.geglu_backward_(dm, in_g, in_u)  # in place, the same key: g's shape, dtype and device
        for got in (grad_g, in_g):
            assert ((got.double() - ref_g).norm() / ref_g.norm()).item() < TOL["bf16"]
        for got in (grad_u, in_u):
            assert ((got.double() - ref_u).norm() / ref_u.norm()).item() < TOL["bf16"]

    check((300, 512))  # plans
    launched = []
    launch_ = fused_geglu.launcher.launch
    monkeypatch.setattr(fused_geglu.launcher, "launch", lambda *a, **k: launched.append(a) or launch_(*a, **k))
    check((300, 512))
    check((300, 512))
    assert launched == [], "a kept backward launch was worked out again"
    check((7, 1000))  # a new shape: planned once (its first call), through launcher.launch no more than that
    with torch.cuda.stream(torch.cuda.Stream()):
        check((300, 512))
        torch.cuda.current_stream().synchronize()
    assert launched == []  # plans bind through launcher.bind, never launch: the count says nothing was unplanned
    assert len([k for k in fused_geglu.launcher.plans
                if k[0] == ("backward", "gelu_tanh", False) and k[1] == (300, 512)]) >= 2  # 2 streams
