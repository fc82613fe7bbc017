"""Data parallel, read back: a training step's micro-batches, the collectives each rank called in them, and the
run's straggler; 09_data_parallel.py's expectations (DDP's buckets, gradient accumulation, FSDP2, a slow rank).

One question per function, on one rank's trace:
- micro_batches_of(st): the step's forward/backward pairs, one per micro-batch: the passes of training.phase_windows
  (09's record_function("forward") and ("backward") spans, or what torch's own spans say: passes.py);
- calls(st): the collectives this rank called, in order, each with its kind (collectives.step_calls): c10d's ops (c10d::allreduce_,
  c10d::_allgather_base_, c10d::_reduce_scatter_base_, ...) on the rank's own threads, whatever runs them. The call
  is when the rank asked, so it sits in the rank's phases: gloo's span starts later on a worker thread of its own,
  a GPU's NCCL kernel later on its stream. And it says what was asked: gloo runs FSDP2's reduce-scatter as an
  all-reduce of the whole input (its span says gloo:all_reduce), the call is c10d::_reduce_scatter_base_;
- run_of(trace): the run's every rank, read from the files beside this one (..._rank<N>.json), for the two
  guesses that compare ranks: who is the straggler (ranks.analyze), and who waits in backward.
"""

from __future__ import annotations

import functools
import os
import re
import statistics
from pathlib import Path

from ..expectation import Expect, NotApplicable, need_steps
from ..reading.events import Event, Step, Trace, TraceError
from . import ranks
from .collectives import Call, step_calls
from .passes import phase_windows
from .training import ACCUMULATE_GRAD

SLEEP = "slow_rank_sleep"  # 09's record_function around --slow-rank's sleep


def calls(st: Step) -> list[tuple[str, Call]]:
    """(kind, call) of each collective the rank called in the step, in call order (collectives.step_calls: the
    outermost c10d op of each, named by what was asked, whatever ran it)."""
    return [(c.kind, c) for c in step_calls(st)]


def micro_batches_of(st: Step) -> list[tuple[tuple, tuple]] | str:
    """The step's (forward, backward) windows in order, one pair per micro-batch, each forward ending before its
    backward starts and each backward before the next forward; a str says why not."""
    windows, _ = phase_windows(st)
    if "forward" not in windows or "backward" not in windows:
        return f"ProfilerStep#{st.number}: no forward and backward passes"
    fwd, bwd = windows["forward"].whole, windows["backward"].whole
    if len(fwd) != len(bwd):
        return f"ProfilerStep#{st.number}: {len(fwd)} forward and {len(bwd)} backward passes"
    for i, (f, b) in enumerate(zip(fwd, bwd)):
        if f[1] > b[0] or (i + 1 < len(fwd) and b[1] > fwd[i + 1][0]):
            return f"ProfilerStep#{st.number}: micro-batch {i + 1}'s forward and backward do not alternate"
    return list(zip(fwd, bwd))


def _inside(e: Event, window: tuple) -> bool:
    return window[0] <= e.ts <= window[1]


def placed(st: Step) -> list[dict] | str:
    """Per micro-batch, the kinds of the collectives called in its forward and in its backward (a str: why not)."""
    pairs = micro_batches_of(st)
    if isinstance(pairs, str):
        return pairs
    made = calls(st)
    return [{"forward": [k for k, e in made if _inside(e, f)], "backward": [k for k, e in made if _inside(e, b)]}
            for f, b in pairs]


def _world(t: Trace) -> int | None:
    info = t.meta.get("distributedInfo")
    world = info.get("world_size") if isinstance(info, dict) else None
    return world if type(world) is int and world > 0 else None


def _per_step(t: Trace, world: int, one_rank: str, check, wheres: list | None = None) -> bool | str:
    """check(step, placed) for every step, the first complaint returned; not applicable on one rank. wheres: the
    steps' placed(), where the caller has them already."""
    if (miss := need_steps(t)):
        return miss
    if world == 1:
        return NotApplicable(one_rank)
    for i, st in enumerate(t.steps):
        where = placed(st) if wheres is None else wheres[i]
        if isinstance(where, str):
            return where
        if (seen := check(st, where)) is not True:
            return seen
    return True


# ------------------------------------------------------------------------------------------------ expectations

