"""The GeGLU MLP with its gate and up projections fused into one Triton kernel.

The post ends with `torch.compile` and Liger fusing GeLU * mul into one kernel. That kernel still
has to read the gate and up projections back from HBM: cuBLAS writes g = x @ Wg^T and u = x @ Wu^T
(at the post's shape each is [8192, 3072] bf16, 50 MB), then the fused kernel reads both again and
writes m = gelu_tanh(g) * u. This file goes one rung further: one kernel computes each output tile
of m from a tile of x and the matching rows of Wg and Wu,

    g = x_tile @ Wg_tile^T,  u = x_tile @ Wu_tile^T   (two fp32 accumulators in registers, one x tile)
    m_tile = gelu_tanh(g) * u                        (the "epilogue"), stored once as bf16

so g and u never exist in HBM: 2 x 50 MB written and 2 x 50 MB read back are gone at the post's
shape, and only m (50 MB) is stored. `down_proj` then runs as an ordinary cuBLAS GEMM (F.linear).
The kernels read both weights where they are (two pointers, or two TMA descriptors): the module holds
nothing beyond its parameters but a split-K workspace under 1 MB.

The saving only matters if the GEMM main loop runs near cuBLAS speed, so there are two versions:
- `_geglu_tma_kernel` (Hopper, sm_90+): tensor-memory-accelerator (TMA) descriptors load the tiles,
  a persistent grid of one program per SM walks the tiles in grouped order, and Triton software-
  pipelines the loads across tiles (`flatten=True`) so one tile's epilogue hides behind the next
  tile's first loads (with K = 768 there are only 12 K-steps per tile to hide it behind).
- `_geglu_pointer_kernel` (any GPU, and Triton's CPU interpreter): masked pointer loads, one program
  per tile. Tests run both kernels on the CPU with TRITON_INTERPRET=1, and on a GPU when there is one.

A decode step has few tokens (M = 1 .. 128) and the picture flips: the weights are the bytes (at
1 x 4096 -> 11008 the MLP reads 270 MB of weights and 8 KB of activations), the FLOPs are nothing, and a
128-row tile wastes almost all of its work while 86 tiles leave most SMs idle. So `_geglu_small_m_kernel`
streams the weights with many small programs (16..128 rows of x, 64 rows of each weight), the
tile chosen by M from a few buckets (`SMALL_M_CONFIGS`: one compiled kernel per bucket, not per shape).
The same body without the epilogue, `_linear_small_m_kernel`, does down_proj there: its weight has only
`dim` rows, so it also splits K across programs until they fill the GPU (the last program of a tile sums
the fp32 partials in a fixed order). Past the buckets, the tiled kernels above and cuBLAS take over.
Which kernel and tile run at each M is measured on the GPU by tune_fused.py, per M bucket and, within one, per
class of input width K: its table (fused_geglu_tuned.json) replaces these defaults on GPUs of the compute
capability it was measured on.

At decode the GPU work is short (73 µs for that MLP on an H200) and the host has to keep up: a Triton launch
through `kernel[grid](...)` re-derives the kernel's specialisation from every argument in Python, about
25 µs a launch on the H200 machine's CPU against about 12 µs through the compiled kernel's own launcher.
`_launch` looks the compiled kernel up once per argument signature and launches it directly, and split-K
keeps its workspace: enqueuing a decode forward went from about 105 µs of host time to about 80, about as
long as the GPU work itself (bench.py's "host µs" line; the machine's host speed varies from run to run).
Then every choice a call makes was kept per shape, dtype, device and stream (`_plans`: the module's forward is one
plan, `mlp`): 61-82 µs against eager's 110-133 at three decode shapes (results/bench_decode_host_h200.txt). Those
kept launches still went through Triton's runner: since Triton 3.5 the launch-hook knobs are chains, never None, and
an empty chain read as a hook set. Since 2026-12-02 (`_hook_set`) they call the compiled kernel's launcher directly
while no hook is set: at M = 1 on the H200 machine, 34-52 µs of host time per forward against 61-63 through the
runner (one probe, two rounds; not a committed record).

Under torch.compile the two ops are `torch.library.triton_op`s: their bodies are traced, and the kernels
enter Inductor's graph through `wrap_triton`, so a compiled model launches them from generated code.

Training: with SAVE_GU the tiled kernels' epilogue also stores g and u (in x's dtype) from the accumulators that made
m, and backward uses them; FusedGeGLUMLP(recompute=True) saves only x and recomputes them with two cuBLAS GEMMs
instead (less memory, two more GEMMs). Either way one Triton kernel, `_geglu_backward_kernel`, reads grad_m, g and u
once and writes grad_g and grad_u over g and u (fp32 math), where PyTorch ops would take several passes over
[M, hidden]. Eager training calls the launchers from a plain autograd.Function (torch.library's dispatch costs more
host time than the launches); torch.compile sees the ops (and, for saved g and u, an out-of-place backward op).
`bench_train.py` times both modes against eager, compile and Liger.

Read `bench.py` for the timings. `geglu()` is the bare launcher, `FusedGeGLUMLP` the nn.Module whose
parameters carry the same names as `SimpleGeGLUMLP` in 03_simple_mlp.py.
"""

import concurrent.futures
import functools
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
import triton  # Linux wheels only (pyproject.toml): scripts import this module once they know it is there
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: only the pointer kernel
    TensorDescriptor = None

# Read once, like Triton itself: the interpreter is chosen when the kernels are decorated.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _geglu_epilogue(g, u, FAST_TANH: tl.constexpr):
    if FAST_TANH:
        # bf16 output on a GPU: the hardware's tanh, one instruction (relative error about 2^-11, below bf16's
        # rounding, 2^-9). At K = 768 the epilogue is a tenth of a tile's time and this halves it: 8% faster
        # gate/up at the post's shape on the H200.
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f",
                                      [0.7978845608028654 * (g + 0.044715 * g * g * g)],  # sqrt(2/pi) * (...)
                                      dtype=tl.float32, is_pure=True, pack=1)
        return 0.5 * g * (1.0 + t) * u
    # gelu_tanh(g) = 0.5 * g * (1 + tanh(y)) with y = sqrt(2/pi) * (g + 0.044715 g^3),
    # and 0.5 * (1 + tanh(y)) = 1 / (1 + exp(-2y)): one exp and no libdevice tanh, which the CPU
    # interpreter cannot run. No overflow to NaN: exp(-2y) -> inf for very negative g gives g/inf = -0.
    two_y = 1.5957691216057308 * (g + 0.044715 * g * g * g)  # 2 * sqrt(2/pi) * (...)
    return g / (1.0 + tl.exp(-two_y)) * u


