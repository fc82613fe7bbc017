"""The reader on CPU traces of other harnesses: a training step (MSE loss, AdamW for-loop and foreach), a long run,
worker threads, a compiled function with a graph break and one that recompiles. Real profiles are recorded once
per module at tiny sizes; the truth is read from the raw JSON with a few lines of Python of its own. Hand-built
traces pin each rule of the CPU work list (trace_reader/kernels.cpu_lanes) and of the compiled regions at its edges."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import inspect_trace as it
from trace_reader.analyzers.compiled import compiled_regions, describe
from trace_reader.facts.kernels import cpu_kernels, cpu_lanes
from trace_reader.analyzers.annotations import cpu_time_by_annotation


def record(fn, path, steps=5, active=3, **kwargs):
    """fn profiled in a 'step' annotation (wait 1, warm-up 1, then `active` steps), exported to path."""
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=active),
                 record_shapes=True, **kwargs) as prof:
        for _ in range(steps):
            with record_function("step"):
                fn()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


# ------------------------------------------------------------------------------------ the raw JSON, read here

def raw_steps(path) -> list[tuple[float, float, list[dict]]]:
    """(start, end, the complete CPU events inside) of each ProfilerStep#N span, read straight from the JSON."""
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    out = []
    for s in sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]):
        lo, hi = s["ts"], s["ts"] + s["dur"]
        out.append((lo, hi, [e for e in events if lo <= e["ts"] <= hi and e is not s]))
    return out


def inside(inner: dict, outer: dict) -> bool:
    return (inner["tid"] == outer["tid"] and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] and inner is not outer)


def named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["name"] == name and e["cat"] == "cpu_op"]


def as_raw(units) -> list[dict]:
    return [{"name": e.name, "ts": e.ts, "dur": e.dur, "tid": e.tid} for e in units]


# ------------------------------------------------------------------------------------------- a training step

@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """One tiny MLP trained with an MSE loss and AdamW, once with its for-loop update and once with foreach."""
    out = tmp_path_factory.mktemp("train")
    return {name: record(training_step(foreach), out / f"{name}.json")
            for name, foreach in (("loop", False), ("foreach", True))}


