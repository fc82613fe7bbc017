"""Pictures: a trace's roofline (one run, or two with arrows) and a benchmark's bars against its floor.

    uv run inspect_trace.py --plot roofline.png TRACE          # the kernels of a typical step on the roofline
    uv run inspect_trace.py --plot roofline.png A B            # both runs; arrows from replaced kernels
    uv run python -m trace_reader.plot --bench results/bench_h200.json --out results/bench_h200.png

The numbers come first and the drawing only draws them: roofline_points() takes the report's own per-kernel
groups (same FLOPs, bytes, rates and shares as the text report) and bench_bars() reads a benchmark record.
Each PNG also carries those numbers as JSON in its "Description" text chunk, so a test can check a committed
picture against the data it was drawn from. matplotlib is imported only when a picture is drawn.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..analyzers.report import kernel_groups
from ..comparison.pairing import match
from ..facts.format import fmt_num
from ..facts.kernels import gemm_bytes, gemm_flops, op_dtype, operand_index, pointwise_bytes, short
from ..facts.peaks import device_peak
from ..reading.events import Trace, TraceError
from ..reading.files import no_gc

DPI = 100
ROOFLINE_SIZE = (12, 9)  # inches: 1200 x 900 pixels, readable on a laptop screen
LIST_LINES = 11  # kernel lines that fit under the roofline; more are cut with "... and N more"
LABELS = 8  # points labelled on the chart, the largest shares first; the list under it names them all
# Pointwise FLOPs: one per element per op the kernel does, found in the launching op's name
# (aten::gelu = 1; LigerGELUMulFunction, triton_poi_fused__unsafe_view_gelu_mul_0 = 2).
POINTWISE_OP_WORDS = re.compile(r"gelu|silu|swish|relu|sigmoid|tanh|exp|log|mul|div|add|sub|neg|pow|sqrt|"
                                r"where|clamp|softmax|norm", re.I)


class NoRoofline(TraceError):
    """This trace has nothing a roofline can show (a CPU trace): one line for the reader."""


@dataclass
class Point:
    """One kernel (name, launching op) of the report's table, placed on the roofline."""

    number: int  # the report's "#" column
    name: str
    op: str
    kind: str  # "GEMM" or "pointwise"
    calls: float  # per step
    share: float  # of the steps' GPU time, 0..1
    flops: float  # per call
    bytes: float  # per call (a lower bound when lower_bound)
    flop_s: float  # achieved FLOP/s (GEMM: the report's TFLOP/s; pointwise: its GB/s times FLOPs per byte)
    achieved: str  # as the report prints it
    lower_bound: bool = False
    of_peak: float | None = None  # of the datasheet's compute (GEMM) or bandwidth (pointwise) peak, 0..1

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


@dataclass
class Roofline:
    path: str
    device: str | None
    dtype: str | None
    peak_tflops: float | None
    peak_gbs: float | None
    peak_source: str
    points: list[Point] = field(default_factory=list)
    not_placed: list[tuple[int, str, str, str, float]] = field(default_factory=list)  # #, name, op, why, share
    gemm_shapes: list[str] = field(default_factory=list)
    versions: str = ""

    def data(self) -> dict:
        """What the picture shows, as plain JSON (also written into the PNG)."""
        return {"path": self.path, "device": self.device, "dtype": self.dtype, "peak_tflops": self.peak_tflops,
                "peak_gbs": self.peak_gbs, "points": [asdict(p) for p in self.points],
                "not_placed": [list(x) for x in self.not_placed]}


def _ops_per_element(op_name: str) -> int:
    if op_name.startswith("aten::"):
        return 1
    return max(1, len({w.lower() for w in POINTWISE_OP_WORDS.findall(op_name)}))


def _elements(op) -> int:
    dims = op.args.get("Input Dims")
    sizes = [math.prod(d) for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)] \
        if isinstance(dims, list) else []
    return max(sizes, default=0)


