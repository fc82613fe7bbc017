"""training.py's rules at their edges, found by running every mutant of the file (docs/tests.md): the optimizer
guesses at their thresholds, the phases present and idle, backward/forward FLOPs when a side has no count, the
walks up the call tree, the numbers' formats. The guesses read a stand-in for the step's analysis (written here by
hand), so each threshold is met exactly, on both sides."""
import types
from pathlib import Path

from test_train_step import _load
from trace_reader.render import training_text
from trace_reader.facts import format
from trace_reader.analyzers import training_expect
from trace_reader.analyzers import training
from trace_reader.expectation import NotApplicable


def ev(name, cat="cpu_op", parent=None):
    return types.SimpleNamespace(name=name, cat=cat, parent=parent)


def verdict(monkeypatch, ex, steps, device="cuda"):
    """The guess's check on a trace whose analysis is `steps` (each a dict of "phases" and "optimizer")."""
    monkeypatch.setattr(training_expect, "_analysis", lambda t: {"steps": [{"number": 2, **s} for s in steps]})
    return ex.check(types.SimpleNamespace(device=device, steps=[1]))


def opt(ops=0, foreach=0, fused=0, kernels=None, multi=None):
    return {"optimizer": {"ops": ops, "foreach_ops": foreach, "fused_ops": fused, "other_ops": ops - foreach - fused,
                          "kernels": kernels, "multi_tensor_kernels": multi}}


def test_for_loop_needs_per_param_times_params_ops(monkeypatch):
    """3 ops per parameter, 2 parameters: 6 others confirm it, 5 do not; on a GPU 6 kernels too."""
    ex = training_expect.optimizer_kind("for-loop", 3, 2)
    assert verdict(monkeypatch, ex, [opt(ops=6)], "cpu") is True
    assert verdict(monkeypatch, ex, [opt(ops=5)], "cpu") == "ProfilerStep#2: 5 ops (0 foreach, 0 fused, 5 others)"
    assert verdict(monkeypatch, ex, [opt(ops=6, kernels=6, multi=0)]) is True
    assert verdict(monkeypatch, ex, [opt(ops=6, kernels=5, multi=0)]) == \
        "ProfilerStep#2: 6 ops (0 foreach, 0 fused, 6 others), 5 kernels (0 multi-tensor)"


def test_foreach_needs_one_foreach_op_fewer_others_and_only_multi_tensor_kernels(monkeypatch):
    """3 per parameter, 2 parameters: 1 foreach op and 5 others confirm it; 0 foreach, or 6 others, do not. On a
    GPU: 1 multi-tensor kernel of 1 confirms it, 0 of 0 does not, 1 of 2 does not."""
    ex = training_expect.optimizer_kind("foreach", 3, 2)
    assert verdict(monkeypatch, ex, [opt(ops=6, foreach=1)], "cpu") is True
    assert verdict(monkeypatch, ex, [opt(ops=5, foreach=0)], "cpu") is not True
    assert verdict(monkeypatch, ex, [opt(ops=7, foreach=1)], "cpu") is not True
    assert verdict(monkeypatch, ex, [opt(ops=1, foreach=1, kernels=1, multi=1)]) is True
    assert verdict(monkeypatch, ex, [opt(ops=1, foreach=1, kernels=0, multi=0)]) is not True
    assert verdict(monkeypatch, ex, [opt(ops=1, foreach=1, kernels=2, multi=1)]) is not True


def test_fused_needs_one_fused_op(monkeypatch):
    ex = training_expect.optimizer_kind("fused", 3, 2)
    assert verdict(monkeypatch, ex, [opt(ops=2, fused=1, kernels=1, multi=1)]) is True
    assert verdict(monkeypatch, ex, [opt(ops=3, fused=2, kernels=1, multi=1)]) is not True
    assert verdict(monkeypatch, ex, [opt(ops=2, fused=1, kernels=0, multi=0)]) is not True


def phases(**units):
    return {"phases": {p: {"gpu_us": v, "cpu_us": v} for p, v in units.items()}}