def micro_batches(n: int) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        for st in t.steps:
            pairs = micro_batches_of(st)
            if isinstance(pairs, str):
                return pairs
            if len(pairs) != n:
                return f"ProfilerStep#{st.number}: {len(pairs)} forward/backward pairs"
        return True
    each = "one per micro-batch, " if n > 1 else ""
    return Expect(f"{n} forward/backward pair{'s' if n != 1 else ''} per optimizer step ({each}each forward before "
                  "its backward)", run)


def buckets_overlap_backward(world: int) -> Expect:
    """DDP: every all-reduce is called inside the last micro-batch's backward, and with several (one per bucket)
    the first before the last gradient of that backward is accumulated (AccumulateGrad): a bucket goes as soon as
    its gradients are ready, while backward computes the rest."""
    def check(st, where):
        made = [e for k, e in calls(st) if k == "all_reduce"]
        if not made:
            return f"ProfilerStep#{st.number}: no all-reduce called"
        last = micro_batches_of(st)[-1][1]
        outside = [e for e in made if not _inside(e, last)]
        if outside:
            return (f"ProfilerStep#{st.number}: {len(outside)} of {len(made)} all-reduces called outside the last "
                    f"backward (the first {outside[0].ts - st.span.ts:,.0f} µs into the step, backward "
                    f"{last[0] - st.span.ts:,.0f}-{last[1] - st.span.ts:,.0f})")
        grads = [e.ts for e in st.spans if e.name == ACCUMULATE_GRAD and _inside(e, last)]
        if len(made) > 1 and grads and made[0].ts >= max(grads):
            return (f"ProfilerStep#{st.number}: the first of {len(made)} all-reduces called "
                    f"{made[0].ts - max(grads):,.0f} µs after backward's last gradient")
        return True

    def run(t: Trace):
        return _per_step(t, world, "one rank: DDP has no one to all-reduce with", check)
    return Expect("DDP all-reduces the gradients in buckets during backward: every all-reduce called inside backward, "
                  "and with several buckets the first before backward's last gradient is ready (communication "
                  "starts while backward still computes)", run)


def all_reduces_once_per_step(world: int, n: int, buckets: int | None) -> Expect:
    """DDP with n micro-batches: no all-reduce in the first n - 1 (no_sync()) nor in the last one's forward, and in
    its backward as many as there are buckets (where known), the same number in every step. Other collectives may be
    anywhere: DDP broadcasts a module's buffers (rotary tables, batch-norm statistics) from rank 0 in forward."""
    counts: list[int] = []  # all-reduces per step, in the steps checked so far

    def check(st, where):
        per = [(w["forward"] + w["backward"]).count("all_reduce") for w in where]
        last = where[-1]["backward"].count("all_reduce")
        if sum(per) != last:
            return (f"ProfilerStep#{st.number}: all-reduces called per micro-batch (forward + backward): {per}, "
                    f"{sum(per) - last} of them outside the last backward")
        counts.append(last)
        if buckets is not None and last != buckets:
            return f"ProfilerStep#{st.number}: {last} all-reduces in the last backward, against {buckets} buckets"
        if len(set(counts)) > 1:
            return f"all-reduces per step: {counts}"
        return True

    def run(t: Trace):
        counts.clear()
        return _per_step(t, world, "one rank: DDP has no one to all-reduce with", check)
    many = f"{buckets}, one per bucket" if buckets is not None else "as many in every step"
    if n == 1:
        return Expect(f"one round of all-reduces per optimizer step, all in backward: {many}", run)
    return Expect(f"--accumulate {n}: still one round of all-reduces per optimizer step, all in the last micro-batch's "
                  f"backward and none in the {n - 1} before it (no_sync()): {many}, as without accumulation", run)


