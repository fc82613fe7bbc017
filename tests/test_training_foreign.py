"""The training section on CPU traces from harnesses that are not the suite's (tests/data/train_foreign/, recorded by
record_train.py there): gradient accumulation, DDP with no_sync(), FSDP2, a compiled forward+backward with a graph
break at loss.backward(), a recompile inside the profile, compiled autograd.

Every expected value is computed from the raw JSON by the few lines below (spans, their threads and nesting), not by
the reader under test: each backward pass starts at the loss's own backward node (NllLossBackward0: these models end
in a cross-entropy; CompiledFunctionBackward where the loss is inside a compiled graph), a GEMM is backward's when an autograd engine span holds it, compiler work is what a Dynamo or
Inductor span (`dynamo`, `entire_*_compile`, `... (dynamo_timed)`) holds."""

import gzip
import json
import math
from pathlib import Path

import pytest

import inspect_trace as it
from trace_reader.render import training_text
from trace_reader.analyzers import compiled, training

DATA = Path(__file__).resolve().parent / "data" / "train_foreign"
ENGINE = "autograd::engine::evaluate_function: "
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def raw(name: str) -> dict:
    with gzip.open(DATA / f"{name if name.startswith('h100_') else 'cpu_' + name}.json.gz") as f:
        return json.load(f)


def load(name: str):
    return it.load_trace(DATA / f"{name if name.startswith('h100_') else 'cpu_' + name}.json.gz")


