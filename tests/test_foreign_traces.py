"""The reader on H200 traces from a harness that is not the suite's (tests/data/foreign/record_h200_foreign.py): transformers
decoders, training steps, worker threads, a graph break with a recompile, max-autotune, a profile without steps.

Every expected value here is computed from the raw JSON by the few lines below (launch events inside each
ProfilerStep span, joined to kernels by their correlation id), never by the reader under test."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

import inspect_trace as it
from test_compare_align import lcs_length  # the textbook quadratic LCS, independent of align.py

DATA = Path(__file__).resolve().parent / "data" / "foreign"


def raw(name: str) -> dict:
    with gzip.open(DATA / f"h200_foreign_{name}.json.gz") as f:
        return json.load(f)


def steps_of(data: dict) -> list[list[dict]]:
    """Per ProfilerStep (CPU span), the kernels its launches started, in launch order."""
    ev = data["traceEvents"]
    spans = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    kernel = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
    launches = sorted((e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                       and e.get("args", {}).get("correlation") in kernel), key=lambda e: e["ts"])
    return [[kernel[e["args"]["correlation"]] for e in launches if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            for s in spans]


def typical(data: dict) -> list[str]:
    seqs = Counter(tuple(k["name"] for k in st) for st in steps_of(data))
    return list(seqs.most_common(1)[0][0])


def trace(name: str):
    return it.load_trace(DATA / f"h200_foreign_{name}.json.gz")


PAIRS = [("llama4_prefill_eager", "llama4_prefill_sdpa"), ("gpt2_eager", "gpt2_sdpa"), ("mlp_eager", "mlp_autotune")]


@pytest.mark.parametrize("a, b", PAIRS)
def test_comparison_keeps_every_kernel_that_stayed(a, b):
    """The kernels that stayed are exactly a longest common subsequence of the two typical steps: a decoder of
    4 layers is hundreds of launches, beyond any window a greedy walk looks ahead."""
    ra, rb = raw(a), raw(b)
    ta, tb = typical(ra), typical(rb)
    d = it.comparison_data(trace(a), trace(b))
    assert all(len(Counter(tuple(k["name"] for k in st) for st in steps_of(r))) == 1 for r in (ra, rb))
    common = lcs_length(ta, tb)
    for side in ("a", "b"):  # calls that stayed: the same-name table's kept calls per step
        assert sum(s[side]["calls"] for s in d["same"]) == common, (side, common)
    # every other call is replaced or only in one trace, never both
    assert sum(len(g["old"]) * g["times"] for g in d["replaced"]) + sum(r["calls"] for r in d["only_a"]) \
        == len(ta) - common
    assert sum(len(g["new"]) * g["times"] for g in d["replaced"]) + sum(r["calls"] for r in d["only_b"]) \
        == len(tb) - common


def test_llama_steps_are_hundreds_of_launches():
    """The case the greedy alignment failed on: more launches per step than its exact limit (64 x 64 pairs)."""
    assert len(typical(raw("llama4_prefill_eager"))) > 200


def test_autotune_is_three_changes_not_one():
    """Eager -> max-autotune: gate and up stay cuBLAS (same kernel), GeLU + mul become one Triton pointwise kernel,
    and down_proj becomes a Triton mm template: two groups, each with its own times, never one chained group."""
    ra, rb = raw("mlp_eager"), raw("mlp_autotune")
    d = it.comparison_data(trace("mlp_eager"), trace("mlp_autotune"))
    groups = {(tuple(sorted(set(g["old"]))), tuple(sorted(set(g["new"])))): g for g in d["replaced"]}
    eager = typical(ra)
    gemm_down = [n for n in eager if n.startswith("nvjet") and "coopB" in n]
    pointwise = [n for n in eager if "Gelu" in n or "BinaryFunctor" in n]
    assert len(gemm_down) == 1 and len(pointwise) == 2
    fused = ("triton_poi_fused_gelu_mul_0",)
    template = ("triton_tem_fused_gelu_mm_mul_t_1",)
    assert (tuple(sorted(pointwise)), fused) in groups, list(groups)
    assert (tuple(gemm_down), template) in groups, list(groups)
    assert len(d["replaced"]) == 2

    def per_step(data, names):
        sts = steps_of(data)
        return sum(k["dur"] for st in sts for k in st if k["name"] in names) / len(sts)

    g = groups[(tuple(sorted(pointwise)), fused)]
    assert g["old_us"] == pytest.approx(per_step(ra, set(pointwise)), rel=1e-6)
    assert g["new_us"] == pytest.approx(per_step(rb, set(fused)), rel=1e-6)
    g = groups[(tuple(gemm_down), template)]
    assert g["old_us"] == pytest.approx(per_step(ra, set(gemm_down)), rel=1e-6)
    assert g["new_us"] == pytest.approx(per_step(rb, set(template)), rel=1e-6)


def test_a_compiled_foreign_trace_has_no_annotation_of_its_own_to_look_for():
    """The max-autotune MLP of another harness: its only record_function spans are ProfilerStep#k and the ones
    torch.compile adds itself ("## Call CompiledFxGraph ..."), so 03's "each step around 'mlp_fwd'" is not applicable
    there, as on the same harness's eager trace, not broken."""
    names = {e["name"] for e in raw("mlp_autotune")["traceEvents"] if e.get("cat") == "user_annotation"}
    assert names and all(n.startswith(("ProfilerStep#", "## Call CompiledFxGraph ")) for n in names)
    for name in ("mlp_autotune", "mlp_eager"):
        t = trace(name)
        exps, _ = it.expectations_for("03_simple_mlp", t)
        (verdict,) = [r[1] for r in it.check(t, exps) if "ProfilerStep#k" in r[0].text]
        assert verdict == "not applicable", name


