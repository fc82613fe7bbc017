"""The pictures: the roofline draws the numbers the report prints; the benchmark chart draws the record's;
the README's images are re-made from committed data; bad input is one line, never a half-written PNG."""

import gzip
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the pictures need matplotlib (a dependency: uv sync)")
from PIL import Image  # noqa: E402 - comes with matplotlib

import inspect_trace as it
from doc_pages import all_text
from trace_reader.render import plot
from trace_reader.reading.tree import parse_trace
from trace_reader.facts.format import fmt_num

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
ROOFLINE_PX = tuple(int(x * plot.DPI) for x in plot.ROOFLINE_SIZE)
BF16 = 2


@pytest.fixture(scope="module")
def h200():
    return {n: it.load_trace(DATA / f"h200_{n}.json.gz") for n in ("mlp_eager", "mlp_compile", "liger", "fused_eager")}


def report_rows(trace):
    """The report's kernel table: row number -> the row's text."""
    rows = {}
    for line in it.report(trace).splitlines():
        m = re.match(r"(\d+)  ", line)
        if m and ("aten::" in line or "Memset" in line or "mlp_fwd" in line or "Function" in line or "triton" in line):
            rows[int(m.group(1))] = line
    return rows


@pytest.mark.parametrize("name", ["mlp_eager", "mlp_compile", "liger", "fused_eager"])
def test_roofline_points_are_the_numbers_the_report_prints(h200, name):
    trace = h200[name]
    rf = plot.roofline_points(trace)
    rows = report_rows(trace)
    assert rf.device == "NVIDIA H200" and rf.dtype == "bfloat16" and rf.peak_tflops and rf.peak_gbs
    placed = {p.number for p in rf.points} | {n for n, *_ in rf.not_placed}
    assert placed == set(rows)  # every kernel of the table is placed or listed as not placed
    for p in rf.points:
        row = rows[p.number]
        assert p.achieved in row and f"{100 * p.share:.1f}%" in row and f"{fmt_num(100 * p.of_peak)}% of" in row
        printed = float(re.search(r"([\d,.]+) (TFLOP/s|GB/s)", row).group(1).replace(",", ""))
        # y is the printed rate: TFLOP/s for a GEMM; for a pointwise kernel GB/s times its FLOPs per byte
        drawn = p.flop_s / 1e12 if p.kind == "GEMM" else p.flop_s / p.intensity / 1e9
        assert drawn == pytest.approx(printed, rel=0.005)
    gemms = [p for p in rf.points if p.kind == "GEMM"]
    assert gemms  # every MLP trace keeps cuBLAS's down_proj at least
    for p in gemms:  # the post's shape: 8192 x 768 x 3072 (either way round), bf16, each operand once
        m, k, n = 8192, 768, 3072
        assert p.flops == 2 * m * k * n
        assert p.bytes == BF16 * (m * k + k * n + m * n)
        assert 400 < p.intensity < 1000  # right of the H200's ridge (~206 FLOP/B): compute-bound
    for p in rf.points:
        if p.kind == "pointwise":  # left of the ridge, under the bandwidth slope
            assert p.intensity < 1 and p.flop_s / p.intensity <= rf.peak_gbs * 1e9


def test_roofline_tells_the_posts_story(h200):
    """README: GeLU and mul at 0.25 and 0.17 FLOP/B, the fused GeLU*mul (2 FLOPs per 6 bytes: 0.33) to their right."""
    pw = {n: {p.op: p for p in plot.roofline_points(h200[n]).points if p.kind == "pointwise"}
          for n in ("mlp_eager", "mlp_compile", "liger")}
    gelu, mul = pw["mlp_eager"]["aten::gelu"], pw["mlp_eager"]["aten::mul"]
    assert gelu.intensity == pytest.approx(1 / (2 * BF16)) and mul.intensity == pytest.approx(1 / (3 * BF16))
    liger = pw["liger"]["LigerGELUMulFunction"]
    assert liger.intensity == pytest.approx(2 / (3 * BF16)) and not liger.lower_bound
    inductor = pw["mlp_compile"]["triton_poi_fused__unsafe_view_gelu_mul_0"]
    assert inductor.lower_bound  # its in_out buffer is counted once: drawn hollow, flagged in the list
    assert min(liger.intensity, inductor.intensity) > max(gelu.intensity, mul.intensity)
    fused = plot.roofline_points(h200["fused_eager"])
    assert [(name, why) for _, name, _, why, _ in fused.not_placed] == [("_geglu_tma_kernel", "no shapes")]


