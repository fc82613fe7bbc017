"""Profile one nn.Linear forward: one GEMM kernel, the bias folded into its epilogue.

    uv run 02_linear.py --batch 1024 --in_dim 32 --out_dim 64
    uv run 02_linear.py --batch 1024 --in_dim 32 --out_dim 64 --compile

What to look for in the trace (Perfetto, or the report printed below):
- eager: aten::linear -> aten::t (a view: 0 µs of CUDA time, no kernel) -> aten::addmm.
  No aten::add: the bias is added in the GEMM's epilogue, so one GPU kernel per forward.
- compiled: byte-for-byte the same GEMM kernel; aten::t is gone (Inductor hard-codes the strides),
  and new CPU rows appear: Torch-Compiled Region, TorchDynamo Cache Lookup, ## Call CompiledFxGraph ... ##.
- the kernel name carries the layout: "tn" = first operand transposed, second not.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import torch
from torch import nn

import inspect_trace as it


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    steps = it.steps(args.active, "linear_fwd")
    # cuBLASLt takes the bias into its epilogue only for a weight of 2+ rows and columns; else addmm first copies
    # the bias into the output, a kernel of its own
    epilogue = args.in_dim > 1 and args.out_dim > 1
    if args.compile:
        return [
            steps,
            it.cpu_op("aten::addmm", per_step=1),
            it.cpu_op("aten::add", present=False),
            it.cpu_op("aten::t", present=False),
            it.cpu_event(r"^Torch-Compiled Region", device="any"),
            *[it.kernels_per_step(1, "the same GEMM as eager")] * epilogue,
        ]
    return [
        steps,
        it.cpu_op("aten::addmm", per_step=1),
        it.cpu_op("aten::add", present=False),
        it.cpu_op("aten::t", per_step=1),
        *[it.kernels_per_step(1, "the GEMM, bias in its epilogue")] * epilogue,
        it.views_launch_nothing(),
    ]


def main():
    args = common.parser(__doc__, batch=1024, in_dim=32, out_dim=64).parse_args()
    b, i, o = args.batch, args.in_dim, args.out_dim
    run = common.setup(__file__, args, elements=b * i + i * o + o + b * o)
    common.describe(run)

    # bias=True: y = x @ w.T + b, the matmul and add of Part 1 in one module.
    layer = nn.Linear(args.in_dim, args.out_dim, bias=True).to(run.device, run.dtype).eval()
    x = torch.randn(args.batch, args.in_dim, device=run.device, dtype=run.dtype)
    forward = torch.compile(layer) if args.compile else layer

    @torch.no_grad()
    def step():
        return forward(x)

    common.record(run, step, "linear_fwd", f"{args.batch}x{args.in_dim}x{args.out_dim}", expectations(args))


if __name__ == "__main__":
    common.main(main)
