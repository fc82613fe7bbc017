"""Read a torch.profiler trace back: what ran, what launched it, how fast, and was the guess right.

    uv run inspect_trace.py traces/03_simple_mlp/64x128x768x3072_bf16_cold_eager.json
    uv run inspect_trace.py --full-names TRACE          # kernel names untruncated
    uv run inspect_trace.py EAGER.json COMPILED.json    # what changed between two runs
    uv run inspect_trace.py --open TRACE                # serve it to the Perfetto UI (local only)

One trace: device and versions; per active ProfilerStep, the GPU kernels in launch order with the CPU op
that launched each (via the "External id" / "correlation" links), calls per step, duration over the steps,
share of GPU time, achieved TFLOP/s (GEMMs, 2*M*K*N from the op's "Input Dims") or GB/s (pointwise, bytes
of inputs and outputs), against the device's datasheet peak; GPU busy vs step time (overhead- or
compute-bound); the view ops and their (zero) CUDA time; the occupancy queries before launches.
A CPU-only trace gets the CPU side instead: ops by self time, Inductor's fused C++ kernels.

Two traces: kernels with byte-for-byte the same name and their time change, kernels only in one of them,
which kernels replaced which (matched by position between name-matched anchors in the launch order, not
by name), CPU ops that disappeared or appeared, per-step GPU and CPU time side by side.

The scripts declare what the post says their trace should show (`Expect`, built with `steps()`,
`kernel()`, ...); `check()` reads the trace and says confirmed, broken or not applicable.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import contextlib
import difflib
import functools
import gc
import gzip
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

# ----------------------------------------------------------------------------------------------------------
# Reading the trace
# ----------------------------------------------------------------------------------------------------------

CPU_SPAN_CATS = {"cpu_op", "user_annotation"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
OCCUPANCY = "cudaOccupancyMaxActiveBlocksPerMultiprocessor"
# Views only rewrite sizes and strides: they should never launch a kernel.
VIEW_OPS = {
    "aten::t", "aten::transpose", "aten::reshape", "aten::view", "aten::as_strided", "aten::_unsafe_view",
    "aten::permute", "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::slice", "aten::select",
    "aten::alias", "aten::_reshape_alias", "aten::view_as", "aten::narrow", "aten::detach",
}
# Bookkeeping ops that neither compute nor launch: ignored when looking for the CPU's "kernels".
BOOKKEEPING_OPS = VIEW_OPS | {
    "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::lift_fresh", "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense",
}
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
GEMM_NAME_RE = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|_mm_|^triton_tem_fused_mm|matmul", re.I)
POINTWISE_NAME_RE = re.compile(r"elementwise|triton_poi_|pointwise|_geglu_|_swiglu_", re.I)
CPP_KERNEL_RE = re.compile(r"cpp_fused")
# Bytes per element of the dtypes the profiler writes in "Input type".
DTYPE_BYTES = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
DTYPE_NAMES = {"c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float64",
               "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2", "signed char": "int8"}


class TraceError(Exception):
    """Bad input: the message is one line, meant for the reader."""


class Event:
    """One complete ("ph": "X") event; spans also get their place in the CPU call tree."""

    __slots__ = ("name", "cat", "ts", "dur", "end", "pid", "tid", "args", "parent", "children", "calls",
                 "kernels", "step")

    def __init__(self, raw: dict):
        self.name = str(raw.get("name", ""))
        self.cat = raw.get("cat", "")
        self.ts = float(raw["ts"])
        self.dur = float(raw.get("dur") or 0.0)
        self.end = self.ts + self.dur
        self.pid = raw.get("pid")
        self.tid = raw.get("tid")
        args = raw.get("args")
        self.args = args if isinstance(args, dict) else {}
        self.parent: Event | None = None
        self.children: list[Event] = []
        self.calls: list[Event] = []  # runtime/driver calls made directly inside this op
        self.kernels: list[Kernel] = []  # GPU work launched directly inside this op
        self.step: Step | None = None

    @property
    def self_time(self) -> float:
        return self.dur - sum(c.dur for c in self.children)

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {self.cat}, ts={self.ts}, dur={self.dur})"


@dataclass
class Kernel:
    """GPU work (kernel, memcpy, memset) tied back to the CPU call that launched it."""

    event: Event
    launch: Event | None  # the cudaLaunchKernel / cuLaunchKernel call, via "correlation"
    op: Event | None  # the innermost CPU op or record_function span around the launch
    occupancy_query: bool  # cudaOccupancyMaxActiveBlocksPerMultiprocessor in the same op before this launch

    @property
    def name(self) -> str:
        return self.event.name

    @property
    def dur(self) -> float:
        return self.event.dur

    @property
    def order(self) -> float:
        return self.launch.ts if self.launch is not None else self.event.ts

    @property
    def is_kernel(self) -> bool:
        return self.event.cat == "kernel"


@dataclass
class Step:
    """One active ProfilerStep#k: its CPU span, the CPU spans inside it, the GPU work it launched."""

    number: int
    span: Event
    spans: list[Event] = field(default_factory=list)  # cpu_op / user_annotation inside, in time order
    gpu: list[Kernel] = field(default_factory=list)  # in launch order

    @property
    def kernels(self) -> list[Kernel]:
        return [k for k in self.gpu if k.is_kernel]

    @property
    def cpu_time(self) -> float:
        return self.span.dur

    @property
    def gpu_busy(self) -> float:
        """Union of the GPU work intervals: overlapping streams count once."""
        busy, cur_start, cur_end = 0.0, None, None
        for start, end in sorted((k.event.ts, k.event.end) for k in self.gpu):
            if cur_end is None or start > cur_end:
                if cur_end is not None:
                    busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        return busy + (cur_end - cur_start if cur_end is not None else 0.0)

    @property
    def wall(self) -> float:
        """From the step's start until both the CPU span and its last GPU work have ended."""
        end = max([self.span.end] + [k.event.end for k in self.gpu])
        return end - self.span.ts

    def ops(self, names: set[str] | None = None) -> list[Event]:
        return [e for e in self.spans if e.cat == "cpu_op" and (names is None or e.name in names)]


