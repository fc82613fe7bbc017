"""The CPU report's "Inductor C++ kernels" line says which case a trace is, on hand-built CPU traces: the kernels
by name, an eager run, a compiled graph of library calls only, or a compiled region with nothing named in it."""

import json

import pytest

import inspect_trace as it


def cpu_trace(tmp_path, *inside):
    """One CPU-only step ProfilerStep#2 [0, 100) around a matmul_add annotation, with `inside` as
    (name, cat) spans one after another from ts 10, each 5 µs, nested in nothing but the step."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
              {"ph": "X", "cat": "user_annotation", "name": "matmul_add", "pid": 1, "tid": 1, "ts": 1, "dur": 98}]
    for i, (name, cat) in enumerate(inside):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": 10 + 6 * i, "dur": 5})
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return it.load_trace(path)


def cpp_line(trace):
    return next(line for line in it.report(trace).splitlines() if line.startswith("Inductor C++ kernels:"))


REGION = ("Torch-Compiled Region: 0/0", "cpu_op")


@pytest.mark.parametrize("inside,says", [
    ([("aten::mm", "cpu_op"), ("aten::add", "cpu_op")], "none: an eager run (no Torch-Compiled Region in the trace)"),
    ([REGION, ("aten::addmm", "cpu_op")],
     "none: compiled, and Inductor generated no C++ kernel for this graph: it calls aten::addmm instead"),
    ([REGION], "none: compiled, but nothing ran inside the compiled region that the trace names: recorded without "
               "cpp.enable_kernel_profile (the suite's scripts set it)"),
    ([REGION, ("graph_0_cpp_fused__unsafe_view_gelu_mul_0", "cpu_op"), ("aten::mm", "cpu_op")],
     "graph_0_cpp_fused__unsafe_view_gelu_mul_0"),
    ([REGION, ("graph_0_kernel", "cpu_op")], "graph_0_kernel"),  # a C++ template: the CPU's FlexAttention
    ([REGION, ("graph_kernel", "cpu_op"), ("aten::bmm", "cpu_op")],  # not Inductor's graph_<id>_ prefix
     "none: compiled, and Inductor generated no C++ kernel for this graph: it calls aten::bmm instead"),
])
def test_cpp_kernels_line_says_which_case(tmp_path, inside, says):
    assert cpp_line(cpu_trace(tmp_path, *inside)).startswith(f"Inductor C++ kernels: {says}")