def fsdp_collectives(world: int, n: int, reshards: bool | None = True) -> Expect:
    """FSDP2: each forward all-gathers, each backward all-gathers again (resharded after forward) and the last one
    reduce-scatters the gradients; no reduce-scatter in forward, nor in the backwards without gradient sync.
    reshards: the run resharded after forward (09's own runs do); None where a trace alone cannot say (another
    harness's: fully_shard(..., reshard_after_forward=False) keeps the parameters gathered until backward): then a run
    whose backwards all-gather nothing has not the guess's premise (not applicable, the rest of it still checked)."""
    def check(st, where, again):
        for i, w in enumerate(where):
            last = i == len(where) - 1
            f, b = w["forward"], w["backward"]
            if "all_gather" not in f or "reduce_scatter" in f or ("all_gather" in b) != again \
                    or ("reduce_scatter" in b) != last:
                return (f"ProfilerStep#{st.number}, micro-batch {i + 1} of {len(where)}: forward called "
                        f"{_counted(f)}, backward {_counted(b)}")
        return True

    def run(t: Trace):
        again, wheres = reshards, None
        if again is None:  # read from the run: does any backward all-gather? (no steps, or one rank: _per_step says)
            wheres = [placed(st) for st in t.steps]
            again = any(isinstance(w, str) or any("all_gather" in m["backward"] for m in w) for w in wheres)
        seen = _per_step(t, world, "one rank: FSDP2 shards nothing", lambda st, where: check(st, where, again), wheres)
        if seen is True and not again:
            return NotApplicable("no backward all-gathers: the parameters stayed gathered from forward to backward "
                                 "(fully_shard(..., reshard_after_forward=False)); the rest held: every forward "
                                 "all-gathered, the gradients were reduce-scattered in backward" + later)
        return seen
    later = " (only the last micro-batch's: the others keep their gradients unsynced)" if n > 1 else ""
    return Expect("FSDP2: every forward all-gathers the sharded parameters, every backward all-gathers them again "
                  f"(resharded after forward) and reduce-scatters the gradients{later}; no reduce-scatter in forward",
                  run)


def _counted(kinds: list[str]) -> str:
    if not kinds:
        return "nothing"
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


@functools.lru_cache(maxsize=4)
def _load(files: tuple[str, ...], stamps: tuple) -> list[Trace]:  # cached per version of the files
    return ranks.load_run(list(files))


