"""The post's MLP on one GPU against tensor parallel over every GPU present: does TP pay, and what does the all-reduce cost?

    python3 bench_tp.py                     # on the GPU machine: the post's sweep on 1 GPU and TP over 2, 4, 8 GPUs
    uv run bench_tp.py --device cpu         # gloo, 2 processes, a tiny shape: the same code path, nothing to quote

At the post's sweep (MxDIMxHIDDEN, M = tokens: bench.py's "post"), eager and fused (fused_geglu, CUDA only), with
and without sequence parallel, and the eager MLP with its all-reduce in 4 overlapped slices (--chunks 4); each
TP variant built as 08_tensor_parallel.py builds it (DTensor's parallelize_module over one mesh of N ranks) and
checked against the whole MLP first (correct before fast).
In the same run, for each N: the bare all-reduce of the MLP's [M, DIM] output, its time, its share of the TP
forward, and its bus bandwidth as nccl-tests counts it (busbw = size / time x 2(N-1)/N).

Timing: every rank runs the same fixed number of calls (a collective needs every rank in step), CUDA events
around each, median per rank; a TP forward takes as long as its slowest rank, so the record keeps the maximum
over ranks. One GPU: the MLP alone, the same timer. The floor is bench.py's (one GPU's GEMM ceiling and copy
bandwidth, measured now): a TP variant above 1.0 of it ran faster than one GPU could.
A CPU run (gloo, 2 processes of one thread each against one thread, fp32, a tiny shape) writes a record marked
"cpu_run": true: its times are of this CPU.
Prints a table, writes the JSON record to --out, the table (.txt) and the chart (.png) beside it.
"""

import importlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bench
import common
from trace_reader.analyzers import ranks
from trace_reader.render.plot import bench_chart_next_to

tp = importlib.import_module("08_tensor_parallel")
SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
CPU_SHAPES = "64x64x256"
CALLS = {"cuda": (20, 50), "cpu": (2, 5)}  # (warm-up, timed) calls per variant: fixed, the same on every rank
TIMEOUT_S = 300  # a rank that stops answering fails the others instead of hanging them
NO_GPU = "bench_tp.py needs a CUDA GPU; torch.cuda.is_available() is False here (or try --device cpu: gloo, tiny)"


