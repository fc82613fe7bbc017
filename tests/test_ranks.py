"""The ranks of one distributed run read together (trace_reader/ranks.py, inspect_trace.py given several traces):
synthetic rank traces built here, every expected number worked out by hand from the events written below."""

import json

import pytest

from trace_reader.analyzers import collectives
import inspect_trace as it
from trace_reader.analyzers import collectives as coll
from trace_reader.facts import intervals
from trace_reader.analyzers import ranks

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
BASE_NS = 1_790_000_000_000_000_000


def step_span(number, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "ts": ts, "dur": dur,
            "pid": 1, "tid": 1}


def gpu(name, ts, dur, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": args}


def gpu_rank(rank, world, kernels, steps=((2, 0, 1000),), base=BASE_NS, backend="nccl"):
    """A GPU rank's trace: ProfilerStep spans and the given kernels (no launch calls: placed by the GPU's clock)."""
    events = [step_span(*s) for s in steps] + kernels
    return {"distributedInfo": {"backend": backend, "rank": rank, "world_size": world}, "baseTimeNanoseconds": base,
            "traceEvents": events}


def nccl(ts, dur, nelems=8192 * 768):
    """An all-reduce kernel on NCCL's own stream (tid 8), beside the compute stream (tid 7)."""
    k = gpu(ALL_REDUCE, ts, dur, **{"In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "BFloat16"})
    return {**k, "tid": 8}


def write(tmp_path, datas, stem="run"):
    paths = []
    for d in datas:
        p = tmp_path / f"{stem}_rank{d['distributedInfo']['rank']}.json"
        p.write_text(json.dumps(d))
        paths.append(p)
    return paths


def two_gpu_ranks():
    # rank 0: GEMM 100-400, all-reduce 300-700 (starts last: the straggler); rank 1: GEMM 100-200, all-reduce 250-750
    # (it waited for rank 0 and ends last: the end's order is not the start's, so a straggler by ends is caught)
    return [gpu_rank(0, 2, [gpu("nvjet_gemm", 100, 300), nccl(300, 400)]),
            gpu_rank(1, 2, [gpu("nvjet_gemm", 100, 100), nccl(250, 500)])]


def merged(tmp_path, datas):
    return ranks.analyze(ranks.load_run(write(tmp_path, datas)))


# ---------------------------------------------------------------------------------------------- intervals

def test_intervals_merge_and_common_at_the_edges():
    assert intervals.merge([(5, 7), (0, 2), (2, 3)]) == [(0, 3), (5, 7)]  # touching intervals join
    assert intervals.length([(0, 4), (2, 6), (10, 11)]) == 7
    assert intervals.common([(0, 300)], [(300, 700)]) == 0  # end meets start: nothing shared
    assert intervals.common([(0, 301)], [(300, 700)]) == 1
    assert intervals.common([(0, 10), (20, 30)], [(5, 25)]) == 10


# ---------------------------------------------------------------------------------------------- the numbers

def test_overlapped_and_exposed_per_rank_and_step(tmp_path):
    data = merged(tmp_path, two_gpu_ranks())
    r0, r1 = (r["steps"][0] for r in data["ranks"])
    # rank 0: the all-reduce (300-700) shares 300-400 with the GEMM: 100 overlapped, 300 exposed; busy 100-700
    assert (r0["comm_us"], r0["overlapped_us"], r0["exposed_us"], r0["busy_us"]) == (400, 100, 300, 600)
    # rank 1: GEMM ends at 200, all-reduce 250-750: nothing overlaps; busy 100 + 500
    assert (r1["comm_us"], r1["overlapped_us"], r1["exposed_us"], r1["busy_us"]) == (500, 0, 500, 600)
    assert (r0["step_us"], r0["called"], r0["wait_us"]) == (1000, 0, None)  # no c10d call; a GPU: the host waits not


def test_comm_touching_compute_is_not_overlapped(tmp_path):
    at = lambda end: gpu_rank(0, 1, [gpu("gemm", 0, end), nccl(300, 100)])  # noqa: E731
    assert merged(tmp_path, [at(300)])["ranks"][0]["steps"][0]["overlapped_us"] == 0
    assert merged(tmp_path, [at(301)])["ranks"][0]["steps"][0]["overlapped_us"] == 1


def test_skew_straggler_and_bus_bandwidth(tmp_path):
    (c,) = merged(tmp_path, two_gpu_ranks())["collectives"]
    # no call in the trace: each rank arrives when its kernel starts; rank 0 at 300, 50 µs after rank 1
    assert (c["kind"], c["skew_us"], c["straggler"], c["arrival_us"]) == ("all_reduce", 50, 0, [50, 0])
    assert (c["arrival_of"], c["tied"], c["transfer_rank"], c["waited_us"]) == ("start", [], 0, [0, 50])
    assert c["bytes"] == 8192 * 768 * 2  # bf16
    # the straggler's 400 µs: 12,582,912 B / 400e-6 s = 31.45728 GB/s; all-reduce busbw x 2(2-1)/2 = x1
    assert c["time_us"] == 400
    assert c["algbw_gbs"] == pytest.approx(31.45728)
    assert c["busbw_gbs"] == pytest.approx(31.45728)


def test_busbw_factor_of_four_ranks(tmp_path):
    # starts 100, 130, 160, 190; the later the start, the earlier the end (500, 470, 440, 410)
    datas = [gpu_rank(r, 4, [nccl(100 + 30 * r, 400 - 60 * r)]) for r in range(4)]
    (c,) = merged(tmp_path, datas)["collectives"]
    assert (c["straggler"], c["skew_us"], c["transfer_rank"], c["time_us"]) == (3, 90, 3, 220)
    assert c["busbw_gbs"] == pytest.approx(8192 * 768 * 2 / 220e-6 / 1e9 * 1.5)  # 2(4-1)/4


def test_ranks_clocks_are_aligned_by_their_base_time(tmp_path):
    # rank 1's trace counts from a base 1 ms later: its all-reduce at ts 250 is at 1250 on rank 0's clock (it began
    # 550 µs after rank 0's had ended: within the second two hosts' clocks may differ by)
    datas = two_gpu_ranks()
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 1_000_000
    (c,) = merged(tmp_path, datas)["collectives"]
    assert (c["straggler"], c["skew_us"]) == (1, 950)


def test_ranks_whose_clocks_are_hours_apart_are_refused_in_one_line(tmp_path):
    """Rank 1's base time 0 (its trace then counts from 1970) or missing beside rank 0's: on the shared clock its
    step starts decades before rank 0's: an hour and a millisecond apart is refused so. 59 minutes apart is refused
    too, for another reason: rank 1's all-reduce began 59 minutes after rank 0's had ended (see
    test_collectives_that_did_not_run_together)."""
    for base in (0, None):
        datas = two_gpu_ranks()
        if base is None:
            del datas[1]["baseTimeNanoseconds"]
        else:
            datas[1]["baseTimeNanoseconds"] = base
        with pytest.raises(it.TraceError, match=r"^rank 0's first step starts [\d,.]+ hours after rank 1's on the clock "
                                                r"the ranks share .*base time is missing or wrong$"):
            ranks.load_run(write(tmp_path, datas))
    datas = two_gpu_ranks()
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 3_600_001_000_000  # an hour and a millisecond
    with pytest.raises(it.TraceError, match=r"^rank 1's first step starts 1.0 hours after rank 0's"):
        ranks.load_run(write(tmp_path, datas))
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 59 * 60_000_000_000
    with pytest.raises(it.TraceError, match=r"^rank 1 \(.*run_rank1.json\) began step #2's collectives 59.0 min after "
                                            r"rank 0 \(.*run_rank0.json\) had finished them"):
        ranks.load_run(write(tmp_path, datas))


def test_collectives_that_did_not_run_together(tmp_path):
    """No rank ends an all-reduce before every rank has begun it. Rank 1's base time 500 ms later: its all-reduce
    250-750 is at 500,250-500,750 on rank 0's clock, which ended its own at 700: it began 499,550 µs after. Within
    the second two hosts' clocks may differ by: read. Traces that name one host read one clock: 1 ms, refused.
    Two hosts: read again. A broadcast's root may be done before its peer starts: never refused."""
    datas = two_gpu_ranks()
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 500_000_000
    assert len(ranks.load_run(write(tmp_path, datas))) == 2
    for e in datas[1]["traceEvents"]:  # another process of the same host
        e["pid"] = 2 if e["name"].startswith("ProfilerStep") else e["pid"]
    datas[0]["host_name"] = datas[1]["host_name"] = "node1"
    with pytest.raises(it.TraceError) as e:
        ranks.load_run(write(tmp_path, datas))
    assert str(e.value) == (f"rank 1 ({tmp_path}/run_rank1.json) began step #2's collectives 499.6 ms after rank 0 "
                            f"({tmp_path}/run_rank0.json) had finished them, and no rank finishes an all-reduce before "
                            "every rank has begun it: two runs' traces, not one run's")
    datas[1]["host_name"] = "node2"
    assert len(ranks.load_run(write(tmp_path, datas))) == 2
    datas[1]["host_name"] = "node1"
    for d in datas:
        d["traceEvents"][-1]["name"] = "ncclDevKernel_Broadcast_RING_LL"
    assert len(ranks.load_run(write(tmp_path, datas))) == 2


def test_steps_a_minute_apart_without_collectives(tmp_path):
    """Steps without a collective tie the ranks to nothing, but one run's ranks do not drift a minute apart: rank 1's
    step (0-1000) 61 s later begins 60,999,000 µs after rank 0's ended."""
    datas = [gpu_rank(0, 2, [gpu("gemm", 10, 10)]), gpu_rank(1, 2, [gpu("gemm", 10, 10)])]
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 59_000_000_000
    assert len(ranks.load_run(write(tmp_path, datas))) == 2
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 61_000_000_000
    with pytest.raises(it.TraceError) as e:
        ranks.load_run(write(tmp_path, datas))
    assert str(e.value) == "the ranks' steps are 1.0 min apart on the clock they share: two runs' traces, not one run's"


def test_one_process_is_one_rank(tmp_path):
    """Two traces of one host and one pid (the same process profiled twice, its rank edited, or files mixed up)."""
    datas = two_gpu_ranks()
    datas[0]["host_name"] = datas[1]["host_name"] = "node1"
    with pytest.raises(it.TraceError) as e:
        ranks.load_run(write(tmp_path, datas))
    assert str(e.value) == (f"ranks 0 and 1 ({tmp_path}/run_rank0.json, {tmp_path}/run_rank1.json) were written by "
                            "one process (pid 1 on node1): one process is one rank, so not one run")


def test_process_groups_must_agree(tmp_path):
    """A process group both ranks belong to is one group: its description and ranks the same in both traces."""
    datas = two_gpu_ranks()
    group = {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}
    for d in datas:
        d["distributedInfo"]["pg_config"] = [dict(group)]
    assert len(ranks.load_run(write(tmp_path, datas))) == 2
    datas[1]["distributedInfo"]["pg_config"] = [dict(group), {**group, "pg_name": "1", "pg_desc": "tp"}]
    assert len(ranks.load_run(write(tmp_path, datas))) == 2  # a group rank 0 is not in: nothing to compare
    datas[1]["distributedInfo"]["pg_config"][0]["pg_desc"] = "mesh_dp"
    with pytest.raises(it.TraceError) as e:
        ranks.load_run(write(tmp_path, datas))
    assert str(e.value) == (f"process group '0' is mesh_dp of 2 ranks [0, 1] in rank 1's trace "
                            f"({tmp_path}/run_rank1.json) but default_pg of 2 ranks [0, 1] in rank 0's "
                            f"({tmp_path}/run_rank0.json): not one run")


def test_reduce_scatter_and_all_gather_sizes_and_factors(tmp_path):
    n = 1024  # elements per rank's shard
    ag = lambda ts: gpu("ncclDevKernel_AllGather_RING_LL", ts, 100,  # noqa: E731
                        **{"In msg nelems": n, "Out msg nelems": 2 * n, "dtype": "Float"})
    rs = lambda ts: gpu("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", ts, 200,  # noqa: E731
                        **{"In msg nelems": 2 * n, "Out msg nelems": n, "dtype": "Float"})
    datas = [gpu_rank(r, 2, [ag(10), gpu("gemm", 200, 100), rs(400)]) for r in range(2)]
    a, b = merged(tmp_path, datas)["collectives"]
    assert (a["kind"], a["bytes"], b["kind"], b["bytes"]) == ("all_gather", 8192, "reduce_scatter", 8192)
    # 8192 B / 100 µs = 0.08192 GB/s, x (2-1)/2; 8192 B / 200 µs = 0.04096 GB/s, x 1/2
    assert a["busbw_gbs"] == pytest.approx(0.04096)
    assert b["busbw_gbs"] == pytest.approx(0.02048)


def test_gloo_on_a_cpu(tmp_path):
    """CPU ranks: gloo's collective span on its own thread is the communication, the aten ops the compute. Rank 0
    started first and, waiting for rank 1, ended last: the straggler is rank 1 by its start, its span the time."""
    def cpu_rank(rank, gloo_ts, dur):
        return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, "traceEvents": [
            step_span(3, 0, 5000),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 900, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": gloo_ts, "dur": dur, "pid": 1,
             "tid": 2, "args": {"Input Dims": [[2, 32, 64]], "Input type": ["float"]}}]}
    data = merged(tmp_path, [cpu_rank(0, 800, 2500), cpu_rank(1, 1200, 2000)])
    assert data["device"] == "cpu" and data["backend"] == "gloo"
    s0 = data["ranks"][0]["steps"][0]
    # rank 0: mm 100-1000, gloo 800-3300: 200 overlapped, 2300 exposed, busy 100-3300
    assert (s0["compute_us"], s0["overlapped_us"], s0["exposed_us"], s0["busy_us"]) == (900, 200, 2300, 3200)
    (c,) = data["collectives"]
    assert (c["bytes"], c["straggler"], c["skew_us"], c["time_us"]) == (2 * 32 * 64 * 4, 1, 400, 2000)


# ---------------------------------------------------------------------------------------------- the command

def run_cli(argv, capsys):
    code = it.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_two_rank_files_are_merged_and_json_carries_it(tmp_path, capsys):
    paths = write(tmp_path, two_gpu_ranks())
    code, out, _ = run_cli(["--json", *paths], capsys)
    data = json.loads(out)
    assert code == 0 and data["world_size"] == 2 and data["collectives"][0]["straggler"] == 0
    code, out, _ = run_cli(paths, capsys)
    assert code == 0 and "all_reduce" in out and "rank 0 (1/1)" in out


def test_a_folder_of_one_run(tmp_path, capsys):
    write(tmp_path, two_gpu_ranks())
    code, out, _ = run_cli(["--json", tmp_path], capsys)
    assert code == 0 and [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]


def test_two_traces_of_the_same_rank_are_compared_unless_ranks(tmp_path, capsys):
    a = write(tmp_path, [two_gpu_ranks()[0]], "a")
    b = write(tmp_path, [two_gpu_ranks()[0]], "b")
    code, out, _ = run_cli([*a, *b], capsys)
    assert code == 0 and "rank(s)" not in out  # the two-trace comparison
    code, _, err = run_cli(["--ranks", *a, *b], capsys)
    assert code == 2 and "rank 0 twice" in err and len(err.strip().splitlines()) == 1


def refused(tmp_path, capsys, datas, words):
    paths = [tmp_path / f"file{i}.json" for i in range(len(datas))]
    for p, d in zip(paths, datas):
        p.write_text(json.dumps(d))
    code, out, err = run_cli(["--ranks", *paths], capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert out == ""


def test_missing_rank(tmp_path, capsys):
    refused(tmp_path, capsys, [gpu_rank(0, 3, [nccl(0, 10)]), gpu_rank(2, 3, [nccl(0, 10)])], "rank(s) 1 missing")


def test_runs_of_different_sizes(tmp_path, capsys):
    refused(tmp_path, capsys, [gpu_rank(0, 2, [nccl(0, 10)]), gpu_rank(1, 4, [nccl(0, 10)])], "not the same run")


def test_no_distributed_info(tmp_path, capsys):
    plain = gpu_rank(0, 2, [nccl(0, 10)])
    del plain["distributedInfo"]
    refused(tmp_path, capsys, [plain, gpu_rank(1, 2, [nccl(0, 10)])], "no usable distributedInfo")


def test_a_rank_out_of_range(tmp_path, capsys):
    refused(tmp_path, capsys, [gpu_rank(0, 2, []), gpu_rank(5, 2, [])], "no usable distributedInfo")


def test_different_collectives(tmp_path, capsys):
    other = gpu_rank(1, 2, [gpu("ncclDevKernel_AllGather_RING_LL", 0, 10)])
    refused(tmp_path, capsys, [gpu_rank(0, 2, [nccl(0, 10)]), other], "not the same collectives")


def test_different_steps(tmp_path, capsys):
    later = gpu_rank(1, 2, [nccl(0, 10)], steps=((5, 0, 1000),))
    refused(tmp_path, capsys, [gpu_rank(0, 2, [nccl(0, 10)]), later], "not the same run")


def test_folder_of_two_runs(tmp_path, capsys):
    write(tmp_path, two_gpu_ranks(), "one")
    write(tmp_path, two_gpu_ranks(), "two")
    code, _, err = run_cli([tmp_path], capsys)
    assert code == 2 and "2 runs" in err and len(err.strip().splitlines()) == 1


def test_too_many_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ranks, "MAX_RANKS", 2)
    code, _, err = run_cli([tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"], capsys)
    assert code == 2 and "more than 2 trace files" in err


def test_a_broken_rank_file(tmp_path, capsys):
    paths = write(tmp_path, two_gpu_ranks())
    paths[1].write_text('{"traceEvents": [')
    code, _, err = run_cli([*paths], capsys)
    assert code == 2 and "not valid JSON" in err and len(err.strip().splitlines()) == 1


def test_gemms_per_step_leaves_out_a_split_k_reduce():
    """08's "3 GEMMs per rank" on a GPU trace: a split-K GEMM's reduce kernel, launched by the same op, is its second
    half; two GEMMs and a pointwise kernel are two."""
    def launched(name, ts, corr, ext):
        return [gpu(name, ts, 10, correlation=corr, **{"External id": ext}),
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 5, "dur": 2, "pid": 1,
                 "tid": 1, "args": {"correlation": corr, "External id": ext}}]
    mm = lambda ts, ext: {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": 50, "pid": 1,  # noqa: E731
                          "tid": 1, "args": {"External id": ext}}
    events = [step_span(2, 0, 1000), mm(100, 1), *launched("nvjet_tst_splitK_gemm", 110, 11, 1),
              *launched("cublasLt::splitKreduce_kernel", 130, 12, 1), mm(300, 2), *launched("nvjet_tst_gemm", 310, 13, 2),
              *launched("vectorized_elementwise_kernel", 500, 14, 3)]
    t = it.parse_trace({"traceEvents": events})
    assert ranks.gemms_per_step(2).check(t) is True
    assert ranks.gemms_per_step(3).check(t) == "GEMM kernels per step: [2]"


# ------------------------------------------------------------------------------------------ --plot: the lanes

def test_lanes_put_every_rank_on_one_clock(tmp_path):
    # rank 0: GEMM 100-400, all-reduce 300-700; rank 1 (base 1 ms later): GEMM 100-200 -> 1100-1200, all-reduce
    # 250-650 -> 1250-1650. The run's first interval starts at 100: everything from there.
    datas = two_gpu_ranks()
    datas[1]["baseTimeNanoseconds"] = BASE_NS + 1_000_000
    data = ranks.lanes(ranks.load_run(write(tmp_path, datas)))
    assert data["device"] == "cuda"
    assert [(r["rank"], r["compute"], r["comm"]) for r in data["ranks"]] == [
        (0, [(0.0, 300.0)], [(200.0, 600.0)]), (1, [(1000.0, 1100.0)], [(1150.0, 1650.0)])]


def test_plot_draws_the_ranks_side_by_side(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from trace_reader.render.plot import png_data

    paths = write(tmp_path, two_gpu_ranks())
    picture = tmp_path / "ranks.png"
    code, out, err = run_cli([*paths, "--plot", picture], capsys)
    assert code == 0 and f"wrote {picture} (the ranks side by side)" in out, err
    drawn = png_data(picture)  # the numbers inside the PNG are the lanes, as JSON
    assert [(r["rank"], r["compute"], r["comm"]) for r in drawn["ranks"]] == [
        (0, [[0, 300]], [[200, 600]]), (1, [[0, 100]], [[150, 650]])]
    # a name that is no PNG: one line, before any report
    code, out, err = run_cli([*paths, "--plot", tmp_path / "ranks.jpg"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "ending in .png" in err


def test_tp_flags_from_the_trace_or_the_name(tmp_path):
    """08's flags read back: sequence parallel from an all-gather in the steps OR the name's _sp, either alone;
    --chunks from the name only; the ranks from distributedInfo; fused from the kernel's name."""
    import argparse

    def flags(kernels, stem):
        (path,) = write(tmp_path, [gpu_rank(0, 2, kernels)], stem=stem)
        a = argparse.Namespace()
        ranks.tp_flags(a, it.load_trace(path), path.name.split(".")[0].split("_"))
        return a.world, a.sequence_parallel, a.chunks, a.mlp

    gather = gpu("ncclDevKernel_AllGather_RING_LL", 100, 10)
    assert flags([gpu("nvjet_gemm", 0, 50)], "x_tp2_eager") == (2, False, 1, "eager")
    assert flags([gather], "x_tp2_eager") == (2, True, 1, "eager")  # the trace alone says it
    assert flags([gpu("nvjet_gemm", 0, 50)], "x_tp2_sp_eager") == (2, True, 1, "eager")  # the name alone
    assert flags([gpu("_geglu_tma_kernel", 0, 50)], "x_tp2_chunks4_eager") == (2, False, 4, "fused")
    assert flags([gpu("nvjet_gemm", 0, 50)], "x_tp2_chunks0_eager")[2] == 1  # not a chunk count
    assert flags([gpu("nvjet_gemm", 0, 50)], "x_tp2_fused_eager")[3] == "fused"  # the name alone


# ---------------------------------------------------------------------------------------------- at their edges

def test_sizes_dtypes_and_dims_at_their_limits():
    assert [coll._dtype_bytes(n) for n in ("c10::BFloat16", "torch.float32", "c10::Half", "Float", 2)] == [
        2, 4, 2, 4, None]
    assert coll._elements([(1 << 40) - 1]) == (1 << 40) - 1 and coll._elements([1 << 40]) is None
    assert coll._elements([2, "3"]) is None and coll._elements([[2, 3], [4]]) == 10 and coll._elements([]) == 1
    # "In/Out msg nelems" from 0 up; an output of 0 elements still says the input's size
    assert coll._size("all_reduce", {"dtype": "BFloat16", "In msg nelems": 8, "Out msg nelems": 0}, 2) == 16
    # no usable nelems: the first input's dims; an all-gather's output is world x that; dims not a list: unknown
    gloo = {"Input type": ["float"], "Input Dims": [[2, 3]]}
    assert coll._size("all_reduce", gloo, 4) == 24 and coll._size("all_gather", gloo, 4) == 96
    assert coll._size("all_reduce", {"Input type": ["float"], "Input Dims": {"0": [2, 3]}}, 4) is None
    # both sets' overlaps, each interval of the longer set walked in turn: 2 + 1 + 1
    assert intervals.common([(0, 10)], [(0, 2), (3, 4), (5, 6)]) == 4
    assert [ranks._size_text(n) for n in (None, 1536, (1 << 20) - 1, 1 << 20, 3 << 20)] == [
        "?", "1.5 KiB", "1,024.0 KiB", "1.00 MiB", "3.00 MiB"]


def test_the_size_comes_from_the_nccl_record_function_above_a_kernel(tmp_path):
    """A kernel without size args launched inside an "nccl:all_reduce" record_function (2 x 1024 float32 elements,
    its Input Dims) takes that span's size: 8 KiB."""
    rank = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": [
        step_span(2, 0, 1000),
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": 10, "dur": 50, "pid": 1, "tid": 1,
         "args": {"Input Dims": [[2, 1024]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 5, "pid": 1, "tid": 1,
         "args": {"correlation": 1}},
        {**gpu(ALL_REDUCE, 100, 40), "args": {"correlation": 1}}]}
    data = merged(tmp_path, [rank])
    assert [c["bytes"] for c in data["collectives"]] == [8192]


def test_a_cpu_rank_counts_only_collective_spans(tmp_path):
    """An annotation that is not a collective ("forward") is compute's business, not communication."""
    rank = {"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1}, "traceEvents": [
        step_span(3, 0, 5000),
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": 50, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 900, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 2000, "dur": 500, "pid": 1, "tid": 2,
         "args": {"Input Dims": [[4]], "Input type": ["float"]}}]}
    s = merged(tmp_path, [rank])["ranks"][0]["steps"][0]
    assert (s["collectives"], s["comm_us"], s["compute_us"]) == (1, 500, 900)


def _row(step, busy, compute, comm, overlapped, wait):
    return {"step": step, "step_us": 2000.0, "busy_us": busy, "compute_us": compute, "comm_us": comm,
            "overlapped_us": overlapped, "exposed_us": comm - overlapped, "wait_us": wait, "collectives": 2}


def _coll(step, index, kind, ran_as, size, skew, straggler, us, gbs):
    return {"step": step, "index": index, "kind": kind, "ran_as": ran_as, "bytes": size, "arrival_of": "call",
            "skew_us": skew, "straggler": straggler, "time_us": us, "algbw_gbs": gbs, "busbw_gbs": gbs}


# Rank 1 slow in step 5 only (4 ms late); rank 0 last by a few µs in steps 6 and 7; a tie in step 8. Index 1: a
# reduce-scatter gloo ran as an all-reduce, every step a tie.
RANKS_DATA = {
    "world_size": 2, "backend": "nccl", "device_name": "NVIDIA H200", "device": "cuda",
    "ranks": [{"rank": 0, "steps": [_row(5, 1234.5, 800.0, 500.0, 65.5, 120.25)]},
              {"rank": 1, "steps": [_row(5, 990.0, 700.0, 300.0, 10.0, 0.0)]}],
    "collectives": [_coll(5, 0, "all_reduce", "all_reduce", 3 << 20, 4000.0, 1, 30.0, 104.86),
                    _coll(6, 0, "all_reduce", "all_reduce", 3 << 20, 30.0, 0, 32.0, 98.3),
                    _coll(7, 0, "all_reduce", "all_reduce", 3 << 20, 25.0, 0, 31.0, 101.5),
                    _coll(8, 0, "all_reduce", "all_reduce", 3 << 20, 10.0, None, 33.0, 95.3),
                    *(_coll(s, 1, "reduce_scatter", "all_reduce", 1536, 5.0, None, 10.0, 0.1536)
                      for s in (5, 6, 7, 8))]}


def test_the_merged_report_word_for_word():
    """ranks.text of a hand-made record: the first column left-aligned, the rest right; medians over the steps of a
    collective (skew (25 + 30) / 2 = 27.5, the most 4,000; time (31 + 32) / 2 = 31.5; algbw (98.3 + 101.5) / 2 =
    99.9: three digits below 100 GB/s). The straggler named is the rank whose lateness cost the others the most
    waiting: rank 1, late once by 4 ms, not rank 0, last twice by 55 µs in all (the most often last)."""
    assert ranks.text(RANKS_DATA).splitlines() == [
        "2 rank(s), nccl, NVIDIA H200; communication: NCCL kernels",
        "rank  step  step µs  GPU busy µs  compute µs  comm µs  overlapped µs  exposed µs  wait µs  collectives",
        "0        5  2,000.0      1,234.5       800.0    500.0           65.5       434.5    120.2            2",
        "1        5  2,000.0        990.0       700.0    300.0           10.0       290.0      0.0            2",
        "(overlapped: while compute ran on another thread or stream; wait: the calling thread idle until its "
        "collectives were done)",
        "",
        "each step's collectives (median over 1 step(s)):",
        "arrival: when each rank called it (c10d's op on its own thread); skew: last arrival less first; straggler: "
        "the rank that arrived last (ties within 20 µs said as ties), named by the waiting it caused",
        "time: the transfer, from the start of the last rank's run (gloo span, NCCL kernel) to its end: no waiting "
        "for a late rank, no queueing behind an earlier collective; busbw as nccl-tests counts it",
        "#                          collective      size  skew µs  max skew µs              straggler (steps)  time µs"
        "  algbw GB/s  busbw GB/s",
        "0                          all_reduce  3.00 MiB     27.5      4,000.0  rank 1 (1/4), others 2, tie 1     31.5"
        "        99.9        99.9",
        "1  reduce_scatter (ran as all_reduce)   1.5 KiB      5.0          5.0                      tie (4/4)     10.0"
        "       0.154       0.154"]
    cpu = {**RANKS_DATA, "device": "cpu", "backend": "gloo", "device_name": "NVIDIA H200", "collectives": []}
    assert ranks.text(cpu).splitlines()[:2] == [  # a CPU run on a GPU machine: the GPU's name is not the device
        "2 rank(s), gloo, CPU; communication: gloo collectives (their own thread)",
        "rank  step  step µs  CPU busy µs  compute µs  comm µs  overlapped µs  exposed µs  wait µs  collectives"]
    assert ranks.text(cpu).splitlines()[-2:] == ["", "no collectives in the active steps"]
    # a record from before step_us and wait_us: dashes, not an error
    old = {**cpu, "ranks": [{"rank": 0, "steps": [{k: v for k, v in _row(5, 1.0, 1.0, 0.0, 0.0, 0.0).items()
                                                    if k not in ("step_us", "wait_us")}]}]}
    assert ranks.text(old).splitlines()[2] == (
        "0        5        -          1.0         1.0      0.0            0.0         0.0        -            2")


def test_the_straggler_summary_at_its_edges():
    """A tie in every step; one rank last in every step; equal waiting caused: the lower rank."""
    c = lambda straggler, skew: {"straggler": straggler, "skew_us": skew}  # noqa: E731
    assert ranks.straggler_text([c(None, 5), c(None, 1)]) == "tie (2/2)"
    assert ranks.straggler_text([c(1, 50), c(1, 60)]) == "rank 1 (2/2)"
    assert ranks.straggler_text([c(1, 50), c(0, 50)]) == "rank 0 (1/2), others 1"


# ------------------------------------------------------------------- every rule of ranks.py at its edge (mutmut)

def cpu_rank(rank, world, spans, steps=((3, 0, 5000),)):
    """A CPU rank: the step spans and gloo collective spans (name, ts, dur, args) on gloo's thread."""
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}, "traceEvents": [
        *(step_span(*s) for s in steps),
        *({"ph": "X", "cat": "user_annotation", "name": n, "ts": ts, "dur": dur, "pid": 1, "tid": 2, "args": args}
          for n, ts, dur, args in spans)]}


