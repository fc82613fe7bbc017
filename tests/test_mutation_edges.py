"""Rules of the reader, the benchmark and the trace server at their edges, on tiny synthetic inputs; expected
values by hand. Fast and in-process: mutmut (pyproject's [tool.mutmut]) runs these against every mutant."""

import argparse
import re
from pathlib import Path

import pytest

import bench
from trace_reader import scripts
from trace_reader.reading import events as trace_events
from trace_reader.analyzers import guesses

# ---- bench.py: shapes, the floor, the noise rule ------------------------------------------------------------


@pytest.mark.parametrize("text, shapes", [
    ("1x1x1", [(1, 1, 1)]),
    (f"{1 << 20}x2x3", [(1 << 20, 2, 3)]),  # the largest size accepted
    (" 4X5x6 , 7x8x9", [(4, 5, 6), (7, 8, 9)]),  # spaces and an upper-case X are read
])
def test_shapes_accepted_up_to_the_limit(text, shapes):
    assert bench.shape_list(text) == shapes


@pytest.mark.parametrize("text", [f"{(1 << 20) + 1}x2x3", "0x2x3", "1x2", "1x2x3x4", "1x-2x3", "1x2.5x3"])
def test_shapes_refused_beyond_the_limit(text):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        bench.shape_list(text)
    assert str(e.value) == f"expected MxDIMxHIDDEN with sizes 1..1048576, got {text!r}"


def test_middle_is_the_upper_middle_of_the_sorted_rounds():
    assert bench.middle([3.0, 1.0, 2.0]) == 2.0
    assert bench.middle([4.0, 1.0, 3.0, 2.0]) == 3.0  # index 4 // 2 = 2 of [1, 2, 3, 4]
    assert bench.middle([5.0]) == 5.0


def test_spread_is_the_range_over_the_median():
    assert bench.spread({"rounds_us": [110.0, 90.0, 100.0], "median_us": 100.0}) == pytest.approx(0.2)
    assert bench.spread({"rounds_us": [50.0, 50.0], "median_us": 25.0}) == 0.0


@pytest.mark.parametrize("bandwidth, bound", [(5.0, "compute"), (4.0, "memory"), (6.0, "compute")])
def test_roofline_bound_at_equal_floors_is_compute(bandwidth, bound):
    # M = dim = hidden = 1, one byte per element: 6 FLOPs and 3 + 2 = 5 bytes; at 6 TFLOP/s, 1e-6 µs of compute;
    # at 5 TB/s the memory floor is the same 1e-6 µs (the tie goes to compute), at 4 TB/s it is larger.
    r = bench.roofline(1, 1, 1, 1, 6.0, bandwidth)
    assert (r["flops"], r["bytes"]) == (6, 5)
    assert r["floor_compute_us"] == pytest.approx(1e-6) and r["floor_memory_us"] == pytest.approx(5 / bandwidth * 1e-6)
    assert r["bound"] == bound and r["floor_us"] == pytest.approx(max(1e-6, 5 / bandwidth * 1e-6))


def test_roofline_counts_each_size_in_its_place():
    # 2 bytes per element, M=3, dim=5, hidden=7: FLOPs 2*3*5*7*3 = 630; bytes 2*(3*5*7 + 2*3*5) = 270.
    r = bench.roofline(3, 5, 7, 2, 1.0, 1.0)
    assert (r["flops"], r["bytes"]) == (630, 270)
    assert r["floor_compute_us"] == pytest.approx(630e-6) and r["floor_memory_us"] == pytest.approx(270e-6)


# ---- the report's text, whole, for a trace small enough to count by hand --------------------------------------

TWO_KERNELS_REPORT = """\
trace   <test>
device  NVIDIA H200
steps   1 active ProfilerStep (#2)

GPU work per step, in launch order (mean over 1 steps; µs per call; lag: launch to start, median):
#  kernel    launched by  calls/step  mean µs  min–max  lag  GPU share  achieved  of peak
-  --------  -----------  ----------  -------  -------  ---  ---------  --------  -------
1  kernel_a  aten::a               1     15.0        -  5.0      50.0%         -  -
2  kernel_b  aten::b               1     15.0        -  5.0      50.0%         -  -
achieved: empty, this trace has no tensor shapes (profile with torch.profiler.profile(..., record_shapes=True) \
to record them)
peak: NVIDIA H200: NVIDIA H200 datasheet (not in torch's table)
every step launches the same 2 kernels in the same order

Step time (µs): wall = from step start until its last GPU work ends; busy% = GPU busy / (busy + GPU idle the step \
caused); host% = its GPU idle waiting on the host
lag = launch call to kernel start: it grows when the CPU runs ahead of the GPU
step  kernels  GPU busy  CPU span   wall  busy%  host%  verdict   lag median  lag max
----  -------  --------  --------  -----  -----  -----  --------  ----------  -------
#2          2      30.0     100.0  100.0    30%    60%  overhead         5.0      5.0
=> typical step (median, #2): overhead-bound, GPU busy 30% of the step (1 overhead-bound); the GPU waits on the \
CPU to launch work: fewer, bigger kernels (or CUDA graphs) help
   GPU idle per step (median): 60.0 µs waiting on the host (work not yet launched), 10.0 µs after the launch \
(launch latency, earlier work)

GPU and CPU time per annotation (record_function; GPU: work launched inside it, CPU: its spans; µs per step):
annotation  GPU median  GPU min–max  CPU median
----------  ----------  -----------  ----------
work              30.0            -        98.0

CPU self time per step, top 4 (ops, annotations and runtime calls; µs):
name              calls/step  self µs/step
----------------  ----------  ------------
work                       1          88.0
cudaLaunchKernel           2           4.0
aten::a                    1           3.0
aten::b                    1           3.0

View ops: none in the active steps

Launches preceded by cudaOccupancyMaxActiveBlocksPerMultiprocessor (in the same op):
kernels          with query  launch call
---------------  ----------  ----------------
pointwise/other  0/2         cudaLaunchKernel"""


def test_the_whole_report_of_two_kernels_counted_by_hand():
    """tests/test_reader_report.py's two_kernels_step: one 100 µs step; kernel A launched at 10 runs 15..30, B
    launched at 50 runs 55..70. Busy 15 + 15 = 30 µs, each half the GPU time; lag 15 - 10 = 55 - 50 = 5 µs. The
    GPU waits on the host 0..10, 30..50 and 70..100 (60 µs) and after a launch 10..15 and 50..55 (10 µs): busy
    30%, host 60%, below half busy: overhead-bound. CPU self time: `work` spans 98 µs around aten::a and aten::b
    (5 µs each): 88; each op's 5 µs less its 2 µs launch call: 3; two launch calls of 2 µs: 4."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step

    assert it.report(parse(two_kernels_step())) == TWO_KERNELS_REPORT


# ---- modules.py: a model's time module by module, on a two-layer step built here ------------------------------

def two_layer_step() -> dict:
    """One 200 µs step (annotation `decode`) of a two-layer model, one kernel per op, every op launching at once:
    embed_tokens 2..20 (kernel 5 µs); layer 0 21..100 holding self_attn 22..50 (10 µs) and mlp 51..90 (20 µs), and
    its residual add (2 µs) outside both parts; layer 1 101..180 holding mlp 102..170 (20 µs); one op outside any
    module (4 µs). GPU time 5 + 10 + 20 + 2 + 20 + 4 = 61 µs."""
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 200), x("decode", "user_annotation", 1, 198),
          x("model.embed_tokens", "user_annotation", 2, 18), x("model.layers.0", "user_annotation", 21, 79),
          x("model.layers.0.self_attn", "user_annotation", 22, 28), x("model.layers.0.mlp", "user_annotation", 51, 39),
          x("model.layers.1", "user_annotation", 101, 79), x("model.layers.1.mlp", "user_annotation", 102, 68)]
    ops = [("aten::embedding", 3, "k_embed", 10, 5), ("aten::mm", 23, "k_attn", 30, 10),
           ("aten::gelu", 52, "k_mlp", 60, 20), ("aten::add", 95, "k_add", 97, 2),
           ("aten::gelu", 103, "k_mlp", 110, 20), ("aten::mul", 185, "k_out", 188, 4)]
    for i, (op, at, kernel, start, dur) in enumerate(ops):
        ev += [x(op, "cpu_op", at, 2, **{"External id": i}),
               x("cudaLaunchKernel", "cuda_runtime", at + 1, 1, **{"External id": i, "correlation": 100 + i}),
               x(kernel, "kernel", start, dur, pid=0, tid=7, correlation=100 + i)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_module_breakdown_of_two_layers_by_hand():
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    d = modules.breakdown(parse(two_layer_step()), "decode")
    total = 61.0
    assert d["step"] == 2 and d["device"] == "cuda"
    assert d["top_level"] == ["model.embed_tokens", "model.layers.0", "model.layers.1"]
    # per type, largest GPU time first: the layers 32 + 20, the mlps 20 + 20, self_attn 10, embed_tokens 5;
    # CPU time is the spans': layers 79 + 79, mlps 39 + 68
    rows = [(r["type"], r["modules"], r["gpu_us"], r["kernels"], r["cpu_us"], r["holds_others"]) for r in d["types"]]
    assert rows == [
        ("decoder layer", 2, 52.0, 4, 158.0, True), ("mlp", 2, 40.0, 2, 107.0, False),
        ("self_attn", 1, 10.0, 1, 28.0, False), ("model.embed_tokens", 1, 5.0, 1, 18.0, False)]
    assert [r["share"] for r in d["types"]] == [pytest.approx(v / total) for v in (52, 40, 10, 5)]
    assert [(r["layer"], r["gpu_us"], r["kernels"], r["cpu_us"]) for r in d["layers"]] == [
        (0, 32.0, 3, 79.0), (1, 20.0, 1, 79.0)]
    # the step: 61 µs, 6 kernels, `decode` spans 198 µs; the top-level modules hold 57 µs, 5 kernels, 176 µs
    assert {k: d["total"][k] for k in ("gpu_us", "kernels", "cpu_us", "share")} == {
        "gpu_us": 61.0, "kernels": 6, "cpu_us": 198.0, "share": 1.0}
    assert d["outside"] == {"gpu_us": 4.0, "kernels": 1, "cpu_us": 22.0, "share": pytest.approx(4 / total)}


def test_module_type_and_layer_index_read_the_path():
    from trace_reader.analyzers import modules

    assert [modules.module_type(p) for p in ("model.layers.3.mlp", "model.layers.3", "transformer.h.12", "lm_head",
                                             "7", "model.layers.3.mlp.up_proj")] == \
        ["mlp", "decoder layer", "decoder layer", "lm_head", "decoder layer", "model.layers.3.mlp.up_proj"]
    assert [modules.layer_index(p) for p in ("model.layers.3.mlp", "transformer.h.12", "lm_head", "7")] == \
        [3, 12, None, 7]


def test_module_expectations_on_two_layers():
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    t = parse(two_layer_step())

    def answer(e):
        return e.check(t)

    assert answer(modules.modules_annotated(2, "decode")) is True
    assert answer(modules.modules_annotated(3, "decode")) == "ProfilerStep#2: decoder layers annotated: [0, 1]"
    assert answer(modules.largest_module("mlp", "decode")) is True
    assert answer(modules.largest_module("self_attn", "decode")) == "largest: mlp (66% of GPU time)"  # 40 / 61
    assert answer(modules.module_launches("mlp", "GeLU", has=("^k_mlp$", "gelu"), lacks=("k_attn",))) is True
    assert answer(modules.module_launches("mlp", "GeGLU", has=("geglu",))) == (
        "model.layers.0.mlp: nothing matches ['geglu']; model.layers.1.mlp: nothing matches ['geglu']")
    assert answer(modules.module_launches("self_attn", "no mm", lacks=("^aten::mm$",))) == (
        "model.layers.0.self_attn: launches ['^aten::mm$']")
    assert answer(modules.runtime_calls("cudaLaunchKernel", 6)) is True
    assert answer(modules.runtime_calls("cudaLaunchKernel", 5)) == "cudaLaunchKernel per step: [6]"
    assert answer(modules.kernels_between(6, 6, "x")) is True
    assert answer(modules.kernels_between(7, None, "x")) == "kernels per step: [6]"
    assert answer(modules.kernels_between(0, 5, "x")) == "kernels per step: [6]"


def test_module_tables_of_two_layers_by_hand():
    """The numbers of test_module_breakdown_of_two_layers_by_hand as printed: share = GPU µs / 61 (52 -> 85%,
    40 -> 66%, 10 -> 16%, 5 -> 8%, 4 -> 7%; layers 32 -> 52%, 20 -> 33%)."""
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    assert modules.breakdown_text(modules.breakdown(parse(two_layer_step()), "decode")) == """\
Module by module (GPU time and kernels in ProfilerStep#2, the median step; a module holds its submodules):
module type                      modules  GPU µs  share  kernels  CPU µs
-------------------------------  -------  ------  -----  -------  ------
decoder layer (holds its parts)        2    52.0    85%        4   158.0
mlp                                    2    40.0    66%        2   107.0
self_attn                              1    10.0    16%        1    28.0
model.embed_tokens                     1     5.0     8%        1    18.0
(outside any module)                         4.0     7%        1    22.0
step total                                  61.0   100%        6   198.0

Per decoder layer:
layer  GPU µs  share  kernels  CPU µs
-----  ------  -----  -------  ------
0        32.0    52%        3    79.0
1        20.0    33%        1    79.0"""
    assert modules.breakdown_text(None) == "Module by module: no module annotations in this trace"


def test_module_table_of_a_cpu_trace_is_cpu_time():
    """The same step without its GPU: shares of the 198 µs `decode` span (158 -> 80%, 107 -> 54%, 28 -> 14%,
    18 -> 9%, outside 22 -> 11%; each layer 79 -> 40%)."""
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    data = two_layer_step()
    data = {"traceEvents": [e for e in data["traceEvents"] if e["cat"] in ("user_annotation", "cpu_op")]}
    assert modules.breakdown_text(modules.breakdown(parse(data), "decode")) == """\
Module by module (CPU time (a CPU trace: no GPU lane) in ProfilerStep#2, the median step; a module holds its \
submodules):
module type                      modules  CPU µs  share
-------------------------------  -------  ------  -----
decoder layer (holds its parts)        2   158.0    80%
mlp                                    2   107.0    54%
self_attn                              1    28.0    14%
model.embed_tokens                     1    18.0     9%
(outside any module)                        22.0    11%
step total                                 198.0   100%

Per decoder layer:
layer  CPU µs  share
-----  ------  -----
0        79.0    40%
1        79.0    40%"""


@pytest.mark.parametrize("words, want", [
    # the trace tells: phase `decode`, layers 0 and 1, transformers' MLP (aten::gelu, no Liger or fused kernel)
    ([], {"phase": "decode", "layers": 2, "mlp": "eager", "cuda_graphs": False, "act": "gelu_tanh"}),
    # what the trace tells wins over the file name; what it cannot tell (the fused MLP's name, graphs) comes from it
    (["gemma-2b-4L", "prefill", "mlp-fused", "cudagraphs"],
     {"phase": "decode", "layers": 2, "mlp": "fused", "cuda_graphs": True, "act": "gelu_tanh"}),
])
def test_model_flags_read_from_the_trace_first(words, want):
    import argparse

    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    a = argparse.Namespace(compile=False)
    modules.model_flags(a, parse(two_layer_step()), words)
    assert {k: v for k, v in vars(a).items() if k != "compile"} == want


@pytest.mark.parametrize("words, want", [
    (["tiny-4L", "decode"], {"phase": "decode", "layers": 4, "cuda_graphs": False, "act": "gelu_tanh"}),
    # a config file's name tells no activation: Liger's and the fused MLP stand for the post's GeGLU, others for none
    (["llama-7b-12L", "mlp-liger"], {"layers": 12, "mlp": "liger", "cuda_graphs": False, "act": "gelu_tanh"}),
    (["tiny-llama-2L", "mlp-liger"], {"layers": 2, "mlp": "liger", "cuda_graphs": False, "act": "silu"}),  # its preset
    (["llama-7b-12L"], {"layers": 12, "cuda_graphs": False, "act": None}),
    (["gemma", "mlp-other"], {"cuda_graphs": False, "act": None}),
    (["gemma", "mlp-eager"], {"mlp": "eager", "cuda_graphs": False, "act": None}),
    (["gemma", "mlp-fused"], {"mlp": "fused", "cuda_graphs": False, "act": "gelu_tanh"}),
])
def test_model_flags_from_the_file_name_where_the_trace_is_silent(words, want):
    import argparse

    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    bare = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1,
                             "ts": 0, "dur": 10, "args": {}}]}
    a = argparse.Namespace(compile=True)
    modules.model_flags(a, parse(bare), words)
    assert {k: v for k, v in vars(a).items() if k != "compile"} == want


# ---- peaks.py: torch's datasheet table, read as source ----------------------------------------------------------

DEVICE_INFO = '''
other = {"NVIDIA X": DeviceInfo(tops={torch.bfloat16: 1.0})}
_device_mapping: dict[str, DeviceInfo] = {
    "nvidia h100": DeviceInfo(tops={torch.float64: 67.0, torch.bfloat16: 1979.0, "torch.tf32": 989.0},
                              dram_bw_gbs=3350, dram_gb=80),
    "NVIDIA L4": DeviceInfo(tops={torch.bfloat16: 242.0}, dram_bw_gbs=300),
    "NVIDIA A100": DeviceInfo(tops={torch.bfloat16: 312.0}, dram_bw_gbs=2039.0),
    "NVIDIA B200": DeviceInfo(tops={torch.bfloat16: 4500.0}, dram_bw_gbs=8000.0, tops_sparsity_factor=2),
    "AMD MI300X": DeviceInfo(tops={torch.bfloat16: 1307.4}),
    "NOT A CALL": 3,
}
_device_mapping["AMD Instinct MI300X"] = _device_mapping["AMD MI300X"]
_device_mapping["ALIAS OF NOTHING"] = _device_mapping["NOPE"]
settings["table"] = {"NVIDIA Y": DeviceInfo(tops={torch.bfloat16: 1.0})}
config.aliases["NVIDIA Z"] = other["NVIDIA X"]
'''


def test_device_table_read_from_source_dense_with_aliases():
    from trace_reader.facts.peaks import Peak, parse_device_info

    torch_src = "torch._inductor.analysis.device_info"
    table = parse_device_info(DEVICE_INFO)
    assert table == {
        # H100 and L4: listed with sparse figures and no factor in this torch: halved by ours
        "NVIDIA H100": Peak(f"{torch_src} (sparse figures halved)",
                            {"float64": 33.5, "bfloat16": 989.5, "tf32": 494.5}, 3350),
        "NVIDIA L4": Peak(f"{torch_src} (sparse figures halved)", {"bfloat16": 121.0}, 300),
        "NVIDIA A100": Peak(torch_src, {"bfloat16": 312.0}, 2039.0),
        "NVIDIA B200": Peak(torch_src, {"bfloat16": 2250.0}, 8000.0),  # torch's own factor
        "AMD MI300X": Peak(torch_src, {"bfloat16": 1307.4}, None),
        "AMD INSTINCT MI300X": Peak(torch_src, {"bfloat16": 1307.4}, None),
    }
    assert table["AMD INSTINCT MI300X"] is table["AMD MI300X"]
    # the table assigned without an annotation, as older torch writes it
    assert parse_device_info('_device_mapping = {"A": DeviceInfo(tops={}, dram_bw_gbs=1)}') == \
        {"A": Peak(torch_src, {}, 1)}


def test_device_peak_longest_prefix_then_the_supplement(monkeypatch):
    from trace_reader.facts import peaks

    monkeypatch.setattr(peaks, "_torch_table", {"NVIDIA H100": "h100", "NVIDIA H100 NVL": "nvl", "NVIDIA A": "a"})
    assert peaks.device_peak("NVIDIA H100 80GB HBM3") == "h100"
    assert peaks.device_peak("nvidia h100 nvl") == "nvl"  # the longer family name wins, in any case
    assert peaks.device_peak("NVIDIA H100") == "h100"
    # a family name is a whole word of the device's name, not a prefix of one
    assert peaks.device_peak("NVIDIA H1000") is None and peaks.device_peak("NVIDIA A100") is None
    assert peaks.device_peak("NVIDIA H200 141GB").source == "NVIDIA H200 datasheet (not in torch's table)"
    assert peaks.device_peak("") is None and peaks.device_peak(None) is None
    monkeypatch.setattr(peaks, "_torch_table", None)
    monkeypatch.setattr(peaks, "_load_snapshot", lambda: 1 / 0)  # a damaged snapshot: peaks unknown
    assert peaks.device_peak("NVIDIA H100") is None and peaks._torch_table == {}
    assert peaks.device_peak("NVIDIA H200").gbs == 4800.0


def _bench_record():
    """Two shapes with made-up times, every round equal (no spread): the post's shape, fused 200 µs against Liger's
    160 (0.80x: slower), graph replays 125 against the best other's 150; a decode shape, fused 8 µs against
    eager's 10 (1.25x), no graph replay."""
    def v(us, graph=None):
        return {"median_us": us, "rounds_us": [us] * 3, **({"graph_median_us": graph} if graph else {})}

    post = {"M": 8192, "dim": 768, "hidden": 3072, "floor_us": 100.0, "bound": "compute",
            "variants": {"eager": v(250.0, 240.0), "compile": v(200.0), "liger": v(160.0, 150.0),
                         "fused": v(200.0, 125.0)}}
    decode = {"M": 1, "dim": 64, "hidden": 128, "floor_us": 2.0, "bound": "memory",
              "variants": {"eager": v(10.0), "fused": v(8.0)}}
    return {"date": "2026-11-30T01:02:03", "device": "NVIDIA H200", "torch": "2.11", "triton": "3.6",
            "cuda": "13.0", "liger_kernel": "0.8.5", "dtype": "bf16", "ceiling_tflops": 680.4, "copy_tbps": 4.256,
            "shapes": [post, decode]}


def test_markdown_table_of_a_record_by_hand():
    # of floor: 100 / 200 = 0.50, 2 / 8 = 0.25; graph: 100 / 125 = 0.80
    assert bench.markdown_table(_bench_record()).splitlines() == [
        "Measured on 2026-11-30 on an NVIDIA H200 (torch 2.11, triton 3.6, CUDA 13.0, liger-kernel 0.8.5, bf16); "
        "ceilings 680 TFLOP/s (GEMM) and 4.26 TB/s (copy). µs, median of 3 rounds; full record: "
        "`results/bench_h200.json` and `.txt`.",
        "",
        "| M×dim→hidden | floor (bound) | eager | compile | max-autotune | Liger | fused (of floor) "
        "| fused vs best other | GPU time alone (graph): fused vs best other (fused of floor) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| 8192×768→3072 (the post's) | 100.0 µs (compute) | 250.0 | 200.0 | - | 160.0 | **200.0** (0.50) "
        "| 0.80× (slower: liger) | 125.0 vs 150.0 (0.80) |",
        "| 1×64→128 | 2.0 µs (memory) | 10.0 | - | - | - | **8.0** (0.25) | 1.25× | - |",
    ]
    assert bench.ceilings_line(_bench_record()) == \
        "NVIDIA H200: bf16 8192^3 matmul 680 TFLOP/s, 1 GiB copy 4.26 TB/s (the ceilings)"


def test_timing_fields_say_how_each_device_timed():
    assert bench.timing_fields(True) == {
        "timer": "bench.median_us (CUDA events, L2 evicted before each call); middle of 5 round-robin rounds",
        "ceiling_gemm": "8192x8192x8192"}
    assert bench.timing_fields(False) == {
        "timer": "bench.cpu_median_us: time.perf_counter median of 5 calls (CPU smoke test)",
        "ceiling_gemm": "512x512x512"}
    assert bench.timing_fields(True, 15, 30)["timer"] == (
        "bench.median_us (CUDA events, L2 evicted before each call); middle of 15 round-robin rounds of ~30 ms of "
        "calls each")


def test_round_robin_rotates_its_start_and_passes_the_round_length(monkeypatch):
    order = []
    monkeypatch.setattr(bench, "median_us", lambda fn, rep_ms, inference: order.append((fn, rep_ms)) or len(order))
    times = bench.time_round_robin({"a": "A", "b": "B", "c": "C"}, rounds=4, rep_ms=30)
    # rounds start at a, b, c, then a again; every call asks for ~30 ms of calls
    assert [fn for fn, _ in order] == list("ABC" "BCA" "CAB" "ABC") and {ms for _, ms in order} == {30}
    assert times == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]}
    order.clear()
    assert len(bench.time_round_robin({"a": "A"})["a"]) == 5 and order[0][1] == 100  # bench.py's own: 5 of 100 ms


