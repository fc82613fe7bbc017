"""The GeGLU MLP (and the SwiGLU one: the same kernels, the activation a compile-time choice) with its gate and up
projections fused into one Triton kernel.

The post ends with `torch.compile` and Liger fusing GeLU * mul into one kernel. That kernel still
has to read the gate and up projections back from HBM: cuBLAS writes g = x @ Wg^T and u = x @ Wu^T
(at the post's shape each is [8192, 3072] bf16, 50 MB), then the fused kernel reads both again and
writes m = gelu_tanh(g) * u. This package goes one rung further: one kernel computes each output tile
of m from a tile of x and the matching rows of Wg and Wu, so g and u never exist in HBM, and only m is
stored; `down_proj` then runs as an ordinary cuBLAS GEMM (F.linear). A decode step's few tokens get
kernels of their own, a table measured on the GPU picks the kernel and tile by token count, the eager
forward is planned once per shape (at decode the host is what the GPU waits on), torch.compile sees the
kernels as torch.library ops, and training has a one-pass backward kernel. The module holds nothing
beyond its parameters but a split-K workspace under 1 MB.

The files, each importing only the ones listed before it:
    machine.py   where a call runs: Triton's interpreter or a GPU (its compute capability and SM count, Triton's
                 driver), the current device and stream, TMA descriptors where this Triton has them, a compile trace
    kernels.py   the @triton.jit kernels (TMA, pointer, small-M, pointwise, backward), GeGLU's or SwiGLU's epilogue
                 by their constexpr ACT (ACTIVATIONS), and their tile configs
    table.py     the tuned table (fused_geglu_tuned.json, beside this package) and `plan`: which kernel and tile run
    launcher.py  launching with little host time: the compiled kernel's own launcher, plans kept per shape, the
                 split-K workspace, each kernel's arguments (TMA descriptors included)
    ops.py       geglu, down_proj and mlp (the eager launchers) and their torch.library ops for torch.compile
    training.py  the backward: its kernel's launches, the backward ops, the ops' autograd, eager training's Function
    module.py    FusedGatedMLP (activation="gelu_tanh" or "silu"), FusedGeGLUMLP and FusedSwiGLUMLP, the nn.Modules,
                 with the parameter names of SimpleGeGLUMLP in 03_simple_mlp.py and of transformers' gated MLPs

A file reads what a test or a script may change at run time through the module that holds it (machine.INTERPRET,
table.TORCH_WHERE_FASTER, table.plan, launcher.launch, launcher.plans, ...), never a copy of its own: a test patches
the name where it lives, and every file sees it. Read `bench.py` for the timings, `bench_train.py` for training's.
"""

import sys
import types

# Triton: Linux wheels only (pyproject.toml); the scripts import this package once they know it is there.
from . import kernels, launcher, machine, module, ops, table, training  # noqa: F401 - the files, for tests
from .kernels import (ACTIVATIONS, HOPPER_CONFIG, INTERPRETER_CONFIG, INTERPRETER_SMALL_M_CONFIGS, PORTABLE_CONFIG,
                      POINTWISE_BLOCK, SMALL_M_CONFIGS)
from .launcher import KEPT_PARTIALS
from .machine import INTERPRET, TensorDescriptor
from .module import FusedGatedMLP, FusedGeGLUMLP, FusedSwiGLUMLP
from .ops import down_proj, down_proj_op, geglu, geglu_op, geglu_saving_gu, geglu_saving_gu_op, mlp, mlp_plan
from .table import (KERNELS, TUNED_TABLE, default_config, kernel_path, packed, packs_gate_up, plan, show_the_kernel,
                    small_m_config, table_rows, tuned_to_torch)
from .training import backward_in_place, geglu_backward_, geglu_backward_op

__all__ = ["FusedGatedMLP", "FusedGeGLUMLP", "FusedSwiGLUMLP", "ACTIVATIONS", "geglu", "geglu_saving_gu", "down_proj", "mlp", "mlp_plan", "geglu_op",
           "geglu_saving_gu_op", "down_proj_op", "backward_in_place", "geglu_backward_", "geglu_backward_op", "plan",
           "kernel_path", "default_config", "small_m_config", "packed", "packs_gate_up", "tuned_to_torch",
           "show_the_kernel", "table_rows", "TUNED_TABLE", "KERNELS", "HOPPER_CONFIG", "PORTABLE_CONFIG",
           "INTERPRETER_CONFIG", "SMALL_M_CONFIGS", "INTERPRETER_SMALL_M_CONFIGS", "POINTWISE_BLOCK",
           "KEPT_PARTIALS", "INTERPRET", "TensorDescriptor", "TORCH_WHERE_FASTER"]


class _Package(types.ModuleType):
    # TORCH_WHERE_FASTER is table.py's (plan reads it there, show_the_kernel sets it there): fused_geglu's name for it
    # reads and sets that one, where a copy made at import would go stale.
    TORCH_WHERE_FASTER = property(lambda self: table.TORCH_WHERE_FASTER,
                                  lambda self, value: setattr(table, "TORCH_WHERE_FASTER", value))


sys.modules[__name__].__class__ = _Package
