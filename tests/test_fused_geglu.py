"""The epilogue-fused GeGLU kernel (the package fused_geglu/) against fp64 and eager references.

CPU: both Triton kernels run under Triton's interpreter. TRITON_INTERPRET must be set before Triton
decorates a kernel and must not leak into other test modules (they use torch.compile), so the
interpreter checks run once in a child process that prints one JSON result per case.
GPU (skipped without CUDA): the same kernels compiled for the device, at the benchmark's shapes.
"""

import copy
import importlib
import json
import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest
from conftest import interpreted_cases, interpreter_cannot_loop
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton", reason="needs Triton (Linux wheels only; tests/test_platforms.py runs without it)")
import fused_geglu  # noqa: E402 - after the skip: it imports Triton

ROOT = Path(__file__).resolve().parent.parent
# ||out - ref|| / ||ref|| with ref in fp64 from the same rounded inputs: the output's rounding dominates.
TOL = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Runs in the child process, with TRITON_INTERPRET=1 set before fused_geglu (and Triton) is imported.
CHILD = r"""
import importlib, json, sys
import torch, torch.nn.functional as F
import fused_geglu as fg

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
torch.manual_seed(0)

def emit(case, **fields):
    print(json.dumps(dict(case=case, **fields)), flush=True)

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

def ref_geglu(x, wg, wu):
    x, wg, wu = x.double(), wg.double(), wu.double()
    return F.gelu(x @ wg.T, approximate="tanh") * (x @ wu.T)

# Kernels: M, K (dim), N (hidden) not multiples of the 32 x 32 x 16 interpreter tiles.
for dt in ("bf16", "fp16", "fp32"):
    for M, K, N in [(37, 40, 72), (64, 48, 96), (3, 16, 8), (33, 41, 57)]:
        x = torch.randn(M, K).to(DTYPES[dt])
        wg, wu = (torch.randn(N, K).div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
        ref = ref_geglu(x, wg, wu)
        for use_tma in (False, True):
            case = f"kernel-{dt}-{M}x{K}x{N}-{'tma' if use_tma else 'pointer'}"
            try:
                path = fg.kernel_path(x, wg, wu, use_tma)
            except ValueError:
                emit(case, skipped="TMA needs bf16/fp16 and dim, hidden multiples of 8")
                continue
            m = fg.geglu(x, wg, wu, use_tma=use_tma)
            emit(case, path=path, err=rel(m, ref), finite=bool(torch.isfinite(m).all()),
                 shape=list(m.shape), dtype=str(m.dtype), want_dtype=str(DTYPES[dt]))

# The TMA kernel's ONE_DOT variant: the gate and up tiles interleaved on chip into one dot.
for dt in ("bf16", "fp16"):
    for M, K, N in [(37, 40, 72), (64, 48, 96)]:
        x = torch.randn(M, K).to(DTYPES[dt])
        wg, wu = (torch.randn(N, K).div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
        m = fg.geglu(x, wg, wu, kernel="tma", config=dict(fg.INTERPRETER_CONFIG, ONE_DOT=True))
        saving = fg.geglu_saving_gu(x, wg, wu, kernel="tma", config=dict(fg.INTERPRETER_CONFIG, ONE_DOT=True))
        emit(f"onedot-{dt}-{M}x{K}x{N}", err=rel(m, ref_geglu(x, wg, wu)), shape=list(m.shape),
             saving_errs=[rel(saving[0], ref_geglu(x, wg, wu)), rel(saving[1], x.double() @ wg.double().T),
                          rel(saving[2], x.double() @ wu.double().T)])

# Training's forward: the tiled kernels' epilogue also stores g and u (SAVE_GU); at small M, F.linear makes them.
for dt in ("bf16", "fp32"):
    for M, K, N, kernel in [(37, 40, 72, "pointer"), (37, 40, 72, "tma"), (5, 40, 72, "small")]:
        x = torch.randn(M, K).to(DTYPES[dt])
        wg, wu = (torch.randn(N, K).div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
        if kernel == "tma" and dt == "fp32":
            continue  # TMA: bf16/fp16 only
        m, g, u = fg.geglu_saving_gu(x, wg, wu, use_tma=None if kernel == "small" else kernel == "tma")
        emit(f"save-gu-{dt}-{kernel}", path=fg.kernel_path(x, wg, wu, None if kernel == "small" else kernel == "tma"),
             err=rel(m, ref_geglu(x, wg, wu)), err_g=rel(g, x.double() @ wg.double().T),
             err_u=rel(u, x.double() @ wu.double().T), shapes=[list(t.shape) for t in (m, g, u)],
             dtypes=sorted({str(t.dtype) for t in (m, g, u)}), want_dtype=str(DTYPES[dt]))

# The small-M kernels (decode), with and without split-K, at shapes no tile divides; down_proj is the
# same body without the epilogue.
SMALL = {"tile": dict(BM=16, BN=32, BK=32, num_warps=4, num_stages=1),
         "split3": dict(BM=16, BN=16, BK=16, SPLIT_K=3, num_warps=4, num_stages=1)}
for dt, shapes in [("bf16", [(1, 41, 57), (7, 40, 72), (18, 33, 8)]), ("fp32", [(7, 40, 72)])]:
    for M, K, N in shapes:
        x = torch.randn(M, K).to(DTYPES[dt])
        wg, wu = (torch.randn(N, K).div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
        ref, down_ref = ref_geglu(x, wg, wu), x.double() @ wg.double().T
        for name, cfg in SMALL.items():
            m = fg.geglu(x, wg, wu, config=cfg)
            again = fg.geglu(x, wg, wu, config=cfg)  # split-K counters must be back at zero
            y = fg.down_proj(x, wg, config=cfg)
            emit(f"small-{dt}-{M}x{K}x{N}-{name}", path=fg.kernel_path(x, wg, wu),
                 err=rel(m, ref), same_twice=bool(torch.equal(m, again)), shape=list(m.shape),
                 down_err=rel(y, down_ref), down_shape=list(y.shape))

# Large |g|: exp(-2y) overflows to inf for very negative g; the result must stay finite.
x = torch.tensor([[-60.0, 60.0], [-1e4, 1e4]]).repeat(1, 8)
w = torch.eye(16)  # g = u = x
m = fg.geglu(x, w, w)
emit("extreme-values", err=rel(m, ref_geglu(x, w, w)), finite=bool(torch.isfinite(m).all()))

# Module vs the eager SimpleGeGLUMLP with the same weights, leading batch dims; 2 x 5 tokens run the
# small-M kernels, 2 x 20 the tiled one.
SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
for dt in ("bf16", "fp32"):
    for seq in (5, 20):
        eager = SimpleGeGLUMLP(40, 72).to(DTYPES[dt])
        fused = fg.FusedGeGLUMLP(40, 72).to(DTYPES[dt])
        fused.load_state_dict(eager.state_dict())
        x = torch.randn(2, seq, 40).to(DTYPES[dt])
        with torch.no_grad():
            y, y_eager = fused(x), eager(x)
        emit(f"module-{dt}-{seq}", err=rel(y, y_eager), shape=list(y.shape), want_shape=list(y_eager.shape),
             path=fg.kernel_path(x.reshape(-1, 40), fused.gate_proj.weight, fused.up_proj.weight))

# Changed weights: the kernels read the weights as they are after load_state_dict, in-place edits and .to().
eager = SimpleGeGLUMLP(40, 72)
fused = fg.FusedGeGLUMLP(40, 72)
x = torch.randn(7, 40)
with torch.no_grad():
    fused(x)                                       # a first call with the initial values
    fused.load_state_dict(eager.state_dict())
    emit("stale-load_state_dict", err=rel(fused(x), eager(x)))
    fused.up_proj.weight.mul_(-2.0)                # an optimizer-style in-place write
    eager.up_proj.weight.mul_(-2.0)
    emit("stale-inplace", err=rel(fused(x), eager(x)))
    fused.to(torch.bfloat16)                       # .to() swaps the parameters' storage
    emit("stale-to-bf16", err=rel(fused(x.bfloat16()), eager(x)))

# No tokens: an empty output, as nn.Linear gives, through the kernels' launchers and both training modes.
for recompute in (False, True):
    fused = fg.FusedGeGLUMLP(40, 72, recompute=recompute)
    with torch.no_grad():
        shapes = [list(fused(torch.empty(0, 40)).shape), list(fused(torch.empty(2, 0, 40)).shape)]
    x = torch.empty(0, 40, requires_grad=True)
    fused(x).sum().backward()
    emit(f"no-tokens{'-recompute' * recompute}", shapes=shapes, grad_shape=list(x.grad.shape),
         weight_grad_zero=bool((fused.gate_proj.weight.grad == 0).all()))

# Gradients (the backward recomputes with PyTorch ops) against eager's.
eager = SimpleGeGLUMLP(40, 72)
fused = fg.FusedGeGLUMLP(40, 72)
fused.load_state_dict(eager.state_dict())
x = torch.randn(9, 40)
xe, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
eager(xe).square().sum().backward()
fused(xf).square().sum().backward()
errs = [rel(xf.grad, xe.grad)] + [rel(pf.grad, pe.grad) for pf, pe in zip(fused.parameters(), eager.parameters())]
emit("backward", err=max(errs))
"""


@pytest.fixture(scope="module")
def interpreted():
    if interpreter_cannot_loop():
        pytest.skip("Triton < 3.7's interpreter cannot run kernel loops under NumPy >= 2.5")
    return interpreted_cases(CHILD)


KERNEL_CASES = [f"kernel-{dt}-{s}-{p}" for dt in ("bf16", "fp16", "fp32")
                for s in ("37x40x72", "64x48x96", "3x16x8", "33x41x57") for p in ("pointer", "tma")]


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernel_interpreted(interpreted, case):
    r = interpreted[case]
    dt, shape, path = case.split("-")[1:]
    if "skipped" in r:
        # Only the combinations TMA cannot express may be skipped, never a whole dtype or shape.
        assert path == "tma" and (dt == "fp32" or shape == "33x41x57"), r
        return
    M, K, N = map(int, shape.split("x"))
    assert r["path"] == path
    assert r["finite"] and r["shape"] == [M, N] and r["dtype"] == r["want_dtype"]
    assert r["err"] < TOL[dt], r


def test_interpreted_cases_are_all_there(interpreted):
    # A case that silently vanished from the child would otherwise go unnoticed.
    assert set(KERNEL_CASES) <= set(interpreted) and set(SMALL_CASES) <= set(interpreted)
    assert {c for c in interpreted if c.startswith("save-gu-")} == set(SAVE_GU_CASES)
    assert sum("skipped" not in interpreted[c] for c in KERNEL_CASES) == 18


SAVE_GU_CASES = ["save-gu-bf16-pointer", "save-gu-bf16-tma", "save-gu-bf16-small", "save-gu-fp32-pointer",
                 "save-gu-fp32-small"]


@pytest.mark.parametrize("case", SAVE_GU_CASES)
def test_training_forward_saves_g_and_u_interpreted(interpreted, case):
    """m as inference computes it, and g = x @ Wg^T, u = x @ Wu^T within x's dtype's rounding: from the tiled kernels'
    epilogue (SAVE_GU), or F.linear where the small-M kernel would run."""
    r = interpreted[case]
    dt, kernel = case.split("-")[2:]
    M = 5 if kernel == "small" else 37
    assert r["path"] == kernel and r["shapes"] == [[M, 72]] * 3 and r["dtypes"] == [r["want_dtype"]]
    assert max(r["err"], r["err_g"], r["err_u"]) < TOL[dt], r