def test_interleaved_rounds_call_the_fns_in_turn_and_keep_each_ones_middle(monkeypatch):
    """time_interleaved: one call of each fn in turn, the start rotated each round, as many calls each as ~rep_ms of
    the slowest one's warm-up estimate allows (at least 5); each fn's round is the median of its own calls."""
    calls, synced = [], []
    warm = {"A": 2.0, "B": 10.0, "C": 1.0}  # ms per call: B's 10 ms sets 30 ms / 10 = 3 calls -> at least 5
    monkeypatch.setattr(bench, "_warm_up", lambda fn: warm[fn])
    monkeypatch.setattr(bench, "_events", lambda n: [(i, None) for i in range(n)])
    monkeypatch.setattr(bench, "_timed_call", lambda fn, start, end: calls.append((fn, start)))
    monkeypatch.setattr(bench, "_median_of", lambda events: len(calls) * 1000 + len(events))
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: synced.append(len(calls)))
    times = bench.time_interleaved({"a": "A", "b": "B", "c": "C"}, rounds=2, rep_ms=30)
    assert [fn for fn, _ in calls] == list("ABC" * 5 + "BCA" * 5)
    assert [i for _, i in calls[:6]] == [0, 0, 0, 1, 1, 1]  # the i-th call of each uses its i-th pair of events
    assert synced == [15, 30]  # the GPU waited on once a round, after all its calls
    assert times == {"a": [15005, 30005], "b": [15005, 30005], "c": [15005, 30005]}
    calls.clear()
    warm["B"] = 0.05  # 30 ms / 2 ms (A now the slowest) -> 15 calls each
    assert len(bench.time_interleaved({"a": "A", "b": "B"}, rounds=1, rep_ms=30)["a"]) == 1
    assert [fn for fn, _ in calls] == list("AB" * 15)


def test_median_us_is_one_round_of_one_fn(monkeypatch):
    """median_us: warm-up once, ~rep_ms of timed calls (at least 5, at most 300) after it, then their median."""
    calls, warmed = [], []
    monkeypatch.setattr(bench, "_warm_up", lambda fn: warmed.append(fn) or 4.0)  # 4 ms a call
    monkeypatch.setattr(bench, "_events", lambda n: [(i, None) for i in range(n)])
    monkeypatch.setattr(bench, "_timed_call", lambda fn, start, end: calls.append((fn, start)))
    monkeypatch.setattr(bench, "_median_of", lambda events: 1000 + len(events))
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    assert bench.median_us("F", rep_ms=100) == 1025 and warmed == ["F"]  # 100 ms / 4 ms = 25 calls
    assert calls == [("F", i) for i in range(25)]
    calls.clear()
    assert bench.median_us("F", rep_ms=1) == 1005 and len(calls) == 5  # never fewer than 5


def test_write_record_leaves_the_json_and_its_table(tmp_path):

    out = tmp_path / "new" / "b.json"
    said = bench.write_record(out, {"a": 1}, ["line 1", "line 2"])
    assert out.read_text() == '{\n  "a": 1\n}\n'
    assert (tmp_path / "new" / "b.txt").read_text() == "line 1\nline 2\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.json", "b.txt"]  # no .tmp left
    assert said == f"\nwrote {out}\n      {out.with_suffix('.txt')}"


# ---- kernels.py: FLOPs and bytes from recorded shapes, at their limits ------------------------------------------

def op(name, dims=None, types=None, **args):
    """An op as the reader sees it: a name and its args ("Input Dims", "Input type", ...)."""
    from types import SimpleNamespace

    if dims is not None:
        args["Input Dims"] = dims
    if types is not None:
        args["Input type"] = types
    return SimpleNamespace(name=name, args=args)


@pytest.mark.parametrize("o, flops", [
    (op("aten::mm", [[4, 8], [8, 16]]), 2 * 4 * 8 * 16),
    (op("aten::addmm", [[16], [4, 8], [8, 16]]), 2 * 4 * 8 * 16),  # the bias first
    (op("aten::bmm", [[3, 4, 8], [3, 8, 16]]), 2 * 3 * 4 * 8 * 16),
    (op("aten::mm", [[4, 8], [9, 16]]), None),  # inner sizes differ
    (op("aten::mm", [[4, 8], [2, 8, 16]]), None),  # ranks differ
    (op("aten::mm", [[1, 2, 4, 8], [1, 2, 8, 16]]), None),  # rank 4
    (op("aten::mm", [[4, 8]]), None),  # one operand
    (op("aten::addmm", [[16], [4, 8]]), None),
    (op("aten::mul", [[4, 8], [8, 16]]), None),  # not a matmul
    (op("aten::mm", [[4, -8], [-8, 16]]), None),
    (op("aten::mm", [[4, True], [True, 16]]), None),
    (op("aten::mm", [[1, 2**40], [2**40, 1]]), None),  # no dimension is that long
    (op("aten::mm", [[1, 2**40 - 1], [2**40 - 1, 1]]), 2.0 * (2**40 - 1)),
    (op("aten::mm", [[10**6, 10**6], [10**6, 5 * 10**5]]), None),  # 1e18 FLOPs: a made-up shape
    (op("aten::mm", [[10**6, 10**6], [10**6, 499_999]]), 2.0 * 10**12 * 499_999),
    (op("aten::mm", "not a list"), None),
])
def test_gemm_flops_at_the_limits(o, flops):
    from trace_reader.facts.kernels import gemm_flops

    assert gemm_flops(o) == flops
    assert gemm_flops(None) is None


def test_gemm_bytes_reads_each_input_once_and_writes_the_output():
    from trace_reader.facts.kernels import gemm_bytes

    bf16 = "c10::BFloat16"
    # [4, 8] @ [8, 16] in bf16: (32 + 128) * 2 read, 4 * 16 * 2 written
    assert gemm_bytes(op("aten::mm", [[4, 8], [8, 16]], [bf16, bf16])) == 448.0
    assert gemm_bytes(op("aten::addmm", [[16], [4, 8], [8, 16]], [bf16] * 3)) == 480.0  # + the bias, 32
    # an out= buffer after the operands is written, not read; fp32 output of bf16 operands is not a thing here
    assert gemm_bytes(op("aten::mm", [[4, 8], [8, 16], [4, 16]], [bf16] * 3)) == 448.0
    assert gemm_bytes(op("aten::mm", [[4, 8], [8, 16]], [bf16])) is None  # a type missing
    assert gemm_bytes(op("aten::mm", [[4, 8], [8, 16]], [bf16, "c10::Weird"])) is None
    assert gemm_bytes(op("aten::mm", [[4, 8], [8, 16]], ["float", "float"])) == 896.0
    assert gemm_bytes(op("aten::mul", [[4, 8], [8, 16]], [bf16, bf16])) is None


@pytest.mark.parametrize("o, sources, want", [
    (op("k", kernel_num_gb=0.5), None, (5e8, True)),  # Inductor's own count
    (op("aten::mul", [[4, 8], [8]], ["float", "float"]), None, (32 * 4 + 8 * 4 + 32 * 4, True)),  # + the output
    # fp16 times fp32: the output is fp32, as torch promotes (it was counted in the first input's dtype)
    (op("aten::mul", [[4, 8], [8]], ["c10::Half", "float"]), None, (32 * 2 + 8 * 4 + 32 * 4, True)),
    (op("aten::mul_", [[4, 8], [8]], ["float", "float"]), None, (32 * 4 + 8 * 4, True)),  # in place
    (op("aten::add.out", [[4, 8], [4, 8]], ["float", "float"]), None, (256.0, True)),
    (op("aten::add", [[8], [3, 1]], ["float", "float"]), None, (8 * 4 + 3 * 4 + 24 * 4, True)),  # broadcast [3, 8]
    (op("aten::add", [[2, 1, 4], [3, 1]], ["float", "float"]), None, (8 * 4 + 3 * 4 + 24 * 4, True)),  # [2, 3, 4]
    (op("aten::mul", [[4, 8], [4, 8]], ["float", "float"]), None, (3 * 32 * 4, True)),  # alike: the output [4, 8]
    (op("aten::mul", [[4, 8], [4, 1]], ["float", "float"]), None, (32 * 4 + 4 * 4 + 32 * 4, True)),  # [4, 8] again
    (op("aten::mul", [[4, 8], []], ["float", "Scalar"]), None, (32 * 4 + 32 * 4, True)),  # a scalar moves nothing
    (op("aten::mul", [[], []], ["float", "float"]), None, None),
    (op("aten::mul", [[4, 8]], ["c10::Weird"]), None, None),
    (op("triton_poi_fused_0", [[4, 8], [4, 8]], ["float", "float"]), None, (256.0, False)),  # lists its output too
    (op("triton_poi_fused_0", [[4, 8], [4, 8]], ["float", "float"], kernel_file="k.py"),
     {"k.py": "def triton_poi_fused_0(in_out_ptr0, in_ptr0, xnumel, XBLOCK : tl.constexpr):"}, (384.0, True)),
    (op("k", [[4, 8], [4, 8]], ["float", "float"], kernel_backend="triton", kernel_name="kern", kernel_file="k.py"),
     {"k.py": "def kern(in_ptr0, out_ptr0, xnumel):"}, (256.0, True)),
    # 1.25e14 floats in and out: 1e15 B, a made-up shape; 1e7 elements fewer: kept
    (op("aten::mul", [[10**7, 12_500_000], []], ["float", "Scalar"]), None, None),
    (op("aten::mul", [[10**7, 12_499_999], []], ["float", "Scalar"]), None, (1e15 - 8e7, True)),
    (op("k", [[4]], ["float"], kernel_num_gb=1e6), None, (16.0 + 16.0, True)),  # a petabyte count is not used
])
def test_pointwise_bytes_at_the_limits(o, sources, want):
    from trace_reader.facts.kernels import pointwise_bytes

    assert pointwise_bytes(o, sources) == want
    assert pointwise_bytes(None) is None


def test_alike_shapes_broadcast_as_the_padding_loop_does():
    """_broadcast answers alike shapes at once, as its padding loop answers them (a shape of 1s sends a pair there),
    a dimension of 0 too."""
    from trace_reader.facts.kernels import _broadcast

    for shape in ([4, 8], [4, 0, 1], [0], [3]):
        assert _broadcast([shape, shape]) == _broadcast([shape]) == _broadcast([shape, [1] * len(shape)])


def select(dim):
    """index_select of a [3] long index from a [4, 6] fp32 source along `dim` (as the profiler records it)."""
    concrete = {} if dim is None else {"Concrete Inputs": ["", dim, ""]}
    return op("aten::index_select", [[4, 6], [], [3]], ["float", "Scalar", "long int"], **concrete)


