"""inspect_trace.py against real traces: CPU traces recorded here, H200 traces committed under tests/data,
and small hand-built GPU traces (kineto's format) where a case has to be forced (a missing query, a view
that launches a kernel, a device torch's table does not know)."""

import copy
import dataclasses
import gzip
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import fused_cpp
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from trace_reader.reading import events as trace_events
import inspect_trace as it
from trace_reader.reading import files as read
from trace_reader.facts.kernels import short

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


# ---------------------------------------------------------------------------------------------- CPU traces

# The post's MLP, as 03_simple_mlp.py defines it.
GeGLU = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP


def record(fn, path, device="cpu"):
    """fn profiled as the scripts do (wait 1, warm-up 1, 3 active steps in an 'mlp_fwd' span), exported to path."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=3), record_shapes=True) as prof:
        for _ in range(5):
            with record_function("mlp_fwd"):
                fn()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """Eager and compiled CPU traces of the GeGLU MLP at a tiny shape, recorded once for the module."""
    out = tmp_path_factory.mktemp("cpu")
    torch.manual_seed(0)
    model = GeGLU(32, 64).to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = record(lambda: model(x), out / "eager.json")
        torch._dynamo.reset()
        with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
            compiled = torch.compile(model)
            compiled(x)  # compile outside the trace
            comp = record(lambda: compiled(x), out / "compile.json")
    traces = {"eager": it.load_trace(eager), "compile": it.load_trace(comp), "dir": out}
    traces["fused"] = fused_cpp(e.name for st in traces["compile"].steps for e in st.spans)
    return traces


def test_cpu_trace_steps_and_tree(cpu):
    t = cpu["eager"]
    # On a GPU machine kineto lists the GPU even for a CPU-only profile: the name may be there, the device is "cpu".
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert t.device == "cpu" and t.device_name in {None, gpu}
    assert [s.number for s in t.steps] == [2, 3, 4]
    for st in t.steps:
        mms = st.ops({"aten::mm"})
        assert len(mms) == 3
        # aten::mm sits under matmul under linear: the tree was rebuilt from timestamps
        assert all(m.parent.name == "aten::matmul" and m.parent.parent.name == "aten::linear" for m in mms)
        assert [e.name for e in it.cpu_kernels(st)] == ["aten::mm", "aten::mm", "aten::gelu", "aten::mul", "aten::mm"]


def test_cpu_report_shows_ops_and_fused_cpp_kernel(cpu):
    eager, comp = it.report(cpu["eager"]), it.report(cpu["compile"])
    assert "CPU only" in eager and "self µs/step" in eager
    assert "aten::gelu" in eager and cpu["fused"] not in eager
    assert cpu["fused"] in comp and "Inductor C++ kernels: " + cpu["fused"] in comp
    assert "GPU work" not in comp
    data = it.report_data(cpu["compile"])
    assert [w["name"] for w in data["cpu_work"]] == ["aten::mm", "aten::mm", cpu["fused"], "aten::mm"]
    assert data["kernels"] == [] and data["typical_step"] is None and len(data["steps"]) == 3


def test_compare_cpu_eager_vs_compiled(cpu):
    m = it.match(cpu["eager"], cpu["compile"])
    assert m.same == ["aten::mm"]
    assert m.only_a == m.only_b == []  # gone and new, but each in the replaced group: counted there, once
    # between the second and third GEMM (the anchors), GeLU + mul became the one C++ kernel
    assert m.replaced == [(["aten::gelu", "aten::mul"], [cpu["fused"]])]
    assert m.ops_gone["aten::t"] == 3 and "aten::linear" in m.ops_gone
    assert "TorchDynamo Cache Lookup" in m.ops_new and "aten::mm" not in m.ops_new
    text = it.compare(cpu["eager"], cpu["compile"])
    assert "Replaced" in text and "aten::gelu + aten::mul" in text


def test_expectations_on_cpu_traces(cpu):
    exps = [it.steps(3, "mlp_fwd"), it.cpu_op("aten::t", present=False), it.cpu_event(r"cpp_fused.*gelu_mul"),
            it.kernels_per_step(4), it.occupancy_before_gemms(), it.bound("compute"), it.cpu_op("aten::mm", per_step=3)]
    verdicts = [v for _, v, _ in it.check(cpu["compile"], exps)]
    assert verdicts == ["confirmed"] * 3 + ["not applicable"] * 3 + ["confirmed"]
    eager = it.check(cpu["eager"], exps)
    assert [v for _, v, _ in eager][:3] == ["confirmed", "broken", "broken"]
    assert eager[1][2] == "'aten::t' per step: [3, 3, 3]"
    assert it.check(cpu["eager"], [it.steps(2, "mlp_fwd")])[0][1] == "broken"
    assert it.check(cpu["eager"], [it.steps(3, "linear_fwd")])[0][1] == "broken"


def test_cpu_profile_on_a_gpu_machine_is_a_cpu_trace(cpu, tmp_path):
    """kineto lists the machine's GPUs even when only CPU activity was profiled."""
    data = json.loads((cpu["dir"] / "eager.json").read_text())
    data["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}]
    t = parse(data)
    assert t.device == "cpu"
    assert it.check(t, [it.kernels_per_step(5)])[0][1] == "not applicable"
    assert "CPU only (no GPU activity in the trace; the machine has NVIDIA H200" in it.report(t)


def test_runtime_calls_without_a_launch_leave_a_cpu_trace_on_the_cpu(cpu):
    """CUDA runtime calls that launch nothing leave a CPU trace a CPU trace; one launch makes it a GPU trace."""
    data = json.loads((cpu["dir"] / "eager.json").read_text())
    step = next(e for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    call = {"ph": "X", "cat": "cuda_runtime", "name": "cudaGetDevice", "pid": step["pid"], "tid": step["tid"],
            "ts": step["ts"] + 1, "dur": 1, "args": {"correlation": 1}}
    data["traceEvents"] += [call, {**call, "name": "cudaStreamIsCapturing", "ts": step["ts"] + 3}]
    t = parse(data)
    assert t.device == "cpu" and "CPU only" in it.report(t)
    data["traceEvents"].append({**call, "name": "cudaLaunchKernel", "ts": step["ts"] + 5})
    assert parse(data).device == "cuda"


def test_a_check_that_raises_is_broken_not_a_crash(cpu):
    def boom(trace):
        raise KeyError("no such thing")

    ok = it.Expect("always", lambda t: True)
    [(_, v1, _), (_, v2, d2), (_, v3, d3)] = it.check(cpu["eager"], [ok, it.Expect("boom", boom),
                                                                    it.Expect("none", lambda t: None)])
    assert (v1, v2, v3) == ("confirmed", "broken", "broken")
    assert "KeyError" in d2 and "no such thing" in d2 and "None" in d3
    [(_, verdict, detail)] = it.check(cpu["eager"], [it.Expect("typo", lambda t: True, device="gpu")])
    assert verdict == "broken" and "'gpu'" in detail


def test_print_expectations_highlights_broken_without_colour_in_a_pipe(cpu):
    buf = io.StringIO()
    results = it.check(cpu["eager"], [it.steps(3, "mlp_fwd"), it.cpu_op("aten::t", present=False),
                                      it.kernels_per_step(5)])
    broken = it.print_expectations(results, file=buf)
    text = buf.getvalue()
    assert broken == 1
    assert "BROKEN" in text and "look here" in text and "'aten::t' per step: [3, 3, 3]" in text
    assert "n/a" in text and "\x1b[" not in text


# ---------------------------------------------------------------------------------- hand-built GPU traces

GEMM_A = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
GEMM_B = "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT"
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >")
MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
       "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >")
BF = "c10::BFloat16"


def gpu_trace(steps=3, m=8192, d=768, h=3072, device="NVIDIA H200", idle=0.0, gemm_us=(57.5, 52.9)):
    """The eager GeGLU MLP as kineto writes it: ops with shapes, runtime calls, kernels, flow arrows."""
    ev, ids = [], {"ext": 0, "corr": 0, "gpu": 0.0}

    def x(name, cat, ts, dur, pid=1, tid=1, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
        return ev[-1]

    def op(name, ts, dur, dims=None, types=None, cat="cpu_op"):
        ids["ext"] += 1
        extra = {} if dims is None else {"Input Dims": dims, "Input type": types}
        return x(name, cat, ts, dur, **{"External id": ids["ext"]}, **extra)

    def launch(owner, ts, name, dur, query):
        ext = owner["args"]["External id"]
        if query:
            ids["corr"] += 1
            x(it.OCCUPANCY, "cuda_runtime", ts, 1, **{"External id": ext, "correlation": ids["corr"]})
        ids["corr"] += 1
        c = ids["corr"]
        x("cudaLaunchKernel", "cuda_runtime", ts + 2, 3, **{"External id": ext, "correlation": c})
        start = max(ids["gpu"], ts + 7)
        x(name, "kernel", start, dur, pid=0, tid=7, **{"External id": ext, "correlation": c, "stream": 7})
        ev.append({"ph": "s", "id": c, "pid": 1, "tid": 1, "ts": ts + 2, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": c, "pid": 0, "tid": 7, "ts": start, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        ids["gpu"] = start + dur

    def linear(c, k, n, kernel, dur, rows):
        op("aten::linear", c, 40, [rows, [n, k], []], [BF, BF, ""])
        op("aten::t", c + 1, 4, [[n, k]], [BF])
        op("aten::transpose", c + 2, 2, [[n, k], [], []], [BF, "Scalar", "Scalar"])
        op("aten::matmul", c + 6, 33, [rows, [k, n]], [BF, BF])
        op("aten::view", c + 7, 1, [rows, []], [BF, "ScalarList"])
        mm = op("aten::mm", c + 10, 25, [[m, k], [k, n]], [BF, BF])
        launch(mm, c + 12, kernel, dur, query=True)
        op("aten::_unsafe_view", c + 36, 1, [[m, n], []], [BF, "ScalarList"])
        return c + 42

    t = 1000.0
    for s in range(steps):
        step = op(f"ProfilerStep#{s + 2}", t, 0, cat="user_annotation")
        ann = op("mlp_fwd", t + 5, 0, cat="user_annotation")
        rows, hid = [m // 128, 128, d], [m // 128, 128, h]
        c = linear(t + 10, d, h, GEMM_A, gemm_us[0], rows)
        c = linear(c, d, h, GEMM_A, gemm_us[0], rows)
        g = op("aten::gelu", c, 8, [hid, []], [BF, ""])
        launch(g, c + 1, GELU, 33.0, query=False)
        mu = op("aten::mul", c + 10, 6, [hid, hid], [BF, BF])
        launch(mu, c + 11, MUL, 37.0, query=False)
        c = linear(c + 18, h, d, GEMM_B, gemm_us[1], hid)
        ann["dur"] = c - ann["ts"]
        end = max(c, ids["gpu"]) + 5 + idle
        x("cudaDeviceSynchronize", "cuda_runtime", c + 1, end - c - 2)
        step["dur"] = end - t
        t = end + 20
    props = [{"id": 0, "name": device, "computeMajor": 9, "computeMinor": 0, "numSms": 132}] if device else []
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev}


def parse(data):
    return it.parse_trace(copy.deepcopy(data), "<test>")


def test_gpu_links_kernels_to_launch_and_op():
    t = parse(gpu_trace())
    assert t.device == "cuda" and t.device_name == "NVIDIA H200"
    for st in t.steps:
        ks = st.kernels
        assert [k.name for k in ks] == [GEMM_A, GEMM_A, GELU, MUL, GEMM_B]
        assert [k.op.name for k in ks] == ["aten::mm", "aten::mm", "aten::gelu", "aten::mul", "aten::mm"]
        assert all(k.launch.name == "cudaLaunchKernel" for k in ks)
        assert [k.occupancy_query for k in ks] == [True, True, False, False, True]


def test_gpu_report_rates_against_peak():
    t = parse(gpu_trace())
    text = it.report(t)
    # 2*8192*768*3072 FLOP in 57.5 µs; GeLU reads and writes 8192*3072 bf16 in 33 µs
    flops, gelu_bytes = 2 * 8192 * 768 * 3072, 2 * 8192 * 3072 * 2
    assert f"{flops / 57.5e-6 / 1e12:,.0f} TFLOP/s" in text
    assert f"{gelu_bytes / 33e-6 / 1e9:,.0f} GB/s" in text
    assert f"{3 * gelu_bytes / 2 / 37e-6 / 1e9:,.0f} GB/s" in text  # mul: two inputs, one output
    assert "NVIDIA H200 datasheet" in text
    assert "aten::gelu" in text and "compute-bound" in text
    assert [ln.split()[:2] for ln in text.splitlines() if ln.startswith(("GEMM ", "pointwise/other "))] == \
        [["GEMM", "9/9"], ["pointwise/other", "0/6"]]
    full = it.report(t, full_names=True)
    assert GELU.removeprefix("void ") in full and GELU.removeprefix("void ") not in text


def test_peak_lookup_uses_torch_table_then_says_unknown():
    h100 = it.device_peak("NVIDIA H100 80GB HBM3")  # torch's key is "NVIDIA H100"; the sparse figure is halved
    assert h100 is not None and h100.source.startswith("torch") and h100.tflops["bfloat16"] == pytest.approx(989.5)
    assert it.device_peak("NVIDIA A100 80GB PCIe").gbs == 2039.0
    assert it.device_peak("Some Future GPU") is None
    text = it.report(parse(gpu_trace(device="Some Future GPU")))
    rows = [ln for ln in text.splitlines() if ln[:3] in ("1  ", "2  ", "3  ", "4  ")]
    assert len(rows) == 4 and all(ln.endswith("unknown") for ln in rows), rows
    assert [ln.endswith("TFLOP/s  unknown") for ln in rows] == [True, False, False, True]
    assert "\npeak: Some Future GPU: unknown (device not in torch's datasheet table)\n" in text


def test_peak_is_dense_whatever_the_torch_version():
    """torch 2.11's table lists H100 bf16 as 1979 (2:4 sparse) with no tops_sparsity_factor; 2.13 adds the factor."""
    import importlib.util

    from trace_reader.facts import peaks

    spec = importlib.util.find_spec("torch._inductor.analysis.device_info")
    source = Path(spec.origin).read_text()
    if "tops_sparsity_factor=2" in source:  # this torch has the factor: remove it, as torch 2.11 has none
        old = source.replace("tops_sparsity_factor=2,", "")
        assert old != source
    else:
        old = source
    for text in {source, old}:
        h100 = peaks.parse_device_info(text)["NVIDIA H100"]
        assert h100.tflops["bfloat16"] == pytest.approx(989.5) and h100.tflops["float16"] == pytest.approx(989.5)
    assert peaks.parse_device_info(old)["NVIDIA A100"].tflops["bfloat16"] == pytest.approx(312.5)  # dense already


def test_gpu_expectations_confirmed_and_broken():
    good = parse(gpu_trace())
    exps = [it.steps(3, "mlp_fwd"), it.kernels_per_step(5), it.kernel(r"nvjet", per_step=3),
            it.occupancy_before_gemms(), it.views_launch_nothing(), it.bound("compute"),
            it.cpu_event("cpp_fused")]
    assert [v for _, v, _ in it.check(good, exps)] == ["confirmed"] * 6 + ["not applicable"]

    data = gpu_trace()
    # cuBLAS forgot its occupancy query once; a view suddenly launches a copy kernel
    first_query = next(e for e in data["traceEvents"] if e["name"] == it.OCCUPANCY)
    data["traceEvents"].remove(first_query)
    view = next(e for e in data["traceEvents"] if e["name"] == "aten::t")
    data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "copy_kernel", "pid": 0, "tid": 7,
                                "ts": view["ts"] + 1, "dur": 2.0, "args": {"External id": view["args"]["External id"]}})
    broken = it.check(parse(data), [it.kernels_per_step(5), it.occupancy_before_gemms(), it.views_launch_nothing()])
    assert [v for _, v, _ in broken] == ["broken"] * 3
    assert "[6, 5, 5]" in broken[0][2]
    assert "GEMM launches without the query: 1/9" in broken[1][2]
    assert "aten::t launched 1 kernel" in broken[2][2]


def test_bound_follows_gpu_idle_time():
    assert it.bound_of(parse(gpu_trace()))[0] == "compute"
    assert it.bound_of(parse(gpu_trace(idle=2000.0)))[0] == "overhead"
    assert it.check(parse(gpu_trace(idle=2000.0)), [it.bound("compute")])[0][1] == "broken"
    with pytest.raises(ValueError):
        it.bound("memory")


def test_no_steps_never_confirms():
    data = gpu_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith("ProfilerStep#")]
    t = parse(data)
    assert t.whole and len(t.steps) == 1 and t.device == "cuda"  # read as one step, but no ProfilerStep to count
    results = it.check(t, [it.kernels_per_step(0), it.kernel("nvjet"), it.cpu_op("aten::t", present=False),
                           it.cpu_event("x", device="any"), it.occupancy_before_gemms(), it.views_launch_nothing(),
                           it.bound("compute"), it.steps(0, "mlp_fwd")])
    # "0 steps guessed, 0 seen" would pass on nothing: the steps guess breaks, every per-step count cannot apply
    assert [v for _, v, _ in results] == ["not applicable"] * 7 + ["broken"]
    assert {d for _, _, d in results[:7]} == {
        "no ProfilerStep#N spans (recorded without prof.step()): nothing to count per step"}
    assert it.check(t, [it.steps(3, "mlp_fwd")])[0][1:] == (
        "broken", "no ProfilerStep#N spans (recorded without prof.step()): nothing to count per step")
    assert it.steps(0, "mlp_fwd").text == "active ProfilerStep#k spans, each around a 'mlp_fwd' record_function"
    # steps, but none of them active: the run recorded nothing it meant to; every count is broken, not n/a
    idle = parse(gpu_trace())
    idle = dataclasses.replace(idle, steps=[])
    assert [v for _, v, _ in it.check(idle, [it.kernels_per_step(5), it.steps(3, "mlp_fwd")])] == ["broken"] * 2


def test_compare_finds_replacement_by_structure():
    a = parse(gpu_trace())
    data = gpu_trace(gemm_us=(60.0, 50.0))
    # compiled: GeLU + mul become one Triton kernel launched from the GeLU's place
    fused = "triton_poi_fused__unsafe_view_gelu_mul_0"
    evs = data["traceEvents"]
    muls = [e for e in evs if e["cat"] == "kernel" and e["name"] == MUL]
    for e in evs:
        if e["cat"] == "kernel" and e["name"] == GELU:
            e["name"], e["dur"] = fused, 56.0
    data["traceEvents"] = [e for e in evs if e not in muls]
    b = parse(data)
    m = it.match(a, b)
    assert m.same == [GEMM_A, GEMM_B]
    assert m.only_a == m.only_b == []  # gone and new, but each in the replaced group: counted there, once
    assert m.replaced == [([GELU, MUL], [fused])]
    text = it.compare(a, b)
    assert "+4%" in text and "-5%" in text  # 2 x 57.5 -> 2 x 60 per step, 52.9 -> 50


# ----------------------------------------------------------------------------------------- H200 fixtures

def fixture(*words):
    hits = sorted(p for p in DATA.glob("h200_*.json.gz") if all(w in p.name for w in words))
    return hits[0] if hits else None


needs_h200 = pytest.mark.skipif(fixture("mlp_eager") is None, reason="no tests/data/h200_*.json.gz fixtures")
TRITON = "triton_poi_fused__unsafe_view_gelu_mul_0"


@pytest.fixture(scope="module")
def h200():
    return {name: it.load_trace(fixture(name)) for name in ("mlp_eager", "mlp_compile", "liger", "linear_eager",
                                                            "linear_compile", "mlp_small_eager")}


@needs_h200
def test_h200_every_fixture_reads():
    paths = sorted(DATA.glob("h200_*.json.gz"))
    assert len(paths) >= 12
    for path in paths:
        t = it.load_trace(path)
        text = it.report(t)
        steps = 20 if "_active20_" in path.name else 3  # Part 1's --active 20 runs; every other fixture: 3
        assert t.device_name == "NVIDIA H200" and len(t.steps) == steps, path
        # one table row per distinct (kernel, launching op), numbered in launch order
        groups = list(dict.fromkeys((k.name, k.op.name if k.op else "?") for st in t.steps for k in st.gpu))
        table = text.split("GPU work per step")[1].split("\npeak: ")[0].splitlines()[3:]
        assert [int(r.split()[0]) for r in table if r.split() and r.split()[0].isdigit()] == \
            list(range(1, len(groups) + 1)), path  # numbers are right-aligned: " 1" .. "10"


@needs_h200
def test_h200_eager_mlp_kernels_and_launch_links(h200):
    t = h200["mlp_eager"]
    for st in t.steps:
        ks = st.kernels
        assert len(ks) == 5
        assert [k.op.name for k in ks] == ["aten::mm", "aten::mm", "aten::gelu", "aten::mul", "aten::mm"]
        assert ks[0].name == ks[1].name != ks[4].name and all(ks[i].name.startswith("nvjet") for i in (0, 1, 4))
        assert "GeluCUDAKernelImpl" in ks[2].name and "MulFunctor" in ks[3].name
        # every kernel came back to its launch call through "correlation", and the call sits inside its op
        for k in ks:
            assert k.launch.args["correlation"] == k.event.args["correlation"]
            assert k.op.ts <= k.launch.ts <= k.op.end
        assert {k.launch.name for k in ks} == {"cuLaunchKernelEx", "cudaLaunchKernel"}
        # cuBLAS zeroes a small workspace before the gate and up GEMMs: GPU work that is not a kernel
        assert [g.op.name for g in st.gpu if g.event.cat == "gpu_memset"] == ["aten::mm", "aten::mm"]


@needs_h200
def test_h200_report_rates_match_an_independent_count(h200):
    raw = json.loads(gzip.decompress(fixture("mlp_eager").read_bytes()))
    events = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    text = it.report(h200["mlp_eager"])
    for rows, tile, calls in (([8192, 768], "coopA", 6), ([8192, 3072], "coopB", 3)):
        gemms = [e for e in events if e.get("cat") == "kernel" and ops[e["args"]["External id"]]["name"] == "aten::mm"
                 and ops[e["args"]["External id"]]["args"]["Input Dims"][0] == rows]
        assert len(gemms) == calls and all(tile in e["name"] for e in gemms)
        tflops = sum(2 * 8192 * 3072 * 768 / (e["dur"] * 1e-6) for e in gemms) / calls / 1e12
        row = next(line for line in text.splitlines() if tile in line)
        assert f"{tflops:,.0f} TFLOP/s" in row and "of 990" in row
    gelu = [e for e in events if e.get("cat") == "kernel" and "GeluCUDAKernelImpl" in e["name"]]
    gbs = sum(2 * 8192 * 3072 * 2 / (e["dur"] * 1e-6) for e in gelu) / 3 / 1e9  # read g, write gelu(g)
    assert f"{gbs:,.0f} GB/s" in next(line for line in text.splitlines() if "GeluCUDAKernelImpl" in line)


@needs_h200
def test_h200_expectations(h200):
    eager = it.check(h200["mlp_eager"], [it.steps(3, "mlp_fwd"), it.kernels_per_step(5), it.views_launch_nothing(),
                                         it.bound("compute"), it.occupancy_before_gemms()])
    assert [v for _, v, _ in eager] == ["confirmed"] * 4 + ["broken"]
    # the post's A100 showed the query before each GEMM; the H200 (CUDA 13, cuBLAS nvjet) does not
    assert "9/9" in eager[4][2] and "cudaMemsetAsync" in eager[4][2]
    comp = it.check(h200["mlp_compile"], [it.kernels_per_step(4), it.kernel(r"^triton_poi_fused.*gelu_mul", 1),
                                          it.cpu_op("aten::t", present=False), it.cpu_event("cpp_fused")])
    assert [v for _, v, _ in comp] == ["confirmed"] * 3 + ["not applicable"]
    assert it.check(h200["mlp_small_eager"], [it.bound("overhead")])[0][1] == "confirmed"
    linear = it.check(h200["linear_eager"], [it.kernels_per_step(1), it.kernel("bias", 1)])
    assert [v for _, v, _ in linear] == ["confirmed", "confirmed"]  # one GEMM, the bias in its epilogue


@needs_h200
def test_h200_dropped_kernel_breaks_the_count():
    raw = json.loads(gzip.decompress(fixture("mlp_eager").read_bytes()))
    mul = next(e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "MulFunctor" in e["name"])
    raw["traceEvents"].remove(mul)
    t = parse(raw)
    [(_, verdict, detail)] = it.check(t, [it.kernels_per_step(5, "3 GEMMs + GeLU + mul")])
    assert verdict == "broken" and detail == "kernels per step: [4, 5, 5]"
    assert "\nsteps differ: 2 steps with 5 kernels (#3, #4); 1 step with 4 kernels (#2)\n" in it.report(t)


@needs_h200
def test_h200_compare_eager_vs_compiled(h200):
    a, b = h200["mlp_eager"], h200["mlp_compile"]
    m = it.match(a, b)
    gelu, mul = [k.name for k in a.steps[0].kernels[2:4]]
    assert m.replaced == [([gelu, mul], [TRITON])]
    gemms = sorted({k.name for k in a.steps[0].kernels if k.op.name == "aten::mm"})
    assert sorted(m.same) == gemms and len(gemms) == 2
    assert m.only_a == m.only_b == []  # gone and new, but each in the replaced group: counted there, once
    assert m.ops_gone["aten::t"] == 3 and m.ops_gone["aten::linear"] == 3 and "aten::gelu" in m.ops_gone
    assert "TorchDynamo Cache Lookup" in m.ops_new and TRITON in m.ops_new
    text = it.compare(a, b)
    assert "-> " + TRITON in text and gelu not in text
    assert gelu in it.compare(a, b, full_names=True)  # byte for byte, "void " and all


@needs_h200
def test_h200_compare_compiled_vs_liger(h200):
    m = it.match(h200["mlp_compile"], h200["liger"])
    assert m.replaced == [([TRITON], ["_geglu_tanh_forward_kernel"])]
    assert len(m.same) == 2 and "LigerGELUMulFunction" in m.ops_new
    lin = it.match(h200["linear_eager"], h200["linear_compile"])
    assert lin.replaced == [] and len(lin.same) == 1 and lin.ops_gone.get("aten::t") == 1


@needs_h200
def test_h200_truncated_gzip_is_one_line(tmp_path):
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(fixture("mlp_eager").read_bytes()[:1000])
    proc = cli(bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------ the CLI

def cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def test_cli_report_and_compare_read_well_in_a_pipe(cpu):
    one = cli(cpu["dir"] / "eager.json")
    assert one.returncode == 0 and one.stderr == ""
    assert "3 active ProfilerStep" in one.stdout and "\x1b[" not in one.stdout
    two = cli(cpu["dir"] / "eager.json", cpu["dir"] / "compile.json")
    assert two.returncode == 0 and cpu["fused"] in two.stdout and "CPU ops gone in B" in two.stdout


def bad_inputs(tmp: Path, good: Path) -> dict:
    raw = good.read_bytes()
    cases = {
        "missing": tmp / "nope.json",
        "truncated": tmp / "truncated.json",
        "truncated_gz": tmp / "truncated.json.gz",
        "binary": tmp / "binary.json",
        "not_json": tmp / "text.json",
        "list": tmp / "list.json",
        "no_events": tmp / "dict.json",
        "nothing": tmp / "nothing.json",
        "directory": tmp,
        "empty": tmp / "empty.json",
        "gz_of_text": tmp / "text.json.gz",
    }
    cases["empty"].write_bytes(b"")
    cases["gz_of_text"].write_bytes(gzip.compress(b"not json at all"))
    cases["truncated"].write_bytes(raw[: len(raw) // 2])
    cases["truncated_gz"].write_bytes(gzip.compress(raw)[:200])
    cases["binary"].write_bytes(bytes(range(256)))
    cases["not_json"].write_text("hello, not a trace\n")
    cases["list"].write_text("[1, 2, 3]")
    cases["no_events"].write_text(json.dumps({"schemaVersion": 1}))
    cases["nothing"].write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}))
    return cases


def test_cli_bad_input_is_one_line_and_exit_2(cpu, tmp_path):
    for case, path in bad_inputs(tmp_path, cpu["dir"] / "eager.json").items():
        proc = cli(path)
        assert proc.returncode == 2, case
        assert "Traceback" not in proc.stderr, case
        assert len(proc.stderr.strip().splitlines()) == 1, (case, proc.stderr)
        assert proc.stderr.startswith("inspect_trace.py: error: "), case
        assert proc.stdout == "", case
    for args in ([], ["a", "b", "c"], ["--no-such-flag", cpu["dir"] / "eager.json"]):
        proc = cli(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, args
    # --open hands the file to serve_trace; a port it cannot use is one line too
    proc = cli("--open", "--port", "70000", cpu["dir"] / "eager.json")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "70000" in proc.stderr
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "args": {"External id": [1]}}]}))
    proc = cli(malformed)
    assert proc.returncode == 2 and "malformed trace" in proc.stderr and "Traceback" not in proc.stderr
    # a good A and a bad B: still one line, naming B
    proc = cli(cpu["dir"] / "eager.json", tmp_path / "missing.json")
    assert proc.returncode == 2 and "missing.json" in proc.stderr