@pytest.mark.parametrize("case", [f"onedot-{dt}-{s}" for dt in ("bf16", "fp16") for s in ("37x40x72", "64x48x96")])
def test_tma_one_dot_variant_interpreted(interpreted, case):
    r = interpreted[case]
    M, K, N = map(int, case.split("-")[2].split("x"))
    assert r["shape"] == [M, N] and r["err"] < TOL[case.split("-")[1]], r
    assert len(r["saving_errs"]) == 3 and max(r["saving_errs"]) < TOL[case.split("-")[1]], r  # m, g, u with SAVE_GU


def test_extreme_inputs_stay_finite(interpreted):
    r = interpreted["extreme-values"]
    assert r["finite"] and r["err"] < 1e-6, r


SMALL_SHAPES = {"bf16": ("1x41x57", "7x40x72", "18x33x8"), "fp32": ("7x40x72",)}
SMALL_CASES = [f"small-{dt}-{s}-{c}" for dt, shapes in SMALL_SHAPES.items() for s in shapes
               for c in ("tile", "split3")]


@pytest.mark.parametrize("case", SMALL_CASES)
def test_small_m_kernels_interpreted(interpreted, case):
    r = interpreted[case]
    dt, shape = case.split("-")[1:3]
    M, K, N = map(int, shape.split("x"))
    assert r["path"] == "small"  # the interpreter's buckets go up to M = 32
    assert r["shape"] == [M, N] and r["down_shape"] == [M, N]
    assert r["err"] < TOL[dt] and r["down_err"] < TOL[dt], r
    assert r["same_twice"], "a second split-K launch differs: the arrival counters were not reset"


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("seq", [5, 20])
def test_module_matches_eager(interpreted, dt, seq):
    r = interpreted[f"module-{dt}-{seq}"]
    assert r["shape"] == r["want_shape"] == [2, seq, 40]
    assert r["path"] == ("small" if seq == 5 else "pointer")
    # bf16: eager rounds g, u, gelu(g) and m on the way, the fused kernel only m.
    assert r["err"] < (2e-2 if dt == "bf16" else 1e-5), r


@pytest.mark.parametrize("case", ["stale-load_state_dict", "stale-inplace", "stale-to-bf16"])
def test_follows_changed_weights(interpreted, case):
    assert interpreted[case]["err"] < (2e-2 if "bf16" in case else 1e-5), interpreted[case]


@pytest.mark.parametrize("case", ["no-tokens", "no-tokens-recompute"])
def test_no_tokens_give_an_empty_output_interpreted(interpreted, case):
    r = interpreted[case]
    assert r["shapes"] == [[0, 40], [2, 0, 40]] and r["grad_shape"] == [0, 40] and r["weight_grad_zero"], r


def _check_no_tokens(device, recompute):
    """M = 0 gives an empty [0, dim] output, as nn.Linear does: inference, training, and the custom ops."""
    fused = fused_geglu.FusedGeGLUMLP(24, 40, recompute=recompute).to(device)
    linear = torch.nn.Linear(24, 24, bias=False).to(device)
    for x in (torch.empty(0, 24, device=device), torch.empty(3, 0, 24, device=device)):
        with torch.no_grad():
            assert fused(x).shape == linear(x).shape == (*x.shape[:-1], 24)
    x = torch.empty(0, 24, device=device, requires_grad=True)
    y = fused(x)
    y.sum().backward()
    assert y.shape == (0, 24) and x.grad.shape == (0, 24)
    for w in (fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight):
        assert w.grad.shape == w.shape and (w.grad == 0).all()
    w = fused.gate_proj.weight.detach()
    m = fused_geglu.geglu_op(x.detach(), w, fused.up_proj.weight.detach())
    assert m.shape == (0, 40) and fused_geglu.down_proj_op(m, fused.down_proj.weight.detach()).shape == (0, 24)
    saved = fused_geglu.geglu_saving_gu_op(x.detach(), w, fused.up_proj.weight.detach())
    assert [t.shape for t in saved] == [(0, 40)] * 3


@pytest.mark.parametrize("recompute", [False, True])
def test_no_tokens_give_an_empty_output(recompute):
    _check_no_tokens("cpu", recompute)


def test_backward_matches_eager(interpreted):
    assert interpreted["backward"]["err"] < 1e-5, interpreted["backward"]


def test_same_parameter_names_as_eager():
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    assert list(fused_geglu.FusedGeGLUMLP(8, 16).state_dict()) == list(SimpleGeGLUMLP(8, 16).state_dict())


def _one_storage(module):
    """gate_proj's and up_proj's weights are gate's rows then up's in one storage of exactly their bytes."""
    g, u = module.gate_proj.weight, module.up_proj.weight
    nbytes = g.numel() * g.element_size()
    return (g.untyped_storage().data_ptr() == u.untyped_storage().data_ptr() == g.data_ptr()
            and u.data_ptr() == g.data_ptr() + nbytes and g.untyped_storage().nbytes() == 2 * nbytes)


def test_packed_is_up_right_after_gate():
    """fused_geglu.packed: the expected answers written out from addresses the test lays out itself."""
    both = torch.zeros(2 * 6, 4)
    assert fused_geglu.packed(both[:6], both[6:])
    assert not fused_geglu.packed(both[6:], both[:6])  # up before gate
    assert fused_geglu.packed(both[:5], both[5:10])  # [5, 4] then [5, 4]
    assert not fused_geglu.packed(both[:6], both[6:11])  # adjacent, but [6, 4] then [5, 4]
    assert not fused_geglu.packed(both[:6], both[7:])  # a row between them
    assert not fused_geglu.packed(torch.zeros(6, 4), torch.zeros(6, 4))


def test_gate_and_up_stay_in_one_storage_through_what_gives_weights_new_ones(tmp_path):
    """Made, converted (.to, .double), deep-copied, pickled, loaded with assign=True, made on meta then to_empty: the
    module's gate and up weights end in one storage (no extra bytes), with the values they should hold, and
    state_dict moves them to and from SimpleGeGLUMLP."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    torch.manual_seed(0)
    eager = SimpleGeGLUMLP(8, 16)
    fused = fused_geglu.FusedGeGLUMLP(8, 16)
    assert _one_storage(fused)
    fused.load_state_dict(eager.state_dict())  # copied in place
    assert _one_storage(fused) and torch.equal(fused.up_proj.weight, eager.up_proj.weight)
    fused = fused.to(torch.bfloat16)
    assert _one_storage(fused) and fused.gate_proj.weight.dtype == torch.bfloat16
    fused = fused.double()
    assert _one_storage(fused)
    torch.testing.assert_close(fused.gate_proj.weight, eager.gate_proj.weight.bfloat16().double())
    copied = __import__("copy").deepcopy(fused)
    assert _one_storage(copied) and copied.gate_proj.weight.data_ptr() != fused.gate_proj.weight.data_ptr()
    assert torch.equal(copied.up_proj.weight, fused.up_proj.weight)
    torch.save(fused, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert _one_storage(loaded) and torch.equal(loaded.gate_proj.weight, fused.gate_proj.weight)
    state = {k: torch.full_like(v, i) for i, (k, v) in enumerate(fused.state_dict().items())}
    fused.load_state_dict(state, assign=True)  # the state dict's own tensors, then packed again
    assert _one_storage(fused)
    assert [float(v.unique()) for v in fused.state_dict().values()] == [0.0, 1.0, 2.0]
    back = SimpleGeGLUMLP(8, 16).double()
    back.load_state_dict(fused.state_dict())
    assert torch.equal(back.up_proj.weight, torch.full((16, 8), 1.0, dtype=torch.float64))
    with torch.device("meta"):
        on_meta = fused_geglu.FusedGeGLUMLP(8, 16)
    assert _one_storage(on_meta.to_empty(device="cpu"))


def test_the_kept_last_call_is_not_copied_nor_kept_past_new_weights(tmp_path):
    """The module's memo of its last call (see FusedGeGLUMLP.forward) holds a closure over this process's kernels and
    may hold a view of the weights: a deep copy and a pickle leave it out (both work with one there), and whatever
    gives the weights new storages (.to, which repacks them) drops it."""
    fused = fused_geglu.FusedGeGLUMLP(8, 12)
    closure = (lambda: None)
    fused.last_call = (fused.gate_proj.weight, closure)
    assert copy.deepcopy(fused).last_call is None
    torch.save(fused, tmp_path / "m.pt")
    assert torch.load(tmp_path / "m.pt", weights_only=False).last_call is None
    assert fused.last_call[1] is closure  # the original keeps its own
    fused.double()
    assert fused.last_call is None
    fused.last_call = (closure,)
    fused.up_proj.weight = nn.Parameter(torch.randn(12, 8, dtype=torch.float64))
    fused.pack_gate_up()
    assert fused.last_call is None and _one_storage(fused)


def test_weights_not_packable_are_left_as_they_are():
    """A parametrized gate weight or weights of two dtypes: nothing packed, nothing moved, and the forward is right."""
    from torch.nn.utils import parametrize

    fused = fused_geglu.FusedGeGLUMLP(8, 16)
    fused.up_proj.weight = nn.Parameter(fused.up_proj.weight.detach().double())
    ptrs = [p.data_ptr() for p in fused.parameters()]
    fused.pack_gate_up()
    assert [p.data_ptr() for p in fused.parameters()] == ptrs and not _one_storage(fused)
    fused = fused_geglu.FusedGeGLUMLP(8, 16)
    parametrize.register_parametrization(fused.gate_proj, "weight", nn.Identity())
    fused.pack_gate_up()  # finds no gate_proj.weight parameter: nothing to do
    x = torch.randn(3, 8)
    wg, wu, wd = fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight
    with torch.no_grad():
        torch.testing.assert_close(fused(x), (F.gelu(x @ wg.T, approximate="tanh") * (x @ wu.T)) @ wd.T)


@pytest.mark.parametrize("needs", ["x", "gate", "up", "down"])
def test_the_training_path_whenever_one_input_needs_a_gradient(needs, monkeypatch):
    """Grad mode on and any one of x and the three weights requiring grad: the forward takes autograd's path
    (training_mlp, whose kernels save what the backward needs); none of them, or grad mode off: it does not."""
    fused = fused_geglu.FusedGeGLUMLP(8, 16).requires_grad_(False)
    x = torch.randn(3, 8)
    tensor = {"x": x, "gate": fused.gate_proj.weight, "up": fused.up_proj.weight, "down": fused.down_proj.weight}[needs]
    calls, training = [], fused_geglu.training.training_mlp
    monkeypatch.setattr(fused_geglu.training, "training_mlp", lambda *a: calls.append(needs) or training(*a))
    tensor.requires_grad_(True)
    assert fused(x).requires_grad and calls == [needs]
    with torch.no_grad():
        fused(x)
    tensor.requires_grad_(False)
    assert not fused(x).requires_grad and calls == [needs]


def test_training_updates_the_packed_weights_in_place():
    """Each packed weight is a leaf of its own: its gradient is its own, and an optimizer's step writes into the
    shared storage, which later forwards read. Expected gradients: eager autograd on SimpleGeGLUMLP."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    torch.manual_seed(0)
    eager, fused = SimpleGeGLUMLP(8, 16), fused_geglu.FusedGeGLUMLP(8, 16)
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(5, 8)
    for m in (eager, fused):
        torch.optim.SGD(m.parameters(), lr=0.1).zero_grad()
        m(x).square().sum().backward()
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    assert _one_storage(fused)
    for (name, pe), pf in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(pf.grad, pe.grad, msg=name)
        torch.testing.assert_close(pf, pe, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), eager(x))