def training_step(foreach: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    x, y = torch.randn(4, 8), torch.randn(4, 4)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    step()  # the optimizer's state exists before the trace
    return step


# what computes in this step, each op at the bottom of its call chain: every one must lie in exactly one unit
COMPUTING = {"aten::addmm", "aten::mm", "aten::gelu", "aten::gelu_backward", "aten::mse_loss_backward", "aten::sum",
             "aten::div_", "aten::lerp_", "aten::addcmul_", "aten::addcdiv_", "aten::sqrt", "aten::div", "aten::add_",
             "aten::mul_", "aten::mul", "aten::add", "aten::ones_like"}


def test_training_step_lists_every_op_that_computes_once(training):
    t = it.load_trace(training["loop"])
    raw = raw_steps(training["loop"])
    assert len(t.steps) == len(raw) == 3
    for st, (_, _, events) in zip(t.steps, raw):
        units = as_raw(cpu_kernels(st))
        # the cases the old list dropped: aten::div with an aten::to child, in-place add_ / mul_, mse_loss
        divs = named(events, "aten::div")
        assert divs and any(inside(c, d) for d in divs for c in named(events, "aten::to"))
        for name in ("aten::div", "aten::add_", "aten::mul_", "aten::mse_loss"):
            outermost = [e for e in named(events, name) if not any(inside(e, o) for o in named(events, name))]
            assert [u["ts"] for u in units if u["name"] == name] == sorted(e["ts"] for e in outermost), name
        # their conversions, copies and fills belong to them
        assert not {u["name"] for u in units} & {"aten::to", "aten::_to_copy", "aten::copy_", "aten::fill_"}
        # the GEMMs are units themselves, not the aten::linear around them
        gemms = named(events, "aten::addmm") + named(events, "aten::mm")
        assert sorted(u["ts"] for u in units if u["name"] in ("aten::addmm", "aten::mm")) == \
            sorted(e["ts"] for e in gemms)
        # nothing dropped, nothing counted twice
        for e in events:
            if e["cat"] == "cpu_op" and e["name"] in COMPUTING:
                assert sum(inside(e, u) or e["ts"] == u["ts"] and e["name"] == u["name"] for u in units) == 1, e
        assert not any(inside(a, b) for a in units for b in units)


def test_mse_loss_is_one_unit_with_the_mean_it_calls(training):
    """torch records aten::mse_loss -> aten::mean -> (aten::sum, aten::div_ -> aten::div_ -> aten::to): the loss
    computes its squared difference itself, then calls the mean, so the loss is the unit."""
    t = it.load_trace(training["loop"])
    for st, (_, _, events) in zip(t.steps, raw_steps(training["loop"])):
        (loss,) = named(events, "aten::mse_loss")
        assert any(inside(m, loss) for m in named(events, "aten::mean"))
        (unit,) = [e for e in cpu_kernels(st) if e.name == "aten::mse_loss"]
        assert unit.dur == loss["dur"]
        assert not [e for e in cpu_kernels(st) if e.name in ("aten::mean", "aten::div_")]


def test_foreach_update_is_one_unit_per_foreach_call(training):
    t = it.load_trace(training["foreach"])
    for st, (_, _, events) in zip(t.steps, raw_steps(training["foreach"])):
        calls = sorted(e["ts"] for e in events if e["cat"] == "cpu_op" and e["name"].startswith("aten::_foreach_"))
        units = cpu_kernels(st)
        assert calls and [e.ts for e in units if e.name.startswith("aten::_foreach_")] == calls
        assert not [e for e in units if e.name in ("aten::lerp_", "aten::addcmul_", "aten::addcdiv_")]


def test_training_report_times_the_optimizer_on_the_cpu(training):
    d = it.report_data(it.load_trace(training["loop"]))
    raw = raw_steps(training["loop"])
    truth = [sum(e["dur"] for e in events if e["name"] == "Optimizer.step#AdamW.step") for _, _, events in raw]
    assert d["annotations_cpu"]["Optimizer.step#AdamW.step"] == pytest.approx(truth) and min(truth) > 0
    assert d["annotations"] == {}  # no GPU work on a CPU trace
    assert d["cpu_work_steps"] == 3 and d["same_order"] is True
    text = it.report(it.load_trace(training["loop"]))
    assert "CPU time per annotation (record_function; its spans, µs per step):" in text
    assert "\nOptimizer.step#AdamW.step " in text and "every step runs the same" in text


# --------------------------------------------------------------------------------------------------- a long run

def test_long_run_keeps_its_top_op(tmp_path):
    """x * 2.0 converts the scalar (an aten::to inside aten::mul): the mul is the unit, in every step."""
    a = torch.randn(32, 32)

    def step():
        b = a * 2.0
        b.add_(1)
        return b.div(3)

    path = record(step, tmp_path / "long.json", steps=32, active=30)
    t = it.load_trace(path)
    d = it.report_data(t)
    assert len(t.steps) == 30
    assert [w["name"] for w in d["cpu_work"]] == ["aten::mul", "aten::add_", "aten::div"]
    assert d["cpu_work_steps"] == 30 and d["same_order"] is True
    muls = [e for _, _, events in raw_steps(path) for e in named(events, "aten::mul")]
    assert d["cpu_work"][0]["mean_us"] == pytest.approx(sum(e["dur"] for e in muls) / len(muls))


# ------------------------------------------------------------------------------------------------ worker threads

@pytest.fixture(scope="module")
def threaded(tmp_path_factory):
    """The main thread computes tanh * 2 while two pool threads each run mm, relu, sum in a 'worker_task'."""
    try:
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        pytest.skip("this torch has no profile_all_threads: pool threads are not recorded")
    a = torch.randn(16, 16)
    pool = ThreadPoolExecutor(2)

    def work():
        with record_function("worker_task"):
            return (a @ a).relu().sum()

    def step():
        futures = [pool.submit(work) for _ in range(2)]
        torch.tanh(a) * 2
        [f.result() for f in futures]

    step()  # the pool's threads exist before the trace
    path = record(step, tmp_path_factory.mktemp("threads") / "threads.json", experimental_config=config)
    pool.shutdown()
    return path


def test_threads_get_their_own_lanes(threaded):
    t = it.load_trace(threaded)
    raw = raw_steps(threaded)
    main = {e["tid"] for _, _, events in raw for e in events if e["name"] == "aten::tanh"}
    workers = {e["tid"] for _, _, events in raw for e in events if e["name"] == "worker_task"}
    assert len(main) == 1 and 1 <= len(workers) <= 2 and not main & workers
    for st in t.steps:
        lanes = cpu_lanes(st)
        assert lanes[0][0] in main and [e.name for e in lanes[0][1]] == ["aten::tanh", "aten::mul"]
        assert {tid for tid, _ in lanes[1:]} <= workers
        pool_work = sorted(e.name for _, evs in lanes[1:] for e in evs)
        assert pool_work == sorted(["aten::mm", "aten::relu", "aten::sum"] * 2)
    d = it.report_data(t)
    assert d["cpu_work_steps"] == 3  # lane by lane, every step has the same sequence however the threads interleave
    assert [w["lane"] for w in d["cpu_work"]][:2] == [0, 0] and all(w["lane"] > 0 for w in d["cpu_work"][2:])
    assert set().union(*(w["tids"] for w in d["cpu_work"][2:])) <= workers
    text = it.report(t)
    assert "thread by thread, main = the one running the step loop" in text and f"main {main.pop()}" in text
    truth = [sum(e["dur"] for e in events if e["name"] == "worker_task") for _, _, events in raw]
    assert d["annotations_cpu"]["worker_task"] == pytest.approx(truth)


# ------------------------------------------------------------------------------------------------ torch.compile

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A function with a graph break, and one compiled with dynamic=False called with two shapes in turn."""
    out = tmp_path_factory.mktemp("compiled")

    def broken(x):
        y = torch.sin(x) * 2
        torch._dynamo.graph_break()
        return torch.cos(y) + 1

    def gelu_mul(x):
        return nn.functional.gelu(x) * x

    import torch._inductor.config as inductor_config

    # Without C++ kernel profiling, whatever an earlier test in this process set (common.setup turns it on).
    with inductor_config.patch({"cpp.enable_kernel_profile": False}):
        torch._dynamo.reset()
        f = torch.compile(broken)
        x = torch.randn(16)
        f(x)
        paths = {"break": record(lambda: f(x), out / "break.json")}
        g = torch.compile(gelu_mul, dynamic=False)
        xs = [torch.randn(16), torch.randn(17)]
        g(xs[0]), g(xs[1])  # both versions compiled before the trace
        calls = iter(range(100))
        paths["recompile"] = record(lambda: g(xs[next(calls) % 2]), out / "recompile.json", steps=6, active=4)
        torch._dynamo.reset()
    return paths


def regions(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e["name"].startswith("Torch-Compiled Region: ")), key=lambda e: e["ts"])


def test_graph_break_is_named(compiled):
    raw = raw_steps(compiled["break"])
    outer, inner = regions(raw[0][2])  # the second frame's region lies inside the first's: Dynamo resumed there
    assert inside(inner, outer)
    f_out, f_in = (int(r["name"].split(": ")[1].split("/")[0]) for r in (outer, inner))
    d = compiled_regions(it.load_trace(compiled["break"]))
    assert d["graph_breaks"] == [[f_out, f_in]] and d["recompiled"] == []
    assert d["frames"] == {f_out: [0], f_in: [0]}
    text = it.report(it.load_trace(compiled["break"]))
    assert f"graph break: frame {f_in} runs inside frame {f_out}'s region" in text
    assert "Work in order: none seen. The compiled code runs inside its Torch-Compiled Region" in text


def test_recompile_is_named_and_the_steps_that_ran_each_version(compiled):
    raw = raw_steps(compiled["recompile"])
    ran = [[r["name"].split(": ")[1] for r in regions(events)] for _, _, events in raw]
    assert all(len(r) == 1 for r in ran) and len({r[0] for r in ran}) == 2
    frame = int(ran[0][0].split("/")[0])
    d = compiled_regions(it.load_trace(compiled["recompile"]))
    assert d["recompiled"] == [frame] and d["frames"] == {frame: [0, 1]} and d["graph_breaks"] == []
    assert [s["regions"] for s in d["per_step"]] == ran
    text = "\n".join(describe(d))
    assert f"recompiled: frame {frame} ran {frame}/0, {frame}/1" in text
    numbers = [st.number for st in it.load_trace(compiled["recompile"]).steps]
    assert f"  steps #{numbers[0]}, #{numbers[2]} run: {ran[0][0]}" in text


# ------------------------------------------------------------------------- the rules, on hand-built traces

def x(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def one_step(*events) -> "it.Trace":
    return it.parse_trace({"traceEvents": [x("ProfilerStep#2", 0, 1000, "user_annotation"), *events]})


def names(trace) -> list[str]:
    return [e.name for e in cpu_kernels(trace.steps[0])]


def test_a_gemm_wrapper_routes_to_its_gemms_and_keeps_its_other_work():
    t = one_step(x("aten::linear", 10, 50), x("aten::t", 11, 2), x("aten::addmm", 14, 40), x("aten::copy_", 15, 3),
                 x("aten::einsum", 100, 50), x("aten::mul", 101, 10), x("aten::bmm", 115, 30),
                 x("aten::matmul", 200, 30), x("aten::reshape", 201, 5), x("aten::mm", 210, 15))
    assert names(t) == ["aten::addmm", "aten::mul", "aten::bmm", "aten::mm"]


def test_a_computing_op_keeps_what_it_calls():
    t = one_step(x("aten::div", 10, 20), x("aten::to", 12, 15), x("aten::_to_copy", 13, 13), x("aten::copy_", 14, 5),
                 x("aten::relu", 40, 10), x("aten::clamp_min", 41, 8),
                 x("aten::mse_loss", 60, 40), x("aten::mean", 80, 18), x("aten::sum", 81, 8), x("aten::div_", 90, 7))
    assert names(t) == ["aten::div", "aten::relu", "aten::mse_loss"]
    assert [e.dur for e in cpu_kernels(t.steps[0])] == [20, 10, 40]


def test_bookkeeping_is_looked_through_and_a_lone_conversion_is_no_work():
    t = one_step(x("aten::reshape", 10, 20), x("aten::clone", 11, 15), x("aten::copy_", 12, 10),
                 x("aten::to", 40, 1), x("aten::contiguous", 50, 1),
                 x("aten::to", 60, 20), x("aten::_to_copy", 61, 18), x("aten::copy_", 62, 10),
                 x("aten::item", 90, 5), x("aten::_local_scalar_dense", 91, 3),
                 x("Optimizer.step#AdamW.step", 100, 50, "user_annotation"), x("aten::add_", 101, 10),
                 x("MulBackward0", 120, 20), x("aten::mul", 121, 15))
    assert names(t) == ["aten::clone", "aten::to", "aten::add_", "aten::mul"]


def test_a_deeply_nested_trace_reads_without_recursion():
    depth = 5000
    t = one_step(*[x("aten::reshape", 1 + i * 0.01, 900 - i * 0.1) for i in range(depth)],
                 x("aten::sin", 60, 10))
    assert names(t) == ["aten::sin"]


def test_lanes_put_the_step_thread_first_then_the_others_by_their_first_unit():
    t = it.parse_trace({"traceEvents": [
        x("ProfilerStep#2", 0, 1000, "user_annotation", tid=5),
        x("aten::cos", 30, 5, tid=9), x("aten::exp", 20, 5, tid=7), x("aten::sin", 50, 5, tid=5),
        x("aten::tan", 60, 5, tid=9)]})
    assert [(tid, [e.name for e in evs]) for tid, evs in cpu_lanes(t.steps[0])] == [
        (5, ["aten::sin"]), (7, ["aten::exp"]), (9, ["aten::cos", "aten::tan"])]


def cpu_steps(*orders) -> "it.Trace":
    ev = []
    for k, ops in enumerate(orders):
        t0 = 1000.0 * k
        ev.append(x(f"ProfilerStep#{k + 2}", t0, 900, "user_annotation"))
        ev += [x(op, t0 + 10 + 100 * i, 50) for i, op in enumerate(ops)]
    return it.parse_trace({"traceEvents": ev})


def test_same_order_on_a_cpu_compares_the_steps():
    same = it.report_data(cpu_steps(["aten::mul", "aten::add"], ["aten::mul", "aten::add"]))
    assert same["same_order"] is True and same["cpu_work_steps"] == 2
    t = cpu_steps(["aten::mul", "aten::add"], ["aten::add", "aten::mul"], ["aten::mul", "aten::add"],
                  ["aten::mul"])
    d = it.report_data(t)
    assert d["same_order"] is False and d["cpu_work_steps"] == 2
    assert d["step_orders"] == [{"steps": [2, 4], "units": 2}, {"steps": [3], "units": 2}, {"steps": [5], "units": 1}]
    assert ("\nsteps differ: 2 steps with 2 units of work (#2, #4); 1 step with 2 units of work in another order (#3); "
            "1 step with 1 unit of work (#5)\n") in it.report(t)
    assert "mean over 2 of 4 steps, those in the typical order" in it.report(t)


def test_cpu_time_per_annotation_counts_a_nested_instance_once_and_adds_threads():
    t = it.parse_trace({"traceEvents": [
        x("ProfilerStep#2", 0, 1000, "user_annotation"), x("ProfilerStep#3", 1000, 1000, "user_annotation"),
        x("fwd", 10, 100, "user_annotation"), x("fwd", 20, 50, "user_annotation"),  # the inner one: not again
        x("fwd", 200, 30, "user_annotation", tid=2), x("fwd", 300, 40, "user_annotation"),
        x("bwd", 1100, 70, "user_annotation")]})
    assert cpu_time_by_annotation(t) == {"fwd": [100 + 30 + 40, 0.0], "bwd": [0.0, 70]}


def region(rid, ts, dur, tid=1):
    return x(f"Torch-Compiled Region: {rid}", ts, dur, tid=tid)


def test_compiled_regions_nested_side_by_side_and_odd_ids():
    nested = compiled_regions(one_step(region("0/0", 10, 100), region("1/0", 50, 40)))
    assert nested["graph_breaks"] == [[0, 1]] and nested["per_step"][0]["regions"] == ["0/0", "1/0 inside 0/0"]
    apart = compiled_regions(one_step(region("0/0", 10, 30), region("1/0", 50, 40)))
    assert apart["graph_breaks"] == [] and apart["frames"] == {0: [0], 1: [0]}
    assert describe(apart) == [("Compiled regions (Torch-Compiled Region: frame/version): 2 compiled frames, 0/0, "
                                "1/0 in every step: no graph break, no recompile")]
    same_frame = compiled_regions(one_step(region("0/0", 10, 100), region("0/1", 20, 10)))
    assert same_frame["graph_breaks"] == [] and same_frame["recompiled"] == [0]
    odd = compiled_regions(one_step(region("Unknown", 10, 10), region("!0/2/1", 30, 10), region("!3", 50, 5)))
    assert odd["frames"] == {2: [1]} and odd["recompiled"] == [2] and odd["other_ids"] == ["!3", "Unknown"]
    only_later = compiled_regions(one_step(region("0/1", 10, 10)))
    assert only_later["recompiled"] == [0]
    assert compiled_regions(one_step(x("aten::sin", 10, 5))) is None and describe(None) == []
