"""Part 1's schedule experiments, read back: how far the GPU lags the CPU per step, the cold first step's
wait before its first op, the profiler's Activity Buffer Request. On hand-built kineto-format traces where a
case has to be forced, and on the committed H200 trace of Part 1's cold run."""

import argparse
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerAction

import common
import inspect_trace as it
from trace_reader.analyzers.guesses import buffer_request, cold_start_gap, gpu_lag_grows
from trace_reader.analyzers.lag import dispatch_gap, launch_lag

DATA = Path(__file__).resolve().parent / "data"


def matmul_add_trace(gemm_us: float, cpu_us: float = 60.0, sync: bool = False, steps: int = 5,
                     gaps=(5.0,), extra=()):
    """Part 1's eager loop as kineto writes it: per step, record_function('matmul_add') > aten::mm, aten::add,
    each launching a kernel on one stream. The GPU runs kernels in order, each no earlier than 5 µs after its
    launch; with `sync`, the step ends in cudaDeviceSynchronize, which waits for the GPU."""
    ev, ids = [], {"n": 0}
    gpu_free, t = 0.0, 1000.0

    def x(name, cat, ts, dur, pid=1, tid=1, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
        return ev[-1]

    for s in range(steps):
        gap = gaps[min(s, len(gaps) - 1)]
        step = x(f"ProfilerStep#{s + 2}", "user_annotation", t, 0)
        ann = x("matmul_add", "user_annotation", t + 2, 0)
        c = t + 2 + gap
        for name, kdur in (("aten::mm", gemm_us), ("aten::add", 3.0)):
            ids["n"] += 1
            n = ids["n"]
            x(name, "cpu_op", c, cpu_us / 2, **{"External id": n})
            x("cudaLaunchKernel", "cuda_runtime", c + 5, 4, **{"External id": n, "correlation": n})
            start = max(gpu_free, c + 10)
            x(f"kernel_{name[6:]}", "kernel", start, kdur, pid=0, tid=7, **{"External id": n, "correlation": n})
            gpu_free = start + kdur
            c += cpu_us / 2 + 1
        ann["dur"] = c - ann["ts"]
        if sync:
            x("cudaDeviceSynchronize", "cuda_runtime", c, max(gpu_free - c, 1.0))
            c = max(c, gpu_free) + 1
        step["dur"] = c + 2 - t
        t = c + 5
    ev.extend(extra)
    props = [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0, "numSms": 132}]
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev}


def verdicts(trace, *expects):
    return [v for _, v, _ in it.check(trace, expects)]


def test_lag_grows_without_a_sync_when_the_gpu_is_the_bottleneck():
    compute_bound = it.parse_trace(matmul_add_trace(gemm_us=580.0))
    lags = [launch_lag(st) for st in compute_bound.steps]
    assert lags[0] == pytest.approx(5.0) and all(b > a + 400 for a, b in zip(lags, lags[1:]))  # ~520 µs more a step
    assert verdicts(compute_bound, gpu_lag_grows(True), gpu_lag_grows(False)) == ["confirmed", "broken"]


def test_lag_stays_flat_with_a_sync_per_step_or_when_the_cpu_is_the_bottleneck():
    synced = it.parse_trace(matmul_add_trace(gemm_us=580.0, sync=True))
    assert {round(launch_lag(st), 3) for st in synced.steps} == {5.0}
    overhead_bound = it.parse_trace(matmul_add_trace(gemm_us=3.0))
    for t in (synced, overhead_bound):
        assert verdicts(t, gpu_lag_grows(True), gpu_lag_grows(False)) == ["broken", "confirmed"]
    _, _, detail = it.check(synced, [gpu_lag_grows(True)])[0]
    assert detail == "launch -> GPU start per step: 5, 5, 5, 5, 5 µs"


def test_cold_first_step_waits_before_its_first_op():
    cold = it.parse_trace(matmul_add_trace(gemm_us=3.0, gaps=(228.0, 5.5, 4.5)))  # the post's A100 numbers
    assert [round(dispatch_gap(st, "matmul_add"), 1) for st in cold.steps] == [228.0, 5.5, 4.5, 4.5, 4.5]
    assert verdicts(cold, cold_start_gap("matmul_add", cold=True), cold_start_gap("matmul_add", cold=False)) == \
        ["confirmed", "broken"]
    warm = it.parse_trace(matmul_add_trace(gemm_us=3.0, gaps=(6.0, 5.5, 4.5)))
    assert verdicts(warm, cold_start_gap("matmul_add", cold=True), cold_start_gap("matmul_add", cold=False)) == \
        ["broken", "confirmed"]
    # no such annotation: broken with what was seen, never confirmed
    assert verdicts(warm, cold_start_gap("linear_fwd", cold=False)) == ["broken"]