def test_phases_present_names_the_missing_and_the_idle(monkeypatch):
    """A phase needs more than 0 µs of its device's time; 0.5 µs is time. Missing and idle phases are each named."""
    ex = training_expect.phases_present()
    assert verdict(monkeypatch, ex, [phases(forward=0.5, backward=1, optimizer=1)]) is True
    assert verdict(monkeypatch, ex, [phases(forward=0, backward=0)], "cpu") == \
        "ProfilerStep#2: no optimizer phase no CPU time in forward, backward"
    assert verdict(monkeypatch, ex, [phases(forward=1, backward=0, optimizer=0)]) == \
        "ProfilerStep#2: no GPU time in backward, optimizer"


def test_backward_flops_not_applicable_for_each_reason(monkeypatch):
    def flops(f, b):
        return {"phases": {"forward": {"gemm_flops": f}, "backward": {"gemm_flops": b}}}

    ex = training_expect.backward_flops(1.5, 2.5, "")
    for f, b in ((None, 4.0), (2.0, None), (None, None)):
        said = verdict(monkeypatch, ex, [flops(f, b)])
        assert isinstance(said, NotApplicable) and str(said) == "GEMM shapes not recorded (record_shapes=True)"
    said = verdict(monkeypatch, ex, [{"phases": {"backward": {"gemm_flops": 4.0}}}])
    assert str(said) == "GEMM shapes not recorded (record_shapes=True)"
    said = verdict(monkeypatch, ex, [flops(0.0, 4.0)])
    assert isinstance(said, NotApplicable) and str(said) == "forward runs no aten GEMM whose FLOPs the trace records"
    assert verdict(monkeypatch, ex, [flops(2.0, 4.0)]) is True


def test_a_step_without_backward_says_so():
    """No autograd::engine span in the step: the training guesses say why they cannot look."""
    from test_inspect_trace import gpu_trace, parse

    assert training_expect._analysis(parse(gpu_trace())) == "no backward in the active steps (no autograd::engine spans)"


def test_walks_up_the_call_tree():
    """_top_level: no op of the named ones anywhere above (an annotation of that name is no op); _outermost_op: no
    op at all above; _annotation: the first span above the ops, unless it is a phase or a step."""
    addmm = ev("aten::addmm")
    assert training._top_level(ev("aten::mm", parent=addmm), {"aten::addmm"}) is False
    assert training._top_level(ev("aten::mm", parent=ev("x", parent=addmm)), {"aten::addmm"}) is False
    assert training._top_level(ev("aten::mm", parent=ev("aten::addmm", "user_annotation")), {"aten::addmm"}) is True
    assert training._top_level(ev("aten::mm"), {"aten::addmm"}) is True
    assert training._outermost_op(ev("aten::mul", parent=ev("step", "user_annotation", ev("aten::x")))) is False
    assert training._outermost_op(ev("aten::mul", parent=ev("step", "user_annotation"))) is True
    mlp = ev("model.mlp", "user_annotation", ev("forward", "user_annotation"))
    assert training._annotation(ev("aten::mm", parent=ev("aten::linear", parent=mlp))) == "model.mlp"
    assert training._annotation(ev("aten::mm", parent=ev("forward", "user_annotation"))) is None
    assert training._annotation(ev("aten::mm")) is None


def test_windows_hold_both_ends():
    assert [training._inside(t, (10.0, 20.0)) for t in (9.9, 10.0, 20.0, 20.1)] == [False, True, True, False]


def test_formats():
    assert [format.fmt_gflop(x) for x in (None, 1.234e9, 9.99e10, 1e11, 2.5e12)] == ["-", "1.23", "99.9", "100", "2,500"]
    assert [format.fmt_fixed(None), format.fmt_fixed(1234.56), format.fmt_fixed(2, digits=0), format.fmt_fixed(3e6, 1e6)] == [
        "-", "1,234.6", "2", "3.0"]


def test_median_needs_every_value():
    assert training._median([1.0, 3.0]) == 2.0
    assert training._median([1.0, None]) is None and training._median([]) is None


def _hand(tmp_path, cpu=False):
    """training.analyze of test_train_step's hand-made step (on the CPU: without its GPU events)."""
    from test_train_step import _cpu_only

    return training.analyze(_hand_trace(tmp_path, _cpu_only if cpu else None))


