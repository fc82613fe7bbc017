"""The comparison of two traces (trace_reader/compare.py) on the cases that fool a position-by-position diff:
a different launch order, a same-name kernel that stayed beside one that was replaced, calls per step that
change, traces without annotations, shapes or CPU ops, very long steps, and two CPU traces.

The H200 traces are the committed ones under tests/data, rewritten in their parsed JSON where a case needs it."""

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trace_reader.render import compare_text
from trace_reader.comparison import units
from trace_reader.comparison import pairing
from trace_reader.comparison import align
import inspect_trace as it
from doc_pages import all_text, page
from test_inspect_trace import record

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TRITON = "triton_poi_fused__unsafe_view_gelu_mul_0"
LIGER = "_geglu_tanh_forward_kernel"
needs_h200 = pytest.mark.skipif(not (DATA / "h200_mlp_eager.json.gz").exists(), reason="no committed H200 traces")


def raw(name: str) -> dict:
    return it.read_json(DATA / f"h200_{name}.json.gz")


def parse(data: dict, path="<test>"):
    return it.parse_trace(copy.deepcopy(data), path)


def mean_per_step(trace, op_names: set[str], kernel_names: set[str] = frozenset()) -> float:
    """Independent count: the mean over steps of the kernels launched by these ops (or with these names)."""
    return sum(k.dur for st in trace.steps for k in st.kernels
               if (k.op is not None and k.op.name in op_names) or k.name in kernel_names) / len(trace.steps)


# --------------------------------------------------------------------------- rewriting a committed trace

GPU_CATS = {"kernel", "gpu_memset", "gpu_memcpy"}


def _swap(events: list[dict], first: list[dict], second: list[dict]) -> None:
    """Exchange two consecutive windows of events in time: `second` moves to where `first` started."""
    s1, e1 = min(e["ts"] for e in first), max(e["ts"] + e.get("dur", 0) for e in first)
    s2, e2 = min(e["ts"] for e in second), max(e["ts"] + e.get("dur", 0) for e in second)
    assert e1 <= s2
    for e in first:
        e["ts"] += e2 - e1
    for e in second:
        e["ts"] -= s2 - s1


def gelu_before_up(data: dict) -> dict:
    """The MLP written as one expression, down(gelu(gate(x)) * up(x)): gate GEMM, GeLU, up GEMM, mul, down GEMM.

    The committed eager trace launches gate, up, GeLU, mul, down; in every step the up_proj subtree (its
    aten::linear and every span and runtime call inside, and the GPU work they launched) and the GeLU subtree
    exchange places, on the CPU thread and on the GPU stream."""
    data = copy.deepcopy(data)
    xs = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    by_corr = {}
    for e in xs:
        if e.get("cat") in GPU_CATS:
            by_corr.setdefault(e["args"]["correlation"], []).append(e)
    for step in [e for e in xs if e["name"].startswith("ProfilerStep#")]:
        inside = [e for e in xs if e.get("cat") not in GPU_CATS and e["tid"] == step["tid"]
                  and step["ts"] < e["ts"] < step["ts"] + step["dur"]]
        up = sorted((e for e in inside if e["name"] == "aten::linear"), key=lambda e: e["ts"])[1]
        gelu = next(e for e in inside if e["name"] == "aten::gelu")

        def within(op):
            return [e for e in inside if op["ts"] <= e["ts"] <= op["ts"] + op["dur"]]

        cpu_up, cpu_gelu = within(up), within(gelu)
        gpu_up = [g for e in cpu_up if "correlation" in e["args"] for g in by_corr.get(e["args"]["correlation"], [])]
        gpu_gelu = [g for e in cpu_gelu if "correlation" in e["args"]
                    for g in by_corr.get(e["args"]["correlation"], [])]
        _swap(data["traceEvents"], cpu_up, cpu_gelu)
        _swap(data["traceEvents"], gpu_up, gpu_gelu)
    return data


def without_annotations_and_shapes(data: dict, keep_ops: bool = True) -> dict:
    """What another harness writes: no record_function spans (ProfilerStep aside), no shapes; optionally no ops."""
    data = copy.deepcopy(data)
    out = []
    for e in data["traceEvents"]:
        if not isinstance(e, dict):
            continue
        if e.get("cat") == "user_annotation" and not str(e.get("name", "")).startswith("ProfilerStep#"):
            continue
        if e.get("cat") == "cpu_op" and not keep_ops:
            continue
        if isinstance(e.get("args"), dict):
            e["args"] = {k: v for k, v in e["args"].items() if not k.startswith(("Input", "Concrete"))}
        out.append(e)
    data["traceEvents"] = out
    return data


@pytest.fixture(scope="module")
def h200():
    return {name: raw(name) for name in ("mlp_eager", "mlp_compile", "liger", "fused_eager")}


# ----------------------------------------------------------------------------------- 1. launch order differs

@needs_h200
def test_the_reordering_really_reorders(h200):
    t = parse(gelu_before_up(h200["mlp_eager"]))
    orig = parse(h200["mlp_eager"])
    for st, st0 in zip(t.steps, orig.steps):
        assert [k.op.name for k in st.kernels] == ["aten::mm", "aten::gelu", "aten::mm", "aten::mul", "aten::mm"]
        assert [k.op.name for k in st0.kernels] == ["aten::mm", "aten::mm", "aten::gelu", "aten::mul", "aten::mm"]
        assert st.gpu_busy == pytest.approx(st0.gpu_busy)  # the same work, another order


@needs_h200
@pytest.mark.parametrize("other, new", [("mlp_compile", TRITON), ("liger", LIGER)])
def test_reordered_gelu_and_mul_are_replaced_together(h200, other, new):
    a, b = parse(gelu_before_up(h200["mlp_eager"])), parse(h200[other])
    gelu, mul = [k.name for k in a.steps[0].kernels if k.op.name in ("aten::gelu", "aten::mul")]
    m = it.match(a, b)
    assert m.replaced == [([gelu, mul], [new])]  # not "GeLU -> nothing" and "mul -> the fused kernel"
    (g,) = m.groups
    assert g.by == "gelu, mul" and g.times == 1
    assert g.old_us == pytest.approx(mean_per_step(a, {"aten::gelu", "aten::mul"}))
    assert g.new_us == pytest.approx(mean_per_step(b, set(), {new}))
    assert g.new_us < g.old_us
    text = it.compare(a, b)
    assert f"-> {new}" in text and "(nothing)" not in text
    assert f"{g.old_us:.1f} -> {g.new_us:.1f} µs per step ({100 * (g.new_us - g.old_us) / g.old_us:+.0f}%)" in text


