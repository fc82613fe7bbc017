"""Profile the post's MLP tensor-parallel over N ranks: each rank a shard of the GEMMs, plus the collectives.

    uv run torchrun --standalone --nproc-per-node 2 08_tensor_parallel.py                  # NCCL on 2 GPUs
    uv run torchrun --standalone --nproc-per-node 2 08_tensor_parallel.py --sequence-parallel
    uv run torchrun --standalone --nproc-per-node 1 08_tensor_parallel.py --mlp fused      # one GPU: the baseline

On a CPU (gloo, two processes), shapes that take seconds:
    uv run torchrun --standalone --nproc-per-node 2 08_tensor_parallel.py --batch 2 --seq 32 --dim 64 --hidden 256 --dtype fp32

The MLP is 03_simple_mlp.py's, on a 1-D device mesh of every rank, through DTensor's parallelize_module:
gate_proj and up_proj ColwiseParallel (each rank holds hidden/N of their rows), down_proj RowwiseParallel (hidden/N
of its columns), so each rank computes a partial sum of the output and one all-reduce per forward adds them.
--sequence-parallel: the input and output stay sharded along the sequence (each rank holds seq/N tokens), so the
all-reduce becomes an all-gather of the input before gate/up and a reduce-scatter of the output after down.
--mlp fused: fused_geglu's Triton kernel on each rank's shard of gate/up (CUDA only), the same collectives.
--chunks C, one rung further: the tokens in C slices, each slice's all-reduce started asynchronously, so it runs
while the next slice's GEMMs do; only the last one is left exposed.

Each rank writes its own trace and table, the rank last in the name
(traces/08_tensor_parallel/64x128x768x3072_bf16_cold_tp2_eager_rank0.json); rank 0 then reads every rank's trace
and prints the merged report: per rank and step the busy time, the collectives, how much of them hid behind
compute, which rank arrived last at each, and their bus bandwidth.

What to look for (guess first, then look; checked on each rank's trace after the run):
- one all-reduce per forward (ncclDevKernel_AllReduce_* on GPUs; gloo:all_reduce on the CPU); with
  --sequence-parallel one all-gather and one reduce-scatter instead (gloo has no reduce-scatter: c10d runs an
  all-reduce of the whole output there, and each rank keeps its shard).
- each rank runs the post's three GEMMs on its shard: 1/N of their FLOPs (GPU only).
- the all-reduce is exposed: the down GEMM's output must be summed before anything can use it, and nothing else
  runs meanwhile, so nearly all of its time adds to the step (GPU only, 2+ ranks).
- with --chunks C: C all-reduces per step, and at least a quarter of their time overlaps compute (GPU only).
- a guess for two runs, not one: N GPUs make the MLP N times faster. At the post's shape the all-reduce of the
  [8192, 768] output costs more than the GEMM time it saves; at 8192 x 4096 -> 14336 it pays. bench_tp.py says.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import importlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               parallelize_module)

import inspect_trace as it
from trace_reader.analyzers import ranks

SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
LAUNCH = "uv run torchrun --standalone --nproc-per-node 2 08_tensor_parallel.py"


def launch(args):
    """The ranks torchrun started (common.torchrun_rank) and this script's own checks, before any rank waits on
    another."""
    rank, world, cuda = common.torchrun_rank(args, LAUNCH)
    if args.hidden % world:
        raise common.Fail(f"--hidden {args.hidden} does not split over {world} ranks: pick a multiple of {world}")
    if args.sequence_parallel and args.seq % world:
        raise common.Fail(f"--sequence-parallel shards the sequence: --seq {args.seq} is not a multiple of {world}")
    if args.mlp == "fused" and not cuda:
        raise common.Fail("--mlp fused runs a Triton kernel, which needs a CUDA GPU; on this machine use --mlp eager")
    return rank, world, cuda


def start(cuda, world, seconds):
    """The process group (common.start_ranks), and a 1-D mesh of every rank for DTensor."""
    common.start_ranks(cuda, seconds)
    return init_device_mesh("cuda" if cuda else "cpu", (world,), mesh_dim_names=("tp",))


def tensor_parallel(model, mesh, sequence_parallel):
    """gate/up split by output rows, down by input columns: one all-reduce of the output per forward. Sequence
    parallel: the input arrives sharded along the sequence (dim 1) and is gathered once for gate and up; the output
    leaves sharded the same way (a reduce-scatter)."""
    plan = {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()}
    if sequence_parallel:
        plan[""] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan["down_proj"] = RowwiseParallel(output_layouts=Shard(1))
    return parallelize_module(model, mesh, plan)


class FusedShard(torch.nn.Module):
    """The fused kernel on this rank's shard of the sharded MLP's weights; the same collectives as its plan."""

    def __init__(self, sharded, mesh, sequence_parallel):
        super().__init__()
        import fused_geglu  # Triton: only for --mlp fused, on a GPU

        self.fused, self.mesh, self.sp = fused_geglu, mesh, sequence_parallel
        # This rank's shards, taken once (inference: no autograd); the kernel reads them where they are
        self.w_gate, self.w_up, self.w_down = (getattr(sharded, n).weight.to_local().detach()
                                               for n in ("gate_proj", "up_proj", "down_proj"))

    def forward(self, x):
        if self.sp:  # gather the tokens of every rank, as PrepareModuleInput does
            x = DTensor.from_local(x, self.mesh, [Shard(1)]).redistribute(self.mesh, [Replicate()]).to_local()
        m = self.fused.geglu(x.reshape(-1, x.shape[-1]), self.w_gate, self.w_up)
        partial = F.linear(m, self.w_down).reshape(*x.shape[:-1], -1)  # this rank's share of the sum
        y = DTensor.from_local(partial, self.mesh, [Partial()])
        return y.redistribute(self.mesh, [Shard(1) if self.sp else Replicate()]).to_local()


class ChunkedShard(torch.nn.Module):
    """One rung further, overlap: the tokens in `chunks` slices, each slice's partial output all-reduced
    asynchronously while the next slice's GEMMs run, so only the last all-reduce has nothing to hide behind."""

    def __init__(self, sharded, group, chunks):
        super().__init__()
        self.group, self.chunks = group, chunks
        self.w_gate, self.w_up, self.w_down = (getattr(sharded, n).weight.to_local().detach()
                                               for n in ("gate_proj", "up_proj", "down_proj"))

    def forward(self, x):
        outs, pending = [], []
        for part in x.reshape(-1, x.shape[-1]).chunk(self.chunks):
            m = F.gelu(F.linear(part, self.w_gate), approximate="tanh") * F.linear(part, self.w_up)
            outs.append(F.linear(m, self.w_down))  # this rank's share of the slice's sum
            pending.append(dist.all_reduce(outs[-1], group=self.group, async_op=True))  # runs while the next slice computes
        for work in pending:
            work.wait()  # on a GPU: the compute stream waits for NCCL's; the host goes on
        return torch.cat(outs).reshape(*x.shape[:-1], -1)


