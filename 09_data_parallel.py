"""Profile a data-parallel training step over N ranks: DDP's gradient buckets, or FSDP2's sharded parameters.

    uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py                   # DDP, NCCL on 2 GPUs
    uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py --accumulate 2 --bucket-cap-mb 0.02
    uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py --slow-rank 1     # rank 1 a straggler
    uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py --dp fsdp         # FSDP2 (fully_shard)
    uv run torchrun --standalone --nproc-per-node 1 09_data_parallel.py                   # one GPU: a group of one

(the second: 2 micro-batches a step, gradients in buckets of 0.02 MiB: one per weight at the post's shape)

On a CPU (gloo, two processes), a shape that takes seconds; with --bucket-cap-mb 0.02 its 48 KiB of gradients
fill 2 buckets (DDP's default 25 MiB holds them in one):
    uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py --batch 2 --seq 16 --dim 32 --hidden 64 --dtype fp32

Every rank holds the whole model (07_train_step.py's --layers of the post's MLP, AdamW) and trains it on its own
data: --batch x --seq tokens per rank and micro-batch. One profiler step is one optimizer step: zero_grad, then per
micro-batch record_function("forward") around the forward and its loss and "backward" around loss.backward(),
then "optimizer" around opt.step(); all of it inside "train_step". Before profiling, every rank checks its
gradients against the whole model's on every rank's data (correct before fast).
--dp ddp: DistributedDataParallel. Its gradients are all-reduced (averaged over the ranks) in buckets of about
--bucket-cap-mb MiB, each bucket as soon as its last gradient is ready, while backward computes the rest.
--dp fsdp: FSDP2, torch.distributed.fsdp.fully_shard on each MLP and on the whole: each rank keeps 1/N of every
parameter, all-gathers an MLP's parameters before its forward (and again before its backward: resharded after
forward), and reduce-scatters its gradients in backward, each rank keeping the shard it updates.
--accumulate N: N micro-batches per optimizer step; gradient sync only in the last one's backward (DDP's
no_sync(), FSDP2's set_requires_gradient_sync(False) on the others).
--slow-rank R: rank R sleeps 20 ms (SLOW_MS, inside record_function("slow_rank_sleep")) before each backward, a
deliberate straggler.

Each rank writes its own trace and table (..._rank0.json, ..._rank1.json); rank 0 prints its report, then the
merged report of every rank.

What to look for (guess first, then look; checked on every rank's trace after the run):
- DDP's buckets overlap backward: every all-reduce starts inside backward, and with several buckets the first
  one starts before backward's last gradient is ready (a bucket of the last layer goes while the first layers'
  gradients are still computed). Backward ends with DDP waiting for them all: that wait is backward's time.
- with --accumulate N: N forward/backward pairs a step, and still one round of all-reduces: every one in the
  last micro-batch's backward, as many as the buckets (as many as without accumulation).
- FSDP2: every step all-gathers in forward and again in backward, and reduce-scatters only in backward (on
  gloo, which has no reduce-scatter of its own here, c10d may run it as something else: the check says so).
- with --slow-rank R: R arrives last at the collectives of backward (the straggler), and every other rank waits
  for it inside backward: its backward lasts at least half of R's sleep longer than R's.
- a guess for two runs, not one: the all-reduce of 2 x the parameters' bytes (busbw, nccl-tests' convention) per
  step is the price of DP; compare a DDP run with FSDP2's (all-gathers and reduce-scatters of the same bytes,
  plus the all-gathers again in backward) in their merged reports.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import contextlib
import importlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from trace_reader.analyzers import training_expect
import inspect_trace as it
from trace_reader.analyzers import data_parallel

train_step = importlib.import_module("07_train_step")  # its MLPStack: --layers of the post's MLP in a row
SimpleGeGLUMLP = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP
LAUNCH = "uv run torchrun --standalone --nproc-per-node 2 09_data_parallel.py"
SLOW_MS = 20.0  # --slow-rank's sleep before each backward: well above a tiny CPU step's noise (a few ms)
PROBE = (2, 8)  # batch x seq of each rank's micro-batches in the gradient check: small at any --dim


def expectations(args, world, buckets=None):
    """Guess first, then look: checked on every rank's trace after the run. `buckets`: DDP's bucket count, where
    known (the script asks DDP; a saved trace does not say)."""
    out = [it.steps(args.active, "train_step"), training_expect.phases_present(),
           data_parallel.micro_batches(args.accumulate)]
    if args.dp == "ddp":
        out += [data_parallel.buckets_overlap_backward(world),
                data_parallel.all_reduces_once_per_step(world, args.accumulate, buckets)]
    else:
        # a saved trace of another harness's may keep the parameters gathered (reshard_after_forward=False)
        out.append(data_parallel.fsdp_collectives(world, args.accumulate, getattr(args, "reshards", True)))
    if args.slow_rank is not None:
        out += [data_parallel.straggler(args.slow_rank, world, SLOW_MS * 1e3),
                data_parallel.others_wait_in_backward(args.slow_rank, world, SLOW_MS * 1e3)]
    return out


def build(args, run, world):
    """The same MLPs on every rank (one seed), wrapped for DDP or sharded for FSDP2; and the whole model, unwrapped,
    to check the gradients against."""
    torch.manual_seed(0)
    blocks = [SimpleGeGLUMLP(args.dim, args.hidden) for _ in range(args.layers)]
    model = train_step.MLPStack(blocks).to(run.device, run.dtype).train()
    whole = train_step.MLPStack([SimpleGeGLUMLP(args.dim, args.hidden) for _ in range(args.layers)])
    whole = whole.to(run.device, run.dtype).train()
    whole.load_state_dict(model.state_dict())
    if args.dp == "ddp":
        # bucket_cap_mb=None is DDP's own default: 25 MiB, its first bucket 1 MiB
        return DistributedDataParallel(model, device_ids=[run.device.index] if run.cuda else None,
                                       bucket_cap_mb=args.bucket_cap_mb), whole
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(run.device.type, (world,))
    for block in model.blocks:  # one all-gather and one reduce-scatter per MLP, not one for the whole model
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh), whole


def gradient_sync(args, model, last):
    """Sync gradients only in the last micro-batch of a step: DDP's no_sync() around the others' forward and
    backward; FSDP2 asked not to reduce-scatter until the last one."""
    if args.dp == "fsdp":
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else model.no_sync()


def data(args, run, rank, batch, seq):
    """Each rank's micro-batches (input, target), different on every rank, the same in every step."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [tuple(torch.randn(batch, seq, args.dim, generator=g).to(run.device, run.dtype) for _ in range(2))
            for _ in range(args.accumulate)]