def test_a_cpu_step_has_no_gpu_numbers_and_counts_its_gemm_ops(tmp_path):
    """test_train_step's hand-made step without its GPU events: no GPU time or kernels (None, not 0); GEMMs are the
    aten GEMM ops, 1 in forward and 2 in backward."""
    a = _hand(tmp_path, cpu=True)
    assert {p: (f["gpu_us"], f["kernels"], f["gemms"]) for p, f in a["phases"].items()} == {
        "forward": (None, None, 1), "backward": (None, None, 2), "optimizer": (None, None, 0)}
    assert (a["optimizer"]["kernels"], a["optimizer"]["multi_tensor_kernels"]) == (None, None)


def test_the_optimizer_line_per_gradient_and_without_a_class(tmp_path):
    """2 kernels over 2 gradients: 1.0 per gradient; an unnamed optimizer class reads "?"."""
    a = _hand(tmp_path)
    a["optimizer"].update(gradients=2, parameters=None, **{"class": None})
    line = next(x for x in training_text.text(a) if x.startswith("optimizer:"))
    assert line.startswith("optimizer: ?, looks foreach: 2 ops (2 foreach, 0 fused, 0 others), 2 kernels "
                           "(2 multi-tensor, 1.0 per gradient) per step")


def test_an_input_wanting_a_gradient_is_not_a_parameter(tmp_path):
    """3 gradients accumulated, 2 of them parameters' (the optimizer touches their shapes): the kernels go per
    parameter, and the line says both counts; as many parameters as gradients: the line as before."""
    a = _hand(tmp_path)
    a["optimizer"].update(gradients=3, parameters=2)
    line = next(x for x in training_text.text(a) if x.startswith("optimizer:"))
    assert line.endswith("2 kernels (2 multi-tensor, 1.0 per parameter) per step, for 2 parameters (3 gradients "
                         "accumulated in backward)")
    a["optimizer"].update(gradients=2, parameters=2)
    line = next(x for x in training_text.text(a) if x.startswith("optimizer:"))
    assert line.endswith("(2 multi-tensor, 1.0 per gradient) per step, for 2 gradients accumulated in backward")


def test_the_for_loop_traces_optimizer_counts_its_three_weights():
    """07's MLP input wants a gradient too: 4 AccumulateGrad per step, 3 parameters. By hand from the committed
    H200 trace: for-loop AdamW runs one addcdiv_ per parameter, and its kernels per step over those."""
    import gzip
    import json

    import inspect_trace as it

    path = Path(__file__).parent / "data" / "train" / "h200_train_mlp_forloop.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    addcdiv = sum(e.get("name") == "aten::addcdiv_" for e in events) // len(steps)
    grads = sum(e.get("name") == training.ACCUMULATE_GRAD for e in events) // len(steps)
    assert (addcdiv, grads) == (3, 4)
    line = next(x for x in it.report(it.load_trace(path)).splitlines() if x.startswith("optimizer:"))
    kernels = int(line.split(" kernels (")[0].rsplit(" ", 1)[1])
    assert f"{kernels / addcdiv:.1f} per parameter) per step, for 3 parameters (4 gradients" in line


def test_a_phase_without_time_has_no_share_and_the_others_share_their_own_total(tmp_path):
    """forward's GPU time unknown: "-" for it, and backward 85 / (85 + 20) = 81%, optimizer 19%."""
    a = _hand(tmp_path)
    a["phases"]["forward"]["gpu_us"] = None
    table = training_text.text(a)[2].splitlines()
    assert [row.split()[:3] for row in table[2:]] == [["forward", "-", "-"], ["backward", "85.0", "81%"],
                                                       ["optimizer", "20.0", "19%"]]


def test_two_missing_phases_are_both_named(monkeypatch):
    assert verdict(monkeypatch, training_expect.phases_present(), [phases(forward=1)]) == \
        "ProfilerStep#2: no backward, optimizer phase "


def test_no_gradient_no_per_gradient_figure(tmp_path):
    """No AccumulateGrad in backward (0 gradients): the kernels are not divided by anything."""
    a = _hand(tmp_path)
    a["optimizer"]["gradients"] = 0
    line = next(x for x in training_text.text(a) if x.startswith("optimizer:"))
    assert "2 kernels (2 multi-tensor) per step" in line


