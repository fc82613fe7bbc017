"""The merge of ranks (trace_reader/ranks.py, collectives.py) on CPU traces from a harness that is not the suite's:
tests/data/dist/record_cpu_dist.py (plain torch.profiler, DDP and FSDP2 over gloo, a 2-layer transformers Llama,
AdamW), recorded as tests/data/dist/cpu_dist_record_log.txt says.

Every expected value is computed here from the raw JSON by a few lines of plain Python: the ProfilerStep spans,
c10d's ops on the step's thread (the calls), gloo's spans on gloo's threads (the runs), their times. Nothing here
asks the reader under test for a truth."""

import gzip
import json
import re
from functools import cache
from pathlib import Path

import pytest

from trace_reader.analyzers import collectives
import inspect_trace as it
from trace_reader.analyzers import ranks

DATA = Path(__file__).resolve().parent / "data" / "dist"
RUNS = ("ddp", "ddp_slow1", "ddp_slowall", "ddp_accum", "fsdp2", "ddp_busy")


def path(run: str, rank: int) -> Path:
    return DATA / f"cpu_{run}_rank{rank}.json.gz"


@cache
def raw(run: str, rank: int) -> dict:
    with gzip.open(path(run, rank)) as f:
        return json.load(f)


def spans(d: dict) -> list[dict]:
    return [e for e in d["traceEvents"] if e.get("ph") == "X"]


def at(d: dict, e: dict) -> float:
    """An event's start in µs on the clock every rank shares: its trace's base time added, less one base time all
    traces share (so that µs stay exact in a float)."""
    return e["ts"] + (d["baseTimeNanoseconds"] - raw("ddp", 0)["baseTimeNanoseconds"]) / 1e3


def steps(d: dict) -> list[dict]:
    return sorted((e for e in spans(d) if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])


def inside(s: dict, e: dict) -> bool:
    return s["ts"] <= e["ts"] <= s["ts"] + s["dur"]


def calls(d: dict, s: dict) -> list[dict]:
    """The step's c10d collective ops (c10d::allreduce_, ...: none of these traces nests one in another)."""
    return sorted((e for e in spans(d) if e["name"].startswith("c10d::") and inside(s, e)), key=lambda e: e["ts"])


def runs(d: dict, s: dict) -> list[dict]:
    """The step's gloo spans, by start."""
    return sorted((e for e in spans(d) if e["name"].startswith("gloo:") and inside(s, e)), key=lambda e: e["ts"])


def merged(run: str) -> dict:
    return ranks.analyze(ranks.load_run([path(run, 0), path(run, 1)]))


@cache
def analyzed(run: str) -> dict:
    return merged(run)


