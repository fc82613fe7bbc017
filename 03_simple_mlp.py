"""Profile a GeGLU MLP: five kernels in eager, four once torch.compile fuses GeLU and mul.

    uv run 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072
    uv run 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --compile

What to look for in the trace (Perfetto, or the report printed below):
- eager: 5 GPU kernels per forward: 3 GEMMs (gate, up, down) + GeLU + mul. Each GEMM launch is preceded by
  cudaOccupancyMaxActiveBlocksPerMultiprocessor (cuBLAS sizing its grid); the pointwise kernels launch bare.
  aten::t / transpose / reshape / view / _unsafe_view show 0 µs of CUDA time: views only rewrite strides.
  At some shapes cuBLAS splits a GEMM along K and adds a reduce kernel after it: part of that GEMM, not counted.
- gate/up and down have the same FLOPs (2*8192*768*3072 = 38.7 GFLOP each) but may get different cuBLAS tiles.
- compiled: three bare aten::mm with the same GEMM kernels; GeLU + mul + reshape become one Triton kernel,
  triton_poi_fused__unsafe_view_gelu_mul_0, so the [8192, 3072] GeLU output (50 MB in bf16) never goes to HBM.
  On the CPU the twin is a C++ kernel, graph_0_cpp_fused__unsafe_view_gelu_mul_0.
"""

import common  # first: its Ctrl-C handler must be in place before torch's slow import

import torch
import torch.nn.functional as F
from torch import nn

import inspect_trace as it


class SimpleGeGLUMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        g = self.gate_proj(x)
        u = self.up_proj(x)
        h = F.gelu(g, approximate="tanh")
        m = h * u
        y = self.down_proj(m)
        return y


def expectations(args):
    """Guess first, then look: what the post says this trace holds. Checked against the trace after the run."""
    steps = it.steps(args.active, "mlp_fwd")
    if args.compile:
        return [
            steps,
            it.cpu_op("aten::mm", per_step=3),
            it.cpu_op("aten::gelu", present=False),
            it.cpu_event(r"^Torch-Compiled Region", device="any"),
            it.kernels_per_step(4, "3 GEMMs + 1 fused Triton kernel"),
            it.kernel(r"^triton_poi_fused.*gelu_mul", per_step=1),
            it.cpu_event(r"cpp_fused.*gelu_mul"),
        ]
    return [
        steps,
        it.cpu_op("aten::linear", per_step=3),
        it.cpu_op("aten::gelu", per_step=1),
        it.cpu_op("aten::mul", per_step=1),
        it.kernels_per_step(5, "3 GEMMs + GeLU + mul"),
        it.occupancy_before_gemms(),
        it.views_launch_nothing(),
    ]


def main():
    args = common.parser(__doc__, batch=64, seq=128, dim=768, hidden=3072).parse_args()
    tokens, d, h = args.batch * args.seq, args.dim, args.hidden
    run = common.setup(__file__, args, elements=3 * d * h + 2 * tokens * d + 4 * tokens * h)
    common.describe(run)

    model = SimpleGeGLUMLP(d, h).to(run.device, run.dtype).eval()
    x = torch.randn(args.batch, args.seq, d, device=run.device, dtype=run.dtype)
    forward = torch.compile(model) if args.compile else model

    @torch.no_grad()
    def step():
        return forward(x)

    common.record(run, step, "mlp_fwd", f"{args.batch}x{args.seq}x{d}x{h}", expectations(args))


if __name__ == "__main__":
    common.main(main)
