"""07_train_step.py on the CPU (two tiny real runs with --memory: plain and --checkpoint), each optimizer
implementation's step, bad flags; trace_reader/training.py on hand-built traces (values worked out by hand) and on
the committed foreign H200 training traces (the truth re-derived here from the raw JSON, a few lines each).

GPU-only checks (kernel counts per optimizer implementation, the CUDA memory snapshot) are in the H200 fixtures'
recipe, tests/data/record_h200_train.sh; their tests come with the fixtures.
"""

import gzip
import importlib
import json
import re
import stat
import types
from pathlib import Path

import pytest
from conftest import run_script_main
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from trace_reader.render import training_text
from trace_reader.render import memory_picture
from trace_reader.render import compare_text
from trace_reader.analyzers import training_expect
import inspect_trace as it
from trace_reader.analyzers import memory_timeline, training
from trace_reader.render.plot import png_data

train07 = importlib.import_module("07_train_step")
FOREIGN = Path(__file__).resolve().parent / "data" / "foreign"
# Two MLPs in a row at 128 tokens: the activations outweigh the parameters, so the peak is backward's to find.
SMALL = ["--batch", "2", "--seq", "64", "--dim", "64", "--hidden", "256", "--dtype", "fp32", "--layers", "2",
         "--memory"]


