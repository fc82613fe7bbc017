"""Rules of the reader, the benchmark and the trace server at their edges, on tiny synthetic inputs; expected
values by hand. Fast and in-process: mutmut (pyproject's [tool.mutmut]) runs these against every mutant."""

import argparse

import pytest

import bench

# ---- bench.py: shapes, the floor, the noise rule ------------------------------------------------------------


@pytest.mark.parametrize("text, shapes", [
    ("1x1x1", [(1, 1, 1)]),
    (f"{1 << 20}x2x3", [(1 << 20, 2, 3)]),  # the largest size accepted
    (" 4X5x6 , 7x8x9", [(4, 5, 6), (7, 8, 9)]),  # spaces and an upper-case X are read
])
def test_shapes_accepted_up_to_the_limit(text, shapes):
    assert bench._shapes(text) == shapes


@pytest.mark.parametrize("text", [f"{(1 << 20) + 1}x2x3", "0x2x3", "1x2", "1x2x3x4", "1x-2x3", "1x2.5x3"])
def test_shapes_refused_beyond_the_limit(text):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        bench._shapes(text)
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
