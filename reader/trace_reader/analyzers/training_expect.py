"""07_train_step's guesses, read against any training trace: the script's flags from the trace (train_flags: the
optimizer from its ops, the MLP from its kernels, the rest from the file name), the phases present, backward's GEMM
FLOPs over forward's, the optimizer's kind, the peak after forward."""

from __future__ import annotations

from ..expectation import Expect, NotApplicable, need_steps
from ..facts.format import fmt_fixed
from ..reading.events import Trace, plural
from .modules import MLP_KERNELS
from .passes import PHASES
from .training import analyze, memory_peak, parameters, recomputes_forward

OPTIMIZER_CLASSES = {"AdamW": "adamw", "SGD": "sgd"}  # torch.optim's class -> 07_train_step.py's --optimizer


# A for-loop step's ops per parameter, at least, for a trace read back: AdamW's moments, denominator and update;
# SGD's update alone (07 runs it with momentum, 2 ops, but another harness's SGD may have none: one add_)
TRACE_OPS_PER_PARAMETER = {"adamw": 3, "sgd": 1}


def train_flags(a, trace: Trace, words: list[str]) -> None:
    """07_train_step.py's --optimizer, --optim-impl, --mlp and --checkpoint, and the parameters' count and bytes,
    set on `a` where the trace tells them: its events first, then the name 07 gives its files
    (mlp-1L_64x128x768x3072_adamw-foreach_mlp-eager[_ckpt][_memory]_bf16_cold_eager). What neither tells stays
    unset, and the expectations that need it say so."""
    told = {}
    for w in words:
        head, _, rest = w.partition("-")
        if head in OPTIMIZER_CLASSES.values() and rest:
            told["optimizer"], told["optim_impl"] = head, rest
        elif head == "mlp" and rest in ("eager", "liger", "fused", "fused-recompute"):
            told["mlp"] = rest
    data = analyze(trace)
    opt = data["optimizer"] if data is not None else None
    if opt is not None and opt["class"] in OPTIMIZER_CLASSES:
        a.optimizer = OPTIMIZER_CLASSES[opt["class"]]
    elif "optimizer" in told:
        a.optimizer = told["optimizer"]
    if opt is not None and opt["implementation"] != "?":
        a.optim_impl = opt["implementation"]
    elif "optim_impl" in told:
        a.optim_impl = told["optim_impl"]
    names = {k.name for st in trace.steps for k in st.kernels}
    seen = [kind for kind, pattern in MLP_KERNELS.items() if any(pattern.search(n) for n in names)]
    a.mlp = seen[0] if len(seen) == 1 else told.get("mlp", "eager")
    if a.mlp == "fused" and told.get("mlp") == "fused-recompute":  # both modes run the same kernels: the name tells
        a.mlp = "fused-recompute"
    a.checkpoint = "ckpt" in words or recomputes_forward(trace)
    if a.__dict__.get("optimizer") in TRACE_OPS_PER_PARAMETER:
        a.ops_per_parameter = TRACE_OPS_PER_PARAMETER[a.optimizer]
    if (found := parameters(trace)) is not None:
        a.params, a.param_bytes = found
    elif data is not None and data["optimizer"] is not None and data["optimizer"]["gradients"] is None:
        a.params = a.param_bytes = None  # compiled autograd: no AccumulateGrad to count them by; the guesses say so


def _analysis(t: Trace) -> dict | str:
    if (miss := need_steps(t)):
        return miss
    data = analyze(t)
    return "no backward in the active steps (no autograd::engine spans)" if data is None else data