# ---- the memory peak, on test_train_step's hand-made CPU step (forward 10..200, backward 210..700, optimizer
# 710..990; the allocator's total starts at 1000 B) ------------------------------------------------------------------

def _memory(tmp_path, allocations):
    from test_train_step import cpu_trace_with_allocations

    return _load(tmp_path, cpu_trace_with_allocations(allocations))


def _verdict(t, ex):
    import inspect_trace as it

    return it.check(t, [ex])[0][1:]


def test_an_allocation_at_forwards_last_instant_is_held_when_forward_ends(tmp_path):
    """+100 B at 15, +300 B at 200 (forward's end), +50 B at 250: 400 B held at forward's end, the peak 450 in
    backward."""
    t = _memory(tmp_path, [(15, 100), (200, 300), (250, 50)])
    assert training.memory_peak(t) == [{"number": 2, "phase": "backward", "peak_bytes": 450,
                                        "at_forward_end_bytes": 400}]


def test_nothing_allocated_before_forward_ends_holds_nothing_known(tmp_path):
    """One allocation, in backward: nothing held at forward's end (None, not 0), so the plain guess is broken."""
    t = _memory(tmp_path, [(250, 50)])
    assert training.memory_peak(t) == [{"number": 2, "phase": "backward", "peak_bytes": 50,
                                        "at_forward_end_bytes": None}]
    assert _verdict(t, training_expect.peak_after_forward(False, 0)) == (
        "broken", "#2: peak 0.00 MiB in backward, - MiB held when forward ends")


def test_a_peak_in_forward_per_guess(tmp_path):
    """+100 B at 15 and +300 B at 150: the peak, 400 B, is in forward, all of it held at forward's end. Without
    checkpointing that holds; with it the peak belongs in backward; a module that rebuilds allows forward."""
    t = _memory(tmp_path, [(15, 100), (150, 300)])
    assert training.memory_peak(t)[0]["phase"] == "forward"
    assert _verdict(t, training_expect.peak_after_forward(False, 0))[0] == "confirmed"
    assert _verdict(t, training_expect.peak_after_forward(True, 0))[0] == "broken"
    assert _verdict(t, training_expect.peak_after_forward(False, 0, "the fused MLP"))[0] == "confirmed"


def test_exactly_half_held_is_enough(tmp_path):
    """+100 B at 15, +100 B at 250: the peak 200 B in backward, 100 B of it held at forward's end: exactly half."""
    t = _memory(tmp_path, [(15, 100), (250, 100)])
    assert training.memory_peak(t)[0]["at_forward_end_bytes"] * 2 == training.memory_peak(t)[0]["peak_bytes"] == 200
    assert _verdict(t, training_expect.peak_after_forward(False, 0))[0] == "confirmed"


def test_without_memory_events_the_guess_says_how_to_record_them(tmp_path):
    assert _verdict(_hand_trace(tmp_path), training_expect.peak_after_forward(False, 0)) == (
        "not applicable", "no [memory] events: recorded without profile_memory=True")


def _hand_trace(tmp_path, edit=None):
    """test_train_step's hand-made step, loaded; edit(data) changes it first (in place, or by returning it)."""
    from test_train_step import hand_trace

    data = hand_trace()
    if edit:
        data = edit(data) or data
    return _load(tmp_path, data)


def test_backward_rows_count_calls_per_step():
    """Backward ops grouped by (backward op, forward op, ...): two steps, the pair called twice in each, 10 µs a
    call on the CPU: 2 calls and 20 µs per step, 10 µs per call."""
    fwd = types.SimpleNamespace(name="aten::mm", cat="cpu_op", parent=None, args={"Input Dims": [[8, 16], [16, 32]]})
    bwd = types.SimpleNamespace(name="MmBackward0", dur=10.0, children=())  # no compiler work inside
    rows = training.slowest_backward(types.SimpleNamespace(steps=[1, 2]), [(fwd, bwd)] * 4, gpu=False)
    assert rows == [{"backward_op": "MmBackward0", "forward_op": "aten::mm", "forward_in": None,
                     "forward_shapes": "[8, 16] x [16, 32]", "calls_per_step": 2.0, "us_per_step": 20.0,
                     "us_per_call": 10.0}]