@pytest.mark.skipif(fused_geglu.INTERPRET or torch.cuda.is_available(), reason="CPU without the interpreter only")
def test_cpu_fallback_matches_eager():
    # Without a GPU or the interpreter the module computes the same math with PyTorch ops.
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager, fused = SimpleGeGLUMLP(24, 40), fused_geglu.FusedGeGLUMLP(24, 40)
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(3, 4, 24)
    assert fused_geglu.kernel_path(x.reshape(-1, 24), fused.gate_proj.weight, fused.up_proj.weight) == "torch"
    torch.testing.assert_close(fused(x), eager(x))


def test_compiles_without_graph_breaks_and_follows_weight_changes():
    """torch.compile(fullgraph=True) fails on any graph break: Dynamo must see the module as the two ops. The
    compiled module follows an in-place change of a weight, and its backward matches eager's."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager, fused = SimpleGeGLUMLP(16, 24), fused_geglu.FusedGeGLUMLP(16, 24)
    fused.load_state_dict(eager.state_dict())
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")  # Dynamo and AOTAutograd: the ops traced
    x = torch.randn(2, 3, 16)
    with torch.inference_mode():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), eager(x))
    with torch.no_grad():
        for module in (eager, fused):
            module.up_proj.weight.mul_(-2.0)
        torch.testing.assert_close(compiled(x), eager(x))
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(xc).square().sum().backward()
    eager(xe).square().sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    for pf, pe in zip(fused.parameters(), eager.parameters()):
        torch.testing.assert_close(pf.grad, pe.grad)


def test_forward_reads_each_weight_as_it_is_now_however_it_is_held():
    """The forward reads the weights from the submodules' parameter dicts where they are plain parameters, and through
    nn.Module's lookup otherwise: a parametrized weight is the parametrization's output, a replaced Parameter or
    submodule is the new one. Expected values: the GeGLU written out on the weights the test itself computed."""
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    class Holder(nn.Module):  # a submodule with its weight as a plain tensor attribute, not in _parameters
        def __init__(self, w):
            super().__init__()
            self.weight = w

    torch.manual_seed(0)
    fused = fused_geglu.FusedGeGLUMLP(8, 16)
    x = torch.randn(2, 3, 8)
    wg, wu, wd = (fused.gate_proj.weight.detach().clone(), fused.up_proj.weight.detach().clone(),
                  fused.down_proj.weight.detach().clone())
    expect = lambda wg, wu, wd: (F.gelu(x @ wg.T, approximate="tanh") * (x @ wu.T)) @ wd.T  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(fused(x), expect(wg, wu, wd))
        parametrize.register_parametrization(fused.gate_proj, "weight", Doubled())
        torch.testing.assert_close(fused(x), expect(2 * wg, wu, wd))
        fused.up_proj.weight = nn.Parameter(-wu)
        torch.testing.assert_close(fused(x), expect(2 * wg, -wu, wd))
        fused.down_proj = Holder(3 * wd)
        torch.testing.assert_close(fused(x), expect(2 * wg, -wu, 3 * wd))


def test_weights_made_in_inference_mode_work():
    """Inference tensors have no version counter; nothing here needs one (no cached copy of the weights)."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")
        eager, fused = SimpleGeGLUMLP(8, 16), fused_geglu.FusedGeGLUMLP(8, 16)
        fused.load_state_dict(eager.state_dict())
        x = torch.randn(3, 8)
        for _ in range(2):
            torch.testing.assert_close(fused(x), eager(x))


def test_bad_shapes_are_one_clear_error():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="expects"):
        fused_geglu.geglu(x, torch.randn(6, 9), torch.randn(6, 9))
    with pytest.raises(ValueError, match="differ"):
        fused_geglu.geglu(x, torch.randn(6, 8), torch.randn(5, 8))


# ---- GPU: the compiled kernels (TMA on Hopper, pointer everywhere) --------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _nan_outputs(monkeypatch):
    """The kernel's output buffer (geglu's torch.empty) starts as NaN: any element it fails to write shows.

    Filling freed memory is not enough: outputs under 1 MB come from PyTorch's small-block pool, not from it."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))


def _check_gpu(M, K, N, dt, use_tma, tol):
    x = torch.randn(M, K, device="cuda").to(DTYPES[dt])
    wg, wu = (torch.randn(N, K, device="cuda").div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
    ref = F.gelu(x.float() @ wg.float().T, approximate="tanh") * (x.float() @ wu.float().T)
    with pytest.MonkeyPatch.context() as mp:
        _nan_outputs(mp)
        m = fused_geglu.geglu(x, wg, wu, use_tma=use_tma)
    assert fused_geglu.kernel_path(x, wg, wu, use_tma) == ("tma" if use_tma else "pointer")
    assert m.shape == (M, N) and torch.isfinite(m).all()
    err = ((m.float() - ref).norm() / ref.norm()).item()
    assert err < tol, err
    # Element by element, so one wrong edge row or column cannot hide in the norm of millions of right ones.
    scale = ref.abs().max().item()
    torch.testing.assert_close(m.float(), ref, rtol=2 * tol, atol=tol * scale)
    for rows in (m[-1:], m[:, -1:]):  # the last row and column: partial tiles
        edge_ref = ref[-1:] if rows.shape[0] == 1 else ref[:, -1:]
        torch.testing.assert_close(rows.float(), edge_ref, rtol=2 * tol, atol=tol * scale)


def _has_tma():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@cuda
@pytest.mark.parametrize("recompute", [False, True])
def test_gpu_no_tokens_give_an_empty_output(recompute):
    _check_no_tokens("cuda", recompute)


@cuda
@pytest.mark.parametrize("shape", [(8192, 768, 3072), (2048, 768, 3072), (8192, 4096, 14336)])
@pytest.mark.parametrize("use_tma", [True, False])
def test_gpu_bench_shapes_bf16(shape, use_tma):
    if use_tma and not _has_tma():
        pytest.skip("TMA needs compute capability 9.0+")
    _check_gpu(*shape, "bf16", use_tma, TOL["bf16"])


@cuda
@pytest.mark.parametrize("shape", [(37, 40, 72), (1000, 136, 200), (4097, 768, 3080), (33, 41, 57), (1000, 770, 3001)])
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_gpu_irregular_shapes(shape, dt):
    _check_gpu(*shape, dt, use_tma=False, tol=TOL[dt])
    if _has_tma() and shape[1] % 8 == 0 and shape[2] % 8 == 0:
        _check_gpu(*shape, dt, use_tma=True, tol=TOL[dt])


@cuda
@pytest.mark.parametrize("shape", [(8192, 768, 3072), (1000, 136, 200), (4097, 768, 3080), (37, 40, 72)])
@pytest.mark.parametrize("use_tma", [True, False])
def test_gpu_training_forward_stores_g_and_u(shape, use_tma):
    """SAVE_GU: g and u as stored equal x @ W^T (fp64 here) within bf16's rounding, every element (the outputs start
    as NaN: one left unwritten shows); m as inference's kernel gives it."""
    if use_tma and not _has_tma():
        pytest.skip("TMA needs compute capability 9.0+")
    M, K, N = shape
    x = torch.randn(M, K, device="cuda").bfloat16()
    wg, wu = (torch.randn(N, K, device="cuda").div(K ** 0.5).bfloat16() for _ in range(2))
    with pytest.MonkeyPatch.context() as mp:
        _nan_outputs(mp)
        m, g, u = fused_geglu.geglu_saving_gu(x, wg, wu, use_tma=use_tma)
    assert fused_geglu.kernel_path(x, wg, wu, use_tma) == ("tma" if use_tma else "pointer")
    for got, w in ((g, wg), (u, wu)):
        ref = x.double() @ w.double().T
        # bf16 keeps 8 significant bits: rounding moves a value by at most 2^-8 of itself; 1e-4 for the fp32 sums
        assert got.dtype == torch.bfloat16 and ((got.double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-4).all()
    torch.testing.assert_close(m, fused_geglu.geglu(x, wg, wu, use_tma=use_tma))


@cuda
def test_gpu_module_matches_eager():
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(768, 3072).cuda().bfloat16()
    fused = fused_geglu.FusedGeGLUMLP(768, 3072).cuda().bfloat16()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(4, 128, 768, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        y, y_eager = fused(x), eager(x)
    assert y.shape == y_eager.shape
    assert ((y.float() - y_eager.float()).norm() / y_eager.float().norm()).item() < 2e-2


@cuda
@pytest.mark.parametrize("M", [1, 7, 16, 64, 100, 128])
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])  # fp32 tiles need twice the shared memory
def test_gpu_small_m_odd_shapes(M, dt):
    # dim 770 and hidden 3001: no tile divides them; down_proj (N = 770) splits K.
    K, N = 770, 3001
    x = torch.randn(M, K, device="cuda").to(DTYPES[dt])
    wg, wu = (torch.randn(N, K, device="cuda").div(K ** 0.5).to(DTYPES[dt]) for _ in range(2))
    wd = torch.randn(K, N, device="cuda").div(N ** 0.5).to(DTYPES[dt])
    # The small-M kernels asked for by name: the tuned table may send these M elsewhere (K = 770 rules out TMA).
    down_cfg = fused_geglu.small_m_config(M, "down") or fused_geglu.SMALL_M_CONFIGS["down"][-1][1]
    ref = F.gelu(x.float() @ wg.float().T, approximate="tanh") * (x.float() @ wu.float().T)
    with pytest.MonkeyPatch.context() as mp:
        _nan_outputs(mp)  # an element a kernel leaves unwritten stays NaN
        m = fused_geglu.geglu(x, wg, wu, kernel="small")
        y = fused_geglu.down_proj(m, wd, config=down_cfg)
        by_table = fused_geglu.geglu(x, wg, wu)  # whatever kernel the table picks gives the same math
    y_ref = m.float() @ wd.float().T
    assert torch.isfinite(m).all() and torch.isfinite(y).all() and torch.isfinite(by_table).all()
    assert ((m.float() - ref).norm() / ref.norm()).item() < TOL[dt]
    assert ((by_table.float() - ref).norm() / ref.norm()).item() < TOL[dt]
    assert ((y.float() - y_ref).norm() / y_ref.norm()).item() < TOL[dt]
    # Split-K sums its partials in a fixed order: the same bits on every launch.
    assert torch.equal(fused_geglu.down_proj(m, wd, config=down_cfg), y)
    assert torch.equal(fused_geglu.geglu(x, wg, wu, kernel="small"), m)


def _stand_in_triton(monkeypatch, compiles, launches, max_shared=227 * 1024, stage_bytes=1024):
    """A stand-in kernel for launcher.launch: each compile and launch is recorded; a compile's shared memory is
    num_stages * stage_bytes, against a GPU with max_shared bytes."""
    class Compiled:
        def __init__(self, spec, shared):
            self.spec = spec
            self.metadata = type("Metadata", (), {"shared": shared})

        def __getitem__(self, grid):
            return lambda *args, stream: launches.append((self.spec, grid, args, stream))

    class Kernel:
        arg_names = ["x_ptr", "n", "BLOCK", "FLAG"]

        def warmup(self, *args, grid, **meta):
            compiles.append((args, grid, meta))
            return Compiled(len(compiles), meta.get("num_stages", 1) * stage_bytes)

    class Driver:
        utils = type("Utils", (), {"get_device_properties": staticmethod(lambda d: {"max_shared_mem": max_shared})})

        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 1234

    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "driver", lambda: Driver())
    monkeypatch.setattr(fused_geglu.launcher, "compiled_kernels", {})
    return Kernel()