@needs_h200
def test_without_annotations_or_shapes_the_ops_still_pair_them(h200):
    a = parse(without_annotations_and_shapes(gelu_before_up(h200["mlp_eager"])))
    for other, new in (("mlp_compile", TRITON), ("liger", LIGER)):
        b = parse(without_annotations_and_shapes(h200[other]))
        assert not any(e.name == "mlp_fwd" for st in b.steps for e in st.spans)
        assert not any("Input Dims" in e.args for st in b.steps for e in st.spans)
        (g,) = it.match(a, b).groups
        assert g.new == [new] and len(g.old) == 2 and g.by == "gelu, mul"


@needs_h200
def test_kernels_alone_are_grouped_as_a_whole_not_guessed(h200):
    """No CPU ops at all: nothing says what the kernels do, so the step's unmatched kernels form one group."""
    a = parse(without_annotations_and_shapes(gelu_before_up(h200["mlp_eager"]), keep_ops=False))
    b = parse(without_annotations_and_shapes(h200["liger"], keep_ops=False))
    assert all(k.op is None or k.op.name.startswith("ProfilerStep#") for st in a.steps for k in st.kernels)
    (g,) = it.match(a, b).groups
    assert g.by == units.REST and len(g.old) == 2 and g.new == [LIGER]
    assert g.old_us == pytest.approx(sum(k.dur for st in a.steps for k in st.kernels
                                         if "elementwise" in k.name) / len(a.steps))


# --------------------------------------------------------------------------- 2. anchors are never counted

def autotuned(data: dict, name="triton_tem_fused_mm_0", dur=61.0) -> dict:
    """max-autotune's choice for the first GEMM of each step: Inductor's Triton template instead of cuBLAS,
    launched from a span of the kernel's name; the second GEMM of the same cuBLAS name stays."""
    data = copy.deepcopy(data)
    xs = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    kernels = {e["args"]["correlation"]: e for e in xs if e.get("cat") == "kernel"}
    for step in [e for e in xs if e["name"].startswith("ProfilerStep#")]:
        launches = sorted((e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")
                           and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
                           and e["args"].get("correlation") in kernels), key=lambda e: e["ts"])
        first = kernels[launches[0]["args"]["correlation"]]
        assert "coopA" in first["name"]
        first["name"], first["dur"] = name, dur
        ext = launches[0]["args"]["External id"]
        op = next(e for e in xs if e.get("cat") == "cpu_op" and e["args"].get("External id") == ext)
        op["name"] = name
    return data


@needs_h200
def test_a_same_name_gemm_that_stayed_is_not_in_the_replaced_group(h200):
    a = parse(h200["mlp_compile"])
    b = parse(autotuned(h200["mlp_compile"]))
    coop_a = a.steps[0].kernels[0].name
    m = it.match(a, b)
    assert m.replaced == [([coop_a], ["triton_tem_fused_mm_0"])]
    (g,) = m.groups
    assert g.by == "mm"
    # Only the first GEMM of each step: the second, same name, is an anchor. Summing every call of the name
    # (the old `sum(ta[n] for n in set(old))`) would count both.
    first = sum(st.kernels[0].dur for st in a.steps) / len(a.steps)
    both = mean_per_step(a, set(), {coop_a})
    assert g.old_us == pytest.approx(first) and abs(g.old_us - both) > 50
    assert g.new_us == pytest.approx(61.0)
    d = it.comparison_data(a, b)
    (r,) = d["replaced"]
    assert (r["old_us"], r["new_us"]) == (pytest.approx(first), pytest.approx(61.0))
    assert r["old_calls"] == {coop_a: 1} and r["new_calls"] == {"triton_tem_fused_mm_0": 1}


# ------------------------------------------------------------------------- 3. calls per step, time per call

@needs_h200
def test_calls_per_step_then_time_per_call_each_call_once(h200):
    """Two calls of one GEMM in A, one in B (the other became a Triton template): the same-name row holds the call
    that stayed, 1 and 1, and is marked; the other call is the group's, counted there only."""
    a = parse(h200["mlp_compile"])
    b = parse(autotuned(h200["mlp_compile"]))
    coop_a = a.steps[0].kernels[0].name
    stayed_a, stayed_b = (sum(st.kernels[1].dur for st in t.steps) / len(t.steps) for t in (a, b))
    d = it.comparison_data(a, b)
    (row,) = [s for s in d["same"] if s["name"] == coop_a]
    assert (row["a"]["calls"], row["b"]["calls"]) == (1, 1) and row["elsewhere"] == {"a": 1, "b": 0}
    assert (row["a"]["us"], row["b"]["us"]) == (pytest.approx(stayed_a), pytest.approx(stayed_b))
    (r,) = d["replaced"]
    assert r["old_calls"] == {coop_a: 1}
    assert row["a"]["us"] + r["old_us"] == pytest.approx(mean_per_step(a, set(), {coop_a}))  # both calls, once each
    text = it.compare(a, b)
    line = next(ln for ln in text.splitlines() if ln.startswith(coop_a))
    per_call = 100 * (stayed_b - stayed_a) / stayed_a
    assert line.split() == [coop_a, "*", "1", "1", f"{stayed_a:.1f}", f"{stayed_b:.1f}", f"{per_call:+.0f}%",
                            f"{stayed_a:.1f}", f"{stayed_b:.1f}"]
    assert "* the calls that stayed; this name's other calls are counted below (Replaced, Only in), once" in text


# ------------------------------------------------------------------------------------- 4. long steps

def kineto(steps: list[list[tuple]]) -> dict:
    """A trace in kineto's format: each step a list of (kernel, µs, launching op or None[, its input sizes]),
    launched in that order."""
    ev, t, gpu_t, corr = [], 0.0, 0.0, 0
    for number, kernels in enumerate(steps, start=2):
        start = t
        t += 1
        for name, dur, op, *dims in kernels:
            corr += 1
            if op:
                ev.append({"ph": "X", "cat": "cpu_op", "name": op, "ts": t, "dur": 4, "pid": 1, "tid": 1,
                           "args": {"External id": corr, **({"Input Dims": dims[0]} if dims else {})}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": 2, "pid": 1,
                       "tid": 1, "args": {"External id": corr, "correlation": corr}})
            gpu_t = max(gpu_t, t + 3)
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": gpu_t, "dur": dur, "pid": 0, "tid": 7,
                       "args": {"External id": corr, "correlation": corr}})
            gpu_t += dur
            t += 5
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "ts": start,
                   "dur": t - start, "pid": 1, "tid": 1, "args": {}})
        t += 1
    return {"traceEvents": ev}


