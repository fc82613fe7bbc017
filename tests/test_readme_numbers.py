"""Every number README.md and the docs/*.md pages quote, re-derived from committed data: the H200 traces in tests/data/ and the
benchmark record in results/bench_h200.json (or, for sizes and defaults, from the code that sets them).
The benchmark table and the line above it are bench.markdown_table(results/bench_h200.json): test_readme.py;
06_model's benchmark table is bench_model.markdown(results/bench_model_h200.json), checked here.

Kernel times are read from the traces with plain json (mean µs per call over the 3 active steps), not through
the trace reader, so the reader's own report cannot vouch for itself; busy fractions come from the reader.
"""

import gzip
import importlib
import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from doc_pages import all_text, page, section

ROOT = Path(__file__).resolve().parent.parent
README = all_text()  # the README and every docs page: a number is checked wherever it is quoted


def kernel_us(trace: str, pattern: str) -> float:
    """Mean µs per call of the kernels whose full name matches `pattern` in tests/data/h200_<trace>.json.gz."""
    with gzip.open(ROOT / f"tests/data/h200_{trace}.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    durs = [e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel" and re.search(pattern, e["name"])]
    assert durs, f"no kernel matching {pattern!r} in {trace}"
    return sum(durs) / len(durs)


def one(pattern: str, text: str = README) -> re.Match:
    found = list(re.finditer(pattern, text, flags=re.M))
    assert len(found) == 1, f"{pattern!r} found {len(found)} times in the README and docs pages"
    return found[0]


def quoted(pattern: str, text: str = README) -> list[float]:
    """The numbers captured by `pattern`'s groups, where it matches once."""
    return [float(g.replace(",", "")) for g in one(pattern, text).groups()]


COOP_A, COOP_B = r"_coopA_TNT$", r"_coopB_TNT$"
GELU, MUL = r"GeluCUDAKernelImpl", r"vectorized_elementwise_kernel<.*BinaryFunctor<.*MulFunctor"
INDUCTOR, LIGER, TMA = r"^triton_poi_fused__unsafe_view_gelu_mul_0$", r"^_geglu_tanh_forward_kernel$", r"^_geglu_tma_kernel$"
LINEAR_GEMM = r"^nvjet_sm90_tst_64x8_64x16_1x2_h_bz_bias_TNT$"


# --- "What an H200 shows": the kernel table (means over the 3 steps, 0.1 µs) ----------------------------------

@pytest.mark.parametrize("row,trace,patterns", [
    (r"`02_linear.py`, eager and compiled", "linear_eager", [LINEAR_GEMM]),
    (r"`02_linear.py`, eager and compiled", "linear_compile", [LINEAR_GEMM]),
    (r"`03_simple_mlp.py`, eager", "mlp_eager", [COOP_A, GELU, MUL, COOP_B]),
    (r"`03_simple_mlp.py --compile`", "mlp_compile", [INDUCTOR]),
    (r"`03_kernels_mlp.py` \(liger-kernel package", "liger", [LIGER]),
    (r"`04_fused_mlp.py`", "fused_eager", [TMA, COOP_B]),
])
def test_h200_kernel_table(row, trace, patterns):
    line = one(rf"^\| {row}.*\|$").group(0)
    numbers = [float(n) for n in re.findall(r"\((\d+\.\d)", line)]
    assert numbers == [round(kernel_us(trace, p), 1) for p in patterns], line
    for name in re.findall(r"`((?:nvjet|triton|_geglu)\w*)`", line):  # every kernel the row names ran in that trace
        kernel_us(trace, rf"^{re.escape(name)}$")


def test_h200_prose_numbers():
    eager_pointwise = kernel_us("mlp_eager", GELU) + kernel_us("mlp_eager", MUL)
    assert quoted(r"Eager's two kernels take (\d+\.\d) µs") == [round(eager_pointwise, 1)]
    assert quoted(r"fused one?s?\*\*: (\d+\.\d) µs against Liger's (\d+\.\d) µs") == \
        [round(kernel_us("mlp_compile", INDUCTOR), 1), round(kernel_us("liger", LIGER), 1)]
    faster = 1 - kernel_us("mlp_eager", COOP_B) / kernel_us("mlp_eager", COOP_A)
    assert quoted(r"down_proj ~(\d+)% faster") == [round(100 * faster)]


def test_fused_vs_compiled_prose():
    """'... (173.0 µs per step) replaced by `_geglu_tma_kernel` (123.0 µs), `down_proj` unchanged (51.4 µs)'."""
    replaced = 2 * kernel_us("mlp_compile", COOP_A) + kernel_us("mlp_compile", INDUCTOR)  # per step: 2 GEMMs + 1
    assert quoted(r"\((\d+\.\d) µs per step\) replaced by `_geglu_tma_kernel` \((\d+\.\d) µs\), `down_proj` "
                  r"unchanged \((\d+\.\d) µs\)") == \
        [round(replaced, 1), round(kernel_us("fused_eager", TMA), 1), round(kernel_us("fused_eager", COOP_B), 1)]


def test_busy_fractions_quoted_in_prose():
    import inspect_trace as it

    fused = it.load_trace(ROOT / "tests/data/h200_fused_eager.json.gz")
    kind, busy = it.bound_of(fused)
    assert "overhead-bound" in one(r"this step is overhead-bound at this shape \(GPU busy ~(\d+)% of the step\)").group(0)
    assert kind == "overhead" and quoted(r"GPU busy ~(\d+)% of the step") == [round(100 * busy, -1)]
    part1 = it.load_trace(ROOT / "tests/data/h200_matmul_add_64_eager.json.gz")
    per_step = [st.gpu_busy / st.wall for st in part1.steps]
    assert len(per_step) == 3
    assert quoted(r"At size 64 the GPU is busy (\d+)–(\d+)% of each") == \
        [round(100 * min(per_step)), round(100 * max(per_step))]


# --- sizes, defaults and ratios the README states -----------------------------------------------------------

def test_sizes_and_defaults():
    import common
    from trace_reader import serve as serve_trace
    import torch

    assert quoted(r"2·8192·768·3072 ≈ (\d+\.\d) GFLOP") == [round(2 * 8192 * 768 * 3072 / 1e9, 1)]
    # bf16 [8192, 3072]: 50.3 MB; quoted to two figures
    assert quoted(r"the (\d+) MB `\[8192, 3072\]` GeLU output") == [round(8192 * 3072 * 2 / 1e6, -1)]
    assert quoted(r"two `\[8192, 3072\]`\s+bf16 tensors, (\d+) MB") == [round(2 * 8192 * 3072 * 2 / 1e6, -1)]
    assert one(r"bf16\s+tolerance (\S+)\)").group(1) == f"{common.TOLERANCE[torch.bfloat16]:.0e}".replace("e-0", "e-")
    kernels_mlp = (ROOT / "03_kernels_mlp.py").read_text()
    default = re.search(r'os.environ.get\("HUB_TIMEOUT", "(\d+)"\)', kernels_mlp).group(1)
    assert quoted(r"`HUB_TIMEOUT` seconds \(default (\d+)\)") == [float(default)]
    import inspect

    serve_default = inspect.signature(serve_trace.serve).parameters["timeout"].default
    assert quoted(r"or after (\d+) minutes\)") == [serve_default / 60]


def test_setup_cost():
    """README: the first command 'downloads about 3.1 GB of wheels (3.0 GB of them torch, Triton and NVIDIA's CUDA
    libraries), and `.venv` then holds about 5.7 GB': for each package installed here, the wheel uv.lock pins that
    fits this interpreter best (the installer's rule), and the files under .venv."""
    import os
    import platform
    import sys
    from importlib import metadata

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads TOML")
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    if (sys.platform, platform.machine()) != ("linux", "x86_64") or Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("the README's figures are for the project's own environment on Linux x86_64")
    rank = {tag: i for i, tag in enumerate(sys_tags())}
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wheels, cuda = 0, 0
    for package in tomllib.loads((ROOT / "uv.lock").read_text())["package"]:
        if installed.get(canonicalize_name(package["name"])) != package.get("version"):
            continue
        fits = [(min(rank[t] for t in tags if t in rank), w["size"]) for w in package.get("wheels", [])
                for tags in [parse_wheel_filename(w["url"].rsplit("/", 1)[1])[3]] if any(t in rank for t in tags)]
        if not fits and package.get("source", {}).get("editable"):
            continue  # the suite's own reader (reader/, installed editable): no wheel, a few hundred KB of source
        size = min(fits)[1]  # a package installed here has a wheel that fits (none is built from source)
        wheels += size
        cuda += size if package["name"] in ("torch", "triton") or package["name"].startswith(("nvidia-", "cuda-")) else 0
    venv = sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(ROOT / ".venv") for f in files)
    said = r"downloads about (\d\.\d) GB of wheels \((\d\.\d) GB of them torch, Triton and NVIDIA's CUDA libraries\), " \
           r"and `\.venv` then holds about (\d\.\d) GB"
    assert quoted(said.replace(" ", r"\s+")) == [
        round(wheels / 1e9, 1), round(cuda / 1e9, 1), round(venv / 1e9, 1)]


def test_gzip_is_about_ten_times_smaller():
    ratios = [len(gzip.decompress(p.read_bytes())) / p.stat().st_size for p in (ROOT / "tests/data").glob("*.json.gz")]
    assert len(ratios) >= 10
    assert quoted(r"(\d+)–(\d+)× smaller on the committed traces") == [round(min(ratios)), round(max(ratios))], ratios