def run_of(t: Trace, world: int) -> list[Trace] | str:
    """Every rank's trace of t's run, read from the files beside it (ranks.rank_file); a str says why not."""
    path = Path(t.path)
    if not ranks.RANK_IN_NAME.search(path.name):
        return NotApplicable(f"{path.name} is not named ..._rank<N>.json: the other ranks' traces cannot be found")
    files = [ranks.rank_file(path, r) for r in range(world)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        return NotApplicable(f"{missing[0]} is not beside this trace: the ranks cannot be compared")
    try:
        stamps = tuple((s.st_mtime_ns, s.st_size) for s in map(os.stat, files))
        return _load(tuple(map(str, files)), stamps)
    except (OSError, TraceError) as e:
        return f"the run's traces do not merge: {e}"


def _cross_rank(t: Trace, world: int) -> list[Trace] | str:
    if (miss := need_steps(t)):
        return miss
    if world == 1:
        return NotApplicable("one rank: no one to wait for")
    return run_of(t, world)


def straggler(rank: int, world: int, sleep_us: float) -> Expect:
    """--slow-rank R: at the first collective of each backward (the first that starts once R's backward has), R
    arrives last in most of them, at a median of at least half its sleep after the first to arrive (ranks.analyze:
    skew and straggler). Most, and the median: on a busy machine a rank descheduled for a few ms in one step is late
    for reasons of its own."""
    def run(t: Trace):
        traces = _cross_rank(t, world)
        if isinstance(traces, str):
            return traces
        found = {(c["step"], c["index"]): c for c in ranks.analyze(traces)["collectives"]}
        slow, firsts = traces[rank], []
        for st in slow.steps:
            pairs = micro_batches_of(st)
            if isinstance(pairs, str):
                return pairs
            starts = [c.start for c in ranks.step_work(st, slow.device == "cuda", 0.0, world)[2]]
            mine = sorted({next((i for i, s in enumerate(starts) if s >= b[0]), None) for _, b in pairs} - {None})
            if not mine:
                return f"ProfilerStep#{st.number}: no collective starts in or after rank {rank}'s backward"
            firsts += [found[(st.number, i)] for i in mine]
        last, skews = [c["straggler"] for c in firsts], [c["skew_us"] for c in firsts]
        skew = statistics.median(skews)
        if 2 * last.count(rank) <= len(last) or skew < sleep_us / 2:
            return (f"at the first collective of each backward, the last to arrive: "
                    f"{', '.join(f'rank {r}' for r in last)}; skews {', '.join(f'{x:,.0f}' for x in skews)} µs "
                    f"(median {skew:,.0f})")
        return True
    return Expect(f"rank {rank} (asleep {sleep_us / 1e3:g} ms before each backward) is the straggler: at the first "
                  f"collective of each backward it arrives last (in most steps), a median {sleep_us / 2e3:g} ms or more "
                  "after the first", run)


def others_wait_in_backward(rank: int, world: int, sleep_us: float) -> Expect:
    """--slow-rank R: every other rank's backward (all its micro-batches') lasts a median (over the steps) of at
    least half of R's sleep longer than R's: inside loss.backward() it waits for R (DDP for its buckets, FSDP2 at its
    all-gather). Host time, so a CPU trace's: with NCCL the host does not wait, the GPU stream does.

    The length of backward, not training.phases_summary's communication wait (backward's time with its thread
    idle): FSDP2's pre-backward all-gather runs inside an autograd engine span (evaluate_function:
    UnsafeViewBackward0), so its wait there reads as busy."""
    def run(t: Trace):
        traces = _cross_rank(t, world)
        if isinstance(traces, str):
            return traces
        per_rank = []
        for tr in traces:
            rows = []
            for st in tr.steps:
                pairs = micro_batches_of(st)
                if isinstance(pairs, str):
                    return pairs
                rows.append(sum(b[1] - b[0] for _, b in pairs))
            per_rank.append(rows)
        longer = {r: statistics.median(a - b for a, b in zip(per_rank[r], per_rank[rank]))
                  for r in range(world) if r != rank}
        short = [r for r, us in longer.items() if us < sleep_us / 2]
        if short:
            r = short[0]
            return (f"rank {r}'s backward is a median {longer[r]:,.0f} µs longer than rank {rank}'s (per step, µs: "
                    f"rank {r} {', '.join(f'{x:,.0f}' for x in per_rank[r])}; rank {rank} "
                    f"{', '.join(f'{x:,.0f}' for x in per_rank[rank])})")
        return True
    return Expect(f"every other rank waits for rank {rank} inside backward: its backward lasts a median "
                  f"{sleep_us / 2e3:g} ms or more longer than rank {rank}'s (host time, on a CPU; with NCCL the GPU "
                  "waits)", run, "cpu")


# ------------------------------------------------------------------------------------------------ the run, read back

def dp_flags(a, trace: Trace, words: list[str]) -> None:
    """09_data_parallel.py's flags, set on `a` from the trace first, then the name 09 gives its files
    (mlp-2L_2x16x32x64_fp32_cold_dp2-ddp[_acc2][_bucket0p02][_slow1]_eager_rank0): the ranks from distributedInfo,
    FSDP2 from its FSDP:: spans (else DDP), --accumulate from the micro-batches of the first step, --slow-rank from
    the name or this rank's own sleep; DDP's bucket count is not in the trace (None)."""
    a.world = _world(trace)
    if a.world is None:
        raise TraceError(f"{trace.path}: not a rank of a distributed run (no usable distributedInfo)")
    names = {e.name for st in trace.steps for e in st.spans}
    told = {w.split("-", 1)[1] for w in words if re.fullmatch(r"dp\d+-(ddp|fsdp)", w)}
    a.dp = "fsdp" if any(n.startswith("FSDP::") for n in names) else "ddp" if not told else told.pop()
    pairs = micro_batches_of(trace.steps[0]) if trace.steps else []
    if isinstance(pairs, list) and pairs:
        a.accumulate = len(pairs)
    elif (acc := next((int(w[3:]) for w in words if re.fullmatch(r"acc[1-9]\d{0,1}", w)), None)) is not None:
        a.accumulate = acc
    slow = next((int(w[4:]) for w in words if re.fullmatch(r"slow\d{1,5}", w)), None)
    if slow is None and SLEEP in names:  # this rank slept: it is the slow one
        slow = trace.meta["distributedInfo"].get("rank")
    a.slow_rank = slow
    a.buckets = None
    # 09's own runs reshard after forward (fully_shard's default); another harness's may not: read from the trace
    a.reshards = True if told else None