def test_launch_reuses_a_compiled_kernel_only_for_the_same_specialisation(monkeypatch):
    """launcher.launch compiles once per argument signature and launches the compiled kernel itself; a tensor of another
    dtype or 16-byte alignment, another integer or constexpr gets its own compile (a stand-in for Triton here)."""
    compiles, launches = [], []

    kernel, buf = _stand_in_triton(monkeypatch, compiles, launches), torch.zeros(64, dtype=torch.float16)
    x, y = buf[:32], buf[16:48]  # both 16-byte aligned (32 bytes apart)
    fused_geglu.launcher.launch(kernel, (3,), (x, 32), FLAG=True, BLOCK=16, num_warps=4)
    fused_geglu.launcher.launch(kernel, (5, 2), (y, 32), FLAG=True, BLOCK=16, num_warps=4)  # same signature
    assert len(compiles) == 1
    # The constexprs go in the kernel's parameter order whatever the keyword order; the grid is padded to 3.
    assert launches[0] == (1, (3, 1, 1), (x, 32, 16, True), 1234) and launches[1][:2] == (1, (5, 2, 1))
    assert launches[1][2][0] is y
    for args, meta in [((buf[1:33], 32), {}),  # 2 bytes off: not 16-byte aligned
                       ((buf.float()[:32], 32), {}),  # another dtype
                       ((x, 33), {}),  # another integer
                       ((x, 32), {"BLOCK": 32})]:  # another constexpr
        fused_geglu.launcher.launch(kernel, (3,), args, **{"FLAG": True, "BLOCK": 16, "num_warps": 4, **meta})
        assert launches[-1][0] == len(compiles), args
    assert len(compiles) == 5


def test_launch_drops_stages_until_the_pipeline_fits_the_gpu(monkeypatch):
    """A config sized for a Hopper GPU's shared memory still runs where there is less (fp32 tiles, a desktop
    GPU): one stage fewer per compile until it fits, compiled once for that argument signature."""
    compiles, launches = [], []
    kernel = _stand_in_triton(monkeypatch, compiles, launches, max_shared=100 * 1024, stage_bytes=36 * 1024)
    x = torch.zeros(32, dtype=torch.float16)
    for _ in range(2):
        fused_geglu.launcher.launch(kernel, (3,), (x, 32), FLAG=True, BLOCK=16, num_warps=4, num_stages=4)
    assert [meta["num_stages"] for _, _, meta in compiles] == [4, 3, 2]  # 144, 108, then 72 KB of 100
    assert [spec for spec, *_ in launches] == [3, 3]
    # Nothing fits: stop at one stage (Triton's own launch then says out of resources).
    compiles.clear()
    kernel = _stand_in_triton(monkeypatch, compiles, launches, max_shared=10, stage_bytes=36 * 1024)
    fused_geglu.launcher.launch(kernel, (3,), (x, 32), FLAG=True, BLOCK=16, num_warps=4, num_stages=2)
    assert [meta["num_stages"] for _, _, meta in compiles] == [2, 1]
    # Fits at once: one compile, the stages asked for.
    compiles.clear()
    kernel = _stand_in_triton(monkeypatch, compiles, launches)
    fused_geglu.launcher.launch(kernel, (3,), (x, 32), FLAG=True, BLOCK=16, num_warps=4, num_stages=3)
    assert [meta["num_stages"] for _, _, meta in compiles] == [3]


def test_small_m_config_by_tokens(monkeypatch):
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)  # the GPU's table
    cfg = fused_geglu.small_m_config
    assert cfg(1)["BM"] == 16 and cfg(16) is cfg(1) and cfg(17) is cfg(64) and cfg(64)["BM"] == 64
    assert cfg(128)["BM"] == 128 and cfg(129) is None
    assert cfg(16, "down")["BM"] == 16 and cfg(64, "down")["BM"] == 64 and cfg(65, "down") is None
    # The decode bucket's gate/up tile: three programs per SM on a Hopper GPU (228 KB), each holding
    # num_stages - 1 bf16 buffers of the x, gate and up tiles (Triton's pipeline).
    c = cfg(1)
    stage_bytes = (c["BM"] + 2 * c["BN"]) * c["BK"] * 2
    assert 3 * (c["num_stages"] - 1) * stage_bytes <= 228 * 1024


def test_split_k_workspace_keeps_little_and_what_a_graph_may_hold(monkeypatch):
    monkeypatch.setattr(fused_geglu.launcher, "workspaces", {})
    monkeypatch.setattr(fused_geglu.launcher, "outgrown", [])
    cpu, kept = torch.device("cpu"), fused_geglu.KEPT_PARTIALS
    part, counters = fused_geglu.launcher.split_k_workspace(cpu, 7, 10, 10)
    assert part.numel() == kept and not counters.any()
    assert (part.numel() * 4 + counters.numel() * 4) < 1 << 20  # what stays held: under 1 MB
    again = fused_geglu.launcher.split_k_workspace(cpu, 7, kept, 100)  # room enough: the same tensors
    assert again[0] is part and again[1] is counters
    assert fused_geglu.launcher.split_k_workspace(cpu, 8, 10, 10)[0] is not part  # another stream: its own
    more = fused_geglu.launcher.split_k_workspace(cpu, 7, kept + 1, 10)  # more partials: for this call only
    assert more[0].numel() == kept + 1 and more[1] is counters
    assert fused_geglu.launcher.split_k_workspace(cpu, 7, 10, 10)[0] is part
    grown = fused_geglu.launcher.split_k_workspace(cpu, 7, 10, counters.numel() + 1)  # more tiles: new counters
    assert grown[1].numel() > counters.numel() and not grown[1].any()
    assert fused_geglu.launcher.outgrown == [(part, counters)]  # still alive: a CUDA graph may have recorded them


@cuda
@pytest.mark.parametrize("M, use_tma", [(16, None), (4096, False), (4096, True)])
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_gpu_epilogue_is_gelu_tanh_over_its_whole_range(M, use_tma, dt):
    """m = gelu_tanh(g) * 1 for g from -12 to 12, elementwise, on each path (bf16 takes the hardware tanh):
    within the output's rounding where gelu is large, and far below it where gelu is near zero."""
    if use_tma and not _has_tma():
        pytest.skip("TMA needs compute capability 9.0+")
    K, N = 16, 64
    g = torch.linspace(-12, 12, M, device="cuda")
    x = torch.zeros(M, K, device="cuda")
    x[:, 0], x[:, 1] = g, 1.0
    w_gate, w_up = torch.zeros(N, K, device="cuda"), torch.zeros(N, K, device="cuda")
    w_gate[:, 0], w_up[:, 1] = 1.0, 1.0  # every column: g = x[:, 0], u = 1
    x, w_gate, w_up = x.to(DTYPES[dt]), w_gate.to(DTYPES[dt]), w_up.to(DTYPES[dt])
    g = x[:, 0].float()[:, None]  # g as the kernel sees it
    m = fused_geglu.geglu(x, w_gate, w_up, use_tma=use_tma).float()
    ref = F.gelu(g, approximate="tanh").expand(M, N)
    unit = 2.0 ** -8 if dt == "bf16" else 2.0 ** -11
    assert ((m - ref).abs() <= unit * ref.abs() + 2.0 ** -11 * g.abs()).all(), (m - ref).abs().max()


@cuda
def test_gpu_misaligned_input_after_an_aligned_one():
    """The small-M kernels compiled for 16-byte aligned pointers must not serve a misaligned x of the same shape."""
    K, N = 4096, 1024
    wg, wu = (torch.randn(N, K, device="cuda").div(K ** 0.5).bfloat16() for _ in range(2))
    buf = torch.randn(2 * K + 1, device="cuda").bfloat16()
    for x in (buf[:K].view(1, K), buf[1:K + 1].view(1, K)):  # the second one starts 2 bytes off
        ref = F.gelu(x.float() @ wg.float().T, approximate="tanh") * (x.float() @ wu.float().T)
        m = fused_geglu.geglu(x, wg, wu)
        assert ((m.float() - ref).norm() / ref.norm()).item() < TOL["bf16"], x.data_ptr() % 16


@cuda
@pytest.mark.parametrize("M", [1, 64])
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_gpu_decode_module_matches_eager(M, dt):
    # A Llama-2-7B MLP at decode: both small-M kernels, against the eager module's output.
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(4096, 11008).cuda().to(DTYPES[dt])
    fused = fused_geglu.FusedGeGLUMLP(4096, 11008).cuda().to(DTYPES[dt])
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(M, 4096, device="cuda", dtype=DTYPES[dt])
    with torch.inference_mode():
        y, y_eager = fused(x), eager(x)
    # fp32: eager's cuBLAS may use tf32 or not; the kernels use full fp32 dots.
    assert ((y.float() - y_eager.float()).norm() / y_eager.float().norm()).item() < (2e-2 if dt == "bf16" else 1e-4)


@cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_decode_module_under_compile_runs_the_fused_kernels(mode):
    """Compiled, and replayed as a CUDA graph, a decode step runs the two small-M Triton kernels, once each."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused = fused_geglu.FusedGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused.load_state_dict(eager.state_dict())
    compiled = torch.compile(fused, mode=mode, fullgraph=True)
    x = torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(3):  # compile, then (reduce-overhead) warm up and record the graph
            y = compiled(x).clone()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y = compiled(x).clone()
            torch.cuda.synchronize()
        y_eager = eager(x)
    assert ((y.float() - y_eager.float()).norm() / y_eager.float().norm()).item() < 2e-2
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # Inductor launches them from its own code, under numbered names (_geglu_small_m_kernel_0).
    for name in ("_geglu_small_m_kernel", "_linear_small_m_kernel"):
        assert sum(re.fullmatch(name + r"(_\d+)?", k) is not None for k in kernels) == 1, kernels


@cuda
@pytest.mark.skipif(not _has_tma(), reason="needs compute capability 9.0+ (Hopper): the TMA kernel's GPUs")
def test_gpu_hopper_takes_the_tma_kernel():
    """No silent fall back: on sm_90 the module's default path is the TMA kernel, and the trace shows it run."""
    fused = fused_geglu.FusedGeGLUMLP(768, 3072).cuda().bfloat16()
    x = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16)
    assert fused_geglu.kernel_path(x, fused.gate_proj.weight, fused.up_proj.weight) == "tma"
    with torch.inference_mode():
        fused(x)  # compile outside the profiled call
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fused(x)
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert "_geglu_tma_kernel" in kernels and "_geglu_pointer_kernel" not in kernels, kernels