def steps_raw(data: dict) -> list[tuple[dict, list[dict]]]:
    """(ProfilerStep span, the CPU spans inside it) per step: on its thread and on the threads that run autograd's
    engine (its own on a GPU); not gloo's worker threads."""
    ev = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    spans = sorted((e for e in ev if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    engine_threads = {e["tid"] for e in ev if e["name"].startswith(ENGINE)}
    return [(s, [e for e in ev if s["ts"] <= e["ts"] <= s["ts"] + s["dur"] and e is not s
                 and e["tid"] in engine_threads | {s["tid"]}]) for s in spans]


def contains(outer: dict, e: dict) -> bool:
    return outer["tid"] == e["tid"] and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] \
        and outer is not e


def compiler(e: dict) -> bool:
    return e["name"] in ("dynamo", "entire_frame_compile", "entire_backward_compile") or \
        e["name"].endswith(" (dynamo_timed)")


def bucket_views(ev: list[dict]) -> list[dict]:
    """DDP with gradient_as_bucket_view=True ends backward pointing each gradient at its bucket: aten::as_strided
    called by no other aten op (in a trace with collectives)."""
    if not any(e["name"].startswith(("c10d::", "gloo:", "record_param_comms")) for e in ev):
        return []
    ops = [e for e in ev if e["name"].startswith("aten::")]
    return [e for e in ev if e["name"] == "aten::as_strided" and not any(contains(o, e) for o in ops)]


def loss_nodes(roots: list[dict]) -> list[float]:
    """Where each backward pass's loss node starts: NllLossBackward0, or the compiled graph's backward where the loss
    was computed inside the compiled graph."""
    names = [ENGINE + "NllLossBackward0", ENGINE + "CompiledFunctionBackward"]
    name = next(n for n in names if any(e["name"] == n for e in roots))
    return [e["ts"] for e in roots if e["name"] == name]


def truths(data: dict) -> list[dict]:
    """Per step: passes, forward and backward GEMM counts and FLOPs, leaves per pass, compiler µs, backward CPU µs
    (each pass from its first engine span to the last engine span or DDP/FSDP tail op before the next pass)."""
    out = []
    for s, ev in steps_raw(data):
        holes = [e for e in ev if compiler(e)]
        real = [e for e in ev if not any(contains(h, e) or h is e for h in holes)]
        engine = sorted((e for e in real if e["name"].startswith(ENGINE)), key=lambda e: e["ts"])
        roots = [e for e in engine if not any(contains(o, e) for o in engine)]
        starts = loss_nodes(roots)
        # a pass starts at the loss's backward node, or at an engine span just before it (FSDP's pre-backward hook)
        firsts = [max([e["ts"] for e in roots if e["ts"] <= t and not any(
            f["ts"] < e["ts"] < t and f["name"].startswith("aten::") and not any(contains(r, f) for r in roots)
            for f in real)] or [t]) for t in starts]
        bounds = firsts[1:] + [s["ts"] + s["dur"]]
        tails = [e for e in real if e["name"].startswith(("torch.distributed.ddp.reducer::", "FSDP::post_backward",
                                                          "FSDP::root_post_backward"))] + bucket_views(real)
        backward = 0.0
        for a, b in zip(firsts, bounds):
            opt = [e["ts"] for e in real if e["name"].startswith("Optimizer.step#") and a < e["ts"] < b]
            b = min([b, *opt])
            ends = [e["ts"] + e["dur"] for e in roots + tails if a <= e["ts"] < b]
            cut = sum(h["dur"] for h in holes if a <= h["ts"] < max(ends) and not any(contains(o, h) for o in holes))
            backward += max(ends) - a - cut
        gemm = [e for e in real if e["name"] in GEMMS and not any(contains(g, e) for g in real if g["name"] in GEMMS)]
        in_bwd = [any(contains(r, g) for r in roots) for g in gemm]
        flops = [2 * math.prod(d[0]) * d[1][-1] for d in (g["args"]["Input Dims"] for g in gemm)]  # [b,] m, k x k, n
        leaves = sum(e["name"] == ENGINE + "torch::autograd::AccumulateGrad" for e in roots)
        out.append({"passes": len(starts), "fwd_gemms": in_bwd.count(False), "bwd_gemms": in_bwd.count(True),
                    "ratio": sum(f for f, b in zip(flops, in_bwd) if b) / sum(f for f, b in zip(flops, in_bwd) if not b),
                    "leaves": leaves // max(len(starts), 1), "backward_us": backward,
                    "compiler_us": sum(h["dur"] for h in holes if not any(contains(o, h) for o in holes))})
    return out


@pytest.mark.parametrize("name", ["accum", "ddp_accum_rank0", "ddp_gbv_rank0", "fsdp_rank0", "compile_break",
                                  "compile_recompile"])
def test_phases_hold_every_micro_batch_and_no_compiler_work(name):
    """Gradient accumulation: 2 forward/backward pairs a step, each GEMM in its own phase (2x the FLOPs, not 5x),
    each parameter once (21, not 42); a recompile's tracing and compiling is no phase."""
    truth = truths(raw(name))
    data = training.analyze(load(name))
    assert len(data["steps"]) == len(truth) == 2
    for got, want in zip(data["steps"], truth):
        fwd, bwd = got["phases"]["forward"], got["phases"]["backward"]
        assert got["micro_batches"] == want["passes"]
        assert (fwd["gemms"], bwd["gemms"]) == (want["fwd_gemms"], want["bwd_gemms"])
        assert bwd["gemm_flops"] / fwd["gemm_flops"] == pytest.approx(want["ratio"])
        assert got["optimizer"]["gradients"] == want["leaves"]
        assert bwd["cpu_us"] == pytest.approx(want["backward_us"], abs=0.01)
        assert got["compiler_us"] == pytest.approx(want["compiler_us"], abs=0.01)
    assert data["optimizer"]["parameters"] == truth[0]["leaves"]
    assert data["micro_batches"] == truth[0]["passes"]


def test_the_fixtures_are_what_they_say():
    """The truths above on what each harness did: 2 micro-batches, 21 parameters, 2x FLOPs; a compile in one step."""
    for name, passes in (("accum", 2), ("ddp_accum_rank0", 2), ("fsdp_rank0", 1), ("compile_break", 1)):
        assert [t["passes"] for t in truths(raw(name))] == [passes, passes], name
        assert {t["leaves"] for t in truths(raw(name))} == {21}, name
        assert {round(t["ratio"], 6) for t in truths(raw(name))} == {2.0}, name
    assert [t["compiler_us"] > 1e5 for t in truths(raw("compile_recompile"))] == [True, False]


def test_accumulation_text_and_no_checkpoint_read():
    """The text says the passes; --expect 07_train_step does not read the second forward as a checkpoint's."""
    t = load("accum")
    text = "\n".join(training_text.text(training.analyze(t)))
    assert "=> 2 forward and backward passes a step (gradient accumulation" in text
    assert "for 21 gradients accumulated in backward" in text and "5.00x" not in text
    assert training.recomputes_forward(t) is False


def comm_wait_truth(data: dict) -> list[float]:
    """Per step, CPU µs inside the backward passes when the rank's thread ran no op's own code (only annotations, or
    nothing, open): DDP after the engine's last node, waiting for its buckets before it copies them to the
    gradients; FSDP inside FSDP::all_gather and FSDP::post_backward_reduce, waiting for gloo's thread."""
    out = []
    for s, ev in steps_raw(data):
        engine = [e for e in ev if e["name"].startswith(ENGINE)]
        roots = sorted((e for e in engine if not any(contains(o, e) for o in engine)), key=lambda e: e["ts"])
        tails = [e for e in ev if e["name"].startswith(("torch.distributed.ddp.reducer::", "FSDP::"))] + bucket_views(ev)
        starts = loss_nodes(roots)
        firsts = [max(e["ts"] for e in roots if e["ts"] <= x and not any(
            f["ts"] < e["ts"] < x and f["name"].startswith("aten::") and not any(contains(r, f) for r in roots)
            for f in ev)) for x in starts]
        idle = 0.0
        for a, b in zip(firsts, firsts[1:] + [s["ts"] + s["dur"]]):
            opt = [e["ts"] for e in ev if e["name"].startswith("Optimizer.step#") and a < e["ts"] < b]
            b = min([b, *opt])
            end = max(e["ts"] + e["dur"] for e in roots + tails if a <= e["ts"] < b)
            # the spans nest on the thread: walk [a, end] piece by piece between span edges, with a stack of the
            # open spans; a piece is idle when the innermost one open there is no op (or none is open)
            here = sorted((e for e in ev if e["ts"] < end and e["ts"] + e["dur"] > a), key=lambda e: (e["ts"], -e["dur"]))
            edges = sorted({a, end, *(x for e in here for x in (e["ts"], e["ts"] + e["dur"]) if a < x < end)})
            stack, k = [], 0
            for lo, hi in zip(edges, edges[1:]):
                t = (lo + hi) / 2
                while stack and stack[-1]["ts"] + stack[-1]["dur"] <= t:
                    stack.pop()
                while k < len(here) and here[k]["ts"] <= t:
                    while stack and stack[-1]["ts"] + stack[-1]["dur"] <= here[k]["ts"]:
                        stack.pop()
                    stack.append(here[k])
                    k += 1
                while stack and stack[-1]["ts"] + stack[-1]["dur"] <= t:
                    stack.pop()
                if not stack or stack[-1]["cat"] != "cpu_op":
                    idle += hi - lo
        out.append(idle)
    return out


@pytest.mark.parametrize("name", ["ddp_accum_rank0", "ddp_gbv_rank0", "fsdp_rank0"])
def test_communication_wait_is_inside_backward(name):
    """DDP's wait for its buckets and FSDP's post-backward callback are in backward, and said as a wait."""
    data = training.analyze(load(name))
    waits = comm_wait_truth(raw(name))
    assert [s["phases"]["backward"]["comm_wait_us"] for s in data["steps"]] == pytest.approx(waits, abs=0.01)
    assert all(w > 0 for w in waits)
    text = "\n".join(training_text.text(data))
    median = (data["steps"][0]["phases"]["backward"]["comm_wait_us"] + data["steps"][1]["phases"]["backward"]["comm_wait_us"]) / 2
    assert f"=> backward waits {median:,.1f} µs" in text  # the median of two steps


def test_no_wait_is_said_without_collectives():
    data = training.analyze(load("accum"))
    assert "comm_wait_us" not in data["phases"]["backward"]
    assert "backward waits" not in "\n".join(training_text.text(data))


def test_graph_break_at_backward_is_said():
    """loss.backward() inside a compiled function: Dynamo breaks the graph there; the autograd engine runs inside
    frame 0's region, after its compiled graph."""
    data = raw("compile_break")
    regions = [e for e in data["traceEvents"] if e.get("name", "").startswith("Torch-Compiled Region: ")]
    engine = [e for e in data["traceEvents"] if e.get("name", "").startswith(ENGINE)]
    assert any(contains(r, e) for r in regions for e in engine)  # the truth, from the raw JSON
    lines = compiled.describe(compiled.compiled_regions(load("compile_break")))
    assert "no graph break" not in lines[0]
    assert any(line.startswith("  graph break at backward(): the autograd engine runs inside region 0/0") for line in lines)


def test_recompile_backward_links_leave_out_the_compile():
    """The lazy compile of the backward graph (entire_backward_compile inside CompiledFunctionBackward) is no time of
    the backward op; the compiler's own fake-tensor backward nodes are no rows."""
    data = raw("compile_recompile")
    (s, ev), _ = steps_raw(data)
    node = next(e for e in ev if e["name"] == ENGINE + "CompiledFunctionBackward")
    inner = next(e for e in ev if e["name"] == "CompiledFunctionBackward" and contains(node, e))
    hole = sum(h["dur"] for h in ev if compiler(h) and contains(inner, h) and not any(
        contains(o, h) for o in ev if compiler(o)))
    rows = training.analyze(load("compile_recompile"))["slowest_backward"]
    assert {r["backward_op"] for r in rows} == {"CompiledFunctionBackward"}
    ours = [r for r in rows if r["forward_shapes"].startswith("[6, 16]")]  # the recompiled step's batch of 6
    assert ours[0]["us_per_step"] == pytest.approx((inner["dur"] - hole) / 2, abs=0.01)


def test_compiled_autograd_backward_is_a_phase():
    """No autograd engine spans: compiled autograd's graph (region !0/...) is the backward; it is named as such."""
    t = load("compiled_autograd")
    data = training.analyze(t)
    for (s, ev), step in zip(steps_raw(raw("compiled_autograd")), data["steps"]):
        graph = [e for e in ev if e["name"].startswith("Torch-Compiled Region: !")]
        assert step["phases"]["backward"]["cpu_us"] == pytest.approx(sum(e["dur"] for e in graph), abs=0.01)
        assert step["optimizer"]["gradients"] is None
    lines = compiled.describe(compiled.compiled_regions(t))
    assert any(line.startswith("  compiled autograd: the backward ran as the compiled graph(s) !0/1/0") for line in lines)
    out = it.check(t, it.expectations_for("07_train_step", t)[0])
    assert [v for _, v, _ in out].count("broken") == 0


@pytest.mark.parametrize("name", ["ddp_accum_rank0", "fsdp_rank0"])
def test_expect_on_a_foreign_distributed_trace_has_no_false_broken(name):
    """DDP's and FSDP's own spans are torch's, not the harness's annotations: 'train_step' is n/a, not BROKEN."""
    t = load(name)
    out = it.check(t, it.expectations_for("07_train_step", t)[0])
    assert [v for _, v, _ in out].count("broken") == 0
    assert out[0][1] == "not applicable"


def test_partial_annotations_still_find_the_other_phases(tmp_path):
    """A harness that annotates only its forward: backward and the optimizer still come from torch's own spans (all
    three annotations are needed before the annotations alone are read)."""
    data = raw("accum")
    (s, ev), _ = steps_raw(data)
    first_bwd = min(e["ts"] for e in ev if e["name"].startswith(ENGINE))
    data["traceEvents"].append({**s, "name": "forward", "ts": s["ts"] + 1, "dur": first_bwd - s["ts"] - 2})
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(data))
    windows, annotated = training.phase_windows(it.load_trace(path).steps[0])
    assert not annotated and set(windows) == {"forward", "backward", "optimizer"}
    assert windows["forward"] == (s["ts"] + 1, first_bwd - 1)


