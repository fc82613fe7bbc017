"""Distributed CPU traces from a harness that is not the suite's: the fixtures tests/data/dist/cpu_*_rank<R>.json.gz.

Plain torch.profiler as people write it for data parallel training: no record_function annotations of ours, one
trace per rank exported by on_trace_ready with `_rank{r}` in its name, gloo over 2 CPU processes, a 2-layer
`transformers` Llama from a tiny LlamaConfig (random weights, no Hub), AdamW, schedule(wait=1, warmup=1, active=3).
The reader (trace_reader/ranks.py) was not tuned on these; tests/test_dist_traces.py checks what it says about them
against the raw JSON.

Runs (one torchrun each; --case picks one):
    ddp          DDP, small buckets (bucket_cap_mb=0.1: several all-reduces overlap backward)
    ddp_slow1    the same, rank 1 sleeps 10 ms before backward in the second active step only
    ddp_slowall  the same, rank 1 sleeps 10 ms before backward in every step
    ddp_accum    DDP, 2 micro-batches per optimizer step, no_sync() on the first
    fsdp2        FSDP2 (torch.distributed.fsdp.fully_shard per decoder layer and at the root)
    fsdp2_keep   the same with reshard_after_forward=False: the parameters stay gathered from forward to backward,
                 so backward all-gathers nothing
    ddp_again    `ddp` recorded again, later: rank 1 of it beside rank 0 of `ddp` is two runs, not one

    for r in ddp ddp_slow1 ddp_slowall ddp_accum fsdp2 fsdp2_keep ddp_again; do
        uv run torchrun --standalone --nproc-per-node 2 --master-port $((20000 + RANDOM % 40000)) \\
            tests/data/dist/record_cpu_dist.py --case $r --out tests/data/dist
    done

and `--case ddp --tag busy` on a CPU busy with other work (cpu_ddp_busy: gloo's threads write their spans' ends
late). Where and with which torch each was recorded: cpu_dist_record_log.txt.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

RUNS = ("ddp", "ddp_slow1", "ddp_slowall", "ddp_accum", "fsdp2", "fsdp2_keep", "ddp_again")
SLOW_S = 0.010  # rank 1's sleep before backward
SLOW_STEP = 3  # ddp_slow1: ProfilerStep#3, the second active one (step 0 waits, 1 warms up, 2-4 are recorded)


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # every rank starts from the same weights, as DDP expects (it broadcasts them anyway)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=RUNS, required=True)
    p.add_argument("--out", type=Path, default=Path("tests/data/dist"))
    p.add_argument("--tag", default="", help="a word for the file names (cpu_<case>_<tag>_rank<R>)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # two ranks on a 2-core machine: one intra-op thread each
    net = model()
    if a.case.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # on a GPU machine the default mesh is CUDA's
        keep = {"reshard_after_forward": False} if a.case == "fsdp2_keep" else {}
        for layer in net.model.layers:
            fully_shard(layer, mesh=mesh, **keep)
        fully_shard(net, mesh=mesh, **keep)
        wrapped = net
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(net, bucket_cap_mb=0.1)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    micro = 2 if a.case == "ddp_accum" else 1
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as data parallel is
    batches = [torch.randint(0, 256, (2, 32), generator=g) for _ in range(micro)]

    def loss_of(ids):
        return wrapped(input_ids=ids, labels=ids).loss

    def step(i: int) -> None:
        slow = rank == 1 and (a.case == "ddp_slowall" or (a.case == "ddp_slow1" and i == SLOW_STEP))
        for m, ids in enumerate(batches):
            last = m == micro - 1
            if last:
                loss = loss_of(ids) / micro
                if slow:
                    time.sleep(SLOW_S)  # the straggler: late to every collective of this backward
                loss.backward()
            else:
                with wrapped.no_sync():  # no all-reduce for this micro-batch: gradients accumulate locally
                    (loss_of(ids) / micro).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    a.out.mkdir(parents=True, exist_ok=True)
    name = f"cpu_{a.case}{'_' + a.tag if a.tag else ''}_rank{rank}.json.gz"
    done = lambda prof: prof.export_chrome_trace(str(a.out / name))  # noqa: E731  (.gz: torch gzips it)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 record_shapes=True, on_trace_ready=done) as prof:
        for i in range(5):
            step(i)
            prof.step()
    dist.barrier()
    if rank == 0:
        print(f"wrote {a.out}/{name.replace('rank0', 'rank*')} (torch {torch.__version__}, pid {os.getpid()})",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
