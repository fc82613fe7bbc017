"""Training traces from harnesses that are not the suite's: the fixtures tests/data/train_foreign/cpu_*.json.gz.

Plain torch.profiler around a training loop, as people write it at work: no record_function of their own, a
2-layer Llama from `transformers` built from a tiny config (random weights, nothing downloaded), AdamW.
- accum: gradient accumulation, 2 micro-batches per optimizer step, one process;
- ddp_accum: the same under DistributedDataParallel over gloo, 2 ranks, `no_sync()` on the first micro-batch
  (only the last backward all-reduces): `_rank0` / `_rank1`, rank 0's committed; ddp_gbv: the same with
  `gradient_as_bucket_view=True`;
- fsdp: FSDP2 (`fully_shard` on each decoder layer and the root) over gloo, 2 ranks, rank 0's committed;
- compile_break: a torch.compile'd function that runs forward and calls loss.backward() (Dynamo breaks the graph
  there, and the backward runs from AOTAutograd's compiled backward);
- compile_recompile: the same, with the batch changed in the first active step (dynamic=False: a recompile, the
  compiler's own work inside the profiled step);
- compiled_autograd: torch._dynamo.config.compiled_autograd on: the backward graph compiled by Dynamo.

    uv run python tests/data/train_foreign/record_train.py OUTDIR     # about two minutes on 2 cores
    python3 tests/data/train_foreign/record_train.py OUTDIR cuda      # the GPU machine: h100_* / h200_*, one rank
    ... OUTDIR [cuda] --ranks-only                                      # the DDP and FSDP runs alone

On a GPU the same runs in bf16 (the model on the GPU, a GPU lane in each trace); DDP and FSDP run as one rank over
NCCL (a group of one: the gradients' hooks, buckets and callbacks run, no collective kernel). The GPU fixtures
committed were recorded on an H100 (torch 2.11, triton 3.6, transformers 5.17); compile_recompile's is left out
(4 MB: Inductor's autotuning inside the profile).

torch.profiler's schedule(wait=1, warmup=1, active=2); shapes recorded. tests/test_training_foreign.py checks what
the reader says about them against truths computed from the raw JSON.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
CUDA = "cuda" in sys.argv[2:]
DEV = "cuda" if CUDA else "cpu"
# the files' prefix: the GPU's model (h100_, h200_), or cpu_
PREFIX = next((m.lower() for m in ("H100", "H200") if m in torch.cuda.get_device_name()), "gpu") if CUDA else "cpu"
ACT = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if CUDA else [ProfilerActivity.CPU]
ACTIVE = 2


def llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).to(DEV, torch.bfloat16 if CUDA else torch.float32).train()


def save(prof, name: str) -> None:
    raw = OUT / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(OUT / f"{PREFIX}_{name}.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"wrote {PREFIX}_{name}.json.gz", flush=True)


def run(name: str, step, steps: int = 2 + ACTIVE, before=None) -> None:
    with profile(activities=ACT, record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE)) as p:
        for i in range(steps):
            if before is not None:
                before(i)
            step()
            p.step()
    save(p, name)


def accumulation(model, opt, ids, ddp: bool) -> callable:
    micro = ids.chunk(2)

    def step():
        opt.zero_grad(set_to_none=True)
        for i, part in enumerate(micro):
            last = i == len(micro) - 1
            ctx = model.no_sync() if ddp and not last else _nothing()
            with ctx:
                model(part, labels=part).loss.backward()
        opt.step()
    return step


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def one_process() -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (4, 16), device=DEV)
    m = llama()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    run("accum", accumulation(m, opt, ids, ddp=False))

    # compiled forward + backward in one function: Dynamo breaks the graph at loss.backward()
    m = llama()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    @torch.compile(dynamic=False)
    def fwd_bwd(x):
        loss = m(x, labels=x).loss
        loss.backward()
        return loss

    def train_compiled():
        opt.zero_grad(set_to_none=True)
        fwd_bwd(ids)
        opt.step()

    for _ in range(2):
        train_compiled()  # compiled before the profile
    run("compile_break", train_compiled)

    # the same, but the first active step sees another batch: Dynamo recompiles inside the profile
    shapes = {"ids": ids}

    def new_batch(i):
        shapes["ids"] = torch.randint(0, 128, (6, 16), device=DEV) if i == 2 else ids

    def train_recompiled():
        opt.zero_grad(set_to_none=True)
        fwd_bwd(shapes["ids"])
        opt.step()

    run("compile_recompile", train_recompiled, before=new_batch)

    # compiled autograd: the backward graph itself compiled by Dynamo
    torch._dynamo.reset()
    m = llama()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    compiled = torch.compile(m)

    def train_ca():
        opt.zero_grad(set_to_none=True)
        with torch._dynamo.compiled_autograd._enable(torch.compile):
            compiled(ids, labels=ids).loss.backward()
        opt.step()

    for _ in range(2):
        train_ca()
    run("compiled_autograd", train_ca)


def rank_main(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if CUDA:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (4, 16))[rank * 2:(rank + 1) * 2].repeat(2, 1).to(DEV)  # this rank's 4 sequences
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = DDP(llama(), device_ids=[rank] if CUDA else None)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    run(f"ddp_accum_rank{rank}", accumulation(m, opt, ids, ddp=True))
    # the same with gradient_as_bucket_view=True: the reducer copies no bucket back at the end of backward
    g = DDP(llama(), device_ids=[rank] if CUDA else None, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(g.parameters(), lr=1e-3)
    run(f"ddp_gbv_rank{rank}", accumulation(g, opt, ids, ddp=True))

    from torch.distributed.fsdp import fully_shard

    f = llama()
    for layer in f.model.layers:
        fully_shard(layer)
    fully_shard(f)
    opt = torch.optim.AdamW(f.parameters(), lr=1e-3)

    def fsdp_step():
        opt.zero_grad(set_to_none=True)
        f(ids, labels=ids).loss.backward()
        opt.step()

    run(f"fsdp_rank{rank}", fsdp_step)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    import torch.multiprocessing as mp

    ranks = 1 if CUDA else 2  # one GPU on the machine that records them
    mp.spawn(rank_main, args=(ranks, free_port()), nprocs=ranks)
    if "--ranks-only" not in sys.argv:
        one_process()
