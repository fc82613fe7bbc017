"""The Triton kernels of the fused MLP, and their tile configs.

One kernel computes each output tile of m from a tile of x and the matching rows of Wg and Wu,

    g = x_tile @ Wg_tile^T,  u = x_tile @ Wu_tile^T   (two fp32 accumulators in registers, one x tile)
    m_tile = act(g) * u                              (the "epilogue"), stored once as bf16

with act = gelu_tanh (GeGLU: Gemma) or silu (SwiGLU: Llama, Qwen, Mistral), a compile-time choice (the constexpr ACT,
last in each kernel's parameters, GeGLU by default): the same kernels, and their names in a trace, for both. The
names say "geglu" for both activations: traces and the trace reader know them by these names.

so g and u never exist in HBM: 2 x 50 MB written and 2 x 50 MB read back are gone at the post's shape, and only m
(50 MB) is stored. The kernels read both weights where they are (two pointers, or two TMA descriptors).

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

Where cuBLAS runs gate and up, `_geglu_pointwise_kernel` (two GEMMs' outputs) or `_geglu_packed_kernel` (one GEMM's,
over the packed weights) makes m in one pass; `_geglu_backward_kernel` is training's (training.py): the gradients of g
and u, and m again for down_proj's weight gradient.
"""

import triton  # Linux wheels only (pyproject.toml): scripts import this package once they know it is there
import triton.language as tl


# The activation of the gated MLP, a compile-time choice of every kernel below (ACT, a constexpr: one compiled kernel
# per activation, no branch at run time): "gelu_tanh" (GeGLU: Gemma) or "silu" (SwiGLU: Llama, Qwen, Mistral).
ACTIVATIONS = ("gelu_tanh", "silu")


@triton.jit
def _hardware_tanh(y):
    # bf16 output on a GPU: the hardware's tanh, one instruction (relative error about 2^-11, below bf16's rounding,
    # 2^-9), where the exact forms below take an exp and a division.
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [y], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _glu_epilogue(g, u, FAST_TANH: tl.constexpr, ACT: tl.constexpr):
    """act(g) * u in fp32: act = gelu_tanh (GeGLU) or silu (SwiGLU)."""
    if ACT == "silu":
        if FAST_TANH:  # sigmoid(g) = 0.5 * (1 + tanh(g / 2)): one hardware tanh, as GeLU's fast form below
            return 0.5 * g * (1.0 + _hardware_tanh(0.5 * g)) * u
        # silu(g) = g * sigmoid(g) = g / (1 + exp(-g)); very negative g: exp(-g) -> inf, g/inf = -0, no NaN.
        return g / (1.0 + tl.exp(-g)) * u
    if FAST_TANH:
        # At K = 768 the epilogue is a tenth of a tile's time and the hardware tanh halves it: 8% faster gate/up at
        # the post's shape on the H200.
        t = _hardware_tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))  # sqrt(2/pi) * (...)
        return 0.5 * g * (1.0 + t) * u
    # gelu_tanh(g) = 0.5 * g * (1 + tanh(y)) with y = sqrt(2/pi) * (g + 0.044715 g^3),
    # and 0.5 * (1 + tanh(y)) = 1 / (1 + exp(-2y)): one exp and no libdevice tanh, which the CPU
    # interpreter cannot run. No overflow to NaN: exp(-2y) -> inf for very negative g gives g/inf = -0.
    two_y = 1.5957691216057308 * (g + 0.044715 * g * g * g)  # 2 * sqrt(2/pi) * (...)
    return g / (1.0 + tl.exp(-two_y)) * u