@triton.jit
def _geglu_pointwise_kernel(g_ptr, u_ptr, m_ptr, n, FAST_TANH: tl.constexpr, BLOCK: tl.constexpr):
    # m = gelu_tanh(g) * u over contiguous g, u and m, in fp32: the "torch" path's GeGLU on a GPU, one pass over
    # g and u where PyTorch's GeLU and mul make two (the same epilogue as the fused kernels).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M * N can pass 2^31
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(m_ptr + offs, _geglu_epilogue(g, u, FAST_TANH).to(m_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_packed_kernel(gu_ptr, n, row_stride, FAST_TANH: tl.constexpr, BLOCK: tl.constexpr):
    # The same GeGLU over rows of [g | u], one [tokens, 2 * hidden] output of one cuBLAS GEMM over the packed gate and
    # up weights: m = gelu_tanh(g) * u written over g (row r's m is row r's first n elements; each element is read
    # before it is written). Grid: (rows, column blocks).
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = gu_ptr + tl.program_id(0).to(tl.int64) * row_stride  # int64: rows * 2 * hidden can pass 2^31
    g = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(row + n + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(row + offs, _geglu_epilogue(g, u, FAST_TANH).to(gu_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M row-tiles of x walk the weight tiles together, so each weight tile
    # is fetched from HBM once and then re-read from L2 by the programs running next to it.
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile_id // tiles_per_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % tiles_per_group) % group_m
    pid_n = (tile_id % tiles_per_group) // group_m
    return pid_m, pid_n


@triton.jit
def _upcast(t, UPCAST: tl.constexpr):
    # Interpreter only: it multiplies bf16 tiles as raw 16-bit patterns (triton-lang/triton#11584).
    # bf16 -> fp32 is exact and the GPU also multiplies bf16 exactly into fp32, so results agree.
    if UPCAST:
        return t.to(tl.float32)
    return t


@triton.jit
def _geglu_tma_kernel(x_desc, wg_desc, wu_desc, m_desc, g_desc, u_desc, M, N, K,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                      NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, UPCAST: tl.constexpr,
                      FAST_TANH: tl.constexpr, ONE_DOT: tl.constexpr, SAVE_GU: tl.constexpr):
    """m[M, N] = gelu_tanh(x @ Wg^T) * (x @ Wu^T), x [M, K], Wg and Wu [N, K]; persistent, TMA loads and stores.

    Two accumulators, or with ONE_DOT the gate and up tiles interleaved on chip (rows g0, u0, g1, u1...) into
    one [2 BN, BK] operand and one [BM, 2 BN] accumulator, split again in the epilogue: with FLATTEN, Triton
    serialises two accumulators' wgmma instructions (ptxas warning C7515), one it does not. With SAVE_GU
    (training) the epilogue also stores g = x @ Wg^T and u = x @ Wu^T to g_desc and u_desc, for the backward."""
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BK)
    # One program per SM loops over the tiles; FLATTEN lets the pipeliner prefetch the next tile's
    # first K-slices while this tile's epilogue runs.
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        acc = tl.zeros((BM, 2 * BN if ONE_DOT else 1), dtype=tl.float32)
        for ki in range(k_tiles):
            # TMA fills out-of-bounds rows/columns with zeros: no masks, any M, N, K. Both weight tiles
            # share the x tile: the weights are read where they are, no packed copy.
            x = _upcast(x_desc.load([pid_m * BM, ki * BK]), UPCAST)
            wg = _upcast(wg_desc.load([pid_n * BN, ki * BK]), UPCAST)
            wu = _upcast(wu_desc.load([pid_n * BN, ki * BK]), UPCAST)
            if ONE_DOT:
                w = tl.reshape(tl.permute(tl.join(wg, wu), (0, 2, 1)), (2 * BN, BK))
                acc = tl.dot(x, w.T, acc)
            else:
                acc_g = tl.dot(x, wg.T, acc_g)
                acc_u = tl.dot(x, wu.T, acc_u)
        if ONE_DOT:
            acc_g, acc_u = tl.split(tl.reshape(acc, (BM, BN, 2)))
        m = _geglu_epilogue(acc_g, acc_u, FAST_TANH)
        # The TMA store clips the tile at the tensor's edges.
        m_desc.store([pid_m * BM, pid_n * BN], m.to(m_desc.dtype))
        if SAVE_GU:  # rounded to x's dtype, as cuBLAS would write g and u
            g_desc.store([pid_m * BM, pid_n * BN], acc_g.to(g_desc.dtype))
            u_desc.store([pid_m * BM, pid_n * BN], acc_u.to(u_desc.dtype))


@triton.jit
def _dot_main_loop(x_ptr, wg_ptr, wu_ptr, offs_m, offs_n, offs_k, M, N, K, k_steps, stride_xm, stride_wg,
                   stride_wu, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GEGLU: tl.constexpr,
                   UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # x [BM, BK] times [N, K] weights read as [BK, BN] tiles (W^T without a copy), on tensor cores; with GEGLU,
    # the gate's and the up's tiles share each x tile (two accumulators), else only wg_ptr is read.
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    wg_ptrs = wg_ptr + offs_n[None, :] * stride_wg + offs_k[:, None]
    wu_ptrs = wu_ptr + offs_n[None, :] * stride_wu + offs_k[:, None]
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(k_steps):
        # Masked elements load as 0 and add nothing to the dot product.
        k_in = offs_k < K - i * BK
        w_mask = k_in[:, None] & (offs_n[None, :] < N)
        x = _upcast(tl.load(x_ptrs, mask=(offs_m[:, None] < M) & k_in[None, :], other=0.0), UPCAST)
        acc_g = tl.dot(x, _upcast(tl.load(wg_ptrs, mask=w_mask, other=0.0), UPCAST), acc_g,
                       input_precision=DOT_PRECISION)
        if GEGLU:
            acc_u = tl.dot(x, _upcast(tl.load(wu_ptrs, mask=w_mask, other=0.0), UPCAST), acc_u,
                           input_precision=DOT_PRECISION)
        x_ptrs += BK
        wg_ptrs += BK
        wu_ptrs += BK
    return acc_g, acc_u


@triton.jit
def _store_out(out_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_om, GEGLU: tl.constexpr, FAST_TANH: tl.constexpr):
    if GEGLU:
        tile = _geglu_epilogue(acc_g, acc_u, FAST_TANH)
    else:
        tile = acc_g
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, tile.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _geglu_pointer_kernel(x_ptr, wg_ptr, wu_ptr, m_ptr, g_ptr, u_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                          stride_mm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, FAST_TANH: tl.constexpr,
                          SAVE_GU: tl.constexpr):
    """Same computation as _geglu_tma_kernel with masked pointer loads: one program per tile. With SAVE_GU, g and u
    ([M, N] with m's strides) are stored too."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc_g, acc_u = _dot_main_loop(x_ptr, wg_ptr, wu_ptr, offs_m, offs_n, tl.arange(0, BK), M, N, K, tl.cdiv(K, BK),
                                  stride_xm, stride_wg, stride_wu, BM, BN, BK, True, UPCAST, DOT_PRECISION)
    _store_out(m_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_mm, True, FAST_TANH)
    if SAVE_GU:
        _store_out(g_ptr, acc_g, acc_g, offs_m, offs_n, M, N, stride_mm, False, FAST_TANH)
        _store_out(u_ptr, acc_u, acc_u, offs_m, offs_n, M, N, stride_mm, False, FAST_TANH)


@triton.jit
def _small_m_body(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                  stride_om, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                  GEGLU: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, FAST_TANH: tl.constexpr):
    """Few tokens: gelu_tanh(x @ Wg^T) * (x @ Wu^T) (GEGLU), or x @ Wg^T alone (down_proj); x [M, K], W [N, K].

    The weights dominate the bytes, so many small programs stream them: grid (M tiles, N tiles, SPLIT_K),
    the programs next to each other share a weight tile (L2 hits). Even at M = 1 a 16-row tensor-core tile
    is as fast as a GEMV loop without tensor cores (measured on the H200): the weights' bytes set the time.
    With SPLIT_K > 1 each program sums one slice of K into fp32 partials; the last of a tile's SPLIT_K
    programs to arrive adds the partials in a fixed order (deterministic), applies the epilogue and
    resets the tile's counter for the next launch.
    """
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    k_steps = tl.cdiv(tl.cdiv(K, BK), SPLIT_K)  # K-steps per slice (the last slice may get fewer)
    offs_k = pid_k * k_steps * BK + tl.arange(0, BK)
    acc_g, acc_u = _dot_main_loop(x_ptr, wg_ptr, wu_ptr, offs_m, offs_n, offs_k, M, N, K, k_steps, stride_xm,
                                  stride_wg, stride_wu, BM, BN, BK, GEGLU, UPCAST, DOT_PRECISION)
    if SPLIT_K == 1:
        _store_out(out_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_om, GEGLU, FAST_TANH)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        # part is [SPLIT_K, M, N] fp32 per accumulator: the gate's (or the only one), then the up's.
        g_ptrs = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        u_ptrs = g_ptrs + SPLIT_K * M * N
        tl.store(g_ptrs + pid_k * M * N, acc_g, mask=mask)
        if GEGLU:
            tl.store(u_ptrs + pid_k * M * N, acc_u, mask=mask)
        tile = pid_m * tl.num_programs(1) + pid_n
        # acq_rel: this program's partials are visible before its arrival is counted, and the last
        # program sees every other partial once it has read the count.
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total_g = tl.zeros((BM, BN), dtype=tl.float32)
            total_u = tl.zeros((BM, BN), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # .cg: read through L2, never a stale L1 line
                total_g += tl.load(g_ptrs + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                if GEGLU:
                    total_u += tl.load(u_ptrs + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _store_out(out_ptr, total_g, total_u, offs_m, offs_n, M, N, stride_om, GEGLU, FAST_TANH)
            tl.store(count_ptr + tile, 0)


# Two kernels over one body, so a trace names what each launch computes.
@triton.jit(do_not_specialize=["M"])
def _geglu_small_m_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg,
                          stride_wu, stride_om, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          FAST_TANH: tl.constexpr):
    _small_m_body(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                  stride_om, BM, BN, BK, SPLIT_K, True, UPCAST, DOT_PRECISION, FAST_TANH)


@triton.jit(do_not_specialize=["M"])
def _linear_small_m_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                           UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    _small_m_body(x_ptr, w_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_wn,
                  stride_om, BM, BN, BK, SPLIT_K, False, UPCAST, DOT_PRECISION, False)


# Tile configs; BN counts columns of m (each tile reads BN rows of Wg and BN rows of Wu).
# Hopper: a 128 x (2 x 128) tile per program (8 warps = 2 warpgroups, 64 rows each); shared memory is
# (BM + 2 * BN) * BK * 2 bytes = 48 KB per stage plus a 32 KB epilogue buffer: 3 stages = 176 KB of 227.
# ONE_DOT with FLATTEN: compiled for sm_90a, two accumulators with FLATTEN make ptxas serialise the wgmma
# instructions (C7515); one interleaved accumulator does not (neither do two without FLATTEN: a tuning candidate).
HOPPER_CONFIG = dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3, FLATTEN=True, ONE_DOT=True)
# Pre-Hopper GPUs (A100: 164 KB of shared memory per SM): 16 KB per stage, still tensor cores.
PORTABLE_CONFIG = dict(BM=128, BN=64, BK=32, GROUP_M=8, num_warps=8, num_stages=4)
# The CPU interpreter runs each program in numpy: small tiles keep the tests quick.
INTERPRETER_CONFIG = dict(BM=32, BN=16, BK=16, GROUP_M=2, num_warps=4, num_stages=1, FLATTEN=True)
# Few tokens (decode), per kernel: (largest M, config), first match wins; past the last bucket, the tiled
# kernels (gate/up) and cuBLAS (down_proj). Buckets, not shapes: one compiled kernel serves a bucket's M.
SMALL_M_CONFIGS = {
    "geglu": [  # M <= 16: Triton keeps num_stages - 1 buffers of 36 KB, so three programs share an H200 SM and
        # overlap their loads: 2-3 µs faster a forward than 32 weight rows per program at each of the 7 shapes with
        # M <= 16 measured
        (16, dict(BM=16, BN=64, BK=128, num_warps=4, num_stages=3)),
        (64, dict(BM=64, BN=64, BK=64, num_warps=4, num_stages=4)),
        (128, dict(BM=128, BN=64, BK=64, num_warps=8, num_stages=3)),
    ],
    "down": [  # N = dim is small: split K to fill the GPU (FILL = CTAs per SM)
        (16, dict(BM=16, BN=64, BK=128, FILL=2, num_warps=4, num_stages=4)),
        (64, dict(BM=64, BN=64, BK=128, FILL=1, num_warps=4, num_stages=4)),
    ],
}
INTERPRETER_SMALL_M_CONFIGS = {  # tiny tiles; the tests also cover split-K with other tiles
    "geglu": [(1, dict(BM=16, BN=16, BK=16, SPLIT_K=2, num_warps=4, num_stages=1)),
              (32, dict(BM=16, BN=16, BK=16, num_warps=4, num_stages=1))],
    "down": [],  # F.linear: the interpreter's trace keeps down_proj as the aten::mm the post shows
}
# The table tune_fused.py measured on a GPU (kernel and config per M bucket); it replaces the defaults above on
# GPUs of the compute capability it was measured on. Read once, at import: choosing costs a list walk per call.
TUNED_TABLE = Path(__file__).parent.with_name("fused_geglu_tuned.json")  # beside the package
KERNELS = ("small", "tma", "pointer", "torch")


def _a_largest_k(max_k):
    return max_k is None or (type(max_k) is int and max_k > 0)


def _load_tuned(path=TUNED_TABLE):
    """{major compute capability: {"geglu": [(largest M or None, largest K or None, kernel, config)], "down": [...],
    "packing": [(largest M or None, largest K or None, packed)]}} from path (see table_rows)."""
    if not path.exists():
        return {}
    return table_rows(json.loads(path.read_text()), path.name)


def table_rows(table, name):
    """_load_tuned's rows of a table as tune_fused.py writes it; None: any. A row without max_k holds every K
    (tables before K classes; down_proj's K is its input width, hidden); a table without packing rows packs
    everywhere."""
    rows = {which: [(row["max_m"], row.get("max_k"), row["kernel"], row.get("config")) for row in table[which]]
            for which in ("geglu", "down")}
    # Where torch won, the best fused kernel there (what show_the_kernel's scripts run); elsewhere the row's own.
    rows["fused"] = [(row["max_m"], row.get("max_k"), *((row["fused"]["kernel"], row["fused"].get("config"))
                                                       if "fused" in row else (row["kernel"], row.get("config"))))
                     for row in table["geglu"] if "fused" in row or row["kernel"] != "torch"]
    rows["packing"] = [(row["max_m"], row.get("max_k"), row["packed"]) for row in table.get("packing", [])]
    for which, kernels in (("geglu", KERNELS), ("fused", KERNELS[:3]), ("down", ("small", "torch"))):
        for max_m, max_k, kernel, cfg in rows[which]:
            if kernel not in kernels or (kernel != "torch" and not cfg) or not _a_largest_k(max_k):
                raise ValueError(f"{name}: {which} row for M <= {max_m}, K <= {max_k}: kernel {kernel!r} and "
                                 f"config {cfg!r}")
    for max_m, max_k, pack in rows["packing"]:
        if type(pack) is not bool or not _a_largest_k(max_k):
            raise ValueError(f"{name}: packing row for M <= {max_m}, K <= {max_k}: packed {pack!r}")
    return {int(table["capability"].split(".")[0]): rows}


_tuned = _load_tuned()


def _tuned_rows(device, which):
    if INTERPRET or device.type != "cuda":
        return None
    return _tuned.get(_capability(device)[0], {}).get(which)


def _tma_possible(x2d, w_gate, w_up, tracing):
    return (
        TensorDescriptor is not None
        and x2d.dtype in (torch.bfloat16, torch.float16)
        # TMA needs 16-byte aligned row strides: K and N multiples of 8 for 2-byte types.
        and x2d.shape[1] % 8 == 0 and w_gate.shape[0] % 8 == 0
        # Not traced: torch 2.11's wrap_triton loses host-side TMA descriptors (KeyError 'x_desc' in Inductor's
        # mutation analysis, then a NaN output; seen on the H200), so a compiled graph runs the pointer kernel.
        and not tracing and all(t.data_ptr() % 16 == 0 for t in (x2d, w_gate, w_up))
        and (INTERPRET or _capability(x2d.device)[0] >= 9)
    )


# Where the tuned table found cuBLAS's GEMMs (and a pointwise GeGLU) faster than every fused tile at a token count,
# the module runs them there: a model wants its fastest MLP. 04_fused_mlp.py sets this False, to show the fused
# kernel at any shape.
TORCH_WHERE_FASTER = True


def tuned_to_torch(device, tokens, dim):
    """True where the tuned table runs cuBLAS's GEMMs and a pointwise GeGLU for this many tokens of this width (the
    MLP's input size) on this GPU."""
    return _by_m(torch.device(device), tokens, "geglu", dim)[0] == "torch"


def show_the_kernel(device, tokens, dim):
    """For the scripts that teach the fused kernel (04, and 06/07 with --mlp fused): run it at any token count,
    and say so where the tuned table would have run cuBLAS's GEMMs instead (the benchmarks time the module as
    it comes, table and all)."""
    global TORCH_WHERE_FASTER
    TORCH_WHERE_FASTER = False
    if tuned_to_torch(device, tokens, dim):
        print(f"note: at {tokens} tokens of width {dim} the tuned table ({TUNED_TABLE.name}) has FusedGeGLUMLP run "
              "cuBLAS's GEMMs and a pointwise GeGLU, which measured faster there; this run shows the fused kernel "
              "anyway")


def plan(x2d, w_gate, w_up, use_tma=None, where_faster=None):
    """(kernel, config) that `geglu` runs: kernel is 'small' (few tokens), 'tma', 'pointer', or 'torch' (cuBLAS's
    GEMMs, then the GeGLU: one kernel of ours on a GPU, PyTorch's ops on a CPU or in a traced graph; on a CPU without
    the interpreter, or where the tuned table found nothing faster); config None means the kernel's default.
    use_tma=True/False asks for one of the tiled kernels at any M. where_faster: TORCH_WHERE_FASTER for this call
    (None: the global; the ops pass it in, so that a compiled graph shows it)."""
    tracing = _tracing(x2d)
    where_faster = TORCH_WHERE_FASTER if where_faster is None else where_faster
    # On a CPU: PyTorch, unless the interpreter runs the kernels; it cannot be traced into a compiled graph.
    if x2d.device.type != "cuda" and (not INTERPRET or tracing):
        return "torch", None
    tma_possible = _tma_possible(x2d, w_gate, w_up, tracing)
    if use_tma is not None:
        if use_tma and not tma_possible:
            raise ValueError("the TMA kernel needs a Hopper GPU (or the interpreter), bf16/fp16, "
                             "dim and hidden multiples of 8")
        return ("tma" if use_tma else "pointer"), None
    kernel, cfg = _by_m(x2d.device, x2d.shape[0], "geglu", x2d.shape[1])
    if kernel == "torch" and not where_faster:  # the best fused kernel the table measured there, else the default
        kernel, cfg = _by_m(x2d.device, x2d.shape[0], "fused", x2d.shape[1])
    if kernel is None:  # in the interpreter the pointer kernel is the default; tests ask for the TMA one explicitly
        kernel = "tma" if tma_possible and not INTERPRET else "pointer"
    if kernel == "tma" and not tma_possible:
        # Traced into a compiled graph where the TMA kernel cannot go: cuBLAS's two GEMMs and a GeGLU that Inductor
        # fuses into one pointwise kernel measured faster than the pointer kernel (results/bench_train_h200.txt).
        return ("torch" if tracing and where_faster else "pointer"), None
    return kernel, cfg


def kernel_path(x2d, w_gate, w_up, use_tma=None):
    """Which implementation `geglu` uses: 'small', 'tma', 'pointer' or 'torch' (see plan)."""
    return plan(x2d, w_gate, w_up, use_tma)[0]


def default_config(kernel, M):
    """A kernel's config where neither the caller nor the tuned table gives one."""
    if kernel == "small":
        return small_m_config(M) or SMALL_M_CONFIGS["geglu"][-1][1]
    if INTERPRET:
        return INTERPRETER_CONFIG
    return HOPPER_CONFIG if kernel == "tma" else PORTABLE_CONFIG


def _by_m(device, M, which, K=None):
    """(kernel, config) of the first row holding M tokens of K inputs each (K None: any row of M's bucket): the tuned
    table's on its GPUs, else the small-M buckets ('small' up to their last M, then (None, None): the default tiled
    kernel, or cuBLAS for down_proj). The table's rows go by M, then by K within an M bucket: the fused epilogue
    saves the same bytes at any K while the GEMM grows with it, so a wide input can favour cuBLAS at an M where a
    narrow one favours the fused kernel."""
    rows = _tuned_rows(device, which)
    if rows is not None:
        row = _first_row(rows, M, K)
        return (None, None) if row is None else row[2:]
    cfg = small_m_config(M, which)
    return ("small", cfg) if cfg is not None else (None, None)


def _first_row(rows, M, K):
    """The first of a table's rows (largest M or None, largest K or None, ...) holding M tokens of K inputs each (K
    None: any row of M's bucket), or None."""
    for row in rows:
        max_m, max_k = row[:2]
        if (max_m is None or M <= max_m) and (max_k is None or K is None or K <= max_k):
            return row
    return None


def packs_gate_up(device, M, K):
    """Whether, where cuBLAS runs gate and up, the module's packed weights run as one GEMM of twice the width (three
    launches) rather than two (four): the tuned table's packing rows, by M then class of K, on its GPUs. cuBLAS picks
    its kernel per GEMM shape, and at some token counts the two narrower GEMMs measured faster; the table packs at a
    measured M only where the packed GEMM was not slower at any width of the class, and between two measured Ms only
    where both ends pack (tune_fused.py). No table, no packing rows in it, or no row for M: packed."""
    row = _first_row(_tuned_rows(device, "packing") or (), M, K)
    return True if row is None else row[2]


def small_m_config(M, kernel="geglu"):
    """The small-M kernel's default config for M tokens ('geglu' or 'down'), or None past the small-M buckets."""
    for max_m, cfg in (INTERPRETER_SMALL_M_CONFIGS if INTERPRET else SMALL_M_CONFIGS).get(kernel, ()):
        if M <= max_m:
            return cfg
    return None


_maker = None  # one thread that makes the kept tensors on a GPU


def _kept(device, make):
    """make() for a tensor kept across calls (the split-K workspace). On a GPU it runs in a thread of its own:
    while torch.compile's CUDA-graph trees warm a graph up, every allocation of the calling thread goes to the
    graph's private pool, and a tensor that stays alive there breaks their bookkeeping."""
    global _maker
    if device.type != "cuda":
        return make()
    if _maker is None:
        _maker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fused_geglu")
    current = torch.cuda.current_stream(device)

    def on_the_current_stream():  # grad mode and the stream are per thread
        with torch.no_grad(), torch.cuda.device(device), torch.cuda.stream(current):
            return make()

    return _maker.submit(on_the_current_stream).result()


_workspaces = {}  # (device, stream) -> (fp32 partials, int32 arrival counters) for split-K
_outgrown = []  # workspaces replaced by larger ones: a CUDA graph may have recorded their addresses
KEPT_PARTIALS = 1 << 17  # fp32 partials kept between calls: 512 KB, a decode step's (M <= 16) without allocating


def _split_k_workspace(device, stream, n_partials, n_tiles):
    """fp32 room for n_partials split-K partials and n_tiles zeroed arrival counters (the kernel re-zeroes
    them). Kept per device and stream (sequential launches on one stream share them): the counters, and
    KEPT_PARTIALS partials; more partials than that are allocated for the call, so that what stays held
    is under 1 MB whatever M."""
    key = (device, stream)
    kept = _workspaces.get(key)
    if kept is None or kept[1].numel() < n_tiles:
        if kept is not None:
            _outgrown.append(kept)
        n_tiles = max(n_tiles, 4096)
        kept = _workspaces[key] = _kept(device, lambda: (torch.empty(KEPT_PARTIALS, dtype=torch.float32, device=device),
                                                         torch.zeros(n_tiles, dtype=torch.int32, device=device)))
    partials = kept[0] if n_partials <= kept[0].numel() else torch.empty(n_partials, dtype=torch.float32,
                                                                          device=device)
    return partials, kept[1]


_compiled = {}  # (kernel, what its launch specialises on) -> (Triton's compiled kernel, the constexprs in order)
_SPEC_TYPES = (torch.Tensor,) if TensorDescriptor is None else (torch.Tensor, TensorDescriptor)


def _spec(arg):
    # What a Triton launch specialises on besides integer values (in the key as they are: a superset of
    # Triton's "== 1" and "% 16"): a tensor's dtype and 16-byte alignment, a TMA descriptor's tensor and block.
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    return _spec(arg.base) + (tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape))


def _launch(kernel, grid, args, **meta):
    """kernel[grid](*args, **meta) with less host time. Triton's launch re-derives the kernel's
    specialisation from every argument in Python on each call (about 25 µs on the H200 machine's CPU, and a
    decode step waits on the host); here the compiled kernel is looked up once per argument signature and
    launched directly. args are the non-constexpr arguments in order; meta holds constexprs and options.
    Traced by torch.compile (inside the triton_ops below), the launch goes into the graph through wrap_triton,
    so Inductor calls the kernel from its own generated code."""
    if _tracing(args[0]):
        return torch.library.wrap_triton(kernel)[grid](*args, **meta)
    if INTERPRET:  # the kernel runs as CPU ops (new_empty, set_, copy_...): a span named after it says whose
        with torch.profiler.record_function(kernel.fn.__name__):
            return kernel[grid](*args, **meta)
    device = _driver().get_current_device()
    compiled, constexprs = _compiled_for(kernel, grid, args, meta, device)
    compiled[grid + (1,) * (3 - len(grid))](*args, *constexprs, stream=_driver().get_current_stream(device))


def _compiled_for(kernel, grid, args, meta, device):
    """(Triton's compiled kernel, its constexprs in parameter order) for these arguments: compiled once per
    argument signature."""
    key = (kernel, device, *[_spec(a) if isinstance(a, _SPEC_TYPES) else a for a in args],
           *meta.items())
    entry = _compiled.get(key)
    if entry is None:
        compiled, meta = _compile_to_fit(kernel, grid, args, meta, device)
        if len(_compiled) > 4096:  # integer arguments (M) are part of the key: keep it bounded
            _compiled.clear()
        entry = _compiled[key] = (compiled, tuple(meta[name] for name in kernel.arg_names[len(args):]))
    return entry


def _tracing(t):
    """True for the fake and functional tensors torch.compile traces the triton_ops with: no data, no address."""
    t = getattr(t, "base", t)  # a TMA descriptor: its tensor
    return isinstance(t, (FakeTensor, FunctionalTensor))


def _compile_to_fit(kernel, grid, args, meta, device):
    """Compile kernel for these arguments; while its pipeline needs more shared memory than the GPU has (the
    configs are sized for a Hopper GPU's 227 KB; fp32 tiles take twice the bytes, a desktop GPU has ~100 KB),
    compile it again with one stage fewer. Returns the compiled kernel and the meta it was compiled with."""
    limit = _driver().utils.get_device_properties(device)["max_shared_mem"]
    while True:
        compiled = kernel.warmup(*args, grid=grid, **meta)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
            compiled = compiled.result()
        if compiled.metadata.shared <= limit or meta.get("num_stages", 1) <= 1:
            return compiled, meta  # at one stage Triton's own launch raises its out-of-resources error
        meta = dict(meta, num_stages=meta["num_stages"] - 1)


@functools.cache
def _driver():
    from triton.runtime import driver
    return driver.active


# Cached: at small M the forward is bound by host time, and these queries cost µs per call.
@functools.lru_cache(maxsize=None)
def _capability(device):
    return torch.cuda.get_device_capability(device)


@functools.lru_cache(maxsize=None)
def _num_sms(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 3  # interpreter: a few persistent programs, so each one loops over several tiles


def _split_k(device, tiles, k_steps, ctas_per_sm):
    """Split K until the programs fill one wave of the GPU: a power of two, at most 4 (measured) and k_steps."""
    split = 1
    while split < min(4, k_steps) and tiles * split * 1.5 < _num_sms(device) * ctas_per_sm:
        split *= 2
    return split


def _fast_tanh(x2d):
    # The hardware tanh for bf16 on a GPU; fp16 and fp32 keep the exact form, as does the interpreter.
    return not INTERPRET and x2d.dtype == torch.bfloat16


def _cdiv(a, b):  # triton.cdiv is a constexpr function: about 2 µs a call from host code
    return -(-a // b)


def _small_m_launch(x2d, weights, out, cfg):
    """(kernel, grid, tensors, rest, meta) of the small-M kernel over weights = (w_gate, w_up) (GeGLU) or (w,)
    (down_proj): out = x2d @ w^T and epilogue. Its arguments are tensors + rest (the integers); meta its constexprs."""
    M, K = x2d.shape
    N = weights[0].shape[0]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    tiles_m, tiles_n = _cdiv(M, BM), _cdiv(N, BN)
    fill = cfg.get("FILL")  # CTAs per SM to aim for by splitting K (down_proj: few output columns)
    split_k = cfg.get("SPLIT_K", 1) if fill is None else _split_k(x2d.device, tiles_m * tiles_n, _cdiv(K, BK), fill)
    part = counters = out  # unused without split-K
    if split_k > 1:  # fp32 partials [SPLIT_K, M, N] per accumulator and one arrival counter per output tile
        n_partials = split_k * M * N * len(weights)
        if _tracing(x2d):  # in a compiled graph: its own buffers (Inductor plans their memory)
            part = torch.empty(n_partials, dtype=torch.float32, device=x2d.device)
            counters = torch.zeros(tiles_m * tiles_n, dtype=torch.int32, device=x2d.device)
        else:
            stream = x2d.device.type == "cuda" and _driver().get_current_stream(x2d.device.index)
            part, counters = _split_k_workspace(x2d.device, stream, n_partials, tiles_m * tiles_n)
    geglu = len(weights) == 2
    return (_geglu_small_m_kernel if geglu else _linear_small_m_kernel, (tiles_m, tiles_n, split_k),
            (x2d, *weights, out, part, counters),
            (M, N, K, x2d.stride(0), *(w.stride(0) for w in weights), out.stride(0)),
            dict(BM=BM, BN=BN, BK=BK, SPLIT_K=split_k, UPCAST=_upcast_needed(x2d), DOT_PRECISION=_precision(x2d),
                 **({"FAST_TANH": _fast_tanh(x2d)} if geglu else {}),
                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


def _precision(x2d):
    # fp32 inputs: full-precision dots, like PyTorch's default matmul (tf32 would cost ~1e-3).
    return "ieee" if x2d.dtype == torch.float32 else "tf32"


def _upcast_needed(x2d):
    return INTERPRET and x2d.dtype == torch.bfloat16


def _check_geglu_args(x2d, w_gate, w_up):
    if w_gate.shape != w_up.shape:
        raise ValueError(f"gate and up weights differ in shape: {tuple(w_gate.shape)} vs {tuple(w_up.shape)}")
    if x2d.dim() != 2 or w_gate.dim() != 2 or x2d.shape[1] != w_gate.shape[1]:
        raise ValueError(f"geglu expects x2d [M, K] and weights [N, K], got {tuple(x2d.shape)}, {tuple(w_gate.shape)}")
    if not x2d.dtype == w_gate.dtype == w_up.dtype or x2d.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"geglu expects one dtype among bf16/fp16/fp32, got {x2d.dtype}, {w_gate.dtype}, "
                         f"{w_up.dtype}")


def geglu(x2d, w_gate, w_up, *, use_tma=None, kernel=None, config=None):
    """m = gelu_tanh(x2d @ w_gate^T) * (x2d @ w_up^T); [M, K] with [N, K] weights -> [M, N]. The kernels read both
    weights where they are: nothing is kept between calls but the small split-K workspace. kernel ('small', 'tma',
    'pointer', 'torch') and config override the choice by M (tune_fused.py's sweep); use_tma picks a tiled one."""
    return _geglu(x2d, w_gate, w_up, use_tma, kernel, config, save_gu=False)[0]


def geglu_saving_gu(x2d, w_gate, w_up, *, use_tma=None, kernel=None, config=None):
    """(m, g, u) for training: geglu's m, and g = x2d @ w_gate^T and u = x2d @ w_up^T in x2d's dtype for the backward,
    stored by the tiled kernels' epilogue (SAVE_GU) from the accumulators that made m: no GEMM run twice."""
    return _geglu(x2d, w_gate, w_up, use_tma, kernel, config, save_gu=True)


# Eager calls repeat a few shapes (a decode step's, a prefill chunk's) thousands of times, and with few tokens the
# forward waits on the host. What geglu and down_proj work out per call (the checks, the kernel and tile by M, split-K,
# the compiled kernel and its integer arguments) depends only on the key below: it is worked out once per key and kept
# as a function of the call's tensors, so that a call costs its key, a lookup, its outputs and its launches.
_plans = {}


def _plan_key(kind, x, weights):
    """What a call's plan depends on besides the module's globals, or None where every call is planned: a CPU
    tensor, one being traced, a tensor not contiguous or not 16-byte aligned (the kernels specialise on alignment).
    One flat tuple: it is built, hashed and compared at every call, on the host's path of each forward."""
    if type(x) is not torch.Tensor or not x.is_cuda or INTERPRET:  # subclasses: traced ones, DTensor...
        return None
    ptrs, contiguous = x.data_ptr(), x.is_contiguous()
    for w in weights:
        ptrs |= w.data_ptr()
        contiguous = contiguous and w.is_contiguous()
    if ptrs & 15 or not contiguous:
        return None
    # Where _launch launches, kept or not, and on which stream: the two queries Triton's CUDA driver makes, asked
    # of torch directly (through the driver's lazy proxy they cost several µs a call in a model's forward).
    device = _current_device()
    key = [kind, x.shape, x.dtype, x.get_device(), device, _current_stream(device), TORCH_WHERE_FASTER]
    for w in weights:
        key += (w.shape, w.dtype, w.get_device())
    if kind == "mlp":  # the MLP's plan also depends on whether gate and up are packed (see packed)
        key.append(packed(weights[0], weights[1]))
    return tuple(key)


_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _planned(key, make):
    """The kept plan of key, made by make() on first use; make() itself where there is no key."""
    if key is None:
        return make()
    run = _plans.get(key)
    if run is None:
        run = make()
        if len(_plans) > 4096:  # M is part of the key: keep it bounded
            _plans.clear()
        _plans[key] = run
    return run


def _bind(kernel, grid, tensors, rest, meta):
    """(launch, head, tail): launch(*head, *tensors, *tail) runs kernel on tensors like these with rest (its integer
    arguments) and meta, on the current stream. Compiled now; launched later with no key to build, through the
    compiled kernel's launcher itself where Triton has no launch hook set now (Proton's; what `kernel[grid]` adds to
    a launch is that hook's check), else through its runner."""
    device = _driver().get_current_device()
    compiled, constexprs = _compiled_for(kernel, grid, (*tensors, *rest), meta, device)
    grid, stream, tail = grid + (1,) * (3 - len(grid)), _driver().get_current_stream(device), (*rest, *constexprs)
    runner = compiled[grid]
    launcher = getattr(compiled, "run", None)
    if _launch_hooked() or not all(hasattr(compiled, a) for a in ("function", "packed_metadata")) or launcher is None:
        return (lambda *args: runner(*args, stream=stream)), (), tail
    return launcher, (*grid, stream, compiled.function, compiled.packed_metadata, None, None, None), tail


def _launch_hooked():
    knobs = getattr(triton, "knobs", None)
    return knobs is None or _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)


def _hook_set(hook):
    """A launch hook is set: since Triton 3.5 the knob is a HookChain, never None, holding the hooks added (none by
    default); before, a function or None. A chain whose list is not found counts as set (the runner then)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None) if type(hook).__name__ == "HookChain" else None
    return not isinstance(calls, list) or bool(calls)


def _torch_geglu(x2d, w_gate, w_up):  # g freed before u is made
    return F.gelu(F.linear(x2d, w_gate), approximate="tanh") * F.linear(x2d, w_up), None, None


def _torch_geglu_saving_gu(x2d, w_gate, w_up):
    g, u = F.linear(x2d, w_gate), F.linear(x2d, w_up)
    return F.gelu(g, approximate="tanh") * u, g, u


POINTWISE_BLOCK = 1024  # elements per program of the pointwise kernels: 8 per thread at 4 warps


def _pointwise_launch(kernel, n, like, meta, kept):
    """launch(*tensors) of a pointwise kernel over n contiguous elements (its tensor arguments, then n): bound once
    where kept, from tensors `like` them (a dtype and an alignment are all a launch specialises on), else through
    _launch at each call."""
    grid, meta = (_cdiv(n, POINTWISE_BLOCK),), {**meta, "BLOCK": POINTWISE_BLOCK, "num_warps": 4, "num_stages": 1}
    if not kept:
        return lambda *tensors: _launch(kernel, grid, (*tensors, n), **meta)
    launch, head, tail = _bind(kernel, grid, like, (n,), meta)
    return lambda *tensors: launch(*head, *tensors, *tail)


def _cublas_geglu_plan(x2d, w_gate, save_gu, kept):
    """run(x2d, w_gate, w_up) -> (m, g, u): cuBLAS's two GEMMs, then m = gelu_tanh(g) * u in _geglu_pointwise_kernel
    (g and u returned with save_gu, else None); where kept, its launch bound once for this shape. Without save_gu, m
    is written over g (each element is read before it is written, and g is not kept): no third [tokens, hidden]
    tensor, and one allocation less on the host."""
    like = tuple(torch.empty(1, device=x2d.device, dtype=x2d.dtype) for _ in "gum") if kept else ()
    pointwise = _pointwise_launch(_geglu_pointwise_kernel, x2d.shape[0] * w_gate.shape[0], like,
                                  {"FAST_TANH": _fast_tanh(x2d)}, kept)

    if save_gu:
        def run(x2d, w_gate, w_up):
            g, u = F.linear(x2d, w_gate), F.linear(x2d, w_up)
            m = torch.empty_like(g)
            pointwise(g, u, m)
            return m, g, u
    else:
        def run(x2d, w_gate, w_up):
            g = F.linear(x2d, w_gate)
            pointwise(g, F.linear(x2d, w_up), g)
            return g, None, None
    run.any_leading_shape = True  # x [..., K] with as many elements as x2d: F.linear keeps its shape
    return run


def _geglu(x2d, w_gate, w_up, use_tma, kernel, config, save_gu, where_faster=None):
    """(m, g, u), g and u None unless save_gu. where_faster: see plan (given, it is the plan's: no kept plan)."""
    chosen = use_tma is not None or kernel is not None or config is not None or where_faster is not None
    key = None if chosen else _plan_key(("geglu", save_gu), x2d, (w_gate, w_up))
    run = _planned(key, lambda: _geglu_plan(x2d, w_gate, w_up, use_tma, kernel, config, save_gu, key is not None,
                                            where_faster))
    return run(x2d, w_gate, w_up)


def _geglu_plan(x2d, w_gate, w_up, use_tma, kernel, config, save_gu, kept, where_faster=None):
    """The function (x2d, w_gate, w_up) -> (m, g, u) that runs geglu for tensors like these; kept: it serves later
    calls of the same plan key (see _plan_key), so the launch is bound in full."""
    _check_geglu_args(x2d, w_gate, w_up)
    path, cfg = plan(x2d, w_gate, w_up, use_tma, where_faster) if kernel is None else (kernel, None)
    # No GPU and no interpreter (or nothing faster at this M): the same math through cuBLAS and PyTorch. So too in
    # training at small M: the small-M kernel has no epilogue that stores g and u (and a few tokens' GEMMs are cheap).
    # On a GPU, eagerly, the GeGLU of the two GEMMs' outputs is one kernel of ours (traced, Inductor fuses it itself).
    if path == "torch" or (save_gu and path == "small"):
        if type(x2d) is torch.Tensor and x2d.is_cuda and not INTERPRET and x2d.shape[0] and w_gate.shape[0]:
            return _cublas_geglu_plan(x2d, w_gate, save_gu, kept)
        return _torch_geglu_saving_gu if save_gu else _torch_geglu
    cfg = config or cfg or default_config(path, x2d.shape[0])
    run = functools.partial(_run_geglu, path, cfg, save_gu)
    if not kept or not x2d.shape[0]:
        return run
    if path == "small":  # (save_gu went to PyTorch above)
        small = _kept_small_m(x2d, (w_gate, w_up), cfg)
        return run if small is None else (lambda x2d, w_gate, w_up: (small(x2d, w_gate, w_up), None, None))
    # The tiled kernels, bound from the first call's launch: later calls only make their outputs and descriptors.
    new = functools.partial(torch.empty, (x2d.shape[0], w_gate.shape[0]), device=x2d.device, dtype=x2d.dtype)
    kernel, grid, tensors, rest, meta = _geglu_launch(path, cfg, save_gu, x2d, w_gate, w_up, new(), *_gu(new, save_gu))
    launch, head, tail = _bind(kernel, grid, tensors, rest, meta)
    if path == "tma":
        def run(x2d, w_gate, w_up):
            m, g, u = new(), *_gu(new, save_gu)
            launch(*head, *_tma_descriptors(cfg, x2d, w_gate, w_up, m, g, u), *tail)
            return m, g, u
    else:
        def run(x2d, w_gate, w_up):
            m, g, u = new(), *_gu(new, save_gu)
            launch(*head, x2d, w_gate, w_up, m, *((g, u) if save_gu else (x2d, x2d)), *tail)
            return m, g, u
    return run


def _kept_small_m(x2d, weights, cfg):
    """run(x2d, *weights) -> out: the small-M kernel (_small_m_launch) bound from this call's launch, for later calls
    of its plan key: each makes its out; the split-K workspace is bound, or without split-K out stands in for it.
    None where each call allocates split-K partials of its own (more than KEPT_PARTIALS)."""
    new = functools.partial(torch.empty, (x2d.shape[0], weights[0].shape[0]), device=x2d.device, dtype=x2d.dtype)
    kernel, grid, tensors, rest, meta = _small_m_launch(x2d, weights, new(), cfg)
    out, part, counters = tensors[-3:]
    if part is not out and part.numel() > KEPT_PARTIALS:
        return None
    launch, head, tail = _bind(kernel, grid, tensors, rest, meta)
    if part is out:
        def run(x2d, *weights):
            out = new()
            launch(*head, x2d, *weights, out, out, out, *tail)
            return out
    else:
        def run(x2d, *weights):
            out = new()
            launch(*head, x2d, *weights, out, part, counters, *tail)
            return out
    return run


def _gu(new, save_gu):
    return (new(), new()) if save_gu else (None, None)


def _run_geglu(path, cfg, save_gu, x2d, w_gate, w_up):
    """geglu's (m, g, u) by the kernel path and its config, every choice made again."""
    x2d, w_gate, w_up = x2d.contiguous(), w_gate.contiguous(), w_up.contiguous()
    new = functools.partial(torch.empty, (x2d.shape[0], w_gate.shape[0]), device=x2d.device, dtype=x2d.dtype)
    m, g, u = new(), *_gu(new, save_gu)
    if x2d.shape[0]:
        kernel, grid, tensors, rest, meta = _geglu_launch(path, cfg, save_gu, x2d, w_gate, w_up, m, g, u)
        _launch(kernel, grid, (*tensors, *rest), **meta)
    return m, g, u


def _geglu_launch(path, cfg, save_gu, x2d, w_gate, w_up, m, g, u):
    """(kernel, grid, tensors, rest, meta) of geglu's kernel on this path (see _small_m_launch)."""
    if path == "small":
        return _small_m_launch(x2d, (w_gate, w_up), m, cfg)
    (M, K), N = x2d.shape, w_gate.shape[0]
    flags = dict(UPCAST=_upcast_needed(x2d), FAST_TANH=_fast_tanh(x2d), SAVE_GU=save_gu)
    if path == "tma":
        cfg = {"ONE_DOT": False, **cfg}  # every constexpr named: _launch passes them in order
        num_sms = _num_sms(x2d.device)
        return (_geglu_tma_kernel, (min(num_sms, _cdiv(M, cfg["BM"]) * _cdiv(N, cfg["BN"])),),
                _tma_descriptors(cfg, x2d, w_gate, w_up, m, g, u), (M, N, K), dict(NUM_SMS=num_sms, **flags, **cfg))
    cfg = {k: v for k, v in cfg.items() if k not in ("FLATTEN", "ONE_DOT")}  # the TMA kernel's only
    # Without SAVE_GU, g and u are never written: x2d stands in (not m, so that torch.compile's analysis of what a
    # kernel writes never sees one output under three names)
    return (_geglu_pointer_kernel, (_cdiv(M, cfg["BM"]) * _cdiv(N, cfg["BN"]),),
            (x2d, w_gate, w_up, m, *((g, u) if save_gu else (x2d, x2d))),
            (M, N, K, x2d.stride(0), w_gate.stride(0), w_up.stride(0), m.stride(0)),
            dict(DOT_PRECISION=_precision(x2d), **flags, **cfg))


def _tma_descriptors(cfg, x2d, w_gate, w_up, m, g, u):
    """The TMA kernel's descriptors: x, the weights, m, and with SAVE_GU g and u (else None: each one is made here
    and encoded again by Triton's launcher, on the host, at every launch, an unused one too)."""
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    return (TensorDescriptor.from_tensor(x2d, [BM, BK]), TensorDescriptor.from_tensor(w_gate, [BN, BK]),
            TensorDescriptor.from_tensor(w_up, [BN, BK]), TensorDescriptor.from_tensor(m, [BM, BN]),
            *((TensorDescriptor.from_tensor(g, [BM, BN]), TensorDescriptor.from_tensor(u, [BM, BN])) if g is not None
              else (None, None)))


def down_proj(m, w_down, *, config=None):
    """y = m @ w_down^T. For few tokens the small-M kernel (split-K: the weight has only dim rows to spread
    over the GPU; cuBLAS leaves bandwidth unused there); otherwise, and on a CPU, F.linear (cuBLAS)."""
    key = None if config is not None else _plan_key("down", m, (w_down,))
    return _planned(key, lambda: _down_plan(m, w_down, config, key is not None))(m, w_down)


def _down_plan(m, w_down, config, kept):
    """The function (m, w_down) -> y for tensors like these (see _geglu_plan)."""
    if (m.dim() != 2 or w_down.dim() != 2 or m.shape[1] != w_down.shape[1] or m.dtype != w_down.dtype
            or (m.device.type != "cuda" and (not INTERPRET or _tracing(m)))):
        return F.linear  # which raises on shapes that do not fit
    kernel, cfg = ("small", config) if config is not None else _by_m(m.device, m.shape[0], "down", m.shape[1])
    if kernel != "small":
        return F.linear
    run = functools.partial(_run_down, cfg)
    small = _kept_small_m(m, (w_down,), cfg) if kept and m.shape[0] else None
    return run if small is None else small


def mlp(x, w_gate, w_up, w_down):
    """down_proj(geglu(x, w_gate, w_up), w_down) over x of any leading shape, planned as one: one key a call, and few
    Python calls (in a model's forward each one costs several times what it does in a loop of its own). The eager
    module's forward, less its memo of the last call."""
    run = mlp_plan(x, w_gate, w_up, w_down)
    return _unplanned_mlp(x, w_gate, w_up, w_down) if run is None else run(x, w_gate, w_up, w_down)


def mlp_plan(x, w_gate, w_up, w_down):
    """mlp's kept plan for a call like this one (run(x, w_gate, w_up, w_down)), or None where calls are not planned."""
    key = _plan_key("mlp", x, (w_gate, w_up, w_down))
    return None if key is None else _planned(key, lambda: _mlp_plan(x, w_gate, w_up, w_down, packed(w_gate, w_up)))


def _unplanned_mlp(x, w_gate, w_up, w_down):  # a call with no plan key: geglu and down_proj work it out now
    out_shape = (*x.shape[:-1], w_down.shape[0])  # named, not -1: no tokens give an empty output
    return down_proj(geglu(x.reshape(-1, x.shape[-1]), w_gate, w_up), w_down).reshape(out_shape)


# In a model's eager forward, building mlp's key costs the module more host time than the rest of its Python (a dozen
# tensor queries, a list, a tuple hashed and compared: each Python step there costs several times what it does in a
# loop of its own). Each module keeps instead what its last planned call was like (_call_signature): the same key
# follows from the same input shape, dtype and device, the same current device and stream, the same globals, and
# weights at the same addresses with the same shapes (x and the weights were contiguous then, x 16-byte aligned:
# every planned call's are; a weight re-strided or re-typed in place at the same address and shape is not noticed).
# FusedGeGLUMLP.forward compares a call with it field by field, in this order.
def _call_signature(x, w_gate, w_up, w_down, run):
    device = _current_device()
    return (x.shape, x.dtype, x.get_device(), device, _current_stream(device), TORCH_WHERE_FASTER, _plans,
            w_gate.data_ptr(), w_up.data_ptr(), w_down.data_ptr(), w_gate.shape, w_up.shape, w_down.shape, run)


def packed(w_gate, w_up):
    """w_up's rows start where w_gate's end, in memory (FusedGeGLUMLP keeps them so: pack_gate_up): then one
    [2 * hidden, dim] view spans both, and cuBLAS runs gate and up as one GEMM."""
    return (w_up.data_ptr() - w_gate.data_ptr() == w_gate.numel() * w_gate.element_size()
            and w_gate.shape == w_up.shape)


def _mlp_plan(x, w_gate, w_up, w_down, both_packed=False):
    x2d = x.view(-1, x.shape[-1])  # contiguous: it has a plan key
    gate_up = _geglu_plan(x2d, w_gate, w_up, None, None, None, False, True)
    m = torch.empty((x2d.shape[0], w_gate.shape[0]), device=x.device, dtype=x.dtype)  # what down_proj will get
    down = _down_plan(m, w_down, None, True)
    if x.dim() == 2 or (getattr(gate_up, "any_leading_shape", False) and down is F.linear):
        # cuBLAS's GEMMs take [..., K] as it is, and the GeGLU kernel runs over the elements: no views to make
        run = lambda x, w_gate, w_up, w_down: down(gate_up(x, w_gate, w_up)[0], w_down)  # noqa: E731
    else:
        shape_2d, out_shape = x2d.shape, (*x.shape[:-1], w_down.shape[0])
        run = lambda x, w_gate, w_up, w_down: down(gate_up(x.view(shape_2d), w_gate, w_up)[0], w_down).view(out_shape)  # noqa: E731
    if (both_packed and getattr(gate_up, "any_leading_shape", False) and down is F.linear
            and packs_gate_up(x.device, *x2d.shape)):
        return _packed_mlp_plan(x2d, w_gate, run)
    return run


def _packed_mlp_plan(x2d, w_gate, unpacked):
    """Where cuBLAS runs gate and up, the two weights are packed and packs_gate_up says so: one
    [tokens, 2 * hidden] GEMM over both, _geglu_packed_kernel writing m over its g half, and down_proj's GEMM reading
    that half where it is (row stride 2 * hidden). Three launches, against the unpacked plan's four and
    transformers' MLP's five: in an eager model's forward, each is host time. unpacked: the plan for two weights
    adjacent by chance in two allocations, which no one view can span."""
    (M, K), N = x2d.shape, w_gate.shape[0]
    like = (torch.empty(1, device=x2d.device, dtype=x2d.dtype),)  # a fresh allocation's alignment, as gu's
    launch, head, tail = _bind(_geglu_packed_kernel, (M, _cdiv(N, POINTWISE_BLOCK)), like, (N, 2 * N),
                               {"FAST_TANH": _fast_tanh(x2d), "BLOCK": POINTWISE_BLOCK, "num_warps": 4,
                                "num_stages": 1})

    def kept(w_gate):
        """run for calls on weights at these addresses, over the [2 * hidden, dim] view of both made now (a view of
        their own storage: no memory), or None where w_gate's storage ends where w_gate does."""
        try:
            both = w_gate.as_strided((2 * N, K), (K, 1))
        except RuntimeError:
            return None

        def run_on_both(x, w_gate, w_up, w_down):
            gu = F.linear(x, both)
            launch(*head, gu, *tail)
            return F.linear(gu.narrow(-1, 0, N), w_down)
        return run_on_both

    def run(x, w_gate, w_up, w_down):
        return (kept(w_gate) or unpacked)(x, w_gate, w_up, w_down)
    run.kept = kept
    return run


def _run_down(cfg, m, w_down):
    m, w_down = m.contiguous(), w_down.contiguous()
    y = torch.empty((m.shape[0], w_down.shape[0]), device=m.device, dtype=m.dtype)
    if m.shape[0]:
        kernel, grid, tensors, rest, meta = _small_m_launch(m, (w_down,), y, cfg)
        _launch(kernel, grid, (*tensors, *rest), **meta)
    return y


# torch.compile sees the fused MLP as two triton_ops: Dynamo puts each in its graph as one op (it cannot trace the
# launchers' host-side choices), then AOTAutograd traces their bodies with fake tensors, so the kernels enter the
# graph through wrap_triton and Inductor launches them from its generated code, with no Python of this file per
# call. Called outside a compiled graph, a triton_op runs its body with plain tensors (the _launch fast path).
# where_faster is TORCH_WHERE_FASTER, passed in by the module's forward, which Dynamo traces: the graph then holds
# the value the body's choice of kernel depends on, so a graph compiled with one value is never taken from the
# compile caches for the other (the caches key on that graph, not on this module's globals). The tuned table is not
# in it: after re-tuning, clear the caches (TORCHINDUCTOR_CACHE_DIR) for compiled graphs to pick the new kernels.
@torch.library.triton_op("fused_geglu::geglu", mutates_args=())
def geglu_op(x2d: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, where_faster: bool = True) -> torch.Tensor:
    return _geglu(x2d, w_gate, w_up, None, None, None, False, where_faster)[0]


@torch.library.triton_op("fused_geglu::geglu_saving_gu", mutates_args=())
def geglu_saving_gu_op(x2d: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                       where_faster: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _geglu(x2d, w_gate, w_up, None, None, None, True, where_faster)


@triton.jit
def _geglu_backward_kernel(grad_m_ptr, g_ptr, u_ptr, grad_g_ptr, grad_u_ptr, n, BLOCK: tl.constexpr):
    # m = gelu_tanh(g) * u, one pass over [M, N] in fp32: grad_u = grad_m * gelu_tanh(g) and
    # grad_g = grad_m * u * gelu_tanh'(g). With s = sigmoid(2y), y = sqrt(2/pi) (g + 0.044715 g^3):
    # gelu_tanh(g) = g s (0.5 (1 + tanh y) = s) and gelu_tanh'(g) = s + 2 g s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
    # (1 - tanh^2 y = 4 s (1 - s)). One exp, no libdevice tanh (the interpreter has none), as in the forward.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M * N can pass 2^31
    mask = offs < n
    dm = tl.load(grad_m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-1.5957691216057308 * (g + 0.044715 * g * g * g)))  # 2 * sqrt(2/pi) * (...)
    slope = s + 2.0 * g * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)
    tl.store(grad_u_ptr + offs, (dm * g * s).to(grad_u_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_g_ptr + offs, (dm * u * slope).to(grad_g_ptr.dtype.element_ty), mask=mask)


def _torch_backward(grad_m, g, u):
    """(grad_g, grad_u) in fp32 PyTorch ops: for a CPU without the interpreter."""
    dm, gf, uf = grad_m.float(), g.float(), u.float()  # fp32 g and u are g and u themselves: both read first
    return torch.ops.aten.gelu_backward(dm * uf, gf, approximate="tanh"), dm * F.gelu(gf, approximate="tanh")


def _launch_backward(grad_m, g, u, grad_g, grad_u):
    """The kernel over contiguous g and u, into grad_g and grad_u (which may be g and u themselves); planned once per
    shape as the forward's launches are (a training step at the post's shape waits on the host too)."""
    if g.numel():
        tensors = (grad_m.contiguous(), g, u, grad_g, grad_u)
        key = _plan_key("backward", g, tensors)
        _planned(key, lambda: _pointwise_launch(_geglu_backward_kernel, g.numel(), tensors, {}, key is not None))(
            *tensors)


def backward_in_place(grad_m, g, u):
    """Of m = gelu_tanh(g) * u, in place: g becomes grad_g and u grad_u. One Triton kernel (fp32 math; each element
    read before its gradient is written over it); on a CPU without the interpreter the same in fp32 PyTorch ops."""
    if g.device.type != "cuda" and not INTERPRET:
        grad_g, grad_u = _torch_backward(grad_m, g, u)
        g.copy_(grad_g)
        u.copy_(grad_u)
        return
    if not (g.is_contiguous() and u.is_contiguous()):
        raise ValueError("geglu_backward_ writes the gradients over g and u: both must be contiguous")
    _launch_backward(grad_m, g, u, g, u)
    # A kernel's writes bump no version counter: autograd must see g and u as changed (saved ones are re-read by a
    # second backward through the same graph, which the check then refuses)
    torch.autograd.graph.increment_version(g)
    torch.autograd.graph.increment_version(u)


@torch.library.custom_op("fused_geglu::geglu_backward_", mutates_args=("g", "u"))
def geglu_backward_(grad_m: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> None:
    """backward_in_place as a custom op, so torch.compile can trace the backward (AOTAutograd functionalizes the
    mutation; where g and u are made inside the backward graph, Inductor writes over them)."""
    backward_in_place(grad_m, g, u)


@geglu_backward_.register_fake
def _(grad_m, g, u):
    return None


@torch.library.triton_op("fused_geglu::geglu_backward", mutates_args=())
def geglu_backward_op(grad_m: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_g, grad_u) as new tensors, for a compiled graph whose g and u were saved by forward: those are inputs of
    the backward graph, which Inductor may not write over, so the in-place op would cost it a copy of both first."""
    if g.device.type != "cuda" and (not INTERPRET or _tracing(g)):
        return tuple(t.to(g.dtype) for t in _torch_backward(grad_m, g, u))
    g, u = g.contiguous(), u.contiguous()
    grad_g, grad_u = torch.empty_like(g), torch.empty_like(u)
    _launch_backward(grad_m, g, u, grad_g, grad_u)
    return grad_g, grad_u


def _gradients(needs, x2d, w_gate, w_up, grad_g, grad_u):
    """(grad_x, grad_w_gate, grad_w_up) from g's and u's gradients, each None where `needs` says no: the gradients'
    GEMMs, x's two summed in one addmm."""
    need_x, need_wg, need_wu = needs
    return (torch.addmm(grad_g @ w_gate, grad_u, w_up) if need_x else None,
            grad_g.T @ x2d if need_wg else None,
            grad_u.T @ x2d if need_wu else None)


def _recompute_gu(x2d, w_gate, w_up):
    # Two cuBLAS GEMMs: with recompute=True forward kept no [M, hidden] tensor of its own, at the cost of these.
    return x2d @ w_gate.T, x2d @ w_up.T


# Under torch.compile: the two ops' autograd, recompute=True on geglu_op, recompute=False on geglu_saving_gu_op.
def _geglu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])  # x2d, w_gate, w_up (not where_faster)


def _geglu_backward(ctx, grad_m):
    x2d, w_gate, w_up = ctx.saved_tensors
    g, u = _recompute_gu(x2d, w_gate, w_up)
    geglu_backward_(grad_m, g, u)  # in place: g and u are the graph's own, two [M, hidden] buffers fewer at the peak
    return *_gradients(ctx.needs_input_grad[:3], x2d, w_gate, w_up, g, u), None


geglu_op.register_autograd(_geglu_backward, setup_context=_geglu_setup_context)


def _saving_setup_context(ctx, inputs, output):
    _, g, u = output
    ctx.mark_non_differentiable(g, u)
    ctx.set_materialize_grads(False)  # g's and u's gradients stay None, not two [M, hidden] zeros
    ctx.save_for_backward(*inputs[:3], g, u)


def _saving_backward(ctx, grad_m, _grad_g, _grad_u):
    x2d, w_gate, w_up, g, u = ctx.saved_tensors
    return *_gradients(ctx.needs_input_grad[:3], x2d, w_gate, w_up, *geglu_backward_op(grad_m, g, u)), None


geglu_saving_gu_op.register_autograd(_saving_backward, setup_context=_saving_setup_context)


class _TrainingGeGLU(torch.autograd.Function):
    """Eager training (not traced): the launchers and backward_in_place called directly. Through the ops above,
    torch.library's dispatch cost more host time than the launches: on the H200 machine about 280 µs for the
    forward's autograd node and 160 µs for geglu_backward_ per call at the post's shape."""

    @staticmethod
    def forward(ctx, x2d, w_gate, w_up, recompute):
        if recompute:
            m = geglu(x2d, w_gate, w_up)
            ctx.save_for_backward(x2d, w_gate, w_up)
        else:
            m, g, u = geglu_saving_gu(x2d, w_gate, w_up)
            ctx.save_for_backward(x2d, w_gate, w_up, g, u)
        return m

    @staticmethod
    @torch.autograd.function.once_differentiable  # backward writes over g and u: no graph of it to differentiate
    def backward(ctx, grad_m):
        x2d, w_gate, w_up, *gu = ctx.saved_tensors
        g, u = gu or _recompute_gu(x2d, w_gate, w_up)
        backward_in_place(grad_m, g, u)  # eager: saved or not, g and u are written over (no new [M, hidden] buffers)
        return *_gradients(ctx.needs_input_grad[:3], x2d, w_gate, w_up, g, u), None


def _training_geglu(x2d, w_gate, w_up, recompute):
    """m, with what the backward needs saved: x and the weights, and with recompute=False g and u."""
    if torch.compiler.is_compiling() or _tracing(x2d):  # the graph gets the ops, whose bodies it can trace
        return (geglu_op(x2d, w_gate, w_up, TORCH_WHERE_FASTER) if recompute
                else geglu_saving_gu_op(x2d, w_gate, w_up, TORCH_WHERE_FASTER)[0])
    return _TrainingGeGLU.apply(x2d, w_gate, w_up, recompute)


@torch.library.triton_op("fused_geglu::down_proj", mutates_args=())
def down_proj_op(m: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    return down_proj(m, w_down)


def _requires_grad(*tensors):
    return any(t.requires_grad for t in tensors)


def _pack_after_load(module, incompatible_keys):
    module._last_call = None  # it may hold a view of the weights' storage before the load
    module.pack_gate_up()  # load_state_dict(assign=True) gives the weights the state dict's own tensors


class FusedGeGLUMLP(nn.Module):
    """down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)) with gate, up and GeGLU in one kernel.

    Same parameter names as SimpleGeGLUMLP (gate_proj.weight, up_proj.weight, down_proj.weight), so
    `load_state_dict` moves weights both ways. The kernels read the gate and up weights where they are, so
    the module holds nothing beyond its parameters (and a weight changed in place is read as it is now). The two
    share one storage, gate's rows then up's (pack_gate_up): eagerly, where cuBLAS runs gate and up and the tuned
    table's packing rows say so (packs_gate_up), both projections are one GEMM. Eagerly, each module also keeps what
    its last call was like and that call's plan (_last_call): a call like it skips the plan's key (forward).

    Training: by default the forward kernel also stores g and u (two [tokens, hidden] tensors kept for backward,
    as Liger and eager PyTorch keep theirs); recompute=True keeps only x and runs the two GEMMs again in backward:
    less memory, more time.
    """

    def __init__(self, dim, hidden, recompute=False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.recompute = recompute
        self._last_call = None  # what the last eager call was like, and its plan (see forward)
        self.register_load_state_dict_post_hook(_pack_after_load)
        self.pack_gate_up()

    def extra_repr(self):
        return f"recompute={self.recompute}"

    def pack_gate_up(self):
        """Put gate_proj's and up_proj's weights in one storage, gate's rows then up's, each parameter a view of it
        (the same Parameter objects; their old storages are freed). Eagerly, where cuBLAS runs the projections, one
        GEMM then reads both: one launch fewer (_packed_mlp_plan), no extra memory. Done when the module is made and
        again after whatever gives the weights storages of their own: .to(), .cuda(), .half() (_apply),
        copy.deepcopy and unpickling (__setstate__), load_state_dict(assign=True) (a post hook). Left as they are
        where the two are not plain tensors of one shape, dtype and device (a DTensor, a parametrization). Costs a
        copy of both (and, for a moment, their memory once more)."""
        weights = [getattr(m, "_parameters", {}).get("weight") for m in (self.gate_proj, self.up_proj)]
        if not all(isinstance(w, torch.Tensor) and type(w.data) is torch.Tensor for w in weights):
            return
        g, u = (w.data for w in weights)
        if g.dim() != 2 or g.shape != u.shape or g.dtype != u.dtype or g.device != u.device:
            return
        if (g.is_contiguous() and u.is_contiguous() and packed(g, u)
                and g.untyped_storage().data_ptr() == u.untyped_storage().data_ptr()):
            return
        self._last_call = None  # it may hold a view of the old storages
        with torch.no_grad():
            both = torch.cat([g, u])
        weights[0].data, weights[1].data = both[:len(g)], both[len(g):]

    def _apply(self, fn, recurse=True):  # where the weights get new storages, repacking drops the kept last call
        out = super()._apply(fn, recurse)
        self.pack_gate_up()
        return out

    def __getstate__(self):  # copy.deepcopy, pickle: without the last call's plan (a closure over this process's kernels)
        return {**self.__dict__, "_last_call": None}

    def __setstate__(self, state):
        super().__setstate__({"_last_call": None, **state})  # also a module pickled before there was one
        self.pack_gate_up()

    def forward(self, x):
        if torch.compiler.is_dynamo_compiling():  # Dynamo traces the submodules' attributes as they are
            return self._forward(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
        # The hot path of an eager model's forward, where each Python step costs several times what it does in a
        # loop of its own: written out here, with no call but the plan's. The weights come from the submodules'
        # parameter dicts (a tenth of nn.Module's attribute lookup), through that lookup where a weight is not a
        # plain parameter there (parametrized, or a submodule replaced).
        try:
            modules = self._modules
            w_gate, w_up, w_down = (modules["gate_proj"]._parameters["weight"],
                                    modules["up_proj"]._parameters["weight"], modules["down_proj"]._parameters["weight"])
        except (KeyError, AttributeError):
            w_gate, w_up, w_down = self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
        # Inference like this module's last planned call (see _call_signature) takes that call's plan without
        # building mlp's key. An export's tensors are not plain tensors: they go on to _forward.
        last = self._last_call
        if last is not None and (not torch.is_grad_enabled() or not _requires_grad(x, w_gate, w_up, w_down)):
            shape, dtype, x_device, device, stream, where_faster, plans, p_gate, p_up, p_down, s_gate, s_up, s_down, \
                run = last
            if (type(x) is torch.Tensor and x.shape == shape and x.dtype is dtype and x.get_device() == x_device
                    and x.is_contiguous() and not x.data_ptr() & 15 and _current_device() == device
                    and _current_stream(device) == stream and TORCH_WHERE_FASTER is where_faster and _plans is plans
                    and w_gate.data_ptr() == p_gate and w_up.data_ptr() == p_up and w_down.data_ptr() == p_down
                    and w_gate.shape == s_gate and w_up.shape == s_up and w_down.shape == s_down):
                return run(x, w_gate, w_up, w_down)
        return self._forward(x, w_gate, w_up, w_down)

    def _forward(self, x, w_gate, w_up, w_down):
        # Any leading shape: the kernels see [tokens, dim]; the output's last size is named, not -1, so that
        # no tokens (M = 0) gives an empty output as nn.Linear does.
        if torch.is_grad_enabled() and _requires_grad(x, w_gate, w_up, w_down):
            # Training: down_proj is autograd's GEMM.
            x2d = x.reshape(-1, x.shape[-1])
            out = F.linear(_training_geglu(x2d, w_gate, w_up, self.recompute), w_down)
            return out.reshape(*x.shape[:-1], w_down.shape[0])
        if torch.compiler.is_compiling():
            x2d = x.reshape(-1, x.shape[-1])
            out = down_proj_op(geglu_op(x2d, w_gate, w_up, TORCH_WHERE_FASTER), w_down)
            return out.reshape(*x.shape[:-1], w_down.shape[0])
        # Eager inference: the launchers themselves, planned once per shape (mlp), and down_proj rather than
        # self.down_proj(m): the same GEMM (the small-M kernel for few tokens) without nn.Module's call overhead.
        run = mlp_plan(x, w_gate, w_up, w_down)
        if run is None:  # not planned (a CPU tensor, a strided x...): worked out at this call
            return _unplanned_mlp(x, w_gate, w_up, w_down)
        # The packed plan's kept form runs over a view of gate and up made now and kept with the signature: a view of
        # the weights' own storage, no memory of its own (a weight replaced by hand leaves the old storage held until
        # this module's next call, or a .to() that repacks them).
        kept = run.kept(w_gate) if hasattr(run, "kept") else None
        run = run if kept is None else kept
        out = run(x, w_gate, w_up, w_down)
        self._last_call = _call_signature(x, w_gate, w_up, w_down, run)  # a call that raised is not kept
        return out
