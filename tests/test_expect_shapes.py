"""Expectations at shapes their authors did not tune on.

On the CPU: each rule that decides a verdict, pinned at its edge on hand-built traces (an allocation passed between
ops or kept inside one, cuBLAS's split-K reduce, a check over nothing). On a GPU: each script run at odd sizes,
batch 1, short attention sequences and fp32, where no claim that holds may come out BROKEN.
"""

import gzip
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_inspect_trace import gpu_trace, parse, verdicts

import inspect_trace as it
from trace_reader.analyzers import memory, modules
from trace_reader.scripts import args_from_trace
from trace_reader.analyzers.guesses import gpu_lag_grows
from trace_reader.facts.kernels import splitk_reduces

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
REDUCE = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, float, "
          "__nv_bfloat16, __nv_bfloat16, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, "
          "__nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, "
          "__nv_bfloat16 const*, __nv_bfloat16*, void*, long, float*, int*)")  # as in h200_model_*_eager
SPLIT_GEMM = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"


# ---- kernel counts: a split-K GEMM's reduce kernel is the GEMM's second half ------------------------------------

def add_launch(data, owner_name, kernel, nth=0, after=None, at=None):
    """In each step, launch `kernel` from the nth op named `owner_name`: at the op's end (after its own launch),
    or `at` µs after its start; `after` renames the op's own kernel."""
    ev = data["traceEvents"]
    steps = sorted((e for e in ev if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    corr = max(e["args"].get("correlation", 0) for e in ev if "args" in e) + 1
    for st in steps:
        owners = [e for e in ev if e["name"] == owner_name and e.get("cat") == "cpu_op"
                  and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]]
        op = sorted(owners, key=lambda e: e["ts"])[nth]
        ext = op["args"]["External id"]
        prev = [e for e in ev if e.get("cat") == "kernel" and e["args"].get("External id") == ext]
        start = max((e["ts"] + e["dur"] for e in prev), default=op["ts"] + 10) + 0.5
        if after is not None:
            for e in prev:
                e["name"] = after
        ts = op["ts"] + (op["dur"] - 2 if at is None else at)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                   "dur": 1, "args": {"External id": ext, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start, "dur": 3.0,
                   "args": {"External id": ext, "correlation": corr, "stream": 7}})
        corr += 1
    return data


def test_a_split_k_reduce_after_its_gemm_is_not_counted():
    data = add_launch(gpu_trace(), "aten::mm", REDUCE, nth=2, after=SPLIT_GEMM)
    t = parse(data)
    # independently of the reader: 6 kernels per step in the raw trace, the reduce right after the split GEMM
    kernels = sorted((e for e in data["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    assert len(kernels) == 18 and [k["name"] for k in kernels[4:6]] == [SPLIT_GEMM, REDUCE]
    assert verdicts(t, [it.kernels_per_step(5), it.kernels_per_step(6), it.occupancy_before_gemms()]) == [
        ("confirmed", ""), ("broken", "kernels per step: [6, 6, 6], less split-K reduces [1, 1, 1]: [5, 5, 5]"),
        ("confirmed", "")]  # the reduce is neither a GEMM launch without the query nor a queried pointwise one


def test_a_reduce_named_kernel_counts_where_no_gemm_of_its_op_precedes_it():
    # launched by aten::gelu after the GeLU kernel: not a GEMM's second half, so one kernel more
    t = parse(add_launch(gpu_trace(), "aten::gelu", REDUCE))
    assert verdicts(t, [it.kernels_per_step(5)]) == [("broken", "kernels per step: [6, 6, 6]")]
    # right after a GEMM in launch order, but launched by another op: aten::gelu, before its own kernel
    t = parse(add_launch(gpu_trace(), "aten::gelu", REDUCE, at=0.5))
    assert [k.op.name for k in t.steps[0].kernels][1:4] == ["aten::mm", "aten::gelu", "aten::gelu"]
    assert t.steps[0].kernels[2].name == REDUCE
    assert verdicts(t, [it.kernels_per_step(5)]) == [("broken", "kernels per step: [6, 6, 6]")]


def test_the_h200_model_traces_split_k_reduces_are_found_where_cublas_added_them():
    """h200_model_decode_eager: cuBLAS split down_proj's K (16384): nvjet_..._splitK_TNT then splitKreduce, 4 per
    step (one per layer), each launched by the same aten::mm, by the raw JSON's External ids."""
    raw = json.loads(gzip.decompress((DATA / "h200_model_decode_eager.json.gz").read_bytes()))["traceEvents"]
    by_ext = {}
    for e in raw:
        if e.get("cat") == "kernel" and ("splitK" in e["name"]):
            by_ext.setdefault(e["args"]["External id"], []).append(e["name"])
    pairs = [names for names in by_ext.values() if len(names) == 2]
    assert len(pairs) == 12 and all("splitKreduce" in b and "splitK_TNT" in a for a, b in pairs)  # 3 steps x 4
    t = it.load_trace(DATA / "h200_model_decode_eager.json.gz")
    assert [len(splitk_reduces(st)) for st in t.steps] == [4, 4, 4]


# ---- allocations: the tensor passed between ops, not the step's peak ---------------------------------------------

S = 1 << 20  # the score matrix of these traces: 1 MiB


def alloc_trace(tmp_path, ops, mem, cuda=False, name="t.json"):
    """Two steps, [0, 100) and [100, 200), on thread (1, 1). ops: (name, ts, dur) in each step (ts from the
    step's start); mem: (ts, bytes, addr) in each step, addr None for an event without "Addr"."""
    events, total = [], 0
    for i, n in enumerate((2, 3)):
        base = 100 * i
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": base, "dur": 99,
                       "pid": 1, "tid": 1})
        for op, ts, dur in ops:
            events.append({"ph": "X", "cat": "cpu_op", "name": op, "ts": base + ts, "dur": dur, "pid": 1, "tid": 1})
        for ts, nbytes, addr in mem:
            total += nbytes
            args = {"Bytes": nbytes, "Total Allocated": total, "Device Type": 1 if cuda else 0, "Device Id": 0}
            if addr is not None:
                args["Addr"] = addr + i  # a new block each step
            events.append({"ph": "i", "name": "[memory]", "ts": base + ts, "pid": 1, "tid": 1, "args": args})
    if cuda:  # a launch makes it a GPU trace
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 1, "pid": 1,
                       "tid": 1, "args": {}})
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return it.load_trace(path)


