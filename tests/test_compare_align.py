"""The comparison of two traces on the steps people actually have: long steps (hundreds to tens of thousands of
launches), repeated layers, autotuned GEMMs, a trace without steps, a compiled CPU run without kernel profiling.

Expected values are computed here, independently of trace_reader: a plain O(n*m) longest common subsequence,
sums of kernel durations over the raw JSON, or literals."""

import random
import time

import pytest

from trace_reader.render import compare_text
from trace_reader.comparison import units
import inspect_trace as it
from test_compare import kineto
from trace_reader.comparison import align as al


def lcs_row(a: list, b: list) -> list[int]:
    """LCS(a, b[:j]) for j = 0..len(b): the textbook dynamic programme, one row at a time."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev


def lcs_length(a: list, b: list) -> int:
    return lcs_row(a, b)[-1]


def raw_kernel_us(data: dict) -> float:
    """A trace's kernel time per step, straight from its JSON: kernel durations over ProfilerStep spans."""
    steps = sum(1 for e in data["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    return sum(e["dur"] for e in data["traceEvents"] if e.get("cat") == "kernel") / steps


def assert_sums(d: dict, raw_a: float, raw_b: float) -> None:
    """Every unit counted once: same + replaced + only, per side, is the trace's own kernel time per step."""
    for side, old, raw in (("a", "old", raw_a), ("b", "new", raw_b)):
        parts = (sum(s[side]["us"] for s in d["same"]) + sum(r[f"{old}_us"] for r in d["replaced"])
                 + sum(r["us"] for r in d[f"only_{side}"]))
        assert parts == pytest.approx(raw) and d["kernel_us"][side] == pytest.approx(raw)


def check_pairs(a: list, b: list, pairs: list) -> None:
    assert all(a[i] == b[j] for i, j in pairs)
    assert all(i0 < i1 and j0 < j1 for (i0, j0), (i1, j1) in zip(pairs, pairs[1:]))
    assert len(pairs) == lcs_length(a, b)


# ------------------------------------------------------------------------------------------- the alignment

def _path(monkeypatch, path: str, rows_bits: int = 1) -> None:
    """Which way align() takes. rows: every block small enough to keep its rows (the defaults); halved: every block
    whose rows hold more than rows_bits bits halved (Hirschberg), as a step past ROWS_BITS is (1: every block of two
    rows or more); myers: every block through Myers' diff (keys by the slide)."""
    if path == "halved":
        monkeypatch.setattr(al, "ROWS_BITS", rows_bits)
    if path == "myers":
        monkeypatch.setattr(al, "LARGE", 0)


@pytest.mark.parametrize("path", ["rows", "halved", "myers"])
def test_align_is_a_longest_common_subsequence(monkeypatch, path):
    """Random launch orders over a few names (ties everywhere), with and without keys, through each of the three
    ways align() may take: rows kept, blocks halved (Hirschberg), Myers' diff for a large block."""
    _path(monkeypatch, path, rows_bits=4)
    if path == "myers":
        monkeypatch.setattr(al, "FEW", 3)
    rng = random.Random(path)
    for case in range(1500):
        k = rng.randint(1, 5)
        a = [f"k{rng.randint(0, k)}" for _ in range(rng.randint(0, 14))]
        if case % 3:  # b a few edits away from a: the case Myers finishes
            b = list(a)
            for _ in range(rng.randint(0, 3)):
                if b and rng.random() < 0.5:
                    del b[rng.randrange(len(b))]
                else:
                    b.insert(rng.randint(0, len(b)), f"k{rng.randint(0, k)}")
        else:
            b = [f"k{rng.randint(0, k)}" for _ in range(rng.randint(0, 14))]
        keys = ([rng.choice([None, 1, 2]) for _ in a], [rng.choice([None, 1, 2]) for _ in b]) if case % 2 else None
        check_pairs(a, b, al.align(a, b, keys))


def test_align_never_loses_a_pair_to_a_unique_name():
    """A name unique to both sides ("u") is not forced to pair: pairing it would cost the three x's."""
    a, b = ["u", "x", "x", "x"], ["x", "x", "x", "u"]
    assert al.align(a, b) == [(1, 0), (2, 1), (3, 2)]


def test_align_prefers_the_same_launching_op_and_the_same_offset():
    # of two same-name GEMMs, the one launched by the same op (the projection, not the attention's bmm) stays
    a = ["gemm", "gemm", "gemm", "gemm", "softmax", "gemm", "gemm"]
    ops_a = ["mm", "mm", "mm", "bmm", "softmax", "bmm", "mm"]
    b = ["gemm", "gemm", "gemm", "flash", "gemm"]
    ops_b = ["mm", "mm", "mm", "flash", "mm"]
    assert al.align(a, b, (ops_a, ops_b)) == [(0, 0), (1, 1), (2, 2), (6, 4)]
    # no keys: of two same-name launches, the one at the same offset since the last pair
    assert al.align(["g", "x", "g", "t"], ["g", "g", "t"]) == [(0, 0), (2, 1), (3, 2)]
    assert al.align(["cA", "cA", "T", "cB"], ["tem", "cA", "T", "cB"]) == [(1, 1), (2, 2), (3, 3)]


def test_align_keys_at_the_head_the_tail_and_in_a_slide():
    """A key of None (the launching op unknown) agrees with any; a known one only with itself. Of two same-name
    launches, the pair goes to the one whose key agrees, in the common head and tail too; of those that agree, to
    the one nearest the same offset (the first launch of each side when no pair comes before)."""
    assert al.align(["g", "g"], ["g"], ([1, None], [2])) == [(1, 0)]  # head: A's first is known to differ
    assert al.align(["g"], ["g", "g", "g"], ([1], [2, None, 2])) == [(0, 1)]  # tail: B's last is known to differ
    # A's 1 (key 2, as B's) and 2 (None) both agree; 1 is nearer the same offset (0)
    assert al.align(["g", "g", "g"], ["g"], ([1, 2, None], [2])) == [(1, 0)]
    assert al.align(["g", "g"], ["g"], ([2, 1], [None])) == [(0, 0)]  # both agree: the same offset, the first


def test_myers_diff_keeps_the_furthest_point_of_each_diagonal(monkeypatch):
    """Myers' diff (LARGE = 0: every block takes it) keeps, on each diagonal, the furthest point either way onto it
    reaches; from the nearer one it ends a pair short. By hand: of A's three ordered pairs of names only mm, gelu
    occurs in B in that order, at B's 2 and 3; the diff must find it, not mul alone."""
    monkeypatch.setattr(al, "LARGE", 0)
    a, b = ["mm", "gelu", "mul"], ["mul", "gelu", "mm", "gelu"]
    assert lcs_length(a, b) == 2 and al.align(a, b) == [(0, 2), (1, 3)]


def test_align_long_steps_exactly_in_seconds():
    """20,000 launches a side, five names repeated (none unique), one replaced kernel in every ten layers:
    bit-parallel rows; then 200,000 a side with three kernels changed far apart: Myers' diff."""
    names = ["mm_a", "gelu", "mm_a", "mul", "mm_b"]
    a = names * 4_000
    b = list(a)
    for k in range(0, len(b), 50):
        b[k + 1] = "fused"
    t0 = time.perf_counter()
    pairs = al.align(a, b)
    assert time.perf_counter() - t0 < 10  # ~0.4 s here
    assert len(pairs) == len(a) - len(a) // 50 and all(i == j for i, j in pairs)

    a = names * 40_000
    b = list(a)
    for k in (7, 99_993, 199_990):  # mm_b, mul, mul -> mul, gelu, mm_a: each one edit
        b[k] = names[(k + 1) % 5]
    t0 = time.perf_counter()
    pairs = al.align(a, b)
    assert time.perf_counter() - t0 < 10  # ~0.8 s here
    assert len(pairs) == len(a) - 3 and {i for i, j in pairs if i != j} == set()


# ----------------------------------------------------------------------------------- synthetic model steps

def gpt2_layer(sdpa: bool) -> list[tuple]:
    """One GPT-2 block on a GPU as eager PyTorch launches it (eager or sdpa attention): many pointwise kernels
    with one name (the GeLU-tanh chain of mul/add/pow/tanh), GEMMs by shape."""
    def pw(name):  # a pointwise kernel, 2 µs, launched by aten::<name>
        return (f"elementwise_{name}", 2.0, f"aten::{name}")

    attn = [("flash_fwd_kernel", 20.0, "aten::_scaled_dot_product_flash_attention")] if sdpa else [
        ("gemm_bmm", 9.0, "aten::bmm"), ("elementwise_div", 3.0, "aten::div"), ("elementwise_where", 3.0, "aten::where"),
        ("softmax_kernel", 6.0, "aten::_softmax"), ("gemm_bmm", 9.0, "aten::bmm")]
    gelu = [pw("mul"), pw("pow"), pw("mul"), pw("add"), pw("mul"), pw("tanh"), pw("add"), pw("mul")]
    norm = ("layer_norm", 4.0, "aten::native_layer_norm")
    return ([norm, ("gemm_qkv", 30.0, "aten::addmm"), pw("copy_")] + attn
            + [pw("copy_"), ("gemm_proj", 12.0, "aten::addmm"), pw("add"), norm, ("gemm_fc", 40.0, "aten::addmm")]
            + gelu + [("gemm_proj", 40.0, "aten::addmm"), pw("add")])


def test_a_long_gpt2_step_keeps_every_unchanged_kernel():
    """24 GPT-2 blocks, 500+ launches a step: eager vs sdpa attention. Only the attention changed: every other
    kernel stayed (as many pairs as a longest common subsequence), and the one change is 24 x one group."""
    layers = 24
    raw_a, raw_b = (kineto([[u for _ in range(layers) for u in gpt2_layer(sdpa)]] * 2) for sdpa in (False, True))
    a, b = it.parse_trace(raw_a), it.parse_trace(raw_b)
    names_a = [u[0] for _ in range(layers) for u in gpt2_layer(False)]
    names_b = [u[0] for _ in range(layers) for u in gpt2_layer(True)]
    assert len(names_a) == 552 and len(names_b) == 456
    t0 = time.perf_counter()
    d = it.comparison_data(a, b)
    assert time.perf_counter() - t0 < 5
    attention = ["gemm_bmm", "elementwise_div", "elementwise_where", "softmax_kernel", "gemm_bmm"]
    assert [(r["old"], r["new"], r["times"]) for r in d["replaced"]] == [(attention, ["flash_fwd_kernel"], layers)]
    assert r_us(d, "old") == pytest.approx(layers * 30.0) and r_us(d, "new") == pytest.approx(layers * 20.0)
    kept = sum(s["a"]["calls"] for s in d["same"])
    assert kept == lcs_length(names_a, names_b) == len(names_a) - 5 * layers
    assert d["only_a"] == d["only_b"] == []
    assert_sums(d, raw_kernel_us(raw_a), raw_kernel_us(raw_b))


def r_us(d: dict, side: str) -> float:
    return sum(r[f"{side}_us"] for r in d["replaced"])


def decoder_layer(flash: bool) -> list[tuple]:
    """A Llama-shaped layer whose GEMMs all run one cuBLAS kernel, the attention's two matmuls included."""
    x, w, kv = [[256, 512], [512, 512]], [[256, 512], [512, 128]], [[8, 256, 64], [8, 64, 256]]
    attn = [("flash", 25.0, "aten::_scaled_dot_product_flash_attention")] if flash else [
        ("nvjet", 11.0, "aten::bmm", kv), ("softmax", 7.0, "aten::_softmax"), ("nvjet", 11.0, "aten::bmm", kv)]
    return ([("rms", 3.0, "aten::mul"), ("nvjet", 20.0, "aten::mm", x), ("nvjet", 6.0, "aten::mm", w),
             ("nvjet", 6.0, "aten::mm", w), ("rope", 2.0, "aten::add")] + attn
            + [("nvjet", 20.0, "aten::mm", x), ("residual", 2.0, "aten::add"), ("rms", 3.0, "aten::mul"),
               ("nvjet", 60.0, "aten::mm", [[256, 512], [512, 1536]]), ("silu", 4.0, "aten::silu"),
               ("mul", 4.0, "aten::mul"), ("nvjet", 60.0, "aten::mm", [[256, 1536], [1536, 512]]),
               ("residual", 2.0, "aten::add")])


def test_repeated_layers_one_change_each_are_one_group_times_n():
    """8 layers, eager vs flash attention, every GEMM with one kernel name: the attention's two bmm + softmax
    became flash in each layer (8 x one group); the projections stayed, none shuffled into a group."""
    layers = 8
    raw_a, raw_b = (kineto([[u for _ in range(layers) for u in decoder_layer(f)]] * 3) for f in (False, True))
    d = it.comparison_data(it.parse_trace(raw_a), it.parse_trace(raw_b))
    (r,) = d["replaced"]
    assert (r["old"], r["new"], r["times"]) == (["nvjet", "softmax", "nvjet"], ["flash"], layers)
    assert (r["old_us"], r["new_us"]) == (pytest.approx(29.0 * layers), pytest.approx(25.0 * layers))
    # per call: A's nvjet twice a layer (2 x 11 µs), softmax once (7 µs); B's flash once (25 µs)
    assert r["old_us_per_call"] == {"nvjet": pytest.approx(11.0), "softmax": pytest.approx(7.0)}
    assert r["new_us_per_call"] == {"flash": pytest.approx(25.0)}
    nvjet = next(s for s in d["same"] if s["name"] == "nvjet")
    assert (nvjet["a"]["calls"], nvjet["b"]["calls"]) == (6 * layers, 6 * layers)
    assert nvjet["a"]["us"] == pytest.approx(172.0 * layers)  # q, k, v, o, gate/up, down: no bmm among them
    assert nvjet["elsewhere"] == {"a": 2 * layers, "b": 0}
    assert_sums(d, raw_kernel_us(raw_a), raw_kernel_us(raw_b))
    text = compare_text.render(d)
    assert "nvjet *" in text and "this name's other calls are counted below" in text


def autotune_pair(template_word: str = "") -> tuple[dict, dict]:
    """Eager vs max-autotune, the MLP written as one expression: B keeps cuBLAS for the gate GEMM, runs up and
    down as Triton mm templates (named after what they fuse) and GeLU * mul as one pointwise kernel."""
    up, down = [[8192, 768], [768, 3072]], [[8192, 3072], [3072, 768]]
    eager = [("nvjet_coopA", 57.5, "aten::mm", up), ("gelu_kernel", 33.0, "aten::gelu", [[8192, 3072]]),
             ("nvjet_coopA", 57.4, "aten::mm", up), ("mul_kernel", 37.0, "aten::mul", [[8192, 3072], [8192, 3072]]),
             ("nvjet_coopB", 52.9, "aten::mm", down)]
    tem_up, tem_down = f"triton_tem_fused_mm{template_word}_0", f"triton_tem_fused_mm{template_word}_2"
    poi = "triton_poi_fused__unsafe_view_gelu_mul_1"
    autotuned = [("nvjet_coopA", 57.6, "aten::mm", up),
                 (tem_up, 69.0, tem_up, [[8192, 768], [3072, 768], [8192, 3072]]),
                 (poi, 43.6, poi, [[8192, 3072], [8192, 3072], [8192, 3072]]),
                 (tem_down, 58.3, tem_down, [[8192, 3072], [768, 3072], [8192, 768]])]
    return kineto([eager] * 3), kineto([autotuned] * 3)


@pytest.mark.parametrize("template_word", ["", "_mul"])
def test_max_autotune_is_three_changes_not_one(template_word):
    """GeLU + mul -> one fused kernel, and each GEMM -> its own Triton template: three groups, with their own
    times; a template whose name carries a pointwise op's word ("_mul") still pairs GEMM with GEMM first."""
    raw_a, raw_b = autotune_pair(template_word)
    d = it.comparison_data(it.parse_trace(raw_a), it.parse_trace(raw_b))
    tem_up, tem_down = f"triton_tem_fused_mm{template_word}_0", f"triton_tem_fused_mm{template_word}_2"
    got = sorted((r["old"], r["new"], round(r["old_us"], 1), round(r["new_us"], 1)) for r in d["replaced"])
    assert got == sorted([(["gelu_kernel", "mul_kernel"], ["triton_poi_fused__unsafe_view_gelu_mul_1"], 70.0, 43.6),
                          (["nvjet_coopA"], [tem_up], 57.4, 69.0), (["nvjet_coopB"], [tem_down], 52.9, 58.3)])
    (same,) = d["same"]
    assert (same["name"], same["a"]["calls"], same["a"]["us"], same["elsewhere"]) == (
        "nvjet_coopA", 1, pytest.approx(57.5), {"a": 1, "b": 0})
    assert d["only_a"] == d["only_b"] == []
    assert_sums(d, raw_kernel_us(raw_a), raw_kernel_us(raw_b))
    assert raw_kernel_us(raw_a) == pytest.approx(237.8)  # the sums are the traces' own, not the table's


def test_two_calls_becoming_one_are_counted_once():
    """A launches a kernel twice, B once, nothing new: one call stayed, the other is only in A."""
    raw_a = kineto([[("k", 10.0, "aten::foo"), ("g", 50.0, "aten::mm"), ("k", 12.0, "aten::foo")]] * 2)
    raw_b = kineto([[("k", 9.0, "aten::foo"), ("g", 50.0, "aten::mm")]] * 2)
    d = it.comparison_data(it.parse_trace(raw_a), it.parse_trace(raw_b))
    assert [(s["name"], s["a"]["calls"], s["a"]["us"], s["b"]["us"]) for s in d["same"]] == [
        ("k", 1, 10.0, 9.0), ("g", 1, 50.0, 50.0)]
    assert [(r["name"], r["calls"], r["us"]) for r in d["only_a"]] == [("k", 1, 12.0)]
    assert d["replaced"] == [] and d["only_b"] == []
    assert_sums(d, 72.0, 59.0)
    text = compare_text.render(d)
    assert "Only in A:\n      12.0 µs/step  1 × 12.0  k" in text


# ------------------------------------------------------------------------------ CPU traces, steps or none

def cpu_trace(steps: list[list[str]], stepped: bool = True, compiled: bool = False, us: float = 10.0) -> dict:
    """A CPU-only trace: each step's ops one after another (each its own unit of work), optionally inside a
    compiled region; ProfilerStep spans around each step unless stepped=False."""
    ev, t = [], 0.0
    for number, ops in enumerate(steps, start=2):
        start = t
        t += 1
        if compiled:
            ev += [{"ph": "X", "cat": "user_annotation", "name": "Torch-Compiled Region: 0/0", "ts": t,
                    "dur": len(ops) * (us + 1) + 2, "pid": 1, "tid": 1, "args": {}},
                   {"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph fabc ##", "ts": t + 1,
                    "dur": len(ops) * (us + 1), "pid": 1, "tid": 1, "args": {}}]
            t += 1.5
        for name in ops:
            ev.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": t, "dur": us, "pid": 1, "tid": 1, "args": {}})
            t += us + 1
        t += 2
        if stepped:
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "ts": start,
                       "dur": t - start, "pid": 1, "tid": 1, "args": {}})
        t += 1
    return {"traceEvents": ev}


