"""Training: the backward kernel's launches, the backward ops, the autograd of ops.py's ops, and eager training's own
autograd.Function for the whole MLP.

With SAVE_GU the tiled kernels' epilogue also stores g and u (in x's dtype) from the accumulators that made m, and
backward uses them; FusedGeGLUMLP(recompute=True) saves only x and recomputes them with two cuBLAS GEMMs instead (less
memory, two more GEMMs). Either way one Triton kernel, `_geglu_backward_kernel` (GeGLU's or SwiGLU's derivative, by
its constexpr ACT), reads grad_m, g and u once and writes grad_g and grad_u over g and u (fp32 math), where PyTorch ops
would take several passes over [M, hidden]. Eager training is one plain autograd.Function over gate, up, the
activation and down_proj (torch.library's dispatch costs more host time than the launches): besides x and the weights
it saves g and u, or nothing with recompute=True, and never m, which down_proj's own autograd would save for its
weight gradient; the backward kernel writes m = act(g) * u again over grad_m instead, from the g and u it reads
anyway. So at most three [M, hidden] tensors are alive at once in backward: g, u and grad_m (then m). torch.compile
sees the ops (and, for saved g and u, an out-of-place backward op) and down_proj as autograd's linear, and plans
what its graph saves itself. `bench_train.py` times both modes against eager, compile and Liger.
"""

import torch
import torch.nn.functional as F

from . import kernels, launcher, machine, ops, table


def _torch_backward(grad_m, g, u, activation, store_m=False):
    """(grad_g, grad_u, m or None) in fp32 PyTorch ops: for a CPU without the interpreter. m = act(g) * u with
    store_m."""
    dm, gf, uf = grad_m.float(), g.float(), u.float()  # fp32 g and u are g and u themselves: all read first
    grad_g = (torch.ops.aten.silu_backward(dm * uf, gf) if activation == "silu"
              else torch.ops.aten.gelu_backward(dm * uf, gf, approximate="tanh"))
    act = ops.torch_activation(gf, activation)
    return grad_g, dm * act, act * uf if store_m else None


def _launch_backward(grad_m, g, u, grad_g, grad_u, activation, m=None):
    """The kernel over contiguous g and u, into grad_g and grad_u (which may be g and u themselves), and with m also
    act(g) * u into m (which may be grad_m itself, contiguous then); planned once per shape, activation and whether m
    is stored, as the forward's launches are (a training step at the post's shape waits on the host too)."""
    if g.numel():
        grad_m = grad_m.contiguous()
        # Without m, grad_m stands in for m_ptr, which the kernel then never writes: a tensor the kernel only reads
        # (not grad_g or grad_u), so that torch.compile's analysis of what it writes never sees one output under two
        # names
        tensors = (grad_m, g, u, grad_g, grad_u, grad_m if m is None else m)
        key = launcher.plan_key(("backward", activation, m is not None), g, tensors)
        launcher.planned(key, lambda: launcher.pointwise_launch(
            kernels.geglu_backward_kernel, g.numel(), tensors, {"ACT": activation, "STORE_M": m is not None},
            key is not None))(*tensors)


def backward_in_place(grad_m, g, u, activation="gelu_tanh", store_m=False):
    """Of m = act(g) * u (act = gelu_tanh or silu), in place: g becomes grad_g and u grad_u, and with store_m grad_m
    becomes m (for down_proj's weight gradient, where m was not saved). One Triton kernel (fp32 math; each element
    read before anything is written over it); on a CPU without the interpreter the same in fp32 PyTorch ops."""
    ops.check_activation(activation)
    written = (g, u, grad_m) if store_m else (g, u)
    if g.device.type != "cuda" and not machine.INTERPRET:
        for t, new in zip(written, _torch_backward(grad_m, g, u, activation, store_m)):
            t.copy_(new)
        return
    if not all(t.is_contiguous() for t in written):
        raise ValueError("geglu_backward_ writes the gradients over g and u (and m over grad_m): they must be "
                         "contiguous")
    _launch_backward(grad_m, g, u, g, u, activation, grad_m if store_m else None)
    # A kernel's writes bump no version counter: autograd must see them as changed (saved g and u are re-read by a
    # second backward through the same graph, which the check then refuses)
    for t in written:
        torch.autograd.graph.increment_version(t)


@torch.library.custom_op("fused_geglu::geglu_backward_", mutates_args=("g", "u"))
def geglu_backward_(grad_m: torch.Tensor, g: torch.Tensor, u: torch.Tensor, activation: str = "gelu_tanh") -> None:
    """backward_in_place as a custom op, so torch.compile can trace the backward (AOTAutograd functionalizes the
    mutation; where g and u are made inside the backward graph, Inductor writes over them)."""
    backward_in_place(grad_m, g, u, activation)


@geglu_backward_.register_fake
def _(grad_m, g, u, activation="gelu_tanh"):
    return None


@torch.library.triton_op("fused_geglu::geglu_backward", mutates_args=())
def geglu_backward_op(grad_m: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
                      activation: str = "gelu_tanh") -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_g, grad_u) as new tensors, for a compiled graph whose g and u were saved by forward: those are inputs of
    the backward graph, which Inductor may not write over, so the in-place op would cost it a copy of both first."""
    ops.check_activation(activation)
    if g.device.type != "cuda" and (not machine.INTERPRET or machine.tracing(g)):
        return tuple(t.to(g.dtype) for t in _torch_backward(grad_m, g, u, activation)[:2])
    g, u = g.contiguous(), u.contiguous()
    grad_g, grad_u = torch.empty_like(g), torch.empty_like(u)
    _launch_backward(grad_m, g, u, grad_g, grad_u, activation)
    return grad_g, grad_u


def _gradients(needs, x2d, w_gate, w_up, grad_g, grad_u):
    """(grad_x, grad_w_gate, grad_w_up) from g's and u's gradients, each None where `needs` says no: the gradients'
    GEMMs, x's two summed in its output itself (addmm_: no [M, dim] temporary)."""
    need_x, need_wg, need_wu = needs
    return (torch.mm(grad_g, w_gate).addmm_(grad_u, w_up) if need_x else None,
            grad_g.T @ x2d if need_wg else None,
            grad_u.T @ x2d if need_wu else None)


