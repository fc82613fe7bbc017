"""Several ranks of one distributed run, read together: where each rank's time went, and its collectives.

Each rank of a torch.distributed run writes its own trace; the profiler stamps it with "distributedInfo" (backend,
rank, world_size, its process groups). load_run() reads the traces of one run (files, or a folder holding one run)
and refuses in one line what is not one run: a trace without distributedInfo, ranks of runs of different sizes,
a rank twice, a rank missing, different steps, process groups that disagree, one process written as two ranks, and
ranks whose collectives did not run together (rank 0 of one run beside rank 1 of another, recorded a minute
apart: on a CPU every trace carries the same baseTimeNanoseconds, so that cannot tell two runs apart; the times
of their collectives can: see _ran_together).
analyze() then gives, per rank and step (collectives.py finds each rank's calls and what ran them):
- busy: time with work on the device (GPU kernels; on a CPU the ops that compute, kernels.cpu_kernels, on every
  thread), compute and communication each as a union of intervals, all cut to the step (a gloo span whose end was
  written after the step ends with it);
- communication: NCCL kernels on a GPU, gloo's collective spans ("gloo:all_reduce", on gloo's own threads) on a
  CPU; overlapped = the part of it during which compute ran on another thread or stream, exposed = the rest;
  wait = the time the threads that called collectives sat idle until they were done (DDP's backward waiting for
  its buckets; CPU runs: on a GPU the host does not wait, the streams do);
and per collective (the i-th of each step is the same call on every rank, as in any SPMD program):
- arrival: when each rank called it (c10d's op on the rank's own thread; with no call in the trace, when it began
  running); the skew: how much later the last rank arrived than the first; that last rank is the straggler, unless
  another arrived within TIE_US of it (a tie, said as one);
- its size, as nccl-tests counts it (the all-reduce's buffer, the all-gather's output, the reduce-scatter's input),
  algbw = size / time and busbw = algbw x the bus factor of what ran (all-reduce 2(n-1)/n, all-gather and
  reduce-scatter (n-1)/n). The time is the transfer: from the moment the last rank's run began (its gloo span or
  NCCL kernel: by then every rank was in it) to that run's end, so neither the wait for a late rank nor the queue
  behind an earlier collective on gloo's thread is in it.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from ..expectation import Expect, NotApplicable, need_steps
from ..facts import intervals
from ..facts.kernels import is_gemm, splitk_reduces
from ..facts.schema import SCHEMA_VERSION
from ..reading.events import Trace, TraceError
from ..reading.files import MAX_JSON_BYTES, load_trace
from .collectives import Collective, backend_of, blocked, collectives, kind_of, overlapped, step_work, window, work

MAX_RANKS = 1024  # files in one run: more is not a run this reader was made for
MAX_RUN_BYTES = 4 << 30  # JSON text of all the ranks together: each rank's own cap is its share of this
RANK_IN_NAME = re.compile(r"_rank\d+(?=\.json(?:\.gz)?$)")
# nccl-tests' bus factors (PERFORMANCE.md): busbw = algbw x factor(n), the bandwidth each link must carry.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}
# Arrivals closer than this are a tie: a c10d call itself takes 6-36 µs on the CPU of the committed traces
# (tests/data/dist), so which of two ranks got there first within it is chance, and no rank waited for the other
# longer than the call took.
TIE_US = 20.0
# Collectives that end on no rank before every rank has begun them: each needs every rank's data. (A broadcast's
# root, a reduce's senders, a send can be done before a peer has started.)
SYMMETRIC = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"}
# How far apart two ranks' clocks may read. Traces that name one host (host_name) read one clock; hosts' clocks
# agree within milliseconds (NTP), and two launches of a program are seconds apart (python, import torch,
# init_process_group), so a second tells one run from two.
SAME_HOST_SLACK_US = 1e3
SLACK_US = 1e6
# Steps with no collective in them do not hold the ranks together; still, one run's ranks do not drift a minute.
NO_COLLECTIVE_SLACK_US = 6e7


def _info(t: Trace) -> dict:
    info = t.meta.get("distributedInfo")
    if not (isinstance(info, dict) and type(info.get("rank")) is int and type(info.get("world_size")) is int
            and 0 <= info["rank"] < info["world_size"] <= MAX_RANKS):
        raise TraceError(f"{t.path}: not a rank of a distributed run (no usable distributedInfo: rank, world_size)")
    return info


def tp_flags(a, trace: Trace, words: list[str]) -> None:
    """08_tensor_parallel.py's flags, set on `a` from the trace first, then the name 08 gives its files
    (64x128x768x3072_bf16_cold_tp2[_sp][_fused][_chunksC]_eager_rank0): the ranks from distributedInfo, --mlp fused
    from the fused kernel, --sequence-parallel from an all-gather in the steps, --chunks from the name (else 1)."""
    a.world = _info(trace)["world_size"]
    names = {k.name for st in trace.steps for k in st.kernels} | {e.name for st in trace.steps for e in st.spans}
    a.mlp = "fused" if "fused" in words or any(n.startswith("_geglu_") for n in names) else "eager"
    a.sequence_parallel = "sp" in words or any(kind_of(n) == "all_gather" for n in names)
    a.chunks = next((int(w[len("chunks"):]) for w in words if re.fullmatch(r"chunks[1-9]\d{0,3}", w)), 1)


def run_files(paths: list[str | Path]) -> list[Path]:
    """The trace files named, a folder standing for the one run it holds (files differing only in _rank<N>)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            files.append(p)
            continue
        found = sorted(f for f in p.iterdir() if f.is_file() and re.search(r"\.json(\.gz)?$", f.name))
        runs = sorted({RANK_IN_NAME.sub("", f.name) for f in found if RANK_IN_NAME.search(f.name)})
        if not runs:
            holds = (f"{len(found)} trace(s) ({found[0].name}{', ...' if len(found) > 1 else ''}), none a rank's"
                     if found else "no .json or .json.gz trace")
            raise TraceError(f"{p}: a folder is read as one distributed run's rank traces (<run>_rank<N>.json, "
                             f"08_tensor_parallel.py's), and it holds {holds}; name a trace file instead")
        if len(runs) != 1:
            raise TraceError(f"{p}: {len(runs)} runs ({runs[0]}, ...) in this folder; name one run's rank files")
        files += [f for f in found if RANK_IN_NAME.sub("", f.name) == runs[0]]
        if len(files) > MAX_RANKS:
            break
    if len(files) > MAX_RANKS:
        raise TraceError(f"more than {MAX_RANKS} trace files: not one run this reader can read")
    return files