def test_a_step_less_trace_against_a_stepped_one_agrees_with_itself():
    """A recorded without prof.step() (three iterations read as one step) vs B with three steps: no name is
    both "same" and inside a group "-> (nothing)"; A's units add up to the whole trace, B's to one step."""
    a = it.parse_trace(cpu_trace([["aten::addmm", "aten::gelu"] * 3], stepped=False))
    b = it.parse_trace(cpu_trace([["aten::addmm", "aten::gelu"]] * 3))
    assert a.whole and not b.whole and a.device == b.device == "cpu"
    d = it.comparison_data(a, b)
    assert [(s["name"], s["a"]["calls"], s["b"]["calls"]) for s in d["same"]] == [("aten::addmm", 1, 1),
                                                                                   ("aten::gelu", 1, 1)]
    assert d["replaced"] == []
    assert [(r["name"], r["calls"]) for r in d["only_a"]] == [("aten::addmm", 2), ("aten::gelu", 2)]
    assert d["kernel_us"] == {"a": pytest.approx(60.0), "b": pytest.approx(20.0)}
    assert_sums_cpu(d)
    text = compare_text.render(d)
    assert "(nothing)" not in text
    assert 'note: A has no ProfilerStep spans, so its "per step" below is per trace' in text



def test_a_stepped_trace_against_a_step_less_one_names_b():
    """The mirror of the case above: B is the trace without steps; the header says so in B's line and the note
    names B."""
    a = it.parse_trace(cpu_trace([["aten::addmm", "aten::gelu"]] * 3), "a.json")
    b = it.parse_trace(cpu_trace([["aten::addmm", "aten::gelu"] * 3], stepped=False), "b.json")
    assert compare_text.render(it.comparison_data(a, b)).splitlines()[:4] == [
        "A  a.json  (CPU, 3 steps)", "B  b.json  (CPU, no ProfilerStep spans: one step, the whole trace)", "",
        "note: B has no ProfilerStep spans, so its \"per step\" below is per trace; the other's is per step"]