@dataclass
class Trace:
    path: str
    meta: dict  # top-level keys other than traceEvents
    steps: list[Step]
    device_props: list[dict]
    has_gpu_work: bool

    @property
    def device(self) -> str:
        """'cuda' when the trace holds GPU activity or launch calls, else 'cpu'.

        deviceProperties alone is not enough: a CPU-only profile on a GPU machine lists the GPU too.
        """
        return "cuda" if self.has_gpu_work else "cpu"

    @property
    def device_name(self) -> str | None:
        return self.device_props[0].get("name") if self.device_props else None


def _read_json(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if not p.is_file():
        raise TraceError(f"{p}: not a file")
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{p}: cannot read ({e.__class__.__name__}: {e}); truncated or not gzip?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not text JSON (binary content)") from None
    except json.JSONDecodeError as e:
        if not e.doc.strip():
            raise TraceError(f"{p}: empty file") from None
        raise TraceError(f"{p}: not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}); truncated file?") from None
    except RecursionError:
        raise TraceError(f"{p}: JSON nested too deeply to be a trace") from None


@contextlib.contextmanager
def _no_gc():
    """A trace is 10^5 small objects: the cyclic GC would rescan them again and again while we work."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def load_trace(path: str | Path, require_steps: bool = True) -> Trace:
    """Read a Chrome trace exported by torch.profiler (.json or .json.gz). Raises TraceError on bad input."""
    with _no_gc():
        data = _read_json(path)
        try:
            trace = parse_trace(data, str(path))
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # odd types where a trace has numbers
            raise TraceError(f"{path}: malformed trace ({type(e).__name__}: {e})") from None
    if require_steps and not trace.steps:
        raise TraceError(f"{path}: no ProfilerStep#N spans; profile with schedule(...) and call prof.step()")
    return trace


def parse_trace(data: object, path: str = "<trace>") -> Trace:
    """Build the Trace from the loaded JSON object (see load_trace)."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON, but not a torch.profiler trace (no 'traceEvents' list)")
    spans: list[Event] = []
    calls: list[Event] = []
    gpu: list[Event] = []
    wanted = CPU_SPAN_CATS | LAUNCH_CATS | GPU_CATS
    for raw in data["traceEvents"]:
        if not isinstance(raw, dict) or raw.get("ph") != "X" or raw.get("cat") not in wanted:
            continue
        try:
            ev = Event(raw)
        except (KeyError, TypeError, ValueError):
            continue  # an event without a usable timestamp cannot be placed; skip it
        cat = ev.cat
        (spans if cat in CPU_SPAN_CATS else calls if cat in LAUNCH_CATS else gpu).append(ev)

    _build_tree(spans)
    by_ext: dict[int, Event] = {}
    for s in spans:
        ext = s.args.get("External id")
        # The innermost span owns an id: a cpu_op wins over a user_annotation sharing it.
        if ext and (ext not in by_ext or s.cat == "cpu_op"):
            by_ext[ext] = s
    threads = _thread_index(spans)

    steps = [Step(int(m.group(1)), s) for s in spans
             if s.cat == "user_annotation" and (m := STEP_RE.match(s.name))]
    steps.sort(key=lambda st: st.span.ts)
    step_starts = [st.span.ts for st in steps]

    def step_at(ts: float) -> Step | None:
        i = bisect.bisect_right(step_starts, ts) - 1
        return steps[i] if i >= 0 and ts <= steps[i].span.end else None

    # CPU spans into their steps; spans is already sorted by time.
    for s in spans:
        st = step_at(s.ts)
        if st is not None and s is not st.span:
            s.step = st
            st.spans.append(s)

    # Runtime calls belong to the op they were made in: by "External id", else by time on their thread.
    by_corr: dict[object, Event] = {}
    calls.sort(key=lambda c: c.ts)
    for c in calls:
        owner = by_ext.get(c.args.get("External id")) or _innermost(threads, c)
        c.parent = owner
        if owner is not None:
            owner.calls.append(c)
        corr = c.args.get("correlation")
        if corr is not None:
            by_corr[corr] = c

    # A launch counts as "queried" if an occupancy query came in the same op since that op's previous launch.
    queried: set[int] = set()
    for owner in {id(c.parent): c.parent for c in calls if c.parent is not None}.values():
        pending = False
        for c in owner.calls:
            if c.name.startswith(OCCUPANCY):
                pending = True
            elif _launches(c):
                if pending:
                    queried.add(id(c))
                pending = False

    for g in gpu:
        launch = by_corr.get(g.args.get("correlation"))
        op = launch.parent if launch is not None else by_ext.get(g.args.get("External id"))
        k = Kernel(g, launch, op, launch is not None and id(launch) in queried)
        if op is not None:
            op.kernels.append(k)
        st = step_at(launch.ts) if launch is not None else (op.step if op is not None else step_at(g.ts))
        if st is not None:
            st.gpu.append(k)
    for st in steps:
        st.gpu.sort(key=lambda k: k.order)

    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    props = meta.get("deviceProperties")
    props = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    return Trace(path, meta, steps, props, bool(gpu or calls))


def _launches(call: Event) -> bool:
    return "Launch" in call.name or "launch" in call.name


def _build_tree(spans: list[Event]) -> None:
    """Nest spans per thread by time: a span's parent is the innermost one that contains it."""
    spans.sort(key=lambda e: (e.ts, -e.dur))
    stacks: dict[tuple, list[Event]] = defaultdict(list)
    for s in spans:
        stack = stacks[(s.pid, s.tid)]
        while stack and stack[-1].end < s.end:
            stack.pop()
        if stack:
            s.parent = stack[-1]
            stack[-1].children.append(s)
        stack.append(s)


def _thread_index(spans: list[Event]) -> dict[tuple, tuple[list[float], list[Event]]]:
    per: dict[tuple, list[Event]] = defaultdict(list)
    for s in spans:
        per[(s.pid, s.tid)].append(s)
    return {k: ([s.ts for s in v], v) for k, v in per.items()}