def test_load_trace_raises_trace_error(cpu, tmp_path, decoder):
    for case, path in bad_inputs(tmp_path, cpu["dir"] / "eager.json").items():
        with pytest.raises(it.TraceError) as e:
            it.load_trace(path)
        assert "\n" not in str(e.value), case
    assert it.load_trace(tmp_path / "nothing.json", require_steps=False).steps == []


def test_datasheet_read_from_source_matches_torch_module():
    """The table is read with ast (no torch import); it must say what torch's own module says."""
    device_info = pytest.importorskip("torch._inductor.analysis.device_info")
    from trace_reader.facts import peaks
    from trace_reader.facts.peaks import _SPARSE_IN_TORCH

    table = peaks._read_torch_table()
    assert table and set(table) == set(device_info._device_mapping)
    for name, info in device_info._device_mapping.items():
        # torch's factor where it gives one, else ours for the entries listed with sparse figures
        factor = getattr(info, "tops_sparsity_factor", 1)
        factor = factor if factor > 1 else _SPARSE_IN_TORCH.get(name, 1)
        assert table[name].gbs == info.dram_bw_gbs
        for dtype, tops in info.tops.items():
            key = str(dtype).removeprefix("torch.")
            assert table[name].tflops[key] == pytest.approx(tops / factor), (name, key)


