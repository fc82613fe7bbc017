"""plot.py's numbers at their edges, found by running every mutant of the file (docs/tests.md): which kernels the
roofline places and why not, the FLOPs of an Inductor GEMM that carries its own count, the peaks of a device the
table does not know, the chart's floors and bars, the lines printed under the picture, the PNG's own metadata and
where it is drawn before it is moved into place. Each expected value is worked out by hand in the test."""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the pictures need matplotlib (a dependency: uv sync)")

from test_inspect_trace import parse  # noqa: E402
from test_reader_report import x  # noqa: E402
from trace_reader.render import plot  # noqa: E402
from trace_reader.reading.events import TraceError  # noqa: E402


def gpu(steps: list[list[tuple]], device: str = "NVIDIA H200") -> dict:
    """Steps at 0, 1000, 2000 µs, 900 µs each; step i's j-th entry (kernel, op, op's args, µs): the op starts at
    1000 i + 100 j + 9, launches at +10 and its kernel runs from +15 for its µs."""
    ev, ext = [], 0
    for i, kernels in enumerate(steps):
        ev.append(x(f"ProfilerStep#{i + 2}", "user_annotation", 1000 * i, 900))
        for j, (kernel, op, args, dur) in enumerate(kernels):
            ext, at = ext + 1, 1000 * i + 100 * j
            ev += [x(op, "cpu_op", at + 9, 5, **{"External id": ext, **args}),
                   x("cudaLaunchKernel", "cuda_runtime", at + 10, 2, **{"External id": ext, "correlation": ext}),
                   x(kernel, "kernel", at + 15, dur, pid=0, tid=7, correlation=ext)]
    return {"traceEvents": ev, "deviceProperties": [{"name": device}]}


def roofline(steps, device="NVIDIA H200"):
    return plot.roofline_points(parse(gpu(steps, device)))