def _versions(trace: Trace) -> str:
    out = []
    for key, label in (("cuda_runtime_version", "CUDA runtime"), ("cuda_driver_version", "driver")):
        v = trace.meta.get(key)
        if isinstance(v, int) and v > 0:
            out.append(f"{label} {v // 1000}.{v % 1000 // 10}")
    return ", ".join(out)


CPU_HAS_NO_ROOFLINE = "a CPU trace has no roofline (no GPU kernels, no device peaks)"


def roofline_points(trace: Trace) -> Roofline:
    """The kernels of a typical step, as the report counts them, placed at (FLOPs per byte, FLOP/s)."""
    if trace.device != "cuda":
        raise NoRoofline(f"{trace.path}: {CPU_HAS_NO_ROOFLINE}")
    groups = kernel_groups(trace)
    total = sum(sum(g["durs"]) for g in groups) or 1.0
    # A representative launch of each group, to read its op's shapes (the same in every step).
    first: dict[tuple, object] = {}
    for st in trace.steps:
        for k in st.gpu:
            first.setdefault((k.name, k.op.name if k.op is not None else "?"), k)
    peak = device_peak(trace.device_name)
    rf = Roofline(trace.path, trace.device_name, None, None, peak.gbs if peak else None,
                  peak.source if peak else "unknown (device not in the peak table)", versions=_versions(trace))
    gemm_dtype = None
    for number, g in enumerate(groups, 1):
        k = first[(g["name"], g["op"])]
        share = sum(g["durs"]) / total
        calls = len(g["durs"]) / max(len(trace.steps), 1)
        why = None
        if not k.is_kernel:
            why = "memory op, no math"
        elif not g["rates"] or k.op is None:
            why = "no shapes"
        point = None
        if why is None and g["unit"] == "TFLOP/s":
            flops, moved = gemm_flops(k.op), gemm_bytes(k.op)
            if flops is None and isinstance(k.op.args.get("kernel_flop"), (int, float)):
                flops = float(k.op.args["kernel_flop"])  # an Inductor Triton GEMM carries its own counts
            if moved is None and isinstance(k.op.args.get("kernel_num_gb"), (int, float)):
                moved = float(k.op.args["kernel_num_gb"]) * 1e9
            rate = statistics.mean(g["rates"])
            if (flops or 0) > 0 and (moved or 0) > 0 and rate > 0:
                point = Point(number, g["name"], g["op"], "GEMM", calls, share, flops, moved, rate * 1e12,
                              f"{fmt_num(rate)} TFLOP/s")
                rf.gemm_shapes.append(_gemm_shape(k.op))
        elif why is None:
            moved, exact = pointwise_bytes(k.op) or (0.0, True)
            flops = float(_elements(k.op) * _ops_per_element(g["op"]))
            rate = statistics.mean(g["rates"])
            if moved > 0 and flops > 0 and rate > 0:
                achieved = f"{fmt_num(rate)} GB/s" if exact else f">={fmt_num(rate)} GB/s"
                point = Point(number, g["name"], g["op"], "pointwise", calls, share, flops, moved,
                              rate * 1e9 * flops / moved, achieved, lower_bound=not exact)
        if point is not None:
            rf.points.append(point)
            rf.dtype = rf.dtype or op_dtype(k.op)
            if point.kind == "GEMM":
                gemm_dtype = gemm_dtype or op_dtype(k.op)
        else:
            rf.not_placed.append((number, g["name"], g["op"], why or "no shapes", share))
    rf.gemm_shapes = list(dict.fromkeys(s for s in rf.gemm_shapes if s))
    # The GEMMs' dtype picks the compute peak: a float32 norm launched before bf16 GEMMs must not make it fp32's.
    rf.dtype = gemm_dtype or rf.dtype
    if peak is not None and rf.dtype:
        rf.peak_tflops = peak.tflops.get(rf.dtype)
    for p in rf.points:
        if p.kind == "GEMM" and rf.peak_tflops:
            p.of_peak = p.flop_s / (rf.peak_tflops * 1e12)
        elif p.kind == "pointwise" and rf.peak_gbs:
            p.of_peak = p.flop_s / p.intensity / (rf.peak_gbs * 1e9)
    return rf