def test_the_reader_s_snapshot_is_this_torch_s_table():
    """The reader keeps torch's table as a snapshot (facts/torch_peaks.json), so that it needs no torch; on the torch
    it was taken from, it is that torch's table, entry for entry (another torch: its table may differ; the report
    reads the snapshot either way)."""
    import json

    import torch

    from trace_reader.facts import peaks

    made_with = json.loads(peaks.SNAPSHOT.read_text())["torch"]
    if torch.__version__.split("+")[0] != made_with:
        pytest.skip(f"the snapshot is torch {made_with}'s table; this is torch {torch.__version__}: not compared")
    assert peaks._load_snapshot() == peaks._read_torch_table(), "peaks.write_snapshot() writes it anew"


def test_bench_replicates_a_step_faithfully(cpu, tmp_path):
    import bench_inspect

    bench_inspect.replicate(cpu["dir"] / "eager.json", 7, tmp_path / "long.json")
    long = it.load_trace(tmp_path / "long.json")
    assert [s.number for s in long.steps] == list(range(2, 9))
    first = [e.name for e in it.cpu_kernels(cpu["eager"].steps[0])]
    assert all([e.name for e in it.cpu_kernels(st)] == first for st in long.steps)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(gpu_trace(steps=2)))
    bench_inspect.replicate(gpu, 5, tmp_path / "long_gpu.json.gz")
    long = it.load_trace(tmp_path / "long_gpu.json.gz")
    assert len(long.steps) == 5 and all(len(st.kernels) == 5 and st.kernels[0].op.name == "aten::mm"
                                        for st in long.steps)
    bare = tmp_path / "bare.json"  # read as one whole step, which is no ProfilerStep to copy
    bare.write_text(json.dumps(_without_steps(gpu_trace(steps=2))))
    with pytest.raises(it.TraceError, match="no ProfilerStep#N spans to replicate"):
        bench_inspect.replicate(bare, 5, tmp_path / "x.json")


