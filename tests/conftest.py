import hashlib
import importlib.abc
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zygote  # noqa: E402 - tests/, on the path as pytest puts a conftest's folder there


def _keep_bytecode() -> None:
    """Where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, set in many container images) and the
    environment holds none (uv installs without it), every process of the suite (each xdist worker, each script
    run as a subprocess: about a hundred) would compile torch's Python anew, about 10 s of CPU each. Keep the
    bytecode under .pytest_cache/pycache instead, for this process and the ones it starts; the source folders
    stay clean, as the setting wants."""
    if not sys.flags.dont_write_bytecode or sys.pycache_prefix or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    torch = importlib.util.find_spec("torch")  # finds, does not import
    if torch is None or torch.origin is None or Path(importlib.util.cache_from_source(torch.origin)).exists():
        return
    prefix = str(ROOT / ".pytest_cache" / "pycache")
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_keep_bytecode()

class _ReaderAsMutmutNamesIt(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Under mutmut: `trace_reader.X` is mutmut's copy of the reader imported as `reader.trace_reader.X`, one module
    under both names. mutmut names a mutant by its file's path (reader/trace_reader/...: "reader.trace_reader.") and
    runs it, and counts a test as covering it, only where the function's __module__ carries that name; imported as
    `trace_reader`, as the tests and `uv run`'s install do, every mutant of the reader had no test and none ran."""

    def find_spec(self, name, path=None, target=None):
        if name == "trace_reader" or name.startswith("trace_reader."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module("reader." + spec.name)  # keeps its own __name__, __spec__ and __path__

    def exec_module(self, module):
        pass  # run once already, as reader.<name>


if "mutmut" in sys.modules:
    # mutmut's copy of the reader (mutants/reader/trace_reader), not the checkout's that `uv run` installed editable,
    # and under the names mutmut gives its mutants
    sys.meta_path.insert(0, _ReaderAsMutmutNamesIt())
    # mutmut forks one child per mutant from this process: a child whose first torch op starts OpenMP's thread pool
    # after the fork can hang for good (the pool's state is copied, its threads are not). One thread needs no pool.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# Inductor's C++ kernel for the MLP's GeLU * up on a CPU: graph_0_cpp_fused__unsafe_view_gelu_mul_0 in a fresh
# process, graph_<N>_... after N earlier compiles in the same process (a test worker), no prefix on older torch.
FUSED_CPP_RE = re.compile(r"^(?:graph_\d+_)?cpp_fused__unsafe_view_gelu_mul_\d+$")


def fused_cpp(names) -> str:
    """The one fused C++ kernel name among `names` (an assertion error if there is none, or several)."""
    found = {n for n in names if FUSED_CPP_RE.match(n)}
    assert len(found) == 1, f"fused C++ kernels: {sorted(found)}"
    return found.pop()


def interpreter_cannot_loop() -> bool:
    """Triton < 3.7's interpreter turns loop bounds into ints with int(ndarray), which NumPy >= 2.5 refuses
    ("only 0-dimensional arrays can be converted"); Triton 3.7 squeezes first. Seen on the GPU machine's image
    (Triton 3.6, NumPy 2.5); the project's lock has Triton 3.7. Tests that run the interpreter skip there."""
    import numpy
    import triton

    version = lambda text: tuple(int(part) for part in text.split(".")[:2])  # noqa: E731
    return version(triton.__version__) < (3, 7) and version(numpy.__version__) >= (2, 5)


def interpreted_cases(child: str, *args: str) -> dict:
    """{case: result} of a child Python running `child` (one JSON line per case, each with its "case") under Triton's
    CPU interpreter, from the checkout's root: the fused kernels' tests run their kernels so, once per module."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", child, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


def assert_ceilings_said(line, tflops, gbs):
    """The measured ceilings as printed, read back to within their three figures: a CPU's are no '0 TFLOP/s'."""
    m = re.search(r"GEMM ceiling ([\d.,]+) ([TG])FLOP/s, device copy ([\d.,]+) ([TG])B/s \(measured now", line)
    assert m, line
    said_tflops = float(m[1].replace(",", "")) * (1 if m[2] == "T" else 1e-3)
    said_gbs = float(m[3].replace(",", "")) * (1e3 if m[4] == "T" else 1)
    assert said_tflops == pytest.approx(tflops, rel=0.05) and said_gbs == pytest.approx(gbs, rel=0.05), line


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess: runs a script in a child process (seconds; left out under mutmut)")
    config.addinivalue_line("markers", "profiles: records a torch profile in this process (left out under mutmut, "
                                       "whose forked workers hung in it)")


# Files whose tests go to the workers one by one, not all to one worker as pyproject's --dist loadfile does: their
# runs are shared through SharedRuns, so spreading them repeats none.
SPREAD = {"test_readme.py"}


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (each file on one worker: its module fixtures made once), but SPREAD's tests one by one.
    (Not --dist loadgroup: pytest 9 ignores the node ids xdist 3.8 rewrites for it, so its groups are not kept.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # only under xdist, which calls this hook

    class SpreadSome(LoadFileScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return nodeid if Path(path).name in SPREAD else path

    return SpreadSome(config, log)


def pytest_collection_modifyitems(config, items):
    """Under mutmut (pyproject's [tool.mutmut]), keep the fast in-process tests only.

    A test that records a real profile (the `cpu` fixture, or marked `profiles`) or starts a subprocess (`cli`,
    or marked `subprocess`) takes seconds; mutmut runs the covering tests once per mutant, so those would not fit.
    """
    if "mutmut" not in sys.modules:
        return
    slow = [i for i in items if "cpu" in getattr(i, "fixturenames", ()) or "cli" in i.name.split("[")[0].split("_")
            or "subprocess" in i.keywords or "profiles" in i.keywords]  # "cli" a word of the name ("client" is not)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


def run_script_main(script: str, main, out, *args, device="cpu"):
    """(exit code, stdout, stderr) of `python SCRIPT ARGS --device DEVICE --out OUT`, run in this process through
    common.main(main), as the command line would (SystemExit's code included)."""
    import contextlib
    import io

    import common

    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [script, *args, "--device", device, "--out", str(out)])
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as done:
            common.main(main)
    return done.value.code, stdout.getvalue(), stderr.getvalue()


# torchrun's environment for rank 0 of two, with no rank 1 to meet: what a script's launch checks read before any
# rank waits for another
RANK_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1"}


def run_rank_main(script: str, main, out, monkeypatch, env: dict, *args):
    """run_script_main under exactly `env` of torchrun's variables (the others unset): a rank's launch, in process."""
    import common

    for k in common.TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return run_script_main(script, main, out, *args)


class SharedRuns:
    """Commands run once for the whole session, whichever test worker asks first: the others wait for that run
    and read its result. The pages' commands are run by test_readme (spread over workers) and, for the posts', by
    test_posts: each runs once."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def run(self, cmd: list[str], env: dict, timeout: int = 600, fresh: bool = False) -> subprocess.CompletedProcess:
        """`cmd` run in the repository root with `env` (once per session), as subprocess.run(capture_output=True,
        text=True) returns it: a Python script in a child of tests/zygote.py's servers (torch imported already),
        or with `fresh`, exactly as written, in a process of its own."""
        import filelock  # torch's own dependency: there wherever torch is

        changed = sorted((k, v) for k, v in env.items() if os.environ.get(k) != v)
        key = hashlib.sha256(json.dumps([cmd, changed]).encode()).hexdigest()[:20]
        record = self.folder / f"{key}.json"
        with filelock.FileLock(f"{record}.lock"):
            if not record.exists():
                proc = (subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)
                        if fresh else zygote.run(cmd, env, ROOT, timeout))
                record.write_text(json.dumps([proc.returncode, proc.stdout, proc.stderr]))
        code, stdout, stderr = json.loads(record.read_text())
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def session_folder(tmp_path_factory, name: str) -> Path:
    """A folder every test worker of this session shares (xdist gives each worker a base folder of its own, in the
    session's)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / name
    folder.mkdir(exist_ok=True)  # made here: the first test to use it may write into it before any run does
    return folder


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    yield SharedRuns(session_folder(tmp_path_factory, "shared-runs"))
    zygote.close()


# A script run as __main__ with msgspec made unimportable: the trace reader's stdlib decoder, in a child process.
WITHOUT_MSGSPEC = ("import runpy, sys; sys.modules['msgspec'] = None; sys.argv = sys.argv[1:]; "
                   "runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.fixture(params=["msgspec", "stdlib"])
def decoder(request, monkeypatch) -> str:
    """The trace reader's JSON decoder for this test: msgspec (skipped where it is not installed, as on the GPU
    image) or the stdlib's, which the reader falls back to (read._loads, read.load_trace). Hostile-input tests run
    under both; a child process gets the same decoder from python_for(decoder)."""
    from trace_reader.reading import files as read

    if request.param == "msgspec" and read._fast() is None:
        pytest.skip("msgspec is not installed here: the stdlib decodes every trace")
    if request.param == "stdlib":
        monkeypatch.setattr(read, "_fast", lambda: None)
    return request.param


def python_for(decoder: str) -> list[str]:
    """The start of a command that runs a script with the reader's `decoder`: [*python_for(d), SCRIPT, *ARGS]."""
    return [sys.executable] + (["-c", WITHOUT_MSGSPEC] if decoder == "stdlib" else [])
