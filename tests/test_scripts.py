"""Real runs of the post's scripts on the CPU, at tiny shapes, checked against the exported trace.

The trace is read here with plain json, independently of inspect_trace.py, so the scripts' own
report cannot vouch for itself.
"""

import gzip
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fused_cpp, interpreter_cannot_loop, run_script_main
from test_readme import ENVS, page_runs

ROOT = Path(__file__).resolve().parent.parent
LINEAR = ["--batch", "16", "--in_dim", "8", "--out_dim", "12"]
MLP = ["--batch", "2", "--seq", "8", "--dim", "32", "--hidden", "64"]
NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs Triton (Linux wheels only; tests/test_platforms.py runs without it)")


def run(script, *args, env=None, **kw):
    if "--device" not in args:
        args = (*args, "--device", "cpu")  # the CPU lane, also on a machine with a GPU
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, **kw)


def run_here(script, *args, out, device="cpu"):
    """What `run(script, *args, "--out", out)` gives, the script's main() run in this process instead (conftest's
    run_script_main): for what a run writes, prints and exits with, where its process's start is not the point."""
    code, stdout, stderr = run_script_main(script, importlib.import_module(script[:-3]).main, out, *args,
                                           device=device)
    return subprocess.CompletedProcess([script, *args], code, stdout, stderr)


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def steps(trace):
    """{ProfilerStep#k: [names of the X events inside it]}, by time containment."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    spans = [e for e in events if e["name"].startswith("ProfilerStep#")]
    return {s["name"]: [e["name"] for e in events if s["ts"] <= e["ts"] <= s["ts"] + s["dur"] and e is not s]
            for s in spans}


def step_names(path, active=3):
    """[names per step] for ProfilerStep#2..#(active+1), asserting exactly those steps are there (no empty loop)."""
    per_step = steps(load(path))
    assert sorted(per_step) == sorted(f"ProfilerStep#{k}" for k in range(2, 2 + active)), sorted(per_step)
    return list(per_step.values())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    done = {}
    for key, script, args in [
        ("linear_eager", "02_linear.py", LINEAR),
        ("linear_compile", "02_linear.py", LINEAR + ["--compile"]),
        ("mlp_eager", "03_simple_mlp.py", MLP),
        ("mlp_compile", "03_simple_mlp.py", MLP + ["--compile"]),
    ]:
        proc = run_here(script, *args, out=out)
        assert proc.returncode == 0, proc.stderr
        done[key] = proc
    return out, done


def test_files_are_named_after_the_run(runs):
    out, _ = runs
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == [
        "02_linear/16x8x12_bf16_cold_compile.json", "02_linear/16x8x12_bf16_cold_compile.txt",
        "02_linear/16x8x12_bf16_cold_eager.json", "02_linear/16x8x12_bf16_cold_eager.txt",
        "03_simple_mlp/2x8x32x64_bf16_cold_compile.json", "03_simple_mlp/2x8x32x64_bf16_cold_compile.txt",
        "03_simple_mlp/2x8x32x64_bf16_cold_eager.json", "03_simple_mlp/2x8x32x64_bf16_cold_eager.txt",
    ]


def test_scripts_print_the_paths_they_wrote(runs):
    out, done = runs
    assert len(done) == 4
    for key, proc in done.items():
        folder = out / ("02_linear" if key.startswith("linear") else "03_simple_mlp")
        wrote = re.search(r"^wrote (\S+)\n +(\S+)$", proc.stdout, flags=re.M)
        assert wrote, proc.stdout[-2000:]
        trace, table = map(Path, wrote.groups())
        assert trace.parent == folder and trace.name.endswith(f"_{key.split('_')[1]}.json") and trace.is_file()
        assert table == trace.with_suffix(".txt") and table.is_file()
        assert re.search(rf"^open: +uv run inspect_trace.py --open {re.escape(str(trace))} ", proc.stdout, flags=re.M)
        assert "https://ui.perfetto.dev" in proc.stdout and f"trace-util -b BUCKET -f {out}" in proc.stdout


