"""report.py's rules at their edges, found by running every mutant of the file (docs/tests.md): the header's
device line for each kind of deviceProperties, the step list's elisions, the annotations counted for a kernel the
autograd engine launched, the CPU's work when the first step differs, a step with no GPU work. Each expected value
is written by hand from the hand-built trace in the test."""
from trace_reader.facts import format
from trace_reader.analyzers import annotations
import inspect_trace as it
from test_inspect_trace import parse
from test_mutation_edges import block, steps_of
from test_reader_report import x
from trace_reader.analyzers import report as rp


# ---- the header ---------------------------------------------------------------------------------------------------

def _device_line(props):
    data = steps_of([(2, ["a"])])
    if props is None:
        del data["deviceProperties"]
    else:
        data["deviceProperties"] = [props]
    return it.report(parse(data)).splitlines()[1]


def test_device_line_for_each_kind_of_device_properties():
    """sm_ takes the minor only when it is an int; memory is listed for 0 < bytes < 2^60 (1 B reads "0 GiB"; 2^60 B,
    a corrupt field, is left out, as 0 is); a GPU without a usable name, or without deviceProperties, says so."""
    h200 = {"name": "NVIDIA H200"}
    assert _device_line({**h200, "computeMajor": 9, "computeMinor": "0"}) == "device  NVIDIA H200 (sm_9)"
    assert _device_line({**h200, "totalGlobalMem": 0}) == "device  NVIDIA H200"
    assert _device_line({**h200, "totalGlobalMem": 1}) == "device  NVIDIA H200 (0 GiB)"
    assert _device_line({**h200, "totalGlobalMem": 2**60}) == "device  NVIDIA H200"
    assert _device_line({**h200, "totalGlobalMem": float(2**60)}) == "device  NVIDIA H200"
    assert _device_line({**h200, "totalGlobalMem": 2**60 - 2**40}) == "device  NVIDIA H200 (1073740800 GiB)"
    assert _device_line({"numSms": 132}) == "device  ? (no usable name) (132 SMs)"
    assert _device_line(None) == "device  a GPU (no deviceProperties in the trace)"


def test_a_trace_without_steps_and_one_with_skipped_events_say_so_word_for_word():
    """A trace of nothing has no step at all (the CLI refuses it before the report; the library reports it).
    MAX_US is 1e11 µs: 27.8 hours, printed as 27."""
    no_steps = {"traceEvents": [x("aten::add", "cpu_op", 0, 5)]}
    assert it.report(parse(no_steps)).splitlines()[2] == (
        "steps   none (no ProfilerStep#N spans): the whole trace is read as one step; record with schedule(...) "
        "and prof.step() for per-step numbers")
    assert it.report(parse({"traceEvents": []})).splitlines()[2:] == [
        "steps   0 active ProfilerStep ()", "no active ProfilerStep#N spans: nothing to report per step"]
    data = steps_of([(2, ["a"])])
    data["traceEvents"].append(x("aten::bad", "cpu_op", 5, -1))
    assert it.report(parse(data)).splitlines()[3] == (
        "skipped 1 events with unusable times (missing, NaN, negative or beyond 27 hours): not counted anywhere below")


# ---- the step list ----------------------------------------------------------------------------------------------------

def test_step_numbers_run_on_from_five_and_are_elided_from_nine():
    """Consecutive numbers read #a..#b from 5 steps (4 are listed); others are listed up to 8, then the first and
    last 3."""
    def line(numbers):
        return it.report(parse(steps_of([(n, ["a"]) for n in numbers]))).splitlines()[2]

    assert line([2, 3, 4, 5]) == "steps   4 active ProfilerStep (#2, #3, #4, #5)"
    assert line([2, 3, 4, 5, 6]) == "steps   5 active ProfilerStep (#2..#6)"
    assert line([2, 4, 6, 8, 10, 12, 14, 16]) == "steps   8 active ProfilerStep (#2, #4, #6, #8, #10, #12, #14, #16)"


def test_a_step_without_gpu_work_has_no_busy_fraction_and_no_verdict():
    """Step #2 runs kernel a 15..30 in its 90 µs (busy 15/90 = 17%, host 70/90 = 78%); #3 launches nothing."""
    text = it.report(parse(steps_of([(2, ["a"]), (3, [])])))
    assert block(text, "step ")[2:4] == [
        "#2          1      15.0      90.0  90.0    17%    78%  overhead         5.0      5.0",
        "#3          0       0.0      90.0  90.0      -      -  -                  -        -",
    ]
    assert "   GPU idle per step (median): 70.0 µs waiting on the host (work not yet launched), 5.0 µs after the launch " \
        "(launch latency, earlier work)" in text.splitlines()
    assert [st["idle_us"] for st in it.report_data(parse(steps_of([(2, ["a"]), (3, [])])))["steps"]] == [
        {"waiting_on_host": 70.0, "after_launch": 5.0}, None]
    assert format.fmt_pct(None) == "-"


