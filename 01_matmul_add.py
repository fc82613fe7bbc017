"""Part 1 of the series: profile torch.add(torch.matmul(x, w), b) on square matrices.

The post's commands, as printed:
    uv run 01_matmul_add.py --size 64                    # overhead-bound: the GPU idles most of the step
    uv run 01_matmul_add.py --size 4096                  # compute-bound
    uv run 01_matmul_add.py --warmup                     # warm: no first-call costs in the first active step
    uv run 01_matmul_add.py --size 4096 --warmup         # kernel times vary step to step
    uv run 01_matmul_add.py --size 4096 --warmup --compile
Its experiments:
    uv run 01_matmul_add.py --wait 0 --profiler-warmup 0 # an Activity Buffer Request on the GPU lane
    uv run 01_matmul_add.py --size 4096 --active 20      # the GPU falls further behind the CPU each step
    uv run 01_matmul_add.py --size 4096 --active 20 --sync-each-step   # ... unless every step waits for it
    uv run 01_matmul_add.py --batched 4                  # the detour: [B, size, size] makes matmul dispatch bmm

What to look for in the trace (Perfetto, or the report printed below):
- eager: two GPU kernels per step, the GEMM and the add. cuBLAS asks
  cudaOccupancyMaxActiveBlocksPerMultiprocessor before the GEMM launch; the add launches bare.
- size 64: the GPU is idle most of the step (the CPU's dispatch takes longer than the kernels): overhead-bound.
  Size 4096: the GEMM dominates: compute-bound, and with no sync per step the CPU runs ahead of the GPU.
- cold: the first active step waits between entering record_function("matmul_add") and aten::matmul.
- compiled: one aten::addmm dispatch (Inductor folds the add into the GEMM's epilogue) and, on CUDA,
  a device-to-device memcpy (the [size, size] bias copied into the output) before the GEMM.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import torch

import inspect_trace as it
from trace_reader.analyzers.guesses import buffer_request, cold_start_gap, gpu_lag_grows


def memcpy_per_step() -> it.Expect:
    def seen(t):
        counts = [sum(k.event.cat == "gpu_memcpy" for k in st.gpu) for st in t.steps]
        return bool(counts) and all(counts) or f"memcpys per step: {counts}"
    return it.Expect("a device-to-device memcpy in every step (bias copied into the output)", seen, "cuda")


def guessed_bound(args):
    """"overhead", "compute" or None (no guess). The CPU takes ~80 µs to launch a step (H200 traces); the GPU's
    share grows with B x size^3: at 4096 in bf16 the GEMM alone takes ~170 µs, at 2048 ~25 µs, and fp32 (no
    tensor cores by default) is about ten times slower per FLOP. Between the two sizes: no guess."""
    work = (args.batched or 1) * args.size**3
    if work <= 512**3:
        return "overhead"
    return "compute" if work >= (2048**3 if args.dtype == "fp32" else 4096**3) else None


def schedule_guesses(args):
    """Part 1's schedule experiments: what the profiler itself adds, and how far the GPU lags the CPU."""
    guesses = []
    if not args.compile and args.size <= 256:  # the post measured it at size 64, eager
        guesses.append(cold_start_gap("matmul_add", cold=not args.warmup))
    if args.wait == 0 and args.profiler_warmup == 0:
        guesses.append(buffer_request())
    if args.sync_each_step:
        guesses.append(gpu_lag_grows(False))
    elif guessed_bound(args) == "compute" and not args.compile:  # more GPU work per step than CPU work
        guesses.append(gpu_lag_grows(True))
    return guesses


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    guesses = [it.steps(args.active, "matmul_add")] + schedule_guesses(args)
    if args.compile and args.batched:  # no baddbmm here: Inductor keeps bmm and fuses the add into its own kernel
        guesses += [it.cpu_op("aten::bmm", per_step=1), it.cpu_op("aten::add", present=False)]
    elif args.compile:
        guesses += [it.cpu_op("aten::addmm", per_step=1), it.cpu_op("aten::add", present=False),
                    memcpy_per_step(), it.kernels_per_step(1, "the GEMM, the add in its epilogue")]
    else:
        guesses += [it.cpu_op("aten::matmul", per_step=1), it.cpu_op("aten::bmm" if args.batched else "aten::mm", per_step=1),
                    it.cpu_op("aten::add", per_step=1), it.kernels_per_step(2, "GEMM + add"), it.occupancy_before_gemms()]
    if (kind := guessed_bound(args)) is not None:
        guesses.append(it.bound(kind))
    return guesses


def main():
    p = common.parser(__doc__, size=64)
    p.add_argument("--batched", type=common.size_arg, default=None, metavar="B",
                   help="use [B, size, size] inputs (aten::bmm instead of aten::mm)")
    args = p.parse_args()
    n, b = args.size, args.batched or 1
    run = common.setup(__file__, args, elements=4 * b * n * n)
    common.describe(run)

    lead = (args.batched,) if args.batched else ()
    x = torch.randn(*lead, n, n, device=run.device, dtype=run.dtype)
    w = torch.randn(*lead, n, n, device=run.device, dtype=run.dtype)
    bias = torch.randn(*lead, n, n, device=run.device, dtype=run.dtype)  # the post's bias: a matrix, like x and w

    def matmul_add(x, w, bias):
        return torch.add(torch.matmul(x, w), bias)

    forward = torch.compile(matmul_add) if args.compile else matmul_add

    @torch.no_grad()
    def step():
        return forward(x, w, bias)

    common.record(run, step, "matmul_add", f"{n}", expectations(args), flags=f"_bmm{b}" if args.batched else "")


if __name__ == "__main__":
    common.main(main)
