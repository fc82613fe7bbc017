"""Every `uv run` command in README.md and in every docs/*.md page works as written (on the CPU lane, output
redirected to a temp folder); the pages are linked from the README and their links resolve."""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from conftest import interpreter_cannot_loop, session_folder
from doc_pages import all_text, links, page, pages, slug

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"01_matmul_add.py", "02_linear.py", "03_simple_mlp.py", "03_kernels_mlp.py", "04_fused_mlp.py",
           "05_attention.py", "06_model.py", "07_train_step.py", "08_tensor_parallel.py", "09_data_parallel.py"}
BENCHES = {"bench.py", "bench_attention.py", "bench_model.py", "bench_tp.py"}
# 05_attention.py's defaults are Llama-3-8B's attention (4 x 2048 tokens, 32 heads): minutes and gigabytes on a
# CPU. On the CPU, its commands that give no shape run at this one (the scores still outweigh every other
# activation, so the memory expectations mean the same); with --device cuda they run as written.
CPU_SHAPE = {"05_attention.py": ["--batch", "1", "--seq", "512", "--heads", "2", "--kv_heads", "1", "--head_dim", "16"],
             # 4 Gemma-2B layers: 1 GB of weights, slow on a CPU; one tiny layer (after the pages' --layers 4): the same
             # check, a quarter of the graph for --compile to trace and build (8 s less on a cold cache than 2 layers);
             # tests/test_model.py runs the layers' spans and the reader at 2
             "06_model.py": ["--preset", "tiny", "--seq", "32", "--layers", "1"],
             # a training step of the post's MLP is three forwards' work: seconds per step at these sizes
             "07_train_step.py": ["--batch", "2", "--seq", "32", "--dim", "64", "--hidden", "256"],
             "03_simple_mlp.py": ["--batch", "1"],  # the post's 64 x 128 tokens: see SMALLER
             # two gloo ranks: the post's MLP in fp32 takes seconds a step per rank on 2 cores
             "08_tensor_parallel.py": ["--batch", "2", "--seq", "32", "--dim", "64", "--hidden", "256", "--dtype", "fp32"],
             # a training step of two MLPs on each of two gloo ranks: the smallest shape whose steps still take ms
             "09_data_parallel.py": ["--batch", "2", "--seq", "16", "--dim", "32", "--hidden", "64", "--dtype", "fp32"]}


def command_lines(text):
    """(command, comment) for each line of the code blocks in `text`, continuations joined."""
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):  # every fence pairs: ```python too
        if lang not in ("", "bash"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("#")
            yield code, comment.strip()


def readme_commands():
    """`[VAR=value ...] uv run ...` lines from the code blocks of the README and every docs page, comments dropped,
    each command once (in the order a reader meets them).

    Returns (env, argv-after-`uv run`) pairs."""
    commands = []
    for code, _ in command_lines(all_text()):
        if not re.match(r"\s*(?:[A-Z_]+=\S*\s+)*uv run\s", code):
            continue  # output quoted in a block, not a command
        words = shlex.split(code)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words[:2] == ["uv", "run"] and (env, words[2:]) not in commands:
            commands.append((env, words[2:]))
    return commands


ENVS = {tuple(argv): env for env, argv in readme_commands()}
COMMANDS = [argv for _, argv in readme_commands()]
# The README's first command, the main job, runs as a reader types it (`uv run ...`, a fresh process) on a fresh
# machine (first_compile_env); the others through tests/zygote.py (conftest.SharedRuns).
FRESH = {tuple(COMMANDS[0])}


def first_compile_env(out: Path) -> dict:
    """A machine that has never compiled, with a CUDA toolkit but no GPU: Inductor's own empty cache (the C++ compiler
    runs) and CUDA_HOME set, the setting in which torch warns "No CUDA runtime is found, using CUDA_HOME=..." at the
    first compile. The FRESH runs get it: test_main_command_first_compile_is_quiet_with_a_cuda_toolkit_but_no_gpu."""
    (out / "cuda-toolkit").mkdir(exist_ok=True)
    return {"CUDA_HOME": str(out / "cuda-toolkit"), "TORCHINDUCTOR_CACHE_DIR": str(out / "first-compile-cache")}


def test_readme_has_the_two_setup_commands():
    first = [shlex.split(code)[2:] for code, _ in command_lines(page("README.md")) if code.startswith("uv run")]
    assert first[:2] == [["03_simple_mlp.py", "--compile"], ["pytest"]]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.split("#")[0]).resolve() for target in links(page("README.md"))}
    unlinked = [p.name for p in pages()[1:] if p.resolve() not in linked]
    assert len(pages()) > 1 and not unlinked, unlinked