@pytest.mark.parametrize("o, want", [
    # a [512] long index into a [32000, 2048] bf16 table: 512 * 8 B of index, 512 rows of 2048 read and written
    (op("aten::embedding", [[32000, 2048], [512]], ["c10::BFloat16", "long int"]), 512 * 8 + 2 * 512 * 2048 * 2),
    (select("1"), 3 * 8 + 2 * 3 * 4 * 4),  # dim 1: 3 columns of 4 from a [4, 6] source
    (select("-1"), 3 * 8 + 2 * 3 * 4 * 4),
    (select("-2"), 3 * 8 + 2 * 3 * 6 * 4),  # dim 0: 3 rows of 6
    (select(None), 3 * 8 + 2 * 3 * 6 * 4),  # no recorded dim: 0
    (select("2"), None), (select("-3"), None),  # no such dim
    (op("aten::gather", [[4, 6], [], [4, 2]], ["float", "Scalar", "long int"]), 8 * 8 + 2 * 8 * 4),  # one per entry
    (op("aten::take", [[4, 6], [5]], ["float", "long int"]), 5 * 8 + 2 * 5 * 4),
    (op("aten::take", [[4, 6]], ["float"]), None),
    (op("aten::take", [[4, 6], [5]], ["float", "c10::Weird"]), None),
    (op("aten::take", [[], [5]], ["float", "long int"]), None),
])
def test_indexing_reads_only_what_the_index_picks(o, want):
    from trace_reader.facts.kernels import pointwise_bytes

    assert pointwise_bytes(o) == (None if want is None else (float(want), True))


def test_short_names_fit_their_column():
    from trace_reader.facts.kernels import short

    assert short("void " + "k" * 10, False, 10) == "k" * 10  # "void " dropped, then it fits exactly
    assert short("k" * 11, False, 10) == "k" * 9 + "…"
    assert short("void " + "k" * 11, True, 10) == "void " + "k" * 11  # full: byte for byte
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, " \
           "at::native::binary_internal::MulFunctor<float>>, std::array<char*, 3>>(int, T2, T3)"
    assert short(name, False) == "vectorized_elementwise_kernel<…MulFunctor…>"
    assert short(name, False, 20) == name[5:24] + "…"  # even the cut form does not fit


def test_short_names_pick_the_functor_as_the_one_regex_did_without_its_cost():
    """The functor is the first identifier holding Functor or Impl after its first letter (the old regex,
    \\w+(?:Functor|Impl)\\w*, written here to compare); a 300,000-letter name of no functor is cut to the column
    at once (the regex took minutes: it backtracked from every letter)."""
    import re
    import time

    from trace_reader.facts.kernels import short

    def by_regex(name):
        found = [f for f in dict.fromkeys(re.findall(r"(\w+(?:Functor|Impl)\w*)", name))
                 if not f.startswith(("Binary", "AUnary", "BUnary", "Unary"))]
        return found[0] if found else None

    pad = ", " + "x" * 80
    for inner in ("MulFunctor<float>", "GeluCUDAKernelImpl", "Functor<a, AddFunctor>", "ImplFoo, SumImpl",
                  "BinaryFunctor<T, CUDAFunctor_add>", "FunctorImpl", "Functor, Impl", "aImpl_bFunctor"):
        name = f"void at::k<4, {inner}{pad}>(int)"
        want = by_regex(name)
        assert short(name, False) == (f"k<…{want}…>" if want else name[5:76] + "…"), inner
    start = time.perf_counter()
    assert short("k" * 300_000, False) == "k" * 71 + "…"
    assert time.perf_counter() - start < 5  # the regex's quadratic walk: minutes


def test_gemm_or_pointwise_by_name_and_op():
    from types import SimpleNamespace

    from trace_reader.facts.kernels import is_gemm, is_pointwise, most_common, op_dtype

    def k(name, op_name=None, is_kernel=True):
        return SimpleNamespace(name=name, op=op_name and SimpleNamespace(name=op_name), is_kernel=is_kernel)

    assert is_gemm(k("anything", "aten::mm")) and is_gemm(k("sm90_xmma_gemm_bf16bf16")) and is_gemm(k("nvjet_tst"))
    assert not is_gemm(k("triton_poi_fused_mm_0")) and not is_gemm(k("elementwise_kernel", "aten::mul"))
    # max-autotune's Triton templates, named after the ops they hold, launched by no aten GEMM op
    for name in ("triton_tem_fused_mm_0", "triton_tem_fused_addmm_0", "triton_tem_fused_addmm_gelu_1",
                 "triton_tem_fused__unsafe_view_mm_4", "triton_tem_fused_bmm_2", "triton_tem_fused_baddbmm_3"):
        assert is_gemm(k(name)), name
    for name in ("triton_tem_fused_flex_attention_0", "triton_poi_fused_addmm_gelu_0", "triton_tem_fused_summary_0"):
        assert not is_gemm(k(name)), name
    assert is_pointwise(k("elementwise_kernel")) and not is_pointwise(k("Memset", is_kernel=False))
    assert not is_pointwise(k("cutlass_kernel"))
    assert op_dtype(op("aten::mm", types=["Scalar", "c10::Half", "float"])) == "float16"
    assert op_dtype(op("aten::mm", types=["long int"])) is None and op_dtype(None) is None
    assert most_common([("a",), ("b",), ("b",), ("a",)]) == ["a"] and most_common([]) == []


def test_per_annotation_counts_calls_and_leaves_no_gpu_time_unset():
    """Layer 1's mlp runs twice in the step (a second span 171..176 with no work): 2 calls, its CPU time 68 + 5;
    on a CPU trace no annotation has GPU time or kernels."""
    from test_inspect_trace import parse
    from test_reader_report import x
    from trace_reader.analyzers import modules

    data = two_layer_step()
    data["traceEvents"].append(x("model.layers.1.mlp", "user_annotation", 171, 5))
    rows = modules.per_annotation(parse(data))
    assert rows["model.layers.1.mlp"] == {"gpu_us": [20.0], "kernels": [1], "cpu_us": [73.0], "calls": [2]}
    assert rows["model.layers.0"] == {"gpu_us": [32.0], "kernels": [3], "cpu_us": [79.0], "calls": [1]}
    cpu = {"traceEvents": [e for e in data["traceEvents"] if e["cat"] in ("user_annotation", "cpu_op")]}
    assert modules.per_annotation(parse(cpu))["model.layers.0"] == {"gpu_us": [0.0], "kernels": [0], "cpu_us": [79.0],
                                                                     "calls": [1]}


def test_breakdown_edges_no_step_annotation_and_no_time():
    """Without the step annotation the step's CPU time is its ProfilerStep span (200 µs) and `decode` is a module;
    a `## ... ##` annotation is no module; a step whose time is 0 has no shares."""
    from test_inspect_trace import parse
    from test_reader_report import x
    from trace_reader.analyzers import modules

    data = two_layer_step()
    data["traceEvents"].append(x("## sync ##", "user_annotation", 181, 2))
    d = modules.breakdown(parse(data), "prefill")
    assert d["total"]["cpu_us"] == 200.0 and "decode" in d["top_level"] and "## sync ##" not in d["top_level"]
    assert "## sync ##" not in modules.breakdown(parse(data), "decode")["top_level"]
    idle = {"traceEvents": [x("ProfilerStep#2", "user_annotation", 0, 10), x("decode", "user_annotation", 1, 0),
                            x("model.layers.0", "user_annotation", 1, 0)]}
    d = modules.breakdown(parse(idle), "decode")
    assert d["total"]["share"] is None and d["outside"]["share"] is None
    assert [r["share"] for r in d["types"]] == [None] and "   -" in modules.breakdown_text(d)


def test_module_expectations_say_what_they_ask():
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    t = parse(two_layer_step())
    assert modules.kernels_between(7, None, "x").text == "at least 7 GPU kernels per step (x)"
    assert modules.kernels_between(0, 5, "x").text == "at most 5 GPU kernels per step (x)"
    assert modules.kernels_between(2, 5, "x").text == "2 to 5 GPU kernels per step (x)"
    assert modules.runtime_calls("cudaLaunchKernel", 6).text == "6 cudaLaunchKernel per step"
    assert modules.runtime_calls("cudaLaunchKernel", 6, "y").text == "6 cudaLaunchKernel per step (y)"
    for e in (modules.kernels_between(1, 2, "x"), modules.runtime_calls("c", 1), modules.largest_module("mlp", "d"),
              modules.module_launches("mlp", "x")):
        assert e.device == "cuda"
    # a decoder layer launches every kernel of its parts, each pattern looked for among all of them: layer 0 has
    # both, layer 1 (its mlp only) neither
    assert modules.module_launches("decoder layer", "x", has=("k_attn", "k_add")).check(t) == \
        "model.layers.1: nothing matches ['k_add', 'k_attn']"
    # layer 1 has an annotated part, layer 0 too: with only layer 0's parts annotated, layer 1 is named
    data = two_layer_step()
    data["traceEvents"] = [e for e in data["traceEvents"] if e["name"] != "model.layers.1.mlp"]
    assert modules.modules_annotated(2, "decode").check(parse(data)) == \
        "ProfilerStep#2: decoder layers with annotated parts: [0]"


# ---- memory.py: sizes, the allocator's rounding, which op made an allocation ------------------------------------

@pytest.mark.parametrize("nbytes, said", [(1023, "1023 B"), (1024, "1.0 KiB"), (2**20 - 52, "1023.9 KiB"),
                                          (2**20, "1.0 MiB"), (2**30 - 2**19, "1023.5 MiB"), (2**30, "1.0 GiB"),
                                          (-2048, "-2.0 KiB"), (0, "0 B")])
def test_size_unit_changes_at_each_power_of_1024(nbytes, said):
    from trace_reader.analyzers.memory import fmt_size as _size

    assert _size(nbytes) == said


@pytest.mark.parametrize("nbytes, device, block", [
    (1, "cuda", 512), (512, "cuda", 512), (513, "cuda", 1024),
    (2**20, "cuda", 2**20),  # the small pool's largest: as rounded
    (2**20 + 1, "cuda", 2**20 + 512 + 2**20),  # the large pool: up to 1 MiB more, unsplit
    (513, "cpu", 513)])
def test_largest_block_the_allocator_may_report(nbytes, device, block):
    from trace_reader.analyzers.memory import largest_block

    assert largest_block(nbytes, device) == block


def test_the_op_that_made_an_allocation_at_its_edges():
    """aten::bmm spans 10..30 on thread (1, 1) and calls aten::empty 12..13: an allocation inside the empty is
    bmm's (empty only asks the allocator), one at 30 still bmm's, one at 31 or on another thread nobody's."""
    from test_inspect_trace import parse
    from test_reader_report import x
    from trace_reader.analyzers.memory import Alloc, _maker

    t = parse({"traceEvents": [x("ProfilerStep#2", "user_annotation", 0, 100), x("aten::bmm", "cpu_op", 10, 20),
                               x("aten::empty", "cpu_op", 12, 1), x("Torch-Compiled Region: 0/0", "cpu_op", 40, 10),
                               x("aten::add", "cpu_op", 42, 2)]})
    [st] = t.steps

    def made(ts, thread=(1, 1)):
        e = _maker(st, Alloc(ts, 64.0, 64.0, (0, 0), None, thread))
        return e and e.name

    assert [made(10), made(12.5), made(30), made(31), made(20, (1, 2))] == ["aten::bmm"] * 3 + [None, None]
    assert made(43) == "aten::add" and made(45) == "Torch-Compiled Region: 0/0"


# ---- what a run says about its picture and its noise --------------------------------------------------------------

def test_pictures_are_named_after_their_record_and_trace(tmp_path):
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step
    from trace_reader.render import plot

    assert plot.bench_chart_next_to(_bench_record(), tmp_path / "b.json", "w") == f"wrote {tmp_path / 'b.png'}"
    assert plot.plot_next_to(parse(two_kernels_step()), tmp_path / "t.json") == f"wrote {tmp_path / 't.png'}"
    assert plot.plot_next_to(parse(two_kernels_step()), tmp_path / "u.json.gz") == f"wrote {tmp_path / 'u.png'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "t.png", "u.png"]


def test_shape_table_says_slower_in_capitals_only_beyond_the_spread():
    r = _bench_record()["shapes"][0]  # fused 200 µs, Liger 160: 0.80x, no spread
    r.update(bench.roofline(8192, 768, 3072, 2, 680.0, 4.0), skipped=[], parts={})
    for v in r["variants"].values():
        v["rel_err"] = 1e-3
    lines = bench.shape_lines(r, 680.0, 4.0)
    assert lines[-1] == "  fused vs best of the others (liger): 0.80x SLOWER beyond the spread"


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux's /proc tells who holds a port")
def test_the_port_holder_is_named_with_its_command_line():
    import os
    import socket

    from trace_reader import serve as serve_trace

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        assert serve_trace._port_holder(port) == f"pid {os.getpid()} ({cmd})"
    assert serve_trace._port_holder(port) is None  # closed: nobody listens


def fake_shape(M, dim, hidden, dtype, tol, c, b, tuned, act="gelu_tanh"):
    """A shape's record as bench_shape makes it, its times _bench_record's decode shape's, replayed as graphs 1 µs
    faster and enqueued in twice their time."""
    shape = _bench_record()["shapes"][1]
    for v in shape["variants"].values():
        us = v["median_us"]
        v.update(graph_median_us=us - 1, graph_rounds_us=[us - 1] * 3, host_us=2 * us, host_bursts_us=[2 * us] * 5)
    return {**shape, "M": M, "dim": dim, "hidden": hidden, "tuned": tuned, "tol": tol,
            "skipped": [], "parts": {}, "rel_err": 0.0, "flops": 1.0, "bytes": 1.0, "floor_compute_us": 1.0,
            "floor_memory_us": 2.0}


def fake_bench(monkeypatch, **fakes):
    """bench.main without a GPU: ceilings 680 TFLOP/s and 4 TB/s, fake_shape's times, no table and no chart; `fakes`
    replace more of bench's functions."""
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "keep_compile_workers", lambda: None)
    monkeypatch.setattr(bench, "gemm_ceiling_tflops", lambda dtype: 680.0)
    monkeypatch.setattr(bench, "copy_bandwidth_tbps", lambda: 4.0)
    monkeypatch.setattr(bench, "versions", lambda device="cuda": {"device": "a GPU", "date": "2026-11-30T00:00:00"})
    for name, fn in {"bench_shape": fake_shape, "shape_lines": lambda *a, **k: [], "table_text": lambda record: "",
                     "bench_chart_next_to": lambda record, out, title: "", **fakes}.items():
        monkeypatch.setattr(bench, name, fn)


def test_main_writes_what_the_record_says_it_measured(tmp_path, monkeypatch):
    """bench.main's record beside its numbers: how it timed, the ceilings' workloads, the floor's formula."""
    import json

    fake_bench(monkeypatch)
    out = tmp_path / "new" / "b.json"  # its folder made first: the partial record goes there too
    assert bench.main(["--shapes", "1x4096x11008,2x4096x11008", "--dtype", "fp16", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {k: v for k, v in record.items() if k not in ("shapes", "fused_config", "liger_kernel")} == {
        "device": "a GPU", "date": "2026-11-30T00:00:00", "dtype": "fp16", "activation": "gelu_tanh",
        "timer": "CUDA events, median over ~100 ms of calls, L2 evicted by a 256 MB read before each call; "
                 "middle of 5 interleaved rounds (one call of each variant in turn)",
        "weights": "one copy, read by every variant (share_weights)", "graph_every_row": True,
        "graph_timer": "the same forward captured in a CUDA graph and replayed, timed as above (5 interleaved rounds "
                       "(one call of each variant in turn))",
        "host_timer": "bench.host_bursts_us: µs per call over a burst of calls enqueued without waiting for the GPU, "
                      "100 a burst or as many as fill ~50 ms of the GPU's time (at least 20); the median of 5 bursts",
        "ceiling_tflops": 680.0, "ceiling_gemm": "8192x8192x8192",
        "copy_tbps": 4.0, "copy": "1 GiB device-to-device, bytes read + written",
        "floor": "max(6*M*dim*hidden / ceiling, bytes / copy) with bytes = the 3 weights + x + y"}
    # max-autotune "some": at MAX_AUTOTUNE_SHAPES only (1x4096x11008 is one); fp16 is checked to 5e-3
    assert [(s["tuned"], s["tol"]) for s in record["shapes"]] == [(True, 5e-3), (False, 5e-3)]
    assert set(record["fused_config"]) == {"hopper", "portable", "small_m", "tuned"}


# ---- memory.py: temporaries at the step's and the op's end -------------------------------------------------------

def test_temporaries_at_the_ends_of_the_step_and_the_op(tmp_path):
    """Steps [0, 99] and [100, 199]; aten::bmm 10..20 allocates the 1 MiB scores at 11.5 (test_expect_shapes'
    traces). Freed at the step's last µs: a temporary; freed as the op returns: its scratch; a 0-byte event on
    the same block is no free."""
    from test_expect_shapes import FUSED_OPS, MATH_OPS, S, alloc_trace
    from trace_reader.analyzers import memory

    both = {2: [(S, "aten::bmm")], 3: [(S, "aten::bmm")]}
    assert memory.temporaries(alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (99, -S, 1000)]), S) == both
    zero = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (15, 0, 1000), (35, -S, 1000)], name="zero.json")
    assert memory.temporaries(zero, S) == both
    scratch = alloc_trace(tmp_path, FUSED_OPS, [(11.5, 4 * S, 1000), (40, -4 * S, 1000)], name="scratch.json")
    assert memory.temporaries(scratch, S) == {2: [], 3: []}  # FUSED_OPS's op ends at 10 + 30


def test_allocates_says_what_it_looked_for_and_saw(tmp_path):
    from test_expect_shapes import MATH_OPS, S, alloc_trace
    from trace_reader.analyzers import memory

    assert memory.allocates(S, "the scores", True).text == \
        "allocates the scores (1.0 MiB): a temporary of at least that size in every step"
    assert memory.allocates(S, "the scores", False).text == \
        "never allocates the scores (1.0 MiB): no allocation of that size passes between ops in any step"
    three = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (12, 2 * S, 2000), (12.5, S, 3000),
                                             (35, -S, 1000), (36, -2 * S, 2000), (37, -S, 3000)])
    each = "3: 1.0 MiB from aten::bmm, 2.0 MiB from aten::bmm, ..."
    assert memory.allocates(S, "the scores", False).check(three) == \
        f"allocations passed between ops of >= 1.0 MiB per step: #2 {each}; #3 {each}"
    small = alloc_trace(tmp_path, MATH_OPS, [(11.5, S - 1, 1000), (35, -(S - 1), 1000)], name="small.json")
    assert memory.allocates(S, "the scores", True).check(small) == \
        "temporaries of >= 1.0 MiB per step: #2 none; #3 none"


