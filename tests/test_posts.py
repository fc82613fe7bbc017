"""Every `uv run` line of both posts, exactly as printed, run on the CPU lane with a temp --out.

Part 1: "Profiling in PyTorch (Part 1): A Beginner's Guide to torch.profiler" (huggingface.co/blog/torch-profiler).
Part 2: "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP" (huggingface.co/blog/torch-mlp-fusion).

Each run is checked against what the post says about it: the file it writes and the ops it names. The trace is
read with plain json (tests/test_scripts.py's helpers), not with inspect_trace.py. The posts' runs at sizes a
GPU finishes in milliseconds take minutes on a 2-core CPU: those run with the post's flags and a smaller size,
and test_readme's SMALLER says why for each one.
"""

import os
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import fused_cpp
from doc_pages import pages, section

# page_runs: --device cpu and --out under a temp folder, each command once in the session
from test_readme import COMMANDS, ROOT, first_compile_env, page_runs
from test_scripts import load, steps

PART1 = [
    "uv run 01_matmul_add.py --size 64",
    "uv run 01_matmul_add.py --size 4096",
    "uv run 01_matmul_add.py --warmup",
    "uv run 01_matmul_add.py --size 4096 --warmup",
    "uv run 01_matmul_add.py --size 4096 --warmup --compile",
]
PART2 = [
    "uv run 02_linear.py --batch 1024 --in_dim 32 --out_dim 64",
    "uv run 02_linear.py --batch 1024 --in_dim 32 --out_dim 64 --compile",
    "uv run 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072",
    "uv run 03_simple_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072 --compile",
    "uv run 03_kernels_mlp.py --batch 64 --seq 128 --dim 768 --hidden 3072",
]

def argv_of(command: str) -> list[str]:
    """The script's own argv after `uv run` (test_readme's runs swap in the sizes of its SMALLER)."""
    words = shlex.split(command)
    assert words[:2] == ["uv", "run"]
    return words[2:]


SCHEDULE = "uv run 01_matmul_add.py --wait 0 --profiler-warmup 0 --active 20"  # Part 1's schedule diff, as flags


@pytest.fixture(scope="module")
def runs(shared_runs, tmp_path_factory):
    """All the commands, two at a time where there are cores to spare (most of a run is single-threaded: start-up,
    compiling; on 2 cores the other test worker keeps the second one busy, and a second thread would only start a
    second server, torch's imports again), as test_readme runs them: the posts' commands are the README's too, so
    each runs once in the session, whichever file asks first."""
    pages = page_runs(shared_runs, tmp_path_factory)
    commands = PART1 + PART2 + [SCHEDULE]
    with ThreadPoolExecutor(max_workers=2 if (os.cpu_count() or 1) > 2 else 1) as pool:
        return pages.out, dict(zip(commands, pool.map(lambda line: pages.run(argv_of(line)), commands)))


def test_main_command_first_compile_is_quiet_with_a_cuda_toolkit_but_no_gpu(shared_runs, tmp_path_factory):
    """The README's main command, run fresh as a reader types it, on a machine that has never compiled and has a CUDA
    toolkit but no GPU (test_readme.first_compile_env): torch warns "No CUDA runtime is found, using CUDA_HOME=..." at
    the first compile there. The run stays quiet anyway."""
    pages = page_runs(shared_runs, tmp_path_factory)
    proc = pages.run(COMMANDS[0])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert fused_cpp(per_step(proc)["ProfilerStep#2"])  # the fused C++ kernel ran...
    cache = Path(first_compile_env(pages.out)["TORCHINDUCTOR_CACHE_DIR"])
    built = [p for p in cache.rglob("*.cpp") if "cpp_fused__unsafe_view_gelu_mul" in p.read_text()]
    assert built and all(p.with_suffix(".so").is_file() for p in built)  # ...built by this run's compiler


def _get(runs, command):
    return runs[1][command]


def written(proc) -> str:
    return re.search(r"^wrote +(\S+)$", proc.stdout, flags=re.M).group(1)