def _innermost(threads: dict, ev: Event) -> Event | None:
    """The innermost span on ev's thread that contains ev's start (bisect, then up the tree)."""
    entry = threads.get((ev.pid, ev.tid))
    if entry is None:
        return None
    starts, spans = entry
    i = bisect.bisect_right(starts, ev.ts) - 1
    node = spans[i] if i >= 0 else None
    while node is not None and node.end < ev.ts:
        node = node.parent
    return node


# ----------------------------------------------------------------------------------------------------------
# Derived numbers: FLOPs, bytes, peaks
# ----------------------------------------------------------------------------------------------------------

def _dims(op: Event) -> list:
    dims = op.args.get("Input Dims")
    return dims if isinstance(dims, list) else []


def _types(op: Event) -> list:
    types = op.args.get("Input type")
    return types if isinstance(types, list) else []


def gemm_flops(op: Event | None) -> float | None:
    """2*M*K*N (times the batch) from a matmul op's recorded input shapes; None when not a GEMM or no shapes."""
    if op is None or op.name not in GEMM_OPS:
        return None
    dims = _dims(op)
    first = 1 if op.name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation") else 0
    if len(dims) < first + 2:
        return None
    a, b = dims[first], dims[first + 1]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and len(a) in (2, 3)):
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    if b[-2] != k:
        return None
    return 2.0 * batch * m * k * n


def _numel(shape: list) -> int:
    return math.prod(int(d) for d in shape)


def _broadcast(shapes: list[list]) -> list:
    out: list = []
    for shape in shapes:
        shape = list(shape)
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        shape = [1] * (len(out) - len(shape)) + shape
        out = [max(a, b) for a, b in zip(out, shape)]
    return out


def pointwise_bytes(op: Event | None) -> tuple[float, bool] | None:
    """(bytes a pointwise op must move, exact?): its tensor inputs once, plus its output unless in place.

    The trace records inputs only; the output of an aten op (or an autograd Function such as Liger's) is
    the broadcast of its tensor inputs in the first input's dtype. An Inductor Triton launch lists every
    buffer, outputs included, as its inputs; a buffer it reads and writes back ("in_out_ptr") counts twice,
    which only the kernel's source says: without that file the count is a lower bound (exact=False).
    """
    if op is None:
        return None
    if isinstance(op.args.get("kernel_num_gb"), (int, float)) and op.args["kernel_num_gb"] > 0:
        return float(op.args["kernel_num_gb"]) * 1e9, True
    triton = op.name.startswith("triton_") or op.args.get("kernel_backend") == "triton"
    arg_names = _triton_arg_names(op) if triton else None
    total, tensors = 0, []
    for i, (d, t) in enumerate(zip(_dims(op), _types(op))):
        # 0-d tensors and scalars (xnumel) move nothing worth counting
        if isinstance(d, list) and d and t in DTYPE_BYTES and all(isinstance(x, int) for x in d):
            reads_and_writes = arg_names is not None and i < len(arg_names) and arg_names[i].startswith("in_out_ptr")
            total += _numel(d) * DTYPE_BYTES[t] * (2 if reads_and_writes else 1)
            tensors.append((d, DTYPE_BYTES[t]))
    if not tensors:
        return None
    in_place = op.name.endswith("_") or op.name.endswith(".out")
    if not (triton or in_place):
        total += _numel(_broadcast([d for d, _ in tensors])) * tensors[0][1]
    return float(total), not triton or arg_names is not None


_triton_sources: dict[str, str | None] = {}


def _triton_arg_names(op: Event) -> list[str] | None:
    """The Triton kernel's parameter names, from its Inductor source file if it is still on this machine."""
    path, name = op.args.get("kernel_file"), op.args.get("kernel_name", op.name)
    if not isinstance(path, str) or not path:
        return None
    if path not in _triton_sources:
        try:
            _triton_sources[path] = Path(path).read_text()
        except (OSError, UnicodeDecodeError):
            _triton_sources[path] = None
    m = re.search(rf"def {re.escape(str(name))}\(([^)]*)\)", _triton_sources[path] or "")
    return [a.split(":")[0].strip() for a in m.group(1).split(",")] if m else None


def op_dtype(op: Event | None) -> str | None:
    for t in _types(op) if op is not None else []:
        if t in DTYPE_NAMES:
            return DTYPE_NAMES[t]
    return None


@dataclass
class Peak:
    source: str
    tflops: dict[str, float]  # dense TFLOP/s per dtype name
    gbs: float | None


# torch's datasheet table has no H200 (torch 2.13); this suite runs on one. NVIDIA H200 SXM datasheet, dense
# (its tensor-core figures are quoted with 2:4 sparsity, so halved): bf16/fp16 1,979 -> 989.5 TFLOPS, 4.8 TB/s.
_SUPPLEMENT = {"NVIDIA H200": Peak(
    "NVIDIA H200 datasheet (not in torch's table)",
    {"bfloat16": 989.5, "float16": 989.5, "tf32": 494.5, "float32": 67.0, "float64": 67.0,
     "float8_e4m3fn": 1979.0, "float8_e5m2": 1979.0, "int8": 1979.0},
    4800.0)}
_torch_table: dict[str, Peak] | None = None