BF16_MM = {"Input Dims": [[64, 128], [128, 256]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
# 2 * 64 * 128 * 256 = 4,194,304 FLOPs; bytes (64*128 + 128*256 + 64*256) * 2 = 114,688


# ---- which kernels are placed ---------------------------------------------------------------------------------

def test_an_inductor_gemm_is_placed_by_its_own_counts_and_a_shaped_one_by_its_shapes():
    """kernel_flop 2e6 and kernel_num_gb 1e-3 (1e6 B) in 1 µs: 2 TFLOP/s at 2 FLOP/B, no shape to list. An aten::mm
    with shapes keeps the shapes' count even where a kernel_flop field says otherwise."""
    inductor = {"kernel_flop": 2e6, "kernel_num_gb": 1e-3, "Input type": ["c10::BFloat16"]}
    rf = roofline([[("triton_tem_fused_mm_0", "triton_tem_fused_mm_0", inductor, 1.0)]])
    (p,) = rf.points
    assert (p.kind, p.flops, p.bytes, p.flop_s, p.intensity) == ("GEMM", 2e6, 1e6, 2e12, 2.0)
    assert rf.gemm_shapes == [] and rf.not_placed == []
    (p,) = roofline([[("gemm_kernel", "aten::mm", {**BF16_MM, "kernel_flop": 1.0}, 4.0)]]).points
    assert (p.flops, p.bytes) == (4194304.0, 114688.0)


def test_a_gemm_counted_zero_or_moving_nothing_is_not_placed_and_one_flop_or_byte_is():
    """The first step's launch is the one read: its kernel_flop 0 (the second step's 2e6 gives the group its
    rate) or its kernel_num_gb 0 leaves it off the chart; 1 FLOP or 1 byte (1e-9 GB) places it."""
    def placed(flop, gb):
        first = {"kernel_flop": flop, "kernel_num_gb": gb}
        later = {"kernel_flop": 2e6, "kernel_num_gb": 1e-3}
        name = "triton_tem_fused_mm_0"
        rf = roofline([[(name, name, first, 1.0)], [(name, name, later, 1.0)]])
        return [(p.flops, p.bytes) for p in rf.points], [why for *_, why, _ in rf.not_placed]

    assert placed(0, 1e-3) == ([], ["no shapes"])
    assert placed(1, 1e-3) == ([(1.0, 1e6)], [])
    assert placed(2e6, 0) == ([], ["no shapes"])
    assert placed(2e6, 1e-9) == ([(2e6, 1.0)], [])


def test_a_pointwise_kernel_needs_elements_and_bytes():
    """An Inductor pointwise launch with kernel_num_gb 1e-9 (1 byte) and one element of one op (mul): 1 FLOP per
    byte, placed. Without its Input Dims it has bytes but no elements to count FLOPs from: not placed."""
    one = {"kernel_num_gb": 1e-9, "Input Dims": [[1]], "Input type": ["bool"]}
    (p,) = roofline([[("triton_poi_fused_mul_0", "triton_poi_fused_mul_0", one, 1.0)]]).points
    assert (p.kind, p.flops, p.bytes, p.achieved) == ("pointwise", 1.0, 1.0, "0.001 GB/s")
    rf = roofline([[("triton_poi_fused_mul_0", "triton_poi_fused_mul_0", {"kernel_num_gb": 1e-9}, 1.0)]])
    assert rf.points == [] and [why for *_, why, _ in rf.not_placed] == ["no shapes"]


def test_a_lower_bound_rate_is_marked_where_the_bytes_are_a_guess():
    """aten::mul of two float [4, 8]: 3 * 128 B in 2 µs = 0.192 GB/s (printed 0.19), exact. The same shapes launched by an Inductor
    kernel whose source is not at hand: only the two inputs are known (256 B, 0.128 GB/s, printed >=0.13), a lower bound."""
    shapes = {"Input Dims": [[4, 8], [4, 8]], "Input type": ["float", "float"]}
    (aten,) = roofline([[("mul_kernel", "aten::mul", shapes, 2.0)]]).points
    name = "triton_poi_fused_mul_0"
    (guess,) = roofline([[(name, name, shapes, 2.0)]]).points
    assert (aten.bytes, aten.achieved, aten.lower_bound) == (384.0, "0.19 GB/s", False)
    assert (guess.bytes, guess.achieved, guess.lower_bound) == (256.0, ">=0.13 GB/s", True)


def test_calls_per_step_over_one_step_and_over_two():
    """One step of two launches: 2 calls per step; two steps of one launch each: 1."""
    k = ("gemm_kernel", "aten::mm", BF16_MM, 4.0)
    assert [p.calls for p in roofline([[k, k]]).points] == [2.0]
    assert [p.calls for p in roofline([[k], [k]]).points] == [1.0]


def test_a_device_the_table_does_not_know_has_no_peaks():
    """No peak for "Mystery GPU": nothing is a fraction of a peak, and the source says so."""
    rf = roofline([[("gemm_kernel", "aten::mm", BF16_MM, 4.0)]], device="Mystery GPU")
    assert (rf.peak_tflops, rf.peak_gbs, rf.peak_source) == (None, None, "unknown (device not in the peak table)")
    assert rf.dtype == "bfloat16" and [p.of_peak for p in rf.points] == [None]


def test_a_gemm_of_a_dtype_without_a_peak_is_no_fraction_of_the_bandwidth():
    """An int32 GEMM on the H200 (the table has a bandwidth peak but no int32 compute peak): its of_peak stays None;
    an int32 pointwise op beside it, 3 * 128 B in 2 µs, is 0.192 GB/s of 4800 GB/s."""
    int_mm = {"Input Dims": [[64, 128], [128, 256]], "Input type": ["int", "int"]}
    shapes = {"Input Dims": [[4, 8], [4, 8]], "Input type": ["int", "int"]}
    rf = roofline([[("gemm_kernel", "aten::mm", int_mm, 4.0), ("mul_kernel", "aten::mul", shapes, 2.0)]])
    assert rf.peak_tflops is None and rf.peak_gbs == 4800.0
    assert [(p.kind, p.of_peak) for p in rf.points] == [("GEMM", None), ("pointwise", pytest.approx(0.192 / 4800))]


def test_the_gemms_dtype_picks_the_compute_peak():
    """A float32 op launched before a bf16 GEMM (a norm computed in float32): the peak is bf16's 989.5 TFLOP/s, and
    the GEMM's 4,194,304 FLOPs in 4 µs (1.048576 TFLOP/s) are that fraction of it."""
    shapes = {"Input Dims": [[4, 8], [4, 8]], "Input type": ["float", "float"]}
    rf = roofline([[("mul_kernel", "aten::mul", shapes, 2.0), ("gemm_kernel", "aten::mm", BF16_MM, 4.0)]])
    assert (rf.dtype, rf.peak_tflops) == ("bfloat16", 989.5)
    assert rf.points[1].of_peak == pytest.approx(1.048576 / 989.5)
    only = roofline([[("mul_kernel", "aten::mul", shapes, 2.0)]])  # no GEMM: the chart still names the dtype
    assert (only.dtype, only.peak_tflops) == ("float32", 67.0)


def test_flops_per_element_count_the_ops_a_fused_kernel_names():
    """An aten op is one op, whatever its name holds (addcmul); a fused launch counts the distinct op words in
    its name (add and mul: 2; GELU and Mul: 2); a name with none still does 1."""
    assert [plot._ops_per_element(n) for n in ("aten::addcmul", "aten::gelu", "triton_poi_fused_add_mul_mul_0",
                                               "LigerGELUMulFunction", "my_kernel")] == [1, 1, 2, 2, 1]


def test_elements_are_the_largest_usable_input():
    """[2, 3] and [4]: 6; no Input Dims, a non-list, scalars and 0-d tensors only: 0."""
    class Op:
        def __init__(self, dims):
            self.args = {} if dims is None else {"Input Dims": dims}

    assert plot._elements(Op([[2, 3], [4], [], "x"])) == 6
    assert [plot._elements(Op(d)) for d in (None, "2x3", [[], [], 5], [[2, "3"]])] == [0, 0, 0, 0]


def test_the_versions_line_reads_positive_versions_only():
    """13000 is CUDA 13.0 and 12080 is 12.8; 1 reads 0.0 (positive, so listed); 0 and a non-int are left out."""
    def versions(meta):
        return plot._versions(type("T", (), {"meta": meta})())

    assert versions({"cuda_runtime_version": 12080, "cuda_driver_version": 13000}) == "CUDA runtime 12.8, driver 13.0"
    assert versions({"cuda_runtime_version": 1, "cuda_driver_version": 0}) == "CUDA runtime 0.0"
    assert versions({"cuda_runtime_version": "12080"}) == ""


def test_arrows_from_every_replacement_not_the_last_only():
    a = plot.Roofline("a", None, None, None, None, "?")
    b = plot.Roofline("b", None, None, None, None, "?")
    for rf, names in ((a, ["gelu", "mul", "gone"]), (b, ["fused", "other"])):
        rf.points = [plot.Point(i, n, "op", "pointwise", 1, 0.1, 1, 1, 1, "") for i, n in enumerate(names)]
    replaced = [(["gelu", "mul"], ["fused", "fused"]), (["gone", "unplaced"], ["other"]), (["x"], ["fused"])]
    assert plot._arrows([a, b], replaced) == [("gelu", "fused"), ("mul", "fused"), ("gone", "other")]


# ---- the lines under the picture ------------------------------------------------------------------------------

def _point(**kw):
    base = dict(number=3, name="gemm_kernel", op="aten::mm", kind="GEMM", calls=1.0, share=1.0, flops=4.0,
                bytes=2.0, flop_s=1.5e12, achieved="1.5 TFLOP/s")
    return plot.Point(**{**base, **kw})


def test_the_label_and_the_line_of_each_kind_of_point():
    """A GEMM prints its achieved TFLOP/s; a pointwise kernel its GB/s and, in brackets, its TFLOP/s (">=" when its
    bytes are a lower bound); a launching op's name is cut to 22 characters; a point with a peak says its share."""
    gemm = _point()
    assert plot._label(gemm) == "#3 aten::mm, 100%"
    assert plot._label(_point(calls=2.0, share=0.5, lower_bound=True), "B ") == \
        "B #3 aten::mm ×2, 50% (bytes ≥: too far right)"
    name = "gemm_kernel".ljust(54)
    assert plot._line(gemm) == f"#3  {name} {'aten::mm':<22}     2 FLOP/B  1.5 TFLOP/s, 100.0% of GPU time"
    pw = _point(kind="pointwise", op="triton_poi_fused_gelu_mul_0", achieved=">=250 GB/s", flop_s=2.5e11,
                lower_bound=True, of_peak=0.25, share=0.125)
    assert plot._line(pw, "A ") == (f"A #3  {name} triton_poi_fused_gelu_ {'2':>5} FLOP/B  >=250 GB/s (>=0.25 TFLOP/s)"
                                    " = 25.0% of peak, 12.5% of GPU time")
    exact = _point(kind="pointwise", achieved="250 GB/s", flop_s=2.5e11)
    assert plot._line(exact).endswith("FLOP/B  250 GB/s (0.25 TFLOP/s), 100.0% of GPU time")


# ---- the benchmark chart's numbers ----------------------------------------------------------------------------

def test_the_floor_is_the_largest_positive_floor_field():
    """floor*_us fields and a "floor" dict's values, > 0 only; a field ending in _us not named floor is no floor,
    nor is one named floor not ending in _us."""
    assert plot._floor_us({"floor_us": 2.0, "floor_memory_us": 3.0, "median_us": 99.0, "floor_tflops": 50}) == 3.0
    assert plot._floor_us({"floor_us": 2.0, "floor": {"compute": 5.0, "memory": 0.5}}) == 5.0
    assert plot._floor_us({"floor_us": 9.0, "floor": {"compute": 5.0}}) == 9.0
    assert plot._floor_us({"floor": {"compute": 0, "memory": -1, "x": "7"}}) is None
    assert plot._floor_us({"floor_us": 0.0, "floor_x_us": 0.5}) == 0.5
    assert plot._floor_us({"floor_us": 0}) is None
    assert plot._floor_us({"floor": {"memory": 0.5}}) == 0.5


def test_bars_take_positive_medians_and_any_shape_list():
    """A median of 0 is no bar, 0.5 µs is one; shapes that are not a list give no bars."""
    shape = {"label": "s", "floor_us": 1.0, "variants": {"a": {"median_us": 0}, "b": {"median_us": 0.5}}}
    assert plot.bench_bars({"shapes": [shape]}) == [
        {"shape": "s", "floor_us": 1.0, "variants": {"b": {"us": 0.5, "of_floor": 2.0}}}]
    assert plot.bench_bars({"shapes": None}) == plot.bench_bars({"shapes": {"s": shape}}) == []


def test_the_chart_passes_what_was_timed_to_its_title(tmp_path, monkeypatch):
    said = []

    def figure(record, what):
        said.append(what)
        raise TraceError("stop here")

    monkeypatch.setattr(plot, "bench_figure", figure)
    with pytest.raises(TraceError):
        plot.bench_chart({}, tmp_path / "a.png")
    assert plot.bench_chart_next_to({}, tmp_path / "b.json", "attention") == "chart not drawn: stop here"
    assert plot.main(["--bench", _record(tmp_path), "--what", "decode"]) == 2
    assert plot.main(["--bench", _record(tmp_path)]) == 2
    assert said == ["forward", "attention", "decode", "GeGLU MLP forward"]


def _record(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{}")
    return str(path)


def test_the_command_refuses_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert plot.main(["--bench", str(bad)]) == 2
    assert plot.main(["--bench", str(listed)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m trace_reader.plot: error: {bad}: cannot read a JSON record (JSONDecodeError)",
        f"python -m trace_reader.plot: error: {listed}: not a benchmark record (expected a JSON object)"]


# ---- the PNG ----------------------------------------------------------------------------------------------------

def test_the_png_carries_its_data_sorted_and_no_software_line(tmp_path):
    """The Description chunk is the data as json.dumps(sort_keys=True) writes it; matplotlib's "Software" line is
    left out, so the same data gives the same bytes."""
    from PIL import Image

    fig = plot.new_figure((1, 1))
    data = {"b": 1, "a": [2, 3]}
    plot.save_png(fig, tmp_path / "p.png", data)
    with Image.open(tmp_path / "p.png") as im:
        assert im.text == {"Description": '{"a": [2, 3], "b": 1}'}


def test_the_png_is_drawn_in_a_hidden_folder_beside_it(tmp_path, monkeypatch):
    """Drawn into .<stem>-XXXX in the picture's own folder (so the move into place is a rename on one file system),
    which is gone afterwards."""
    import matplotlib.figure

    seen = []
    real = matplotlib.figure.Figure.savefig

    def savefig(self, fname, **kw):
        seen.append(Path(fname))
        return real(self, fname, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    plot.save_png(plot.new_figure((1, 1)), tmp_path / "p.png", {})
    (drawn,) = seen
    assert drawn.parent.parent == tmp_path and drawn.parent.name.startswith(".p-")
    assert sorted(os.listdir(tmp_path)) == ["p.png"]


def test_a_failed_write_names_the_reason_and_a_missing_folder_is_named(tmp_path):
    """A folder where the PNG should go: the move fails with the system's reason, "Is a directory"."""
    (tmp_path / "p.png").mkdir()
    with pytest.raises(TraceError) as e:
        plot.save_png(plot.new_figure((1, 1)), tmp_path / "p.png", {})
    assert str(e.value) == f"cannot write {tmp_path / 'p.png'}: Is a directory"
    with pytest.raises(TraceError) as e:
        plot.check_png_path(tmp_path / "no" / "p.png")
    assert str(e.value) == f"{tmp_path / 'no'}: no such folder for the picture"


def test_bench_needs_its_record(capsys):
    with pytest.raises(SystemExit) as e:
        plot.main([])
    assert e.value.code == 2
    assert "the following arguments are required: --bench" in capsys.readouterr().err


def test_out_is_a_path(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(plot, "bench_chart", lambda record, path, what: said.append(path) or path)
    assert plot.main(["--bench", _record(tmp_path), "--out", str(tmp_path / "o.png")]) == 0
    assert said == [tmp_path / "o.png"] and isinstance(said[0], Path)
    assert json.loads((tmp_path / "r.json").read_text()) == {}