# ---- the annotations of a kernel the autograd engine launched -----------------------------------------------------

def _engine_trace(steps: bool) -> dict:
    """The step's thread 1 waits in `backward` 100..190; the engine (thread 2) runs MmBackward0 110..150, whose
    aten::mm (115) launches a 20 µs kernel at 120. Open on thread 1 at 120 besides `backward`: `opens_at` (120..130)
    and `closes_at` (110..120), both at the instant's edge; `closed` (100..119) is not. Thread 3's `other`
    (100..190) is open too. With steps=False the trace has no ProfilerStep span (read as one whole step)."""
    ev = [x("backward", "user_annotation", 100, 90), x("opens_at", "user_annotation", 120, 10),
          x("closes_at", "user_annotation", 110, 10), x("closed", "user_annotation", 100, 19),
          x("other", "user_annotation", 100, 90, tid=3),
          x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 110, 40, tid=2),
          x("aten::mm", "cpu_op", 115, 6, tid=2, **{"External id": 1}),
          x("cudaLaunchKernel", "cuda_runtime", 120, 1, tid=2, **{"External id": 1, "correlation": 1}),
          x("k_mm", "kernel", 125, 20, pid=0, tid=7, correlation=1)]
    if steps:
        ev.insert(0, x("ProfilerStep#2", "user_annotation", 0, 200))
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_an_engine_kernel_counts_the_annotations_open_on_the_steps_thread_at_its_launch():
    got = rp.gpu_time_by_annotation(parse(_engine_trace(steps=True)))
    assert {k: v for k, v in got.items() if any(v)} == {"backward": [20.0], "opens_at": [20.0], "closes_at": [20.0]}


def test_without_a_step_span_an_engine_kernel_counts_every_other_threads_open_annotations():
    got = rp.gpu_time_by_annotation(parse(_engine_trace(steps=False)))
    assert {k: v for k, v in got.items() if any(v)} == {"backward": [20.0], "opens_at": [20.0], "closes_at": [20.0],
                                                        "other": [20.0]}


def _nested(rng, lo, hi, depth, tid, out):
    """Random annotations nested in [lo, hi] on one thread: siblings apart or touching, children inside."""
    t = lo
    while depth and t < hi and rng.random() < 0.8:
        a = rng.choice([t, t + rng.randint(0, 3)])  # touching the last sibling, or after a gap
        b = min(hi, a + rng.randint(0, 12))
        if a > hi:
            break
        out.append(x(f"a{len(out)}", "user_annotation", a, b - a, tid=tid))
        _nested(rng, a, b, depth - 1, tid, out)
        t = b


def _engine_names(ann, launches, steps=True):
    """{kernel j: its annotations} for engine kernels launched at `launches` beside the annotations `ann`."""
    ev = [x("backward", "user_annotation", -5, 5000), *ann]
    for j, t in enumerate(launches):
        ev += [x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", t - 0.5, 1, tid=2),
               x("cudaLaunchKernel", "cuda_runtime", t, 0.1, tid=2, **{"External id": 9, "correlation": j + 1}),
               x(f"k{j}", "kernel", 10_000 + j, 1, pid=0, tid=7, correlation=j + 1)]
    if steps:
        ev.insert(0, x("ProfilerStep#2", "user_annotation", -10, 20_000))
    [st] = parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}).steps
    cache = {}  # one per trace, as the report keeps it
    return {int(k.name[1:]): set(annotations.annotations_around(k, st, cache)) for k in st.gpu}


def test_an_engine_kernels_open_annotations_are_those_a_scan_of_every_span_finds_on_random_steps():
    """Random nests of annotations (siblings touching, children sharing starts and ends, zero lengths) on the step's
    thread and on thread 3, engine kernels launched at random instants: each kernel's annotations are, besides
    `backward`, every annotation of the step's thread that holds the launch, edges included, found here by a scan
    of all of them (or of every thread but the engine's without a step span)."""
    import random

    rng = random.Random(11)
    for case in range(200):
        steps = case % 2 == 0
        ann = []
        _nested(rng, 0, 60, 4, 1, ann)
        _nested(rng, 0, 60, 3, 3, ann)
        launches = [rng.randint(0, 60) for _ in range(6)]
        got = _engine_names(ann, launches, steps)
        for j, t in enumerate(launches):
            want = {"backward"} | {e["name"] for e in ann if e["ts"] <= t <= e["ts"] + e["dur"]
                                   and (e["tid"] == 1 or not steps)}
            assert got[j] == want, (case, j, t)