def _read_torch_table() -> dict[str, Peak]:
    """torch/_inductor/analysis/device_info.py's _device_mapping, read as source (no torch import).

    Importing torch._inductor takes seconds; the table is plain literals, so ast reads it in milliseconds.
    Any change in that private file just means "peak unknown".
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "_inductor" / "analysis" / "device_info.py"
    tree = ast.parse(path.read_text())
    table: dict[str, Peak] = {}
    for node in ast.walk(tree):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not isinstance(value, ast.Dict) or not any(getattr(t, "id", "") == "_device_mapping" for t in targets):
            continue
        for key, call in zip(value.keys, value.values):
            if not (isinstance(key, ast.Constant) and isinstance(call, ast.Call)):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            factor = ast.literal_eval(kw["tops_sparsity_factor"]) if "tops_sparsity_factor" in kw else 1
            tops = {}
            if isinstance(kw.get("tops"), ast.Dict):
                for dk, dv in zip(kw["tops"].keys, kw["tops"].values):
                    # keys are torch.bfloat16 (an attribute) or the string "torch.tf32"
                    name = dk.attr if isinstance(dk, ast.Attribute) else str(getattr(dk, "value", ""))
                    tops[name.removeprefix("torch.")] = ast.literal_eval(dv) / factor
            gbs = ast.literal_eval(kw["dram_bw_gbs"]) if "dram_bw_gbs" in kw else None
            table[key.value.upper()] = Peak("torch._inductor.analysis.device_info", tops, gbs)
    # aliases: _device_mapping["AMD INSTINCT MI300X"] = _device_mapping["AMD MI300X"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == "_device_mapping":
                    alias, source = ast.literal_eval(t.slice), ast.literal_eval(node.value.slice)
                    if source.upper() in table:
                        table[alias.upper()] = table[source.upper()]
    return table


def device_peak(name: str | None) -> Peak | None:
    """Datasheet peak for a device name: torch's table first (longest matching prefix), then ours."""
    global _torch_table
    if not name:
        return None
    if _torch_table is None:
        try:
            _torch_table = _read_torch_table()
        except Exception:  # noqa: BLE001 - a private file moved or changed: peaks become unknown
            _torch_table = {}
    upper = name.upper()
    # Device names carry suffixes ("NVIDIA H100 80GB HBM3"); the table is keyed by the family name.
    for table in (_torch_table, {k.upper(): v for k, v in _SUPPLEMENT.items()}):
        matches = [k for k in table if upper == k or upper.startswith(k + " ")]
        if matches:
            return table[max(matches, key=len)]
    return None


# ----------------------------------------------------------------------------------------------------------
# Per-step structure shared by the report, the comparison and the expectations
# ----------------------------------------------------------------------------------------------------------

def is_gemm(k: Kernel) -> bool:
    if k.op is not None and k.op.name in GEMM_OPS:
        return True
    return _gemm_name(k.name)


@functools.lru_cache(maxsize=4096)
def _gemm_name(name: str) -> bool:
    """By name, for GEMMs launched outside an aten matmul op (cached: templated names run to 1000s of chars)."""
    return bool(GEMM_NAME_RE.search(name)) and not POINTWISE_NAME_RE.search(name)


def is_pointwise(k: Kernel) -> bool:
    return k.is_kernel and not is_gemm(k)


def cpu_kernels(step: Step) -> list[Event]:
    """The CPU's "kernels": Inductor's fused C++ kernels and aten ops that compute without a computing child."""
    out = []
    for e in step.spans:
        if CPP_KERNEL_RE.search(e.name):
            out.append(e)
        elif (e.cat == "cpu_op" and e.name.startswith("aten::") and e.name not in BOOKKEEPING_OPS
              and all(c.name in BOOKKEEPING_OPS for c in e.children)):
            out.append(e)
    return out


def units(trace: Trace, step: Step) -> list[tuple[str, float]]:
    """(name, µs) of the step's units of work in launch order: GPU kernels, or the CPU's kernels."""
    if trace.device == "cuda":
        return [(k.name, k.dur) for k in step.kernels]
    return [(e.name, e.dur) for e in cpu_kernels(step)]


def typical_sequence(trace: Trace) -> list[str]:
    """The most common launch order of the steps (a warm-up straggler does not decide the structure)."""
    seqs = Counter(tuple(n for n, _ in units(trace, st)) for st in trace.steps)
    return list(seqs.most_common(1)[0][0]) if seqs else []


def _view_cuda_time(op: Event) -> tuple[int, float]:
    """Kernels launched by this op or anything it called, and their total time."""
    n, t = 0, 0.0
    todo = [op]
    while todo:
        e = todo.pop()
        n += len(e.kernels)
        t += sum(k.dur for k in e.kernels)
        todo.extend(e.children)
    return n, t


# ----------------------------------------------------------------------------------------------------------
# Text output
# ----------------------------------------------------------------------------------------------------------

def _table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    """A plain-text table: reads the same in a terminal, a pipe or a file."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(r):
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def short(name: str, full: bool, width: int = 72) -> str:
    """A kernel name that fits a column; full=True gives it back byte for byte."""
    if full:
        return name
    name = name.removeprefix("void ")
    if len(name) <= width:
        return name
    # Templated ATen kernels differ only deep inside: keep the kernel and the functor that names the math,
    # e.g. vectorized_elementwise_kernel<…MulFunctor…>.
    base = re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1]
    functors = [f for f in dict.fromkeys(re.findall(r"(\w+(?:Functor|Impl)\w*)", name))
                if not f.startswith(("Binary", "AUnary", "BUnary", "Unary"))]
    if base and functors:
        cut = f"{base}<…{functors[0]}…>"
        if len(cut) <= width:
            return cut
    return name[: width - 1] + "…"


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _num(x: float) -> str:
    """Three significant figures at most, so a tiny GEMM reads 0.27, not 0."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2g}"


def _spread(values: list[float]) -> str:
    return f"{_us(min(values))}–{_us(max(values))}" if len(values) > 1 else "-"


def _header(trace: Trace) -> list[str]:
    out = [f"trace   {trace.path}"]
    if trace.device == "cuda" and trace.device_props:
        p = trace.device_props[0]
        extra = []
        if "computeMajor" in p:
            extra.append(f"sm_{p.get('computeMajor')}{p.get('computeMinor', '')}")
        if "numSms" in p:
            extra.append(f"{p['numSms']} SMs")
        if isinstance(p.get("totalGlobalMem"), (int, float)):
            extra.append(f"{p['totalGlobalMem'] / 2**30:.0f} GiB")
        out.append(f"device  {p.get('name', '?')}" + (f" ({', '.join(extra)})" if extra else ""))
    elif trace.device == "cuda":
        out.append("device  a GPU (no deviceProperties in the trace)")
    else:
        gpu = f"; the machine has {trace.device_name}, not profiled" if trace.device_name else ""
        out.append(f"device  CPU only (no GPU activity in the trace{gpu})")
    versions = [f"{k}={v}" for k, v in trace.meta.items()
                if ("version" in k.lower() or k.lower() in ("torch", "triton")) and isinstance(v, (str, int, float))]
    if versions:
        out.append("versions " + ", ".join(versions))
    nums = ", ".join(f"#{st.number}" for st in trace.steps)
    out.append(f"steps   {len(trace.steps)} active ProfilerStep ({nums})")
    return out