# ---- serve_trace.py: a refusal is plain text; a trace gone since the start is a 404 that says why ------------------

def test_a_trace_removed_while_served_is_a_plain_404(tmp_path):
    from test_serve_trace import TRACE_JSON, Running

    trace = tmp_path / "t.json"
    trace.write_bytes(TRACE_JSON)
    s = Running(trace, timeout=2.0)
    trace.unlink()
    resp, body = s.request("GET")
    assert (resp.status, body) == (404, b"404 Not Found (No such file or directory)\n")
    assert resp.getheader("Content-Type") == "text/plain; charset=utf-8"
    assert resp.getheader("Content-Length") == str(len(body))
    assert s.finish() == "timed out"  # a 404 is no fetch


# ---- plot.py's command line ---------------------------------------------------------------------------------------

def test_chart_command_writes_next_to_the_record_or_refuses_in_one_line(tmp_path, capsys):
    import json

    from trace_reader.render import plot

    record = tmp_path / "b.json"
    record.write_text(json.dumps(_bench_record()))
    assert plot.main(["--bench", str(record)]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'b.png'}\n" and (tmp_path / "b.png").exists()
    record.write_text("[1, 2]")
    assert plot.main(["--bench", str(record)]) == 2
    assert capsys.readouterr().err == \
        f"python -m trace_reader.plot: error: {record}: not a benchmark record (expected a JSON object)\n"


def test_a_preflight_gets_back_the_headers_it_asked_for_and_nothing_more(tmp_path):
    from test_serve_trace import TRACE_JSON, Running

    trace = tmp_path / "t.json"
    trace.write_bytes(TRACE_JSON)
    s = Running(trace, timeout=5.0)
    resp, body = s.request("OPTIONS", headers={"Access-Control-Request-Method": "GET",
                                               "Access-Control-Request-Headers": "range, x-y"})
    assert (resp.status, body) == (204, b"")
    assert resp.getheader("Access-Control-Allow-Headers") == "range, x-y"
    assert resp.getheader("Access-Control-Allow-Methods") == "GET, HEAD, OPTIONS"
    assert resp.getheader("Access-Control-Max-Age") == "600" and resp.getheader("Content-Length") == "0"
    assert resp.getheader("Access-Control-Allow-Private-Network") is None  # not asked for
    assert resp.getheader("Vary") == "Origin"
    assert s.request("GET")[1] == TRACE_JSON and s.finish() == "fetched"


def test_the_whole_report_of_a_cpu_trace_counted_by_hand():
    """Two 90 µs CPU steps: `fwd` 80 µs around aten::mm (30 µs, then 40) and aten::add (10 µs, calling aten::empty
    for 1). Self time per step: fwd 80 - 40 and 80 - 50, mean 35; mm 35; add 10 - 1 = 9; empty 1: 80 in all
    (shares 43.75%, 11.25%, 1.25%). The units of work: mm and add (empty only asks the allocator)."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    ev = []
    for s in range(2):
        t0 = 100 * s
        ev += [x(f"ProfilerStep#{s + 2}", "user_annotation", t0, 90), x("fwd", "user_annotation", t0 + 1, 80),
               x("aten::mm", "cpu_op", t0 + 10, 30 + 10 * s), x("aten::add", "cpu_op", t0 + 50, 10),
               x("aten::empty", "cpu_op", t0 + 52, 1)]
    assert it.report(parse({"traceEvents": ev})) == """\
