"""compare.py's text and data at their edges, found by running every mutant of the file (docs/tests.md): the whole
comparison of two small steps word for word (a kept kernel with another call elsewhere, two replacements, CPU ops
gone and new), nothing replaced, a kernel only in B, a CPU trace beside a GPU one, the training table's skipped
phases, the per-cent change from nothing, the step table's elision and a replaced group whose side is unseen;
then the grouping's choices among equal evidence, one test per rule (its gap mutants, tests/mutation_survivors.md).
Every number is worked out by hand from the kineto() traces (test_compare.py): a step's CPU span is 1 µs plus
5 µs per launch, its kernels run back to back."""
import pytest

from trace_reader.render import compare_text
from trace_reader.comparison import units
from trace_reader.comparison import pairing
import inspect_trace as it
from test_compare import in_spans, kineto, replaced


def traces(a_steps, b_steps):
    return it.parse_trace(kineto(a_steps), "a.json"), it.parse_trace(kineto(b_steps), "b.json")


def test_two_small_steps_compared_word_for_word():
    """A: mm 5, gelu 5, sub 2 (GPU 12 µs, CPU 1 + 15 = 16). B: mm 6, gelu 4, mm 1, add 3 (GPU 14, CPU 21).
    The first mm stayed (+20%), B's second is counted in a group (the "*"); gelu 5 -> 4 (-20%); sub's kernel
    became mm + add, 2 -> 4 (+100%), as nothing else tells them apart."""
    a, b = traces([[("k_same", 5.0, "aten::mm"), ("k_old", 5.0, "aten::gelu"), ("k_gone", 2.0, "aten::sub")]] * 2,
                  [[("k_same", 6.0, "aten::mm"), ("k_new", 4.0, "aten::gelu"), ("k_same", 1.0, "aten::mm"),
                    ("k_extra", 3.0, "aten::add")]] * 2)
    d = it.comparison_data(a, b)
    assert compare_text.render(d) == """\
A  a.json  (GPU, 2 steps)
B  b.json  (GPU, 2 steps)

Per step (µs): GPU busy and CPU span, side by side (2 steps)
A step  A GPU  A CPU  B step  B GPU  B CPU
------  -----  -----  ------  -----  -----
#2       12.0   16.0  #2       14.0   21.0
#3       12.0   16.0  #3       14.0   21.0
median   12.0   16.0  median   14.0   21.0
mean     12.0   16.0  mean     14.0   21.0

GPU kernels, time per step: A 12.0 µs, B 14.0 µs (2 + 2 steps in the typical launch order): the sum of what \
follows, each call counted once

GPU kernels, same name in both: calls per step, µs per call, µs per step
name      calls A  calls B  µs/call A  µs/call B  per call  µs/step A  µs/step B
--------  -------  -------  ---------  ---------  --------  ---------  ---------
k_same *        1        1        5.0        6.0      +20%        5.0        6.0
* the calls that stayed; this name's other calls are counted below (Replaced, Only in), once

Replaced, paired by what the kernels do (µs per step; 2 + 2 steps in the typical launch order):
  k_old
    -> k_new
    5.0 -> 4.0 µs per step (-20%), calls × µs: A 1 × 5.0; B 1 × 4.0
    paired by: gelu
  k_gone
    -> k_same + k_extra
    2.0 -> 4.0 µs per step (+100%), calls × µs: A 1 × 2.0; B 1 × 1.0 + 1 × 3.0
    paired by: nothing tells them apart: the nearest kernels left, replaced as a whole

Only in A: (none)

Only in B: (none)

CPU ops gone in B:
  1/step  aten::sub

CPU ops new in B:
  1/step  aten::add"""
    assert d["same"][0]["elsewhere"] == {"a": 0, "b": 1}
    assert [(r["old_calls"], r["new_calls"], r["new_us_per_call"]) for r in d["replaced"]] == [
        ({"k_old": 1}, {"k_new": 1}, {"k_new": 4.0}),
        ({"k_gone": 1}, {"k_same": 1, "k_extra": 1}, {"k_same": 1.0, "k_extra": 3.0})]


def test_nothing_replaced_and_a_kernel_only_in_b():
    """B adds an add kernel of 3 µs that nothing in A can have become: Only in B, and its op is new."""
    a, b = traces([[("k_same", 5.0, "aten::mm")]] * 2, [[("k_same", 5.0, "aten::mm"), ("k_extra", 3.0, "aten::add")]] * 2)
    text = compare_text.render(it.comparison_data(a, b))
    assert text.split("\n\n")[-5:] == [
        "Replaced, paired by what the kernels do (µs per step; 2 + 2 steps in the typical launch order):\n  (none)",
        "Only in A: (none)", "Only in B:\n       3.0 µs/step  1 × 3.0  k_extra", "CPU ops gone in B: (none)",
        "CPU ops new in B:\n  1/step  aten::add"]


def test_a_cpu_trace_beside_a_gpu_trace():
    """A: the same step without its kernels (a CPU trace: its unit is aten::mm's 4 µs); B: the GPU's 5 µs kernel.
    A's steps have no GPU busy time, and the tables say that the two traces are of different devices."""
    steps = [[("k_same", 5.0, "aten::mm")]] * 2
    d = it.comparison_data(it.parse_trace(cpu_trace(steps), "c.json"), it.parse_trace(kineto(steps), "g.json"))
    assert [s["gpu_busy_us"] for s in d["a"]["steps"]] == [None, None]
    assert [s["gpu_busy_us"] for s in d["b"]["steps"]] == [5.0, 5.0]
    lines = compare_text.render(d).splitlines()
    assert lines[:2] == ["A  c.json  (CPU, 2 steps)", "B  g.json  (GPU, 2 steps)"]
    assert lines[13:16] == [
        "Units of work (CPU kernels), same name in both: calls per step, µs per call, µs per step -- note: A is a "
        "cpu trace, B a cuda trace", "(none)", ""]
    d["b"]["device_name"] = "NVIDIA H200"
    assert compare_text.render(d).splitlines()[1] == "B  g.json  (NVIDIA H200, 2 steps)"