GEMM_A, GEMM_B, GELU, MUL = "nvjet_coopA", "nvjet_coopB", "gelu_kernel", "mul_kernel"


def mlp_layers(layers: int, fused: bool) -> list[tuple[str, float, str]]:
    out = []
    for i in range(layers):
        wobble = (i % 7) * 0.1
        if fused:
            out += [(GEMM_A, 57.5, "aten::mm"), (GEMM_A, 57.5, "aten::mm"), (TRITON, 56.0 + wobble, TRITON),
                    (GEMM_B, 52.9, "aten::mm")]
        else:  # the one-expression order
            out += [(GEMM_A, 57.5, "aten::mm"), (GELU, 31.0 + wobble, "aten::gelu"), (GEMM_A, 57.5, "aten::mm"),
                    (MUL, 36.0, "aten::mul"), (GEMM_B, 52.9, "aten::mm")]
    return out


def test_a_long_step_is_compared_in_near_linear_time():
    """20,000 kernels per step (4,000 layers, GeLU and mul launched apart): difflib's alignment took over six
    minutes at 5,000; the comparison must take a few seconds at most, and still pair GeLU + mul in every layer."""
    layers = 4000
    a = it.parse_trace(kineto([mlp_layers(layers, fused=False)]))
    b = it.parse_trace(kineto([mlp_layers(layers, fused=True)]))
    assert len(a.steps[0].kernels) == 20_000
    t0 = time.perf_counter()
    d = it.comparison_data(a, b)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10, f"{elapsed:.1f} s for 20k kernels per step"  # ~1 s here; difflib: more than an hour
    (r,) = d["replaced"]
    assert (r["old"], r["new"], r["times"], r["by"]) == ([GELU, MUL], [TRITON], layers, "gelu, mul")
    assert r["old_us"] == pytest.approx(sum(31.0 + (i % 7) * 0.1 + 36.0 for i in range(layers)))
    assert r["old_calls"] == {GELU: layers, MUL: layers} and r["new_calls"] == {TRITON: layers}
    text = compare_text.render(d)
    assert f"{layers} × ({GELU} + {MUL})" in text and len(text.splitlines()) < 60


def test_many_steps_print_a_short_step_table_and_json_keeps_them_all():
    a = it.parse_trace(kineto([mlp_layers(1, fused=False)] * 600))
    b = it.parse_trace(kineto([mlp_layers(1, fused=True)] * 600))
    d = it.comparison_data(a, b)
    assert [s["step"] for s in d["a"]["steps"]] == list(range(2, 602))
    text = compare_text.render(d)
    table = text.split("Per step (µs)")[1].split("\n\n")[0].splitlines()
    assert len(table) == 11 and "#601" in table[-3] and "median" in table[-2] and len(text.splitlines()) < 50
    # A hostile name (a megabyte of what could look like Inductor's) costs no more than a short one.
    t0 = time.perf_counter()
    pairing._words("cpp_fused_" * 100_000 + "x")
    assert time.perf_counter() - t0 < 2


def test_align_small_cases():
    assert align.align([], ["x"]) == []
    assert align.align(["g", "gelu", "g", "mul", "h"], ["g", "g", "fused", "h"]) == [(0, 0), (2, 1), (4, 3)]
    # unique names anchor first: a block that moved keeps its order around the anchors
    assert align.align(list("abcdefg"), list("abcxdefg")) == [(0, 0), (1, 1), (2, 2), (3, 4), (4, 5), (5, 6), (6, 7)]


def test_sizes_pair_what_no_word_does_and_the_rest_is_one_group():
    """Ops whose names share nothing: the recorded input sizes pair them ([4, 32] = 128 elements with [128, 1]),
    whatever the launch order; what neither names nor sizes pair stays one group, not a guess by position."""
    a = it.parse_trace(kineto([[(GEMM_A, 50.0, "aten::mm"), ("scale_k", 3.0, "aten::foo", [[4, 32]]),
                                ("shift_k", 5.0, "aten::bar", [[8, 8]]), ("odd_k", 1.0, "aten::baz"),
                                (GEMM_B, 40.0, "aten::mm")]] * 2))
    b = it.parse_trace(kineto([[(GEMM_A, 50.0, "aten::mm"), ("shift_new", 4.0, "MyShift", [[64, 1]]),
                                ("scale_new", 2.0, "MyScale", [[128, 1]]), ("other_new", 7.0, "Qux"),
                                (GEMM_B, 40.0, "aten::mm")]] * 2))
    m = it.match(a, b)
    assert [(g.old, g.new, g.by) for g in m.groups] == [(["scale_k"], ["scale_new"], "tensor sizes"),
                                                        (["shift_k"], ["shift_new"], "tensor sizes"),
                                                        (["odd_k"], ["other_new"], units.REST)]
    assert [(g.old_us, g.new_us) for g in m.groups] == [(3.0, 2.0), (5.0, 4.0), (1.0, 7.0)]


def test_what_nothing_tells_apart_is_one_group_per_layer_not_split_by_position():
    """An eager MLP (gate GEMM, GeLU, up GEMM, mul, a split-K down GEMM and its reduce) against two Triton kernels
    launched from Python (no CPU op, no shapes: an H200 decode trace of the model rung). Nothing says which of
    A's six became which of B's two; pairing by position made "gate GEMM -> fused gate/up kernel, +82%" and
    "the rest -> down kernel, -51%". Each layer's block is one group, its µs the sum of its kernels."""
    kept = [("rmsnorm_k", 3.0, "aten::mul")]
    old = [("gemm_128x8", 18.0, "aten::mm"), ("gelu_k", 1.2, "aten::gelu"), ("gemm_128x8", 18.4, "aten::mm"),
           ("mul_k", 1.3, "aten::mul"), ("gemm_splitK", 18.5, "aten::mm"), ("splitKreduce_kernel", 1.5, None)]
    new = [("_geglu_small_m_kernel", 33.1, None), ("_linear_small_m_kernel", 19.9, None)]
    layers = 3
    a = it.parse_trace(kineto([(kept + old) * layers + kept] * 2))
    b = it.parse_trace(kineto([(kept + new) * layers + kept] * 2))
    (g,) = it.match(a, b).groups
    assert g.by == units.REST and g.times == layers
    assert sorted(g.old) == sorted(n for n, _, _ in old) and g.new == [n for n, _, _ in new]
    assert g.old_us == pytest.approx(layers * (18.0 + 1.2 + 18.4 + 1.3 + 18.5 + 1.5))
    assert g.new_us == pytest.approx(layers * (33.1 + 19.9))