def phases_present() -> Expect:
    def run(t: Trace):
        data = _analysis(t)
        if isinstance(data, str):
            return data
        unit = "gpu_us" if t.device == "cuda" else "cpu_us"
        for s in data["steps"]:
            missing = [p for p in PHASES if p not in s["phases"]]
            idle = [p for p in PHASES if p in s["phases"] and not s["phases"][p][unit] > 0]
            if missing or idle:
                return (f"ProfilerStep#{s['number']}: " + (f"no {', '.join(missing)} phase " if missing else "")
                        + (f"no {'GPU' if unit == 'gpu_us' else 'CPU'} time in {', '.join(idle)}" if idle else ""))
        return True
    return Expect("forward, backward and optimizer in every step, each with time of its own (GPU time on a GPU, "
                  "CPU time on a CPU)", run)


def backward_flops(low: float, high: float, why: str) -> Expect:
    def run(t: Trace):
        data = _analysis(t)
        if isinstance(data, str):
            return data
        ratios = []
        for s in data["steps"]:
            f, b = s["phases"].get("forward"), s["phases"].get("backward")
            if f is None or b is None or f["gemm_flops"] is None or b["gemm_flops"] is None:
                return NotApplicable("GEMM shapes not recorded (record_shapes=True)")
            if not f["gemm_flops"]:
                return NotApplicable("forward runs no aten GEMM whose FLOPs the trace records")
            ratios.append(b["gemm_flops"] / f["gemm_flops"])
        seen = ", ".join(f"{r:.2f}x" for r in ratios)
        return True if all(low <= r <= high for r in ratios) else f"backward / forward GEMM FLOPs per step: {seen}"
    return Expect(f"backward's GEMMs do {low:g}x-{high:g}x forward's FLOPs ({why})", run)


def optimizer_kind(impl: str, params: int, per_param: int) -> Expect:
    """for-loop: >= per_param ops (and, on a GPU, kernels) per parameter, no foreach or fused op; foreach: foreach
    ops, no fused one, on a GPU only multi-tensor kernels; fused: one aten::_fused_* op a step (one dtype and
    device), on a GPU only multi-tensor kernels. Neither of the last two loops over the parameters: fewer other
    ops than a for-loop would need (a few remain: the step count's scalar tensor)."""
    def run(t: Trace):
        data = _analysis(t)
        if isinstance(data, str):
            return data
        for s in data["steps"]:
            o = s["optimizer"]
            if o is None:
                return f"ProfilerStep#{s['number']}: no optimizer phase"
            if params is None:
                return NotApplicable("the parameters are not counted in this trace (a backward compiled by compiled "
                                     "autograd accumulates the gradients inside its graph: no AccumulateGrad nodes)")
            seen = (f"ProfilerStep#{s['number']}: {o['ops']} ops ({o['foreach_ops']} foreach, {o['fused_ops']} fused, "
                    f"{o['other_ops']} others)" + (f", {o['kernels']} kernels ({o['multi_tensor_kernels']} "
                                                  "multi-tensor)" if o["kernels"] is not None else ""))
            gpu = o["kernels"] is not None
            if impl == "for-loop":
                ok = (o["foreach_ops"] == o["fused_ops"] == 0 and o["other_ops"] >= per_param * params
                      and (not gpu or o["kernels"] >= per_param * params))
            elif impl == "foreach":
                ok = o["foreach_ops"] > 0 and o["fused_ops"] == 0 and o["other_ops"] < per_param * params and (
                    not gpu or 0 < o["multi_tensor_kernels"] == o["kernels"])
            else:
                ok = o["fused_ops"] == 1 and o["other_ops"] < per_param * params and (
                    not gpu or 0 < o["multi_tensor_kernels"] == o["kernels"])
            if not ok:
                return seen
        return True
    text = {"for-loop": f"for-loop: at least {plural(per_param, 'op')} per parameter ({params if params is not None else '?'} "
                        "parameters; on a GPU as many "
                        "kernels), no foreach or fused op",
            "foreach": f"foreach: multi-tensor aten::_foreach_* ops for all {params if params is not None else '?'} "
                       "parameters at once, no op per "
                       "parameter (on a GPU only multi-tensor kernels)",
            "fused": "fused: one aten::_fused_* op per step for all parameters (on a GPU only multi-tensor kernels: "
                     "one or two at the post's MLP shape)"}[impl]
    return Expect(f"the optimizer, {text}", run)