def test_a_step_with_two_optimizers_names_no_class(tmp_path):
    """An SGD step span beside AdamW's in the same step: the class is not one, so None."""
    def add_sgd(data):
        data["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
                   "ts": 985, "dur": 2, "args": {}})

    assert training.analyze(_hand_trace(tmp_path))["optimizer"]["class"] == "AdamW"
    assert training.analyze(_hand_trace(tmp_path, add_sgd))["optimizer"]["class"] is None


def test_an_unknown_implementation_leaves_the_file_names_word(tmp_path):
    """Without its foreach ops the optimizer's implementation is "?": the file name's adamw-foreach tells it."""
    def no_foreach(data):
        data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith("aten::_foreach")]

    t = _hand_trace(tmp_path, no_foreach)
    assert training.analyze(t)["optimizer"]["implementation"] == "?"
    a = types.SimpleNamespace()
    training_expect.train_flags(a, t, ["adamw-foreach", "mlp-eager"])
    assert (a.optimizer, a.optim_impl, a.mlp) == ("adamw", "foreach", "eager")


def two_steps(first_edit=None, allocations=(), steps=2):
    """test_train_step's hand-made CPU step twice: #2 at 0..1000 and #3 at 1000..2000 (its events 1000 µs later),
    the first edited by first_edit(events); allocations (ts, bytes) as cpu_trace_with_allocations makes them.
    steps: how many in all, each 1000 µs after the one before (#4 at 2000..3000, ...)."""
    from test_train_step import _cpu_only, cpu_trace_with_allocations, hand_trace

    data = cpu_trace_with_allocations(allocations)
    if first_edit:
        first_edit(data["traceEvents"])
    for i in range(1, steps):
        for e in _cpu_only(hand_trace())["traceEvents"]:
            e = {**e, "ts": e["ts"] + 1000 * i, "args": dict(e.get("args", {}))}
            if e["name"] == "ProfilerStep#2":
                e["name"] = f"ProfilerStep#{2 + i}"
            if "id" in e:
                e["id"] += 100 * i
            data["traceEvents"].append(e)
    return data


def test_a_step_without_allocations_does_not_hide_the_next_ones_peak(tmp_path):
    """Allocations in step #3 only (+100 B at 1015, +300 B at 1250): #2 has no peak; #3 peaks in backward, 400 B,
    100 of them held at forward's end. The broken message names each step's peak."""
    t = _load(tmp_path, two_steps(allocations=[(1015, 100), (1250, 300)]))
    assert training.memory_peak(t) == [{"number": 3, "phase": "backward", "peak_bytes": 400,
                                        "at_forward_end_bytes": 100}]
    t = _load(tmp_path, two_steps(allocations=[(250, 100), (1015, 100), (1250, 300)]))
    assert _verdict(t, training_expect.peak_after_forward(False, 0)) == (
        "broken", "#2: peak 0.00 MiB in backward, - MiB held when forward ends; "
                  "#3: peak 0.00 MiB in backward, 0.00 MiB held when forward ends")


def test_a_step_missing_a_phase_leaves_that_phase_out_of_the_medians_only(tmp_path):
    """#2 without its backward (no autograd spans, no forward or backward annotation): it has an optimizer phase
    only. Forward and backward are then in one step of two, so no median; the optimizer's is over both (280 µs)."""
    def no_backward(ev):
        ev[:] = [e for e in ev if e["name"] not in ("forward", "backward") and not e["name"].startswith("autograd::")]

    a = training.analyze(_load(tmp_path, two_steps(no_backward)))
    assert [sorted(st["phases"]) for st in a["steps"]] == [["optimizer"], ["backward", "forward", "optimizer"]]
    assert list(a["phases"]) == ["optimizer"] and a["phases"]["optimizer"]["cpu_us"] == 280.0


def test_a_flow_that_starts_where_three_ops_start_links_the_one_autograd_numbered_innermost(tmp_path):
    """aten::linear (Sequence number 4) around aten::mm (5), and an aten::empty of its own (none), all starting at
    the flow's 20 µs: the link goes to the numbered one that is shortest, aten::mm."""
    def crowd(data):
        data["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 20, "dur": 55,
                "args": {"Sequence number": 4}},
               {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 20, "dur": 1, "args": {}}]

    a = training.analyze(_hand_trace(tmp_path, crowd))
    assert [(r["forward_op"], r["backward_op"]) for r in a["slowest_backward"]] == [("aten::mm", "MmBackward0")]