@pytest.mark.parametrize("key,annotation", [("linear_eager", "linear_fwd"), ("linear_compile", "linear_fwd"),
                                            ("mlp_eager", "mlp_fwd"), ("mlp_compile", "mlp_fwd")])
def test_three_profiler_steps_each_with_the_annotation(runs, key, annotation):
    out, _ = runs
    script, mode = key.split("_")
    folder = "02_linear" if script == "linear" else "03_simple_mlp"
    trace = load(next((out / folder).glob(f"*_{mode}.json")))
    per_step = steps(trace)
    assert sorted(per_step) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert all(names.count(annotation) == 1 for names in per_step.values())
    assert trace["record_shapes"] == 1  # shapes are what lets a reader compute FLOP/s


def test_linear_is_one_addmm_and_no_add(runs):
    out, _ = runs
    for mode in ("eager", "compile"):
        for names in step_names(out / f"02_linear/16x8x12_bf16_cold_{mode}.json"):
            assert names.count("aten::addmm") == 1
            assert "aten::add" not in names
    eager = step_names(out / "02_linear/16x8x12_bf16_cold_eager.json")
    compiled = step_names(out / "02_linear/16x8x12_bf16_cold_compile.json")
    assert all("aten::t" in names for names in eager)
    assert all("aten::t" not in names for names in compiled)  # Inductor hard-codes the strides
    assert all(any(n.startswith("Torch-Compiled Region") for n in names) for names in compiled)


def test_mlp_eager_dispatches_gelu_and_mul(runs):
    out, _ = runs
    for names in step_names(out / "03_simple_mlp/2x8x32x64_bf16_cold_eager.json"):
        assert names.count("aten::linear") == 3
        assert names.count("aten::gelu") == 1 and names.count("aten::mul") == 1


def test_mlp_compiled_runs_the_fused_cpp_kernel(runs):
    out, _ = runs
    for names in step_names(out / "03_simple_mlp/2x8x32x64_bf16_cold_compile.json"):
        assert any(n.startswith("Torch-Compiled Region") for n in names)
        assert fused_cpp(names)  # the CPU twin of the Triton kernel
        assert names.count("aten::mm") == 3
        assert "aten::gelu" not in names and "aten::t" not in names


def test_table_sits_beside_each_trace(runs):
    out, _ = runs
    traces = list(out.rglob("*.json"))
    assert len(traces) == 4
    for trace in traces:
        table = trace.with_suffix(".txt").read_text()
        assert "Self CPU" in table and "# of Calls" in table