def test_the_docs_numbers_are_the_fixture_s():
    """docs/07_train_step.md quotes the accumulation fixture: re-derived here from the raw JSON."""
    t = truths(raw("accum"))[0]
    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "07_train_step.md").read_text().split())
    assert (f"=> {t['passes']} forward and backward passes a step`, and each phase holds all of them: "
            f"{t['fwd_gemms']} forward GEMMs and {t['bwd_gemms']} backward ones, {t['ratio']:.2f}x the FLOPs, "
            f"{t['leaves']} parameters, each counted once") in page


GPU = ["h100_accum", "h100_ddp_accum_rank0", "h100_fsdp_rank0", "h100_compile_break"]


@pytest.mark.parametrize("name", GPU)
def test_gpu_traces_phases_hold_every_micro_batch(name):
    """The same harness on an H100 (bf16; DDP and FSDP as one NCCL rank): backward on the autograd engine's own
    thread, the passes, FLOPs, leaves and backward's CPU time as on the CPU; GEMMs are kernels there, one per GEMM
    op at least (a GEMM op may launch a second kernel, a split-K reduce)."""
    truth = truths(raw(name))
    data = training.analyze(load(name))
    assert data["device"] == "cuda" and len(data["steps"]) == len(truth) == 2
    for got, want in zip(data["steps"], truth):
        fwd, bwd = got["phases"]["forward"], got["phases"]["backward"]
        assert got["micro_batches"] == want["passes"]
        assert bwd["gemm_flops"] / fwd["gemm_flops"] == pytest.approx(want["ratio"])
        assert fwd["gemms"] >= want["fwd_gemms"] and bwd["gemms"] >= want["bwd_gemms"]
        assert got["optimizer"]["gradients"] == want["leaves"]
        assert bwd["cpu_us"] == pytest.approx(want["backward_us"], abs=0.01)