# math: aten::bmm writes the scores (allocated inside it, via aten::empty), aten::_softmax reads them, then frees
MATH_OPS = [("aten::bmm", 10, 10), ("aten::empty", 11, 1), ("aten::_softmax", 30, 10)]
# a fused kernel: its own scratch, allocated and freed before its op returns (flash's split-KV accumulators)
FUSED_OPS = [("aten::_flash_attention_forward", 10, 30), ("aten::empty", 11, 1)]


def scores(present, others=(0, "")):
    return memory.allocates(S, "the scores", present=present, others=others)


def test_the_scores_passed_from_one_op_to_the_next_are_found(tmp_path):
    t = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (35, -S, 1000)])
    assert memory.temporaries(t, S) == {2: [(S, "aten::bmm")], 3: [(S, "aten::bmm")]}
    assert memory.temporaries(t, S + 1) == {2: [], 3: []}
    assert [v for v, _ in verdicts(t, [scores(True), scores(False)])] == ["confirmed", "broken"]
    assert verdicts(t, [scores(False)])[0][1] == ("allocations passed between ops of >= 1.0 MiB per step: "
                                                  "#2 1: 1.0 MiB from aten::bmm; #3 1: 1.0 MiB from aten::bmm")
    # one byte short of the scores is no score matrix
    small = alloc_trace(tmp_path, MATH_OPS, [(11.5, S - 1, 1000), (35, -(S - 1), 1000)], name="small.json")
    assert [v for v, _ in verdicts(small, [scores(True), scores(False)])] == ["broken", "confirmed"]


def test_a_kernels_scratch_freed_inside_its_op_is_no_score_matrix(tmp_path):
    scratch = [(11.5, 4 * S, 1000), (39, -4 * S, 1000)]  # freed at 39, the op ends at 40
    t = alloc_trace(tmp_path, FUSED_OPS, scratch)
    assert memory.temporaries(t, S) == {2: [], 3: []}
    assert memory.temporaries(t, S, between_ops=False) == {2: [(4 * S, "aten::_flash_attention_forward")]} | {
        3: [(4 * S, "aten::_flash_attention_forward")]}
    # "never allocates" asks about what passes between ops; "allocates", of any temporary that big
    assert [v for v, _ in verdicts(t, [scores(False), scores(True)])] == ["confirmed", "confirmed"]
    # freed one µs after the op returned: handed on, whatever made it
    late = alloc_trace(tmp_path, FUSED_OPS, [(11.5, 4 * S, 1000), (41, -4 * S, 1000)], name="late.json")
    assert memory.temporaries(late, S) == {2: [(4 * S, "aten::_flash_attention_forward")]} | {
        3: [(4 * S, "aten::_flash_attention_forward")]}


