"""How fast does inspect_trace.py read a long trace, and compare two long steps? Build them, then time it.

    uv run bench_inspect.py                                                          # the eager H200 MLP, 100 steps
    uv run bench_inspect.py tests/data/h200_mlp_eager.json.gz tests/data/h200_mlp_compile.json.gz --steps 2000

The first active step of each trace (every event from its ProfilerStep#k start until the next step starts:
CPU ops, runtime calls, kernels, flow arrows) is copied --steps times with shifted timestamps and fresh
ids, so the long trace has the same structure as the real one. Timed in this process, median of --runs, in
wall and CPU time (on a shared machine the CPU time is the reader's own): load, load+report of A, and load A +
load B + compare (B defaults to A); then the CLI in a child process. Then a long step, --launches kernels of
decoder layers whose GEMMs all share one kernel name, compared with the same layers fused (attention, GeGLU)
and with as many launches of fused layers (compare() alone: the traces are parsed before the clock starts).
Nothing is written outside a temp dir.
"""

from __future__ import annotations

import argparse
import copy
import gc
import gzip
import json
import os
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
    data = it.read_json(src)
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


def decoder_layer(fused: bool) -> list[tuple[str, float, str]]:
    """One decoder layer's kernels (name, µs, launching op), every GEMM one kernel name; fused, the attention
    (bmm, softmax, bmm) is one kernel and GeLU, mul one: which GEMMs stayed is for the alignment to find."""
    attention = [("flash_fwd", 25.0, "aten::_scaled_dot_product_flash_attention")] if fused else [
        ("nvjet", 11.0, "aten::bmm"), ("softmax", 7.0, "aten::_softmax"), ("nvjet", 11.0, "aten::bmm")]
    geglu = [("triton_poi_fused_gelu_mul_0", 5.0, "triton_poi_fused_gelu_mul_0")] if fused else [
        ("gelu", 4.0, "aten::gelu"), ("mul", 4.0, "aten::mul")]
    return ([("rms", 3.0, "aten::mul"), ("nvjet", 20.0, "aten::mm"), ("nvjet", 6.0, "aten::mm"),
             ("nvjet", 6.0, "aten::mm"), ("rope", 2.0, "aten::add")] + attention
            + [("nvjet", 20.0, "aten::mm"), ("residual", 2.0, "aten::add"), ("rms", 3.0, "aten::mul"),
               ("nvjet", 60.0, "aten::mm"), ("nvjet", 60.0, "aten::mm")] + geglu
            + [("nvjet", 60.0, "aten::mm"), ("residual", 2.0, "aten::add")])


def decoder_steps(kernels: list[tuple[str, float, str]], steps: int = 2) -> dict:
    """A trace in kineto's format (CPU op, its launch, the kernel): `steps` steps launching these kernels."""
    events, t, corr = [], 0.0, 0
    for number in range(steps):
        start = t
        for name, dur, op in kernels:
            corr += 1
            events += [
                {"ph": "X", "cat": "cpu_op", "name": op, "ts": t, "dur": 4, "pid": 1, "tid": 1,
                 "args": {"External id": corr}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": 2, "pid": 1,
                 "tid": 1, "args": {"External id": corr, "correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": name, "ts": t + 3, "dur": dur, "pid": 0, "tid": 7,
                 "args": {"External id": corr, "correlation": corr}}]
            t += max(dur, 5) + 1
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "ts": start,
                       "dur": t - start, "pid": 1, "tid": 1, "args": {}})
        t += 10
    return {"traceEvents": events}


def timed(fn, runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of fn: on a machine shared with other work, the CPU time of this process
    is what the reader costs, the wall time also what the others took. What fn returns is freed, and the
    garbage collected, off the clock: the CLI reads a trace once and exits, it never frees one."""
    walls, cpus = [], []
    for _ in range(runs):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        del out
    gc.collect()
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", type=Path, nargs="?", default=Path(__file__).parent / "tests/data/h200_mlp_eager.json.gz",
                   help="a real trace (.json or .json.gz) with at least one active step (default: the eager H200 MLP)")
    p.add_argument("b", type=Path, nargs="?", help="a second trace for the comparison (default: A)")
    p.add_argument("--steps", type=int, default=100, help="active steps in the long trace (default 100)")
    p.add_argument("--runs", type=int, default=5, help="timed runs; the median is shown (default 5)")
    p.add_argument("--launches", type=int, default=2000, help="kernels a step in the compared long steps (2000)")
    args = p.parse_args()
    if args.steps < 1 or args.runs < 1 or args.launches < 1:
        print("bench_inspect.py: error: --steps, --runs and --launches must be >= 1", file=sys.stderr)
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
        t_report = timed(lambda: (t := it.load_trace(big_a), it.report(t)), args.runs)
        t_compare = timed(lambda: (a := it.load_trace(big_a), b := it.load_trace(big_b), it.compare(a, b)), args.runs)
        t0, c0 = time.perf_counter(), os.times()
        cli = subprocess.run([sys.executable, "inspect_trace.py", str(big_a)], capture_output=True,
                             cwd=Path(__file__).parent)
        t_cli, c1 = time.perf_counter() - t0, os.times()
        cpu_cli = c1.children_user + c1.children_system - c0.children_user - c0.children_system  # 0 on Windows
        print(f"median of {args.runs} runs: load {t_load[0]:.2f} s, load+report {t_report[0]:.2f} s, "
              f"load A+B+compare {t_compare[0]:.2f} s")
        print(f"  the same, CPU time of this process: load {t_load[1]:.2f} s, load+report {t_report[1]:.2f} s, "
              f"load A+B+compare {t_compare[1]:.2f} s")
        print(f"whole CLI, one run (process start, imports, datasheet lookup): {t_cli:.2f} s, exit {cli.returncode} "
              f"(CPU {cpu_cli:.2f} s)")
    # Two long steps: the same layers eager and fused (fewer launches fused); then as many launches each, so the
    # fused step holds more layers and some of it pairs with nothing.
    layers = -(-args.launches // len(decoder_layer(False)))
    eager = it.parse_trace(decoder_steps((decoder_layer(False) * layers)[:args.launches]), "<eager>")
    for kernels in (decoder_layer(True) * layers, (decoder_layer(True) * args.launches)[:args.launches]):
        fused = it.parse_trace(decoder_steps(kernels), "<fused>")
        t_long = timed(lambda: it.compare(eager, fused), args.runs)[0]
        print(f"compare a step of {len(eager.steps[0].kernels)} launches with one of {len(fused.steps[0].kernels)} "
              f"(decoder layers, eager vs fused), median of {args.runs} runs: {t_long:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