def per_step(proc):
    return steps(load(written(proc)))


@pytest.mark.parametrize("command", PART1 + PART2)
def test_post_command_runs_quietly_and_confirms_what_applies_on_a_cpu(command, runs):
    proc = runs[1][command]
    if command.startswith("uv run 03_kernels_mlp.py"):
        # Liger's kernel needs a GPU: one line, at once, naming the committed H200 trace to open instead.
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr
        assert "inspect_trace.py --open tests/data/h200_liger.json.gz" in proc.stderr
        assert (ROOT / "tests/data/h200_liger.json.gz").is_file()
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]  # no kineto USDT lines, no traceback (CUDA_HOME: the first-compile test)
    assert "BROKEN" not in proc.stdout, proc.stdout[-3000:]
    assert "uvx --python 3.12 trace-util -b BUCKET -f " in proc.stdout  # trace-util 0.2.0 on any local Python
    if "--compile" in command:  # said before the slow first call, not after
        assert proc.stdout.index("the first call takes a while on a CPU") < proc.stdout.index("wrote ")


@pytest.mark.parametrize("command,name", [
    (PART1[0], "01_matmul_add/64_bf16_cold_eager"),  # the post's own example
    (PART1[1], "01_matmul_add/256_bf16_cold_eager"),
    (PART1[2], "01_matmul_add/64_bf16_warm_eager"),  # the post's Perfetto link: .../64_bf16_warm_eager.json
    (PART1[3], "01_matmul_add/256_bf16_warm_eager"),
    (PART1[4], "01_matmul_add/256_bf16_warm_compile"),
    (PART2[0], "02_linear/1024x32x64_bf16_cold_eager"),
    (PART2[1], "02_linear/1024x32x64_bf16_cold_compile"),
    (PART2[2], "03_simple_mlp/1x128x768x3072_bf16_cold_eager"),
    (PART2[3], "03_simple_mlp/1x128x768x3072_bf16_cold_compile"),
])
def test_post_command_writes_the_trace_and_the_table(command, name, runs):
    out, done = runs
    proc = done[command]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert written(proc) == str(out / f"{name}.json")
    assert "Self CPU time total" in (out / f"{name}.txt").read_text()  # Part 1's Figure 1: the table
    # schedule(wait=1, warmup=1, active=3): "three profile steps (starting from ProfileStep#2)"
    assert sorted(per_step(proc)) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]


def every_step(proc, check):
    return all(check(names) for names in per_step(proc).values())


def test_part1_eager_dispatch_chain(runs):
    """Figure 12: ProfilerStep > matmul_add > aten::matmul > aten::mm, and aten::add."""
    for command in PART1[:4]:
        assert every_step(_get(runs, command), lambda n: n.count("matmul_add") == 1 and n.count("aten::matmul") == 1
                          and n.count("aten::mm") == 1 and n.count("aten::add") == 1), command


def test_part1_compiled_is_one_addmm_in_a_compiled_region(runs):
    """Figures 19-20: Torch-Compiled Region, Dynamo's cache lookup, the AOT prologue, one aten::addmm, no add."""
    proc = _get(runs, PART1[4])
    assert every_step(proc, lambda n: n.count("aten::addmm") == 1 and "aten::add" not in n and "aten::mm" not in n)
    for row in ("Torch-Compiled Region", "TorchDynamo Cache Lookup", "AOTDispatcher Runtime Wrapper Prologue",
                "## Call CompiledFxGraph"):
        assert every_step(proc, lambda n: any(x.startswith(row) for x in n)), row


def test_part1_bias_is_a_matrix(runs):
    """`b = torch.randn(args.size, args.size, ...)`: the add's second input is [size, size], like x and w."""
    trace = load(written(_get(runs, PART1[0])))
    adds = [e for e in trace["traceEvents"] if e.get("name") == "aten::add" and e.get("ph") == "X"]
    assert adds and all(e["args"]["Input Dims"][:2] == [[64, 64], [64, 64]] for e in adds)


