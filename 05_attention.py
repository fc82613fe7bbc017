"""Profile a decoder's causal self-attention block: the score matrix written out, then fused away.

    uv run 05_attention.py --impl math
    uv run 05_attention.py --impl sdpa                      # --backend flash|efficient|cudnn|math to choose
    uv run 05_attention.py --impl flex
    uv run 05_attention.py --impl sdpa --backend flash --decode

The block as Llama and Gemma write it: q_proj, k_proj, v_proj, rotary position embedding (RoPE), the
attention core, o_proj, all bias=False, with grouped-query attention (--kv_heads KV heads shared by --heads
query heads). The defaults are Llama-3-8B's attention: 32 heads, 8 KV heads, head_dim 128, at batch 4 x 2048.

What to look for in the trace (Perfetto, or the report printed below):
- math: softmax(Q K^T / sqrt(d) + causal mask) V written out in PyTorch: two batched GEMMs (aten::bmm) with
  the scale, mask and softmax kernels between them; the [batch, heads, seq, seq] scores are allocated
  (1 GiB in bf16 at the defaults, and the fp32 softmax doubles it): see the step's peak allocation.
- sdpa: one attention kernel whose name says the backend (cuDNN, pytorch_flash::flash_fwd_kernel, fmha_cutlass...)
  and no score matrix. On the CPU: aten::_scaled_dot_product_flash_attention_for_cpu.
- flex: FlexAttention with a causal block mask, compiled (as its docs require): one triton_tem_fused_flex_attention kernel.
- --compile on math: the scale, mask and softmax chain becomes one fused kernel; the RoPE pointwise ops fuse too.
- views (view, transpose, expand) launch nothing.
- --decode: one new token per sequence attends to a KV cache of --seq entries: little compute per byte of
  cache read, so the step is memory-bound; where batch x heads leaves SMs idle, flash splits the KV sequence
  (flash_fwd_splitkv_kernel + a combine kernel).
"""

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import common
import inspect_trace as it
from trace_reader.analyzers import memory

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
# The attention kernel's name says which backend ran: cudnn_generated_..._sdpa_..._flash_fprop_... (cuDNN),
# pytorch_flash::flash_fwd_kernel (flash), fmha_cutlassF_... (memory-efficient). Whenever batch x heads leaves SMs
# idle (at prefill too) flash splits the KV sequence: flash_fwd_splitkv_kernel, then a combine kernel that merges.
FLASH_KERNEL, FLASH_COMBINE = r"flash_fwd_(splitkv_)?kernel", r"flash_fwd_splitkv_combine"
SDPA_KERNEL = {"cudnn": r"cudnn", "flash": FLASH_KERNEL, "efficient": r"fmha|efficient_attention",
               "auto": rf"cudnn|{FLASH_KERNEL}|fmha|efficient_attention"}
CUDA_ONLY = {"cudnn", "efficient"}  # sdpa's CPU kernels: flash (aten::_scaled_dot_product_flash_attention_for_cpu), math


# FlexAttention is meant to be compiled (its docs): eager flex_attention runs a slow reference that
# materialises the scores. Compiled, it is one Triton kernel generated for the mask. Made on first use:
# torch.compile imports Dynamo (4 CPU-s), which the math and sdpa runs do not need.
@functools.cache
def compiled_flex_attention():
    return torch.compile(flex_attention)


def sdpa_refusal(call):
    """(call(), None), or (None, why) when sdpa has no kernel allowed for this input ("No available kernel")."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            return call(), None
        except RuntimeError as e:
            if "No available kernel" not in str(e) and "No viable backend" not in str(e):
                raise
            # torch says why in warnings ("... not used because ..."); else its error's first line is all we have
            why = "; ".join(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in warned))
            return None, why or str(e).strip().splitlines()[0]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def math_attention(q, k, v, causal):
    """softmax(Q K^T / sqrt(d) + mask) V, written out: the [batch, heads, s_q, s_kv] scores live in memory."""
    b, kv_heads, s_kv, d = k.shape
    groups = q.shape[1] // kv_heads  # GQA: each KV head serves `groups` query heads; expand is a view, contiguous copies
    k = k[:, :, None].expand(b, kv_heads, groups, s_kv, d).contiguous().view(b, kv_heads * groups, s_kv, d)
    v = v[:, :, None].expand(b, kv_heads, groups, s_kv, d).contiguous().view(b, kv_heads * groups, s_kv, d)
    scores = torch.matmul(q, k.transpose(2, 3)) * d**-0.5
    if causal:
        mask = torch.full((q.shape[2], s_kv), float("-inf"), device=q.device).triu(1)  # -inf above the diagonal
        scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


class Attention(nn.Module):
    def __init__(self, heads, kv_heads, head_dim, impl):
        super().__init__()
        dim = heads * head_dim
        self.heads, self.kv_heads, self.head_dim, self.impl = heads, kv_heads, head_dim, impl
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)
        self.block_mask = None  # flex only: built once, outside the step

    def forward(self, x, cos, sin, cache=None):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [b, heads, s, d]: views
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # RoPE: rotate each pair of channels by its position's angle
        k = k * cos + rotate_half(k) * sin
        if cache is not None:  # decode: the new token's k, v go into the static cache's last slot
            k_cache, v_cache = cache
            k_cache[:, :, -s:] = k
            v_cache[:, :, -s:] = v
            k, v = k_cache, v_cache
        causal = cache is None  # one decode token comes after every cached one: it sees them all
        if self.impl == "math":
            o = math_attention(q, k, v, causal)
        elif self.impl == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        else:
            o = compiled_flex_attention()(q, k, v, block_mask=self.block_mask, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).contiguous().view(b, s, -1))  # back to [b, s, heads * d]


def rope_tables(positions, head_dim, device, dtype, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(positions.float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def other_tensors(args, elt):
    """(bytes, what) of the largest tensor besides the scores that one op hands to the next at prefill: q, k, v and
    the output with RoPE's temporaries and GQA's expanded k, v ([batch, seq, heads * head_dim]), the fused kernels'
    fp32 [batch, heads, seq] log-sum-exp, and the math path's [seq, seq] causal mask (fp32 at most)."""
    b, s, h, d = args.batch, args.seq, args.heads, args.head_dim
    sizes = {"the [batch, seq, heads * head_dim] activations": b * s * h * d * elt,
             "the fp32 [batch, heads, seq] log-sum-exp": b * h * s * 4}
    if args.impl == "math" or args.backend == "math":
        sizes["the fp32 [seq, seq] causal mask"] = s * s * 4
    what = max(sizes, key=sizes.get)
    return sizes[what], what