trace   <test>
device  CPU only (no GPU activity in the trace)
steps   2 active ProfilerStep (#2, #3)

CPU ops by self time per step (mean over 2 steps; top 4 of 4):
op           calls/step  self µs/step  share
-----------  ----------  ------------  -----
fwd                   1          35.0  43.8%
aten::mm              1          35.0  43.8%
aten::add             1           9.0  11.2%
aten::empty           1           1.0   1.2%

Work in order (the CPU's kernels: fused C++ kernels, GEMMs and other computing aten ops, each with what it calls; \
mean over 2 of 2 steps, those in the typical order):
#  kernel     mean µs    min–max
-  ---------  -------  ---------
1  aten::mm      35.0  30.0–40.0
2  aten::add     10.0  10.0–10.0
every step runs the same 2 units of work in the same order
Inductor C++ kernels: none: an eager run (no Torch-Compiled Region in the trace)

step  CPU span µs
----  -----------
#2           90.0
#3           90.0

CPU time per annotation (record_function; its spans, µs per step):
annotation  median    min–max
----------  ------  ---------
fwd           80.0  80.0–80.0"""


# ---- report.py: the header, long and uneven step lists, annotations, the CPU's work, views ----------------------

def steps_of(kernels_per_step: list[tuple[int, list[str]]], span: float = 90.0) -> dict:
    """GPU steps at 0, 100, 200, ... µs, `span` µs each, numbered as given. The j-th kernel `k` of a step: op
    aten::k starts 9 + 40 j µs in, launches kernel_k at 10 + 40 j (a 2 µs call); it runs 15 + 40 j .. 30 + 40 j."""
    from test_reader_report import x

    ev, ext = [], 0
    for i, (number, names) in enumerate(kernels_per_step):
        ev.append(x(f"ProfilerStep#{number}", "user_annotation", 100 * i, span))
        for j, name in enumerate(names):
            ext, at = ext + 1, 100 * i + 40 * j
            ev += [x(f"aten::{name}", "cpu_op", at + 9, 5, **{"External id": ext}),
                   x("cudaLaunchKernel", "cuda_runtime", at + 10, 2, **{"External id": ext, "correlation": ext}),
                   x(f"kernel_{name}", "kernel", at + 15, 15, pid=0, tid=7, correlation=ext)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def block(text: str, first: str) -> list[str]:
    """The report's lines from the one starting with `first` up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_header_names_the_gpu_its_size_and_the_version_fields():
    """150109880320 B = 139.8 GiB; the metadata's version fields (and torch/triton) are listed, a bool one is not."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step

    data = two_kernels_step()
    data["deviceProperties"] = [{"name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
                                 "totalGlobalMem": 150109880320}]
    data.update(schemaVersion=1, cuda_driver_version=13000, torch="2.11", kineto_version_checked=True, trace_id="x")
    assert it.report(parse(data)).splitlines()[:4] == [
        "trace   <test>", "device  NVIDIA H200 (sm_90, 132 SMs, 140 GiB)",
        "versions schemaVersion=1, cuda_driver_version=13000, torch=2.11", "steps   1 active ProfilerStep (#2)"]


def test_a_cpu_trace_from_a_gpu_machine_names_the_gpu_it_left_out():
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    data = {"traceEvents": [x("ProfilerStep#2", "user_annotation", 0, 10), x("aten::add", "cpu_op", 1, 5)],
            "deviceProperties": [{"name": "NVIDIA H200"}]}
    assert it.report(parse(data)).splitlines()[1] == \
        "device  CPU only (no GPU activity in the trace; the machine has NVIDIA H200, not profiled)"


def test_report_json_keeps_the_peak_and_the_ops_without_their_per_step_lists():
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step

    d = it.report_data(parse(two_kernels_step()))
    assert d["peak"]["source"] == "NVIDIA H200 datasheet (not in torch's table)"
    assert (d["peak"]["tflops"]["bfloat16"], d["peak"]["gbs"]) == (989.5, 4800.0)
    assert [set(r) for r in d["cpu_ops"]] == [{"name", "calls_per_step", "self_us_per_step"}] * 4


def test_nine_uneven_steps_their_numbers_orders_and_quantiles():
    """Steps #2, #4, ..., #18 (not consecutive: listed by their ends), 90 µs each. #2..#10 launch a then b, #12 and
    #14 b then a, #16 and #18 a alone. Two kernels: busy 15 + 15 = 30; GPU idle on the host 0..10, 30..50 and
    70..90 = 50, after the launches 10..15 and 50..55 = 10: busy 30/90 = 33%, host 50/90 = 56%. One kernel: busy
    15, host 10 + 60 = 70 (78%), after 5: busy 17%. Quantiles, nearest rank of 9 sorted values (index 0, 4, 7, 8):
    kernels 1, 2, 2, 2; busy% 17, 33, 33, 33; host% 56, 56, 78, 78."""
    import inspect_trace as it
    from test_inspect_trace import parse

    ab, ba = ["a", "b"], ["b", "a"]
    text = it.report(parse(steps_of([(2, ab), (4, ab), (6, ab), (8, ab), (10, ab), (12, ba), (14, ba),
                                     (16, ["a"]), (18, ["a"])])))
    assert text.splitlines()[2] == "steps   9 active ProfilerStep (#2, #4, #6, ..., #14, #16, #18)"
    assert "\nsteps differ: 5 steps with 2 kernels (#2, #4, #6, #8, ...); 2 steps with 2 kernels in another order " \
           "(#12, #14); 2 steps with 1 kernel (#16, #18)\n" in text
    assert block(text, "step    kernels") == [
        "step    kernels  GPU busy  CPU span  wall  busy%  host%  verdict   lag median  lag max",
        "------  -------  --------  --------  ----  -----  -----  --------  ----------  -------",
        "#2            2      30.0      90.0  90.0    33%    56%  overhead         5.0      5.0",
        "#4            2      30.0      90.0  90.0    33%    56%  overhead         5.0      5.0",
        "#6            2      30.0      90.0  90.0    33%    56%  overhead         5.0      5.0",
        "...",
        "#14           2      30.0      90.0  90.0    33%    56%  overhead         5.0      5.0",
        "#16           1      15.0      90.0  90.0    17%    78%  overhead         5.0      5.0",
        "#18           1      15.0      90.0  90.0    17%    78%  overhead         5.0      5.0",
    ]
    assert block(text, "min ")[:5] == [
        "min           1      15.0      90.0  90.0    17%    56%                   5.0      5.0",
        "median        2      30.0      90.0  90.0    33%    56%                   5.0      5.0",
        "p90           2      30.0      90.0  90.0    33%    78%                   5.0      5.0",
        "max           2      30.0      90.0  90.0    33%    78%                   5.0      5.0",
        "(9 steps: the first and last 3, then each column's quantiles; --all-steps lists all)",
    ]


def test_two_steps_show_a_kernels_range():
    import inspect_trace as it
    from test_inspect_trace import parse

    text = it.report(parse(steps_of([(2, ["a"]), (3, ["a"])])))
    assert block(text, "#  kernel")[2] == \
        "1  kernel_a  aten::a               1     15.0  15.0–15.0  5.0     100.0%         -  -"


def test_gpu_work_without_a_launch_call_idles_after_no_launch():
    """A trace without runtime calls (the GPU's own clock only): kernel 20..30 and a memset 40..45 in a 100 µs step.
    Nothing was launched, so no idle time waits on a launch: 0..20 and 30..40 count after the launch (30 µs); after
    the step's last work, 45..100, the GPU waits on the host (55 µs). 2 items of GPU work, 1 kernel."""
    import inspect_trace as it
    from test_inspect_trace import parse

    [st] = it.report_data(parse(unlaunched_step()))["steps"]
    assert (st["kernels"], st["gpu_work"], st["gpu_busy_us"]) == (1, 2, 15.0)
    assert st["idle_us"] == {"waiting_on_host": 55.0, "after_launch": 30.0}


def unlaunched_step() -> dict:
    """One 100 µs step whose GPU work has no launch call: kernel `k` 20..30, a memset 40..45; the CUDA runtime
    12.8 and driver 13.0 in the metadata."""
    from test_reader_report import x

    return {"traceEvents": [x("ProfilerStep#2", "user_annotation", 0, 100), x("k", "kernel", 20, 10, pid=0, tid=7),
                            x("Memset (Device)", "gpu_memset", 40, 5, pid=0, tid=7)],
            "deviceProperties": [{"name": "NVIDIA H200"}], "cuda_runtime_version": 12080, "cuda_driver_version": 13000}


def test_gpu_time_per_annotation_sorts_by_gpu_then_cpu_time_and_counts_the_backward_thread():
    """One 200 µs step on thread 1: `fwd` 1..60 launches a 10 µs kernel, `loss` 61..70 a 30 µs one, `backward`
    100..190 waits while the autograd engine (thread 2) runs MmBackward0, whose `bwd_hook` 112..140 launches a
    20 µs kernel at 120: it counts for bwd_hook and for backward. Thread 3's `prefetch` opened before the step
    (-10..50: in no step's CPU time) launches a 5 µs kernel. By GPU time, then CPU time: loss 30 (CPU 9), backward
    20 (90), bwd_hook 20 (28), fwd 10 (59), prefetch 5 (0)."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 200), x("fwd", "user_annotation", 1, 59),
          x("loss", "user_annotation", 61, 9), x("backward", "user_annotation", 100, 90),
          x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", 110, 40, tid=2),
          x("bwd_hook", "user_annotation", 112, 28, tid=2), x("prefetch", "user_annotation", -10, 60, tid=3)]
    for ext, (op, at, tid, start, dur) in enumerate([("aten::a", 10, 1, 20, 10), ("aten::b", 62, 1, 70, 30),
                                                      ("aten::mm", 115, 2, 125, 20), ("aten::c", 5, 3, 40, 5)]):
        ev += [x(op, "cpu_op", at, 6, tid=tid, **{"External id": ext}),
               x("cudaLaunchKernel", "cuda_runtime", at + 5, 1, tid=tid, **{"External id": ext, "correlation": ext}),
               x(f"k_{op[6:]}", "kernel", start, dur, pid=0, tid=7, correlation=ext)]
    text = it.report(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    assert block(text, "annotation") == [
        "annotation  GPU median  GPU min–max  CPU median",
        "----------  ----------  -----------  ----------",
        "loss              30.0            -         9.0",
        "backward          20.0            -        90.0",
        "bwd_hook          20.0            -        28.0",
        "fwd               10.0            -        59.0",
        "prefetch           5.0            -         0.0",
    ]


def test_view_ops_table_counts_calls_kernels_and_their_time():
    """two_kernels_step with a reshape that copies (its aten::clone launches a 5 µs kernel) and two views."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step, x

    data = two_kernels_step()
    data["traceEvents"] += [
        x("aten::reshape", "cpu_op", 20, 10), x("aten::clone", "cpu_op", 21, 8, **{"External id": 3}),
        x("cudaLaunchKernel", "cuda_runtime", 22, 2, **{"External id": 3, "correlation": 13}),
        x("k_copy", "kernel", 35, 5, pid=0, tid=7, correlation=13),
        x("aten::view", "cpu_op", 60, 1), x("aten::view", "cpu_op", 62, 1)]
    t = parse(data)
    assert it.report_data(t)["views"] == [
        {"op": "aten::reshape", "calls_per_step": 1.0, "kernels_per_step": 1.0, "cuda_us_per_step": 5.0},
        {"op": "aten::view", "calls_per_step": 2.0, "kernels_per_step": 0.0, "cuda_us_per_step": 0.0}]
    assert block(it.report(t), "View ops") == [
        "View ops (no data moved, so no kernel expected):",
        "op             calls/step  kernels/step  CUDA µs/step",
        "-------------  ----------  ------------  ------------",
        "aten::reshape           1             1           5.0",
        "aten::view              2             0           0.0",
    ]


def test_a_triton_kernel_without_its_source_is_a_lower_bound_and_full_names_stay_whole():
    """two_kernels_step whose first op is an Inductor launch of 66 characters with recorded shapes and no source."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import two_kernels_step

    name = "triton_poi_fused__unsafe_view_gelu_mul_view_add_transpose_clone_0"
    data = two_kernels_step()
    for e in data["traceEvents"]:
        if e["name"] in ("aten::a", "kernel_a"):
            e["name"] = name
        if e["name"] == name and e["cat"] == "cpu_op":
            e["args"].update({"Input Dims": [[4, 8], [4, 8]], "Input type": ["float", "float"]})
    lines = it.report(parse(data), full_names=True).splitlines()
    assert ">= : Triton kernel whose source was not read (--kernel-files reads it); a buffer it reads and writes " \
           "(in_out_ptr) counted once" in lines
    assert f"{name}           1           3.0" in block("\n".join(lines), "name ")  # CPU self time: 5 - 2 µs


def test_late_work_of_an_earlier_step_is_no_idle_time_of_the_later_one():
    """Step #2 (0..100) launches two kernels at 10 and 20 that run late on another stream, 130..140 and 150..160;
    step #3 (100..200) launches at 105 one that runs 110..120. #3 idles 100..105 on the host, 105..110 after its
    launch; from its last kernel's end (120) to its span's (200), the GPU runs #2's work 20 µs: 60 µs on the host.
    #2's gaps 120..130 and 140..150 come after its launches."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("ProfilerStep#3", "user_annotation", 100, 100)]
    for ext, (at, start, stream) in enumerate([(10, 130, 8), (20, 150, 8), (105, 110, 7)]):
        ev += [x("aten::a", "cpu_op", at - 1, 3, **{"External id": ext}),
               x("cudaLaunchKernel", "cuda_runtime", at, 1, **{"External id": ext, "correlation": ext}),
               x("kernel_a", "kernel", start, 10, pid=0, tid=stream, correlation=ext)]
    steps = it.report_data(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))["steps"]
    assert [s["idle_us"] for s in steps] == [{"waiting_on_host": 0.0, "after_launch": 20.0},
                                             {"waiting_on_host": 65.0, "after_launch": 5.0}]


def test_cpu_work_thread_by_thread_keeps_the_lane_of_its_first_step():
    """Step #2 (0..90): the main thread's aten::linear routes to aten::addmm 11..41 (30 µs, the unit); thread 2
    runs aten::add 5..15, before it, yet listed after the main thread. Step #3 (100..190): addmm 111..151 (40 µs),
    then the add 160..170 on the main thread. The same order of units, the add's lane that of step #2: thread 2."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 90), x("aten::linear", "cpu_op", 10, 32),
          x("aten::addmm", "cpu_op", 11, 30), x("aten::add", "cpu_op", 5, 10, tid=2),
          x("ProfilerStep#3", "user_annotation", 100, 90), x("aten::linear", "cpu_op", 110, 42),
          x("aten::addmm", "cpu_op", 111, 40), x("aten::add", "cpu_op", 160, 10)]
    assert block(it.report(parse({"traceEvents": ev})), "Work in order") == [
        "Work in order (the CPU's kernels: fused C++ kernels, GEMMs and other computing aten ops, each with what it "
        "calls; mean over 2 of 2 steps, those in the typical order; thread by thread, main = the one running the "
        "step loop):",
        "#  thread  kernel       mean µs    min–max",
        "-  ------  -----------  -------  ---------",
        "1  main 1  aten::addmm     35.0  30.0–40.0",
        "2  1/2     aten::add       10.0  10.0–10.0",
        "every step runs the same 2 units of work in the same order",
        "Inductor C++ kernels: none: an eager run (no Torch-Compiled Region in the trace)",
    ]


NO_KERNEL_PROFILE = ("Work in order: none seen. The compiled code runs inside its Torch-Compiled Region, its C++ "
                     "kernels not in the trace: profile with torch._inductor.config.cpp.enable_kernel_profile = True")


@pytest.mark.parametrize("inside, lines", [
    ([("cpp_fused_gelu_0", 20), ("cpp_fused_mul_1", 40), ("cpp_fused_gelu_0", 60)], [
        "#  kernel            mean µs  min–max",  # one step: no range
        "-  ----------------  -------  -------",
        "1  cpp_fused_gelu_0     10.0        -",
        "2  cpp_fused_mul_1      10.0        -",
        "3  cpp_fused_gelu_0     10.0        -",
        "Inductor C++ kernels: cpp_fused_gelu_0, cpp_fused_mul_1"]),
    ([("aten::addmm", 20)], [
        "Inductor C++ kernels: none: compiled, and Inductor generated no C++ kernel for this graph: it calls "
        "aten::addmm instead (cpp.enable_kernel_profile on, as the suite's scripts set it, would show any)"]),
    ([], [NO_KERNEL_PROFILE,
          "Inductor C++ kernels: none: compiled, but nothing ran inside the compiled region that the trace names: "
          "recorded without cpp.enable_kernel_profile (the suite's scripts set it)",
          "CPU time per annotation: no record_function annotation in this trace"]),
])
def test_compiled_cpu_step_names_its_cpp_kernels_or_why_none(inside, lines):
    """One 100 µs CPU step: a Torch-Compiled Region 10..90 with 10 µs ops inside it at the times given."""
    import inspect_trace as it
    from test_inspect_trace import parse
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 100), x("Torch-Compiled Region: 0/0", "cpu_op", 10, 80)]
    text = it.report(parse({"traceEvents": ev + [x(name, "cpu_op", ts, 10) for name, ts in inside]}))
    assert [line for line in lines if line not in text.splitlines()] == []


# ---- kernels.py: bytes and names at their limits -----------------------------------------------------------------

def test_kernel_bytes_of_a_batched_gemm_and_an_inductor_count_of_zero():
    from trace_reader.facts.kernels import gemm_bytes, gemm_operands, pointwise_bytes

    # [3, 4, 8] @ [3, 8, 16] in bf16: read (96 + 384) * 2, write the [3, 4, 16] output, 192 * 2
    assert gemm_bytes(op("aten::bmm", [[3, 4, 8], [3, 8, 16]], ["c10::BFloat16"] * 2)) == 1344.0
    assert gemm_operands(op("aten::_addmm_activation", [[16], [4, 8], [8, 16]])) == ([4, 8], [8, 16])
    # Inductor's count is a positive number of GB; 0 is no count: the shapes are read instead
    assert pointwise_bytes(op("k", [[4, 8]], ["float"], kernel_num_gb=0)) == (256.0, True)


def test_short_name_keeps_the_functor_past_the_unary_wrappers():
    from trace_reader.facts.kernels import short

    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::BUnaryFunctor<float, float, float, "
            "at::native::binary_internal::MulFunctor<float>>, std::array<char*, 2ul>>(int, T2, T3)")
    assert short(name, False) == "vectorized_elementwise_kernel<…MulFunctor…>"


# ---- plot.py's numbers: the roofline's points and labels, the benchmark's bars -----------------------------------

def test_roofline_of_work_without_an_op_places_nothing_and_names_the_versions():
    """unlaunched_step: shares 10 / 15 and 5 / 15 of the GPU time; CUDA 12080 reads 12.8, 13000 reads 13.0."""
    from test_inspect_trace import parse
    from trace_reader.render.plot import roofline_points

    rf = roofline_points(parse(unlaunched_step()))
    assert (rf.versions, rf.peak_source) == ("CUDA runtime 12.8, driver 13.0",
                                             "NVIDIA H200 datasheet (not in torch's table)")
    assert rf.points == [] and rf.not_placed == [
        (1, "k", "?", "no shapes", pytest.approx(10 / 15)),
        (2, "Memset (Device)", "?", "memory op, no math", pytest.approx(5 / 15))]


def test_roofline_points_from_shapes_or_inductors_byte_count():
    """One step, four 10 µs kernels. addmm [4, 8] @ [8, 16] + a [1] bias in bf16: 2*4*8*16 = 1024 FLOPs, bytes
    (1 + 32 + 128) * 2 read + 64 * 2 written = 450. bmm [3, 4, 8] @ [3, 8, 16] without types: 3072 FLOPs, and
    Inductor's 1e-6 GB = 1000 bytes. mm without types or a count: no bytes, not placed. mul of [4, 8.0] (no shape: a
    float) and [2]: 2 elements, 1 FLOP each; 2 * 4 bytes read, 2 * 4 written."""
    from test_inspect_trace import parse
    from test_reader_report import x
    from trace_reader.render.plot import roofline_points

    bf16 = "c10::BFloat16"
    ops = [("aten::addmm", {"Input Dims": [[1], [4, 8], [8, 16]], "Input type": [bf16] * 3}),
           ("aten::bmm", {"Input Dims": [[3, 4, 8], [3, 8, 16]], "kernel_num_gb": 1e-6}),
           ("aten::mm", {"Input Dims": [[4, 8], [8, 16]]}),
           ("aten::mul", {"Input Dims": [[4, 8.0], [2]], "Input type": ["float", "float"]})]
    ev = [x("ProfilerStep#2", "user_annotation", 0, 200)]
    for i, (name, args) in enumerate(ops):
        ev += [x(name, "cpu_op", 10 + 40 * i, 5, **{"External id": i}, **args),
               x("cudaLaunchKernel", "cuda_runtime", 11 + 40 * i, 2, **{"External id": i, "correlation": i}),
               x(f"k_{name[6:]}", "kernel", 16 + 40 * i, 10, pid=0, tid=7, correlation=i)]
    rf = roofline_points(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    assert [(p.number, p.name, p.kind, p.flops, p.bytes) for p in rf.points] == [
        (1, "k_addmm", "GEMM", 1024.0, 450.0), (2, "k_bmm", "GEMM", 3072.0, 1000.0),
        (4, "k_mul", "pointwise", 2.0, 16.0)]
    assert rf.not_placed == [(3, "k_mm", "aten::mm", "no shapes", 0.25)]
    assert rf.gemm_shapes == ["4×8×16", "3×4×8×16"] and (rf.dtype, rf.peak_tflops) == ("bfloat16", 989.5)


def roof_point(**kw):
    from trace_reader.render.plot import Point

    return Point(**{"number": 3, "name": "k", "op": "aten::mul", "kind": "pointwise", "calls": 1.0, "share": 0.25,
                    "flops": 2048.0, "bytes": 1024.0, "flop_s": 3e12, "achieved": "1,500 GB/s", **kw})


def test_roofline_labels_and_list_lines_by_hand():
    from trace_reader.render.plot import _label, _line

    long_op = "LigerGELUMulFunction_with_a_name_of_fifty_chars"  # 47 characters: cut to 43 and "…"
    assert _label(roof_point(op=long_op)) == "#3 LigerGELUMulFunction_with_a_name_of_fifty_c…, 25%"
    assert _label(roof_point(lower_bound=True), "B") == "B#3 aten::mul, 25% (bytes ≥: too far right)"
    name = "triton_poi_fused__unsafe_view_gelu_mul_transpose_add_10"  # 55 characters: cut to 53 and "…"
    assert _line(roof_point(name=name, achieved=">=1,500 GB/s", lower_bound=True, of_peak=0.5)) == (
        "#3  triton_poi_fused__unsafe_view_gelu_mul_transpose_add_… aten::mul                  2 FLOP/B  "
        ">=1,500 GB/s (>=3 TFLOP/s) = 50.0% of peak, 25.0% of GPU time")


def test_a_picture_that_cannot_be_written_says_where_and_why(tmp_path, monkeypatch):
    import errno
    import tempfile

    from trace_reader.render import plot
    from trace_reader.reading.events import TraceError

    def refuse(**kw):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(TraceError) as e:
        plot.save_png(None, tmp_path / "p.png", {})
    assert str(e.value) == f"cannot write in {tmp_path}: Permission denied"


def test_bench_bars_skip_what_is_no_shape_and_label_the_rest_by_their_sizes():
    from trace_reader.render.plot import bench_bars

    timed = {"eager": {"median_us": 8.0}}
    record = {"shapes": ["not a shape", {"B": 2, "variants": timed},  # no floor
                         {"B": 2, "S": 128, "flops": 10, "bytes": 20, "floor_us": 4.0, "variants": timed}]}
    assert bench_bars(record) == [
        {"shape": "2×128", "floor_us": 4.0, "variants": {"eager": {"us": 8.0, "of_floor": 0.5}}}]


# ---- memory.py: which device's allocations, the step's base, a rewritten file ------------------------------------

def load_written(tmp_path, events: list[dict], name: str = "m.json"):
    """The trace of these events, written to a file and loaded from it (as a user's trace is)."""
    import json

    import inspect_trace as it

    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return it.load_trace(path)


def mem(ts, nbytes, total, device_type):
    """A "[memory]" event: device type 0 is the CPU, 1 CUDA."""
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": device_type, "Device Id": 0}}


def test_step_peak_counts_the_traces_device_from_the_total_before_the_first_allocation(tmp_path):
    """A GPU step 0..100: CUDA allocates 100 B (total 1100), then 50 (1150), frees 150: the total before was
    1100 - 100 = 1000, the peak 150 above it. The CPU's 4000 B in the same step are another device's."""
    from test_reader_report import x
    from trace_reader.analyzers.memory import step_peaks

    t = load_written(tmp_path, [
        x("ProfilerStep#2", "user_annotation", 0, 100), x("cudaLaunchKernel", "cuda_runtime", 5, 1),
        mem(10, 100, 1100, 1), mem(15, 4000, 9000, 0), mem(20, 50, 1150, 1), mem(30, -150, 1000, 1)])
    assert step_peaks(t) == {2: 150.0}


# ---- modules.py: the MLP the trace shows, more failing modules than a line lists ---------------------------------

def layers_step(n: int, kernel: str = "k_mlp") -> dict:
    """One `decode` step of n decoder layers, 100 µs apart; each layer's mlp calls aten::gelu, which launches
    `kernel` (5 µs)."""
    from test_reader_report import x

    ev = [x("ProfilerStep#2", "user_annotation", 0, 100 * n + 100), x("decode", "user_annotation", 1, 100 * n)]
    for i in range(n):
        t0 = 100 * i + 10
        ev += [x(f"model.layers.{i}", "user_annotation", t0, 80),
               x(f"model.layers.{i}.mlp", "user_annotation", t0 + 1, 60),
               x("aten::gelu", "cpu_op", t0 + 2, 5, **{"External id": i}),
               x("cudaLaunchKernel", "cuda_runtime", t0 + 3, 1, **{"External id": i, "correlation": i}),
               x(kernel, "kernel", t0 + 10, 5, pid=0, tid=7, correlation=i)]
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_step_peak_with_thousands_of_device_ids_is_the_largest_over_each_ones_running_total(tmp_path):
    """30,000 CUDA events over 3,000 Device Ids (ten each, in turn): id d allocates d+1 B ten times from its own
    total of 1000 * d, so its peak is 10 * (d + 1) above its base, the largest 30,000 (id 2,999). One pass over
    the events (a pass per id before: 20,000 ids took a minute)."""
    from test_reader_report import x
    from trace_reader.analyzers.memory import step_peaks

    events = [x("ProfilerStep#2", "user_annotation", 0, 100_000), x("cudaLaunchKernel", "cuda_runtime", 5, 1)]
    for r in range(10):
        for d in range(3000):
            e = mem(10 + r * 3000 + d, d + 1, 1000 * d + (r + 1) * (d + 1), 1)
            e["args"]["Device Id"] = d
            events.append(e)
    assert step_peaks(load_written(tmp_path, events)) == {2: 30_000.0}


def test_the_mlp_kernel_in_the_trace_wins_over_the_file_name():
    import argparse

    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    a = argparse.Namespace(compile=False)
    modules.model_flags(a, parse(layers_step(2, "_geglu_tanh_forward_kernel")), ["gemma", "mlp-eager"])
    assert (a.mlp, a.layers, a.phase) == ("liger", 2, "decode")


@pytest.mark.parametrize("n, more", [(3, ""), (4, " (+1 more)")])
def test_module_launches_lists_three_failing_modules_then_counts(n, more):
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    said = modules.module_launches("mlp", "GeGLU", has=("geglu",)).check(parse(layers_step(n)))
    assert said == "; ".join(f"model.layers.{i}.mlp: nothing matches ['geglu']" for i in range(3)) + more


# ---- peaks.py: an entry that is no DeviceInfo call ------------------------------------------------------------------

def test_device_table_reads_the_entries_after_one_that_is_no_call():
    from trace_reader.facts.peaks import Peak, parse_device_info

    assert parse_device_info('_device_mapping = {"A": 3, **more, "B": DeviceInfo(tops={}, dram_bw_gbs=2)}') == \
        {"B": Peak("torch._inductor.analysis.device_info", {}, 2)}


def test_main_prints_each_shape_keeps_a_partial_record_and_draws_beside_the_record(tmp_path, monkeypatch, capsys):
    """--out two new folders deep; while the second shape runs, OUT.partial holds the first; the chart goes next to
    OUT; each shape's lines are printed as they come."""
    import json

    out = tmp_path / "a" / "b" / "r.json"
    partial = tmp_path / "a" / "b" / "r.json.partial"
    seen, drawn = [], []

    def shape(M, *rest):
        seen.append([s["M"] for s in json.loads(partial.read_text())["shapes"]] if partial.exists() else None)
        return fake_shape(M, *rest)

    fake_bench(monkeypatch, bench_shape=shape, shape_lines=lambda r, c, b, graphs: [f"shape M={r['M']}", f"its verdict, graphs {graphs}"],
               bench_chart_next_to=lambda record, path, title: drawn.append((path, title)) or "the chart's line")
    assert bench.main(["--shapes", "1x8x16,2x8x16", "--out", str(out)]) == 0
    assert seen == [None, [1]] and not partial.exists() and out.exists()
    assert drawn == [(out, "GeGLU MLP forward")]
    printed = capsys.readouterr().out
    assert "\nshape M=1\nits verdict, graphs True\nshape M=2\nits verdict, graphs True\n" in printed and printed.endswith("\nthe chart's line\n")


def test_a_gemm_measured_at_no_rate_is_no_point_on_log_axes():
    """Two launches of k_mm by aten::mm: the first, [4, 8] @ [8, 16] in bf16 (the shapes the point would take), took
    0 µs and gives no rate; the second, of 0 rows, took 10 µs at 0 FLOP/s. The group's rate, 0, has no place on a
    log axis."""
    from test_inspect_trace import parse
    from test_reader_report import x
    from trace_reader.render.plot import roofline_points

    ev = [x("ProfilerStep#2", "user_annotation", 0, 100)]
    for i, (rows, dur) in enumerate([(4, 0), (0, 10)]):
        ev += [x("aten::mm", "cpu_op", 10 + 40 * i, 5, **{"External id": i, "Input Dims": [[rows, 8], [8, 16]],
                                                          "Input type": ["c10::BFloat16"] * 2}),
               x("cudaLaunchKernel", "cuda_runtime", 11 + 40 * i, 2, **{"External id": i, "correlation": i}),
               x("k_mm", "kernel", 16 + 40 * i, dur, pid=0, tid=7, correlation=i)]
    rf = roofline_points(parse({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}))
    assert rf.points == [] and rf.not_placed == [(1, "k_mm", "aten::mm", "no shapes", 1.0)]


# ---- report.py: number format, thread column, unknown device (survivors of the 2026-12-02 mutation sample) --------

def test_num_switches_format_at_ten_and_a_hundred():
    from trace_reader.facts.format import fmt_num

    # three figures at most: one decimal from 10 up, none from 100 up, two significant figures below 10
    assert [fmt_num(v) for v in (9.96, 10.0, 10.5, 99.94, 100.0, 1234.5, 0.2734, -10.5)] == [
        "10", "10.0", "10.5", "99.9", "100", "1,234", "0.27", "-10.5"]


def test_thread_column_marks_more_than_three_thread_ids():
    from trace_reader.render.report_text import _thread

    assert _thread({"lane": 0, "tids": [11, 12, 13]}) == "main 11/12/13"
    assert _thread({"lane": 1, "tids": [11, 12, 13, 14]}) == "11/12/13/…"
    assert _thread({"lane": 1, "tids": ["a-very-long-thread-name"]}) == "a-very-long-"


def test_a_trace_without_a_device_name_says_so_in_the_peak_line():
    import inspect_trace as it

    trace = two_layer_step()
    trace["deviceProperties"] = [{}]
    line = next(line for line in it.report(it.parse_trace(trace)).splitlines() if line.startswith("peak: "))
    assert line.startswith("peak: ?: ")


# ---- compiled.py: regions, graph breaks, recompiles, which steps ran which (by hand) ------------------------------

def compiled_trace(steps):
    """One ProfilerStep#n a list of (thread, region id, start, end) per step, 1000 µs apart, as cpu_op spans."""
    ev = []
    for n, regions in steps.items():
        base = 1000 * n
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": base,
                   "dur": 900})
        for tid, rid, start, end in regions:
            ev.append({"ph": "X", "cat": "cpu_op", "name": f"Torch-Compiled Region: {rid}", "pid": 1, "tid": tid,
                       "ts": base + start, "dur": end - start})
    import inspect_trace as it

    return it.parse_trace({"traceEvents": ev})


