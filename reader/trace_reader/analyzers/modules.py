"""Where a model's time goes, module by module: the per-annotation view of report.py grouped by module path.

06_model.py wraps every module it cares about in a record_function named after the module's path
(`model.embed_tokens`, `model.layers.3`, `model.layers.3.mlp`, `lm_head`). Here those annotations become a table
per module type (all the layers' `mlp` together, ...) and one per decoder layer: GPU time and kernels per step
on a GPU trace, CPU time on either. A module's numbers hold its submodules'; what no top-level module holds
(masks, positions, the residual adds between modules live inside the layer) is the row "outside any module".
Also the Expect builders for such a trace.
"""

from __future__ import annotations

import re
import statistics

from ..expectation import Expect, NotApplicable, need_steps
from ..facts.format import text_table
from ..reading.events import STEP_RE, Trace
from .annotations import annotations_around, cpu_time_by_annotation, gpu_time_by_annotation

# A decoder layer is an item of a module list: model.layers.3 (Gemma, Llama), transformer.h.3 (GPT-2); its parts
# are its children: model.layers.3.mlp.
LAYER_RE = re.compile(r"^(?:.*\.)?(\d+)(?:\.([^.]+))?$")


def module_type(path: str) -> str:
    """`model.layers.3.mlp` -> `mlp`, `model.layers.3` -> `decoder layer`, anything else: its own path."""
    m = LAYER_RE.match(path)
    return path if m is None else m.group(2) or "decoder layer"


def layer_index(path: str) -> int | None:
    m = LAYER_RE.match(path)
    return int(m.group(1)) if m else None


def per_annotation(trace: Trace) -> dict[str, dict[str, list]]:
    """{annotation: {"gpu_us", "kernels", "cpu_us", "calls": one number per active step}}: GPU time from
    report.gpu_time_by_annotation, kernels launched inside it (nested ones included), CPU time of its spans
    (report.cpu_time_by_annotation)."""
    n = len(trace.steps)
    rows: dict[str, dict[str, list]] = {}

    def row(name):
        return rows.setdefault(name, {"gpu_us": [0.0] * n, "kernels": [0] * n, "cpu_us": [0.0] * n, "calls": [0] * n})

    cache: dict = {}
    for i, st in enumerate(trace.steps):
        for e in st.spans:
            if e.cat == "user_annotation" and not STEP_RE.match(e.name):
                row(e.name)["calls"][i] += 1
        for k in st.kernels:
            for name in annotations_around(k, st, cache):
                row(name)["kernels"][i] += 1
    for name, per_step in gpu_time_by_annotation(trace).items():
        row(name)["gpu_us"] = per_step
    for name, per_step in cpu_time_by_annotation(trace).items():
        row(name)["cpu_us"] = per_step
    return rows


def _is_module(name: str, step_annotation: str) -> bool:
    return name != step_annotation and not name.startswith("## ")