def test_warm_fp32_gzip_and_active(tmp_path):
    proc = run_here("02_linear.py", *LINEAR, "--warmup", "2", "--dtype", "fp32", "--gzip", "--active", "5",
                    out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    trace = tmp_path / "02_linear/16x8x12_fp32_warm_active5_eager.json.gz"
    assert sorted(steps(load(trace))) == [f"ProfilerStep#{k}" for k in range(2, 7)]
    assert (tmp_path / "02_linear/16x8x12_fp32_warm_active5_eager.txt").exists()


@pytest.mark.parametrize("args,says", [
    (["--batch", "0"], "--batch: must be between 1"),
    (["--batch", "-3"], "--batch: must be between 1"),
    (["--batch", "abc"], "--batch: expected a whole number"),
    (["--dtype", "int8"], "--dtype: invalid choice"),
    (["--active", "5000"], "--active: must be between 1 and 1000"),
    (["--in_dim", "1000000", "--out_dim", "1000000"], "GiB free"),
    (["--out", "/dev/null/traces"], "cannot write to output folder"),
    (["--nope"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, says):
    args, out = (args[:-2], args[-1]) if args[-2:-1] == ["--out"] else (args, tmp_path)
    proc = run_here("02_linear.py", *args, out=out)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_device_cuda_without_gpu(tmp_path):
    proc = run_here("03_simple_mlp.py", *MLP, out=tmp_path, device="cuda")
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_kernels_mlp_device_cuda_without_gpu_suggests_what_runs_here(tmp_path):
    """Not setup()'s "try --device cpu": Liger's kernel cannot run on the CPU either; the script's own line says what
    it needs and what runs here instead. Nothing made, no header printed."""
    proc = run_here("03_kernels_mlp.py", *MLP, out=tmp_path, device="cuda")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("03_kernels_mlp.py: error: Liger's Triton kernel needs a CUDA GPU")
    assert "--device cpu" not in proc.stderr and "uv run 03_simple_mlp.py --compile" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_empty_out_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    """`--out ""` (an unset shell variable, say) is Path(""), the current folder: refused in one line instead."""
    monkeypatch.chdir(tmp_path)
    proc = run_here("02_linear.py", *LINEAR, out="")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "02_linear.py: error: argument --out: an empty path; name a folder (--out . for the current one)\n"
    assert not list(tmp_path.iterdir())


def test_interrupted_run_keeps_the_previous_trace(tmp_path):
    big = ["--batch", "4096", "--in_dim", "1024", "--out_dim", "1024", "--out", str(tmp_path)]
    # An earlier run's pair, under the name this run writes (its flags: --active 1000)
    trace = tmp_path / "02_linear/4096x1024x1024_bf16_cold_active1000_eager.json"
    trace.parent.mkdir(parents=True)
    trace.write_text('{"traceEvents": []}')
    trace.with_suffix(".txt").write_text("the earlier table\n")
    before = trace.read_bytes()
    # A long run (1000 steps of ~0.1 s), interrupted while it profiles: the earlier trace survives.
    proc = subprocess.Popen([sys.executable, str(ROOT / "02_linear.py"), *big, "--active", "1000", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline().startswith("02_linear:")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted before writing" in err and "Traceback" not in err
    assert trace.read_bytes() == before
    assert sorted(p.name for p in trace.parent.iterdir()) == [trace.name, trace.with_suffix(".txt").name]


def test_kernels_mlp_on_a_cpu_stops_before_the_hub_and_points_to_the_h200_trace(tmp_path):
    start = time.perf_counter()
    proc = run("03_kernels_mlp.py", *MLP, "--device", "cpu", "--out", str(tmp_path), env={"HUB_TIMEOUT": "60"})
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr
    assert "Hugging Face Hub" not in proc.stdout and time.perf_counter() - start < 50  # never waited on the Hub
    assert proc.stderr.strip().count("\n") == 0 and "uv run 03_simple_mlp.py --compile" in proc.stderr
    named = proc.stderr.split("--open ")[1].split(";")[0]
    assert (ROOT / named).is_file()  # the committed trace it points to exists
    assert not list(tmp_path.rglob("*.json"))


@NEEDS_TRITON
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="the Hub fallback is reached only on a GPU")
def test_kernels_mlp_offline_falls_back_to_the_liger_package(tmp_path):
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed: the fallback has nothing to load")
    proc = run("03_kernels_mlp.py", *MLP, "--device", "cuda", "--out", str(tmp_path), env={"HF_HUB_OFFLINE": "1"})
    assert "Hugging Face Hub kernel not available" in proc.stdout
    assert "using LigerGEGLUMLP from the liger-kernel package" in proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.rglob("*.json"))) == 1


@NEEDS_TRITON
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="the Hub fallback is reached only on a GPU")
def test_kernels_mlp_offline_without_liger_says_what_to_install(tmp_path):
    """Neither the Hub nor the package: one line naming what to install, exit 2, no trace (liger hidden here)."""
    hide = ("import runpy, sys; sys.modules['liger_kernel'] = sys.modules['kernels'] = None; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", hide, str(ROOT / "03_kernels_mlp.py"), *MLP, "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "liger-kernel" in proc.stderr and "uv sync" in proc.stderr
    assert not list(tmp_path.rglob("*.json"))


@NEEDS_TRITON
def test_hub_wait_is_bounded(monkeypatch):
    import importlib

    kernels = pytest.importorskip("kernels", reason="the `kernels` package is not installed: no Hub call to bound")
    pytest.importorskip("liger_kernel.transformers", reason="the fallback needs the liger-kernel package")
    script = importlib.import_module("03_kernels_mlp")
    asked = []
    # A firewall that never answers; the fallback's import of liger-kernel happened above, outside the timing.
    monkeypatch.setattr(kernels, "get_kernel", lambda *a, **k: asked.append(a) or time.sleep(30))
    monkeypatch.setattr(script, "HUB_TIMEOUT", "0.5")
    start = time.perf_counter()
    layers, source = script.liger_layers()
    waited = time.perf_counter() - start
    assert asked == [(script.HUB_REPO,)]  # the Hub was asked, with the post's repository
    assert 0.5 <= waited < 0.5 + 3, waited  # the timeout, plus a generous margin for a busy machine
    assert source == "liger-kernel package" and hasattr(layers, "LigerGEGLUMLP")


@pytest.mark.parametrize("value", ["abc", "-5", "nan", "0", "inf", ""])
def test_bad_hub_timeout_is_refused(monkeypatch, value):
    import importlib

    script = importlib.import_module("03_kernels_mlp")
    monkeypatch.setattr(script, "HUB_TIMEOUT", value)
    with pytest.raises(script.common.Fail) as e:
        script.liger_layers()
    assert str(e.value) == f"HUB_TIMEOUT must be a number of seconds between 0 and 3600, got {value!r}"


@NEEDS_TRITON  # without Triton the script stops earlier, saying so
def test_bad_hub_timeout_is_one_line(tmp_path):
    proc = run("03_kernels_mlp.py", *MLP, "--out", str(tmp_path), env={"HUB_TIMEOUT": "abc", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "03_kernels_mlp.py: error: HUB_TIMEOUT must be a number of seconds between 0 and 3600, got 'abc'"
    assert "Traceback" not in proc.stderr and "Hugging Face Hub kernel not available" not in proc.stdout
    assert not list(tmp_path.rglob("*"))  # not even an empty folder


@NEEDS_TRITON
def test_fused_mlp_without_gpu_says_how_to_run_it(tmp_path):
    proc = run("04_fused_mlp.py", *MLP, "--out", str(tmp_path), env={"TRITON_INTERPRET": "0"})
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and "TRITON_INTERPRET=1" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # the one line alone: no header of a run that does not start (docs/04)
    assert not list(tmp_path.rglob("*.json"))


@NEEDS_TRITON
def test_fused_mlp_in_the_triton_interpreter(shared_runs, tmp_path_factory):
    """The README's `TRITON_INTERPRET=1 uv run 04_fused_mlp.py` at this module's MLP shape: test_readme's run, shared."""
    if interpreter_cannot_loop():
        pytest.skip("Triton < 3.7's interpreter cannot run kernel loops under NumPy >= 2.5")
    argv = ["04_fused_mlp.py", *MLP]
    assert ENVS[tuple(argv)] == {"TRITON_INTERPRET": "1"}
    pages = page_runs(shared_runs, tmp_path_factory)
    proc = pages.run(argv)
    assert proc.returncode == 0, proc.stderr
    assert "check: fused vs eager SimpleGeGLUMLP, relative error" in proc.stdout
    for names in step_names(pages.out / "04_fused_mlp/2x8x32x64_bf16_cold_eager.json"):
        assert names.count("mlp_fwd") == 1
        assert "aten::gelu" not in names and "aten::mul" not in names  # GeGLU happens inside the kernel
        assert "aten::mm" in names  # down_proj, a plain GEMM
        assert names.count("_geglu_small_m_kernel") == 1  # 16 tokens: the small-M kernel, a CPU span per launch
    assert "ok      a CPU event matching /^_geglu_(tma|pointer|small_m)_kernel$/ in every step" in proc.stdout


@NEEDS_TRITON
def test_fused_mlp_refuses_big_shapes_in_the_interpreter(tmp_path):
    proc = run("04_fused_mlp.py", "--out", str(tmp_path), env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 2 and "interpreter is far too slow" in proc.stderr


def test_part1_matmul_add(tmp_path):
    experiments = ([], ["--batched", "3"], ["--compile"], ["--wait", "0", "--profiler-warmup", "0"], ["--active", "20"],
                   ["--active", "20", "--sync-each-step"])
    for extra in experiments:
        proc = run_here("01_matmul_add.py", "--size", "16", *extra, out=tmp_path)
        assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "01_matmul_add"
    stems = ["16_bf16_cold_compile", "16_bf16_cold_eager", "16_bf16_cold_bmm3_eager", "16_bf16_cold_wait0_pwarmup0_eager",
             "16_bf16_cold_active20_eager", "16_bf16_cold_active20_sync_eager"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(s + ext for s in stems for ext in (".json", ".txt"))
    for names in step_names(folder / "16_bf16_cold_eager.json"):
        assert names.count("matmul_add") == 1
        assert names.index("aten::matmul") < names.index("aten::mm")  # matmul dispatches mm
        assert names.count("aten::add") == 1 and "aten::bmm" not in names
    for names in step_names(folder / "16_bf16_cold_bmm3_eager.json"):
        assert names.index("aten::matmul") < names.index("aten::bmm") and "aten::mm" not in names
    # each file is its own run: the schedule it names is the schedule it holds
    assert sorted(steps(load(folder / "16_bf16_cold_wait0_pwarmup0_eager.json"))) == [f"ProfilerStep#{k}" for k in range(3)]
    for stem in ("16_bf16_cold_active20_eager", "16_bf16_cold_active20_sync_eager"):
        assert len(step_names(folder / f"{stem}.json", active=20)) == 20
    for names in step_names(folder / "16_bf16_cold_compile.json"):
        assert names.count("aten::addmm") == 1  # one dispatch: the add rides in the GEMM
        assert "aten::add" not in names and "aten::matmul" not in names


def test_part1_default_name_is_the_posts(tmp_path):
    proc = run_here("01_matmul_add.py", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "01_matmul_add/64_bf16_cold_eager.json").exists()
    assert (tmp_path / "01_matmul_add/64_bf16_cold_eager.txt").exists()


# ---- file names: one per trace-changing flag ------------------------------------------------------------

class Named(Exception):
    """Raised by the stand-in for common.record: the stem the run would write, before any profiling."""


def stems(monkeypatch, tmp_path, script, commands):
    """{command: the stem its run writes}, the script's own main() run in this process with common.record replaced
    (the model is built, nothing is profiled). `commands` are argv lists after the script's name."""
    import common

    module = importlib.import_module(script)

    def record(run, step, annotation, shape, expectations=(), profile_memory=False, flags=""):
        raise Named(run.stem(shape, flags))

    monkeypatch.setattr(common, "record", record)
    out = {}
    for argv in commands:
        monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv, "--device", "cpu", "--out", str(tmp_path)])
        with pytest.raises(Named) as named:
            module.main()
        out[" ".join(argv)] = str(named.value)
    return out


def docstring_commands(script):
    """The `uv run SCRIPT ...` commands the script's docstring lists (the post's, and its experiments)."""
    doc = importlib.import_module(script).__doc__
    return [shlex.split(line.split("#")[0])[3:] for line in doc.splitlines() if line.strip().startswith(f"uv run {script}.py")]


def test_part1_experiments_write_a_file_each(monkeypatch, tmp_path):
    """Every command of Part 1 (01's docstring, as the post and its experiments print them) writes its own file; the
    post's own names are kept."""
    commands = docstring_commands("01_matmul_add")
    assert len(commands) == 9 and ["--wait", "0", "--profiler-warmup", "0"] in commands
    named = stems(monkeypatch, tmp_path, "01_matmul_add", commands)
    assert len(set(named.values())) == len(commands), named
    assert {k: named[k] for k in ("--size 64", "--size 4096", "--warmup", "--size 4096 --warmup --compile",
                                  "--wait 0 --profiler-warmup 0", "--size 4096 --active 20",
                                  "--size 4096 --active 20 --sync-each-step", "--batched 4")} == {
        "--size 64": "64_bf16_cold_eager", "--size 4096": "4096_bf16_cold_eager", "--warmup": "64_bf16_warm_eager",
        "--size 4096 --warmup --compile": "4096_bf16_warm_compile",
        "--wait 0 --profiler-warmup 0": "64_bf16_cold_wait0_pwarmup0_eager",
        "--size 4096 --active 20": "4096_bf16_cold_active20_eager",
        "--size 4096 --active 20 --sync-each-step": "4096_bf16_cold_active20_sync_eager",
        "--batched 4": "64_bf16_cold_bmm4_eager"}


def test_attention_variants_write_a_file_each(monkeypatch, tmp_path):
    small = "--batch 1 --seq 16 --heads 2 --kv_heads 1 --head_dim 8".split()
    commands = [c + small for c in docstring_commands("05_attention") if "flex" not in c]  # flex: test_attention.py
    commands += [["--impl", "sdpa", "--backend", "math", *small], ["--impl", "sdpa", "--active", "4", *small]]
    named = stems(monkeypatch, tmp_path, "05_attention", commands)
    assert sorted(named.values()) == sorted([
        "1x16x2x1x8_math_bf16_cold_eager", "1x16x2x1x8_sdpa_auto_bf16_cold_eager",
        "1x16x2x1x8_sdpa_flash_decode_bf16_cold_eager", "1x16x2x1x8_sdpa_math_bf16_cold_eager",
        "1x16x2x1x8_sdpa_auto_bf16_cold_active4_eager"])


def test_model_variants_write_a_file_each(monkeypatch, tmp_path):
    tiny = ["--preset", "tiny", "--seq", "32"]
    commands = [tiny, tiny + ["--phase", "prefill"], tiny + ["--compile"], tiny + ["--vocab", "500"],
                tiny + ["--layers", "1"], tiny + ["--sync-each-step"], tiny + ["--wait", "2", "--vocab", "500"]]
    named = stems(monkeypatch, tmp_path, "06_model", commands)
    assert list(named.values()) == [
        "tiny-2L_decode_1x32_mlp-eager_bf16_cold_eager", "tiny-2L_prefill_1x32_mlp-eager_bf16_cold_eager",
        "tiny-2L_decode_1x32_mlp-eager_bf16_cold_compile", "tiny-2L_decode_1x32_mlp-eager_bf16_cold_vocab500_eager",
        "tiny-1L_decode_1x32_mlp-eager_bf16_cold_eager", "tiny-2L_decode_1x32_mlp-eager_bf16_cold_sync_eager",
        "tiny-2L_decode_1x32_mlp-eager_bf16_cold_wait2_vocab500_eager"]


@pytest.mark.parametrize("argv,compiled,flags,stem", [
    ([], False, "", "64_bf16_cold_eager"),  # the post's
    (["--wait", "1", "--profiler-warmup", "1", "--active", "3"], False, "", "64_bf16_cold_eager"),  # the defaults, said
    (["--wait", "0"], False, "", "64_bf16_cold_wait0_eager"),
    (["--wait", "2"], False, "", "64_bf16_cold_wait2_eager"),
    (["--profiler-warmup", "0"], False, "", "64_bf16_cold_pwarmup0_eager"),
    (["--profiler-warmup", "2"], False, "", "64_bf16_cold_pwarmup2_eager"),
    (["--active", "2"], False, "", "64_bf16_cold_active2_eager"),
    (["--active", "4"], False, "", "64_bf16_cold_active4_eager"),
    (["--sync-each-step"], False, "", "64_bf16_cold_sync_eager"),
    (["--active", "20", "--wait", "0", "--sync-each-step", "--profiler-warmup", "0", "--warmup", "--dtype", "fp32"],
     False, "_bmm2", "64_fp32_warm_wait0_pwarmup0_active20_sync_bmm2_eager"),  # the rule's order, whatever the flags'
    (["--compile"], False, "", "64_bf16_cold_compile"),
    ([], True, "", "64_bf16_cold_compile"),  # compiled whatever the flags (FlexAttention)
    (["--compile"], True, "_block", "64_bf16_cold_block_compile"),
])
def test_stem_names_every_flag_that_changes_the_trace(argv, compiled, flags, stem):
    import common

    args = common.parser("x", size=64).parse_args(argv)
    run = common.Run("01_matmul_add", args, torch.device("cpu"), common.DTYPES[args.dtype], compiled)
    assert run.stem("64", flags) == stem and run.mode == stem.rsplit("_", 1)[1]


def test_expect_reads_a_batched_run_from_its_name(tmp_path):
    """--expect 01_matmul_add takes --batched from the _bmmB of the name (and from BxN, the name it had before)."""
    import inspect_trace as it

    data = (ROOT / "tests/data/h200_matmul_add_bmm_eager.json.gz").read_bytes()
    for name, batched in (("64_bf16_cold_bmm4_eager.json.gz", True), ("4x64_bf16_cold_eager.json.gz", True),
                          ("64_bf16_cold_eager.json.gz", False)):
        (tmp_path / name).write_bytes(data)
        guesses = [e.text for e in it.expectations_for("01_matmul_add", it.load_trace(tmp_path / name))[0]]
        assert ("'aten::bmm' 1x per step" in guesses) is batched and ("'aten::mm' 1x per step" in guesses) is not batched


def test_open_hint_works_from_another_folder(tmp_path, monkeypatch):
    """Run from elsewhere, the printed `open:` command names inspect_trace.py and the trace as typed from there."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    proc = run_here("02_linear.py", *LINEAR, out="t")
    assert proc.returncode == 0, proc.stderr
    hint = re.search(r"^open: +uv run (\S+) --open (\S+) ", proc.stdout, flags=re.M)
    assert hint and hint.group(1) == str(ROOT / "inspect_trace.py"), proc.stdout[:1500]
    assert hint.group(2) == "t/02_linear/16x8x12_bf16_cold_eager.json"  # under the current folder: relative
    shown = subprocess.run([sys.executable, hint.group(1), hint.group(2)], capture_output=True, text=True, cwd=here)
    assert shown.returncode == 0 and shown.stdout.startswith("trace   t/02_linear/"), shown.stderr


def test_plot_on_a_cpu_is_refused_before_the_run(tmp_path):
    proc = run_here("02_linear.py", *LINEAR, "--plot", out=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("02_linear.py: error: --plot on the CPU: a CPU trace has no roofline (no GPU kernels, "
                           "no device peaks); run without --plot\n")
    assert not list(tmp_path.iterdir())


def gpu_kernels(trace):
    return [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fused_mlp_runs_two_kernels_per_forward(tmp_path):
    proc = run("04_fused_mlp.py", "--device", "cuda", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    trace = load(tmp_path / "04_fused_mlp/64x128x768x3072_bf16_cold_eager.json")
    # Each step's kernels, by the launches inside its ProfilerStep span: the fused gate/up GEMM and down_proj (cuBLAS
    # at 8192 tokens), nothing else. (The trace as a whole may also hold the step before the window's kernels: the
    # CPU runs ahead of the GPU, and the profiler synchronizes only when the window ends.)
    steps = __import__("inspect_trace").parse_trace(trace).steps
    assert [len(st.kernels) for st in steps] == [2, 2, 2], [[k.name for k in st.kernels] for st in steps]
    assert all(st.kernels[0].name.startswith("_geglu_") and not st.kernels[1].name.startswith("_geglu_")
               for st in steps)


def test_h200_fused_trace_has_two_kernels_per_forward():
    names = gpu_kernels(load(ROOT / "tests/data/h200_fused_eager.json.gz"))
    assert len(names) == 6 and names.count("_geglu_tma_kernel") == 3