def test_kinds_of_collective_names():
    # gloo's names carry underscores: "reduce_scatter" must not stop at its "reduce"
    assert [ranks.kind_of(n) for n in ("gloo:reduce_scatter", "gloo:all_gather", "gloo:all_reduce", "gloo:reduce",
                                       "ncclDevKernel_ReduceScatter_Sum_f32", "ncclKernel_SendRecv", "gloo:barrier")] == [
        "reduce_scatter", "all_gather", "all_reduce", "reduce", "reduce_scatter", "send_recv", "barrier"]
    # a collective this table does not know keeps its own name (lower case, no underscores); other work is None
    assert (ranks.kind_of("gloo:scatter_v"), ranks.kind_of("ncclDevKernel_Gather"), ranks.kind_of("nvjet_gemm")) == (
        "scatterv", "gather", None)


def test_dtype_names_as_the_profiler_writes_them():
    assert [coll._dtype_bytes(n) for n in ("unsigned char", "long int", "c10::Float8_e4m3fn", "torch.float8_e5m2",
                                            "Double", "Bool", "bf16")] == [1, 8, 1, 1, 8, 1, None]


def test_elements_and_sizes_at_zero_and_at_the_cap():
    assert coll._elements([0, 5]) == 0 and coll._elements([[2, 3], [0]]) == 6
    assert coll._elements([[2, 3], "x"]) is None and coll._elements([[2, 3], [-1]]) is None
    bf = {"dtype": "BFloat16"}
    assert coll._size("all_reduce", {**bf, "In msg nelems": 0, "Out msg nelems": 0}, 2) == 0
    for n_in, n_out in [(1 << 40, 8), (8, 1 << 40), (8, "8"), ("8", 8)]:  # refused: the first input's dims instead
        assert coll._size("all_reduce", {**bf, "In msg nelems": n_in, "Out msg nelems": n_out,
                                          "Input Dims": [[3]]}, 2) == 6
    assert coll._size("all_reduce", {**bf, "In msg nelems": (1 << 40) - 1, "Out msg nelems": 1}, 2) == 2 * ((1 << 40) - 1)
    # "Input type" that is no list says no dtype: no size, and no error
    assert coll._size("all_reduce", {"Input type": {"0": "float"}, "Input Dims": [[4]]}, 2) is None
    assert coll._size("all_reduce", {"Input type": "float", "Input Dims": [[4]]}, 2) is None