def shard_of(x, rank, world, sequence_parallel):
    return x.chunk(world, dim=1)[rank].contiguous() if sequence_parallel else x


def build(args, run, mesh, rank, world):
    """Every rank builds the same MLP from the same seed, parallelizes it, and checks its output against the whole
    MLP run on this rank alone (correct before fast)."""
    d, h = args.dim, args.hidden
    torch.manual_seed(0)
    whole = SimpleGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    probe = torch.randn(2, 4 * world, d, device=run.device, dtype=run.dtype)
    with torch.no_grad():
        expected = whole(probe)
    model = SimpleGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    model.load_state_dict(whole.state_dict())
    model = tensor_parallel(model, mesh, args.sequence_parallel)
    if args.mlp == "fused":
        model = FusedShard(model, mesh, args.sequence_parallel)
    elif args.chunks > 1:
        model = ChunkedShard(model, mesh.get_group(), args.chunks)
    with torch.no_grad():
        got = model(shard_of(probe, rank, world, args.sequence_parallel))
    common.check_close(run, f"rank {rank}'s TP={world} {args.mlp} MLP", got,
                       shard_of(expected, rank, world, args.sequence_parallel), "the whole MLP on one rank")
    return model


def expectations(args, world, cuda):
    """Guess first, then look: checked on each rank's trace after the run."""
    out = [it.steps(args.active, "tp_mlp_fwd")]
    if args.sequence_parallel:  # gloo has no reduce-scatter: c10d all-reduces the whole output, each rank keeps its shard
        out += [ranks.collectives_per_step("all_gather", 1, world),
                ranks.collectives_per_step("reduce_scatter" if cuda else "all_reduce", 1, world)]
    else:
        out.append(ranks.collectives_per_step("all_reduce", args.chunks, world))
    if args.mlp == "eager":  # the fused kernel's gate/up GEMM is a Triton kernel of its own
        out.append(ranks.gemms_per_step(3 * args.chunks))
    # chunked, up to (chunks - 1) / chunks of the all-reduces can hide behind the next slices' GEMMs
    out.append(ranks.communication_overlapped(0.25) if args.chunks > 1 else ranks.communication_exposed(0.5))
    return out


