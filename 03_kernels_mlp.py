"""Profile Liger's hand-written GeGLU MLP, loaded with the `kernels` library: fusion without a compiler.

    uv run 03_kernels_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072

What to look for in the trace (Perfetto, or the report printed below):
- three aten::linear groups (gate, up, down: the same cuBLAS GEMMs as eager) and one LigerGELUMulFunction
  group running the Triton kernel _geglu_tanh_forward_kernel: gelu(gate) * up in one pass over memory.
- no Torch-Compiled Region, no Dynamo guards, no recompiles when the shape changes.

The kernel comes from the Hugging Face Hub (kernels-community/liger-kernels, version 1). When the Hub cannot be
reached (offline, HF_HUB_OFFLINE=1, a firewall) the script says so and uses LigerGEGLUMLP from the liger-kernel
package: the same module and the same Triton kernel. Liger's kernel needs a CUDA GPU (its libdevice tanh does not
run in Triton's CPU interpreter).
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import importlib
import importlib.util
import logging
import math
import os
from dataclasses import dataclass

import torch

import inspect_trace as it

HUB_REPO = "kernels-community/liger-kernels"
HUB_TIMEOUT = os.environ.get("HUB_TIMEOUT", "20")  # seconds; a firewall can otherwise hang for minutes


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    steps = it.steps(args.active, "mlp_fwd")
    if args.compile:  # not in the post: does Inductor keep Liger's hand-written kernel? Look.
        return [
            steps,
            it.kernel(r"^_geglu_tanh_forward_kernel$", per_step=1),
        ]
    return [
        steps,
        it.cpu_op("aten::linear", per_step=3),
        it.cpu_op("LigerGELUMulFunction", per_step=1),
        it.kernels_per_step(4, "3 GEMMs + Liger's fused GeGLU kernel"),
        it.kernel(r"^_geglu_tanh_forward_kernel$", per_step=1),
    ]


@dataclass
class Config:  # the fields of a transformers config that LigerGEGLUMLP reads
    hidden_size: int
    intermediate_size: int
    hidden_act: str = "gelu_pytorch_tanh"


def hub_timeout() -> float:
    try:
        seconds = float(HUB_TIMEOUT)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 3600:  # also refuses nan
        raise common.Fail(f"HUB_TIMEOUT must be a number of seconds between 0 and 3600, got {HUB_TIMEOUT!r}")
    return seconds


def liger_layers():
    """The post's get_kernel(...) line, with a bounded wait and an offline fallback to the liger-kernel package."""
    seconds = hub_timeout()
    try:
        from kernels import get_kernel

        logging.getLogger("kernels").setLevel(logging.ERROR)  # its offline warnings: our one line below says it
        layers = common.call_with_timeout(lambda: get_kernel(HUB_REPO, version=1).layers, seconds)
        return layers, f"{HUB_REPO} (Hugging Face Hub, version 1)"
    except Exception as e:  # noqa: BLE001 - any failure to reach or load the Hub kernel means: fall back
        reason = (str(e).strip().split(". ")[0].splitlines() or ["no details"])[0][:160]
        if importlib.util.find_spec("liger_kernel") is None:
            raise common.Fail(f"Hugging Face Hub kernel not available ({type(e).__name__}: {reason}), and the "
                              "liger-kernel package that stands in for it offline is not installed: `uv sync` "
                              "installs it (Linux), or `pip install liger-kernel`") from None
        print(f"Hugging Face Hub kernel not available ({type(e).__name__}: {reason}); "
              "using LigerGEGLUMLP from the liger-kernel package (same Triton kernel)")
        from liger_kernel.transformers import geglu

        return geglu, "liger-kernel package"


LIGER_H200_TRACE = common.ROOT / "tests/data/h200_liger.json.gz"  # this script's trace, recorded on an H200
ON_CPU = (f"Liger's Triton kernel needs a CUDA GPU (Triton's CPU interpreter cannot run its libdevice tanh), so the "
          f"script stops at once with exit code 2, before reaching for the Hub. Open the H200 trace instead: "
          f"{common.uv_run('inspect_trace.py', '--open', LIGER_H200_TRACE)}; or see the same fusion on the CPU: "
          f"{common.uv_run('03_simple_mlp.py', '--compile')}")


def main():
    args = common.parser(__doc__, on_cpu=ON_CPU, batch=64, seq=128, dim=768, hidden=3072).parse_args()
    tokens, d, h = args.batch * args.seq, args.dim, args.hidden
    hub_timeout()  # bad input first: one line before any work
    no_triton = importlib.util.find_spec("triton") is None  # Triton has Linux wheels only (see pyproject.toml)
    # Before setup, whose "--device cuda, but no CUDA GPU" would suggest --device cpu, which cannot run this either;
    # before the Hub: no point waiting up to HUB_TIMEOUT for a kernel that cannot run
    if args.device == "cpu" or not torch.cuda.is_available() or no_triton:
        raise common.Fail("Liger's Triton kernel needs a CUDA GPU" + (" and Triton, which installs on Linux only"
                          if no_triton else "") + ". Read the run it makes on an H200: "
                          f"{common.uv_run('inspect_trace.py', LIGER_H200_TRACE)}, or in Perfetto: "
                          f"{common.uv_run('inspect_trace.py', '--open', LIGER_H200_TRACE)}; the same fusion on this "
                          f"machine: {common.uv_run('03_simple_mlp.py', '--compile')} (the fused C++ kernel, the CPU twin)")
    run = common.setup(__file__, args, elements=6 * d * h + 3 * tokens * d + 4 * tokens * h)
    common.describe(run)

    layers, source = liger_layers()
    print(f"LigerGEGLUMLP from {source}")

    model = layers.LigerGEGLUMLP(Config(d, h)).to(run.device, run.dtype).eval()
    x = torch.randn(args.batch, args.seq, d, device=run.device, dtype=run.dtype)

    # Correct before fast: the post's eager MLP with the same weights must give the same output.
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    common.check_same_output(run, "Liger", model, eager, x)

    forward = torch.compile(model) if args.compile else model  # not needed: Liger fuses without a compiler

    @torch.no_grad()
    def step():
        return forward(x)

    common.record(run, step, "mlp_fwd", f"{args.batch}x{args.seq}x{d}x{h}", expectations(args))


if __name__ == "__main__":
    common.main(main)
