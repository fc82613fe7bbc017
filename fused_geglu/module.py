"""FusedGatedMLP: the fused MLP as an nn.Module, GeGLU or SwiGLU (activation="gelu_tanh" | "silu"), with the
parameter names of SimpleGeGLUMLP (03_simple_mlp.py) and of transformers' gated MLPs (GemmaMLP, LlamaMLP, Qwen2MLP...);
FusedGeGLUMLP and FusedSwiGLUMLP are it with the activation fixed (FusedGeGLUMLP(dim, hidden, recompute) as it was).

Eager inference runs ops.mlp's plan for the call's shape; a call like the module's last one takes that plan without
building its key (the hot path of a model's forward, written out in `forward`). Training goes to training.py's
autograd, torch.compile to ops.py's ops.
"""

import torch
import torch.nn as nn

from . import launcher, machine, ops, table, training


# In a model's eager forward, building mlp's key costs the module more host time than the rest of its Python (a dozen
# tensor queries, a list, a tuple hashed and compared: each Python step there costs several times what it does in a
# loop of its own). Each module keeps instead what its last planned call was like (_call_signature): the same key
# follows from the same input shape, dtype and device, the same current device and stream, the same globals, and
# weights at the same addresses with the same shapes (x and the weights were contiguous then, x 16-byte aligned:
# every planned call's are; a weight re-strided or re-typed in place at the same address and shape is not noticed), and
# the same activation. FusedGatedMLP.forward compares a call with it field by field, in this order.
def _call_signature(x, w_gate, w_up, w_down, activation, run):
    device = machine.current_device()
    return (x.shape, x.dtype, x.get_device(), device, machine.current_stream(device), table.TORCH_WHERE_FASTER,
            launcher.plans, w_gate.data_ptr(), w_up.data_ptr(), w_down.data_ptr(), w_gate.shape, w_up.shape,
            w_down.shape, activation, run)


def _requires_grad(*tensors):
    return any(t.requires_grad for t in tensors)


def _pack_after_load(module, incompatible_keys):
    module.last_call = None  # it may hold a view of the weights' storage before the load
    module.pack_gate_up()  # load_state_dict(assign=True) gives the weights the state dict's own tensors


class FusedGatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)) with gate, up and the activation in one kernel: act = gelu_tanh
    (activation="gelu_tanh", GeGLU: Gemma's MLP) or silu (activation="silu", SwiGLU: Llama's, Qwen's, Mistral's).

    Same parameter names as SimpleGeGLUMLP and transformers' gated MLPs (gate_proj.weight, up_proj.weight,
    down_proj.weight), so `load_state_dict` moves weights both ways. The kernels read the gate and up weights where they are, so
    the module holds nothing beyond its parameters (and a weight changed in place is read as it is now). The two
    share one storage, gate's rows then up's (pack_gate_up): eagerly, where cuBLAS runs gate and up and the tuned
    table's packing rows say so (packs_gate_up), both projections are one GEMM. Eagerly, each module also keeps what
    its last call was like and that call's plan (last_call): a call like it skips the plan's key (forward).

    Training: by default the forward kernel also stores g and u (two [tokens, hidden] tensors kept for backward,
    as Liger and eager PyTorch keep theirs); recompute=True keeps only x and runs the two GEMMs again in backward:
    less memory, more time. Eagerly neither keeps m (down_proj's input): the backward kernel makes it again from g
    and u for down_proj's weight gradient.
    """

    def __init__(self, dim, hidden, activation="gelu_tanh", recompute=False):
        super().__init__()
        ops.check_activation(activation)
        self.activation = activation  # the kernels' constexpr ACT; each call's plan is kept per activation too
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.recompute = recompute
        self.last_call = None  # what the last eager call was like, and its plan (see forward)
        self.register_load_state_dict_post_hook(_pack_after_load)
        self.pack_gate_up()

    def extra_repr(self):
        return f"activation={self.activation!r}, recompute={self.recompute}"

    def pack_gate_up(self):
        """Put gate_proj's and up_proj's weights in one storage, gate's rows then up's, each parameter a view of it
        (the same Parameter objects; their old storages are freed). Eagerly, where cuBLAS runs the projections, one
        GEMM then reads both: one launch fewer (ops.make_packed_mlp_plan), no extra memory. Done when the module is
        made and again after whatever gives the weights storages of their own: .to(), .cuda(), .half() (_apply),
        copy.deepcopy and unpickling (__setstate__), load_state_dict(assign=True) (a post hook). Left as they are
        where the two are not plain tensors of one shape, dtype and device (a DTensor, a parametrization). Costs a
        copy of both (and, for a moment, their memory once more)."""
        weights = [getattr(m, "_parameters", {}).get("weight") for m in (self.gate_proj, self.up_proj)]
        if not all(isinstance(w, torch.Tensor) and type(w.data) is torch.Tensor for w in weights):
            return
        g, u = (w.data for w in weights)
        if g.dim() != 2 or g.shape != u.shape or g.dtype != u.dtype or g.device != u.device:
            return
        if (g.is_contiguous() and u.is_contiguous() and table.packed(g, u)
                and g.untyped_storage().data_ptr() == u.untyped_storage().data_ptr()):
            return
        self.last_call = None  # it may hold a view of the old storages
        with torch.no_grad():
            both = torch.cat([g, u])
        weights[0].data, weights[1].data = both[:len(g)], both[len(g):]

    def _apply(self, fn, recurse=True):  # where the weights get new storages, repacking drops the kept last call
        out = super()._apply(fn, recurse)
        self.pack_gate_up()
        return out

    def __getstate__(self):  # copy.deepcopy, pickle: without the last call's plan (a closure over our kernels)
        return {**self.__dict__, "last_call": None}

    def __setstate__(self, state):
        # also a module pickled before there was a last call, or an activation (a FusedGeGLUMLP then)
        super().__setstate__({"last_call": None, "activation": "gelu_tanh", **state})
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
                                    modules["up_proj"]._parameters["weight"],
                                    modules["down_proj"]._parameters["weight"])
        except (KeyError, AttributeError):
            w_gate, w_up, w_down = self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
        # Inference like this module's last planned call (see _call_signature) takes that call's plan without
        # building mlp's key. An export's tensors are not plain tensors: they go on to _forward.
        last = self.last_call
        if last is not None and (not torch.is_grad_enabled() or not _requires_grad(x, w_gate, w_up, w_down)):
            shape, dtype, x_device, device, stream, where_faster, plans, p_gate, p_up, p_down, s_gate, s_up, s_down, \
                activation, run = last
            if (type(x) is torch.Tensor and x.shape == shape and x.dtype is dtype and x.get_device() == x_device
                    and x.is_contiguous() and not x.data_ptr() & 15 and machine.current_device() == device
                    and machine.current_stream(device) == stream and table.TORCH_WHERE_FASTER is where_faster
                    and launcher.plans is plans
                    and w_gate.data_ptr() == p_gate and w_up.data_ptr() == p_up and w_down.data_ptr() == p_down
                    and w_gate.shape == s_gate and w_up.shape == s_up and w_down.shape == s_down
                    and self.activation is activation):
                return run(x, w_gate, w_up, w_down)
        return self._forward(x, w_gate, w_up, w_down)

    def _forward(self, x, w_gate, w_up, w_down):
        # Any leading shape: the kernels see [tokens, dim]; the output's last size is named, not -1, so that
        # no tokens (M = 0) gives an empty output as nn.Linear does.
        if torch.is_grad_enabled() and _requires_grad(x, w_gate, w_up, w_down):
            # Training: one autograd node for the whole MLP, which saves no m (training.py).
            x2d = x.reshape(-1, x.shape[-1])
            out = training.training_mlp(x2d, w_gate, w_up, w_down, self.recompute, self.activation)
            return out.reshape(*x.shape[:-1], w_down.shape[0])
        if torch.compiler.is_compiling():
            x2d = x.reshape(-1, x.shape[-1])
            out = ops.down_proj_op(ops.geglu_op(x2d, w_gate, w_up, table.TORCH_WHERE_FASTER, self.activation), w_down)
            return out.reshape(*x.shape[:-1], w_down.shape[0])
        # Eager inference: the launchers themselves, planned once per shape (mlp), and down_proj rather than
        # self.down_proj(m): the same GEMM (the small-M kernel for few tokens) without nn.Module's call overhead.
        run = ops.mlp_plan(x, w_gate, w_up, w_down, self.activation)
        if run is None:  # not planned (a CPU tensor, a strided x...): worked out at this call
            return ops.unplanned_mlp(x, w_gate, w_up, w_down, self.activation)
        # The packed plan's kept form runs over a view of gate and up made now and kept with the signature: a view of
        # the weights' own storage, no memory of its own (a weight replaced by hand leaves the old storage held until
        # this module's next call, or a .to() that repacks them).
        kept = run.kept(w_gate) if hasattr(run, "kept") else None
        run = run if kept is None else kept
        out = run(x, w_gate, w_up, w_down)
        self.last_call = _call_signature(x, w_gate, w_up, w_down, self.activation, run)  # one that raised: not kept
        return out


class FusedGeGLUMLP(FusedGatedMLP):
    """FusedGatedMLP with activation="gelu_tanh": down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)), the post's GeGLU MLP
    (and Gemma's), with the arguments it always had."""

    def __init__(self, dim, hidden, recompute=False):
        super().__init__(dim, hidden, "gelu_tanh", recompute)


class FusedSwiGLUMLP(FusedGatedMLP):
    """FusedGatedMLP with activation="silu": down_proj(silu(gate_proj(x)) * up_proj(x)), the SwiGLU MLP of Llama, Qwen
    and Mistral."""

    def __init__(self, dim, hidden, recompute=False):
        super().__init__(dim, hidden, "silu", recompute)