def load_run(paths: list[str | Path]) -> list[Trace]:
    """Every rank's trace of one run, in rank order; one line (TraceError) for anything that is not one run."""
    files = run_files(paths)
    if not files:
        raise TraceError("no trace files given")
    cap = min(MAX_JSON_BYTES, MAX_RUN_BYTES // len(files))
    return join([load_trace(f, max_bytes=cap) for f in files])


def two_ranks(traces: list[Trace]) -> bool:
    """Two traces that say they are different ranks of a run of the same size: read together, not compared."""
    infos = [t.meta.get("distributedInfo") for t in traces]
    if not all(isinstance(i, dict) for i in infos):
        _named_as_ranks(traces, infos)
        return False
    ranks_, worlds = [i.get("rank") for i in infos], [i.get("world_size") for i in infos]
    return len(set(map(repr, ranks_))) == len(traces) and len(set(map(repr, worlds))) == 1


def _named_as_ranks(traces: list[Trace], infos: list) -> None:
    """Two files named as two ranks of one run (<run>_rank0.json, <run>_rank1.json), one of them without
    distributedInfo: neither a run to merge nor, silently, two runs to compare; one line (TraceError)."""
    names = [Path(str(t.path)).name for t in traces]
    if not all(RANK_IN_NAME.search(n) for n in names) or len({RANK_IN_NAME.sub("", n) for n in names}) != 1 \
            or len(set(names)) != len(names) or all(not isinstance(i, dict) for i in infos):
        return
    bare = next(t for t, i in zip(traces, infos) if not isinstance(i, dict))
    raise TraceError(f"{bare.path}: named as a rank of the same run as the other trace, but it holds no "
                     "distributedInfo (rank, world_size), so the two cannot be merged; to compare them anyway, "
                     "rename one")


def join(traces: list[Trace]) -> list[Trace]:
    """The traces of one run in rank order; one line (TraceError) for what is not one run: ranks of runs of
    different sizes, backends or devices, a rank twice, a rank missing, different steps, steps hours apart on the
    shared clock, process groups that disagree, one process as two ranks, collectives that did not run together."""
    by_rank: dict[int, Trace] = {}
    first = _info(traces[0])
    for t in traces:
        info = _info(t)
        if (info["world_size"], info.get("backend")) != (first["world_size"], first.get("backend")):
            raise TraceError(f"{t.path}: not the same run as {traces[0].path} (world size {info['world_size']} "
                             f"{info.get('backend')} against {first['world_size']} {first.get('backend')})")
        if t.device != traces[0].device:
            raise TraceError(f"{t.path}: a {t.device} trace, but {traces[0].path} is {traces[0].device}: not one run")
        if info["rank"] in by_rank:
            raise TraceError(f"rank {info['rank']} twice: {by_rank[info['rank']].path} and {t.path}")
        by_rank[info["rank"]] = t
    missing = sorted(set(range(first["world_size"])) - set(by_rank))
    if missing:
        raise TraceError(f"rank(s) {', '.join(map(str, missing[:8]))} missing: a run of {first['world_size']} "
                         "ranks needs every rank's trace")
    numbers = [st.number for st in traces[0].steps]
    for t in traces:
        if [st.number for st in t.steps] != numbers:
            raise TraceError(f"{t.path}: steps {[st.number for st in t.steps][:8]} against {numbers[:8]} in "
                             f"{traces[0].path}: not the same run")
    ordered = [by_rank[r] for r in range(first["world_size"])]
    starts = [(t.steps[0].span.ts + _offset(t), r) for r, t in enumerate(ordered) if t.steps]
    (early, r0), (late, r1) = min(starts, default=(0, 0)), max(starts, default=(0, 0))
    if late - early > MAX_SKEW_US:  # a base time of 0, or one missing beside the others': decades apart
        raise TraceError(f"rank {r1}'s first step starts {(late - early) / 3.6e9:,.1f} hours after rank {r0}'s on the "
                         "clock the ranks share (ts + baseTimeNanoseconds): not one run's traces, or a trace whose "
                         "base time is missing or wrong")
    _same_groups(ordered)
    _distinct_processes(ordered)
    _ran_together(ordered)
    return ordered


# One run's ranks start their steps together, give or take a slow start; past this, their clocks are not one clock.
MAX_SKEW_US = 3.6e9  # an hour


def _groups(t: Trace) -> dict[str, tuple]:
    """The trace's process groups from distributedInfo's pg_config: name -> (description, size, ranks)."""
    cfg = t.meta["distributedInfo"].get("pg_config")
    out = {}
    for g in cfg if isinstance(cfg, list) else []:
        if isinstance(g, dict) and isinstance(g.get("pg_name"), str):
            out[g["pg_name"]] = (g.get("pg_desc"), g.get("pg_size"), g.get("ranks"))
    return out


def _same_groups(ordered: list[Trace]) -> None:
    """A process group two ranks both belong to is one group: the same description and ranks in both traces."""
    seen: dict[str, tuple[tuple, int]] = {}
    for r, t in enumerate(ordered):
        for name, g in _groups(t).items():
            if name in seen and seen[name][0] != g:
                (desc, size, members), q = seen[name]
                raise TraceError(f"process group {name!r} is {g[0]} of {g[1]} ranks {g[2]} in rank {r}'s trace "
                                 f"({t.path}) but {desc} of {size} ranks {members} in rank {q}'s "
                                 f"({ordered[q].path}): not one run")
            seen.setdefault(name, (g, r))


def _process(t: Trace) -> tuple | None:
    """(host, pid) of the process that wrote the trace, where the trace names its host."""
    host = t.meta.get("host_name")
    pid = t.steps[0].span.pid if t.steps and not t.whole else None
    return (host, str(pid)) if isinstance(host, str) and host and pid is not None else None


def _distinct_processes(ordered: list[Trace]) -> None:
    seen: dict[tuple, int] = {}
    for r, t in enumerate(ordered):
        p = _process(t)
        if p is not None and p in seen:
            raise TraceError(f"ranks {seen[p]} and {r} ({ordered[seen[p]].path}, {t.path}) were written by one "
                             f"process (pid {p[1]} on {p[0]}): one process is one rank, so not one run")
        if p is not None:
            seen[p] = r


def _span_text(us: float) -> str:
    for unit, size in (("hours", 3.6e9), ("min", 6e7), ("s", 1e6), ("ms", 1e3)):
        if us >= size:
            return f"{us / size:,.1f} {unit}"
    return f"{us:,.0f} µs"


def _ran_together(ordered: list[Trace]) -> None:
    """Every rank takes part in each all-reduce, all-gather or reduce-scatter, so none finishes one before every
    rank has begun it: in each step, every rank's first such collective began before any rank had ended its last
    (within the clocks' slack). That holds whatever order the collectives ran in, and fails for rank 0 of one run
    beside rank 1 of another, however alike the two runs are. Steps with no such collective: the ranks' steps
    must not be a minute apart either."""
    gpu = ordered[0].device == "cuda"
    slack = min((SAME_HOST_SLACK_US if _process(a) and _process(b) and _process(a)[0] == _process(b)[0] else SLACK_US)
                for a in ordered for b in ordered if a is not b) if len(ordered) > 1 else 0
    offsets = _offsets(ordered)
    for s, st0 in enumerate(ordered[0].steps):
        spans = []  # per rank: (first start, last end) of the step's symmetric collectives
        for t, off in zip(ordered, offsets):
            st = t.steps[s]
            runs = ([k.event for k in st.gpu if kind_of(k.name) in SYMMETRIC] if gpu else
                    [e for e in st.spans if e.cat == "user_annotation" and kind_of(e.name) in SYMMETRIC])
            spans.append((min(e.ts for e in runs) + off, max(e.end for e in runs) + off) if runs else None)
        if all(sp is not None for sp in spans):
            q = max(range(len(spans)), key=lambda r: spans[r][0])
            r = min(range(len(spans)), key=lambda r: spans[r][1])
            gap = spans[q][0] - spans[r][1]
            if gap > slack:
                raise TraceError(f"rank {q} ({ordered[q].path}) began step #{st0.number}'s collectives "
                                 f"{_span_text(gap)} after rank {r} ({ordered[r].path}) had finished them, and no "
                                 "rank finishes an all-reduce before every rank has begun it: two runs' traces, not "
                                 "one run's")
    walls = [(t.steps[0].span.ts + off, max(window(st)[1] for st in t.steps) + off)
             for t, off in zip(ordered, offsets) if t.steps]
    if len(walls) > 1:
        (a, _), (_, b) = max(walls), min(walls, key=lambda w: w[1])
        if a - b > NO_COLLECTIVE_SLACK_US:
            raise TraceError(f"the ranks' steps are {_span_text(a - b)} apart on the clock they share: two runs' "
                             "traces, not one run's")


def _offsets(traces: list[Trace]) -> list[float]:
    """Each trace's _offset less the earliest one: the same shared clock, in µs a float holds exactly (ts plus a
    base time since 1970 is ~1.8e15 µs, where a double's step is a quarter µs)."""
    bases = [_offset(t) for t in traces]
    return [b - min(bases) for b in bases]


def _offset(t: Trace) -> float:
    """µs to add to the trace's "ts" for a clock all ranks share (each rank's trace counts from its own base)."""
    base = t.meta.get("baseTimeNanoseconds")
    return base / 1e3 if type(base) is int and 0 <= base < 1 << 63 else 0.0


def bandwidth(kind: str, size: int | None, us: float, world: int) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s: size / time, and that times the bus factor."""
    if size is None or us <= 0:
        return None, None
    algbw = size / us / 1e3
    factor = BUS_FACTOR.get(kind)
    return algbw, (algbw * factor(world) if factor else None)


def analyze(traces: list[Trace]) -> dict:
    """The run as plain data (--json): per rank and step the time split, per collective its arrivals and transfer.

    Per rank and step: step_us (the step's span, to its last GPU work), busy_us, compute_us, comm_us,
    overlapped_us (communication while compute ran on another thread or stream), exposed_us (the rest), wait_us
    (the calling threads idle until their collectives were done: collectives.step_calls), collectives (how many
    ran), called (how many the code called: a group of one rank runs none). wait_us is None on a GPU (the host
    does not wait; each collective's waited_us says how long its kernel waited for the others). Per collective:
    see _collective."""
    world, gpu = len(traces), traces[0].device == "cuda"
    info = _info(traces[0])
    per_rank, colls_by_rank = [], []
    for r, (t, off) in enumerate(zip(traces, _offsets(traces))):
        rows, colls = [], []
        for st in t.steps:
            w = work(st, gpu)
            cs = collectives(w, gpu, off, world, st)
            compute, comm = [(a, b) for _, a, b in w.compute], [(a, b) for _, a, b in w.comm]
            comm_us, shared = intervals.length(comm), overlapped(w)
            lo, hi = window(st)
            rows.append({"step": st.number, "step_us": hi - lo, "busy_us": intervals.length(compute + comm),
                         "compute_us": intervals.length(compute), "comm_us": comm_us, "overlapped_us": shared,
                         "exposed_us": comm_us - shared, "wait_us": blocked(w, gpu), "collectives": len(cs),
                         "called": len(w.calls)})
            colls.append(cs)
        per_rank.append({"rank": r, "trace": t.path, "steps": rows})
        colls_by_rank.append(colls)
    return {"schema_version": SCHEMA_VERSION, "world_size": world, "backend": backend_of(info),
            "device": traces[0].device, "device_name": traces[0].device_name, "ranks": per_rank,
            "collectives": _collectives(traces, colls_by_rank, world)}


def lanes(traces: list[Trace]) -> dict:
    """Each rank's compute and communication over its active steps, on the clock the ranks share (their base
    times), in µs from the run's first interval: what --plot draws as one lane per rank, side by side."""
    world, gpu = len(traces), traces[0].device == "cuda"
    rows = []
    for r, (t, off) in enumerate(zip(traces, _offsets(traces))):
        compute, comm = [], []
        for st in t.steps:
            c, m, _ = step_work(st, gpu, off, world)
            compute += [(a + off, b + off) for a, b in c]
            comm += [(a + off, b + off) for a, b in m]
        rows.append((r, intervals.merge(compute), intervals.merge(comm)))
    starts = [a for _, c, m in rows for a, _ in c + m]
    t0 = min(starts) if starts else 0.0
    return {"device": traces[0].device, "device_name": traces[0].device_name,
            "ranks": [{"rank": r, "compute": [(a - t0, b - t0) for a, b in c], "comm": [(a - t0, b - t0) for a, b in m]}
                      for r, c, m in rows]}


def _collectives(traces: list[Trace], colls_by_rank: list[list[list[Collective]]], world: int) -> list[dict]:
    out = []
    for s, st in enumerate(traces[0].steps):
        calls = [colls_by_rank[r][s] for r in range(world)]
        kinds = [[c.kind for c in cs] for cs in calls]
        if any(k != kinds[0] for k in kinds):
            r = next(r for r, k in enumerate(kinds) if k != kinds[0])
            raise TraceError(f"step {st.number}: rank 0 ran {kinds[0][:6]} but rank {r} {kinds[r][:6]}: "
                             "not the same collectives, so not one run")
        out += [_collective(st.number, i, same) for i, same in enumerate(zip(*calls))]
    return out


def _collective(step: int, index: int, same: tuple[Collective, ...]) -> dict:
    """One collective over the ranks (lists are per rank, µs from the first arrival):
    arrival_us: when each rank called it (arrival_of "call"; "start" where some rank's call is not in the trace:
    then when it began running); skew_us: the last arrival less the first; straggler: the rank that arrived last,
    None where another arrived within TIE_US of it (tied: those ranks); started_us: when each rank's run began
    (gloo's span, the NCCL kernel); queued_us: run start less call (on gloo's thread, behind earlier collectives);
    waited_us: the last rank's run start less this rank's (its run waiting for the others); transfer_rank: the
    rank whose run began last, time_us: that run's length, the transfer (no waiting, no queueing in it), and the
    bandwidths of it; call: the call's name (rank 0's), ran_as: the kind of what ran it (gloo runs c10d's
    _reduce_scatter_base_ as an all-reduce; the bus factor is the run's)."""
    world = len(same)
    by_call = all(c.called is not None for c in same)
    arrivals = [c.called if by_call else c.start for c in same]
    first, last = min(arrivals), max(arrivals)
    tied = [r for r in range(world) if last - arrivals[r] <= TIE_US]
    starts = [c.start for c in same]
    ls = max(range(world), key=lambda r: starts[r])
    us, size, ran_as = same[ls].end - same[ls].start, same[ls].bytes, same[ls].ran_as or same[ls].kind
    algbw, busbw = bandwidth(ran_as, size, us, world)
    return {"step": step, "index": index, "kind": same[0].kind, "name": same[0].name, "call": same[0].call,
            "ran_as": ran_as, "bytes": size, "arrival_of": "call" if by_call else "start",
            "arrival_us": [x - first for x in arrivals], "skew_us": last - first,
            "straggler": tied[0] if len(tied) == 1 else None, "tied": tied if len(tied) > 1 else [],
            "started_us": [x - first for x in starts],
            "queued_us": [c.start - c.called if by_call else None for c in same],
            "waited_us": [starts[ls] - x for x in starts], "transfer_rank": ls, "time_us": us,
            "algbw_gbs": algbw, "busbw_gbs": busbw}


def _us(x: float) -> str:
    return f"{x:,.1f}"


def _gbs(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}" if x >= 100 else f"{x:.3g}"


def _size_text(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def straggler_text(cs: list[dict]) -> str:
    """Who held up one collective over the steps: the rank that arrived last where it arrived late enough to cost
    the others the most waiting (its skews summed), in how many steps; then the steps another rank was last, and
    the ties. A rank late in one step only is named ahead of one that was last by a few µs in every other."""
    n, ties, late = len(cs), 0, {}
    for c in cs:
        if c.get("straggler") is None:
            ties += 1
        else:
            steps, skew = late.get(c["straggler"], (0, 0.0))
            late[c["straggler"]] = (steps + 1, skew + c["skew_us"])
    if not late:
        return f"tie ({ties}/{n})"
    r = max(sorted(late), key=lambda q: late[q][1])
    others = n - late[r][0] - ties
    return (f"rank {r} ({late[r][0]}/{n})" + (f", others {others}" if others else "")
            + (f", tie {ties}" if ties else ""))


def text(data: dict) -> str:
    """The merged report: a row per rank and step, then each collective of a step (medians over the steps)."""
    where = "GPU" if data["device"] == "cuda" else "CPU"
    name = data["device_name"] if where == "GPU" else None  # a CPU run on a GPU machine lists the GPU too
    lines = [f"{data['world_size']} rank(s), {data['backend']}, {name or where}; communication: "
             f"{'NCCL kernels' if where == 'GPU' else 'gloo collectives (their own thread)'}"]
    head = ["rank", "step", "step µs", f"{where} busy µs", "compute µs", "comm µs", "overlapped µs", "exposed µs",
            "wait µs", "collectives"]
    opt = lambda s, key: "-" if s.get(key) is None else _us(s[key])  # noqa: E731  (a record without the key)
    rows = [[str(r["rank"]), str(s["step"]), opt(s, "step_us"), _us(s["busy_us"]), _us(s["compute_us"]),
             _us(s["comm_us"]), _us(s["overlapped_us"]), _us(s["exposed_us"]), opt(s, "wait_us"), str(s["collectives"])]
            for r in data["ranks"] for s in r["steps"]]
    lines += _table(head, rows)
    lines.append("(overlapped: while compute ran on another thread or stream; wait: the calling thread idle until "
                 "its collectives were done)")
    by_index: dict[int, list[dict]] = {}
    for c in data["collectives"]:
        by_index.setdefault(c["index"], []).append(c)
    if not by_index:
        called = max((s.get("called", 0) for r in data["ranks"] for s in r["steps"]), default=0)
        why = ("a group of one rank exchanges nothing, so none launched a kernel" if data["world_size"] == 1 else
               "the trace holds none of their kernels or spans")
        lines.append("\nno collectives in the active steps" + (
            f", though the code called up to {called} a step (c10d's ops): {why}" if called else ""))
        return "\n".join(lines)
    by_call = all(c.get("arrival_of") == "call" for c in data["collectives"])
    lines += [f"\neach step's collectives (median over {len(data['ranks'][0]['steps'])} step(s)):",
              "arrival: when each rank " + ("called it (c10d's op on its own thread)" if by_call else
                                            "began running it (the trace holds no call of it on some rank)")
              + f"; skew: last arrival less first; straggler: the rank that arrived last (ties within "
              f"{TIE_US:g} µs said as ties), named by the waiting it caused",
              "time: the transfer, from the start of the last rank's run (gloo span, NCCL kernel) to its end: no "
              "waiting for a late rank, no queueing behind an earlier collective; busbw as nccl-tests counts it"]
    head = ["#", "collective", "size", "skew µs", "max skew µs", "straggler (steps)", "time µs", "algbw GB/s",
            "busbw GB/s"]
    rows = []
    for i, cs in sorted(by_index.items()):
        med = lambda key: _median([c[key] for c in cs])  # noqa: E731
        kind, ran_as = cs[0]["kind"], cs[0].get("ran_as")
        rows.append([str(i), kind + (f" (ran as {ran_as})" if ran_as and ran_as != kind else ""),
                     _size_text(cs[0]["bytes"]), _us(med("skew_us")), _us(max(c["skew_us"] for c in cs)),
                     straggler_text(cs), _us(med("time_us")), _gbs(med("algbw_gbs")), _gbs(med("busbw_gbs"))])
    lines += _table(head, rows)
    return "\n".join(lines)


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths)))  # noqa: E731
    return [fmt(head), *map(fmt, rows)]