def assert_sums_cpu(d: dict) -> None:
    for side, old in (("a", "old"), ("b", "new")):
        parts = (sum(s[side]["us"] for s in d["same"]) + sum(r[f"{old}_us"] for r in d["replaced"])
                 + sum(r["us"] for r in d[f"only_{side}"]))
        assert parts == pytest.approx(d["kernel_us"][side])


EAGER = ["aten::mm", "aten::gelu", "aten::mm", "aten::mul", "aten::mm"]


def test_compiled_cpu_run_without_kernel_profiling_says_why():
    """B compiled on a CPU without cpp.enable_kernel_profile: its fused C++ kernel is in no span. GeLU + mul are
    not "replaced by nothing": the group says why B's side is missing."""
    a = it.parse_trace(cpu_trace([EAGER] * 3))
    b = it.parse_trace(cpu_trace([["aten::mm", "aten::mm", "aten::mm"]] * 3, compiled=True))
    d = it.comparison_data(a, b)
    assert d["hidden"] == {"a": None, "b": units.HIDDEN_CPP}
    (r,) = d["replaced"]
    assert (r["old"], r["new"], r["old_us"]) == (["aten::gelu", "aten::mul"], [], pytest.approx(20.0))
    assert d["only_a"] == [] and [s["name"] for s in d["same"]] == ["aten::mm"]
    text = compare_text.render(d)
    assert "(nothing)" not in text and "-100%" not in text
    assert ("    -> (compiled C++ kernels are not in the trace: profile with "
            "torch._inductor.config.cpp.enable_kernel_profile)") in text
    assert "    20.0 -> ? µs per step" in text
    assert_sums_cpu(d)