def test_the_size_args_are_the_kernels_own_first_then_its_ops_and_their_parents():
    from trace_reader.reading.events import Event

    def ev(name, args, parent=None):
        e = Event({"name": name, "ts": 0, "dur": 1, "args": args})
        e.parent = parent
        return e
    kernel = ev(ALL_REDUCE, {"In msg nelems": 100})
    record = ev("nccl:all_reduce", {"Input Dims": [[7]]})
    assert coll._with_size(kernel, [record]) == {"In msg nelems": 100}  # the kernel says it: its own
    plain = ev(ALL_REDUCE, {})
    inner = ev("c10d::allreduce_", {"Input Dims": [[9]]}, parent=record)  # not a size record: up to its parent
    assert coll._with_size(plain, [inner]) == {"Input Dims": [[7]]}
    assert coll._with_size(plain, [ev("aten::mm", {"x": 1})]) == {}  # nothing says it: the kernel's own args


def test_a_cpu_all_gather_counts_world_times_its_input(tmp_path):
    """gloo's all-gather span: input 2 x 8 floats, so 64 B in and 3 x 64 out (nccl-tests counts the output); the
    spans written out of time order are still paired in time order (rank 1's first span is its all-gather)."""
    ag = ("gloo:all_gather", 100, 50, {"Input Dims": [[2, 8]], "Input type": ["float"]})
    ar = ("gloo:all_reduce", 300, 50, {"Input Dims": [[4]], "Input type": ["float"]})
    datas = [cpu_rank(0, 3, [ag, ar]), cpu_rank(1, 3, [ar, ag]), cpu_rank(2, 3, [ag, ar])]
    data = merged(tmp_path, datas)
    assert [(c["kind"], c["bytes"], c["name"], c["step"], c["index"]) for c in data["collectives"]] == [
        ("all_gather", 3 * 64, "gloo:all_gather", 3, 0), ("all_reduce", 16, "gloo:all_reduce", 3, 1)]
    assert [r["trace"] for r in data["ranks"]] == [str(tmp_path / f"run_rank{r}.json") for r in range(3)]
    # lanes over two steps: both steps' spans and ops, on the trace's own clock (no base time: offset 0)
    two = [cpu_rank(r, 2, [ag, ("gloo:all_gather", 5100, 50, ag[3])], steps=((3, 0, 5000), (4, 5000, 5000)))
           for r in range(2)]
    for d in two:
        d["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": 20, "pid": 1, "tid": 1}
                             for ts in (200, 5200)]
    data = ranks.lanes(ranks.load_run(write(tmp_path, two, stem="lanes")))
    assert [r["comm"] for r in data["ranks"]] == [[(0.0, 50.0), (5000.0, 5050.0)]] * 2
    assert [r["compute"] for r in data["ranks"]] == [[(100.0, 120.0), (5100.0, 5120.0)]] * 2
    # and an all-gather sized from its dims counted per step as 08 expects it
    t = it.parse_trace(two[0])
    assert ranks.collectives_per_step("all_gather", 2, 2).check(t) == "all_gather per step: [1, 1]"


