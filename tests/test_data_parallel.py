"""09_data_parallel.py for real: the page's four torchrun commands (two gloo ranks each, at the CPU shape: DDP, DDP
with --accumulate 2 and small buckets, DDP with --slow-rank 1, FSDP2), started side by side and run once in the
session (test_readme runs the same commands); each run's verdicts, its merged report and its traces checked against
truths read from the raw JSON by a few lines here; --expect on the saved ranks; the page's quoted verdicts; a group
of one rank and bad launches in this process."""

import importlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import RANK_ENV, run_rank_main
from doc_pages import page, section
from test_readme import COMMANDS, CPU_SHAPE, page_runs

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--batch", "2", "--seq", "16", "--dim", "32", "--hidden", "64", "--dtype", "fp32"]
LAUNCH = ["torchrun", "--standalone", "--nproc-per-node", "2", "09_data_parallel.py"]
PAGE = {"ddp": LAUNCH, "acc": LAUNCH + ["--accumulate", "2", "--bucket-cap-mb", "0.02"],
        "slow": LAUNCH + ["--slow-rank", "1"], "fsdp": LAUNCH + ["--dp", "fsdp"]}
STEM = "mlp-2L_2x16x32x64_fp32_cold_dp2-{}_eager_rank{}.json"
FLAGS = {"ddp": "ddp", "acc": "ddp_acc2_bucket0p02", "slow": "ddp_slow1", "fsdp": "fsdp"}
ELEMENTS = 2 * 3 * 32 * 64  # two MLPs, three [32, 64] weights each: every gradient's element
SLEEP_US = 20e3  # the script's SLOW_MS
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def runs(shared_runs, tmp_path_factory):
    """{name: (CompletedProcess, folder)} of the page's four runs: three started at once (each is three processes that
    import torch: side by side they share the cores), then the slow rank's alone. Its guess times the other rank's
    wait (20 ms asleep: 10 ms or more late), and beside six busy ranks on two cores the punctual rank itself ran
    late: rank 1 still arrived last, by a median 9.1 ms."""
    assert all(argv in COMMANDS for argv in PAGE.values()) and CPU_SHAPE["09_data_parallel.py"] == TINY
    pages = page_runs(shared_runs, tmp_path_factory)
    together = [name for name in PAGE if name != "slow"]
    with ThreadPoolExecutor(len(together)) as pool:
        done = dict(zip(together, pool.map(pages.run, (PAGE[name] for name in together))))
    done["slow"] = pages.run(PAGE["slow"])
    return {name: (proc, pages.out / "09_data_parallel") for name, proc in done.items()}


def events(folder, name, rank):
    data = json.loads((folder / STEM.format(FLAGS[name], rank)).read_text())
    base = data["baseTimeNanoseconds"] / 1e3  # each rank's ts count from its own base: µs on a shared clock
    return [{**e, "ts": e["ts"] + base} for e in data["traceEvents"] if e.get("ph") == "X"]


def by_step(evs):
    """{step number: the complete events that start inside ProfilerStep#N}, in time order."""
    steps = {int(e["name"].split("#")[1]): e for e in evs if e["name"].startswith("ProfilerStep#")}
    return {n: sorted((e for e in evs if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]), key=lambda e: e["ts"])
            for n, s in sorted(steps.items())}


def spans(step, name):
    return [e for e in step if e["name"] == name]


def inside(e, span):
    return span["ts"] <= e["ts"] <= span["ts"] + span["dur"]


def verdicts(stdout):
    """Rank 0's verdict lines, as printed."""
    text = stdout.split("rank 0's expectations:\n", 1)[1]
    return [line for line in text.splitlines() if re.match(r"  (ok|n/a|BROKEN) ", line)] + \
        [line for line in text.splitlines() if re.match(r"  \d+ confirmed", line)][:1]