def test_the_training_table_leaves_out_a_phase_one_side_lacks():
    """forward has no GPU time in A (and no CPU time in B): left out, and backward still listed, with the kernel
    counts on GPUs only. 20 -> 15 is -25%, 40 -> 50 is +25%."""
    t = {"a": {"phases": {"forward": {"gpu_us": None, "cpu_us": 30.0, "kernels": 2},
                          "backward": {"gpu_us": 20.0, "cpu_us": 40.0, "kernels": 4}}, "optimizer": None},
         "b": {"phases": {"forward": {"gpu_us": 10.0, "cpu_us": None, "kernels": 2},
                          "backward": {"gpu_us": 15.0, "cpu_us": 50.0, "kernels": 3}}, "optimizer": None}}
    assert compare_text._training_lines(t, True)[2] == (
        "phase     A GPU µs  B GPU µs  change  kernels A  kernels B\n"
        "--------  --------  --------  ------  ---------  ---------\n"
        "backward      20.0      15.0    -25%          4          3")
    assert compare_text._training_lines(t, False)[2] == (
        "phase     A CPU µs  B CPU µs  change\n"
        "--------  --------  --------  ------\n"
        "backward      40.0      50.0    +25%")


def test_change_from_nothing_is_new():
    assert [compare_text._change(0.0, 5.0), compare_text._change(0.5, 1.0), compare_text._change(1.0, 2.0), compare_text._change(2.0, 1.0)] == [
        "new", "+100%", "+100%", "-50%"]


def test_the_step_table_shows_six_steps_whole_and_elides_seven():
    """head 3 + tail 2 + 1: six steps are all shown; seven show #2..#4, "…", #7, #8."""
    def rows(n):
        da = {"steps": [{"step": i + 2, "gpu_busy_us": 1.0, "cpu_us": 2.0} for i in range(n)]}
        return [line.split()[0] for line in compare_text._steps_table(da, {"steps": []})[1].splitlines()[2:]]

    assert rows(6) == ["#2", "#3", "#4", "#5", "#6", "#7", "median", "mean"]
    assert rows(7) == ["#2", "#3", "#4", "…", "#7", "#8", "median", "mean"]


def test_names_repeat_from_two_times():
    assert compare_text._names(["k"], 2, str) == "2 × (k)"
    assert compare_text._names(["k"], 1, str) == "k"


def test_a_replaced_group_with_a_side_unseen():
    """B's side empty and B's work hidden (compiled C++ not in the trace): the reason in brackets, "?" for its time.
    Both sides present: the change, whatever a side's hidden note says. Nothing hidden: "(nothing)"."""
    r = {"old": ["k"], "new": [], "times": 1, "old_us": 5.0, "new_us": 0.0, "old_calls": {"k": 1}, "new_calls": {},
         "old_us_per_call": {"k": 5.0}, "new_us_per_call": {}, "by": "gelu"}
    hidden = {"a": None, "b": "compiled C++ kernels are not in the trace"}
    assert compare_text._replaced(r, hidden, str) == ["  k", "    -> (compiled C++ kernels are not in the trace)",
                                             "    5.0 -> ? µs per step, calls × µs: A 1 × 5.0; B none",
                                             "    paired by: gelu"]
    assert compare_text._replaced(r, {"a": None, "b": None}, str)[1:3] == [
        "    -> (nothing)", "    5.0 -> 0.0 µs per step (-100%), calls × µs: A 1 × 5.0; B none"]
    both = {**r, "new": ["m"], "new_us": 4.0, "new_calls": {"m": 1}, "new_us_per_call": {"m": 4.0}}
    assert compare_text._replaced(both, {"a": "x", "b": "y"}, str)[2] == \
        "    5.0 -> 4.0 µs per step (-20%), calls × µs: A 1 × 5.0; B 1 × 4.0"
    gone = {**both, "old": [], "old_us": 0.0, "old_calls": {}, "old_us_per_call": {}}
    assert compare_text._replaced(gone, {"a": None, "b": None}, str)[:3] == [
        "  (nothing)", "    -> m", "    0.0 -> 4.0 µs per step (new), calls × µs: A none; B 1 × 4.0"]
    assert compare_text._replaced(gone, {"a": "hidden A", "b": "y"}, str)[2] == \
        "    ? -> 4.0 µs per step, calls × µs: A none; B 1 × 4.0"


def test_a_call_only_in_a_marks_its_name_and_one_steps_ops_are_per_step():
    """One step each. A: mm 5, mm 3, sub 2; B: mm 6. The first mm stayed; A's second mm and its sub are only in A,
    so the kept name is marked (its other call is counted below); sub's op is gone, 1 per step (one step)."""
    a, b = traces([[("k_same", 5.0, "aten::mm"), ("k_same", 3.0, "aten::mm"), ("k_x", 2.0, "aten::sub")]],
                  [[("k_same", 6.0, "aten::mm")]])
    d = it.comparison_data(a, b)
    assert d["same"][0]["elsewhere"] == {"a": 1, "b": 0}
    assert [(r["name"], r["calls"], r["us"]) for r in d["only_a"]] == [("k_same", 1, 3.0), ("k_x", 1, 2.0)]
    assert d["ops_gone"] == {"aten::sub": 1.0} and d["ops_new"] == {}
    assert "k_same *        1        1        5.0        6.0      +20%        5.0        6.0" in compare_text.render(d)