def test_lanes_of_ranks_with_no_work():
    t = [it.parse_trace(gpu_rank(r, 2, [])) for r in range(2)]
    assert ranks.lanes(t)["ranks"] == [{"rank": 0, "compute": [], "comm": []}, {"rank": 1, "compute": [], "comm": []}]


def test_lanes_of_a_one_rank_run():
    """torchrun --nproc-per-node 1: one lane, its device and name from its own trace."""
    d = gpu_rank(0, 1, [gpu("gemm", 10, 20), nccl(40, 5)])
    d["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}]
    data = ranks.lanes([it.parse_trace(d)])
    assert (data["device"], data["device_name"]) == ("cuda", "NVIDIA H200")
    assert data["ranks"] == [{"rank": 0, "compute": [(0.0, 20.0)], "comm": [(30.0, 35.0)]}]


def test_run_info_at_its_limits(tmp_path, capsys):
    refused(tmp_path, capsys, [gpu_rank(0, 2, []), gpu_rank(2, 2, [])], "no usable distributedInfo")  # rank = world
    t = it.parse_trace(gpu_rank(0, ranks.MAX_RANKS, []))
    assert ranks._info(t)["world_size"] == ranks.MAX_RANKS
    with pytest.raises(it.TraceError, match="no usable distributedInfo"):
        ranks._info(it.parse_trace(gpu_rank(0, ranks.MAX_RANKS + 1, [])))


def test_the_clock_offset_at_its_limits():
    at = lambda base: ranks._offset(it.parse_trace(gpu_rank(0, 1, [], base=base)))  # noqa: E731
    assert (at(0), at(2000), at((1 << 63) - 1000), at(1 << 63), at(-5), at(None), at(1.5e18)) == (
        0.0, 2.0, ((1 << 63) - 1000) / 1e3, 0.0, 0.0, 0.0, 0.0)


def test_bandwidth_at_its_edges():
    assert ranks.bandwidth("all_reduce", None, 5.0, 2) == (None, None)
    assert ranks.bandwidth("all_reduce", 1000, 0.0, 2) == (None, None)
    assert ranks.bandwidth("all_reduce", 1000, 0.5, 2) == (2.0, 2.0)  # 1000 B / 0.5 µs = 2 GB/s, x 2(2-1)/2
    assert ranks.bandwidth("barrier", 8, 1.0, 2) == (0.008, None)  # no bus factor: no busbw


def test_numbers_as_the_report_writes_them():
    assert [ranks._gbs(x) for x in (None, 1.2345, 99.94, 100, 100.5, 1234.56)] == [
        "-", "1.23", "99.9", "100.0", "100.5", "1,234.6"]
    assert ranks._median([None, None]) is None and ranks._median([None, 3, 1]) == 2


def test_one_run_from_files_and_folders(tmp_path, monkeypatch):
    one, folder = tmp_path / "one", tmp_path / "run"
    one.mkdir()
    folder.mkdir()
    (a,) = write(one, [gpu_rank(0, 2, [])])
    b0, b1 = write(folder, [gpu_rank(0, 2, []), gpu_rank(1, 2, [])])
    (folder / "x_rank0.json").mkdir()  # a folder with a trace's name is not a trace
    (folder / "notes.txt").write_text("x")
    assert ranks.run_files([a, folder]) == [a, b0, b1]  # a file, then a folder's run: both kept
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "plain.json").write_text("{}")
    with pytest.raises(it.TraceError) as e:
        ranks.run_files([empty])
    assert str(e.value) == (f"{empty}: a folder is read as one distributed run's rank traces (<run>_rank<N>.json, "
                            "08_tensor_parallel.py's), and it holds 1 trace(s) (plain.json), none a rank's; name a "
                            "trace file instead")
    (empty / "plain.json").unlink()
    with pytest.raises(it.TraceError) as e:
        ranks.run_files([empty])
    assert str(e.value).endswith("and it holds no .json or .json.gz trace; name a trace file instead")
    (empty / "plain.json").write_text("{}")
    write(folder, [gpu_rank(0, 2, [])], stem="another")
    with pytest.raises(it.TraceError) as e:
        ranks.run_files([folder])
    assert str(e.value) == f"{folder}: 2 runs (another.json, ...) in this folder; name one run's rank files"
    monkeypatch.setattr(ranks, "MAX_RANKS", 2)
    assert ranks.run_files([b0, b1]) == [b0, b1]  # exactly the cap
    for paths in ([a, b0, b1], [one, tmp_path / "run" / "run_rank0.json", folder / "run_rank1.json", a]):
        with pytest.raises(it.TraceError, match="more than 2 trace files"):
            ranks.run_files(paths)
    two = tmp_path / "two"
    two.mkdir()
    write(two, [gpu_rank(0, 2, []), gpu_rank(1, 2, [])])
    with pytest.raises(it.TraceError, match="more than 2 trace files"):  # the cap reached by a folder, then a file
        ranks.run_files([two, a])
    big = tmp_path / "big"
    big.mkdir()
    write(big, [gpu_rank(r, 3, []) for r in range(3)])
    with pytest.raises(it.TraceError, match="more than 2 trace files"):
        ranks.run_files([big])