def run(out, *args, device="cpu"):
    """(exit code, stdout, stderr, the trace written or None), as `python 07_train_step.py ARGS` would give."""
    code, stdout, stderr = run_script_main("07_train_step.py", train07.main, out, *args, device=device)
    traces = sorted((out / "07_train_step").glob("*.json"))
    traces = [t for t in traces if not t.name.endswith(".memory.json")]
    return code, stdout, stderr, (traces[-1] if traces else None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    done = {}
    for key, extra in [("plain", []), ("checkpoint", ["--checkpoint"])]:
        done[key] = run(tmp_path_factory.mktemp(key), *SMALL, *extra)
        assert done[key][0] == 0, done[key][2]
    return done


def raw(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def verdicts(stdout):
    """{guess: "ok" | "n/a" | "BROKEN"} from the printed expectations."""
    lines = stdout.split("Expectations (guess first, then look):", 1)[1].splitlines()
    return {ln[10:]: ln[2:10].strip() for ln in lines if ln[2:10].strip() in ("ok", "n/a", "BROKEN")}


# ---------------------------------------------------------------------------------------- the script, for real

@pytest.mark.profiles  # the module's runs record profiles
def test_cpu_run_confirms_its_guesses(runs):
    for key, (_, out, _, trace) in runs.items():
        seen = verdicts(out)
        assert len(seen) == 5 and "BROKEN" not in seen.values(), (key, seen)
        assert seen == {k: "ok" for k in seen}, (key, seen)  # at this shape all of them are checkable
        assert trace.name == ("mlp-2L_2x64x64x256_adamw-foreach_mlp-eager" + "_ckpt" * (key == "checkpoint")
                              + "_memory_fp32_cold_eager.json")
    assert "Training step, phase by phase (phases from annotations" in runs["plain"][1]


@pytest.mark.profiles  # the module's runs record profiles
def test_cpu_trace_has_forward_backward_flows(runs):
    events = raw(runs["plain"][3])
    starts = {e["id"] for e in events if e.get("cat") == "fwdbwd" and e.get("ph") == "s"}
    ends = {e["id"] for e in events if e.get("cat") == "fwdbwd" and e.get("ph") == "f"}
    assert starts and starts == ends
    steps = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    data = training.analyze(it.load_trace(runs["plain"][3]))
    assert data["links_per_step"] * steps <= len(starts)  # those of the active steps, each pair once
    # two MLPs: six forward aten::mm, six MmBackward0 linked to them
    assert sum(r["calls_per_step"] for r in data["slowest_backward"] if r["backward_op"] == "MmBackward0") == 6


@pytest.mark.profiles  # the module's runs record profiles
def test_checkpoint_lowers_the_peak(runs):
    """The same parameters and optimizer state in both runs: what a step allocates above its lowest point (the
    allocator's running total, the CPU's "[memory]" events) peaks lower when each MLP's activations are rebuilt
    in backward; so does torch's timeline of all categories together. (The running totals themselves start from
    whatever was allocated since the profiler started, so they are compared above each step's low.)"""
    def peaks(trace):
        events = raw(trace)
        mem = [e["args"] for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
        out = []
        for s in (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")):
            inside = [e["args"] for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0
                      and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            low = min(a["Total Allocated"] - max(a["Bytes"], 0) for a in inside)
            out.append(max(a["Total Allocated"] for a in inside) - low)
        assert mem and out
        return out

    plain, ckpt = peaks(runs["plain"][3]), peaks(runs["checkpoint"][3])
    assert max(ckpt) < min(plain)
    timelines = {k: json.loads(v[3].with_name(v[3].name.removesuffix(".json") + ".memory.json").read_text())
                 for k, v in runs.items()}
    total = {k: max(sum(col) for col in zip(*t["bytes"].values())) for k, t in timelines.items()}
    act = {k: max(t["bytes"]["activation"]) for k, t in timelines.items()}
    assert total["checkpoint"] < total["plain"] and act["checkpoint"] < act["plain"]


@pytest.mark.profiles  # the module's runs record profiles
def test_memory_pictures_next_to_the_trace(runs):
    _, out, _, trace = runs["plain"]
    stem = trace.name.removesuffix(".json")
    data, png = trace.with_name(stem + ".memory.json"), trace.with_name(stem + ".memory.png")
    for f in (data, png):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
    timeline = json.loads(data.read_text())
    assert set(timeline["bytes"]) == set(memory_timeline.CATEGORIES)
    peaks = {k: max(v) for k, v in timeline["bytes"].items() if max(v) > 0}
    assert peaks["parameter"] == 2 * 3 * 64 * 256 * 4  # two MLPs' three fp32 weights
    assert png_data(png)["peaks_bytes"] == peaks
    total = max(sum(col) for col in zip(*timeline["bytes"].values()))
    assert png_data(png)["total_peak_bytes"] == total
    assert f"all together peak at {total / 2**20:,.1f} MiB, in ProfilerStep#" in out
    assert not list(trace.parent.glob(".*"))  # no temporary file left behind


# ------------------------------------------------------------------------------------- each optimizer's step

def profiled_step(optimizer, impl):
    """One training step of a tiny two-layer MLP, phases annotated as 07_train_step.py does, with its optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False))
    opt = train07.OPTIMIZERS[optimizer](model.parameters(), **train07.IMPLEMENTATIONS[impl])
    x = torch.randn(4, 8)
    for _ in range(2):  # the second step is the one kept: optimizer state exists from the first
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
                record_function("ProfilerStep#1"):
            opt.zero_grad(set_to_none=True)
            with record_function("forward"):
                loss = F.mse_loss(model(x), x)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
    return prof


@pytest.mark.profiles
@pytest.mark.parametrize("optimizer", list(train07.OPTIMIZERS))
def test_each_optimizer_implementation(tmp_path, optimizer):
    per_param = train07.OPS_PER_PARAMETER[optimizer]
    for impl in train07.IMPLEMENTATIONS:
        path = tmp_path / f"{impl}.json"
        profiled_step(optimizer, impl).export_chrome_trace(str(path))
        t = it.load_trace(path)
        results = {i: it.check(t, [training_expect.optimizer_kind(i, 2, per_param)])[0][1] for i in train07.IMPLEMENTATIONS}
        assert results == {i: "confirmed" if i == impl else "broken" for i in results}, (impl, results)
        assert training.analyze(t)["optimizer"]["implementation"] == impl


# ----------------------------------------------------------------------------------------------- bad input

def test_checkpointing_a_model_warns_nothing():
    """--checkpoint on a transformers model: every decoder layer checkpointed, without the deprecation warning the
    old method name gives (a reader would take it for a problem of the suite)."""
    import warnings

    from transformers import GemmaForCausalLM

    config = importlib.import_module("06_model").preset_config("tiny")
    config.num_hidden_layers = 2
    model = GemmaForCausalLM(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train07.checkpoint_layers(model)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)


def test_bad_flags_are_one_line(tmp_path, monkeypatch):
    cases = [(["--mlp", "fused"], "--mlp fused runs a Triton kernel, which needs a CUDA GPU"),
             (["--mlp", "fused-recompute"], "--mlp fused-recompute runs a Triton kernel, which needs a CUDA GPU"),
             (["--layers", "0"], "must be between 1 and 1000"),
             (["--optim-impl", "fast"], "invalid choice: 'fast'"),
             (["--model", "tiny", "--seq", "4096"], "--seq 4096 is longer than the tiny preset's 2048 positions")]
    for args, message in cases:
        code, out, err, trace = run(tmp_path, *args)
        assert (code, trace) == (2, None), args
        assert err.count("\n") == 1 and err.startswith("07_train_step.py: error: ") and message in err, err
    def refuses(params, **kw):  # what torch says where it has no fused kernel for the device
        raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")

    monkeypatch.setitem(train07.OPTIMIZERS, "adamw", refuses)
    code, out, err, trace = run(tmp_path, "--optim-impl", "fused")
    assert (code, trace) == (2, None)
    assert err.count("\n") == 1 and "--optim-impl fused: torch" in err and "try --optim-impl foreach" in err, err
    assert "model:" not in out  # refused before the model was built
    assert not (tmp_path / "07_train_step").exists()


# --------------------------------------------------------------------------------- the reader, by hand

def hand_trace(annotated=True):
    """A GPU training step as kineto writes it: the main thread (tid 1) runs forward and the optimizer, the autograd
    engine's thread (tid 2) the backward; one aten::mm forward [8, 16] x [16, 32] whose MmBackward0 runs two GEMMs;
    a foreach AdamW of two multi-tensor kernels. Times in µs."""
    ev, corr = [], [0]

    def x(name, cat, ts, dur, tid=1, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args})

    def launch(ts, tid, name, dur):  # a launch at ts, its kernel on the GPU 100 µs later
        corr[0] += 1
        x("cudaLaunchKernel", "cuda_runtime", ts, 2, tid=tid, correlation=corr[0])
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts + 100, "dur": dur,
                   "args": {"correlation": corr[0]}})

    x("ProfilerStep#2", "user_annotation", 0, 1000)
    x("Optimizer.zero_grad#AdamW.zero_grad", "user_annotation", 2, 3)
    if annotated:
        x("forward", "user_annotation", 10, 190)
        x("backward", "user_annotation", 210, 490)
        x("optimizer", "user_annotation", 710, 280)
    x("aten::mm", "cpu_op", 20, 50, **{"Input Dims": [[8, 16], [16, 32]], "Sequence number": 5})
    launch(22, 1, "nvjet_sm90_gemm_fwd", 30)
    x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 220, 80, tid=2)
    x("MmBackward0", "cpu_op", 225, 65, tid=2, **{"Sequence number": 5})
    x("aten::mm", "cpu_op", 230, 20, tid=2, **{"Input Dims": [[8, 32], [32, 16]]})  # the input's gradient
    launch(232, 2, "nvjet_sm90_gemm_dx", 40)
    x("aten::mm", "cpu_op", 260, 20, tid=2, **{"Input Dims": [[16, 8], [8, 32]]})  # the weight's gradient
    launch(262, 2, "nvjet_sm90_gemm_dw", 45)
    x("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "cpu_op", 400, 10, tid=2)
    x("Optimizer.step#AdamW.step", "user_annotation", 720, 260)
    x("aten::_foreach_mul_", "cpu_op", 730, 20)
    launch(732, 1, "void at::native::multi_tensor_apply_kernel<Mul>", 12)
    x("aten::_foreach_add_", "cpu_op", 760, 20)
    launch(762, 1, "void at::native::multi_tensor_apply_kernel<Add>", 8)
    ev += [{"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 1, "tid": 1, "ts": 20},
           {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 1, "tid": 2, "ts": 225, "bp": "e"},
           {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 2, "pid": 1, "tid": 1, "ts": 20},  # no end: ignored
           {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 3, "pid": 1, "tid": 1, "ts": 21},  # no op there
           {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 3, "pid": 1, "tid": 2, "ts": 225, "bp": "e"}]
    return {"traceEvents": ev}


def load_hand(tmp_path, **kw):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(hand_trace(**kw)))
    return it.load_trace(path)


@pytest.mark.parametrize("annotated", [True, False])
def test_phases_links_and_optimizer_by_hand(tmp_path, annotated):
    data = training.analyze(load_hand(tmp_path, annotated=annotated))
    assert data["phases_from"] == ("annotations" if annotated else "torch.optim and autograd spans")
    gemm = 2 * 8 * 16 * 32  # each of the three GEMMs: 8192 FLOP
    expected = {"forward": (30, 1, 1, gemm), "backward": (40 + 45, 2, 2, 2 * gemm), "optimizer": (12 + 8, 2, 0, 0)}
    got = {p: (f["gpu_us"], f["kernels"], f["gemms"], f["gemm_flops"]) for p, f in data["phases"].items()}
    assert got == expected
    windows = {"forward": (10, 200), "backward": (210, 700), "optimizer": (710, 990)} if annotated else \
        {"forward": (5, 220), "backward": (220, 410), "optimizer": (720, 980)}  # zero_grad's end .. autograd's spans
    assert {p: f["cpu_us"] for p, f in data["phases"].items()} == {p: b - a for p, (a, b) in windows.items()}
    assert data["backward_over_forward_flops"] == 2.0
    o = data["optimizer"]
    assert (o["class"], o["implementation"], o["foreach_ops"], o["other_ops"], o["kernels"],
            o["multi_tensor_kernels"], o["gradients"]) == ("AdamW", "foreach", 2, 0, 2, 2, 1)
    assert data["links_per_step"] == 1
    assert data["slowest_backward"] == [{"backward_op": "MmBackward0", "forward_op": "aten::mm", "forward_in": None,
                                         "forward_shapes": "[8, 16] x [16, 32]", "calls_per_step": 1,
                                         "us_per_step": 85, "us_per_call": 85}]


def test_report_has_a_training_section_only_with_a_backward(tmp_path):
    t = load_hand(tmp_path)
    text = it.report(t)
    assert "Training step, phase by phase (phases from annotations" in text
    assert "=> backward's GEMMs do 2.00x forward's FLOPs" in text
    assert "optimizer: AdamW, looks foreach:" in text and "MmBackward0" in text
    assert it.report_data(t)["training"]["links_per_step"] == 1
    json.dumps(it.report_data(t))  # --json: plain data
    from test_inspect_trace import gpu_trace, parse

    inference = parse(gpu_trace())
    assert it.report_data(inference)["training"] is None and "Training step" not in it.report(inference)


def test_expectations_at_their_edges(tmp_path):
    t = load_hand(tmp_path)  # backward / forward FLOPs: exactly 2.0

    def verdict(ex):
        return it.check(t, [ex])[0][1]

    assert verdict(training_expect.backward_flops(2.0, 2.5, "")) == "confirmed"
    assert verdict(training_expect.backward_flops(1.5, 2.0, "")) == "confirmed"
    assert verdict(training_expect.backward_flops(2.01, 3.0, "")) == "broken"
    assert verdict(training_expect.backward_flops(1.0, 1.99, "")) == "broken"
    assert verdict(training_expect.phases_present()) == "confirmed"
    # foreach: two foreach ops and no other, for any parameter count; for-loop needs per_param * params others
    assert verdict(training_expect.optimizer_kind("foreach", 1, 1)) == "confirmed"
    assert verdict(training_expect.optimizer_kind("for-loop", 1, 1)) == "broken"
    assert verdict(training_expect.optimizer_kind("fused", 1, 1)) == "broken"
    # no [memory] events at all: recorded without profile_memory=True, so the guess cannot be looked at
    assert verdict(training_expect.peak_after_forward(False, 0)) == "not applicable"
    assert "profile_memory=True" in it.check(t, [training_expect.peak_after_forward(False, 0)])[0][2]


def cpu_trace_with_allocations(allocations):
    """hand_trace() as a CPU trace (no runtime calls, no kernels) with a [memory] event per (ts, bytes), the
    total starting at 1000 B."""
    data = hand_trace()
    total = 1000
    for ts, nbytes in allocations:
        total += nbytes
        data["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
                                    "ts": ts, "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": 0}})
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") not in ("cuda_runtime", "kernel")]
    return data


def test_memory_peak_phase_by_hand(tmp_path):
    """Allocations on the CPU at known times: 100 B at 15 (forward), +300 B at 150 (forward), +50 B at 250
    (backward, the peak: 450 above the lowest), -400 B at 300, +200 B at 800 (optimizer)."""
    data = cpu_trace_with_allocations([(15, 100), (150, 300), (250, 50), (300, -400), (800, 200)])
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(data))
    t = it.load_trace(path)
    assert t.device == "cpu"
    assert training.memory_peak(t) == [{"number": 2, "phase": "backward", "peak_bytes": 450,
                                        "at_forward_end_bytes": 400}]
    assert it.check(t, [training_expect.peak_after_forward(False, 0)])[0][1] == "confirmed"  # 400 >= half of 450
    assert it.check(t, [training_expect.peak_after_forward(True, 0)])[0][1] == "confirmed"
    assert it.check(t, [training_expect.peak_after_forward(False, 0, "the fused MLP")])[0][1] == "confirmed"
    # memory events, none on this device: that is broken, not n/a
    data["traceEvents"] = [{**e, "args": {**e["args"], "Device Type": 1}} if e.get("name") == "[memory]" else e
                           for e in data["traceEvents"]]
    path.write_text(json.dumps(data))
    assert it.check(it.load_trace(path), [training_expect.peak_after_forward(False, 0)])[0][1] == "broken"


def test_a_module_that_rebuilds_moves_the_peak_into_backward(tmp_path):
    """100 B held when forward ends, the peak 400 B in backward (rebuilt tensors): below half, broken for a plain
    MLP; confirmed where a module rebuilds in backward (the fused MLP), broken there too if the peak is in the
    optimizer with more than the parameters held."""
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(cpu_trace_with_allocations([(15, 100), (250, 300), (300, -300)])))
    t = it.load_trace(path)
    assert training.memory_peak(t) == [{"number": 2, "phase": "backward", "peak_bytes": 400,
                                        "at_forward_end_bytes": 100}]
    assert it.check(t, [training_expect.peak_after_forward(False, 0)])[0][1] == "broken"  # 100 < half of 400
    assert it.check(t, [training_expect.peak_after_forward(False, 0, "the fused MLP")])[0][1] == "confirmed"
    path.write_text(json.dumps(cpu_trace_with_allocations([(15, 100), (800, 300)])))
    assert it.check(it.load_trace(path), [training_expect.peak_after_forward(False, 50, "the fused MLP")])[0][1] == "broken"


@pytest.mark.parametrize("mlp, verdict", [("eager", "broken"), ("liger", "broken"), ("fused", "broken"),
                                          ("fused-recompute", "confirmed")])
def test_the_memory_guess_per_mlp(tmp_path, mlp, verdict):
    """07's guesses for each --mlp, on a trace whose peak (400 B) is in backward with 100 B held when forward ends:
    the fused MLP saves g and u as eager and Liger do, so the plain guess holds it to half the peak held (broken
    here); fused-recompute rebuilds them in backward, so the peak may come there (confirmed). Neither fused mode has
    its gate and up GEMMs as aten ops: no FLOPs guess for them."""
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(cpu_trace_with_allocations([(15, 100), (250, 300), (300, -300)])))
    args = types.SimpleNamespace(active=1, mlp=mlp, checkpoint=False, optimizer="adamw", optim_impl="foreach")
    exps = train07.expectations(args, 1, 0)
    assert len(exps) == (4 if mlp.startswith("fused") else 5)
    memory = [e for e in exps if e.text.startswith("memory peaks")]
    assert [v for _, v, _ in it.check(it.load_trace(path), memory)] == [verdict]


@pytest.mark.parametrize("name, told", [("mlp-fused-recompute", "fused-recompute"), ("mlp-fused", "fused"),
                                        ("mlp-eager", "fused")])
def test_expect_reads_the_fused_mode_from_the_file_name(tmp_path, capsys, name, told):
    """Both modes launch the same kernels: the kernels say the MLP is fused (whatever the name says), the name which
    mode."""
    data = hand_trace()
    data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "_geglu_pointer_kernel", "pid": 0, "tid": 7,
                                "ts": 60, "dur": 5, "args": {}})
    path = tmp_path / f"mlp-1L_8x16x32x32_adamw-foreach_{name}_bf16_cold_eager.json"
    path.write_text(json.dumps(data))
    _, out, err = expect_cli(path, capsys)  # exit 1: the hand-built step has no "train_step" annotation to count
    assert not err and f"07_train_step eager, adamw foreach, MLP {told}, 1 parameter tensors" in out, out[-600:]


def test_the_fused_mlp_peak_the_page_quotes():
    """docs/07's numbers for `--mlp fused --compile` on the H200, from that run's log: the peak in backward with
    under half of it held when forward ends (what broke the plain guess), in every step."""
    log = (TRAIN / "h200_train_mlp_fused_compile_log.txt").read_text()
    seen = re.findall(r"#(\d+): peak ([\d.]+) MiB in (\w+), ([\d.]+) MiB held when forward ends", log)
    assert [n for n, *_ in seen] == ["2", "3", "4"] and len({tuple(r[1:]) for r in seen}) == 1
    peak, phase, held = float(seen[0][1]), seen[0][2], float(seen[0][3])
    assert phase == "backward" and held < peak / 2 and "MLP fused" in log and "compile, cold" in log
    page = " ".join((Path(__file__).parent.parent / "docs" / "07_train_step.md").read_text().split())
    assert f"{peak:.1f} MiB in backward, {held:.1f} MiB held when forward ends" in page


def test_memory_peak_in_the_optimizer_by_hand(tmp_path):
    """The step's peak in the optimizer, 400 B (100 B held when forward ends, 300 more in the optimizer): n/a from
    100 B of parameters on (four parameter-sized tensors make 400 B: too few tokens for activations to matter) and
    when the parameters' bytes are unknown; broken at 99 B (the optimizer holds more than such tensors make)."""
    data = cpu_trace_with_allocations([(150, 100), (800, 300)])
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(data))
    t = it.load_trace(path)
    assert [(p["phase"], p["peak_bytes"], p["at_forward_end_bytes"]) for p in training.memory_peak(t)] == [
        ("optimizer", 400, 100)]
    verdicts_ = {b: it.check(t, [training_expect.peak_after_forward(False, b)])[0] for b in (100, None, 99)}
    assert {b: v for b, (_, v, _) in verdicts_.items()} == {100: "not applicable", None: "not applicable",
                                                           99: "broken"}
    assert "bytes are unknown" in verdicts_[None][2]


# ------------------------------------------------------------------ the training reader at its edges (by hand)

GOLDEN_GPU = """
Training step, phase by phase (phases from annotations; per step, median over 1 steps):
phase      GPU µs  share  kernels  GEMMs  GEMM GFLOP  CPU µs
---------  ------  -----  -------  -----  ----------  ------
forward      30.0    22%        1      1    8.19e-06   190.0
backward     85.0    63%        2      2    1.64e-05   490.0
optimizer    20.0    15%        2      0           0   280.0
=> backward's GEMMs do 2.00x forward's FLOPs (about 2x: a gradient for each GEMM's input and one for its weight, \
less where an input needs none; ~3x with activation checkpointing)
optimizer: AdamW, looks foreach: 2 ops (2 foreach, 0 fused, 0 others), 2 kernels (2 multi-tensor, 2.0 per \
gradient) per step, for 1 gradients accumulated in backward

Backward ops by GPU time, with the forward op that made each (fwdbwd flow links, 1 per step):
backward op  GPU µs/step  calls/step  forward op  inside  forward shapes
-----------  -----------  ----------  ----------  ------  ------------------
MmBackward0         85.0           1  aten::mm    -       [8, 16] x [16, 32]"""

GOLDEN_CPU = """
Training step, phase by phase (phases from annotations; per step, median over 1 steps):
phase      CPU µs  share  GEMMs  GEMM GFLOP
---------  ------  -----  -----  ----------
forward     190.0    20%      1    8.19e-06
backward    490.0    51%      2    1.64e-05
optimizer   280.0    29%      0           0
=> backward's GEMMs do 2.00x forward's FLOPs (about 2x: a gradient for each GEMM's input and one for its weight, \
less where an input needs none; ~3x with activation checkpointing)
optimizer: AdamW, looks foreach: 2 ops (2 foreach, 0 fused, 0 others) per step, for 1 gradients accumulated in \
backward

Backward ops by CPU time, with the forward op that made each (fwdbwd flow links, 1 per step):
backward op  CPU µs/step  calls/step  forward op  inside  forward shapes
-----------  -----------  ----------  ----------  ------  ------------------
MmBackward0         65.0           1  aten::mm    -       [8, 16] x [16, 32]"""


def _load(tmp_path, data, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return it.load_trace(path)


def _cpu_only(data):
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") not in ("cuda_runtime", "kernel")]
    return data


def test_the_training_section_word_for_word(tmp_path):
    """hand_trace's section, worked out by hand: GPU µs 30 / 85 (40 + 45) / 20 (12 + 8) of 135, shares 22%, 63%,
    15%; one GEMM of 2 x 8 x 16 x 32 = 8192 FLOP (8.19e-06 GFLOP) forward, two backward; CPU windows 190, 490, 280
    µs (of 960: 20%, 51%, 29%); MmBackward0's own span 65 µs. The first column is left-aligned, the rest right."""
    gpu = "\n".join(training_text.text(training.analyze(load_hand(tmp_path))))
    cpu = "\n".join(training_text.text(training.analyze(_load(tmp_path, _cpu_only(hand_trace())))))
    assert gpu == GOLDEN_GPU and cpu == GOLDEN_CPU
    no_links = hand_trace()
    no_links["traceEvents"] = [e for e in no_links["traceEvents"] if e.get("cat") != "fwdbwd"]
    assert training_text.text(training.analyze(_load(tmp_path, no_links)))[-1] == (
        "Backward ops with their forward op: no fwdbwd flow links in this trace")
    no_shapes = hand_trace()
    for e in no_shapes["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    t = _load(tmp_path, no_shapes)
    lines = "\n".join(training_text.text(training.analyze(t))).splitlines()
    assert lines[4].split()[-2:] == ["-", "190.0"]  # forward's GEMM GFLOP unknown
    assert lines[7] == ("=> backward's GEMMs do ? x forward's FLOPs (no GEMM shapes: record_shapes=True, or forward "
                        "has no aten GEMM)")
    assert it.check(t, [training_expect.backward_flops(1.5, 2.5, "")])[0][1:] == (
        "not applicable", "GEMM shapes not recorded (record_shapes=True)")


def with_attention(data):
    """hand_trace plus an attention op of four input shapes under a module's record_function, 105-140 µs, whose
    backward (autograd's thread, 320-380 µs) launches 25 µs of GPU work: names longer than the table's columns."""
    ev = data["traceEvents"]
    ev += [{"ph": "X", "cat": "user_annotation", "name": "model.layers.0.self_attn.attention_interface", "pid": 1,
            "tid": 1, "ts": 100, "dur": 50, "args": {}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_efficient_attention", "pid": 1, "tid": 1,
            "ts": 105, "dur": 35, "args": {"Input Dims": [[1, 4, 8, 16], [1, 4, 8, 16], [1, 4, 8, 16], [1, 4, 8, 8]]}},
           {"ph": "X", "cat": "cpu_op", "name": "ScaledDotProductEfficientAttentionBackward0", "pid": 1, "tid": 2,
            "ts": 320, "dur": 60, "args": {}},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 322, "dur": 2,
            "args": {"correlation": 99}},
           {"ph": "X", "cat": "kernel", "name": "fmha_cutlassB", "pid": 0, "tid": 7, "ts": 422, "dur": 25,
            "args": {"correlation": 99}},
           {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 9, "pid": 1, "tid": 1, "ts": 105},
           {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 9, "pid": 1, "tid": 2, "ts": 320, "bp": "e"}]
    return data


def test_a_backward_row_names_its_module_and_keeps_three_shapes(tmp_path):
    """The forward op's record_function (its module) and its first three input shapes; names cut to the columns:
    40 characters for the backward op, 32 for the forward op and its module (the last kept one an ellipsis)."""
    data = training.analyze(_load(tmp_path, with_attention(hand_trace())))
    attention = next(r for r in data["slowest_backward"] if r["backward_op"].startswith("ScaledDot"))
    assert attention == {"backward_op": "ScaledDotProductEfficientAttentionBackward0",
                         "forward_op": "aten::_scaled_dot_product_efficient_attention",
                         "forward_in": "model.layers.0.self_attn.attention_interface",
                         "forward_shapes": "[1, 4, 8, 16] x [1, 4, 8, 16] x [1, 4, 8, 16]", "calls_per_step": 1,
                         "us_per_step": 25, "us_per_call": 25}
    assert next(r for r in data["slowest_backward"] if r["backward_op"] == "MmBackward0")["forward_in"] is None
    row = next(ln for ln in "\n".join(training_text.text(data)).splitlines() if ln.startswith("ScaledDot"))
    cells = ["ScaledDotProductEfficientAttentionBackw…", "25.0", "1", "aten::_scaled_dot_product_effic…",
             "model.layers.0.self_attn.attent…", "[1, 4, 8, 16] x [1, 4, 8, 16] x [1, 4, 8, 16]"]
    assert [len(c) for c in cells[:1] + cells[3:5]] == [40, 32, 32]
    assert [c.strip() for c in re.split(r"\s{2,}", row)] == cells


def test_optimizer_ops_counted_and_named_by_hand(tmp_path):
    """One aten::_fused_adamw_ and two other ops (no foreach) in the optimizer: 3 ops, 1 fused, 2 others; fused.
    The fused guess holds while the others stay below per_param x params (2 < 3 x 2), not at it (2 < 2 x 1)."""
    data = hand_trace()
    for e in data["traceEvents"]:
        e["name"] = {"aten::_foreach_mul_": "aten::_fused_adamw_", "aten::_foreach_add_": "aten::add_"}.get(
            e["name"], e["name"])
    data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::mul_", "pid": 1, "tid": 1, "ts": 790,
                                "dur": 5, "args": {}})
    t = _load(tmp_path, data)
    o = training.analyze(t)["optimizer"]
    assert (o["ops"], o["foreach_ops"], o["fused_ops"], o["other_ops"], o["implementation"]) == (3, 0, 1, 2, "fused")
    assert it.check(t, [training_expect.optimizer_kind("fused", 2, 3)])[0][1] == "confirmed"
    assert it.check(t, [training_expect.optimizer_kind("fused", 1, 2)])[0][1:] == (
        "broken", "ProfilerStep#2: 3 ops (0 foreach, 1 fused, 2 others), 2 kernels (2 multi-tensor)")
    assert [training.implementation({"fused_ops": 0, "foreach_ops": 0, "other_ops": n}) for n in (0, 3)] == [
        "?", "for-loop"]


def test_missing_and_idle_phases_said_per_step(tmp_path):
    """No optimizer (no annotations, no Optimizer.step span): "no optimizer phase" from both guesses. On a GPU an
    optimizer that launched nothing has no GPU time though its CPU span is 280 µs: "no GPU time in optimizer"."""
    data = hand_trace(annotated=False)
    data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith("Optimizer.step")]
    t = _load(tmp_path, data)
    assert it.check(t, [training_expect.phases_present()])[0][1:] == ("broken", "ProfilerStep#2: no optimizer phase ")
    assert it.check(t, [training_expect.optimizer_kind("foreach", 1, 1)])[0][1:] == (
        "broken", "ProfilerStep#2: no optimizer phase")
    idle = hand_trace()
    idle["traceEvents"] = [e for e in idle["traceEvents"] if "multi_tensor" not in e["name"]]
    t = _load(tmp_path, idle)
    assert t.device == "cuda"
    assert it.check(t, [training_expect.phases_present()])[0][1:] == ("broken", "ProfilerStep#2: no GPU time in optimizer")


def test_forward_starts_where_zero_grad_ends_even_at_backwards_start(tmp_path):
    """Without annotations forward runs from zero_grad's end to the first autograd span (220 µs); a zero_grad that
    ends exactly there still counts (forward empty), one that ends after it does not (forward from the step's
    start)."""
    for zero_grad_end, forward in ((220, (220, 220)), (221, (0, 220))):
        data = hand_trace(annotated=False)
        for e in data["traceEvents"]:
            if e["name"].startswith("Optimizer.zero_grad"):
                e["ts"], e["dur"] = 200, zero_grad_end - 200
        st = _load(tmp_path, data).steps[0]
        assert training.phase_windows(st) == ({"forward": forward, "backward": (220, 410), "optimizer": (720, 980)},
                                              False)


MIB = 2**20


def test_memory_peak_between_phases_and_the_messages_in_mib(tmp_path):
    """A peak at 205 µs, after forward's annotation ends (200) and before backward's starts (210): "between
    phases". Then the expectation's own words, in MiB worked out by hand."""
    t = _load(tmp_path, cpu_trace_with_allocations([(15, 100), (205, 300), (300, -400)]))
    assert training.memory_peak(t) == [{"number": 2, "phase": "between phases", "peak_bytes": 400,
                                        "at_forward_end_bytes": 100}]
    # 1 MiB when forward ends, 4 MiB at the peak in backward: less than half held, broken for a plain MLP
    t = _load(tmp_path, cpu_trace_with_allocations([(15, MIB), (250, 3 * MIB), (300, -3 * MIB)]))
    assert it.check(t, [training_expect.peak_after_forward(False, 0)])[0][1:] == (
        "broken", "#2: peak 4.00 MiB in backward, 1.00 MiB held when forward ends")
    # the peak in the optimizer, 4 MiB (1 MiB held when forward ends, 3 more in the optimizer): with 1 MiB of
    # parameters, four parameter-sized tensors make it (gradients, a temporary, AdamW's two states): too few tokens
    # to judge; a byte less of parameters and the optimizer holds more than they explain: broken
    t = _load(tmp_path, cpu_trace_with_allocations([(150, MIB), (800, 3 * MIB)]))
    assert it.check(t, [training_expect.peak_after_forward(False, MIB)])[0][1:] == (
        "not applicable", "#2 peaks in the optimizer at 4.00 MiB, with 1.00 MiB held at forward's end: no more than 4x "
                          "the 1.00 MiB of parameters (gradients, optimizer temporaries and states), too few tokens "
                          "for activations to dominate")
    assert it.check(t, [training_expect.peak_after_forward(False, MIB - 1)])[0][1:] == (
        "broken", "#2: peak 4.00 MiB in optimizer, 1.00 MiB held when forward ends")
    # What `07_train_step.py --model tiny --layers 3 --batch 3 --seq 17 --dtype fp32` printed on a CPU: 0.81 MiB of
    # parameters, 1.06 MiB held when forward ends, the peak 1.61 MiB in the optimizer (gradients + foreach AdamW's
    # temporaries, twice the parameters). More held at forward's end than the parameters, yet nothing to judge.
    t = _load(tmp_path, cpu_trace_with_allocations([(150, round(1.06 * MIB)), (800, round(0.55 * MIB))]))
    assert it.check(t, [training_expect.peak_after_forward(False, round(0.81 * MIB))])[0][1] == "not applicable"


@pytest.mark.parametrize("mlp", ["eager", "liger", "fused", "fused-recompute"])
def test_flags_from_the_file_name_where_the_trace_says_nothing(mlp):
    """An inference trace (no optimizer, no MLP kernel of Liger's or ours, no backward): every flag comes from 07's
    file-name words, "ckpt" among them sets --checkpoint; without the words nothing but the defaults."""
    from test_inspect_trace import gpu_trace, parse

    t = parse(gpu_trace())
    a = types.SimpleNamespace()
    training_expect.train_flags(a, t, ["mlp-1L", "adamw-foreach", f"mlp-{mlp}", "ckpt", "bf16"])
    assert vars(a) == {"optimizer": "adamw", "optim_impl": "foreach", "mlp": mlp, "checkpoint": True,
                       "ops_per_parameter": 3}  # a trace's AdamW: its moments, denominator and update
    b = types.SimpleNamespace()
    training_expect.train_flags(b, t, ["mlp-1L", "sgd", "mlp-other", "bf16"])
    assert vars(b) == {"mlp": "eager", "checkpoint": False}


def test_memory_timeline_from_torchs_export_and_back(tmp_path):
    """torch's export ([times, sizes], each size a zero column then 8 categories) relabelled, the clock moved by
    the offset; each category's peak and the total's (10 + 20 MiB at 150 µs), written and read back."""
    M = 2**20
    rows = [[100.0, 200.0, 300.0], [[0, 10 * M, 0, 0, 0, 5 * M, 0, 0, 0], [0, 10 * M, 0, 0, 0, 20 * M, 0, 0, 0],
                                    [0, 10 * M, 0, 0, 0, 0, 3 * M, 0, 0]]]
    tl = memory_timeline.from_torch_export(rows, "cpu", 50.0)
    zeros = [0, 0, 0]
    assert tl == {"device": "cpu", "times_us": [50.0, 150.0, 250.0], "bytes": {
        "parameter": [10 * M] * 3, "optimizer_state": zeros, "input": zeros, "temporary": zeros,
        "activation": [5 * M, 20 * M, 0], "gradient": [0, 0, 3 * M], "autograd_detail": zeros, "unknown": zeros}}
    p = memory_timeline.peaks(tl)
    assert list(p["categories"].items()) == [("activation", 20 * M), ("parameter", 10 * M), ("gradient", 3 * M)]
    assert (p["total"], p["total_at_us"]) == (30 * M, 150.0)
    assert memory_timeline.peaks_text(tl) == ("memory by category (torch's memory profiler, cpu), each one's peak: "
                                              "activation 20.0 MiB, parameter 10.0 MiB, gradient 3.0 MiB\n"
                                              "  all together peak at 30.0 MiB")
    path = memory_timeline.write(tl, tmp_path / "run.memory.json")
    assert memory_timeline.load(path) == tl and (path.stat().st_mode & 0o777) == 0o644
    assert [q.name for q in tmp_path.iterdir()] == ["run.memory.json"]  # no temporary file left
    with pytest.raises(it.TraceError, match="cannot write"):
        memory_timeline.write(tl, tmp_path / "no" / "such" / "folder.json")
    for bad, said in (([[1.0], [[0] * 9], []], "is not \\[times, sizes\\]"),
                      ([[1.0, 2.0], [[0] * 9]], "rows are not a zero column and 8 categories"),
                      ([[1.0], [[0] * 8]], "rows are not a zero column and 8 categories")):
        with pytest.raises(it.TraceError, match=said):
            memory_timeline.from_torch_export(bad, "cpu")
    assert memory_timeline.peaks({"device": "cpu", "times_us": [], "bytes": {}}) == {
        "categories": {}, "total": 0, "total_at_us": None}


@pytest.mark.parametrize("data, said", [
    ({"times_us": "0", "bytes": {}}, "not a memory timeline"),
    ({"times_us": [0], "bytes": []}, "not a memory timeline"),
    ({"times_us": [0, "1"], "bytes": {}}, "odd values"),
    ({"times_us": [0, 1], "bytes": {"activation": [1]}}, "odd values"),
    ({"times_us": [0], "bytes": {"activation": [True]}}, "odd values"),
    ({"times_us": [0], "bytes": {"activation": "1"}}, "odd values"),
])
def test_a_hostile_memory_timeline_is_one_line(tmp_path, data, said):
    path = tmp_path / "x.memory.json"
    path.write_text(json.dumps(data))
    with pytest.raises(it.TraceError, match=said):
        memory_timeline.load(path)


def test_a_memory_timelines_long_names_are_cut(tmp_path):
    path = tmp_path / "x.memory.json"
    path.write_text(json.dumps({"device": "d" * 30, "times_us": [0], "bytes": {"c" * 50: [1]}}))
    tl = memory_timeline.load(path)
    assert tl["device"] == "d" * 20 and list(tl["bytes"]) == ["c" * 40]
    path.write_text(json.dumps({"times_us": [0], "bytes": {}}))
    assert memory_timeline.load(path)["device"] == "?"


@pytest.mark.parametrize("at, where", [(150, "in ProfilerStep#2's forward"), (200, "in ProfilerStep#2's forward"),
                                       (205, "in ProfilerStep#2"), (1000, "in ProfilerStep#2"),
                                       (1001, "outside the active steps")])
def test_the_memory_peak_is_placed_in_its_step_and_phase(tmp_path, at, where):
    """hand_trace's step spans 0-1000 µs, forward 10-200, backward 210-700 (both ends inside)."""
    tl = {"device": "cpu", "times_us": [at], "bytes": {"activation": [2**20]}}
    assert memory_timeline.peaks_text(tl, load_hand(tmp_path)).endswith(f"peak at 1.0 MiB, {where}")



def test_the_memory_picture_lines_up_with_the_phases(tmp_path, monkeypatch):
    """draw() over hand_trace: the curve's x data and the shaded phases, read off the figure's artists, in ms
    from the timeline's first point. The expected spans come from the trace's own annotations (a few lines over
    the raw JSON), so a curve drawn in another unit than the shading (s instead of ms: 1000x too short) fails.
    The other picture test reads only the peaks stored in the PNG, which no x axis changes."""
    from trace_reader.render import plot

    figs = []
    real_save = plot.save_png
    monkeypatch.setattr(memory_picture, "save_png",
                        lambda fig, path, data: (figs.append(fig), real_save(fig, path, data))[1])
    times = [10.0, 200.0, 210.0, 700.0, 710.0, 990.0]  # at the phases' edges, on the trace's clock (µs)
    tl = {"device": "cpu", "times_us": times, "bytes": {"activation": [2**20, 2 * 2**20, 0, 2**20, 0, 0]}}
    out = memory_picture.draw(tl, tmp_path / "m.png", load_hand(tmp_path))
    assert out.exists() and len(figs) == 1
    ax = figs[0].axes[0]
    t0 = times[0]
    ms = [(t - t0) / 1000 for t in times]  # 0, 0.19, 0.2, 0.69, 0.7, 0.98
    curve = {round(x, 9) for c in ax.collections for p in c.get_paths() for x in p.vertices[:, 0]}
    assert curve == {round(x, 9) for x in ms}
    spans = []
    for patch in ax.patches:  # axvspan: x in data units, y in the axes' own
        xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
        spans.append((round(min(xs), 9), round(max(xs), 9)))
    want = [(round((e["ts"] - t0) / 1000, 9), round((e["ts"] + e["dur"] - t0) / 1000, 9))
            for e in hand_trace()["traceEvents"] if e["name"] in ("forward", "backward", "optimizer")]
    assert sorted(spans) == sorted(want) == [(0.0, 0.19), (0.2, 0.69), (0.7, 0.98)]
    # each phase's edges are points of the curve: the two lie on one axis
    assert all(lo in curve and hi in curve for lo, hi in spans)

# ---------------------------------------------------------------------------- the foreign H200 training traces

def truth(path):
    """Per step, from the raw JSON: GPU work launched inside Optimizer.step# (its kernels' names), the AccumulateGrad
    spans, the fwdbwd pairs whose backward end lies in the step, and the backward and forward GEMM FLOPs."""
    events = raw(path)
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
               and "correlation" in e.get("args", {})}
    work = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
            and e["args"].get("correlation") in runtime]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    ends = [e for e in events if e.get("cat") == "fwdbwd" and e["ph"] == "f"]
    out = []
    for s in sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")),
                    key=lambda e: e["ts"]):
        def within(e, a=s["ts"], b=s["ts"] + s["dur"]):
            return a <= e["ts"] <= b
        opt = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#") and within(e))
        in_opt = [k for k in work if opt["ts"] <= runtime[k["args"]["correlation"]]["ts"] <= opt["ts"] + opt["dur"]]
        bwd = [e for e in ops if within(e) and e["name"].startswith("autograd::engine::evaluate_function: ")]
        b0, b1 = min(e["ts"] for e in bwd), max(e["ts"] + e["dur"] for e in bwd)
        zero = max(e["ts"] + e["dur"] for e in events if e.get("cat") == "user_annotation" and within(e)
                   and e["name"].startswith("Optimizer.zero_grad#"))

        def flops(a, b):
            mms = [e for e in ops if e["name"] == "aten::mm" and a <= e["ts"] <= b]
            if not all("Input Dims" in e["args"] for e in mms):
                return None
            return sum(2 * d[0][0] * d[0][1] * d[1][1] for d in (e["args"]["Input Dims"] for e in mms))
        out.append({"optimizer_kernels": [k["name"] for k in in_opt if k["cat"] == "kernel"],
                    "optimizer_us": sum(k["dur"] for k in in_opt),
                    "gradients": sum(e["name"].endswith("torch::autograd::AccumulateGrad") for e in bwd),
                    "links": sum(within(e) for e in ends),
                    "flops": (flops(zero, b0), flops(b0, b1))})
    return out