def test_annotations_that_overlap_without_nesting_are_each_open_where_they_hold_the_launch():
    """record_function spans entered and left out of order (A 100..130, B 110..150) and a parent that ends 1 ns
    before its child does: at 120 each one open counts, as a scan of every span says; 1,100 spans of no length at
    5 inside P (1..501) leave P open at 20 (they hold nothing after their instant); random overlapping spans on
    the step's thread, against a scan."""
    import random

    assert _engine_names([x("A", "user_annotation", 100, 30), x("B", "user_annotation", 110, 40)], [120]) == {
        0: {"backward", "A", "B"}}
    assert _engine_names([x("outer", "user_annotation", 100, 50), x("inner", "user_annotation", 110, 40.001)],
                         [120]) == {0: {"backward", "outer", "inner"}}
    zeros = [x("P", "user_annotation", 1, 500)] + [x(f"z{i}", "user_annotation", 5, 0) for i in range(1100)]
    assert _engine_names(zeros, [20]) == {0: {"backward", "P"}}
    rng = random.Random(5)
    for case in range(150):
        ann = [x(f"a{i}", "user_annotation", a := rng.randint(0, 60), rng.choice([0, 1, 5, 20, 40]), tid=rng.choice([1, 1, 3]))
               for i in range(rng.randint(1, 12))]
        launches = [rng.randint(0, 70) for _ in range(5)]
        got = _engine_names(ann, launches)
        for j, t in enumerate(launches):
            want = {"backward"} | {e["name"] for e in ann if e["tid"] == 1 and e["ts"] <= t <= e["ts"] + e["dur"]}
            assert got[j] == want, (case, t, ann)


def test_the_step_thread_alone_is_looked_at_however_many_threads_hold_annotations():
    """3,000 other threads with an annotation each, 3,000 engine kernels: each kernel's names are the step thread's
    (only `backward`), found without a pass over the other threads' lanes (a pass each took 16 s at 10,000)."""
    ann = [x(f"t{i}", "user_annotation", 0, 100, tid=100 + i) for i in range(3000)]
    got = _engine_names(ann, list(range(10, 3010)))
    assert len(got) == 3000 and all(names == {"backward"} for names in got.values())


