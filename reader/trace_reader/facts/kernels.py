"""Naming kernels and ops: GEMM or pointwise, FLOPs and bytes moved, dtype, short names, units of work."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

from ..reading.events import Event, Kernel, Step, Trace

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
    "aten::resize_", "aten::broadcast_tensors", "aten::detach_", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::unbind", "aten::flatten", "aten::unflatten", "aten::set_",
}
# Conversions that are a no-op when the tensor already fits: they compute only when they call something.
NO_OP_ALONE = {"aten::to", "aten::contiguous"}
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
BIAS_FIRST = {"aten::addmm", "aten::baddbmm", "aten::_addmm_activation"}  # (bias, a, b, ...): the operands at 1, 2
# Inductor names a max-autotune template after the ops it holds: triton_tem_fused_mm_0, ..._addmm_gelu_1, ..._bmm_2.
GEMM_NAME_RE = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|_mm_|matmul"
                          r"|^triton_tem_fused(?:_\w*)?_(?:addmm|baddbmm|bmm|mm)(?:_|$)", re.I)
POINTWISE_NAME_RE = re.compile(r"elementwise|triton_poi_|pointwise|_geglu_|_swiglu_", re.I)
# Inductor's C++ kernels under cpp.enable_kernel_profile: cpp_fused_* (generated loops), graph_<id>_..kernel
# (its C++ templates: the CPU's FlexAttention, max-autotune's GEMMs).
CPP_KERNEL_RE = re.compile(r"cpp_fused|^graph_\d+_\w*kernel$")
# Bytes per element of the dtypes the profiler writes in "Input type".
DTYPE_BYTES = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
DTYPE_NAMES = {"c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float64",
               "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2", "signed char": "int8"}


def input_dims(op: Event) -> list:
    dims = op.args.get("Input Dims")
    return dims if isinstance(dims, list) else []


def _strides(op: Event) -> list:
    strides = op.args.get("Input Strides")  # recorded beside the shapes by newer torch versions
    return strides if isinstance(strides, list) else []


def _read_numel(shape: list, strides) -> int:
    """The elements a tensor input holds in memory: an expanded view (stride 0 along a dimension, as `expand` and
    broadcasting make) is its distinct elements, read once however often the op sees each. Without strides (older
    traces, other harnesses) or with strides that do not fit the shape: every element."""
    if isinstance(strides, list) and len(strides) == len(shape) and all(type(s) is int for s in strides):
        return math.prod(int(n) for n, s in zip(shape, strides) if s != 0 or n == 0)
    return numel_of(shape)


def _read_bytes(shape: list, strides: list, types: list, at: int) -> int:
    """Bytes input `at` of shape `shape` holds in memory (_read_numel: an expanded one, its distinct elements)."""
    return _read_numel(shape, strides[at] if at < len(strides) else None) * DTYPE_BYTES[types[at]]


def shape_of(d) -> list[int] | None:
    """A recorded tensor shape, if it is one: a list of non-negative ints (not strings, not bools), none
    beyond 2**40 (no tensor dimension is that long: a made-up one must not turn into a 400-digit rate)."""
    if isinstance(d, list) and all(type(x) is int and 0 <= x < 2**40 for x in d):
        return d
    return None


def input_types(op: Event) -> list:
    types = op.args.get("Input type")
    return types if isinstance(types, list) else []


def operand_index(op: Event) -> int:
    """Where a matmul op's first operand is in its inputs: after the bias of addmm and its kin."""
    return 1 if op.name in BIAS_FIRST else 0


def gemm_operands(op: Event) -> tuple[list[int] | None, list[int] | None]:
    """The recorded shapes of a matmul op's two operands (after addmm's bias); (None, None) when not recorded."""
    first = operand_index(op)
    dims = input_dims(op)
    return (shape_of(dims[first]), shape_of(dims[first + 1])) if len(dims) >= first + 2 else (None, None)


def gemm_flops(op: Event | None) -> float | None:
    """2*M*K*N (times the batch) from a matmul op's recorded input shapes; None when not a GEMM or no shapes."""
    if op is None or op.name not in GEMM_OPS:
        return None
    dims = input_dims(op)
    first = operand_index(op)
    if len(dims) < first + 2:
        return None
    a, b = shape_of(dims[first]), shape_of(dims[first + 1])
    if a is None or b is None or len(a) != len(b) or len(a) not in (2, 3):
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    if b[-2] != k:
        return None
    flops = 2.0 * batch * m * k * n
    return flops if flops < 1e18 else None  # an exaFLOP per call is a made-up shape, not a GEMM