@pytest.mark.parametrize("gaps, cold", [
    ((15.0, 5.0, 6.0), False),  # exactly 3x the later steps' median: not "longest"
    ((15.5, 5.0, 6.0), True),
    # 3 active steps (the scripts' schedule): the later steps' median is the lower of the two, 5; the median of
    # all three steps (12) would make 30 look warm
    ((30.0, 5.0, 12.0), True),
    # 5 steps: the later steps' lower median is 6 (of 4, 6, 8, 100); 20 > 3 x 6, not > 3 x 7 (the mean of the
    # middle two) nor > 3 x 8 (the median of all five)
    ((20.0, 4.0, 6.0, 8.0, 100.0), True),
    ((18.0, 4.0, 6.0, 8.0, 100.0), False),
])
def test_cold_start_is_the_first_gap_against_the_later_steps_median(gaps, cold):
    t = it.parse_trace(matmul_add_trace(gemm_us=3.0, steps=len(gaps), gaps=gaps))
    assert [dispatch_gap(st, "matmul_add") for st in t.steps] == list(gaps)
    assert verdicts(t, cold_start_gap("matmul_add", cold=True), cold_start_gap("matmul_add", cold=False)) == \
        (["confirmed", "broken"] if cold else ["broken", "confirmed"])


def test_cold_gap_on_the_h200_cold_run():
    t = it.load_trace(DATA / "h200_matmul_add_64_eager.json.gz")  # 01_matmul_add.py --size 64, cold
    gaps = [dispatch_gap(st, "matmul_add") for st in t.steps]
    assert gaps[0] > 3 * max(gaps[1:])
    assert verdicts(t, cold_start_gap("matmul_add", cold=True)) == ["confirmed"]


def test_buffer_request_is_looked_up_in_the_file(tmp_path):
    request = {"ph": "X", "cat": "overhead", "name": "Activity Buffer Request", "pid": 0, "tid": 7, "ts": 990.0,
               "dur": 40.0, "args": {}}
    found, missing = tmp_path / "found.json", tmp_path / "missing.json"
    found.write_text(json.dumps(matmul_add_trace(gemm_us=3.0, extra=[request])))
    missing.write_text(json.dumps(matmul_add_trace(gemm_us=3.0)))
    assert verdicts(it.load_trace(found), buffer_request()) == ["confirmed"]
    assert verdicts(it.load_trace(missing), buffer_request()) == ["broken"]
    # a CPU trace: not applicable, as on this machine
    cpu = matmul_add_trace(gemm_us=3.0, extra=[request])
    cpu["traceEvents"] = [e for e in cpu["traceEvents"] if e["cat"] in ("cpu_op", "user_annotation")]
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    assert verdicts(it.load_trace(tmp_path / "cpu.json"), buffer_request()) == ["not applicable"]


# ----------------------------------------------------------------------------------- the harness's schedule

class ActionsSeen(torch.profiler.profile):
    """torch's profiler as common.profile() drives it, noting the action it takes in each step of the loop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.actions: list[ProfilerAction] = []

    def step(self):
        self.actions.append(self.current_action)
        super().step()


N, W, R, S = ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE


@pytest.mark.parametrize("wait, warmup, active, actions", [
    (1, 1, 3, [N, W, R, R, S]),  # the post's schedule
    (2, 0, 1, [N, N, S]),
    (0, 2, 3, [W, W, R, R, S]),
    (0, 0, 3, [R, R, S]),  # Part 1's experiment
    (3, 1, 2, [N, N, N, W, R, S]),
], ids=["post", "wait2-warmup0-active1", "wait0-warmup2-active3", "wait0-warmup0-active3", "wait3-warmup1-active2"])
def test_profiler_waits_then_warms_up_then_records(monkeypatch, wait, warmup, active, actions):
    """--wait, --profiler-warmup and --active, step by step: what the profiler does in each step of the loop."""
    monkeypatch.setattr(common, "Profiler", ActionsSeen)
    args = argparse.Namespace(compile=False, warmup=0, wait=wait, profiler_warmup=warmup, active=active,
                              sync_each_step=False)
    calls = []
    prof = common.profile(common.Run("01_matmul_add", args, torch.device("cpu"), torch.float32),
                          lambda: calls.append(1), "matmul_add")
    assert prof.actions == actions and len(calls) == len(actions)