# Guess first, then look: what each variant's trace should hold. Checked against the trace after the run.
def flash_splits(programs: int, kv_len: int, head_dim: int) -> list:
    """At one query token flash runs one program per (sequence, head): fewer programs than SMs leave SMs idle, so
    it splits the KV sequence into blocks of its key tile and merges the partial results in a second kernel. With a
    program for every SM already, or a cache of one key block, it may not split: then the guess does not apply."""
    key_block = 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64  # flash's key tile (kBlockN) at decode

    def idle_sms(t):
        sms = t.device_props[0].get("numSms") if t.device_props else None
        if kv_len <= key_block:
            return f"a KV cache of {kv_len} is one block of flash's {key_block}-key tile: nothing to split"
        if type(sms) is not int:
            return "the trace does not say how many SMs the GPU has"
        if programs >= sms:
            return f"batch x heads = {programs} programs for {sms} SMs: no SM idle, flash need not split"
        return None

    def applies(check):
        def run(t):
            why = idle_sms(t)
            return check.check(t) if why is None else it.NotApplicable(why)
        return it.Expect(check.text, run, check.device)

    return [applies(it.kernel(r"splitkv", what="flash splits the KV sequence when batch x heads leaves SMs idle")),
            applies(it.kernel(r"combine", per_step=1, what="and merges the splits"))]


def expectations(args, score_bytes, kv_bytes, others=(0, "")):
    impl, backend, compiled, decode = args.impl, args.backend, args.compile, args.decode
    exp = [it.steps(args.active, "attention_fwd")]
    # At prefill the [b, h, s, s] scores outweigh the other activations once seq > head_dim (else the check says
    # it cannot tell); at decode the KV cache outweighs them.
    what = "the [batch, heads, seq, seq] score matrix"
    scores = [] if decode else [memory.allocates(score_bytes, what, others=others)]
    no_scores = [] if decode else [memory.allocates(score_bytes, what, present=False, others=others)]
    if not compiled:
        exp += [it.cpu_op("aten::linear", per_step=4), it.views_launch_nothing()]
    if impl == "math" and not compiled:
        exp += [it.cpu_op("aten::bmm", per_step=2), it.cpu_op("aten::_softmax", per_step=1),
                it.kernel(r"(?i)softmax", per_step=1, what="the softmax"), *scores]
        if not decode:
            exp.append(it.kernel(r"triu", per_step=1, what="the causal mask"))
    elif impl == "math":
        exp += [it.cpu_op("aten::_softmax", present=False), *scores,
                it.kernel(r"^triton_.*fused.*softmax", what="scale, mask and softmax fused by Inductor"),
                it.cpu_event(r"cpp_fused.*softmax")]
    elif impl == "sdpa" and backend == "math":
        exp += [it.cpu_event(r"^aten::_scaled_dot_product_attention_math$", device="any"),
                *scores]
    elif impl == "sdpa":
        exp += [it.cpu_op("aten::bmm", present=False), *no_scores,
                it.kernel(SDPA_KERNEL[backend], per_step=None if decode else 1, what=f"the {backend} attention kernel"),
                it.cpu_event(r"^aten::_scaled_dot_product_flash_attention_for_cpu$")]
        if decode:
            exp.append(memory.streams(rf"{SDPA_KERNEL[backend]}|{FLASH_COMBINE}", kv_bytes, "the KV cache"))
        if decode and backend == "flash":
            exp += flash_splits(args.batch * args.heads, args.seq, args.head_dim)
    else:
        flex = r"^triton_tem_fused_flex_(attention|decoding)"
        exp += [it.kernel(flex, per_step=1, what="FlexAttention's Triton template"),
                it.cpu_event(r"^Torch-Compiled Region", device="any"),
                *no_scores]
        if decode:
            exp.append(memory.streams(flex, kv_bytes, "the KV cache"))
    if impl == "sdpa" and not compiled:
        exp.append(it.cpu_op("aten::scaled_dot_product_attention", per_step=1))
    if compiled:  # RoPE's rotate_half, multiplies and add: one fused pointwise kernel
        exp += [it.kernel(r"^triton_poi_fused.*cat", what="RoPE"), it.cpu_event(r"cpp_fused.*cat.*neg")]
    return exp