def test_fused_cpp_name_whatever_the_graph_number():
    """A worker that compiled before names the kernel graph_1_...; older torch gave no graph prefix."""
    for name in ("graph_0_cpp_fused__unsafe_view_gelu_mul_0", "graph_12_cpp_fused__unsafe_view_gelu_mul_0",
                 "cpp_fused__unsafe_view_gelu_mul_0"):
        assert fused_cpp(["aten::mm", name, name]) == name
    for names in ([], ["cpp_fused_gelu_0"], ["graph_0_cpp_fused__unsafe_view_gelu_mul_0",
                                             "graph_1_cpp_fused__unsafe_view_gelu_mul_0"]):
        with pytest.raises(AssertionError):
            fused_cpp(names)


# ------------------------------------------------------------ expectations, one at a time (fast: mutmut runs these)

def cpu_only(data):
    """The hand-built trace as a CPU-only profile records it: no runtime calls, no GPU work."""
    return {**data, "traceEvents": [e for e in data["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]}


def verdicts(t, exps):
    return [(v, d) for _, v, d in it.check(t, exps)]


def test_check_turns_each_kind_of_answer_into_its_verdict():
    gpu, cpu = parse(gpu_trace()), parse(cpu_only(gpu_trace()))
    assert (gpu.device, cpu.device) == ("cuda", "cpu")
    answers = [it.Expect("raises", lambda t: {}["x"]), it.Expect("true", lambda t: True),
               it.Expect("one", lambda t: 1), it.Expect("false", lambda t: False), it.Expect("str", lambda t: "saw 4"),
               it.Expect("n/a", lambda t: it.NotApplicable("no shapes")), it.Expect("none", lambda t: None)]
    results = it.check(gpu, answers)
    assert [ex for ex, _, _ in results] == answers  # one result per expectation, in order
    assert [(v, d) for _, v, d in results] == [
        ("broken", "check raised KeyError: 'x'"), ("confirmed", ""), ("broken", "check returned 1, not True"),
        ("broken", ""), ("broken", "saw 4"), ("not applicable", "no shapes"),
        ("broken", "check returned None, not True")]


def test_check_asks_a_device_only_expectation_of_its_device_only():
    gpu, cpu = parse(gpu_trace()), parse(cpu_only(gpu_trace()))
    seen = []
    exps = [it.Expect(d, lambda t, d=d: seen.append(d) or True, device=d) for d in ("gpu", "any", "cuda", "cpu")]
    assert verdicts(gpu, exps) == [("broken", "device must be 'any', 'cuda' or 'cpu', got 'gpu'"), ("confirmed", ""),
                                   ("confirmed", ""), ("not applicable", "a cpu-only expectation on a cuda trace")]
    assert verdicts(cpu, exps) == [("broken", "device must be 'any', 'cuda' or 'cpu', got 'gpu'"), ("confirmed", ""),
                                   ("not applicable", "a cuda-only expectation on a cpu trace"), ("confirmed", "")]
    assert seen == ["any", "cuda", "any", "cpu"]  # a check is not even run on a trace it does not apply to


def drop_kernels(data, name, steps):
    """Remove the kernel `name` (its first launch in each step) from the given step indices (0 = the first)."""
    starts = sorted(e["ts"] for e in data["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    for i in steps:
        end = starts[i + 1] if i + 1 < len(starts) else float("inf")
        k = next(e for e in data["traceEvents"]
                 if e["cat"] == "kernel" and e["name"] == name and starts[i] <= e["ts"] < end)
        data["traceEvents"].remove(k)
    return data


def test_kernels_per_step_counts_kernels_only_in_each_step():
    t = parse(gpu_trace())
    assert verdicts(t, [it.kernels_per_step(5), it.kernels_per_step(4), it.kernels_per_step(6)]) == \
        [("confirmed", ""), ("broken", "kernels per step: [5, 5, 5]"), ("broken", "kernels per step: [5, 5, 5]")]
    data = drop_kernels(gpu_trace(), MUL, [1])
    # GPU work that is no kernel (cuBLAS's workspace memset) is not counted, though it is the step's GPU work
    mm = next(e for e in data["traceEvents"] if e["name"] == "aten::mm")
    data["traceEvents"].append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
                                "ts": mm["ts"] + 1, "dur": 1.0, "args": {"External id": mm["args"]["External id"]}})
    t = parse(data)
    assert [len(st.gpu) for st in t.steps] == [6, 4, 5]
    assert verdicts(t, [it.kernels_per_step(5)]) == [("broken", "kernels per step: [5, 4, 5]")]
    no_gpu = {**data, "traceEvents": [e for e in data["traceEvents"] if e["cat"] not in ("kernel", "gpu_memset")]}
    assert verdicts(parse(no_gpu), [it.kernels_per_step(0)]) == [("confirmed", "")]  # launches: still a GPU trace


def test_kernel_matches_by_pattern_per_step():
    t = parse(gpu_trace())
    seen = sorted({short(n, False, 60) for n in (GEMM_A, GEMM_B, GELU, MUL)})
    exps = [it.kernel("nvjet", 3), it.kernel("nvjet", 2), it.kernel("coopB_TNT$"), it.kernel("coopB", 1),
            it.kernel("coopB", 0), it.kernel("^cutlass", 0), it.kernel("^cutlass"), it.kernel("Gelu|Mul", 2)]
    assert verdicts(t, exps) == [
        ("confirmed", ""), ("broken", f"matches per step: [3, 3, 3]; kernels seen: {seen}"), ("confirmed", ""),
        ("confirmed", ""), ("broken", f"matches per step: [1, 1, 1]; kernels seen: {seen}"), ("confirmed", ""),
        ("broken", f"matches per step: [0, 0, 0]; kernels seen: {seen}"), ("confirmed", "")]
    t = parse(drop_kernels(gpu_trace(), GEMM_B, [2]))
    assert verdicts(t, [it.kernel("coopB")])[0][1].startswith("matches per step: [1, 1, 0]; ")
    # a memset is GPU work but not a kernel: it never matches
    data = gpu_trace()
    mm = next(e for e in data["traceEvents"] if e["name"] == "aten::mm")
    data["traceEvents"].append({"ph": "X", "cat": "gpu_memset", "name": "nvjet memset", "pid": 0, "tid": 7,
                                "ts": mm["ts"] + 1, "dur": 1.0, "args": {"External id": mm["args"]["External id"]}})
    assert verdicts(parse(data), [it.kernel("nvjet", 3)]) == [("confirmed", "")]


def test_cpu_op_counts_ops_by_exact_name_per_step():
    data = gpu_trace()
    for e in data["traceEvents"]:  # an annotation named like an op is no op
        if e["name"] == "mlp_fwd":
            e["name"] = "aten::gelu_"
    t = parse(data)
    assert verdicts(t, [
        it.cpu_op("aten::mm"), it.cpu_op("aten::mm", per_step=3), it.cpu_op("aten::mm", per_step=2),
        it.cpu_op("aten::gelu"), it.cpu_op("aten::gelu_"), it.cpu_op("aten::gelu_", per_step=0),
        it.cpu_op("aten::gelu", present=False), it.cpu_op("aten::gelu_", present=False), it.cpu_op("aten::m")]) == [
        ("confirmed", ""), ("confirmed", ""), ("broken", "'aten::mm' per step: [3, 3, 3]"), ("confirmed", ""),
        ("broken", "'aten::gelu_' per step: [0, 0, 0]"), ("confirmed", ""),
        ("broken", "'aten::gelu' per step: [1, 1, 1]"), ("confirmed", ""), ("broken", "'aten::m' per step: [0, 0, 0]")]
    # one step without the GeLU: "in every step" breaks, "nowhere" breaks too
    gelu = next(e for e in data["traceEvents"] if e["name"] == "aten::gelu")
    data["traceEvents"].remove(gelu)
    t = parse(data)
    assert verdicts(t, [it.cpu_op("aten::gelu"), it.cpu_op("aten::gelu", present=False)]) == [
        ("broken", "'aten::gelu' per step: [0, 1, 1]"), ("broken", "'aten::gelu' per step: [0, 1, 1]")]


def busy_share(data) -> float:
    """Independent count on a trace whose steps each hold their own GPU work on one stream: kernel time over the
    step's span, per step (all steps of gpu_trace are alike)."""
    evs = data["traceEvents"]
    shares = {round(sum(k["dur"] for k in evs if k["cat"] == "kernel" and s["ts"] <= k["ts"] <= s["ts"] + s["dur"])
                    / s["dur"], 9) for s in evs if s["name"].startswith("ProfilerStep#")}
    assert len(shares) == 1
    return shares.pop()


def test_bound_says_which_and_how_busy():
    busy_data, idle_data = gpu_trace(), gpu_trace(idle=2000.0)
    busy, idle = parse(busy_data), parse(idle_data)
    kinds = [it.bound("compute"), it.bound("overhead")]
    # 237.9 µs of kernels a step (2 x 57.5 + 33 + 37 + 52.9, back to back) in a step of 271.9 µs (the first kernel
    # starts 29 µs in, the step ends 5 µs after the last), or 2,271.9 µs with 2,000 µs more idle at its end
    high, low = busy_share(busy_data), busy_share(idle_data)
    assert (high, low) == (pytest.approx(237.9 / 271.9), pytest.approx(237.9 / 2271.9))
    assert it.bound_of(busy) == ("compute", pytest.approx(high)) and it.bound_of(idle) == ("overhead", pytest.approx(low))
    assert verdicts(busy, kinds) == [("confirmed", ""), ("broken", "compute-bound: the typical step's GPU is busy 87%")]
    assert verdicts(idle, kinds) == [("broken", "overhead-bound: the typical step's GPU is busy 10%"), ("confirmed", "")]
    data = gpu_trace()
    no_gpu = {**data, "traceEvents": [e for e in data["traceEvents"] if e["cat"] != "kernel"]}
    assert verdicts(parse(no_gpu), kinds) == [("broken", "no GPU work in the active steps")] * 2
    for kind in ("memory", "Compute", ""):
        with pytest.raises(ValueError, match="kind must be 'overhead' or 'compute'"):
            it.bound(kind)


# ---------------------------------------------------------- reading awkward events (fast: mutmut runs these)

def ev(name, cat, ts, dur, pid=1, tid=1, ph="X", **args):
    return {"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_not_a_trace_is_one_trace_error():
    for data in ([], "x", None, {}, {"traceEvents": {}}, {"traceEvents": "[]"}, {"events": []}):
        with pytest.raises(it.TraceError, match="^<x>: JSON, but not a torch.profiler trace"):
            it.parse_trace(data, "<x>")
    t = it.parse_trace({"traceEvents": []})
    assert (t.steps, t.device, t.skipped, t.has_memory_events, t.meta, t.path) == ([], "cpu", 0, False, {}, "<trace>")


def test_unusable_times_are_skipped_and_counted_and_the_edges_kept():
    good = [ev("ProfilerStep#2", "user_annotation", 0, 1000), ev("zero", "cpu_op", 10, 0),
            ev("none", "cpu_op", 20, None), ev("missing", "cpu_op", 30, 0), ev("longest", "cpu_op", 40, trace_events.MAX_US),
            ev("far", "cpu_op", -1e17, 1), ev("farthest", "cpu_op", 1e17, 1)]
    del good[3]["dur"]
    bad = [ev("no ts", "cpu_op", 0, 1), ev("ts None", "cpu_op", None, 1), ev("ts text", "cpu_op", "soon", 1),
           ev("ts NaN", "cpu_op", float("nan"), 1), ev("dur NaN", "kernel", 50, float("nan")),
           ev("negative", "kernel", 50, -0.001), ev("too long", "cuda_runtime", 50, trace_events.MAX_US * 1.001),
           ev("too late", "cpu_op", 1.001e17, 1), ev("too early", "cpu_op", -1.001e17, 1),
           ev("dur text", "cpu_op", 5, "x")]
    del bad[0]["ts"]
    # not complete events, or of no category the reader uses: ignored, not counted as skipped
    other = [5, "x", None, [1], ev("B", "cpu_op", 5, 1, ph="B"), ev("flow", "ac2g", 5, float("nan")),
             ev("nocat", None, 5, "x"), ev("list cat", ["a", "list"], 5, 1, ph="i")]
    t = it.parse_trace({"traceEvents": good + bad + other})
    assert t.skipped == len(bad) and t.device == "cpu" and not t.has_gpu_work
    [st] = t.steps
    spans = {e.name: e for e in st.spans}
    assert list(spans) == ["zero", "none", "missing", "longest"]
    assert [(e.dur, e.end) for e in spans.values()] == [(0.0, 10.0), (0.0, 20.0), (0.0, 30.0),
                                                        (trace_events.MAX_US, 40 + trace_events.MAX_US)]


def test_event_fields_of_odd_types():
    e = trace_events.Event({"name": 7, "ts": "12.5", "dur": 3, "args": ["not", "a dict"], "pid": "p", "tid": 9})
    assert (e.name, e.cat, e.ts, e.dur, e.end, e.args, e.pid, e.tid) == ("7", "", 12.5, 3.0, 15.5, {}, "p", 9)
    assert (e.parent, e.children, e.calls, e.kernels, e.step, e.ext, e.corr) == (None, (), (), (), None, None, None)
    e = trace_events.Event({"ts": 1, "cat": "kernel", "args": {"stream": 7, "External id": 3, "correlation": 4}})
    assert (e.name, e.cat, e.dur, e.end, e.pid, e.tid) == ("", "kernel", 0.0, 1.0, None, None)
    assert (e.args, e.ext, e.corr) == ({"stream": 7, "External id": 3, "correlation": 4}, 3, 4)


def test_memory_events_are_noticed_whatever_their_phase():
    base = [ev("ProfilerStep#2", "user_annotation", 0, 10)]
    assert not it.parse_trace({"traceEvents": base}).has_memory_events
    for mem in ({"ph": "i", "name": "[memory]", "ts": 5, "args": {"Bytes": 4}},
                {"ph": "X", "name": "[memory]", "ts": 5}):
        for events in ([mem] + base, base + [mem]):
            assert it.parse_trace({"traceEvents": events}).has_memory_events
    assert not it.parse_trace({"traceEvents": base + [{"ph": "i", "name": "[memory]x", "ts": 5}]}).has_memory_events


def test_steps_their_spans_and_edges():
    events = [ev("ProfilerStep#3", "user_annotation", 300, 100), ev("ProfilerStep#2", "user_annotation", 100, 100),
              ev("ProfilerStep#9", "cpu_op", 500, 100), ev("ProfilerStep#x", "user_annotation", 700, 100),
              ev("ProfilerStep#4 ", "user_annotation", 900, 100),
              ev("before", "cpu_op", 50, 10), ev("at start", "cpu_op", 100, 5), ev("at end", "cpu_op", 200, 0),
              ev("between", "cpu_op", 250, 10), ev("late", "user_annotation", 399, 1), ev("after", "cpu_op", 401, 1),
              ev("other thread", "cpu_op", 310, 5, tid=2), ev("in #9", "cpu_op", 510, 5)]
    t = it.parse_trace({"traceEvents": events})
    assert [st.number for st in t.steps] == [2, 3]  # in time order; a cpu_op or another name is no step
    assert [[e.name for e in st.spans] for st in t.steps] == [["at start", "at end"], ["other thread", "late"]]
    assert all(e.step is st for st in t.steps for e in st.spans) and all(st.span.step is None for st in t.steps)
    assert [st.ops() and [e.name for e in st.ops()] for st in t.steps] == [["at start", "at end"], ["other thread"]]


def launches_and_queries() -> dict:
    """One step on thread 1: ops A (ext 1), B (ext 2), C and D (no ids of their own) inside an annotation; runtime
    calls found by External id or by time; kernels found by correlation or External id. See the test below."""
    E = "External id"

    def launch(ts, corr, name="cudaLaunchKernel", **args):
        return ev(name, "cuda_runtime", ts, 2, **args, correlation=corr)

    def k(name, ts, dur, corr, tid=7):
        return ev(name, "kernel", ts, dur, pid=0, tid=tid, correlation=corr)

    return {"traceEvents": [
        ev("ProfilerStep#2", "user_annotation", 0, 1000),
        ev("fwd", "user_annotation", 5, 900, **{E: 1}),  # shares A's id: the op, the innermost, owns it
        ev("A", "cpu_op", 10, 100, **{E: 1}),
        ev(it.OCCUPANCY, "cuda_runtime", 20, 1, **{E: 1}), launch(30, 11, **{E: 1}),
        ev("cudaGetDevice", "cuda_runtime", 40, 1, **{E: 1}), launch(50, 12, **{E: 1}),
        ev(it.OCCUPANCY + "WithFlags", "cuda_runtime", 60, 1, **{E: 1}),
        ev("cudaStreamIsCapturing", "cuda_runtime", 62, 1, **{E: 1}), launch(70, 13, "cuLaunchKernelEx", **{E: 1}),
        ev("B", "cpu_op", 200, 100, **{E: 2}),
        ev(it.OCCUPANCY, "cuda_runtime", 210, 1),  # no id: B by time
        launch(220, 14, "vendor_launch", **{E: 2}),
        ev("C", "cpu_op", 400, 50), ev(it.OCCUPANCY, "cuda_runtime", 410, 1),
        ev("D", "cpu_op", 450, 50), launch(450, 15),  # D starts there
        ev("inner", "cpu_op", 500, 20), launch(520, 16),  # at inner's end
        launch(530, 17),  # inner has ended: fwd's
        launch(540, 18, tid=2),  # a thread with no spans
        launch(4, 19),  # the step's own span is the only one around it
        # an op and an annotation inside it with one id: the op wins here too
        ev("outer", "cpu_op", 600, 100, **{E: 5}), ev("ann", "user_annotation", 600, 50, **{E: 5}),
        ev("tail", "cpu_op", 680, 20),  # ends with outer: still inside it
        launch(640, 21, **{E: 5}),
        ev("ann only", "user_annotation", 800, 50, **{E: 6}), launch(810, 22, tid=3, **{E: 6}),  # an id, no op
        ev("later op", "cpu_op", 850, 20, tid=4), launch(820, 23, tid=4),  # before any span of its thread
        k("k11", 400, 10, 11), k("k12", 55, 10, 12, tid=8),
        k("k13", 1500, 10, 13),  # runs after the step's span: still its work
        k("k14", 230, 10, 14), k("k15", 460, 10, 15), k("k16", 530, 1, 16), k("k17", 540, 1, 17), k("k18", 550, 1, 18),
        k("k19", 560, 1, 19), k("k21", 650, 1, 21), k("k22", 815, 1, 22), k("k23", 825, 1, 23),
        ev("by id", "gpu_memset", 310, 5, pid=0, tid=7, **{E: 2}),  # no correlation: its op by External id
        k("before the window", 100, 5, 3),  # its launch is not in the trace
        ev("ProfilerStep#3", "user_annotation", 2000, 1000), ev("E", "cpu_op", 2010, 10),
    ]}


def test_a_launch_at_the_instant_its_step_ends_is_that_steps():
    """A step holds what the CPU launched from its start to its end, both ends included (as its CPU spans): a
    launch at the step's last instant is its; half a µs later, between steps, no step's."""
    t = it.parse_trace({"traceEvents": [
        ev("ProfilerStep#2", "user_annotation", 0, 1000),
        ev("cudaLaunchKernel", "cuda_runtime", 1000, 2, correlation=1),
        ev("cudaLaunchKernel", "cuda_runtime", 1000.5, 2, correlation=2),
        ev("k_at_end", "kernel", 1010, 5, pid=0, tid=7, correlation=1),
        ev("k_after", "kernel", 1020, 5, pid=0, tid=7, correlation=2),
        ev("ProfilerStep#3", "user_annotation", 2000, 1000)]})
    assert [[k.name for k in st.gpu] for st in t.steps] == [["k_at_end"], []]


def test_calls_find_their_op_and_kernels_their_launch():
    t = it.parse_trace(launches_and_queries())
    st = t.steps[0]
    ops = {e.name: e for e in st.spans}
    assert [c.name for c in ops["A"].calls] == [it.OCCUPANCY, "cudaLaunchKernel", "cudaGetDevice", "cudaLaunchKernel",
                                                it.OCCUPANCY + "WithFlags", "cudaStreamIsCapturing", "cuLaunchKernelEx"]
    assert [c.name for c in ops["B"].calls] == [it.OCCUPANCY, "vendor_launch"]
    assert [len(ops[n].calls) for n in ("C", "D", "inner", "fwd")] == [1, 1, 1, 1]
    by_name = {k.name: k for k in st.gpu}
    assert [k.name for k in st.gpu] == ["k19", "k11", "k12", "k13", "k14", "by id", "k15", "k16", "k17", "k18", "k21",
                                        "k22", "k23"]
    assert [by_name[n].op.name if by_name[n].op else None for n in by_name] == \
        ["ProfilerStep#2", "A", "A", "A", "B", "B", "D", "inner", "fwd", None, "outer", "ann only", None]
    assert [n for n, k in by_name.items() if k.occupancy_query] == ["k11", "k13", "k14"]
    assert by_name["by id"].launch is None and by_name["k18"].launch.name == "cudaLaunchKernel"
    assert ops["B"].kernels == [by_name["k14"], by_name["by id"]]
    assert ops["ann"].parent is ops["outer"] and ops["tail"].parent is ops["outer"]
    assert ops["outer"].parent is ops["fwd"]
    assert ops["outer"].children == [ops["ann"], ops["tail"]]
    assert st.lags() == [556, 370, 5, 1430, 10, 10, 10, 10, 10, 10, 5, 5]  # GPU start - launch, "by id" has no launch
    assert t.steps[1].gpu == [] and t.device == "cuda" and t.skipped == 0
    # Without any runtime call, GPU work is placed by its own clock: the left-over kernel is then in the step
    bare = {"traceEvents": [e for e in launches_and_queries()["traceEvents"] if e["cat"] != "cuda_runtime"]}
    t = it.parse_trace(bare)
    assert sorted(k.name for k in t.steps[0].gpu) == sorted(["before the window", "by id"] + [
        f"k{i}" for i in (11, 12, 14, 15, 16, 17, 18, 19, 21, 22, 23)])  # k13 ran after the step's span
    assert [k.name for k in t.steps[0].gpu][:2] == ["k12", "before the window"]  # no launch: ordered by GPU start


def test_a_runtime_call_that_launches_nothing_leaves_a_cpu_trace():
    events = [ev("ProfilerStep#2", "user_annotation", 0, 10), ev("cudaGetDevice", "cuda_runtime", 1, 1),
              ev("cudaStreamIsCapturing", "cuda_driver", 2, 1)]
    assert it.parse_trace({"traceEvents": events}).device == "cpu"
    for launch in ("cudaLaunchKernel", "cuLaunchKernel", "hipExtModuleLaunchKernel", "vendor_launch"):
        assert it.parse_trace({"traceEvents": events + [ev(launch, "cuda_driver", 3, 1)]}).device == "cuda", launch
    assert it.parse_trace({"traceEvents": events + [ev("Memcpy", "gpu_memcpy", 3, 1)]}).device == "cuda"


def test_meta_and_device_properties():
    props = [{"name": "NVIDIA H200"}, "junk", 5, {"name": "second"}]
    t = it.parse_trace({"schemaVersion": 1, "deviceProperties": props, "traceEvents": []}, "p.json")
    assert t.meta == {"schemaVersion": 1, "deviceProperties": props} and t.path == "p.json"
    assert t.device_props == [{"name": "NVIDIA H200"}, {"name": "second"}] and t.device_name == "NVIDIA H200"
    for odd in ({"name": "x"}, "NVIDIA H200", None):
        assert it.parse_trace({"deviceProperties": odd, "traceEvents": []}).device_props == []


def test_steps_looks_for_the_annotation_in_every_step():
    data = gpu_trace()
    t = parse(data)
    assert verdicts(t, [it.steps(3, "mlp_fwd"), it.steps(2, "mlp_fwd"), it.steps(3, "mlp")]) == [
        ("confirmed", ""), ("broken", "3 active steps"), ("broken", "ProfilerStep#2 has no 'mlp' span")]
    last = max((e for e in data["traceEvents"] if e["name"] == "mlp_fwd"), key=lambda e: e["ts"])
    last["cat"] = "cpu_op"  # an op of that name is no record_function
    assert verdicts(parse(data), [it.steps(3, "mlp_fwd")]) == [("broken", "ProfilerStep#4 has no 'mlp_fwd' span")]
    bare = {**data, "traceEvents": [e for e in data["traceEvents"] if e["name"] != "mlp_fwd"]}
    [(verdict, detail)] = verdicts(parse(bare), [it.steps(3, "mlp_fwd")])
    assert verdict == "not applicable" and detail.startswith("3 active steps as guessed; no annotation in this trace")


def test_cpu_event_matches_any_span_in_every_step():
    data = cpu_only(gpu_trace())
    t = parse(data)
    exps = [it.cpu_event("gelu"), it.cpu_event("^gelu"), it.cpu_event("mlp_f"), it.cpu_event("gelu", device="cuda")]
    assert verdicts(t, exps) == [("confirmed", ""), ("broken", "matching CPU events per step: [0, 0, 0]"),
                                 ("confirmed", ""), ("not applicable", "a cuda-only expectation on a cpu trace")]
    data["traceEvents"].remove(next(e for e in data["traceEvents"] if e["name"] == "aten::gelu"))
    assert verdicts(parse(data), exps[:1]) == [("broken", "matching CPU events per step: [0, 1, 1]")]
    assert verdicts(parse(gpu_trace()), [it.cpu_event("gelu"), it.cpu_event("gelu", device="any")]) == [
        ("not applicable", "a cpu-only expectation on a cuda trace"), ("confirmed", "")]


def call(name, ts, ext):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 0.2,
            "args": {"External id": ext}}


def test_occupancy_before_gemms_says_what_it_saw():
    ex = [it.occupancy_before_gemms()]
    assert verdicts(parse(gpu_trace()), ex) == [("confirmed", "")]
    data = gpu_trace()
    # a query before the first GeLU and the second mul launch too: pointwise launches are no longer bare
    ops = [[e for e in data["traceEvents"] if e["name"] == name] for name in ("aten::gelu", "aten::mul")]
    for op in (ops[0][0], ops[1][1]):
        data["traceEvents"].append(call(it.OCCUPANCY, op["ts"] + 0.5, op["args"]["External id"]))
    assert verdicts(parse(data), ex) == [
        ("broken", f"GEMM launches without the query: 0/9; non-GEMM launches with it: 2 ({short(GELU, False, 50)})")]
    data = gpu_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if e["name"] != it.OCCUPANCY]
    data["traceEvents"] += [call("cudaMemsetAsync", e["ts"] + 0.5, e["args"]["External id"])
                            for e in data["traceEvents"] if e["name"] == "aten::mm"]
    assert verdicts(parse(data), ex) == [("broken", "GEMM launches without the query: 9/9 (their ops call: "
                                                    "cudaLaunchKernel, cudaMemsetAsync); non-GEMM launches with it: 0")]
    data = gpu_trace()
    launch = [e for e in data["traceEvents"] if e["name"] == "cudaLaunchKernel"][5]  # step 2's first GEMM
    data["traceEvents"].remove(launch)
    t = parse(data)
    assert sum(k.launch is None for st in t.steps for k in st.kernels) == 1
    assert verdicts(t, ex) == [("broken", "1 GEMM kernels have no linked launch call")]
    data = gpu_trace()
    data["traceEvents"] = [e for e in data["traceEvents"]
                           if not (e["cat"] == "kernel" and e["name"] in (GEMM_A, GEMM_B))]
    assert verdicts(parse(data), ex) == [("broken", "no GEMM kernels in the active steps")]


def test_views_nested_twenty_thousand_deep_name_the_outer_three_for_the_one_kernel_at_the_bottom():
    """20,000 aten::view ops, each inside the one before, the innermost launching one 3 µs kernel: each view
    launched it, through the ones it called; the verdict names the first three (a walk of every view's whole
    subtree was quadratic: 30,000 took 30 s)."""
    n = 20_000

    def op(name, cat, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    ev = [op("ProfilerStep#2", "user_annotation", 0, 3 * n + 100)]
    ev += [op("aten::view", "cpu_op", 1 + i, 3 * n + 50 - 2 * i) for i in range(n)]
    ev += [op("cudaLaunchKernel", "cuda_runtime", n + 5, 1, correlation=1),
           {"ph": "X", "cat": "kernel", "name": "copy_kernel", "pid": 0, "tid": 7, "ts": n + 10, "dur": 3.0,
            "args": {"correlation": 1}}]
    t = parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]})
    assert verdicts(t, [it.views_launch_nothing()]) == [("broken", "; ".join(["aten::view launched 1 kernel(s), 3.0 µs"] * 3))]