@pytest.mark.parametrize("name", list(PAGE))
def test_each_run_writes_both_ranks_and_every_guess_holds(runs, name):
    proc, folder = runs[name]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for r in (0, 1):
        assert (folder / STEM.format(FLAGS[name], r)).is_file()
        assert (folder / STEM.format(FLAGS[name], r).replace(".json", ".txt")).is_file()
    assert "BROKEN" not in proc.stdout and "rank 1: broken" not in proc.stdout, proc.stdout[-3000:]
    confirmed = {"ddp": 5, "acc": 5, "slow": 7, "fsdp": 4}[name]
    assert verdicts(proc.stdout)[-1] == f"  {confirmed} confirmed, 0 broken, 0 not applicable"
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check: rank")]
    assert sorted(c.split("'")[0] for c in checks) == ["check: rank 0", "check: rank 1"], checks  # one line each
    assert proc.stdout.count("all 2 rank(s), merged") == 1 and "2 rank(s), gloo, CPU" in proc.stdout


def test_ddp_all_reduces_one_bucket_inside_backward(runs):
    """48 KiB of gradients, under DDP's first bucket of 1 MiB: one all-reduce of every element a step, called inside
    backward, on both ranks."""
    proc, folder = runs["ddp"]
    for r in (0, 1):
        for step in by_step(events(folder, "ddp", r)).values():
            (bwd,) = spans(step, "backward")
            calls = spans(step, "c10d::allreduce_")
            assert [c["args"]["Input Dims"][0] for c in calls] == [[[ELEMENTS]]]
            assert inside(calls[0], bwd)
    assert "  ok      one round of all-reduces per optimizer step, all in backward: 1, one per bucket" in verdicts(proc.stdout)