def test_a_block_kept_past_the_step_is_no_temporary_and_without_addr_all_count(tmp_path):
    kept = alloc_trace(tmp_path, MATH_OPS, [(11.5, 32 * S, 1000)])  # cuBLAS's workspace: never freed
    assert memory.temporaries(kept, S) == {2: [], 3: []} and verdicts(kept, [scores(False)]) == [("confirmed", "")]
    no_addr = alloc_trace(tmp_path, FUSED_OPS, [(11.5, 4 * S, None), (39, -4 * S, None)], name="noaddr.json")
    assert verdicts(no_addr, [scores(False)])[0][0] == "broken"  # cannot be paired with its free: it counts


def test_a_compiled_region_is_one_op_and_outside_any_op_an_allocation_counts(tmp_path):
    # Inductor's buffers live and die inside "Torch-Compiled Region": its own (flex decoding's split accumulators)
    region = [("Torch-Compiled Region: 0/0", 5, 60), ("aten::empty", 11, 1)]
    t = alloc_trace(tmp_path, region, [(11.5, S, 1000), (30, -S, 1000)])
    assert memory.temporaries(t, S) == {2: [], 3: []}
    assert memory.temporaries(t, S, between_ops=False) == {2: [(S, "Torch-Compiled Region: 0/0")]} | {
        3: [(S, "Torch-Compiled Region: 0/0")]}
    # "allocates" asks for any temporary that big (compiled math's scores live inside its region); "never" for none
    # passed between ops
    assert [v for v, _ in verdicts(t, [scores(True), scores(False)])] == ["confirmed", "confirmed"]
    # freed after the region returned: passed on
    out = alloc_trace(tmp_path, region, [(11.5, S, 1000), (70, -S, 1000)], name="out.json")
    assert memory.temporaries(out, S) == {2: [(S, "Torch-Compiled Region: 0/0")]} | {
        3: [(S, "Torch-Compiled Region: 0/0")]}
    # no op around it: nothing can hold it as its own
    bare = alloc_trace(tmp_path, [("user code", 5, 60)], [(11.5, S, 1000), (30, -S, 1000)], name="bare.json")
    assert memory.temporaries(bare, S) == {2: [(S, "no op")], 3: [(S, "no op")]}


def test_where_another_tensor_can_be_as_big_only_a_bigger_one_tells(tmp_path):
    q = (S, "the activations")  # as big as the scores: q, k, v when seq <= head_dim
    acts = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (35, -S, 1000)])
    (present, _), (absent, why) = verdicts(acts, [scores(True, q), scores(False, q)])
    assert (present, absent) == ("not applicable", "not applicable")
    assert why == ("the activations (1.0 MiB) can show as big as the scores, and nothing bigger passed between ops: "
                   "an allocation's size cannot tell them apart at this shape")
    # one byte smaller: the check can tell again
    smaller = (S - 1, "the activations")
    assert [v for v, _ in verdicts(acts, [scores(True, smaller), scores(False, smaller)])] == ["confirmed", "broken"]
    # bigger than any other tensor: the fp32 softmax (2x the scores) says the scores were there
    fp32 = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (31, 2 * S, 2000), (35, -S, 1000), (45, -2 * S, 2000)],
                       name="fp32.json")
    assert [v for v, _ in verdicts(fp32, [scores(True, q), scores(False, q)])] == ["confirmed", "broken"]


def test_on_a_gpu_the_caching_allocator_may_report_a_bigger_block(tmp_path):
    """Rounded up to 512 B, and from the large pool (over 1 MiB) a block up to 1 MiB bigger, unsplit."""
    assert memory.largest_block(S, "cuda") == S and memory.largest_block(S + 1, "cuda") == S + 512 + (1 << 20)
    assert memory.largest_block(1, "cuda") == 512 and memory.largest_block(S + 1, "cpu") == S + 1
    big = 4 * S
    t = alloc_trace(tmp_path, MATH_OPS, [(11.5, big, 1000), (35, -big, 1000)], cuda=True)
    assert t.device == "cuda"
    check = lambda other: verdicts(t, [memory.allocates(big, "the scores", False, (other, "q"))])[0][0]  # noqa: E731
    assert check(big - S) == "not applicable"  # 3 MiB can show as 4 MiB
    assert check(big - S - 512) == "broken"  # 3 MiB - 512 B at most shows as 4 MiB - 512 B