def test_gpu_graph_break_at_backward_and_compiled_autograd():
    """On a GPU the engine runs on its own thread while the region's thread waits in backward(): the break is read
    from the engine's start inside the region's time. Compiled autograd's graph is the backward there too."""
    data = raw("h100_compile_break")
    regions = [e for e in data["traceEvents"] if e.get("name", "").startswith("Torch-Compiled Region: ")]
    engine = [e for e in data["traceEvents"] if e.get("name", "").startswith(ENGINE)]
    assert {e["tid"] for e in engine} != {r["tid"] for r in regions}  # the truth: another thread ...
    assert any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in regions for e in engine)  # ... during the region
    lines = compiled.describe(compiled.compiled_regions(load("h100_compile_break")))
    assert any(line.startswith("  graph break at backward(): the autograd engine runs inside region 0/0") for line in lines)
    t = load("h100_compiled_autograd")
    assert any(line.startswith("  compiled autograd: the backward ran as the compiled graph(s) !0/")
               for line in compiled.describe(compiled.compiled_regions(t)))
    for step in training.analyze(t)["steps"]:
        assert step["phases"]["backward"]["gpu_us"] > 0 and step["optimizer"]["gradients"] is None


def test_annotated_phases_leave_the_compiler_out_too(tmp_path):
    """A harness that annotates its phases and recompiles inside one: the annotation's time less the compiler's
    spans inside it (backward's lazy compile, inside CompiledFunctionBackward), as without annotations."""
    data = raw("compile_recompile")
    (s, ev), _ = steps_raw(data)
    first_bwd = min(e["ts"] for e in ev if e["name"].startswith(ENGINE))
    opt = next(e for e in ev if e["name"].startswith("Optimizer.step#"))
    spans = {"forward": (s["ts"] + 1, first_bwd - 1), "backward": (first_bwd, opt["ts"] - 1),
             "optimizer": (opt["ts"], opt["ts"] + opt["dur"])}
    data["traceEvents"] += [{**s, "name": n, "ts": a, "dur": b - a} for n, (a, b) in spans.items()]
    path = tmp_path / "annotated.json"
    path.write_text(json.dumps(data))
    step = training.analyze(it.load_trace(path))["steps"][0]
    outer = [h for h in ev if compiler(h) and not any(contains(o, h) for o in ev if compiler(o))]
    cuts = 0.0
    for name, (a, b) in spans.items():
        cut = sum(min(h["ts"] + h["dur"], b) - max(h["ts"], a) for h in outer if h["ts"] < b and h["ts"] + h["dur"] > a)
        assert step["phases"][name]["cpu_us"] == pytest.approx(b - a - cut, abs=0.01), name
        cuts += cut
    assert cuts > 1e5  # seconds of compiling inside the annotated phases


def test_expect_07_on_a_plain_sgd_step_is_not_broken(tmp_path):
    """Another harness's SGD without momentum runs one op per parameter (aten::add_): the trace cannot tell its
    momentum, so --expect 07_train_step asks for at least one, where 07's own SGD (momentum 0.9) runs two."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    x = torch.randn(4, 8)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            prof.step()
    path = tmp_path / "sgd.json"
    prof.export_chrome_trace(str(path))
    raw_ev = json.loads(path.read_text())["traceEvents"]
    (s, ev), _ = steps_raw({"traceEvents": raw_ev})
    opt_span = next(e for e in ev if e["name"] == "Optimizer.step#SGD.step")
    assert sum(e["name"] == "aten::add_" and contains(opt_span, e) for e in ev) == 4  # the truth: one op a parameter
    t = it.load_trace(path)
    out = it.check(t, it.expectations_for("07_train_step", t)[0])
    line = next((ex.text, v) for ex, v, _ in out if ex.text.startswith("the optimizer"))
    assert line == ("the optimizer, for-loop: at least 1 op per parameter (4 parameters; on a GPU as many kernels), "
                    "no foreach or fused op", "confirmed")
