"""How fast does inspect_trace.py read a long trace? Build one by replicating a real step, then time it.

    uv run bench_inspect.py tests/data/h200_mlp_eager.json.gz                        # 100 steps, 5 runs
    uv run bench_inspect.py tests/data/h200_mlp_eager.json.gz tests/data/h200_mlp_compile.json.gz --steps 2000

The first active step of each trace (every event from its ProfilerStep#k start until the next step starts:
CPU ops, runtime calls, kernels, flow arrows) is copied --steps times with shifted timestamps and fresh
ids, so the long trace has the same structure as the real one. Timed in this process, median of --runs:
load+report of A, and load A + load B + compare (B defaults to A). Nothing is written outside a temp dir.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inspect_trace as it

ID_STRIDE = 10_000_000  # per copy, so External ids, correlations and flow ids never collide


def replicate(src: Path, steps: int, dst: Path) -> int:
    """Write a trace with `steps` copies of src's first active step; return its size in bytes."""
    data = it._read_json(src)
    trace = it.parse_trace(data, str(src))
    if trace.whole or not trace.steps:
        raise it.TraceError(f"{src}: no ProfilerStep#N spans to replicate")
    first = trace.steps[0]
    start = first.span.ts
    # One step's window: until the next step starts, or until its last GPU work ends.
    stop = trace.steps[1].span.ts if len(trace.steps) > 1 else first.wall + start + 1
    period = stop - start
    events = data["traceEvents"]
    window = [e for e in events if isinstance(e, dict) and "ts" in e and start <= float(e["ts"]) < stop]
    others = [e for e in events if isinstance(e, dict) and ("ts" not in e or e.get("ph") == "M")]
    out = []
    for i in range(steps):
        for e in window:
            c = copy.copy(e)
            c["ts"] = float(e["ts"]) + i * period
            if "args" in e:
                c["args"] = dict(e["args"])
                for key in ("External id", "correlation"):
                    if isinstance(c["args"].get(key), int) and c["args"][key]:
                        c["args"][key] += i * ID_STRIDE
            if e.get("cat") == "ac2g" and isinstance(e.get("id"), int):
                c["id"] = e["id"] + i * ID_STRIDE
            if e.get("name") == f"ProfilerStep#{first.number}":
                c["name"] = f"ProfilerStep#{first.number + i}"
            out.append(c)
    data = dict(data, traceEvents=others + out)
    raw = json.dumps(data).encode()
    if dst.suffix == ".gz":
        raw = gzip.compress(raw, compresslevel=6)
    dst.write_bytes(raw)
    return len(raw)


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", type=Path, help="a real trace (.json or .json.gz) with at least one active step")
    p.add_argument("b", type=Path, nargs="?", help="a second trace for the comparison (default: A)")
    p.add_argument("--steps", type=int, default=100, help="active steps in the long trace (default 100)")
    p.add_argument("--runs", type=int, default=5, help="timed runs; the median is shown (default 5)")
    args = p.parse_args()
    if args.steps < 1 or args.runs < 1:
        print("bench_inspect.py: error: --steps and --runs must be >= 1", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        try:
            big_a = Path(tmp) / "a.json"
            size_a = replicate(args.a, args.steps, big_a)
            big_b = big_a
            if args.b is not None:
                big_b = Path(tmp) / "b.json"
                replicate(args.b, args.steps, big_b)
        except it.TraceError as e:
            print(f"bench_inspect.py: error: {e}", file=sys.stderr)
            return 1
        loaded = it.load_trace(big_a)
        n_gpu, n_cpu = sum(len(s.gpu) for s in loaded.steps), sum(len(s.spans) for s in loaded.steps)
        print(f"long trace: {len(loaded.steps)} active steps, {size_a / 1e6:.1f} MB of JSON, "
              f"{n_gpu} GPU activities, {n_cpu} CPU spans")
        it.device_peak(loaded.device_name)  # the datasheet lookup is cached after its first use; time it apart
        t_load = timed(lambda: it.load_trace(big_a), args.runs)
        t_report = timed(lambda: it.report(it.load_trace(big_a)), args.runs)
        t_compare = timed(lambda: it.compare(it.load_trace(big_a), it.load_trace(big_b)), args.runs)
        t0 = time.perf_counter()
        cli = subprocess.run([sys.executable, "inspect_trace.py", str(big_a)], capture_output=True,
                             cwd=Path(__file__).parent)
        t_cli = time.perf_counter() - t0
        print(f"median of {args.runs} runs: load {t_load:.2f} s, load+report {t_report:.2f} s, "
              f"load A+B+compare {t_compare:.2f} s")
        print(f"whole CLI, one run (process start, imports, datasheet lookup): {t_cli:.2f} s, exit {cli.returncode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