def test_compiled_cpu_run_on_the_a_side_says_why_too():
    """A compiled without kernel profiling, B eager: GeLU + mul are B's side of a group whose A side is unseen,
    and its time reads "? -> B's", not "0 -> B's (new)"."""
    a = it.parse_trace(cpu_trace([["aten::mm", "aten::mm", "aten::mm"]] * 3, compiled=True))
    b = it.parse_trace(cpu_trace([EAGER] * 3))
    d = it.comparison_data(a, b)
    assert d["hidden"] == {"a": units.HIDDEN_CPP, "b": None}
    (r,) = d["replaced"]
    assert (r["old"], r["new"], r["new_us"]) == ([], ["aten::gelu", "aten::mul"], pytest.approx(20.0))
    lines = compare_text.render(d).splitlines()
    i = lines.index("  (compiled C++ kernels are not in the trace: profile with "
                    "torch._inductor.config.cpp.enable_kernel_profile)")
    assert lines[i + 1:i + 3] == ["    -> aten::gelu + aten::mul",
                                  "    ? -> 20.0 µs per step, calls × µs: A none; B 1 × 10.0 + 1 × 10.0"]


@pytest.mark.parametrize("marker", ["Torch-Compiled Region: 0/0", "## Call CompiledFxGraph fabc ##"])
def test_either_span_of_a_compiled_region_says_why(marker):
    """A compiled region shows as either span (the region, or the call of its compiled graph): each alone is
    enough for the reason."""
    raw_b = cpu_trace([["aten::mm", "aten::mm", "aten::mm"]] * 3, compiled=True)
    raw_b["traceEvents"] = [e for e in raw_b["traceEvents"] if e["cat"] != "user_annotation" or e["name"] == marker
                            or e["name"].startswith("ProfilerStep#")]
    b = it.parse_trace(raw_b)
    assert {e.name for st in b.steps for e in st.spans if not e.name.startswith("ProfilerStep#")} == {
        "aten::mm", marker}
    d = it.comparison_data(it.parse_trace(cpu_trace([EAGER] * 3)), b)
    assert d["hidden"] == {"a": None, "b": units.HIDDEN_CPP}

