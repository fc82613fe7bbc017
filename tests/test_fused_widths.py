"""Which kernel the fused MLP runs at widths its dense rows were not tuned on: an MoE expert's (hidden < dim) takes the
table's narrow rows, and where the table chose the TMA kernel but it cannot go (dim or hidden not a multiple of 8)
the module runs cuBLAS's GEMMs and the pointwise GeGLU, not the untuned pointer kernel; the scripts that show the fused
kernel (TORCH_WHERE_FASTER False) still run the pointer one. Fake tensors stand for the GPU's: no GPU needed."""

import pytest
import torch

fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")

TMA = {"BM": 128, "BN": 128, "BK": 64}
DENSE = [(None, None, "tma", TMA)]  # the dense rows: the TMA kernel at every M and K
NARROW = [(64, None, "small", {"BM": 64}), (None, 3000, "torch", None), (None, None, "tma", {"BM": 64})]
FUSED_NARROW = [(64, None, "small", {"BM": 64}), (None, 3000, "pointer", {"BM": 32}), (None, None, "tma", {"BM": 64})]


@pytest.fixture
def table(monkeypatch):
    rows = {"geglu": DENSE, "fused": DENSE, "geglu_narrow": NARROW, "fused_narrow": FUSED_NARROW}
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", lambda device, which: rows.get(which))
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", True)
    # Fake tensors read as traced ones, which the TMA kernel never takes: here they stand for eager GPU tensors, each
    # 16-byte aligned (the TMA kernel's other condition beside the widths).
    monkeypatch.setattr(fused_geglu.machine, "tracing", lambda t: False)
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    monkeypatch.setattr(FakeTensor, "data_ptr", lambda self: 1 << 20, raising=False)
    with FakeTensorMode():
        yield lambda M, K, N: (torch.empty(M, K, device="cuda", dtype=torch.bfloat16),
                               torch.empty(N, K, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("M, K, N, want", [
    (40, 2048, 1408, ("small", {"BM": 64})),  # an MoE expert: the narrow rows
    (2048, 2048, 1408, ("torch", None)),  # hidden < dim, K in the narrow rows' first class: cuBLAS there
    (2048, 4096, 1536, ("tma", {"BM": 64})),  # a wider narrow class: its own tile
    (2048, 2048, 2048, ("tma", TMA)),  # hidden == dim is not narrower: the dense rows
    (2048, 2048, 8192, ("tma", TMA)),
])
def test_moe_experts_take_the_narrow_rows(table, M, K, N, want):
    x, w = table(M, K, N)
    assert fused_geglu.table.plan(x, w, w) == want


def test_where_torch_won_a_narrow_row_the_scripts_that_show_the_kernel_run_its_best_fused_tile(table, monkeypatch):
    x, w = table(2048, 2048, 1408)
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", False)
    assert fused_geglu.table.plan(x, w, w) == ("pointer", {"BM": 32})


@pytest.mark.parametrize("M, K, N", [(300, 1000, 2730), (64, 4100, 14336), (8192, 768, 3070)])
def test_widths_the_tma_kernel_cannot_take_run_cublas_not_the_untuned_pointer_kernel(table, monkeypatch, M, K, N):
    x, w = table(M, K, N)
    assert not fused_geglu.table.can_use_tma(x, w, w, False)
    assert fused_geglu.table.plan(x, w, w) == ("torch", None)
    monkeypatch.setattr(fused_geglu.table, "TORCH_WHERE_FASTER", False)  # 04_fused_mlp.py: the fused kernel, anyway
    assert fused_geglu.table.plan(x, w, w) == ("pointer", None)


def test_without_narrow_rows_an_expert_takes_the_dense_ones(table, monkeypatch):
    monkeypatch.setattr(fused_geglu.table, "tuned_rows", lambda device, which: DENSE if which == "geglu" else None)
    x, w = table(2048, 2048, 1408)
    assert fused_geglu.table.plan(x, w, w) == ("tma", TMA)


def test_show_the_kernel_asks_the_narrow_rows_with_the_hidden_width(table, capsys):
    assert fused_geglu.tuned_to_torch("cuda", 2048, 2048, 1408) and not fused_geglu.tuned_to_torch("cuda", 2048, 2048)
    fused_geglu.show_the_kernel("cuda", 2048, 2048, 1408)
    assert capsys.readouterr().out.startswith("note: at 2048 tokens of width 2048 the tuned table")


gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                         reason="needs a Hopper GPU (the TMA kernel)")


@gpu
@pytest.mark.parametrize("save_gu", [False, True])
def test_a_kept_tma_plan_encodes_its_descriptors_once_per_address_and_computes_the_same(save_gu):
    """The TMA kernel's kept plan, on Triton 3.6's launcher, keeps each tensor's encoded descriptor by its address
    (launcher.bind_tma); its outputs equal a launch that makes every descriptor anew (kernel='tma': no kept plan), bit
    for bit, on inputs at addresses it has seen and at new ones, past the number of encodings kept per slot."""
    import triton
    from fused_geglu import launcher, ops
    torch.manual_seed(0)
    dim, hidden = 2048, 1408
    w_gate, w_up = (torch.randn(hidden, dim, device="cuda", dtype=torch.bfloat16) / dim ** 0.5 for _ in range(2))
    xs = [torch.randn(40, dim, device="cuda", dtype=torch.bfloat16) for _ in range(launcher.KEPT_ENCODINGS + 6)]
    cfg = dict(BM=64, BN=128, BK=64, GROUP_M=8, num_warps=4, num_stages=4, FLATTEN=False, ONE_DOT=False)
    run = ops.make_geglu_plan(xs[0], w_gate, w_up, True, None, cfg, save_gu, True)
    if triton.__version__.startswith("3.6"):
        assert run.encodes_once
    for x in xs + xs[:3]:
        got = run(x, w_gate, w_up)
        want = ops._run_geglu("tma", cfg, save_gu, "gelu_tanh", x, w_gate, w_up)
        for a, b in zip(got, want):
            assert (a is None and b is None) or torch.equal(a, b)


def test_the_pages_numbers_are_the_committed_records():
    """docs/04's numbers for the widths the table was not tuned on come from results/bench_fused_widths_before_h100.json
    (bench.py on an H100 before these changes): the pointer kernel's ratio at 300 x 1000 -> 2730, called from Python,
    and the host µs per call at 40 x 2048 -> 1408."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    record = json.loads((root / "results/bench_fused_widths_before_h100.json").read_text())
    page = (root / "docs/04_fused_mlp.md").read_text()
    by_shape = {(r["M"], r["dim"], r["hidden"]): r for r in record["shapes"]}
    odd = by_shape[300, 1000, 2730]
    assert odd["fused_path"] == "pointer"
    ratio = odd["variants"]["eager"]["median_us"] / odd["variants"]["fused"]["median_us"]
    assert f"({ratio:.2f}x of eager" in page
    few = by_shape[40, 2048, 1408]["variants"]
    assert f"{few['fused']['host_us']:.1f} µs to\n  enqueue against eager's {few['eager']['host_us']:.1f}" in page