def test_a_thousand_nested_annotations_over_two_thousand_kernels_each_get_every_kernels_time():
    """1,000 annotations nested in one another around one op that launches 2,000 kernels of 2 µs: each annotation
    holds 4,000 µs of GPU time (the walk up from the op is made once, and the kernels are summed before they are
    added to each annotation's row: 2,000 x 1,000 additions took seconds)."""
    n, kernels = 1000, 2000
    ev = [x("ProfilerStep#1", "user_annotation", 0, 10 * n + 10 * kernels + 100)]
    ev += [x(f"m{i}", "user_annotation", i + 1, 10 * n + 10 * kernels + 50 - 2 * (i + 1)) for i in range(n)]
    ev.append(x("aten::mul", "cpu_op", n + 5, 10 * kernels, **{"External id": 3}))
    for j in range(kernels):
        ev += [x("cudaLaunchKernel", "cuda_runtime", n + 6 + 10 * j, 1, **{"External id": 3, "correlation": j + 1}),
               x("k", "kernel", n + 8 + 10 * j, 2, pid=0, tid=7, correlation=j + 1)]
    got = rp.gpu_time_by_annotation(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    assert got == {f"m{i}": [2.0 * kernels] for i in range(n)}


# ---- the CPU's work ---------------------------------------------------------------------------------------------------

def test_cpu_work_is_timed_over_the_typical_steps_when_the_first_one_differs():
    """Step #2 runs mm, add, relu; #3 and #4 (the typical order) mm on the loop's thread 1 (11 and 12 µs), then relu
    on another thread, named "worker" in #3 (12 µs) and 5 in #4 (13 µs): both ids are listed, sorted as text."""
    ev = []
    for i, ops in enumerate([["aten::mm", "aten::add", "aten::relu"], ["aten::mm", "aten::relu"],
                             ["aten::mm", "aten::relu"]]):
        ev.append(x(f"ProfilerStep#{i + 2}", "user_annotation", 100 * i, 90))
        for j, op in enumerate(ops):
            ev.append(x(op, "cpu_op", 100 * i + 10 + 20 * j, 10 + j + i, tid=1 if j == 0 else ("worker", 5)[i == 2]))
    assert block(it.report(parse({"traceEvents": ev})), "Work in order")[1:6] == [
        "#  thread    kernel      mean µs    min–max",
        "-  --------  ----------  -------  ---------",
        "1  main 1    aten::mm       11.5  11.0–12.0",
        "2  5/worker  aten::relu     12.5  12.0–13.0",
        "steps differ: 2 steps with 2 units of work (#3, #4); 1 step with 3 units of work (#2)",
    ]


# ---- long names, cut or whole ---------------------------------------------------------------------------------------

KERNEL = "triton_per_fused_add_mean_mul_pow_rsqrt_silu_view_transpose_clone_and_then_some_0"  # 82 characters
CPP = "cpp_fused_add_mean_mul_pow_rsqrt_silu_view_transpose_clone_and_then_some_more_0"  # 80
OP = "aten::_a_very_long_custom_operator_name_from_an_extension_module_x"  # 66
CPU_OP = OP + "_that_computes_on_the_cpu"  # 91
ANNOTATION = "model.layers.0.mlp.forward_with_a_long_hook_name_x"  # 50


def _long_names(gpu: bool) -> dict:
    """One 100 µs step: ANNOTATION 1..61 holds OP 5..25, which launches KERNEL (20 µs) on a GPU; on a CPU it holds
    CPU_OP 5..25, which runs the Inductor C++ kernel CPP (10..20)."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x(ANNOTATION, "user_annotation", 1, 60),
          x(OP if gpu else CPU_OP, "cpu_op", 5, 20, **{"External id": 1})]
    if gpu:
        ev += [x("cudaLaunchKernel", "cuda_runtime", 6, 2, **{"External id": 1, "correlation": 1}),
               x(KERNEL, "kernel", 10, 20, pid=0, tid=7, correlation=1)]
        return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}
    return {"traceEvents": ev + [x(CPP, "cpu_op", 10, 10)]}


def test_names_are_cut_to_their_columns_and_given_whole_with_full_names():
    """Kernels fit 72 characters, the GPU report's CPU self-time table 60, annotations 48: a cut name keeps
    width - 1 characters and an ellipsis. full_names=True prints each whole. (The "launched by" column is never
    cut.) Each table is the block of lines under its header."""
    for gpu, tables in ((True, [("#  kernel", KERNEL, 72), ("name ", OP, 60), ("annotation", ANNOTATION, 48)]),
                        (False, [("op ", CPP, 72), ("op ", CPU_OP, 72), ("#  kernel", CPU_OP, 72),
                                 ("annotation", ANNOTATION, 48)])):
        cut, whole = it.report(parse(_long_names(gpu))), it.report(parse(_long_names(gpu)), full_names=True)
        for header, name, width in tables:
            assert any(line.startswith((name[:width - 1] + "…  ", f"1  {name[:width - 1]}…  "))
                       for line in block(cut, header)), (gpu, header)
            assert any(name + "  " in line for line in block(whole, header)), (gpu, header)


# ---- many steps -------------------------------------------------------------------------------------------------------

def _step_table(text: str) -> list[str]:
    """The step table's rows, its quantile rows included (they follow a blank row), without its note."""
    lines, out = text.splitlines(), []
    start = next(i for i, line in enumerate(lines) if line.startswith("step "))
    for i in range(start, len(lines)):
        if lines[i].startswith(("(", "=>")) or not lines[i] and not lines[i + 1].startswith("min"):
            break
        out += [lines[i]] if lines[i] else []
    return out


def _cpu_steps(n: int) -> dict:
    """n CPU steps #2.. at 0, 100, ... µs (90 µs each), step i running aten::mm for 20 + i µs."""
    ev = []
    for i in range(n):
        ev += [x(f"ProfilerStep#{i + 2}", "user_annotation", 100 * i, 90 - i), x("aten::mm", "cpu_op", 100 * i + 5, 20 + i)]
    return {"traceEvents": ev}


def test_eight_steps_are_listed_whole_and_all_steps_lists_nine():
    """STEP_ROWS is 8: 8 steps get a row each and no note; 9 get the first and last 3, the quantiles and a note,
    unless all_steps. CPU span of step i: 90 - i µs."""
    for gpu in (True, False):
        def rows(n, **kw):
            data = steps_of([(i + 2, ["a"]) for i in range(n)]) if gpu else _cpu_steps(n)
            text = it.report(parse(data), **kw)
            lines = _step_table(text)
            return [line.split()[0] for line in lines[2:] if line.startswith(("#", "...", "min", "median", "p90", "max"))], \
                [line for line in text.splitlines() if line.startswith("(9 steps") or line.startswith("(8 steps")]

        assert rows(8) == ([f"#{i}" for i in range(2, 10)], []), gpu
        assert rows(9, all_steps=True) == ([f"#{i}" for i in range(2, 11)], []), gpu
        listed, note = rows(9)
        assert listed == ["#2", "#3", "#4", "...", "#8", "#9", "#10", "min", "median", "p90", "max"], gpu
        assert note == ["(9 steps: the first and last 3, then each column's quantiles; --all-steps lists all)"
                        if gpu else "(9 steps: the first and last 3, then the quantiles; --all-steps lists all)"], gpu


def test_a_cpu_trace_of_nine_steps_gives_the_quantiles_of_its_cpu_span():
    """Spans 90, 89, ..., 82 µs: nearest rank of 9 sorted values at 0, 4, 7 (round(7.2)) and 8: 82, 86, 89, 90."""
    lines = _step_table(it.report(parse(_cpu_steps(9))))
    assert lines[0].split() == ["step", "CPU", "span", "µs"]
    assert [line.split() for line in lines[-4:]] == [["min", "82.0"], ["median", "86.0"], ["p90", "89.0"],
                                                      ["max", "90.0"]]


# ---- time per annotation ------------------------------------------------------------------------------------------

def _annotated(extra_idle: int = 0) -> dict:
    """Two steps (#2 at 0, #3 at 200, 200 µs each) on thread 1. In each: `vary` (30 µs) launches a kernel of 10 µs
    in #2 and 20 in #3; `tiny` (40) one of 0.5 µs; `quarter` (0.5) one of 4; `idle_a` .. `idle_d` (30, 20, 10, 5)
    launch nothing; thread 3's `pre`, open from before the first step (-10..20), launches an 8 µs kernel in #2 only,
    so it has GPU time and no CPU time in a step. extra_idle adds that many more annotations of 1 µs."""
    ev, ext = [], 0

    def launch(op_ts, kernel_ts, dur, tid=1):
        nonlocal ext
        ext += 1
        return [x(f"aten::op{ext}", "cpu_op", op_ts, 0.3, tid=tid, **{"External id": ext}),
                x("cudaLaunchKernel", "cuda_runtime", op_ts + 0.1, 0.1, tid=tid,
                  **{"External id": ext, "correlation": ext}),
                x(f"k{ext}", "kernel", kernel_ts, dur, pid=0, tid=7, correlation=ext)]

    ev += [x("pre", "user_annotation", -10, 30, tid=3)] + launch(5, 150, 8, tid=3)
    for i in range(2):
        b = 200 * i
        ev += [x(f"ProfilerStep#{i + 2}", "user_annotation", b, 200), x("vary", "user_annotation", b + 10, 30)]
        ev += launch(b + 12, b + 20, 10 * (i + 1))
        ev += [x("tiny", "user_annotation", b + 50, 40)] + launch(b + 52, b + 60, 0.5)
        ev += [x("quarter", "user_annotation", b + 100, 0.5)] + launch(b + 100.1, b + 105, 4)
        for name, at, dur in (("idle_a", 110, 30), ("idle_b", 141, 20), ("idle_c", 162, 10), ("idle_d", 175, 5)):
            ev.append(x(name, "user_annotation", b + at, dur))
        ev += [x(f"idle_{j}", "user_annotation", b + 181 + j, 1) for j in range(extra_idle)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_annotations_sort_by_gpu_then_cpu_time_with_each_ones_gpu_range():
    """GPU medians: vary 15 (10..20), quarter 4 and pre 4 ([8, 0]), tiny 0.5, the idle ones 0. Ties go to the larger
    CPU time: quarter (0.5) before pre (none in a step, 0), idle_a .. idle_d by 30, 20, 10, 5. Eight annotations:
    all listed, no "more" line."""
    assert block(it.report(parse(_annotated())), "annotation") == [
        "annotation  GPU median  GPU min–max  CPU median",
        "----------  ----------  -----------  ----------",
        "vary              15.0    10.0–20.0        30.0",
        "quarter            4.0      4.0–4.0         0.5",
        "pre                4.0      0.0–8.0         0.0",
        "tiny               0.5      0.5–0.5        40.0",
        "idle_a             0.0      0.0–0.0        30.0",
        "idle_b             0.0      0.0–0.0        20.0",
        "idle_c             0.0      0.0–0.0        10.0",
        "idle_d             0.0      0.0–0.0         5.0",
    ]


def test_past_eight_annotations_the_rest_are_counted_for_json():
    """Ten annotations (two more idle ones of 1 µs, after idle_d): the first eight listed, then "(2 more ...)"."""
    lines = block(it.report(parse(_annotated(extra_idle=2))), "annotation")
    assert [line.split()[0] for line in lines[2:]] == ["vary", "quarter", "pre", "tiny", "idle_a", "idle_b", "idle_c",
                                                      "idle_d", "(2"]
    assert lines[-1] == "(2 more in --json)"


# ---- launches, compiled regions, the CPU's tables -------------------------------------------------------------------

def test_occupancy_table_lists_each_launch_call_and_says_when_nothing_was_launched():
    """Two pointwise kernels, one launched through the runtime, one through the driver (as Triton does); then a trace
    whose GPU work has no launch call at all."""
    from test_mutation_edges import unlaunched_step

    ev = [x("ProfilerStep#2", "user_annotation", 0, 100)]
    for ext, call in ((1, "cudaLaunchKernel"), (2, "cuLaunchKernelEx")):
        ev += [x(f"aten::op{ext}", "cpu_op", 10 * ext, 5, **{"External id": ext}),
               x(call, "cuda_runtime" if ext == 1 else "cuda_driver", 10 * ext + 1, 2,
                 **{"External id": ext, "correlation": ext}),
               x(f"k{ext}", "kernel", 40 + 10 * ext, 5, pid=0, tid=7, correlation=ext)]
    text = it.report(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    assert block(text, "kernels  ") == ["kernels          with query  launch call",
                                        "---------------  ----------  ----------------------------------",
                                        "pointwise/other  0/2         cuLaunchKernelEx, cudaLaunchKernel"]
    assert it.report(parse(unlaunched_step())).splitlines()[-1] == "no linked launches"


def _compiled_cpu(child: str) -> dict:
    """Two CPU steps, each a Torch-Compiled Region 0/0 (5..45) that runs `child` (10..15) and aten::addmm (20..30)."""
    ev = []
    for i in range(2):
        b = 100 * i
        ev += [x(f"ProfilerStep#{i + 2}", "user_annotation", b, 90), x("Torch-Compiled Region: 0/0", "cpu_op", b + 5, 40),
               x(child, "cpu_op", b + 10, 5), x("aten::addmm", "cpu_op", b + 20, 10)]
    return {"traceEvents": ev}


def test_a_compiled_cpu_run_names_its_kernels_or_the_aten_ops_it_calls_and_its_frames():
    text = it.report(parse(_compiled_cpu("cpp_fused_mul_0")))
    assert "\nInductor C++ kernels: cpp_fused_mul_0\n" in text
    assert text.endswith("\n\nCompiled regions (Torch-Compiled Region: frame/version): 1 compiled frame, 0/0 in every "
                         "step: no graph break, no recompile")
    text = it.report(parse(_compiled_cpu("aten::mm")))
    assert ("\nInductor C++ kernels: none: compiled, and Inductor generated no C++ kernel for this graph: it calls "
            "aten::mm, aten::addmm instead (cpp.enable_kernel_profile on, as the suite's scripts set it, would show "
            "any)\n") in text


def test_a_cpu_step_of_views_has_no_work_in_order():
    ev = [x("ProfilerStep#2", "user_annotation", 0, 90), x("aten::view", "cpu_op", 5, 4), x("aten::empty", "cpu_op", 15, 3)]
    assert "\n\nWork in order: none (no computing aten op or C++ kernel in the active steps)\nInductor C++ kernels: " \
           "none: an eager run (no Torch-Compiled Region in the trace)\n" in it.report(parse({"traceEvents": ev}))


def test_the_cpu_ops_table_shows_the_top_twenty_of_twenty_one():
    """21 ops of 21, 22, ..., 41 µs in one step: the table lists 41 down to 22 (20 rows); shares of 651 µs."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 2000)]
    ev += [x(f"aten::op{i:02d}", "cpu_op", 10 + 50 * i, 21 + i) for i in range(21)]
    lines = block(it.report(parse({"traceEvents": ev})), "op ")
    assert lines[0].startswith("op ") and len(lines) == 22
    assert lines[2].split() == ["aten::op20", "1", "41.0", "6.3%"] and lines[-1].split() == ["aten::op01", "1", "22.0",
                                                                                            "3.4%"]
    assert block(it.report(parse({"traceEvents": ev})), "CPU ops")[0].endswith("(mean over 1 steps; top 20 of 21):")


def test_a_group_of_four_steps_is_listed_whole():
    """Steps #2..#5 launch a then b, #6 b then a: the groups name up to four steps each, then "..."."""
    text = it.report(parse(steps_of([(n, ["a", "b"]) for n in (2, 3, 4, 5)] + [(6, ["b", "a"])])))
    assert "\nsteps differ: 4 steps with 2 kernels (#2, #3, #4, #5); 1 step with 2 kernels in another order (#6)\n" \
        in text


def test_the_kernel_tables_number_columns_align_right():
    """Kernel a launched at 10 starts at 15 (lag 5.0); kernel b launched at 12 starts at 30 (lag 18.0), after a."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100)]
    for ext, (op_ts, start) in enumerate([(9, 15), (11, 30)], 1):
        ev += [x(f"aten::{'ab'[ext - 1]}", "cpu_op", op_ts, 4, **{"External id": ext}),
               x("cudaLaunchKernel", "cuda_runtime", op_ts + 1, 1, **{"External id": ext, "correlation": ext}),
               x(f"kernel_{'ab'[ext - 1]}", "kernel", start, 10, pid=0, tid=7, correlation=ext)]
    assert block(it.report(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]})), "#  kernel")[:4] == [
        "#  kernel    launched by  calls/step  mean µs  min–max   lag  GPU share  achieved  of peak",
        "-  --------  -----------  ----------  -------  -------  ----  ---------  --------  -------",
        "1  kernel_a  aten::a               1     10.0        -   5.0      50.0%         -  -",
        "2  kernel_b  aten::b               1     10.0        -  18.0      50.0%         -  -",
    ]


# ---- the facts behind the text (report_data, what --json writes) -------------------------------------------------

def test_report_data_keys_and_a_gpu_traces_cpu_work():
    """The keys report_data's docstring promises, and no CPU work on a GPU trace (0 steps of it)."""
    d = it.report_data(parse(steps_of([(2, ["a"])])))
    assert set(d) == {"schema_version", "trace", "whole_trace", "device", "device_name", "versions", "skipped_events",
                      "shapes_recorded", "peak", "steps", "typical_step", "kernels", "same_order", "step_orders",
                      "cpu_work", "cpu_work_steps", "cpu_ops", "annotations", "annotations_cpu", "compiled", "views",
                      "occupancy", "memory_peak_bytes", "training"}
    assert (d["trace"], d["whole_trace"], d["skipped_events"], d["cpu_work"], d["cpu_work_steps"]) == (
        "<test>", False, 0, [], 0)


def test_version_fields_are_cut_to_forty_characters_and_eight_fields():
    """Fields named *version* (any case), torch and triton; names and text values cut to 40 characters; the first
    8 in the file's order; booleans and lists are not versions."""
    data = steps_of([(2, ["a"])])
    long_name, long_value = "x" * 45 + "_version", "2.11.0+" + "y" * 50
    data.update({long_name: long_value, "triton": "3.6.0", "Torch": 2.11, "flag_version": True,
                 "list_version": [1], **{f"v{i}_Version": i for i in range(8)}})
    assert it.report_data(parse(data))["versions"] == {
        "x" * 40: long_value[:40], "triton": "3.6.0", "Torch": 2.11, "v0_Version": 0, "v1_Version": 1,
        "v2_Version": 2, "v3_Version": 3, "v4_Version": 4}


def _inductor_gemm(kernel_flop, dur: float) -> dict:
    """One step: an Inductor GEMM template launch (bf16) carrying kernel_flop, its kernel `dur` µs long."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100),
          x("triton_tem_fused_mm_0", "cpu_op", 9, 5, **{"External id": 1, "kernel_flop": kernel_flop,
                                                         "Input type": ["c10::BFloat16"]}),
          x("cuLaunchKernelEx", "cuda_driver", 10, 2, **{"External id": 1, "correlation": 1}),
          x("triton_tem_fused_mm_0", "kernel", 15, dur, pid=0, tid=7, correlation=1)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_an_inductor_gemm_is_rated_by_its_own_flop_count_within_bounds():
    """rate = kernel_flop / µs / 1e6 TFLOP/s: 2e6 in 1 µs is 2 TFLOP/s of the H200's 989.5 (bf16); 1 FLOP in
    1 µs is 1e-6. A count of 0 or of 1e18 and more is not believed; a kernel of 0 µs has no rate."""
    def rated(kernel_flop, dur=1.0):
        k = it.report_data(parse(_inductor_gemm(kernel_flop, dur)))["kernels"][0]
        return k["rate"], k["unit"], k["peak"]

    assert rated(2e6) == (2.0, "TFLOP/s", 989.5)
    assert rated(1) == (1e-6, "TFLOP/s", 989.5)
    assert rated(0) == rated(1e18) == rated("2e6") == rated(2e6, dur=0.0) == (None, None, None)


def test_a_lower_bound_rate_keeps_its_unit_plain_in_json():
    """test_mutation_edges' Triton launch without its source: rate_is_lower_bound, unit "GB/s" (the "+" is the
    text's ">=")."""
    from test_reader_report import two_kernels_step

    data = two_kernels_step()
    name = "triton_poi_fused_gelu_mul_0"
    for e in data["traceEvents"]:
        if e["name"] in ("aten::a", "kernel_a"):
            e["name"] = name
        if e["name"] == name and e["cat"] == "cpu_op":
            e["args"].update({"Input Dims": [[4, 8], [4, 8]], "Input type": ["float", "float"]})
    k = it.report_data(parse(data))["kernels"][0]
    assert (k["name"], k["unit"], k["rate_is_lower_bound"]) == (name, "GB/s", True)


def test_view_ops_are_counted_per_step():
    """Two steps, each with one aten::view (no kernel): 1 call per step; and one aten::reshape per step that copies
    (its clone launches a kernel of 4 µs, then of 6): 1 kernel and 5 µs per step, not the two steps' sums (the table
    showed 2 and 10 beside 1 call per step)."""
    ev = []
    for i in range(2):
        ev += [x(f"ProfilerStep#{i + 2}", "user_annotation", 100 * i, 90), x("aten::view", "cpu_op", 100 * i + 5, 2),
               x("aten::mm", "cpu_op", 100 * i + 10, 5),
               x("aten::reshape", "cpu_op", 100 * i + 20, 10),
               x("aten::clone", "cpu_op", 100 * i + 21, 8, **{"External id": 50 + i}),
               x("cudaLaunchKernel", "cuda_runtime", 100 * i + 22, 2, **{"External id": 50 + i, "correlation": 80 + i}),
               x("k_copy", "kernel", 100 * i + 40, 4 + 2 * i, pid=0, tid=7, correlation=80 + i)]
    views = it.report_data(parse({"traceEvents": ev}))["views"]
    assert views == [{"op": "aten::reshape", "calls_per_step": 1.0, "kernels_per_step": 1.0, "cuda_us_per_step": 5.0},
                     {"op": "aten::view", "calls_per_step": 1.0, "kernels_per_step": 0.0, "cuda_us_per_step": 0.0}]


def test_cpu_time_per_annotation_counts_a_nested_instance_once_and_back_to_back_ones_each():
    """Thread 1: `blk` 10..30 holds another `blk` 12..20 (counted once, 20 µs), a third `blk` starts where the first
    ends (30..40: 10 more), then `other` 50..60."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("blk", "user_annotation", 10, 20),
          x("blk", "user_annotation", 12, 8), x("blk", "user_annotation", 30, 10), x("other", "user_annotation", 50, 10)]
    assert rp.cpu_time_by_annotation(parse({"traceEvents": ev})) == {"blk": [30.0], "other": [10.0]}


def test_memory_events_of_another_device_give_no_gpu_peak():
    """A GPU trace whose only [memory] event is the CPU's (Device Type 0): no peak per step, and no line for it."""
    data = steps_of([(2, ["a"])])
    data["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                                "ts": 20, "args": {"Device Type": 0, "Device Id": -1, "Bytes": 512,
                                                   "Total Allocated": 512, "Addr": 1}})
    t = parse(data)
    assert t.has_memory_events
    assert it.report_data(t)["memory_peak_bytes"] is None and "Peak allocation" not in it.report(t)


# ---- idle time at its edges ---------------------------------------------------------------------------------------

def test_a_step_is_judged_on_a_window_under_a_microsecond():
    """A 0.9 µs step: launch at 0.1, kernel 0.2..0.7. Busy 0.5; host 0.1 before the launch and 0.2 after the kernel;
    0.1 after the launch: window 0.9, busy 56%, host 33%."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 0.9), x("aten::a", "cpu_op", 0.05, 0.1, **{"External id": 1}),
          x("cudaLaunchKernel", "cuda_runtime", 0.1, 0.05, **{"External id": 1, "correlation": 1}),
          x("kernel_a", "kernel", 0.2, 0.5, pid=0, tid=7, correlation=1)]
    [st] = it.report_data(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))["steps"]
    assert (round(st["busy_fraction"], 3), round(st["host_wait_fraction"], 3)) == (0.556, 0.333)


def test_an_earlier_steps_late_work_covers_the_later_steps_end_from_either_side():
    """Step #2 (0..100) launches at 10 and 20 two kernels that run late on stream 8, 105..125 and 190..210; #3
    (100..200) launches at 105 one that runs 110..120 on stream 7. #2: host 10 (0..10), after its launch 95 (10..105)
    and 65 (125..190). #3: its kernel starts inside #2's, so no gap; after its end (120) its span runs to 200, of
    which #2's work covers 120..125 and 190..200: 65 µs on the host."""
    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("ProfilerStep#3", "user_annotation", 100, 100)]
    for ext, (at, start, dur, stream) in enumerate([(10, 105, 20, 8), (20, 190, 20, 8), (105, 110, 10, 7)], 1):
        ev += [x("aten::a", "cpu_op", at - 1, 3, **{"External id": ext}),
               x("cudaLaunchKernel", "cuda_runtime", at, 1, **{"External id": ext, "correlation": ext}),
               x("kernel_a", "kernel", start, dur, pid=0, tid=stream, correlation=ext, stream=stream)]
    steps = it.report_data(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))["steps"]
    assert [s["idle_us"] for s in steps] == [{"waiting_on_host": 10.0, "after_launch": 160.0},
                                            {"waiting_on_host": 65.0, "after_launch": 0.0}]


