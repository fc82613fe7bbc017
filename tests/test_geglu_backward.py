"""The fused MLP's backward (fused_geglu._geglu_backward): its pointwise kernel (geglu_backward_, in place) against fp64
autograd of gelu_tanh(g) * u, and the whole FusedGeGLUMLP's gradients against fp32 autograd of the eager MLP.

CPU: the Triton kernel under Triton's interpreter, in a child process (TRITON_INTERPRET must be set before Triton
decorates a kernel, and must not leak into other modules), at tiny odd shapes; the CPU fallback (no interpreter) in
this process. GPU (skipped without CUDA): the compiled kernel at the post's shape and the module at odd shapes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import interpreter_cannot_loop
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
    return dict(err_g=rel(grad_g, ref_g), err_u=rel(grad_u, ref_u), shape=list(grad_g.shape),
                dtypes=[str(grad_g.dtype), str(grad_u.dtype)], want_dtype=str(DTYPES[dt]),
                finite=bool(torch.isfinite(grad_g).all() and torch.isfinite(grad_u).all()))

def module_case(tokens, dim, hidden, dt, need_x=True):
    # FusedGeGLUMLP's gradients (bf16 or fp32) against the eager MLP's in fp32 autograd, same weights and loss
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(dim, hidden)
    fused = fg.FusedGeGLUMLP(dim, hidden).to(DTYPES[dt])
    fused.load_state_dict(eager.state_dict())
    x, target = torch.randn(tokens, dim), torch.randn(tokens, dim)
    xe, xf = x.clone().requires_grad_(need_x), x.to(DTYPES[dt]).requires_grad_(need_x)
    F.mse_loss(eager(xe), target).backward()
    F.mse_loss(fused(xf).float(), target).backward()
    errs = {n: rel(pf.grad, pe.grad) for (n, pf), pe in zip(fused.named_parameters(), eager.parameters())}
    if need_x:
        errs["x"] = rel(xf.grad, xe.grad)
    return dict(errs=errs, x_grad=xf.grad is not None)
"""

CHILD = HELPERS + r"""
def emit(case, **fields):
    print(json.dumps(dict(case=case, **fields)), flush=True)

torch.manual_seed(0)
# sizes no block divides (the interpreter runs BACKWARD_BLOCK = 1024 elements a program), one smaller than a block
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
if sys.argv[1] == "modules":  # the forward kernels loop over K: not where the interpreter cannot loop
    for dt in ("fp32", "bf16"):
        emit(f"module-{dt}", **module_case(45, 40, 72, dt))  # 45 tokens: the tiled kernel, no tile divides them
    emit("module-fp32-no-x-grad", **module_case(45, 40, 72, "fp32", need_x=False))
"""
namespace = {}
exec(HELPERS, namespace)  # the same references in this process, for the CPU fallback and the GPU


@pytest.fixture(scope="module")
def interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    mode = "pointwise" if interpreter_cannot_loop() else "modules"
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


POINTWISE = [f"pointwise-{dt}-{s}" for dt in ("bf16", "fp32") for s in ("37x57", "3x5", "64x48")]


@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_kernel_interpreted(interpreted, case):
    r = interpreted[case]
    dt, shape = case.split("-")[1:]
    assert r["shape"] == [int(d) for d in shape.split("x")] and r["dtypes"] == [r["want_dtype"]] * 2
    assert r["finite"] and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt], r


def test_pointwise_kernel_far_out_stays_finite(interpreted):
    r = interpreted["pointwise-extreme"]
    assert r["finite"] and r["err_g"] < 1e-6 and r["err_u"] < 1e-6, r


@pytest.mark.skipif(interpreter_cannot_loop(), reason="Triton < 3.7's interpreter cannot run the forward's loops "
                    "under NumPy >= 2.5")
@pytest.mark.parametrize("case", ["module-fp32", "module-bf16", "module-fp32-no-x-grad"])
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
    assert r["finite"] and r["dtypes"] == [r["want_dtype"]] * 2 and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt], r


@pytest.mark.skipif(fused_geglu.INTERPRET or torch.cuda.is_available(), reason="CPU without the interpreter only")
def test_cpu_module_gradients():
    """On a CPU the forward falls back to PyTorch ops and the backward to fp32 ones: the same gradients."""
    torch.manual_seed(0)
    r = namespace["module_case"](9, 40, 72, "fp32")
    assert max(r["errs"].values()) < TOL["fp32"], r


def test_compiled_backward_traces_the_op():
    """torch.compile traces the backward through the in-place op (AOTAutograd functionalizes its mutation): a
    compiled training step of the module gives eager's gradients (CPU fallback ops here, Inductor-free backend)."""
    torch.manual_seed(0)
    dim, hidden = 24, 40
    eager, fused = fused_geglu.FusedGeGLUMLP(dim, hidden), fused_geglu.FusedGeGLUMLP(dim, hidden)
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(7, dim)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(xe).square().sum().backward()
    torch.compile(fused, backend="aot_eager", fullgraph=True)(xc).square().sum().backward()
    for (name, pe), pc in zip(eager.named_parameters(), fused.parameters()):
        assert torch.allclose(pc.grad, pe.grad, rtol=1e-5, atol=1e-6), name
    assert torch.allclose(xc.grad, xe.grad, rtol=1e-5, atol=1e-6)


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
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(8192, 3072), (1000, 11008), (3, 5)])
def test_gpu_pointwise_kernel(dt, shape):
    torch.manual_seed(0)
    with torch.device("cuda"):
        r = namespace["pointwise_case"](*shape, dt)
    assert r["finite"] and r["err_g"] < TOL[dt] and r["err_u"] < TOL[dt], r


@cuda
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [45, 1000])  # the small-M bucket's forward at 45, the tiled kernel at 1000
def test_gpu_module_gradients(dt, tokens):
    torch.manual_seed(0)
    with torch.device("cuda"):
        r = namespace["module_case"](tokens, 200, 520, dt)
    assert max(r["errs"].values()) < (2e-2 if dt == "bf16" else 1e-4), r  # fp32 GEMMs may use TF32 on the GPU