def test_a_trace_without_steps_is_noted_then_a_blank_line():
    raw = kineto([[("k_same", 5.0, "aten::mm")]])
    raw["traceEvents"] = [e for e in raw["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    whole = it.parse_trace(raw, "w.json")
    _, b = traces([], [[("k_same", 6.0, "aten::mm")]])
    lines = compare_text.render(it.comparison_data(whole, b)).splitlines()
    assert lines[:5] == ["A  w.json  (GPU, no ProfilerStep spans: one step, the whole trace)",
                         "B  b.json  (GPU, 1 steps)", "",
                         'note: A has no ProfilerStep spans, so its "per step" below is per trace; the other\'s is '
                         "per step", ""]


def test_long_kernel_names_are_cut_unless_asked_whole():
    long = "void cutlass::Kernel<" + "x" * 100 + ">"
    a, b = traces([[(long, 5.0, "aten::mm")]], [[(long, 6.0, "aten::mm")]])
    d = it.comparison_data(a, b)
    assert long not in compare_text.render(d) and long in compare_text.render(d, full_names=True)


def annotated(steps):
    """kineto()'s trace, each kernel's launching op inside a record_function span of its own when given a fourth
    item: (kernel, µs, op, annotation)."""
    data = kineto([[k[:3] for k in step] for step in steps])
    ops = iter([e for e in data["traceEvents"] if e["cat"] == "cpu_op"])
    spans = []
    for step in steps:
        for k in step:
            op = next(ops) if k[2] else None
            if op is not None and len(k) > 3:
                spans.append({"ph": "X", "cat": "user_annotation", "name": k[3], "ts": op["ts"] - 0.5,
                              "dur": op["dur"] + 1, "pid": 1, "tid": 1, "args": {}})
    data["traceEvents"] += spans
    return data


def test_the_spans_around_an_op_name_what_its_kernel_does():
    """aten::mul in GeluBlock became aten::add in GeluBlock: the ops share no word, their spans share gelu and block.
    aten::gelu in MlpBlock became aten::gelu in AttnBlock: the op's word, gelu, is what they share (block too)."""
    same = ("k_same", 5.0, "aten::mm")
    a = it.parse_trace(annotated([[same, ("k_a", 3.0, "aten::mul", "GeluBlock")]] * 2), "a.json")
    b = it.parse_trace(annotated([[same, ("k_b", 2.0, "aten::add", "GeluBlock")]] * 2), "b.json")
    assert [r["by"] for r in it.comparison_data(a, b)["replaced"]] == ["block, gelu"]
    a = it.parse_trace(annotated([[same, ("k_a", 3.0, "aten::gelu", "MlpBlock")]] * 2), "a.json")
    b = it.parse_trace(annotated([[same, ("k_b", 2.0, "aten::gelu", "AttnBlock")]] * 2), "b.json")
    assert [r["by"] for r in it.comparison_data(a, b)["replaced"]] == ["block, gelu"]


def test_kernels_without_a_launching_op_are_replaced_too():
    """Another harness's bare launches: k_old and k_new have no op; nothing tells them apart but their place."""
    a, b = traces([[("k_same", 5.0, "aten::mm"), ("k_old", 3.0, None)]] * 2,
                  [[("k_same", 5.0, "aten::mm"), ("k_new", 2.0, None)]] * 2)
    assert [(r["old"], r["new"], r["by"]) for r in it.comparison_data(a, b)["replaced"]] == [
        (["k_old"], ["k_new"], units.REST)]


def test_a_gemm_pair_says_whether_sizes_or_order_paired_it():
    """cuBLAS's GEMM under aten::addmm became an Inductor template (its launch named after it): their ops share no
    word. Both recorded a [8, 16] and a [16, 32] input: "the same tensor sizes". The template without shapes, or
    with other sizes: "in launch order"."""
    same = ("k_same", 5.0, "aten::mm")
    addmm = ("nvjet_gemm", 4.0, "aten::addmm", [[32], [8, 16], [16, 32]])

    def by(template_dims):
        t = ("triton_tem_fused_mm_0", 3.0, "triton_tem_fused_mm_0", *([template_dims] if template_dims else []))
        a = it.parse_trace(kineto([[same, addmm]] * 2), "a.json")
        b = it.parse_trace(kineto([[same, t]] * 2), "b.json")
        return [r["by"] for r in it.comparison_data(a, b)["replaced"]]

    assert by([[8, 16], [16, 32], [8, 32]]) == [units.GEMM_SIZES]
    assert by(None) == [units.GEMM_ORDER]
    assert by([[4, 4], [4, 4]]) == [units.GEMM_ORDER]
    # a bare launch after the template (no op, no words, no sizes) joins the GEMM pair by place: the group keeps
    # the evidence it had, and its label, while adding its own
    t = ("triton_tem_fused_mm_0", 3.0, "triton_tem_fused_mm_0", [[8, 16], [16, 32], [8, 32]])
    a = it.parse_trace(kineto([[same, addmm]] * 2), "a.json")
    b = it.parse_trace(kineto([[same, t, ("k_extra", 1.0, None)]] * 2), "b.json")
    assert [(r["old"], r["new"], r["by"]) for r in it.comparison_data(a, b)["replaced"]] == [
        (["nvjet_gemm"], ["triton_tem_fused_mm_0", "k_extra"], units.GEMM_SIZES)]


def cpu_trace(steps, compiled=False):
    """kineto()'s steps as a CPU trace (the ops are the units); compiled: a compiled region in each step whose C++
    kernels were not profiled, so the trace does not show all of its own work."""
    from test_train_step import _cpu_only

    data = _cpu_only(kineto(steps))
    if compiled:
        data["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "Torch-Compiled Region: 0/0",
                                 "ts": e["ts"] + 0.1, "dur": 0.5, "pid": 1, "tid": 1, "args": {}}
                                for e in data["traceEvents"] if e["name"].startswith("ProfilerStep")]
    return data


def test_a_group_whose_other_side_is_unseen_comes_after_the_groups_in_as_order():
    """A: a compiled CPU run without its C++ kernels (mm x4, gelu); B: add, mm x4, mul. gelu became mul (by place);
    B's add, four kept ops from anything of A's, is work A's trace may hide: a group with no A side, listed after
    the groups that have one, though B launched it first."""
    mm = ("k", 5.0, "aten::mm")
    a = it.parse_trace(cpu_trace([[mm, mm, mm, mm, ("k", 3.0, "aten::gelu")]] * 2, compiled=True), "a.json")
    b = it.parse_trace(cpu_trace([[("k", 1.0, "aten::add"), mm, mm, mm, mm, ("k", 2.0, "aten::mul")]] * 2), "b.json")
    d = it.comparison_data(a, b)
    assert d["hidden"]["a"] == units.HIDDEN_CPP
    assert [(r["old"], r["new"], r["by"]) for r in d["replaced"]] == [
        (["aten::gelu"], ["aten::mul"], units.REST), ([], ["aten::add"], units.UNSEEN)]


def test_of_two_same_name_kernels_the_one_whose_op_had_the_same_sizes_stayed():
    """A runs k twice (aten::mm on [8, 16] x [16, 32], 5 µs; on [4, 4] x [4, 4], 3 µs); B once, on [4, 4] x [4, 4]
    (3.5 µs): the 3 µs call stayed (+17%), the 5 µs one is only in A, though it came first."""
    a = it.parse_trace(kineto([[("k", 5.0, "aten::mm", [[8, 16], [16, 32]]),
                                ("k", 3.0, "aten::mm", [[4, 4], [4, 4]])]] * 2), "a.json")
    b = it.parse_trace(kineto([[("k", 3.5, "aten::mm", [[4, 4], [4, 4]])]] * 2), "b.json")
    d = it.comparison_data(a, b)
    assert [(s["a"]["us"], s["b"]["us"]) for s in d["same"]] == [(3.0, 3.5)]
    assert [(r["name"], r["us"]) for r in d["only_a"]] == [("k", 5.0)]


def test_an_epilogue_the_template_fused_joins_the_gemm_pair_by_its_word():
    """Eager addmm then gelu; compiled, one template that fused the GeLU (its name says addmm and gelu). The GEMMs
    pair first, GEMM for GEMM; gelu, left alone, then finds its word in the template's group."""
    same = ("k_same", 5.0, "aten::mm")
    t = "triton_tem_fused_addmm_gelu_0"
    a = it.parse_trace(kineto([[same, ("nvjet_gemm", 4.0, "aten::addmm"), ("gelu_kernel", 1.0, "aten::gelu")]] * 2))
    b = it.parse_trace(kineto([[same, (t, 4.5, t)]] * 2))
    d = it.comparison_data(a, b)
    assert [(r["old"], r["new"], r["by"]) for r in d["replaced"]] == [
        (["nvjet_gemm", "gelu_kernel"], [t], "addmm, gelu")]
    assert d["only_a"] == []


# ------------------------------------------------------------------ the grouping's choices among equal evidence
# Each test below offers the grouping a choice that only one rule tells apart (tests/mutation_survivors.md,
# compare.py's gaps): the offset in a gap, the nearer gap, the word count, both gaps at one distance, the gap a
# whole block looks back to, a GEMM's gap window, gap and rank, and a merged group's two sides. Kernels of A and B
# never share a name unless they stayed (keep_*, each its own op); every answer is worked out by hand in the
# docstring: "gap n" is the n kept kernels before a kernel, "offset" the kernels left or come since the last.

KEEP = [(f"keep_{i}", 5.0, f"aten::op{i}") for i in range(4)]
K0, K1, K2, K3 = KEEP


def groups(a_step, b_step):
    """One step of each: the replaced groups as (A's kernels, B's kernels, paired by)."""
    return replaced(it.comparison_data(*traces([a_step], [b_step])))


def test_two_gelus_moved_past_a_kept_kernel_pair_in_order():
    """A: K0, gelu_a1, gelu_a2, K1, K2; B moved its two GeLUs after K1. A's are in gap 1 at offsets 0 and 1 (the
    first of A's kernels left are in gap 1, not 0: their offsets start at 0 all the same), B's in gap 2 at 0 and 1:
    one gap apart, the first takes the first, the second the second. Offsets 1 and 2 for A's would cross them
    into one group of four."""
    a = [K0, ("gelu_a1", 3.0, "aten::gelu"), ("gelu_a2", 4.0, "aten::gelu"), K1, K2]
    b = [K0, K1, ("gelu_b1", 2.0, "MyGelu"), ("gelu_b2", 1.0, "MyGelu"), K2]
    assert groups(a, b) == [(["gelu_a1"], ["gelu_b1"], "gelu"), (["gelu_a2"], ["gelu_b2"], "gelu")]


def test_offsets_count_again_from_each_kept_kernel():
    """A: sub_a1, sub_a2, K0, gelu_a1, gelu_a2, K1; B: sub_b, K0, gelu_b1, gelu_b2, K1. Two subs became one (by
    their word); after K0 each GeLU of A is at the offset of B's it became (0, 1). Counted on from the subs (A's
    at 2, 3; B's at 1, 2), both of A's would find B's second first: one group of four GeLUs."""
    a = [("sub_a1", 2.0, "aten::sub"), ("sub_a2", 2.0, "aten::sub"), K0,
         ("gelu_a1", 3.0, "aten::gelu"), ("gelu_a2", 4.0, "aten::gelu"), K1]
    b = [("sub_b", 3.0, "aten::sub"), K0, ("gelu_b1", 2.0, "MyGelu"), ("gelu_b2", 1.0, "MyGelu"), K1]
    assert groups(a, b) == [(["sub_a1", "sub_a2"], ["sub_b"], "sub"), (["gelu_a1"], ["gelu_b1"], "gelu"),
                            (["gelu_a2"], ["gelu_b2"], "gelu")]


def test_of_two_candidates_sharing_one_word_the_one_in_its_own_gap_wins():
    """A: mul_a, K0, K1, liger_k (LigerGELUMulFunction: liger, gelu, mul), K2; B: mul_b, K0, K1, gelu_b, K2.
    liger_k shares one word with gelu_b (gap 2, its own) and one with mul_b (gap 0): the nearer gap wins, not
    the lower; mul_b is mul_a's. Joined to mul_b, liger_k would make one group of all four."""
    a = [("mul_a", 2.0, "aten::mul"), K0, K1, ("liger_k", 6.0, "LigerGELUMulFunction"), K2]
    b = [("mul_b", 2.0, "aten::mul"), K0, K1, ("gelu_b", 4.0, "aten::gelu"), K2]
    assert groups(a, b) == [(["mul_a"], ["mul_b"], "mul"), (["liger_k"], ["gelu_b"], "gelu")]


def test_the_candidate_sharing_more_words_wins_though_a_gap_farther():
    """A: K0, gelu_a, liger_k (liger, gelu, mul), K1, K2; B: K0, gelu_b, K1, TRITON (gelu, mul), K2. liger_k
    (gap 1) shares gelu with gelu_b (gap 1) and gelu, mul with Inductor's fused kernel (gap 2): the two words win
    over the nearer gap; gelu_a takes gelu_b. The fewest words would make one group of all four."""
    tri = "triton_poi_fused_gelu_mul_0"
    a = [K0, ("gelu_a", 3.0, "aten::gelu"), ("liger_k", 6.0, "LigerGELUMulFunction"), K1, K2]
    b = [K0, ("gelu_b", 2.0, "aten::gelu"), K1, (tri, 5.0, tri), K2]
    assert groups(a, b) == [(["gelu_a"], ["gelu_b"], "gelu"), (["liger_k"], [tri], "gelu, mul")]


def test_a_word_is_looked_for_in_both_gaps_at_one_distance():
    """A: K0, gelu_a1, K1, gelu_a2, K2; B: gelu_b1, K0, K1, k_extra (a bare launch), gelu_b2, K2. gelu_a1
    (gap 1, offset 0) has B's GeLUs one gap away on both sides: gelu_b1 (gap 0, offset 0) and gelu_b2 (gap 2,
    offset 1); the nearer offset wins. gelu_a2 takes gelu_b2, and k_extra joins them by place. Looking in the
    later gap only, gelu_a1 would take gelu_b2: one group of all five."""
    a = [K0, ("gelu_a1", 3.0, "aten::gelu"), K1, ("gelu_a2", 4.0, "aten::gelu"), K2]
    b = [("gelu_b1", 2.0, "aten::gelu"), K0, K1, ("k_extra", 1.0, None), ("gelu_b2", 1.0, "aten::gelu"), K2]
    assert groups(a, b) == [(["gelu_a1"], ["gelu_b1"], "gelu"), (["gelu_a2"], ["k_extra", "gelu_b2"], "gelu")]


def test_what_nothing_tells_apart_joins_the_nearer_gap_before_it():
    """A: K0, odd_old (Qux), K1, K2, gemm_old, K3; B: foo_new (Foo), K0, K1, K2, gemm_new, bar_new (Bar), K3. The
    GEMMs pair; odd_old (gap 1) shares nothing with foo_new (gap 0) or bar_new (gap 3): it is replaced by the
    one gap before, one kept kernel away, not by the one two gaps after; bar_new joins the GEMM beside it."""
    a = [K0, ("odd_old", 3.0, "Qux"), K1, K2, ("gemm_old", 20.0, "aten::mm"), K3]
    b = [("foo_new", 2.0, "Foo"), K0, K1, K2, ("gemm_new", 18.0, "aten::mm"), ("bar_new", 1.0, "Bar"), K3]
    assert groups(a, b) == [(["odd_old"], ["foo_new"], units.REST), (["gemm_old"], ["gemm_new", "bar_new"], "mm")]


def test_a_block_replaced_as_a_whole_is_not_joined_again_to_the_gemm_beside_it():
    """A: K0, odd_old (Qux), gemm_old, K1; B: K0, gemm_new, new_1 (Foo), new_2 (Bar), K1. The GEMMs pair; odd_old
    shares nothing with new_1 or new_2, so the three are one group (place), which holds both traces: done. Had
    the second merge kept B's side only, the group would count as one trace's, and odd_old would be joined again
    by place, to gemm_new at its offset: one group of everything."""
    a = [K0, ("odd_old", 3.0, "Qux"), ("gemm_old", 20.0, "aten::mm"), K1]
    b = [K0, ("gemm_new", 18.0, "aten::mm"), ("new_1", 1.0, "Foo"), ("new_2", 2.0, "Bar"), K1]
    assert groups(a, b) == [(["odd_old"], ["new_1", "new_2"], units.REST), (["gemm_old"], ["gemm_new"], "mm")]


def test_a_gemm_pairs_up_to_max_gap_kept_kernels_later_or_earlier_not_three_earlier():
    """cuBLAS's GEMM under aten::addmm and Inductor's template (mm): no word in common, so the label says how they
    paired. B's two kept kernels later or earlier: GEMM for GEMM. Three earlier: each is only in its own trace
    (more than MAX_GAP apart: not even by place)."""
    gemm_old, tem = ("nvjet_gemm", 20.0, "aten::addmm"), "triton_tem_fused_mm_0"
    gemm_new = (tem, 18.0, tem)
    assert groups([gemm_old, K0, K1], [K0, K1, gemm_new]) == [(["nvjet_gemm"], [tem], units.GEMM_ORDER)]
    assert groups([K0, K1, gemm_old], [gemm_new, K0, K1]) == [(["nvjet_gemm"], [tem], units.GEMM_ORDER)]
    d = it.comparison_data(*traces([[K0, K1, K2, gemm_old]], [[gemm_new, K0, K1, K2]]))
    assert d["replaced"] == []
    assert [r["name"] for r in d["only_a"]] == ["nvjet_gemm"] and [r["name"] for r in d["only_b"]] == [tem]


def test_a_gemm_pairs_with_the_one_in_its_own_gap_before_one_a_gap_lower():
    """A: K0, gemm_a1, gemm_a2, K1; B: gemm_b0, K0, gemm_b1, K1 (no sizes: GEMM for GEMM). gemm_a1 (gap 1, first)
    takes gemm_b1 (gap 1, first), not gemm_b0 one gap lower; gemm_a2 the one left."""
    a = [K0, ("gemm_a1", 20.0, "aten::mm"), ("gemm_a2", 21.0, "aten::mm"), K1]
    b = [("gemm_b0", 18.0, "aten::mm"), K0, ("gemm_b1", 19.0, "aten::mm"), K1]
    assert groups(a, b) == [(["gemm_a1"], ["gemm_b1"], "mm"), (["gemm_a2"], ["gemm_b0"], "mm")]


def test_a_gemm_whose_rank_is_free_takes_it_not_the_lowest_rank_left():
    """One gap, three GEMMs each side. gemm_a0's sizes ([8, 16] x [16, 32]) are gemm_b2's only: it takes it.
    gemm_a1, the second of A's, takes the second of B's, gemm_b1, not the first (still free); gemm_a2 the one
    left, gemm_b0."""
    s = [[8, 16], [16, 32]]
    a = [K0, ("gemm_a0", 20.0, "aten::mm", s), ("gemm_a1", 21.0, "aten::mm"), ("gemm_a2", 22.0, "aten::mm"), K1]
    b = [K0, ("gemm_b0", 18.0, "aten::mm"), ("gemm_b1", 19.0, "aten::mm"), ("gemm_b2", 17.0, "aten::mm", s), K1]
    assert groups(a, b) == [(["gemm_a0"], ["gemm_b2"], "mm"), (["gemm_a1"], ["gemm_b1"], "mm"),
                            (["gemm_a2"], ["gemm_b0"], "mm")]


def test_a_for_loop_optimizer_pairs_each_op_with_the_foreach_op_in_its_place():
    """AdamW per parameter (3): param.mul_ (weight decay), exp_avg.lerp_, exp_avg_sq.mul_, addcmul_; foreach runs
    each once over all three. The first mul_ of each parameter comes before lerp_ (as foreach's first _foreach_mul_)
    and the second after it (as the second): 3 + 3, each with its own. By launch position alone, the first
    parameter's weight decay took one and the other five mul_ the other."""
    per_param = [("mul_wd", 3.0, "aten::mul_"), ("lerp_k", 5.0, "aten::lerp_"), ("mul_sq", 3.5, "aten::mul_"),
                 ("addcmul_k", 3.3, "aten::addcmul_")]
    foreach = [("mta_mul1", 17.0, "aten::_foreach_mul_"), ("mta_lerp", 22.0, "aten::_foreach_lerp_"),
               ("mta_mul2", 17.5, "aten::_foreach_mul_"), ("mta_addcmul", 13.0, "aten::_foreach_addcmul_")]
    assert groups([K0, *per_param * 3, K1], [K0, *foreach, K1]) == [
        (["mul_wd"] * 3, ["mta_mul1"], "mul"), (["lerp_k"] * 3, ["mta_lerp"], "lerp"),
        (["mul_sq"] * 3, ["mta_mul2"], "mul"), (["addcmul_k"] * 3, ["mta_addcmul"], "addcmul")]


def test_neighbours_only_break_ties_between_words_never_in_the_pass_by_place():
    """A GEMM pairs with the GEMM; B's extra 'le' kernel, whose word nothing in A has, joins the nearest group by
    place (sin's, right before it), not the GEMM's because the GEMM has neighbours on both sides."""
    a = [K0, ("cos_a", 1.0, "aten::cos"), ("gemm_a", 5.0, "aten::mm"), ("sin_a", 1.0, "aten::sin"), K1]
    b = [K0, ("cos_b", 1.0, "aten::cos"), ("gemm_b", 5.0, "aten::mm"), ("sin_b", 1.0, "aten::sin"),
         ("le_b", 1.0, "aten::le"), ("fill_b", 1.0, None), K1]
    assert groups(a, b) == [(["cos_a"], ["cos_b"], "cos"), (["gemm_a"], ["gemm_b"], "mm"),
                            (["sin_a"], ["sin_b", "le_b", "fill_b"], "sin")]


def test_a_module_whose_kernels_all_have_ops_is_paired_by_what_they_do_not_as_a_whole():
    """Under the same module annotation on both sides, every kernel launched by an op (here B fused GeLU and mul
    into one op of its own): the GEMMs pair one for one and gelu + mul with the fused op, not the module as a
    whole, which is only for a module whose kernels one trace launches with no op."""
    s_in, s_down = [[8, 64], [64, 256]], [[8, 256], [256, 64]]
    a = [K0, ("gemm_g", 5.0, "aten::mm", s_in), ("gelu_a", 1.0, "aten::gelu"), ("gemm_u", 5.0, "aten::mm", s_in),
         ("mul_a", 1.0, "aten::mul"), ("gemm_d", 5.0, "aten::mm", s_down), K1]
    b = [K0, ("tgemm_g", 4.0, "aten::mm", s_in), ("tgemm_u", 4.0, "aten::mm", s_in),
         ("gelu_mul_b", 1.5, "MyGeluMul"), ("tgemm_d", 4.0, "aten::mm", s_down), K1]
    spans = [("model.layers.0.mlp", 1, 5)], [("model.layers.0.mlp", 1, 4)]
    ta, tb = (it.parse_trace(in_spans(kineto([[*s]]), sp)) for s, sp in ((a, spans[0]), (b, spans[1])))
    d = it.comparison_data(ta, tb)
    assert [(r["old"], r["new"]) for r in d["replaced"]] == [
        (["gemm_g"], ["tgemm_g"]), (["gelu_a", "mul_a"], ["gelu_mul_b"]), (["gemm_u"], ["tgemm_u"]),
        (["gemm_d"], ["tgemm_d"])]


def test_sgd_with_momentum_for_loop_pairs_its_three_adds_by_their_neighbours():
    """SGD with momentum and weight decay, per parameter (6): add (grad + wd * p), mul_ (buf *= momentum), add_
    (buf += grad), add_ (p -= lr * buf); foreach: one of each over all six. Three kinds of add share the word:
    each pairs with the foreach op with the same neighbours (the first before mul_, the second after it, the third
    last), 6 for 1 each; an AMP unscale kernel changed in the same gap does not disturb it."""
    sgd = [("add_wd", 2.0, "aten::add"), ("mul_buf", 2.0, "aten::mul_"), ("add_buf", 2.0, "aten::add_"),
           ("add_p", 2.0, "aten::add_")]
    foreach = [("mta_add_wd", 9.0, "aten::_foreach_add"), ("mta_mul", 9.0, "aten::_foreach_mul_"),
               ("mta_add_buf", 9.0, "aten::_foreach_add_"), ("mta_add_p", 9.0, "aten::_foreach_add_")]
    want = [(["add_wd"] * 6, ["mta_add_wd"], "add"), (["mul_buf"] * 6, ["mta_mul"], "mul"),
            (["add_buf"] * 6, ["mta_add_buf"], "add"), (["add_p"] * 6, ["mta_add_p"], "add")]
    assert groups([K0, *sgd * 6, K1], [K0, *foreach, K1]) == want
    unscale = ("unscale_a", 3.0, "aten::_amp_foreach_non_finite_check_and_unscale_"), \
        ("unscale_b", 2.0, "aten::_amp_foreach_non_finite_check_and_unscale_")
    got = groups([K0, unscale[0], *sgd * 6, K1], [K0, unscale[1], *foreach, K1])
    assert got[1:] == want and got[0][:2] == (["unscale_a"], ["unscale_b"])


def test_near_offers_four_atoms_each_side_of_the_offset_in_the_nearest_gaps_only():
    """_near's documented window (NEAR = 4), on an index built by hand: under one word, gap 2 holds atoms at offsets
    0, 1, 3, 4, 6, 7, 8, 9, 10, 11 and 12, gap 4 one at 2, gap 0 one at 5. For an atom in gap 2 at offset 3: the
    four before it (0, 1: only two) and the four at or after it (3, 4, 6, 7), nearest first (ties: the earlier
    first, as sorted is stable); 8 to 12 and the other gaps are not looked at. Past the last offset: the last four.
    In gap 3 (no atom of its own) both gaps one away count: 2's four before offset 5 and four at or after it, and
    4's one atom."""
    assert pairing.NEAR == 4

    def atom(gap, offset):
        return pairing._Atom("b", [100 * gap + offset], gap, offset, {"gelu"}, set(), False)

    theirs = [atom(2, o) for o in (0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 12)] + [atom(4, 2), atom(0, 5)]
    idx = pairing._index(theirs, lambda y: y.tags)

    def near(gap, offset):
        return [(y.gap, y.offset) for y in pairing._near(idx, "gelu", atom(gap, offset))]

    assert near(2, 3) == [(2, 3), (2, 4), (2, 1), (2, 0), (2, 6), (2, 7)]
    assert near(2, 2) == [(2, 1), (2, 3), (2, 0), (2, 4), (2, 6), (2, 7)]
    assert near(2, 13) == [(2, 12), (2, 11), (2, 10), (2, 9)]  # past the last: the last four
    assert near(3, 5) == [(2, 4), (2, 6), (2, 3), (2, 7), (2, 8), (4, 2), (2, 1), (2, 9), (2, 0)]
    assert near(1, 0) == [(2, 0), (2, 1), (2, 3), (2, 4), (0, 5)]  # gap 1: gaps 0 and 2 one away
    assert pairing._near(idx, "mul", atom(2, 3)) == []


# ------------------------------------------- eager attention -> sdpa beside a compiled RoPE (issue 55, item 8)

FLASH_NAMES = ["flash_fwd_kernel",  # and the real one, whose template arguments carry cutlass (a GEMM by name)
               "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
               "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
               "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"]
Q, S = [[2, 8, 128, 64]], [[2, 8, 128, 128]]  # q (and k, v) and the score matrix
ROPE = [("mul_k", 1.0, "aten::mul", Q), ("neg_k", 1.5, "aten::neg", [[2, 8, 128, 32]]), ("cat_k", 2.0, "aten::cat", Q),
        ("mul_k", 1.0, "aten::mul", Q), ("add_k", 1.25, "aten::add", Q)]
ATTENTION = [("gemm_bmm", 3.0, "aten::bmm", [[16, 128, 64], [16, 64, 128]]), ("mul_k", 2.0, "aten::mul", S),
             ("add_k", 2.5, "aten::add", S), ("softmax_k", 3.5, "aten::_softmax", S),
             ("gemm_bmm", 3.25, "aten::bmm", [[16, 128, 128], [16, 128, 64]])]
ROPE_FUSED = ("triton_poi_fused_add_cat_mul_neg_0", 4.0, None)  # launched from Python inside a compiled region


def rope_layer(new: bool, flash: str) -> list[tuple]:
    """One decoder layer: the q/k/v GEMM, RoPE then attention, the output GEMM and a norm (kept). New: RoPE one
    compiled Triton kernel, attention one sdpa flash kernel."""
    mid = [ROPE_FUSED, (flash, 8.0, "aten::_scaled_dot_product_flash_attention", Q * 3)] if new else ROPE + ATTENTION
    return [("nvjet_qkv", 10.0, "aten::mm", [[256, 512], [512, 1536]]), *mid,
            ("nvjet_o", 5.0, "aten::mm", [[256, 512], [512, 512]]), ("norm_k", 2.0, "aten::native_layer_norm")]


@pytest.mark.parametrize("flash", FLASH_NAMES, ids=["flash", "flash_cutlass"])
def test_attention_scale_and_mask_stay_with_attention_beside_a_compiled_rope(flash):
    """Eager attention's scale mul and mask add share a word with the compiled RoPE kernel's name (add, cat, mul,
    neg) but are launched between attention's two bmm, after RoPE: they are attention's, replaced by the flash
    kernel, not RoPE's. The old grouping gave RoPE 22.5 -> 8 µs and attention 19.5 -> 16 (-18%), the truth below
    being 13.5 -> 8 and 28.5 -> 16 (-44%). The flash kernel is no GEMM's one-for-one partner, whatever its name
    carries (the old grouping said "GEMM for GEMM")."""
    a = kineto([rope_layer(False, flash) * 2] * 2)
    b = kineto([rope_layer(True, flash) * 2] * 2)
    for e in b["traceEvents"]:  # the RoPE kernel's launch inside its compiled region (the 2nd and 8th launches)
        if e.get("cat") == "cuda_runtime" and e["args"]["correlation"] % 5 == 2:
            b["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "Torch-Compiled Region: 0/0",
                                     "ts": e["ts"] - 0.5, "dur": 3, "pid": 1, "tid": 1, "args": {}})
    d = it.comparison_data(it.parse_trace(a), it.parse_trace(b))
    per_step = 2  # layers
    rope_us, attention_us = sum(u[1] for u in ROPE) * per_step, sum(u[1] for u in ATTENTION) * per_step
    got = {tuple(r["new"]): r for r in d["replaced"]}
    assert set(got) == {(ROPE_FUSED[0],), (flash,)}, list(got)
    rope, attention = got[(ROPE_FUSED[0],)], got[(flash,)]
    assert (rope["old"], rope["times"]) == ([u[0] for u in ROPE], 2)
    assert (attention["old"], attention["times"]) == ([u[0] for u in ATTENTION], 2)
    assert (rope["old_us"], rope["new_us"]) == (rope_us, 8.0) == (13.5, 8.0)
    assert (attention["old_us"], attention["new_us"]) == (attention_us, 16.0) == (28.5, 16.0)
    assert attention["by"] == units.SIZES and d["only_a"] == d["only_b"] == []