def test_views_launch_nothing_names_the_views_that_did():
    ex = [it.views_launch_nothing()]
    data = gpu_trace()
    views = [e for e in data["traceEvents"] if e["name"] in ("aten::t", "aten::view")][:4]
    for i, v in enumerate(views):
        data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "copy_kernel", "pid": 0, "tid": 9,
                                    "ts": v["ts"] + 0.5, "dur": float(i),
                                    "args": {"External id": v["args"]["External id"]}})
    assert [v["name"] for v in views] == ["aten::t", "aten::view", "aten::t", "aten::view"]
    # a 0 µs kernel is still a kernel launched
    assert verdicts(parse(data), ex) == [("broken", "aten::t launched 1 kernel(s), 0.0 µs; aten::view launched 1 "
                                                    "kernel(s), 1.0 µs; aten::t launched 1 kernel(s), 2.0 µs")]
    no_views = gpu_trace()
    no_views["traceEvents"] = [e for e in no_views["traceEvents"] if e["name"] not in
                               ("aten::t", "aten::transpose", "aten::view", "aten::_unsafe_view")]
    assert verdicts(parse(no_views), ex) == [("broken", "no view ops in the active steps")]
    data = gpu_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if e["cat"] != "kernel"]
    assert verdicts(parse(data), ex) == [("broken", "no GPU kernels in the active steps")]