def rank_file(trace: Path, rank: int) -> Path:
    """Rank `rank`'s trace of the run `trace` (one rank's file, named ..._rank<N>.json[.gz]) belongs to."""
    return trace.with_name(RANK_IN_NAME.sub(f"_rank{rank}", trace.name))


# Expectations on one rank's trace: what 08_tensor_parallel.py guesses.

def collectives_per_step(kind: str, n: int, world: int) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        if world == 1:
            return NotApplicable("one rank: there is nothing to exchange")
        gpu = t.device == "cuda"
        # what the rank called, or what ran it: gloo runs a reduce-scatter as an all-reduce (08's CPU guess)
        counts = [sum(kind in (c.kind, c.ran_as) for c in step_work(st, gpu, 0.0, world)[2]) for st in t.steps]
        return True if all(c == n for c in counts) else f"{kind} per step: {counts}"
    return Expect(f"{n} {kind} per step", run)


def gemms_per_step(n: int) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        # a split-K GEMM's reduce kernel is the GEMM's second half, launched by the same op: not counted
        counts = [sum(1 for k in st.kernels if is_gemm(k)) - len(splitk_reduces(st)) for st in t.steps]
        return True if all(c == n for c in counts) else f"GEMM kernels per step: {counts}"
    return Expect(f"{n} GEMM kernels per step, each on this rank's shard", run, "cuda")


