"""Rank 0's traces of three small CPU training runs, for the comparison's communication part (tests/test_compare_comm.py).

The same tiny MLP (64 -> 256 -> 256 -> 8, batch 32, MSE loss, SGD), trained three ways, each profiled with a plain
torch.profiler loop of this file's own (not common.py's): wait 1, warm-up 1, 3 active steps, shapes recorded.
- ddp: DistributedDataParallel over gloo, 2 ranks, buckets of 0.1 MB (a few all-reduces a step);
- fsdp2: torch.distributed.fsdp.fully_shard on each Linear and on the root, 2 ranks over gloo (all-gathers in
  forward and backward, reduce-scatters in backward);
- single: one process, no process group (no communication at all).
Only rank 0 writes its trace, gzipped: OUTDIR/cpu_<mode>_rank0.json.gz (single: cpu_single.json.gz).

    uv run torchrun --standalone --nproc-per-node 2 --master-port 29613 tests/data/dist_compare/record_dist_compare.py ddp tests/data/dist_compare
    uv run torchrun --standalone --nproc-per-node 2 --master-port 29614 tests/data/dist_compare/record_dist_compare.py fsdp2 tests/data/dist_compare
    uv run python tests/data/dist_compare/record_dist_compare.py single tests/data/dist_compare
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


def model() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))


def main(mode: str, out: Path) -> None:
    torch.set_num_threads(1)  # two ranks share a small machine
    distributed = mode != "single"
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    net = model()
    if mode == "ddp":
        net = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 record_shapes=True) as prof:
        for _ in range(5):
            step()
            prof.step()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        name = "cpu_single" if mode == "single" else f"cpu_{mode}_rank0"
        raw = out / f"{name}.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(out / f"{name}.json.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        print(f"wrote {out / name}.json.gz", flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("ddp", "fsdp2", "single"):
        sys.exit("usage: record_dist_compare.py ddp|fsdp2|single OUTDIR")
    if sys.argv[1] != "single" and "RANK" not in os.environ:
        sys.exit(f"{sys.argv[1]}: run under torchrun --nproc-per-node 2 (see this file's docstring)")
    main(sys.argv[1], Path(sys.argv[2]))