def breakdown(trace: Trace, step_annotation: str) -> dict | None:
    """Per module type, per decoder layer, outside any module and the step total, all from one real step: the
    median one by total time (GPU time on a GPU trace, CPU time on a CPU one; the lower median for an even count),
    so the top-level modules and "outside" add up to the step. GPU µs, kernels and CPU µs each.
    None when the trace has no module annotations."""
    rows = per_annotation(trace)
    modules = {k: v for k, v in rows.items() if _is_module(k, step_annotation)}
    if not modules or not trace.steps:
        return None
    # Top level: no other annotated module is a dotted prefix of its path (model.layers.3 holds model.layers.3.mlp).
    top = [m for m in modules if not any(o != m and m.startswith(o + ".") for o in modules)]
    main = "gpu_us" if trace.device == "cuda" else "cpu_us"
    total = {"gpu_us": [sum(k.dur for k in st.gpu) for st in trace.steps],
             "kernels": [len(st.kernels) for st in trace.steps],
             "cpu_us": rows.get(step_annotation, {}).get("cpu_us") or [st.span.dur for st in trace.steps]}
    i = total[main].index(statistics.median_low(total[main]))  # the typical step: one cold or preempted step aside

    def row(names, **extra) -> dict:
        out = dict(extra)
        out.update({key: sum(modules[m][key][i] for m in names) for key in ("gpu_us", "kernels", "cpu_us")})
        out["share"] = out[main] / total[main][i] if total[main][i] > 0 else None
        return out

    by_type: dict[str, list[str]] = {}
    by_layer: dict[int, list[str]] = {}
    for m in modules:
        by_type.setdefault(module_type(m), []).append(m)
        if (n := layer_index(m)) is not None and module_type(m) == "decoder layer":
            by_layer.setdefault(n, []).append(m)
    step_total = {key: total[key][i] for key in total}
    inside = row(top)
    step_total["share"] = 1.0 if total[main][i] > 0 else None
    outside = {key: step_total[key] - inside[key] for key in ("gpu_us", "kernels", "cpu_us")}
    outside["share"] = inside["share"] and 1.0 - inside["share"]
    return {
        "device": trace.device,
        "step": trace.steps[i].number,
        # "holds_others": a container (a decoder layer), whose time is also in its parts' rows
        "types": sorted((row(ms, type=t, modules=len(ms),
                             holds_others=any(o.startswith(m + ".") for m in ms for o in modules))
                         for t, ms in by_type.items()), key=lambda r: -r[main]),
        "layers": [row(ms, layer=n) for n, ms in sorted(by_layer.items())],
        "top_level": sorted(top),
        "outside": outside,
        "total": step_total,
    }


def breakdown_text(data: dict | None) -> str:
    if data is None:
        return "Module by module: no module annotations in this trace"
    gpu = data["device"] == "cuda"
    cols = (["GPU µs", "share", "kernels", "CPU µs"] if gpu else ["CPU µs", "share"])

    def cells(r):
        vals = {"GPU µs": f"{r['gpu_us']:,.1f}", "kernels": f"{r['kernels']:g}", "CPU µs": f"{r['cpu_us']:,.1f}",
                "share": "-" if r["share"] is None else f"{100 * r['share']:.0f}%"}
        return [vals[c] for c in cols]

    right = set(range(2, 2 + len(cols)))
    types = [[r["type"] + (" (holds its parts)" if r["holds_others"] else ""), r["modules"], *cells(r)]
             for r in data["types"]]
    types.append(["(outside any module)", "", *cells(data["outside"])])
    types.append(["step total", "", *cells(data["total"])])
    what = "GPU time and kernels" if gpu else "CPU time (a CPU trace: no GPU lane)"
    out = [f"Module by module ({what} in ProfilerStep#{data['step']}, the median step; a module holds its "
           "submodules):",
           text_table(["module type", "modules", *cols], types, right | {1})]
    if data["layers"]:
        out += ["", "Per decoder layer:",
                text_table(["layer", *cols], [[r["layer"], *cells(r)] for r in data["layers"]],
                       set(range(1, 1 + len(cols))))]
    return "\n".join(out)


# ------------------------------------------------------------------------------ expectations for a model's trace

def modules_annotated(layers: int | None, step_annotation: str) -> Expect:
    """Every decoder layer annotated, with its parts, in every step: all `layers` of them, or (None: a trace that
    does not say how many) layers 0 to the highest seen, at least one (an eager 06_model.py run annotates each)."""
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        for st in t.steps:
            names = {e.name for e in st.spans if e.cat == "user_annotation"}
            seen = {layer_index(n) for n in names if module_type(n) == "decoder layer"}
            want = set(range(layers if layers else max(seen, default=-1) + 1))
            if not want or seen != want:
                return f"ProfilerStep#{st.number}: decoder layers annotated: {sorted(seen)}"
            parts = {layer_index(n) for n in names if module_type(n) != "decoder layer"} - {None}
            if parts != want:
                return f"ProfilerStep#{st.number}: decoder layers with annotated parts: {sorted(parts)}"
        return True
    return Expect(f"all {layers if layers else 'the'} decoder layers, each with its parts (attention, MLP, norms), "
                  f"annotated in every step (inside '{step_annotation}')", run)


