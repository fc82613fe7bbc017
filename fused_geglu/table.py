"""Which kernel and tile a call runs: the tuned table, and `plan`.

Which kernel and tile run at each token count M is measured on the GPU by tune_fused.py, per M bucket and, within one,
per class of input width K: its table (fused_geglu_tuned.json, beside this package) replaces kernels.py's defaults on
GPUs of the compute capability it was measured on. Where the table found cuBLAS's GEMMs and a pointwise GeGLU faster
than every fused tile, the module runs them (TORCH_WHERE_FASTER), except in the scripts that teach the fused kernel
(show_the_kernel). Its packing rows say where cuBLAS runs gate and up as one GEMM over the packed weights.
"""

import json
from pathlib import Path

import torch

from . import kernels, machine

# The table tune_fused.py measured on a GPU (kernel and config per M bucket); it replaces kernels.py's defaults on
# GPUs of the compute capability it was measured on. Read once, at import: choosing costs a list walk per call.
TUNED_TABLE = Path(__file__).parent.with_name("fused_geglu_tuned.json")  # beside the package
KERNELS = ("small", "tma", "pointer", "torch")


def _a_largest_k(max_k):
    return max_k is None or (type(max_k) is int and max_k > 0)


def load_tuned(path=TUNED_TABLE):
    """{major compute capability: {"geglu": [(largest M or None, largest K or None, kernel, config)], "down": [...],
    "packing": [(largest M or None, largest K or None, packed)]}} from path (see table_rows)."""
    if not path.exists():
        return {}
    return table_rows(json.loads(path.read_text()), path.name)


def _rows(table_rows):
    return [(row["max_m"], row.get("max_k"), row["kernel"], row.get("config")) for row in table_rows]


def _fused_rows(geglu_rows):
    """Where torch won, the best fused kernel there (what show_the_kernel's scripts run); elsewhere the row's own."""
    return [(row["max_m"], row.get("max_k"), *((row["fused"]["kernel"], row["fused"].get("config")) if "fused" in row
                                               else (row["kernel"], row.get("config"))))
            for row in geglu_rows if "fused" in row or row["kernel"] != "torch"]


def table_rows(table, name):
    """load_tuned's rows of a table as tune_fused.py writes it; None: any. A row without max_k holds every K
    (tables before K classes; down_proj's K is its input width, hidden); a table without packing rows packs
    everywhere."""
    rows = {which: _rows(table[which]) for which in ("geglu", "down")}
    rows["fused"] = _fused_rows(table["geglu"])
    rows["packing"] = [(row["max_m"], row.get("max_k"), row["packed"]) for row in table.get("packing", [])]
    if "geglu_narrow" in table:  # MoE experts' widths (hidden < dim), tuned apart: tune_fused.py --narrow-only
        rows["geglu_narrow"], rows["fused_narrow"] = _rows(table["geglu_narrow"]), _fused_rows(table["geglu_narrow"])
    for which, allowed in (("geglu", KERNELS), ("fused", KERNELS[:3]), ("down", ("small", "torch")),
                           ("geglu_narrow", KERNELS), ("fused_narrow", KERNELS[:3])):
        for max_m, max_k, kernel, cfg in rows.get(which, ()):
            if kernel not in allowed or (kernel != "torch" and not cfg) or not _a_largest_k(max_k):
                raise ValueError(f"{name}: {which} row for M <= {max_m}, K <= {max_k}: kernel {kernel!r} and "
                                 f"config {cfg!r}")
    for max_m, max_k, pack in rows["packing"]:
        if type(pack) is not bool or not _a_largest_k(max_k):
            raise ValueError(f"{name}: packing row for M <= {max_m}, K <= {max_k}: packed {pack!r}")
    return {int(table["capability"].split(".")[0]): rows}


tuned = load_tuned()  # tune_fused.py swaps rows in and out of it while it measures


def tuned_rows(device, which):
    if machine.INTERPRET or device.type != "cuda":
        return None
    return tuned.get(machine.capability(device)[0], {}).get(which)