@pytest.mark.parametrize("b_ops, compiled", [(["aten::mm", "cpp_fused_gelu_mul_0", "aten::mm", "aten::mm"], True),
                                             (["aten::mm", "aten::mm", "aten::mm"], False)])
def test_no_reason_without_a_compiled_region_or_with_its_kernels(b_ops, compiled):
    """The reason is given only for a compiled region whose C++ kernels are absent: with the kernel recorded,
    GeLU + mul pair with it; without a compiled region, GeLU and mul are only in A."""
    a = it.parse_trace(cpu_trace([EAGER] * 3))
    d = it.comparison_data(a, it.parse_trace(cpu_trace([b_ops] * 3, compiled=compiled)))
    assert d["hidden"] == {"a": None, "b": None}
    if compiled:
        fused = ["cpp_fused_gelu_mul_0"]
        assert [(r["old"], r["new"]) for r in d["replaced"]] == [(["aten::gelu", "aten::mul"], fused)]
    else:
        assert d["replaced"] == [] and [r["name"] for r in d["only_a"]] == ["aten::gelu", "aten::mul"]
    assert "(nothing)" not in compare_text.render(d)


# ------------------------------------------------------------------- recorded: a transformers GPT-2 on the CPU

@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A GPT-2 of 2 tiny layers from its config (random weights, no Hub), eager vs sdpa attention, recorded once."""
    transformers = pytest.importorskip("transformers")
    import torch
    from test_inspect_trace import record

    out, traces = tmp_path_factory.mktemp("gpt2"), {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                         bos_token_id=0, eos_token_id=0, attn_implementation=impl)
        model = transformers.GPT2LMHeadModel(config).eval()
        x = torch.randint(0, 64, (1, 8))
        with torch.no_grad():
            traces[impl] = it.load_trace(record(lambda: model(x), out / f"{impl}.json"))
    return traces


def typical_units(trace) -> tuple[list[str], float]:
    """The most common launch order of the CPU's kernels, and their µs per step over the steps with it."""
    orders = [[e.name for e in it.cpu_kernels(st)] for st in trace.steps]
    common = max(orders, key=orders.count)
    steps = [st for st, names in zip(trace.steps, orders) if names == common]
    return common, sum(e.dur for st in steps for e in it.cpu_kernels(st)) / len(steps)