@triton.jit
def _geglu_pointwise_kernel(g_ptr, u_ptr, m_ptr, n, FAST_TANH: tl.constexpr, BLOCK: tl.constexpr,
                            ACT: tl.constexpr = "gelu_tanh"):
    # m = act(g) * u over contiguous g, u and m, in fp32: the "torch" path's GeGLU (or SwiGLU) on a GPU, one pass over
    # g and u where PyTorch's activation and mul make two (the same epilogue as the fused kernels).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M * N can pass 2^31
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(m_ptr + offs, _glu_epilogue(g, u, FAST_TANH, ACT).to(m_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_packed_kernel(gu_ptr, n, row_stride, FAST_TANH: tl.constexpr, BLOCK: tl.constexpr,
                         ACT: tl.constexpr = "gelu_tanh"):
    # The same GeGLU over rows of [g | u], one [tokens, 2 * hidden] output of one cuBLAS GEMM over the packed gate and
    # up weights: m = act(g) * u written over g (row r's m is row r's first n elements; each element is read
    # before it is written). Grid: (rows, column blocks).
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = gu_ptr + tl.program_id(0).to(tl.int64) * row_stride  # int64: rows * 2 * hidden can pass 2^31
    g = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(row + n + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(row + offs, _glu_epilogue(g, u, FAST_TANH, ACT).to(gu_ptr.dtype.element_ty), mask=mask)


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
                      FAST_TANH: tl.constexpr, ONE_DOT: tl.constexpr, SAVE_GU: tl.constexpr,
                      ACT: tl.constexpr = "gelu_tanh"):
    """m[M, N] = act(x @ Wg^T) * (x @ Wu^T), x [M, K], Wg and Wu [N, K], act = gelu_tanh or silu (ACT); persistent,
    TMA loads and stores.

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
        m = _glu_epilogue(acc_g, acc_u, FAST_TANH, ACT)
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
def _store_out(out_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_om, GEGLU: tl.constexpr, FAST_TANH: tl.constexpr,
               ACT: tl.constexpr):
    if GEGLU:
        tile = _glu_epilogue(acc_g, acc_u, FAST_TANH, ACT)
    else:
        tile = acc_g
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, tile.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _geglu_pointer_kernel(x_ptr, wg_ptr, wu_ptr, m_ptr, g_ptr, u_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                          stride_mm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, FAST_TANH: tl.constexpr,
                          SAVE_GU: tl.constexpr, ACT: tl.constexpr = "gelu_tanh"):
    """Same computation as _geglu_tma_kernel with masked pointer loads: one program per tile. With SAVE_GU, g and u
    ([M, N] with m's strides) are stored too."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc_g, acc_u = _dot_main_loop(x_ptr, wg_ptr, wu_ptr, offs_m, offs_n, tl.arange(0, BK), M, N, K, tl.cdiv(K, BK),
                                  stride_xm, stride_wg, stride_wu, BM, BN, BK, True, UPCAST, DOT_PRECISION)
    _store_out(m_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_mm, True, FAST_TANH, ACT)
    if SAVE_GU:
        _store_out(g_ptr, acc_g, acc_g, offs_m, offs_n, M, N, stride_mm, False, FAST_TANH, ACT)
        _store_out(u_ptr, acc_u, acc_u, offs_m, offs_n, M, N, stride_mm, False, FAST_TANH, ACT)


@triton.jit
def _small_m_body(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                  stride_om, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                  GEGLU: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, FAST_TANH: tl.constexpr,
                  ACT: tl.constexpr):
    """Few tokens: act(x @ Wg^T) * (x @ Wu^T) (GEGLU, act by ACT), or x @ Wg^T alone (down_proj); x [M, K], W [N, K].

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
        _store_out(out_ptr, acc_g, acc_u, offs_m, offs_n, M, N, stride_om, GEGLU, FAST_TANH, ACT)
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
            _store_out(out_ptr, total_g, total_u, offs_m, offs_n, M, N, stride_om, GEGLU, FAST_TANH, ACT)
            tl.store(count_ptr + tile, 0)


# Two kernels over one body, so a trace names what each launch computes.
@triton.jit(do_not_specialize=["M"])
def _geglu_small_m_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg,
                          stride_wu, stride_om, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          FAST_TANH: tl.constexpr, ACT: tl.constexpr = "gelu_tanh"):
    _small_m_body(x_ptr, wg_ptr, wu_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wg, stride_wu,
                  stride_om, BM, BN, BK, SPLIT_K, True, UPCAST, DOT_PRECISION, FAST_TANH, ACT)


@triton.jit(do_not_specialize=["M"])
def _linear_small_m_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                           UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    _small_m_body(x_ptr, w_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_wn,
                  stride_om, BM, BN, BK, SPLIT_K, False, UPCAST, DOT_PRECISION, False, "gelu_tanh")


@triton.jit
def _glu_slope(g, ACT: tl.constexpr):
    """(act(g), act'(g)) in fp32, one exp and no libdevice tanh (the interpreter has none), as in the forward.
    silu: with s = sigmoid(g), silu(g) = g s and silu'(g) = s (1 + g (1 - s)).
    gelu_tanh: with s = sigmoid(2y), y = sqrt(2/pi) (g + 0.044715 g^3): gelu_tanh(g) = g s (0.5 (1 + tanh y) = s) and
    gelu_tanh'(g) = s + 2 g s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 g^2) (1 - tanh^2 y = 4 s (1 - s)).
    Very negative g: exp -> inf, s = 0, both 0 (no NaN); very positive: s = 1."""
    if ACT == "silu":
        s = 1.0 / (1.0 + tl.exp(-g))
        return g * s, s * (1.0 + g * (1.0 - s))
    s = 1.0 / (1.0 + tl.exp(-1.5957691216057308 * (g + 0.044715 * g * g * g)))  # 2 * sqrt(2/pi) * (...)
    return g * s, s + 2.0 * g * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)


@triton.jit
def _geglu_backward_kernel(grad_m_ptr, g_ptr, u_ptr, grad_g_ptr, grad_u_ptr, m_ptr, n, BLOCK: tl.constexpr,
                           ACT: tl.constexpr = "gelu_tanh", STORE_M: tl.constexpr = False):
    # m = act(g) * u, one pass over [M, N] in fp32: grad_u = grad_m * act(g) and grad_g = grad_m * u * act'(g). With
    # STORE_M also m itself, for down_proj's weight gradient (eager training saves no m: it is made again here from
    # the g and u read anyway). Any output may be an input's buffer (grad_g over g, grad_u over u, m over grad_m):
    # each element is loaded before anything is stored. Without STORE_M, m_ptr is never written (a stand-in).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M * N can pass 2^31
    mask = offs < n
    dm = tl.load(grad_m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, slope = _glu_slope(g, ACT)
    tl.store(grad_u_ptr + offs, (dm * act).to(grad_u_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_g_ptr + offs, (dm * u * slope).to(grad_g_ptr.dtype.element_ty), mask=mask)
    if STORE_M:
        tl.store(m_ptr + offs, (act * u).to(m_ptr.dtype.element_ty), mask=mask)


# The kernels keep the names above, which traces show (and the trace reader's MLP_KERNELS knows); the launchers in
# the other files reach them by these.
geglu_pointwise_kernel = _geglu_pointwise_kernel
geglu_packed_kernel = _geglu_packed_kernel
geglu_tma_kernel = _geglu_tma_kernel
geglu_pointer_kernel = _geglu_pointer_kernel
geglu_small_m_kernel = _geglu_small_m_kernel
linear_small_m_kernel = _linear_small_m_kernel
geglu_backward_kernel = _geglu_backward_kernel


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
POINTWISE_BLOCK = 1024  # elements per program of the pointwise kernels: 8 per thread at 4 warps