def test_png_is_written_at_its_size_with_its_data(h200, tmp_path):
    out = tmp_path / "r.png"
    assert it.main(["--plot", str(out), str(DATA / "h200_mlp_eager.json.gz")]) == 0
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == ROOFLINE_PX
    assert plot.png_data(out) == json.loads(json.dumps(plot.roofline_points(h200["mlp_eager"]).data()))
    assert [p.name for p in tmp_path.iterdir()] == ["r.png"]  # no temporary file left behind


def test_two_runs_on_one_chart_with_arrows_from_replaced_kernels(h200, tmp_path):
    out = tmp_path / "ab.png"
    plot.plot_roofline([h200["mlp_eager"], h200["mlp_compile"]], out)
    data = plot.png_data(out)
    assert [d["path"] for d in data["runs"]] == [h200["mlp_eager"].path, h200["mlp_compile"].path]
    arrows = {(old.split("<")[0], new) for old, new in data["arrows"]}
    assert arrows == {("void at::native::vectorized_elementwise_kernel", "triton_poi_fused__unsafe_view_gelu_mul_0")}
    assert len(data["arrows"]) == 2  # from GeLU and from mul
    # The fused kernel has no shapes: no arrow can end on it, and the chart says so.
    plot.plot_roofline([h200["mlp_eager"], h200["fused_eager"]], out)
    data = plot.png_data(out)
    assert data["arrows"] == [] and data["runs"][1]["not_placed"][0][1:4] == ["_geglu_tma_kernel", "mlp_fwd",
                                                                             "no shapes"]


def test_a_trace_without_shapes_places_nothing_and_says_why(tmp_path):
    """Another harness's trace (record_shapes=False): every kernel is listed as not placed, nothing crashes."""
    raw = json.loads(gzip.decompress((DATA / "h200_mlp_eager.json.gz").read_bytes()))
    for e in raw["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            e.get("args", {}).pop(key, None)
    rf = plot.roofline_points(parse_trace(raw, "noshapes.json"))
    assert rf.points == [] and {why for *_, why, _ in rf.not_placed} == {"no shapes", "memory op, no math"}
    path = tmp_path / "noshapes.json"
    path.write_text(json.dumps(raw))
    assert it.main(["--plot", str(tmp_path / "n.png"), str(path)]) == 0
    assert Image.open(tmp_path / "n.png").size == ROOFLINE_PX


def test_many_kernels_are_all_placed_and_the_list_is_cut(tmp_path):
    """Every launch a different kernel name (another harness, a long varied run): all placed, the list cut."""
    raw = json.loads(gzip.decompress((DATA / "h200_mlp_eager.json.gz").read_bytes()))
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    for i, e in enumerate(kernels):
        e["name"] = f"k{i:03d}_{e['name']}"
    rf = plot.roofline_points(parse_trace(raw, "varied.json"))
    assert len(rf.points) == len(kernels) > plot.LIST_LINES
    assert {why for *_, why, _ in rf.not_placed} == {"memory op, no math"}  # the memsets
    path = tmp_path / "varied.json"
    path.write_text(json.dumps(raw))
    assert it.main(["--plot", str(tmp_path / "v.png"), str(path)]) == 0
    assert len(plot.png_data(tmp_path / "v.png")["points"]) == len(rf.points)


CPU_TRACE = {"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
     "args": {"Input Dims": [[4, 4], [4, 4]], "Input type": ["float", "float"]}}]}