@pytest.mark.profiles  # its fixture records two profiles in this process: under mutmut, a forked worker hung in it
def test_gpt2_eager_vs_sdpa_on_the_cpu(gpt2):
    """Each layer's eager attention (two bmm, softmax, ...) became one sdpa kernel; every other op stayed, in the
    same-name table, as many as a longest common subsequence; no op is "replaced" by itself; sums add up."""
    (names_a, us_a), (names_b, us_b) = typical_units(gpt2["eager"]), typical_units(gpt2["sdpa"])
    d = it.comparison_data(gpt2["eager"], gpt2["sdpa"])
    assert sum(s["a"]["calls"] for s in d["same"]) == lcs_length(names_a, names_b)
    assert all(not set(r["old"]) & set(r["new"]) for r in d["replaced"])
    # the CPU's units are the outermost ops that compute (aten::softmax holds its _softmax; sdpa its CPU kernel)
    (attention,) = [r for r in d["replaced"] if "aten::softmax" in r["old"]]
    assert attention["new"] == ["aten::scaled_dot_product_attention"] and attention["times"] == 2
    assert attention["old_calls"]["aten::bmm"] == 4
    for op in ("aten::addmm", "aten::layer_norm", "aten::tanh"):
        (row,) = [s for s in d["same"] if s["name"] == op]
        assert row["a"]["calls"] == names_a.count(op) == names_b.count(op) and row["elsewhere"] == {"a": 0, "b": 0}
    assert_sums_cpu(d)
    assert (d["kernel_us"]["a"], d["kernel_us"]["b"]) == (pytest.approx(us_a), pytest.approx(us_b))


def test_a_step_too_long_to_align_is_one_line_and_a_long_similar_one_is_not(monkeypatch):
    """A trace is untrusted input: past MAX_CELLS, alignment refuses in one line (exit 2 from the CLI); a pair
    nearly alike still aligns past it (Myers' diff), after a long common head too, as does one whose common head
    and tail leave it under."""
    monkeypatch.setattr(al, "MAX_CELLS", 10_000)
    far = [f"k{i % 5}" for i in range(200)], [f"k{4 - i % 5}" for i in range(200)]
    with pytest.raises(it.TraceError, match=r"^steps of 200 and 200 launches left to align, far apart: more than"):
        al.align(*far)
    monkeypatch.setattr(al, "LARGE", 0)
    near = [f"k{i % 7}" for i in range(300)]
    assert len(al.align(near, near[:100] + near[101:])) == 299
    assert len(al.align(["x"] * 1000 + ["a", "b"] * 20, ["x"] * 1000 + ["b", "a"] * 20)) == 1039
    # past MAX_CELLS after a long common head: Myers' diff of what is left, its x counted from where that starts
    # (ab * 100 against ba * 100: 199 pairs, all but A's first a and B's last a)
    assert len(al.align(["x"] * 1000 + ["a", "b"] * 100, ["x"] * 1000 + ["b", "a"] * 100)) == 1199