@cuda
@pytest.mark.parametrize("M", [1, 64, 1000, 4096])
def test_gpu_first_forward_holds_no_copy_of_the_weights(M):
    """Gemma-2B's MLP (201 MB of weights): after the first forward, memory held beyond the parameters, the input
    and the output is under 1 MB (no packed copy of the gate and up weights; the split-K workspace is small)."""
    fused = fused_geglu.FusedGeGLUMLP(2048, 16384).cuda().bfloat16()
    x = torch.randn(M, 2048, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.inference_mode():
        y = fused(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    assert held < 1 << 20, f"{held / 1e6:.1f} MB held after the first forward at M = {M}"


@cuda
@pytest.mark.parametrize("M, show_the_kernel", [(1, False), (4096, True), (4096, False)])
def test_gpu_compiled_model_launches_the_kernels_from_inductor(M, show_the_kernel, monkeypatch):
    """Under torch.compile the kernels are in Inductor's graph (triton_op + wrap_triton): once compiled, a call runs
    no Python of fused_geglu (no launch), yet the trace shows the fused kernel. Where the tuned table wants the TMA
    kernel (M = 4096), which a graph cannot hold, the module's graph runs cuBLAS and one GeGLU kernel of Inductor's
    instead; 04_fused_mlp.py's show_the_kernel gets the pointer kernel there."""
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", not show_the_kernel)
    torch._dynamo.reset()
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused = fused_geglu.FusedGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused.load_state_dict(eager.state_dict())
    compiled = torch.compile(fused, fullgraph=True)
    x = torch.randn(M, 2048, device="cuda", dtype=torch.bfloat16)
    launches = []
    launch = fused_geglu.launcher.launch
    monkeypatch.setattr(fused_geglu.launcher, "launch", lambda *a, **k: launches.append(a[0]) or launch(*a, **k))
    with torch.inference_mode():
        compiled(x)  # compiles: the ops' bodies are traced, which goes through launcher.launch
        torch.cuda.synchronize()
        launches.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y = compiled(x)
            torch.cuda.synchronize()
        y_eager = eager(x)
    assert launches == [], "the compiled call went through fused_geglu's Python launcher"
    assert ((y.float() - y_eager.float()).norm() / y_eager.float().norm()).item() < 2e-2
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    wants_tma = M > 32 and fused_geglu.kernel_path(x, fused.gate_proj.weight, fused.up_proj.weight) == "tma"
    if wants_tma and not show_the_kernel:
        assert not any(k.startswith("_geglu_") for k in kernels), kernels
        assert [k.startswith("triton_") for k in kernels if "gelu" in k] == [True], kernels  # gelu and mul: one
    else:
        assert any(k.startswith("_geglu_") for k in kernels), kernels


@cuda
def test_gpu_cuda_graph_capture_of_the_eager_module():
    """The eager module captured in a CUDA graph by hand (torch.cuda.graph): replays give eager's output."""
    SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
    eager = SimpleGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused = fused_geglu.FusedGeGLUMLP(2048, 8192).cuda().bfloat16()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        fused(x)  # compile the kernels and make the split-K workspace outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fused(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        y_eager = eager(x)
    assert ((y.float() - y_eager.float()).norm() / y_eager.float().norm()).item() < 2e-2



def _cublas_everywhere(device, which):
    """table.tuned_rows of a table that runs cuBLAS for gate and up at every M (and has no packing rows: packed)."""
    return None if which == "packing" else [(None, None, "torch", None)]


@cuda
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
def test_gpu_the_torch_bucket_is_cublas_and_one_geglu_kernel(dt, monkeypatch):
    """Where the table runs cuBLAS (here at every M), the GeGLU of the two GEMMs' outputs is one kernel of ours, not
    PyTorch's GeLU and mul: the reference's values, g and u returned where saved, the launch kept per shape, and
    without g and u to save, m written over g."""
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", _cublas_everywhere)
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})  # none kept from the real table's choices
    torch.manual_seed(0)
    M, K, N = 300, 256, 1000  # M * N: no whole number of blocks
    x, wg, wu = (torch.randn(*shape, device="cuda").div(K ** 0.5).to(DTYPES[dt]) for shape in ((M, K), (N, K), (N, K)))
    g_ref, u_ref = x.double() @ wg.double().T, x.double() @ wu.double().T
    m_ref = F.gelu(g_ref, approximate="tanh") * u_ref
    tol = max(TOL[dt], 1e-4)  # fp32 GEMMs may use TF32
    fused_geglu.geglu(x, wg, wu)  # plans both keys first
    fused_geglu.geglu_saving_gu(x, wg, wu)
    # Without g and u to save, m is written over g: at the peak, what the two GEMMs alone hold (g, u and any
    # workspace of theirs), not a third [M, N] tensor.
    def peak(fn):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, out
    gemms, _ = peak(lambda: (F.linear(x, wg), F.linear(x, wu)))
    geglu_peak, m = peak(lambda: fused_geglu.geglu(x, wg, wu))
    assert geglu_peak <= gemms and gemms >= 2 * M * N * x.element_size(), (dt, geglu_peak, gemms)
    launched = []
    launch_ = fused_geglu.launcher.launch
    monkeypatch.setattr(fused_geglu.launcher, "launch", lambda *a, **k: launched.append(a) or launch_(*a, **k))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        m = fused_geglu.geglu(x, wg, wu)
        m2, g, u = fused_geglu.geglu_saving_gu(x, wg, wu)
        torch.cuda.synchronize()
    for got, want in ((m, m_ref), (m2, m_ref), (g, g_ref), (u, u_ref)):
        assert got.dtype == DTYPES[dt] and ((got.double() - want).norm() / want.norm()).item() < tol
    assert launched == [], "the pointwise launch was planned again"
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels.count("_geglu_pointwise_kernel") == 2, kernels
    assert not any("Gelu" in k or "Mul" in k for k in kernels), kernels  # no PyTorch GeLU, no mul


@cuda
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
def test_gpu_packed_weights_run_gate_and_up_as_one_gemm(dt, monkeypatch):
    """Where the table runs cuBLAS (here at every M), the module's packed gate and up weights are one GEMM of
    [tokens, 2 * hidden], then _geglu_packed_kernel over its rows, then down_proj's GEMM reading m where it is (row
    stride 2 * hidden, no copy): eager's values at shapes no block divides, with any leading shape, planned once.
    Weights no longer packed (one replaced), or adjacent only by chance (two storages, which no view spans), take
    the two GEMMs again. Expected values: the MLP written out in fp64 on the module's weights."""
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", _cublas_everywhere)
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})
    torch.manual_seed(0)
    K, N = 136, 1000  # 300 * 1000: no whole number of blocks; 136: no whole number of K tiles
    fused = fused_geglu.FusedGeGLUMLP(K, N).cuda().to(DTYPES[dt])
    assert _one_storage(fused)
    linears = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, *a: linears.append((tuple(w.shape), x.stride())) or linear(x, w, *a))

    def check(x):
        wg, wu, wd = (w.detach().double() for w in (fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight))
        ref = (F.gelu(x.double() @ wg.T, approximate="tanh") * (x.double() @ wu.T)) @ wd.T
        linears.clear()
        with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y = fused(x)
            torch.cuda.synchronize()
        assert y.shape == (*x.shape[:-1], K) and y.dtype == x.dtype
        assert ((y.double() - ref).norm() / ref.norm()).item() < max(TOL[dt], 1e-4)  # fp32 GEMMs may use TF32
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    planned, plan_ = [], fused_geglu.table.plan
    for i, shape in enumerate(((300, K), (2, 150, K), (300, K))):  # the last: the first shape's kept plan
        if i == 2:
            monkeypatch.setattr(fused_geglu.table, "plan", lambda *a, **k: planned.append(a) or plan_(*a, **k))
        x = torch.randn(*shape, device="cuda").to(DTYPES[dt])
        kernels = check(x)
        m_stride = (2 * N, 1) if x.dim() == 2 else (150 * 2 * N, 2 * N, 1)  # m: the first half of each row of gu
        assert linears == [((2 * N, K), x.stride()), ((K, N), m_stride)], linears
        assert kernels.count("_geglu_packed_kernel") == 1 and "_geglu_pointwise_kernel" not in kernels, kernels
        assert not any(w in k.lower() for k in kernels for w in ("gelu", "copy", "elementwise")), kernels
    assert planned == [], "the kept plan was worked out again"
    fused.up_proj.weight = nn.Parameter(fused.up_proj.weight.detach().clone())  # no longer packed
    kernels = check(torch.randn(300, K, device="cuda").to(DTYPES[dt]))
    assert [w for w, _ in linears] == [(N, K), (N, K), (K, N)] and "_geglu_pointwise_kernel" in kernels, kernels
    # Adjacent by chance: two storages over consecutive memory (held by `both`), which no one view spans.
    both = torch.randn(2 * N, K, device="cuda").div(K ** 0.5).to(DTYPES[dt])
    nbytes = N * K * both.element_size()
    for i, proj in enumerate((fused.gate_proj, fused.up_proj)):
        storage = torch._C._construct_storage_from_data_pointer(both.data_ptr() + i * nbytes, both.device, nbytes)
        proj.weight = nn.Parameter(torch.empty(0, device="cuda", dtype=both.dtype).set_(storage, 0, (N, K), (K, 1)))
    assert fused_geglu.packed(fused.gate_proj.weight, fused.up_proj.weight) and not _one_storage(fused)
    check(torch.randn(300, K, device="cuda").to(DTYPES[dt]))
    assert [w for w, _ in linears] == [(N, K), (N, K), (K, N)], linears
    # Packed again, where the table's packing rows say two GEMMs (at 257..512 tokens here): the two GEMMs.
    fused.pack_gate_up()
    assert _one_storage(fused)
    packing = [(256, None, True), (512, None, False), (None, None, True)]
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", lambda device, which: packing if which == "packing"
                        else _cublas_everywhere(device, which))
    fused_geglu.launcher.plans.clear()  # plans are kept per shape, made under the table of their first call
    for M, gemms in ((256, [(2 * N, K), (K, N)]), (300, [(N, K), (N, K), (K, N)]), (513, [(2 * N, K), (K, N)])):
        kernels = check(torch.randn(M, K, device="cuda").to(DTYPES[dt]))
        assert [w for w, _ in linears] == gemms, (M, linears)
        assert ("_geglu_pointwise_kernel" in kernels) == (len(gemms) == 3), (M, kernels)


