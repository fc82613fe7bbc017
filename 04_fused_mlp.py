"""One rung past the post: gate, up and GeGLU in one Triton kernel, the GeGLU in the GEMM's epilogue.

    uv run 04_fused_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072

What to look for in the trace (Perfetto, or the report printed below):
- two GPU kernels per forward: `_geglu_tma_kernel` (Hopper; `_geglu_pointer_kernel` on older GPUs), which
  computes gelu_tanh(x @ Wg^T) * (x @ Wu^T) tile by tile, and the cuBLAS GEMM of down_proj. With few tokens
  (--batch 1 --seq 1: a decode step) they are `_geglu_small_m_kernel` and `_linear_small_m_kernel`. Where K is
  long next to M x N, cuBLAS splits down_proj along K and adds a reduce kernel (cublasLt::splitKreduce_kernel):
  the GEMM's second half, not counted as a kernel of its own.
- no aten::gelu, no aten::mul, no fused pointwise kernel: the gate and up projections (2 x 50 MB in bf16
  at the post's shape) never go to HBM, so nothing has to read them back. Compare with 03_simple_mlp's
  compiled trace: `uv run inspect_trace.py A B` names what replaced what.

Triton's kernels need a CUDA GPU. On a CPU, TRITON_INTERPRET=1 runs the same kernel in Triton's
interpreter (numpy, slow: use tiny shapes), e.g.
    TRITON_INTERPRET=1 uv run 04_fused_mlp.py --batch 2 --seq 8 --dim 32 --hidden 64
There each launch is a CPU span named after the kernel (_geglu_pointer_kernel or _geglu_small_m_kernel),
around the interpreter's own ops (aten::new_empty, set_, copy_: its tensors, not the kernel's math).
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import importlib
import importlib.util

import torch

import inspect_trace as it


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    steps = it.steps(args.active, "mlp_fwd")
    if args.compile:
        return [
            steps,
            # Inductor launches the kernels from its own code under a numbered name (_geglu_tma_kernel_0).
            it.kernel(r"^_geglu_(tma|pointer|small_m)_kernel(_\d+)?$", per_step=1),
        ]
    return [
        steps,
        it.cpu_op("aten::gelu", present=False),
        it.cpu_op("aten::mul", present=False),
        it.kernels_per_step(2, "the fused gate/up GEMM with the GeGLU epilogue + down_proj"),
        it.kernel(r"^_geglu_(tma|pointer|small_m)_kernel$", per_step=1),
        it.cpu_event(r"^_geglu_(tma|pointer|small_m)_kernel$"),  # Triton's interpreter on a CPU: a span per launch
    ]


H200_TRACE = common.ROOT / "tests/data/h200_fused_eager.json.gz"  # this script's trace, recorded on an H200
ON_CPU = ("the Triton kernel needs a CUDA GPU, so a plain CPU run stops at once with exit code 2. With "
          "TRITON_INTERPRET=1, Triton's interpreter runs the same kernel on the CPU (slowly: tiny shapes only, e.g. "
          "--batch 2 --seq 8 --dim 32 --hidden 64), and the trace shows its CPU ops. The H200 trace: "
          f"{common.uv_run('inspect_trace.py', '--open', H200_TRACE)}")


def main():
    args = common.parser(__doc__, on_cpu=ON_CPU, batch=64, seq=128, dim=768, hidden=3072).parse_args()
    tokens, d, h = args.batch * args.seq, args.dim, args.hidden
    run = common.setup(__file__, args, elements=8 * d * h + 3 * tokens * d + 3 * tokens * h)
    if importlib.util.find_spec("triton") is None:  # Triton has Linux wheels only (see pyproject.toml)
        raise common.Fail("the fused kernel needs a CUDA GPU and Triton, which installs on Linux only; here run "
                          f"{common.uv_run('03_simple_mlp.py', '--compile')} (the CPU twin), or read the H200 run: "
                          f"{common.uv_run('inspect_trace.py', H200_TRACE)}")
    import fused_geglu  # imports Triton, so only once we know it is there
    from fused_geglu import FusedGeGLUMLP

    if not run.cuda and not fused_geglu.INTERPRET:
        raise common.Fail("the fused Triton kernel needs a CUDA GPU; on a CPU run it in Triton's interpreter at a tiny "
                          "shape: TRITON_INTERPRET=1 "
                          f"{common.uv_run('04_fused_mlp.py', '--batch 2 --seq 8 --dim 32 --hidden 64')}")
    if fused_geglu.INTERPRET and tokens * d * h > 1 << 24:
        raise common.Fail(f"Triton's interpreter is far too slow for {tokens}x{d}x{h}; use a tiny shape, "
                          "e.g. --batch 2 --seq 8 --dim 32 --hidden 64")
    common.describe(run)  # after the refusals: a run that cannot start prints only its one line

    model = FusedGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    x = torch.randn(args.batch, args.seq, d, device=run.device, dtype=run.dtype)
    # The lesson is the fused kernel: run it even at a token count where the tuned table found cuBLAS faster.
    fused_geglu.show_the_kernel(run.device, tokens, d, h)

    # Correct before fast: the post's eager MLP with the same weights must give the same output.
    eager = importlib.import_module("03_simple_mlp").SimpleGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    common.check_same_output(run, "fused", model, eager, x)

    forward = torch.compile(model) if args.compile else model

    @torch.no_grad()
    def step():
        return forward(x)

    common.record(run, step, "mlp_fwd", f"{args.batch}x{args.seq}x{d}x{h}", expectations(args))


if __name__ == "__main__":
    common.main(main)