# A peak in the optimizer that parameter-sized tensors can make: the gradients, one temporary per parameter (foreach
# AdamW's sqrt of its second moment), and AdamW's two states where its first step falls in the window.
OPTIMIZER_PEAK_PARAMS = 4


def peak_after_forward(checkpointed: bool, param_bytes: float | None, rebuilds: str | None = None) -> Expect:
    """Without checkpointing the peak comes around the end of forward: in forward or backward, with at least half
    of it already held when forward ends (the activations saved for backward). With it, the peak is in backward,
    where each layer's activations are rebuilt. `rebuilds` names a module that saves less and rebuilds its largest
    tensors in backward (the fused MLP: g and u): the peak is then in forward or backward, however little of it is
    held when forward ends. Not applicable where a peak in the optimizer is at most OPTIMIZER_PEAK_PARAMS times the
    parameters' bytes: the gradients, a foreach optimizer's temporaries and, on its first step, AdamW's two states
    are each the size of the parameters, so such a peak says nothing of the activations (too few tokens for them to
    dominate); a larger one holds something else, activations kept too long say (param_bytes None: not known, so
    any peak in the optimizer). Not applicable either on a trace recorded without profile_memory=True."""
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        peaks = memory_peak(t)
        if peaks is None and not t.has_memory_events:  # another harness's trace, say: nothing to look at
            return NotApplicable("no [memory] events: recorded without profile_memory=True")
        if peaks is None:
            return f"no [memory] events for the {t.device}: profile with profile_memory=True"
        small = [p for p in peaks if p["phase"] == "optimizer"
                 and (param_bytes is None or p["peak_bytes"] <= OPTIMIZER_PEAK_PARAMS * param_bytes)]
        if small:
            p = small[0]
            held = f"{fmt_fixed(p['at_forward_end_bytes'], 2**20, 2)} MiB held at forward's end"
            if param_bytes is None:
                return NotApplicable(f"#{p['number']} peaks in the optimizer, with {held}; the parameters' bytes "
                                     "are unknown (no shapes recorded) to weigh it against")
            return NotApplicable(f"#{p['number']} peaks in the optimizer at {p['peak_bytes'] / 2**20:.2f} MiB, with "
                                 f"{held}: no more than {OPTIMIZER_PEAK_PARAMS}x the {param_bytes / 2**20:.2f} MiB "
                                 "of parameters (gradients, optimizer temporaries and states), too few tokens for "
                                 "activations to dominate")
        if checkpointed:
            bad = [p for p in peaks if p["phase"] != "backward"]
        elif rebuilds:
            bad = [p for p in peaks if p["phase"] not in ("forward", "backward")]
        else:
            bad = [p for p in peaks if p["phase"] not in ("forward", "backward") or p["at_forward_end_bytes"] is None
                   or p["at_forward_end_bytes"] < 0.5 * p["peak_bytes"]]
        if peaks and not bad:
            return True
        return "; ".join(f"#{p['number']}: peak {p['peak_bytes'] / 2**20:.2f} MiB in {p['phase']}, "
                         f"{fmt_fixed(p['at_forward_end_bytes'], 2**20, 2)} MiB held when forward ends" for p in peaks[:4])
    if checkpointed:
        return Expect("memory peaks in backward, where each checkpointed layer's activations are rebuilt", run)
    if rebuilds:
        return Expect(f"memory peaks in forward or backward, not in the optimizer ({rebuilds} saves less for backward "
                      "and rebuilds the rest there, so less of the peak need be held when forward ends)", run)
    return Expect("memory peaks around the end of forward: in forward or backward, not in the optimizer, and at "
                  "least half of it already held when forward ends (the activations saved for backward)", run)
