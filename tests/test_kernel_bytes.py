"""Bytes a kernel must move, for the ops whose inputs say more than they read: indexing ops read only what their
index picks. Expected values are written out by hand from the shapes."""

from pathlib import Path

import pytest

import inspect_trace as it
from trace_reader.kernels import pointwise_bytes
from trace_reader.read import Event


def op(name, dims, types, concrete=None):
    args = {"Input Dims": dims, "Input type": types}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
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