def test_a_flow_on_a_thread_named_by_a_list_or_an_object_is_skipped_not_a_traceback(tmp_path):
    """A fwdbwd flow end whose pid is a list, or whose tid an object, is on no thread an op can be on: that flow
    is skipped (its pair lost) and the rest still link; nothing raises (the ids are dict keys)."""
    def odd(data):
        ends = [e for e in data["traceEvents"] if e.get("cat") == "fwdbwd" and e["id"] == 1]  # aten::mm's pair
        assert [e["ph"] for e in ends] == ["s", "f"]
        data["traceEvents"] += [dict(ends[0], id=77, pid=[1]), dict(ends[1], id=77),
                                dict(ends[0], id=78), dict(ends[1], id=78, tid={"a": 1})]

    a = training.analyze(_hand_trace(tmp_path, odd))
    assert [(r["forward_op"], r["backward_op"]) for r in a["slowest_backward"]] == [("aten::mm", "MmBackward0")]
    assert a["slowest_backward"][0]["calls_per_step"] == 1  # the good flow's pair alone


# ---- the gaps the whole-file mutation run left (tests/mutation_survivors.md, training.py): a scalar's empty
# shape, a forward op without shapes, a gradient of unknown dtype, five peaks in the broken message, a split-K
# GEMM on a GPU, the middle step's optimizer of five, a step of forward and backward alone --------------------------

def _row(lines, first):
    """The cells of the report's table row that starts with `first` (cells are 2 or more spaces apart)."""
    import re

    return [c.strip() for c in re.split(r"\s{2,}", next(ln for ln in lines if ln.startswith(first)))]


def test_a_forward_ops_scalar_input_is_no_shape_in_its_backward_row(tmp_path):
    """aten::mul of an [8, 32] tensor and a 0-d one (torch writes [] for a 0-d tensor and for a Scalar alike: x * s,
    x * 2.0 and add's alpha all record []), its MulBackward0 30 µs on the CPU: the row's forward shapes are
    "[8, 32]" alone, no "[]" after it."""
    from test_train_step import _cpu_only

    def scalar_mul(data):
        data["traceEvents"] += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 100, "dur": 10,
             "args": {"Input Dims": [[8, 32], []], "Input type": ["float", "float"], "Sequence number": 6}},
            {"ph": "X", "cat": "cpu_op", "name": "MulBackward0", "pid": 1, "tid": 2, "ts": 320, "dur": 30,
             "args": {"Sequence number": 6}},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 10, "pid": 1, "tid": 1, "ts": 100},
            {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 10, "pid": 1, "tid": 2, "ts": 320, "bp": "e"}]
        return _cpu_only(data)

    a = training.analyze(_hand_trace(tmp_path, scalar_mul))
    assert [(r["backward_op"], r["forward_shapes"]) for r in a["slowest_backward"]] == [
        ("MmBackward0", "[8, 16] x [16, 32]"), ("MulBackward0", "[8, 32]")]
    assert _row(training_text.text(a)[-1].splitlines(), "MulBackward0") == [
        "MulBackward0", "30.0", "1", "aten::mul", "-", "[8, 32]"]


def test_a_backward_row_without_forward_shapes_reads_a_dash(tmp_path):
    """Recorded without shapes (no Input Dims anywhere): MmBackward0's row, 65 µs on the CPU, has "-" for its
    forward shapes, as for its module."""
    from test_train_step import _cpu_only

    def no_shapes(data):
        for e in data["traceEvents"]:
            e.get("args", {}).pop("Input Dims", None)
        return _cpu_only(data)

    a = training.analyze(_hand_trace(tmp_path, no_shapes))
    assert a["slowest_backward"][0]["forward_shapes"] == ""
    assert _row(training_text.text(a)[-1].splitlines(), "MmBackward0") == [
        "MmBackward0", "65.0", "1", "aten::mm", "-", "-"]