def test_each_guess_says_what_it_checks_and_where_it_applies():
    """The guess as printed beside its verdict, and the device it is asked of: a GPU-only guess is "not applicable"
    on a CPU trace, never broken (a CPU run has no kernels to count)."""
    guesses = {
        "3 active ProfilerStep#k spans, each around a 'mlp_fwd' record_function": it.steps(3, "mlp_fwd"),
        "1 GPU kernel per step": it.kernels_per_step(1),
        "5 GPU kernels per step (3 GEMMs + GeLU + mul)": it.kernels_per_step(5, "3 GEMMs + GeLU + mul"),
        "a GPU kernel matching /nvjet/ in every step": it.kernel("nvjet"),
        "a GPU kernel matching /gelu/, 1x per step (fused)": it.kernel("gelu", 1, "fused"),
        "no 'aten::t' op": it.cpu_op("aten::t", present=False),
        "'aten::mm' 3x per step": it.cpu_op("aten::mm", per_step=3),
        "'aten::mm' in every step": it.cpu_op("aten::mm"),
        "a CPU event matching /cpp_fused/ in every step": it.cpu_event("cpp_fused"),
        f"every GEMM launch is preceded by {it.OCCUPANCY}; pointwise launches are bare": it.occupancy_before_gemms(),
        "view ops (aten::t, transpose, reshape, view, ...) launch no kernel: 0 µs CUDA time":
            it.views_launch_nothing(),
        "overhead-bound: the typical step's GPU is busy < 50% (of busy + the idle it caused)": it.bound("overhead"),
        "compute-bound: the typical step's GPU is busy >= 50% (of busy + the idle it caused)": it.bound("compute"),
    }
    assert [ex.text for ex in guesses.values()] == list(guesses)
    assert [ex.device for ex in guesses.values()] == ["any"] + ["cuda"] * 4 + ["any"] * 3 + ["cpu"] + ["cuda"] * 4
    cpu = parse(cpu_only(gpu_trace()))
    gpu_only = [ex for ex in guesses.values() if ex.device == "cuda"]
    assert verdicts(cpu, gpu_only) == [("not applicable", "a cuda-only expectation on a cpu trace")] * len(gpu_only)