# ------------------------------------------- align.py's three LCS engines against a textbook DP (mutation edges)

def _common(pairs, a, b, a0, a1, b0, b1):
    """True when pairs is a common subsequence of a[a0:a1] and b[b0:b1], increasing in both."""
    inside = all(a0 <= i < a1 and b0 <= j < b1 and a[i] == b[j] for i, j in pairs)
    return inside and all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))


def test_each_lcs_engine_matches_a_textbook_dp_on_random_sequences():
    rng = random.Random(20261202)
    for trial in range(400):
        letters = rng.randint(1, 6)
        run = [rng.randrange(letters) for _ in range(rng.choice([0, 9, 20, 40]))]  # a shared run: the snake's 8, 16, 32
        noise = lambda: [rng.randrange(letters) for _ in range(rng.randint(0, 12))]  # noqa: E731
        a, b = noise() + run + noise(), noise() + run + noise()
        a0, b0 = rng.randint(0, min(3, len(a))), rng.randint(0, min(3, len(b)))
        a1, b1 = rng.randint(a0, len(a)), rng.randint(b0, len(b))
        sa, sb = a[a0:a1], b[b0:b1]
        row = lcs_row(sa, sb)
        best = row[-1]
        assert al._zeros_before(al._last_row(sa, sb), len(sb)) == row, (sa, sb)
        got = al._traceback(a, b, None, None, a0, a1, b0, b1)
        assert _common(got, a, b, a0, a1, b0, b1) and len(got) == best, (a, b, a0, a1, b0, b1)
        if sa and sb:
            far = len(sa) + len(sb) - 2 * best  # launches left unpaired by an LCS
            got = al._myers(a, b, a0, a1, b0, b1, far)
            assert got is not None and _common(got, a, b, a0, a1, b0, b1) and len(got) == best, (a, b, a0, a1, b0, b1)
            assert far == 0 or al._myers(a, b, a0, a1, b0, b1, far - 1) is None
        x, y = rng.randint(0, len(a)), rng.randint(0, len(b))
        end = x
        while end < len(a) and end - x + y < len(b) and a[end] == b[end - x + y]:
            end += 1
        assert al._snake(a, b, x, y, len(a), len(b)) == end


def test_a_long_step_with_few_changes_pairs_every_kept_launch():
    """1,500 launches against the same with 20 removed and 25 new ones put in (names found nowhere else): past the
    size where Myers' diff is tried, every launch not removed pairs, in order."""
    rng = random.Random(7)
    a = [f"k{rng.randrange(9)}" for _ in range(1500)]
    removed = set(rng.sample(range(1500), 20))
    b = [n for i, n in enumerate(a) if i not in removed]
    for n in range(25):
        b.insert(rng.randrange(len(b) + 1), f"new{n}")
    pairs = al.align(a, b)
    assert len(pairs) == 1480 and all(a[i] == b[j] for i, j in pairs)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))


def test_a_key_that_disagrees_gives_way_to_one_that_agrees():
    # a[1] and both of b are the same name; a[1]'s key is b[0]'s: that pair, not the later b[1]
    assert al._traceback([5, 1], [1, 1], [None, "k2"], ["k2", "k1"], 0, 2, 0, 2) == [(1, 0)]


# ------------------------- align.py's preferences among equally long alignments: the halving path and the slide
# (the mutation gaps of tests/mutation_survivors.md: which of several LCS is taken, not its length)

@pytest.mark.parametrize("path", ["rows", "halved"])
def test_halving_cuts_at_the_middle_rows_own_offset(monkeypatch, path):
    """A = x g g, B = g g g x: two g's stay (x alone would be one pair). Of B's three g's, A's two pair with
    those at their own offsets, B's 1 and 2 (each at the same offset since the start, then a run), not with B's
    first two: the halved block crosses its middle row where the row's offset says, not at the edge."""
    _path(monkeypatch, path)
    a, b = ["x", "g", "g"], ["g", "g", "g", "x"]
    pairs = al.align(a, b)
    check_pairs(a, b, pairs)
    assert pairs == [(1, 1), (2, 2)]