@pytest.mark.parametrize("name, impl", [("h200_foreign_mlp_train_adamw", "foreach"),
                                        ("h200_foreign_llama2_train_forloop", "for-loop")])
def test_foreign_h200_training_traces(name, impl):
    path = FOREIGN / f"{name}.json.gz"
    truths = truth(path)
    data = training.analyze(it.load_trace(path))
    assert data["phases_from"] == "torch.optim and autograd spans"
    assert data["optimizer"]["implementation"] == impl and data["optimizer"]["class"] == "AdamW"
    for s, want in zip(data["steps"], truths, strict=True):
        o = s["optimizer"]
        assert o["kernels"] == len(want["optimizer_kernels"])
        assert o["multi_tensor_kernels"] == sum("multi_tensor_apply" in k for k in want["optimizer_kernels"])
        assert o["gradients"] == want["gradients"]
        assert s["phases"]["optimizer"]["gpu_us"] == pytest.approx(want["optimizer_us"])
        fwd, bwd = want["flops"]
        assert (s["phases"]["forward"]["gemm_flops"], s["phases"]["backward"]["gemm_flops"]) == (fwd, bwd)
    assert data["links_per_step"] == sum(w["links"] for w in truths) / len(truths)
    if impl == "foreach":  # the other harness's input needs no gradient: 4 backward GEMMs for 3 forward ones
        assert data["backward_over_forward_flops"] == pytest.approx(4 / 3)
        assert data["optimizer"]["kernels"] == data["optimizer"]["multi_tensor_kernels"] > 0
    else:  # 21 parameters, 8 kernels each in torch 2.11's for-loop AdamW; no shapes were recorded
        assert data["optimizer"]["gradients"] == 21 and data["optimizer"]["kernels"] == 8 * 21
        assert data["backward_over_forward_flops"] is None
        t = it.load_trace(path)  # 189 other ops and 168 kernels a step: 8 per parameter passes, 9 does not
        assert it.check(t, [training_expect.optimizer_kind("for-loop", 21, 8)])[0][1] == "confirmed"
        assert it.check(t, [training_expect.optimizer_kind("for-loop", 21, 9)])[0][1] == "broken"


