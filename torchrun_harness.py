"""A process that torchrun started once per rank (08, 09): the launch checked, its printed lines whole, its group.

- `torchrun_rank()`  (rank, world size, CUDA?) from torchrun's environment, checked before any rank waits for another
- `whole_lines()`    each printed line leaves in one write, so the ranks' lines on one terminal do not run together
- `start_ranks()`    the process group: NCCL between GPUs, gloo between CPU processes, with a timeout

The scripts call these as common.<name> (common.py re-exports them), and rank 0's merged report of every rank is
common.rank_report(), beside show(). This file imports torch and safe_output, never common.
"""

from __future__ import annotations

import argparse
import os

import torch

from safe_output import Fail

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_rank(args: argparse.Namespace, launch: str) -> tuple[int, int, bool]:
    """(rank, world size, CUDA?) of a process torchrun started, checked before any rank waits on another, so a bad
    launch fails on every rank in one line instead of hanging in init_process_group. `launch`: the command to
    suggest to someone who ran the script without torchrun. On a GPU, the rank's own GPU becomes the current one
    (before setup(), which sizes its free memory)."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise Fail(f"not started by torchrun (no {', '.join(missing)} in the environment); run: {launch}")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except ValueError:
        raise Fail("RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be whole numbers; start the script "
                   f"with torchrun: {launch}") from None
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if cuda and local_world > torch.cuda.device_count():
        raise Fail(f"{local_world} ranks on this machine but {torch.cuda.device_count()} GPU(s): one rank "
                   f"per GPU; use --nproc-per-node {torch.cuda.device_count()} (or --device cpu for gloo)")
    if cuda:
        torch.cuda.set_device(local)
    return rank, world, cuda


def whole_lines(stream) -> None:
    """Every rank prints to the same terminal or file, so each line must leave in one write, or two ranks' lines run
    together ("check: rank 0's ...check: rank 1's ..."): unbuffered (PYTHONUNBUFFERED=1, python -u) print() writes
    a line and its newline apart, and block-buffered (a pipe, a file) a flush can fall mid-line. Line buffering
    writes each printed line whole."""
    reconfigure = getattr(stream, "reconfigure", None)  # a StringIO (a test's captured stdout) has none
    if reconfigure is not None:
        reconfigure(line_buffering=True, write_through=False)


def start_ranks(cuda: bool, seconds: float) -> None:
    """NCCL between GPUs, gloo between CPU processes; a rank that stops answering fails the others after `seconds`
    instead of hanging them."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=seconds))