def report(trace: Trace, full_names: bool = False) -> str:
    """The one-trace report, as plain text."""
    with _no_gc():
        return _report(trace, full_names)


def _report(trace: Trace, full_names: bool) -> str:
    lines = _header(trace)
    if not trace.steps:
        return "\n".join(lines + ["no active ProfilerStep#N spans: nothing to report per step"])
    lines.append("")
    lines += _report_gpu(trace, full_names) if trace.device == "cuda" else _report_cpu(trace, full_names)
    return "\n".join(lines)


def _group(trace: Trace) -> list[dict]:
    """Kernels grouped by (name, launching op) in first-launch order, with their per-call numbers."""
    groups: dict[tuple, dict] = {}
    peak = device_peak(trace.device_name)
    for st in trace.steps:
        for k in st.gpu:
            key = (k.name, k.op.name if k.op is not None else "?")
            g = groups.setdefault(key, {"name": k.name, "op": key[1], "durs": [], "rates": [], "unit": None,
                                        "peak": None})
            g["durs"].append(k.dur)
            op = k.op
            # The op's work is spread over all the kernels it launched (e.g. a split-K GEMM's two kernels);
            # a workspace memset is not part of the math.
            op_time = sum(x.dur for x in op.kernels if x.is_kernel) if op is not None else 0.0
            if not k.is_kernel or op_time <= 0:
                continue
            flops = gemm_flops(op) if is_gemm(k) else None
            if flops is None and is_gemm(k) and isinstance(op.args.get("kernel_flop"), (int, float)):
                flops = float(op.args["kernel_flop"])  # an Inductor Triton GEMM carries its own count
            if flops is not None:
                g["unit"] = "TFLOP/s"
                g["rates"].append(flops / op_time / 1e6)
                if peak is not None:
                    g["peak"] = peak.tflops.get(op_dtype(op) or "")
            elif is_pointwise(k) and (moved := pointwise_bytes(op)) is not None:
                g["unit"] = "GB/s" if moved[1] else "GB/s+"  # "+": a lower bound, see pointwise_bytes
                g["rates"].append(moved[0] / op_time / 1e3)
                if peak is not None:
                    g["peak"] = peak.gbs
    return list(groups.values())


def _report_gpu(trace: Trace, full: bool) -> list[str]:
    n = len(trace.steps)
    groups = _group(trace)
    total = sum(sum(g["durs"]) for g in groups) or 1.0
    peak = device_peak(trace.device_name)
    rows, lower_bound = [], False
    for i, g in enumerate(groups, 1):
        rate = statistics.mean(g["rates"]) if g["rates"] else None
        achieved = "-" if rate is None else f"{_num(rate)} {g['unit']}"
        if g["unit"] == "GB/s+":
            achieved, lower_bound = f">={_num(rate)} GB/s", True
        of_peak = "unknown" if rate is not None and not g["peak"] else "-"
        if rate is not None and g["peak"]:
            of_peak = f"{_num(100 * rate / g['peak'])}% of {g['peak']:,.0f}"
        calls = len(g["durs"]) / n
        rows.append([i, short(g["name"], full), g["op"], f"{calls:g}", _us(statistics.mean(g["durs"])),
                     _spread(g["durs"]), f"{100 * sum(g['durs']) / total:.1f}%", achieved, of_peak])
    out = [f"GPU work per step, in launch order (mean over {n} steps; µs per call):"]
    out.append(_table(["#", "kernel", "launched by", "calls/step", "mean µs", "min–max", "GPU share",
                       "achieved", "of peak"], rows, right={0, 3, 4, 5, 6, 7}))
    if lower_bound:
        out.append(">= : Triton kernel whose source is not on this machine; a buffer it reads and writes "
                   "(in_out_ptr) counted once")
    src = peak.source if peak else "unknown (device not in torch's datasheet table)"
    out.append(f"peak: {trace.device_name or '?'}: {src}")
    orders = Counter(tuple(k.name for k in st.kernels) for st in trace.steps)
    if len(orders) == 1:
        out.append(f"every step launches the same {len(next(iter(orders)))} kernels in the same order")
    else:
        out.append("steps differ: " + ", ".join(f"#{st.number}: {len(st.kernels)} kernels" for st in trace.steps))

    out.append("")
    out.append("Step time (µs): GPU busy vs step wall time (CPU span until the last GPU work ends)")
    srows = []
    for st in trace.steps:
        busy, wall = st.gpu_busy, st.wall
        srows.append([f"#{st.number}", len(st.kernels), _us(busy), _us(st.cpu_time), _us(wall),
                      f"{100 * busy / wall:.0f}%" if wall else "-"])
    out.append(_table(["step", "kernels", "GPU busy", "CPU span", "wall", "GPU busy/wall"], srows,
                      right={1, 2, 3, 4, 5}))
    b = bound_of(trace)
    if b is not None:
        kind, frac = b
        why = ("the GPU waits on the CPU to launch work: fewer, bigger kernels (or CUDA graphs) help"
               if kind == "overhead" else "the GPU is the bottleneck: faster kernels help, launch overhead does not")
        out.append(f"=> {kind}-bound: GPU busy {100 * frac:.0f}% of the step; {why}")

    views: dict[str, list] = {}
    for st in trace.steps:
        for op in st.ops(VIEW_OPS):
            nk, t = _view_cuda_time(op)
            v = views.setdefault(op.name, [0, 0, 0.0])
            v[0] += 1
            v[1] += nk
            v[2] += t
    out.append("")
    if views:
        out.append("View ops (no data moved, so no kernel expected):")
        out.append(_table(["op", "calls/step", "kernels", "CUDA µs"],
                          [[k, f"{v[0] / n:g}", v[1], _us(v[2])] for k, v in sorted(views.items())],
                          right={1, 2, 3}))
    else:
        out.append("View ops: none in the active steps")

    launches = [k for st in trace.steps for k in st.kernels if k.launch is not None]
    out.append("")
    out.append(f"Launches preceded by {OCCUPANCY} (in the same op):")
    orows = []
    for label, pick in (("GEMM", is_gemm), ("pointwise/other", is_pointwise)):
        sel = [k for k in launches if pick(k)]
        if sel:
            api = ", ".join(sorted({k.launch.name for k in sel}))
            orows.append([label, f"{sum(k.occupancy_query for k in sel)}/{len(sel)}", api])
    out.append(_table(["kernels", "with query", "launch call"], orows) if orows else "no linked launches")
    return out