def main():
    p = common.parser(__doc__, post_sizes=False, batch=4, seq=2048, heads=32, kv_heads=8, head_dim=128)
    p.add_argument("--impl", choices=["math", "sdpa", "flex"], default="sdpa", help="the attention core")
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto",
                   help="sdpa only: which kernel torch.nn.attention.sdpa_kernel allows")
    p.add_argument("--decode", action="store_true",
                   help="one new token per sequence, attending to a KV cache of --seq entries")
    args = p.parse_args()
    b, s, h, kv, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    if h % kv:
        raise common.Fail(f"--heads {h} is not a multiple of --kv_heads {kv}: each KV head serves a whole group")
    if d % 2:
        raise common.Fail(f"--head_dim {d} is odd: RoPE rotates pairs of channels")
    if args.backend != "auto" and args.impl != "sdpa":
        raise common.Fail(f"--backend picks sdpa's kernel; --impl {args.impl} has none (use --impl sdpa)")
    s_q = 1 if args.decode else s
    dim = h * d
    # weights, activations, the KV cache; math's scores in the dtype, their fp32 softmax, and the fp32 reference's
    elements = 4 * dim * dim + 8 * b * s * dim + (5 * b * h * s_q * s if args.impl == "math" else 0)
    # FlexAttention is always compiled (compiled_flex_attention): its runs are named _compile, and set up as such.
    run = common.setup(__file__, args, elements=elements + 4 * b * h * s_q * s, compiled=args.impl == "flex")
    if args.backend in CUDA_ONLY and not run.cuda:
        raise common.Fail(f"--backend {args.backend} is CUDA-only; on a CPU, sdpa runs --backend flash or math (or auto)")
    common.describe(run)

    model = Attention(h, kv, d, args.impl).to(run.device, run.dtype).eval()
    x = torch.randn(b, s_q, dim, device=run.device, dtype=run.dtype)
    cos, sin = rope_tables(torch.arange(s - s_q, s, device=run.device), d, run.device, run.dtype)
    cache = None
    if args.decode:  # a cache of s entries: s - 1 earlier tokens, the last slot for this one
        cache = tuple(torch.randn(b, kv, s, d, device=run.device, dtype=run.dtype) for _ in range(2))
    if args.impl == "flex":  # bottom-right aligned causal mask: query i is at position s - s_q + i
        model.block_mask = create_block_mask(lambda b_, h_, q_idx, kv_idx: q_idx + (s - s_q) >= kv_idx,
                                             None, None, s_q, s, device=run.device)
    forward = torch.compile(model) if args.compile else model
    allowed = list(BACKENDS.values()) if args.backend == "auto" else [BACKENDS[args.backend]]

    @torch.no_grad()
    def step():
        with sdpa_kernel(allowed):  # sdpa's choice among the allowed kernels; math and flex ignore it
            return forward(x, cos, sin, cache)

    # Correct before fast: the same weights through fp32 math attention must give the same output.
    reference = Attention(h, kv, d, "math").to(run.device, torch.float32).eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = reference(x.float(), cos.float(), sin.float(), None if cache is None else tuple(c.float() for c in cache))
        try:
            out, refused = sdpa_refusal(step)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # a torch whose Inductor has no CPU FlexAttention
            if run.cuda or args.impl != "flex":
                raise
            raise common.Fail(f"FlexAttention does not compile for the CPU in torch {torch.__version__} "
                              f"({str(e).strip().splitlines()[0][:200]}); run it on a GPU") from None
    if refused:
        raise common.Fail(f"sdpa --backend {args.backend} cannot run this input on the {run.device.type}: {refused}")
    common.check_close(run, f"{args.impl} attention", out, expected, "fp32 math attention")

    name = f"{b}x{s}x{h}x{kv}x{d}_{args.impl}" + (f"_{args.backend}" if args.impl == "sdpa" else "")
    name += "_decode" if args.decode else ""
    # flex is compiled either way; --compile compiles the whole block around it too: a trace of its own.
    flags = "_block" if args.impl == "flex" and args.compile else ""
    score_bytes = b * h * s_q * s * run.dtype.itemsize
    kv_bytes = 2 * b * kv * s * d * run.dtype.itemsize
    guesses = expectations(args, score_bytes, kv_bytes, other_tensors(args, run.dtype.itemsize))
    trace, _ = common.record(run, step, "attention_fwd", name, guesses, profile_memory=True, flags=flags)
    print(memory.describe_peaks(it.load_trace(trace), score_bytes, "the score matrix"))


if __name__ == "__main__":
    common.main(main)