def test_part2_linear(runs):
    """aten::linear > aten::t > aten::addmm, no aten::add; compiled: aten::t gone, the compiled region's rows."""
    assert every_step(_get(runs, PART2[0]), lambda n: n.count("aten::linear") == 1 and n.count("aten::t") == 1
                      and n.count("aten::addmm") == 1 and "aten::add" not in n)
    assert every_step(_get(runs, PART2[1]), lambda n: n.count("aten::addmm") == 1 and "aten::t" not in n
                      and any(x.startswith("## Call CompiledFxGraph") for x in n))


def test_part2_mlp(runs):
    """Eager: three aten::linear, a GeLU and a mul, the view ops; compiled: three bare aten::mm and the fused kernel."""
    assert every_step(_get(runs, PART2[2]), lambda n: n.count("aten::linear") == 3 and n.count("aten::gelu") == 1
                      and n.count("aten::mul") == 1 and {"aten::t", "aten::transpose", "aten::view"} <= set(n))
    assert every_step(_get(runs, PART2[3]), lambda n: n.count("aten::mm") == 3 and "aten::gelu" not in n
                      and fused_cpp(n))  # the CPU twin of the Triton kernel


def test_part1_schedule_experiments_as_flags(runs):
    """The post's diff `schedule(wait=0, warmup=0, active=20)`, `range(20)`: steps from ProfilerStep#0, 20 of them."""
    proc = _get(runs, SCHEDULE)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert sorted(per_step(proc), key=lambda s: int(s.split("#")[1])) == [f"ProfilerStep#{k}" for k in range(20)]
    assert "schedule(wait=0, warmup=0, active=20), no per-step sync" in proc.stdout


def no_gpu_rows():
    """The rows of every page's "## No GPU?" table (Part 1's page and Part 2's each have one)."""
    sections = [section(p.read_text(), "## No GPU?") for p in pages() if "\n## No GPU?\n" in p.read_text()]
    assert len(sections) == 2
    return [line for s in sections for line in s.splitlines() if line.startswith("| Part")]


def test_readme_no_gpu_section_covers_every_figure():
    figures = {"Part 1": set(), "Part 2": set()}
    for row in no_gpu_rows():
        post, numbers = row.split(" | ")[0][2:].split(", ", 1)  # "| Part 1, 10–11, 13 | ..."
        for lo, hi in re.findall(r"(\d+)(?:–(\d+))?", numbers):
            figures[post].update(range(int(lo), int(hi or lo) + 1))
    assert figures["Part 1"] == set(range(1, 22))  # Part 1 has Figures 1-21
    assert figures["Part 2"] == set(range(1, 15)) - {6}  # 1-14; Figure 6 is a paper's conclusion, not a trace


def test_readme_no_gpu_commands_are_the_tested_ones():
    """Each CPU run in the table is a post command (run above) or a README command (run by test_readme)."""
    from test_readme import COMMANDS

    tested = [shlex.split(c)[2:] for c in PART1 + PART2] + COMMANDS
    for row in no_gpu_rows():
        for command in re.findall(r"`(uv run [^`]+)`", row):
            argv = shlex.split(command)[2:]
            assert argv in tested, command
            if "(and `--compile`)" in row:
                assert argv + ["--compile"] in tested, command


def test_readme_no_gpu_traces_are_committed():
    """Each H200 trace the table names is in tests/data; one that record_h200.sh makes but that is not committed
    yet is an expected failure (xfail), never a pass."""
    recipe = (ROOT / "tests/data/record_h200.sh").read_text()
    names = {n for row in no_gpu_rows() for n in re.findall(r"`(h200_\w+)`", row)}
    assert len(names) >= 12
    missing = sorted(n for n in names if not (ROOT / f"tests/data/{n}.json.gz").is_file())
    unknown = [n for n in missing if f"rec {n[len('h200_'):]} " not in recipe]
    assert not unknown, f"named in the README, neither committed nor recorded by record_h200.sh: {unknown}"
    if missing:
        pytest.xfail(f"not recorded on the H200 yet (bash tests/data/record_h200.sh): {missing}")