def test_load_run_says_what_is_missing_and_caps_each_rank(tmp_path, monkeypatch):
    with pytest.raises(it.TraceError) as e:
        ranks.load_run([])
    assert str(e.value) == "no trace files given"
    paths = write(tmp_path, two_gpu_ranks())
    size = max(p.stat().st_size for p in paths)
    monkeypatch.setattr(ranks, "MAX_RUN_BYTES", 2 * size)  # each rank's share: exactly its size
    assert len(ranks.load_run(paths)) == 2
    monkeypatch.setattr(ranks, "MAX_RUN_BYTES", 2 * size - 2)  # one byte less each: the biggest is refused
    with pytest.raises(it.TraceError):
        ranks.load_run(paths)


def test_two_ranks_needs_one_world_size():
    t = lambda rank, world: it.parse_trace(gpu_rank(rank, world, []))  # noqa: E731
    assert ranks.two_ranks([t(0, 2), t(1, 2)]) is True
    assert ranks.two_ranks([t(0, 2), t(1, 4)]) is False and ranks.two_ranks([t(0, 2), t(0, 2)]) is False


def test_not_one_run_word_for_word(tmp_path):
    def refuse(datas):
        ts = [it.parse_trace(d) for d in datas]
        for t, p in zip(ts, ("a.json", "b.json", "c.json")):
            t.path = p
        with pytest.raises(it.TraceError) as e:
            ranks.join(ts)
        return str(e.value)
    assert refuse([gpu_rank(0, 2, []), gpu_rank(1, 2, [], backend="gloo")]) == (
        "b.json: not the same run as a.json (world size 2 gloo against 2 nccl)")
    assert refuse([gpu_rank(0, 2, [nccl(0, 10)]), gpu_rank(1, 2, [])]) == (  # no GPU work: a CPU trace
        "b.json: a cpu trace, but a.json is cuda: not one run")
    assert refuse([gpu_rank(0, 12, []), gpu_rank(11, 12, [])]) == (
        "rank(s) 1, 2, 3, 4, 5, 6, 7, 8 missing: a run of 12 ranks needs every rank's trace")
    ten = tuple((n, 10 * n, 5) for n in range(11))
    assert refuse([gpu_rank(0, 2, [], steps=ten[:10]), gpu_rank(1, 2, [], steps=ten[1:])]) == (
        "b.json: steps [1, 2, 3, 4, 5, 6, 7, 8] against [0, 1, 2, 3, 4, 5, 6, 7] in a.json: not the same run")