def largest_module(kind: str, step_annotation: str) -> Expect:
    def run(t: Trace):
        data = breakdown(t, step_annotation)
        if data is None:
            return NotApplicable("no module annotations in this trace")
        first = next(r for r in data["types"] if not r["holds_others"])
        return True if first["type"] == kind else (
            f"largest: {first['type']} ({100 * (first['share'] or 0):.0f}% of GPU time)")
    return Expect(f"the {kind} modules take the largest share of GPU time (of the layers' parts and the "
                  "modules outside the layers)", run, "cuda")


def module_launches(kind: str, what: str, has: tuple[str, ...] = (), lacks: tuple[str, ...] = ()) -> Expect:
    """Every `kind` module, in every step, launches a kernel matching each pattern of `has` and none matching a
    pattern of `lacks`. A pattern is a regex searched in the kernel's name and in its launching op's name
    (`^aten::gelu$`, `geglu`). What a module launches, not how many kernels: cuBLAS may add a split-K reduce
    kernel to a GEMM at some shapes, which says nothing about the lesson."""
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        launched: dict[str, list[list[str]]] = {}  # module -> per step, the kernel and op names inside it
        cache: dict = {}
        for i, st in enumerate(t.steps):
            for k in st.kernels:
                for name in annotations_around(k, st, cache):
                    if module_type(name) == kind:
                        steps = launched.setdefault(name, [[] for _ in t.steps])
                        steps[i] += [k.name] + ([k.op.name] if k.op is not None else [])
        if not launched:
            return NotApplicable(f"no '{kind}' module annotations in this trace")
        def found(pattern, names):
            return any(re.search(pattern, n) for n in names)

        bad = []
        for name, steps in launched.items():
            missing = sorted({p for names in steps for p in has if not found(p, names)})
            extra = sorted({p for names in steps for p in lacks if found(p, names)})
            if missing or extra:
                bad.append(f"{name}: " + "; ".join([f"nothing matches {missing}"] * bool(missing)
                                                   + [f"launches {extra}"] * bool(extra)))
        return True if not bad else "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
    return Expect(f"every {kind} launches {what}", run, "cuda")


def kernels_between(low: int, high: int | None, what: str) -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [len(st.kernels) for st in t.steps]
        if low <= 0 and 0 in counts:  # "at most N" of nothing says nothing
            return NotApplicable(f"ProfilerStep#{t.steps[counts.index(0)].number} launched no kernel: nothing to count")
        ok = all(c >= low and (high is None or c <= high) for c in counts)
        return True if ok else f"kernels per step: {counts}"
    span = f"at least {low}" if high is None else f"at most {high}" if low <= 0 else f"{low} to {high}"
    return Expect(f"{span} GPU kernels per step ({what})", run, "cuda")


def layers_unknown(text: str, device: str = "any") -> Expect:
    """A guess that needs the model's decoder layer count, on a trace that does not say it (no layer annotations, as
    under torch.compile, and a file name not 06_model.py's): not applicable, the others still checked."""
    return Expect(text, lambda t: NotApplicable("the trace does not say how many decoder layers the model has (its "
                                                "layer annotations, or 06_model.py's file name: ...-4L_...)"), device)


def runtime_calls(name: str, per_step: int, what: str = "") -> Expect:
    def run(t: Trace):
        if (miss := need_steps(t)):
            return miss
        counts = [sum(1 for o in [st.span, *st.spans] for c in o.calls if c.name == name) for st in t.steps]
        return True if all(c == per_step for c in counts) else f"{name} per step: {counts}"
    return Expect(f"{per_step} {name} per step" + (f" ({what})" if what else ""), run, "cuda")


# ------------------------------------------------------------------- 06_model's flags, read back from its trace