def test_each_layers_replacement_pairs_with_its_own_even_when_the_next_is_nearer_above():
    """Two layers of mm, mm, GeLU, mm; B launches its (other) GeLU kernel one GEMM earlier in each layer. A's first
    GeLU sits after 2 of the 6 GEMMs that stayed, B's after 1 and 4: one below, two above. Each layer's GeLU is
    replaced by that layer's, twice the same replacement; not both layers' GeLUs by both of B's."""
    layer_a = [(GEMM_A, 50.0, "aten::mm"), (GEMM_A, 50.0, "aten::mm"), ("gelu_erf", 30.0, "aten::gelu"),
               (GEMM_B, 40.0, "aten::mm")]
    layer_b = [(GEMM_A, 50.0, "aten::mm"), ("gelu_tanh", 20.0, "aten::gelu"), (GEMM_A, 50.0, "aten::mm"),
               (GEMM_B, 40.0, "aten::mm")]
    a, b = it.parse_trace(kineto([layer_a * 2] * 2)), it.parse_trace(kineto([layer_b * 2] * 2))
    d = it.comparison_data(a, b)
    assert [(r["old"], r["new"], r["times"], r["by"]) for r in d["replaced"]] == [(["gelu_erf"], ["gelu_tanh"], 2, "gelu")]
    assert (d["replaced"][0]["old_us"], d["replaced"][0]["new_us"]) == (60.0, 40.0)  # per step: 2 x 30 -> 2 x 20



# --------------------------------------------------------------- grouping rules, each on a few hand-built kernels

def replaced(d: dict) -> list[tuple]:
    return [(r["old"], r["new"], r["by"]) for r in d["replaced"]]


def one_op_launches_two(data: dict, first: int) -> dict:
    """kineto() gives each kernel its own op: here the op of kernel `first` (1-based, its correlation id) also
    launches the next one, as aten::mm launches a split-K GEMM and its reduce; the next kernel's op is dropped."""
    ev = data["traceEvents"]
    op = next(e for e in ev if e["cat"] == "cpu_op" and e["args"]["External id"] == first)
    op["dur"] = 10  # over the next launch (5 µs later, 2 µs long), short of the one after
    data["traceEvents"] = [e for e in ev if not (e["cat"] == "cpu_op" and e["args"]["External id"] == first + 1)]
    return data