def _recompute_gu(x2d, w_gate, w_up):
    # Two cuBLAS GEMMs: with recompute=True forward kept no [M, hidden] tensor of its own, at the cost of these.
    return x2d @ w_gate.T, x2d @ w_up.T


# Under torch.compile: the two ops' autograd, recompute=True on geglu_op, recompute=False on geglu_saving_gu_op.
def _geglu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])  # x2d, w_gate, w_up (not where_faster, nor the activation: a str)
    ctx.activation = inputs[4]  # the op's defaults filled in: x2d, w_gate, w_up, where_faster, activation


def _geglu_backward(ctx, grad_m):
    x2d, w_gate, w_up = ctx.saved_tensors
    g, u = _recompute_gu(x2d, w_gate, w_up)
    # in place: g and u are the graph's own, two [M, hidden] buffers fewer at the peak
    geglu_backward_(grad_m, g, u, ctx.activation)
    return *_gradients(ctx.needs_input_grad[:3], x2d, w_gate, w_up, g, u), None, None


ops.geglu_op.register_autograd(_geglu_backward, setup_context=_geglu_setup_context)


def _saving_setup_context(ctx, inputs, output):
    _, g, u = output
    ctx.mark_non_differentiable(g, u)
    ctx.set_materialize_grads(False)  # g's and u's gradients stay None, not two [M, hidden] zeros
    ctx.save_for_backward(*inputs[:3], g, u)
    ctx.activation = inputs[4]


def _saving_backward(ctx, grad_m, _grad_g, _grad_u):
    x2d, w_gate, w_up, g, u = ctx.saved_tensors
    grad_g, grad_u = geglu_backward_op(grad_m, g, u, ctx.activation)
    return *_gradients(ctx.needs_input_grad[:3], x2d, w_gate, w_up, grad_g, grad_u), None, None


ops.geglu_saving_gu_op.register_autograd(_saving_backward, setup_context=_saving_setup_context)


class _TrainingMLP(torch.autograd.Function):
    """Eager training (not traced): y = down_proj(act(gate_proj(x)) * up_proj(x)) as one node, the launchers and
    backward_in_place called directly. Through the ops (these and ops.py's), torch.library's dispatch cost more host
    time than the launches: on the H200 machine about 280 µs for the forward's autograd node and 160 µs for
    geglu_backward_ per call at the post's shape. One node for down_proj too, so that m is not saved: autograd's
    linear would keep it for down_proj's weight gradient, a third [M, hidden] tensor from forward to backward."""

    @staticmethod
    def forward(ctx, x2d, w_gate, w_up, w_down, recompute, activation):
        if recompute:
            m = ops.geglu(x2d, w_gate, w_up, activation=activation)
            ctx.save_for_backward(x2d, w_gate, w_up, w_down)
        else:
            m, g, u = ops.geglu_saving_gu(x2d, w_gate, w_up, activation=activation)
            ctx.save_for_backward(x2d, w_gate, w_up, w_down, g, u)
        ctx.activation = activation
        return F.linear(m, w_down)  # aten::linear as before, in a trace; m is freed on return

    @staticmethod
    @torch.autograd.function.once_differentiable  # backward writes over g and u: no graph of it to differentiate
    def backward(ctx, grad_y):
        x2d, w_gate, w_up, w_down, *gu = ctx.saved_tensors
        need_x, need_wg, need_wu, need_wd = ctx.needs_input_grad[:4]
        g, u = gu or _recompute_gu(x2d, w_gate, w_up)
        # In this order at most three [M, hidden] tensors are alive: g, u and grad_m, which the kernel turns into m
        # (where down_proj's weight needs its gradient) while it writes grad_g and grad_u over g and u
        grad_m = grad_y @ w_down
        backward_in_place(grad_m, g, u, ctx.activation, store_m=need_wd)  # now grad_g, grad_u and m
        grad_w_down = grad_y.T @ grad_m if need_wd else None
        del grad_m  # m: freed before x's gradient is made
        return *_gradients((need_x, need_wg, need_wu), x2d, w_gate, w_up, g, u), grad_w_down, None, None


def training_mlp(x2d, w_gate, w_up, w_down, recompute, activation="gelu_tanh"):
    """y = down_proj(act(x2d @ w_gate^T) * (x2d @ w_up^T)), with what the backward needs saved: x and the weights, and
    with recompute=False g and u."""
    if torch.compiler.is_compiling() or machine.tracing(x2d):  # the graph gets the ops, whose bodies it can trace
        m = (ops.geglu_op(x2d, w_gate, w_up, table.TORCH_WHERE_FASTER, activation) if recompute
             else ops.geglu_saving_gu_op(x2d, w_gate, w_up, table.TORCH_WHERE_FASTER, activation)[0])
        return F.linear(m, w_down)  # down_proj: autograd's GEMM
    return _TrainingMLP.apply(x2d, w_gate, w_up, w_down, recompute, activation)