def test_a_step_with_no_allocation_is_no_evidence(tmp_path):
    t = alloc_trace(tmp_path, MATH_OPS, [])
    assert verdicts(t, [scores(False)]) == [("broken", "no [memory] events for the cpu: profile with "
                                             "profile_memory=True")]
    data = json.loads((tmp_path / "t.json").read_text())
    data["traceEvents"].append({"ph": "i", "name": "[memory]", "ts": 150, "pid": 1, "tid": 1,
                                "args": {"Bytes": 8, "Total Allocated": 8, "Device Type": 0, "Device Id": 0}})
    (tmp_path / "one.json").write_text(json.dumps(data))
    t = it.load_trace(tmp_path / "one.json")
    assert verdicts(t, [scores(False), scores(True)]) == [
        ("not applicable", "ProfilerStep#2 has no [memory] event for the cpu: nothing to look at")] * 2


def test_the_h200_attention_traces_keep_their_verdicts():
    """At the defaults (4 x 2048, 32 heads, head_dim 128) the 1 GiB scores are 16x the 64 MiB activations."""
    score, acts = 4 * 32 * 2048 * 2048 * 2, (4 * 2048 * 32 * 128 * 2, "the activations")
    for name, present in (("math", True), ("sdpa", False), ("flex", False)):
        t = it.load_trace(DATA / f"h200_attention_{name}.json.gz")
        got = verdicts(t, [memory.allocates(score, "the scores", p, acts) for p in (True, False)])
        assert [v for v, _ in got] == (["confirmed", "broken"] if present else ["broken", "confirmed"]), name


# ---- checks over nothing -----------------------------------------------------------------------------------------

def test_no_check_passes_on_a_trace_without_steps(tmp_path):
    data = gpu_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith(("ProfilerStep#", "mlp_fwd"))]
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(data))
    t = it.load_trace(path)
    exps, _ = it.expectations_for("03_simple_mlp", t)
    results = it.check(t, exps)
    assert results and all(v != "confirmed" for _, v, _ in results), [(e.text, v) for e, v, _ in results]
    assert it.check(t, [it.steps(0, "mlp_fwd")])[0][1] == "broken"


def test_no_op_among_no_ops_is_not_applicable():
    gpu = gpu_trace()
    only_steps = {**gpu, "traceEvents": [e for e in gpu["traceEvents"] if e["name"].startswith("ProfilerStep#")]}
    t = parse(only_steps)
    assert verdicts(t, [it.cpu_op("aten::add", present=False)]) == [
        ("not applicable", "no CPU ops recorded in the active steps: no 'aten::add' among none says nothing")]
    assert verdicts(parse(gpu), [it.cpu_op("aten::add", present=False)]) == [("confirmed", "")]


def test_at_most_n_kernels_of_none_is_not_applicable():
    data = gpu_trace()
    no_kernels = {**data, "traceEvents": [e for e in data["traceEvents"] if e.get("cat") != "kernel"]}
    t = parse(no_kernels)
    assert t.device == "cuda"  # the launches are still there
    assert verdicts(t, [modules.kernels_between(0, 10, "x"), modules.kernels_between(1, 10, "x")]) == [
        ("not applicable", "ProfilerStep#2 launched no kernel: nothing to count"), ("broken", "kernels per step: [0, 0, 0]")]
    assert verdicts(parse(data), [modules.kernels_between(0, 5, "x")]) == [("confirmed", "")]


# ---- the scripts' guesses at their edges -------------------------------------------------------------------------

matmul_add = importlib.import_module("01_matmul_add")
linear = importlib.import_module("02_linear")


@pytest.mark.parametrize("size,batched,dtype,kind", [
    (512, None, "bf16", "overhead"), (256, 8, "bf16", "overhead"), (513, None, "bf16", None),
    (4095, None, "bf16", None), (4096, None, "bf16", "compute"), (4096, None, "fp16", "compute"),
    (2048, 8, "bf16", "compute"), (2047, None, "fp32", None), (2048, None, "fp32", "compute"),
])
def test_part_1_guesses_a_bound_only_where_the_work_decides_it(size, batched, dtype, kind):
    assert matmul_add.guessed_bound(Namespace(size=size, batched=batched, dtype=dtype)) == kind