def test_compiled_regions_breaks_recompiles_and_steps_by_hand():
    """Frame 0 encloses frame 1 (a graph break) in every step but #10 and #11; frame 0's version 1 runs in steps
    2, 6-9 (a recompile); #10 runs an "Unknown" region beside, not inside, one on another thread; #11 runs none.
    Four steps of one order are listed whole, five end in "..."."""
    from trace_reader.analyzers import compiled

    A = [(1, "0/0", 10, 100), (1, "1/0", 40, 60)]
    B = [(1, "1/0", 230 - 200, 250 - 200), (1, "0/1", 0, 300 - 200)]  # listed inner first: order is by time
    steps = {1: A, 2: B, 3: A, 4: A, 5: A, 6: B, 7: B, 8: B, 9: B,
             10: [(1, "0/0", 10, 100), (2, "Unknown", 20, 30)], 11: []}
    data = compiled.compiled_regions(compiled_trace(steps))
    assert data["frames"] == {0: [0, 1], 1: [0]} and data["graph_breaks"] == [[0, 1]]
    assert data["recompiled"] == [0] and data["other_ids"] == ["Unknown"]
    assert data["per_step"][1] == {"number": 2, "regions": ["0/1", "1/0 inside 0/1"]}
    assert data["per_step"][9] == {"number": 10, "regions": ["0/0", "Unknown"]}
    assert compiled.describe(data) == [
        "Compiled regions (Torch-Compiled Region: frame/version): 2 compiled frames, 0/0, 0/1, 1/0",
        "  graph break: frame 1 runs inside frame 0's region (Dynamo compiled the rest of frame 0 after the break "
        "as a new frame)",
        "  recompiled: frame 0 ran 0/0, 0/1; a version after /0 means a guard failed and Dynamo compiled the frame "
        "again (a new shape, dtype or Python value)",
        "  other regions: Unknown",
        "  steps #1, #3, #4, #5 run: 0/0, 1/0 inside 0/0",
        "  steps #2, #6, #7, #8, ... run: 0/1, 1/0 inside 0/1",
        "  step #10 runs: 0/0, Unknown",
        "  step #11 runs: none"]


def test_compiled_regions_one_line_only_when_plain_and_alike():
    from trace_reader.analyzers import compiled

    head = "Compiled regions (Torch-Compiled Region: frame/version): 1 compiled frame, "
    same = compiled.describe(compiled.compiled_regions(compiled_trace({1: [(1, "0/0", 0, 50)], 2: [(1, "0/0", 0, 50)]})))
    assert same == [head + "0/0 in every step: no graph break, no recompile"]
    # plain, but the steps differ: a line per order
    apart = compiled.describe(compiled.compiled_regions(compiled_trace({1: [(1, "0/0", 0, 50)], 2: []})))
    assert apart == [head + "0/0", "  step #1 runs: 0/0", "  step #2 runs: none"]
    # one order, but a recompile (frame 0's version 1 only): not the plain line
    again = compiled.describe(compiled.compiled_regions(compiled_trace({1: [(1, "0/1", 0, 50)], 2: [(1, "0/1", 0, 50)]})))
    assert again == [head + "0/1", "  recompiled: frame 0 ran 0/1; a version after /0 means a guard failed and Dynamo "
                     "compiled the frame again (a new shape, dtype or Python value)", "  every step runs: 0/1"]
    assert compiled.compiled_regions(compiled_trace({1: [], 2: []})) is None


def test_dispatch_gap_finds_the_first_op_up_to_the_annotations_end():
    """record_function("mlp_fwd") over 100-150 µs: an op starting at 150 is still inside (gap 50); one at 151, or
    before 100, is not (no gap); a step without the annotation has none."""
    import inspect_trace as it
    from trace_reader.analyzers import lag

    def step(op_ts, annotation="mlp_fwd"):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 500},
              {"ph": "X", "cat": "user_annotation", "name": annotation, "pid": 1, "tid": 1, "ts": 100, "dur": 50},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": op_ts, "dur": 1}]
        return it.parse_trace({"traceEvents": ev}).steps[0]

    assert [lag.dispatch_gap(step(ts), "mlp_fwd") for ts in (100, 150, 151, 99)] == [0, 50, None, None]
    assert lag.dispatch_gap(step(120, "other"), "mlp_fwd") is None


# ---- expect.py: flags read back from a trace and its name, the said line, the guesses' words and margins ----------

def _steps_trace(numbers, extra=()):
    """ProfilerStep spans numbered `numbers`, 1000 µs apart, with `extra` events (in the first step)."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": 1000 * i,
           "dur": 900} for i, n in enumerate(numbers)]
    return {"traceEvents": ev + list(extra)}


def _named(tmp_path, name, data):
    import inspect_trace as it

    path = tmp_path / name
    path.write_text(__import__("json").dumps(data))
    return it.load_trace(path)


def test_flags_read_back_from_the_suites_file_names(tmp_path):
    """The sizes from the name's first word (03's BxSxDxH; 01's N, BxN, or _bmmB), the dtype from a word, else from
    the first GEMM's inputs (not another op's), the schedule from the first step's number (3: wait 2, warm-up 1)."""
    from trace_reader.scripts import args_from_trace

    a = args_from_trace("03_simple_mlp", _named(tmp_path, "2x8x32x64_fp32_cold_eager.json", _steps_trace([3, 4])))
    assert (a.batch, a.seq, a.dim, a.hidden, a.dtype, a.wait, a.profiler_warmup, a.warmup) == (2, 8, 32, 64, "fp32",
                                                                                             2, 1, 0)
    a = args_from_trace("01_matmul_add", _named(tmp_path, "64_bf16_warm_eager.json", _steps_trace([1])))
    assert (a.size, a.batched, a.warmup) == (64, None, 1)
    a = args_from_trace("01_matmul_add", _named(tmp_path, "4x64_bf16_cold_eager.json", _steps_trace([1])))
    assert (a.size, a.batched) == (64, 4)
    a = args_from_trace("01_matmul_add", _named(tmp_path, "64_bmm8_bf16_cold_eager.json", _steps_trace([1])))
    assert (a.size, a.batched) == (64, 8)
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
            "args": {"Input Dims": [[4], [4]], "Input type": ["float", "float"]}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
            "args": {"Input Dims": [[4, 8], [8, 16]], "Input type": ["c10::Half", "c10::Half"]}}]
    a = args_from_trace("03_simple_mlp", _named(tmp_path, "renamed.json", _steps_trace([1], ops)))
    assert a.dtype == "fp16" and "batch" not in vars(a)  # no sizes in that name


def test_the_said_line_names_cuda_graphs(tmp_path):
    """06's decode run replayed as CUDA graphs (the committed H200 trace, under the name 06 gives it)."""
    import gzip
    import json

    import inspect_trace as it

    data = json.loads(gzip.decompress((Path(__file__).parent / "data" / "h200_model_decode_cudagraphs.json.gz")
                                      .read_bytes()))
    t = _named(tmp_path, "gemma-2b-2L_decode_1x64_mlp-eager_cudagraphs_bf16_cold_compile.json", data)
    exps, said = it.expectations_for("06_model", t)
    assert exps and re.fullmatch(r"06_model decode, CUDA graphs, 2 layers, \d+ steps \(read from the trace\)", said), said


def test_cold_and_warm_gap_words_and_what_they_saw(monkeypatch):
    """The first step's gap (30 µs) against the later steps' median (5): over 3x, so cold holds and warm is broken,
    saying every step's gap."""
    import inspect_trace as it
    from trace_reader.analyzers import lag

    gaps = {1: 30.0, 2: 5.0, 3: 5.0}
    monkeypatch.setattr(lag, "dispatch_gap", lambda st, annotation: gaps[st.number])
    t = it.parse_trace(_steps_trace([1, 2, 3]))
    cold, warm = guesses.cold_start_gap("mlp_fwd", True), guesses.cold_start_gap("mlp_fwd", False)
    assert cold.text == ("cold: the first active step waits longest between record_function('mlp_fwd') and its first "
                         "aten op (> 3x later steps; the post: 228 vs ~5 µs cold)")
    assert warm.text == ("warm: the first active step does not wait long between record_function('mlp_fwd') and its "
                         "first aten op (<= 3x later steps; the post: 228 vs ~5 µs cold)")
    assert cold.check(t) is True
    assert warm.check(t) == "'mlp_fwd' -> first aten op per step: 30.0, 5.0, 5.0 µs"


@pytest.mark.parametrize("last, growing", [(70.0, False), (71.0, True)])
def test_gpu_lag_grows_only_past_twice_plus_fifty(monkeypatch, last, growing):
    """Lags 10, 20, then 70 or 71 µs: rising every step, and the last over 2 x 10 + 50 = 70 only at 71."""
    import inspect_trace as it
    from trace_reader.analyzers import lag

    lags = {1: 10.0, 2: 20.0, 3: last}
    monkeypatch.setattr(lag, "launch_lag", lambda st: lags[st.number])
    t = it.parse_trace(_steps_trace([1, 2, 3]))
    grows, steady = guesses.gpu_lag_grows(True), guesses.gpu_lag_grows(False)
    seen = f"launch -> GPU start per step: 10, 20, {last:.0f} µs"
    assert grows.check(t) == (True if growing else seen) and steady.check(t) == (seen if growing else True)
    assert steady.text == "a sync after each step: the GPU's launch -> start lag does not grow"


@pytest.mark.parametrize("config, gelu, guesses", [("llama", False, 4), ("llama", True, 5), ("gemma-2b", False, 5)])
def test_the_mlp_launch_guess_only_for_a_geglu_model(tmp_path, config, gelu, guesses):
    """An eager decode step of two annotated decoder layers: the MLP-launch guess (a GeLU and a mul between the GEMMs)
    joins the four others only where the MLP is the post's GeGLU: a Gemma preset by name, or aten::gelu seen."""
    import inspect_trace as it

    extra = [{"ph": "X", "cat": "user_annotation", "name": "decode", "pid": 1, "tid": 1, "ts": 10, "dur": 800}]
    extra += [{"ph": "X", "cat": "user_annotation", "name": f"model.layers.{i}", "pid": 1, "tid": 1,
               "ts": 20 + 300 * i, "dur": 250} for i in (0, 1)]
    if gelu:
        extra.append({"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "pid": 1, "tid": 1, "ts": 30, "dur": 5})
    t = _named(tmp_path, f"{config}-2L_decode_1x64_mlp-eager_bf16_cold_eager.json", _steps_trace([1], extra))
    exps, said = it.expectations_for("06_model", t)
    assert len(exps) == guesses and said == "06_model decode, eager, 2 layers, MLP eager, 1 steps (read from the trace)"


def test_verdicts_in_a_colour_terminal(monkeypatch):
    """What a reader's terminal shows (rich, colours forced): the heading bold, ok green, n/a dim (its label too), a
    broken guess and its "look here" line bold red, the summary bold green with nothing broken, else bold red."""
    import io

    from trace_reader.expectation import Expect, print_expectations

    monkeypatch.setenv("FORCE_COLOR", "1")
    ex = Expect("a guess", lambda t: True)
    out = io.StringIO()
    assert print_expectations([(ex, "confirmed", ""), (ex, "not applicable", "why")], out) == 0
    assert out.getvalue() == ("\x1b[1mExpectations (guess first, then look):\x1b[0m\n"
                              "\x1b[32m  ok      a guess\x1b[0m\n"
                              "\x1b[2m  n/a     \x1b[0m\x1b[2ma guess (why)\x1b[0m\n"
                              "\x1b[1;32m  1 confirmed, 0 broken, 1 not applicable\x1b[0m\n")
    out = io.StringIO()
    assert print_expectations([(ex, "broken", "seen this")], out) == 1
    assert out.getvalue().splitlines()[1:] == ["\x1b[1;31m  BROKEN  \x1b[0m\x1b[1;31ma guess\x1b[0m",
                                               "\x1b[1;31m          seen: seen this  <- BROKEN — look here\x1b[0m",
                                               "\x1b[1;31m  0 confirmed, 1 broken, 0 not applicable\x1b[0m"]


@pytest.mark.skipif(not Path(__import__("os").devnull).exists() or __import__("sys").platform == "win32",
                    reason="needs a character device at os.devnull")
def test_a_device_file_is_refused_as_not_a_regular_file():
    """The null device opens, reads as empty and never ends for some devices: it is refused before any read."""
    import os

    from trace_reader.reading.events import TraceError
    from trace_reader.reading.files import _read_capped

    with pytest.raises(TraceError) as e:
        _read_capped(Path(os.devnull), 1 << 20)
    assert str(e.value) == f"{os.devnull}: not a regular file"


def test_a_gzip_is_read_in_pieces_of_a_mebibyte_whatever_its_size(tmp_path, monkeypatch):
    """Memory stays within the cap plus one piece: a 2.5 MB gzip (incompressible text) is decompressed 1 MiB at a
    time, never in one read of its own size."""
    import gzip
    import json
    import os

    from trace_reader.reading import files as read

    asked = []

    class Recording(gzip.GzipFile):
        def read(self, size=-1):
            asked.append(size)
            return super().read(size)

    monkeypatch.setattr(read.gzip, "GzipFile", Recording)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [], "pad": os.urandom(1 << 21).hex()}).encode()))
    assert path.stat().st_size > 2 << 20
    assert read._read_capped(path, 1 << 24).startswith(b"{")
    assert asked and max(asked) == read._CHUNK == 1 << 20


# ---- common.py: the shared flags, the run's name, its description (by hand) -----------------------------------------

def test_the_shared_flags_their_types_bounds_and_defaults(capsys):
    import common

    p = common.parser("A script.\nMore.", size=64)
    a = p.parse_args([])
    assert (a.size, a.device, a.wait, a.profiler_warmup, a.active, a.sync_each_step, a.gzip, a.out, a.port) == (
        64, "auto", common.SCHEDULE["wait"], common.SCHEDULE["profiler_warmup"], common.SCHEDULE["active"], False,
        False, common.ROOT / "traces", 9001)
    a = p.parse_args(["--wait", "0", "--profiler-warmup", "0", "--active", "2", "--sync-each-step", "--gzip",
                      "--warmup"])
    assert (a.wait, a.profiler_warmup, a.active, a.sync_each_step, a.gzip, a.warmup) == (0, 0, 2, True, True,
                                                                                       common.WARMUP_CALLS)
    assert type(a.wait) is int and type(a.profiler_warmup) is int
    for bad, said in ((["--wait", "-1"], "--wait: must be between 0 and 1000, got -1"),
                      (["--active", "0"], "--active: must be between 1 and 1000, got 0"),
                      (["--port", "65536"], "--port: must be between 0 and 65535, got 65536")):
        with pytest.raises(common.Fail) as e:
            p.parse_args(bad)
        assert str(e.value) == f"argument {said}"
    assert common.MAX_ACTIVE == 1000


def test_a_runs_name_says_every_flag_that_changes_the_trace():
    import argparse

    import torch

    import common

    def run(**kw):
        a = argparse.Namespace(**{"dtype": "bf16", "warmup": 0, "sync_each_step": False, "compile": False,
                                  **common.SCHEDULE, **kw})
        return common.Run("01_matmul_add", a, torch.device("cpu"), torch.bfloat16)

    assert run().stem("64") == "64_bf16_cold_eager"  # the post's name
    assert run(sync_each_step=True, warmup=5, wait=0).stem("64", "_bmm4") == "64_bf16_warm_wait0_sync_bmm4_eager"
    assert common.Run("01_matmul_add", run().args, torch.device("cpu"), torch.bfloat16, compiled=True,
                      rank=1).stem("64") == "64_bf16_cold_compile_rank1"


def test_the_description_line_of_a_run(capsys):
    import argparse

    import torch

    import common

    for warmup, temp in ((0, "cold"), (5, "warm (5 calls)")):
        a = argparse.Namespace(dtype="fp32", warmup=warmup, wait=1, profiler_warmup=1, active=3, sync_each_step=False,
                               compile=False)
        common.describe(common.Run("02_linear", a, torch.device("cpu"), torch.float32))
        assert capsys.readouterr().out == (f"02_linear: CPU, torch {torch.__version__}, fp32, eager, {temp}, "
                                           "schedule(wait=1, warmup=1, active=3), no per-step sync\n")


def test_a_command_to_paste_types_paths_where_the_reader_stands(tmp_path, monkeypatch):
    import common

    monkeypatch.chdir(common.ROOT)
    assert common.uv_run("01_matmul_add.py", "--size", 64) == "uv run 01_matmul_add.py --size 64"
    outside = tmp_path / "a b.json"
    assert common.uv_run("01_matmul_add.py", outside) == f"uv run 01_matmul_add.py '{outside.resolve()}'"
    assert common.typed(common.ROOT / "traces" / "x.json") == "traces/x.json"


# ---- memory.py: streams() at its edges (a made-up datasheet of 800 GB/s) ------------------------------------------

def streams_check(monkeypatch, trace, nbytes, at_least=0.5, pattern="kernel_k", peak=800.0):
    from trace_reader.analyzers import memory
    from trace_reader.facts.peaks import Peak

    monkeypatch.setattr(memory, "device_peak", lambda name: Peak("a made-up sheet", {}, peak) if name else None)
    return memory.streams(pattern, nbytes, "the cache", at_least).check(trace)