def test_cpu_trace_has_no_roofline(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(CPU_TRACE))
    out = tmp_path / "cpu.png"
    assert it.main(["--plot", str(out), str(path)]) == 2
    said = capsys.readouterr()
    assert said.err == f"inspect_trace.py: error: {path}: a CPU trace has no roofline (no GPU kernels, no device peaks)\n"
    assert said.out == "" and not out.exists()  # refused before the report, not after it
    # plot_next_to after a run that got that far: one line, no picture (a script refuses --plot on a CPU first)
    assert "no roofline" in plot.plot_next_to(it.load_trace(path), path) and not (tmp_path / "cpu.png").exists()


def test_bad_picture_paths_are_one_line_and_keep_the_old_file(tmp_path, capsys, monkeypatch):
    trace = str(DATA / "h200_linear_eager.json.gz")
    for bad in (tmp_path / "r.svg", tmp_path / "missing" / "r.png", tmp_path):
        assert it.main(["--plot", str(bad), trace]) != 0
        said = capsys.readouterr()
        assert len(said.err.strip().splitlines()) == 1 and said.out == ""  # before the report
    old = tmp_path / "old.png"
    old.write_bytes(b"earlier picture")

    def disk_full(self, fname, **kw):  # half a PNG, then the disk fills up
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    import matplotlib.figure
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    assert it.main(["--plot", str(old), trace]) != 0
    assert "No space left" in capsys.readouterr().err
    assert old.read_bytes() == b"earlier picture" and sorted(p.name for p in tmp_path.iterdir()) == ["old.png"]


def test_without_matplotlib_a_picture_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what a missing package looks like to import
    assert it.main(["--plot", str(tmp_path / "r.png"), str(DATA / "h200_linear_eager.json.gz")]) != 0
    assert "matplotlib is not installed" in capsys.readouterr().err
    line = plot.bench_chart_next_to(record(), tmp_path / "bench.json", "GeGLU MLP forward")
    assert line.startswith("chart not drawn: matplotlib is not installed") and not list(tmp_path.iterdir())


def test_a_folder_that_takes_no_file_is_one_line_before_the_report(tmp_path, capsys, monkeypatch):
    """--plot into a folder where nothing can be written (read-only, say): the one line comes before the report,
    not after all of it; nothing is drawn."""
    import errno
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    code = it.main(["--plot", str(tmp_path / "r.png"), str(DATA / "h200_linear_eager.json.gz")])
    said = capsys.readouterr()
    assert (code, said.out) == (2, "")
    assert said.err == f"inspect_trace.py: error: cannot write in {tmp_path}: Permission denied\n"


def test_reader_does_not_import_matplotlib_unless_drawing():
    code = "import sys, inspect_trace; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ------------------------------------------------------------------------------------------- benchmark chart

def record():
    return json.loads((ROOT / "results" / "bench_h200.json").read_text())


def test_bench_bars_are_the_records_numbers(tmp_path):
    rec = record()
    bars = plot.bench_bars(rec)
    assert len(bars) == len(rec["shapes"])
    for bar, shape in zip(bars, rec["shapes"]):
        assert bar["floor_us"] == pytest.approx(shape["floor_us"])
        for name, v in shape["variants"].items():
            assert bar["variants"][name]["us"] == pytest.approx(v["median_us"])
            assert bar["variants"][name]["of_floor"] == pytest.approx(shape["floor_us"] / v["median_us"])
    out = plot.bench_chart(rec, tmp_path / "b.png")
    with Image.open(out) as im:
        assert im.size == tuple(int(x * plot.DPI) for x in plot.bench_size(bars))
    assert plot.png_data(out) == bars


