"""inspect_trace.py against real traces: CPU traces recorded here, H200 traces committed under tests/data,
and small hand-built GPU traces (kineto's format) where a case has to be forced (a missing query, a view
that launches a kernel, a device torch's table does not know)."""

import copy
import gzip
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import fused_cpp
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import inspect_trace as it

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
    assert m.only_a == ["aten::gelu", "aten::mul"] and m.only_b == [cpu["fused"]]
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
    """A CPU-only profile in a process that profiled the GPU earlier can carry CUDA runtime calls (CUPTI stays
    subscribed); none launches anything, so the trace is still a CPU trace. One launch makes it a GPU trace."""
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

    from trace_reader import peaks

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
    assert t.steps == [] and t.device == "cuda"
    results = it.check(t, [it.kernels_per_step(0), it.kernel("nvjet"), it.cpu_op("aten::t", present=False),
                           it.cpu_event("x", device="any"), it.occupancy_before_gemms(), it.views_launch_nothing(),
                           it.bound("compute"), it.steps(0, "mlp_fwd")])
    assert [v for _, v, _ in results] == ["broken"] * 7 + ["confirmed"]  # 0 steps guessed, 0 seen
    assert it.check(t, [it.steps(3, "mlp_fwd")])[0][1:] == ("broken", "0 active steps")


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
    assert m.only_a == [GELU, MUL] and m.only_b == [fused]
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
    assert m.only_a == [gelu, mul] and m.only_b == [TRITON]
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
        "no_steps": tmp / "nosteps.json",
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
    data = json.loads(raw)
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    cases["no_steps"].write_text(json.dumps(data))
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


def test_load_trace_raises_trace_error(cpu, tmp_path):
    for case, path in bad_inputs(tmp_path, cpu["dir"] / "eager.json").items():
        with pytest.raises(it.TraceError) as e:
            it.load_trace(path)
        assert "\n" not in str(e.value), case
    assert it.load_trace(tmp_path / "nosteps.json", require_steps=False).steps == []


def test_datasheet_read_from_source_matches_torch_module():
    """The table is read with ast (no torch import); it must say what torch's own module says."""
    device_info = pytest.importorskip("torch._inductor.analysis.device_info")
    from trace_reader.peaks import _SPARSE_IN_TORCH

    table = it._read_torch_table()
    assert table and set(table) == set(device_info._device_mapping)
    for name, info in device_info._device_mapping.items():
        # torch's factor where it gives one, else ours for the entries listed with sparse figures
        factor = getattr(info, "tops_sparsity_factor", 1)
        factor = factor if factor > 1 else _SPARSE_IN_TORCH.get(name, 1)
        assert table[name].gbs == info.dram_bw_gbs
        for dtype, tops in info.tops.items():
            key = str(dtype).removeprefix("torch.")
            assert table[name].tflops[key] == pytest.approx(tops / factor), (name, key)


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


def test_fused_cpp_name_whatever_the_graph_number():
    """A worker that compiled before names the kernel graph_1_...; older torch gave no graph prefix."""
    for name in ("graph_0_cpp_fused__unsafe_view_gelu_mul_0", "graph_12_cpp_fused__unsafe_view_gelu_mul_0",
                 "cpp_fused__unsafe_view_gelu_mul_0"):
        assert fused_cpp(["aten::mm", name, name]) == name
    for names in ([], ["cpp_fused_gelu_0"], ["graph_0_cpp_fused__unsafe_view_gelu_mul_0",
                                             "graph_1_cpp_fused__unsafe_view_gelu_mul_0"]):
        with pytest.raises(AssertionError):
            fused_cpp(names)