def test_different_collectives_word_for_word(tmp_path):
    """Rank 1 of three ran something else: the message names rank 1, and at most 6 collectives of each."""
    seven = [nccl(10 * i, 5) for i in range(7)]
    other = [gpu("ncclDevKernel_AllGather_RING_LL", 10 * i, 5) for i in range(7)]
    datas = [gpu_rank(0, 3, seven), gpu_rank(1, 3, other), gpu_rank(2, 3, seven)]
    with pytest.raises(it.TraceError) as e:
        ranks.analyze([it.parse_trace(d) for d in datas])
    assert str(e.value) == (f"step 2: rank 0 ran {['all_reduce'] * 6} but rank 1 {['all_gather'] * 6}: "
                            "not the same collectives, so not one run")


def test_collectives_per_step_counts_one_kind_on_either_device():
    ar2 = gpu_rank(0, 2, [nccl(10, 5), gpu("ncclDevKernel_AllGather_RING_LL", 20, 5), nccl(30, 5),
                          nccl(1010, 5), nccl(1030, 5)], steps=((2, 0, 1000), (3, 1000, 1000)))
    t = it.parse_trace(ar2)
    assert ranks.collectives_per_step("all_reduce", 2, 2).check(t) is True
    assert ranks.collectives_per_step("all_gather", 1, 2).check(t) == "all_gather per step: [1, 0]"
    assert ranks.collectives_per_step("all_reduce", 3, 2).check(t) == "all_reduce per step: [2, 2]"
    assert ranks.collectives_per_step("all_reduce", 2, 2).text == "2 all_reduce per step"
    one = ranks.collectives_per_step("all_reduce", 0, 1).check(t)
    assert isinstance(one, it.NotApplicable) and one == "one rank: there is nothing to exchange"
    # on a CPU: gloo's spans, never a GPU kernel's name
    cpu = it.parse_trace(cpu_rank(0, 2, [("gloo:all_reduce", 100, 50, {}), ("gloo:all_reduce", 300, 50, {})]))
    assert ranks.collectives_per_step("all_reduce", 2, 2).check(cpu) is True


def test_gpu_only_expectations_say_so_on_a_cpu():
    from trace_reader.expectation import check
    cpu = it.parse_trace(cpu_rank(0, 2, [("gloo:all_reduce", 100, 50, {})]))
    got = check(cpu, [ranks.gemms_per_step(3), ranks.communication_exposed(0.5), ranks.communication_overlapped(0.5)])
    assert [r[1] for r in got] == ["not applicable"] * 3


def test_exposed_shares_of_short_kernels_and_of_traces_without_a_run():
    # a 0.5 µs all-reduce with nothing beside it: all of it exposed
    t = it.parse_trace(gpu_rank(0, 2, [gpu("gemm", 0, 10), nccl(20, 0.5)]))
    assert ranks._exposed_shares(t) == [1.0]
    plain = gpu_rank(0, 2, [nccl(20, 5)])
    del plain["distributedInfo"]
    shares = ranks._exposed_shares(it.parse_trace(plain))
    assert isinstance(shares, it.NotApplicable) and shares == "one rank: no communication to hide"
    # an all-gather sized from its record function's dims (world x input) on a GPU: still read
    ag = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": [
        step_span(2, 0, 1000),
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_gather", "ts": 10, "dur": 50, "pid": 1, "tid": 1,
         "args": {"Input Dims": [[4]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 5, "pid": 1, "tid": 1,
         "args": {"correlation": 1}},
        {**gpu("ncclDevKernel_AllGather_RING_LL", 100, 40), "args": {"correlation": 1}}]}
    assert ranks._exposed_shares(it.parse_trace(ag)) == [1.0]