def test_bench_chart_takes_a_memory_floor_and_any_benchmarks_shapes(tmp_path):
    rec = record()
    shape, old = rec["shapes"][0], rec["shapes"][1]
    compute = shape.pop("floor_us")  # a record with the two floors only: the larger binds
    shape["floor_compute_us"], shape["floor_memory_us"] = compute, compute * 1.5
    old_floor = old["floor_us"]
    for key in [k for k in old if k.startswith("floor_") and k != "floor_us"]:
        del old[key]  # the first records had one floor, floor_us
    skipped = {"median_us": None}  # a variant that did not run is no bar
    attention = {"device": "NVIDIA H200", "dtype": "bf16", "shapes": [
        {"label": "prefill 4x2048, 32/8 heads, d128", "floor_us": 200.0,
         "variants": {"sdpa": {"median_us": 273.0}, "flex": {"median_us": 418.0}, "mem_efficient": skipped}}]}
    bars = plot.bench_bars(rec)
    assert bars[0]["floor_us"] == pytest.approx(compute * 1.5) and bars[1]["floor_us"] == old_floor
    att = plot.bench_bars(attention)
    assert att == [{"shape": "prefill 4x2048, 32/8 heads, d128", "floor_us": 200.0,
                    "variants": {"sdpa": {"us": 273.0, "of_floor": 200 / 273},
                                 "flex": {"us": 418.0, "of_floor": 200 / 418}}}]
    plot.bench_chart(attention, tmp_path / "a.png", "attention forward")
    assert plot.png_data(tmp_path / "a.png") == att
    for hostile in ({"shapes": []}, {"shapes": {"a": 1}}, {"shapes": [1, {"variants": [1]}, {"floor_us": "x"}]}):
        with pytest.raises(it.TraceError):
            plot.bench_chart(hostile, tmp_path / "none.png")
    assert plot.main(["--bench", str(tmp_path / "missing.json")]) == 2