PHASES = ("prefill", "decode")  # 06_model.py's step annotation is the phase's name
# Liger's GeGLU and SwiGLU kernels (the _tiled SwiGLU ones on Blackwell) and autograd Functions; the fused MLP's kernels
# have one name for both activations (_0...: compiled by Inductor).
LIGER_ACTIVATIONS = {"gelu_tanh": re.compile(r"^_geglu_tanh_forward_kernel$|^LigerGELUMulFunction"),
                     "silu": re.compile(r"^_swiglu_forward_kernel(_tiled)?$|^LigerSiLUMulFunction")}
MLP_KERNELS = {"liger": re.compile("|".join(p.pattern for p in LIGER_ACTIVATIONS.values())),
               "fused": re.compile(r"^_geglu_(tma|pointer|small_m)_kernel(_\d+)?$")}
# 06_model.py's presets by the activation of their gated MLP (Gemma's GeGLU, Llama's SwiGLU)
PRESET_ACTIVATIONS = {"tiny": "gelu_tanh", "gemma-2b": "gelu_tanh", "tiny-llama": "silu", "llama-1b": "silu"}
TORCH_ACTIVATIONS = {"aten::gelu": "gelu_tanh", "aten::silu": "silu"}  # transformers' own MLP calls these
MODEL_FILE_RE = re.compile(r"^(?P<config>.+)-(?P<layers>\d+)L$")  # the file name's first word: gemma-2b-4L


def model_flags(a, trace: Trace, words: list[str]) -> None:
    """06_model.py's --phase, --layers, --mlp and --cuda-graphs (and its gated MLP's activation, act), set on
    `a` where the trace tells them: its annotations and events first, then the name 06_model gives its files
    (gemma-2b-4L_decode_1x512_mlp-eager[_cudagraphs]_bf16_cold_eager). What neither tells stays unset, and the
    expectations that need it say so."""
    names = {e.name for st in trace.steps for e in st.spans} | {k.name for st in trace.steps for k in st.kernels}
    phases = {n for n in names if n in PHASES}
    named = next((w for w in words if w in PHASES), None)
    if len(phases) == 1 or named:
        a.phase = next(iter(phases)) if len(phases) == 1 else named
    layers = {layer_index(n) for n in names if module_type(n) == "decoder layer"}
    file = MODEL_FILE_RE.match(words[0]) if words else None
    if layers:
        a.layers = max(layers) + 1
    elif file:
        a.layers = int(file.group("layers"))
    told = next((w[len("mlp-"):] for w in words if w.startswith("mlp-")), None)
    seen = [kind for kind, pattern in MLP_KERNELS.items() if any(pattern.search(n) for n in names)]
    if len(seen) == 1 or told in ("eager", "liger", "fused"):
        a.mlp = seen[0] if len(seen) == 1 else told
    elif not seen and names & TORCH_ACTIVATIONS.keys():  # transformers' own MLP calls the GeLU (SiLU) op; no other
        a.mlp = "eager"
    graphs = any(c.name == "cudaGraphLaunch" for st in trace.steps for o in [st.span, *st.spans] for c in o.calls)
    # --cuda-graphs is compile(mode="reduce-overhead"): a replay shows as cudaGraphLaunch, and never on a CPU
    a.cuda_graphs = "cudagraphs" in words or (a.compile and graphs)
    a.act = mlp_activation(names, file and file.group("config"), a.__dict__.get("mlp"))


def mlp_activation(names: set[str], preset: str | None, mlp: str | None) -> str | None:
    """The gated MLP's activation ("gelu_tanh": GeGLU, "silu": SwiGLU), or None: another MLP, or not told. The trace
    first (transformers' own op, Liger's kernels), then the file name's preset; the fused kernels are named alike for
    both, so a swapped MLP whose activation nothing tells is taken for the post's GeGLU."""
    for told in ({act for op, act in TORCH_ACTIVATIONS.items() if op in names},
                 {act for act, pattern in LIGER_ACTIVATIONS.items() if any(pattern.search(n) for n in names)}):
        if len(told) == 1:
            return next(iter(told))
    if preset in PRESET_ACTIVATIONS:
        return PRESET_ACTIVATIONS[preset]
    return "gelu_tanh" if mlp in ("liger", "fused") else None