def test_a_cpu_span_of_a_thousand_microseconds_reads_with_a_thousands_separator():
    ev = [x("ProfilerStep#2", "user_annotation", 0, 999.9), x("ProfilerStep#3", "user_annotation", 1000, 1000),
          x("aten::mm", "cpu_op", 5, 5), x("aten::mm", "cpu_op", 1005, 5)]
    assert [line.split() for line in _step_table(it.report(parse({"traceEvents": ev})))[2:]] == [
        ["#2", "999.9"], ["#3", "1,000"]]


def test_memory_events_outside_any_step_give_no_peaks(tmp_path):
    """One CPU allocation and no ProfilerStep span (no step at all): no per-step peaks, None as when nothing was
    allocated, not an empty table."""
    import json

    from trace_reader.analyzers import memory

    alloc = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5, "s": "t",
             "args": {"Device Type": 0, "Device Id": -1, "Addr": 1, "Bytes": 1024, "Total Allocated": 1024,
                      "Total Reserved": 2048}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"traceEvents": [alloc]}))
    t = it.parse_trace({"traceEvents": [alloc]}, str(path))  # (load_trace refuses a trace of nothing else)
    assert t.steps == [] and memory.step_peaks(t) == {}
    assert it.report_data(t)["memory_peak_bytes"] is None