def gemm_bytes(op: Event | None) -> float | None:
    """Bytes a matmul must move at least: its inputs read once (bias included), its output written once."""
    flops = gemm_flops(op)
    if flops is None:
        return None
    first = operand_index(op)
    dims, types = input_dims(op), input_types(op)  # an `out=` buffer after the operands is written, not read
    tensors = [(d, t) for d, t in zip(dims[:first + 2], types) if isinstance(d, list) and d]
    if len(types) < first + 2 or any(t not in DTYPE_BYTES for _, t in tensors):
        return None
    a, b = dims[first], dims[first + 1]
    out = numel_of(a[:-1] + b[-1:]) * DTYPE_BYTES[types[first]]
    return float(sum(numel_of(d) * DTYPE_BYTES[t] for d, t in tensors) + out)


def numel_of(shape: list) -> int:
    return math.prod(map(int, shape))


def _broadcast(shapes: list[list]) -> list | None:
    if shapes and shapes.count(shapes[0]) == len(shapes):  # one shape, or all alike (most ops): nothing to pad
        return list(shapes[0])
    out: list = []
    for shape in shapes:
        shape = list(shape)
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        shape = [1] * (len(out) - len(shape)) + shape
        if any(a != b and a != 1 and b != 1 for a, b in zip(out, shape)):
            return None  # shapes that do not broadcast (attention's q against its k and v): no one output shape
        out = [a if b == 1 else b for a, b in zip(out, shape)]  # a size 1 takes the other's, 0 too
    return out


def pointwise_bytes(op: Event | None, sources: dict[str, str] | None = None) -> tuple[float, bool] | None:
    """(bytes a pointwise op must move, exact?): its tensor inputs once (an expanded one, its distinct elements, where
    the trace records strides), plus its output unless in place.

    The trace records inputs only; the output of an aten op (or an autograd Function such as Liger's) is
    the broadcast of its tensor inputs in the dtype torch promotes them to (_result_bytes), and where they do not
    broadcast or say no dtype, the inputs alone are a lower bound. Reductions, attention, indexing ops and the loss
    count what they write on their own. An Inductor Triton launch lists every
    buffer, outputs included, as its inputs; a buffer it reads and writes back ("in_out_ptr") counts twice,
    which only the kernel's source says (`sources`, read on request by read.read_kernel_sources): without
    that file the count is a lower bound (exact=False).
    """
    if op is None:
        return None
    gb = op.args.get("kernel_num_gb")
    if type(gb) in (int, float) and 0 < gb < 1e6:
        return float(gb) * 1e9, True
    if op.name in INDEXING_OPS:
        return _indexing_bytes(op)
    if op.name in NLL_LOSS_OPS:
        return _nll_loss_bytes(op)
    if op.name in INDEX_WRITE_OPS:
        return _index_write_bytes(op)
    triton = op.name.startswith("triton_") or op.args.get("kernel_backend") == "triton"
    if triton and INDUCTOR_INDEXING_RE.search(str(op.args.get("kernel_name", op.name))):
        return None  # a fused embedding or gather: its inputs hold a whole table, it reads the rows its index picks
    arg_names = _triton_arg_names(op, sources or {}) if triton else None
    total, tensors, strides, types = 0, [], _strides(op), input_types(op)
    for i, (d, t) in enumerate(zip(input_dims(op), types)):
        # 0-d tensors and scalars (xnumel) move nothing worth counting
        if shape_of(d) and isinstance(t, str) and t in DTYPE_BYTES:
            reads_and_writes = arg_names is not None and i < len(arg_names) and arg_names[i].startswith("in_out_ptr")
            total += _read_bytes(d, strides, types, i) * (2 if reads_and_writes else 1)
            tensors.append((d, DTYPE_BYTES[t]))
    if not tensors:
        return None
    in_place = op.name.endswith("_") or op.name.endswith(".out")
    exact = not triton or arg_names is not None
    if op.name in REDUCTION_OPS:  # the output keeps the dimensions not reduced: unknown, it counts as nothing
        kept = _kept_numel(op, tensors[0][0])
        total += 0 if kept is None else kept * REDUCTION_OUT_BYTES.get(op.name, tensors[0][1])
        exact = kept is not None
    elif op.name in ATTENTION_OPS:  # forward: out is q's shape with v's head size; backward: dq, dk, dv
        written = _attention_written(op)
        total += written or 0
        exact = exact and written is not None
    elif not (triton or in_place):
        out = _broadcast([d for d, _ in tensors])
        item = _result_bytes(op)
        if out is None or item is None:
            exact = False  # the output's size or dtype is not the inputs' to say: the reads alone, a lower bound
        else:
            total += numel_of(out) * item
    if total >= 1e15 or total == 0:  # a petabyte per call is a made-up shape; nothing moved, no rate (an `out=`
        return None  # recorded before its resize, as arange's [0])
    return float(total), exact