def test_expect_08_reads_its_flags_and_device_from_the_trace(tmp_path):
    """--expect 08_tensor_parallel on a rank's trace: sequence parallel and chunks from 08's file name, the ranks from
    distributedInfo, and the device from the trace (gloo has no reduce-scatter: a CPU run all-reduces)."""
    def said(data, stem):
        (path,) = write(tmp_path, [data], stem=stem)
        exps, line = it.expectations_for("08_tensor_parallel", it.load_trace(path))
        return [e.text for e in exps], line
    cpu_texts, line = said(cpu_rank(0, 2, [("gloo:all_reduce", 100, 50, {})]), "2x32x64x256_fp32_cold_tp2_sp_chunks2_eager")
    assert line == "08_tensor_parallel eager, TP=2, sequence parallel, MLP eager, 2 chunks, 1 steps (read from the trace)"
    assert "1 all_reduce per step" in cpu_texts and "1 reduce_scatter per step" not in cpu_texts
    gpu_texts, line = said(gpu_rank(0, 2, [nccl(10, 5)]), "2x32x64x256_bf16_cold_tp2_sp_eager")
    assert line == "08_tensor_parallel eager, TP=2, sequence parallel, MLP eager, 1 steps (read from the trace)"
    assert "1 reduce_scatter per step" in gpu_texts and "1 all_reduce per step" not in gpu_texts
    _, line = said(gpu_rank(0, 2, [nccl(10, 5)]), "2x32x64x256_bf16_cold_tp2_chunks1_eager")
    assert line == "08_tensor_parallel eager, TP=2, MLP eager, 1 steps (read from the trace)"


def test_expect_names_the_scripts_it_knows():
    with pytest.raises(it.TraceError) as e:
        it.expectations_for("09_nope", it.parse_trace(gpu_rank(0, 1, [])))
    assert str(e.value) == ("--expect: unknown script '09_nope'; one of 01_matmul_add, 02_linear, 03_simple_mlp, "
                            "03_kernels_mlp, 04_fused_mlp, 06_model, 07_train_step, 08_tensor_parallel, 09_data_parallel")


def test_a_one_rank_run_says_the_collectives_its_code_called():
    """The committed TP1 trace (08 with --chunks 4 on one H200): no NCCL kernel runs in a group of one rank, but the
    code called its 4 all-reduces a step. By hand from the raw trace: c10d's record_param_comms spans named
    allreduce, per ProfilerStep."""
    import gzip
    from pathlib import Path

    path = Path(__file__).parent / "data" / "tp" / "h200_tp1_64x128x768x3072_chunks4_eager_rank0.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    calls = [e for e in events if e.get("name") == "record_param_comms"
             and e.get("args", {}).get("Collective name") == "allreduce"]
    per_step = {s["name"]: sum(s["ts"] <= c["ts"] <= s["ts"] + s["dur"] for c in calls) for s in steps}
    assert set(per_step.values()) == {4}
    data = ranks.analyze(ranks.load_run([path]))
    assert [s["collectives"] for s in data["ranks"][0]["steps"]] == [0] * len(steps)
    assert [s["called"] for s in data["ranks"][0]["steps"]] == [4] * len(steps)
    assert ranks.text(data).endswith("no collectives in the active steps, though the code called up to 4 a step "
                                     "(c10d's ops): a group of one rank exchanges nothing, so none launched a kernel")


# ------------------------------------------------------------------- calls: arrival, queueing, transfer, kinds