def test_a_compiled_model_keeps_its_fused_kernels_partners_wherever_they_were_launched():
    """Inductor fuses and reorders at will: where the replacement around the ops is itself compiled, an op launched
    amid another replacement's ops still joins the fused kernel that names it. A: norm ops (pow, mean, rsqrt) between
    two copies; B (compiled): one foreach copy inside the compiled region, then the fused norm kernel."""
    copy = ("copy_k", 1.0, "aten::copy_", [[64]])
    norm = [("pow_k", 1.0, "aten::pow", [[8, 64]]), ("mean_k", 1.0, "aten::mean", [[8, 64]]),
            ("rsqrt_k", 1.0, "aten::rsqrt", [[8, 1]])]
    a = [K0, copy, *norm, copy, K1]
    b = [K0, ("mta_copy", 1.5, "aten::_foreach_copy_", [[64]]),
         ("triton_red_fused_mean_mul_pow_rsqrt_0", 2.0, None), K1]
    tb = kineto([b])
    tb["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "Torch-Compiled Region: 0/0",
                              "ts": 0.5, "dur": 25, "pid": 1, "tid": 1, "args": {}})
    d = it.comparison_data(it.parse_trace(kineto([a])), it.parse_trace(tb))
    fused = [r for r in d["replaced"] if r["new"] == ["triton_red_fused_mean_mul_pow_rsqrt_0"]]
    assert [r["old"] for r in fused] == [["pow_k", "mean_k", "rsqrt_k"]], replaced(d)