def _complex32_leaf(tmp_path, opt_dims):
    """test_train_step's hand-made step whose leaves are a [16, 32] bf16 one and an [8, 16] one of complex32
    (c10::complex<c10::Half>: torch writes it, DTYPE_BYTES does not size it); the foreach ops take opt_dims."""
    from test_train_step import accumulate

    def leaves(data):
        data["traceEvents"] = [e for e in data["traceEvents"] if e["name"] != training.ACCUMULATE_GRAD]
        for e in data["traceEvents"]:
            if e["name"] == "aten::_foreach_mul_":
                e["args"]["Input Dims"] = [opt_dims, []]
        data["traceEvents"] += accumulate(2, 400, [16, 32]) + accumulate(2, 420, [8, 16], "c10::complex<c10::Half>")

    return _hand_trace(tmp_path, leaves)


def test_a_gradient_of_unknown_dtype_leaves_the_bytes_unknown(tmp_path):
    """Both leaves updated by the optimizer: 2 parameters, their bytes unknown (not a KeyError)."""
    assert training.parameters(_complex32_leaf(tmp_path, [[16, 32], [8, 16]])) == (2, None)


def test_an_input_of_unknown_dtype_the_optimizer_does_not_take_is_no_parameter(tmp_path):
    """The optimizer takes the [16, 32] leaf only: the complex32 one is an input that wants a gradient, left out
    as one of a known dtype is, so 1 parameter of 16 * 32 * 2 bytes (it was 2 of unknown bytes). Taking the
    complex32 one only: 1 parameter, its bytes unknown."""
    assert training.parameters(_complex32_leaf(tmp_path, [[16, 32]])) == (1, 16 * 32 * 2)
    assert training.parameters(_complex32_leaf(tmp_path, [[8, 16]])) == (1, None)


def test_the_broken_memory_message_names_four_peaks_of_five(tmp_path):
    """Five steps, #2 to #6, each allocating 1, 2, 3, 4 and 5 MiB at 250 µs into it (in backward) and nothing before
    forward ends: every step breaks the plain guess, and the message names the first four only."""
    mib = 2**20
    t = _load(tmp_path, two_steps(allocations=[(250 + 1000 * i, (i + 1) * mib) for i in range(5)], steps=5))
    assert [(p["number"], p["phase"], p["peak_bytes"]) for p in training.memory_peak(t)] == [
        (2, "backward", mib), (3, "backward", 2 * mib), (4, "backward", 3 * mib), (5, "backward", 4 * mib),
        (6, "backward", 5 * mib)]
    assert _verdict(t, training_expect.peak_after_forward(False, 0)) == (
        "broken", "#2: peak 1.00 MiB in backward, - MiB held when forward ends; "
                  "#3: peak 2.00 MiB in backward, - MiB held when forward ends; "
                  "#4: peak 3.00 MiB in backward, - MiB held when forward ends; "
                  "#5: peak 4.00 MiB in backward, - MiB held when forward ends")


def test_a_split_k_gemm_on_a_gpu_counts_its_two_kernels(tmp_path):
    """Forward's aten::mm launches its GEMM (30 µs) and then cuBLAS's split-K reduction (5 µs): on a GPU the GEMMs are
    counted by kernel, 2, where the ops count 1. GPU µs 35 of 140: 25%; backward 85 (61%), optimizer 20 (14%)."""
    def split_k(data):
        data["traceEvents"] += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 52, "dur": 2,
             "args": {"correlation": 50}},
            {"ph": "X", "cat": "kernel", "name": "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, "
             "float, true, false, false>", "pid": 0, "tid": 7, "ts": 152, "dur": 5, "args": {"correlation": 50}}]

    lines = training_text.text(training.analyze(_hand_trace(tmp_path, split_k)))[2].splitlines()
    assert [_row(lines, p) for p in ("forward", "backward", "optimizer")] == [
        ["forward", "35.0", "25%", "2", "2", "8.19e-06", "190.0"],
        ["backward", "85.0", "61%", "2", "2", "1.64e-05", "490.0"],
        ["optimizer", "20.0", "14%", "2", "0", "0", "280.0"]]