def op(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def ar_call(ts, n, name="c10d::allreduce_"):
    """DDP's call of a bucket's all-reduce, as torch records it: a tensor list of n floats, then the other args."""
    return op(name, ts, 20, **{"Input Dims": [[[n]], [], [], [], [], []],
                               "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})


def gloo(name, ts, dur, n, tid=2):
    return op(name, ts, dur, tid=tid, cat="user_annotation", **{"Input Dims": [[n]], "Input type": ["float"]})


def cpu_run(rank, events, world=2, steps=((3, 0, 10000),)):
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
            "traceEvents": [*(step_span(*s) for s in steps), *events]}


def test_arrival_is_the_call_and_the_time_is_the_transfer(tmp_path):
    """Two buckets (4 and 8 floats). Rank 0 calls them at 100 and 200; its gloo thread starts the first at 110, and
    the second only at 2600 (queued behind the first, which waits for rank 1 until 2500). Rank 1 calls at 2000 and
    2050 and its spans run 2010-2500 and 2600-2900. Arrivals are the calls: rank 1 is last by 1,900 and 1,850 µs
    (by span starts it would be 1,900 and 0: a tie on the second). Each time is the span of the rank that started
    last (rank 1's 2010-2500, then either 2600-2900): 490 and 300; rank 0's second bucket queued 2,400 µs."""
    r0 = cpu_run(0, [ar_call(100, 4), ar_call(200, 8), gloo("gloo:all_reduce", 110, 2390, 4),
                     gloo("gloo:all_reduce", 2600, 300, 8)])
    r1 = cpu_run(1, [ar_call(2000, 4), ar_call(2050, 8), gloo("gloo:all_reduce", 2010, 490, 4, tid=3),
                     gloo("gloo:all_reduce", 2600, 300, 8, tid=3)])
    a, b = merged(tmp_path, [r0, r1])["collectives"]
    assert (a["arrival_of"], a["call"], a["arrival_us"], a["straggler"], a["time_us"]) == (
        "call", "c10d::allreduce_", [0, 1900], 1, 490)
    assert (b["arrival_us"], b["skew_us"], b["straggler"], b["time_us"], b["queued_us"]) == (
        [0, 1850], 1850, 1, 300, [2400, 550])
    assert (a["started_us"], a["waited_us"], a["bytes"], b["bytes"]) == ([10, 1910], [1900, 0], 16, 32)


def test_calls_pair_with_their_gloo_spans_in_order_by_kind_and_size(tmp_path):
    """gloo's queue is first in, first out: each call takes the first free span after it that can run it (its
    kind, one of its tensors' size). A reduce-scatter (c10d::_reduce_scatter_base_: output 4, input 8 floats) runs
    as a gloo:all_reduce of its input; a span of another size is no call's, and counts from its own start."""
    rs = op("c10d::_reduce_scatter_base_", 100, 20, **{"Input Dims": [[4], [8], [], [], [], []],
                                                       "Input type": ["float", "float", "", "", "Scalar", "Scalar"]})
    events = [rs, ar_call(300, 16), gloo("gloo:all_reduce", 150, 100, 8), gloo("gloo:all_reduce", 320, 50, 99),
              gloo("gloo:all_reduce", 400, 60, 16)]
    t = it.parse_trace(cpu_run(0, events, world=1))
    calls = collectives.step_calls(t.steps[0], gpu=False)
    assert [(c.kind, c.ran_as, c.start, c.done) for c in calls] == [
        ("reduce_scatter", "all_reduce", 150, 250), ("all_reduce", "all_reduce", 400, 460)]
    data = ranks.analyze([t])
    assert [(c["kind"], c["ran_as"], c["call"], c["bytes"], c["arrival_of"]) for c in data["collectives"]] == [
        ("reduce_scatter", "all_reduce", "c10d::_reduce_scatter_base_", 32, "call"),
        ("all_reduce", "all_reduce", "c10d::allreduce_", 64, "call"),  # in call order, then the stray span of 99
        ("all_reduce", "all_reduce", None, 396, "start")]               # floats, by its start (320 > the call's 300)
    # what 08 counts on a CPU: the reduce-scatter is one, and one all-reduce more ran as such
    assert ranks.collectives_per_step("reduce_scatter", 1, 2).check(t) is True
    assert ranks.collectives_per_step("all_reduce", 3, 2).check(t) is True


def test_a_span_that_began_before_the_call_is_not_its_run():
    """gloo cannot start what was not called yet: a span of the call's kind and size at 90, before the call at 100,
    is another's (a call the trace lost); the call's run is its span at 120."""
    events = [gloo("gloo:all_reduce", 90, 5, 4), ar_call(100, 4), gloo("gloo:all_reduce", 120, 50, 4)]
    (c,) = collectives.step_calls(it.parse_trace(cpu_run(0, events, world=1)).steps[0], gpu=False)
    assert (c.start, c.done) == (120, 170)


def test_the_arrival_on_a_gpu_is_the_call_that_launched_the_kernel(tmp_path):
    """NCCL: c10d::allreduce_ > record_param_comms > nccl:all_reduce > cudaLaunchKernel > the kernel. Rank 0 calls
    at 100 but its kernel starts at 300 (its stream busy); rank 1 calls at 200 and its kernel starts at 250. By the
    call rank 1 is the straggler; the time is rank 0's kernel (it started last), 300-700."""
    def rank(r, call, start, dur):
        return gpu_rank(r, 2, [
            op("c10d::allreduce_", call, 30, **{"External id": 1}),
            op("record_param_comms", call + 2, 25, **{"Collective name": "allreduce", "In msg nelems": 1024,
                                                     "Out msg nelems": 1024, "dtype": "Float", "External id": 2}),
            op("nccl:all_reduce", call + 4, 20, cat="user_annotation"),
            op("cudaLaunchKernel", call + 6, 5, cat="cuda_runtime", correlation=9),
            {**nccl(start, dur), "args": {"correlation": 9}}])
    (c,) = merged(tmp_path, [rank(0, 100, 300, 400), rank(1, 200, 250, 500)])["collectives"]
    assert (c["arrival_of"], c["call"], c["arrival_us"], c["straggler"]) == ("call", "c10d::allreduce_", [0, 100], 1)
    assert (c["transfer_rank"], c["time_us"], c["bytes"], c["started_us"]) == (0, 400, 4096, [200, 150])


def test_ties_within_tie_us(tmp_path):
    """Calls 20 µs apart are a tie (straggler None, tied [0, 1]); 21 µs apart, the later one is the straggler."""
    def pair(gap):
        return [cpu_run(0, [ar_call(100, 4), gloo("gloo:all_reduce", 110, 500, 4)]),
                cpu_run(1, [ar_call(100 + gap, 4), gloo("gloo:all_reduce", 110 + gap, 400, 4)])]
    (c,) = merged(tmp_path, pair(20))["collectives"]
    assert (c["straggler"], c["tied"], c["skew_us"]) == (None, [0, 1], 20)
    (c,) = merged(tmp_path, pair(21))["collectives"]
    assert (c["straggler"], c["tied"]) == (1, [])


# ------------------------------------------------------------------- the step's own time: cut, overlap, wait

def test_spans_are_cut_to_the_step_and_to_the_optimizers_start(tmp_path):
    """A step 0-5000: the bucket's gloo span 1000-7000 as written (its thread wrote the end late), the optimizer's
    step 3000-4000 on the main thread with an aten::add_ 3100-3900 in it, an aten::mm 500-1500 before, and on a
    third thread an aten::mul 4500-6000 that runs past the step. The span counts until the optimizer starts (it
    reads the all-reduced gradients): 1000-3000, its time 2,000 µs; the mm overlaps 500 of it, the add_ none. The
    mul counts until the step's end: compute 1000 + 800 + 500. Busy 500-3000, 3100-3900, 4500-5000: 3,800 µs, under
    the step's 5,000. The main thread ran no op from the mm's end to the optimizer's start: its wait, 1500-3000."""
    events = [ar_call(1000, 4), gloo("gloo:all_reduce", 1000, 6000, 4), op("aten::mm", 500, 1000),
              op("Optimizer.step#AdamW.step", 3000, 1000, cat="user_annotation"), op("aten::add_", 3100, 800),
              op("aten::mul", 4500, 1500, tid=3)]
    data = merged(tmp_path, [cpu_run(0, events, world=1, steps=((3, 0, 5000),))])
    (row,), (c,) = data["ranks"][0]["steps"], data["collectives"]
    assert (row["comm_us"], row["overlapped_us"], row["exposed_us"], row["compute_us"]) == (2000, 500, 1500, 2300)
    assert (row["busy_us"], row["step_us"], row["wait_us"], c["time_us"]) == (3800, 5000, 1500, 2000)
    # without the optimizer, the span is cut at the step's end: 1000-5000, of which the mm hides 500, the add_ 800
    # and the mul (another thread than gloo's) 500
    events[3] = op("something", 3000, 1000, cat="user_annotation")
    data = merged(tmp_path, [cpu_run(0, events, world=1, steps=((3, 0, 5000),))])
    (row,), (c,) = data["ranks"][0]["steps"], data["collectives"]
    assert (row["comm_us"], row["overlapped_us"], row["busy_us"], c["time_us"]) == (4000, 1800, 4500, 4000)


def test_overlap_is_compute_on_another_thread_only(tmp_path):
    """gloo's own ops do not hide its communication. Span A 1000-2000 on gloo thread 2 with gloo's aten::div_
    1500-1900 inside it; span B 1800-2600 on gloo thread 3 with an aten::copy_ 1850-1950 inside it (another
    thread, but B's own work); an aten::mul_ 2200-2400 on thread 2 after A, while B runs (compute on another
    thread than B: hides 200 of B). The main thread's aten::mm 900-1100 hides 100 of A. Overlapped 300."""
    events = [gloo("gloo:all_reduce", 1000, 1000, 4), op("aten::div_", 1500, 400, tid=2),
              gloo("gloo:all_reduce", 1800, 800, 4, tid=3), op("aten::copy_", 1850, 100, tid=3),
              op("aten::mul_", 2200, 200, tid=2), op("aten::mm", 900, 200)]
    (row,) = merged(tmp_path, [cpu_run(0, events, world=1)])["ranks"][0]["steps"]
    assert (row["comm_us"], row["overlapped_us"], row["compute_us"]) == (1600, 300, 400)
    # an op of gloo's thread that is not inside its span (written half over it) is still on that thread: not
    # compute that hides it
    events = [gloo("gloo:all_reduce", 1000, 1000, 4), op("aten::mul_", 1800, 400, tid=2)]
    (row,) = merged(tmp_path, [cpu_run(0, events, world=1)])["ranks"][0]["steps"]
    assert (row["overlapped_us"], row["compute_us"]) == (0, 400)


def test_waits_go_to_the_earliest_call_in_flight():
    """Calls 100-120 and 150-170; their spans end at 1000 and 1500; ops 200-240, 270-300 and 300-400, so the thread
    is idle 120-150, 170-200 and 240-270 (30 µs each: the interpreter, under MIN_WAIT_US, no wait), then 400-1500.
    The first call waits 400-1000 (its span ends then), the second 1000-1500."""
    events = [ar_call(100, 4), ar_call(150, 8), op("aten::mm", 200, 40), op("aten::mm", 270, 30),
              op("aten::mm", 300, 100), gloo("gloo:all_reduce", 110, 890, 4), gloo("gloo:all_reduce", 1000, 500, 8)]
    t = it.parse_trace(cpu_run(0, events, world=1))
    a, b = collectives.step_calls(t.steps[0], gpu=False)
    assert a.waits == [(400, 1000)] and b.waits == [(1000, 1500)]
    assert (a.waited_us, b.waited_us, a.thread, a.name, b.done) == (600, 500, (1, 1), "c10d::allreduce_", 1500)


def test_a_wait_op_is_waiting():
    """TP's and DTensor's collectives are waited for in _c10d_functional::wait_tensor: the thread is inside an op,
    but the op only waits. Call 100-120, its span 110-900; an aten::mm 120-300; wait_tensor 300-900 (with a child
    op inside it, also waiting): the call waits 300-900."""
    events = [op("_c10d_functional::all_reduce", 90, 40), ar_call(100, 4), op("aten::mm", 120, 180),
              op("_c10d_functional::wait_tensor", 300, 600), op("aten::detach", 310, 5),
              gloo("gloo:all_reduce", 110, 790, 4)]
    (c,) = collectives.step_calls(it.parse_trace(cpu_run(0, events, world=1)).steps[0], gpu=False)
    assert (c.name, c.ts, c.waits) == ("_c10d_functional::all_reduce", 90, [(300, 900)])