@cuda
@pytest.mark.parametrize("M", [1, 300])
def test_gpu_a_call_like_the_modules_last_takes_its_plan_without_a_key(M, monkeypatch):
    """The eager module keeps what its last planned call was like: a call like it (x's shape, dtype and device, the
    current device and stream, the globals, weights at the same addresses and shapes) runs that call's plan and
    builds no plan key; a call that differs in any of these builds the key again. Every output is right, on the
    weights as they are now. M = 300 runs the packed plan (the table says cuBLAS at every M here), M = 1 the
    small-M kernels. Expected values: the MLP in fp64 on the module's weights."""
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})
    if M > 1:
        monkeypatch.setattr(fused_geglu.table, "tuned_rows", _cublas_everywhere)
    torch.manual_seed(0)
    K, N = 136, 1000
    fused = fused_geglu.FusedGeGLUMLP(K, N).cuda().bfloat16()
    keys, key_ = [], fused_geglu.launcher.plan_key
    monkeypatch.setattr(fused_geglu.launcher, "plan_key", lambda *a: keys.append(a[0]) or key_(*a))
    new = lambda *shape: torch.randn(*shape, device="cuda").bfloat16()  # noqa: E731

    def keyed(x):
        """Whether fused(x) built a plan key; its output checked."""
        wg, wu, wd = (w.detach().double() for w in (fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight))
        ref = (F.gelu(x.double() @ wg.T, approximate="tanh") * (x.double() @ wu.T)) @ wd.T
        keys.clear()
        with torch.inference_mode():
            y = fused(x)
        assert y.shape == (*x.shape[:-1], K)
        assert ((y.double() - ref).norm() / ref.norm()).item() < TOL["bf16"]
        return bool(keys)

    assert keyed(new(M, K)) and not keyed(new(M, K))  # planned, then taken
    assert keyed(new(1, M, K)) and not keyed(new(1, M, K))  # another leading shape
    assert keyed(new(M + 1, K)) and not keyed(new(M + 1, K))
    with torch.no_grad():
        fused.gate_proj.weight.mul_(-1)  # changed in place: read as it is now
    assert not keyed(new(M + 1, K))
    misaligned = new(M + 1, K + 1).view(-1)[1:(M + 1) * K + 1].view(M + 1, K)  # 2 bytes off
    assert keyed(misaligned) and keyed(misaligned)  # planned at each call; the kept one stays
    assert keyed(new(M + 1, 2 * K)[:, ::2]) and not keyed(new(M + 1, K))  # a strided x: the same
    with torch.cuda.stream(torch.cuda.Stream()):
        assert keyed(new(M + 1, K)) and not keyed(new(M + 1, K))
        torch.cuda.current_stream().synchronize()
    assert keyed(new(M + 1, K))  # the default stream again
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", not fused_geglu.table.TORCH_WHERE_FASTER)
    assert keyed(new(M + 1, K)) and not keyed(new(M + 1, K))
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})  # plans dropped: not kept by the module either
    assert keyed(new(M + 1, K))
    fused.up_proj.weight = nn.Parameter(fused.up_proj.weight.detach().clone())  # another weight, not packed
    assert keyed(new(M + 1, K)) and not keyed(new(M + 1, K))
    fused.half()
    assert keyed(new(M + 1, K).half()) and not keyed(new(M + 1, K).half())
    # The rest of the signature, one field at a time: weights of another shape at the same address (refused by the
    # plan's checks, not run by the kept plan), another tensor type, another dtype (refused too).
    x = new(M + 1, K).half()
    assert not keyed(x)

    def refused(x):
        keys.clear()
        with torch.inference_mode(), pytest.raises((ValueError, RuntimeError)):
            fused(x)
        return bool(keys)

    for proj, shape in ((fused.gate_proj, (N // 2, 2 * K)), (fused.up_proj, (N // 2, 2 * K)),
                        (fused.down_proj, (2 * K, N // 2))):
        weight = proj.weight.data
        proj.weight.data = weight.view(shape)
        assert refused(x)
        proj.weight.data = weight
    assert not keyed(x)  # the kept call again
    assert keyed(nn.Parameter(x, requires_grad=False)) and not keyed(x)
    assert refused(x.bfloat16()) and not keyed(x)
    wg, wu, wd = fused.gate_proj.weight, fused.up_proj.weight, fused.down_proj.weight
    # Grad mode on: weights that need no grad still take the kept plan; weights that do go to autograd's path.
    fused.requires_grad_(False)
    with torch.enable_grad():
        keys.clear()
        y = fused(x)
        assert not keys and not y.requires_grad
        fused.requires_grad_(True)
        y = fused(x)  # the training path: its GeGLU saves g and u, under a key of its own
    ref = (F.gelu(x.double() @ wg.detach().double().T, approximate="tanh") * (x.double() @ wu.detach().double().T)) \
        @ wd.detach().double().T
    assert keys == [("geglu", True, "gelu_tanh")] and y.grad_fn is not None
    assert ((y.double() - ref).norm() / ref.norm()).item() < TOL["fp16"]


@cuda
@pytest.mark.parametrize("M", [1, 5, 20, 64, 256, 300, 4096])
@pytest.mark.parametrize("save_gu", [False, True])
def test_gpu_a_kept_plan_launches_on_each_calls_own_tensors(M, save_gu, monkeypatch):
    """Eager calls keep their plan per shape, dtype, device and stream: the second call of a shape plans nothing and
    builds no launch key, yet computes on its own x and weights (new ones, and ones changed in place), on whichever
    kernel the table picks at this M (small with and without split-K, TMA, cuBLAS + PyTorch)."""
    K, N, dim = 512, 1536, 512
    new = lambda *shape: torch.randn(*shape, device="cuda").div(shape[-1] ** 0.5).bfloat16()  # noqa: E731
    run = fused_geglu.geglu_saving_gu if save_gu else fused_geglu.geglu

    def check(x, wg, wu, wd):
        g, u = x.float() @ wg.float().T, x.float() @ wu.float().T
        m_ref = F.gelu(g, approximate="tanh") * u
        out = run(x, wg, wu)
        m = out[0] if save_gu else out
        for got, ref in ((m, m_ref), *(zip(out[1:], (g, u)) if save_gu else ())):
            assert ((got.float() - ref).norm() / ref.norm()).item() < TOL["bf16"]
        y = fused_geglu.down_proj(m, wd)
        y_ref = m.float() @ wd.float().T
        assert ((y.float() - y_ref).norm() / y_ref.norm()).item() < TOL["bf16"]
        y_mlp, y_ref = fused_geglu.mlp(x, wg, wu, wd), m_ref @ wd.float().T  # the module's eager forward, one plan
        assert ((y_mlp.float() - y_ref).norm() / y_ref.norm()).item() < TOL["bf16"]
        if x.is_contiguous():  # the module passes x as it comes: a plan of its own per leading shape, the same rows
            for shape, out_shape in [((1, M, K), (1, M, dim)), ((M, 1, K), (M, 1, dim))] + [((K,), (dim,))] * (M == 1):
                y_nd = fused_geglu.mlp(x.view(shape), wg, wu, wd)
                assert y_nd.shape == out_shape
                assert ((y_nd.float().reshape(M, dim) - y_ref).norm() / y_ref.norm()).item() < TOL["bf16"]

    def gate_up():  # two weights 8 rows apart in one allocation: never packed (fused_geglu.packed), which is part
        both = new(2 * N + 8, K)  # of mlp's plan key; apart, two allocations are adjacent by chance at times
        return both[:N], both[N + 8:]

    (wg, wu), wd = gate_up(), new(dim, N)
    check(new(M, K), wg, wu, wd)  # the first call of this key plans
    planned, launched = [], []
    plan_, launch_ = fused_geglu.table.plan, fused_geglu.launcher.launch
    monkeypatch.setattr(fused_geglu.table, "plan", lambda *a, **k: planned.append(a) or plan_(*a, **k))
    monkeypatch.setattr(fused_geglu.launcher, "launch", lambda *a, **k: launched.append(a) or launch_(*a, **k))
    check(new(M, K), wg, wu, wd)  # a new x
    wg.copy_(new(N, K))  # a weight changed in place: read as it is now
    check(new(M, K), wg, wu, wd)
    check(new(M, K), *gate_up(), new(dim, N))  # another module's weights of the same shapes
    assert planned == [] and launched == [], "a kept plan was worked out again"
    with torch.cuda.stream(torch.cuda.Stream()):  # another stream: a plan of its own, right there too
        check(new(M, K), wg, wu, wd)
        torch.cuda.current_stream().synchronize()
    assert planned
    x = new(M, 2 * K)[:, ::2]  # not contiguous: planned at each call, and right
    planned.clear()
    check(x, wg, wu, wd)
    check(x, wg, wu, wd)
    assert len(planned) == 4  # geglu's and mlp's, twice


def test_an_empty_hook_chain_is_no_launch_hook(monkeypatch):
    """Triton's launch-hook knobs are HookChains (never None) since 3.5: kept plans skip the runner while both chains
    are empty, not while the knobs merely exist; a hook added to either, or set as a plain function, turns that off."""
    triton = pytest.importorskip("triton")
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs, "HookChain"):
        pytest.skip("this Triton has no HookChain")
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", knobs.HookChain())
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", knobs.HookChain(reversed=True))
    assert not fused_geglu.launcher.launch_hooked()
    knobs.runtime.launch_exit_hook.add(print)
    assert fused_geglu.launcher.launch_hooked()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", None)
    assert not fused_geglu.launcher.launch_hooked()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)
    assert fused_geglu.launcher.launch_hooked()


@cuda
def test_gpu_a_launch_hook_set_before_planning_sees_the_kept_launches(monkeypatch):
    """Kept plans launch through Triton's compiled launcher, skipping its runner, only while no launch hook is set:
    one set first (Proton's) sees every launch of the plans made after it, first call and later ones."""
    triton = pytest.importorskip("triton")
    if getattr(triton, "knobs", None) is None:
        pytest.skip("this Triton has no knobs: the kept plans use its runner")
    monkeypatch.setattr(fused_geglu.launcher, "plans", {})
    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda meta: seen.append(meta.get()["name"]))
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    wg, wu, wd = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((1024, 512), (1024, 512), (512, 1024)))
    for _ in range(2):
        fused_geglu.mlp(x, wg, wu, wd)
    assert seen == ["_geglu_small_m_kernel", "_linear_small_m_kernel"] * 2, seen

# ---- the tuned table: kernel and config by M bucket (and K class), read once ------------------------------

TMA_256 = {"BM": 64, "BN": 128, "BK": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4, "FLATTEN": False}
TABLE = {"capability": "9.0",
         "geglu": [{"max_m": 16, "kernel": "small", "config": {"BM": 16, "BN": 64, "BK": 128, "num_warps": 4,
                                                                "num_stages": 3}},
                   {"max_m": 256, "max_k": 1330, "kernel": "tma", "config": TMA_256},  # narrow inputs: fused
                   {"max_m": 256, "max_k": None, "kernel": "torch", "config": None},  # wider: cuBLAS
                   {"max_m": None, "kernel": "tma", "config": {"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8,
                                                               "num_warps": 8, "num_stages": 3, "FLATTEN": False}}],
         "down": [{"max_m": 16, "kernel": "small", "config": {"BM": 16, "BN": 64, "BK": 128, "FILL": 2,
                                                               "num_warps": 4, "num_stages": 4}},
                  {"max_m": None, "kernel": "torch", "config": None}]}


def _with_table(monkeypatch, tmp_path, table, capability=(9, 0)):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: capability)
    monkeypatch.setattr(fused_geglu.table, "tuned", fused_geglu.table.load_tuned(path))


@pytest.mark.parametrize("M, K, kernel, cfg", [
    (1, 768, "small", TABLE["geglu"][0]["config"]), (16, 100000, "small", TABLE["geglu"][0]["config"]),
    (17, 768, "tma", TMA_256), (256, 1330, "tma", TMA_256), (17, 1331, "torch", None), (256, 4096, "torch", None),
    (200, None, "tma", TMA_256),  # K not given: the bucket's first row
    (257, 768, "tma", TABLE["geglu"][-1]["config"]), (100000, 4096, "tma", TABLE["geglu"][-1]["config"])])
def test_tuned_table_picks_by_m_bucket_then_k(monkeypatch, tmp_path, M, K, kernel, cfg):
    _with_table(monkeypatch, tmp_path, TABLE)
    assert fused_geglu.table.by_m(torch.device("cuda", 0), M, "geglu", K) == (kernel, cfg)
    assert fused_geglu.table.by_m(torch.device("cuda", 0), M, "down", K)[0] == ("small" if M <= 16 else "torch")


def test_a_table_without_k_classes_still_reads(monkeypatch, tmp_path):
    """A table written before the K classes (no max_k): each row holds every K."""
    old = dict(TABLE, geglu=[{"max_m": 256, "kernel": "torch", "config": None},
                             {"max_m": None, "kernel": "tma", "config": TMA_256}])
    _with_table(monkeypatch, tmp_path, old)
    for K in (8, 768, 100000):
        assert fused_geglu.table.by_m(torch.device("cuda", 0), 256, "geglu", K) == ("torch", None)
        assert fused_geglu.table.by_m(torch.device("cuda", 0), 257, "geglu", K) == ("tma", TMA_256)