def _exposed_shares(t: Trace) -> list[float] | str:
    """Per step, the share of the NCCL kernels' time with no other kernel running (a str: why none)."""
    if (miss := need_steps(t)):
        return miss
    info = t.meta.get("distributedInfo")
    world = info.get("world_size") if isinstance(info, dict) else None
    if not isinstance(world, int) or world < 2:
        return NotApplicable("one rank: no communication to hide")
    shares = []
    for st in t.steps:
        w = work(st, True)
        total = intervals.length((a, b) for _, a, b in w.comm)
        if total > 0:
            shares.append(1 - overlapped(w) / total)
    return shares or "no NCCL kernels in the steps"


def communication_exposed(min_share: float) -> Expect:
    def run(t: Trace):
        shares = _exposed_shares(t)
        if isinstance(shares, str):
            return shares
        share = statistics.median(shares)
        return True if share >= min_share else f"median step: {share:.0%} of the communication exposed"
    return Expect(f"at least {min_share:.0%} of the communication exposed (nothing to overlap it with)", run, "cuda")


def communication_overlapped(min_share: float) -> Expect:
    def run(t: Trace):
        shares = _exposed_shares(t)
        if isinstance(shares, str):
            return shares
        share = 1 - statistics.median(shares)
        return True if share >= min_share else f"median step: {share:.0%} of the communication overlapped compute"
    return Expect(f"at least {min_share:.0%} of the communication overlaps compute", run, "cuda")