def test_two_gelus_in_one_gap_pair_with_the_ones_at_their_place():
    """Between the same two GEMMs, A's two GeLU kernels became B's two: the first with the first, the second with
    the second (the same offset since the last kernel that stayed), not crossed."""
    keep = ("nvjet", 50.0, "aten::mm")
    a = kineto([[keep, ("gelu_k1", 3.0, "aten::gelu"), ("gelu_k2", 4.0, "aten::gelu"), keep]])
    b = kineto([[keep, ("fused_k1", 2.0, "MyGelu"), ("fused_k2", 1.0, "MyGelu"), keep]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert replaced(d) == [(["gelu_k1"], ["fused_k1"], "gelu"), (["gelu_k2"], ["fused_k2"], "gelu")]
    assert [(s["name"], s["a"]["name"], s["b"]["name"], s["a"]["calls"]) for s in d["same"]] == [
        ("nvjet", "nvjet", "nvjet", 2)]


def in_spans(data: dict, spans: list[tuple[str, int, int]]) -> dict:
    """kineto()'s first step with annotations added: (name, first, last) spans the launches of kernels first..last
    (0-based, in launch order), as a module's record_function span does."""
    for name, first, last in spans:  # kernel k's op starts at 1 + 5k (4 µs), its launch at 2 + 5k
        data["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": name, "ts": 0.5 + 5 * first,
                                    "dur": 5 * (last - first) + 5, "pid": 1, "tid": 1, "args": {}})
    return data


# One MLP layer: eager's five kernels (each launched by an op that recorded its sizes), a fused module's two
# (launched from Python: no op); a kept GEMM around them.
MLP_KEEP = ("nvjet_keep", 9.0, "aten::mm")
MLP_EAGER = [("nvjet_gu", 18.0, "aten::mm", [[1, 2048], [2048, 16384]]), ("gelu_k", 1.0, "aten::gelu"),
             ("nvjet_gu", 18.0, "aten::mm", [[1, 2048], [2048, 16384]]), ("mul_k", 1.5, "aten::mul"),
             ("nvjet_down", 19.0, "aten::mm", [[1, 16384], [16384, 2048]])]
MLP_FUSED = [("geglu_k", 33.0, None), ("linear_k", 20.0, None)]


def test_a_fused_module_replaces_the_whole_block_its_words_do_not_tell_apart():
    """Two layers' MLPs: eager's gate GEMM, GeLU, up GEMM, mul and down GEMM (ops with sizes) became a fused
    module's two kernels, launched from Python (no op, no sizes), under the same module spans. Nothing but the
    module's words (model, layers, mlp), which every kernel there has, links them: each MLP is replaced as a
    whole, not its first two kernels by the fused two at the same launch position."""
    keep, eager, fused = MLP_KEEP, MLP_EAGER, MLP_FUSED
    a = in_spans(kineto([[keep, *eager, keep, *eager, keep]]),
                 [("model.layers.0.mlp", 1, 5), ("model.layers.1.mlp", 7, 11)])
    b = in_spans(kineto([[keep, *fused, keep, *fused, keep]]),
                 [("model.layers.0.mlp", 1, 2), ("model.layers.1.mlp", 4, 5)])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    (r,) = d["replaced"]
    assert (r["old"], r["new"], r["times"], r["by"]) == (
        ["nvjet_gu", "gelu_k", "nvjet_gu", "mul_k", "nvjet_down"], ["geglu_k", "linear_k"], 2, "layers, mlp, model")
    assert r["old_us"] == pytest.approx(2 * 57.5) and r["new_us"] == pytest.approx(2 * 53.0)
    assert d["only_a"] == [] and d["only_b"] == []


def test_kernels_one_op_launched_are_replaced_together():
    """Two split-K GEMMs (each aten::mm launches a GEMM and its reduce) became two single-kernel GEMMs: one group
    per op, the reduce with its own GEMM, each pair of A's kernels for one of B's."""
    keep = ("keep_k", 5.0, "aten::add")
    a = kineto([[keep, ("splitk_gemm", 20.0, "aten::mm"), ("splitk_reduce", 2.0, "aten::mm"),
                 ("splitk_gemm", 21.0, "aten::mm"), ("splitk_reduce", 3.0, "aten::mm")]])
    a = one_op_launches_two(one_op_launches_two(a, 2), 4)
    b = kineto([[keep, ("gemm_one", 18.0, "aten::mm"), ("gemm_two", 19.0, "aten::mm")]])
    ta = it.parse_trace(a)
    assert [k.op.ts for k in ta.steps[0].kernels[1:]] == [6.0, 6.0, 16.0, 16.0]  # two ops, two kernels each
    d = it.comparison_data(ta, it.parse_trace(b))
    assert replaced(d) == [(["splitk_gemm", "splitk_reduce"], ["gemm_one"], "mm"),
                           (["splitk_gemm", "splitk_reduce"], ["gemm_two"], "mm")]
    assert [(r["old_us"], r["new_us"]) for r in d["replaced"]] == [(22.0, 18.0), (24.0, 19.0)]


@pytest.mark.parametrize("kept_between, paired", [(1, True), (2, True), (3, False)])
def test_a_gemm_pairs_with_one_at_most_max_gap_kept_kernels_away(kept_between, paired):
    """A's GEMM left before the kernels that stayed, B's came after them: GEMM for GEMM up to MAX_GAP (2) kept
    kernels apart; at 3 each is only in its own trace."""
    kept = [(f"keep_{i}", 5.0, f"aten::op{i}") for i in range(kept_between)]
    a = kineto([[("gemm_old", 20.0, "aten::mm")] + kept])
    b = kineto([kept + [("gemm_new", 18.0, "aten::mm")]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    if paired:
        assert replaced(d) == [(["gemm_old"], ["gemm_new"], "mm")] and d["only_a"] == d["only_b"] == []
    else:
        assert d["replaced"] == []
        assert [r["name"] for r in d["only_a"]] == ["gemm_old"] and [r["name"] for r in d["only_b"]] == ["gemm_new"]


def test_a_gemm_that_came_takes_one_gemm_that_left_only():
    """A's two GEMMs of one size, B's two of which only the first has that size: the second of A takes B's
    second (GEMM for GEMM, in order), not the first again: two groups, one for one."""
    same, other = [[64, 64], [64, 64]], [[32, 8], [8, 8]]
    a = kineto([[("gemm_old", 20.0, "aten::mm", same), ("gemm_old", 21.0, "aten::mm", same)]])
    b = kineto([[("gemm_new", 18.0, "aten::mm", same), ("gemm_other", 19.0, "aten::mm", other)]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert replaced(d) == [(["gemm_old"], ["gemm_new"], "mm"), (["gemm_old"], ["gemm_other"], "mm")]
    assert [(r["old_us"], r["new_us"]) for r in d["replaced"]] == [(20.0, 18.0), (21.0, 19.0)]


def test_two_traces_without_a_kernel_in_common():
    """Nothing stayed (no pair to anchor a gap): A's one kernel and B's, which nothing tells apart, are one group."""
    d = it.comparison_data(it.parse_trace(kineto([[("k_old", 5.0, "aten::foo")]])),
                           it.parse_trace(kineto([[("k_new", 4.0, "aten::bar")]])))
    assert replaced(d) == [(["k_old"], ["k_new"], units.REST)] and d["same"] == []


def test_back_to_eager_the_gelu_a_template_fused_joins_its_group():
    """A (max-autotune) ran a Triton mm template with GeLU fused, B (eager) a cuBLAS GEMM and a GeLU kernel: GEMM
    for GEMM first, then B's GeLU, alone, joins by its word the group holding the template."""
    keep = ("keep_k", 5.0, "aten::add")
    tem = "triton_tem_fused_mm_gelu_0"
    a = kineto([[keep, (tem, 30.0, tem)]])
    b = kineto([[keep, ("nvjet", 25.0, "aten::mm"), ("gelu_kernel", 6.0, "aten::gelu")]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert replaced(d) == [([tem], ["nvjet", "gelu_kernel"], "gelu, mm")]
    assert (d["replaced"][0]["old_us"], d["replaced"][0]["new_us"]) == (30.0, 31.0)


def test_what_nothing_tells_apart_joins_the_leftovers_one_gap_later():
    """A's unrecognised kernel sits before the kernel that stayed, B's after it (one gap later), beside a GEMM
    that replaced A's: the two leftovers are one group, and the GEMMs another; not all four in one."""
    keep = ("keep_k", 5.0, "aten::add")
    a = kineto([[("odd_old", 3.0, "Qux"), keep, ("gemm_old", 20.0, "aten::mm")]])
    b = kineto([[keep, ("gemm_new", 18.0, "aten::mm"), ("odd_new", 2.0, "aten::baz")]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert replaced(d) == [(["odd_old"], ["odd_new"], units.REST), (["gemm_old"], ["gemm_new"], "mm")]


@pytest.mark.parametrize("extra_in", ["a", "b"])
def test_an_extra_kernel_beside_a_replaced_gemm_joins_its_group(extra_in):
    """One trace launches a kernel more beside a GEMM that was replaced, and nothing else is left over in the
    other: no word or size pairs it, so it joins the group nearest it (by place), not "only in" one trace."""
    keep = ("keep_k", 5.0, "aten::add")
    old = [keep, ("gemm_old", 20.0, "aten::mm"), ("odd_k", 3.0, "Qux"), keep]
    new = [keep, ("gemm_new", 18.0, "aten::mm"), keep]
    a, b = (old, new) if extra_in == "a" else (new, old)
    d = it.comparison_data(it.parse_trace(kineto([a])), it.parse_trace(kineto([b])))
    names = (["gemm_old", "odd_k"], ["gemm_new"])
    assert replaced(d) == [(names if extra_in == "a" else names[::-1]) + ("mm",)]
    assert d["only_a"] == d["only_b"] == []


def test_fused_back_to_two_kernels_beside_an_unrelated_change():
    """A's fused GeLU * mul (one op, Liger's words) became B's GeLU and mul; beside it, an op no word or size
    pairs changed too: two groups, the second by place only, not one group of everything."""
    keep = ("keep_k", 5.0, "aten::add")
    a = kineto([[keep, ("liger_k", 8.0, "LigerGELUMulFunction"), ("odd_old", 3.0, "Qux"), keep]])
    b = kineto([[keep, ("gelu_kernel", 5.0, "aten::gelu"), ("mul_kernel", 4.0, "aten::mul"), ("odd_new", 2.0, "Zot"),
                 keep]])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert replaced(d) == [(["liger_k"], ["gelu_kernel", "mul_kernel"], "gelu, mul"),
                           (["odd_old"], ["odd_new"], units.REST)]


def test_a_trace_without_steps_beside_a_gpu_trace():
    """Through the API a trace may have no events at all (the CLI refuses it): 0 steps in its launch order, no
    kernel time; and its units are the CPU's, so the comparison speaks of units of work, not GPU kernels."""
    a = it.parse_trace(kineto([[("k", 5.0, "aten::mm")]]))
    empty = it.parse_trace({"traceEvents": []})
    assert (a.device, empty.device, empty.steps) == ("cuda", "cpu", [])
    d = it.comparison_data(a, empty)
    assert d["launch_order_steps"] == {"a": 1, "b": 0} and d["kernel_us"] == {"a": 5.0, "b": 0}
    assert d["units"] == "units of work (CPU kernels)"
    assert it.comparison_data(a, a)["units"] == "GPU kernels"


def test_the_training_phases_leave_each_step_out():
    """Both traces run a backward: the comparison holds each side's medians (hand_trace's forward GEMM, 30 µs),
    not its per-step lists (the report's own data has those)."""
    from test_train_step import hand_trace

    d = it.comparison_data(it.parse_trace(hand_trace()), it.parse_trace(hand_trace(annotated=False)))
    for side in "ab":
        assert "steps" not in d["training"][side] and d["training"][side]["phases"]["forward"]["gpu_us"] == 30

# -------------------------------------------------------------------- recorded: the one-expression MLP

@pytest.mark.profiles  # records two profiles in this process and runs the CLI: seconds, left out under mutmut
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_one_expression_mlp_eager_vs_compile(tmp_path, device):
    """03_simple_mlp's model, its forward written as one expression: eager launches mm, gelu, mm, mul, mm;
    Inductor's one kernel (C++ on the CPU, Triton on a GPU) replaces gelu + mul. Compared through the CLI's --json.
    The CPU at a tiny shape; a GPU at the post's."""
    import importlib

    torch.manual_seed(0)
    dim, hidden, shape = (32, 64, (2, 8, 32)) if device == "cpu" else (768, 3072, (64, 128, 768))
    model = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(dim, hidden).to(device, torch.bfloat16).eval()
    x = torch.randn(*shape, dtype=torch.bfloat16, device=device)

    def one_expression(x):
        return model.down_proj(F.gelu(model.gate_proj(x), approximate="tanh") * model.up_proj(x))

    with torch.no_grad():
        eager = record(lambda: one_expression(x), tmp_path / "eager.json", device)
        torch._dynamo.reset()
        with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
            compiled = torch.compile(one_expression)
            compiled(x)  # compile outside the trace
            comp = record(lambda: compiled(x), tmp_path / "compile.json", device)
    a = it.load_trace(eager)

    def units(st):
        return [k.op.name for k in st.kernels] if device == "cuda" else [e.name for e in it.cpu_kernels(st)]

    assert units(a.steps[0]) == ["aten::mm", "aten::gelu", "aten::mm", "aten::mul", "aten::mm"]
    proc = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--json", str(eager), str(comp)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["a"]["device"] == d["b"]["device"] == device
    (r,) = d["replaced"]
    pointwise = [(k.name, k.dur) for st in a.steps for k in st.kernels if k.op.name in ("aten::gelu", "aten::mul")] \
        if device == "cuda" else [(e.name, e.dur) for st in a.steps for e in it.cpu_kernels(st)
                                  if e.name in ("aten::gelu", "aten::mul")]
    assert r["old"] == [n for n, _ in pointwise[:2]] and len(r["new"]) == 1
    assert ("cpp_fused" if device == "cpu" else "triton_") in r["new"][0] and "gelu" in r["new"][0]
    assert "gelu" in r["by"] and "mul" in r["by"]
    assert r["old_us"] == pytest.approx(sum(t for _, t in pointwise) / len(a.steps))
    assert len(d["same"]) >= 1 and sum(s["a"]["calls"] for s in d["same"]) == 3  # the three GEMMs stayed


@needs_h200
def test_cli_json_on_two_h200_traces_and_bad_input():
    eager = str(DATA / "h200_mlp_eager.json.gz")
    proc = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--json", eager,
                           str(DATA / "h200_liger.json.gz")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == ""
    d = json.loads(proc.stdout)
    (r,) = d["replaced"]
    assert r["new"] == [LIGER] and set(r) >= {"old", "new", "old_us", "new_us", "old_calls", "new_calls"}
    assert [s["step"] for s in d["a"]["steps"]] == [2, 3, 4]
    bad = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--json", eager, str(ROOT / "nope.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------ README

@needs_h200
def test_readme_comparisons_are_what_the_committed_traces_give(monkeypatch):
    """Each output block quoted in the README or a docs page that starts with `A  tests/data/...` and `B  tests/data/...`:
    its pieces (cut at `…` lines) are, in order, pieces of what compare() prints for those two traces."""
    import re

    monkeypatch.chdir(ROOT)  # the README's paths, as its commands give them
    text = all_text()
    blocks = re.findall(r"```\n(A  tests/data/.*?)```", text, flags=re.S)
    pairs = []
    for block in blocks:
        lines = block.rstrip("\n").split("\n")
        a, b = (re.match(rf"{side}  (tests/data/\S+)  \(", line).group(1) for side, line in zip("AB", lines))
        pairs.append((Path(a).name, Path(b).name))
        out = it.compare(it.load_trace(a), it.load_trace(b))
        pos = 0
        for piece in "\n".join(lines).split("\n…"):
            piece = piece.strip("\n")
            if piece:
                found = out.find(piece, pos)
                assert found >= 0, f"README quotes, for {a} vs {b}:\n{piece}\n\nbut compare() prints:\n{out}"
                pos = found + len(piece)
    assert ("h200_mlp_eager.json.gz", "h200_mlp_compile.json.gz") in pairs
    assert ("h200_mlp_eager.json.gz", "h200_liger.json.gz") in pairs


@needs_h200
def test_readme_fused_mlp_figures_are_what_the_committed_traces_give():
    """The 04_fused_mlp section's prose: compiled vs the fused kernel, figures re-derived from the committed traces."""
    import re

    text = " ".join(page("docs/04_fused_mlp.md").split())
    m = re.search(r"\(([\d.]+) µs per step\) replaced by `_geglu_tma_kernel` \(([\d.]+) µs\), `down_proj` unchanged "
                  r"\(([\d.]+) µs\)", text)
    assert m, "the 04_fused_mlp page no longer quotes the comparison"
    d = it.comparison_data(it.load_trace(DATA / "h200_mlp_compile.json.gz"),
                           it.load_trace(DATA / "h200_fused_eager.json.gz"))
    (r,) = d["replaced"]
    coop_a = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"  # gate and up: both calls are the group's
    assert r["new"] == ["_geglu_tma_kernel"] and r["old_calls"] == {coop_a: 2, TRITON: 1} and d["only_a"] == []
    (down,) = d["same"]
    assert [float(x) for x in m.groups()] == [round(r["old_us"], 1), round(r["new_us"], 1), round(down["b"]["us"], 1)]


def test_a_fused_module_is_replaced_per_layer_in_linear_time_and_keeps_its_neighbours_apart():
    """4,000 MLP layers with nothing kept between them (one gap of 20,000 eager kernels and 8,000 fused ones): one
    group per layer, by each layer's annotation, 4000 times, in seconds (joining every atom of the gap to every one
    took 97 s). And a changed kernel of another module one kept kernel away (a norm's mul) stays in its own group:
    the MLP's mul is not moved there."""
    keep, eager, fused = MLP_KEEP, MLP_EAGER, MLP_FUSED
    layers = 4000
    a = in_spans(kineto([[keep, *eager * layers, keep]]),
                 [(f"model.layers.{i}.mlp", 1 + 5 * i, 5 + 5 * i) for i in range(layers)])
    b = in_spans(kineto([[keep, *fused * layers, keep]]),
                 [(f"model.layers.{i}.mlp", 1 + 2 * i, 2 + 2 * i) for i in range(layers)])
    pa, pb = it.parse_trace(a), it.parse_trace(b)
    t0 = time.perf_counter()
    d = it.comparison_data(pa, pb)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10, f"{elapsed:.1f} s"
    assert [(r["times"], r["old"], r["new"]) for r in d["replaced"]] == [
        (layers, ["nvjet_gu", "gelu_k", "nvjet_gu", "mul_k", "nvjet_down"], ["geglu_k", "linear_k"])]
    norm = [("norm_mul_a", 1.0, "aten::mul")], [("norm_mul_b", 1.0, "aten::mul")]
    a = in_spans(kineto([[keep, *eager, keep, *norm[0], keep]]),
                 [("model.layers.0.mlp", 1, 5), ("model.layers.1.post_attention_layernorm", 7, 7)])
    b = in_spans(kineto([[keep, *fused, keep, *norm[1], keep]]),
                 [("model.layers.0.mlp", 1, 2), ("model.layers.1.post_attention_layernorm", 4, 4)])
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    assert [(r["old"], r["new"]) for r in d["replaced"]] == [
        (["nvjet_gu", "gelu_k", "nvjet_gu", "mul_k", "nvjet_down"], ["geglu_k", "linear_k"]),
        (["norm_mul_a"], ["norm_mul_b"])]


@needs_h200
def test_decode_eager_vs_fused_model_replaces_each_mlp_whole():
    """06's decode step, transformers' MLP against the fused one (4 layers, H200): each layer's eager MLP (gate and
    up GEMMs, GeLU, mul, the split-K down GEMM and its reduce) became the fused module's two Triton kernels, which
    carry no op and no sizes: one group per layer, not gate -> _geglu_small_m_kernel and the rest -> _linear."""
    d = it.comparison_data(it.load_trace(DATA / "h200_model_decode_eager.json.gz"),
                           it.load_trace(DATA / "h200_model_decode_fused.json.gz"))
    (r,) = d["replaced"]
    assert r["times"] == 4 and r["new_calls"] == {"_geglu_small_m_kernel": 4, "_linear_small_m_kernel": 4}
    gemms = [n for n in r["old_calls"] if n.startswith("nvjet")]
    assert sum(r["old_calls"][n] for n in gemms) == 12 and len(r["old_calls"]) == 5, r["old_calls"]
    assert any("Gelu" in n for n in r["old"]) and any("splitKreduce" in n for n in r["old"])
    assert d["only_a"] == [] and d["only_b"] == []


def test_training_lines_by_hand():
    """Two training steps' phases side by side (the dict comparison_data gives render): GPU µs and kernels on GPUs,
    CPU µs on a CPU; a phase one side lacks is left out; each side's optimizer on a line of its own."""
    phases_a = {"forward": {"gpu_us": 1186.0, "cpu_us": 300.0, "kernels": 2},
                "backward": {"gpu_us": 11758.0, "cpu_us": 500.0, "kernels": 31},
                "optimizer": {"gpu_us": 90.0, "cpu_us": 40.0, "kernels": 3}}
    phases_b = {"forward": {"gpu_us": 1290.0, "cpu_us": 330.0, "kernels": 2},
                "backward": {"gpu_us": 9253.0, "cpu_us": 450.0, "kernels": 25}}
    t = {"a": {"phases": phases_a, "optimizer": {"class": "AdamW", "implementation": "foreach", "ops": 4, "kernels": 3}},
         "b": {"phases": phases_b, "optimizer": {"class": None, "implementation": "fused", "ops": 1, "kernels": None}}}
    gpu = compare_text._training_lines(t, True)
    assert gpu[:2] == ["", "Training step, phase by phase (GPU µs per step, median over the steps):"]
    header, rows = gpu[2].splitlines()[0].split(), [r.split() for r in gpu[2].splitlines()[2:]]
    assert header == ["phase", "A", "GPU", "µs", "B", "GPU", "µs", "change", "kernels", "A", "kernels", "B"]
    # +9% = 100 * (1290 - 1186) / 1186 = 8.8; -21% = 100 * (9253 - 11758) / 11758 = -21.3
    assert rows == [["forward", "1,186", "1,290", "+9%", "2", "2"], ["backward", "11,758", "9,253", "-21%", "31", "25"]]
    fwd, bwd = gpu[2].splitlines()[2:4]  # numbers right-aligned: A's column ends at the same place in both rows
    assert fwd.index("1,186") + len("1,186") == bwd.index("11,758") + len("11,758")
    assert gpu[3:] == ["optimizer A: AdamW, looks foreach: 4 ops, 3 kernels per step",
                       "optimizer B: ?, looks fused: 1 ops per step"]
    cpu = compare_text._training_lines(t, False)
    assert cpu[1] == "Training step, phase by phase (CPU µs per step, median over the steps):"
    assert [r.split() for r in cpu[2].splitlines()[2:]] == [["forward", "300.0", "330.0", "+10%"],
                                                          ["backward", "500.0", "450.0", "-10%"]]
    assert cpu[3:] == ["optimizer A: AdamW, looks foreach: 4 ops per step", "optimizer B: ?, looks fused: 1 ops per step"]
    t["b"]["phases"] = {}
    assert compare_text._training_lines(t, True)[2] == "(no phase in both)"
    assert compare_text._training_lines(None, True) == []


def test_different_micro_batch_counts_are_said_and_set_per_micro_batch():
    """A run with 2 micro-batches a step against one with 1: each per-step phase holds that many passes, so the
    comparison says so and gives forward and backward per micro-batch (by hand: 600 / 2 = 300 against 280, +7%;
    900 / 2 = 450 against 500, -10%); the same count, or a side that does not tell, says nothing more."""
    phases = lambda f, b: {"forward": {"cpu_us": f, "gpu_us": None, "kernels": 0},  # noqa: E731
                           "backward": {"cpu_us": b, "gpu_us": None, "kernels": 0}}
    t = {"a": {"phases": phases(280.0, 500.0), "optimizer": None, "micro_batches": 1},
         "b": {"phases": phases(600.0, 900.0), "optimizer": None, "micro_batches": 2}}
    lines = compare_text._training_lines(t, False)
    assert lines[3:] == ["micro-batches per step: A 1, B 2: each phase above holds that many passes; per micro-batch "
                         "(CPU µs): forward 280.0 -> 300.0 (+7%), backward 500.0 -> 450.0 (-10%)"]
    t["b"]["micro_batches"] = 1
    assert len(compare_text._training_lines(t, False)) == 3
    del t["a"]["micro_batches"]
    t["b"]["micro_batches"] = 2
    assert len(compare_text._training_lines(t, False)) == 3


def test_micro_batches_of_two_other_harness_traces(capsys):
    """Two committed traces of another harness (tests/data/train_foreign: a tiny transformers Llama): an FSDP2 rank
    without accumulation against one process with 2 micro-batches a step; how many each step runs, counted here from
    the raw JSON: one aten::embedding (the token embedding) per forward."""
    import gzip
    import re

    def embeddings_per_step(path):
        evs = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in evs if e["name"].startswith("ProfilerStep#")]
        return {sum(1 for e in evs if e["name"] == "aten::embedding" and s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
                for s in steps}

    single, accum = DATA / "train_foreign/cpu_fsdp_rank0.json.gz", DATA / "train_foreign/cpu_accum.json.gz"
    assert embeddings_per_step(single) == {1} and embeddings_per_step(accum) == {2}
    assert it.main([str(single), str(accum)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("micro-batches per step:"))
    assert re.match(r"micro-batches per step: A 1, B 2: each phase above holds that many passes; per micro-batch "
                    r"\(CPU µs\): forward ", line), line
    assert it.main([str(accum), str(accum)]) == 0
    assert "micro-batches per step" not in capsys.readouterr().out


def test_names_count_repeats_and_times():
    assert compare_text._names(["k", "k", "m"], 1, str) == "2 × k + m"
    assert compare_text._names(["k", "m"], 3, str) == "3 × (k + m)"
    assert compare_text._names([], 4, str) == ""


def test_step_table_by_hand():
    """GPU busy and CPU span per step, A's and B's side by side, numbers right-aligned, the median and mean under
    them; a side without steps (a trace with no events, read through the API) shows "-" for both.
    By hand: GPU 10, 20, 60: median 20, mean 30; CPU 30, 50, 100: median 50, mean 60."""
    da = {"steps": [{"step": 2, "gpu_busy_us": 10.0, "cpu_us": 30.0}, {"step": 3, "gpu_busy_us": 20.0, "cpu_us": 50.0},
                    {"step": 4, "gpu_busy_us": 60.0, "cpu_us": 100.0}]}
    assert compare_text._steps_table(da, {"steps": []}) == [
        "Per step (µs): GPU busy and CPU span, side by side (3 steps)",
        "A step  A GPU  A CPU  B step  B GPU  B CPU\n"
        "------  -----  -----  ------  -----  -----\n"
        "#2       10.0   30.0\n"
        "#3       20.0   50.0\n"
        "#4       60.0  100.0\n"
        "median   20.0   50.0  median      -      -\n"
        "mean     30.0   60.0  mean        -      -"]


def test_render_the_training_units_and_cpu_ops_by_calls_then_name():
    """The training table in GPU µs where both traces are GPU traces, else in CPU µs; CPU ops gone or new: most
    calls per step first, equal counts by name (not in the order the trace met them)."""
    a = it.parse_trace(kineto([[("k_mul", 5.0, "aten::mul"), ("k_add", 5.0, "aten::add"), ("k_mm", 9.0, "aten::mm"),
                                ("k_mm", 9.0, "aten::mm")]] * 2))
    b = it.parse_trace(kineto([[("k_sub", 5.0, "aten::sub"), ("k_div", 5.0, "aten::div")]] * 2))
    d = it.comparison_data(a, b)
    assert d["training"] is None  # no backward in either: the phases come by hand
    phases = {"forward": {"gpu_us": 100.0, "cpu_us": 40.0, "kernels": 2}}
    d["training"] = {side: {"phases": phases, "optimizer": None} for side in "ab"}
    lines = compare_text.render(d).splitlines()
    assert "Training step, phase by phase (GPU µs per step, median over the steps):" in lines
    gone = lines.index("CPU ops gone in B:")
    assert lines[gone + 1:gone + 4] == ["  2/step  aten::mm", "  1/step  aten::add", "  1/step  aten::mul"]
    new = lines.index("CPU ops new in B:")
    assert lines[new + 1:new + 3] == ["  1/step  aten::div", "  1/step  aten::sub"]
    d["b"]["device"] = "cpu"
    assert "Training step, phase by phase (CPU µs per step, median over the steps):" in compare_text.render(d).splitlines()