def check_gradients(args, run, model, whole, rank, world):
    """Correct before fast: one step's gradients on every rank, through DDP or FSDP2 and the micro-batches, are
    those of the whole model on every rank's data at once (the mean loss over all of it)."""
    mine = data(args, run, rank, *PROBE)
    for i, (x, target) in enumerate(mine):
        last = i == len(mine) - 1
        with gradient_sync(args, model, last):
            (F.mse_loss(model(x), target) / args.accumulate).backward()
    everyone = [pair for r in range(world) for pair in data(args, run, r, *PROBE)]
    loss = sum(F.mse_loss(whole(x), target) for x, target in everyone) / len(everyone)
    loss.backward()
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    common.check_close(run, f"rank {rank}'s {args.dp.upper()} gradients", torch.cat([g.flatten() for g in grads]),
                       torch.cat([p.grad.flatten() for p in whole.parameters()]),
                       f"the whole model's on the data of {common.plural(world, 'rank')}")
    model.zero_grad(set_to_none=True)


def bucket_count(model) -> int | None:
    """How many buckets DDP all-reduces (after the rebuild at its second step); None where this torch does not say."""
    try:
        return int(model._get_ddp_logging_data()["num_buckets_reduced"])  # noqa: SLF001 - DDP's own logging data
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
        return None