def test_accumulation_all_reduces_in_the_last_backward_only_and_the_first_bucket_early(runs):
    """--accumulate 2 --bucket-cap-mb 0.02: two forward/backward pairs a step; buckets of 3 weights (24 KiB >= the
    cap's 20,971 bytes), so 2 all-reduces, both in the second backward, the first called before that backward's last
    AccumulateGrad: while backward still computes."""
    proc, folder = runs["acc"]
    for r in (0, 1):
        for step in by_step(events(folder, "acc", r)).values():
            fwd, bwd = spans(step, "forward"), spans(step, "backward")
            assert len(fwd) == len(bwd) == 2 and fwd[0]["ts"] < bwd[0]["ts"] < fwd[1]["ts"] < bwd[1]["ts"]
            calls = spans(step, "c10d::allreduce_")
            assert [c["args"]["Input Dims"][0] for c in calls] == [[[ELEMENTS // 2]]] * 2
            assert all(inside(c, bwd[1]) for c in calls)
            grads = [e["ts"] for e in spans(step, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
                     if inside(e, bwd[1])]
            assert len(grads) == 6 and calls[0]["ts"] < max(grads)
    lines = verdicts(proc.stdout)
    assert "  ok      2 forward/backward pairs per optimizer step (one per micro-batch, each forward before its backward)" in lines
    assert ("  ok      --accumulate 2: still one round of all-reduces per optimizer step, all in the last micro-batch's "
            "backward and none in the 1 before it (no_sync()): 2, one per bucket, as without accumulation") in lines


def test_the_slow_rank_arrives_last_and_the_other_waits_in_backward(runs):
    """Rank 1 sleeps 20 ms before each backward, every step: it calls the all-reduce (c10d::allreduce_, on its own
    thread) and gloo starts it a median of at least 10 ms after rank 0 does, last in most steps; rank 0's backward
    lasts a median of at least 10 ms longer. (Medians: four such runs side by side on 2 cores put one rank 40 ms
    behind in a step now and then.)"""
    import statistics

    proc, folder = runs["slow"]
    r0, r1 = (by_step(events(folder, "slow", r)) for r in (0, 1))
    assert list(r0) == list(r1) == [2, 3, 4]
    for n in r0:
        (sleep,) = spans(r1[n], "slow_rank_sleep")
        assert sleep["dur"] >= SLEEP_US and not spans(r0[n], "slow_rank_sleep")
    for name in ("c10d::allreduce_", "gloo:all_reduce"):
        late = [spans(r1[n], name)[0]["ts"] - spans(r0[n], name)[0]["ts"] for n in r0]
        assert statistics.median(late) >= SLEEP_US / 2 and sum(x > 0 for x in late) >= 2, (name, late)
    longer = [spans(r0[n], "backward")[0]["dur"] - spans(r1[n], "backward")[0]["dur"] for n in r0]
    assert statistics.median(longer) >= SLEEP_US / 2, longer
    lines = verdicts(proc.stdout)
    assert ("  ok      rank 1 (asleep 20 ms before each backward) is the straggler: at the first collective of each "
            "backward it arrives last (in most steps), a median 10 ms or more after the first") in lines
    # skew, max skew, then the straggler: rank 1 in most steps
    assert re.search(r"^0  all_reduce +48\.0 KiB +[\d,.]+ +[\d,.]+ +rank 1 \([23]/3\)", proc.stdout, flags=re.M), \
        proc.stdout[-2000:]


def test_fsdp_gathers_in_forward_and_backward_and_scatters_in_backward(runs):
    """Per step: forward all-gathers each MLP's shards (c10d::_allgather_base_, output 3 x 32 x 64), backward gathers
    both again and reduce-scatters both MLPs' gradients (c10d::_reduce_scatter_base_), which gloo runs as an
    all-reduce of the whole input: gloo:all_reduce spans, as many."""
    proc, folder = runs["fsdp"]
    for r in (0, 1):
        for step in by_step(events(folder, "fsdp", r)).values():
            (fwd,), (bwd,) = spans(step, "forward"), spans(step, "backward")
            for phase, gathers, scatters in ((fwd, 2, 0), (bwd, 2, 2)):
                assert sum(inside(e, phase) for e in spans(step, "c10d::_allgather_base_")) == gathers
                assert sum(inside(e, phase) for e in spans(step, "c10d::_reduce_scatter_base_")) == scatters
            assert [e["args"]["Input Dims"][0] for e in spans(step, "c10d::_allgather_base_")] == [[ELEMENTS // 2]] * 4
            assert len(spans(step, "gloo:all_gather")) == 4 and len(spans(step, "gloo:all_reduce")) == 2
    # the merged report names each by the rank's call, and says what gloo ran it as
    rows = re.findall(r"^\d+ +(all_gather|reduce_scatter \(ran as all_reduce\)) +24\.0 KiB ", proc.stdout, flags=re.M)
    assert rows == ["all_gather"] * 4 + ["reduce_scatter (ran as all_reduce)"] * 2, proc.stdout[-2000:]


@pytest.mark.parametrize("name", list(PAGE))
def test_expect_reads_each_saved_rank_back(runs, name, capsys):
    """--expect 09_data_parallel on a rank's saved trace: the flags read back, every guess held (the bucket count is
    in no trace: there the all-reduces need only be as many in every step). In this process: --expect imports the
    script."""
    import inspect_trace

    proc, folder = runs[name]
    said = {"ddp": "DDP over 2 rank(s), 1 micro-batch(es) per step", "acc": "DDP over 2 rank(s), 2 micro-batch(es) per step",
            "slow": "DDP over 2 rank(s), 1 micro-batch(es) per step, rank 1 slow",
            "fsdp": "FSDP over 2 rank(s), 1 micro-batch(es) per step"}[name]
    for r in (0, 1):
        code = inspect_trace.main(["--expect", "09_data_parallel", str(folder / STEM.format(FLAGS[name], r))])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert f"09_data_parallel eager, {said}, 3 steps (read from the trace)" in out
        assert "BROKEN" not in out and re.search(r"^  \d+ confirmed, 0 broken, 0 not applicable$", out, flags=re.M)


def test_the_page_quotes_what_the_runs_print(runs):
    """docs/09's 'What a CPU run shows': each quoted block is lines rank 0 printed, in order, in the runs the page
    names (the plain DDP run, --accumulate, --slow-rank, --dp fsdp)."""
    quoted = re.findall(r"```\n(.*?)```", section(page("docs/09_data_parallel.md"), "## What a CPU run shows"), flags=re.S)
    assert len(quoted) == 4
    for block, name in zip(quoted, PAGE):
        lines = verdicts(runs[name][0].stdout)
        wanted = block.splitlines()
        assert all(line in lines for line in wanted), (name, [line for line in wanted if line not in lines])
        assert sorted(wanted, key=lines.index) == wanted


# In this process: a group of one rank, and the launch checks, which come before any rank waits for another.
dp = importlib.import_module("09_data_parallel")
def run_here(tmp_path, monkeypatch, env, *args):
    return run_rank_main("09_data_parallel.py", dp.main, tmp_path, monkeypatch, env, *TINY, *args)


def test_one_rank_is_a_group_of_one(tmp_path, monkeypatch):
    """FSDP2 with accumulation and a slow rank 0 on one gloo rank: the gradients checked, the step profiled, and
    every guess about collectives not applicable (nothing to exchange), none broken."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**RANK_ENV, "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_PORT": port}
    code, out, err = run_here(tmp_path, monkeypatch, env, "--dp", "fsdp", "--accumulate", "2", "--slow-rank", "0")
    assert code == 0, err[-3000:]
    assert re.search(r"^check: rank 0's FSDP gradients vs the whole model's on the data of 1 rank, relative error",
                     out, flags=re.M)
    assert (tmp_path / "09_data_parallel" / "mlp-2L_2x16x32x64_fp32_cold_dp1-fsdp_acc2_slow0_eager_rank0.json").is_file()
    assert "BROKEN" not in out
    assert re.search(r"n/a +FSDP2: .*\(one rank: FSDP2 shards nothing\)", out)
    assert re.search(r"n/a +rank 0 \(asleep 20 ms .*\(one rank: no one to wait for\)", out)
    assert re.search(r"^  3 confirmed, 0 broken, 3 not applicable$", out, flags=re.M)


def test_not_under_torchrun(tmp_path, monkeypatch):
    code, out, err = run_here(tmp_path, monkeypatch, {})
    assert code == 2 and err.count("\n") == 1 and "not started by torchrun" in err
    assert "torchrun --standalone --nproc-per-node 2 09_data_parallel.py" in err


@pytest.mark.parametrize("args, words", [
    (["--slow-rank", "2"], "--slow-rank 2: there are 2 rank(s), 0 to 1"),
    (["--dp", "fsdp", "--bucket-cap-mb", "1"], "--bucket-cap-mb sets DDP's buckets: with --dp ddp only"),
    (["--bucket-cap-mb", "0"], "argument --bucket-cap-mb: must be above 0 and at most 65536, got 0"),
    (["--bucket-cap-mb", "nan"], "argument --bucket-cap-mb: must be above 0 and at most 65536, got nan"),
    (["--accumulate", "0"], "argument --accumulate: must be between 1 and 64, got 0"),
    (["--compile"], "--compile: this rung profiles DDP and FSDP2 eager"),
    (["--plot"], "--plot and --open read one trace")])
def test_refused_before_the_process_group_starts(tmp_path, monkeypatch, args, words):
    code, out, err = run_here(tmp_path, monkeypatch, RANK_ENV, *args)  # MASTER_PORT 1: a start-up would fail, not hang
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "09_data_parallel").exists()


@cuda
@pytest.mark.parametrize("args", [[], ["--dp", "fsdp", "--accumulate", "2", "--slow-rank", "0"]])
def test_one_gpu_under_torchrun(tmp_path, args):
    """One rank on one GPU, NCCL: the gradient check and the step run; each guess about collectives not applicable."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(ROOT / "09_data_parallel.py"), "--batch", "8", "--seq", "128", *args, "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=540,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 rank(s), nccl" in proc.stdout and "BROKEN" not in proc.stdout, proc.stdout[-3000:]
    n_a = 1 if args else 2  # FSDP2's collectives; or DDP's two guesses (the straggler's need a second rank too)
    assert re.search(rf"^  3 confirmed, 0 broken, {n_a + 2 * bool(args)} not applicable$", proc.stdout, flags=re.M)


@pytest.mark.parametrize("name, kind", [("cpu_ddp_accum_rank0", "DDP over 2 rank(s), 2 micro-batch(es)"),
                                        ("cpu_fsdp_rank0", "FSDP over 2 rank(s), 1 micro-batch(es)")])
def test_expect_on_another_harness_trace(name, kind, capsys):
    """--expect 09_data_parallel on the committed foreign DDP and FSDP2 traces (tests/data/train_foreign, another
    harness: no annotations, a Llama with rotary buffers): micro-batches from torch's own spans, and no BROKEN. The
    DDP one's steps call a c10d::broadcast_ (DDP's buffers, in the first micro-batch's forward) besides the one
    c10d::allreduce_: only all-reduces are held to the last backward."""
    import gzip

    import inspect_trace

    path = ROOT / "tests/data/train_foreign" / f"{name}.json.gz"
    if name.startswith("cpu_ddp"):
        evs = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
        for step in by_step(evs).values():
            assert [e["name"] for e in step if e["name"].startswith("c10d::")] == ["c10d::broadcast_", "c10d::allreduce_"]
    code = inspect_trace.main(["--expect", "09_data_parallel", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"09_data_parallel eager, {kind} per step, 2 steps (read from the trace)" in out and "BROKEN" not in out


def _collectives_around_backward(path):
    """{step: (c10d ops before the step's first autograd node, c10d ops after it)}, from the raw JSON alone."""
    import gzip

    evs = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for n, step in by_step(evs).items():
        start = min(e["ts"] for e in step if e["name"].startswith("autograd::engine::evaluate_function"))
        ops = [e for e in step if e["name"].startswith("c10d::")]
        out[n] = ([e["name"] for e in ops if e["ts"] < start], [e["name"] for e in ops if e["ts"] > start])
    return evs, out


def test_expect_on_fsdp2_that_keeps_its_parameters_gathered(capsys, tmp_path):
    """FSDP2 with reshard_after_forward=False (tests/data/dist/cpu_fsdp2_keep_rank0, another harness: a transformers
    Llama over gloo): its backwards all-gather nothing, so the guess's premise (resharded after forward) does not
    hold, and the reader says so (not applicable, the rest checked), not BROKEN. The same trace held to 09's own runs,
    which reshard, is broken; a trace whose backwards all-gather in some steps and not in others is broken."""
    import gzip

    from trace_reader.analyzers import data_parallel
    from trace_reader.expectation import check
    from trace_reader.reading.files import load_trace

    import inspect_trace

    keep = ROOT / "tests/data/dist/cpu_fsdp2_keep_rank0.json.gz"
    _, around = _collectives_around_backward(keep)
    assert around and all("c10d::_allgather_base_" in f and "c10d::_allgather_base_" not in b
                          and "c10d::_reduce_scatter_base_" in b for f, b in around.values())
    assert inspect_trace.main(["--expect", "09_data_parallel", str(keep)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "FSDP2:" in ln)
    assert line.startswith("  n/a") and "no backward all-gathers" in line and "reshard_after_forward=False" in line
    assert "BROKEN" not in out
    (verdict, _), = [(v, d) for _, v, d in check(load_trace(keep), [data_parallel.fsdp_collectives(2, 1, True)])]
    assert verdict == "broken"

    # the resharding run (tests/data/dist/cpu_fsdp2) with step 3's backward all-gathers taken out: inconsistent
    evs, around = _collectives_around_backward(ROOT / "tests/data/dist/cpu_fsdp2_rank0.json.gz")
    assert all("c10d::_allgather_base_" in b for _, b in around.values())
    step3 = by_step(evs)[3]
    start = min(e["ts"] for e in step3 if e["name"].startswith("autograd::engine::evaluate_function"))
    gone = [e for e in step3 if e["name"] == "c10d::_allgather_base_" and e["ts"] > start]
    assert gone
    raw = json.loads(gzip.decompress((ROOT / "tests/data/dist/cpu_fsdp2_rank0.json.gz").read_bytes()))
    raw["traceEvents"] = [  # each of those calls, and what ran inside it on its thread, taken out
        e for e in raw["traceEvents"]
        if not (e.get("ph") == "X" and any(e.get("tid") == g.get("tid") and g["ts"] <= e["ts"] <= g["ts"] + g["dur"]
                                           for g in gone))]
    mixed = tmp_path / "mixed_rank0.json"
    mixed.write_text(json.dumps(raw))
    assert inspect_trace.main(["--expect", "09_data_parallel", str(mixed)]) == 1
    out = capsys.readouterr().out
    assert "BROKEN  FSDP2:" in out and "seen: ProfilerStep#3, micro-batch 1 of 1" in out