def test_foreign_slowest_backward_op_by_hand():
    """The MLP trace's slowest backward op and its forward op, found from the raw JSON: follow each fwdbwd pair's
    "f" end to the op starting there, add up the GPU work whose launch lies inside that op on its thread."""
    path = FOREIGN / "h200_foreign_mlp_train_adamw.json.gz"
    events = raw(path)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
               and "correlation" in e.get("args", {})}
    kernels = [(runtime[k["args"]["correlation"]], k) for k in events  # GPU work: memsets count too
               if k.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and k["args"].get("correlation") in runtime]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    flows = {}
    for f in (e for e in events if e.get("cat") == "fwdbwd"):
        flows.setdefault(f["id"], {})[f["ph"]] = f
    per_pair = {}
    for ends in flows.values():
        f, s = ends["f"], ends["s"]
        if not any(st["ts"] <= f["ts"] <= st["ts"] + st["dur"] for st in steps):
            continue
        bop = next(o for o in ops if (o["tid"], o["ts"]) == (f["tid"], f["ts"]))
        fop = min((o for o in ops if (o["tid"], o["ts"]) == (s["tid"], s["ts"])), key=lambda o: o["dur"])
        us = sum(k["dur"] for r, k in kernels if r["tid"] == bop["tid"] and bop["ts"] <= r["ts"] <= bop["ts"] + bop["dur"])
        key = (bop["name"], fop["name"], json.dumps(fop["args"].get("Input Dims")))
        per_pair[key] = per_pair.get(key, 0.0) + us
    top_key, top_us = max(per_pair.items(), key=lambda kv: kv[1])
    top = training.analyze(it.load_trace(path))["slowest_backward"][0]
    assert (top["backward_op"], top["forward_op"]) == top_key[:2]
    assert top["forward_shapes"] == " x ".join(str(d) for d in json.loads(top_key[2]) if d)
    assert top["us_per_step"] == pytest.approx(top_us / len(steps))