def test_streams_reads_each_steps_rate_against_the_sheet(monkeypatch):
    """Steps #2 (one kernel_k of 15 µs) and #3 (two: 30 µs). 6 MB: 6e6 / 15 / 1e3 = 400 GB/s, then 200 GB/s."""
    from test_inspect_trace import parse
    from trace_reader.analyzers import memory

    t = parse(steps_of([(2, ["k"]), (3, ["k", "k"])]))
    assert streams_check(monkeypatch, t, 6e6, at_least=0.25) is True  # 200 >= 0.25 x 800: at the edge, confirmed
    assert streams_check(monkeypatch, t, 6e6, at_least=0.5) == "400, 200 GB/s per step, of 800 GB/s (a made-up sheet)"
    assert streams_check(monkeypatch, t, 6e6, pattern="nothing") == "ProfilerStep#2 has no kernel matching /nothing/"
    e = memory.streams("kernel_k", 6e6, "the cache", 0.25)
    assert (e.text, e.device) == ("memory-bound: the /kernel_k/ kernels read the cache (5.7 MiB) at >= 25% of the "
                                  "device's datasheet bandwidth", "cuda")


def test_streams_not_applicable_below_five_microseconds_at_the_sheets_rate(monkeypatch):
    """At 800 GB/s, 4 MB take 4e6 / 800 / 1e3 = 5.0 µs: not under the 5 µs limit, so judged; 3.999 MB are."""
    from test_inspect_trace import parse
    from trace_reader.expectation import NotApplicable

    t = parse(steps_of([(2, ["k"])]))
    assert streams_check(monkeypatch, t, 4e6, at_least=0.0) is True
    below = streams_check(monkeypatch, t, 3.999e6)
    assert isinstance(below, NotApplicable) and below == (
        "3.8 MiB takes 5.0 µs at the datasheet's 800 GB/s, under the 5 µs a kernel's start and drain cost: too "
        "little to stream at speed")
    assert streams_check(monkeypatch, t, 4e6, peak=0.0) == "no datasheet bandwidth for 'NVIDIA H200'"


def test_streams_counts_a_kernel_under_a_microsecond(monkeypatch):
    """A step whose one matching kernel runs 0.5 µs: 4e6 / 0.5 / 1e3 = 8000 GB/s, ten times the sheet: counted."""
    from test_inspect_trace import parse

    data = steps_of([(2, ["k"])])
    next(e for e in data["traceEvents"] if e["name"] == "kernel_k")["dur"] = 0.5
    assert streams_check(monkeypatch, parse(data), 4e6, at_least=1.0) is True


# ---- kernels.py: indexing and broadcasting at their edges ------------------------------------------------------

@pytest.mark.parametrize("o, want", [
    (op("aten::take", [[4, 6]], ["float", "long int"]), None),  # the index's dims missing, its type recorded
    (op("aten::take", [[4, 6], [5]], ["float"]), None),  # its dims recorded, its type missing
    (op("aten::take", [[4, 6], "five"], ["float", "long int"]), None),  # an index that is no shape
    # index_select's dim as the profiler records it, in lists of other lengths
    (op("aten::index_select", [[4, 6], [], [3]], ["float", "Scalar", "long int"], **{"Concrete Inputs": ["", "1"]}),
     3 * 8 + 2 * 3 * 4 * 4),
    (op("aten::index_select", [[4, 6], [], [3]], ["float", "Scalar", "long int"], **{"Concrete Inputs": [""]}),
     3 * 8 + 2 * 3 * 6 * 4),
    (op("aten::index_select", [[4, 6], [], [3]], ["float", "Scalar", "long int"], **{"Concrete Inputs": ["", "X1"]}),
     3 * 8 + 2 * 3 * 6 * 4),  # not a number: dim 0
    # a source one row long: each picked row is the whole of it (6 elements)
    (op("aten::index_select", [[1, 6], [], [3]], ["float", "Scalar", "long int"]), 3 * 8 + 2 * 3 * 6 * 4),
    # 6.25e13 fp32 elements taken by a long index: 16 B each, exactly 1e15 B in all: past the limit of a real op
    (op("aten::take", [[4, 6], [62500, 10**9]], ["float", "long int"]), None),
    (op("aten::take", [[4, 6], [62500, 10**9 - 1]], ["float", "long int"]), 16 * 62500 * (10**9 - 1)),
])
def test_indexing_at_its_edges(o, want):
    from trace_reader.facts.kernels import pointwise_bytes

    assert pointwise_bytes(o) == (None if want is None else (float(want), True))


def test_broadcast_pads_the_shorter_shape_with_ones_on_the_left():
    from trace_reader.facts.kernels import _broadcast

    assert _broadcast([[3], [2, 3]]) == [2, 3]  # the first is the shorter
    assert _broadcast([[1, 3], [3]]) == [1, 3]  # the second is: padded with 1, not the other's size
    assert _broadcast([[5, 1, 3], [4, 1]]) == [5, 4, 3]
    # a dimension of 0 broadcasts as any other size against 1: the result has no elements (it counted one row of 8
    # per empty [0, 8] before, as if 0 were 1)
    assert _broadcast([[0, 8]]) == _broadcast([[0, 8], [1, 8]]) == _broadcast([[1, 8], [0, 1]]) == [0, 8]
    assert _broadcast([[3, 1], [1, 0]]) == [3, 0]


@pytest.mark.parametrize("wrapper", ["AUnaryFunctor", "UnaryFunctor"])
def test_short_name_looks_past_every_unary_wrapper(wrapper):
    from trace_reader.facts.kernels import short

    name = (f"void at::native::vectorized_elementwise_kernel<4, at::native::{wrapper}<float, float, float, "
            "at::native::binary_internal::MulFunctor<float>>, std::array<char*, 2ul>>(int, T2, T3)")
    assert short(name, False) == "vectorized_elementwise_kernel<…MulFunctor…>"


def test_short_cut_form_that_fills_the_column_exactly_is_kept():
    from trace_reader.facts.kernels import short

    name = "void at::native::elementwise_kernel<128, 4, at::native::GeluCUDAKernelImpl<float>>(int, float)"
    cut = "elementwise_kernel<…GeluCUDAKernelImpl…>"  # 40 characters
    assert len(cut) == 40 and short(name, False, 40) == cut and short(name, False, 39) == name[5:43] + "…"


def test_compiled_regions_of_other_ids_only_and_two_steps_alike():
    """Every step runs two regions that are no frame/version (one 45 characters long, kept to 40); a span with the
    regions' prefix but a name of two lines is no region; then two steps of one order and one of another."""
    from trace_reader.analyzers import compiled

    long_id = "L" * 45
    other = [(1, "Unknown", 0, 10), (1, long_id, 20, 30)]
    ev_steps = {1: other, 2: other}
    data = compiled.compiled_regions(compiled_trace(ev_steps))
    assert data["frames"] == {} and data["other_ids"] == ["L" * 40, "Unknown"]
    assert compiled.describe(data) == [
        "Compiled regions (Torch-Compiled Region: frame/version): 0 compiled frames, -",
        f"  other regions: {'L' * 40}, Unknown",
        f"  every step runs: Unknown, {long_id}"]
    import inspect_trace as it

    bare = it.parse_trace({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 900},
        {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: a\nb", "pid": 1, "tid": 1, "ts": 5, "dur": 5}]})
    assert compiled.compiled_regions(bare) is None
    head = "Compiled regions (Torch-Compiled Region: frame/version): 1 compiled frame, 0/0"
    two = compiled.describe(compiled.compiled_regions(compiled_trace({1: [(1, "0/0", 0, 50)], 2: [(1, "0/0", 0, 50)],
                                                                      3: []})))
    assert two == [head, "  steps #1, #2 run: 0/0", "  step #3 runs: none"]


@pytest.mark.parametrize("outer, inner", [
    ((1, "0/0", 0, 50), (1, "1/0", 20, 50)),  # ends where the outer one ends: still inside
    ((1, "0/0", 0, 50), (1, "1/0", 0, 30)),  # starts with it: the longer one is the outer
])
def test_a_region_at_the_edge_of_another_is_inside_it(outer, inner):
    from trace_reader.analyzers import compiled

    data = compiled.compiled_regions(compiled_trace({1: [inner, outer]}))
    assert data["graph_breaks"] == [[0, 1]] and data["per_step"][0]["regions"] == ["0/0", "1/0 inside 0/0"]


def test_a_graph_break_is_told_by_frame_not_version():
    """Frame 1 (version 0) encloses frame 0 (version 0): a break from 1 to 0, though the outer version equals the
    inner frame's number."""
    from trace_reader.analyzers import compiled

    data = compiled.compiled_regions(compiled_trace({1: [(1, "1/0", 0, 50), (1, "0/0", 10, 20)]}))
    assert data["graph_breaks"] == [[1, 0]]


def test_temporaries_go_on_past_a_step_or_a_block_they_leave_out(tmp_path):
    """Each step: a 1 MiB block kept past the step and the op's own scratch come first, then one passed between
    ops: that one is found (the first two are passed over, not an end to the search)."""
    from test_expect_shapes import MATH_OPS, S, alloc_trace
    from trace_reader.analyzers import memory

    kept_first = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (12, S, 2000), (35, -S, 2000)])
    assert memory.temporaries(kept_first, S) == {2: [(S, "aten::bmm")], 3: [(S, "aten::bmm")]}
    scratch_first = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (15, -S, 1000), (16, S, 2000), (35, -S, 2000)],
                                name="scratch_first.json")
    assert memory.temporaries(scratch_first, S) == {2: [(S, "aten::bmm")], 3: [(S, "aten::bmm")]}


def test_temporaries_of_steps_that_allocate_nothing_then_one_byte(tmp_path):
    """Steps #2, #3, #4 of 100 µs on the CPU: #2 has only a 0-byte event, #3 no memory event, #4 one byte
    allocated (no "Addr": it cannot be paired with its free, so it counts)."""
    from test_reader_report import x
    from trace_reader.analyzers import memory

    t = load_written(tmp_path, [x(f"ProfilerStep#{n}", "user_annotation", 100 * i, 99) for i, n in enumerate((2, 3, 4))]
                     + [mem(50, 0, 0, 0), mem(250, 1, 1, 0)])
    assert memory.temporaries(t, 1) == {2: None, 3: None, 4: [(1, "no op")]}