def main():
    p = common.parser(__doc__, batch=64, seq=128, dim=768, hidden=3072)
    p.add_argument("--sequence-parallel", action="store_true",
                   help="shard input and output along the sequence: all-gather + reduce-scatter for the all-reduce")
    p.add_argument("--mlp", choices=["eager", "fused"], default="eager",
                   help="PyTorch ops, or fused_geglu's Triton kernel on each rank's shard (CUDA only)")
    p.add_argument("--chunks", type=common.int_arg(1, 64), default=1, metavar="C",
                   help="overlap: the tokens in C slices, each slice's all-reduce running while the next computes")
    p.add_argument("--timeout", type=common.int_arg(5, 3600), default=120, metavar="S",
                   help="seconds a rank waits for the others (start-up and each collective) before failing")
    args = p.parse_args()
    if args.plot or args.open:
        raise common.Fail("--plot and --open read one trace: run inspect_trace.py on a rank's trace after the run")
    if args.chunks > 1 and (args.sequence_parallel or args.mlp != "eager" or args.compile):
        raise common.Fail("--chunks overlaps the all-reduce of the eager MLP: without --sequence-parallel, --mlp fused "
                          "or --compile")
    rank, world, cuda = launch(args)
    common.whole_lines(sys.stdout)
    b, s, d, h = args.batch, args.seq, args.dim, args.hidden
    # the whole MLP (built on every rank to check the shards against) and this rank's shard of it; x and y whole,
    # the four [tokens, hidden / N] activations of this rank's share
    run = common.setup(__file__, args, elements=3 * d * h + 3 * d * h // world + 2 * b * s * d + 4 * b * s * h // world)
    run.rank = rank
    mesh = start(cuda, world, args.timeout)
    try:
        if rank == 0:
            common.describe(run)
            print(f"tensor parallel over {world} rank(s), {dist.get_backend()}; "
                  f"{'sequence parallel, ' if args.sequence_parallel else ''}MLP {args.mlp}")
        model = build(args, run, mesh, rank, world)
        forward = torch.compile(model) if args.compile else model
        torch.manual_seed(1)
        x = shard_of(torch.randn(b, s, d, device=run.device, dtype=run.dtype), rank, world, args.sequence_parallel)

        @torch.no_grad()
        def step():
            y = forward(x)
            # DTensor returns the output before its collective is done: wait here, inside the step, as its user would
            return y.wait() if isinstance(y, AsyncCollectiveTensor) else y

        flags = f"_tp{world}" + "_sp" * args.sequence_parallel + "_fused" * (args.mlp == "fused") + \
            (f"_chunks{args.chunks}" if args.chunks > 1 else "")
        prof = common.profile(run, step, "tp_mlp_fwd")
        trace, table = common.export(run, prof, f"{b}x{s}x{d}x{h}", flags)
        dist.barrier()  # every rank's trace is on disk before rank 0 reads them all
        common.rank_report(run, trace, table, expectations(args, world, cuda), world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    common.main(main)