def per_step(data: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for c in data["collectives"]:
        out.setdefault(c["step"], []).append(c)
    return out


# ------------------------------------------------------------------------------------------ arrival and stragglers

@pytest.mark.parametrize("run", RUNS)
def test_arrival_is_when_each_rank_called_the_collective(run):
    """The i-th collective of a step: each rank's arrival is its i-th c10d op's start (on the thread running the
    step), the skew the last less the first, the straggler the last caller (a tie within TIE_US)."""
    d0, d1 = raw(run, 0), raw(run, 1)
    data = analyzed(run)
    for (s0, s1), got in zip(zip(steps(d0), steps(d1)), per_step(data).values()):
        c0, c1 = calls(d0, s0), calls(d1, s1)
        assert len(c0) == len(c1) == len(got)
        assert {c["tid"] for c in c0} == {s0["tid"]} and {c["tid"] for c in c1} == {s1["tid"]}
        for a, b, c in zip(c0, c1, got):
            t = [at(d0, a), at(d1, b)]
            assert c["arrival_of"] == "call" and c["call"] == a["name"]
            assert c["arrival_us"] == pytest.approx([x - min(t) for x in t], abs=1e-3)
            assert c["skew_us"] == pytest.approx(max(t) - min(t), abs=1e-3)
            late = 0 if t[0] > t[1] else 1
            assert c["straggler"] == (None if abs(t[0] - t[1]) <= ranks.TIE_US else late)
            assert c["tied"] == ([0, 1] if abs(t[0] - t[1]) <= ranks.TIE_US else [])


def test_the_call_is_not_when_gloos_thread_started_it():
    """With rank 1 sleeping 10 ms before every backward, rank 1 calls each bucket's all-reduce about 10 ms after
    rank 0; rank 0's later buckets wait on gloo's threads behind its first two (still waiting for rank 1), so their
    gloo spans start only once rank 1 has joined: by span starts the skew is a fraction of that, and on a bucket
    or more rank 0 would even look like the straggler."""
    d0, d1 = raw("ddp_slowall", 0), raw("ddp_slowall", 1)
    data = analyzed("ddp_slowall")
    by_start_straggler = 0
    for (s0, s1), got in zip(zip(steps(d0), steps(d1)), per_step(data).values()):
        for a, b, ga, gb, c in zip(calls(d0, s0), calls(d1, s1), runs(d0, s0), runs(d1, s1), got):
            if c["kind"] != "all_reduce":
                continue
            call_skew = at(d1, b) - at(d0, a)
            start_skew = at(d1, gb) - at(d0, ga)
            assert call_skew > 9_000 and c["straggler"] == 1 and c["skew_us"] == pytest.approx(call_skew, abs=1e-3)
            by_start_straggler += start_skew < 0
            # rank 0's run queued behind its earlier buckets: started_us and queued_us say so
            assert c["queued_us"][0] == pytest.approx(ga["ts"] - a["ts"], abs=1e-3)
            assert c["started_us"][0] == pytest.approx(at(d0, ga) - at(d0, a), abs=1e-3)
    queued = [at(d0, g) - at(d0, a) for s in steps(d0) for a, g in zip(calls(d0, s), runs(d0, s))]
    assert max(queued) > 5_000  # a bucket sat 5 ms or more in gloo's queue on rank 0
    assert by_start_straggler >= 1  # ...so much that by its span's start rank 0 was "last"


def test_straggler_by_call_start_not_by_its_end():
    """Where the collectives' ends come in the other order than their calls (rank 0, waiting, ends its gloo span
    after rank 1 although it called first), the straggler is the one that called last."""
    d0, d1 = raw("ddp_slow1", 0), raw("ddp_slow1", 1)
    data = analyzed("ddp_slow1")
    disagree = 0
    for (s0, s1), got in zip(zip(steps(d0), steps(d1)), per_step(data).values()):
        for a, b, ga, gb, c in zip(calls(d0, s0), calls(d1, s1), runs(d0, s0), runs(d1, s1), got):
            t = [at(d0, a), at(d1, b)]
            ends = [at(d0, ga) + ga["dur"], at(d1, gb) + gb["dur"]]
            if abs(t[0] - t[1]) > ranks.TIE_US and abs(ends[0] - ends[1]) > ranks.TIE_US \
                    and (t[0] > t[1]) != (ends[0] > ends[1]):
                disagree += 1
                assert c["straggler"] == (0 if t[0] > t[1] else 1)
    assert disagree >= 2  # the fixture can tell the two rules apart


def test_a_rank_slow_in_one_step_is_the_straggler_of_that_step():
    """rank 1 slept 10 ms before backward in ProfilerStep#3 only: there it called every all-reduce 10 ms or more
    after rank 0; the report's summary names rank 1 for each all-reduce, never rank 0."""
    d0, d1 = raw("ddp_slow1", 0), raw("ddp_slow1", 1)
    data = analyzed("ddp_slow1")
    s0, s1 = steps(d0)[1], steps(d1)[1]
    assert s0["name"] == s1["name"] == "ProfilerStep#3"
    for a, b, c in zip(calls(d0, s0), calls(d1, s1), per_step(data)[3]):
        if c["kind"] == "all_reduce":
            assert at(d1, b) - at(d0, a) > 10_000 and c["straggler"] == 1
    rows = [line for line in ranks.text(data).splitlines() if " all_reduce " in line]
    assert len(rows) == 4 and all("rank 1 (" in r and "rank 0" not in r for r in rows)


# ------------------------------------------------------------------------------------------ the time it took

@pytest.mark.parametrize("run", ["ddp_slowall", "fsdp2"])
def test_the_time_is_the_transfer_from_the_last_run_start(run):
    """time_us: the gloo span of the rank whose span began last, from its start to its end: by then the other rank
    was in it, so none of it is waiting; queueing is before a span's start, so none of it is queueing."""
    d0, d1 = raw(run, 0), raw(run, 1)
    data = analyzed(run)
    for (s0, s1), got in zip(zip(steps(d0), steps(d1)), per_step(data).values()):
        for ga, gb, c in zip(runs(d0, s0), runs(d1, s1), got):
            last, g = (0, ga) if at(d0, ga) > at(d1, gb) else (1, gb)
            assert c["transfer_rank"] == last
            assert c["time_us"] == pytest.approx(g["dur"], abs=1e-3)  # no span of these ends past its step
            assert c["waited_us"][1 - last] == pytest.approx(abs(at(d0, ga) - at(d1, gb)), abs=1e-3)


# ------------------------------------------------------------------------------------------ within the step

def test_a_gloo_span_past_its_step_is_cut_to_the_step():
    """On the busy machine a gloo span ends long after its step (its thread wrote the end once it ran again):
    busy, communication and exposed time never exceed the step; communication is the union of the step's gloo
    spans, each cut to the step's end and to the start of the optimizer's step after it."""
    data = analyzed("ddp_busy")
    past = 0
    for r in (0, 1):
        d = raw("ddp_busy", r)
        for s, row in zip(steps(d), data["ranks"][r]["steps"]):
            end = s["ts"] + s["dur"]
            opt = min(e["ts"] for e in spans(d) if e["name"].startswith("Optimizer.step#") and inside(s, e))
            cut = []
            for g in runs(d, s):
                past = max(past, g["ts"] + g["dur"] - end)
                stop = min(g["ts"] + g["dur"], end, opt if opt > g["ts"] else end)
                cut.append((g["ts"], max(stop, g["ts"])))
            union, last = 0.0, None
            for a, b in sorted(cut):
                if last is None or a > last:
                    union += b - a
                    last = b
                elif b > last:
                    union += b - last
                    last = b
            assert row["step_us"] == pytest.approx(s["dur"])
            assert row["comm_us"] == pytest.approx(union, abs=1e-3)
            assert max(row["busy_us"], row["comm_us"], row["exposed_us"], row["compute_us"]) <= row["step_us"]
    assert past > 10_000  # one span ends more than 10 ms past its step


def test_no_overlap_is_counted_after_the_optimizer_starts():
    """The busy trace's gloo spans that run on past the optimizer's start (their ends written late) hide nothing
    behind the optimizer: overlapped time stays within the time the cut spans share with any aten op on another
    thread before the optimizer starts."""
    data = analyzed("ddp_busy")
    late = 0
    for r in (0, 1):
        d = raw("ddp_busy", r)
        gloo = {e["tid"] for e in spans(d) if e["name"].startswith("gloo:")}
        for s, row in zip(steps(d), data["ranks"][r]["steps"]):
            opt = min(e["ts"] for e in spans(d) if e["name"].startswith("Optimizer.step#") and inside(s, e))
            late += sum(g["ts"] + g["dur"] > opt for g in runs(d, s))
            cut = [(g["ts"], min(g["ts"] + g["dur"], opt)) for g in runs(d, s) if g["ts"] < opt]
            ops = [(e["ts"], min(e["ts"] + e["dur"], opt)) for e in spans(d)
                   if e.get("cat") == "cpu_op" and e["name"].startswith("aten::") and e["tid"] not in gloo
                   and inside(s, e) and e["ts"] < opt]
            bound = sum(max(0.0, min(b, d_) - max(a, c_)) for a, b in _merged(cut) for c_, d_ in _merged(ops))
            assert row["overlapped_us"] <= bound + 1e-6
    assert late >= 2  # spans that, as written, run past the optimizer's start


def _merged(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def test_fsdp_overlap_is_compute_on_another_thread_only():
    """FSDP2 over gloo: gloo's own aten ops (copy_, div_) run inside its spans on its own thread; no aten op on any
    other thread runs during a gloo span. So nothing is overlapped, all of the communication exposed."""
    data = analyzed("fsdp2")
    for r in (0, 1):
        d = raw("fsdp2", r)
        gloo = {e["tid"] for e in spans(d) if e["name"].startswith("gloo:")}
        for s, row in zip(steps(d), data["ranks"][r]["steps"]):
            g = _merged([(e["ts"], e["ts"] + e["dur"]) for e in runs(d, s)])
            ops = lambda mine: _merged([(e["ts"], e["ts"] + e["dur"]) for e in spans(d)  # noqa: E731
                                        if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")
                                        and inside(s, e) and (e["tid"] in gloo) == mine])
            share = lambda a, b: sum(max(0.0, min(y, w) - max(x, v)) for x, y in a for v, w in b)  # noqa: E731
            assert share(g, ops(False)) == 0 and share(g, ops(True)) > 100  # the two rules differ here
            assert row["overlapped_us"] == 0 and row["exposed_us"] == pytest.approx(row["comm_us"])


# ------------------------------------------------------------------------------------------ what was called

def test_fsdp_reduce_scatter_and_all_gather_named_as_called():
    """FSDP2 calls c10d::_allgather_base_ (gloo runs gloo:all_gather) and c10d::_reduce_scatter_base_ (gloo runs a
    gloo:all_reduce of the whole input): the kinds are the calls', the bus factor the run's; the sizes as
    nccl-tests counts them, the all-gather's output and the reduce-scatter's input (fp32)."""
    d = raw("fsdp2", 0)
    data = analyzed("fsdp2")
    for s, got in zip(steps(d), per_step(data).values()):
        cs, rs = calls(d, s), runs(d, s)
        assert [c["call"] for c in got] == [c["name"] for c in cs]
        assert {c["name"] for c in cs} == {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}
        for c, call, run in zip(got, cs, rs):
            out_dims, in_dims = call["args"]["Input Dims"][:2]
            if call["name"] == "c10d::_reduce_scatter_base_":
                assert (c["kind"], c["ran_as"], run["name"]) == ("reduce_scatter", "all_reduce", "gloo:all_reduce")
                assert c["bytes"] == 4 * in_dims[0]  # the input: what gloo all-reduced
            else:
                assert (c["kind"], c["ran_as"], run["name"]) == ("all_gather", "all_gather", "gloo:all_gather")
                assert c["bytes"] == 4 * out_dims[0]
    table = re.split(r"\n# +collective", ranks.text(data))[1]  # the collectives' table, after the ranks' one
    rows = re.findall(r"^\d+ +(.+?)  ", table, re.M)
    assert len(rows) == len(per_step(data)[2]) and set(rows) == {"all_gather", "reduce_scatter (ran as all_reduce)"}


def test_accumulation_all_reduces_once_per_optimizer_step():
    """Two micro-batches a step, no_sync() on the first: the step's all-reduces are those of one backward (the
    buckets), as many as the raw trace's c10d::allreduce_ calls."""
    d = raw("ddp_accum", 0)
    data = analyzed("ddp_accum")
    single = [c["name"] for c in calls(raw("ddp", 0), steps(raw("ddp", 0))[0])]
    for s, got in zip(steps(d), per_step(data).values()):
        names = [c["name"] for c in calls(d, s)]
        assert names == single  # one broadcast and the buckets' all-reduces, as a step of one micro-batch
        assert [c["kind"] for c in got] == ["broadcast"] + ["all_reduce"] * (len(names) - 1)


def test_step_calls_lists_each_call_with_its_run_and_wait():
    """collectives.step_calls on one rank (what a training step's phases can use): every c10d op of the step, on
    the step's thread, its gloo span, and where the thread sat idle for it. In ProfilerStep#3 of the slow-once run,
    rank 0 waited for the sleeping rank 1: its thread ran no op for 9 ms or more after its last bucket's call."""
    t = it.load_trace(path("ddp_slow1", 0))
    d = raw("ddp_slow1", 0)
    s = steps(d)[1]
    st = t.steps[1]
    got = collectives.step_calls(st, gpu=False)
    cs, rs = calls(d, s), runs(d, s)
    assert [(c.name, c.ts, c.thread[1]) for c in got] == [(c["name"], c["ts"], s["tid"]) for c in cs]
    assert [c.ran[0].ts for c in got] == [g["ts"] for g in rs]
    ops = [e for e in spans(d) if e["tid"] == s["tid"] and e.get("cat") == "cpu_op" and inside(s, e)]
    last = cs[-1]["ts"] + cs[-1]["dur"]
    resume = min(e["ts"] for e in ops if e["ts"] >= last)
    assert resume - last > 9_000
    assert sum(c.waited_us for c in got) >= resume - last
    row = analyzed("ddp_slow1")["ranks"][0]["steps"][1]
    assert row["wait_us"] == pytest.approx(sum(c.waited_us for c in got))


# ------------------------------------------------------------------------------------------ one run, or two

@pytest.mark.parametrize("run", RUNS)
def test_each_run_merges(run, capsys):
    code = it.main([str(path(run, 0)), str(path(run, 1))])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("2 rank(s), gloo, CPU;"), err


def _gap(d0: dict, d1: dict) -> float:
    """How long after rank 0 had ended its first step's last all-reduce rank 1 began its first one, by hand."""
    s0, s1 = steps(d0)[0], steps(d1)[0]
    ar0 = [g for g in runs(d0, s0) if g["name"] == "gloo:all_reduce"]
    ar1 = [g for g in runs(d1, s1) if g["name"] == "gloo:all_reduce"]
    return min(at(d1, g) for g in ar1) - max(at(d0, g) + g["dur"] for g in ar0)


def test_rank_0_of_one_run_and_rank_1_of_another_are_refused(capsys):
    """The same script run twice, 59 s apart: same world, backend, process group, steps and collectives, and on a CPU
    the same baseTimeNanoseconds in every trace. Rank 1 of the second run began its collectives 59 s after rank 0
    of the first had finished them: refused, in one line that says so."""
    d0, d1 = raw("ddp", 0), raw("ddp_again", 1)
    assert d0["baseTimeNanoseconds"] == d1["baseTimeNanoseconds"]
    assert d0["distributedInfo"] == {**d1["distributedInfo"], "rank": 0}
    files = [path("ddp", 0), path("ddp_again", 1)]
    code = it.main([str(f) for f in files])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{_gap(d0, d1) / 1e6:,.1f} s after rank 0" in err and "two runs' traces, not one run's" in err
    # and a run of another machine, a quarter of an hour later, beside this one
    with pytest.raises(it.TraceError, match=r"min after rank 0 .* two runs' traces"):
        ranks.load_run([path("ddp", 0), path("ddp_busy", 1)])


def test_a_rank_file_without_distributed_info_is_refused_not_compared(tmp_path):
    """rank 0 and rank 1 of one run, rank 1's distributedInfo removed: named as one run's ranks, it can be neither
    merged nor silently compared as two runs; one line, exit 2. Two such files that both lack it are compared."""
    cli, gz = it, gzip

    here = Path(__file__).resolve().parent / "data" / "dist"
    for r in (0, 1):
        data = json.loads(gz.decompress((here / f"cpu_ddp_rank{r}.json.gz").read_bytes()))
        if r == 1:
            del data["distributedInfo"]
        (tmp_path / f"run_rank{r}.json").write_text(json.dumps(data))
    files = [str(tmp_path / f"run_rank{r}.json") for r in (0, 1)]
    assert cli.main(files) == 2
    bare = json.loads((tmp_path / "run_rank0.json").read_text())
    del bare["distributedInfo"]
    (tmp_path / "run_rank0.json").write_text(json.dumps(bare))
    assert cli.main(files) == 0  # neither says it is a rank: two traces, compared