def main():
    p = common.parser(__doc__, batch=64, seq=128, dim=768, hidden=3072)
    p.add_argument("--layers", type=common.int_arg(1, 1000), default=2, help="MLPs in a row (07_train_step.py's)")
    p.add_argument("--dp", choices=["ddp", "fsdp"], default="ddp",
                   help="DistributedDataParallel, or FSDP2 (fully_shard on each MLP and on the whole model)")
    p.add_argument("--bucket-cap-mb", type=common.float_arg(0, 1 << 16), default=None, metavar="MB",
                   help="DDP's bucket_cap_mb: gradients all-reduced in buckets of about this many MiB "
                        "(default: DDP's own, 25 MiB, its first bucket 1 MiB)")
    p.add_argument("--accumulate", type=common.int_arg(1, 64), default=1, metavar="N",
                   help="micro-batches per optimizer step; gradients synced in the last one only (DDP's no_sync(), "
                        "FSDP2's set_requires_gradient_sync(False) on the others)")
    p.add_argument("--slow-rank", type=common.int_arg(0, 1 << 16), default=None, metavar="R",
                   help=f"a deliberate straggler: rank R sleeps {SLOW_MS:g} ms before each backward")
    p.add_argument("--timeout", type=common.int_arg(5, 3600), default=120, metavar="S",
                   help="seconds a rank waits for the others (start-up and each collective) before failing")
    args = p.parse_args()
    if args.plot or args.open:
        raise common.Fail("--plot and --open read one trace: run inspect_trace.py on a rank's trace after the run")
    if args.compile:
        raise common.Fail("--compile: this rung profiles DDP and FSDP2 eager (compiled DDP splits the graph at "
                          "bucket boundaries, another lesson); run without --compile")
    if args.bucket_cap_mb is not None and args.dp != "ddp":
        raise common.Fail("--bucket-cap-mb sets DDP's buckets: with --dp ddp only")
    rank, world, cuda = common.torchrun_rank(args, LAUNCH)
    if args.slow_rank is not None and args.slow_rank >= world:
        raise common.Fail(f"--slow-rank {args.slow_rank}: there are {world} rank(s), 0 to {world - 1}")
    common.whole_lines(sys.stdout)
    b, s, d, h, L = args.batch, args.seq, args.dim, args.hidden, args.layers
    # the model and the whole one beside it, gradients and two moments; per micro-batch the input and target,
    # per layer four [tokens, hidden] activations and a few [tokens, dim] ones
    run = common.setup(__file__, args, elements=5 * L * 3 * d * h + b * s * (2 * args.accumulate + L * (4 * h + 4 * d)))
    run.rank = rank
    common.start_ranks(cuda, args.timeout)
    try:
        if rank == 0:
            common.describe(run)
            print(f"{args.dp.upper()} over {world} rank(s), {dist.get_backend()}; {common.plural(L, 'MLP')}, "
                  f"{args.accumulate} micro-batch{'es' if args.accumulate > 1 else ''} of {b}x{s} tokens per rank and step"
                  + (f", rank {args.slow_rank} sleeps {SLOW_MS:g} ms before each backward"
                     if args.slow_rank is not None else ""))
        model, whole = build(args, run, world)
        check_gradients(args, run, model, whole, rank, world)
        del whole
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        batches = data(args, run, rank, b, s)
        slow = rank == args.slow_rank

        def step():
            opt.zero_grad(set_to_none=True)
            for i, (x, target) in enumerate(batches):
                with gradient_sync(args, model, last=i == len(batches) - 1):
                    with record_function("forward"):
                        loss = F.mse_loss(model(x), target) / args.accumulate  # the mean over the micro-batches
                    if slow:
                        with record_function("slow_rank_sleep"):
                            time.sleep(SLOW_MS / 1e3)
                    with record_function("backward"):
                        loss.backward()  # DDP: buckets all-reduced as they fill, then waited for, all in here
            with record_function("optimizer"):
                opt.step()

        flags = f"_dp{world}-{args.dp}" + (f"_acc{args.accumulate}" if args.accumulate > 1 else "") + \
            (f"_bucket{args.bucket_cap_mb:g}".replace(".", "p") if args.bucket_cap_mb is not None else "") + \
            (f"_slow{args.slow_rank}" if args.slow_rank is not None else "")
        prof = common.profile(run, step, "train_step")
        trace, table = common.export(run, prof, f"mlp-{L}L_{b}x{s}x{d}x{h}", flags)
        buckets = bucket_count(model) if args.dp == "ddp" else None
        dist.barrier()  # every rank's trace is on disk before rank 0 reads them all
        common.rank_report(run, trace, table, expectations(args, world, buckets), world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    common.main(main)
