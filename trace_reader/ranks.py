"""Several ranks of one distributed run, read together: where each rank's time went, and its collectives.

Each rank of a torch.distributed run writes its own trace; the profiler stamps it with "distributedInfo" (backend,
rank, world_size). load_run() reads the traces of one run (files, or a folder holding one run) and refuses in one
line what is not one run: a trace without distributedInfo, ranks of different runs, a rank twice, a rank missing.
analyze() then gives, per rank and step:
- busy: time with work on the device (GPU kernels; on a CPU the ops that compute, kernels.cpu_kernels, on every
  thread), compute and communication each as a union of intervals;
- communication: NCCL kernels on a GPU, gloo's collective spans ("gloo:all_reduce", on gloo's own thread) on a
  CPU; overlapped = the part of it during which compute ran too, exposed = the rest, which the step waits for;
and per collective (the i-th of each step is the same call on every rank, as in any SPMD program):
- the skew: how much later the last rank arrived (started it) than the first; that last rank is the straggler;
- its size, as nccl-tests counts it (the all-reduce's buffer, the all-gather's output, the reduce-scatter's input),
  algbw = size / time and busbw = algbw x the collective's bus factor (all-reduce 2(n-1)/n, all-gather and
  reduce-scatter (n-1)/n). The time is the straggler's: it waited for no one, so its collective is pure transfer.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import intervals
from .expect import Expect, NotApplicable, _need_steps, splitk_reduces
from .kernels import cpu_kernels, is_gemm
from .read import MAX_JSON_BYTES, Event, Step, Trace, TraceError, load_trace

MAX_RANKS = 1024  # files in one run: more is not a run this reader was made for
MAX_RUN_BYTES = 4 << 30  # JSON text of all the ranks together: each rank's own cap is its share of this
NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
GLOO_RE = re.compile(r"^gloo:(\w+)")
RANK_IN_NAME = re.compile(r"_rank\d+(?=\.json(?:\.gz)?$)")
# nccl-tests' bus factors (PERFORMANCE.md): busbw = algbw x factor(n), the bandwidth each link must carry.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}
KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
         ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send_recv"),
         ("recv", "send_recv"), ("reduce", "reduce"), ("barrier", "barrier"))
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
               "int": 4, "int32": 4, "longint": 8, "long": 8, "int64": 8, "char": 1, "int8": 1, "bool": 1,
               "unsignedchar": 1, "uint8": 1, "float8e4m3fn": 1, "float8e5m2": 1}


@dataclass
class Collective:
    kind: str  # all_reduce, all_gather, reduce_scatter, ... (see KINDS)
    name: str  # the kernel's or gloo span's own name
    start: float  # µs on the run's common clock (the trace's baseTimeNanoseconds added)
    end: float
    bytes: int | None  # nccl-tests' size: None where the trace does not say


def kind_of(name: str) -> str | None:
    """all_reduce for ncclDevKernel_AllReduce_Sum_bf16_RING_LL and gloo:all_reduce; None for other work."""
    m = NCCL_KERNEL_RE.match(name) or GLOO_RE.match(name)
    if not m:
        return None
    key = m.group(1).lower().replace("_", "")
    return next((kind for prefix, kind in KINDS if key.startswith(prefix)), key)


def _dtype_bytes(name: object) -> int | None:
    if not isinstance(name, str):
        return None
    return DTYPE_BYTES.get(name.lower().removeprefix("c10::").removeprefix("torch.").replace(" ", "").replace("_", ""))


def _elements(dims: object) -> int | None:
    """Elements of one tensor's dims ([2, 32, 64]) or of a tensor list's ([[2, 32, 64], ...]); None if not dims."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        parts = [_elements(d) for d in dims]
        return None if None in parts else sum(parts)
    if isinstance(dims, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return None


def _size(kind: str, args: dict, world: int) -> int | None:
    """nccl-tests' size of a collective from its event's args: the "In/Out msg nelems" NCCL kernels carry, else
    the first input's "Input Dims" (gloo's spans), an all-gather's output being world x its input."""
    item = _dtype_bytes(args.get("dtype")) or _dtype_bytes((args.get("Input type") or [None])[0]
                                                          if isinstance(args.get("Input type"), list) else None)
    if item is None:
        return None
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    if type(n_in) is int and type(n_out) is int and 0 <= n_in < 1 << 40 and 0 <= n_out < 1 << 40:
        return max(n_in, n_out) * item
    dims = args.get("Input Dims")
    n = _elements(dims[0]) if isinstance(dims, list) and dims else None
    if n is None:
        return None
    return n * item * (world if kind == "all_gather" else 1)


def _with_size(ev: Event, ops: list[Event]) -> dict:
    """The args that say a collective's size: the event's own, else those of the op (or its parents) that ran it."""
    for e in [ev, *ops]:
        while e is not None:
            if "In msg nelems" in e.args or GLOO_RE.match(e.name) or e.name.startswith("nccl:"):
                return e.args
            e = e.parent
    return ev.args


def step_work(st: Step, gpu: bool, offset: float, world: int) -> tuple[list, list, list[Collective]]:
    """(compute intervals, communication intervals, collectives in order) of one step on one rank."""
    if gpu:
        comm = [k for k in st.gpu if kind_of(k.name)]
        compute = [(k.event.ts, k.event.end) for k in st.gpu if not kind_of(k.name)]
        events = [(k.event, [k.op] if k.op is not None else []) for k in sorted(comm, key=lambda k: k.event.ts)]
    else:
        comm_spans = sorted((e for e in st.spans if e.cat == "user_annotation" and kind_of(e.name)), key=lambda e: e.ts)
        compute = [(e.ts, e.end) for e in cpu_kernels(st)]  # the ops that compute, once each (kernels.py)
        events = [(e, []) for e in comm_spans]
    colls = []
    for ev, ops in events:
        kind = kind_of(ev.name)
        colls.append(Collective(kind, ev.name, ev.ts + offset, ev.end + offset, _size(kind, _with_size(ev, ops), world)))
    return compute, [(ev.ts, ev.end) for ev, _ in events], colls


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
        return False
    ranks_, worlds = [i.get("rank") for i in infos], [i.get("world_size") for i in infos]
    return len(set(map(repr, ranks_))) == len(traces) and len(set(map(repr, worlds))) == 1


def join(traces: list[Trace]) -> list[Trace]:
    """The traces of one run in rank order; one line (TraceError) for what is not one run: ranks of runs of
    different sizes, backends or devices, a rank twice, a rank missing, different steps."""
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
    return ordered


# One run's ranks start their steps together, give or take a slow start; past this, their clocks are not one clock.
MAX_SKEW_US = 3.6e9  # an hour


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


def _called(st: Step) -> int:
    """Collectives the step's code called (c10d's record_param_comms spans, waits aside), run or not: a group of one
    rank has nothing to exchange, and NCCL launches no kernel for it."""
    return sum(e.name == "record_param_comms" and e.args.get("Collective name") not in (None, "", "wait")
               for e in st.spans)


def analyze(traces: list[Trace]) -> dict:
    """The run as plain data (--json): per rank and step the time split, per collective its skew and bandwidth."""
    world, gpu = len(traces), traces[0].device == "cuda"
    info = _info(traces[0])
    per_rank, colls_by_rank = [], []
    for r, t in enumerate(traces):
        rows, colls = [], []
        for st in t.steps:
            compute, comm, cs = step_work(st, gpu, _offset(t), world)
            comm_us, overlapped = intervals.length(comm), intervals.common(comm, compute)
            rows.append({"step": st.number, "busy_us": intervals.length(compute + comm),
                         "compute_us": intervals.length(compute), "comm_us": comm_us, "overlapped_us": overlapped,
                         "exposed_us": comm_us - overlapped, "collectives": len(cs), "called": _called(st)})
            colls.append(cs)
        per_rank.append({"rank": r, "trace": t.path, "steps": rows})
        colls_by_rank.append(colls)
    return {"world_size": world, "backend": info.get("backend"), "device": traces[0].device,
            "device_name": traces[0].device_name, "ranks": per_rank,
            "collectives": _collectives(traces, colls_by_rank, world)}


def lanes(traces: list[Trace]) -> dict:
    """Each rank's compute and communication over its active steps, on the clock the ranks share (their base
    times), in µs from the run's first interval: what --plot draws as one lane per rank, side by side."""
    world, gpu = len(traces), traces[0].device == "cuda"
    rows = []
    for r, t in enumerate(traces):
        off, compute, comm = _offset(t), [], []
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
        for i, same in enumerate(zip(*calls)):
            starts = [c.start for c in same]
            last = max(range(world), key=lambda r: starts[r])
            us = same[last].end - same[last].start
            size = same[last].bytes
            algbw, busbw = bandwidth(same[0].kind, size, us, world)
            out.append({"step": st.number, "index": i, "kind": same[0].kind, "name": same[0].name, "bytes": size,
                        "arrival_us": [x - min(starts) for x in starts], "skew_us": max(starts) - min(starts),
                        "straggler": last, "time_us": us, "algbw_gbs": algbw, "busbw_gbs": busbw})
    return out


def _us(x: float) -> str:
    return f"{x:,.1f}"


def _gbs(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}" if x >= 100 else f"{x:.3g}"


def _size_text(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def text(data: dict) -> str:
    """The merged report: a row per rank and step, then each collective of a step (medians over the steps)."""
    where = "GPU" if data["device"] == "cuda" else "CPU"
    lines = [f"{data['world_size']} rank(s), {data['backend']}, {data['device_name'] or where}; communication: "
             f"{'NCCL kernels' if where == 'GPU' else 'gloo collectives (their own thread)'}"]
    head = ["rank", "step", f"{where} busy µs", "compute µs", "comm µs", "overlapped µs", "exposed µs", "collectives"]
    rows = [[str(r["rank"]), str(s["step"]), _us(s["busy_us"]), _us(s["compute_us"]), _us(s["comm_us"]),
             _us(s["overlapped_us"]), _us(s["exposed_us"]), str(s["collectives"])]
            for r in data["ranks"] for s in r["steps"]]
    lines += _table(head, rows)
    by_index: dict[int, list[dict]] = {}
    for c in data["collectives"]:
        by_index.setdefault(c["index"], []).append(c)
    if not by_index:
        called = max((s.get("called", 0) for r in data["ranks"] for s in r["steps"]), default=0)
        why = ("a group of one rank exchanges nothing, so none launched a kernel" if data["world_size"] == 1 else
               "the trace holds none of their kernels or spans")
        lines.append("\nno collectives in the active steps" + (
            f", though the code called up to {called} a step (c10d's record_param_comms): {why}" if called else ""))
        return "\n".join(lines)
    lines.append(f"\neach step's collectives (median over {len(data['ranks'][0]['steps'])} step(s); time is the "
                 "straggler's, who waited for no one; busbw as nccl-tests counts it):")
    head = ["#", "collective", "size", "skew µs", "straggler (steps)", "time µs", "algbw GB/s", "busbw GB/s"]
    rows = []
    for i, cs in sorted(by_index.items()):
        med = lambda key: _median([c[key] for c in cs])  # noqa: E731
        late = Counter(c["straggler"] for c in cs).most_common(1)[0]
        rows.append([str(i), cs[0]["kind"], _size_text(cs[0]["bytes"]), _us(med("skew_us")),
                     f"rank {late[0]} ({late[1]}/{len(cs)})", _us(med("time_us")), _gbs(med("algbw_gbs")),
                     _gbs(med("busbw_gbs"))])
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
        if (miss := _need_steps(t)):
            return miss
        if world == 1:
            return NotApplicable("one rank: there is nothing to exchange")
        gpu = t.device == "cuda"
        counts = [sum(c.kind == kind for c in step_work(st, gpu, 0.0, world)[2]) for st in t.steps]
        return True if all(c == n for c in counts) else f"{kind} per step: {counts}"
    return Expect(f"{n} {kind} per step", run)


def gemms_per_step(n: int) -> Expect:
    def run(t: Trace):
        if (miss := _need_steps(t)):
            return miss
        # a split-K GEMM's reduce kernel is the GEMM's second half, launched by the same op: not counted
        counts = [sum(1 for k in st.kernels if is_gemm(k)) - len(splitk_reduces(st)) for st in t.steps]
        return True if all(c == n for c in counts) else f"GEMM kernels per step: {counts}"
    return Expect(f"{n} GEMM kernels per step, each on this rank's shard", run, "cuda")


def _exposed_shares(t: Trace) -> list[float] | str:
    """Per step, the share of the NCCL kernels' time with no other kernel running (a str: why none)."""
    if (miss := _need_steps(t)):
        return miss
    info = t.meta.get("distributedInfo")
    world = info.get("world_size") if isinstance(info, dict) else None
    if not isinstance(world, int) or world < 2:
        return NotApplicable("one rank: no communication to hide")
    shares = []
    for st in t.steps:
        compute, comm, _ = step_work(st, True, 0.0, world)
        total = intervals.length(comm)
        if total > 0:
            shares.append(1 - intervals.common(comm, compute) / total)
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