def test_the_grouping_is_the_same_whatever_the_hash_seed(tmp_path):
    """Of candidates equal in words, gap and offset, the first found wins: it was found by iterating a set of words,
    whose order changes with PYTHONHASHSEED, so one pair of traces compared differently run to run (this pair
    under seeds 0, 1 and 2). Each seed in a process of its own, which reads the two traces with trace_reader alone."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    def step(mid, mid2):
        return [("g", 5.0, "aten::mm"), *mid, ("g2", 5.0, "aten::mm"), *mid2, ("g3", 5.0, "aten::mm")]

    a = step([("a0", 2.0, "aten::beta"), ("a1", 3.0, "aten::beta")],
             [("c0", 2.0, "aten::beta"), ("c1", 1.0, "aten::beta_alpha"), ("c2", 5.0, "aten::alpha_beta"),
              ("c3", 3.0, "aten::beta_gamma")])
    b = step([("b0", 4.0, "aten::gamma_alpha"), ("b1", 1.0, "aten::alpha_beta")],
             [("d0", 1.0, "aten::beta_gamma"), ("d1", 5.0, "aten::beta"), ("d2", 1.0, "aten::gamma"),
              ("d3", 2.0, "aten::alpha")])
    for name, s in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(kineto([s] * 2)))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1] + '/reader');"
            "from trace_reader.reading.files import load_trace; from trace_reader.comparison.compare import comparison_data;"
            "d = comparison_data(load_trace(sys.argv[2]), load_trace(sys.argv[3]));"
            "print(json.dumps(sorted((r['old'], r['new']) for r in d['replaced'])))")
    root = str(Path(__file__).resolve().parent.parent)
    outs = {subprocess.run([sys.executable, "-c", code, root, str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                           capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": str(seed)}).stdout
            for seed in range(4)}
    assert len(outs) == 1 and json.loads(outs.pop()), outs