# ------------------------------------------------------------------------------------------- on a CUDA GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("impl", list(train07.IMPLEMENTATIONS))
def test_gpu_optimizer_kernels(tmp_path, impl):
    """Each AdamW on the GPU: all five guesses confirmed; for-loop launches >= 3 kernels per parameter, foreach and
    fused only multi-tensor kernels (counted again here from the trace's plain JSON)."""
    code, out, err, trace = run(tmp_path, "--batch", "8", "--seq", "128", "--optim-impl", impl, device="cuda")
    assert code == 0, err
    assert verdicts(out) == {k: "ok" for k in verdicts(out)} and len(verdicts(out)) == 5, out[-3000:]
    events = raw(trace)
    runtime = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
               and "correlation" in e.get("args", {})}
    opt = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "optimizer"]
    names = [[k["name"] for k in events if k.get("cat") == "kernel" and o["ts"] <= runtime.get(
        k["args"].get("correlation"), -1) <= o["ts"] + o["dur"]] for o in opt]
    for step in names:
        if impl == "for-loop":
            assert len(step) >= 3 * 3  # three weights
        else:
            assert step and all("multi_tensor_apply" in n for n in step), step


@cuda
def test_gpu_memory_snapshot_and_pictures(tmp_path):
    code, out, err, trace = run(tmp_path, "--batch", "8", "--seq", "128", "--memory", device="cuda")
    assert code == 0, err
    stem = trace.name.removesuffix(".json")
    snapshot = trace.with_name(stem + ".snapshot.pickle")
    assert snapshot.stat().st_size > 0 and stat.S_IMODE(snapshot.stat().st_mode) == 0o644
    assert "https://pytorch.org/memory_viz" in out and "python -m torch.cuda._memory_viz trace_plot" in out
    assert trace.with_name(stem + ".memory.png").exists()