@pytest.mark.parametrize("in_dim,out_dim,counted", [(2, 2, True), (1, 64, False), (32, 1, False)])
def test_linear_counts_one_kernel_only_where_cublaslt_takes_the_bias(in_dim, out_dim, counted):
    for compile_ in (False, True):
        texts = [e.text for e in linear.expectations(Namespace(active=3, compile=compile_, in_dim=in_dim,
                                                               out_dim=out_dim))]
        assert any("1 GPU kernel per step" in t for t in texts) == counted


def test_expect_reads_the_dtype_and_the_layer_from_a_renamed_trace():
    raw = json.loads(gzip.decompress((DATA / "h200_linear_eager.json.gz").read_bytes()))["traceEvents"]
    addmm = next(e for e in raw if e.get("name") == "aten::addmm")
    w = addmm["args"]["Input Dims"][2]  # bias, x, w^T: [in_dim, out_dim]
    args = args_from_trace("02_linear", it.load_trace(DATA / "h200_linear_eager.json.gz"))
    assert (args.in_dim, args.out_dim, args.dtype) == (w[0], w[1], "bf16") and addmm["args"]["Input type"][1] == \
        "c10::BFloat16"


def test_the_lag_grows_from_the_step_that_lagged_least():
    """h200_matmul_add_4096_active20_eager: the cold first step's 2.5 ms on the CPU lets the GPU catch up once."""
    raw = json.loads(gzip.decompress((DATA / "h200_matmul_add_4096_active20_eager.json.gz").read_bytes()))
    ev = raw["traceEvents"]
    steps = sorted((e for e in ev if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    gpu = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    calls = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and e.get("args", {}).get("correlation") in gpu]  # the calls that put work on the GPU
    lags = []
    for st in steps:  # the step's first such call (a memset before its GEMM) to the start of that work
        first = min((e for e in calls if st["ts"] <= e["ts"] <= st["ts"] + st["dur"]), key=lambda e: e["ts"])
        lags.append(gpu[first["args"]["correlation"]]["ts"] - first["ts"])
    assert lags[1] < lags[0] and all(b > a for a, b in zip(lags[1:], lags[2:]))
    t = it.load_trace(DATA / "h200_matmul_add_4096_active20_eager.json.gz")
    assert [v for v, _ in verdicts(t, [gpu_lag_grows(True), gpu_lag_grows(False)])] == ["confirmed", "broken"]


# ---- on a GPU: each script where its authors did not look ---------------------------------------------------------

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: runs each script on it")
NO_TRITON = importlib.util.find_spec("triton") is None
# Claims the H200 itself breaks at any shape, as README.md shows: no occupancy query before nvjet GEMMs on Hopper;
# in 05's math path, aten::reshape of GQA's expanded heads copies.
FALSE_ON_HOPPER = {"": r"^every GEMM launch is preceded by cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                   "05 math": r"^view ops \(aten::t, transpose, reshape, view, \.\.\.\) launch no kernel"}
# ---- flash at decode: it splits the KV sequence only where batch x heads leaves SMs idle ------------------------

def test_flash_splits_only_where_sms_would_idle():
    """The split guess is checked with fewer (sequence, head) programs than SMs and a cache longer than one key
    block (128 keys at head_dim 128, 256 at 64); else it does not apply. gpu_trace's H200 has 132 SMs."""
    from test_inspect_trace import GELU, MUL

    attention = importlib.import_module("05_attention")
    data = gpu_trace()
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"] in (GELU, MUL):
            e["name"] = {GELU: "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>(params)",
                         MUL: "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128>>"}[
                e["name"]]
    split, whole = parse(data), parse(gpu_trace())

    def said(t, programs, kv_len, head_dim=128):
        return [v for v, _ in verdicts(t, attention.flash_splits(programs, kv_len, head_dim))]

    assert said(split, 131, 129) == ["confirmed", "confirmed"]
    assert said(whole, 131, 129) == ["broken", "broken"]  # idle SMs and no split: the guess is wrong
    assert said(whole, 132, 4096) == ["not applicable"] * 2  # a program per SM
    assert said(whole, 1, 128) == ["not applicable"] * 2  # one key block at head_dim 128
    assert said(whole, 1, 256, head_dim=64) == ["not applicable"] * 2 and said(whole, 1, 257, head_dim=64)[0] == "broken"
    assert said(whole, 1, 64, head_dim=256) == ["not applicable"] * 2 and said(whole, 1, 65, head_dim=256)[0] == "broken"
    data = gpu_trace()
    data["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}]  # no SM count: cannot tell
    assert said(parse(data), 1, 4096) == ["not applicable"] * 2


def test_too_little_data_to_stream_at_speed_is_not_judged():
    """The H200's datasheet moves 4,800 GB/s: 4.9 µs of it (23.52 MB) is under the 5 µs a kernel's start and drain
    cost (n/a); 5.1 µs of it (24.48 MB) is judged, and gpu_trace's GEMMs (about 110 µs a step) are far too slow."""
    t = parse(gpu_trace())
    small, large = 4800e9 * 4.9e-6, 4800e9 * 5.1e-6
    (_, v_small, d_small), (_, v_large, _) = it.check(t, [memory.streams("nvjet", small, "the cache"),
                                                          memory.streams("nvjet", large, "the cache")])
    assert (v_small, v_large) == ("not applicable", "broken")
    assert "4.9 µs" in d_small
    # docs/05: the constant it quotes, and the defaults' KV cache (2 x batch x 8 KV heads x 2048 x 128 x 2 bytes)
    # under it at batch 1 and over it at batch 4, on the H200's 4,800 GB/s
    page = " ".join((ROOT / "docs/05_attention.md").read_text().split())
    assert f"under {memory.MIN_STREAM_US:g} µs (`memory.MIN_STREAM_US`" in page
    kv = [2 * b * 8 * 2048 * 128 * 2 / 4800e9 * 1e6 for b in (1, 4)]
    assert kv[0] < memory.MIN_STREAM_US < kv[1]


ATTN = ["--batch", "1", "--heads", "4", "--kv_heads", "2", "--head_dim", "16"]
MLP_2304 = ["--batch", "2", "--seq", "128", "--dim", "2304", "--hidden", "9216"]
ODD_MLP = ["--batch", "3", "--seq", "7", "--dim", "96", "--hidden", "200"]
RUNS = {
    "01 odd size": ("01_matmul_add.py", ["--size", "63"]),
    # fp32 at 4000: ~2 ms of GPU work a step (at 2048, 0.3 ms, a loaded host made it overhead-bound)
    "01 fp32 4000": ("01_matmul_add.py", ["--size", "4000", "--dtype", "fp32"]),
    "01 batched compile": ("01_matmul_add.py", ["--size", "100", "--batched", "3", "--compile"]),
    "02 batch 1, long K": ("02_linear.py", ["--batch", "1", "--in_dim", "4096", "--out_dim", "64"]),
    "02 fp32 odd batch": ("02_linear.py", ["--batch", "7", "--in_dim", "32", "--out_dim", "64", "--dtype", "fp32"]),
    "03 2x128x2304x9216": ("03_simple_mlp.py", MLP_2304),
    "03 one token": ("03_simple_mlp.py", ["--batch", "1", "--seq", "1", "--dim", "2304", "--hidden", "9216"]),
    "03 fp32 odd": ("03_simple_mlp.py", [*ODD_MLP, "--dtype", "fp32"]),
    "03 liger 2x128x2304x9216": ("03_kernels_mlp.py", MLP_2304),
    "04 2x128x2304x9216": ("04_fused_mlp.py", MLP_2304),
    "04 one token": ("04_fused_mlp.py", ["--batch", "1", "--seq", "1", "--dim", "2304", "--hidden", "9216"]),
    "04 fp32 odd": ("04_fused_mlp.py", [*ODD_MLP, "--dtype", "fp32"]),
    **{f"05 {impl} seq {s}": ("05_attention.py", ["--impl", impl, "--seq", str(s), *ATTN])
       for impl, seqs in (("sdpa", (16, 64, 128)), ("math", (16, 128)), ("flex", (16, 128))) for s in seqs},
    "05 flash seq 1024": ("05_attention.py", ["--impl", "sdpa", "--backend", "flash", "--seq", "1024", *ATTN]),
    # Llama-3-8B's attention at one token: 1 x 32 programs leave an H200's SMs idle, 16 x 32 do not
    "05 flash decode batch 1": ("05_attention.py", ["--impl", "sdpa", "--backend", "flash", "--decode", "--batch", "1"]),
    "05 flash decode batch 16": ("05_attention.py", ["--impl", "sdpa", "--backend", "flash", "--decode", "--batch", "16"]),
    "06 tiny decode": ("06_model.py", ["--preset", "tiny", "--phase", "decode"]),
}


def broken(stdout: str) -> list[str]:
    """The texts of the BROKEN expectations a script printed."""
    return [ln.split("BROKEN", 1)[1].strip() for ln in stdout.splitlines() if ln.startswith("  BROKEN  ")]


def run_on_gpu(out, key):
    """(key, the finished process) of one run of RUNS, writing under out."""
    script, args = RUNS[key]
    env = {**os.environ, "HUB_TIMEOUT": "5", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    cmd = [sys.executable, str(ROOT / script), *args, "--device", "cuda", "--out", str(out / key.replace(" ", "_"))]
    try:
        return key, subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    except subprocess.TimeoutExpired as e:  # one slow run fails its own test, not the module
        said = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        return key, subprocess.CompletedProcess(cmd, -9, said, f"timed out after {e.timeout} s")


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    """Every run of RUNS, four at a time (the GPU has room; each is mostly Python start-up), once per module."""
    out = tmp_path_factory.mktemp("shapes")
    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(lambda key: run_on_gpu(out, key), RUNS))


# Claims about a few µs of host time (the cold step's wait before its first op: 228 vs ~5 µs in the post). Beside
# the suite's other workers and three other runs, a later step's wait grew to 22 µs on the H200 once, and a cold
# step's 62 µs was under 3x it (2026-12-03): such a claim, broken, is judged again on one more run of the script,
# not beside three others; a claim false at that shape breaks twice.
HOST_TIMING = r"^(cold|warm): the first active step "


@GPU
@pytest.mark.parametrize("key", list(RUNS))
def test_no_claim_that_holds_breaks_at_shapes_nobody_tuned(gpu_runs, key, tmp_path):
    if NO_TRITON and RUNS[key][0] in ("03_kernels_mlp.py", "04_fused_mlp.py"):
        pytest.skip("needs Triton")
    if RUNS[key][0] == "03_kernels_mlp.py" and importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("needs the liger-kernel package (the Hub is not reached from this test)")
    proc = gpu_runs[key]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Expectations (guess first, then look):" in proc.stdout
    known = [p for prefix, p in FALSE_ON_HOPPER.items() if key.startswith(prefix)]
    false = [b for b in broken(proc.stdout) if not any(re.match(p, b) for p in known)]
    if false and all(re.match(HOST_TIMING, b) for b in false):
        _, proc = run_on_gpu(tmp_path, key)
        assert proc.returncode == 0, proc.stderr[-3000:]
        false = [b for b in broken(proc.stdout) if not any(re.match(p, b) for p in known)]
    tail = proc.stdout[proc.stdout.index("Expectations (guess first"):]
    assert false == [], tail[:4000]


@GPU
def test_flash_decode_splits_where_sms_idle(gpu_runs):
    """At batch 1 the split guess is checked (and holds); at batch 16, 512 programs fill the GPU: not applicable."""
    def split_lines(key):  # the verdicts of the two split guesses
        return [ln.split()[0] for ln in gpu_runs[key].stdout.splitlines()
                if ln.startswith(("  ok ", "  n/a ", "  BROKEN ")) and ("splits the KV" in ln or "merges the splits" in ln)]

    assert split_lines("05 flash decode batch 1") == ["ok", "ok"]
    assert split_lines("05 flash decode batch 16") == ["n/a", "n/a"]


@GPU
def test_attention_scores_are_judged_by_allocation_at_short_sequences(gpu_runs):
    """seq 16 with head_dim 16: q, k, v are as big as the scores, so the fused paths' check says it cannot tell
    (and math's still sees its fp32 softmax, bigger than both); from seq 64 on it answers."""
    lines = {key: next(ln for ln in gpu_runs[key].stdout.splitlines() if "score matrix (" in ln and "allocates" in ln)
             for key in RUNS if key.startswith("05 ") and "decode" not in key}  # at decode no scores are guessed
    for key, line in lines.items():
        impl, seq = key.split()[1], int(key.split()[-1])
        if impl == "math":
            assert line.startswith("  ok      allocates"), line
        elif seq <= 16:
            assert line.startswith("  n/a     never allocates"), line
        else:
            assert line.startswith("  ok      never allocates"), line