def test_rates_keep_three_figures_in_a_unit_that_fits():
    assert [plot.flop_rate(x) for x in (707.3, 1.0, 0.999, 0.0523)] == [
        "707 TFLOP/s", "1 TFLOP/s", "999 GFLOP/s", "52.3 GFLOP/s"]
    assert [plot.byte_rate(x) for x in (4.2512, 1.0, 0.999, 0.0091)] == ["4.25 TB/s", "1.00 TB/s", "999 GB/s", "9.1 GB/s"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_pictures_get_the_mode_a_new_file_gets(tmp_path, umask, mode):
    """The umask's mode, as the traces beside them (0644 as a rule), not a temporary file's 0600."""
    old = os.umask(umask)
    try:
        plot.bench_chart(record(), tmp_path / "b.png")
        plot.plot_roofline([it.load_trace(DATA / "h200_linear_eager.json.gz")], tmp_path / "r.png")
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {"b.png": mode, "r.png": mode}


@pytest.mark.parametrize("name,what", [("bench_model_h200", "gemma-2b decoder, 4 layers"),
                                       ("bench_h200", "GeGLU MLP forward")])
def test_bench_chart_keeps_every_label_inside_the_picture(name, what):
    """Every legend entry (10 at bench_model's: the floor and 9 variants), every shape label and the title lie
    inside the figure, and neither the legend nor the title covers the bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rec = json.loads((ROOT / "results" / f"{name}.json").read_text())
    fig, bars = plot.bench_figure(rec, what)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # every text where the saved picture has it
    renderer = canvas.get_renderer()
    (legend,), (ax,) = fig.legends, fig.axes
    entries = [t.get_text() for t in legend.get_texts()]
    assert entries[0] == "the floor (1.0)" and sorted(entries[1:]) == sorted({n for b in bars for n in b["variants"]})
    inside = fig.bbox
    texts = [*legend.get_texts(), *ax.get_yticklabels(), *fig.texts]
    for t in texts:
        box = t.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, t
    axes = ax.get_window_extent(renderer)
    assert legend.get_window_extent(renderer).y0 >= axes.y1 and fig.texts[0].get_window_extent(renderer).y0 >= axes.y1


# ------------------------------------------------------------------------------------------ README's images

def readme_images():
    """(image path, the command that makes it) for each results/*.png the README or a docs page shows (a page under
    docs/ links it as ../results/; its commands run from the repository's root)."""
    text = all_text().replace("\\\n", " ")
    out = []
    for image in re.findall(r"!\[[^\]]*\]\((?:\.\./)?(results/[^)]+\.png)\)", text):
        commands = [shlex.split(line.split("#", 1)[0]) for line in text.splitlines()
                    if line.strip().startswith("uv run") and image in line]
        assert len(commands) == 1, f"README shows {image}: one `uv run` command must make it"
        out.append((image, commands[0][2:]))
    return out


def test_readme_shows_both_pictures():
    images = [image for image, _ in readme_images()]
    assert "results/bench_h200.png" in images and any("roofline" in i for i in images)


def to_last_bits(data, digits=12):
    """The data with every float rounded to `digits` significant digits: Python 3.12's sum() adds floats with
    compensation, 3.11's does not, so a share summed on one can differ from the other in its last bit."""
    if isinstance(data, float):
        return float(f"{data:.{digits}g}")
    if isinstance(data, dict):
        return {k: to_last_bits(v, digits) for k, v in data.items()}
    if isinstance(data, list):
        return [to_last_bits(v, digits) for v in data]
    return data


def test_to_last_bits_keeps_real_differences():
    assert to_last_bits({"a": [0.13135179989050097]}) == to_last_bits({"a": [0.13135179989050094]})
    assert to_last_bits({"a": [0.1313517998]}) != to_last_bits({"a": [0.1313517999]})
    assert to_last_bits({"a": ["x", 1]}) != to_last_bits({"a": ["y", 1]})


@pytest.mark.parametrize("image,argv", readme_images(), ids=[i for i, _ in readme_images()])
def test_readme_image_is_remade_from_committed_data(image, argv, tmp_path, monkeypatch):
    """Re-run the README's command into a temporary file: the committed PNG carries the same numbers."""
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository
    fresh = str(tmp_path / "fresh.png")
    argv = [fresh if a == image else a for a in argv]
    if argv[0] == "inspect_trace.py":
        assert it.main(argv[1:]) == 0
    else:
        assert argv[:3] == ["python", "-m", "trace_reader.plot"]
        assert plot.main(argv[3:]) == 0
    committed = ROOT / image
    assert to_last_bits(plot.png_data(committed)) == to_last_bits(plot.png_data(fresh))
    assert Image.open(committed).size == Image.open(fresh).size


# ------------------------------------------------------------------------------------------------ GPU only

@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", [[], ["--compile"]], ids=["eager", "compile"])
def test_script_plot_writes_the_roofline_next_to_its_trace(tmp_path, mode):
    """03_simple_mlp.py --plot on a GPU: <stem>.png beside <stem>.json, with GEMMs and pointwise kernels placed."""
    args = ["--batch", "8", "--seq", "128", "--dim", "768", "--hidden", "3072", "--device", "cuda", "--plot"]
    proc = subprocess.run([sys.executable, str(ROOT / "03_simple_mlp.py"), *args, *mode, "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = next((tmp_path / "03_simple_mlp").glob("*.json"))
    png = trace.with_suffix(".png")
    assert f"wrote {png}" in proc.stdout
    assert Image.open(png).size == ROOFLINE_PX
    data = plot.png_data(png)
    assert data == json.loads(json.dumps(plot.roofline_points(it.load_trace(trace)).data()))
    kinds = [p["kind"] for p in data["points"]]
    assert "GEMM" in kinds and "pointwise" in kinds  # gate/up/down may share one cuBLAS kernel: one point


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_writes_its_chart_next_to_its_record(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--shapes", "256x128x512", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"wrote {out.with_suffix('.png')}" in proc.stdout
    assert plot.png_data(out.with_suffix(".png")) == plot.bench_bars(json.loads(out.read_text()))
