"""Bytes a kernel must move, for the ops whose inputs say more than they read: indexing ops read only what their
index picks. Expected values are written out by hand from the shapes."""

from pathlib import Path

import pytest

import inspect_trace as it
from trace_reader.kernels import pointwise_bytes
from trace_reader.read import Event


def op(name, dims, types, concrete=None, strides=None):
    args = {"Input Dims": dims, "Input type": types}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    if strides is not None:
        args["Input Strides"] = strides
    return Event({"name": name, "cat": "cpu_op", "ph": "X", "ts": 0, "dur": 1, "args": args})


@pytest.mark.parametrize("name, dims, types, concrete, expected", [
    # gather(self [32000, 2048] bf16, dim, index [512, 2048] int64, out=[512, 2048]): index + picked + written
    ("aten::gather", [[32000, 2048], [], [512, 2048], [], [512, 2048]],
     ["c10::BFloat16", "Scalar", "long int", "Scalar", "c10::BFloat16"], None, 512 * 2048 * 8 + 2 * 512 * 2048 * 2),
    # index_select(self [32000, 2048], dim 0, index [512]): 512 rows of 2048
    ("aten::index_select", [[32000, 2048], [], [512]], ["c10::BFloat16", "Scalar", "long int"], ["", "0", ""],
     512 * 8 + 2 * 512 * 2048 * 2),
    # index_select along dim 1 of a [4, 10] fp32 tensor, 3 indices: 3 columns of 4
    ("aten::index_select", [[4, 10], [], [3]], ["float", "Scalar", "long int"], ["", "1", ""], 3 * 8 + 2 * 12 * 4),
    # embedding(weight [100, 16] fp32, indices [2, 5]): 10 rows of 16
    ("aten::embedding", [[100, 16], [2, 5], [], [], []], ["float", "long int", "Scalar", "Scalar", "Scalar"], None,
     10 * 8 + 2 * 10 * 16 * 4),
    # take(self [7, 7] fp16, index [3]): 3 elements
    ("aten::take", [[7, 7], [3]], ["c10::Half", "long int"], None, 3 * 8 + 2 * 3 * 2),
])
def test_indexing_ops_count_what_they_pick(name, dims, types, concrete, expected):
    assert pointwise_bytes(op(name, dims, types, concrete)) == (float(expected), True)


@pytest.mark.parametrize("name, dims, types, strides, expected", [
    # transformers' gather: its [512, 2048] int64 index is a [512, 1] one expanded (strides [1, 0]): 512 distinct
    # indices read, 512 * 2048 bf16 elements picked and written
    ("aten::gather", [[32000, 2048], [], [512, 2048], [], [512, 2048]],
     ["c10::BFloat16", "Scalar", "long int", "Scalar", "c10::BFloat16"], [[2048, 1], [], [1, 0], [], [2048, 1]],
     512 * 8 + 2 * 512 * 2048 * 2),
    # the same index stored whole (strides [2048, 1]): every index element read
    ("aten::gather", [[32000, 2048], [], [512, 2048], [], [512, 2048]],
     ["c10::BFloat16", "Scalar", "long int", "Scalar", "c10::BFloat16"], [[2048, 1], [], [2048, 1], [], [2048, 1]],
     512 * 2048 * 8 + 2 * 512 * 2048 * 2),
    # mul(x [4, 8] fp32, mask [4, 8] fp32 expanded from [4, 1]): x, 4 mask elements, the [4, 8] output
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], [[8, 1], [1, 0]], 32 * 4 + 4 * 4 + 32 * 4),
    # a [3, 5] bf16 bias expanded from a scalar-like [1, 1] (strides [0, 0]): one element
    ("aten::add", [[3, 5], [3, 5], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"], [[5, 1], [0, 0], []],
     15 * 2 + 1 * 2 + 15 * 2),
    # an expanded view with no elements: nothing to read, nothing to write
    ("aten::mul", [[0, 8], [0, 8]], ["float", "float"], [[8, 1], [0, 0]], 0),
    # strides that do not fit the shape (a hostile or foreign trace): every element, as without strides
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], [[8, 1], [0]], 3 * 32 * 4),
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], [[8, 1], ["0", "0"]], 3 * 32 * 4),
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], "not a list", 3 * 32 * 4),
])
def test_expanded_inputs_count_their_distinct_elements(name, dims, types, strides, expected):
    got = pointwise_bytes(op(name, dims, types, strides=strides))
    assert got == (float(expected), True)


def test_index_select_with_a_made_up_dim_has_no_rate():
    assert pointwise_bytes(op("aten::index_select", [[4, 10], [], [3]], ["float", "Scalar", "long int"],
                              ["", "5", ""])) is None


def test_the_models_gather_runs_below_the_memory_peak():
    """On the committed decoder trace, the gather (from a [32000, 2048] table) no longer claims 20 times the HBM
    peak: every indexing kernel's rate is below the device's datasheet bandwidth."""
    t = it.load_trace(Path(__file__).parent / "data" / "h200_model_prefill_eager.json.gz")
    rows = [k for k in it.report_data(t)["kernels"] if k["launched_by"] in ("aten::gather", "aten::index_select")]
    assert rows, "the decoder trace launches its gather"
    for k in rows:
        assert k["rate"] is not None and k["rate"] < k["peak"], k
    # Its index is expanded (strides [1, 0]): 512 int64 indices, then 512 x 2048 bf16 picked and written, over the
    # kernel's mean time; counted whole, the index alone would be 8 MB and the rate near the peak.
    gather = next(k for k in rows if k["launched_by"] == "aten::gather")
    assert gather["rate"] == pytest.approx((512 * 8 + 2 * 512 * 2048 * 2) / (gather["mean_us"] * 1e-6) / 1e9, rel=1e-3)
    assert gather["rate"] < 0.5 * gather["peak"]