def _gemm_shape(op) -> str:
    dims = op.args.get("Input Dims") or []
    first = operand_index(op)
    try:
        a, b = dims[first], dims[first + 1]
        return "×".join(str(x) for x in ([a[0]] if len(a) == 3 else []) + [a[-2], a[-1], b[-1]])
    except (IndexError, TypeError):
        return ""


def _replacements(a: Trace, b: Trace) -> list[tuple[list[str], list[str]]]:
    """(A's kernel names, B's kernel names that took their place): the comparison's "replaced" list.

    The one place that knows compare.match's return shape; change it here if that shape changes."""
    return [(list(old), list(new)) for old, new in match(a, b).replaced]


# ---- drawing -------------------------------------------------------------------------------------------

def _arrows(rfs: list[Roofline], replaced: list[tuple[list[str], list[str]]]) -> list[tuple[str, str]]:
    """(A's kernel, B's kernel in its place) for each replacement whose kernels both have a point."""
    placed_a, placed_b = {p.name for p in rfs[0].points}, {p.name for p in rfs[1].points}
    arrows: list[tuple[str, str]] = []
    for old, new in replaced:
        arrows += [(o, n) for o in dict.fromkeys(old) for n in dict.fromkeys(new)
                   if o in placed_a and n in placed_b and (o, n) not in arrows]
    return arrows


def new_figure(size: tuple[float, float]):  # pragma: no mutate block (drawing)
    try:
        from matplotlib.figure import (
            Figure,  # the Agg canvas, no display and no pyplot state
        )
    except ImportError:
        raise TraceError("matplotlib is not installed (uv sync, or pip install matplotlib); "
                         "the numbers are in the text report") from None
    return Figure(figsize=size, dpi=DPI)


def check_drawable(traces: list[Trace], path: str | Path) -> None:
    """Raise TraceError (NoRoofline for a CPU trace) now if plot_roofline(traces, path) could not draw: so a
    command can refuse in one line before its report instead of after it."""
    for t in traces:
        if t.device != "cuda":
            raise NoRoofline(f"{t.path}: {CPU_HAS_NO_ROOFLINE}")
    check_png_path(path)


def check_png_path(path: str | Path) -> None:
    """TraceError now, before a report, if no PNG can be written at path: its name, its folder, and a folder that
    takes no file (read-only), tried the way save_png writes (a temporary folder beside it, made and removed)."""
    path = Path(path)
    _check_png_path(path)
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
    except OSError as e:
        raise TraceError(f"cannot write in {path.parent}: {e.strerror or e}") from None