def test_allocates_lists_two_whole_and_says_which_kind_is_unclear(tmp_path):
    from test_expect_shapes import MATH_OPS, S, alloc_trace
    from trace_reader.analyzers import memory

    two = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (12, 2 * S, 2000), (35, -S, 1000), (36, -2 * S, 2000)])
    each = "2: 1.0 MiB from aten::bmm, 2.0 MiB from aten::bmm"
    assert memory.allocates(S, "the scores", False).check(two) == \
        f"allocations passed between ops of >= 1.0 MiB per step: #2 {each}; #3 {each}"
    one = alloc_trace(tmp_path, MATH_OPS, [(11.5, S, 1000), (35, -S, 1000)], name="one.json")
    unclear = memory.allocates(S, "the scores", True, others=(4 * S, "the output")).check(one)
    assert unclear == ("the output (4.0 MiB) can show as big as the scores, and nothing bigger was allocated: an "
                       "allocation's size cannot tell them apart at this shape")
    # no temporary of 1 MiB at all: broken, whatever the other tensor's size
    none = alloc_trace(tmp_path, MATH_OPS, [(11.5, S // 2, 1000), (35, -(S // 2), 1000)], name="none.json")
    assert memory.allocates(S, "the scores", True, others=(4 * S, "the output")).check(none) == \
        "temporaries of >= 1.0 MiB per step: #2 none; #3 none"


# ---- the defaults a caller leaves out, and kernels.py / memory.py at their last edges ---------------------------

def test_defaults_of_the_expectations_and_the_name_column():
    from trace_reader.analyzers import memory
    from trace_reader.facts.kernels import short

    assert ">= 50% of the device's datasheet bandwidth" in memory.streams("k", 1e9, "the cache").text
    assert memory.allocates(1 << 20, "the scores").text.startswith("allocates the scores")
    assert short("k" * 73, False) == "k" * 71 + "…" and short("k" * 72, False) == "k" * 72  # a column of 72


def cpu_step(spans, main_tid=1):
    """One CPU step 0..1000 on thread main_tid; spans: (name, ts, dur, tid)."""
    import inspect_trace as it
    from test_reader_report import x

    ev = [x("ProfilerStep#1", "user_annotation", 0, 1000, tid=main_tid)]
    ev += [x(name, "cpu_op", ts, dur, tid=tid) for name, ts, dur, tid in spans]
    return it.parse_trace({"traceEvents": ev}).steps[0]


def test_cpu_units_route_through_every_gemm_wrapper_and_keep_a_conversion_that_works():
    """aten::linear calls aten::matmul calls aten::mm: both wrappers route, the GEMM is the unit. aten::to calling
    aten::copy_ is a unit of its own (it did work); its copy is part of it."""
    from trace_reader.facts.kernels import cpu_lanes

    st = cpu_step([("aten::linear", 10, 30, 1), ("aten::matmul", 11, 28, 1), ("aten::mm", 12, 20, 1),
                   ("aten::to", 50, 10, 1), ("aten::copy_", 51, 8, 1)])
    assert [(tid, [e.name for e in units]) for tid, units in cpu_lanes(st)] == [(1, ["aten::mm", "aten::to"])]


def test_cpu_lanes_main_thread_first_then_by_first_unit():
    """The step runs on thread 5; thread 9 computes from 20 µs, thread 1 from 40 µs: 5, 9, 1 (not by thread id)."""
    from trace_reader.facts.kernels import cpu_lanes

    st = cpu_step([("aten::mul", 60, 5, 5), ("aten::add", 40, 5, 1), ("aten::div", 20, 5, 9)], main_tid=5)
    assert [tid for tid, _ in cpu_lanes(st)] == [5, 9, 1]


@pytest.mark.parametrize("o, flops", [
    (op("aten::mm", [["x"], [8, 16]]), None),  # the first operand is no shape, the second is
    (op("aten::mm", [[0, 8], [8, 16]]), 0),  # a tensor with no rows is a shape: no FLOPs
])
def test_gemm_flops_of_an_odd_operand(o, flops):
    from trace_reader.facts.kernels import gemm_flops

    assert gemm_flops(o) == flops


def test_triton_arg_names_from_the_source_or_none():
    from types import SimpleNamespace

    from trace_reader.facts.kernels import _triton_arg_names

    src = {"/k.py": "def triton_k(in_out_ptr0, in_out_ptr1, in_ptr0, xnumel, XBLOCK : tl.constexpr):\n    pass\n"}
    k = SimpleNamespace(name="triton_k", args={"kernel_file": "/k.py"})
    assert _triton_arg_names(k, src) == ["in_out_ptr0", "in_out_ptr1", "in_ptr0", "xnumel", "XBLOCK"]
    other = SimpleNamespace(name="triton_other", args={"kernel_file": "/k.py"})
    assert _triton_arg_names(other, src) is None  # the file is read, but holds no such kernel


def test_view_time_adds_the_kernels_of_the_view_and_what_it_called():
    from types import SimpleNamespace

    from trace_reader.facts.kernels import view_cuda_time

    def span(durs, children=()):
        return SimpleNamespace(kernels=[SimpleNamespace(dur=d) for d in durs], children=list(children))

    view = span([2.0, 3.0], [span([4.0]), span([], [span([1.0, 1.0])])])
    assert view_cuda_time(view) == (5, 11.0)


def test_maker_of_an_allocation_is_the_innermost_of_ops_that_start_together(tmp_path):
    """aten::linear 10..30 and aten::mm 10..20 start together; a 1 MiB block made at 12, freed at 35: aten::mm's."""
    from test_expect_shapes import S, alloc_trace
    from trace_reader.analyzers import memory

    t = alloc_trace(tmp_path, [("aten::linear", 10, 20), ("aten::mm", 10, 10)], [(12, S, 1000), (35, -S, 1000)])
    assert memory.temporaries(t, S) == {2: [(S, "aten::mm")], 3: [(S, "aten::mm")]}


def test_memory_events_with_a_bool_or_infinite_size_are_skipped(tmp_path):
    import json

    import inspect_trace as it
    from test_reader_report import x
    from trace_reader.analyzers.memory import read_allocs

    path = tmp_path / "odd.json"
    events = [x("ProfilerStep#2", "user_annotation", 0, 100), mem(10, 1000, 1000, 0), mem(20, True, 1001, 0)]
    text = json.dumps({"traceEvents": events})[:-2] + ', {"ph": "i", "name": "[memory]", "ts": 30, "pid": 1, ' \
        '"tid": 1, "args": {"Bytes": Infinity, "Total Allocated": 1, "Device Type": 0, "Device Id": 0}}]}'
    path.write_text(text)
    assert [a.nbytes for a in read_allocs(it.load_trace(path))] == [1000.0]


@pytest.mark.parametrize("fast", [True, False])
def test_each_memory_event_is_read_on_its_own_fields(tmp_path, monkeypatch, fast):
    """Under either decoder: "i" and "I" both are instant events; a missing "Device Id" is device 0; a device id or
    type that is no int skips the event (either one alone), and an odd event does not end the reading of those
    after it; a thread named by a list and an address that is no int are not kept (None)."""
    from test_reader_report import x
    from trace_reader.analyzers.memory import Alloc, read_allocs
    from trace_reader.reading import files

    if not fast:
        monkeypatch.setattr(files, "_fast", lambda: None)
    no_id = mem(20, 20, 120, 1)
    del no_id["args"]["Device Id"]
    events = [x("ProfilerStep#2", "user_annotation", 0, 100),
              dict(mem(5, 1, 1, 0), args={**mem(5, 1, 1, 0)["args"], "Device Id": "0"}),  # an id that is no int
              mem(6, 1, 1, "1"),  # a type that is no int
              dict(mem(10, 10, 100, 1), ph="I", tid=[1]),
              dict(no_id, args={**no_id["args"], "Addr": 140000}),
              dict(mem(30, -10, 110, 1), args={**mem(30, -10, 110, 1)["args"], "Addr": "0x7f"})]
    t = load_written(tmp_path, events)
    assert read_allocs(t) == (Alloc(10.0, 10.0, 100.0, (1, 0), None, (1, None)),
                              Alloc(20.0, 20.0, 120.0, (1, 0), 140000, (1, 1)),
                              Alloc(30.0, -10.0, 110.0, (1, 0), None, (1, 1)))


def test_a_step_that_only_frees_has_no_peak_above_its_start(tmp_path):
    """Step #2 frees 100 B (total 900 after): its start was 1000, nothing rose above it: a peak of 0."""
    from test_reader_report import x
    from trace_reader.analyzers.memory import step_peaks

    t = load_written(tmp_path, [x("ProfilerStep#2", "user_annotation", 0, 100), mem(10, -100, 900, 0)])
    assert step_peaks(t) == {2: 0.0}


def test_allocations_are_the_traces_own_not_the_files_now(tmp_path):
    """The allocations come from the events read with the trace, once: rewritten afterwards (or removed), the file
    changes nothing of a Trace already read; the next read sees the new file."""
    from test_reader_report import x
    from trace_reader.analyzers.memory import read_allocs

    t = load_written(tmp_path, [x("ProfilerStep#2", "user_annotation", 0, 100), mem(10, 1000, 1000, 0)])
    t2 = load_written(tmp_path, [x("ProfilerStep#2", "user_annotation", 0, 100), mem(10, 2000, 2000, 0)])
    assert t2.path == t.path
    assert [a.nbytes for a in read_allocs(t)] == [1000.0] and [a.nbytes for a in read_allocs(t2)] == [2000.0]
    Path(t.path).unlink()
    assert [a.nbytes for a in read_allocs(t)] == [1000.0]


def test_gemm_bytes_leave_out_a_zero_dim_bias():
    """addmm with a 0-d bias ([]), fp32: A [4, 8] and B [8, 16] read, the [4, 16] output written: 128 + 512 + 256."""
    from trace_reader.facts.kernels import gemm_bytes

    assert gemm_bytes(op("aten::addmm", [[], [4, 8], [8, 16]], ["float", "float", "float"])) == 896.0


def test_triton_inputs_past_the_kernels_parameters_count_once():
    """A Triton launch recording three [4] fp32 buffers whose source names two parameters, the first in-out:
    16 B x 2, then 16 and 16 (the third has no name to read: read once)."""
    from trace_reader.facts.kernels import pointwise_bytes

    o = op("triton_poi_fused_add_0", [[4], [4], [4]], ["float", "float", "float"], kernel_file="/k.py")
    assert pointwise_bytes(o, {"/k.py": "def triton_poi_fused_add_0(in_out_ptr0, in_ptr0):\n"}) == (64.0, True)


# ---- modules.py, intervals.py, lag.py at their last edges -----------------------------------------------------

def test_overlap_walks_past_the_second_interval():
    from trace_reader.facts.intervals import common

    # [5, 45] against three: 5 + 10 + 5 µs in common; the walk must move on from each in turn
    assert common([(0, 10), (20, 30), (40, 50)], [(5, 45)]) == 20.0
    assert common([(5, 45)], [(0, 10), (20, 30), (40, 50)]) == 20.0


def test_launch_lag_of_a_step_with_no_gpu_work_is_none():
    from trace_reader.analyzers.lag import launch_lag

    assert launch_lag(cpu_step([("aten::mul", 10, 5, 1)])) is None


def test_module_expectations_word_for_word_and_without_annotations():
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    assert modules.largest_module("mlp", "decode").text == (
        "the mlp modules take the largest share of GPU time (of the layers' parts and the modules outside the layers)")
    assert modules.module_launches("mlp", "one GEMM").text == "every mlp launches one GEMM"
    assert modules.modules_annotated(2, "decode").text == (
        "all 2 decoder layers, each with its parts (attention, MLP, norms), annotated in every step (inside 'decode')")
    assert modules.kernels_between(1, 5, "x").text == "1 to 5 GPU kernels per step (x)"
    bare = parse(steps_of([(2, ["k"])]))
    assert modules.breakdown(bare, "decode") is None
    assert modules.largest_module("mlp", "decode").check(bare) == "no module annotations in this trace"
    assert modules.module_launches("mlp", "x").check(bare) == "no 'mlp' module annotations in this trace"


def test_largest_module_says_the_winners_share_and_every_problem_of_a_module():
    """two_layer_step with each MLP kernel at 200 µs: GPU time 5 + 10 + 200 + 2 + 200 + 4 = 421 µs, the MLPs'
    400 of it: 95.0%."""
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    data = two_layer_step()
    for e in data["traceEvents"]:
        if e["name"] == "k_mlp":
            e["dur"] = 200
    t = parse(data)
    assert round(400 / 421 * 100) == 95
    assert modules.largest_module("self_attn", "decode").check(t) == "largest: mlp (95% of GPU time)"
    assert modules.module_launches("mlp", "x", has=("nope",), lacks=("k_mlp",)).check(t) == (
        "model.layers.0.mlp: nothing matches ['nope']; launches ['k_mlp']; "
        "model.layers.1.mlp: nothing matches ['nope']; launches ['k_mlp']")


def test_a_step_of_under_a_microsecond_still_has_shares():
    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    data = two_layer_step()
    for e in data["traceEvents"]:
        if e["cat"] == "kernel":
            e["dur"] = 0.1  # six kernels: 0.6 µs in all
    b = modules.breakdown(parse(data), "decode")
    assert b["total"]["share"] == 1.0 and all(r["share"] is not None for r in b["types"])


def test_model_flags_one_mlp_kernel_and_graph_replays():
    from types import SimpleNamespace

    from test_inspect_trace import parse
    from trace_reader.analyzers import modules

    data = two_layer_step()
    for e in data["traceEvents"]:
        if e["name"] == "k_mlp":
            e["name"] = "_geglu_tanh_forward_kernel"  # Liger's
    a = SimpleNamespace(compile=True)
    modules.model_flags(a, parse(data), [])
    assert a.mlp == "liger" and a.cuda_graphs is False  # compiled, but no graph replayed
    graphs = two_layer_step()
    graphs["traceEvents"][-2]["name"] = "cudaGraphLaunch"  # the last op's launch is a graph replay
    b = SimpleNamespace(compile=True)
    modules.model_flags(b, parse(graphs), [])
    assert b.cuda_graphs is True


# ---- ranks.py: how much of a GPU rank's communication is exposed, by hand -------------------------------------

def nccl_trace(nccl_start: float, nccl_end: float, world: int = 2, nccl: bool = True):
    """One step 0..100 µs of rank 0 of `world`: aten::mm's kernel runs 10..40; the all-reduce's NCCL kernel runs
    nccl_start..nccl_end (launched by a `nccl:all_reduce` span)."""
    import inspect_trace as it
    from test_reader_report import x

    name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if nccl else "k_other"
    ev = [x("ProfilerStep#1", "user_annotation", 0, 100),
          x("aten::mm", "cpu_op", 5, 3, **{"External id": 1}),
          x("cudaLaunchKernel", "cuda_runtime", 6, 1, **{"External id": 1, "correlation": 11}),
          x("k_mm", "kernel", 10, 30, pid=0, tid=7, correlation=11),
          x("nccl:all_reduce", "user_annotation", 8, 3),
          x("c10d::allreduce_", "cpu_op", 8.5, 2, **{"External id": 2}),
          x("cudaLaunchKernel", "cuda_runtime", 9, 1, **{"External id": 2, "correlation": 12}),
          x(name, "kernel", nccl_start, nccl_end - nccl_start, pid=0, tid=8, correlation=12)]
    return it.parse_trace({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}],
                           "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world}})


def test_exposed_communication_is_the_nccl_time_no_kernel_runs_beside():
    """The all-reduce 30..70 against the GEMM 10..40: 10 of its 40 µs overlapped, 75% exposed."""
    from trace_reader.analyzers import ranks
    from trace_reader.expectation import NotApplicable

    t = nccl_trace(30, 70)
    assert ranks._exposed_shares(t) == [0.75]
    assert ranks.communication_exposed(0.75).check(t) is True
    assert ranks.communication_exposed(0.76).check(t) == "median step: 75% of the communication exposed"
    assert ranks.communication_exposed(0.5).text == \
        "at least 50% of the communication exposed (nothing to overlap it with)"
    one = ranks._exposed_shares(nccl_trace(30, 70, world=1))
    assert isinstance(one, NotApplicable) and one == "one rank: no communication to hide"
    assert ranks._exposed_shares(nccl_trace(30, 70, nccl=False)) == "no NCCL kernels in the steps"
    assert ranks._exposed_shares(nccl_trace(20, 30)) == [0.0]  # inside the GEMM: nothing exposed
    assert ranks.communication_overlapped(0.25).check(t) is True  # 1 - 0.75
    assert ranks.communication_overlapped(0.26).check(t) == "median step: 25% of the communication overlapped compute"
    assert ranks.communication_overlapped(0.25).text == "at least 25% of the communication overlaps compute"


# ------------------------------------------------------ trace_reader/expect.py at its edges (whole-file mutation)

def _steps(**per_step):
    """A stand-in trace: one step object per value, each with the given attribute (kernels=[...], spans=[...])."""
    from types import SimpleNamespace as NS
    (attr, values), = per_step.items()
    return NS(steps=[NS(**{attr: v}) for v in values])


def test_cold_start_needs_two_steps_and_compares_with_the_later_median(monkeypatch):
    from trace_reader.analyzers import lag
    gaps = {}
    monkeypatch.setattr(lag, "dispatch_gap", lambda st, annotation: gaps[st])
    cold, warm = guesses.cold_start_gap("fwd", True), guesses.cold_start_gap("fwd", False)
    assert (cold.device, warm.device) == ("cuda", "cuda")

    def check(ex, values):
        gaps.clear()
        gaps.update(enumerate(values))
        return ex.check(type("T", (), {"steps": list(range(len(values)))})())  # the steps are the gaps' keys
    assert check(cold, [10.0]) == "'fwd' -> first aten op per step (µs): [10.0]; needs 2+ steps with both"
    assert check(cold, [300.0, 5.0]) is True and check(warm, [300.0, 5.0]) is not True  # two steps are enough
    # later steps 5, 10, 100: their median is 10, so 25 is not 3x it (the smallest, 5, would say it is)
    assert check(cold, [25.0, 5.0, 10.0, 100.0]) == "'fwd' -> first aten op per step: 25.0, 5.0, 10.0, 100.0 µs"
    assert check(warm, [25.0, 5.0, 10.0, 100.0]) is True
    assert check(cold, [31.0, 5.0, 10.0, 100.0]) is True  # just over 3x 10


def test_gpu_lag_grows_from_its_lowest_step_strictly(monkeypatch):
    from trace_reader.analyzers import lag
    lags = {}
    monkeypatch.setattr(lag, "launch_lag", lambda st: lags[st])
    grows, flat = guesses.gpu_lag_grows(True), guesses.gpu_lag_grows(False)
    assert grows.text == ("no sync per step, compute-bound: the GPU falls further behind the CPU each step "
                          "(launch -> start lag grows)")
    assert (grows.device, flat.device) == ("cuda", "cuda")

    def check(ex, values):
        lags.clear()
        lags.update(enumerate(values))
        return ex.check(type("T", (), {"steps": list(range(len(values)))})())
    assert check(grows, [None, 100.0, 300.0, 700.0]) == (
        "launch -> GPU start per step (µs): [None, 100.0, 300.0, 700.0]; needs 3+ steps with linked launches")
    assert check(grows, [300.0, 200.0, 100.0, 50.0, 400.0]) is True  # lowest at the second-to-last step
    assert check(flat, [50.0, 50.0, 400.0]) is True  # equal lags are not growing
    assert check(flat, [10.0, 100.0, 50.0, 400.0]) is True  # one step back: not growing each step
    assert check(grows, [10.0, 100.0, 50.0, 400.0]) == "launch -> GPU start per step: 10, 100, 50, 400 µs"


def test_kernel_names_in_a_broken_kernel_check_are_cut_at_60():
    from types import SimpleNamespace as NS

    long = "k" * 61
    t = _steps(kernels=[[NS(name=long), NS(name="gemm")]])
    assert guesses.kernel("nothing").check(t) == f"matches per step: [0]; kernels seen: {['gemm', 'k' * 59 + '…']}"


def test_no_cpu_op_among_annotations_only_is_not_applicable():
    from types import SimpleNamespace as NS

    from trace_reader import expectation as expect
    t = _steps(spans=[[NS(cat="user_annotation", name="forward")]])
    got = guesses.cpu_op("aten::mm", present=False).check(t)
    assert isinstance(got, expect.NotApplicable) and "no CPU ops recorded" in got
    t = _steps(spans=[[NS(cat="user_annotation", name="forward"), NS(cat="cpu_op", name="aten::add")]])
    assert guesses.cpu_op("aten::mm", present=False).check(t) is True


def test_buffer_request_says_what_it_looks_for():
    assert guesses.buffer_request().text == "wait=0, warmup=0: an 'Activity Buffer Request' event on the GPU lane"


def test_a_flag_the_trace_does_not_say_is_one_error_and_dunders_stay_attribute_errors():
    a = scripts._ArgsFromTrace(_script="02_linear")
    with pytest.raises(trace_events.TraceError) as e:
        a.in_dim
    assert str(e.value) == "02_linear's expectations need --in-dim, which this trace does not say"
    with pytest.raises(AttributeError) as e:
        a.__deepcopy__
    assert e.value.args == ("__deepcopy__",)
    assert not hasattr(a, "__array__")


def test_peaks_without_torch_installed(monkeypatch):
    import importlib.util

    from trace_reader.facts import peaks
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert peaks._read_torch_table() == {}


def test_verdicts_in_colour_on_a_terminal(monkeypatch):
    """On a colour terminal: the heading bold, an "ok" line green, a BROKEN one and where to look bold red, "n/a" dim,
    the tally red when anything broke (the ANSI codes as a terminal gets them)."""
    import io

    from trace_reader import expectation as expect
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    results = [(expect.Expect("a 12 guess", None), "confirmed", ""), (expect.Expect("b", None), "broken", "x 3"),
               (expect.Expect("c", None), "not applicable", "why")]
    assert expect.print_expectations(results, out) == 1
    assert out.getvalue() == (
        "\x1b[1mExpectations (guess first, then look):\x1b[0m\n"
        "\x1b[32m  ok      a 12 guess\x1b[0m\n"
        "\x1b[1;31m  BROKEN  \x1b[0m\x1b[1;31mb\x1b[0m\n"
        "\x1b[1;31m          seen: x 3  <- BROKEN — look here\x1b[0m\n"
        "\x1b[2m  n/a     \x1b[0m\x1b[2mc (why)\x1b[0m\n"
        "\x1b[1;31m  1 confirmed, 1 broken, 1 not applicable\x1b[0m\n")
    out = io.StringIO()
    assert expect.print_expectations(results[:1], out) == 0
    assert out.getvalue().endswith("\x1b[1;32m  1 confirmed, 0 broken, 0 not applicable\x1b[0m\n")


def test_flags_at_the_edges_of_what_a_trace_and_its_name_say(tmp_path):
    """Each word and event args_from_trace reads, alone: the device, a cudaDeviceSynchronize in every step (not just
    one), the dtype words, warm as the name's last word, a renamed file's GEMM (fp32; 01's batched [B, K, N]; 02's
    [in, out]), and a trace without steps (nothing waited, nothing warmed up)."""
    from trace_reader.reading.events import TraceError
    from trace_reader.scripts import args_from_trace

    def mm(name, dims, types, ts=20):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                "args": {"Input Dims": dims, "Input type": types}}

    def sync(ts):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": ts,
                "dur": 3, "args": {"correlation": ts}}
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 30, "dur": 5, "args": {}}
    flags = lambda name, data: args_from_trace("03_simple_mlp", _named(tmp_path, name, data))  # noqa: E731
    every = flags("a_bf16_x.json", _steps_trace([1, 2], [kernel, sync(100), sync(1100)]))
    assert (every.device, every.sync_each_step, every.dtype) == ("cuda", True, "bf16")
    one = flags("a_fp16_x.json", _steps_trace([1, 2], [kernel, sync(100)]))
    assert (one.sync_each_step, one.dtype) == (False, "fp16")
    cpu = flags("a_x_warm.json", _steps_trace([1]))
    assert (cpu.device, cpu.sync_each_step, cpu.warmup) == ("cpu", False, 1)
    with pytest.raises(TraceError):  # no dtype word and no GEMM: not said
        cpu.dtype
    none = flags("a_x.json", {"traceEvents": [mm("aten::add", [[4]], ["float"])]})
    assert (none.active, none.wait, none.profiler_warmup, none.sync_each_step) == (0, 0, 0, False)
    assert flags("b.json", _steps_trace([1], [mm("aten::mm", [[4, 8], [8, 16]], ["float", "float"])])).dtype == "fp32"
    a = args_from_trace("01_matmul_add", _named(tmp_path, "c.json", _steps_trace(
        [1], [mm("aten::bmm", [[4, 64, 32], [4, 32, 48]], ["c10::BFloat16"] * 2)])))
    assert (a.size, a.batched) == (48, 4)
    a = args_from_trace("02_linear", _named(tmp_path, "d.json", _steps_trace(
        [1], [mm("aten::mm", [[16, 8], [8, 12]], ["float", "float"])])))
    assert (a.in_dim, a.out_dim) == (8, 12)
    a = args_from_trace("02_linear", _named(tmp_path, "e.json", _steps_trace([1])))  # renamed, no GEMM: no sizes
    with pytest.raises(TraceError, match="--in-dim"):
        a.in_dim


def test_a_trace_with_steps_none_active_says_so():
    from types import SimpleNamespace as NS

    from trace_reader import expectation as expect
    assert expect.need_steps(NS(steps=[], whole=False)) == "no active steps in the trace"
    assert expect.need_steps(NS(steps=[1], whole=False)) is None