# A recorded int or int list, as "-1" or "[0, 2]": ASCII digits, a few per number (a trace is untrusted input: int()
# of a 5000-digit string raises, and str.isdigit() passes "²", which int() rejects).
SMALL_INT_RE = re.compile(r"-?[0-9]{1,9}")
DIMS_RE = re.compile(r"\[?\s*(-?[0-9]{1,9}(?:\s*,\s*-?[0-9]{1,9})*)?\s*\]?")
# Ops that read only the elements their index picks: op -> (position of the source, position of the index).
INDEXING_OPS = {"aten::gather": (0, 2), "aten::index_select": (0, 2), "aten::embedding": (0, 1), "aten::take": (0, 1)}


def _indexing_bytes(op: Event) -> tuple[float, bool] | None:
    """(the index, the picked elements read, the output written, exact): counting the whole source instead
    would make a 2.6 µs gather from a [32000, 2048] table run at 20 times the memory's peak.

    gather and take pick one element per index entry; index_select and embedding one row (a [512] index into a
    [32000, 2048] table picks 512 rows of 2048: index_select's dim is read from the recorded scalars, 0 if absent)."""
    src_at, idx_at = INDEXING_OPS[op.name]
    dims, types = input_dims(op), input_types(op)
    if len(dims) <= idx_at or len(types) <= idx_at:
        return None
    src, idx = shape_of(dims[src_at]), shape_of(dims[idx_at])
    if not src or idx is None or types[src_at] not in DTYPE_BYTES or types[idx_at] not in DTYPE_BYTES:
        return None
    index_bytes = _read_bytes(idx, _strides(op), types, idx_at)
    picked = numel_of(idx)
    if op.name in ("aten::index_select", "aten::embedding"):
        dim = 0  # embedding: rows of its [num, dim] weight
        if op.name == "aten::index_select":
            concrete = op.args.get("Concrete Inputs")
            text = concrete[1] if isinstance(concrete, list) and len(concrete) > 1 else ""
            dim = int(text) if isinstance(text, str) and SMALL_INT_RE.fullmatch(text) else 0
        if not -len(src) <= dim < len(src):
            return None
        picked *= numel_of(src) // max(src[dim], 1)
    total = index_bytes + 2 * picked * DTYPE_BYTES[types[src_at]]
    return (float(total), True) if total < 1e15 else None


# Reductions: op -> where its dim argument is (mean(self, dim, keepdim), linalg_vector_norm(self, ord, dim, ...)).
REDUCTION_OPS = {"aten::mean": 1, "aten::sum": 1, "aten::amax": 1, "aten::amin": 1, "aten::prod": 1,
                 "aten::logsumexp": 1, "aten::argmax": 1, "aten::argmin": 1, "aten::any": 1, "aten::all": 1,
                 "aten::var": 1, "aten::std": 1, "aten::linalg_vector_norm": 2, "aten::norm": 2}
REDUCTION_OUT_BYTES = {"aten::argmax": 8, "aten::argmin": 8, "aten::any": 1, "aten::all": 1}  # else the input's
# Inductor kernels that fuse an indexing op name it: triton_red_fused__to_copy_add_embedding_mean_..._0
INDUCTOR_INDEXING_RE = re.compile(r"(?:^|_)(?:embedding|index|gather|take|scatter)(?:_|$)")