# ------------------------------------------------------------ trace files, good and bad (fast: mutmut runs these)

def test_load_trace_reads_plain_and_gzip_files_and_keeps_the_path(tmp_path, decoder):
    text = json.dumps(gpu_trace()).encode()
    plain, zipped, odd = tmp_path / "t.json", tmp_path / "t.json.gz", tmp_path / "gz_named.json"
    plain.write_bytes(b" \n\t" * 500_000 + text)  # leading blanks over more than one 1 MiB chunk
    zipped.write_bytes(gzip.compress(text))
    odd.write_bytes(gzip.compress(text))  # gunzipped whatever its name
    for path in (plain, zipped, odd, str(plain)):
        t = it.load_trace(path)
        assert t.path == str(path) and len(t.steps) == 3 and t.kernel_sources == {}
    # exactly at the cap is allowed; one byte over is not, plain or gzip
    exact = tmp_path / "exact.json"
    exact.write_bytes(text)
    assert len(it.load_trace(exact, max_bytes=len(text)).steps) == 3
    assert len(it.load_trace(zipped, max_bytes=len(text)).steps) == 3
    with pytest.raises(it.TraceError) as e:
        it.load_trace(exact, max_bytes=len(text) - 1)
    assert str(e.value) == f"{exact}: larger than {(len(text) - 1) / 2**20:g} MiB, the reader's limit for one trace"
    with pytest.raises(it.TraceError) as e:
        it.load_trace(zipped, max_bytes=len(text) - 1)
    assert str(e.value) == f"{zipped}: more than {(len(text) - 1) / 2**20:g} MiB of JSON once decompressed (the " \
        "reader's limit for one trace; a gzip bomb?)"


def test_a_gzip_bomb_stops_at_the_cap_in_bounded_memory(tmp_path):
    import tracemalloc

    bomb = tmp_path / "bomb.json.gz"
    block = gzip.compress(b" " * (1 << 20))  # 1 KiB that unzips to 1 MiB; members concatenated are one gzip stream
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [') + block * 40)
    tracemalloc.start()
    try:
        with pytest.raises(it.TraceError, match=r"more than 4 MiB of JSON once decompressed"):
            it.load_trace(bomb, max_bytes=4 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the 40 MiB it unzips to are never held at once


def test_a_plain_file_over_the_cap_is_refused_before_reading(tmp_path):
    huge = tmp_path / "huge.json"
    for cap, says in ((None, "1 GiB"), (3 << 29, "1.5 GiB"), ((1 << 30) - 1, "1024 MiB")):
        with open(huge, "wb") as f:  # sparse: on paper only
            f.write(b"{")
            f.truncate((cap or read.MAX_JSON_BYTES) + 1)
        with pytest.raises(it.TraceError) as e:
            it.load_trace(huge, max_bytes=cap)
        assert str(e.value) == f"{huge}: larger than {says}, the reader's limit for one trace"


def test_each_bad_file_is_one_line_that_says_what_is_wrong(tmp_path, decoder):
    text = json.dumps(gpu_trace())
    files = {
        "empty.json": b"", "blank.json": b" \n" * 700_000, "list.json": b"  [1, 2]", "text.json": b"hello",
        "binary.json": b"{" + bytes(range(128, 256)), "cut.json": b'{"traceEvents": [\n',
        "deep.json": b'{"a": ' + b"[" * 100_000,
        "cut.json.gz": gzip.compress(text.encode())[:300], "events.json": b'{"traceEvents": {}}',
        "malformed.json": json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2,
                                                       "args": {"External id": [1]}}]}).encode(),
        "nothing.json": json.dumps({"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1},
                                                    {"ph": "i", "name": "marker", "ts": 5}]}).encode(),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "folder.json").mkdir()
    said = {}
    for name in [*files, "folder.json", "missing.json"]:
        with pytest.raises(it.TraceError) as e:
            it.load_trace(tmp_path / name)
        said[name] = str(e.value).replace(f"{tmp_path / name}: ", "", 1)
    assert said == {
        "empty.json": "empty file", "blank.json": "empty file (only whitespace)",
        "list.json": "not a torch.profiler trace (a JSON object starts with '{', this starts with b'[1, 2]')",
        "text.json": "not a torch.profiler trace (a JSON object starts with '{', this starts with b'hello')",
        "binary.json": "not text JSON (binary content)",
        "cut.json": "not valid JSON (Expecting value: line 2, column 1); truncated file?",
        "deep.json": "JSON nested too deeply to be a trace",
        "cut.json.gz": "cannot read (EOFError: Compressed file ended before the end-of-stream marker was reached); "
                       "truncated or not gzip?",
        "events.json": "JSON, but not a torch.profiler trace (no 'traceEvents' list)",
        "malformed.json": said["malformed.json"],
        "nothing.json": "no CPU ops, runtime calls or GPU work in the trace: nothing to read",
        "folder.json": "not a file", "missing.json": "no such file"}
    assert said["malformed.json"].startswith("malformed trace (TypeError: ")  # an id that is a list: unhashable
    assert "unhashable type: 'list'" in said["malformed.json"]  # (Python 3.14 words it longer)
    assert it.load_trace(tmp_path / "nothing.json", require_steps=False).steps == []