def _report_cpu(trace: Trace, full: bool) -> list[str]:
    n = len(trace.steps)
    per_op: dict[str, list[float]] = defaultdict(list)
    calls: Counter = Counter()
    for st in trace.steps:
        totals: dict[str, float] = defaultdict(float)
        for e in st.spans:
            totals[e.name] += e.self_time
            calls[e.name] += 1
        for name, t in totals.items():
            per_op[name].append(t)
    all_self = sum(sum(v) for v in per_op.values()) or 1.0
    ranked = sorted(per_op.items(), key=lambda kv: -sum(kv[1]))
    rows = [[short(name, full), f"{calls[name] / n:g}", _us(sum(v) / n), _spread(v), f"{100 * sum(v) / all_self:.1f}%"]
            for name, v in ranked[:20]]
    out = [f"CPU ops by self time per step (mean over {n} steps; top {len(rows)} of {len(ranked)}):"]
    out.append(_table(["op", "calls/step", "self µs/step", "min–max", "share"], rows, right={1, 2, 3, 4}))
    seq = typical_sequence(trace)
    out.append("")
    out.append("Work in order (the CPU's kernels: fused C++ kernels and computing aten ops):")
    # Per position over the steps that ran in the typical order, so two calls of one op stay apart.
    durs: list[list[float]] = [[] for _ in seq]
    for st in trace.steps:
        work = cpu_kernels(st)
        if [e.name for e in work] == seq:
            for i, e in enumerate(work):
                durs[i].append(e.dur)
    out.append(_table(["#", "kernel", "mean µs", "min–max"],
                      [[i + 1, short(name, full), _us(statistics.mean(durs[i])), _spread(durs[i])]
                       for i, name in enumerate(seq)], right={0, 2, 3}))
    fused = sorted({e.name for st in trace.steps for e in st.spans if CPP_KERNEL_RE.search(e.name)})
    out.append("Inductor C++ kernels: " + (", ".join(fused) if fused else
                                           "none (eager, or compiled without cpp.enable_kernel_profile)"))
    out.append("")
    out.append(_table(["step", "CPU span µs"], [[f"#{st.number}", _us(st.cpu_time)] for st in trace.steps],
                      right={1}))
    return out


# ----------------------------------------------------------------------------------------------------------
# Comparing two traces
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Comparison:
    same: list[str]  # names present in both, byte for byte
    only_a: list[str]
    only_b: list[str]
    replaced: list[tuple[list[str], list[str]]]  # A's kernels between two anchors -> B's kernels there
    ops_gone: dict[str, float]  # CPU op -> calls per step in A, absent from B
    ops_new: dict[str, float]