def plot_ranks(data: dict, path: str | Path) -> Path:  # pragma: no mutate block (drawing)
    """One lane per rank (ranks.lanes' data): compute and communication side by side on the shared clock, so the
    rank that arrives last at a collective, and the communication nothing hides, can be seen."""
    lanes = data["ranks"]
    fig = new_figure((10, 1.2 + 0.6 * len(lanes)))
    ax = fig.add_subplot()
    for i, lane in enumerate(lanes):
        ax.broken_barh([(a, b - a) for a, b in lane["compute"]], (i - 0.35, 0.7), color="#4c72b0", label=None)
        ax.broken_barh([(a, b - a) for a, b in lane["comm"]], (i - 0.2, 0.4), color="#dd8452", label=None)
    ax.set_yticks(range(len(lanes)), [f"rank {lane['rank']}" for lane in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("µs from the first interval (the ranks' clocks aligned by their base times)")
    many = f"{len(lanes)} rank{'s' if len(lanes) != 1 else ''}"
    ax.set_title(f"{many}, {data['device_name'] or data['device']}: compute (blue), communication (orange)", fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, data)


def _check_png_path(path: Path) -> None:
    if path.suffix.lower() != ".png":
        raise TraceError(f"{path}: the picture is a PNG; give a file name ending in .png")
    if not path.parent.is_dir():
        raise TraceError(f"{path.parent}: no such folder for the picture")


def save_png(fig, path: str | Path, data) -> Path:
    """Write the PNG atomically (a failed write leaves any earlier file intact), with `data` inside it.

    Drawn into a temporary folder beside it, then moved into place: a file made there by open() gets the
    umask's mode (0644 as a rule), like the traces beside it, where mkstemp's would keep 0600."""
    path = Path(path)
    _check_png_path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
    except OSError as e:
        raise TraceError(f"cannot write in {path.parent}: {e.strerror or e}") from None
    try:
        # No "Software" line and no date: the same data gives the same file.
        fig.savefig(tmp / "picture.png", format="png",
                    metadata={"Software": None, "Description": json.dumps(data, sort_keys=True)})
        os.replace(tmp / "picture.png", path)  # atomic: the old picture or the new one, never half of one
    except OSError as e:
        raise TraceError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def png_data(path: str | Path):
    """The numbers a PNG written here was drawn from (its "Description" chunk)."""
    from PIL import Image

    with Image.open(path) as im:
        return json.loads(im.text["Description"])


def _label(p: Point, prefix: str = "") -> str:
    calls = f" ×{p.calls:.2g}" if p.calls != 1 else ""
    bound = " (bytes ≥: too far right)" if p.lower_bound else ""
    return f"{prefix}#{p.number} {short(p.op, False, 44)}{calls}, {100 * p.share:.0f}%{bound}"


def _line(p: Point, prefix: str = "") -> str:
    rate = p.achieved if p.kind == "GEMM" else f"{p.achieved} ({'>=' if p.lower_bound else ''}" \
                                                f"{fmt_num(p.flop_s / 1e12)} TFLOP/s)"
    of_peak = f" = {fmt_num(100 * p.of_peak)}% of peak" if p.of_peak is not None else ""
    return (f"{prefix}#{p.number:<2} {short(p.name, False, 54):<54} {p.op[:22]:<22} {fmt_num(p.intensity):>5} FLOP/B  "
            f"{rate}{of_peak}, {100 * p.share:.1f}% of GPU time")


def plot_roofline(traces: list[Trace], path: str | Path) -> Path:  # pragma: no mutate block (drawing)
    """One trace: its kernels on the device's roofline. Two (A, B): both, with arrows from A's replaced
    kernels to B's kernels in their place."""
    with no_gc():  # 10^5 small objects per trace: see read._no_gc
        rfs = [roofline_points(t) for t in traces]
        replaced = _replacements(traces[0], traces[1]) if len(traces) == 2 else []
    fig = new_figure(ROOFLINE_SIZE)
    ax = fig.add_axes((0.08, 0.34, 0.88, 0.56))
    ax.set_xscale("log")
    ax.set_yscale("log")
    base = rfs[0]
    pts = [p for rf in rfs for p in rf.points]
    xs = [p.intensity for p in pts] or [1.0]
    ys = [p.flop_s for p in pts] or [1e12]
    roof = base.peak_tflops * 1e12 if base.peak_tflops else None
    bw = base.peak_gbs * 1e9 if base.peak_gbs else None
    lo_x, hi_x = min(xs) / 4, max(xs) * 4
    if roof and bw:
        lo_x, hi_x = min(lo_x, roof / bw / 100), max(hi_x, roof / bw * 8)
    ax.set_xlim(lo_x, hi_x)
    # The whole slope in view: from where it leaves the left edge up to above the ceiling.
    ax.set_ylim(min(min(ys) / 4, lo_x * bw if bw else math.inf), max(ys + ([roof] if roof else [])) * 2.5)
    if roof and bw:
        ridge = roof / bw
        ax.plot([lo_x, ridge, hi_x], [lo_x * bw, roof, roof], color="black", lw=2)
        ax.axvline(ridge, color="grey", ls=":", lw=1)
        ax.text(ridge / 1.1, roof * 1.15, f"{base.dtype} compute ceiling {roof / 1e12:,.0f} TFLOP/s",
                ha="right", va="bottom", fontsize=10)
        # The slope's angle on screen, so its label lies along it.
        (x1, y1), (x2, y2) = ax.transData.transform([(lo_x, lo_x * bw), (ridge, roof)])
        mid = math.sqrt(lo_x * ridge) / 3
        ax.text(mid, mid * bw * 1.6, f"HBM bandwidth {bw / 1e9:,.0f} GB/s", rotation=math.degrees(
            math.atan2(y2 - y1, x2 - x1)), rotation_mode="anchor", ha="center", va="bottom", fontsize=10, clip_on=True)
        ax.text(ridge * 1.05, ax.get_ylim()[0] * 1.3, f"ridge {ridge:.0f} FLOP/B", fontsize=9, color="grey")
    elif roof:
        ax.axhline(roof, color="black", lw=2)
    colors = {"GEMM": "tab:blue", "pointwise": "tab:orange"}
    positions: dict[tuple[int, str], tuple[float, float]] = {}
    two = len(rfs) == 2
    middle = roof / bw if roof and bw else math.sqrt(lo_x * hi_x)
    labels = []
    for i, rf in enumerate(rfs):
        prefix = ("A", "B")[i] if two else ""
        b_names = {p.name for p in rfs[1].points} if two else set()
        for p in rf.points:
            hollow = two and i == 0
            area = 60 + 1400 * p.share  # points²
            ax.scatter([p.intensity], [p.flop_s], s=area, zorder=3,
                       facecolors="none" if hollow or p.lower_bound else colors[p.kind],
                       edgecolors=colors[p.kind], linewidths=2, alpha=0.9)
            positions[(i, p.name)] = (p.intensity, p.flop_s)
            if not (hollow and p.name in b_names):  # the same kernel in B carries the label
                # Left of the point past the ridge (room) and for A's points (B's go right).
                labels.append((hollow or p.intensity > middle, p.intensity, p.flop_s, _label(p, prefix),
                               math.sqrt(area) / 2 + 4, p.share))
    labels = sorted(labels, key=lambda lab: -lab[-1])[:LABELS]
    # Neighbours (two GEMMs, GeLU and mul) alternate below / above, so their labels keep apart.
    wanted = []
    for j, (left, x, y, text, dx, _) in enumerate(sorted(labels)):
        px, py = ax.transData.transform((x, y))
        dy = (-16 if j % 2 else 9) * DPI / 72  # pixels
        if dy > 0 and roof and ax.transData.transform((x, roof))[1] - py < 30:
            dy = -4 * DPI / 72  # above would cross the compute ceiling: beside the point instead
        wanted.append((py + dy, left, px, py, x, y, text, dx))
    # Top to bottom, a label that would sit on a neighbour's (same side, close by) moves down below it.
    placed: list[tuple[bool, float, float]] = []
    for ty, left, px, py, x, y, text, dx in sorted(wanted, key=lambda w: -w[0]):
        while clash := [y2 for s2, x2, y2 in placed if s2 == left and abs(x2 - px) < 150 and abs(y2 - ty) < 13]:
            ty = min(clash) - 13
        placed.append((left, px, ty))
        ax.annotate(text, (x, y), xytext=(-dx if left else dx, (ty - py) * 72 / DPI), textcoords="offset points",
                    fontsize=9, ha="right" if left else "left")
    arrows = _arrows(rfs, replaced) if two else []
    for o, n in arrows:
        ax.annotate("", xy=positions[(1, n)], xytext=positions[(0, o)],
                    arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 1.5})
    ax.set_xlabel("arithmetic intensity: FLOPs per byte moved (log)")
    ax.set_ylabel("achieved FLOP/s (log)")
    ax.grid(True, which="major", alpha=0.3)
    names = " → ".join(f"{'AB'[i] + ': ' if two else ''}{Path(rf.path).name}"
                       + (f" (on {rf.device}; peaks are A's)" if rf.device != base.device else "")
                       for i, rf in enumerate(rfs))
    steps = " and ".join(dict.fromkeys(str(len(t.steps)) for t in traces))
    shapes = list(dict.fromkeys(s for rf in rfs for s in rf.gemm_shapes))
    shapes = ", ".join(shapes[:4]) + (f" and {len(shapes) - 4} more" if len(shapes) > 4 else "") or "no GEMM shapes"
    fig.suptitle(f"Roofline per step (mean of {steps} active steps): {base.device or 'GPU'}, "
                 f"{base.dtype or 'dtype unknown'}\n"
                 f"{names}\nGEMMs (M×K×N) {shapes}; {base.versions or 'versions not in the trace'}",
                 fontsize=11)
    lines = [f"Peaks: {base.peak_source}. Marker area = share of the step's GPU time"
             + ("; hollow = A, filled = B, red arrow = replaced by" if two else "") + ".\n"
             "Pointwise FLOPs: one per element per op (GeLU 1, mul 1); the gap below the slope is the fraction of "
             "bandwidth whatever that count.\n>= : bytes a lower bound (a Triton kernel whose source is not here; "
             "drawn hollow)."]
    for i, rf in enumerate(rfs):
        prefix = ("A", "B")[i] if two else ""
        lines += [_line(p, prefix) for p in rf.points]
        lines += [f"{prefix}#{n:<2} not placed: {why}: {short(name, False, 54)} ({op}, {100 * share:.1f}%)"
                  for n, name, op, why, share in rf.not_placed]
    if len(lines) > LIST_LINES + 1:
        lines = lines[:LIST_LINES] + [f"... and {len(lines) - LIST_LINES} more: see the text report"]
    fig.text(0.02, 0.26, lines[0], fontsize=9, va="top")
    fig.text(0.02, 0.19, "\n".join(lines[1:]), fontsize=8.5, family="monospace", va="top")
    data = {"runs": [rf.data() for rf in rfs], "arrows": arrows} if two else rfs[0].data()
    return save_png(fig, path, data)


def plot_traces(traces: list[Trace], path: str | Path) -> str:
    """inspect_trace.py --plot: draw and say where; a CPU trace raises NoRoofline (one line)."""
    return f"wrote {plot_roofline(traces, path)}"


def plot_next_to(trace: Trace, trace_path: str | Path) -> str:
    """A script's --plot: the roofline next to the trace it wrote (<stem>.png); a line either way."""
    name = Path(trace_path).name.removesuffix(".gz").removesuffix(".json")
    try:  # a CPU run with --plot was refused before it started (common.setup)
        return f"wrote {plot_roofline([trace], Path(trace_path).with_name(name + '.png'))}"
    except TraceError as e:  # the run itself succeeded: say why there is no picture, keep the exit code
        return f"plot: not drawn: {e}"


# ---- benchmark chart -----------------------------------------------------------------------------------

def flop_rate(tflops: float) -> str:
    """A measured rate as a reader reads it: TFLOP/s from 1 up, GFLOP/s below (a CPU's 0.05 TFLOP/s is no "0")."""
    return f"{fmt_num(tflops)} TFLOP/s" if tflops >= 1 else f"{fmt_num(tflops * 1e3)} GFLOP/s"


def byte_rate(tbps: float) -> str:
    """Bandwidth likewise: TB/s from 1 up (4.25 TB/s), GB/s below (a CPU's copy: 9.1 GB/s, no "0.00 TB/s")."""
    return f"{tbps:.2f} TB/s" if tbps >= 1 else f"{fmt_num(tbps * 1e3)} GB/s"


def _floor_us(shape: dict) -> float | None:
    """The floor of one shape: the largest of its floor*_us fields (floor_us, floor_compute_us, floor_memory_us)."""
    floors = [v for k, v in shape.items() if k.startswith("floor") and k.endswith("_us")
              and isinstance(v, (int, float)) and v > 0]
    if isinstance(shape.get("floor"), dict):
        floors += [v for v in shape["floor"].values() if isinstance(v, (int, float)) and v > 0]
    return max(floors, default=None)


def _shape_label(shape: dict) -> str:
    if isinstance(shape.get("label"), str):
        return shape["label"]
    if all(isinstance(shape.get(k), int) for k in ("M", "dim", "hidden")):
        return f"{shape['M']}×{shape['dim']}→{shape['hidden']}"
    return "×".join(str(v) for k, v in shape.items() if isinstance(v, int) and k not in ("flops", "bytes"))


def bench_bars(record: dict) -> list[dict]:
    """Per shape: its label, floor (µs) and each timed variant's median µs and fraction of the floor."""
    out = []
    shapes = record.get("shapes")
    for shape in shapes if isinstance(shapes, list) else []:
        if not (isinstance(shape, dict) and isinstance(shape.get("variants"), dict)):
            continue
        floor = _floor_us(shape)
        variants = {str(name): v["median_us"] for name, v in shape["variants"].items()
                    if isinstance(v, dict) and isinstance(v.get("median_us"), (int, float)) and v["median_us"] > 0}
        if floor is None or not variants:
            continue
        out.append({"shape": _shape_label(shape), "floor_us": floor,
                    "variants": {n: {"us": t, "of_floor": floor / t} for n, t in variants.items()}})
        if isinstance(shape.get("bound"), str):
            out[-1]["bound"] = shape["bound"]  # "compute" or "memory": which floor binds
    return out


def bench_size(bars: list[dict]) -> tuple[float, float]:
    """Inches: 12 wide; tall enough for every bar to carry its numbers (a bar is 0.16 in)."""
    n_bars = sum(len(b["variants"]) for b in bars)
    return 12.0, round(1.9 + 0.16 * n_bars + 0.3 * len(bars), 2)


def bench_chart(record: dict, path: str | Path, what: str = "forward") -> Path:
    """Bars: every variant at every shape as a fraction of the floor (floor / median time; 1.0 = the floor).

    Any benchmark's record works: {"device", "dtype", "torch", ..., "shapes": [{"label" (or M, dim, hidden),
    "floor_us" (or several floor*_us: the largest binds), "bound", "variants": {name: {"median_us": ...}}}]}.
    """
    fig, bars = bench_figure(record, what)
    return save_png(fig, path, bars)


def bench_figure(record: dict, what: str):  # pragma: no mutate block (drawing)
    """(the chart's matplotlib Figure, the bars it draws): bench_chart before it is saved."""
    bars = bench_bars(record)
    if not bars:
        raise TraceError("the benchmark record has no shape with a floor and a timed variant: nothing to draw")
    width, height = bench_size(bars)
    fig = new_figure((width, height))
    ax = fig.add_axes((0.2, 0.85 / height, 0.77, 0.5))  # placed by _fit_bench_axes once the labels are measured
    names = list(dict.fromkeys(n for b in bars for n in b["variants"]))
    ticks, y = [], 0.0
    for b in bars:  # top to bottom, one group of bars per shape
        group = [n for n in names if n in b["variants"]]
        for n in group:
            v = b["variants"][n]
            ax.barh(-y, v["of_floor"], 0.85, color=f"C{names.index(n)}", label=n)
            ax.text(v["of_floor"] + 0.01, -y, f"{v['of_floor']:.2f}  ({v['us']:,.1f} µs)", va="center", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3}, zorder=3)  # legible over the floor
            y += 1
        bound = f", {b['bound']}" if b.get("bound") else ""
        ticks.append((-(y - 1 - (len(group) - 1) / 2), f"{b['shape']}\nfloor {b['floor_us']:,.1f} µs{bound}"))
        y += 0.9  # gap between shapes
    ax.set_yticks([t for t, _ in ticks], [label for _, label in ticks], fontsize=9)
    ax.set_ylim(-y + 0.5, 1.2)
    ax.axvline(1.0, color="black", lw=1.5, label="the floor (1.0)")
    ax.set_xlim(0, max([1.3] + [v["of_floor"] + 0.3 for b in bars for v in b["variants"].values()]))
    ax.set_xlabel("fraction of the floor (floor / median time): higher is better, 1.0 would be at the floor")
    ax.grid(True, axis="x", alpha=0.3)
    versions = ", ".join(f"{label} {record[k]}" for k, label in (("torch", "torch"), ("triton", "triton"),
                         ("cuda", "CUDA"), ("liger_kernel", "liger-kernel")) if record.get(k))
    ceilings = [flop_rate(record[k]) if unit == "gemm" else byte_rate(record[k])
                for k, unit in (("ceiling_tflops", "gemm"), ("copy_tbps", "copy"))
                if isinstance(record.get(k), (int, float)) and record[k] > 0]
    ceilings_text = f"; ceilings {' and '.join(ceilings)} measured in the same run" if ceilings else ""
    title = fig.suptitle(f"{what} vs its floor: {record.get('device', 'device?')}, {record.get('dtype', 'dtype?')}\n"
                         f"{versions}{ceilings_text}; {str(record.get('date', ''))[:10]}", fontsize=11,
                         y=1 - 0.12 / height, va="top")
    fig.text(0.02, 0.12 / height, "The same numbers are in the JSON record and the benchmark's printed table.",
             fontsize=9)
    _fit_bench_axes(fig, ax, title, bottom=0.85 / height)
    return fig, bars


