"""06_model.py at the tiny preset on the CPU (prefill, decode, a GPT-2 config, bad input), and trace_reader.modules
on those traces and on a hand-built GPU trace. The module numbers are re-derived here from the trace's plain json,
so the script's own breakdown cannot vouch for itself.

GPU-only runs (skipped without CUDA) check the expectations the tiny CPU run cannot: launches per token, one
cudaGraphLaunch, the fused MLP's two kernels.
"""

import argparse
import gzip
import importlib
import json
import statistics
from pathlib import Path

import pytest
from conftest import run_script_main
import torch

import inspect_trace as it
from test_inspect_trace import gpu_trace, parse
from test_scripts import load
from trace_reader.analyzers import modules

model06 = importlib.import_module("06_model")
DATA = Path(__file__).resolve().parent / "data"
TINY = ["--preset", "tiny", "--seq", "32", "--dtype", "fp32"]
TINY_LLAMA = ["--preset", "tiny-llama", "--seq", "32", "--dtype", "fp32"]  # a SwiGLU MLP (Llama's)
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64, "vocab_size": 100,
        "bos_token_id": None, "eos_token_id": None}
PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")  # a Gemma decoder layer's children


def run(out, *args, device="cpu"):
    """(exit code, stdout, stderr, the trace written or None), as `python 06_model.py ARGS` would give."""
    code, stdout, stderr = run_script_main("06_model.py", model06.main, out, *args, device=device)
    traces = sorted((out / "06_model").glob("*.json"))
    return code, stdout, stderr, (traces[-1] if traces else None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    done = {}
    for key, args in [("prefill", TINY + ["--phase", "prefill"]), ("decode", TINY + ["--phase", "decode"])]:
        done[key] = run(tmp_path_factory.mktemp(key), *args)
        assert done[key][0] == 0, done[key][2]
    return done


def annotation_spans(trace):
    """[(ProfilerStep span, [user_annotation spans inside it])], by plain json and time containment."""
    events = [e for e in load(trace)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    return [(s, [e for e in events if e is not s and s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]])
            for s in steps]


def inside(a, b):
    return b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_module_is_a_span_inside_its_parent(runs, phase):
    _, out, err, trace = runs[phase]
    expected = {phase, "model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head"}
    expected |= {f"model.layers.{i}" + p for i in range(2) for p in ["", *(f".{c}" for c in PARTS)]}
    steps = annotation_spans(trace)
    assert len(steps) == 3
    for _, spans in steps:
        names = [e["name"] for e in spans]
        assert sorted(names) == sorted(expected)  # each exactly once per step
        by = {e["name"]: e for e in spans}
        for name, e in by.items():
            if name != phase:
                assert inside(e, by[phase]), name
            if name.count(".") == 3:  # model.layers.i.part inside model.layers.i
                assert inside(e, by[name.rsplit(".", 1)[0]]), name
    assert f"module spans: {len(expected) - 1} modules annotated by path (model.layers.0.mlp, ...)" in out
    assert "0 broken" in out and "2 confirmed" in out and "Traceback" not in err


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_breakdown_sums_to_the_step(runs, phase):
    """One real step (the median by CPU time): its top-level modules plus 'outside any module' are the step."""
    _, out, _, trace = runs[phase]
    data = modules.breakdown(it.load_trace(trace), phase)
    steps = annotation_spans(trace)
    step_us = [next(e["dur"] for e in spans if e["name"] == phase) for _, spans in steps]
    i = step_us.index(statistics.median_low(step_us))
    span, spans = steps[i]
    assert data["step"] == int(span["name"].split("#")[1])
    top = ("model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head", "model.layers.0", "model.layers.1")
    assert sorted(data["top_level"]) == sorted(top)
    top_us = sum(e["dur"] for e in spans if e["name"] in top)
    assert data["total"]["cpu_us"] == pytest.approx(step_us[i])
    assert data["outside"]["cpu_us"] == pytest.approx(step_us[i] - top_us)
    assert data["outside"]["cpu_us"] >= 0
    # the modules hold most of a step; in the median one too on a quiet machine, but a loaded one can stall a step
    # between its modules (5 of 7 ms once, in a full suite run): asked of the quietest step, from the raw JSON
    outside = [(st_us - sum(e["dur"] for e in sp if e["name"] in top)) / st_us for st_us, (_, sp) in zip(step_us, steps)]
    assert min(outside) < 0.5, outside
    types = {r["type"]: r for r in data["types"]}
    top_types = ("decoder layer", "model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head")
    assert sum(types[t]["cpu_us"] for t in top_types) + data["outside"]["cpu_us"] == pytest.approx(step_us[i])
    assert sum(types[t]["share"] for t in top_types) + data["outside"]["share"] == pytest.approx(1.0)
    assert types["mlp"]["modules"] == 2 and types["decoder layer"]["modules"] == 2
    assert types["mlp"]["cpu_us"] == pytest.approx(sum(e["dur"] for e in spans if e["name"].endswith(".mlp")))
    for layer in data["layers"]:  # a layer holds its parts
        n = layer["layer"]
        assert layer["cpu_us"] == pytest.approx(next(e["dur"] for e in spans if e["name"] == f"model.layers.{n}"))
        assert sum(e["dur"] for e in spans if e["name"].startswith(f"model.layers.{n}.")) <= layer["cpu_us"]
    assert data["total"]["gpu_us"] == 0 and data["total"]["kernels"] == 0  # a CPU trace: no GPU lane
    assert "Module by module (CPU time" in out and "the median step" in out and "Per decoder layer:" in out
    assert "(outside any module)" in out


def test_decode_attends_to_a_static_cache_of_seq_entries(runs):
    """Prefill: 32 queries; decode: 1 query per step against all 32 cache entries (the unused ones masked).
    With one KV head transformers folds the 4 query heads into the query length: q is [1, 1, 4 x queries, 16]."""
    for phase, queries in (("prefill", 32), ("decode", 1)):
        trace = load(runs[phase][3])
        dims = [e["args"]["Input Dims"] for e in trace["traceEvents"]
                if e.get("name") == "aten::scaled_dot_product_attention" and e.get("cat") == "cpu_op"]
        assert dims and all(d[0][1] * d[0][2] == 4 * queries and d[1][-2] == 32 for d in dims), dims[:2]


def test_any_decoder_config(tmp_path):
    """A GPT-2 config: other module names (transformer.h.0.attn), another MLP: no GeGLU expectation."""
    cfg = tmp_path / "gpt2.json"
    cfg.write_text(json.dumps(GPT2))
    code, out, err, trace = run(tmp_path, "--config", str(cfg), "--seq", "32", "--dtype", "fp32", "--active", "2")
    assert code == 0, err
    assert "model: gpt2 (GPT2Config), 2 layers" in out and "0 broken" in out and "mlp launches" not in out
    assert "modules annotated by path (transformer.h.0.mlp, ...)" in out  # its own names, not Gemma's
    assert trace.name.startswith("gpt2-2L_decode_1x32_mlp-eager")
    data = modules.breakdown(it.load_trace(trace), "decode")
    assert {"attn", "mlp", "ln_1", "ln_2", "decoder layer", "transformer.wte", "lm_head"} <= {r["type"] for r in data["types"]}
    assert [r["layer"] for r in data["layers"]] == [0, 1]


@pytest.mark.parametrize("args,says", [
    (["--preset", "gemma-7b"], "argument --preset: invalid choice"),
    (["--config", "/nonexistent/config.json"], "no such file or folder"),
    (["--config", "not a model!"], "neither a file nor a Hub id"),
    (["--config", "{tmp}/t5.json"], "an encoder-decoder model"),
    (["--config", "{tmp}/broken.json"], "cannot read a transformers config there"),
    (["--preset", "tiny", "--seq", "4096"], "--seq 4096 is longer than this config's 2048 positions"),
    (["--preset", "tiny", "--seq", "5"], "the KV cache must hold a prompt and the 5 decode steps"),
    (["--preset", "gemma-2b", "--batch", "4096", "--seq", "8192"], "this shape needs about"),
    (["--preset", "tiny", "--seq", "32", "--mlp", "liger"], "--mlp liger runs a Triton kernel, which needs a CUDA GPU"),
    (["--preset", "tiny", "--phase", "prefill", "--cuda-graphs"], "--cuda-graphs replays a decode step"),
    (["--preset", "tiny", "--seq", "32", "--cuda-graphs"], "--cuda-graphs replays a CUDA graph, which needs a CUDA GPU"),
    (["--preset", "tiny", "--layers", "0"], "argument --layers: must be between 1"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, says):
    (tmp_path / "t5.json").write_text(json.dumps({"model_type": "t5", "num_layers": 1}))
    (tmp_path / "broken.json").write_text("{not json")
    code, out, err, trace = run(tmp_path, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and trace is None
    assert err.startswith("06_model.py: error: ") and says in err and len(err.strip().splitlines()) == 1
    assert out == ""  # refused before the run: nothing described, no model built


@pytest.mark.parametrize("preset", [TINY, TINY_LLAMA])
@pytest.mark.parametrize("mlp", ["liger", "fused"])
def test_triton_mlp_on_a_cpu_is_refused_before_the_model_is_built(tmp_path, monkeypatch, mlp, preset):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(model06, "build_model", lambda *a: pytest.fail("built the model before refusing"))
    code, out, err, trace = run(tmp_path, *preset, "--mlp", mlp)
    assert (code, out, trace) == (2, "", None)
    assert err == f"06_model.py: error: --mlp {mlp} runs a Triton kernel, which needs a CUDA GPU; on this machine use --mlp eager\n"


def test_one_layer_is_said_in_the_singular(tmp_path, monkeypatch):
    """'model: tiny (GemmaConfig), 1 layer, ...': stopped right after that line, before the model is built."""
    def stop(*a):
        raise model06.common.Fail("stopped here")

    monkeypatch.setattr(model06, "build_model", stop)
    code, out, err, _ = run(tmp_path, *TINY, "--layers", "1")
    assert code == 2 and "model: tiny (GemmaConfig), 1 layer, hidden 64" in out, out + err
    assert model06.common.plural(1, "layer") == "1 layer" and model06.common.plural(2, "MLP") == "2 MLPs"


def test_an_unreachable_hub_says_one_line_without_the_hubs_retries(monkeypatch, capsys):
    """huggingface_hub warns at each retry of an unreachable Hub ("Retrying in 1s [Retry 1/5]."), from a thread that
    outlives the bounded wait: load_config quiets its warnings, and its own one line says what happened."""
    import logging

    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level  # put back after the test
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    hub_log.addHandler(handler)

    def unreachable(name, **kw):  # what huggingface_hub does offline, without the waits between tries
        http = logging.getLogger("huggingface_hub.utils._http")
        for n in range(1, 3):
            http.warning(f"'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/{name}")
            http.warning(f"Retrying in {n}s [Retry {n}/5].")
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files of {name}.")

    monkeypatch.setattr(model06.transformers.AutoConfig, "from_pretrained", unreachable)
    try:
        config, name = model06.load_config(argparse.Namespace(config="someone/some-model", preset="tiny"))
    finally:
        hub_log.removeHandler(handler)
        hub_log.setLevel(level)
    assert name == "tiny" and [r.getMessage() for r in seen] == []
    said = capsys.readouterr()
    assert said.out == "Hugging Face Hub config not available (OSError: We couldn't connect to " \
        "'https://huggingface.co' to load the files of someone/some-model.); using the tiny preset\n"


def test_offline_hub_id_falls_back_to_the_preset(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at import by huggingface_hub: in-process, the wait is what bounds
    monkeypatch.setattr(model06, "HUB_TIMEOUT", 2)  # it (20 s of a worker otherwise, on a machine without the Hub)
    config, name = model06.load_config(argparse.Namespace(config="google/gemma-2b", preset="tiny"))
    assert name == "tiny" and config.hidden_size == model06.PRESETS["tiny"]["hidden_size"]
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("Hugging Face Hub config not available") and "tiny preset" in said[0]


def test_span_hooks_break_dynamos_graph():
    """Why the module spans are off under --compile: Dynamo cannot trace record_function.__enter__ in a hook, so
    each hooked module splits the graph. If a torch release learns to, the spans could stay on under --compile."""
    from torch._dynamo.utils import counters

    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(2, 8)

    def graph_breaks():
        torch._dynamo.reset()
        counters.clear()
        torch.compile(mlp, backend="eager")(x)  # Dynamo only: no Inductor, no C++ compiler
        return sum(counters["graph_break"].values())

    assert graph_breaks() == 0
    model06.add_span(mlp[0], "mlp.0")
    assert graph_breaks() >= 1
    torch._dynamo.reset()
    with torch.profiler.profile() as prof:
        mlp(x)
    assert [e.name for e in prof.events() if e.name == "mlp.0"] == ["mlp.0"]  # eager: one span per call


# ---- trace_reader.modules on a GPU trace (hand-built: the eager GeGLU MLP, 5 kernels per step) -----------------

def test_module_kernels_and_gpu_time_on_a_gpu_trace():
    """The MLP step as one 'layer': its first GEMM under self_attn, the other four kernels under mlp."""
    data = gpu_trace()
    evs = data["traceEvents"]
    steps = [e for e in evs if e["name"] == "mlp_fwd"]
    mms = [e for e in evs if e["name"] == "aten::mm"]
    for s in steps:
        first, *_ = [m for m in mms if inside(m, s)]
        evs.append({"ph": "X", "cat": "user_annotation", "name": "model.layers.0", "pid": 1, "tid": 1,
                    "ts": s["ts"] + 0.1, "dur": s["dur"] - 0.2, "args": {}})
        evs.append({"ph": "X", "cat": "user_annotation", "name": "model.layers.0.self_attn", "pid": 1, "tid": 1,
                    "ts": first["ts"] - 0.05, "dur": first["dur"] + 0.1, "args": {}})
        evs.append({"ph": "X", "cat": "user_annotation", "name": "model.layers.0.mlp", "pid": 1, "tid": 1,
                    "ts": first["ts"] + first["dur"] + 0.05, "dur": s["ts"] + s["dur"] - 0.2 - first["ts"] - first["dur"],
                    "args": {}})
    t = parse(data)
    b = modules.breakdown(t, "mlp_fwd")
    types = {r["type"]: r for r in b["types"]}
    assert types["mlp"]["kernels"] == 4 and types["self_attn"]["kernels"] == 1 and types["decoder layer"]["kernels"] == 5
    per_step_mlp = [sum(k.dur for k in st.gpu if k is not st.kernels[0]) for st in t.steps]  # all but the first GEMM
    assert types["mlp"]["gpu_us"] == pytest.approx(statistics.median(per_step_mlp))
    assert b["outside"]["kernels"] == 0 and b["outside"]["gpu_us"] == pytest.approx(0)
    assert [(r["type"], r["holds_others"]) for r in b["types"]] == [
        ("decoder layer", True), ("mlp", False), ("self_attn", False)]
    results = {ex.text: (v, d) for ex, v, d in it.check(t, [
        modules.module_launches("mlp", "GeLU and mul", has=(r"^aten::gelu$", r"^aten::mul$")),
        modules.module_launches("mlp", "fused", has=("geglu",), lacks=(r"^aten::gelu$", r"^aten::mul$")),
        modules.modules_annotated(1, "mlp_fwd"),
        modules.kernels_between(5, 5, "all"),
        modules.runtime_calls("cudaGraphLaunch", 1),
        modules.largest_module("mlp", "mlp_fwd"),
        modules.largest_module("self_attn", "mlp_fwd")])}
    verdicts = [v for v, _ in results.values()]
    assert verdicts == ["confirmed", "broken", "confirmed", "confirmed", "broken", "confirmed", "broken"], results
    assert list(results.values())[1][1] == ("model.layers.0.mlp: nothing matches ['geglu']; "
                                            "launches ['^aten::gelu$', '^aten::mul$']")
    text = modules.breakdown_text(b)
    assert "GPU µs" in text and "kernels" in text and "Per decoder layer:" in text


def test_no_module_annotations_is_said():
    t = parse(gpu_trace())
    assert modules.breakdown(t, "mlp_fwd") is None
    assert modules.breakdown_text(None) == "Module by module: no module annotations in this trace"
    (_, verdict, _), = it.check(t, [modules.largest_module("mlp", "mlp_fwd")])
    assert verdict == "not applicable"


# ---- on a GPU: the expectations the CPU run cannot check ------------------------------------------------------

GPU_SHAPE = ["--preset", "gemma-2b", "--layers", "2", "--batch", "1", "--seq", "256"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("args,confirmed", [
    (["--phase", "decode"], ["at least 80 GPU kernels per step", "every mlp launches a GeLU and a mul kernel", "overhead-bound"]),
    (["--phase", "decode", "--compile"], ["at most 50 GPU kernels per step"]),
    (["--phase", "decode", "--cuda-graphs", "--warmup", "3"], ["1 cudaGraphLaunch per step"]),
    (["--phase", "prefill", "--mlp", "fused"], ["every mlp launches the GEMM with the GeGLU epilogue", "the mlp modules take the largest share"]),
])
def test_gpu_expectations(tmp_path, args, confirmed):
    code, out, err, _ = run(tmp_path, *GPU_SHAPE, *args, device="cuda")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("  ok ")]
    for text in confirmed:
        assert any(text in line for line in lines), out[-4000:]


@pytest.mark.parametrize("name,flags,broken", [
    ("prefill_eager", ["--phase", "prefill"], ["compute-bound"]),  # 512 tokens: the launches outlast the GPU work
    ("prefill_fused", ["--phase", "prefill", "--mlp", "fused"], ["compute-bound"]),
    ("decode_eager", ["--phase", "decode"], []),
    ("decode_fused", ["--phase", "decode", "--mlp", "fused"], []),
    ("decode_compile", ["--phase", "decode", "--compile"], []),
    ("decode_cudagraphs", ["--phase", "decode", "--cuda-graphs"], []),
])
def test_expectations_on_the_h200_traces(name, flags, broken):
    """The script's own expectations for each recorded run, checked on its committed H200 trace."""
    args = argparse.Namespace(phase=flags[1], active=3, compile="--compile" in flags or "--cuda-graphs" in flags,
                              cuda_graphs="--cuda-graphs" in flags,
                              mlp=flags[flags.index("--mlp") + 1] if "--mlp" in flags else "eager")
    results = it.check(it.load_trace(DATA / f"h200_model_{name}.json.gz"), model06.expectations(args, 4))
    assert [ex.text.split(":")[0] for ex, v, _ in results if v == "broken"] == broken, results
    assert all(v == "confirmed" for ex, v, _ in results if ex.text.split(":")[0] not in broken), results


# ---- inspect_trace.py --expect 06_model: the run's flags read back from the trace ------------------------------

def expect_cli(trace, capsys):
    """(exit code, stdout, stderr) of `inspect_trace.py --expect 06_model TRACE`."""
    code = it.main(["--expect", "06_model", str(trace)])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(text):
    """The expectation lines (ok / BROKEN / n/a) of a report, in order."""
    return [line for line in text.splitlines() if line.startswith(("  ok ", "  BROKEN ", "  n/a "))]


def rewritten(trace, path, keep=lambda e: True, add=()):
    """A copy of `trace` at `path` with only the events `keep` accepts, plus `add(step event)` per ProfilerStep."""
    data = load(trace)
    steps = [e for e in data["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    data["traceEvents"] = [e for e in data["traceEvents"] if keep(e)] + [a(s) for s in steps for a in add]
    path.write_text(json.dumps(data))
    return path


def compiled_region(step):
    return {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": step["pid"], "tid": step["tid"],
            "ts": step["ts"] + 1, "dur": step["dur"] - 2, "args": {}}


def no_modules(e):  # what a compiled run records: no module spans (06_model leaves them out under --compile)
    return not (e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(("model.", "lm_head")))


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_expect_reads_the_run_from_the_trace(runs, phase, tmp_path, capsys):
    """The script's own verdicts, from the suite's file name and from a renamed copy (the annotations say it all)."""
    _, printed, _, trace = runs[phase]
    renamed = tmp_path / "trace.json"
    renamed.write_bytes(trace.read_bytes())
    for path in (trace, renamed):
        code, out, _ = expect_cli(path, capsys)
        assert code == 0 and f"06_model {phase}, eager, 2 layers, MLP eager, 3 steps (read from the trace)" in out
        assert verdicts(out) == verdicts(printed) and len(verdicts(out)) == 5


def test_expect_compiled_and_cuda_graph_runs_from_the_file_name(runs, tmp_path, capsys):
    _, _, _, trace = runs["decode"]
    name = "tiny-2L_decode_1x32_mlp-eager_cudagraphs_fp32_cold_compile.json"
    code, out, _ = expect_cli(rewritten(trace, tmp_path / name, no_modules, [compiled_region]), capsys)
    assert code == 0 and "06_model decode, CUDA graphs, 2 layers, 3 steps" in out
    assert any("1 cudaGraphLaunch per step" in line for line in verdicts(out))
    name = "tiny-3L_decode_1x32_mlp-eager_fp32_cold_compile.json"
    code, out, _ = expect_cli(rewritten(trace, tmp_path / name, no_modules, [compiled_region]), capsys)
    assert code == 0 and "06_model decode, compile, 3 layers, 3 steps" in out
    assert any("at most 75 GPU kernels per step" in line for line in verdicts(out))


def test_expect_what_the_trace_cannot_tell_is_one_line_exit_2(runs, tmp_path, capsys):
    _, _, _, trace = runs["decode"]
    # compiled, renamed: no module spans, no file name: the layer count is unknown, and only the guess that needs it
    # is not applicable (not the whole check refused)
    code, out, err = expect_cli(rewritten(trace, tmp_path / "a.json", no_modules, [compiled_region]), capsys)
    assert code == 0 and err == "" and "06_model decode, compile, layers not told, 3 steps" in out
    na = [line for line in verdicts(out) if line.startswith("  n/a ")]
    assert len(na) == 1 and "at most 25 GPU kernels per step per layer" in na[0]  # (GPU-only, too: a CPU trace)
    # eager, its module spans and name gone: an eager run annotates every layer, so no layer annotated is broken;
    # the kernels per layer are not applicable
    code, out, _ = expect_cli(rewritten(trace, tmp_path / "b.json", no_modules), capsys)
    assert code == 1 and "06_model decode, eager, layers not told" in out
    assert any(line.startswith("  BROKEN  all the decoder layers, each with its parts") for line in verdicts(out))
    assert "seen: ProfilerStep#2: decoder layers annotated: []" in out
    assert any(line.startswith("  n/a ") and "at least 40 GPU kernels per step per layer" in line
               for line in verdicts(out))
    # another harness's trace: no annotations at all, so not the phase either
    bare = rewritten(trace, tmp_path / "c.json", lambda e: e.get("cat") != "user_annotation" or
                     str(e.get("name", "")).startswith("ProfilerStep#"))
    code, _, err = expect_cli(bare, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "need --phase" in err


def test_expect_the_trace_outranks_its_file_name(runs, tmp_path, capsys):
    _, _, _, trace = runs["prefill"]
    name = "tiny-5L_decode_1x32_mlp-fused_fp32_cold_eager.json"  # a misleading name: the annotations say otherwise
    code, out, _ = expect_cli(rewritten(trace, tmp_path / name), capsys)
    assert code in (0, 1) and "06_model prefill, eager, 2 layers, MLP fused" in out  # the MLP: the name is all a CPU trace has
    assert any("the GEMM with the GeGLU epilogue" in line for line in verdicts(out))


@pytest.mark.parametrize("name,said", [
    ("decode_eager", "decode, eager, 4 layers, MLP eager"), ("decode_fused", "decode, eager, 4 layers, MLP fused"),
    ("prefill_eager", "prefill, eager, 4 layers, MLP eager"), ("prefill_fused", "prefill, eager, 4 layers, MLP fused")])
def test_expect_on_the_h200_traces(name, said, capsys):
    """The committed traces are renamed (h200_model_<run>): their module spans and kernels (the fused GeGLU kernel)
    tell the run. Verdicts as in test_expectations_on_the_h200_traces: prefill at 512 tokens is not compute-bound."""
    code, out, _ = expect_cli(DATA / f"h200_model_{name}.json.gz", capsys)
    assert f"06_model {said}, 3 steps (read from the trace)" in out
    assert code == (1 if name.startswith("prefill") else 0)
    assert [line.split()[1] for line in verdicts(out) if line.startswith("  BROKEN")] == (
        ["compute-bound:"] if name.startswith("prefill") else [])


@pytest.mark.parametrize("name,confirmed", [("decode_compile", "at most 100 GPU kernels per step"),
                                            ("decode_cudagraphs", "1 cudaGraphLaunch per step")])
def test_expect_on_the_compiled_h200_traces(name, confirmed, tmp_path, capsys):
    """A compiled run has no module spans: renamed, its layer count is unknown, and the guess that needs it (the
    kernels per layer under plain compile) is not applicable, the others checked; under the name 06_model gives it,
    every compiled expectation is checked on the real GPU trace."""
    code, out, _ = expect_cli(DATA / f"h200_model_{name}.json.gz", capsys)
    na = [line for line in verdicts(out) if line.startswith("  n/a ")]
    assert code == 0 and "layers not told" in out and len(na) == (0 if "graphs" in name else 1), out[-2000:]
    assert all("the trace does not say how many decoder layers" in line for line in na)
    assert not any(line.startswith("  BROKEN") for line in verdicts(out))
    if "graphs" in name:
        assert any(line.startswith("  ok ") and confirmed in line for line in verdicts(out))
    suite_name = "gemma-2b-4L_decode_1x512_mlp-eager" + ("_cudagraphs" if "graphs" in name else "") + \
        "_bf16_cold_compile.json.gz"
    (tmp_path / suite_name).write_bytes((DATA / f"h200_model_{name}.json.gz").read_bytes())
    code, out, _ = expect_cli(tmp_path / suite_name, capsys)
    assert code == 0 and any(line.startswith("  ok ") and confirmed in line for line in verdicts(out)), out[-2000:]


def test_layers_annotated_without_a_count_wants_layers_0_to_the_highest_seen():
    """modules_annotated(None): layers 0..highest seen, each with its parts, at least one; on the H200 decode trace
    (4 layers annotated) confirmed; with layer 2's spans gone, broken (0, 1, 3 seen)."""
    from trace_reader.analyzers import modules
    from trace_reader.reading.tree import parse_trace

    raw = json.loads(gzip.decompress((DATA / "h200_model_decode_eager.json.gz").read_bytes()))
    check = modules.modules_annotated(None, "decode").check
    assert check(parse_trace(raw)) is True
    raw["traceEvents"] = [e for e in raw["traceEvents"] if not str(e.get("name", "")).startswith("model.layers.2")]
    assert check(parse_trace(raw)) == "ProfilerStep#2: decoder layers annotated: [0, 1, 3]"


# ---- SwiGLU models (Llama, Qwen, Mistral): the tiny-llama preset, and what its MLP launches ---------------------

@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    done = run(tmp_path_factory.mktemp("llama"), *TINY_LLAMA, "--phase", "prefill")
    assert done[0] == 0, done[2]
    return done


def test_a_swiglu_model_runs_eagerly_on_the_cpu(llama_run):
    """tiny-llama: a LlamaConfig; every decoder layer's MLP calls SiLU (aten::silu, inside its span in every step, by
    the trace's plain json) and no GeLU; the guess about what it launches is the SwiGLU one (GPU-only: n/a here)."""
    _, out, _, trace = llama_run
    assert "model: tiny-llama (LlamaConfig), 2 layers, hidden 64, intermediate 176" in out and "0 broken" in out
    assert "  n/a     every mlp launches a SiLU and a mul kernel between its GEMMs" in out
    assert trace.name.startswith("tiny-llama-2L_prefill_1x32_mlp-eager")
    for step, inner in annotation_spans(trace):
        ops = [e for e in load(trace)["traceEvents"] if e.get("cat") == "cpu_op" and inside(e, step)]
        for layer in (0, 1):
            mlp, = [e for e in inner if e["name"] == f"model.layers.{layer}.mlp"]
            assert [e["name"] for e in ops if inside(e, mlp) and e["name"] in ("aten::silu", "aten::gelu")] == [
                "aten::silu"]


def test_expect_reads_a_swiglu_run_back(llama_run, tmp_path, capsys):
    """inspect_trace --expect 06_model: the activation from transformers' op in the trace (renamed: no preset in the
    name), and for the fused MLP (its kernels have one name for both) from the file name's preset."""
    _, printed, _, trace = llama_run
    renamed = tmp_path / "trace.json"
    renamed.write_bytes(trace.read_bytes())
    code, out, _ = expect_cli(renamed, capsys)
    assert code == 0 and verdicts(out) == verdicts(printed) and any("a SiLU and a mul" in v for v in verdicts(out))
    name = "tiny-llama-2L_prefill_1x32_mlp-fused_fp32_cold_eager.json"
    no_silu = rewritten(trace, tmp_path / name, lambda e: e.get("name") != "aten::silu")
    code, out, _ = expect_cli(no_silu, capsys)
    assert "MLP fused" in out and any("the GEMM with the SwiGLU epilogue: no SiLU, no mul" in v for v in verdicts(out))


def test_a_config_with_another_mlp_is_refused_in_one_line(tmp_path):
    """Neither GeGLU nor SwiGLU (a Llama with ReLU; GPT-2's gelu_new): --mlp fused and liger say which activation the
    config has, before any model is built; --mlp eager runs it."""
    relu = tmp_path / "relu.json"
    relu.write_text(json.dumps({"model_type": "llama", "hidden_act": "relu", "hidden_size": 32,
                                "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "vocab_size": 100}))
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps(GPT2))
    for config, act in ((relu, "relu"), (gpt2, "gelu_new")):
        for mlp in ("fused", "liger"):
            code, out, err, trace = run(tmp_path, "--config", str(config), "--seq", "32", "--mlp", mlp)
            assert (code, out, trace) == (2, "", None)
            assert err == (f"06_model.py: error: --mlp {mlp} replaces a GeGLU MLP (gelu_pytorch_tanh) or a SwiGLU MLP "
                           f"(silu); this config's is {act}\n")
    code, out, err, _ = run(tmp_path, "--config", str(relu), "--seq", "32", "--dtype", "fp32", "--active", "2")
    assert code == 0 and "mlp launches" not in out, err


def test_gated_activation_of_transformers_configs():
    import transformers

    assert [model06.gated_activation(c) for c in (
        transformers.GemmaConfig(), transformers.Gemma2Config(), transformers.LlamaConfig(), transformers.Qwen2Config(),
        transformers.MistralConfig(), transformers.LlamaConfig(hidden_act="swish"), transformers.GPT2Config())] == [
        "gelu_tanh", "gelu_tanh", "silu", "silu", "silu", "silu", None]
    assert [type(model06.preset_config(p)).__name__ for p in model06.PRESETS] == [
        "GemmaConfig", "GemmaConfig", "LlamaConfig", "LlamaConfig"]


def _with_layer_spans(data):
    """gpu_trace()'s MLP step as one decoder layer: its first GEMM under self_attn, the rest under mlp."""
    evs = data["traceEvents"]
    mms = [e for e in evs if e["name"] == "aten::mm"]
    for s in [e for e in evs if e["name"] == "mlp_fwd"]:
        first, *_ = [m for m in mms if inside(m, s)]
        for name, ts, dur in (("model.layers.0", s["ts"] + 0.1, s["dur"] - 0.2),
                              ("model.layers.0.self_attn", first["ts"] - 0.05, first["dur"] + 0.1),
                              ("model.layers.0.mlp", first["ts"] + first["dur"] + 0.05,
                               s["ts"] + s["dur"] - 0.2 - first["ts"] - first["dur"])):
            evs.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                        "args": {}})
    return data


def _renamed(data, names, drop=()):
    """data with events renamed (old name -> new) and those named in drop (and their kernels) left out."""
    gone = {e["args"]["External id"] for e in data["traceEvents"] if e["name"] in drop}
    data["traceEvents"] = [dict(e, name=names.get(e["name"], e["name"])) for e in data["traceEvents"]
                           if e["name"] not in drop and e.get("args", {}).get("External id") not in gone]
    return data


def test_what_the_mlp_launches_by_activation_on_a_gpu_trace():
    """06's guess about each MLP's launches, per activation, on the hand-built GPU trace (the eager GeGLU MLP), on the
    same with SiLU in GeLU's place (transformers' Llama MLP), and with Liger's SwiGLU in place of both pointwise ops:
    confirmed for the MLP each trace holds, broken for the others; and the activation the reader tells from each."""
    from test_inspect_trace import GELU

    def guess(trace, mlp, act):
        args = argparse.Namespace(phase="mlp_fwd", active=3, compile=False, cuda_graphs=False, mlp=mlp)
        ex = model06.expectations(args, 1, act)[-1]
        (_, verdict, _), = it.check(trace, [ex])
        return ex.text, verdict

    silu_kernel = "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel_cuda>"
    traces = {"geglu": parse(_with_layer_spans(gpu_trace())),
              "swiglu": parse(_renamed(_with_layer_spans(gpu_trace()), {"aten::gelu": "aten::silu", GELU: silu_kernel})),
              "liger-swiglu": parse(_renamed(_with_layer_spans(gpu_trace()), {"aten::gelu": "LigerSiLUMulFunction",
                                                                              GELU: "_swiglu_forward_kernel"},
                                             drop=("aten::mul",)))}
    assert guess(traces["geglu"], "eager", "gelu_tanh") == (
        "every mlp launches a GeLU and a mul kernel between its GEMMs", "confirmed")
    assert guess(traces["geglu"], "eager", "silu")[1] == "broken"
    assert guess(traces["swiglu"], "eager", "silu") == (
        "every mlp launches a SiLU and a mul kernel between its GEMMs", "confirmed")
    assert guess(traces["swiglu"], "eager", "gelu_tanh")[1] == "broken"
    assert guess(traces["liger-swiglu"], "liger", "silu") == (
        "every mlp launches Liger's one SwiGLU kernel: no SiLU, no mul", "confirmed")
    assert guess(traces["liger-swiglu"], "liger", "gelu_tanh")[1] == "broken"
    assert guess(traces["liger-swiglu"], "eager", "silu")[1] == "broken"
    for name, (mlp, act) in {"geglu": ("eager", "gelu_tanh"), "swiglu": ("eager", "silu"),
                             "liger-swiglu": ("liger", "silu")}.items():
        read = argparse.Namespace(compile=False)
        modules.model_flags(read, traces[name], [])
        assert (read.mlp, read.act) == (mlp, act), name


@pytest.mark.parametrize("names,preset,mlp,act", [
    ({"aten::silu"}, None, "eager", "silu"), ({"aten::gelu"}, "tiny-llama", "eager", "gelu_tanh"),  # the trace first
    ({"_swiglu_forward_kernel_tiled"}, None, "liger", "silu"), ({"_geglu_tanh_forward_kernel"}, None, "liger", "gelu_tanh"),
    ({"_geglu_tma_kernel"}, "llama-1b", "fused", "silu"), ({"_geglu_tma_kernel"}, None, "fused", "gelu_tanh"),
    ({"aten::gelu", "aten::silu"}, "tiny", "eager", "gelu_tanh"), (set(), None, "eager", None)])
def test_the_readers_activation_from_names_then_the_preset(names, preset, mlp, act):
    assert modules.mlp_activation(names, preset, mlp) == act


@cuda
@pytest.mark.parametrize("mlp,confirmed", [
    ("eager", "every mlp launches a SiLU and a mul kernel"), ("liger", "every mlp launches Liger's one SwiGLU kernel"),
    ("fused", "every mlp launches the GEMM with the SwiGLU epilogue")])
def test_gpu_a_swiglu_model_with_each_mlp(tmp_path, mlp, confirmed):
    code, out, err, _ = run(tmp_path, "--preset", "llama-1b", "--layers", "2", "--batch", "1", "--seq", "256",
                            "--phase", "prefill", "--mlp", mlp, device="cuda")
    assert code == 0, err
    assert any(confirmed in line for line in out.splitlines() if line.startswith("  ok ")), out[-4000:]