# --- 06_model.py on the H200: the table under "What an H200 showed" (tests/data/h200_model_*.json.gz) ----------

MODEL_RUNS = [("prefill, eager", "prefill_eager"), ("prefill, `--mlp fused`", "prefill_fused"),
              ("decode, eager", "decode_eager"), ("decode, `--mlp fused`", "decode_fused"),
              ("decode, `--compile`", "decode_compile"), ("decode, `--cuda-graphs`", "decode_cudagraphs")]


def model_table() -> list[str]:
    """The README's 06_model table, from the committed traces: the typical (median) step of each run; module
    shares from the per-module breakdown (its median step), '-' under --compile (no module spans there)."""
    import inspect_trace as it
    from trace_reader.analyzers import modules

    rows = ["| run | kernels | GPU work (µs) | step (µs) | GPU busy | mlp | self_attn |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, name in MODEL_RUNS:
        t = it.load_trace(ROOT / f"tests/data/h200_model_{name}.json.gz")
        data = it.report_data(t)
        typical = data["typical_step"]
        st = next(s for s in data["steps"] if s["number"] == typical["number"])
        b = modules.breakdown(t, name.split("_")[0])
        share = {r["type"]: f"{100 * r['share']:.0f}%" for r in b["types"]} if b else {}
        rows.append(f"| {label} | {st['kernels']} | {st['gpu_busy_us']:,.0f} | {st['wall_us']:,.0f} | "
                    f"{100 * typical['busy_fraction']:.0f}% | {share.get('mlp', '-')} | {share.get('self_attn', '-')} |")
    return rows


def test_model_table_is_the_committed_traces():
    lines = README.splitlines()
    start = lines.index(model_table()[0]) if model_table()[0] in lines else None
    assert start is not None, "\n".join(model_table())
    assert lines[start:start + len(MODEL_RUNS) + 2] == model_table()


def test_model_prose_numbers():
    import inspect_trace as it
    from trace_reader.analyzers import modules

    def typical(name):
        data = it.report_data(it.load_trace(ROOT / f"tests/data/h200_model_{name}.json.gz"))
        return next(s for s in data["steps"] if s["number"] == data["typical_step"]["number"])

    eager, compiled, graphs, prefill = (typical(n) for n in ("decode_eager", "decode_compile", "decode_cudagraphs",
                                                             "prefill_eager"))
    assert quoted(r"overhead-bound, as guessed: (\d+) kernels for one token, about (\d\.\d) ms of GPU work") == [
        eager["kernels"], round(eager["gpu_busy_us"] / 1000, 1)]
    assert quoted(r"cuts the kernels to (\d+) and the GPU work by a third") == [compiled["kernels"]]
    assert 1 - compiled["gpu_busy_us"] / eager["gpu_busy_us"] == pytest.approx(1 / 3, abs=0.03)
    assert quoted(r"replays the same (\d+) kernels as one") == [graphs["kernels"]]
    assert quoted(r"(\d\.\d) ms of GPU work \(half of it\s+in the MLPs") == [round(prefill["gpu_busy_us"] / 1000, 1)]
    assert quoted(r"hides behind about (\d+) ms of eager launches") == [round(prefill["wall_us"] / 1000)]
    # six kernels per eager MLP at this shape, the sixth cuBLAS's split-K reduce; K = 16384 is the preset's MLP
    t = it.load_trace(ROOT / "tests/data/h200_model_prefill_eager.json.gz")
    assert modules.per_annotation(t)["model.layers.0.mlp"]["kernels"] == [6, 6, 6]
    assert any("splitKreduce" in k.name for st in t.steps for k in st.kernels)
    assert "so six kernels, not the five" in README and "(K = 16384)" in README
    assert importlib.import_module("06_model").PRESETS["gemma-2b"]["intermediate_size"] == 16384


# --- 06_model.py's benchmark: the table is bench_model.markdown(results/bench_model_h200.json) ----------------

def test_model_benchmark_table_is_the_committed_h200_record():
    import bench_model

    model_page = page("docs/06_model.md")
    path = ROOT / "results/bench_model_h200.json"
    if not path.exists():
        assert bench_model.TABLE_HEADER not in model_page, "a model benchmark table in the page, but no record behind it"
        pytest.skip("no committed H200 record yet")
    record = json.loads(path.read_text())
    assert bench_model.markdown(record) in model_page, "the page's table is not bench_model.markdown() of the record"
    assert "results/bench_model_h200.json" in model_page  # where a reader finds the whole record


def test_model_benchmark_prose():
    """The MLPs' GPU time quoted beside the benchmark, from the traces; the largest decode step is CUDA graphs'."""
    import inspect_trace as it
    from trace_reader.analyzers import modules

    def mlp_us(name):
        b = modules.breakdown(it.load_trace(ROOT / f"tests/data/h200_model_{name}.json.gz"), name.split("_")[0])
        return round(next(r["gpu_us"] for r in b["types"] if r["type"] == "mlp"))

    assert quoted(r"prefill (\d+) → (\d+),\s+decode\s+(\d+) → (\d+)[;)]") == [
        mlp_us("prefill_eager"), mlp_us("prefill_fused"), mlp_us("decode_eager"), mlp_us("decode_fused")]
    record = json.loads((ROOT / "results/bench_model_h200.json").read_text())
    assert not any(r["skipped"] for r in record["shapes"])  # every variant ran
    rounds = {r["phase"]: {(v["execution"], v["mlp"]): v["rounds_us"] for v in r["variants"].values()}
              for r in record["shapes"]}
    us = {r["phase"]: {(v["execution"], v["mlp"]): v["median_us"] for v in r["variants"].values()}
          for r in record["shapes"]}
    decode = us["decode"]
    eager, compiled, graphs = decode[("eager", "eager")], decode[("compile", "eager")], decode[("cuda-graphs", "eager")]
    assert quoted(r"the first\s+saves (\d\.\d\d) ms a token, the second (\d\.\d\d) ms more") == [
        round((eager - compiled) / 1e3, 2), round((compiled - graphs) / 1e3, 2)]
    floor = record["shapes"][1]["floor_us"]
    assert floor < 250  # "what the GPU reads in a quarter of one" (millisecond)
    assert quoted(r"together they make decode (\d+\.\d)× faster than eager, at (0\.\d\d) of the floor") == [
        round(eager / graphs, 1), round(floor / graphs, 2)]

    def spread(phase, key):
        r = rounds[phase][key]
        return (max(r) - min(r)) / us[phase][key]

    host_timed = [spread(phase, k) for phase in us for k in us[phase] if k[0] != "cuda-graphs"]
    assert len(host_timed) == 12
    assert quoted(r"rounds spread by (\d+)% to (\d+)%") == [round(100 * min(host_timed)), round(100 * max(host_timed))]
    graphed = [spread("decode", ("cuda-graphs", mlp)) for mlp in ("eager", "liger", "fused")]
    assert quoted(r"their rounds spread by\s+(\d+\.\d)% to (\d+\.\d)%\)") == [
        round(100 * min(graphed), 1), round(100 * max(graphed), 1)]
    assert max(graphed) < min(host_timed)  # the graph rows are still the steadier

    # The pairs, by hand from the rounds: the middle of (transformers' MLP's round / this row's round), and the rounds
    # where this row was faster.
    def pair(phase, execution, mlp="fused"):
        ratios = sorted(a / b for a, b in zip(rounds[phase][(execution, "eager")], rounds[phase][(execution, mlp)]))
        return ratios[len(ratios) // 2], sum(r > 1 for r in ratios), len(ratios)

    assert all(pair(phase, execution)[2] == 45 for phase, execution in
               (("prefill", "eager"), ("prefill", "compile"), ("decode", "eager"), ("decode", "compile"),
                ("decode", "cuda-graphs")))
    assert quoted(r"round by round \((\d+) rounds") == [45]
    # "Replayed as a CUDA graph the fused MLP gives the fastest decode step, A ms against B ms (Rx, faster in N of 15)"
    assert min(decode, key=decode.get) == ("cuda-graphs", "fused")
    r, n, _ = pair("decode", "cuda-graphs")
    assert quoted(r"fastest decode step, (\d\.\d+) ms against (\d\.\d+) ms \((\d\.\d\d)×,\s+faster in (\d+) of 45") == [
        round(decode[("cuda-graphs", "fused")] / 1e3, 3), round(graphs / 1e3, 3), round(r, 2), n]
    # "Decode is ahead however it runs: compiled Rx (faster in N of 45 rounds), eager Rx (N of 45). Prefill is level:
    # compiled Rx (faster in N of 45 rounds), eager Rx (N of 45)": ahead = faster in most rounds; level = within 1%
    # either way, neither side faster in most rounds by far
    (rdc, ndc, _), (rde, nde, _) = pair("decode", "compile"), pair("decode", "eager")
    assert rdc > 1 and rde > 1 and ndc > 45 / 2 and nde > 45 / 2
    assert quoted(r"Decode is ahead however it runs: compiled (\d\.\d\d)× \(faster in (\d+) of 45 rounds\), eager\s+"
                  r"(\d\.\d\d)× \((\d+) of 45\)") == [round(rdc, 2), ndc, round(rde, 2), nde]
    (rpc, npc, _), (rpe, npe, _) = pair("prefill", "compile"), pair("prefill", "eager")
    assert all(abs(r - 1) < 0.01 and 10 < n < 35 for r, n in ((rpc, npc), (rpe, npe)))
    assert quoted(r"Prefill is level: compiled (\d\.\d\d)× \(faster in (\d+) of 45 rounds\), eager (\d\.\d\d)× "
                  r"\((\d+) of 45\)") == [round(rpc, 2), npc, round(rpe, 2), npe]
    # "Its eager rows alone (..., run N minutes before this table ...): prefill Rx (faster in N of 45), decode Rx
    # (N of 45); paired step by step, the two runs agree": the same pairing, on that record's rounds
    alone = json.loads((ROOT / "results/bench_model_eager_h200.json").read_text())
    alone_rounds = {r["phase"]: {(v["execution"], v["mlp"]): v["rounds_us"] for v in r["variants"].values()}
                    for r in alone["shapes"]}
    assert {v["execution"] for r in alone["shapes"] for v in r["variants"].values()} == {"eager"}

    def alone_pair(phase):
        ratios = sorted(a / b for a, b in zip(alone_rounds[phase][("eager", "eager")],
                                              alone_rounds[phase][("eager", "fused")]))
        return [round(ratios[len(ratios) // 2], 2), sum(r > 1 for r in ratios)]

    earlier = (datetime.fromisoformat(record["date"]) - datetime.fromisoformat(alone["date"])).total_seconds()
    assert earlier > 0 and quoted(r"eager_h200\.json`, run (\d+) minutes? before this\s+table on the same GPU") == [
        round(earlier / 60)]
    assert alone["device"] == record["device"] and alone["torch"] == record["torch"]
    assert "interleaved" in alone["timer"] and "interleaved" in record["timer"]  # "paired step by step"
    assert quoted(r"prefill (\d\.\d\d)× \(faster in (\d+) of 45\), decode (\d\.\d\d)× \((\d+) of 45\); paired") == [
        *alone_pair("prefill"), *alone_pair("decode")]
    # "the two runs agree": the same side of level, at the same two decimals
    assert alone_pair("decode")[0] == round(rde, 2) and alone_pair("prefill")[0] == round(rpe, 2)
    # the record carries the same pairs
    for phase, execution in (("prefill", "eager"), ("decode", "eager"), ("decode", "cuda-graphs")):
        v = next(v for v in record["shapes"][["prefill", "decode"].index(phase)]["variants"].values()
                 if (v["execution"], v["mlp"]) == (execution, "fused"))
        assert (v["vs_eager_mlp"], v["faster_rounds"], v["paired_rounds"]) == pair(phase, execution)
    # "Liger's MLP is slower than transformers' own in eager, in both phases (Rx and Rx, paired), and within N% of it
    # once compiled or graphed (Rx to Rx)"
    eager_pairs = [pair(phase, "eager", "liger")[0] for phase in ("prefill", "decode")]
    assert max(eager_pairs) < 1
    assert quoted(r"in eager, in both phases \((\d\.\d\d)× and (\d\.\d\d)×, paired\)") == [round(r, 2) for r in eager_pairs]
    later = [pair(phase, execution, "liger")[0] for phase, execution in
             (("prefill", "compile"), ("decode", "compile"), ("decode", "cuda-graphs"))]
    within = quoted(r"within (\d+)%\s+of it once compiled or graphed \((\d\.\d\d)× to (\d\.\d\d)×\)")
    assert within[1:] == [round(min(later), 2), round(max(later), 2)]
    assert all(abs(r - 1) < within[0] / 100 for r in later)
    log = (ROOT / "tests/data/h200_model_record_log.txt").read_text()
    b8 = log[log.index("=== prefill_b8"):]
    busy = re.search(r"typical step \(median, #\d\): compute-bound, GPU busy (\d+)%", b8)
    assert busy and quoted(r"the same run was compute-bound, its GPU busy (\d+)% of the step") == [int(busy.group(1))]
    mlp_share = re.search(r"^mlp +4 +[\d,.]+ +(\d+)%", b8, flags=re.M)
    assert mlp_share and 62 <= int(mlp_share.group(1)) <= 70  # "two thirds of the GPU time in the MLPs"


def test_mlp_benchmark_prose():
    """The sentences under the MLP benchmark table, from results/bench_h200.json."""
    record = json.loads((ROOT / "results/bench_h200.json").read_text())
    shapes = {(r["M"], r["dim"], r["hidden"]): r for r in record["shapes"]}
    bench_section = section(page("docs/04_fused_mlp.md"), "## Benchmark: every GeGLU MLP side by side")
    flat = " ".join(bench_section.split())

    def best_other(r, column="median_us"):
        others = {k: v[column] for k, v in r["variants"].items() if k != "fused" and column in v}
        return min(others, key=others.get)

    def us(shape, name, column="median_us"):
        return shapes[shape]["variants"][name][column]

    def lead(shape, column="median_us"):
        return us(shape, best_other(shapes[shape], column), column) / us(shape, "fused", column)

    def spread(shape, name):  # by hand: (slowest round - fastest) / median
        r = shapes[shape]["variants"][name]["rounds_us"]
        return (max(r) - min(r)) / us(shape, name)

    post, quarter, tma_prefill = (8192, 768, 3072), (2048, 768, 3072), (4096, 4096, 11008)
    level = [(1000, 4096, 11008), (8192, 4096, 14336), (16384, 2048, 16384)]
    # "the fastest variant at the post's shape (A x the best other, at F of the floor), at a quarter of it (B against
    # eager's C) and at 4096x4096->11008 (Dx, at G of the floor), where the table runs its TMA kernel"
    assert all(lead(s) > 1 for s in (post, quarter, tma_prefill))
    assert {shapes[s]["fused_path"] for s in (post, quarter, tma_prefill)} == {"tma"}
    assert quoted(r"post's shape\s+\((\d\.\d\d)× the best other, at (0\.\d\d) of the floor\)", bench_section) == [
        round(lead(post), 2), round(shapes[post]["floor_us"] / us(post, "fused"), 2)]
    assert best_other(shapes[quarter]) == "compile"
    assert quoted(r"\((\d+\.\d) µs against `torch.compile`'s\s+(\d+\.\d)\)", bench_section) == [
        round(us(quarter, "fused"), 1), round(us(quarter, "compile"), 1)]
    assert quoted(r"4096×4096→11008 \((\d\.\d\d)×, at (0\.\d\d) of the floor\)", flat) == [
        round(lead(tma_prefill), 2), round(shapes[tma_prefill]["floor_us"] / us(tma_prefill, "fused"), 2)]
    # "The fused MLP is the fastest variant at all six" compute-bound rows
    prefill = [s for s, r in shapes.items() if r["bound"] == "compute"]
    assert len(prefill) == 6 and all(lead(s) > 1 for s in prefill)
    # "At the three prefills where the table runs cuBLAS (1000, 8192 and 16384 tokens) ...: ahead by L–Hx, and in each
    # of the 5 rounds at all three."
    assert {shapes[s]["fused_path"] for s in level} == {"torch"}
    assert all(best_other(shapes[s]) == "compile" for s in level)
    leads = [lead(s) for s in level]
    assert quoted(r"The fused MLP is ahead by (\d\.\d{3})–(\d\.\d{3})×, and in each of the (\d) rounds at all three",
                  flat) == [round(min(leads), 3), round(max(leads), 3), 5]
    for s in level:
        v = shapes[s]["variants"]
        assert len(v["fused"]["rounds_us"]) == 5
        assert all(f < c for f, c in zip(v["fused"]["rounds_us"], v["compile"]["rounds_us"])), s
    assert "interleaved" in record["timer"]
    # "Timed round-robin ... the same code N minutes earlier (results/bench_round_robin_h200.json) had those three at
    # L–Hx of torch.compile, its rounds at 8192x4096->14336 moving by up to P% with the GPU's clock (fused: A to B µs)"
    rr = json.loads((ROOT / "results/bench_round_robin_h200.json").read_text())
    assert "round-robin" in rr["timer"] and (rr["device"], rr["torch"], rr["triton"]) == (
        record["device"], record["torch"], record["triton"])
    # "the day before, before the packing rows"
    table_date = json.loads((ROOT / "fused_geglu_tuned.json").read_text())["date"]
    days = (datetime.fromisoformat(record["date"]).date() - datetime.fromisoformat(rr["date"]).date()).days
    assert days == 1 and rr["date"] < table_date < record["date"]
    assert "the day before, before the packing rows" in flat
    rr_shapes = {(r["M"], r["dim"], r["hidden"]): r["variants"] for r in rr["shapes"]}
    rr_leads = [rr_shapes[s]["compile"]["median_us"] / rr_shapes[s]["fused"]["median_us"] for s in level]
    assert quoted(r"those three were at (\d\.\d\d)–(\d\.\d\d)× of `torch.compile`", flat) == [
        round(min(rr_leads), 2), round(max(rr_leads), 2)]
    big = rr_shapes[(8192, 4096, 14336)]
    fused_rr = big["fused"]["rounds_us"]
    assert quoted(r"its fused rounds at\s+8192×4096→14336 moving by (\d+)% from one to the next \((\d+) to (\d+) µs\)",
                  flat) == [round(100 * (max(fused_rr) - min(fused_rr)) / big["fused"]["median_us"]),
                            round(min(fused_rr)), round(max(fused_rr))]
    # "Where max-autotune ran at prefill size it was A% faster than plain torch.compile at 4096x4096->11008 (the best
    # other there), and B% slower at the post's shape."
    ratio = {s: us(s, "max-autotune") / us(s, "compile") for s in [post, tma_prefill]}
    assert best_other(shapes[tma_prefill]) == "max-autotune" and ratio[post] > 1
    assert quoted(r"it was (\d\.\d)% faster than plain\s+`torch.compile` at 4096×4096→11008 \(the best other there\), "
                  r"and (\d\.\d)% slower at the post's shape", flat) == [
        round(100 * (1 - ratio[tma_prefill]), 1), round(100 * (ratio[post] - 1), 1)]
    # Decode: "on the GPU alone the fastest variant at every decode shape; the closest is max-autotune at
    # 1x4096->11008 (A vs B)"; "from Python the fastest at all six (Lx to Hx the best other)".
    decode = [s for s, r in shapes.items() if "graph_median_us" in r["variants"]["fused"]]
    assert len(decode) == 6
    graph_leads = {s: lead(s, "graph_median_us") for s in decode}
    closest = min(graph_leads, key=graph_leads.get)
    assert min(graph_leads.values()) > 1
    rival = best_other(shapes[closest], "graph_median_us")
    m = one(r"the closest is (`torch.compile`|max-autotune|eager|Liger) at (\d+)×(\d+)→(\d+)\s+\((\d+\.\d) vs "
            r"(\d+\.\d) µs\)", flat)
    assert m.group(1).strip("`").replace("torch.", "") == rival.replace("liger", "Liger")
    assert tuple(map(int, m.groups()[1:4])) == closest
    assert [float(x) for x in m.groups()[4:]] == [round(us(closest, k, "graph_median_us"), 1) for k in ("fused", rival)]
    python_leads = [lead(s) for s in decode]
    assert min(python_leads) > 1
    assert quoted(r"fastest at all six \((\d\.\d\d)× to (\d\.\d\d)× the best other\)", flat) == [
        round(min(python_leads), 2), round(max(python_leads), 2)]
    sizes = [(1, 4096, 11008), (1, 2048, 16384), (1, 4096, 14336)]  # Llama-2-7B, Gemma-2B, Llama-3-8B
    assert quoted(r"reaches (0\.\d\d), (0\.\d\d) and (0\.\d\d) of the floor", flat) == [
        round(shapes[s]["floor_us"] / us(s, "fused"), 2) for s in sizes]
    # "cost the host A-B us for the fused MLP and C-D us for eager at the three one-token rows, and E-F against G-H
    # at 16 and 64 tokens, where each call also makes the TMA kernel's tensor descriptors"
    one_token = [s for s in decode if s[0] == 1]
    more = [s for s in decode if s[0] > 1]
    assert len(one_token) == 3 and {s[0] for s in more} == {16, 64}
    assert {shapes[s]["fused_path"] for s in more} == {"tma"}

    def span(rows, name):
        return [round(f(us(s, name, "host_us") for s in rows), 1) for f in (min, max)]

    assert quoted(r"cost the host (\d+\.\d)–(\d+\.\d) µs for the fused MLP and (\d+\.\d)–(\d+\.\d) µs for eager at the "
                  r"three one-token rows, and (\d+\.\d)–(\d+\.\d) against (\d+\.\d)–(\d+\.\d) µs at 16 and 64 tokens",
                  flat) == span(one_token, "fused") + span(one_token, "eager") + span(more, "fused") + span(more, "eager")
    assert all(us(s, "fused", "host_us") < us(s, "eager", "host_us") for s in one_token + more)


def test_kept_plans_prose():
    """docs/04's host times after the plans were kept (results/bench_decode_host_h200.json): the numbers, and that
    the sentences' claims hold in the record."""
    host = json.loads((ROOT / "results/bench_decode_host_h200.json").read_text())
    assert host["device"] == "NVIDIA H200" and len(host["shapes"]) == 3
    assert all(r["M"] <= 8 for r in host["shapes"])  # decode shapes
    variants = [r["variants"] for r in host["shapes"]]

    def span(name):
        values = [v[name]["host_us"] for v in variants]
        return [round(min(values), 1), round(max(values), 1)]

    assert quoted(r"the fused forward enqueues in (\d+\.\d)–(\d+\.\d) µs against eager's\s+(\d+\.\d)–(\d+\.\d) µs") == \
        span("fused") + span("eager")
    assert max(span("fused")) < min(span("eager"))
    # "the fastest variant timed from Python at all three (A× to B× eager)"
    assert all(min(v, key=lambda k: v[k]["median_us"]) == "fused" for v in variants)
    lead = [v["eager"]["median_us"] / v["fused"]["median_us"] for v in variants]
    assert quoted(r"at all three \((\d\.\d\d)× to (\d\.\d\d)× eager\)") == [round(min(lead), 2), round(max(lead), 2)]
    doc = (ROOT / "fused_geglu/launcher.py").read_text()  # its docstring quotes them rounded
    assert [float(g) for g in one(r"(\d+)-(\d+) µs against eager's (\d+)-(\d+) at\s+three decode shapes", doc).groups()] == \
        [round(x) for x in span("fused") + span("eager")]


# --- the middle token counts (docs/04) and the training benchmark (docs/07), from their H200 records ------------

def _ratio(shape):
    """fused's speed against the fastest other variant, from the record's medians (by hand, not bench.py's)."""
    v = shape["variants"]
    return min(o["median_us"] for k, o in v.items() if k != "fused") / v["fused"]["median_us"]


def _spread(v):  # by hand: (slowest round - fastest) / median
    return (max(v["rounds_us"]) - min(v["rounds_us"])) / v["median_us"]


def _best_other(v):
    return min((k for k in v if k != "fused"), key=lambda k: v[k]["median_us"])


def _key(shape):
    return shape["M"], shape["dim"], shape["hidden"]


def _behind_within_spread(flat, words, rows):
    """The rows where fused is behind: two, quoted after `words` as "P% (MxDIM→HIDDEN) and P% (MxDIM→HIDDEN)", each
    behind torch.compile by less than either side's spread between rounds. Returns them."""
    behind = [s for s in rows if _ratio(s) < 1]
    assert quoted(words + r"\s+([\d.]+)% \((\d+)×(\d+)→(\d+)\) and ([\d.]+)% \((\d+)×(\d+)→(\d+)\)", flat) == [
        x for s in behind for x in (round(100 * (1 - _ratio(s)), 1), *_key(s))]
    for s in behind:
        v = s["variants"]
        assert _best_other(v) == "compile" and 1 - _ratio(s) < min(_spread(v["fused"]), _spread(v["compile"]))
    return behind


def test_middle_sweep_table_and_prose():
    """The middle sweep's table is bench.markdown_table of the record; its counts, the rows behind (by how much, and
    within the spread of both sides) and the graph times quoted, from the record by hand."""
    import bench

    record = json.loads((ROOT / "results/bench_middle_h200.json").read_text())
    text = (ROOT / "docs/04_fused_mlp.md").read_text()
    assert bench.markdown_table(record, "results/bench_middle_h200.json") in text
    flat = " ".join(text.split())
    # "in every row "fused" runs cuBLAS for gate and up ... in 10 rows ... one GEMM over the packed weights ..., in 7
    # the packing rows chose two GEMMs", as the record says per shape
    assert {s["fused_path"] for s in record["shapes"]} == {"torch"}
    gemms = [s["fused_gate_up_gemms"] for s in record["shapes"]]
    assert quoted(r"in (\d+) rows gate and up are one GEMM over the packed weights", flat) == [gemms.count(1)]
    assert quoted(r"in (\d+) the packing rows chose two GEMMs", flat) == [gemms.count(2)]
    assert gemms.count(1) + gemms.count(2) == len(gemms)
    ratios = {_key(s): _ratio(s) for s in record["shapes"]}
    # "The other two are behind torch.compile by P% (row) and P% (row); paired round by round ..., it was faster in A
    # and B of the 5 rounds: the first is level, the second a loss"
    behind = [s for s in record["shapes"] if _ratio(s) < 1]
    assert all(_best_other(s["variants"]) == "compile" for s in behind) and "interleaved" in record["timer"]
    faster = [sum(f < c for f, c in zip(s["variants"]["fused"]["rounds_us"], s["variants"]["compile"]["rounds_us"]))
              for s in behind]
    assert quoted(r"The other two are behind `torch.compile` by ([\d.]+)% \((\d+)×(\d+)→(\d+)\) and ([\d.]+)% "
                  r"\((\d+)×(\d+)→(\d+)\)", flat) == [x for s in behind for x in (round(100 * (1 - _ratio(s)), 1), *_key(s))]
    assert quoted(r"it was faster\s+in (\d) and (\d) of the (\d) rounds: the first is level, the second a loss", flat) == [
        *faster, len(record["shapes"][0]["variants"]["fused"]["rounds_us"])]
    assert 1 - _ratio(behind[0]) < 0.01 and 0 < faster[0] < 5 and faster[1] == 0  # level; a loss in every round
    assert all(s["fused_gate_up_gemms"] == 2 for s in behind)  # "Both run two GEMMs for gate and up"

    # The same sweep earlier that day, every row packed: 15 of 17, and 768x4096->14336 behind in every round, by P%
    # (fused against compile µs); that row now two GEMMs, ahead in all 5 rounds.
    packed = json.loads((ROOT / "results/bench_middle_all_packed_h200.json").read_text())
    assert [_key(s) for s in packed["shapes"]] == [_key(s) for s in record["shapes"]]
    assert packed["date"][:10] == record["date"][:10] and packed["date"] < record["date"]
    assert "fused_gate_up_gemms" not in packed["shapes"][0]  # before the packing rows: every row packed
    assert quoted(r"had the fused MLP the fastest in (\d+) of the 17 rows too", flat) == [
        sum(_ratio(s) > 1 for s in packed["shapes"])]
    old_row = next(s for s in packed["shapes"] if _key(s) == (768, 4096, 14336))
    new_row = next(s for s in record["shapes"] if _key(s) == (768, 4096, 14336))
    ov, nv = old_row["variants"], new_row["variants"]
    assert all(f > c for f, c in zip(ov["fused"]["rounds_us"], ov["compile"]["rounds_us"]))
    assert quoted(r"behind by ([\d.]+)% at 768×4096→14336 in every round \(([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(100 * (1 - _ratio(old_row)), 1), round(ov["fused"]["median_us"], 1), round(ov["compile"]["median_us"], 1)]
    assert new_row["fused_gate_up_gemms"] == 2 and all(f < c for f, c in zip(nv["fused"]["rounds_us"], nv["compile"]["rounds_us"]))
    assert quoted(r"ahead in all 5 rounds \(([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(nv["fused"]["median_us"], 1), round(nv["compile"]["median_us"], 1)]
    assert quoted(r"The fused MLP is the fastest in (\d+) of these (\d+) rows", flat) == [
        len(ratios) - len(behind), len(ratios)]
    # "Where the record times the GPU alone (the rows of 128 tokens), the fused MLP takes the least time in each"
    graphed = [s for s in record["shapes"] if s["variants"]["fused"].get("graph_median_us") is not None]
    assert graphed and {s["M"] for s in graphed} == {128}
    for s in graphed:
        v = s["variants"]
        assert v["fused"]["graph_median_us"] < min(o["graph_median_us"] for k, o in v.items() if k != "fused")
    v = next(s["variants"] for s in graphed if _key(s) == (128, 2304, 9216))
    assert quoted(r"least time in each: ([\d.]+) against ([\d.]+) µs at 128×2304→9216", flat) == [
        round(v["fused"]["graph_median_us"], 1),
        round(min(o["graph_median_us"] for k, o in v.items() if k != "fused"), 1)]

    # The sweep before, kept beside it: same rows, the fastest in 11, one row behind beyond both spreads.
    before = json.loads((ROOT / "results/bench_middle_unpacked_h200.json").read_text())
    assert [_key(s) for s in before["shapes"]] == [_key(s) for s in record["shapes"]]
    assert before["date"][:10] == "2026-12-02" and record["date"][:10] == "2026-12-03"
    old = {_key(s): _ratio(s) for s in before["shapes"]}
    assert quoted(r"had the fused MLP the fastest in (\d+) of the same (\d+) rows", flat) == [
        sum(r > 1 for r in old.values()), len(old)]
    slower = [(_key(s), _best_other(s["variants"])) for s in before["shapes"]
              if old[_key(s)] < 1 - max(_spread(s["variants"]["fused"]), _spread(s["variants"][_best_other(s["variants"])]))]
    assert slower == [((128, 4096, 11008), "compile")]
    v = next(s["variants"] for s in before["shapes"] if _key(s) == (128, 4096, 11008))
    assert quoted(r"(\d\.\d\d)× of `torch.compile` at 128×4096→11008 \(([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(old[(128, 4096, 11008)], 2), round(v["fused"]["median_us"], 1), round(v["compile"]["median_us"], 1)]
    graphs = [o["graph_median_us"] for k, o in v.items() if k != "fused"]
    assert quoted(r"its GPU time alone was the lower \(([\d.]+) against ([\d.]+) µs", flat) == [
        round(v["fused"]["graph_median_us"], 1), round(min(graphs), 1)]
    v = next(s["variants"] for s in record["shapes"] if _key(s) == (128, 4096, 11008))
    assert quoted(r"That row is now (\d\.\d\d)× \(([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(ratios[(128, 4096, 11008)], 2), round(v["fused"]["median_us"], 1),
        round(v[_best_other(v)]["median_us"], 1)]

    # The rerun of four of the rows behind then, alone: fused the fastest in each, by the ratio quoted.
    again = json.loads((ROOT / "results/bench_mid_h200.json").read_text())
    shapes = {_key(s): s for s in again["shapes"]}
    old_behind = {k for k, r in old.items() if r < 1}
    assert set(shapes) <= old_behind and len(shapes) == 4
    assert set(sorted(old_behind, key=old.get)[:2]) <= set(shapes)  # the two furthest behind among them
    assert (again["device"], again["torch"], again["triton"]) == (before["device"], before["torch"], before["triton"])
    assert "the fastest in all four, 1.01× the best other each time" in flat
    assert all(round(_ratio(s), 2) == 1.01 for s in shapes.values())
    assert "--shapes " + ",".join(f"{m}x{d}x{h}" for m, d, h in shapes) in flat
    v = shapes[(128, 4096, 11008)]["variants"]
    assert min(v, key=lambda k: v[k]["median_us"]) == "fused"
    assert quoted(r"at 128×4096→11008, ([\d.]+) against ([\d.]+) µs of `torch.compile`", flat) == [
        round(v["fused"]["median_us"], 1), round(v["compile"]["median_us"], 1)]


def test_middle_sweep_with_one_copy_of_the_weights():
    """The middle sweep timed with every variant reading one copy of the weights: its table is bench.markdown_table of
    the record; the counts, the level row and the rows behind in the older runs (each of which was made with a copy per
    variant and had 384x4096->14336 behind), from the records by hand."""
    import bench

    text = (ROOT / "docs/04_fused_mlp.md").read_text()
    flat = " ".join(text.split())
    record = json.loads((ROOT / "results/bench_middle_shared_h200.json").read_text())
    assert bench.markdown_table(record, "results/bench_middle_shared_h200.json") in text
    assert record["weights"] == bench.WEIGHTS and "`share_weights` in bench.py" in flat
    assert [_key(s) for s in record["shapes"]] == [tuple(int(n) for n in s.split("x")) for s in bench.SWEEPS["middle"].split(",")]
    old = {n: json.loads((ROOT / f"results/bench_{n}_h200.json").read_text())
           for n in ("middle", "middle_rerun", "middle_all_packed", "middle_unpacked", "prefill_rows")}
    assert all("weights" not in r for r in old.values())  # a copy per variant
    # and the default sweep's record, of which the page says so
    assert "weights" not in json.loads((ROOT / "results/bench_h200.json").read_text())
    assert "(the record below was made before that, with a copy per variant)" in flat
    # "the runs below, made that way, had the fused MLP behind at 384x4096->14336 each time"
    assert all(_ratio(next(s for s in r["shapes"] if _key(s) == (384, 4096, 14336))) < 1 for r in old.values())
    # the same gate and up GEMM counts as the sweep before it (the paragraph above the tables says 10 and 7)
    assert [s["fused_gate_up_gemms"] for s in record["shapes"]] == [s["fused_gate_up_gemms"] for s in old["middle"]["shapes"]]
    ahead = [s for s in record["shapes"] if _ratio(s) > 1]
    assert quoted(r"the fastest in (\d+) of the (\d+) rows, and faster than the best other in all 5 rounds at each of "
                  r"them", flat) == [len(ahead), len(record["shapes"])]
    for s in ahead:
        assert _faster_rounds(s["variants"], _best_other(s["variants"])) == 5, _key(s)
    [level] = [s for s in record["shapes"] if _ratio(s) <= 1]
    v = level["variants"]
    assert _best_other(v) == "compile" and 1 - _ratio(level) < min(_spread(v["fused"]), _spread(v["compile"]))
    assert quoted(r"The seventeenth, (\d+)×(\d+)→(\d+), is level with `torch.compile`: ([\d.]+) against ([\d.]+) µs, "
                  r"faster in (\d) of the 5 rounds", flat) == [
        *_key(level), round(v["fused"]["median_us"], 1), round(v["compile"]["median_us"], 1), _faster_rounds(v, "compile")]
    behind_before = [_key(s) for s in old["middle"]["shapes"] if _ratio(s) < 1]
    rows = {_key(s): s["variants"] for s in record["shapes"]}
    numbers = []
    for k in behind_before:
        assert _faster_rounds(rows[k], "compile") == 5 and _best_other(rows[k]) == "compile"
        numbers += [round(rows[k]["fused"]["median_us"], 1), round(rows[k]["compile"]["median_us"], 1), *k]
    assert quoted(r"are ahead in every round: ([\d.]+) against ([\d.]+) µs at (\d+)×(\d+)→(\d+), ([\d.]+) against "
                  r"([\d.]+) at (\d+)×(\d+)→(\d+)", flat) == numbers
    graphed = [s["variants"] for s in record["shapes"] if s["variants"]["fused"].get("graph_median_us") is not None]
    assert {s["M"] for s in record["shapes"] if s["variants"]["fused"].get("graph_median_us") is not None} == {128}
    assert all(v["fused"]["graph_median_us"] < min(o["graph_median_us"] for k, o in v.items() if k != "fused")
               for v in graphed)


def test_middle_sweep_rerun_prose():
    """The paragraph on the middle sweep run again: same rows, code, table and versions an hour later; its count, the
    two rows behind (by how much, microseconds, rounds faster) and the slow host of its first rows, by hand."""
    first, again = (json.loads((ROOT / f"results/bench_middle{n}_h200.json").read_text()) for n in ("", "_rerun"))
    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    assert [_key(s) for s in again["shapes"]] == [_key(s) for s in first["shapes"]]
    assert [s["fused_gate_up_gemms"] for s in again["shapes"]] == [s["fused_gate_up_gemms"] for s in first["shapes"]]
    assert (again["device"], again["torch"], again["triton"], again["liger_kernel"]) == (
        first["device"], first["torch"], first["triton"], first["liger_kernel"])
    hours = (datetime.fromisoformat(again["date"]) - datetime.fromisoformat(first["date"])).total_seconds() / 3600
    assert 0.5 < hours < 1.5 and "ran again an hour later" in flat
    assert "again the fastest in 15 of 17 rows" in flat and sum(_ratio(s) > 1 for s in again["shapes"]) == 15
    behind = [s for s in again["shapes"] if _ratio(s) < 1]
    assert [_key(s) for s in behind] == [_key(s) for s in first["shapes"] if _ratio(s) < 1]  # "at the same two"
    assert all(_best_other(s["variants"]) == "compile" for s in behind)
    faster = [sum(f < c for f, c in zip(s["variants"]["fused"]["rounds_us"], s["variants"]["compile"]["rounds_us"]))
              for s in behind]
    numbers = [round(100 * (1 - _ratio(s)), 1) for s in behind]
    for s in behind:
        numbers += [round(s["variants"][k]["median_us"], 1) for k in ("fused", "compile")]
    assert quoted(r"behind at the same two, by ([\d.]+)% and ([\d.]+)% \(([\d.]+) against ([\d.]+) µs, ([\d.]+) against "
                  r"([\d.]+)\), faster in (\d) and (\d) of the 5 rounds", flat) == numbers + faster
    assert faster[1] == 0 and _key(behind[1]) == (384, 4096, 14336)  # "The loss at 384x4096->14336 ... is real"
    # "enqueuing one compiled call took A µs at 128x2304->9216, against B in the first run, while the GPU's time alone,
    # as graphs, was C µs in both"
    r0, r1 = (next(s["variants"]["compile"] for s in rec["shapes"] if _key(s) == (128, 2304, 9216)) for rec in (again, first))
    assert quoted(r"enqueuing one compiled call took ([\d.]+) µs at 128×2304→9216, against ([\d.]+) in the first run, "
                  r"while the GPU's time alone, as graphs, was ([\d.]+) µs in both", flat) == [
        round(r0["host_us"], 1), round(r1["host_us"], 1), round(r0["graph_median_us"], 1)]
    assert round(r0["graph_median_us"], 1) == round(r1["graph_median_us"], 1) and r0["host_us"] > 2 * r1["host_us"]


def _faster_rounds(v, other):
    return sum(f < o for f, o in zip(v["fused"]["rounds_us"], v[other]["rounds_us"]))


def _module_rows(record):
    tuned = record["fused_config"]["tuned"]
    return {k: [{f: x for f, x in r.items() if f != "fused"} for r in v] if k == "geglu" else v for k, v in tuned.items()}


def test_rows_timed_a_day_later_prose():
    """The two runs of 2026-12-04: the command each paragraph quotes is the record's shapes; the ratios, microseconds
    and rounds quoted, from the records by hand (best other variant's median / fused's)."""
    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    first = json.loads((ROOT / "results/bench_middle_h200.json").read_text())
    rows, unlisted = (json.loads((ROOT / f"results/bench_{n}_h200.json").read_text()) for n in ("prefill_rows", "unlisted"))
    for rec in rows, unlisted:
        # "same table": the rows the module runs by (the "fused" entries, added since, are for 04_fused_mlp.py alone)
        assert rec["date"][:10] == "2026-12-04" and _module_rows(rec) == _module_rows(first)
        assert (rec["device"], rec["torch"], rec["triton"]) == (first["device"], first["torch"], first["triton"])
        assert "--shapes " + ",".join("{}x{}x{}".format(*_key(s)) for s in rec["shapes"]) + " --max-autotune none" in flat
    assert rows["liger_kernel"] is None and unlisted["liger_kernel"] == first["liger_kernel"]
    # "0.98x of torch.compile at 384x4096->14336 (F against C µs, faster in N of the 5 rounds), 1.05x at
    # 512x2048->16384 (F against C µs)"
    at = {_key(s): s["variants"] for s in rows["shapes"]}
    v, w = at[384, 4096, 14336], at[512, 2048, 16384]
    assert _best_other(v) == _best_other(w) == "compile"
    assert quoted(r"(\d\.\d\d)× of `torch.compile` at 384×4096→14336 \(([\d.]+) against ([\d.]+) µs, faster in (\d) of "
                  r"the 5 rounds\), (\d\.\d\d)× at 512×2048→16384 \(([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(v["compile"]["median_us"] / v["fused"]["median_us"], 2), round(v["fused"]["median_us"], 1),
        round(v["compile"]["median_us"], 1), _faster_rounds(v, "compile"),
        round(w["compile"]["median_us"] / w["fused"]["median_us"], 2), round(w["fused"]["median_us"], 1),
        round(w["compile"]["median_us"], 1)]
    # The unlisted widths: none of them in any sweep; "the fastest in A of the B rows, from R1x (the closest, every
    # variant at F of the floor or below) to R2x (the furthest ahead). The ninth is level with torch.compile: ..."
    import bench

    swept = {tuple(int(n) for n in s.split("x")) for sweep in bench.SWEEPS.values() for s in sweep.split(",")}
    shapes = unlisted["shapes"]
    assert not {_key(s) for s in shapes} & swept
    ahead = [s for s in shapes if _ratio(s) > 1]
    assert quoted(r"The fused MLP is the fastest in (\d) of the (\d)\s+rows", flat) == [len(ahead), len(shapes)]
    low, high = min(ahead, key=_ratio), max(ahead, key=_ratio)
    floor = low["floor_us"] / min(o["median_us"] for o in low["variants"].values())  # the fastest's fraction
    assert quoted(r"from (\d\.\d\d)× \((\d+)×(\d+)→(\d+), memory-bound: every variant at ([\d.]+) of the floor or below\) "
                  r"to (\d\.\d\d)× \((\d+)×(\d+)→(\d+)\)", flat) == [
        round(_ratio(low), 2), *_key(low), round(floor, 2), round(_ratio(high), 2), *_key(high)]
    assert low["bound"] == "memory"
    [level] = [s for s in shapes if _ratio(s) <= 1]
    lv = level["variants"]
    assert _best_other(lv) == "compile" and 1 - _ratio(level) < min(_spread(lv["fused"]), _spread(lv["compile"]))
    assert quoted(r"The ninth is level with `torch.compile`: (\d+)×(\d+)→(\d+), ([\d.]+) against ([\d.]+) µs, faster in "
                  r"(\d) of the 5 rounds", flat) == [*_key(level), round(lv["fused"]["median_us"], 1),
                                                     round(lv["compile"]["median_us"], 1), _faster_rounds(lv, "compile")]


def test_second_unlisted_run_prose():
    """The seven shapes of 2026-12-04 with one copy of the weights: the command is the record's shapes, none in a
    sweep; the rows ahead, their range and rounds, and the one behind with its GPU parts, from the record by hand."""
    import bench

    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    rec = json.loads((ROOT / "results/bench_unlisted2_h200.json").read_text())
    first = json.loads((ROOT / "results/bench_middle_h200.json").read_text())
    assert rec["weights"].startswith("one copy") and rec["liger_kernel"] is None and _module_rows(rec) == _module_rows(first)
    shapes = rec["shapes"]
    assert "--shapes " + ",".join("{}x{}x{}".format(*_key(s)) for s in shapes) + " --max-autotune none" in flat
    swept = {tuple(int(n) for n in s.split("x")) for sweep in bench.SWEEPS.values() for s in sweep.split(",")}
    assert not {_key(s) for s in shapes} & swept
    ms = [s["M"] for s in shapes]
    assert f"from {min(ms)} to {max(ms):,} tokens" in flat
    ahead = [s for s in shapes if _ratio(s) > 1]
    assert all(_faster_rounds(s["variants"], _best_other(s["variants"])) == 5 for s in ahead)
    low, high = min(ahead, key=_ratio), max(ahead, key=_ratio)
    assert quoted(r"Here the fused MLP is the fastest in (\d) of the (\d) rows, from (\d\.\d\d)× \((\d+)×(\d+)→(\d+)\) to "
                  r"(\d\.\d\d)× \((\d+)×(\d+)→(\d+)\), ahead in all 5 rounds", flat) == [
        len(ahead), len(shapes), round(_ratio(low), 2), *_key(low), round(_ratio(high), 2), *_key(high)]
    [behind] = [s for s in shapes if _ratio(s) <= 1]
    v, parts = behind["variants"], behind["parts"]
    of_floor = sorted(behind["floor_us"] / o["median_us"] for o in v.values())
    assert behind["bound"] == "memory" and _best_other(v) == "compile" and _faster_rounds(v, "compile") == 0
    assert quoted(r"(\d+)×(\d+)→(\d+) \(1.45 GB of weights, memory-bound: every variant at ([\d.]+) to ([\d.]+) of the "
                  r"floor\): ([\d.]+) against ([\d.]+) µs of `torch.compile`, slower in all 5 rounds", flat) == [
        *_key(behind), round(of_floor[0], 2), round(of_floor[-1], 2), round(v["fused"]["median_us"], 1),
        round(v["compile"]["median_us"], 1)]
    assert round(3 * behind["dim"] * behind["hidden"] * 2 / 1e9, 2) == 1.45  # the three weights in bf16
    assert quoted(r"its two kernels took ([\d.]+) and ([\d.]+) µs where cuBLAS's GEMMs took ([\d.]+) and ([\d.]+)",
                  flat) == [round(parts[k], 1) for k in ("fused geglu kernel", "fused down_proj kernel",
                                                         "cuBLAS gate+up GEMM", "cuBLAS down_proj GEMM")]
    # the hint in the table the run used (its down rows; their times are the table's gate/up tuning's, kept since)
    table = json.loads((ROOT / "fused_geglu_tuned.json").read_text())
    row = rec["fused_config"]["tuned"]["down"][0]
    assert row["max_m"] == 1 and row["kernel"] == "small" and "max_k" not in row
    chosen = "down small " + json.dumps(row["config"])
    ratios = {(r["dim"], r["hidden"]): r["us"][chosen] / r["us"]["down torch null"] for r in table["measured"] if r["M"] == 1}
    widest = max(ratios, key=lambda w: w[1])
    assert widest[1] == max(int(w.split("x")[1]) for w in table["widths"]) == 14336
    assert quoted(r"at one token of its\s+widest width, (\d+) → (\d+), the kernel it chose took ([\d.]+)× cuBLAS's time",
                  flat) == [*widest, round(ratios[widest], 2)]
    assert "faster at the three narrower widths" in flat and sorted(r < 1 for w, r in ratios.items() if w != widest) == [True] * 3


def test_down_rows_tuned_again_prose():
    """The down_proj rows tuned per class of hidden (the committed table's down_measured) and the decode run made
    with them: the numbers of the paragraph, from the table and the record by hand."""
    import tune_fused

    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    table = json.loads((ROOT / "fused_geglu_tuned.json").read_text())
    widths = [tuple(map(int, w.split("x"))) for w in table["down_widths"]]
    assert len(widths) == 8 and max(widths, key=lambda w: w[1]) == (8192, 28672) and "at eight widths up to 8192 ← 28672" in flat
    # at one token: the chosen row of each class against cuBLAS, from the measured times
    one = [r for r in table["down"] if r["max_m"] == 1]
    assert len(one) == 8 and all(r["kernel"] == "small" for r in one)
    at1 = {(r["dim"], r["hidden"]): r["us"] for r in table["down_measured"] if r["M"] == 1}
    by_class = []
    for (top, members), r in zip(tune_fused.k_classes(widths, at=1), one):
        [w] = [widths[j] for j in members]
        by_class.append(at1[w]["down small " + json.dumps(r["config"])] / at1[w]["down torch null"])
        assert r["vs_torch"] == pytest.approx(by_class[-1], abs=0.002)  # its score: the times before rounding
    score = [r["vs_torch"] for r in one]
    assert quoted(r"At one token the\s+small kernel measured ([\d.]+)× to ([\d.]+)× cuBLAS's time in every class, ([\d.]+)× in "
                  r"the widest", flat) == [round(min(score), 2), round(max(score), 2), round(score[-1], 2)]
    assert all(r["kernel"] == "small" for r in table["down"] if r["max_m"] == 8)
    middle = [r for r in table["down"] if r["max_m"] in (32, 64)]
    small = [r for r in middle if r["kernel"] == "small"]
    assert quoted(r"from 9 to 64 tokens it now runs in (\d+) of the (\d+) class rows \(([\d.]+)× to ([\d.]+)×\)", flat) == [
        len(small), len(middle), round(min(r["vs_torch"] for r in small), 2), round(max(r["vs_torch"] for r in small), 2)]
    old = json.loads((ROOT / "results/bench_unlisted2_h200.json").read_text())["fused_config"]["tuned"]["down"]
    assert [r["kernel"] for r in old if r["max_m"] in (32, 64)] == ["torch", "torch"]  # "where the old rows ran cuBLAS"
    # the decode run with that table
    rec = json.loads((ROOT / "results/bench_down_h200.json").read_text())
    assert rec["fused_config"]["tuned"]["down"] == table["down"] and rec["weights"].startswith("one copy")
    assert rec["liger_kernel"] is None and rec["date"] > table["down_date"]
    shapes = rec["shapes"]
    assert "--shapes " + ",".join("{}x{}x{}".format(*_key(s)) for s in shapes) + " --max-autotune none" in flat
    ms = sorted({s["M"] for s in shapes})
    assert quoted(r"twelve token counts of (\d+) to (\d+) at nine widths", flat) == [ms[0], ms[-1]]
    assert len(shapes) == 12 and len({(s["dim"], s["hidden"]) for s in shapes}) == 9
    ahead = [s for s in shapes if _ratio(s) > 1]
    assert all(_faster_rounds(s["variants"], _best_other(s["variants"])) == 5 for s in shapes)
    low, high = min(shapes, key=_ratio), max(shapes, key=_ratio)
    assert quoted(r"is the fastest in all (\d+), from (\d\.\d\d)× \((\d+)×(\d+)→(\d+)\) to (\d\.\d\d)× \((\d+)×(\d+)→(\d+)\), "
                  r"ahead in all 5 rounds at each", flat) == [
        len(ahead), round(_ratio(low), 2), *_key(low), round(_ratio(high), 2), *_key(high)]
    assert len(ahead) == len(shapes)
    [q] = [s for s in shapes if _key(s) == (1, 8192, 29568)]
    v, parts = q["variants"], q["parts"]
    assert _best_other(v) == "compile"
    assert quoted(r"1×8192→29568 ([\d.]+)× \(([\d.]+) against ([\d.]+) µs\), its down_proj kernel ([\d.]+) against "
                  r"cuBLAS's ([\d.]+) µs as graphs", flat) == [
        round(_ratio(q), 2), round(v["fused"]["median_us"], 1), round(v["compile"]["median_us"], 1),
        round(parts["fused down_proj kernel"], 1), round(parts["cuBLAS down_proj GEMM"], 1)]


def _h200_table(monkeypatch):
    """fused_geglu with the committed table read as it is on the H200 (compute capability 9), on this machine."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    return fused_geglu


def test_packing_rows_prose(monkeypatch):
    """The bullet on one GEMM or two: the ratios at 448 tokens, the margin and the number of widths, from the committed
    table's packing_measured and tune_fused.py; and the default sweep's one row whose path the packing rows changed."""
    import tune_fused

    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    table = json.loads((ROOT / "fused_geglu_tuned.json").read_text())
    at = {(r["M"], r["dim"], r["hidden"]): r["packed_us"] / r["unpacked_us"] for r in table["packing_measured"]}
    assert quoted(r"at 448 tokens the packed form of the whole MLP took ([\d.]+)× the time of the two GEMMs at 3584 → "
                  r"18944 and ([\d.]+)× at 4096 → 14336", flat) == [round(at[448, 3584, 18944], 2), round(at[448, 4096, 14336], 2)]
    assert min(at.values()) == at[448, 3584, 18944] and max(at.values()) == at[448, 4096, 14336]  # the extremes
    assert quoted(r"not slower \(by more than ([\d.]+)%\)", flat) == [100 * tune_fused.PACKING_MARGIN]
    assert "and seven model widths" in flat and len(tune_fused.PACKING_WIDTHS) == 7
    assert {(d, h) for _, d, h in at} == set(tune_fused.PACKING_WIDTHS)
    # "The default sweep was timed again after the packing rows. At 1000x4096->11008, where the table now runs two
    # GEMMs instead of one over the packed weights, the fused MLP is Rx torch.compile (F against C us)."
    fused_geglu = _h200_table(monkeypatch)
    default = json.loads((ROOT / "results/bench_h200.json").read_text())
    assert default["date"] > table["date"]
    gpu = tune_fused.torch.device("cuda", 0)
    # the record says per row what ran, and it is what the committed table runs now
    assert [fused_geglu.table.by_m(gpu, s["M"], "geglu", s["dim"])[0] for s in default["shapes"]] == [
        s["fused_path"] for s in default["shapes"]]
    assert [s["fused_gate_up_gemms"] for s in default["shapes"]] == [
        (1 if fused_geglu.packs_gate_up(gpu, s["M"], s["dim"]) else 2) if s["fused_path"] == "torch" else None
        for s in default["shapes"]]
    apart = [s for s in default["shapes"] if s["fused_gate_up_gemms"] == 2]
    assert [_key(s) for s in apart] == [(1000, 4096, 11008)]
    v = apart[0]["variants"]
    assert _best_other(v) == "compile"
    assert quoted(r"the fused MLP is (\d\.\d\d)× `torch.compile` \((\d+\.\d) against (\d+\.\d) µs\)", flat) == [
        round(v["compile"]["median_us"] / v["fused"]["median_us"], 2), round(v["fused"]["median_us"], 1),
        round(v["compile"]["median_us"], 1)]


def test_middle_rows_timed_again_after_packing():
    """The paragraph on the nine rows timed after the packed weights: its counts, ratios and microseconds, from the two
    records by hand (fastest other variant / fused; spread = (slowest round - fastest) / median)."""
    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    before = json.loads((ROOT / "results/bench_middle_unpacked_h200.json").read_text())
    mid, llama = (json.loads((ROOT / f"results/bench_{n}_packed_h200.json").read_text()) for n in ("mid", "llama7b"))
    assert (mid["device"], mid["torch"], mid["triton"]) == (llama["device"], llama["torch"], llama["triton"])
    assert datetime.fromisoformat(mid["date"]) < datetime.fromisoformat(llama["date"])  # "one after the other"
    assert mid["date"][:10] == llama["date"][:10] == "2026-12-03"
    old_mid = json.loads((ROOT / "results/bench_mid_h200.json").read_text())
    assert [_key(s) for s in mid["shapes"]] == [_key(s) for s in old_mid["shapes"]]  # "the same four rows"
    assert [_key(s) for s in llama["shapes"]] == [(m, 4096, 11008) for m in (128, 256, 384, 512, 768)]
    assert "--shapes " + ",".join("{}x{}x{}".format(*_key(s)) for s in llama["shapes"]) in flat
    rows = mid["shapes"] + llama["shapes"]
    assert {s["fused_path"] for s in rows} == {"torch"}
    assert "Of the nine rows the fused MLP is the fastest in seven." in flat
    assert (len(rows), sum(_ratio(s) > 1 for s in rows)) == (9, 7)
    # The row the sweep before had behind
    assert _ratio(next(s for s in before["shapes"] if _key(s) == (128, 4096, 11008))) < 1
    at_128 = [s["variants"] for s in rows if _key(s) == (128, 4096, 11008)]
    assert all(_best_other(v) == "compile" for v in at_128)
    assert quoted(r"At 128×4096→11008 it is (\d\.\d\d)× and (\d\.\d\d)× of\s+`torch.compile`", flat) == [
        round(v["compile"]["median_us"] / v["fused"]["median_us"], 2) for v in at_128]
    assert quoted(r"\(([\d.]+) against ([\d.]+) µs, then ([\d.]+) against ([\d.]+) µs\)", flat) == [
        round(v[k]["median_us"], 1) for v in at_128 for k in ("fused", "compile")]
    _behind_within_spread(flat, r"The two rows left trail `torch.compile` by", rows)
    assert "within either side's spread between rounds" in flat


def test_training_benchmark_table_and_prose():
    import bench_train

    record = json.loads((ROOT / "results/bench_train_h200.json").read_text())
    text = " ".join((ROOT / "docs/07_train_step.md").read_text().split())
    assert bench_train.markdown(record) in (ROOT / "docs/07_train_step.md").read_text()
    by = {s["label"]: s["variants"] for s in record["shapes"]}
    us = {label: {k: v["median_us"] for k, v in variants.items()} for label, variants in by.items()}
    post, gemma, w1, w2 = ("MLP fwd+bwd 8192x768x3072", "gemma-2b 2L train step 4x512",
                           "MLP fwd+bwd 4096x2048x16384", "MLP fwd+bwd 4096x4096x11008")
    peers = ("eager", "compile", "liger")  # fused's peers: not its own other modes
    best = {label: min(peers, key=us[label].get) for label in us}
    assert best == {post: "eager", w1: "compile", w2: "compile", gemma: "compile"}
    # "fused is the fastest of the six, 1.03x and 1.00x of torch.compile (A against B us and C against D us)"
    for label in (w1, w2):
        assert min(us[label], key=us[label].get) == "fused"
    assert quoted(r"fastest of the six, (\d\.\d\d)× and (\d\.\d\d)× of `torch.compile`", text) == [
        round(us[label]["compile"] / us[label]["fused"], 2) for label in (w1, w2)]
    assert quoted(r"\(([\d,.]+) against ([\d,.]+) µs and ([\d,.]+) against ([\d,.]+) µs\)", text) == [
        round(us[label][k], 1) for label in (w1, w2) for k in ("fused", "compile")]
    # "fused-recompute ... 0.88x and 0.84x of eager"
    assert quoted(r"what recomputing cost: (\d\.\d\d)× and (\d\.\d\d)× of eager", text) == [
        round(us[label]["eager"] / us[label]["fused-recompute"], 2) for label in (w1, w2)]
    # the Gemma step: the compiled model, the eager ones' range, compile-fused against it
    eager_models = [us[gemma][k] for k in ("eager", "liger", "fused", "fused-recompute")]
    assert max(us[gemma]["compile"], us[gemma]["compile-fused"]) < min(eager_models)
    assert quoted(r"fuses everything around the MLPs \(([\d,.]+) µs; the eager models take ([\d,.]+) to ([\d,.]+) µs\)",
                  text) == [round(us[gemma]["compile"], 1), round(min(eager_models), 1), round(max(eager_models), 1)]
    assert quoted(r"`compile-fused` ([\d,.]+) µs, (\d\.\d\d)×", text) == [
        round(us[gemma]["compile-fused"], 1), round(us[gemma]["compile"] / us[gemma]["compile-fused"], 2)]
    assert bench_train.fused_vs_peers(next(s for s in record["shapes"] if s["label"] == gemma))[3] == "compile-fused"
    spread = {(label, k): 100 * (max(v["rounds_us"]) - min(v["rounds_us"])) / v["median_us"]
              for label, vs in by.items() for k, v in vs.items()}
    # the post's shape: "spreads by 27 to 42% ... eager ... (1.3%). fused is 0.93x of eager there, inside its own
    # spread (26.8%)", and so not flagged slower
    python_autograd = ("compile", "liger", "fused", "fused-recompute", "compile-fused")
    post_spreads = [spread[(post, k)] for k in python_autograd]
    assert quoted(r"spreads by (\d+) to (\d+)% over the rounds", text) == [round(min(post_spreads)),
                                                                          round(max(post_spreads))]
    assert spread[(post, "eager")] < min(post_spreads)
    assert quoted(r"keeps up with the GPU \(([\d.]+)%\)", text) == [round(spread[(post, "eager")], 1)]
    ratio = us[post]["eager"] / us[post]["fused"]
    assert quoted(r"`fused` is (\d\.\d\d)× of eager there, inside its own spread \(([\d.]+)%\)", text) == [
        round(ratio, 2), round(spread[(post, "fused")], 1)]
    assert ratio >= 1 - spread[(post, "fused")] / 100
    assert bench_train.fused_vs_peers(next(s for s in record["shapes"] if s["label"] == post))[2] is False
    peak = {label: {k: v["peak_mib"] for k, v in by[label].items()} for label in (post, w1, w2)}
    # "(208 MiB at the post's shape, the same as theirs); fused-recompute is the lowest there (184 MiB), and at the
    # model sizes both modes peak at the same 608 and 580 MiB, above compile's 592 and 462 MiB"
    assert round(peak[post]["fused"]) == round(peak[post]["compile"]) == round(peak[post]["liger"])
    assert quoted(r"\((\d+) MiB at the post's shape, the same as theirs\)", text) == [round(peak[post]["fused"])]
    assert min(peak[post], key=peak[post].get) == "fused-recompute"
    assert quoted(r"`fused-recompute` is the lowest there \((\d+) MiB\)", text) == [round(peak[post]["fused-recompute"])]
    for label in (w1, w2):
        assert peak[label]["fused"] == peak[label]["fused-recompute"] > peak[label]["compile"]
    assert quoted(r"both modes peak at the same (\d+) and (\d+) MiB, above compile's (\d+) and (\d+) MiB", text) == [
        round(peak[w1]["fused"]), round(peak[w2]["fused"]), round(peak[w1]["compile"]), round(peak[w2]["compile"])]
    assert quoted(r"holds more than compile at the first model size \((\d+) against (\d+) MiB\)", text) == [
        round(peak[w1]["compile-fused"]), round(peak[w1]["compile"])]


def test_fused_row_where_cublas_won_prose():
    """The table names the best fused tile where cuBLAS won: the page's tile and its µs at 384 tokens of 4096 ->
    14336, and the default tile's (fused_geglu.HOPPER_CONFIG), read back from the table's own measurements."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")
    table = json.loads((ROOT / "fused_geglu_tuned.json").read_text())
    flat = " ".join((ROOT / "docs/04_fused_mlp.md").read_text().split())
    m = re.search(r"at (\d+) tokens of (\d+) → (\d+) the (\d+) × (\d+) tile with two dots took ([\d.]+) µs for gate, "
                  r"up and GeGLU, the default tile \(one dot, the loop flattened\) ([\d.]+) µs", flat)
    assert m, "the 04 page no longer quotes the fused row where cuBLAS won"
    M, dim, hidden, bm, bn = map(int, m.groups()[:5])
    row = next(r for r in table["geglu"] if r["max_m"] is not None and M <= r["max_m"]
               and (r["max_k"] is None or dim <= r["max_k"]))
    assert row["kernel"] == "torch" and row["fused"]["kernel"] == "tma"
    cfg = row["fused"]["config"]
    assert (cfg["BM"], cfg["BN"], cfg["ONE_DOT"]) == (bm, bn, False)
    us = next(e["us"] for e in table["measured"] if (e["M"], e["dim"], e["hidden"]) == (M, dim, hidden))
    by_config = {k.split(" ", 2)[2]: v for k, v in us.items() if k.startswith("geglu tma ")}
    default = {**fused_geglu.HOPPER_CONFIG}
    assert default["ONE_DOT"] and default["FLATTEN"]
    default_us = next(v for k, v in by_config.items() if json.loads(k) == default)
    assert [float(x) for x in m.groups()[5:]] == [round(by_config[json.dumps(cfg)], 1), round(default_us, 1)]