def _kept_numel(op: Event, shape: list) -> int | None:
    """The elements a reduction writes: its input's, less the dimensions its recorded dim argument reduces (all of
    them where it is empty: sum(x) and mean(x) give one element); None where the trace does not say which."""
    concrete = op.args.get("Concrete Inputs")
    at = REDUCTION_OPS[op.name]
    if not isinstance(concrete, list) or len(concrete) <= at or not isinstance(concrete[at], str):
        return None
    m = DIMS_RE.fullmatch(concrete[at].strip())
    if m is None:
        return None
    dims = [int(d) for d in m.group(1).split(",")] if m.group(1) else list(range(len(shape)))
    if any(not -len(shape) <= d < len(shape) for d in dims) or (not shape and dims):
        return None
    reduced = {d % len(shape) for d in dims}
    return math.prod(int(n) for i, n in enumerate(shape) if i not in reduced)


# nll_loss: op -> (position of the values, of the target, of the reduction). Forward: reads the target and the one
# log-probability each target picks; writes the loss (one element, or one per target with reduction none).
# Backward: reads the target and the loss's gradient, writes one gradient element per target (the zeros around them
# are a fill_ kernel of their own).
NLL_LOSS_OPS = {"aten::nll_loss_forward": (0, 1, 3), "aten::nll_loss2d_forward": (0, 1, 3),
                "aten::nll_loss_backward": (0, 2, 4), "aten::nll_loss2d_backward": (0, 2, 4)}


def _nll_loss_bytes(op: Event) -> tuple[float, bool] | None:
    values_at, target_at, reduction_at = NLL_LOSS_OPS[op.name]  # values: the log-probabilities, or the loss's gradient
    dims, types = input_dims(op), input_types(op)
    if len(dims) <= target_at or len(types) <= target_at:
        return None
    target, values = shape_of(dims[target_at]), shape_of(dims[values_at])
    if target is None or values is None or types[target_at] not in DTYPE_BYTES or types[values_at] not in DTYPE_BYTES:
        return None
    picked, item = numel_of(target), DTYPE_BYTES[types[values_at]]
    if op.name.endswith("_backward"):
        total = picked * DTYPE_BYTES[types[target_at]] + numel_of(values) * item + picked * item
    else:
        concrete = op.args.get("Concrete Inputs")
        reduction = concrete[reduction_at] if isinstance(concrete, list) and len(concrete) > reduction_at else None
        written = picked if reduction == "0" else 1  # Reduction::None, else Mean or Sum
        total = picked * DTYPE_BYTES[types[target_at]] + picked * item + written * item
        if reduction not in ("0", "1", "2"):
            return float(total), False
    return (float(total), True) if total < 1e15 else None


# In-place writes at an index: op -> (position of the index, of the source, times the source's bytes move). The
# target (a KV cache) is counted by what the index touches, not whole: index_copy_ reads the source and writes it,
# index_add_ also reads the rows it adds to; scatter_ writes one element per index entry.
INDEX_WRITE_OPS = {"aten::index_copy_": (2, 3, 2), "aten::index_add_": (2, 3, 3), "aten::scatter_": (2, 3, 2),
                   "aten::scatter_add_": (2, 3, 3)}


def _index_write_bytes(op: Event) -> tuple[float, bool] | None:
    idx_at, src_at, times = INDEX_WRITE_OPS[op.name]
    dims, types = input_dims(op), input_types(op)
    if len(dims) <= idx_at or len(types) <= idx_at or types[0] not in DTYPE_BYTES or types[idx_at] not in DTYPE_BYTES:
        return None
    idx = shape_of(dims[idx_at])
    if idx is None:
        return None
    index_bytes = _read_bytes(idx, _strides(op), types, idx_at)
    src = shape_of(dims[src_at]) if len(dims) > src_at else None
    # scatter_ moves one element per index entry (its src may be larger, or a scalar); index_copy_ a source's worth
    moved = numel_of(idx) if op.name.startswith("aten::scatter") or not src else numel_of(src)
    total = index_bytes + times * moved * DTYPE_BYTES[types[0]]
    return (float(total), True) if 0 < total < 1e15 else None