def parse_args(argv=None):
    p = bench.Parser(prog="bench_tp.py", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, 2 processes, tiny shapes")
    p.add_argument("--dtype", choices=sorted(bench.DTYPES), default="bf16", help="weights and activations (GPU)")
    p.add_argument("--shapes", type=bench.shape_list, default=None, metavar="SHAPES",
                   help=f"comma-separated MxDIMxHIDDEN (default: bench.py's post sweep; on the CPU {CPU_SHAPES})")
    p.add_argument("--out", type=Path, default=Path("bench_results/bench_tp.json"), help="JSON record to write")
    args = p.parse_args(argv)
    if args.shapes is None:
        args.shapes = bench.shape_list(CPU_SHAPES if args.device == "cpu" else bench.SWEEPS["post"])
    return args


def world_sizes(device):
    """1, then TP over 2, 4, 8 where there are that many GPUs (and over every GPU, if another count); 2 on a CPU."""
    if device == "cpu":
        return [1, 2]
    n = torch.cuda.device_count()
    return sorted({1, n} | {k for k in (2, 4, 8) if k <= n})


def timed_us(fn, device, world):
    """Median µs of fn on this rank over a fixed count of calls; with ranks, the slowest rank's median."""
    warm, reps = CALLS[device]
    with torch.inference_mode():
        for _ in range(warm):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for start, end in pairs:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            us = 1e3 * statistics.median(s.elapsed_time(e) for s, e in pairs)
        else:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            us = statistics.median(times)
    if world > 1:
        t = torch.tensor([us], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        us = t.item()
    return us


CHUNKS = 4  # 08_tensor_parallel.py --chunks: the overlapped variant's slices


def variants(device, world):
    """(mlp, sequence parallel, chunks) for a world size: the MLP's implementations; with TP also sequence parallel,
    and the eager MLP with its all-reduce cut into CHUNKS overlapped slices."""
    mlps = ["eager", "fused"] if device == "cuda" else ["eager"]
    if world == 1:
        return [(m, False, 1) for m in mlps]
    return [(m, sp, 1) for m in mlps for sp in (False, True)] + [("eager", False, CHUNKS)]


def label(world, mlp, sp, chunks, device="cuda"):
    if world == 1:
        return f"1 {'GPU' if device == 'cuda' else 'CPU'} {mlp}"
    return f"TP{world} {mlp}{' sp' if sp else ''}{f' chunks{chunks}' if chunks > 1 else ''}"


def build(M, dim, hidden, dtype, device, mesh, variant, world, rank):
    """The MLP as 08_tensor_parallel.py runs it (one rank: the whole MLP), checked against the whole MLP first;
    returns the forward to time."""
    mlp, sp, chunks = variant
    torch.manual_seed(0)
    whole = SimpleGeGLUMLP(dim, hidden).to(device, dtype).eval()
    x = torch.randn(1, M, dim, device=device, dtype=dtype)
    with torch.inference_mode():
        expected = whole(x)
    if world == 1:
        model = whole
        if mlp == "fused":
            from fused_geglu import FusedGeGLUMLP

            model = FusedGeGLUMLP(dim, hidden).to(device, dtype).eval()
            model.load_state_dict(whole.state_dict())
    else:
        model = tp.tensor_parallel(whole, mesh, sp)
        if mlp == "fused":
            model = tp.FusedShard(model, mesh, sp)
        elif chunks > 1:
            model = tp.ChunkedShard(model, mesh.get_group(), chunks)
        x, expected = tp.shard_of(x, rank, world, sp), tp.shard_of(expected, rank, world, sp)

    def forward():
        y = model(x)
        return y.wait() if isinstance(y, tp.AsyncCollectiveTensor) else y

    with torch.inference_mode():
        err = common.rel_error(forward(), expected)
    if not err <= common.TOLERANCE[dtype]:
        raise AssertionError(f"{label(world, *variant, device)} at {M}x{dim}x{hidden}: relative error {err:.2e}")
    return forward


def measure(shapes, dtype, device, world, rank=0, mesh=None):
    """{shape: {label: µs, "allreduce": µs}} for one world size, the same on every rank."""
    out = {}
    for M, dim, hidden in shapes:
        row = {}
        for variant in variants(device, world):
            if variant[1] and M % world:
                continue  # sequence parallel shards the tokens
            forward = build(M, dim, hidden, dtype, device, mesh, variant, world, rank)
            row[label(world, *variant, device)] = timed_us(forward, device, world)
        if world > 1:  # the collective alone: the all-reduce of the MLP's output, timed the same way
            y = torch.randn(M, dim, device=device, dtype=dtype)
            row["allreduce"] = timed_us(lambda: dist.all_reduce(y), device, world)
        out[f"{M}x{dim}x{hidden}"] = row
    return out


def _worker(rank, world, port, shapes, dtype, device, result):
    """One rank of a TP measurement: a process group, the mesh, every shape; rank 0 writes the numbers."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # as main(): one core per rank
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device, (world,))
        numbers = measure(shapes, dtype, device, world, rank, mesh)
        if rank == 0:
            Path(result).write_text(json.dumps(numbers))
        # every rank done before any tears its group down: a gloo rank whose peer left mid-exchange aborts
        # ("terminate called without an active exception", seen once in a CPU test run under load)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(world, shapes, dtype, device):
    """measure() over `world` processes (spawned: CUDA cannot fork), the numbers handed back through a file."""
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "numbers"
        mp.spawn(_worker, args=(world, port, shapes, dtype, device, str(result)), nprocs=world, join=True)
        return json.loads(result.read_text())


def summarize(shape, per_world, dtype, ceiling, bandwidth):
    """One shape's record: every variant's µs against the one-GPU floor; per N the all-reduce, its share of the TP
    eager forward, its algbw and busbw, and the speed-up of TP eager over one GPU eager."""
    M, dim, hidden = map(int, shape.split("x"))
    itemsize = dtype.itemsize
    floor = bench.roofline(M, dim, hidden, itemsize, ceiling, bandwidth)
    one = next(us for name, us in per_world[1][shape].items() if name.endswith(" eager"))
    entry = {"label": shape, "M": M, "dim": dim, "hidden": hidden, **floor, "variants": {}, "tp": {}}
    for world, numbers in sorted(per_world.items()):
        row = numbers[shape]
        for name, us in row.items():
            if name != "allreduce":
                entry["variants"][name] = {"median_us": us}
        if world > 1:
            size = M * dim * itemsize
            algbw, busbw = ranks.bandwidth("all_reduce", size, row["allreduce"], world)
            eager = row[f"TP{world} eager"]
            entry["tp"][str(world)] = {"allreduce_us": row["allreduce"], "allreduce_bytes": size, "algbw_gbs": algbw,
                                       "busbw_gbs": busbw, "allreduce_share": row["allreduce"] / eager,
                                       "speedup": one / eager}
    return entry


def table_lines(record):
    lines = [f"{record['device']}{' (a CPU run: gloo, nothing to quote)' if record['cpu_run'] else ''}, {record['dtype']}, "
             f"GPU counts {record['world_sizes']}; floor from one {record['device_type']}'s ceilings measured now"]
    for s in record["shapes"]:
        lines.append(f"\n{s['label']} (MxDIMxHIDDEN): one-device floor {s['floor_us']:.1f} µs ({s['bound']}-bound)")
        for name, v in s["variants"].items():
            lines.append(f"  {name:<18}{v['median_us']:12.1f} µs  {s['floor_us'] / v['median_us']:6.2f} of the floor")
        for world, t in s["tp"].items():
            lines.append(f"  TP{world}: all-reduce of {t['allreduce_bytes'] / 2**20:.2f} MiB {t['allreduce_us']:.1f} µs, "
                         f"{t['allreduce_share']:.0%} of TP{world} eager; busbw {t['busbw_gbs']:.3g} GB/s; "
                         f"TP{world} eager {t['speedup']:.2f}x one device")
    return lines


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    dtype = bench.DTYPES[args.dtype] if device == "cuda" else torch.float32  # a CPU without bf16 units: fp32
    sizes = world_sizes(device)
    odd = [f"{M}x{d}x{h}" for M, d, h in args.shapes if h % sizes[-1]]
    if odd:
        print(f"bench_tp.py: hidden of {', '.join(odd)} does not split over {sizes[-1]} ranks", file=sys.stderr)
        return 2
    if device == "cpu":
        torch.set_num_threads(1)  # each rank gets one core, and so does the one-device run: same footing
    if device == "cuda":
        ceiling, bandwidth = bench.gemm_ceiling_tflops(dtype), bench.copy_bandwidth_tbps()
    else:
        ceiling, bandwidth = bench.cpu_ceilings(dtype)
        bandwidth /= 1e3  # GB/s -> TB/s, as roofline() takes it
    try:
        per_world = {1: measure(args.shapes, dtype, device, 1)}
        for world in sizes[1:]:
            per_world[world] = run_ranks(world, args.shapes, dtype, device)
    except AssertionError as e:
        print(f"bench_tp.py: wrong result, nothing timed: {e}", file=sys.stderr)
        return 1
    except mp.ProcessRaisedException as e:
        print(f"bench_tp.py: a rank failed: {str(e).strip().splitlines()[-1][:200]}", file=sys.stderr)
        return 1
    record = {**bench.versions(device), "cpu_run": device == "cpu", "dtype": str(dtype).removeprefix("torch."),
              "world_sizes": sizes, **bench.timing_fields(device == "cuda"),
              "timer": f"{CALLS[device][1]} calls after {CALLS[device][0]} warm-up, the same on every rank; median per "
                       "rank, the slowest rank's kept",
              "ceiling_tflops": ceiling, "copy_tbps": bandwidth,
              "busbw": "nccl-tests: all-reduce busbw = size / time x 2(N-1)/N",
              "shapes": [summarize(f"{M}x{d}x{h}", per_world, dtype, ceiling, bandwidth) for M, d, h in args.shapes]}
    lines = table_lines(record)
    print("\n".join(lines))
    print(bench.write_record(args.out, record, lines))
    print(bench_chart_next_to(record, args.out, "GeGLU MLP forward, one device vs tensor parallel"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