def test_the_offline_snapshot_viewer_exists():
    """The command a GPU run prints to open its snapshot offline: python -m torch.cuda._memory_viz trace_plot."""
    import torch.cuda._memory_viz as viz

    assert callable(viz.trace_plot)


def test_backward_annotation_holds_the_autograd_threads_kernels():
    """`with record_function("backward"): loss.backward()` runs on the step's thread while the autograd engine
    launches the kernels from its own: the annotation's GPU time is the work launched during it, on any thread
    (checked against the raw JSON: launches inside the span's window, joined to GPU work by correlation id)."""
    path = Path(__file__).parent / "data" / "train" / "h200_train_mlp_foreach.json.gz"
    data = json.loads(gzip.decompress(path.read_bytes()))
    ev = data["traceEvents"]
    gpu = {e["args"]["correlation"]: e["dur"] for e in ev
           if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "correlation" in e.get("args", {})}
    launches = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in gpu]
    spans = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "backward"),
                   key=lambda e: e["ts"])
    truth = [sum(gpu[e["args"]["correlation"]] for e in launches if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
             for s in spans]
    assert len(truth) == 3 and min(truth) > 400  # the MLP's backward: six GEMMs and the pointwise grads
    per = it.gpu_time_by_annotation(it.load_trace(path))
    assert per["backward"] == pytest.approx(truth, rel=1e-9)


def _phase_gpu(name: str) -> dict[str, tuple[float, float]]:
    """Per phase of a committed H200 training trace: (median GPU µs, median kernels) over its steps, from the raw
    JSON: GPU work whose launch falls inside the phase's record_function span (any thread)."""
    data = json.loads(gzip.decompress((TRAIN / f"h200_train_{name}.json.gz").read_bytes()))
    ev = data["traceEvents"]
    gpu = {e["args"]["correlation"]: e for e in ev
           if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "correlation" in e.get("args", {})}
    launches = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in gpu]
    out = {}
    for phase in ("forward", "backward", "optimizer"):
        per_step = []
        for s in (e for e in ev if e.get("cat") == "user_annotation" and e["name"] == phase):
            inside = [gpu[e["args"]["correlation"]] for e in launches if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            per_step.append((sum(g["dur"] for g in inside), sum(g["cat"] == "kernel" for g in inside)))
        out[phase] = (sorted(u for u, _ in per_step)[len(per_step) // 2],
                      sorted(k for _, k in per_step)[len(per_step) // 2])
    return out


TRAIN = Path(__file__).parent / "data" / "train"


def test_docs_h200_numbers_are_the_committed_traces():
    """docs/07_train_step.md's H200 table and memory peaks, re-derived from tests/data/train."""
    page = " ".join((Path(__file__).parent.parent / "docs" / "07_train_step.md").read_text().split())
    for impl, name in (("for-loop", "mlp_forloop"), ("foreach", "mlp_foreach"), ("fused", "mlp_fused")):
        p = _phase_gpu(name)
        row = (f"| {impl} | {p['forward'][0]:.1f} | {p['backward'][0]:.1f} | {p['optimizer'][0]:.1f} | "
               f"{p['optimizer'][1]} |")
        assert row in page, row
    fl, fe = _phase_gpu("mlp_forloop")["optimizer"], _phase_gpu("mlp_foreach")["optimizer"]
    assert fe[0] > fl[0] and fe[1] < fl[1]  # the mismatch the page points at
    assert f"({fe[0]:.1f} against {fl[0]:.1f} µs)" in page
    for name, label in (("mlp4_memory", "peaks at"), ("mlp4_ckpt_memory", "`--checkpoint` at")):
        t = json.loads((TRAIN / f"h200_train_{name}.memory.json").read_text())
        total = max(sum(v[i] for v in t["bytes"].values()) for i in range(len(t["times_us"])))
        act = max(t["bytes"]["activation"])
        assert f"{label} {total / 2**20:,.1f} MiB" in page and f"activations {act / 2**20:,.1f} MiB" in page


def test_comparing_two_training_steps_shows_each_phase():
    """inspect_trace.py A B on two training traces: each phase's GPU µs and kernels side by side (the raw JSON's
    numbers, _phase_gpu), and each optimizer's implementation; a forward-only trace beside one leaves it out."""
    from trace_reader.comparison import compare

    a, b = (it.load_trace(TRAIN / f"h200_train_mlp_{n}.json.gz") for n in ("forloop", "foreach"))
    text = compare_text.compare(a, b)
    pa, pb = _phase_gpu("mlp_forloop"), _phase_gpu("mlp_foreach")
    lines = text.splitlines()
    for phase in ("forward", "backward", "optimizer"):
        (ua, ka), (ub, kb) = pa[phase], pb[phase]
        change = f"{100 * (ub - ua) / ua:+.0f}%"
        row = next(line.split() for line in lines if line.startswith(phase + " "))
        assert row == [phase, f"{ua:,.1f}", f"{ub:,.1f}", change, str(ka), str(kb)], row
    assert "optimizer A: AdamW, looks for-loop" in text and "optimizer B: AdamW, looks foreach" in text
    data = compare.comparison_data(a, b)["training"]
    assert data["a"]["phases"]["optimizer"]["gpu_us"] == pytest.approx(pa["optimizer"][0], rel=1e-9)
    forward_only = it.load_trace(Path(__file__).parent / "data" / "h200_mlp_eager.json.gz")
    assert compare.comparison_data(forward_only, b)["training"] is None
    assert "phase by phase" not in compare_text.compare(forward_only, b)


@pytest.mark.profiles  # the module's runs record profiles
def test_comparing_two_cpu_training_steps(runs):
    """On CPU traces the phases compare by CPU µs: each annotation's duration, median over the steps (raw JSON),
    and no kernel columns."""

    def phase_us(path, phase):
        spans = sorted(e["dur"] for e in raw(path) if e.get("cat") == "user_annotation" and e.get("name") == phase)
        return spans[len(spans) // 2]

    a, b = runs["plain"][3], runs["checkpoint"][3]
    text = compare_text.compare(it.load_trace(a), it.load_trace(b))
    assert "(CPU µs per step, median over the steps)" in text and "kernels A" not in text
    for phase in ("forward", "backward", "optimizer"):
        ua, ub = phase_us(a, phase), phase_us(b, phase)
        row = next(line.split() for line in text.splitlines() if line.startswith(phase + " "))
        # The reader measures a span as end - start of its float timestamps: a dur of 988.35 in the JSON can come
        # back 988.3499..., printed 988.3 where 988.35 prints 988.4. Equal to the printed digit, then.
        assert row[0] == phase and row[3].endswith("%"), row
        for printed, us in zip(row[1:3], (ua, ub)):
            assert abs(float(printed.replace(",", "")) - us) <= (0.05 if us < 1e3 else 0.5) + 1e-6, (row, us)
            assert ("." in printed) == (us < 1e3), row  # one decimal below 1,000 µs, none from there
        assert abs(int(row[3][:-1]) - 100 * (ub - ua) / ua) <= 0.5 + 1e-6, row


# ----------------------------------------------------------------- inspect_trace.py --expect 07_train_step

LOG = TRAIN / "h200_train_record_log.txt"


def expect_cli(trace, capsys):
    """(exit code, stdout, stderr) of `inspect_trace.py --expect 07_train_step TRACE`."""
    code = it.main(["--expect", "07_train_step", str(trace)])
    out, err = capsys.readouterr()
    return code, out, err


def logged_runs():
    """{fixture name: (what the run printed about its model, its printed expectation lines)} from the recording's
    log: the script's own words at the time of the run, the truth --expect must read back from each trace."""
    runs, name = {}, None
    for line in LOG.read_text().splitlines():
        if line.startswith("=== "):
            name = line[4:].split(":")[0]
            runs[name] = ["", []]
        elif name and line.startswith("model: "):
            runs[name][0] = line
        elif name and line.startswith(("  ok ", "  BROKEN ", "  n/a ")):
            runs[name][1].append(line)
    return runs


def said(model_line):
    """'adamw foreach, MLP eager[, checkpointed], N parameter tensors' from the run's 'model: ...' line."""
    head, tail = model_line.split("; ")
    return f"{tail}, {head.split(', ')[-1].split(' (')[0]}"


def expect_lines(stdout):
    return [ln for ln in stdout.splitlines() if ln.startswith(("  ok ", "  BROKEN ", "  n/a "))]


@pytest.mark.parametrize("name", ["mlp_forloop", "mlp_foreach", "mlp_fused", "mlp_compile", "mlp4_ckpt_memory",
                                  "gemma_2l"])
def test_expect_reads_each_h200_run_back(name, capsys):
    """Each committed training trace under --expect: the flags and parameter count the run printed, and its very
    verdicts (the H200 run's own printout, in the recording's log)."""
    model_line, printed = logged_runs()[name]
    code, out, err = expect_cli(TRAIN / f"h200_train_{name}.json.gz", capsys)
    mode = "compile" if name.endswith("compile") else "eager"
    assert (code, err) == (0, "")
    assert f"07_train_step {mode}, {said(model_line)}, 3 steps (read from the trace)" in out, model_line
    assert expect_lines(out) == printed and len(printed) == 5


def test_expect_when_torch_recorded_no_shapes_for_the_optimizers_long_tensor_lists(tmp_path, capsys):
    """torch records no shapes for a long tensor list (a Gemma-2B of 18 layers: 164 tensors, every list `[]`; the
    2-layer run's 20 were recorded). The 2-layer trace with its optimizer's lists emptied so: the parameters are
    every leaf given a gradient, 20 of Gemma's shapes in bf16, counted here from the model's widths; the verdicts
    are the run's own (the optimizer's was BROKEN "for all 0 parameters" before)."""
    data = json.loads(gzip.decompress((TRAIN / "h200_train_gemma_2l.json.gz").read_bytes()))
    emptied = 0
    for e in data["traceEvents"]:
        args = e.get("args") or {}
        if e.get("cat") == "cpu_op" and e["name"].startswith(("aten::_foreach_", "aten::_fused_")):
            args["Input Dims"] = [[] if t == "TensorList" else d for d, t in zip(args["Input Dims"], args["Input type"])]
            emptied += 1
    assert emptied > 0
    path = tmp_path / "gemma-2b-2L_1x64_adamw-foreach_mlp-eager_bf16_cold_eager.json"
    path.write_text(json.dumps(data))
    d, kv, h, vocab = 2048, 256, 16384, 32000  # Gemma-2B: q and o d x d, k and v one 256-wide head, two norms
    layer = 2 * d * d + 2 * kv * d + 3 * d * h + 2 * d
    assert training.parameters(it.load_trace(path)) == (1 + 2 * 9 + 1, 2 * (vocab * d + 2 * layer + d))
    model_line, printed = logged_runs()["gemma_2l"]
    code, out, _ = expect_cli(path, capsys)
    assert code == 0 and expect_lines(out) == printed


@pytest.mark.parametrize("name", ["mlp_forloop", "mlp4_ckpt_memory"])
def test_expect_without_the_file_name(name, tmp_path, capsys):
    """Renamed, the trace alone tells the run: the optimizer from its ops, --checkpoint from the nn.Linear
    forwards rebuilt inside backward."""
    model_line, printed = logged_runs()[name]
    renamed = tmp_path / "trace.json.gz"
    renamed.write_bytes((TRAIN / f"h200_train_{name}.json.gz").read_bytes())
    code, out, _ = expect_cli(renamed, capsys)
    assert code == 0 and f"07_train_step eager, {said(model_line)}, 3 steps" in out
    assert expect_lines(out) == printed


@pytest.mark.profiles  # the module's runs record profiles
def test_expect_on_the_cpu_runs(runs, tmp_path, capsys):
    """The two tiny CPU runs: --expect gives the verdicts the run printed, from the file name or without it."""
    for key, (_, printed, _, trace) in runs.items():
        renamed = tmp_path / f"{key}.json"
        renamed.write_bytes(trace.read_bytes())
        for path in (trace, renamed):
            code, out, _ = expect_cli(path, capsys)
            ckpt = ", checkpointed" if key == "checkpoint" else ""
            assert code == 0 and f"adamw foreach, MLP eager{ckpt}, 6 parameter tensors, 3 steps" in out, out[-500:]
            assert expect_lines(out) == expect_lines(printed.split("Expectations (guess first", 1)[1])


@pytest.mark.parametrize("name, params, verdicts_", [
    # no shapes: the FLOPs guess cannot be looked at; no annotations, no memory events
    ("h200_foreign_llama2_train_forloop", 21, ["n/a", "ok", "n/a", "ok", "n/a"]),
    # its input wants no gradient: 4 backward GEMMs for 3 forward ones, 1.33x, below the guess: a finding
    ("h200_foreign_mlp_train_adamw", 3, ["n/a", "ok", "BROKEN", "ok", "n/a"])])
def test_expect_on_foreign_training_traces(name, params, verdicts_, capsys):
    """Another harness's traces: what cannot apply there (the suite's annotations, memory events, shapes) says
    n/a; the optimizer and the phases are checked as on the suite's own."""
    code, out, err = expect_cli(FOREIGN / f"{name}.json.gz", capsys)
    impl = "for-loop" if "forloop" in name else "foreach"
    assert f"07_train_step eager, adamw {impl}, MLP eager, {params} parameter tensors" in out
    assert [ln.split()[0] for ln in expect_lines(out)] == verdicts_
    assert code == (1 if "BROKEN" in verdicts_ else 0) and err == ""
    if "BROKEN" in verdicts_:
        assert "1.33x, 1.33x, 1.33x" in out


def accumulate(tid, ts, dims=None, dtype="c10::BFloat16"):
    """A leaf's AccumulateGrad in backward, its inner op carrying the gradient's shape when `dims` is given."""
    inner = {} if dims is None else {"Input Dims": [dims], "Input type": [dtype]}
    return [{"ph": "X", "cat": "cpu_op", "name": training.ACCUMULATE_GRAD, "pid": 1, "tid": tid, "ts": ts, "dur": 10,
             "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": training.ACCUMULATE_OP, "pid": 1, "tid": tid, "ts": ts + 1, "dur": 8,
             "args": inner}]


def test_parameters_by_hand(tmp_path):
    """The leaves given a gradient, less those the optimizer never touches: a [16, 32] bf16 weight the foreach
    ops update and an [8, 16] input they do not -> 1 parameter of 16 * 32 * 2 bytes; the input's shape among the
    optimizer's -> 2; without recorded shapes every leaf counts, bytes unknown."""
    def params(leaves, opt_dims):
        data = hand_trace()
        data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != training.ACCUMULATE_GRAD]
        for e in data["traceEvents"]:
            if e.get("name") == "aten::_foreach_mul_":
                e["args"]["Input Dims"] = [opt_dims, []]
        for i, dims in enumerate(leaves):
            data["traceEvents"] += accumulate(2, 400 + 20 * i, dims)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(data))
        return training.parameters(it.load_trace(path))

    assert params([[16, 32], [8, 16]], [[16, 32]]) == (1, 16 * 32 * 2)
    assert params([[16, 32], [8, 16]], [[16, 32], [8, 16]]) == (2, 16 * 32 * 2 + 8 * 16 * 2)
    assert params([[16, 32], None], [[16, 32]]) == (2, None)
    assert params([], [[16, 32]]) is None


def test_expect_on_a_synthetic_trace_and_what_it_cannot_tell(tmp_path, capsys):
    """The hand-built step without annotations (another harness's): foreach AdamW, 1 leaf, no shapes on it; then
    with an optimizer 07_train_step does not know: one line, exit 2."""
    data = hand_trace(annotated=False)
    path = tmp_path / "step.json"
    path.write_text(json.dumps(data))
    code, out, _ = expect_cli(path, capsys)
    assert code == 0 and "07_train_step eager, adamw foreach, MLP eager, 1 parameter tensors, 1 steps" in out
    assert [ln.split()[0] for ln in expect_lines(out)] == ["n/a", "ok", "ok", "ok", "n/a"]
    for e in data["traceEvents"]:
        if e.get("name", "").startswith("Optimizer."):
            e["name"] = e["name"].replace("AdamW", "Adagrad")
    path.write_text(json.dumps(data))
    code, out, err = expect_cli(path, capsys)
    assert code == 2 and err == ("inspect_trace.py: error: 07_train_step's expectations need --optimizer, which "
                                 "this trace does not say\n")


# ---- SwiGLU: a Llama-shaped model, and the MLPs by activation -------------------------------------------------

def test_a_swiglu_model_trains_on_the_cpu(tmp_path):
    """--model tiny-llama (06_model.py's Llama preset, a SwiGLU MLP): every guess checkable on a CPU confirmed; its
    MLPs call SiLU (aten::silu in every step's forward, by the trace's plain json), never GeLU."""
    code, out, err, trace = run(tmp_path, "--model", "tiny-llama", "--batch", "2", "--seq", "32", "--dtype", "fp32")
    assert code == 0, err
    assert "model: tiny-llama, 2 layers" in out and "BROKEN" not in verdicts(out).values(), out[-3000:]
    assert trace.name.startswith("tiny-llama-2L_2x32_adamw-foreach_mlp-eager")
    events = [e for e in raw(trace) if e.get("ph") == "X"]
    forwards = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "forward"]
    for f in forwards:
        inside = [e["name"] for e in events if e.get("cat") == "cpu_op" and f["ts"] <= e["ts"] <= f["ts"] + f["dur"]]
        assert inside.count("aten::silu") == 2 and "aten::gelu" not in inside  # one per layer's MLP
    assert len(forwards) == 3


@pytest.mark.parametrize("mlp", ["fused", "fused-recompute", "liger"])
def test_a_swiglu_model_with_a_triton_mlp_is_refused_on_a_cpu(tmp_path, mlp):
    code, out, err, trace = run(tmp_path, "--model", "tiny-llama", "--mlp", mlp)
    assert (code, out, trace) == (2, "", None)
    assert err == f"07_train_step.py: error: --mlp {mlp} runs a Triton kernel, which needs a CUDA GPU; on this machine use --mlp eager\n"


def test_the_models_are_the_post_mlp_and_06s_presets():
    assert train07.MODELS == ("mlp", *importlib.import_module("06_model").PRESETS)


def test_the_eager_and_swapped_mlps_by_activation():
    """eager_mlp: the post's SimpleGeGLUMLP, or transformers' LlamaMLP for SiLU; swapped gives the fused module of the
    same activation with the eager one's weights (the same output: here PyTorch's ops on the CPU), and Liger's own
    class per activation (built, not run: its kernels need a GPU)."""
    from transformers.models.llama.modeling_llama import LlamaMLP
    from fused_geglu import FusedGatedMLP

    torch.manual_seed(0)
    x = torch.randn(3, 5, 24)
    for act, eager_type, liger_type in (("gelu_tanh", train07.SimpleGeGLUMLP, "LigerGEGLUMLP"),
                                        ("silu", LlamaMLP, "LigerSwiGLUMLP")):
        eager = train07.eager_mlp(24, 40, act)
        assert type(eager) is eager_type
        for kind, recompute in (("fused", False), ("fused-recompute", True)):
            fused = train07.swapped(kind, eager, 24, 40, act)
            assert type(fused) is FusedGatedMLP and (fused.activation, fused.recompute) == (act, recompute)
            with torch.no_grad():
                torch.testing.assert_close(fused(x), eager(x))
        liger = train07.swapped("liger", eager, 24, 40, act)
        assert type(liger).__name__ == liger_type and torch.equal(liger.up_proj.weight, eager.up_proj.weight)
    with torch.no_grad():  # the two eager MLPs differ only in the activation
        silu, gelu = train07.eager_mlp(24, 40, "silu"), train07.eager_mlp(24, 40)
        gelu.load_state_dict(silu.state_dict())
        wg, wu, wd = silu.gate_proj.weight, silu.up_proj.weight, silu.down_proj.weight
        torch.testing.assert_close(silu(x), (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T)
        torch.testing.assert_close(gelu(x), (F.gelu(x @ wg.T, approximate="tanh") * (x @ wu.T)) @ wd.T)


@cuda
@pytest.mark.parametrize("mlp", ["eager", "liger", "fused", "fused-recompute"])
def test_gpu_a_swiglu_model_trains_with_each_mlp(tmp_path, mlp):
    code, out, err, _ = run(tmp_path, "--model", "tiny-llama", "--batch", "4", "--seq", "128", "--mlp", mlp,
                            device="cuda")
    assert code == 0, err
    assert "BROKEN" not in verdicts(out).values() and "ok" in verdicts(out).values(), out[-3000:]