# Attention: its inputs are q, k, v (then a mask, scales...); backward: the output's gradient first, then q, k, v.
ATTENTION_FORWARD = {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                     "aten::_scaled_dot_product_cudnn_attention", "aten::_cudnn_attention_forward",
                     "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                     "aten::_scaled_dot_product_flash_attention_for_cpu"}
ATTENTION_OPS = ATTENTION_FORWARD | {
    "aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_cudnn_attention_backward",
    "aten::_flash_attention_backward", "aten::_efficient_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


def _attention_written(op: Event) -> int | None:
    """Bytes an attention kernel writes: the output, q's shape with v's head size (forward), or the gradients of q,
    k and v (backward); None where q, k, v are not in the trace."""
    first = 0 if op.name in ATTENTION_FORWARD else 1
    dims, types = input_dims(op), input_types(op)
    if len(dims) < first + 3 or len(types) < first + 3:
        return None
    q, k, v = (shape_of(dims[first + i]) for i in range(3))
    item = [DTYPE_BYTES.get(types[first + i]) if isinstance(types[first + i], str) else None for i in range(3)]
    if not (q and k and v) or None in item:
        return None
    if first == 0:
        return numel_of(q[:-1] + v[-1:]) * item[0]
    return numel_of(q) * item[0] + numel_of(k) * item[1] + numel_of(v) * item[2]


# What an op's output holds, where its inputs' dtypes do not say it: comparisons give bool.
BOOL_RESULT_OPS = {"aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::logical_and",
                   "aten::logical_or", "aten::logical_xor", "aten::logical_not", "aten::isnan", "aten::isinf",
                   "aten::isfinite", "aten::isneginf", "aten::isposinf", "aten::eq_", "aten::ne_"}
FLOATING = {"float", "double", "c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2",
            "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"}


def _result_bytes(op: Event) -> int | None:
    """Bytes per element of a pointwise op's output: bool for a comparison, else its tensor inputs' promoted dtype
    (a float one over integers, the wider of two floats, fp32 for bf16 with fp16; where's condition aside)."""
    if op.name in BOOL_RESULT_OPS:
        return 1
    dims, types = input_dims(op), input_types(op)
    start = 1 if op.name == "aten::where" else 0
    kinds = [t for d, t in list(zip(dims, types))[start:] if shape_of(d) and isinstance(t, str) and t in DTYPE_BYTES]
    if not kinds:
        return None
    complex_ = [t for t in kinds if t.startswith("c10::complex")]
    floats = [t for t in kinds if t in FLOATING]
    if complex_:
        return max(DTYPE_BYTES[t] for t in complex_)
    if floats:
        if {"c10::BFloat16", "c10::Half"} <= set(floats):
            return max(4, *(DTYPE_BYTES[t] for t in floats))
        return max(DTYPE_BYTES[t] for t in floats)
    return max(DTYPE_BYTES[t] for t in kinds)


def _triton_arg_names(op: Event, sources: dict[str, str]) -> list[str] | None:
    """The Triton kernel's parameter names, from its Inductor source file when that was read (see sources)."""
    path, name = op.args.get("kernel_file"), op.args.get("kernel_name", op.name)
    if not isinstance(path, str) or path not in sources:
        return None
    m = re.search(rf"def {re.escape(str(name))}\(([^)]*)\)", sources[path])
    return [a.split(":")[0].strip() for a in m.group(1).split(",")] if m else None


def op_dtype(op: Event | None) -> str | None:
    for t in input_types(op) if op is not None else []:
        if t in DTYPE_NAMES:
            return DTYPE_NAMES[t]
    return None


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
    """The CPU's "kernels" of the step, thread by thread (cpu_lanes): every op that computes, once."""
    return [e for _, lane in cpu_lanes(step) for e in lane]


def cpu_lanes(step: Step) -> list[tuple[object, list[Event]]]:
    """(thread id, its units of work in time order) per thread that computed in the step: the thread running
    the step loop first, then the others by their first unit.

    A unit is the outermost op that computes (an aten op other than bookkeeping, or an Inductor C++ kernel):
    what it calls is part of it (aten::div's aten::to, addmm's bias copy, mse_loss's mean, relu's clamp_min),
    so nothing is counted twice and no computing op is dropped. One exception: an op that calls a GEMM
    (aten::linear, aten::matmul, einsum, attention's math path) only routes to it, so its GEMMs and its other
    computing children are the units instead."""
    calls_gemm = _calls_gemm(step)
    lanes: dict[object, list[Event]] = {}
    todo = [e for e in reversed(step.spans) if e.parent is None or e.parent.step is not step]  # the step's roots
    while todo:  # depth first, in time order; a stack, not recursion: a trace may nest deeper than Python does
        e = todo.pop()
        if _computes(e) and id(e) not in calls_gemm:
            lanes.setdefault(e.tid, []).append(e)
        else:
            todo.extend(c for c in reversed(e.children) if c.step is step)
    for lane in lanes.values():
        lane.sort(key=lambda e: e.ts)
    main = step.span.tid
    return sorted(lanes.items(), key=lambda kv: (kv[0] != main, kv[1][0].ts))


def _computes(e: Event) -> bool:
    if CPP_KERNEL_RE.search(e.name):
        return True
    if e.cat != "cpu_op" or not e.name.startswith("aten::") or e.name in BOOKKEEPING_OPS:
        return False
    return bool(e.children) or e.name not in NO_OP_ALONE


def _calls_gemm(step: Step) -> set[int]:
    """ids of the step's spans with a GEMM op below them."""
    out: set[int] = set()
    for e in step.spans:
        if e.cat == "cpu_op" and e.name in GEMM_OPS:
            p = e.parent
            while p is not None and id(p) not in out:
                out.add(id(p))
                p = p.parent
    return out


def units(trace: Trace, step: Step) -> list[tuple[str, float]]:
    """(name, µs) of the step's units of work in launch order: GPU kernels, or the CPU's kernels thread by thread."""
    if trace.device == "cuda":
        return [(k.name, k.dur) for k in step.kernels]
    return [(e.name, e.dur) for e in cpu_kernels(step)]


def typical_sequence(trace: Trace) -> list[str]:
    """The most common launch order of the steps (a warm-up straggler does not decide the structure)."""
    return most_common([tuple(n for n, _ in units(trace, st)) for st in trace.steps])


def most_common(sequences: list[tuple[str, ...]]) -> list[str]:
    """The sequence most steps have (the first step's of those tied)."""
    seqs = Counter(sequences)
    return list(seqs.most_common(1)[0][0]) if seqs else []


def view_cuda_time(op: Event) -> tuple[int, float]:
    """Kernels launched by this op or anything it called, and their total time."""
    n, t = 0, 0.0
    todo = [op]
    while todo:  # a view as it should be launches nothing, nor do the views it calls: no sum over nothing
        e = todo.pop()
        if e.kernels:
            n += len(e.kernels)
            t += sum(k.dur for k in e.kernels)
        todo.extend(e.children)
    return n, t


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
    # The identifiers that hold Functor or Impl past their first letter, each whole. Found word by word: one regex
    # for it (\w+(?:Functor|Impl)\w*) backtracks over every word without one, quadratic in a word's length.
    functors = [f for f in dict.fromkeys(re.findall(r"\w+", name))
                if ("Functor" in f[1:] or "Impl" in f[1:]) and not f.startswith(("Binary", "AUnary", "BUnary", "Unary"))]
    if base and functors:
        cut = f"{base}<…{functors[0]}…>"
        if len(cut) <= width:
            return cut
    return name[: width - 1] + "…"


# The reduce kernel cuBLAS (or CUTLASS) launches after a GEMM it split along K: cublasLt::splitKreduce_kernel on
# Hopper (after nvjet_..._splitK_...), splitKreduce_kernel in older cuBLAS, cutlass::reduction::kernel::ReduceSplitK.
SPLIT_K_REDUCE_RE = re.compile(r"splitK_?reduce|ReduceSplitK|reduce_?split_?k", re.I)


def splitk_reduces(step) -> list:
    """The step's split-K reduce kernels: named so, and launched right after a GEMM kernel by the same op (the
    GEMM's own second half, which cuBLAS adds at shapes where K is long next to M x N; not a kernel of its own)."""
    ks = step.kernels
    return [k for prev, k in zip(ks, ks[1:]) if SPLIT_K_REDUCE_RE.search(k.name) and is_gemm(prev)
            and not SPLIT_K_REDUCE_RE.search(prev.name) and prev.op is k.op]
