"""The rank reader on real NCCL traces: 08_tensor_parallel.py on one H200 (torchrun --nproc-per-node 1; the runs
in tests/data/tp/h200_tp1_record_log.txt). Expected values come from the raw JSON, not from the reader."""

import gzip
import json
from pathlib import Path

import pytest

from trace_reader.analyzers import ranks
from trace_reader.reading.files import load_trace

TP = Path(__file__).parent / "data" / "tp"
RUNS = sorted(TP.glob("h200_tp1_*_rank0.json.gz"))


def raw(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def active_steps(data):
    """(start, end) of each ProfilerStep#N span, from the raw events."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in data["traceEvents"]
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


def test_the_fixtures_are_there():
    assert [p.name.split("_rank0")[0] for p in RUNS] == [
        "h200_tp1_64x128x768x3072_chunks4_eager", "h200_tp1_64x128x768x3072_eager",
        "h200_tp1_64x128x768x3072_fused_eager"]


@pytest.mark.parametrize("path", RUNS, ids=[p.name for p in RUNS])
def test_one_rank_of_nccl_is_read_as_a_run_of_one(path):
    data = raw(path)
    info = data["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == ("nccl", 0, 1)
    nccl = [e for e in data["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    run = ranks.analyze(ranks.join([load_trace(path)]))
    assert run["world_size"] == 1 and run["backend"] == "nccl" and run["device"] == "cuda"
    steps = run["ranks"][0]["steps"]
    assert len(steps) == len(active_steps(data)) == 3
    # One rank: any NCCL kernel would be a collective here; the raw trace decides how many the reader must count.
    in_steps = [e for e in nccl if any(a <= e["ts"] < b for a, b in active_steps(data))]
    assert in_steps == []  # what the H200 showed: NCCL launches no kernel for an all-reduce over one rank
    assert sum(s["collectives"] for s in steps) == len(in_steps)
    for s in steps:
        assert s["busy_us"] > 0 and s["exposed_us"] == pytest.approx(s["comm_us"] - s["overlapped_us"])
        assert 0 <= s["overlapped_us"] <= s["comm_us"] <= s["busy_us"] + 1e-6


def test_the_fused_shard_runs_the_fused_kernel():
    data = raw(TP / "h200_tp1_64x128x768x3072_fused_eager_rank0.json.gz")
    names = {e["name"] for e in data["traceEvents"] if e.get("cat") == "kernel"}
    assert any(n.startswith("_geglu_") for n in names), names


# What each run printed on the H200 when it was recorded (tests/data/tp/h200_tp1_record_log.txt): read back from the
# saved trace alone, --expect 08_tensor_parallel must give the same verdicts.
AT_RECORDING = {"eager": ["confirmed", "not applicable", "confirmed", "not applicable"],
                "fused_eager": ["confirmed", "not applicable", "not applicable"],
                "chunks4_eager": ["confirmed", "not applicable", "confirmed", "not applicable"]}


@pytest.mark.parametrize("variant", AT_RECORDING)
def test_expect_reads_the_run_back_from_its_trace(variant):
    import inspect_trace as it

    t = load_trace(TP / f"h200_tp1_64x128x768x3072_{variant}_rank0.json.gz")
    exps, said = it.expectations_for("08_tensor_parallel", t)
    assert [v for _, v, _ in it.check(t, exps)] == AT_RECORDING[variant]
    mlp = "fused" if variant.startswith("fused") else "eager"
    chunks = ", 4 chunks" if variant.startswith("chunks4") else ""
    assert said == f"08_tensor_parallel eager, TP=1, MLP {mlp}{chunks}, 3 steps (read from the trace)"
    log = (TP / "h200_tp1_record_log.txt").read_text()
    texts = [ex.text for ex in exps]
    assert all(f"  {text}" in log for text in texts)  # the same guesses, in the recording's words


def test_expect_on_a_trace_that_is_no_rank_is_one_line(tmp_path, capsys):
    import inspect_trace as it

    path = Path(__file__).parent / "data" / "h200_mlp_eager.json.gz"
    assert it.main([str(path), "--expect", "08_tensor_parallel"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a rank of a distributed run" in err