def test_every_relative_link_resolves():
    """A link to a file names one that exists; a link to `#anchor` (here or in another page) names a heading there."""
    checked = 0
    for source in pages():
        for target in links(source.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https://..., not this repository's
            path, _, anchor = target.partition("#")
            dest = (source.parent / path).resolve() if path else source
            assert dest.is_file(), f"{source.name}: {target} names no file"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", dest.read_text(), flags=re.S), flags=re.M)
                assert anchor in [slug(h) for h in headings], f"{source.name}: {target} names no heading"
            checked += 1
    assert checked >= 20


def test_slug_is_githubs():
    assert slug("`02_linear.py` — one `nn.Linear`, one kernel") == "02_linearpy--one-nnlinear-one-kernel"
    assert slug("No GPU?") == "no-gpu"
    assert slug("Guess first, then look: `inspect_trace.py`") == "guess-first-then-look-inspect_tracepy"


def test_part1_page_warns_a_cpu_reader_off_the_4096_bf16_runs():
    """docs/01: right under the post's commands, before the next --size 4096 command, a CPU reader is told those
    runs take minutes to an hour there (bf16 GEMMs at about 1 GFLOP/s) and given one that does not: --dtype fp32,
    a flag the script takes, in a block of its own (so test_readme_command_runs runs it)."""
    text = page("docs/01_matmul_add.md")
    first_block_end = text.index("```", text.index("uv run 01_matmul_add.py --size 4096")) + 3
    warning = text.index("**On a CPU, do not run the `--size 4096` commands of this page as written.**")
    cpu_command = text.index("uv run 01_matmul_add.py --size 4096 --dtype fp32")
    assert first_block_end < warning < cpu_command < text.index("--size 4096", text.index("\n", cpu_command))
    assert "1 GFLOP/s" in text[warning:cpu_command]
    assert ["01_matmul_add.py", "--size", "4096", "--dtype", "fp32"] in COMMANDS


def test_readme_commands_run_through_uv_under_uv_run():
    """Under `uv run pytest` (uv sets UV in the environment) the commands are `uv run` commands, as a reader's are;
    the README's main command (FRESH) runs so, in a process of its own, the others as `python SCRIPT` in a child of
    a Python that has imported torch already (tests/zygote.py: the same run, without a minute of imports)."""
    if not os.environ.get("UV"):
        pytest.skip("not started by `uv run`: the commands run with this interpreter")
    assert launcher()[1:] == ["run", "--frozen"]
    assert COMMANDS[0] == ["03_simple_mlp.py", "--compile"] and ("03_simple_mlp.py", "--compile") in FRESH


def launcher():
    """`uv run --frozen` when these tests run in the project's own environment (`uv run pytest`), as a reader types
    it; otherwise this interpreter. A machine with its own torch (the GPU image) may have uv on PATH too, but
    `uv run` there would build the locked environment afresh, which needs PyPI."""
    uv = shutil.which("uv")
    in_project_env = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()
    return [uv, "run", "--frozen"] if uv and in_project_env else [sys.executable]


def command(argv):
    """What runs `uv run ARGV` here: `uv run python -m x` is this interpreter's `-m x` without uv."""
    start = launcher()
    if start == [sys.executable] and argv[0] == "torchrun":  # the console script is torch.distributed.run
        return start + ["-m", "torch.distributed.run", *argv[1:]]
    return start + (argv[1:] if start == [sys.executable] and argv[0] == "python" else argv)


# Part 1's 4096 runs do 4096³ bf16 GEMMs, up to 25 calls per run, and the post's MLP 116 GFLOP per step. A CPU
# without native bf16 (this project's 2-core machines) does about 1 GFLOP/s in bf16: a 1024³ GEMM takes 3 s, one
# MLP step at 8192 tokens a minute or more. Here they run smaller, every other flag as written; a GPU runs them
# at full size.
SMALLER = {("--size", "4096"): ("256", "a 4096³ bf16 GEMM takes minutes per call on 2 CPU cores; 256³ is 4096× less"),
           ("--batch", "64"): ("1", "8192 tokens through a 768→3072 MLP is 116 GFLOP per step; 128 tokens is 64× less"),
           # 07_train_step.py's decoder: the same architecture at 06's tiny preset
           ("--model", "gemma-2b"): ("tiny", "two Gemma-2B-shaped layers train at minutes per step on 2 CPU cores"),
           # its 4 x 512 tokens through tiny's layers, with memory profiling: 26 s of the suite; 4 x 64 shows the same
           ("--seq", "512"): ("64", "the memory timeline's phases do not depend on the prompt's length")}
# The README's traces of those runs, under the names the smaller runs give them.
SMALLER_TRACES = {"03_simple_mlp/64x128x768x3072_": "03_simple_mlp/1x128x768x3072_",
                  "08_tensor_parallel/64x128x768x3072_bf16_": "08_tensor_parallel/2x32x64x256_fp32_",
                  "09_data_parallel/mlp-2L_64x128x768x3072_bf16_": "09_data_parallel/mlp-2L_2x16x32x64_fp32_"}


def script_of(argv):
    """The suite's file a command runs: the first word, or the script `torchrun [its flags] SCRIPT` starts."""
    if argv[0] == "torchrun":
        return next((a for a in argv[1:] if a.endswith(".py")), argv[0])
    return argv[0]


def smaller(argv, table=SMALLER):
    """argv with the sizes of `table` ({(flag, value): (value here, why)}) swapped in."""
    argv = list(argv)
    for i in range(len(argv) - 1):
        if (argv[i], argv[i + 1]) in table:
            argv[i + 1] = table[(argv[i], argv[i + 1])][0]
    return argv


def smaller_name(path, table=SMALLER):
    """A trace's path or file name as the smaller run here writes it: `--size N` is the name's leading shape."""
    for (flag, value), (here, _) in table.items():
        if flag == "--size":
            path = re.sub(rf"(^|/){value}_", rf"\g<1>{here}_", path)
    return path


def local_trace(path, out):
    """Where the README's traces/<script>/<file> is written here: under `out`, named after the shape run here."""
    name = smaller_name(path[len("traces/"):])
    for big, small in SMALLER_TRACES.items():
        name = small + name[len(big):] if name.startswith(big) else name
    return out / name


def as_run_here(argv, out):
    """The README command on the CPU lane (at a CPU-sized size), writing under `out`, not traces/ or bench_results/."""
    argv = smaller(argv)
    argv = [str(local_trace(a, out)) if a.startswith("traces/") else a for a in argv]
    # Pictures the README shows are re-made elsewhere: tests/test_plot.py compares them with the committed ones.
    argv = [str(out / a[len("results/"):]) if a.startswith("results/") and a.endswith(".png") else a for a in argv]
    if script_of(argv) in SCRIPTS:
        if script_of(argv) in CPU_SHAPE and ran_on_cpu(argv) and not {"--batch", "--seq"} & set(argv):
            argv += CPU_SHAPE[script_of(argv)]
        argv += ["--out", str(out)] + ([] if "--device" in argv else ["--device", "cpu"])
    elif argv[0] in BENCHES:
        argv += ["--out", str(out / (Path(argv[0]).stem + ".json"))]
    if "--open" in argv:
        argv += ["--port", "0"]  # any free port: a test must not take 9001 from a reader's own server
    return argv


def ran_on_cpu(argv):
    """The device the command runs on here: the CPU, unless the README itself asks for --device cuda."""
    return not ("--device" in argv and argv[argv.index("--device") + 1] == "cuda")


def run_env(argv):
    env = {**os.environ, "TRITON_INTERPRET": "0", **ENVS.get(tuple(argv), {})}
    if argv[0] in BENCHES or (script_of(argv) in SCRIPTS and "--device" not in argv):
        # What a reader without a GPU sees, which is what the pages quote, on any machine. The real benchmarks are
        # tests/test_bench*.py's job; the GPU runs of the scripts, test_scripts' and the pages' --device cuda lines.
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class Runs:
    """README commands run once each in the session (conftest.SharedRuns), into one folder; a command that needs a
    trace runs its script first."""

    def __init__(self, shared, out):
        self.shared, self.out = shared, out

    def run(self, argv):
        fresh = tuple(argv) in FRESH
        env = {**run_env(argv), **(first_compile_env(self.out) if fresh else {})}
        return self.shared.run(command(as_run_here(argv, self.out)), env, fresh=fresh)

    def trace(self, path):
        """The README's traces/<script>/<file>: made by that script's README commands (run as needed)."""
        local = local_trace(path, self.out)
        script = path.split("/")[1] + ".py"
        for argv in (c for c in COMMANDS if script_of(c) == script and "--open" not in c):
            if local.exists():
                break
            self.run(argv)
        assert local.exists(), f"no command of the README or a docs page runs {script} to write {path}"
        return local


def page_runs(shared_runs, tmp_path_factory):
    """The pages' runs, one folder for every worker of the session (test_posts and test_attention read theirs here)."""
    return Runs(shared_runs, session_folder(tmp_path_factory, "readme"))


@pytest.fixture(scope="module")
def runs(shared_runs, tmp_path_factory):
    return page_runs(shared_runs, tmp_path_factory)


ORDERED = [c for c in COMMANDS if c != ["pytest"] and "--open" not in c]


@pytest.mark.parametrize("argv", ORDERED, ids=[" ".join(c) for c in ORDERED])
def test_readme_command_runs(argv, runs):
    if argv[0] == "mutmut":
        pytest.skip("mutation testing takes minutes: run by hand (test_mutmut_config checks its set-up)")
    if script_of(argv) not in SCRIPTS and argv[0] != "inspect_trace.py" and argv[0] not in BENCHES and argv[:3] != [
            "python", "-m", "trace_reader.plot"]:
        pytest.fail(f"README runs {argv[0]}, which this test does not know how to check")
    env = run_env(argv)
    if env["TRITON_INTERPRET"] == "1" and importlib.util.find_spec("triton") is None:
        pytest.skip("needs Triton (Linux wheels only)")
    if env["TRITON_INTERPRET"] == "1" and interpreter_cannot_loop():
        pytest.skip("Triton < 3.7's interpreter cannot run kernel loops under NumPy >= 2.5")
    for a in argv:
        if a.startswith("traces/"):
            runs.trace(a)  # made here, so this case does not depend on an earlier one
    had_bench_results = (ROOT / "bench_results").exists()
    proc = runs.run(argv)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    on_cpu = ran_on_cpu(argv)
    gpu_only = argv[0] == "03_kernels_mlp.py" or (argv[0] == "04_fused_mlp.py" and env["TRITON_INTERPRET"] != "1") \
        or (argv[0] == "06_model.py" and ("--cuda-graphs" in argv or {"liger", "fused"} & set(argv)))
    if argv[0] in BENCHES:
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-3000:]
        assert not list(runs.out.glob(Path(argv[0]).stem + ".*"))
        assert (ROOT / "bench_results").exists() == had_bench_results
    elif gpu_only and on_cpu:
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-3000:]  # the documented answer
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        if script_of(argv) in SCRIPTS:
            assert re.search(r"^wrote \S+\.json", proc.stdout, flags=re.M), proc.stdout[-3000:]
            if on_cpu:  # on the CPU, every claim of the post that applies there holds
                assert "BROKEN" not in proc.stdout, proc.stdout[-3000:]