def attention_window_us(data: dict) -> tuple[float, int]:
    """Per step, the kernels of GPT-2's attention core, from the raw JSON: in each layer, those launched after the
    KV cache's two concatenations (CatArrayBatchedCopy) and before the output projection (the next GEMM with a bias
    epilogue, Conv1D's addmm): eager's q.k copy, bmm, scale, mask, softmax, bmm and output copy; sdpa's kernel.
    Returns µs per step and kernels per step."""
    us = calls = 0
    steps = steps_of(data)
    for st in steps:
        cats, inside = 0, False
        for k in st:
            if inside and "_bias_" in k["name"]:
                inside, cats = False, 0
            if inside:
                us, calls = us + k["dur"], calls + 1
            if "CatArrayBatchedCopy" in k["name"]:
                cats += 1
                inside = cats == 2
    return us / len(steps), calls // len(steps)


def test_gpt2_attention_change_is_the_attention_modules_kernels():
    """Eager -> sdpa on the H200 GPT-2 (2 layers): the one group that holds the sdpa kernel holds exactly each
    layer's attention core (7 kernels a layer) and nothing else, its µs those of the raw JSON (36.1 -> 9.2 per
    step; the mask built once before the layers, le/where/arange, is only in A: its own change, outside
    attention)."""
    ra, rb = raw("gpt2_eager"), raw("gpt2_sdpa")
    (us_a, calls_a), (us_b, calls_b) = attention_window_us(ra), attention_window_us(rb)
    assert (calls_a, calls_b) == (14, 2)
    d = it.comparison_data(trace("gpt2_eager"), trace("gpt2_sdpa"))
    (g,) = [r for r in d["replaced"] if any("sdpa" in n for n in r["new"])]
    assert len(g["old"]) * g["times"] == calls_a and len(g["new"]) * g["times"] == calls_b
    assert g["old_us"] == pytest.approx(us_a, rel=1e-6) and g["new_us"] == pytest.approx(us_b, rel=1e-6)
    assert len(d["replaced"]) == 1