def test_tuned_table_only_on_its_gpus(monkeypatch, tmp_path):
    """Measured on a Hopper GPU: another compute capability, the interpreter and the CPU keep the defaults."""
    _with_table(monkeypatch, tmp_path, TABLE, capability=(8, 0))
    assert fused_geglu.table.by_m(torch.device("cuda", 0), 200, "geglu") == (None, None)  # past the small buckets
    assert fused_geglu.table.by_m(torch.device("cuda", 0), 1, "geglu") == ("small",
                                                                         fused_geglu.SMALL_M_CONFIGS["geglu"][0][1])
    assert fused_geglu.table.tuned_rows(torch.device("cpu"), "geglu") is None


@pytest.mark.parametrize("row", [{"max_m": None, "kernel": "cublas", "config": None},
                                 {"max_m": None, "kernel": "tma", "config": None},
                                 {"max_m": None, "max_k": 0, "kernel": "torch", "config": None},
                                 {"max_m": None, "max_k": "768", "kernel": "torch", "config": None}])
def test_a_malformed_table_says_which_row(tmp_path, row):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(dict(TABLE, geglu=[row])))
    with pytest.raises(ValueError, match="geglu row for M <= None"):
        fused_geglu.table.load_tuned(path)


PACKING = [{"max_m": 256, "max_k": None, "packed": True},
           {"max_m": 768, "max_k": 3000, "packed": True}, {"max_m": 768, "max_k": None, "packed": False},
           {"max_m": None, "max_k": 3000, "packed": False}, {"max_m": None, "max_k": None, "packed": True}]


@pytest.mark.parametrize("M, K, want", [(1, 100000, True), (256, 4096, True), (257, 3000, True), (257, 3001, False),
                                        (768, 8192, False), (769, 2048, False), (769, 3001, True), (10 ** 6, 64, False)])
def test_packing_rows_pick_by_m_bucket_then_k(monkeypatch, tmp_path, M, K, want):
    _with_table(monkeypatch, tmp_path, dict(TABLE, packing=PACKING))
    assert fused_geglu.packs_gate_up(torch.device("cuda", 0), M, K) is want


def test_packing_defaults_to_packed(monkeypatch, tmp_path):
    """No packing rows (a table from before them), a GPU of another kind, or a CPU: packed, as before the rows."""
    _with_table(monkeypatch, tmp_path, TABLE)
    assert fused_geglu.packs_gate_up(torch.device("cuda", 0), 512, 4096) is True
    _with_table(monkeypatch, tmp_path, dict(TABLE, packing=[{"max_m": None, "packed": False}]), capability=(8, 0))
    assert fused_geglu.packs_gate_up(torch.device("cuda", 0), 512, 4096) is True
    assert fused_geglu.packs_gate_up(torch.device("cpu"), 512, 4096) is True


@pytest.mark.parametrize("row", [{"max_m": None, "packed": "false"}, {"max_m": None, "packed": 0},
                                 {"max_m": None, "max_k": -1, "packed": True}])
def test_a_malformed_packing_row_says_which(tmp_path, row):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(dict(TABLE, packing=[row])))
    with pytest.raises(ValueError, match="packing row for M <= None"):
        fused_geglu.table.load_tuned(path)


def test_the_committed_table_loads():
    if not fused_geglu.TUNED_TABLE.exists():
        pytest.skip("no tuned table committed yet (python3 tune_fused.py on the GPU machine writes it)")
    # fused_geglu read it at import; a malformed one would have failed that import.
    assert fused_geglu.table.load_tuned() == fused_geglu.table.tuned


def _committed_down_row(M, K):
    """The committed table's down_proj row for M tokens of K inputs, read here from the JSON: the first row whose
    max_m (None: any) holds M and whose max_k (None or absent: any) holds K."""
    table = json.loads(fused_geglu.TUNED_TABLE.read_text())
    return next(r for r in table["down"] if (r["max_m"] is None or M <= r["max_m"])
                and (r.get("max_k") is None or K <= r["max_k"]))


@pytest.mark.parametrize("M, dim, hidden", [(32, 8192, 28672), (64, 4096, 11008), (1, 4096, 11008),
                                            (64, 5000, 14000)])
def test_down_proj_is_planned_by_its_input_width_hidden(monkeypatch, M, dim, hidden):
    """down_proj's GEMM is [M, hidden] @ [hidden, dim]: its row of the committed table goes by K = hidden, not by
    its output width dim. At these shapes the two give different rows (32 x 8192 <- 28672: by hidden the small-M
    kernel, by dim cuBLAS), so a plan looked up by dim fails (TABLE above has no K classes for down_proj: any K
    gives the same row, and table.by_m alone was tested with it, not make_down_plan's K). No GPU: fake CUDA tensors
    carry the shapes to ops.make_down_plan, and the
    plan (cuBLAS's F.linear, or the small-M kernel with its config) is compared, never run."""
    if not fused_geglu.TUNED_TABLE.exists():
        pytest.skip("no tuned table committed")
    want, other = _committed_down_row(M, hidden), _committed_down_row(M, dim)
    assert (want["kernel"], want.get("config")) != (other["kernel"], other.get("config"))  # the shape tells them apart
    capability = tuple(int(c) for c in json.loads(fused_geglu.TUNED_TABLE.read_text())["capability"].split("."))
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: capability)
    _assert_down_plan(M, dim, hidden, want["kernel"], want.get("config"))


def _assert_down_plan(M, dim, hidden, kernel, cfg):
    """ops.make_down_plan for fake CUDA tensors [M, hidden] and [dim, hidden]: F.linear for "torch", else the small-M
    kernel with cfg."""
    import functools
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        m = torch.empty(M, hidden, device="cuda", dtype=torch.bfloat16)
        w_down = torch.empty(dim, hidden, device="cuda", dtype=torch.bfloat16)
        run = fused_geglu.ops.make_down_plan(m, w_down, None, False)
    if kernel == "torch":
        assert run is F.linear
    else:
        assert isinstance(run, functools.partial) and run.func is fused_geglu.ops.run_down and run.args == (cfg,)


SMALL_32 = {"BM": 32, "BN": 64, "BK": 128, "FILL": 2, "num_warps": 4, "num_stages": 4}


@pytest.mark.parametrize("M, dim, hidden, kernel", [(32, 4096, 16384, "small"), (32, 16384, 4096, "torch"),
                                                    (33, 4096, 16384, "torch")])
def test_down_proj_rows_by_k_in_a_made_up_table(monkeypatch, tmp_path, M, dim, hidden, kernel):
    """Up to 32 tokens, a made-up table runs cuBLAS for down_proj inputs up to 4096 wide and the small-M kernel
    past them: 4096 <- 16384 (K 16384) takes the kernel, 16384 <- 4096 (K 4096) cuBLAS, whichever way dim goes."""
    _with_table(monkeypatch, tmp_path, dict(TABLE, down=[
        {"max_m": 32, "max_k": 4096, "kernel": "torch", "config": None},
        {"max_m": 32, "max_k": None, "kernel": "small", "config": SMALL_32},
        {"max_m": None, "kernel": "torch", "config": None}]))
    _assert_down_plan(M, dim, hidden, kernel, SMALL_32 if kernel == "small" else None)


def _ptxas_report(kernel, args, meta):
    """Compile kernel for an H100/H200 (sm_90a) here, without a GPU, and return ptxas's verbose report."""
    compiler = pytest.importorskip("triton.compiler")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import mangle_type
    import triton
    meta = dict(meta)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {name: mangle_type(a) for name, a in zip(kernel.arg_names, args)}
    signature.update({name: "constexpr" for name in kernel.arg_names[len(args):]})
    compiled = triton.compile(compiler.ASTSource(fn=kernel, signature=signature, constexprs=meta),
                              target=GPUTarget("cuda", 90, 32), options=options)
    _ptxas_report.shared = compiled.metadata.shared  # bytes of shared memory a program asks for
    ptx = Path(os.environ.get("TMPDIR", "/tmp")) / f"fused_geglu_{os.getpid()}.ptx"
    ptx.write_text(compiled.asm["ptx"])
    try:  # Triton's wheel may carry more than one ptxas; the one that reads this PTX version
        for ptxas in sorted((Path(triton.__file__).parent / "backends/nvidia/bin").glob("ptxas*")):
            done = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.devnull], capture_output=True, text=True)
            if done.returncode == 0:
                return done.stderr + done.stdout
    finally:
        ptx.unlink()
    pytest.skip("no ptxas in Triton's wheel reads its PTX")


@pytest.mark.skipif(fused_geglu.INTERPRET or fused_geglu.TensorDescriptor is None, reason="needs Triton's compiler")
def test_hopper_config_compiles_without_wgmma_serialisation():
    """The default TMA config, compiled for sm_90a, with and without SAVE_GU: no spills, and no "wgmma ... serialized"
    (ptxas C7515), which two accumulators with FLATTEN do get (the check can fail)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K, N = 4096, 4096, 11008
    x, w_gate, w_up = torch.empty(M, K, dtype=torch.bfloat16), *(torch.empty(N, K, dtype=torch.bfloat16) for _ in "gu")
    m = torch.empty(M, N, dtype=torch.bfloat16)

    def report(cfg, save_gu=False):
        BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
        m_desc = TensorDescriptor.from_tensor(m, [BM, BN])
        args = (TensorDescriptor.from_tensor(x, [BM, BK]), TensorDescriptor.from_tensor(w_gate, [BN, BK]),
                TensorDescriptor.from_tensor(w_up, [BN, BK]), m_desc, *((m_desc, m_desc) if save_gu else (None, None)), M, N, K)
        return _ptxas_report(fused_geglu.kernels.geglu_tma_kernel, args,
                             dict(NUM_SMS=132, UPCAST=False, FAST_TANH=True, SAVE_GU=save_gu, **cfg))

    default = report(fused_geglu.HOPPER_CONFIG)
    assert "Used" in default and "C7515" not in default and " 0 bytes spill stores" in default, default
    shared = _ptxas_report.shared
    # Training's variant stores g and u too: still no spills, and its pipeline still fits an H200's 227 KB per SM.
    saving = report(fused_geglu.HOPPER_CONFIG, save_gu=True)
    assert "C7515" not in saving and " 0 bytes spill stores" in saving, saving
    assert _ptxas_report.shared <= 227 * 1024 and shared <= 227 * 1024, (shared, _ptxas_report.shared)
    assert "C7515" in report(dict(fused_geglu.HOPPER_CONFIG, ONE_DOT=False))


@pytest.mark.parametrize("M, kernels", [(1, ["_geglu_small_m_kernel", "_linear_small_m_kernel"]),
                                        (4096, ["_geglu_pointer_kernel"])])  # TMA descriptors: not traced
def test_traced_launches_go_through_wrap_triton(monkeypatch, M, kernels):
    """What torch.compile's tracer sees (fake tensors on a GPU device, no data): each launch goes to wrap_triton,
    none through the eager fast path, and nothing asks a fake tensor for its address."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    wrapped = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **meta: wrapped.append((self.kernel.fn.__name__, grid, args, meta))

    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.table, "tuned", {})
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    monkeypatch.setattr(fused_geglu.machine, "num_sms", lambda device: 132)
    monkeypatch.setattr(fused_geglu.launcher, "compiled_kernels", None)  # the eager fast path would fail on it
    monkeypatch.setattr(torch.library, "wrap_triton", Recorder)
    with FakeTensorMode():
        x = torch.empty(M, 256, device="cuda", dtype=torch.bfloat16)
        w_gate, w_up = (torch.empty(512, 256, device="cuda", dtype=torch.bfloat16) for _ in "gu")
        w_down = torch.empty(256, 512, device="cuda", dtype=torch.bfloat16)
        m = fused_geglu.geglu(x, w_gate, w_up)
        y = fused_geglu.down_proj(m, w_down)
    assert tuple(m.shape) == (M, 512) and tuple(y.shape) == (M, 256)
    assert [name for name, *_ in wrapped] == kernels
    if M == 1:  # down_proj splits K: its workspace is made in the graph, the counters zeroed there
        (_, grid, args, meta), = [w for w in wrapped if w[0] == "_linear_small_m_kernel"]
        assert grid[2] == meta["SPLIT_K"] > 1 and args[3] is not args[2]
    else:  # the pointer kernel: no output under two names (the stand-ins for g and u are x); training's stores g, u
        with FakeTensorMode():
            saved = fused_geglu.geglu_saving_gu(x, w_gate, w_up)
        (_, _, args, meta), (_, _, saving_args, saving_meta) = wrapped[0], wrapped[-1]
        assert meta["SAVE_GU"] is False and args[4] is args[5] is args[0] and args[3] is not args[0]
        assert saving_meta["SAVE_GU"] is True and all(a is t for a, t in zip(saving_args[3:6], saved, strict=True))
        assert len({id(t) for t in saved}) == 3