def named_traces():
    """(argv, file name) for each script command whose comment starts with the name of the trace it writes."""
    named = []
    for code, comment in command_lines(all_text()):
        words = shlex.split(code) if code.lstrip().startswith("uv run ") else []
        m = re.match(r"(?:traces/\w+/)?([\w.-]+_(?:eager|compile))(?:\.json)?\b", comment)
        if words[:2] == ["uv", "run"] and words[2] in SCRIPTS and m:
            named.append((words[2:], m.group(1)))
    return named


NAMED = named_traces()


@pytest.mark.parametrize("argv,name", NAMED, ids=[" ".join(c) for c, _ in NAMED])
def test_a_trace_named_beside_a_command_is_what_it_writes(argv, name, runs):
    """`uv run 01_matmul_add.py --size 4096 --active 20   # 4096_bf16_cold_active20_eager: ...`: the name is the
    file that command writes (here at the smaller size), so each of a page's runs can be found, and compared."""
    proc = runs.run(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = re.search(r"^wrote (\S+)\.json$", proc.stdout, flags=re.M).group(1)
    assert Path(written).name == local_trace(f"traces/{Path(written).parent.name}/{name}", Path()).name


def test_shared_runs_run_each_command_once(tmp_path):
    """Two workers' SharedRuns on one folder: a command runs once, its output read back by both; the same command
    with another environment is another run."""
    from conftest import SharedRuns

    count = tmp_path / "count"
    cmd = [sys.executable, "-c", f"import os; open({str(count)!r}, 'a').write('x'); print(os.environ.get('X', '-'))"]
    a, b = SharedRuns(tmp_path / "runs"), SharedRuns(tmp_path / "runs")
    first, again, other = a.run(cmd, dict(os.environ)), b.run(cmd, dict(os.environ)), b.run(cmd, {**os.environ, "X": "1"})
    assert (first.returncode, first.stdout, again.stdout, other.stdout) == (0, "-\n", "-\n", "1\n")
    assert count.read_text() == "xx"


def test_trace_names_are_read_from_the_comments():
    assert len(NAMED) >= 9  # Part 1's commands name their files
    assert (["01_matmul_add.py", "--size", "64"], "64_bf16_cold_eager") in NAMED
    assert smaller_name("4096_bf16_cold_eager") == "256_bf16_cold_eager"
    assert smaller_name("01_matmul_add/4096_bf16_cold_eager.json") == "01_matmul_add/256_bf16_cold_eager.json"
    assert smaller_name("05_attention/4x4096_x.json") == "05_attention/4x4096_x.json"  # not a leading size


def unvarying(text, out=None):
    """What a run prints that does not vary from run to run: the output folder read as traces/, the torch version,
    timings (numbers with a thousands separator or a decimal point) and the column widths they set all masked."""
    if out is not None:
        text = text.replace(f"{Path(out).resolve()}/", "traces/")
    text = re.sub(r"\btorch [^,\s]+,", "torch <version>,", text)
    text = re.sub(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+", "#", text)
    text = re.sub(r"-{2,}", "--", text)
    return re.sub(r"[ \t]+", " ", text)


def test_unvarying_masks_timings_only():
    assert unvarying("1  aten::mm   16,556,008  8,111,178–18,896,617") == "1 aten::mm # #–#"
    assert unvarying("op  ----------  334.3   0.9%") == "op -- # #%"
    assert unvarying("torch 2.15.0+cu132, bf16") == "torch <version>, bf16"
    assert unvarying("3 active ProfilerStep (#2, #3, #4); 5 confirmed") == "3 active ProfilerStep (#2, #3, #4); 5 confirmed"
    assert unvarying("wrote /x/y/03_simple_mlp/a.json", out=Path("/x/y")) == "wrote traces/03_simple_mlp/a.json"


def test_readme_shows_what_the_first_command_prints(runs):
    """The output quoted under the set-up commands is what `uv run 03_simple_mlp.py --compile` prints on a CPU:
    its pieces (cut at `…` lines) in order, timings and the torch version aside. It runs here at the smaller batch
    of SMALLER, so the file names it prints carry that shape."""
    text = page("README.md")
    quoted = re.search(r"```\n(03_simple_mlp: CPU, .*?)```", text, flags=re.S).group(1)
    assert "torch 2.15.0" in quoted  # as printed, with the torch uv.lock pins
    for big, small in SMALLER_TRACES.items():
        quoted = quoted.replace(f"traces/{big}", f"traces/{small}")
    proc = runs.run(["03_simple_mlp.py", "--compile"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed, pos = unvarying(proc.stdout, runs.out), 0
    for piece in unvarying(quoted).split("\n…\n"):
        found = printed.find(piece, pos)
        assert found >= 0, f"the README quotes:\n{piece}\n\nbut the run printed:\n{proc.stdout}"
        pos = found + len(piece)
    assert quoted.count("\n…\n") == 3 and quoted.rstrip().endswith("5 confirmed, 0 broken, 2 not applicable")


OPEN = [c for c in COMMANDS if "--open" in c]


@pytest.mark.parametrize("argv", OPEN, ids=[" ".join(c) for c in OPEN])
def test_readme_open_command_serves_the_trace_once(argv, runs, tmp_path):
    """Run the --open command (on a free port), fetch the printed link the way the Perfetto UI does. In a folder of
    its own: another worker's run may rewrite the shared folder's copy of the trace between serving and reading."""
    for a in argv:
        if a.startswith("traces/"):
            local_trace(a, tmp_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(runs.trace(a), local_trace(a, tmp_path))
    proc = subprocess.Popen(command(as_run_here(argv, tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "BROWSER": "true"})
    lines = []
    served = None
    timer = threading.Timer(300, proc.kill)
    timer.start()
    try:
        port = None
        for line in proc.stdout:
            lines.append(line)
            port = port or re.match(r"Serving \S+ on http://127\.0\.0\.1:(\d+)/ ", line)
            m = re.search(r"#!/\?url=http://127\.0\.0\.1:9001/(\S+)", line)  # 9001's link, to forward to the port
            if m:
                assert port and port.group(1) != "9001"
                req = urllib.request.Request(f"http://127.0.0.1:{port.group(1)}/{m.group(1)}",
                                             headers={"Origin": "https://ui.perfetto.dev"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    served = resp.read()
                    assert resp.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
                break
        rest, err = proc.communicate(timeout=60)
    finally:
        timer.cancel()
    assert proc.returncode == 0, err[-2000:]
    assert "Server stopped: fetched." in "".join(lines) + rest
    written = re.search(r"^(?:wrote|trace) +(\S+)$", "".join(lines), flags=re.M).group(1)
    assert served == Path(written if os.path.isabs(written) else ROOT / written).read_bytes()


def test_readme_example_output_is_what_the_h200_trace_gives():
    """The H200 expectations block quoted in the Part 2 page, re-derived from the committed H200 trace; the command
    it is shown under is the one that recorded that trace (tests/data/record_h200.sh)."""
    import importlib
    import io

    import inspect_trace as it

    text = page("docs/02_03_mlp.md")
    quoted = re.search(r"```\n(Expectations \(guess first, then look\):\n.*?)```", text, flags=re.S).group(1)
    shown_under = re.findall(r"```bash\n(.*?)\n", text[:text.index(quoted)])[-1]  # the first line of the last block
    recorded = re.search(r"^ *rec mlp_eager (.*)$", (ROOT / "tests/data/record_h200.sh").read_text(), flags=re.M)
    assert shown_under == f"uv run {recorded.group(1)}"
    import argparse

    # The recorded run: eager, 3 active steps (the post's command, as in tests/data/record_h200.sh).
    expect = importlib.import_module("03_simple_mlp").expectations(argparse.Namespace(active=3, compile=False))
    buf = io.StringIO()
    it.print_expectations(it.check(it.load_trace(ROOT / "tests/data/h200_mlp_eager.json.gz"), expect), file=buf)
    assert quoted == buf.getvalue()


def test_readme_bench_table_is_the_committed_h200_record():
    """The README's benchmark table and the line above it: bench.markdown_table of results/bench_h200.json."""
    import json

    import bench

    record = json.loads((ROOT / "results/bench_h200.json").read_text())
    assert bench.markdown_table(record) in page("docs/04_fused_mlp.md")


def test_readme_attention_table_is_the_committed_h200_record():
    """The README's H200 attention table: bench_attention.markdown() of results/bench_attention_h200.json."""
    import json

    import bench_attention

    section = page("docs/05_attention.md")
    path = ROOT / "results/bench_attention_h200.json"
    if not path.exists():
        assert "TODO(H200)" in section  # the placeholder stays until the record is committed
        pytest.skip("results/bench_attention_h200.json is not committed yet (recorded on the H200 by the lead)")
    record = json.loads(path.read_text())
    assert "TODO(H200)" not in section
    assert bench_attention.markdown(record) in section
    assert f"{record['ceiling_tflops']:.0f} TFLOP/s" in section and f"{record['copy_gbs']:.0f} GB/s" in section
    prefill = record["shapes"][0]
    us = {name: v["median_us"] for name, v in prefill["variants"].items()}
    assert not prefill["decode"] and prefill["fastest"] == "sdpa cudnn"
    slower = re.search(r"math path is (\d+)× slower than cuDNN at prefill", section).group(1)
    faster = re.search(r"compiled, it is (\d+)× faster", section).group(1)
    assert [int(slower), int(faster)] == [round(us["math"] / us["sdpa cudnn"]), round(us["math"] / us["math compiled"])]


def test_mutmut_config():
    """The README's `uv run mutmut run`: the tool is a dev dependency and its configuration names real files."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads TOML")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("mutmut") for d in project["dependency-groups"]["dev"])
    config = project["tool"]["mutmut"]
    selection = config["pytest_add_cli_args_test_selection"]
    for path in config["source_paths"] + config["do_not_mutate"] + config["also_copy"] + \
            [arg.split("::")[0] for arg in selection if not arg.startswith("-")]:
        assert (ROOT / path).exists(), path
    # each --deselect names one test of a selected file
    for flag, node in zip(selection, selection[1:]):
        if flag == "--deselect":
            path, name = node.split("::")
            assert path in selection and f"\ndef {name}(" in (ROOT / path).read_text(), node
    assert [c for c in COMMANDS if c[0] == "mutmut"] == [["mutmut", "run"], ["mutmut", "results"]]


def test_readme_attention_breakages_are_the_committed_traces():
    """'... read the cache at about 1.9 TB/s ...' and '... reaches 0.85-0.94 of the copy bandwidth': from the
    committed decode trace and the benchmark record."""
    import json

    import inspect_trace as it

    text = " ".join(page("docs/05_attention.md").split())
    t = it.load_trace(ROOT / "tests/data/h200_attention_decode_flash.json.gz")
    kv = 2 * 4 * 8 * 2048 * 128 * 2  # K and V, batch 4, 8 KV heads, 2048 entries, head_dim 128, bf16
    assert f"cache: {kv // 2**20} MiB of KV" in text
    per_step = [kv / sum(k.dur for k in st.kernels if "flash_fwd" in k.name) / 1e6 for st in t.steps]  # TB/s
    assert len(per_step) == 3
    assert float(re.search(r"flash kernels read the cache at about ([\d.]+) TB/s", text).group(1)) == \
        round(sorted(per_step)[1], 1)
    record = json.loads((ROOT / "results/bench_attention_h200.json").read_text())
    (decode,) = [s for s in record["shapes"] if s["decode"]]
    fractions = [decode["variants"][v]["of_bandwidth"] for v in ("sdpa flash", "sdpa cudnn")]
    lo, hi = re.search(r"reaches ([\d.]+)-([\d.]+) of the copy bandwidth", text).groups()
    assert [float(lo), float(hi)] == [round(min(fractions), 2), round(max(fractions), 2)]
