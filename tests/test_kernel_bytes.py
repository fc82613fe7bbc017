"""Bytes a kernel must move, for the ops whose inputs say more than they read: indexing ops read only what their
index picks. Expected values are written out by hand from the shapes."""

import math
from pathlib import Path

import pytest

import inspect_trace as it
from trace_reader.facts.kernels import pointwise_bytes
from trace_reader.reading.events import Event


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
    # an expanded view with no elements: nothing to read, nothing to write, no rate
    ("aten::mul", [[0, 8], [0, 8]], ["float", "float"], [[8, 1], [0, 0]], None),
    # strides that do not fit the shape (a hostile or foreign trace): every element, as without strides
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], [[8, 1], [0]], 3 * 32 * 4),
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], [[8, 1], ["0", "0"]], 3 * 32 * 4),
    ("aten::mul", [[4, 8], [4, 8]], ["float", "float"], "not a list", 3 * 32 * 4),
])
def test_expanded_inputs_count_their_distinct_elements(name, dims, types, strides, expected):
    got = pointwise_bytes(op(name, dims, types, strides=strides))
    assert got == (None if expected is None else (float(expected), True))


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


F32, BF16, I64 = "float", "c10::BFloat16", "long int"


@pytest.mark.parametrize("name, dims, types, concrete, expected", [
    # RMSNorm's mean over the last dim of [4, 512, 2048] fp32, keepdim: the input read, [4, 512, 1] written
    ("aten::mean", [[4, 512, 2048], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""],
     (4 * 512 * 2048 * 4 + 4 * 512 * 4, True)),
    # sum over dims 0 and 2 of [3, 5, 7] bf16: 5 elements out
    ("aten::sum", [[3, 5, 7], [], [], []], [BF16, "ScalarList", "Scalar", ""], ["", "[0, 2]", "False", ""],
     (105 * 2 + 5 * 2, True)),
    # sum(x) with no dim: one element out
    ("aten::sum", [[6, 4], []], [F32, ""], ["", ""], (24 * 4 + 4, True)),
    # argmax along dim 1 of [8, 10] fp16: 8 int64 indices out
    ("aten::argmax", [[8, 10], [], []], ["c10::Half", "Scalar", "Scalar"], ["", "1", "False"], (80 * 2 + 8 * 8, True)),
    # linalg_vector_norm(x, ord, dim=[-1]): the dim is its third argument
    ("aten::linalg_vector_norm", [[16, 32], [], [], [], []], [F32, "Scalar", "ScalarList", "Scalar", ""],
     ["", "2", "[-1]", "False", ""], (512 * 4 + 16 * 4, True)),
    # no recorded dim (an older trace), or one past the shape: the read alone, a lower bound
    ("aten::mean", [[4, 512, 2048], [], [], []], [F32, "ScalarList", "Scalar", ""], None,
     (4 * 512 * 2048 * 4, False)),
    ("aten::mean", [[4, 8], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[2]", "True", ""], (32 * 4, False)),
    ("aten::mean", [[4, 8], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "dim", "True", ""], (32 * 4, False)),
    # the training trace's loss: 2048 targets pick 2048 of the [2048, 32000] fp32 log-probabilities; mean: 1 out
    ("aten::nll_loss_forward", [[2048, 32000], [2048], [], [], []], [F32, I64, "", "Scalar", "Scalar"],
     ["", "", "", "1", "-100"], (2048 * 8 + 2048 * 4 + 4, True)),
    # reduction none: one loss per target
    ("aten::nll_loss_forward", [[2048, 32000], [2048], [], [], []], [F32, I64, "", "Scalar", "Scalar"],
     ["", "", "", "0", "-100"], (2048 * 8 + 2048 * 4 + 2048 * 4, True)),
    # reduction not recorded: one loss counted, a lower bound
    ("aten::nll_loss_forward", [[2048, 32000], [2048], [], [], []], [F32, I64, "", "Scalar", "Scalar"], None,
     (2048 * 8 + 2048 * 4 + 4, False)),
    # its backward: the 0-d gradient and the targets read, one gradient element written per target
    ("aten::nll_loss_backward", [[], [2048, 32000], [2048], [], [], [], []],
     [F32, F32, I64, "", "Scalar", "Scalar", F32],
     ["", "", "", "", "1", "-100", ""], (2048 * 8 + 4 + 2048 * 4, True)),
])
def test_reductions_and_the_loss_count_what_they_write(name, dims, types, concrete, expected):
    got = pointwise_bytes(op(name, dims, types, concrete))
    assert got == (float(expected[0]), expected[1])


def inductor(name, dims, types, **extra):
    return Event({"name": name, "cat": "kernel_launch_op", "ph": "X", "ts": 0, "dur": 1,
                  "args": {"Input Dims": dims, "Input type": types, "kernel_backend": "triton", "kernel_name": name,
                           **extra}})


def test_an_inductor_kernel_fusing_an_embedding_has_no_rate():
    """Its inputs hold the whole [32000, 2048] table; it reads one row per index: counting the inputs made the
    decode trace's first RMSNorm kernel run at 15 times the HBM peak."""
    dims, types = [[1, 1], [32000, 2048], [], [2048], [1, 1, 2048]], [I64, BF16, BF16, BF16, BF16]
    rmsnorm = "triton_red_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_0"
    assert pointwise_bytes(inductor(rmsnorm, dims, types)) is None
    assert pointwise_bytes(inductor("triton_poi_fused_index_select_3", dims, types)) is None
    # where Inductor recorded its own count, that is the count
    assert pointwise_bytes(inductor("triton_poi_fused_embedding_0", dims, types, kernel_num_gb=0.001)) == (1e6, True)
    # a name holding the word inside another is not an indexing op: every input counted (a lower bound: no source)
    got = pointwise_bytes(inductor("triton_poi_fused_reindexed_add_0", [[4, 8], [4, 8]], [F32, F32]))
    assert got == (2 * 32 * 4.0, False)


def test_the_committed_traces_claim_no_rate_above_what_l2_can_give():
    """On every committed H200 trace, no kernel's rate passes 1.5 x the HBM peak (a kernel reading data still in the
    50 MB L2 can pass the peak a little; 15 or 60 times it, as the embedding-fused kernel, the loss and its backward
    claimed, is a count of bytes never read). The loss kernels of the training trace, by hand: 2048 targets."""
    data = Path(__file__).parent / "data"
    for path in sorted(data.glob("h200_*.json.gz")) + sorted((data / "train").glob("h200_*.json.gz")):
        for k in it.report_data(it.load_trace(path))["kernels"]:
            assert k["rate"] is None or k["rate"] < 1.5 * k["peak"], (path.name, k["name"], k["rate"])
    kernels = it.report_data(it.load_trace(data / "train" / "h200_train_gemma_2l.json.gz"))["kernels"]
    loss = {k["launched_by"]: k for k in kernels if k["launched_by"].startswith("aten::nll_loss")}
    assert set(loss) == {"aten::nll_loss_forward", "aten::nll_loss_backward"}
    for name, moved in (("aten::nll_loss_forward", 2048 * 8 + 2048 * 4 + 4),
                        ("aten::nll_loss_backward", 2048 * 8 + 4 + 2048 * 4)):
        assert loss[name]["rate"] == pytest.approx(moved / (loss[name]["mean_us"] * 1e-6) / 1e9, rel=1e-3)


@pytest.mark.parametrize("text", ["9" * 5000, "²", "[" + "9" * 5000 + "]", "[1, ²]", "[-1]x" + " " * 100000,
                                  "[" + "1, " * 100000 + "x]"])
def test_a_hostile_recorded_dim_is_no_dim(text):
    """A trace is untrusted: int() of a 5000-digit string raises, and "²" passes str.isdigit() but not int(). Such a
    dim reads as none: index_select's as dim 0 (as when absent), a reduction's as unknown (its read, a lower bound)."""
    assert pointwise_bytes(op("aten::index_select", [[4, 10], [], [3]], [F32, "Scalar", I64], ["", text, ""])) == (
        float(3 * 8 + 2 * 3 * 10 * 4), True)
    assert pointwise_bytes(op("aten::mean", [[4, 8], [], [], []], [F32, "ScalarList", "Scalar", ""],
                              ["", text, "True", ""])) == (32 * 4.0, False)


@pytest.mark.parametrize("name, dims, types, strides, expected", [
    # the decode trace's KV-cache write: index_copy_(cache [1, 1, 512, 256], 2, index [1], source [1, 1, 1, 256]):
    # the index, then one 256-element row read and written; the cache is not read whole
    ("aten::index_copy_", [[1, 1, 512, 256], [], [1], [1, 1, 1, 256]], [BF16, "Scalar", I64, BF16],
     [[131072, 131072, 256, 1], [], [1], [256, 256, 256, 1]], (8 + 2 * 256 * 2, True)),
    # index_add_ also reads the rows it adds to
    ("aten::index_add_", [[100, 16], [], [3], [3, 16], []], [F32, "Scalar", I64, F32, "Scalar"], None,
     (3 * 8 + 3 * 3 * 16 * 4, True)),
    # scatter_ with a scalar value: one element per index entry
    ("aten::scatter_", [[10, 10], [], [2, 3], []], [F32, "Scalar", I64, "Scalar"], None, (6 * 8 + 2 * 6 * 4, True)),
    # decode attention: q [1, 8, 1, 256], k and v [1, 8, 512, 256] (one KV head expanded to 8: stride 0), mask
    # [1, 1, 1, 512]: q, one head of k and v, the mask read; out [1, 8, 1, 256] written
    ("aten::_cudnn_attention_forward", [[1, 8, 1, 256], [1, 8, 512, 256], [1, 8, 512, 256], [1, 1, 1, 512], []],
     [BF16, BF16, BF16, BF16, "Scalar"], [[2048, 256, 256, 1], [131072, 0, 256, 1], [131072, 0, 256, 1],
                                          [512, 512, 512, 1], []],
     ((2048 + 2 * 131072 + 512) * 2 + 2048 * 2, True)),
    # flash's [batch, seq, heads, dim] layout: out is q's shape with v's head size
    ("aten::_flash_attention_forward", [[4, 1, 32, 128], [4, 2048, 8, 64], [4, 2048, 8, 64]], [BF16] * 3, None,
     ((4 * 32 * 128 + 2 * 4 * 2048 * 8 * 64) * 2 + 4 * 32 * 64 * 2, True)),
    # backward: dout, q, k, v, out, logsumexp read; dq, dk, dv written
    ("aten::_cudnn_attention_backward", [[2, 4, 8, 16], [2, 4, 8, 16], [2, 1, 8, 16], [2, 1, 8, 16], [2, 4, 8, 16],
                                         [2, 4, 8, 1]], [BF16] * 5 + [F32], None,
     ((3 * 1024 + 2 * 256) * 2 + 64 * 4 + (1024 + 2 * 256) * 2, True)),
    # an attention op whose v the trace does not hold: the reads alone, a lower bound
    ("aten::_cudnn_attention_forward", [[1, 8, 1, 256], [1, 8, 512, 256]], [BF16, BF16], None,
     ((2048 + 8 * 512 * 256) * 2, False)),
    # shapes that do not broadcast, outside attention: the reads alone, a lower bound
    ("aten::mul", [[4, 8], [4, 3]], [F32, F32], None, ((32 + 12) * 4, False)),
    # the output's dtype: bool for a comparison; fp32 for bf16 plus fp32 (the math trace's mask add); bf16 for
    # where(bool, scalar, bf16), the condition aside; fp32 for bf16 with fp16; int64 for int32 plus int64
    ("aten::ne", [[4, 512], []], [I64, "Scalar"], None, (2048 * 8 + 2048 * 1, True)),
    ("aten::add", [[4, 32, 64, 64], [64, 64]], [BF16, F32], None,
     (4 * 32 * 64 * 64 * 2 + 64 * 64 * 4 + 4 * 32 * 64 * 64 * 4, True)),
    ("aten::where", [[1, 1, 1, 512], [], [1, 1, 1, 512]], ["bool", "Scalar", BF16], None,
     (512 + 512 * 2 + 512 * 2, True)),
    ("aten::add", [[8], [8]], [BF16, "c10::Half"], None, (8 * 2 + 8 * 2 + 8 * 4, True)),
    ("aten::add", [[8], [8]], ["int", I64], None, (8 * 4 + 8 * 8 + 8 * 8, True)),
    # where(bool, scalar, scalar) or an op with only a bool mask to go by: no output dtype to say: a lower bound
    ("aten::where", [[6], [], []], ["bool", "Scalar", "Scalar"], None, (6.0, False)),
])
def test_writes_at_an_index_attention_and_result_dtypes(name, dims, types, strides, expected):
    assert pointwise_bytes(op(name, dims, types, strides=strides)) == (float(expected[0]), expected[1])


def test_the_decode_traces_cache_write_and_attention_rates():
    """On the committed decode trace, by hand: index_copy_ writes one 256-element bf16 row (plus its 8-byte index),
    and the attention kernel reads q, one KV head of k and v, the mask and writes out (from the op's recorded shapes
    and strides); the rate is those bytes over the kernel's mean time (within 2%: the report averages each call's
    rate, and the 8 cache writes a step vary in time)."""
    import gzip
    import json

    path = Path(__file__).parent / "data" / "h200_model_decode_eager.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    attention = next(e["args"] for e in events if e.get("name") == "aten::_cudnn_attention_forward")
    dims, strides = attention["Input Dims"], attention["Input Strides"]
    distinct = [math.prod(n for n, s in zip(d, st) if s != 0) for d, st in zip(dims[:4], strides[:4]) if d]
    q, v = dims[0], dims[2]
    attention_bytes = 2 * sum(distinct) + 2 * math.prod(q[:-1] + v[-1:])
    kernels = {k["launched_by"]: k for k in it.report_data(it.load_trace(path))["kernels"]}
    for name, moved in (("aten::index_copy_", 8 + 2 * 256 * 2), ("aten::_cudnn_attention_forward", attention_bytes)):
        k = kernels[name]
        assert k["rate"] == pytest.approx(moved / (k["mean_us"] * 1e-6) / 1e9, rel=0.02), name
