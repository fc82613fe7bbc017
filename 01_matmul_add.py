"""Part 1 of the series: profile torch.add(torch.matmul(x, w), b) on square matrices.

    uv run 01_matmul_add.py                      # size 64: overhead-bound
    uv run 01_matmul_add.py --warmup 3           # the same, warm: no first-call costs in the trace
    uv run 01_matmul_add.py --size 4096          # compute-bound
    uv run 01_matmul_add.py --compile
    uv run 01_matmul_add.py --batched 4          # the detour: 3-D inputs make aten::matmul dispatch aten::bmm

What to look for in the trace (Perfetto, or the report printed below):
- eager: two GPU kernels per step, the GEMM and the add. cuBLAS asks
  cudaOccupancyMaxActiveBlocksPerMultiprocessor before the GEMM launch; the add launches bare.
- size 64: the GPU is idle most of the step (the CPU's dispatch takes longer than the kernels): overhead-bound.
  Size 4096: the GEMM dominates: compute-bound.
- compiled: one aten::addmm dispatch (Inductor folds the add into the GEMM's epilogue) and, on CUDA,
  a device-to-device memcpy (the bias broadcast into the output) plus the GEMM.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import torch

import inspect_trace as it


def memcpy_per_step() -> it.Expect:
    def seen(t):
        counts = [sum(k.event.cat == "gpu_memcpy" for k in st.gpu) for st in t.steps]
        return bool(counts) and all(counts) or f"memcpys per step: {counts}"
    return it.Expect("a device-to-device memcpy in every step (bias copied into the output)", seen, "cuda")


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    guesses = [it.steps(args.active, "matmul_add")]
    if args.compile and args.batched:  # no baddbmm here: Inductor keeps bmm and fuses the add into its own kernel
        guesses += [it.cpu_op("aten::bmm", per_step=1), it.cpu_op("aten::add", present=False)]
    elif args.compile:
        guesses += [it.cpu_op("aten::addmm", per_step=1), it.cpu_op("aten::add", present=False),
                    memcpy_per_step(), it.kernels_per_step(1, "the GEMM, the add in its epilogue")]
    else:
        guesses += [it.cpu_op("aten::matmul", per_step=1), it.cpu_op("aten::bmm" if args.batched else "aten::mm", per_step=1),
                    it.cpu_op("aten::add", per_step=1), it.kernels_per_step(2, "GEMM + add"), it.occupancy_before_gemms()]
    if args.size <= 256:
        guesses.append(it.bound("overhead"))
    elif args.size >= 2048:
        guesses.append(it.bound("compute"))
    return guesses


def main():
    p = common.parser(__doc__, size=64)
    p.add_argument("--batched", type=common.size_arg, default=None, metavar="B",
                   help="use [B, size, size] inputs (aten::bmm instead of aten::mm)")
    args = p.parse_args()
    n, b = args.size, args.batched or 1
    run = common.setup(__file__, args, elements=3 * b * n * n + n)
    common.describe(run)

    lead = (args.batched,) if args.batched else ()
    x = torch.randn(*lead, n, n, device=run.device, dtype=run.dtype)
    w = torch.randn(*lead, n, n, device=run.device, dtype=run.dtype)
    bias = torch.randn(n, device=run.device, dtype=run.dtype)

    def matmul_add(x, w, bias):
        return torch.add(torch.matmul(x, w), bias)

    forward = torch.compile(matmul_add) if args.compile else matmul_add

    @torch.no_grad()
    def step():
        return forward(x, w, bias)

    common.record(run, step, "matmul_add", f"{args.batched}x{n}" if args.batched else f"{n}", expectations(args))


if __name__ == "__main__":
    common.main(main)