def test_the_optimizer_implementation_is_the_middle_steps(tmp_path):
    """Five steps whose optimizer runs aten::mul_ and aten::add_ in the first two (#2, #3: a for-loop's ops) and the
    foreach ops in the last three: the implementation is the middle step's (#4), foreach, as the medians say
    (foreach ops 0, 0, 2, 2, 2: 2; others 2, 2, 0, 0, 0: 0)."""
    data = two_steps(steps=5)
    for e in data["traceEvents"]:
        if e["name"].startswith("aten::_foreach_") and e["ts"] < 2000:  # in #2 and #3
            e["name"] = e["name"].replace("_foreach_", "")
    a = training.analyze(_load(tmp_path, data))
    assert [training.implementation(s["optimizer"]) for s in a["steps"]] == ["for-loop"] * 2 + ["foreach"] * 3
    assert a["optimizer"]["implementation"] == "foreach"
    assert next(ln for ln in training_text.text(a) if ln.startswith("optimizer:")) == (
        "optimizer: AdamW, looks foreach: 2 ops (2 foreach, 0 fused, 0 others) per step, for 1 gradients accumulated "
        "in backward")


def test_a_step_of_forward_and_backward_alone_has_its_flops_ratio(tmp_path):
    """No optimizer (its annotation and torch.optim's step span gone): the step has exactly forward and backward,
    and backward's GEMMs still do 2 x 8192 / 8192 = 2.00x forward's FLOPs; no optimizer line."""
    def no_optimizer(data):
        data["traceEvents"] = [e for e in data["traceEvents"]
                               if e["name"] not in ("optimizer", "Optimizer.step#AdamW.step")]

    a = training.analyze(_hand_trace(tmp_path, no_optimizer))
    assert [sorted(s["phases"]) for s in a["steps"]] == [["backward", "forward"]] and a["optimizer"] is None
    assert a["backward_over_forward_flops"] == 2.0
    lines = training_text.text(a)
    assert lines[3].startswith("=> backward's GEMMs do 2.00x forward's FLOPs (about 2x")
    assert not any(ln.startswith("optimizer:") for ln in lines)


def test_a_traces_analysis_is_worked_out_once_and_each_caller_gets_its_own_copy():
    """One --expect 07_train_step report reads the analysis in the report, in the flags it reads from the trace and in
    each guess: the walk over the steps runs once per trace, and what one caller changes in its copy, the next
    caller does not see. A trace read again (a new object) is walked again."""
    import inspect_trace as it
    path = Path(__file__).parent / "data/train/h200_train_mlp_foreach.json.gz"
    walks = []
    inner = training.phases_summary.__wrapped__  # the walk itself, counted below
    once = training._once_per_trace(lambda t: walks.append(t) or inner(t))
    trace = it.load_trace(path)
    first = once(trace)
    first["steps"].clear()
    first["phases"]["forward"]["cpu_us"] = -1.0
    second = once(trace)
    assert len(walks) == 1
    fresh = inner(it.load_trace(path))
    assert second == fresh and second["steps"] and second["phases"]["forward"]["cpu_us"] > 0
    assert once(it.load_trace(path)) == fresh and len(walks) == 2
    # the module's own analyses are memoized the same way: the same answer twice, never the same object
    a, b = training.analyze(trace), training.analyze(trace)
    assert a == b and a is not b and a["steps"] is not b["steps"]


def test_each_function_kept_per_trace_keeps_its_own_answer():
    """once_per_trace keeps one answer per function beside the trace's fields: the step's phases, its analysis (which
    asks for the phases first) and its allocations, asked of one trace, are each their own."""
    import inspect_trace as it
    from trace_reader.analyzers import memory
    from trace_reader.reading.events import once_per_trace

    trace = it.load_trace(Path(__file__).parent / "data/train/h200_train_mlp_foreach.json.gz")
    summary = training.phases_summary(trace)
    analysis = training.analyze(trace)
    allocs = memory.read_allocs(trace)
    assert "links_per_step" in analysis and "links_per_step" not in summary
    assert {k: v for k, v in analysis.items() if k in summary} == summary
    assert allocs and all(isinstance(a, memory.Alloc) for a in allocs) and memory.read_allocs(trace) is allocs
    one, two = once_per_trace(lambda t: "one"), once_per_trace(lambda t: "two")
    assert (one(trace), two(trace), one(trace)) == ("one", "two", "one")