def can_use_tma(x2d, w_gate, w_up, tracing):
    return (
        machine.TensorDescriptor is not None
        and x2d.dtype in (torch.bfloat16, torch.float16)
        # TMA needs 16-byte aligned row strides: K and N multiples of 8 for 2-byte types.
        and x2d.shape[1] % 8 == 0 and w_gate.shape[0] % 8 == 0
        # Not traced: torch 2.11's wrap_triton loses host-side TMA descriptors (KeyError 'x_desc' in Inductor's
        # mutation analysis, then a NaN output; seen on the H200), so a compiled graph runs the pointer kernel.
        and not tracing and all(t.data_ptr() % 16 == 0 for t in (x2d, w_gate, w_up))
        and (machine.INTERPRET or machine.capability(x2d.device)[0] >= 9)
    )


# Where the tuned table found cuBLAS's GEMMs (and a pointwise GeGLU) faster than every fused tile at a token count,
# the module runs them there: a model wants its fastest MLP. 04_fused_mlp.py sets this False, to show the fused
# kernel at any shape.
TORCH_WHERE_FASTER = True


def tuned_to_torch(device, tokens, dim, hidden=None):
    """True where the tuned table runs cuBLAS's GEMMs and a pointwise GeGLU for this many tokens of this width (the
    MLP's input size; hidden, where given, picks the MoE experts' rows when it is narrower) on this GPU."""
    return by_m(torch.device(device), tokens, "geglu", dim, hidden)[0] == "torch"


def show_the_kernel(device, tokens, dim, hidden=None):
    """For the scripts that teach the fused kernel (04, and 06/07 with --mlp fused): run it at any token count,
    and say so where the tuned table would have run cuBLAS's GEMMs instead (the benchmarks time the module as
    it comes, table and all)."""
    global TORCH_WHERE_FASTER
    TORCH_WHERE_FASTER = False
    if tuned_to_torch(device, tokens, dim, hidden):
        print(f"note: at {tokens} tokens of width {dim} the tuned table ({TUNED_TABLE.name}) has FusedGeGLUMLP run "
              "cuBLAS's GEMMs and a pointwise GeGLU, which measured faster there; this run shows the fused kernel "
              "anyway")


def plan(x2d, w_gate, w_up, use_tma=None, where_faster=None):
    """(kernel, config) that `geglu` runs: kernel is 'small' (few tokens), 'tma', 'pointer', or 'torch' (cuBLAS's
    GEMMs, then the GeGLU: one kernel of ours on a GPU, PyTorch's ops on a CPU or in a traced graph; on a CPU without
    the interpreter, or where the tuned table found nothing faster); config None means the kernel's default.
    use_tma=True/False asks for one of the tiled kernels at any M. where_faster: TORCH_WHERE_FASTER for this call
    (None: the global; the ops pass it in, so that a compiled graph shows it)."""
    tracing = machine.tracing(x2d)
    where_faster = TORCH_WHERE_FASTER if where_faster is None else where_faster
    # On a CPU: PyTorch, unless the interpreter runs the kernels; it cannot be traced into a compiled graph.
    if x2d.device.type != "cuda" and (not machine.INTERPRET or tracing):
        return "torch", None
    tma_possible = can_use_tma(x2d, w_gate, w_up, tracing)
    if use_tma is not None:
        if use_tma and not tma_possible:
            raise ValueError("the TMA kernel needs a Hopper GPU (or the interpreter), bf16/fp16, "
                             "dim and hidden multiples of 8")
        return ("tma" if use_tma else "pointer"), None
    (M, K), N = x2d.shape, w_gate.shape[0]
    kernel, cfg = by_m(x2d.device, M, "geglu", K, N)
    if kernel == "torch" and not where_faster:  # the best fused kernel the table measured there, else the default
        kernel, cfg = by_m(x2d.device, M, "fused", K, N)
    if kernel is None:  # in the interpreter the pointer kernel is the default; tests ask for the TMA one explicitly
        kernel = "tma" if tma_possible and not machine.INTERPRET else "pointer"
    if kernel == "tma" and not tma_possible:
        # The table measured TMA tiles here, and the TMA kernel cannot go (dim or hidden not a multiple of 8, an
        # unaligned tensor, or traced into a compiled graph): cuBLAS's two GEMMs and the pointwise GeGLU (traced,
        # Inductor fuses it into one kernel), which measured faster than the untuned pointer kernel both in a compiled
        # graph (results/bench_train_h200.txt) and eagerly at 300 x 1000 -> 2730 (0.93x of eager on an H100,
        # results/bench_fused_widths_before_h100.txt). The scripts that show the fused kernel run the pointer one.
        return ("torch" if where_faster else "pointer"), None
    return kernel, cfg