def test_a_traced_graph_runs_cublas_where_the_table_wants_the_tma_kernel(monkeypatch):
    """Inside torch.compile's trace the TMA kernel cannot go (torch 2.11's wrap_triton loses its host-side
    descriptors): where the table wants it, the graph gets cuBLAS's GEMMs and a GeGLU that Inductor fuses; with
    TORCH_WHERE_FASTER off (04_fused_mlp.py shows the kernel) the pointer kernel. Rows that do not want TMA keep
    their kernel, traced or not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    rows = [(32, None, "small", fused_geglu.SMALL_M_CONFIGS["geglu"][-1][1]),
            (128, None, "pointer", fused_geglu.PORTABLE_CONFIG), (None, None, "tma", fused_geglu.HOPPER_CONFIG)]
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", lambda device, which: rows if which == "geglu" else None)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)
    with FakeTensorMode():
        w = torch.empty(512, 256, device="cuda", dtype=torch.bfloat16)
        xs = [torch.empty(M, 256, device="cuda", dtype=torch.bfloat16) for M in (32, 128, 129, 4096)]
        assert [fused_geglu.plan(x, w, w)[0] for x in xs] == ["small", "pointer", "torch", "torch"]
        monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", False)
        assert [fused_geglu.plan(x, w, w)[0] for x in xs] == ["small", "pointer", "pointer", "pointer"]


def test_showing_the_kernel_where_torch_won_runs_the_best_fused_tile_the_table_measured(monkeypatch):
    """Where the table runs cuBLAS (torch), 04_fused_mlp.py (TORCH_WHERE_FASTER off) runs the fused candidate the
    table names there ("fused"), not the default tile (3x slower at 384 tokens of width 4096 on the H200); a torch
    row that names none falls back to the default tiled kernel. table_rows reads the names back."""
    tile = dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3, FLATTEN=False, ONE_DOT=False)
    table = {"capability": "9.0", "down": [{"max_m": None, "kernel": "torch"}],
             "geglu": [{"max_m": 8, "kernel": "small", "config": fused_geglu.SMALL_M_CONFIGS["geglu"][0][1]},
                       {"max_m": 512, "max_k": None, "kernel": "torch", "config": None,
                        "fused": {"kernel": "tma", "config": tile}},
                       {"max_m": None, "max_k": None, "kernel": "torch", "config": None}]}
    rows = fused_geglu.table_rows(table, "t.json")[9]
    assert rows["fused"] == [(8, None, "small", fused_geglu.SMALL_M_CONFIGS["geglu"][0][1]), (512, None, "tma", tile)]
    bad = {**table, "geglu": [{"max_m": None, "kernel": "torch", "fused": {"kernel": "torch", "config": None}}]}
    with pytest.raises(ValueError, match="fused row"):
        fused_geglu.table_rows(bad, "t.json")
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.table, "tuned", {9: rows})
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    monkeypatch.setattr(fused_geglu.table, "can_use_tma", lambda *a: True)
    w = torch.empty(512, 256, dtype=torch.bfloat16)
    xs = [torch.empty(M, 256, dtype=torch.bfloat16) for M in (8, 384, 513)]
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda", 0)))
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)
    assert [fused_geglu.plan(x, w, w)[0] for x in xs] == ["small", "torch", "torch"]
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", False)
    assert [fused_geglu.plan(x, w, w) for x in xs] == [("small", fused_geglu.SMALL_M_CONFIGS["geglu"][0][1]),
                                                       ("tma", tile), ("tma", None)]


def test_each_triton_op_names_the_kernels_it_launches():
    """torch.library finds a triton_op's Triton kernels by following plain names from its body into the functions it
    calls, and AOTAutograd's cache key holds those kernels' source: a kernel edited on disk then misses a cached
    graph. The names run across the package's files (ops.py's launchers, launcher.py's arguments): each gate/up op
    finds the fused kernels its traced body can launch, and down_proj the small-M one. Skipped where this torch's
    finder does not follow a helper's call (checked here on two functions of the test's own)."""
    triton_lib = torch._library.triton
    find, found_for = (getattr(triton_lib, n, None) for n in ("get_inner_triton_kernels", "get_triton_kernels_for_op"))
    kernel = fused_geglu.kernels.geglu_pointwise_kernel

    def helper():
        return kernel

    def body():
        return helper()

    if find is None or found_for is None or kernel not in find(body):
        pytest.skip("this torch's triton_op does not follow the functions an op calls")
    names = {op: {getattr(k, "fn", k).__name__ for k in found_for(f"fused_geglu::{op}")}
             for op in ("geglu", "geglu_saving_gu", "down_proj")}
    for op in ("geglu", "geglu_saving_gu"):
        assert {"_geglu_small_m_kernel", "_geglu_tma_kernel", "_geglu_pointer_kernel"} <= names[op], names
    assert "_linear_small_m_kernel" in names["down_proj"], names


@pytest.mark.parametrize("training", [False, True])
def test_the_compiled_graph_holds_torch_where_faster(monkeypatch, training):
    """The kernel a compiled graph runs depends on TORCH_WHERE_FASTER (04_fused_mlp.py turns it off), and the compile
    caches key on Dynamo's graph: the module passes the flag to its op, so the two settings make two graphs, and a
    graph compiled under one is never served from the caches under the other."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append([(str(n.target), n.args[3:]) for n in gm.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("fused_geglu.geglu")])
        return gm.forward

    module = fused_geglu.FusedGeGLUMLP(16, 32)
    x = torch.randn(5, 16, requires_grad=training)
    for flag in (True, False):
        monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", flag)
        torch._dynamo.reset()
        with torch.set_grad_enabled(training):
            torch.compile(module, backend=record)(x)
    op = "fused_geglu.geglu_saving_gu.default" if training else "fused_geglu.geglu.default"
    assert graphs == [[(op, (True, "gelu_tanh"))], [(op, (False, "gelu_tanh"))]]  # and the activation (a SwiGLU's: "silu")
    torch._dynamo.reset()


def test_the_tuned_table_can_send_the_module_to_cublas_and_04_past_it(monkeypatch, capsys):
    """A bucket where the table found cuBLAS + PyTorch faster: the module runs them there, while 04_fused_mlp.py
    (TORCH_WHERE_FASTER = False) still shows a fused kernel; the buckets around it keep the table's kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    rows = [(64, None, "small", None), (256, 200, "pointer", None), (256, None, "torch", None),
            (None, None, "pointer", None)]  # 65..256 tokens: cuBLAS only for inputs wider than 200
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", lambda device, which: rows if which == "geglu" else None)
    with FakeTensorMode():
        w = torch.empty(512, 256, device="cuda", dtype=torch.bfloat16)
        by_m = {M: torch.empty(M, 256, device="cuda", dtype=torch.bfloat16) for M in (64, 65, 256, 257)}
        assert [fused_geglu.plan(x, w, w)[0] for x in by_m.values()] == ["small", "torch", "torch", "pointer"]
        assert [fused_geglu.tuned_to_torch("cuda", M, 256) for M in by_m] == [False, True, True, False]
        narrow_w, narrow_x = torch.empty(512, 200, device="cuda"), torch.empty(100, 200, device="cuda")
        assert fused_geglu.plan(narrow_x, narrow_w, narrow_w)[0] == "pointer"
        assert not fused_geglu.tuned_to_torch("cuda", 100, 200) and fused_geglu.tuned_to_torch("cuda", 100, 201)
        monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)  # undone after the test
        fused_geglu.show_the_kernel("cuda", 64, 256)
        assert capsys.readouterr().out == "" and not fused_geglu.TORCH_WHERE_FASTER
        fused_geglu.show_the_kernel("cuda", 200, 256)
        assert capsys.readouterr().out.startswith("note: at 200 tokens of width 256 the tuned table "
                                                  "(fused_geglu_tuned.json)")
        assert [fused_geglu.plan(x, w, w)[0] for x in by_m.values()] == ["small", "pointer", "pointer", "pointer"]


@pytest.mark.parametrize("pack", [True, False])
def test_the_mlp_plan_asks_the_packing_rows_with_tokens_and_width(monkeypatch, pack):
    """Where cuBLAS runs gate and up and the weights are packed, ops.make_mlp_plan makes the packed plan only where
    packs_gate_up (the table's packing rows) says so, asked with the input's device, its tokens (all leading dims)
    and its width; the GPU test above runs both plans. Here the plans themselves are stand-ins (no GPU)."""
    asked, made = [], []

    def gate_up(x, w_gate, w_up):
        return (F.linear(x, w_gate),)
    gate_up.any_leading_shape = True  # as cuBLAS's plan is
    monkeypatch.setattr(fused_geglu.ops, "make_geglu_plan", lambda *a: gate_up)
    monkeypatch.setattr(fused_geglu.table, "packs_gate_up",
                        lambda device, M, K: asked.append((device.type, M, K)) or pack)
    monkeypatch.setattr(fused_geglu.ops, "make_packed_mlp_plan",
                        lambda x2d, w_gate, run, activation: made.append(x2d.shape) or "packed")
    x, wg, wu, wd = torch.randn(2, 150, 16), torch.randn(32, 16), torch.randn(32, 16), torch.randn(16, 32)
    run = fused_geglu.ops.make_mlp_plan(x, wg, wu, wd, both_packed=True)
    assert asked == [("cpu", 300, 16)]
    assert (run == "packed") is pack and made == ([(300, 16)] if pack else [])
    if not pack:  # the two-GEMM plan: gate, then down_proj, over any leading shape
        assert torch.allclose(run(x, wg, wu, wd), F.linear(F.linear(x, wg), wd))
    asked.clear()
    assert fused_geglu.ops.make_mlp_plan(x, wg, wu, wd, both_packed=False) != "packed"
    assert made == ([(300, 16)] if pack else [])