def _per_step_time(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    t: dict[str, float] = defaultdict(float)
    for st in trace.steps:
        for name, dur in units(trace, st):
            t[name] += dur / n
    return t


def _op_calls(trace: Trace) -> dict[str, float]:
    n = max(len(trace.steps), 1)
    c: Counter = Counter(e.name for st in trace.steps for e in st.spans if not STEP_RE.match(e.name))
    return {k: v / n for k, v in c.items()}


def match(a: Trace, b: Trace) -> Comparison:
    """Which kernels are the same, which are gone, which replaced which (structure first, names as anchors)."""
    sa, sb = typical_sequence(a), typical_sequence(b)
    names_a, names_b = set(_per_step_time(a)), set(_per_step_time(b))
    replaced = []
    sm = difflib.SequenceMatcher(a=sa, b=sb, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        # Between two anchors (runs of identical names), A's kernels were replaced by B's.
        if tag == "replace":
            replaced.append((sa[i1:i2], sb[j1:j2]))
        elif tag == "delete" and (i1 > 0 and i2 < len(sa)):
            replaced.append((sa[i1:i2], []))
        elif tag == "insert" and (j1 > 0 and j2 < len(sb)):
            replaced.append(([], sb[j1:j2]))
    ca, cb = _op_calls(a), _op_calls(b)
    return Comparison(
        same=[n for n in dict.fromkeys(sa + sorted(names_a)) if n in names_b],
        only_a=[n for n in dict.fromkeys(sa + sorted(names_a)) if n not in names_b],
        only_b=[n for n in dict.fromkeys(sb + sorted(names_b)) if n not in names_a],
        replaced=replaced,
        ops_gone={k: v for k, v in ca.items() if k not in cb},
        ops_new={k: v for k, v in cb.items() if k not in ca},
    )


def compare(a: Trace, b: Trace, full_names: bool = False) -> str:
    """The two-trace report, as plain text (A = before, B = after)."""
    with _no_gc():
        return _compare(a, b, full_names)


def _compare(a: Trace, b: Trace, full_names: bool) -> str:
    m = match(a, b)
    ta, tb = _per_step_time(a), _per_step_time(b)
    what = "GPU kernels" if a.device == "cuda" and b.device == "cuda" else "units of work (CPU kernels)"
    if a.device != b.device:
        what += f" -- note: A is a {a.device} trace, B a {b.device} trace"
    def where(t: Trace) -> str:
        return (t.device_name or "GPU") if t.device == "cuda" else "CPU"

    out = [f"A  {a.path}  ({where(a)}, {len(a.steps)} steps)",
           f"B  {b.path}  ({where(b)}, {len(b.steps)} steps)", ""]

    rows = []
    for i in range(max(len(a.steps), len(b.steps))):
        cells = []
        for t in (a, b):
            st = t.steps[i] if i < len(t.steps) else None
            cells += [f"#{st.number}" if st else "", _us(st.gpu_busy) if st and t.device == "cuda" else "-",
                      _us(st.cpu_time) if st else "-"]
        rows.append(cells)
    mean = []
    for t in (a, b):
        mean += ["mean", _us(statistics.mean(st.gpu_busy for st in t.steps)) if t.device == "cuda" and t.steps
                 else "-", _us(statistics.mean(st.cpu_time for st in t.steps)) if t.steps else "-"]
    rows.append(mean)
    out.append("Per step (µs): GPU busy and CPU span, side by side")
    out.append(_table(["A step", "A GPU", "A CPU", "B step", "B GPU", "B CPU"], rows, right={1, 2, 4, 5}))

    out.append("")
    out.append(f"{what}: same name in both (µs per step)")
    out.append(_table(["name", "A", "B", "change"],
                      [[short(n, full_names), _us(ta[n]), _us(tb[n]), _change(ta[n], tb[n])] for n in m.same],
                      right={1, 2, 3}) if m.same else "(none)")
    out.append("")
    out.append("Replaced (matched by position between anchors in the launch order, not by name):")
    if m.replaced:
        for old, new in m.replaced:
            t_old, t_new = sum(ta[n] for n in set(old)), sum(tb[n] for n in set(new))
            out.append(f"  {' + '.join(short(n, full_names) for n in old) or '(nothing at this position)'}")
            out.append(f"    -> {' + '.join(short(n, full_names) for n in new) or '(nothing at this position)'}"
                       f"   {_us(t_old)} -> {_us(t_new)} µs per step ({_change(t_old, t_new)})")
    else:
        out.append("  (none)")
    for label, names, t in (("Only in A", m.only_a, ta), ("Only in B", m.only_b, tb)):
        out.append("")
        out.append(f"{label}:" + ("" if names else " (none)"))
        for n in names:
            out.append(f"  {_us(t[n]):>8} µs/step  {short(n, full_names)}")
    for label, ops in (("CPU ops gone in B", m.ops_gone), ("CPU ops new in B", m.ops_new)):
        out.append("")
        out.append(f"{label}:" + ("" if ops else " (none)"))
        for name, calls in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {calls:g}/step  {short(name, full_names)}")
    return "\n".join(out)


def _change(old: float, new: float) -> str:
    if old <= 0:
        return "new"
    return f"{100 * (new - old) / old:+.0f}%"


# ----------------------------------------------------------------------------------------------------------
# Expectations: guess first, then look
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Expect:
    text: str  # the guess, in the post's words
    check: Callable[[Trace], bool | str]  # True = confirmed; False or a str (what was seen instead) = broken
    device: str = "any"  # "any", "cuda" (GPU-only: "not applicable" on a CPU trace) or "cpu"


def _need_steps(trace: Trace) -> str | None:
    return None if trace.steps else "no active steps in the trace"


def steps(n: int, annotation: str) -> Expect:
    def run(t: Trace):
        if len(t.steps) != n:
            return f"{len(t.steps)} active steps"
        for st in t.steps:
            if not any(e.cat == "user_annotation" and e.name == annotation for e in st.spans):
                return f"ProfilerStep#{st.number} has no '{annotation}' span"
        return True
    return Expect(f"{n} active ProfilerStep#k spans, each around a '{annotation}' record_function", run)


def kernels_per_step(n: int, what: str = "") -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [len(st.kernels) for st in t.steps]
        return True if all(c == n for c in counts) else f"kernels per step: {counts}"
    return Expect(f"{n} GPU kernel{'s' if n != 1 else ''} per step" + (f" ({what})" if what else ""), run, "cuda")


def kernel(pattern: str, per_step: int | None = None, what: str = "") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for k in st.kernels if rx.search(k.name)) for st in t.steps]
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        if ok:
            return True
        seen = sorted({short(k.name, False, 60) for st in t.steps for k in st.kernels})
        return f"matches per step: {counts}; kernels seen: {seen}"
    times = f", {per_step}x per step" if per_step is not None else " in every step"
    return Expect(f"a GPU kernel matching /{pattern}/{times}" + (f" ({what})" if what else ""), run, "cuda")


def cpu_op(name: str, present: bool = True, per_step: int | None = None) -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if e.cat == "cpu_op" and e.name == name) for st in t.steps]
        if not present:
            return True if not any(counts) else f"'{name}' per step: {counts}"
        ok = all(c == per_step for c in counts) if per_step is not None else all(c > 0 for c in counts)
        return True if ok else f"'{name}' per step: {counts}"
    if not present:
        text = f"no '{name}' op"
    else:
        text = f"'{name}' " + (f"{per_step}x per step" if per_step is not None else "in every step")
    return Expect(text, run)


def cpu_event(pattern: str, device: str = "cpu") -> Expect:
    rx = re.compile(pattern)

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        counts = [sum(1 for e in st.spans if rx.search(e.name)) for st in t.steps]
        return True if all(counts) else f"matching CPU events per step: {counts}"
    return Expect(f"a CPU event matching /{pattern}/ in every step", run, device)