def kernel_path(x2d, w_gate, w_up, use_tma=None):
    """Which implementation `geglu` uses: 'small', 'tma', 'pointer' or 'torch' (see plan)."""
    return plan(x2d, w_gate, w_up, use_tma)[0]


def default_config(kernel, M):
    """A kernel's config where neither the caller nor the tuned table gives one."""
    if kernel == "small":
        return small_m_config(M) or kernels.SMALL_M_CONFIGS["geglu"][-1][1]
    if machine.INTERPRET:
        return kernels.INTERPRETER_CONFIG
    return kernels.HOPPER_CONFIG if kernel == "tma" else kernels.PORTABLE_CONFIG


def by_m(device, M, which, K=None, N=None):
    """(kernel, config) of the first row holding M tokens of K inputs each (K None: any row of M's bucket): the tuned
    table's on its GPUs, else the small-M buckets ('small' up to their last M, then (None, None): the default tiled
    kernel, or cuBLAS for down_proj). The table's rows go by M, then by K within an M bucket: the fused epilogue
    saves the same bytes at any K while the GEMM grows with it, so a wide input can favour cuBLAS at an M where a
    narrow one favours the fused kernel. N (gate/up's output width, hidden) narrower than K is an MoE expert's
    (hidden < dim): its few output tiles fill the GPU differently, and the table's narrow rows, tuned at such widths,
    choose there where it has them."""
    rows = tuned_rows(device, which)
    if N is not None and K is not None and N < K and which in ("geglu", "fused"):
        rows = tuned_rows(device, which + "_narrow") or rows
    if rows is not None:
        row = _first_row(rows, M, K)
        return (None, None) if row is None else row[2:]
    cfg = small_m_config(M, which)
    return ("small", cfg) if cfg is not None else (None, None)


def _first_row(rows, M, K):
    """The first of a table's rows (largest M or None, largest K or None, ...) holding M tokens of K inputs each (K
    None: any row of M's bucket), or None."""
    for row in rows:
        max_m, max_k = row[:2]
        if (max_m is None or M <= max_m) and (max_k is None or K is None or K <= max_k):
            return row
    return None


def packs_gate_up(device, M, K):
    """Whether, where cuBLAS runs gate and up, the module's packed weights run as one GEMM of twice the width (three
    launches) rather than two (four): the tuned table's packing rows, by M then class of K, on its GPUs. cuBLAS picks
    its kernel per GEMM shape, and at some token counts the two narrower GEMMs measured faster; the table packs at a
    measured M only where the packed GEMM was not slower at any width of the class, and between two measured Ms only
    where both ends pack (tune_fused.py). No table, no packing rows in it, or no row for M: packed."""
    row = _first_row(tuned_rows(device, "packing") or (), M, K)
    return True if row is None else row[2]


def small_m_config(M, kernel="geglu"):
    """The small-M kernel's default config for M tokens ('geglu' or 'down'), or None past the small-M buckets."""
    buckets = kernels.INTERPRETER_SMALL_M_CONFIGS if machine.INTERPRET else kernels.SMALL_M_CONFIGS
    for max_m, cfg in buckets.get(kernel, ()):
        if M <= max_m:
            return cfg
    return None


def packed(w_gate, w_up):
    """w_up's rows start where w_gate's end, in memory (FusedGeGLUMLP keeps them so: pack_gate_up): then one
    [2 * hidden, dim] view spans both, and cuBLAS runs gate and up as one GEMM."""
    return (w_up.data_ptr() - w_gate.data_ptr() == w_gate.numel() * w_gate.element_size()
            and w_gate.shape == w_up.shape)