def _without_steps(data):
    data = copy.deepcopy(data)
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    return data


def test_a_trace_without_steps_is_read_as_one_whole_step():
    """A bare `with profile():` (another harness, no prof.step()): every op, call and kernel in one step."""
    stepped = parse(gpu_trace(steps=3))
    t = parse(_without_steps(gpu_trace(steps=3)))
    (whole,) = t.steps
    assert t.whole and not stepped.whole and whole.span.name == it.WHOLE_TRACE and whole.number == 0
    assert len(whole.kernels) == sum(len(st.kernels) for st in stepped.steps) == 15
    assert [k.name for k in whole.kernels] == [k.name for st in stepped.steps for k in st.kernels]  # launch order
    assert len(whole.ops({"aten::mm"})) == 9 and whole.gpu_busy == pytest.approx(sum(st.gpu_busy for st in stepped.steps))
    cpu = [e for e in _without_steps(gpu_trace(steps=3))["traceEvents"]
           if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")]
    assert whole.span.ts == min(e["ts"] for e in cpu)  # from the first CPU event to the last (a sync here)
    assert whole.span.end == pytest.approx(max(e["ts"] + e["dur"] for e in cpu))
    # Kernels whose launches are not in the trace, and that ran after the CPU side ended, still count.
    data = _without_steps(gpu_trace(steps=1))
    data["traceEvents"] = [e for e in data["traceEvents"] if e["cat"] != "cuda_runtime"]
    for e in data["traceEvents"]:
        if e["cat"] == "kernel":
            e["ts"] += 10_000
    assert len(parse(data).steps[0].kernels) == 5
    # Only GPU work (a CUPTI-only export): the step is the GPU's time.
    data["traceEvents"] = [e for e in data["traceEvents"] if e["cat"] == "kernel"]
    only_gpu = parse(data)
    assert len(only_gpu.steps[0].kernels) == 5 and only_gpu.steps[0].span.ts == min(e["ts"] for e in data["traceEvents"])
    far = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": n, "ts": ts, "dur": 1, "pid": 1, "tid": 1}
                           for n, ts in (("a", 0), ("b", 9e16))]}  # each time valid, together no one run
    with pytest.raises(it.TraceError, match=r"^<test>: no ProfilerStep#N spans, and its events span 2.5e\+07 hours"):
        parse(far)
    # At the edge: events spanning exactly trace_events.MAX_US (1e11 µs, ~28 hours) are one run, a µs more is not.
    far["traceEvents"][1]["ts"] = 1e11 - 1  # a (0, 1 µs) to b (1e11 - 1, 1 µs): 1e11 µs
    (whole,) = parse(far).steps
    assert (whole.span.dur, whole.span.cat, whole.span.name) == (1e11, "user_annotation", it.WHOLE_TRACE)
    far["traceEvents"][1]["ts"] = 1e11
    with pytest.raises(it.TraceError) as e:
        parse(far)
    assert str(e.value) == "<test>: no ProfilerStep#N spans, and its events span 27.8 hours: not one profiled run"


def test_report_and_compare_say_the_trace_is_read_whole(tmp_path):
    path = tmp_path / "bare_profile.json"
    path.write_text(json.dumps(_without_steps(gpu_trace(steps=3))))
    stepped = tmp_path / "stepped.json"
    stepped.write_text(json.dumps(gpu_trace(steps=3)))
    proc = cli(path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "steps   none (no ProfilerStep#N spans): the whole trace is read as one step" in proc.stdout
    proc = cli("--json", path)
    data = json.loads(proc.stdout)
    assert data["whole_trace"] is True and len(data["steps"]) == 1 and data["steps"][0]["kernels"] == 15
    assert json.loads(cli("--json", stepped).stdout)["whole_trace"] is False
    proc = cli(stepped, path)
    assert proc.returncode == 0, proc.stderr
    assert f"B  {path}  (NVIDIA H200, no ProfilerStep spans: one step, the whole trace)" in proc.stdout
    assert f"A  {stepped}  (NVIDIA H200, 3 steps)" in proc.stdout
    # Expectations count per ProfilerStep#N: none here, so a script's expectations cannot be confirmed from it.
    proc = cli("--expect", "03_simple_mlp", path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "seen: no ProfilerStep#N spans (recorded without prof.step()): nothing to count per step" in proc.stdout
    assert "0 confirmed, 1 broken, 6 not applicable" in proc.stdout  # only the steps guess itself is broken


def test_kernel_files_are_read_only_when_asked_and_only_small_regular_files(tmp_path, monkeypatch):
    src, limit, big, binary, fifo = (tmp_path / n for n in ("k.py", "limit.py", "big.py", "bin.py", "fifo"))
    src.write_text("def triton_poi_fused_0(in_ptr0):\n    pass\n")
    limit.write_bytes(b"#" * read.MAX_KERNEL_FILE_BYTES)
    big.write_bytes(b"#" * (read.MAX_KERNEL_FILE_BYTES + 1))
    binary.write_bytes(b"\xff\xfe")
    os.mkfifo(fifo)  # a plain open would wait for a writer for ever
    targets = [str(src), str(limit), str(big), str(binary), str(fifo), str(tmp_path), str(tmp_path / "a_missing.py"),
               "", 5, "bad\0name", "/dev/zero"]
    data = gpu_trace()
    ops = [e for e in data["traceEvents"] if e["cat"] == "cpu_op"]
    for e, target in zip(ops, targets):
        e["args"]["kernel_file"] = target
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    assert it.load_trace(path).kernel_sources == {}  # not asked: nothing opened
    assert it.load_trace(path, kernel_files=True).kernel_sources == {str(src): src.read_text(),
                                                                     str(limit): limit.read_text()}
    monkeypatch.setattr(read, "KERNEL_FILES_SECONDS", -1.0)  # out of time before the first file
    assert it.load_trace(path, kernel_files=True).kernel_sources == {}


def test_print_expectations_says_each_verdict_and_counts_them():
    results = it.check(parse(gpu_trace()), [it.kernels_per_step(5), it.kernels_per_step(4),
                                            it.Expect("a guess that says nothing", lambda t: False), it.cpu_event("x")])
    buf = io.StringIO()
    assert it.print_expectations(results, file=buf) == 2
    assert buf.getvalue() == (
        "Expectations (guess first, then look):\n"
        "  ok      5 GPU kernels per step\n"
        "  BROKEN  4 GPU kernels per step\n"
        "          seen: kernels per step: [5, 5, 5]  <- BROKEN — look here\n"
        "  BROKEN  a guess that says nothing\n"
        "          seen: (no detail)  <- BROKEN — look here\n"
        "  n/a     a CPU event matching /x/ in every step (a cpu-only expectation on a cuda trace)\n"
        "  1 confirmed, 2 broken, 1 not applicable\n")
    buf = io.StringIO()
    assert it.print_expectations(results[:1], file=buf) == 0
    assert buf.getvalue().endswith("\n  1 confirmed, 0 broken, 0 not applicable\n")


def test_expect_of_a_script_the_reader_cannot_guess_for_says_why(capsys):
    """05_attention's guesses depend on flags its trace does not hold: a sentence saying so, not argparse's
    'invalid choice'; a name that is no script at all lists the ones it knows. Both before any trace is read."""
    assert it.main(["--expect", "05_attention", str(DATA / "no-such-trace.json")]) == 2
    err = capsys.readouterr().err
    assert err == ("inspect_trace.py: error: --expect 05_attention: its guesses depend on --impl, --backend and "
                   "--decode, which its trace does not say; 05_attention.py checks them itself after each run\n")
    assert it.main(["--expect", "09_nothing", str(DATA / "no-such-trace.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inspect_trace.py: error: --expect 09_nothing: not one of the scripts it knows (01_matmul_add")
    assert "invalid choice" not in err and err.count("\n") == 1


def test_a_folder_without_rank_traces_says_what_it_holds(tmp_path, capsys):
    """A folder is read as one distributed run: one holding plain traces (or none) says so and what to do."""
    assert it.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"inspect_trace.py: error: {tmp_path}: a folder is read as one distributed run's rank traces "
        "(<run>_rank<N>.json, 08_tensor_parallel.py's), and it holds no .json or .json.gz trace; name a trace file "
        "instead\n")
    for name in ("64_bf16_cold_eager.json", "64_bf16_warm_eager.json.gz"):
        (tmp_path / name).write_text("{}")
    assert it.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"inspect_trace.py: error: {tmp_path}: a folder is read as one distributed run's rank traces "
        "(<run>_rank<N>.json, 08_tensor_parallel.py's), and it holds 2 trace(s) (64_bf16_cold_eager.json, ...), "
        "none a rank's; name a trace file instead\n")