@pytest.mark.parametrize("path", ["rows", "halved"])
def test_halving_after_a_common_head_counts_the_offset_from_the_block(monkeypatch, path):
    """A = x g g g, B = x x g g x: the common head x pairs first; of what is left (A's g g g, B's x g g x) the
    two g's of B pair with A's at the same offset since that x (A's 2 and 3 with B's 2 and 3), A's first g is the
    one B replaced with its second x. The middle row's offset is counted from where the block starts, past the
    head, not from the step's start."""
    _path(monkeypatch, path)
    a, b = ["x", "g", "g", "g"], ["x", "x", "g", "g", "x"]
    pairs = al.align(a, b)
    check_pairs(a, b, pairs)
    assert pairs == [(0, 0), (2, 2), (3, 3)]


@pytest.mark.parametrize("path", ["rows", "halved"])
def test_halving_keeps_the_keys_in_its_top_half(monkeypatch, path):
    """Six GEMMs of one kernel name in A (launched by mm, bmm, bmm, mm, mm, mm), B's two by bmm: B's two pair
    with A's two bmm (the only two pairs whose ops agree), not with A's first mm and the bmm after it."""
    _path(monkeypatch, path)
    a, b = ["gemm"] * 6, ["gemm"] * 2
    keys = (["mm", "bmm", "bmm", "mm", "mm", "mm"], ["bmm", "bmm"])
    assert al.align(a, b, keys) == [(1, 0), (2, 1)]


@pytest.mark.parametrize("path", ["rows", "halved"])
def test_halving_keeps_the_keys_in_its_bottom_half(monkeypatch, path):
    """A's GEMMs by mm then bmm, B's by bmm, mm, bmm, mm: both pair with the same op only as B's 1 and 2 (mm
    before bmm); A's bmm taken by B's mm (the bottom half's first launch) would leave A's mm no agreeing
    launch before it."""
    _path(monkeypatch, path)
    keys = (["mm", "bmm"], ["bmm", "mm", "bmm", "mm"])
    assert al.align(["gemm"] * 2, ["gemm"] * 4, keys) == [(0, 1), (1, 2)]


LN = "aten::layer_norm"


@pytest.mark.parametrize("path", ["rows", "myers"])
def test_slide_moves_a_pair_at_its_offset_whose_ops_differ(monkeypatch, path):
    """layer_norm, GEMM, layer_norm in A; B launches two more GEMMs around its one by the same op (bmm, mm, bmm).
    Myers' diff pairs A's GEMM with B's first, at the same offset since the layer_norm but launched by another
    op: the slide still moves it, to B's GEMM by mm."""
    _path(monkeypatch, path)
    a, b = ["ln", "gemm", "ln"], ["ln", "gemm", "gemm", "gemm", "ln"]
    keys = ([LN, "aten::mm", LN], [LN, "aten::bmm", "aten::mm", "aten::bmm", LN])
    assert al.align(a, b, keys) == [(0, 0), (1, 2), (2, 4)]


@pytest.mark.parametrize("path", ["rows", "myers"])
def test_slide_finds_the_agreeing_launch_past_nearer_same_name_ones(monkeypatch, path):
    """B (then A, the mirror) has a copy and three GEMMs by bmm, mm, bmm where the other has one GEMM by mm: the
    pair slides to the GEMM by mm, though a GEMM of another op is nearer the same offset, on either side."""
    _path(monkeypatch, path)
    one = ["ln", "gemm", "ln"], [LN, "aten::mm", LN]
    three = ["ln", "copy", "gemm", "gemm", "gemm", "ln"], [LN, "aten::copy_", "aten::bmm", "aten::mm", "aten::bmm", LN]
    assert al.align(one[0], three[0], (one[1], three[1])) == [(0, 0), (1, 3), (2, 5)]
    assert al.align(three[0], one[0], (three[1], one[1])) == [(0, 0), (3, 1), (5, 2)]


def test_slide_takes_the_agreeing_launch_nearest_the_step_start():
    """A's one GEMM by mm; B's three by bmm, mm, mm. The common tail pairs it with B's last (ops agree), two
    launches past its offset; of B's two that agree the first pair goes to the one nearest the same offset since
    the step's start, B's second, not to the one the tail took."""
    keys = (["aten::mm"], ["aten::bmm", "aten::mm", "aten::mm"])
    assert al.align(["gemm"], ["gemm"] * 3, keys) == [(0, 1)]


@pytest.mark.parametrize("path", ["rows", "halved", "myers"])
def test_slide_looks_below_the_same_offset_too(monkeypatch, path):
    """A = ln x x, B = ln g g x: B's x is 3 launches past the ln, A has no launch there (its x's are 1 and 2
    past it). The LCS pairs B's x with A's first x (g is B's alone, so what is left pairs at its head); the
    slide moves it to the launch nearest the same offset, A's second x, which lies below that offset. In every
    other fixture the launch the slide wants is at or above the offset, so a slide that looked only there passed."""
    _path(monkeypatch, path)
    a, b = ["ln", "x", "x"], ["ln", "g", "g", "x"]
    assert al.align(a, b) == [(0, 0), (2, 3)]
    assert al.align(b, a) == [(0, 0), (3, 2)]  # the mirror: the slide on B's side
    assert al.align(["x", "x"], ["g", "g", "x"]) == [(1, 2)]  # no pair before: offsets from the step's start