def occupancy_before_gemms() -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        launched = [k for st in t.steps for k in st.kernels]
        gemms = [k for k in launched if is_gemm(k)]
        if not gemms:
            return "no GEMM kernels in the active steps"
        if any(k.launch is None for k in gemms):  # without the launch call, "before it" means nothing
            return f"{sum(k.launch is None for k in gemms)} GEMM kernels have no linked launch call"
        bare = [k for k in gemms if not k.occupancy_query]
        queried = [k for k in launched if not is_gemm(k) and k.occupancy_query]
        if bare or queried:
            # Say what the GEMM ops called instead: that is where to look next.
            seen = sorted({c.name for k in bare for c in k.op.calls} if bare else set())
            return (f"GEMM launches without the query: {len(bare)}/{len(gemms)}"
                    + (f" (their ops call: {', '.join(seen)})" if seen else "")
                    + f"; non-GEMM launches with it: {len(queried)}"
                    + (f" ({short(queried[0].name, False, 50)})" if queried else ""))
        return True
    return Expect(f"every GEMM launch is preceded by {OCCUPANCY}; pointwise launches are bare", run, "cuda")


def views_launch_nothing() -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        views = [op for st in t.steps for op in st.ops(VIEW_OPS)]
        if not views:
            return "no view ops in the active steps"
        if not any(st.kernels for st in t.steps):
            return "no GPU kernels in the active steps"
        busy = [(op.name, *_view_cuda_time(op)) for op in views]
        busy = [b for b in busy if b[1]]
        if busy:
            return "; ".join(f"{n} launched {k} kernel(s), {t_:.1f} µs" for n, k, t_ in busy[:3])
        return True
    return Expect("view ops (aten::t, transpose, reshape, view, ...) launch no kernel: 0 µs CUDA time",
                  run, "cuda")


def bound_of(trace: Trace) -> tuple[str, float] | None:
    """("overhead"|"compute", GPU busy fraction of the steps' wall time); the GPU idles more than half
    the step when the CPU cannot launch work fast enough."""
    wall = sum(st.wall for st in trace.steps)
    if not trace.steps or wall <= 0 or not any(st.gpu for st in trace.steps):
        return None
    frac = sum(st.gpu_busy for st in trace.steps) / wall
    return ("compute" if frac >= 0.5 else "overhead"), frac


def bound(kind: str) -> Expect:
    if kind not in ("overhead", "compute"):
        raise ValueError(f"bound(kind): kind must be 'overhead' or 'compute', got {kind!r}")

    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        b = bound_of(t)
        if b is None:
            return "no GPU work in the active steps"
        return True if b[0] == kind else f"{b[0]}-bound: GPU busy {100 * b[1]:.0f}% of the step wall time"
    return Expect(f"{kind}-bound: GPU busy {'<' if kind == 'overhead' else '>='} 50% of the step wall time",
                  run, "cuda")


def check(trace: Trace, expectations: Iterable[Expect]) -> list[tuple[Expect, str, str]]:
    """(expect, "confirmed" | "broken" | "not applicable", detail) for each; a check that raises is broken."""
    results = []
    for ex in expectations:
        if ex.device not in ("any", "cuda", "cpu"):  # a typo must not turn into a silent "not applicable"
            results.append((ex, "broken", f"device must be 'any', 'cuda' or 'cpu', got {ex.device!r}"))
            continue
        if ex.device not in ("any", trace.device):
            results.append((ex, "not applicable", f"a {ex.device}-only expectation on a {trace.device} trace"))
            continue
        try:
            seen = ex.check(trace)
        except Exception as e:  # noqa: BLE001 - a failing check is a finding, not a crash
            results.append((ex, "broken", f"check raised {type(e).__name__}: {e}"))
            continue
        if seen is True:
            results.append((ex, "confirmed", ""))
        elif isinstance(seen, str):
            results.append((ex, "broken", seen))
        else:
            results.append((ex, "broken", "" if seen is False else f"check returned {seen!r}, not True"))
    return results


def print_expectations(results: list[tuple[Expect, str, str]], file=None) -> int:
    """Print each guess with its verdict; broken ones stand out. Returns how many are broken."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    console.print(Text("Expectations (guess first, then look):", style="bold"))
    for ex, verdict, detail in results:
        if verdict == "confirmed":
            line = Text("  ok      ", style="green") + Text(ex.text)
        elif verdict == "broken":
            line = Text("  BROKEN  ", style="bold red") + Text(ex.text, style="red")
            line += Text(f"\n          seen: {detail or '(no detail)'}  <- BROKEN — look here", style="bold red")
        else:
            line = Text("  n/a     ", style="dim") + Text(f"{ex.text} ({detail})", style="dim")
        console.print(line)
    count = Counter(v for _, v, _ in results)
    broken = count["broken"]
    console.print(Text(f"  {count['confirmed']} confirmed, {broken} broken, {count['not applicable']} not applicable",
                       style="bold red" if broken else "bold green"))
    return broken


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        raise TraceError(message)


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="inspect_trace.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", metavar="TRACE", help="one trace to report, or two (A B) to compare")
    p.add_argument("--full-names", action="store_true", help="print kernel names untruncated")
    p.add_argument("--open", action="store_true", help="serve the trace to the Perfetto UI (local only)")
    p.add_argument("--port", type=int, default=None, help="port for --open (default: serve_trace's 9001)")
    try:
        args = p.parse_args(argv)
        if len(args.traces) > 2:
            raise TraceError(f"give one trace or two, got {len(args.traces)}")
        traces = [load_trace(t) for t in args.traces]
        if len(traces) == 1:
            print(report(traces[0], args.full_names))
        else:
            print(compare(traces[0], traces[1], args.full_names))
        if args.open:
            import serve_trace  # the suite's one-file server; only needed here

            kw = {} if args.port is None else {"port": args.port}
            try:
                serve_trace.serve(args.traces[-1], **kw)
            except serve_trace.ServeError as e:
                raise TraceError(str(e)) from None
    except TraceError as e:
        print(f"inspect_trace.py: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head` closed the pipe: not an error worth a traceback
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0
    return 0


if __name__ == "__main__":
    code = main()
    # The trace's tree (parents <-> children) is cyclic garbage now; the process ends, so skip the final
    # collection over 10^5-10^6 objects (about half the run time on a 35 MB trace).
    gc.freeze()
    sys.exit(code)