def _fit_bench_axes(fig, ax, title, bottom: float) -> None:  # pragma: no mutate block (drawing)
    """Room for what lies outside the bars, measured rather than guessed: the shape labels on the left, and above,
    the title and under it a legend of as many rows as its entries need (one per variant, and the floor)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    width, height = fig.bbox.width, fig.bbox.height  # pixels
    gap = 0.1 * DPI
    under_title = (title.get_window_extent(renderer).y0 - gap) / height
    handles = {label: h for h, label in zip(*ax.get_legend_handles_labels())}

    def legend(ncols):
        return fig.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, under_title),
                          ncols=ncols, fontsize=9, frameon=False)

    for ncols in range(len(handles), 0, -1):  # the fewest rows that fit the figure's width
        drawn = legend(ncols)
        if drawn.get_window_extent(renderer).width <= width - 2 * gap:
            break
        drawn.remove()
    rows = -(-len(handles) // ncols)
    if -(-len(handles) // rows) < ncols:  # as many rows, evenly filled: 10 entries make 2 rows of 5, not 7 and 3
        drawn.remove()
        drawn = legend(-(-len(handles) // rows))
    left = max(t.get_window_extent(renderer).width for t in ax.get_yticklabels()) + 2 * gap  # and the tick marks
    top = (drawn.get_window_extent(renderer).y0 - gap) / height
    ax.set_position((left / width, bottom, 1 - left / width - 0.03, top - bottom))


def bench_chart_next_to(record: dict, record_path: str | Path, what: str) -> str:
    """bench.py's chart, <record>.png beside its JSON record; a line either way (the record is already written)."""
    try:
        return f"wrote {bench_chart(record, Path(record_path).with_suffix('.png'), what)}"
    except TraceError as e:
        return f"chart not drawn: {e}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trace_reader.plot", description="Draw a benchmark record's chart.")
    p.add_argument("--bench", type=Path, required=True, metavar="RECORD", help="a bench.py JSON record")
    p.add_argument("--out", type=Path, default=None, help="PNG to write (default: next to the record)")
    p.add_argument("--what", default="GeGLU MLP forward", help="what was timed, for the title")
    args = p.parse_args(argv)
    try:
        try:
            record = json.loads(args.bench.read_text())
        except (OSError, ValueError) as e:
            raise TraceError(f"{args.bench}: cannot read a JSON record ({e.__class__.__name__})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{args.bench}: not a benchmark record (expected a JSON object)")
        print(f"wrote {bench_chart(record, args.out or args.bench.with_suffix('.png'), args.what)}")
    except TraceError as e:
        print(f"python -m trace_reader.plot: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
